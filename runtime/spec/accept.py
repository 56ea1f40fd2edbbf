"""Greedy block verification (DESIGN.md "Block-speculative decoding"; Leviathan et al. 2023 at temperature 0):
accept the longest prefix of drafted tokens equal to the target's own greedy tokens, plus the target's token at the
first disagreement (the bonus). tau = accepted + 1, in [1, B]. At temperature 0 the emitted tokens are exactly the
target's greedy decoding. Fixed shapes, on the device, no sync."""
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
    E[tau] = (1 - rate^B) / (1 - rate). Drawn on the device from ``generator``: no sync, reproducible.
    Equal to ``simulated_tau(acceptance_draws(...), rate)``."""
    return simulated_tau(acceptance_draws(torch.empty(nb, max(B - 1, 0), device=device), generator), rate)


def acceptance_draws(out: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Fill ``out`` [nb, B - 1] float32 with the round's uniform draws in [0, 1) from ``generator`` (the same
    numbers ``torch.rand(nb, B - 1, generator=generator)`` gives) and return it. Kept out of CUDA graphs: a graph
    replays a captured generator offset, so the draws stay eager (one kernel) and ``simulated_tau`` is graphed."""
    return out.uniform_(0.0, 1.0, generator=generator)


def simulated_tau(draws: torch.Tensor, rate: float) -> torch.Tensor:
    """tau [nb] long from the round's draws [nb, B - 1]: 1 + the number of leading draws below ``rate`` (token j
    accepted when u_j < rate and every earlier one was). Fixed shapes, no sync, graph-safe."""
    return (draws < rate).long().cumprod(1).sum(1) + 1
