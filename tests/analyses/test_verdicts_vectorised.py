"""step_verdicts computes every step at once; its table must equal, value for value, the per-step loop it replaced
(tests/analyses/_verdicts_reference.py) on real traces, and its set helpers (and BusyTimeline.with_gaps_filled) must equal
brute force / a fresh merge on random input."""
from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

import gaptrace  # noqa: E402
from gaptrace.analyses import steps as steps_mod  # noqa: E402
from gaptrace.analyses import verdicts as V  # noqa: E402
from gaptrace.analyses.timeline import merge_intervals  # noqa: E402

import _verdicts_reference as ref  # noqa: E402
from _idle_reference import trace_path  # noqa: E402

TRACES = [
    "kineto_v100_resnet50",
    "tracelens_mi300x_sglang_qwen3_8b_decode",
    "tracelens_vllm_prefilldecode_piecewise",
    "tracelens_b200_eager",
    "tracelens_h100_owlv2",
    "hta_a100_trace_diff_control",
    "h200_pairs/bench_sync_bs8_B12",
    "h200_faults/h200_tiny_overlap_bs8_B12_jit-new-shape",
    "h200_loops/helper_thread.planted.trace",
    "h200_loops/per_request_readback.planted.trace",
]


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b and type(a) is type(b)


@pytest.mark.parametrize("name", TRACES)
def test_table_equals_the_per_step_loop(name):
    tr = gaptrace.load_trace(trace_path(name))
    st = steps_mod.find_steps(tr)
    new = V.step_verdicts(tr, st)
    old = ref.step_verdicts_ref(tr, st)
    assert len(new.table) == len(old.table) > 0
    assert list(new.table.columns) == list(old.table.columns)
    assert (new.table.dtypes == old.table.dtypes).all()
    bad = [(i, c, ra[c], rb[c]) for i, (ra, rb) in enumerate(zip(new.table.to_dict("records"), old.table.to_dict("records")))
           for c in ra if not _same(ra[c], rb[c])]
    assert not bad, bad[:5]
    assert str(new.overall) == str(old.overall)


def _brute_pairs(lo, hi, a, b):
    return [(g, i) for g in range(len(lo)) for i in range(len(a)) if a[i] < hi[g] and b[i] > lo[g]]


@pytest.mark.parametrize("seed", range(6))
def test_helpers_equal_brute_force(seed):
    rng = np.random.default_rng(seed)
    G, n = int(rng.integers(1, 40)), int(rng.integers(0, 400))
    lo = np.sort(rng.uniform(0, 1000, G))
    hi = lo + rng.uniform(-5, 80, G)
    a = rng.uniform(-50, 1100, n)
    b = a + np.where(rng.random(n) < 0.03, rng.uniform(0, 900, n), rng.uniform(0, 10, n))
    g, i = V._pairs(lo, hi, a, b)
    assert list(zip(g.tolist(), i.tolist())) == _brute_pairs(lo, hi, a, b)
    pg, pi = V._points(lo, hi, a)
    assert list(zip(pg.tolist(), pi.tolist())) == [(k, j) for k in range(G) for j in range(n) if lo[k] <= a[j] < hi[k]]
    mg, ms, me = V._grouped_union(g, a[i], b[i], lo, hi)
    x = rng.uniform(0, 5, len(g))
    x[rng.random(len(g)) < 0.2] = 1.0  # ties for the first-max rule
    sums, first, med = V._group_sums(G, g, x), V._group_first_max(G, g, x), V._group_medians(G, g, x)
    for k in range(G):
        sel = g == k
        s, e = np.maximum(a[i[sel]], lo[k]), np.minimum(b[i[sel]], hi[k])
        ok = e > s
        rs, re_ = merge_intervals(s[ok], e[ok])
        assert ms[mg == k].tolist() == rs.tolist() and me[mg == k].tolist() == re_.tolist()
        assert sums[k] == x[sel].sum()
        assert first[k] == (np.flatnonzero(sel)[np.argmax(x[sel])] if sel.any() else -1)
        assert (np.isnan(med[k]) and not sel.any()) or med[k] == np.median(x[sel])


@pytest.mark.parametrize("seed", range(20))
def test_gaps_filled_equal_a_fresh_merge(seed):
    from gaptrace.analyses.timeline import BusyTimeline

    rng = np.random.default_rng(seed)
    n = 0 if seed in (0, 2) else int(rng.integers(1, 300))
    a = np.round(rng.uniform(0, 1000, n), 1)
    b = a + np.round(rng.uniform(0, 8, n), 1)
    t0, t1 = (None, None) if seed % 2 else (float(rng.uniform(-10, 100)), float(rng.uniform(900, 1100)))
    tl = BusyTimeline.from_intervals(a, b, t0, t1)
    g0, g1 = tl.gap_bounds()
    fill = rng.random(len(g0)) < 0.5
    got = tl.with_gaps_filled(fill)
    want = BusyTimeline.from_intervals(np.r_[tl.span_start_us, g0[fill]], np.r_[tl.span_end_us, g1[fill]],
                                       tl.t0_us, tl.t1_us)
    for f in ("t0_us", "t1_us", "span_start_us", "span_end_us", "cum_busy_us"):
        assert np.array_equal(getattr(got, f), getattr(want, f)), f
