"""The runtime's own CUDA graphs replayed alone: are their ~0.45 µs node bubbles the graph's, or the decode loop's?
(bench_node_gap's chains of the same kernels show 0.1-0.26 µs.)

Builds the engine as benchmarks/bench_runtime.py does (bench preset, fused kernels), decodes ``--rounds`` rounds so
every graph is captured and its buffers hold a real round, then replays each of the draft, verify and commit graphs
of the batch's bucket on its own: ``--replays`` back-to-back replays timed with CUDA events (device time per
replay), and ``--profiled`` back-to-back replays under torch.profiler (CPU + CUDA activity), read by gaptrace:
kernels per replay, busy time (union of the replay's kernels) and the gaps between its nodes (median, sum, per
replay). A replay rewrites the same cache slots with the same inputs; nothing is decoded from it. A table, not a
test.

    python benchmarks/probes/bench_graph_alone.py --device cuda --out results
    python benchmarks/probes/bench_graph_alone.py --device cpu --preset tiny --batch-size 2 --block 4   # smoke (no graphs)
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # the probes, then benchmarks/ (_results, bench_runtime)

from _gpu import add_rms_norm_chain, timed_replay_us  # noqa: E402
from _results import fmt, machine, md_table, out_dir_arg, print_and_write  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="bench")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--block", type=int, default=12)
    ap.add_argument("--scheduler", default="overlap")
    ap.add_argument("--rounds", type=int, default=6, help="rounds decoded before the replays")
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--profiled", type=int, default=5)
    ap.add_argument("--chain-probe", type=int, default=0, metavar="NODES",
                    help="also capture a chain of NODES add_rms_norm nodes as the process's first graph and time it "
                         "(CUDA events) before the engine is built, after its rounds and after the replays: is the "
                         "process in the state where every graph's nodes cost ~0.18 µs more (bench_bubble_trigger)?")
    ap.add_argument("--fast-state", action="store_true",
                    help="decode the rounds eagerly (no graphs), then capture only the draft and verify graphs on "
                         "torch's capture stream, time them, put the process past the step (three new streams "
                         "with work: bench_bubble_trigger) and time them again: what the step costs the runtime's "
                         "own graphs")
    ap.add_argument("--out", default=None, type=out_dir_arg, help="write graph_alone.json/.md here")
    args = ap.parse_args(argv)
    import torch

    probe = _chain_probe(args.chain_probe, torch) if args.chain_probe and args.device == "cuda" else None
    probe_us: dict[str, float] = {}
    if probe is not None:
        probe_us["before the engine"] = timed_replay_us(probe.replay, args.replays, torch)

    from bench_pdl_chain import span_busy_gaps
    from bench_runtime import _Stop

    from gaptrace.runtime.capture_run import fill_batch
    from gaptrace.runtime.cli import read_prompts_file
    from gaptrace.runtime.engine import Engine
    from gaptrace.runtime.session import build_setup, encode_prompts

    setup = build_setup(args.preset, device=args.device, batch_size=args.batch_size)
    rc = setup.rcfg.replace(scheduler=args.scheduler, batch_size=args.batch_size, block_size=args.block,
                            kernels="fused" if args.device == "cuda" else "eager",
                            **({"cuda_graphs": False} if args.fast_state else {}))
    cs = dataclasses.replace(setup, rcfg=rc)
    texts = read_prompts_file(os.path.join(REPO, "fixtures", "prompts", "heldout.jsonl"))
    max_new = (args.rounds + 3) * args.block
    ids = encode_prompts(cs, fill_batch(texts, args.batch_size), max_new)
    engine = Engine(cs.target, cs.draft, rc, cs.eos_token_id)
    if probe is not None:
        probe_us[f"after the engine ({len(engine.runner.graphs)} graphs)"] = timed_replay_us(probe.replay,
                                                                                            args.replays, torch)

    def hook(i: int) -> None:
        if i >= args.rounds:
            raise _Stop

    try:
        engine.generate(ids, max_new, on_round=hook)
    except _Stop:
        pass
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.synchronize()  # SYNC (deliberate, outside any measurement): the abandoned rounds drained
    if args.fast_state and cuda:
        return _fast_state(args, engine, probe, probe_us, torch)
    if probe is not None:
        probe_us[f"after {args.rounds} rounds"] = timed_replay_us(probe.replay, args.replays, torch)
    graphs = {f"{p}_bs{nb}": g for (p, nb), g in sorted(engine.runner.graphs.items()) if nb == max(
        n for (_, n) in engine.runner.graphs)} if engine.runner.graphs else {}
    head = ["graph", "nodes", "replay µs (events)", "kernels / replay", "busy µs / replay", "median gap µs",
            "gap sum µs / replay", "gap sum / replay time"]
    rows, results = [], {}
    for name, g in graphs.items():
        replay_us = timed_replay_us(g, args.replays, torch)
        r = {"nodes": g.num_nodes, "replay_us": replay_us, **_profiled_replays(g, args.profiled, torch, span_busy_gaps)}
        results[name] = r
        rows.append([name, fmt(g.num_nodes), fmt(replay_us, 1), fmt(r.get("kernels_per_replay"), 1),
                     fmt(r.get("busy_us_per_replay"), 1), fmt(r.get("gap_median_us"), 3),
                     fmt(r.get("gap_sum_us_per_replay"), 1),
                     fmt(r["gap_sum_us_per_replay"] / replay_us if r.get("gap_sum_us_per_replay") else None, 3)])
    if not graphs:
        rows.append(["(no CUDA graphs on this device)"] + ["–"] * (len(head) - 1))
    if probe is not None:
        probe_us["after the replays"] = timed_replay_us(probe.replay, args.replays, torch)
        results["chain_probe_us"] = probe_us
    text = _joined(_head("The runtime's CUDA graphs replayed alone", args) + [
        f"after {args.rounds} decoded "
        f"rounds; {args.replays} replays timed with CUDA events (median), {args.profiled} back-to-back replays "
        f"profiled (CPU + CUDA activity) and read by gaptrace; gaps are between nodes of one replay. Graphs the engine "
        f"captured: {len(engine.runner.graphs)}. Device memory "
        f"reserved by PyTorch: {torch.cuda.memory_reserved() / 2 ** 30 if cuda else 0:.1f} GiB.", "",
        md_table(head, rows)] + _probe_lines(args.chain_probe, probe_us))
    return print_and_write(args.out, "graph_alone", {"args": vars(args), "results": results}, text)


def _fast_state(args, engine, probe, probe_us: dict, torch) -> int:
    """--fast-state: the bucket's draft and verify captured with ``torch.cuda.graph`` (its one capture stream, no
    side stream; the eager rounds warmed them up), timed with CUDA events; then three new streams run one kernel
    each (the process passes the step) and both are timed again."""
    nb = max(engine.runner.buckets)
    runner = engine.runner
    graphs = {}
    with torch.no_grad():
        for name, fn in (("draft", lambda: runner._draft_fn(nb)), ("verify", None)):
            g = torch.cuda.CUDAGraph()
            f = fn() if fn else runner._verify_fn(nb, graphs["draft"][1][0])
            with torch.cuda.graph(g):
                out = f()
            graphs[name] = (g, out)
    torch.cuda.synchronize()
    before = {k: timed_replay_us(g.replay, args.replays, torch) for k, (g, _) in graphs.items()}
    if probe is not None:
        probe_us["after the two captures"] = timed_replay_us(probe.replay, args.replays, torch)
    streams = []
    for _ in range(3):
        st = torch.cuda.Stream()
        with torch.cuda.stream(st):
            torch.ones(16, device="cuda").add_(1)
        streams.append(st)
    torch.cuda.synchronize()
    after = {k: timed_replay_us(g.replay, args.replays, torch) for k, (g, _) in graphs.items()}
    if probe is not None:
        probe_us["after three new streams"] = timed_replay_us(probe.replay, args.replays, torch)
    rows = [[f"{k}_bs{nb}", fmt(before[k], 1), fmt(after[k], 1), fmt(after[k] - before[k], 1),
             fmt(after[k] / before[k], 3)] for k in graphs]
    text = _joined(_head("The runtime's draft and verify graphs before and after the process's step", args) + [
        f"{args.rounds} rounds decoded "
        f"eagerly, then the draft and verify captured with torch.cuda.graph (the process's only graphs"
        f"{' besides the chain probe' if probe is not None else ''}); {args.replays} replays timed with CUDA "
        "events (median) before and after three new streams ran one kernel each.", "",
        md_table(["graph", "replay µs before", "replay µs after", "difference µs", "ratio"], rows)]
        + _probe_lines(args.chain_probe, probe_us))
    return print_and_write(args.out, "graph_alone", {"args": vars(args), "before_us": before, "after_us": after,
                                                     "chain_probe_us": probe_us}, text)


def _head(title: str, args) -> list[str]:
    """The table's title, machine line and the start of its description (the setting), as markdown lines."""
    return [f"# {title}", "", ", ".join(f"{k} {v}" for k, v in machine().items() if k in ("date", "gpu", "torch")),
            "", f"Preset {args.preset}, bs {args.batch_size}, B {args.block}, fused kernels; "]


def _joined(lines: list[str]) -> str:
    """``lines`` as markdown: a line ending in "; " runs on into the next."""
    return "\n".join(lines).replace("; \n", "; ")


def _probe_lines(nodes: int, probe_us: dict) -> list[str]:
    """The chain probe's timings as one markdown paragraph (none without a probe)."""
    if not probe_us:
        return []
    return ["", f"Chain probe ({nodes} dependent add_rms_norm nodes, [8, 1024] bf16, the process's first graph; "
            "replay µs, µs / node): " + "; ".join(f"{k} {v:.1f}, {v / nodes:.3f}" for k, v in probe_us.items())]


def _chain_probe(nodes: int, torch):
    """A CUDA graph of ``nodes`` dependent fused.add_rms_norm nodes ([8, 1024] bfloat16), compiled and captured."""
    chain = add_rms_norm_chain(nodes, "cuda", torch)
    chain()  # compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        chain()
    return g


def _profiled_replays(g, n: int, torch, span_busy_gaps) -> dict:
    """``n`` back-to-back replays of GraphedCall ``g`` under the profiler: per replay (kernels grouped by their
    cudaGraphLaunch correlation id) the kernel count, busy µs and gaps; returns per-replay medians and the median
    of all gaps."""
    import numpy as np

    import gaptrace
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            g()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "alone.json")
        prof.export_chrome_trace(path)
        dev = gaptrace.load_trace(path).device.sort_values("ts_us")
    per, gaps = [], []
    for _, k in dev.groupby("correlation", sort=False):
        s, e = k["ts_us"].to_numpy(float), k["end_us"].to_numpy(float)
        if len(s) < 2:
            continue
        r = span_busy_gaps(s, e)
        per.append(r)
        gaps.extend(np.maximum(s[1:] - np.maximum.accumulate(e)[:-1], 0.0))
    if not per:
        return {}
    return {"kernels_per_replay": statistics.median(r["kernels"] for r in per),
            "busy_us_per_replay": statistics.median(r["span_us"] * r["busy_share"] for r in per),
            "gap_sum_us_per_replay": statistics.median(r["gap_sum_us"] for r in per),
            "gap_median_us": float(np.median(gaps))}


if __name__ == "__main__":
    sys.exit(main())
