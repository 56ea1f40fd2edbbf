"""``gaptrace decode``: block-speculative decoding from the command line (registered lazily in gaptrace/cli.py).

    gaptrace decode --preset tiny --prompt "def fib(n):" --max-new-tokens 64 --json
    gaptrace decode --preset bench --device cuda --batch-size 8 --block-size 12 --scheduler sync
    gaptrace decode --preset tiny --prompt "x = 1" --fault lengths-copy --fault eager-commit-glue

Bad input (empty prompt, prompt longer than the context, unknown preset, B < 1, W not a multiple of P, a
checkpoint missing a tensor, an unknown --fault, the tiny preset's pair missing from an installed package without
--preset-dir, ...) prints one line on stderr and exits with code 2.
"""
from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

import click

from gaptrace.cli import fail
from gaptrace.text import escape_controls, escape_line


def read_prompts_file(path: str) -> list[str]:
    """Prompts from a JSONL file: each line a JSON string or an object with a "prompt" string.

    ValueError (one line naming the file, and the line where there is one) for a missing or unreadable file, bytes
    that are not UTF-8, a line that is not JSON or holds no prompt string, or no prompt at all."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{path}: prompts file not found")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise ValueError(f"{path}: cannot read the prompts file ({e.strerror or e})") from None
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        line_no = data.count(b"\n", 0, e.start) + 1
        raise ValueError(f"{path}:{line_no}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") \
            from None
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from None
        text = obj.get("prompt") if isinstance(obj, dict) else obj
        if not isinstance(text, str):
            raise ValueError(f"{path}:{n}: expected a string or an object with a \"prompt\" string")
        out.append(text)
    if not out:
        raise ValueError(f"{path}: no prompts")
    return out


def decode_options(f):
    """The decode options, shared with ``gaptrace capture``."""
    opts = [
        click.option("--preset", default="tiny", show_default=True, help="Model pair: tiny (shipped) or bench."),
        click.option("--preset-dir", type=str, help="The directory of the preset's shipped pair (tiny: tiny-target/, "
                                                    "tiny-draft/, tokenizer.json; default: the repository's "
                                                    "fixtures/models)."),
        click.option("--model-dir", type=str, help="A Hugging Face checkpoint directory to use as the target."),
        click.option("--draft-dir", type=str, help="Draft checkpoint directory (default with --model-dir: the "
                                                   "target itself)."),
        click.option("--prompt", "prompt_texts", multiple=True, help="A prompt (repeatable)."),
        click.option("--prompts", "prompts_file", type=str, help="A JSONL file of prompts."),
        click.option("--max-new-tokens", type=int, default=64, show_default=True),
        click.option("--batch-size", type=int, help="Request slots decoded together."),
        click.option("--block-size", "-B", type=int, help="Block size B: tokens per request per verify round."),
        click.option("--window", type=int, help="Draft window W (a multiple of the page size)."),
        click.option("--page-size", type=int, help="KV page size P."),
        click.option("--max-seq-len", type=int, help="Context capacity per request slot."),
        click.option("--prefill-chunk", type=int, help="Prefill chunk size."),
        click.option("--scheduler", default="overlap", show_default=True, help="sync | overlap"),
        click.option("--device", default="cpu", show_default=True, help="cpu | cuda"),
        click.option("--dtype", help="float32 | bfloat16 | float16 (default: the preset's)."),
        click.option("--no-graphs", is_flag=True, help="Run the draft block and verify eagerly on CUDA."),
        click.option("--graph-buckets", type=click.Choice(["max", "pow2"]), default=None,
                     help="CUDA graphs for the batch size only (max, default: smaller rounds pad to it; three graphs "
                          "a process) or also every power of two below it (pow2: more graphs; past about four, every "
                          "graph node costs ~0.18 µs more on an H200; --fault jit-new-shape needs pow2, the default with it)."),
        click.option("--kernels", type=click.Choice(["auto", "fused", "eager"]), default="auto", show_default=True,
                     help="fused: RMSNorm, q/k norm + RoPE and the gated-delta-rule chain as Triton kernels "
                          "(CUDA; fewer graph nodes); eager: PyTorch ops; auto: fused where it can run."),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--fault", "faults", multiple=True, metavar="NAME",
                     help="Switch a pathology on (repeatable): lengths-copy | dd-gather | eager-commit-glue | "
                          "jit-new-shape | token-list-rebuild | cpu-tree-build (tree mode) | late-rank (--tp 2+) "
                          "(runtime/faults.py). Tokens are unchanged."),
        click.option("--tree-budget", type=int, default=None, metavar="N",
                     help="Draft-tree mode (DDTree): verify a best-first tree of N nodes per request per round, the "
                          "root included (N = the verify width, the chain's B; tree depth <= B - 1). 0 = chain."),
        click.option("--tree-topk", type=int, default=None, metavar="K",
                     help="Draft tokens considered per tree depth (default 4)."),
        click.option("--tree-builder", type=click.Choice(["gpu", "cpu-heapq"]), default=None,
                     help="Build the tree on the device (gpu, default) or per request on the host with heapq "
                          "(cpu-heapq: the CPU tree-build pathology, = --fault cpu-tree-build)."),
        click.option("--tp", "tensor_parallel", type=click.IntRange(1), default=1, show_default=True, metavar="N",
                     help="Tensor parallelism: the target's heads and MLP split over N ranks, one process each "
                          "(NCCL and one GPU each on CUDA, gloo on the CPU); the draft replicated."),
        click.option("--late-rank-ms", type=click.FloatRange(min=0, min_open=True), default=None, metavar="MS",
                     help="The delay of --fault late-rank (the last rank's planning, every round; default 20)."),
    ]
    return functools.reduce(lambda acc, o: o(acc), reversed(opts), f)


def prompts_from_options(o: dict) -> list[str]:
    """The prompts of the decode options (``--prompt`` texts, then the ``--prompts`` file's); ValueError (one line)
    for a bad file or none at all."""
    texts = list(o["prompt_texts"])
    if o["prompts_file"]:
        texts += read_prompts_file(o["prompts_file"])
    if not texts:
        raise ValueError("no prompt: give --prompt TEXT or --prompts FILE.jsonl")
    return texts


def setup_from_options(o: dict, tp=None):
    """(setup, prompts) from the decode options; ValueError (one line) on bad input. ``tp``: this rank's group in a
    ``--tp N`` decode (runtime/tp; the target is then this rank's slice)."""
    from .session import build_setup

    texts = prompts_from_options(o)
    faults = tuple(o.get("faults") or ())
    if not o.get("tree_budget") and (o.get("tree_topk") is not None or o.get("tree_builder") == "gpu"):
        raise ValueError("--tree-topk / --tree-builder need tree mode: give --tree-budget N (N > 0)")
    if o.get("tree_builder") == "gpu" and "cpu-tree-build" in faults:
        raise ValueError("--tree-builder gpu contradicts --fault cpu-tree-build (= --tree-builder cpu-heapq)")
    setup = build_setup(o["preset"], o["model_dir"], o["draft_dir"], seed=o["seed"], preset_dir=o.get("preset_dir"),
                        block_size=o["block_size"],
                        page_size=o["page_size"], window=o["window"], batch_size=o["batch_size"],
                        max_seq_len=o["max_seq_len"], prefill_chunk=o["prefill_chunk"], scheduler=o["scheduler"],
                        device=o["device"], dtype=o["dtype"], cuda_graphs=False if o["no_graphs"] else None,
                        faults=tuple(o.get("faults") or ()) or None, tree_budget=o.get("tree_budget"),
                        tree_topk=o.get("tree_topk"), tree_builder=o.get("tree_builder"),
                        kernels=o.get("kernels"), graph_buckets=o.get("graph_buckets"),
                        tensor_parallel=o.get("tensor_parallel"), late_rank_ms=o.get("late_rank_ms"), tp=tp)
    return setup, texts


def _threads(device: str) -> None:
    import torch

    if device == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)  # decode steps are tiny: one thread beats spinning OpenMP workers on a busy CPU


def decode_here(o: dict, check_exact: bool, tp=None, progress: bool = True) -> dict:
    """``gaptrace decode`` in this process (or in one rank of ``--tp N``, ``tp`` its group): the run_decode result
    dictionary. ``progress``: a tqdm bar on stderr (rank 0 only under --tp). ValueError (one line) on bad input."""
    from tqdm import tqdm

    from .session import encode_prompts, run_decode

    _threads(o["device"])
    setup, texts = setup_from_options(o, tp)
    encode_prompts(setup, texts, o["max_new_tokens"])  # reject bad prompts before building the engine
    note = " [acceptance simulated]" if setup.simulated else ""
    tree = (f" tree N={setup.rcfg.tree_budget} k={setup.rcfg.tree_topk} "
            f"{'cpu-heapq' if setup.rcfg.cpu_tree_build else 'gpu'}" if setup.rcfg.tree else "")
    tps = f" tp={setup.rcfg.tensor_parallel}" if setup.rcfg.tensor_parallel > 1 else ""
    bar = tqdm(total=len(texts) * o["max_new_tokens"], unit="tok", file=sys.stderr, mininterval=0.5,
               disable=not progress,
               desc=f"decode {setup.preset.name} {setup.rcfg.scheduler} B={setup.rcfg.block_size}{tree}{tps}{note}")
    try:
        return run_decode(setup, texts, o["max_new_tokens"], check_exact=check_exact, on_tokens=bar.update)
    finally:
        bar.close()


def decode_rank(tp, o: dict, check_exact: bool) -> dict:
    """One rank of ``gaptrace decode --tp N`` (run by runtime.tp.spawn_ranks): :func:`decode_here`, the bar on
    rank 0."""
    return decode_here(o, check_exact, tp, progress=tp.rank == 0)


def decode_ranks(o: dict, check_exact: bool) -> dict:
    """``gaptrace decode --tp N``: N rank processes; rank 0's result, after checking that every rank emitted the
    same tokens (they take the same accept decisions by construction, DESIGN.md "Tensor parallelism"). ValueError
    (one line) on bad input in a rank, or ranks that disagree."""
    from .tp import spawn_ranks

    prompts_from_options(o)  # the cheap checks before N processes start
    results = spawn_ranks(decode_rank, o["tensor_parallel"], o["device"], (o, check_exact))
    tokens = [[r["tokens"] for r in res["requests"]] for res in results]
    bad = next((i for i, t in enumerate(tokens) if t != tokens[0]), None)
    if bad is not None:
        raise ValueError(f"--tp {len(results)}: rank {bad} emitted other tokens than rank 0")
    return results[0]


@click.command("decode")
@decode_options
@click.option("--check-exact", is_flag=True, help="Also run the target's plain greedy decoding and compare.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def decode(check_exact: bool, as_json: bool, **o) -> None:
    """Block-speculative decoding (draft block, one verify forward, greedy accept) of one or more prompts."""
    try:
        result = decode_ranks(o, check_exact) if o["tensor_parallel"] > 1 else decode_here(o, check_exact)
    except ValueError as e:  # ConfigError, CheckpointError, RequestError, bad files, a rank's error
        fail(str(e))
    note = " [acceptance simulated]" if result["simulated_acceptance"] else ""
    summary = (f"tau {result['tau']:.2f} over {result['rounds']} rounds, {result['tokens_per_s']:.1f} tok/s, "
               f"TPOT {result['tpot_ms']:.2f} ms, weights: {result['weights']}{note}")
    if "exact_match_rate" in result:
        summary += f", exact {sum(r['exact'] for r in result['requests'])}/{len(result['requests'])}"
    click.echo(summary, err=True)
    if as_json:
        click.echo(json.dumps(result, indent=1))
        return
    for i, r in enumerate(result["requests"]):
        if len(result["requests"]) > 1:
            click.echo(f"=== request {i + 1} (tau {r['tau'] or 0:.2f}) ===")
        # generated text is model output: controls (BEL, CR, ESC) escaped, line breaks and tabs kept
        click.echo(escape_controls(r["prompt"] + r["text"]))


@click.command("capture")
@decode_options
@click.option("--warmup-rounds", type=click.IntRange(1), default=40, show_default=True,
              help="Unprofiled rounds before the profiler is armed (after graph capture and prewarm); the sidecar "
                   "keeps the last 30 of their periods outside the first quarter (the unprofiled reference).")
@click.option("--rounds", "active_rounds", type=click.IntRange(1), default=12, show_default=True,
              help="Verify rounds recorded by the profiler.")
@click.option("--shrink-at-round", type=click.IntRange(1), default=None, metavar="N",
              help="After round N, cut the last half of the running requests (floor(n/2) of them, by slot): they "
                   "finish at their next read, so the batch shrinks into a smaller bucket two rounds later (a new "
                   "batch shape inside the profiled rounds, e.g. for --fault jit-new-shape).")
@click.option("--queue", is_flag=True,
              help="Keep every prompt when there are more than --batch-size: the rest wait and are admitted "
                   "(prefilled) as requests finish, inside the profiled rounds (with a small --max-new-tokens).")
@click.option("-o", "--output", required=True, metavar="TRACE.json.gz",
              help="The Kineto trace to write; the sidecar TRACE.gaptrace.json goes next to it. With --tp N: a "
                   "directory, which gets one trace and sidecar per rank (DIR/DIR.rank<r>.json.gz, "
                   "DIR.rank<r>.gaptrace.json): gaptrace analyze DIR analyses the ranks as a fleet (--merged: as "
                   "one multi-rank trace).")
def capture(warmup_rounds: int, active_rounds: int, shrink_at_round: int | None, queue: bool, output: str,
            **o) -> None:
    """Capture a torch.profiler trace of the runtime's steady decode (Python stacks, CUDA sync events where
    supported), plus a sidecar with the config, τ per round, graph node counts and unprofiled timings. After the
    profiled rounds the same prompts are decoded again, unprofiled, to time the rounds at the profiled rounds'
    positions (not with --queue): the measured round the predictions are checked against.

    --max-new-tokens defaults to enough tokens for every request to outlive the capture; fewer prompts than
    --batch-size are repeated to fill the batch, more are cut to one batch unless --queue."""
    from .capture_run import capture_inputs, make_rank_directory, rank_trace_paths

    from gaptrace.capture import sidecar_path
    from gaptrace.outputs import resolve_output

    if shrink_at_round is not None and shrink_at_round > warmup_rounds + active_rounds:
        fail(f"--shrink-at-round {shrink_at_round} is after the capture's last round ({warmup_rounds} warm-up + 1 + "
             f"{active_rounds} profiled): the batch would never shrink inside it")
    # both outputs checked before the progress bar and the decode: links followed; devices, FIFOs, directories,
    # unwritable directories and the inputs (prompts file, model directories) refused
    inputs = capture_inputs(o.get("prompts_file"), (o.get("model_dir"), o.get("draft_dir")))
    world = o["tensor_parallel"]
    try:
        paths = rank_trace_paths(output, world) if world > 1 else [output]
    except ValueError as e:
        fail(str(e))
    made = make_rank_directory(paths) if world > 1 else False
    try:
        try:
            paths = [resolve_output(p, inputs) for p in paths]
            for p in paths:
                resolve_output(sidecar_path(p), inputs)
        except ValueError as e:
            fail(str(e))
        if not paths[0].endswith((".json", ".json.gz")):
            fail(f"{paths[0]}: the trace must be named .json or .json.gz")
        explicit_tokens = o["max_new_tokens"] if "--max-new-tokens" in sys.argv else None
        job = (o, paths, warmup_rounds, active_rounds, explicit_tokens, shrink_at_round, queue, inputs)
        try:
            if world > 1:
                from .tp import spawn_ranks

                prompts_from_options(o)  # the cheap checks before N processes start
                sides = spawn_ranks(capture_rank, world, o["device"], job)
            else:
                sides = [capture_here(*job)]
        except ValueError as e:
            fail(str(e))
    finally:
        if made and not os.listdir(os.path.dirname(paths[0])):  # nothing written: leave no empty directory
            os.rmdir(os.path.dirname(paths[0]))
    side = sides[0]
    note = " [acceptance simulated]" if side["config"].get("simulated_acceptance") is not None else ""
    taus = [r["tau"] for r in side["rounds"] if r["tau"] is not None]
    where = escape_line(paths[0]) if world == 1 else (
        f"{escape_line(os.path.dirname(paths[0]))} ({world} ranks: "
        f"{', '.join(escape_line(os.path.basename(p)) for p in paths)})")
    msg = f"wrote {where} ({len(side['rounds'])} rounds, mean tau {sum(taus) / max(len(taus), 1):.2f}{note})"
    if o["device"] == "cpu":
        msg += "; on the CPU the trace has no device activity (occupancy needs --device cuda)"
    click.echo(msg, err=True)


def capture_here(o: dict, paths: list[str], warmup_rounds: int, active_rounds: int, explicit_tokens: int | None,
                 shrink_at_round: int | None, queue: bool, inputs: tuple, tp=None) -> dict:
    """``gaptrace capture`` in this process, or in rank ``tp.rank`` of ``--tp N`` (its trace ``paths[tp.rank]``):
    the sidecar dictionary written. ValueError (one line) on bad input or a failed write."""
    from tqdm import tqdm

    from .capture_run import capture_decode, check_queue

    _threads(o["device"])
    setup, texts = setup_from_options(o, tp)
    check_queue(setup.rcfg.batch_size, len(texts), explicit_tokens, queue)  # before the progress bar
    note = " [acceptance simulated]" if setup.simulated else ""
    tps = f" tp={setup.rcfg.tensor_parallel}" if setup.rcfg.tensor_parallel > 1 else ""
    total = warmup_rounds + 1 + active_rounds
    bar = tqdm(total=total, unit="round", file=sys.stderr, disable=tp is not None and tp.rank != 0,
               desc=f"capture {setup.preset.name} {setup.rcfg.scheduler} bs={setup.rcfg.batch_size} "
                    f"B={setup.rcfg.block_size}{tps}{note}")
    try:
        return capture_decode(setup, texts, paths[0 if tp is None else tp.rank], warmup_rounds, active_rounds,
                              explicit_tokens, shrink_at_round=shrink_at_round, queue=queue, inputs=inputs,
                              on_round=lambda i: bar.update(1) if i <= total else None)
    finally:
        bar.close()


def capture_rank(tp, *job) -> dict:
    """One rank of ``gaptrace capture --tp N`` (run by runtime.tp.spawn_ranks): :func:`capture_here`."""
    return capture_here(*job, tp=tp)
