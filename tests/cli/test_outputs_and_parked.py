"""Writing outputs safely (links followed, devices/FIFOs/inputs refused) and parked threads left out of attribution."""
import os
import shutil
import subprocess
import sys

import pytest

import gaptrace
from gaptrace.analyses.gaps import event_idle, gap_attribution
from gaptrace.analyze import run_analysis
from gaptrace.capture import read_sidecar
from gaptrace.outputs import resolve_output

SMALL = "fixtures/traces/tracelens_mi300x_sglang_qwen3_8b_decode.json.gz"
SYNC = "fixtures/traces/h200_pairs/bench_sync_bs8_B12.json.gz"


def test_resolve_output(tmp_path):
    (tmp_path / "real.html").write_text("x")
    os.symlink(tmp_path / "real.html", tmp_path / "link.html")
    assert resolve_output(str(tmp_path / "link.html")) == str(tmp_path / "real.html")
    assert resolve_output(str(tmp_path / "new.html")) == str(tmp_path / "new.html")
    os.mkfifo(tmp_path / "fifo")
    for bad, what in [(tmp_path / "fifo", "not a regular file"), (tmp_path, "a directory"),
                      (tmp_path / "no" / "x.html", "does not exist")]:
        with pytest.raises(ValueError, match=what):
            resolve_output(str(bad))
    with pytest.raises(ValueError, match="overwrite the input"):
        resolve_output(str(tmp_path / "link.html"), (str(tmp_path / "real.html"),))


def test_resolve_output_refuses_a_proc_fd_link_to_a_pipe():
    """/proc/self/fd/N of a pipe resolves to no path ("pipe:[N]"): it is still refused up front, before a long
    benchmark or capture runs, not when the rename fails."""
    r, w = os.pipe()
    try:
        link = f"/proc/self/fd/{w}"
        if not os.path.exists(link):
            pytest.skip("no /proc/self/fd here")
        with pytest.raises(ValueError, match="not a regular file"):
            resolve_output(link)
    finally:
        os.close(r)
        os.close(w)


def test_resolve_output_refuses_unwritable_and_impossible_paths(tmp_path):
    """One line (ValueError) up front, never a traceback after a long run: a directory no file can be created in
    (/proc: root passes os.access there), a symlink loop, a name longer than the file system allows."""
    with pytest.raises(ValueError, match="is not writable"):
        resolve_output("/proc/gaptrace-output.json")
    os.symlink(tmp_path / "loop", tmp_path / "loop")
    with pytest.raises(ValueError, match="cannot be an output"):
        resolve_output(str(tmp_path / "loop"))
    with pytest.raises(ValueError, match="cannot be an output"):
        resolve_output(str(tmp_path / ("a" * 300 + ".json")))
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp-")]  # the writability probe cleans up
    # the loop or the long name in a directory part: said as such, a long path shown by its head and tail
    with pytest.raises(ValueError, match="output directory .* has a symlink loop in its path"):
        resolve_output(str(tmp_path / "loop" / "x.json"))
    with pytest.raises(ValueError, match="has a name too long") as e:
        resolve_output(str(tmp_path / ("b" * 3000) / "x.json"))
    assert len(str(e.value)) < 500 and "…" in str(e.value)
    (tmp_path / "a.txt").write_text("x")
    with pytest.raises(ValueError, match="is not a directory"):
        resolve_output(str(tmp_path / "a.txt" / "x.json"))
    with pytest.raises(ValueError, match="is under a file"):
        resolve_output(str(tmp_path / "a.txt" / "sub" / "x.json"))
    # a read-only file: a rename would replace it all the same, so it is refused (root passes os.access)
    os.chmod(tmp_path / "a.txt", 0o444)
    with pytest.raises(ValueError, match=r"is read-only \(mode 0444\)"):
        resolve_output(str(tmp_path / "a.txt"))
    assert (tmp_path / "a.txt").read_text() == "x"
    # a directory without write bits: refused as for any user (root could still create a file there)
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o555)
    try:
        with pytest.raises(ValueError, match="is not writable"):
            resolve_output(str(ro / "r.html"))
    finally:
        os.chmod(ro, 0o755)
    assert not list(ro.iterdir())


def test_resolve_output_refuses_a_directory_it_cannot_remove_a_file_from(tmp_path, monkeypatch):
    """An append-only directory takes a new file but not its removal (nor a rename over it): refused up front."""
    import gaptrace.outputs as outputs

    def no_unlink(p, *a, **k):
        raise PermissionError(1, "Operation not permitted", p)

    monkeypatch.setattr(outputs.os, "unlink", no_unlink)
    with pytest.raises(ValueError, match="is not writable"):
        resolve_output(str(tmp_path / "x.html"))


def test_report_refuses_to_overwrite_its_input(tmp_path):
    t = tmp_path / "t.json.gz"
    shutil.copy(SMALL, t)
    before = t.read_bytes()
    r = subprocess.run([sys.executable, "-m", "gaptrace.cli", "report", str(t), "-o", str(t)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "overwrite the input" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert t.read_bytes() == before


def test_parked_threads_are_left_out():
    """The capture's tqdm monitor thread waits in threading.py for the whole window: it is nobody's cause."""
    trace = gaptrace.load_trace(SYNC)
    raw = gap_attribution(trace, result=event_idle(trace, window="round", host_wait_only=True))
    assert any("tqdm/_monitor.py" in f for f in raw["frame"])  # present without the exclusion
    res = run_analysis(trace, sidecar=read_sidecar(SYNC))
    assert not [r for r in res["gap_attribution"] if "tqdm" in r["frame"] or r["frame"].startswith("threading.py")]
    assert res["gap_attribution"][0]["inclusive_idle_us"] <= res["idle_split"]["host_wait_us"] + 1e-6
