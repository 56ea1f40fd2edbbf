"""Reading trace files: ``.json``, ``.json.gz`` or a directory of per-rank files, into a :class:`Trace`.

:func:`load_trace_reference` is the plain, obviously-correct reader (stdlib ``json``, one dict per event); it is
the oracle the fast loader is tested against.
"""
from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from typing import Any, Iterable

import numpy as np

from .trace import RawColumns, Trace, TraceError, build_trace

__all__ = ["load_trace_reference", "trace_files", "read_bytes"]

TRACE_SUFFIXES = (".json", ".json.gz", ".pt.trace.json", ".pt.trace.json.gz")


def trace_files(path: str) -> list[tuple[int, str]]:
    """The (rank, file) pairs behind ``path``: the file itself (rank 0), or a directory's trace files.

    A directory's files are ranked by a ``rank<N>`` in the name when every file has one, else by sorted name.
    Raises TraceError when the path is missing or the directory holds no trace file.
    """
    if not os.path.exists(path):
        raise TraceError(f"{path}: no such file or directory")
    if not os.path.isdir(path):
        return [(0, path)]
    names = sorted(n for n in os.listdir(path) if n.endswith((".json", ".json.gz")) and not n.endswith(".gaptrace.json"))
    if not names:
        raise TraceError(f"{path}: directory holds no .json or .json.gz trace files")
    ranks = [re.search(r"rank[_-]?(\d+)", n) for n in names]
    if all(ranks):
        pairs = sorted((int(m.group(1)), os.path.join(path, n)) for m, n in zip(ranks, names))
    else:
        pairs = [(i, os.path.join(path, n)) for i, n in enumerate(names)]
    return pairs


def read_bytes(path: str) -> bytes:
    """The file's JSON bytes, gunzipped when the file starts with the gzip magic. TraceError on a bad gzip."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            raise TraceError(f"{path}: truncated or corrupt gzip ({e})") from None
    return data


class _Interner:
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


def _int(v: Any) -> int:
    if v is None or isinstance(v, bool):
        return -1
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return int(v) if np.isfinite(v) else -1
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            return -1
    return -1


def _float(v: Any) -> float:
    if isinstance(v, bool):
        return float("nan")
    if isinstance(v, (int, float)):
        return float(v)
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


def _metadata(doc: dict) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != "traceEvents"}


def load_trace_reference(path: str) -> Trace:
    """Load a trace with stdlib ``json``: simple and slow (about 36 s and 5.8 GB for 1 GB of JSON).

    Raises TraceError (one line naming the file) for a missing file, bad gzip, non-JSON, a document without a
    ``traceEvents`` list, or no complete events.
    """
    per_rank = []
    metadata: dict[str, Any] = {}
    for rank, f in trace_files(path):
        data = read_bytes(f)
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise TraceError(f"{f}: not valid JSON ({e})") from None
        if isinstance(doc, list):
            doc = {"traceEvents": doc}
        if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
            raise TraceError(f"{f}: no 'traceEvents' list (is this a Kineto/Chrome trace?)")
        if rank == trace_files(path)[0][0]:
            metadata = _metadata(doc)
        per_rank.append((rank, doc["traceEvents"]))
    raw = events_to_raw(per_rank)
    return build_trace(raw, path, metadata)
def load_trace(path):
    return load_trace_reference(path)
