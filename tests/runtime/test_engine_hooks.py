"""The engine's hook API (runtime/engine/engine.py EngineHooks) and the parsed faults (runtime/faults.py Faults):
what an observer sees equals what generate returns, and one switch exists per fault, named like its function."""
from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gaptrace.runtime import faults as F  # noqa: E402
from gaptrace.runtime.config import FAULT_NAMES, ConfigError, RuntimeConfig  # noqa: E402
from gaptrace.runtime.engine import Engine, EngineHooks  # noqa: E402

from _runtime_models import hybrid_target, near_copy, random_prompts  # noqa: E402

torch.set_num_threads(1)
LENGTHS = (5, 23, 40, 1, 31)


class Recorder(EngineHooks):
    def __init__(self):
        self.events, self.reads, self.prefills, self.tokens, self.launch = [], [], [], 0, []

    def on_prefill(self, request):
        self.prefills.append((request.rid, request.slot))

    def on_round(self, event):
        self.events.append((event.index, sorted(event.running)))
        self.launch.append(event.graph_launch_us())

    def on_round_read(self, index, taus):
        self.reads.append((index, list(taus)))

    def on_tokens(self, n):
        self.tokens += n


def test_hooks_see_what_generate_returns():
    target = hybrid_target()
    draft = near_copy(target, 0.3)
    rc = RuntimeConfig(block_size=4, page_size=4, window=16, batch_size=2, max_seq_len=128, prefill_chunk=16)
    rec = Recorder()
    reqs, stats = Engine(target, draft, rc).generate(random_prompts(LENGTHS), 12, hooks=rec)
    assert [i for i, _ in rec.events] == list(range(1, stats.rounds + 1))
    assert [t for _, t in rec.reads] == stats.round_tau  # every round read once, in order, one round late
    assert [i for i, _ in rec.reads] == list(range(1, stats.rounds + 1))
    assert sorted(rid for rid, _ in rec.prefills) == list(range(len(LENGTHS)))  # 5 prompts through 2 slots
    assert {slot for _, slot in rec.prefills} == {0, 1}
    assert rec.tokens == stats.tokens == sum(len(r.output) for r in reqs)
    assert all(len(s) <= 2 for _, s in rec.events) and rec.events[0][1] == [0, 1]
    assert rec.launch == [{}] * stats.rounds  # no CUDA graphs on the CPU: no launch cost to report


def test_faults_parsed_once_one_switch_each():
    assert F.Faults.from_names([]) == F.Faults()
    every = F.Faults.from_names(FAULT_NAMES)
    assert every.names == FAULT_NAMES and all(getattr(every, F.function_name(n)) for n in FAULT_NAMES)
    for n in FAULT_NAMES:  # each switch names the one function (and NVTX range) of its fault
        one = F.Faults.from_names([n, n])
        assert one.names == (n,) and callable(getattr(F, F.function_name(n)))
    assert F.Faults.from_names(["eager-commit-glue"]).commit_on_host and not F.Faults().commit_on_host
    with pytest.raises(ConfigError, match="unknown fault 'nope'"):
        F.Faults.from_names(["nope"])
    # the tree builder's two spellings are one switch
    rc = RuntimeConfig(tree_budget=4, tree_builder="cpu-heapq")
    assert F.Faults.from_names(rc.faults).cpu_tree_build and rc.cpu_tree_build
