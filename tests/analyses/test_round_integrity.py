"""Rounds a trace cannot hold: periods across profiler windows, copies of one round range.

Traces of several profiler windows (Kineto's ``cat: "Trace"`` span per window, :attr:`Trace.windows`): a period
from a round in one window to a round in the next spans a stretch the profiler did not record, and no figure may
count it (docs/DESIGN.md "Rounds"). The two-window traces here are real H200 captures written twice, the second
copy shifted past the first by a pause, its ids moved out of the first copy's range (what joining two windows'
files gives)."""
from __future__ import annotations

import copy
import gzip
import json
import os

import numpy as np
import pandas as pd
import pytest

from gaptrace.analyses import whatif as W
from gaptrace.analyses.rounds import rounds
from gaptrace.analyses.steps import find_steps
from gaptrace.loader import load_trace

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "traces")
LOOP = os.path.join(ROOT, "h200_loops", "graph_readback.planted.trace.json.gz")
SYNC = os.path.join(ROOT, "h200_fused", "h200_bench_sync_bs8_B12_fused.json.gz")
PAUSE_US = 50_000.0
ID_KEYS = ("correlation", "External id", "Python id", "Python parent id", "Ev Idx")


def _two_windows(src: str, dst, pause_us: float = PAUSE_US) -> list[dict]:
    """Write ``src``'s events twice to ``dst``: the copy shifted by its span + ``pause_us``, its ids moved."""
    with gzip.open(src, "rt") as f:
        d = json.load(f)
    ev = d["traceEvents"]
    timed = [e for e in ev if "ts" in e]
    shift = max(float(e["ts"]) + float(e.get("dur", 0)) for e in timed) - min(float(e["ts"]) for e in timed) + pause_us
    more = []
    for e in timed:
        c = copy.deepcopy(e)
        c["ts"] = float(e["ts"]) + shift
        a = c.get("args")
        for k in ID_KEYS:
            if isinstance(a, dict) and isinstance(a.get(k), int) and a[k] > 0:
                a[k] += 10 ** 8
        if isinstance(c.get("id"), int):
            c["id"] += 10 ** 8
        more.append(c)
    d["traceEvents"] = ev + more
    with gzip.open(dst, "wt") as f:
        json.dump(d, f)
    return ev


def test_the_loader_keeps_kineto_window_spans():
    ev = json.load(gzip.open(LOOP, "rt"))["traceEvents"]
    spans = [e for e in ev if e.get("cat") == "Trace" and e.get("ph") == "X"]
    tr = load_trace(LOOP)
    assert len(tr.windows) == len(spans) == 1
    assert tr.windows["ts_us"].iloc[0] == float(spans[0]["ts"])
    assert tr.windows["dur_us"].iloc[0] == pytest.approx(float(spans[0]["dur"]))
    assert str(tr.windows["name"].iloc[0]) == spans[0]["name"]
    assert not tr.host["cat"].astype(str).eq("Trace").any()  # a window is no host work


def test_window_joins_by_hand():
    tr = load_trace(LOOP)
    tr.windows = pd.DataFrame({"rank": [0, 0], "name": ["a", "b"], "ts_us": [100.0, 500.0],
                               "dur_us": [200.0, 100.0], "end_us": [300.0, 600.0]})
    starts = np.array([110.0, 200.0, 290.0, 510.0, 590.0, 700.0])
    # in window a, a, a | b, b | none
    assert tr.window_joins(starts).tolist() == [False, False, True, False, True]
    assert tr.window_joins(starts, rank=1).tolist() == [False] * 5  # rank 1 has no windows
    tr.windows = tr.windows.iloc[:1]
    assert tr.window_joins(starts).tolist() == [False] * 5  # one window: nothing to join


def test_rounds_leave_the_join_out(tmp_path):
    out = tmp_path / "two.json.gz"
    _two_windows(SYNC, out)
    one, two = rounds(load_trace(SYNC)), rounds(load_trace(str(out)))
    n = len(one.table)
    assert len(two.table) == 2 * n + 1 and two.summary["window_joins"] == 1
    join = two.table[two.table["window_join"]]
    assert join["round"].tolist() == [n] and join["t_round_us"].iloc[0] > PAUSE_US
    # every figure is the one window's: the same periods twice, the join in none of them
    for k in ("t_round_us", "t_gpu_us", "t_host_us", "t_serial_us", "blocked_us"):
        assert two.summary[k] == pytest.approx(one.summary[k], rel=1e-9), k
    assert two.summary["rounds_steady"] == 2 * one.summary["rounds_steady"]
    assert two.summary["verdict"] == one.summary["verdict"]


def test_whatif_and_steps_leave_the_join_out(tmp_path):
    out = tmp_path / "two.json.gz"
    _two_windows(LOOP, out)
    one = W.whatif(load_trace(LOOP)).data
    tr2 = load_trace(str(out))
    two = W.whatif(tr2, [W.Change("planted_readback")]).data
    base = W.whatif(load_trace(LOOP), [W.Change("planted_readback")]).data
    assert two["window_joins"] == 1 and two["rounds"] == 2 * one["rounds"]
    # the measured periods are the one window's, twice: no 50 ms period between them
    np.testing.assert_allclose(two["periods_profiled_us"], one["periods_profiled_us"] * 2)
    assert max(two["periods_profiled_us"]) < PAUSE_US
    # the second window's first round starts behind the first window's last (its queue): within 1%
    np.testing.assert_allclose(two["periods_before_us"], base["periods_before_us"] * 2, rtol=0.01)
    assert two["saving_us"] == pytest.approx(base["saving_us"], rel=0.01)
    assert two["one_off_saving_us"] == pytest.approx(0.0, abs=1e-6)
    assert two["occupancy_before"] == pytest.approx(base["occupancy_before"], rel=1e-3)
    st = find_steps(tr2)
    p = st.table["period_us"].to_numpy()
    assert np.isnan(p).sum() == 2 and np.nanmax(p) < PAUSE_US  # the join and the last step


def test_a_round_range_written_twice_is_one_round(tmp_path):
    """One ``round`` event of a real capture copied into the trace again: before, it made a 0 µs period (a replay
    error of NaN) and one round more; now it is one round, and rounds, steps and whatif say so."""
    with gzip.open(SYNC, "rt") as f:
        d = json.load(f)
    rr = [e for e in d["traceEvents"] if e.get("cat") == "user_annotation" and e.get("name") == "round"]
    d["traceEvents"].append(copy.deepcopy(rr[3]))
    out = tmp_path / "dup.json.gz"
    with gzip.open(out, "wt") as f:
        json.dump(d, f)
    one, tr = load_trace(SYNC), load_trace(str(out))
    r1, r2 = rounds(one), rounds(tr)
    assert r2.summary["duplicate_rounds"] == 1 and r1.summary["duplicate_rounds"] == 0
    pd.testing.assert_frame_equal(r2.table, r1.table)
    assert len(find_steps(tr).table) == len(find_steps(one).table) == len(rr)
    w1, w2 = W.whatif(one).data, W.whatif(tr).data
    assert w2["rounds"] == w1["rounds"] == len(rr) - 1
    assert w2["replay_error"] == pytest.approx(w1["replay_error"]) and np.isfinite(w2["replay_error"])
    assert min(w2["periods_profiled_us"]) > 0
    assert any("written twice" in x for x in w2["warnings"])
    assert not any("written twice" in x for x in w1["warnings"])
