"""The target's plain greedy decoding inside the runtime: one token per request per round, no draft (the floor that
the speculative speed-up is measured against, issue 6).

It is the block-speculative loop at B = 1 with the draft taken out: the verify forward over the block
[last_tok] (``verify_block`` with no drafted token) yields the target's greedy next token, ``greedy_accept`` (or
the bench preset's simulated acceptance) gives τ = 1, and the commit advances each row by one position. Same paged
KV cache, same schedulers, same batch buckets, and on CUDA one graph per bucket (the one-token target step with its
accept + commit); the draft block, its graph and the draft window rectangle are skipped. At temperature 0 the output equals
:func:`gaptrace.runtime.spec.reference.greedy_reference` token for token (tests/test_runtime_plain.py).

The draft model, when given, is used by prefill only (``prefill_request`` fills both caches); without one the
target stands in for it (its prefill then runs twice; prefill is outside the steady rounds).
"""
from __future__ import annotations

import torch

from .config import RuntimeConfig
from .engine import Engine
from .model_runner import ModelRunner
from .models.model import Transformer
from .spec.commit import commit_round


class PlainRunner(ModelRunner):
    """A ModelRunner whose round has no draft: the verify reads a constant empty draft block."""

    def __init__(self, target: Transformer, draft: Transformer, rcfg: RuntimeConfig):
        super().__init__(target, draft, rcfg)
        # [nb, 1] zeros: verify_block reads draft_tokens[:, :B - 1], i.e. none of it at B = 1
        self.no_draft = {nb: torch.zeros(nb, 1, dtype=torch.long, device=self.device) for nb in self.buckets}

    def build_rect(self, buf, packed: bool) -> None:
        """No draft window to build."""

    def run_draft(self, nb: int):
        """(the constant empty draft block [nb, 1], no draft states): no device work."""
        return self.no_draft[nb], None

    def _capture_bucket(self, nb: int, pool) -> None:
        """The one-token target step (verify at B = 1) with its accept + commit, one graph: no rectangle, no draft
        graph."""
        self._capture_verify_commit(nb, self.no_draft[nb], None, pool)

    def commit(self, nb: int, pred, tau, tgt_states, drf_states) -> None:
        """Lengths, pending token and the target's linear states; the draft's state is not kept."""
        rows = self.buffers[nb].rows
        commit_round(self.state, rows, pred, tau, None, None, linear=False)
        self.state.tgt_lin.commit(rows, tgt_states, tau)


class PlainEngine(Engine):
    """The engine over :class:`PlainRunner`: ``PlainEngine(target, rcfg, eos_token_id, draft=None)``;
    ``generate`` as :meth:`Engine.generate` (τ = 1, Tround = TPOT). ``rcfg`` is taken with B = 1 and no faults."""

    runner_cls = PlainRunner

    def __init__(self, target: Transformer, rcfg: RuntimeConfig, eos_token_id: int | None = None,
                 draft: Transformer | None = None):
        super().__init__(target, draft if draft is not None else target, rcfg.replace(block_size=1, faults=()),
                         eos_token_id)
