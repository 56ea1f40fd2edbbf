"""The typed capture sidecar (gaptrace.sidecar.Sidecar) against the raw JSON of the shipped sidecars, and the
skipping rules on hostile values: what it keeps is exactly what sidecar_field_problems does not name."""
import glob
import json
import math
import os
import statistics

import pytest

from gaptrace.sidecar import Sidecar, as_sidecar, sidecar_field_problems

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SHIPPED = sorted(glob.glob(os.path.join(ROOT, "fixtures", "traces", "h200_*", "*.gaptrace.json")))


@pytest.mark.parametrize("path", SHIPPED[:6], ids=os.path.basename)
def test_shipped_sidecar_fields(path):
    raw = json.load(open(path))
    side = Sidecar.from_dict(raw)
    assert sidecar_field_problems(raw) == []
    assert side.raw is raw and side.config == raw["config"] and side.analysis_window == raw["analysis_window"]
    assert list(side.round_taus) == [float(r["tau"]) for r in raw["rounds"]]
    assert list(side.round_record_taus) == [float(r["tau"]) for r in raw["rounds"]]
    usable = [g for g in raw["graphs"] if g.get("unprofiled_launch_us") is not None]
    assert [(g.name, g.nodes, g.unprofiled_launch_us) for g in side.graphs] == \
        [(g["name"], float(g["nodes"]), float(g["unprofiled_launch_us"])) for g in usable]
    assert side.unprofiled_launch_us() == ({int(g["nodes"]): float(g["unprofiled_launch_us"]) for g in usable} or None)
    u = raw["unprofiled_round_ms"]
    assert side.unprofiled_round_ms == pytest.approx(statistics.median(u) if isinstance(u, list) else u, rel=1e-15)


def test_hostile_values_are_dropped_as_named():
    raw = {"analysis_window": "round", "config": [1],
           "rounds": [{"tau": 2.5}, {"tau": 1e308}, {"tau": "x"}, {}, 3.0, True, {"tau": 0}],
           "graphs": [{"name": "a", "nodes": 10, "unprofiled_launch_us": 4.0}, {"nodes": 0, "unprofiled_launch_us": 1},
                      "x", {"name": "n", "nodes": 5, "unprofiled_launch_us": None},
                      {"name": "b", "nodes": 10, "unprofiled_launch_us": 6.0}],
           "unprofiled_round_ms": [1.0, "x", -2, 3.0, 1e300]}
    side = Sidecar.from_dict(raw)
    named = sidecar_field_problems(raw)
    assert [f"rounds[{i}].tau (missing, or not 0 or a number from 1e-06 to 1e+06)" for i in (1, 2, 3, 5)] == \
        [p for p in named if p.startswith("rounds")]
    taus = side.round_taus
    assert taus[0] == 2.5 and taus[4] == 3.0 and taus[6] == 0.0 and all(math.isnan(taus[i]) for i in (1, 2, 3, 5))
    assert side.round_record_taus == (2.5, None, None, None, 0.0)  # the object rounds only (the report's τ)
    assert [g.name for g in side.graphs] == ["a", "b"] and side.unprofiled_launch_us() == {10: 6.0}
    assert side.unprofiled_round_ms == 2.0  # median of the usable 1.0 and 3.0
    assert side.config == {}  # not an object
    assert as_sidecar(side) is side and as_sidecar([1]) is None and as_sidecar(None) is None


def test_absent_or_malformed_lists():
    side = Sidecar.from_dict({"rounds": {"a": 1}, "graphs": "g", "unprofiled_round_ms": []})
    assert side.round_taus is None and side.round_record_taus == () and side.graphs == ()
    assert side.unprofiled_round_ms is None and side.unprofiled_launch_us() is None and side.analysis_window is None


@pytest.mark.parametrize("version, named", [(1, False), (999, True), ("one", True), (True, True), (None, False)])
def test_an_unknown_format_version_is_named(version, named):
    """A sidecar whose gaptrace_sidecar version this code does not write is read, but the warning names it."""
    raw = {"gaptrace_sidecar": version} if version is not None else {}
    bad = sidecar_field_problems(raw)
    assert bool(bad) == named and all(b.startswith("gaptrace_sidecar (") for b in bad)


def test_a_round_of_a_picosecond_is_no_period():
    """unprofiled_round_ms of 1e-9 ms (a corrupt sidecar) is skipped and named; 1 µs and more is a period."""
    assert as_sidecar({"unprofiled_round_ms": [1e-9] * 30}).unprofiled_round_ms is None
    assert sidecar_field_problems({"unprofiled_round_ms": 1e-9}) == ["unprofiled_round_ms (not a period from 0.001 "
                                                                      "to 1e+12 ms)"]
    assert as_sidecar({"unprofiled_round_ms": [0.001, 4.5, 4.7]}).unprofiled_round_ms == 4.5
    assert sidecar_field_problems({"unprofiled_step_ms": [1.0, 1e-6]}) == ["unprofiled_step_ms[1] (not a period "
                                                                        "from 0.001 to 1e+12 ms)"]
