"""Tensor parallelism: tokens/s and Tround of the runtime at TP 1, 2, ... side by side, in one run (DESIGN.md
"Tensor parallelism").

Each TP value runs in a fresh process of its own (this script again, with ``--child N``): N = 1 decodes in that
process, N > 1 spawns N rank processes (``runtime.tp.spawn_ranks``: NCCL and one GPU each on CUDA, gloo on the
CPU), each holding its slice of the target and the whole draft. Per cell (TP, scheduler, bs, B), every rank runs
``bench_runtime.run_cell``, the runtime benchmark's measurement: ``--warmup-rounds`` rounds, then ``--timed-rounds``
unprofiled rounds timed with the host clock (Tround = median period between round starts, no sync added; τ, TPOT =
Tround / τ, tokens/s = bs·τ / Tround), then with ``--profiled-rounds`` R > 0 a capture of R rounds per rank,
analysed by gaptrace (occupancy per rank on CUDA; a CPU trace has no device activity). With ``--repeats R`` the
TP values run R times, interleaved (TP 1, TP 2, TP 1, ...), each time in fresh processes, so a slow spell of a shared
machine falls on both; each row is the repeat of median Tround, with the range over repeats beside it. The table
shows rank 0's figures, every rank's Tround, and tokens/s against TP 1.

    python benchmarks/bench_tp.py --device cuda --preset bench --tp 1,2 --schedulers overlap --batch-sizes 8 \\
        --blocks 12 --profiled-rounds 8 --out benchmarks/results --name DATE_h200x2_tp           # the GPU figure
    python benchmarks/bench_tp.py --device cpu --preset tiny --tp 1,2 --batch-sizes 4 --blocks 8 \\
        --warmup-rounds 3 --timed-rounds 12 --repeats 3                                         # CPU / gloo
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _results import fmt, machine, md_table, pct, write_results  # noqa: E402


def ints(text: str) -> list[int]:
    """'1,2' -> [1, 2]."""
    return [int(x) for x in text.split(",") if x.strip()]


def cells(a) -> list[tuple[str, int, int]]:
    """(scheduler, bs, B) of every cell, in run order."""
    return [(s, bs, B) for bs in ints(a.batch_sizes) for B in ints(a.blocks) for s in a.schedulers.split(",")]


def measure(a: argparse.Namespace, tp=None) -> list[dict]:
    """Every cell in this process (one process, or rank ``tp.rank`` of a tensor-parallel run): run_cell's record per
    cell (timing summary; ``capture`` with the per-rank analysis when profiled), with the rank added."""
    import torch

    from bench_runtime import run_cell
    from gaptrace.runtime.cli import read_prompts_file
    from gaptrace.runtime.session import build_setup

    if a.device == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)
    texts = read_prompts_file(a.prompts)
    ranks = 1 if tp is None else tp.world
    setup = build_setup(a.preset, seed=a.seed, device=a.device, dtype=a.dtype, max_seq_len=a.max_seq_len,
                        batch_size=max(ints(a.batch_sizes)), tensor_parallel=ranks, tp=tp)
    rank = 0 if tp is None else tp.rank
    out = []
    for sched, bs, B in cells(a):
        trace = os.path.join(a.work, f"tp{ranks}_{sched}_bs{bs}_B{B}.rank{rank}.json")
        rec = run_cell(setup, texts, "spec", sched, bs, B, a, trace, a.profiled_rounds)
        out.append({**rec, "rank": rank, "tp": ranks, "dtype": setup.rcfg.dtype,
                    "simulated": (f"acceptance simulated (rate {setup.rcfg.sim_accept_rate})" if setup.simulated
                                  else None)})
    return out


def rank_main(tp, args: dict) -> list[dict]:
    """One rank of a ``--child N`` run (runtime.tp.spawn_ranks)."""
    return measure(argparse.Namespace(**args), tp)


def child(a: argparse.Namespace) -> int:
    """``--child N``: every cell at TP N; the records of every rank, by rank, as JSON into ``--result``."""
    if a.child == 1:
        per_rank = [measure(a)]
    else:
        from gaptrace.runtime.tp import spawn_ranks

        per_rank = spawn_ranks(rank_main, a.child, a.device, (vars(a),))
    with open(a.result, "w", encoding="utf-8") as f:
        json.dump(per_rank, f)
    return 0


def render(data: dict) -> str:
    """The side-by-side table (rank 0's figures, each rank's Tround and occupancy) and the run's description."""
    m, cfg = data["machine"], data["config"]
    base = {(c["scheduler"], c["batch_size"], c["block_size"]): c for c in data["cells"] if c["tp"] == 1}
    rows = []
    for c in sorted(data["cells"], key=lambda c: (c["batch_size"], c["block_size"], c["scheduler"], c["tp"])):
        ref = base.get((c["scheduler"], c["batch_size"], c["block_size"]))
        occ = [r.get("occupancy") for r in c["ranks_capture"]]
        reps = c.get("repeats_tround_ms") or [c["tround_ms"]]
        rows.append([c["tp"], c["scheduler"], c["batch_size"], c["block_size"], fmt(c["tround_ms"]),
                     f"{fmt(min(reps))}–{fmt(max(reps))}" if len(reps) > 1 else "–", fmt(c["tau"]),
                     fmt(c["tpot_ms"], 3), fmt(c["tokens_per_s"], 1),
                     " / ".join(fmt(t) for t in c["ranks_tround_ms"]),
                     " / ".join(pct(o) for o in occ) if any(o is not None for o in occ) else "–",
                     fmt(c["tokens_per_s"] / ref["tokens_per_s"]) + "×" if ref else "–"])
    where = m.get("gpu") or f"CPU ({m.get('cpus')} cores), gloo"
    parts = [f"# Tensor parallelism: TP {cfg['tp']} side by side ({cfg['preset']} preset, "
             f"{cfg['dtype'] or 'its dtype'}, {where})", "",
             f"{m['date']}, torch {m.get('torch')}; each TP value in a fresh process ({cfg.get('repeats', 1)} "
             "interleaved repeat(s); the row is the repeat of median Tround), TP N > 1 as N rank processes "
             f"({'NCCL, one GPU each' if cfg['device'] == 'cuda' else 'gloo on the host CPU: not a GPU figure'}). "
             f"Tround = median host period between rounds over {cfg['timed_rounds']} unprofiled rounds after "
             f"{cfg['warmup_rounds']} warm-up rounds (no added sync), rank 0's; τ, TPOT = Tround / τ, tokens/s = "
             "bs·τ / Tround." + (f" {cfg['simulated']}." if cfg.get("simulated") else "")
             + (f" Occupancy from {cfg['profiled_rounds']} profiled rounds per rank." if cfg["profiled_rounds"]
                else "")
             + (f" Host load average (1 min) {m['load_avg_1min_start']:.1f} at the start, "
                f"{m.get('load_avg_1min_end', float('nan')):.1f} at the end, on {m.get('cpus')} cores: other work "
                "shared them; the range over repeats shows how much that moved the figures." if "load_avg_1min_start"
                in m else ""), "",
             md_table(["TP", "scheduler", "bs", "B", "Tround ms", "Tround ms over repeats", "τ", "TPOT ms", "tok/s",
                       "Tround ms per rank",
                       "occupancy per rank", "tok/s vs TP 1"], rows), "",
             f"Command: `{cfg['command']}`"]
    return "\n".join(parts)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="tiny")
    p.add_argument("--device", default=None, help="cpu | cuda (default: cuda when available)")
    p.add_argument("--dtype", default=None)
    p.add_argument("--max-seq-len", type=int, default=None)
    p.add_argument("--prompts", default=os.path.join(os.path.dirname(HERE), "fixtures", "prompts", "heldout.jsonl"))
    p.add_argument("--tp", default="1,2", help="tensor-parallel sizes, side by side")
    p.add_argument("--schedulers", default="overlap")
    p.add_argument("--batch-sizes", default="8")
    p.add_argument("--blocks", default="12")
    p.add_argument("--warmup-rounds", type=int, default=5)
    p.add_argument("--timed-rounds", type=int, default=30)
    p.add_argument("--profiled-rounds", type=int, default=0, help="per-rank capture for occupancy (0: none)")
    p.add_argument("--repeats", type=int, default=1, help="fresh processes per TP value, interleaved; the table "
                                                              "shows the repeat of median Tround")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep-traces", action="store_true")
    p.add_argument("--work", default=None, help="where traces go (default: a temporary directory)")
    p.add_argument("--out", default=None, help="write OUT/NAME.json and .md")
    p.add_argument("--name", default="tp")
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.warmup_rounds < 1 or a.timed_rounds < 1 or a.profiled_rounds < 0 or a.repeats < 1:
        p.error("--warmup-rounds, --timed-rounds and --repeats must be >= 1, --profiled-rounds >= 0")
    if a.device is None:
        import torch

        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    a.work = a.work or tempfile.mkdtemp(prefix="gaptrace_bench_tp_")
    if a.child is not None:
        return child(a)
    data = {"machine": {**machine(), "load_avg_1min_start": os.getloadavg()[0]}, "cells": [], "errors": {},
            "config": {"preset": a.preset, "dtype": a.dtype, "device": a.device, "tp": a.tp, "repeats": a.repeats,
                       "warmup_rounds": a.warmup_rounds, "timed_rounds": a.timed_rounds,
                       "profiled_rounds": a.profiled_rounds,
                       "command": "python benchmarks/bench_tp.py " + " ".join(sys.argv[1:] if argv is None else argv)}}
    argv_child = [x for x in (sys.argv[1:] if argv is None else argv)]
    runs: dict[int, list] = {}  # TP -> one list of per-rank records per repeat
    for rep in range(a.repeats):  # TP 1, TP 2, TP 1, TP 2, ...: interleaved, so a slow spell hits both
        for n in ints(a.tp):
            t0 = time.perf_counter()
            print(f"TP {n}, repeat {rep + 1}/{a.repeats} ...", file=sys.stderr, flush=True)
            with tempfile.TemporaryDirectory() as d:
                res = os.path.join(d, "result.json")
                r = subprocess.run([sys.executable, os.path.abspath(__file__), *argv_child, "--device", a.device,
                                    "--work", a.work, "--child", str(n), "--result", res])
                if r.returncode != 0 or not os.path.exists(res):
                    data["errors"][f"{n}/{rep + 1}"] = f"the TP {n} process exited {r.returncode} without a result"
                    continue
                with open(res, encoding="utf-8") as f:
                    runs.setdefault(n, []).append(json.load(f))
            print(f"TP {n}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    for n, reps in runs.items():
        for k in range(len(reps[0][0])):  # cell k: the repeat of median Tround (rank 0's), every rank beside it
            by_tround = sorted(reps, key=lambda per_rank: per_rank[0][k]["tround_ms"])
            per_rank = by_tround[(len(by_tround) - 1) // 2]
            rec = dict(per_rank[0][k])
            data["config"]["simulated"] = rec.pop("simulated", None)
            data["config"]["dtype"] = rec["dtype"]
            rec["repeats_tround_ms"] = [x[0][k]["tround_ms"] for x in reps]
            rec["ranks_tround_ms"] = [rank_recs[k]["tround_ms"] for rank_recs in per_rank]
            rec["ranks_capture"] = [rank_recs[k].get("capture") or {} for rank_recs in per_rank]
            data["cells"].append(rec)
    data["machine"]["load_avg_1min_end"] = os.getloadavg()[0]
    md = render(data) + ("".join(f"\n\nTP {n}: {e}" for n, e in data["errors"].items()))
    print(md)
    if a.out:
        write_results(a.out, a.name, data, md)
    return 0 if not data["errors"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
