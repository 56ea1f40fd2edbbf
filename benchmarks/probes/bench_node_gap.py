"""What sets the bubble between two dependent CUDA-graph nodes? (The runtime's captures show ~0.42-0.45 µs
after every kind of kernel, bench_pdl_chain's synthetic Triton chain ~0.1 µs.)

Each variant is a chain of ``--nodes`` dependent nodes of ONE kernel kind captured in one CUDA graph, made twice:
with ``torch.cuda.CUDAGraph()`` (what bench_pdl_chain uses) and with ``CUDAGraph(keep_graph=True)`` + an explicit
``instantiate()`` (what runtime/engine/graphs.py uses, to count the nodes). Kinds:

- ``triton-step``: bench_pdl_chain's y = x * 1.0001 + 1 over ``--elements`` floats (16 programs);
- ``triton-step-1cta``: the same over 1,024 floats (one program);
- ``torch-add``: ``torch.add(x, 1, out=y)`` (PyTorch's vectorized elementwise kernel, as the graph-launch probe);
- ``add_rms_norm``: the runtime's own fused kernel (runtime/models/fused.py) at the bench draft's shape (8 rows,
  hidden 1024, bfloat16); ``add_rms_norm-96``: at the bench verify's (96 rows, hidden 2048);
- ``gemm+add_rms_norm``: a cuBLAS GEMM ([8, 1024] x [1024, 1024] bfloat16: nvjet, ~160 KB of shared memory) before
  every add_rms_norm, as the runtime alternates them; the gaps are also given per direction;
  ``gemm32MB+add_rms_norm``: the GEMM reads a 32 MB weight instead ([8, 16384] x [16384, 1024], a fixed input):
  as the runtime's GEMMs, it streams through L2 (50 MB on the H200) between two norms.

``--carveout PCT`` sets every Triton kernel's preferred shared-memory carveout (CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_
MEMORY_CARVEOUT, percent of the maximum) when Triton loads it, before it first runs: does an SM that must
switch its L1/shared split between a GEMM and a Triton kernel cost the bubble?

Per variant: the replay's device time with CUDA events, unprofiled (median of ``--replays``) and per node, then one
profiled replay read back with gaptrace (bench_pdl_chain._profiled: span, busy share, median and summed gap).
A table, not a test.

    python benchmarks/probes/bench_node_gap.py --device cuda --out results
    python benchmarks/probes/bench_node_gap.py --device cpu --nodes 3 --replays 1     # smoke: Triton's interpreter
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # the probes, then benchmarks/ (_results, bench_runtime)

from _gpu import name_list, timed_replay_us  # noqa: E402
from _results import fmt, machine, md_table, out_dir_arg, print_and_write  # noqa: E402

KINDS = ("triton-step", "triton-step-1cta", "torch-add", "add_rms_norm", "add_rms_norm-96", "gemm+add_rms_norm",
         "gemm32MB+add_rms_norm")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--nodes", type=int, default=300)
    ap.add_argument("--elements", type=int, default=8 * 2048)
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated, in order, repeats allowed; of "
                    + ", ".join(KINDS))
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--graphs", default="both", choices=["both", "default", "keep_graph"],
                    help="which graph kinds to make per chain")
    ap.add_argument("--no-profile", action="store_true", help="CUDA-event timings only: no profiler session in "
                    "the process (does a profiler session leave later chains slower?)")
    ap.add_argument("--keep-alive", action="store_true", help="keep every chain's graph alive to the end (do more "
                    "live graphs slow the later ones?)")
    ap.add_argument("--pool", default="own", choices=["own", "shared"], help="each graph its own memory pool "
                    "(torch's default) or one pool for all (the runtime's)")
    ap.add_argument("--hold-gb", type=int, default=0, help="device memory to allocate and touch first, GiB (the "
                    "runtime holds weights, KV pools and states: does a large footprint widen the gap?)")
    ap.add_argument("--carveout", type=int, default=None, help="Triton kernels' preferred shared-memory carveout, "
                    "percent (default: unset)")
    ap.add_argument("--out", default=None, type=out_dir_arg, help="write node_gap.json/.md here")
    args = ap.parse_args(argv)
    kinds = name_list(ap, args.kinds, KINDS, "kind")
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported
    import torch
    import triton
    import triton.language as tl

    from bench_pdl_chain import _profiled
    from gaptrace.runtime.models import fused

    @triton.jit
    def _step(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m) * 1.0001 + 1.0, mask=m)

    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    carved = set_triton_carveout(args.carveout) if args.carveout is not None and cuda else None
    held = [torch.ones(2 ** 30, dtype=torch.uint8, device=dev) for _ in range(args.hold_gb if cuda else 0)]
    bf16 = torch.bfloat16
    rows, hidden = 8, 1024

    def make(kind: str):
        """(buffers, fn(bufs) -> output of one chain); every node reads the previous node's output."""
        if kind.startswith("triton-step"):
            n = 1024 if kind.endswith("1cta") else args.elements
            bufs = [torch.linspace(-1, 1, n, device=dev), torch.empty(n, device=dev)]

            def fn(b):
                a, c = b
                for _ in range(args.nodes):
                    _step[(triton.cdiv(n, 1024),)](a, c, n, BLOCK=1024)
                    a, c = c, a
                return a
        elif kind == "torch-add":
            bufs = [torch.linspace(-1, 1, args.elements, device=dev), torch.empty(args.elements, device=dev)]

            def fn(b):
                a, c = b
                for _ in range(args.nodes):
                    torch.add(a, 1.0, out=c)
                    a, c = c, a
                return a
        else:  # add_rms_norm: (h, r) -> (h + r, norm(h + r)), the next node's (h, r)
            m, k = (96, 2048) if kind.endswith("-96") else (rows, hidden)
            w = torch.ones(k, device=dev, dtype=bf16)
            bufs = [torch.randn(m, k, device=dev).to(bf16), torch.randn(m, k, device=dev).to(bf16)]
            gemm = kind.startswith("gemm")
            big = kind.startswith("gemm32MB")
            kg = 16384 if big else k
            wg = (torch.randn(kg, k, device=dev) / kg ** 0.5).to(bf16)
            xg = torch.randn(rows, kg, device=dev).to(bf16) if big else None

            def fn(b):
                h, r = b
                for _ in range(args.nodes // 2 if gemm else args.nodes):
                    if gemm:
                        r = (xg if big else r) @ wg
                    h, r = fused.add_rms_norm(h, r, w, 1e-6)
                return r
        return bufs, fn

    head = ["kind", "graph", "nodes", "replay µs (events)", "µs / node", "profiled span µs", "busy share",
            "median gap µs", "gap sum µs"]
    rows_out, results = [], {}
    graph_kinds = {"both": (False, True), "default": (False,), "keep_graph": (True,)}[args.graphs]
    alive = []
    pool = torch.cuda.graph_pool_handle() if cuda and args.pool == "shared" else None
    for i, kind in enumerate(kinds):
        for keep in graph_kinds:
            bufs, fn = make(kind)
            label = kind + (f" #{i + 1}" if kinds.count(kind) > 1 else "")
            name = f"{label} {'keep_graph' if keep else 'default'}"
            r = {}
            try:
                if not cuda:
                    fn(bufs)
                    nodes = args.nodes
                else:
                    x0 = [b.clone() for b in bufs]
                    torch.cuda.synchronize()
                    fn(bufs)  # compile + warm up outside the capture
                    g = torch.cuda.CUDAGraph(keep_graph=True) if keep else torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g, pool=pool):
                        fn(bufs)
                    if keep:
                        g.instantiate()
                    from gaptrace.runtime.engine.graphs import graph_node_count
                    nodes = graph_node_count(g) if keep else None
                    r["replay_us"] = timed_replay_us(g.replay, args.replays, torch)
                    if args.keep_alive:
                        alive.append(g)
                    if not args.no_profile:
                        r.update(_profiled(g, [bufs[0], bufs[0]], x0[0], torch))
                    if kind.startswith("gemm") and not args.no_profile:
                        r["gap_median_by_direction_us"] = _direction_gaps(g, torch)
                    nodes = nodes or r.get("kernels")
            except Exception as exc:  # noqa: BLE001 - a variant this machine cannot run is a row, not a crash
                rows_out.append([label, "keep_graph" if keep else "default",
                                 f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"] + ["–"] * 6)
                continue
            r["nodes"] = nodes
            results[name] = r
            per = r.get("replay_us", float("nan")) / nodes if nodes else float("nan")
            rows_out.append([label, "keep_graph" if keep else "default", fmt(nodes), fmt(r.get("replay_us"), 1),
                             fmt(per, 3), fmt(r.get("span_us"), 1), fmt(r.get("busy_share"), 3),
                             fmt(r.get("gap_median_us"), 3), fmt(r.get("gap_sum_us"), 1)])
    text = "\n".join([
        "# The bubble between dependent CUDA-graph nodes, by kernel kind", "",
        ", ".join(f"{k} {v}" for k, v in machine().items() if k in ("date", "gpu", "torch")) +
        f", triton {triton.__version__}", "",
        f"Chains of {args.nodes} dependent nodes of one kernel kind in one CUDA graph; {args.replays} unprofiled "
        f"replays timed with CUDA events; one profiled replay (CPU + CUDA activity) read by gaptrace; {len(held)} "
        "GiB of device memory held. Triton "
        f"kernels' preferred shared-memory carveout: "
        f"{'unset' if carved is None else f'{args.carveout}% ({carved[0]} kernels set, {carved[1]} refused)'}.", "",
        md_table(head, rows_out)] + ([
        "\nRe-timed at the end (every graph kept alive): " + ", ".join(
            f"#{i + 1} {timed_replay_us(g.replay, args.replays, torch):.1f} µs" for i, g in enumerate(alive))]
        if alive else []) + [
        f"\nGap medians by direction, {k}: " + ", ".join(f"{d} {v:.3f} µs" for d, v in r["gap_median_by_direction_us"]
                                                         .items())
        for k, r in results.items() if r.get("gap_median_by_direction_us")])
    return print_and_write(args.out, "node_gap", {"args": vars(args), "results": results}, text)


def set_triton_carveout(pct: int) -> list:
    """Set CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT = ``pct`` on every Triton kernel loaded from now on
    (wraps ``triton.compiler.compiler.CompiledKernel._init_handles``, where Triton loads a kernel's module and
    function; CUDA driver API through cuda.bindings). Returns a live [set, refused] count."""
    from cuda.bindings import driver
    from triton.compiler.compiler import CompiledKernel

    counts = [0, 0]
    attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
    load = CompiledKernel._init_handles

    def _init_handles(self):
        fresh = self.module is None
        load(self)
        if fresh and self.function:
            (err,) = driver.cuFuncSetAttribute(driver.CUfunction(self.function), attr, pct)
            counts[0 if int(err) == 0 else 1] += 1

    CompiledKernel._init_handles = _init_handles
    return counts


def _direction_gaps(g, torch) -> dict:
    """One profiled replay of graph ``g``: the median gap (µs) after a GEMM and after a Triton kernel."""
    import tempfile

    import gaptrace
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        g.replay()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "gap.json")
        prof.export_chrome_trace(path)
        k = gaptrace.load_trace(path).device.sort_values("ts_us")
    return direction_gaps(k["name"].astype(str).to_numpy(), k["ts_us"].to_numpy(float), k["end_us"].to_numpy(float))


def direction_gaps(names, starts, ends) -> dict:
    """Kernels sorted by start (names, starts and ends in µs) -> the median gap after a GEMM and after a Triton
    kernel (named ``_...`` here; anything else, cuBLAS's nvjet and splitKreduce, counts as GEMM); NaN for a
    direction with no gap."""
    import numpy as np

    names = np.asarray(names)
    gaps = np.asarray(starts, float)[1:] - np.asarray(ends, float)[:-1]
    triton_first = np.array([n.startswith("_") for n in names[:-1]], dtype=bool)
    med = lambda g: float(np.median(g)) if len(g) else float("nan")  # noqa: E731
    return {"GEMM -> Triton": med(gaps[~triton_first]), "Triton -> GEMM": med(gaps[triton_first])}


if __name__ == "__main__":
    sys.exit(main())
