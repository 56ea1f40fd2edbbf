"""Round model on the probe trace (6 annotated rounds), checked against a plain recomputation."""
import gzip
import json

import numpy as np
import pytest

import gaptrace
from gaptrace.analyses.rounds import rounds

PROBE = "fixtures/traces/h200_graph_launch_probe.json.gz"


@pytest.fixture(scope="module")
def trace():
    return gaptrace.load_trace(PROBE)


def test_round_periods_and_gpu_time_by_hand(trace):
    r = rounds(trace, "round", sidecar={"rounds": [{"tau": 2.0}] * 6})
    doc = json.load(gzip.open(PROBE))
    ev = doc["traceEvents"]
    starts = sorted(e["ts"] for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("round_"))
    assert len(r.table) == len(starts) - 1 == 5
    busy = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    for i in range(5):
        a, b = starts[i], starts[i + 1]
        # plain union of busy intervals clipped to the period
        clipped = sorted((max(s, a), min(e, b)) for s, e in busy if e > a and s < b)
        total, cs, ce = 0.0, None, None
        for s, e in clipped:
            if ce is None or s > ce:
                total += (ce - cs) if ce is not None else 0.0
                cs, ce = s, e
            else:
                ce = max(ce, e)
        total += (ce - cs) if ce is not None else 0.0
        row = r.table.iloc[i]
        assert row["t_round_us"] == pytest.approx(b - a, abs=1e-3)
        assert row["t_gpu_us"] == pytest.approx(total, abs=1e-3)
        assert row["t_gpu_us"] + row["t_serial_us"] == pytest.approx(row["t_round_us"], rel=1e-12)
        assert row["tpot_us"] == pytest.approx(row["t_round_us"] / 2.0)
    # every steady round replays the 7 graphs once: Σ N = 25 + 50 + ... + 1600 = 3175
    assert list(r.table["launch_nodes"]) == [3175.0] * 5
    # each round holds the .cpu() copy that blocked ~4 ms; Thost excludes it
    assert (r.table["blocked_us"].iloc[1:] > 2000).all()  # round 0 paid lazy module loading instead
    assert r.summary["bound"] == "host"
    assert r.summary["verdict"] == "serialized"  # the .cpu() blocks ~4 ms of every ~11 ms round


def test_no_rounds_returns_none(trace):
    assert rounds(trace, "no_such_range") is None
