"""Outputs of report and capture: inputs (sidecars, prompts) never overwritten, both capture outputs checked before
the decode, failed writes leave no temporaries and give one line, overwriting keeps permissions, bad implicit
sidecars said to be ignored."""
from __future__ import annotations

import errno
import gzip
import json
import math
import os
import shutil
import stat
import subprocess
import sys

import pytest

import gaptrace.outputs as outputs
from gaptrace.outputs import resolve_output, write_text_atomic

HERE = os.path.dirname(os.path.abspath(__file__))
PROBE = os.path.join(HERE, "..", "..", "fixtures", "traces", "h200_graph_launch_probe.json.gz")


def _gaptrace(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gaptrace.cli", *args], capture_output=True, text=True, cwd=cwd)


def _one_error_line(r: subprocess.CompletedProcess, *words: str) -> None:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and lines[0].startswith("gaptrace: error:"), r.stderr
    for w in words:
        assert w in lines[0], r.stderr


def _temporaries(d) -> list[str]:
    return [f for f in os.listdir(d) if f.startswith(".tmp") or f.startswith(".gaptrace-report-")]


# ------------------------------------------------------------------------------------------- report: inputs
@pytest.mark.parametrize("name, named, msg", [
    ("f.gaptrace.json", False, ("overwrite the input", "f.gaptrace.json")),   # the sidecar next to the trace
    ("other.json", True, ("overwrite the input",)),                          # the one --sidecar names
])
def test_report_refuses_to_overwrite_its_sidecar(tmp_path, name, named, msg):
    trace = tmp_path / "f.json.gz"
    shutil.copy(PROBE, trace)
    side = tmp_path / name
    side.write_text(json.dumps({"config": {"x": 1}}))
    before = side.read_bytes()
    r = _gaptrace("report", str(trace), *(("--sidecar", str(side)) if named else ()), "-o", str(side))
    _one_error_line(r, *msg)
    assert side.read_bytes() == before
    if not named:
        assert _temporaries(tmp_path) == []


def test_report_refuses_to_overwrite_its_calibration_or_named_sidecar(tmp_path):
    """The calibration file and a sidecar named with --sidecar are inputs too: neither -o (directly or through a
    symlink) nor --annotated may replace them; the files are left byte for byte, and nothing else is written."""
    cal = tmp_path / "c.json"
    shutil.copy(os.path.join(HERE, "..", "..", "analyses", "data", "calibration_h100.json"), cal)
    side = tmp_path / "s.json"
    side.write_text(json.dumps({"unprofiled_round_ms": [1.0, 1.0]}))
    os.symlink("c.json", tmp_path / "link")
    before = {p: p.read_bytes() for p in (cal, side)}
    for args, victim in ((["--calibration", str(cal), "-o", str(cal)], "c.json"),
                         (["--calibration", str(cal), "-o", str(tmp_path / "link")], "c.json"),
                         (["--calibration", str(cal), "-o", str(tmp_path / "r.html"), "--annotated", str(cal)],
                          "c.json"),
                         (["--sidecar", str(side), "-o", str(tmp_path / "r.html"), "--annotated", str(side)],
                          "s.json")):
        _one_error_line(_gaptrace("report", PROBE, *args), "would overwrite the input", victim)
    assert {p: p.read_bytes() for p in (cal, side)} == before
    assert sorted(os.listdir(tmp_path)) == ["c.json", "link", "s.json"]


# ------------------------------------------------------------------------------ report: bad implicit sidecars
@pytest.mark.parametrize("content, why", [
    ("<html><body>not json</body></html>", "cannot read the capture sidecar"),
    ("[]", "not a JSON object"),
    ('{"analysis_window": 5}', "analysis_window is 5"),
    ('{"analysis_window": "nosuch"}', "names no annotation"),
])
def test_report_says_a_bad_implicit_sidecar_was_ignored(tmp_path, content, why):
    trace = tmp_path / "f.json.gz"
    shutil.copy(PROBE, trace)
    (tmp_path / "f.gaptrace.json").write_text(content)
    out = tmp_path / "r.html"
    r = _gaptrace("report", str(trace), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "with capture sidecar" not in r.stdout
    warn = [ln for ln in r.stderr.splitlines() if ln.startswith("gaptrace: warning:")]
    assert len(warn) == 1 and "capture sidecar ignored" in warn[0] and why in warn[0], r.stderr
    page = out.read_text(encoding="utf-8")
    assert "capture sidecar ignored" in page
    assert 'id="capture"' not in page  # no Capture section from an ignored sidecar


def test_report_named_sidecar_with_a_bad_window_is_an_error(tmp_path):
    trace = tmp_path / "f.json.gz"
    shutil.copy(PROBE, trace)
    for i, content in enumerate(['{"analysis_window": 5}', '{"analysis_window": "nosuch"}']):
        side = tmp_path / f"s{i}.json"
        side.write_text(content)
        r = _gaptrace("report", str(trace), "--sidecar", str(side), "-o", str(tmp_path / "r.html"))
        _one_error_line(r, "analysis_window")
        assert not (tmp_path / "r.html").exists()


def test_report_good_sidecar_window_still_used(tmp_path):
    trace = tmp_path / "f.json.gz"
    shutil.copy(PROBE, trace)
    (tmp_path / "f.gaptrace.json").write_text('{"analysis_window": "round_0"}')
    r = _gaptrace("report", str(trace), "-o", str(tmp_path / "r.html"))
    assert r.returncode == 0 and "with capture sidecar" in r.stdout and "warning" not in r.stderr


def test_read_sidecar_checked(tmp_path):
    from gaptrace.capture import read_sidecar, read_sidecar_checked

    trace = str(tmp_path / "t.json.gz")
    assert read_sidecar_checked(trace) == (None, None)
    side = tmp_path / "t.gaptrace.json"
    for content, why in [("<html>", "cannot read"), ("[]", "not a JSON object"),
                         ('{"analysis_window": 5}', "analysis_window")]:
        side.write_text(content)
        obj, reason = read_sidecar_checked(trace)
        assert obj is None and why in reason and str(side) in reason and "\n" not in reason
    side.write_text('{"analysis_window": "round", "x": 1}')
    assert read_sidecar_checked(trace) == ({"analysis_window": "round", "x": 1}, None)
    assert read_sidecar(trace) == {"analysis_window": "round", "x": 1}  # the old contract is unchanged


# --------------------------------------------------------------------------------------- report: messages
def test_report_no_gpu_message_does_not_point_at_analyze(tmp_path):
    with gzip.open(PROBE, "rt") as f:
        ev = json.load(f)["traceEvents"]
    host_only = tmp_path / "host_only.json"
    host_only.write_text(json.dumps({"traceEvents": [e for e in ev if e.get("cat") not in
                                                     ("kernel", "gpu_memcpy", "gpu_memset")]}))
    r = _gaptrace("report", str(host_only), "-o", str(tmp_path / "h.html"))
    _one_error_line(r, "no GPU activity", "ProfilerActivity.CUDA")
    assert "gaptrace analyze" not in r.stderr


# -------------------------------------------------------------------------------------------- permissions
def test_write_text_atomic_keeps_the_permissions_of_an_existing_file(tmp_path):
    p = tmp_path / "secret.html"
    p.write_text("old")
    os.chmod(p, 0o600)
    write_text_atomic(str(p), "new")
    assert p.read_text() == "new" and stat.S_IMODE(os.stat(p).st_mode) == 0o600
    os.chmod(p, 0o640)
    write_text_atomic(str(p), "newer")
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o640
    fresh = tmp_path / "fresh.html"
    write_text_atomic(str(fresh), "x")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(os.stat(fresh).st_mode) == 0o666 & ~umask


def test_report_overwrite_keeps_0600(tmp_path):
    out = tmp_path / "r.html"
    out.write_text("old")
    os.chmod(out, 0o600)
    r = _gaptrace("report", PROBE, "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600 and out.read_text(encoding="utf-8") != "old"


class _FakeProf:
    def __init__(self, text="{\"traceEvents\": []}"):
        self.text = text

    def export_chrome_trace(self, path):
        with open(path, "w") as f:
            f.write(self.text)


def test_trace_export_keeps_permissions(tmp_path):
    from gaptrace.capture import _export_trace_tmp

    for name in ("t.json.gz", "t.json"):
        p = tmp_path / name
        p.write_text("old")
        os.chmod(p, 0o600)
        tmp = _export_trace_tmp(_FakeProf(), str(p))
        assert p.read_text() == "old"  # the output is untouched until the capture commits
        os.replace(tmp, p)
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
    assert _temporaries(tmp_path) == []


# ------------------------------------------------------------------------------------ unwritable / ENOSPC
def test_resolve_output_refuses_an_unwritable_directory(tmp_path, monkeypatch):
    real_access = os.access
    monkeypatch.setattr(outputs.os, "access",
                        lambda p, mode, **kw: False if os.fspath(p) == str(tmp_path) else real_access(p, mode, **kw))
    with pytest.raises(ValueError, match="not writable"):
        resolve_output(str(tmp_path / "x.html"))


def test_report_in_a_read_only_directory(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o555)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("running as root: a read-only mode does not stop writes")
        r = _gaptrace("report", PROBE, "-o", str(ro / "r.html"))
        _one_error_line(r, "not writable")
        assert os.listdir(ro) == []
    finally:
        os.chmod(ro, 0o755)


def test_trace_export_enospc_leaves_no_temporaries(tmp_path, monkeypatch):
    from gaptrace import capture

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(capture.shutil, "copyfileobj", full)
    with pytest.raises(OSError) as ei:
        capture._export_trace_tmp(_FakeProf(), str(tmp_path / "t.json.gz"))
    assert ei.value.errno == errno.ENOSPC
    assert os.listdir(tmp_path) == []


def test_write_text_atomic_enospc_leaves_no_temporaries(tmp_path, monkeypatch):
    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(outputs, "set_output_mode", full)
    with pytest.raises(OSError):
        write_text_atomic(str(tmp_path / "x.json"), "{}")
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------------------------------ capture (library)
torch = pytest.importorskip("torch")


def _loop(cap, n):
    x = torch.randn(32, 32)
    for _ in range(n):
        x = torch.tanh(x @ x)
        cap.step()


def test_capture_checks_the_sidecar_up_front(tmp_path):
    from gaptrace.capture import Capture

    (tmp_path / "dd.gaptrace.json").mkdir()
    with pytest.raises(ValueError, match="a directory"):
        Capture(str(tmp_path / "dd.json.gz"), warmup_steps=1, active_steps=1)
    os.symlink("/dev/null", tmp_path / "nn.gaptrace.json")
    with pytest.raises(ValueError, match="not a regular file"):
        Capture(str(tmp_path / "nn.json.gz"), warmup_steps=1, active_steps=1)
    assert os.path.islink(tmp_path / "nn.gaptrace.json")
    prompts = tmp_path / "sc.gaptrace.json"
    prompts.write_text('"hello"\n')
    with pytest.raises(ValueError, match="overwrite the input"):
        Capture(str(tmp_path / "sc.json.gz"), warmup_steps=1, active_steps=1, inputs=(str(prompts),))
    assert sorted(os.listdir(tmp_path)) == ["dd.gaptrace.json", "nn.gaptrace.json", "sc.gaptrace.json"]


def test_capture_enospc_is_an_oserror_naming_the_output(tmp_path, monkeypatch):
    from gaptrace import capture

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(capture.shutil, "copyfileobj", full)
    path = str(tmp_path / "run.json.gz")
    with pytest.raises(OSError) as ei:
        with capture.Capture(path, warmup_steps=1, active_steps=2) as cap:
            _loop(cap, 8)
    assert ei.value.errno == errno.ENOSPC and ei.value.filename == path
    assert os.listdir(tmp_path) == []


def test_capture_follows_a_symlinked_trace(tmp_path):
    from gaptrace.capture import Capture

    (tmp_path / "real.json.gz").write_text("old")
    os.symlink("real.json.gz", tmp_path / "link.json.gz")
    with Capture(str(tmp_path / "link.json.gz"), warmup_steps=1, active_steps=2) as cap:
        _loop(cap, 6)
    assert os.path.islink(tmp_path / "link.json.gz")
    with gzip.open(tmp_path / "real.json.gz", "rt") as f:
        assert "traceEvents" in json.load(f)


# ------------------------------------------------------------------------------------------ capture (runtime)
def _capture_cli(tmp_path, out, *extra):
    return _gaptrace("capture", "--preset", "tiny", "--device", "cpu", "--batch-size", "2", "--max-new-tokens",
                     "40", "--warmup-rounds", "1", "--rounds", "2", "-o", str(out), *extra, cwd=str(tmp_path))


def test_capture_cli_refuses_the_prompts_file_as_sidecar(tmp_path):
    prompts = tmp_path / "sc.gaptrace.json"
    prompts.write_text('"hello"\n')
    before = prompts.read_bytes()
    r = _capture_cli(tmp_path, tmp_path / "sc.json.gz", "--prompts", str(prompts))
    _one_error_line(r, "overwrite the input")
    assert prompts.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["sc.gaptrace.json"]


def test_capture_cli_refuses_a_sidecar_link_to_a_device_and_a_directory(tmp_path):
    os.symlink("/dev/null", tmp_path / "nn.gaptrace.json")
    r = _capture_cli(tmp_path, tmp_path / "nn.json.gz", "--prompt", "hello")
    _one_error_line(r, "not a regular file")
    assert os.path.islink(tmp_path / "nn.gaptrace.json")
    (tmp_path / "dd.gaptrace.json").mkdir()
    r = _capture_cli(tmp_path, tmp_path / "dd.json.gz", "--prompt", "hello")
    _one_error_line(r, "a directory")
    assert "Traceback" not in r.stderr
    assert sorted(os.listdir(tmp_path)) == ["dd.gaptrace.json", "nn.gaptrace.json"]


def test_capture_decode_enospc_one_line_no_temporaries(tmp_path, monkeypatch):
    from gaptrace import capture
    from runtime.capture_run import capture_decode
    from runtime.session import build_setup

    setup = build_setup("tiny", device="cpu", batch_size=2)

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    out = str(tmp_path / "x.json.gz")
    monkeypatch.setattr(capture.shutil, "copyfileobj", full)
    with pytest.raises(ValueError) as ei:
        capture_decode(setup, ["hello"], out, 1, 2, 40, inputs=())
    msg = str(ei.value)
    assert "\n" not in msg and "No space left" in msg and out in msg and "trace" in msg
    assert os.listdir(tmp_path) == []
    monkeypatch.undo()

    # the sidecar's write fails: one line naming the sidecar, no temporaries
    monkeypatch.setattr(capture, "set_output_mode", lambda tmp, dest: (_ for _ in ()).throw(
        OSError(errno.ENOSPC, "No space left on device")) if dest.endswith(".gaptrace.json") else os.chmod(tmp, 0o644))
    with pytest.raises(ValueError, match=r"x\.gaptrace\.json: cannot write the capture sidecar: No space left"):
        capture_decode(setup, ["hello"], out, 1, 2, 40, inputs=())
    assert _temporaries(tmp_path) == []


def test_capture_decode_checks_the_directory_before_decoding(tmp_path, monkeypatch):
    from runtime import capture_run
    from runtime.session import build_setup

    setup = build_setup("tiny", device="cpu", batch_size=2)
    ran = []
    monkeypatch.setattr(capture_run, "Engine", lambda *a, **k: ran.append(1))
    real_access = os.access
    monkeypatch.setattr(outputs.os, "access",
                        lambda p, mode, **kw: False if os.fspath(p) == str(tmp_path) else real_access(p, mode, **kw))
    with pytest.raises(ValueError, match="not writable"):
        capture_run.capture_decode(setup, ["hello"], str(tmp_path / "x.json.gz"), 1, 2, 40, inputs=())
    assert ran == [] and os.listdir(tmp_path) == []


@pytest.mark.parametrize("content", ["{not json", "[" * 50000 + "]" * 50000, "[]", None])
def test_analyze_and_diff_say_a_bad_sidecar_was_ignored(tmp_path, content):
    """analyze and diff, like report: a sidecar that cannot be used (not JSON, nested too deeply, not an object, a
    directory) is named in one warning line on stderr and the analysis goes on without it (exit 0, full output)."""
    trace = tmp_path / "Y.json.gz"
    shutil.copy(PROBE, trace)
    side = tmp_path / "Y.gaptrace.json"
    if content is None:
        side.mkdir()
    else:
        side.write_text(content)
    for args in (("analyze", str(trace)), ("analyze", str(trace), "--json"), ("diff", str(trace), PROBE)):
        r = _gaptrace(*args)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-500:]
        warn = [ln for ln in r.stderr.splitlines()  # diff says whose: "A: " / "B: "
                if ln.replace("A: ", "", 1).replace("B: ", "", 1).startswith("gaptrace: warning: capture sidecar ignored")]
        assert len(warn) == 1 and "Y.gaptrace.json" in warn[0] and r.stdout


def test_a_fifo_or_oversized_sidecar_is_refused_without_reading_it(tmp_path, monkeypatch):
    """A FIFO named like a sidecar used to hang analyze (open() blocks until a writer comes); a huge file would be
    read whole. Both are named in one warning line and the analysis goes on (exit 0)."""
    import gaptrace.sidecar as capture  # the sidecar reader and its size limit

    trace = tmp_path / "Y.json.gz"
    shutil.copy(PROBE, trace)
    side = tmp_path / "Y.gaptrace.json"
    os.mkfifo(side)
    r = subprocess.run([sys.executable, "-m", "gaptrace.cli", "analyze", str(trace)], capture_output=True,
                       text=True, timeout=120)
    warn = [ln for ln in r.stderr.splitlines() if ln.startswith("gaptrace: warning:")]
    assert r.returncode == 0 and r.stdout, r.stderr
    assert len(warn) == 1 and "not a regular file" in warn[0] and "Y.gaptrace.json" in warn[0]
    side.unlink()
    side.write_text(json.dumps({"analysis_window": "round", "pad": "x" * 2000}))
    monkeypatch.setattr(capture, "SIDECAR_MAX_BYTES", 1000)
    obj, why = capture.read_sidecar_checked(str(trace))
    assert obj is None and "over the" in why and "\n" not in why
    monkeypatch.setattr(capture, "SIDECAR_MAX_BYTES", 10 ** 6)
    assert capture.read_sidecar_checked(str(trace))[0]["analysis_window"] == "round"


def test_extreme_sidecar_numbers_are_skipped_not_overflowed(tmp_path):
    """A τ of 1e308 overflowed the τ mean to inf (numpy RuntimeWarning on stderr, TPOT 0); one of 1e-320 gave a
    TPOT of inf; an unprofiled round time of 1e308 the same. Numbers far outside what a capture writes are named
    among the skipped fields; the other rounds' τ is still used, and no numpy warning reaches stderr."""
    from gaptrace.capture import positive_number, usable_tau

    src = "fixtures/traces/h200_pairs/bench_sync_bs8_B12"
    dst = tmp_path / "t.json.gz"
    shutil.copy(os.path.join(HERE, "..", "..", src + ".json.gz"), dst)
    side = json.loads(open(os.path.join(HERE, "..", "..", src + ".gaptrace.json")).read())
    good_tau = [r["tau"] for r in side["rounds"][2:]]
    side["rounds"][0]["tau"] = 1e308
    side["rounds"][1]["tau"] = 1e-320
    side["unprofiled_round_ms"] = [1e308, 4.0]
    (tmp_path / "t.gaptrace.json").write_text(json.dumps(side))
    r = _gaptrace("analyze", str(dst), "--json")
    assert r.returncode == 0 and "RuntimeWarning" not in r.stderr, r.stderr
    warn = [ln for ln in r.stderr.splitlines() if ln.startswith("gaptrace: warning:")]
    assert len(warn) == 1 and "rounds[0].tau" in warn[0] and "rounds[1].tau" in warn[0], r.stderr
    assert "unprofiled_round_ms" in warn[0]
    res = json.loads(r.stdout)
    # the same τ as a sidecar whose two rounds carry no τ at all: the extreme values are dropped, nothing else
    del side["rounds"][0]["tau"], side["rounds"][1]["tau"]
    side["unprofiled_round_ms"] = [4.0]
    (tmp_path / "t.gaptrace.json").write_text(json.dumps(side))
    ref = json.loads(_gaptrace("analyze", str(dst), "--json").stdout)
    tau = res["rounds"]["summary"]["tau"]
    assert tau == ref["rounds"]["summary"]["tau"] and min(good_tau) <= tau <= max(good_tau)
    assert res["rounds"]["summary"]["tpot_us"] == ref["rounds"]["summary"]["tpot_us"]
    assert all(math.isfinite(v) for v in res["rounds"]["summary"].values() if isinstance(v, float))
    # the bounds themselves
    assert positive_number(1e-9) and positive_number(1e12) and not positive_number(1e13)
    assert not positive_number(1e-10) and not positive_number(True) and not positive_number(float("nan"))
    assert usable_tau(0) and usable_tau(1e-6) and usable_tau(1e6) and not usable_tau(1e-7) and not usable_tau(2e6)


def test_report_survives_a_sidecar_with_wrongly_typed_fields(tmp_path):
    """A sidecar object whose graphs / rounds are not lists: the report is written (the fields are ignored)."""
    trace = tmp_path / "Y.json.gz"
    shutil.copy(PROBE, trace)
    (tmp_path / "Y.gaptrace.json").write_text(json.dumps({"graphs": "x", "rounds": 5, "unprofiled_round_ms": {}}))
    r = _gaptrace("report", str(trace), "-o", str(tmp_path / "Y.html"))
    assert r.returncode == 0 and "Traceback" not in r.stderr and (tmp_path / "Y.html").stat().st_size > 0


def test_a_fifo_as_the_trace_is_refused_not_read(tmp_path):
    """A FIFO given as the trace (nothing will ever write it): one line, exit 2, at once (reading it would block)."""
    fifo = tmp_path / "t.json"
    os.mkfifo(fifo)
    r = subprocess.run([sys.executable, "-m", "gaptrace.cli", "analyze", str(fifo)], capture_output=True, text=True,
                       timeout=60)
    _one_error_line(r, "not a regular file")


def test_report_wrote_line_escapes_the_path(tmp_path):
    """The 'wrote PATH' line escapes a newline or ESC in the output path, as error lines do."""
    trace = tmp_path / "t.json.gz"
    shutil.copy(PROBE, trace)
    out = tmp_path / "we\nird\x1b[31m.html"
    r = _gaptrace("report", str(trace), "-o", str(out))
    assert r.returncode == 0 and out.exists()
    assert len(r.stdout.strip().splitlines()) == 1 and "we\\nird\\x1b[31m.html" in r.stdout


def test_capture_refuses_an_empty_output_and_a_shrink_after_the_capture(tmp_path):
    """`-o ''` names no file, and `--shrink-at-round N` past the capture's rounds would be silently ignored: both
    are one line, exit 2, before any decode."""
    base = ("capture", "--preset", "tiny", "--device", "cpu", "--batch-size", "2", "--prompt", "hi",
            "--max-new-tokens", "40", "--warmup-rounds", "1", "--rounds", "2")
    _one_error_line(_gaptrace(*base, "-o", ""), "empty")
    r = _gaptrace(*base, "--shrink-at-round", "100", "-o", str(tmp_path / "s.json.gz"))
    _one_error_line(r, "--shrink-at-round 100")
    assert os.listdir(tmp_path) == []


def test_diff_gate_exit_code_survives_a_closed_pipe():
    """`gaptrace diff A B --fail-if ... | head -1`: the reader leaves after one line; the exit code is still the
    gates' (0: held, 1: tripped), not a write error's."""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    a = os.path.join(root, "fixtures", "traces", "h200_pairs", "bench_sync_bs8_B12.json.gz")
    b = os.path.join(root, "fixtures", "traces", "h200_pairs", "bench_overlap_bs8_B12_clean_a.json.gz")
    for gate, want in (("occupancy < 0.5", 0), ("occupancy < 0.99", 1)):
        p = subprocess.Popen([sys.executable, "-m", "gaptrace.cli", "diff", a, b, "--fail-if", gate],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        p.stdout.close()  # the reader is gone before the command writes: every write hits a closed pipe
        err = p.stderr.read().decode()
        assert p.wait(timeout=600) == want, (gate, err)
        assert "Traceback" not in err


@pytest.mark.parametrize("command", ["report", "annotate"])
def test_an_empty_output_path_is_refused(tmp_path, command):
    """``-o ''`` is no file name: refused in one line (it used to fall back to the default name and write there)."""
    r = _gaptrace(command, os.path.abspath(PROBE), "-o", "", cwd=tmp_path)
    _one_error_line(r, "the output path is empty")
    assert os.listdir(tmp_path) == []


def test_sigterm_unwinds_so_temporaries_are_removed(tmp_path):
    """A terminated command runs its finally blocks (the atomic writers remove their temporaries there): SIGTERM is
    SystemExit(143) once the CLI has started."""
    marker = tmp_path / "cleaned"
    code = ("import os, signal\nfrom gaptrace.cli import exit_on_sigterm\nexit_on_sigterm()\n"
            f"try:\n    os.kill(os.getpid(), signal.SIGTERM)\n    import time; time.sleep(5)\n"
            f"finally:\n    open({str(marker)!r}, 'w').close()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 143 and marker.exists(), r.stderr


def test_an_error_is_the_only_line_when_the_sidecar_is_also_bad(tmp_path):
    """A sidecar that cannot be used is a warning only when the command goes on: when it fails anyway (no runtime
    call to replay for whatif; a missing --rounds range for analyze) the error is the one line on stderr."""
    t = tmp_path / "t.json"
    t.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1,
                                               "pid": 0, "tid": 0}]}))
    (tmp_path / "t.gaptrace.json").write_text(json.dumps({"analysis_window": 5}))
    _one_error_line(_gaptrace("whatif", str(t), "--remove", "a"), "cannot be replayed")
    _one_error_line(_gaptrace("analyze", str(t), "--rounds", "nosuch"), "nosuch")
    r = _gaptrace("analyze", str(t))  # it goes on: the warning is said
    assert r.returncode == 0 and "capture sidecar ignored" in r.stderr
