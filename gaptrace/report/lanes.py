"""Annotation ranges (NVTX / ``record_function``) laid out in lanes under the occupancy strip.

Host ranges (``user_annotation``) and their GPU projections (``gpu_user_annotation``) each get one lane per nesting
depth, as Nsight Systems draws NVTX rows. When a lane holds very many ranges, neighbours closer than one strip bin are
merged into one bar that says how many ranges it stands for, so a long trace's report stays small.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .stacks import nest_parents

__all__ = ["annotation_lanes"]

MAX_DEPTH = 4  # lanes per source (host, GPU)
MAX_BARS_PER_LANE = 400


def _merge_lane(start: np.ndarray, end: np.ndarray, name: np.ndarray, min_gap_us: float) -> pd.DataFrame:
    """Merge ranges (sorted by start) whose start lies within ``min_gap_us`` of the running end of the bar before.

    Returns columns start_us, end_us, name (the common name, or "" when a bar merges different names), count.
    """
    run_end = np.maximum.accumulate(end)
    new = np.r_[True, start[1:] > run_end[:-1] + min_gap_us]
    first = np.flatnonzero(new)
    last = np.r_[first[1:] - 1, len(start) - 1]
    codes, uniq = pd.factorize(name)
    lo = np.minimum.reduceat(codes, first)
    hi = np.maximum.reduceat(codes, first)
    names = np.where(lo == hi, np.asarray(uniq, dtype=object)[lo], "")
    return pd.DataFrame({"start_us": start[first], "end_us": run_end[last], "name": names,
                         "count": last - first + 1})


def annotation_lanes(host: pd.DataFrame, gpu_annotations: pd.DataFrame, t0_us: float, t1_us: float,
                     n_bins: int = 1500) -> pd.DataFrame:
    """Bars for the annotation ranges that overlap the window [t0_us, t1_us], clipped to it.

    Returns one row per bar: ``lane`` ("host ranges", "host nested 1", ..., "GPU ranges", ...: source and nesting depth),
    ``start_us``, ``end_us``, ``name`` (range name; "" for a bar merging different names), ``count`` (ranges the
    bar stands for). A lane with more than MAX_BARS_PER_LANE ranges is merged at the strip's bin width
    (window / n_bins), then at doubling widths until it fits. Vectorised; loops over lanes only.
    """
    cols = ["lane", "start_us", "end_us", "name", "count"]
    parts = []
    sources = [("host", host[host["cat"] == "user_annotation"], ["pid", "tid"]) if len(host) else None,
               ("GPU", gpu_annotations, ["device", "stream"]) if len(gpu_annotations) else None]
    for src in sources:
        if src is None:
            continue
        label, frame, keys = src
        frame = frame[(frame["end_us"] > t0_us) & (frame["ts_us"] < t1_us)]
        if frame.empty:
            continue
        group, _ = pd.factorize(pd.MultiIndex.from_arrays([frame[k].astype(str) for k in keys]))
        s = frame["ts_us"].to_numpy()
        e = frame["end_us"].to_numpy()
        _, depth = nest_parents(group, s, e)
        names = frame["name"].astype(str).to_numpy(dtype=object)
        for d in range(min(int(depth.max()) + 1, MAX_DEPTH)):
            m = depth == d
            order = np.argsort(s[m], kind="stable")
            ls, le, ln = np.maximum(s[m][order], t0_us), np.minimum(e[m][order], t1_us), names[m][order]
            gap = 0.0
            bars = pd.DataFrame({"start_us": ls, "end_us": le, "name": ln, "count": np.ones(len(ls), int)})
            width = (t1_us - t0_us) / max(n_bins, 1)
            while len(bars) > MAX_BARS_PER_LANE and width > 0:
                gap = width if gap == 0 else gap * 2
                bars = _merge_lane(ls, le, ln, gap)
            bars.insert(0, "lane", f"{label} ranges" if d == 0 else f"{label} nested {d}")
            parts.append(bars)
    if not parts:
        return pd.DataFrame({c: [] for c in cols})
    return pd.concat(parts, ignore_index=True)[cols]
