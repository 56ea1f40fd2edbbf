"""A training loop in the torch.profiler tutorial's style (``schedule`` + ``prof.step()``), logging its loss.

The step: forward of an MLP regression model (``layers`` Linear+GELU blocks of width ``d``) on a [batch, d]
batch, MSE loss, backward, AdamW (foreach) step, ``zero_grad(set_to_none=True)``. The step has no ``step`` range of
its own: when profiled, ``prof.step()`` marks the steps (``ProfilerStep#N`` ranges), as in most training scripts.

* planted (``planted_loss_logging``): ``losses.append(loss.item())`` every step — a blocking read-back at the end
  of the step, so the host waits for the backward and optimizer kernels before it launches the next forward.
* fixed: the loss is copied to pinned memory without blocking and logged one step late (:class:`LaggedRead`).

Expected saving (an estimate, before measurement): the overlap of the host's launch path (autograd + optimizer,
~60 launches) with the device's work: with the sizes below both are a few hundred µs per step on an H200 (fp32
matmuls, 16 GFLOP per step), so the planted step should be roughly 1.3-1.8x the fixed one. On CPU the read-back
costs nothing (a smoke run only).

:func:`run_profiled` is the capture the loop is written for: the tutorial's ``torch.profiler.profile(schedule=...,
on_trace_ready=...)`` with ``prof.step()`` after every step.
"""
from __future__ import annotations

import torch

from ._common import LaggedRead, Loop, site

NAME = "train_step_logging"
CAUSE = "per-step loss.item() for logging in a training loop"
FIX = "loss copied to pinned memory without blocking, logged one step late"
SITE = "planted_loss_logging"  # the range around the planted cause (and its fix)
EXPECTED_RATIO = (1.3, 1.8)  # planted / fixed step period on an H200: the estimate above, before measurement
CUDA_SIZE = {"batch": 512, "d": 1024, "layers": 4}
CPU_SIZE = {"batch": 8, "d": 16, "layers": 2}
HAS_STEP_RANGE = False


class TrainStepLogging(Loop):
    """See the module docstring; ``size`` keys: batch, d, layers."""

    def __init__(self, variant: str, device: torch.device, size: dict | None = None):
        sz = self.setup(variant, device, size, CUDA_SIZE, CPU_SIZE)
        torch.manual_seed(0)
        d = sz["d"]
        blocks = []
        for _ in range(sz["layers"]):
            blocks += [torch.nn.Linear(d, d), torch.nn.GELU()]
        self.model = torch.nn.Sequential(*blocks, torch.nn.Linear(d, d)).to(device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, foreach=True)
        g = torch.Generator().manual_seed(0)
        self.batches = [(torch.randn(sz["batch"], d, generator=g).to(device),
                         torch.randn(sz["batch"], d, generator=g).to(device)) for _ in range(4)]
        self.n = 0
        self.losses: list[float] = []
        self.lagged = LaggedRead(torch.zeros((), device=device)) if variant == "fixed" else None

    def step(self) -> None:
        x, y = self.batches[self.n % len(self.batches)]
        self.n += 1
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        with site(SITE):
            if self.variant == "planted":
                self.losses.append(loss.item())  # SYNC (planted): every step
            else:
                prev = self.lagged.push(loss.detach())
                if prev is not None:
                    self.losses.append(float(prev))
        if len(self.losses) >= 4096:
            del self.losses[:2048]


def build(variant: str, device: torch.device, size: dict | None = None) -> TrainStepLogging:
    """The loop for ``variant`` ('planted' | 'fixed') on ``device``; ``size`` overrides the device's preset."""
    return TrainStepLogging(variant, device, size)


def run_profiled(loop: TrainStepLogging, trace_path: str, warmup_steps: int, active_steps: int,
                 profiler_kwargs: dict) -> None:
    """Profile ``active_steps`` steps after ``warmup_steps`` unprofiled ones and one profiler warm-up step, the way
    the torch.profiler tutorial does ("Using profiler to analyze long-running jobs": ``schedule`` + ``prof.step()``),
    and export the Chrome trace to ``trace_path`` (plain JSON; the driver gzips it)."""
    sched = torch.profiler.schedule(wait=warmup_steps, warmup=1, active=active_steps, repeat=1)
    done = []

    def ready(prof):
        prof.export_chrome_trace(trace_path)
        done.append(True)

    with torch.profiler.profile(schedule=sched, on_trace_ready=ready, **profiler_kwargs) as prof:
        for _ in range(warmup_steps + 1 + active_steps):
            loop.step()
            prof.step()
    if not done:
        raise RuntimeError("the profiler schedule ended without a trace")
