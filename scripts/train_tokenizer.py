"""Train the tiny pair's tokenizer and cut the held-out prompt set.

    .venv/bin/python scripts/train_tokenizer.py            # writes fixtures/models/tokenizer.json
                                                           #    and fixtures/prompts/heldout.jsonl

Tokenizer: byte-level BPE (Hugging Face ``tokenizers``), vocab ``--vocab-size`` (4096) including one special
token, ``<|endoftext|>`` (EOS, id 0), trained on the TRAIN split of the stdlib corpus (scripts/tinycorpus.py) only.
Byte-level, so every string round-trips exactly through encode/decode.

Prompts: ``--n-prompts`` (32) windows of ``PROMPT_LINES`` lines cut from held-out files (codec tables under
``encodings/`` skipped: they are data, not code, and would flatter τ). Deterministic: files in sorted order, the
window start in each file from a hash of (path, k), round-robin over files until enough prompts exist; a window
must hold at least 4 non-blank lines and at most ``MAX_PROMPT_CHARS`` characters.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tinycorpus  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PROMPT_LINES = 6
MAX_PROMPT_CHARS = 400
PROMPT_SKIP_PREFIXES = ("encodings/",)


def train_tokenizer(texts, vocab_size: int):
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on the iterable of strings ``texts``; EOS is id 0."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[tinycorpus.EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def _window_start(relpath: str, k: int, n_starts: int) -> int:
    digest = hashlib.sha256(f"{relpath}#{k}".encode()).hexdigest()
    return int(digest[:8], 16) % n_starts


def cut_prompts(root: Path, heldout: list[str], n_prompts: int) -> list[dict]:
    """``n_prompts`` prompt records {id, source, line, prompt} from the held-out files (rule: module docstring)."""
    files = [f for f in heldout if not f.startswith(PROMPT_SKIP_PREFIXES)]
    lines_of = {f: tinycorpus.read_text(root, f).splitlines(keepends=True) for f in files}
    files = [f for f in files if len(lines_of[f]) > 2 * PROMPT_LINES]
    if not files:
        raise ValueError(f"{root}: no held-out file long enough to cut prompts from")
    out: list[dict] = []
    seen: set[tuple[str, int]] = set()
    k = 0
    while len(out) < n_prompts and k < 64:
        for f in files:
            lines = lines_of[f]
            start = _window_start(f, k, len(lines) - PROMPT_LINES)
            window = lines[start:start + PROMPT_LINES]
            text = "".join(window)
            if (f, start) in seen or sum(1 for s in window if s.strip()) < 4 or len(text) > MAX_PROMPT_CHARS:
                continue
            seen.add((f, start))
            out.append({"id": len(out), "source": f, "line": start + 1, "prompt": text})
            if len(out) == n_prompts:
                break
        k += 1
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--n-prompts", type=int, default=32)
    ap.add_argument("--tokenizer-out", type=Path, default=REPO / "fixtures/models/tokenizer.json")
    ap.add_argument("--prompts-out", type=Path, default=REPO / "fixtures/prompts/heldout.jsonl")
    args = ap.parse_args(argv)

    root = tinycorpus.stdlib_root()
    train, heldout = tinycorpus.split_files(root)
    tok = train_tokenizer((tinycorpus.read_text(root, f) for f in train), args.vocab_size)
    assert tok.token_to_id(tinycorpus.EOS_TOKEN) == 0
    prompts = cut_prompts(root, heldout, args.n_prompts)
    for p in prompts:
        if tok.decode(tok.encode(p["prompt"]).ids) != p["prompt"]:
            raise ValueError(f"{p['source']}:{p['line']}: tokenizer does not round-trip this prompt")

    for path, write in (
        (args.tokenizer_out, lambda fh: fh.write(tok.to_str())),
        (args.prompts_out, lambda fh: fh.writelines(json.dumps(p) + "\n" for p in prompts)),
    ):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            write(fh)
        os.replace(tmp, path)
    n_tok = [len(tok.encode(p["prompt"]).ids) for p in prompts]
    print(f"stdlib {root} ({sys.version.split()[0]}): {len(train)} train files, {len(heldout)} held-out files")
    print(f"tokenizer: vocab {tok.get_vocab_size()} -> {args.tokenizer_out}")
    print(f"prompts: {len(prompts)} ({min(n_tok)}..{max(n_tok)} tokens) -> {args.prompts_out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
