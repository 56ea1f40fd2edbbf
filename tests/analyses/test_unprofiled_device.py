"""A graph replay's unprofiled device span, timed by the capture (sidecar ``graphs[].unprofiled_device_us``), replaces
the calibration's per-op device cost for the replays of that graph (docs/DESIGN.md "The profiler taken out")."""
from __future__ import annotations

import copy
import json
import os

import numpy as np

from gaptrace import load_trace
from gaptrace.analyses.profiler_cost import load_calibration, sidecar_device_us, unprofiled_inputs
from gaptrace.analyses.replay import build_model
from gaptrace.sidecar import Sidecar, sidecar_field_problems

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "traces", "h200_pairs")
NAME = "bench_overlap_bs8_B12_clean_a"


def _load():
    tr = load_trace(os.path.join(ROOT, NAME + ".json.gz"))
    with open(os.path.join(ROOT, NAME + ".gaptrace.json")) as f:
        side = json.load(f)
    return tr, side


def test_sidecar_device_span_replaces_the_calibrated_device_cost():
    tr, side = _load()
    model = build_model(tr)
    cal = load_calibration(None)
    # the graphs of this capture, by node count, and the profiled spans of their replays in the trace
    item_nodes = np.where(model.item_call >= 0, model.graph_nodes[np.maximum(model.item_call, 0)], 0)
    sizes = sorted({int(g["nodes"]) for g in side["graphs"]} & set(item_nodes.tolist()))
    assert len(sizes) >= 2
    timed = copy.deepcopy(side)
    given = {}
    for g in timed["graphs"]:
        n = int(g["nodes"])
        spans = model.item_dur_us[item_nodes == n]
        if n == sizes[0]:
            g["unprofiled_device_us"] = given[n] = float(np.median(spans)) * 0.5  # shorter than every replay
        elif n == sizes[1]:
            g["unprofiled_device_us"] = given[n] = float(spans.max()) * 2.0  # longer than every replay
        else:
            g.pop("unprofiled_device_us", None)
    assert sidecar_device_us(timed) == given
    untimed = copy.deepcopy(side)
    for g in untimed["graphs"]:
        g.pop("unprofiled_device_us", None)
    plain = unprofiled_inputs(tr, model, cal, untimed)
    got = unprofiled_inputs(tr, model, cal, timed)
    assert plain["device_source"] == "calibration" and got["device_source"] == "sidecar"
    a = item_nodes == sizes[0]
    # the size's profiler cost is what its median replay loses; each replay loses that, never going below the timed
    # span: the median one is the timed span, a slower one keeps its excess over the median
    pa = model.item_dur_us[a]
    c = float(np.median(pa)) - given[sizes[0]]
    np.testing.assert_allclose(got["item_dur_us"][a], np.maximum(pa - c, given[sizes[0]]))
    assert np.sum(np.isclose(got["item_dur_us"][a], given[sizes[0]])) >= 0.5 * a.sum()
    b = item_nodes == sizes[1]  # never longer than the profiled span: the profiler only adds
    np.testing.assert_allclose(got["item_dur_us"][b], model.item_dur_us[b])
    rest = ~(a | b)
    np.testing.assert_allclose(got["item_dur_us"][rest], plain["item_dur_us"][rest])


def test_a_replay_that_ran_long_is_not_the_profilers(tmp_path):
    """One kernel of one graph replay hand-set to 5 s: that replay keeps its 5 s less its size's profiler cost (the
    profiler adds the same to every replay of a size), and a warning names it; before, every replay was cut to the
    timed span and 5 s were taken out as profiler cost."""
    import gzip
    import shutil

    from gaptrace.analyses.whatif import whatif

    src = os.path.join(ROOT, NAME + ".json.gz")
    with gzip.open(src, "rt") as f:
        d = json.load(f)
    tr0, side = _load()
    model0 = build_model(tr0)
    graph_corr = set(tr0.host.loc[tr0.host["name"].astype(str) == "cudaGraphLaunch", "correlation"].tolist())
    ks = [e for e in d["traceEvents"] if e.get("cat") == "kernel" and e["args"].get("correlation") in graph_corr]
    k = ks[len(ks) // 2]
    k["dur"] = 5e6
    out = tmp_path / "long.json.gz"
    with gzip.open(out, "wt") as f:
        json.dump(d, f)
    shutil.copy(os.path.join(ROOT, NAME + ".gaptrace.json"), tmp_path / "long.gaptrace.json")
    tr = load_trace(str(out))
    model = build_model(tr)
    cal = load_calibration(None)
    base = unprofiled_inputs(tr0, model0, cal, side)
    got = unprofiled_inputs(tr, model, cal, side)
    assert got["device_source"] == "sidecar"
    # the profiler's device cost over the trace barely moves: one replay's share of it, not 5 s
    assert abs(got["removed_us"]["device_ops"] - base["removed_us"]["device_ops"]) < 100.0
    long_item = int(np.argmax(model.item_dur_us))
    assert model.item_dur_us[long_item] >= 5e6
    assert got["item_dur_us"][long_item] > 5e6 - 100.0
    assert len(got["warnings"]) == 1 and "1 CUDA graph replays ran over 2x" in got["warnings"][0]
    w = whatif(tr, sidecar=side).data
    assert any("ran over 2x" in x for x in w["warnings"])
    assert any("start before the previous one on the same stream" in x for x in w["warnings"])


def test_sidecar_device_span_is_checked():
    _tr, side = _load()
    bad = copy.deepcopy(side)
    bad["graphs"][0]["unprofiled_device_us"] = -3.0
    assert any("unprofiled_device_us" in p for p in sidecar_field_problems(bad))
    assert Sidecar.from_dict(bad).graphs[0].unprofiled_device_us is None
    # the capture timed every graph it replayed in its early warm-up rounds
    assert Sidecar.from_dict(side).unprofiled_device_us() == {int(g["nodes"]): g["unprofiled_device_us"]
                                                              for g in side["graphs"]}
    assert all(g["unprofiled_device_replays"] > 0 for g in side["graphs"])


def test_removal_with_device_work_drops_the_items_the_site_launched():
    """``Change(site, with_device=True)``: the host removal, and the eager device items (not graph replays) launched
    by calls inside the site take no time and no queue gap; on the bench eager-commit-glue capture the glue launches ~185 eager kernels a
    round, so dropping them saves more than the host removal alone."""
    from gaptrace.analyses.whatif import Change, Context, apply_changes, device_items_launched, site_intervals, whatif

    path = os.path.join(ROOT, "bench_overlap_bs8_B12_eager-commit-glue.json.gz")
    tr = load_trace(path)
    with open(path.replace(".json.gz", ".gaptrace.json")) as f:
        side = json.load(f)
    ctx = Context(tr, side)
    m = ctx.model
    # plain recomputation of the launched items: calls whose start lies in the range's merged intervals
    us, ue = site_intervals(tr, m, "eager_commit_glue", ctx.window)
    inside = np.array([bool(np.any((us <= s) & (s < ue))) for s in m.call_start_us])
    expect = np.array([c >= 0 and inside[c] and m.graph_nodes[c] == 0 for c in m.item_call])
    _w, _c, _wait, dropped, _gap = apply_changes(tr, m, ctx.unprof["work_us"], ctx.unprof["cost_us"],
                                           [Change("eager_commit_glue", with_device=True)], ctx.window)
    assert (dropped == expect).all() and expect.sum() > 100
    n, busy = device_items_launched(tr, m, "eager_commit_glue", ctx.window)
    assert n == int(expect.sum()) and busy == float(m.item_busy_us[expect].sum())
    host = whatif(tr, [Change("eager_commit_glue")], context=ctx).data
    both = whatif(tr, [Change("eager_commit_glue", with_device=True)], context=ctx).data
    assert both["changes"][0]["action"] == "remove_with_device"
    assert both["saving_us"] > host["saving_us"] + 300.0
    _w, _c, _wait, none, _gap = apply_changes(tr, m, ctx.unprof["work_us"], ctx.unprof["cost_us"],
                                        [Change("eager_commit_glue")], ctx.window)
    assert not none.any()
