"""The ``graph`` counterfactual (``whatif --graph SITE``): the site's host work and launches become one CUDA graph
launch, its device work stays and runs back to back (docs/DESIGN.md "Counterfactuals"), checked on the measured
launch_bound pair (the fixed twin replays the same forward as one graph) and by hand on the replay's inputs."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from gaptrace import load_trace
from gaptrace.analyses.profiler_cost import load_calibration, shipped_calibration_path
from gaptrace.analyses.whatif import (GRAPH_LAUNCH_NODE_DEFAULT_US, GRAPH_LAUNCH_T0_DEFAULT_US, Change, Context,
                                      SiteRefused, apply_changes, graph_launch_us, graph_node_gap_us, site_intervals,
                                      whatif)
from gaptrace.sidecar import read_sidecar_checked

TRACES = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "traces")
H100_LAUNCH_BOUND = os.path.join(TRACES, "h100_loops", "launch_bound.planted.trace.json.gz")
SITE = "planted_eager_launches"


@pytest.fixture(scope="module")
def launch_bound():
    tr = load_trace(H100_LAUNCH_BOUND)
    side, _ = read_sidecar_checked(H100_LAUNCH_BOUND)
    return tr, Context(tr, side, round_name="step")


def _measured_saving_ms() -> float:
    with open(os.path.join(TRACES, "h100_loops", "launch_bound.pairs.json"), encoding="utf-8") as f:
        return float(json.load(f)["saving_ms"])


def test_graphing_the_eager_forward_predicts_the_measured_fix(launch_bound):
    """launch_bound on the H100: ~376 eager launches a step, the fixed twin one graph replay of the same forward.
    Measured in fresh processes: 2.442 ms saved. The graph counterfactual is within 5% of it (it predicts 2.48 ms); the
    host removal, which keeps each kernel's eager launch path on the device, is 6% short; dropping the device work too
    (--remove-with-device) over-predicts by a third."""
    tr, ctx = launch_bound
    meas_us = _measured_saving_ms() * 1e3
    g = whatif(tr, [Change(SITE, graph=True)], context=ctx).data
    r = whatif(tr, [Change(SITE)], context=ctx).data
    d = whatif(tr, [Change(SITE, with_device=True)], context=ctx).data
    assert g["changes"][0]["action"] == "graph"
    assert abs(g["saving_us"] - meas_us) <= 0.05 * meas_us
    assert abs(g["saving_us"] - meas_us) < abs(r["saving_us"] - meas_us)
    assert d["saving_us"] > 1.25 * meas_us
    # the fixed twin's step, measured: the with-cause step less the saving; the graphed step keeps the forward's
    # device work, so it is no shorter than that work on its stream
    assert g["after_round_us"] >= 0.9 * (g["unprofiled_round_us"] - meas_us)
    (st,) = g["graph"]
    assert st["site"] == SITE and st["launch_source"] == "calibration" and st["node_gap_source"] == "default"
    assert st["node_gap_us"] == pytest.approx(0.4) and st["occurrences"] == g["rounds"] + 1
    assert st["launch_us_per_occurrence"] == pytest.approx(st["launch_t0_us"]
                                                           + st["launch_node_us"] * st["nodes_per_occurrence"])


def test_graph_inputs_by_hand(launch_bound):
    """Per occurrence of the site: its first call costs t0 + c·N (N its device nodes, the H100 calibration's
    graph_plain), every other call inside costs nothing, every item it launched queues with the node gap; host
    work and calls outside are untouched."""
    tr, ctx = launch_bound
    m = ctx.model
    cal = load_calibration(shipped_calibration_path("NVIDIA H100 80GB HBM3"))
    assert cal.graph_launch_t0_us == pytest.approx(5.5446, abs=1e-3)
    assert cal.graph_launch_node_us == pytest.approx(0.20509, abs=1e-4)
    w, c, wait, dropped, gap = apply_changes(tr, m, ctx.unprof["work_us"], ctx.unprof["cost_us"],
                                             [Change(SITE, graph=True)], ctx.window, calibration=ctx.calibration)
    us, ue = site_intervals(tr, m, SITE, ctx.window)
    occ_of_call = np.array([int(np.flatnonzero((us <= s) & (s < ue))[0]) if ((us <= s) & (s < ue)).any() else -1
                            for s in m.call_start_us])
    inside = occ_of_call >= 0
    assert not dropped.any()
    launched = (m.item_call >= 0) & inside[np.maximum(m.item_call, 0)]
    assert launched.sum() > 1000
    assert np.all(gap[launched] == graph_node_gap_us(tr, m)[0]) and np.isnan(gap[~launched]).all()
    for j in np.unique(occ_of_call[inside]):
        calls = np.flatnonzero(occ_of_call == j)
        n = int(launched[np.isin(m.item_call, calls)].sum())
        assert n > 300  # one forward: ~376 kernels
        assert c[calls[0]] == pytest.approx(cal.graph_launch_t0_us + cal.graph_launch_node_us * n)
        assert (c[calls[1:]] == 0).all()
    assert np.array_equal(c[~inside], ctx.unprof["cost_us"][~inside])
    assert (wait[~inside] == m.blocking[~inside]).all()


def test_graph_launch_cost_without_a_measured_one():
    """A calibration without graph_plain: the default, the H100's measured t0 and per-node cost."""
    cal = load_calibration(None)  # the H200 host's: no graph_plain
    assert cal.graph_launch_t0_us is None
    got, src = graph_launch_us(cal, np.array([0, 100]))
    assert src == "default"
    assert got.tolist() == [GRAPH_LAUNCH_T0_DEFAULT_US, GRAPH_LAUNCH_T0_DEFAULT_US + 100 * GRAPH_LAUNCH_NODE_DEFAULT_US]


def test_node_gap_from_the_traces_own_graph_replays():
    """The runtime's captures replay CUDA graphs: the gap between consecutive nodes of a replay, measured on the
    device, is their median (0.13 µs on the H200), not the default."""
    p = os.path.join(TRACES, "h200_pairs_repeat", "bench_overlap_bs8_B12_clean_a.json.gz")
    tr = load_trace(p)
    ctx = Context(tr, read_sidecar_checked(p)[0])
    gap, src = graph_node_gap_us(tr, ctx.model)
    assert src == "trace"
    assert 0.05 < gap < 0.25


def test_a_site_with_a_blocking_call_or_no_device_work_is_refused():
    """A CUDA graph cannot capture a host synchronization: a site holding a blocking read is refused (one line
    naming the call); so is a site that launches nothing (a graph would capture nothing)."""
    p = os.path.join(TRACES, "h200_pairs_repeat", "bench_overlap_bs8_B12_lengths-copy.json.gz")
    tr = load_trace(p)
    ctx = Context(tr, read_sidecar_checked(p)[0])
    with pytest.raises(SiteRefused, match=r"blocks the host \(cudaMemcpyAsync.*a CUDA graph cannot capture it"):
        whatif(tr, [Change("lengths_copy", graph=True)], context=ctx)
    p = os.path.join(TRACES, "h100_loops", "host_detokenize.planted.trace.json.gz")
    tr = load_trace(p)
    ctx = Context(tr, read_sidecar_checked(p)[0], round_name="step")
    with pytest.raises(SiteRefused, match="launches no device work"):
        whatif(tr, [Change("planted_detokenize", graph=True)], context=ctx)


def test_cli_graph_text_json_and_refusal():
    def run(*args):
        return subprocess.run([sys.executable, "-m", "gaptrace.cli", "whatif", *args], capture_output=True, text=True)

    r = run(H100_LAUNCH_BOUND, "--rounds", "step", "--graph", SITE, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["changes"][0]["action"] == "graph" and d["graph"][0]["launch_source"] == "calibration"
    t = run(H100_LAUNCH_BOUND, "--rounds", "step", "--graph", SITE)
    assert f"{SITE} captured in one CUDA graph" in t.stdout and f"{SITE} as a CUDA graph: " in t.stdout
    # one site, two changes: refused before the trace is read
    bad = run(H100_LAUNCH_BOUND, "--rounds", "step", "--graph", SITE, "--remove", SITE)
    assert bad.returncode == 2 and "name the same site" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    p = os.path.join(TRACES, "h200_pairs_repeat", "bench_overlap_bs8_B12_lengths-copy.json.gz")
    bad = run(p, "--graph", "lengths_copy")
    assert bad.returncode == 2 and "cannot capture it" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr


def test_a_finding_that_launches_eager_work_carries_its_graphed_saving(launch_bound):
    """analyze's first finding on launch_bound is the eager forward's frame: beside the host removal and the
    with-device figure it carries ``saving_graphed_us``, the graph counterfactual of the same site, and its text
    states it; a finding whose site blocks carries None."""
    from gaptrace.analyses.savings import saving_text

    tr, ctx = launch_bound
    r = subprocess.run([sys.executable, "-m", "gaptrace.cli", "analyze", H100_LAUNCH_BOUND, "--json"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    f = next(x for x in json.loads(r.stdout)["findings"] if x.get("saving_graphed_us") is not None)
    assert f["cause"].endswith("_forward")
    # analyze's replay context: the default round name, the loop's steps found as find_steps finds them
    g = whatif(tr, [Change(f["cause"], graph=True)], context=Context(tr, read_sidecar_checked(H100_LAUNCH_BOUND)[0])
               ).data["saving_us"]
    assert f["saving_graphed_us"] == pytest.approx(g)
    assert abs(g - _measured_saving_ms() * 1e3) <= 0.05 * _measured_saving_ms() * 1e3
    assert "captured in one CUDA graph" in saving_text(f)


def test_calibration_graph_plain_is_checked(tmp_path):
    with open(shipped_calibration_path("NVIDIA H100 80GB HBM3"), encoding="utf-8") as f:
        obj = json.load(f)
    for bad in ({"graph_launch_t0_us": -1, "graph_launch_node_us": 0.2}, {"graph_launch_t0_us": 5.0}, [1, 2],
                {"graph_launch_t0_us": float("nan"), "graph_launch_node_us": 0.2}):
        p = tmp_path / "c.json"
        p.write_text(json.dumps(dict(obj, graph_plain=bad)))
        with pytest.raises(ValueError, match="graph_plain") as e:
            load_calibration(str(p))
        assert "\n" not in str(e.value)
    p.write_text(json.dumps(dict(obj, graph_plain=None)))  # calibrate writes null without CUDA
    assert load_calibration(str(p)).graph_launch_t0_us is None


def test_graphed_saving_said_where_the_host_removal_saves_nothing():
    """The repeat bench eager-commit-glue capture is device-bound: removing the glue's host work saves nothing, but
    capturing it in a graph packs its ~160 eager kernels a round: the text states the graphed figure (~0.2 ms)."""
    r = subprocess.run([sys.executable, "-m", "gaptrace.cli", "analyze", "--json", os.path.join(
        TRACES, "h200_pairs_repeat", "bench_overlap_bs8_B12_eager-commit-glue.json.gz")], capture_output=True, text=True)
    f = json.loads(r.stdout)["findings"][0]
    assert f["cause"] == "eager_commit_glue" and f["saving_us"] < 10 and f["saving_graphed_us"] > 150
    from gaptrace.analyses.savings import saving_text
    assert f"≈ {f['saving_graphed_us']:.0f} µs ({f['saving_graphed_share']:.0%}) captured in one CUDA graph" in \
        saving_text(f)


def test_the_fix_leaves_out_a_graph_that_cannot_capture_the_site():
    """rect_packed (the sync scheduler's plan) holds a cudaStreamSynchronize: its fix no longer says "move it into
    the CUDA graph", which whatif --graph refuses for it."""
    r = subprocess.run([sys.executable, "-m", "gaptrace.cli", "analyze", "--json", os.path.join(
        TRACES, "h200_pairs", "bench_sync_bs8_B12.json.gz")], capture_output=True, text=True)
    f = next(x for x in json.loads(r.stdout)["findings"] if x.get("cause", "").endswith("rect_packed"))
    assert f["saving_graphed_us"] is None
    assert "move it into the CUDA graph" not in f["fix"] and "a graph cannot capture its blocking call" in f["fix"]


def test_a_frame_as_analyze_prints_it_is_a_site():
    """analyze prints frames with their object addresses dropped; whatif takes that name too."""
    p = os.path.join(TRACES, "h200_pairs_repeat", "bench_overlap_bs8_B12_eager-commit-glue.json.gz")
    tr = load_trace(p)
    ctx = Context(tr, read_sidecar_checked(p)[0])
    raw = [n for n in tr.host["name"].astype(str).unique() if n.startswith("<built-in method to of Tensor object at 0x")]
    assert raw
    a = whatif(tr, [Change("<built-in method to of Tensor object>")], context=ctx).data
    b = whatif(tr, [Change(raw[0])], context=ctx).data
    assert a["changes"][0]["matched"]["how"] == "frame" and a["saving_us"] >= b["saving_us"]


def test_a_calibration_without_a_gpu_is_named_on_a_cuda_trace():
    cpu = load_calibration(os.path.join(os.path.dirname(__file__), "..", "..", "analyses", "data",
                                        "calibration_cpu_epyc.json"))
    tr = load_trace(H100_LAUNCH_BOUND)
    w = whatif(tr, [], context=Context(tr, None, cpu, round_name="step")).data
    assert any("measured no CUDA runtime-call cost" in x for x in w["warnings"])
    w = whatif(tr, [], context=Context(tr, None, round_name="step")).data
    assert not any("measured no CUDA runtime-call cost" in x for x in w["warnings"])


def test_an_error_line_quoting_a_huge_name_is_cut():
    r = subprocess.run([sys.executable, "-m", "gaptrace.cli", "whatif", H100_LAUNCH_BOUND, "--graph", "x" * 100000],
                       capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and len(r.stderr) < 2100 and "…" in r.stderr


def test_a_site_nested_in_another_changed_site_is_named(launch_bound):
    """aten::mm runs inside planted_eager_launches: graphing both changes nothing beyond graphing the range, and a
    note says the inner site lies inside the outer one."""
    tr, ctx = launch_bound
    one = whatif(tr, [Change(SITE, graph=True)], context=ctx).data
    both = whatif(tr, [Change(SITE, graph=True), Change("aten::mm", graph=True)], context=ctx).data
    assert both["saving_us"] == pytest.approx(one["saving_us"], abs=1.0)
    assert any(w.startswith("'aten::mm' lies inside 'planted_eager_launches' (100%") for w in both["warnings"])
    assert not any("lies inside" in w for w in one["warnings"])


def test_a_range_that_already_runs_as_a_graph_is_refused():
    """The sync capture's ``draft`` range launches only CUDA graph replays: nothing more to capture."""
    p = os.path.join(TRACES, "h200_pairs", "bench_sync_bs8_B12.json.gz")
    tr = load_trace(p)
    ctx = Context(tr, read_sidecar_checked(p)[0])
    with pytest.raises(SiteRefused, match="already runs as a CUDA graph"):
        whatif(tr, [Change("draft", graph=True)], context=ctx)
