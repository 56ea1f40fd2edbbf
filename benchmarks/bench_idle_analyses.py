"""Time the host-nesting, occupancy and gap-attribution analyses on a big trace model, with no parsing involved.

A real trace is loaded once and its frames are replicated k times in time, in memory (copy k shifted by
k * (span + 1 ms)), until the host frame holds about ``--host-events`` rows (a 1 GB Kineto trace of owlv2 holds
about 2.8 M host events among 3.7 M). Then each analysis runs on the big model and its seconds are printed as a
table, with events per second. Loading is benchmarked elsewhere; this isolates the analyses.

    python benchmarks/bench_idle_analyses.py [--source TRACE] [--host-events 2800000]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import numpy as np
import pandas as pd

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SOURCE = os.path.join(HERE, "..", "fixtures", "traces", "tracelens_h100_owlv2.json.gz")


def replicate(trace, k: int):
    """The trace's frames repeated k times in time (ids are not offset: the analyses here join on time only)."""
    lo = min(trace.host["ts_us"].min(), trace.device["ts_us"].min())
    hi = max(trace.host["end_us"].max(), trace.device["end_us"].max())
    period = (hi - lo) + 1000.0

    def rep(df: pd.DataFrame) -> pd.DataFrame:
        if df.empty:
            return df
        parts = []
        for i in range(k):
            d = df.copy()
            for c in ("ts_us", "end_us"):
                d[c] = d[c] + i * period
            parts.append(d)
        return pd.concat(parts, ignore_index=True)

    return dataclasses.replace(trace, host=rep(trace.host), device=rep(trace.device),
                               gpu_annotations=rep(trace.gpu_annotations), path=trace.path + f" x{k}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", default=DEFAULT_SOURCE)
    ap.add_argument("--host-events", type=int, default=2_800_000)
    args = ap.parse_args()

    from gaptrace.analyses.gaps import event_idle, gap_attribution, gap_table
    from gaptrace.analyses.occupancy import occupancy
    from gaptrace.analyses.stacks import frame_stacks, host_tree, innermost_op, innermost_site
    from gaptrace.loader import load_trace

    src = load_trace(args.source)
    k = max(1, round(args.host_events / max(len(src.host), 1)))
    big = replicate(src, k)
    n_host, n_dev = len(big.host), len(big.device)
    rows = []

    def timed(name, fn):
        t0 = time.perf_counter()
        out = fn()
        rows.append((name, time.perf_counter() - t0))
        return out

    timed("occupancy (all devices)", lambda: occupancy(big))
    tree = timed("host_tree", lambda: host_tree(big))
    r = timed("event_idle (inclusive + self)", lambda: event_idle(big))
    table = timed("gap_attribution (frame table)", lambda: gap_attribution(big, result=r))
    gaps = timed("gap_table (per gap)", lambda: gap_table(big, result=r))
    syncs = np.flatnonzero(big.host["name"].isin(["cudaMemcpyAsync", "cudaStreamSynchronize",
                                                   "cudaDeviceSynchronize"]).to_numpy())
    timed(f"site + op + stacks ({len(syncs):,} sync calls)",
          lambda: (innermost_site(tree, syncs), innermost_op(tree, syncs), frame_stacks(tree, innermost_site(tree, syncs))))

    total = sum(s for _, s in rows)
    print(f"source {os.path.basename(args.source)} x{k}: {n_host:,} host events, {n_dev:,} device activities, "
          f"max depth {tree.max_depth}, {tree.partial_overlaps:,} partial overlaps, {len(gaps):,} gaps, "
          f"{len(table):,} frames with idle")
    print(f"{'analysis':<44} {'seconds':>8} {'host events/s':>14}")
    for name, s in rows:
        print(f"{name:<44} {s:>8.2f} {n_host / s:>14,.0f}")
    print(f"{'total':<44} {total:>8.2f} {n_host / total:>14,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
