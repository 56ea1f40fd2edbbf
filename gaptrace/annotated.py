"""Write a trace back with gaptrace's findings as extra tracks (Trace Event Format), streaming and atomically.

The output is the input document byte for byte, with gaptrace's events inserted at the start of its
``traceEvents`` array (or of the bare top-level array): one process named "gaptrace" (a pid none of the trace's
events use) with one thread per track (blocking calls, idle gaps, rounds) of complete events (``ph: "X"``) and
one counter track (``ph: "C"``, occupancy), plus the metadata events (``ph: "M"``: process_name, thread_name,
process_sort_index, thread_sort_index) that name them in Perfetto UI and chrome://tracing. Every gaptrace event
has ``cat: "gaptrace"``; the loader skips that category, so an annotated trace analyses exactly as the original
(docs/DESIGN.md "Findings as trace tracks").

Only the document's prefix up to ``traceEvents``'s opening bracket is parsed (a small scanner that skips the
values of the keys before it); the rest is copied in 1 MiB chunks, so a 1 GB trace costs one pass of I/O and
gzip. Every string gaptrace writes goes through ``json.dumps`` with ``ensure_ascii``: quotes, backslashes and
control characters from trace names are escaped, nothing of them can close a string or the array.
"""
from __future__ import annotations

import gzip
import json
import math
import os
import re
import tempfile
from typing import Any, BinaryIO, Iterator

import numpy as np

from gaptrace.analyses.tracks import Tracks
from gaptrace.outputs import discard, set_output_mode
from gaptrace.trace import Trace, TraceError

__all__ = ["annotation_events", "write_annotated", "free_pid", "GAPTRACE_CAT", "TRACK_TIDS"]

GAPTRACE_CAT = "gaptrace"
TRACK_TIDS = {"blocking calls": 1, "idle gaps": 2, "rounds": 3, "occupancy": 4}
COPY_CHUNK_BYTES = 1 << 20
_MAX_PID = 2**31 - 1
_STRING_STOP = re.compile(rb'["\\]')  # a string's closing quote or an escape
_SCALAR_STOP = re.compile(rb'[,}\] \t\r\n]')  # the end of a number or literal
_NESTED_STOP = re.compile(rb'["\[\]{}]')  # what changes depth inside a value


def free_pid(trace: Trace) -> int:
    """A process id no event of ``trace`` uses: one more than the largest integer pid (host pids, GPU ids), at least
    1; when that would pass int32 (the JSON importers read pids as 32-bit), the smallest positive pid none uses."""
    used = [0]
    for frame in (trace.host, trace.overhead):
        if "pid" in frame and len(frame):
            for p in frame["pid"].astype(str).unique():
                try:
                    used.append(int(p))
                except ValueError:
                    pass
    if len(trace.device):
        used.append(int(trace.device["device"].max()))
    pid = max(used) + 1
    if pid <= _MAX_PID:
        return pid
    taken = set(used)  # the largest pid is at the int32 limit: the smallest positive one no event uses
    return next(p for p in range(1, len(taken) + 2) if p not in taken)


def _num(v: float) -> float | None:
    return float(v) if v is not None and math.isfinite(float(v)) else None


def annotation_events(tracks: Tracks, pid: int, savings_us: dict[str, float] | None = None) -> Iterator[dict]:
    """The Trace Event Format events of ``tracks`` (module docstring), in track order. ``savings_us`` maps a
    blocking call's site to its predicted saving per round (µs), added to its slices' args when given."""
    yield {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "cat": GAPTRACE_CAT,
           "args": {"name": "gaptrace"}}
    yield {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "cat": GAPTRACE_CAT,
           "args": {"sort_index": -1}}
    for name, tid in TRACK_TIDS.items():
        yield {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "cat": GAPTRACE_CAT, "args": {"name": name}}
        yield {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "cat": GAPTRACE_CAT,
               "args": {"sort_index": tid}}
    b = tracks.blocking
    for ts, dur, call, site, aten, blocked, after in zip(b["ts_us"], b["dur_us"], b["call"], b["site"],
                                                         b["aten_op"], b["blocked_us"], b["idle_after_us"]):
        label = f"{call} ({aten})" if aten else call
        args: dict[str, Any] = {"call": call, "site": site, "aten_op": aten, "blocked_us": _num(blocked),
                                "idle_after_us": _num(after)}
        if savings_us and site in savings_us:
            args["saving_us_per_round"] = _num(savings_us[site])
        yield {"ph": "X", "name": f"{label} @ {site}" if site else label, "cat": GAPTRACE_CAT, "pid": pid,
               "tid": TRACK_TIDS["blocking calls"], "ts": float(ts), "dur": float(dur), "args": args}
    g = tracks.gaps
    for ts, dur, site, rng, share in zip(g["ts_us"], g["dur_us"], g["site"], g["range"], g["site_share"]):
        yield {"ph": "X", "name": f"idle: {site}", "cat": GAPTRACE_CAT, "pid": pid, "tid": TRACK_TIDS["idle gaps"],
               "ts": float(ts), "dur": float(dur),
               "args": {"idle_us": float(dur), "site": site, "range": rng, "site_share": float(share)}}
    r = tracks.rounds
    for rnd, ts, dur, gpu, host, blocked, verdict, bound in zip(r["round"], r["ts_us"], r["dur_us"], r["t_gpu_us"],
                                                                 r["t_host_us"], r["blocked_us"], r["verdict"],
                                                                 r["bound"]):
        yield {"ph": "X", "name": f"round {int(rnd)}: {verdict}, {bound}", "cat": GAPTRACE_CAT, "pid": pid,
               "tid": TRACK_TIDS["rounds"], "ts": float(ts), "dur": float(dur),
               "args": {"t_round_us": float(dur), "t_gpu_us": _num(gpu), "t_host_us": _num(host),
                        "blocked_us": _num(blocked), "verdict": verdict, "bound": bound}}
    o = tracks.occupancy
    for ts, frac in zip(o["ts_us"], o["busy_fraction"]):
        yield {"ph": "C", "name": "occupancy", "cat": GAPTRACE_CAT, "pid": pid, "tid": TRACK_TIDS["occupancy"],
               "ts": float(ts), "args": {"busy_pct": round(100.0 * float(frac), 6)}}


# ---------------------------------------------------------------- the prefix scanner

class _Prefix:
    """Reads a JSON document up to its event array's opening bracket, keeping every byte read."""

    def __init__(self, src: BinaryIO, path: str) -> None:
        self.src, self.path = src, path
        self.buf = bytearray()
        self.pos = 0

    def _fail(self, what: str) -> TraceError:
        return TraceError(f"{self.path}: {what}")

    def _peek(self) -> int:
        while self.pos >= len(self.buf):
            chunk = self.src.read(COPY_CHUNK_BYTES)
            if not chunk:
                raise self._fail("the JSON ends before its traceEvents array")
            self.buf += chunk
        return self.buf[self.pos]

    def _ws(self) -> int:
        while True:
            c = self._peek()
            if c not in b" \t\r\n":
                return c
            self.pos += 1

    def _search(self, pattern: re.Pattern) -> int:
        """Move pos to the next byte matching ``pattern`` (reading more as needed) and return that byte."""
        while True:
            m = pattern.search(self.buf, self.pos)
            if m:
                self.pos = m.start()
                return self.buf[self.pos]
            self.pos = len(self.buf)
            self._peek()

    def _string(self) -> bytes:
        """The raw bytes of the string starting at pos (at its quote); pos moves past its closing quote."""
        self.pos += 1
        start = self.pos
        while True:
            if self._search(_STRING_STOP) == 0x5C:  # a backslash escapes the next byte
                self.pos += 2
                continue
            self.pos += 1
            return bytes(self.buf[start:self.pos - 1])

    def _skip_value(self) -> None:
        """Move pos past one JSON value (a string, a nested object / array, or a scalar)."""
        c = self._ws()
        if c == 0x22:
            self._string()
            return
        if c not in b"[{":
            self._search(_SCALAR_STOP)
            return
        depth = 0
        while True:
            c = self._search(_NESTED_STOP)
            if c == 0x22:
                self._string()
                continue
            self.pos += 1
            depth += 1 if c in b"[{" else -1
            if depth == 0:
                return

    def find_events(self) -> bool:
        """Position just after the event array's '['; returns whether that array is empty."""
        c = self._ws()
        if c == 0x5B:  # a bare array of events
            self.pos += 1
        elif c == 0x7B:
            self.pos += 1
            while True:
                c = self._ws()
                if c == 0x7D:
                    raise self._fail("the JSON object has no traceEvents array")
                if c == 0x2C:
                    self.pos += 1
                    continue
                if c != 0x22:
                    raise self._fail(f"not valid JSON (a key expected near byte {self.pos:,})")
                key = self._string()
                if self._ws() != 0x3A:
                    raise self._fail(f"not valid JSON (':' expected near byte {self.pos:,})")
                self.pos += 1
                if key == b"traceEvents":
                    if self._ws() != 0x5B:
                        raise self._fail("traceEvents is not an array")
                    self.pos += 1
                    break
                self._skip_value()
        else:
            raise self._fail("not a JSON trace (it starts with neither '{' nor '[')")
        return self._ws() == 0x5D


def _open_input(path: str) -> BinaryIO:
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


def write_annotated(src_path: str, out_path: str, events: Iterator[dict]) -> int:
    """Copy the trace at ``src_path`` to ``out_path`` with ``events`` inserted first in its event array
    (gzip when ``out_path`` ends with ``.gz``). Atomic: a temporary file in the output's directory, renamed at
    the end, removed on any failure. Returns the bytes written (uncompressed). Raises TraceError (input not a
    trace document) or OSError."""
    d = os.path.dirname(os.path.abspath(out_path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-gaptrace-", dir=d)
    written = 0
    try:
        with os.fdopen(fd, "wb") as raw:
            out: BinaryIO = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1, mtime=0) \
                if out_path.endswith(".gz") else raw
            with _open_input(src_path) as src:
                pre = _Prefix(src, src_path)
                empty = pre.find_events()
                out.write(pre.buf[:pre.pos])
                written += pre.pos
                first = True
                for ev in events:
                    piece = ("" if first else ",") + json.dumps(ev, ensure_ascii=True, allow_nan=False,
                                                                separators=(",", ":"))
                    first = False
                    b = piece.encode("ascii")
                    out.write(b)
                    written += len(b)
                if not first and not empty:
                    out.write(b",")
                    written += 1
                rest = pre.buf[pre.pos:]
                while rest:
                    out.write(rest)
                    written += len(rest)
                    rest = src.read(COPY_CHUNK_BYTES)
            if out is not raw:
                out.close()
        set_output_mode(tmp, out_path)
        os.replace(tmp, out_path)
    except BaseException:
        discard(tmp)
        raise
    return written
