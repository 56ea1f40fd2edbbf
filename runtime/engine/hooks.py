"""The engine's hook API: how observers (capture, the CLI's progress bar, benchmarks) see a decode without reading
the engine's attributes. :meth:`Engine.generate` takes an :class:`EngineHooks`; each callback gets plain values
or a small dataclass (:class:`RoundEvent`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from .graphs import collect_launch_us, time_device
from .sequence import Request


@dataclass
class RoundEvent:
    """What :meth:`EngineHooks.on_round` sees after a round is enqueued (and the rounds before it read).

    ``index``: rounds enqueued so far (1-based: the round just enqueued); ``running``: slot -> live request, a
    read-only view (a hook may lower a request's ``max_new_tokens``: it then finishes at its next read)."""

    index: int
    running: Mapping[int, Request]
    _graphs: dict = field(repr=False, default_factory=dict)

    def graph_launch_us(self) -> dict[tuple[str, int], list[float]]:
        """{(phase, bucket): [host µs]}: the host cost of each graph launch since the last call
        (``GraphedCall.last_launch_us``: cudaGraphLaunch + its Python wrapper, two perf_counter reads, no device
        sync), and forget them. Empty without graphs."""
        out: dict = {}
        collect_launch_us(self._graphs, out)
        return out

    def time_graph_device(self, on: bool) -> None:
        """Start or stop timing every graph replay on the device (a CUDA event pair around each, no host sync:
        :func:`.graphs.time_device`); the capture reads the times after the decode (:func:`.graphs.device_us`)."""
        time_device(self._graphs, on)


class EngineHooks:
    """Callbacks :meth:`Engine.generate` makes; subclass and override the ones you need (each default does nothing).
    They run on the host thread between device work and must not block on the device (a host sync there stalls
    the round ahead). Raising from a hook ends ``generate`` (capture stops a decode it no longer needs this way).

    - ``on_prefill(request)``: a request was admitted and its prefill enqueued (inside the ``plan`` range).
    - ``on_round(event)``: round ``event.index`` was enqueued and every result enqueued before it was read.
    - ``on_round_read(index, taus)``: round ``index``'s results were read (one round late): ``taus``, the accepted
      tokens of each request live in it (padding and finished requests left out).
    - ``on_tokens(n)``: n new tokens were read back (prefill's first token, or a round's)."""

    def on_prefill(self, request: Request) -> None:
        pass

    def on_round(self, event: RoundEvent) -> None:
        pass

    def on_round_read(self, index: int, taus: list[int]) -> None:
        pass

    def on_tokens(self, n: int) -> None:
        pass


class CallbackHooks(EngineHooks):
    """EngineHooks from two plain callables: ``on_tokens(n)`` and ``on_round(i)`` (i = rounds enqueued so far)."""

    def __init__(self, on_tokens: Callable[[int], None] | None = None,
                 on_round: Callable[[int], None] | None = None):
        self._tokens, self._round = on_tokens, on_round

    def on_tokens(self, n: int) -> None:
        if self._tokens is not None:
            self._tokens(n)

    def on_round(self, event: RoundEvent) -> None:
        if self._round is not None:
            self._round(event.index)
