"""The model runner: both models, the device state, per-bucket static buffers and CUDA graphs, and the host <->
device traffic of a round (pinned non-blocking copies, events). nano-vllm's model_runner.py, for speculation.

It runs phases; it decides nothing (the scheduler plans, the engine loops).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .cache.paged import BlockManager
from .config import RuntimeConfig
from .faults import eager_commit_glue, token_list_rebuild
from .graphs import GraphedCall, batch_buckets
from .models.model import Transformer
from .spec.accept import acceptance_draws, greedy_accept, simulated_tau
from .spec.commit import commit_round
from .spec.draft import draft_block
from .spec.plan import rect_fixed, rect_packed
from .spec.prefill import prefill_request
from .spec.state import DecodeState
from .spec.verify import verify_block


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
    """Owns target + draft, the DecodeState, the block manager, and per-bucket buffers and graphs."""

    def __init__(self, target: Transformer, draft: Transformer, rcfg: RuntimeConfig):
        self.target, self.draft, self.rcfg = target, draft, rcfg
        self.device = next(target.parameters()).device
        self.dtype = next(target.parameters()).dtype
        slots = rcfg.batch_size + 1
        max_pages = rcfg.max_seq_len // rcfg.page_size
        self.blocks = BlockManager(slots, max_pages, rcfg.page_size)
        self.state = DecodeState.allocate(target.config, draft.config, rcfg, self.blocks.num_pages, self.device,
                                          self.dtype)
        if rcfg.fused_kernels and not rcfg.tree and "eager-commit-glue" not in rcfg.faults:
            # the verify hands the commit its layers' projections and the commit recomputes the accepted prefix's
            # state (a tree's accepted path is not a prefix; the fault's glue needs every per-token state)
            self.state.tgt_lin.recompute_from(target)
        self.buckets = batch_buckets(rcfg.batch_size, rcfg.graph_bucket_mode)
        self.buffers = {nb: self._new_buffers(nb) for nb in self.buckets}
        self.graphs: dict[tuple[str, int], GraphedCall] = {}
        # on CUDA the verify graph also accepts and commits, but for the fault's glue (host work by definition)
        self.commit_in_verify_graph = "eager-commit-glue" not in rcfg.faults
        self.generator = None
        if rcfg.sim_accept_rate is not None:
            self.generator = torch.Generator(device=self.device)
            self.generator.manual_seed(rcfg.seed)
        self.tree = None  # tree mode (issue 8): the tree round's buffers, graphs and phases (runtime/tree.py)
        if rcfg.tree:
            from .tree import TreeRunner
            self.tree = TreeRunner(self)

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

    def build_rect(self, buf: RoundBuffers, packed: bool) -> None:
        """Fill the bucket's window rectangle: fixed-shape (overlap; one graph replay on CUDA) or the seed's
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
        chunk_ids = None
        if request is not None and "token-list-rebuild" in self.rcfg.faults:
            chunk_ids = lambda a, b: token_list_rebuild(self, request, a, b)  # noqa: E731
        ids = self.to_device(np.array(prompt, dtype=np.int64))
        return prefill_request(self.target, self.draft, self.state, slot, ids, self.rcfg.prefill_chunk, chunk_ids)

    def _draft_fn(self, nb: int):
        buf = self.buffers[nb]
        k = self.rcfg.tree_topk if self.rcfg.tree else 0  # a tree also needs each position's top-k
        return lambda: draft_block(self.draft, self.state, buf.rows, buf.rect, buf.rect_len, k)

    def _verify_fn(self, nb: int, draft_tokens: torch.Tensor):
        buf = self.buffers[nb]
        return lambda: verify_block(self.target, self.state, buf.rows, draft_tokens)

    def _rect_fn(self, nb: int):
        buf = self.buffers[nb]
        return lambda: self._fill_rect(buf, packed=False)

    def capture_graphs(self) -> dict[str, dict[int, int | None]]:
        """Capture every bucket's graphs (CUDA only): the window rectangle (``rect``), the draft block, and the verify
        with accept + commit in the same graph (``verify``; the commit stays eager under the ``eager-commit-glue``
        fault, whose glue is host work by definition). Three graphs a bucket: each graph a process makes counts
        toward the step past which every node costs more (GraphedCall). Returns node counts per phase and bucket.
        Capture runs with every row on the scratch slot, so it writes only the garbage page; capture order is
        replay order (one stream, one shared pool)."""
        pool = torch.cuda.graph_pool_handle()
        with torch.no_grad():
            for nb in self.buckets:
                self._capture_bucket(nb, pool)
        torch.cuda.synchronize()  # SYNC (deliberate, start-up only): capture finished before decoding starts
        return self.node_counts()

    def _capture_bucket(self, nb: int, pool) -> None:
        self.graphs["rect", nb] = GraphedCall(f"rect_bs{nb}", self._rect_fn(nb), pool)
        d = self.graphs["draft", nb] = GraphedCall(f"draft_bs{nb}", self._draft_fn(nb), pool)
        if self.tree is not None:  # tree mode: tree build (gpu builder), tree verify, accept + commit
            self.tree.capture(nb, d.outputs, pool)
            return
        self._capture_verify_commit(nb, d.outputs[0], d.outputs[1], pool)

    def _capture_verify_commit(self, nb: int, draft_tokens, drf_states, pool) -> None:
        """One graph ``verify``: the verify, then (unless the fault's glue is on) accept + commit; its outputs are
        (pred, target states[, tau]). The acceptance draws (simulated acceptance) are written before it is
        replayed (Engine._run_round)."""
        verify = self._verify_fn(nb, draft_tokens)
        if not self.commit_in_verify_graph:
            fn = verify
        else:
            def fn():
                pred, tgt_states = verify()
                return pred, tgt_states, self._accept_commit(nb, draft_tokens, pred, tgt_states, drf_states)[0]
        self.graphs["verify", nb] = GraphedCall(f"verify_bs{nb}", fn, pool)

    def node_counts(self) -> dict[str, dict[int, int | None]]:
        """{"draft": {bucket: nodes}, "verify": {...}} of the captured graphs (tree mode adds "tree" with the gpu
        builder, and "commit")."""
        out: dict[str, dict[int, int | None]] = {"draft": {}, "verify": {}}
        for (phase, nb), g in self.graphs.items():
            out.setdefault(phase, {})[nb] = g.num_nodes
        return out

    def run_draft(self, nb: int):
        """(tokens [nb, B], draft states) for bucket nb: graph replay, or eager; in tree mode also (logp, ids)
        [nb, B, k], each position's top-k."""
        g = self.graphs.get(("draft", nb))
        return g() if g is not None else self._draft_fn(nb)()

    def run_verify(self, nb: int, draft_tokens: torch.Tensor):
        """(pred [nb, B], target states): graph replay (its input is the draft graph's output; the same graph then
        accepts and commits the round, see :meth:`accept_commit`), or eager."""
        g = self.graphs.get(("verify", nb))
        if g is None:
            return self._verify_fn(nb, draft_tokens)()
        out = g()
        return out[0], out[1]

    def draw_acceptance(self, nb: int) -> None:
        """The bench preset's simulated acceptance: this round's draws into bucket nb's static buffer (eager, one
        kernel: a graph would replay the generator offset it captured); nothing under greedy verification."""
        if self.generator is not None:
            acceptance_draws(self.buffers[nb].draws, self.generator)

    def accept_commit(self, nb: int, draft_tokens: torch.Tensor, pred: torch.Tensor, tgt_states,
                      drf_states) -> torch.Tensor:
        """tau [nb] after committing the round (graph replay on CUDA, or eager): greedy verification of
        ``draft_tokens`` against ``pred``, or the simulated acceptance over the draws of ``draw_acceptance``."""
        g = self.graphs.get(("verify", nb))
        if g is not None and self.commit_in_verify_graph:  # the verify graph run_verify replayed committed the round
            return g.outputs[2]
        return self._accept_commit(nb, draft_tokens, pred, tgt_states, drf_states)[0]

    def _accept_commit(self, nb: int, draft_tokens, pred, tgt_states, drf_states) -> tuple[torch.Tensor]:
        if self.generator is not None:
            tau = simulated_tau(self.buffers[nb].draws, self.rcfg.sim_accept_rate)
        else:
            tau = greedy_accept(draft_tokens, pred)
        self.commit(nb, pred, tau, tgt_states, drf_states)
        return (tau,)

    def commit(self, nb: int, pred, tau, tgt_states, drf_states) -> None:
        """Advance lengths, pending tokens and linear states of bucket nb's rows (the linear states through the
        per-layer eager glue under the ``eager-commit-glue`` fault)."""
        rows = self.buffers[nb].rows
        if "eager-commit-glue" not in self.rcfg.faults:
            commit_round(self.state, rows, pred, tau, tgt_states, drf_states)
            return
        commit_round(self.state, rows, pred, tau, None, None, linear=False)
        eager_commit_glue(rows, tau, [(self.state.tgt_lin, self.target, tgt_states),
                                      (self.state.drf_lin, self.draft, drf_states)])

    def device_lengths_to_host(self) -> np.ndarray:
        """SYNC (deliberate; the sync scheduler's, seed 000): exact accept-dependent lengths, copied to the host
        with a blocking device-to-host copy that waits for every queued round."""
        return self.state.lengths.cpu().numpy()
