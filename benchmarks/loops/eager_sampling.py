"""A CUDA-graphed forward whose sampler runs eagerly after it: dozens of small kernel launches a step.

The step: replay one CUDA graph holding a small decode stack (the current tokens' embedding, ``layers`` residual MLP
blocks, an LM head into a static [batch, vocab] logits buffer), then sample the next tokens the way a serving
sampler does: a repetition penalty on the tokens generated so far (gather, where, scatter), temperature, top-k
(topk, a threshold mask), top-p (softmax, sort, cumsum, a mask scattered back to vocabulary order), min-p, and a
Gumbel-max draw (rand, log, log, argmax): about 30 kernels of a few µs each on the device, each paying the host's
dispatch and launch path. The sampled tokens are written into the graph's static token buffer and appended to the
history ring; a "stop?" flag is read one step late (:class:`LaggedRead`).

* planted (``planted_eager_sampling``): the sampler runs eagerly after the replay (as when only the model forward
  is captured and sampling is left to Python: a common split in serving engines).
* fixed: the same sampler captured in the same CUDA graph as the forward (graph-safe: fixed shapes, the random
  draws from the default CUDA generator, which registers its state with the graph); one replay per step.

Expected saving (an estimate, before measurement): ~30 eager launches at ~5-8 µs of host each (~0.15-0.25 ms) on a
step whose graphed device work is ~0.1-0.2 ms: the planted step is host-bound, the fixed one device-bound;
planted / fixed ≈ 1.3-2x.
On CPU there is no graph: both variants run eagerly (a smoke run only). Measured on an H100: planted 0.863 ms, fixed
0.413 ms a step (planted / fixed 2.09; benchmarks/results/2026-12-07_h100_eager_sampling.md).
"""
from __future__ import annotations

import torch

from ._common import LaggedRead, Loop, TinyDecoder, cuda_graph, site, step_range

NAME = "eager_sampling"
CAUSE = "the sampler's ~30 small kernels launched eagerly after a graphed forward"
FIX = "the sampler captured in the forward's CUDA graph, one replay per step"
SITE = "planted_eager_sampling"  # the range around the planted cause (and its fix)
EXPECTED_RATIO = (1.3, 2.0)  # planted / fixed step period: the estimate above, before measurement
CUDA_SIZE = {"batch": 16, "d": 512, "layers": 4, "vocab": 32000, "history": 64}
CPU_SIZE = {"batch": 2, "d": 16, "layers": 1, "vocab": 64, "history": 4}
TEMPERATURE, TOP_K, TOP_P, MIN_P, PENALTY = 0.8, 50, 0.9, 0.05, 1.1


def sample(logits: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
    """[batch, vocab] logits, [batch, H] recent token ids -> [batch] sampled ids: repetition penalty, temperature,
    top-k, top-p, min-p, then a Gumbel-max draw. Fixed shapes and no host read: capturable in a CUDA graph."""
    x = logits.float()
    seen = torch.gather(x, 1, history)
    x = x.scatter(1, history, torch.where(seen > 0, seen / PENALTY, seen * PENALTY))
    x = x / TEMPERATURE
    kth = torch.topk(x, min(TOP_K, x.shape[-1]), dim=-1).values[:, -1:]
    x = x.masked_fill(x < kth, float("-inf"))
    sorted_x, order = torch.sort(x, dim=-1, descending=True)
    cum = torch.softmax(sorted_x, dim=-1).cumsum(-1)
    drop_sorted = (cum - torch.softmax(sorted_x, dim=-1)) > TOP_P
    drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
    x = x.masked_fill(drop, float("-inf"))
    p = torch.softmax(x, dim=-1)
    x = x.masked_fill(p < MIN_P * p.amax(-1, keepdim=True), float("-inf"))
    gumbel = -torch.log(-torch.log(torch.rand_like(x).clamp_(1e-10, 1.0)))
    return (x + gumbel).argmax(-1)


class EagerSampling(Loop):
    """See the module docstring; ``size`` keys: batch, d, layers, vocab, history."""

    def __init__(self, variant: str, device: torch.device, size: dict | None = None):
        sz = self.setup(variant, device, size, CUDA_SIZE, CPU_SIZE)
        v = sz["vocab"]
        if sz["history"] < 1 or v < 2:
            raise ValueError(f"eager_sampling: history must be at least 1 and vocab at least 2 (got {sz})")
        self.model = TinyDecoder(device, sz["d"], sz["layers"], v)
        g = self.model.generator  # the loop's inputs are drawn after the weights, from the same generator
        # the Gumbel draws come from the default generator (the one a CUDA graph registers): seeded, so that the
        # twins draw alike where both run eagerly (on CPU; a graph's warm-up runs take draws of their own)
        torch.manual_seed(0)
        self.eos = v - 1
        self.tokens = torch.randint(0, v - 1, (sz["batch"],), generator=g).to(device)
        self.history = torch.randint(0, v - 1, (sz["batch"], sz["history"]), generator=g).to(device)
        self.pos = torch.zeros((), dtype=torch.long, device=device)
        self.logits = torch.zeros(sz["batch"], v, device=device, dtype=self.model.dtype)
        self.flag = torch.zeros((), dtype=torch.bool, device=device)
        cuda = device.type == "cuda"
        self.forward_graph = cuda_graph(self._forward) if cuda and variant == "planted" else None
        self.step_graph = cuda_graph(self._forward_and_sample) if cuda and variant == "fixed" else None
        self.lagged = LaggedRead(self.flag)
        self.stops = 0

    def _forward(self) -> None:
        self.logits.copy_(self.model.logits(self.tokens))

    def _sample(self) -> None:
        nxt = sample(self.logits, self.history)
        self.tokens.copy_(nxt)
        # the history ring: column pos % H takes the new tokens (index_copy_ with a device index: no host read)
        col = torch.remainder(self.pos, self.history.shape[1]).reshape(1)
        self.history.index_copy_(1, col, nxt.unsqueeze(1))
        self.pos.add_(1)
        self.flag.copy_((nxt == self.eos).all())

    def _forward_and_sample(self) -> None:
        self._forward()
        self._sample()

    def step(self) -> None:
        with step_range():
            if self.step_graph is not None:
                with site(SITE):  # the fix: forward and sampler in one replay
                    self.step_graph.replay()
            else:
                if self.forward_graph is not None:
                    self.forward_graph.replay()
                else:
                    self._forward()
                with site(SITE):
                    self._sample()
            prev = self.lagged.push(self.flag)
            if prev is not None and bool(prev):  # every sequence ended (rare with these weights): counted only
                self.stops += 1


def build(variant: str, device: torch.device, size: dict | None = None) -> EagerSampling:
    """The loop for ``variant`` ('planted' | 'fixed') on ``device``; ``size`` overrides the device's preset."""
    return EagerSampling(variant, device, size)
