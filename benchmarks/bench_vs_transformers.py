"""The runtime against Hugging Face transformers on the same weights: tokens/s and token agreement.

The pair is the plain-attention tiny pair (``scripts/train_pair.py --plain-attention`` writes
fixtures/models/tiny-target-plain and tiny-draft-plain): every layer full attention, so transformers loads both as
standard Qwen3 checkpoints (``AutoModelForCausalLM``) and accepts the draft as ``assistant_model`` (it refuses
assisted generation for stateful models such as the gated-delta-rule hybrid). Both sides load the same
safetensors files in the same ``--dtype``; the first check is that their logits agree on a prompt.

Methods, all greedy, the same ``--max-new-tokens`` and EOS, on the same prompts (fixtures/prompts/heldout.jsonl,
token ids from the runtime's tokenizer, fed to both sides):

- ``hf_assisted_bs1``: ``model.generate(ids, assistant_model=draft, do_sample=False)`` one prompt at a time
  (assisted generation takes batch size 1 only), with transformers' own assisted-generation defaults unless
  ``--hf-assistant-tokens`` is given;
- ``hf_plain_bs1`` (the token reference; hf_assisted_bs1 without it) and ``hf_plain_bsN``: plain ``generate``, one prompt at a time and in
  left-padded batches of ``--hf-batch-size``;
- ``runtime_bs1_B{B}`` / ``runtime_bs8_B{B}``: this runtime's block-speculative decoding (overlap scheduler, CUDA
  graphs on the GPU) of all prompts with batch size 1 and 8 (requests admitted as slots free), each request slot
  sized to ``--max-seq-len`` tokens of context (the runtime's attention reads that fixed width under its graphs).

Timing: wall clock of the whole prompt set per method, prefill included, after one short warm-up call of the same
kind, with a device synchronisation before and after (not inside). tokens/s = tokens generated / that time.
Token check: each method's tokens per prompt against ``hf_plain_bs1``; a mismatch is reported with the position of
the first differing token and the reference's top-2 logit gap there (a near-tie resolved differently by another
kernel's rounding, rather than a bug, has a gap near 0). Results go to ``--out``/``--name``.json and .md after every
method; the tables are printed.

    python benchmarks/bench_vs_transformers.py --device cuda
    python benchmarks/bench_vs_transformers.py --target-dir T --draft-dir D --device cpu --max-prompts 2 \\
        --max-new-tokens 8 --runtime-batch-sizes 1,2 --hf-batch-size 2       # CPU smoke run
"""
from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from _results import fmt, machine, md_table, write_results  # noqa: E402

MODELS = os.path.join(REPO, "fixtures", "models")


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def trim(tokens: list[int], eos: int | None) -> list[int]:
    """Tokens up to and including the first EOS (what the runtime emits)."""
    if eos is not None and eos in tokens:
        return tokens[: tokens.index(eos) + 1]
    return tokens


def hf_generate(model, prompts: list[list[int]], batch_size: int, max_new: int, eos, device: str,
                assistant=None, assistant_tokens: int | None = None, seconds: float | None = None) -> list[list[int]]:
    """Greedy ``generate`` over ``prompts`` in left-padded batches of ``batch_size`` (pad = EOS); the new tokens of
    each prompt, cut after the first EOS. With ``seconds``, no batch starts after that many seconds: the first
    prompts only (at least one batch)."""
    import torch

    out = []
    pad = eos if eos is not None else 0
    t0 = time.perf_counter()
    for i in range(0, len(prompts), batch_size):
        if seconds is not None and out and time.perf_counter() - t0 > seconds:
            break
        chunk = prompts[i:i + batch_size]
        n = max(len(p) for p in chunk)
        ids = torch.tensor([[pad] * (n - len(p)) + p for p in chunk], device=device)
        mask = torch.tensor([[0] * (n - len(p)) + [1] * len(p) for p in chunk], device=device)
        kw = dict(do_sample=False, max_new_tokens=max_new, min_new_tokens=0, eos_token_id=eos, pad_token_id=pad)
        if assistant is not None:
            kw["assistant_model"] = assistant
            if assistant_tokens:
                kw.update(num_assistant_tokens=assistant_tokens, num_assistant_tokens_schedule="constant",
                          assistant_confidence_threshold=0.0)
        with torch.no_grad():
            gen = model.generate(input_ids=ids, attention_mask=mask, **kw)
        out += [trim(row[n:].tolist(), eos) for row in gen]
    return out


def _shown(path: str) -> str:
    """A path relative to the repository when inside it."""
    rel = os.path.relpath(os.path.abspath(path), REPO)
    return path if rel.startswith("..") else rel


def timed(fn, device: str):
    """(result, seconds) of ``fn()`` with a device sync before and after."""
    _sync(device)
    t0 = time.perf_counter()
    r = fn()
    _sync(device)
    return r, time.perf_counter() - t0


def compare(ref: list[list[int]], got: list[list[int]], gap_fn) -> dict:
    """{exact, prompts, mismatches: [{prompt, first_divergence, ref_len, len, top2_gap}]} over the prompts both
    ran (a method cut short by its time budget ran the first ones)."""
    mism = []
    for i, (r, g) in enumerate(zip(ref, got)):
        if r == g:
            continue
        div = next((k for k, (x, y) in enumerate(zip(r, g)) if x != y), min(len(r), len(g)))
        mism.append({"prompt": i, "first_divergence": div, "ref_len": len(r), "len": len(g),
                     "top2_gap": gap_fn(i, r[:div]) if div < len(r) else None})
    n = min(len(ref), len(got))
    return {"exact": n - len(mism), "prompts": n, "mismatches": mism}


def render(data: dict) -> str:
    cfg, m = data["config"], data["machine"]
    parts = [f"# gaptrace runtime vs transformers {cfg.get('transformers')} ({cfg['dtype']}, {m.get('gpu') or 'CPU'})",
             "",
             f"{m['date']}, torch {m.get('torch')}; pair: {cfg['target_dir']} + {cfg['draft_dir']} "
             f"({cfg.get('hf_class')}); {cfg['prompts']} prompts, {cfg['max_new_tokens']} new tokens each, greedy. "
             f"Wall time of the whole prompt set, prefill included. Token reference: "
             f"{cfg.get('token_reference')}.", ""]
    eq = data.get("equivalence")
    if eq:
        parts += [f"Same weights: max |logit difference| runtime vs transformers on prompt 0 = "
                  f"{eq['max_abs_logit_diff']:.3g} (logit scale {eq['logit_abs_max']:.3g}); greedy argmax equal at "
                  f"{eq['argmax_equal']}/{eq['positions']} positions.", ""]
    runs = data["runs"]
    rows = []
    base = runs.get("hf_assisted_bs1", {}).get("tokens_per_s")
    for name, r in runs.items():
        if "error" in r:
            rows.append([name, "–", "–", "–", "–", "–", "–", "error: " + r["error"]])
            continue
        c = r.get("check")
        rows.append([name, r["batch_size"], r.get("prompts", "–"), fmt(r["tokens"]), fmt(r["seconds"]),
                     fmt(r["tokens_per_s"], 0),
                     fmt(r["tokens_per_s"] / base) + "×" if base else "–",
                     (f"{c['exact']}/{c['prompts']}" if c else "reference" if name == cfg.get("token_reference")
                      else "–") +
                     (f", τ {r['tau']:.2f}" if r.get("tau") else "")])
    parts.append(md_table(["method", "bs", "prompts", "tokens", "seconds", "tok/s", "vs hf_assisted_bs1",
                           f"same tokens as {cfg.get('token_reference')}"], rows))
    mism = [(name, x) for name, r in runs.items() for x in (r.get("check") or {}).get("mismatches", [])]
    if mism:
        parts += ["", "Mismatches (prompt: first differing position / reference length, reference top-2 logit gap "
                      "there):", ""]
        parts += [f"- {name} prompt {x['prompt']}: at {x['first_divergence']}/{x['ref_len']} (its length {x['len']}), "
                  f"gap {fmt(x['top2_gap'], 4)}" for name, x in mism]
    rt = runs.get(f"runtime_bs1_B{cfg['blocks'][0]}") if cfg.get("blocks") else None
    if base and rt and "error" not in rt:
        parts += ["", f"Runtime at bs 1 (B = {cfg['blocks'][0]}) / transformers assisted generation at bs 1: "
                      f"{rt['tokens_per_s'] / base:.2f}× (target: ≥ 3×)."]
    return "\n".join(parts)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target-dir", default=os.path.join(MODELS, "tiny-target-plain"))
    p.add_argument("--draft-dir", default=os.path.join(MODELS, "tiny-draft-plain"))
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--prompts", default=os.path.join(REPO, "fixtures", "prompts", "heldout.jsonl"))
    p.add_argument("--max-prompts", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--blocks", default="8", help="runtime block sizes B (the first is the headline)")
    p.add_argument("--runtime-batch-sizes", default="1,8")
    p.add_argument("--max-seq-len", type=int, default=512,
                   help="the runtime's context per request slot (a multiple of the page size 16): prompt + new tokens "
                        "+ 2B must fit; attention reads a fixed-width window of this many columns")
    p.add_argument("--hf-batch-size", type=int, default=8)
    p.add_argument("--hf-assistant-tokens", type=int, default=None,
                   help="draft length for assisted generation (default: transformers' own settings)")
    p.add_argument("--skip-hf-plain-bs1", action="store_true",
                   help="no per-prompt plain generate (then the token reference is hf_assisted_bs1)")
    p.add_argument("--method-budget-s", type=float, default=None,
                   help="transformers methods start no new batch after this many seconds (tokens/s over the prompts "
                        "done; the count is in the table)")
    p.add_argument("--out", default="bench_results")
    p.add_argument("--name", default="vs_transformers")
    a = p.parse_args(argv)

    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    from gaptrace.runtime.cli import read_prompts_file
    from gaptrace.runtime.engine import Engine
    from gaptrace.runtime.session import DTYPES, build_setup

    for d in (a.target_dir, a.draft_dir):
        if not os.path.isfile(os.path.join(d, "config.json")):
            sys.exit(f"{d}: no checkpoint (train it: python scripts/train_pair.py --plain-attention)")
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)
    dtype = DTYPES[a.dtype]
    blocks, sizes = ints(a.blocks), ints(a.runtime_batch_sizes)
    texts = read_prompts_file(a.prompts)[: a.max_prompts]

    hf = AutoModelForCausalLM.from_pretrained(a.target_dir, dtype=dtype).to(device).eval()
    hf_draft = AutoModelForCausalLM.from_pretrained(a.draft_dir, dtype=dtype).to(device).eval()
    setup0 = build_setup("tiny", a.target_dir, a.draft_dir, device=device, dtype=a.dtype, batch_size=max(sizes),
                         block_size=blocks[0], scheduler="overlap", max_seq_len=a.max_seq_len)
    tok, eos = setup0.tokenizer, setup0.eos_token_id
    prompts = [tok.encode(t) for t in texts]
    data = {"machine": machine(), "runs": {},
            "config": {"target_dir": _shown(a.target_dir), "draft_dir": _shown(a.draft_dir),
                       "hf_class": f"{type(hf).__name__} + {type(hf_draft).__name__}",
                       "model_type": hf.config.model_type, "transformers": transformers.__version__,
                       "dtype": a.dtype, "device": device, "prompts": len(prompts), "max_new_tokens": a.max_new_tokens,
                       "eos_token_id": eos, "blocks": blocks, "hf_assistant_tokens": a.hf_assistant_tokens,
                       "command": "python benchmarks/bench_vs_transformers.py " + " ".join(sys.argv[1:] if argv is None
                                                                                          else argv)}}

    def save():
        write_results(a.out, a.name, data, render(data))

    # the same weights: full-forward logits of the runtime's model and transformers' on prompt 0
    with torch.no_grad():
        x = torch.tensor([prompts[0]], device=device)
        ours, theirs = setup0.target(x).float(), hf(x).logits.float()
    data["equivalence"] = {"max_abs_logit_diff": float((ours - theirs).abs().max()),
                           "logit_abs_max": float(theirs.abs().max()),
                           "argmax_equal": int((ours.argmax(-1) == theirs.argmax(-1)).sum()),
                           "positions": int(x.shape[1])}
    save()

    def gap(i: int, prefix: list[int]) -> float:
        with torch.no_grad():
            logits = hf(torch.tensor([prompts[i] + prefix], device=device)).logits[0, -1].float()
        top = logits.topk(2).values
        return float(top[0] - top[1])

    def check_all() -> None:
        """Tokens of every run against the reference: hf_plain_bs1, or hf_assisted_bs1 when that is missing."""
        runs = data["runs"]
        ref_name = next((n for n in ("hf_plain_bs1", "hf_assisted_bs1") if "outputs" in runs.get(n, {})), None)
        data["config"]["token_reference"] = ref_name
        for name, r in runs.items():
            if ref_name and name != ref_name and "outputs" in r and r.get("check_against") != ref_name:
                r["check"], r["check_against"] = compare(runs[ref_name]["outputs"], r["outputs"], gap), ref_name

    def record(name: str, bs: int, fn, extra=None) -> None:
        print(f"{name} ...", file=sys.stderr, flush=True)
        try:
            outs, secs = fn()
            n = sum(len(o) for o in outs)
            r = {"batch_size": bs, "prompts": len(outs), "tokens": n, "seconds": secs, "tokens_per_s": n / secs,
                 **(extra or {}), "outputs": outs}
        except Exception as e:  # one failing method must not lose the others
            r = {"batch_size": bs, "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
        data["runs"][name] = r
        print(f"  {r.get('tokens_per_s', 0):.0f} tok/s" if "error" not in r else "  " + r["error"], file=sys.stderr)
        check_all()
        save()

    def hf_run(bs, assistant=None):
        hf_generate(hf, prompts[:bs], bs, 8, eos, device, assistant, a.hf_assistant_tokens)  # warm-up
        return timed(lambda: hf_generate(hf, prompts, bs, a.max_new_tokens, eos, device, assistant,
                                         a.hf_assistant_tokens, a.method_budget_s), device)

    def runtime_run(bs, B, stats_out):
        rc = setup0.rcfg.replace(batch_size=bs, block_size=B)
        t0 = time.perf_counter()
        engine = Engine(setup0.target, setup0.draft, rc, eos)
        stats_out["engine_build_s"] = time.perf_counter() - t0
        stats_out["cuda_graphs"] = bool(engine.graph_nodes)
        engine.generate(prompts[:bs], 8)  # warm-up
        (reqs, st), secs = timed(lambda: engine.generate(prompts, a.max_new_tokens), device)
        stats_out.update(tau=st.tau, rounds=st.rounds, tround_ms=st.tround_ms)
        return [r.output for r in reqs], secs

    # most important first: the headline (runtime vs assisted generation at bs 1), then batched, then the
    # slowest (plain generate one prompt at a time, the token reference)
    record("hf_assisted_bs1", 1, lambda: hf_run(1, hf_draft),
           {"assistant": "transformers defaults" if not a.hf_assistant_tokens else
            f"{a.hf_assistant_tokens} tokens, constant"})
    for bs in sizes:
        for B in blocks:
            extra: dict = {"block_size": B}
            record(f"runtime_bs{bs}_B{B}", bs, lambda: runtime_run(bs, B, extra), extra)
    if a.hf_batch_size > 1:
        record(f"hf_plain_bs{a.hf_batch_size}", a.hf_batch_size, lambda: hf_run(a.hf_batch_size))
    if not a.skip_hf_plain_bs1:
        record("hf_plain_bs1", 1, lambda: hf_run(1))
    save()
    print(render(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
