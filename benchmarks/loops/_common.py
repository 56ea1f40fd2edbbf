"""What every measured loop shares: the device choice, the step and site ranges, a one-step-late read-back, CUDA
graph capture, and the ``run(n_steps, tick)`` protocol the driver measures and captures through.

A loop object (built by a loop module's ``build(variant, device)``) has:

* ``run(n_steps, tick)``: runs ``n_steps`` steps, calling ``tick()`` once just before each step starts and once
  after the last step returns (``n_steps + 1`` calls). The driver's measurement records ``time.perf_counter()`` in
  ``tick``; its capture advances the profiler schedule there. :class:`Loop` implements it over ``step()``.
* ``step()``: one step, inside a ``torch.profiler.record_function("step")`` range (the ProfilerStep loop is the
  exception: it has no range of its own).
* ``sync()``: waits for the device (``torch.cuda.synchronize``; nothing on CPU).

Each planted cause (and, in the fixed twin, the code that replaces it) runs inside a ``record_function`` range named
``planted_<cause>``: the same name in both variants, so the site can be matched between the twins' traces.
"""
from __future__ import annotations

from typing import Callable

import torch

VARIANTS = ("planted", "fixed")


def resolve_device(name: str) -> torch.device:
    """``'cuda'`` (needs a visible GPU; ValueError otherwise) or ``'cpu'``."""
    if name == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device is visible to torch")
        return torch.device("cuda", torch.cuda.current_device())
    if name == "cpu":
        return torch.device("cpu")
    raise ValueError(f"unknown device {name!r} (cuda or cpu)")


def check_variant(variant: str) -> str:
    """``variant`` when it is ``'planted'`` or ``'fixed'``; ValueError otherwise."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r} (planted or fixed)")
    return variant


def step_range():
    """The ``step`` range around one step (a torch.profiler user annotation in the Kineto trace)."""
    return torch.profiler.record_function("step")


def site(name: str):
    """The range around a planted cause or its fix (``planted_<cause>``, the same name in both twins)."""
    return torch.profiler.record_function(name)


def sync(device: torch.device) -> None:
    """Wait for every queued kernel and copy on ``device`` (nothing to wait for on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # SYNC (deliberate): only at a measurement's start and end


class Loop:
    """Base class: ``run`` over ``step``; subclasses set ``device`` and define ``step``."""

    device: torch.device

    def setup(self, variant: str, device: torch.device, size: dict | None, cuda_size: dict, cpu_size: dict) -> dict:
        """Set ``variant`` (checked) and ``device``; return ``size``, else the device's preset."""
        self.variant = check_variant(variant)
        self.device = device
        return size or pick(device, cuda_size, cpu_size)

    def step(self) -> None:  # pragma: no cover - every loop defines it
        raise NotImplementedError

    def run(self, n_steps: int, tick: Callable[[], None]) -> None:
        """``n_steps`` steps, ``tick()`` before each and once after the last."""
        for _ in range(n_steps):
            tick()
            self.step()
        tick()

    def sync(self) -> None:
        """See :func:`sync`."""
        sync(self.device)


class LaggedRead:
    """Read a small device tensor one step late, without blocking on the step that made it.

    ``push(t)`` starts a non-blocking copy of ``t`` into one of two pinned host buffers and records a CUDA event
    after it, then waits for the *previous* push's event and returns that host copy (None on the first push). The
    host therefore runs at most one step ahead of the device, and never waits for the step it has just launched
    (CUDA C++ Programming Guide, "Asynchronous Concurrent Execution": a copy from device to page-locked host memory
    with ``cudaMemcpyAsync`` does not block the host; the event says when it has landed). On CPU the copy is a
    plain copy and nothing waits.
    """

    def __init__(self, like: torch.Tensor):
        self.cuda = like.device.type == "cuda"
        self.host = [torch.empty_like(like, device="cpu").pin_memory() if self.cuda
                     else torch.empty_like(like) for _ in range(2)]
        self.events = [torch.cuda.Event() if self.cuda else None for _ in range(2)]
        self.n = 0

    def push(self, t: torch.Tensor) -> torch.Tensor | None:
        """Start copying ``t``; return the previous push's host copy (waited for), or None on the first push."""
        slot = self.n % 2
        self.host[slot].copy_(t, non_blocking=self.cuda)
        if self.cuda:
            self.events[slot].record()
        prev = None
        if self.n > 0:
            p = 1 - slot
            if self.cuda:
                self.events[p].synchronize()  # the previous step's copy: landed long ago in steady state
            prev = self.host[p]
        self.n += 1
        return prev


def cuda_graph(fn: Callable[[], object], warmup: int = 3) -> "torch.cuda.CUDAGraph":
    """Capture ``fn()`` (which reads and writes only static tensors) in a CUDA graph, after ``warmup`` eager runs on
    a side stream as the PyTorch CUDA-graphs notes require ("CUDA Graphs" in the torch.cuda documentation)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g


def pick(device: torch.device, cuda_size: dict, cpu_size: dict) -> dict:
    """The size preset for ``device``: the GPU one on CUDA, a tiny one on CPU (the smoke test's)."""
    return dict(cuda_size if device.type == "cuda" else cpu_size)


class TinyDecoder:
    """Seeded random weights of a small residual GELU MLP decoder, shared by the loops whose step is a token
    forward: embedding [vocab, d] (scaled by √d), ``layers`` blocks x + gelu(x @ w1) @ w2 with w1 [d, 2d] and
    w2 [2d, d], and a head [d, vocab]; bf16 on CUDA, float32 on CPU. The draws come from ``generator`` (seed 0)
    in that order, and the loop draws its own inputs from it afterwards, so each loop's weights and inputs are
    what they were when its H200 pair was measured."""

    def __init__(self, device: torch.device, d: int, layers: int, vocab: int) -> None:
        self.dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        self.generator = g = torch.Generator().manual_seed(0)

        def w(*shape):
            return (torch.randn(*shape, generator=g) * shape[0] ** -0.5).to(device, self.dtype)

        self.emb = w(vocab, d) * (d ** 0.5)
        self.w1 = [w(d, 2 * d) for _ in range(layers)]
        self.w2 = [w(2 * d, d) for _ in range(layers)]
        self.head = w(d, vocab)

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """[batch] token ids -> [batch, vocab] logits (no sync)."""
        x = self.emb[tokens]
        for w1, w2 in zip(self.w1, self.w2):
            x = x + torch.nn.functional.gelu(x @ w1) @ w2
        return x @ self.head

    def forward_for(self, batch: int, graphed: bool) -> Callable[[torch.Tensor], torch.Tensor]:
        """The step's forward: :meth:`logits`, or (``graphed``, CUDA only) the same forward captured in one CUDA
        graph for a [batch] input: the ids copied into a static buffer, one replay, the static [batch, vocab] output
        returned (valid until the next call). The graphed one removes the forward's eager launches from the host,
        the fix a finding on the forward's host work names; a loop's ``graph_forward`` size key selects it."""
        if not graphed or self.emb.device.type != "cuda":
            return self.logits
        static = torch.zeros(batch, dtype=torch.long, device=self.emb.device)
        out: dict[str, torch.Tensor] = {}

        def fn() -> None:
            out["y"] = self.logits(static)

        g = cuda_graph(fn)

        def run(tokens: torch.Tensor) -> torch.Tensor:
            static.copy_(tokens, non_blocking=True)
            g.replay()
            return out["y"]

        return run

