"""The verdict a user needs, per step and overall: what bounds the loop, with the figure behind it.

For every step of :func:`gaptrace.analyses.steps.find_steps` (on the analysed device, keyed (rank, device)), over
its interval [s, e]: from its start to the next step's start (the period, as :mod:`.rounds` reads Tround: the
loop's time between two steps is the loop's too; the runtime's overlapped ``round`` range covers about half of its
period), or to its own end for the last step (no next start) and where the next step is on another thread or
starts before this one ends; ``step_us`` = e − s:

- ``gpu_busy_us``: device busy time inside [s, e] (union of kernels, memcpys, memsets; DESIGN.md "Busy /
  occupancy"); ``device_side_us``: idle inside it before activities that were already launched (bubbles between
  queued kernels, :func:`.occupancy.device_side_gaps`); ``host_wait_idle_us`` the rest of the idle: the device
  waiting for the host.
- The host-wait idle is split, each moment charged once, in this order (the first explanation that holds wins):
  ``sync_idle_us``   under a blocking call of the rank (:func:`.syncs.blocking_calls`), charged first, or in its
                     serialized tail (to the device's resumption, :meth:`.timeline.BusyTimeline.next_sustained_start`,
                     as ``idle_after_us``), charged after the compile and thread-wait parts: a tail the host spent in
                     a compile or waiting on another thread is that cause's (the host was not late because it had
                     read a value back, it was waiting for someone);
  ``graph_launch_idle_us`` under a graph launch call (cudaGraphLaunch & co.) of the rank: the part a
                     profiler-inflated launch holds (DESIGN.md "Launch fit"; :mod:`.launch_idle` splits it into κ·N
                     and t0); it names no verdict of its own (the instrument's cost is not the loop's), the figure
                     mentions it when it is the largest part;
  ``compile_idle_us`` under a compile marker of the rank, any thread (:data:`.steps.COMPILE_FRAME_RE`);
  ``thread_wait_idle_us`` under a loop thread's wait on another thread (:func:`.thread_waits.wait_intervals`; a
                     ``sleep`` is host work, not a wait on a thread);
  ``launch_idle_us`` under back-to-back eager launching: on a loop thread, from one eager launch call (cudaLaunchKernel
                     & co., :func:`.steps.is_launch_call` less graph launches) to the next when they start less than
                     ``LAUNCH_GAP_US`` apart, and under each launch call;
  ``other_host_idle_us`` the rest (host work that launches nothing: Python, the tokenizer, a scheduler).
- ``eager_launches`` / ``graph_launches``: launch calls that start in the step on the rank; ``launch_paced_us``: the
  union of the launch-paced intervals above; ``host_us``: step_us − blocked_us (time in blocking calls on the step's
  thread) − wait_us (time in thread waits on it); ``launch_paced_share`` = launch_paced_us / host_us;
  ``host_us_per_launch`` = launch_paced_us / eager_launches (what the host pays per kernel).
- ``device_lag_us``: median over the step's launch calls whose device work is in the trace (joined on the
  correlation id) of (first device start − launch call end): how far the device runs behind the host.

Verdict of a step (thresholds and why):

1. ``gpu_bound`` when the device runs more than half a step behind the host (``device_lag_us`` > ``LAG_SHARE`` ×
   step_us: the host ran ahead and waits only for queue space; what the host does cannot shorten the step), or
   when (gpu_busy_us + device_side_us) / step_us >= ``GPU_BOUND_SHARE`` (0.85: the device had work queued 85% of
   the step, so at most 15% is the host's to win; the shipped captures fall clearly on either side of it: the
   runtime's overlapped rounds and the V100 trace-diff steps at 100%, the H100 Qwen forward at 95%, the sync
   runtime's rounds at 75–80%, the eager-glue bs-1 rounds at about 60%).
2. Else the largest of the host-wait idle parts names it: ``sync_bound``, ``compile_bound``, ``thread_wait``
   (waiting on another thread), ``launch_bound`` or ``host_bound``. ``launch_bound`` needs at least
   ``MIN_EAGER_LAUNCHES`` (20) eager launches in the step; with fewer, a CUDA graph saves at most a few launch
   latencies and the launch part counts as ``host_bound``. Because the sync part is charged first, a loop with a
   read-back (``.item()``, a D2H copy of lengths) is ``sync_bound`` even though its occupancy looks like a graph
   downgrade's; a downgraded graph shows as hundreds of eager launches a step with no sync idle.
3. ``unknown`` when the trace has no device activity on the step's rank.

``LAUNCH_GAP_US`` (1000 µs): eager PyTorch pays 5–50 µs of host time per op under the profiler (dispatch, the
launch call, CUPTI's callback) and, recorded with Python stacks, up to a few hundred µs of module code between two
kernels (the shipped eager vLLM B200 step: median 84 µs between launches, 99th percentile 476 µs, 5 of 767 gaps
above 1 ms), all of which a CUDA graph of the forward removes; a stretch of 1 ms or more without a launch is host
work of its own (a data-loader batch, a scheduler, a tokenizer) that a graph would not remove.

The overall verdict (:class:`Verdicts`.overall) is the most common verdict over the steps that are not outliers
(:attr:`.steps.Steps.table` ``outlier``; ties go to the verdict with more idle), with medians of those steps'
figures; the outlier steps keep their own verdicts and :class:`.steps.OutlierStep` sentences.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pandas as pd

from gaptrace.trace import GRAPH_LAUNCH_NAMES, Trace

from . import stacks
from .occupancy import busy_timeline, resolve_device
from .timeline import merge_intervals

__all__ = ["Verdicts", "step_verdicts", "GPU_BOUND_SHARE", "LAUNCH_GAP_US", "MIN_EAGER_LAUNCHES", "LAG_SHARE",
           "VERDICTS"]

GPU_BOUND_SHARE = 0.85
LAUNCH_GAP_US = 1000.0
MIN_EAGER_LAUNCHES = 20
LAG_SHARE = 0.5
VERDICTS = ("gpu_bound", "sync_bound", "compile_bound", "thread_wait", "launch_bound", "host_bound", "unknown")
_PARTS = ("sync_idle_us", "graph_launch_idle_us", "compile_idle_us", "thread_wait_idle_us", "launch_idle_us",
          "other_host_idle_us")

VERDICT_COLUMNS = ["step", "verdict", "interval_start_us", "interval_end_us", "step_us", "gpu_busy_us", "gpu_busy_share", "device_side_us",
                   "host_wait_idle_us", *_PARTS, "blocked_us", "wait_us", "host_us", "eager_launches",
                   "graph_launches", "launch_paced_us", "launch_paced_share", "host_us_per_launch", "device_lag_us",
                   "top_sync", "top_compile", "top_wait", "top_host", "figure"]


@dataclasses.dataclass
class Verdicts:
    """Result of :func:`step_verdicts`. Times in µs; shares in [0, 1].

    ``table``: one row per step, columns ``VERDICT_COLUMNS`` (module docstring), ``top_sync`` (the blocking call
    with the most blocked time in the step: "call (aten op) from site"), ``top_compile`` / ``top_wait`` (the compile
    marker / wait frame holding the most idle), ``top_host`` (the host range or Python frame
    inside the step holding the most of its host-wait idle: :func:`_top_host`), ``figure`` (the sentence behind the
    step's verdict).
    ``overall``: verdict, steps (counted), figure (the sentence for the headline), and the medians of the table's
    numeric columns over the counted steps of that verdict (``*_us``), plus ``verdict_counts`` ({verdict: steps}),
    ``outliers_left_out`` and, when there are outliers, ``with_outliers``: {steps, mean (the table's numeric columns
    averaged over every step), verdict_counts}.
    """

    table: pd.DataFrame
    overall: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        from .steps import to_jsonable

        return to_jsonable({"overall": self.overall, "steps": self.table.to_dict("records")})


def _ms(us: float) -> str:
    us = float(us)
    return f"{us / 1e6:.2f} s" if us >= 1e6 else f"{us / 1e3:.2f} ms" if us >= 1e3 else f"{us:.0f} µs"


def _union_idle(tl, s: np.ndarray, e: np.ndarray, lo: float, hi: float) -> float:
    """Idle of ``tl`` under the union of intervals [s, e] clipped to [lo, hi]."""
    s, e = np.maximum(s, lo), np.minimum(e, hi)
    ok = e > s
    if not ok.any():
        return 0.0
    ms, me = merge_intervals(s[ok], e[ok])
    return float(tl.idle_between(ms, me).sum())


def _union_len(s: np.ndarray, e: np.ndarray, lo: float, hi: float) -> float:
    s, e = np.maximum(s, lo), np.minimum(e, hi)
    ok = e > s
    if not ok.any():
        return 0.0
    ms, me = merge_intervals(s[ok], e[ok])
    return float((me - ms).sum())


def _overlapping(s: np.ndarray, e: np.ndarray, lo: float, hi: float) -> np.ndarray:
    return (s < hi) & (e > lo)


def step_verdicts(trace: Trace, steps: Any, device: int | tuple[int, int] | None = None,
                  sync_calls: pd.DataFrame | None = None) -> Verdicts:
    """The verdict of every step of ``steps`` (a :class:`.steps.Steps`) and overall (module docstring).

    ``device``: the device whose busy time the verdict reads (default the busiest); ``sync_calls``: the ``calls``
    of :func:`.syncs.blocking_syncs` already computed with ``host_wait_only=True`` (recomputed when None).
    Returns an empty table and overall verdict "unknown" (with the reason) when there are no steps.
    """
    from . import syncs
    from .steps import _name_mask, compile_kind, is_compile_frame, is_launch_call
    from .thread_waits import loop_threads, wait_intervals

    t = steps.table
    if t.empty:
        return Verdicts(table=pd.DataFrame({c: [] for c in VERDICT_COLUMNS}),
                        overall={"verdict": "unknown", "steps": 0, "figure": f"no steps: {steps.reason}"})
    if trace.device.empty:
        tab = pd.DataFrame({"step": t["step"], "verdict": "unknown", "step_us": t["dur_us"],
                            "figure": "no device activity in the trace"})
        return Verdicts(table=tab.reindex(columns=VERDICT_COLUMNS),
                        overall={"verdict": "unknown", "steps": len(t), "figure": "no device activity in the trace"})
    key = resolve_device(trace, device)
    rank = key[0]
    d = trace.device
    drows = d[(d["rank"].to_numpy() == rank) & (d["device"].to_numpy() == key[1])]
    win = (float(min(t["start_us"].min(), drows["ts_us"].min())), float(max(t["end_us"].max(), drows["end_us"].max())))
    tl = busy_timeline(trace, key, win)
    hw = busy_timeline(trace, key, win, host_wait_only=True)
    h = trace.host
    tree = stacks.host_tree(trace)

    # blocking calls of the analysed device, each with its serialized tail
    calls = sync_calls
    if calls is None:
        calls = syncs.blocking_syncs(trace, window=win, host_wait_only=True).calls
    if not calls.empty:
        calls = calls[(calls["rank"].to_numpy() == rank) & (calls["device"].to_numpy() == key[1])]
    c_s = calls["ts_us"].to_numpy(np.float64) if len(calls) else np.empty(0)
    c_e = calls["end_us"].to_numpy(np.float64) if len(calls) else np.empty(0)
    c_tail = np.maximum(hw.next_sustained_start(c_e, syncs.RESUME_WINDOW_US), c_e) if len(calls) else np.empty(0)
    c_label = ([f"{r.call}{' (' + r.aten_op + ')' if getattr(r, 'aten_op', '') else ''}"
                f"{' from ' + r.site if getattr(r, 'site', '') else ''}" for r in calls.itertuples(index=False)]
               if len(calls) else [])

    # compile markers of the rank (outermost of each nest), any thread
    comp_frame = np.array([is_compile_frame(f) for f in tree.frames], dtype=bool)
    rank_of_node = tree.threads["rank"].to_numpy()[tree.thread] if tree.n else np.empty(0, np.int64)
    is_comp = (tree.frame >= 0) & comp_frame[np.maximum(tree.frame, 0)] & (rank_of_node == rank)
    comp = np.flatnonzero(is_comp)
    comp = comp[stacks.enclosing(tree, comp, is_comp) < 0]
    k_s, k_e, k_name = tree.start_us[comp], tree.end_us[comp], tree.frame_names(comp)

    # thread waits of the loop threads (sleep is host work)
    loops = loop_threads(trace, rank, steps)
    w = wait_intervals(trace, rank)
    w = w[w["tid"].astype(str).isin(loops).to_numpy() & (w["kind"] != "sleep").to_numpy()]
    w_s, w_e, w_tid = w["start_us"].to_numpy(), w["end_us"].to_numpy(), w["tid"].astype(str).to_numpy()
    w_name = np.array([f"{f} in {c}" if c else str(f) for f, c in zip(w["frame"], w["caller"])], dtype=object)

    # launch calls of the rank: eager (per thread, launch-paced intervals) and graph launches
    rt = np.flatnonzero(h["cat"].isin(("cuda_runtime", "cuda_driver")).to_numpy() & (h["rank"].to_numpy() == rank))
    rt = rt[_name_mask(trace, rt, is_launch_call)]
    graph = _name_mask(trace, rt, lambda n: n in GRAPH_LAUNCH_NAMES or "GraphLaunch" in n)
    eager = rt[~graph]
    e_ts, e_end = h["ts_us"].to_numpy()[eager], h["end_us"].to_numpy()[eager]
    e_tid = h["tid"].astype(str).to_numpy()[eager]
    o = np.lexsort((e_ts, e_tid))
    e_ts, e_end, e_tid = e_ts[o], e_end[o], e_tid[o]
    nxt_same = np.r_[e_tid[1:] == e_tid[:-1], False]
    nxt_ts = np.r_[e_ts[1:], np.inf]
    paced = nxt_same & (nxt_ts - e_ts < LAUNCH_GAP_US)
    p_s = np.r_[e_ts, e_ts[paced]]
    p_e = np.r_[e_end, nxt_ts[paced]]
    g_ts = h["ts_us"].to_numpy()[rt[graph]]
    g_end = h["end_us"].to_numpy()[rt[graph]]
    # device lag: first device start per correlation id of a launch call
    l_ts, l_end = h["ts_us"].to_numpy()[rt], h["end_us"].to_numpy()[rt]
    corr = h["correlation"].to_numpy()[rt]
    first_dev = drows[drows["correlation"].to_numpy() >= 0].groupby("correlation")["ts_us"].min()
    if len(first_dev) and len(corr):
        pos = first_dev.index.get_indexer(corr)
        lag = np.where(pos >= 0, first_dev.to_numpy()[np.maximum(pos, 0)] - l_end, np.nan)
    else:  # no device activity joins a launch (correlation ids absent or broken): no lag is known
        lag = np.full(len(corr), np.nan)

    rows = []
    ends = _interval_ends(t)
    for r, e in zip(t.itertuples(index=False), ends):
        s = float(r.start_us)
        step_us = e - s
        busy = float(tl.busy_between(np.array([s]), np.array([e]))[0])
        hw_idle = float(hw.idle_between(np.array([s]), np.array([e]))[0])
        dev_side = max(step_us - busy - hw_idle, 0.0)
        mc = _overlapping(c_s, c_tail, s, e)
        mk = _overlapping(k_s, k_e, s, e)
        mw = _overlapping(w_s, w_e, s, e)
        mp = _overlapping(p_s, p_e, s, e)
        mg = _overlapping(g_ts, g_end, s, e)
        # the sync's own call first, its serialized tail after the compile and thread-wait parts: a tail the host
        # spent waiting on another thread (or compiling) is that wait's, not the read-back's
        sets = [(c_s[mc], c_e[mc]), (g_ts[mg], g_end[mg]), (k_s[mk], k_e[mk]), (w_s[mw], w_e[mw]),
                (c_e[mc], c_tail[mc]), (p_s[mp], p_e[mp])]
        parts, acc_s, acc_e, prev = [], np.empty(0), np.empty(0), 0.0
        for a, b in sets:
            acc_s, acc_e = np.r_[acc_s, a], np.r_[acc_e, b]
            cur = _union_idle(hw, acc_s, acc_e, s, e)
            parts.append(max(cur - prev, 0.0))
            prev = cur
        parts.append(max(hw_idle - prev, 0.0))
        sync_under, graph_i, comp_i, wait_i, sync_tail, launch_i, other_i = parts
        sync_i = sync_under + sync_tail
        own = mw & (w_tid == str(r.tid))
        wait_us = _union_len(w_s[own], w_e[own], s, e)
        in_c = mc & (calls["tid"].astype(str).to_numpy() == str(r.tid)) & (c_s >= s) & (c_s < e) if len(calls) else mc
        blocked = float(calls["blocked_us"].to_numpy()[in_c].sum()) if len(calls) else 0.0
        host_us = max(step_us - blocked - wait_us, 0.0)
        n_eager = int(((e_ts >= s) & (e_ts < e)).sum())
        n_graph = int(((g_ts >= s) & (g_ts < e)).sum())
        paced_us = _union_len(p_s[mp], p_e[mp], s, e)
        in_l = (l_ts >= s) & (l_ts < e) & np.isfinite(lag)
        dev_lag = float(np.median(lag[in_l])) if in_l.any() else float("nan")
        top_sync = c_label[int(np.flatnonzero(mc)[np.argmax(calls["blocked_us"].to_numpy()[mc])])] if mc.any() else ""
        top_comp = str(k_name[np.flatnonzero(mk)[np.argmax((k_e - k_s)[mk])]]) if mk.any() else ""
        top_wait = str(w_name[np.flatnonzero(mw)[np.argmax((w_e - w_s)[mw])]]) if mw.any() else ""
        row = {"step": int(r.step), "interval_start_us": s, "interval_end_us": e, "step_us": step_us, "gpu_busy_us": busy,
               "gpu_busy_share": busy / step_us if step_us > 0 else 0.0, "device_side_us": dev_side,
               "host_wait_idle_us": hw_idle, "sync_idle_us": sync_i, "graph_launch_idle_us": graph_i,
               "compile_idle_us": comp_i,
               "thread_wait_idle_us": wait_i, "launch_idle_us": launch_i, "other_host_idle_us": other_i,
               "blocked_us": blocked, "wait_us": wait_us, "host_us": host_us, "eager_launches": n_eager,
               "graph_launches": n_graph, "launch_paced_us": paced_us,
               "launch_paced_share": paced_us / host_us if host_us > 0 else 0.0,
               "host_us_per_launch": paced_us / n_eager if n_eager else float("nan"), "device_lag_us": dev_lag,
               "top_sync": top_sync, "top_compile": top_comp, "top_wait": top_wait,
               "top_host": _top_host(tree, hw, int(r.host_row), s, e, other_i + graph_i)}
        row["verdict"] = _verdict(row)
        row["figure"] = _figure(row, compile_kind)
        rows.append(row)
    tab = pd.DataFrame(rows)[VERDICT_COLUMNS]
    return Verdicts(table=tab, overall=_overall(tab, t, compile_kind))


def _interval_ends(t: pd.DataFrame) -> np.ndarray:
    """End of each step's interval: the next step's start when that step is on the same thread and starts at or
    after this one's end (the period, as :mod:`.rounds` reads Tround), else the step's own end (the last step, or
    steps of several threads)."""
    end = t["end_us"].to_numpy(np.float64).copy()
    if len(t) < 2:
        return end
    nxt = t["start_us"].to_numpy(np.float64)[1:]
    same = t["tid"].astype(str).to_numpy()[1:] == t["tid"].astype(str).to_numpy()[:-1]
    use = same & (nxt >= end[:-1] - stacks.EPS_US)
    end[:-1] = np.where(use, nxt, end[:-1])
    return end


def _top_host(tree, hw, host_row: int, s: float, e: float, target_us: float) -> str:
    """The deepest host event on the step's thread inside [s, e] reached by following, from the step's own event,
    the child with the most host-wait idle while that child holds at least half of ``target_us`` (the step's
    other host idle); its frame name when it is a range (user_annotation, record_function label) or a Python frame
    with a source file, else the deepest such frame above it; "" when no child holds that much."""
    if target_us <= 0 or tree.n == 0:
        return ""
    node = int(tree.nodes(np.array([host_row]))[0])
    k = int(tree.thread[node])
    lo, hi = int(tree.thread_bounds[k]), int(tree.thread_bounds[k + 1])
    inside = lo + np.flatnonzero((tree.start_us[lo:hi] >= s) & (tree.end_us[lo:hi] <= e + stacks.EPS_US))
    inside = inside[inside != node]
    if not len(inside):
        return ""
    idle = hw.idle_between(tree.start_us[inside], tree.end_us[inside])
    par = tree.parent[inside]
    named = ""
    cur = node
    while True:
        kids = np.flatnonzero(par == cur)
        if not len(kids):
            break
        best = kids[int(np.argmax(idle[kids]))]
        if idle[best] < 0.5 * target_us:
            break
        cur = int(inside[best])
        f = str(tree.frames[tree.frame[cur]])
        cat = int(tree.cat[cur])
        if (cat == stacks.CAT_CODE["user_annotation"] or (cat == stacks.CAT_CODE["cpu_op"] and "#" in f)
                or (cat == stacks.CAT_CODE["python_function"] and stacks._has_source(f))):
            named = f
    return named


def _verdict(r: dict) -> str:
    step = r["step_us"]
    if step <= 0:
        return "unknown"
    if np.isfinite(r["device_lag_us"]) and r["device_lag_us"] > LAG_SHARE * step:
        return "gpu_bound"
    if (r["gpu_busy_us"] + r["device_side_us"]) / step >= GPU_BOUND_SHARE:
        return "gpu_bound"
    launch = r["launch_idle_us"] if r["eager_launches"] >= MIN_EAGER_LAUNCHES else 0.0
    other = r["other_host_idle_us"] + (r["launch_idle_us"] - launch)
    parts = {"sync_bound": r["sync_idle_us"], "compile_bound": r["compile_idle_us"],
             "thread_wait": r["thread_wait_idle_us"], "launch_bound": launch, "host_bound": other}
    best = max(parts, key=lambda k: parts[k])
    if parts[best] > 0:
        return best
    return "host_bound" if r["graph_launch_idle_us"] > 0 else "gpu_bound"


def _figure(r: dict, compile_kind) -> str:
    v, step = r["verdict"], r["step_us"]
    if step <= 0 or v == "unknown":
        return "no device activity"

    graph = r.get("graph_launch_idle_us", 0.0)
    parts = [r[k] for k in _PARTS if k != "graph_launch_idle_us"]
    note = (f"; {_ms(graph)} more idle sat under graph launch calls, which the profiler inflates (launch fit)"
            if graph > 0 and graph >= max(parts) else "")
    if v == "host_bound" and note:
        where = f"; the host's time went mostly to {r['top_host']}" if r.get("top_host") else ""
        return (f"the GPU idled {_ms(graph)} ({graph / step:.0%} of the step) under graph launch calls, which the "
                f"profiler inflates (κ·N of the launch fit), and {_ms(max(parts))} more waiting for other host work "
                f"(GPU busy {r['gpu_busy_share']:.0%}){where}: the host is late with its launches")
    return _figure_text(r, v, step, compile_kind) + (note if v != "gpu_bound" else "")


def _figure_text(r: dict, v: str, step: float, compile_kind) -> str:
    def pct(x: float) -> str:
        return f"{x / step:.0%} of the step" if step > 0 else "0%"

    if v == "gpu_bound":
        if ((r["gpu_busy_us"] + r["device_side_us"]) / step < GPU_BOUND_SHARE and np.isfinite(r["device_lag_us"])
                and r["device_lag_us"] > LAG_SHARE * step):
            return (f"the step's device work started {_ms(r['device_lag_us'])} after its launch calls (median), more "
                    f"than half the {_ms(step)} step: the host ran ahead of the GPU, which is the bottleneck "
                    + (f"(GPU busy {r['gpu_busy_share']:.0%} of the step, {r['device_side_us'] / step:.0%} in gaps "
                       "before work already queued: stream / event dependencies, not the host)"
                       if r["gpu_busy_us"] > 0 else "(none of its device work ran inside the step)"))
        if r["device_side_us"] > r["gpu_busy_us"]:
            return (f"GPU busy {r['gpu_busy_share']:.0%} of the step ({_ms(r['gpu_busy_us'])} of {_ms(step)}) and "
                    f"{r['device_side_us'] / step:.0%} idle before work already queued: the device waits on stream / "
                    "event dependencies (another stream, a collective), not on the host")
        return (f"GPU busy {r['gpu_busy_share']:.0%} of the step ({_ms(r['gpu_busy_us'])} of {_ms(step)}; "
                f"{r['device_side_us'] / step:.0%} more in bubbles between queued kernels): the host keeps ahead, "
                "so only less device time shortens the step")
    if v == "sync_bound":
        top = f" (most: {r['top_sync']})" if r["top_sync"] else ""
        return (f"the GPU idled {_ms(r['sync_idle_us'])} ({pct(r['sync_idle_us'])}) under or right after blocking "
                f"syncs; the host blocked {_ms(r['blocked_us'])} in them{top}")
    if v == "compile_bound":
        return (f"the GPU idled {_ms(r['compile_idle_us'])} ({pct(r['compile_idle_us'])}) while "
                f"{compile_kind(r['top_compile'])} ran ({r['top_compile']})")
    if v == "thread_wait":
        return (f"the GPU idled {_ms(r['thread_wait_idle_us'])} ({pct(r['thread_wait_idle_us'])}) while the loop "
                f"thread waited on another thread ({r['top_wait']})")
    if v == "launch_bound":
        return (f"{r['eager_launches']} eager launches a step at {r['host_us_per_launch']:.0f} µs of host time each "
                f"({r['launch_paced_share']:.0%} of the step's host time is back-to-back launching; the GPU idled "
                f"{_ms(r['launch_idle_us'])}, {pct(r['launch_idle_us'])}, meanwhile): capture them in a CUDA graph")
    if v == "host_bound":
        idle = r["other_host_idle_us"] + (r["launch_idle_us"] if r["eager_launches"] < MIN_EAGER_LAUNCHES else 0.0)
        where = f"; most of it inside {r['top_host']}" if r.get("top_host") else ""
        return (f"the GPU idled {_ms(idle)} ({pct(idle)}) waiting for host work that launches nothing "
                f"(GPU busy {r['gpu_busy_share']:.0%}; {r['eager_launches']} eager launches){where}")
    return "no device activity"


def _overall(tab: pd.DataFrame, steps_table: pd.DataFrame, compile_kind) -> dict[str, Any]:
    out_mask = steps_table["outlier"].to_numpy(bool) if "outlier" in steps_table else np.zeros(len(tab), bool)
    use = tab[~out_mask] if (~out_mask).any() else tab
    counts = use["verdict"].value_counts()
    idle = use.groupby("verdict")["host_wait_idle_us"].sum()
    top = max(counts.index, key=lambda v: (int(counts[v]), float(idle.get(v, 0.0))))
    med = use[use["verdict"] == top].median(numeric_only=True).to_dict()
    row = {k: med.get(k, 0.0) for k in tab.columns if k not in ("verdict", "figure", "top_sync", "top_compile",
                                                                "top_wait", "top_host")}
    same = use[use["verdict"] == top]
    for k in ("top_sync", "top_compile", "top_wait", "top_host"):
        vals = same[k][same[k] != ""]
        row[k] = str(vals.mode().iloc[0]) if len(vals) else ""
    row["verdict"] = top
    row["eager_launches"] = int(round(row["eager_launches"]))
    figure = _figure(row, compile_kind)
    n = len(use)
    lead = f"{int(counts[top])} of {n} steps" if n > 1 else "the one step"
    overall = {k: v for k, v in row.items() if k not in ("step",)}
    overall.update({"verdict": top, "steps": n, "verdict_counts": {str(k): int(v) for k, v in counts.items()},
                    "outliers_left_out": int(out_mask.sum()), "figure": f"{lead} {top.replace('_', '-')}: {figure}"})
    if out_mask.any():  # the same figures over every step, outliers included (means: an outlier moves them)
        num = tab.select_dtypes("number").drop(columns=["step"])
        overall["with_outliers"] = {"steps": len(tab), "mean": num.mean().to_dict(),
                                    "verdict_counts": {str(k): int(v) for k, v in tab["verdict"].value_counts().items()}}
    return overall
