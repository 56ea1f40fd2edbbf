"""Rebuild a pairs folder's ``pairs.json`` from its captures' sidecars (fixtures/traces/h200_pairs/MANIFEST.md).

    python maintainer/pairs_json.py fixtures/traces/h200_pairs

Keeps each pair's definition (``pair``, ``with_cause``, ``fixed``, ``cause``, ``fix``) from the existing file and
recomputes from every ``NAME.gaptrace.json`` next to it: per capture the median and quartiles of its
``unprofiled_round_ms`` (the unprofiled verify-round periods of the capture's own process); per pair the measured
saving (mean of the with-cause medians − mean of the fixed medians) and its range (min with − max fixed to max with −
min fixed). Written to a temporary file, then renamed.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile


def capture_stats(folder: str, name: str) -> dict:
    with open(os.path.join(folder, name + ".gaptrace.json")) as f:
        p = [float(v) for v in json.load(f)["unprofiled_round_ms"]]
    q = statistics.quantiles(p, n=4)
    return {"median_ms": round(statistics.median(p), 4), "q1_ms": round(q[0], 4), "q3_ms": round(q[2], 4),
            "rounds": len(p)}


def main(folder: str) -> int:
    path = os.path.join(folder, "pairs.json")
    with open(path) as f:
        old = json.load(f)
    names = sorted({n for pr in old["pairs"] for n in pr["with_cause"] + pr["fixed"]})
    caps = {n: capture_stats(folder, n) for n in names}
    pairs = []
    for pr in old["pairs"]:
        w = [caps[n]["median_ms"] for n in pr["with_cause"]]
        x = [caps[n]["median_ms"] for n in pr["fixed"]]
        pairs.append({k: pr[k] for k in ("pair", "with_cause", "fixed", "cause", "fix")} | {
            "measured_with_cause_ms": w, "measured_fixed_ms": x,
            "measured_saving_ms": round(statistics.fmean(w) - statistics.fmean(x), 4),
            "measured_saving_range_ms": [round(min(w) - max(x), 4), round(max(w) - min(x), 4)]})
    out = {"captures": caps, "pairs": pairs,
           "unit_note": "median of each capture's unprofiled_round_ms (host period between verify rounds, "
                        "unprofiled, in the capture's own process: the last 30 of 40 warm-up rounds)"}
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]) if len(sys.argv) == 2 else (print(__doc__.splitlines()[2].strip(), file=sys.stderr) or 2))
