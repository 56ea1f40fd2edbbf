"""Long prompts for long-context captures (the fault token-list-rebuild, issue 5): COUNT prompts of about TOKENS
tokens each under the tiny preset's tokenizer, each the held-out prompts concatenated in a different rotation.

    python scripts/long_prompts.py --tokens 16000 --count 16 -o /tmp/long.jsonl

Writes JSONL ({"id", "prompt", "tokens"}) through a temporary file and a rename; prints one line per prompt.
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
    from gaptrace.runtime.config import get_preset
    from gaptrace.runtime.tokenizer import load_tokenizer

    preset = get_preset("tiny")
    tok = load_tokenizer(preset.tokenizer, vocab_size=preset.target.vocab_size)
    texts = [json.loads(line)["prompt"] for line in open(a.source) if line.strip()]
    per = [len(tok.encode(t)) for t in texts]
    tmp = a.output + ".tmp"
    with open(tmp, "w") as f:
        for i in range(a.count):
            parts, n, j = [], 0, i
            while n + per[j % len(texts)] <= a.tokens:  # whole prompts only, so the count is exact
                parts.append(texts[j % len(texts)])
                n += per[j % len(texts)]
                j += 1
            text = "".join(parts)
            n = len(tok.encode(text))
            f.write(json.dumps({"id": i, "prompt": text, "tokens": n}) + "\n")
            print(f"prompt {i}: {n} tokens, {len(text)} characters", file=sys.stderr)
    os.replace(tmp, a.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
