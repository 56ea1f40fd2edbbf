"""What makes a process's graph-node bubble step up? One fresh process, one chain graph, its replay
time followed while other CUDA work happens in between.

The bubble between dependent graph nodes grows during a process's life, unprofiled: chains of the
runtime's add_rms_norm replay at ~1.29 µs a node in the first three graphs a process makes and ~1.47 µs from the
fourth on (every graph, old ones too; benchmarks/probes/README.md), and the graph-launch probe's first
replays leave 0.256 µs between nodes where every later one leaves 0.416 µs. This script captures one chain of
``--nodes`` add_rms_norm nodes ([8, 1024] bfloat16, the bench draft's shape) and times ``--batches`` batches of
``--replays`` replays (CUDA events, median per batch) after each stage of ``--stages``, in order:

- ``none``: nothing (the baseline, and a check that replay time is stable);
- ``eager``: the chain's ``--nodes`` kernels launched eagerly once;
- ``graph``: another graph of the same chain captured (and kept: the process then holds one more);
- ``replays``: 1,000 more replays of the chain graph;
- ``events``: 200 CUDA events made and recorded;
- ``gemm``: one cuBLAS GEMM [8, 1024] x [1024, 1536] bfloat16 (the draft's q|k|v; cuBLAS's sm90 kernels launch
  with thread-block clusters);
- ``gemm-big``: one [4096, 4096] x [4096, 4096] bfloat16 GEMM;
- ``profiler``: one torch.profiler session (CPU + CUDA activity) around one replay;
- ``fresh``: another graph of the chain captured and replayed once, then ``--replays`` more times: its first
  replay (it uploads the graph) against its later ones, in the last column (the graph-launch probe's first replays
  left 0.256 µs between nodes, every later one 0.416 µs); the timed batches are still the first graph's;
- ``tiny-graph``: a graph of one elementwise kernel captured and kept (does any graph count, or only big ones?);
- ``stream``: a new ``torch.cuda.Stream`` from the pool with one kernel run on it;
- ``memcpy``: a device-to-pinned-host copy, an event recorded and waited on (the runtime's read-back);
- ``graphedcall``: the chain captured as the runtime captures its graphs (runtime.graphs.GraphedCall: warm-up on a
  new side stream, ``keep_graph=True``, ``instantiate()``, the node count read through cuda.bindings) and kept;
- ``free``: every graph the stages made dropped (the timed one stays);
- ``fresh-upload``: the same, with ``cudaGraphUpload`` before the first replay (when torch exposes the graph exec).

A stage name may repeat. The table gives each stage's median replay µs and µs per node; a step up after a stage
names the trigger. A table, not a test.

    python benchmarks/probes/bench_bubble_trigger.py --device cuda --out results
    python benchmarks/probes/bench_bubble_trigger.py --device cpu --nodes 3 --batches 1 --replays 1     # smoke
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # the probes, then benchmarks/ (_results, bench_runtime)

from _gpu import add_rms_norm_chain, name_list, timed_replay_us  # noqa: E402
from _results import fmt, machine, md_table, out_dir_arg, print_and_write  # noqa: E402

STAGES = ("none", "eager", "graph", "replays", "events", "gemm", "gemm-big", "profiler", "fresh", "fresh-upload",
          "tiny-graph", "stream", "memcpy", "graphedcall", "free")
# settings that could change how the device front end dispatches work; the table says which were set
ENV_NOTED = ("CUDA_DEVICE_MAX_CONNECTIONS", "CUDA_MODULE_LOADING", "CUDA_GRAPHS_USE_NODE_PRIORITY",
             "CUDA_AUTO_BOOST", "CUDA_LAUNCH_BLOCKING")
DEFAULT = ("none,none,fresh,eager,none,graph,graph,graph,fresh,fresh-upload,replays,events,gemm,fresh,gemm-big,"
           "profiler,fresh,none")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--nodes", type=int, default=300)
    ap.add_argument("--stages", default=DEFAULT, help="comma-separated, in order, repeats allowed; of " +
                    ", ".join(STAGES))
    ap.add_argument("--batches", type=int, default=5, help="timed batches after each stage")
    ap.add_argument("--replays", type=int, default=10, help="replays per batch")
    ap.add_argument("--out", default=None, type=out_dir_arg, help="write bubble_trigger.json/.md here")
    args = ap.parse_args(argv)
    stages = name_list(ap, args.stages, STAGES, "stage")
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported
    import torch

    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    bf16 = torch.bfloat16
    chain = add_rms_norm_chain(args.nodes, dev, torch)
    h0 = chain.inputs[0]

    def capture():
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            chain()
        made[0] += 1
        return g

    kept = []  # graphs made by the ``graph``, ``fresh`` and ``tiny-graph`` stages: held until a ``free``
    made = [0]  # graphs captured so far, the timed one included

    def upload(graph) -> str:
        """cudaGraphUpload of ``graph``'s exec on the current stream through the CUDA runtime; '' or why not."""
        import ctypes
        try:
            exec_ = graph.raw_cuda_graph_exec()
        except (AttributeError, RuntimeError) as e:
            return f"no upload ({type(e).__name__})"
        rt = None
        for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
            try:
                rt = ctypes.CDLL(name)
                break
            except OSError:
                continue
        if rt is None:
            return "no upload (no libcudart)"
        rc = rt.cudaGraphUpload(ctypes.c_void_p(exec_), ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        torch.cuda.synchronize()
        return "" if rc == 0 else f"upload rc {rc}"

    def fresh(with_upload: bool) -> str:
        g2 = capture()
        kept.append(g2)
        note = upload(g2) if with_upload else ""
        first = timed_replay_us(g2.replay, 1, torch)
        later = timed_replay_us(g2.replay, args.replays, torch)
        return f"new graph: first replay {first:.1f} µs, later {later:.1f} µs" + (f" ({note})" if note else "")

    def run_stage(name: str) -> str:
        note = ""
        if name in ("fresh", "fresh-upload") and cuda:
            note = fresh(name == "fresh-upload")
        elif name == "tiny-graph" and cuda:
            t = torch.ones(16, device=dev)
            tg = torch.cuda.CUDAGraph()
            with torch.cuda.graph(tg):
                t.add_(1)
            made[0] += 1
            kept.append((tg, t))
        elif name == "stream" and cuda:
            st = torch.cuda.Stream()
            with torch.cuda.stream(st):
                torch.ones(16, device=dev).add_(1)
            kept.append(st)
        elif name == "memcpy" and cuda:
            host = torch.empty(8, 1024, dtype=bf16, pin_memory=True)
            host.copy_(h0, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record()
            ev.synchronize()  # SYNC (deliberate): the stage is the read-back the runtime does every round
        elif name == "graphedcall" and cuda:
            from gaptrace.runtime.engine.graphs import GraphedCall
            kept.append(GraphedCall("chain", chain, torch.cuda.graph_pool_handle()))
            made[0] += 1
        elif name == "free":
            kept.clear()
            import gc
            gc.collect()
        elif name == "eager":
            chain()
        elif name == "graph" and cuda:
            kept.append(capture())
        elif name == "replays" and cuda:
            for _ in range(1000):
                g.replay()
        elif name == "events" and cuda:
            for _ in range(200):
                torch.cuda.Event(enable_timing=True).record()
        elif name == "gemm":
            torch.randn(8, 1024, device=dev).to(bf16) @ torch.randn(1024, 1536, device=dev).to(bf16)
        elif name == "gemm-big" and cuda:
            a = torch.randn(4096, 4096, device=dev).to(bf16)
            a @ a
        elif name == "profiler" and cuda:
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
                g.replay()
                torch.cuda.synchronize()
        if cuda:
            torch.cuda.synchronize()
        return note

    def timed() -> list[float]:
        return [timed_replay_us(g.replay, args.replays, torch) for _ in range(args.batches)]

    chain()  # compile + warm up outside the capture
    g = capture() if cuda else None
    rows, results = [], []
    for i, name in enumerate(stages):
        note = run_stage(name)
        batches = timed() if cuda else []
        med = statistics.median(batches) if batches else None
        results.append({"stage": name, "batch_median_us": batches, "replay_us": med, "note": note})
        results[-1]["graphs_made"] = made[0]
        rows.append([str(i + 1), name, str(made[0]), fmt(med, 1), fmt(med / args.nodes if med else None, 3),
                     " ".join(f"{b:.1f}" for b in batches) or "–", note or "–"])
    text = "\n".join([
        "# When does the graph-node bubble step up?", "",
        ", ".join(f"{k} {v}" for k, v in machine().items() if k in ("date", "gpu", "torch")), "",
        f"One graph of {args.nodes} dependent add_rms_norm nodes ([8, 1024] bfloat16); after each stage "
        f"{args.batches} batches of {args.replays} replays timed with CUDA events (median per batch); graphs the "
        f"process holds at the end: {1 + len(kept) if cuda else 0}. Environment: " +
        (", ".join(f"{k}={os.environ[k]}" for k in ENV_NOTED if k in os.environ) or "no CUDA_* overrides") + ".", "",
        md_table(["#", "stage (then timed)", "graphs made", "replay µs", "µs / node", "batch medians µs", "note"], rows)])
    return print_and_write(args.out, "bubble_trigger", {"args": vars(args), "results": results}, text)


if __name__ == "__main__":
    sys.exit(main())
