"""How much of the bubble between CUDA-graph nodes is the profiler's own (the runtime's occupancy floor).

`gaptrace analyze` measures the device-side idle between two nodes of one graph launch from the profiled trace; CUPTI
records every kernel node, and a node's bubble could be partly its cost. Here each graph replay's device span is
timed with CUDA events (``torch.cuda.Event(enable_timing=True)`` recorded on the stream just before and just after
``CUDAGraph.replay``; read after the decode, no sync inside it) in ``--timed-rounds`` unprofiled rounds and, the same
way, in ``--profiled-rounds`` rounds under gaptrace's capture (Python stacks, as ``gaptrace capture``). From the
trace, per graph launch: the span from its first node's start to its last node's end, the busy time (union of its
nodes) and the number of gaps between them.

Per graph (phase of the round, node count): event span unprofiled and profiled (median µs), their difference (what
profiling adds to one replay on the device), the trace's busy and bubble time per launch and its bubble per gap, and
the bubble per gap without the profiler, estimated as (trace bubble − event span difference) / gaps: it assumes the
kernels run as long with the profiler as without (CUPTI times them; it does not slow them), so that the whole
difference is bubble. Not a test: a table.

    python benchmarks/probes/bench_graph_span.py --device cuda --out results           # bench preset, bs 8, B 12, overlap
    python benchmarks/probes/bench_graph_span.py --preset tiny --device cpu --timed-rounds 2 --profiled-rounds 2  # smoke
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import tempfile
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # the probes, then benchmarks/ (_results, bench_runtime)

from _results import fmt, machine, md_table, out_dir_arg, print_and_write  # noqa: E402

PHASE_RANGES = ("plan", "draft", "tree", "verify", "commit")  # the engine's NVTX range around each graph's replay


class TimedGraph:
    """A GraphedCall whose replays, while ``timing[0]`` is set, are bracketed by CUDA events (one pair per replay,
    appended to ``sink``); everything else is the graph's own."""

    def __init__(self, graph, sink: list, timing: list):
        self.graph, self.sink, self.timing = graph, sink, timing

    def __getattr__(self, name):
        return getattr(self.graph, name)

    def __call__(self):
        import torch

        if not self.timing[0]:
            return self.graph()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = self.graph()
        end.record()
        self.sink.append((start, end))
        return out


def launch_spans(path: str) -> dict:
    """{phase: [(span µs, busy µs, gaps, nodes)] per cudaGraphLaunch} of a Kineto trace (raw JSON): the launch's
    nodes = the device activities sharing its correlation id; phase = the innermost engine range around the call."""
    ev = [e for e in json.load(gzip.open(path) if path.endswith(".gz") else open(path))["traceEvents"]
          if e.get("ph") == "X"]
    ranges = sorted((e for e in ev if e.get("cat") == "user_annotation" and e.get("name") in PHASE_RANGES),
                    key=lambda e: e["ts"])
    acts = defaultdict(list)
    for e in ev:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            acts[e["args"].get("correlation")].append((e["ts"], e["ts"] + e["dur"]))
    out = defaultdict(list)
    for e in ev:
        if e.get("cat") not in ("cuda_runtime", "cuda_driver") or e.get("name") != "cudaGraphLaunch":
            continue
        nodes = sorted(acts.get(e["args"].get("correlation"), []))
        enc = [r for r in ranges if r["ts"] <= e["ts"] <= r["ts"] + r["dur"] and r.get("tid") == e.get("tid")]
        if not nodes or not enc:
            continue
        busy = gaps = 0.0
        run_s, run_e = nodes[0]
        for s, t in nodes[1:]:
            if s > run_e:
                busy, gaps, run_s = busy + run_e - run_s, gaps + 1, s
            run_e = max(run_e, t)
        busy += run_e - run_s
        out[min(enc, key=lambda r: r["dur"])["name"]].append((run_e - nodes[0][0], busy, int(gaps), len(nodes)))
    return out


def run(args) -> dict:
    import torch

    from gaptrace.capture import Capture
    from gaptrace.runtime.capture_run import fill_batch
    from gaptrace.runtime.engine import Engine
    from gaptrace.runtime.session import build_setup, encode_prompts

    setup = build_setup(args.preset, device=args.device, batch_size=args.batch_size, block_size=args.block_size,
                        scheduler=args.scheduler)
    rc = setup.rcfg
    engine = Engine(setup.target, setup.draft, rc, setup.eos_token_id)
    timing, sinks = [False], {"unprofiled": defaultdict(list), "profiled": defaultdict(list)}
    names = {}
    for key, g in list(engine.runner.graphs.items()):
        names[key] = g.num_nodes
        engine.runner.graphs[key] = TimedGraph(g, sinks["unprofiled"][key], timing)
    W, T, P = args.warmup_rounds, args.timed_rounds, args.profiled_rounds
    need = W + T + 1 + P
    max_new = (need + 3) * rc.block_size
    texts = [json.loads(line)["prompt"] for line in open(os.path.join(REPO, "fixtures", "prompts",
                                                                       "heldout.jsonl"))]
    ids = encode_prompts(setup, fill_batch(texts, rc.batch_size), max_new)
    work = args.work or tempfile.mkdtemp(prefix="gaptrace_span_")
    trace = os.path.join(work, "graph_span.json.gz")
    cap = Capture(trace, warmup_steps=0, active_steps=P)

    class Stop(Exception):
        pass

    def hook(i: int) -> None:  # i rounds enqueued: the next round's replays are timed (or not) from here
        timing[0] = W <= i < W + T or i > W + T
        if i == W + T:
            cap.__enter__()
        elif i > W + T:
            if i == W + T + 1:  # the profiler's warm-up round is over: time into the profiled sinks
                for key, g in engine.runner.graphs.items():
                    g.sink = sinks["profiled"][key]
            cap.step()
        if cap.done and len(engine.round_tau) >= need:
            raise Stop

    try:
        engine.generate(ids, max_new, on_round=hook)
        raise RuntimeError(f"the decode ended after {len(engine.round_tau)} rounds, before the {need} it needs")
    except Stop:
        pass
    if rc.device == "cuda":
        torch.cuda.synchronize()  # SYNC (deliberate, after the decode): every timed replay has finished
    if cap.done:
        cap.__exit__(None, None, None)  # puts the trace (and its sidecar) in place
    spans = launch_spans(trace) if cap.done and rc.device == "cuda" else {}
    rows = []
    for (phase, nb), nodes in sorted(names.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        ev_us = {k: [1e3 * s.elapsed_time(e) for s, e in sinks[k][phase, nb]] for k in sinks}
        if not ev_us["unprofiled"]:
            continue  # a bucket the decode never ran
        row = {"phase": phase, "bucket": nb, "nodes": nodes, "replays": len(ev_us["unprofiled"]),
               "unprofiled_span_us": statistics.median(ev_us["unprofiled"]),
               "profiled_span_us": statistics.median(ev_us["profiled"]) if ev_us["profiled"] else None}
        rng = {"rect": "plan"}.get(phase, phase)
        tr = [x for x in spans.get(rng, []) if x[3] == nodes] if nodes else []
        if tr and row["profiled_span_us"] is not None:
            span, busy, gaps = (statistics.median(x[i] for x in tr) for i in range(3))
            add = row["profiled_span_us"] - row["unprofiled_span_us"]
            row.update(trace_span_us=span, trace_busy_us=busy, trace_gaps=gaps, trace_bubble_us=span - busy,
                       profiled_bubble_per_gap_us=(span - busy) / gaps if gaps else None, profiling_adds_us=add,
                       unprofiled_bubble_per_gap_us=(span - busy - add) / gaps if gaps else None)
        rows.append(row)
    return {"machine": machine(), "preset": args.preset, "batch_size": rc.batch_size, "block_size": rc.block_size,
            "scheduler": rc.scheduler, "timed_rounds": T, "profiled_rounds": P, "weights": setup.weights, "rows": rows}


def markdown(res: dict) -> str:
    head = (f"# The bubble between graph nodes, with and without the profiler\n\n{res['machine'].get('date')}, "
            f"{res['machine'].get('gpu') or 'no GPU'}, preset {res['preset']} ({res['weights']}), {res['scheduler']}, "
            f"bs {res['batch_size']}, B {res['block_size']}; {res['timed_rounds']} unprofiled and "
            f"{res['profiled_rounds']} profiled rounds; medians over replays.\n\n")
    t = md_table(["graph", "nodes", "replays", "event span µs unprofiled", "profiled", "profiling adds µs",
                  "trace busy µs", "trace bubble µs", "gaps", "bubble per gap µs (profiled)",
                  "bubble per gap µs (unprofiled, est.)"],
                 [[f"{r['phase']}_bs{r['bucket']}", fmt(r["nodes"]), fmt(r["replays"]), fmt(r["unprofiled_span_us"], 1),
                   fmt(r["profiled_span_us"], 1), fmt(r.get("profiling_adds_us"), 1), fmt(r.get("trace_busy_us"), 1),
                   fmt(r.get("trace_bubble_us"), 1), fmt(r.get("trace_gaps"), 0),
                   fmt(r.get("profiled_bubble_per_gap_us"), 3), fmt(r.get("unprofiled_bubble_per_gap_us"), 3)]
                  for r in res["rows"]])
    return head + t + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="bench")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("-B", "--block-size", type=int, default=12)
    ap.add_argument("--scheduler", default="overlap")
    ap.add_argument("--warmup-rounds", type=int, default=5)
    ap.add_argument("--timed-rounds", type=int, default=30)
    ap.add_argument("--profiled-rounds", type=int, default=8)
    ap.add_argument("--work", default=None, help="where the capture goes (default: a temporary directory)")
    ap.add_argument("--out", default=None, type=out_dir_arg, help="write graph_span.json/.md here")
    args = ap.parse_args(argv)
    res = run(args)
    return print_and_write(args.out, "graph_span", res, markdown(res))


if __name__ == "__main__":
    sys.exit(main())
