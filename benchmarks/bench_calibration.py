"""Does a calibration's per-event cost predict what the profiler costs a loop it was not measured on?

For each measured loop of ``benchmarks/loops`` (planted and fixed variants; none of them is a calibration
benchmark), in a fresh process: the loop's step timed without the profiler and with it (gaptrace's settings,
:func:`gaptrace.capture.profiler_kwargs`), Δ = profiled − plain µs a step (each the minimum over ``--blocks``
blocks of ``--steps`` steps, so that noise only adds), and the events one profiled block records, by category, a
step (every thread: a helper thread's events lengthen the main thread's waits). The prediction of calibration C is
Σ_c n_c · cost_c (docs/DESIGN.md "The profiler taken out"; the categories as the replay charges them,
:data:`gaptrace.analyses.profiler_cost.COST_KEYS`).

    .venv/bin/python benchmarks/bench_calibration.py [--device cpu|cuda] [--calibration FILE ...] [--out PATH]

Without ``--calibration``: the shipped calibration of this machine's GPU model (the CPU build machine's without a
GPU) and a fresh ``gaptrace calibrate`` run in this process's machine. Prints one markdown table (loop, plain µs,
measured Δ, and per calibration the predicted Δ and the ratio measured / predicted) and the median ratio per
calibration; ``--out`` also writes the raw rows (JSON) beside the markdown.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# train_step_logging profiles itself (run_profiled); hf_generate needs transformers and minutes on CPU
SKIP = ("train_step_logging", "hf_generate")


def loop_names(skip: tuple[str, ...] = SKIP) -> list[str]:
    """The loop modules of ``benchmarks/loops`` (not its driver), less ``skip``."""
    d = os.path.join(ROOT, "benchmarks", "loops")
    return sorted(f[:-3] for f in os.listdir(d)
                  if f.endswith(".py") and not f.startswith("_") and f[:-3] not in skip and f != "run_pairs.py")


def measure_one(loop: str, variant: str, device: str, steps: int, blocks: int) -> dict:
    """One loop variant in this process: plain and profiled µs a step, events a step by category."""
    import importlib

    import torch
    import torch.profiler as tp

    from benchmarks.loops._common import resolve_device
    from gaptrace.capture import profiler_kwargs

    dev = resolve_device(device)
    lp = importlib.import_module(f"benchmarks.loops.{loop}").build(variant, dev)

    def block() -> float:
        lp.sync()
        t = time.perf_counter()
        for _ in range(steps):
            lp.step()
        lp.sync()
        return (time.perf_counter() - t) / steps * 1e6

    block()
    plain = min(block() for _ in range(blocks))
    with tp.profile(**profiler_kwargs(True)):
        block()
        prof = min(block() for _ in range(blocks))
    with tp.profile(**profiler_kwargs(True)) as p:
        block()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        p.export_chrome_trace(path)
        with open(path, encoding="utf-8") as f:
            ev = json.load(f).get("traceEvents", [])
    finally:
        os.remove(path)
    counts: dict[str, int] = {}
    for e in ev:
        if e.get("ph") == "X" and isinstance(e.get("cat"), str):
            counts[e["cat"]] = counts.get(e["cat"], 0) + 1
    return {"loop": loop, "variant": variant, "device": device, "steps": steps, "blocks": blocks,
            "plain_us": plain, "profiled_us": prof, "delta_us": prof - plain,
            "events_per_step": {c: n / steps for c, n in counts.items()}}


def predicted_us(events: dict[str, float], cal) -> float:
    from gaptrace.analyses.profiler_cost import COST_KEYS

    return sum(n * cal.cost_of(c) for c, n in events.items() if c in COST_KEYS)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--calibration", action="append", default=None)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--loops", default=None, help="comma-separated loop names (default: all but " + ", ".join(SKIP) + ")")
    ap.add_argument("--out", default=None, help="write PATH.md and PATH.json")
    ap.add_argument("--one", nargs=2, metavar=("LOOP", "VARIANT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(measure_one(a.one[0], a.one[1], a.device, a.steps, a.blocks)))
        return 0
    from gaptrace.analyses.profiler_cost import load_calibration, shipped_calibration_path
    from gaptrace.outputs import resolve_output

    # every argument checked before anything is measured: one line, exit 2
    if a.steps < 1 or a.blocks < 1:
        ap.error(f"--steps and --blocks must be >= 1 (got {a.steps}, {a.blocks})")
    loops = loop_names() if a.loops is None else [x.strip() for x in a.loops.split(",") if x.strip()]
    unknown = [x for x in loops if x not in loop_names(())]
    if unknown or not loops:
        ap.error((f"--loops: unknown loop {', '.join(unknown)}" if unknown else "--loops: no loop named")
                 + "; the loops: " + ", ".join(loop_names(())))
    if a.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            ap.error("--device cuda: no CUDA device is visible to torch")
    if a.out is not None:
        if not a.out or a.out.endswith(os.sep) or not os.path.basename(a.out):
            ap.error(f"--out {a.out!r}: give a path prefix (PATH.md and PATH.json are written)")
        try:
            for ext in (".md", ".json") + ((".calibration.json",) if not a.calibration else ()):
                resolve_output(a.out + ext)
        except ValueError as e:
            ap.error(f"--out: {e}")
    cals = []
    for p in a.calibration or []:
        try:
            cals.append(load_calibration(p))
        except (OSError, ValueError) as e:
            ap.error(f"--calibration {p}: {e}")
    cal_paths = a.calibration
    if not cal_paths:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        shipped = shipped_calibration_path(gpu) if gpu else os.path.join(ROOT, "analyses", "data",
                                                                         "calibration_cpu_epyc.json")
        # the fresh calibration is kept beside the results (PATH.calibration.json) when --out is given: the table
        # cites it; without --out it lives in a temporary directory for the run only
        tmpdir = None
        if a.out:
            fresh = a.out + ".calibration.json"
        else:
            tmpdir = tempfile.TemporaryDirectory(prefix="gaptrace-bench-cal-")
            fresh = os.path.join(tmpdir.name, "fresh.json")
        try:
            r = subprocess.run([sys.executable, "-m", "gaptrace.cli", "calibrate", "-o", fresh],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if r.returncode != 0:
                ap.exit(1, f"bench_calibration.py: gaptrace calibrate failed: "
                           f"{(r.stderr.strip().splitlines() or ['?'])[-1]}\n")
            cals = [load_calibration(p) for p in (shipped, fresh)]
        finally:
            if tmpdir is not None:
                tmpdir.cleanup()
        cal_paths = [shipped, fresh if a.out else "a fresh `gaptrace calibrate` of this run (not kept)"]
    rows = []
    for loop in loops:
        for variant in ("planted", "fixed"):
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", loop, variant, "--device", a.device,
                                "--steps", str(a.steps), "--blocks", str(a.blocks)],
                               capture_output=True, text=True, cwd=ROOT)
            if r.returncode != 0:
                print(f"{loop} {variant}: failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}", file=sys.stderr)
                continue
            rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
    header = ["loop", "variant", "plain µs a step", "measured Δ µs"]
    for i, c in enumerate(cals):
        header += [f"predicted Δ µs [{i + 1}]", f"measured / predicted [{i + 1}]"]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    ratios: list[list[float]] = [[] for _ in cals]
    for r in rows:
        cells = [r["loop"], r["variant"], f"{r['plain_us']:.1f}", f"{r['delta_us']:.1f}"]
        r["predicted_delta_us"] = []
        for i, c in enumerate(cals):
            p = predicted_us(r["events_per_step"], c)
            q = r["delta_us"] / p if p > 0 else float("nan")
            if r["delta_us"] > 0:  # a step the profiler did not slow down: noise larger than its cost, no ratio
                ratios[i].append(q)
            r["predicted_delta_us"].append(p)
            cells += [f"{p:.1f}", f"{q:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    noise = sum(r["delta_us"] <= 0 for r in rows)
    text = [f"Device {a.device}; {a.blocks} blocks of {a.steps} steps, the minimum of each; every thread's events."
            + (f" {noise} loop variant(s) with a measured Δ <= 0 (noise larger than the profiler's cost: a device-bound"
               " step) are in the table but not in the medians." if noise else ""), ""]
    for i, (p, c) in enumerate(zip(cal_paths, cals)):
        ok = [q for q in ratios[i] if q == q]
        med = statistics.median(ok) if ok else float("nan")
        text.append(f"[{i + 1}] {p} ({c.measured_on}): aten {c.aten_op_us:.3f} µs, python frame "
                    f"{c.python_frame_us:.3f} µs, runtime-call cost {c.runtime_call_us:.3f} µs; median measured / "
                    f"predicted {med:.2f} over {len(ok)} loop variants with Δ > 0, range "
                    f"{min(ok, default=float('nan')):.2f}–"
                    f"{max(ok, default=float('nan')):.2f}")
    out = "\n".join(text + [""] + lines)
    print(out)
    if a.out:
        from gaptrace.outputs import write_text_atomic

        write_text_atomic(a.out + ".md", "# Profiler cost on loops no calibration measured\n\n"
                          "`.venv/bin/python benchmarks/bench_calibration.py " + " ".join(sys.argv[1:]) + "`\n\n"
                          + out + "\n")
        write_text_atomic(a.out + ".json", json.dumps({"calibrations": [dict(c.to_dict(), path=p) for p, c in
                                                                         zip(cal_paths, cals)],
                                                        "rows": rows}, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
