"""Waiting on another thread, and idle with no Python frame to name.

**Thread waits.** A loop thread (one that launches device work, or holds the steps) that sits in a lock, condition,
queue or join wait is not computing: whatever it waits for runs on another thread. The wait frames are the ones
:data:`gaptrace.analyses.stacks.WAIT_FRAME_RE` names (``threading.py: wait`` / ``join`` / ``_wait_for_tstate_lock``,
``queue.py: get``, ``selectors.py: select``, a built-in ``acquire`` / ``wait`` / ``select`` / ``poll``, ``sleep``);
the outermost one of a contiguous chain is the wait (``queue.get`` → ``Condition.wait`` → ``lock.acquire`` is one
wait), its enclosing frame with a source file is the caller. Each wait carries the device's host-wait idle during
it (idle before kernels not yet launched; :func:`gaptrace.analyses.occupancy.fill_device_side`), the step it sat in
(``steps``, :mod:`.steps`) and what the other threads of its process recorded meanwhile: when none of them has
Python frames, torch.profiler recorded no Python stacks for the thread it waited on (it records them only for
threads it has seen start; C++ threads have none), which the finding says instead of blaming the wait frame.
Parked helper threads (tqdm's monitor, an idle pool) never launch device work and are not loop threads: their waits
explain nothing and are left out (as in gap attribution, :func:`gaptrace.analyses.gaps._parked_threads`).

**Idle without Python frames.** In a trace recorded without ``with_stack=True`` (or on a thread that has none) gap
attribution can only name the ATen ops and runtime calls open during the idle. :func:`idle_without_stacks` groups
the host-wait idle during which a loop thread had no Python frame open by (innermost ATen op, innermost runtime
call) and says to capture with stacks.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np
import pandas as pd

from gaptrace.trace import Trace

from . import stacks
from .occupancy import busy_timeline, resolve_device

__all__ = ["ThreadWaits", "wait_intervals", "loop_threads", "thread_waits", "idle_without_stacks", "wait_kind",
           "CAPTURE_HINT"]

CAPTURE_HINT = ("record with torch.profiler.profile(with_stack=True) to see the Python frames "
                "(gaptrace capture does)")


def wait_kind(frame: str) -> str:
    """"lock" | "condition" | "queue" | "join" | "select" | "sleep" for a wait frame name."""
    if re.search(r"queue\.py\(\d+\): get", frame):
        return "queue"
    if re.search(r"join|_wait_for_tstate_lock", frame):
        return "join"
    if re.search(r"select|poll|control", frame):
        return "select"
    if "sleep" in frame:
        return "sleep"
    if "acquire" in frame:
        return "lock"
    return "condition"


_KIND_TEXT = {"lock": "on a lock", "condition": "on a condition", "queue": "on a queue", "join": "to join a thread",
              "select": "in select/poll", "sleep": "sleeping"}


def wait_intervals(trace: Trace, rank: int | None = None) -> pd.DataFrame:
    """The outermost wait frame of every contiguous wait chain on every host thread (of ``rank``, or all).

    Columns: rank, pid, tid, host_row (positional row of ``trace.host``), frame (normalised), kind
    (:func:`wait_kind`), start_us, end_us, dur_us, caller (the innermost enclosing Python frame with a source file,
    "" when none), caller_row (-1 when none). Sorted by start. Empty without Python stacks.
    """
    tree = stacks.host_tree(trace)
    cols = ["rank", "pid", "tid", "host_row", "frame", "kind", "start_us", "end_us", "dur_us", "caller", "caller_row"]
    if tree.n == 0:
        return pd.DataFrame({c: [] for c in cols})
    wf = stacks.waiting_frames(tree)
    is_wait = (tree.frame >= 0) & wf[np.maximum(tree.frame, 0)]
    if rank is not None:
        is_wait &= tree.threads["rank"].to_numpy()[tree.thread] == rank
    nodes = np.flatnonzero(is_wait)
    if len(nodes) == 0:
        return pd.DataFrame({c: [] for c in cols})
    outer = nodes[stacks.enclosing(tree, nodes, is_wait) < 0]
    rows = tree.rows(outer)
    caller_row = stacks.innermost_site(tree, rows)
    th = tree.threads.iloc[tree.thread[outer]]
    frames = tree.frame_names(outer)
    callers = tree.frame_names(tree.nodes(caller_row))
    out = pd.DataFrame({"rank": th["rank"].to_numpy(), "pid": th["pid"].to_numpy(), "tid": th["tid"].to_numpy(),
                        "host_row": rows, "frame": frames, "kind": [wait_kind(f) for f in frames],
                        "start_us": tree.start_us[outer], "end_us": tree.end_us[outer],
                        "dur_us": tree.end_us[outer] - tree.start_us[outer], "caller": callers,
                        "caller_row": caller_row})
    return out.sort_values(["start_us", "host_row"], kind="stable").reset_index(drop=True)


def loop_threads(trace: Trace, rank: int, steps: Any = None) -> set[str]:
    """tids (as strings) of the rank's loop threads: those with a launch call (cuda_runtime / cuda_driver
    ``*Launch*``, :func:`.steps.is_launch_call`) and those holding the steps (``steps``: a :class:`.steps.Steps`)."""
    from .steps import _name_mask, is_launch_call

    h = trace.host
    rt = np.flatnonzero(h["cat"].isin(("cuda_runtime", "cuda_driver")).to_numpy() & (h["rank"].to_numpy() == rank))
    rt = rt[_name_mask(trace, rt, is_launch_call)]
    out = set(h["tid"].iloc[rt].astype(str).unique())
    if steps is not None and len(steps.table):
        out |= set(steps.table["tid"].astype(str))
    return out


@dataclasses.dataclass
class ThreadWaits:
    """Result of :func:`thread_waits`. Times in µs.

    ``waits``: :func:`wait_intervals` of the loop threads, plus step (index into the steps' table, -1 outside
    every step or without steps), gpu_idle_us (host-wait idle of the analysed device during the wait), others
    ("stacks": another thread of the process recorded Python frames during the wait; "no_stacks": other threads
    recorded events but no Python frames; "none": no other thread recorded anything), other_tids (those threads).
    ``findings``: one row per (tid, kind, frame, caller): waits, wait_us, gpu_idle_us, steps (distinct steps),
    others (the most informative value over its waits: "no_stacks" > "none" > "stacks"), summary (the sentence),
    sorted by gpu_idle_us then wait_us, descending. ``sleep`` waits are kept in ``waits`` but not in ``findings``
    (a sleep waits on no other thread).
    """

    waits: pd.DataFrame
    findings: pd.DataFrame

    def to_dict(self) -> dict[str, Any]:
        from .steps import to_jsonable

        return to_jsonable({"waits": self.waits.to_dict("records"), "findings": self.findings.to_dict("records")})


def _thread_label(pid: str, tid: str) -> str:
    return "the main thread" if str(pid) == str(tid) else f"thread {tid}"


def thread_waits(trace: Trace, device: int | tuple[int, int] | None = None, steps: Any = None,
                 min_us: float = 0.0, window: tuple[float, float] | None = None) -> ThreadWaits:
    """Waits of the loop threads of ``device``'s rank (module docstring) longer than ``min_us``, each with the
    device idle during it and the step it sat in (``steps``: :func:`.steps.find_steps`'s result, optional).
    ``window``: (t0_us, t1_us) the idle is counted in (``analyze``'s window, so that a wait's idle is a part of
    the window's idle total); default the device's activity and the waits together.

    A trace without device activity gets gpu_idle_us NaN. Never raises for a trace without Python stacks (empty).
    """
    has_dev = not trace.device.empty
    key = resolve_device(trace, device) if has_dev else None
    rank = key[0] if key else (int(trace.host["rank"].iloc[0]) if len(trace.host) else 0)
    w = wait_intervals(trace, rank)
    w = w[w["tid"].astype(str).isin(loop_threads(trace, rank, steps)).to_numpy() & (w["dur_us"] > min_us).to_numpy()]
    w = w.reset_index(drop=True)
    if has_dev and len(w):
        tl = busy_timeline(trace, key, window if window is not None else _span(trace, key, w), host_wait_only=True)
        w["gpu_idle_us"] = tl.idle_between(w["start_us"].to_numpy(), w["end_us"].to_numpy())
    else:
        w["gpu_idle_us"] = np.nan
    w["step"] = _step_of(steps, w)
    w["others"], w["other_tids"] = _others(trace, w)
    act = w[w["kind"] != "sleep"]
    fcols = ["tid", "kind", "frame", "caller", "waits", "wait_us", "gpu_idle_us", "steps", "others", "summary"]
    if act.empty:
        return ThreadWaits(waits=w, findings=pd.DataFrame({c: [] for c in fcols}))
    rank_others = {"no_stacks": 0, "none": 1, "stacks": 2}
    rows = []
    for (tid, kind, frame, caller), g in act.groupby(["tid", "kind", "frame", "caller"], sort=False):
        others = min(g["others"], key=lambda o: rank_others[o])
        idle = float(g["gpu_idle_us"].sum()) if has_dev else float("nan")
        in_steps = sorted(int(s) for s in set(g["step"]) if s >= 0)
        who = _thread_label(g["pid"].iloc[0], tid)
        where = f" in {caller}" if caller else ""
        step_txt = (f" (step {in_steps[0]})" if len(in_steps) == 1 else f" ({len(in_steps)} steps)" if in_steps else "")
        idle_txt = f", the GPU idle {_ms(idle)} of it" if has_dev and idle > 0 else ""
        other_txt = {"no_stacks": "; torch.profiler recorded no Python stacks for the thread it waited on "
                                  f"(thread {', '.join(sorted(set(sum(g['other_tids'], []))))} ran without Python frames)",
                     "none": "; no other thread of the process recorded events meanwhile: the thread it waited on is "
                             "not in the trace",
                     "stacks": ""}[others]
        summary = (f"{who} waited {_ms(float(g['dur_us'].sum()))} {_KIND_TEXT[kind]}{where}{step_txt} "
                   f"({len(g)} waits in {frame}{idle_txt}){other_txt}")
        rows.append({"tid": tid, "kind": kind, "frame": frame, "caller": caller, "waits": len(g),
                     "wait_us": float(g["dur_us"].sum()), "gpu_idle_us": idle, "steps": len(in_steps),
                     "others": others, "summary": summary})
    f = pd.DataFrame(rows).sort_values(["gpu_idle_us", "wait_us"], ascending=False, kind="stable",
                                       na_position="last").reset_index(drop=True)
    return ThreadWaits(waits=w, findings=f[fcols])


def _span(trace: Trace, key: tuple[int, int], w: pd.DataFrame) -> tuple[float, float]:
    d = trace.device
    d = d[(d["rank"].to_numpy() == key[0]) & (d["device"].to_numpy() == key[1])]
    return (float(min(d["ts_us"].min(), w["start_us"].min())), float(max(d["end_us"].max(), w["end_us"].max())))


def _step_of(steps: Any, w: pd.DataFrame) -> np.ndarray:
    """Index of the step (same thread) whose interval holds each wait's start, -1 if none."""
    out = np.full(len(w), -1, dtype=np.int64)
    if steps is None or not len(steps.table) or not len(w):
        return out
    t = steps.table
    for tid, g in t.groupby(t["tid"].astype(str)):
        m = np.flatnonzero(w["tid"].astype(str).to_numpy() == tid)
        if not len(m):
            continue
        s, e = g["start_us"].to_numpy(), g["end_us"].to_numpy()
        o = np.argsort(s)
        k = np.searchsorted(s[o], w["start_us"].to_numpy()[m], side="right") - 1
        ok = (k >= 0) & (w["start_us"].to_numpy()[m] < e[o][np.maximum(k, 0)])
        out[m[ok]] = g["step"].to_numpy()[o][k[ok]]
    return out


def _others(trace: Trace, w: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Per wait: what the process's other threads recorded during it ("stacks" | "no_stacks" | "none") and which.

    Per other thread of the wait's (rank, pid), an event overlaps [ws, we] when one of its events starting before
    we ends after ws: the running maximum of the ends over the events sorted by start, at searchsorted(starts, we).
    O(n log n) per thread, vectorised over the waits."""
    h = trace.host
    n = len(w)
    if not n:
        return [], []
    key = pd.DataFrame({"rank": h["rank"].to_numpy(), "pid": trace.host_str("pid"),
                        "tid": trace.host_str("tid")})
    ts, te = h["ts_us"].to_numpy(np.float64), h["end_us"].to_numpy(np.float64)
    py = (h["cat"] == "python_function").to_numpy()
    ws, we = w["start_us"].to_numpy(np.float64), w["end_us"].to_numpy(np.float64)
    any_hit: dict[str, np.ndarray] = {}
    py_hit: dict[str, np.ndarray] = {}
    for (rank, pid, tid), idx in key.groupby(["rank", "pid", "tid"], sort=True).indices.items():
        mine = ((w["rank"].to_numpy() == rank) & (w["pid"].astype(str).to_numpy() == pid)
                & (w["tid"].astype(str).to_numpy() != tid))
        if not mine.any():
            continue
        for sel, out in ((idx, any_hit), (idx[py[idx]], py_hit)):
            hit = np.zeros(n, dtype=bool)
            if len(sel):
                o = np.argsort(ts[sel], kind="stable")
                s_sorted, run_end = ts[sel][o], np.maximum.accumulate(te[sel][o])
                k = np.searchsorted(s_sorted, we, side="left")
                hit = mine & (k > 0) & (run_end[np.maximum(k - 1, 0)] > ws)
            out[tid] = hit
    kinds, tids = [], []
    for i in range(n):
        with_py = sorted(t for t, m in py_hit.items() if m[i])
        others = sorted(t for t, m in any_hit.items() if m[i])
        if with_py:
            kinds.append("stacks")
            tids.append(with_py)
        elif others:
            kinds.append("no_stacks")
            tids.append(others)
        else:
            kinds.append("none")
            tids.append([])
    return kinds, tids


def idle_without_stacks(trace: Trace, device: int | tuple[int, int] | None = None,
                        window: str | tuple[float, float] | None = None) -> pd.DataFrame:
    """Host-wait idle during which a loop thread (:func:`loop_threads`) had no Python frame open, by what was open.

    One row per (aten_op, runtime_call, range): aten_op (innermost ATen operator open, :func:`.stacks.aten_op_mask`;
    "" when none), runtime_call (the innermost event when it is a cuda_runtime / cuda_driver call, else ""), range
    (the innermost user_annotation or record_function label written as a cpu_op, ``ProfilerStep#N`` with its number
    folded; "" when none), idle_us (the idle under the union of those moments over the loop threads: a moment counts
    once per row, but in every row some loop thread sat in, so shares of several threads can sum above 1),
    segments (host-time segments of :func:`.gaps.event_idle`), share (of the window's host-wait idle), hint
    (:data:`CAPTURE_HINT` when the trace has no Python stacks at all, else a note that those threads had none open).
    The idle during which no loop thread had any host event open is the row ("(no host event open)", "", "").
    Sorted by idle_us descending; empty when every idle moment had a Python frame or the device never idled.
    Device and window as :func:`.gaps.event_idle`.
    """
    from .gaps import event_idle, grouped_union, idle_at

    cols = ["aten_op", "runtime_call", "range", "idle_us", "segments", "share", "hint"]
    r = event_idle(trace, device, window, host_wait_only=True, exclude_parked=True)
    tree, tl = r.tree, r.timeline
    if tl.idle_us <= 0:
        return pd.DataFrame({c: [] for c in cols})
    loops = loop_threads(trace, r.rank)
    thread_ok = tree.threads["tid"].astype(str).isin(loops).to_numpy() & (tree.threads["rank"].to_numpy() == r.rank)
    act = r.seg_node >= 0
    keep = np.zeros(len(r.seg_node), dtype=bool)
    keep[act] = thread_ok[tree.thread[r.seg_node[act]]]
    # idle during which no loop thread had any host event open (a segment without an owner has no thread, so this
    # is the complement of the loop threads' owned segments)
    if keep.any():
        _, us, ue = grouped_union(np.zeros(int(keep.sum()), dtype=np.int64), r.seg_start_us[keep], r.seg_end_us[keep])
        covered = float((idle_at(tl, ue) - idle_at(tl, us)).sum())
    else:
        covered = 0.0
    nothing_open = tl.idle_us - covered
    node, s, e = r.seg_node[keep], r.seg_start_us[keep], r.seg_end_us[keep]
    py_mask = tree.cat == stacks.CAT_CODE["python_function"]
    has_py = stacks.enclosing(tree, node, py_mask, include_self=True) >= 0
    node, s, e = node[~has_py], s[~has_py], e[~has_py]
    hint = CAPTURE_HINT if not trace.has_python_stacks else (
        "these threads had no Python frame open (C++ code, or a thread torch.profiler recorded without stacks)")
    rows = []
    if len(node):
        op = stacks.enclosing(tree, node, stacks.aten_op_mask(tree), include_self=True)
        rt_codes = [stacks.CAT_CODE["cuda_runtime"], stacks.CAT_CODE["cuda_driver"]]
        is_rt = np.isin(tree.cat[node], rt_codes)
        label_mask = (tree.cat == stacks.CAT_CODE["user_annotation"]) | (
            (tree.cat == stacks.CAT_CODE["cpu_op"]) & ~stacks.aten_op_mask(tree))
        rng = stacks.enclosing(tree, node, label_mask, include_self=True)
        op_name = tree.frame_names(op).astype(str)
        rt_name = np.where(is_rt, tree.frame_names(np.where(is_rt, node, -1)), "").astype(str)
        rng_name = np.array([re.sub(r"#\d+$", "#N", x) for x in tree.frame_names(rng).astype(str)], dtype=object)
        keys, _ = pd.factorize(pd.Series(op_name) + "\x00" + pd.Series(rt_name) + "\x00" + pd.Series(rng_name))
        g, gs, ge = grouped_union(keys, s, e)
        idle = np.bincount(g, weights=idle_at(tl, ge) - idle_at(tl, gs), minlength=keys.max() + 1)
        segs = np.bincount(keys, minlength=keys.max() + 1)
        first = np.unique(keys, return_index=True)[1]
        for k, i in enumerate(first):
            rows.append({"aten_op": op_name[i], "runtime_call": rt_name[i], "range": str(rng_name[i]),
                         "idle_us": float(idle[keys[i]]), "segments": int(segs[keys[i]])})
    if nothing_open > 1e-6:
        rows.append({"aten_op": "(no host event open)", "runtime_call": "", "range": "", "idle_us": nothing_open,
                     "segments": 0})
    if not rows:
        return pd.DataFrame({c: [] for c in cols})
    out = pd.DataFrame(rows)
    out["share"] = out["idle_us"] / tl.idle_us
    out["hint"] = hint
    out = out[out["idle_us"] > 0]
    return out.sort_values(["idle_us", "aten_op", "runtime_call"], ascending=[False, True, True],
                           kind="stable").reset_index(drop=True)[cols]


def _ms(us: float) -> str:
    return f"{us / 1e6:.2f} s" if us >= 1e6 else f"{us / 1e3:.1f} ms" if us >= 1e3 else f"{us:.0f} µs"
