"""The streaming loader against the stdlib reference reader, on every real trace, and its one-line errors.

Equality is defined on what the analyses see: every frame of the built Trace (host, device, gpu_annotations,
device_syncs, overhead) equal column by column, Categorical columns compared as strings (the symbol table's
order may differ), floats bit for bit (NaN equal to NaN), plus the per-event strings and numbers of the
RawColumns, the metadata and the warnings.
"""
from __future__ import annotations

import glob
import gzip
import json
import os
import re

import numpy as np
import pandas as pd
import pytest

from gaptrace.jsonstream import bracket_depths
from gaptrace.loader import (LOAD_BASE_BYTES, events_to_raw, json_size_bytes, load_raw, load_trace, load_trace_reference,
                             read_bytes)
from gaptrace.trace import RawColumns, Trace, TraceError

HERE = os.path.dirname(os.path.abspath(__file__))
TRACES = sorted(glob.glob(os.path.join(HERE, "..", "..", "fixtures", "traces", "*.json.gz")))
PROBE = next(t for t in TRACES if "h200_graph_launch_probe" in t)
SMALL = next(t for t in TRACES if "mi300x" in t)  # HIP: "bytes" written as strings, "cid" for cbid
OWL = next(t for t in TRACES if "owlv2" in t)  # metadata before and after traceEvents

FRAMES = ("host", "device", "gpu_annotations", "device_syncs", "overhead")
RAW_STRINGS = ("cat_id", "name_id", "pid_id", "tid_id", "sync_kind_id")
RAW_NUMBERS = ("ts", "dur", "correlation", "external_id", "python_id", "python_parent_id", "cbid", "device",
               "stream", "bytes", "rank")

_reference_cache: dict[str, Trace] = {}


def reference(path: str) -> Trace:
    if path not in _reference_cache:
        _reference_cache[path] = load_trace_reference(path)
    return _reference_cache[path]


def as_plain(frame: pd.DataFrame) -> pd.DataFrame:
    """Categoricals as object strings, so frames with differently ordered symbol tables compare equal."""
    out = frame.copy()
    for c in out.columns:
        if isinstance(out[c].dtype, pd.CategoricalDtype):
            out[c] = out[c].astype(object).where(out[c].notna(), None)
    return out.reset_index(drop=True)


def assert_same_trace(fast: Trace, ref: Trace) -> None:
    for name in FRAMES:
        a, b = getattr(fast, name), getattr(ref, name)
        assert list(a.columns) == list(b.columns), name
        pd.testing.assert_frame_equal(as_plain(a), as_plain(b), check_exact=True, obj=name)
    assert fast.metadata == ref.metadata
    assert fast.warnings == ref.warnings


def raw_strings(raw: RawColumns, col: str) -> np.ndarray:
    table = np.array(list(raw.symbols) + [None], dtype=object)
    return table[getattr(raw, col)]  # id -1 picks the trailing None


def assert_same_raw(fast: RawColumns, ref: RawColumns) -> None:
    for col in RAW_STRINGS:
        assert np.array_equal(raw_strings(fast, col), raw_strings(ref, col)), col
    for col in RAW_NUMBERS:
        a, b = getattr(fast, col), getattr(ref, col)
        assert a.dtype == b.dtype, col
        assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), col


def reference_raw(path: str) -> RawColumns:
    doc = json.loads(read_bytes(path))
    events = doc if isinstance(doc, list) else doc["traceEvents"]
    return events_to_raw([(0, events)])


# ---------------------------------------------------------------- every real trace


@pytest.mark.parametrize("path", TRACES, ids=os.path.basename)
def test_fast_equals_reference_on_real_traces(path):
    ref = reference(path)
    fast = load_trace(path, workers=0)
    assert len(fast.host) + len(fast.device) > 1000
    assert_same_trace(fast, ref)


@pytest.mark.parametrize("path", TRACES, ids=os.path.basename)
def test_fast_raw_columns_equal_reference_with_workers_and_small_chunks(path):
    # small chunks: hundreds of pieces, cuts guessed at every boundary, spans handed to two worker processes
    raw, metadata = load_raw(path, workers=2, chunk_bytes=1 << 20)
    assert_same_raw(raw, reference_raw(path))
    assert metadata == reference(path).metadata


def test_probe_counts_are_the_real_ones():
    # independent of the reference: counted straight from the JSON text
    text = gzip.decompress(open(PROBE, "rb").read()).decode()
    fast = load_trace(PROBE)
    assert (fast.host["name"] == "cudaGraphLaunch").sum() == text.count('"name": "cudaGraphLaunch"') == 42
    n_x = len(re.findall(r'"ph": "X"', text))
    assert len(fast.host) + len(fast.device) + len(fast.gpu_annotations) + len(fast.device_syncs) \
        + len(fast.overhead) <= n_x


# ---------------------------------------------------------------- odd but valid JSON


def odd_events(path: str) -> list:
    """A real trace's events with every kind of value the typed decoder must hand to the reference path."""
    events = json.loads(read_bytes(path))["traceEvents"]
    xs = [i for i, e in enumerate(events) if e.get("ph") == "X"]
    odd = [
        {"ts": True}, {"dur": "12.5"}, {"args": None}, {"args": [1, 2]}, {"pid": None}, {"tid": 3.5},
        {"args": {"correlation": 7.9, "External id": "12", "device": False}},
        {"args": {"external id": 99, "cid": 5}},  # only the variant spellings
        {"args": {"External id": None, "external id": 99, "cbid": 3, "cid": 4}},  # main spelling wins, even null
        {"args": {"bytes": "256"}}, {"args": {"bytes": "n/a"}}, {"args": {"bytes": " 64 "}},
        {"args": {"cuda_sync_kind": 3}}, {"args": {"cuda_sync_kind": "Stream Sync", "stream": 7}},
        {"name": 'a "quoted" }, {"ph": "X"} name \\\\'}, {"name": "ünïcödé ✓ \u2028"},
        {"args": {"Input Dims": [[1, 2]], "nested": [{"a": {}}, {"b": [{}]}], "Python id": 5}},
        {"cat": 17}, {"name": None}, {"ts": 2 ** 40, "dur": 0},
    ]
    for k, patch in enumerate(odd):
        e = dict(events[xs[10 + 97 * k]])
        e.update(patch)
        events[xs[10 + 97 * k]] = e
    big = dict(events[xs[3]])  # one event of ~90 KB whose args hold a long list of objects: "}, {" inside it
    big["args"] = dict(big.get("args") or {}, shapes=[{"dim": i, "s": "}, {"} for i in range(4000)])
    events[xs[3]] = big
    events.insert(5, 42)  # not an object
    events.insert(7, {"ph": "Z", "ts": 1})  # an unknown phase
    events.insert(9, {"name": "no phase"})
    events.append(7)  # a scalar last: the array ends without a '}' before its ']'
    return events


@pytest.mark.parametrize("workers,chunk", [(0, 1 << 12), (0, 1 << 20), (2, 1 << 14)])
def test_odd_values_match_reference(tmp_path, workers, chunk):
    events = odd_events(PROBE)
    p = tmp_path / "odd.json"
    # NaN and Infinity are not JSON, but stdlib json (the reference) reads them: so must the loader
    text = json.dumps({"traceEvents": events, "deviceProperties": [{"id": 0}, {"id": 1}], "x": float("nan")})
    text = text.replace('"ts": 1099511627776', '"ts": NaN', 1)
    p.write_text(text)
    raw, metadata = load_raw(str(p), workers=workers, chunk_bytes=chunk)
    assert_same_raw(raw, events_to_raw([(0, json.loads(text)["traceEvents"])]))
    assert metadata["deviceProperties"] == [{"id": 0}, {"id": 1}] and np.isnan(metadata["x"])
    assert_same_trace(load_trace(str(p), workers=workers, chunk_bytes=chunk), load_trace_reference(str(p)))


def test_compact_and_spaced_layouts_and_key_order(tmp_path):
    doc = json.loads(read_bytes(SMALL))
    events = doc.pop("traceEvents")
    ref = reference(SMALL)
    layouts = {
        "compact.json": json.dumps({**doc, "traceEvents": events}, separators=(",", ":")),
        "spaced.json": json.dumps({"traceEvents": events, **doc}, indent=3).replace(",\n", "\n ,\n"),
        "events_last.json": json.dumps({**doc, "traceEvents": events}).replace("}, {", "}\t,\r\n{"),
    }
    for name, text in layouts.items():
        p = tmp_path / name
        p.write_text(text)
        for workers, chunk in ((0, 1 << 11), (2, 1 << 13)):
            fast = load_trace(str(p), workers=workers, chunk_bytes=chunk)
            assert_same_trace(fast, ref)


@pytest.mark.parametrize("chunk", [64, 333, 4096])
def test_tiny_chunks(tmp_path, chunk):
    # chunks far smaller than one event: every event straddles chunk boundaries
    p = tmp_path / "small.json"
    p.write_bytes(read_bytes(SMALL))
    raw, _ = load_raw(str(p), workers=0, chunk_bytes=chunk)
    assert_same_raw(raw, reference_raw(SMALL))


def test_bare_list_form(tmp_path):
    events = json.loads(read_bytes(SMALL))["traceEvents"]
    p = tmp_path / "list.json"
    p.write_text(json.dumps(events))
    fast = load_trace(str(p))
    assert fast.metadata == {}
    assert_same_trace(fast, load_trace_reference(str(p)))


def test_metadata_before_and_after_trace_events():
    keys = list(json.loads(read_bytes(OWL)))
    i = keys.index("traceEvents")
    assert i > 0 and i < len(keys) - 1  # the fixture really has keys on both sides
    fast = load_trace(OWL)
    assert set(fast.metadata) == set(keys) - {"traceEvents"}
    assert fast.metadata["deviceProperties"][0]["name"] == fast.device_name(0) == "NVIDIA H100 80GB HBM3"
    assert fast.metadata == reference(OWL).metadata


def test_directory_of_two_ranks(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "worker_rank0.json.gz").write_bytes(open(SMALL, "rb").read())
    (d / "worker_rank1.json").write_bytes(read_bytes(PROBE))
    fast = load_trace(str(d))
    ref = load_trace_reference(str(d))
    assert_same_trace(fast, ref)
    assert sorted(fast.host["rank"].unique()) == [0, 1]
    # metadata: the first rank's top-level keys, as the reference reader
    assert fast.metadata == {k: v for k, v in json.loads(read_bytes(SMALL)).items() if k != "traceEvents"}


def test_multi_member_gzip(tmp_path):
    data = read_bytes(SMALL)
    half = len(data) // 2
    p = tmp_path / "two_members.json.gz"
    p.write_bytes(gzip.compress(data[:half]) + gzip.compress(data[half:]) + b"\0\0\0")
    assert_same_raw(load_raw(str(p), chunk_bytes=1 << 12)[0], reference_raw(SMALL))


def test_repeated_trace_events_key_last_wins(tmp_path):
    events = json.loads(read_bytes(SMALL))["traceEvents"]
    p = tmp_path / "twice.json"
    p.write_text('{"traceEvents": ' + json.dumps(events[:50]) + ', "traceEvents": ' + json.dumps(events) + "}")
    assert_same_trace(load_trace(str(p)), load_trace_reference(str(p)))


# ---------------------------------------------------------------- bad input: one line naming the file


def assert_one_line_error(path, pattern: str, **kw) -> str:
    with pytest.raises(TraceError) as info:
        load_trace(str(path), **kw)
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg, msg
    assert re.search(pattern, msg), msg
    return msg


@pytest.fixture
def probe_json() -> bytes:
    return read_bytes(PROBE)


def test_truncated_gzip(tmp_path):
    data = open(PROBE, "rb").read()
    p = tmp_path / "cut.json.gz"
    p.write_bytes(data[: len(data) // 2])
    assert_one_line_error(p, "truncated gzip")


def test_corrupt_gzip(tmp_path):
    data = bytearray(open(PROBE, "rb").read())
    for i in range(1000, 1100):
        data[i] ^= 0x5A
    p = tmp_path / "bad.json.gz"
    p.write_bytes(bytes(data))
    assert_one_line_error(p, "corrupt gzip")


def test_gzip_trailing_garbage(tmp_path):
    p = tmp_path / "garbage.json.gz"
    p.write_bytes(open(SMALL, "rb").read() + b"not gzip")
    assert_one_line_error(p, "corrupt gzip")


def test_not_json(tmp_path):
    p = tmp_path / "notes.json"
    p.write_text("this is not a trace\n")
    assert_one_line_error(p, "not valid JSON")


def test_empty_file(tmp_path):
    p = tmp_path / "empty.json"
    p.write_bytes(b"")
    assert_one_line_error(p, "empty file")


@pytest.mark.parametrize("frac", [0.3, 0.999])
def test_json_truncated_mid_array(tmp_path, probe_json, frac):
    p = tmp_path / "cut.json"
    p.write_bytes(probe_json[: int(len(probe_json) * frac)])
    assert_one_line_error(p, "truncated", workers=0)
    assert_one_line_error(p, "truncated", workers=2, chunk_bytes=1 << 18)


def test_json_truncated_after_the_array(tmp_path, probe_json):
    end = probe_json.rindex(b"]")
    p = tmp_path / "cut.json"
    p.write_bytes(probe_json[: end + 1])  # the events are complete, the document is not
    assert_one_line_error(p, "truncated")


@pytest.mark.parametrize("workers", [0, 2])
def test_invalid_json_inside_the_events(tmp_path, probe_json, workers):
    at = probe_json.index(b'"ph": "X"', len(probe_json) // 2)
    p = tmp_path / "flipped.json"
    p.write_bytes(probe_json[:at] + b'"ph": X' + probe_json[at + 9:])
    assert_one_line_error(p, "not valid JSON", workers=workers, chunk_bytes=1 << 18)


@pytest.mark.parametrize("workers,scan", [(0, False), (2, False), (0, True)])
def test_invalid_json_names_the_files_byte(tmp_path, probe_json, workers, scan):
    """The position in the message is the file's byte offset, not a line or column inside an internal chunk."""
    at = probe_json.index(b'"ph": "X"', 3 * len(probe_json) // 4)
    bad = at + len(b'"ph": ')  # where the X without quotes starts
    p = tmp_path / "flipped.json"
    p.write_bytes(probe_json[:at] + b'"ph": X' + probe_json[at + 9:])
    msg = assert_one_line_error(p, "not valid JSON", workers=workers, chunk_bytes=1 << 18, scan=scan)
    assert "line " not in msg and "column" not in msg, msg
    byte = int(re.search(r"near byte ([0-9,]+)", msg).group(1).replace(",", ""))
    assert byte == bad, (byte, bad)


def test_invalid_json_in_metadata(tmp_path, probe_json):
    p = tmp_path / "meta.json"
    p.write_bytes(probe_json.replace(b'"schemaVersion": 1', b'"schemaVersion": 1 2', 1))
    assert_one_line_error(p, "not valid JSON")


def test_extra_data_after_document(tmp_path, probe_json):
    p = tmp_path / "extra.json"
    p.write_bytes(probe_json + b"\n{}")
    assert_one_line_error(p, "extra data")


def test_no_trace_events(tmp_path):
    p = tmp_path / "other.json"
    p.write_text(json.dumps({"deviceProperties": [], "events": [{"ph": "X"}]}))
    assert_one_line_error(p, "no 'traceEvents' list")
    p.write_text(json.dumps({"traceEvents": {"ph": "X"}}))
    assert_one_line_error(p, "no 'traceEvents' list")


def test_empty_trace_events(tmp_path):
    p = tmp_path / "empty_events.json"
    p.write_text('{"traceEvents": [ ], "schemaVersion": 1}')
    assert_one_line_error(p, "traceEvents is empty")
    p.write_text("[]")
    assert_one_line_error(p, "traceEvents is empty")


def test_no_complete_events(tmp_path):
    events = [e for e in json.loads(read_bytes(SMALL))["traceEvents"] if e.get("ph") != "X"]
    assert events
    p = tmp_path / "instants.json"
    p.write_text(json.dumps({"traceEvents": events}))
    assert_one_line_error(p, "no complete")


def test_missing_path(tmp_path):
    assert_one_line_error(tmp_path / "nope.json", "no such file")


def test_size_guard_refuses_early_with_size_and_limit(tmp_path):
    msg = assert_one_line_error(PROBE, r"too big.*GB of JSON.*limit of 1e-06 GB", memory_limit_bytes=1000)
    assert f"{json_size_bytes(PROBE) / 1e9:.2f} GB of JSON and gzip (more once decompressed)" in msg


def test_json_size_before_reading_is_a_lower_bound():
    """A plain file's size is its JSON; a gzip file's compressed size only bounds it from below (the trailer's
    ISIZE is the last member's size mod 2**32): the rest is counted while it streams."""
    assert json_size_bytes(PROBE) == os.path.getsize(PROBE) < len(read_bytes(PROBE))
    assert json_size_bytes(SMALL) <= len(read_bytes(SMALL))


def test_size_guard_counts_gzip_while_it_streams():
    json_bytes = len(read_bytes(PROBE))
    assert_one_line_error(PROBE, r"too big to load here: more than 0\.01 GB of JSON \(counted while decompressing\)",
                          memory_limit_bytes=int(LOAD_BASE_BYTES + 0.9 * 10e6))
    raw, _ = load_raw(PROBE, memory_limit_bytes=int(LOAD_BASE_BYTES + 0.9 * json_bytes) + 1)
    assert raw.ts.size


# ---------------------------------------------------------------- the vectorised bracket scan


def brackets_by_hand(text: bytes) -> tuple[list[int], list[int]]:
    pos, depth, d, in_str, esc = [], [], 0, False, False
    for i, c in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif c == 0x5C:
                esc = True
            elif c == 0x22:
                in_str = False
        elif c == 0x22:
            in_str = True
        elif c in b"{[":
            d += 1
            pos.append(i)
            depth.append(d)
        elif c in b"}]":
            d -= 1
            pos.append(i)
            depth.append(d)
    return pos, depth


def test_bracket_depths_matches_a_byte_by_byte_scan():
    real = read_bytes(SMALL)
    cut = real.index(b"}}, {\"ph\"", 200_000) + 3  # outside any string: both scans start in one state
    text = real[:cut] + b'{"a\\\\": "x\\"}]", "b": ["\\\\\\"[", {"c": "\\\\"}]}'
    pos, depth, _ = bracket_depths(np.frombuffer(text, np.uint8))
    want_pos, want_depth = brackets_by_hand(text)
    assert pos.tolist() == want_pos and depth.tolist() == want_depth


def test_raw_strings_table_is_interned_once():
    raw, _ = load_raw(SMALL)
    assert len(set(raw.symbols)) == len(raw.symbols)


@pytest.mark.parametrize("scan", [False, True], ids=["processes", "scanner threads"])
def test_a_dying_worker_changes_nothing_but_the_speed(scan):
    from gaptrace.decodepool import DecodePool
    from gaptrace.eventcols import ColumnSink
    from gaptrace.jsonstream import DocumentReader

    sink = ColumnSink(scan=scan)
    pool = DecodePool(2, 3 << 16, sink.symbols)
    try:
        pool.kill_one_for_tests()
        sink.start_rank(0)
        DocumentReader(PROBE, sink, 1 << 16, pool).read()
        assert not pool.usable
    finally:
        pool.close()
    assert_same_raw(sink.finish(), reference_raw(PROBE))
