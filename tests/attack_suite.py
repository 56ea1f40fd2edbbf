"""Attack gaptrace's command line as a hostile user would, and check every outcome against the promise.

    .venv/bin/python tests/attack_suite.py                      # every attack at full size (inputs <= 50 MB)
    .venv/bin/python tests/attack_suite.py --scale 0.05 --only fifo,regex

The promise, for every input: the command ends within ``--time-limit-s`` (60) and ``--rss-limit-gb`` (4) with
``--memory-limit-gb 4`` either in a result (exit 0, no ``Traceback``, no Python warning on stderr) or in exactly
one ``gaptrace: error:`` line with exit 2; no input file is changed (checked by SHA-256 of every file under each
input), and no temporary file is left beside an output. Each attack builds its input in a fresh directory (sizes
scale with ``--scale``: 1.0 is the full version, tests/cli/test_attacks.py runs each at a small one), then runs the
real CLI in a subprocess; wall time and peak RSS come from ``os.wait4``.

Classes: an output that is an input (a trace directory's member, by symlink, by hard link); directory members that
are not regular files (FIFO, sub-directory), rank names beyond int32 or named twice; many devices, many rank files;
output amplification (long frame names, deep stacks); the memory guard (many GB of whitespace or many gzip members in
a small file, zero padding after the gzip stream); superlinear inputs (one long string, deep nesting, many gzip
members, many syncs under deep stacks); numbers (±1.7e308 timestamps, huge durations, a lone 1e300 timestamp,
timestamps near 1e18 µs); a ``--fail-if`` gate built to backtrack; control and bidi characters in names (the
report's SVG text); a symlink planted by another user in a world-writable sticky directory.

Prints one row per attack (class, name, outcome, seconds, peak RSS) and the counts: attacks, held, failed.
"""
from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TEMP_PREFIXES = (".gaptrace-", ".tmp-gaptrace-")


# ---------------------------------------------------------------------------------------------- trace pieces
def kernel(ts: float, dur: float, device: int = 0, name: str = "k", corr: int = 1, stream: int = 7) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": device, "tid": stream, "ts": ts, "dur": dur,
            "args": {"device": device, "stream": stream, "correlation": corr}}


def frame(ts: float, dur: float, name: str, tid: int = 1) -> dict:
    return {"ph": "X", "cat": "python_function", "name": name, "pid": 100, "tid": tid, "ts": ts, "dur": dur}


def runtime(ts: float, dur: float, name: str, corr: int, tid: int = 1) -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 100, "tid": tid, "ts": ts, "dur": dur,
            "args": {"correlation": corr}}


def sync_under(t: float, corr: int) -> list[dict]:
    """A launch, its kernel, and a cudaStreamSynchronize at ``t`` that the kernel's end makes blocking."""
    return [runtime(t, 0.5, "cudaLaunchKernel", corr), kernel(t + 1, 4, corr=corr),
            runtime(t + 1, 5, "cudaStreamSynchronize", 10**6 + corr)]


def doc_bytes(events: list[dict]) -> bytes:
    return json.dumps({"traceEvents": events}, separators=(",", ":")).encode()


def write(path: str, data: bytes, gz: bool = False) -> str:
    with open(path, "wb") as f:
        f.write(gzip.compress(data, 6) if gz else data)
    return path


def gzip_member(data: bytes) -> bytes:
    return gzip.compress(data, 9, mtime=0)


def spaces_member(n_bytes: int) -> bytes:
    """One gzip member of ``n_bytes`` spaces, compressed in 1 MiB steps (never held in memory)."""
    c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = b" " * (1 << 20)
    out = []
    for _ in range(n_bytes >> 20):
        out.append(c.compress(block))
    out.append(c.compress(b" " * (n_bytes & ((1 << 20) - 1))))
    out.append(c.flush())
    return b"".join(out)


def small_trace(n: int = 50) -> list[dict]:
    ev = []
    for i in range(n):
        ev += sync_under(100.0 * i, i + 1)
    return ev


# ---------------------------------------------------------------------------------------------- the attacks
@dataclasses.dataclass
class Setup:
    argv: list[str]  # after `gaptrace`
    inputs: list[str]  # paths that must be unchanged after the run
    outputs_dir: str | None = None  # where no temporary file may be left
    expect: str = "either"  # "error", "result" or "either"
    words: tuple[str, ...] = ()  # that the error line (or stdout of a result) must hold
    check: Callable[[subprocess.CompletedProcess], str | None] | None = None  # extra check: a reason it failed


@dataclasses.dataclass
class Attack:
    klass: str
    name: str
    build: Callable[[str, float], Setup]
    root_only: bool = False  # needs to chown (planted links)
    not_root: bool = False  # permission checks do not hold for root


def _ranks_dir(d: str, n: int = 2) -> str:
    r = os.path.join(d, "ranks")
    os.mkdir(r)
    for k in range(n):
        write(os.path.join(r, f"rank{k}.json"), doc_bytes(small_trace(10)))
    return r


def a_output_is_member(d, s):
    r = _ranks_dir(d)
    return Setup(["report", r, "-o", os.path.join(r, "rank0.json")], [r], r, "error", ("overwrite the input",))


def a_output_is_member_gz_link(d, s):
    r = _ranks_dir(d)
    os.symlink(os.path.join(r, "rank1.json"), os.path.join(d, "out.html"))
    return Setup(["report", r, "-o", os.path.join(d, "out.html")], [r], d, "error", ("overwrite the input",))


def a_output_is_hard_link(d, s):
    t = write(os.path.join(d, "t.json"), doc_bytes(small_trace(10)))
    os.link(t, os.path.join(d, "out.html"))
    return Setup(["report", t, "-o", os.path.join(d, "out.html")], [t], d, "error", ("overwrite the input",))


def a_fifo_member(d, s):
    r = _ranks_dir(d, 1)
    os.mkfifo(os.path.join(r, "rank1.json"))
    return Setup(["analyze", r], [os.path.join(r, "rank0.json")], None, "error", ("not a regular file",))


def a_dir_member(d, s):
    r = _ranks_dir(d, 1)
    os.mkdir(os.path.join(r, "rank1.json"))
    return Setup(["analyze", r], [r], None, "error", ("not a regular file",))


def a_unreadable_member(d, s):
    r = _ranks_dir(d, 2)
    os.chmod(os.path.join(r, "rank1.json"), 0)
    return Setup(["analyze", r], [], None, "error", ("cannot read",))


def a_rank_beyond_int32(d, s):
    r = _ranks_dir(d, 1)
    write(os.path.join(r, "rank2147483648.json"), doc_bytes(small_trace(5)))
    return Setup(["analyze", r], [r], None, "error", ("2147483648",))


def a_rank_named_twice(d, s):
    r = _ranks_dir(d, 2)
    write(os.path.join(r, "rank01.json"), doc_bytes(small_trace(5)))
    return Setup(["analyze", r], [r], None, "error", ("rank 1",))


def a_many_devices(d, s):
    n = max(200, int(20000 * s))
    t = write(os.path.join(d, "devices.json"), doc_bytes([kernel(10.0 * i, 5.0, device=i) for i in range(n)]))
    return Setup(["analyze", t, "--json"], [t], None, "result",
                 check=lambda r: None if len(json.loads(r.stdout)["devices"]) == n else "devices missing")


def a_many_rank_files(d, s):
    n = max(100, int(3000 * s))
    r = os.path.join(d, "ranks")
    os.mkdir(r)
    for k in range(n):
        write(os.path.join(r, f"rank{k}.json"), doc_bytes([kernel(10.0 * k, 5.0)]))
    # --merged: the one-trace path over 3,000 files is what this guards (linear in the files); without it the
    # directory is a fleet, one task per rank
    return Setup(["analyze", r, "--merged", "--json"], [r], None, "result")


def _long_name_stack(n_frames: int, name_bytes: int) -> list[dict]:
    """``n_frames`` nested frames with long distinct names; sync k runs inside frame k only (a site each)."""
    ev = []
    for k in range(n_frames):
        ev.append(frame(10.0 * k, 10.0 * (2 * n_frames - 2 * k), f"m{k}.py({k}): f{k}_" + "x" * name_bytes))
        ev += sync_under(10.0 * k + 1, k + 1)
    return ev


def a_long_frame_names(d, s):
    name = max(1 << 14, int((1 << 20) * s))
    t = write(os.path.join(d, "names.json.gz"), doc_bytes(_long_name_stack(40, name)), gz=True)
    out = os.path.join(d, "r.html")

    def small(r):
        size = os.path.getsize(out) if os.path.exists(out) else 0
        return None if size < 20e6 else f"report of {size / 1e6:.0f} MB"
    return Setup(["report", t, "-o", out], [t], d, "result", check=small)


def a_long_frame_names_json(d, s):
    name = max(1 << 14, int((1 << 20) * s))
    t = write(os.path.join(d, "names.json.gz"), doc_bytes(_long_name_stack(40, name)), gz=True)
    return Setup(["analyze", t, "--json"], [t], None, "result",
                 check=lambda r: None if len(r.stdout) < 20e6 else f"JSON of {len(r.stdout) / 1e6:.0f} MB")


def a_whitespace_gzip(d, s):
    """GBs of spaces in gzip members, then a last member whose ISIZE is a plausible 8x the file's size: a guard
    that trusts the trailer sees megabytes."""
    gb = max(0.3, 8 * s)
    head = gzip_member(b'{"traceEvents":[')
    block = spaces_member(64 << 20)
    t = os.path.join(d, "spaces.json.gz")
    with open(t, "wb") as f:
        f.write(head)
        for _ in range(int(gb * 1e9) >> 26):
            f.write(block)
        body = doc_bytes(small_trace(5))[len(b'{"traceEvents":['):]
        f.write(gzip_member(body[:-2] + b" " * (8 * f.tell()) + body[-2:]))
    return Setup(["analyze", t, "--memory-limit-gb", "4" if s >= 0.5 else "0.5"], [t], None, "error",
                 ("counted while decompressing",))


def a_gzip_zero_padding(d, s):
    t = os.path.join(d, "padded.json.gz")
    write(t, doc_bytes(small_trace(100)), gz=True)
    with open(t, "ab") as f:
        f.write(b"\0" * 16)
    return Setup(["analyze", t, "--memory-limit-gb", "0.5"], [t], None, "result")


def a_many_gzip_members(d, s):
    n = max(5000, int(200000 * s))
    data = doc_bytes(small_trace(max(20, n // 100)))
    step = max(1, len(data) // n)
    t = os.path.join(d, "members.json.gz")
    with open(t, "wb") as f:
        for i in range(0, len(data), step):
            f.write(gzip_member(data[i:i + step]))
    return Setup(["analyze", t], [t], None, "result")


def a_one_long_string(d, s):
    n = max(100 << 20, int((1 << 30) * s))
    c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    t = os.path.join(d, "string.json.gz")
    with open(t, "wb") as f:
        f.write(c.compress(b'{"traceEvents":[{"ph":"X","cat":"kernel","name":"'))
        block = b"a" * (1 << 20)
        for _ in range(n >> 20):
            f.write(c.compress(block))
        f.write(c.compress(b'","ts":1,"dur":1,"args":{"device":0}}]}'))
        f.write(c.flush())
    return Setup(["analyze", t, "--memory-limit-gb", "2"], [t], None, "error")


def a_deep_sync_stacks(d, s):
    depth = max(1000, int(12000 * s))
    syncs = depth
    ev = [frame(0.001 * k, 1e7 - 0.002 * k, f"deep.py({k}): level{k}") for k in range(depth)]
    for i in range(syncs):
        ev += sync_under(100.0 + 10 * i, i + 1)
    t = write(os.path.join(d, "deep.json.gz"), doc_bytes(ev), gz=True)
    return Setup(["analyze", t, "--json"], [t], None, "result")


def a_nested_frames_report(d, s):
    depth = max(5000, int(200000 * s))
    ev = [frame(0.001 * k, 1e7 - 0.002 * k, f"nest.py({k}): n{k}") for k in range(depth)]
    ev += [kernel(100.0 + 10 * i, 4) for i in range(20)]
    t = write(os.path.join(d, "nested.json.gz"), doc_bytes(ev), gz=True)
    out = os.path.join(d, "r.html")
    return Setup(["report", t, "-o", out], [t], d, "either")


def a_huge_timestamps(d, s):
    ev = small_trace(10) + [kernel(1.7e308, 1.0), kernel(-1.7e308, 1.0)]
    t = write(os.path.join(d, "huge_ts.json"), doc_bytes(ev))
    return Setup(["analyze", t], [t], None, "either")


def a_huge_durations(d, s):
    ev = small_trace(10) + [kernel(5.0, 1e300), kernel(7.0, 1.5e308)]
    t = write(os.path.join(d, "huge_dur.json"), doc_bytes(ev))
    return Setup(["analyze", t], [t], None, "either")


def a_lone_far_timestamp(d, s):
    ev = small_trace(10) + [kernel(1e300, 1.0)]
    t = write(os.path.join(d, "far.json"), doc_bytes(ev))

    def window_of_the_bulk(r):
        w = json.loads(r.stdout)["devices"][0]["window_us"] if r.returncode == 0 else 0
        return None if w < 1e6 else f"a window of {w:.3g} µs"
    return Setup(["analyze", t, "--json"], [t], None, "either", check=window_of_the_bulk)


def a_timestamps_near_1e18(d, s):
    ev = [kernel(1e18 + 1000.0 * i, 300.0) for i in range(84)]
    t = write(os.path.join(d, "e18.json"), doc_bytes(ev))
    return Setup(["analyze", t], [t], None, "either",
                 check=lambda r: None if r.returncode == 2 or b"precision" in r.stderr else "no word on precision")


def a_backtracking_gate(d, s):
    t = write(os.path.join(d, "t.json"), doc_bytes(small_trace(10)))
    digits = max(16000, int(100000 * s))
    return Setup(["diff", t, t, "--fail-if", "occupancy < " + "1" * digits + "x"], [t], None, "error")


def a_bidi_in_svg(d, s):
    ev = small_trace(10)
    for i, e in enumerate(ev):
        if e["cat"] == "kernel":
            e["name"] = "\u202egnp.exe\x00\x1b[31m"
    ev += [{"ph": "X", "cat": "user_annotation", "name": "\u202eround\x1b", "pid": 100, "tid": 1, "ts": 0.0,
            "dur": 900.0},
           frame(0.0, 950.0, "\u202egnp.py(1): exe\x00")]
    t = write(os.path.join(d, "bidi.json"), doc_bytes(ev))
    out = os.path.join(d, "r.html")

    def no_raw(r):
        if not os.path.exists(out):
            return "no report"
        html = open(out, encoding="utf-8").read()
        if any(c in html for c in "\u202e\x00\x1b"):
            return "raw bidi/NUL/ESC in the report"
        # the charts' data (``var FIGURES = {...};``, JSON): an escape that decodes to the raw character is drawn
        # raw in the SVG; the visible escape the tables show is JSON-encoded with a doubled backslash
        start = html.find("var FIGURES = ")
        blob = json.loads(html[start + 14:html.index(";\n", start)]) if start >= 0 else {}
        text = json.dumps(blob, ensure_ascii=False)
        bad = sorted({repr(c) for c in "\u202e\x00\x1b" if c in text})
        return f"chart data holds {bad} (drawn raw in the SVG)" if bad else None
    return Setup(["report", t, "-o", out], [t], d, "result", check=no_raw)


def a_planted_symlink(d, s):
    pub = os.path.join(d, "public")
    os.mkdir(pub)
    os.chmod(pub, 0o1777)
    victim = write(os.path.join(d, "victim.txt"), b"precious\n")
    link = os.path.join(pub, "r.html")
    os.symlink(victim, link)
    os.lchown(link, 54321, 54321)
    t = write(os.path.join(d, "t.json"), doc_bytes(small_trace(10)))
    return Setup(["report", t, "-o", link], [t, victim], pub, "error", ("symlink",))


ATTACKS = [
    Attack("output is an input", "report -o a member of the trace directory", a_output_is_member),
    Attack("output is an input", "report -o a symlink to a member", a_output_is_member_gz_link),
    Attack("output is an input", "report -o a hard link to the trace", a_output_is_hard_link),
    Attack("directory listing", "a FIFO named rank1.json", a_fifo_member),
    Attack("directory listing", "a sub-directory named rank1.json", a_dir_member),
    Attack("directory listing", "an unreadable rank file", a_unreadable_member, not_root=True),
    Attack("directory listing", "rank2147483648.json", a_rank_beyond_int32),
    Attack("directory listing", "rank1.json and rank01.json", a_rank_named_twice),
    Attack("scale", "20,000 devices of one kernel each", a_many_devices),
    Attack("scale", "3,000 rank files", a_many_rank_files),
    Attack("amplification", "40 syncs under 40 frames of 1 MB names (report)", a_long_frame_names),
    Attack("amplification", "40 syncs under 40 frames of 1 MB names (--json)", a_long_frame_names_json),
    Attack("memory guard", "8 GB of whitespace in a small gzip", a_whitespace_gzip),
    Attack("memory guard", "16 zero bytes after the gzip stream", a_gzip_zero_padding),
    Attack("superlinear", "200,000 gzip members", a_many_gzip_members),
    Attack("superlinear", "one 1 GB string in a 1 MB gzip", a_one_long_string),
    Attack("superlinear", "12,000 syncs under 12,000 frames", a_deep_sync_stacks),
    Attack("superlinear", "200,000 nested frames (report)", a_nested_frames_report),
    Attack("numbers", "timestamps of ±1.7e308", a_huge_timestamps),
    Attack("numbers", "durations of 1e300 and 1.5e308", a_huge_durations),
    Attack("numbers", "one timestamp of 1e300", a_lone_far_timestamp),
    Attack("numbers", "timestamps near 1e18 µs", a_timestamps_near_1e18),
    Attack("regex", "--fail-if with 100,000 digits", a_backtracking_gate),
    Attack("text", "bidi override, NUL and ESC in kernel names (report SVG)", a_bidi_in_svg),
    Attack("links", "a symlink planted in a sticky world-writable directory", a_planted_symlink, root_only=True),
]


# ---------------------------------------------------------------------------------------------- the oracle
def _digest(paths: list[str]) -> dict[str, str]:
    out = {}
    for p in paths:
        for root, _dirs, files in (os.walk(p) if os.path.isdir(p) else [(os.path.dirname(p), [], [os.path.basename(p)])]):
            for n in files:
                f = os.path.join(root, n)
                try:
                    with open(f, "rb") as fh:
                        out[f] = hashlib.sha256(fh.read()).hexdigest()
                except OSError:
                    out[f] = "unreadable"
    return out


@dataclasses.dataclass
class Outcome:
    attack: Attack
    held: bool
    why: str
    seconds: float
    rss_gb: float
    returncode: int | None


def run_attack(a: Attack, workdir: str, scale: float, time_limit_s: float = 60,
               rss_limit_gb: float = 4) -> Outcome:
    """Build the attack's input under ``workdir``, run the CLI on it and judge the outcome (see the module doc)."""
    d = tempfile.mkdtemp(prefix="attack-", dir=workdir)
    try:
        setup = a.build(d, scale)
        before = _digest(setup.inputs)
        argv = [sys.executable, "-m", "gaptrace.cli", *setup.argv]
        if "--memory-limit-gb" not in setup.argv and setup.argv[0] in ("analyze", "report", "diff"):
            argv += ["--memory-limit-gb", "4"]
        env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict"}
        out_f, err_f = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        t0 = time.perf_counter()
        p = subprocess.Popen(argv, stdout=out_f, stderr=err_f, cwd=d, env=env)
        killed = False
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - t0 > time_limit_s:
                p.kill()
                killed = True
            time.sleep(0.02)
        secs = time.perf_counter() - t0
        rc = os.waitstatus_to_exitcode(status)
        p.returncode = rc
        out_f.seek(0), err_f.seek(0)
        r = subprocess.CompletedProcess(argv, rc, out_f.read(), err_f.read())
        rss_gb = ru.ru_maxrss * 1024 / 1e9
        why = _judge(r, setup, killed, secs, rss_gb, time_limit_s, rss_limit_gb)
        if why is None and _digest(setup.inputs) != before:
            why = "an input was changed"
        if why is None and setup.outputs_dir and any(n.startswith(TEMP_PREFIXES) for n in os.listdir(setup.outputs_dir)):
            why = "a temporary file was left"
        return Outcome(a, why is None, why or "", secs, rss_gb, rc)
    finally:
        for root, dirs, _ in os.walk(d):
            for x in dirs:
                try:
                    os.chmod(os.path.join(root, x), 0o755)
                except OSError:
                    pass
        shutil.rmtree(d, ignore_errors=True)


def _judge(r, setup: Setup, killed: bool, secs: float, rss_gb: float, time_limit_s: float,
           rss_limit_gb: float) -> str | None:
    err = r.stderr.decode("utf-8", "replace")
    if killed:
        return f"still running after {time_limit_s:.0f} s"
    if rss_gb > rss_limit_gb:
        return f"peak RSS {rss_gb:.2f} GB"
    if "Traceback" in err or "Warning:" in err:
        return "a traceback or a Python warning on stderr: " + err.strip().splitlines()[-1][:200]
    lines = err.strip().splitlines()
    if r.returncode == 2:
        if setup.expect == "result":
            return "an error where a result was expected: " + err.strip()[:200]
        if len(lines) != 1 or not lines[0].startswith("gaptrace: error: "):
            return "not exactly one 'gaptrace: error:' line: " + err.strip()[:200]
        missing = [w for w in setup.words if w not in lines[0]]
        if missing:
            return f"the error line lacks {missing}: {lines[0][:200]}"
    elif r.returncode == 0:
        if setup.expect == "error":
            return "a result where an error was expected"
        if any(not ln.startswith("gaptrace: warning: ") for ln in lines):
            return "stray stderr: " + err.strip()[:200]
    else:
        return f"exit {r.returncode}: " + err.strip()[-200:]
    if setup.check is not None:
        why = setup.check(r)
        if isinstance(why, str):
            return why
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=1.0, help="input sizes (1.0: the full versions)")
    ap.add_argument("--only", default=None, help="comma-separated words; run the attacks whose name holds one")
    ap.add_argument("--time-limit-s", type=float, default=60)
    ap.add_argument("--rss-limit-gb", type=float, default=4)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="gaptrace-attacks-")
    root = os.geteuid() == 0
    held = failed = skipped = 0
    print(f"{'class':<20} {'attack':<58} {'outcome':<8} {'s':>7} {'GB':>6}  why")
    for a in ATTACKS:
        if args.only and not any(w in a.name for w in args.only.split(",")):
            continue
        if (a.root_only and not root) or (a.not_root and root):
            skipped += 1
            continue
        o = run_attack(a, workdir, args.scale, args.time_limit_s, args.rss_limit_gb)
        held += o.held
        failed += not o.held
        print(f"{a.klass:<20} {a.name:<58} {'held' if o.held else 'FAILED':<8} {o.seconds:7.1f} {o.rss_gb:6.2f}  "
              f"{o.why}", flush=True)
    print(f"\n{held + failed} attacks: {held} held, {failed} failed ({skipped} skipped as "
          f"{'root' if root else 'not root'})")
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    main()
