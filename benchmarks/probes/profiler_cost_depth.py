"""Does the profiler's cost per recorded event depend on the Python stack depth it is recorded at (under
``with_stack=True``), or on the kind of op?

    python -m benchmarks.probes.profiler_cost_depth [--device cuda] [--ops 2000] [--repeats 5] --out DIR

For each stack depth d (a chain of d nested Python calls above the loop) and each op kind (a tiny in-place ATen op,
a tiny eager kernel launch through an out-of-place op, a strided ``.contiguous()`` copy), the loop of ``--ops`` ops is
timed without the profiler and under gaptrace's profiler settings (:func:`gaptrace.capture.profiler_kwargs`), each
the best of ``--repeats``; the extra host time per recorded event (ATen ops + Python frames + runtime calls counted
in the profiled run's own trace) is printed as a table: µs per op and µs per recorded event, by depth and kind.
On the CPU (``--device cpu``) it is the smoke run the tests make. Writes ``profiler_cost_depth.json`` and ``.md``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

# run as ``python -m benchmarks.probes.NAME`` or by path: the repository root on the path either way
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from benchmarks._results import out_dir_arg  # noqa: E402


MAX_DEPTH = 500  # Python frames a measured op sits under (well inside the interpreter's recursion limit)


def _nest(depth: int, fn):
    if depth <= 0:
        return fn()
    return _nest(depth - 1, fn)


def _kinds(torch, device):
    x = torch.zeros(64, device=device)
    y = torch.zeros(8, 64, device=device)
    return {
        "inplace_add": lambda: x.add_(1.0),
        "eager_mul": lambda: x * 2.0,
        "strided_copy": lambda: y[:, :32].contiguous(),
    }


def _time(torch, device, op, n: int) -> float:
    def loop():
        for _ in range(n):
            op()
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    loop()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def run(device_name: str, ops: int, repeats: int, depths: list[int]) -> list[dict]:
    import torch
    from gaptrace.capture import profiler_kwargs
    from gaptrace.loader import load_trace

    device = torch.device(device_name)
    rows = []
    for kind, op in _kinds(torch, device).items():
        for d in depths:
            run_at = lambda: _nest(d, lambda: _time(torch, device, op, ops))
            run_at()  # warm-up
            plain = min(run_at() for _ in range(repeats))
            prof_s, counts = [], None
            for r in range(repeats):
                with tempfile.TemporaryDirectory() as tmp:
                    path = os.path.join(tmp, "t.json")
                    with torch.profiler.profile(**profiler_kwargs(with_stack=True)) as prof:
                        prof_s.append(run_at())
                    if r == 0:
                        prof.export_chrome_trace(path)
                        h = load_trace(path).host
                        c = h["cat"].astype(str).value_counts().to_dict()
                        counts = {k: int(c.get(k, 0)) for k in ("cpu_op", "python_function", "cuda_runtime")}
            extra_us = (min(prof_s) - plain) * 1e6
            events = sum(counts.values())
            rows.append({"kind": kind, "depth": d, "ops": ops, "plain_us_per_op": plain * 1e6 / ops,
                         "profiled_us_per_op": min(prof_s) * 1e6 / ops, "extra_us_per_op": extra_us / ops,
                         "events": counts, "extra_us_per_event": extra_us / events if events else None})
    return rows


def table(rows: list[dict]) -> str:
    out = ["| op | stack depth | plain µs/op | profiled µs/op | extra µs/op | cpu_op / python_function / cuda_runtime "
           "events | extra µs per event |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        e = r["events"]
        out.append(f"| {r['kind']} | {r['depth']} | {r['plain_us_per_op']:.2f} | {r['profiled_us_per_op']:.2f} | "
                   f"{r['extra_us_per_op']:.2f} | {e['cpu_op']} / {e['python_function']} / {e['cuda_runtime']} | "
                   f"{r['extra_us_per_event']:.2f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--depths", default="2,20,60")
    ap.add_argument("--out", required=True, type=out_dir_arg)
    a = ap.parse_args(argv)
    try:
        depths = [int(x) for x in a.depths.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--depths must be integers, comma-separated (got {a.depths!r})")
    if a.ops < 1 or a.repeats < 1 or not depths or min(depths) < 0 or max(depths) > MAX_DEPTH:
        ap.error(f"--ops and --repeats must be >= 1, --depths from 0 to {MAX_DEPTH}")
    if a.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            ap.error("--device cuda: no CUDA device is visible to torch (--device cpu runs without one)")
    rows = run(a.device, a.ops, a.repeats, depths)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "profiler_cost_depth.json"), "w") as f:
        json.dump(rows, f, indent=1)
    md = table(rows)
    with open(os.path.join(a.out, "profiler_cost_depth.md"), "w") as f:
        f.write(md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
