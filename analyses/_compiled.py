"""Compiled (numba) loops for the analyses where a sequential dependency makes numpy rounds costly.

Each has a vectorised numpy twin in the module that calls it; tests check that the two agree on real traces.
"""
from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["prev_reaching_walk", "replay_chain"]


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


@njit(cache=True, nogil=True)
def replay_chain(work, cost, stops, his, await_items, item_call, item_pos, item_lat, item_after_end, item_prior,
                 call_start, gaps, dur, stream_idx, n_streams, base, edge_item, edge_on, await_stream, edge_lat):
    """The replay's host chain and device items in one pass (:func:`gaptrace.analyses.replay.replay`, whose numpy
    loop :func:`gaptrace.analyses.replay._replay_numpy` is the twin): calls run S_k = E_{k−1} + work_k,
    E_k = S_k + cost_k; at each waiting call ``stops[j]`` the items launched up to it (``his[j]``) get their ends
    e_i = max(l_i + d_i, e_prev(stream) + q_i + d_i), l_i first raised to the ends of its cross-stream producers
    (``edge_on[j]`` for each j with ``edge_item[j] == i``, sorted by item) plus ``edge_lat``, and the call returns at
    max(S_k, max_{i < await} e_i) + cost_k, or for a stream sync (``await_stream[k]`` >= 0, a stream index; n_streams:
    a stream with no item) max(S_k, the last end on that stream) + cost_k. Returns (S (K,), E (K,), item ends (I,))."""
    K = work.shape[0]
    I = item_call.shape[0]
    S = np.empty(K)
    E = np.empty(K)
    ie = np.empty(I)
    carry = np.full(n_streams + 1, -np.inf)  # the extra slot: a synced stream with no item
    pm = np.empty(I + 1)
    pm[0] = -np.inf
    pm_done = 0
    k0 = 0
    t = base - work[0] if K else 0.0
    n_stops = stops.shape[0]
    n_edges = edge_item.shape[0]
    ep = 0
    for j in range(n_stops + 1):
        kb = stops[j] if j < n_stops else K
        acc = 0.0
        for k in range(k0, kb):  # non-waiting calls: a running sum, as numpy's cumsum adds
            acc += work[k] + cost[k]
            E[k] = t + acc
            S[k] = E[k] - cost[k]
        if kb > k0:
            t = E[kb - 1]
        if kb < K:
            S[kb] = t + work[kb]
        hi = his[j] if kb < K else I
        need = await_items[kb] if kb < K else I
        if hi < pm_done:
            hi = pm_done
        for i in range(pm_done, hi):
            c = item_call[i]
            cc = c if c > 0 else 0
            lat = item_lat[i]
            if item_prior[i]:
                pp = item_pos[i]
                if pp >= 0:
                    l = S[pp] - call_start[pp] + lat
                else:
                    l = lat
            else:
                cs = S[cc]
                if kb < K:
                    ce = E[cc] if c < kb else cs
                else:
                    ce = E[cc]
                l = cs + lat * (ce - cs) if item_after_end[i] else cs + lat
            while ep < n_edges and edge_item[ep] < i:
                ep += 1
            while ep < n_edges and edge_item[ep] == i:  # cross-stream producers, all earlier items
                v = ie[edge_on[ep]] + edge_lat
                if v > l:
                    l = v
                ep += 1
            st = stream_idx[i]
            e = l + dur[i]
            f = carry[st] + (gaps[i] + dur[i])
            if f > e:
                e = f
            ie[i] = e
            carry[st] = e
            pm[i + 1] = pm[i] if pm[i] > e else e
        pm_done = hi
        if kb < K:
            if await_stream[kb] >= 0:
                r = carry[await_stream[kb]]
            else:
                r = pm[need if need < pm_done else pm_done]
            E[kb] = (S[kb] if S[kb] > r else r) + cost[kb]
            t = E[kb]
            k0 = kb + 1
    return S, E, ie
