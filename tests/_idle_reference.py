"""Plain, obviously-correct reference computations for the occupancy / gaps / stacks tests.

Everything here reads the trace with stdlib ``json`` and loops in Python: slow and simple on purpose, and shares
no code with gaptrace.analyses.
"""
from __future__ import annotations

import bisect
import gzip
import json
import os

TRACES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "traces")
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}


def trace_path(name: str) -> str:
    return os.path.join(TRACES, name + ".json.gz")


def raw_events(name: str) -> list[dict]:
    with gzip.open(trace_path(name)) as f:
        doc = json.load(f)
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def device_intervals(events: list[dict], device: int | None = None) -> list[tuple[float, float]]:
    out = []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in DEVICE_CATS:
            continue
        args = e.get("args") or {}
        dev = args.get("device", e.get("pid"))
        if device is not None and int(dev) != device:
            continue
        out.append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    return out


def merge(intervals: list[tuple[float, float]]) -> list[list[float]]:
    """Sorted union of closed intervals; touching intervals merge."""
    spans: list[list[float]] = []
    for s, e in sorted(intervals):
        if spans and s <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], e)
        else:
            spans.append([s, e])
    return spans


class Busy:
    """Busy spans of a device clipped to [t0, t1], with a brute-force idle(s, e)."""

    def __init__(self, intervals: list[tuple[float, float]], t0: float | None = None, t1: float | None = None):
        spans = merge(intervals)
        self.t0 = spans[0][0] if t0 is None else t0
        self.t1 = spans[-1][1] if t1 is None else t1
        self.spans = [[max(s, self.t0), min(e, self.t1)] for s, e in spans if min(e, self.t1) > max(s, self.t0)]
        self.starts = [s for s, _ in self.spans]

    @property
    def busy(self) -> float:
        return sum(e - s for s, e in self.spans)

    @property
    def idle(self) -> float:
        return (self.t1 - self.t0) - self.busy

    def gaps(self) -> list[tuple[float, float]]:
        out, t = [], self.t0
        for s, e in self.spans:
            if s > t:
                out.append((t, s))
            t = max(t, e)
        if self.t1 > t:
            out.append((t, self.t1))
        return out

    def idle_between(self, s: float, e: float) -> float:
        s, e = max(s, self.t0), min(e, self.t1)
        if e <= s:
            return 0.0
        busy = 0.0
        k = max(bisect.bisect_right(self.starts, s) - 1, 0)
        while k < len(self.spans) and self.spans[k][0] < e:
            busy += max(0.0, min(e, self.spans[k][1]) - max(s, self.spans[k][0]))
            k += 1
        return (e - s) - busy

    def idle_under_union(self, intervals: list[tuple[float, float]]) -> float:
        return sum(self.idle_between(s, e) for s, e in merge(intervals))
