"""NVTX ranges the capture timed without the profiler (sidecar ``unprofiled_ranges``) take their measured host time
in the replay (docs/DESIGN.md 5.2 "Measured ranges"), on a real H200 capture of the eager-commit-glue fault."""
from __future__ import annotations

import copy
import os

import numpy as np
import pytest

from gaptrace import load_trace
from gaptrace.analyses import whatif as W
from gaptrace.analyses.profiler_cost import load_calibration, measured_ranges, unprofiled_inputs
from gaptrace.analyses.replay import _coverage, _merge, build_model
from gaptrace.sidecar import Sidecar, read_sidecar_checked, sidecar_field_problems

PATH = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "traces", "h200_pairs",
                    "tiny_overlap_bs1_B12_eager-commit-glue_a.json.gz")


@pytest.fixture(scope="module")
def glue():
    tr = load_trace(PATH)
    side = read_sidecar_checked(PATH)[0]
    return tr, side, build_model(tr)


def _with(side: dict, *ranges) -> dict:
    s = copy.deepcopy(side)
    s["unprofiled_ranges"] = [{"name": n, "mean_us": m, "per_round": 1.0} for n, m in ranges]
    return s


def _range_time(tr, model, name, work, cost, base=None) -> tuple[float, int]:
    """The replay's host time inside range ``name``, recomputed from the trace's rows, and its occurrences: its share
    of each host work interval's profiled length f_k times that interval's unprofiled work (``base``: given, the
    work before the measured ranges; the rest of the interval keeps it), plus the calls that start inside it."""
    h = tr.host
    m = (h["cat"] == "user_annotation").to_numpy() & (h["name"].astype(str) == name).to_numpy()
    us, ue = _merge(h["ts_us"].to_numpy()[m] - model.t0_us, h["end_us"].to_numpy()[m] - model.t0_us)
    s, e = model.call_start_us, model.call_end_us
    a = np.concatenate(([s[0]], e[:-1]))
    f = np.clip(_coverage(us, ue, a, s) / np.where(model.work_us > 0, model.work_us, np.inf), 0, 1)
    i = np.searchsorted(us, s, side="right") - 1
    inside = (i >= 0) & (s < ue[np.maximum(i, 0)])
    part = work * f if base is None else work - base * (1.0 - f)
    return float(np.sum(part) + np.sum(cost[inside])), int(m.sum())


def test_a_measured_range_takes_its_measured_time(glue):
    tr, side, model = glue
    cal = load_calibration(None)
    plain = unprofiled_inputs(tr, model, cal, side)
    got = unprofiled_inputs(tr, model, cal, _with(side, ("eager_commit_glue", 250.0)))
    before, n = _range_time(tr, model, "eager_commit_glue", plain["work_us"], plain["cost_us"])
    after, _ = _range_time(tr, model, "eager_commit_glue", got["work_us"], got["cost_us"], plain["work_us"])
    assert n == 8 and before > 3 * 250.0 * n  # the calibration leaves ~1.2 ms a round of a 0.25 ms range
    assert after == pytest.approx(250.0 * n, rel=1e-9)
    row = got["measured_ranges"]["eager_commit_glue"]
    assert row["applied"] and row["measured_us_per_round"] == 250.0
    assert row["modeled_us_per_round"] == pytest.approx(before / n, rel=1e-9)
    # outside the range nothing moves
    h = tr.host
    m = (h["name"].astype(str) == "eager_commit_glue").to_numpy()
    us, ue = _merge(h["ts_us"].to_numpy()[m] - model.t0_us, h["end_us"].to_numpy()[m] - model.t0_us)
    s, e = model.call_start_us, model.call_end_us
    a = np.concatenate(([s[0]], e[:-1]))
    untouched = _coverage(us, ue, a, s) == 0
    np.testing.assert_array_equal(got["work_us"][untouched], plain["work_us"][untouched])
    assert got["removed_us"]["measured_ranges"] == pytest.approx(before - after, rel=1e-9)


def test_ranges_that_cannot_take_their_measurement_say_why(glue):
    tr, side, model = glue
    cal = load_calibration(None)
    got = unprofiled_inputs(tr, model, cal, _with(side, ("eager_commit_glue", 250.0), ("commit", 400.0),
                                                  ("read", 900.0), ("no_such_range", 5.0)))
    why = {k: (v["applied"], v["why"]) for k, v in got["measured_ranges"].items()}
    assert why["eager_commit_glue"] == (True, None)
    assert not why["commit"][0] and "holds a range" in why["commit"][1]  # its time holds the glue's
    assert not why["read"][0] and "blocks" in why["read"][1]  # the readback waits inside it
    assert not why["no_such_range"][0] and "not on the launching thread" in why["no_such_range"][1]


def test_a_site_share_counts_a_measured_range_as_measured(glue):
    """Removing the measured range takes out exactly its measured time from the host work (the rest of each
    interval it shares stays), whatever the calibration had left in it."""
    from gaptrace.analyses.profiler_cost import site_share
    tr, side, model = glue
    got = unprofiled_inputs(tr, model, load_calibration(None), _with(side, ("eager_commit_glue", 250.0)))
    us, ue = W.site_intervals(tr, model, "eager_commit_glue")
    share = site_share(model, us, ue, got["work_us"], got["measured_scale"])
    plain = unprofiled_inputs(tr, model, load_calibration(None), side)
    work_part, _ = _range_time(tr, model, "eager_commit_glue", got["work_us"], np.zeros(model.calls),
                               plain["work_us"])
    assert float(np.sum(share * got["work_us"])) == pytest.approx(work_part, rel=1e-9)
    # without measured ranges it is the profiled share
    s0 = site_share(model, us, ue, plain["work_us"], plain["measured_scale"])
    assert float(np.sum(s0 * plain["work_us"])) == pytest.approx(
        _range_time(tr, model, "eager_commit_glue", plain["work_us"], np.zeros(model.calls))[0], rel=1e-9)


def test_removing_a_measured_range_saves_at_most_its_measured_time(glue):
    tr, side, _model = glue
    for ms in (100.0, 1000.0):
        ctx = W.Context(tr, _with(side, ("eager_commit_glue", ms)), fit=False)
        w = W.whatif(tr, [W.Change("eager_commit_glue")], context=ctx).data
        assert 0.0 <= w["saving_us"] <= ms + 1.0
    # fitted: α then sets the rest of the round to the measured period
    ctx = W.Context(tr, _with(side, ("eager_commit_glue", 1000.0)))
    w = W.whatif(tr, [W.Change("eager_commit_glue")], context=ctx).data
    assert w["before_round_us"] == pytest.approx(w["unprofiled_round_us"], rel=1e-3)
    assert w["measured_ranges"]["eager_commit_glue"]["applied"]
    assert 0.0 < w["saving_us"] <= 1001.0


def test_sidecar_ranges_are_checked():
    bad = {"unprofiled_ranges": [{"name": "a", "mean_us": 3.0, "per_round": 1.0}, {"name": "", "mean_us": 1.0},
                                 {"name": "b", "mean_us": -1.0, "per_round": 1.0}, "x"]}
    assert [p.split(" ")[0] for p in sidecar_field_problems(bad)] == ["unprofiled_ranges[1]", "unprofiled_ranges[2]",
                                                                      "unprofiled_ranges[3]"]
    side = Sidecar.from_dict(bad)
    assert list(side.unprofiled_ranges) == ["a"] and side.unprofiled_ranges["a"].mean_us == 3.0
    assert sidecar_field_problems({"unprofiled_ranges": {}}) == ["unprofiled_ranges (not a list)"]
    # a name written twice: the second entry is the one skipped, and the warning says which one is used
    dup = {"unprofiled_ranges": [{"name": "a", "mean_us": 3.0, "per_round": 1.0},
                                 {"name": "a", "mean_us": 9.0, "per_round": 1.0}]}
    assert sidecar_field_problems(dup) == ['unprofiled_ranges[1] (a second entry for "a": the first one is used)']
    assert Sidecar.from_dict(dup).unprofiled_ranges["a"].mean_us == 3.0
    # ranges said to be timed over no round are skipped, and named so
    for rounds in (0, -5, 2.5, True):
        none = dict(dup, unprofiled_range_rounds=rounds)
        assert sidecar_field_problems(none)[0].startswith("unprofiled_range_rounds (")
        assert Sidecar.from_dict(none).unprofiled_ranges == {}
    assert Sidecar.from_dict(dict(dup, unprofiled_range_rounds=3)).unprofiled_ranges["a"].mean_us == 3.0
    # a capture whose warm-up timed no round, and says so with no range: nothing to skip
    assert sidecar_field_problems({"unprofiled_range_rounds": 0, "unprofiled_ranges": []}) == []
    assert measured_ranges is not None
    # a range longer than the rounds it was timed in (1e12 µs a round against a 2 ms round) is skipped, and named;
    # up to two rounds' worth (two threads recording one name) is kept
    long = {"unprofiled_round_ms": [2.0, 2.0, 2.2],
            "unprofiled_ranges": [{"name": "a", "mean_us": 1e12, "per_round": 1.0},
                                  {"name": "b", "mean_us": 1000.0, "per_round": 4.0},
                                  {"name": "c", "mean_us": 1000.0, "per_round": 3.9}]}
    assert sidecar_field_problems(long) == [
        'unprofiled_ranges[0] ("a": 1e+12 µs a round, more than 2 rounds of 2000 µs)']
    assert sorted(Sidecar.from_dict(long).unprofiled_ranges) == ["b", "c"]
    steps = {"unprofiled_step_ms": [0.5] * 3, "unprofiled_ranges": long["unprofiled_ranges"][1:]}
    assert [p.split(" ")[0] for p in sidecar_field_problems(steps)] == ["unprofiled_ranges[0]", "unprofiled_ranges[1]"]
    # with only the profiled positions' periods, those bound the ranges; an empty list of them is named
    same = {"unprofiled_same_rounds_ms": [2.0] * 8, "unprofiled_ranges": long["unprofiled_ranges"][:1]}
    assert [p.split(" ")[0] for p in sidecar_field_problems(same)] == ["unprofiled_ranges[0]"]
    assert sidecar_field_problems({"unprofiled_same_rounds_ms": []}) == ["unprofiled_same_rounds_ms (an empty list)"]
    # no unprofiled period at all (a hand-made sidecar): the profiled steps bound them, looser but not unbounded
    prof = {"profiled_step_ms": [2.0] * 3, "unprofiled_ranges": long["unprofiled_ranges"][:1]}
    assert [p.split(" ")[0] for p in sidecar_field_problems(prof)] == ["unprofiled_ranges[0]"]
    assert Sidecar.from_dict(prof).unprofiled_ranges == {}


HF = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "traces", "h100_loops",
                  "hf_generate.planted.trace.json.gz")


def test_a_blocking_range_that_hardly_waited_takes_its_measured_time():
    """hf_generate's planted range holds a blocking ``scores.cpu()`` (a DtoH copy and stream syncs) in a host-bound
    step: its blocking calls waited a few µs (the device had long finished), so its measured unprofiled time (the
    sidecar's mean) is used, less the replay's own waits; the same range measured longer than it was profiled is not
    (its waits grew without the profiler), nor with the waits over a tenth of its time."""
    tr = load_trace(HF)
    side = read_sidecar_checked(HF)[0]
    model = build_model(tr)
    cal = load_calibration(None)
    mean_us = {r["name"]: r["mean_us"] for r in side["unprofiled_ranges"]}["planted_logits_processor"]
    got = unprofiled_inputs(tr, model, cal, side)
    row = got["measured_ranges"]["planted_logits_processor"]
    h = tr.host
    m = (h["cat"] == "user_annotation").to_numpy() & (h["name"].astype(str) == "planted_logits_processor").to_numpy()
    us, ue = h["ts_us"].to_numpy()[m] - model.t0_us, h["end_us"].to_numpy()[m] - model.t0_us
    s, e = model.call_start_us, model.call_end_us
    inside = np.zeros(len(s), dtype=bool)
    for a, b in zip(us, ue):
        inside |= (s >= a) & (s < b)
    # by hand from the trace: the blocking calls inside the range and what they waited profiled (span − own cost)
    blocked = inside & model.blocking
    waited_prof = float(np.sum(e[blocked] - s[blocked] - model.cost_us[blocked]))
    assert int(blocked.sum()) >= len(us) and waited_prof < 0.1 * mean_us * len(us)
    assert row["applied"] and row["why"] is None and row["measured_us_per_round"] == pytest.approx(mean_us)
    assert 0 <= row["waits_us_per_round"] < 0.1 * mean_us
    # the range's replayed host time is its measured time less the replay's waits
    plain = unprofiled_inputs(tr, model, cal, {k: v for k, v in side.items() if k != "unprofiled_ranges"})
    t, _ = _range_time(tr, model, "planted_logits_processor", got["work_us"], got["cost_us"], plain["work_us"])
    assert t == pytest.approx((mean_us - row["waits_us_per_round"]) * len(us), rel=1e-6)
    longer = copy.deepcopy(side)
    for r in longer["unprofiled_ranges"]:
        if r["name"] == "planted_logits_processor":
            r["mean_us"] = float(np.mean(ue - us)) * 1.5
    row2 = unprofiled_inputs(tr, model, cal, longer)["measured_ranges"]["planted_logits_processor"]
    assert not row2["applied"] and "longer than profiled" in row2["why"]
    # a measured time a round no round of this loop can hold: that is the reason given, not the blocking calls
    huge = copy.deepcopy(side)
    for r in huge["unprofiled_ranges"]:
        if r["name"] == "planted_logits_processor":
            r["mean_us"] = 2e3 * float(np.median(side["unprofiled_step_ms"])) / r["per_round"]
    row3 = unprofiled_inputs(tr, model, cal, huge)["measured_ranges"]["planted_logits_processor"]
    assert not row3["applied"] and "exceeds the measured unprofiled round" in row3["why"]
    short = copy.deepcopy(side)
    for r in short["unprofiled_ranges"]:
        if r["name"] == "planted_logits_processor":
            r["mean_us"] = waited_prof / len(us) * 5  # the waits are a fifth of it
    row3 = unprofiled_inputs(tr, model, cal, short)["measured_ranges"]["planted_logits_processor"]
    assert not row3["applied"] and "blocks" in row3["why"]
