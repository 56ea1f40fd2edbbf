"""The draft-tree round on the device (issue 8; seeds 003/004): per-bucket static tree buffers and CUDA graphs, and
the phases the engine runs between the draft block and the readback. The math is in runtime/spec/tree.py.

A tree round (engine ranges in brackets):

    [draft]   the draft block's graph, which also returns each position's top-k (logp, ids)
    [tree]    the builder fills the bucket's static ``Tree``:
                gpu:        ``gpu_tree_build``, ``build_tree_torch`` (a graph of its own on CUDA): no host sync
                cpu-heapq:  ``cpu_tree_build`` (runtime/faults.py): top-k copied to the host (SYNC), one Python
                            heapq build per request, the arrays uploaded: the GPU idles meanwhile (the seeds')
    [verify]  every node in one target forward (graph), ancestor-only mask, one linear state per node
    [accept]  greedy walk down the verified tree: emitted tokens, tau, the accepted path
    [commit]  KV compaction of the path, target linear state at the last accepted node, the draft re-fed the
              path (``draft_refeed``, a graph), lengths and pending tokens

Every phase but ``cpu_tree_build`` is fixed-shape device work with no host sync, so under the overlap scheduler
the host still runs a round ahead.
"""
from __future__ import annotations

import torch

from . import faults as F
from .annotate import annotate
from .graphs import GraphedCall
from .spec.commit import commit_round
from .spec.tree import Tree, build_tree_torch, compact_kv, draft_refeed, tree_accept, tree_verify


class TreeRunner:
    """The tree round's buffers, graphs and phases for one ModelRunner (``runner.tree`` in tree mode)."""

    def __init__(self, runner):
        rc = runner.rcfg
        self.runner, self.rcfg = runner, rc
        self.N, self.k, self.D = rc.tree_budget, rc.tree_topk, rc.block_size - 1
        if self.k > runner.draft.config.vocab_size:
            from .config import ConfigError
            raise ConfigError(f"tree top-k {self.k} exceeds the vocabulary ({runner.draft.config.vocab_size})")
        self.cpu = rc.cpu_tree_build
        dev = runner.device
        self.trees = {nb: Tree.empty(nb, self.N, dev) for nb in runner.buckets}             # verify graph inputs
        self.emitted = {nb: torch.zeros(nb, rc.block_size, dtype=torch.long, device=dev)   # refeed graph input
                        for nb in runner.buckets}

    # ------------------------------------------------------------------------------------- graph bodies
    def _build_fn(self, nb: int, logp: torch.Tensor, ids: torch.Tensor):
        tree = self.trees[nb]
        return lambda: tree.copy_(build_tree_torch(logp[:, : self.D], ids[:, : self.D], self.N))

    def _verify_fn(self, nb: int):
        r = self.runner
        rows, tree = r.buffers[nb].rows, self.trees[nb]
        return lambda: tree_verify(r.target, r.state, rows, tree)

    def _refeed_fn(self, nb: int):
        r = self.runner
        buf, emitted = r.buffers[nb], self.emitted[nb]
        return lambda: draft_refeed(r.draft, r.state, buf.rows, buf.rect, buf.rect_len, emitted)

    def capture(self, nb: int, draft_outputs, pool) -> None:
        """Capture bucket nb's tree graphs (gpu builder only), verify and refeed graphs into ``runner.graphs``;
        ``draft_outputs`` = the draft graph's outputs (tokens, states, logp, ids)."""
        g = self.runner.graphs
        if not self.cpu:
            g["tree", nb] = GraphedCall(f"tree_bs{nb}", self._build_fn(nb, draft_outputs[2], draft_outputs[3]), pool)
        g["verify", nb] = GraphedCall(f"verify_bs{nb}", self._verify_fn(nb), pool)
        g["refeed", nb] = GraphedCall(f"refeed_bs{nb}", self._refeed_fn(nb), pool)

    def _call(self, phase: str, nb: int, fn):
        g = self.runner.graphs.get((phase, nb))
        return g() if g is not None else fn()

    # ------------------------------------------------------------------------------------- phases
    def build(self, nb: int, drafted) -> None:
        """Fill bucket nb's tree from the draft block's top-k (``drafted`` = run_draft's 4-tuple)."""
        logp, ids = drafted[2], drafted[3]
        if self.cpu:
            F.cpu_tree_build(self.runner, self.trees[nb], logp[:, : self.D], ids[:, : self.D], self.N)
        else:
            with annotate("gpu_tree_build"):
                self._call("tree", nb, self._build_fn(nb, logp, ids))

    def verify(self, nb: int):
        """(pred [nb, N], target states per node)."""
        return self._call("verify", nb, self._verify_fn(nb))

    def accept(self, nb: int, pred: torch.Tensor):
        """(emitted [nb, B], tau [nb], path [nb, B])."""
        return tree_accept(self.trees[nb], pred, self.rcfg.block_size)

    def commit(self, nb: int, emitted, tau, path, tgt_states) -> None:
        """Commit the accepted path of every row of bucket nb (see the module docstring)."""
        r, st = self.runner, self.runner.state
        rows = r.buffers[nb].rows
        compact_kv(st, rows, path)
        self.emitted[nb].copy_(emitted)
        with annotate("draft_refeed"):
            drf_states = self._call("refeed", nb, self._refeed_fn(nb))
        last = path[:, -1]  # the last accepted node (path repeats it past tau)
        if "eager-commit-glue" in self.rcfg.faults:
            F.eager_commit_glue(rows, last + 1, [(st.tgt_lin, r.target, tgt_states)])
            F.eager_commit_glue(rows, tau, [(st.drf_lin, r.draft, drf_states)])
        else:
            st.tgt_lin.commit_at(rows, tgt_states, last)
            st.drf_lin.commit(rows, drf_states, tau)
        commit_round(st, rows, emitted, tau, None, None, linear=False)
