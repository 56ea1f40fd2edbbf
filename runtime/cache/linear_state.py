"""Recurrent state of the linear-attention (gated delta rule) layers, one per request slot.

``pool`` is [n_linear, num_slots, Hv, dk, dv] float32. A verify (or a draft block) returns the state after every
one of its B tokens; ``commit`` keeps, per row, the state after its tau-th token: value-exact, the same numbers a
recomputation over the accepted tokens gives (seed 000, "The second layer"; tests/test_runtime_cache.py checks it).
"""
from __future__ import annotations

import torch


class LinearStatePool:
    """Per-slot recurrent states of one model (an empty pool when the model has no linear layers)."""

    def __init__(self, cfg, num_slots: int, device, fused: bool = False):
        n = cfg.layer_types.count("linear_attention")
        self.n_linear = n
        self.fused = fused  # commit through models.fused.commit_states (CUDA + Triton): one node, one pass
        self.pool = torch.zeros(n, num_slots, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                                cfg.linear_value_head_dim, device=device, dtype=torch.float32)

    def gather(self, rows: torch.Tensor) -> torch.Tensor | None:
        """States of the slots in ``rows`` [nb] -> [n_linear, nb, Hv, dk, dv] (None without linear layers)."""
        return self.pool[:, rows] if self.n_linear else None

    def write(self, slot: int, state: torch.Tensor | None) -> None:
        """Store one slot's state ([n_linear, 1, Hv, dk, dv]), e.g. after prefill."""
        if self.n_linear:
            self.pool[:, slot] = state[:, 0]

    def commit(self, rows: torch.Tensor, states_all: torch.Tensor | None, tau: torch.Tensor) -> None:
        """rows [nb] slots; states_all [n_linear, nb, B, Hv, dk, dv] (state after each block token); tau [nb] in
        [1, B]: pool[:, rows[i]] = states_all[:, i, tau[i] - 1]. One gather and one scatter for all layers;
        fixed shapes, no host sync."""
        self.commit_at(rows, states_all, tau - 1)

    def commit_at(self, rows: torch.Tensor, states_all: torch.Tensor | None, index: torch.Tensor) -> None:
        """pool[:, rows[i]] = states_all[:, i, index[i]]: the state after token (or tree node) ``index[i]``
        (a draft tree commits the state of its last accepted node). Fixed shapes, no host sync."""
        if not self.n_linear:
            return
        if self.fused:
            from ..models.fused import commit_states
            commit_states(self.pool, states_all, rows, index)
            return
        nb = rows.shape[0]
        picked = states_all[:, torch.arange(nb, device=rows.device), index]
        self.pool.index_copy_(1, rows, picked)
