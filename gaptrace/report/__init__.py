"""``gaptrace report``: one self-contained offline HTML file that explains where a trace's GPU idle time went.

Sections, in reading order: the verdict with the cause whose fix buys most, that fix and its predicted saving (a
block of its own, the first screen); what fixing each finding buys (the predicted unprofiled round under each
fix, chart and table); the headline findings in words (the device-side and node-bubble explanations among them); per-device occupancy; occupancy over
time as a busy-fraction strip with the annotation (NVTX / record_function) ranges below it; gap attribution as an
icicle of the gap-clipped host stacks plus a table of self and inclusive idle; the blocking syncs with their call
sites; the graph-launch fit with the capture's unprofiled launch costs beside it; per-round timings when the
analysis has them; the trace's integrity warnings.

The numbers come from :func:`gaptrace.analyses.summary.summarize` (its ``to_json()``, the JSON of
``gaptrace analyze --json``); the capture sidecar is read and checked by :mod:`gaptrace.sidecar`; the report only
adds views that need the trace itself (time bins, annotation lanes, the stack tree, launch points).
Every string from the trace or the sidecar is escaped (see :mod:`gaptrace.report.html` and
:func:`gaptrace.report.charts.esc`).
"""
from __future__ import annotations

import datetime as _dt
import os
from typing import Any

import numpy as np
import pandas as pd

from gaptrace.analyses.gaps import event_idle
from gaptrace.analyses.launch_fit import launch_points
from gaptrace.analyses.occupancy import busy_fraction_bins, resolve_device
from gaptrace.outputs import named_inputs, write_text_atomic
from gaptrace.sidecar import Sidecar, as_sidecar, median_period_ms
from gaptrace.trace import Trace, TraceError

from . import charts
from .html import fmt_ms, fmt_pct, fmt_us, h, kv_table, page, table
from .lanes import annotation_lanes
from .stacks import idle_stack_tree

__all__ = ["render_report", "write_report", "find_sidecar", "load_sidecar", "N_BINS"]

N_BINS = 1500  # strip resolution: exact busy fraction per bin, enough for a 1,500-px-wide screen


# ---------------------------------------------------------------------------------------------- sidecar
def find_sidecar(trace_path: str) -> str | None:
    """The capture sidecar next to a trace (:func:`gaptrace.sidecar.sidecar_path`: ``X.json.gz`` ->
    ``X.gaptrace.json``), or None when there is none."""
    from gaptrace.sidecar import sidecar_path

    p = sidecar_path(os.fspath(trace_path).rstrip("/"))
    return p if os.path.isfile(p) else None


def load_sidecar(path: str) -> dict:
    """Read a capture sidecar (a JSON object, :func:`gaptrace.sidecar.sidecar_problem`). Raises TraceError (one line
    naming the file) if it is unreadable or unusable."""
    from gaptrace.sidecar import load_sidecar_checked

    data, why = load_sidecar_checked(path)
    if why is not None:
        raise TraceError(why)
    return data


# ---------------------------------------------------------------------------------------------- data
def _points_from_analysis(fit: dict | None) -> pd.DataFrame | None:
    pts = (fit or {}).get("points")
    if not pts:
        return None
    if isinstance(pts, dict) and {"nodes", "host_us"} <= set(pts):
        return pd.DataFrame({"nodes": pts["nodes"], "host_us": pts["host_us"]})
    if isinstance(pts, list) and isinstance(pts[0], dict):
        df = pd.DataFrame(pts)
        ycol = next((c for c in ("host_us", "dur_us", "us") if c in df), None)
        return df.rename(columns={ycol: "host_us"})[["nodes", "host_us"]] if "nodes" in df and ycol else None
    if isinstance(pts, list) and isinstance(pts[0], (list, tuple)):
        a = np.asarray(pts, dtype=float)
        return pd.DataFrame({"nodes": a[:, 0], "host_us": a[:, 1]})
    return None


def _device_rows(trace: Trace, dev: dict) -> pd.DataFrame:
    d = trace.device
    m = d["device"] == int(dev.get("device", -1))
    if "rank" in dev:
        m &= d["rank"] == int(dev["rank"])
    return d[m]


def _window(trace: Trace, dev: dict) -> tuple[float, float]:
    rows = _device_rows(trace, dev)
    t0 = dev.get("window_start_us")
    t1 = dev.get("window_end_us")
    if t0 is None:
        t0 = float(rows["ts_us"].min()) if len(rows) else 0.0
    if t1 is None:
        t1 = float(rows["end_us"].max()) if len(rows) else float(t0)
    return float(t0), float(t1)


# ---------------------------------------------------------------------------------------------- sections
def _saves(f: dict) -> str:
    """A finding's predicted saving as text (:func:`gaptrace.analyses.savings.saving_text`), "–" without one."""
    from gaptrace.analyses.savings import saving_text

    return saving_text(f) or (f.get("saving_note") or "–")


def _verdict(analysis: dict) -> str:
    """The first screen: the rounds' verdict, the cause whose fix buys most, that fix and its predicted saving
    (the replay model, :mod:`gaptrace.analyses.savings`), in one block of its own."""
    wi = analysis.get("whatif") or {}
    summary = ((analysis.get("rounds") or {}).get("summary") or {}) if isinstance(analysis.get("rounds"), dict) else {}
    pred, prof, meas = (wi.get("predicted_unprofiled_round_us"), wi.get("profiled_round_us"),
                        wi.get("measured_unprofiled_round_us"))
    out = ['<section class="verdict" id="verdict">']
    lead = (analysis.get("headline") or [""])[0] if analysis.get("verdict") else ""
    if lead:  # the steps' verdict with the figure behind it (analyses/verdicts.py), the step used named
        line = (f"<b>Verdict</b> {h(lead[len('verdict '):])}" if lead.startswith("verdict ")
                else f"<b>Verdict:</b> {h(lead)}")
    elif summary.get("verdict"):
        line = f"<b>Verdict:</b> {h(summary['verdict'])}" + (f", {h(summary['bound'])}-bound" if summary.get("bound")
                                                            else "")
    else:
        line = "<b>Verdict:</b> no verify rounds annotated: no round to predict savings on"
    if summary.get("verdict") and lead:
        line += f"; the round model: {h(summary['verdict'])}" + (f", {h(summary['bound'])}-bound"
                                                                if summary.get("bound") else "")
    out.append(f'<p class="verdict-line">{line}.</p>')
    steps = (analysis.get("verdict") or {}).get("steps") or []
    if steps:  # the verdict of every step, with the figure behind it
        rows = [(h(r.get("step")), h(str(r.get("verdict", "")).replace("_", "-")), h(fmt_ms(r.get("step_us"))),
                 h(fmt_pct(r.get("gpu_busy_share"))), h(r.get("figure", ""))) for r in steps[:200]]
        out.append(f"<details><summary>per step ({len(steps)})</summary>"
                   + table([("step", "num"), ("verdict", ""), ("step (ms)", "num"), ("GPU busy", "num"),
                            ("figure", "")], rows, raw_cols=range(5)) + "</details>")
    found = analysis.get("findings") or []
    top = next((f for f in found if f.get("saving_us") is not None), None)
    from gaptrace.analyses.savings import FOLD_SHARE, saving_headline

    saturated = next((x for x in analysis.get("headline") or [] if "the GPU was saturated" in x), None)
    if saturated:
        out.append(f'<p class="verdict-cause"><b>{h(saturated)}</b></p>')
    elif top is not None and (top.get("saving_share") or 0) >= FOLD_SHARE:
        out.append(f'<p class="verdict-cause"><b>Buys most:</b> {h(top.get("summary", ""))}</p>')
        out.append(f'<p class="verdict-fix"><b>Fix:</b> {h(top.get("fix") or "")}</p>')
        out.append(f'<p class="verdict-saving"><b>Predicted saving:</b> {h(saving_headline(found, wi) or "")}</p>')
    elif pred is not None:
        out.append(f'<p class="verdict-cause">{h(saving_headline(found, wi) or "")}</p>')
    elif found:
        out.append(f'<p class="verdict-cause"><b>First finding:</b> {h(found[0].get("summary", ""))}</p>')
        if found[0].get("fix"):
            out.append(f'<p class="verdict-fix"><b>Fix:</b> {h(found[0]["fix"])}</p>')
    else:
        out.append('<p class="empty">no findings</p>')
    out.append("</section>")
    return "\n".join(out)


def _buys(analysis: dict, figures: dict) -> str:
    """"What fixing it buys": the predicted unprofiled round under each finding's fix (chart and table)."""
    wi = analysis.get("whatif") or {}
    pred = wi.get("predicted_unprofiled_round_us")
    head = ('<h2 id="buys">What fixing it buys</h2><p class="how">Each finding\'s cause removed in the replay '
            "model (docs/DESIGN.md, The replay model): the predicted unprofiled round after its fix, against the predicted round "
            "as it is (dashed). Idle share = of the profiled GPU-idle time, a secondary figure: shares of one idle "
            "total overlap across kinds and do not add up.</p>")
    found = analysis.get("findings") or []
    if pred is None or not found:
        return head + '<p class="empty">no round to predict savings on (no verify rounds annotated)</p>'
    rows = [(f"{f.get('kind', '')}: {f.get('cause') or '(no fix)'}",
             pred - f["saving_us"], f["saving_us"]) for f in found if f.get("saving_us") is not None]
    if rows:
        figures["fig-buys"] = charts.savings_figure(rows, pred, wi.get("measured_unprofiled_round_us"))
    body = []
    for f in found:
        s = f.get("saving_us")
        body.append((str(f.get("kind", "")).replace("_", " "), f.get("cause") or "–",
                     fmt_ms(s) if s is not None else "–", fmt_pct(f.get("saving_share")),
                     fmt_ms(f.get("one_off_saving_us")) if s is not None else "–",
                     fmt_pct(f.get("idle_share")), f.get("fix") or f.get("saving_note") or "not a fix"))
    cal = wi.get("calibration") or {}
    return (head + ('<div class="chart" id="fig-buys"></div>' if rows else "")
            + table([("finding", ""), ("cause removed", "frame"), ("saves (ms a round)", "num"),
                     ("of the round", "num"), ("one-off (ms)", "num"), ("idle share", "num"), ("fix", "")], body)
            + f'<p class="how">Calibration: {h(cal.get("source", ""))} ({h(cal.get("measured_on", ""))}).</p>')


def _headline(analysis: dict) -> str:
    lines = analysis.get("headline") or [f.get("summary", "") for f in analysis.get("findings") or []][:3]
    if isinstance(lines, str):
        lines = [lines]
    from gaptrace.analyses.savings import saving_headline

    said = saving_headline(analysis.get("findings") or [], analysis.get("whatif") or {})
    first = set()
    if analysis.get("verdict") and lines:
        first.add(lines[0])  # the verdict line
    lines = [x for x in lines if x != said and x not in first and not x.startswith("fix: ")
             and "the GPU was saturated" not in x]  # on the first screen already
    out = ['<section class="headline" id="headline">']
    out += [f"<p>{h(line)}</p>" for line in lines if line] or ['<p class="empty">no findings</p>']
    findings = analysis.get("findings") or []
    if findings:
        out.append('<ul class="findings">')
        for f in findings:
            out.append(f'<li><span class="kind">{h(str(f.get("kind", "")).replace("_", " "))}</span>'
                       f'{h(f.get("summary", ""))}</li>')
        out.append("</ul>")
    out.append("</section>")
    return "\n".join(out)


def _devices(analysis: dict) -> str:
    devs = analysis.get("devices") or []
    rows = [(d.get("device"), d.get("name", ""), fmt_ms(d.get("window_us")), fmt_ms(d.get("busy_us")),
             fmt_ms(d.get("idle_us")), fmt_pct(d.get("occupancy")), d.get("gaps", "–")) for d in devs]
    return ('<h2 id="occupancy">Occupancy</h2><p class="how">Busy = the union of kernel, memcpy and memset '
            "intervals over all streams; occupancy = busy time / window.</p>"
            + table([("device", "num"), ("name", ""), ("window (ms)", "num"), ("busy (ms)", "num"),
                     ("idle (ms)", "num"), ("occupancy", "num"), ("idle gaps", "num")], rows))


def _timeline(trace: Trace, analysis: dict, figures: dict) -> str:
    devs = analysis.get("devices") or []
    head = ('<h2 id="timeline">Occupancy over time</h2><p class="how">Busy fraction of each device in '
            f"{N_BINS:,} equal time bins over the window (exact, not sampled); below it the annotation ranges "
            "(NVTX / record_function), one lane per source and nesting depth; zoom with the mouse.</p>")
    if not devs:
        return head + '<p class="empty">no device activity in this trace: no occupancy strip</p>'
    windows = [_window(trace, d) for d in devs[:8]]
    t0, t1 = min(w[0] for w in windows), max(w[1] for w in windows)
    strips = []
    for d in devs[:8]:
        key = (int(d["rank"]), int(d["device"])) if "rank" in d else int(d["device"])
        label = f"GPU {d['device']}" + (f" (rank {d['rank']})" if int(d.get("rank", 0)) else "")
        strips.append((label, busy_fraction_bins(trace, key, N_BINS, window=(t0, t1))))
    lanes = annotation_lanes(trace.host, trace.gpu_annotations, t0, t1, N_BINS)
    figures["fig-timeline"] = charts.occupancy_figure(strips, lanes, t0, t1)
    merged = int((lanes["count"] > 1).sum()) if len(lanes) else 0
    note = (f'<p class="how">{merged:,} bars merge neighbouring ranges (hover for counts).</p>' if merged else "")
    return head + '<div class="chart" id="fig-timeline"></div>' + note


def _gaps(trace: Trace, analysis: dict, figures: dict, device: int | None) -> str:
    devs = analysis.get("devices") or []
    out = ['<h2 id="gaps">Where the idle time went</h2><p class="how">Each idle gap is charged to the host '
           "frames open during it, clipped to the gap: to the innermost frame (self) and to every enclosing "
           "frame (inclusive), on every host thread. The icicle is the stack tree by frame path (click a box to "
           "zoom in); the table aggregates by frame.</p>"]
    if devs:
        key = resolve_device(trace, device)  # the analysed device (default the busiest), as the table's
        d = next((x for x in devs if int(x.get("device", -1)) == key[1] and int(x.get("rank", key[0])) == key[0]),
                 devs[0])
        tree = idle_stack_tree(event_idle(trace, key, _window(trace, d), host_wait_only=True, exclude_parked=True))
        if len(tree.nodes):
            figures["fig-icicle"] = charts.icicle_figure(tree)
            out.append(f'<p class="how">Stack tree for GPU {h(key[1])}: {fmt_ms(tree.total_idle_us)} ms idle in '
                       "the window. Box width = idle under the frame (each instant counted once per thread); "
                       'colour = idle with this frame innermost.</p><div class="chart" id="fig-icicle"></div>')
    sites = analysis.get("idle_sites") or []
    if sites:
        out.append('<p><b>By call site</b>: idle charged to the innermost host frame with a source file open at each '
                   "moment (with the ops, runtime calls and built-ins it called).</p>"
                   + table([("site", "frame"), ("idle (ms)", "num"), ("share of idle", "num")],
                           [(x.get("site", ""), fmt_ms(x.get("idle_us")), fmt_pct(x.get("share")))
                            for x in sites[:20]]))
    from gaptrace.analyses.gaps import frame_table

    frames, folded = frame_table(analysis.get("gap_attribution") or [], "self")
    out.append("<p><b>By frame</b>: every frame, self and inclusive, by self idle (where the host itself was)"
               + (f"; {folded} wrapper frame{'s' if folded != 1 else ''} with no self idle (runpy, click, a thread's "
                  "bootstrap, &lt;module&gt;) folded away" if folded else "") + ".</p>")
    rows = [(f.get("frame", ""), fmt_ms(f.get("self_idle_us")), fmt_ms(f.get("inclusive_idle_us")),
             fmt_pct(f.get("share")), f.get("gaps", "–")) for f in frames[:40]]
    out.append(table([("frame", "frame"), ("self idle (ms)", "num"), ("inclusive idle (ms)", "num"),
                      ("share of idle", "num"), ("gaps", "num")], rows))
    return "\n".join(out)


def _syncs(analysis: dict) -> str:
    rows = []
    for s in (analysis.get("blocking_syncs") or [])[:40]:
        stack = s.get("stack") or []
        if isinstance(stack, str):
            stack = [stack]
        site = h(s.get("site", "")) or '<span class="empty">no Python frame</span>'
        if stack:
            site = f"<details><summary>{site}</summary><pre>{h(chr(10).join(map(str, stack)))}</pre></details>"
        call = h(s.get("call", "")) + (f" + {h(s['sync_call'])}" if s.get("sync_call") else "")
        rows.append((call, h(s.get("aten_op") or ""), site, h(s.get("count", "")),
                     h(fmt_ms(s.get("blocked_us"))), h(fmt_us(s.get("mean_blocked_us"))),
                     h(fmt_us(s.get("max_blocked_us"))), h(fmt_ms(s.get("idle_during_us"))),
                     h(fmt_ms(s.get("idle_after_us"))),
                     h(fmt_pct(s.get("idle_share"))), h(fmt_pct(s.get("device_busy_during")))))
    return ('<h2 id="syncs">Blocking syncs</h2><p class="how">Host calls that waited for the device, by call site '
            "(innermost Python frame with a source file; expand for the stack). Blocked = host time beyond the "
            "device op's own duration; idle under = device idle while the call ran; idle after = device idle from the "
            "call's end to the next device work (the serialized tail); a finding counts both, under + after; device busy = the device's own work while the host waited (low: the host waited on "
            "latency, not work).</p>"
            + table([("call", "frame"), ("ATen op", "frame"), ("call site", "frame"), ("count", "num"),
                     ("blocked (ms)", "num"), ("mean (µs)", "num"), ("max (µs)", "num"),
                     ("idle under (ms)", "num"), ("idle after (ms)", "num"), ("after: share of idle", "num"),
                     ("device busy during", "num")],
                    rows, raw_cols=range(11)))


def _node_bubbles(analysis: dict) -> str:
    """The device-side bubbles between two nodes of one graph launch, by the kernel pair at the boundary
    (``node_bubbles`` of :func:`gaptrace.analyses.summary.summarize`); nothing when the trace has none."""
    pairs = [r for r in analysis.get("node_bubbles") or [] if (r.get("idle_us") or 0.0) >= 0.5]  # no 0 µs rows
    if not pairs:
        return ""
    from gaptrace.analyses.occupancy import short_kernel_name

    def name(n: str) -> str:
        return f'<span title="{h(n)}">{h(short_kernel_name(n))}</span>'

    rows = [(name(str(r.get("before", ""))), name(str(r.get("after", ""))), h(r.get("gaps", "")),
             h(fmt_ms(r.get("idle_us"))), h(fmt_us(r.get("median_us"), 3)), h(fmt_us(r.get("max_us"), 3)),
             h(fmt_pct(r.get("share")))) for r in pairs[:40]]
    split = analysis.get("idle_split") or {}
    return ('<h2 id="bubbles">Bubbles between graph nodes</h2><p class="how">Device-side idle between two nodes of '
            f"one CUDA-graph launch ({h(fmt_ms(split.get('graph_node_us')))} ms in "
            f"{h(split.get('graph_node_gaps', ''))} gaps), by the kernel pair at the boundary (hover a name for the "
            "full one): no host change removes these; fusing the two kernels into one node, or launching the second "
            "with programmatic dependent launch, does. Share = of all node-bubble idle.</p>"
            + table([("before", "frame"), ("after", "frame"), ("gaps", "num"), ("idle (ms)", "num"),
                     ("median (µs)", "num"), ("max (µs)", "num"), ("share", "num")], rows, raw_cols=range(7)))


def _sidecar_graphs(sidecar: Sidecar | None) -> pd.DataFrame | None:
    """The sidecar's usable graphs (:attr:`gaptrace.sidecar.Sidecar.graphs`, the launch fit's rule) as columns
    name, nodes, unprofiled_launch_us (µs); None without a sidecar."""
    if sidecar is None:
        return None
    rows = sidecar.graphs
    return pd.DataFrame({"name": [g.name for g in rows], "nodes": [g.nodes for g in rows],
                         "unprofiled_launch_us": [g.unprofiled_launch_us for g in rows]})



def _interval(ci) -> str:
    """``[low, high]`` (µs per node) as text; "–" when absent."""
    if not ci or None in ci:
        return "–"
    return f"{fmt_us(ci[0], 3)} – {fmt_us(ci[1], 3)}"

def _launch_fit(trace: Trace, analysis: dict, sidecar: Sidecar | None, figures: dict) -> str:
    fit = analysis.get("launch_fit")
    out = ['<h2 id="launch-fit">Graph-launch fit</h2><p class="how">Host time of each cudaGraphLaunch against N, '
           "the device activities it launched, with a robust affine fit t(N) = t0 + κN. Under the profiler κ is "
           "mostly CUPTI instrumenting each node; the capture's unprofiled launch costs, when present, show what "
           "the launch costs without it.</p>"]
    points = _points_from_analysis(fit)
    if points is None:
        pts, _ = launch_points(trace)
        points = pd.DataFrame({"nodes": pts["nodes"], "host_us": pts["dur_us"]})
    unprof = _sidecar_graphs(sidecar)
    if not fit and not len(points) and (unprof is None or not len(unprof)):
        out.append('<p class="empty">no CUDA graph launches in this trace</p>')
        return "\n".join(out)
    if len(points) > 5000:  # every k-th point keeps the shape, and the report small
        points = points.iloc[:: int(np.ceil(len(points) / 5000))]
    figures["fig-launch"] = charts.launch_fit_figure(points, fit, unprof)
    side = []
    if fit:
        side.append(kv_table([("launches", f"{fit.get('launches', '–')}"),
                              ("κ (µs per node)", fmt_us(fit.get("kappa_us_per_node"), 3)),
                              ("κ, 95% bootstrap interval", _interval(fit.get("kappa_interval_us_per_node"))),
                              ("t0 (µs)", fmt_us(fit.get("t0_us"))), ("R²", fmt_us(fit.get("r2"), 4))]))
        g = fit.get("graphs") or []
        side.append(table([("N", "num"), ("launches", "num"), ("median host (µs)", "num")],
                          [(x.get("nodes"), x.get("launches"), fmt_us(x.get("median_us"))) for x in g]))
    if unprof is not None and len(unprof):
        k = (fit or {}).get("kappa_us_per_node")
        t0 = (fit or {}).get("t0_us")
        med = {int(x["nodes"]): x.get("median_us") for x in ((fit or {}).get("graphs") or []) if "nodes" in x}
        rows = []
        for r in unprof.itertuples():
            prof = med.get(int(r.nodes))
            if prof is None and k is not None and t0 is not None:
                prof = float(t0) + float(k) * float(r.nodes)
            ratio = f"{float(prof) / r.unprofiled_launch_us:,.1f}×" if prof and r.unprofiled_launch_us > 0 else "–"
            rows.append((r.name, int(r.nodes), fmt_us(r.unprofiled_launch_us), fmt_us(prof), ratio))
        side.append("<p><b>Unprofiled launch cost (capture sidecar)</b></p>"
                    + table([("graph", "frame"), ("N", "num"), ("unprofiled (µs)", "num"),
                             ("profiled (µs)", "num"), ("inflation", "num")], rows))
    out.append('<div class="row"><div class="chart" id="fig-launch"></div><div>' + "".join(side) + "</div></div>")
    return "\n".join(out)


_ROUND_COLS = [  # (normalised key candidates, header, formatter)
    (("round", "index", "name"), "round", str),
    (("troundus", "roundus", "periodus"), "Tround (ms)", fmt_ms),
    (("tgpuus", "gpuus"), "TGPU (ms)", fmt_ms),
    (("thostus", "hostus"), "Thost (ms)", fmt_ms),
    (("tserialus", "serialus"), "Tserial (ms)", fmt_ms),
    (("blockedus",), "blocked (ms)", fmt_ms),
    (("launchnodes",), "graph nodes", lambda v: fmt_us(v, 0)),
    (("tau", "acceptlength"), "τ", lambda v: fmt_us(v, 2)),
    (("tpotus",), "TPOT (ms)", fmt_ms),
]


def _norm_round(r: dict, side_tau: float | None) -> dict:
    """A round's fields keyed without underscores and in lower case; τ from the sidecar's round (``side_tau``,
    usable by the analysis' own rule, or None) when the analysis has none; TPOT = Tround / τ when missing."""
    norm = {k.replace("_", "").lower(): v for k, v in r.items()}
    if norm.get("tau") is None and side_tau is not None:
        norm["tau"] = side_tau
    if norm.get("tpotus") is None:
        try:
            norm["tpotus"] = float(norm["troundus"]) / float(norm["tau"])
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            pass
    return norm


def _rounds(analysis: dict, sidecar: Sidecar | None, figures: dict) -> str:
    head = ('<h2 id="rounds">Verify rounds</h2><p class="how">Per annotated round (period = start to next start): '
            "Tround = the period, TGPU = device busy in it, Tserial = device idle in it (Tround = TGPU + Tserial), "
            "Thost = host dispatch time (the round range minus its blocked syncs), τ = tokens emitted (accepted "
            "prefix + bonus), TPOT = Tround / τ. Overlapped scheduling gives Tround ≈ max(TGPU, Thost); a sync "
            "gives Tround ≈ TGPU + Tserial. A change wins only if ΔTround/Tround > Δτ/τ.</p>")
    rr = analysis.get("rounds")
    rounds = rr.get("rounds") if isinstance(rr, dict) else rr
    if not rounds:
        return head + ('<p class="pending">No per-round analysis for this trace: it needs one host annotation per '
                       'verify round (a range named "round" or "round_&lt;n&gt;", or the name given to '
                       "<code>--rounds</code>).</p>")
    side_taus = sidecar.round_record_taus if sidecar is not None else ()
    norm = [_norm_round(r, side_taus[i] if i < len(side_taus) else None)
            for i, r in enumerate(r for r in rounds if isinstance(r, dict))]
    out = [head]
    summary = rr.get("summary") if isinstance(rr, dict) else None
    if isinstance(summary, dict) and summary:
        sm = _norm_round(summary, None)
        verdict = summary.get("verdict")
        bound = summary.get("bound")
        line = [f"{h(summary.get('rounds', len(norm)))} rounds (annotation {h(summary.get('annotation', 'round'))})"]
        if verdict:
            line.append(f"<b>{h(verdict)}</b>" + (f", {h(bound)}-bound" if bound else ""))
        line.append(f"mean Tround {fmt_ms(sm.get('troundus'))} ms = TGPU {fmt_ms(sm.get('tgpuus'))} + Tserial "
                    f"{fmt_ms(sm.get('tserialus'))} ms; Thost {fmt_ms(sm.get('thostus'))} ms")
        wo = summary.get("without_outliers")
        if isinstance(wo, dict) and wo.get("t_round_us") is not None:  # the means above keep the outliers
            line.append(f"without the outlier round(s) {h(', '.join(map(str, wo.get('left_out') or [])))}: mean "
                        f"Tround {fmt_ms(wo.get('t_round_us'))} ms = TGPU {fmt_ms(wo.get('t_gpu_us'))} + Tserial "
                        f"{fmt_ms(wo.get('t_serial_us'))} ms; Thost {fmt_ms(wo.get('t_host_us'))} ms")
        if sm.get("tau") is not None:
            line.append(f"τ {fmt_us(sm.get('tau'), 2)}, TPOT {fmt_ms(sm.get('tpotus'))} ms")
        if summary.get("unprofiled_round_us") is not None:
            ex = summary.get("profiler_excess_us")
            if isinstance(ex, (int, float)) and ex < 0:
                # shorter under the profiler: no profiler cost can do that; the measured rounds are not like these
                line.append(f"unprofiled Tround {fmt_ms(summary.get('unprofiled_round_us'))} ms: the profiled rounds "
                            f"took {fmt_ms(-ex)} ms less, so the two sets of rounds differ (other positions, a "
                            "one-off) and no profiler cost can be read from them")
            else:
                line.append(f"unprofiled Tround {fmt_ms(summary.get('unprofiled_round_us'))} ms: the profiler adds "
                            f"{fmt_ms(ex)} ms per round, κ·ΣN explains "
                            f"{fmt_ms(summary.get('kappa_explained_us'))} ms of it")
        out.append("<p>" + "; ".join(line) + ".</p>")
    figures["fig-rounds"] = charts.rounds_figure(norm)
    out.append('<div class="chart" id="fig-rounds"></div>')
    rows = []
    for r in norm:
        rows.append(["–" if next((r[k] for k in keys if k in r), None) is None
                     else f(next(r[k] for k in keys if k in r)) for keys, _, f in _ROUND_COLS])
    out.append(table([(t, "num") for _, t, _ in _ROUND_COLS], rows))
    return "\n".join(out)


def _summary(v: Any) -> Any:
    """A list of numbers as "n values: median, min, max"; anything else unchanged."""
    if isinstance(v, list) and v and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        try:
            a = np.asarray(v, dtype=float)
        except OverflowError:  # an integer no float holds (untrusted sidecar): shown as it is
            return v
        ok = a[np.isfinite(a)]
        left = f" ({len(a) - len(ok)} not finite, left out)" if len(ok) < len(a) else ""
        if not len(ok):
            return f"{len(a)} values, none finite"
        return f"{len(a)} values: median {np.median(ok):,.3f}, min {ok.min():,.3f}, max {ok.max():,.3f}{left}"
    return v


def _sidecar_section(side: Sidecar | None, sidecar_path: str | None) -> str:
    """The "Capture" section: the sidecar as read (``raw``), its config first; "" without a sidecar."""
    sidecar = side.raw if side is not None else None
    if not sidecar:
        return ""
    out = [f'<h2 id="capture">Capture</h2><p class="how">From the capture sidecar {h(sidecar_path or "")}.</p>']
    # the medians of the periods the sidecar reader accepts (gaptrace.sidecar.median_period_ms), as analyze and
    # whatif use them
    mp, mu = (median_period_ms(x) if isinstance(x, list) else None
              for x in (sidecar.get("profiled_step_ms"), sidecar.get("unprofiled_step_ms")))
    if mp is not None and mu is not None:  # usable periods: finite, at least PERIOD_MIN_MS
        what = (f"the profiler adds {h(f'{mp - mu:,.3f}')} ms per step ({h(fmt_pct((mp - mu) / mu))})"
                if mp >= mu else
                f"the profiled steps took {h(f'{mu - mp:,.3f}')} ms less, so the two sets of steps differ (other "
                "positions, a one-off) and no profiler cost can be read from them")
        out.append(f"<p>Median step: {h(f'{mp:,.3f}')} ms profiled, {h(f'{mu:,.3f}')} ms unprofiled: {what}.</p>")
    config = sidecar.get("config")
    if isinstance(config, dict) and config:
        out.append("<p><b>config</b></p>" + kv_table(sorted(config.items())))
    out.append(kv_table((k, _summary(v)) for k, v in sidecar.items() if k not in ("graphs", "rounds", "config")))
    return "\n".join(out)


def _warnings(trace: Trace, analysis: dict, extra: list[str]) -> str:
    warns = list(dict.fromkeys([*(analysis.get("warnings") or []), *trace.warnings, *extra]))
    body = ("<ul class=\"warnings\">" + "".join(f"<li>{h(w)}</li>" for w in warns) + "</ul>") if warns else \
        '<p class="empty">none: the trace passed the integrity checks</p>'
    return '<h2 id="warnings">Integrity warnings</h2>' + body


def render_report(trace: Trace, analysis: dict, sidecar: Sidecar | dict | None = None, *, device: int | None = None,
                  sidecar_path: str | None = None, warnings: list[str] | None = None) -> str:
    """The report page as one HTML string (self-contained: plotly.js inlined, nothing fetched).

    ``analysis``: :meth:`gaptrace.analyses.summary.AnalysisSummary.to_json` (unknown keys ignored, missing
    sections rendered as absent). ``sidecar``: the capture sidecar (a :class:`gaptrace.sidecar.Sidecar` or its
    parsed dict) or None. ``device``: the device the
    analysis attributed idle time for (None: the busiest, as run_analysis). ``warnings``: extra lines for the
    integrity section (e.g. a sidecar that could not be read). Pure: writes nothing.
    """
    from gaptrace import __version__

    sidecar = as_sidecar(sidecar)
    figures: dict[str, dict] = {}
    name = os.path.basename(os.fspath(trace.path).rstrip("/"))
    meta = trace.metadata or {}
    versions = ", ".join(f"{k} {meta[k]}" for k in ("cuda_runtime_version", "cuda_driver_version", "cupti_version")
                         if k in meta)
    devnames = sorted({str(d.get("name") or "") for d in analysis.get("devices") or []} - {""})
    body = [
        "<header><h1>gaptrace report: why was the GPU idle?</h1>",
        f'<div class="meta">{h(trace.path)} · {h(", ".join(devnames) or "no device")}'
        f'{" · " + h(versions) if versions else ""} · generated '
        f'{h(_dt.datetime.now().strftime("%Y-%m-%d %H:%M"))} by gaptrace {h(__version__)}</div>'
        '<nav><a href="#buys">what fixing buys</a><a href="#occupancy">occupancy</a><a href="#timeline">over time</a><a href="#gaps">idle time</a>'
        '<a href="#syncs">blocking syncs</a>' + ('<a href="#bubbles">node bubbles</a>' if analysis.get("node_bubbles")
                                                  else "") + '<a href="#launch-fit">launch fit</a><a href="#rounds">rounds</a>'
        '<a href="#warnings">warnings</a></nav></header>',
        _verdict(analysis),
        _buys(analysis, figures),
        _headline(analysis),
        _devices(analysis),
        _timeline(trace, analysis, figures),
        _gaps(trace, analysis, figures, device),
        _syncs(analysis),
        _node_bubbles(analysis),
        _launch_fit(trace, analysis, sidecar, figures),
        _rounds(analysis, sidecar, figures),
        _sidecar_section(sidecar, sidecar_path),
        _warnings(trace, analysis, warnings or []),
        "<footer>Times are on the trace's own clock; fractions are shown as percentages. "
        "Definitions: the docstrings of gaptrace.analyses (occupancy, gaps, syncs, launch_fit, rounds).</footer>",
    ]
    return page(f"gaptrace: {name}", "\n".join(body), figures, __version__)


def write_report(path_in: str, path_out: str, window: str | None = None, sidecar_path: str | None = None,
                 device: int | None = None, round_name: str = "round",
                 memory_limit_bytes: int | None = None, calibration: Any = None) -> dict:
    """Load ``path_in``, analyse it (:func:`gaptrace.analyses.summary.summarize` with the sidecar, ``window``,
    ``device`` and ``round_name``), render the report and write it to ``path_out`` atomically (a temporary file in
    the same directory, then ``os.replace``). The sidecar is ``sidecar_path`` or the one :func:`find_sidecar`
    finds; an explicitly named sidecar that cannot be read is an error, an implicit one becomes a warning.
    ``memory_limit_bytes``: the loader's size guard (:func:`gaptrace.loader.load_raw`). ``calibration``: the
    replay model's profiler costs (a ``gaptrace calibrate`` file path or None: the shipped default); a file that
    cannot be used is a TraceError (one line) before anything is read or written.

    An implicit sidecar is ignored (said in "sidecar_warnings" and in the page) when it is unreadable, not a JSON
    object, its ``analysis_window`` is not a string, or (without ``window``) names no annotation in the trace; a
    named one is an error then. Either sidecar counts as an input: ``path_out`` may not be it.

    Returns {"path", "bytes", "sidecar", "sidecar_warnings"}. Raises TraceError for bad input, including a trace
    without GPU activity (nothing to report on); nothing is written then.
    """
    from gaptrace import load_trace
    from gaptrace.analyses.summary import no_gpu_message, summarize
    from gaptrace.outputs import resolve_output
    from gaptrace.sidecar import check_sidecar
    from gaptrace.sidecar import sidecar_path as implicit_sidecar

    # the inputs: the trace, the named sidecar and the one next to the trace (even when another is named: replacing
    # a capture's sidecar with HTML is never what was meant), and the calibration file
    from gaptrace.analyses.savings import resolve_calibration

    cal_file = named_inputs(calibration)  # the calibration file, when one is named: an input too
    try:
        calibration = resolve_calibration(calibration)
    except ValueError as e:
        raise TraceError(str(e)) from None
    inputs = (path_in, sidecar_path or "", implicit_sidecar(os.fspath(path_in).rstrip("/")), *cal_file)
    try:  # follow a symlink, refuse devices/FIFOs/directories, unwritable directories and the inputs
        path_out_real = resolve_output(path_out, inputs)
    except ValueError as e:
        raise TraceError(str(e)) from None
    extra: list[str] = []
    sidecar = None
    named = sidecar_path is not None
    if named:
        sidecar = load_sidecar(sidecar_path)
    else:
        sidecar_path = find_sidecar(path_in)
        if sidecar_path is not None:
            try:
                sidecar = load_sidecar(sidecar_path)
            except TraceError as e:
                extra.append(f"capture sidecar ignored: {e}")
                sidecar_path = None
    trace = load_trace(path_in, memory_limit_bytes=memory_limit_bytes)
    if trace.device.empty:
        raise TraceError(no_gpu_message(path_in, trace.warnings))  # the line analyze, diff and whatif give
    if sidecar is not None:
        sidecar, why, fields = check_sidecar(sidecar, trace, window, sidecar_path)
        if why is not None:
            if named:
                raise TraceError(why)
            extra.append(f"capture sidecar ignored: {why}")
            sidecar_path = None
        extra += [fields] if fields is not None else []
    analysis = summarize(trace, window=window, device=device, sidecar=sidecar, round_name=round_name,
                         calibration=calibration).to_json()
    text = render_report(trace, analysis, sidecar, device=device, sidecar_path=sidecar_path, warnings=extra)
    write_text_atomic(path_out_real, text, prefix=".gaptrace-report-")
    devs = analysis.get("devices") or [{}]
    label = devs[0].get("window")  # the annotation name analysed over, or "activity" / "explicit"
    return {"path": path_out, "bytes": len(text.encode("utf-8")), "sidecar": sidecar_path,
            "sidecar_warnings": [w for w in extra if w.startswith("capture sidecar ")],
            "window": label if label not in (None, "activity", "explicit") else None}
