"""Round planning on the host: admission into free slots, which slots run, in which batch bucket, the pages they
need and the metadata sizing. The scheduler owns the block manager; a plan is host data only (the model runner
uploads it). Two schedulers that differ in sizing only, so they emit identical tokens bit for bit (DESIGN.md
"Schedulers: sync and overlap", "The plan bound"):

- ``sync``: copies the exact accept-dependent lengths to the host every round (a blocking device-to-host copy
  that waits for the previous round), allocates pages from them, and has the round rebuild the draft window
  rectangle with data-dependent gathers (``.max().item()`` and ``masked_select``): three host syncs
  per round.
- ``overlap``: plans with Lplan = Lcommitted + B >= L (the host's committed length lags the device by at most one
  round, i.e. one block), sizes the window with the bound c(L) <= min(Lplan, W + P - 1), and has the rectangle
  built with fixed-shape device arithmetic: no host sync, so the host runs a round ahead of the device.

``Faults`` hooks add pathologies (runtime/faults.py): ``after_sizing`` (lengths-copy: the blocking lengths copy,
sizing unchanged); dd-gather and jit-new-shape are the rectangle's (``Faults.build_window_rect``).

Both make the same decisions (admission and retirement come from results read one round late, in the engine),
so batch composition, bucket and every device computation are the same; only page ids and host waits differ.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..cache.window import compact_len, draft_window_bound, rect_width
from ..config import RuntimeConfig
from ..faults import Faults
from .block_manager import BlockManager
from .graphs import bucket_for
from .sequence import Request


@dataclass
class Batch:
    """The requests of one ``generate`` call: ``waiting`` (not admitted yet, in order), ``running`` (slot -> live
    request) and the ``free`` slots (sorted)."""

    waiting: deque
    running: dict = field(default_factory=dict)
    free: list = field(default_factory=list)


@dataclass
class RoundPlan:
    """One verify round as planned on the host (no device tensor: the runner uploads ``rows``)."""

    index: int
    nb: int                      # batch bucket
    rows: list                   # slot per row; padding rows hold the scratch slot
    requests: list               # Request per row at plan time (None for padding)
    window_cols: int             # host-side size of the window gather: exact max c(L) (sync) or its bound
    packed_rect: bool = False    # the rectangle rebuilt with the data-dependent gathers (sync)


class Scheduler:
    """Shared planning and admission; subclasses size the metadata. ``lengths_to_host``: the runner's blocking
    copy of the exact lengths (SYNC; the sync scheduler's, and the lengths-copy fault's)."""

    name = ""
    packed_rect = False

    def __init__(self, rcfg: RuntimeConfig, blocks: BlockManager, buckets: list[int], scratch: int,
                 lengths_to_host: Callable[[], np.ndarray], faults: Faults | None = None):
        self.rcfg, self.blocks, self.buckets, self.scratch = rcfg, blocks, buckets, scratch
        self.lengths_to_host = lengths_to_host
        self.faults = faults if faults is not None else Faults.from_names(rcfg.faults)
        self.B = rcfg.block_size

    def admit(self, batch: Batch) -> Request | None:
        """The next waiting request, put in the lowest free slot with pages for its prompt + one round's span
        (None when nothing waits or no slot is free). The caller prefills it and adds it to ``batch.running``."""
        if not (batch.free and batch.waiting):
            return None
        r, slot = batch.waiting.popleft(), batch.free.pop(0)
        r.slot, r.committed_len = slot, len(r.prompt)
        self.blocks.ensure(slot, len(r.prompt) + self.rcfg.round_span)
        return r

    def retire(self, r: Request, batch: Batch) -> None:
        """A finished request leaves: its slot and pages are free again."""
        batch.running.pop(r.slot, None)
        self.blocks.free(r.slot)
        batch.free.append(r.slot)
        batch.free.sort()

    def plan(self, index: int, running: dict[int, Request]) -> RoundPlan:
        """Rows = the running slots in slot order, padded to the smallest bucket; pages allocated."""
        slots = sorted(running)
        nb = bucket_for(len(slots), self.buckets)
        rows = slots + [self.scratch] * (nb - len(slots))
        window_cols = self.allocate(slots, running)
        return RoundPlan(index, nb, rows, [running[s] for s in slots] + [None] * (nb - len(slots)), window_cols,
                         self.packed_rect)

    def allocate(self, slots: list[int], running: dict[int, Request]) -> int:
        raise NotImplementedError


class SyncScheduler(Scheduler):
    """Exact lengths on the host every round (the serialized baseline)."""

    name = "sync"
    packed_rect = True

    def allocate(self, slots, running) -> int:
        rc = self.rcfg
        lengths = self.lengths_to_host()  # SYNC (deliberate): the blocking lengths copy
        for s in slots:
            self.blocks.ensure(s, int(lengths[s]) + rc.round_span)
        return int(max((compact_len(int(lengths[s]), rc.window, rc.page_size) for s in slots), default=0))


class OverlapScheduler(Scheduler):
    """Sizing from Lplan = Lcommitted + B and the window bound; no host sync."""

    name = "overlap"

    def allocate(self, slots, running) -> int:
        rc = self.rcfg
        cols = 0
        for s in slots:
            l_plan = running[s].committed_len + self.B
            # the round writes positions L .. L + span - 1 < Lplan + span (span = B, or max(B, N) for a tree)
            self.blocks.ensure(s, l_plan + rc.round_span)
            cols = max(cols, draft_window_bound(l_plan, rc.window, rc.page_size))
        assert cols <= rect_width(rc.window, rc.page_size)  # the fixed rectangle always holds the window
        self.faults.after_sizing(self.lengths_to_host, slots, cols, rc.window, rc.page_size)  # lengths-copy
        return cols


def make_scheduler(name: str, runner) -> Scheduler:
    """The ``sync`` or ``overlap`` scheduler over ``runner``'s block manager (which it then owns: it allocates and
    frees; the runner only uploads changed rows), batch buckets, scratch slot, lengths copy and faults."""
    cls = {"sync": SyncScheduler, "overlap": OverlapScheduler}[name]
    return cls(runner.rcfg, runner.blocks, runner.buckets, runner.scratch, runner.device_lengths_to_host,
               runner.faults)
