"""The analysis of one trace: all core analyses over one window, the findings in words, as one summary.

:func:`summarize` returns an :class:`AnalysisSummary`; its :meth:`AnalysisSummary.to_json` is the JSON-able dict
that ``gaptrace analyze --json`` prints, ``gaptrace report`` renders and ``gaptrace diff`` compares
(:func:`run_analysis` returns that dict directly). Its keys:

- ``devices``: [{rank, device, name, window, window_start_us, window_end_us, window_us, busy_us, idle_us,
  occupancy (0..1), gaps}] (DESIGN.md "Busy / occupancy");
- ``gap_attribution``: [{frame, cat, self_idle_us, inclusive_idle_us, share, gaps, events}], sorted by
  inclusive_idle_us desc, for the analysed device (the busiest unless ``device`` is given);
- ``idle_sites``: [{site, idle_us, share}]: the device's idle time charged to the innermost host frame with a
  source file open at each moment (self idle of that frame plus of the ATen ops, runtime calls and built-ins
  it called), the answer to "which of my functions was the host in while the GPU idled";
- ``blocking_syncs``: [{call, site, aten_op, stack, count, blocked_us, idle_after_us, idle_share,
  device_busy_during, max_blocked_us, mean_blocked_us, ...}] sorted by blocked_us desc (DESIGN.md "Blocking syncs");
- ``launch_fit``: {launches, kappa_us_per_node, t0_us, r2, graphs: [{nodes, launches, median_us, ...}], ...} or None;
- ``rounds``: {summary: {rounds, t_round_us, t_gpu_us, t_host_us, t_serial_us, tau, tpot_us, verdict, bound, ...},
  rounds: [{round, start_us, t_round_us, t_gpu_us, t_host_us, t_serial_us, blocked_us, launch_nodes, tau,
  tpot_us}]} when the trace annotates verify rounds, else None (:mod:`gaptrace.analyses.rounds`);
- ``idle_split``: {idle_us, host_wait_us, device_side_us, device_side_share, graph_node_us, graph_node_gaps,
  graph_node_median_us, gpu_events, unlinked_gpu_events, unlinked_by_cause: {no_id, shared_id, no_launch}}: idle
  before kernels that were already launched is device-side (:func:`gaptrace.analyses.occupancy.device_side_gaps`)
  and is charged to no host frame, the part of it between two nodes of one graph launch is ``graph_node_*``
  (:func:`gaptrace.analyses.occupancy.graph_node_gaps`); gap attribution, idle sites and sync idle explain the
  host-wait part, every share is over all idle. Both rest on joining each GPU event to its launch call by
  correlation id (:func:`gaptrace.analyses.occupancy.launch_links`); when none of the window's ``gpu_events``
  joins, host_wait_us, device_side_* and graph_node_* are None (unavailable), and when many do not, a warning
  says so (:func:`unlinked_warning`);
- ``node_bubbles``: [{before, after, gaps, idle_us, median_us, max_us, share}]: the ``graph_node_*`` bubbles
  grouped by the kernel pair at the node boundary, sorted by idle_us desc, every pair (share over all
  node-bubble idle; :func:`gaptrace.analyses.occupancy.node_bubbles`): which boundaries a fusion of two kernels
  into one node, or programmatic dependent launch of the second, would close;
- ``findings``: [{kind, summary, idle_share, cause, saving_us, one_off_saving_us, saving_share, ...}]: what
  explains the idle time, sorted by saving_us desc (the predicted unprofiled µs per round that removing the cause
  saves, :mod:`gaptrace.analyses.savings`; None after, in idle_share order);
- ``idle_share_note``: str, how the findings' idle shares relate (one idle total; which of them overlap);
- ``whatif``: {profiled_round_us, predicted_unprofiled_round_us, replayed_round_us, measured_unprofiled_round_us,
  rounds, calibration} (:func:`gaptrace.analyses.savings.whatif_block`; the round fields None without rounds);
- ``headline``: [str], the first screen, in order: the verdict over the loop's steps with the figure behind it
  and the step used (``verdict over 6 steps of 'ProfilerStep#N' (...): 6 of 6 steps sync-bound: ...``; "TPOT is
  per step, not per token" when a step holds a whole ``generate()``; the step time with and without outlier steps),
  "the GPU was saturated: nothing to fix on the host" when the analysed device is busy SATURATED_SHARE of the
  window or more, what the cause that buys most saves (:func:`gaptrace.analyses.savings.saving_headline`) and
  ``fix: ...`` (else the first finding), then the occupancy sentence per device and the device-side share with
  the graph-node bubbles;
- ``warnings``: [str], the loader's integrity warnings and the analyses' own;
- ``verdict``: {rule, step_name, reason, holds_request, overall, steps, outliers}: the step rule used
  (:func:`gaptrace.analyses.steps.find_steps`), the verdict overall and per step with its figure
  (:func:`gaptrace.analyses.verdicts.step_verdicts`: ``overall`` as :attr:`.verdicts.Verdicts.overall`, ``steps``
  the per-step table's rows), and the outlier steps' sentences;
- ``steps``: :meth:`gaptrace.analyses.steps.Steps.to_dict` (rule, name, reason, holds_request, request_evidence,
  summary with the step time with and without outliers, outliers, steps);
- ``thread_waits``: the rows of :attr:`gaptrace.analyses.thread_waits.ThreadWaits.findings` (a loop thread's waits
  on another thread, with the device's host-wait idle during them, counted in the analysed window);
- ``graph_launch_idle``: :meth:`gaptrace.analyses.launch_idle.GraphLaunchIdle.to_dict` (the idle under graph
  launch calls, split into κ·N, t0 and the rest; moved in ``idle_sites`` from the caller's site to the row
  "(graph launch calls)"), or None without graph launches;
- ``idle_without_stacks``: :func:`gaptrace.analyses.thread_waits.idle_without_stacks`'s rows when the idle site
  "(no Python frame)" holds FINDING_MIN_SHARE of the idle or more, else [].

``rounds.summary.without_outliers`` (when the rounds have outlier rounds): the mean figures without them; the
summary's own means keep them. ``whatif.step_rule`` / ``step_name``: the steps the replay ran over.
Findings' kinds beyond :func:`gaptrace.analyses.findings.findings`': ``thread_wait``, ``outlier_step``,
``no_python_frame``, ``graph_launch`` (:func:`gaptrace.analyses.findings.loop_findings`), ``host_range`` (an NVTX
range of a loop without the runtime's rounds: :func:`_range_findings`) and ``allocator_churn`` (device memory from
and back to the driver in most steps: :func:`gaptrace.analyses.allocator.allocator_churn`).

Every figure is a sum or ratio of µs read off the trace (see each analysis module for its formula), so it can be
reproduced by hand from the trace.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np
import pandas as pd

from gaptrace.bounds import MAX_LIST_ROWS
from gaptrace.sidecar import Sidecar, as_sidecar
from gaptrace.text import to_jsonable
from gaptrace.trace import GRAPH_LAUNCH_NAMES, Trace, clean_text

from . import (allocator, findings, gaps, idle_sites, launch_fit, launch_idle, occupancy, rounds, savings, steps, syncs,
               thread_waits, verdicts)
from .findings import ms_text
from .launch_fit import LaunchFit
from .rounds import RoundsReport

__all__ = ["AnalysisSummary", "summarize", "run_analysis", "unlinked_warning", "no_gpu_message", "NO_GPU",
           "FRAME_MIN_SHARE", "MAX_FRAMES"]

# Rows of gap_attribution kept in the JSON: frames holding at least this share of idle, at most MAX_FRAMES.
FRAME_MIN_SHARE = 0.001
MAX_FRAMES = 500
# Warn when at least this share of the window's GPU events carry a broken correlation id (absent, negative, or
# shared by several launch calls: no shipped trace has one). An id whose launch call is missing is no sign of a
# broken trace (a launch made before the capture began: up to 30% of the GPU events of the shipped third-party
# traces), so those are counted in idle_split but warned about only when no event links at all.
BROKEN_ID_WARN_SHARE = 0.01


@dataclasses.dataclass
class AnalysisSummary:
    """The analysis of one trace over one window (:func:`summarize`). Times in µs, shares in 0..1.

    The list fields hold JSON-able rows, each as the module docstring describes under its key; ``launch_fit`` and
    ``rounds`` are the analyses' own objects (:class:`.launch_fit.LaunchFit`, :class:`.rounds.RoundsReport`), None
    when the trace has no graph launch with device work / no verify rounds. ``trace`` is the trace's path,
    ``window`` the analysed annotation (None: first to last device activity) and ``window_source`` where it came
    from ("argument", "sidecar" or None). :meth:`to_json` gives the ``--json`` dict.
    """

    trace: str
    window: str | None
    window_source: str | None
    devices: list[dict]
    gap_attribution: list[dict]
    idle_sites: list[dict]
    blocking_syncs: list[dict]
    launch_fit: LaunchFit | None
    findings: list[dict]
    idle_share_note: str | None
    whatif: dict | None
    rounds: RoundsReport | None
    idle_split: dict | None
    node_bubbles: list[dict]
    headline: list[str]
    warnings: list[str]
    verdict: dict | None = None
    steps: dict | None = None
    thread_waits: list[dict] = dataclasses.field(default_factory=list)
    graph_launch_idle: dict | None = None
    idle_without_stacks: list[dict] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The JSON-able dict of ``gaptrace analyze --json`` (the module docstring's keys, in that order); the
        lists are this summary's own (not copies)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["launch_fit"] = self.launch_fit.to_dict() if self.launch_fit is not None else None
        out["rounds"] = self.rounds.to_dict() if self.rounds is not None else None
        return out


def _top_pair(pairs: list[dict]) -> str:
    """The headline's clause on the kernel pair holding the most node-bubble idle (``node_bubbles``' first row)."""
    if not pairs:
        return ""
    p = pairs[0]
    before, after = occupancy.short_kernel_name(p["before"]), occupancy.short_kernel_name(p["after"])
    return (f"; the costliest boundary is {before} -> {after} "
            f"({p['gaps']} gaps, median {p['median_us']:.2f} µs, {p['share']:.0%} of the node-bubble idle)")


def _records(df: pd.DataFrame) -> list[dict]:
    """The rows of ``df`` as JSON-able dicts."""
    return [to_jsonable(r) for r in df.to_dict("records")]


def unlinked_warning(links: dict[str, int]) -> str | None:
    """The warning for GPU activities that cannot be tied to their launch call (``links`` as returned by
    :func:`gaptrace.analyses.occupancy.launch_links`): when none links, or when at least BROKEN_ID_WARN_SHARE of
    them carry a broken id (absent, negative or shared); else None. One line naming the counts, their causes and
    what it does to the idle split: unavailable when none links, else partial (a lower bound)."""
    n, u = links["gpu_events"], links["unlinked"]
    if n == 0 or (links["linked"] and links["no_id"] + links["shared_id"] < BROKEN_ID_WARN_SHARE * n):
        return None
    causes = ", ".join(f"{links[k]:,} {text}" for k, text in (
        ("no_id", "with no correlation id or a negative one"),
        ("shared_id", "whose correlation id several launch calls share"),
        ("no_launch", "whose launch call is not in the trace")) if links[k])
    if not links["linked"]:
        effect = ("the device-side idle split is unavailable (idle_split host_wait_us, device_side_us and graph_node_* "
                  "are null; gap attribution treats all idle as host wait)")
    else:
        effect = ("the device-side idle split is partial: a lower bound, the gaps before those events count as "
                  "host wait")
    return (f"{u:,} of {n:,} GPU events (kernel/memcpy/memset) in the window cannot be tied to the runtime call that "
            f"launched them ({causes}): {effect}")


def summarize(trace: Trace, window: str | None = None, device: int | None = None,
              sidecar: Sidecar | Mapping[str, Any] | None = None, round_name: str = "round",
              calibration: Any = None) -> AnalysisSummary:
    """All four core analyses of ``trace`` over ``window`` as one :class:`AnalysisSummary` (module docstring).

    ``window``: None (each device's first to last activity, or the capture sidecar's ``analysis_window``
    annotation when the trace has it: the profiled rounds, without the profiler's own start and stop) or an
    annotation name (its span; TraceError when no annotation has that name). ``device``: the device gap
    attribution and findings are computed for (default: the busiest). ``sidecar``: a capture sidecar, a
    :class:`gaptrace.sidecar.Sidecar` or its parsed dict (unprofiled graph-launch costs feed the launch fit; τ per
    round and unprofiled round times feed the rounds table). ``round_name``: the annotation that marks one verify round.
    ``calibration``: the profiler's per-event costs for the replay model (a
    :class:`gaptrace.analyses.profiler_cost.Calibration`, a ``gaptrace calibrate`` file path, or None: the shipped
    default); ValueError (one line) for a file that cannot be used.
    A trace with host events but no device activity yields devices [] and the host-side analyses only.
    """
    # names from argv may hold lone surrogates (bytes that are not UTF-8); the trace's own names are cleaned the
    # same way (build_trace), so they still match, and the result stays printable
    window = clean_text(window) if isinstance(window, str) else window
    calibration = savings.resolve_calibration(calibration)
    round_name = clean_text(round_name)
    warnings = list(trace.warnings)
    window_source = "argument" if window else None
    sidecar = as_sidecar(sidecar)
    if window is None and sidecar is not None and sidecar.analysis_window is not None:
        named = sidecar.analysis_window
        ua = trace.host.loc[trace.host["cat"] == "user_annotation", "name"]
        if (ua == named).any():  # the capture's decode window (its profiled rounds)
            window, window_source = named, "sidecar"
    out: dict[str, Any] = {"trace": clean_text(trace.path), "window": window, "window_source": window_source,
                           "devices": [], "gap_attribution": [], "idle_sites": [], "blocking_syncs": [], "launch_fit": None, "findings": [],
                           "idle_share_note": None, "whatif": None,
                           "rounds": None, "idle_split": None, "node_bubbles": [], "headline": [],
                           "warnings": warnings, "verdict": None, "steps": None, "thread_waits": [],
                           "graph_launch_idle": None, "idle_without_stacks": []}
    has_device = not trace.device.empty
    fit = launch_fit.launch_fit(trace, sidecar.unprofiled_launch_us() if sidecar is not None else None)
    out["launch_fit"] = fit
    if not has_device:
        report = syncs.blocking_syncs(trace)
        out["blocking_syncs"] = report.to_list()
        out["headline"] = ["no GPU activity in the trace: occupancy and idle-gap attribution are absent"]
        return AnalysisSummary(**out)

    occ = occupancy.occupancy(trace, window, sidecar=None)  # the window is settled above
    out["devices"] = _records(occ)
    key = occupancy.resolve_device(trace, device)
    exact = occupancy.busy_timeline(trace, key, window)
    # attribute host-wait idle only: device-side gaps (kernels already queued) are nobody's host code
    ev = gaps.event_idle(trace, key, window, host_wait_only=True, exclude_parked=True)
    tl = ev.timeline
    idle_total = exact.idle_us
    device_side_us = idle_total - tl.idle_us
    # the device-side gaps between two nodes of one graph launch (a node gap under a launch call still running, a
    # profiler-inflated cudaGraphLaunch, is host-wait idle like every gap under a launch call)
    node = occupancy.graph_node_gaps(trace, key, exact) & occupancy.device_side_gaps(trace, key, exact)
    g0, g1 = exact.gap_bounds()
    node_dur = (g1 - g0)[node]
    links = occupancy.launch_links(trace, key, exact.t0_us, exact.t1_us)
    out["idle_split"] = {"idle_us": idle_total, "host_wait_us": tl.idle_us, "device_side_us": device_side_us,
                         "device_side_share": device_side_us / idle_total if idle_total > 0 else 0.0,
                         "graph_node_us": float(node_dur.sum()), "graph_node_gaps": int(node.sum()),
                         "graph_node_median_us": float(np.median(node_dur)) if len(node_dur) else None,
                         "gpu_events": links["gpu_events"], "unlinked_gpu_events": links["unlinked"],
                         "unlinked_by_cause": {k: links[k] for k in ("no_id", "shared_id", "no_launch")}}
    if node.any():
        out["node_bubbles"] = _records(occupancy.node_bubbles(trace, key, window))  # every pair: diff matches them
    if links["gpu_events"] and not links["linked"]:
        # no activity joins its launch call: 0 µs device-side would be a claim nobody measured
        out["idle_split"].update(dict.fromkeys(("host_wait_us", "device_side_us", "device_side_share", "graph_node_us",
                                                "graph_node_gaps", "graph_node_median_us")))
    note = unlinked_warning(links)
    if note:
        warnings.append(note)
    attribution = gaps.gap_attribution(trace, key, window, result=ev)
    attribution["share"] = attribution["inclusive_idle_us"] / idle_total if idle_total > 0 else 0.0
    keep = attribution[attribution["share"] >= FRAME_MIN_SHARE].head(MAX_FRAMES)
    out["gap_attribution"] = _records(keep)
    sites = idle_sites.idle_sites(ev, idle_total)
    out["idle_sites"] = _records(sites[sites["share"] >= FRAME_MIN_SHARE].head(MAX_FRAMES))
    report = syncs.blocking_syncs(trace, window=(tl.t0_us, tl.t1_us) if window else None, host_wait_only=True)
    # shares over the analysed device's whole idle, like every other share
    calls = report.calls
    if not calls.empty and "device" in calls.columns:
        calls = calls[(calls["rank"] == key[0]) & (calls["device"] == key[1])]
    dev_sites = syncs.sync_sites(calls, idle_total)
    out["blocking_syncs"] = dataclasses.replace(report, sites=dev_sites.head(MAX_LIST_ROWS)).to_list()
    if len(dev_sites) > MAX_LIST_ROWS:
        warnings.append(f"blocking syncs: the {MAX_LIST_ROWS:,} sites with the most blocked time are listed, "
                        f"{len(dev_sites) - MAX_LIST_ROWS:,} more are not")
    launch_idle_us = 0.0
    if fit is not None:
        h = trace.host
        lrows = np.flatnonzero(h["name"].isin(GRAPH_LAUNCH_NAMES).to_numpy() & (h["rank"].to_numpy() == key[0]))
        launch_idle_us = float(ev.inclusive_us[ev.tree.nodes(lrows)].sum()) if len(lrows) else 0.0
    rr = rounds.rounds(trace, round_name, key, kappa_us_per_node=fit.kappa_us_per_node if fit is not None else None,
                       sync_calls=report.calls, launches=fit.points if fit is not None else None,
                       taus=sidecar.round_taus if sidecar is not None else None,
                       unprofiled_round_ms=sidecar.measured_round_ms if sidecar is not None else None)
    out["rounds"] = rr
    if rr is not None and rr.summary.get("rounds_inside_others"):
        warnings.append(rounds.inside_note(rr.summary["rounds_inside_others"], round_name))
    # the loop's steps (any torch.profiler loop: rounds, ProfilerStep#N, an engine's step, a repeating range) and the
    # verdict per step and overall (analyses/steps.py, analyses/verdicts.py)
    st = steps.find_steps(trace, key, round_name)
    vd = verdicts.step_verdicts(trace, st, key, sync_calls=report.calls if not window else None)
    out["steps"] = _capped(st.to_dict(), "steps", warnings, "steps")
    out["verdict"] = _verdict_block(st, vd, warnings)
    if rr is not None and st.rule == "round" and st.outliers:
        rr.summary["without_outliers"] = _rounds_without(rr, st)
    tw = thread_waits.thread_waits(trace, key, st, window=(tl.t0_us, tl.t1_us))
    out["thread_waits"] = _records(tw.findings.head(MAX_LIST_ROWS))
    gli = None
    if fit is not None:
        gli = launch_idle.graph_launch_idle(trace, fit.kappa_us_per_node, fit.t0_us, key, (tl.t0_us, tl.t1_us),
                                            launches=fit.points)
        out["graph_launch_idle"] = gli.to_dict()
        sites = _charge_launches(sites, gli, idle_total)
        out["idle_sites"] = _records(sites[sites["share"] >= FRAME_MIN_SHARE].head(MAX_FRAMES))
    no_py = float(sites.loc[sites["site"] == idle_sites.NO_PYTHON_FRAME, "idle_us"].sum()) if len(sites) else 0.0
    no_stack_rows = None
    if idle_total > 0 and no_py / idle_total >= findings.FINDING_MIN_SHARE:
        no_stack_rows = thread_waits.idle_without_stacks(trace, key, (tl.t0_us, tl.t1_us))
        out["idle_without_stacks"] = _records(no_stack_rows.head(MAX_LIST_ROWS))
    found = findings.findings(idle_total, dev_sites, sites, fit, launch_idle_us, 
                              idle_sites.overhead_idle(trace, tl, key[0]), rr, tl.idle_us)
    reliable = any(f["kind"] == "profiler_inflation" for f in found)
    if gli is not None and reliable and idle_total > 0:
        for f in found:
            if f["kind"] == "profiler_inflation":  # the exact κ·N part of the idle under the launches
                f["idle_share"] = min(gli.totals["kappa_idle_us"] / idle_total, 1.0)
                f["summary"] += (f"; of the GPU-idle time, {ms_text(gli.totals['idle_us'])} "
                                 + findings.launch_split_text(gli.totals))
                f.update({k: gli.totals[k] for k in ("kappa_idle_us", "t0_idle_us", "residual_idle_us")})
    found += findings.loop_findings(idle_total, tw.findings, st.outliers, vd.table, no_stack_rows, no_py, gli,
                                    fit_reliable=reliable)
    if rr is None and st.rule not in ("round", "none"):  # the runtime's rounds have their host_bound finding
        found += _range_findings(trace, attribution, st, key, (tl.t0_us, tl.t1_us), idle_total)
    churn = allocator.allocator_churn(trace, st, key, idle_total, attribution)
    if churn is not None:
        found.append(churn)
    found.sort(key=lambda f: (-round(f["idle_share"], 3), {"blocking_sync": 0, "idle_site": 1}.get(f["kind"], 2)))
    # what fixing each finding buys: one baseline replay of the rounds (or the loop's steps), one more per cause
    # (analyses/savings.py)
    ctx, why = (savings.build_context(trace, sidecar, calibration, key, round_name)
                if rr is not None or st.rule != "none" else (None, None))
    if why:
        warnings.append(f"what-if replay: {why}; findings carry no saving_us")
    if ctx is not None and getattr(ctx, "fit_warning", None):
        warnings.append(f"what-if replay: {ctx.fit_warning}")
    if ctx is not None:
        # a replay warning that says what one above already said (its round checks share rounds' words) once
        warnings += [f"what-if replay: {w}" for w in list(ctx.warnings) + list(ctx.unprof.get("warnings", ()))
                     if w not in warnings]
    out["whatif"] = savings.whatif_block(trace, ctx, calibration, sidecar)
    if ctx is not None:
        out["whatif"]["step_rule"], out["whatif"]["step_name"] = ctx.step_rule, ctx.step_name
    out["findings"] = to_jsonable(savings.rank_findings(trace, found, ctx, out["whatif"]))
    out["idle_share_note"] = findings.IDLE_SHARE_NOTE if out["findings"] else None
    out["headline"] = _headline(out, st, vd, window, key)
    partial = int(ev.tree.partial_overlaps) if hasattr(ev.tree, "partial_overlaps") else 0
    if partial:
        warnings.append(f"{partial} host events partially overlap an enclosing event on their thread "
                        "(nested under their innermost container for attribution)")
    # a warning may quote the trace's path (a replay's one-line reason), which may hold a byte the file system gave
    # as a lone surrogate: no UTF-8 output can encode it
    warnings[:] = [clean_text(w) for w in warnings]
    return AnalysisSummary(**out)


SATURATED_SHARE = 0.99  # a device busy this share of the window or more: nothing on the host to fix
_RULE_TEXT = {"round": "the runtime's verify-round range", "named": "the step range --rounds names",
              "profiler_step": "torch.profiler's ProfilerStep#N, one per prof.step()",
              "engine_step": "the serving engine's own per-step range",
              "repeating_range": "the most frequent top-level host range, repeating with a regular period"}


def _capped(d: dict, key: str, warnings: list[str], what: str) -> dict:
    """``d`` with its list ``key`` cut to MAX_LIST_ROWS rows (a warning says how many more there were)."""
    rows = d.get(key) or []
    if len(rows) > MAX_LIST_ROWS:
        warnings.append(f"{what}: the first {MAX_LIST_ROWS:,} of {len(rows):,} are listed")
        d[key] = rows[:MAX_LIST_ROWS]
    return d


def _verdict_block(st: Any, vd: Any, warnings: list[str]) -> dict:
    """The ``verdict`` object: rule, step_name, reason, holds_request, overall (:attr:`.verdicts.Verdicts.overall`),
    steps (the per-step verdict table's rows, at most MAX_LIST_ROWS), outliers (the outlier steps' sentences)."""
    d = vd.to_dict()
    out = {"rule": st.rule, "step_name": st.name_pattern or st.name, "reason": st.reason,
           "holds_request": st.holds_request, "overall": d["overall"], "steps": d["steps"],
           "outliers": [o.summary for o in st.outliers]}
    return _capped(out, "steps", warnings, "per-step verdicts")


def _rounds_without(rr: RoundsReport, st: Any) -> dict:
    """The rounds' mean figures without the outlier rounds (:attr:`.steps.Steps.outliers`, matched by start):
    {rounds, left_out (their round numbers), t_round_us, t_gpu_us, t_host_us, t_serial_us}; the summary's own
    figures keep them in."""
    t = rr.table
    starts = st.table.loc[st.table["outlier"].astype(bool), "start_us"].to_numpy(np.float64)
    out_mask = np.isin(np.round(t["start_us"].to_numpy(np.float64), 3), np.round(starts, 3))
    keep = t[~out_mask]
    res = {"rounds": int(len(keep)), "left_out": [int(x) for x in t.loc[out_mask, "round"]]}
    for k in ("t_round_us", "t_gpu_us", "t_host_us", "t_serial_us"):
        res[k] = float(keep[k].mean()) if len(keep) else None
    return res


def _charge_launches(sites: pd.DataFrame, gli: Any, idle_total: float) -> pd.DataFrame:
    """Idle sites with the host-wait idle under graph launch calls moved from the caller's site to one row,
    ``GRAPH_LAUNCH_SITE`` (analyses/launch_idle.py: the launch's idle is the launch's, split into κ·N and t0, not
    the Python frame's that called ``replay()``). The total is kept: what leaves a site (at most its idle) is what
    the new row holds."""
    by = gli.by_caller
    if sites.empty or by.empty or idle_total <= 0:
        return sites
    s = sites.copy()
    moved = 0.0
    for r in by.itertuples(index=False):
        m = np.flatnonzero((s["site"] == r.site).to_numpy())
        if not len(m):
            continue
        take = min(float(r.idle_us), float(s["idle_us"].iloc[m[0]]))
        s.iloc[m[0], s.columns.get_loc("idle_us")] -= take
        moved += take
    if moved <= 0:
        return sites
    s = pd.concat([s, pd.DataFrame({"site": [idle_sites.GRAPH_LAUNCH_SITE], "range": [""], "idle_us": [moved]})],
                  ignore_index=True)
    s = s[s["idle_us"] > 1e-9].copy()
    s["share"] = s["idle_us"] / idle_total
    return s.sort_values(["idle_us", "site"], ascending=[False, True], kind="stable").reset_index(drop=True)


RANGE_LAUNCH_SHARE = 0.5  # a range holding this share of the window's launch calls is the loop body or its forward
# a range the user named is a candidate cause down to this share of the idle (idle sites need FINDING_MIN_SHARE): the
# ranking is by what removing it saves, and a 2% saving under a 40 ms host-bound step is still worth stating
RANGE_MIN_SHARE = 0.01


def _range_findings(trace: Trace, attribution: pd.DataFrame, st: Any, key: tuple[int, int],
                    win: tuple[float, float], idle_total: float) -> list[dict]:
    """``host_range`` findings of a loop that is not the runtime's rounds: the NVTX / record_function ranges
    (gap attribution's user_annotation rows: host-wait idle while the range was open) holding
    RANGE_MIN_SHARE of the idle or more, the three with the most idle, leaving out the steps' own ranges (ProfilerStep#N, the
    step range) and ranges that hold RANGE_LAUNCH_SHARE or more of the rank's launch calls in the window (the loop
    body or its forward: the idle sites inside name what in it costs). ``range`` is the cause their saving removes
    (the range's host work)."""
    import re

    from .steps import _name_mask, is_launch_call

    if idle_total <= 0 or attribution.empty:
        return []
    ua = attribution[(attribution["cat"] == "user_annotation")
                     & (attribution["inclusive_idle_us"] >= RANGE_MIN_SHARE * idle_total)]
    own = {st.name, st.name_pattern}
    h = trace.host
    rk = h["rank"].to_numpy() == key[0]
    ts, te = h["ts_us"].to_numpy(), h["end_us"].to_numpy()
    rt = np.flatnonzero(h["cat"].isin(("cuda_runtime", "cuda_driver")).to_numpy() & rk & (ts >= win[0]) & (ts < win[1]))
    rt = rt[_name_mask(trace, rt, is_launch_call)]
    tid = trace.host_str("tid")
    out = []
    for r in ua.itertuples(index=False):
        name = str(r.frame)
        if name in own or re.fullmatch(r"ProfilerStep#\d+", name) or re.sub(r"\d+", "#", name) in own:
            continue
        occ = np.flatnonzero(trace.host_str_eq("cat", "user_annotation") & rk & trace.host_str_eq("name", name))
        inside = np.zeros(len(rt), dtype=bool)
        for o in occ:
            inside |= (ts[rt] >= ts[o]) & (ts[rt] < te[o]) & (tid[rt] == tid[o])
        if len(rt) and inside.mean() >= RANGE_LAUNCH_SHARE:
            continue
        share = float(r.inclusive_idle_us) / idle_total
        out.append({"kind": "host_range",
                    "summary": (f"{share:.0%} of GPU-idle time ({ms_text(float(r.inclusive_idle_us))}) the host was "
                                f"inside range {name} (NVTX / record_function; {int(inside.sum())} of the window's "
                                f"{len(rt)} launch calls in it)"),
                    "idle_share": min(share, 1.0), "idle_us": float(r.inclusive_idle_us), "range": name})
        if len(out) == 3:
            break
    return out


def _headline(out: dict, st: Any, vd: Any, window: str | None, key: tuple[int, int]) -> list[str]:
    """The first screen, in order: the verdict over the steps (with the figure behind it and the step used), the
    GPU saturated (when it is), the cause whose fix buys most and its fix (else the first finding), the occupancy
    sentence per device, then the device-side share and the graph-node bubbles."""
    lines: list[str] = []
    found = out["findings"]
    if st.rule == "none":
        lines.append(f"no loop steps found, so no verdict per step: {st.reason}")
    else:
        n = int(st.summary.get("steps", 0))
        name = st.name_pattern or st.name
        k = int(st.summary.get("outliers", 0))
        left = f"; the {k} outlier step{'s' if k != 1 else ''} left out of it" if k else ""
        rule = "named" if st.rule == "round" and name != "round" else st.rule
        line = (f"verdict over {n} step{'s' if n != 1 else ''} of '{name}' ({_RULE_TEXT.get(rule, rule)}{left}): "
                f"{vd.overall.get('figure', '')}")
        if st.holds_request:
            line += "; each step holds a whole generate() call, so TPOT is per step, not per token"
        if k:
            line += (f"; mean step {ms_text(st.summary['mean_step_us'])} with the {k} outlier step{'s' if k != 1 else ''}, "
                     f"{ms_text(st.summary['mean_step_us_without_outliers'])} without")
        lines.append(line)
    dev = next((d for d in out["devices"] if (int(d["rank"]), int(d["device"])) == tuple(key)), None)
    saturated = dev is not None and dev["occupancy"] >= SATURATED_SHARE
    if saturated:
        lines.append(f"the GPU was saturated (busy {dev['occupancy']:.1%} of the window): nothing to fix on the host")
    said = savings.saving_headline(found, out["whatif"]) if out["whatif"] else None
    top = next((f for f in found if f.get("saving_us") is not None), None)
    ov = vd.overall or {}
    caveat = None
    if said and not saturated and ov.get("verdict") == "gpu_bound" and top is not None and ov.get("step_us"):
        room = (ov.get("host_wait_idle_us") or 0.0) / ov["step_us"]
        if (top.get("saving_share") or 0.0) > room + savings.FOLD_SHARE:
            caveat = (f"but the steps are GPU-bound, with host-wait idle {room:.0%} of a step: the replay does not "
                      "model the device's waits on other streams or collectives, so a host fix buys at most that")
    if said and not saturated:
        lines.append(said)
        if caveat:
            lines.append(caveat)
        if top is not None and top.get("fix") and not said.startswith("no finding"):
            lines.append(f"fix: {top['fix']}")
    if found and not saturated and (top is None or found[0] is not top or not said):
        first = found[0]
        lines.append(first["summary"] + (f"; fix: {first['fix']}" if first.get("fix") and not said else ""))
    for d in out["devices"]:
        where = f" of window {window!r}" if window else ""
        lines.append(
            f"{d['name'] if d['name'].startswith('GPU ') else d['name'] + ' (GPU ' + str(d['device']) + ')'}"
            f"{' on rank ' + str(d['rank']) if d['rank'] else ''} busy "
            f"{d['occupancy']:.1%} of {d['window_us'] / 1000:.2f} ms{where}; {d['idle_us'] / 1000:.2f} ms idle "
            f"in {d['gaps']} gap{'s' if d['gaps'] != 1 else ''}")
    split = out["idle_split"]
    if split["device_side_share"] is not None and split["device_side_share"] >= findings.FINDING_MIN_SHARE:
        rest = ", and the findings below explain the rest" if found else ""
        lines.append(
            f"{split['device_side_share']:.0%} of the idle time ({ms_text(split['device_side_us'])}) is device-side: gaps "
            "before kernels that were already launched (launch latency between queued kernels, CUDA-graph node "
            f"bubbles); no host code caused it{rest}"
            + (f"; {ms_text(split['graph_node_us'])} of it in {split['graph_node_gaps']} gaps between the nodes of one "
               f"CUDA-graph launch (median {split['graph_node_median_us']:.2f} µs each; no host change removes them, "
               "fewer or overlapped nodes (programmatic dependent launch) do)" + _top_pair(out["node_bubbles"])
               if split["graph_node_gaps"] else ""))
    return lines


def run_analysis(trace: Trace, window: str | None = None, device: int | None = None,
                 sidecar: Sidecar | Mapping[str, Any] | None = None, round_name: str = "round",
                 calibration: Any = None) -> dict[str, Any]:
    """:func:`summarize`'s :meth:`AnalysisSummary.to_json`: the analysis of ``trace`` as one JSON-able dict (the
    ``--json`` output; arguments as :func:`summarize`)."""
    return summarize(trace, window=window, device=device, sidecar=sidecar, round_name=round_name,
                     calibration=calibration).to_json()


NO_GPU = ("the trace has no GPU activity (kernel/memcpy/memset events): nothing to measure occupancy or idle gaps on "
          "(profiled without ProfilerActivity.CUDA, or on a machine without a GPU?)")


def no_gpu_message(trace_path: str, warnings=(), body: str = NO_GPU) -> str:
    """The one error line of analyze, diff and report for a trace without GPU activity (exit code 2): ``body``
    after the path. When the loader dropped events (``warnings``: the trace's load warnings; corrupt timestamps or
    durations), the line says so instead of guessing that the profiler never recorded the GPU."""
    dropped = [w for w in warnings if "dropped" in str(w)]
    if dropped:
        return (f"{trace_path}: no usable GPU activity (kernel/memcpy/memset events) is left: "
                + "; ".join(map(str, dropped)))
    return f"{trace_path}: {body}"
