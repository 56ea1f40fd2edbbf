"""The reference conversion of decoded trace events into :class:`gaptrace.trace.RawColumns`.

:func:`events_to_raw` is the plain, obviously-correct path: one Python dict per event (as stdlib ``json`` decodes
it), each field converted by :func:`_int` / :func:`_float`. :func:`gaptrace.loader.load_trace_reference` reads
files through it, and the fast typed decoder (:mod:`gaptrace.eventcols`) uses the same conversions for values its
typed fields cannot hold, so both give the same column values per event.
"""
from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from .trace import RawColumns

__all__ = ["events_to_raw", "INT64_MIN", "INT64_MAX"]


class _Interner:
    """Strings to dense int ids, in first-seen order (``symbols[i]`` is the string of id i); None -> -1."""

    def __init__(self) -> None:
        self.table: dict[str, int] = {}
        self.symbols: list[str] = []

    def __call__(self, s: Any) -> int:
        if s is None:
            return -1
        s = str(s)
        i = self.table.get(s)
        if i is None:
            i = len(self.symbols)
            self.table[s] = i
            self.symbols.append(s)
        return i


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _int(v: Any) -> int:
    """An id or count from a JSON value: ints, integral strings and finite floats (truncated); -1 for anything
    else, including a value outside int64 (no column can hold it, so it is as good as absent)."""
    if v is None or isinstance(v, bool):
        return -1
    if isinstance(v, float):
        v = int(v) if np.isfinite(v) else -1
    elif isinstance(v, str):
        try:
            v = int(v)
        except ValueError:
            return -1
    elif not isinstance(v, int):
        return -1
    return v if INT64_MIN <= v <= INT64_MAX else -1


def _float(v: Any) -> float:
    """A time in µs from a JSON value: NaN unless a number; an integer beyond float64 is ±inf (dropped later as
    non-finite, like the ``1e400`` that json reads as inf)."""
    if isinstance(v, bool):
        return float("nan")
    if isinstance(v, int):
        try:
            return float(v)
        except OverflowError:
            return float("inf") if v > 0 else float("-inf")
    if isinstance(v, float):
        return v
    return float("nan")


def events_to_raw(per_rank: Iterable[tuple[int, list[dict]]]) -> RawColumns:
    """Plain per-event conversion of decoded event dicts into :class:`RawColumns` (reference semantics)."""
    intern = _Interner()
    rows: dict[str, list] = {k: [] for k in (
        "cat_id", "name_id", "pid_id", "tid_id", "ts", "dur", "correlation", "external_id", "python_id",
        "python_parent_id", "cbid", "device", "stream", "bytes", "sync_kind_id", "rank")}
    for rank, events in per_rank:
        for e in events:
            if not isinstance(e, dict) or e.get("ph") != "X":
                continue
            args = e.get("args")
            if not isinstance(args, dict):
                args = {}
            rows["cat_id"].append(intern(e.get("cat", "")))
            rows["name_id"].append(intern(e.get("name", "")))
            rows["pid_id"].append(intern(e.get("pid", "")))
            rows["tid_id"].append(intern(e.get("tid", "")))
            rows["ts"].append(_float(e.get("ts")))
            rows["dur"].append(_float(e.get("dur")))
            rows["correlation"].append(_int(args.get("correlation")))
            ext = args.get("External id", args.get("external id"))
            rows["external_id"].append(_int(ext))
            rows["python_id"].append(_int(args.get("Python id")))
            rows["python_parent_id"].append(_int(args.get("Python parent id")))
            rows["cbid"].append(_int(args.get("cbid", args.get("cid"))))
            rows["device"].append(_int(args.get("device")))
            rows["stream"].append(_int(args.get("stream")))
            rows["bytes"].append(_int(args.get("bytes")))
            rows["sync_kind_id"].append(intern(args["cuda_sync_kind"]) if "cuda_sync_kind" in args else -1)
            rows["rank"].append(rank)
    f64 = ("ts", "dur")
    i32 = ("cat_id", "name_id", "pid_id", "tid_id", "sync_kind_id", "rank")
    arrays = {k: np.asarray(v, dtype=np.float64 if k in f64 else np.int32 if k in i32 else np.int64)
              for k, v in rows.items()}
    # cat/name/pid/tid of -1 (absent) map to the empty symbol
    empty = intern("")
    for k in ("cat_id", "name_id", "pid_id", "tid_id"):
        arrays[k][arrays[k] < 0] = empty
    return RawColumns(symbols=intern.symbols, **arrays)
