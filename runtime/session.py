"""From options to a running decode: load the pair (a preset's shipped weights, a user's checkpoint, or random
init), the tokenizer and the runtime config; run the engine; check exactness; build the result dictionary and the
configuration dictionary (``run_config``, the one builder of it: ``gaptrace decode --json`` and the capture
sidecar). Shared by ``gaptrace decode`` and ``gaptrace capture`` (capture_run.py)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .config import ConfigError, RuntimeConfig
from .engine import Engine, check_request
from .models.checkpoint import CheckpointError, load_checkpoint, read_config
from .models.model import Transformer
from .presets import Preset, check_preset_dir, get_preset
from .spec.reference import greedy_reference
from .spec.state import DecodeState
from .tokenizer import load_tokenizer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


@dataclass
class DecodeSetup:
    """Everything a decode needs, and how it was obtained (said in the output)."""

    preset: Preset
    target: Transformer
    draft: Transformer
    tokenizer: object
    rcfg: RuntimeConfig
    weights: str                 # where the weights came from
    simulated: bool              # acceptance simulated on the device (bench): outputs are not greedy-exact

    @property
    def eos_token_id(self):
        return self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else \
            self.target.config.eos_token_id


def _has_weights(d: Path | None) -> bool:
    return d is not None and (d / "config.json").is_file() and any(d.glob("*.safetensors"))


def build_setup(preset: str = "tiny", model_dir: str | None = None, draft_dir: str | None = None,
                seed: int = 0, preset_dir: str | None = None, tp=None, **runtime) -> DecodeSetup:
    """Resolve a preset plus overrides (RuntimeConfig fields; None = the preset's) into models and config.
    ``preset_dir``: where the preset's shipped pair is (presets.get_preset; default the repository's
    fixtures/models), needed unless ``model_dir`` is given. ``tp``: this rank's :class:`~.tp.group.TPGroup` when
    ``tensor_parallel`` N > 1 (a process :func:`~.tp.launch.spawn_ranks` started): every rank loads (or draws, from
    the same seed) the whole pair, then keeps its slice of the target (:func:`~.tp.shard.shard_target`) and the
    whole draft (replicated).

    Raises ConfigError / CheckpointError (ValueErrors, one line) on bad input, and ConfigError when
    ``tensor_parallel`` > 1 outside a rank of that many, or the target's heads do not split into them.
    """
    p = get_preset(preset, preset_dir)
    if draft_dir is not None and model_dir is None:
        raise ConfigError("--draft-dir needs --model-dir (the target it drafts for); the preset brings its own pair")
    if model_dir is None:
        check_preset_dir(p)
    over = {k: v for k, v in runtime.items() if v is not None}
    if over.get("page_size", 0) > 0 and "max_seq_len" not in over:  # keep the preset's context, in whole pages
        over["max_seq_len"] = -(-p.runtime.max_seq_len // over["page_size"]) * over["page_size"]
    rcfg = p.runtime.replace(seed=seed, **over)
    if rcfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda, but torch sees no CUDA device")
    device, dtype = torch.device(rcfg.device), DTYPES[rcfg.dtype]
    simulated = p.simulated and model_dir is None
    if model_dir is not None:  # the configs first (cheap): a decode state that cannot fit is refused before loading
        cfgs = (read_config(model_dir), read_config(draft_dir) if draft_dir else None)
    elif _has_weights(p.target_dir) and _has_weights(p.draft_dir):
        cfgs = (read_config(p.target_dir), read_config(p.draft_dir))
    else:
        cfgs = (p.target, p.draft)
    ranks = rcfg.tensor_parallel
    if ranks > 1:
        from .tp.shard import shard_config, shard_target
        if tp is None or tp.world != ranks:
            raise ConfigError(f"--tp {ranks} runs one process per rank (runtime.tp.spawn_ranks); this process is "
                              f"{'not a rank' if tp is None else f'a rank of {tp.world}'}")
        # a rank holds its slice of the target (refused here, before loading, when the heads do not split); on the
        # CPU the ranks share the host's memory
        check_memory(shard_config(cfgs[0], ranks), cfgs[1] or cfgs[0], rcfg,
                     None if rcfg.device == "cuda" else available_bytes("cpu") // ranks)
    else:
        check_memory(cfgs[0], cfgs[1] or cfgs[0], rcfg)
    if model_dir is not None:
        target = load_checkpoint(model_dir, device, dtype).eval()
        draft = load_checkpoint(draft_dir, device, dtype).eval() if draft_dir else target
        weights = f"checkpoint {model_dir}" + (f", draft {draft_dir}" if draft_dir else ", the target as its own draft")
        tok_dirs = (Path(model_dir) / "tokenizer.json", p.tokenizer)
    elif _has_weights(p.target_dir) and _has_weights(p.draft_dir):
        target = load_checkpoint(p.target_dir, device, dtype).eval()
        draft = load_checkpoint(p.draft_dir, device, dtype).eval()
        weights = f"checkpoints {p.target_dir.name} + {p.draft_dir.name}"
        tok_dirs = (p.tokenizer,)
    else:
        torch.manual_seed(seed)
        with torch.device(device):
            target, draft = Transformer(p.target).to(dtype).eval(), Transformer(p.draft).to(dtype).eval()
        weights = "random init (no shipped weights)" if p.target_dir is not None else "random init"
        tok_dirs = (p.tokenizer,)
    if draft.config.vocab_size != target.config.vocab_size:
        raise CheckpointError(f"draft vocabulary {draft.config.vocab_size} != target {target.config.vocab_size}")
    if rcfg.tree and rcfg.tree_topk > draft.config.vocab_size:
        raise ConfigError(f"tree top-k {rcfg.tree_topk} exceeds the vocabulary ({draft.config.vocab_size})")
    if ranks > 1:  # the draft stays whole on every rank (with --model-dir alone it is the whole target)
        target = shard_target(target, tp)
    tokenizer = load_tokenizer(*tok_dirs, vocab_size=target.config.vocab_size)
    return DecodeSetup(p, target, draft, tokenizer, rcfg, weights, simulated)


def available_bytes(device: str) -> int:
    """Memory a decode may still take: free device memory on CUDA, else the host's MemAvailable."""
    if device == "cuda":
        return int(torch.cuda.mem_get_info()[0])
    from gaptrace.loader import default_memory_limit_bytes

    return default_memory_limit_bytes()


def check_memory(target_cfg, draft_cfg, rcfg: RuntimeConfig, available: int | None = None) -> None:
    """ConfigError (one line: the need and what is available) when the KV cache and decode state of ``rcfg``
    (:meth:`DecodeState.nbytes`) exceed the memory available (``available`` bytes, default
    :func:`available_bytes`): a batch of 10**6 slots is refused here, before anything is allocated."""
    need = DecodeState.nbytes(target_cfg, draft_cfg, rcfg, torch.empty(0, dtype=DTYPES[rcfg.dtype]).element_size())
    have = available_bytes(rcfg.device) if available is None else available
    if need > have:
        raise ConfigError(f"batch size {rcfg.batch_size} x max_seq_len {rcfg.max_seq_len}: the KV cache and decode "
                          f"state need about {need / 1e9:,.2f} GB, over the {have / 1e9:,.2f} GB of "
                          f"{'GPU' if rcfg.device == 'cuda' else 'host'} memory available")


def encode_prompts(setup: DecodeSetup, texts: list[str], max_new_tokens: int) -> list[list[int]]:
    """Token ids of each prompt; ConfigError (one line) for an empty, too-long or not-Unicode prompt."""
    out = []
    for i, text in enumerate(texts):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:  # a lone surrogate: a "\\udXXX" in JSON, or argv bytes that are not UTF-8
            raise ConfigError(f"prompt {i + 1}: not valid Unicode text ({text[e.start]!a} at character {e.start})") \
                from None
        ids = setup.tokenizer.encode(text) if text else []
        try:
            check_request(len(ids), max_new_tokens, setup.rcfg)
        except ValueError as e:
            raise ConfigError(f"prompt {i + 1}: {e}") from None
        out.append(ids)
    return out


def run_config(setup: DecodeSetup, cuda_graphs: bool, **extra) -> dict:
    """The decode's configuration as one flat dictionary, the same keys for ``gaptrace decode --json`` and the
    capture sidecar's ``config``: preset, weights, scheduler, device, dtype, batch_size, block_size (B), page_size
    (P), window (W), max_seq_len, cuda_graphs (whether the engine captured graphs), graph_buckets, kernels (fused |
    eager, as resolved), tree_budget (N), tree_topk, tree_builder (None for a chain), verify_width, faults,
    tensor_parallel (ranks; late_rank_ms with the fault late-rank); then ``extra`` (the caller's own keys:
    capture's rounds, prompts, ...)."""
    rc = setup.rcfg
    return {
        "preset": setup.preset.name, "weights": setup.weights, "scheduler": rc.scheduler, "device": rc.device,
        "dtype": rc.dtype, "batch_size": rc.batch_size, "block_size": rc.block_size, "page_size": rc.page_size,
        "window": rc.window, "max_seq_len": rc.max_seq_len, "cuda_graphs": cuda_graphs,
        "graph_buckets": rc.graph_bucket_mode, "kernels": "fused" if rc.fused_kernels else "eager",
        "tree_budget": rc.tree_budget, "tree_topk": rc.tree_topk if rc.tree else None,
        "tree_builder": ("cpu-heapq" if rc.cpu_tree_build else "gpu") if rc.tree else None,
        "verify_width": rc.verify_width, "faults": list(rc.faults), "tensor_parallel": rc.tensor_parallel,
        **({"late_rank_ms": rc.late_rank_ms} if "late-rank" in rc.faults else {}), **extra,
    }


def run_decode(setup: DecodeSetup, texts: list[str], max_new_tokens: int, check_exact: bool = False,
               on_tokens=None, on_round=None, engine: Engine | None = None) -> dict:
    """Decode ``texts`` and return the result dictionary (the ``--json`` schema):
    {requests: [{prompt, text, tokens, exact, ...}], tau, rounds, tokens_per_s, tpot_ms, ...}."""
    ids = encode_prompts(setup, texts, max_new_tokens)
    engine = engine or Engine(setup.target, setup.draft, setup.rcfg, setup.eos_token_id)
    reqs, stats = engine.generate(ids, max_new_tokens, on_tokens=on_tokens, on_round=on_round)
    rows = []
    for text, r in zip(texts, reqs):
        row = {"prompt": text, "text": setup.tokenizer.decode(r.output), "tokens": r.output, "exact": None,
               "finish_reason": r.finish_reason, "tau": r.accepted / r.rounds if r.rounds else None}
        if check_exact and not setup.simulated:
            ref = greedy_reference(setup.target, r.prompt, max_new_tokens, setup.eos_token_id,
                                   setup.rcfg.prefill_chunk, engine.runner.device, setup.rcfg.fused_kernels)
            div = next((i for i, (a, b) in enumerate(zip(r.output, ref.tokens)) if a != b), None)
            if div is None and len(r.output) != len(ref.tokens):
                div = min(len(r.output), len(ref.tokens))
            row.update(exact=div is None, first_divergence=div,
                       top2_gap_at_divergence=None if div is None or div >= len(ref.top2_gap) else ref.top2_gap[div])
        rows.append(row)
    rc = setup.rcfg
    out = {
        "requests": rows, "tau": stats.tau, "rounds": stats.rounds, "tokens_per_s": stats.tokens_per_s,
        "tpot_ms": stats.tpot_ms, "tround_ms": stats.tround_ms, "tokens": stats.tokens,
        **run_config(setup, bool(engine.graph_nodes)),
        "graph_nodes": {k: {str(b): n for b, n in v.items()} for k, v in engine.graph_nodes.items()},
        "simulated_acceptance": (f"acceptance simulated on the device: each drafted token accepted with "
                                 f"probability {rc.sim_accept_rate}; outputs are not the target's greedy decoding"
                                 if setup.simulated else None),
    }
    if check_exact and not setup.simulated:
        out["exact_match_rate"] = sum(r["exact"] for r in rows) / len(rows)
    return out
