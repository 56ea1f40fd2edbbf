"""The ``gaptrace annotate`` command: the trace plus gaptrace's findings as tracks that Perfetto UI opens."""
from __future__ import annotations

import os

import click

from gaptrace.cli import memory_limit_option, nonempty
from gaptrace.text import escape_line
from gaptrace.trace import TraceError, clean_text


def default_output(trace_path: str) -> str:
    """``X.json.gz`` -> ``X.annotated.json.gz`` in the current directory."""
    base = os.path.basename(os.fspath(trace_path).rstrip("/"))
    for suffix in (".gz", ".json"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    return (base or "trace") + ".annotated.json.gz"


def annotate_trace(trace_path: str, out_path: str, window: str | None = None, device: int | None = None,
                   round_name: str = "round", memory_limit_bytes: int | None = None, inputs: tuple[str, ...] = ()
                   ) -> dict:
    """Load ``trace_path``, compute :func:`gaptrace.analyses.tracks.findings_tracks` and write the annotated copy
    to ``out_path`` (:func:`gaptrace.annotated.write_annotated`); ``inputs``: other files the caller read (a named
    sidecar, a calibration) that ``out_path`` may not be, beside the trace and its sidecar. Returns {path, bytes,
    pid, slices: {track: n}}. Raises TraceError (bad trace, a directory of ranks, no device activity, unknown window) or ValueError (an
    output path that is unsafe or the input itself)."""
    from gaptrace.analyses.tracks import findings_tracks
    from gaptrace.annotated import annotation_events, free_pid, write_annotated
    from gaptrace.loader import load_trace
    from gaptrace.outputs import resolve_output

    if os.path.isdir(trace_path):
        raise TraceError(f"{trace_path}: annotate takes one trace file, not a directory of ranks")
    from gaptrace.sidecar import sidecar_path

    # the trace's capture sidecar is an input of every later analysis of it: never overwritten
    real_out = resolve_output(out_path, (trace_path, sidecar_path(os.fspath(trace_path)), *inputs))
    trace = load_trace(trace_path, memory_limit_bytes=memory_limit_bytes)
    tracks = findings_tracks(trace, device, window, round_name=round_name)
    pid = free_pid(trace)
    n = write_annotated(trace_path, real_out, annotation_events(tracks, pid))
    return {"path": out_path, "bytes": n, "pid": pid,
            "slices": {"blocking calls": len(tracks.blocking), "idle gaps": len(tracks.gaps),
                       "rounds": len(tracks.rounds), "occupancy samples": len(tracks.occupancy)}}


@click.command(name="annotate")
@click.argument("trace", metavar="TRACE")
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False), default=None,
              help="Trace to write (gzip when it ends with .gz; default: TRACE's name with .annotated.json.gz, in "
                   "the current directory).")
@click.option("--window", default=None, metavar="NAME",
              help="Analyse the span of the annotations with this name (default: first to last device activity).")
@click.option("--device", type=int, default=None, help="Device to annotate (default: the busiest).")
@click.option("--rounds", "round_name", callback=nonempty, default="round", show_default=True, metavar="NAME",
              help="Annotation that marks one verify round (also matches NAME_<n>).")
@memory_limit_option
def annotate(trace: str, output: str | None, window: str | None, device: int | None, round_name: str,
             memory_limit_gb: float | None) -> None:
    """Write TRACE back with gaptrace's findings as a "gaptrace" process: a slice per blocking call, per idle gap
    (charged to its top site) and per round (with its verdict), and an occupancy counter. Opens in Perfetto UI and
    chrome://tracing; gaptrace analyses the result exactly as TRACE."""
    from gaptrace.cli import fail, memory_limit_bytes

    out = default_output(trace) if output is None else output  # an empty -o is refused by resolve_output
    try:
        info = annotate_trace(trace, out, window=window, device=device, round_name=round_name,
                              memory_limit_bytes=memory_limit_bytes(memory_limit_gb))
    except (TraceError, ValueError) as e:
        fail(str(e))
    except OSError as e:
        fail(f"{out}: cannot write the annotated trace: {e.strerror or e}")
    counts = ", ".join(f"{v} {k}" for k, v in info["slices"].items())
    click.echo(escape_line(clean_text(f"wrote {info['path']} ({info['bytes'] / 1e6:.1f} MB of JSON; "
                                      f"gaptrace track pid {info['pid']}: {counts})")))
