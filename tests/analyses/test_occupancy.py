"""Occupancy on real traces: a hand computation (plain loops over stdlib-json events) and HolisticTraceAnalysis."""
from __future__ import annotations

import logging
import os
import shutil

import numpy as np
import pytest

from gaptrace.analyses.occupancy import busy_fraction_bins, device_occupancy, occupancy, resolve_window
from gaptrace.loader import load_trace
from gaptrace.trace import TraceError

from _idle_reference import DEVICE_CATS, Busy, device_intervals, raw_events, trace_path

PROBE = "h200_graph_launch_probe"
PUBLIC = [
    "hta_a100_graph_launches_rank0",
    "hta_a100_trace_diff_control",
    "hta_v100_trace_diff_test",
    "kineto_v100_resnet50",
    "tracelens_b200_eager",
    "tracelens_h100_owlv2",
    "tracelens_h100_qwen1.5_0.5b",
    "tracelens_mi300x_sglang_qwen3_8b_decode",
    "tracelens_vllm_prefilldecode_piecewise",
]


def test_probe_occupancy_equals_hand_computation():
    ev = raw_events(PROBE)
    ref = Busy(device_intervals(ev))
    row = occupancy(load_trace(trace_path(PROBE))).iloc[0]
    assert (row["rank"], row["device"], row["name"]) == (0, 0, "NVIDIA H200")
    assert row["window_start_us"] == ref.t0 and row["window_end_us"] == ref.t1
    assert row["busy_us"] == pytest.approx(ref.busy, rel=1e-12, abs=1e-6)
    assert row["idle_us"] == pytest.approx(ref.idle, rel=1e-12, abs=1e-6)
    assert row["occupancy"] == pytest.approx(ref.busy / (ref.t1 - ref.t0), rel=1e-12)
    assert row["gaps"] == len(ref.gaps())
    assert 0.05 < row["occupancy"] < 0.2  # the probe mostly waits on the host (graph launches, syncs)


def test_named_window_uses_gpu_annotation_then_host_annotation():
    ev = raw_events(PROBE)
    t = load_trace(trace_path(PROBE))
    for name in ["round_2", "graph_1600"]:
        gpu = [e for e in ev if e.get("ph") == "X" and e.get("cat") == "gpu_user_annotation" and e["name"] == name]
        host = [e for e in ev if e.get("ph") == "X" and e.get("cat") == "user_annotation" and e["name"] == name]
        src = gpu or host
        assert src
        t0 = min(e["ts"] for e in src)
        t1 = max(e["ts"] + e["dur"] for e in src)
        ref = Busy(device_intervals(ev), t0, t1)
        got = device_occupancy(t, 0, window=name)
        assert (got.window_start_us, got.window_end_us) == (t0, t1)
        assert got.busy_us == pytest.approx(ref.busy, abs=1e-6)
        assert got.gaps == len(ref.gaps())
        assert got.window == name
    # a host-only range: drop the GPU projections and the host range takes over
    t.gpu_annotations = t.gpu_annotations.iloc[0:0]
    host = [e for e in ev if e.get("ph") == "X" and e.get("cat") == "user_annotation" and e["name"] == "round_2"]
    assert resolve_window(t, 0, "round_2") == (host[0]["ts"], host[0]["ts"] + host[0]["dur"])


def test_unknown_window_names_the_available_annotations():
    t = load_trace(trace_path(PROBE))
    with pytest.raises(TraceError) as err:
        occupancy(t, window="decode")
    msg = str(err.value)
    assert "'decode'" in msg and "graph_1600" in msg and "round_0" in msg and "\n" not in msg


def test_no_device_activity_raises():
    t = load_trace(trace_path(PROBE))
    t.device = t.device.iloc[0:0]
    with pytest.raises(TraceError, match="no GPU activity"):
        occupancy(t)


def test_busy_fraction_bins_integrate_to_busy_time():
    t = load_trace(trace_path(PROBE))
    occ = device_occupancy(t, 0)
    bins = busy_fraction_bins(t, 0, 97)
    width = bins["end_us"] - bins["start_us"]
    assert len(bins) == 97
    assert ((bins["busy_fraction"] >= 0) & (bins["busy_fraction"] <= 1 + 1e-9)).all()
    assert float((bins["busy_fraction"] * width).sum()) == pytest.approx(occ.busy_us, rel=1e-9)
    # spot-check one bin by hand
    ref = Busy(device_intervals(raw_events(PROBE)))
    b = bins.iloc[40]
    assert b["busy_fraction"] == pytest.approx(1 - ref.idle_between(b["start_us"], b["end_us"]) /
                                               (b["end_us"] - b["start_us"]), abs=1e-9)


# ------------------------------------------------------------------ HolisticTraceAnalysis cross-check
#
# HTA (traceinsight 0.6, import name `hta`), HTA_DISABLE_NS_ROUNDING=1, include_last_profiler_step=True (the
# default drops the last ProfilerStep iteration, a different window by design). HTA's temporal breakdown is:
# busy = union of every event with a stream (stream != -1), span = first start to last end of those events.
# Where HTA differs from gaptrace by more than 0.1 percentage point the difference is named below, and the test
# proves the explanation by re-deriving HTA's number from the raw events with that one rule applied.
HTA_EXPLAINED = {
    # With >= 2 ProfilerStep ranges HTA keeps only device activities whose correlation id has a launching host
    # event in the trace (_filter_irrelevant_gpu_kernels); these traces hold activities launched before the
    # profiler started (872 and 614 of them), which gaptrace counts: the GPU was busy.
    "hta_a100_graph_launches_rank0": "launched-in-trace only",
    "hta_v100_trace_diff_test": "launched-in-trace only",
}
# Within tolerance but not identical: tracelens_b200_eager (0.086 pp): torch.compile writes a cpu_op for each
# Triton launch with args.stream, and HTA counts its host duration as GPU time because it has a stream;
# gaptrace counts device activities only. _hta_selection reproduces it.
HTA_FAILS = {
    # HTA 0.6.1 cannot load the probe: TypeError "Invalid value ... for dtype 'int16'" in its parser.
    PROBE: "int16",
}


def _hta_selection(ev: list[dict]) -> list[tuple[float, float]]:
    """HTA's busy set, derived by hand from the raw events (the rules named in HTA_EXPLAINED)."""
    x = [e for e in ev if e.get("ph") == "X"]
    steps = {e["name"] for e in x if str(e.get("name", "")).startswith("ProfilerStep")}
    dev = [e for e in x if e.get("cat") in DEVICE_CATS]
    if len(steps) >= 2:
        launched = {(e.get("args") or {}).get("correlation") for e in x
                    if e.get("cat") not in DEVICE_CATS}
        dev = [e for e in dev if (e.get("args") or {}).get("correlation") in launched]
    sel = [(e["ts"], e["ts"] + e["dur"]) for e in dev]
    sel += [(e["ts"], e["ts"] + e["dur"]) for e in x
            if e.get("cat") in ("cpu_op", "Operator") and "stream" in (e.get("args") or {})]
    return sel


def _run_hta(name: str, tmp_path):
    os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"
    hta_ta = pytest.importorskip("hta.trace_analysis")
    logging.getLogger("hta").setLevel(logging.ERROR)
    shutil.copy(trace_path(name), tmp_path / "rank0.json.gz")
    ta = hta_ta.TraceAnalysis(trace_dir=str(tmp_path), include_last_profiler_step=True)
    df = ta.get_temporal_breakdown(visualize=False)
    return 1.0 - float(df["idle_time(us)"].iloc[0]) / float(df["kernel_time(us)"].iloc[0])


@pytest.mark.parametrize("name", PUBLIC + [PROBE])
def test_occupancy_agrees_with_hta(name, tmp_path):
    ours = occupancy(load_trace(trace_path(name)))
    assert len(ours) == 1
    ours_occ = float(ours["occupancy"].iloc[0])
    ev = raw_events(name)
    assert ours_occ == pytest.approx(_plain_occupancy(device_intervals(ev)), abs=1e-9)
    try:
        hta_occ = _run_hta(name, tmp_path)
    except Exception as e:  # noqa: BLE001 - HTA's own failure to load is what is checked here
        assert name in HTA_FAILS and HTA_FAILS[name] in str(e), f"HTA failed on {name}: {e!r}"
        return
    assert name not in HTA_FAILS, f"HTA now loads {name}: drop it from HTA_FAILS"
    # HTA's number is its own selection rule applied to the raw events
    assert hta_occ == pytest.approx(_plain_occupancy(_hta_selection(ev)), abs=1e-3)
    if name in HTA_EXPLAINED:
        assert abs(ours_occ - hta_occ) > 1e-3, f"{name}: the difference is gone; drop it from HTA_EXPLAINED"
    else:
        assert ours_occ == pytest.approx(hta_occ, abs=1e-3)


def _plain_occupancy(intervals: list[tuple[float, float]]) -> float:
    ref = Busy(intervals)
    return ref.busy / (ref.t1 - ref.t0)
