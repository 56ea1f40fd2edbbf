"""The gap-clipped stack tree behind the report's icicle chart, and interval nesting for the annotation lanes.

:func:`idle_stack_tree` aggregates the gap-clipped idle under every host event by frame path (thread → outermost
frame → ... → innermost frame), the flame-graph view of DESIGN.md "Gap attribution (gap-clipped stacks)".
:func:`nest_parents` nests any set of intervals per group by time containment (the annotation ranges' lanes).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from gaptrace.analyses.gaps import EventIdle
from gaptrace.analyses.stacks import _marked_ancestor
from gaptrace.bounds import MAX_STACK_FRAMES

__all__ = ["nest_parents", "StackTree", "idle_stack_tree"]


def nest_parents(group: np.ndarray, start_us: np.ndarray, end_us: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Parent index and depth of intervals that nest inside groups (threads, streams).

    Shapes: (n,) each (``group`` any integer codes) -> ``parent`` (n,) int64 index into the inputs (-1 for a
    root) and ``depth`` (n,) int64 (0 for a root). The parent of event i is the latest-starting event of the same
    group that contains it (start <= start_i and end >= end_i); equal intervals nest in input order. Intervals that
    overlap without containment are not parents of each other (a clock-skewed trace still yields a tree).

    Method: sort by (group, start, -end); the parent is then the nearest earlier event whose end is >= this end
    (the "previous greater element"), found by pointer jumping: every jump from k to parent(k) skips only events
    that end before k does, so it stays correct at every step. O(n log n) vectorised; jumps and depth levels are
    the only Python loops.
    """
    n = len(start_us)
    if n == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    group = np.asarray(group)
    s = np.asarray(start_us, dtype=np.float64)
    e = np.asarray(end_us, dtype=np.float64)
    order = np.lexsort((np.arange(n), -e, s, group))
    g, es = group[order], e[order]
    first = np.r_[True, g[1:] != g[:-1]]
    gfirst = np.maximum.accumulate(np.where(first, np.arange(n), 0))
    p = np.arange(n, dtype=np.int64) - 1
    todo = np.flatnonzero(p >= gfirst)
    while len(todo):
        cand = p[todo]
        bad = es[cand] < es[todo]
        todo = todo[bad]
        p[todo] = p[cand[bad]]
        todo = todo[p[todo] >= gfirst[todo]]
    p[p < gfirst] = -1
    # depth, one containment level at a time
    depth_sorted = np.full(n, -1, dtype=np.int64)
    level = np.flatnonzero(p < 0)
    d = 0
    depth_sorted[level] = 0
    children = np.argsort(p, kind="stable")
    p_sorted = p[children]
    while len(level):
        lo = np.searchsorted(p_sorted, level, side="left")
        hi = np.searchsorted(p_sorted, level, side="right")
        level = children[_ranges(lo, hi)]
        d += 1
        depth_sorted[level] = d
    parent = np.full(n, -1, dtype=np.int64)
    parent[order] = np.where(p >= 0, order[np.maximum(p, 0)], -1)
    depth = np.empty(n, dtype=np.int64)
    depth[order] = depth_sorted
    return parent, depth


def _ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Concatenation of arange(lo[i], hi[i]) for all i, vectorised."""
    lens = hi - lo
    keep = lens > 0
    lo, lens = lo[keep], lens[keep]
    if len(lens) == 0:
        return np.empty(0, dtype=np.int64)
    offsets = np.repeat(lo - np.r_[0, np.cumsum(lens)[:-1]], lens)
    return np.arange(lens.sum()) + offsets


@dataclasses.dataclass(frozen=True)
class StackTree:
    """Gap-clipped idle aggregated by frame path. One row per node in ``nodes``:

    ``node`` (int id), ``parent`` (node id, -1 for a thread root), ``label`` (normalized frame name; a root is
    ``thread PID/TID``), ``depth``, ``inclusive_idle_us`` (summed over the path's events: idle while they were
    open), ``self_idle_us`` (idle while one of them was the innermost open event), ``subtree_idle_us`` (self idle
    summed over the node and everything below it: the box size in the icicle; at a thread root, the idle under the
    union of the thread's events), ``events`` (host events at this path that overlapped idle time).
    ``total_idle_us``: the device's idle time in the window; ``device``: (rank, device).
    """

    nodes: pd.DataFrame
    total_idle_us: float
    device: tuple[int, int]


def idle_stack_tree(ev: EventIdle) -> StackTree:
    """Aggregate per-event idle (:func:`gaptrace.analyses.gaps.event_idle`: the same numbers as the gap
    attribution table) by frame path: thread, then outermost frame inward (DESIGN.md "Gap attribution").

    Events with no idle under them are dropped (their ancestors keep theirs: a parent contains its children).
    Paths are at most ``MAX_STACK_FRAMES`` frames deep: the idle of deeper events goes to one child of their
    ``MAX_STACK_FRAMES``-th frame labelled ``… deeper frames`` (its self and inclusive idle: their self idle), so
    the chart and the loops stay bounded by that depth, however deep the trace nests.
    Vectorised over events; the only Python loops are over depth levels (at most ``MAX_STACK_FRAMES`` + 1).
    torch.profiler's ``ProfilerStep#<n>`` frames are one frame, ``ProfilerStep#N``: the icicle keeps the stack path,
    not one copy of it per step.
    """
    cols = ["node", "parent", "label", "depth", "inclusive_idle_us", "self_idle_us", "subtree_idle_us", "events"]
    tree = ev.tree
    key = (ev.rank, ev.device)
    keep = (ev.inclusive_us > 0) & ev.in_rank if tree.n else np.zeros(0, dtype=bool)
    if not keep.any():
        return StackTree(pd.DataFrame({c: [] for c in cols}), ev.timeline.idle_us, key)
    tdepth = tree.depth
    deep = keep & (tdepth >= MAX_STACK_FRAMES)
    if deep.any():  # folded into their ancestor at depth MAX_STACK_FRAMES - 1 (the MAX_STACK_FRAMES-th frame)
        edge = _marked_ancestor(tree, tdepth == MAX_STACK_FRAMES - 1)
        deep_idx = np.flatnonzero(deep)
        deep_anc = edge[tree.parent[deep_idx]]
        keep[deep_anc] = True
        keep[deep_idx] = False
    else:
        deep_idx = deep_anc = np.empty(0, dtype=np.int64)
    # a parent contains its children; where a trace's clocks say otherwise (a child outside its Python parent's
    # span), the child may hold idle its parent does not: keep the parent too, so every kept event has its path
    for d in range(int(tree.depth[keep].max()), 0, -1):
        par = tree.parent[np.flatnonzero(keep & (tree.depth == d))]
        keep[par[par >= 0]] = True
    # one path per stack, not one copy per profiler step: ProfilerStep#31, #32, ... are one frame, ProfilerStep#N
    names = pd.Series(tree.frames.to_numpy(dtype=object)).astype(str).str.replace(r"^ProfilerStep#\d+$",
                                                                               "ProfilerStep#N", regex=True)
    canon, uniq_names = pd.factorize(names)
    n_frames = len(uniq_names) + 1
    frame = np.where(tree.frame >= 0, canon[np.maximum(tree.frame, 0)], -1).astype(np.int64) + 1  # -1 (no name) -> 0
    frame_names = np.r_[np.array([""], dtype=object), np.asarray(uniq_names, dtype=object)]
    th = tree.threads
    n_roots = len(th)
    node_of = np.full(tree.n, -1, dtype=np.int64)
    parents = [np.full(n_roots, -1, dtype=np.int64)]
    labels = [np.array([f"thread {p}/{t}" for p, t in zip(th["pid"], th["tid"])], dtype=object)]
    depths = [np.zeros(n_roots, dtype=np.int64)]
    next_id = n_roots
    for d in range(int(tree.depth[keep].max()) + 1):
        idx = np.flatnonzero(keep & (tree.depth == d))
        if len(idx) == 0:
            continue
        par = tree.parent[idx]
        pnode = np.where(par >= 0, node_of[np.maximum(par, 0)], tree.thread[idx].astype(np.int64))
        uniq, inv = np.unique(pnode * n_frames + frame[idx], return_inverse=True)
        node_of[idx] = next_id + inv
        parents.append(uniq // n_frames)
        labels.append(frame_names[uniq % n_frames])
        depths.append(np.full(len(uniq), d + 1, dtype=np.int64))
        next_id += len(uniq)
    deep_node = np.empty(0, dtype=np.int64)
    if len(deep_idx):  # one "… deeper frames" child per folded frame
        uniq, inv = np.unique(node_of[deep_anc], return_inverse=True)
        deep_node = next_id + inv.reshape(-1)
        parents.append(uniq)
        labels.append(np.full(len(uniq), "… deeper frames", dtype=object))
        depths.append(np.full(len(uniq), MAX_STACK_FRAMES + 1, dtype=np.int64))
        next_id += len(uniq)
    kept = np.flatnonzero(keep)
    to = np.r_[node_of[kept], deep_node].astype(np.int64)
    incl = np.bincount(to, weights=np.r_[ev.inclusive_us[kept], ev.self_us[deep_idx]], minlength=next_id)
    self_idle = np.bincount(to, weights=np.r_[ev.self_us[kept], ev.self_us[deep_idx]], minlength=next_id)
    count = np.bincount(to, minlength=next_id)
    parent = np.concatenate(parents)
    depth = np.concatenate(depths)
    subtree = self_idle.copy()
    for d in range(int(depth.max()), 0, -1):  # children before parents
        m = depth == d
        subtree += np.bincount(parent[m], weights=subtree[m], minlength=next_id)
    incl[:n_roots] = subtree[:n_roots]
    nodes = pd.DataFrame({"node": np.arange(next_id), "parent": parent, "label": np.concatenate(labels),
                          "depth": depth, "inclusive_idle_us": incl, "self_idle_us": self_idle,
                          "subtree_idle_us": subtree, "events": count})
    nodes = nodes[nodes["subtree_idle_us"] > 0].reset_index(drop=True)
    return StackTree(nodes, ev.timeline.idle_us, key)
