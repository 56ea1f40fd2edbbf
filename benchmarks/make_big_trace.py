"""Build a big Kineto trace by replicating a real one in time, streaming it to disk.

Copy k of the source's events is shifted by ``k * period_us`` (period = the source's span plus a 1 ms pause), and
every id the analyses join on (``args.correlation``, ``External id`` / ``external id``, ``Python id`` /
``Python parent id``, the flow events' ``id``) is offset by ``k * id_stride`` (id_stride = the largest id in the
source plus one), so correlation joins and the Python stack tree stay unique per copy. The top-level keys other
than ``traceEvents`` are written once, in the source's order (some before the events array, some after).

Events are written one per line, compact (``msgspec.json.encode``), so the file holds more events per byte than
Kineto's indented output: the loader benchmark is, if anything, harder on this file than on a real one.
``--kineto-format`` writes them the way Kineto does instead (two-space indent, ``ph``/``cat``/``name``/``pid``/``tid``
on one line, ``ts``/``dur`` on the next, ``args`` as an indented block, ``"k": v,"k2": v2``), about as many bytes
per event as the source capture, for the per-byte cost of a real capture's layout.
Nothing the size of the output is ever held in memory: one copy of the source's events at a time.

    python benchmarks/make_big_trace.py /tmp/gaptrace_big.json --size-gb 1.05 [--source TRACE] [--gzip] [--kineto-format]
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time

import msgspec

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SOURCE = os.path.join(HERE, "..", "fixtures", "traces", "tracelens_h100_owlv2.json.gz")
ID_ARGS = ("correlation", "External id", "external id", "Python id", "Python parent id")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _read(path: str) -> dict:
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    doc = json.loads(data)
    return {"traceEvents": doc} if isinstance(doc, list) else doc


def plan(events: list) -> tuple[float, int]:
    """(period_us, id_stride) for the source events: span + 1 ms, and the largest id + 1."""
    t0, t1, top = float("inf"), float("-inf"), 0
    for e in events:
        ts = e.get("ts")
        if isinstance(ts, (int, float)) and not isinstance(ts, bool):
            dur = e.get("dur")
            dur = dur if isinstance(dur, (int, float)) and not isinstance(dur, bool) else 0
            t0, t1 = min(t0, ts), max(t1, ts + dur)
        if _is_int(e.get("id")):
            top = max(top, e["id"])
        args = e.get("args")
        if isinstance(args, dict):
            for k in ID_ARGS:
                if _is_int(args.get(k)):
                    top = max(top, args[k])
    return (t1 - t0) + 1000.0, top + 1


def shifted_copy(events: list, k: int, period_us: float, id_stride: int) -> list:
    """Copy k of the events: times shifted by k * period_us, ids offset by k * id_stride (ts rounded to ns)."""
    dt, di = k * period_us, k * id_stride
    out = []
    for e in events:
        e = dict(e)
        ts = e.get("ts")
        if isinstance(ts, (int, float)) and not isinstance(ts, bool):
            e["ts"] = round(ts + dt, 3)
        if _is_int(e.get("id")):
            e["id"] = e["id"] + di
        args = e.get("args")
        if isinstance(args, dict):
            args = dict(args)
            for key in ID_ARGS:
                if _is_int(args.get(key)):
                    args[key] = args[key] + di
            e["args"] = args
        out.append(e)
    return out


_HEAD_KEYS = ("ph", "cat", "name", "pid", "tid")
_TIME_KEYS = ("ts", "dur")


def kineto_encode(e: dict, enc: msgspec.json.Encoder) -> bytes:
    """One event in Kineto's own layout (libkineto's ChromeTraceLogger): indented, a few fields per line."""
    def fields(keys) -> bytes:
        return b", ".join(enc.encode(k) + b": " + enc.encode(e[k]) for k in keys)

    head = [k for k in _HEAD_KEYS if k in e]
    times = [k for k in _TIME_KEYS if k in e]
    rest = [k for k in e if k not in _HEAD_KEYS and k not in _TIME_KEYS and k != "args"]
    lines = [b"  {"]
    for group in (head, times, rest):
        if group:
            lines.append(b"    " + fields(group) + b",")
    args = e.get("args")
    if "args" in e and isinstance(args, dict) and args:
        lines.append(b'    "args": {')
        lines.append(b"      " + b",".join(enc.encode(k) + b": " + enc.encode(v) for k, v in args.items()))
        lines.append(b"    }")
    elif "args" in e:
        lines.append(b'    "args": ' + enc.encode(args))
    else:
        lines[-1] = lines[-1][:-1]  # no trailing comma after the last field
    lines.append(b"  }")
    return b"\n".join(lines)


def build(source: str, out_path: str, size_bytes: int, use_gzip: bool, level: int,
          kineto_format: bool = False) -> dict:
    """Write the replicated trace to ``out_path`` (via a temporary name); returns a summary dict."""
    doc = _read(source)
    events = doc["traceEvents"]
    keys = list(doc)
    before = keys[: keys.index("traceEvents")]
    after = keys[keys.index("traceEvents") + 1:]
    period_us, id_stride = plan(events)
    enc = msgspec.json.Encoder()
    encode = (lambda e: kineto_encode(e, enc)) if kineto_format else enc.encode
    tmp = out_path + ".tmp"
    raw = open(tmp, "wb")
    f = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=level, mtime=0) if use_gzip else raw
    written, copies, n_events = 0, 0, 0

    def put(b: bytes) -> None:
        nonlocal written
        f.write(b)
        written += len(b)

    put(b"{\n")
    for key in before:
        put(enc.encode(key) + b": " + enc.encode(doc[key]) + b",\n")
    put(b'"traceEvents": [\n')
    while written < size_bytes:
        chunk = shifted_copy(events, copies, period_us, id_stride)
        put((b",\n" if copies else b"") + b",\n".join(encode(e) for e in chunk))
        copies += 1
        n_events += len(chunk)
    put(b"\n]")
    for key in after:
        put(b",\n" + enc.encode(key) + b": " + enc.encode(doc[key]))
    put(b"\n}\n")
    if use_gzip:
        f.close()
    raw.close()
    os.replace(tmp, out_path)
    return {"path": out_path, "json_bytes": written, "file_bytes": os.path.getsize(out_path), "copies": copies,
            "events": n_events, "period_us": period_us, "id_stride": id_stride}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", help="output path, e.g. /tmp/gaptrace_big.json (never inside the repo)")
    p.add_argument("--source", default=DEFAULT_SOURCE, help="real trace to replicate (default: the largest public one)")
    p.add_argument("--size-gb", type=float, default=1.05, help="JSON bytes to write, in GB (1e9), at least")
    p.add_argument("--gzip", action="store_true", help="gzip the output")
    p.add_argument("--level", type=int, default=6, help="gzip level")
    p.add_argument("--kineto-format", action="store_true",
                   help="write events in Kineto's indented layout (as a real capture) instead of one compact line each")
    a = p.parse_args(argv)
    t = time.perf_counter()
    info = build(a.source, a.out, int(a.size_gb * 1e9), a.gzip, a.level, a.kineto_format)
    info["seconds"] = round(time.perf_counter() - t, 1)
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
