"""maintainer/trim_trace.py: a trace cut to whole rounds keeps those rounds' profiler steps, every kept launch with
its device work, and the sidecar's per-round fields cut to match; ``--round-name`` takes another annotation (a loop's
``step`` range, or the profiler's own ``ProfilerStep#N``) as the round."""
from __future__ import annotations

import gzip
import importlib.util
import json
import os

import pytest

REPO = os.path.join(os.path.dirname(__file__), "..", "..")
LOOPS = os.path.join(REPO, "fixtures", "traces", "h200_loops")


def _tool():
    spec = importlib.util.spec_from_file_location("trim_trace", os.path.join(REPO, "maintainer", "trim_trace.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _x(name, ts, dur, cat="user_annotation", **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1, "args": args}


def _loop_trace(with_step_range: bool) -> dict:
    """Four profiler steps of 90 µs, 10 µs apart; in each a ``step`` range (when asked), one launch and its kernel."""
    ev = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "host"}}]
    for i in range(4):
        t = 1000.0 + 100.0 * i
        ev.append(_x(f"ProfilerStep#{10 + i}", t, 90.0))
        if with_step_range:
            ev.append(_x("step", t + 5, 80.0))
        ev.append(_x("cudaLaunchKernel", t + 10, 5.0, cat="cuda_runtime", correlation=i + 1))
        ev.append({**_x(f"k{i}", t + 20, 30.0, cat="kernel", correlation=i + 1), "pid": 0, "tid": 7})
    return {"schemaVersion": 1, "traceEvents": ev}


def _write(tmp_path, trace, side=None):
    p = tmp_path / "loop.trace.json.gz"
    p.write_bytes(gzip.compress(json.dumps(trace).encode()))
    if side is not None:
        (tmp_path / "loop.trace.gaptrace.json").write_text(json.dumps(side))
    return str(p)


def _read(path):
    with gzip.open(path, "rt") as f:
        return json.load(f)


@pytest.mark.parametrize("with_step_range,round_name", [(True, "step"), (False, "ProfilerStep")])
def test_round_name_cuts_to_whole_steps(tmp_path, with_step_range, round_name):
    side = {"gaptrace_sidecar": 1, "active_steps": 4, "profiled_step_ms": [0.1, 0.2, 0.3, 0.4],
            "unprofiled_step_ms": [0.05] * 6}
    src = _write(tmp_path, _loop_trace(with_step_range), side)
    out = str(tmp_path / "cut.trace.json.gz")
    assert _tool().main([src, out, "--rounds", "1:2", "--round-name", round_name]) == 0
    ev = _read(out)["traceEvents"]
    steps = sorted(e["name"] for e in ev if str(e.get("name", "")).startswith("ProfilerStep#"))
    assert steps == ["ProfilerStep#11", "ProfilerStep#12"]
    assert sorted(e["name"] for e in ev if e.get("cat") == "kernel") == ["k1", "k2"]
    assert sorted(e["args"]["correlation"] for e in ev if e.get("cat") == "cuda_runtime") == [2, 3]
    assert [e for e in ev if e.get("ph") == "M"]  # metadata kept
    if with_step_range:
        assert sum(e["name"] == "step" for e in ev) == 2
    cut = json.loads((tmp_path / "cut.trace.gaptrace.json").read_text())
    assert cut["active_steps"] == 2 and cut["profiled_step_ms"] == [0.2, 0.3]
    assert cut["unprofiled_step_ms"] == side["unprofiled_step_ms"] and cut["trace"] == "cut.trace.json.gz"


def test_a_round_name_the_trace_lacks_is_one_line_exit_2(tmp_path, capsys):
    src = _write(tmp_path, _loop_trace(False))
    out = tmp_path / "cut.trace.json.gz"
    assert _tool().main([src, str(out), "--rounds", "0:0", "--round-name", "step"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "trim_trace: no 'step' annotations in the trace" and not out.exists()


def test_prefix_match_needs_the_step_number():
    tool = _tool()
    assert tool.is_round(_x("ProfilerStep#3", 0, 1), "ProfilerStep")
    assert not tool.is_round(_x("ProfilerStepX", 0, 1), "ProfilerStep")
    assert not tool.is_round(_x("ProfilerStep#3", 0, 1, cat="cpu_op"), "ProfilerStep")
    assert tool.is_round(_x("round", 0, 1), "round") and not tool.is_round(_x("round#x", 0, 1), "round")


def test_a_shipped_loop_capture_cut_to_one_step(tmp_path):
    """On a real capture: one ``step`` kept; every kept kernel's launch is kept and vice versa (correlation ids)."""
    src = os.path.join(LOOPS, "launch_bound.planted.trace.json.gz")
    out = str(tmp_path / "one.trace.json.gz")
    assert _tool().main([src, out, "--rounds", "1:1", "--round-name", "step"]) == 0
    ev = _read(out)["traceEvents"]
    assert sum(e.get("name") == "step" and e.get("cat") == "user_annotation" for e in ev) == 1
    assert sum(str(e.get("name", "")).startswith("ProfilerStep#") for e in ev) == 1
    kern = {e["args"]["correlation"] for e in ev if e.get("cat") == "kernel"}
    launch = {e["args"]["correlation"] for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver")
              and "correlation" in (e.get("args") or {})}
    assert kern and kern <= launch
    side = json.loads((tmp_path / "one.trace.gaptrace.json").read_text())
    with open(os.path.join(LOOPS, "launch_bound.planted.trace.gaptrace.json")) as f:
        full = json.load(f)
    assert side["profiled_step_ms"] == full["profiled_step_ms"][1:2] and side["active_steps"] == 1
