"""A CUDA-graphed decode step with a blocking read-back of a device value every step.

The step: replay one CUDA graph holding a small decode stack (embedding lookup of the current tokens, ``layers``
residual MLP blocks of width ``d``, an LM head, greedy argmax written back into the static token buffer) and a
"stop?" flag (every sequence produced ``eos``). The host then decides whether to keep decoding.

* planted (``planted_readback``): ``stop = bool(flag.item())`` right after the replay. ``.item()`` on a CUDA tensor
  copies to pageable memory and synchronizes, so the host waits for the whole step on the device before it can
  launch the next one: the device sits idle for the host's launch and return path each step.
* fixed: the flag is copied to pinned memory without blocking and read one step late (:class:`LaggedRead`); the
  decision lags by one step (a finished batch runs one extra step), and the host launches step n+1 while step n
  runs.

Expected saving (an estimate from the sizes, before measurement): the host's per-step path (graph launch, the
flag's read-back round trip, the Python between replays, ~25-40 µs) stops adding to the device time. With the sizes
below the graph's device time is ~50-80 µs on an H200 (about 30 small kernels, 64 MB of weights read), so the
planted step should take roughly 1.3-1.7x the fixed one.
On CPU there is no graph: the same stack runs eagerly, and the read-back costs nothing (a smoke run only).
"""
from __future__ import annotations

import torch

from ._common import TinyDecoder, LaggedRead, Loop, cuda_graph, site, step_range

NAME = "graph_readback"
CAUSE = "per-step blocking .item() of a device flag after a CUDA graph replay"
FIX = "non-blocking copy to pinned memory, read one step late"
SITE = "planted_readback"  # the range around the planted cause (and its fix)
EXPECTED_RATIO = (1.3, 1.7)  # planted / fixed step period on an H200: the estimate above, before measurement
CUDA_SIZE = {"batch": 8, "d": 1024, "layers": 6, "vocab": 8192}
CPU_SIZE = {"batch": 2, "d": 32, "layers": 2, "vocab": 64}


class GraphReadback(Loop):
    """See the module docstring; ``size`` keys: batch, d, layers, vocab."""

    def __init__(self, variant: str, device: torch.device, size: dict | None = None):
        sz = self.setup(variant, device, size, CUDA_SIZE, CPU_SIZE)
        d, v = sz["d"], sz["vocab"]
        self.model = TinyDecoder(device, d, sz["layers"], v)
        g = self.model.generator  # the loop's inputs are drawn after the weights, from the same generator
        self.eos = v - 1
        self.tokens = torch.randint(0, v - 1, (sz["batch"],), generator=g).to(device)
        self.start = self.tokens.clone()
        self.flag = torch.zeros((), dtype=torch.bool, device=device)
        self.graph = cuda_graph(self._forward) if device.type == "cuda" else None
        self.lagged = LaggedRead(self.flag) if variant == "fixed" else None
        self.stops = 0

    def _forward(self) -> None:
        logits = self.model.logits(self.tokens)
        nxt = logits.argmax(-1)
        self.tokens.copy_(nxt)
        self.flag.copy_((nxt == self.eos).all())

    def step(self) -> None:
        with step_range():
            if self.graph is not None:
                self.graph.replay()
            else:
                self._forward()
            with site(SITE):
                if self.variant == "planted":
                    stop = bool(self.flag.item())
                else:
                    prev = self.lagged.push(self.flag)
                    stop = prev is not None and bool(prev)
            if stop:  # every sequence ended: start the batch again (rare with these weights)
                self.stops += 1
                self.tokens.copy_(self.start)


def build(variant: str, device: torch.device, size: dict | None = None) -> GraphReadback:
    """The loop for ``variant`` ('planted' | 'fixed') on ``device``; ``size`` overrides the device's preset."""
    return GraphReadback(variant, device, size)
