"""Replay of the host–device pipeline of one trace: a discrete-event model that re-derives every device start from
its dependencies (docs/DESIGN.md "The replay model").

What is replayed, for one device ``(rank, device)`` and the one host thread that issues its CUDA calls:

- the host chain: the thread's top-level runtime calls (cuda_runtime / cuda_driver events not nested in another),
  in order; before call k the host works ``work_us[k]`` = s_k − e_{k−1} (measured), the call itself costs
  ``cost_us[k]`` = e_k − s_k, or for a blocking call the part after the awaited device work was done,
  e_k − max(s_k, R_k) (R_k: the measured completion of what it waits for);
- device items on each stream, in launch order: one per kernel / memcpy / memset launch, one per CUDA graph launch
  (its N nodes keep their measured offsets from the first node, so the measured intra-graph gaps are kept;
  ``dur_us`` is the graph's span);
- dependencies: item i of a stream ends at e_i = max(l_i, e_{i−1} + q_i) + d_i, with l_i the earliest start its
  launch allows (call start + λ_kind for kernels, copies and memsets; S + f·(E − S) for graph launches, f the
  median fraction of the cudaGraphLaunch call elapsed when a launch-bound first node started) and q_i the device's
  queued-launch gap: an item the trace shows queued (its stream busy when its launch allowed it to start) keeps its
  own start − previous end (≤ LAUNCH_BOUND_GAP_US), every other eager item the median q of the queued ones (0 for
  graph launches; :func:`gaptrace.analyses.profiler_cost.unprofiled_inputs` gives the unqueued ones the
  calibration's measured gap, when it has one).
  λ_kind is the median start − launch of the items that found their stream idle (calibrated on the trace itself);
- cross-stream edges (:func:`event_wait_edges`, :func:`sync_order_edges`): an item after a cudaStreamWaitEvent starts
  no earlier than the work recorded before the event ends, and the first item on each stream after a blocking call
  no earlier than what the call awaited on the other streams (kept when a counterfactual takes the wait out):
  l_i ← max(l_i, e_p + w), w the trace's median wait latency (``latency_us["stream_wait"]``);
- blocking calls (CUDA "API synchronization behavior"): cudaDeviceSynchronize and its driver form wait for every item
  launched before them, cudaStreamSynchronize for its stream's (the ``cuda_sync`` row names it; without one, every
  stream's), and so does a device memory free (cudaFree, cuMemFree: it
  synchronizes the device, CUDA C++ Programming Guide "Implicit Synchronization"); cudaEventSynchronize for the items launched before the
  cudaEventRecord it waits on (the latest record before the call whose measured completion precedes the call's
  return: Kineto writes no event handle for the record); a device-to-host copy (cudaMemcpy, or cudaMemcpyAsync to
  pageable memory) for the copy itself and everything queued before it; a pageable host-to-device copy for the
  work queued before it (the stream sync the driver performs before staging). Blocking call k returns at
  E_k = max(S_k, R_k) + cost_us[k].

The recurrence of one stream between two blocking calls is a max-plus scan, solved in closed form:
with u_i = q_i + d_i and U = cumsum(u), e_i = U_i + max(e_carry, max_{j<=i}(l_j + d_j − U_j)). The host chain
between blocking calls is a cumsum. :func:`replay` walks the blocking calls (one numpy step per blocking segment),
never the events. Replaying the trace unchanged reproduces the measured timeline up to the calibrated latencies
(tests/analyses/test_replay.py measures the error on every shipped capture).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Any

import numpy as np
import pandas as pd

from gaptrace.trace import EARLY_DEVICE_US, GRAPH_LAUNCH_NAMES, Trace, TraceError

from .occupancy import resolve_device
from .syncs import FREE_SYNC_NAMES

__all__ = ["ReplayModel", "ReplayResult", "build_model", "replay", "host_time_map", "round_starts",
           "round_periods", "unchanged_error"]

SYNC_NAMES = re.compile(r"^(cuda(Stream|Device|Event|Ctx)Synchronize|cu(Stream|Ctx|Event)Synchronize)")
MEMCPY_SYNC_NAMES = ("cudaMemcpy", "cudaMemcpy2D", "cudaMemcpy3D", "cuMemcpyDtoH_v2", "cuMemcpyHtoD_v2",
                     "cuMemcpy")
EVENT_RECORD = re.compile(r"^(cudaEventRecord|cuEventRecord)")
EVENT_SYNC = re.compile(r"^(cudaEventSynchronize|cuEventSynchronize)")
STREAM_WAIT_EVENT = re.compile(r"^(cudaStreamWaitEvent|cuStreamWaitEvent)")
# how many event records before a cudaStreamWaitEvent may hold the event it waits on (Kineto names no event handle on
# the runtime calls: the latest record whose producer item fits the measured timeline is taken)
WAIT_RECORDS_BACK = 4
# a consumer that starts this long after its producer ended was held by something else: no sample of the wait latency
STREAM_WAIT_MAX_US = 50.0
STREAM_SYNC = re.compile(r"^(cudaStreamSynchronize|cuStreamSynchronize)")
# a device memory free waits for the device to drain (syncs.FREE_SYNC_NAMES; CUDA C++ Programming Guide, "Implicit
# Synchronization"); the stream-ordered cudaFreeAsync does not
FREE_SYNC = re.compile(r"^(" + "|".join(FREE_SYNC_NAMES) + r")(_v\d+)?$")
RELEASE_EPS_US = 2.0
LAUNCH_BOUND_GAP_US = 5.0  # a graph's first node that started this long after its stream's previous item was held by its launch  # an event's completion may trail the sync's return by clock skew of this much


@dataclasses.dataclass
class ReplayModel:
    """The measured pipeline of one device and its launching thread (module docstring). Times in µs relative to
    ``t0_us`` (the trace clock value of the first call's start), so that float64 sums keep sub-ns precision.

    Host chain, (K,) arrays in call order: ``call_row`` (position in ``trace.host``), ``call_name``,
    ``call_start_us``, ``call_end_us`` (measured), ``work_us`` (host work before the call; work_us[0] = 0),
    ``cost_us`` (the call's own host cost; for blocking calls the part after the wait), ``blocking`` (bool),
    ``await_items`` (int: the call waits for items [0, await_items) to complete; 0 = nothing),
    ``graph_nodes`` (N for graph launches, else 0).
    Device items, (I,) arrays in launch order: ``item_call`` (index into the chain), ``item_stream``,
    ``item_dur_us``, ``item_gap_us`` (q_i), ``item_lat_us`` (λ, or f for graph launches), ``item_after_end`` (True: l = S + f·(E − S),
    graph launches; False: l = S + λ), ``item_prior`` (not tied to a call of the chain: launched before the trace or by another thread; l = its
    measured start), ``item_pos`` (the chain position items are ordered by: the launch call, or for a prior item the
    last call that started at or before its measured start, −1 before every call; non-decreasing),
    ``item_busy_us`` (Σ of its ops' durations), ``item_start_us`` / ``item_end_us`` (measured).
    Device ops, (n,) arrays: ``op_row`` (position in ``trace.device``), ``op_item``, ``op_offset_us`` (start minus
    its item's start), ``op_start_us`` (measured).
    ``latency_us``: the calibrated λ by kind ("kernel", "memcpy", "memset"), "queue_gap" (q), "queued_items" (how
    many items q is the median of), "graph_fraction" (f over all sizes) and "graph_fraction_by_nodes" ({N: f}).
    ``item_queued`` ((I,) bool): the items the trace shows queued (they keep their own measured gap).
    Cross-stream edges, (m,) int64 sorted by ``edge_item``: item ``edge_item[j]`` starts no earlier than item
    ``edge_on[j]`` ends (``edge_on[j] < edge_item[j]``; :func:`stream_edges`); ``edge_counts`` how many of each kind
    ("event_waits", "event_waits_unmatched", "sync_orders"). ``await_stream`` ((K,) int64): for a stream sync, the
    stream it waits for (it waits for the last item launched on it before the call, not for the whole prefix
    ``await_items``); −1 for every other call. ``op_dur_us`` ((n,)): each device op's measured duration.
    """

    trace_path: str
    key: tuple[int, int]
    tid: str
    t0_us: float
    call_row: np.ndarray
    call_name: np.ndarray
    call_start_us: np.ndarray
    call_end_us: np.ndarray
    work_us: np.ndarray
    cost_us: np.ndarray
    blocking: np.ndarray
    await_items: np.ndarray
    graph_nodes: np.ndarray
    item_call: np.ndarray
    item_stream: np.ndarray
    item_dur_us: np.ndarray
    item_gap_us: np.ndarray
    item_lat_us: np.ndarray
    item_after_end: np.ndarray
    item_prior: np.ndarray
    item_pos: np.ndarray
    item_busy_us: np.ndarray
    item_start_us: np.ndarray
    item_end_us: np.ndarray
    op_row: np.ndarray
    op_item: np.ndarray
    op_offset_us: np.ndarray
    op_start_us: np.ndarray
    latency_us: dict[str, Any]
    warnings: list[str]
    item_queued: np.ndarray | None = None
    edge_item: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    edge_on: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    edge_counts: dict[str, int] = dataclasses.field(default_factory=dict)
    await_stream: np.ndarray | None = None
    op_dur_us: np.ndarray | None = None

    @property
    def calls(self) -> int:
        return len(self.call_start_us)

    @functools.cached_property
    def kernel_arrays(self) -> tuple:
        """The model's arrays as :func:`._compiled.replay_chain` takes them (int64 / float64 / bool, streams as
        indices 0..n−1 and their count), made once per model: every replay of it (one per counterfactual) shares
        them."""
        streams, sidx = np.unique(self.item_stream, return_inverse=True)
        return (self.await_items.astype(np.int64), self.item_call.astype(np.int64), self.item_pos.astype(np.int64),
                self.item_lat_us.astype(np.float64), self.item_after_end.astype(np.bool_),
                self.item_prior.astype(np.bool_), self.call_start_us.astype(np.float64),
                sidx.astype(np.int64).reshape(-1), max(len(streams), 1),
                self.edge_item.astype(np.int64), self.edge_on.astype(np.int64), self.await_stream_index(streams),
                float(self.latency_us.get("stream_wait", 0.0)))

    def await_stream_index(self, streams: np.ndarray) -> np.ndarray:
        """(K,) int64: ``await_stream`` as an index into ``streams`` (the sorted distinct item streams); −1 where
        the call waits for every stream; ``len(streams)`` (a stream with no item: nothing to wait for) where it
        waits for a stream that has none."""
        aw = np.full(self.calls, -1, dtype=np.int64) if self.await_stream is None else self.await_stream
        pos = np.searchsorted(streams, aw)
        known = (pos < len(streams)) & (streams[np.minimum(pos, max(len(streams) - 1, 0))] == aw) if len(streams) \
            else np.zeros(len(aw), dtype=bool)
        return np.where(aw < 0, -1, np.where(known, pos, len(streams))).astype(np.int64)


@dataclasses.dataclass
class ReplayResult:
    """Replayed times (µs relative to the model's ``t0_us``): ``call_start_us``, ``call_end_us`` (K,),
    ``item_start_us``, ``item_end_us`` (I,), ``op_start_us`` (n,); ``work_us`` / ``cost_us`` the inputs used."""

    call_start_us: np.ndarray
    call_end_us: np.ndarray
    item_start_us: np.ndarray
    item_end_us: np.ndarray
    op_start_us: np.ndarray
    work_us: np.ndarray
    cost_us: np.ndarray


def _top_level(ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """(m,) bool over intervals sorted by start: True where the interval is not inside an earlier one."""
    if len(ts) == 0:
        return np.zeros(0, dtype=bool)
    reach = np.maximum.accumulate(end)
    prev_reach = np.concatenate(([-np.inf], reach[:-1]))
    return ts >= prev_reach


def _median(v: np.ndarray, default: float) -> float:
    v = v[np.isfinite(v)]
    return float(np.median(v)) if len(v) else default


def _launch_thread(trace: Trace, key: tuple[int, int], rt: pd.DataFrame) -> str:
    corr = trace.device.loc[(trace.device["rank"].to_numpy() == key[0])
                            & (trace.device["device"].to_numpy() == key[1]), "correlation"].to_numpy()
    linked = rt[np.isin(rt["correlation"].to_numpy(), corr)]
    if linked.empty:
        raise TraceError(f"{trace.path}: no runtime call launches the device's work (no correlation ids in common): "
                         "the pipeline cannot be replayed")
    counts = linked["tid"].astype(str).value_counts()
    return str(counts.index[0])


def _match_names(names: np.ndarray, pattern: str) -> np.ndarray:
    """(n,) bool: ``pd.Series(names).str.match(pattern)``, the regex run once per distinct name."""
    inv, uniq = pd.factorize(np.asarray(names, dtype=object))
    return pd.Series(uniq, dtype=object).str.match(pattern).to_numpy(dtype=bool)[inv]


def _names_in(names: np.ndarray, values) -> np.ndarray:
    """(n,) bool: ``np.isin(names, values)``, tested once per distinct name."""
    inv, uniq = pd.factorize(np.asarray(names, dtype=object))
    return np.isin(np.asarray(uniq, dtype=object), values)[inv]


# the replay derives each device start from its launch call: it refuses a device whose ops mostly have no launch call
# on the launching thread (correlation ids missing or repeated: legitimate traces leave up to 48% untied, a backward
# on autograd's thread) or mostly start before their launch call (host and device clocks that disagree)
MIN_LINKED_SHARE = 0.2
MAX_EARLY_SHARE = 0.5
MIN_OPS_TO_CHECK = 10


def _check_links(trace: Trace, linked: np.ndarray, op_ts_us: np.ndarray, call_start_us: np.ndarray,
                 op_call: np.ndarray) -> None:
    """TraceError (one line) when the device's ops cannot be replayed from their launches: fewer than
    MIN_LINKED_SHARE of them tied to a runtime call of the launching thread by a correlation id that one call
    carries, or more than MAX_EARLY_SHARE of the tied ones starting over EARLY_DEVICE_US before their call began
    (DESIGN.md 5.1: every device start is derived from its launch). ``linked`` (n,) bool, ``op_ts_us`` (n,) and
    ``call_start_us`` (K,) on one clock, ``op_call`` (n,) the call index (−1 untied)."""
    n = len(linked)
    if n < MIN_OPS_TO_CHECK:
        return
    k = int(linked.sum())
    if k < MIN_LINKED_SHARE * n:
        raise TraceError(f"{trace.path}: only {k} of {n} device ops are tied to a launch call of the launching thread "
                         "by their correlation id (ids missing or repeated): the replay cannot derive the device "
                         "timeline, so no unprofiled round or saving is predicted")
    early = int((op_ts_us[linked] < call_start_us[op_call[linked]] - EARLY_DEVICE_US).sum())
    if early > MAX_EARLY_SHARE * k:
        raise TraceError(f"{trace.path}: {early} of {k} device ops start before their launch call began (host and "
                         "device clocks disagree): the replay cannot derive the device timeline, so no unprofiled "
                         "round or saving is predicted")


def build_model(trace: Trace, device: int | tuple[int, int] | None = None, tid: str | None = None) -> ReplayModel:
    """The :class:`ReplayModel` of ``trace`` for ``device`` (the busiest one by default; see
    :func:`gaptrace.analyses.occupancy.resolve_device`). The launching thread is the one whose runtime calls carry
    the most correlation ids of the device's activities; launches from other threads are left out (a warning says
    how many device ops that drops). TraceError (one line) when the trace has no device activity or no launch link.
    ``tid``: replay this host thread instead (the one that holds the loop's step ranges, when two threads launch).
    Formulas: docs/DESIGN.md "The replay model"."""
    key = resolve_device(trace, device)
    h = trace.host
    is_rt = h["cat"].isin(("cuda_runtime", "cuda_driver")).to_numpy() & (h["rank"].to_numpy() == key[0])
    rt = h[is_rt]
    tid = _launch_thread(trace, key, rt) if tid is None else str(tid)
    rt_tid = trace.host_str("tid")[is_rt]
    if not (rt_tid == tid).any():
        raise TraceError(f"{trace.path}: thread {tid} makes no runtime call: the pipeline cannot be replayed from it")
    warnings: list[str] = []
    on_thread = rt_tid == tid
    rows = np.flatnonzero(is_rt)[on_thread]
    ts = h["ts_us"].to_numpy()[rows]
    end = h["end_us"].to_numpy()[rows]
    o = np.lexsort((-end, ts))
    rows, ts, end = rows[o], ts[o], end[o]
    top = _top_level(ts, end)
    rows, ts, end = rows[top], ts[top], end[top]
    names = trace.host_str("name")[rows]
    corr_call = h["correlation"].to_numpy()[rows]
    t0 = float(ts[0])
    s, e = ts - t0, end - t0
    K = len(rows)

    # device ops of the key, joined to their launch call by correlation id
    d = trace.device
    dm = (d["rank"].to_numpy() == key[0]) & (d["device"].to_numpy() == key[1])
    op_rows_all = np.flatnonzero(dm)
    dcorr = d["correlation"].to_numpy()[op_rows_all]
    valid = corr_call >= 0
    uc, cnt = np.unique(corr_call[valid], return_counts=True)
    lookup = pd.Series(np.flatnonzero(valid), index=corr_call[valid])
    lookup = lookup[~lookup.index.duplicated(keep=False)]
    pos = lookup.reindex(dcorr).to_numpy()
    linked = np.isfinite(pos)
    # ops whose launch is not in the chain (launched before the trace began, or by another thread): kept as work
    # that occupies their stream from its measured start (call index -1, launched before every call)
    op_rows = op_rows_all
    op_call = np.where(linked, pos, -1).astype(np.int64)
    _check_links(trace, linked, d["ts_us"].to_numpy()[op_rows_all] - t0, s, op_call)
    if (~linked).any():
        warnings.append(f"{int((~linked).sum())} of {len(dcorr)} device ops are not tied to a runtime call of the "
                        "launching thread (launched before the trace began or by another thread): they keep their "
                        "measured starts")
    ots = d["ts_us"].to_numpy()[op_rows] - t0
    oend = d["end_us"].to_numpy()[op_rows] - t0
    ostream = d["stream"].to_numpy()[op_rows]
    ocorr = dcorr
    op_pos = _untied_positions(op_call, linked, ots, ostream, s)
    o = np.lexsort((ots, ocorr, linked, op_pos))
    op_rows, op_call, op_pos, ots, oend, ostream, ocorr = (a[o] for a in (op_rows, op_call, op_pos, ots, oend,
                                                                            ostream, ocorr))
    # the string columns indexed once, already in that order
    okind, omk, ohm = (trace.device_str(c)[op_rows] for c in ("kind", "memcpy_kind", "host_memory"))
    is_graph_call = _names_in(names, GRAPH_LAUNCH_NAMES)
    # items: one per graph launch call (or per correlation id among the unlinked ops), one per op otherwise
    prior = op_call < 0
    g_op = np.where(prior, True, is_graph_call[np.maximum(op_call, 0)])
    new_item = np.ones(len(op_rows), dtype=bool)
    if len(op_rows) > 1:
        new_item[1:] = ~(g_op[1:] & (op_call[1:] == op_call[:-1]) & (op_pos[1:] == op_pos[:-1])
                         & (ocorr[1:] == ocorr[:-1]) & (ocorr[1:] >= 0))
    op_item = np.cumsum(new_item) - 1
    I = int(op_item[-1]) + 1 if len(op_item) else 0
    first = np.flatnonzero(new_item)
    item_call = op_call[first]
    item_pos = op_pos[first]
    item_stream = ostream[first]
    item_start = ots[first]
    item_end = np.full(I, -np.inf)
    np.maximum.at(item_end, op_item, oend)
    item_dur = item_end - item_start
    op_offset = ots - item_start[op_item]
    item_prior = item_call < 0
    item_graph = ~item_prior & is_graph_call[np.maximum(item_call, 0)]
    item_kind = np.where(item_graph, "graph", okind[first])

    # calibration of λ and q: an item found its stream idle when the stream's previous item ended before its launch
    # call started; it was queued when that previous item ended after the earliest launch-allowed start
    prev_end = np.full(I, -np.inf)
    for st in np.unique(item_stream):
        idx = np.flatnonzero(item_stream == st)
        pe = np.concatenate(([-np.inf], np.maximum.accumulate(item_end[idx])[:-1]))
        prev_end[idx] = pe
    ic = np.maximum(item_call, 0)
    cs = np.where(item_prior, item_start, s[ic])
    ce = np.where(item_prior, item_start, e[ic])
    # event waits across streams: a consumer whose producer was still running when its launch began may have been
    # held by that stream, not by its launch: no λ sample
    ew_c, ew_p, ew_unmatched = event_wait_edges(trace, key, names, corr_call, item_stream, item_pos, item_prior,
                                                item_start, item_end)
    idle = (prev_end < cs) & ~item_prior
    idle[ew_c[item_end[ew_p] > cs[ew_c]]] = False
    latency: dict[str, float] = {}
    lat = np.zeros(I)
    after_end = np.zeros(I, dtype=bool)
    for kind, default in (("kernel", 5.0), ("memcpy", 5.0), ("memset", 5.0)):
        m = idle & (item_kind == kind)
        latency[kind] = _median(item_start[m] - cs[m], default)
        lat[item_kind == kind] = latency[kind]
    # graph launches: under the profiler the first node starts somewhere inside the cudaGraphLaunch call (at its
    # return for some graphs, soon after it began for others): per graph size, the median fraction f of the call
    # elapsed when the first node started, over the launches whose first node started more than LAUNCH_BOUND_GAP_US after the stream's previous item
    # (so the launch, not the stream, set its start); l = S + f·(E − S)
    gn_item = np.zeros(I, dtype=np.int64)
    if I:
        gn_item = np.bincount(op_item, minlength=I)
    # a launch whose first node did not start right after its stream's previous item (more than
    # LAUNCH_BOUND_GAP_US later) started when the launch let it: those calibrate f
    ig = item_graph & (ce > cs) & ((prev_end < cs) | (item_start - prev_end > LAUNCH_BOUND_GAP_US))
    frac = np.clip((item_start[ig] - cs[ig]) / (ce[ig] - cs[ig]), 0.0, 1.0)
    glob_f = float(np.median(frac)) if len(frac) else 1.0
    latency["graph_fraction"] = glob_f
    per_size: dict[int, float] = {}
    for n in np.unique(gn_item[item_graph]):
        m = gn_item[ig] == n
        per_size[int(n)] = float(np.median(frac[m])) if m.any() else glob_f
        sel = item_graph & (gn_item == n)
        after_end[sel], lat[sel] = True, per_size[int(n)]
    latency["graph_fraction_by_nodes"] = {str(k): v for k, v in per_size.items()}
    allowed = np.where(after_end, cs + lat * (ce - cs), cs + lat)
    queued = ~item_graph & ~item_prior & (prev_end > allowed) & np.isfinite(prev_end)
    latency["queue_gap"] = max(0.0, _median(item_start[queued] - prev_end[queued], 0.0))
    latency["queued_items"] = int(queued.sum())  # how many items q is the median of
    # a cross-stream wait's own latency: the median consumer start − producer end over the event waits whose producer
    # was still running when the consumer's launch allowed it to start (the wait, not the launch, held it)
    held = (item_end[ew_p] > allowed[ew_c]) if len(ew_c) else np.zeros(0, dtype=bool)
    wake = item_start[ew_c] - item_end[ew_p] if len(ew_c) else np.zeros(0)
    ok_w = held & (wake >= 0) & (wake <= STREAM_WAIT_MAX_US)
    latency["stream_wait"] = max(0.0, _median(wake[ok_w], 0.0))
    latency["stream_waits_held"] = int(ok_w.sum())
    # an item the trace shows queued keeps its own measured gap (a pair launched together, cuBLAS's split-K GEMM and
    # its reduce, overlaps: gap 0) up to LAUNCH_BOUND_GAP_US (longer: something else held it); every other eager
    # item takes the median q
    own_gap = np.maximum(item_start - np.where(queued, prev_end, item_start), 0.0)
    item_gap = np.where(item_graph | item_prior, 0.0,
                        np.where(queued & (own_gap <= LAUNCH_BOUND_GAP_US), own_gap, latency["queue_gap"]))
    # work launched before the trace keeps its measured start
    lat = np.where(item_prior, item_start, lat)

    # blocking calls and what each one waits for
    nitem_before = np.searchsorted(item_pos, np.arange(K), side="left")  # items launched by calls < k
    nitem_through = np.searchsorted(item_pos, np.arange(K), side="right")  # items launched by calls <= k
    blocking = _match_names(names, SYNC_NAMES) | _match_names(names, FREE_SYNC)
    await_items = np.where(blocking, nitem_before, 0)
    # copies: by the kind of the copy they launched
    cp_item = np.full(K, -1)
    cp_mask = (okind[first] == "memcpy") & ~item_prior
    cp_item[item_call[cp_mask]] = np.flatnonzero(cp_mask)
    has_cp = cp_item >= 0
    ci = np.maximum(cp_item, 0)
    mk, hm = omk[first][ci], ohm[first][ci]
    sync_name = _names_in(names, MEMCPY_SYNC_NAMES)
    dtoh = has_cp & (mk == "DtoH") & (sync_name | (hm == "Pageable"))
    htod = has_cp & (mk == "HtoD") & (hm == "Pageable")
    blocking |= dtoh | htod
    await_items = np.where(dtoh, nitem_through, await_items)
    await_items = np.where(htod, nitem_before, await_items)
    # measured completion of items [0, m): prefix max of the measured item ends
    pm = np.concatenate(([-np.inf], np.maximum.accumulate(item_end))) if I else np.array([-np.inf])
    # event syncs: the latest record before the call whose prefix completed by the call's return
    # (the records' prefix completions are non-decreasing, so the done records before k are a prefix of them)
    rec = np.flatnonzero(_match_names(names, EVENT_RECORD))
    ev_sync = np.flatnonzero(_match_names(names, EVENT_SYNC))
    if len(ev_sync):
        rec_done = pm[nitem_before[rec]]
        j = np.minimum(np.searchsorted(rec_done, e[ev_sync] + RELEASE_EPS_US, side="right"),
                       np.searchsorted(rec, ev_sync, side="left")) - 1
        await_items[ev_sync] = np.where(j >= 0, nitem_before[rec[np.maximum(j, 0)]], 0)
    # a stream sync waits for its own stream only (the cuda_sync "Stream Sync" row of its correlation id names it):
    # the last item launched on that stream before it; −1: every stream (no row, or a device / context sync)
    await_stream = stream_sync_streams(trace, key, names, corr_call, item_stream, blocking)
    R = _awaited_end(pm, await_items, await_stream, item_stream, item_pos, item_end)
    # a stream sync with no row, returned while another stream was still busy: it synchronized one stream, the one
    # whose last item before it ended latest while still before its return
    guess = blocking & (await_stream < 0) & _match_names(names, STREAM_SYNC) & (R > e + RELEASE_EPS_US)
    if guess.any():
        gk = np.flatnonzero(guess)
        best, best_end = np.full(len(gk), -1, dtype=np.int64), np.full(len(gk), -np.inf)
        for st in np.unique(item_stream):
            r_st = _awaited_end(pm, await_items[gk], np.full(len(gk), st), item_stream, item_pos, item_end)
            fits = np.isfinite(r_st) & (r_st <= e[gk] + RELEASE_EPS_US) & (r_st > best_end)
            best = np.where(fits, st, best)
            best_end = np.where(fits, r_st, best_end)
        await_stream[gk] = best
        R = _awaited_end(pm, await_items, await_stream, item_stream, item_pos, item_end)
    # stream syncs on a stream with no pending work of this thread, or a prefix that is not done: trust the measure
    bad = blocking & (R > e + RELEASE_EPS_US)
    if bad.any():
        warnings.append(f"{int(bad.sum())} blocking calls returned before the device work they should wait for was "
                        "done (the trace's clocks or the awaited set disagree): they wait for nothing in the replay")
        await_items[bad] = 0
        await_stream[bad] = -1
        R = _awaited_end(pm, await_items, await_stream, item_stream, item_pos, item_end)
    cost = e - s
    bl_cost = e - np.maximum(s, R)
    cost = np.where(blocking, np.clip(bl_cost, 0.0, cost), cost)
    work = np.concatenate(([0.0], s[1:] - e[:-1]))
    work = np.maximum(work, 0.0)

    so_c, so_p = sync_order_edges(item_stream, item_pos, item_prior, blocking, await_items, await_stream)
    edge_item, edge_on = _edges((ew_c, ew_p), (so_c, so_p))
    edge_counts = {"event_waits": int(len(ew_c)), "event_waits_unmatched": ew_unmatched,
                   "sync_orders": int(len(_edges((so_c, so_p))[0]))}
    if ew_unmatched > max(1, 0.1 * (len(ew_c) + ew_unmatched)):
        warnings.append(f"{ew_unmatched} of {len(ew_c) + ew_unmatched} cudaStreamWaitEvent calls matched no earlier "
                        "event record whose work fits the measured timeline: their streams wait for nothing in the "
                        "replay")

    gnodes = np.zeros(K, dtype=np.int64)
    if I:
        n_per_item = np.bincount(op_item, minlength=I)
        gnodes[item_call[item_graph]] = n_per_item[item_graph]
    return ReplayModel(
        trace_path=trace.path, key=key, tid=tid, t0_us=t0, call_row=rows, call_name=names, call_start_us=s,
        call_end_us=e, work_us=work, cost_us=cost, blocking=blocking, await_items=await_items.astype(np.int64),
        graph_nodes=gnodes, item_call=item_call, item_stream=item_stream, item_dur_us=item_dur,
        item_gap_us=item_gap, item_lat_us=lat, item_after_end=after_end, item_prior=item_prior, item_pos=item_pos,
        item_busy_us=np.bincount(op_item, weights=oend - ots, minlength=I) if I else np.zeros(0), item_start_us=item_start,
        item_end_us=item_end, op_row=op_rows, op_item=op_item, op_offset_us=op_offset, op_start_us=ots,
        latency_us=latency, warnings=warnings, item_queued=queued, edge_item=edge_item, edge_on=edge_on,
        edge_counts=edge_counts, await_stream=await_stream, op_dur_us=oend - ots)


def _per_stream(item_stream: np.ndarray, item_pos: np.ndarray, usable: np.ndarray) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """{stream: (its usable items' indices, their launch positions)}, both non-decreasing."""
    out = {}
    for st in np.unique(item_stream[usable]):
        idx = np.flatnonzero(usable & (item_stream == st))
        out[int(st)] = (idx, item_pos[idx])
    return out


def _last_launched_before(streams: dict, st: int, calls: np.ndarray) -> np.ndarray:
    """(n,) the last item of stream ``st`` launched by a call before each of ``calls`` (−1: none)."""
    idx, pos = streams[st]
    j = np.searchsorted(pos, calls, side="left") - 1
    return np.where(j >= 0, idx[np.maximum(j, 0)], -1)


def _first_launched_after(streams: dict, st: int, calls: np.ndarray) -> np.ndarray:
    """(n,) the first item of stream ``st`` launched by a call after each of ``calls`` (−1: none)."""
    idx, pos = streams[st]
    j = np.searchsorted(pos, calls, side="right")
    return np.where(j < len(idx), idx[np.minimum(j, len(idx) - 1)], -1)


def stream_sync_streams(trace: Trace, key: tuple[int, int], names: np.ndarray, corr_call: np.ndarray,
                        item_stream: np.ndarray, blocking: np.ndarray) -> np.ndarray:
    """(K,) int64: for each cudaStreamSynchronize / cuStreamSynchronize call, the stream it synchronizes (CUDA Runtime
    API: "blocks until stream has completed all operations"), from the ``cuda_sync`` "Stream Sync" row of its
    correlation id (``enable_cuda_sync_events``); −1 for every other call and where no row names one (the call then
    waits for every stream, as before the rows existed)."""
    out = np.full(len(names), -1, dtype=np.int64)
    k = np.flatnonzero(blocking & _match_names(names, STREAM_SYNC))
    if not len(k):
        return out
    st = _sync_row_streams(trace, key, "Stream Sync", corr_call[k])
    ok = np.isfinite(st)
    out[k[ok]] = st[ok].astype(np.int64)
    return out


def _sync_row_streams(trace: Trace, key: tuple[int, int], kind: str, corr: np.ndarray) -> np.ndarray:
    """(len(corr),) float: the stream the device's ``cuda_sync`` row of ``kind`` ("Stream Sync", "Stream Wait
    Event") with each correlation id names (NaN: no row, a row without a stream, or an id that two rows carry)."""
    ds = trace.device_syncs
    if not len(ds):
        return np.full(len(corr), np.nan)
    sel = ((ds["rank"].to_numpy() == key[0]) & (ds["device"].to_numpy() == key[1]) & (ds["stream"].to_numpy() >= 0)
           & (ds["sync_kind"] == kind).to_numpy(dtype=bool))
    by_corr = pd.Series(ds["stream"].to_numpy()[sel], index=ds["correlation"].to_numpy()[sel])
    by_corr = by_corr[~by_corr.index.duplicated(keep=False)]
    return by_corr.reindex(corr).to_numpy(dtype=np.float64)


def _awaited_end(pm: np.ndarray, await_items: np.ndarray, await_stream: np.ndarray, item_stream: np.ndarray,
                 item_pos: np.ndarray, item_end: np.ndarray) -> np.ndarray:
    """(K,) measured completion of what each call waits for: the prefix max ``pm[await_items]``, or for a stream sync
    (``await_stream`` >= 0) the end of the last item of that stream among items [0, await_items) (−inf: none)."""
    R = pm[await_items].copy()
    for st in np.unique(await_stream[await_stream >= 0]):
        calls = np.flatnonzero(await_stream == st)
        idx = np.flatnonzero(item_stream == st)
        j = np.searchsorted(idx, await_items[calls], side="left") - 1
        ends = np.maximum.accumulate(item_end[idx]) if len(idx) else np.zeros(0)
        R[calls] = np.where(j >= 0, ends[np.maximum(j, 0)] if len(idx) else -np.inf, -np.inf)
    return R


def event_wait_edges(trace: Trace, key: tuple[int, int], names: np.ndarray, corr_call: np.ndarray,
                     item_stream: np.ndarray, item_pos: np.ndarray, item_prior: np.ndarray, item_start: np.ndarray,
                     item_end: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """The event waits among one launching thread's items (docs/DESIGN.md "The replay model", cross-stream edges):
    (consumer items, producer items) as (m,) int64, and how many ``cudaStreamWaitEvent`` calls matched no record.

    Each ``cudaStreamWaitEvent`` call (CUDA Runtime API, "Stream Management": work submitted to the stream after the
    call waits until the event completes) makes its stream S wait: S is the ``cuda_sync`` "Stream Wait Event" row of
    the call's correlation id (``enable_cuda_sync_events``), else the stream of the next item the thread launches;
    the consumer is the first item launched on S after the call. Kineto writes no event handle on
    ``cudaEventRecord`` (the sync row's ``wait_on_cuda_event_record_corr_id`` is −1 without CUPTI's CUDA-event
    activity), so the record is inferred: of the ``WAIT_RECORDS_BACK`` latest records before the wait, the latest
    one for which some other stream P has a last item launched before the record that ended (measured) no later
    than the consumer started (+ ``RELEASE_EPS_US``); that item is the producer: the one on the stream of the last
    launch before the record where it fits (a record follows the work it marks), else the latest-ending one over the
    streams. A wait that no record fits (its record came before the trace) gets no edge."""
    empty = np.zeros(0, dtype=np.int64)
    usable = ~item_prior
    wk = np.flatnonzero(_match_names(names, STREAM_WAIT_EVENT))
    I = len(item_stream)
    if not len(wk) or I == 0 or len(np.unique(item_stream[usable])) < 2:
        return empty, empty, 0
    streams = _per_stream(item_stream, item_pos, usable)
    cstream = _sync_row_streams(trace, key, "Stream Wait Event", corr_call[wk])
    nxt = np.searchsorted(item_pos, wk, side="right")
    fallback = np.where(nxt < I, item_stream[np.minimum(nxt, I - 1)], -1).astype(np.float64)
    cstream = np.where(np.isfinite(cstream), cstream, fallback).astype(np.int64)
    consumer = np.full(len(wk), -1, dtype=np.int64)
    for st in streams:
        m = cstream == st
        consumer[m] = _first_launched_after(streams, st, wk[m])
    rec = np.flatnonzero(_match_names(names, EVENT_RECORD))
    n_before = np.searchsorted(rec, wk, side="left")
    producer = np.full(len(wk), -1, dtype=np.int64)
    todo = consumer >= 0
    cstart = np.where(todo, item_start[np.maximum(consumer, 0)], -np.inf)
    for back in range(1, WAIT_RECORDS_BACK + 1):
        j = n_before - back
        live = todo & (producer < 0) & (j >= 0)
        if not live.any():
            break
        r = rec[np.maximum(j, 0)]
        # first the stream of the last launch before the record (a record follows the work it marks: a copy then
        # its event, a forward then its "consumed" event), then the latest-ending item of any other stream
        last = np.searchsorted(item_pos, r, side="left") - 1
        last = np.where(last >= 0, last, -1)
        lp = np.where(last >= 0, item_stream[np.maximum(last, 0)], -1)
        prior_fit = np.full(len(wk), -1, dtype=np.int64)
        best_end = np.full(len(wk), -np.inf)
        found = np.full(len(wk), -1, dtype=np.int64)
        for st in streams:
            p = _last_launched_before(streams, st, r)
            ok = live & (cstream != st) & (p >= 0)
            pe = np.where(ok, item_end[np.maximum(p, 0)], -np.inf)
            consistent = ok & (pe <= cstart + RELEASE_EPS_US)
            prior_fit = np.where(consistent & (lp == st), p, prior_fit)
            fits = consistent & (pe > best_end)
            found = np.where(fits, p, found)
            best_end = np.where(fits, pe, best_end)
        found = np.where(prior_fit >= 0, prior_fit, found)
        producer = np.where(live, found, producer)
    got = todo & (producer >= 0)
    return consumer[got], producer[got], int((todo & ~got).sum())


def sync_order_edges(item_stream: np.ndarray, item_pos: np.ndarray, item_prior: np.ndarray, blocking: np.ndarray,
                     await_items: np.ndarray, await_stream: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The device order a blocking call gives (docs/DESIGN.md "The replay model", cross-stream edges): for a call
    that waits for items [0, m), the first item launched on each stream after it waits for the last awaited item of
    each other stream. While the call waits in the replay these hold anyway; once a counterfactual takes its wait out
    they keep the order the host wait gave: removing a host wait never lets another stream's work start before what
    the wait awaited (on one stream, the stream's own order keeps it: no edges). A stream sync (``await_stream`` >= 0)
    awaited its own stream only: only that stream's last item is a producer. (consumers, producers), (m,) int64."""
    empty = np.zeros(0, dtype=np.int64)
    usable = ~item_prior
    bk = np.flatnonzero(blocking & (await_items > 0))
    if not len(bk) or len(np.unique(item_stream[usable])) < 2:
        return empty, empty
    streams = _per_stream(item_stream, item_pos, usable)
    m_items = await_items[bk]
    cons_all, prod_all = [empty], [empty]
    for s_c in streams:
        cons = _first_launched_after(streams, s_c, bk)
        for s_p, (idx, _pos) in streams.items():
            if s_p == s_c:
                continue
            j = np.searchsorted(idx, m_items, side="left") - 1  # the last awaited item of s_p
            prod = np.where(j >= 0, idx[np.maximum(j, 0)], -1)
            ok = (cons >= 0) & (prod >= 0)
            if await_stream is not None:  # a stream sync awaited its own stream, no other
                ok &= (await_stream[bk] < 0) | (await_stream[bk] == s_p)
            cons_all.append(cons[ok])
            prod_all.append(prod[ok])
    return np.concatenate(cons_all), np.concatenate(prod_all)


def _edges(*pairs: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The union of (consumer, producer) edge lists, unique, sorted by consumer, each producer an earlier item."""
    c = np.concatenate([p[0] for p in pairs]).astype(np.int64)
    p = np.concatenate([p[1] for p in pairs]).astype(np.int64)
    if not len(c):
        return c, p
    u = np.unique(np.stack([c, p], axis=1), axis=0)
    u = u[u[:, 1] < u[:, 0]]  # by construction (a producer is launched before its consumer): the replay's invariant
    return u[:, 0].copy(), u[:, 1].copy()

def _merge(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals [s, e) as sorted, disjoint (starts, ends)."""
    if len(s) == 0:
        return s, e
    o = np.argsort(s, kind="stable")
    s, e = s[o], e[o]
    reach = np.maximum.accumulate(e)
    new = np.concatenate(([True], s[1:] > reach[:-1]))
    idx = np.flatnonzero(new)
    return s[idx], np.maximum.reduceat(e, idx)


def _intersect(a_s: np.ndarray, a_e: np.ndarray, b_s: np.ndarray, b_e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The intersection of two sets of sorted, disjoint intervals, as sorted, disjoint (starts, ends)."""
    if not len(a_s) or not len(b_s):
        return np.zeros(0), np.zeros(0)
    pts = np.unique(np.concatenate((a_s, a_e, b_s, b_e)))
    lo, hi = pts[:-1], pts[1:]
    mid = 0.5 * (lo + hi)

    def inside(s, e):
        i = np.searchsorted(s, mid, side="right") - 1
        return (i >= 0) & (mid < e[np.maximum(i, 0)])

    k = inside(a_s, a_e) & inside(b_s, b_e)
    return _merge(lo[k], hi[k])


def _coverage(us: np.ndarray, ue: np.ndarray, a: np.ndarray, b: np.ndarray,
              weights: np.ndarray | None = None) -> np.ndarray:
    """µs of the merged intervals [us, ue) inside each [a, b): C(b) − C(a), C(t) the covered length before t. With
    ``weights`` ((len(us),)), each interval's µs count ``weights[j]`` times: Σ_j w_j·|[us_j, ue_j) ∩ [a, b)| (the
    intervals sorted and disjoint; a negative weight gives a negative figure)."""
    if not len(us):
        return np.zeros(np.shape(a), dtype=np.float64)
    w = np.ones(len(us)) if weights is None else np.asarray(weights, dtype=np.float64)
    cum = np.concatenate(([0.0], np.cumsum(w * (ue - us))))

    def C(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(us, t, side="right")  # intervals starting at or before t
        j = np.maximum(i - 1, 0)
        full = cum[j]
        part = np.where(i > 0, w[j] * np.clip(t - us[j], 0.0, (ue - us)[j]), 0.0)
        return np.where(i > 0, full + part, 0.0)

    d = C(b) - C(a)
    return np.maximum(d, 0.0) if weights is None else d


def _stream_scan(l: np.ndarray, u: np.ndarray, d: np.ndarray, carry: float) -> np.ndarray:
    """Ends of a stream's items: e_i = max(l_i, e_{i−1} + q_i) + d_i with u = q + d, e_{−1} = carry (max-plus
    closed form: e_i = U_i + max(carry, max_{j<=i}(l_j + d_j − U_j)), U = cumsum(u))."""
    U = np.cumsum(u)
    x = np.maximum.accumulate(l + d - U)
    return U + np.maximum(carry, x)


def _untied_positions(op_call: np.ndarray, linked: np.ndarray, ots: np.ndarray, ostream: np.ndarray,
                      call_start: np.ndarray) -> np.ndarray:
    """(n,) int64 chain position each device op is ordered by: its launch call when ``linked``; an op tied to no
    call takes the position of the first tied op on its stream that started after it (measured), sorted before
    it, so each stream keeps its measured order (a trace of two capture windows, another thread's launches: not
    ahead of every tied op); with no tied op after it on its stream, the last call that started at or before it
    (−1: before every call). ``ots`` and ``call_start`` on one clock."""
    pos = np.where(linked, op_call, np.searchsorted(call_start, ots, side="right") - 1).astype(np.int64)
    untied = ~linked
    if not untied.any():
        return pos
    for st in np.unique(ostream[untied]):
        tied = np.flatnonzero(linked & (ostream == st))
        if not len(tied):
            continue
        o = np.argsort(ots[tied], kind="stable")
        t_sorted = ots[tied][o]
        # the smallest position among the tied ops that start at or after each time (a suffix minimum)
        suffix_min = np.minimum.accumulate(op_call[tied][o][::-1])[::-1]
        u = np.flatnonzero(untied & (ostream == st))
        j = np.searchsorted(t_sorted, ots[u], side="left")
        has = j < len(tied)
        pos[u[has]] = suffix_min[j[has]]
    return pos


def replay(model: ReplayModel, work_us: np.ndarray | None = None, cost_us: np.ndarray | None = None,
           wait: np.ndarray | None = None, item_dur_us: np.ndarray | None = None,
           item_gap_us: np.ndarray | None = None, compiled: bool = True) -> ReplayResult:
    """Replay ``model`` (docs/DESIGN.md "The replay model"), optionally with the host work before each call
    (``work_us``, (K,)), each call's own cost (``cost_us``, (K,)), which blocking calls still wait (``wait``, (K,)
    bool; default: all of them), the device items' durations (``item_dur_us``, (I,)) or their queued-launch gaps
    (``item_gap_us``, (I,): q_i) changed.

    The host chain runs S_k = E_{k−1} + work_k, E_k = S_k + cost_k, except a blocking call that waits:
    E_k = max(S_k, R_k) + cost_k with R_k the replayed completion of items [0, await_items[k]). Items follow the
    stream recurrence of the module docstring. One compiled pass over calls and items (O(n) after the O(n log n)
    model; ``compiled=False``: the numpy twin, one numpy step per blocking call that waits). Returns a
    :class:`ReplayResult`.
    """
    work = model.work_us if work_us is None else np.asarray(work_us, dtype=np.float64)
    cost = model.cost_us if cost_us is None else np.asarray(cost_us, dtype=np.float64)
    dur = model.item_dur_us if item_dur_us is None else np.asarray(item_dur_us, dtype=np.float64)
    gaps = model.item_gap_us if item_gap_us is None else np.asarray(item_gap_us, dtype=np.float64)
    waits = model.blocking.copy() if wait is None else (np.asarray(wait, dtype=bool) & model.blocking)
    waits &= model.await_items > 0
    S, E, ie = (_replay_compiled if compiled else _replay_numpy)(model, work, cost, waits, dur, gaps)
    istart = ie - dur
    ops = istart[model.op_item] + model.op_offset_us
    return ReplayResult(call_start_us=S, call_end_us=E, item_start_us=istart, item_end_us=ie, op_start_us=ops,
                        work_us=work, cost_us=cost)


def _replay_numpy(model: ReplayModel, work: np.ndarray, cost: np.ndarray, waits: np.ndarray, dur: np.ndarray,
                  gaps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The replay's recurrence (:func:`replay`) as a numpy loop over the waiting calls: (S, E, item ends). The
    twin of :func:`._compiled.replay_chain`, which :func:`replay` runs (tests check that the two agree)."""
    K, I = model.calls, len(model.item_call)
    S = np.empty(K)
    E = np.empty(K)
    ie = np.empty(I)
    streams = np.unique(model.item_stream)
    carry = {int(st): -np.inf for st in streams}
    single = len(streams) <= 1
    pm_done = 0  # items whose ends are known
    pm = np.empty(I + 1)
    pm[0] = -np.inf
    base = model.call_start_us[0] if K else 0.0
    stops = np.flatnonzero(waits)
    k0, t = 0, base - work[0] if K else 0.0
    cuts = list(stops) + [K]
    # items launched by calls up to each waiting call, found for all of them at once (one search, not one per stop)
    his = np.r_[np.searchsorted(model.item_pos, stops, side="right"), I].tolist()
    for kb, hi_kb in zip(cuts, his):
        # calls k0 .. kb-1 are non-waiting: cumsum; call kb waits (if kb < K)
        seg = slice(k0, kb)
        if kb > k0:
            acc = np.cumsum(work[seg] + cost[seg])
            E[seg] = t + acc
            S[seg] = E[seg] - cost[seg]
            t = float(E[kb - 1])
        if kb < K:
            S[kb] = t + work[kb]
        # items launched by calls up to kb (the waiting call's own copy included: its l uses S[kb])
        hi = hi_kb
        need = int(model.await_items[kb]) if kb < K else I
        hi = max(hi if kb < K else I, pm_done)
        # sub-ranges of the items, each starting at an item with cross-stream edges (its producers are earlier
        # items, whose ends are known by then); the rest of each sub-range is the closed-form scan
        lo_e, hi_e = np.searchsorted(model.edge_item, [pm_done, hi], side="left") if hi > pm_done else (0, 0)
        cuts_i = [pm_done] + [int(x) for x in np.unique(model.edge_item[lo_e:hi_e]) if x > pm_done] + [hi]
        for a_i, b_i in zip(cuts_i[:-1], cuts_i[1:]):
            _items_numpy(model, S, E, kb, K, a_i, b_i, ie, pm, carry, single, dur, gaps)
        pm_done = max(pm_done, hi)
        if kb < K:
            st_w = -1 if model.await_stream is None else int(model.await_stream[kb])
            R = pm[min(need, pm_done)] if st_w < 0 else carry.get(st_w, -np.inf)
            E[kb] = max(S[kb], R) + cost[kb]
            t = float(E[kb])
            k0 = kb + 1
    return S, E, ie


def _items_numpy(model: ReplayModel, S: np.ndarray, E: np.ndarray, kb: int, K: int, lo: int, hi: int,
                 ie: np.ndarray, pm: np.ndarray, carry: dict, single: bool, dur: np.ndarray, gaps: np.ndarray) -> None:
    """Items [lo, hi) of :func:`_replay_numpy`, in place (ends ``ie``, prefix max ``pm``, stream ``carry``): only
    item ``lo`` may have cross-stream edges (its producers' ends raise its launch-allowed start)."""
    if hi <= lo:
        return
    sl = slice(lo, hi)
    c = model.item_call[sl]
    lat = model.item_lat_us[sl]
    cc = np.maximum(c, 0)
    cs = S[cc]
    ce = np.where(c < kb, E[np.minimum(cc, max(kb - 1, 0))], cs) if kb < K else E[cc]
    l = np.where(model.item_after_end[sl], cs + lat * (ce - cs), cs + lat)
    # work tied to no call: its measured start, moved as the replayed chain around it moved (the shift of the call at
    # its chain position; before every call: the measured start itself)
    pp = model.item_pos[sl]
    l_prior = np.where(pp >= 0, S[np.maximum(pp, 0)] - model.call_start_us[np.maximum(pp, 0)] + lat, lat)
    l = np.where(model.item_prior[sl], l_prior, l)
    j0, j1 = np.searchsorted(model.edge_item, [lo, lo + 1], side="left")
    if j1 > j0:  # cross-stream edges: the item starts no earlier than its producers end (+ the wait's latency)
        l[0] = max(float(l[0]), float(ie[model.edge_on[j0:j1]].max()) + float(model.latency_us.get("stream_wait", 0.0)))
    u = gaps[sl] + dur[sl]
    if single:
        st = int(model.item_stream[lo])
        ie[sl] = _stream_scan(l, u, dur[sl], carry.get(st, -np.inf))
        carry[st] = float(ie[hi - 1])
    else:
        stv = model.item_stream[sl]
        for st in np.unique(stv):
            m = np.flatnonzero(stv == st)
            ends = _stream_scan(l[m], u[m], dur[sl][m], carry[int(st)])
            ie[lo + m] = ends
            carry[int(st)] = float(ends[-1])
    pm[lo + 1:hi + 1] = np.maximum.accumulate(np.concatenate(([pm[lo]], ie[sl])))[1:]


def _replay_compiled(model: ReplayModel, work: np.ndarray, cost: np.ndarray, waits: np.ndarray, dur: np.ndarray,
                     gaps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The replay's recurrence in one compiled pass (:func:`._compiled.replay_chain`): (S, E, item ends)."""
    from ._compiled import replay_chain

    K = model.calls
    stops = np.flatnonzero(waits).astype(np.int64)
    his = np.searchsorted(model.item_pos, stops, side="right").astype(np.int64)
    (await_items, item_call, item_pos, item_lat, after_end, prior, call_start, sidx, n_streams, edge_item,
     edge_on, await_sidx, edge_lat) = model.kernel_arrays
    base = float(model.call_start_us[0]) if K else 0.0
    return replay_chain(np.ascontiguousarray(work, dtype=np.float64), np.ascontiguousarray(cost, dtype=np.float64),
                        stops, his, await_items, item_call, item_pos, item_lat, after_end, prior, call_start,
                        np.ascontiguousarray(gaps, dtype=np.float64), np.ascontiguousarray(dur, dtype=np.float64),
                        sidx, n_streams, base, edge_item, edge_on, await_sidx, edge_lat)

def host_time_map(model: ReplayModel, res: ReplayResult, t_us: np.ndarray) -> np.ndarray:
    """Replayed times of host instants ``t_us`` (trace clock) on the launching thread: inside call k,
    S'_k + min(t − s_k, E'_k − S'_k); in the host work before call k (after call k−1), E'_{k−1} + (t − e_{k−1}) ×
    work'_k / work_k (a uniform shrink of the work interval). Before the first call: S'_0 + (t − s_0)."""
    t = np.asarray(t_us, dtype=np.float64) - model.t0_us
    s, e = model.call_start_us, model.call_end_us
    k = np.searchsorted(s, t, side="right") - 1
    out = np.empty(len(t))
    before = k < 0
    out[before] = res.call_start_us[0] + t[before]
    kk = np.maximum(k, 0)
    inside = ~before & (t < e[kk])
    out[inside] = res.call_start_us[kk[inside]] + np.minimum(
        t[inside] - s[kk[inside]], res.call_end_us[kk[inside]] - res.call_start_us[kk[inside]])
    gap = ~before & ~inside
    kn = np.minimum(kk + 1, len(s) - 1)
    w_meas = np.where(kk + 1 < len(s), model.work_us[kn], np.inf)
    w_new = np.where(kk + 1 < len(s), res.work_us[kn], np.inf)
    frac = np.divide(w_new, w_meas, out=np.ones(len(t)), where=np.isfinite(w_meas) & (w_meas > 0))
    out[gap] = res.call_end_us[kk[gap]] + (t[gap] - e[kk[gap]]) * frac[gap]
    return out


def round_starts(trace: Trace, model: ReplayModel, name: str = "round") -> np.ndarray:
    """(r,) trace-clock starts of the host user_annotation ranges called ``name`` on the model's thread, sorted
    (the verify rounds of :func:`gaptrace.analyses.rounds.rounds`), each start once: two ranges of one name that
    start at the same µs on one thread are one range written twice (:func:`gaptrace.analyses.rounds.duplicate_ranges`),
    not a round of no length, and a range that starts inside another is no round of its own
    (:func:`gaptrace.analyses.rounds.ranges_inside_earlier`). Empty when there are none."""
    from .rounds import duplicate_ranges, ranges_inside_earlier

    h = trace.host
    m = (trace.host_str_eq("cat", "user_annotation") & (h["rank"].to_numpy() == model.key[0])
         & trace.host_str_eq("name", name) & trace.host_str_eq("tid", model.tid))
    rows = h[m]
    rows = rows[~duplicate_ranges(rows)]  # a copy first: it starts "inside" its original
    return np.unique(rows["ts_us"].to_numpy()[~ranges_inside_earlier(rows)])


def round_periods(model: ReplayModel, res: ReplayResult, starts_us: np.ndarray) -> np.ndarray:
    """(r−1,) replayed round periods (start to start, µs) of rounds starting at ``starts_us`` (trace clock)."""
    return np.diff(host_time_map(model, res, starts_us))


def unchanged_error(trace: Trace, model: ReplayModel | None = None, name: str = "round") -> dict[str, Any]:
    """How well the unchanged replay reproduces the measured timeline: ``op_start_error_us`` (median and p90 of
    |replayed − measured| device op starts), ``round_period_error`` (median over rounds of |replayed − measured| /
    measured period), the periods themselves (``measured_periods_us``, ``replayed_periods_us``), ``latency_us``.
    Measured periods are the differences of the ``name`` range starts, as :func:`gaptrace.analyses.rounds.rounds`."""
    model = model or build_model(trace)
    res = replay(model)
    err = np.abs(res.op_start_us - model.op_start_us)
    starts = round_starts(trace, model, name)
    meas = np.diff(starts)
    rep = round_periods(model, res, starts) if len(starts) > 1 else np.zeros(0)
    rel = np.abs(rep - meas) / meas if len(meas) else np.zeros(0)
    return {"ops": int(len(err)),
            "op_start_error_us": {"median": float(np.median(err)) if len(err) else math.nan,
                                  "p90": float(np.quantile(err, 0.9)) if len(err) else math.nan},
            "round_period_error": float(np.median(rel)) if len(rel) else math.nan,
            "round_period_error_max": float(np.max(rel)) if len(rel) else math.nan,
            "measured_periods_us": meas.tolist(), "replayed_periods_us": rep.tolist(),
            "latency_us": dict(model.latency_us)}
