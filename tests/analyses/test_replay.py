"""The replay model (docs/DESIGN.md "The replay model") against the shipped H200 runtime captures: the unchanged
replay reproduces the measured round periods, the profiler taken out predicts the sidecar's unprofiled round, and
removing a fault's range predicts the clean twin's round. Measured figures are recomputed here from the raw JSON."""
from __future__ import annotations

import glob
import gzip
import json
import os

import numpy as np
import pytest

from gaptrace.analyses import replay as R
from gaptrace.analyses.profiler_cost import load_calibration
from gaptrace.analyses.whatif import Change, Context
from gaptrace.analyses.whatif import whatif as _whatif
from gaptrace.sidecar import read_sidecar_checked
from gaptrace.loader import load_trace

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "traces")
SETS = ("h200_runtime", "h200_faults", "h200_fused")
FIXTURES = sorted(os.path.relpath(p, ROOT) for s in SETS for p in glob.glob(os.path.join(ROOT, s, "*.json.gz")))

# The shipped eager-era captures (h200_runtime, h200_faults) are cut to two profiled rounds, one round period (the
# long-prompt pair to one round, inside its prefill: no period); their sidecars hold 3 unprofiled rounds each. The
# fused captures keep six rounds. A prediction of the unprofiled round is the median of the replayed periods, and the
# first replayed period starts with the device backlog launched before the trace (docs/DESIGN.md 5.7): it needs
# MIN_PERIODS periods so that the median is not the first one; a capture with fewer is checked for the unchanged
# replay only. The proof on measured fixes is tests/analyses/test_whatif_pairs.py (h200_pairs: six profiled rounds and
# 20 unprofiled ones each). The bounds below are the errors measured on the shipped captures, rounded up.
MIN_PERIODS = 3
# median round-period error of the unchanged replay: <= 2% everywhere but these (the graph launches' first-node
# start under the profiler varies launch to launch on the sync / blocking-copy captures; a compile round; the one period
# of a two-round overlapped capture, which starts with the device backlog)
REPLAY_BOUND = {"h200_faults/h200_tiny_overlap_bs8_B12_jit-new-shape.json.gz": 0.09,
    "h200_runtime/h200_tiny_overlap_bs8_B12.json.gz": 0.26}
# predicted unprofiled round vs the median of the sidecar's unprofiled rounds, with the CPU build machine's calibration alone
# (not fitted): within 10% everywhere but these
UNPROFILED_BOUND = {"h200_fused/h200_bench_sync_bs8_B12_fused_3graphs.json.gz": 0.12}
# with 0.2 µs per device op (a sensitivity input): within 8% everywhere but these
DEVICE_OP_BOUND = {}
# removing the fault's range vs the clean twin's measured unprofiled round: within 25% everywhere but these
PAIR_BOUND = {}

# the figures below are those of the CPU build machine's calibration, the calibration alone (not fitted to the
# sidecar's unprofiled rounds): the profiler cost model as calibrated, tested against the measured rounds
CPU_CALIBRATION = os.path.join(os.path.dirname(__file__), "..", "..", "analyses", "data", "calibration_cpu_epyc.json")
_cache: dict = {}


def whatif(tr, changes=(), sidecar=None, calibration=None):
    cal = calibration or load_calibration(CPU_CALIBRATION)
    return _whatif(tr, changes, context=Context(tr, sidecar, cal, fit=False))


def _load(rel: str):
    if rel not in _cache:
        p = os.path.join(ROOT, rel)
        _cache.clear()  # one trace at a time: they are large
        _cache[rel] = (load_trace(p), read_sidecar_checked(p)[0])
    return _cache[rel]


def _one_round(rel: str) -> bool:
    """Whether the shipped capture holds fewer than two ``round`` annotations (no round period to replay)."""
    return len(_raw_round_periods(rel)) == 0


def _too_few_periods(rel: str) -> bool:
    """Whether the capture has fewer than MIN_PERIODS round periods (no median beyond the first period to predict)."""
    return len(_raw_round_periods(rel)) < MIN_PERIODS


def _raw_round_periods(rel: str) -> np.ndarray:
    with gzip.open(os.path.join(ROOT, rel), "rt") as f:
        ev = json.load(f)["traceEvents"]
    ts = sorted(e["ts"] for e in ev if e.get("cat") == "user_annotation" and e.get("name") == "round"
                and e.get("ph") == "X")
    return np.diff(ts)


def _raw_unprofiled_us(rel: str) -> float | None:
    p = os.path.join(ROOT, rel).replace(".json.gz", ".gaptrace.json")
    with open(p) as f:
        u = json.load(f).get("unprofiled_round_ms")
    return float(np.median(u)) * 1e3 if u else None


def test_stream_scan_matches_the_recurrence():
    rng = np.random.default_rng(0)
    l = np.cumsum(rng.exponential(3.0, 500)) * rng.integers(0, 2, 500)
    d = rng.exponential(2.0, 500)
    q = rng.exponential(0.5, 500)
    e, prev = np.empty(500), 7.0
    for i in range(500):
        prev = e[i] = max(l[i], prev + q[i]) + d[i]
    np.testing.assert_allclose(R._stream_scan(l, q + d, d, 7.0), e, rtol=0, atol=1e-9)


@pytest.mark.parametrize("rel", FIXTURES)
def test_unchanged_replay_reproduces_round_periods(rel):
    if _one_round(rel):
        pytest.skip("one profiled round: no round period to replay")
    tr, _ = _load(rel)
    u = R.unchanged_error(tr)
    meas = _raw_round_periods(rel)
    np.testing.assert_allclose(u["measured_periods_us"], meas, rtol=0, atol=1e-3)
    rel_err = np.abs(np.array(u["replayed_periods_us"]) - meas) / meas
    assert float(np.median(rel_err)) == pytest.approx(u["round_period_error"])
    assert u["round_period_error"] <= REPLAY_BOUND.get(rel, 0.02), u["round_period_error"]


def test_replay_reproduces_the_rounds_table():
    from gaptrace.analyses.rounds import rounds

    tr, side = _load("h200_pairs/bench_sync_bs8_B12.json.gz")
    m = R.build_model(tr)
    res = R.replay(m)
    rt = rounds(tr, sidecar=side).table["t_round_us"].to_numpy()
    rep = R.round_periods(m, res, R.round_starts(tr, m))
    assert np.max(np.abs(rep - rt) / rt) < 0.003  # 0.28% at most on this capture
    # device starts: derived, not copied, yet close (median |error| over every op)
    assert 0 < float(np.median(np.abs(res.op_start_us - m.op_start_us))) < 150.0


@pytest.mark.parametrize("rel", FIXTURES)
def test_unprofiled_round_prediction(rel):
    if _too_few_periods(rel):
        pytest.skip(f"fewer than {MIN_PERIODS} round periods: no median beyond the first period to predict")
    tr, side = _load(rel)
    w = whatif(tr, sidecar=side).data
    unp = _raw_unprofiled_us(rel)
    assert unp is not None and w["unprofiled_round_us"] == pytest.approx(unp)
    err = abs(w["before_round_us"] - unp) / unp
    assert err <= UNPROFILED_BOUND.get(rel, 0.10), err
    assert w["calibration"]["source"].endswith("calibration_cpu_epyc.json") and not w["fitted_to_unprofiled"]


@pytest.fixture(scope="module")
def device_cost_calibration(tmp_path_factory):
    """The shipped calibration with a device cost per traced op of 0.2 µs: a sensitivity input, not a measurement."""
    with open(CPU_CALIBRATION) as f:
        obj = json.load(f)
    obj.update(device_op_us=0.2, measured_on="sensitivity: device_op_us 0.2 µs, not measured")
    p = tmp_path_factory.mktemp("cal") / "cal.json"
    p.write_text(json.dumps(obj))
    return str(p)


@pytest.mark.parametrize("rel", FIXTURES)
def test_device_op_cost_closes_the_unprofiled_gap(rel, device_cost_calibration):
    from gaptrace.analyses.profiler_cost import load_calibration

    if _too_few_periods(rel):
        pytest.skip(f"fewer than {MIN_PERIODS} round periods: no median beyond the first period to predict")
    tr, side = _load(rel)
    cal = load_calibration(device_cost_calibration)
    w0 = whatif(tr, sidecar=side).data
    w = whatif(tr, sidecar=side, calibration=cal).data
    unp = _raw_unprofiled_us(rel)
    assert abs(w["before_round_us"] - unp) / unp <= DEVICE_OP_BOUND.get(rel, 0.08)
    assert w["before_round_us"] < w0["before_round_us"]
    assert w["removed_us"]["device_ops"] == pytest.approx(0.2 * len(tr.device), rel=1e-9)
    assert w["calibration"]["measured_on"].startswith("sensitivity")


PAIRS = [  # fault (or sync) trace, the range or frame removed, the clean twin (the bench bs-8 faults of h200_pairs and
    # their clean twins: tests/analyses/test_whatif_pairs.py, against the measured savings)
    ("h200_faults/h200_tiny_overlap_bs8_B12_lengths-copy.json.gz", "lengths_copy", "h200_runtime/h200_tiny_overlap_bs8_B12.json.gz"),
    ("h200_faults/h200_tiny_overlap_bs8_B12_dd-gather.json.gz", "dd_gather", "h200_runtime/h200_tiny_overlap_bs8_B12.json.gz"),
    ("h200_faults/h200_tiny_overlap_bs8_B12_eager-commit-glue.json.gz", "eager_commit_glue", "h200_runtime/h200_tiny_overlap_bs8_B12.json.gz"),
    ("h200_faults/h200_tiny_overlap_bs8_B12_token-list-rebuild.json.gz", "token_list_rebuild", "h200_runtime/h200_tiny_overlap_bs8_B12.json.gz"),
    ("h200_faults/h200_tiny_overlap_bs2_B8_long60k_token-list-rebuild.json.gz", "token_list_rebuild", "h200_faults/h200_tiny_overlap_bs2_B8_long60k.json.gz"),
    ("h200_fused/h200_bench_sync_bs8_B12_fused_3graphs.json.gz", "device_lengths_to_host", "h200_fused/h200_bench_overlap_bs8_B12_fused_3graphs.json.gz"),
    ("h200_faults/h200_tiny_overlap_bs8_B12_jit-new-shape.json.gz", "jit_new_shape", "h200_runtime/h200_tiny_overlap_bs8_B12.json.gz"),
    ("h200_runtime/h200_tiny_sync_bs8_B12.json.gz", "device_lengths_to_host", "h200_runtime/h200_tiny_overlap_bs8_B12.json.gz"),
    ("h200_runtime/h200_tiny_sync_bs1_B12.json.gz", "device_lengths_to_host", "h200_runtime/h200_tiny_overlap_bs1_B12.json.gz"),
    ("h200_fused/h200_bench_sync_bs8_B12_fused.json.gz", "device_lengths_to_host", "h200_fused/h200_bench_overlap_bs8_B12_fused.json.gz"),
]


@pytest.mark.parametrize("fault,site,clean", PAIRS)
def test_counterfactual_predicts_the_clean_twin(fault, site, clean):
    if _too_few_periods(fault):
        pytest.skip(f"fewer than {MIN_PERIODS} round periods: no median beyond the first period to predict")
    tr, side = _load(fault)
    w = whatif(tr, [Change(site)], sidecar=side).data
    target = _raw_unprofiled_us(clean)
    err = abs(w["after_round_us"] - target)
    # the goal is 35% or 60 µs
    assert err <= PAIR_BOUND.get(f"{fault}|{site}", 0.25) * target, (w["after_round_us"], target)
    # the max-plus replay is monotone: less host work never ends the rounds later (a median period may still move)
    assert sum(w["periods_after_us"]) <= sum(w["periods_before_us"]) + 1e-6


def test_queued_items_keep_their_own_gap_and_the_rest_take_the_calibrations(tmp_path):
    """An eager loop on an H100 whose only queued items are cuBLAS split-K pairs (the reduce overlaps the GEMM): those
    keep their own measured gap (0 where they overlap), checked by hand against the device ops; every item the trace
    never showed queued takes the calibration's measured unprofiled gap when it has one, and graphing away the host
    of the forward then saves less than with no gap at all (each of its kernels now queues behind the previous)."""
    tr = load_trace(os.path.join(ROOT, "h100_loops", "per_request_readback.planted.trace.json.gz"))
    m = R.build_model(tr)
    q = m.item_queued
    assert q.sum() == m.latency_us["queued_items"] >= 40
    d = tr.device.iloc[m.op_row]
    first = np.flatnonzero(np.r_[True, m.op_item[1:] != m.op_item[:-1]])
    start = d["ts_us"].to_numpy()[first]
    end = d["end_us"].to_numpy()
    # by hand: each queued item's start less the latest end of the earlier items on its stream
    for i in np.flatnonzero(q)[:20]:
        same = np.flatnonzero((m.item_stream == m.item_stream[i]) & (np.arange(len(q)) < i))
        prev = max(end[m.op_item == j].max() for j in same)
        own = max(start[i] - prev, 0.0)
        want = own if own <= R.LAUNCH_BOUND_GAP_US else m.latency_us["queue_gap"]
        assert m.item_gap_us[i] == pytest.approx(want, abs=1e-6)
    assert (m.item_gap_us[q] == 0).mean() > 0.5  # the split-K reduces start before their GEMM ends
    base = json.load(open(load_calibration(None).source))
    with_gap = dict(base, queue_gap_us=1.5, queue_gap_measured=True)
    p = tmp_path / "cal.json"
    p.write_text(json.dumps(with_gap))
    cal = load_calibration(str(p))
    assert cal.queue_gap_us == 1.5
    ctx = Context(tr, None, cal, fit=False)
    eager = ~m.item_prior & (m.graph_nodes[np.maximum(m.item_call, 0)] == 0)
    g = ctx.unprof["item_gap_us"]
    assert ctx.unprof["queue_gap_source"] == "calibration"
    assert np.all(g[eager & ~q] == 1.5) and np.array_equal(g[q], m.item_gap_us[q])
    no_gap = dict(base, queue_gap_us=0.0)
    p0 = tmp_path / "cal0.json"
    p0.write_text(json.dumps(no_gap))
    site = "benchmarks/loops/_common.py(153): logits"
    a = _whatif(tr, [Change(site)], context=Context(tr, None, load_calibration(str(p0)), fit=False)).to_dict()
    b = _whatif(tr, [Change(site)], context=ctx).to_dict()
    assert b["after_round_us"] > a["after_round_us"] + 20  # ~40 kernels a round, each 1.5 µs more when queued
    for bad in (-1, float("nan"), True):
        p.write_text(json.dumps(dict(base, queue_gap_us=bad)))
        with pytest.raises(ValueError, match="queue_gap_us"):
            load_calibration(str(p))
