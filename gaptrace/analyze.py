"""``gaptrace analyze``: all core analyses of one trace, the findings in words, and the JSON for CI gates.

:func:`run_analysis` returns one JSON-able dict (the ``--json`` output; the report renders the same dict):

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
- ``findings``: [{kind, summary, idle_share}], sorted by idle_share desc: what explains the idle time;
- ``headline``: [str], the occupancy sentence per device followed by the first finding;
- ``warnings``: [str], the loader's integrity warnings and the analyses' own.

Every figure is a sum or ratio of µs read off the trace (see each analysis module for its formula), so it can be
reproduced by hand from the trace.
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import click
import numpy as np
import pandas as pd

from gaptrace.bounds import MAX_LIST_ROWS
from gaptrace.cli import escape_json_controls, escape_line, escape_strings, memory_limit_option
from gaptrace.trace import GRAPH_LAUNCH_NAMES, Trace, TraceError, clean_text

__all__ = ["run_analysis", "idle_sites", "findings", "unlinked_warning", "analyze", "to_jsonable", "dumps_json"]


# Findings below this share of the window's idle time are not stated (they stay in the tables).
FINDING_MIN_SHARE = 0.05
# Rows of gap_attribution kept in the JSON: frames holding at least this share of idle, at most MAX_FRAMES.
FRAME_MIN_SHARE = 0.001
MAX_FRAMES = 500
# Warn when at least this share of the window's GPU events carry a broken correlation id (absent, negative, or
# shared by several launch calls: no shipped trace has one). An id whose launch call is missing is no sign of a
# broken trace (a launch made before the capture began: up to 30% of the GPU events of the shipped third-party
# traces), so those are counted in idle_split but warned about only when no event links at all.
BROKEN_ID_WARN_SHARE = 0.01


def to_jsonable(obj: Any) -> Any:
    """numpy/pandas scalars and containers -> plain JSON types (NaN/inf -> None)."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        v = float(obj)
        return v if math.isfinite(v) else None
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    return obj


def dumps_json(obj: Any) -> str:
    """The ``--json`` text of a result dict: :func:`to_jsonable`, indented, non-ASCII kept, every non-printable
    character escaped (:func:`gaptrace.cli.escape_json_controls`: trace names are untrusted)."""
    return escape_json_controls(json.dumps(to_jsonable(obj), indent=1, ensure_ascii=False))


def _top_pair(pairs: list[dict]) -> str:
    """The headline's clause on the kernel pair holding the most node-bubble idle (``node_bubbles``' first row)."""
    if not pairs:
        return ""
    from gaptrace.analyses.occupancy import short_kernel_name

    p = pairs[0]
    return (f"; the costliest boundary is {short_kernel_name(p['before'])} -> {short_kernel_name(p['after'])} "
            f"({p['gaps']} gaps, median {p['median_us']:.2f} µs, {p['share']:.0%} of the node-bubble idle)")


def _records(df: pd.DataFrame) -> list[dict]:
    return [to_jsonable(r) for r in df.to_dict("records")]


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
    from gaptrace.analyses import stacks
    from gaptrace.analyses.gaps import grouped_union

    tree, tl = result.tree, result.timeline
    empty = pd.DataFrame({"site": [], "range": [], "idle_us": [], "share": []})
    act = np.flatnonzero(result.seg_node >= 0)
    if tree.n == 0 or tl.idle_us <= 0 or len(act) == 0:
        return empty
    s, e, node = result.seg_start_us[act], result.seg_end_us[act], result.seg_node[act]
    keep = tl.idle_between(s, e) > 0
    s, e, node = s[keep], e[keep], node[keep]
    site_rows = stacks.innermost_site(tree, tree.rows(node))
    n_frames = len(tree.frames)
    site = np.where(site_rows >= 0, tree.frame[tree.nodes(np.maximum(site_rows, 0))], n_frames)
    waiting_frame = stacks.waiting_frames(tree)
    waiting = waiting_frame[tree.frame[node]] | ((site < n_frames) & waiting_frame[np.minimum(site, n_frames - 1)])
    site = np.where(waiting, n_frames + 1, site)
    g, us, ue = grouped_union(site, s, e)
    idle = np.bincount(g, weights=tl.idle_between(us, ue), minlength=n_frames + 2)
    nz = np.flatnonzero(idle > 0)
    names = np.r_[tree.frames.to_numpy(dtype=object), np.array(["(no Python frame)", "(thread waiting)"], dtype=object)]
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


def _ms(us: float) -> str:
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.0f} µs"


def overhead_idle(trace: Trace, timeline: Any, rank: int) -> dict[str, float]:
    """Idle µs under the trace's ``overhead`` events, per group: "profiler" (Buffer Flush, Activity Buffer
    Request: CUPTI's own buffers) and "lazy_loading" (Runtime Triggered Module Loading, Lazy Function Loading:
    CUDA's lazy module loading, CUDA_MODULE_LOADING=LAZY, which happens without the profiler too).
    Each group's intervals are merged first, so overlapping events count once."""
    from gaptrace.analyses.timeline import merge_intervals

    ov = trace.overhead[trace.overhead["rank"].to_numpy() == rank]
    names = ov["name"].astype(str)
    groups = {"lazy_loading": names.str.contains("Loading", case=False).to_numpy()}
    groups["profiler"] = ~groups["lazy_loading"]
    out = {}
    for g, m in groups.items():
        s, e = merge_intervals(ov["ts_us"].to_numpy()[m], ov["end_us"].to_numpy()[m])
        out[g] = float(timeline.idle_between(s, e).sum()) if len(s) else 0.0
    return out


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
    """What explains the idle time, as sentences, sorted by idle_share desc (issue 2 "headline findings").

    - ``blocking_sync``: a call site whose blocking calls hold or are followed by idle (idle_share = (its
      idle_during_us + idle_after_us) / window idle; seed 000: "91% of all GPU-idle gap time sat under a single
      cudaMemcpyAsync ...");
    - ``idle_site``: a host function the host sat in while the device idled (see :func:`idle_sites`);
    - ``profiler_inflation``: the part of graph-launch host time that grows with node count (κ·N), charged with the
      idle that sat under graph launches in proportion (seed 000, "A red herring from the instrument");
    - ``profiler_overhead``: idle under the profiler's own buffer flushes and requests;
    - ``lazy_loading``: idle under CUDA lazy module loading (kernels loaded on first use, mid-run);
    - ``host_bound``: overlapped verify rounds (no blocking sync pins them) whose host time exceeds their GPU time
      even after the profiler's launch inflation is taken out (median Thost − Σ min(κ·N, launch) > median TGPU,
      :mod:`.analyses.rounds`): the GPU waits for launches, so the host-wait idle (``host_wait_us``: all idle but
      the device-side bubbles) is the host being late (seed 000: "TGPU ... max(TGPU, Thost) pipelined"), and the
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
        idle_us = float(r.idle_during_us) + float(r.idle_after_us)
        share = min(idle_us / idle_total_us, 1.0)
        if share < FINDING_MIN_SHARE:
            continue
        op = f" ({r.aten_op})" if r.aten_op else ""
        out.append({
            "kind": "blocking_sync",
            "summary": (f"{share:.0%} of GPU-idle time ({_ms(idle_us)}) sat under or right after {r.call}{op} from "
                        f"{r.site or '(no Python frame)'}: it blocked the host {_ms(r.mean_blocked_us)} on average "
                        f"(max {_ms(r.max_blocked_us)}) over {int(r.count)} calls while the GPU was "
                        f"{r.device_busy_during:.0%} busy"),
            "idle_share": share, "call": r.call, "site": r.site, "aten_op": r.aten_op,
        })
    for r in sites[~sites["site"].isin(["(no Python frame)", "(thread waiting)"])].head(5).itertuples(index=False):
        share = float(r.share)
        if share < FINDING_MIN_SHARE:
            continue
        where = f", in range {r.range}" if r.range else ""
        out.append({
            "kind": "idle_site",
            "summary": f"{share:.0%} of GPU-idle time ({_ms(r.idle_us)}) the host was inside {r.site}{where}",
            "idle_share": share, "site": r.site, "range": r.range,
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
            where = (f"; the range with the most host time is {rng}: {_ms(float(top['host_us_per_round'].iloc[0]))} "
                     f"a round ({float(top['share'].iloc[0]):.0%} of the host's own time inside the round's ranges)") if rng else ""
            out.append({
                "kind": "host_bound",
                "summary": (f"{share:.0%} of GPU-idle time ({_ms(host_wait_us)}) is the GPU waiting for a late host: "
                            f"the rounds are host-bound, Thost {_ms(summary['t_host_less_inflation_us'])} a round "
                            f"without the profiler's launch inflation ({_ms(summary['t_host_us'])} with it) against "
                            f"TGPU {_ms(summary['t_gpu_us'])}{where}"),
                "idle_share": share, "range": rng,
            })
    texts = {"profiler": ("profiler_overhead", "sat under the profiler's own buffer flushes and requests"),
             "lazy_loading": ("lazy_loading", "sat under CUDA lazy module loading (kernels loaded on first use: "
                                              "warm up every kernel, or CUDA_MODULE_LOADING=EAGER)")}
    for g, us in overhead_idle_us.items():
        share = us / idle_total_us
        if share >= FINDING_MIN_SHARE:
            kind, text = texts[g]
            out.append({"kind": kind, "summary": f"{share:.0%} of GPU-idle time ({_ms(us)}) {text}",
                        "idle_share": share})
    # by share (to 0.1%); on a tie the more specific diagnosis first: a blocking call names both call and site
    priority = {"blocking_sync": 0, "idle_site": 1}
    out.sort(key=lambda f: (-round(f["idle_share"], 3), priority.get(f["kind"], 2)))
    return out


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


def _unprofiled_launches(sidecar: dict | None) -> dict[int, float] | None:
    """{nodes: unprofiled launch µs} from a sidecar's ``graphs`` list; malformed entries are skipped (the sidecar
    is optional, untrusted input)."""
    from gaptrace.capture import positive_number

    out = {}
    graphs = sidecar.get("graphs") if isinstance(sidecar, dict) else None
    for g in graphs if isinstance(graphs, list) else []:
        if not isinstance(g, dict):
            continue
        n, us = g.get("nodes"), g.get("unprofiled_launch_us")
        if positive_number(n) and positive_number(us):
            out[int(n)] = float(us)
    return out or None


def run_analysis(trace: Trace, window: str | None = None, device: int | None = None,
                 sidecar: dict | None = None, round_name: str = "round") -> dict[str, Any]:
    """All four core analyses of ``trace`` over ``window`` as one JSON-able dict (see the module docstring).

    ``window``: None (each device's first to last activity, or the capture sidecar's ``analysis_window``
    annotation when the trace has it: the profiled rounds, without the profiler's own start and stop) or an
    annotation name (its span; TraceError when no annotation has that name). ``device``: the device gap attribution and findings are computed for (default:
    the busiest). ``sidecar``: a capture sidecar (unprofiled graph-launch costs feed the launch fit; τ per round and
    unprofiled round times feed the rounds table). ``round_name``: the annotation that marks one verify round.
    A trace with host events but no device activity yields devices [] and the host-side analyses only.
    """
    from gaptrace.analyses import gaps, launch_fit, occupancy, rounds, syncs

    # names from argv may hold lone surrogates (bytes that are not UTF-8); the trace's own names are cleaned the
    # same way (build_trace), so they still match, and the result stays printable
    window = clean_text(window) if isinstance(window, str) else window
    round_name = clean_text(round_name)
    warnings = list(trace.warnings)
    window_source = "argument" if window else None
    if window is None and isinstance(sidecar, dict) and isinstance(sidecar.get("analysis_window"), str):
        named = sidecar["analysis_window"]
        ua = trace.host.loc[trace.host["cat"] == "user_annotation", "name"]
        if (ua == named).any():  # the capture's decode window (its profiled rounds)
            window, window_source = named, "sidecar"
    out: dict[str, Any] = {"trace": clean_text(trace.path), "window": window, "window_source": window_source, "devices": [], "gap_attribution": [],
                           "idle_sites": [], "blocking_syncs": [], "launch_fit": None, "findings": [],
                           "rounds": None, "idle_split": None, "node_bubbles": [], "headline": [],
                           "warnings": warnings}
    has_device = not trace.device.empty
    unprofiled = _unprofiled_launches(sidecar)
    fit = launch_fit.launch_fit(trace, unprofiled)
    out["launch_fit"] = fit.to_dict() if fit is not None else None
    if not has_device:
        report = syncs.blocking_syncs(trace)
        out["blocking_syncs"] = report.to_list()
        out["headline"] = ["no GPU activity in the trace: occupancy and idle-gap attribution are absent"]
        return out

    occ = occupancy.occupancy(trace, window)
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
    sites = idle_sites(ev, idle_total)
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
    rr = rounds.rounds(trace, round_name, key, sidecar, fit.kappa_us_per_node if fit is not None else None,
                       sync_calls=report.calls, launches=fit.points if fit is not None else None)
    out["rounds"] = rr.to_dict() if rr is not None else None
    out["findings"] = to_jsonable(findings(idle_total, dev_sites, sites, fit, launch_idle,
                                           overhead_idle(trace, tl, key[0]), rr, tl.idle_us))
    for d in out["devices"]:
        where = f" of window {window!r}" if window else ""
        out["headline"].append(
            f"{d['name'] if d['name'].startswith('GPU ') else d['name'] + ' (GPU ' + str(d['device']) + ')'}"
            f"{' on rank ' + str(d['rank']) if d['rank'] else ''} busy "
            f"{d['occupancy']:.1%} of {d['window_us'] / 1000:.2f} ms{where}; {d['idle_us'] / 1000:.2f} ms idle "
            f"in {d['gaps']} gaps")
    split = out["idle_split"]
    if split["device_side_share"] is not None and split["device_side_share"] >= FINDING_MIN_SHARE:
        out["headline"].append(
            f"{split['device_side_share']:.0%} of the idle time ({_ms(split['device_side_us'])}) is device-side: gaps "
            "before kernels that were already launched (launch latency between queued kernels, CUDA-graph node "
            "bubbles); no host code caused it, and the findings below explain the rest"
            + (f"; {_ms(split['graph_node_us'])} of it in {split['graph_node_gaps']} gaps between the nodes of one "
               f"CUDA-graph launch (median {split['graph_node_median_us']:.2f} µs each; no host change removes them, "
               "fewer or overlapped nodes (programmatic dependent launch) do)" + _top_pair(out["node_bubbles"])
               if split["graph_node_gaps"] else ""))
    if out["findings"]:
        out["headline"].append(out["findings"][0]["summary"])
    partial = int(ev.tree.partial_overlaps) if hasattr(ev.tree, "partial_overlaps") else 0
    if partial:
        warnings.append(f"{partial} host events partially overlap an enclosing event on their thread "
                        "(nested under their innermost container for attribution)")
    return out


def _table(rows: list[dict], cols: list[tuple[str, str, str]], limit: int) -> str:
    """Plain-text table: cols = [(key, header, format)]."""
    if not rows:
        return "  (none)"
    body = [[format(r.get(k), f) if r.get(k) is not None else "-" for k, _, f in cols] for r in rows[:limit]]
    heads = [h for _, h, _ in cols]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(heads)]
    lines = ["  " + "  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(heads, widths)))]
    for b in body:
        lines.append("  " + "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(b, widths))))
    if len(rows) > limit:
        lines.append(f"  … {len(rows) - limit} more (see --json)")
    return "\n".join(lines)


def render_text(res: dict, top: int = 15) -> str:
    """The human-readable form of :func:`run_analysis`'s dict: headline, findings, then the tables; every
    non-printable character of a string in ``res`` (from trace names: ESC, BEL, a newline, ...) escaped first
    (:func:`gaptrace.cli.escape_strings`), so a name cannot break a row or forge a line."""
    res = escape_strings(res)
    parts = [*res["headline"], ""]
    if res["findings"]:
        parts.append("Findings (share of GPU-idle time):")
        parts += [f"  {i}. [{f['kind']}] {f['summary']}" for i, f in enumerate(res["findings"], 1)]
        parts.append("")
    parts.append("Devices:")
    parts.append(_table(res["devices"], [("name", "device", "s"), ("device", "id", "d"), ("window_us", "window µs", ",.0f"),
                                         ("busy_us", "busy µs", ",.0f"), ("idle_us", "idle µs", ",.0f"),
                                         ("occupancy", "occupancy", ".1%"), ("gaps", "gaps", "d")], 64))
    parts += ["", "Idle by host frame (gap-clipped; inclusive counts each moment once per frame):"]
    parts.append(_table(res["gap_attribution"], [("frame", "frame", "s"), ("self_idle_us", "self µs", ",.0f"),
                                                 ("inclusive_idle_us", "inclusive µs", ",.0f"),
                                                 ("share", "share", ".1%"), ("gaps", "gaps", "d")], top))
    parts += ["", "Blocking syncs (per call site):"]
    parts.append(_table(res["blocking_syncs"], [("call", "call", "s"), ("aten_op", "op", "s"), ("site", "site", "s"),
                                                ("count", "n", "d"), ("blocked_us", "blocked µs", ",.0f"),
                                                ("idle_after_us", "idle after µs", ",.0f"),
                                                ("idle_share", "idle share", ".1%"),
                                                ("device_busy_during", "GPU busy during", ".0%")], top))
    if res.get("node_bubbles"):
        from gaptrace.analyses.occupancy import short_kernel_name

        rows = [dict(r, before=short_kernel_name(r["before"]), after=short_kernel_name(r["after"]))
                for r in res["node_bubbles"]]
        parts += ["", "Bubbles between graph nodes, by kernel pair (device-side; share of all node bubbles):"]
        parts.append(_table(rows, [("before", "before", "s"), ("after", "after", "s"), ("gaps", "gaps", "d"),
                                   ("idle_us", "idle µs", ",.0f"), ("median_us", "median µs", ".3f"),
                                   ("share", "share", ".1%")], top))
    fit = res.get("launch_fit")
    parts += ["", "Graph-launch fit t(N) = t0 + κN:"]
    if fit is None:
        parts.append("  (no graph launches with device work)")
    else:
        if fit["kappa_us_per_node"] is not None:
            r2 = "n/a" if fit["r2"] is None else f"{fit['r2']:.3f}"  # None: every launch took the same time
            ci = fit.get("kappa_interval_us_per_node")
            ci = ci if ci and None not in ci else None
            ci_text = f" (95% interval {ci[0]:.3f}–{ci[1]:.3f})" if ci else ""
            parts.append(f"  κ = {fit['kappa_us_per_node']:.3f} µs/node{ci_text}, t0 = {fit['t0_us']:.1f} µs, "
                         f"R² = {r2} over {fit['launches']} launches")
            if ci and (ci[1] - ci[0]) > 0.4 * abs(fit["kappa_us_per_node"]):
                sizes = [g["nodes"] for g in fit["graphs"]]
                parts.append(f"  κ is poorly determined: the interval is {(ci[1] - ci[0]):.3f} µs/node wide "
                             f"(graph sizes {min(sizes)}–{max(sizes)} nodes); the sidecar's excess / N below, "
                             "where present, measures it per size")
        else:
            parts.append(f"  {fit['reason']}")
        cols = [("nodes", "N", "d"), ("launches", "launches", "d"), ("median_us", "median µs", ",.1f"),
                ("inflation_us", "κN µs", ",.1f")]
        rows = fit["graphs"]
        if any(g.get("unprofiled_us") is not None for g in rows):
            # the sidecar's unprofiled launch cost per size: (median − unprofiled) / N is the profiler's cost per
            # node measured at that size alone, a check on κ that needs no spread of graph sizes
            rows = [{**g, "excess_per_node_us": (g["excess_us"] / g["nodes"] if g.get("excess_us") is not None
                                                 and g["nodes"] else None)} for g in rows]
            cols += [("unprofiled_us", "unprofiled µs", ",.1f"), ("excess_per_node_us", "excess / N µs", ".3f")]
        parts.append(_table(rows, cols, 50))
    rr = res.get("rounds")
    if rr:
        m = rr["summary"]
        head = f"Verify rounds ({m['rounds']} periods of '{m['annotation']}'): {m['verdict']}, {m['bound']}-bound"
        mean_bound = "GPU" if m["t_gpu_us"] >= m["t_host_us"] else "host"
        if mean_bound != m["bound"]:  # the verdict and bound come from the median round, the figures are means
            head += (f" (in the median round; the means below are {mean_bound}-bound: some rounds differ, e.g. one "
                     "holding a prefill or a compile)")
        parts += ["", head]
        line = (f"  mean Tround {m['t_round_us']:,.0f} µs = TGPU {m['t_gpu_us']:,.0f} + Tserial {m['t_serial_us']:,.0f} "
                f"(device idle in the round); "
                f"Thost {m['t_host_us']:,.0f} µs; max(TGPU, Thost) is {1 - m['overlap_excess']:.0%} of Tround")
        parts.append(line)
        if m.get("tau"):
            parts.append(f"  τ {m['tau']:.2f} tokens/round, TPOT {m['tpot_us'] / 1000:.3f} ms")
        if m.get("unprofiled_round_us"):
            ex = m["profiler_excess_us"]
            line = (f"  unprofiled Tround {m['unprofiled_round_us']:,.0f} µs; under the profiler rounds took "
                    f"{abs(ex):,.0f} µs {'longer' if ex >= 0 else 'less'}")
            k = m.get("kappa_explained_us")
            if k is not None and m["profiler_excess_us"] > 0 and k <= m["profiler_excess_us"]:
                line += f", of which κ·ΣN (graph-node instrumentation) explains {k:,.0f} µs ({k / m['profiler_excess_us']:.0%})"
            elif k is not None:
                line += (f"; κ·ΣN = {k:,.0f} µs of graph-node instrumentation per round, more than that: the rest "
                         "overlapped GPU work")
            parts.append(line)
    if res["warnings"]:
        parts += ["", "Warnings:"] + [f"  - {w}" for w in res["warnings"]]
    return "\n".join(parts)  # every string from res was escaped above


def rounds_not_found(res: dict, trace_path: str, round_name: str) -> str | None:
    """The error line when ``--rounds NAME`` was given on the command line and the trace has fewer than two
    annotations named NAME (or NAME_<n>): the round model it asked for is absent (the default name may be absent:
    most traces are not from the runtime). None when there is nothing to say."""
    ctx = click.get_current_context(silent=True)
    explicit = ctx is not None and ctx.get_parameter_source("round_name") != click.core.ParameterSource.DEFAULT
    if explicit and res.get("devices") and not res.get("rounds"):
        return (f"{trace_path}: fewer than two annotations named {round_name!r} (or {round_name}_<n>) on the analysed "
                "device's rank: no verify rounds to model (--rounds)")
    return None


def sidecar_or_warn(trace_path: str, trace=None, window: str | None = None, notes: list | None = None,
                    label: str = "") -> dict | None:
    """The capture sidecar next to ``trace_path`` (:func:`gaptrace.capture.read_sidecar_checked`), or None; one
    ``gaptrace: warning:`` line on stderr when one is there but cannot be used (not JSON, nested too deeply, not an
    object, a bad analysis_window, or, given the loaded ``trace``, what :func:`check_sidecar` refuses), or when some
    of its fields will be skipped: the analysis goes on without it (or them). The same line, without the
    ``gaptrace: warning:`` prefix, is appended to ``notes`` when given (the ``warnings`` of ``--json`` output, so
    a CI that reads only the JSON learns it too). ``label`` ("A: ", "B: ") starts the line (diff's two traces)."""
    import os

    from gaptrace.capture import read_sidecar_checked, sidecar_path

    side, why = read_sidecar_checked(trace_path)
    fields = None
    if side is not None and trace is not None:
        side, why, fields = check_sidecar(side, trace, window, sidecar_path(os.fspath(trace_path).rstrip("/")))
    line = f"capture sidecar ignored: {why}" if why is not None else fields
    if line is not None:
        line = label + line
        click.echo(f"gaptrace: warning: {escape_line(line)}", err=True)
        if notes is not None:
            notes.append(clean_text(line))
    return side


def check_sidecar(side: dict, trace, window: str | None, path: str) -> tuple[dict | None, str | None, str | None]:
    """A read sidecar checked against the loaded ``trace`` (analyze, diff and report): (sidecar, None, fields) to
    use it, where ``fields`` is None or one line naming the fields the analyses skip
    (:func:`gaptrace.capture.sidecar_field_problems`; at most 4 named, then a count); (None, why, None) when its
    analysis_window names no annotation in the trace (:func:`sidecar_window_problem`): it describes another capture,
    so its τ and round times are not this trace's, whatever ``window`` the user analyses."""
    from gaptrace.capture import sidecar_field_problems

    why = sidecar_window_problem(side, trace, path)
    if why is not None:
        if window is not None and window == side.get("analysis_window"):
            return None, None, None  # the user's window is the same missing name: its error line says it all
        return None, why, None
    bad = sidecar_field_problems(side)
    more = f" and {len(bad) - 4} more" if len(bad) > 4 else ""
    return side, None, (f"capture sidecar fields skipped: {', '.join(bad[:4])}{more}" if bad else None)


def sidecar_window_problem(sidecar: dict, trace, path: str) -> str | None:
    """One line when the sidecar's ``analysis_window`` names no annotation in ``trace`` (the sidecar then describes
    another capture); None when it is absent or found."""
    named = sidecar.get("analysis_window")
    if not isinstance(named, str):
        return None
    ua = trace.host.loc[trace.host["cat"] == "user_annotation", "name"]
    if (ua == named).any():
        return None
    return (f"{path}: the capture sidecar's analysis_window {json.dumps(named)[:80]} names no annotation in the "
            "trace (a sidecar of another capture?)")


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


@click.command()
@click.argument("trace_path", metavar="TRACE")
@click.option("--window", default=None, metavar="NAME",
              help="Analyse the span of the annotations (record_function / NVTX ranges) with this name. Default: "
                   "the capture sidecar's analysis_window (the profiled rounds) when TRACE.gaptrace.json names one, "
                   "else first to last device activity.")
@click.option("--device", type=int, default=None, help="Device for gap attribution (default: the busiest).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.option("--rounds", "round_name", default="round", show_default=True, metavar="NAME",
              help="Annotation that marks one verify round (also matches NAME_<n>).")
@click.option("--top", type=click.IntRange(1), default=15, show_default=True, help="Rows per text table.")
@memory_limit_option
def analyze(trace_path: str, window: str | None, device: int | None, as_json: bool, round_name: str,
            top: int, memory_limit_gb: float | None) -> None:
    """Occupancy, idle-gap attribution, blocking syncs and graph-launch fit of TRACE (.json, .json.gz or a
    directory of per-rank files). Bad input, or a trace with no GPU activity: one error line, exit code 2, nothing on
    stdout (``run_analysis`` still gives the host-side analyses of such a trace to the API)."""
    from gaptrace import load_trace
    from gaptrace.cli import fail, memory_limit_bytes

    try:
        trace = load_trace(trace_path, memory_limit_bytes=memory_limit_bytes(memory_limit_gb))
        notes: list[str] = []  # the sidecar's warning (stderr), also in --json's warnings
        res = run_analysis(trace, window=window, device=device,
                           sidecar=sidecar_or_warn(trace_path, trace, window, notes), round_name=round_name)
    except TraceError as e:
        fail(str(e))
    if not res["devices"]:
        fail(no_gpu_message(trace_path, trace.warnings))
    if (msg := rounds_not_found(res, trace_path, round_name)) is not None:
        fail(msg)
    if as_json:
        res["warnings"] = notes + res["warnings"]
        click.echo(dumps_json(res))
    else:
        click.echo(render_text(res, top))
