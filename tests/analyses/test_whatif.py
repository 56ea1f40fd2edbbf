"""Counterfactual plumbing (docs/DESIGN.md "The replay model"): site matching, speedups, ranking causes, the
calibration file, on a real H200 capture and on hand-checkable inputs."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

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
    for bad in ("f", "f=0", "f=-1", "=2", "f=nan", "f=inf", "f=abc"):
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
    assert w["tau"] == pytest.approx(np.mean([r["tau"] for r in side["rounds"]]))


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
                {"aten_op_us": 1, "python_frame_us": 0, "runtime_call_us": True}):
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
