"""The GPU benchmark scripts on the CPU: smoke runs on tiny inputs (benchmarks/bench_runtime.py,
benchmarks/bench_vs_transformers.py, the H200 driver maintainer/gpu/bench_h200.sh in SMOKE mode), the figures the runtime
benchmark reads off a capture checked against a simple recomputation from a shipped H200 trace, and the checkpoint
writer's plain-attention output loaded by transformers as a standard Qwen3 / Llama model with the same logits."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHIPPED = os.path.join(REPO, "fixtures", "traces", "h200_pairs", "bench_overlap_bs8_B12_clean_a.json.gz")
RT_SMOKE = ["--preset", "tiny", "--device", "cpu", "--warmup-rounds", "2", "--timed-rounds", "3",
            "--profiled-rounds", "2"]


def run(*args, env=None, timeout=300):
    r = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO,
                       env={**os.environ, **(env or {})})
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def _plain_pair(root, qk_norm=True, shard=False):
    """A random plain-attention pair (target 2 layers, draft 1) written by the runtime's checkpoint writer."""
    from gaptrace.runtime.config import ModelConfig
    from gaptrace.runtime.models.checkpoint import save_checkpoint
    from gaptrace.runtime.models.model import Transformer

    dirs = []
    for name, layers, hid in (("target", 2, 64), ("draft", 1, 32)):
        cfg = ModelConfig(vocab_size=4096, hidden_size=hid, intermediate_size=2 * hid, num_hidden_layers=layers,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=32, eos_token_id=0, qk_norm=qk_norm)
        torch.manual_seed(layers)
        model = Transformer(cfg)
        with torch.no_grad():  # norms away from 1, so a misplaced norm weight shows
            for n, p in model.named_parameters():
                if p.dim() == 1:
                    p.uniform_(0.5, 1.5)
        d = os.path.join(root, name)
        save_checkpoint(model, cfg, d, max_shard_bytes=100_000 if shard else None)
        dirs.append(d)
    return dirs


def test_bench_runtime_smoke(tmp_path):
    out = tmp_path / "out"
    stdout = run("benchmarks/bench_runtime.py", *RT_SMOKE, "--batch-sizes", "2", "--blocks", "4",
                 "--capture-report-rounds", "2", "--capture-report-cell", "overlap,2,4", "--out", str(out))
    data = json.loads((out / "runtime.json").read_text())
    cells = data["cells"]
    assert set(cells) == {"spec/overlap/bs2/B4/auto", "spec/sync/bs2/B4/auto", "plain/overlap/bs2/B1/auto"}
    for c in cells.values():
        assert "error" not in c and c["timed_rounds"] == 3
        # tokens/s = bs·τ/Tround, TPOT = Tround/τ, the median lies between p10 and p90
        assert c["tokens_per_s"] == pytest.approx(c["batch_size"] * c["tau"] / c["tround_ms"] * 1e3)
        assert c["tpot_ms"] == pytest.approx(c["tround_ms"] / c["tau"])
        assert c["tround_p10_ms"] <= c["tround_ms"] <= c["tround_p90_ms"]
    assert cells["plain/overlap/bs2/B1/auto"]["tau"] == 1.0 and "capture" not in cells["plain/overlap/bs2/B1/auto"]
    for s in ("overlap", "sync"):
        c = cells[f"spec/{s}/bs2/B4/auto"]
        assert 1 <= c["tau"] <= 4
        assert c["capture"]["profiled_rounds"] == 2 and c["capture"]["trace_bytes"] > 0
        assert c["capture"]["occupancy"] is None  # a CPU trace has no device activity
        # the unprofiled host time per NVTX range (timed rounds) and the profiled one (the capture) side by side
        u, p = c["unprofiled_range_ms"], c["capture"]["profiled_range_ms"]
        assert {"round", "plan", "draft", "verify", "read"} <= set(u) <= set(p)
        assert u["round"] >= u["draft"] + u["verify"] > 0 and p["round"] >= p["draft"] + p["verify"] > 0
    cr = data["capture_report"]
    assert cr["profiled_rounds"] == 2 and cr["capture_s"] >= cr["export_s"] > 0 and "report_error" in cr
    md = (out / "runtime.md").read_text()
    assert md.strip() in stdout and "## Rounds: overlap vs sync" in md and "## Floor" in md
    assert "## Capture to report" in md and "## Profiler cost on the host, by NVTX range" in md

    # --resume keeps the cells; the time budget lets the first new cell run and skips the rest
    run("benchmarks/bench_runtime.py", *RT_SMOKE, "--batch-sizes", "2,3", "--blocks", "4", "--out", str(out),
        "--resume", "--time-budget-s", "0.001", "--profiled-rounds", "0")
    data2 = json.loads((out / "runtime.json").read_text())
    assert {k: data2["cells"][k]["tround_ms"] for k in cells} == {k: c["tround_ms"] for k, c in cells.items()}
    assert "spec/overlap/bs3/B4/auto" in data2["cells"]
    assert set(data2["skipped"]) == {"spec/sync/bs3/B4/auto", "plain/overlap/bs3/B1/auto"}
    assert data2["capture_report"] == cr


def test_bench_runtime_isolate_runs_each_cell_in_its_own_process(tmp_path):
    """--isolate yes: every cell in a child process of its own (each cell records its pid), results merged into one
    runtime.json; the figures obey the same identities as in-process cells."""
    out = tmp_path / "out"
    run("benchmarks/bench_runtime.py", *RT_SMOKE, "--batch-sizes", "2", "--blocks", "4", "--profiled-rounds", "0",
        "--isolate", "yes", "--out", str(out))
    cells = json.loads((out / "runtime.json").read_text())["cells"]
    assert set(cells) == {"spec/overlap/bs2/B4/auto", "spec/sync/bs2/B4/auto", "plain/overlap/bs2/B1/auto"}
    assert len({c["pid"] for c in cells.values()}) == 3 and os.getpid() not in {c["pid"] for c in cells.values()}
    for c in cells.values():
        assert "error" not in c and c["tpot_ms"] == pytest.approx(c["tround_ms"] / c["tau"])


def test_capture_figures_on_a_shipped_h200_trace():
    """The runtime benchmark's capture columns, from the real H200 capture (overlap, bs 8, B 12), against a plain
    recomputation from the raw JSON: Tround, occupancy of the decode window, ΣN per round, τ."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    import bench_runtime

    got = bench_runtime.analyse_capture(SHIPPED)
    with gzip.open(SHIPPED) as f:
        ev = json.load(f)["traceEvents"]
    starts = sorted(e["ts"] for e in ev if e.get("cat") == "user_annotation" and e.get("name") == "round")
    periods = np.diff(starts)
    assert got["rounds"] == len(periods)
    # the summary's steady rounds: all but a first period shorter than 75% of the median (a drained queue)
    steady = np.ones(len(periods), dtype=bool)
    steady[0] = periods[0] >= 0.75 * np.median(periods)
    assert got["t_round_ms"] == pytest.approx(periods[steady].mean() / 1e3, rel=1e-9)
    # occupancy: union of kernels / memcpys / memsets clipped to the window, merged in a plain loop
    ws, we = got["window_start_us"], got["window_end_us"]
    iv = sorted((max(e["ts"], ws), min(e["ts"] + e["dur"], we)) for e in ev
                if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e["ts"] < we and e["ts"] + e["dur"] > ws)
    busy, cur_s, cur_e = 0.0, None, None
    for s, e in iv:
        if cur_e is None or s > cur_e:
            busy += 0.0 if cur_e is None else cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    assert got["occupancy"] == pytest.approx(busy / (we - ws), abs=1e-6)
    # ΣN: device activities carrying each cudaGraphLaunch's correlation id, summed per round period
    per_corr: dict = {}
    for e in ev:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            c = e["args"].get("correlation")
            per_corr[c] = per_corr.get(c, 0) + 1
    sums = np.zeros(len(periods))
    for e in ev:
        if e.get("cat") == "cuda_runtime" and e.get("name") == "cudaGraphLaunch":
            i = np.searchsorted(starts, e["ts"], side="right") - 1
            if 0 <= i < len(periods):
                sums[i] += per_corr.get(e["args"]["correlation"], 0)
    assert got["launch_nodes_per_round"] == pytest.approx(sums[steady].mean())
    side = json.loads(open(SHIPPED.replace(".json.gz", ".gaptrace.json")).read())
    taus = np.array([r["tau"] for r in side["rounds"]][: len(periods)])
    assert got["tau"] == pytest.approx(np.mean(taus[steady]))
    # the derived figures follow from the others
    assert got["ratio_round_to_bound"] == pytest.approx(got["t_round_ms"] / max(got["t_gpu_ms"], got["t_host_ms"]))
    host_unprof = got["t_host_ms"] - got["kappa_us_per_node"] * got["launch_nodes_per_round"] / 1e3
    assert got["overlap_model_excess_ms"] == pytest.approx(max(got["t_gpu_ms"], got["t_host_ms"])
                                                           - max(got["t_gpu_ms"], host_unprof))
    assert got["kappa_explained_ms"] == pytest.approx(got["kappa_us_per_node"] * got["launch_nodes_per_round"] / 1e3)
    # inclusive host time per round of every annotation starting inside a counted round period, from the raw JSON
    want: dict = {}
    for e in ev:
        if e.get("cat") == "user_annotation" and starts[0] <= e["ts"] < starts[-1]:
            want[e["name"]] = want.get(e["name"], 0.0) + e["dur"] / 1e3 / len(periods)
    assert set(got["profiled_range_ms"]) == set(want) and {"round", "draft", "verify", "read"} <= set(want)
    for k, v in want.items():
        assert got["profiled_range_ms"][k] == pytest.approx(v, abs=1e-6), k  # 1 ns: the JSON rounds dur


@pytest.mark.parametrize("qk_norm,cls", [(True, "Qwen3ForCausalLM"), (False, "LlamaForCausalLM")])
def test_transformers_loads_plain_checkpoints(tmp_path, qk_norm, cls):
    """save_checkpoint's output of a plain-attention model (sharded, tied embeddings, GQA) is a standard
    transformers checkpoint: AutoModelForCausalLM picks the Qwen3 / Llama class and gives the same logits."""
    transformers = pytest.importorskip("transformers")
    from gaptrace.runtime.models.checkpoint import load_checkpoint

    target, _ = _plain_pair(str(tmp_path), qk_norm=qk_norm, shard=True)
    assert os.path.exists(os.path.join(target, "model.safetensors.index.json"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    assert type(hf).__name__ == cls
    ours = load_checkpoint(target).eval()
    ids = torch.randint(0, 4096, (2, 33), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = ours(ids), hf(ids).logits
    assert a.abs().max() > 0.1  # not a degenerate model
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_bench_vs_transformers_smoke(tmp_path):
    pytest.importorskip("transformers")
    target, draft = _plain_pair(str(tmp_path))
    out = tmp_path / "out"
    stdout = run("benchmarks/bench_vs_transformers.py", "--target-dir", target, "--draft-dir", draft, "--device",
                 "cpu", "--max-prompts", "2", "--max-new-tokens", "8", "--runtime-batch-sizes", "1,2",
                 "--hf-batch-size", "2", "--out", str(out))
    data = json.loads((out / "vs_transformers.json").read_text())
    assert data["config"]["hf_class"] == "Qwen3ForCausalLM + Qwen3ForCausalLM"
    assert data["equivalence"]["max_abs_logit_diff"] < 1e-4
    runs = data["runs"]
    assert set(runs) == {"hf_assisted_bs1", "runtime_bs1_B8", "runtime_bs2_B8", "hf_plain_bs2", "hf_plain_bs1"}
    assert data["config"]["token_reference"] == "hf_plain_bs1"
    for name, r in runs.items():
        assert "error" not in r, (name, r)
        assert r["tokens"] == sum(len(o) for o in r["outputs"]) and 0 < len(r["outputs"][0]) <= 8
        if name != "hf_plain_bs1":  # float32 on one CPU: every method emits the reference's tokens
            assert r["check"]["exact"] == r["check"]["prompts"] == 2
    assert "(target: ≥ 3×)" in stdout and "| runtime_bs1_B8 | 1 | 2 |" in stdout


def test_bench_h200_driver_smoke(tmp_path):
    """The driver end to end in SMOKE mode: every step runs (CPU, tiny preset), few flat files come back, and the
    summary holds the steps table and both benchmarks' tables."""
    pytest.importorskip("transformers")
    target, draft = _plain_pair(str(tmp_path / "pair"))
    out = tmp_path / "OUT"
    r = subprocess.run(["bash", "maintainer/gpu/bench_h200.sh"], capture_output=True, text=True, timeout=600, cwd=REPO,
                       env={**os.environ, "SMOKE": "1", "PY": sys.executable, "OUT": str(out),
                            "PLAIN_TARGET": target, "PLAIN_DRAFT": draft, "TMPDIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr[-3000:]
    files = sorted(os.listdir(out))
    assert files == ["logs.tar.gz", "runtime.json", "runtime.md", "summary.md", "vs_transformers.json",
                     "vs_transformers.md"]
    summary = (out / "summary.md").read_text()
    for step in ("runtime_bs8_B12", "vs_transformers", "capture_report", "runtime_grid"):
        assert f"| {step} | 0 |" in summary, summary[:2000]
    assert "## Rounds: overlap vs sync" in summary and "same tokens as hf_plain_bs1" in summary
    cells = json.loads((out / "runtime.json").read_text())["cells"]
    assert {"spec/overlap/bs2/B4/auto", "spec/sync/bs2/B4/auto", "spec/overlap/bs1/B4/auto"} <= set(cells)
