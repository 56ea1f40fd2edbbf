"""Device-side decode state shared by the round phases: page tables, per-slot lengths and pending tokens, the KV
pools and linear-attention states of both models. One object per engine; no module-level mutable state."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..cache.linear_state import LinearStatePool
from ..cache.paged import make_kv_pools, token_columns, token_map
from ..cache.window import window_mask


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
    fused: bool = False  # cached forwards run models/fused.py's kernels (RuntimeConfig.fused_kernels)
    # constants the round's graphs read (made once here, so no graph holds nodes that recompute them every replay)
    cols: torch.Tensor = field(init=False)          # [max_len] long: 0 .. max_len - 1
    col_page: torch.Tensor = field(init=False)      # [max_len] long: column j's page index j // P
    col_offset: torch.Tensor = field(init=False)    # [max_len] long: column j's offset in its page j % P
    rect_cols: torch.Tensor = field(init=False)     # [W + P - 1] long: the window rectangle's column indices
    block_index: torch.Tensor = field(init=False)   # [B] long: 0 .. B - 1
    block_causal: torch.Tensor = field(init=False)  # [B, B] bool: row j sees block columns <= j

    def __post_init__(self):
        dev = self.page_table.device
        self.cols = torch.arange(self.max_len, device=dev)
        self.col_page, self.col_offset = token_columns(self.max_len, self.page_size, dev)
        self.rect_cols = torch.arange(self.rect_width, device=dev)
        self.block_index = torch.arange(self.block_size, device=dev)
        self.block_causal = self.block_index[None, :] <= self.block_index[:, None]

    @classmethod
    def allocate(cls, target_cfg, draft_cfg, rcfg, num_pages: int, device, dtype) -> "DecodeState":
        """Zeroed state for rcfg.batch_size request slots (+1 scratch) and ``num_pages`` KV pages per model."""
        slots = rcfg.batch_size + 1
        max_pages = rcfg.max_seq_len // rcfg.page_size
        tk, tv = make_kv_pools(target_cfg, num_pages * rcfg.page_size, device, dtype)
        dk, dv = make_kv_pools(draft_cfg, num_pages * rcfg.page_size, device, dtype)
        z = lambda: torch.zeros(slots, dtype=torch.long, device=device)  # noqa: E731
        return cls(torch.zeros(slots, max_pages, dtype=torch.long, device=device), z(), z(), tk, tv, dk, dv,
                   LinearStatePool(target_cfg, slots, device, rcfg.fused_kernels),
                   LinearStatePool(draft_cfg, slots, device, rcfg.fused_kernels),
                   rcfg.page_size, rcfg.window, rcfg.block_size, rcfg.max_seq_len, slots - 1, rcfg.fused_kernels)

    @staticmethod
    def nbytes(target_cfg, draft_cfg, rcfg, dtype_bytes: int) -> int:
        """Bytes :meth:`allocate` (with the block manager's ``num_pages`` = slots x max_pages + 1) and the engine's
        per-round buffers take for this config, plus one verify's gathered K/V of a full batch (the largest
        transient); the model weights are not counted. Used to refuse a config that cannot fit before allocating.
        """
        slots = rcfg.batch_size + 1
        max_pages = rcfg.max_seq_len // rcfg.page_size
        num_pages = slots * max_pages + 1
        tokens = num_pages * rcfg.page_size

        def kv(cfg) -> int:  # K and V pools over all full-attention layers
            n_full = sum(t == "full_attention" for t in cfg.layer_types)
            return 2 * n_full * tokens * cfg.num_key_value_heads * cfg.head_dim * dtype_bytes

        def lin(cfg) -> int:  # float32 recurrent states
            return (cfg.layer_types.count("linear_attention") * slots * cfg.linear_num_value_heads
                    * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4)

        tables = 2 * slots * max_pages * 8 + num_pages * 40  # device + host page tables, the free-page deque
        buffers = 2 * rcfg.batch_size * (rcfg.window + rcfg.page_size + 1) * 8  # per-bucket round buffers
        gather = max(2 * rcfg.batch_size * rcfg.max_seq_len * c.num_key_value_heads * c.head_dim * dtype_bytes
                     for c in (target_cfg, draft_cfg))
        return kv(target_cfg) + kv(draft_cfg) + lin(target_cfg) + lin(draft_cfg) + tables + buffers + gather

    def token_map(self, rows: torch.Tensor) -> torch.Tensor:
        """Token slots of positions [0, max_len) for the slots in ``rows`` [nb] -> [nb, max_len] (paged.token_map)."""
        return token_map(self.page_table, self.page_size, self.max_len, rows, (self.col_page, self.col_offset))

    def draft_masks(self, rect_len: torch.Tensor) -> torch.Tensor:
        """[nb, B, W + P - 1 + B] bool: draft step j's mask over its block's columns, the window rectangle (column c
        open when c < c(L): plan.window_mask) then the block's own positions (open up to j). The draft block and the
        tree's draft re-feed read the same columns."""
        nb, B = rect_len.shape[0], self.block_size
        return torch.cat([window_mask(rect_len, self.rect_cols)[:, None, :].expand(nb, B, self.rect_width),
                          self.block_causal.expand(nb, B, B)], 2)

    @property
    def rect_width(self) -> int:
        """W + P - 1, the draft window rectangle's fixed width."""
        return self.window + self.page_size - 1
