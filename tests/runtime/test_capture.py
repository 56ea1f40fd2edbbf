"""The capture context manager on the CPU: trace + sidecar written atomically, steady steps only."""
import json
import os

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
