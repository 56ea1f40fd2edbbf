"""The runtime's plain greedy decoding (PlainRound, runtime/engine/rounds.py: the floor of the runtime benchmark)
emits exactly the target's greedy tokens of the independent reference (contiguous cache, one request at a time), in
float32 on the CPU: hybrid target, several pages, chunked prefill, more prompts than slots, an EOS that stops a
request early."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gaptrace.runtime.config import ModelConfig, RuntimeConfig  # noqa: E402
from gaptrace.runtime.models.model import Transformer  # noqa: E402
from gaptrace.runtime.engine import PlainEngine  # noqa: E402

from _runtime_models import greedy_setup  # noqa: E402

torch.set_num_threads(1)
MAX_NEW, P, CHUNK = 24, 4, 16
LENGTHS = (5, 23, 40, 1, 17)


@pytest.fixture(scope="module")
def setup():
    target, prompts, eos, refs = greedy_setup(LENGTHS, MAX_NEW, CHUNK, eos_at=7)
    assert any(len(r) < MAX_NEW for r in refs) and any(len(r) == MAX_NEW for r in refs)
    return target, prompts, refs, eos


@pytest.mark.parametrize("scheduler,bs", [("overlap", 1), ("overlap", 3), ("sync", 2)])
def test_plain_equals_greedy_reference(setup, scheduler, bs):
    target, prompts, refs, eos = setup
    rc = RuntimeConfig(block_size=8, page_size=P, window=16, batch_size=bs, max_seq_len=96, prefill_chunk=CHUNK,
                       scheduler=scheduler)
    engine = PlainEngine(target, rc, eos)
    assert engine.rcfg.block_size == 1 and engine.runner.graphs == {}
    reqs, stats = engine.generate(prompts, MAX_NEW)
    assert [r.output for r in reqs] == refs
    # one token per live request-round: τ = 1 exactly, and rounds >= the longest output
    assert stats.tau == 1.0 and all(t == 1 for taus in stats.round_tau for t in taus)
    assert stats.tokens == sum(len(r) for r in refs) and stats.rounds >= max(len(r) for r in refs)


def test_plain_with_a_separate_draft_for_prefill(setup):
    """A draft given to PlainEngine only fills its cache at prefill; the tokens stay the target's."""
    target, prompts, refs, eos = setup
    torch.manual_seed(3)
    draft = Transformer(ModelConfig(num_layers=1, num_heads=2, num_kv_heads=1, hidden_size=32, head_dim=16,
                                    vocab_size=128, intermediate_size=64)).eval()
    rc = RuntimeConfig(page_size=P, window=16, batch_size=2, max_seq_len=96, prefill_chunk=CHUNK)
    reqs, _ = PlainEngine(target, rc, eos, draft=draft).generate(prompts[:3], MAX_NEW)
    assert [r.output for r in reqs] == refs[:3]
