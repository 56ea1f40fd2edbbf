"""The Perfetto round trip at scale: `gaptrace annotate` on a big decode trace, then `gaptrace analyze --json` on
the annotated file against the original (the same figures), each command in its own process.

    python benchmarks/bench_annotate.py --size-gb 1.0 [--source TRACE] [--work DIR] [--reps 1]

The big trace is `benchmarks/make_big_trace.py --source TRACE` (a real capture replicated in time; default the
shipped runtime sync capture, Python stacks and CUDA-graph launches). Prints one table: wall seconds and peak RSS
(`os.wait4`) of each step, the annotated file's size, the slices written, and whether the two analyses agree
(every key of the JSON but `trace`).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SOURCE = os.path.join(HERE, "..", "fixtures", "traces", "h200_pairs", "bench_sync_bs8_B12.json.gz")


def timed(cmd: list[str]) -> tuple[float, float, str]:
    """(wall s, peak RSS MB, stdout) of one command in a fresh process (``os.wait4``: that process's own peak);
    raises SystemExit on a non-zero exit."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out, stderr=err)
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        out.seek(0), err.seek(0)
        if os.waitstatus_to_exitcode(status):
            raise SystemExit(f"{' '.join(cmd)} failed: {err.read().decode(errors='replace').strip()}")
        return wall, usage.ru_maxrss / 1024, out.read().decode()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gb", type=float, default=1.0)
    ap.add_argument("--source", default=DEFAULT_SOURCE)
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "gaptrace_bench_annotate"))
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    big = os.path.join(a.work, f"big_{a.size_gb:g}gb.json")
    if not os.path.exists(big):
        subprocess.run([sys.executable, os.path.join(HERE, "make_big_trace.py"), big, "--size-gb", str(a.size_gb),
                        "--source", a.source], check=True, stdout=subprocess.DEVNULL)
    out = os.path.join(a.work, "big.annotated.json")
    g = [sys.executable, "-m", "gaptrace.cli"]
    rows = []
    w, r, text = timed(g + ["annotate", big, "-o", out])
    rows.append(("annotate", w, r, text.strip()))
    w, r, ja = timed(g + ["analyze", big, "--json"])
    rows.append(("analyze original --json", w, r, ""))
    w, r, jb = timed(g + ["analyze", out, "--json"])
    rows.append(("analyze annotated --json", w, r, ""))
    da, db = json.loads(ja), json.loads(jb)
    da.pop("trace", None), db.pop("trace", None)
    print(f"source {os.path.relpath(a.source)} replicated to {os.path.getsize(big) / 1e6:,.0f} MB; annotated file "
          f"{os.path.getsize(out) / 1e6:,.0f} MB; analyses agree: {da == db}; load average "
          f"{os.getloadavg()[0]:.1f}\n")
    print("| step | wall s | peak RSS MB | output |")
    print("| --- | --- | --- | --- |")
    for name, w, r, text in rows:
        print(f"| {name} | {w:.1f} | {r:,.0f} | {text} |")


if __name__ == "__main__":
    main()
