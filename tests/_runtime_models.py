"""The small random models the runtime tests share (CPU, float32): a 4-layer hybrid target (gated delta rule and
full attention, alternating), a draft that is the target plus noise, and random prompts."""
from __future__ import annotations

import copy

import torch

from gaptrace.runtime.config import ModelConfig
from gaptrace.runtime.models.model import Transformer

VOCAB = 128


def hybrid_target(seed: int = 0) -> Transformer:
    """4 layers (linear, full, linear, full), hidden 64, vocab 128, random weights from ``torch.manual_seed(seed)``."""
    torch.manual_seed(seed)
    cfg = ModelConfig(num_layers=4, num_heads=4, num_kv_heads=2, hidden_size=64, head_dim=16, vocab_size=VOCAB,
                      intermediate_size=128, layer_types=["linear_attention", "full_attention"] * 2)
    return Transformer(cfg).eval()


def near_copy(model: Transformer, scale: float, seed: int = 7) -> Transformer:
    """A draft that mostly agrees with ``model``: its weights plus Gaussian noise of ``scale`` x each tensor's std."""
    d = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in d.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale * p.std().clamp(min=1e-3))
    return d


def random_prompts(lengths, seed: int = 1) -> list[list[int]]:
    """One prompt of random token ids per length."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths]


def greedy_setup(lengths, max_new: int, chunk: int, eos_at: int):
    """(target, prompts, eos, refs) of the runtime tests: ``hybrid_target()``, one random prompt per length, and
    ``greedy_refs`` with the first request stopping at its ``eos_at``-th token."""
    target = hybrid_target()
    prompts = random_prompts(lengths)
    eos, refs = greedy_refs(target, prompts, max_new, chunk, eos_at)
    return target, prompts, eos, refs


def greedy_refs(target: Transformer, prompts: list[list[int]], max_new: int, chunk: int, eos_at: int):
    """(eos, refs): eos = the ``eos_at``-th token of the target's greedy continuation of ``prompts[0]`` (so that
    request stops early), refs = every prompt's greedy continuation with that eos (runtime/spec/reference.py)."""
    from gaptrace.runtime.spec.reference import greedy_reference

    eos = greedy_reference(target, prompts[0], max_new, None, chunk, "cpu").tokens[eos_at]
    return eos, [greedy_reference(target, p, max_new, eos, chunk, "cpu").tokens for p in prompts]
