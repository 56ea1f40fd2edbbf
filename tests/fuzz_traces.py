"""Fuzz gaptrace's trace inputs: mutate and truncate slices of the shipped real traces, and check every outcome.

    .venv/bin/python tests/fuzz_traces.py --cases 10000            # in-process, plus the real CLI on a sample
    .venv/bin/python tests/fuzz_traces.py --cases 500 --cli-every 25 --save-dir /tmp/fuzz-crashes

Each case starts from a *base*: a slice of about ``BASE_EVENTS`` complete events of one real trace in
fixtures/traces (a contiguous time window, so host stacks, launches, kernels, annotations and flows stay coherent,
with the file's metadata and, for the runtime captures, its sidecar). Hypothesis draws the mutations:

- event level: dropped keys (``ph``, ``ts``, ``dur``, ``cat``, ``args``, ``args.*``), wrong types (strings, lists,
  objects, booleans, null), NaN, ±Infinity, huge and tiny numbers, integers past int64, negative durations,
  duplicated events, unknown or aliased categories, non-object elements, hostile strings (markup, control
  characters, lone surrogates, right-to-left overrides, long names), clock skew of one process (a pid: a host
  process or a GPU), the same change to a share of all events (every ``dur`` NaN), shuffled events, metadata and
  sidecar of the wrong shape;
- byte level, after serialising (as a bare list, compact, spaced, or gzip): JSON cut anywhere (unclosed),
  gzip cut or a byte of it flipped, a flipped byte, invalid UTF-8 in a string, trailing garbage;
- a file name that is not UTF-8 (a byte Python keeps as a lone surrogate).

The oracle (:func:`check_case`) runs what a user runs: ``load_trace`` (serial or with tiny chunks), then
``run_analysis`` with a window / device / round name drawn from the case, the result checked against
:func:`invariants` (occupancy in [0, 1], busy + idle = window, shares in [0, 1]), the text and JSON renderings
encoded as UTF-8 (what ``click.echo`` does), ``diff_analyses`` against the unmutated base and, for a share of cases,
the HTML report through ``write_report``. Accepted outcomes: a result, or a :class:`~gaptrace.trace.TraceError`
whose message is one line naming the file. Anything else is a *crash*, reported with its exception type and the
innermost gaptrace frame, deduplicated; ``--save-dir`` keeps a reproducer per distinct crash. Every
``--cli-every``-th case also runs the real CLI in a subprocess (``analyze``, ``analyze --json``, ``report -o``,
``diff``) and requires exit 0 (or 2 for a trace without GPU activity) or exactly one ``gaptrace: error:`` line with
exit 2, no ``Traceback``, valid JSON for ``--json``, and no report file (nor temporary file) left after a failure;
it runs with a strict UTF-8 stdout, as under a desktop locale.

Prints a table: cases, seconds, outcomes (results / clean errors / crashes) and each distinct crash.
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import gzip
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TRACES = os.path.join(ROOT, "fixtures", "traces")

# (file under fixtures/traces, where the slice starts: "round" = the first round annotation, else the fraction
# of the device activity span). Small slices keep a case at tens of milliseconds.
BASE_SOURCES = [
    ("h200_graph_launch_probe.json.gz", 0.5),
    ("h200_runtime/h200_tiny_sync_bs1_B12.json.gz", "round"),
    ("h200_runtime/h200_tiny_overlap_bs8_B12.json.gz", "round"),
    ("tracelens_mi300x_sglang_qwen3_8b_decode.json.gz", 0.0),
    ("kineto_v100_resnet50.json.gz", 0.5),
    ("tracelens_b200_eager.json.gz", 0.3),
    ("hta_a100_graph_launches_rank0.json.gz", 0.5),
]
BASE_EVENTS = 600

EVENT_KEYS = ["ph", "ts", "dur", "cat", "name", "pid", "tid", "args", "id"]
ARG_KEYS = ["correlation", "External id", "Python id", "Python parent id", "device", "stream", "bytes", "cbid",
            "cuda_sync_kind"]
CATEGORIES = ["kernel", "gpu_memcpy", "gpu_memset", "cpu_op", "python_function", "user_annotation",
              "gpu_user_annotation", "cuda_runtime", "cuda_driver", "cuda_sync", "overhead", "ac2g", "Kernel",
              "Runtime", "Operator", "Memcpy", "quantum_op", "", "KERNEL", "cpu_instant_event"]
HOSTILE_STRINGS = [
    "</script><script>alert(1)</script>", "<img src=x onerror=alert(1)>", "\"'><svg onload=alert(1)>",
    "a\nb\r\nc", "\x00\x01\x1b[31m", "\u202eevil", "\ud800", "\udfff lone", "🚀名字", "{}%s%n${x}", "\\", "",
    "x" * 5000, "Memcpy DtoH (Device -> Pageable)", "Memcpy (", "cudaGraphLaunch", "cudaStreamSynchronize",
    "round", "round_1", "decode", "stream 7", "stream -3", "NaN", "1e400", "probe.py(12): step",
    "<built-in method wait of lock>",
]
HOSTILE_NUMBERS = [float("nan"), float("inf"), float("-inf"), 1e308, -1e308, 1.7976931348623157e308, 5e-324,
                   -0.0, 0, -1, -5, 1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64 + 1, -(2**63) - 1, 10**30,
                   1e18, -1e18, 123456789.123456789]
JUNK = [None, True, False, [], {}, [1, 2], {"a": 1}, "", "12", "x"]


# ---------------------------------------------------------------------------------------------- bases
@dataclasses.dataclass
class Base:
    name: str
    doc_json: str  # the sliced document, serialised (json.loads per case gives a fresh copy cheaply)
    sidecar: dict | None
    annotations: list[str]  # user_annotation names in the slice (window choices)


def _slice(doc: dict, start: Any, n_events: int) -> dict:
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    x = [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and isinstance(e.get("ts"), (int, float))]
    x.sort(key=lambda e: e["ts"])
    if start == "round":
        rounds = [e["ts"] for e in x if e.get("cat") == "user_annotation" and str(e.get("name")).startswith("round")]
        t0 = min(rounds, default=x[0]["ts"])
    else:
        dev = [e["ts"] for e in x if e.get("cat") in ("kernel", "Kernel")]
        t0 = dev[int(start * (len(dev) - 1))] if dev else x[0]["ts"]
    first = next((i for i, e in enumerate(x) if e["ts"] >= t0), 0)
    # widen to the host events already open at t0 (their stacks) by stepping back a little
    lo = max(0, first - n_events // 6)
    chosen = x[lo:lo + n_events]
    t_lo, t_hi = chosen[0]["ts"], chosen[-1]["ts"]
    flows = [e for e in events if isinstance(e, dict) and e.get("ph") in ("s", "f")
             and isinstance(e.get("ts"), (int, float)) and t_lo <= e["ts"] <= t_hi][: n_events // 3]
    meta = [e for e in events if isinstance(e, dict) and e.get("ph") == "M"]
    out = {k: v for k, v in doc.items() if k != "traceEvents"} if isinstance(doc, dict) else {}
    out["traceEvents"] = meta + chosen + flows
    return out


def load_bases(n_events: int = BASE_EVENTS) -> list[Base]:
    """The fuzz bases: one slice of ``n_events`` complete events per entry of ``BASE_SOURCES``."""
    bases = []
    for rel, start in BASE_SOURCES:
        path = os.path.join(TRACES, rel)
        with gzip.open(path) as f:
            doc = json.load(f)
        sl = _slice(doc, start, n_events)
        side_path = path[: -len(".json.gz")] + ".gaptrace.json"
        sidecar = None
        if os.path.exists(side_path):
            with open(side_path) as f:
                sidecar = json.load(f)
        names = sorted({str(e.get("name")) for e in sl["traceEvents"] if e.get("cat") == "user_annotation"})
        bases.append(Base(os.path.basename(rel), json.dumps(sl), sidecar, names))
    return bases


# ---------------------------------------------------------------------------------------------- mutations
def _strategies():
    from hypothesis import strategies as st

    frac = st.floats(0, 1, exclude_max=True)
    number = st.one_of(st.sampled_from(HOSTILE_NUMBERS), st.floats(allow_nan=True, allow_infinity=True),
                       st.integers(-(2**70), 2**70))
    string = st.one_of(st.sampled_from(HOSTILE_STRINGS), st.text(max_size=40))
    value = st.one_of(number, string, st.sampled_from(JUNK))
    ev_key = st.sampled_from(EVENT_KEYS)
    arg_key = st.sampled_from(ARG_KEYS)
    mutation = st.one_of(
        st.tuples(st.just("drop"), frac, ev_key),
        st.tuples(st.just("drop_arg"), frac, arg_key),
        st.tuples(st.just("set"), frac, ev_key, value),
        st.tuples(st.just("set_arg"), frac, arg_key, value),
        st.tuples(st.just("negdur"), frac, st.sampled_from([-1, -1e-3, -1e9])),
        st.tuples(st.just("dup"), frac, st.integers(1, 50)),
        st.tuples(st.just("cat"), frac, st.sampled_from(CATEGORIES)),
        st.tuples(st.just("name"), frac, string),
        st.tuples(st.just("junk_event"), frac, value),
        st.tuples(st.just("skew"), frac, st.sampled_from([1e6, -1e6, 37.5, -1e12, 1e15, 1e300])),
        st.tuples(st.just("bulk"), frac, st.sampled_from(["ts", "dur", "cat", "pid", "tid", "name", "args"]),
                  value),
        st.tuples(st.just("bulk_arg"), frac, arg_key, value),
        st.tuples(st.just("meta"), st.sampled_from(["deviceProperties", "traceEvents", "baseTimeNanoseconds",
                                                    "distributedInfo", "displayTimeUnit"]), value),
        st.tuples(st.just("device_props"), value),
        st.tuples(st.just("sidecar"), st.sampled_from(["analysis_window", "graphs", "rounds",
                                                       "unprofiled_round_ms", "config", "*"]), value),
        st.tuples(st.just("shuffle"), st.integers(0, 2**32 - 1)),
    )
    byte_op = weighted(st, [(8, st.none()), (2, st.one_of(  # 80% intact bytes
        st.tuples(st.just("cut"), frac),
        st.tuples(st.just("flip"), frac, st.integers(0, 255)),
        st.tuples(st.just("bad_utf8"), frac),
        st.tuples(st.just("garbage"), st.sampled_from([b"x", b"]", b"}", b",", b"\x00", b" {}"])),
    ))])
    return st.fixed_dictionaries({
        "base": st.integers(0, len(BASE_SOURCES) - 1),
        "mutations": st.lists(mutation, max_size=6),
        "form": st.sampled_from(["object", "object", "list", "compact", "spaced"]),
        "gzip": st.sampled_from([None] * 10 + ["ok"] * 8 + ["cut", "flip"]),
        "gzip_at": frac,
        "byte_op": byte_op,
        "window": weighted(st, [(6, st.none()), (3, st.sampled_from([0, 1, 2])), (1, string)]),
        "device": weighted(st, [(9, st.none()), (1, st.integers(-1, 3))]),
        "round_name": st.sampled_from(["round", "round", "decode", "verify", ""]),
        "chunk": st.sampled_from([None, None, None, 512, 4096]),
        "report": st.booleans(),
        "odd_name": weighted(st, [(9, st.just(False)), (1, st.just(True))]),  # a file name that is not UTF-8
    })


def weighted(st, choices: list):
    """One of the strategies, drawn with the given integer weights."""
    table = [strat for w, strat in choices for _ in range(w)]
    return st.integers(0, len(table) - 1).flatmap(lambda i: table[i])


def case_strategy():
    """The hypothesis strategy of one fuzz case (a plain dict; see :func:`materialise`)."""
    return _strategies()


def _pick(events: list, f: float) -> int | None:
    return int(f * len(events)) if events else None


def apply_mutations(doc: dict, sidecar: dict | None, mutations: list) -> tuple[dict, dict | None]:
    """Apply the event / metadata / sidecar mutations in order; returns the (document, sidecar)."""
    events = doc["traceEvents"]
    for m in mutations:
        op = m[0]
        if not isinstance(events, list):
            break
        if op in ("drop", "drop_arg", "set", "set_arg", "negdur", "dup", "cat", "name", "junk_event"):
            i = _pick(events, m[1])
            if i is None:
                continue
            e = events[i]
            if op == "junk_event":
                events[i] = m[2]
                continue
            if not isinstance(e, dict):
                continue
            if op == "drop":
                e.pop(m[2], None)
            elif op == "drop_arg" and isinstance(e.get("args"), dict):
                e["args"].pop(m[2], None)
            elif op == "set":
                e[m[2]] = m[3]
            elif op == "set_arg":
                if not isinstance(e.get("args"), dict):
                    e["args"] = {}
                e["args"][m[2]] = m[3]
            elif op == "negdur":
                e["dur"] = m[2]
            elif op == "dup":
                events[i + 1:i + 1] = [json.loads(json.dumps(e)) for _ in range(m[2])]
            elif op == "cat":
                e["cat"] = m[2]
            elif op == "name":
                e["name"] = m[2]
        elif op == "skew":  # shift every event of one pid (a process, or one GPU) by an offset
            i = _pick(events, m[1])
            e = events[i] if i is not None else None
            if not isinstance(e, dict):
                continue
            pid = e.get("pid")
            for x in events:
                if isinstance(x, dict) and x.get("pid") == pid and isinstance(x.get("ts"), (int, float)) \
                        and not isinstance(x.get("ts"), bool):
                    x["ts"] = x["ts"] + m[2]
        elif op in ("bulk", "bulk_arg"):  # the same change to a share of all events
            step = max(1, int(1 / max(m[1], 1e-3)))
            for x in events[::step]:
                if not isinstance(x, dict):
                    continue
                if op == "bulk":
                    x[m[2]] = m[3]
                elif isinstance(x.get("args"), dict):
                    x["args"][m[2]] = m[3]
        elif op == "meta":
            doc[m[1]] = m[2]
            events = doc["traceEvents"]
        elif op == "device_props":
            props = doc.get("deviceProperties")
            if isinstance(props, list) and props and isinstance(props[0], dict):
                props[0]["name"] = m[1] if isinstance(m[1], str) else props[0].get("name")
                props[0]["id"] = m[1]
            else:
                doc["deviceProperties"] = [m[1]]
        elif op == "sidecar" and sidecar is not None:
            if m[1] == "*":
                sidecar = m[2]  # the whole sidecar of the wrong type
            elif isinstance(sidecar, dict):
                sidecar[m[1]] = m[2]
        elif op == "shuffle":
            random.Random(m[1]).shuffle(events)
    return doc, sidecar


def serialise(doc: dict, form: str) -> bytes:
    """JSON bytes of the document: a Kineto object (indent 1, as torch writes), a bare event list, compact, or
    spaced. NaN / Infinity become the bare tokens stdlib json writes (not JSON, but seen in the wild)."""
    if form == "list":
        return json.dumps(doc.get("traceEvents")).encode()
    if form == "compact":
        return json.dumps(doc, separators=(",", ":")).encode()
    if form == "spaced":
        return json.dumps(doc, indent=4).encode()
    return json.dumps(doc, indent=1).encode()


def apply_bytes(data: bytes, case: dict) -> bytes:
    op = case["byte_op"]
    if op is not None and data:
        if op[0] == "cut":
            data = data[: int(op[1] * len(data))]
        elif op[0] == "flip":
            i = int(op[1] * len(data))
            data = data[:i] + bytes([op[2]]) + data[i + 1:]
        elif op[0] == "bad_utf8":  # invalid UTF-8 inside the first string at or after the position
            i = data.find(b'"', int(op[1] * len(data)))
            if i >= 0:
                data = data[:i + 1] + b"\xff\xfe\xc3" + data[i + 1:]
        elif op[0] == "garbage":
            data = data + op[1]
    if case["gzip"]:
        data = gzip.compress(data, compresslevel=1)
        i = 10 + int(case["gzip_at"] * max(len(data) - 10, 1))
        if case["gzip"] == "cut":
            data = data[:i]
        elif case["gzip"] == "flip" and i < len(data):
            data = data[:i] + bytes([data[i] ^ 0x5A]) + data[i + 1:]
    return data


@dataclasses.dataclass
class Materialised:
    trace_path: str
    base_path: str  # the unmutated slice (the diff's other side)
    window: str | None
    device: int | None
    round_name: str
    chunk: int | None
    report: bool


def materialise(case: dict, bases: list[Base], workdir: str) -> Materialised:
    """Write the case's trace (and sidecar) into ``workdir``; returns the paths and the analysis options."""
    base = bases[case["base"]]
    doc = json.loads(base.doc_json)
    sidecar = json.loads(json.dumps(base.sidecar)) if base.sidecar is not None else None
    doc, sidecar = apply_mutations(doc, sidecar, case["mutations"])
    data = apply_bytes(serialise(doc, case["form"]), case)
    stem = "case" + ("\udcff" if case.get("odd_name") else "")  # the byte 0xff, as Python keeps it in a str
    path = os.path.join(workdir, stem + (".json.gz" if case["gzip"] else ".json"))
    for stale in os.listdir(workdir):
        if stale.startswith("case"):
            os.unlink(os.path.join(workdir, stale))
    with open(path, "wb") as f:
        f.write(data)
    if sidecar is not None:
        with open(os.path.join(workdir, stem + ".gaptrace.json"), "w") as f:
            json.dump(sidecar, f)
    base_path = os.path.join(workdir, f"base{case['base']}.json")
    if not os.path.exists(base_path):
        with open(base_path, "w") as f:
            f.write(base.doc_json)
    w = case["window"]
    window = base.annotations[w % len(base.annotations)] if isinstance(w, int) and base.annotations else \
        (w if isinstance(w, str) else None)
    return Materialised(path, base_path, window, case["device"], case["round_name"], case["chunk"], case["report"])


# ---------------------------------------------------------------------------------------------- oracle
@dataclasses.dataclass
class Outcome:
    kind: str  # "result" | "error" | "crash"
    detail: str  # the error line, or the crash signature
    trace: str = ""  # the crash's traceback


def _signature(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    ours = [f for f in tb if "/gaptrace/" in f.filename or "/analyses/" in f.filename or "/runtime/" in f.filename]
    f = (ours or tb)[-1] if (ours or tb) else None
    where = f"{os.path.relpath(f.filename, ROOT)}:{f.lineno} {f.name}" if f else "?"
    return f"{type(e).__name__} at {where}"


def _check_error_line(msg: str, path: str) -> str | None:
    if "\n" in msg or "\r" in msg:
        return "error message is not one line"
    if path not in msg:
        return "error message does not name the file"
    return None


def invariants(res: dict) -> str | None:
    """What a result must satisfy whatever the input (None when it does): finite occupancy in [0, 1], busy + idle
    = window, shares of idle in [0, 1], no frame charged more idle than the device had."""
    from gaptrace.analyze import to_jsonable

    r = to_jsonable(res)
    eps = 1e-6
    idle_of = {}
    for d in r["devices"]:
        occ, w, b, i = d.get("occupancy"), d.get("window_us"), d.get("busy_us"), d.get("idle_us")
        if None in (occ, w, b, i) or not -eps <= occ <= 1 + eps:
            return f"device occupancy {occ} (window {w}, busy {b}, idle {i})"
        if b < -eps or i < -eps or abs(b + i - w) > eps * max(1.0, abs(w)):
            return f"busy {b} + idle {i} != window {w}"
        idle_of[(d["rank"], d["device"])] = i
    top_idle = max(idle_of.values(), default=0.0)
    for f in r["gap_attribution"]:
        sh, inc = f.get("share"), f.get("inclusive_idle_us")
        if sh is None or not -eps <= sh <= 1 + eps or inc is None or inc > top_idle * (1 + eps) + eps:
            return f"frame {f.get('frame')!r}: share {sh}, inclusive idle {inc} > device idle {top_idle}"
    for f in r["findings"]:
        sh = f.get("idle_share")
        if sh is None or not -eps <= sh <= 1 + eps:
            return f"finding {f.get('kind')}: idle_share {sh}"
    return None


def check_case(m: Materialised, base_results: dict[str, dict]) -> Outcome:
    """Run the in-process API path on one materialised case; never raises."""
    from gaptrace.analyses.diff import diff_analyses
    from gaptrace.analyze import render_text, run_analysis, to_jsonable
    from gaptrace.capture import read_sidecar
    from gaptrace.loader import load_trace
    from gaptrace.report import write_report
    from gaptrace.trace import TraceError

    try:
        trace = load_trace(m.trace_path, workers=0, chunk_bytes=m.chunk)
        res = run_analysis(trace, window=m.window, device=m.device, sidecar=read_sidecar(m.trace_path),
                           round_name=m.round_name or "round")
        bad = invariants(res)
        if bad:
            return Outcome("crash", f"bad result: {bad.split(':')[0]}", bad)
        # what `analyze` prints (click.echo encodes to UTF-8; strict on a real stdout)
        render_text(res).encode("utf-8")
        json.dumps(to_jsonable(res), indent=1, ensure_ascii=False, allow_nan=False).encode("utf-8")
        if m.base_path not in base_results:
            base_results[m.base_path] = run_analysis(load_trace(m.base_path, workers=0))
        d = diff_analyses(base_results[m.base_path], res)
        json.dumps(to_jsonable(d), ensure_ascii=False, allow_nan=False).encode("utf-8")
        if m.report and res["devices"]:
            out = os.path.join(os.path.dirname(m.trace_path), "case.report.html")
            write_report(m.trace_path, out, window=m.window, device=m.device, round_name=m.round_name or "round")
            os.unlink(out)
        return Outcome("result", "")
    except TraceError as e:
        bad = _check_error_line(str(e), m.trace_path)
        if bad:
            return Outcome("crash", f"TraceError: {bad}", repr(str(e)))
        return Outcome("error", str(e).split(": ", 1)[-1][:80])
    except Exception as e:  # noqa: BLE001 - the fuzzer's job is to catch and report everything else
        return Outcome("crash", _signature(e), traceback.format_exc())


def _argv_safe(s: str) -> bool:
    """Whether ``s`` can be an argv element (no NUL; encodable as the OS encodes argv)."""
    try:
        return "\x00" not in s and bool(os.fsencode(s)) is not None
    except UnicodeEncodeError:
        return False


def run_cli(m: Materialised, timeout_s: float = 120) -> list[Outcome]:
    """The real CLI in a subprocess on one case: analyze, analyze --json, report -o, diff."""
    exe = [sys.executable, "-m", "gaptrace.cli"]
    win = ["--window", m.window] if m.window is not None and _argv_safe(m.window) else []
    dev = ["--device", str(m.device)] if m.device is not None else []
    rnd = ["--rounds", m.round_name] if m.round_name and _argv_safe(m.round_name) else []
    out_html = os.path.join(os.path.dirname(m.trace_path), "cli.report.html")
    runs = [("analyze", ["analyze", m.trace_path, *win, *dev, *rnd]),
            ("analyze --json", ["analyze", m.trace_path, "--json", *win, *dev, *rnd]),
            ("report -o", ["report", m.trace_path, "-o", out_html, *win, *dev, *rnd]),
            ("diff", ["diff", m.base_path, m.trace_path, *win, *rnd])]
    outcomes = []
    # a UTF-8 desktop locale: stdout strict (this machine's C.UTF-8 would let lone surrogates through)
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict"}
    for label, args in runs:
        if os.path.exists(out_html):
            os.unlink(out_html)
        r = subprocess.run(exe + args, capture_output=True, timeout=timeout_s, cwd=ROOT, env=env)
        err = r.stderr.decode("utf-8", "replace")
        problem = None
        if "Traceback" in err:
            problem = "traceback: " + err.strip().splitlines()[-1][:200]
        elif r.returncode not in (0, 2):
            problem = f"exit {r.returncode}"
        elif r.returncode == 2:
            lines = [ln for ln in err.splitlines() if ln.strip()]
            if len(lines) != 1 or not lines[0].startswith("gaptrace: error: "):
                problem = f"exit 2 without one error line: {err[:200]!r}"
        if problem is None and label == "analyze --json" and r.stdout.strip():
            try:
                json.loads(r.stdout)
            except ValueError:
                problem = "--json printed invalid JSON"
        if problem is None and label == "report -o":
            left = [n for n in os.listdir(os.path.dirname(out_html)) if n.startswith(".gaptrace-report-")]
            if left:
                problem = f"temporary files left: {left}"
            elif r.returncode != 0 and os.path.exists(out_html):
                problem = "a failed report left an output file"
            elif r.returncode == 0 and not open(out_html, "rb").read().rstrip().endswith(b"</html>"):
                problem = "report file incomplete"
        if problem:
            outcomes.append(Outcome("crash", f"cli {label}: {problem}", err[-3000:]))
        else:
            outcomes.append(Outcome("result" if r.returncode == 0 else "error", f"cli {label} exit {r.returncode}"))
    if os.path.exists(out_html):
        os.unlink(out_html)
    return outcomes


# ---------------------------------------------------------------------------------------------- driver
@dataclasses.dataclass
class Tally:
    cases: int = 0
    cli_cases: int = 0
    outcomes: Counter = dataclasses.field(default_factory=Counter)
    errors: Counter = dataclasses.field(default_factory=Counter)
    crashes: dict = dataclasses.field(default_factory=dict)  # signature -> (count, first traceback, case)


def fuzz(cases: int, cli_every: int = 0, seed: int | None = None, workdir: str | None = None,
         save_dir: str | None = None, bases: list[Base] | None = None, progress: bool = False) -> Tally:
    """Run ``cases`` hypothesis-drawn cases in process (and the real CLI on every ``cli_every``-th); never raises
    on a crash: the returned :class:`Tally` lists them."""
    from hypothesis import HealthCheck, Phase, given, seed as hseed, settings

    bases = bases if bases is not None else load_bases()
    own = workdir is None
    workdir = workdir or tempfile.mkdtemp(prefix="gaptrace-fuzz-")
    tally = Tally()
    base_results: dict[str, dict] = {}
    t_start = time.time()

    def record(o: Outcome, case: dict) -> None:
        tally.outcomes[o.kind] += 1
        if o.kind == "error":
            tally.errors[o.detail] += 1
        elif o.kind == "crash":
            n, tb, c = tally.crashes.get(o.detail, (0, o.trace, case))
            tally.crashes[o.detail] = (n + 1, tb, c)
            if n == 0 and save_dir:
                _save(save_dir, len(tally.crashes), o, case, bases, workdir)

    @settings(max_examples=cases, deadline=None, database=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=case_strategy())
    def one(case: dict) -> None:
        try:
            m = materialise(case, bases, workdir)
        except ValueError as e:
            # two mutations can put one dict inside itself; JSON cannot say that, so no file can hold such a case
            if "Circular reference" not in str(e):
                raise
            tally.unwritable = getattr(tally, "unwritable", 0) + 1
            return
        record(check_case(m, base_results), case)
        tally.cases += 1
        if cli_every and tally.cases % cli_every == 0:
            tally.cli_cases += 1
            try:
                outcomes = run_cli(m)
            except Exception as e:  # noqa: BLE001 - a fault of this script; recorded, the run goes on
                outcomes = [Outcome("crash", f"fuzz harness: {_signature(e)}", traceback.format_exc())]
            for o in outcomes:
                record(o, case)
        if progress and tally.cases % 500 == 0:
            print(f"  {tally.cases} cases, {time.time() - t_start:.0f} s, crashes {len(tally.crashes)}",
                  file=sys.stderr, flush=True)

    if seed is not None:
        one = hseed(seed)(one)
    try:
        one()
    finally:
        if own:
            shutil.rmtree(workdir, ignore_errors=True)
    return tally


def _short(v: Any) -> Any:
    """The case with long strings cut (a readable reproducer record; the trace file itself is saved too)."""
    if isinstance(v, str) and len(v) > 60:
        return v[:60] + f"...({len(v)} chars)"
    if isinstance(v, (list, tuple)):
        return type(v)(_short(x) for x in v)
    if isinstance(v, dict):
        return {k: _short(x) for k, x in v.items()}
    return v


def _save(save_dir: str, k: int, o: Outcome, case: dict, bases: list[Base], workdir: str) -> None:
    os.makedirs(save_dir, exist_ok=True)
    for n in os.listdir(workdir):
        if n.startswith("case"):
            shutil.copy(os.path.join(workdir, n), os.path.join(save_dir, f"crash{k}-{n}"))
    with open(os.path.join(save_dir, f"crash{k}.txt"), "w") as f:
        f.write(f"{o.detail}\n\ncase: {_short(case)!r}\n\n{o.trace}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--cli-every", type=int, default=200, help="run the real CLI on every Nth case (0: never)")
    ap.add_argument("--seed", type=int, default=None, help="hypothesis seed (default: random)")
    ap.add_argument("--save-dir", default=None, help="keep a reproducer per distinct crash here")
    ap.add_argument("--events", type=int, default=BASE_EVENTS, help="complete events per base slice")
    a = ap.parse_args()
    t0 = time.time()
    bases = load_bases(a.events)
    t_bases = time.time() - t0
    tally = fuzz(a.cases, a.cli_every, a.seed, save_dir=a.save_dir, bases=bases, progress=True)
    secs = time.time() - t0
    print(f"{'cases (in process)':<28}{tally.cases:>10,}")
    print(f"{'cases also run by the CLI':<28}{tally.cli_cases:>10,}  (4 commands each)")
    print(f"{'seconds':<28}{secs:>10,.1f}  ({t_bases:.1f} s slicing the bases, "
          f"{1000 * (secs - t_bases) / max(tally.cases, 1):.1f} ms a case)")
    for kind in ("result", "error", "crash"):
        print(f"{'outcome ' + kind:<28}{tally.outcomes[kind]:>10,}")
    print("\nmost common clean errors:")
    for msg, n in tally.errors.most_common(12):
        print(f"  {n:>7,}  {msg}")
    print(f"\ndistinct crashes: {len(tally.crashes)}")
    for sig, (n, tb, _) in sorted(tally.crashes.items(), key=lambda kv: -kv[1][0]):
        print(f"  {n:>7,}  {sig}")
    sys.exit(1 if tally.crashes else 0)


if __name__ == "__main__":
    main()
