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
- ``headline``: [str], the occupancy sentence per device, the device-side share, then what the cause that buys
  most saves (:func:`gaptrace.analyses.savings.saving_headline`) and the first finding;
- ``warnings``: [str], the loader's integrity warnings and the analyses' own.

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

from . import findings, gaps, idle_sites, launch_fit, occupancy, rounds, savings, syncs
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
                           "warnings": warnings}
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
    node_dur = exact.gaps()["dur_us"].to_numpy()[node]
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
    launch_idle = 0.0
    if fit is not None:
        h = trace.host
        lrows = np.flatnonzero(h["name"].isin(GRAPH_LAUNCH_NAMES).to_numpy() & (h["rank"].to_numpy() == key[0]))
        launch_idle = float(ev.inclusive_us[ev.tree.nodes(lrows)].sum()) if len(lrows) else 0.0
    rr = rounds.rounds(trace, round_name, key, kappa_us_per_node=fit.kappa_us_per_node if fit is not None else None,
                       sync_calls=report.calls, launches=fit.points if fit is not None else None,
                       taus=sidecar.round_taus if sidecar is not None else None,
                       unprofiled_round_ms=sidecar.unprofiled_round_ms if sidecar is not None else None)
    out["rounds"] = rr
    found = findings.findings(idle_total, dev_sites, sites, fit, launch_idle,
                              idle_sites.overhead_idle(trace, tl, key[0]), rr, tl.idle_us)
    # what fixing each finding buys: one baseline replay of the rounds, one more per cause (analyses/savings.py)
    ctx, why = savings.build_context(trace, sidecar, calibration, key, round_name) if rr is not None else (None, None)
    if why:
        warnings.append(f"what-if replay: {why}; findings carry no saving_us")
    out["whatif"] = savings.whatif_block(trace, ctx, calibration, sidecar)
    out["findings"] = to_jsonable(savings.rank_findings(trace, found, ctx, out["whatif"]))
    out["idle_share_note"] = findings.IDLE_SHARE_NOTE if out["findings"] else None
    for d in out["devices"]:
        where = f" of window {window!r}" if window else ""
        out["headline"].append(
            f"{d['name'] if d['name'].startswith('GPU ') else d['name'] + ' (GPU ' + str(d['device']) + ')'}"
            f"{' on rank ' + str(d['rank']) if d['rank'] else ''} busy "
            f"{d['occupancy']:.1%} of {d['window_us'] / 1000:.2f} ms{where}; {d['idle_us'] / 1000:.2f} ms idle "
            f"in {d['gaps']} gaps")
    split = out["idle_split"]
    if split["device_side_share"] is not None and split["device_side_share"] >= findings.FINDING_MIN_SHARE:
        out["headline"].append(
            f"{split['device_side_share']:.0%} of the idle time ({ms_text(split['device_side_us'])}) is device-side: gaps "
            "before kernels that were already launched (launch latency between queued kernels, CUDA-graph node "
            "bubbles); no host code caused it, and the findings below explain the rest"
            + (f"; {ms_text(split['graph_node_us'])} of it in {split['graph_node_gaps']} gaps between the nodes of one "
               f"CUDA-graph launch (median {split['graph_node_median_us']:.2f} µs each; no host change removes them, "
               "fewer or overlapped nodes (programmatic dependent launch) do)" + _top_pair(out["node_bubbles"])
               if split["graph_node_gaps"] else ""))
    line = savings.saving_headline(out["findings"], out["whatif"])
    if line:
        out["headline"].append(line)
    if out["findings"]:
        out["headline"].append(out["findings"][0]["summary"])
    partial = int(ev.tree.partial_overlaps) if hasattr(ev.tree, "partial_overlaps") else 0
    if partial:
        warnings.append(f"{partial} host events partially overlap an enclosing event on their thread "
                        "(nested under their innermost container for attribution)")
    return AnalysisSummary(**out)


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
