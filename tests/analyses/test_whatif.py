"""Counterfactual plumbing (docs/DESIGN.md "The replay model"): site matching, speedups, ranking causes, the
calibration file, on a real H200 capture and on hand-checkable inputs."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from gaptrace.analyses.summary import summarize

from gaptrace.analyses import replay as R
from gaptrace.analyses import whatif as W
from gaptrace.analyses.profiler_cost import DEFAULT_CALIBRATION, load_calibration
from gaptrace.sidecar import read_sidecar_checked
from gaptrace.loader import load_trace
from gaptrace.trace import TraceError

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "traces")
SYNC = os.path.join(ROOT, "h200_pairs", "bench_sync_bs8_B12.json.gz")


@pytest.fixture(scope="module")
def sync_ctx():
    tr = load_trace(SYNC)
    return W.Context(tr, read_sidecar_checked(SYNC)[0])


def test_coverage_by_hand():
    us, ue = np.array([0.0, 10.0]), np.array([4.0, 12.0])
    got = R._coverage(us, ue, np.array([0.0, 2.0, 5.0, 11.0, 20.0]), np.array([20.0, 3.0, 9.0, 30.0, 25.0]))
    np.testing.assert_allclose(got, [6.0, 1.0, 0.0, 1.0, 0.0])


def test_parse_speedup():
    assert W.parse_speedup("runtime/x.py(3): f=2.5") == W.Change("runtime/x.py(3): f", 2.5)
    assert W.parse_speedup("f=1").factor == 1.0 and W.parse_speedup("f=1e6").factor == 1e6
    # below 1 is a slowdown; a subnormal factor (1e-310) overflowed the replay's times to inf / NaN
    for bad in ("f", "f=0", "f=-1", "=2", "f=nan", "f=inf", "f=abc", "f=0.5", "f=1e-310", "f=5e-324", "f=1e7"):
        with pytest.raises(ValueError, match="SITE=FACTOR"):
            W.parse_speedup(bad)


def test_speedups_are_monotone_and_remove_is_the_limit(sync_ctx):
    tr = sync_ctx.trace
    base = W.whatif(tr, context=sync_ctx).data
    fast2 = W.whatif(tr, [W.Change("plan", 2.0)], context=sync_ctx).data
    fast8 = W.whatif(tr, [W.Change("plan", 8.0)], context=sync_ctx).data
    gone = W.whatif(tr, [W.Change("plan")], context=sync_ctx).data
    tot = [sum(d["periods_after_us"]) for d in (base, fast2, fast8, gone)]
    assert tot[0] >= tot[1] >= tot[2] >= tot[3]
    assert base["saving_us"] == 0.0 and base["one_off_saving_us"] == pytest.approx(0.0, abs=1e-6)
    # the plan range's host work, recomputed from the trace: removing it saves no more than it holds per round
    h = tr.host
    plan = h[(h["cat"] == "user_annotation") & (h["name"].astype(str) == "plan")]
    assert gone["saving_us"] <= plan["dur_us"].max() + 1.0


def test_removing_the_blocking_copy_stops_the_wait(sync_ctx):
    tr = sync_ctx.trace
    w = W.whatif(tr, [W.Change("device_lengths_to_host")], context=sync_ctx).data
    # the sync scheduler's per-round readback: removing it turns the round toward the overlapped one (predicted 381 µs
    # a round on this capture; with the plan's reads in rect_packed too 786 µs, against the sync -> overlap pair's
    # measured 793 µs, pairs.json)
    assert w["saving_us"] > 300.0
    assert w["occupancy_after"] > w["occupancy_before"]
    assert w["tpot_after_us"] == pytest.approx(w["after_round_us"] / w["tau"])
    side = read_sidecar_checked(SYNC)[0]
    # τ over the rounds that begin a period (the last round has none), as the rounds table and analyze take it
    assert w["tau"] == pytest.approx(np.mean([r["tau"] for r in side["rounds"][:w["rounds"]]]))
    assert w["rounds"] == len(side["rounds"]) - 1
    assert w["tau"] == pytest.approx(summarize(tr, sidecar=side).to_json()["rounds"]["summary"]["tau"])


def test_cause_savings_ranks_and_reports_unknown_sites():
    tr = load_trace(SYNC)
    side = read_sidecar_checked(SYNC)[0]
    rows = W.cause_savings(tr, [{"kind": "idle_site", "site": "plan"},
                                {"kind": "blocking_sync", "site": "device_lengths_to_host"},
                                {"kind": "idle_site", "site": "no_such_site"}], sidecar=side)
    assert [r["kind"] for r in rows] == ["idle_site", "blocking_sync", "idle_site"]
    ctx = W.Context(tr, side)
    for r in rows[:2]:  # each is the single-change whatif's saving
        assert r["saving_us"] > 0
        assert r["saving_us"] == pytest.approx(W.whatif(tr, [W.Change(r["site"])], context=ctx).data["saving_us"])
    assert rows[2]["saving_us"] is None and "no_such_site" in rows[2]["error"]


def test_unknown_site_is_one_line(sync_ctx):
    with pytest.raises(TraceError) as e:
        W.whatif(sync_ctx.trace, [W.Change("nope")], context=sync_ctx)
    assert "\n" not in str(e.value) and "'nope'" in str(e.value)


def test_calibration_file(tmp_path):
    c = load_calibration(None)
    assert c.source == os.path.abspath(DEFAULT_CALIBRATION)
    assert c.measured_on == "Intel(R) Xeon(R) Processor; NVIDIA H200; torch 2.11.0+cu130"
    with open(DEFAULT_CALIBRATION) as f:
        obj = json.load(f)
    assert c.aten_op_us == obj["aten_op_us"] and c.python_frame_us == obj["python_frame_us"]
    assert "H200" in obj["label"] and obj["runtime_call_measured"] and obj["device_op_measured"]
    assert c.runtime_call_us == obj["runtime_call_us"] and c.device_op_us == obj["device_op_us"]
    for bad in ({"aten_op_us": -1, "python_frame_us": 0, "runtime_call_us": 0},
                {"aten_op_us": 1, "python_frame_us": 0},
                {"aten_op_us": 1, "python_frame_us": 0, "runtime_call_us": True},
                # a cost per event over 1 ms is no measurement (the measured ones are 0.1-3 µs)
                {"aten_op_us": 1e6, "python_frame_us": 0, "runtime_call_us": 0},
                {"aten_op_us": 1, "python_frame_us": 0, "runtime_call_us": 0, "device_op_us": 1e300}):
        p = tmp_path / "c.json"
        p.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match="calibration field"):
            load_calibration(str(p))
    p = tmp_path / "x.json"
    p.write_text("{")
    with pytest.raises(ValueError, match="cannot read the calibration"):
        load_calibration(str(p))


def test_one_off_is_the_outlier_rounds_excess_only():
    from gaptrace.analyses.whatif import one_off_saving_us

    rng = np.random.default_rng(0)
    noisy = 400.0 + rng.normal(0, 60.0, 200)  # a per-round saving that varies: no one-off
    assert one_off_saving_us(noisy, float(np.median(noisy))) == 0.0
    compiled = noisy.copy()
    compiled[3] += 16_000.0  # a compile removed from one round
    med = float(np.median(compiled))
    assert one_off_saving_us(compiled, med) == pytest.approx(compiled[3] - med)
    assert one_off_saving_us(np.array([]), 0.0) == 0.0


FUSED = os.path.join(ROOT, "h200_fused", "h200_bench_overlap_bs8_B12_fused.json.gz")


def _raw_events(path: str) -> list[dict]:
    import gzip
    with gzip.open(path, "rt") as f:
        return json.load(f)["traceEvents"]


def _device_busy_per_round_us(ev: list[dict], round_name: str = "round") -> list[float]:
    """Per round window [start of round r, start of round r+1): the device's busy time, from the raw events with the
    stdlib reference (tests/analyses/_steps_reference.py)."""
    import sys
    sys.path.insert(0, os.path.dirname(__file__))
    import _steps_reference as ref
    starts = sorted(float(e["ts"]) for e in ev if e.get("ph") == "X" and e.get("cat") == "user_annotation"
                    and e.get("name") == round_name)
    busy = ref.device_busy(ev, 0, starts[0], starts[-1])
    return [ref.busy_in(busy, a, b) for a, b in zip(starts, starts[1:])]


def test_removing_the_pacing_read_of_a_gpu_bound_loop_stops_at_the_device_work():
    """The overlap scheduler's rounds are GPU-bound (~93% busy): removing its blocking read lets the replayed host
    run ahead of the device, and the predicted round must not fall below the device work each round launches
    (DESIGN.md 5.5). Before the device-side bound it read 0.82 ms against 4.3 ms of device work a round."""
    tr = load_trace(FUSED)
    w = W.whatif(tr, [W.Change("runtime/model_runner.py(60): get")], read_sidecar_checked(FUSED)[0]).data
    busy = float(np.median(_device_busy_per_round_us(_raw_events(FUSED))))
    assert busy > 4000.0  # the measured device work a round, recomputed by hand
    assert w["after_round_us"] >= 0.95 * busy, (w["after_round_us"], busy)
    assert 0.0 <= w["saving_us"] < 0.1 * w["before_round_us"]
    assert w["occupancy_after"] <= 1.0 + 1e-9


def test_two_capture_windows_back_to_back_replay_alike(tmp_path):
    """A trace of two windows of the same capture, one after the other (the second window's ops in flight at its
    start, tied to no call): the second window replays as the first does, with no stall invented between them
    (its untied ops stay in their stream's measured order, DESIGN.md 5.1), and the pause between the windows (a
    stretch the profiler did not record, between the two Kineto window spans) is no round."""
    import subprocess
    import sys
    out = tmp_path / "two.json"
    mk = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "make_big_trace.py")
    subprocess.run([sys.executable, mk, str(out), "--source", FUSED, "--size-gb", "0.006"], check=True,
                   capture_output=True)
    one = W.whatif(load_trace(FUSED)).data
    tr2 = load_trace(str(out))
    assert len(tr2.windows) == 2
    two = W.whatif(tr2).data
    n = len(one["periods_replayed_us"])
    rep2, meas2 = two["periods_replayed_us"], two["periods_profiled_us"]
    assert two["window_joins"] == 1 and len(rep2) == len(meas2) == 2 * n
    np.testing.assert_allclose(rep2[:n], one["periods_replayed_us"], rtol=1e-6)
    np.testing.assert_allclose(rep2[n:], one["periods_replayed_us"], rtol=0.01)
    np.testing.assert_allclose(meas2[n:], one["periods_profiled_us"], rtol=1e-6)
    assert max(rep2[n:]) < 1.1 * max(one["periods_replayed_us"])


def test_intersect_by_hand():
    s, e = R._intersect(np.array([0.0, 10.0]), np.array([5.0, 20.0]), np.array([3.0, 12.0, 18.0]),
                        np.array([11.0, 14.0, 30.0]))
    np.testing.assert_allclose(s, [3.0, 10.0, 12.0, 18.0])
    np.testing.assert_allclose(e, [5.0, 11.0, 14.0, 20.0])


def test_two_changes_of_one_site_are_refused():
    with pytest.raises(ValueError, match="name the same site"):
        W.check_changes([W.Change("plan"), W.Change("plan", 2.0)])
    with pytest.raises(ValueError, match="name the same site"):
        W.check_changes([W.Change("plan", 2.0), W.Change("plan", 3.0)])
    W.check_changes([W.Change("plan"), W.Change("rect_packed", 2.0)])


def test_a_substring_site_says_what_it_matched(sync_ctx):
    tr = sync_ctx.trace
    w = W.whatif(tr, [W.Change("window")], context=sync_ctx).data
    m = w["changes"][0]["matched"]
    h = tr.host
    frames = h[h["tid"].astype(str) == sync_ctx.model.tid]
    frames = frames[frames["cat"].isin(("python_function", "cpu_op"))]
    names = sorted({str(n) for n in frames["name"].astype(str) if "window" in n})
    assert m["how"] == "frames containing" and m["names"] == names and len(names) >= 2
    assert m["events"] == int(frames["name"].astype(str).str.contains("window", regex=False).sum())
    exact = W.whatif(tr, [W.Change("plan")], context=sync_ctx).data["changes"][0]["matched"]
    assert exact["how"] == "range" and exact["names"] == ["plan"]


HELPER = os.path.join(ROOT, "h200_loops", "helper_thread.planted.trace.json.gz")


def test_a_site_on_another_thread_shortens_the_waits_on_it():
    """The helper-thread loop: the main thread waits on a queue while the helper thread builds the inputs in
    ``_make_inputs``. Removing that frame takes out the parts of the main thread's lock waits during which the helper
    was inside it (recomputed here from the raw frames), no more; before, whatif refused the site."""
    from gaptrace.analyses.profiler_cost import THREAD_WAIT_MIN_US, THREAD_WAIT_PREFIX

    tr = load_trace(HELPER)
    ctx = W.Context(tr, read_sidecar_checked(HELPER)[0])
    site = "benchmarks/loops/helper_thread.py(57): _make_inputs"
    w = W.whatif(tr, [W.Change(site)], context=ctx).data
    assert w["changes"][0]["matched"]["how"] == "other thread"
    h = tr.host
    main = ctx.model.tid
    lo, hi = ctx.window
    waits = h[(h["tid"].astype(str) == main) & (h["cat"] == "python_function")
              & h["name"].astype(str).str.startswith(THREAD_WAIT_PREFIX) & (h["dur_us"] >= THREAD_WAIT_MIN_US)]
    helper = h[(h["tid"].astype(str) != main) & (h["name"].astype(str) == site)]
    # the overlap of the waits with the helper's frame, by pairs (both sets are disjoint on their thread)
    ov = sum(max(0.0, min(a1, b1, hi) - max(a0, b0, lo))
             for a0, a1 in zip(waits["ts_us"], waits["end_us"]) for b0, b1 in zip(helper["ts_us"], helper["end_us"]))
    assert ov > 1000.0
    us, ue = W.other_thread_intervals(tr, ctx.model, site, ctx.window)
    assert float(np.sum(ue - us)) == pytest.approx(ov, rel=1e-6)
    assert 0.0 < w["saving_us"] <= ov / w["rounds"] + 1.0
    # a thread that is nowhere: one line
    with pytest.raises(TraceError, match="on any thread"):
        W.whatif(tr, [W.Change("no_such_frame_anywhere")], context=ctx)


def test_the_shipped_calibration_follows_the_traces_gpu(tmp_path):
    """No calibration given: an H100 trace gets the shipped H100 calibration (its device cost per op and queued-launch
    gap are that GPU's), an H200 trace and a GPU with no shipped calibration the H200 default; a file given is used
    as it is."""
    from gaptrace.analyses.profiler_cost import shipped_calibration_path
    h100 = load_trace(os.path.join(ROOT, "h100_loops", "graph_readback.planted.trace.json.gz"))
    h200 = load_trace(os.path.join(ROOT, "h200_loops", "graph_readback.planted.trace.json.gz"))
    Context = W.Context
    assert Context(h100).calibration.source.endswith("calibration_h100.json")
    assert Context(h100).calibration.queue_gap_us == pytest.approx(1.132, abs=0.001)
    assert Context(h200).calibration.source == os.path.abspath(DEFAULT_CALIBRATION)
    assert shipped_calibration_path("NVIDIA B200") == DEFAULT_CALIBRATION
    assert shipped_calibration_path(None) == DEFAULT_CALIBRATION
    given = load_calibration(DEFAULT_CALIBRATION)
    assert Context(h100, calibration=given).calibration is given


def test_hostile_calibration_files_are_one_line_each(tmp_path):
    """A FIFO is refused without reading it (the read would block), as are an oversized file, deep nesting, an
    integer no float holds, a queued-launch gap over 1 ms and a non-boolean queue_gap_measured: each a ValueError
    naming the file; a queue gap flagged as not measured is not used."""
    base = json.load(open(DEFAULT_CALIBRATION))
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        load_calibration(str(fifo))
    cases = {"big.json": json.dumps(dict(base, pad="x" * (1 << 20))),
             "deep.json": "[" * 100_000 + "]" * 100_000,
             "hugeint.json": json.dumps(base)[:-1] + ', "queue_gap_us": 1' + "0" * 400 + "}",
             "hugeaten.json": json.dumps(dict(base, aten_op_us=0))[:-1].replace('"aten_op_us": 0', '"aten_op_us": 1' + "0" * 400) + "}",
             "gap.json": json.dumps(dict(base, queue_gap_us=1e300)),
             "flag.json": json.dumps(dict(base, queue_gap_us=1.0, queue_gap_measured="false"))}
    for name, text in cases.items():
        p = tmp_path / name
        p.write_text(text)
        with pytest.raises(ValueError) as e:
            load_calibration(str(p))
        assert str(e.value).startswith(str(p)) and "\n" not in str(e.value), name
    p = tmp_path / "off.json"
    p.write_text(json.dumps(dict(base, queue_gap_us=1.0, queue_gap_measured=False)))
    assert load_calibration(str(p)).queue_gap_us is None
    p.write_text(json.dumps(dict(base, measured_on="</script>" + "m" * 300_000)))
    assert len(load_calibration(str(p)).measured_on) == 201  # what every output prints of it


def test_a_huge_gpu_name_is_cut():
    """deviceProperties' name comes from the trace (untrusted): at most 200 characters reach the outputs."""
    from gaptrace.trace import DEVICE_NAME_MAX
    tr = load_trace(os.path.join(ROOT, "h100_loops", "graph_readback.planted.trace.json.gz"))
    props = tr.metadata["deviceProperties"]
    props[0] = dict(props[0], name="N" * 200_000)
    name = tr.device_name(props[0]["id"])
    assert len(name) == DEVICE_NAME_MAX + 1 and name.endswith("…")
