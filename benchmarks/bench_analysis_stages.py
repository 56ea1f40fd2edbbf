"""Wall time of ``gaptrace analyze``'s stages on one trace: load_raw, build_trace, summarize + to_json.

``python benchmarks/bench_analysis_stages.py TRACE [--runs N] [--profile]`` runs each repetition in a fresh process
and prints a markdown table (every run, then the fastest); ``--profile`` adds, from one more run under cProfile, the
cumulative seconds of the analyses' main functions. The code measured is whatever ``import gaptrace`` finds (a copy
of another commit on PYTHONPATH measures that commit).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

_CHILD = r"""
import cProfile, json, pstats, sys, time
t = time.perf_counter()
from gaptrace.loader import load_raw
from gaptrace.trace import build_trace
from gaptrace.analyses.summary import summarize
path, prof = sys.argv[1], sys.argv[2] == "1"
t1 = time.perf_counter()
raw, md = load_raw(path)
t2 = time.perf_counter()
tr = build_trace(raw, path, md)
t3 = time.perf_counter()
if prof:
    pr = cProfile.Profile(); pr.enable()
summarize(tr).to_json()
t4 = time.perf_counter()
out = {"import_s": t1 - t, "load_raw_s": t2 - t1, "build_trace_s": t3 - t2, "analyses_s": t4 - t3}
if prof:
    pr.disable()
    st = pstats.Stats(pr)
    cum = {}
    for (f, line, name), (cc, nc, tt, ct, callers) in st.stats.items():
        if "/analyses/" in f.replace("\\", "/"):
            key = f.replace("\\", "/").split("/analyses/")[-1] + ":" + name
            cum[key] = max(ct, cum.get(key, 0.0))
    out["profile"] = sorted(cum.items(), key=lambda kv: -kv[1])[:20]
print(json.dumps(out))
"""


def run(trace: str, prof: bool) -> dict:
    r = subprocess.run([sys.executable, "-c", _CHILD, trace, "1" if prof else "0"], capture_output=True, text=True,
                       check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    rows = [run(a.trace, False) for _ in range(a.runs)]
    cols = ["load_raw_s", "build_trace_s", "analyses_s"]
    print(f"trace: {a.trace}\n\n| run | " + " | ".join(cols) + " |\n|---|" + "---|" * len(cols))
    for i, r in enumerate(rows, 1):
        print(f"| {i} | " + " | ".join(f"{r[c]:.2f}" for c in cols) + " |")
    print("| fastest | " + " | ".join(f"{min(r[c] for r in rows):.2f}" for c in cols) + " |")
    if a.profile:
        p = run(a.trace, True)
        print(f"\nunder cProfile (analyses {p['analyses_s']:.2f} s), cumulative s:\n\n| function | s |\n|---|---|")
        for name, s in p["profile"]:
            print(f"| {name} | {s:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
