"""A piecewise eager forward: hundreds of tiny kernel launches per step (launch-bound).

The step: ``layers`` pre-norm residual MLP blocks on a [batch, d] hidden state, the RMS norm written out op by op
(pow, mean, add, rsqrt, mul, mul), each block about 12 kernels, so ``layers * 12`` kernel launches of a few µs of
device work each; the output becomes the next step's input (a recurrence on a static buffer). A tiny "stop?" flag
is read one step late (:class:`LaggedRead`) so the host never runs more than one step ahead.

* planted (``planted_eager_launches``): the forward runs eagerly: one launch per op, each costing the host the
  dispatcher and launch path (several µs), far more than the kernel's device time, so the device idles between
  kernels.
* fixed: the same forward captured once in a CUDA graph and replayed: one launch per step.

Expected saving (an estimate, before measurement): with 24 layers (about 370 kernels) the eager host path is
~2-3 ms per step on a server host, the graph's device time ~1 ms (a few µs per tiny kernel): the planted step should
be roughly 2-3x the fixed one.
On CPU there is no graph: both variants run eagerly (a smoke run only).
"""
from __future__ import annotations

import torch

from ._common import LaggedRead, Loop, cuda_graph, site, step_range

NAME = "launch_bound"
CAUSE = "hundreds of tiny eager kernel launches per step"
FIX = "the same forward captured in a CUDA graph, one replay per step"
SITE = "planted_eager_launches"  # the range around the planted cause (and its fix)
EXPECTED_RATIO = (2.0, 3.0)  # planted / fixed step period on an H200: the estimate above, before measurement
CUDA_SIZE = {"batch": 8, "d": 512, "layers": 24}
CPU_SIZE = {"batch": 2, "d": 16, "layers": 3}


class LaunchBound(Loop):
    """See the module docstring; ``size`` keys: batch, d, layers."""

    def __init__(self, variant: str, device: torch.device, size: dict | None = None):
        sz = self.setup(variant, device, size, CUDA_SIZE, CPU_SIZE)
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        g = torch.Generator().manual_seed(0)
        d = sz["d"]

        def w(*shape):
            return (torch.randn(*shape, generator=g) * shape[0] ** -0.5).to(device, dtype)

        self.norm = [torch.ones(d, device=device, dtype=dtype) for _ in range(sz["layers"])]
        self.w_up = [w(d, 2 * d) for _ in range(sz["layers"])]
        self.w_gate = [w(d, 2 * d) for _ in range(sz["layers"])]
        self.w_down = [w(2 * d, d) for _ in range(sz["layers"])]
        self.x = torch.randn(sz["batch"], d, generator=g).to(device, dtype)
        self.flag = torch.zeros((), dtype=torch.bool, device=device)
        self.graph = cuda_graph(self._forward) if variant == "fixed" and device.type == "cuda" else None
        self.lagged = LaggedRead(self.flag)

    def _forward(self) -> None:
        x = self.x
        for nw, wu, wg, wd in zip(self.norm, self.w_up, self.w_gate, self.w_down):
            var = x.float().pow(2).mean(-1, keepdim=True)
            h = (x.float() * torch.rsqrt(var + 1e-6)).to(x.dtype) * nw
            h = torch.nn.functional.silu(h @ wg) * (h @ wu)
            x = x + h @ wd
        var = x.float().pow(2).mean(-1, keepdim=True)  # keep the recurrence bounded
        self.x.copy_((x.float() * torch.rsqrt(var + 1e-6)).to(x.dtype))
        self.flag.copy_(~torch.isfinite(self.x).all())

    def step(self) -> None:
        with step_range():
            with site(SITE):
                if self.graph is not None:
                    self.graph.replay()
                else:
                    self._forward()
            prev = self.lagged.push(self.flag)
            if prev is not None and bool(prev):  # the state blew up: restart it (never, with the norm above)
                self.x.normal_()


def build(variant: str, device: torch.device, size: dict | None = None) -> LaunchBound:
    """The loop for ``variant`` ('planted' | 'fixed') on ``device``; ``size`` overrides the device's preset."""
    return LaunchBound(variant, device, size)
