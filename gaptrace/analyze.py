"""``gaptrace analyze``: the command, and the text it prints.

The analysis itself is :func:`gaptrace.analyses.summary.summarize` (its ``to_json()`` is what ``--json`` prints);
this module loads the trace and its capture sidecar, runs it, and renders the summary as text
(:func:`render_text`): the headline, the findings, then one table per analysis.
"""
from __future__ import annotations

import click

from gaptrace.analyses.summary import no_gpu_message, run_analysis, summarize  # noqa: F401 (run_analysis: API)
from gaptrace.cli import memory_limit_option, rounds_not_found, sidecar_or_warn, warn, nonempty
from gaptrace.text import dumps_json, escape_strings, to_jsonable  # noqa: F401 (to_jsonable: API)
from gaptrace.trace import TraceError

__all__ = ["analyze", "render_text"]


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


def _steps_text(res: dict, top: int) -> list[str]:
    """The steps section: the rule and why, the outlier steps as themselves, the step figures with and without
    them, and the verdict of each step (at most ``top`` rows)."""
    v = res.get("verdict") or {}
    st = res.get("steps") or {}
    if not v:
        return []
    if v.get("rule") == "none":
        return ["", f"Steps: none found ({v.get('reason')})"]
    m = st.get("summary") or {}
    n = int(m.get("steps") or 0)
    out = ["", f"Steps ({n} of '{v.get('step_name')}': {v.get('reason')}):"]
    if st.get("request_evidence") and st.get("holds_request") is not None:
        out.append(f"  {st['request_evidence']}")
    k = int(m.get("outliers") or 0)
    if k:
        out.append(f"  mean step {m['mean_step_us'] / 1000:,.2f} ms with the {k} outlier step{'s' if k != 1 else ''}, "
                   f"{m['mean_step_us_without_outliers'] / 1000:,.2f} ms without (median {m['median_step_us'] / 1000:,.2f} ms)")
        for line in v.get("outliers") or []:
            out.append(f"  outlier: {line}")
    rows = [dict(r, step_ms=r.get("step_us", 0) / 1000, idle_ms=(r.get("host_wait_idle_us") or 0) / 1000,
                 verdict=str(r.get("verdict", "")).replace("_", "-")) for r in v.get("steps") or []]
    out.append(_table(rows, [("step", "step", "d"), ("verdict", "verdict", "s"), ("step_ms", "step ms", ",.2f"),
                             ("gpu_busy_share", "GPU busy", ".0%"), ("idle_ms", "host-wait idle ms", ",.2f"),
                             ("eager_launches", "eager launches", "d")], top))
    return out


def render_text(res: dict, top: int = 15, frames_by: str = "self") -> str:
    """The human-readable form of an analysis (``res``: :meth:`gaptrace.analyses.summary.AnalysisSummary.to_json`): headline, findings, then the tables; the
    frame table sorted by ``frames_by`` ("self" idle, the default, or "inclusive"; :func:`gaptrace.analyses.gaps.frame_table`) with the
    program's wrapper frames folded; every non-printable character of a string in ``res`` (from trace names: ESC, BEL, a newline, ...) escaped first
    (:func:`gaptrace.text.escape_strings`), so a name cannot break a row or forge a line."""
    res = escape_strings(res)
    parts = [*res["headline"], ""]
    if res["findings"]:
        from gaptrace.analyses.savings import saving_text

        wi = res.get("whatif") or {}
        pred = wi.get("predicted_unprofiled_round_us")
        head = ("Findings, by what fixing them saves (predicted unprofiled round "
                f"{pred / 1000:.2f} ms; then the share of profiled GPU-idle time):" if pred is not None
                else "Findings (share of GPU-idle time; no round to predict savings on):")
        parts.append(head)
        for i, f in enumerate(res["findings"], 1):
            s = saving_text(f)
            if not s and pred is not None:
                s = f.get("saving_note") or "no saving: not a fix"
            parts.append(f"  {i}. [{f['kind']}] " + (f"{s}; " if s else "") + f["summary"])
        if res.get("idle_share_note"):
            parts.append(f"  ({res['idle_share_note']})")
        if pred is not None:
            cal = wi.get("calibration") or {}
            parts.append(f"  (savings: the replay model, docs/DESIGN.md 'The replay model'; profiled round "
                         f"{wi['profiled_round_us'] / 1000:.2f} ms"
                         + (f", measured unprofiled {wi['measured_unprofiled_round_us'] / 1000:.2f} ms"
                            if wi.get("measured_unprofiled_round_us") is not None else "")
                         + f"; calibration {cal.get('source')} ({cal.get('measured_on')}))")
        parts.append("")
    steps_part = _steps_text(res, top)
    if steps_part:
        parts += steps_part[1:] + [""]
    parts.append("Devices:")
    parts.append(_table(res["devices"], [("name", "device", "s"), ("device", "id", "d"), ("window_us", "window µs", ",.0f"),
                                         ("busy_us", "busy µs", ",.0f"), ("idle_us", "idle µs", ",.0f"),
                                         ("occupancy", "occupancy", ".1%"), ("gaps", "gaps", "d")], 64))
    from gaptrace.analyses.gaps import frame_table

    frames, folded = frame_table(res["gap_attribution"], frames_by)
    order = "self idle" if frames_by == "self" else "inclusive idle"
    parts += ["", f"Idle by host frame, by {order} (gap-clipped; inclusive counts each moment once per frame"
                  + (f"; {folded} wrapper frame{'s' if folded != 1 else ''} with no self idle folded: runpy, click, "
                     "thread bootstrap, <module>" if folded else "") + "):"]
    parts.append(_table(frames, [("frame", "frame", "s"), ("self_idle_us", "self µs", ",.0f"),
                                 ("inclusive_idle_us", "inclusive µs", ",.0f"),
                                 ("share", "share", ".1%"), ("gaps", "gaps", "d")], top))
    parts += ["", "Blocking syncs (per call site; idle under + after the calls, as the findings count it):"]
    idle_all = (res.get("idle_split") or {}).get("idle_us") or 0.0  # the analysed device's idle, as the findings'
    syncs = []
    for r in res["blocking_syncs"]:
        both = (r.get("idle_during_us") or 0.0) + (r.get("idle_after_us") or 0.0)
        syncs.append(dict(r, idle_under_after_share=min(both / idle_all, 1.0) if idle_all > 0 else None))
    parts.append(_table(syncs, [("call", "call", "s"), ("aten_op", "op", "s"), ("site", "site", "s"),
                                ("count", "n", "d"), ("blocked_us", "blocked µs", ",.0f"),
                                ("idle_during_us", "idle under µs", ",.0f"),
                                ("idle_after_us", "idle after µs", ",.0f"),
                                ("idle_under_after_share", "under+after share", ".1%"),
                                ("device_busy_during", "GPU busy during", ".0%")], top))
    if res.get("thread_waits"):
        parts += ["", "Waits on another thread (loop threads in a lock / condition / queue wait):"]
        parts.append(_table(res["thread_waits"], [("tid", "thread", "s"), ("kind", "kind", "s"),
                                                  ("frame", "wait frame", "s"), ("caller", "caller", "s"),
                                                  ("waits", "n", "d"), ("wait_us", "waited µs", ",.0f"),
                                                  ("gpu_idle_us", "GPU idle µs", ",.0f")], top))
    pairs = [r for r in res.get("node_bubbles") or [] if (r.get("idle_us") or 0.0) >= 0.5]  # no 0 µs rows
    if pairs:
        from gaptrace.analyses.occupancy import short_kernel_name

        rows = [dict(r, before=short_kernel_name(r["before"]), after=short_kernel_name(r["after"]))
                for r in pairs]
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
            if fit["kappa_us_per_node"] <= 0:
                parts.append("  κ <= 0: the launch time does not grow with the graph's nodes here (graph kernels "
                             "missing from the trace, or launches waiting for queue space): the κN column is the "
                             "line's value, not a cost; no finding and no prediction takes a profiler cost from it")
            if fit["r2"] is not None and fit["r2"] < 0:
                parts.append("  R² < 0: the line describes the launch times worse than their mean does")
            if fit["t0_us"] is not None and fit["t0_us"] < 0:
                parts.append("  t0 < 0: the intercept is the line extrapolated below the smallest graph, not a cost; "
                             "the launch's own cost is counted as 0 where the idle under launches is split")
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
        wo = m.get("without_outliers")
        if wo and wo.get("t_round_us") is not None:
            parts.append(f"  without the outlier round{'s' if len(wo['left_out']) != 1 else ''} "
                         f"{', '.join(map(str, wo['left_out']))} ({wo['rounds']} rounds): mean Tround "
                         f"{wo['t_round_us']:,.0f} µs = TGPU {wo['t_gpu_us']:,.0f} + Tserial {wo['t_serial_us']:,.0f}; "
                         f"Thost {wo['t_host_us']:,.0f} µs")
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



def _fleet_paths(paths: tuple[str, ...], merged: bool) -> list[tuple[int, str]] | None:
    """The (rank, file) pairs when ``paths`` name a fleet (two or more rank files: a directory of them, a glob, or
    several paths) and ``--merged`` is not given; None for the single-trace path (one file, or a directory of one
    rank file, or ``--merged``). Imports nothing of Dask."""
    import os

    if merged or (len(paths) == 1 and (os.path.isfile(paths[0]) or not os.path.exists(paths[0])
                                       and not any(c in paths[0] for c in "*?["))):
        return None
    from gaptrace.fleet import fleet_files

    files = fleet_files(list(paths))
    return files if len(files) >= 2 else None


def fleet_or_fail(paths: tuple[str, ...], merged: bool) -> list[tuple[int, str]] | None:
    """:func:`_fleet_paths` for a command: a bad path, or several paths that are not a fleet, end in one error
    line (exit 2)."""
    from gaptrace.cli import fail

    try:
        fleet = _fleet_paths(paths, merged)
    except TraceError as e:
        fail(str(e))
    if fleet is None and len(paths) > 1:
        fail("several paths name a fleet of rank files: give them without --merged (or one directory with --merged)")
    return fleet


def _single_path(paths: tuple[str, ...]) -> str:
    """The one trace of the single-trace path: the path itself, or the one file a glob matches."""
    import os

    p = paths[0]
    if not os.path.exists(p) and any(c in p for c in "*?["):
        from gaptrace.fleet import fleet_files

        return fleet_files([p])[0][1]
    return p


@click.command()
@click.argument("trace_paths", metavar="TRACE", nargs=-1, required=True)
@click.option("--window", default=None, metavar="NAME",
              help="Analyse the span of the annotations (record_function / NVTX ranges) with this name. Default: "
                   "the capture sidecar's analysis_window (the profiled rounds) when TRACE.gaptrace.json names one, "
                   "else first to last device activity.")
@click.option("--device", type=int, default=None, help="Device for gap attribution (default: the busiest).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.option("--rounds", "round_name", callback=nonempty, default="round", show_default=True, metavar="NAME",
              help="Annotation that marks one verify round (also matches NAME_<n>).")
@click.option("--top", type=click.IntRange(1), default=15, show_default=True, help="Rows per text table.")
@click.option("--frames-by", type=click.Choice(["self", "inclusive"]), default="self", show_default=True,
              help="Order of the text's frame table: by self idle (where the host itself was) or inclusive idle.")
@click.option("--calibration", callback=nonempty, default=None, metavar="FILE",
              help="Per-event profiler costs from `gaptrace calibrate` for the findings' predicted savings "
                   "(default: the shipped one measured on the trace's GPU model, else the H200 one).")
@click.option("--merged", is_flag=True,
              help="Read a directory of rank files as one multi-rank trace in this process (no fleet, no Dask).")
@click.option("--dask-scheduler", default=None, metavar="ADDRESS",
              help="Fleet: run the per-rank tasks on this existing Dask cluster (default: a LocalCluster).")
@click.option("--workers", type=click.IntRange(0, 1024), default=None, metavar="N",
              help="Fleet: LocalCluster worker processes (default: one per core; 0: one rank after the other in "
                   "this process, without Dask).")
@memory_limit_option
def analyze(trace_paths: tuple[str, ...], window: str | None, device: int | None, as_json: bool, round_name: str,
            top: int, frames_by: str, calibration: str | None, merged: bool, dask_scheduler: str | None,
            workers: int | None, memory_limit_gb: float | None) -> None:
    """Occupancy, idle-gap attribution, blocking syncs and graph-launch fit of TRACE (.json, .json.gz or a
    directory of per-rank files). Two or more rank files (a directory of them, a glob, several paths) are a fleet:
    each rank analysed alone as a Dask task, then merged with the collectives matched across ranks and the ranks
    that made the others wait (gaptrace.fleet; ``--merged`` reads the directory as one trace instead). Bad input,
    or a trace with no GPU activity: one error line, exit code 2, nothing on stdout
    (:func:`gaptrace.analyses.summary.summarize` still gives the host-side analyses of such a trace to the API)."""
    from gaptrace import load_trace
    from gaptrace.cli import fail, memory_limit_bytes

    from gaptrace.analyses.savings import resolve_calibration

    fleet = fleet_or_fail(trace_paths, merged)
    if fleet is not None:
        if device is not None:
            fail("--device picks one trace's device: a fleet analyses each rank's busiest device")
        try:
            calibration = resolve_calibration(calibration)
            from gaptrace.fleet import render_fleet_text, run_fleet
            res = run_fleet(fleet, workers=workers, scheduler=dask_scheduler,
                            memory_limit_bytes=memory_limit_bytes(memory_limit_gb), window=window,
                            round_name=round_name, calibration=calibration)
        except (TraceError, ValueError) as e:
            fail(str(e))
        click.echo(dumps_json(res) if as_json else render_fleet_text(res))
        return
    try:
        trace_path = _single_path(trace_paths)
    except TraceError as e:
        fail(str(e))
    try:
        calibration = resolve_calibration(calibration)  # a bad file fails before the trace is read
        trace = load_trace(trace_path, memory_limit_bytes=memory_limit_bytes(memory_limit_gb))
        notes: list[str] = []  # the sidecar's warning (stderr), also in --json's warnings
        res = summarize(trace, window=window, device=device,
                        sidecar=sidecar_or_warn(trace_path, trace, window, notes, echo=False), round_name=round_name,
                        calibration=calibration).to_json()
    except (TraceError, ValueError) as e:
        fail(str(e))
    if not res["devices"]:
        fail(no_gpu_message(trace_path, trace.warnings))
    if (msg := rounds_not_found(res, trace_path, round_name)) is not None:
        fail(msg)
    warn(notes)  # the sidecar's warning, once no error line is due
    if as_json:
        res["warnings"] = notes + res["warnings"]
        click.echo(dumps_json(res))
    else:
        click.echo(render_text(res, top, frames_by))
