"""Reading trace files: ``.json``, ``.json.gz`` or a directory of per-rank files, into a :class:`Trace`.

:func:`load_trace` is the streaming typed decoder (DESIGN.md "What parsing a big trace costs"): the file is read
and gunzipped in chunks on a second thread (:mod:`gaptrace.jsonstream`), each chunk of events is decoded by
msgspec into typed structs and turned into numpy columns at once (:mod:`gaptrace.eventcols`), so memory is the
columns plus a chunk, never the whole file or a Python object per event.

:func:`load_trace_reference` is the plain, obviously-correct reader (stdlib ``json``, one dict per event); it is
the oracle the fast loader is tested against: both give the same :class:`RawColumns` values per event.
"""
from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from typing import Any, Union

from .reference import events_to_raw  # noqa: F401 (public here too: the reference reader's conversion)
from .trace import RawColumns, Trace, TraceError, build_trace

__all__ = ["load_trace", "load_raw", "load_trace_reference", "events_to_raw", "trace_files", "read_bytes",
           "json_size_bytes", "estimate_load_bytes", "default_memory_limit_bytes", "read_comm_args", "comm_args"]

TRACE_SUFFIXES = (".json", ".json.gz", ".pt.trace.json", ".pt.trace.json.gz")


RANK_MAX = 2**31 - 1  # the rank column is int32


def trace_files(path: str) -> list[tuple[int, str]]:
    """The (rank, file) pairs behind ``path``: the file itself (rank 0), or a directory's trace files.

    A directory's files are ranked by a ``rank<N>`` in the name when every file has one, else by sorted name.
    Raises TraceError (one line) when the path is missing, is not a regular file or directory (a FIFO would
    block), the directory cannot be listed or holds no trace file, one of its ``.json`` / ``.json.gz`` entries
    is not a regular file (a FIFO, a sub-directory) or cannot be read, a rank number exceeds int32, or two files
    name the same rank (``rank1.json`` and ``rank01.json``: their events would merge into one rank).
    """
    if not os.path.exists(path):
        raise TraceError(f"{path}: no such file or directory")
    if not os.path.isdir(path):
        if not os.path.isfile(path):  # a FIFO, socket or device: reading it could block forever or never end
            raise TraceError(f"{path}: not a regular file (a FIFO, socket or device): give a trace file or directory")
        return [(0, path)]
    try:
        listing = os.listdir(path)
    except OSError as e:
        raise TraceError(f"{path}: cannot list the directory ({e.strerror or e})") from None
    names = sorted(n for n in listing if n.endswith((".json", ".json.gz")) and not n.endswith(".gaptrace.json"))
    if not names:
        raise TraceError(f"{path}: directory holds no .json or .json.gz trace files")
    for n in names:
        f = os.path.join(path, n)
        if not os.path.isfile(f):  # stat follows a symlink: what would be opened
            raise TraceError(f"{f}: not a regular file (a directory, FIFO, socket or device) in the trace directory")
        if not os.access(f, os.R_OK):
            raise TraceError(f"{f}: cannot read the file (permission denied)")
    ranks = [re.search(r"rank[_-]?(\d+)", n) for n in names]
    if all(ranks):
        pairs = sorted((int(m.group(1)), os.path.join(path, n)) for m, n in zip(ranks, names))
        for (r, f), (r2, f2) in zip(pairs, pairs[1:]):
            if r == r2:
                raise TraceError(f"{path}: two files name rank {r} ({os.path.basename(f)}, {os.path.basename(f2)}); "
                                 "keep one per rank")
        if pairs[-1][0] > RANK_MAX:
            raise TraceError(f"{pairs[-1][1]}: rank {pairs[-1][0]} in the file name is beyond {RANK_MAX}")
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


# ---------------------------------------------------------------- the streaming loader

# Peak memory of load_trace (columns, then the built frames) per byte of JSON: 1.0 GB of peak for 1.08 GB of
# compact JSON (~250 bytes per event, the densest form seen) in benchmarks/bench_analysis.py; the base covers
# the interpreter, numpy/pandas and the buffers.
LOAD_BYTES_PER_JSON_BYTE = 0.9
LOAD_BASE_BYTES = 200 << 20
# Below this much JSON, forking decoder processes saves nothing (56 MB: equal times).
PARALLEL_MIN_BYTES = 128 << 20
SCAN_MIN_BYTES = 64 << 20


def json_size_bytes(path: str) -> int:
    """Bytes of JSON in one plain trace file (its size); for gzip the compressed size, a lower bound only.

    The gzip trailer's ISIZE is no measure: it is the size mod 2**32 of the last member alone (zero padding after
    the stream reads as 0), so a gzip file's JSON is counted while it streams (:func:`load_raw`).
    """
    try:
        return os.path.getsize(path)
    except OSError as e:
        raise TraceError(f"{path}: cannot read ({e.strerror or e})") from None


def estimate_load_bytes(path: str) -> int:
    """Peak memory a :func:`load_trace` of ``path`` needs at least (bytes): base + factor x the JSON bytes known
    before reading (:func:`json_size_bytes`: plain sizes exactly, gzip sizes as a lower bound)."""
    total = sum(json_size_bytes(f) for _, f in trace_files(path))
    return int(LOAD_BASE_BYTES + LOAD_BYTES_PER_JSON_BYTE * total)


def _is_gzip(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(2) == b"\x1f\x8b"
    except OSError:
        return False


def _json_size_hint(path: str) -> int:
    """A guess of one file's JSON bytes for sizing buffers and choosing workers, never for refusing: a plain
    file's size; for gzip the trailer's ISIZE raised by 4 GiB steps to at least 4x the compressed size (ISIZE
    wraps above 4 GiB), at most 64x it."""
    size = json_size_bytes(path)
    try:
        with open(path, "rb") as f:
            if f.read(2) != b"\x1f\x8b" or size < 18:
                return size
            f.seek(-4, os.SEEK_END)
            isize = int.from_bytes(f.read(4), "little")
    except OSError:
        return size
    while isize < 4 * size:
        isize += 1 << 32
    return min(isize, 64 * size)


def json_budget_bytes(limit_bytes: int) -> int:
    """The most JSON bytes a load may decompress under ``limit_bytes`` of memory (inverse of the estimate)."""
    return max(0, int((limit_bytes - LOAD_BASE_BYTES) / LOAD_BYTES_PER_JSON_BYTE))


def default_memory_limit_bytes() -> int:
    """The memory a load may use by default: MemAvailable from /proc/meminfo, else 80% of physical memory."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(0.8 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def load_raw(path: str, *, memory_limit_bytes: int | None = None, chunk_bytes: int | None = None,
             workers: int | None = None, scan: bool | None = None) -> tuple[RawColumns, dict[str, Any]]:
    """Stream ``path`` (a file or a directory of per-rank files) into :class:`RawColumns` and the metadata.

    The metadata is every top-level key except ``traceEvents`` of the first rank's file (as the reference
    reader); a bare top-level list has none. ``workers`` decoder processes (default: one per core for traces of
    at least ``PARALLEL_MIN_BYTES`` of JSON, see :mod:`gaptrace.decodepool`; 0 decodes in this process) and
    ``chunk_bytes`` (bytes read per step, default 8 MiB) never change the result, nor does ``scan`` (the
    compiled scanner of :mod:`gaptrace.eventscan`; default: on for traces of at least ``SCAN_MIN_BYTES`` of
    JSON, where its compile-or-cache-load cost of about 1 s pays). Refuses up front, with the
    estimate and the limit, a trace whose :func:`estimate_load_bytes` exceeds ``memory_limit_bytes``
    (default :func:`default_memory_limit_bytes`).
    The decompressed bytes are counted while they stream (all files together): the load stops with one line
    when they pass what the limit allows (:func:`json_budget_bytes`), however small the gzip file.
    Raises TraceError (one line naming the file) for everything listed in :mod:`gaptrace.jsonstream`.
    """
    from .decodepool import DecodePool, default_workers
    from .eventcols import ColumnSink
    from .jsonstream import CHUNK_BYTES, DocumentReader, JsonBudget

    files = trace_files(path)
    chunk = chunk_bytes or CHUNK_BYTES
    limit = default_memory_limit_bytes() if memory_limit_bytes is None else memory_limit_bytes
    json_bytes = sum(json_size_bytes(f) for _, f in files)
    need = estimate_load_bytes(path)
    if need > limit:
        gz = any(_is_gzip(f) for _, f in files)
        what = f"{json_bytes / 1e9:.2f} GB of {'JSON and gzip (more once decompressed)' if gz else 'JSON'}"
        raise TraceError(f"{path}: too big to load here: {what} needs about "
                         f"{need / 1e9:.3g} GB of memory, over the limit of {limit / 1e9:.3g} GB")
    budget = JsonBudget(json_budget_bytes(limit), limit)
    hint = min(sum(_json_size_hint(f) for _, f in files), budget.max_bytes)
    if scan is None:
        scan = hint >= SCAN_MIN_BYTES
    if workers is None:  # threads for the scanner (cheap to start), processes only where they pay
        workers = default_workers(threads=True) if scan else default_workers() if hint >= PARALLEL_MIN_BYTES else 0
    sink = ColumnSink(expected_events=hint // 200, scan=scan)  # Kineto: 250-450 bytes per event
    metadata: dict[str, Any] = {}
    pool = DecodePool(workers, 3 * chunk + (1 << 16), sink.symbols) if workers > 0 else None
    try:
        for i, (rank, f) in enumerate(files):
            sink.start_rank(rank)
            # a small file reads in one small step (3,000 rank files must not each zero a 16 MiB buffer)
            step = chunk if pool is not None else min(chunk, max(1 << 16, _json_size_hint(f) + 1))
            doc = DocumentReader(f, sink, step, pool, budget=budget)
            doc.read()
            if i == 0:
                metadata = doc.metadata
    finally:
        if pool is not None:
            pool.close()
    return sink.finish(), metadata


def load_trace(path: str, *, memory_limit_bytes: int | None = None, chunk_bytes: int | None = None,
               workers: int | None = None, scan: bool | None = None) -> Trace:
    """Load a Kineto/Chrome trace (``.json``, ``.json.gz``, or a directory of per-rank files) into a Trace.

    Streaming and typed (see the module docstring); the same events and values as :func:`load_trace_reference`
    (tests/trace/test_loader.py checks every fixture trace). ``workers`` and ``chunk_bytes`` change only the speed
    (:func:`load_raw`). benchmarks/bench_analysis.py prints what it costs: on a 1.08 GB trace about 6x faster
    than stdlib ``json.loads`` of the same file alone, at a seventh of its peak memory.
    Raises TraceError with one line naming the file and the problem.
    """
    raw, metadata = load_raw(path, memory_limit_bytes=memory_limit_bytes, chunk_bytes=chunk_bytes,
                             workers=workers, scan=scan)
    return build_trace(raw, path, metadata)


# ---------------------------------------------------------------- collective annotations (a second, narrow pass)

# The args keys Kineto writes on a collective: on the NCCL kernel itself (PyTorch >= 2.2) and on the
# ``record_param_comms`` cpu_op that launched it (both carry the launch's "External id").
COMM_ARG_KEYS = {"Collective name": "collective", "Process Group Name": "process_group",
                 "Process Group Ranks": "process_group_ranks", "Group size": "group_size", "Seq": "seq",
                 "seq": "seq", "In msg nelems": "in_nelems", "dtype": "dtype"}
COMM_COLUMNS = ("rank", "cat", "name", "ts_us", "correlation", "external_id", "collective", "process_group",
                "process_group_ranks", "group_size", "seq", "in_nelems", "dtype")


class _CommSink:
    """A :class:`gaptrace.jsonstream.DocumentReader` sink that keeps only the events carrying collective args
    (one dict each, few per step); every other event is decoded into an empty struct and dropped."""

    def __init__(self) -> None:
        import msgspec

        self._keys = list(COMM_ARG_KEYS) + ["correlation", "External id"]
        args = msgspec.defstruct("CommArgs", [(f"k{i}", Any, msgspec.field(default=None, name=k))
                                              for i, k in enumerate(self._keys)], gc=False)
        event = msgspec.defstruct("CommEvent", [("cat", Any, ""), ("name", Any, ""), ("ts", Any, None),
                                                ("args", Union[args, None], None)],
                                  tag="X", tag_field="ph", gc=False)
        others = tuple(msgspec.defstruct(f"CommPhase_{i}", [], tag=ph, tag_field="ph", gc=False)
                       for i, ph in enumerate(("B", "E", "i", "I", "C", "b", "n", "e", "s", "t", "f", "P", "N", "O",
                                               "D", "M", "V", "v", "R", "c", "(", ")")))
        self._event = event
        self._typed = msgspec.json.Decoder(list[Union[(event, *others)]])
        self._untyped = msgspec.json.Decoder(list[Any])
        self.rows: list[dict] = []
        self.rank = 0
        self.elements = 0
        self._mark = 0

    def start_rank(self, rank: int) -> None:
        self.rank, self.elements, self._mark = rank, 0, len(self.rows)

    def discard_rank(self) -> None:
        del self.rows[self._mark:]
        self.elements = 0

    def _keep(self, cat, name, ts, args: dict) -> None:
        got = {COMM_ARG_KEYS[k]: args[k] for k in COMM_ARG_KEYS if args.get(k) is not None}
        if "collective" not in got and "process_group" not in got:
            return
        row = {c: None for c in COMM_COLUMNS}
        row.update(got)
        row.update(rank=self.rank, cat=str(cat), name=str(name),
                   ts_us=float(ts) if isinstance(ts, (int, float)) and not isinstance(ts, bool) else float("nan"),
                   correlation=args.get("correlation"), external_id=args.get("External id"))
        self.rows.append(row)

    def add_json(self, piece) -> None:
        import msgspec

        try:
            events = self._typed.decode(piece)
        except msgspec.ValidationError:
            self.add_python(self._untyped.decode(piece))
            return
        self.elements += len(events)
        for e in events:
            a = getattr(e, "args", None)
            if a is not None and (a.k0 is not None or a.k1 is not None):  # "Collective name", "Process Group Name"
                self._keep(e.cat, e.name, e.ts, {k: getattr(a, f"k{i}") for i, k in enumerate(self._keys)})

    def add_python(self, events: list) -> None:
        self.elements += len(events)
        for e in events:
            if isinstance(e, dict) and e.get("ph") == "X" and isinstance(e.get("args"), dict):
                self._keep(e.get("cat", ""), e.get("name", ""), e.get("ts"), e["args"])


def _comm_value(v: Any, kind: type) -> Any:
    """An args value as ``kind`` (int or str), None when it is neither (a list, a dict, a bool, a float id)."""
    if kind is int:
        return v if isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63 else None
    return None if isinstance(v, (list, dict, bool)) or v is None else str(v)


def read_comm_args(path: str, *, memory_limit_bytes: int | None = None):
    """The collective annotations of the trace at ``path`` (a file, or a directory of per-rank files): one row per
    complete event whose ``args`` hold ``"Collective name"`` or ``"Process Group Name"`` (Kineto writes them on
    NCCL/RCCL kernels and on the ``record_param_comms`` cpu_op that launched them).

    A pandas DataFrame with columns ``COMM_COLUMNS``: rank (the file's, :func:`trace_files`), cat, name, ts_us
    (µs, the trace's own clock), correlation, external_id, group_size, seq, in_nelems (int64, -1 where absent),
    collective, process_group, process_group_ranks, dtype (str or None). A second pass over the
    file with a decoder that skips every other key (about the typed loader's own decode time); values of another
    JSON type than the column's read as None. Raises TraceError (one line) as :func:`load_raw` does.
    """
    import pandas as pd

    from .jsonstream import CHUNK_BYTES, DocumentReader, JsonBudget

    files = trace_files(path)
    limit = default_memory_limit_bytes() if memory_limit_bytes is None else memory_limit_bytes
    sink = _CommSink()
    budget = JsonBudget(json_budget_bytes(limit), limit)
    for rank, f in files:
        sink.start_rank(rank)
        DocumentReader(f, sink, min(CHUNK_BYTES, max(1 << 16, _json_size_hint(f) + 1)), None, budget=budget).read()
    rows = sink.rows
    ints = ("correlation", "external_id", "group_size", "seq", "in_nelems")
    for r in rows:
        for c in ints:
            r[c] = _comm_value(r[c], int)
        for c in ("collective", "process_group", "process_group_ranks", "dtype"):
            r[c] = _comm_value(r[c], str)
    import numpy as np

    cols = {c: [r[c] for r in rows] for c in COMM_COLUMNS}
    for c in ints + ("rank",):  # absent integers are -1, as in every frame of the trace model
        cols[c] = np.array([-1 if v is None else v for v in cols[c]], dtype=np.int64)
    cols["ts_us"] = np.array(cols["ts_us"], dtype=np.float64)
    for c in ("cat", "name", "collective", "process_group", "process_group_ranks", "dtype"):
        cols[c] = np.array(cols[c], dtype=object)
    return pd.DataFrame(cols, columns=list(COMM_COLUMNS))


def comm_args(trace: Trace):
    """:func:`read_comm_args` of the file(s) ``trace`` was loaded from, read once per trace (:meth:`Trace.memo`),
    and only when the trace names a collective at all (a ``record_param_comms`` host event or an NCCL/RCCL kernel):
    otherwise an empty frame without reading anything. Raises TraceError when the file is gone or changed."""
    import pandas as pd

    def build():
        names = trace.symbols.astype(str)
        if not (names.str.startswith(("nccl", "rccl", "record_param_comms"))).any():
            return pd.DataFrame({c: [] for c in COMM_COLUMNS})
        return read_comm_args(trace.path)

    return trace.memo("comm_args", trace.host, build)
