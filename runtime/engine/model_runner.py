"""The model runner: both models, the device state, per-bucket static buffers and CUDA graphs, and the host <->
device traffic of a round (pinned non-blocking copies, events). nano-vllm's model_runner.py, for speculation.

It runs phases and does every upload; it decides nothing (the scheduler plans on the host, a round strategy of
rounds.py / tree_round.py composes the phases, the engine loops).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ..config import ConfigError, RuntimeConfig
from ..faults import Faults
from ..models.model import Transformer
from ..spec.accept import acceptance_draws
from ..spec.draft import draft_block
from ..spec.plan import rect_fixed, rect_packed
from ..spec.prefill import prefill_request
from ..spec.state import DecodeState
from ..spec.verify import verify_block
from .block_manager import BlockManager
from .graphs import GraphedCall, batch_buckets


@dataclass
class RoundBuffers:
    """Static device tensors of one batch-size bucket: the graphs' inputs (rows, the window rectangle, the
    simulated acceptance's draws)."""

    rows: torch.Tensor       # [nb] long: the slot of each row (scratch for padding rows)
    rect: torch.Tensor       # [nb, W+P-1] long: draft window token slots
    rect_len: torch.Tensor   # [nb] long: c(L) per row
    draws: torch.Tensor      # [nb, B-1] float32: this round's acceptance draws (simulated acceptance only)


class Readback:
    """Device tensors copied to pinned host memory without blocking; ``get`` reads them later.

    On CUDA the copy is enqueued behind the work that produced the tensors and an event is recorded after it;
    ``get`` waits on that event, which the engine only does a round later, when it has normally completed.
    """

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.event = None
        if tensors and next(iter(tensors.values())).is_cuda:
            self.host = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=True) for k, v in tensors.items()}
            for k, v in tensors.items():
                self.host[k].copy_(v, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host = {k: v.detach().clone() for k, v in tensors.items()}

    def ready(self) -> bool:
        """True when the copies have landed (never blocks)."""
        return self.event is None or self.event.query()

    def get(self) -> dict[str, np.ndarray]:
        """The host arrays. SYNC (deliberate): waits on this readback's event; the engine calls it one round
        after the copy was enqueued, while the next round is already queued behind it, so the device stays busy."""
        if self.event is not None:
            self.event.synchronize()
        return {k: v.numpy() for k, v in self.host.items()}


class ModelRunner:
    """Owns target + draft, the DecodeState, and per-bucket buffers and graphs; reads the page table of the
    scheduler's block manager ``blocks`` (made here when none is given) to upload it. ``faults``: the parsed
    pathologies (:meth:`Faults.from_names` of ``rcfg.faults`` when None). ``target`` may be one rank's slice
    (``target.tp`` set, runtime/tp/shard.py): its KV cache and linear states then hold that rank's heads, and
    ``rcfg.tensor_parallel`` must equal its world size (ConfigError otherwise)."""

    def __init__(self, target: Transformer, draft: Transformer, rcfg: RuntimeConfig, faults: Faults | None = None,
                 blocks: BlockManager | None = None):
        self.target, self.draft, self.rcfg = target, draft, rcfg
        self.tp = target.tp  # a rank's slice of the target (runtime/tp): its group; None in one process
        ranks = 1 if self.tp is None else self.tp.world
        if ranks != rcfg.tensor_parallel:
            raise ConfigError(f"tensor_parallel {rcfg.tensor_parallel}, but the target is split over {ranks} "
                              "rank(s) (runtime/tp: shard_target)")
        self.faults = faults if faults is not None else Faults.from_names(rcfg.faults)
        self.device = next(target.parameters()).device
        self.dtype = next(target.parameters()).dtype
        self.blocks = blocks if blocks is not None else BlockManager.for_config(rcfg)
        self.state = DecodeState.allocate(target.config, draft.config, rcfg, self.blocks.num_pages, self.device,
                                          self.dtype)
        if rcfg.fused_kernels and not rcfg.tree and not self.faults.eager_commit_glue:
            # the verify hands the commit its layers' projections and the commit recomputes the accepted prefix's
            # state (a tree's accepted path is not a prefix; the fault's glue needs every per-token state)
            self.state.tgt_lin.recompute_from(target)
        self.buckets = batch_buckets(rcfg.batch_size, rcfg.graph_bucket_mode)
        self.buffers = {nb: self._new_buffers(nb) for nb in self.buckets}
        self.graphs: dict[tuple[str, int], GraphedCall] = {}
        self.generator = None
        if rcfg.sim_accept_rate is not None:
            self.generator = torch.Generator(device=self.device)
            self.generator.manual_seed(rcfg.seed)

    @property
    def scratch(self) -> int:
        """The slot padding rows use."""
        return self.state.scratch

    def _new_buffers(self, nb: int) -> RoundBuffers:
        z = lambda *s: torch.zeros(*s, dtype=torch.long, device=self.device)  # noqa: E731
        draws = torch.zeros(nb, self.rcfg.block_size - 1, device=self.device)
        return RoundBuffers(z(nb).fill_(self.rcfg.batch_size), z(nb, self.state.rect_width), z(nb), draws)

    # ---------------------------------------------------------------------------------------- host -> device
    def to_device(self, array) -> torch.Tensor:
        """A host array on the device: through pinned memory, non-blocking on CUDA (no stream sync)."""
        t = torch.as_tensor(np.ascontiguousarray(array))
        if self.device.type != "cuda":
            return t.to(self.device)
        return t.pin_memory().to(self.device, non_blocking=True)

    def upload_page_tables(self) -> None:
        """Copy the page-table rows the block manager changed to the device."""
        rows = self.blocks.take_dirty()
        if rows:
            self.state.page_table.index_copy_(0, self.to_device(np.array(rows)),
                                              self.to_device(self.blocks.page_table[rows]))

    def set_rows(self, nb: int, rows: list[int]) -> RoundBuffers:
        """Write a round's row -> slot map into bucket nb's static buffer."""
        buf = self.buffers[nb]
        buf.rows.copy_(self.to_device(np.array(rows, dtype=np.int64)), non_blocking=True)
        return buf

    def upload_plan(self, plan) -> RoundBuffers:
        """The device side of a host-only :class:`~.scheduler.RoundPlan`: the page-table rows it allocated and its
        row -> slot map; returns the bucket's buffers (the window rectangle is the round strategy's)."""
        self.upload_page_tables()
        return self.set_rows(plan.nb, plan.rows)

    def build_rect(self, buf: RoundBuffers, packed: bool) -> None:
        """Fill the bucket's window rectangle: fixed-shape (overlap; one graph replay on CUDA) or the
        data-dependent gathers (sync: eager, its two host syncs cannot be captured)."""
        g = None if packed else self.graphs.get(("rect", buf.rows.shape[0]))
        if g is not None:
            g()
        else:
            self._fill_rect(buf, packed)

    def _fill_rect(self, buf: RoundBuffers, packed: bool) -> None:
        rect, c = (rect_packed if packed else rect_fixed)(self.state, buf.rows)
        buf.rect.copy_(rect)
        buf.rect_len.copy_(c)

    # ---------------------------------------------------------------------------------------- phases
    def prefill(self, slot: int, prompt: list[int], request=None) -> torch.Tensor:
        """Prefill one request into ``slot`` (its pages must be allocated and uploaded); first token [1]. The prompt
        is uploaded once and each chunk sliced on the device; under the fault ``token-list-rebuild`` each chunk's
        ids come from rebuilding ``request``'s whole token list instead (runtime/faults.py)."""
        chunk_ids = self.faults.prefill_chunk_ids(self, request) if request is not None else None
        ids = self.to_device(np.array(prompt, dtype=np.int64))
        return prefill_request(self.target, self.draft, self.state, slot, ids, self.rcfg.prefill_chunk, chunk_ids)

    def draft_fn(self, nb: int):
        """The draft block of bucket nb as a no-argument call (a graph body)."""
        buf = self.buffers[nb]
        k = self.rcfg.tree_topk if self.rcfg.tree else 0  # a tree also needs each position's top-k
        return lambda: draft_block(self.draft, self.state, buf.rows, buf.rect, buf.rect_len, k)

    def verify_fn(self, nb: int, draft_tokens: torch.Tensor):
        """The chain verify of bucket nb over ``draft_tokens`` as a no-argument call (a graph body)."""
        buf = self.buffers[nb]
        return lambda: verify_block(self.target, self.state, buf.rows, draft_tokens)

    def rect_fn(self, nb: int):
        """The fixed-shape window rectangle of bucket nb as a no-argument call (a graph body)."""
        buf = self.buffers[nb]
        return lambda: self._fill_rect(buf, packed=False)

    def capture_graphs(self, capture_bucket: Callable[[int, object], None]) -> dict[str, dict[int, int | None]]:
        """Capture every bucket's graphs (CUDA only) with ``capture_bucket(nb, pool)``, the round strategy's (it
        adds them to ``graphs``). Each graph a process makes counts toward the step past which every node costs more
        (GraphedCall). Returns node counts per phase and bucket. Capture runs with every row on the scratch slot, so
        it writes only the garbage page; capture order is replay order (one stream, one shared pool)."""
        pool = torch.cuda.graph_pool_handle()
        with torch.no_grad():
            for nb in self.buckets:
                capture_bucket(nb, pool)
        torch.cuda.synchronize()  # SYNC (deliberate, start-up only): capture finished before decoding starts
        return self.node_counts()

    def capture_rect_draft(self, nb: int, pool) -> GraphedCall:
        """Bucket nb's window-rectangle and draft-block graphs; returns the draft's (its outputs feed the verify)."""
        self.graphs["rect", nb] = GraphedCall(f"rect_bs{nb}", self.rect_fn(nb), pool)
        d = self.graphs["draft", nb] = GraphedCall(f"draft_bs{nb}", self.draft_fn(nb), pool)
        return d

    def node_counts(self) -> dict[str, dict[int, int | None]]:
        """{"draft": {bucket: nodes}, "verify": {...}} of the captured graphs (tree mode adds "tree" with the gpu
        builder, and "commit")."""
        out: dict[str, dict[int, int | None]] = {"draft": {}, "verify": {}}
        for (phase, nb), g in self.graphs.items():
            out.setdefault(phase, {})[nb] = g.num_nodes
        return out

    def replay_or_run(self, phase: str, nb: int, fn):
        """The outputs of bucket nb's graph ``phase`` (replayed) when captured, else of ``fn()`` (eager)."""
        g = self.graphs.get((phase, nb))
        return g() if g is not None else fn()

    def run_draft(self, nb: int):
        """(tokens [nb, B], draft states) for bucket nb: graph replay, or eager; in tree mode also (logp, ids)
        [nb, B, k], each position's top-k."""
        return self.replay_or_run("draft", nb, self.draft_fn(nb))

    def draw_acceptance(self, nb: int) -> None:
        """The bench preset's simulated acceptance: this round's draws into bucket nb's static buffer (eager, one
        kernel: a graph would replay the generator offset it captured); nothing under greedy verification."""
        if self.generator is not None:
            acceptance_draws(self.buffers[nb].draws, self.generator)

    def device_lengths_to_host(self) -> np.ndarray:
        """SYNC (deliberate; the sync scheduler's, DESIGN.md "Schedulers: sync and overlap"): exact accept-dependent
        lengths, copied to the host with a blocking device-to-host copy that waits for every queued round."""
        return self.state.lengths.cpu().numpy()
