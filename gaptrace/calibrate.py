"""``gaptrace calibrate [-o FILE]``: measure the profiler's host cost per recorded event on this machine.

Small benchmarks run with and without ``torch.profiler`` (the settings of ``gaptrace capture``:
:func:`gaptrace.capture.profiler_kwargs`): a chain of Python calls (python_function events), a loop of tiny ATen
ops (cpu_op events, with their Python frames), with CUDA a loop of tiny kernel launches (cuda_runtime events), and
two model benchmarks (an eager ``nn.Module`` forward and a sampling step with its host read-back, on the GPU when
there is one: :func:`_benchmarks`); and a CUDA graph of tiny kernels timed on the device (``device_op_us``: the
extra device time per graph node under the profiler).
For benchmark b, Δt_b = t_profiled − t_plain = Σ_c n_{b,c} · cost_c, n_{b,c} the events of category c its trace
holds; the costs are the non-negative least-squares solution per recorded event (:func:`fit_costs`;
docs/DESIGN.md "The replay model", "The profiler taken out"). Writes JSON (``aten_op_us``, ``python_frame_us``,
``runtime_call_us``, torch version, CPU model, device, the per-benchmark counts, times and fitted deltas)
atomically; with CUDA also ``graph_node_us``, the profiler's host cost per CUDA graph node at launch
(:func:`graph_node_host_us`: κ measured directly, the fallback where a trace's own launch fit has a single graph
size); without CUDA ``runtime_call_us`` and ``graph_node_us`` are 0 and
``runtime_call_measured`` / ``graph_node_measured`` false.
"""
from __future__ import annotations

import gzip
import json
import os
import platform
import tempfile
import time
from typing import Any, Callable

import click
import numpy as np

from gaptrace.capture import profiler_kwargs, write_json_atomic
from gaptrace.cli import fail

CATS = ("python_function", "cpu_op", "cuda_runtime")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


MODEL_ITERATIONS_DIVISOR = 100  # a model benchmark's iteration costs ~100 micro-benchmark iterations


def _benchmarks(torch, n: int) -> dict[str, tuple[Callable[[], None], int]]:
    """The benchmarks, by name, each (function, its iterations): three micro-benchmarks of ``n`` iterations (a
    chain of Python calls, tiny ATen ops, with CUDA tiny kernel launches) and two model benchmarks of
    ``n // MODEL_ITERATIONS_DIVISOR`` iterations (at least 10), on the GPU when there is one: an eager forward of
    eight ``nn.Linear`` + ``nn.LayerNorm`` + ``nn.GELU`` blocks (module calls, nested ATen ops, one launch each) and
    a sampling step (softmax, top-k, ``.tolist()`` and a Python list comprehension over the result, the host
    read-back of a decode loop). The micro-benchmarks alone measure a recorded event hot in the caches: a model's
    events cost the profiler 1.4–2 times as much
    (docs/DESIGN.md "The profiler taken out")."""
    def leaf(x):
        return x + 1

    def mid(x):
        return leaf(x) + leaf(x)

    def python_chain() -> None:
        x = 0
        for _ in range(n):
            x = mid(x) & 0xFFFF

    a = torch.ones(4)
    b = torch.ones(4)

    def aten_ops() -> None:
        for _ in range(n):
            torch.add(a, b)

    out = {"python_chain": (python_chain, n), "aten_ops": (aten_ops, n)}
    cuda = torch.cuda.is_available()
    if cuda:
        g = torch.ones(4, device="cuda")

        def cuda_launch() -> None:
            for _ in range(n):
                g.add_(1.0)
            torch.cuda.synchronize()  # SYNC (deliberate): the timing covers the launches' device work

        out["cuda_launch"] = (cuda_launch, n)
    dev = torch.device("cuda" if cuda else "cpu")
    m = max(10, n // MODEL_ITERATIONS_DIVISOR)
    nn = torch.nn
    gen = torch.Generator(device="cpu").manual_seed(0)
    mlp = nn.Sequential(*[nn.Sequential(nn.Linear(32, 32), nn.LayerNorm(32), nn.GELU()) for _ in range(8)])
    mlp = mlp.to(dev).eval()
    x = torch.randn(2, 32, generator=gen).to(dev)
    logits = torch.randn(4, 1000, generator=gen).to(dev)

    def module_forward() -> None:
        with torch.no_grad():
            for _ in range(m):
                mlp(x)
        if cuda:
            torch.cuda.synchronize()  # SYNC (deliberate): the timing covers the forwards' device work

    def sampling() -> None:
        for _ in range(m):
            p = torch.softmax(logits / 0.7, dim=-1)
            _, idx = torch.topk(p, 20)
            picked = idx[:, 0].tolist()  # SYNC (deliberate): a decode loop's read-back, as it costs unprofiled
            sum(t % 7 for t in picked)

    out["module_forward"] = (module_forward, m)
    out["sampling"] = (sampling, m)
    return out


def _count(path: str) -> dict[str, int]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        ev = json.load(f).get("traceEvents", [])
    counts = {c: 0 for c in CATS}
    for e in ev:
        c = e.get("cat")
        if c == "cuda_driver":
            c = "cuda_runtime"
        if c in counts and e.get("ph") == "X":
            counts[c] += 1
    return counts


def node_graph(torch, nodes: int, op: Callable[[], Any] | None = None):
    """A CUDA graph of ``nodes`` calls of ``op`` (default: ``x.add_(1.0)`` on a one-element tensor, one tiny kernel),
    captured after a side-stream warm-up as the CUDA graphs documentation prescribes."""
    if op is None:
        x = torch.zeros(1, device="cuda")

        def op():
            return x.add_(1.0)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            op()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(nodes):
            op()
    return g


def launch_host_us(torch, g, replays: int) -> float:
    """Median host µs of ``g.replay()`` (one ``cudaGraphLaunch``) over ``replays`` launches, each timed with
    ``time.perf_counter`` after the device drained (so no launch waits on a full queue)."""
    out = []
    for _ in range(replays):
        torch.cuda.synchronize()  # SYNC (deliberate): each launch starts on a drained device
        t = time.perf_counter()
        g.replay()
        out.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    return float(np.median(out)) * 1e6


def graph_node_host_us(torch, graph=None, nodes: int = 1000, replays: int = 30) -> float | None:
    """The profiler's host cost per CUDA graph node at launch (κ of docs/DESIGN.md "Launch fit", measured
    directly), µs: the host time of ``g.replay()`` (``cudaGraphLaunch``) for ``graph`` (else a new
    :func:`node_graph` of ``nodes`` tiny kernels), each launch timed with ``time.perf_counter`` after the device
    drained, with and without the profiler; (median_prof − median_plain) / nodes. The difference also holds the
    profiler's cost of the launch's one runtime call and Python frame (a few µs against 1000 nodes). It reads low
    against decode traces and moves between machines of one type: 0.41–0.87 µs on H200 machines, 0.83–1.53 µs for
    graphs made twelve to a process (benchmarks/probes/graph_launch_cost.py), 0.66–1.6 µs in the runtime's own
    captures' launch fits (docs/DESIGN.md "The profiler taken out"). None without CUDA."""
    if not torch.cuda.is_available():
        return None
    import torch.profiler as tp

    g = graph if graph is not None else node_graph(torch, nodes)
    launch_host_us(torch, g, replays)
    plain = min(launch_host_us(torch, g, replays) for _ in range(3))
    with tp.profile(**profiler_kwargs(True)):
        launch_host_us(torch, g, replays)
        prof = min(launch_host_us(torch, g, replays) for _ in range(3))
    return max(0.0, (prof - plain) / nodes)


def device_node_us(torch, nodes: int = 1000, replays: int = 20) -> float | None:
    """Extra device time per CUDA graph node under the profiler, µs: a graph of ``nodes`` tiny kernels replayed
    ``replays`` times, timed with CUDA events with and without the profiler; (t_prof − t_plain) / (replays·nodes).
    None without CUDA."""
    if not torch.cuda.is_available():
        return None
    import torch.profiler as tp

    g = node_graph(torch, nodes)

    def run() -> float:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        for _ in range(replays):
            g.replay()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) * 1e3  # µs

    run()
    plain = min(run() for _ in range(3))
    with tp.profile(**profiler_kwargs(True)):
        run()
        prof = min(run() for _ in range(3))
    return max(0.0, (prof - plain) / (replays * nodes))


QUEUE_SLEEP_CYCLES = 50_000_000  # torch.cuda._sleep: ~25 ms at ~2 GHz, longer than launching the chain takes


def queued_chain_us(torch, kernels: int = 500, repeats: int = 5) -> dict[str, float] | None:
    """A chain of ``kernels`` tiny eager kernels (``x.add_(1.0)`` on a one-element tensor) launched while the
    stream is held by ``torch.cuda._sleep``, so every one of them is queued when the previous one ends, timed on the
    device: per kernel µs from CUDA events without the profiler (``queued_kernel_unprofiled_us``, the minimum over
    ``repeats``) and with it (``queued_kernel_profiled_us``), and, from the profiled run's kernel activities, the
    median kernel duration (``queued_kernel_dur_us``) and the median start − previous end (``queued_gap_profiled_us``,
    the queued-launch gap q a trace shows, docs/DESIGN.md "The replay model"). None without CUDA.

    The replay's unprofiled queued-launch gap, for a trace whose own items never queued, is
    ``queue_gap_us`` = max(0, unprofiled per kernel − (duration − ``device_op_us``)) (:func:`measure`): the gap
    that makes a queued chain of such kernels, durations less the profiler's device cost per op, take what the
    events measured without the profiler."""
    if not torch.cuda.is_available():
        return None
    import torch.profiler as tp

    x = torch.zeros(1, device="cuda")

    def run() -> float:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()  # SYNC (deliberate): the chain starts on a drained device
        torch.cuda._sleep(QUEUE_SLEEP_CYCLES)
        a.record()
        for _ in range(kernels):
            x.add_(1.0)
        b.record()
        b.synchronize()
        return a.elapsed_time(b) * 1e3 / kernels

    run()
    plain = min(run() for _ in range(repeats))
    tmp = tempfile.mkdtemp(prefix="gaptrace-calibrate-")
    path = os.path.join(tmp, "queued.json.gz")
    try:
        with tp.profile(**profiler_kwargs(True)) as prof:
            prof_us = run()
        prof.export_chrome_trace(path)
        with gzip.open(path, "rt", encoding="utf-8") as f:
            ev = json.load(f).get("traceEvents", [])
    finally:
        if os.path.exists(path):
            os.remove(path)
        os.rmdir(tmp)
    k = sorted(((float(e["ts"]), float(e.get("dur", 0.0))) for e in ev
                if e.get("cat") == "kernel" and e.get("ph") == "X"), key=lambda t: t[0])
    k = k[-kernels:]  # the chain: the last kernels (the sleep kernel and anything earlier come first)
    if len(k) < 2:
        return None
    ts = np.array([t for t, _ in k])
    dur = np.array([d for _, d in k])
    gaps = ts[1:] - (ts[:-1] + dur[:-1])
    return {"queued_kernel_unprofiled_us": float(plain), "queued_kernel_profiled_us": float(prof_us),
            "queued_kernel_dur_us": float(np.median(dur)), "queued_gap_profiled_us": float(np.median(gaps)),
            "queued_kernels": int(kernels)}


GRAPH_SIZES = (10, 1000)


def graph_plain_us(torch, sizes: tuple[int, int] = GRAPH_SIZES, replays: int = 30) -> dict[str, float] | None:
    """CUDA graphs of tiny kernels (:func:`node_graph`) of two sizes, without the profiler: the host µs of one
    ``g.replay()`` (:func:`launch_host_us`) and the device µs of one replay (CUDA events around ``replays`` replays
    on a drained device, each replay queued behind the previous). Returns the affine fits over the two sizes:
    ``graph_launch_t0_us`` + ``graph_launch_node_us``·N (host) and ``graph_device_node_us`` (device µs per node: a
    tiny kernel's duration plus the gap between two graph nodes), with the raw figures. None without CUDA."""
    if not torch.cuda.is_available():
        return None
    host, dev = {}, {}
    for n in sizes:
        g = node_graph(torch, n)
        launch_host_us(torch, g, 3)
        host[n] = launch_host_us(torch, g, replays)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()  # SYNC (deliberate): the replays start on a drained device
        a.record()
        for _ in range(replays):
            g.replay()
        b.record()
        b.synchronize()
        dev[n] = a.elapsed_time(b) * 1e3 / replays
    lo, hi = sizes
    k_host = max(0.0, (host[hi] - host[lo]) / (hi - lo))
    return {"graph_launch_t0_us": max(0.0, host[lo] - k_host * lo), "graph_launch_node_us": k_host,
            "graph_device_node_us": max(0.0, (dev[hi] - dev[lo]) / (hi - lo)),
            "graph_host_us_by_nodes": {str(n): host[n] for n in sizes},
            "graph_device_us_by_nodes": {str(n): dev[n] for n in sizes}}


def measure(n: int = 20000, repeats: int = 5) -> dict[str, Any]:
    """Run the benchmarks (module docstring) and return the calibration dict. Each benchmark runs ``repeats`` times
    without and with the profiler, alternating (a slow spell of the host then lengthens both), and keeps the
    minimum of each: noise only adds time."""
    import torch

    # one intra-op thread: the model benchmarks' CPU ops otherwise spin a thread pool that a loaded host makes the
    # noisiest part of every timing (a decode loop's host work is the launch path, not CPU kernels)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _measure(torch, n, repeats)
    finally:
        torch.set_num_threads(threads)


def _measure(torch, n: int, repeats: int) -> dict[str, Any]:
    import torch.profiler as tp

    benches = _benchmarks(torch, n)
    # the launch-cost graph is captured before any profiler session, as a decode loop's are
    launch_graph = node_graph(torch, 1000) if torch.cuda.is_available() else None
    rows = []
    tmp = tempfile.mkdtemp(prefix="gaptrace-calibrate-")
    try:
        for name, (fn, iters) in benches.items():
            fn()  # warm-up
            plain_t, prof_t, counts = [], [], None
            for r in range(repeats):
                plain_t.append(_timed(fn))
                with tp.profile(**profiler_kwargs(True)) as prof:
                    t = _timed(fn)
                prof_t.append(t)
                if r == 0:
                    path = os.path.join(tmp, f"{name}.json.gz")
                    prof.export_chrome_trace(path)
                    counts = _count(path)
                    os.remove(path)
            rows.append({"benchmark": name, "iterations": iters, "plain_s": min(plain_t), "profiled_s": min(prof_t),
                         "events": counts})
    finally:
        try:
            os.rmdir(tmp)
        except OSError:
            pass
    cats, x = fit_costs(rows)
    cost = dict(zip(cats, x))
    for r in rows:  # the fit's own figure for each benchmark, beside the measured Δt (how well one set of costs fits)
        r["fitted_delta_s"] = sum(r["events"][c] * cost.get(c, 0.0) for c in CATS) * 1e-6
    dev = device_node_us(torch)
    node = graph_node_host_us(torch, launch_graph)
    chain = queued_chain_us(torch)
    plain_graph = graph_plain_us(torch)
    queue_gap = (max(0.0, chain["queued_kernel_unprofiled_us"] - (chain["queued_kernel_dur_us"] - float(dev or 0.0)))
                 if chain else 0.0)
    return {
        "gaptrace_calibration": 1,
        "device_op_us": float(dev or 0.0),
        "device_op_measured": dev is not None,
        "graph_node_us": float(node or 0.0),
        "graph_node_measured": node is not None,
        "queue_gap_us": queue_gap,
        "queue_gap_measured": chain is not None,
        "queued_chain": chain,
        "graph_plain": plain_graph,
        "aten_op_us": float(cost.get("cpu_op", 0.0)),
        "python_frame_us": float(cost.get("python_function", 0.0)),
        "runtime_call_us": float(cost.get("cuda_runtime", 0.0)),
        "runtime_call_measured": "cuda_runtime" in cost,
        "fit": "per-event non-negative least squares over the benchmarks whose delta is positive (calibrate.fit_costs)",
        "torch": torch.__version__,
        "cpu": _cpu_model(),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "measured_on": f"{_cpu_model()}; {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'};"
                       f" torch {torch.__version__}",
        "profiler_settings": "gaptrace.capture.profiler_kwargs(with_stack=True)",
        "benchmarks": rows,
    }


def fit_costs(rows: list[dict[str, Any]]) -> tuple[list[str], np.ndarray]:
    """The per-event costs (µs) of the categories some benchmark records, from the benchmark rows :func:`measure`
    writes (``events``: counts by category in one run; ``plain_s`` / ``profiled_s``: the run's time, s): the
    non-negative least-squares solution of Δt_b = Σ_c n_{b,c}·cost_c per recorded event, each row divided by its
    event count Σ_c n_{b,c} (so that a model benchmark of a few thousand events and a micro-benchmark of tens of
    thousands weigh alike, and a row's weight does not depend on its own noisy Δt_b); a benchmark with Δt_b <= 0
    (noise larger than the profiler's cost) is left out (docs/DESIGN.md "The profiler taken out"). Returns
    (categories, costs); the categories only left-out rows record get no cost (absent)."""
    y = np.array([(r["profiled_s"] - r["plain_s"]) * 1e6 for r in rows], dtype=np.float64)
    keep = y > 0  # a benchmark the profiler did not slow down is noise larger than its cost: no information
    used = [r for r, k in zip(rows, keep) if k]
    cats = [c for c in CATS if any(r["events"][c] for r in used)]
    A = np.array([[r["events"][c] for c in cats] for r in used], dtype=np.float64).reshape(len(used), len(cats))
    n = np.maximum(A.sum(axis=1), 1.0)
    return cats, _nnls(A / n[:, None], y[keep] / n)


def _timed(fn: Callable[[], None]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _nnls(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares, exactly, for the few unknowns a calibration has (at most a handful of event
    categories): the least-squares solution on every subset of the columns, the best one with no negative entry
    (the optimum is the unconstrained solution on its own support). Zeros when no subset gives one."""
    k = A.shape[1]
    best, best_err = np.zeros(k), float(np.sum(y ** 2))
    for mask in range(1, 1 << k):
        cols = [j for j in range(k) if mask >> j & 1]
        sol, *_ = np.linalg.lstsq(A[:, cols], y, rcond=None)
        if (sol < 0).any():
            continue
        x = np.zeros(k)
        x[cols] = sol
        err = float(np.sum((A @ x - y) ** 2))
        if err < best_err - 1e-12 * max(best_err, 1.0):
            best, best_err = x, err
    return best


@click.command(name="calibrate")
@click.option("-o", "--output", default="gaptrace_calibration.json", show_default=True,
              help="Where to write the calibration JSON.")
@click.option("--iterations", default=20000, show_default=True, type=click.IntRange(100, 10_000_000),
              help="Loop iterations per benchmark.")
def calibrate(output: str, iterations: int) -> None:
    """Measure the profiler's host cost per recorded ATen op, Python frame and runtime call on this machine
    (``gaptrace whatif --calibration FILE`` reads it)."""
    from gaptrace.outputs import resolve_output

    try:  # a missing directory, a device, FIFO or directory at the path: refused before the benchmarks run
        real = resolve_output(output)
    except ValueError as e:
        fail(str(e))
    res = measure(iterations)
    try:
        real = resolve_output(output)  # again: the path may have changed during the benchmarks
        write_json_atomic(real, res)
    except ValueError as e:
        fail(str(e))
    except OSError as e:
        fail(f"{output}: cannot write the calibration ({e.strerror or e})")
    click.echo(f"aten op {res['aten_op_us']:.3f} µs, python frame {res['python_frame_us']:.3f} µs, runtime call "
               f"{res['runtime_call_us']:.3f} µs, device per graph node {res['device_op_us']:.3f} µs, host per graph node "
               f"at launch {res['graph_node_us']:.3f} µs, queued-launch gap {res['queue_gap_us']:.3f} µs "
               f"({res['measured_on']}) -> {output}")
