"""What timing record_function blocks costs an unprofiled step (gaptrace.rangetimes.RecordFunctionTimes, installed by
gaptrace.capture.Capture over its kept warm-up steps): ns per ``with torch.profiler.record_function(...)`` block,
plain, with the timer installed but inactive, and with it active; each variant in a fresh process.

    python benchmarks/bench_range_timer.py [--blocks 200000] [--repeats 5]

Prints one table: the median over repeats of ns per block, and the timer's added ns per block.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from benchmarks._results import fmt, md_table  # noqa: E402

CHILD = r"""
import json, sys, time
import torch
from gaptrace.rangetimes import RecordFunctionTimes
mode, n = sys.argv[1], int(sys.argv[2])
timer = RecordFunctionTimes()
if mode != "plain":
    timer.install()
    timer.active = mode == "active"
rf = torch.profiler.record_function
for _ in range(1000):  # warm-up
    with rf("x"):
        pass
t0 = time.perf_counter_ns()
for _ in range(n):
    with rf("x"):
        pass
dt = time.perf_counter_ns() - t0
timer.uninstall()
print(json.dumps({"ns_per_block": dt / n}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    modes = ("plain", "installed", "active")
    got: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(a.repeats):
        for m in modes:  # interleaved, each in a fresh process
            out = subprocess.run([sys.executable, "-c", CHILD, m, str(a.blocks)], check=True, capture_output=True,
                                 text=True, cwd=os.path.join(HERE, "..")).stdout
            got[m].append(json.loads(out.strip().splitlines()[-1])["ns_per_block"])
    base = statistics.median(got["plain"])
    rows = [[m, fmt(statistics.median(v), 0), f"{fmt(min(v), 0)}–{fmt(max(v), 0)}",
             fmt(statistics.median(v) - base, 0)] for m, v in got.items()]
    print(md_table(["record_function block", "ns per block (median)", "range over repeats", "added ns"], rows))


if __name__ == "__main__":
    main()
