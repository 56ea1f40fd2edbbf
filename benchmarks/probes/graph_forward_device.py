"""What graphing a loop's eager forward changes on the device and on the host: the terms the replay needs to
predict that fix (docs/DESIGN.md 5.1 "queued-launch gap", 5.2 "The profiler taken out").

For each loop's forward (benchmarks/loops/_common.py ``TinyDecoder`` at the loop's CUDA size), eager and captured in
one CUDA graph (``TinyDecoder.forward_for(batch, graphed=True)``: the ids copied into a static buffer, one replay):

- device µs per forward, ``--calls`` forwards between two CUDA events, queued (the stream held by
  ``torch.cuda._sleep`` while they are launched, so every kernel follows the previous one) and paced (launched as the
  host goes, no sleep); the minimum over 7 runs;
- host µs per forward call (``time.perf_counter`` around ``--calls`` calls made while the stream is held), median of 7;
- under the profiler (gaptrace's settings), queued: kernels per forward, their summed duration, and the median gap
  between one kernel's end and the next one's start.

    python benchmarks/probes/graph_forward_device.py --device cuda --out results
    python benchmarks/probes/graph_forward_device.py --device cpu --loops per_request_readback --calls 2   # smoke

On CPU only the eager host time is measured (no CUDA graphs, no device times).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), os.path.dirname(os.path.dirname(HERE))]  # benchmarks/ (_results), the repo

from _results import fmt, machine, md_table, out_dir_arg, print_and_write  # noqa: E402

LOOPS = ("per_request_readback", "host_detokenize", "helper_thread", "mask_index")
HOLD_CYCLES = 50_000_000  # torch.cuda._sleep: ~25 ms, longer than launching --calls forwards takes


def _kernels(path: str) -> list[tuple[float, float]]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        ev = json.load(f)["traceEvents"]
    ks = sorted((float(e["ts"]), float(e["dur"])) for e in ev if e.get("cat") == "kernel" and e.get("ph") == "X")
    return [k for k in ks if k[1] < 10_000]  # the sleep kernel is no part of a forward


def measure(loop: str, device, calls: int) -> dict:
    """One loop's forward, eager and graphed (module docstring); device figures None on CPU."""
    import torch

    from benchmarks.loops import loop_module
    from benchmarks.loops._common import TinyDecoder, pick
    from gaptrace.capture import profiler_kwargs

    sz = pick(device, loop_module(loop).CUDA_SIZE, loop_module(loop).CPU_SIZE)
    model = TinyDecoder(device, sz["d"], sz["layers"], sz["vocab"])
    tokens = torch.randint(0, sz["vocab"], (sz["batch"],), device=device)
    cuda = device.type == "cuda"
    variants = {"eager": model.forward_for(sz["batch"], False)}
    if cuda:
        variants["graphed"] = model.forward_for(sz["batch"], True)

    def device_us(fn, queued: bool) -> float:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()  # SYNC (deliberate): each run starts on a drained device
        if queued:
            torch.cuda._sleep(HOLD_CYCLES)
        a.record()
        for _ in range(calls):
            fn(tokens)
        b.record()
        b.synchronize()
        return a.elapsed_time(b) * 1e3 / calls

    def host_us(fn) -> float:
        if cuda:
            torch.cuda.synchronize()  # SYNC (deliberate): the calls are timed on a held stream, none waits
            torch.cuda._sleep(4 * HOLD_CYCLES)
        t = time.perf_counter()
        for _ in range(calls):
            fn(tokens)
        h = (time.perf_counter() - t) * 1e6 / calls
        if cuda:
            torch.cuda.synchronize()
        return h

    out: dict = {"loop": loop, "size": sz}
    for name, fn in variants.items():
        fn(tokens)
        out[f"{name}_host_us"] = statistics.median(host_us(fn) for _ in range(7))
        if not cuda:
            continue
        for _ in range(3):
            device_us(fn, True)
        out[f"{name}_queued_device_us"] = min(device_us(fn, True) for _ in range(7))
        out[f"{name}_paced_device_us"] = min(device_us(fn, False) for _ in range(7))
        fd, path = tempfile.mkstemp(suffix=".json.gz")
        os.close(fd)
        try:
            with torch.profiler.profile(**profiler_kwargs(True)) as prof:
                out[f"{name}_queued_device_us_profiled"] = device_us(fn, True)
            prof.export_chrome_trace(path)
            ks = _kernels(path)
        finally:
            os.remove(path)
        gaps = [ts - (ts0 + d0) for (ts0, d0), (ts, _d) in zip(ks, ks[1:])]
        out[f"{name}_kernels_per_call"] = len(ks) / calls
        out[f"{name}_kernel_busy_per_call_us"] = sum(d for _t, d in ks) / calls
        out[f"{name}_gap_median_us"] = statistics.median(gaps) if gaps else None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--loops", default=",".join(LOOPS), help=f"comma list of {', '.join(LOOPS)}")
    ap.add_argument("--calls", type=int, default=20, help="forwards per timed run")
    ap.add_argument("--out", default=None, type=out_dir_arg, help="write JSON + markdown here")
    a = ap.parse_args(argv)
    loops = [x.strip() for x in a.loops.split(",") if x.strip()]
    bad = [x for x in loops if x not in LOOPS]
    if not loops:
        ap.error("--loops: name at least one loop")
    if bad:
        ap.error(f"unknown loop {bad[0]!r} (known: {', '.join(LOOPS)})")
    if a.calls < 1:
        ap.error("--calls must be >= 1")
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device")
    device = torch.device(a.device)
    rows, data = [], {"machine": machine(), "calls": a.calls, "loops": []}
    for loop in loops:
        r = measure(loop, device, a.calls)
        data["loops"].append(r)
        rows.append([loop, fmt(r.get("eager_queued_device_us"), 1), fmt(r.get("graphed_queued_device_us"), 1),
                     fmt(r.get("eager_kernel_busy_per_call_us"), 1), fmt(r.get("eager_gap_median_us")),
                     fmt(r.get("graphed_gap_median_us")), fmt(r.get("eager_queued_device_us_profiled"), 1),
                     fmt(r.get("eager_host_us"), 1), fmt(r.get("graphed_host_us"), 1)])
    md = md_table(["loop forward", "eager queued device µs", "graphed device µs", "eager kernel busy µs",
                   "eager gap µs (profiled)", "graph node gap µs (profiled)", "eager queued device µs profiled",
                   "eager host µs a call", "graphed host µs a call"], rows)
    return print_and_write(a.out, "graph_forward_device", data, md)


if __name__ == "__main__":
    raise SystemExit(main())
