"""The capture context manager on the CPU: trace + sidecar written atomically, steady steps only."""
import json
import os
import time

import pytest

torch = pytest.importorskip("torch")

from gaptrace.capture import Capture, read_sidecar, sidecar_path  # noqa: E402
from gaptrace.loader import load_trace_reference  # noqa: E402


def _loop(cap, n):
    x = torch.randn(64, 64)
    for i in range(n):
        with torch.profiler.record_function("round"):
            x = torch.tanh(x @ x)
        cap.step()


def test_capture_writes_trace_and_sidecar(tmp_path):
    path = str(tmp_path / "run.json.gz")
    with Capture(path, warmup_steps=3, active_steps=4, config={"what": "unit"}) as cap:
        _loop(cap, 12)
    assert os.path.exists(path)
    assert sidecar_path(path) == str(tmp_path / "run.gaptrace.json")
    side = read_sidecar(path)
    assert side["config"] == {"what": "unit"}
    assert side["active_steps"] == 4
    assert len(side["unprofiled_step_ms"]) == 2  # steps 1..2 (step 0 includes set-up)
    assert len(side["profiled_step_ms"]) == 4
    trace = load_trace_reference(path)
    rounds = trace.host[trace.host["name"] == "round"]
    # exactly the active steps are in the trace (the profiler warm-up step is discarded)
    assert len(rounds) == 4
    assert any("no GPU events" in w for w in trace.warnings)
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp-")]


def test_capture_too_few_steps_writes_nothing(tmp_path):
    path = str(tmp_path / "short.json.gz")
    with pytest.raises(RuntimeError, match="nothing was written"):
        with Capture(path, warmup_steps=3, active_steps=4) as cap:
            _loop(cap, 5)
    assert os.listdir(tmp_path) == []


def test_capture_bad_arguments(tmp_path):
    with pytest.raises(ValueError):
        Capture(str(tmp_path / "x.json.gz"), warmup_steps=0, active_steps=0)
    with pytest.raises(ValueError, match="does not exist"):
        Capture(str(tmp_path / "nope" / "x.json.gz"))


def _spin(seconds):
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        pass


@torch.profiler.record_function("decorated")
def _decorated():
    _spin(0.0005)


def test_capture_times_record_function_ranges_unprofiled(tmp_path):
    """Every record_function block of the kept warm-up steps is timed on the host clock (sidecar unprofiled_ranges):
    a 2 ms range once a step, a 0.5 ms decorated one twice, nested in the step's range; a range that only runs in the
    profiled steps is not timed; the class's methods are the originals again afterwards."""
    from torch.autograd.profiler import record_function

    enter, exit_ = record_function.__enter__, record_function.__exit__
    path = str(tmp_path / "ranged.json.gz")
    with Capture(path, warmup_steps=5, active_steps=2) as cap:
        for i in range(5 + 1 + 2):
            with torch.profiler.record_function("step"):
                with torch.profiler.record_function("slow"):
                    _spin(0.002)
                _decorated()
                _decorated()
                if i >= 5:
                    with torch.profiler.record_function("late"):
                        _spin(0.0001)
            cap.step()
    assert record_function.__enter__ is enter and record_function.__exit__ is exit_
    side = read_sidecar(path)
    assert side["unprofiled_range_rounds"] == 4  # steps 1..4 (step 0's period is not kept either)
    got = {r["name"]: r for r in side["unprofiled_ranges"]}
    assert set(got) == {"step", "slow", "decorated"}
    assert got["slow"]["per_round"] == 1.0 and got["decorated"]["per_round"] == 2.0 and got["step"]["per_round"] == 1.0
    assert 2000 <= got["slow"]["mean_us"] < 2000 + 1500
    assert 500 <= got["decorated"]["mean_us"] < 500 + 1000
    # the step range holds the others: at least their sum, and inside the step period
    assert got["step"]["mean_us"] >= got["slow"]["mean_us"] + 2 * got["decorated"]["mean_us"]
    assert got["step"]["mean_us"] <= 1e3 * max(side["unprofiled_step_ms"])


def test_capture_range_timing_off_and_nested(tmp_path):
    """time_ranges=False writes no unprofiled_ranges; a Capture inside another one times nothing of its own (one
    timer at a time), and the outer one's figures stand."""
    path = str(tmp_path / "off.json.gz")
    with Capture(path, warmup_steps=3, active_steps=1, time_ranges=False) as cap:
        _loop(cap, 5)
    assert "unprofiled_ranges" not in read_sidecar(path)
    outer = Capture(str(tmp_path / "outer.json.gz"), warmup_steps=3, active_steps=1)
    inner = Capture(str(tmp_path / "inner.json.gz"), warmup_steps=3, active_steps=1)
    with pytest.raises(RuntimeError, match="nothing was written"):  # both stop inside their warm-up
        with outer:
            with pytest.raises(RuntimeError, match="nothing was written"):
                with inner:
                    assert inner._ranges_installed is False and outer._ranges_installed is True
                    for _ in range(2):
                        with torch.profiler.record_function("round"):
                            _spin(0.0002)
                        outer.step()
                        inner.step()
            assert outer._ranges.count["round"] == 1  # the second step's range (the first step's is not kept)
    from torch.autograd.profiler import record_function
    assert not hasattr(record_function, "_gaptrace_range_timer")
    assert set(os.listdir(tmp_path)) == {"off.json.gz", "off.gaptrace.json"}


def test_record_function_times_recursion_and_inactive():
    """A decorated function that recurses enters one record_function object three times at once: three blocks,
    the outer ones holding the inner ones; blocks entered while inactive are not counted."""
    from gaptrace.rangetimes import RecordFunctionTimes

    @torch.profiler.record_function("rec")
    def rec(depth):
        _spin(0.0003)
        if depth:
            rec(depth - 1)

    t = RecordFunctionTimes()
    assert t.install()
    try:
        rec(2)  # inactive: not counted
        t.active = True
        rec(2)
    finally:
        t.uninstall()
    assert t.count == {"rec": 3}
    # inclusive times: 0.9 + 0.6 + 0.3 ms = 1.8 ms at least in all
    assert 1.8e-3 <= t.total_s["rec"] < 1.8e-3 + 3e-3
    assert t.summary(2) == [{"name": "rec", "mean_us": 1e6 * t.total_s["rec"] / 3, "per_round": 1.5}]
