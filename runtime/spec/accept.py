"""Greedy block verification (seed 000; Leviathan et al. 2023 at temperature 0): accept the longest prefix of
drafted tokens equal to the target's own greedy tokens, plus the target's token at the first disagreement (the
bonus). tau = accepted + 1, in [1, B]. At temperature 0 the emitted tokens are exactly the target's greedy
decoding. Fixed shapes, on the device, no sync."""
from __future__ import annotations

import torch


def greedy_accept(draft_tokens: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
    """draft_tokens [nb, B] (d1 .. dB), pred [nb, B] (target's token after each prefix) -> tau [nb] long.
    d_{j+1} (= draft_tokens[:, j]) is accepted when it equals pred[:, j] and every earlier one was."""
    B = pred.shape[1]
    if B == 1:
        return torch.ones(pred.shape[0], dtype=torch.long, device=pred.device)
    match = draft_tokens[:, : B - 1] == pred[:, : B - 1]
    return match.long().cumprod(1).sum(1) + 1


def simulated_accept(nb: int, B: int, rate: float, generator: torch.Generator, device) -> torch.Tensor:
    """The bench preset's acceptance, simulated: each drafted token is accepted with probability ``rate``
    (independently, stopping at the first rejection), so tau - 1 ~ a geometric law truncated at B - 1 and
    E[tau] = (1 - rate^B) / (1 - rate). Drawn on the device from ``generator``: no sync, reproducible."""
    if B == 1:
        return torch.ones(nb, dtype=torch.long, device=device)
    u = torch.rand(nb, B - 1, generator=generator, device=device)
    return (u < rate).long().cumprod(1).sum(1) + 1
