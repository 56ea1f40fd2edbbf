"""The draft's window page-table rectangle, built two ways with identical results (DESIGN.md "The caches and
the draft window").

For row i and column j < W + P - 1: rect[i, j] = token_map[i, s(L_i) + j] if j < c(L_i), else 0 (a don't-care
slot that attention masks out). ``rect_fixed`` does it with fixed-shape device arithmetic (the overlap
scheduler: no host sync); ``rect_packed`` rebuilds it the way a production decoder did, with a ``.max().item()``
to size the gather and a ``masked_select`` pack whose length is data-dependent (the sync scheduler: two host
syncs, each its own device round-trip). Only the host-visible sizing differs; the values are the same.
"""
from __future__ import annotations

import torch

from ..cache.window import compact_len, window_start
from .state import DecodeState


def rect_fixed(st: DecodeState, rows: torch.Tensor):
    """(rect [nb, W+P-1] long, c(L) [nb] long) from the device lengths of ``rows``; no sync."""
    L = st.lengths[rows]
    s = window_start(L, st.window, st.page_size)
    c = L - s
    j = st.rect_cols
    cols = (s[:, None] + j).clamp(max=st.max_len - 1)
    rect = torch.where(j < c[:, None], st.token_map(rows).gather(1, cols), 0)
    return rect, c


def rect_packed(st: DecodeState, rows: torch.Tensor):
    """The same (rect, c) through data-dependent gathers (DESIGN.md "Schedulers: sync and overlap"): two deliberate
    host syncs."""
    L = st.lengths[rows]
    s = window_start(L, st.window, st.page_size)
    c = compact_len(L, st.window, st.page_size)
    width = int(c.max().item())  # SYNC (deliberate, the sync scheduler's): size the gather from the longest window
    j = torch.arange(width, device=L.device)
    keep = j < c[:, None]
    cols = (s[:, None] + j).clamp(max=st.max_len - 1)
    packed = st.token_map(rows).gather(1, cols).masked_select(keep)  # SYNC: output length is data-dependent
    rect = torch.zeros(rows.shape[0], st.rect_width, dtype=torch.long, device=L.device)
    rect[:, :width].masked_scatter_(keep, packed)
    return rect, c

