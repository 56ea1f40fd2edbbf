"""The shipped tiny pair (fixtures/models): sizes, tokenizer, held-out prompts, and τ on the CPU.

τ is recomputed here by a deliberately simple greedy block-verify loop (one prompt at a time, no cache, plain
Python lists), independent of scripts/train_pair.py's batched evaluator and of the runtime's decoder.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
tokenizers = pytest.importorskip("tokenizers")

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / "fixtures" / "models"
PROMPTS = REPO / "fixtures" / "prompts" / "heldout.jsonl"
TARGET, DRAFT = MODELS / "tiny-target", MODELS / "tiny-draft"

have_weights = (TARGET / "model.safetensors").exists() and (DRAFT / "model.safetensors").exists()
needs_weights = pytest.mark.skipif(not have_weights, reason="tiny pair weights not shipped (scripts/train_pair.py)")


def _prompts() -> list[dict]:
    return [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()]


def _tokenizer():
    return tokenizers.Tokenizer.from_file(str(MODELS / "tokenizer.json"))


def test_tokenizer_round_trips_heldout_prompts():
    tok = _tokenizer()
    prompts = _prompts()
    assert len(prompts) >= 30
    assert tok.get_vocab_size() == 4096
    assert tok.token_to_id("<|endoftext|>") is not None
    for p in prompts:
        ids = tok.encode(p["prompt"]).ids
        assert 0 < len(ids) < len(p["prompt"])  # BPE compresses
        assert tok.decode(ids) == p["prompt"]


def test_prompts_come_from_heldout_files():
    # the split rule, restated here: sha256 of the stdlib-relative POSIX path, first 32 bits, mod 20 == 0
    for p in _prompts():
        digest = hashlib.sha256(p["source"].encode()).hexdigest()
        assert int(digest[:8], 16) % 20 == 0, p["source"]
        assert p["prompt"].count("\n") >= 4


@needs_weights
def test_sizes_within_limits():
    sizes = {d.name: sum(f.stat().st_size for f in d.iterdir()) for d in (TARGET, DRAFT)}
    assert sizes["tiny-target"] <= 30_000_000
    assert sizes["tiny-draft"] <= 5_000_000
    target_cfg = json.loads((TARGET / "config.json").read_text())
    assert "linear_attention" in json.dumps(target_cfg) and "full_attention" in json.dumps(target_cfg)


def _greedy_block_verify(target, draft, prompt: list[int], block_size: int, max_new_tokens: int):
    """(tokens, tau): speculative greedy decoding with full recomputation (the seed's accept rule, spelled out)."""
    seq = list(prompt)
    rounds = emitted = 0
    while len(seq) - len(prompt) < max_new_tokens:
        proposal = []
        for _ in range(block_size):
            logits = draft(torch.tensor([seq + proposal]))
            proposal.append(int(logits[0, -1].argmax()))
        logits = target(torch.tensor([seq + proposal]))[0]
        verified = logits[len(seq) - 1:].argmax(-1).tolist()  # target's token after each prefix, B + 1 of them
        n = 0
        while n < block_size and proposal[n] == verified[n]:
            n += 1
        seq += verified[: n + 1]  # accepted prefix (equal to the draft's) + the bonus token
        rounds += 1
        emitted += n + 1
    return seq[len(prompt):], emitted / rounds


@needs_weights
def test_speculative_tau_and_exactness_on_cpu():
    from gaptrace.runtime.models.checkpoint import load_checkpoint

    tok = _tokenizer()
    target = load_checkpoint(TARGET, "cpu", torch.float32).eval()
    draft = load_checkpoint(DRAFT, "cpu", torch.float32).eval()
    prompts = [tok.encode(p["prompt"]).ids for p in _prompts()[:3]]
    n_new = 48
    emitted_total = rounds_total = 0.0
    with torch.no_grad():
        for ids in prompts:
            out, tau = _greedy_block_verify(target, draft, ids, 8, n_new)
            # exactness: the same tokens as the target's own greedy decoding (float32, no ties expected)
            seq = list(ids)
            for _ in range(n_new):
                seq.append(int(target(torch.tensor([seq]))[0, -1].argmax()))
            assert out[:n_new] == seq[len(ids):]
            rounds = len(out) / tau
            emitted_total += len(out)
            rounds_total += rounds
    tau_all = emitted_total / rounds_total
    assert tau_all >= 2.0, tau_all
