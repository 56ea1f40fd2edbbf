"""The draft-tree round strategy (``--tree-budget N``; DESIGN.md "Draft trees"): per-bucket static tree buffers
and CUDA graphs, and the phases between the draft block and the readback. The math is in runtime/spec/tree.py.

A tree round (engine ranges in brackets):

    [draft]   the draft block's graph, which also returns each position's top-k (logp, ids)
    [tree]    the builder fills the bucket's static ``Tree``:
                gpu:        ``gpu_tree_build``, ``build_tree_torch`` (a graph of its own on CUDA): no host sync
                cpu-heapq:  ``cpu_tree_build`` (runtime/faults.py): top-k copied to the host (SYNC), one Python
                            heapq build per request, the arrays uploaded: the GPU idles meanwhile
    [verify]  every node in one target forward (graph), ancestor-only mask, one linear state per node
    [commit]  accept and commit, one graph on CUDA (``commit_bs{nb}``): the greedy walk down the verified tree
              (emitted tokens, tau, the accepted path), KV compaction of the path, the target's linear state at
              the last accepted node, the draft re-fed the path (``draft_refeed``), lengths and pending tokens.
              Under ``--fault eager-commit-glue`` it runs eagerly, with the fault's per-layer glue.

Every phase but ``cpu_tree_build`` is fixed-shape device work with no host sync, so under the overlap scheduler
the host still runs a round ahead; with graphs, a round is four graph launches (three with the cpu-heapq builder)
and a few eager ops, so the host's own cost is small next to a heapq build.
"""
from __future__ import annotations

import torch

from ..annotate import annotate
from ..config import ConfigError
from ..faults import cpu_tree_build, eager_commit_glue
from ..spec.commit import commit_round
from ..spec.tree import Tree, build_tree_torch, compact_kv, draft_refeed, tree_accept, tree_verify
from .graphs import GraphedCall
from .model_runner import ModelRunner, RoundBuffers
from .rounds import RoundResult
from .scheduler import RoundPlan


class TreeRound:
    """The tree round's buffers, graphs and phases over one ModelRunner (a :class:`~.rounds.RoundStrategy`)."""

    name = "tree"

    def __init__(self, runner: ModelRunner):
        rc = runner.rcfg
        self.runner, self.rcfg, self.faults = runner, rc, runner.faults
        self.N, self.k, self.D = rc.tree_budget, rc.tree_topk, rc.block_size - 1
        if self.k > runner.draft.config.vocab_size:
            raise ConfigError(f"tree top-k {self.k} exceeds the vocabulary ({runner.draft.config.vocab_size})")
        self.trees = {nb: Tree.empty(nb, self.N, runner.device) for nb in runner.buckets}  # verify graph inputs

    def prepare(self, plan: RoundPlan, buf: RoundBuffers) -> None:
        """The draft window rectangle (the draft block and the refeed read it; faults as the chain's)."""
        self.faults.build_window_rect(self.runner, buf, plan.packed_rect)

    def run_round(self, plan: RoundPlan) -> RoundResult:
        """Draft, build the tree, verify it, accept a path, commit it."""
        nb = plan.nb
        with annotate("draft"):
            drafted = self.runner.run_draft(nb)
        with annotate("tree"):
            self.build(nb, drafted)
        with annotate("verify"):
            pred, tgt_states = self.verify(nb)
        with annotate("commit"):  # accept + commit: one graph on CUDA
            emitted, tau = self.accept_commit(nb, pred, tgt_states)
        return RoundResult(emitted, tau)

    # ------------------------------------------------------------------------------------- graph bodies
    def _build_fn(self, nb: int, logp: torch.Tensor, ids: torch.Tensor):
        tree = self.trees[nb]
        return lambda: tree.copy_(build_tree_torch(logp[:, : self.D], ids[:, : self.D], self.N))

    def _verify_fn(self, nb: int):
        r = self.runner
        rows, tree = r.buffers[nb].rows, self.trees[nb]
        return lambda: tree_verify(r.target, r.state, rows, tree)

    def _commit_fn(self, nb: int, pred: torch.Tensor, tgt_states):
        return lambda: self._accept_commit(nb, pred, tgt_states)

    def _accept_commit(self, nb: int, pred: torch.Tensor, tgt_states):
        """Accept the verified path of every row of bucket nb and commit it; (emitted [nb, B], tau [nb])."""
        r, st = self.runner, self.runner.state
        buf = r.buffers[nb]
        emitted, tau, path = tree_accept(self.trees[nb], pred, self.rcfg.block_size)
        compact_kv(st, buf.rows, path)
        drf_states = draft_refeed(r.draft, st, buf.rows, buf.rect, buf.rect_len, emitted)
        last = path[:, -1]  # the last accepted node (path repeats it past tau)
        if self.faults.eager_commit_glue:
            eager_commit_glue(buf.rows, last + 1, [(st.tgt_lin, r.target, tgt_states)])
            eager_commit_glue(buf.rows, tau, [(st.drf_lin, r.draft, drf_states)])
        else:
            st.tgt_lin.commit_at(buf.rows, tgt_states, last)
            st.drf_lin.commit(buf.rows, drf_states, tau)
        commit_round(st, buf.rows, emitted, tau, None, None, linear=False)
        return emitted, tau

    def capture_bucket(self, nb: int, pool) -> None:
        """Capture bucket nb's graphs into ``runner.graphs``: rect and draft (the runner's), tree (gpu builder only),
        verify, and commit (not under the eager-commit-glue fault, whose glue must stay on the host); the tree
        build reads the draft graph's outputs (tokens, states, logp, ids). Capture order = replay order (one
        stream, one shared pool)."""
        draft_outputs = self.runner.capture_rect_draft(nb, pool).outputs
        g = self.runner.graphs
        if not self.faults.cpu_tree_build:
            g["tree", nb] = GraphedCall(f"tree_bs{nb}", self._build_fn(nb, draft_outputs[2], draft_outputs[3]), pool)
        v = g["verify", nb] = GraphedCall(f"verify_bs{nb}", self._verify_fn(nb), pool)
        if not self.faults.commit_on_host:
            g["commit", nb] = GraphedCall(f"commit_bs{nb}", self._commit_fn(nb, *v.outputs), pool)

    # ------------------------------------------------------------------------------------- phases
    def build(self, nb: int, drafted) -> None:
        """Fill bucket nb's tree from the draft block's top-k (``drafted`` = run_draft's 4-tuple)."""
        logp, ids = drafted[2], drafted[3]
        if self.faults.cpu_tree_build:
            cpu_tree_build(self.runner, self.trees[nb], logp[:, : self.D], ids[:, : self.D], self.N)
        else:
            with annotate("gpu_tree_build"):
                self.runner.replay_or_run("tree", nb, self._build_fn(nb, logp, ids))

    def verify(self, nb: int):
        """(pred [nb, N], target states per node)."""
        return self.runner.replay_or_run("verify", nb, self._verify_fn(nb))

    def accept_commit(self, nb: int, pred: torch.Tensor, tgt_states):
        """(emitted [nb, B], tau [nb]) after committing the accepted paths (graph replay, or eager)."""
        return self.runner.replay_or_run("commit", nb, self._commit_fn(nb, pred, tgt_states))
