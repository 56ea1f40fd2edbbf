"""The draft's compact sliding window over a paged cache (DESIGN.md "The caches and the draft window", "The plan
bound").

    s(L) = floor((L - min(L, W)) / P) * P      page-aligned window start
    c(L) = L - s(L)                            compact (resident) length, at most W + P - 1
    c(L) <= min(L, W + P - 1) <= min(Lplan, W + P - 1)   for any Lplan >= L

Every function works elementwise on Python ints, numpy arrays and torch tensors (integer dtypes).
"""
from __future__ import annotations


def window_start(L, W: int, P: int):
    """s(L): the first token position of the draft's window, a multiple of the page size P."""
    over = L - W
    over = over * (over > 0)  # L - min(L, W), written without min() so tensors and arrays work alike
    return (over // P) * P


def compact_len(L, W: int, P: int):
    """c(L) = L - s(L): how many tokens of a length-L request the draft window holds (not monotone in L)."""
    return L - window_start(L, W, P)


def rect_width(W: int, P: int) -> int:
    """W + P - 1: the fixed width of the draft page-table rectangle; no c(L) exceeds it."""
    return W + P - 1


def draft_window_bound(L_plan, W: int, P: int):
    """min(Lplan, W + P - 1): a sync-free upper bound on c(L) for every L <= Lplan.

    Proof (DESIGN.md "The plan bound"): if L <= W then s = 0 and c = L <= Lplan; if L > W, flooring L - W to a
    page boundary loses at most P - 1, so s(L) >= L - W - (P - 1) and c(L) <= W + P - 1; s(L) >= 0 gives
    c(L) <= L <= Lplan.
    """
    cap = rect_width(W, P)
    return L_plan - (L_plan - cap) * (L_plan > cap)


def window_mask(rect_len, rect_cols):
    """[nb, W + P - 1] bool: column j of the draft's window rectangle holds a window token (j < c(L)); rect_len
    [nb] = c(L) per row, ``rect_cols`` = the column indices 0 .. W + P - 2 (``DecodeState.rect_cols``)."""
    return rect_cols < rect_len[:, None]
