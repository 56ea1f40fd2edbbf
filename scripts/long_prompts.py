"""Long prompts for long-context captures (the fault token-list-rebuild): COUNT prompts of about TOKENS
tokens each under the tiny preset's tokenizer, each the held-out prompts concatenated in a different rotation.

    python scripts/long_prompts.py --tokens 16000 --count 16 -o /tmp/long.jsonl

Writes JSONL ({"id", "prompt", "tokens"}) through a temporary file and a rename (gaptrace.outputs: never over a
link's target's neighbours, a device, a directory or the source); prints one line per prompt. Bad input (a missing
source, an unwritable output, --tokens below the shortest source prompt): one error line, exit 2, nothing written.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, required=True, help="tokens per prompt (approximately, never more)")
    p.add_argument("--count", type=int, default=16)
    p.add_argument("--source", default=os.path.join(REPO, "fixtures", "prompts", "heldout.jsonl"))
    p.add_argument("-o", "--output", required=True)
    a = p.parse_args(argv)
    if a.tokens < 1 or a.count < 1:
        p.error("--tokens and --count must be >= 1")
    from gaptrace.outputs import resolve_output, write_text_atomic
    from gaptrace.runtime.presets import get_preset
    from gaptrace.runtime.tokenizer import load_tokenizer

    def fail(msg: str) -> int:
        print(f"long_prompts: error: {msg}", file=sys.stderr)
        return 2

    try:
        out = resolve_output(a.output, (a.source,))
    except ValueError as e:
        return fail(str(e))
    try:
        texts = [json.loads(line)["prompt"] for line in open(a.source) if line.strip()]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return fail(f"{a.source}: {type(e).__name__}: {e}")
    preset = get_preset("tiny")
    tok = load_tokenizer(preset.tokenizer, vocab_size=preset.target.vocab_size)
    per = [len(tok.encode(t)) for t in texts]
    if not texts or min(per) > a.tokens:
        return fail(f"--tokens {a.tokens} is below the shortest prompt of {a.source} "
                    f"({min(per) if per else 0} tokens): no prompt would fit")
    lines = []
    for i in range(a.count):
        parts, n, j = [], 0, i
        while n + per[j % len(texts)] <= a.tokens:  # whole prompts only, so the count is exact
            parts.append(texts[j % len(texts)])
            n += per[j % len(texts)]
            j += 1
        if not parts:  # this rotation starts with a prompt longer than --tokens: take the next that fits
            k = next(k for k in range(len(texts)) if per[(i + k) % len(texts)] <= a.tokens)
            parts, n = [texts[(i + k) % len(texts)]], per[(i + k) % len(texts)]
        text = "".join(parts)
        n = len(tok.encode(text))
        lines.append(json.dumps({"id": i, "prompt": text, "tokens": n}))
        print(f"prompt {i}: {n} tokens, {len(text)} characters", file=sys.stderr)
    try:
        write_text_atomic(out, "\n".join(lines) + "\n")
    except OSError as e:
        return fail(f"{a.output}: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
