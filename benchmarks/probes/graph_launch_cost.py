"""What does the profiler add to a CUDA graph launch's host time, per graph node, and does it depend on the kind of
kernel in the nodes?

    python -m benchmarks.probes.graph_launch_cost [--nodes 200,1000] [--replays 30] --out DIR

For each node kind (a one-element ``add_``, a 64×64 matmul, a softmax over [8, 4096], a layer norm over [8, 1024],
an ``index_select`` gather, and a mix of all five in turn) a CUDA graph of N nodes of that kind is captured; every
``g.replay()`` (one ``cudaGraphLaunch``) is timed on the host with ``time.perf_counter`` after the device drained,
``--replays`` times, without the profiler and under gaptrace's profiler settings
(:func:`gaptrace.capture.profiler_kwargs`). The table: median launch µs plain and profiled, and the profiler's µs
per node, (profiled − plain) / N: κ of docs/DESIGN.md "Launch fit" measured directly, by kind. Without CUDA it
prints one line and exits 0 (the smoke run the tests make). Writes ``graph_launch_cost.json`` and ``.md``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

# run as ``python -m benchmarks.probes.NAME`` or by path: the repository root on the path either way
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from benchmarks._results import out_dir_arg  # noqa: E402

KINDS = ("add_", "matmul", "softmax", "layer_norm", "index_select", "mix")


def _ops(torch):
    """{kind: a function launching one kernel of that kind} on small CUDA tensors made once."""
    a = torch.zeros(1, device="cuda")
    m = torch.randn(64, 64, device="cuda")
    s = torch.randn(8, 4096, device="cuda")
    ln = torch.randn(8, 1024, device="cuda")
    w = torch.ones(1024, device="cuda")
    src = torch.randn(4096, 64, device="cuda")
    idx = torch.randint(0, 4096, (256,), device="cuda")
    F = torch.nn.functional
    ops = {"add_": lambda: a.add_(1.0), "matmul": lambda: m @ m, "softmax": lambda: s.softmax(-1),
           "layer_norm": lambda: F.layer_norm(ln, (1024,), w), "index_select": lambda: src.index_select(0, idx)}
    cycle = list(ops.values())
    state = {"i": 0}

    def mix():
        f = cycle[state["i"] % len(cycle)]
        state["i"] += 1
        return f()

    ops["mix"] = mix
    return ops


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="200,1000", help="graph sizes, comma-separated")
    ap.add_argument("--replays", type=int, default=30)
    ap.add_argument("--out", required=True, type=out_dir_arg)
    a = ap.parse_args(argv)
    try:
        sizes = [int(x) for x in a.nodes.split(",") if x]
    except ValueError:
        ap.error(f"--nodes must be integers (got {a.nodes!r})")
    if not sizes or min(sizes) < 1:
        ap.error("--nodes needs at least one size >= 1")
    import torch
    import torch.profiler as tp

    from gaptrace.calibrate import launch_host_us, node_graph
    from gaptrace.capture import profiler_kwargs

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure")
        return 0
    ops = _ops(torch)
    graphs = {(k, n): node_graph(torch, n, ops[k]) for k in KINDS for n in sizes}
    rows = []
    for (k, n), g in graphs.items():
        launch_host_us(torch, g, 3)
        rows.append({"kind": k, "nodes": n, "plain_us": min(launch_host_us(torch, g, a.replays) for _ in range(3))})
    with tp.profile(**profiler_kwargs(True)):
        for r in rows:
            g = graphs[(r["kind"], r["nodes"])]
            launch_host_us(torch, g, 3)
            r["profiled_us"] = min(launch_host_us(torch, g, a.replays) for _ in range(3))
    for r in rows:
        r["profiler_us_per_node"] = (r["profiled_us"] - r["plain_us"]) / r["nodes"]
    lines = [f"# graph launch host cost ({torch.cuda.get_device_name(0)}, torch {torch.__version__}; "
             f"{len(graphs)} graphs in one process)", "",
             "| kind | nodes | launch µs plain | launch µs profiled | profiler µs per node |",
             "| --- | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['kind']} | {r['nodes']} | {r['plain_us']:.1f} | {r['profiled_us']:.1f} | "
              f"{r['profiler_us_per_node']:.3f} |" for r in rows]
    text = "\n".join(lines)
    print(text)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "graph_launch_cost.json"), "w", encoding="utf-8") as f:
        json.dump(rows, f, indent=1)
    with open(os.path.join(a.out, "graph_launch_cost.md"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
