"""The profiler's host cost per recorded event on real loops, read off the shipped captures' measured ranges.

    python benchmarks/bench_range_costs.py [--all] [TRACE.json.gz ...]   (default: every shipped capture with a sidecar)

A capture's sidecar times its ``record_function`` / NVTX ranges without the profiler (``unprofiled_ranges``:
docs/DESIGN.md 5.2 "Measured ranges"). For each such range the trace holds on its thread, Δ = its mean profiled µs per
occurrence − its measured unprofiled µs per occurrence is what the profiler added, and the events inside it (Python
frames, ATen ops, CUDA runtime calls, per occurrence) are what it recorded. Ranges that hold a graph launch (κ·N, the
launch fit's, not a per-event cost), a blocking call or a lock wait (their waits differ between the two runs) are left
out.

Prints, per fitted range (every range with ``--all``), Δ and the counts beside what the trace's GPU model's shipped calibration estimates for them; then,
per GPU model, the per-event costs that fit every kept range at once (:func:`gaptrace.calibrate.fit_costs`: the
non-negative least-squares solution, each range weighed by its event count, as calibrate weighs its benchmarks) beside
the calibration's. A check of the calibration on loops it was not measured on, not a calibration: the measured ranges
of one capture are few and collinear, and their fit is read here, never used by the analyses.
"""
from __future__ import annotations

import argparse
import glob
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, ROOT)

from benchmarks._results import fmt, md_table  # noqa: E402
from gaptrace.analyses.profiler_cost import (THREAD_WAIT_PREFIX, load_calibration,  # noqa: E402
                                             shipped_calibration_path)
from gaptrace.calibrate import CATS, fit_costs  # noqa: E402
from gaptrace.loader import load_trace  # noqa: E402
from gaptrace.sidecar import read_sidecar  # noqa: E402

BLOCKING = ("Synchronize", "cudaMemcpy", "cudaStreamWaitEvent")  # a call whose wait is the device's, not the host's
GRAPH_LAUNCH = "GraphLaunch"


def range_rows(path: str) -> list[dict]:
    """One row per measured range of the capture at ``path``: name, occurrences, profiled and measured µs per
    occurrence, events per occurrence by category (``CATS``), and whether it holds a graph launch, a blocking call or a
    lock wait (a Queue.get, Condition.wait: the waited-for thread's time)."""
    side = read_sidecar(path)
    if not side or not side.get("unprofiled_ranges"):
        return []
    t = load_trace(path)
    h = t.host
    dev = t.device_name(0) if len(t.device) else ""
    ua = h[h["cat"].astype(str) == "user_annotation"]
    out = []
    for r in side["unprofiled_ranges"]:
        occ = ua[ua["name"].astype(str) == r["name"]]
        if not len(occ):
            continue
        tid = occ["tid"].astype(str).mode().iloc[0]
        occ = occ[occ["tid"].astype(str) == tid]
        hh = h[h["tid"].astype(str) == tid]
        ts, te = hh["ts_us"].to_numpy(), hh["end_us"].to_numpy()
        cats, names = hh["cat"].astype(str).to_numpy(), hh["name"].astype(str).to_numpy()
        calls = np.isin(cats, ("cuda_runtime", "cuda_driver"))
        counts = {c: 0 for c in CATS}
        profiled, held = 0.0, set()
        for s, e in zip(occ["ts_us"].to_numpy(), occ["end_us"].to_numpy()):
            inside = (ts >= s) & (te <= e)
            for c in CATS:
                counts[c] += int(np.sum(inside & (cats == c)))
            for nm in names[inside & calls]:
                if GRAPH_LAUNCH in nm:
                    held.add("graph launch")
                if any(b in nm for b in BLOCKING):
                    held.add("blocking call")
            if any(nm.startswith(THREAD_WAIT_PREFIX) for nm in names[inside & (cats == "python_function")]):
                held.add("lock wait")  # the waited-for thread's time, not this one's events
            profiled += e - s
        n = len(occ)
        out.append({"trace": os.path.basename(path), "device": dev, "name": r["name"], "n": n,
                    "profiled_us": profiled / n, "measured_us": float(r["mean_us"]),
                    "events": {c: counts[c] / n for c in CATS}, "held": sorted(held)})
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("traces", nargs="*")
    ap.add_argument("--all", action="store_true", help="list the left-out ranges too (default: the fitted ones)")
    a = ap.parse_args(argv)
    paths = a.traces or sorted(p for p in glob.glob(os.path.join(ROOT, "fixtures", "traces", "*", "*.json.gz"))
                               if read_sidecar(p))
    rows = [r for p in paths for r in range_rows(p)]
    kept = [r for r in rows if not r["held"]]
    cals = {d: load_calibration(shipped_calibration_path(d)) for d in {r["device"] for r in rows}}

    def estimate(r: dict) -> float:
        c = cals[r["device"]]
        ev = r["events"]
        return (ev["python_function"] * c.python_frame_us + ev["cpu_op"] * c.aten_op_us
                + ev["cuda_runtime"] * (c.runtime_call_us + c.device_op_us))

    print("# The profiler's cost per event on real loops, from the captures' measured ranges\n")
    print("`python benchmarks/bench_range_costs.py`. Δ = profiled − measured unprofiled µs per occurrence; the "
          "estimate is the shipped calibration's for the events inside (runtime calls at runtime-call + device-op "
          "cost). Left out of the fit: ranges holding a graph launch, a blocking call or a lock wait.\n")
    print(md_table(["capture", "range", "n", "profiled µs", "measured µs", "Δ µs", "calibration estimate µs",
                    "Python frames", "ATen ops", "runtime calls", "left out"],
                   [[r["trace"], f"`{r['name']}`", r["n"], fmt(r["profiled_us"], 1), fmt(r["measured_us"], 1),
                     fmt(r["profiled_us"] - r["measured_us"], 1), fmt(estimate(r), 1),
                     fmt(r["events"]["python_function"], 1), fmt(r["events"]["cpu_op"], 1),
                     fmt(r["events"]["cuda_runtime"], 1), ", ".join(r["held"]) or "-"]
                    for r in (rows if a.all else kept)]))
    if not a.all:
        print(f"\n{len(rows) - len(kept)} more ranges left out (a graph launch, a blocking call or a lock wait "
              "inside): `--all` lists them.")
    print()
    table = []
    for dev in sorted(cals):
        sel = [r for r in kept if r["device"] == dev]
        if not sel:
            continue
        fit_rows = [{"events": r["events"], "plain_s": r["measured_us"] * 1e-6, "profiled_s": r["profiled_us"] * 1e-6}
                    for r in sel]
        cats, cost = fit_costs(fit_rows)
        fitted = dict(zip(cats, cost))
        c = cals[dev]
        shipped = {"python_function": c.python_frame_us, "cpu_op": c.aten_op_us,
                   "cuda_runtime": c.runtime_call_us + c.device_op_us}
        d = np.array([r["profiled_us"] - r["measured_us"] for r in sel])
        e = np.array([estimate(r) for r in sel])
        table.append([dev, len(sel)] + [f"{fmt(fitted.get(k), 2)} / {fmt(shipped[k], 2)}" for k in CATS]
                     + [f"{fmt(float(d.sum()), 0)} / {fmt(float(e.sum()), 0)}"])
    print(md_table(["GPU", "ranges fitted", "µs per Python frame: fitted / calibration", "per ATen op",
                    "per runtime call", "Σ Δ µs: measured / calibration"], table))


if __name__ == "__main__":
    main()
