"""Paged KV cache: a host-side block manager (page size P, a page table per request slot) and the device pools.

Token slot of position ``pos`` in request slot ``r``: ``page_table[r, pos // P] * P + pos % P``. Page 0 is never
handed out: unused page-table entries point at it, so fixed-shape gathers and the padding rows of a batch bucket
read and write finite garbage there, which attention masks out (DESIGN.md "The runtime"; nano-vllm's
block_manager.py; vLLM's PagedAttention block tables).
"""
from __future__ import annotations

from collections import deque

import numpy as np
import torch

GARBAGE_PAGE = 0


class CacheFullError(RuntimeError):
    """No free page left, or a request grew past its slot's page-table width."""


class BlockManager:
    """Allocates pages to request slots. ``page_table`` is [num_slots, max_pages] int64 (host), page 0 = unused.

    ``ensure(slot, n_tokens)`` grows a slot to hold positions [0, n_tokens); ``free(slot)`` returns its pages
    (most recently freed are reused first); ``dirty`` collects the slots whose page-table row changed since
    ``take_dirty()``. Pure host bookkeeping: no device work, no sync.
    """

    def __init__(self, num_slots: int, max_pages_per_slot: int, page_size: int, num_pages: int | None = None):
        self.page_size = page_size
        self.max_pages = max_pages_per_slot
        self.num_pages = num_pages if num_pages is not None else num_slots * max_pages_per_slot + 1
        self.page_table = np.zeros((num_slots, max_pages_per_slot), dtype=np.int64)
        self.owned: list[list[int]] = [[] for _ in range(num_slots)]
        self.free_pages: deque[int] = deque(range(1, self.num_pages))
        self.dirty: set[int] = set()

    def pages_for(self, n_tokens: int) -> int:
        """ceil(n_tokens / P)."""
        return -(-int(n_tokens) // self.page_size)

    def ensure(self, slot: int, n_tokens: int) -> None:
        """Allocate pages so that slot holds n_tokens positions. CacheFullError when out of pages or width."""
        need = self.pages_for(n_tokens)
        if need > self.max_pages:
            raise CacheFullError(f"slot {slot} needs {need} pages for {n_tokens} tokens; page table holds "
                                 f"{self.max_pages}")
        have = self.owned[slot]
        if need <= len(have):
            return
        if need - len(have) > len(self.free_pages):
            raise CacheFullError(f"out of KV pages: slot {slot} needs {need - len(have)}, "
                                 f"{len(self.free_pages)} free")
        for i in range(len(have), need):
            page = self.free_pages.popleft()
            have.append(page)
            self.page_table[slot, i] = page
        self.dirty.add(slot)

    def free(self, slot: int) -> None:
        """Return all of slot's pages; its page-table row points at the garbage page again."""
        self.free_pages.extendleft(reversed(self.owned[slot]))
        self.owned[slot] = []
        self.page_table[slot] = GARBAGE_PAGE
        self.dirty.add(slot)

    def capacity(self, slot: int) -> int:
        """Tokens the slot can hold now."""
        return len(self.owned[slot]) * self.page_size

    def take_dirty(self) -> list[int]:
        """The slots whose rows changed since the last call (sorted), and forget them."""
        rows, self.dirty = sorted(self.dirty), set()
        return rows


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
