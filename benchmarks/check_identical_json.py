"""Check that ``gaptrace analyze --json`` prints byte-identical output before and after a change.

``save DIR``    runs every case and stores stdout, stderr and exit code under DIR.
``compare DIR`` runs them again and prints one row per case (same / DIFF) and a total; exit 1 on any DIFF.

Cases: every .json and .json.gz file under fixtures/traces (sidecars and non-trace files included: their
error line and exit code must not change either), every directory there holding two or more trace files
(as a fleet with ``--workers 0`` and as one trace with ``--merged``), plus any paths given with ``--extra``.
A fleet's ``cluster`` block (wall times, peak RSS of this run) is left out of the comparison.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cases(extra: list[str]) -> list[list[str]]:
    """The argument lists to run (each after ``gaptrace analyze``)."""
    out: list[list[str]] = []
    fx = ROOT / "fixtures" / "traces"
    for p in sorted(fx.rglob("*")):
        if p.is_file() and (p.name.endswith(".json") or p.name.endswith(".json.gz")):
            out.append([str(p.relative_to(ROOT)), "--json"])
    for d in sorted(x for x in fx.rglob("*") if x.is_dir()):
        n = sum(1 for q in d.iterdir() if q.name.endswith((".json.gz",)) or
                (q.name.endswith(".json") and not q.name.endswith(".gaptrace.json")))
        if n >= 2:
            rel = str(d.relative_to(ROOT))
            out.append([rel, "--json", "--workers", "0"])
            out.append([rel, "--json", "--merged"])
    for e in extra:
        out.append([e, "--json"])
    return out


def key(args: list[str]) -> str:
    return hashlib.sha1("\0".join(args).encode()).hexdigest()[:16]


def run(args: list[str]) -> dict:
    exe = str(Path(sys.executable).with_name("gaptrace"))
    r = subprocess.run(["nice", "-n", "10", exe, "analyze", *args], cwd=ROOT, capture_output=True)
    return {"args": args, "rc": r.returncode, "stdout": r.stdout.decode("utf-8", "replace"),
            "stderr": r.stderr.decode("utf-8", "replace")}


def _comparable(stdout: str) -> str:
    """The output as compared: byte for byte, except a fleet's ``cluster`` block (the run's own wall times, memory
    limit and peak RSS, which differ from run to run), whose other keys' bytes are compared re-serialised, and the
    directory of the shipped calibration file (so that a copy of the code in another directory can be checked)."""
    # the shipped calibration's path names the checkout it was read from
    stdout = re.sub(r'"source": "[^"]*?/analyses/data/', '"source": "<package>/analyses/data/', stdout)
    try:
        obj = json.loads(stdout)
    except ValueError:
        return stdout
    if isinstance(obj, dict) and "cluster" in obj:
        obj.pop("cluster")
        return json.dumps(obj, ensure_ascii=False)
    return stdout


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["save", "compare"])
    ap.add_argument("dir")
    ap.add_argument("--extra", action="append", default=[])
    ap.add_argument("-j", type=int, default=2)
    a = ap.parse_args()
    d = Path(a.dir)
    d.mkdir(parents=True, exist_ok=True)
    cs = cases(a.extra)
    with ThreadPoolExecutor(a.j) as ex:
        results = list(ex.map(run, cs))
    bad = 0
    for r in results:
        f = d / (key(r["args"]) + ".json")
        if a.mode == "save":
            f.write_text(json.dumps(r))
            print(f"saved rc={r['rc']} {' '.join(r['args'])}")
            continue
        old = json.loads(f.read_text())
        same = _comparable(old["stdout"]) == _comparable(r["stdout"]) and old["rc"] == r["rc"]
        bad += not same
        print(f"{'same' if same else 'DIFF'} rc={r['rc']} {' '.join(r['args'])}")
    print(f"{len(results)} cases, {bad} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
