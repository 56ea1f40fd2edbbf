"""Where the host was while the device idled: idle charged to the innermost host frame with a source file
(:func:`idle_sites`), and idle under the profiler's and CUDA's own overhead events (:func:`overhead_idle`).

Both are sums of µs of the analysed device's idle (:class:`gaptrace.analyses.timeline.BusyTimeline`) clipped to
host intervals, so each figure can be reproduced by hand from the trace.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from gaptrace.trace import Trace

from . import stacks
from .gaps import grouped_union
from .timeline import merge_intervals

__all__ = ["idle_sites", "overhead_idle", "NO_PYTHON_FRAME", "THREAD_WAITING", "GRAPH_LAUNCH_SITE"]

# the sites that are no host function: no Python frame above the event, a parked thread, and the graph launch calls
# (the idle under a cudaGraphLaunch is the launch's, moved there from its caller by analyses/summary.py)
NO_PYTHON_FRAME = "(no Python frame)"
THREAD_WAITING = "(thread waiting)"
GRAPH_LAUNCH_SITE = "(graph launch calls)"


def idle_sites(result: Any, idle_total_us: float | None = None) -> pd.DataFrame:
    """Idle charged to the innermost host frame with a source file, per such frame (normalised name).

    ``result`` is a :class:`gaptrace.analyses.gaps.EventIdle`. At every moment of device idle, each host thread's
    innermost open event is charged to itself if it is a Python frame with a source file, else to its nearest
    enclosing one (an ATen op, a CUDA runtime call or a ``<built-in method …>`` frame names what was called, not
    where it was called from). Per site the charged moments are merged over threads (a union, as in
    :func:`gaptrace.analyses.gaps.gap_attribution`), so ``idle_us`` never exceeds the window's idle.
    Moments whose innermost event has no such frame above it go to "(no Python frame)"; moments whose innermost
    event or site is a parked-thread frame (``WAIT_FRAME_RE``: ``threading.py: wait``, a lock ``acquire``,
    ``time.sleep``, ``select``) go to "(thread waiting)".
    Columns: site, range (the innermost NVTX / record_function range the host was in there, the one holding most
    of that idle; "" if none), idle_us, share (idle_us / ``idle_total_us``, default the result's window idle).
    """
    tree, tl = result.tree, result.timeline
    empty = pd.DataFrame({"site": [], "range": [], "idle_us": [], "share": []})
    act = np.flatnonzero(result.seg_node >= 0)
    if tree.n == 0 or tl.idle_us <= 0 or len(act) == 0:
        return empty
    s, e, node = result.seg_start_us[act], result.seg_end_us[act], result.seg_node[act]
    keep = tl.idle_between(s, e) > 0
    s, e, node = s[keep], e[keep], node[keep]
    n_frames = len(tree.frames)
    site = site_codes(tree, node)
    g, us, ue = grouped_union(site, s, e)
    idle = np.bincount(g, weights=tl.idle_between(us, ue), minlength=n_frames + 2)
    nz = np.flatnonzero(idle > 0)
    names = np.r_[tree.frames.to_numpy(dtype=object), np.array([NO_PYTHON_FRAME, THREAD_WAITING], dtype=object)]
    # the NVTX / record_function range the host was in while at that site (innermost user_annotation; the one
    # holding most of the site's idle): how users label their phases, e.g. "verify" or "jit_new_shape"
    ann = stacks.enclosing(tree, node, tree.cat == stacks.CAT_CODE["user_annotation"], include_self=True)
    seg_idle = tl.idle_between(s, e)
    has = ann >= 0
    rng = np.full(n_frames + 2, "", dtype=object)
    if has.any():
        pair = pd.DataFrame({"site": site[has], "range": tree.frame[ann[has]], "idle": seg_idle[has]})
        best = pair.groupby(["site", "range"], sort=False)["idle"].sum().reset_index()
        best = best.loc[best.groupby("site", sort=False)["idle"].idxmax()]
        rng[best["site"].to_numpy()] = tree.frames.to_numpy(dtype=object)[best["range"].to_numpy()]
    denom = idle_total_us if idle_total_us else tl.idle_us
    out = pd.DataFrame({"site": names[nz], "range": rng[nz], "idle_us": idle[nz], "share": idle[nz] / denom})
    return out.sort_values(["idle_us", "site"], ascending=[False, True], kind="stable").reset_index(drop=True)



def overhead_idle(trace: Trace, timeline: Any, rank: int) -> dict[str, float]:
    """Idle µs under the trace's ``overhead`` events, per group: "profiler" (Buffer Flush, Activity Buffer
    Request: CUPTI's own buffers) and "lazy_loading" (Runtime Triggered Module Loading, Lazy Function Loading:
    CUDA's lazy module loading, CUDA_MODULE_LOADING=LAZY, which happens without the profiler too).
    Each group's intervals are merged first, so overlapping events count once."""
    ov = trace.overhead[trace.overhead["rank"].to_numpy() == rank]
    names = ov["name"].astype(str)
    groups = {"lazy_loading": names.str.contains("Loading", case=False).to_numpy()}
    groups["profiler"] = ~groups["lazy_loading"]
    out = {}
    for g, m in groups.items():
        s, e = merge_intervals(ov["ts_us"].to_numpy()[m], ov["end_us"].to_numpy()[m])
        out[g] = float(timeline.idle_between(s, e).sum()) if len(s) else 0.0
    return out


def site_codes(tree, node: np.ndarray) -> np.ndarray:
    """The idle site of each innermost open host node (:class:`gaptrace.analyses.stacks.HostTree` nodes, shape (q,)):
    the frame code of its innermost enclosing Python frame with a source file (:func:`stacks.innermost_site`),
    ``len(tree.frames)`` where there is none ("(no Python frame)"), ``len(tree.frames) + 1`` where the node or its
    site is a parked-thread frame ("(thread waiting)", ``stacks.WAIT_FRAME_RE``). Shape (q,), int64."""

    site_rows = stacks.innermost_site(tree, tree.rows(node))
    n_frames = len(tree.frames)
    site = np.where(site_rows >= 0, tree.frame[tree.nodes(np.maximum(site_rows, 0))], n_frames)
    waiting_frame = stacks.waiting_frames(tree)
    waiting = waiting_frame[tree.frame[node]] | ((site < n_frames) & waiting_frame[np.minimum(site, n_frames - 1)])
    return np.where(waiting, n_frames + 1, site)
