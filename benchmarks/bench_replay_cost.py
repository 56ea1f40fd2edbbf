"""What the what-if replay adds to ``gaptrace analyze`` on big decode traces (docs/DESIGN.md "Cost").

For each size, the shipped H200 capture of the sync scheduler (``--source``, a decode with verify rounds, Python
stacks and CUDA-graph launches) is replicated to that many GB of JSON (:mod:`make_big_trace`, in ``--scratch``,
deleted after its row); then, in a fresh process per run, the trace is loaded and analysed as ``gaptrace analyze``
does (:func:`gaptrace.analyses.summary.summarize`), with the replay's three steps timed inside that run:
``savings.build_context`` (the replay model, the unprofiled inputs and the baseline replay), ``savings.whatif_block``
and ``savings.rank_findings`` (one replay per finding). The table: load seconds, analysis seconds, of which the
replay, and the replay as a share of load + analysis (the issue's target: ≤ 30%). Fastest of ``--repeat`` runs by
total, the median total beside it. The replicated trace has no capture sidecar, so the replay is not fitted to
measured unprofiled rounds (one bisection fewer than on a capture with one).

    python benchmarks/bench_replay_cost.py [--sizes-gb 0.1,0.5,1] [--repeat 3] [--scratch /tmp]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_SOURCE = os.path.join(ROOT, "fixtures", "traces", "h200_pairs", "bench_sync_bs8_B12.json.gz")

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
from gaptrace import load_trace
from gaptrace.analyses import savings, summary
spent = {"replay_s": 0.0}
def timed(fn):
    def wrap(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            spent["replay_s"] += time.perf_counter() - t
    return wrap
for name in ("build_context", "whatif_block", "rank_findings"):
    setattr(savings, name, timed(getattr(savings, name)))
t1 = time.perf_counter()
tr = load_trace(sys.argv[1])
t2 = time.perf_counter()
s = summary.summarize(tr)
t3 = time.perf_counter()
w = s.whatif or {}
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "analysis_s": t3 - t2, "replay_s": spent["replay_s"],
                  "events": int(len(tr.host) + len(tr.device)), "findings": len(s.findings or []),
                  "rounds": w.get("rounds")}))
"""


def run_once(path: str) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, path], capture_output=True, text=True, cwd=ROOT, timeout=1800)
    if r.returncode != 0:
        raise SystemExit(f"analysis of {path} failed: {r.stderr.strip().splitlines()[-1] if r.stderr else r.returncode}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", default=DEFAULT_SOURCE)
    p.add_argument("--sizes-gb", default="0.1,0.5,1")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--scratch", default=tempfile.gettempdir())
    a = p.parse_args(argv)
    try:
        sizes = [float(x) for x in a.sizes_gb.split(",") if x]
    except ValueError:
        p.error(f"--sizes-gb must be numbers (got {a.sizes_gb!r})")
    if not sizes or min(sizes) <= 0 or a.repeat < 1:
        p.error("--sizes-gb needs sizes > 0 and --repeat at least 1")
    if not os.path.isdir(a.scratch):
        p.error(f"--scratch {a.scratch}: no such directory")
    print(f"# source {os.path.relpath(a.source, ROOT)}; {os.cpu_count()} cores; load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print("| size GB | events | load s | analysis s | of it the replay s | replay / (load + analysis) | "
          "runs: median total s |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for gb in sizes:
        path = os.path.join(a.scratch, f"gaptrace_replay_cost_{gb:g}.json")
        subprocess.run([sys.executable, os.path.join(HERE, "make_big_trace.py"), path, "--source", a.source,
                        "--size-gb", str(gb)], check=True, capture_output=True, cwd=ROOT)
        try:
            runs = [run_once(path) for _ in range(a.repeat)]
        finally:
            os.remove(path)
        tot = sorted(r["load_s"] + r["analysis_s"] for r in runs)
        best = min(runs, key=lambda r: r["load_s"] + r["analysis_s"])
        t = best["load_s"] + best["analysis_s"]
        print(f"| {gb:g} | {best['events']:,} | {best['load_s']:.2f} | {best['analysis_s']:.2f} | "
              f"{best['replay_s']:.2f} | {best['replay_s'] / t:.1%} | {len(runs)}: {tot[len(tot) // 2]:.2f} |",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
