"""A fleet of N rank traces analysed serially against a Dask LocalCluster of 1 and 2 workers; the table of wall
times and peak RSS per worker, and the per-rank times scaled to N machines.

The rank files are one real capture replicated in time to ``--size-mb`` of JSON (benchmarks/make_big_trace.py) and
copied N times (``fleet.rank<r>.json``; identical ranks, no collectives: this measures the per-rank analysis in
parallel, not the straggler pass, which costs one more load per late rank). Every configuration runs in a fresh
process (``--one``), one after the other:

- ``serial``: ``run_fleet(workers=0)``: each rank loaded and analysed in this process in turn (the loader forks
  its decoder processes for files of 128 MB and more, so it uses both cores there; below, one);
- ``local-1``, ``local-2``: a LocalCluster of that many worker processes, one thread each (inside a worker the
  loader decodes on the worker's own core).

Peak RSS: serial, the process's own and its decoder children's (ru_maxrss); a cluster, each worker's
(``client.run``). "N machines": the serial run's per-rank times packed longest-first onto M workers (the makespan),
plus the serial run's time outside the ranks (import, merge): a model of M machines each analysing its ranks the
serial way, not a measurement.

    python benchmarks/bench_fleet.py --ranks 8 --size-mb 200 [--source TRACE] [--workdir /tmp/gaptrace_fleet]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
DEFAULT_SOURCE = os.path.join(ROOT, "fixtures", "traces", "h200_fused", "h200_bench_overlap_bs8_B12_fused.json.gz")
CONFIGS = {"serial": 0, "local-1": 1, "local-2": 2}


def _one(config: str, directory: str) -> None:
    """Run one configuration in this (fresh) process and print its JSON line."""
    sys.path.insert(0, ROOT)
    t0 = time.perf_counter()
    from gaptrace.fleet import fleet_files, run_fleet

    res = run_fleet(fleet_files([directory]), workers=CONFIGS[config], progress=False)
    wall = time.perf_counter() - t0
    c = res["cluster"]
    peaks = dict(c["worker_peak_rss_bytes"] or {})
    if config == "serial":
        peaks = {"this process": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                 "decoder children (max)": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}
    print(json.dumps({"config": config, "wall_s": wall, "task_s": c["task_s"], "peak_rss_bytes": peaks,
                      "occupancy": [r["occupancy"] for r in res["ranks"]]}))


def _makespan(times: list[float], machines: int) -> float:
    """Longest-processing-time-first packing of ``times`` onto ``machines``: the largest machine load (s)."""
    loads = [0.0] * machines
    for t in sorted(times, reverse=True):
        i = loads.index(min(loads))
        loads[i] += t
    return max(loads)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--size-mb", type=float, default=200.0, help="JSON MB (1e6 bytes) per rank file")
    p.add_argument("--source", default=DEFAULT_SOURCE)
    p.add_argument("--workdir", default="/tmp/gaptrace_fleet_bench")
    p.add_argument("--configs", default="serial,local-1,local-2")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    p.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one:
        _one(a.one, a.dir)
        return
    d = os.path.join(a.workdir, "ranks")
    os.makedirs(d, exist_ok=True)
    big = os.path.join(a.workdir, "big.json")
    if not os.path.exists(big) or abs(os.path.getsize(big) - a.size_mb * 1e6) > 0.05 * a.size_mb * 1e6:
        subprocess.run([sys.executable, os.path.join(HERE, "make_big_trace.py"), big, "--source", a.source,
                        "--size-gb", str(a.size_mb / 1000)], check=True, stdout=subprocess.DEVNULL)
    for f in os.listdir(d):
        os.remove(os.path.join(d, f))
    for r in range(a.ranks):
        shutil.copyfile(big, os.path.join(d, f"fleet.rank{r}.json"))
    size = os.path.getsize(big)
    print(f"{a.ranks} ranks x {size / 1e6:,.0f} MB of JSON ({os.path.basename(a.source)} replicated), "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start")
    rows = []
    for config in a.configs.split(","):
        out = subprocess.run([sys.executable, __file__, "--one", config, "--dir", d], capture_output=True, text=True,
                             cwd=ROOT)
        if out.returncode != 0:
            print(f"{config}: failed: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}")
            continue
        row = json.loads(out.stdout.strip().splitlines()[-1])
        print("raw:", json.dumps(row))
        rows.append(row)
    base = next((r for r in rows if r["config"] == "serial"), None)
    print()
    print("| run | wall s | vs serial | per-rank load + analysis s (median) | peak RSS per worker MB |")
    print("| --- | ---: | ---: | ---: | --- |")
    for r in rows:
        ts = sorted(r["task_s"].values())
        med = ts[len(ts) // 2]
        peaks = ", ".join(f"{v / 1e6:,.0f}" for v in r["peak_rss_bytes"].values())
        speed = f"{base['wall_s'] / r['wall_s']:.2f}×" if base else "–"
        print(f"| {r['config']} | {r['wall_s']:.1f} | {speed} | {med:.2f} | {peaks} |")
    if base:
        times = list(base["task_s"].values())
        rest = base["wall_s"] - sum(times)
        print()
        print(f"Per-rank times of the serial run packed onto M machines (+ {rest:.1f} s outside the ranks):")
        print()
        print("| machines | predicted wall s | vs serial |")
        print("| ---: | ---: | ---: |")
        for m in sorted({m for m in (1, 2, 4, 8, a.ranks) if m <= a.ranks}):
            w = _makespan(times, m) + rest
            print(f"| {m} | {w:.1f} | {base['wall_s'] / w:.2f}× |")
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
