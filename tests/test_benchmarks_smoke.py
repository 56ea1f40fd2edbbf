"""Smoke runs of the benchmark scripts on tiny inputs: they run and print their table (no timing asserted)."""
import subprocess
import sys

import pytest

SMALL = "fixtures/traces/tracelens_mi300x_sglang_qwen3_8b_decode.json.gz"


def run(*args, timeout=300):
    r = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_make_big_trace_and_bench_analysis(tmp_path):
    big = tmp_path / "big.json"
    run("benchmarks/make_big_trace.py", str(big), "--source", SMALL, "--size-gb", "0.005")
    assert big.stat().st_size >= 5e6
    out = run("benchmarks/bench_analysis.py", str(big), "--skip-hta", "--skip-stdlib", "--repeat", "2")
    assert "gaptrace" in out and "MB/s" in out and "| 2: " in out  # fastest of 2 runs, with the median


def test_bench_idle_analyses():
    out = run("benchmarks/bench_idle_analyses.py", "--source", SMALL, "--host-events", "5000")
    assert "gap_attribution" in out or "event_idle" in out


def test_bench_report(tmp_path):
    pytest.importorskip("plotly")
    out = run("benchmarks/bench_report.py", "--size-mb", "2", "--source", SMALL, "--work", str(tmp_path),
              "--reps", "1")
    assert "MB" in out


def test_bench_token_list_rebuild(tmp_path):
    """Both prefills ran and the fault's rebuild was timed: one rebuild per chunk, so its host time is positive."""
    pytest.importorskip("torch")
    import json

    out = run("benchmarks/bench_token_list_rebuild.py", "--device", "cpu", "--tokens", "150", "--chunk", "64",
              "--repeats", "2", "--out", str(tmp_path))
    assert "| 150 | 3 |" in out
    row = json.loads((tmp_path / "token_list_rebuild.json").read_text())["rows"][0]
    assert row["clean_wall_s"] > 0 and row["fault_wall_s"] > 0 and row["fault_in_rebuild_s"] > 0
