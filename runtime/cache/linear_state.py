"""Recurrent state of the linear-attention (gated delta rule) layers, one per request slot.

``pool`` is [n_linear, num_slots, Hv, dk, dv] float32. A verify (or a draft block) returns the state after every
one of its B tokens; ``commit`` keeps, per row, the state after its tau-th token: value-exact, the same numbers a
recomputation over the accepted tokens gives (DESIGN.md "The caches and the draft window";
tests/runtime/test_runtime_cache.py checks it). With ``recompute_from(model)`` (the fused target, chain verify)
the verify returns each layer's projections of its tokens instead, and ``commit`` recomputes the accepted prefix's
state in place in one node (models.fused.gdn_recompute): the verify no longer writes ~1 MB of state per block token,
layer and row.
"""
from __future__ import annotations

import torch


class LinearStatePool:
    """Per-slot recurrent states of one model (an empty pool when the model has no linear layers)."""

    def __init__(self, cfg, num_slots: int, device, fused: bool = False):
        n = cfg.layer_types.count("linear_attention")
        self.n_linear = n
        self.fused = fused  # commit through models.fused.commit_states (CUDA + Triton): one node, one pass
        self.recompute = None  # (A_log, dt_bias [n_linear, Hv], hk, hv, dk, dv): see recompute_from
        self.pool = torch.zeros(n, num_slots, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                                cfg.linear_value_head_dim, device=device, dtype=torch.float32)

    def recompute_from(self, model) -> None:
        """Commit by recompute from now on: ``commit`` takes the verify's stacked projections [n_linear, nb, B,
        width] (CacheView.chain_inputs) instead of per-token states; ``model``'s linear layers give the
        parameters (Transformer.linear_parameters, made now: before any graph capture). Fused kernels only."""
        if not self.n_linear:
            return
        g = model.model.layers[model.linear_layers[0]].linear_attn
        self.recompute = (*model.linear_parameters(), g.hk, g.hv, g.dk, g.dv)

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
        fixed shapes, no host sync. In recompute mode ``states_all`` is the verify's projections [n_linear, nb, B,
        width] and the same state is recomputed from pool[:, rows[i]] over tokens 0 .. tau[i] - 1 (one node)."""
        if self.recompute is not None and self.n_linear:
            from ..models.fused import gdn_recompute
            gdn_recompute(self.pool, states_all, *self.recompute[:2], rows, tau, *self.recompute[2:])
            return
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
