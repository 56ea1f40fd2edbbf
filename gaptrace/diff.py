"""``gaptrace diff A B``: compare two traces (A baseline, B candidate) and gate CI on the result.

Both traces are analysed by :func:`gaptrace.analyses.summary.summarize`; :func:`gaptrace.analyses.diff.diff_analyses`
compares the two ``to_json()`` dicts; this module is the command and the text it prints (:func:`render_diff`).
"""
from __future__ import annotations

import sys

import click

from gaptrace.analyses.summary import no_gpu_message, summarize
from gaptrace.cli import memory_limit_option, rounds_not_found, sidecar_or_warn, warn, nonempty
from gaptrace.text import dumps_json, escape_strings
from gaptrace.trace import TraceError

__all__ = ["diff", "render_diff"]


def _fmt(v, name: str) -> str:
    if v is None:
        return "-"
    if name == "occupancy":
        return f"{v:.1%}"
    if name in ("tau", "kappa_us_per_node"):
        return f"{v:.3f}"
    return f"{v:,.0f}"


def render_diff(d: dict) -> str:
    """Text form of :func:`gaptrace.analyses.diff.diff_analyses`, non-printable characters of trace names and
    paths escaped, newlines inside them included (:func:`gaptrace.text.escape_strings`)."""
    from gaptrace.analyses.occupancy import short_kernel_name

    d = escape_strings(d)
    lines = [f"A: {d['a']}", f"B: {d['b']}", "", f"  {'metric':<18} {'A':>12} {'B':>12} {'B-A':>12} {'rel':>8}"]
    for name, m in d["metrics"].items():
        if m["a"] is None and m["b"] is None:
            continue
        delta = "-" if m["delta"] is None else (f"{m['delta']:+.1%}" if name == "occupancy" else
                                                f"{m['delta']:+,.3f}" if name in ("tau", "kappa_us_per_node")
                                                else f"{m['delta']:+,.0f}")
        rel = "-" if m["rel"] is None else f"{m['rel']:+.1%}"
        lines.append(f"  {name:<18} {_fmt(m['a'], name):>12} {_fmt(m['b'], name):>12} {delta:>12} {rel:>8}")
    if d["accept_length"]:
        lines += ["", "Accept length: " + d["accept_length"]["statement"]]
    if d.get("whatif"):
        lines += ["", "Unprofiled round (predicted vs measured): " + d["whatif"]["statement"]]
    for title, part, key in (("Idle by frame", d["frames"], "frame"), ("Blocking syncs (blocked µs)", d["syncs"], "site"),
                             ("Bubbles between graph nodes, by kernel pair", d.get("bubbles"), "pair")):
        if part is None:
            continue
        lines += ["", f"{title}:"]
        n = len(lines)
        for kind in ("vanished", "appeared", "changed"):
            for r in part[kind][:8]:
                shown = (f"{short_kernel_name(r['before'])} -> {short_kernel_name(r['after'])}" if key == "pair"
                         else r[key])
                more = r.get("same_idle_frames") or 0
                shown += f" (and {more} more frame{'s' if more != 1 else ''} with the same idle: its callers)" if more else ""
                lines.append(f"  {kind:<9} {r['delta_us']:>+14,.0f} µs  {shown}")
        if len(lines) == n:
            lines.append("  (no change)")
    if d.get("warnings"):
        lines += ["", "Warnings:"] + [f"  - {w}" for w in d["warnings"]]
    return "\n".join(lines)  # every string from d was escaped above


def render_fleet_diff(d: dict) -> str:
    """Text form of :func:`gaptrace.analyses.fleet_summary.diff_fleets`, strings escaped."""
    d = escape_strings(d)
    lines = [f"A: {d['a']}", f"B: {d['b']}", "", f"  {'metric':<22} {'A':>12} {'B':>12} {'B-A':>12}"]
    for name, m in d["metrics"].items():
        pct = name in ("occupancy", "busy_without_waiting")
        f = (lambda v: "-" if v is None else f"{v:.1%}") if pct else (lambda v: "-" if v is None else f"{v:,.0f}")
        dl = "-" if m["delta"] is None else (f"{m['delta']:+.1%}" if pct else f"{m['delta']:+,.0f}")
        lines.append(f"  {name:<22} {f(m['a']):>12} {f(m['b']):>12} {dl:>12}")
    lines += ["", f"  {'rank':>4} {'occupancy A → B':>20} {'busy w/o waiting A → B':>26} {'waited ms A → B':>20}"]
    for r in d["ranks"]:
        occ = f"{r['occupancy_a']:.1%} → {r['occupancy_b']:.1%}" if None not in (r["occupancy_a"], r["occupancy_b"]) else "-"
        bww = (f"{r['busy_without_waiting_a']:.1%} → {r['busy_without_waiting_b']:.1%}"
               if None not in (r["busy_without_waiting_a"], r["busy_without_waiting_b"]) else "-")
        lines.append(f"  {r['rank']:>4} {occ:>20} {bww:>26} "
                     f"{r['waited_us_a'] / 1000:>8.2f} → {r['waited_us_b'] / 1000:.2f}")
    for side in ("a", "b"):
        for line in d["stragglers"][side][:3]:
            lines.append(f"{side.upper()}: {line}")
    if d.get("warnings"):
        lines += ["", "Warnings:"] + [f"  - {w}" for w in d["warnings"]]
    return "\n".join(lines)


def _diff_fleets(trace_a: str, trace_b: str, fa, fb, window, round_name, as_json, gates, cal, limit, workers,
                 scheduler) -> None:
    """``diff`` of two fleets: each run as ``analyze`` runs a fleet, then compared per rank and as a whole."""
    from gaptrace.analyses.diff import GateError
    from gaptrace.analyses.fleet_summary import FLEET_METRICS, check_fleet_gates, diff_fleets
    from gaptrace.cli import fail
    from gaptrace.fleet import run_fleet

    try:
        check_fleet_gates({"metrics": {k: {"a": None, "b": None, "delta": None, "rel": None}
                                       for k in FLEET_METRICS}}, list(gates))  # a bad gate fails before any load
        runs = [run_fleet(f, workers=workers, scheduler=scheduler, memory_limit_bytes=limit, window=window,
                          round_name=round_name, calibration=cal) for f in (fa, fb)]
        d = diff_fleets(*runs)
        d["a"], d["b"] = trace_a, trace_b
        d["gates"] = check_fleet_gates(d, list(gates))
    except (TraceError, GateError, ValueError) as e:
        fail(str(e))
    _emit([dumps_json(d)] if as_json else [render_fleet_diff(d)] + _gate_lines(d["gates"]))
    if any(g["tripped"] for g in d["gates"]):
        raise SystemExit(1)


@click.command()
@click.argument("trace_a", metavar="A")
@click.argument("trace_b", metavar="B")
@click.option("--window", default=None, metavar="NAME", help="Analyse the span of this annotation in both traces.")
@click.option("--rounds", "round_name", callback=nonempty, default="round", show_default=True, metavar="NAME",
              help="Annotation that marks one verify round.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--fail-if", "gates", multiple=True, metavar="EXPR",
              help="Exit 1 if EXPR holds for B, e.g. 'occupancy < 0.9', 'rel_tpot_us > 0.02', "
                   "'delta_blocked_us > 0'. Repeatable; a gate on a metric the traces lack trips.")
@click.option("--calibration", callback=nonempty, default=None, metavar="FILE",
              help="Per-event profiler costs from `gaptrace calibrate` for the predicted unprofiled rounds "
                   "(default: the shipped one measured on the trace's GPU model, else the H200 one).")
@click.option("--dask-scheduler", default=None, metavar="ADDRESS",
              help="Two fleets: run the per-rank tasks on this existing Dask cluster (default: a LocalCluster).")
@click.option("--workers", type=click.IntRange(0, 1024), default=None, metavar="N",
              help="Two fleets: LocalCluster worker processes (default: one per core; 0: without Dask).")
@memory_limit_option
def diff(trace_a: str, trace_b: str, window: str | None, round_name: str, as_json: bool,
         gates: tuple[str, ...], calibration: str | None, dask_scheduler: str | None, workers: int | None,
         memory_limit_gb: float | None) -> None:
    """Compare trace A (baseline) with trace B (candidate): occupancy, Tround, τ, TPOT, κ, idle by frame and
    blocking syncs, and the accept-length inequality. Two fleets (each a directory of two or more rank files, or a
    quoted glob) are compared per rank: occupancy, busy without waiting, waits (gates on occupancy,
    busy_without_waiting, waited_us, caused_us: the fleet's lowest, total and largest). Exit 2 on bad input, 1 when a
    --fail-if gate trips."""
    from gaptrace import load_trace
    from gaptrace.analyses.diff import GateError, check_gates, diff_analyses, parse_gate
    from gaptrace.analyses.savings import resolve_calibration
    from gaptrace.analyze import _fleet_paths
    from gaptrace.cli import fail, memory_limit_bytes

    try:
        fa, fb = _fleet_paths((trace_a,), False), _fleet_paths((trace_b,), False)
    except TraceError as e:
        fail(str(e))
    if (fa is None) != (fb is None):
        fail("one side is a fleet of rank files and the other one trace: compare two fleets or two traces")
    if fa is not None:
        try:
            cal = resolve_calibration(calibration)
        except ValueError as e:
            fail(str(e))
        _diff_fleets(trace_a, trace_b, fa, fb, window, round_name, as_json, gates, cal,
                     memory_limit_bytes(memory_limit_gb), workers, dask_scheduler)
        return

    try:
        for g in gates:
            parse_gate(g)
        cal = resolve_calibration(calibration)
        limit = memory_limit_bytes(memory_limit_gb)
        res, notes = [], []  # notes: the sidecars' warnings (stderr), also in --json's warnings
        for side, p in (("A", trace_a), ("B", trace_b)):
            tr = load_trace(p, memory_limit_bytes=limit)
            res.append(summarize(tr, window=window, sidecar=sidecar_or_warn(p, tr, window, notes, f"{side}: ", echo=False),
                                 round_name=round_name, calibration=cal).to_json())
    except (TraceError, GateError, ValueError) as e:
        fail(str(e))
    for p, r in zip((trace_a, trace_b), res):
        if not r["devices"]:
            fail(no_gpu_message(p, r.get("warnings", ())))
        if (msg := rounds_not_found(r, p, round_name)) is not None:
            fail(msg)
    warn(notes)  # the sidecars' warnings, once no error line is due
    d = diff_analyses(*res)
    d["gates"] = check_gates(d, list(gates))
    if as_json:
        d["warnings"] = notes + d["warnings"]
    _emit([dumps_json(d)] if as_json else [render_diff(d)] + _gate_lines(d["gates"]))
    if any(g["tripped"] for g in d["gates"]):
        raise SystemExit(1)


def _gate_lines(gates: list[dict]) -> list[str]:
    return [f"gate {g['gate']!r}: value {_gate_value(g['value'])} -> {'TRIPPED' if g['tripped'] else 'ok'}"
            for g in gates]


def _emit(lines: list[str]) -> None:
    """Print ``lines``; when the reader has gone (``gaptrace diff A B --fail-if ... | head -1``) the rest is dropped
    quietly, so the exit code is still the gates' (0: every gate held, 1: one tripped), not a write error's."""
    from gaptrace.cli import _drop_stdout

    try:
        for ln in lines:
            click.echo(ln)
        sys.stdout.flush()
    except BrokenPipeError:
        _drop_stdout()


def _gate_value(v) -> str:
    """A gate's value for the text: 4 significant digits (0.8839, 1,234 µs figures as 1234); None as "missing"
    (a metric the traces lack trips the gate); the exact value stays in --json's ``gates``."""
    if v is None:
        return "missing"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    return f"{v:.4g}"
