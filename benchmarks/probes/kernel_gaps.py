"""Per-kernel idle table of a Kineto trace: for each (launch API, kernel name) the number of device activities,
the idle before them (the gap from the device's previous activity end, all streams merged) and their busy time,
sorted by idle. How the fused path's attention and node bubbles were found; the figures are the same
union-of-activities gaps `gaptrace analyze` counts, split by the activity that ends each gap.

    python benchmarks/probes/kernel_gaps.py TRACE.json.gz [--top 25]
"""
from __future__ import annotations

import argparse
import gzip
import json
import re
from collections import defaultdict


def short(name: str) -> str:
    """A kernel name without its template arguments and namespaces, 50 characters at most."""
    name = re.sub(r"<.*", "", name).replace("void ", "").replace("at::native::", "")
    return name.replace("(anonymous namespace)::", "")[:50]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    opener = gzip.open if a.trace.endswith(".gz") else open
    with opener(a.trace, "rt") as f:
        ev = json.load(f)["traceEvents"]
    acts = sorted((e for e in ev if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                  key=lambda e: e["ts"])
    api = {e["args"].get("correlation"): e["name"] for e in ev
           if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver") and "args" in e}
    rows: dict = defaultdict(lambda: [0, 0.0, 0.0])
    end = None
    for e in acts:
        r = rows[(api.get(e.get("args", {}).get("correlation"), "?"), short(e["name"]))]
        r[0] += 1
        r[1] += max(0.0, e["ts"] - end) if end is not None else 0.0
        r[2] += e["dur"]
        end = e["ts"] + e["dur"] if end is None else max(end, e["ts"] + e["dur"])
    print(f"{'launch':18} {'kernel':50} {'n':>6} {'idle before µs':>14} {'busy µs':>10} {'mean idle µs':>12}")
    for (l, k), (n, g, d) in sorted(rows.items(), key=lambda kv: -kv[1][1])[: a.top]:
        print(f"{l[:18]:18} {k:50} {n:6} {g:14.1f} {d:10.1f} {g / n:12.2f}")


if __name__ == "__main__":
    main()
