"""``torch.cuda.empty_cache()`` called every step of a decode loop.

The step: an eager decode step for ``batch`` requests (embedding, ``layers`` residual MLP blocks, LM head, greedy
argmax) over weights large enough that the device, not the host, sets the step.

* planted (``planted_empty_cache``): ``torch.cuda.empty_cache()`` after every step, "to keep memory down". The
  caching allocator hands every free cached segment back to the driver (``cudaFree``, which waits for the device to
  drain), so the next step's activations are allocated again (``cudaMalloc``) and the host can no longer queue a
  step ahead of the device.
* fixed: no ``empty_cache``: the allocator keeps its segments and the host runs ahead.

Both compute the same tokens. Expected saving (an estimate, before measurement): one device drain a step (the host's
launch work of a step no longer overlaps the device's, ~0.1-0.3 ms) plus the frees and mallocs (~10-50 µs each),
against a device-bound step of ~0.4 ms: the planted step should be roughly 1.2-1.8x the fixed one. On CPU
``empty_cache`` does nothing (a smoke run only).
"""
from __future__ import annotations

import torch

from ._common import TinyDecoder, LaggedRead, Loop, site, step_range

NAME = "empty_cache"
CAUSE = "torch.cuda.empty_cache() every step: cudaFree of the cached segments (a device drain) and cudaMalloc again"
FIX = "no empty_cache in the loop (the caching allocator keeps its segments)"
SITE = "planted_empty_cache"  # the range around the planted cause (and its fix)
EXPECTED_RATIO = (1.2, 1.8)  # planted / fixed step period: the estimate above, before measurement
CUDA_SIZE = {"batch": 256, "d": 2048, "layers": 8, "vocab": 32000}
CPU_SIZE = {"batch": 4, "d": 32, "layers": 1, "vocab": 64}


class EmptyCache(Loop):
    """See the module docstring; ``size`` keys: batch, d, layers, vocab."""

    def __init__(self, variant: str, device: torch.device, size: dict | None = None):
        sz = self.setup(variant, device, size, CUDA_SIZE, CPU_SIZE)
        self.model = TinyDecoder(device, sz["d"], sz["layers"], sz["vocab"])
        g = self.model.generator  # the loop's inputs are drawn after the weights, from the same generator
        self.tokens = torch.randint(0, sz["vocab"], (sz["batch"],), generator=g).to(device)
        # the tokens streamed out one step late, in both variants: the host runs at most one step ahead
        self.lagged = LaggedRead(self.tokens)
        self.streamed: torch.Tensor | None = None

    def step(self) -> None:
        with step_range():
            logits = self.model.logits(self.tokens)
            self.tokens = logits.argmax(-1)
            del logits  # the step's activations are back in the allocator's cache
            with site(SITE):
                if self.variant == "planted" and self.device.type == "cuda":
                    torch.cuda.empty_cache()  # SYNC (planted): cudaFree drains the device
            self.streamed = self.lagged.push(self.tokens)


def build(variant: str, device: torch.device, size: dict | None = None) -> EmptyCache:
    """The loop for ``variant`` ('planted' | 'fixed') on ``device``; ``size`` overrides the device's preset."""
    return EmptyCache(variant, device, size)
