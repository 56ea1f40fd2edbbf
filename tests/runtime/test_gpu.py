"""The runtime on a CUDA GPU (``pytest -m gpu`` on the GPU machine; skipped where torch sees no CUDA device).

- exactness with CUDA graphs: the tiny preset (the shipped pair) in float32 with the reference gated-delta-rule
  recurrence everywhere, held-out prompts, batch 8, B = 8: sync = overlap = plain greedy decoding, token for token,
  and sync = overlap round for round (accept lengths);
- fla's chunked gated delta rule (bf16 inputs, float32 state) against the reference recurrence, where fla is
  installed;
- the two draft-tree builders build the same trees on the device (tests/_tree_builders.py).

The fused kernels compiled on the GPU are tests/runtime/test_fused_kernels.py::test_fused_kernels_match_references_on_gpu
(also marked gpu).
"""
from __future__ import annotations

import json
import os

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPTS = os.path.join(REPO, "fixtures", "prompts", "heldout.jsonl")


def _heldout(n: int) -> list[str]:
    with open(PROMPTS) as f:
        return [json.loads(x)["prompt"] for x in f if x.strip()][:n]


def test_speculative_decoding_is_exact_with_cuda_graphs():
    """float32, reference recurrence (fla off): both schedulers emit the target's greedy tokens exactly."""
    from gaptrace.runtime.engine import Engine
    from gaptrace.runtime.models import gdn
    from gaptrace.runtime.engine.scheduler import make_scheduler
    from gaptrace.runtime.session import build_setup, encode_prompts
    from gaptrace.runtime.spec.reference import greedy_reference

    max_new = 64
    saved = gdn._fla_chunk
    gdn._fla_chunk = None
    try:
        setup = build_setup("tiny", device="cuda", dtype="float32", batch_size=8, block_size=8)
        ids = encode_prompts(setup, _heldout(16), max_new)
        engine = Engine(setup.target, setup.draft, setup.rcfg, setup.eos_token_id)
        runs = {}
        for sched in ("sync", "overlap"):
            engine.scheduler = make_scheduler(sched, engine.runner)
            reqs, stats = engine.generate(ids, max_new)
            runs[sched] = ([r.output for r in reqs], stats.round_tau)
        refs = [greedy_reference(setup.target, p, max_new, setup.eos_token_id, setup.rcfg.prefill_chunk, "cuda",
                                 setup.rcfg.fused_kernels).tokens for p in ids]
    finally:
        gdn._fla_chunk = saved
    assert runs["sync"] == runs["overlap"]
    for i, (out, ref) in enumerate(zip(runs["overlap"][0], refs)):
        assert out == ref, f"request {i}: first divergence at token " \
                           f"{next((j for j, (a, b) in enumerate(zip(out, ref)) if a != b), min(len(out), len(ref)))}"


def test_fla_gated_delta_rule_matches_the_reference():
    """fla's chunk kernel with bf16 q, k, v against the float32 per-token recurrence, on a long (T = 1000) and a
    ragged (T = 37) sequence: no NaN, relative L2 error of the output and the final state below 3e-2 (bf16 keeps
    8 mantissa bits: 2^-8 = 0.4% per input element; the recurrence accumulates in float32)."""
    from gaptrace.runtime.models.gdn import fla_available, gated_delta_rule_fla, gated_delta_rule_ref

    if not fla_available():
        pytest.skip("fla (flash-linear-attention) not installed")
    g = torch.Generator(device="cuda").manual_seed(0)
    for T in (1000, 37):
        bs, H, dk, dv = 2, 4, 64, 64
        r = lambda *s: torch.randn(*s, device="cuda", generator=g)  # noqa: E731
        q = torch.nn.functional.normalize(r(bs, T, H, dk), dim=-1)
        k = torch.nn.functional.normalize(r(bs, T, H, dk), dim=-1)
        v, beta = r(bs, T, H, dv), torch.sigmoid(r(bs, T, H))
        gate = -torch.nn.functional.softplus(r(bs, T, H)) * 0.5
        s0 = r(bs, H, dk, dv) * 0.1
        o_ref, s_ref = gated_delta_rule_ref(q, k, v, gate, beta, s0)
        o_f, s_f = gated_delta_rule_fla(q.bfloat16(), k.bfloat16(), v.bfloat16(), gate, beta, s0)
        assert not o_f.isnan().any()
        for got, ref in ((o_f, o_ref), (s_f, s_ref)):
            rel = float((got.float() - ref.float()).norm() / ref.float().norm())
            assert rel < 3e-2, (T, rel)


def test_tree_builders_agree_on_the_device():
    """build_tree_torch on CUDA against build_tree_heapq on the host: 300 random batches, half with exact ties."""
    from _tree_builders import check_builders

    compared, differ = check_builders("cuda", 300)
    assert compared > 600 and differ == 0
