"""The typed trace model: a Kineto/Chrome trace as a few pandas frames plus a symbol table.

A trace written by ``torch.profiler`` (Kineto) is ``{"traceEvents": [...], "deviceProperties": [...], ...}``.
Complete events (``ph == "X"``) carry ``ts`` and ``dur`` in microseconds (floats, kept at full precision:
nothing here rounds). gaptrace keeps five frames (HTA's "trace as tables", DESIGN.md "The trace"):

``host``      one row per host event: python_function, cpu_op, user_annotation, cuda_runtime, cuda_driver.
``device``    one row per device activity that makes the device busy: kernel, memcpy, memset.
``gpu_annotations``  gpu_user_annotation ranges (record_function projected onto GPU time; never busy time).
``device_syncs``     ``cuda_sync`` events (only with ``enable_cuda_sync_events``).
``overhead``  the profiler's own events (``Buffer Flush`` ...), reported, never counted as busy.
``windows``   the profiler's capture windows: Kineto writes one ``cat: "Trace"`` event ("PyTorch Profiler (0)")
              per window it recorded; a trace with several (a ``schedule`` with ``repeat``, files joined) has
              stretches between them that the profiler did not see (:meth:`Trace.window_joins`).

String columns (``name``, ``pid``, ``tid``) are pandas Categoricals over one shared symbol table
(``Trace.symbols``), so ``frame["name"].cat.codes`` are comparable across frames and names are stored once.

Columns (all times in microseconds on the trace's own clock, ``-1`` where an integer is absent):

host:            rank, cat, name, pid, tid, ts_us, dur_us, end_us, correlation, external_id,
                 python_id, python_parent_id, cbid
device:          rank, kind ("kernel"|"memcpy"|"memset"), name, device, stream, ts_us, dur_us, end_us,
                 correlation, external_id, bytes, memcpy_kind ("DtoH", "HtoD", "DtoD", ...),
                 host_memory ("Pageable", "Pinned", ... or "")
gpu_annotations: rank, name, device, stream, ts_us, dur_us, end_us, external_id
device_syncs:    rank, name, device, stream, ts_us, dur_us, end_us, correlation, sync_kind
overhead:        rank, name, ts_us, dur_us, end_us
windows:         rank, name, ts_us, dur_us, end_us

Loading goes through :func:`gaptrace.loader.load_trace` (a streaming typed decoder); this module holds the model
and :func:`build_trace`, which turns raw event columns into the model and runs the integrity checks.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable

import numpy as np
import pandas as pd

__all__ = [
    "TraceError",
    "Trace",
    "RawColumns",
    "build_trace",
    "HOST_CATEGORIES",
    "GRAPH_LAUNCH_NAMES",
    "clean_text",
]


class TraceError(ValueError):
    """A trace that cannot be analysed. ``str(err)`` is one line naming the file and the problem."""


# Old Kineto (2021) wrote capitalised categories; normalise them to the current names.
CATEGORY_ALIASES = {
    "Operator": "cpu_op",
    "Runtime": "cuda_runtime",
    "Driver": "cuda_driver",
    "Kernel": "kernel",
    "Memcpy": "gpu_memcpy",
    "Memset": "gpu_memset",
    "python_function": "python_function",
    "Python function": "python_function",
}
HOST_CATEGORIES = ("python_function", "cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")
DEVICE_CATEGORIES = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
DEVICE_KINDS = ("kernel", "memcpy", "memset")
# every category gaptrace keeps, in code order: host categories first, then device kinds, then the rest
ALL_CATEGORIES = HOST_CATEGORIES + tuple(DEVICE_CATEGORIES) + ("gpu_user_annotation", "cuda_sync", "overhead",
                                                              "Trace")
GRAPH_LAUNCH_NAMES = ("cudaGraphLaunch", "cudaGraphLaunch_v10000", "hipGraphLaunch", "cuGraphLaunch")

# "Memcpy DtoH (Device -> Pageable)" -> ("DtoH", "Pageable"); HIP writes "Memcpy DtoH (Device -> Host)".
_MEMCPY_RE = re.compile(r"Memcpy\s+(\w+)\s*(?:\(([^)]*)\))?")


@dataclasses.dataclass
class RawColumns:
    """Raw per-event columns as decoded from the JSON, before normalisation (one entry per ``ph == "X"`` event).

    Every array has the same length n. Strings are interned: ``*_id`` arrays index ``symbols``.
    Integer fields absent in the event are -1; ``ts``/``dur`` absent are NaN. ``pid``/``tid`` are the events'
    own values as strings (Kineto writes both ints and strings such as ``"stream 7"``).
    """

    symbols: list[str]
    cat_id: np.ndarray  # int32
    name_id: np.ndarray  # int32
    pid_id: np.ndarray  # int32
    tid_id: np.ndarray  # int32
    ts: np.ndarray  # float64, µs
    dur: np.ndarray  # float64, µs
    correlation: np.ndarray  # int64
    external_id: np.ndarray  # int64
    python_id: np.ndarray  # int64
    python_parent_id: np.ndarray  # int64
    cbid: np.ndarray  # int64
    device: np.ndarray  # int64, args.device
    stream: np.ndarray  # int64, args.stream
    bytes: np.ndarray  # int64, args.bytes
    sync_kind_id: np.ndarray  # int32 into symbols, args.cuda_sync_kind (-1 if absent)
    rank: np.ndarray  # int32


@dataclasses.dataclass
class Trace:
    """One loaded trace (possibly several ranks). See the module docstring for the columns.

    ``_memo`` (not an argument, not compared) holds what analyses derive from the trace and share (the host
    stack tree, busy timelines, the device ids): owned by the trace, so it is dropped with it (:meth:`memo`).
    """

    path: str
    host: pd.DataFrame
    device: pd.DataFrame
    gpu_annotations: pd.DataFrame
    device_syncs: pd.DataFrame
    overhead: pd.DataFrame
    symbols: pd.Index
    metadata: dict[str, Any]
    warnings: list[str]
    windows: pd.DataFrame = dataclasses.field(default_factory=lambda: pd.DataFrame(
        {"rank": np.zeros(0, np.int32), "name": [], "ts_us": np.zeros(0), "dur_us": np.zeros(0),
         "end_us": np.zeros(0)}))
    _memo: dict[Any, tuple[Any, Any]] = dataclasses.field(default_factory=dict, init=False, repr=False,
                                                          compare=False)

    def __repr__(self) -> str:
        """One line: the path, the event counts, ranks and devices, the host time span (the frames' own reprs fill
        screens; print ``trace.host`` for them)."""
        h, d = self.host, self.device
        devs = sorted({(int(r), int(x)) for r, x in zip(d["rank"], d["device"])}) if len(d) else []
        span = ""
        if len(h):
            t0, t1 = float(h["ts_us"].min()), float(h["end_us"].max())
            span = f", host span {(t1 - t0) / 1e3:,.1f} ms"
        ranks = sorted({int(r) for r in h["rank"].unique()}) if len(h) else []
        return (f"Trace({self.path!r}: {len(h):,} host events, {len(d):,} device events, "
                f"{len(self.gpu_annotations):,} GPU annotations, {len(self.device_syncs):,} device syncs; "
                f"ranks {ranks}, devices {[f'{r}:{x}' for r, x in devs][:8]}{' …' if len(devs) > 8 else ''}{span}"
                f"{f'; {len(self.warnings)} warnings' if self.warnings else ''})")

    def window_joins(self, starts_us: np.ndarray, rank: int | None = None) -> np.ndarray:
        """(len(starts_us) − 1,) bool: True where the period [starts_us[i], starts_us[i+1]) (trace clock, µs,
        sorted) is not inside one profiler window of ``rank`` (every rank when None): its two starts lie in
        different windows of :attr:`windows`, or one lies outside every window. Such a period spans a stretch the
        profiler did not record (between two ``schedule`` cycles, two joined files): it is no round of the loop.
        All False when the trace has fewer than two windows (one window, or none written)."""
        starts = np.asarray(starts_us, dtype=np.float64)
        out = np.zeros(max(len(starts) - 1, 0), dtype=bool)
        w = self.windows
        if rank is not None and len(w):
            w = w[w["rank"].to_numpy() == rank]
        if len(w) < 2 or not len(out):
            return out
        order = np.argsort(w["ts_us"].to_numpy(), kind="stable")
        ws, we = w["ts_us"].to_numpy()[order], w["end_us"].to_numpy()[order]
        k = np.searchsorted(ws, starts, side="right") - 1
        inside = (k >= 0) & (starts <= we[np.maximum(k, 0)])
        k = np.where(inside, k, -1)
        return (k[:-1] != k[1:]) | (k[:-1] < 0)

    def memo(self, key: Any, source: Any, build: Callable[[], Any]) -> Any:
        """``build()``, computed once per ``key`` and kept on this trace while ``source`` (the frame the value is
        derived from, e.g. ``self.host``) is the same object: assigning a new frame to the field (``trace.device
        = ...``) makes the next call rebuild; editing a frame in place is not seen. For values that are never
        mutated after they are built (frozen timelines, the stack tree)."""
        hit = self._memo.get(key)
        if hit is not None and hit[0] is source:
            return hit[1]
        value = build()
        self._memo[key] = (source, value)
        return value

    def host_str(self, column: str) -> np.ndarray:
        """``self.host[column].astype(str).to_numpy()`` ((n,) object array of str), computed once per column while
        ``self.host`` is the same frame (:meth:`memo`) and read-only: analyses compare thread ids, names and
        categories of millions of rows as strings many times."""
        def build() -> np.ndarray:
            out = self.host[column].astype(str).to_numpy()
            out.flags.writeable = False
            return out
        return self.memo(("host_str", column), self.host, build)

    def host_str_eq(self, column: str, value: str) -> np.ndarray:
        """(n,) bool: ``self.host_str(column) == value``, from the column's categorical codes when it is one (the
        categories whose string is ``value``; a missing value's string is "nan"), else from the strings."""
        col = self.host[column]
        if not isinstance(col.dtype, pd.CategoricalDtype):
            return self.host_str(column) == value
        cats = np.asarray(col.cat.categories.astype(str), dtype=object)
        hit = np.flatnonzero(cats == value)
        codes = col.cat.codes.to_numpy()
        if value == "nan":
            hit = np.r_[hit, -1]
        if len(hit) == 1:
            return codes == hit[0]
        return np.isin(codes, hit)

    def device_str(self, column: str) -> np.ndarray:
        """:meth:`host_str` of ``self.device``: ``self.device[column].astype(str).to_numpy()``, memoised, read-only."""
        def build() -> np.ndarray:
            out = self.device[column].astype(str).to_numpy()
            out.flags.writeable = False
            return out
        return self.memo(("device_str", column), self.device, build)

    @property
    def device_ids(self) -> list[tuple[int, int]]:
        """Sorted (rank, device) pairs that have device activity (a new list each call; computed once per
        ``device`` frame, :meth:`memo`)."""
        return list(self.memo("device_ids", self.device, self._device_ids))

    def _device_ids(self) -> tuple[tuple[int, int], ...]:
        if self.device.empty:
            return ()
        pairs = self.device[["rank", "device"]].drop_duplicates().sort_values(["rank", "device"])
        return tuple((int(r), int(d)) for r, d in pairs.itertuples(index=False))

    @property
    def has_python_stacks(self) -> bool:
        return bool((self.host["cat"] == "python_function").any())

    def device_name(self, device: int) -> str:
        """The GPU's product name from ``deviceProperties`` ("GPU 0" when absent or malformed), at most
        DEVICE_NAME_MAX characters (a longer one cut, marked "…")."""
        props_list = self.metadata.get("deviceProperties")
        for props in props_list if isinstance(props_list, list) else []:
            if isinstance(props, dict) and props.get("id") == device and props.get("name"):
                name = clean_text(str(props["name"])[:DEVICE_NAME_MAX + 1])
                return name if len(name) <= DEVICE_NAME_MAX else name[:DEVICE_NAME_MAX] + "…"
        return f"GPU {device}"


_SURROGATE = re.compile("[\ud800-\udfff]")
DEVICE_NAME_MAX = 200  # a product name is ~30 characters; an untrusted trace's can be megabytes


def clean_text(s: str) -> str:
    """``s`` with each lone surrogate replaced by U+FFFD. JSON may escape one (``"\\udfff"``) and both JSON readers
    accept it, but no UTF-8 output (a terminal, the JSON we print, the HTML report) can encode it."""
    return _SURROGATE.sub("\ufffd", s)


def _clean_symbols(raw: RawColumns) -> RawColumns:
    """``raw`` with :func:`clean_text` and :func:`gaptrace.bounds.bound_name` applied to its symbol table; symbols
    that become equal are merged (their ids remapped), so the table stays unique. One regex pass over the table when
    there is nothing to clean."""
    from .bounds import MAX_NAME_CHARS, bound_name
    if not _SURROGATE.search("\x00".join(raw.symbols)) and max(map(len, raw.symbols), default=0) <= MAX_NAME_CHARS:
        return raw
    index: dict[str, int] = {}
    remap = np.array([index.setdefault(bound_name(clean_text(s)), len(index)) for s in raw.symbols], dtype=np.int32)
    ids = {c: np.where(getattr(raw, c) >= 0, remap[np.maximum(getattr(raw, c), 0)], getattr(raw, c)).astype(np.int32)
           for c in ("cat_id", "name_id", "pid_id", "tid_id", "sync_kind_id")}
    return dataclasses.replace(raw, symbols=list(index), **ids)


def _categorical(codes: np.ndarray, symbols: pd.Index) -> pd.Categorical:
    return pd.Categorical.from_codes(codes.astype(np.int32, copy=False), categories=symbols, validate=False)


def _parse_int_symbol(s: str) -> int:
    """'stream 7' -> 7, '7' -> 7, anything else (or a number outside int64) -> -1."""
    m = re.search(r"-?\d+", s)
    if not m or len(m.group(0)) > 20:  # more digits than any int64 (and int() refuses 4,300 digits)
        return -1
    v = int(m.group(0))
    return v if -(2**63) <= v < 2**63 else -1


OUTLIER_SPANS = 100.0  # an event more than this many trace spans away from the bulk of the trace is corrupt
MIN_SPAN_US = 1e6


def _far_outliers(ts: np.ndarray, dur: np.ndarray, keep: np.ndarray, warnings: list[str]) -> np.ndarray:
    """(n,) bool: events whose interval lies absurdly far from the rest of the trace (a corrupt ``ts`` such as -100
    among 5e12 µs, or a duration of 1e300), which would otherwise stretch every window to nonsense.

    The bulk is the 0.1%-99.9% quantile range of start times, its span ``w`` at least 1 s; an event starting
    before q0.001 − 100·w or ending after q0.999 + 100·w is dropped, with a warning saying how many. The quantiles
    are order statistics taken inward (no interpolation towards the extremes), so in a trace of fewer than 1,000
    events the earliest and the latest start are outside the bulk: one timestamp of 1e300 (or ±1.7e308, whose
    span overflows to inf) among 40 events is dropped, not made the window.
    """
    out = np.zeros(len(ts), dtype=bool)
    idx = np.flatnonzero(keep)
    if len(idx) < 2:
        return out
    step = max(1, len(idx) // 200_000)  # quantiles of a regular subsample: plenty for a 100-span margin
    sample = ts[idx[::step]]
    lo = float(np.quantile(sample, 0.001, method="higher"))
    hi = float(np.quantile(sample, 0.999, method="lower"))
    with np.errstate(over="ignore", invalid="ignore"):  # spans of ±1e308 overflow to inf: then nothing is far
        w = max(hi - lo, MIN_SPAN_US)
        far = (ts[idx] < lo - OUTLIER_SPANS * w) | (ts[idx] + dur[idx] > hi + OUTLIER_SPANS * w)
    if far.any():
        out[idx[far]] = True
        warnings.append(f"{int(far.sum())} events lie more than {OUTLIER_SPANS:.0f}× the trace's span away from "
                        "the rest of it (a corrupt timestamp or duration) and were dropped")
    return out


MAX_TIME_ULP_US = 1.0  # float64 must resolve at least this finely where the trace's times lie


def _check_time_resolution(ts: np.ndarray, dur: np.ndarray, keep: np.ndarray, path: str) -> None:
    """TraceError (one line) when the kept times lie so far from zero that float64 cannot tell 1 µs apart
    (beyond 2**52 µs, 143 years: ``np.spacing`` of the largest time over ``MAX_TIME_ULP_US``): near 1e18 µs the
    spacing is 128 µs and 83 gaps of 700 µs read as 7. Kineto's clocks are far below it (5e12 µs on the H200
    traces; the Unix epoch in µs is 1.8e15, spacing 0.25 µs)."""
    if not keep.any():
        return
    with np.errstate(over="ignore", invalid="ignore"):
        t = float(np.max(np.abs(ts[keep]) + np.abs(dur[keep])))
    if not np.isfinite(t) or np.spacing(t) > MAX_TIME_ULP_US:
        raise TraceError(f"{path}: timestamps reach {t:.3g} µs, where float64 resolves only {np.spacing(t):.3g} µs: "
                         "gaps and durations there cannot be told apart (a corrupt or foreign clock)")


def build_trace(raw: RawColumns, path: str, metadata: dict[str, Any]) -> Trace:
    """Normalise raw event columns into a :class:`Trace` and run the integrity checks.

    Vectorised over events (no per-event Python loop); per-symbol work is over the symbol table only.
    Raises :class:`TraceError` when the trace holds no complete events at all.
    """
    n = len(raw.ts)
    warnings: list[str] = []
    if n == 0:
        raise TraceError(f"{path}: the trace holds no complete ('ph': 'X') events")

    from .bounds import MAX_NAME_CHARS
    long_names = sum(len(s) > MAX_NAME_CHARS for s in raw.symbols)
    if long_names:
        warnings.append(f"{long_names} names longer than {MAX_NAME_CHARS:,} characters were cut to their first "
                        f"{MAX_NAME_CHARS:,} (marked '…[N more characters #hash]')")
    raw = _clean_symbols(raw)
    symbols_list = list(raw.symbols)
    # Normalised category code per symbol, then per event by integer indexing (no per-event string work)
    cat_index = {c: i for i, c in enumerate(ALL_CATEGORIES)}
    sym_cat = np.array([cat_index.get(CATEGORY_ALIASES.get(s, s), -1) for s in symbols_list] or [-1], dtype=np.int8)
    cat_code = sym_cat[raw.cat_id]

    with np.errstate(over="ignore", invalid="ignore"):  # ts + dur of 1e308 + 1e308 overflows to inf: dropped too
        bad = ~np.isfinite(raw.ts) | ~np.isfinite(raw.dur) | ~np.isfinite(raw.ts + raw.dur)
    if bad.any():
        warnings.append(f"{int(bad.sum())} events without a finite ts/dur/end were dropped")
    neg = np.isfinite(raw.dur) & (raw.dur < 0)
    if neg.any():
        warnings.append(f"{int(neg.sum())} events with negative durations were dropped")
    keep = ~bad & ~neg
    keep &= ~_far_outliers(raw.ts, raw.dur, keep, warnings)
    _check_time_resolution(raw.ts, raw.dur, keep, path)

    symbols = pd.Index(symbols_list, dtype=object)
    sym_int = None  # lazily parsed integer value of each symbol (for "stream 7" tids)

    def cols(mask: np.ndarray) -> dict[str, np.ndarray]:
        idx = np.flatnonzero(mask & keep)
        ts = raw.ts[idx]
        dur = raw.dur[idx]
        return {"idx": idx, "ts_us": ts, "dur_us": dur, "end_us": ts + dur}

    # ---- host (host categories are codes 0..4 of ALL_CATEGORIES, in HOST_CATEGORIES order)
    c = cols((cat_code >= 0) & (cat_code < len(HOST_CATEGORIES)))
    i = c["idx"]
    host = pd.DataFrame(
        {
            "rank": raw.rank[i],
            "cat": pd.Categorical.from_codes(cat_code[i].astype(np.int8), categories=list(HOST_CATEGORIES)),
            "name": _categorical(raw.name_id[i], symbols),
            "pid": _categorical(raw.pid_id[i], symbols),
            "tid": _categorical(raw.tid_id[i], symbols),
            "ts_us": c["ts_us"],
            "dur_us": c["dur_us"],
            "end_us": c["end_us"],
            "correlation": raw.correlation[i],
            "external_id": raw.external_id[i],
            "python_id": raw.python_id[i],
            "python_parent_id": raw.python_parent_id[i],
            "cbid": raw.cbid[i],
        },
        copy=False,  # the columns are fresh arrays: skip pandas consolidating them into 2-D blocks (0.6 s/GB)
    )

    # ---- device activities
    def dev_stream(i: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        nonlocal sym_int
        if sym_int is None:
            sym_int = np.array([_parse_int_symbol(s) for s in symbols_list], dtype=np.int64)
        device = raw.device[i].copy()
        stream = raw.stream[i].copy()
        miss_d = device < 0
        device[miss_d] = sym_int[raw.pid_id[i][miss_d]]
        miss_s = stream < 0
        stream[miss_s] = sym_int[raw.tid_id[i][miss_s]]
        return device, stream

    first_dev = cat_index["kernel"]
    c = cols((cat_code >= first_dev) & (cat_code < first_dev + len(DEVICE_KINDS)))
    i = c["idx"]
    device, stream = dev_stream(i)
    kind_code = (cat_code[i] - first_dev).astype(np.int8)
    # memcpy kind and host memory kind, parsed once per distinct memcpy name, as codes into two small tables
    mk_tab, hm_tab = [""], [""]
    mk = np.zeros(len(symbols_list), dtype=np.int16)
    hm = np.zeros(len(symbols_list), dtype=np.int16)
    memcpy_names = np.unique(raw.name_id[i][kind_code == DEVICE_KINDS.index("memcpy")])
    for sid in memcpy_names:
        m = _MEMCPY_RE.search(symbols_list[sid])
        if not m:
            continue
        kind, memory = m.group(1), ""
        arrow = (m.group(2) or "").split("->")
        if len(arrow) == 2:
            src, dst = arrow[0].strip(), arrow[1].strip()
            memory = dst if kind.startswith("Dto") else src
            if memory == "Device":
                memory = ""
        for tab, arr, v in ((mk_tab, mk, kind), (hm_tab, hm, memory)):
            if v not in tab:
                tab.append(v)
            arr[sid] = tab.index(v)
    dev_frame = pd.DataFrame(
        {
            "rank": raw.rank[i],
            "kind": pd.Categorical.from_codes(kind_code, categories=list(DEVICE_KINDS)),
            "name": _categorical(raw.name_id[i], symbols),
            "device": device,
            "stream": stream,
            "ts_us": c["ts_us"],
            "dur_us": c["dur_us"],
            "end_us": c["end_us"],
            "correlation": raw.correlation[i],
            "external_id": raw.external_id[i],
            "bytes": raw.bytes[i],
            "memcpy_kind": pd.Categorical.from_codes(mk[raw.name_id[i]], categories=mk_tab),
            "host_memory": pd.Categorical.from_codes(hm[raw.name_id[i]], categories=hm_tab),
        },
        copy=False,  # the columns are fresh arrays: skip pandas consolidating them into 2-D blocks (0.6 s/GB)
    )

    # ---- GPU annotations
    c = cols(cat_code == cat_index["gpu_user_annotation"])
    i = c["idx"]
    device, stream = dev_stream(i)
    gpu_ann = pd.DataFrame(
        {
            "rank": raw.rank[i],
            "name": _categorical(raw.name_id[i], symbols),
            "device": device,
            "stream": stream,
            "ts_us": c["ts_us"],
            "dur_us": c["dur_us"],
            "end_us": c["end_us"],
            "external_id": raw.external_id[i],
        },
        copy=False,  # the columns are fresh arrays: skip pandas consolidating them into 2-D blocks (0.6 s/GB)
    )

    # ---- cuda_sync events
    c = cols(cat_code == cat_index["cuda_sync"])
    i = c["idx"]
    device, stream = dev_stream(i)
    syncs = pd.DataFrame(
        {
            "rank": raw.rank[i],
            "name": _categorical(raw.name_id[i], symbols),
            "device": device,
            "stream": stream,
            "ts_us": c["ts_us"],
            "dur_us": c["dur_us"],
            "end_us": c["end_us"],
            "correlation": raw.correlation[i],
            "sync_kind": _categorical(np.where(raw.sync_kind_id[i] >= 0, raw.sync_kind_id[i], -1), symbols),
        },
        copy=False,  # the columns are fresh arrays: skip pandas consolidating them into 2-D blocks (0.6 s/GB)
    )

    # ---- profiler overhead
    c = cols(cat_code == cat_index["overhead"])
    i = c["idx"]
    overhead = pd.DataFrame(
        {
            "rank": raw.rank[i],
            "name": _categorical(raw.name_id[i], symbols),
            "ts_us": c["ts_us"],
            "dur_us": c["dur_us"],
            "end_us": c["end_us"],
        },
        copy=False,  # the columns are fresh arrays: skip pandas consolidating them into 2-D blocks (0.6 s/GB)
    )

    # ---- the profiler's capture windows (Kineto's "Trace" span events)
    c = cols(cat_code == cat_index["Trace"])
    i = c["idx"]
    windows = pd.DataFrame({"rank": raw.rank[i], "name": _categorical(raw.name_id[i], symbols), "ts_us": c["ts_us"],
                            "dur_us": c["dur_us"], "end_us": c["end_us"]}, copy=False)

    trace = Trace(
        path=path,
        host=host,
        device=dev_frame,
        gpu_annotations=gpu_ann,
        device_syncs=syncs,
        overhead=overhead,
        symbols=symbols,
        metadata=metadata,
        warnings=warnings,
        windows=windows,
    )
    trace.warnings.extend(integrity_warnings(trace))
    return trace


EARLY_DEVICE_US = 1.0  # a device activity may not start this long before its launch call (clock tolerance)


def _device_before_launch(trace: "Trace") -> tuple[int, int] | None:
    """(device activities that start more than EARLY_DEVICE_US before the start of the cuda_runtime / cuda_driver
    call of the same rank and correlation id, those tied to one) or None when none is early. Correlation ids that
    more than one call of a rank carries are left out (no call to compare with)."""
    host, dev = trace.host, trace.device
    if dev.empty or host.empty:
        return None
    rt = host[(trace.host_str_eq("cat", "cuda_runtime") | trace.host_str_eq("cat", "cuda_driver"))
              & (host["correlation"].to_numpy() > 0)]
    if rt.empty:
        return None
    key = rt["rank"].to_numpy().astype(np.int64) * (1 << 40) + rt["correlation"].to_numpy().astype(np.int64)
    order = np.argsort(key, kind="stable")
    k, ts = key[order], rt["ts_us"].to_numpy()[order]
    uniq = np.r_[k[1:] != k[:-1], True] & np.r_[True, k[1:] != k[:-1]]  # ids one call carries
    k, ts = k[uniq], ts[uniq]
    if not len(k):
        return None
    dc = dev["correlation"].to_numpy()
    dk = dev["rank"].to_numpy().astype(np.int64) * (1 << 40) + dc.astype(np.int64)
    j = np.searchsorted(k, dk)
    tied = (dc > 0) & (j < len(k)) & (k[np.minimum(j, len(k) - 1)] == dk)
    if not tied.any():
        return None
    early = int((dev["ts_us"].to_numpy()[tied] < ts[j[tied]] - EARLY_DEVICE_US).sum())
    return (early, int(tied.sum())) if early else None


def integrity_warnings(trace: Trace) -> list[str]:
    """Checks that turn into warnings instead of silently wrong numbers (DESIGN.md "Integrity checks").

    - host events but no device events (occupancy cannot be computed);
    - graph launches whose correlation id owns no device activity (the launch's work is missing);
    - profiler buffer flush / overflow events (the profiler paused or dropped events);
    - device activities that overlap on one stream (a stream executes in order; overlap means clock trouble);
    - device activities that start before the launch call their correlation id names (work cannot run before it
      is launched: the device clock is ahead of the host's).
    """
    out: list[str] = []
    host, dev = trace.host, trace.device
    if dev.empty and not host.empty:
        out.append("trace has host events but no GPU events (kernel/memcpy/memset): occupancy and gaps are absent; "
                   "was the profiler run without ProfilerActivity.CUDA, or on a machine without a GPU?")
    launches = host[host["name"].isin(GRAPH_LAUNCH_NAMES)]
    if len(launches) and not dev.empty:
        owned = np.isin(launches["correlation"].to_numpy(), dev["correlation"].to_numpy())
        n_orphan = int((~owned).sum())
        if n_orphan:
            out.append(f"{n_orphan} of {len(launches)} graph launches own no device activity "
                       "(their kernels are missing from the trace; the launch fit skips them)")
    if not trace.overhead.empty:
        names = trace.overhead["name"].astype(str)
        flush = names.str.contains("flush|overflow", case=False, regex=True)
        if flush.any():
            total = float(trace.overhead.loc[flush, "dur_us"].sum())
            out.append(f"{int(flush.sum())} profiler buffer flush/overflow events ({total:,.0f} µs in all): "
                       "the profiler itself ran during these; idle time under them is the profiler's")
    early = _device_before_launch(trace)
    if early:
        out.append(f"{early[0]} of {early[1]} device activities tied to a launch call start more than "
                   f"{EARLY_DEVICE_US:g} µs before that call starts (device and host clocks out of step): the "
                   "host-device ordering, gap attribution and the replay are off by as much")
    if not dev.empty:
        d = dev.sort_values(["rank", "device", "stream", "ts_us"], kind="stable")
        same = ((d["rank"].to_numpy()[1:] == d["rank"].to_numpy()[:-1])
                & (d["device"].to_numpy()[1:] == d["device"].to_numpy()[:-1])
                & (d["stream"].to_numpy()[1:] == d["stream"].to_numpy()[:-1]))
        overlap = same & (d["ts_us"].to_numpy()[1:] < d["end_us"].to_numpy()[:-1] - 1e-3)
        if overlap.any():
            out.append(f"{int(overlap.sum())} device activities start before the previous one on the same stream "
                       "ends (clock skew or a merged trace); busy time uses their union")
    return out
