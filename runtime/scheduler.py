"""Round planning: which slots run, in which batch bucket, and the metadata sizing. Two schedulers that differ
in sizing only, so they emit identical tokens bit for bit (seed 000, "The sync, and the bound that replaced it"):

- ``sync``: copies the exact accept-dependent lengths to the host every round (a blocking device-to-host copy
  that waits for the previous round), allocates pages from them, and rebuilds the draft window rectangle with
  the seed's data-dependent gathers (``.max().item()`` and ``masked_select``): three host syncs per round.
- ``overlap``: plans with Lplan = Lcommitted + B >= L (the host's committed length lags the device by at most one
  round, i.e. one block), sizes the window with the bound c(L) <= min(Lplan, W + P - 1), and builds the
  rectangle with fixed-shape device arithmetic: no host sync, so the host runs a round ahead of the device.

``RuntimeConfig.faults`` adds pathologies to a plan (runtime/faults.py): ``lengths-copy`` (the blocking lengths copy,
sizing unchanged), ``dd-gather`` (the data-dependent rectangle build) and ``jit-new-shape`` (a Triton recompute of
the window lengths, warmed for one bucket only).

Both make the same decisions (admission and retirement come from results read one round late, in the engine),
so batch composition, bucket and every device computation are the same; only page ids and host waits differ.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import faults as F
from .cache.window import compact_len, draft_window_bound, rect_width
from .graphs import bucket_for
from .model_runner import ModelRunner
from .sequence import Request


@dataclass
class RoundPlan:
    """One verify round as planned on the host."""

    index: int
    nb: int                      # batch bucket
    rows: list                   # slot per row; padding rows hold the scratch slot
    requests: list               # Request per row at plan time (None for padding)
    window_cols: int             # host-side size of the window gather: exact max c(L) (sync) or its bound


class Scheduler:
    """Shared planning; subclasses size the metadata."""

    name = ""
    packed_rect = False

    def __init__(self, runner: ModelRunner):
        self.runner = runner
        self.B = runner.rcfg.block_size
        self.faults = runner.rcfg.faults

    def plan(self, index: int, running: dict[int, Request]) -> RoundPlan:
        """Rows = the running slots in slot order, padded to the smallest bucket; pages allocated, page tables
        and the row map uploaded, the draft window rectangle built."""
        slots = sorted(running)
        nb = bucket_for(len(slots), self.runner.buckets)
        rows = slots + [self.runner.scratch] * (nb - len(slots))
        window_cols = self.allocate(slots, running)
        self.runner.upload_page_tables()
        buf = self.runner.set_rows(nb, rows)
        if "dd-gather" in self.faults:
            F.dd_gather(self.runner, buf)
        else:
            self.runner.build_rect(buf, packed=self.packed_rect)
        if "jit-new-shape" in self.faults:
            F.jit_new_shape(self.runner, buf)
        return RoundPlan(index, nb, rows, [running[s] for s in slots] + [None] * (nb - len(slots)), window_cols)

    def allocate(self, slots: list[int], running: dict[int, Request]) -> int:
        raise NotImplementedError


class SyncScheduler(Scheduler):
    """Exact lengths on the host every round (the seed's baseline)."""

    name = "sync"
    packed_rect = True

    def allocate(self, slots, running) -> int:
        rc = self.runner.rcfg
        lengths = self.runner.device_lengths_to_host()  # SYNC (deliberate): the seed's blocking lengths copy
        for s in slots:
            self.runner.blocks.ensure(s, int(lengths[s]) + rc.round_span)
        return int(max((compact_len(int(lengths[s]), rc.window, rc.page_size) for s in slots), default=0))


class OverlapScheduler(Scheduler):
    """Sizing from Lplan = Lcommitted + B and the window bound; no host sync."""

    name = "overlap"

    def allocate(self, slots, running) -> int:
        rc = self.runner.rcfg
        cols = 0
        for s in slots:
            l_plan = running[s].committed_len + self.B
            # the round writes positions L .. L + span - 1 < Lplan + span (span = B, or max(B, N) for a tree)
            self.runner.blocks.ensure(s, l_plan + rc.round_span)
            cols = max(cols, draft_window_bound(l_plan, rc.window, rc.page_size))
        assert cols <= rect_width(rc.window, rc.page_size)  # the fixed rectangle always holds the window
        if "lengths-copy" in self.faults:
            F.lengths_copy(self.runner, slots, cols)  # SYNC (fault): exact lengths read, sizing unchanged
        return cols


def make_scheduler(name: str, runner: ModelRunner) -> Scheduler:
    """``sync`` or ``overlap``."""
    return {"sync": SyncScheduler, "overlap": OverlapScheduler}[name](runner)
