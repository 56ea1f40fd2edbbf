"""Capture the runtime's live decode: warm up, then profile steady verify rounds (``gaptrace capture``).

The profiler is armed only after ``warmup_rounds`` rounds (graph capture and the fla prewarm happen even before,
in the engine's constructor) plus one discarded profiler warm-up round, then records ``rounds`` rounds with Python
stacks (:class:`gaptrace.capture.Capture`, one ``step()`` per round). The unprofiled baseline is measured in the
same process just before: the round periods of the warm-up rounds (the last :data:`UNPROFILED_ROUNDS`, outside the
first quarter: :func:`unprofiled_block`), the host cost of every graph launch in those rounds, and the host time of
every NVTX range in them (:func:`unprofiled_ranges`). The sidecar holds the config, per-round τ of the profiled
rounds, each graph's node count and unprofiled launch cost, and those range times, each graph's device span
timed with CUDA events in the :data:`DEVICE_TIMED_ROUNDS` rounds right after the profiled ones, and the periods of
the profiled rounds' own positions from a second, unprofiled decode of the same prompts after the capture
(:class:`ReferenceHooks`; not for a queue capture). The driver observes the engine only through its hook API (:class:`CaptureHooks`, an
``EngineHooks``): the round events, the rounds read, and the graph node counts the engine reports.
"""
from __future__ import annotations

import os
import re
import statistics
import time
from typing import Callable

from gaptrace.rangetimes import range_summary

from .annotate import record_host_ranges
from .engine import Engine, EngineHooks, RoundEvent
from .session import DecodeSetup, encode_prompts, run_config


UNPROFILED_ROUNDS = 30  # unprofiled round periods the sidecar keeps (at most), the replay model's reference


def unprofiled_block(periods_ms: list[float], keep: int = UNPROFILED_ROUNDS) -> list[float]:
    """The warm-up round periods the sidecar keeps as ``unprofiled_round_ms``: the last ``keep`` of them, never
    one of the first quarter (the first rounds still admit and prefill): ``periods[max(n − keep, n // 4):]``. With
    the default 40 warm-up rounds (39 periods: the first round's includes the set-up) that is 30 rounds."""
    n = len(periods_ms)
    return list(periods_ms[max(n - keep, n // 4):])


def range_timing_from(warmup_rounds: int, keep: int = UNPROFILED_ROUNDS) -> int:
    """The round hook index from which the NVTX ranges are timed unprofiled (``unprofiled_ranges``): the rounds
    after it up to the last warm-up round, i.e. the rounds whose periods :func:`unprofiled_block` keeps. With the
    default 40 warm-up rounds: rounds 10-40."""
    n = warmup_rounds - 1
    return max(n - keep, n // 4)


def unprofiled_ranges(ranges, rounds: int) -> list[dict]:
    """The sidecar's ``unprofiled_ranges``: per NVTX range timed unprofiled (:class:`runtime.annotate.HostRangeTimes`
    over ``rounds`` warm-up rounds), {"name", "mean_us" (host µs per occurrence, inclusive: nested ranges and any
    wait inside count), "per_round" (occurrences per round)}, sorted by name; [] when no round was timed."""
    if ranges is None:
        return []
    return range_summary(ranges.total_s, ranges.count, rounds)


DEVICE_TIMED_ROUNDS = 6  # rounds whose graph replays are timed on the device, right after the profiled ones


class _CaptureDone(Exception):
    """Raised from the round hook once the trace is written and the profiled rounds' τ has been read back:
    the rest of the decode is not needed."""


def fill_batch(texts: list[str], batch_size: int) -> list[str]:
    """Exactly ``batch_size`` prompts: the first ones, repeated cyclically when there are fewer. One full batch and
    no waiting requests, so no admission or bucket change lands inside the profiled rounds."""
    return [texts[i % len(texts)] for i in range(batch_size)]


def check_queue(batch_size: int, prompts: int, max_new_tokens: int | None, queue: bool) -> None:
    """ValueError (one line) unless a ``queue`` capture can admit inside its rounds: more prompts than the batch,
    and an explicit ``max_new_tokens`` (the default outlives the capture)."""
    if queue and prompts <= batch_size:
        raise ValueError(f"--queue needs more prompts than --batch-size {batch_size} (got {prompts}): the ones "
                         "beyond the batch are the queue")
    if queue and max_new_tokens is None:
        raise ValueError("--queue needs --max-new-tokens small enough for requests to finish inside the capture "
                         "(the default outlives it, so no request would be admitted)")


def capture_inputs(prompts_file: str | None = None, model_dirs: tuple[str | None, ...] = ()) -> tuple[str, ...]:
    """The files a capture reads, which neither of its outputs may replace: the prompts file and every file at the
    top of the model directories (config.json, the safetensors, the tokenizer's files)."""
    out = [prompts_file] if prompts_file else []
    for d in model_dirs:
        if d and os.path.isdir(d):
            out += [os.path.join(d, n) for n in sorted(os.listdir(d))]
    return tuple(out)


RANK_NAME = re.compile(r"rank[_-]?\d")  # what gaptrace.loader.trace_files ranks a directory's files by


def rank_trace_paths(directory: str, world: int) -> list[str]:
    """The traces of a ``--tp N`` capture, one per rank, in ``directory``: ``DIR/NAME.rank<r>.json.gz`` with NAME the
    directory's own name (so a copied file still says which capture and rank it is), each with its sidecar
    ``NAME.rank<r>.gaptrace.json`` beside it: the names gaptrace's loader reads a directory of per-rank files by
    (``gaptrace.loader.trace_files``). Checks only; the directory may not exist yet (:func:`make_rank_directory`).

    ValueError (one line) when ``directory`` is an existing non-directory, its parent is missing, NAME itself holds
    ``rank<digits>`` (the loader would take that for the rank), or the directory already holds a trace file that is
    not one of these (the loader would read it as another rank)."""
    d = directory.rstrip(os.sep) or directory
    name = os.path.basename(d)
    if not name or name in (".", ".."):
        raise ValueError(f"{directory!r}: a --tp capture writes into a directory: give it a name (-o DIR)")
    if RANK_NAME.search(name):
        raise ValueError(f"{directory}: the directory's name holds 'rank<N>', which gaptrace's loader would read as "
                         "every file's rank; rename it")
    if os.path.lexists(d) and not os.path.isdir(d):
        raise ValueError(f"{directory}: a --tp capture writes one trace per rank into a directory, and this is a file")
    if not os.path.isdir(os.path.dirname(os.path.abspath(d))):
        raise ValueError(f"{directory}: its parent directory does not exist")
    paths = [os.path.join(d, f"{name}.rank{r}.json.gz") for r in range(world)]
    if os.path.isdir(d):
        ours = {os.path.basename(p) for p in paths}
        foreign = sorted(n for n in os.listdir(d) if n.endswith((".json", ".json.gz"))
                         and not n.endswith(".gaptrace.json") and n not in ours)
        if foreign:
            raise ValueError(f"{directory}: holds {foreign[0]}, not a trace of this {world}-rank capture: a trace "
                             "directory must hold one trace per rank (remove it or give another directory)")
    return paths


def make_rank_directory(paths: list[str]) -> bool:
    """Create the directory of :func:`rank_trace_paths`' ``paths`` when it does not exist; True when it was made
    here (the caller removes it again if the capture fails before writing anything)."""
    d = os.path.dirname(paths[0])
    if os.path.isdir(d):
        return False
    os.mkdir(d)
    return True


def capture_decode(setup: DecodeSetup, texts: list[str], path: str, warmup_rounds: int, rounds: int,
                   max_new_tokens: int | None = None, on_round: Callable[[int], None] | None = None,
                   shrink_at_round: int | None = None, queue: bool = False,
                   inputs: tuple[str, ...] = ()) -> dict:
    """Run the decode, write the trace to ``path`` and its sidecar; return the sidecar dict.

    Both outputs are checked before anything runs (:class:`gaptrace.capture.Capture`): a missing or unwritable
    directory, a directory/device/FIFO at either path (symlinks are followed), or an output that is one of
    ``inputs`` (:func:`capture_inputs`: the CLI passes its prompts file and model directories) raises ValueError
    (one line). A failed write (ENOSPC, ...) removes its temporaries
    and raises ValueError (one line naming the output).

    ``queue``: keep every prompt when there are more than the batch size: the rest wait and are admitted (prefilled)
    as requests finish, so admission lands inside the profiled rounds; it needs more prompts than the batch size and
    a ``max_new_tokens`` small enough for requests to finish (ValueError otherwise); without it exactly one full
    batch (``fill_batch``).

    ``shrink_at_round`` = N: right after round N is enqueued, the last floor(n/2) running requests (by slot) get
    max_new_tokens = their output so far + 1, so they finish at the next read of their results (round N's, read
    while round N + 1 is queued) and are retired; round N + 2 runs in a smaller batch bucket: a new batch shape
    inside the capture, deterministic whatever τ is.

    ``max_new_tokens`` defaults to enough for every request to outlive the capture even at τ = B. Raises
    ValueError when the decode ends before warm-up + 1 + ``rounds`` rounds (nothing is written then).
    """
    from gaptrace.capture import Capture

    need = warmup_rounds + 1 + rounds + 2 + DEVICE_TIMED_ROUNDS
    check_queue(setup.rcfg.batch_size, len(texts), max_new_tokens, queue)
    # both outputs checked before the engine is built and the decode runs
    # the runtime times its own NVTX ranges per round (record_host_ranges), not record_function blocks per step
    # commit_on_error False: the sidecar's runtime fields come after the profiled rounds; a refusal or a stop before
    # they are in leaves the outputs as they were
    cap = Capture(path, warmup_steps=warmup_rounds, active_steps=rounds,
                  inputs=tuple(inputs), time_ranges=False, commit_on_error=False)
    try:
        return _run_capture(cap, setup, texts, path, warmup_rounds, rounds, max_new_tokens, on_round,
                            shrink_at_round, queue, need)
    except OSError as e:
        what = "sidecar" if e.filename and e.filename != path else "trace"
        raise ValueError(f"{e.filename or path}: cannot write the capture {what}: {e.strerror or e}") from None


def finish_at_next_read(event: RoundEvent, keep: int = 0) -> None:
    """Every running request after the first ``keep`` (by slot) gets max_new_tokens = its output so far + 1: it
    finishes at the next read of its results and is retired (no abort: its slot and pages are freed as usual)."""
    live = [event.running[s] for s in sorted(event.running)]
    for r in live[keep:]:
        r.max_new_tokens = len(r.output) + 1


class ReferenceHooks(EngineHooks):
    """The reference decode's observer (:func:`capture_decode`): the host time at every round hook, the same
    shrink as the capture, and every request finished right after round ``last`` is enqueued, so the decode ends
    cleanly (slots and pages freed)."""

    def __init__(self, last: int, shrink_at_round: int | None):
        self.last, self.shrink_at_round = last, shrink_at_round
        self.hook_s: list[float] = []
        self.round_tau: list[list[int]] = []  # as CaptureHooks': the same positions when they match

    def on_round_read(self, index: int, taus: list[int]) -> None:
        self.round_tau.append(taus)

    def on_round(self, event: RoundEvent) -> None:
        self.hook_s.append(time.perf_counter())
        if event.index == self.shrink_at_round:
            finish_at_next_read(event, (len(event.running) + 1) // 2)
        if event.index == self.last:
            finish_at_next_read(event)


def reference_periods_ms(hook_s: list[float], warmup_rounds: int, rounds: int) -> list[float]:
    """The periods of the rounds the capture profiles (hook indices W + 2 .. W + 1 + R: the profiler's warm-up
    step is W + 1), from the reference decode's hook times (``hook_s[k]``: hook k + 1): round i's period is the
    time from hook i − 1 to hook i, as :class:`gaptrace.capture.Capture` times a step. [] when the decode ended
    before them."""
    first = warmup_rounds + 2
    if len(hook_s) < first + rounds - 1:
        return []
    return [(hook_s[i - 1] - hook_s[i - 2]) * 1e3 for i in range(first, first + rounds)]


class CaptureHooks(EngineHooks):
    """The capture's observer: keeps each warm-up round's graph launch costs (unprofiled), cuts half the batch after
    round ``shrink_at_round``, steps the profiler once per round, collects the τ of every round read, times the graph
    replays after the profiled rounds, and then ends the decode: every request finished at its next read, so the
    engine is free for the reference decode (``finish``), or at once by raising _CaptureDone (a queue capture,
    whose waiting requests would be admitted as the others finish)."""

    def __init__(self, cap, warmup_rounds: int, rounds: int, shrink_at_round: int | None,
                 on_round: Callable[[int], None] | None, finish: bool = True):
        self.cap, self.warmup_rounds, self.rounds, self.finish = cap, warmup_rounds, rounds, finish
        self.finished = False
        self.shrink_at_round, self.user_on_round = shrink_at_round, on_round
        self.launch_us: dict[tuple[str, int], list[float]] = {}
        self.round_tau: list[list[int]] = []
        # graph replays are timed on the device (a CUDA event pair around each) in the DEVICE_TIMED_ROUNDS rounds
        # right after the trace is written: out of the profiled rounds and of the kept unprofiled periods, and at
        # the profiled rounds' context length (a graph's device span steps up as the context grows: the paged
        # attention's draft graph 1060 -> 1260 -> 1490 µs over 80 rounds of tiny bs 1). The hook index timing began
        # at; None before.
        self.device_timed_from: int | None = None
        # unprofiled host time per NVTX range (runtime.annotate.HostRangeTimes), over the warm-up rounds whose
        # periods the sidecar keeps: set by _run_capture
        self.ranges = None
        self.range_from = range_timing_from(warmup_rounds)
        self.range_rounds = 0

    def on_round_read(self, index: int, taus: list[int]) -> None:
        self.round_tau.append(taus)

    def on_round(self, event: RoundEvent) -> None:
        i = event.index  # rounds enqueued so far
        if i <= self.warmup_rounds:  # unprofiled: keep each graph's host launch cost of this round
            for key, us in event.graph_launch_us().items():
                self.launch_us.setdefault(key, []).extend(us)
        if self.ranges is not None:
            # the ranges between this hook and the next one belong to round i + 1
            self.ranges.active = self.range_from <= i < self.warmup_rounds
            self.range_rounds += self.ranges.active
        if i == self.shrink_at_round:
            finish_at_next_read(event, (len(event.running) + 1) // 2)
        self.cap.step()
        if self.user_on_round is not None:
            self.user_on_round(i)
        if self.cap.done and self.device_timed_from is None:  # the trace was written at this step
            self.device_timed_from = i
            event.time_graph_device(True)
        # stop once the trace is written, every profiled round's τ has been read back (one round late) and the
        # device-timed rounds after them were enqueued
        if (self.cap.done and not self.finished and len(self.round_tau) > self.warmup_rounds + self.rounds
                and i >= self.device_timed_from + DEVICE_TIMED_ROUNDS):
            event.time_graph_device(False)
            if not self.finish:
                raise _CaptureDone
            self.finished = True
            finish_at_next_read(event)


def _run_capture(cap, setup: DecodeSetup, texts: list[str], path: str, warmup_rounds: int, rounds: int,
                 max_new_tokens: int | None, on_round: Callable[[int], None] | None, shrink_at_round: int | None,
                 queue: bool, need: int) -> dict:
    B = setup.rcfg.block_size
    if max_new_tokens is None:
        max_new_tokens = need * B
    if not queue:
        texts = fill_batch(texts, setup.rcfg.batch_size)
    ids = encode_prompts(setup, texts, max_new_tokens)
    engine = Engine(setup.target, setup.draft, setup.rcfg, setup.eos_token_id)
    rc = setup.rcfg
    config = run_config(setup, bool(engine.graph_nodes), prefill_chunk=rc.prefill_chunk,
                        max_new_tokens=max_new_tokens, prompts=len(texts), warmup_rounds=warmup_rounds,
                        rounds=rounds, queue=queue, shrink_at_round=shrink_at_round,
                        simulated_acceptance=rc.sim_accept_rate if setup.simulated else None)
    cap.config = config
    hooks = CaptureHooks(cap, warmup_rounds, rounds, shrink_at_round, on_round, finish=not queue)

    # everything below runs inside the capture: the trace stays a temporary file until the exit puts it in place
    # with its sidecar, so a refusal or a stop (SIGTERM) leaves the outputs as they were, never a trace without its
    # sidecar or beside an earlier capture's
    with cap, record_host_ranges() as ranges:
        hooks.ranges = ranges
        try:
            engine.generate(ids, max_new_tokens, hooks=hooks)
        except _CaptureDone:
            pass
        ranges.active = False
        if not cap.done:
            raise ValueError(f"the decode ended after {len(hooks.round_tau)} rounds, before the {warmup_rounds} "
                             f"warm-up + 1 + {rounds} profiled rounds the capture needs: raise --max-new-tokens "
                             "or lower --rounds")
        profiled = hooks.round_tau[warmup_rounds + 1: warmup_rounds + 1 + rounds]
        empty = [warmup_rounds + 1 + k for k, t in enumerate(profiled) if not t]
        if empty:  # a profiled round with no live request (every one finished inside the capture): no decode round
            raise ValueError(f"profiled round {empty[0]} ran with no live request (every request finished inside "
                             "the capture): raise --max-new-tokens or lower --rounds; nothing was written")
        dev_us = engine.graph_device_us()  # after the decode: reading the events syncs
        reference: list[float] = []
        if not queue:
            # the reference decode, after the capture (a one-off in the profiled rounds, a compile on a new batch
            # shape, stays there): the same prompts again, unprofiled, up to the last profiled round. Its rounds sit
            # at the profiled rounds' positions (context lengths), and a round's device time steps with the context,
            # so the warm-up rounds before them are no exact reference (DESIGN.md 5.3). A queue capture admits by
            # request finishes, which this decode's early end would change: no reference there
            ref = ReferenceHooks(warmup_rounds + 1 + rounds, shrink_at_round)
            engine.generate(ids, max_new_tokens, hooks=ref)
            reference = reference_periods_ms(ref.hook_s, warmup_rounds, rounds)
        graphs = []
        for phase, nb, nodes in sorted((p, nb, n) for p, by_bucket in engine.graph_nodes.items()
                                       for nb, n in by_bucket.items()):
            host = hooks.launch_us.get((phase, nb), [])
            dev = dev_us.get((phase, nb), [])
            graphs.append({"name": f"{phase}_bs{nb}", "phase": phase, "bucket": nb, "nodes": nodes,
                           "unprofiled_launch_us": statistics.median(host) if host else None,
                           "unprofiled_launches": len(host),
                           "unprofiled_device_us": statistics.median(dev) if dev else None,
                           "unprofiled_device_replays": len(dev)})
        periods = unprofiled_block(cap.unprofiled_step_ms)
        tp = setup.target.tp
        cap.extra.update({  # the sidecar's fields beyond the generic capture's (written at the exit)
            "rank": 0 if tp is None else tp.rank, "world_size": 1 if tp is None else tp.world,  # of a --tp N capture
            "rounds": [{"round": warmup_rounds + 1 + k, "tau": (sum(t) / len(t)) if t else None,
                        "accepted": list(t)} for k, t in enumerate(profiled)],
            "graphs": graphs,
            "unprofiled_round_ms": periods or None,  # null: a warm-up too short to time a round
            # the profiled rounds' own positions, unprofiled, from the reference decode after the capture (null:
            # none, a queue capture); the replay's measured round where present (DESIGN.md 5.3)
            "unprofiled_same_rounds_ms": reference or None,
            # host time per NVTX range in those warm-up rounds (no profiler): the replay takes a removed range's
            # host time from it (docs/DESIGN.md 5.2)
            "unprofiled_ranges": unprofiled_ranges(ranges, hooks.range_rounds),
            "unprofiled_range_rounds": hooks.range_rounds,
            # the decode window: the profiled rounds, without the profiler's own start/stop synchronisation
            "analysis_window": "round",
            "simulated_acceptance": (f"acceptance simulated on the device with rate {rc.sim_accept_rate}"
                                     if setup.simulated else None),
        })
    return cap.sidecar()
