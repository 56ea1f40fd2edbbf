"""A side-stream input copy that the host waits for ("make sure the data landed") before launching the step's forward.

The step: a [tokens, d] float32 feature block (pinned host memory, rotated among ``buffers`` host tensors) is copied
to one of two device buffers on a copy stream with ``non_blocking=True`` (the copy stream first waits for the compute
of two steps back, which read that buffer: a cudaStreamWaitEvent on an event recorded after that compute), then cast
to bfloat16 and run through ``layers`` dense [d, d] layers on the compute stream; a "stop?" flag is read one step late
(:class:`LaggedRead`), so the host stays at most one step ahead.

* planted (``planted_copy_sync``): ``copy_stream.synchronize()`` right after the copy is issued, before the forward
  is launched: the host waits for the copy, so the copy and the host's launch work of the forward run one after the
  other every step, and the compute stream idles meanwhile.
* fixed: ``torch.cuda.current_stream().wait_stream(copy_stream)``: the compute stream waits for the copy on the
  device (an event recorded on the copy stream, a cudaStreamWaitEvent on the compute stream), the host goes on
  launching, and the copy of one step overlaps the forward of the step before.

Both compute the same values. A loop on two streams: the replay's cross-stream edges (docs/DESIGN.md "The replay
model") keep the forward behind its copy once the host wait is taken out. Expected saving (an estimate, before
measurement): the copy (8 MiB from pinned memory, ~0.15-0.35 ms) leaves the host's critical path; on a step of
~0.35-0.6 ms with the sizes below: planted / fixed ≈ 1.3-1.8x.
On CPU there is one stream: both variants make the same plain copy (a smoke run only).

Two size keys make the step serial, where the device order decides what the fix buys: ``graphed`` 1 replays the
forward as a CUDA graph (one per device buffer), and ``read_back`` 1 reads this step's flag with a blocking
``bool()`` instead of one step late. Each step then waits for its own copy and forward, in both variants: taking the
host's wait out saves only the sync's own round trip, as long as the forward stays behind its copy on the device (a
replay that let it start before the copy ended would predict the whole copy saved).
Measured on H100s (fixtures/traces/h100_new_loops/MANIFEST.md): as it is, planted 0.618 ms, fixed 0.689 (a host-bound
fixed twin that switched between ~0.47 and 0.66-0.89 ms), paired saving 0.167 ms; serial, planted 0.379, fixed 0.368,
paired saving 0.008 ms.
"""
from __future__ import annotations

import torch

from ._common import LaggedRead, Loop, cuda_graph, site, step_range

NAME = "copy_stream_sync"
CAUSE = "the host waits for a side-stream input copy (copy_stream.synchronize()) before launching the forward"
FIX = "the compute stream waits for the copy on the device (current_stream().wait_stream(copy_stream))"
SITE = "planted_copy_sync"  # the range around the planted cause (and its fix)
EXPECTED_RATIO = (1.3, 1.8)  # planted / fixed step period: the estimate above, before measurement
CUDA_SIZE = {"tokens": 2048, "d": 1024, "layers": 12, "buffers": 2, "graphed": 0, "read_back": 0}
CPU_SIZE = {"tokens": 8, "d": 16, "layers": 2, "buffers": 2, "graphed": 0, "read_back": 0}


class CopyStreamSync(Loop):
    """See the module docstring; ``size`` keys: tokens, d, layers, buffers, graphed (0 | 1), read_back (0 | 1)."""

    def __init__(self, variant: str, device: torch.device, size: dict | None = None):
        sz = self.setup(variant, device, size, CUDA_SIZE, CPU_SIZE)
        if sz["buffers"] < 1 or sz["layers"] < 1:
            raise ValueError(f"copy_stream_sync: buffers and layers must be at least 1 (got {sz})")
        self.cuda = device.type == "cuda"
        self.dtype = torch.bfloat16 if self.cuda else torch.float32
        g = torch.Generator().manual_seed(0)
        d = sz["d"]
        self.w = [(torch.randn(d, d, generator=g) * d ** -0.5).to(device, self.dtype) for _ in range(sz["layers"])]
        host = [torch.randn(sz["tokens"], d, generator=g) for _ in range(sz["buffers"])]
        self.host = [h.pin_memory() for h in host] if self.cuda else host
        self.flag = torch.zeros((), dtype=torch.bool, device=device)
        self.lagged = LaggedRead(self.flag)
        self.last = torch.zeros((), device=device)
        self.n = 0
        if self.cuda:
            self.copy_stream = torch.cuda.Stream()
            self.dev = [torch.zeros(sz["tokens"], d, device=device) for _ in range(2)]
            self.consumed = [torch.cuda.Event() for _ in range(2)]
        self.read_back = bool(sz.get("read_back", 0))
        # graphed: the forward of each device buffer captured once (its input is that buffer: a static address)
        self.graphs = ([cuda_graph(lambda b=b: self._compute(self.dev[b])) for b in range(2)]
                       if self.cuda and sz.get("graphed", 0) else None)

    def _copy(self, n: int) -> torch.Tensor:
        """Step ``n``'s features on the device: buffer ``n % 2``, copied on the copy stream (CUDA); the plain copy
        on CPU."""
        src = self.host[n % len(self.host)]
        if not self.cuda:
            return src.clone()
        b = n % 2
        with torch.cuda.stream(self.copy_stream):
            if n >= 2:
                self.copy_stream.wait_event(self.consumed[b])  # the compute of step n-2 read this buffer
            self.dev[b].copy_(src, non_blocking=True)
        return self.dev[b]

    def _compute(self, feats: torch.Tensor) -> None:
        x = feats.to(self.dtype)
        for w in self.w:
            x = torch.relu(x @ w)
        self.last = x[0, 0].float()
        self.flag.copy_(~torch.isfinite(x[0, 0]))

    def step(self) -> None:
        with step_range():
            n, self.n = self.n, self.n + 1
            with site(SITE):
                feats = self._copy(n)
                if self.cuda:
                    if self.variant == "planted":
                        self.copy_stream.synchronize()  # SYNC (planted): the host waits for the copy
                    else:
                        torch.cuda.current_stream().wait_stream(self.copy_stream)  # the device waits, not the host
            if self.graphs is not None:
                self.graphs[n % 2].replay()
            else:
                self._compute(feats)
            if self.cuda:
                self.consumed[n % 2].record()
            if self.read_back:
                prev = self.flag  # SYNC (deliberate, read_back 1): this step's flag, read now (bool() below)
            else:
                prev = self.lagged.push(self.flag)
            if prev is not None and bool(prev):  # never with these inputs
                raise FloatingPointError("the features overflowed")


def build(variant: str, device: torch.device, size: dict | None = None) -> CopyStreamSync:
    """The loop for ``variant`` ('planted' | 'fixed') on ``device``; ``size`` overrides the device's preset."""
    return CopyStreamSync(variant, device, size)
