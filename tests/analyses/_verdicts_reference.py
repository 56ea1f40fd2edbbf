"""The per-step loop :func:`gaptrace.analyses.verdicts.step_verdicts` ran before it computed all steps at once, kept
as the plain reference its vectorised form is checked against (tests/analyses/test_verdicts_vectorised.py): one
step at a time, each part a union of the step's own overlapping intervals, ``ndarray.sum`` per step."""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from gaptrace.analyses import stacks
from gaptrace.analyses.occupancy import busy_timeline, resolve_device
from gaptrace.analyses.timeline import merge_intervals
from gaptrace.analyses.verdicts import (LAUNCH_GAP_US, SYNC_RELAUNCH_US, VERDICT_COLUMNS, Verdicts, _figure,
                                        _interval_ends, _overall, _verdict)
from gaptrace.trace import GRAPH_LAUNCH_NAMES, Trace


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


def step_verdicts_ref(trace: Trace, steps: Any, device: int | tuple[int, int] | None = None,
                  sync_calls: pd.DataFrame | None = None) -> Verdicts:
    """The verdict of every step of ``steps`` (a :class:`.steps.Steps`) and overall (module docstring).

    ``device``: the device whose busy time the verdict reads (default the busiest); ``sync_calls``: the ``calls``
    of :func:`.syncs.blocking_syncs` already computed with ``host_wait_only=True`` (recomputed when None).
    Returns an empty table and overall verdict "unknown" (with the reason) when there are no steps.
    """
    from gaptrace.analyses import syncs
    from gaptrace.analyses.steps import _name_mask, compile_kind, is_compile_frame, is_launch_call
    from gaptrace.analyses.thread_waits import loop_threads, wait_intervals

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
    # the read's share of the idle after it: at most its blocked time plus a relaunch (verdicts.SYNC_RELAUNCH_US)
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
        n_eager = int(((e_ts >= s) & (e_ts < e)).sum())
        n_graph = int(((g_ts >= s) & (g_ts < e)).sum())
        # not host time: the step thread's blocking calls and its thread waits (their union)
        bs_ = np.r_[c_s[in_c], w_s[own]] if len(calls) else w_s[own]
        be_ = np.r_[c_e[in_c], w_e[own]] if len(calls) else w_e[own]
        b_us = _union_len(bs_, be_, s, e)
        host_us = max(step_us - b_us, 0.0)
        # the launch-paced stretches less that (host time, as host_us is)
        ab_us = _union_len(np.r_[p_s[mp], bs_], np.r_[p_e[mp], be_], s, e)
        paced_us = max(ab_us - b_us, 0.0)
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
               "top_host": _top_host_ref(tree, hw, int(r.host_row), s, e, other_i + graph_i)}
        row["verdict"] = _verdict(row)
        row["figure"] = _figure(row, compile_kind)
        rows.append(row)
    tab = pd.DataFrame(rows)[VERDICT_COLUMNS]
    return Verdicts(table=tab, overall=_overall(tab, t, compile_kind))


def _top_host_ref(tree, hw, host_row: int, s: float, e: float, target_us: float) -> str:
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
