"""Where ``gaptrace decode --tp 2`` and ``--tp 1`` part, with the logit margin there (DESIGN.md "Tensor
parallelism": a float32 split sum may flip a near-tie).

    python maintainer/gpu/tp_flips.py decode_tp1.json decode_tp2.json [--device cuda]

Reads the two ``--json`` outputs (same preset, prompts and options); prints one line per request: equal, or the
first token where they differ, the two tokens, and the top-2 logit gap of the one-process greedy reference at that
position (``runtime.spec.reference.greedy_reference`` of the preset's whole target, recomputed here for the requests
that differ), then a summary line. Exit 0 (a flip is a finding, not an error); 2 on unreadable input.
"""
from __future__ import annotations

import argparse
import json
import sys


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where ``a`` and ``b`` differ (the shorter's length when one is a prefix of the other), or
    None when they are equal."""
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if i is None and len(a) != len(b):
        i = min(len(a), len(b))
    return i


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("tp1")
    p.add_argument("tp2")
    p.add_argument("--device", default="cuda")
    a = p.parse_args(argv)
    try:
        one, two = (json.load(open(f, encoding="utf-8")) for f in (a.tp1, a.tp2))
    except (OSError, ValueError) as e:
        print(f"tp_flips: error: {e}", file=sys.stderr)
        return 2
    diffs = []
    for k, (r1, r2) in enumerate(zip(one["requests"], two["requests"])):
        i = first_difference(r1["tokens"], r2["tokens"])
        diffs.append((k, i, r1, r2))
    gaps = {}
    if any(i is not None for _, i, _, _ in diffs):
        from gaptrace.runtime.session import build_setup, encode_prompts
        from gaptrace.runtime.spec.reference import greedy_reference

        setup = build_setup(one["preset"], device=a.device, dtype=one["dtype"])
        for k, i, r1, _ in diffs:
            if i is not None:
                ids = encode_prompts(setup, [r1["prompt"]], len(r1["tokens"]))[0]
                ref = greedy_reference(setup.target, ids, len(r1["tokens"]), setup.eos_token_id,
                                       setup.rcfg.prefill_chunk, setup.rcfg.device, setup.rcfg.fused_kernels)
                gaps[k] = ref.top2_gap[i] if i < len(ref.top2_gap) else None
    for k, i, r1, r2 in diffs:
        if i is None:
            print(f"request {k}: equal ({len(r1['tokens'])} tokens)")
        else:
            t1 = r1["tokens"][i] if i < len(r1["tokens"]) else None
            t2 = r2["tokens"][i] if i < len(r2["tokens"]) else None
            print(f"request {k}: differs at token {i} (tp1 {t1}, tp2 {t2}); one-process greedy top-2 logit gap "
                  f"there {gaps.get(k)}")
    n = sum(i is not None for _, i, _, _ in diffs)
    print(f"{len(diffs) - n} of {len(diffs)} requests equal token for token; {n} flipped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
