"""Host-side pure-Python detokenization between steps, re-done from scratch every step.

The step: an eager decode step for ``batch`` requests (as in ``per_request_readback``), one batched read-back of
the new tokens (``tolist()``: a sync every step, in both variants), then each request's text is brought up to date
and checked for a stop string.

* planted (``planted_detokenize``): every step each request's last ``window`` tokens are turned back into text from
  scratch (``"".join(pieces[t] for t in tokens[-window:])``) and the whole text is searched for the stop string:
  ``batch * window`` piece look-ups of pure Python per step, while the device waits for the next launch.
* fixed: the text is cached per request; each step appends the new token's piece and searches only the tail that
  can hold a new match.

Both give the same stop decisions. Expected saving (an estimate, before measurement): the re-detokenization's host
time (8 requests x 512 tokens, roughly 0.2-0.4 ms per step on a server host) against a step of ~0.25 ms (eager
step + one read-back): the planted step should be roughly 1.5-2.5x the fixed one.
"""
from __future__ import annotations

import torch

from ._common import TinyDecoder, Loop, site, step_range

NAME = "host_detokenize"
CAUSE = "pure-Python re-detokenization of each request's window every step"
FIX = "cached text, append the new piece, search only the new tail"
SITE = "planted_detokenize"  # the range around the planted cause (and its fix)
EXPECTED_RATIO = (1.5, 2.5)  # planted / fixed step period on an H200: the estimate above, before measurement
CUDA_SIZE = {"batch": 8, "d": 2048, "layers": 4, "vocab": 16384, "window": 512, "graph_forward": 0}
CPU_SIZE = {"batch": 2, "d": 32, "layers": 1, "vocab": 64, "window": 32, "graph_forward": 0}
STOP = "\n\nUser:"


def _pieces(vocab: int, g: torch.Generator) -> list[str]:
    """A made-up vocabulary: ``vocab`` pieces of 1-6 lowercase letters, some with a leading space."""
    lens = torch.randint(1, 7, (vocab,), generator=g).tolist()
    chars = torch.randint(0, 26, (vocab * 6,), generator=g).tolist()
    out = []
    for i, n in enumerate(lens):
        s = "".join(chr(97 + c) for c in chars[6 * i: 6 * i + n])
        out.append((" " + s) if i % 3 == 0 else s)
    return out


class HostDetokenize(Loop):
    """See the module docstring; ``size`` keys: graph_forward (0 | 1), batch, d, layers, vocab, window."""

    def __init__(self, variant: str, device: torch.device, size: dict | None = None):
        sz = self.setup(variant, device, size, CUDA_SIZE, CPU_SIZE)
        d, v, self.window = sz["d"], sz["vocab"], sz["window"]
        self.model = TinyDecoder(device, d, sz["layers"], v)
        # graph_forward 1: the forward in one CUDA graph (what fixing a finding on its host work would buy)
        self.forward = self.model.forward_for(sz["batch"], bool(sz.get("graph_forward", 0)))
        g = self.model.generator  # the loop's inputs are drawn after the weights, from the same generator
        self.pieces = _pieces(v, g)
        prompt = torch.randint(0, v, (sz["batch"], self.window), generator=g)
        self.tokens = prompt[:, -1].to(device)
        # each request starts with a full window of prompt tokens, so the planted cost is the same every step
        self.history: list[list[int]] = prompt.tolist()
        self.texts = ["".join(self.pieces[t] for t in h[-self.window:]) for h in self.history]
        self.stopped = 0

    def step(self) -> None:
        with step_range():
            logits = self.forward(self.tokens)
            self.tokens = logits.argmax(-1)
            new = self.tokens.tolist()  # SYNC: the new tokens, once per step (both variants)
            with site(SITE):
                pieces, win = self.pieces, self.window
                for i, t in enumerate(new):
                    h = self.history[i]
                    h.append(t)
                    if self.variant == "planted":
                        text = "".join(pieces[u] for u in h[-win:])
                        hit = STOP in text
                    else:
                        text = self.texts[i] + pieces[t]
                        hit = STOP in text[-(len(STOP) + len(pieces[t])):]
                        self.texts[i] = text[-8 * win:]  # the cache keeps a bounded tail
                    if hit:
                        self.stopped += 1
                    if len(h) >= 4 * win:  # keep the history's memory flat over long runs
                        del h[: 2 * win]


def build(variant: str, device: torch.device, size: dict | None = None) -> HostDetokenize:
    """The loop for ``variant`` ('planted' | 'fixed') on ``device``; ``size`` overrides the device's preset."""
    return HostDetokenize(variant, device, size)
