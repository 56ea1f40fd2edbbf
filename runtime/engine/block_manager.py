"""The host-side block manager of the paged KV cache: pages of P token slots handed to request slots, one
page-table row per slot (nano-vllm's block_manager.py; vLLM's PagedAttention block tables).

Token slot of position ``pos`` in request slot ``r``: ``page_table[r, pos // P] * P + pos % P``. Page 0 is never
handed out: unused page-table entries point at it, so fixed-shape gathers and the padding rows of a batch bucket
read and write finite garbage there, which attention masks out (DESIGN.md "The runtime"). The scheduler owns it
(allocates and frees); the model runner uploads the rows it changed (``take_dirty``).
"""
from __future__ import annotations

from collections import deque

import numpy as np

from ..cache.paged import GARBAGE_PAGE


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

    @classmethod
    def for_config(cls, rcfg) -> "BlockManager":
        """The block manager of a RuntimeConfig: batch_size + 1 slots (the last is the padding rows' scratch slot),
        max_seq_len / P pages each, and a page per slot-page plus the garbage page."""
        return cls(rcfg.batch_size + 1, rcfg.max_seq_len // rcfg.page_size, rcfg.page_size)

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
