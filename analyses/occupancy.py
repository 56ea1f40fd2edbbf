"""Occupancy per device over a window: busy time (union of kernel, memcpy, memset over all streams) / window length.

DESIGN.md "Busy / occupancy" and "Gap": busy time is the union of a device's activity intervals; occupancy of a
window = busy time inside it / window length; a gap is a maximal idle interval inside the window. Devices are keyed
by (rank, device). The arithmetic lives in :class:`gaptrace.analyses.timeline.BusyTimeline`; this module picks
the window and the device and tabulates.

Windows (:func:`resolve_window`):
- ``None``: the device's first to last activity;
- ``"NAME"``: the span of the annotations called NAME (first start to last end): the gpu_user_annotation ranges
  on that device when it has any, else the host user_annotation ranges of that rank (record_function / NVTX
  mirrored ranges); TraceError naming the window and the annotation names available when none match;
- ``(t0_us, t1_us)``: an explicit window on the trace's clock.
"""
from __future__ import annotations

from typing import Any

import dataclasses

import numpy as np
import pandas as pd

from gaptrace.trace import Trace, TraceError

from .timeline import BusyTimeline, merge_intervals

__all__ = [
    "DeviceOccupancy",
    "resolve_device",
    "resolve_window",
    "busy_timeline",
    "device_occupancy",
    "occupancy",
    "busy_fraction_bins",
    "device_side_gaps",
    "graph_node_gaps",
    "node_bubbles",
    "short_kernel_name",
    "launch_links",
    "fill_device_side",
]

@dataclasses.dataclass(frozen=True)
class DeviceOccupancy:
    """Occupancy of one device over one window. Times in µs on the trace's clock; occupancy in [0, 1]."""

    rank: int
    device: int
    name: str
    window: str  # "activity" (first to last device activity), the annotation name, or "explicit"
    window_start_us: float
    window_end_us: float
    window_us: float
    busy_us: float
    idle_us: float
    occupancy: float
    gaps: int


def resolve_device(trace: Trace, device: int | tuple[int, int] | None = None) -> tuple[int, int]:
    """``(rank, device)`` for ``device`` given as an int (rank 0 first, then any rank), a pair, or None.

    None picks the busiest device (most busy µs over its own activity span). TraceError if the trace has no
    device activity or the device is not in it.
    """
    ids, groups = _device_index(trace)
    if not ids:
        raise TraceError(f"{trace.path}: no GPU activity (kernel/memcpy/memset): occupancy cannot be computed")
    if device is None:
        memo = _timeline_cache(trace)
        if "busiest" not in memo:
            busy = [busy_timeline(trace, d).busy_us for d in ids]
            memo["busiest"] = ids[int(np.argmax(busy))]
        return memo["busiest"]
    if isinstance(device, tuple):
        key = (int(device[0]), int(device[1]))
        if key in groups:
            return key
    else:
        match = [d for d in ids if d[1] == int(device)]
        if match:
            return match[0]
    known = ", ".join(f"{d}" if r == 0 else f"{d} (rank {r})" for r, d in ids)
    raise TraceError(f"{trace.path}: no activity on device {device}; devices with activity: {known}")


def _device_index(trace: Trace) -> tuple[list[tuple[int, int]], dict[tuple[int, int], np.ndarray]]:
    """The trace's sorted (rank, device) pairs and, per pair, the positional rows of ``trace.device`` in their
    order: one stable sort per trace (memoised with the timelines), so the per-device loops cost the trace's size
    once, not once per device."""
    memo = _timeline_cache(trace)
    hit = memo.get("device_index")
    if hit is None:
        d = trace.device
        rank = d["rank"].to_numpy().astype(np.int64)
        dev = d["device"].to_numpy().astype(np.int64)
        order = np.lexsort((dev, rank))  # stable: rows keep their order inside a device
        r, v = rank[order], dev[order]
        starts = np.flatnonzero(np.r_[True, (r[1:] != r[:-1]) | (v[1:] != v[:-1])]) if len(order) else order
        bounds = np.r_[starts, len(order)]
        ids = [(int(r[a]), int(v[a])) for a in starts]
        groups = {k: order[bounds[i]:bounds[i + 1]] for i, k in enumerate(ids)}
        hit = memo["device_index"] = (ids, groups)
    return hit


def _device_column(trace: Trace, key: tuple[int, int], column: str) -> np.ndarray:
    """One column of the device's rows as numpy (no DataFrame per device: thousands of devices stay cheap)."""
    memo = _timeline_cache(trace)
    col = memo.get(("column", column))
    if col is None:
        col = memo[("column", column)] = trace.device[column].to_numpy()
    rows = _device_index(trace)[1].get((int(key[0]), int(key[1])))
    return col[rows] if rows is not None else col[:0]


def _device_rows(trace: Trace, key: tuple[int, int]) -> pd.DataFrame:
    rows = _device_index(trace)[1].get((int(key[0]), int(key[1])))
    return trace.device.iloc[rows if rows is not None else np.empty(0, np.int64)]


def resolve_window(trace: Trace, device: int | tuple[int, int] | None = None,
                   window: str | tuple[float, float] | None = None) -> tuple[float, float]:
    """The window ``(t0_us, t1_us)`` for a device (see the module docstring for the three forms).

    Raises TraceError naming the window and the annotation names available when no annotation matches.
    """
    key = resolve_device(trace, device)
    if window is None:
        return float(_device_column(trace, key, "ts_us").min()), float(_device_column(trace, key, "end_us").max())
    if isinstance(window, tuple):
        t0, t1 = float(window[0]), float(window[1])
        if not t1 >= t0:
            raise TraceError(f"{trace.path}: window {window} ends before it starts")
        return t0, t1
    ga = trace.gpu_annotations
    sel = ga[(ga["rank"].to_numpy() == key[0]) & (ga["device"].to_numpy() == key[1])
             & (ga["name"].astype(str).to_numpy() == window)]
    if sel.empty:
        ua = trace.host[(trace.host["cat"] == "user_annotation").to_numpy() & (trace.host["rank"].to_numpy() == key[0])]
        sel = ua[ua["name"].astype(str).to_numpy() == window]
    if sel.empty:
        names = sorted(set(ga["name"].astype(str)) | set(
            trace.host.loc[trace.host["cat"] == "user_annotation", "name"].astype(str)))
        shown = ", ".join(names[:20]) + (f", … ({len(names)} in all)" if len(names) > 20 else "")
        raise TraceError(f"{trace.path}: no annotation named {window!r} for window; "
                         f"annotations in the trace: {shown or 'none'}")
    return float(sel["ts_us"].min()), float(sel["end_us"].max())


def device_side_gaps(trace: Trace, key: tuple[int, int], tl: BusyTimeline) -> np.ndarray:
    """(g,) bool over ``tl.gaps()``: True where the gap is device-side, i.e. the activity that ends it had already
    been launched before the gap began (its host launch call, joined on the correlation id, ended at or before the
    gap's start). Such a gap is launch latency between queued kernels (the bubbles between the nodes of a CUDA
    graph replay, a dependency on another stream), not the host being late: HTA calls it "kernel wait" as opposed
    to "host wait". Every other gap, including one under a launch call still in progress (a profiler-inflated
    cudaGraphLaunch) and one without a known launch, is host-wait idle and is what gap attribution explains.
    """
    # memoised per timeline object (held by the memo, so its id stays its own): analyze asks twice for one timeline
    memo, mk = _timeline_cache(trace), ("device_side", key, id(tl))
    hit = memo.get(mk)
    if hit is not None and hit[0] is tl:
        return hit[1]
    g0, g1 = tl.gap_bounds()
    out = np.zeros(len(g0), dtype=bool)
    memo[mk] = (tl, out)
    if len(g0) == 0:
        return out
    join = _launch_join(trace, key)
    if join is None:
        return out
    ts_sorted, corr, launch_end = join
    k = np.searchsorted(ts_sorted, g1, side="left")  # the activity starting where the gap ends
    valid = k < len(ts_sorted)
    kk = np.minimum(k, len(ts_sorted) - 1)
    valid &= ts_sorted[kk] == g1
    pos = launch_end.index.get_indexer(corr[kk])
    found = valid & (pos >= 0)
    end = launch_end.to_numpy()[np.maximum(pos, 0)]
    out[:] = found & (end <= g0)
    return out


def _launch_join(trace: Trace, key: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, pd.Series] | None:
    """The window-independent half of :func:`device_side_gaps`: the device's activity starts sorted (stable) with
    their correlation ids, and the latest end of the rank's runtime / driver calls per correlation id (a Series
    indexed by id, sorted); None without device rows or such calls. Memoised per device on the trace."""
    memo, mk = _timeline_cache(trace), ("launch_join", key)
    if mk in memo:
        return memo[mk]
    res = None
    rows = _device_rows(trace, key)
    if not rows.empty:
        ts = rows["ts_us"].to_numpy()
        order = np.argsort(ts, kind="stable")
        h = trace.host
        rt = h[h["cat"].isin(("cuda_runtime", "cuda_driver")).to_numpy() & (h["rank"].to_numpy() == key[0])
               & (h["correlation"].to_numpy() >= 0)]
        if not rt.empty:
            res = (ts[order], rows["correlation"].to_numpy()[order],
                   rt.groupby("correlation", sort=True)["end_us"].max())
    memo[mk] = res
    return res


def launch_links(trace: Trace, key: tuple[int, int], t0_us: float, t1_us: float) -> dict[str, int]:
    """How many of the device's activities (kernel, memcpy, memset) that overlap ``[t0_us, t1_us]`` can be tied to
    the host call that launched them, the join :func:`device_side_gaps` and :func:`graph_node_gaps` rest on.

    Returns counts of activities: ``gpu_events`` (all of them), ``no_id`` (correlation id absent or negative),
    ``shared_id`` (the id is carried by more than one cuda_runtime / cuda_driver call of the rank, so which call
    launched it is unknown: a broken or rewritten trace), ``no_launch`` (no call of the rank carries the id: the
    launch fell outside the capture), ``unlinked`` (their sum) and ``linked`` (the rest). A gap ended by an
    unlinked activity counts as host-wait idle, so with ``unlinked > 0`` the device-side idle is a lower bound,
    and with ``linked == 0`` it cannot be computed at all.
    """
    rows = _device_rows(trace, key)
    rows = rows[(rows["end_us"].to_numpy() >= t0_us) & (rows["ts_us"].to_numpy() <= t1_us)]
    corr = rows["correlation"].to_numpy()
    h = trace.host
    rt = h[h["cat"].isin(("cuda_runtime", "cuda_driver")).to_numpy() & (h["rank"].to_numpy() == key[0])
           & (h["correlation"].to_numpy() >= 0)]
    calls = rt.groupby("correlation", sort=True).size()
    pos = calls.index.get_indexer(corr) if len(calls) else np.full(len(corr), -1)
    no_id = corr < 0
    no_launch = ~no_id & (pos < 0)
    shared = (pos >= 0) & (calls.to_numpy()[np.maximum(pos, 0)] > 1) if len(calls) else np.zeros(len(corr), bool)
    out = {"gpu_events": len(corr), "no_id": int(no_id.sum()), "shared_id": int(shared.sum()),
           "no_launch": int(no_launch.sum())}
    out["unlinked"] = out["no_id"] + out["shared_id"] + out["no_launch"]
    out["linked"] = out["gpu_events"] - out["unlinked"]
    return out


def graph_node_gaps(trace: Trace, key: tuple[int, int], tl: BusyTimeline) -> np.ndarray:
    """(g,) bool over ``tl.gaps()``: True where the activities on both sides of the gap (the one whose end starts it
    and the one whose start ends it) carry the same correlation id, i.e. two nodes of one CUDA-graph launch: the
    bubble the device leaves between graph nodes, which no host code and no launch call can shorten (only fewer
    nodes can). Most are also :func:`device_side_gaps`; those under a launch call still in progress (the profiler
    inflating cudaGraphLaunch) are not, and ``analyze`` counts only the device-side ones as node bubbles."""
    return _gap_neighbours(trace, key, tl)[0]


def _gap_neighbours(trace: Trace, key: tuple[int, int], tl: BusyTimeline) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For every gap of ``tl``: (same launch: bool, before, after), ``before`` / ``after`` the positions in the
    device's rows (:func:`_device_rows`) of the activity whose end starts the gap and of the one whose start ends it
    (meaningful where the bool is True). Memoised per timeline, as :func:`device_side_gaps`."""
    memo, mk = _timeline_cache(trace), ("neighbours", key, id(tl))
    hit = memo.get(mk)
    if hit is not None and hit[0] is tl:
        return hit[1]
    res = _gap_neighbours_of(trace, key, tl)
    memo[mk] = (tl, res)
    return res


def _gap_neighbours_of(trace: Trace, key: tuple[int, int], tl: BusyTimeline) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    g0, g1 = tl.gap_bounds()
    out = np.zeros(len(g0), dtype=bool)
    rows = _device_rows(trace, key)
    if len(g0) == 0 or rows.empty:
        empty = np.zeros(len(g0), dtype=np.int64)
        return out, empty, empty
    ts, end, corr = (rows["ts_us"].to_numpy(), rows["end_us"].to_numpy(), rows["correlation"].to_numpy())
    by_ts, by_end = np.argsort(ts, kind="stable"), np.argsort(end, kind="stable")
    k = np.minimum(np.searchsorted(ts[by_ts], g1, side="left"), len(ts) - 1)      # the activity ending the gap
    j = np.minimum(np.searchsorted(end[by_end], g0, side="left"), len(end) - 1)   # the one whose end starts it
    nxt, prv = by_ts[k], by_end[j]
    out[:] = (ts[nxt] == g1) & (end[prv] == g0) & (corr[nxt] == corr[prv]) & (corr[nxt] >= 0)
    return out, prv, nxt


def node_bubbles(trace: Trace, device: int | tuple[int, int] | None = None,
                 window: str | tuple[float, float] | None = None) -> pd.DataFrame:
    """The bubbles between two nodes of one CUDA-graph launch (device-side gaps whose two neighbours share a
    correlation id: :func:`graph_node_gaps` & :func:`device_side_gaps`, the ones ``analyze`` counts), grouped by the
    kernel pair at the boundary: which node boundaries hold the device-side idle, and so which pairs fusing two
    kernels into one node, or programmatic dependent launch of the second, would close.

    Returns one row per (before, after) name pair, sorted by ``idle_us`` (descending): before (the activity whose end
    starts the gap), after (the one whose start ends it), gaps (count), idle_us (their sum), median_us, max_us, share
    (of all node-bubble idle in the window; the shares sum to 1). Empty when the window has no such gap. Times in µs
    on the trace's clock; ``window`` and ``device`` as :func:`busy_timeline`.
    """
    key = resolve_device(trace, device)
    tl = busy_timeline(trace, key, window)
    same, prv, nxt = _gap_neighbours(trace, key, tl)
    node = same & device_side_gaps(trace, key, tl)
    cols = ["before", "after", "gaps", "idle_us", "median_us", "max_us", "share"]
    if not node.any():
        return pd.DataFrame(columns=cols)
    name = _device_rows(trace, key)["name"]  # a Categorical over the trace's symbols: group on the codes
    codes = name.cat.codes.to_numpy()
    df = pd.DataFrame({"b": codes[prv[node]], "a": codes[nxt[node]], "dur": np.subtract(*tl.gap_bounds()[::-1])[node]})
    out = (df.groupby(["b", "a"], sort=False)["dur"]
           .agg(gaps="size", idle_us="sum", median_us="median", max_us="max").reset_index())
    cats = name.cat.categories.astype(str).to_numpy()
    out["before"], out["after"] = cats[out["b"].to_numpy()], cats[out["a"].to_numpy()]
    out["share"] = out["idle_us"] / out["idle_us"].sum()
    return out.sort_values(["idle_us", "before", "after"], ascending=[False, True, True],
                           kind="stable").reset_index(drop=True)[cols]


def short_kernel_name(name: str, width: int = 60) -> str:
    """A kernel name for a text table: without a leading ``void``, the parameter list (a "(" right after the name)
    and, when still longer than ``width``, the contents of template argument lists
    (``at::native::vectorized_elementwise_kernel<…>``); then at most ``width`` characters."""
    s = name[5:] if name.startswith("void ") else name
    depth = 0
    for i, ch in enumerate(s):  # cut at the parameter list: the first "(" outside template brackets
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(depth - 1, 0)
        elif (ch == "(" and depth == 0 and i > 0 and s[i - 1] != " "  # "Memcpy DtoH (Device -> Pinned)" stays
              and not s.startswith("(anonymous namespace)", i)):
            s = s[:i]
            break
    if len(s) > width:
        out, depth = [], 0
        for ch in s:
            if ch == "<":
                depth += 1
                if depth == 1:
                    out.append("<…")
            elif ch == ">":
                depth = max(depth - 1, 0)
                if depth == 0:
                    out.append(">")
            elif depth == 0:
                out.append(ch)
        s = "".join(out)
    return s if len(s) <= width else s[:width - 1] + "…"


def _timeline_cache(trace: Trace) -> dict:
    """The memo of one trace's timelines, kept on the trace (:meth:`gaptrace.trace.Trace.memo`; a new one when
    ``trace.device`` is assigned a new frame). Timelines are frozen, so sharing is safe."""
    return trace.memo("busy_timelines", trace.device, dict)


def busy_timeline(trace: Trace, device: int | tuple[int, int] | None = None,
                  window: str | tuple[float, float] | None = None, host_wait_only: bool = False) -> BusyTimeline:
    """The device's :class:`BusyTimeline` clipped to the window (default: first to last activity).

    Busy = union of kernel, memcpy and memset intervals on all streams of that (rank, device); annotations,
    cuda_sync and profiler overhead events never count as busy (DESIGN.md "Busy / occupancy"). With
    ``host_wait_only`` the device-side gaps count as busy too (:func:`fill_device_side`): for attribution only,
    never for occupancy. Memoised on the trace (:meth:`gaptrace.trace.Trace.memo`) per (device, window,
    host_wait_only): every analysis of one trace shares one timeline.
    """
    key = resolve_device(trace, device)
    memo = _timeline_cache(trace)
    merged = memo.get(("merged", key))
    if merged is None:  # the union does not depend on the window: merged once per device, clipped per window
        merged = memo[("merged", key)] = merge_intervals(_device_column(trace, key, "ts_us"),
                                                         _device_column(trace, key, "end_us"))
    if window is None:  # first to last activity, as BusyTimeline.from_merged's default: one memo entry with the
        s, e = merged   # same window given explicitly
        t0 = float(s[0]) if len(s) else 0.0
        t1 = float(e[-1]) if len(e) else t0
    else:
        t0, t1 = resolve_window(trace, key, window)
    mk = (key, t0, t1, bool(host_wait_only))
    tl = memo.get(mk)
    if tl is None:
        if host_wait_only:
            tl = fill_device_side(trace, key, busy_timeline(trace, key, (t0, t1)))
        else:
            tl = BusyTimeline.from_merged(*merged, t0, t1)
        memo[mk] = tl
    return tl


def fill_device_side(trace: Trace, key: tuple[int, int], tl: BusyTimeline) -> BusyTimeline:
    """``tl`` with its device-side gaps (:func:`device_side_gaps`) counted as busy: a timeline whose idle is the
    host-wait idle only, for attributing idle to host code."""
    side = device_side_gaps(trace, key, tl)
    if not side.any():
        return tl
    return tl.with_gaps_filled(side)


def device_occupancy(trace: Trace, device: int | tuple[int, int] | None = None,
                     window: str | tuple[float, float] | None = None) -> DeviceOccupancy:
    """Occupancy of one device (None: the busiest) over the window. See :func:`occupancy` for the fields."""
    key = resolve_device(trace, device)
    tl = busy_timeline(trace, key, window)
    label = "activity" if window is None else ("explicit" if isinstance(window, tuple) else str(window))
    return DeviceOccupancy(rank=key[0], device=key[1], name=trace.device_name(key[1]), window=label,
                           window_start_us=tl.t0_us, window_end_us=tl.t1_us, window_us=tl.window_us,
                           busy_us=tl.busy_us, idle_us=tl.idle_us, occupancy=tl.occupancy, gaps=tl.gap_count())


def occupancy(trace: Trace, window: str | tuple[float, float] | None = None, sidecar: Any = "auto") -> pd.DataFrame:
    """Occupancy of every (rank, device) with activity, one row each, sorted by (rank, device).

    Columns: rank, device, name (GPU product name), window, window_start_us, window_end_us, window_us, busy_us,
    idle_us, occupancy (busy_us / window_us, 0..1), gaps (number of idle gaps inside the window).
    With a named window, devices without a matching annotation use the rank's host user_annotation range.
    ``window`` None: the capture sidecar's ``analysis_window`` (the profiled rounds, without the profiler's own
    start and stop), as ``gaptrace analyze`` reads it, when the sidecar names an annotation the trace has, else each
    device's first to last activity. ``sidecar``: "auto" (read ``TRACE.gaptrace.json`` next to ``trace.path``), a
    :class:`gaptrace.sidecar.Sidecar` or its dict, or None (no sidecar window).
    Raises TraceError when the trace has no device activity or no annotation matches the window.
    """
    if window is None and sidecar is not None:
        window = sidecar_window(trace, sidecar)
    rows = [dataclasses.asdict(device_occupancy(trace, key, window)) for key in _device_index(trace)[0]]
    if not rows:
        raise TraceError(f"{trace.path}: no GPU activity (kernel/memcpy/memset): occupancy cannot be computed")
    return pd.DataFrame(rows)


def sidecar_window(trace: Trace, sidecar: Any = "auto") -> str | None:
    """The capture sidecar's ``analysis_window`` when the trace has a user_annotation of that name, else None.
    ``sidecar``: "auto" (read next to ``trace.path``; absent or unreadable: None), a Sidecar or its dict."""
    from gaptrace.sidecar import as_sidecar, read_sidecar

    if isinstance(sidecar, str) and sidecar == "auto":
        sidecar = read_sidecar(trace.path) if isinstance(trace.path, str) else None
    try:
        side = as_sidecar(sidecar)
    except (TypeError, ValueError):
        return None
    named = getattr(side, "analysis_window", None) if side is not None else None
    if not isinstance(named, str):
        return None
    ua = trace.host.loc[trace.host["cat"] == "user_annotation", "name"]
    return named if (ua == named).any() else None


def busy_fraction_bins(trace: Trace, device: int | tuple[int, int] | None, n_bins: int,
                       window: str | tuple[float, float] | None = None) -> pd.DataFrame:
    """Busy fraction of the device in ``n_bins`` equal time bins over the window, for the occupancy strip.

    Columns start_us, end_us, busy_fraction (0..1); exact from busy(t), not sampled. ValueError if n_bins < 1.
    """
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    return busy_timeline(trace, device, window).busy_fraction_bins(n_bins)
