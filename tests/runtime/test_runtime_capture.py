"""`gaptrace capture` of the runtime on the CPU: steady rounds only, sidecar consistent with the trace."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from gaptrace.capture import read_sidecar  # noqa: E402
from gaptrace.loader import load_trace_reference  # noqa: E402


def _capture(tmp_path, *extra):
    out = tmp_path / "cap.json.gz"
    r = subprocess.run([sys.executable, "-m", "gaptrace.cli", "capture", "--preset", "tiny", "--prompt",
                        "def fib(n):", "--prompt", "import os\n", "--batch-size", "3", "--block-size", "4",
                        "--warmup-rounds", "3", "--rounds", "4", "-o", str(out), *extra],
                       capture_output=True, text=True)
    return r, out


@pytest.mark.parametrize("scheduler", ["sync", "overlap"])
def test_capture_on_cpu(tmp_path, scheduler):
    r, out = _capture(tmp_path, "--scheduler", scheduler)
    assert r.returncode == 0, r.stderr
    assert "no device activity" in r.stderr
    side = read_sidecar(str(out))
    assert side["config"]["scheduler"] == scheduler and side["config"]["batch_size"] == 3
    assert [x["round"] for x in side["rounds"]] == [4, 5, 6, 7]
    for x in side["rounds"]:
        assert len(x["accepted"]) == 3 and x["tau"] == pytest.approx(sum(x["accepted"]) / 3)
        assert all(1 <= a <= 4 for a in x["accepted"])
    assert len(side["unprofiled_round_ms"]) >= 1 and side["graphs"] == []  # no CUDA graphs on the CPU
    # the NVTX ranges timed without the profiler over the warm-up rounds after the first (3 warm-up rounds: 2, 3)
    assert side["unprofiled_range_rounds"] == 2
    ranges = {r["name"]: r for r in side["unprofiled_ranges"]}
    assert {"round", "plan", "draft", "verify", "commit"} <= set(ranges)
    assert ranges["round"]["per_round"] == 1.0 and ranges["plan"]["per_round"] == 1.0
    assert all(r["mean_us"] > 0 for r in ranges.values())
    # a range inside another takes no longer than it (inclusive host times of one clock)
    assert ranges["plan"]["mean_us"] < ranges["round"]["mean_us"]
    assert 1e3 * sum(side["unprofiled_round_ms"][-2:]) > ranges["round"]["mean_us"]
    trace = load_trace_reference(str(out))
    names = trace.host.loc[trace.host["cat"] == "user_annotation", "name"].astype(str)
    assert (names == "round").sum() == 4  # exactly the profiled rounds
    assert {"plan", "draft", "verify", "accept", "commit"} <= set(names)
    if scheduler == "sync":  # the lengths copy + .max().item() + masked_select, every round
        ops = set(trace.host.loc[trace.host["cat"] == "cpu_op", "name"].astype(str))
        assert {"aten::item", "aten::masked_select"} <= ops
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp-")]


def test_capture_bad_output(tmp_path):
    r = subprocess.run([sys.executable, "-m", "gaptrace.cli", "capture", "--prompt", "x", "-o",
                        str(tmp_path / "no" / "dir.json.gz")], capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_short_warmup_sidecar_has_nothing_to_skip(tmp_path):
    """One warm-up round times no round period: the sidecar says null (not an empty list its own analyser would flag),
    so analysing the capture gives the one error line of a trace without GPU activity and no sidecar warning."""
    from gaptrace.capture import sidecar_field_problems

    out = tmp_path / "cap.json.gz"
    r = subprocess.run([sys.executable, "-m", "gaptrace.cli", "capture", "--preset", "tiny", "--prompt", "hi",
                        "--warmup-rounds", "1", "--rounds", "3", "--max-new-tokens", "64", "-o", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    side = read_sidecar(str(out))
    assert side["unprofiled_round_ms"] is None and sidecar_field_problems(side) == []
    a = subprocess.run([sys.executable, "-m", "gaptrace.cli", "analyze", str(out)], capture_output=True, text=True)
    lines = a.stderr.strip().splitlines()
    assert a.returncode == 2 and len(lines) == 1 and "no GPU activity" in lines[0], a.stderr


def test_a_profiled_round_with_no_live_request_is_refused(tmp_path):
    """Too few new tokens for the capture: every request finishes inside the profiled rounds, so the last one runs
    with no live request. One error line, exit 2, and nothing written: an earlier capture at the same path keeps
    its trace and sidecar, byte for byte (the trace is put in place only with its sidecar, at the end)."""
    out = tmp_path / "cap.json.gz"

    def capture(new_tokens: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "gaptrace.cli", "capture", "--preset", "tiny", "--prompts",
                               "fixtures/prompts/heldout.jsonl", "--batch-size", "2", "--warmup-rounds", "2",
                               "--rounds", "3", "--max-new-tokens", new_tokens, "-o", str(out)],
                              capture_output=True, text=True)

    r = capture("8")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and "no live request" in lines[-1] and "raise --max-new-tokens" in lines[-1], r.stderr
    assert not [line for line in lines if "Traceback" in line]
    assert os.listdir(tmp_path) == []
    assert capture("16").returncode == 0
    before = {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path)}
    assert sorted(before) == ["cap.gaptrace.json", "cap.json.gz"]
    assert capture("8").returncode == 2
    assert {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path)} == before
