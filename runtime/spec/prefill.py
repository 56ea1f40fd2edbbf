"""Chunked prefill of one request into its slot, for both models, then its first token (greedy).

The target attends over every earlier position (chunk [a, b) reads the columns [0, b) written so far); the draft,
block by block like its decode, over the window at the chunk's start plus the chunk itself (positions s(a) .. b - 1
for chunk [a, b)). Eager: prompts have many lengths, and admission is not a steady round.
"""
from __future__ import annotations

import torch

from ..cache.window import window_start
from ..models.model import CacheView, Transformer
from .state import DecodeState


def prefill_request(target: Transformer, draft: Transformer, st: DecodeState, slot: int, ids: torch.Tensor,
                    chunk: int, chunk_ids=None) -> torch.Tensor:
    """ids [n] long on the device; the slot's pages must cover n + B positions. Writes both models' KV and
    linear states, lengths[slot] = n and last_tok[slot] = the target's greedy next token; returns that token
    as a [1] device tensor (no host sync). ``chunk_ids(a, b)``: where chunk [a, b)'s ids come from instead of
    ``ids[a:b]`` (the fault token-list-rebuild); same values."""
    n, dev = ids.shape[0], ids.device
    tmap = st.token_map(torch.full((1,), slot, dtype=torch.long, device=dev))
    cols = torch.arange(st.max_len, device=dev)
    s_t = s_d = logits = None
    for a in range(0, n, chunk):
        b = min(n, a + chunk)
        pos = torch.arange(a, b, device=dev)[None]
        toks = (ids[a:b] if chunk_ids is None else chunk_ids(a, b))[None]
        write = tmap[:, a:b]
        # the target reads only the columns written so far, [0, b): a long prompt's early chunks do not pay for the
        # whole context (the mask rule is unchanged: column c <= the query's position)
        read_t = tmap[:, :b]
        logits, s_t = target(toks, pos, CacheView(st.tgt_k, st.tgt_v, write, read_t, cols[:b] <= pos[..., None], s_t,
                                                  fused=st.fused))
        ws = window_start(a, st.window, st.page_size)
        read_d = tmap[:, ws:b]
        mask_d = (ws + cols[: b - ws]) <= pos[..., None]
        _, s_d = draft(toks, pos, CacheView(st.drf_k, st.drf_v, write, read_d, mask_d, s_d, fused=st.fused))
    first = logits[0, -1].argmax().view(1)
    st.last_tok[slot:slot + 1].copy_(first)
    st.lengths[slot:slot + 1].fill_(n)
    st.tgt_lin.write(slot, s_t)
    st.drf_lin.write(slot, s_d)
    return first
