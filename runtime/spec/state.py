"""Device-side decode state shared by the round phases: page tables, per-slot lengths and pending tokens, the KV
pools and linear-attention states of both models. One object per engine; no module-level mutable state."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..cache.linear_state import LinearStatePool
from ..cache.paged import make_kv_pools, token_map


@dataclass
class DecodeState:
    """All per-slot device tensors. Slot ``scratch`` (= the last one) absorbs the padding rows of a batch bucket.

    lengths[s] = L, the committed length of slot s (positions [0, L) have KV and linear state in both models);
    last_tok[s] = the token at position L, emitted but not yet fed (the first token of the next draft block).
    """

    page_table: torch.Tensor            # [num_slots, max_pages] long
    lengths: torch.Tensor               # [num_slots] long
    last_tok: torch.Tensor              # [num_slots] long
    tgt_k: list
    tgt_v: list
    drf_k: list
    drf_v: list
    tgt_lin: LinearStatePool
    drf_lin: LinearStatePool
    page_size: int
    window: int
    block_size: int
    max_len: int
    scratch: int

    @classmethod
    def allocate(cls, target_cfg, draft_cfg, rcfg, num_pages: int, device, dtype) -> "DecodeState":
        """Zeroed state for rcfg.batch_size request slots (+1 scratch) and ``num_pages`` KV pages per model."""
        slots = rcfg.batch_size + 1
        max_pages = rcfg.max_seq_len // rcfg.page_size
        tk, tv = make_kv_pools(target_cfg, num_pages * rcfg.page_size, device, dtype)
        dk, dv = make_kv_pools(draft_cfg, num_pages * rcfg.page_size, device, dtype)
        z = lambda: torch.zeros(slots, dtype=torch.long, device=device)  # noqa: E731
        return cls(torch.zeros(slots, max_pages, dtype=torch.long, device=device), z(), z(), tk, tv, dk, dv,
                   LinearStatePool(target_cfg, slots, device), LinearStatePool(draft_cfg, slots, device),
                   rcfg.page_size, rcfg.window, rcfg.block_size, rcfg.max_seq_len, slots - 1)

    def token_map(self, rows: torch.Tensor) -> torch.Tensor:
        """Token slots of positions [0, max_len) for the slots in ``rows`` [nb] -> [nb, max_len]."""
        return token_map(self.page_table[rows], self.page_size, self.max_len)

    @property
    def rect_width(self) -> int:
        """W + P - 1, the draft window rectangle's fixed width."""
        return self.window + self.page_size - 1
