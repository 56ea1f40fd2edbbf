"""The runtime on a CUDA GPU, in one batched run (issue 3's H200 checks). Writes $OUT/gpu_check_runtime.json and
two small gzipped Kineto traces; prints a summary.

    python scripts/gpu_check_runtime.py            # on the GPU machine, OUT=<folder>

1. Environment: torch, device, fla / nvtx / cuda.bindings present.
2. fla vs the reference gated delta rule (bf16 inputs, fp32 state), and the first call's compile time.
3. Exactness with CUDA graphs on, tiny preset (shipped weights when present), held-out prompts, batch 8, B = 8:
   float32 (fla off: reference recurrence everywhere): sync = overlap = plain greedy expected token for token;
   bfloat16: sync = overlap bit for bit, match rate against plain greedy, and the reference's top-2 logit gap at
   every first divergence (a near-tie, below EPS_BF16) against the median gap.
4. Node counts of the draft-block and verify graphs per batch bucket (cudaGraphGetNodes), tiny and bench.
5. Bench preset (bf16, random weights, ACCEPTANCE SIMULATED on the device): sync vs overlap, unprofiled
   tokens/s and round time, then a torch.profiler trace of steady rounds of each, counted for
   cudaStreamSynchronize, blocking device-to-host copies and event waits.
"""
from __future__ import annotations

import gzip
import json
import os
import platform
import shutil
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
OUT = Path(os.environ.get("OUT", REPO / "out"))
DEVICE = os.environ.get("GPU_CHECK_DEVICE", "cuda")  # "cpu": a smoke run of this script at toy sizes
EPS_BF16 = 0.25  # a "near-tie": top-2 logit gap below this (bf16 keeps 8 bits: 1 ulp is 1/16 at |logit| ~ 16)
RESULTS: dict = {}


def _import_runtime():
    """gaptrace.runtime from an editable install, or registered by hand from the checkout (the GPU machine)."""
    try:
        import gaptrace.runtime  # noqa: F401
    except ImportError:
        import importlib.util

        sys.path.insert(0, str(REPO))
        import gaptrace

        spec = importlib.util.spec_from_file_location(
            "gaptrace.runtime", REPO / "runtime" / "__init__.py", submodule_search_locations=[str(REPO / "runtime")])
        mod = importlib.util.module_from_spec(spec)
        sys.modules["gaptrace.runtime"] = mod
        gaptrace.runtime = mod
        spec.loader.exec_module(mod)


def save() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "gpu_check_runtime.json").write_text(json.dumps(RESULTS, indent=1, default=str))


def section(name):
    def deco(fn):
        def run(*a, **kw):
            t0 = time.perf_counter()
            print(f"== {name}", flush=True)
            try:
                RESULTS[name] = fn(*a, **kw)
            except Exception as e:  # keep going: one failed check must not cost the others
                RESULTS[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
            RESULTS[name + "_seconds"] = round(time.perf_counter() - t0, 1)
            print(json.dumps(RESULTS[name], default=str)[:3000], flush=True)
            save()
        return run
    return deco


@section("environment")
def environment():
    from gaptrace.runtime.annotate import nvtx_available
    from gaptrace.runtime.models.gdn import fla_available
    try:
        from cuda.bindings import runtime  # noqa: F401
        bindings = True
    except ImportError:
        bindings = False
    return {"torch": torch.__version__, "python": platform.python_version(), "gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
            "fla": fla_available(), "nvtx": nvtx_available(), "cuda_bindings": bindings}


@section("gdn_fla_vs_reference")
def gdn_check():
    if DEVICE != "cuda":
        return {"skipped": "no CUDA"}
    from gaptrace.runtime.models.gdn import gated_delta_rule_fla, gated_delta_rule_ref
    g = torch.Generator(device="cuda").manual_seed(0)
    out = {}
    for T in (1000, 37):
        bs, H, dk, dv = 2, 4, 64, 64
        r = lambda *s: torch.randn(*s, device="cuda", generator=g)  # noqa: E731
        q = torch.nn.functional.normalize(r(bs, T, H, dk), dim=-1)
        k = torch.nn.functional.normalize(r(bs, T, H, dk), dim=-1)
        v, beta = r(bs, T, H, dv), torch.sigmoid(r(bs, T, H))
        gate = -torch.nn.functional.softplus(r(bs, T, H)) * 0.5
        s0 = r(bs, H, dk, dv) * 0.1
        o_ref, s_ref = gated_delta_rule_ref(q, k, v, gate, beta, s0)
        t0 = time.perf_counter()
        o_f, s_f = gated_delta_rule_fla(q.bfloat16(), k.bfloat16(), v.bfloat16(), gate, beta, s0)
        torch.cuda.synchronize()
        rel = lambda a, b: float((a.float() - b.float()).norm() / b.float().norm())  # noqa: E731
        out[f"T{T}"] = {"first_call_s": round(time.perf_counter() - t0, 2), "nan": bool(o_f.isnan().any()),
                        "rel_l2_output": rel(o_f, o_ref), "rel_l2_final_state": rel(s_f, s_ref)}
    return out


def heldout_prompts(n: int) -> list[str]:
    lines = (REPO / "fixtures/prompts/heldout.jsonl").read_text().splitlines()
    return [json.loads(x)["prompt"] for x in lines if x.strip()][:n]


def run_both(engine, ids, max_new):
    """sync and overlap on one engine (same graphs); returns {sched: (outputs, round_tau, stats)}."""
    from gaptrace.runtime.engine.scheduler import make_scheduler
    res = {}
    for sched in ("sync", "overlap"):
        engine.scheduler = make_scheduler(sched, engine.runner)
        reqs, stats = engine.generate(ids, max_new)
        res[sched] = ([r.output for r in reqs], stats.round_tau, stats)
    return res


@section("exactness_tiny")
def exactness(dtype: str, use_fla: bool, n_prompts=16, max_new=64):
    if DEVICE != "cuda":
        n_prompts, max_new = 3, 8
    from gaptrace.runtime.engine import Engine
    from gaptrace.runtime.models import gdn
    from gaptrace.runtime.session import build_setup, encode_prompts
    from gaptrace.runtime.spec.reference import greedy_reference
    saved = gdn._fla_chunk
    if not use_fla:
        gdn._fla_chunk = None
    try:
        setup = build_setup("tiny", device=DEVICE, dtype=dtype, batch_size=8, block_size=8)
        ids = encode_prompts(setup, heldout_prompts(n_prompts), max_new)
        t0 = time.perf_counter()
        engine = Engine(setup.target, setup.draft, setup.rcfg, setup.eos_token_id)
        startup = time.perf_counter() - t0
        res = run_both(engine, ids, max_new)
        outs = res["overlap"][0]
        refs = [greedy_reference(setup.target, p, max_new, setup.eos_token_id, setup.rcfg.prefill_chunk, DEVICE,
                                 setup.rcfg.fused_kernels)
                for p in ids]
    finally:
        gdn._fla_chunk = saved
    divs, same_tokens, total = [], 0, 0
    all_gaps = [x for r in refs for x in r.top2_gap]
    for out, ref in zip(outs, refs):
        d = next((i for i, (a, b) in enumerate(zip(out, ref.tokens)) if a != b), None)
        if d is None and len(out) != len(ref.tokens):
            d = min(len(out), len(ref.tokens))
        total += len(ref.tokens)
        same_tokens += len(ref.tokens) if d is None else d
        if d is not None:
            divs.append({"index": d, "top2_gap": ref.top2_gap[d] if d < len(ref.top2_gap) else None})
    gaps_at = [x["top2_gap"] for x in divs if x["top2_gap"] is not None]
    return {
        "dtype": dtype, "gdn": "fla prefill + reference recurrence" if use_fla else "reference recurrence",
        "weights": setup.weights, "prompts": len(ids), "max_new_tokens": max_new,
        "sync_equals_overlap": res["sync"][0] == res["overlap"][0] and res["sync"][1] == res["overlap"][1],
        "requests_exact": len(ids) - len(divs), "request_match_rate": (len(ids) - len(divs)) / len(ids),
        "token_match_rate_before_first_divergence": same_tokens / total,
        "divergences": divs, "eps": EPS_BF16, "all_divergences_below_eps": all(x < EPS_BF16 for x in gaps_at),
        "median_top2_gap": statistics.median(all_gaps) if all_gaps else None,
        "tau": {s: res[s][2].tau for s in res}, "tokens_per_s": {s: res[s][2].tokens_per_s for s in res},
        "tround_ms": {s: res[s][2].tround_ms for s in res}, "graph_nodes": engine.graph_nodes,
        "startup_s": round(startup, 1),
    }


def trace_summary(path: Path) -> dict:
    """Counts from a Kineto trace: host syncs and copies, graph launches, device busy fraction."""
    ev = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]
    rt = [e for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    dev = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    rounds = [e for e in ev if e.get("cat") == "user_annotation" and e["name"] == "round"]
    lo = min((e["ts"] for e in rounds), default=0)
    hi = max((e["ts"] + e["dur"] for e in rounds), default=0)
    rt = [e for e in rt if lo <= e["ts"] < hi]  # inside the profiled rounds (prof.stop() syncs after them)
    by = lambda n: [e["dur"] for e in rt if e["name"] == n]  # noqa: E731
    dtoh = [e for e in dev if e.get("cat") == "gpu_memcpy" and "DtoH" in e["name"] and lo <= e["ts"] < hi]
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in dev)
    busy, end = 0.0, -1e30
    for s, e in spans:  # union of device intervals (a summary here; gaptrace.analyses does this properly)
        if e > end:
            busy += e - max(s, end)
            end = e
    window = spans[-1][1] - spans[0][0] if spans else 0
    return {
        "rounds": len(rounds), "rounds_window_us": hi - lo, "cudaStreamSynchronize": len(by("cudaStreamSynchronize")),
        "cudaDeviceSynchronize": len(by("cudaDeviceSynchronize")),
        "cudaEventSynchronize": {"count": len(by("cudaEventSynchronize")),
                                 "max_us": max(by("cudaEventSynchronize"), default=0)},
        "cudaMemcpyAsync_max_host_us": max(by("cudaMemcpyAsync"), default=0),
        "dtoh_copies": {"count": len(dtoh), "pageable": sum("Pageable" in e["name"] for e in dtoh),
                        "names": sorted({e["name"] for e in dtoh})},
        "cudaGraphLaunch": {"count": len(by("cudaGraphLaunch")),
                            "median_us": statistics.median(by("cudaGraphLaunch")) if by("cudaGraphLaunch") else None},
        "device_busy_fraction": busy / window if window else None, "window_us": window,
        "cuda_sync_events": sum(1 for e in ev if e.get("cat") == "cuda_sync"),
    }


@section("bench")
def bench(max_new=160, warm=6, active=6):
    if DEVICE != "cuda":
        max_new, warm, active = 24, 2, 2
    from torch.profiler import ProfilerActivity, profile

    from gaptrace.runtime.engine import Engine
    from gaptrace.runtime.engine.scheduler import make_scheduler
    from gaptrace.runtime.session import build_setup, encode_prompts
    if DEVICE == "cuda":
        setup = build_setup("bench", device="cuda", batch_size=8, block_size=12)
    else:  # smoke run: the tiny pair with simulated acceptance
        setup = build_setup("tiny", device="cpu", batch_size=8, block_size=12, sim_accept_rate=0.78)
    ids = encode_prompts(setup, heldout_prompts(8), max_new)
    t0 = time.perf_counter()
    engine = Engine(setup.target, setup.draft, setup.rcfg, setup.eos_token_id)
    out = {"note": "ACCEPTANCE SIMULATED on the device (rate %s); random weights" % setup.rcfg.sim_accept_rate,
           "startup_s": round(time.perf_counter() - t0, 1), "graph_nodes": engine.graph_nodes,
           "params_target": sum(p.numel() for p in setup.target.parameters())}
    run_both(engine, ids, max_new)  # warm
    runs = [run_both(engine, ids, max_new) for _ in range(2)]  # timed (unprofiled), alternating sync / overlap
    res = runs[-1]
    out["sync_equals_overlap"] = all(r["sync"][0] == r["overlap"][0] and r["sync"][1] == r["overlap"][1]
                                     for r in runs)
    for s in res:
        sts = [r[s][2] for r in runs]
        out[s] = {"tau": sts[0].tau, "rounds": sts[0].rounds, "tokens_per_s": [x.tokens_per_s for x in sts],
                  "steady_tround_ms": [x.tround_ms for x in sts], "tpot_ms": [x.tpot_ms for x in sts],
                  "first_round_start_ms": [1e3 * x.round_start_s[1] for x in sts]}
    launch = {}
    for (phase, nb), g in engine.runner.graphs.items():
        if nb != 8:
            continue
        host = []
        for _ in range(20):
            torch.cuda.synchronize()
            t = time.perf_counter()
            g.graph.replay()
            host.append(1e6 * (time.perf_counter() - t))
        torch.cuda.synchronize()
        launch[phase] = {"nodes": g.num_nodes, "median_host_us": statistics.median(host)}
    out["unprofiled_graph_launch_bs8"] = launch
    try:
        exp = torch.profiler._ExperimentalConfig(enable_cuda_sync_events=True)
    except Exception:
        exp = None
    for sched in ("overlap", "sync"):
        engine.scheduler = make_scheduler(sched, engine.runner)
        prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], experimental_config=exp)

        def on_round(i, prof=prof):
            if i == warm:
                prof.start()
            elif i == warm + active:
                prof.stop()
        engine.generate(ids, max_new, on_round=on_round)
        raw = OUT / f"runtime_bench_{sched}_bs8_B12.json"
        prof.export_chrome_trace(str(raw))
        out[f"trace_{sched}"] = trace_summary(raw)
        with open(raw, "rb") as f, gzip.open(str(raw) + ".gz", "wb", compresslevel=9) as g:
            shutil.copyfileobj(f, g)
        raw.unlink()
        out[f"trace_{sched}"]["file"] = raw.name + ".gz"
        out[f"trace_{sched}"]["gz_bytes"] = (OUT / (raw.name + ".gz")).stat().st_size
    return out


def main() -> int:
    _import_runtime()
    OUT.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    environment()
    if os.environ.get("GPU_CHECK_ONLY", "") in ("", "gdn"):
        gdn_check()
    only = os.environ.get("GPU_CHECK_ONLY", "")  # e.g. "bench": re-run one section
    if only in ("", "exactness"):
        exactness("float32", False)
        RESULTS["exactness_tiny_float32"] = RESULTS.pop("exactness_tiny")
        exactness("bfloat16", True)
        RESULTS["exactness_tiny_bfloat16"] = RESULTS.pop("exactness_tiny")
    if only in ("", "bench"):
        bench()
    RESULTS["total_seconds"] = round(time.perf_counter() - t0, 1)
    save()
    print("done", RESULTS["total_seconds"], "s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
