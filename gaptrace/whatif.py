"""``gaptrace whatif TRACE --remove SITE_OR_RANGE [...] [--remove-with-device SITE_OR_RANGE] [--speedup SITE=FACTOR]
[--graph SITE_OR_RANGE] [--calibration FILE] [--json]``:
the unprofiled round predicted by the replay, before and after removing, speeding up or capturing in a CUDA graph
host sites or NVTX ranges (docs/DESIGN.md "The replay model", "Counterfactuals"; :mod:`gaptrace.analyses.whatif`)."""
from __future__ import annotations

import json

import click

from gaptrace.cli import escape_json_controls, escape_strings, memory_limit_option, nonempty
from gaptrace.trace import TraceError

__all__ = ["whatif", "render_whatif"]


# which rounds the sidecar measured unprofiled (analyses.profiler_cost.measured_period), in the prediction's line
_SOURCE_TEXT = {"profiled_positions": " at the profiled rounds' positions", "warmup_rounds": " in the warm-up rounds",
                "warmup_steps": " in the warm-up steps"}


def _us(v) -> str:
    return "-" if v is None else f"{v / 1e3:,.2f} ms"


def render_whatif(d: dict) -> str:
    """Text form of :class:`gaptrace.analyses.whatif.WhatIf` data, trace strings escaped."""
    d = escape_strings(d)
    def said(c: dict) -> str:
        if c["factor"] is not None:
            return f"{c['site']} {c['factor']:g}x faster"
        if c.get("action") == "graph":
            return f"{c['site']} captured in one CUDA graph"
        return f"remove {c['site']}" + (" and its device work" if c.get("action") == "remove_with_device" else "")

    ch = ", ".join(said(c) for c in d["changes"]) or "no change"
    n = d["rounds"]
    periods = "the period" if n == 1 else "the periods"
    lines = [f"{d['trace']}: {n} round{'' if n == 1 else 's'} ({periods} between {n + 1} {d['round_name']!r} "
             f"starts); {ch}"]
    for c in d["changes"]:
        m = c.get("matched") or {}
        if m.get("how") == "other thread":
            lines.append(f"  {c['site']} runs on another thread: the launching thread waited on it "
                         f"{m.get('waited_us', 0.0) / 1e3:,.2f} ms in all (its lock waits while that thread was inside "
                         "it); the change shortens those waits")
        mr = (d.get("measured_ranges") or {}).get(c["site"])
        if mr and mr.get("applied"):
            lines.append(f"  {c['site']}: host time as the capture measured it without the profiler, "
                         f"{mr['measured_us_per_round']:,.0f} µs a round (the calibration's estimate "
                         f"{mr['modeled_us_per_round']:,.0f} µs)")
        elif mr and mr.get("why"):
            lines.append(f"  {c['site']}: its unprofiled host time ({mr['measured_us_per_round']:,.0f} µs a round) "
                         f"is not used: {mr['why']}")
        if m.get("how") == "frames containing":  # a substring match: say what it took
            names = m.get("names", [])
            lines.append(f"  {c['site']} matches {len(names)} frame name(s) containing it ({m.get('events', 0):,} "
                         f"events): " + "; ".join(names[:5]) + (f"; … {len(names) - 5} more" if len(names) > 5 else ""))
    lines += [
             f"  profiled round (measured, median)  {_us(d['profiled_round_us'])}",
             f"  replayed unchanged                 {_us(d['replayed_round_us'])} (error {d['replay_error']:.1%})",
             f"  predicted unprofiled round         {_us(d['before_round_us'])}"
             + (f" (measured unprofiled{_SOURCE_TEXT.get(d.get('measured_source'), '')} "
                f"{_us(d['unprofiled_round_us'])}, error {d['unprofiled_error']:+.1%})"
                if d.get("unprofiled_round_us") else ""),
             _scale_line(d),
             f"  after the change                   {_us(d['after_round_us'])}: saves {d['saving_us']:,.0f} µs a round"
             f" (one-off {d['one_off_saving_us']:,.0f} µs)",
             f"  occupancy                          {d['occupancy_before']:.1%} -> {d['occupancy_after']:.1%}"]
    if d.get("tau"):
        lines.append(f"  TPOT (τ {d['tau']:.2f})                      {d['tpot_before_us']:,.0f} -> "
                     f"{d['tpot_after_us']:,.0f} µs")
    for g in d.get("graph") or ():
        launch = "the calibration's" if g["launch_source"] == "calibration" else "the default, an H100's"
        gap = "the trace's own graph replays" if g["node_gap_source"] == "trace" else "the default"
        n = g["nodes_per_occurrence"]
        lines.append(f"  {g['site']} as a CUDA graph: {g['occurrences']} launch{'' if g['occurrences'] == 1 else 'es'} "
                     f"over the rounds' window, {n:,.6g} node{'' if n == 1 else 's'} each (median), each launch "
                     f"{g['launch_us_per_occurrence']:,.2f} µs = {g['launch_t0_us']:.2f} + {g['launch_node_us']:.3f} × "
                     f"N ({launch}); node gap {g['node_gap_us']:.2f} µs ({gap})")
    lines.append(f"  calibration: {d['calibration']['source']} ({d['calibration']['measured_on']})")
    for w in d.get("warnings", []):
        lines.append(f"  warning: {w}")
    return "\n".join(lines)


def _scale_line(d: dict) -> str:
    """The profiler cost scale α and how it was set (fitted, the closest, or the calibration as it is)."""
    head = f"  profiler cost scale                {d['profiler_cost_scale']:.2f} "
    alone = (f"the calibration alone predicts {_us(d['unfitted_round_us'])}, error {d['unfitted_error']:+.1%}"
             if d.get("unfitted_error") is not None else "")
    fit = d.get("profiler_cost_fit")
    found, scale = d.get("profiler_cost_scale_found"), d["profiler_cost_scale"]
    floor = found is not None and found < scale and fit in ("fitted", "unmatched")  # SCALE_MIN kept instead
    if fit == "fitted":
        at = f", at the least scale allowed ({found:.2g} reproduces it exactly)" if floor else ""
        return head + f"(fitted to the measured unprofiled round{at}; {alone})"
    if floor:
        return head + (f"(NOT fitted: the measured unprofiled round needs {found:.2g}, below the least scale allowed; "
                       f"{scale:.2g} kept; {alone})")
    if fit == "set_aside":
        return head + (f"(the measured unprofiled round is out of the fit's reach and set aside: the calibration as "
                       f"it is; {alone})")
    if fit == "unmatched":
        return head + (f"(NOT fitted: no scale reproduces the measured unprofiled round within 1%, the closest "
                       f"kept; {alone})")
    return "  profiler cost scale                1 (the calibration as it is)"


@click.command(name="whatif")
@click.argument("trace")
@click.option("--remove", "removes", multiple=True, metavar="SITE_OR_RANGE",
              help="Host frame or NVTX range whose host work (and waits) to take out of every round, or a CUDA "
                   "runtime call that launches no device work (cudaMalloc, cudaFree); repeatable.")
@click.option("--remove-with-device", "removes_all", multiple=True, metavar="SITE_OR_RANGE",
              help="As --remove, and the device work launched from inside it goes too (the site's work is not "
                   "needed at all); repeatable.")
@click.option("--speedup", "speedups", multiple=True, metavar="SITE=FACTOR",
              help="Make a host frame or NVTX range FACTOR times faster; repeatable.")
@click.option("--graph", "graphs", multiple=True, metavar="SITE_OR_RANGE",
              help="Capture a host frame or NVTX range's work in one CUDA graph: its host work and launches become "
                   "one graph launch, its device work stays and runs back to back (refused when it holds a call "
                   "that blocks the host); repeatable.")
@click.option("--calibration", callback=nonempty, default=None, metavar="FILE",
              help="Per-event profiler costs from `gaptrace calibrate` (default: the shipped one measured on the "
                   "trace's GPU model, else the H200 one).")
@click.option("--round-name", "--rounds", callback=nonempty, default="round", show_default=True,
              help="The NVTX range of one verify round (or loop step); without two of them on the launching "
                   "thread, the loop's steps as `steps` finds them (ProfilerStep#N, a repeating range).")
@click.option("--no-fit", is_flag=True,
              help="Keep the calibration's per-event costs as they are (default: scaled so that the unchanged "
                   "prediction matches the sidecar's measured unprofiled round, when it has one).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@memory_limit_option
def whatif(trace: str, removes: tuple[str, ...], removes_all: tuple[str, ...], speedups: tuple[str, ...],
           graphs: tuple[str, ...], calibration: str | None,
           round_name: str, no_fit: bool, as_json: bool, memory_limit_gb: float | None) -> None:
    """Predict the unprofiled verify round of TRACE, and the round without (or with faster) host sites."""
    from gaptrace import load_trace
    from gaptrace.analyses.profiler_cost import load_calibration
    from gaptrace.analyses.steps import find_steps
    from gaptrace.analyses.summary import no_gpu_message
    from gaptrace.analyses.whatif import Change, Context, check_changes, parse_speedup
    from gaptrace.analyses.whatif import whatif as run
    from gaptrace.cli import fail, given_on_command_line, memory_limit_bytes, sidecar_or_warn, warn

    for opt, sites in (("--remove", removes), ("--remove-with-device", removes_all), ("--graph", graphs)):
        for r in sites:
            if not r.strip():  # a name "contains" the empty string: it would match every frame
                fail(f"{opt} {r!r}: an empty site would match every host frame; name an NVTX range or a frame")
    try:
        changes = ([Change(r) for r in removes] + [Change(r, with_device=True) for r in removes_all]
                   + [parse_speedup(s) for s in speedups]
                   # last: a read removed above is out of the way of the graph that captures the work around it
                   + [Change(g, graph=True) for g in graphs])
        check_changes(changes)
        cal = load_calibration(calibration) if calibration else None  # None: the shipped one of the trace's GPU
        tr = load_trace(trace, memory_limit_bytes=memory_limit_bytes(memory_limit_gb))
        if tr.device.empty:  # the line analyze, diff and report give
            fail(no_gpu_message(trace, tr.warnings))
        # the same checks and warning line as analyze: a sidecar of another capture is ignored, unusable fields
        # are named (one warning line on stderr; with --json in the JSON's warnings too)
        notes: list[str] = []
        side = sidecar_or_warn(trace, tr, None, notes, echo=False)
        ctx = Context(tr, side, cal, round_name=round_name, fit=not no_fit)
        if given_on_command_line("round_name") and ctx.step_rule != "round":  # the range asked for is absent: say so, as analyze --rounds does
            dflt = find_steps(tr, ctx.model.key)  # what the loop's steps are without --round-name
            hint = (f"without it the loop's steps are {dflt.name_pattern or dflt.name!r}" if dflt.rule != "none"
                    else "and without it no loop steps are found either")
            fail(f"{trace}: fewer than two annotations named {round_name!r} on the launching thread: no rounds of "
                 f"that name (--round-name; {hint})")
        res = run(tr, changes, context=ctx).data
        if as_json:
            res["warnings"].extend(notes)
    except (TraceError, ValueError) as e:
        fail(str(e))
    warn(notes)  # the sidecar's warning, once no error line is due
    if as_json:
        click.echo(escape_json_controls(json.dumps(res, ensure_ascii=False, default=float, allow_nan=False)
                                        if _finite(res) else json.dumps(_nan_none(res), ensure_ascii=False)))
    else:
        click.echo(render_whatif(res))


def _nan_none(o):
    if isinstance(o, float):
        return o if o == o and o not in (float("inf"), float("-inf")) else None
    if isinstance(o, dict):
        return {k: _nan_none(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_nan_none(v) for v in o]
    return o


def _finite(o) -> bool:
    return _nan_none(o) == o
