"""The compiled walk of stacks._prev_reaching (analyses/_compiled.py) against its numpy pointer jumping."""
from __future__ import annotations

import glob
import os

import numpy as np
import pytest

from gaptrace.analyses import stacks
from gaptrace.loader import load_trace

HERE = os.path.dirname(os.path.abspath(__file__))
TRACES = sorted(glob.glob(os.path.join(HERE, "..", "..", "fixtures", "traces", "*.json.gz")))[:6] + sorted(
    glob.glob(os.path.join(HERE, "..", "..", "fixtures", "traces", "h200_loops", "*planted.trace.json.gz")))[:3]


def _tree(path: str, compiled_from: int):
    old = stacks.COMPILED_MIN_NODES
    stacks.COMPILED_MIN_NODES = compiled_from
    try:
        return stacks._build(load_trace(path))
    finally:
        stacks.COMPILED_MIN_NODES = old


@pytest.mark.parametrize("path", TRACES, ids=os.path.basename)
def test_compiled_walk_gives_the_numpy_tree(path):
    a, b = _tree(path, 10**18), _tree(path, 0)
    assert a.n > 100
    assert np.array_equal(a.parent, b.parent) and np.array_equal(a.open_top, b.open_top)


def test_compiled_walk_on_random_intervals():
    rng = np.random.default_rng(3)
    for _ in range(20):
        n = 3000
        start = np.sort(rng.uniform(0, 1000, n))
        end = start + rng.exponential(20, n) * (rng.uniform(size=n) < 0.7)
        thread_first = np.zeros(n, np.int64)
        cut = n // 2
        thread_first[cut:] = cut
        for hi in (None, end - 1e-6):
            old = stacks.COMPILED_MIN_NODES
            try:
                stacks.COMPILED_MIN_NODES = 10**18
                want = stacks._prev_reaching(end, thread_first, start, hi)
                stacks.COMPILED_MIN_NODES = 0
                got = stacks._prev_reaching(end, thread_first, start, hi)
            finally:
                stacks.COMPILED_MIN_NODES = old
            # and by brute force: the largest j < i of i's thread with end[j] > start[i] (and >= hi[i])
            for i in rng.integers(0, n, 50):
                ok = [j for j in range(thread_first[i], i) if end[j] > start[i] and (hi is None or end[j] >= hi[i])]
                assert want[i] == (ok[-1] if ok else -1)
            assert np.array_equal(got, want)
