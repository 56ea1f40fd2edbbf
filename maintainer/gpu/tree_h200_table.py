"""The table of maintainer/gpu/tree_h200.sh: tau of the draft tree against the chain at equal verify width, and the
captures of both tree builders. Reads what the script wrote to OUTDIR; prints the table; writes
OUTDIR/tree_h200_table.txt and .json. A missing or broken input is a row saying so, never a crash.

    python3 maintainer/gpu/tree_h200_table.py OUTDIR [--block-size 8] [--tree-budget 8]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def _load(path: Path):
    """The JSON object in ``path``, or an error string."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return "missing"
    except (OSError, ValueError) as e:
        return f"unreadable ({str(e).splitlines()[0][:60]})"


def decode_rows(out: Path, B: int, N: int) -> list[dict]:
    """One row per decode: run, builder, bs, verify width, tau, tok/s, TPOT, exact-match rate, rounds."""
    rows = []
    runs = [("chain", f"decode_chain_B{B}.json"), ("tree gpu", f"decode_tree_gpu_N{N}.json"),
            ("tree cpu-heapq", f"decode_tree_cpu-heapq_N{N}.json")]
    tokens = {}
    for run, name in runs:
        d = _load(out / name)
        if not isinstance(d, dict):
            rows.append({"run": run, "file": name, "error": d})
            continue
        tokens[run] = [r.get("tokens") for r in d.get("requests", [])]
        rows.append({"run": run, "file": name, "builder": d.get("tree_builder") or "-",
                     "batch_size": d.get("batch_size"), "verify_width": d.get("verify_width"),
                     "tau": d.get("tau"), "tokens_per_s": d.get("tokens_per_s"), "tpot_ms": d.get("tpot_ms"),
                     "exact_match_rate": d.get("exact_match_rate"), "rounds": d.get("rounds")})
    for row in rows:
        if row["run"] == "tree cpu-heapq" and "tree gpu" in tokens and "tree cpu-heapq" in tokens:
            row["same_tokens_as_gpu"] = tokens["tree cpu-heapq"] == tokens["tree gpu"]
    return rows


def capture_rows(out: Path) -> list[dict]:
    """One row per capture sidecar: builder, bs, mean tau of the profiled rounds, unprofiled round period (median
    of the warm-up's second half), graph node counts, trace size."""
    rows = []
    for side_path in sorted(out.glob("h200_tiny_tree_*.gaptrace.json")):
        name = side_path.name.removesuffix(".gaptrace.json")
        s = _load(side_path)
        trace = out / f"{name}.json.gz"
        if not isinstance(s, dict):
            rows.append({"run": name, "error": s})
            continue
        cfg = s.get("config", {})
        taus = [r["tau"] for r in s.get("rounds", []) if r.get("tau") is not None]
        periods = s.get("unprofiled_round_ms") or []
        rows.append({"run": name, "builder": cfg.get("tree_builder"), "batch_size": cfg.get("batch_size"),
                     "verify_width": cfg.get("verify_width"), "tau": statistics.mean(taus) if taus else None,
                     "unprofiled_round_ms": statistics.median(periods) if periods else None,
                     "graph_nodes": {g["name"]: g.get("nodes") for g in s.get("graphs", [])},
                     "trace_bytes": trace.stat().st_size if trace.exists() else None})
    return rows


def _fmt(v, spec: str = ".2f") -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    return format(v, spec) if isinstance(v, (int, float)) else str(v)


def render(dec: list[dict], cap: list[dict], B: int, N: int) -> str:
    """The printed table (plain text)."""
    lines = [f"decode: tau at equal verify width (chain B={B}, tree N={N} nodes incl. the root)",
             f"{'run':<16} {'builder':<10} {'bs':>3} {'width':>5} {'tau':>6} {'tok/s':>9} {'TPOT ms':>8} "
             f"{'exact':>6} {'rounds':>6}  note"]
    for r in dec:
        if "error" in r:
            lines.append(f"{r['run']:<16} {r['file']}: {r['error']}")
            continue
        note = "" if "same_tokens_as_gpu" not in r else f"tokens == gpu builder: {_fmt(r['same_tokens_as_gpu'])}"
        lines.append(f"{r['run']:<16} {r['builder']:<10} {_fmt(r['batch_size'], 'd'):>3} "
                     f"{_fmt(r['verify_width'], 'd'):>5} {_fmt(r['tau'], '.3f'):>6} "
                     f"{_fmt(r['tokens_per_s'], '.1f'):>9} "
                     f"{_fmt(r['tpot_ms']):>8} {_fmt(r['exact_match_rate']):>6} {_fmt(r['rounds'], 'd'):>6}  {note}")
    ok = {r["run"]: r for r in dec if "error" not in r and r.get("tau")}
    if "chain" in ok and "tree gpu" in ok:
        lines.append(f"tau tree / tau chain = {ok['tree gpu']['tau'] / ok['chain']['tau']:.3f}")
    lines += ["", "captures (profiled rounds; unprofiled round = median period of the late warm-up rounds)",
              f"{'capture':<34} {'builder':<10} {'bs':>3} {'tau':>6} {'round ms':>9} {'trace MB':>9}  graph nodes"]
    if not cap:
        lines.append("(no capture sidecar found)")
    for r in cap:
        if "error" in r:
            lines.append(f"{r['run']:<34} {r['error']}")
            continue
        nodes = " ".join(f"{k}={v}" for k, v in sorted(r["graph_nodes"].items())) or "(eager)"
        mb = None if r["trace_bytes"] is None else r["trace_bytes"] / 1e6
        lines.append(f"{r['run']:<34} {_fmt(r['builder']):<10} {_fmt(r['batch_size'], 'd'):>3} "
                     f"{_fmt(r['tau'], '.3f'):>6} {_fmt(r['unprofiled_round_ms'], '.3f'):>9} {_fmt(mb):>9}  {nodes}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--tree-budget", type=int, default=8)
    a = ap.parse_args(argv)
    out = Path(a.outdir)
    dec, cap = decode_rows(out, a.block_size, a.tree_budget), capture_rows(out)
    text = render(dec, cap, a.block_size, a.tree_budget)
    sys.stdout.write(text)
    (out / "tree_h200_table.txt").write_text(text)
    (out / "tree_h200_table.json").write_text(json.dumps({"decode": dec, "captures": cap}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
