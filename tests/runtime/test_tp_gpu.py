"""Tensor parallelism on two CUDA GPUs (``pytest -m gpu`` on a machine with two or more; skipped elsewhere): the
shipped tiny pair in float32, CUDA graphs with the NCCL all-reduces captured in the verify graph, NVLink multicast
off in the ranks; ``--tp 2`` against one process on the held-out prompts, under both schedulers and in tree mode.
A float32 split sum may flip a near-tie: a mismatch is reported with the first divergent request, position and the
one-process greedy reference's top-2 logit gap there (DESIGN.md "Tensor parallelism")."""
from __future__ import annotations

import json
import os

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = [{"scheduler": "sync"}, {"scheduler": "overlap"}, {"scheduler": "overlap", "tree_budget": 8}]


def test_tp2_on_two_gpus_emits_the_one_process_tokens():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs")
    from gaptrace.runtime.spec.reference import greedy_reference
    from gaptrace.runtime.tp import spawn_ranks

    from _tp_ranks import gpu_tiny_rank, tiny_decode

    with open(os.path.join(REPO, "fixtures", "prompts", "heldout.jsonl")) as f:
        texts = [json.loads(x)["prompt"] for x in f if x.strip()][:8]
    max_new = 64
    want = tiny_decode(CONFIGS, texts, max_new)
    got = spawn_ranks(gpu_tiny_rank, 2, "cuda", (CONFIGS, texts, max_new))
    for kw, g0, g1, w in zip(CONFIGS, got[0], got[1], want):
        assert g0["tokens"] == g1["tokens"], kw  # the ranks agree with each other by construction
        assert g0["graph_nodes"]["verify"], kw   # graphs were captured (with their all-reduces)
        if g0["tokens"] != w["tokens"]:
            from gaptrace.runtime.session import build_setup, encode_prompts
            setup = build_setup("tiny", device="cuda", dtype="float32")
            ids = encode_prompts(setup, texts, max_new)
            i = next(i for i, (a, b) in enumerate(zip(g0["tokens"], w["tokens"])) if a != b)
            pos = next(p for p, (a, b) in enumerate(zip(g0["tokens"][i], w["tokens"][i])) if a != b)
            ref = greedy_reference(setup.target, ids[i], max_new, setup.eos_token_id, setup.rcfg.prefill_chunk,
                                   "cuda")
            gap = ref.top2_gap[pos] if pos < len(ref.top2_gap) else None
            pytest.fail(f"{kw}: --tp 2 differs from one process at request {i}, token {pos} (one-process greedy "
                        f"top-2 logit gap there: {gap})")
        assert g0["round_tau"] == w["round_tau"] and g0["rounds"] == w["rounds"], kw
