"""The target's own plain greedy decoding, one token per forward: the reference of the exactness gate.

Independent of the speculative path's cache layout (a contiguous cache: token slot = position), of its batching
(one request at a time) and of its block forwards; it shares the model and the prefill chunk size. Records the
gap between the two largest logits at every step, so a bf16 divergence can be shown to start at a near-tie.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..cache.paged import make_kv_pools
from ..models.model import CacheView, Transformer


@dataclass
class ReferenceOutput:
    """tokens: the greedy continuation; top2_gap: logit(top1) - logit(top2) before each token (float32)."""

    tokens: list
    top2_gap: list


@torch.no_grad()
def greedy_reference(model: Transformer, prompt: list[int], max_new_tokens: int, eos_token_id: int | None,
                     chunk: int, device, fused: bool = False) -> ReferenceOutput:
    """Greedy decoding of one prompt: prefill in chunks of ``chunk``, then one token per forward until
    ``max_new_tokens`` tokens or EOS (included). ``fused``: the same kernels as a runtime with
    ``RuntimeConfig.fused_kernels`` (CUDA)."""
    n = len(prompt)
    cap = n + max_new_tokens
    k_pools, v_pools = make_kv_pools(model.config, cap, device, next(model.parameters()).dtype)
    slots = torch.arange(cap, device=device)[None]
    ids = torch.tensor(prompt, device=device)[None]
    state, logits = None, None
    for a in range(0, n, chunk):
        pos = torch.arange(a, min(n, a + chunk), device=device)[None]
        cache = CacheView(k_pools, v_pools, slots[:, a:a + pos.shape[1]], slots, slots[:, None, :] <= pos[..., None],
                          state, fused=fused)
        logits, state = model(ids[:, a:a + pos.shape[1]], pos, cache)
    tokens, gaps = [], []
    for i in range(max_new_tokens):
        last = logits[0, -1].float()
        top = last.topk(2).values
        tok = int(last.argmax())  # host sync per token: this is the reference, not the runtime
        tokens.append(tok)
        gaps.append(float(top[0] - top[1]))
        if tok == eos_token_id or i + 1 == max_new_tokens:
            break
        pos = torch.tensor([[n + i]], device=device)
        cache = CacheView(k_pools, v_pools, pos, slots, slots[:, None, :] <= pos[..., None], state, fused=fused)
        logits, state = model(torch.tensor([[tok]], device=device), pos, cache)
    return ReferenceOutput(tokens, gaps)
