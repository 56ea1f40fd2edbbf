"""The findings: what explains a window's GPU idle time, as sentences with their share of that idle.

:func:`findings` turns the analyses' tables (blocking sync sites, idle sites, the launch fit, overhead idle, the
rounds' verdict) into ``[{kind, summary, idle_share, ...}]``, the list ``gaptrace analyze`` prints and the
report's headline shows. Every share is µs of idle over the window's idle µs.
"""
from __future__ import annotations

from typing import Any

import pandas as pd

from .idle_sites import GRAPH_LAUNCH_SITE, NO_PYTHON_FRAME, THREAD_WAITING

__all__ = ["findings", "loop_findings", "FINDING_MIN_SHARE", "ms_text", "IDLE_SHARE_NOTE", "WAIT_FIX"]

# How the findings' idle shares relate: each is µs of one idle total (the window's), clipped to it.
IDLE_SHARE_NOTE = ("idle shares are of one idle total (the window's) and overlap across kinds: the idle sites are "
                   "disjoint from one another, a blocking sync's idle also sits inside an idle site's frame, and "
                   "host_bound covers all host-wait idle; they do not add up")

# Findings below this share of the window's idle time are not stated (they stay in the tables).
FINDING_MIN_SHARE = 0.05


def ms_text(us: float) -> str:
    """µs as text: "12.34 ms" from 1 ms up, else "123 µs"."""
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.0f} µs"


def _fit_reliable(fit: Any) -> bool:
    """State the profiler-inflation finding only for a fit that describes the launches: κ > 0, R² over all
    launches >= 0.5, and an intercept not far below zero (t0 >= -25% of the smallest graph's median launch). Under an
    overlapped scheduler cudaGraphLaunch can also wait for queue space, which scatters the points."""
    if fit.kappa_us_per_node <= 0 or fit.r2 is None or fit.r2 < 0.5:
        return False
    smallest = float(fit.graphs["median_us"].iloc[0]) if len(fit.graphs) else 0.0
    return fit.t0_us >= -0.25 * smallest


def findings(idle_total_us: float, sync_sites: pd.DataFrame, sites: pd.DataFrame, fit: Any,
             launch_idle_us: float, overhead_idle_us: dict[str, float], rounds_report: Any = None,
             host_wait_us: float | None = None) -> list[dict]:
    """What explains the idle time, as sentences, sorted by idle_share desc: [{kind, summary, idle_share, ...}].

    Inputs: ``idle_total_us`` the analysed device's idle µs in the window; ``sync_sites`` the rows of
    :func:`.syncs.sync_sites` (shares over that idle); ``sites`` :func:`.idle_sites.idle_sites`; ``fit`` a
    :class:`.launch_fit.LaunchFit` or None; ``launch_idle_us`` the idle µs under graph-launch calls;
    ``overhead_idle_us`` :func:`.idle_sites.overhead_idle`; ``rounds_report`` a :class:`.rounds.RoundsReport` or
    None; ``host_wait_us`` the host-wait part of the idle (None when unavailable).

    - ``blocking_sync``: a call site whose blocking calls hold or are followed by idle (idle_share = (its
      idle_during_us + idle_after_us) / window idle, e.g. "72% of GPU-idle time sat under or right after
      cudaMemcpyAsync ...");
    - ``idle_site``: a host function the host sat in while the device idled (:func:`.idle_sites.idle_sites`);
    - ``profiler_inflation``: the part of graph-launch host time that grows with node count (κ·N), charged with the
      idle that sat under graph launches in proportion (the profiler's own cost, not the driver's);
    - ``profiler_overhead``: idle under the profiler's own buffer flushes and requests;
    - ``lazy_loading``: idle under CUDA lazy module loading (kernels loaded on first use, mid-run);
    - ``host_bound``: overlapped verify rounds (no blocking sync pins them) whose host time exceeds their GPU time
      even after the profiler's launch inflation is taken out (median Thost − Σ min(κ·N, launch) > median TGPU,
      :mod:`.analyses.rounds`): the GPU waits for launches, so the host-wait idle (``host_wait_us``: all idle but
      the device-side bubbles) is the host being late (an overlapped round runs at max(TGPU, Thost)), and the
      NVTX range holding most of the host's own time (:func:`.analyses.rounds.host_by_range`) is what to cut.
    Only findings with idle_share >= FINDING_MIN_SHARE are stated, except ``profiler_inflation``: it is stated whenever
    the launch fit is reliable, whatever its share, because it qualifies every graph-launch time in the trace (it is
    the instrument's own cost, listed last when its share is small).
    """
    out: list[dict] = []
    if idle_total_us <= 0:
        return out
    for r in sync_sites.itertuples(index=False):
        # idle under the blocking call itself (the host waited while the device had nothing to run: it waited on
        # something else) plus the idle right after it (the serialized tail before the next device work)
        idle_us = min(float(r.idle_during_us) + float(r.idle_after_us), idle_total_us)  # no more than the window has
        share = idle_us / idle_total_us
        if share < FINDING_MIN_SHARE:
            continue
        op = f" ({r.aten_op})" if r.aten_op else ""
        n = int(r.count)
        blocked = (f"it blocked the host {ms_text(r.mean_blocked_us)} in 1 call" if n == 1 else
                   f"it blocked the host {ms_text(r.mean_blocked_us)} on average (max {ms_text(r.max_blocked_us)}) "
                   f"over {n} calls")
        out.append({
            "kind": "blocking_sync",
            "summary": (f"{share:.0%} of GPU-idle time ({ms_text(idle_us)}: {ms_text(float(r.idle_during_us))} under "
                        f"the calls + {ms_text(float(r.idle_after_us))} right after) sat under or right after "
                        f"{r.call}{op} from {r.site or '(no Python frame)'}: {blocked} while the GPU was "
                        f"{r.device_busy_during:.0%} busy"),
            "idle_share": share, "idle_us": idle_us, "call": r.call, "site": r.site, "aten_op": r.aten_op,
        })
    for r in sites[~sites["site"].isin([NO_PYTHON_FRAME, THREAD_WAITING, GRAPH_LAUNCH_SITE])].head(5).itertuples(index=False):
        share = float(r.share)
        if share < FINDING_MIN_SHARE:
            continue
        where = f", in range {r.range}" if r.range else ""
        out.append({
            "kind": "idle_site",
            "summary": f"{share:.0%} of GPU-idle time ({ms_text(r.idle_us)}) the host was inside {r.site}{where}",
            "idle_share": share, "idle_us": float(r.idle_us), "site": r.site, "range": r.range,
        })
    if fit is not None and fit.kappa_us_per_node is not None and fit.inflation_share and _fit_reliable(fit):
        share = min(launch_idle_us * min(fit.inflation_share, 1.0) / idle_total_us, 1.0)
        mean_n = float(fit.points["nodes"].mean())
        out.append({
            "kind": "profiler_inflation",
            "summary": (f"graph-launch host time fits t(N) = {fit.t0_us:.1f} µs + {fit.kappa_us_per_node:.2f} µs/node × N "
                        f"(R² {fit.r2:.2f}, {fit.launches} launches): about {fit.kappa_us_per_node * mean_n:.0f} µs "
                        f"of an average launch ({fit.inflation_share:.0%} of all launch host time) is the profiler "
                        "instrumenting graph nodes, not the driver"),
            "idle_share": share, "kappa_us_per_node": fit.kappa_us_per_node,
        })
    summary = getattr(rounds_report, "summary", None) or {}
    if (summary.get("verdict") == "overlapped" and summary.get("bound_less_inflation") == "host"
            and host_wait_us is not None and host_wait_us > 0):
        share = min(host_wait_us / idle_total_us, 1.0)
        if share >= FINDING_MIN_SHARE:
            top = rounds_report.host_ranges.head(1)
            rng = str(top["range"].iloc[0]) if len(top) else None
            where = (f"; the range with the most host time is {rng}: {ms_text(float(top['host_us_per_round'].iloc[0]))} "
                     f"a round ({float(top['share'].iloc[0]):.0%} of the host's own time inside the round's ranges)") if rng else ""
            out.append({
                "kind": "host_bound",
                "summary": (f"{share:.0%} of GPU-idle time ({ms_text(host_wait_us)}) is the GPU waiting for a late host: "
                            f"the rounds are host-bound, Thost {ms_text(summary['t_host_less_inflation_us'])} a round "
                            f"without the profiler's launch inflation ({ms_text(summary['t_host_us'])} with it) against "
                            f"TGPU {ms_text(summary['t_gpu_us'])}{where}"),
                "idle_share": share, "range": rng,
            })
    texts = {"profiler": ("profiler_overhead", "sat under the profiler's own buffer flushes and requests"),
             "lazy_loading": ("lazy_loading", "sat under CUDA lazy module loading (kernels loaded on first use: "
                                              "warm up every kernel, or CUDA_MODULE_LOADING=EAGER)")}
    for g, us in overhead_idle_us.items():
        share = us / idle_total_us
        if share >= FINDING_MIN_SHARE:
            kind, text = texts[g]
            out.append({"kind": kind, "summary": f"{share:.0%} of GPU-idle time ({ms_text(us)}) {text}",
                        "idle_share": share})
    # by share (to 0.1%); on a tie the more specific diagnosis first: a blocking call names both call and site
    priority = {"blocking_sync": 0, "idle_site": 1}
    out.sort(key=lambda f: (-round(f["idle_share"], 3), priority.get(f["kind"], 2)))
    return out


# The fix a thread-wait finding's saving assumes (the wait removed: the other thread's result is ready when asked).
WAIT_FIX = ("have the thread it waits on run ahead (fill a bounded queue before the loop asks, prefetch), so the "
            "loop thread finds its input ready instead of waiting every step")


def loop_findings(idle_total_us: float, waits: Any = None, outliers: Any = None, verdict_table: Any = None,
                  no_stack_rows: Any = None, no_stack_idle_us: float = 0.0, launch_idle: Any = None,
                  fit_reliable: bool = False) -> list[dict]:
    """The findings of any loop (steps found by :mod:`.steps`), beside :func:`findings`' (same row shape; shares
    over ``idle_total_us``, the window's idle µs):

    - ``thread_wait``: a loop thread waited on another thread (:func:`.thread_waits.thread_waits`' ``findings``
      rows, ``waits``) while the device idled: stated at FINDING_MIN_SHARE of the idle or more, the three with the
      most idle; idle_share = its gpu_idle_us / window idle; ``site`` the wait frame (what removing the wait
      removes), ``caller`` the frame that waited;
    - ``outlier_step``: every outlier step (:class:`.steps.OutlierStep` in ``outliers``), whatever its share:
      idle_share = the step's host-wait idle (``verdict_table``: :attr:`.verdicts.Verdicts.table`) / window idle;
    - ``no_python_frame``: idle with no Python frame open on a loop thread (``no_stack_idle_us``, the idle site
      "(no Python frame)"), at FINDING_MIN_SHARE or more: names the ATen ops and runtime calls open then
      (``no_stack_rows``: :func:`.thread_waits.idle_without_stacks`) and how to capture with stacks;
    - ``graph_launch``: the host-wait idle under graph launch calls (``launch_idle``:
      :class:`.launch_idle.GraphLaunchIdle`), charged to the launch and split into κ·N, t0 and the rest (DESIGN.md
      "Launch fit"), when it is FINDING_MIN_SHARE of the idle or more and the fit is not reliable enough for
      ``profiler_inflation`` (``fit_reliable``), which then carries the split itself.
    """
    out: list[dict] = []
    if idle_total_us <= 0:
        return out
    if waits is not None and len(waits):
        for r in waits.head(3).itertuples(index=False):
            idle = float(r.gpu_idle_us) if r.gpu_idle_us == r.gpu_idle_us else 0.0
            share = min(idle / idle_total_us, 1.0)
            if share < FINDING_MIN_SHARE:
                continue
            out.append({"kind": "thread_wait",
                        "summary": f"{share:.0%} of GPU-idle time ({ms_text(idle)}) passed while {r.summary}",
                        "idle_share": share, "idle_us": idle, "site": r.frame, "caller": r.caller,
                        "wait_kind": r.kind, "others": r.others})
    for o in outliers or []:
        idle = 0.0
        if verdict_table is not None and len(verdict_table):
            m = verdict_table["step"].to_numpy() == o.step
            if m.any():
                idle = float(verdict_table["host_wait_idle_us"].to_numpy()[m][0])
        share = min(idle / idle_total_us, 1.0)
        out.append({"kind": "outlier_step",
                    "summary": (f"{o.summary}; {ms_text(idle)} of GPU-idle time in it ({share:.0%} of the idle); the "
                                "per-step figures are given with and without it"),
                    "idle_share": share, "idle_us": idle, "step": o.step, "step_us": o.dur_us,
                    "compile_frame": o.compile_frame, "site": o.site})
    share = no_stack_idle_us / idle_total_us
    if share >= FINDING_MIN_SHARE and no_stack_rows is not None and len(no_stack_rows):
        top = []
        for r in no_stack_rows.head(3).itertuples(index=False):
            what = " / ".join(x for x in (r.aten_op, r.runtime_call) if x) or "no ATen op or runtime call"
            top.append(f"{what}{' in ' + r.range if r.range else ''} {ms_text(float(r.idle_us))}")
        out.append({"kind": "no_python_frame",
                    "summary": (f"{share:.0%} of GPU-idle time ({ms_text(no_stack_idle_us)}) the host had no Python "
                                f"frame open: open then were {'; '.join(top)}; {no_stack_rows['hint'].iloc[0]}"),
                    "idle_share": share, "idle_us": no_stack_idle_us})
    if launch_idle is not None and not fit_reliable:
        t = launch_idle.totals
        share = t["idle_us"] / idle_total_us
        if share >= FINDING_MIN_SHARE:
            out.append({"kind": "graph_launch",
                        "summary": f"{share:.0%} of GPU-idle time ({ms_text(t['idle_us'])}) " + launch_split_text(t),
                        "idle_share": share, "idle_us": t["idle_us"], "kappa_idle_us": t["kappa_idle_us"],
                        "t0_idle_us": t["t0_idle_us"], "residual_idle_us": t["residual_idle_us"]})
    return out


def launch_split_text(t: dict) -> str:
    """"sat under 120 graph launch calls, ...: κ·N 0.80 ms (the profiler instrumenting graph nodes), t0 ...",
    for :attr:`.launch_idle.GraphLaunchIdle.totals` ``t``; a negative t0 said to be an intercept, not a cost."""
    t0 = t.get("t0_us")
    t0_note = (f" (t0 = {t0:.1f} µs < 0 is the fit's intercept, extrapolated below the smallest graph: no cost of "
               "its own, counted as 0)" if t0 is not None and t0 < 0 else "")
    n = int(t["launches"])
    head = (f"sat under {n} graph launch call{'s' if n != 1 else ''}, charged to the "
            "launch, not the Python frame that called it")
    if t.get("kappa_us_per_node") is None:
        return (head + ": no launch fit (graphs of one size, or too few launches), so κ·N and t0 cannot be told "
                "apart; the sidecar's unprofiled launch times, or graphs of several sizes, measure the profiler's part")
    return (head + f": κ·N {ms_text(t['kappa_idle_us'])} (the profiler "
            f"instrumenting graph nodes), t0 {ms_text(t['t0_idle_us'])}{t0_note} (the launch's own cost), "
            f"{ms_text(t['residual_idle_us'])} beyond the fit (a full launch queue, a driver lock)")
