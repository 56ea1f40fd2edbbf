"""Typed decoding of Kineto events into numpy columns, one chunk of events at a time.

A chunk of the ``traceEvents`` array is decoded by msgspec into small typed structs (:class:`Event`, whose
``args`` is a typed struct of only the keys :class:`~gaptrace.trace.RawColumns` needs; every other key is skipped
by the decoder), turned into columns at once (one list comprehension and one numpy conversion per column; no Python
statement per event), and dropped: no Python object per event outlives its chunk. Strings are interned into one
:class:`Symbols` table shared by all chunks and ranks.

The struct types are strict, so every value they let through means what the reference reader
(:func:`gaptrace.reference.events_to_raw`) makes of it. A chunk holding anything else (a bool or a string where a
number belongs, a float id, ``null`` args, a non-object element ...) fails validation and is decoded again
without types and converted by the reference code itself, so the result is identical either way.
"""
from __future__ import annotations

from itertools import compress, repeat
from operator import is_
from typing import Annotated, Any, Union

import msgspec
import numpy as np

from .reference import _int as _int_ref  # the reference conversion, for the values a typed ``bytes`` can hold
from .trace import RawColumns

__all__ = ["Event", "Args", "Symbols", "ColumnSink", "COLUMNS", "decode_piece", "typed_columns", "python_columns"]

# "absent" for the keys that have a spelling variant ("External id" / "external id", "cbid" / "cid"): the value
# itself may not be this (validation sends such a chunk to the reference path), so absent and -1 stay apart.
_MISSING = -(2**63)
_Id = Annotated[int, msgspec.Meta(ge=_MISSING + 1, le=2**63 - 1)]
# msgspec reads integers up to 2**64 - 1 (and a float field takes any integer); a value numpy's int64 cannot hold
# fails validation instead, so its chunk takes the reference path (where it is absent, -1)
_Int = Annotated[int, msgspec.Meta(ge=_MISSING, le=2**63 - 1)]
_NAN = float("nan")


class Args(msgspec.Struct, frozen=True, gc=False):
    """The ``args`` keys that RawColumns needs. Absent ints are -1 (or _MISSING where a variant spelling exists)."""

    correlation: Union[_Int, None] = -1
    external_id: Union[_Id, None] = msgspec.field(default=_MISSING, name="External id")
    external_id_lc: Union[_Id, None] = msgspec.field(default=_MISSING, name="external id")
    python_id: Union[_Int, None] = msgspec.field(default=-1, name="Python id")
    python_parent_id: Union[_Int, None] = msgspec.field(default=-1, name="Python parent id")
    cbid: Union[_Id, None] = _MISSING
    cid: Union[_Id, None] = _MISSING
    device: Union[_Int, None] = -1
    stream: Union[_Int, None] = -1
    bytes: Union[_Int, str, None] = -1  # HIP traces write "bytes": "256"
    cuda_sync_kind: Union[str, None] = None


_NO_ARGS = Args()


class Event(msgspec.Struct, tag="X", tag_field="ph", gc=False):
    """A complete (``"ph": "X"``) event, with only the fields RawColumns needs (pid/tid: ints or strings)."""

    cat: str = ""
    name: str = ""
    pid: Union[int, str] = ""
    tid: Union[int, str] = ""
    ts: float = _NAN
    dur: float = _NAN
    args: Args = _NO_ARGS


# Every other phase of the Chrome trace format decodes into an empty struct: its keys are skipped unread.
# An element without "ph", or with a phase not listed here, fails validation (and takes the reference path).
_OTHER_PHASES = tuple(msgspec.defstruct(f"Phase_{i}", [], tag=ph, tag_field="ph", gc=False)
                      for i, ph in enumerate(("B", "E", "i", "I", "C", "b", "n", "e", "s", "t", "f", "P", "N", "O",
                                              "D", "M", "V", "v", "R", "c", "(", ")")))
TYPED = msgspec.json.Decoder(list[Union[(Event, *_OTHER_PHASES)]])
UNTYPED = msgspec.json.Decoder(list[Any])

COLUMNS = ("cat_id", "name_id", "pid_id", "tid_id", "ts", "dur", "correlation", "external_id", "python_id",
           "python_parent_id", "cbid", "device", "stream", "bytes", "sync_kind_id", "rank")
_I32 = ("cat_id", "name_id", "pid_id", "tid_id", "sync_kind_id", "rank")
_F64 = ("ts", "dur")


def _dtype(col: str) -> type:
    return np.float64 if col in _F64 else np.int32 if col in _I32 else np.int64


class Symbols:
    """The shared string table. ``ids(values)`` interns ``str(v)`` of each value (``None`` -> -1).

    A cache maps raw decoded values (``7`` and ``"7"`` alike, both to the symbol ``"7"``) to ids, so the work per
    event is one dict lookup in C (``map(dict.__getitem__)``) and the Python work is per new distinct value.
    """

    def __init__(self, scan: bool = False) -> None:
        self.table: dict[str, int] = {}
        self.symbols: list[str] = []
        self.cache: dict[Any, int] = {None: -1}
        # with ``scan``, decode_piece tries the compiled scanner first (its raw-string table lives here)
        self.scan_state = None
        if scan:
            from .eventscan import ScanState

            self.scan_state = ScanState()

    def intern(self, s: str) -> int:
        i = self.table.get(s)
        if i is None:
            i = self.table[s] = len(self.symbols)
            self.symbols.append(s)
        return i

    def ids(self, values: list) -> np.ndarray:
        """int32 ids of ``values`` (str, int or None, as the typed structs hold them)."""
        cache = self.cache
        try:
            return np.fromiter(map(cache.__getitem__, values), np.int32, len(values))
        except KeyError:
            for v in set(values).difference(cache):
                cache[v] = self.intern(str(v))
            return np.fromiter(map(cache.__getitem__, values), np.int32, len(values))

    def remap(self, local: list[str]) -> np.ndarray:
        """Global ids for a local symbol list, with a trailing -1 so that local id -1 stays -1."""
        return np.array([self.intern(s) for s in local] + [-1], dtype=np.int32)


def _ints(values: list) -> np.ndarray:
    """int64 column of strict ints, None -> -1 (the only non-int the typed structs let through here)."""
    try:
        return np.array(values, np.int64)
    except TypeError:
        return np.array([-1 if v is None else v for v in values], np.int64)


def _with_variant(main: list, variant: list) -> np.ndarray:
    """``args.get(main, args.get(variant))``: the variant where the main key is absent; absent both -> -1."""
    out = _ints(main)
    if variant.count(_MISSING) != len(variant):  # the variant spelling is rare: usually nothing to merge
        out = np.where(out == _MISSING, _ints(variant), out)
    out[out == _MISSING] = -1
    return out


def typed_columns(events: list[Event], rank: int, symbols: Symbols) -> dict[str, np.ndarray]:
    """Columns of the complete (``ph == "X"``) events among ``events``; same values as the reference reader.

    List comprehensions over the structs (3.11 specialises the slot loads: ~20 ns per field and event), then one
    C-level conversion per column.
    """
    kinds = list(map(type, events))
    if kinds.count(Event) != len(kinds):
        events = list(compress(events, map(is_, kinds, repeat(Event))))
    n = len(events)
    args = [e.args for e in events]
    byte_vals = [a.bytes for a in args]
    if set(map(type, byte_vals)) <= {int}:
        nbytes = np.array(byte_vals, np.int64)
    else:
        nbytes = np.fromiter(map(_int_ref, byte_vals), np.int64, n)
    sync = [a.cuda_sync_kind for a in args]
    return {
        "cat_id": symbols.ids([e.cat for e in events]),
        "name_id": symbols.ids([e.name for e in events]),
        "pid_id": symbols.ids([e.pid for e in events]),
        "tid_id": symbols.ids([e.tid for e in events]),
        "ts": np.fromiter([e.ts for e in events], np.float64, n),
        "dur": np.fromiter([e.dur for e in events], np.float64, n),
        "correlation": _ints([a.correlation for a in args]),
        "external_id": _with_variant([a.external_id for a in args], [a.external_id_lc for a in args]),
        "python_id": _ints([a.python_id for a in args]),
        "python_parent_id": _ints([a.python_parent_id for a in args]),
        "cbid": _with_variant([a.cbid for a in args], [a.cid for a in args]),
        "device": _ints([a.device for a in args]),
        "stream": _ints([a.stream for a in args]),
        "bytes": nbytes,
        "sync_kind_id": np.full(n, -1, np.int32) if sync.count(None) == n else symbols.ids(sync),
        "rank": np.full(n, rank, np.int32),
    }


def python_columns(events: list, rank: int, symbols: Symbols) -> dict[str, np.ndarray]:
    """Columns of already-decoded events (dicts), by the reference conversion itself (for odd chunks)."""
    from .reference import events_to_raw

    raw = events_to_raw([(rank, events)])
    table = symbols.remap(raw.symbols)
    cols = {c: getattr(raw, c) for c in COLUMNS}
    for c in _SYMBOL_COLUMNS:
        cols[c] = table[cols[c]]
    return cols


def decode_piece(piece, rank: int, symbols: Symbols) -> tuple[int, dict[str, np.ndarray]]:
    """(number of array elements, columns of its complete events) for one JSON array of events.

    ``piece`` is bytes-like (a memoryview into a buffer is decoded in place). Raises ``msgspec.DecodeError``
    (never its subclass ``ValidationError``) when the piece is not well-formed JSON. With ``symbols.scan_state``
    the compiled scanner (:mod:`gaptrace.eventscan`) reads the piece when it is in the scanner's subset; the typed
    msgspec decoder reads it otherwise; the columns are the same either way.
    """
    if symbols.scan_state is not None:
        from .eventscan import scan_piece

        done = scan_piece(piece, rank, symbols, symbols.scan_state)
        if done is not None:
            return done
    try:
        events = TYPED.decode(piece)
    except msgspec.ValidationError:
        events = UNTYPED.decode(piece)
        return len(events), python_columns(events, rank, symbols)
    return len(events), typed_columns(events, rank, symbols)


_SYMBOL_COLUMNS = ("cat_id", "name_id", "pid_id", "tid_id", "sync_kind_id")


class ColumnSink:
    """Accumulates the columns of one load: chunks of decoded events from any number of ranks.

    ``add_json(piece)`` decodes one JSON array of events (see :func:`decode_piece`; on malformed JSON it raises
    and changes nothing); ``add_python(events)`` converts decoded events with the reference code;
    ``add_columns`` takes columns decoded elsewhere (a worker process) with that worker's symbol ids.
    Each chunk is copied at once into preallocated columns (sized from ``expected_events``, grown 1.5x when
    short; pages never written are never resident), so ``finish()`` has nothing left to concatenate.
    """

    def __init__(self, expected_events: int = 1 << 16, scan: bool = False) -> None:
        self.symbols = Symbols(scan)
        self.cols = {c: np.empty(max(expected_events, 1024), _dtype(c)) for c in COLUMNS}
        self.n = 0
        self.rank = 0
        self._mark = 0
        self.elements = 0  # array elements seen for the current rank (all phases), to tell an empty array

    def start_rank(self, rank: int) -> None:
        self.rank = rank
        self.elements = 0
        self._mark = self.n

    def discard_rank(self) -> None:
        """Forget the current rank's events (a repeated ``traceEvents`` key: the last one wins, as in json)."""
        self.n = self._mark
        self.elements = 0

    def add_json(self, piece) -> None:
        elements, cols = decode_piece(piece, self.rank, self.symbols)
        self.elements += elements
        self._add(cols)

    def add_python(self, events: list) -> None:
        self.elements += len(events)
        self._add(python_columns(events, self.rank, self.symbols))

    def add_columns(self, elements: int, cols: dict[str, np.ndarray], table: np.ndarray) -> None:
        """Columns whose symbol ids index a worker's table; ``table`` maps them to ours (last entry -1)."""
        self.elements += elements
        for c in _SYMBOL_COLUMNS:
            cols[c] = table[cols[c]]
        self._add(cols)

    def _add(self, cols: dict[str, np.ndarray]) -> None:
        k = len(cols["ts"])
        if self.n + k > len(self.cols["ts"]):
            cap = max(self.n + k, len(self.cols["ts"]) * 3 // 2)
            for c in COLUMNS:
                grown = np.empty(cap, _dtype(c))
                grown[:self.n] = self.cols[c][:self.n]
                self.cols[c] = grown
        for c in COLUMNS:
            self.cols[c][self.n:self.n + k] = cols[c]
        self.n += k

    def finish(self) -> RawColumns:
        """One RawColumns (views of the first n rows of the preallocated columns)."""
        out = {c: self.cols[c][:self.n] for c in COLUMNS}
        self.cols = {}
        # the reference gives absent cat/name/pid/tid the empty symbol
        empty = self.symbols.intern("")
        for c in ("cat_id", "name_id", "pid_id", "tid_id"):
            out[c][out[c] < 0] = empty
        return RawColumns(symbols=list(self.symbols.symbols), **out)
