"""The profiler cost scale α that reproduces a measured round (analyses/whatif.py ``scale_for_period``; DESIGN.md
5.3), on periods given as functions of α: falling all the way, out of reach on either side, and falling with a jump
back up (a measured range that stops being set as the host gets faster)."""
from __future__ import annotations

import pytest

from gaptrace.analyses.whatif import SCALE_BOUNDS, SCALE_GRID, scale_for_period


def test_a_falling_period_is_bisected_to_the_target():
    a = scale_for_period(lambda x: 2000.0 - 100.0 * x, 1700.0)
    assert a == pytest.approx(3.0, abs=1e-3)


def test_out_of_reach_returns_the_bound():
    assert scale_for_period(lambda x: 2000.0 - 100.0 * x, 2500.0) == SCALE_BOUNDS[0]  # above the α = 0 replay
    assert scale_for_period(lambda x: 2000.0 - 100.0 * x, 500.0) == SCALE_BOUNDS[1]  # below what α = 8 reaches


def test_a_jump_back_up_is_bracketed_on_the_grid():
    """The period falls until α = 5, then jumps back above the target: α = 8 alone says "out of reach", the grid
    finds the bracket [3, 4] and bisection the crossing at 3.5."""
    def period(x: float) -> float:
        return 2000.0 - 100.0 * x if x < 5.0 else 1900.0

    assert period(SCALE_BOUNDS[1]) > 1650.0
    assert 3.0 in SCALE_GRID and 4.0 in SCALE_GRID
    assert scale_for_period(period, 1650.0) == pytest.approx(3.5, abs=1e-3)
    # no grid point reaches it: out of reach
    assert scale_for_period(period, 1450.0) == SCALE_BOUNDS[1]
