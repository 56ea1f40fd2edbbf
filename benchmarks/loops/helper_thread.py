"""A helper thread prepares each step's inputs; the main thread waits for it on a queue.

The producer thread turns the next request's text into token ids: it waits on simulated I/O (``io_ms`` of
``time.sleep``, which releases the GIL, as a socket or file read does), tokenizes a short string in Python, and
hands back a [batch] id tensor. The main thread's step: takes those ids from a queue, copies them to the device,
runs an eager decode step (embedding, ``layers`` MLP blocks, LM head, argmax) and reads the tokens back once
(``tolist()``, a sync every step in both variants).

* planted (``planted_queue_wait``): lock-step hand-off: the main thread asks for the next inputs only when it
  needs them (``requests.put``) and blocks on ``replies.get()`` while the producer does all its work; the
  producer's whole latency plus two thread hand-offs is added to every step.
* fixed: the producer runs ahead into a bounded ``queue.Queue(maxsize=4)``; ``get()`` finds the inputs ready.

Expected saving (an estimate, before measurement): about the producer's latency (``io_ms`` of sleep, which the
kernel rounds up to ~0.25-0.3 ms, plus ~0.1 ms of tokenization) and two thread hand-offs per step, against a step of
~0.5-0.7 ms (12 eager MLP blocks + one read-back): the planted step should be roughly 1.4-1.8x the fixed one. The
fixed producer needs less time per batch than a step, so it stays ahead.
"""
from __future__ import annotations

import queue
import threading
import time

import torch

from ._common import TinyDecoder, Loop, site, step_range

NAME = "helper_thread"
CAUSE = "main thread blocks on a queue for a producer thread that only starts when asked"
FIX = "the producer runs ahead into a bounded queue"
SITE = "planted_queue_wait"  # the range around the planted cause (and its fix)
EXPECTED_RATIO = (1.4, 1.8)  # planted / fixed step period on an H200: the estimate above, before measurement
CUDA_SIZE = {"batch": 16, "d": 2048, "layers": 12, "vocab": 16384, "io_ms": 0.2, "text_words": 8,
             "graph_forward": 0}
CPU_SIZE = {"batch": 2, "d": 32, "layers": 1, "vocab": 64, "io_ms": 0.2, "text_words": 8, "graph_forward": 0}


class HelperThread(Loop):
    """See the module docstring; ``size`` keys: graph_forward (0 | 1), batch, d, layers, vocab, io_ms, text_words.
    Call ``close()`` (the driver does) to stop the producer; it is a daemon thread, so a process exit stops it too."""

    def __init__(self, variant: str, device: torch.device, size: dict | None = None):
        sz = self.setup(variant, device, size, CUDA_SIZE, CPU_SIZE)
        self.sz = sz
        d, v = sz["d"], sz["vocab"]
        self.model = TinyDecoder(device, d, sz["layers"], v)
        # graph_forward 1: the forward in one CUDA graph (what fixing a finding on its host work would buy)
        self.forward = self.model.forward_for(sz["batch"], bool(sz.get("graph_forward", 0)))
        self.words = [f"word{i}" for i in range(1000)]
        self.stop = threading.Event()
        self.requests: queue.Queue = queue.Queue()
        self.ready: queue.Queue = queue.Queue(maxsize=4)
        self.produced = 0
        self.worker = threading.Thread(target=self._produce, name="input-producer", daemon=True)
        self.worker.start()

    def _make_inputs(self) -> torch.Tensor:
        """One batch of inputs: simulated I/O, then a Python tokenization of ``text_words`` words per request."""
        time.sleep(self.sz["io_ms"] / 1e3)
        n, b, v = self.produced, self.sz["batch"], self.sz["vocab"]
        self.produced += 1
        ids = []
        for r in range(b):
            text = " ".join(self.words[(n * 7 + r * 13 + k) % 1000] for k in range(self.sz["text_words"]))
            ids.append(sum(ord(c) * (k + 1) for k, c in enumerate(text)) % v)
        return torch.tensor(ids, dtype=torch.long)

    def _produce(self) -> None:
        while not self.stop.is_set():
            if self.variant == "planted":
                try:
                    self.requests.get(timeout=0.1)  # wait to be asked
                except queue.Empty:
                    continue
            x = self._make_inputs()
            while not self.stop.is_set():
                try:
                    self.ready.put(x, timeout=0.1)
                    break
                except queue.Full:
                    continue

    def step(self) -> None:
        with step_range():
            with site(SITE):
                if self.variant == "planted":
                    self.requests.put(None)
                ids = self.ready.get()
            logits = self.forward(ids.to(self.device, non_blocking=False))
            self.last = logits.argmax(-1).tolist()  # SYNC: the new tokens, once per step (both)

    def close(self) -> None:
        """Stop the producer thread and wait for it."""
        self.stop.set()
        self.worker.join(timeout=5)


def build(variant: str, device: torch.device, size: dict | None = None) -> HelperThread:
    """The loop for ``variant`` ('planted' | 'fixed') on ``device``; ``size`` overrides the device's preset."""
    return HelperThread(variant, device, size)
