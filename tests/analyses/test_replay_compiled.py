"""The replay's compiled pass (analyses/_compiled.py ``replay_chain``) against its numpy twin
(analyses/replay.py ``_replay_numpy``) on real captures: unchanged, without the profiler, and with causes removed
(waits dropped, eager device work dropped), every call start and end and every item end within 1e-6 µs."""
from __future__ import annotations

import os

import numpy as np
import pytest

from gaptrace import load_trace
from gaptrace.analyses.replay import replay
from gaptrace.analyses.whatif import Change, Context, apply_changes
from gaptrace.sidecar import read_sidecar_checked

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "traces")
CASES = [
    ("h200_pairs/bench_sync_bs8_B12.json.gz", "round", ("device_lengths_to_host", "rect_packed")),
    ("h200_pairs_repeat/bench_overlap_bs8_B12_eager-commit-glue.json.gz", "round", ("eager_commit_glue",)),
    ("h200_pairs/tiny_tree_cpu-heapq_bs8.json.gz", "round", ("cpu_tree_build",)),
    ("h200_loops/helper_thread.planted.trace.json.gz", "step", ("planted_queue_wait",)),
    ("h200_loops/pageable_htod.planted.trace.json.gz", "step", ("planted_htod_copy",)),
]


@pytest.mark.parametrize("path, round_name, sites", CASES, ids=[c[0] for c in CASES])
def test_compiled_replay_equals_the_numpy_loop(path, round_name, sites):
    p = os.path.join(ROOT, path)
    tr = load_trace(p)
    ctx = Context(tr, read_sidecar_checked(p)[0], round_name=round_name, fit=False)
    u = ctx.unprof
    w, c, wait, dropped, _gap = apply_changes(tr, ctx.model, u["work_us"], u["cost_us"],
                                              [Change(s, with_device=True) for s in sites], ctx.window)
    variants = [{}, {"work_us": u["work_us"], "cost_us": u["cost_us"], "item_dur_us": u["item_dur_us"]},
                {"work_us": w, "cost_us": c, "wait": wait, "item_dur_us": np.where(dropped, 0.0, u["item_dur_us"]),
                 "item_gap_us": np.where(dropped, 0.0, ctx.model.item_gap_us)}]
    ends = []
    for kw in variants:
        a, b = replay(ctx.model, **kw), replay(ctx.model, compiled=False, **kw)
        for f in ("call_start_us", "call_end_us", "item_end_us", "op_start_us"):
            np.testing.assert_allclose(getattr(a, f), getattr(b, f), rtol=0, atol=1e-6, err_msg=f)
        ends.append(a.call_end_us[-1])
    assert ends[2] < ends[1] < ends[0]  # the profiler taken out, then the causes: each replay ends sooner


def test_compiled_replay_equals_the_numpy_loop_under_a_graph_change():
    """``--graph``: one launch per occurrence, the node gap on its items; both replays agree."""
    p = os.path.join(ROOT, "h100_loops/launch_bound.planted.trace.json.gz")
    tr = load_trace(p)
    ctx = Context(tr, read_sidecar_checked(p)[0], round_name="step", fit=False)
    u = ctx.unprof
    w, c, wait, _dropped, gap = apply_changes(tr, ctx.model, u["work_us"], u["cost_us"],
                                              [Change("planted_eager_launches", graph=True)], ctx.window,
                                              calibration=ctx.calibration)
    kw = {"work_us": w, "cost_us": c, "wait": wait, "item_dur_us": u["item_dur_us"],
          "item_gap_us": np.where(np.isnan(gap), u["item_gap_us"], gap)}
    a, b = replay(ctx.model, **kw), replay(ctx.model, compiled=False, **kw)
    for f in ("call_start_us", "call_end_us", "item_end_us", "op_start_us"):
        np.testing.assert_allclose(getattr(a, f), getattr(b, f), rtol=0, atol=1e-6, err_msg=f)
    assert a.call_end_us[-1] < replay(ctx.model, u["work_us"], u["cost_us"]).call_end_us[-1]
