"""`gaptrace analyze`: the JSON schema on real traces, figures that match the analyses, and bad input."""
import gzip
import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from gaptrace.cli import main

PROBE = "fixtures/traces/h200_graph_launch_probe.json.gz"


def run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def probe_json():
    r = run("analyze", PROBE, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_schema(probe_json):
    d = probe_json
    for key in ("devices", "gap_attribution", "blocking_syncs", "launch_fit", "findings", "warnings", "headline"):
        assert key in d
    dev = d["devices"][0]
    for key in ("device", "window_us", "busy_us", "idle_us", "occupancy", "gaps"):
        assert key in dev
    assert dev["busy_us"] + dev["idle_us"] == pytest.approx(dev["window_us"], rel=1e-12)
    assert 0 <= dev["occupancy"] <= 1
    for row in d["gap_attribution"]:
        assert set(row) >= {"frame", "self_idle_us", "inclusive_idle_us", "share", "gaps"}
        assert row["self_idle_us"] <= row["inclusive_idle_us"] + 1e-6
    incl = [r["inclusive_idle_us"] for r in d["gap_attribution"]]
    assert incl == sorted(incl, reverse=True)
    for row in d["blocking_syncs"]:
        assert set(row) >= {"call", "site", "stack", "count", "blocked_us", "idle_after_us", "idle_share",
                            "device_busy_during"}
    blocked = [r["blocked_us"] for r in d["blocking_syncs"]]
    assert blocked == sorted(blocked, reverse=True)
    fit = d["launch_fit"]
    assert set(fit) >= {"launches", "kappa_us_per_node", "t0_us", "r2", "graphs"}
    for f in d["findings"]:
        assert set(f) >= {"kind", "summary", "idle_share"}
    # the probe's rounds (round_<n>) give the replay model its steps: findings with a saving come first, by what
    # fixing them saves; the rest keep the idle-share order
    saved = [f for f in d["findings"] if f.get("saving_us") is not None]
    assert saved and d["findings"][:len(saved)] == saved
    shares = [f["idle_share"] for f in d["findings"][len(saved):]]
    assert shares == sorted(shares, reverse=True) or all(abs(a - b) < 1e-3 for a, b in zip(shares, shares[1:]))


def test_probe_figures_by_hand(probe_json):
    """Occupancy and launch count recomputed from the raw JSON with plain Python."""
    doc = json.load(gzip.open(PROBE))
    ivs = sorted((e["ts"], e["ts"] + e["dur"]) for e in doc["traceEvents"]
                 if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    busy, cur_s, cur_e = 0.0, None, None
    for s, e in ivs:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    window = max(e for _, e in ivs) - ivs[0][0]
    dev = probe_json["devices"][0]
    assert dev["window_us"] == pytest.approx(window, abs=1e-3)
    assert dev["busy_us"] == pytest.approx(busy, abs=1e-3)
    assert dev["occupancy"] == pytest.approx(busy / window, abs=1e-9)
    assert probe_json["launch_fit"]["launches"] == 42
    assert 1.3 <= probe_json["launch_fit"]["kappa_us_per_node"] <= 2.1
    # the .cpu() of the probe (aten::to -> cudaMemcpyAsync to pageable memory) blocks longest
    top = probe_json["blocking_syncs"][0]
    assert top["call"] == "cudaMemcpyAsync" and top["aten_op"] == "aten::to"
    assert top["count"] == 6 and top["blocked_us"] / 6 > 3000
    # the first screen: the verdict over the steps used (the probe's round_<n> ranges, the outlier first step left
    # out of it), then the cause that buys most and its fix, then the occupancy sentence
    head = probe_json["headline"]
    assert head[0].startswith("verdict over 6 steps of 'round'") and "1 outlier step left out" in head[0]
    assert head[0].split(": ", 1)[1].startswith("5 of 5 steps sync-bound")
    assert head[1].startswith("removing ") and head[2].startswith("fix: ")
    occ_line = next(x for x in head if x.startswith("NVIDIA H200 (GPU 0) busy "))
    assert f"{dev['occupancy']:.1%}" in occ_line and head.index(occ_line) > 2


def test_text_output_has_headline_and_tables():
    r = run("analyze", PROBE)
    assert r.exit_code == 0
    assert r.output.startswith("verdict over 6 steps of 'round'")  # the verdict first, the occupancy after it
    assert "\nNVIDIA H200 (GPU 0) busy " in r.output.split("\n\n")[0]
    for section in ("Findings", "Steps (6 of 'round'", "Idle by host frame, by self idle", "Blocking syncs",
                    "Graph-launch fit"):
        assert section in r.output


def test_window_by_annotation_name():
    r = run("analyze", PROBE, "--window", "round_2", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    full = json.loads(run("analyze", PROBE, "--json").output)
    assert d["devices"][0]["window_us"] < full["devices"][0]["window_us"]


def _cli(*args):
    """Run the real console script, so exit codes and stderr are the user's."""
    return subprocess.run([sys.executable, "-m", "gaptrace.cli", *args], capture_output=True, text=True)


@pytest.mark.parametrize("content,what", [
    (b"not json at all", "not valid JSON"),
    (b'{"traceEvents": []}', "no complete"),
    (b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2', "JSON"),
    (b'{"foo": 1}', "traceEvents"),
])
def test_bad_input_one_line_exit_2(tmp_path, content, what):
    p = tmp_path / "bad.json"
    p.write_bytes(content)
    r = _cli("analyze", str(p))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(p) in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_truncated_gzip(tmp_path):
    data = open(PROBE, "rb").read()
    p = tmp_path / "cut.json.gz"
    p.write_bytes(data[: len(data) // 2])
    r = _cli("analyze", str(p))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_unknown_window_names_available(tmp_path):
    r = _cli("analyze", PROBE, "--window", "nope")
    assert r.returncode == 2 and "round_0" in r.stderr


def test_host_only_trace_is_one_error_line_exit_2(tmp_path):
    """No GPU events: one line naming the problem, exit 2, nothing on stdout (text and --json); the API still runs
    the host-side analyses."""
    doc = json.load(gzip.open(PROBE))
    doc["traceEvents"] = [e for e in doc["traceEvents"]
                          if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")]
    p = tmp_path / "host_only.json"
    p.write_text(json.dumps(doc))
    lines = set()
    for args in (("analyze", str(p)), ("analyze", str(p), "--json"), ("diff", PROBE, str(p)),
                 ("diff", str(p), PROBE, "--json"), ("whatif", str(p), "--remove", "round"),
                 ("report", str(p), "-o", str(tmp_path / "r.html"))):
        r = _cli(*args)
        assert r.returncode == 2 and r.stdout == ""
        assert "no GPU activity" in r.stderr and len(r.stderr.strip().splitlines()) == 1
        lines.add(r.stderr)
    assert len(lines) == 1 and not os.path.exists(tmp_path / "r.html")  # one wording for every command
    from gaptrace import load_trace
    from gaptrace.analyze import run_analysis
    out = run_analysis(load_trace(str(p)))
    assert out["devices"] == [] and any("no GPU" in w for w in out["warnings"])


@pytest.mark.parametrize("sidecar", [
    {"graphs": [{"nodes": "many", "unprofiled_launch_us": None}, 7, {"nodes": 25, "unprofiled_launch_us": 5.4}],
     "rounds": "x", "unprofiled_round_ms": ["a", None]},
    {"graphs": {"nodes": 1}, "rounds": [None, {"tau": "3"}], "unprofiled_round_ms": float("nan")},
])
def test_malformed_sidecar_is_tolerated(tmp_path, sidecar):
    import shutil

    p = tmp_path / "t.json.gz"
    shutil.copy(PROBE, p)
    (tmp_path / "t.gaptrace.json").write_text(json.dumps(sidecar))
    r = _cli("analyze", str(p), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["launch_fit"]["launches"] == 42


def test_far_outlier_timestamps_are_dropped_with_a_warning(tmp_path):
    doc = json.load(gzip.open(PROBE))
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    kernels[5]["ts"] = -100.0
    kernels[9]["dur"] = 1e300
    p = tmp_path / "outlier.json"
    p.write_text(json.dumps(doc))
    out = json.loads(_cli("analyze", str(p), "--json").stdout)
    ref = json.loads(_cli("analyze", PROBE, "--json").stdout)
    assert any("2 events lie more than" in w for w in out["warnings"])
    # the window is the real one, not stretched to the corrupt times
    assert out["devices"][0]["window_us"] == pytest.approx(ref["devices"][0]["window_us"], rel=1e-6)


@pytest.mark.parametrize("where", ["args", "metadata"])
def test_json_nested_too_deep_is_one_error_line(tmp_path, where):
    """5,000 nested arrays (inside an event's args, or a top-level metadata value): the decoders recurse past
    Python's limit; analyze, diff and report say so in one line with exit 2 (no RecursionError traceback),
    gzipped or not."""
    deep = "[" * 5000 + "]" * 5000
    ev = '{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2, "pid": 0, "tid": 7, "args": {"x": %s}}'
    text = ('{"traceEvents": [%s]}' % (ev % deep) if where == "args"
            else '{"meta": %s, "traceEvents": [%s]}' % (deep, ev % "0"))
    plain = tmp_path / "deep.json"
    plain.write_text(text)
    packed = tmp_path / "deep.json.gz"
    packed.write_bytes(gzip.compress(text.encode()))
    for args in (("analyze", str(plain)), ("analyze", str(packed), "--json"), ("diff", str(plain), PROBE),
                 ("report", str(packed), "-o", str(tmp_path / "r.html"))):
        r = _cli(*args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-500:]
        assert "nested too deeply" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r.html").exists()


def test_stdout_that_cannot_be_written_is_one_error_line():
    """stdout on a full device (/dev/full): one line naming it, exit 2, no traceback."""
    import os

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    for args in (("analyze", PROBE), ("analyze", PROBE, "--json"), ("diff", PROBE, PROBE)):
        with open("/dev/full", "w") as full:
            r = subprocess.run([sys.executable, "-m", "gaptrace.cli", *args], stdout=full, stderr=subprocess.PIPE,
                               text=True, timeout=300)
        assert r.returncode == 2 and r.stderr.strip() == "gaptrace: error: cannot write the output (No space left on device)"


def test_an_explicit_rounds_name_that_is_absent_is_an_error():
    """--rounds NAME given and absent: one line, exit 2 (the default name may be absent: most traces are not the
    runtime's, and their analysis carries no rounds section)."""
    r = _cli("analyze", PROBE, "--rounds", "nosuch")
    assert r.returncode == 2 and r.stdout == "" and "'nosuch'" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = _cli("diff", PROBE, PROBE, "--rounds", "nosuch", "--json")
    assert r.returncode == 2 and r.stdout == ""
    assert _cli("analyze", PROBE, "--rounds", "round").returncode == 0
    assert _cli("analyze", "fixtures/traces/tracelens_h100_owlv2.json.gz").returncode == 0


def test_gpu_events_all_dropped_names_the_drop_not_the_profiler(tmp_path):
    """Every kernel event has a NaN timestamp or a negative duration: analyze, diff and report say the loader
    dropped them (one line, exit 2), not that the trace was profiled without CUDA activity; an unknown --device
    lists the devices as numbers."""
    ev = [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": float("nan"), "dur": 2,
           "args": {"device": 0, "stream": 7, "correlation": 1}},
          {"ph": "X", "cat": "kernel", "name": "k2", "pid": 0, "tid": 7, "ts": 10, "dur": -5,
           "args": {"device": 0, "stream": 7, "correlation": 2}},
          {"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": 0, "dur": 30, "args": {}}]
    p = tmp_path / "nan.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    for args in (("analyze", str(p)), ("diff", str(p), str(p)), ("report", str(p), "-o", str(tmp_path / "r.html"))):
        r = _cli(*args)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1, r.stderr
        assert "no usable GPU activity" in lines[0] and "1 events with negative durations were dropped" in lines[0]
        assert "ProfilerActivity" not in lines[0]
    assert not (tmp_path / "r.html").exists()
    r = _cli("analyze", PROBE, "--device", "5")
    assert r.returncode == 2 and r.stderr.strip().endswith("no activity on device 5; devices with activity: 0")


def test_readme_tour_figures_are_what_analyze_prints():
    """The README's tour quotes `gaptrace analyze` on the shipped sync capture: every "saves ≈ X a round (Y%"
    figure and the verdict line it quotes are in today's output (a README that drifts from the tool is a defect)."""
    import os
    import re
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    block = readme.split("## A short tour", 1)[1].split("```", 2)[1]
    r = _cli("analyze", os.path.join(root, "fixtures", "traces", "h200_pairs", "bench_sync_bs8_B12.json.gz"))
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    quoted = re.findall(r"saves ≈ [\d,.]+ [µm]s a round \(\d+%", " ".join(block.split()))
    assert len(quoted) >= 3
    for q in quoted:
        assert q in out, q
    assert " ".join(block.split()).split(" removing")[0].strip() in out


def test_a_fit_with_negative_kappa_is_said_to_be_no_cost(tmp_path):
    """Graph kernels missing from a trace (every event whose duration starts with 4.0 dropped from the sync capture)
    leave launch times that fall with N: the fit's κ < 0 and R² < 0 are printed as fitted, each with a line saying
    what they are not, and no profiler_inflation finding comes from the fit."""
    src = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "traces", "h200_pairs",
                       "bench_sync_bs8_B12.json.gz")
    doc = json.load(gzip.open(src))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not str(e.get("dur", "")).startswith("4.0")]
    p = tmp_path / "k.json"
    p.write_text(json.dumps(doc))
    out = json.loads(_cli("analyze", str(p), "--json").stdout)
    assert out["launch_fit"]["kappa_us_per_node"] < 0 and out["launch_fit"]["r2"] < 0
    assert not any(f["kind"] == "profiler_inflation" for f in out["findings"])
    text = _cli("analyze", str(p)).stdout
    assert "  κ <= 0: the launch time does not grow with the graph's nodes here" in text
    assert "  R² < 0: the line describes the launch times worse than their mean does" in text


def test_empty_option_values_are_refused():
    """--rounds '' and --calibration '' name nothing: one error line, exit 2 (not the defaults without a word), in
    analyze, diff and report alike."""
    for args in (("analyze", PROBE, "--rounds", ""), ("analyze", PROBE, "--calibration", ""),
                 ("diff", PROBE, PROBE, "--calibration", ""), ("report", PROBE, "--rounds", "", "-o", "/dev/null")):
        r = _cli(*args)
        assert r.returncode == 2 and r.stdout == "", (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "an empty value names nothing" in r.stderr, r.stderr
