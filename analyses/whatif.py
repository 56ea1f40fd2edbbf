"""Counterfactual rounds: the unprofiled round predicted by the replay, and how much shorter it gets without (or
with a faster) host site or NVTX range (docs/DESIGN.md "The replay model", "Counterfactuals").

A *site* is an NVTX / record_function range name (host user_annotation) or a host frame (python_function or
cpu_op name; a name matches when it equals the site or contains it). Its host intervals on the launching thread,
inside the rounds, are the union U of the matching events. With the profiler taken out first
(:mod:`.profiler_cost`), for each host work interval k (length work_k measured, work'_k unprofiled) covered by U
for o_k µs:

- remove: work''_k = work'_k · (1 − o_k / work_k); calls that start inside U cost nothing, and a blocking call
  inside U no longer waits (what it read arrives a round late, as the overlap scheduler does);
- remove with its device work: as remove, and every eager device item (kernel, copy, memset; not a graph replay)
  launched by a call inside U takes no device time
  (the site's work is not needed at all, rather than moved off the host: an upper bound where a fix keeps some of
  that device work, e.g. folds eager glue into one kernel);
- speedup F: work''_k = work'_k · (1 − (o_k / work_k)(1 − 1/F)); calls inside U cost cost'_k / F, waits stay;
- graph (the site's work captured once in a CUDA graph and replayed): as remove for the host, but each occurrence's
  device items stay and are launched by one graph launch: the first call inside the occurrence costs
  t0 + n·c (n the occurrence's device nodes: :func:`graph_launch_us`), the other calls inside cost nothing, and its
  items keep their (unprofiled) durations but queue behind each other with the intra-graph node gap
  (:func:`graph_node_gap_us`) instead of the eager launch path. A site holding a call that blocks the host (a
  synchronization, a device-to-host read, a pageable copy) is refused: a CUDA graph cannot capture it.

Several changes compose (applied in turn). The predicted round is the median of the replayed round periods; the
saving is median(before) − median(after); ``one_off_saving_us`` is what the sum over rounds saves beyond
rounds × saving (a compile paid once; 0 when the sum saves no more than that). TPOT = Tround / τ with τ the sidecar's mean accepted tokens per round.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterable

import numpy as np

from gaptrace.sidecar import Sidecar, as_sidecar

from gaptrace.trace import Trace, TraceError

from .profiler_cost import (Calibration, _starts_inside, gil_held_in_waits, load_calibration, lock_waits_in,
                           measured_period_source, measured_period_us, name_codes, shipped_calibration_path, site_share,
                           unprofiled_inputs)
from .rounds import inside_note
from .steps import find_steps, is_launch_call
from .replay import (ReplayModel, ReplayResult, _coverage, _intersect, _merge, build_model, host_time_map, replay,
                     round_starts)

__all__ = ["Change", "WhatIf", "SiteRefused", "GraphBlocked", "graph_launch_us", "graph_node_gap_us", "site_intervals", "site_matches",
           "other_thread_intervals", "site_effect_intervals", "check_changes", "apply_changes", "device_items_launched",
           "fit_profiler_scale", "scale_for_period", "SCALE_BOUNDS", "SCALE_MIN", "whatif", "cause_savings",
           "parse_speedup", "SPEEDUP_BOUNDS"]


class SiteRefused(TraceError):
    """A site that matched but cannot be changed (a CUDA runtime call that launches device work): no other thread's
    match is looked for."""


class GraphBlocked(SiteRefused):
    """A ``graph`` site that holds a call that blocks the host: no CUDA graph can capture it."""


@dataclasses.dataclass(frozen=True)
class Change:
    """One counterfactual: ``site`` removed (``factor`` None) or made ``factor`` times faster. ``with_device``
    (removal only): the eager device work launched from inside the site goes too (its kernels, copies and memsets
    take no device time; CUDA graph replays stay), as when the site's work is not needed at all rather than moved
    off the host. ``graph``: the site's work captured once in a CUDA graph and replayed (module docstring)."""

    site: str
    factor: float | None = None
    with_device: bool = False
    graph: bool = False


def check_changes(changes: Iterable[Change]) -> None:
    """ValueError (one line) when two changes name the same site: a site removed and also made faster, made faster
    twice, or removed twice (its effect would depend on the order the changes apply in)."""
    from .syncs import api_base_name

    seen: dict[str, Change] = {}
    for c in changes:
        key = api_base_name(c.site)  # cudaMalloc and cudaMalloc_v3020 name the same calls
        if key in seen:
            def said(x: Change) -> str:
                return (f"--speedup {x.site}={x.factor:g}" if x.factor is not None else f"--graph {x.site}" if x.graph
                        else f"--remove{'-with-device' if x.with_device else ''} {x.site}")
            raise ValueError(f"{said(seen[key])} and {said(c)} name the same site: give each site one change")
        seen[key] = c


SPEEDUP_BOUNDS = (1.0, 1e6)  # a speedup F: the site's host time becomes 1/F of itself (1: unchanged; 1e6: ~removed)


def parse_speedup(text: str) -> Change:
    """``SITE=FACTOR`` → Change; ValueError (one line) when malformed or FACTOR is not a number in
    :data:`SPEEDUP_BOUNDS` (below 1 would be a slowdown, which ``--speedup`` does not model; above 1e6 is
    ``--remove``; a factor like 1e-310 would overflow the replay's times)."""
    site, sep, f = text.rpartition("=")
    try:
        factor = float(f)
    except ValueError:
        factor = math.nan
    lo, hi = SPEEDUP_BOUNDS
    if not sep or not site.strip() or not math.isfinite(factor) or not lo <= factor <= hi:
        raise ValueError(f"--speedup {text!r}: expected SITE=FACTOR with FACTOR a number from {lo:g} to {hi:g} "
                         "(how many times faster; --remove takes a site out)")
    return Change(site, factor)


def site_intervals(trace: Trace, model: ReplayModel, site: str, window: tuple[float, float] | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Merged host intervals (µs relative to ``model.t0_us``) of ``site`` on the model's thread, clipped to
    ``window`` (trace clock) when given. An NVTX range name matches exactly; otherwise any python_function /
    cpu_op whose name equals or contains ``site``. TraceError (one line) when nothing matches."""
    m, _how, _names = _site_rows(trace, model, site)
    return _clipped_merged(trace, model, m, window)


def _clipped_merged(trace: Trace, model: ReplayModel, m: np.ndarray, window: tuple[float, float] | None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The host rows ``m`` as merged intervals, µs relative to ``model.t0_us``, clipped to ``window`` (trace clock)."""
    h = trace.host
    s, e = h["ts_us"].to_numpy()[m], h["end_us"].to_numpy()[m]
    if window is not None:
        s, e = np.maximum(s, window[0]), np.minimum(e, window[1])
        keep = e > s
        s, e = s[keep], e[keep]
    return _merge(s - model.t0_us, e - model.t0_us)


def _site_rows(trace: Trace, model: ReplayModel, site: str, launching: bool = True
               ) -> tuple[np.ndarray, str, list[str]]:
    """(host row mask, how it matched: "range" | "frame" | "frames containing" | "runtime call", the distinct
    names matched) of ``site`` on the model's thread (:func:`site_intervals`), or with ``launching=False`` on the
    rank's other threads (:func:`other_thread_intervals`). An NVTX range of that exact name first, then frames
    (python_function / cpu_op) of that exact name, then frames whose name contains it, then CUDA runtime / driver
    calls of that name (CUPTI's suffixes aside) on the launching thread that launch no device work (cudaMalloc,
    cudaFree: removing one takes its host time and its wait). TraceError (one line) when nothing matches, or when
    the calls launch device work (the replay keeps a launch: its device work needs it)."""
    h = trace.host
    mine = trace.memo(("whatif_on", model.key[0], model.tid), h, lambda: (
        (h["rank"].to_numpy() == model.key[0]) & trace.host_str_eq("tid", model.tid)))
    on = mine if launching else trace.memo(("whatif_others", model.key[0], model.tid), h, lambda: (
        (h["rank"].to_numpy() == model.key[0]) & ~mine))
    # names matched once per distinct name (a trace has thousands of names over millions of events)
    uniq, inv = name_codes(trace)
    ann = trace.memo(("whatif_ann", model.key[0], model.tid, launching), h,
                     lambda: on & trace.host_str_eq("cat", "user_annotation"))
    exact = uniq == site
    m, how, names = ann & exact[inv], "range", exact
    if not m.any():
        fr = trace.memo(("whatif_frames", model.key[0], model.tid, launching), h,
                        lambda: on & h["cat"].isin(("python_function", "cpu_op")).to_numpy())
        # a frame as analyze prints it: object addresses dropped ("<built-in method to of Tensor object>" for
        # "... object at 0x7f81...>", stacks.normalize_frame), so a name copied from its output matches
        from .stacks import normalize_frame

        norm = trace.memo(("whatif_norm_names",), h, lambda: np.array([normalize_frame(str(u)) for u in uniq]))
        exact = exact | (norm == normalize_frame(site))
        m, how, names = fr & exact[inv], "frame", exact
        if not m.any():
            names = (np.char.find(uniq, site) >= 0) | (np.char.find(norm, normalize_frame(site)) >= 0)
            m, how = fr & names[inv], "frames containing"
    if not m.any():
        where = "the launching thread" if launching else "any thread of the launching rank"
        from .syncs import api_base_name

        # each distinct name's base API name, once per trace (a site that matches no range or frame lands here)
        base = trace.memo(("api_base_names",), h, lambda: np.array([api_base_name(str(u)) for u in uniq], dtype=object))
        api = (base == site) | exact
        rt = ((h["rank"].to_numpy() == model.key[0]) & h["cat"].isin(("cuda_runtime", "cuda_driver")).to_numpy()
              & api[inv])
        if rt.any() and not launching:
            raise TraceError(f"{trace.path}: {site!r} is a CUDA runtime call made on another thread than the launching "
                             f"one ({model.tid}): the replay models only the launching thread's calls")
        if rt.any():  # analyze's frame table lists runtime calls as frames; the replay models them as calls
            launching_rows = model.call_row[np.unique(model.item_call[model.item_call >= 0])]
            if np.isin(np.flatnonzero(rt), launching_rows).any():
                raise SiteRefused(f"{trace.path}: {site!r} is a CUDA runtime call that launches device work, which "
                                 "the replay keeps (its launch is the device work's); name the NVTX range or Python "
                                 "frame that makes the call")
            # a call that launches nothing (cudaMalloc, cudaFree, cudaEventQuery): its host time and any wait go
            m, how, names = rt & on, "runtime call", api
        if not m.any():
            dropped = [w for w in trace.warnings if w.endswith(" were dropped") or "and were dropped" in w]
            raise TraceError(f"{trace.path}: no NVTX range, host frame or CUDA runtime call named {site!r} on "
                             f"{where}" + (f" (of the events read, {'; '.join(dropped)}: it may have been one "
                                           "of them)" if dropped else ""))
    hit = np.zeros(len(uniq), dtype=bool)
    hit[np.unique(inv[m])] = True
    return m, how, [str(x) for x in uniq[hit & names]]


def site_matches(trace: Trace, model: ReplayModel, site: str) -> dict[str, Any]:
    """How ``site`` matched on the model's thread: {"how": "range" (an NVTX range of that name) | "frame" (frames
    of exactly that name) | "frames containing" (frames whose name contains it) | "other thread" (not on the
    launching thread: its waits on another thread inside the site, :func:`other_thread_intervals`, with
    ``waited_us`` their total), "names": the distinct names matched (sorted), "events": the host events matched on
    the launching thread}. TraceError (one line) when no thread of the rank has it."""
    try:
        m, how, names = _site_rows(trace, model, site)
    except SiteRefused:
        raise
    except TraceError:
        us, ue = other_thread_intervals(trace, model, site)
        return {"how": "other thread", "names": [site], "events": 0,
                "waited_us": float(np.sum(ue - us))}
    return {"how": how, "names": sorted(names), "events": int(m.sum())}


def other_thread_intervals(trace: Trace, model: ReplayModel, site: str,
                           window: tuple[float, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """For a ``site`` that is not on the launching thread: the parts of the launching thread's lock waits
    (:func:`.profiler_cost._thread_waits`: Queue.get, Condition.wait, Thread.join, at least
    ``THREAD_WAIT_MIN_US``) during which another thread of the rank was inside ``site`` (merged, µs relative to
    ``model.t0_us``, clipped to ``window``). The waited-for thread doing that work is what the launching thread
    waited for; without it the wait ends sooner by that much (a first-order model: DESIGN.md 5.5). Empty when the
    launching thread never waits while the site runs (removing it saves nothing on the critical path). TraceError
    (one line) when no thread of the rank has an NVTX range or frame matching ``site``."""
    from .profiler_cost import _thread_waits

    m, _how, _names = _site_rows(trace, model, site, launching=False)
    us, ue = _clipped_merged(trace, model, m, window)
    w = _thread_waits(trace, model)
    if w is None:
        return np.zeros(0), np.zeros(0)
    return _intersect(us, ue, *_merge(np.asarray(w["ws"], dtype=np.float64), np.asarray(w["we"], dtype=np.float64)))


def site_effect_intervals(trace: Trace, model: ReplayModel, site: str, window: tuple[float, float] | None = None
                          ) -> tuple[np.ndarray, np.ndarray, str]:
    """(starts, ends, where) of what a change to ``site`` takes out of the launching thread's host work:
    ``site_intervals`` when the site is on the launching thread (where "launching"), else the launching thread's
    waits on it (:func:`other_thread_intervals`, where "other thread"). TraceError (one line) when no thread of
    the rank has it."""
    try:
        return (*site_intervals(trace, model, site, window), "launching")
    except SiteRefused:
        raise
    except TraceError:
        return (*other_thread_intervals(trace, model, site, window), "other thread")


def apply_changes(trace: Trace, model: ReplayModel, work_us: np.ndarray, cost_us: np.ndarray,
                  changes: Iterable[Change], window: tuple[float, float] | None = None,
                  measured: tuple[np.ndarray, list] | None = None, gil: bool = True,
                  calibration: Calibration | None = None, graph_stats: list | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(work, cost, wait, dropped, node_gap) for :func:`.replay.replay` after ``changes`` (module docstring) on top
    of the given (unprofiled) ``work_us`` / ``cost_us``; ``window`` (trace clock) limits each site to the rounds.
    ``dropped`` ((I,) bool): the device items a removal ``with_device`` takes away (launched by a call inside the
    site): replay them with no duration and no queue gap. ``node_gap`` ((I,) µs, NaN where unchanged): the queue
    gap of the items a ``graph`` change puts in a CUDA graph; ``calibration`` gives that change its graph launch
    cost (:func:`graph_launch_us`), and appends to ``graph_stats`` (when given) one dict per such change: its site,
    occurrences, device nodes per occurrence (median), launch µs per occurrence (median), t0 and per-node µs, the
    node gap. SiteRefused (one line) when a ``graph`` site holds a call that blocks the host.
    ``measured``: the unprofiled inputs' ``measured_scale``
    (ranges that take their measured host time: a site's share of an interval counts them as measured,
    :func:`.profiler_cost.site_share`). ``gil``: a removed site on the launching thread that holds lock waits on
    other threads keeps those threads' Python work in the waits (:func:`.profiler_cost.gil_held_in_waits`): it
    still runs, beside the launching thread, under the GIL (False: the wait goes whole, the first-order model)."""
    work, cost = work_us.astype(np.float64).copy(), cost_us.astype(np.float64).copy()
    dropped = np.zeros(len(model.item_call), dtype=bool)
    node_gap = np.full(len(model.item_call), np.nan)
    wait = model.blocking.copy()
    for ch in changes:
        us, ue, where = site_effect_intervals(trace, model, ch.site, window)
        frac = site_share(model, us, ue, work_us, measured)
        inside = _calls_inside(model, us, ue)
        if ch.graph and where != "launching":
            raise SiteRefused(f"{trace.path}: {ch.site!r} is not on the launching thread: only the launching "
                              "thread's work can be captured in its CUDA graph")
        if ch.factor is None:  # a removal, or (graph) a removal whose device work stays, launched by one graph
            work *= 1.0 - frac
            if gil and where == "launching":
                ws, we = lock_waits_in(model, trace, us, ue)
                if len(ws):
                    waits_us = work_us * site_share(model, ws, we, work_us, measured)
                    work += gil_held_in_waits(trace, model, ws, we, waits_us)
            cost[inside] = 0.0
            if ch.graph:
                st = _graph_occurrences(trace, model, ch.site, us, inside, wait, cost, node_gap, calibration)
                if graph_stats is not None:
                    graph_stats.append(st)
            wait[inside] = False
            if ch.with_device and len(dropped):
                dropped |= _eager_items_of(model, inside)
        else:
            work *= 1.0 - frac * (1.0 - 1.0 / ch.factor)
            cost[inside] /= ch.factor
    return work, cost, wait, dropped, node_gap


# the launch of a captured graph where neither the calibration nor the trace gives one: the shipped H100
# calibration's graph_plain (docs/DESIGN.md "Counterfactuals"), t0 + per node × N, µs
GRAPH_LAUNCH_T0_DEFAULT_US = 5.5
GRAPH_LAUNCH_NODE_DEFAULT_US = 0.2
# the device gap between two kernel nodes of one graph where the trace replays no graph: the median intra-graph gap
# of the H100 loop captures (0.42-0.43 µs; the H200 runtime's graphs: 0.13 µs)
GRAPH_NODE_GAP_DEFAULT_US = 0.4


def graph_launch_us(calibration: Calibration | None, nodes: np.ndarray) -> tuple[np.ndarray, str]:
    """((n,) µs, source): the unprofiled host cost of one cudaGraphLaunch of ``nodes`` device nodes, t0 + c·N: the
    calibration's measured ``graph_launch_t0_us`` / ``graph_launch_node_us`` ("calibration"), else
    :data:`GRAPH_LAUNCH_T0_DEFAULT_US` + :data:`GRAPH_LAUNCH_NODE_DEFAULT_US`·N ("default": the H100's)."""
    n = np.asarray(nodes, dtype=np.float64)
    if calibration is not None and calibration.graph_launch_t0_us is not None:
        return calibration.graph_launch_t0_us + calibration.graph_launch_node_us * n, "calibration"
    return GRAPH_LAUNCH_T0_DEFAULT_US + GRAPH_LAUNCH_NODE_DEFAULT_US * n, "default"


def graph_node_gap_us(trace: Trace, model: ReplayModel) -> tuple[float, str]:
    """(µs, source): the device gap between consecutive nodes of one CUDA graph replay: the median over the trace's
    own graph replays of (node start − the previous node's end) for nodes that follow each other on the device
    ("trace"), else :data:`GRAPH_NODE_GAP_DEFAULT_US` ("default"). The profiled gaps are the unprofiled ones: the
    profiler adds no host work inside a replay, and its per-op device cost is in the ops' own durations."""
    cached = getattr(model, "_graph_node_gap", None)
    if cached is not None:
        return cached
    out = (GRAPH_NODE_GAP_DEFAULT_US, "default")
    graph_item = (model.item_call >= 0) & (model.graph_nodes[np.maximum(model.item_call, 0)] > 0)
    sel = graph_item[model.op_item] if len(model.op_item) else np.zeros(0, dtype=bool)
    if sel.sum() >= 2:
        d = trace.device
        dur = (d["end_us"].to_numpy() - d["ts_us"].to_numpy())[model.op_row[sel]]
        item, off = model.op_item[sel], model.op_offset_us[sel]
        o = np.lexsort((off, item))
        item, off, dur = item[o], off[o], dur[o]
        same = item[1:] == item[:-1]
        gap = off[1:][same] - (off[:-1] + dur[:-1])[same]
        gap = gap[gap >= 0]  # nodes that overlap (a graph's parallel branches) have no gap between them
        if len(gap):
            out = (float(np.median(gap)), "trace")
    try:
        model._graph_node_gap = out
    except AttributeError:
        pass
    return out


def _graph_occurrences(trace: Trace, model: ReplayModel, site: str, us: np.ndarray, inside: np.ndarray,
                       wait: np.ndarray, cost: np.ndarray, node_gap: np.ndarray,
                       calibration: Calibration | None) -> dict[str, Any]:
    """The ``graph`` change of :func:`apply_changes` on the calls ``inside`` the site's merged intervals (starts
    ``us``): in place, each occurrence's first call costs one graph launch of its device nodes
    (:func:`graph_launch_us`), its items take the intra-graph node gap (:func:`graph_node_gap_us`). SiteRefused
    (one line) when the site launches no device work, or a call inside still blocks the host (``wait``; a device
    memory free is no obstacle: it goes, as in a removal, a graph's memory coming from its private pool)."""
    from .allocator import FREE_CALLS
    from .syncs import api_base_name

    k_in = np.flatnonzero(inside)
    items = np.flatnonzero((model.item_call >= 0) & inside[np.maximum(model.item_call, 0)])
    if not len(items):
        raise SiteRefused(f"{trace.path}: {site!r} launches no device work inside the rounds: nothing to capture in "
                          "a CUDA graph (--remove or --speedup model its host work)")
    if (model.graph_nodes[model.item_call[items]] > 0).all():
        raise SiteRefused(f"{trace.path}: {site!r} already runs as a CUDA graph (its {len(items)} launches inside the "
                          "rounds are graph launches): nothing more to capture (--remove or --speedup model its host "
                          "work)")
    blocking = k_in[wait[k_in]]
    if len(blocking):
        names = sorted({api_base_name(str(model.call_name[k])) for k in blocking})
        held = [n for n in names if n not in FREE_CALLS]
        if held:
            n = int(sum(api_base_name(str(model.call_name[k])) in held for k in blocking))
            raise GraphBlocked(f"{trace.path}: {site!r} holds a call that blocks the host ({', '.join(held[:3])}, "
                              f"{n} time{'' if n == 1 else 's'}): "
                              "a CUDA graph cannot capture it; remove it first (--remove on its site) or name a "
                              "range without it")
    occ = np.searchsorted(us, model.call_start_us[k_in], side="right") - 1
    # nodes per item: a graph replay inside the site becomes a child graph of its N nodes, an eager item one node
    nodes = np.where(model.graph_nodes[model.item_call[items]] > 0, model.graph_nodes[model.item_call[items]], 1)
    item_occ = np.searchsorted(us, model.call_start_us[model.item_call[items]], side="right") - 1
    n_occ = np.bincount(item_occ, weights=nodes, minlength=len(us))
    uo, fi = np.unique(occ, return_index=True)
    first, n_first = k_in[fi], n_occ[uo]
    keep = n_first > 0  # an occurrence that launches nothing captures no graph: its calls just go
    launch, src = graph_launch_us(calibration, n_first[keep])
    cost[first[keep]] = launch
    gap, gap_src = graph_node_gap_us(trace, model)
    node_gap[items] = gap
    t0, per_node = graph_launch_us(calibration, np.array([0.0, 1.0]))[0]
    return {"site": site, "occurrences": int(keep.sum()), "nodes_per_occurrence": float(np.median(n_first[keep])),
            "launch_us_per_occurrence": float(np.median(launch)), "launch_t0_us": float(t0),
            "launch_node_us": float(per_node - t0), "launch_source": src, "node_gap_us": gap,
            "node_gap_source": gap_src}


def _calls_inside(model: ReplayModel, us: np.ndarray, ue: np.ndarray) -> np.ndarray:
    """(K,) bool: the chain's calls that start inside the merged intervals [us, ue) (µs from ``model.t0_us``)."""
    return _starts_inside(us, ue, model.call_start_us)


def _eager_items_of(model: ReplayModel, inside: np.ndarray) -> np.ndarray:
    """(I,) bool: the eager device items (not graph replays) launched by the calls marked ``inside`` ((K,) bool)."""
    c = np.maximum(model.item_call, 0)
    return (model.item_call >= 0) & inside[c] & (model.graph_nodes[c] == 0)


def device_items_launched(trace: Trace, model: ReplayModel, site: str, window: tuple[float, float] | None = None
                          ) -> tuple[int, float]:
    """(eager device items, their profiled device busy µs) launched by calls that start inside ``site``'s host
    intervals (:func:`site_intervals`, clipped to ``window``): what a removal ``with_device`` takes away."""
    us, ue = site_intervals(trace, model, site, window)
    launched = _eager_items_of(model, _calls_inside(model, us, ue))
    return int(launched.sum()), float(model.item_busy_us[launched].sum())


@dataclasses.dataclass
class WhatIf:
    """A counterfactual's prediction (µs): ``profiled_round_us`` (median measured period), ``replayed_round_us``
    (the unchanged replay), ``before_round_us`` (unprofiled), ``after_round_us`` (unprofiled, changed),
    ``saving_us``, ``one_off_saving_us``, ``before_mean_round_us`` / ``after_mean_round_us`` (the means over all
    rounds: one-offs included), ``occupancy_before`` / ``occupancy_after`` (device busy / time over the
    rounds), ``tau``, ``tpot_before_us`` / ``tpot_after_us``, ``periods_*`` per round, ``calibration`` (what was
    used), ``removed_us`` (the profiler cost taken out), ``changes``, ``unprofiled_round_us`` (the sidecar's
    measured one, when present), ``latency_us`` and ``stream_edges`` (the replay's cross-stream edges by kind)."""

    data: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return self.data


def device_round_busy_us(model: ReplayModel, res: ReplayResult, starts_us: np.ndarray) -> np.ndarray:
    """(len(starts_us) − 1,) µs: for each round [starts_us[r], starts_us[r+1]) (trace clock), the replayed device
    busy time of the items launched by calls that start in it, summed per stream, on its busiest stream. A round
    cannot repeat faster than this in steady state: once a change lets the host run ahead of the device (a blocking
    read removed from a GPU-bound loop), a finite replay's host round starts outrun the device, and the period is
    the device's (DESIGN.md 5.5). An item's busy time is its ops' durations, 0 when a change dropped it."""
    r = len(starts_us) - 1
    if r <= 0 or not len(model.item_call):
        return np.zeros(max(r, 0))
    # launch time relative to t0_us, as the calls are; an item tied to no call: its measured start
    launch = np.where(model.item_call >= 0, model.call_start_us[np.maximum(model.item_call, 0)], model.item_start_us)
    rnd = np.searchsorted(np.asarray(starts_us, dtype=np.float64) - model.t0_us, launch, side="right") - 1
    busy = np.minimum(model.item_busy_us, np.maximum(res.item_end_us - res.item_start_us, 0.0))
    ok = (rnd >= 0) & (rnd < r)
    streams, sidx = np.unique(model.item_stream[ok], return_inverse=True)
    per = np.zeros((r, max(len(streams), 1)))
    np.add.at(per, (rnd[ok], sidx), busy[ok])
    return per.max(axis=1)


def _occupancy(model: ReplayModel, res: ReplayResult, starts_rel_us: np.ndarray, periods_us: np.ndarray,
               joins: np.ndarray) -> float:
    """Device busy share of the rounds (replayed): Σ clipped item busy time / Σ period, over each run of rounds
    inside one profiler window [its first replayed start, that + the run's periods] (``starts_rel_us``: (r,) replayed
    round starts, µs relative to t0_us; ``periods_us``: the kept periods, ``joins`` (r − 1,) the periods left out,
    :meth:`gaptrace.trace.Trace.window_joins`). The graph nodes of one launch run one after another on their
    stream, so an item's busy time is the sum of its ops' durations, clipped to the window in proportion; on several
    streams, the union of the replayed ops' intervals inside the runs (the streams' busy times overlap)."""
    s, e = res.item_start_us, res.item_end_us
    span = np.maximum(e - s, 1e-12)
    busy_item = np.minimum(model.item_busy_us, e - s)
    # runs of kept periods: run k starts at the round after each join (or the first round)
    idx = np.flatnonzero(~joins)
    if not len(idx):
        return math.nan
    run_id = np.cumsum(np.concatenate(([1], np.diff(idx) > 1)))
    first = np.r_[0, np.flatnonzero(np.diff(run_id)) + 1]  # position in idx of each run's first kept period
    t0 = np.asarray(starts_rel_us, dtype=np.float64)[idx[first]]
    t1 = t0 + np.add.reduceat(np.asarray(periods_us, dtype=np.float64), first)
    ok = t1 > t0
    total = float(np.sum(t1[ok] - t0[ok]))
    # every item's time inside the runs at once (a loop over the runs costs O(runs × items): a trace of many
    # profiler windows has hundreds); each item's busy time counts in proportion to its part inside them
    us, ue = _merge(t0[ok], t1[ok])
    if len(np.unique(model.item_stream)) > 1 and model.op_dur_us is not None and len(model.op_item):
        # several streams: their busy times overlap; the union of the replayed ops (each op's measured duration
        # scaled as its item's busy time was), as `analyze` takes the union of the measured ones
        ratio = np.divide(busy_item, model.item_busy_us, out=np.zeros(len(busy_item)), where=model.item_busy_us > 0)
        os_ = res.op_start_us
        bs, be = _merge(os_, os_ + model.op_dur_us * np.clip(ratio, 0.0, 1.0)[model.op_item])
        ins, ine = _intersect(bs, be, us, ue)
        busy = float(np.sum(ine - ins))
    else:
        busy = float(np.sum(_coverage(us, ue, s, e) / span * busy_item))
    return busy / total if total > 0 else math.nan


def _tau(sidecar: "Sidecar | dict | None", periods: int | None = None, joins: np.ndarray | None = None
         ) -> float | None:
    """Mean τ over the sidecar's profiled rounds with a usable τ (:attr:`gaptrace.sidecar.Sidecar.round_taus`);
    with ``periods`` only the rounds that begin a period (the first ``periods`` of them, in trace order) and, with
    ``joins`` ((periods,) bool), not those whose period spans two profiler windows: the rounds whose periods the
    prediction's median is over, as the rounds table takes τ over the rounds it times (analyses/rounds.py)."""
    side = as_sidecar(sidecar)
    taus = np.asarray(side.round_taus or (), dtype=np.float64) if side is not None else np.zeros(0)
    if periods is not None:
        taus = taus[:periods]
        if joins is not None:
            taus = taus[~np.asarray(joins, dtype=bool)[:len(taus)]]
    vals = taus[np.isfinite(taus)]
    return float(np.mean(vals)) if len(vals) else None


SCALE_BOUNDS = (0.0, 8.0)
# The least α a fit may end at. Below it the profiled host would have lost under half of what the calibration's own
# benchmarks measure per event, where every check measures more on real loops (1.7-1.9x on an H100, ~1.2x on a CPU:
# benchmarks/bench_calibration.py): a fit down there absorbs something else (warm-up steps slower than the profiled
# ones): the fit keeps 0.5 where that replays the measured round within the period goal (UNMATCHED_MAX), else the
# measured round is set aside as one out of reach is (DESIGN.md 5.3)
SCALE_MIN = 0.5
SCALE_STEPS = 16  # α to 8 / 2**16 ≈ 1e-4


_measured_period_us = measured_period_us  # the capture's own measured unprofiled period (profiler_cost)


def fit_profiler_scale(ctx: "Context", target_us: float) -> tuple[float, dict]:
    """The factor α on every per-event profiler cost of the calibration (:func:`.profiler_cost.unprofiled_inputs`
    ``scale``) for which the replayed unprofiled round (median period) equals ``target_us``, the capture's own
    measured unprofiled round; bisection over :data:`SCALE_BOUNDS` (the predicted round does not grow with α, but
    for a jump back up where a measured range stops being set: when the upper bound does not reach the target, the
    first α of :data:`SCALE_GRID` that does brackets it with the one before).
    Returns (α, the unprofiled inputs at α). α at a bound means the target is out of reach (a warning says so).
    docs/DESIGN.md "Fitted to the capture's own unprofiled rounds"."""
    memo: dict[float, float] = {}  # periods only: the inputs are K-long arrays, built again for the α returned

    def period(a: float) -> float:
        if a not in memo:
            memo[a] = ctx.period_at(a)
        return memo[a]

    a = scale_for_period(period, target_us)
    return a, ctx.inputs_at(a)


def scale_for_period(period_at: Callable[[float], float], target_us: float) -> float:
    """The α in :data:`SCALE_BOUNDS` whose ``period_at(α)`` (µs) equals ``target_us``: the lower bound when even it is
    at or below the target, the upper bound when no α reaches it; else bisection (:data:`SCALE_STEPS`) on the first
    bracket: [lower, upper] when the upper bound reaches the target, else [the α before, the first α of
    :data:`SCALE_GRID` that reaches it] (the period need not fall all the way with α: a measured range whose blocking
    calls wait more as the host gets faster stops being set, DESIGN.md 5.2, and the period jumps back up)."""
    lo, hi = SCALE_BOUNDS
    if period_at(lo) <= target_us:
        return lo
    if period_at(hi) >= target_us:
        prev = lo
        for a in (g for g in SCALE_GRID if lo < g < hi):
            if period_at(a) <= target_us:
                lo, hi = prev, a
                break
            prev = a
        else:
            return SCALE_BOUNDS[1]
    for _ in range(SCALE_STEPS):
        mid = 0.5 * (lo + hi)
        if period_at(mid) > target_us:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


SCALE_GRID = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # where a bracket is looked for when α = 8 does not reach the target
FIT_TOLERANCE = 0.01  # a fitted α reproduces the measured unprofiled round to within this share
# a closest α whose replayed round misses the measured one by more than this share (the period goal), or where the
# replayed round leaps across it by more than this share of it: only a step of the model reaches it, no fit: set
# aside (DESIGN.md 5.3)
UNMATCHED_MAX = 0.10
LEAP_PROBE = 2.5e-4  # α either side of a closest α where the round is replayed again: wider than bisection's last step


class Context:
    """The pieces one trace's counterfactuals share: model, rounds, unprofiled inputs (built once). ``fit``: scale
    the calibration's per-event costs so that the unchanged prediction matches the sidecar's measured unprofiled
    round when it has one (:func:`fit_profiler_scale`); False keeps the calibration as it is."""

    def __init__(self, trace: Trace, sidecar: dict | None = None, calibration: Calibration | None = None,
                 device: int | tuple[int, int] | None = None, round_name: str = "round", fit: bool = True):
        self.trace = trace
        self.sidecar = sidecar
        self.model = build_model(trace, device)
        # none given: the shipped calibration measured on this trace's GPU model, else the H200 host's default
        self.calibration = calibration or load_calibration(
            shipped_calibration_path(trace.device_name(self.model.key[1])))
        self.warnings: list[str] = []
        if self.calibration.runtime_call_us == 0 and len(self.model.item_call):
            # gaptrace calibrate without a GPU measures no runtime call and no device op: a CUDA trace keeps them
            self.warnings.append(f"the calibration {self.calibration.source} measured no CUDA runtime-call cost "
                                 f"({self.calibration.measured_on}): the profiler's cost per runtime call is not "
                                 "taken out of this CUDA trace; calibrate on a machine with the trace's GPU")
        self.starts = round_starts(trace, self.model, round_name)
        self.step_rule = "round"
        self.step_name = round_name
        # loop_body's memos: the ranges that fill the rounds, and each site's verdict
        self.body_ranges: list[tuple[str, np.ndarray, np.ndarray]] | None = None
        self.loop_body_memo: dict[str, LoopBody | None] = {}
        if len(self.starts) >= 2:
            h = trace.host
            m = (trace.host_str_eq("cat", "user_annotation") & trace.host_str_eq("name", round_name)
                 & trace.host_str_eq("tid", self.model.tid) & (h["rank"].to_numpy() == self.model.key[0]))
            self.window = (float(self.starts[0]), float(h["end_us"].to_numpy()[m].max()))
            n_starts = len(np.unique(h["ts_us"].to_numpy()[m]))
            if int(m.sum()) > n_starts:
                self.warnings.append(f"{int(m.sum()) - n_starts} {round_name!r} ranges start at the same µs as "
                                     "another on the launching thread (one range written twice): counted once")
            if n_starts > len(self.starts):
                self.warnings.append(inside_note(n_starts - len(self.starts), round_name))
        else:
            # no verify rounds: the loop's steps (analyses/steps.py find_steps: ProfilerStep#N, an engine's step
            # range, or a host range that repeats with a regular period), on the launching thread
            st = find_steps(trace, self.model.key, round_name)
            t = st.table
            if len(t) and not (t["tid"].astype(str) == self.model.tid).any():
                # the steps live on another thread that launches work too (a training loop's main thread beside
                # autograd's backward thread): replay the thread that holds the steps
                other = str(t["tid"].astype(str).value_counts().index[0])
                try:
                    self.model = build_model(trace, device, tid=other)
                except TraceError:
                    pass
            t = t[t["tid"].astype(str) == self.model.tid] if len(t) else t
            if len(t) < 2:
                raise TraceError(f"{trace.path}: fewer than two {round_name!r} ranges or loop steps on the "
                                 f"launching thread: no round period to predict ({st.reason})")
            self.starts = np.unique(t["start_us"].to_numpy(dtype=np.float64))
            if "exact copies" in st.reason:
                self.warnings.append(st.reason.rsplit("; ", 1)[-1])
            self.window = (float(self.starts[0]), float(t["end_us"].to_numpy(dtype=np.float64).max()))
            self.step_rule, self.step_name = st.rule, st.name_pattern or st.name
        # a period across two profiler windows is no round (Trace.window_joins): out of every figure
        self.joins = trace.window_joins(self.starts, self.model.key[0])
        if self.joins.all():
            raise TraceError(f"{trace.path}: every {round_name!r} period spans two profiler windows: no round "
                             "period to predict")
        self.unprof = unprofiled_inputs(trace, self.model, self.calibration, sidecar, window=self.window)
        self.base = self.replay_inputs(self.unprof)
        self.replayed = replay(self.model)
        self.unfitted_round_us = float(np.median(self.periods(self.base)))
        self.target_us = _measured_period_us(sidecar)
        self.scale = 1.0
        self.scale_found: float | None = None  # the α bisection found, before SCALE_MIN (None: no fit ran)
        self.fitted = False
        self.set_aside = False  # the measured unprofiled round is out of the fit's reach: not used (fit_status)
        self.fit_warning: str | None = None
        if fit and self.target_us:
            scale, unprof = fit_profiler_scale(self, self.target_us)
            found = self.scale_found = scale
            below_min = SCALE_BOUNDS[0] < scale < SCALE_MIN
            if below_min:  # the least α the calibration's measurements allow is the closest one (SCALE_MIN)
                scale, unprof = SCALE_MIN, self.inputs_at(SCALE_MIN)
            if scale in SCALE_BOUNDS:
                # no α in the bounds reaches the measured round. The calibration as it is (α = 1) is kept either
                # way: a device-bound round that α hardly moves, reproduced by it within FIT_TOLERANCE, is a fit;
                # otherwise the capture's unprofiled rounds are not like its profiled ones (a step that changes after
                # the warm-up, a host slower unprofiled than profiled) and are set aside (DESIGN.md 5.3)
                unf_err = (self.unfitted_round_us - self.target_us) / self.target_us
                if abs(unf_err) <= FIT_TOLERANCE:
                    self.fitted = True
                    return
                self.set_aside = True
                reach = (f"even at {SCALE_BOUNDS[1]:g} times the calibration's costs" if scale == SCALE_BOUNDS[1]
                         else "even with no profiler cost taken out (it is longer than the replay of the profiled "
                              "host work, with the measured ranges set)")
                self.fit_warning = (f"the sidecar's measured unprofiled round ({self.target_us / 1e3:.3f} ms) is "
                                    f"out of reach {reach} (replayed {self.unfitted_round_us / 1e3:.3f} ms with the "
                                    "calibration as it is): its rounds are not like the profiled ones (a step that "
                                    "changes after the warm-up?); set aside, the calibration used as it is")
                return
            unfitted_inputs, unfitted_base = self.unprof, self.base
            self.scale, self.unprof = scale, unprof
            self.base = self.replay_inputs(self.unprof)
            got = float(np.median(self.periods(self.base)))
            err = (got - self.target_us) / self.target_us
            # a fit is one that reproduces the measured round: the replayed round can jump with α (a wait that
            # appears), and bisection then ends beside the jump, inside the bounds but off the target
            self.fitted = abs(err) <= FIT_TOLERANCE
            if below_min and not self.fitted:
                t = self.target_us
                said = (f"the sidecar's measured unprofiled round ({t / 1e3:.3f} ms) is reached only at a profiler "
                        f"cost scale of {found:.2g}, below the {SCALE_MIN:g} the calibration's measurements allow; at "
                        f"{SCALE_MIN:g} the replayed round is {got / 1e3:.3f} ms ({err:+.1%})")
                if abs(err) > UNMATCHED_MAX:
                    # a fit that far below absorbs something else than the profiler (warm-up steps in a slower
                    # regime than the profiled ones): set aside like a round out of reach, α = 1
                    self.scale, self.unprof, self.base = 1.0, unfitted_inputs, unfitted_base
                    self.set_aside = True
                    self.fit_warning = (said + ": its rounds are not like the profiled ones (a step that changes "
                                        "after the warm-up?); set aside, the calibration used as it is")
                else:
                    self.fit_warning = said + f": {SCALE_MIN:g} kept, the closest allowed"
                return
            if not self.fitted:
                # bisection ends beside a jump of the replayed round: the round on both sides of it
                p_lo, p_hi = (self.period_at(max(SCALE_BOUNDS[0], scale - LEAP_PROBE)),
                              self.period_at(min(SCALE_BOUNDS[1], scale + LEAP_PROBE)))
                if (abs(err) > UNMATCHED_MAX
                        or (abs(p_lo - p_hi) > UNMATCHED_MAX * self.target_us
                            and min(p_lo, p_hi) <= self.target_us <= max(p_lo, p_hi))):
                    # the replayed round leaps across the measured one there, by more than the period goal: only a
                    # step of the model reaches it, whichever side bisection ended on, and no α describes these
                    # rounds (their regime is not the profiled one's); set aside like a round out of reach, α = 1
                    self.scale, self.unprof, self.base = 1.0, unfitted_inputs, unfitted_base
                    self.set_aside = True
                    t = self.target_us
                    self.fit_warning = (f"the sidecar's measured unprofiled round ({t / 1e3:.3f} ms) is not one of "
                                        f"these rounds: at a profiler cost scale of {scale:.4g} the replayed round "
                                        f"leaps from {p_lo / 1e3:.3f} ms ({(p_lo - t) / t:+.1%}) to "
                                        f"{p_hi / 1e3:.3f} ms ({(p_hi - t) / t:+.1%}), across it: only a leap of the "
                                        "model reaches it, no fit; its rounds are not like the profiled ones (a step "
                                        "that changes after the warm-up?); set aside, the calibration used as it is")
                    return
            if not self.fitted:
                self.fit_warning = (f"no profiler cost scale reproduces the measured unprofiled round "
                                    f"({self.target_us / 1e3:.3f} ms) within {FIT_TOLERANCE:.0%}: the closest, "
                                    f"{self.scale:.3g}, predicts {got / 1e3:.3f} ms ({err:+.1%})")

    def inputs_at(self, scale: float) -> dict[str, Any]:
        """The unprofiled inputs (:func:`.profiler_cost.unprofiled_inputs`) with every per-event cost scaled by
        ``scale``, κ as fitted for the context."""
        return unprofiled_inputs(self.trace, self.model, self.calibration, self.sidecar,
                                 kappa_us_per_node=self.unprof.get("kappa_us_per_node") or 0.0, scale=scale,
                                 window=self.window)

    def replay_inputs(self, u: dict[str, Any]) -> ReplayResult:
        """The replay of unprofiled inputs ``u`` (work, call costs, item durations and gaps)."""
        return replay(self.model, u["work_us"], u["cost_us"], item_dur_us=u["item_dur_us"],
                      item_gap_us=u["item_gap_us"])

    def period_at(self, scale: float) -> float:
        """The replayed unprofiled round (median period, µs) with every per-event cost scaled by ``scale``."""
        return float(np.median(self.periods(self.replay_inputs(self.inputs_at(scale)))))

    @property
    def fit_status(self) -> str:
        """"fitted" (α reproduces the measured unprofiled round within :data:`FIT_TOLERANCE`; α = 1 when the
        round is out of α's reach but the calibration as it is reproduces it, as in a device-bound loop),
        "set_aside" (no α in :data:`SCALE_BOUNDS` reaches it and α = 1 misses it, or the replayed round leaps across
        it by more than :data:`UNMATCHED_MAX` of it: the measured rounds are not like the profiled ones, and α = 1, the
        calibration as it is), "unmatched" (α inside the bounds, but the replayed round jumps across the target with α
        by less than that: the closest α is kept and misses it), or "none" (no measured round, or ``fit=False``)."""
        if self.fitted:
            return "fitted"
        if self.set_aside:
            return "set_aside"
        if self.fit_warning:
            return "unmatched"
        return "none"

    def periods(self, res: ReplayResult) -> np.ndarray:
        """(rounds,) replayed round periods, µs: the host's round-start intervals, each at least the round's device
        work on its busiest stream (:func:`device_round_busy_us`; DESIGN.md 5.5)."""
        host = np.diff(host_time_map(self.model, res, self.starts))
        return np.maximum(host, device_round_busy_us(self.model, res, self.starts))[~self.joins]

    def measured_periods(self) -> np.ndarray:
        """(rounds,) profiled round periods, µs (start to start), the periods across window joins left out."""
        return np.diff(self.starts)[~self.joins]

    def run(self, changes: Iterable[Change], graph_stats: list | None = None) -> ReplayResult:
        """The replay after ``changes`` (:func:`apply_changes`; ``graph_stats`` as there)."""
        changes = list(changes)
        w, c, wait, dropped, node_gap = apply_changes(self.trace, self.model, self.unprof["work_us"],
                                                      self.unprof["cost_us"], changes, self.window,
                                                      self.unprof.get("measured_scale"), calibration=self.calibration,
                                                      graph_stats=graph_stats)
        dur = np.where(dropped, 0.0, self.unprof["item_dur_us"])
        gap = np.where(dropped, 0.0, np.where(np.isnan(node_gap), self.unprof["item_gap_us"], node_gap))
        return replay(self.model, w, c, wait, item_dur_us=dur, item_gap_us=gap)


ONE_OFF_MIN_US = 100.0  # a round's excess saving below this is noise, never a one-off


def one_off_saving_us(per_round_saving_us: np.ndarray, saving_us: float) -> float:
    """What a change saves once, µs: the excess over the median per-round saving ``saving_us`` of the rounds whose
    saving is an outlier (above it by more than 5 scaled MADs of the per-round savings and by at least
    ``ONE_OFF_MIN_US``), summed; 0.0 when no round is one. ``per_round_saving_us``: (rounds,) before − after.
    A compile removed saves its time in the round it ran in; a per-round cause whose saving varies from round to
    round has no outlier round, so its spread is not reported as a one-off (DESIGN.md 5.5)."""
    dev = np.asarray(per_round_saving_us, dtype=float) - saving_us
    if dev.size == 0:
        return 0.0
    mad = 1.4826 * float(np.median(np.abs(dev - np.median(dev))))
    outlier = dev > max(5.0 * mad, ONE_OFF_MIN_US)
    return float(dev[outlier].sum())


def whatif(trace: Trace, changes: Iterable[Change] = (), sidecar: dict | None = None,
           calibration: Calibration | None = None, context: Context | None = None) -> WhatIf:
    """Predict the unprofiled round of ``trace`` before and after ``changes`` (module docstring). ``sidecar``: the
    capture sidecar (τ, unprofiled launch costs, the measured unprofiled round); ``calibration``: the per-event
    profiler costs (default: the shipped one). TraceError (one line) for a trace without rounds or a site that
    matches nothing. Returns :class:`WhatIf`."""
    ctx = context or Context(trace, sidecar, calibration)
    changes = list(changes)
    check_changes(changes)
    graph_stats: list[dict[str, Any]] = []
    after = ctx.run(changes, graph_stats) if changes else ctx.base
    p_meas = ctx.measured_periods()
    p_rep, p_before, p_after = ctx.periods(ctx.replayed), ctx.periods(ctx.base), ctx.periods(after)
    med_b, med_a = float(np.median(p_before)), float(np.median(p_after))
    # every change takes work away (a removal, a speedup F >= 1) and no replayed event can start later for it
    # (max-plus recurrence), but a median of round-start differences can still move a few µs the other way: that
    # is the estimator's noise, not a cost of the fix
    saving = max(med_b - med_a, 0.0)
    one_off = one_off_saving_us(p_before - p_after, saving)
    matched = {c.site: site_matches(trace, ctx.model, c.site) for c in changes}  # once a site: notes use it too
    notes = (_round_start_notes(trace, ctx, changes, matched) + _nested_notes(trace, ctx, changes, matched)
             + _substring_notes(matched))
    if med_a - med_b > LONGER_AFTER_NOTE_US and any(c.graph for c in changes):
        notes.append(f"the median round after the change is {med_a - med_b:.0f} µs longer than before ({med_b:.0f} -> "
                     f"{med_a:.0f} µs): the rounds' own starts moved (see above, or the periods), or the graph "
                     "launch (t0 + c·N) costs the host more than the work it takes out; saving_us is given as 0")
    elif med_a - med_b > LONGER_AFTER_NOTE_US:
        notes.append(f"the median round after the change is {med_a - med_b:.0f} µs longer than before ({med_b:.0f} -> "
                     f"{med_a:.0f} µs): a removal or speedup cannot lengthen a round, so the rounds' own starts "
                     "moved (see above, or the periods); saving_us is given as 0")
    rs_b = host_time_map(ctx.model, ctx.base, ctx.starts)
    rs_a = host_time_map(ctx.model, after, ctx.starts)
    tau = _tau(ctx.sidecar, len(ctx.starts) - 1, ctx.joins)
    unp = ctx.target_us
    data = {
        "trace": trace.path,
        "changes": [{"site": c.site, "factor": c.factor,
                     "action": ("speedup" if c.factor is not None else "graph" if c.graph else
                                "remove_with_device" if c.with_device else "remove"),
                     "matched": matched[c.site]}
                    for c in changes],
        "calibration": ctx.calibration.to_dict(),
        "rounds": int(len(p_meas)),
        "window_joins": int(ctx.joins.sum()),
        "round_rule": ctx.step_rule,
        "round_name": ctx.step_name,
        "profiled_round_us": float(np.median(p_meas)),
        "replayed_round_us": float(np.median(p_rep)),
        "replay_error": float(np.median(np.abs(p_rep - p_meas)[p_meas > 0] / p_meas[p_meas > 0]))
        if (p_meas > 0).any() else math.nan,
        "before_round_us": med_b,
        "after_round_us": med_a,
        "saving_us": saving,
        "before_mean_round_us": float(np.mean(p_before)),
        "after_mean_round_us": float(np.mean(p_after)),
        "one_off_saving_us": one_off,
        "unprofiled_round_us": unp,
        "measured_source": measured_period_source(ctx.sidecar) if unp else None,
        "unprofiled_error": (med_b - unp) / unp if unp else None,
        "profiler_cost_scale": ctx.scale,
        "profiler_cost_scale_found": ctx.scale_found,
        "fitted_to_unprofiled": ctx.fitted,
        "profiler_cost_fit": ctx.fit_status,
        "unfitted_round_us": ctx.unfitted_round_us,
        "unfitted_error": (ctx.unfitted_round_us - unp) / unp if unp else None,
        "occupancy_before": _occupancy(ctx.model, ctx.base, rs_b, p_before, ctx.joins),
        "occupancy_after": _occupancy(ctx.model, after, rs_a, p_after, ctx.joins),
        "tau": tau,
        "tpot_before_us": med_b / tau if tau else None,
        "tpot_after_us": med_a / tau if tau else None,
        "periods_profiled_us": p_meas.tolist(),
        "periods_replayed_us": p_rep.tolist(),
        "periods_before_us": p_before.tolist(),
        "periods_after_us": p_after.tolist(),
        "removed_us": ctx.unprof["removed_us"],
        "launch_source": ctx.unprof["launch_source"],
        "measured_ranges": ctx.unprof.get("measured_ranges", {}),
        # per --graph site: its occurrences, nodes, launch cost (t0 + per node × N) and node gap, with their sources
        "graph": graph_stats or None,
        "latency_us": ctx.model.latency_us,
        # the replay's cross-stream edges (docs/DESIGN.md 5.1): event waits matched / not, host-sync orders kept
        "stream_edges": dict(ctx.model.edge_counts),
        "warnings": (list(trace.warnings) + list(ctx.model.warnings) + list(ctx.warnings) + list(ctx.unprof.get("warnings", ()))
                     + ([ctx.fit_warning] if ctx.fit_warning else []) + notes),
    }
    return WhatIf(data)


NESTED_SHARE = 0.9  # a changed site with this share of its host time inside another changed site is nested in it


def _substring_notes(matched: dict[str, dict[str, Any]]) -> list[str]:
    """One note per site that matched more than one distinct frame name by substring (no NVTX range or frame has
    exactly its name): a short or mistyped site takes out every frame containing it, which the prediction then
    removes too. ``matched``: :func:`site_matches` of each site."""
    out = []
    for site, m in matched.items():
        names = m.get("names") or []
        if m.get("how") == "frames containing" and len(names) > 1:
            out.append(f"{site!r} names no NVTX range or frame exactly: it matched {len(names):,} distinct frames "
                       f"containing it ({m.get('events', 0):,} host events), all changed; name one frame as analyze "
                       "prints it, or an NVTX range, to change only that")
    return out


def _nested_notes(trace: Trace, ctx: "Context", changes: list[Change], matched: dict[str, dict[str, Any]]
                  ) -> list[str]:
    """One note per changed site on the launching thread whose host intervals lie (NESTED_SHARE of their µs) inside
    those of another changed site: the changes apply in turn, so the inner one acts on what the outer one left (a
    frame inside a removed or graphed range changes little or nothing more)."""
    iv = {c.site: site_intervals(trace, ctx.model, c.site, ctx.window) for c in changes
          if matched[c.site]["how"] != "other thread"}
    out = []
    for inner, (s_in, e_in) in iv.items():
        total = float(np.sum(e_in - s_in))
        for outer, (s_out, e_out) in iv.items():
            if outer == inner or total <= 0:
                continue
            a, b = _intersect(s_out, e_out, s_in, e_in)
            share = float(np.sum(b - a)) / total
            if share >= NESTED_SHARE:
                out.append(f"{inner!r} lies inside {outer!r} ({share:.0%} of its host time in the rounds): the "
                           "changes apply in turn, so the inner one acts only on what the outer one left")
                break
    return out


# a site holding more than this share of the round starts is the loop body (analyses/savings.py uses it too)
BODY_START_SHARE = 0.5
# whatif: a median round that lengthens by more than this under a change is named (a few µs is the median's noise)
LONGER_AFTER_NOTE_US = 1.0


@dataclasses.dataclass(frozen=True)
class LoopBody:
    """Whether a site is the loop body around the round (:func:`loop_body`). ``starts_held``: round starts
    (``Context.starts``) inside its host intervals, of ``rounds``; ``body``: True when it holds more than
    BODY_START_SHARE of them, or more than that share of the occurrences of a range that fills the rounds
    (``fills``: that range's name, else None); ``window_share``: the share of the rounds' window its host
    intervals cover."""

    starts_held: int
    rounds: int
    body: bool
    fills: str | None = None
    window_share: float = 0.0  # of the rounds' window inside the site's host intervals


def body_ranges(trace: Trace, ctx: Context) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """The ranges that fill the rounds: (name, starts, ends) (µs relative to the model's t0) of every
    user_annotation name on the launching thread inside the window that occurs at least once per two rounds, whose
    occurrences cover more than BODY_START_SHARE of the window and hold more than that share of the window's
    launch calls (:func:`.steps.is_launch_call`; a loop's own ``step`` range inside ``ProfilerStep#N``, a forward
    range; not a cause's own range that is long only because the cause is: a detokenize or read-back range, or a
    tree built on the host that polls the device, holds few launches). Memoised on
    ``ctx``. DESIGN.md 5.10."""
    if ctx.body_ranges is not None:
        return ctx.body_ranges
    h = trace.host
    lo, hi = ctx.window
    m = (trace.host_str_eq("cat", "user_annotation") & (h["rank"].to_numpy() == ctx.model.key[0])
         & trace.host_str_eq("tid", ctx.model.tid)
         & (h["ts_us"].to_numpy() >= lo) & (h["ts_us"].to_numpy() < hi))
    rows = np.flatnonzero(m)
    out: list[tuple[str, np.ndarray, np.ndarray]] = []
    if len(rows) and hi > lo:
        names = trace.host_str("name")[rows]
        t0 = ctx.model.t0_us
        ts, te = h["ts_us"].to_numpy()[rows] - t0, h["end_us"].to_numpy()[rows] - t0
        n_rounds = max(len(ctx.starts) - 1, 1)
        # the launch calls (kernel and graph launches: steps.is_launch_call, as analyze's host-range
        # findings count them), not every runtime call: a host loop polling cudaEventQuery is no body
        u, inv = np.unique(np.asarray(ctx.model.call_name, dtype=object).astype(str), return_inverse=True)
        launch = np.array([is_launch_call(n) for n in u], dtype=bool)[inv]
        calls = np.asarray(ctx.model.call_start_us, dtype=np.float64)
        calls = calls[launch & (calls >= lo - t0) & (calls < hi - t0)]
        for name in np.unique(names):
            k = names == name
            cover = float(np.minimum(te[k], hi - t0).sum() - ts[k].sum())
            if k.sum() < 0.5 * n_rounds or cover <= BODY_START_SHARE * (hi - lo):
                continue
            held = int(_starts_inside(*_merge(ts[k], te[k]), calls).sum())
            if held > BODY_START_SHARE * len(calls):
                out.append((str(name), ts[k], te[k]))
    ctx.body_ranges = out
    return out


def loop_body(trace: Trace, ctx: Context, site: str) -> LoopBody | None:
    """Whether ``site`` (a frame or NVTX range, as :func:`site_intervals` matches it) is the loop body around the
    round: it holds more than BODY_START_SHARE of the round starts, or more than that share of the occurrences
    of a range that fills the rounds (:func:`body_ranges`; the range itself aside: a ``step`` range is not its own
    body). None when the site is not on the launching thread. Removing such a site removes the round's own host
    work: analyze gives it no saving, whatif says so (DESIGN.md 5.10). Memoised on ``ctx`` by site."""
    if site in ctx.loop_body_memo:
        return ctx.loop_body_memo[site]
    try:
        us, ue = site_intervals(trace, ctx.model, site)
    except TraceError:
        ctx.loop_body_memo[site] = None
        return None
    t0 = ctx.model.t0_us
    t = np.asarray(ctx.starts, dtype=np.float64) - t0
    held = int(_starts_inside(us, ue, t).sum())
    lo, hi = ctx.window[0] - t0, ctx.window[1] - t0
    share = float((np.minimum(ue, hi) - np.maximum(us, lo)).clip(min=0).sum()) / (hi - lo) if hi > lo else 0.0
    out = LoopBody(held, len(t), held > BODY_START_SHARE * len(t), window_share=share)
    if not out.body and len(us):
        for name, bs, be in body_ranges(trace, ctx):
            if name == site:
                continue
            j = np.searchsorted(us, bs, side="right") - 1
            inside = (j >= 0) & (be <= ue[np.maximum(j, 0)] + 1e-6)
            if int(inside.sum()) > BODY_START_SHARE * len(bs):
                out = dataclasses.replace(out, body=True, fills=name)
                break
    ctx.loop_body_memo[site] = out
    return out


def _round_start_notes(trace: Trace, ctx: Context, changes: list[Change],
                       matched: dict[str, dict[str, Any]]) -> list[str]:
    """One warning per changed site that is the loop body (:func:`loop_body`) or holds round starts: removing or
    speeding it moves those starts, so the periods around them are not rounds any more; the loop body is no cause
    (DESIGN.md 5.10: analyze gives it no saving); one per changed range that itself fills the rounds
    (:func:`body_ranges`: most of the round's host work and launches: the loop body, or a host-bound forward that
    analyze's host_bound finding names); and one per changed frame that spans more than BODY_START_SHARE of the
    window (analyze's other body rule, which needs the findings: such a frame holding another finding's cause is the
    body around it). A site on
    another thread holds none of the launching thread's starts. ``matched``: :func:`site_matches` of each site."""
    out = []
    for c in changes:
        lb = loop_body(trace, ctx, c.site)
        verb = (f"speeds up (x{c.factor:g})" if c.factor is not None else
                "captures in one CUDA graph" if c.graph else "removes")
        fills = lb is not None and c.site in {name for name, _s, _e in body_ranges(trace, ctx)}
        if fills:
            out.append(f"{c.site!r} is a range that fills the rounds ({lb.window_share:.0%} of the window and most of "
                       f"its launch calls): the loop body or its forward; the prediction {verb} most of the "
                       "round's host work")
        # (a frame: an NVTX range that long is a marker around the cause it holds when it buys no more, 5.10)
        elif (lb is not None and not lb.body and lb.window_share > BODY_START_SHARE
                and matched[c.site]["how"] != "range"):
            out.append(f"{c.site!r} spans {lb.window_share:.0%} of the rounds' window: analyze calls a site that long "
                       "the loop body when it holds another finding's cause (one that does not also hold it) and then "
                       f"gives it no saving of its own (DESIGN.md 5.10); this prediction {verb} all of its host work")
        if lb is None or not (lb.body or lb.starts_held):
            continue
        where = (f"{c.site!r} holds most occurrences of {lb.fills!r}, a range that fills the rounds" if lb.fills else
                 f"{c.site!r} holds the start of {lb.starts_held} of {lb.rounds} rounds")
        out.append(where + ": " + (f"it is the loop body around the round, not a cause (analyze gives it no saving); "
                                   f"the prediction {verb} the round's own host work" if lb.body else
                                   "changing it moves those round starts, so the periods beside them are not whole "
                                   "rounds"))
    return out


def cause_savings(trace: Trace, causes: Iterable[dict[str, Any]], sidecar: dict | None = None,
                  calibration: Calibration | None = None) -> list[dict[str, Any]]:
    """For each cause ({"site": frame or NVTX range, ...}: a blocking sync's site, an idle site or range, as the
    findings name them), the cause with ``saving_us`` (median unprofiled round before − after its removal),
    ``one_off_saving_us`` and ``after_round_us`` added, or ``error`` (one line) when its site matches nothing; in
    the given order (sort on ``saving_us`` to rank). The model, rounds and unprofiled baseline are built once."""
    ctx = Context(trace, sidecar, calibration)
    out = []
    for c in causes:
        row = dict(c)
        try:
            w = whatif(trace, [Change(str(c["site"]))], context=ctx).data
            row.update(saving_us=w["saving_us"], one_off_saving_us=w["one_off_saving_us"],
                       before_round_us=w["before_round_us"], after_round_us=w["after_round_us"])
        except TraceError as e:
            row.update(saving_us=None, error=str(e))
        out.append(row)
    return out
