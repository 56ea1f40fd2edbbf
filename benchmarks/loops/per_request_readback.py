"""Per-request synchronous read-backs of a batch's sampled tokens.

The step: an eager decode step for ``batch`` requests (embedding lookup of each request's last token, ``layers``
residual MLP blocks, LM head, greedy argmax), then the host appends each request's new token to that request's
Python list (what a serving loop does to detokenize and check stop conditions).

* planted (``planted_per_request_readback``): ``for i, req in enumerate(requests): req.append(int(next_tokens[i]))``
  — one blocking device-to-host copy (a sync) per request, ``batch`` round trips per step.
* fixed: one ``copy_(..., non_blocking=True)`` of the whole [batch] token vector into pinned memory, one event
  wait, one ``tolist()``.

Expected saving (an estimate, before measurement): ``batch - 1`` sync round trips (each ~10-20 µs of host time:
``tokens[i]`` is a view, ``int()`` copies its 8 bytes to pageable memory and waits), with 16 requests ~0.15-0.3 ms
per step against an eager step of ~0.25-0.35 ms: the planted step should be roughly 1.5-2x the fixed one. On CPU
the read-backs are plain reads (a smoke run only).
"""
from __future__ import annotations

import torch

from ._common import TinyDecoder, Loop, site, step_range

NAME = "per_request_readback"
CAUSE = "one blocking .item()-style read-back per request per step"
FIX = "one batched non-blocking copy to pinned memory, one wait, one tolist()"
SITE = "planted_per_request_readback"  # the range around the planted cause (and its fix)
EXPECTED_RATIO = (1.5, 2.0)  # planted / fixed step period on an H200: the estimate above, before measurement
CUDA_SIZE = {"batch": 16, "d": 2048, "layers": 8, "vocab": 16384, "graph_forward": 0}
CPU_SIZE = {"batch": 4, "d": 32, "layers": 1, "vocab": 64, "graph_forward": 0}


class PerRequestReadback(Loop):
    """See the module docstring; ``size`` keys: graph_forward (0 | 1), batch, d, layers, vocab."""

    def __init__(self, variant: str, device: torch.device, size: dict | None = None):
        sz = self.setup(variant, device, size, CUDA_SIZE, CPU_SIZE)
        d, v = sz["d"], sz["vocab"]
        self.model = TinyDecoder(device, d, sz["layers"], v)
        # graph_forward 1: the forward in one CUDA graph (what fixing a finding on its host work would buy)
        self.forward = self.model.forward_for(sz["batch"], bool(sz.get("graph_forward", 0)))
        g = self.model.generator  # the loop's inputs are drawn after the weights, from the same generator
        self.tokens = torch.randint(0, v, (sz["batch"],), generator=g).to(device)
        self.requests: list[list[int]] = [[] for _ in range(sz["batch"])]
        cuda = device.type == "cuda"
        self.host = torch.empty(sz["batch"], dtype=torch.long, pin_memory=cuda)
        self.event = torch.cuda.Event() if cuda else None

    def step(self) -> None:
        with step_range():
            logits = self.forward(self.tokens)
            self.tokens = logits.argmax(-1)
            with site(SITE):
                if self.variant == "planted":
                    for i, req in enumerate(self.requests):
                        req.append(int(self.tokens[i]))  # SYNC (planted): one read-back per request
                else:
                    self.host.copy_(self.tokens, non_blocking=self.event is not None)
                    if self.event is not None:
                        self.event.record()
                        self.event.synchronize()  # SYNC: one wait per step, for the whole batch
                    for req, t in zip(self.requests, self.host.tolist()):
                        req.append(t)
            if len(self.requests[0]) >= 4096:  # keep the lists' memory flat over long runs
                for req in self.requests:
                    del req[:2048]


def build(variant: str, device: torch.device, size: dict | None = None) -> PerRequestReadback:
    """The loop for ``variant`` ('planted' | 'fixed') on ``device``; ``size`` overrides the device's preset."""
    return PerRequestReadback(variant, device, size)
