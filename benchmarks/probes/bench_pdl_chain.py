"""Does programmatic dependent launch (PDL) close the bubbles between CUDA-graph nodes, in a capture? (The
occupancy floor at bs 8 is ~590 dependent nodes a round with a ~0.45 µs bubble each in the profiled trace.)

A chain of ``--nodes`` small dependent Triton kernels (each reads the previous one's output: y = x * 1.0001 + 1 over
``--elements`` floats, ~a bs-8 activation) is captured in one CUDA graph, in variants:

- ``plain``: ordinary launches (a full dependency between nodes, as the runtime's graphs have now);
- ``pdl``: each kernel launched with PDL (Triton's ``launch_pdl=True``; CUDA's programmatic stream serialization,
  captured as programmatic graph edges) and calling ``griddepcontrol.launch_dependents`` first and
  ``griddepcontrol.wait`` before it reads its input (``tl.extra.cuda.gdc_*``): the next node may be scheduled while
  this one runs, and waits in-kernel for its data;
- ``gemm+plain`` / ``gemm+pdl``: a cuBLAS GEMM (torch.mm, [rows, K] x [K, K]) before every Triton node, as the
  runtime's layers alternate; cuBLAS's kernels are not PDL launches, so only the Triton node after a GEMM can use it.

Per variant: the replay's device time with CUDA events, unprofiled (median of ``--replays``) and per node; then one
profiled replay (torch.profiler, CUDA activity, as ``gaptrace capture`` records it) read back with gaptrace: the
graph launch's span, busy time (union of its kernels) and the gaps between its nodes (median, sum). Outputs are
checked equal across variants. A table, not a test.

    python benchmarks/probes/bench_pdl_chain.py --device cuda --out results
    python benchmarks/probes/bench_pdl_chain.py --device cpu --nodes 4 --replays 1     # smoke: Triton's interpreter
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # the probes, then benchmarks/ (_results, bench_runtime)

from _gpu import timed_replay_us  # noqa: E402
from _results import fmt, machine, md_table, out_dir_arg, print_and_write  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--nodes", type=int, default=300, help="Triton nodes in the chain")
    ap.add_argument("--elements", type=int, default=8 * 2048)
    ap.add_argument("--gemm-k", type=int, default=1024, help="the GEMM variants' K (rows = elements / K)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="the buffers' and the GEMM's dtype (bfloat16: cuBLAS's nvjet kernels, as the runtime's)")
    ap.add_argument("--profiler", default="plain", choices=["plain", "gaptrace"],
                    help="the profiled replay's settings: CPU + CUDA activity only, or gaptrace capture's (Python "
                         "stacks, CUDA sync events: gaptrace.capture.profiler_kwargs)")
    ap.add_argument("--distinct", type=int, default=1,
                    help="distinct compiled Triton kernels the chain cycles through (a constexpr salt; the runtime's "
                         "round runs ~20 different kernels): does a cold kernel widen the gap before it?")
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--out", default=None, type=out_dir_arg, help="write pdl_chain.json/.md here")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported
    import torch
    import triton
    import triton.language as tl

    try:  # module globals: Triton's JIT resolves a kernel's names there
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
        globals().update(gdc_launch_dependents=gdc_launch_dependents, gdc_wait=gdc_wait)
    except ImportError:  # an older Triton: no grid dependency control
        gdc_wait = None

    @triton.jit
    def _step(x_ptr, y_ptr, n, PDL: tl.constexpr, BLOCK: tl.constexpr, SALT: tl.constexpr):
        if PDL:
            gdc_launch_dependents()  # the next node may be scheduled now; it waits for this one in gdc_wait
            gdc_wait()               # this node's input is the previous node's output
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m) * 1.0001 + 1.0 + SALT * 1e-30, mask=m)

    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    n, block = args.elements, 1024
    rows = max(1, n // args.gemm_k)
    dtype = getattr(torch, args.dtype)
    w = (torch.randn(args.gemm_k, args.gemm_k, device=dev) / args.gemm_k ** 0.5).to(dtype)

    def chain(pdl: bool, gemm: bool, bufs):
        a, b = bufs
        for i in range(args.nodes):
            if gemm:
                torch.mm(a.view(rows, -1)[:, :args.gemm_k], w, out=b.view(rows, -1)[:, :args.gemm_k])
                a, b = b, a
            kw = {"launch_pdl": True} if pdl and cuda else {}
            _step[(triton.cdiv(n, block),)](a, b, n, PDL=pdl, BLOCK=block, SALT=i % args.distinct, **kw)
            a, b = b, a
        return a

    variants = [("plain", False, False), ("pdl", True, False), ("gemm+plain", False, True), ("gemm+pdl", True, True)]
    rows_out, results, ref = [], {}, {}
    for name, pdl, gemm in variants:
        if pdl and (gdc_wait is None or not cuda):
            why = "needs CUDA (the interpreter has no grid dependency control)" if gdc_wait is not None else \
                "unsupported (no triton.language.extra.cuda.gdc_*)"
            rows_out.append([name, why] + ["–"] * 7)
            continue
        x0 = torch.linspace(-1, 1, n, device=dev).to(dtype)
        bufs = [x0.clone(), torch.empty_like(x0)]
        r = {"nodes": args.nodes * (2 if gemm else 1)}
        try:
            if not cuda:  # the interpreter: eager, correctness only
                out = chain(pdl, gemm, bufs).clone()
            else:
                torch.cuda.synchronize()
                chain(pdl, gemm, bufs)  # compile + warm up outside the capture
                bufs[0].copy_(x0)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    res = chain(pdl, gemm, bufs)
                r["replay_us"] = timed_replay_us(g.replay, args.replays, torch, prepare=lambda: bufs[0].copy_(x0))
                out = res.clone()
                r.update(_profiled(g, bufs, x0, torch, args.profiler))
        except Exception as exc:  # noqa: BLE001 - a variant this Triton/driver cannot run is a row, not a crash
            rows_out.append([name, f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"] + ["–"] * 7)
            continue
        key = "gemm" if gemm else "chain"
        if key in ref:
            r["same_output_as_plain"] = bool(torch.equal(out, ref[key]))
        else:
            ref[key] = out
            r["same_output_as_plain"] = True
        results[name] = r
        per_node = r.get("replay_us", float("nan")) / r["nodes"]
        rows_out.append([name, str(r["nodes"]), fmt(r.get("replay_us"), 1), fmt(per_node, 3),
                         fmt(r.get("span_us"), 1), fmt(r.get("busy_share"), 3), fmt(r.get("gap_median_us"), 3),
                         fmt(r.get("gap_sum_us"), 1), str(r["same_output_as_plain"])])
    head = ["variant", "nodes", "replay µs (events)", "µs / node", "profiled span µs", "busy share",
            "median gap µs", "gap sum µs", "same output"]
    text = "\n".join([
        "# PDL across CUDA-graph nodes", "",
        ", ".join(f"{k} {v}" for k, v in machine().items() if k in ("date", "gpu", "torch")) + f", triton "
        f"{triton.__version__}", "",
        f"{args.nodes} Triton nodes ({args.distinct} distinct compiled kernels) of {n} {args.dtype} each (+ a [{rows}, {args.gemm_k}] x [{args.gemm_k}, "
        f"{args.gemm_k}] GEMM before each in the gemm variants); {args.replays} unprofiled replays timed with CUDA "
        f"events; one profiled replay ({args.profiler} profiler settings) read by gaptrace (span, busy = union of the launch's kernels, gaps between "
        "them). With PDL a node's kernel record starts before it may read its input, so its spin in gdc_wait "
        "counts as busy in the trace.", "",
        md_table(head, rows_out)])
    return print_and_write(args.out, "pdl_chain", {"args": vars(args), "results": results}, text)


def _profiled(g, bufs, x0, torch, settings: str = "plain") -> dict:
    """One replay under torch.profiler (CUDA activity), read back with gaptrace: the graph launch's kernels' span,
    busy share (union / span) and the gaps between them (``span_busy_gaps``)."""
    import gaptrace
    from torch.profiler import ProfilerActivity, profile

    from gaptrace.capture import profiler_kwargs

    bufs[0].copy_(x0)
    torch.cuda.synchronize()
    kw = profiler_kwargs() if settings == "gaptrace" else {"activities": [ProfilerActivity.CPU, ProfilerActivity.CUDA]}
    with profile(**kw) as prof:
        g.replay()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "pdl.json")
        prof.export_chrome_trace(path)
        trace = gaptrace.load_trace(path)
    k = trace.device.sort_values("ts_us")  # kernels, memcpys, memsets of the replay
    return span_busy_gaps(k["ts_us"].to_numpy(dtype=float), k["end_us"].to_numpy(dtype=float))


def span_busy_gaps(starts, ends) -> dict:
    """Device intervals [starts[i], ends[i]) in µs (sorted by start) -> {kernels, span_us (first start to last
    end), busy_share (their union / span), gap_median_us and gap_sum_us (the idle between one interval and the
    next start, overlaps counting 0)}."""
    import numpy as np

    s, e = np.asarray(starts, dtype=float), np.asarray(ends, dtype=float)
    if len(s) == 0:
        return {}
    reach = np.maximum.accumulate(e)               # the latest end so far
    gaps = np.maximum(s[1:] - reach[:-1], 0.0)     # idle before each next interval
    span = float(reach[-1] - s[0])
    busy = span - float(gaps.sum())
    return {"kernels": int(len(s)), "span_us": span, "busy_share": busy / span if span else float("nan"),
            "gap_median_us": float(np.median(gaps)) if len(gaps) else 0.0, "gap_sum_us": float(gaps.sum())}

if __name__ == "__main__":
    sys.exit(main())
