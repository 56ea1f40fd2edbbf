"""Each step's input features copied host-to-device from pageable memory, on the compute stream.

The step: a [tokens, d] float32 feature block made on the host (a chunk of prefill embeddings / encoder features,
rotated among ``buffers`` host tensors) goes to the device, is cast to bfloat16 and runs through ``layers`` dense
[d, d] layers; a tiny "stop?" flag is read one step late so the host stays at most one step ahead.

* planted (``planted_htod_copy``): ``features.to(device)`` from pageable host memory, on the compute stream. A
  copy from pageable memory goes through a staging buffer and returns to the host only when done (CUDA C++
  Programming Guide, "Asynchronous Concurrent Execution" / the ``cudaMemcpy`` API sync behaviour notes), and, being
  on the compute stream, it starts only after the previous step's kernels: copy and compute are serialized and the
  host waits for both.
* fixed: the host tensors are pinned; the next step's features are copied with ``non_blocking=True`` on a side
  stream into one of two device buffers while this step computes (events order the copy after the compute that
  last read that buffer, and the compute after its copy).

Expected saving (an estimate, before measurement): the copy's time leaves the step: 8 MiB per step is ~0.4-1 ms
from pageable memory, ~0.2 ms from pinned memory (hidden under the compute), against a compute of ~0.2-0.4 ms with
the sizes below on an H200, so the planted step should be roughly 2-3x the fixed one.
On CPU both variants make the same plain copy (a smoke run only).
"""
from __future__ import annotations

import torch

from ._common import LaggedRead, Loop, site, step_range

NAME = "pageable_htod"
CAUSE = "pageable, blocking host-to-device copy of each step's inputs on the compute stream"
FIX = "pinned host buffers, non_blocking copy of the next step's inputs on a side stream, double-buffered"
SITE = "planted_htod_copy"  # the range around the planted cause (and its fix)
EXPECTED_RATIO = (2.0, 3.0)  # planted / fixed step period on an H200: the estimate above, before measurement
CUDA_SIZE = {"tokens": 2048, "d": 1024, "layers": 12, "buffers": 2}
CPU_SIZE = {"tokens": 8, "d": 16, "layers": 2, "buffers": 2}


class PageableHtoD(Loop):
    """See the module docstring; ``size`` keys: tokens, d, layers, buffers."""

    def __init__(self, variant: str, device: torch.device, size: dict | None = None):
        sz = self.setup(variant, device, size, CUDA_SIZE, CPU_SIZE)
        self.cuda = device.type == "cuda"
        self.dtype = torch.bfloat16 if self.cuda else torch.float32
        g = torch.Generator().manual_seed(0)
        d = sz["d"]
        self.w = [(torch.randn(d, d, generator=g) * d ** -0.5).to(device, self.dtype) for _ in range(sz["layers"])]
        pin = self.cuda and variant == "fixed"
        self.host = [torch.randn(sz["tokens"], d, generator=g).pin_memory() if pin
                     else torch.randn(sz["tokens"], d, generator=g) for _ in range(sz["buffers"])]
        self.flag = torch.zeros((), dtype=torch.bool, device=device)
        self.lagged = LaggedRead(self.flag)
        self.n = 0
        if variant == "fixed" and self.cuda:
            self.copy_stream = torch.cuda.Stream()
            self.dev = [torch.empty(sz["tokens"], d, device=device) for _ in range(2)]
            self.copied = [torch.cuda.Event() for _ in range(2)]
            self.consumed = [torch.cuda.Event() for _ in range(2)]
            self._prefetch(0)

    def _prefetch(self, n: int) -> None:
        """Start copying step ``n``'s features into device buffer ``n % 2`` on the copy stream."""
        b = n % 2
        with torch.cuda.stream(self.copy_stream):
            if n >= 2:
                self.copy_stream.wait_event(self.consumed[b])  # the compute of step n-2 read this buffer
            self.dev[b].copy_(self.host[n % len(self.host)], non_blocking=True)
            self.copied[b].record()

    def _compute(self, feats: torch.Tensor) -> None:
        x = feats.to(self.dtype)
        for w in self.w:
            x = torch.relu(x @ w)
        self.flag.copy_(~torch.isfinite(x[0, 0]))

    def step(self) -> None:
        with step_range():
            n, self.n = self.n, self.n + 1
            with site(SITE):
                if self.variant == "planted" or not self.cuda:
                    feats = self.host[n % len(self.host)].to(self.device)  # SYNC (planted): pageable HtoD
                else:
                    self._prefetch(n + 1)
                    b = n % 2
                    torch.cuda.current_stream().wait_event(self.copied[b])
                    feats = self.dev[b]
            self._compute(feats)
            if self.variant == "fixed" and self.cuda:
                self.consumed[n % 2].record()
            prev = self.lagged.push(self.flag)
            if prev is not None and bool(prev):  # never with these inputs
                raise FloatingPointError("the features overflowed")


def build(variant: str, device: torch.device, size: dict | None = None) -> PageableHtoD:
    """The loop for ``variant`` ('planted' | 'fixed') on ``device``; ``size`` overrides the device's preset."""
    return PageableHtoD(variant, device, size)
