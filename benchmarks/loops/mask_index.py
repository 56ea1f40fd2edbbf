"""Boolean-mask indexing in the step: a data-dependent shape, hence a hidden sync.

The step: an eager decode step for ``batch`` requests (as in ``per_request_readback``), then the finished requests
(those that sampled the end-of-sequence id) get their token replaced by the pad id and their step count frozen.

* planted (``planted_mask_index``): ``done = (tokens == eos).nonzero()`` and ``tokens[done] = pad``, ``steps[done]``
  read back (``nonzero`` must learn how many rows it returns: a device-to-host copy of the count and a stream sync),
  then ``active = steps[~finished]`` (boolean indexing: another ``nonzero`` and another sync).
* fixed: the same updates with fixed shapes (``torch.where(tokens == eos, pad, tokens)``, ``steps + ~finished``):
  no value leaves the device.

Both compute the same tokens and step counts. Expected saving (an estimate, before measurement): two blocking
round trips a step, each draining the step's device work before the host can launch the next step's (the
host's launch work of a step no longer overlaps the device's, ~0.1-0.3 ms), against a device-bound eager step of ~0.4 ms.
"""
from __future__ import annotations

import torch

from ._common import TinyDecoder, LaggedRead, Loop, site, step_range

NAME = "mask_index"
CAUSE = "nonzero / boolean-mask indexing on device tensors every step (a data-dependent shape: two hidden syncs)"
FIX = "fixed-shape updates (torch.where, arithmetic on the mask): no read-back"
SITE = "planted_mask_index"  # the range around the planted cause (and its fix)
EXPECTED_RATIO = (1.2, 2.0)  # planted / fixed step period: the estimate above, before measurement
CUDA_SIZE = {"batch": 256, "d": 2048, "layers": 8, "vocab": 32000, "graph_forward": 0}
CPU_SIZE = {"batch": 4, "d": 32, "layers": 1, "vocab": 64, "graph_forward": 0}


class MaskIndex(Loop):
    """See the module docstring; ``size`` keys: graph_forward (0 | 1), batch, d, layers, vocab."""

    def __init__(self, variant: str, device: torch.device, size: dict | None = None):
        sz = self.setup(variant, device, size, CUDA_SIZE, CPU_SIZE)
        v = sz["vocab"]
        self.model = TinyDecoder(device, sz["d"], sz["layers"], v)
        # graph_forward 1: the forward in one CUDA graph (what fixing a finding on its host work would buy)
        self.forward = self.model.forward_for(sz["batch"], bool(sz.get("graph_forward", 0)))
        g = self.model.generator  # the loop's inputs are drawn after the weights, from the same generator
        self.tokens = torch.randint(0, v, (sz["batch"],), generator=g).to(device)
        # the end-of-sequence id, drawn: whether any request finishes, the syncs happen every step
        self.eos = int(torch.randint(0, v, (1,), generator=g))
        self.pad = 0
        self.steps = torch.zeros(sz["batch"], dtype=torch.long, device=device)
        self.finished = torch.zeros(sz["batch"], dtype=torch.bool, device=device)
        self.active_steps = self.steps
        # the tokens streamed out one step late, in both variants: the host runs at most one step ahead
        self.lagged = LaggedRead(self.tokens)
        self.streamed: torch.Tensor | None = None

    def step(self) -> None:
        with step_range():
            tokens = self.forward(self.tokens).argmax(-1)
            with site(SITE):
                hit = tokens == self.eos
                self.finished = self.finished | hit
                if self.variant == "planted":
                    done = self.finished.nonzero().squeeze(-1)  # SYNC (planted): nonzero reads its row count back
                    tokens[done] = self.pad
                    self.steps += 1
                    self.steps[done] -= 1
                    self.active_steps = self.steps[~self.finished]  # SYNC (planted): boolean indexing, again
                else:
                    tokens = torch.where(self.finished, torch.full_like(tokens, self.pad), tokens)
                    self.steps += (~self.finished).long()
                    self.active_steps = self.steps  # the finished rows stay, masked: no shape from a value
            self.tokens = tokens
            self.streamed = self.lagged.push(self.tokens)


def build(variant: str, device: torch.device, size: dict | None = None) -> MaskIndex:
    """The loop for ``variant`` ('planted' | 'fixed') on ``device``; ``size`` overrides the device's preset."""
    return MaskIndex(variant, device, size)
