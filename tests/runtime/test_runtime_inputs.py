"""Hostile runtime inputs for `gaptrace decode` / `gaptrace capture` (CPU): each one line on stderr, exit 2, and
nothing on stdout or on disk. Prompts that are not UTF-8 or not Unicode, empty and huge batches, checkpoints with
wrong shapes, dtypes, values or config types, a window smaller than a page."""
from __future__ import annotations

import json
import time

import pytest

torch = pytest.importorskip("torch")
from click.testing import CliRunner  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from gaptrace.cli import main  # noqa: E402
from gaptrace.runtime.config import ModelConfig, RuntimeConfig  # noqa: E402
from gaptrace.runtime.models.checkpoint import save_checkpoint  # noqa: E402
from gaptrace.runtime.models.model import Transformer  # noqa: E402
from gaptrace.runtime.session import check_memory  # noqa: E402
from gaptrace.runtime.spec.state import DecodeState  # noqa: E402

torch.set_num_threads(1)
CFG = dict(num_layers=4, num_heads=2, num_kv_heads=1, hidden_size=32, head_dim=16, vocab_size=300,
           intermediate_size=64, layer_types=["linear_attention"] * 3 + ["full_attention"], eos_token_id=299)
SMALL = ["--max-seq-len", "64", "--page-size", "8", "--window", "16", "--max-new-tokens", "4"]


def _run(cmd: str, *args: str):
    return CliRunner().invoke(main, [cmd, *args])


def _one_line(r, needle: str) -> str:
    assert r.exit_code == 2 and not isinstance(r.exception, (TypeError, AttributeError, ZeroDivisionError)), \
        (r.exception, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gaptrace: error: ") and needle in lines[0], r.stderr
    assert r.stdout == ""
    return lines[0]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = ModelConfig(**CFG)
    return Transformer(cfg).eval(), cfg


def _ckpt(model, d, edit=None, cfg_edit=None):
    m, cfg = model
    save_checkpoint(m, cfg, d)
    if edit is not None:
        t = load_file(str(d / "model.safetensors"))
        edit(t)
        save_file(t, str(d / "model.safetensors"))
    if cfg_edit is not None:
        c = json.loads((d / "config.json").read_text())
        c = cfg_edit(c) or c
        (d / "config.json").write_text(json.dumps(c))
    return str(d)


# ---------------------------------------------------------------------------------------------- prompts
@pytest.mark.parametrize("cmd", ["decode", "capture"])
def test_prompts_file_not_utf8(tmp_path, cmd):
    p = tmp_path / "p.jsonl"
    data = b'"fine"\n\n"caf\xe9 au lait"\n'  # Latin-1, line 3
    p.write_bytes(data)
    out = tmp_path / "out"
    out.mkdir()
    extra = ["-o", str(out / "t.json.gz")] if cmd == "capture" else []
    _one_line(_run(cmd, "--prompts", str(p), *extra), f"{p}:3: not UTF-8 text (byte 0xe9 at offset {data.index(0xE9)})")
    assert not list(out.iterdir())


@pytest.mark.parametrize("source", ["file", "argv"])
def test_prompt_with_a_lone_surrogate(tmp_path, source):
    """A JSON "\\ud800" escape, or argv bytes that are not UTF-8 (Python keeps them as surrogates): the tokenizer
    raised a TypeError."""
    if source == "file":
        p = tmp_path / "p.jsonl"
        p.write_text('"ok"\n"\\ud800 tail"\n')
        args = ["--prompts", str(p)]
    else:
        args = ["--prompt", "ok", "--prompt", b"caf\xe9".decode("utf-8", "surrogateescape")]
    _one_line(_run("decode", *args, *SMALL), "prompt 2: not valid Unicode text")


@pytest.mark.parametrize("cmd", ["decode", "capture"])
def test_empty_batch(tmp_path, cmd):
    extra = ["-o", str(tmp_path / "t.json.gz")] if cmd == "capture" else []
    _one_line(_run(cmd, "--prompt", "a", "--batch-size", "0", *extra), "batch size must be >= 1, got 0")
    p = tmp_path / "blank.jsonl"
    p.write_text("\n   \n")
    _one_line(_run(cmd, "--prompts", str(p), *extra), f"{p}: no prompts")
    assert [f.name for f in tmp_path.iterdir()] == ["blank.jsonl"]


@pytest.mark.parametrize("cmd", ["decode", "capture"])
def test_huge_batch_is_refused_before_allocating(tmp_path, cmd):
    extra = ["-o", str(tmp_path / "t.json.gz")] if cmd == "capture" else []
    t0 = time.perf_counter()
    line = _one_line(_run(cmd, "--prompt", "a", "--batch-size", str(10**6), *extra),
                     "batch size 1000000 x max_seq_len 2048: the KV cache and decode state need about")
    assert time.perf_counter() - t0 < 30  # a million slots would take minutes (and more memory than there is)
    assert "GB of host memory available" in line
    assert not list(tmp_path.iterdir())


def test_decode_state_size_estimate_covers_the_allocation(model):
    """DecodeState.nbytes against the bytes DecodeState.allocate really takes (summed tensor by tensor)."""
    _, cfg = model
    for bs, seq, page, window in [(1, 64, 8, 16), (3, 128, 16, 32), (8, 96, 8, 24)]:
        rcfg = RuntimeConfig(batch_size=bs, max_seq_len=seq, page_size=page, window=window, block_size=4)
        slots, max_pages = bs + 1, seq // page
        st = DecodeState.allocate(cfg, cfg, rcfg, slots * max_pages + 1, "cpu", torch.float32)
        tensors = [st.page_table, st.lengths, st.last_tok, *st.tgt_k, *st.tgt_v, *st.drf_k, *st.drf_v,
                   st.tgt_lin.pool, st.drf_lin.pool]
        allocated = sum(t.numel() * t.element_size() for t in tensors)
        est = DecodeState.nbytes(cfg, cfg, rcfg, 4)
        assert allocated <= est <= 3 * allocated, (bs, allocated, est)
        with pytest.raises(ValueError, match="over the 0.00 GB of host memory available"):
            check_memory(cfg, cfg, rcfg, available=allocated)  # the allocation alone already exceeds this


# ---------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize("cmd", ["decode", "capture"])
@pytest.mark.parametrize("args,needle", [
    (["--window", "8", "--page-size", "16"], "draft window W=8 must be a positive multiple of the page size P=16"),
    (["--page-size", "0"], "page size P must be >= 1, got 0"),  # was a ZeroDivisionError
])
def test_window_smaller_than_a_page(tmp_path, cmd, args, needle):
    extra = ["-o", str(tmp_path / "t.json.gz")] if cmd == "capture" else []
    _one_line(_run(cmd, "--prompt", "a", *args, *extra), needle)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("cmd", ["decode", "capture"])
def test_graph_buckets_option(tmp_path, cmd):
    """--graph-buckets: max | pow2 reach the config (and decode's JSON); anything else is one line, exit 2; the
    config refuses a bad value itself (RuntimeConfig used from Python)."""
    extra = ["-o", str(tmp_path / "t.json.gz")] if cmd == "capture" else []
    r = _run(cmd, "--prompt", "a", "--graph-buckets", "all", *extra)
    assert r.exit_code == 2 and "'--graph-buckets'" in r.stderr and "'max', 'pow2'" in r.stderr
    assert not list(tmp_path.iterdir())
    from gaptrace.runtime.config import ConfigError

    with pytest.raises(ConfigError, match="unknown graph buckets 'all' \\(max \\| pow2\\)"):
        RuntimeConfig(graph_buckets="all")
    assert RuntimeConfig().graph_bucket_mode == "max" and RuntimeConfig(graph_buckets="pow2").graph_bucket_mode == "pow2"
    r = _run(cmd, "--prompt", "a", "--graph-buckets", "max", "--fault", "jit-new-shape", *extra)
    _one_line(r, "fault 'jit-new-shape' (a round in a new batch bucket) needs --graph-buckets pow2, not max")
    from gaptrace.runtime.engine.graphs import batch_buckets

    with pytest.raises(ValueError, match="unknown graph buckets 'bogus'"):  # a mode set after construction
        batch_buckets(8, "bogus")


def test_decode_json_names_the_graph_buckets():
    r = _run("decode", "--prompt", "a", *SMALL, "--graph-buckets", "pow2", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["graph_buckets"] == "pow2"


# ---------------------------------------------------------------------------------------------- checkpoints
def _set(name, fn):
    return lambda t: t.__setitem__(name, fn(t[name]))


@pytest.mark.parametrize("edit,needle", [
    (_set("model.norm.weight", lambda w: w.to(torch.int8)), "tensor model.norm.weight has dtype int8, expected a "
                                                            "floating-point dtype"),
    (_set("model.layers.0.linear_attn.A_log", lambda w: w > 0), "tensor model.layers.0.linear_attn.A_log has dtype "
                                                                "bool"),
    (_set("model.embed_tokens.weight", lambda w: w[:, :31].contiguous()),
     "tensor model.embed_tokens.weight has shape [300, 31], expected [300, 32]"),
])
def test_checkpoint_with_wrong_dtype_or_shape(model, tmp_path, edit, needle):
    d = _ckpt(model, tmp_path / "m", edit=edit)
    _one_line(_run("decode", "--model-dir", d, "--prompt", "hi", *SMALL), f"{d}: {needle}")


def test_checkpoint_with_non_finite_weights(model, tmp_path):
    def poison(t):
        w = t["model.layers.3.self_attn.q_proj.weight"].clone()
        w.view(-1)[::7] = float("nan")
        w.view(-1)[1] = float("-inf")
        t["model.layers.3.self_attn.q_proj.weight"] = w

    expect = sum(1 for i in range(32 * 32) if i % 7 == 0 or i == 1)  # q_proj is [2 heads x 16, 32]
    d = _ckpt(model, tmp_path / "m", edit=poison)
    _one_line(_run("decode", "--model-dir", d, "--prompt", "hi", *SMALL),
              f"tensor model.layers.3.self_attn.q_proj.weight holds {expect} NaN or infinite values")


def test_float64_checkpoint_still_decodes(model, tmp_path):
    d = _ckpt(model, tmp_path / "m", edit=lambda t: t.update({k: v.double() for k, v in t.items()}))
    r = _run("decode", "--model-dir", d, "--prompt", "hi", *SMALL, "--json")
    assert r.exit_code == 0, r.stderr
    assert len(json.loads(r.stdout)["requests"][0]["tokens"]) >= 1


@pytest.mark.parametrize("cfg_edit,needle", [
    (lambda c: c.update(hidden_size="big"), "hidden_size must be an integer, got 'big'"),
    (lambda c: c.update(num_hidden_layers=[4]), "num_hidden_layers must be an integer, got [4]"),
    (lambda c: c.update(num_attention_heads=True), "num_attention_heads must be an integer, got True"),
    (lambda c: c.update(rms_norm_eps=None), "rms_norm_eps must be a finite number >= 0, got None"),
    (lambda c: c.update(tie_word_embeddings="yes"), "tie_word_embeddings must be true or false, got 'yes'"),
    (lambda c: [c], "not a JSON object"),
])
def test_checkpoint_config_of_the_wrong_types(model, tmp_path, cfg_edit, needle):
    d = _ckpt(model, tmp_path / "m", cfg_edit=cfg_edit)
    _one_line(_run("decode", "--model-dir", d, "--prompt", "hi", *SMALL), f"{d}/config.json: {needle}")


def test_decode_prints_text_with_its_controls_escaped():
    """Prompt and generated text are printed with BEL, CR, ESC as escapes (model output is untrusted on a terminal);
    line breaks stay."""
    r = _run("decode", "--preset", "tiny", "--prompt", "bell\x07cr\rtab\tesc\x1b[31m", "--max-new-tokens", "2")
    assert r.exit_code == 0, r.output
    out = r.stdout if hasattr(r, "stdout") else r.output
    assert "bell\\x07cr\\rtab\tesc\\x1b[31m" in out and "\x07" not in out and "\x1b" not in out
