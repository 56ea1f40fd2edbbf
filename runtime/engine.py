"""The decode loop: admit, plan, run a round, read the previous round's results (nano-vllm's LLMEngine.step,
with the host one round ahead of the device).

Each iteration enqueues round n and then reads everything enqueued before it (round n - 1, and the prefills
admitted while planning round n): results are read one round late through pinned non-blocking copies and
events, under both schedulers, so both make the same admission and retirement decisions. A request that
finished in round n - 1 rides along in round n (its output there is discarded), then its slot is freed and a
waiting request is admitted into it.
"""
from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import torch

from . import faults as F
from .annotate import annotate
from .config import RuntimeConfig
from .model_runner import ModelRunner, Readback
from .models.model import Transformer
from .graphs import bucket_for
from .scheduler import RoundPlan, make_scheduler
from .sequence import Request


class RequestError(ValueError):
    """A request the engine cannot serve (empty prompt, or too long for the context)."""


def check_request(prompt_len: int, max_new_tokens: int, rcfg: RuntimeConfig) -> None:
    """RequestError unless 1 <= prompt_len and prompt_len + max_new_tokens + B + span <= max_seq_len (one round may
    run past a request's end before the host reads that it finished, and each round writes span positions: B, or
    max(B, N) for a draft tree of N nodes)."""
    if prompt_len < 1:
        raise RequestError("empty prompt")
    if max_new_tokens < 1:
        raise RequestError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if prompt_len + max_new_tokens + rcfg.block_size + rcfg.round_span > rcfg.max_seq_len:
        what = (f"2 blocks of {rcfg.block_size}" if rcfg.round_span == rcfg.block_size else
                f"a block of {rcfg.block_size} + a tree of {rcfg.tree_budget}")
        raise RequestError(f"prompt of {prompt_len} tokens + {max_new_tokens} new tokens + {what} exceeds the "
                           f"context of {rcfg.max_seq_len} tokens")


@dataclass
class DecodeStats:
    """rounds: verify rounds run; tau: mean tokens emitted per live request-round (accepted + bonus);
    tround_ms: median host period between round starts over steady rounds (no admission in either; all rounds
    if none is steady); tpot_ms = tround_ms / tau (seed 000); tokens_per_s: all tokens / whole wall time
    (prefill included); round_start_s: each round's start, seconds from the call's start."""

    rounds: int
    tau: float
    tokens: int
    elapsed_s: float
    tokens_per_s: float
    tround_ms: float
    tpot_ms: float
    round_tau: list = field(default_factory=list)
    round_start_s: list = field(default_factory=list)


class Engine:
    """Block-speculative decoding of many prompts with one target and one draft. ``runner_cls``: the model runner
    a subclass swaps in (runtime/plain.py: the target's plain greedy decoding, no draft)."""

    runner_cls = ModelRunner

    def __init__(self, target: Transformer, draft: Transformer, rcfg: RuntimeConfig, eos_token_id: int | None = None):
        if target.config.vocab_size != draft.config.vocab_size:
            raise RequestError(f"draft vocabulary {draft.config.vocab_size} != target vocabulary "
                               f"{target.config.vocab_size}")
        self.rcfg, self.eos_token_id = rcfg, eos_token_id
        self.runner = self.runner_cls(target, draft, rcfg)
        self.scheduler = make_scheduler(rcfg.scheduler, self.runner)
        self.graph_nodes: dict = {}
        if self.runner.device.type == "cuda":
            self._prewarm()
            if rcfg.cuda_graphs:
                self.graph_nodes = self.runner.capture_graphs()
            if "jit-new-shape" in rcfg.faults:  # the fault's single-shape warm-up: the full batch, int64 lengths
                F.prewarm_window_lengths(self.runner, [bucket_for(rcfg.batch_size, self.runner.buckets)],
                                         (torch.int64,))

    def _prewarm(self) -> None:
        """Run one prefill on the scratch slot before serving, so Triton (fla) compiles now, not mid-decode."""
        with torch.no_grad():
            n = min(self.rcfg.prefill_chunk + 1, self.rcfg.max_seq_len - self.rcfg.block_size)
            self.runner.prefill(self.runner.scratch, [0] * n)
            self.runner.state.lengths[self.runner.scratch:].fill_(0)
        torch.cuda.synchronize()  # SYNC (deliberate, start-up only)

    def check_request(self, prompt: list, max_new_tokens: int) -> None:
        """See the module function ``check_request``."""
        check_request(len(prompt), max_new_tokens, self.rcfg)

    @torch.no_grad()
    def generate(self, prompts: list, max_new_tokens: int, on_tokens: Callable[[int], None] | None = None,
                 on_round: Callable[[int], None] | None = None) -> tuple[list[Request], DecodeStats]:
        """Decode every prompt (token id lists). ``on_tokens(n)`` is called as n new tokens are read back;
        ``on_round(i)`` after round i is enqueued (a hook for capture: warm-up, then profiling)."""
        reqs = [Request(i, list(p), max_new_tokens, self.eos_token_id) for i, p in enumerate(prompts)]
        if self.runner.generator is not None:  # simulated acceptance: the same draws on every call
            self.runner.generator.manual_seed(self.rcfg.seed)
        for r in reqs:
            self.check_request(r.prompt, max_new_tokens)
        waiting, running = deque(reqs), {}
        self.running = running  # slot -> live Request (capture's --shrink-at-round cuts some mid-decode)
        free = list(range(self.rcfg.batch_size))
        pending: deque = deque()
        self._on_tokens = on_tokens or (lambda n: None)
        round_tau: list = []
        self.round_tau = round_tau  # per-round accepted tokens as read so far (capture reads it mid-decode)
        t0, rounds = time.perf_counter(), 0
        starts, admitted = [], []
        while waiting or running:
            starts.append(time.perf_counter() - t0)
            with annotate("round"):
                with annotate("plan"):
                    admitted.append(self._admit(waiting, running, free, pending))
                    plan = self.scheduler.plan(rounds, running)
                self._run_round(plan, pending)
            current = pending[-1]
            with annotate("read"):
                while pending[0] is not current:
                    self._process(pending.popleft(), running, free, round_tau)
            rounds += 1
            if on_round is not None:
                on_round(rounds)
        while pending:
            self._process(pending.popleft(), running, free, round_tau)
        elapsed = time.perf_counter() - t0
        live = sum(r.rounds for r in reqs)
        tau = sum(r.accepted for r in reqs) / live if live else 0.0
        tokens = sum(len(r.output) for r in reqs)
        periods = [b - a for i, (a, b) in enumerate(zip(starts, starts[1:])) if not admitted[i] and not admitted[i + 1]]
        periods = periods or [b - a for a, b in zip(starts, starts[1:])] or [elapsed]
        tround = 1e3 * statistics.median(periods)
        return reqs, DecodeStats(rounds, tau, tokens, elapsed, tokens / elapsed if elapsed else 0.0, tround,
                                 tround / tau if tau else 0.0, round_tau, starts)

    def _admit(self, waiting: deque, running: dict, free: list, pending: deque) -> int:
        n = 0
        while free and waiting:
            n += 1
            r, slot = waiting.popleft(), free.pop(0)
            r.slot, r.committed_len = slot, len(r.prompt)
            self.runner.blocks.ensure(slot, len(r.prompt) + self.rcfg.round_span)
            self.runner.upload_page_tables()
            with annotate("prefill"):
                first = self.runner.prefill(slot, r.prompt, r)
            pending.append(("prefill", r, Readback({"tok": first})))
            running[slot] = r
        return n

    def _run_round(self, plan: RoundPlan, pending: deque) -> None:
        nb, run = plan.nb, self.runner
        if getattr(run, "tree", None) is not None:
            self._run_tree_round(plan, pending)
            return
        with annotate("draft"):
            draft_tokens, drf_states = run.run_draft(nb)
        # the simulated acceptance's draws (eager; nothing under greedy verification), before the verify: on CUDA
        # the verify graph also accepts and commits
        with annotate("accept"):
            run.draw_acceptance(nb)
        with annotate("verify"):
            pred, tgt_states = run.run_verify(nb, draft_tokens)
        with annotate("commit"):  # accept + commit: inside the verify graph on CUDA, eager otherwise
            tau = run.accept_commit(nb, draft_tokens, pred, tgt_states, drf_states)
        with annotate("sample"):
            pending.append(("round", plan, Readback({"pred": pred, "tau": tau})))

    def _run_tree_round(self, plan: RoundPlan, pending: deque) -> None:
        """A draft-tree round (runtime/tree.py): draft, build the tree, verify it, accept a path, commit it."""
        nb, run, tree = plan.nb, self.runner, self.runner.tree
        with annotate("draft"):
            drafted = run.run_draft(nb)
        with annotate("tree"):
            tree.build(nb, drafted)
        with annotate("verify"):
            pred, tgt_states = tree.verify(nb)
        with annotate("commit"):  # accept + commit: one graph on CUDA
            emitted, tau = tree.accept_commit(nb, pred, tgt_states)
        with annotate("sample"):
            pending.append(("round", plan, Readback({"pred": emitted, "tau": tau})))

    def _process(self, item, running: dict, free: list, round_tau: list) -> None:
        kind, what, rb = item
        data = rb.get()
        if kind == "prefill":
            n0 = len(what.output)
            done = what.append(data["tok"])
            self._on_tokens(len(what.output) - n0)
            if done:
                self._retire(what, running, free)
            return
        taus = []
        for i, r in enumerate(what.requests):
            if r is None or r.finished:
                continue  # padding, or a request that finished in an earlier round (this round's output is void)
            t = int(data["tau"][i])
            r.rounds, r.accepted, r.committed_len = r.rounds + 1, r.accepted + t, r.committed_len + t
            taus.append(t)
            n0 = len(r.output)
            done = r.append(data["pred"][i, :t])
            self._on_tokens(len(r.output) - n0)
            if done:
                self._retire(r, running, free)
        round_tau.append(taus)

    def _retire(self, r: Request, running: dict, free: list) -> None:
        running.pop(r.slot, None)
        self.runner.blocks.free(r.slot)
        free.append(r.slot)
        free.sort()
