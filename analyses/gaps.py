"""Idle-gap attribution to host stacks, gap-clipped (DESIGN.md "Gap attribution (gap-clipped stacks)" and "A way
to compute them in n log n").

For one device (keyed (rank, device); default the busiest) and a window (see :mod:`.occupancy`), with
idle(t) the device's cumulative idle time (:class:`BusyTimeline`):

- **inclusive idle** of a host event [s, e] = idle(e) - idle(s): device idle time while the event was open.
- **self idle** of a host event = idle time while it was the *innermost* open event on its thread, i.e. the
  latest-started event open at that instant (the top of the stack a sampler would see). When events nest properly
  this is inclusive minus the direct children's inclusive; with partial overlaps (a record_function range that
  starts inside one Python frame and ends inside another) each instant is still charged to exactly one event
  per thread, so the self idle of a thread's events sums to the idle under the union of its events.
- Frames are all host categories: Python frames, ATen ops, user annotations, CUDA runtime/driver calls, under
  their normalised names (:func:`gaptrace.analyses.stacks.normalize_frame`). Host threads of the device's rank
  only (another rank's clock is another process's).

Aggregation by frame over all host threads, as *time unions* so that nothing is counted twice:
``inclusive_idle_us`` is the idle time during which the frame was open on at least one thread (a frame nested
in itself, recursion, counts its outermost occurrence only; two threads in the same frame at once count once),
``self_idle_us`` the idle time during which it was the innermost frame on at least one thread. So
``share = inclusive_idle_us / idle_us of the window`` is in [0, 1].

All of it is vectorised: searchsorted over the busy spans, bincount/unique for grouping, one loop over host
threads (for a searchsorted) and rounds of pointer jumping (about the nesting depth) to find the innermost event.
"""
from __future__ import annotations

import re

import dataclasses

import numpy as np
import pandas as pd

from gaptrace.trace import HOST_CATEGORIES, Trace

from .occupancy import busy_timeline, resolve_device
from .stacks import HostTree, host_tree
from .timeline import BusyTimeline

__all__ = ["EventIdle", "event_idle", "event_idle_on", "idle_at", "grouped_union", "gap_attribution", "gap_table"]


@dataclasses.dataclass(frozen=True, eq=False)
class EventIdle:
    """Per host event idle for one device and window. Arrays are indexed by :class:`HostTree` node.

    ``inclusive_us``/``self_us``: (n,) float64 µs, 0 for events of other ranks. ``in_rank``: (n,) bool.
    ``seg_start_us``/``seg_end_us``/``seg_idle_us``/``seg_node``: host-time segments of the rank's threads
    (between consecutive boundaries of one thread's idle-seeing events, :func:`_segments`) that hold device idle
    time, their idle µs and the innermost open event at every idle moment in each (-1: no host event open on that
    thread then). A segment may span busy time too; weigh it with the timeline (``idle_between``), never by length.
    """

    rank: int
    device: int
    timeline: BusyTimeline
    tree: HostTree
    in_rank: np.ndarray
    inclusive_us: np.ndarray
    self_us: np.ndarray
    seg_start_us: np.ndarray
    seg_end_us: np.ndarray
    seg_idle_us: np.ndarray
    seg_node: np.ndarray

    def thread_covered_idle_us(self) -> np.ndarray:
        """(T,) idle under the union of each thread's events (= sum of its events' self idle)."""
        act = self.seg_node >= 0
        return np.bincount(self.tree.thread[self.seg_node[act]], weights=self.seg_idle_us[act],
                           minlength=len(self.tree.threads)).astype(np.float64)


def idle_at(tl: BusyTimeline, t_us: np.ndarray) -> np.ndarray:
    """idle(t) of the timeline for t clipped to its window: one searchsorted, no branches.

    Same function as ``BusyTimeline.idle_before`` (a zero-length sentinel span at t0 removes the "before the
    first span" case), written for the millions of evaluations the attribution needs.
    """
    t = np.clip(np.asarray(t_us, dtype=np.float64), tl.t0_us, tl.t1_us)
    s = np.r_[tl.t0_us, tl.span_start_us]
    e = np.r_[tl.t0_us, tl.span_end_us]
    c = np.r_[0.0, tl.cum_busy_us[:-1]]
    k = np.searchsorted(s, t, side="right") - 1
    return (t - tl.t0_us) - (c[k] + (np.minimum(t, e[k]) - s[k]))


def _segments(tree: HostTree, nodes_mask: np.ndarray, idle_s: np.ndarray, idle_e: np.ndarray,
              tl: BusyTimeline) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Host-time segments of every selected thread that hold idle, and the innermost open event in each.

    Only events that saw idle (idle_e > idle_s) bound segments: a segment [b_k, b_k+1) lies between consecutive
    distinct start/end times of those events on one thread, so the set of idle-seeing events open in it is
    constant; its idle is idle(b_k+1) - idle(b_k), from the values already computed at the events' starts and ends
    (``idle_s``/``idle_e``). Events that saw no idle are never open at an idle moment (they would then contain
    idle), so they only add boundaries inside busy time; skipping them leaves every segment's idle and owner
    unchanged and sorts ~10x fewer times on real traces. The owner is the innermost event open at the segment's
    first idle moment (:meth:`BusyTimeline.next_idle_start`): the last event starting at or before it (searchsorted), then jumps
    along ``open_top`` while the candidate has already ended (every event skipped ended before the candidate
    started, so none is open). Only segments with idle > 0 are kept; a segment may include busy time around its
    idle, which every consumer weighs out through the timeline.
    """
    starts, ends, idles, owners, probes = [], [], [], [], []
    seen = idle_e > idle_s
    for k in range(len(tree.threads)):
        lo, hi = int(tree.thread_bounds[k]), int(tree.thread_bounds[k + 1])
        if hi == lo or not nodes_mask[lo]:
            continue
        sel = lo + np.flatnonzero(seen[lo:hi])
        if len(sel) == 0:
            continue
        times = np.concatenate([tree.start_us[sel], tree.end_us[sel]])
        vals = np.concatenate([idle_s[sel], idle_e[sel]])
        o = np.argsort(times, kind="stable")  # two nearly sorted runs: timsort merges them
        times, vals = times[o], vals[o]
        first = np.r_[True, times[1:] != times[:-1]]
        b, v = times[first], vals[first]
        idle = v[1:] - v[:-1]
        keep = idle > 0
        a = b[:-1][keep]
        probe = tl.next_idle_start(a)
        starts.append(a)
        ends.append(b[1:][keep])
        idles.append(idle[keep])
        probes.append(probe)
        owners.append(np.searchsorted(tree.start_us[lo:hi], probe, side="right") - 1 + lo)
    if not starts:
        z = np.empty(0)
        return z, z, z, np.empty(0, dtype=np.int64)
    seg_s, seg_e, seg_i = np.concatenate(starts), np.concatenate(ends), np.concatenate(idles)
    at = np.concatenate(probes)
    pos = np.concatenate(owners).astype(np.int64)
    live = np.flatnonzero(pos >= 0)
    end, top = tree.end_us, tree.open_top
    while len(live):
        p = pos[live]
        closed = end[p] <= at[live]
        live = live[closed]
        nxt = top[p[closed]]
        pos[live] = nxt
        live = live[nxt >= 0]
    return seg_s, seg_e, seg_i, pos


def event_idle(trace: Trace, device: int | tuple[int, int] | None = None,
               window: str | tuple[float, float] | None = None, host_wait_only: bool = False,
               exclude_parked: bool = False) -> EventIdle:
    """Inclusive and self idle of every host event of the device's rank (definitions in the module docstring).

    ``device``: int, (rank, device) or None (the busiest). ``window``: None (first to last device activity),
    an annotation name, or (t0_us, t1_us). ``host_wait_only``: attribute only host-wait idle, i.e. leave out the
    device-side gaps between kernels that were already queued (:func:`.occupancy.device_side_gaps`); the result's
    ``timeline`` is then that filled timeline. ``exclude_parked``: leave out threads parked in a wait
    (:func:`_parked_threads`: tqdm's monitor, idle pools).
    Raises TraceError when the trace has no device activity or the window matches no annotation.
    """
    key = resolve_device(trace, device)
    tl = busy_timeline(trace, key, window, host_wait_only=host_wait_only)
    return event_idle_on(trace, key, tl, exclude_parked=exclude_parked)


def event_idle_on(trace: Trace, key: tuple[int, int], tl: BusyTimeline, exclude_parked: bool = False) -> EventIdle:
    """:func:`event_idle` over a given timeline ``tl``: the host events of rank ``key[0]`` charged the *idle* of
    ``tl`` (its complement of busy spans) that passed while they were open. With the device's own timeline this is
    gap attribution; with a timeline whose idle spans are other intervals (the waits a late rank caused,
    :mod:`.stragglers`) the same machinery charges those to the host frames, clipped to them."""
    tree = host_tree(trace)
    rank_of_thread = tree.threads["rank"].to_numpy()
    in_rank = rank_of_thread[tree.thread] == key[0] if tree.n else np.zeros(0, dtype=bool)
    idle_s = idle_at(tl, tree.start_us)
    idle_e = idle_at(tl, tree.end_us)
    inclusive = np.where(in_rank, idle_e - idle_s, 0.0)
    seg_s, seg_e, seg_i, seg_node = _segments(tree, in_rank, idle_s, idle_e, tl)
    parked = _parked_threads(trace, tree, seg_i, seg_node) if exclude_parked else np.zeros(0, dtype=bool)
    if parked.any():  # leave parked threads out entirely: their waiting explains nothing
        in_rank = in_rank & ~parked[tree.thread]
        inclusive = np.where(in_rank, inclusive, 0.0)
        drop = (seg_node >= 0) & parked[tree.thread[np.maximum(seg_node, 0)]]
        seg_node = np.where(drop, -1, seg_node)
    act = seg_node >= 0
    self_us = np.bincount(seg_node[act], weights=seg_i[act], minlength=tree.n).astype(np.float64)
    return EventIdle(rank=key[0], device=key[1], timeline=tl, tree=tree, in_rank=in_rank,
                     inclusive_us=inclusive, self_us=self_us, seg_start_us=seg_s, seg_end_us=seg_e,
                     seg_idle_us=seg_i, seg_node=seg_node)


PARKED_SHARE = 0.9


def _parked_threads(trace: Trace, tree: HostTree, seg_idle: np.ndarray, seg_node: np.ndarray) -> np.ndarray:
    """(threads,) bool: threads that launch no device work (no cuda_runtime / cuda_driver event) and spend at least
    ``PARKED_SHARE`` of their traced time with a parked frame innermost (:data:`.stacks.WAIT_FRAME_RE`:
    ``threading.py: wait``, a lock ``acquire``, ``time.sleep``, ``select``): tqdm's monitor thread, an idle worker
    pool. A thread that computes while the GPU idles (a JIT compile on a scheduler thread) is never parked.
    Times are the idle µs of the thread's segments (the GPU-idle time it covers), so busy time never counts."""
    from .stacks import CAT_CODE, waiting_frames

    nt = len(tree.threads)
    out = np.zeros(nt, dtype=bool)
    act = seg_node >= 0
    if not act.any():
        return out
    node = seg_node[act]
    dur = seg_idle[act]
    thread = tree.thread[node]
    wait = waiting_frames(tree)[np.maximum(tree.frame[node], 0)] & (tree.frame[node] >= 0)
    total = np.bincount(thread, weights=dur, minlength=nt)
    waiting = np.bincount(thread, weights=np.where(wait, dur, 0.0), minlength=nt)
    launches = np.isin(tree.cat, [CAT_CODE["cuda_runtime"], CAT_CODE["cuda_driver"]])
    launching = np.bincount(tree.thread[launches], minlength=nt) > 0
    return (total > 0) & (waiting >= PARKED_SHARE * total) & ~launching


def _grouped_union(group: np.ndarray, s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Union of intervals per group: (span_group, span_start, span_end), sorted by (group, start). Vectorised.

    The running maximum of ends within a group is one ``maximum.accumulate`` over ``group * n + rank(end)``.
    """
    n = len(s)
    if n == 0:
        return np.empty(0, dtype=np.int64), np.empty(0), np.empty(0)
    o = np.lexsort((s, group))
    g, s, e = group[o].astype(np.int64), s[o], e[o]
    by_end = np.argsort(e, kind="stable")
    rank = np.empty(n, dtype=np.int64)
    rank[by_end] = np.arange(n)
    run = np.maximum.accumulate(g * n + rank) - g * n
    run_end = e[by_end[run]]
    new = np.empty(n, dtype=bool)
    new[0] = True
    new[1:] = (g[1:] != g[:-1]) | (s[1:] > run_end[:-1])
    first = np.flatnonzero(new)
    last = np.r_[first[1:] - 1, n - 1]
    return g[first], s[first], run_end[last]


grouped_union = _grouped_union  # public name; analyses.idle_sites uses it for the per-site union


def _gap_ranges(tl: BusyTimeline, s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray, pd.DataFrame]:
    """For intervals [s, e]: index range [lo, hi] of the idle gaps they overlap by a positive length."""
    gaps = tl.gaps()
    lo = np.searchsorted(gaps["end_us"].to_numpy(), s, side="right")
    hi = np.searchsorted(gaps["start_us"].to_numpy(), e, side="left") - 1
    return lo, hi, gaps


def gap_attribution(trace: Trace, device: int | tuple[int, int] | None = None,
                    window: str | tuple[float, float] | None = None,
                    result: EventIdle | None = None, *, host_wait_only: bool = True,
                    exclude_parked: bool = True) -> pd.DataFrame:
    """Idle time per host frame (normalised name), sorted by inclusive_idle_us desc; frames with no idle omitted.

    The defaults are ``gaptrace analyze``'s: only host-wait idle is charged (``host_wait_only``: gaps before
    kernels already launched are device-side, nobody's host code) and parked helper threads are left out
    (``exclude_parked``: a thread that never launches device work and sits in a wait frame; :func:`event_idle`).
    Both are ignored when ``result`` is given (its own settings hold).

    Columns: frame, cat (host category of the frame), self_idle_us, inclusive_idle_us, share (inclusive /
    idle of the window, 0..1), gaps (distinct idle gaps the frame overlapped), events (occurrences of the frame
    that intersect the window). Units µs. See the module docstring for the union semantics.
    Pass ``result`` (from :func:`event_idle`) to reuse a computation.
    """
    r = result if result is not None else event_idle(trace, device, window, host_wait_only=host_wait_only,
                                                     exclude_parked=exclude_parked)
    tree, tl = r.tree, r.timeline
    cols = ["frame", "cat", "self_idle_us", "inclusive_idle_us", "share", "gaps", "events"]
    nf = len(tree.frames)
    if tree.n == 0 or tl.idle_us <= 0:
        return pd.DataFrame({c: [] for c in cols})
    # inclusive: union per frame of the events that saw idle
    sel = np.flatnonzero(r.inclusive_us > 0)
    fg, fs, fe = _grouped_union(tree.frame[sel], tree.start_us[sel], tree.end_us[sel])
    incl = np.bincount(fg, weights=idle_at(tl, fe) - idle_at(tl, fs), minlength=nf)
    lo, hi, _ = _gap_ranges(tl, np.maximum(fs, tl.t0_us), np.minimum(fe, tl.t1_us))
    # distinct gaps per frame: spans of one frame are disjoint and sorted, so ranges overlap at most at one end
    prev_hi = np.r_[-1, hi[:-1]]
    prev_hi[np.r_[True, fg[1:] != fg[:-1]]] = -1
    n_gaps = np.bincount(fg, weights=np.maximum(hi - np.maximum(lo, prev_hi + 1) + 1, 0), minlength=nf)
    # self: union per frame of the segments where it was innermost on some thread
    act = np.flatnonzero(r.seg_node >= 0)
    if len(tree.threads) == 1:  # one thread: its segments are disjoint, the union is the sum
        self_ = np.bincount(tree.frame[r.seg_node[act]], weights=r.seg_idle_us[act], minlength=nf)
    else:
        sg, ss, se = _grouped_union(tree.frame[r.seg_node[act]], r.seg_start_us[act], r.seg_end_us[act])
        self_ = np.bincount(sg, weights=idle_at(tl, se) - idle_at(tl, ss), minlength=nf)
    # occurrences intersecting the window
    inwin = r.in_rank & (tree.start_us < tl.t1_us) & ((tree.end_us > tl.t0_us) | (tree.start_us >= tl.t0_us))
    events = np.bincount(tree.frame[inwin], minlength=nf)
    cat_of = np.full(nf, -1, dtype=np.int64)
    cat_of[tree.frame[::-1]] = tree.cat[::-1]  # any occurrence's category (the first one wins)
    keep = np.flatnonzero(incl > 0)
    out = pd.DataFrame({
        "frame": tree.frames.to_numpy(dtype=object)[keep],
        "cat": np.array(HOST_CATEGORIES, dtype=object)[cat_of[keep]],
        "self_idle_us": self_[keep],
        "inclusive_idle_us": incl[keep],
        "share": incl[keep] / tl.idle_us,
        "gaps": n_gaps[keep].astype(np.int64),
        "events": events[keep].astype(np.int64),
    })
    return out.sort_values(["inclusive_idle_us", "self_idle_us", "frame"], ascending=[False, False, True],
                           kind="stable").reset_index(drop=True)


def gap_table(trace: Trace, device: int | tuple[int, int] | None = None,
              window: str | tuple[float, float] | None = None, result: EventIdle | None = None) -> pd.DataFrame:
    """One row per idle gap of the window: gap, start_us, end_us, dur_us, frame, frame_idle_us, frame_share.

    ``frame`` is the innermost host frame that held most of the gap: the frame with the most idle µs inside the
    gap as the innermost open event of some thread (summed over threads); "" when no host event was open.
    ``frame_share = frame_idle_us / dur_us`` (can exceed 1 when several threads sat in the same frame).
    Cost: one row per (segment, gap) overlap; segments of one thread are disjoint, so at most
    segments + gaps x threads rows.
    """
    r = result if result is not None else event_idle(trace, device, window)
    tree, tl = r.tree, r.timeline
    gaps = tl.gaps()
    ng = len(gaps)
    frame = np.full(ng, "", dtype=object)
    held = np.zeros(ng)
    act = np.flatnonzero(r.seg_node >= 0)
    if ng and len(act):
        a, b = r.seg_start_us[act], r.seg_end_us[act]
        lo, hi, _ = _gap_ranges(tl, a, b)
        cnt = np.maximum(hi - lo + 1, 0)
        seg = np.repeat(np.arange(len(act)), cnt)
    if ng and len(act) and len(seg):
        off = np.r_[0, np.cumsum(cnt)[:-1]]
        gi = lo[seg] + (np.arange(len(seg)) - off[seg])
        gs, ge = gaps["start_us"].to_numpy(), gaps["end_us"].to_numpy()
        ov = np.minimum(b[seg], ge[gi]) - np.maximum(a[seg], gs[gi])
        fr = tree.frame[r.seg_node[act][seg]].astype(np.int64)
        nf = max(len(tree.frames), 1)
        keys, inv = np.unique(gi.astype(np.int64) * nf + fr, return_inverse=True)
        tot = np.bincount(inv.reshape(-1), weights=ov)
        kg, kf = keys // nf, keys % nf
        o = np.lexsort((-tot, kg))
        first = o[np.r_[True, kg[o][1:] != kg[o][:-1]]]
        frame[kg[first]] = tree.frames.to_numpy(dtype=object)[kf[first]]
        held[kg[first]] = tot[first]
    dur = gaps["dur_us"].to_numpy()
    return pd.DataFrame({
        "gap": np.arange(ng), "start_us": gaps["start_us"].to_numpy(), "end_us": gaps["end_us"].to_numpy(),
        "dur_us": dur, "frame": frame, "frame_idle_us": held,
        "frame_share": np.divide(held, dur, out=np.zeros(ng), where=dur > 0),
    })


# Frames that only wrap the program (the interpreter's runpy, click's command dispatch, a thread's bootstrap): with
# no self idle they say nothing a frame below them does not, so frame tables fold them away (:func:`frame_table`).
WRAPPER_RE = re.compile(r"<frozen runpy>|(?:^|[/\\])runpy\.py\(|(?:^|[/\\])click[/\\]|threading\.py\(\d+\): "
                        r"(?:_bootstrap|_bootstrap_inner|run)$|\(\d+\): <module>$")


def frame_table(rows: list[dict], by: str = "self") -> tuple[list[dict], int]:
    """Rows of ``gap_attribution`` (dicts) for a frame table: sorted by self idle (``by`` "self", the default:
    where the host itself was) or inclusive idle (``by`` "inclusive", the JSON's order), descending; frames that
    match :data:`WRAPPER_RE` with less than 0.5 µs of self idle folded away. Returns (rows, folded count).
    ValueError for another ``by``."""
    if by not in ("self", "inclusive"):
        raise ValueError(f"frame order {by!r}: expected 'self' or 'inclusive'")
    keep = [r for r in rows if not ((r.get("self_idle_us") or 0.0) < 0.5 and WRAPPER_RE.search(str(r.get("frame", ""))))]
    key = "self_idle_us" if by == "self" else "inclusive_idle_us"
    keep = sorted(keep, key=lambda r: (-(r.get(key) or 0.0), -(r.get("inclusive_idle_us") or 0.0), str(r.get("frame"))))
    return keep, len(rows) - len(keep)
