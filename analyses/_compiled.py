"""Compiled (numba) loops for the analyses where a sequential dependency makes numpy rounds costly.

Each has a vectorised numpy twin in the module that calls it; tests check that the two agree on real traces.
"""
from __future__ import annotations

from numba import njit

__all__ = ["prev_reaching_walk"]


@njit(cache=True, nogil=True)
def prev_reaching_walk(end, lo, hi, use_hi, cand):
    """In place: for i in order, follow cand[i] -> cand[cand[i]] ... until end[c] > lo[i] (and end[c] >= hi[i]
    with ``use_hi``) or -1. ``cand[i] < i`` on entry (a seed whose skipped indices all fail for i); the answer of
    an earlier node is final when a later one jumps through it (:func:`gaptrace.analyses.stacks._prev_reaching`
    gives the invariant that makes the jump exact)."""
    for i in range(end.shape[0]):
        c = cand[i]
        while c >= 0:
            if end[c] > lo[i] and (not use_hi or end[c] >= hi[i]):
                break
            c = cand[c]
        cand[i] = c
