"""The exactness gate (DESIGN.md "Block-speculative decoding"): at temperature 0, block-speculative decoding emits
exactly the target's plain greedy tokens, in float32 on the CPU, for both schedulers x batch sizes {1, 3, 8} x
block sizes {1, 4, 12}, with a draft window W shorter than the sequences (several pages), prompts of many lengths
(chunked prefill), more prompts than slots (admission into freed slots) and an EOS that stops one request early.
sync and overlap must also agree with each other bit for bit, round by round."""
from __future__ import annotations


import pytest

torch = pytest.importorskip("torch")

from gaptrace.runtime.config import ModelConfig, RuntimeConfig  # noqa: E402
from gaptrace.runtime.engine import Engine  # noqa: E402
from gaptrace.runtime.models.model import Transformer  # noqa: E402

from _runtime_models import greedy_setup, near_copy  # noqa: E402

torch.set_num_threads(1)
MAX_NEW, W, P, CHUNK = 28, 16, 4, 16
LENGTHS = (5, 23, 40, 1, 31, 17, 9, 44, 12)


_near_copy = near_copy  # a hybrid draft: exercises the draft's own linear-state commit


@pytest.fixture(scope="module")
def setup():
    # the first request stops at its 11th token (or earlier if eos came sooner)
    target, prompts, eos, refs = greedy_setup(LENGTHS, MAX_NEW, CHUNK, eos_at=10)
    assert any(len(r) < MAX_NEW for r in refs) and any(len(r) == MAX_NEW for r in refs)
    return target, _near_copy(target, 0.3), prompts, refs, eos


def _run(target, draft, prompts, eos, scheduler, bs, B):
    rc = RuntimeConfig(block_size=B, page_size=P, window=W, batch_size=bs, max_seq_len=128, prefill_chunk=CHUNK,
                       scheduler=scheduler)
    return Engine(target, draft, rc, eos).generate(prompts, MAX_NEW)


@pytest.mark.parametrize("B", [1, 4, 12])
@pytest.mark.parametrize("bs", [1, 3, 8])
def test_sync_equals_overlap_equals_greedy(setup, bs, B):
    target, draft, prompts, refs, eos = setup
    outs = {}
    for sched in ("sync", "overlap"):
        reqs, stats = _run(target, draft, prompts, eos, sched, bs, B)
        for r, ref in zip(reqs, refs):
            assert r.output == ref, (sched, r.rid)
        outs[sched] = ([r.output for r in reqs], stats.round_tau, stats.rounds)
        assert 1.0 <= stats.tau <= B
        if B > 1:
            assert stats.tau > 1.2  # the near-copy draft gets tokens accepted: the multi-token path ran
    assert outs["sync"] == outs["overlap"]  # tokens, per-round accept lengths and round count


def test_window_shorter_than_sequences(setup):
    _, _, prompts, refs, _ = setup
    assert max(len(p) + len(r) for p, r in zip(prompts, refs)) > 3 * W  # the window slides over several pages


@pytest.mark.parametrize("scheduler", ["sync", "overlap"])
def test_unrelated_draft_is_still_exact(setup, scheduler):
    """A random full-attention draft of another shape (accepts by chance only): output still exact."""
    target, _, prompts, refs, eos = setup
    torch.manual_seed(3)
    draft = Transformer(ModelConfig(num_layers=2, num_heads=2, num_kv_heads=1, hidden_size=32, head_dim=16,
                                    vocab_size=128, intermediate_size=64)).eval()
    reqs, _ = _run(target, draft, prompts[:5], eos, scheduler, 3, 8)
    assert [r.output for r in reqs] == refs[:5]
