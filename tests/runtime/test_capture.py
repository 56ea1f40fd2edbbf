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
    """A decorated function that recurses enters one record_function object three times at once: one block, the
    outermost (the trace merges a name's nested occurrences too); blocks entered while inactive are not counted."""
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
    assert t.count == {"rec": 1}
    # the outermost block holds the three 0.3 ms spins
    assert 0.9e-3 <= t.total_s["rec"] < 0.9e-3 + 3e-3
    assert t.summary(2) == [{"name": "rec", "mean_us": 1e6 * t.total_s["rec"], "per_round": 0.5}]


def test_capture_times_only_its_thread_and_lets_torchscript_compile(tmp_path):
    """A range of the same name on a helper thread is not the loop's (not timed); a function scripted with
    torch.jit inside the warm-up compiles and runs (the wrappers keep the originals' signatures); a block left open
    when one timer goes leaks nothing into the next Capture."""
    import threading

    from gaptrace.rangetimes import RecordFunctionTimes

    def g(x: torch.Tensor) -> torch.Tensor:
        with torch.autograd.profiler.record_function("scripted"):
            y = x + 1
        return y

    stop = threading.Event()

    def helper():
        while not stop.is_set():
            with torch.profiler.record_function("work"):
                time.sleep(0.005)  # releases the GIL: the loop's thread is not slowed

    th = threading.Thread(target=helper, daemon=True)
    th.start()
    left_open = torch.profiler.record_function("left_open")
    path = str(tmp_path / "thr.json.gz")
    try:
        with Capture(path, warmup_steps=4, active_steps=1) as cap:
            sg = torch.jit.script(g)
            for i in range(4 + 1 + 1):
                with torch.profiler.record_function("work"):
                    _spin(0.0002)
                assert sg(torch.ones(2)).tolist() == [2.0, 2.0]
                if i == 3:
                    left_open.__enter__()  # the last warm-up step: entered while timed, left after the timer goes
                cap.step()
    finally:
        stop.set()
        th.join()
    left_open.__exit__(None, None, None)
    got = {r["name"]: r for r in read_sidecar(path)["unprofiled_ranges"]}
    assert got["work"]["per_round"] == 1.0 and got["work"]["mean_us"] < 2000  # the helper's 5 ms blocks left out
    assert "left_open" not in got
    t = RecordFunctionTimes()
    assert t.install()
    try:
        t.active = True
        left_open.__enter__()
        _spin(0.0001)
        left_open.__exit__(None, None, None)
    finally:
        t.uninstall()
    assert t.count == {"left_open": 1} and t.total_s["left_open"] < 0.05


def test_a_block_whose_exit_was_skipped_does_not_stop_its_name_being_timed():
    """A record_function entered by hand whose __exit__ an exception skipped stays open; after the next step
    boundary it is dropped and later blocks of its name are timed again (not held as nested in it)."""
    from gaptrace.rangetimes import RecordFunctionTimes

    t = RecordFunctionTimes()
    assert t.install()
    try:
        t.active = True
        torch.profiler.record_function("manual").__enter__()  # never exited
        t.new_step()
        with torch.profiler.record_function("manual"):  # one step later: still held as nested
            _spin(0.0001)
        t.new_step()
        for _ in range(3):
            with torch.profiler.record_function("manual"):
                _spin(0.0001)
            t.new_step()
    finally:
        t.uninstall()
    assert t.count == {"manual": 3}


def test_a_trace_output_named_like_a_sidecar_is_refused(tmp_path):
    """`-o X.gaptrace.json` would replace X.json.gz's sidecar with a trace (and write X.gaptrace.gaptrace.json):
    refused before anything runs, the existing sidecar untouched."""
    from gaptrace.capture import Capture

    side = tmp_path / "orig.gaptrace.json"
    side.write_text('{"gaptrace_sidecar": 1}')
    with pytest.raises(ValueError, match=r"cannot end with \.gaptrace\.json"):
        Capture(str(side))
    assert side.read_text() == '{"gaptrace_sidecar": 1}' and sorted(os.listdir(tmp_path)) == ["orig.gaptrace.json"]


def test_a_loop_stopped_after_the_active_steps_keeps_its_capture(tmp_path):
    """A loop ended by an exception once every active step was recorded (a server loop stopped with Ctrl-C) keeps its
    trace and sidecar; one stopped before the last active step writes nothing. commit_on_error=False (the runtime's
    capture, whose sidecar fields come later) writes nothing either way."""
    def run(path, steps, **kw):
        with pytest.raises(KeyboardInterrupt):
            with Capture(str(path), warmup_steps=2, active_steps=2, **kw) as cap:
                _loop(cap, steps)
                raise KeyboardInterrupt

    run(tmp_path / "done.json.gz", 2 + 1 + 2 + 3)
    assert sorted(os.listdir(tmp_path)) == ["done.gaptrace.json", "done.json.gz"]
    assert read_sidecar(str(tmp_path / "done.json.gz"))["profiled_step_ms"]
    run(tmp_path / "early.json.gz", 3)
    run(tmp_path / "kept.json.gz", 2 + 1 + 2 + 3, commit_on_error=False)
    assert sorted(os.listdir(tmp_path)) == ["done.gaptrace.json", "done.json.gz"]


def test_a_capture_fails_cleanly(tmp_path, monkeypatch):
    """A Capture is used once; a second profiler on the thread is refused; a sidecar that is no JSON leaves no
    temporary; a commit that fails after the block raised keeps the block's exception as the cause; a sidecar that
    cannot be renamed after its trace was takes the earlier sidecar with it (no new trace beside an old sidecar)."""
    def temporaries():
        return [n for n in os.listdir(tmp_path) if n.startswith(".tmp-")]

    cap = Capture(str(tmp_path / "a.json.gz"), warmup_steps=2, active_steps=2)
    with cap:
        _loop(cap, 5)
    with pytest.raises(RuntimeError, match="one capture"):
        cap.__enter__()
    # nested: the inner capture starts its profiler under the outer one's
    with pytest.raises(RuntimeError, match="another torch profiler"):
        with Capture(str(tmp_path / "outer.json.gz"), warmup_steps=0, active_steps=3) as outer:
            _loop(outer, 1)
            with Capture(str(tmp_path / "inner.json.gz"), warmup_steps=0, active_steps=2):
                pass
    # no JSON: the block's error, nothing of this capture written, no temporary
    with pytest.raises(TypeError):
        with Capture(str(tmp_path / "b.json.gz"), warmup_steps=2, active_steps=2) as cap:
            cap.extra[(1, 2)] = 1
            _loop(cap, 5)
    assert temporaries() == [] and sorted(os.listdir(tmp_path)) == ["a.gaptrace.json", "a.json.gz"]
    # the commit fails after a Ctrl-C: the OSError is raised from the KeyboardInterrupt
    real = os.replace
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    with pytest.raises(OSError) as ei:
        with Capture(str(tmp_path / "c.json.gz"), warmup_steps=2, active_steps=2) as cap:
            _loop(cap, 5)
            raise KeyboardInterrupt
    assert isinstance(ei.value.__cause__, KeyboardInterrupt) and temporaries() == []
    # the trace renamed, the sidecar not: the earlier sidecar goes too, and the error says so
    calls = []
    monkeypatch.setattr(os, "replace", lambda a, b: (calls.append(b), real(a, b) if len(calls) == 1 else
                                                     (_ for _ in ()).throw(OSError(28, "No space left on device"))))
    with pytest.raises(OSError, match="written without its sidecar"):
        with Capture(str(tmp_path / "a.json.gz"), warmup_steps=2, active_steps=2) as cap:
            _loop(cap, 5)
    assert temporaries() == [] and sorted(os.listdir(tmp_path)) == ["a.json.gz"]
