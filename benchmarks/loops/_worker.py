"""One fresh process of the driver: measure one loop variant unprofiled, or capture its profiled trace.

    python -m benchmarks.loops._worker measure LOOP VARIANT --device cuda --warmup 30 --steps 300 --out m.json
    python -m benchmarks.loops._worker capture LOOP VARIANT --device cuda --warmup 10 --active 8 --out t.json.gz

``measure`` writes one JSON object: the host timestamps' step periods (``time.perf_counter`` at each step start;
the device is synchronized only before the first and after the last measured step), their median over the steady
part (the first ``skip_fraction`` of the periods dropped as ramp-up), and the wall period (synchronized span /
steps), which equals the median when the host cannot run ahead of the device by more than a step or two.

``capture`` writes the gzipped Kineto trace of ``active`` steps after ``warmup`` unprofiled steps and one
profiler warm-up step, with gaptrace's profiler settings (:func:`gaptrace.capture.profiler_kwargs` through
:class:`gaptrace.capture.Capture`, which also writes the ``.gaptrace.json`` sidecar next to it); where gaptrace
cannot be imported the same settings are replicated here. A loop module with ``run_profiled`` (the ProfilerStep
loop) is profiled by its own code with the same settings.

Exit status 0 when the output was written, 2 on bad arguments, 1 when the loop failed (the error on stderr).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

from . import readable

SKIP_FRACTION = 0.1


def _write_json(path: str, obj: dict) -> None:
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=1, sort_keys=True)
        readable(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def profiler_kwargs() -> tuple[dict, str]:
    """gaptrace's torch.profiler keyword arguments and where they came from ('gaptrace.capture' or 'replicated')."""
    try:
        from gaptrace.capture import profiler_kwargs as pk
        return pk(with_stack=True), "gaptrace.capture"
    except ImportError:
        import torch
        from torch.profiler import ProfilerActivity

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        kw = {"activities": acts, "with_stack": True, "record_shapes": False}
        try:
            kw["experimental_config"] = torch.profiler._ExperimentalConfig(enable_cuda_sync_events=True)
        except (AttributeError, TypeError):
            pass
        return kw, "replicated"


def _env(device) -> dict:
    import torch

    return {"torch": torch.__version__, "cuda": torch.version.cuda, "pid": os.getpid(),
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "python": sys.version.split()[0]}


def timed_steps(loop, steps: int) -> tuple[list[float], float]:
    """Run ``steps`` steps of ``loop``, the device synchronized before the first and after the last; returns the
    step-start intervals (ms, ``steps - 1`` of them) and the synchronized wall time per step (ms)."""
    loop.sync()
    ts: list[float] = []
    t0 = time.perf_counter()
    loop.run(steps, lambda: ts.append(time.perf_counter()))
    loop.sync()
    t1 = time.perf_counter()
    starts = ts[:steps]
    return [(b - a) * 1e3 for a, b in zip(starts, starts[1:])], (t1 - t0) * 1e3 / steps


def measure(loop, device, warmup: int, steps: int) -> dict:
    """Warm ``loop`` up for ``warmup`` steps, then time ``steps`` steps (see the module docstring). Periods in ms."""
    loop.run(warmup, lambda: None)
    periods, wall_ms = timed_steps(loop, steps)
    steady = periods[int(len(periods) * SKIP_FRACTION):] or periods
    q = statistics.quantiles(steady, n=10) if len(steady) >= 2 else [steady[0]] * 9
    return {"steps": steps, "warmup": warmup, "skip_fraction": SKIP_FRACTION,
            "median_period_ms": statistics.median(steady), "mean_period_ms": statistics.fmean(steady),
            "p10_period_ms": q[0], "p90_period_ms": q[-1], "wall_period_ms": wall_ms,
            "step_periods_ms": [round(p, 5) for p in periods]}


def paired(loops: dict, blocks: int, steps: int) -> dict:
    """Both variants' unprofiled step periods measured in one process: ``blocks`` rounds, each a block of ``steps``
    steps of every variant, the variants' order alternating round by round (planted first in even rounds). A block's
    figure is the median of its step-start intervals after the first ``skip_fraction`` of them; the saving of round
    b is planted_b − fixed_b, and the pair's paired saving is the median over rounds, its range the min and max.
    Pairing in one process removes the process-to-process spread of a host-bound loop's period from the
    difference (both variants run on the same interpreter, allocator, CPU core and clocks). ``loops``: variant →
    loop, both warmed up. Periods in ms."""
    out = {v: [] for v in loops}
    for b in range(blocks):
        for v in (("planted", "fixed") if b % 2 == 0 else ("fixed", "planted")):
            periods, _ = timed_steps(loops[v], steps)
            out[v].append(statistics.median(periods[int(len(periods) * SKIP_FRACTION):] or periods))
    diff = [p - f for p, f in zip(out["planted"], out["fixed"])]
    return {"blocks": blocks, "block_steps": steps, "skip_fraction": SKIP_FRACTION,
            "block_median_ms": out, "saving_per_block_ms": diff,
            "saving_ms": statistics.median(diff), "saving_range_ms": [min(diff), max(diff)],
            "median_ms": {v: statistics.median(x) for v, x in out.items()}}


def capture(mod, loop, trace_path: str, warmup: int, active: int, config: dict) -> dict:
    """Write the gzipped trace (and, through gaptrace's Capture, its sidecar); returns what was written."""
    kw, source = profiler_kwargs()
    out = {"trace": os.path.basename(trace_path), "profiler_kwargs_from": source, "warmup": warmup,
           "active": active}
    if hasattr(mod, "run_profiled"):
        d = os.path.dirname(os.path.abspath(trace_path))
        fd, raw = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=".json")
        os.close(fd)
        try:
            mod.run_profiled(loop, raw, warmup, active, kw)
            fd, gz_tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=".json.gz")
            with os.fdopen(fd, "wb") as o, open(raw, "rb") as src, gzip.GzipFile(fileobj=o, mode="wb") as gz:
                shutil.copyfileobj(src, gz, 1 << 20)
            readable(gz_tmp)
            os.replace(gz_tmp, trace_path)
        finally:
            if os.path.exists(raw):
                os.unlink(raw)
        out["sidecar"] = None
    elif source == "gaptrace.capture":
        from gaptrace.capture import Capture

        with Capture(trace_path, warmup_steps=warmup, active_steps=active, config=config) as cap:
            first = [True]

            def tick():
                if first[0]:
                    first[0] = False
                else:
                    cap.step()

            loop.run(warmup + 1 + active, tick)
        out["sidecar"] = os.path.basename(cap.sidecar_out)
    else:
        import torch

        sched = torch.profiler.schedule(wait=warmup, warmup=1, active=active, repeat=1)
        raw = trace_path[: -len(".gz")] if trace_path.endswith(".gz") else trace_path + ".raw"
        with torch.profiler.profile(schedule=sched, on_trace_ready=lambda p: p.export_chrome_trace(raw),
                                    **kw) as prof:
            first = [True]

            def tick():
                if first[0]:
                    first[0] = False
                else:
                    prof.step()

            loop.run(warmup + 1 + active, tick)
        with open(raw, "rb") as src, gzip.open(trace_path + ".tmp", "wb") as gz:
            shutil.copyfileobj(src, gz, 1 << 20)
        os.replace(trace_path + ".tmp", trace_path)
        os.unlink(raw)
        out["sidecar"] = None
    out["trace_bytes"] = os.path.getsize(trace_path)
    return out


def size_override(preset: dict, items: list[str]) -> dict:
    """``preset`` with each ``key=value`` of ``items`` applied (the value parsed as the preset's type: int, float);
    ValueError naming the item when the key is not in the preset or the value does not parse."""
    out = dict(preset)
    for it in items:
        key, sep, val = it.partition("=")
        if not sep or key not in preset:
            raise ValueError(f"--size {it}: expected KEY=VALUE with KEY one of {', '.join(preset)}")
        try:
            out[key] = type(preset[key])(val)
        except ValueError:
            raise ValueError(f"--size {it}: {val!r} is not a {type(preset[key]).__name__}") from None
    return out


def main(argv: list[str] | None = None) -> int:
    from . import loop_module
    from ._common import check_variant, pick, resolve_device

    ap = argparse.ArgumentParser(prog="python -m benchmarks.loops._worker", description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("measure", "capture"))
    ap.add_argument("loop")
    ap.add_argument("variant", choices=("planted", "fixed"))
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--steps", type=int, default=300, help="measured steps (measure)")
    ap.add_argument("--active", type=int, default=8, help="profiled steps (capture)")
    ap.add_argument("--out", required=True, help="the measurement JSON (measure) or the .json.gz trace (capture)")
    ap.add_argument("--info", help="capture: also write what was captured to this JSON file")
    ap.add_argument("--paired-blocks", type=int, default=0,
                    help="capture: first measure both variants in this process, this many rounds of blocks (0: no)")
    ap.add_argument("--paired-steps", type=int, default=30, help="capture: steps per paired block (default 30)")
    ap.add_argument("--paired-out", help="capture: write the paired measurement to this JSON file")
    ap.add_argument("--size", action="append", default=[], metavar="KEY=VALUE",
                    help="override one entry of the loop's size preset for this device (repeatable)")
    a = ap.parse_args(argv)
    try:
        mod = loop_module(a.loop)
        check_variant(a.variant)
        device = resolve_device(a.device)
        size = size_override(pick(device, mod.CUDA_SIZE, mod.CPU_SIZE), a.size)
    except ValueError as e:
        ap.error(str(e))
    if a.warmup < 1 or a.steps < 3 or a.active < 1:
        ap.error("--warmup must be >= 1, --steps >= 3, --active >= 1")
    if a.paired_blocks < 0 or a.paired_steps < 3 or (a.paired_blocks and (a.mode != "capture" or not a.paired_out)):
        ap.error("--paired-blocks >= 0 needs capture mode and --paired-out; --paired-steps >= 3")
    if a.mode == "capture" and not a.out.endswith(".json.gz"):
        ap.error(f"--out {a.out}: a capture is written as .json.gz")
    if device.type == "cpu":
        import torch

        torch.set_num_threads(1)  # a CPU smoke run: no OpenMP thread pool spinning on a shared machine
    t_start = time.perf_counter()
    loop = mod.build(a.variant, device, size)
    t_built = time.perf_counter()
    try:
        head = {"loop": a.loop, "variant": a.variant, "device": a.device, "cause": mod.CAUSE, "fix": mod.FIX,
                "site": mod.SITE, "size": size,
                "expected_ratio": list(mod.EXPECTED_RATIO), "build_s": t_built - t_start, **_env(device)}
        if a.mode == "measure":
            res = {**head, **measure(loop, device, a.warmup, a.steps)}
            _write_json(a.out, res)
        else:
            loop.run(a.warmup, lambda: None)  # as the measurement does; the capture's own wait steps follow
            loop.sync()
            if a.paired_blocks:
                other = "fixed" if a.variant == "planted" else "planted"
                twin = mod.build(other, device, size)
                try:
                    twin.run(a.warmup, lambda: None)
                    pr = paired({a.variant: loop, other: twin}, a.paired_blocks, a.paired_steps)
                finally:
                    if hasattr(twin, "close"):
                        twin.close()
                _write_json(a.paired_out, {**head, "trace": os.path.basename(a.out), **pr})
                loop.run(a.warmup, lambda: None)  # the captured variant warm again after its twin ran
                loop.sync()
            res = {**head, **capture(mod, loop, a.out, a.warmup, a.active,
                                     {"loop": a.loop, "variant": a.variant, "device": a.device})}
            if a.info:
                _write_json(a.info, res)
    finally:
        if hasattr(loop, "close"):
            loop.close()
    print(json.dumps({k: v for k, v in res.items() if k != "step_periods_ms"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
