"""Every shipped trace under fixtures/traces, with its capture sidecar where it has one, analyses to a result
(analyses/summary.py): the JSON has no NaN or infinity, and no finding saves more than the predicted unprofiled
round or less than nothing (docs/DESIGN.md 5.10), and no step's launch-paced share exceeds its host time; every
shipped sidecar passes the checks that ignore another capture's (DESIGN.md 4.9). A crash here is a crash on a trace we give users."""
from __future__ import annotations

import glob
import json
import os

import numpy as np
import pytest

from gaptrace import load_trace
from gaptrace.analyses.summary import summarize
from gaptrace.sidecar import read_sidecar_checked, sidecar_steps_problem, sidecar_window_problem

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRACES = sorted(glob.glob(os.path.join(ROOT, "fixtures", "traces", "**", "*.json.gz"), recursive=True))

pytestmark = pytest.mark.slow  # ~60 traces, ~15 s here


@pytest.mark.parametrize("path", TRACES, ids=[os.path.relpath(p, ROOT) for p in TRACES])
def test_shipped_trace_analyses(path):
    tr = load_trace(path)
    side, _why = read_sidecar_checked(path)
    if side is not None:  # every shipped sidecar is its trace's: the other-capture checks pass (gaptrace/sidecar.py)
        assert sidecar_steps_problem(side, tr, path) is None and sidecar_window_problem(side, tr, path) is None
        ps = side.get("profiled_step_ms")
        steps = tr.host.loc[tr.host["name"].astype(str).str.fullmatch(r"ProfilerStep#\d+"), "dur_us"]
        if ps and len(steps):  # the two timings of the profiled steps agree within 12% (2% but on 0.2 ms steps)
            assert abs(np.median(ps) * 1e3 / np.median(steps) - 1) < 0.12, (np.median(ps), np.median(steps))
    res = summarize(tr, sidecar=side).to_json()
    json.dumps(res, allow_nan=False)
    # a share of the step's host time is at most all of it
    v = res.get("verdict") or {}
    for row in [v.get("overall") or {}] + list(v.get("steps") or []):
        assert row.get("launch_paced_share") is None or 0.0 <= row["launch_paced_share"] <= 1.0 + 1e-12
    pred = (res.get("whatif") or {}).get("predicted_unprofiled_round_us")
    for f in res["findings"]:
        s = f.get("saving_us")
        if s is not None and pred:
            assert 0.0 <= s <= pred * (1 + 1e-9), (f["kind"], f.get("cause"), s, pred)


def test_the_set_is_not_empty():
    assert len(TRACES) >= 50
