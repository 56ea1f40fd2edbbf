"""Draft trees (DDTree; DESIGN.md "Draft trees"): build a best-first tree from the draft's per-position top-k,
verify every node in one target forward, follow the verified path greedily, commit only that path.

The tree. The draft block proposes, at each of its first D = B - 1 positions, its top-k tokens with their
log-probabilities logp[d, r] (sorted descending in r). A node at depth d >= 1 is a path of ranks (r_1 .. r_d);
its token is ids[d - 1, r_d] and its score the log of the product of draft probabilities along the path,
score = score(parent) + logp[d - 1, r_d] (a float32 sum: both builders add the same float32 numbers, so they
rank nodes identically). Node 0 is the root: the pending token (last_tok) at depth 0, score 0. The DDTree rule
(Algorithm 1 of the DDTree paper): starting from the root, repeatedly add the frontier node (a child of a tree
node, not yet in the tree, depth <= D) of highest score, until the tree holds N nodes (the budget, root
included: N is the verify width, the chain's B). Ties go to the smaller key (parent index, rank), parents being
numbered in the order they were added. When the whole top-k lattice holds fewer than N nodes, the rest are
padding (``exists`` False): verified like any node, never accepted.

Two builders produce the same arrays (tests/runtime/test_runtime_tree.py compares them on random inputs with ties):

- ``build_tree_heapq``: one request on the host, Python ``heapq`` with the lazy "next sibling + first child"
  pushes of DDTree's reference code (the frontier is never materialised). The engine's ``cpu-heapq`` builder
  (runtime/faults.py ``cpu_tree_build``) calls it per request after copying the top-k to the host: the
  CPU tree-build pathology (a device-to-host sync, then Python while the GPU idles).
- ``build_tree_torch``: all requests at once on the device, fixed shapes: N - 1 steps, each an argmax over the
  whole [N, k] candidate grid (torch.argmax returns the first maximum: the tie rule above). No host sync.

Verify: node t sits in token slot L + t of its request (the tree region) at position L + depth(t); it attends to
the committed context (positions < L) and to its ancestors and itself in the tree region (an ancestor-only mask
over the paged KV cache); linear-attention layers run the recurrence along each node's ancestor path
(``gdn.gated_delta_rule_tree``: one state per node, exact). Accept: from the root, step to the child whose token
equals the target's greedy token at the current node, while one exists (DDTree's ``follow_verified_tree``); tau =
accepted nodes + 1 (the bonus); emitted tokens = the target's greedy tokens along the path. Commit: the path's
K/V are copied from their tree slots to slots L .. L + tau - 1 (KV compaction), the target's linear states taken
at the last accepted node, and the draft re-fed the emitted path (its KV and linear state then hold the accepted
tokens, not its own greedy chain). All device work: fixed shapes, no host sync.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np
import torch

from ..models.model import CacheView, Transformer
from .state import DecodeState

LOGP_FLOOR = -1e4  # draft log-probabilities are floored here: every candidate score stays finite (a -inf would
                   # tie with the builders' "no candidate" marker); it reorders nothing that had probability > 0


@dataclass
class Tree:
    """A batch of trees of N nodes (node 0 = the root). tokens [nb, N] long (the root's is a placeholder: the
    verify uses the pending token); parent [nb, N] long (-1 for the root and padding); depth [nb, N] long;
    exists [nb, N] bool; anc [nb, N, N] bool (anc[b, t, a]: a is t itself or an ancestor of t; padding: itself
    only); score [nb, N] float32 (0 for the root and padding)."""

    tokens: torch.Tensor
    parent: torch.Tensor
    depth: torch.Tensor
    exists: torch.Tensor
    anc: torch.Tensor
    score: torch.Tensor

    FIELDS = ("tokens", "parent", "depth", "exists", "anc", "score")

    @classmethod
    def empty(cls, nb: int, N: int, device) -> "Tree":
        """Static buffers holding a valid tree of the root alone, every other node padding (a bucket's graph input).

        Valid, not zeroed: the verify graph is captured (and warmed up, on the scratch slot with no context) from
        these values when no tree graph fills them first (the cpu-heapq builder). All-zero ancestors would mask
        every column of a node's attention row (softmax of all -inf: NaN) and parent 0 would make the root its
        own parent; the NaN lands in the scratch slot's garbage page and linear state, and every later masked read
        of that page turns 0 x NaN into NaN logits (found on the H200: the decode ended after one round)."""
        z = lambda *s, dt=torch.long: torch.zeros(*s, dtype=dt, device=device)  # noqa: E731
        exists = z(nb, N, dt=torch.bool)
        exists[:, 0] = True
        anc = torch.eye(N, dtype=torch.bool, device=device).expand(nb, N, N).clone()
        parent = torch.full((nb, N), -1, dtype=torch.long, device=device)
        return cls(z(nb, N), parent, z(nb, N), exists, anc, z(nb, N, dt=torch.float32))

    def copy_(self, other: "Tree", non_blocking: bool = False) -> None:
        """Overwrite every field in place from ``other`` (same shapes; host or device)."""
        for f in self.FIELDS:
            getattr(self, f).copy_(getattr(other, f), non_blocking=non_blocking)


def draft_topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [nb, V] -> (logp [nb, k] float32 sorted descending, floored at LOGP_FLOOR; ids [nb, k] long)."""
    logp = torch.log_softmax(logits.float(), -1)
    top, ids = logp.topk(k, -1)
    return top.clamp(min=LOGP_FLOOR), ids


def build_tree_heapq(logp: np.ndarray, ids: np.ndarray, budget: int) -> dict[str, np.ndarray]:
    """One request's tree on the host (DDTree's reference algorithm, Python heapq).

    logp [D, k] float32 sorted descending per row, ids [D, k] int; budget N >= 1 nodes, root included.
    Returns numpy arrays named as ``Tree``'s fields, of shapes [N] (anc [N, N]). Heap entries are
    (-score, parent, rank, depth): popped in the same order as ``build_tree_torch``'s argmax picks."""
    logp = np.asarray(logp, dtype=np.float32)
    D, k = logp.shape
    N = budget
    tokens = np.zeros(N, np.int64)
    parent = np.full(N, -1, np.int64)
    depth = np.zeros(N, np.int64)
    exists = np.zeros(N, bool)
    anc = np.zeros((N, N), bool)
    score = np.zeros(N, np.float32)
    exists[0] = True
    anc[np.arange(N), np.arange(N)] = True
    heap: list = []
    if D > 0 and k > 0:
        heap.append((-float(score[0] + logp[0, 0]), 0, 0, 0))
    for t in range(1, N):
        if not heap:
            break
        _, i, r, d = heapq.heappop(heap)
        s = score[i] + logp[d, r]  # float32 + float32: the same rounding as the device's sum
        tokens[t], parent[t], depth[t], exists[t], score[t] = ids[d, r], i, d + 1, True, s
        anc[t] |= anc[i]
        if r + 1 < k:  # next sibling: same parent, next rank (score <= this node's)
            heapq.heappush(heap, (-float(score[i] + logp[d, r + 1]), i, r + 1, d))
        if d + 1 < D:  # first child: rank 0 one level deeper
            heapq.heappush(heap, (-float(s + logp[d + 1, 0]), t, 0, d + 1))
    return {"tokens": tokens, "parent": parent, "depth": depth, "exists": exists, "anc": anc, "score": score}


def build_tree_torch(logp: torch.Tensor, ids: torch.Tensor, budget: int) -> Tree:
    """All requests' trees at once on logp's device (batched; fixed shapes; no host sync: nothing is read back,
    every choice stays a device tensor, no data-dependent shape).

    logp [nb, D, k] float32 sorted descending along k, ids [nb, D, k] long, budget N. Step t = 1 .. N - 1 scores
    the whole candidate grid (tree node i, rank r) -> score[i] + logp[depth[i], r], masks what is not a
    candidate (node absent, at depth D, or (i, r) already taken), and adds the argmax (the first maximum in
    (i, r) order: ties to the smaller parent, then rank, as ``build_tree_heapq``). Costs N - 1 small steps of
    O(nb N k) work each."""
    nb, D, k = logp.shape
    N, dev = budget, logp.device
    t_ = Tree.empty(nb, N, dev)
    parent, depth, exists, anc, score = t_.parent, t_.depth, t_.exists, t_.anc, t_.score
    parent.fill_(-1)
    exists[:, 0] = True
    anc.copy_(torch.eye(N, dtype=torch.bool, device=dev).expand(nb, N, N))
    rank = torch.zeros(nb, N, dtype=torch.long, device=dev)
    open_ = torch.zeros(nb, N, k, dtype=torch.bool, device=dev)  # (i, r) still a candidate once i exists
    if D == 0 or N == 1:
        return t_
    open_[:, 0] = True
    for t in range(1, N):
        lp = logp.gather(1, depth.clamp(max=D - 1)[:, :, None].expand(nb, N, k))   # [nb, N, k]
        cand = (score[:, :, None] + lp).view(nb, N * k)
        key = torch.where(open_.view(nb, N * k), cand, float("-inf"))  # a Python scalar: no host-to-device copy
        best = key.argmax(1, keepdim=True)                                          # [nb, 1]: first maximum
        # any candidate left? ``ok`` stays a device tensor and masks every write below: branching on it in Python
        # (``if ok.any():``) or stopping early would be a host sync per step
        ok = open_.view(nb, N * k).gather(1, best)[:, 0]
        i, r = best[:, 0] // k, best[:, 0] % k
        d = depth.gather(1, i[:, None])[:, 0] + 1
        parent[:, t] = torch.where(ok, i, -1)
        depth[:, t] = torch.where(ok, d, 0)
        rank[:, t] = r
        exists[:, t] = ok
        score[:, t] = torch.where(ok, cand.gather(1, best)[:, 0], 0.0)
        anc[:, t] |= anc.gather(1, i[:, None, None].expand(nb, 1, N))[:, 0] & ok[:, None]
        open_.view(nb, N * k).scatter_(1, best, False)                              # taken (a no-op if not ok)
        open_[:, t] = (ok & (d < D))[:, None]                                       # its children: depth d + 1 <= D
    # tokens once at the end, by gathers (no per-node host lookup as in the heapq builder)
    tok = ids.gather(1, (depth - 1).clamp(min=0)[:, :, None].expand(nb, N, k)).gather(2, rank[:, :, None])[:, :, 0]
    t_.tokens.copy_(torch.where(exists & (depth > 0), tok, 0))
    return t_


def tree_verify(model: Transformer, st: DecodeState, rows: torch.Tensor, tree: Tree):
    """The target over every node of every row's tree in one forward.

    rows [nb]; tree of N nodes. Node t: token (the pending token for the root), position L + depth, K/V written to
    token slot L + t; mask = committed context (positions < L) | ancestors-or-self in the tree region.
    Returns (pred [nb, N] long: the target's greedy token after each node's path; states [n_linear, nb, N, Hv,
    dk, dv] float32: the linear states after each node's path, or None)."""
    nb, N = tree.tokens.shape
    L = st.lengths[rows]
    node = torch.arange(N, device=rows.device)
    tokens = torch.where(node == 0, st.last_tok[rows][:, None], tree.tokens)
    pos = L[:, None] + tree.depth
    tmap = st.token_map(rows)
    write = tmap.gather(1, (L[:, None] + node).clamp(max=st.max_len - 1))
    col = torch.arange(st.max_len, device=rows.device)
    rel = col[None, :] - L[:, None]                                             # [nb, S]: tree-region index
    in_region = (rel >= 0) & (rel < N)
    anc_cols = tree.anc.gather(2, rel.clamp(0, N - 1)[:, None, :].expand(nb, N, st.max_len))
    mask = (rel < 0)[:, None, :] | (anc_cols & in_region[:, None, :])
    cache = CacheView(st.tgt_k, st.tgt_v, write, tmap, mask, st.tgt_lin.gather(rows), all_states=True,
                      parents=tree.parent, fused=st.fused)
    logits, states = model(tokens, pos, cache)
    return logits.argmax(-1), states


def tree_accept(tree: Tree, pred: torch.Tensor, B: int):
    """Follow the verified tree greedily (fixed shapes: one step per depth level, B - 1 of them).

    pred [nb, N] from ``tree_verify``. Returns (emitted [nb, B] long: the target's tokens along the accepted path,
    valid for the first tau; tau [nb] long in [1, B]; path [nb, B] long: node index at each depth, the last
    accepted node repeated past tau)."""
    nb, N = pred.shape
    cur = torch.zeros(nb, dtype=torch.long, device=pred.device)
    tau = torch.ones(nb, dtype=torch.long, device=pred.device)
    alive = torch.ones(nb, dtype=torch.bool, device=pred.device)
    path = [cur]
    for _ in range(B - 1):
        want = pred.gather(1, cur[:, None])                                      # the target's token after cur
        match = tree.exists & (tree.parent == cur[:, None]) & (tree.tokens == want) & alive[:, None]
        found = match.any(1)                                                     # children carry distinct tokens
        cur = torch.where(found, match.long().argmax(1), cur)
        alive = alive & found
        tau = tau + found.long()
        path.append(cur)
    path_t = torch.stack(path, 1)
    return pred.gather(1, path_t), tau, path_t


def compact_kv(st: DecodeState, rows: torch.Tensor, path: torch.Tensor) -> None:
    """KV compaction: copy each row's accepted path from its tree slots (L + path[d]) to slots L + d, in every
    full-attention layer of the target, for all d < B (past tau: garbage past the new length, masked, rewritten
    next round). All sources are gathered before any write, so a path that reads a slot another step writes is
    safe. Must run before the lengths advance."""
    L = st.lengths[rows]
    d = torch.arange(path.shape[1], device=rows.device)
    tmap = st.token_map(rows)
    src = tmap.gather(1, (L[:, None] + path).clamp(max=st.max_len - 1)).reshape(-1)
    dst = tmap.gather(1, (L[:, None] + d).clamp(max=st.max_len - 1)).reshape(-1)
    for pool in (*st.tgt_k, *st.tgt_v):
        pool.index_copy_(0, dst, pool[src])


def draft_refeed(model: Transformer, st: DecodeState, rows: torch.Tensor, rect: torch.Tensor,
                 rect_len: torch.Tensor, emitted: torch.Tensor):
    """Re-run the draft over the accepted path in one forward: tokens [pending, emitted[:, :B - 1]] at positions
    L .. L + B - 1, over the draft window (as ``draft_block`` reads it) and causally within the block. Rewrites the
    draft's KV of those positions (its block held its own greedy chain, which a tree path may leave at any
    depth) and returns its linear states after each of the B tokens [n_linear, nb, B, ...] (None without linear
    layers), for the commit at tau. Must run before the lengths advance."""
    B = st.block_size
    L = st.lengths[rows]
    tokens = torch.cat([st.last_tok[rows][:, None], emitted[:, : B - 1]], 1)
    pos = L[:, None] + st.block_index
    blk = st.token_map(rows).gather(1, pos.clamp(max=st.max_len - 1))
    read = torch.cat([rect, blk], 1)
    mask = st.draft_masks(rect_len)
    cache = CacheView(st.drf_k, st.drf_v, blk, read, mask, st.drf_lin.gather(rows), all_states=True,
                      fused=st.fused)
    _, states = model(tokens, pos, cache)
    return states
