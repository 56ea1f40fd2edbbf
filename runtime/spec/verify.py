"""The target verify: one forward over the bs x B block tokens [last_tok, d1, ..., d_{B-1}] at positions
L .. L + B - 1, over the paged KV (every column of the slot's token map, masked to positions <= the query's).
The linear-attention layers return their state after every block token, for the commit. Fixed shapes: one
CUDA graph on the GPU (DESIGN.md "Block-speculative decoding")."""
from __future__ import annotations

import torch

from ..models.model import CacheView, Transformer
from .state import DecodeState


def verify_block(model: Transformer, st: DecodeState, rows: torch.Tensor, draft_tokens: torch.Tensor):
    """rows [nb]; draft_tokens [nb, B] (d1 .. dB). Returns (pred [nb, B] long: the target's greedy token after
    each block prefix, states [n_linear, nb, B, Hv, dk, dv] float32 or None; in recompute mode the layers'
    projections [n_linear, nb, B, width] instead, which ``LinearStatePool.commit`` takes)."""
    B = st.block_size
    ar = st.block_index
    L = st.lengths[rows]
    tokens = torch.cat([st.last_tok[rows][:, None], draft_tokens[:, : B - 1]], 1)
    pos = L[:, None] + ar
    tmap = st.token_map(rows)
    write = tmap.gather(1, pos.clamp(max=st.max_len - 1))
    mask = st.cols[None, None, :] <= pos[:, :, None]
    # the linear states are read from the pool by row (no gathered copy of every layer's states)
    lin = st.tgt_lin.pool if st.tgt_lin.n_linear else None
    # recompute mode (LinearStatePool.recompute_from): the layers' projections instead of a state per token
    chain = st.tgt_lin.recompute is not None
    cache = CacheView(st.tgt_k, st.tgt_v, write, tmap, mask, lin, all_states=not chain, fused=st.fused, lin_rows=rows,
                      chain_inputs=chain)
    logits, states = model(tokens, pos, cache)
    if st.fused:
        from ..models.fused import argmax_embed
        return argmax_embed(logits)[0], states
    return logits.argmax(-1), states
