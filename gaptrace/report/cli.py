"""The ``gaptrace report`` command (registered lazily in :mod:`gaptrace.cli`)."""
from __future__ import annotations

import os

import click

from gaptrace.cli import memory_limit_option
from gaptrace.text import escape_line
from gaptrace.trace import TraceError, clean_text


def default_output(trace_path: str) -> str:
    """``X.json.gz`` -> ``X.report.html`` in the current directory."""
    base = os.path.basename(os.fspath(trace_path).rstrip("/"))
    for suffix in (".gz", ".json"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    return (base or "trace") + ".report.html"


@click.command(name="report")
@click.argument("trace", metavar="TRACE")
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False), default=None,
              help="HTML file to write (default: TRACE's name with .report.html, in the current directory).")
@click.option("--window", default=None, metavar="NAME",
              help="Analyse the span of the annotations (record_function / NVTX ranges) with this name. Default: "
                   "the capture sidecar's analysis_window (the profiled rounds) when TRACE.gaptrace.json names one, "
                   "else first to last device activity.")
@click.option("--sidecar", default=None, metavar="PATH",
              help="Capture sidecar JSON (default: TRACE.gaptrace.json next to the trace, if present).")
@click.option("--device", type=int, default=None, help="Device for gap attribution (default: the busiest).")
@click.option("--rounds", "round_name", default="round", show_default=True, metavar="NAME",
              help="Annotation that marks one verify round (also matches NAME_<n>).")
@click.option("--calibration", default=None, metavar="FILE",
              help="Per-event profiler costs from `gaptrace calibrate` for the predicted savings "
                   "(default: the shipped one).")
@click.option("--annotated", "annotated", type=click.Path(dir_okay=False), default=None, metavar="OUT",
              help="Also write TRACE with the findings as a gaptrace track for Perfetto UI (as `gaptrace annotate`; "
                   "over the report's window).")
@memory_limit_option
def report(trace: str, output: str | None, window: str | None, sidecar: str | None, device: int | None,
           round_name: str, calibration: str | None, annotated: str | None, memory_limit_gb: float | None) -> None:
    """Write one self-contained offline HTML report of TRACE: headline findings, occupancy over time, where the
    idle time went, blocking syncs, the graph-launch fit and the integrity warnings."""
    from gaptrace.cli import fail, memory_limit_bytes

    from . import write_report

    out = output or default_output(trace)
    if annotated is not None:  # checked before anything is written: a refused OUT leaves no report behind
        if os.path.realpath(annotated) == os.path.realpath(out):
            fail(f"{annotated}: --annotated names the report's own output; give another file")
        from gaptrace.outputs import resolve_output

        try:
            resolve_output(annotated, (trace,))
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
                               device=device, round_name=round_name,
                               memory_limit_bytes=memory_limit_bytes(memory_limit_gb))
        except (TraceError, ValueError) as e:
            fail(str(e))
        except OSError as e:
            fail(f"{annotated}: cannot write the annotated trace: {e.strerror or e}")
        click.echo(escape_line(clean_text(f"wrote {a['path']} ({a['bytes'] / 1e6:.1f} MB of JSON; gaptrace track "
                                          f"pid {a['pid']})")))
