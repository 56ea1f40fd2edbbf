"""Round strategies: what one verify round runs on the device, between the plan and the readback. The engine holds
one and calls ``strategy.prepare(plan, buf)`` (inside its ``plan`` range), ``strategy.run_round(plan)`` (the
phases, each in its NVTX range) and, once at start-up on CUDA, ``strategy.capture_bucket(nb, pool)`` per bucket.

- :class:`ChainRound` (default): the draft block, the simulated acceptance's draws, one verify forward over the
  block, accept + commit (inside the verify's graph on CUDA).
- :class:`PlainRound`: the target's plain greedy decoding, one token per request per round, no draft (the floor the
  speculative speed-up is measured against). It is the chain round at B = 1 with the draft taken out: the verify
  forward over the block [last_tok] (``verify_block`` with no drafted token) yields the target's greedy next token,
  ``greedy_accept`` (or the bench preset's simulated acceptance) gives τ = 1, and the commit advances each row by
  one position. Same paged KV cache, schedulers and batch buckets; on CUDA one graph per bucket (the one-token
  target step with its accept + commit); no draft block, draft graph or window rectangle. At temperature 0 its
  output equals :func:`gaptrace.runtime.spec.reference.greedy_reference` token for token
  (tests/runtime/test_runtime_plain.py).
- :class:`~.tree_round.TreeRound` (``--tree-budget N``): a draft tree verified in one forward (tree_round.py).

The strategies are interchangeable: each satisfies :class:`RoundStrategy`, and the engine loop is the same.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from ..annotate import annotate
from ..faults import eager_commit_glue
from ..spec.accept import greedy_accept, simulated_tau
from ..spec.commit import commit_round
from .graphs import GraphedCall
from .model_runner import ModelRunner, Readback, RoundBuffers
from .scheduler import RoundPlan


@dataclass
class RoundResult:
    """A round's device outputs, enqueued and not read yet: ``tokens`` [nb, B] long (each row's first ``tau``
    are the round's emitted tokens), ``tau`` [nb] long in [1, B]."""

    tokens: torch.Tensor
    tau: torch.Tensor

    def readback(self) -> Readback:
        """Pinned non-blocking copies of both, read a round later (``Readback.get``: {"pred", "tau"})."""
        return Readback({"pred": self.tokens, "tau": self.tau})


class RoundStrategy(Protocol):
    """What the engine calls for one kind of round (chain, plain, tree)."""

    name: str

    def prepare(self, plan: RoundPlan, buf: RoundBuffers) -> None:
        """After the runner uploaded ``plan`` into bucket buffers ``buf``: the round's remaining inputs (the
        draft window rectangle)."""

    def run_round(self, plan: RoundPlan) -> RoundResult:
        """Enqueue the round's device work for bucket ``plan.nb``; no host sync unless a fault adds one."""

    def capture_bucket(self, nb: int, pool) -> None:
        """Capture bucket nb's CUDA graphs into the runner's ``graphs`` (capture order = replay order)."""


class ChainRound:
    """The block-speculative round: draft block, acceptance draws, verify, accept + commit."""

    name = "chain"

    def __init__(self, runner: ModelRunner):
        self.runner, self.faults = runner, runner.faults

    def prepare(self, plan: RoundPlan, buf: RoundBuffers) -> None:
        """The draft window rectangle (fixed-shape, or packed under the sync scheduler; faults: dd-gather,
        jit-new-shape)."""
        self.faults.build_window_rect(self.runner, buf, plan.packed_rect)

    def run_round(self, plan: RoundPlan) -> RoundResult:
        nb, run = plan.nb, self.runner
        with annotate("draft"):
            draft_tokens, drf_states = self.draft(nb)
        # the simulated acceptance's draws (eager; nothing under greedy verification), before the verify: on CUDA
        # the verify graph also accepts and commits
        with annotate("accept"):
            run.draw_acceptance(nb)
        with annotate("verify"):
            pred, tgt_states = self.verify(nb, draft_tokens)
        with annotate("commit"):  # accept + commit: inside the verify graph on CUDA, eager otherwise
            tau = self.accept_commit(nb, draft_tokens, pred, tgt_states, drf_states)
        return RoundResult(pred, tau)

    # ------------------------------------------------------------------------------------------------ graphs
    def capture_bucket(self, nb: int, pool) -> None:
        """Three graphs a bucket: the window rectangle (``rect``), the draft block, and the verify with accept +
        commit in the same graph (``verify``; the commit stays eager under the ``eager-commit-glue`` fault)."""
        d = self.runner.capture_rect_draft(nb, pool)
        self._capture_verify_commit(nb, d.outputs[0], d.outputs[1], pool)

    def _capture_verify_commit(self, nb: int, draft_tokens, drf_states, pool) -> None:
        """One graph ``verify``: the verify, then (unless the fault's glue is on) accept + commit; its outputs are
        (pred, target states[, tau]). The acceptance draws (simulated acceptance) are written before it is
        replayed (``run_round``)."""
        verify = self.runner.verify_fn(nb, draft_tokens)
        if self.faults.commit_on_host:
            fn = verify
        else:
            def fn():
                pred, tgt_states = verify()
                return pred, tgt_states, self._accept_commit(nb, draft_tokens, pred, tgt_states, drf_states)
        self.runner.graphs["verify", nb] = GraphedCall(f"verify_bs{nb}", fn, pool)

    # ------------------------------------------------------------------------------------------------ phases
    def draft(self, nb: int):
        """(draft tokens [nb, B], draft states): the draft block (graph replay, or eager)."""
        return self.runner.run_draft(nb)

    def verify(self, nb: int, draft_tokens: torch.Tensor):
        """(pred [nb, B], target states): graph replay (its input is the draft graph's output; the same graph then
        accepts and commits the round, see :meth:`accept_commit`), or eager."""
        g = self.runner.graphs.get(("verify", nb))
        if g is None:
            return self.runner.verify_fn(nb, draft_tokens)()
        out = g()
        return out[0], out[1]

    def accept_commit(self, nb: int, draft_tokens: torch.Tensor, pred: torch.Tensor, tgt_states,
                      drf_states) -> torch.Tensor:
        """tau [nb] after committing the round (graph replay on CUDA, or eager): greedy verification of
        ``draft_tokens`` against ``pred``, or the simulated acceptance over the draws of ``draw_acceptance``."""
        g = self.runner.graphs.get(("verify", nb))
        if g is not None and not self.faults.commit_on_host:  # the verify graph verify() replayed committed it
            return g.outputs[2]
        return self._accept_commit(nb, draft_tokens, pred, tgt_states, drf_states)

    def _accept_commit(self, nb: int, draft_tokens, pred, tgt_states, drf_states) -> torch.Tensor:
        run = self.runner
        if run.generator is not None:
            tau = simulated_tau(run.buffers[nb].draws, run.rcfg.sim_accept_rate)
        else:
            tau = greedy_accept(draft_tokens, pred)
        self.commit(nb, pred, tau, tgt_states, drf_states)
        return tau

    def commit(self, nb: int, pred, tau, tgt_states, drf_states) -> None:
        """Advance lengths, pending tokens and linear states of bucket nb's rows (the linear states through the
        per-layer eager glue under the ``eager-commit-glue`` fault)."""
        run = self.runner
        rows = run.buffers[nb].rows
        if not self.faults.eager_commit_glue:
            commit_round(run.state, rows, pred, tau, tgt_states, drf_states)
            return
        commit_round(run.state, rows, pred, tau, None, None, linear=False)
        eager_commit_glue(rows, tau, [(run.state.tgt_lin, run.target, tgt_states),
                                      (run.state.drf_lin, run.draft, drf_states)])


class PlainRound(ChainRound):
    """A chain round with no draft: the verify reads a constant empty draft block (B = 1)."""

    name = "plain"

    def __init__(self, runner: ModelRunner):
        super().__init__(runner)
        # [nb, 1] zeros: verify_block reads draft_tokens[:, :B - 1], i.e. none of it at B = 1
        self.no_draft = {nb: torch.zeros(nb, 1, dtype=torch.long, device=runner.device) for nb in runner.buckets}

    def prepare(self, plan: RoundPlan, buf: RoundBuffers) -> None:
        """No draft window to build."""

    def draft(self, nb: int):
        """(the constant empty draft block [nb, 1], no draft states): no device work."""
        return self.no_draft[nb], None

    def capture_bucket(self, nb: int, pool) -> None:
        """The one-token target step (verify at B = 1) with its accept + commit, one graph: no rectangle, no draft
        graph."""
        self._capture_verify_commit(nb, self.no_draft[nb], None, pool)

    def commit(self, nb: int, pred, tau, tgt_states, drf_states) -> None:
        """Lengths, pending token and the target's linear states; the draft's state is not kept."""
        run = self.runner
        rows = run.buffers[nb].rows
        commit_round(run.state, rows, pred, tau, None, None, linear=False)
        run.state.tgt_lin.commit(rows, tgt_states, tau)

