"""The decode loop: admit, plan, run a round, read the previous round's results (nano-vllm's LLMEngine.step,
with the host one round ahead of the device).

Each step schedules round n on the host (admission and prefill of waiting requests, the round plan), runs it (the
round strategy enqueues its device work) and postprocesses everything enqueued before it (round n - 1, and the
prefills admitted while planning round n): results are read one round late through pinned non-blocking copies
and events, under both schedulers, so both make the same admission and retirement decisions. A request that
finished in round n - 1 rides along in round n (its output there is discarded), then its slot is freed and a
waiting request is admitted into it.

Observers (capture, progress bars, benchmarks) see the decode through :class:`EngineHooks`, never through the
engine's attributes.
"""
from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable

import torch

from ..annotate import annotate
from ..config import RuntimeConfig
from ..faults import Faults
from ..models.model import Transformer
from .block_manager import BlockManager
from .graphs import bucket_for, device_us
from .hooks import CallbackHooks, EngineHooks, RoundEvent
from .model_runner import ModelRunner, Readback
from .rounds import ChainRound, PlainRound, RoundStrategy
from .scheduler import Batch, RoundPlan, make_scheduler
from .sequence import Request
from .tree_round import TreeRound


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
    if none is steady); tpot_ms = tround_ms / tau (DESIGN.md "Rounds"); tokens_per_s: all tokens / whole wall time
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


# ---------------------------------------------------------------------------------------------------- the loop
@dataclass
class InFlight:
    """Device work enqueued and not read yet: a prefill (``what`` = its Request) or a round (its RoundPlan)."""

    kind: str                    # "prefill" | "round"
    what: object
    readback: Readback


@dataclass
class DecodeLoop:
    """The per-call state of ``generate``: the batch, the work in flight, and what was read so far."""

    batch: Batch
    hooks: EngineHooks
    t0: float
    pending: deque = field(default_factory=deque)
    rounds: int = 0
    round_tau: list = field(default_factory=list)     # per read round: accepted tokens of each live request
    round_start_s: list = field(default_factory=list)
    admitted: list = field(default_factory=list)       # per round: requests admitted while planning it


class Engine:
    """Block-speculative decoding of many prompts with one target and one draft. ``round_kind``: the round
    strategy (rounds.py / tree_round.py): "chain", or "tree" when ``rcfg.tree_budget`` > 0; PlainEngine's is
    "plain"."""

    round_kind: str | None = None

    def __init__(self, target: Transformer, draft: Transformer, rcfg: RuntimeConfig, eos_token_id: int | None = None):
        if target.config.vocab_size != draft.config.vocab_size:
            raise RequestError(f"draft vocabulary {draft.config.vocab_size} != target vocabulary "
                               f"{target.config.vocab_size}")
        self.rcfg, self.eos_token_id = rcfg, eos_token_id
        self.faults = Faults.from_names(rcfg.faults)
        self.runner = ModelRunner(target, draft, rcfg, self.faults, BlockManager.for_config(rcfg))
        self.scheduler = make_scheduler(rcfg.scheduler, self.runner)  # owns the runner's block manager from here
        kind = self.round_kind or ("tree" if rcfg.tree else "chain")
        self.strategy: RoundStrategy = {"chain": ChainRound, "plain": PlainRound, "tree": TreeRound}[kind](self.runner)
        self.graph_nodes: dict = {}
        self.round_tau: list = []  # per-round accepted tokens read so far by the current generate (its stats too)
        if self.runner.device.type == "cuda":
            self._prewarm()
            if rcfg.cuda_graphs:
                self.graph_nodes = self.capture_graphs()
            self.faults.prewarm(self.runner, bucket_for(rcfg.batch_size, self.runner.buckets))  # jit-new-shape

    def _prewarm(self) -> None:
        """Run one prefill on the scratch slot before serving, so Triton (fla) compiles now, not mid-decode."""
        with torch.no_grad():
            n = min(self.rcfg.prefill_chunk + 1, self.rcfg.max_seq_len - self.rcfg.block_size)
            self.runner.prefill(self.runner.scratch, [0] * n)
            self.runner.state.lengths[self.runner.scratch:].fill_(0)
        torch.cuda.synchronize()  # SYNC (deliberate, start-up only)

    def capture_graphs(self) -> dict[str, dict[int, int | None]]:
        """Capture the round strategy's CUDA graphs for every bucket; node counts per phase and bucket."""
        return self.runner.capture_graphs(self.strategy.capture_bucket)

    def graph_device_us(self) -> dict[tuple[str, int], list[float]]:
        """{(phase, bucket): [device µs]} of the graph replays timed while :meth:`RoundEvent.time_graph_device` was
        on (:func:`.graphs.device_us`); synchronizes the device: call it after the decode."""
        return device_us(self.runner.graphs)

    def check_request(self, prompt: list, max_new_tokens: int) -> None:
        """See the module function ``check_request``."""
        check_request(len(prompt), max_new_tokens, self.rcfg)

    @torch.no_grad()
    def generate(self, prompts: list, max_new_tokens: int, on_tokens: Callable[[int], None] | None = None,
                 on_round: Callable[[int], None] | None = None,
                 hooks: EngineHooks | None = None) -> tuple[list[Request], DecodeStats]:
        """Decode every prompt (token id lists). ``hooks``: the observer (:class:`EngineHooks`); or the two plain
        callbacks ``on_tokens(n)`` (n new tokens read back) and ``on_round(i)`` (round i enqueued)."""
        if hooks is None:
            hooks = CallbackHooks(on_tokens, on_round)
        reqs = [Request(i, list(p), max_new_tokens, self.eos_token_id) for i, p in enumerate(prompts)]
        if self.runner.generator is not None:  # simulated acceptance: the same draws on every call
            self.runner.generator.manual_seed(self.rcfg.seed)
        for r in reqs:
            self.check_request(r.prompt, max_new_tokens)
        loop = DecodeLoop(Batch(deque(reqs), {}, list(range(self.rcfg.batch_size))), hooks, time.perf_counter())
        self.round_tau = loop.round_tau
        running_view = MappingProxyType(loop.batch.running)
        while loop.batch.waiting or loop.batch.running:
            self.step(loop)
            hooks.on_round(RoundEvent(loop.rounds, running_view, self.runner.graphs))
        while loop.pending:
            self._postprocess(loop.pending.popleft(), loop)
        return reqs, self._stats(reqs, loop, time.perf_counter() - loop.t0)

    def step(self, loop: DecodeLoop) -> None:
        """One round: schedule it (admit, plan, upload), run it (enqueue), postprocess what was enqueued before."""
        loop.round_start_s.append(time.perf_counter() - loop.t0)
        with annotate("round"):
            with annotate("plan"):
                loop.admitted.append(self._admit(loop))
                plan = self.plan_round(loop.rounds, loop.batch.running)
            result = self.strategy.run_round(plan)
            with annotate("sample"):
                loop.pending.append(InFlight("round", plan, result.readback()))
        current = loop.pending[-1]
        with annotate("read"):
            while loop.pending[0] is not current:
                self._postprocess(loop.pending.popleft(), loop)
        loop.rounds += 1

    def plan_round(self, index: int, running: dict[int, Request]) -> RoundPlan:
        """The scheduler's host-only plan for round ``index``, uploaded by the runner, the strategy's inputs
        prepared (the draft window rectangle)."""
        self.faults.before_plan(self.runner.tp, self.rcfg.late_rank_ms)  # late-rank (tensor parallel only)
        plan = self.scheduler.plan(index, running)
        buf = self.runner.upload_plan(plan)
        self.strategy.prepare(plan, buf)
        return plan

    def _admit(self, loop: DecodeLoop) -> int:
        n = 0
        while (r := self.scheduler.admit(loop.batch)) is not None:
            n += 1
            self.runner.upload_page_tables()
            with annotate("prefill"):
                first = self.runner.prefill(r.slot, r.prompt, r)
            loop.pending.append(InFlight("prefill", r, Readback({"tok": first})))
            loop.batch.running[r.slot] = r
            loop.hooks.on_prefill(r)
        return n

    def _postprocess(self, item: InFlight, loop: DecodeLoop) -> None:
        data = item.readback.get()  # SYNC (deliberate): waits on the readback's event, normally long completed
        hooks = loop.hooks
        if item.kind == "prefill":
            r = item.what
            n0 = len(r.output)
            done = r.append(data["tok"])
            hooks.on_tokens(len(r.output) - n0)
            if done:
                self.scheduler.retire(r, loop.batch)
            return
        taus = []
        for i, r in enumerate(item.what.requests):
            if r is None or r.finished:
                continue  # padding, or a request that finished in an earlier round (this round's output is void)
            t = int(data["tau"][i])
            r.rounds, r.accepted, r.committed_len = r.rounds + 1, r.accepted + t, r.committed_len + t
            taus.append(t)
            n0 = len(r.output)
            done = r.append(data["pred"][i, :t])
            hooks.on_tokens(len(r.output) - n0)
            if done:
                self.scheduler.retire(r, loop.batch)
        loop.round_tau.append(taus)
        hooks.on_round_read(item.what.index + 1, taus)

    @staticmethod
    def _stats(reqs: list[Request], loop: DecodeLoop, elapsed: float) -> DecodeStats:
        live = sum(r.rounds for r in reqs)
        tau = sum(r.accepted for r in reqs) / live if live else 0.0
        tokens = sum(len(r.output) for r in reqs)
        starts, admitted = loop.round_start_s, loop.admitted
        periods = [b - a for i, (a, b) in enumerate(zip(starts, starts[1:])) if not admitted[i] and not admitted[i + 1]]
        periods = periods or [b - a for a, b in zip(starts, starts[1:])] or [elapsed]
        tround = 1e3 * statistics.median(periods)
        return DecodeStats(loop.rounds, tau, tokens, elapsed, tokens / elapsed if elapsed else 0.0, tround,
                           tround / tau if tau else 0.0, loop.round_tau, starts)


class PlainEngine(Engine):
    """The target's plain greedy decoding in the same loop (:class:`~.rounds.PlainRound`):
    ``PlainEngine(target, rcfg, eos_token_id, draft=None)``; ``generate`` as :meth:`Engine.generate` (τ = 1,
    Tround = TPOT). ``rcfg`` is taken with B = 1 and no faults. The draft model, when given, is used by prefill only
    (``prefill_request`` fills both caches); without one the target stands in for it (its prefill then runs twice;
    prefill is outside the steady rounds)."""

    round_kind = "plain"

    def __init__(self, target: Transformer, rcfg: RuntimeConfig, eos_token_id: int | None = None,
                 draft: Transformer | None = None):
        super().__init__(target, draft if draft is not None else target, rcfg.replace(block_size=1, faults=()),
                         eos_token_id)
