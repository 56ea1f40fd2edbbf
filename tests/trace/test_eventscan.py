"""The compiled scanner (gaptrace/eventscan.py) against the reference reader and the typed msgspec path.

The scanner must give the reference's columns on every piece it accepts and give up (None) on every piece outside
its subset, so these tests check both: that it really reads the real traces (not silently giving up on all of
them) and that what it reads is the reference's, value for value.
"""
from __future__ import annotations

import glob
import json
import math
import os

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gaptrace import eventscan
from gaptrace.eventcols import COLUMNS, Symbols, decode_piece
from gaptrace.loader import events_to_raw, load_raw

from test_loader import PROBE, SMALL, TRACES, assert_same_raw, odd_events, reference_raw

HERE = os.path.dirname(os.path.abspath(__file__))
SYMBOL_COLUMNS = ("cat_id", "name_id", "pid_id", "tid_id", "sync_kind_id")
NESTED = sorted(glob.glob(os.path.join(HERE, "..", "..", "fixtures", "traces", "*", "*.json.gz")))


def scanned(piece: bytes) -> tuple[int, dict] | None:
    symbols = Symbols()
    out = eventscan.scan_piece(piece, 0, symbols, eventscan.ScanState())
    if out is None:
        return None
    elements, cols = out
    table = np.array(symbols.symbols + [None], object)
    return elements, {c: (table[v] if c in SYMBOL_COLUMNS else v) for c, v in cols.items()}


def typed(piece: bytes) -> tuple[int, dict]:
    symbols = Symbols()
    elements, cols = decode_piece(piece, 0, symbols)
    table = np.array(symbols.symbols + [None], object)
    return elements, {c: (table[v] if c in SYMBOL_COLUMNS else v) for c, v in cols.items()}


def assert_same_piece(piece: bytes) -> None:
    got, want = scanned(piece), typed(piece)
    assert got is not None, piece[:200]
    assert got[0] == want[0]
    for c in COLUMNS:
        g, w = got[1][c], want[1][c]
        if c in ("cat_id", "name_id", "pid_id", "tid_id"):  # absent: -1 here, the empty symbol there (finish())
            g = np.where(g == None, "", g)  # noqa: E711
        assert g.dtype == w.dtype or g.dtype == object, c
        if g.dtype.kind == "f":
            assert np.array_equal(g, w, equal_nan=True) and np.array_equal(np.signbit(g), np.signbit(w)), c
        else:
            assert list(g) == list(w), c


class Counting:
    """Counts the pieces the scanner reads and gives up on, around the real scan_piece."""

    def __init__(self, monkeypatch) -> None:
        self.read = self.gave_up = 0
        real = eventscan.scan_piece

        def counted(*a):
            out = real(*a)
            if out is None:
                self.gave_up += 1
            else:
                self.read += 1
            return out

        monkeypatch.setattr(eventscan, "scan_piece", counted)


@pytest.mark.parametrize("path", TRACES + NESTED, ids=os.path.basename)
def test_scanner_reads_real_traces_as_the_reference(path, monkeypatch):
    count = Counting(monkeypatch)
    raw, _ = load_raw(path, workers=0, chunk_bytes=1 << 16, scan=True)
    assert_same_raw(raw, reference_raw(path))
    # the scanner really read them: at most the pieces whose guessed cut was wrong went the typed way
    assert count.read >= 1 and count.gave_up <= max(2, count.read // 50), (count.read, count.gave_up)


def test_scanner_threads_give_the_serial_columns():
    raw, _ = load_raw(PROBE, workers=2, chunk_bytes=1 << 14, scan=True)
    assert_same_raw(raw, reference_raw(PROBE))


@pytest.mark.parametrize("workers,chunk", [(0, 1 << 12), (2, 1 << 14)])
def test_odd_values_match_reference_with_the_scanner(tmp_path, workers, chunk):
    events = odd_events(PROBE)
    p = tmp_path / "odd.json"
    text = json.dumps({"traceEvents": events})
    p.write_text(text)
    raw, _ = load_raw(str(p), workers=workers, chunk_bytes=chunk, scan=True)
    assert_same_raw(raw, events_to_raw([(0, json.loads(text)["traceEvents"])]))


def test_hip_trace_with_string_bytes_matches(monkeypatch):
    raw, _ = load_raw(SMALL, workers=0, scan=True)
    assert_same_raw(raw, reference_raw(SMALL))


X = '{"ph":"X","cat":"kernel","name":"k","pid":1,"tid":2,"ts":10.5,"dur":2.25,"args":%s}'


@pytest.mark.parametrize("piece", [
    '[' + X % '{"correlation":7,"External id":3,"device":0,"stream":7,"bytes":64}' + ']',
    '[' + X % '{"external id":9,"cid":4}' + ']',  # only the variant spellings
    '[' + X % '{"External id":null,"external id":99,"cbid":3,"cid":4}' + ']',  # main spelling wins, even null
    '[' + X % '{"Python parent id":null,"Python id":1,"cuda_sync_kind":null}' + ']',
    '[' + X % '{"cuda_sync_kind":"Stream Sync","grid":[1,[2,{}]],"x":{"y":[true,false,null,-1.5e-3]}}' + ']',
    '[' + X % '{}' + ',{"ph":"i","s":"t","name":7,"ts":"not a number"},{"ph":"M","args":{"name":"x"}}]',
    '[{"ph":"X","name":"a \\"quoted\\" }, {\\"ph\\": \\"X\\"} name \\\\ \\u00e9"}]',  # escapes in a value
    '[{"ph":"X","pid":"7","tid":7}, {"ph":"X","pid":-0,"tid":"-0"}]',  # "7" and 7 are one symbol; -0 is "0"
    '[{"ph":"X","ts":-0,"dur":-0.0}, {"ph":"X","ts":1623142623460111.25,"dur":5e-3}]',
    '[{"ph":"X"}]', '[ ]', ' [\n{ "ph" : "X" , "ts" : 1 }\t]\r\n',
])
def test_pieces_in_the_subset_match_the_typed_path(piece):
    assert_same_piece(piece.encode())


@pytest.mark.parametrize("piece", [
    '[{"ph":"X","name":"ünï"}]',  # non-ASCII
    '[{"ph":"X","na\\u006de":"k"}]',  # an escaped key
    '[{"ph":"X","name":"a","name":"b"}]',  # a repeated key that is read
    '[{"ph":"X","args":{"correlation":1,"correlation":2}}]',
    '[{"ph":"X","ts":NaN}]', '[{"ph":"X","ts":1e400}]', '[{"ph":"X","ts":12345678901234567890}]',
    '[{"ph":"X","pid":null}]', '[{"ph":"X","pid":1.5}]', '[{"ph":"X","cat":3}]',
    '[{"ph":"X","args":null}]', '[{"ph":"X","args":{"bytes":"256"}}]', '[{"ph":"X","args":{"device":1.0}}]',
    '[{"ph":"X","args":{"stream":1234567890123456789}}]', '[{"ph":"X","args":{"cuda_sync_kind":3}}]',
    '[{"ph":"Z"}]', '[{"name":"no phase"}]', '[42]', '[{"ph":"X"},]', '[{"ph":"X"}', '[{"ph":"X"}] x',
    '[{"ph":"X","name":"unterminated}]', '[{"ph":"X","name":"bad \\q escape"}]', '[{"ph":"X","v":01}]',
    '[{"ph":"X","v":tru}]', '[{"ph":"X","v":[1,2}]', '[{"ph":"X","v":' + '[' * 70 + ']' * 70 + '}]',
    '[{"ph":"X","name":"tab\there"}]',
])
def test_pieces_outside_the_subset_are_given_up(piece):
    assert scanned(piece.encode()) is None


def test_repeated_raw_strings_are_interned_once_and_tables_grow():
    names = [f"kernel_{i}_" + "x" * (i % 300) for i in range(40000)]  # more than the first arena and table
    piece = "[" + ",".join('{"ph":"X","name":"%s","pid":%d}' % (names[i % len(names)], i % 3)
                           for i in range(2 * len(names))) + "]"
    got = scanned(piece.encode())
    assert got is not None
    assert list(got[1]["name_id"]) == names + names
    assert list(got[1]["pid_id"]) == [str(i % 3) for i in range(2 * len(names))]


def test_hash_collisions_cost_time_never_a_symbol():
    state = eventscan.ScanState()
    state.table = np.full(4, -1, np.int64)  # a table this small makes every probe collide
    symbols = Symbols()
    piece = b'[{"ph":"X","name":"a"},{"ph":"X","name":"b"},{"ph":"X","name":"a"},{"ph":"X","name":"c"}]'
    elements, cols = eventscan.scan_piece(piece, 0, symbols, state)
    assert [symbols.symbols[i] for i in cols["name_id"]] == ["a", "b", "a", "c"]


def decimal_text(draw_int, frac_digits, exp, neg):
    s = str(draw_int)
    if frac_digits:
        s = s + "." + "".join(str((draw_int >> k) % 10) for k in range(frac_digits))
    if exp is not None:
        s += f"e{exp}"
    return ("-" if neg else "") + s


@settings(max_examples=3000, deadline=None)
@given(st.integers(0, 10**18), st.integers(0, 8), st.one_of(st.none(), st.integers(-30, 30)), st.booleans())
def test_numbers_read_exactly_or_given_up(mant, frac_digits, exp, neg):
    text = decimal_text(mant, frac_digits, exp, neg)
    piece = ('[{"ph":"X","ts":%s}]' % text).encode()
    got = scanned(piece)
    want = msgspec.json.decode(b'{"v":' + text.encode() + b"}", type=dict[str, float])["v"]
    if got is None:
        return
    v = got[1]["ts"][0]
    assert v == want and math.copysign(1, v) == math.copysign(1, want), text


def test_most_kineto_timestamps_take_an_exact_path():
    # Kineto writes microseconds with three decimals: 13-16 digit mantissas; 17-18 take the integer path
    texts = ["5146354931672.579", "1623142623460111", "1623142623460111.25", "173300000000000.125", "0.001"]
    for t in texts:
        got = scanned(('[{"ph":"X","ts":%s}]' % t).encode())
        assert got is not None, t
        assert got[1]["ts"][0] == float(t), t


@settings(max_examples=1500, deadline=None)
@given(st.lists(st.text(alphabet=st.sampled_from(list('ab"\\/\n\t\x01 {}[],:é✓\u2028') + ["\ud800"]), max_size=40),
                min_size=1, max_size=6), st.booleans())
def test_strings_read_as_the_typed_path_or_given_up(names, ascii_only):
    # names and categories with quotes, backslashes, control bytes, non-ASCII and lone surrogates, written by
    # json.dumps (escaped, or raw UTF-8): every string crosses the eight-byte word boundaries at many offsets
    events = [{"ph": "X", "name": n, "cat": n[::-1], "args": {"x": n, "cuda_sync_kind": n}} for n in names]
    try:
        piece = json.dumps(events, ensure_ascii=ascii_only).encode()
    except UnicodeEncodeError:
        return
    got = scanned(piece)
    if got is not None:
        assert_same_piece(piece)


@pytest.mark.parametrize("span,elements", [(b',{"ph":"X","ts":1},{"ph":"i"} ', 2), (b'[{"ph":"X"}\n,', 1), (b', ,', 0),
                                           (b',{"ph":"X"},,', None), (b',{"ph":"X"}]]', None), (b',]', 0)])
def test_a_span_read_in_place_takes_its_first_and_last_bytes_as_brackets(span, elements):
    # the reader hands decoder threads `sep {...}, ..., {...} sep` straight from its buffer
    out = eventscan.scan_piece(span, 0, Symbols(), eventscan.ScanState(), bare=True)
    assert (None if out is None else out[0]) == elements


def _fuzz_module():
    import importlib.util
    import sys

    path = os.path.join(HERE, "..", "fuzz_traces.py")
    spec = importlib.util.spec_from_file_location("fuzz_traces", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_fuzzed_traces_load_the_same_with_the_scanner(tmp_path):
    # the fuzz suite's mutated, truncated and re-serialised real traces (tests/fuzz_traces.py): the scanner gives
    # the typed path's columns, or the same one-line error
    from hypothesis import HealthCheck, Phase

    from gaptrace.trace import TraceError

    fuzz = _fuzz_module()
    bases = fuzz.load_bases()
    seen = {"same": 0, "error": 0}

    @settings(max_examples=120, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=fuzz.case_strategy())
    def one(case):
        try:
            m = fuzz.materialise(case, bases, str(tmp_path))
        except ValueError:
            return
        outcomes = []
        for scan in (False, True):
            try:
                outcomes.append(load_raw(m.trace_path, workers=0, chunk_bytes=m.chunk, scan=scan)[0])
            except TraceError as e:
                outcomes.append(str(e))
        if isinstance(outcomes[0], str):
            assert outcomes[1] == outcomes[0]
            seen["error"] += 1
        else:
            assert not isinstance(outcomes[1], str), outcomes[1]
            assert_same_raw(outcomes[1], outcomes[0])
            seen["same"] += 1

    one()
    assert seen["same"] > 20 and seen["error"] > 5, seen
