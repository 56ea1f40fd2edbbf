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
                     as ``idle_after_us``, capped at the call's blocked time + ``SYNC_RELAUNCH_US``: DESIGN.md 3.11),
                     charged after the compile and thread-wait parts: a tail the host spent in
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
  union of the launch-paced intervals above less the step thread's blocking calls and thread waits inside them; ``host_us``: step_us
  less the union of the step thread's blocking calls and its thread waits (blocked_us, wait_us: each its own sum);
  ``launch_paced_share`` = launch_paced_us / host_us; ``host_us_per_launch`` = launch_paced_us / eager_launches (what the host pays per kernel).
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

__all__ = ["Verdicts", "step_verdicts", "GPU_BOUND_SHARE", "LAUNCH_GAP_US", "MIN_EAGER_LAUNCHES", "LAG_SHARE",
           "VERDICTS"]

GPU_BOUND_SHARE = 0.85
LAUNCH_GAP_US = 1000.0
MIN_EAGER_LAUNCHES = 20
LAG_SHARE = 0.5
SYNC_RELAUNCH_US = 50.0  # a blocking read's serialized tail beyond its blocked time: the host's relaunch after it
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
    # a read that had not blocked would have let the host do its work after it while the device finished what the
    # read waited for: of the idle after the call, at most the call's blocked time (plus a relaunch) is the read's;
    # the rest is host work that would have left the device idle anyway (a host-bound loop never resumes
    # "sustained", so its tail would run to the next busy stretch and read as sync-bound)
    c_tail = np.minimum(c_tail, c_e + (c_e - c_s) + SYNC_RELAUNCH_US) if len(calls) else c_tail
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
    e_tid = trace.host_str("tid")[eager]
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

    ends = _interval_ends(t)
    S = t["start_us"].to_numpy(np.float64)
    G = len(S)
    step_us = ends - S
    busy = tl.busy_between(S, ends)
    hw_idle = hw.idle_between(S, ends)
    dev_side = np.maximum(step_us - busy - hw_idle, 0.0)
    step_tid = t["tid"].astype(str).to_numpy()
    pc, pk, pw, pp, pg = (_pairs(S, ends, a, b) for a, b in ((c_s, c_tail), (k_s, k_e), (w_s, w_e), (p_s, p_e),
                                                                (g_ts, g_end)))
    # the sync's own call first, its serialized tail after the compile and thread-wait parts: a tail the host
    # spent waiting on another thread (or compiling) is that wait's, not the read-back's
    sets = [(pc, c_s, c_e), (pg, g_ts, g_end), (pk, k_s, k_e), (pw, w_s, w_e), (pc, c_e, c_tail), (pp, p_s, p_e)]
    parts, acc_g, acc_s, acc_e, prev = [], np.empty(0, np.int64), np.empty(0), np.empty(0), np.zeros(G)
    for (g, i), a, b in sets:
        acc_g, acc_s, acc_e = np.r_[acc_g, g], np.r_[acc_s, a[i]], np.r_[acc_e, b[i]]
        mg_, ms_, me_ = _grouped_union(acc_g, acc_s, acc_e, S, ends)
        cur = _group_sums(G, mg_, hw.idle_between(ms_, me_))
        parts.append(np.maximum(cur - prev, 0.0))
        prev = cur
    parts.append(np.maximum(hw_idle - prev, 0.0))
    sync_under, graph_i, comp_i, wait_i, sync_tail, launch_i, other_i = parts
    sync_i = sync_under + sync_tail
    own = w_tid[pw[1]] == step_tid[pw[0]]
    og, os_, oe = _grouped_union(pw[0][own], w_s[pw[1][own]], w_e[pw[1][own]], S, ends)
    wait_us = _group_sums(G, og, oe - os_)
    if len(calls):
        c_tid = calls["tid"].astype(str).to_numpy()
        c_blocked = calls["blocked_us"].to_numpy()
        g, i = pc
        in_c = (c_tid[i] == step_tid[g]) & (c_s[i] >= S[g]) & (c_s[i] < ends[g])
        blocked = _group_sums(G, g[in_c], c_blocked[i[in_c]])
        bc_g, bc_s, bc_e = g[in_c], c_s[i[in_c]], c_e[i[in_c]]  # the step thread's blocking calls in each step
    else:
        c_blocked, blocked = np.empty(0), np.zeros(G)
        bc_g, bc_s, bc_e = np.empty(0, np.int64), np.empty(0), np.empty(0)

    def count_in(ts: np.ndarray) -> np.ndarray:
        st = np.sort(ts)
        return np.maximum(np.searchsorted(st, ends, side="left") - np.searchsorted(st, S, side="left"), 0)

    n_eager, n_graph = count_in(e_ts), count_in(g_ts)
    # the launch-paced stretches less the step thread's blocking calls and thread waits inside them (host time, as
    # host_us is): |A ∪ B| − |B|, B the blocking calls and waits; host_us less B's union too, so the share is <= 1
    own_g, own_s, own_e = pw[0][own], w_s[pw[1][own]], w_e[pw[1][own]]
    nb_g, nb_s, nb_e = np.r_[bc_g, own_g], np.r_[bc_s, own_s], np.r_[bc_e, own_e]
    bg_, bs_, be_ = _grouped_union(nb_g, nb_s, nb_e, S, ends)
    not_host = _group_sums(G, bg_, be_ - bs_)
    ug_, us_, ue_ = _grouped_union(np.r_[pp[0], nb_g], np.r_[p_s[pp[1]], nb_s], np.r_[p_e[pp[1]], nb_e], S, ends)
    paced_us = np.maximum(_group_sums(G, ug_, ue_ - us_) - not_host, 0.0)
    host_us = np.maximum(step_us - not_host, 0.0)
    lg, li = _points(S, ends, l_ts)
    fin = np.isfinite(lag[li])
    dev_lag = _group_medians(G, lg[fin], lag[li[fin]])
    top_c = _group_first_max(G, pc[0], c_blocked[pc[1]] if len(calls) else np.empty(0))
    top_k = _group_first_max(G, pk[0], (k_e - k_s)[pk[1]])
    top_w = _group_first_max(G, pw[0], (w_e - w_s)[pw[1]])
    host_nodes = tree.nodes(t["host_row"].to_numpy(np.int64)) if tree.n else np.zeros(G, np.int64)
    ordered_tree = bool(tree.n == 0 or (tree.end_us >= tree.start_us).all())

    rows = []
    for j, r in enumerate(t.itertuples(index=False)):
        s, e, su, b = float(S[j]), float(ends[j]), float(step_us[j]), float(busy[j])
        hu, ne, pu = float(host_us[j]), int(n_eager[j]), float(paced_us[j])
        row = {"step": int(r.step), "interval_start_us": s, "interval_end_us": e, "step_us": su, "gpu_busy_us": b,
               "gpu_busy_share": b / su if su > 0 else 0.0, "device_side_us": float(dev_side[j]),
               "host_wait_idle_us": float(hw_idle[j]), "sync_idle_us": float(sync_i[j]),
               "graph_launch_idle_us": float(graph_i[j]), "compile_idle_us": float(comp_i[j]),
               "thread_wait_idle_us": float(wait_i[j]), "launch_idle_us": float(launch_i[j]),
               "other_host_idle_us": float(other_i[j]),
               "blocked_us": float(blocked[j]), "wait_us": float(wait_us[j]), "host_us": hu, "eager_launches": ne,
               "graph_launches": int(n_graph[j]), "launch_paced_us": pu,
               "launch_paced_share": pu / hu if hu > 0 else 0.0,
               "host_us_per_launch": pu / ne if ne else float("nan"), "device_lag_us": float(dev_lag[j]),
               "top_sync": c_label[int(pc[1][top_c[j]])] if top_c[j] >= 0 else "",
               "top_compile": str(k_name[int(pk[1][top_k[j]])]) if top_k[j] >= 0 else "",
               "top_wait": str(w_name[int(pw[1][top_w[j]])]) if top_w[j] >= 0 else "",
               "top_host": _top_host(tree, hw, int(host_nodes[j]), s, e, float(other_i[j] + graph_i[j]),
                                     ordered_tree)}
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


def _top_host(tree, hw, node: int, s: float, e: float, target_us: float, ordered: bool = True) -> str:
    """The deepest host event on the step's thread inside [s, e] reached by following, from the step's own event
    (tree node ``node``), the child with the most host-wait idle while that child holds at least half of
    ``target_us`` (the step's other host idle); its frame name when it is a range (user_annotation, record_function
    label) or a Python frame with a source file, else the deepest such frame above it; "" when no child holds that
    much. Nodes of a thread are sorted by start, so the candidates are the slice starting in [s, e + EPS]
    (``ordered``: no node ends before it starts; else the thread's nodes from s on)."""
    if target_us <= 0 or tree.n == 0:
        return ""
    k = int(tree.thread[node])
    lo, hi = int(tree.thread_bounds[k]), int(tree.thread_bounds[k + 1])
    st = tree.start_us[lo:hi]
    a = lo + int(np.searchsorted(st, s, side="left"))
    b = lo + int(np.searchsorted(st, e + stacks.EPS_US, side="right")) if ordered else hi
    inside = a + np.flatnonzero(tree.end_us[a:b] <= e + stacks.EPS_US)
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


# ---------------------------------------------------------------- per-step set operations, all steps at once
# Each helper below answers, for every step g with interval [lo[g], hi[g]], what the per-step loop of
# :func:`step_verdicts` asked of one step; results are the same floats (sums run per step over that step's values in
# the same order as ``ndarray.sum`` of one step's array, see :func:`_group_sums`).

def _pairs(lo: np.ndarray, hi: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every (step g, interval i) with a[i] < hi[g] and b[i] > lo[g] (the step's overlapping intervals), sorted by
    (g, i). Shapes: lo, hi (G,); a, b (n,) µs -> (p,), (p,) int64.

    Intervals no longer than ``cut`` (the 99th percentile of durations) are found by searchsorted: sorted by start,
    a step's candidates start in (lo − cut, hi) and after the first one whose running maximal end passes lo; the few
    longer ones are compared with every step.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    G, n = len(lo), len(a)
    if G == 0 or n == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    dur = b - a
    cut = float(np.quantile(dur, 0.99)) if n > 100 else float("inf")
    short = np.flatnonzero(dur <= cut) if np.isfinite(cut) else np.arange(n)
    long_ = np.flatnonzero(~(dur <= cut)) if np.isfinite(cut) else np.empty(0, np.int64)
    gs, is_ = [], []
    if len(short):
        o = short[np.argsort(a[short], kind="stable")]
        sa, sb = a[o], b[o]
        cmax = np.maximum.accumulate(sb)
        first = np.searchsorted(cmax, lo, side="right")
        last = np.searchsorted(sa, hi, side="left")
        cnt = np.maximum(last - first, 0)
        g = np.repeat(np.arange(G, dtype=np.int64), cnt)
        off = np.cumsum(cnt) - cnt
        k = np.arange(int(cnt.sum()), dtype=np.int64) - np.repeat(off, cnt) + np.repeat(first, cnt)
        ok = (sb[k] > lo[g]) & (sa[k] < hi[g])
        gs.append(g[ok])
        is_.append(o[k[ok]])
    for j in long_:  # few: each against every step
        g = np.flatnonzero((a[j] < hi) & (b[j] > lo))
        gs.append(g.astype(np.int64))
        is_.append(np.full(len(g), j, dtype=np.int64))
    g, i = np.concatenate(gs), np.concatenate(is_)
    o = np.lexsort((i, g))
    return g[o], i[o]


def _points(lo: np.ndarray, hi: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every (step g, point i) with lo[g] <= t[i] < hi[g], sorted by (g, i). Shapes: (G,), (G,), (n,) -> (p,), (p,)."""
    t = np.asarray(t, dtype=np.float64)
    o = np.argsort(t, kind="stable")
    st = t[o]
    first = np.searchsorted(st, lo, side="left")
    cnt = np.maximum(np.searchsorted(st, hi, side="left") - first, 0)
    g = np.repeat(np.arange(len(lo), dtype=np.int64), cnt)
    off = np.cumsum(cnt) - cnt
    k = np.arange(int(cnt.sum()), dtype=np.int64) - np.repeat(off, cnt) + np.repeat(first, cnt)
    i = o[k]
    s = np.lexsort((i, g))
    return g[s], i[s]


def _group_sums(G: int, g: np.ndarray, x: np.ndarray) -> np.ndarray:
    """(G,) float64: sum of x over each group, as ``x[g == k].sum()`` (numpy's pairwise order, per group; 0.0 for an
    empty group). ``g`` sorted."""
    out = np.zeros(G)
    if not len(g):
        return out
    bounds = np.searchsorted(g, np.arange(G + 1))
    for k in np.flatnonzero(bounds[1:] > bounds[:-1]):
        out[k] = x[bounds[k]:bounds[k + 1]].sum()
    return out


def _group_first_max(G: int, g: np.ndarray, x: np.ndarray) -> np.ndarray:
    """(G,) int64: for each group the position (into g / x) of its largest x, the first one on ties (as
    ``np.argmax``; NaN counts as largest), -1 for an empty group. ``g`` sorted, positions in order within a group."""
    out = np.full(G, -1, dtype=np.int64)
    if not len(g):
        return out
    x = np.asarray(x, dtype=np.float64)  # an object column (blocked time where the split may be unavailable)
    key = np.where(np.isnan(x), np.inf, x)
    o = np.lexsort((np.arange(len(g)), -key, g))
    head = np.r_[True, g[o][1:] != g[o][:-1]]
    out[g[o][head]] = o[head]
    return out


def _grouped_union(g: np.ndarray, s: np.ndarray, e: np.ndarray, lo: np.ndarray,
                   hi: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per group, the union of intervals [s, e] clipped to [lo[g], hi[g]] as disjoint spans, as
    :func:`.timeline.merge_intervals` gives it for one group (empty clipped intervals dropped): (group, start, end),
    sorted by (group, start). The running maximal end restarts at each group: ends are ranked, and the maximum of
    group·n + rank accumulates."""
    s = np.maximum(s, lo[g])
    e = np.minimum(e, hi[g])
    ok = e > s
    g, s, e = g[ok], s[ok], e[ok]
    if not len(g):
        return g, s, e
    o = np.lexsort((s, g))
    g, s, e = g[o], s[o], e[o]
    n = len(g)
    by_end = np.argsort(e, kind="stable")
    rank = np.empty(n, dtype=np.int64)
    rank[by_end] = np.arange(n, dtype=np.int64)
    run = np.maximum.accumulate(g * n + rank) - g * n
    run_end = e[by_end[run]]
    new = np.empty(n, dtype=bool)
    new[0] = True
    new[1:] = (g[1:] != g[:-1]) | (s[1:] > run_end[:-1])
    first = np.flatnonzero(new)
    last = np.r_[first[1:] - 1, n - 1]
    return g[first], s[first], run_end[last]


def _group_medians(G: int, g: np.ndarray, x: np.ndarray) -> np.ndarray:
    """(G,) float64: ``np.median`` of x over each group (NaN for an empty group); ``g`` sorted, x finite."""
    out = np.full(G, np.nan)
    if not len(g):
        return out
    o = np.lexsort((x, g))
    gs, xs = g[o], x[o]
    bounds = np.searchsorted(gs, np.arange(G + 1))
    cnt = bounds[1:] - bounds[:-1]
    has = cnt > 0
    lo = bounds[:-1] + (cnt - 1) // 2
    hi = bounds[:-1] + cnt // 2
    lo, hi = lo[has], hi[has]
    out[has] = np.where(lo == hi, xs[lo], (xs[lo] + xs[hi]) / 2.0)
    return out
