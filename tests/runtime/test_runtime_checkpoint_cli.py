"""HF checkpoint directories (round trip, clear errors) and the ``gaptrace decode`` command (JSON schema,
exactness flag, bad input -> one line on stderr and exit code 2)."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
from click.testing import CliRunner  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from gaptrace.cli import main  # noqa: E402
from gaptrace.runtime.config import ModelConfig  # noqa: E402
from gaptrace.runtime.models.checkpoint import CheckpointError, load_checkpoint, save_checkpoint  # noqa: E402
from gaptrace.runtime.models.model import Transformer  # noqa: E402

torch.set_num_threads(1)
CFG = dict(num_layers=4, num_heads=2, num_kv_heads=1, hidden_size=32, head_dim=16, vocab_size=300,
           intermediate_size=64, layer_types=["linear_attention", "linear_attention", "linear_attention",
                                              "full_attention"], eos_token_id=299)


@pytest.fixture()
def ckpt(tmp_path):
    torch.manual_seed(0)
    cfg = ModelConfig(**CFG)
    m = Transformer(cfg).eval()
    save_checkpoint(m, cfg, tmp_path / "m")
    return m, cfg, tmp_path / "m"


def test_round_trip(ckpt):
    m, cfg, d = ckpt
    names = set(load_file(str(d / "model.safetensors")))
    assert "model.layers.3.self_attn.q_proj.weight" in names and "model.layers.0.linear_attn.A_log" in names
    assert "lm_head.weight" not in names  # tied
    m2 = load_checkpoint(d, "cpu", torch.float32)
    assert m2.config == cfg
    x = torch.randint(0, 300, (2, 9))
    with torch.no_grad():
        assert torch.equal(m(x), m2(x))
    assert load_checkpoint(d, "cpu", torch.bfloat16).model.embed_tokens.weight.dtype == torch.bfloat16


def _rewrite(d, fn):
    t = load_file(str(d / "model.safetensors"))
    fn(t)
    save_file(t, str(d / "model.safetensors"))


@pytest.mark.parametrize("edit,expect", [
    (lambda t: t.pop("model.layers.1.linear_attn.out_proj.weight"), "missing tensor model.layers.1.linear_attn.out_proj"),
    (lambda t: t.__setitem__("model.norm.weight", torch.ones(7)), "model.norm.weight has shape [7], expected [32]"),
    (lambda t: t.__setitem__("model.layers.9.mlp.up_proj.weight", torch.ones(2)), "unexpected tensor model.layers.9"),
])
def test_bad_tensors(ckpt, edit, expect):
    _, _, d = ckpt
    _rewrite(d, edit)
    with pytest.raises(CheckpointError, match=expect.replace("[", r"\[").replace("]", r"\]")):
        load_checkpoint(d)


def test_missing_dir_and_config(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "nope")
    (tmp_path / "x").mkdir()
    with pytest.raises(CheckpointError, match="no config.json"):
        load_checkpoint(tmp_path / "x")


def test_llama_style_config(tmp_path):
    """A Llama config.json (no head_dim, no qk norm, untied head) loads and keeps HF names."""
    torch.manual_seed(0)
    cfg = ModelConfig(num_layers=2, num_heads=4, num_kv_heads=2, hidden_size=64, head_dim=16, vocab_size=50,
                      intermediate_size=96, qk_norm=False, tie_word_embeddings=False)
    m = Transformer(cfg)
    save_checkpoint(m, cfg, tmp_path)
    hf = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
          "num_hidden_layers": 2, "intermediate_size": 96, "vocab_size": 50, "tie_word_embeddings": False,
          "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "eos_token_id": [3, 4]}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    m2 = load_checkpoint(tmp_path)
    assert m2.config.head_dim == 16 and not m2.config.qk_norm and m2.config.eos_token_id == 3
    assert "lm_head.weight" in m2.state_dict()


# ------------------------------------------------------------------------------------------------ the CLI
def _decode(*args):
    return CliRunner().invoke(main, ["decode", *args])


def test_decode_json_schema_and_exactness():
    r = _decode("--preset", "tiny", "--prompt", "def add(a, b):", "--prompt", "import os\n", "--max-new-tokens",
                "6", "--batch-size", "2", "--block-size", "4", "--max-seq-len", "256", "--json", "--check-exact")
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    assert {"requests", "tau", "rounds", "tokens_per_s", "tpot_ms"} <= set(out)
    assert len(out["requests"]) == 2
    for req in out["requests"]:
        assert {"prompt", "text", "tokens", "exact"} <= set(req)
        assert req["exact"] is True and 1 <= len(req["tokens"]) <= 6 and isinstance(req["text"], str)
    assert out["rounds"] >= 1 and 1.0 <= out["tau"] <= 4 and out["tokens_per_s"] > 0 and out["tpot_ms"] > 0
    assert out["simulated_acceptance"] is None and out["exact_match_rate"] == 1.0
    assert out["requests"][0]["prompt"] == "def add(a, b):"


@pytest.mark.parametrize("args,needle", [
    (["--prompt", ""], "empty prompt"),
    (["--prompt", " ".join(map(str, range(400))), "--max-seq-len", "256"], "exceeds the context of 256"),
    (["--preset", "huge", "--prompt", "a"], "unknown preset 'huge'"),
    (["--prompt", "a", "--block-size", "0"], "block size B must be >= 1"),
    (["--prompt", "a", "--window", "30", "--page-size", "16"], "multiple of the page size"),
    (["--prompt", "a", "--scheduler", "fast"], "unknown scheduler"),
    (["--prompts", "/nonexistent/p.jsonl"], "prompts file not found"),
])
def test_decode_bad_input(args, needle):
    r = _decode(*args)
    assert r.exit_code == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gaptrace: error:") and needle in lines[0], r.stderr


def test_decode_checkpoint_missing_tensor(ckpt):
    _, _, d = ckpt
    _rewrite(d, lambda t: t.pop("model.layers.3.self_attn.k_proj.weight"))
    r = _decode("--model-dir", str(d), "--prompt", "hi")
    assert r.exit_code == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "missing tensor model.layers.3.self_attn.k_proj.weight" in lines[0]


def test_decode_user_checkpoint_text(ckpt, tmp_path):
    _, _, d = ckpt
    p = tmp_path / "p.jsonl"
    p.write_text(json.dumps({"prompt": "hello"}) + "\n" + json.dumps("abc") + "\n")
    r = _decode("--model-dir", str(d), "--prompts", str(p), "--max-new-tokens", "5", "--max-seq-len", "64",
                "--page-size", "8", "--window", "16", "--check-exact", "--json")
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    assert [q["prompt"] for q in out["requests"]] == ["hello", "abc"]
    assert all(q["exact"] for q in out["requests"]) and "the target as its own draft" in out["weights"]
