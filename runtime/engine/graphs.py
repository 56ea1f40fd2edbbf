"""CUDA graphs for the draft block and the target verify, one per batch-size bucket (nano-vllm's model_runner).

Graphs are made with ``torch.cuda.CUDAGraph(keep_graph=True)`` so the captured ``cudaGraph_t`` stays readable:
its node count comes from ``cuda.bindings.runtime.cudaGraphGetNodes(graph, numNodes=0)`` (DESIGN.md "The
trace": kappa, the profiler's cost per graph node, is fitted against it). Without cuda.bindings the count is
None and everything else works. All graphs of one engine share one memory pool; they replay in order on one
stream, and every graph's outputs stay referenced, so no live tensor is reused.
"""
from __future__ import annotations

import time

from typing import Callable

import torch


def batch_buckets(max_batch: int, mode: str = "max") -> list[int]:
    """Batch sizes that get a graph: ``max_batch`` alone (``mode`` "max"), or also the powers of two below it
    ("pow2"). A round pads its rows to the smallest bucket that holds them."""
    if mode == "max":
        return [max_batch]
    if mode != "pow2":
        raise ValueError(f"unknown graph buckets {mode!r} (max | pow2)")
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    return out + [max_batch]


def bucket_for(n: int, buckets: list[int]) -> int:
    """The smallest bucket >= n."""
    return next(b for b in buckets if b >= n)


def graph_node_count(graph: "torch.cuda.CUDAGraph") -> int | None:
    """Number of nodes of a graph captured with keep_graph=True, via cudaGraphGetNodes; None if unavailable."""
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        return None
    raw = graph.raw_cuda_graph()
    for arg in (raw, getattr(cudart, "cudaGraph_t", lambda init_value: raw)(init_value=raw)):
        try:
            err, _nodes, num = cudart.cudaGraphGetNodes(arg, numNodes=0)
        except Exception:
            continue
        if int(err) == 0:
            return int(num)
    return None


class GraphedCall:
    """``fn()`` (no arguments: it reads and writes static tensors) captured once as a CUDA graph.

    The constructor warms ``fn`` up on the current stream (lazy kernels, cuBLAS workspaces), captures it,
    instantiates the executable graph and reads its node count; ``__call__`` replays it and returns the outputs captured (the
    same tensors every time, overwritten by each replay).
    """

    def __init__(self, name: str, fn: Callable[[], object], pool, warmup: int = 2):
        self.name, self.fn = name, fn
        # warm-up on the current stream, not on a new side stream (torch's make_graphed_callables uses one): every
        # stream that runs work, like every graph made, counts toward the process's step past which each graph
        # node costs ~0.18 µs more on the device (H200; DESIGN.md "Graph-node bubbles",
        # benchmarks/probes/README.md)
        for _ in range(warmup):
            fn()
        self.graph = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.cuda.graph(self.graph, pool=pool):
            self.outputs = fn()
        self.graph.instantiate()
        self.num_nodes = graph_node_count(self.graph)
        self.last_launch_us = float("nan")
        # device timing (capture's rounds right after the profiled ones): while on, a (start, end) CUDA event pair around each replay
        self.device_timing = False
        self.device_events: list = []

    def __call__(self):
        # host cost of the launch (cudaGraphLaunch + its Python wrapper), kept for capture's unprofiled baseline;
        # two perf_counter reads, no device sync
        timed = self.device_timing
        if timed:  # two cudaEventRecord on the stream (no sync); read after the decode
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        self.graph.replay()
        self.last_launch_us = (time.perf_counter() - t0) * 1e6
        if timed:
            end.record()
            self.device_events.append((start, end))
        return self.outputs


def time_device(graphs: dict, on: bool) -> None:
    """Start (``on``) or stop recording a CUDA event pair around every replay of ``graphs`` ({key: GraphedCall});
    the pairs stay on each graph until :func:`device_us` reads them."""
    for g in graphs.values():
        g.device_timing = on


def device_us(graphs: dict) -> dict:
    """{key: [device µs of each timed replay]} (:func:`time_device`): event elapsed time from just before the
    replay was enqueued to just after, i.e. the graph's device span when its stream was busy before it (plus the
    launch latency when the stream was idle). Synchronizes on the last event of each graph: call it after the decode."""
    out: dict = {}
    for key, g in graphs.items():
        pairs = g.device_events
        if pairs:
            pairs[-1][1].synchronize()  # deliberate host sync: after the decode, nothing left to overlap
            out[key] = [s.elapsed_time(e) * 1e3 for s, e in pairs]
    return out


def collect_launch_us(graphs: dict, into: dict) -> None:
    """Append each graph's host launch cost since the last call (``GraphedCall.last_launch_us``, µs) to
    ``into[key]`` and reset it; graphs not replayed since (NaN) are skipped. Called once per round, unprofiled: the
    baseline the launch fit compares profiled launches with."""
    for key, g in graphs.items():
        if g.last_launch_us == g.last_launch_us:  # not NaN: replayed since the last call
            into.setdefault(key, []).append(g.last_launch_us)
            g.last_launch_us = float("nan")
