"""The ``gaptrace report`` command (registered lazily in :mod:`gaptrace.cli`)."""
from __future__ import annotations

import os

import click

from gaptrace.cli import memory_limit_option, nonempty
from gaptrace.outputs import named_inputs
from gaptrace.text import escape_line
from gaptrace.trace import TraceError, clean_text


def default_output(trace_path: str) -> str:
    """``X.json.gz`` -> ``X.report.html`` in the current directory."""
    base = os.path.basename(os.fspath(trace_path).rstrip("/"))
    for suffix in (".gz", ".json"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    return (base or "trace") + ".report.html"


def _fleet_report(paths: tuple[str, ...], output: str | None, window: str | None, round_name: str,
                  calibration: str | None, workers: int | None, dask_scheduler: str | None,
                  memory_limit_gb: float | None, files: list) -> None:
    """The fleet's report page (:mod:`gaptrace.report.fleet`): the output checked against every rank file first,
    then the fleet run, then one atomic write."""
    from gaptrace.analyses.savings import resolve_calibration
    from gaptrace.cli import fail, memory_limit_bytes
    from gaptrace.fleet import run_fleet
    from gaptrace.outputs import resolve_output, write_text_atomic

    from .fleet import render_fleet_report

    out = output if output is not None else default_output(
        paths[0] if len(paths) == 1 and os.path.isdir(paths[0]) else "fleet")
    try:
        real = resolve_output(out, tuple(paths) + tuple(f for _, f in files) + named_inputs(calibration))
        calibration = resolve_calibration(calibration)
        res = run_fleet(files, workers=workers, scheduler=dask_scheduler,
                        memory_limit_bytes=memory_limit_bytes(memory_limit_gb), window=window, round_name=round_name,
                        calibration=calibration)
        text = render_fleet_report(res, " ".join(paths))
        write_text_atomic(real, text, prefix=".gaptrace-report-")
    except (TraceError, ValueError) as e:
        fail(str(e))
    except OSError as e:
        fail(f"{out}: cannot write the report: {e.strerror or e}")
    click.echo(escape_line(clean_text(f"wrote {out} ({len(text.encode('utf-8')) / 1e6:.1f} MB; a fleet of "
                                      f"{len(files)} ranks)")))


@click.command(name="report")
@click.argument("traces", metavar="TRACE", nargs=-1, required=True)
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False), default=None,
              help="HTML file to write (default: TRACE's name with .report.html, in the current directory).")
@click.option("--window", default=None, metavar="NAME",
              help="Analyse the span of the annotations (record_function / NVTX ranges) with this name. Default: "
                   "the capture sidecar's analysis_window (the profiled rounds) when TRACE.gaptrace.json names one, "
                   "else first to last device activity.")
@click.option("--sidecar", default=None, metavar="PATH",
              help="Capture sidecar JSON (default: TRACE.gaptrace.json next to the trace, if present).")
@click.option("--device", type=int, default=None, help="Device for gap attribution (default: the busiest).")
@click.option("--rounds", "round_name", callback=nonempty, default="round", show_default=True, metavar="NAME",
              help="Annotation that marks one verify round (also matches NAME_<n>).")
@click.option("--calibration", callback=nonempty, default=None, metavar="FILE",
              help="Per-event profiler costs from `gaptrace calibrate` for the predicted savings "
                   "(default: the shipped one measured on the trace's GPU model, else the H200 one).")
@click.option("--annotated", "annotated", type=click.Path(dir_okay=False), default=None, metavar="OUT",
              help="Also write TRACE with the findings as a gaptrace track for Perfetto UI (as `gaptrace annotate`; "
                   "over the report's window).")
@click.option("--merged", is_flag=True,
              help="Read a directory of rank files as one multi-rank trace (no fleet report, no Dask).")
@click.option("--dask-scheduler", default=None, metavar="ADDRESS",
              help="Fleet: run the per-rank tasks on this existing Dask cluster (default: a LocalCluster).")
@click.option("--workers", type=click.IntRange(0, 1024), default=None, metavar="N",
              help="Fleet: LocalCluster worker processes (default: one per core; 0: without Dask).")
@memory_limit_option
def report(traces: tuple[str, ...], output: str | None, window: str | None, sidecar: str | None, device: int | None,
           round_name: str, calibration: str | None, annotated: str | None, merged: bool, dask_scheduler: str | None,
           workers: int | None, memory_limit_gb: float | None) -> None:
    """Write one self-contained offline HTML report of TRACE: headline findings, occupancy over time, where the
    idle time went, blocking syncs, the graph-launch fit and the integrity warnings. Two or more rank files (a
    directory, a glob, several paths) give the fleet's report: per-rank occupancy and busy without waiting, a
    timeline strip per rank, the stragglers and the wait matrix (``--merged``: the one-trace report instead)."""
    from gaptrace.analyze import _single_path, fleet_or_fail
    from gaptrace.cli import fail, memory_limit_bytes

    files = fleet_or_fail(traces, merged)
    if files is not None:
        if device is not None or sidecar is not None or annotated is not None:
            fail("--device, --sidecar and --annotated are for one trace: a fleet's report reads each rank's own")
        _fleet_report(traces, output, window, round_name, calibration, workers, dask_scheduler, memory_limit_gb,
                      files)
        return
    try:
        trace = _single_path(traces)
    except TraceError as e:
        fail(str(e))

    from . import write_report

    out = default_output(trace) if output is None else output  # an empty -o is refused by resolve_output
    if annotated is not None:  # checked before anything is written: a refused OUT leaves no report behind
        if os.path.realpath(annotated) == os.path.realpath(out):
            fail(f"{annotated}: --annotated names the report's own output; give another file")
        from gaptrace.outputs import resolve_output

        try:
            from gaptrace.sidecar import sidecar_path

            resolve_output(annotated, (trace, sidecar_path(os.fspath(trace)), *named_inputs(sidecar, calibration)))
        except ValueError as e:
            fail(str(e))
    try:
        info = write_report(trace, out, window=window, sidecar_path=sidecar, device=device, round_name=round_name,
                            calibration=calibration, memory_limit_bytes=memory_limit_bytes(memory_limit_gb))
    except TraceError as e:
        fail(str(e))
    except OSError as e:
        fail(f"{out}: cannot write the report: {e.strerror or e}")
    for w in info.get("sidecar_warnings") or ():  # reported on without the sidecar, or without its bad fields
        click.echo(clean_text(f"gaptrace: warning: {escape_line(w)}"), err=True)
    side = f" (with capture sidecar {info['sidecar']})" if info["sidecar"] else ""
    # clean_text: a path from argv bytes that are not UTF-8 holds lone surrogates a strict stdout cannot encode
    click.echo(escape_line(clean_text(f"wrote {info['path']} ({info['bytes'] / 1e6:.1f} MB){side}")))
    if annotated is not None:
        from gaptrace.annotate import annotate_trace

        try:  # over the window the report analysed (--window, else the sidecar's analysis window, else activity)
            a = annotate_trace(trace, annotated, window=info.get("window"),
                               device=device, round_name=round_name, inputs=named_inputs(sidecar, calibration),
                               memory_limit_bytes=memory_limit_bytes(memory_limit_gb))
        except (TraceError, ValueError) as e:
            fail(str(e))
        except OSError as e:
            fail(f"{annotated}: cannot write the annotated trace: {e.strerror or e}")
        click.echo(escape_line(clean_text(f"wrote {a['path']} ({a['bytes'] / 1e6:.1f} MB of JSON; gaptrace track "
                                          f"pid {a['pid']})")))
