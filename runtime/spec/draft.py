"""The draft block: B autoregressive draft steps for every row, over the draft's compact window
(DESIGN.md "Block-speculative decoding").

Step j feeds one token at position L + j and reads the window rectangle (its first c(L) columns) plus the
block's own positions L .. L + j. Inputs are [last_tok, d1, ..., d_{B-1}]; outputs d1 .. dB. dB is never
verified (the verify block holds B tokens: last_tok and d1 .. d_{B-1}), but feeding d_{B-1} fills the draft's KV
at position L + B - 1, needed when the whole block is accepted. Fixed shapes: one CUDA graph on the GPU.
"""
from __future__ import annotations

import torch

from ..models.model import CacheView, Transformer
from .state import DecodeState
from .tree import draft_topk


def draft_block(model: Transformer, st: DecodeState, rows: torch.Tensor, rect: torch.Tensor,
                rect_len: torch.Tensor, topk: int = 0):
    """rows [nb] slots; rect [nb, W+P-1], rect_len [nb] from ``plan``. Returns (tokens [nb, B] long: d1 .. dB,
    states [n_linear, nb, B, ...] float32: the draft's linear state after each step, or None). With ``topk`` k > 0
    (draft trees, runtime/spec/tree.py) also (logp [nb, B, k] float32, ids [nb, B, k] long): each step's top-k
    tokens and log-probabilities, sorted descending."""
    B = st.block_size
    ar = st.block_index
    L, tok = st.lengths[rows], st.last_tok[rows]
    # once per block, not per step: the positions, step j's mask (row j: the window, then block columns <= j) and,
    # on the fused path, the RoPE tables; step j reads column / row j of each (views: no node per step)
    pos = L[:, None] + ar                                                             # nb, B
    blk_slots = st.token_map(rows).gather(1, pos.clamp(max=st.max_len - 1))
    read = torch.cat([rect, blk_slots], 1)
    masks = st.draft_masks(rect_len)                                                  # nb, B, W + P - 1 + B
    rope = None
    if st.fused and model.full_layers:
        rope = model.rope_tables(pos)
    state = st.drf_lin.gather(rows)
    tokens, states, tops = [], [], []
    emb = None  # fused: step j + 1's input embedding, looked up with step j's argmax in one node
    if st.fused:
        from ..models.fused import argmax_embed  # Triton: imported only on the fused path
    for j in range(B):
        cache = CacheView(st.drf_k, st.drf_v, blk_slots[:, j:j + 1], read, masks[:, j:j + 1], state, fused=st.fused,
                          rope=None if rope is None else (rope[0][:, j:j + 1], rope[1][:, j:j + 1]))
        logits, state = model(tok[:, None], pos[:, j:j + 1], cache, emb)
        if st.fused:
            tok, emb = argmax_embed(logits[:, -1], model.model.embed_tokens.weight if j < B - 1 else None)
            emb = None if emb is None else emb[:, None]
        else:
            tok = logits[:, -1].argmax(-1)
        tokens.append(tok)
        states.append(state)
        if topk:
            tops.append(draft_topk(logits[:, -1], topk))
    out = (torch.stack(tokens, 1), (torch.stack(states, 2) if state is not None else None))
    if topk:
        out += (torch.stack([lp for lp, _ in tops], 1), torch.stack([i for _, i in tops], 1))
    return out
