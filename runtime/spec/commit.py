"""Commit a verify round at each row's accepted position: length += tau, the pending token = the target's token
at index tau - 1, and the linear-attention states of both models = their state after tau block tokens. KV needs
no copy: entries past the new length are masked now and overwritten next round. Fixed shapes, no sync."""
from __future__ import annotations

import torch

from .state import DecodeState


def commit_round(st: DecodeState, rows: torch.Tensor, pred: torch.Tensor, tau: torch.Tensor,
                 tgt_states: torch.Tensor | None, drf_states: torch.Tensor | None, linear: bool = True) -> None:
    """rows [nb]; pred [nb, B]; tau [nb] in [1, B]; states [n_linear, nb, B, ...] or None. Padding rows (the
    scratch slot) are reset to length 0 so they never grow. ``linear=False`` leaves the linear states to the
    caller (the ``eager-commit-glue`` fault commits them itself)."""
    L = st.lengths[rows]
    st.lengths.index_copy_(0, rows, torch.where(rows != st.scratch, L + tau, 0))
    st.last_tok.index_copy_(0, rows, pred.gather(1, (tau - 1)[:, None])[:, 0])
    if linear:
        st.tgt_lin.commit(rows, tgt_states, tau)
        st.drf_lin.commit(rows, drf_states, tau)
