"""The captures keep enough unprofiled rounds to be the replay model's reference (docs/DESIGN.md "The replay model" "Fitted to the
capture's own unprofiled rounds"): at least 30 by default, in the generic :class:`gaptrace.capture.Capture` and in
the runtime's ``capture``; on the CPU."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gaptrace.capture import DEFAULT_WARMUP_STEPS, MIN_UNPROFILED_STEPS, Capture, sidecar_path  # noqa: E402
from gaptrace.loader import load_trace  # noqa: E402
from runtime.capture_run import UNPROFILED_ROUNDS, capture_decode, unprofiled_block  # noqa: E402


def test_generic_capture_keeps_30_unprofiled_steps_by_default(tmp_path):
    path = str(tmp_path / "loop.json.gz")
    x = torch.randn(32, 32)
    ends = []
    import time

    with Capture(path, active_steps=3) as cap:
        for _ in range(DEFAULT_WARMUP_STEPS + 1 + 3):
            with torch.profiler.record_function("step"):
                x = torch.tanh(x @ x)
            ends.append(time.perf_counter())
            cap.step()
    with open(sidecar_path(path)) as f:
        side = json.load(f)
    assert MIN_UNPROFILED_STEPS == 30 and DEFAULT_WARMUP_STEPS == 31
    assert len(side["unprofiled_step_ms"]) == side["unprofiled_steps"] == 30
    assert side["warmup_steps"] == 31
    # the kept periods are the warm-up steps 1..30 (step 0 includes the set-up): the intervals between the
    # step() calls, timed here just before each call
    here = np.diff(ends)[:30] * 1e3
    np.testing.assert_allclose(side["unprofiled_step_ms"], here, rtol=0, atol=0.5)
    tr = load_trace(path)
    assert int((tr.host["name"].astype(str) == "step").sum()) == 3  # only the active steps are profiled


def test_unprofiled_block_rule():
    p = [float(i) for i in range(39)]
    assert unprofiled_block(p) == p[9:] and len(unprofiled_block(p)) == UNPROFILED_ROUNDS == 30
    assert unprofiled_block(p[:7]) == p[1:7]  # a short warm-up: all but its first quarter
    assert unprofiled_block(p * 3) == (p * 3)[-30:]
    assert unprofiled_block([]) == []


@pytest.mark.slow
def test_runtime_capture_keeps_30_unprofiled_rounds(tmp_path):
    from runtime.session import build_setup

    setup = build_setup("tiny", device="cpu", batch_size=2)
    out = str(tmp_path / "rt.json.gz")
    side = capture_decode(setup, ["hello there", "a b c"], out, 40, 2, inputs=())
    assert len(side["unprofiled_round_ms"]) == 30
    with open(sidecar_path(out)) as f:
        raw = json.load(f)
    # the kept rounds are the last 30 of the 39 timed warm-up rounds
    assert raw["unprofiled_round_ms"] == raw["unprofiled_step_ms"][-30:] and len(raw["unprofiled_step_ms"]) == 39
    assert os.path.exists(out)


@pytest.mark.slow
def test_runtime_capture_times_the_device_right_after_the_profiled_rounds(tmp_path, monkeypatch):
    """The graph replays are timed on the device in the DEVICE_TIMED_ROUNDS rounds right after the trace is written
    (not in the kept unprofiled periods, not in the profiled rounds), and the decode stops after them."""
    from runtime.capture_run import DEVICE_TIMED_ROUNDS
    from runtime.engine.hooks import RoundEvent
    from runtime.session import build_setup

    from runtime.capture_run import ReferenceHooks

    calls, seen, refs = [], [], []
    monkeypatch.setattr(RoundEvent, "time_graph_device", lambda self, on: calls.append((self.index, on)))
    init = ReferenceHooks.__init__
    monkeypatch.setattr(ReferenceHooks, "__init__", lambda self, *a: (init(self, *a), refs.append(self))[0])
    setup = build_setup("tiny", device="cpu", batch_size=1)
    out = str(tmp_path / "rt.json.gz")
    W, R = 8, 2
    side = capture_decode(setup, ["hello there"], out, W, R, inputs=(), on_round=seen.append)
    # the profiler's warm-up step is hook W + 1, its active steps W + 2 .. W + 1 + R: the trace is written at the
    # last of them, so rounds W + R + 2 .. W + R + 1 + DEVICE_TIMED_ROUNDS are timed
    assert DEVICE_TIMED_ROUNDS == 6
    assert calls == [(W + 1 + R, True), (W + 1 + R + DEVICE_TIMED_ROUNDS, False)]
    # then every request finishes at its next read: the decode ends a round later, cleanly, and the reference decode
    # runs after it (not seen by the capture's hooks)
    assert seen == list(range(1, W + 1 + R + DEVICE_TIMED_ROUNDS + 2))
    assert len(side["unprofiled_step_ms"]) == W - 1 and len(side["profiled_step_ms"]) == R
    # the reference decode after the capture timed the profiled rounds' own positions, unprofiled
    assert len(side["unprofiled_same_rounds_ms"]) == R and min(side["unprofiled_same_rounds_ms"]) > 0
    # at the same positions: the reference decode accepted the same tokens in every round up to the profiled ones
    (ref,) = refs
    assert [r["accepted"] for r in side["rounds"]] == ref.round_tau[W + 1: W + 1 + R]
    assert len(ref.round_tau) >= W + 1 + R
    steps = load_trace(out).host["name"].astype(str).str.startswith("ProfilerStep#")
    assert int(steps.sum()) == R




def test_reference_periods_are_the_profiled_rounds():
    """Round i's period runs from hook i − 1 to hook i; the profiled rounds are hooks W + 2 .. W + 1 + R (the
    profiler's warm-up step is W + 1), as gaptrace.capture.Capture times its steps."""
    from runtime.capture_run import reference_periods_ms

    W, R = 8, 3
    hook_s = list(np.cumsum([0.001 * (k + 1) for k in range(W + R + 4)]))  # hook k + 1 at hook_s[k]; round k lasts k ms
    assert reference_periods_ms(hook_s, W, R) == pytest.approx([W + 2, W + 3, W + 4])
    assert reference_periods_ms(hook_s[:W + R], W, R) == []  # the decode ended before the last profiled round
    assert reference_periods_ms(hook_s[:W + R + 1], W, R) == pytest.approx([W + 2, W + 3, W + 4])
