"""Hostile traces: a few hundred fuzz cases (tests/fuzz_traces.py), the regressions they found, the size guard.

Every case must end in a result that satisfies the invariants (occupancy in [0, 1], busy + idle = window, shares
of idle in [0, 1]) or in one TraceError line; the real CLI (`analyze`, `analyze --json`, `report -o`, `diff`)
must exit 0 or 2 with one `gaptrace: error:` line, no traceback, and no report (nor temporary file) left behind.
"""
from __future__ import annotations

import gzip
import importlib.util
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from gaptrace.analyze import run_analysis
from gaptrace.loader import load_trace, load_trace_reference
from gaptrace.report import write_report
from gaptrace.report.charts import icicle_figure
from gaptrace.report.stacks import idle_stack_tree
from gaptrace.analyses.gaps import event_idle
from gaptrace.analyses.timeline import BusyTimeline

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROBE = os.path.join(ROOT, "fixtures", "traces", "h200_graph_launch_probe.json.gz")
SMALL = os.path.join(ROOT, "fixtures", "traces", "tracelens_mi300x_sglang_qwen3_8b_decode.json.gz")


def _fuzz_module():
    spec = importlib.util.spec_from_file_location("fuzz_traces", os.path.join(ROOT, "tests", "fuzz_traces.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _doc(path: str) -> dict:
    with gzip.open(path) as f:
        return json.load(f)


def _write(tmp_path, doc: dict, name: str = "t.json") -> str:
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return str(p)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gaptrace.cli", *args], capture_output=True, cwd=ROOT)


def _one_error_line(r: subprocess.CompletedProcess) -> str:
    err = r.stderr.decode()
    assert r.returncode == 2 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gaptrace: error: "), err
    return lines[0]


# ---------------------------------------------------------------------------------------------- the fuzzer
def test_a_few_hundred_fuzz_cases(tmp_path):
    fz = _fuzz_module()
    tally = fz.fuzz(cases=200, cli_every=60, seed=20260130, workdir=str(tmp_path))
    crashes = "\n\n".join(f"{sig} (x{n})\ncase: {fz._short(case)!r}\n{tb}"
                          for sig, (n, tb, case) in tally.crashes.items())
    assert not tally.crashes, crashes
    assert tally.cases == 200 and tally.cli_cases == 3
    # the mutations must leave most cases analysable, or the fuzzer only tests the JSON parser
    assert tally.outcomes["result"] >= 0.4 * tally.cases, tally.outcomes


# ---------------------------------------------------------------------------------------------- regressions
def test_numbers_outside_int64_and_float64(tmp_path):
    """Ids past int64 (int, float or string) were an OverflowError in both readers; a 400-digit ts one in float()."""
    doc = _doc(SMALL)
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    kernels[0]["args"]["correlation"] = 2**63
    kernels[1]["args"]["External id"] = 2.5e26
    kernels[2]["args"]["bytes"] = "9" * 25
    kernels[3]["args"].pop("device", None)
    kernels[3]["pid"] = 10**30  # the device is parsed from the pid when args.device is absent
    kernels[4]["args"].pop("stream", None)
    kernels[4]["tid"] = "stream " + "7" * 5000  # more digits than int() takes
    kernels[5]["ts"] = 10**400  # beyond float64: not a finite time, dropped
    kernels[6]["ts"], kernels[6]["dur"] = 1e308, 1e308  # finite each, but the end overflows to inf: dropped
    n_kernels = len(kernels)
    path = _write(tmp_path, doc)
    fast, ref = load_trace(path), load_trace_reference(path)
    for t in (fast, ref):
        dev = t.device[t.device["kind"] == "kernel"]
        assert len(dev) == n_kernels - 2
        assert "2 events without a finite ts/dur/end were dropped" in t.warnings
        ts = dev["ts_us"].to_numpy()
        row = {k: np.flatnonzero(ts == kernels[k]["ts"]) for k in range(5)}
        assert dev["correlation"].to_numpy()[row[0]].tolist() == [-1]
        assert dev["external_id"].to_numpy()[row[1]].tolist() == [-1]
        assert dev["bytes"].to_numpy()[row[2]].tolist() == [-1]
        assert dev["device"].to_numpy()[row[3]].tolist() == [-1]
        assert dev["stream"].to_numpy()[row[4]].tolist() == [-1]
    assert fast.device["correlation"].tolist() == ref.device["correlation"].tolist()
    run_analysis(fast)


@pytest.mark.parametrize("props", [7, float("nan"), {"id": 0, "name": "x"}, [None, "x", 3], "GPU"])
def test_device_properties_of_the_wrong_shape(tmp_path, props):
    """A deviceProperties that is not a list was a TypeError in Trace.device_name."""
    doc = _doc(SMALL)
    doc["deviceProperties"] = props
    res = run_analysis(load_trace(_write(tmp_path, doc)))
    assert [d["name"] for d in res["devices"]] == [f"GPU {d['device']}" for d in res["devices"]]


def test_lone_surrogates_become_replacement_characters(tmp_path):
    """JSON may escape a lone surrogate; printing it (analyze) or writing the report in UTF-8 crashed."""
    doc = _doc(SMALL)
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    frames = [e for e in doc["traceEvents"] if e.get("cat") == "python_function"]
    kernels[0]["name"], kernels[1]["name"] = "k\ud800", "k\udfff"  # both become "k\ufffd": one symbol
    frames[0]["name"] = "evil\udc80.py(1): f"
    doc["deviceProperties"] = [{"id": kernels[0]["args"]["device"], "name": "H\ud800"}]
    path = _write(tmp_path, doc)  # json.dumps escapes them as \\udXXX
    t = load_trace(path)
    names = t.device["name"].astype(str)
    assert (names == "k\ufffd").sum() == 2 and not names.str.contains("[\ud800-\udfff]").any()
    assert list(t.symbols).count("k\ufffd") == 1
    assert (t.host["name"].astype(str) == "evil\ufffd.py(1): f").sum() == 1
    r = _cli("analyze", path, "--json")
    assert r.returncode == 0, r.stderr.decode()
    out = json.loads(r.stdout.decode("utf-8"))
    assert out["devices"][0]["name"] == "H\ufffd"
    info = write_report(path, str(tmp_path / "r.html"))
    assert "H\ufffd" in (tmp_path / "r.html").read_text(encoding="utf-8") and info["bytes"] > 0


def test_window_without_device_activity(tmp_path):
    """busy(t) of a window holding no busy span indexed an empty array (the report's occupancy strip)."""
    doc = _doc(PROBE)
    ev = doc["traceEvents"]
    first = min(e["ts"] for e in ev if e.get("cat") == "kernel")
    host = next(e for e in ev if e.get("cat") == "user_annotation")
    ev.append({"ph": "X", "cat": "user_annotation", "name": "before", "pid": host["pid"], "tid": host["tid"],
               "ts": first - 1000.0, "dur": 990.0, "args": {}})
    path = _write(tmp_path, doc)
    res = run_analysis(load_trace(path), window="before")
    d = res["devices"][0]
    assert d["busy_us"] == 0 and d["occupancy"] == 0 and d["gaps"] == 1
    assert d["idle_us"] == pytest.approx(990.0) and d["window_us"] == pytest.approx(990.0)
    write_report(path, str(tmp_path / "r.html"), window="before")
    tl = BusyTimeline.from_intervals(np.array([0.0]), np.array([1.0]), 5.0, 10.0)
    assert tl.busy_before(np.array([4.0, 7.0, 11.0])).tolist() == [0.0, 0.0, 0.0]
    assert tl.busy_fraction_bins(4)["busy_fraction"].tolist() == [0.0] * 4


def test_icicle_when_no_frame_holds_a_visible_share(tmp_path):
    """When no frame holds a visible share the icicle keeps no box (max() of nothing used to raise). A kernel
    skewed 5e12 µs late used to cause that; the loader now drops it as a far outlier, with a warning."""
    doc = _doc(PROBE)
    ev = doc["traceEvents"]
    k = next(e for e in ev if e.get("cat") == "kernel")
    ev.append({**k, "ts": k["ts"] + 5e12})
    path = _write(tmp_path, doc)
    t = load_trace(path)
    assert any("more than 100× the trace's span" in w for w in t.warnings)
    res = run_analysis(t)
    d = res["devices"][0]
    assert d["window_us"] < 1e6  # the probe's own 0.36 s, not 5e12 µs
    fig = icicle_figure(idle_stack_tree(event_idle(t, (0, d["device"]))), min_share=1.01)
    assert fig["data"] == []
    write_report(path, str(tmp_path / "r.html"))


# ---------------------------------------------------------------------------------------------- size guard
@pytest.mark.parametrize("cmd", ["analyze", "analyze --json", "report", "diff"])
def test_memory_limit_option_refuses_with_size_and_limit(tmp_path, cmd):
    out = tmp_path / "r.html"
    args = {"analyze": ["analyze", PROBE], "analyze --json": ["analyze", PROBE, "--json"],
            "report": ["report", PROBE, "-o", str(out)], "diff": ["diff", PROBE, PROBE]}[cmd]
    r = _cli(*args, "--memory-limit-gb", "0.05")
    line = _one_error_line(r)
    gzip_gb = os.path.getsize(PROBE) / 1e9  # known before reading; the JSON inside is counted as it streams
    assert f"too big to load here: {gzip_gb:.2f} GB of JSON and gzip" in line and "over the limit of 0.05 GB" in line
    assert r.stdout == b"" and not os.listdir(tmp_path)  # nothing written, not even a temporary file


@pytest.mark.parametrize("value", ["nan", "inf", "1e300", "0", "-1", "abc"])
@pytest.mark.parametrize("cmd", ["analyze", "report", "diff"])
def test_memory_limit_option_refuses_what_is_not_a_size(tmp_path, cmd, value):
    args = {"analyze": ["analyze", PROBE], "report": ["report", PROBE, "-o", str(tmp_path / "r.html")],
            "diff": ["diff", PROBE, PROBE]}[cmd]
    line = _one_error_line(_cli(*args, "--memory-limit-gb", value))
    assert "--memory-limit-gb" in line and not os.listdir(tmp_path)


def test_memory_limit_option_above_the_need_changes_nothing():
    a = _cli("analyze", PROBE, "--json", "--memory-limit-gb", "4")
    assert a.returncode == 0, a.stderr.decode()
    assert json.loads(a.stdout)["devices"] == run_analysis(load_trace(PROBE))["devices"]


def test_a_trace_bigger_than_memory_is_refused_before_reading(tmp_path):
    """A 1 TB (sparse) trace with the default limit: refused at once, by size, without reading a byte of it."""
    p = tmp_path / "huge.json"
    with open(p, "wb") as f:
        f.truncate(1 << 40)
    t0 = time.perf_counter()
    line = _one_error_line(_cli("analyze", str(p)))
    assert time.perf_counter() - t0 < 20  # the interpreter's start-up; reading 1 TB would take hours
    assert "too big to load here: 1099.51 GB of JSON" in line and "over the limit of" in line


# ---------------------------------------------------------------------------------------------- names from argv
NOT_UTF8 = b"\xff".decode("utf-8", "surrogateescape")  # how Python hands over argv bytes that are not UTF-8


def _cli_strict(*args: str) -> subprocess.CompletedProcess:
    """The CLI under a UTF-8 desktop locale (stdout strict; this machine's C.UTF-8 would be lenient)."""
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict"}
    return subprocess.run([sys.executable, "-m", "gaptrace.cli", *args], capture_output=True, cwd=ROOT, env=env)


def test_window_name_with_a_lone_surrogate_is_printable(tmp_path):
    """A host-only trace echoes the window name unresolved: a name from non-UTF-8 argv made --json crash."""
    doc = _doc(SMALL)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset")]
    path = _write(tmp_path, doc)
    res = run_analysis(load_trace(path), window="w" + NOT_UTF8, round_name=NOT_UTF8)
    assert res["window"] == "w\ufffd" and res["devices"] == []
    r = _cli_strict("analyze", path, "--json", "--window", "w" + NOT_UTF8)  # no GPU activity: one line, exit 2
    assert r.returncode == 2 and "Traceback" not in r.stderr.decode() and not r.stdout
    assert len(r.stderr.decode("utf-8").strip().splitlines()) == 1
    # with GPU activity the unknown window is named back in one printable line
    r = _cli_strict("analyze", SMALL, "--json", "--window", "w" + NOT_UTF8)
    err = r.stderr.decode("utf-8")
    assert r.returncode == 2 and "Traceback" not in err and "w\ufffd" in err and len(err.strip().splitlines()) == 1


def test_trace_and_report_paths_that_are_not_utf8(tmp_path):
    """A trace or report path with a non-UTF-8 byte: the JSON, the report page and "wrote ..." crashed."""
    src = tmp_path / ("t" + NOT_UTF8 + ".json.gz")
    src.write_bytes(open(SMALL, "rb").read())
    out = tmp_path / ("r" + NOT_UTF8 + ".html")
    a = _cli_strict("analyze", str(src), "--json")
    assert a.returncode == 0, a.stderr.decode()
    assert json.loads(a.stdout.decode("utf-8"))["trace"] == str(src).replace(NOT_UTF8, "\ufffd")
    r = _cli_strict("report", str(src), "-o", str(out))
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode("utf-8").startswith("wrote " + str(out).replace(NOT_UTF8, "\ufffd"))
    assert f"t\ufffd.json.gz" in out.read_text(encoding="utf-8")
    d = _cli_strict("diff", str(src), str(src))
    assert d.returncode == 0 and "Traceback" not in d.stderr.decode(), d.stderr.decode()


# ---------------------------------------------------------------------------------------------- found by the 10k run
def test_launch_fit_without_r2_renders(tmp_path):
    """Every graph launch taking the same time: R² is undefined (None) and the text output crashed on it."""
    from gaptrace.analyze import render_text

    doc = _doc(PROBE)
    launches = [e for e in doc["traceEvents"] if e.get("name") == "cudaGraphLaunch"]
    for e in launches:
        e["dur"] = 250.0
    res = run_analysis(load_trace(_write(tmp_path, doc)))
    fit = res["launch_fit"]
    assert fit["r2"] is None and fit["kappa_us_per_node"] == 0.0 and fit["t0_us"] == 250.0
    assert (f"κ = 0.000 µs/node (95% interval 0.000–0.000), t0 = 250.0 µs, R² = n/a over {fit['launches']} launches"
            in render_text(res))


def test_stack_tree_keeps_the_path_of_a_child_outside_its_parent():
    """With broken clocks a Python frame can hold idle its parent (by Python parent id) does not; the icicle's tree
    dropped the parent and indexed with -1."""
    import dataclasses

    t = load_trace(PROBE)
    ev = event_idle(t)
    tree = ev.tree
    kept = np.flatnonzero((ev.inclusive_us > 0) & (tree.depth >= 2))
    child = kept[np.argmax(ev.inclusive_us[kept])]
    parent = tree.parent[child]
    doctored = dataclasses.replace(ev, inclusive_us=ev.inclusive_us.copy())
    doctored.inclusive_us[parent] = 0.0  # as if the parent saw no idle
    before, after = idle_stack_tree(ev).nodes, idle_stack_tree(doctored).nodes
    roots = lambda n: sorted(n.loc[n["parent"] < 0, "subtree_idle_us"].round(6))  # noqa: E731
    assert roots(after) == roots(before)
    assert len(after) == len(before)
    assert tree.frames[tree.frame[parent]] in set(after["label"])


def test_figures_with_non_finite_numbers_render_as_gaps():
    """Found by the final 10k fuzz run: times near 1e308 overflow to inf in the strip's bins, and the report's
    JSON (allow_nan=False) raised. Non-finite numbers now become null, which plotly draws as a gap."""
    import json as _json

    import numpy as _np

    from gaptrace.report.html import figures_script

    js = figures_script({"f": {"data": [{"x": [1.0, float("inf")], "y": _np.array([float("nan"), 2.0])}]}})
    blob = js.split("\n", 1)[0][len("var FIGURES = "):-1]
    assert _json.loads(blob) == {"f": {"data": [{"x": [1.0, None], "y": [None, 2.0]}]}}


def test_a_path_with_a_byte_that_is_no_utf8_never_reaches_an_output(tmp_path):
    """A trace whose file name holds the byte 0xff (a lone surrogate in Python's str) and has no round to replay: the
    replay's one-line reason quotes the path in a warning, and a calibration whose path and measured_on hold one too;
    `analyze --json` and its text still encode as UTF-8 (the surrogate replaced by U+FFFD)."""
    import shutil

    from gaptrace.analyze import render_text, to_jsonable

    name = "case\udcff"
    d = tmp_path / "odd"
    d.mkdir()
    t = os.path.join(str(d), name + ".json.gz")
    shutil.copy(SMALL, t)
    cal_path = os.path.join(str(d), "cal\udcff.json")
    with open(os.path.join(ROOT, "analyses", "data", "calibration_default.json")) as f:
        cal = json.load(f)
    with open(cal_path, "w") as f:
        json.dump(dict(cal, measured_on="host \udcff"), f)
    res = run_analysis(load_trace(t, workers=0), round_name="no such round", calibration=cal_path)
    text = json.dumps(to_jsonable(res), ensure_ascii=False, allow_nan=False)
    text.encode("utf-8")
    render_text(res).encode("utf-8")
    assert "\ufffd" in text
