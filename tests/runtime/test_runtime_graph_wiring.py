"""The CUDA-graph wiring of a round (rect, draft, verify, accept + commit), checked on the CPU: GraphedCall is swapped
for a replay emulation with a graph's semantics (the outputs captured are the tensors every replay overwrites, and a
replay re-reads the static inputs it closed over), so a graph wired to the wrong tensor, or a phase that the graph
path skips, changes the tokens. Decoding with the emulated graphs must equal eager decoding token for token and
round for round. The GPU run of the real graphs is tests/runtime/test_gpu.py (``pytest -m gpu``)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import gaptrace.runtime.engine.model_runner as model_runner  # noqa: E402
import gaptrace.runtime.engine.rounds as rounds  # noqa: E402
import gaptrace.runtime.engine.tree_round as tree  # noqa: E402
from gaptrace.runtime.config import RuntimeConfig  # noqa: E402
from gaptrace.runtime.engine import Engine  # noqa: E402
from gaptrace.runtime.engine import PlainEngine  # noqa: E402

from _runtime_models import hybrid_target, near_copy, random_prompts  # noqa: E402

torch.set_num_threads(1)
LENGTHS = (5, 23, 40, 1, 31, 17, 9)


def _copy_into(static, fresh) -> None:
    if isinstance(static, torch.Tensor):
        static.copy_(fresh)
    elif isinstance(static, (tuple, list)):
        for s, f in zip(static, fresh):
            _copy_into(s, f)


class ReplayEmulation:
    """GraphedCall's interface; capture = one call whose outputs are kept, replay = a call copied into them."""

    def __init__(self, name, fn, pool, warmup: int = 2):
        self.name, self.fn, self.num_nodes, self.replays = name, fn, 1, 0
        self.outputs = fn()
        self.last_launch_us = float("nan")

    def __call__(self):
        _copy_into(self.outputs, self.fn())
        self.replays += 1
        return self.outputs


@pytest.fixture(scope="module")
def pair():
    target = hybrid_target()
    return target, near_copy(target, 0.3), random_prompts(LENGTHS)


def _decode(pair, graphs: bool, engine_cls=Engine, **kw):
    target, draft, prompts = pair
    rc = RuntimeConfig(**{"block_size": 4, "page_size": 4, "window": 16, "batch_size": 3, "max_seq_len": 128,
                          "prefill_chunk": 16, **kw})
    with pytest.MonkeyPatch.context() as mp:
        for mod in (model_runner, rounds, tree):
            mp.setattr(mod, "GraphedCall", ReplayEmulation)
        mp.setattr(torch.cuda, "graph_pool_handle", lambda: None)
        mp.setattr(torch.cuda, "synchronize", lambda *a: None)
        eng = engine_cls(target, draft, rc) if engine_cls is Engine else engine_cls(target, rc, draft=draft)
        if graphs:
            eng.capture_graphs()
        reqs, stats = eng.generate(prompts, 30)
    return [r.output for r in reqs], stats.round_tau, eng.runner.graphs


CASES = {
    "overlap": {},
    "sync": {"scheduler": "sync"},
    "simulated": {"sim_accept_rate": 0.6},
    "glue": {"faults": ("eager-commit-glue",)},
    "tree": {"tree_budget": 6, "tree_topk": 2},
}


@pytest.mark.parametrize("case", CASES)
def test_graphed_round_equals_eager(pair, case):
    eager_tokens, eager_tau, none = _decode(pair, False, **CASES[case])
    tokens, tau, graphs = _decode(pair, True, **CASES[case])
    assert not none and tokens == eager_tokens and tau == eager_tau
    phases = {p for p, _ in graphs}
    replays = {p: sum(g.replays for (q, _), g in graphs.items() if q == p) for p in phases}
    assert {"rect", "draft", "verify"} <= phases
    # every planned round replays the rectangle (overlap), the draft and the verify; the sync scheduler's packed
    # rectangle stays eager (its host syncs cannot be captured)
    assert replays["draft"] == replays["verify"] == len(tau) and replays["rect"] == (0 if case == "sync" else len(tau))
    if case == "tree":
        assert replays["commit"] == len(tau)
    else:  # accept + commit ride in the verify graph, or (the fault's glue: host work by definition) stay eager
        assert "commit" not in phases
        assert all(len(g.outputs) == (2 if case == "glue" else 3) for (p, _), g in graphs.items() if p == "verify")
    # one batch bucket by default: the process holds three graphs (the tree adds its build and commit)
    assert {nb for _, nb in graphs} == {3}


def test_plain_graphs_commit(pair):
    eager_tokens, eager_tau, _ = _decode(pair, False, PlainEngine)
    tokens, tau, graphs = _decode(pair, True, PlainEngine)
    assert tokens == eager_tokens and tau == eager_tau
    assert {p for p, _ in graphs} == {"verify"} and {nb for _, nb in graphs} == {3}  # accept + commit inside
    assert all(g.replays > 0 for g in graphs.values())


def test_pow2_buckets_pad_each_round_to_the_smallest_holding_it(pair):
    """graph_buckets="pow2" keeps the per-power-of-two graphs: batch size 3 gets the buckets 1, 2 and 3, and as
    requests retire the rounds move to the smaller ones (2 rows: the 2-bucket; 1 row: the 1-bucket); tokens equal
    eager decoding."""
    eager_tokens, eager_tau, _ = _decode(pair, False, graph_buckets="pow2")
    tokens, tau, graphs = _decode(pair, True, graph_buckets="pow2")
    assert tokens == eager_tokens and tau == eager_tau
    assert {nb for _, nb in graphs} == {1, 2, 3}
    assert sum(g.replays for (p, nb), g in graphs.items() if p == "verify" and nb < 3) > 0
