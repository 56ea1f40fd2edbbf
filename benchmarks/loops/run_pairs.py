"""Measure every loop's planted and fixed variants in fresh processes, and capture one profiled trace of each.

    python -m benchmarks.loops.run_pairs --device cuda --out /tmp/pairs --bundle pairs.tar.gz

For each loop x variant the driver runs (each in a fresh ``python -m benchmarks.loops._worker`` process):

1. one capture: a gzipped Kineto trace of ``--trace-steps`` steps after ``--warmup`` unprofiled steps, with
   gaptrace's profiler settings (``LOOP.VARIANT.trace.json.gz``, plus gaptrace's ``.gaptrace.json`` sidecar);
2. ``--processes`` measurements of the UNPROFILED step period, ``--steps`` steps each
   (``LOOP.VARIANT.mK.json``). The measurement rounds go loop by loop, the variants' order alternating from
   round to round (planted, fixed; fixed, planted; ...), so slow drift of the machine falls on both variants.

Then it writes ``LOOP.pairs.json`` per loop (each variant's per-process median periods, their median and spread,
and the measured saving), ``summary.md`` (the table), ``run.json`` (settings, every process's command, duration
and exit status) and, with ``--bundle``, one tar.gz of all of it. A process that fails or runs past
``--process-timeout-s`` is recorded in run.json (its stderr's tail) and the rest go on.

``--budget-s`` bounds the whole run: the captures go first, then measurement rounds while the next round is
expected (from the processes' durations so far) to fit; every loop gets the same number of rounds.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

from . import LOOP_MODULES, loop_module, readable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
VARIANTS = ("planted", "fixed")


def _write_text_atomic(path: str, text: str) -> None:
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        readable(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _write_json(path: str, obj) -> None:
    _write_text_atomic(path, json.dumps(obj, indent=1, sort_keys=True) + "\n")


def run_process(args: list[str], timeout_s: float) -> dict:
    """Run one worker (``python -m benchmarks.loops._worker ARGS``) from the repository root; its command, exit
    status, wall seconds and stderr's tail."""
    cmd = [sys.executable, "-m", "benchmarks.loops._worker", *args]
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
        rc, err = r.returncode, r.stderr
    except subprocess.TimeoutExpired as e:
        rc, err = "timeout", (e.stderr.decode() if isinstance(e.stderr, bytes) else e.stderr or "")
    return {"cmd": " ".join(cmd[1:]), "rc": rc, "wall_s": round(time.perf_counter() - t0, 3),
            "stderr_tail": (err or "")[-1500:] if rc != 0 else ""}


def spread(values: list[float]) -> dict:
    """min, max, range (max - min), range / median and the median absolute deviation of per-process periods (ms)."""
    if not values:
        return {}
    med = statistics.median(values)
    return {"min_ms": min(values), "max_ms": max(values), "range_ms": max(values) - min(values),
            "range_fraction": (max(values) - min(values)) / med if med else None,
            "mad_ms": statistics.median(abs(v - med) for v in values)}


def _measurement_files(out: str, loop: str, variant: str) -> list[str]:
    """``LOOP.VARIANT.mK.json`` under ``out``, in the order of K."""
    pre = f"{loop}.{variant}.m"
    ks = [n[len(pre):-len(".json")] for n in os.listdir(out) if n.startswith(pre) and n.endswith(".json")]
    return [os.path.join(out, f"{pre}{k}.json") for k in sorted((k for k in ks if k.isdigit()), key=int)]


def summarize_loop(loop: str, out: str) -> dict:
    """``LOOP.pairs.json``'s content from the measurement files ``LOOP.VARIANT.mK.json`` under ``out``.

    Per variant: ``periods_ms_per_process`` (each process's median step period over its steady steps),
    ``wall_period_ms_per_process`` (synchronized span / steps), their medians and :func:`spread`. The saving is
    median(planted) - median(fixed); ``saving_range_ms`` is [min(planted) - max(fixed), max(planted) -
    min(fixed)], the smallest and largest saving any planted/fixed pair of processes shows; ``separated`` says
    whether every planted process was slower than every fixed one. ``within_process_p90_p10_ms``: the median over
    processes of each one's p90 - p10 of its step periods."""
    res: dict = {"loop": loop}
    for v in VARIANTS:
        per, wall, files, within = [], [], [], []
        for p in _measurement_files(out, loop, v):
            with open(p) as f:
                m = json.load(f)
            per.append(m["median_period_ms"])
            within.append(m["p90_period_ms"] - m["p10_period_ms"])
            wall.append(m["wall_period_ms"])
            files.append(os.path.basename(p))
            for key in ("cause", "fix", "site", "size", "expected_ratio", "device_name", "steps"):
                res.setdefault(key, m.get(key))
        trace = f"{loop}.{v}.trace.json.gz"
        res[v] = {"periods_ms_per_process": per, "wall_period_ms_per_process": wall, "files": files,
                  "median_ms": statistics.median(per) if per else None,
                  "wall_median_ms": statistics.median(wall) if wall else None, "spread": spread(per),
                  "within_process_p90_p10_ms": statistics.median(within) if within else None,
                  "trace": trace if os.path.exists(os.path.join(out, trace)) else None}
    p, f = res["planted"], res["fixed"]
    if p["median_ms"] is not None and f["median_ms"] is not None:
        res["saving_ms"] = p["median_ms"] - f["median_ms"]
        res["saving_fraction"] = res["saving_ms"] / p["median_ms"]
        res["ratio"] = p["median_ms"] / f["median_ms"]
        res["separated"] = p["spread"]["min_ms"] > f["spread"]["max_ms"]  # every planted process slower
        res["saving_range_ms"] = [p["spread"]["min_ms"] - f["spread"]["max_ms"],
                                  p["spread"]["max_ms"] - f["spread"]["min_ms"]]
    pp = os.path.join(out, f"{loop}.paired.json")
    if os.path.exists(pp):  # both variants measured in the planted capture's own process (_worker.paired)
        with open(pp) as fh:
            m = json.load(fh)
        res["paired"] = {k: m[k] for k in ("blocks", "block_steps", "saving_ms", "saving_range_ms", "median_ms",
                                           "saving_per_block_ms")}
        res["paired"]["file"] = os.path.basename(pp)
    return res


def summary_markdown(rows: list[dict], settings: dict) -> str:
    """The summary table (ms; the spread is each variant's [min-max] over its processes)."""
    rows_steps = ", ".join(sorted({str(r.get("steps")) for r in rows if r.get("steps")})) or str(settings["steps"])
    lines = [f"# Planted vs fixed step periods ({settings['device']}, {settings.get('device_name') or ''})", "",
             f"Unprofiled step period per process = median of the host's step-start intervals over the steady "
             f"steps ({rows_steps} steps per process, the first 10% dropped); the variant's figure is the "
             f"median over its processes. Saving = planted - fixed; its range is [min planted - max fixed, "
             f"max planted - min fixed].", "",
             "Paired: both variants in the planted capture's own process, blocks alternating (`LOOP.paired.json`):"
             " the median over rounds of planted - fixed, [min, max] over rounds.", "",
             "| loop | planted ms (n) [min-max] | fixed ms (n) [min-max] | saving ms [range] | saving % | "
             "planted/fixed (H200 estimate) | wall/median (planted, fixed) | paired saving ms [range] (rounds) |",
             "|---|---|---|---|---|---|---|---|"]

    def cell(v):
        if v["median_ms"] is None:
            return "—"
        s = v["spread"]
        return f"{v['median_ms']:.4f} ({len(v['periods_ms_per_process'])}) [{s['min_ms']:.4f}-{s['max_ms']:.4f}]"

    for r in rows:
        p, f = r["planted"], r["fixed"]
        if "saving_ms" in r:
            lo, hi = r["saving_range_ms"]
            sav = f"{r['saving_ms']:.4f} [{lo:.4f}, {hi:.4f}]"
            pct = f"{100 * r['saving_fraction']:.1f}"
        else:
            sav = pct = "—"
        exp = r.get("expected_ratio")
        ratio = (f"{r['ratio']:.2f}" if "ratio" in r else "—") + (f" ({exp[0]}-{exp[1]})" if exp else "")
        wr = ", ".join(f"{v['wall_median_ms'] / v['median_ms']:.2f}" if v["median_ms"] else "—" for v in (p, f))
        pr = r.get("paired")
        pcell = (f"{pr['saving_ms']:.4f} [{pr['saving_range_ms'][0]:.4f}, {pr['saving_range_ms'][1]:.4f}] "
                 f"({pr['blocks']})") if pr else "—"
        lines.append(f"| {r['loop']} | {cell(p)} | {cell(f)} | {sav} | {pct} | {ratio} | {wr} | {pcell} |")
    big = [f"{t} ({os.path.getsize(os.path.join(settings['out'], t)) / 1e6:.1f} MB)" for r in rows
           for v in VARIANTS for t in [r[v].get("trace")] if t and "out" in settings
           and os.path.getsize(os.path.join(settings["out"], t)) > 2e6]
    if big:
        lines += ["", "Traces over 2 MB: " + ", ".join(big)]
    lines += ["", "A wall/median ratio far from 1 means the host ran ahead of the device (or stalled) within the "
              "process: the median of host intervals then is not the device-bound period.", ""]
    return "\n".join(lines)


def bundle(out: str, path: str) -> None:
    """Every file directly under ``out`` into one tar.gz at ``path`` (temporary name, then rename)."""
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=".tar.gz")
    os.close(fd)
    try:
        with tarfile.open(tmp, "w:gz") as tar:
            for name in sorted(os.listdir(out)):
                p = os.path.join(out, name)
                if os.path.isfile(p) and not name.startswith(".tmp-") and os.path.abspath(p) != os.path.abspath(path):
                    tar.add(p, arcname=f"pairs/{name}")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def round_estimate_s(procs: list[dict], loops: list[str]) -> float:
    """Seconds one measurement round of ``loops`` is expected to take: per loop x variant, the mean wall time of
    its measurement processes so far, else of its capture (a capture runs the same build and warm-up), else the
    mean of all processes so far (0 before any)."""
    every = [p["wall_s"] for p in procs]
    total = 0.0
    for loop in loops:
        for v in VARIANTS:
            mine = [p["wall_s"] for p in procs if p["loop"] == loop and p["variant"] == v and p["kind"] == "measure"]
            mine = mine or [p["wall_s"] for p in procs if p["loop"] == loop and p["variant"] == v]
            total += statistics.fmean(mine or every or [0.0])
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.loops.run_pairs",
                                 description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loops", default=",".join(LOOP_MODULES), help="comma list (default: all)")
    ap.add_argument("--processes", type=int, default=5, help="measurement processes per variant (default 5)")
    ap.add_argument("--steps", type=int, default=300, help="measured steps per process (default 300)")
    ap.add_argument("--warmup", type=int, default=30, help="unprofiled warm-up steps per process (default 30)")
    ap.add_argument("--trace-steps", type=int, default=8, help="profiled steps per capture (default 8)")
    ap.add_argument("--paired-blocks", type=int, default=8,
                    help="rounds of paired blocks in each planted capture's process, both variants (default 8; 0: none)")
    ap.add_argument("--paired-steps", type=int, default=30, help="steps per paired block (default 30)")
    ap.add_argument("--no-capture", action="store_true", help="measure only")
    ap.add_argument("--no-measure", action="store_true", help="capture only")
    ap.add_argument("--round-offset", type=int, default=0,
                    help="number the measurement files from this round on (a second call adding rounds to the "
                         "same loops: unpack both bundles into one folder, then --summarize-only)")
    ap.add_argument("--summarize-only", action="store_true",
                    help="run nothing: rewrite the LOOP.pairs.json files and summary.md from the files in --out")
    ap.add_argument("--size", action="append", default=[], metavar="LOOP.KEY=VALUE",
                    help="override one entry of a loop's size preset, e.g. graph_readback.layers=4 (repeatable; "
                         "the sizes used are in every measurement file)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--out", required=True, help="directory for the flat output files (made if missing)")
    ap.add_argument("--bundle", help="also write everything in --out to this tar.gz")
    ap.add_argument("--budget-s", type=float, default=450.0, help="stop starting rounds past this (default 450)")
    ap.add_argument("--process-timeout-s", type=float, default=120.0, help="per process (default 120)")
    a = ap.parse_args(argv)
    loops = [s for s in a.loops.split(",") if s]
    bad = [s for s in loops if s not in LOOP_MODULES]
    if bad:
        ap.error(f"unknown loop {bad[0]!r} (known: {', '.join(LOOP_MODULES)})")
    if (not loops or a.processes < 0 or a.round_offset < 0 or a.steps < 3 or a.warmup < 1 or a.trace_steps < 1
            or a.budget_s <= 0 or a.paired_blocks < 0 or a.paired_steps < 3):
        ap.error("need at least one loop, --processes >= 0, --round-offset >= 0, --steps >= 3, --warmup >= 1, "
                 "--trace-steps >= 1, --budget-s > 0")
    sizes: dict[str, list[str]] = {}
    for it in a.size:
        loop, dot, kv = it.partition(".")
        if not dot or loop not in LOOP_MODULES or "=" not in kv:
            ap.error(f"--size {it}: expected LOOP.KEY=VALUE with LOOP one of {', '.join(LOOP_MODULES)}")
        keys = loop_module(loop).CUDA_SIZE  # imports torch, only when --size is given
        if kv.partition("=")[0] not in keys:
            ap.error(f"--size {it}: {loop} has no size {kv.partition('=')[0]!r} (its sizes: {', '.join(keys)})")
        sizes.setdefault(loop, []).append(kv)
    if os.path.exists(a.out) and not os.path.isdir(a.out):
        ap.error(f"--out {a.out}: exists and is not a directory")
    os.makedirs(a.out, exist_ok=True)
    t0 = time.perf_counter()
    procs: list[dict] = []
    common = ["--device", a.device, "--warmup", str(a.warmup)]

    def left() -> float:
        return a.budget_s - (time.perf_counter() - t0)

    def go(kind: str, loop: str, v: str, extra: list[str]) -> dict:
        target = extra[extra.index("--out") + 1]
        if os.path.isfile(target):  # an earlier run's file of this name must not stand in for a failed process
            os.unlink(target)
        size_args = [x for kv in sizes.get(loop, []) for x in ("--size", kv)]
        r = run_process([kind, loop, v, *common, *size_args, *extra], a.process_timeout_s)
        r.update(kind=kind, loop=loop, variant=v)
        procs.append(r)
        status = "ok" if r["rc"] == 0 else f"FAILED rc={r['rc']}"
        print(f"[{time.perf_counter() - t0:7.1f}s] {kind:7s} {loop}.{v}: {r['wall_s']:.1f}s {status}", flush=True)
        if r["rc"] != 0:
            print(r["stderr_tail"][-600:], file=sys.stderr, flush=True)
        return r

    if a.summarize_only:
        a.no_capture = a.no_measure = True
    if not a.no_capture:
        for loop in loops:
            for v in VARIANTS:
                if left() <= 0:
                    print(f"budget: no time left for the capture of {loop}.{v}", flush=True)
                    continue
                pair_args = (["--paired-blocks", str(a.paired_blocks), "--paired-steps", str(a.paired_steps),
                              "--paired-out", os.path.join(a.out, f"{loop}.paired.json")]
                             if v == "planted" and a.paired_blocks else [])
                go("capture", loop, v, [*pair_args, "--active", str(a.trace_steps),
                                        "--out", os.path.join(a.out, f"{loop}.{v}.trace.json.gz"),
                                        "--info", os.path.join(a.out, f"{loop}.{v}.capture.json")])
    rounds = 0
    for k in range(0 if a.no_measure else a.processes):
        est = round_estimate_s(procs, loops)
        if (k > 0 or not a.no_capture) and est > left():
            print(f"budget: round {k + 1} would take ~{est:.0f}s, {left():.0f}s left; stopping after {k} rounds",
                  flush=True)
            break
        order = VARIANTS if (k + a.round_offset) % 2 == 0 else VARIANTS[::-1]
        for loop in loops:
            for v in order:
                go("measure", loop, v, ["--steps", str(a.steps),
                                        "--out", os.path.join(a.out, f"{loop}.{v}.m{k + a.round_offset}.json")])
        rounds += 1
    rows = []
    for loop in loops:
        r = summarize_loop(loop, a.out)
        _write_json(os.path.join(a.out, f"{loop}.pairs.json"), r)
        rows.append(r)
    settings = {"loops": loops, "processes": a.processes, "rounds_run": rounds, "steps": a.steps,
                "warmup": a.warmup, "trace_steps": a.trace_steps, "device": a.device, "budget_s": a.budget_s,
                "out": os.path.abspath(a.out), "size_overrides": sizes,
                "device_name": next((r.get("device_name") for r in rows if r.get("device_name")), None),
                "python": sys.executable, "wall_s": round(time.perf_counter() - t0, 1)}
    _write_text_atomic(os.path.join(a.out, "summary.md"), summary_markdown(rows, settings))
    if not a.summarize_only:
        run_json = ("run.captures.json" if a.no_measure else f"run.m{a.round_offset}.json" if a.no_capture
                    else "run.json")  # one name per kind of call, so merged calls keep each record
        _write_json(os.path.join(a.out, run_json), {"settings": settings, "processes": procs})
    if a.bundle:
        bundle(a.out, a.bundle)
    print(open(os.path.join(a.out, "summary.md")).read())
    failed = [p for p in procs if p["rc"] != 0]
    if failed:
        print(f"{len(failed)} of {len(procs)} processes failed (run.json has their stderr)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
