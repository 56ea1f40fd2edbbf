"""Idle during a profiler-inflated cudaGraphLaunch, charged to the launch instead of the Python frame that called it.

Under the profiler a graph launch's host time is t(N) = t0 + κN (DESIGN.md "Launch fit"): κN is CUPTI instrumenting
every node, t0 the driver's own cost. While the call runs, the device may idle for want of the graph's first
kernels (host-wait idle: :func:`gaptrace.analyses.occupancy.fill_device_side` leaves bubbles between already-queued
kernels out). Gap attribution charges that idle to every frame open around the call, i.e. to the Python frame that
called ``graph.replay()``; this module charges it to the launch, split:

- ``kappa_idle_us`` = min(idle, κN capped at the call's host time): the part the profiler added (the same
  "exposed inflation" rule as :mod:`.rounds`: a launch shorter by κN would have started the graph up to that much
  sooner; the inflation is charged first because without the profiler it would not exist at all);
- ``t0_idle_us`` = min(idle − kappa_idle_us, max(t0, 0) capped at what is left of the call): the launch's own cost;
- ``residual_idle_us`` = the rest: the call took longer than its fit (a full launch queue, a driver lock).

The three sum to the idle under the call; summed over launches they equal the host-wait idle that gap attribution
finds under the graph-launch frames (``analyze``'s ``launch_idle``: Σ inclusive idle of the launch rows).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pandas as pd

from gaptrace.trace import Trace

from . import stacks
from .launch_fit import launch_inflation_us, launch_points
from .occupancy import busy_timeline, resolve_device

__all__ = ["GraphLaunchIdle", "graph_launch_idle"]

LAUNCH_IDLE_COLUMNS = ["host_row", "tid", "ts_us", "dur_us", "nodes", "idle_us", "kappa_us", "t0_part_us",
                       "kappa_idle_us", "t0_idle_us", "residual_idle_us", "caller", "site"]


@dataclasses.dataclass
class GraphLaunchIdle:
    """Result of :func:`graph_launch_idle`. Times in µs.

    ``launches``: one row per graph launch of the device's rank overlapping the window: host_row (positional row of
    ``trace.host``), tid, ts_us, dur_us, nodes (N), idle_us (host-wait idle under the call), kappa_us (κN capped at
    dur_us), t0_part_us (max(t0, 0) capped at dur_us − kappa_us), kappa_idle_us, t0_idle_us, residual_idle_us (module
    docstring), caller (the innermost Python frame around the call, e.g. ``torch/cuda/graphs.py(137): replay``; ""
    without Python stacks), site (the innermost user frame, :func:`.stacks.innermost_site`).
    ``by_caller``: per (caller, site): launches, idle_us, kappa_idle_us, t0_idle_us, residual_idle_us, sorted by
    idle_us: what to take off each frame's idle and charge to the launch instead.
    ``totals``: launches, idle_us, kappa_idle_us, t0_idle_us, residual_idle_us, kappa_us_per_node, t0_us.
    """

    launches: pd.DataFrame
    by_caller: pd.DataFrame
    totals: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        from .steps import to_jsonable

        return to_jsonable({"totals": self.totals, "by_caller": self.by_caller.to_dict("records")})


def graph_launch_idle(trace: Trace, kappa_us_per_node: float | None, t0_us: float | None,
                      device: int | tuple[int, int] | None = None, window: str | tuple[float, float] | None = None,
                      launches: pd.DataFrame | None = None) -> GraphLaunchIdle:
    """Charge the host-wait idle under every graph launch of ``device``'s rank to the launch, split into κ·N, t0 and
    residual parts (module docstring).

    ``kappa_us_per_node``, ``t0_us``: the fit of :func:`.launch_fit.launch_fit` (``LaunchFit.kappa_us_per_node`` and
    ``t0_us``; None: no fit, then every idle µs is residual); ``window`` as :func:`.occupancy.busy_timeline`;
    ``launches``: :func:`.launch_fit.launch_points` already computed (the fit's ``points``).
    Raises TraceError when the trace has no device activity.
    """
    key = resolve_device(trace, device)
    tl = busy_timeline(trace, key, window, host_wait_only=True)
    pts = launches if launches is not None else launch_points(trace)[0]
    pts = pts[(pts["rank"].to_numpy() == key[0]) & (pts["ts_us"].to_numpy() < tl.t1_us)
              & (pts["ts_us"].to_numpy() + pts["dur_us"].to_numpy() > tl.t0_us)].reset_index(drop=True)
    ts = pts["ts_us"].to_numpy(np.float64)
    dur = pts["dur_us"].to_numpy(np.float64)
    nodes = pts["nodes"].to_numpy(np.float64)
    idle = tl.idle_between(ts, ts + dur) if len(pts) else np.empty(0)
    kappa = launch_inflation_us(nodes, dur, kappa_us_per_node)
    t0p = np.clip(np.minimum(max(float(t0_us), 0.0) if t0_us is not None and np.isfinite(t0_us) else 0.0,
                             dur - kappa), 0.0, None)
    k_idle = np.minimum(idle, kappa)
    t_idle = np.minimum(idle - k_idle, t0p)
    rest = idle - k_idle - t_idle
    rows = pts["host_row"].to_numpy(np.int64)
    tree = stacks.host_tree(trace)
    py = enclosing_python(tree, rows)
    site = stacks.innermost_site(tree, rows) if len(rows) else rows
    out = pd.DataFrame({"host_row": rows, "tid": pts["tid"].astype(str).to_numpy(), "ts_us": ts, "dur_us": dur,
                        "nodes": pts["nodes"].to_numpy(np.int64), "idle_us": idle, "kappa_us": kappa,
                        "t0_part_us": t0p, "kappa_idle_us": k_idle, "t0_idle_us": t_idle, "residual_idle_us": rest,
                        "caller": tree.frame_names(tree.nodes(py)) if len(rows) else np.empty(0, object),
                        "site": tree.frame_names(tree.nodes(site)) if len(rows) else np.empty(0, object)})
    parts = ["idle_us", "kappa_idle_us", "t0_idle_us", "residual_idle_us"]
    if len(out):
        by = out.groupby(["caller", "site"], sort=False).agg(launches=("host_row", "size"),
                                                             **{p: (p, "sum") for p in parts}).reset_index()
        by = by.sort_values(["idle_us", "caller"], ascending=[False, True], kind="stable").reset_index(drop=True)
    else:
        by = pd.DataFrame({c: [] for c in ["caller", "site", "launches", *parts]})
    totals = {"launches": len(out), **{p: float(out[p].sum()) for p in parts},
              "kappa_us_per_node": kappa_us_per_node, "t0_us": t0_us}
    return GraphLaunchIdle(launches=out[LAUNCH_IDLE_COLUMNS], by_caller=by, totals=totals)


def enclosing_python(tree: stacks.HostTree, rows: np.ndarray) -> np.ndarray:
    """Host row of the innermost python_function frame enclosing each host row (any frame, built-ins and torch's
    own included: the frame gap attribution charges first), -1 where none."""
    mask = tree.cat == stacks.CAT_CODE["python_function"]
    return tree.rows(stacks.enclosing(tree, tree.nodes(rows), mask))
