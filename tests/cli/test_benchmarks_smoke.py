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


def test_bench_graph_span_launch_spans_add_up_to_the_node_bubbles():
    """bench_graph_span's per-launch bubbles (span − union of its nodes) over the shipped fused capture sum to the
    between-node idle gaptrace reports over the same (whole-trace) window, gap for gap; one launch per graph a round."""
    import os

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks", "probes"))
    import gaptrace
    from bench_graph_span import launch_spans
    from gaptrace.analyze import run_analysis

    path = "fixtures/traces/h200_fused/h200_bench_overlap_bs8_B12_fused.json.gz"
    spans = launch_spans(path)
    assert {k: len(v) for k, v in spans.items()} == {"plan": 6, "draft": 6, "verify": 6, "commit": 6}  # 6 rounds
    split = run_analysis(gaptrace.load_trace(path))["idle_split"]
    assert sum(x[2] for v in spans.values() for x in v) == split["graph_node_gaps"]
    assert sum(x[0] - x[1] for v in spans.values() for x in v) == pytest.approx(split["graph_node_us"], abs=1e-6)


def test_bench_graph_span_cpu_smoke():
    """On the CPU there are no graphs: the script runs the decode and its capture and prints an empty table."""
    pytest.importorskip("torch")
    out = run("benchmarks/probes/bench_graph_span.py", "--preset", "tiny", "--device", "cpu", "--batch-size", "2",
              "-B", "4",
              "--warmup-rounds", "1", "--timed-rounds", "2", "--profiled-rounds", "1")
    assert "bubble per gap" in out


def test_bench_pdl_chain_smoke(tmp_path):
    """The chain runs in Triton's interpreter on the CPU (plain and gemm variants; the PDL ones need CUDA and say so),
    and the trace arithmetic: union and gaps of overlapping, touching and separate intervals."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    import json
    import os

    out = run("benchmarks/probes/bench_pdl_chain.py", "--device", "cpu", "--nodes", "3", "--replays", "1", "--elements",
              "2048", "--gemm-k", "256", "--out", str(tmp_path))
    assert "| pdl | needs CUDA" in out
    res = json.loads((tmp_path / "pdl_chain.json").read_text())["results"]
    assert set(res) == {"plain", "gemm+plain"} and res["plain"]["nodes"] == 3 and res["gemm+plain"]["nodes"] == 6
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks", "probes"))
    from bench_pdl_chain import span_busy_gaps

    r = span_busy_gaps([0, 2, 3, 10, 10.5], [4, 3, 6, 11, 12])  # [0,6) overlapped, a 4 µs gap, [10,12) overlapped
    assert r["span_us"] == 12 and r["gap_sum_us"] == 4 and abs(r["busy_share"] - 8 / 12) < 1e-12
    assert r["gap_median_us"] == 0 and r["kernels"] == 5


def test_bench_node_gap_smoke(tmp_path):
    """Every chain kind runs in Triton's interpreter on the CPU (4 nodes each, both graph kinds), and the gap-by-
    direction arithmetic."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    import json
    import math
    import os

    out = run("benchmarks/probes/bench_node_gap.py", "--device", "cpu", "--nodes", "4", "--replays", "1", "--out",
              str(tmp_path))
    assert "| add_rms_norm-96 | keep_graph | 4 |" in out
    res = json.loads((tmp_path / "node_gap.json").read_text())["results"]
    assert len(res) == 14 and all(r["nodes"] == 4 for r in res.values())
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks", "probes"))
    from bench_node_gap import direction_gaps

    d = direction_gaps(["nvjet", "_norm", "nvjet", "_norm"], [0, 2, 5, 9], [1.5, 4, 8.5, 10])
    assert d == {"GEMM -> Triton": 0.5, "Triton -> GEMM": 1.0}  # gaps 0.5 and 0.5 after nvjet, 1.0 after _norm
    assert math.isnan(direction_gaps(["_a", "_b"], [0, 1], [0.5, 2])["GEMM -> Triton"])


def test_bench_graph_alone_smoke(tmp_path):
    """The script builds the engine and decodes on the CPU (eager: no graphs, one row saying so)."""
    pytest.importorskip("torch")
    out = run("benchmarks/probes/bench_graph_alone.py", "--device", "cpu", "--preset", "tiny", "--batch-size", "2",
              "--block", "4", "--rounds", "2", "--out", str(tmp_path))
    assert "(no CUDA graphs on this device)" in out and (tmp_path / "graph_alone.json").exists()


def test_bench_bubble_trigger_smoke(tmp_path):
    """Every stage runs on the CPU (the CUDA-only ones are skipped), in the order given; an unknown stage is refused."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    import json

    stages = "none,eager,fresh,fresh-upload,gemm,none,none"
    out = run("benchmarks/probes/bench_bubble_trigger.py", "--device", "cpu", "--nodes", "3", "--batches", "1",
              "--replays", "1", "--stages", stages, "--out", str(tmp_path))
    res = json.loads((tmp_path / "bubble_trigger.json").read_text())["results"]
    assert ",".join(r["stage"] for r in res) == stages and "| 7 | none |" in out
    r = subprocess.run([sys.executable, "benchmarks/probes/bench_bubble_trigger.py", "--device", "cpu", "--stages",
                        "nap"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "unknown stage 'nap'" in r.stderr


def test_profiler_cost_depth_cpu_smoke(tmp_path):
    """The per-event profiler cost probe on the CPU: one row per op kind and depth, the event counts read from its own
    trace, and the extra µs per event = (profiled − plain) / events of that row."""
    pytest.importorskip("torch")
    import json

    out = run("-m", "benchmarks.probes.profiler_cost_depth", "--device", "cpu", "--ops", "50", "--repeats", "1",
              "--depths", "1,8", "--out", str(tmp_path))
    assert "extra µs per event" in out
    rows = json.loads((tmp_path / "profiler_cost_depth.json").read_text())
    assert [(r["kind"], r["depth"]) for r in rows] == [(k, d) for k in ("inplace_add", "eager_mul", "strided_copy")
                                                         for d in (1, 8)]
    for r in rows:
        assert r["events"]["cpu_op"] >= r["ops"]  # at least one recorded ATen op per op
        extra = (r["profiled_us_per_op"] - r["plain_us_per_op"]) * r["ops"]
        assert r["extra_us_per_event"] * sum(r["events"].values()) == pytest.approx(extra, rel=1e-9, abs=1e-9)


def test_bench_tp_cpu_smoke(tmp_path):
    """TP 1 and TP 2 (two gloo rank processes) side by side: both rows, the same τ and timed rounds (the ranks emit
    the one-process tokens), every rank's Tround, tokens/s = bs·τ / Tround."""
    pytest.importorskip("torch")
    import json

    out = run("benchmarks/bench_tp.py", "--device", "cpu", "--preset", "tiny", "--tp", "1,2", "--batch-sizes", "2",
              "--blocks", "4", "--warmup-rounds", "2", "--timed-rounds", "3", "--out", str(tmp_path), "--name", "tp",
              timeout=600)
    assert "gloo on the host CPU: not a GPU figure" in out
    cells = {c["tp"]: c for c in json.loads((tmp_path / "tp.json").read_text())["cells"]}
    assert set(cells) == {1, 2}
    assert cells[1]["tau"] == cells[2]["tau"] and cells[1]["timed_rounds"] == cells[2]["timed_rounds"] == 3
    assert len(cells[2]["ranks_tround_ms"]) == 2 and len(cells[1]["ranks_tround_ms"]) == 1
    for c in cells.values():
        assert c["tokens_per_s"] == pytest.approx(2 * c["tau"] / c["tround_ms"] * 1e3)


def test_graph_launch_cost_probe_without_cuda(tmp_path):
    """The graph-launch cost probe on a machine without CUDA: one line saying so, exit 0, nothing written; a bad
    ``--nodes`` is exit 2 with one line naming the option."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine runs the probe itself")
    out = run("-m", "benchmarks.probes.graph_launch_cost", "--out", str(tmp_path / "o"))
    assert out.strip() == "no CUDA device: nothing to measure" and not (tmp_path / "o").exists()
    r = subprocess.run([sys.executable, "-m", "benchmarks.probes.graph_launch_cost", "--nodes", "ten", "--out",
                        str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--nodes must be integers" in r.stderr


def test_bench_replay_cost_row(tmp_path):
    """The replay-cost benchmark on a 5 MB replication: one row whose replay seconds are part of the analysis
    seconds and whose share is replay / (load + analysis) as printed."""
    out = run("benchmarks/bench_replay_cost.py", "--sizes-gb", "0.005", "--repeat", "1", "--scratch", str(tmp_path))
    row = [ln for ln in out.splitlines() if ln.startswith("| 0.005 |")]
    assert len(row) == 1, out
    cells = [c.strip() for c in row[0].strip("|").split("|")]
    load_s, analysis_s, replay_s = float(cells[2]), float(cells[3]), float(cells[4])
    assert 0 < replay_s <= analysis_s
    # the cells are rounded to 0.01 s: the share recomputed from them agrees to about a percent on sub-second rows
    assert float(cells[5].rstrip("%")) == pytest.approx(100 * replay_s / (load_s + analysis_s), abs=2.0)
    assert not list(tmp_path.iterdir())  # the replicated trace is deleted after its row


def test_graph_forward_device_cpu_smoke(tmp_path):
    """On the CPU the probe times the eager forward's host only (no graphs, no device figures) and writes its
    table and JSON; an unknown loop is one line, exit 2."""
    pytest.importorskip("torch")
    import json
    out = run("benchmarks/probes/graph_forward_device.py", "--device", "cpu", "--loops", "per_request_readback",
              "--calls", "2", "--out", str(tmp_path))
    assert "eager queued device µs" in out
    data = json.loads((tmp_path / "graph_forward_device.json").read_text())
    (row,) = data["loops"]
    assert row["loop"] == "per_request_readback" and row["eager_host_us"] > 0
    assert "graphed_host_us" not in row and "eager_queued_device_us" not in row
    r = subprocess.run([sys.executable, "benchmarks/probes/graph_forward_device.py", "--device", "cpu", "--loops",
                        "nope"], capture_output=True, text=True)
    assert r.returncode == 2 and "unknown loop 'nope'" in r.stderr
    plain = tmp_path / "plain"
    plain.write_text("x")
    r = subprocess.run([sys.executable, "benchmarks/probes/graph_forward_device.py", "--device", "cpu", "--out",
                        str(plain)], capture_output=True, text=True)
    assert r.returncode == 2 and "not a directory" in r.stderr and plain.read_text() == "x"


def test_bench_calibration_cpu_smoke(tmp_path):
    """Two loop variants on CPU: the table's predicted Δ is Σ events a step × the calibration's cost of their
    category, recomputed here from the raw rows it writes."""
    import json

    from gaptrace.analyses.profiler_cost import load_calibration

    cal = "analyses/data/calibration_cpu_epyc.json"
    out = run("benchmarks/bench_calibration.py", "--device", "cpu", "--calibration", cal, "--loops",
              "per_request_readback", "--steps", "3", "--blocks", "1", "--out", str(tmp_path / "c"))
    assert "| per_request_readback | planted |" in out and "| per_request_readback | fixed |" in out
    rows = json.loads((tmp_path / "c.json").read_text())["rows"]
    c = load_calibration(cal)
    for r in rows:
        e = r["events_per_step"]
        want = (c.aten_op_us * (e.get("cpu_op", 0) + e.get("user_annotation", 0))
                + c.python_frame_us * e.get("python_function", 0))
        assert e.get("user_annotation") == 2.0  # the step range and the planted site's range, once a step
        assert f"| {r['loop']} | {r['variant']} | {r['plain_us']:.1f} | {r['delta_us']:.1f} | {want:.1f} |" in out


@pytest.mark.parametrize("probe", [
    ["benchmarks/probes/bench_bubble_trigger.py", "--device", "cpu"],
    ["benchmarks/probes/bench_graph_alone.py", "--device", "cpu"],
    ["benchmarks/probes/bench_graph_span.py", "--device", "cpu"],
    ["benchmarks/probes/bench_node_gap.py", "--device", "cpu"],
    ["benchmarks/probes/bench_pdl_chain.py", "--device", "cpu"],
    ["-m", "benchmarks.probes.graph_launch_cost"],
    ["-m", "benchmarks.probes.profiler_cost_depth", "--device", "cpu"],
])
def test_probes_refuse_a_plain_file_as_their_results_directory(tmp_path, probe):
    """--out names a directory: an existing plain file there is refused before the probe measures anything (exit 2,
    the file untouched), not with a traceback after the run."""
    f = tmp_path / "results"
    f.write_text("keep")
    r = subprocess.run([sys.executable, *probe, "--out", str(f)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "exists and is not a directory" in r.stderr and "Traceback" not in r.stderr
    assert f.read_text() == "keep"
    # nor a path under a plain file, and the script runs by path as well as with -m
    by_path = [x for x in probe if x != "-m"]
    if by_path[0].startswith("benchmarks.probes."):
        by_path[0] = by_path[0].replace(".", "/") + ".py"
    r = subprocess.run([sys.executable, *by_path, "--out", str(f / "sub")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "is not a directory" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_bench_calibration_checks_its_arguments_before_measuring(tmp_path):
    """Every bad argument is one line and exit 2 before any loop runs: an unknown loop, a step count below 1, an
    --out that cannot be written (a missing directory, a FIFO at PATH.md, an empty prefix), a calibration that
    cannot be read; the FIFO is left as it was."""
    import os

    fifo = tmp_path / "p.md"
    os.mkfifo(fifo)
    base = ["benchmarks/bench_calibration.py", "--device", "cpu", "--loops", "per_request_readback"]
    for extra, said in [(["--loops", "nosuchloop"], "unknown loop nosuchloop"),
                        (["--steps", "0"], "--steps and --blocks must be >= 1"),
                        (["--out", str(tmp_path / "no" / "x")], "does not exist"),
                        (["--out", str(tmp_path / "p")], "not a regular file"),
                        (["--out", ""], "give a path prefix"),
                        (["--calibration", str(tmp_path / "none.json")], "cannot read the calibration"),
                        (["--loops", ""], "no loop named"), (["--loops", ","], "no loop named")]:
        r = subprocess.run([sys.executable, *base, *extra], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, (extra, r.stderr)
        assert "|" not in r.stdout  # nothing measured
    assert os.path.exists(fifo) and not os.path.isfile(fifo)


def test_profiler_cost_depth_checks_its_arguments_before_measuring(tmp_path):
    """Bad depths, a device this machine lacks or does not know, an --out that cannot be a directory (a dangling
    symlink): one argparse error line, exit 2, no traceback, nothing measured."""
    import os

    os.symlink(tmp_path / "nowhere" / "x", tmp_path / "dangling")
    base = [sys.executable, "benchmarks/probes/profiler_cost_depth.py", "--ops", "5", "--repeats", "1"]
    cases = [(["--device", "cpu", "--depths", "a", "--out", str(tmp_path / "o")], "must be integers"),
             (["--device", "cpu", "--depths", "5000", "--out", str(tmp_path / "o")], "--depths from 0 to"),
             (["--device", "xyz", "--out", str(tmp_path / "o")], "invalid choice"),
             (["--device", "cpu", "--out", str(tmp_path / "dangling")], "a symlink to nothing"),
             (["--device", "cpu", "--out", ""], "an empty path")]
    import torch

    if not torch.cuda.is_available():
        cases.append((["--device", "cuda", "--out", str(tmp_path / "o")], "no CUDA device"))
    for extra, said in cases:
        r = subprocess.run([*base, *extra], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, (extra, r.stderr)
        assert not os.path.exists(tmp_path / "o" / "profiler_cost_depth.json")


def test_bench_range_costs_reads_what_the_sidecar_and_trace_hold():
    """bench_range_costs on the sync capture: the `accept` range's measured µs is its sidecar's mean, its profiled
    µs the mean length of its 8 user_annotation events, and the events inside it are counted per occurrence; the
    script prints the fit table for the H200."""
    import gzip
    import json
    import os

    sys.path.insert(0, "benchmarks")
    from bench_range_costs import range_rows

    path = "fixtures/traces/h200_pairs_repeat/bench_sync_bs8_B12.json.gz"
    rows = {r["name"]: r for r in range_rows(path)}
    with open(path.replace(".json.gz", ".gaptrace.json")) as f:
        side = {r["name"]: r for r in json.load(f)["unprofiled_ranges"]}
    acc = [e for e in json.load(gzip.open(path))["traceEvents"]
           if e.get("cat") == "user_annotation" and e.get("name") == "accept"]
    r = rows["accept"]
    assert r["n"] == len(acc) == 8 and r["measured_us"] == side["accept"]["mean_us"]
    assert abs(r["profiled_us"] - sum(float(e["dur"]) for e in acc) / 8) < 0.01
    assert r["events"]["cuda_runtime"] == 3.0 and r["held"] == []
    assert "blocking call" in rows["plan"]["held"] and "graph launch" in rows["verify"]["held"]
    out = run("benchmarks/bench_range_costs.py", path)
    assert "| NVIDIA H200 | " in out and os.path.basename(path) in out
