"""Paged KV cache, the device side: the token map of a page table and the K/V pools (the host-side block manager
that fills the page table is runtime/engine/block_manager.py).

Token slot of position ``pos`` in request slot ``r``: ``page_table[r, pos // P] * P + pos % P``. Page 0 is never
handed out: unused page-table entries point at it, so fixed-shape gathers and the padding rows of a batch bucket
read and write finite garbage there, which attention masks out (DESIGN.md "The runtime"; nano-vllm's
block_manager.py; vLLM's PagedAttention block tables).
"""
from __future__ import annotations

import torch

GARBAGE_PAGE = 0  # page-table entries not handed out point here (the host side: engine/block_manager.py)


def token_columns(width: int, page_size: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(page index j // P, offset j % P) of the token positions j in [0, width), [width] long each: the constants
    :func:`token_map` reads (made once per decode state, so no CUDA graph recomputes them)."""
    j = torch.arange(width, device=device)
    return j // page_size, j % page_size


def token_map(page_rows: torch.Tensor, page_size: int, width: int, rows: torch.Tensor | None = None,
              columns: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """page_rows [n, max_pages] -> token slots [n, width]: column j holds page_rows[:, j // P] * P + j % P. With
    ``rows`` [m], page_rows is the whole page table and the result [m, width] covers those slots (one gather, not
    two); ``columns`` = :func:`token_columns` (width, P) made once (no arange in a CUDA graph). Fixed shape, device
    arithmetic only."""
    col_page, col_offset = columns if columns is not None else token_columns(width, page_size, page_rows.device)
    pages = page_rows[:, col_page] if rows is None else page_rows[rows[:, None], col_page]
    return torch.add(col_offset, pages, alpha=page_size)


def make_kv_pools(cfg, num_token_slots: int, device, dtype) -> tuple[list, list]:
    """Zeroed K and V pools, one [num_token_slots, Hkv, D] tensor per full-attention layer of ``cfg``."""
    n_full = sum(t == "full_attention" for t in cfg.layer_types)
    shape = (num_token_slots, cfg.num_key_value_heads, cfg.head_dim)
    return ([torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_full)],
            [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_full)])
