"""Host-event nesting: the parent, depth and thread of every host event, computed once per trace, vectorised.

Host events on one thread (python_function, cpu_op, user_annotation, cuda_runtime, cuda_driver) nest in time
(DESIGN.md "A way to compute them in n log n": "host events nest per thread; build the parent index once").
:func:`host_tree` sorts them per thread by (ts asc, end desc) into *nodes* and gives every node:

- ``parent``: the innermost enclosing event, i.e. the **latest-starting earlier event on the same thread that
  contains it** (``s_p <= s_i``, ``e_i <= e_p + EPS_US``, ``s_i < e_p``), -1 for roots. Zero-duration events are
  leaves; touching intervals (``s_i == e_p``) do not nest. ``EPS_US`` (1 ns, Kineto's resolution) absorbs the
  float rounding of ``ts + dur`` (children that end 0.2 ns after their parent).
- ``open_top``: the latest-starting earlier event still open at the node's start (``e_j > s_i``), -1 if none.
  When it is not the parent, the node *partially overlaps* it (starts inside, ends after). Real traces do this
  systematically: a ``record_function`` range (user_annotation) starts inside the ``_record_function_enter_new``
  Python frame and ends inside ``__exit__``. Such a node is nested under its innermost *container* instead, so
  every ancestor of a node always contains it, and the count becomes a warning (``partial_overlaps``).
- ``depth``: number of ancestors.

Equivalently, a simple stack sweep over the nodes in order (keep every event still open; the parent is the
topmost one that contains the new event) gives the same answer; tests/analyses/test_stacks.py checks exactly
that.

How (no per-event Python loop): "latest earlier event whose end reaches a threshold" is found for all nodes at
once by pointer jumping: every node starts at its predecessor and jumps to the candidate's own current candidate
until the candidate qualifies; each jump skips only events that cannot qualify, and the number of rounds is about
log2 of the longest run of siblings plus the depth change. Depth comes from pointer doubling over ``parent``.

Frame names are normalised (:func:`normalize_frame`: object addresses stripped) over the symbol table, not the
events, so one call site aggregates across calls and runs.

API (stable; node indices index the HostTree arrays, *host rows* are positional rows of ``trace.host``):

- ``host_tree(trace) -> HostTree`` (cached per trace object)
- ``HostTree`` fields: ``order`` (node -> host row), ``node_of`` (host row -> node), ``thread`` (node -> thread
  index into ``threads``, a frame of rank/pid/tid), ``thread_bounds`` (nodes of thread k are
  ``thread_bounds[k]:thread_bounds[k+1]``), ``start_us``, ``end_us``, ``cat`` (codes into
  ``gaptrace.trace.HOST_CATEGORIES``), ``name`` (codes into ``trace.symbols``), ``frame`` (codes into
  ``frames``, the normalised names), ``frame_has_source``, ``parent``, ``open_top``, ``depth``,
  ``partial_overlaps``; methods ``nodes(rows)``, ``rows(nodes)``, ``frame_names(nodes)``, ``is_partial()``;
  ``CAT_CODE[cat]`` gives the ``cat`` code of a host category
- ``normalize_frame(name) -> str``; ``frame_table(trace) -> (codes per host row, frames Index)``
- ``enclosing(tree, nodes, node_mask, include_self=False) -> nodes`` (generic innermost enclosing node)
- ``innermost_site(tree, rows) -> rows``: innermost enclosing python_function frame with a source file
- ``innermost_op(tree, rows) -> rows``: innermost enclosing cpu_op (ATen op)
- ``outermost_op(tree, rows) -> rows``: outer end of the contiguous cpu_op chain around the innermost op
  (``aten::item`` for ``aten::item -> aten::_local_scalar_dense -> cudaMemcpyAsync``)
- ``aten_op_mask(tree)``, ``innermost_aten_op(tree, rows)``, ``outermost_aten_op(tree, rows)``: the same over
  cpu_ops that are operators (a record_function label written as a cpu_op, a name with '#', is not one)
- ``frame_stacks(tree, rows, cats=("python_function",), include_self=True) -> (stack_id, stacks)``: per row the
  id of its interned stack; ``stacks[id]`` is the tuple of normalised frame names from the row outward.
All helpers return -1 (or "") where there is no such frame.
"""
from __future__ import annotations

import dataclasses
import functools
import re

import numpy as np
import pandas as pd

from gaptrace.bounds import MAX_STACK_FRAMES, bound_stack
from gaptrace.trace import HOST_CATEGORIES, Trace

__all__ = [
    "EPS_US",
    "HostTree",
    "host_tree",
    "normalize_frame",
    "frame_table",
    "enclosing",
    "innermost_site",
    "innermost_op",
    "outermost_op",
    "frame_stacks",
]

EPS_US = 1e-3  # 1 ns: float rounding of ts + dur; a child may end this much after its parent and still nest

CAT_CODE = {c: i for i, c in enumerate(HOST_CATEGORIES)}

# "<built-in method items of dict object at 0x7fa33bdb7fc0>" -> "<built-in method items of dict object>"
_ADDR_AT_RE = re.compile(r"\s+at\s+0x[0-9a-fA-F]+")
_ADDR_RE = re.compile(r"0x[0-9a-fA-F]{4,}")
# "file.py(123): func": a Python frame with a source location
_SOURCE_RE = re.compile(r"\(\d+\):\s")


def normalize_frame(name: str) -> str:
    """A frame name with object addresses removed, so a call site aggregates across calls and runs.

    ``" at 0x7f…"`` is dropped; any other hex id of 4+ digits becomes ``0x…``. Other text is kept as written.
    """
    s = _ADDR_AT_RE.sub("", name)
    return _ADDR_RE.sub("0x…", s)


def _has_source(frame: str) -> bool:
    return not frame.startswith("<built-in") and _SOURCE_RE.search(frame) is not None


def frame_table(trace: Trace) -> tuple[np.ndarray, pd.Index]:
    """Normalised frame code per host row and the frame names: ``(codes (n,) int32, frames Index)``.

    Normalisation runs once per distinct name used by a host event (the symbol table), not per event.
    """
    codes = trace.host["name"].cat.codes.to_numpy()
    used = np.unique(codes[codes >= 0]) if len(codes) else np.empty(0, dtype=codes.dtype)
    names = [normalize_frame(str(trace.symbols[c])) for c in used]
    frames, inv = np.unique(np.array(names, dtype=object), return_inverse=True) if names else (
        np.empty(0, dtype=object), np.empty(0, dtype=np.int64))
    lut = np.full(len(trace.symbols) + 1, -1, dtype=np.int32)
    lut[used] = inv
    return lut[codes], pd.Index(frames, dtype=object)


@dataclasses.dataclass(frozen=True, eq=False)
class HostTree:
    """Host events of a trace as per-thread nesting trees. Arrays are (n,) and indexed by node (see module doc)."""

    order: np.ndarray  # int64 node -> positional row of trace.host
    node_of: np.ndarray  # int64 host row -> node
    thread: np.ndarray  # int32 node -> thread index
    threads: pd.DataFrame  # per thread index: rank, pid, tid, nodes
    thread_bounds: np.ndarray  # (T + 1,) int64 node offsets per thread
    start_us: np.ndarray  # float64
    end_us: np.ndarray  # float64
    cat: np.ndarray  # int8 codes into HOST_CATEGORIES
    name: np.ndarray  # int32 codes into trace.symbols
    frame: np.ndarray  # int32 codes into frames
    frames: pd.Index  # normalised frame names
    frame_has_source: np.ndarray  # bool per frame: a python frame "file.py(123): func", not "<built-in …>"
    parent: np.ndarray  # int64 node or -1
    open_top: np.ndarray  # int64 node or -1
    partial_overlaps: int

    @property
    def n(self) -> int:
        return len(self.order)

    @functools.cached_property
    def depth(self) -> np.ndarray:
        """(n,) int32: number of ancestors of every node (computed on first use; no analysis needs it)."""
        return _depth(self.parent)

    @property
    def max_depth(self) -> int:
        return int(self.depth.max()) if self.n else 0

    def nodes(self, rows: np.ndarray) -> np.ndarray:
        """Nodes of host rows (positional rows of trace.host); -1 stays -1."""
        rows = np.asarray(rows, dtype=np.int64)
        return np.where(rows >= 0, self.node_of[np.maximum(rows, 0)], -1) if self.n else rows.copy()

    def rows(self, nodes: np.ndarray) -> np.ndarray:
        """Host rows of nodes; -1 stays -1."""
        nodes = np.asarray(nodes, dtype=np.int64)
        return np.where(nodes >= 0, self.order[np.maximum(nodes, 0)], -1) if self.n else nodes.copy()

    def frame_names(self, nodes: np.ndarray) -> np.ndarray:
        """Normalised frame name of each node (object array); "" for -1."""
        nodes = np.asarray(nodes, dtype=np.int64)
        names = np.append(self.frames.to_numpy(dtype=object), "")
        codes = np.where(nodes >= 0, self.frame[np.maximum(nodes, 0)] if self.n else -1, -1)
        return names[codes]

    def is_partial(self) -> np.ndarray:
        """(n,) bool: the node starts inside an open event that it outlasts (a partial overlap)."""
        return _partial(self.start_us, self.end_us, self.parent, self.open_top)


COMPILED_MIN_NODES = 500_000  # from here on the compiled walk (numba is then imported anyway by the loader)


def _prev_reaching(end: np.ndarray, first: np.ndarray, lo: np.ndarray, hi: np.ndarray | None,
                   seed: np.ndarray | None = None) -> np.ndarray:
    """For every i: the largest j < i on the same thread with ``end[j] > lo[i]`` and ``end[j] >= hi[i]``, or -1.

    Nodes are sorted by (thread, start); ``first[i]`` is the first node of i's thread. Pointer jumping:
    ``cand[i]`` starts at ``seed[i]`` (default i - 1; any seed such that every index in (seed[i], i) fails for i);
    while it fails, jump to ``cand[cand[i]]``. Invariant: every index in (cand[i], i) fails for i (if k fails for j
    and j fails for i then k fails for i, because ``start`` is sorted and the thresholds are start- or end-based),
    so the answer is exact. A candidate is always in i's own thread or -1 (cand[c] of a same-thread c is too).
    """
    n = len(end)
    cand = np.arange(n, dtype=np.int64) - 1 if seed is None else seed.astype(np.int64, copy=True)
    cand[cand < first] = -1
    if n >= COMPILED_MIN_NODES and bool((cand < np.arange(n)).all()):
        # the same jumps one node after the other, each from its candidate's final answer (which the invariant
        # allows): no round of numpy calls per jump, for the big traces whose load has compiled code anyway
        from ._compiled import prev_reaching_walk

        lo = np.ascontiguousarray(lo, dtype=np.float64)
        hi_ = lo if hi is None else np.ascontiguousarray(hi, dtype=np.float64)
        prev_reaching_walk(np.ascontiguousarray(end, dtype=np.float64), lo, hi_, hi is not None, cand)
        return cand
    active = np.flatnonzero(cand >= 0)
    while len(active):
        c = cand[active]
        ok = end[c] > lo[active]
        if hi is not None:
            ok &= end[c] >= hi[active]
        fail = ~ok
        cont = active[fail]
        nxt = cand[c[fail]]
        cand[cont] = nxt
        active = cont[nxt >= 0]
    return cand


def _depth(parent: np.ndarray) -> np.ndarray:
    """Number of ancestors of every node, by pointer doubling over ``parent`` (log2(max depth) rounds)."""
    depth = (parent >= 0).astype(np.int32)
    jump = parent.copy()
    live = np.flatnonzero(jump >= 0)
    while len(live):
        j = jump[live]
        nxt = jump[j]
        depth[live] += depth[j]  # j's distance to jump[j], or to its root once jump[j] == -1
        jump[live] = nxt
        live = live[nxt >= 0]
    return depth


def _partial(start: np.ndarray, end: np.ndarray, parent: np.ndarray, open_top: np.ndarray) -> np.ndarray:
    o = np.maximum(open_top, 0)
    return (open_top >= 0) & (open_top != parent) & (end[o] > start + EPS_US)


def host_tree(trace: Trace) -> HostTree:
    """Nesting of all host events of ``trace`` per (rank, pid, tid) thread (definitions: module docstring).

    O(n log n): one lexsort, then pointer jumping (about log n vectorised rounds). Kept on the trace
    (:meth:`gaptrace.trace.Trace.memo`, while ``trace.host`` is the same frame), so every analysis of one trace
    shares it. Never raises for a trace without host events (n = 0).
    """
    return trace.memo("host_tree", trace.host, lambda: _build(trace))


def _thread_start_order(thread: np.ndarray, start: np.ndarray, end: np.ndarray, n_threads: int) -> np.ndarray:
    """(n,) int64 permutation sorting rows by (thread, start, -end): ``np.lexsort((-end, start, thread))``.

    Faster on real traces: a stable sort by start (timsort on nearly sorted times), then a stable radix sort by a
    16-bit thread code, then the rare rows tied on (thread, start) re-sorted by -end.
    """
    if n_threads >= 1 << 16:
        return np.lexsort((-end, start, thread)).astype(np.int64)
    order = np.argsort(start, kind="stable")
    order = order[np.argsort(thread[order].astype(np.uint16), kind="stable")]
    s_th, s_ts = thread[order], start[order]
    tie = (s_ts[1:] == s_ts[:-1]) & (s_th[1:] == s_th[:-1])
    if tie.any():
        at = np.flatnonzero(tie)
        pos = np.union1d(at, at + 1)  # positions in a tied run
        run = np.cumsum(np.r_[True, ~((pos[1:] == pos[:-1] + 1) & tie[pos[:-1]])])
        sub = order[pos]
        order[pos] = sub[np.lexsort((-end[sub], run))]
    return order.astype(np.int64, copy=False)


def _build(trace: Trace) -> HostTree:
    h = trace.host
    n = len(h)
    rank = h["rank"].to_numpy().astype(np.int64)
    pid = h["pid"].cat.codes.to_numpy().astype(np.int64)
    tid = h["tid"].cat.codes.to_numpy().astype(np.int64)
    nsym = len(trace.symbols) + 1
    tkey = (rank * nsym + (pid + 1)) * nsym + (tid + 1)
    # threads numbered in sorted key order; factorize (hashing) then a sort of the few distinct keys is far cheaper
    # than np.unique's sort of every row
    codes, uniq = pd.factorize(tkey, sort=False)
    rank_of = np.empty(len(uniq), dtype=np.int64)
    rank_of[np.argsort(uniq)] = np.arange(len(uniq), dtype=np.int64)
    uniq = np.sort(uniq)
    thread_of_row = rank_of[codes] if n else np.empty(0, dtype=np.int64)
    ts = h["ts_us"].to_numpy(dtype=np.float64)
    te = h["end_us"].to_numpy(dtype=np.float64)
    order = _thread_start_order(thread_of_row, ts, te, len(uniq))
    node_of = np.empty(n, dtype=np.int64)
    node_of[order] = np.arange(n, dtype=np.int64)
    thread = thread_of_row[order].astype(np.int32)
    start, end = ts[order], te[order]
    counts = np.bincount(thread, minlength=len(uniq))
    bounds = np.r_[0, np.cumsum(counts)].astype(np.int64)
    first = order[bounds[:-1]] if n else np.empty(0, dtype=np.int64)
    threads = pd.DataFrame({
        "rank": rank[first] if n else np.empty(0, np.int64),
        "pid": h["pid"].iloc[first].astype(str).to_numpy() if n else np.empty(0, object),
        "tid": h["tid"].iloc[first].astype(str).to_numpy() if n else np.empty(0, object),
        "nodes": counts,
    })

    cat_codes = h["cat"].cat.codes.to_numpy().astype(np.int8)[order]
    name_codes = h["name"].cat.codes.to_numpy().astype(np.int32)[order]
    frame_codes, frames = frame_table(trace)
    frame_codes = frame_codes[order]
    has_source = np.array([_has_source(f) for f in frames], dtype=bool)

    # open_top: latest earlier event with end > s_i (the innermost event open when i starts)
    first_of = bounds[:-1][thread] if n else np.empty(0, dtype=np.int64)
    open_top = _prev_reaching(end, first_of, start, None)
    # parent: latest earlier event with end > s_i and end >= e_i - EPS (contains i). Everything after open_top
    # ended by s_i, so the search starts there and usually stops at once (it moves only at partial overlaps).
    parent = _prev_reaching(end, first_of, start, end - EPS_US, seed=open_top)
    partial = int(_partial(start, end, parent, open_top).sum())
    return HostTree(order=order, node_of=node_of, thread=thread, threads=threads, thread_bounds=bounds,
                    start_us=start, end_us=end, cat=cat_codes, name=name_codes, frame=frame_codes,
                    frames=frames, frame_has_source=has_source, parent=parent, open_top=open_top,
                    partial_overlaps=partial)


# Frames that mean "this thread is parked": a thread sitting in them while the GPU idles did not cause the idle
# (tqdm's monitor, a worker pool waiting for jobs).
WAIT_FRAME_RE = re.compile(
    r"^(?:.*threading\.py\(\d+\): (?:wait|join|_wait_for_tstate_lock)"
    r"|.*queue\.py\(\d+\): get"
    r"|.*selectors\.py\(\d+\): select"
    r"|<built-in method (?:acquire|wait|select|poll|control) of .*"
    r"|<built-in function (?:sleep|select)>)$")


def waiting_frames(tree: "HostTree") -> np.ndarray:
    """(frames,) bool: normalised frame names that mean the thread is parked (``WAIT_FRAME_RE``)."""
    return np.array([bool(WAIT_FRAME_RE.match(f)) for f in tree.frames], dtype=bool)


# ---------------------------------------------------------------- enclosing-frame helpers (for syncs and gaps)

def enclosing(tree: HostTree, nodes: np.ndarray, node_mask: np.ndarray, include_self: bool = False) -> np.ndarray:
    """Innermost ancestor of each node (or the node itself with ``include_self``) where ``node_mask`` is True.

    Shapes: nodes (q,) int (-1 allowed), node_mask (n,) bool -> (q,) int64 nodes, -1 where none.
    One vectorised step per depth level for the first ``_WALK_ROUNDS`` levels; queries still unresolved then are
    answered by :func:`_marked_ancestor` (pointer doubling over the whole tree, O(n log depth)), so a stack
    200,000 frames deep costs 18 doubling rounds, not 200,000 steps.
    """
    cur = np.asarray(nodes, dtype=np.int64).copy()
    if not include_self:
        cur = np.where(cur >= 0, tree.parent[np.maximum(cur, 0)] if tree.n else -1, -1)
    out = np.full(len(cur), -1, dtype=np.int64)
    live = np.flatnonzero(cur >= 0)
    for _ in range(_WALK_ROUNDS):
        if not len(live):
            return out
        c = cur[live]
        hit = node_mask[c]
        out[live[hit]] = c[hit]
        live = live[~hit]
        nxt = tree.parent[cur[live]]
        cur[live] = nxt
        live = live[nxt >= 0]
    if len(live):
        out[live] = _marked_ancestor(tree, node_mask)[cur[live]]
    return out


_WALK_ROUNDS = 64


def _marked_ancestor(tree: HostTree, node_mask: np.ndarray) -> np.ndarray:
    """(n,) int64: for every node, itself when marked, else its innermost marked ancestor (-1 if none).

    Pointer doubling: ``f(v) = v`` for a marked node, its parent otherwise (-1 at a root); after k rounds of
    ``f <- f∘f`` every node points 2^k steps up or at its marked ancestor, so about log2(depth) rounds.
    """
    idx = np.arange(tree.n, dtype=np.int64)
    f = np.where(node_mask, idx, tree.parent).astype(np.int64)
    while True:
        todo = np.flatnonzero((f >= 0) & ~node_mask[np.maximum(f, 0)])
        if not len(todo):
            return f
        f[todo] = f[f[todo]]


def _marked_depth(tree: HostTree, node_mask: np.ndarray) -> np.ndarray:
    """(n,) int64: the number of marked nodes among each node and its ancestors (pointer doubling, as above)."""
    val = node_mask.astype(np.int64)
    ptr = tree.parent.astype(np.int64).copy()
    while True:
        live = np.flatnonzero(ptr >= 0)
        if not len(live):
            return val
        p = ptr[live]
        val[live] += val[p]
        ptr[live] = ptr[p]


# Frames of PyTorch itself ("torch/utils/_device.py(100): __torch_function__", ".../site-packages/torch/...") are
# plumbing between the user's call and the op: a call site is the first frame outside them, when there is one.
_TORCH_FRAME_RE = re.compile(r"^(?:torch/|.*[/\\]site-packages[/\\]torch[/\\])")


def _site_mask(tree: HostTree, skip_torch: bool = False) -> np.ndarray:
    py = tree.cat == CAT_CODE["python_function"]
    ok = tree.frame_has_source
    if skip_torch:
        ok = ok & ~np.array([bool(_TORCH_FRAME_RE.match(f)) for f in tree.frames], dtype=bool)
    return py & ok[np.maximum(tree.frame, 0)] & (tree.frame >= 0)


def innermost_site(tree: HostTree, rows: np.ndarray) -> np.ndarray:
    """Host row of the innermost enclosing python_function frame that has a source file, per host row (-1: none).

    A ``<built-in method …>`` frame names the call, not the site, so it is skipped (DESIGN.md "Host stacks");
    so are PyTorch's own frames (``torch/…``: function-mode and dispatch plumbing), unless nothing else encloses
    the row, in which case the innermost torch frame is the site.
    """
    nodes = tree.nodes(rows)
    site = enclosing(tree, nodes, _site_mask(tree, skip_torch=True))
    miss = site < 0
    if miss.any():
        site[miss] = enclosing(tree, nodes[miss], _site_mask(tree))
    return tree.rows(site)


def innermost_op(tree: HostTree, rows: np.ndarray) -> np.ndarray:
    """Host row of the innermost enclosing cpu_op (ATen op, e.g. ``aten::_local_scalar_dense``), -1 if none."""
    return tree.rows(enclosing(tree, tree.nodes(rows), tree.cat == CAT_CODE["cpu_op"]))


def outermost_op(tree: HostTree, rows: np.ndarray) -> np.ndarray:
    """Host row of the outermost cpu_op of the contiguous op chain around each row's innermost enclosing op.

    ``aten::item -> aten::_local_scalar_dense -> cudaMemcpyAsync`` gives ``aten::item``; an op chain interrupted
    by a Python frame (a torch.compile region) stops there. -1 where there is no enclosing op.
    """
    return _outermost_chain(tree, rows, tree.cat == CAT_CODE["cpu_op"])


def _outermost_chain(tree: HostTree, rows: np.ndarray, is_op: np.ndarray) -> np.ndarray:
    """Host row of the outermost node of the contiguous ``is_op`` chain around each row's innermost ``is_op``
    ancestor (-1 where there is none)."""
    cur = enclosing(tree, tree.nodes(rows), is_op)
    live = np.flatnonzero(cur >= 0)
    while len(live):
        p = tree.parent[cur[live]]
        up = (p >= 0) & is_op[np.maximum(p, 0)]
        cur[live[up]] = p[up]
        live = live[up]
    return tree.rows(cur)


def frame_stacks(tree: HostTree, rows: np.ndarray, cats: tuple[str, ...] = ("python_function",),
                 include_self: bool = True) -> tuple[np.ndarray, list[tuple[str, ...]]]:
    """Interned frame stacks: for each host row, the normalised names of its frames of ``cats`` from it outward.

    Returns ``(stack_id (q,) int64, stacks)``: ``stacks[stack_id[k]]`` is a tuple, innermost first (empty tuple
    for a row of -1), bounded by :func:`gaptrace.bounds.bound_stack` (at most ``MAX_STACK_FRAMES`` frames, then
    a last frame naming how many outer frames were cut). Equal stacks share an id, so callers aggregate by id.
    Cost O(q · MAX_STACK_FRAMES) in numpy (plus O(n log depth) once when a stack is deeper than that).
    """
    mask = np.isin(tree.cat, [CAT_CODE[c] for c in cats])
    cur = enclosing(tree, tree.nodes(rows), mask, include_self=include_self)
    cols = [cur]
    while len(cols) < MAX_STACK_FRAMES:
        nxt = enclosing(tree, cols[-1], mask)
        if not (nxt >= 0).any():
            break
        cols.append(nxt)
    chain = np.stack(cols, axis=1) if len(cur) else np.empty((0, 1), dtype=np.int64)
    codes = np.where(chain >= 0, tree.frame[np.maximum(chain, 0)] if tree.n else -1, -1).astype(np.int64)
    # the full depth of each stack: known from the chain unless it reached MAX_STACK_FRAMES frames
    depth = (chain >= 0).sum(axis=1).astype(np.int64)
    if len(cols) == MAX_STACK_FRAMES:
        deep = chain[:, -1] >= 0
        if deep.any():
            depth[deep] = _marked_depth(tree, mask)[chain[deep, 0]]
    uniq, inv = np.unique(np.c_[codes, depth], axis=0, return_inverse=True)
    names = tree.frames.to_numpy(dtype=object)
    stacks = [bound_stack(tuple(names[c] for c in row[:-1] if c >= 0), int(row[-1])) for row in uniq]
    return inv.reshape(-1).astype(np.int64), stacks


# ---------------------------------------------------------------- added for analyses/syncs.py (blocking syncs)
# Older Kineto writes record_function ranges as cpu_op ("ProfilerStep#5", "Optimizer.step#SGD.step",
# "## sparse_data_dist ##"); as an "ATen op" of a call site they would split one site per profiler step.

def aten_op_mask(tree: HostTree) -> np.ndarray:
    """(n,) bool: cpu_op nodes that are operators, i.e. not record_function labels written as cpu_op (any name
    containing '#': ``ProfilerStep#5``, ``Optimizer.step#SGD.step``, ``## name ##``). Evaluated per frame name."""
    op_frame = np.array(["#" not in f for f in tree.frames], dtype=bool)
    return (tree.cat == CAT_CODE["cpu_op"]) & (tree.frame >= 0) & op_frame[np.maximum(tree.frame, 0)]


def innermost_aten_op(tree: HostTree, rows: np.ndarray) -> np.ndarray:
    """Like :func:`innermost_op`, over :func:`aten_op_mask` ops only. Host rows, -1 where none."""
    return tree.rows(enclosing(tree, tree.nodes(rows), aten_op_mask(tree)))


def outermost_aten_op(tree: HostTree, rows: np.ndarray) -> np.ndarray:
    """Like :func:`outermost_op`, over :func:`aten_op_mask` ops only: ``aten::to`` for
    ``ProfilerStep#7 -> aten::to -> aten::_to_copy -> aten::copy_ -> cudaMemcpyAsync``. Host rows, -1 where none."""
    return _outermost_chain(tree, rows, aten_op_mask(tree))
