"""Train the shipped tiny model pair (hybrid target + plain-attention draft) and measure its accept length τ.

    python scripts/train_pair.py --device cuda                      # the shipped pair (about 5 minutes on an H200)
    python scripts/train_pair.py --device cuda --plain-attention    # transformers-loadable variant
    python scripts/train_pair.py --device cpu --dry-run             # a few steps at toy sizes, to catch typos

Corpus: CPython's standard library, split by the path rule of scripts/tinycorpus.py; tokenizer:
fixtures/models/tokenizer.json (scripts/train_tokenizer.py). Each document is a file followed by EOS.

1. Target: next-token cross-entropy on random windows of the TRAIN split (AdamW, warm-up then cosine, bf16
   autocast on CUDA, time-budgeted: the schedule runs on progress = max(step / max_steps, elapsed / seconds)).
   The weights with the lowest held-out loss (evaluated every ``--eval-every`` steps) are kept.
   Linear-attention layers train through runtime/models/gdn_chunk.py on CUDA (``--linear-impl``): fla-core 0.6.0
   refuses its gated-delta-rule backward on Hopper with Triton < 3.7.1 (the H200 image has 3.6.0).
   Default: a hybrid, gated-delta-rule linear attention interleaved with full attention (3 : 1);
   ``--plain-attention``: full attention in every layer (a standard Qwen3-style checkpoint).
2. Draft: distilled from the target's logits, forward KL(p_target || q_draft) per token, on the same windows;
   kept at the lowest held-out KL. τ depends on how often the draft's argmax equals the target's, so the
   held-out top-1 agreement is logged too.
3. Both are saved in bf16 with gaptrace.runtime.models.checkpoint.save_checkpoint (config.json +
   model.safetensors), reloaded with load_checkpoint, and τ is measured on fixtures/prompts/heldout.jsonl with
   greedy block-speculative decoding at B = 4, 8, 12 (:func:`spec_decode`, no cache: every draft step and every
   verify recomputes the full forward; an evaluation, not a runtime). τ = tokens emitted per verify round =
   accepted prefix + 1 bonus token (DESIGN.md "Block-speculative decoding").
4. fixtures/models/TRAINING.md (TRAINING-plain.md with ``--plain-attention``, checkpoints then in
   tiny-target-plain / tiny-draft-plain) records the command, corpus rule, sizes, steps, losses, the τ table, wall time, GPU.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import tinycorpus  # noqa: E402

TARGET_LIMIT_BYTES = 30_000_000
DRAFT_LIMIT_BYTES = 5_000_000
BLOCK_SIZES = (4, 8, 12)


def _import_runtime():
    """(ModelConfig, Transformer, save_checkpoint, load_checkpoint) from gaptrace.runtime.

    Works from an editable install or from a bare checkout (the GPU machine): ``gaptrace.runtime`` is the repo's
    ``runtime/`` folder (pyproject package-dir), registered by hand when the distribution is not installed.
    """
    try:
        import gaptrace.runtime  # noqa: F401
    except ImportError:
        import importlib.util

        sys.path.insert(0, str(REPO))
        import gaptrace

        spec = importlib.util.spec_from_file_location(
            "gaptrace.runtime", REPO / "runtime" / "__init__.py", submodule_search_locations=[str(REPO / "runtime")]
        )
        mod = importlib.util.module_from_spec(spec)
        sys.modules["gaptrace.runtime"] = mod
        gaptrace.runtime = mod
        spec.loader.exec_module(mod)
    from gaptrace.runtime.config import ModelConfig
    from gaptrace.runtime.models.checkpoint import load_checkpoint, save_checkpoint
    from gaptrace.runtime.models.model import Transformer

    return ModelConfig, Transformer, save_checkpoint, load_checkpoint


# ----------------------------------------------------------------------------------------------------- configs

def model_config(role: str, vocab_size: int, eos_id: int, plain_attention: bool, dry_run: bool):
    """The ModelConfig of the tiny target or draft: the runtime's ``tiny`` preset (gaptrace.runtime.presets).

    Target: 8 layers, hidden 384, linear : full = 3 : 1 (about 14 M parameters, about 28 MB in bf16);
    ``plain_attention``: the same shape with full attention in every layer (model_type qwen3). Draft: 3
    full-attention layers, hidden 192, tied embeddings (about 2.1 M parameters). ``dry_run`` shrinks both for a
    CPU smoke run.
    """
    from gaptrace.runtime.config import FULL, ModelConfig
    from gaptrace.runtime.presets import tiny_draft_config, tiny_target_config

    base = tiny_target_config if role == "target" else tiny_draft_config
    d = dataclasses.asdict(base(vocab_size=vocab_size, eos_token_id=eos_id))
    if dry_run:
        d.update(hidden_size=64, intermediate_size=128, head_dim=32, num_attention_heads=2, num_key_value_heads=1,
                 linear_num_key_heads=0, linear_num_value_heads=0, linear_key_head_dim=0, linear_value_head_dim=0)
        if role == "target":
            d.update(num_hidden_layers=4, layer_types=d["layer_types"][:4])
    if role == "target" and plain_attention:
        d["layer_types"] = [FULL] * d["num_hidden_layers"]
    d["model_type"] = ""  # re-derived: gaptrace_hybrid, or qwen3 for an all-full-attention model
    return ModelConfig(**d)


# -------------------------------------------------------------------------------------------------------- data

def load_corpus(tokenizer_path: Path, limit_files: int | None = None):
    """(train_ids, heldout_ids, info): the two splits tokenised, each file followed by EOS, as int64 CPU tensors."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    eos = tok.token_to_id(tinycorpus.EOS_TOKEN)
    root = tinycorpus.stdlib_root()
    train, heldout = tinycorpus.split_files(root)
    if limit_files:
        train, heldout = train[:limit_files], heldout[: max(2, limit_files // 10)]
    out = []
    for files in (train, heldout):
        enc = tok.encode_batch([tinycorpus.read_text(root, f) for f in files])
        ids = [i for e in enc for i in (*e.ids, eos)]
        out.append(torch.tensor(ids, dtype=torch.int64))
    info = {"stdlib": str(root), "python": platform.python_version(), "train_files": len(train),
            "heldout_files": len(heldout), "train_tokens": len(out[0]), "heldout_tokens": len(out[1])}
    return out[0], out[1], tok, info


def random_windows(ids: torch.Tensor, batch_size: int, seq_len: int, gen: torch.Generator):
    """Inputs and next-token labels [batch_size, seq_len] from uniformly random offsets into ``ids`` (on its device)."""
    starts = torch.randint(0, len(ids) - seq_len - 1, (batch_size,), generator=gen, device="cpu").to(ids.device)
    idx = starts[:, None] + torch.arange(seq_len + 1, device=ids.device)
    win = ids[idx]
    return win[:, :-1], win[:, 1:]


def heldout_windows(ids: torch.Tensor, seq_len: int, max_windows: int):
    """Non-overlapping consecutive windows of the held-out split: (inputs, labels), each [n, seq_len]."""
    n = min(max_windows, (len(ids) - 1) // seq_len)
    win = ids[: n * seq_len + 1]
    return win[:-1].view(n, seq_len), win[1:].view(n, seq_len)


# ---------------------------------------------------------------------------------------------------- training

def _autocast(device: str):
    return torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else torch.autocast("cpu", enabled=False)


def _lr(progress: float, step: int, peak: float, warmup: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine from ``peak`` to peak/10 over progress in [0, 1]."""
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


@torch.no_grad()
def heldout_metrics(model, val_x, val_y, device, teacher=None, batch: int = 16) -> dict:
    """Held-out loss: cross-entropy (nats/token); with ``teacher``, also KL(teacher || model) and top-1 agreement."""
    model.eval()
    ce_sum = kl_sum = agree = n = 0.0
    for i in range(0, len(val_x), batch):
        x, y = val_x[i:i + batch].to(device), val_y[i:i + batch].to(device)
        with _autocast(device):
            logits = model(x).float()
            t_logits = teacher(x).float() if teacher is not None else None
        ce_sum += F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum").item()
        if t_logits is not None:
            kl_sum += F.kl_div(logits.log_softmax(-1), t_logits.log_softmax(-1), log_target=True, reduction="sum").item()
            agree += (logits.argmax(-1) == t_logits.argmax(-1)).sum().item()
        n += y.numel()
    model.train()
    out = {"ce": ce_sum / n}
    if teacher is not None:
        out.update(kl=kl_sum / n, top1_agreement=agree / n)
    return out


def train(model, train_ids, val, args, device, *, seconds: float, max_steps: int, peak_lr: float, teacher=None,
          name: str, log) -> dict:
    """Train ``model`` in place (cross-entropy, or KL to ``teacher``'s logits when given); keep the best held-out.

    Returns the stats dict: steps, tokens, wall seconds, final train loss, best held-out metrics and step.
    """
    gen = torch.Generator().manual_seed(args.seed + (1 if teacher is not None else 0))
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=peak_lr, betas=(0.9, 0.95), eps=1e-8, fused=(device == "cuda"))
    key = "kl" if teacher is not None else "ce"

    def loss_of(x, y):
        with _autocast(device):
            logits = model(x)
            if teacher is None:
                return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
            with torch.no_grad():
                t_logp = teacher(x).float().log_softmax(-1)
        return F.kl_div(logits.float().log_softmax(-1).flatten(0, 1), t_logp.flatten(0, 1), log_target=True,
                        reduction="batchmean")

    # one untimed forward/backward first (allocator warm-up, any kernel compilation), outside the time budget
    t_compile = time.perf_counter()
    x, y = random_windows(train_ids, args.batch_size, args.seq_len, gen)
    loss_of(x, y).backward()
    opt.zero_grad(set_to_none=True)
    if device == "cuda":
        torch.cuda.synchronize()
    compile_s = time.perf_counter() - t_compile
    log(f"[{name}] warm-up step (kernel compile) {compile_s:.1f} s")

    best = {key: float("inf")}
    best_state, best_step = None, 0
    t0 = time.perf_counter()
    step, loss_ema, progress = 0, None, 0.0
    while progress < 1.0:
        lr = _lr(progress, step, peak_lr, args.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = random_windows(train_ids, args.batch_size, args.seq_len, gen)
        loss = loss_of(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if step % 25 == 0 or step == max_steps or loss_ema is None:
            li = loss.item()  # deliberate sync: progress below reads the wall clock
            loss_ema = li if loss_ema is None else 0.9 * loss_ema + 0.1 * li
        elapsed = time.perf_counter() - t0
        progress = max(step / max_steps, elapsed / seconds)
        if step % args.eval_every == 0 or progress >= 1.0:
            m = heldout_metrics(model, *val, device, teacher=teacher)
            if m[key] < best[key]:
                best, best_step = m, step
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            log(f"[{name}] step {step:5d}  {elapsed:6.1f} s  lr {lr:.2e}  train {key} {loss_ema:.4f}  "
                + "  ".join(f"held-out {k} {v:.4f}" for k, v in m.items()))
    model.load_state_dict(best_state)
    wall = time.perf_counter() - t0
    return {"steps": step, "tokens": step * args.batch_size * args.seq_len, "train_seconds": round(wall, 1),
            "compile_seconds": round(compile_s, 1), "final_train_loss": round(loss_ema, 4), "best_step": best_step,
            "heldout": {k: round(v, 4) for k, v in best.items()}, "peak_lr": peak_lr}


@torch.no_grad()
def check_linear_impl(model, tokens: torch.Tensor, bf16: bool) -> float | None:
    """Relative L2 difference of ``model``'s logits on ``tokens`` through the installed linear-attention path
    (runtime/models/gdn_chunk.py) against the runtime's own per-token recurrence (gdn.gated_delta_rule_ref); None when
    nothing is installed or the model has no linear layers."""
    from gaptrace.runtime.models import gdn

    if not hasattr(gdn.gated_delta_rule, "_orig") or not model.linear_layers:
        return None
    on = torch.autocast(tokens.device.type, dtype=torch.bfloat16, enabled=bf16)
    with on:
        fast = model(tokens).float()
    patched, gdn.gated_delta_rule = gdn.gated_delta_rule, gdn.gated_delta_rule_ref
    try:
        with on:
            ref = model(tokens).float()
    finally:
        gdn.gated_delta_rule = patched
    return ((fast - ref).norm() / ref.norm()).item()


# ------------------------------------------------------------------------------------------- evaluation (τ)

@torch.no_grad()
def spec_decode(target, draft, prompts: list[list[int]], block_size: int, max_new_tokens: int, eos_id: int,
                device: str) -> dict:
    """Greedy block-speculative decoding of a batch of prompts, without a cache; returns τ and the tokens.

    Every request keeps its own length L in a right-padded buffer (causal models: padding after L changes
    nothing before it). A round: the draft proposes ``block_size`` tokens greedily (one full forward per token),
    the target scores positions L-1 .. L+B-1 in one forward, the longest prefix where the draft's token equals
    the target's argmax is accepted and the target's next argmax is the bonus token (DESIGN.md "Block-speculative
    decoding"). A request stops after ``max_new_tokens`` tokens or EOS; its last round still counts whole (τ is a
    property of the round).
    The output equals the target's plain greedy decoding up to floating-point ties.

    Returns {"tau": emitted / rounds over all requests, "rounds", "emitted", "outputs": [token lists]}.
    """
    bs, B = len(prompts), block_size
    lens = torch.tensor([len(p) for p in prompts], device=device)
    start = lens.clone()
    width = int(lens.max()) + max_new_tokens + 2 * B + 1  # a finished row's L can reach start + max_new + B
    buf = torch.full((bs, width), eos_id, dtype=torch.long, device=device)
    for i, p in enumerate(prompts):
        buf[i, : len(p)] = torch.tensor(p, device=device)
    rows = torch.arange(bs, device=device)
    cols = torch.arange(B + 1, device=device)
    active = torch.ones(bs, dtype=torch.bool, device=device)
    rounds = torch.zeros(bs, dtype=torch.long, device=device)
    emitted = torch.zeros(bs, dtype=torch.long, device=device)

    def upto(n):  # forward width, rounded up to 64 so that kernels see few distinct shapes
        return min(width, -(-int(n) // 64) * 64)

    while bool(active.any()):
        cur = buf.clone()
        for j in range(B):
            logits = draft(cur[:, : upto(lens.max() + j)])
            cur[rows, lens + j] = logits[rows, lens + j - 1].argmax(-1)
        logits = target(cur[:, : upto(lens.max() + B)])
        idx = lens[:, None] - 1 + cols                                  # [bs, B+1]
        pred = logits[rows[:, None], idx].argmax(-1)                   # target's greedy token at each position
        drafted = cur[rows[:, None], idx[:, 1:]]                        # [bs, B]
        accepted = (drafted == pred[:, :B]).long().cumprod(1).sum(1)   # longest matching prefix
        n_emit = accepted + 1
        keep = (cols[None, :] < n_emit[:, None]) & active[:, None]
        buf[rows[:, None].expand_as(idx)[keep], (idx + 1)[keep]] = pred[keep]  # accepted tokens == pred there
        eos_hit = ((pred == eos_id) & keep).any(1)
        rounds += active.long()
        emitted += n_emit * active.long()
        lens = torch.where(active, lens + n_emit, lens)
        active &= (lens - start < max_new_tokens) & ~eos_hit
    outputs = [buf[i, int(start[i]): int(lens[i])].tolist() for i in range(bs)]
    return {"tau": emitted.sum().item() / rounds.sum().item(), "rounds": rounds.sum().item(),
            "emitted": emitted.sum().item(), "outputs": outputs}


@torch.no_grad()
def greedy_decode(model, prompt: list[int], max_new_tokens: int, device: str) -> list[int]:
    """The model's plain greedy continuation of one prompt (no cache), for the exactness check."""
    ids = torch.tensor([prompt], device=device)
    for _ in range(max_new_tokens):
        nxt = model(ids)[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], 1)
    return ids[0, len(prompt):].tolist()


def evaluate_tau(stats, load_checkpoint, target_dir, draft_dir, prompt_ids, val, eos, eval_dtype, args, log):
    """Reload the saved pair in ``eval_dtype`` and fill stats["tau"] (one row per B) and stats["exactness"]."""
    device = args.device
    target = load_checkpoint(target_dir, device, eval_dtype).eval()
    draft = load_checkpoint(draft_dir, device, eval_dtype).eval()
    rel = check_linear_impl(target, val[0][:2, :256].to(device), bf16=False)
    log(f"[tau] {stats['linear_impl']} vs the runtime's per-token recurrence (float32 logits): relative L2 {rel}")
    spec_out = None
    for B in BLOCK_SIZES:
        t0 = time.perf_counter()
        r = spec_decode(target, draft, prompt_ids, B, args.max_new_tokens, eos, device)
        stats["tau"].append({"B": B, "tau": r["tau"], "rounds": r["rounds"], "emitted": r["emitted"]})
        log(f"[tau] B={B:2d}  tau {r['tau']:.3f}  rounds {r['rounds']}  emitted {r['emitted']}  "
            f"({time.perf_counter() - t0:.1f} s)")
        if B == 8:
            spec_out = r["outputs"]
    # the evaluation loop itself: speculative output == plain greedy, on the first prompts
    n_same, n_checked = 0, min(3, len(prompt_ids))
    for i in range(n_checked):
        ref = greedy_decode(target, prompt_ids[i], args.max_new_tokens, device)
        n_same += spec_out[i][: len(ref)] == ref
    stats["exactness"] = (f"B = 8 speculative output equals the target's plain greedy decoding on {n_same} of "
                          f"{n_checked} prompts ({args.max_new_tokens} tokens each, {eval_dtype} on {device}).")
    log(stats["exactness"])


# ---------------------------------------------------------------------------------------------------- report

def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def write_report(path: Path, stats: dict) -> None:
    """fixtures/models/TRAINING.md from the stats dict (written to a temporary name, then renamed)."""
    t, d, c = stats["target"], stats["draft"], stats["corpus"]
    lines = [
        f"# {stats['title']}",
        "",
        f"Trained {stats['date']} on {stats['device_name']} ({stats['torch']}, Python {c['python']}), "
        f"total wall time {stats['wall_seconds']:.0f} s.",
        "",
        "Command (from the repo root):",
        "",
        "```",
        stats["command"],
        "```",
        "",
        "## Corpus",
        "",
        f"CPython {c['python']} standard library at `{c['stdlib']}` (`sysconfig.get_paths()[\"stdlib\"]`): every",
        "`*.py` file, excluding any under a `test/`, `tests/`, `idle_test/`, `site-packages/` directory; a file is",
        "held out when `int(sha256(relpath).hexdigest()[:8], 16) % 20 == 0` (relpath: POSIX, relative to the",
        "stdlib root); scripts/tinycorpus.py. Each file is followed by `<|endoftext|>`.",
        "",
        f"Train: {c['train_files']} files, {c['train_tokens']:,} tokens. Held-out: {c['heldout_files']} files, "
        f"{c['heldout_tokens']:,} tokens. Tokenizer: byte-level BPE, vocab {stats['vocab_size']}, "
        "fixtures/models/tokenizer.json (scripts/train_tokenizer.py, trained on the train split).",
        "",
        "## Models",
        "",
        "| | layers | hidden | parameters | bytes on disk (bf16) | limit | steps | tokens seen | train s | "
        "held-out (best) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, s, lim in (("target", t, TARGET_LIMIT_BYTES), ("draft", d, DRAFT_LIMIT_BYTES)):
        ho = ", ".join(f"{k} {v}" for k, v in s["heldout"].items())
        lines.append(f"| {name} | {s['layers']} | {s['hidden']} | {s['params']:,} | {s['bytes']:,} | {lim:,} | "
                     f"{s['steps']} (best {s['best_step']}) | {s['tokens']:,} | {s['train_seconds']} | {ho} |")
    lines += [
        "",
        f"Target layer types: {t['layer_types']}. Target loss: next-token cross-entropy (nats/token); final train "
        f"loss {t['final_train_loss']}. Draft loss: KL(p_target || q_draft) per token, distilled from the target's "
        f"logits; final train KL {d['final_train_loss']}.",
        "",
        "## Accept length τ",
        "",
        f"Greedy block-speculative decoding on the {stats['n_prompts']} prompts of fixtures/prompts/heldout.jsonl "
        f"(cut from held-out files), {stats['max_new_tokens']} new tokens each, weights reloaded from the saved "
        f"checkpoints in {stats['eval_dtype']} on {stats['eval_device']}. Decoder: {stats['decoder']}. "
        "τ = tokens emitted per verify round (accepted prefix + bonus).",
        "",
        "| B | τ | rounds | tokens emitted | τ / (B+1) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in stats["tau"]:
        lines.append(f"| {row['B']} | {row['tau']:.3f} | {row['rounds']} | {row['emitted']} | "
                     f"{row['tau'] / (row['B'] + 1):.3f} |")
    lines += ["", f"Exactness of the evaluation loop: {stats['exactness']}", ""]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(lines))
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------------------ main

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--plain-attention", action="store_true",
                    help="full attention in every target layer (a transformers-loadable Qwen3-style pair)")
    ap.add_argument("--linear-impl", choices=("auto", "torch-chunk", "runtime"), default="auto",
                    help="gated delta rule for training and evaluation: runtime/models/gdn_chunk.py "
                         "(auto on CUDA: fla's "
                         "backward is refused on Hopper with Triton < 3.7.1) or the runtime's own (auto on CPU)")
    ap.add_argument("--dry-run", action="store_true", help="toy sizes, few steps, few files: a smoke run")
    ap.add_argument("--tokenizer", type=Path, default=REPO / "fixtures/models/tokenizer.json")
    ap.add_argument("--prompts", type=Path, default=REPO / "fixtures/prompts/heldout.jsonl")
    ap.add_argument("--out-dir", type=Path, default=REPO / "fixtures/models")
    ap.add_argument("--target-seconds", type=float, default=150.0)
    ap.add_argument("--draft-seconds", type=float, default=100.0)
    ap.add_argument("--target-steps", type=int, default=2000)
    ap.add_argument("--draft-steps", type=int, default=3000)
    ap.add_argument("--target-lr", type=float, default=2e-3)
    ap.add_argument("--draft-lr", type=float, default=3e-3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--heldout-windows", type=int, default=64, help="held-out windows of --seq-len for the loss")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.dry_run:
        args.target_steps, args.draft_steps, args.eval_every, args.warmup = 6, 4, 3, 2
        args.batch_size, args.seq_len, args.max_new_tokens = 4, 64, 12

    t_start = time.perf_counter()
    device = args.device
    torch.manual_seed(args.seed)
    suffix = "-plain" if args.plain_attention else ""
    target_dir, draft_dir = args.out_dir / f"tiny-target{suffix}", args.out_dir / f"tiny-draft{suffix}"
    log_lines: list[str] = []

    def log(msg: str) -> None:
        print(msg, flush=True)
        log_lines.append(msg)

    ModelConfig, Transformer, save_checkpoint, load_checkpoint = _import_runtime()
    impl = args.linear_impl if args.linear_impl != "auto" else ("torch-chunk" if device == "cuda" else "runtime")
    if impl == "torch-chunk":
        from gaptrace.runtime.models import gdn, gdn_chunk

        gdn_chunk.install(gdn, devices=(device,))
    linear_impl = {"torch-chunk": "chunked PyTorch gated delta rule (runtime/models/gdn_chunk.py)",
                   "runtime": "runtime's own dispatch (gdn.gated_delta_rule)"}[impl]
    train_ids, heldout_ids, tok, corpus = load_corpus(args.tokenizer, limit_files=40 if args.dry_run else None)
    eos = tok.token_to_id(tinycorpus.EOS_TOKEN)
    log(f"corpus: {json.dumps(corpus)}")
    train_ids = train_ids.to(device)
    val = heldout_windows(heldout_ids, args.seq_len, 8 if args.dry_run else args.heldout_windows)

    stats: dict = {"corpus": corpus, "vocab_size": tok.get_vocab_size(), "linear_impl": linear_impl}
    log(f"linear attention through the {linear_impl}")
    models = {}
    for role in ("target", "draft"):
        cfg = model_config(role, tok.get_vocab_size(), eos, args.plain_attention, args.dry_run)
        torch.manual_seed(args.seed + (role == "draft"))
        model = Transformer(cfg).to(device)
        n_params = sum(p.numel() for p in model.parameters())
        log(f"[{role}] {n_params:,} parameters, layer types {cfg.layer_types}")
        if role == "target":
            rel = check_linear_impl(model, val[0][:2, :128].to(device), bf16=device == "cuda")
            log(f"[target] {stats['linear_impl']} vs the runtime's per-token recurrence (logits): relative L2 {rel}")
            s = train(model, train_ids, val, args, device, seconds=args.target_seconds, max_steps=args.target_steps,
                      peak_lr=args.target_lr, name=role, log=log)
        else:
            teacher = models["target"]
            teacher.eval()
            s = train(model, train_ids, val, args, device, seconds=args.draft_seconds, max_steps=args.draft_steps,
                      peak_lr=args.draft_lr, teacher=teacher, name=role, log=log)
        out = target_dir if role == "target" else draft_dir
        save_checkpoint(copy.deepcopy(model).to(torch.bfloat16), cfg, out, max_shard_bytes=16 * 2**20)  # shards < 20 MiB for git
        s.update(params=n_params, bytes=_dir_bytes(out), layers=cfg.num_layers, hidden=cfg.hidden_size,
                 layer_types=list(cfg.layer_types), config=dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg)
                 else None)
        log(f"[{role}] saved {out} ({s['bytes']:,} bytes): {json.dumps({k: s[k] for k in ('steps', 'best_step', 'heldout')})}")
        stats[role] = s
        models[role] = model

    # τ from the SAVED checkpoints, reloaded in float32
    eval_dtype = torch.float32
    prompts = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    prompt_ids = [tok.encode(p["prompt"]).ids for p in prompts][: 3 if args.dry_run else None]
    stats.update(tau=[], exactness="not measured (the evaluation failed; see the log)")
    try:
        evaluate_tau(stats, load_checkpoint, target_dir, draft_dir, prompt_ids, val, eos, eval_dtype, args, log)
    except Exception as e:  # keep the checkpoints and the report; τ can be re-measured from the saved pair
        import traceback

        log("[tau] FAILED:\n" + traceback.format_exc())
    stats.update(
        title="The tiny pair" + (" (plain attention)" if args.plain_attention else ""),
        date=time.strftime("%Y-%m-%d"), torch=f"torch {torch.__version__}",
        device_name=torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "CPU",
        command="python scripts/train_pair.py " + " ".join(sys.argv[1:] if argv is None else argv),
        n_prompts=len(prompt_ids), max_new_tokens=args.max_new_tokens, eval_dtype=str(eval_dtype).removeprefix("torch."),
        eval_device=device,
        decoder=("scripts/train_pair.py spec_decode (no cache, full forward per draft step and per verify; "
                 f"linear-attention layers through the {stats['linear_impl']})"),
        wall_seconds=time.perf_counter() - t_start,
    )
    for role, lim in (("target", TARGET_LIMIT_BYTES), ("draft", DRAFT_LIMIT_BYTES)):
        if stats[role]["bytes"] > lim:
            log(f"WARNING: {role} is {stats[role]['bytes']:,} bytes, over the {lim:,} limit")
    report = args.out_dir / f"TRAINING{suffix}.md"
    write_report(report, stats)
    (args.out_dir / f"training{suffix}.json").write_text(json.dumps(stats, indent=1, default=str))
    log(f"wrote {report}; total {stats['wall_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
