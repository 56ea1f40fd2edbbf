"""Load and analysis speed and memory, gaptrace against stdlib json and HolisticTraceAnalysis (DESIGN.md "What parsing a big trace costs").

For each trace, every tool runs in its own subprocess, so its memory is its own:

- ``gaptrace load``: :func:`gaptrace.loader.load_trace` (streaming; the compiled scanner on decoder threads for
  traces of 64 MiB and more, else the typed msgspec decoder);
- ``gaptrace load, no decoder workers``: the same with ``workers=0`` (the reader decodes every piece itself);
- ``gaptrace load, msgspec only (no scanner)``: ``scan=False`` (the typed decoder, in worker processes);
- ``gaptrace analyze --json``: the whole CLI pipeline (load + occupancy, gap attribution, blocking syncs,
  launch fit), output to /dev/null;
- ``gaptrace report``: the whole HTML report (load, every analysis, the page), written to a temporary file;
- ``stdlib json.loads``: read (gunzip) and ``json.loads`` the file, nothing else;
- ``HTA load + temporal breakdown``: HolisticTraceAnalysis ``TraceAnalysis(trace_dir)`` and
  ``get_temporal_breakdown()``, run from its own venv (``.venv-hta``) if it is there, else from this interpreter
  when ``import hta`` works in it.

Columns: seconds of wall clock for the whole subprocess (gaptrace rows: the fastest of ``--repeat`` runs, default
3, with the median in the last column; HTA and stdlib run once, they take minutes) (interpreter start and imports included, as a user waits
for them; for the load rows the last column says how much of it was the import and load_trace), MB/s of
(uncompressed) JSON over those seconds, peak RSS of the largest process (from ``wait4``), and peak memory of the
whole process tree (decoder workers included) as the sum of PSS sampled every 0.1 s (PSS splits shared pages
between processes, so forked workers are not counted twice).

    python benchmarks/make_big_trace.py /tmp/gaptrace_big.json          # once: a >= 1 GB replicated trace
    python benchmarks/bench_analysis.py [TRACE ...] [--skip-hta] [--skip-stdlib] [--repeat N]
    python benchmarks/bench_analysis.py --scaling SOURCE [--sizes-gb 0.1,0.5,1,2] [--kineto-format]

Default traces: the largest public trace in fixtures/traces, and /tmp/gaptrace_big.json when it exists.

``--scaling SOURCE`` replicates SOURCE (:mod:`make_big_trace`) to each size in turn (in ``--scratch``, deleted after
its row) and prints ``gaptrace analyze --json``'s time and peak RSS per size, with seconds per GB and the growth
exponent between consecutive sizes (log t2/t1 over log size2/size1: 1.0 is linear; n log n reads a little above).
"""
from __future__ import annotations

import argparse
import glob
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
BIG_DEFAULT = "/tmp/gaptrace_big.json"
HTA_PYTHON = os.path.join(REPO, ".venv-hta", "bin", "python")

sys.path.insert(0, REPO)
sys.path.insert(0, HERE)
import make_big_trace  # noqa: E402
from gaptrace.loader import json_size_bytes, trace_files  # noqa: E402

LOAD = """import sys, time
t = time.perf_counter()
from gaptrace.loader import load_trace
load_trace(sys.argv[1], workers={workers}, scan={scan})
print(time.perf_counter() - t)
"""
STDLIB = """import sys, json, gzip
data = open(sys.argv[1], 'rb').read()
if data[:2] == b'\\x1f\\x8b':
    data = gzip.decompress(data)
json.loads(data)
"""
HTA = """import sys, os, tempfile
from hta.trace_analysis import TraceAnalysis
d = tempfile.mkdtemp()
os.symlink(os.path.abspath(sys.argv[1]), os.path.join(d, os.path.basename(sys.argv[1])))
TraceAnalysis(trace_dir=d).get_temporal_breakdown(visualize=False)
"""


def _children(pid: int) -> list[int]:
    out = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                out.append(int(stat.split("/")[2]))
        except (OSError, IndexError, ValueError):
            pass
    return out


def _pss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class TreeMemory(threading.Thread):
    """Samples the summed PSS of a process and its descendants every ``period_s``; ``peak`` in bytes."""

    def __init__(self, pid: int, period_s: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.pid, self.period_s, self.peak = pid, period_s, 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            pids, i = [self.pid], 0
            while i < len(pids):
                pids.extend(_children(pids[i]))
                i += 1
            self.peak = max(self.peak, sum(_pss_bytes(p) for p in pids))
            self.stop.wait(self.period_s)


def measure(cmd: list[str], timeout_s: float) -> dict:
    """Run ``cmd``; wall seconds, peak RSS of its largest process, peak PSS of its tree, exit status, stderr."""
    err, out = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=REPO)
    mem = TreeMemory(proc.pid)
    mem.start()
    deadline = t0 + timeout_s
    status = usage = None
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            proc.kill()
            _, status, usage = os.wait4(proc.pid, 0)
            status = "timeout"
            break
        time.sleep(0.02)
    seconds = time.perf_counter() - t0
    proc.returncode = 0  # reaped by wait4 above
    mem.stop.set()
    mem.join()
    err.seek(0)
    tail = err.read().decode(errors="replace").strip().splitlines()[-1:]
    ok = status == 0
    out.seek(0)
    try:
        inner = float(out.read(100).decode().strip().splitlines()[-1])
    except (ValueError, IndexError, UnicodeDecodeError):
        inner = None
    return {"ok": ok, "seconds": seconds, "inner": inner, "rss": usage.ru_maxrss * 1024, "pss": mem.peak,
            "why": "" if ok else (f"timed out after {timeout_s:.0f} s" if status == "timeout"
                                  else f"exit {os.waitstatus_to_exitcode(status)}: {' '.join(tail)[:120]}")}


def measure_best(cmd: list[str], timeout_s: float, repeat: int) -> dict:
    """``measure`` ``repeat`` times; the fastest run (timeit's rule: slower runs measure other jobs on the cores)
    with ``median`` and ``runs`` added. A failed run is returned at once."""
    runs = []
    for _ in range(max(repeat, 1)):
        r = measure(cmd, timeout_s)
        if not r["ok"]:
            return r
        runs.append(r)
    best = min(runs, key=lambda r: r["seconds"])
    secs = sorted(r["seconds"] for r in runs)
    return {**best, "median": secs[len(secs) // 2], "runs": len(runs)}


def gaptrace_cli() -> list[str] | None:
    exe = shutil.which("gaptrace", path=os.path.dirname(sys.executable)) or shutil.which("gaptrace")
    if exe is None:
        return None
    probe = subprocess.run([exe, "analyze", "--help"], capture_output=True, text=True)
    return [exe] if probe.returncode == 0 else None


def rows_for(trace: str, args) -> list[tuple[str, dict | str]]:
    py = sys.executable
    rows: list[tuple[str, dict | str]] = [
        ("gaptrace load", measure_best([py, "-c", LOAD.format(workers=None, scan=None), trace], args.timeout,
                                       args.repeat)),
        ("gaptrace load, no decoder workers", measure_best([py, "-c", LOAD.format(workers=0, scan=None), trace],
                                                           args.timeout, args.repeat)),
        ("gaptrace load, msgspec only (no scanner)",
         measure_best([py, "-c", LOAD.format(workers=None, scan=False), trace], args.timeout, args.repeat)),
    ]
    cli = gaptrace_cli()
    rows.append(("gaptrace analyze --json",
                 measure_best(cli + ["analyze", trace, "--json"], args.timeout, args.repeat) if cli
                 else "pending: `gaptrace analyze` is not available yet"))
    if cli:
        with tempfile.TemporaryDirectory() as d:
            rows.append(("gaptrace report", measure_best(cli + ["report", trace, "-o", os.path.join(d, "r.html")],
                                                         args.timeout, args.repeat)))
    if not args.skip_stdlib:
        rows.append(("stdlib json.loads", measure([py, "-c", STDLIB, trace], args.timeout)))
    if not args.skip_hta:
        hta = hta_python()
        rows.append(("HTA load + temporal breakdown",
                     measure([hta, "-c", HTA, trace], args.timeout) if hta
                     else "cannot run: `import hta` fails here and there is no .venv-hta (python -m venv .venv-hta "
                          "&& .venv-hta/bin/pip install HolisticTraceAnalysis)"))
    return rows


def hta_python() -> str | None:
    """The interpreter to run HTA with: .venv-hta's, else this one, whichever imports ``hta``; None if neither."""
    for py in (HTA_PYTHON, sys.executable):
        if os.path.exists(py) and subprocess.run([py, "-c", "import hta"], capture_output=True).returncode == 0:
            return py
    return None


def scaling(source: str, sizes_gb: list[float], args) -> str:
    """``gaptrace analyze --json`` on SOURCE replicated to each size: a markdown table (see the module docstring)."""
    cli = gaptrace_cli()
    if cli is None:
        return "scaling: `gaptrace analyze` is not available"
    lines = [f"\nscaling: `gaptrace analyze --json` on {os.path.relpath(source, REPO)} replicated "
             f"({'Kineto layout' if args.kineto_format else 'compact, one event a line'}), fastest of {args.repeat}",
             "| JSON (MB) | events | seconds | runs: median seconds | s per GB | peak RSS, largest process (MB) "
             "| peak memory, all processes (PSS, MB) | growth exponent vs the row above |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    prev = None
    for gb in sizes_gb:
        path = os.path.join(args.scratch, f"gaptrace_scaling_{gb:g}gb.json")
        try:
            info = make_big_trace.build(source, path, int(gb * 1e9), False, 6, args.kineto_format)
            r = measure_best(cli + ["analyze", path, "--json"], args.timeout, args.repeat)
        finally:
            if os.path.exists(path):
                os.remove(path)
        mb = info["json_bytes"] / 1e6
        if not r["ok"]:
            lines.append(f"| {mb:,.0f} | {info['events']:,} | failed ({r['why']}) | | | | | |")
            continue
        growth = (f"{math.log(r['seconds'] / prev[1]) / math.log(mb / prev[0]):.2f}" if prev else "")
        lines.append(f"| {mb:,.0f} | {info['events']:,} | {r['seconds']:.2f} | {r['runs']}: {r['median']:.2f} | "
                     f"{r['seconds'] / (mb / 1e3):.2f} | {r['rss'] / 1e6:,.0f} | {r['pss'] / 1e6:,.0f} | {growth} |")
        prev = (mb, r["seconds"])
        print(lines[-1], file=sys.stderr, flush=True)
    return "\n".join(lines)


def table(trace: str, rows: list[tuple[str, dict | str]]) -> str:
    json_bytes = sum(json_size_bytes(f) for _, f in trace_files(trace))
    lines = [f"\n{trace}: {json_bytes / 1e6:,.0f} MB of JSON ({os.path.getsize(trace) / 1e6:,.0f} MB on disk)",
             "| tool | seconds | MB/s | peak RSS, largest process (MB) | peak memory, all processes (PSS, MB) "
             "| of the seconds: import + load_trace | runs: median seconds |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, r in rows:
        if isinstance(r, str):
            lines.append(f"| {name} | {r} | | | | | |")
        elif not r["ok"]:
            lines.append(f"| {name} | failed ({r['why']}) after {r['seconds']:.1f} s | | {r['rss'] / 1e6:,.0f} | "
                         f"{r['pss'] / 1e6:,.0f} | | |")
        else:
            inner = f"{r['inner']:.2f}" if r["inner"] is not None else ""
            rep = f"{r['runs']}: {r['median']:.2f}" if "runs" in r else "1"
            lines.append(f"| {name} | {r['seconds']:.2f} | {json_bytes / 1e6 / r['seconds']:,.0f} | "
                         f"{r['rss'] / 1e6:,.0f} | {r['pss'] / 1e6:,.0f} | {inner} | {rep} |")
    return "\n".join(lines)


def default_traces() -> list[str]:
    public = glob.glob(os.path.join(REPO, "fixtures", "traces", "*.json.gz"))
    largest = max(public, key=json_size_bytes)
    return [largest] + ([BIG_DEFAULT] if os.path.exists(BIG_DEFAULT) else [])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("traces", nargs="*", help="trace files or directories (default: see the module docstring)")
    p.add_argument("--skip-hta", action="store_true")
    p.add_argument("--skip-stdlib", action="store_true")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per run before it is killed")
    p.add_argument("--repeat", type=int, default=3,
                   help="runs of each gaptrace row; the table shows the fastest and the median")
    p.add_argument("--scaling", metavar="SOURCE", help="instead: analyze time and RSS of SOURCE replicated to each size")
    p.add_argument("--sizes-gb", default="0.1,0.5,1,2", help="sizes for --scaling, GB of JSON, comma-separated")
    p.add_argument("--kineto-format", action="store_true", help="--scaling writes Kineto's layout (make_big_trace)")
    p.add_argument("--scratch", default=tempfile.gettempdir(), help="where --scaling writes its traces")
    a = p.parse_args(argv)
    traces = a.traces or default_traces()
    try:
        load = os.getloadavg()
    except OSError:
        load = (float("nan"),) * 3
    mem_gib = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    print(f"# {platform.node()}: {os.cpu_count()} cores, {mem_gib:.0f} "
          f"GiB, Python {platform.python_version()}; load average at start {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} "
          "(other jobs on the same cores make every number slower)")
    if a.scaling:
        print(scaling(a.scaling, [float(x) for x in a.sizes_gb.split(",")], a), flush=True)
        return 0
    if BIG_DEFAULT not in traces and not a.traces:
        print(f"# no {BIG_DEFAULT}: build it with python benchmarks/make_big_trace.py {BIG_DEFAULT}")
    for trace in traces:
        print(table(trace, rows_for(trace, a)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
