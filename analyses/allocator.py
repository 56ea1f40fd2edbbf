"""Allocator churn: device memory taken from and given back to the driver in the loop's steady state (DESIGN.md
"Allocator churn").

PyTorch's caching allocator keeps the segments it got from ``cudaMalloc`` and reuses them; in a steady loop it calls
the driver only while the cache grows (the first steps). Driver allocations in most steps mean the cache is being
emptied (``torch.cuda.empty_cache()`` in the loop, a memory fraction or ``PYTORCH_NO_CUDA_MEMORY_CACHING``) or
shapes that change every step. Each ``cudaMalloc`` costs host time (tens to hundreds of µs), and each ``cudaFree``
also waits for the device to drain (CUDA C++ Programming Guide, "Implicit Synchronization"): the host can no longer
queue work ahead of the device. The fix, keeping the segments, takes both away, so the finding's saving removes every
allocation and free call of the launching thread (:func:`.whatif.whatif` with one change per call name).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from gaptrace.trace import Trace

from .findings import ms_text
from .profiler_cost import name_codes
from .syncs import FREE_SYNC_NAMES, api_base_name

__all__ = ["ALLOC_CALLS", "FREE_CALLS", "DRAIN_CALLS", "CHURN_STEP_SHARE", "MIN_STEPS", "allocator_churn"]

ALLOC_CALLS = ("cudaMalloc", "cuMemAlloc", "hipMalloc")  # device memory from the driver (not cudaMallocAsync)
FREE_CALLS = ("cudaFree", "cuMemFree", "hipFree")  # device memory back to the driver
DRAIN_CALLS = FREE_SYNC_NAMES  # the frees that synchronize the device (the replay's blocking frees)
CHURN_STEP_SHARE = 0.5  # driver allocations in at least this share of the steps after the first: churn
MIN_STEPS = 3  # steps a trace needs (the first, which fills the cache, and two after it) to say "most steps"


def allocator_churn(trace: Trace, steps: Any, key: tuple[int, int], idle_total_us: float,
                    attribution: Any = None) -> dict | None:
    """The ``allocator_churn`` finding of a loop, or None: when the loop has :data:`MIN_STEPS` steps or more and at
    least :data:`CHURN_STEP_SHARE` of the steps after the first (``steps.table``: start_us / end_us / tid of each step, :func:`.steps.find_steps`) hold a
    device allocation or free call (:data:`ALLOC_CALLS`, :data:`FREE_CALLS`, CUPTI's suffixes aside) on the
    launching thread (``steps.table["tid"]``) of rank ``key[0]``.

    Returns {kind: "allocator_churn", summary, idle_share, idle_us (the window's idle under those calls, from the
    gap ``attribution`` frame rows; 0 without it), site (the call name whose removal is the cause: the allocation
    when present), causes (every allocation / free call name present, each removed in the saving), steps_with_calls,
    steps, allocs_per_step, frees_per_step, alloc_us_per_step, free_us_per_step (profiled host µs, means over the
    steps after the first), caller (the innermost Python frame around the first free, or None)}."""
    t = getattr(steps, "table", None)
    if t is None or len(t) < MIN_STEPS:
        return None
    h = trace.host
    uniq, inv = name_codes(trace)  # each distinct name tested once: millions of runtime calls, a few dozen names
    base_u = np.array([api_base_name(str(u)) for u in uniq], dtype=object)
    wanted = np.isin(base_u, ALLOC_CALLS + FREE_CALLS)
    rt = np.flatnonzero(h["cat"].isin(("cuda_runtime", "cuda_driver")).to_numpy() & (h["rank"].to_numpy() == key[0])
                        & wanted[inv])
    if not len(rt):
        return None
    base = base_u[inv[rt]]
    is_alloc = np.isin(base, ALLOC_CALLS)
    ts, te = h["ts_us"].to_numpy()[rt], h["end_us"].to_numpy()[rt]
    tid = trace.host_str("tid")[rt].astype(str)
    t = t.sort_values("start_us")
    s0 = t["start_us"].to_numpy(dtype=np.float64)[1:]  # the first step fills the cache: left out
    s1 = t["end_us"].to_numpy(dtype=np.float64)[1:]
    step_tid = t["tid"].astype(str).to_numpy()[1:]
    j = np.searchsorted(s0, ts, side="right") - 1
    ok = (j >= 0) & (ts < s1[np.maximum(j, 0)]) & (tid == step_tid[np.maximum(j, 0)])
    n = len(s0)
    with_calls = len(np.unique(j[ok]))
    if not ok.any() or with_calls < CHURN_STEP_SHARE * n:
        return None
    dur = te - ts
    a, f = ok & is_alloc, ok & ~is_alloc
    per = {"steps_with_calls": with_calls, "steps": n,
           "allocs_per_step": float(a.sum()) / n, "frees_per_step": float(f.sum()) / n,
           "alloc_us_per_step": float(dur[a].sum()) / n, "free_us_per_step": float(dur[f].sum()) / n}
    present = [c for c in ALLOC_CALLS + FREE_CALLS if (base[ok] == c).any()]
    idle_us = 0.0
    if attribution is not None and len(attribution):
        rows = attribution[attribution["frame"].astype(str).map(api_base_name).isin(present)]
        idle_us = float(rows["inclusive_idle_us"].sum())
    caller = _caller(trace, rt[f][0]) if f.any() else None
    share = min(idle_us / idle_total_us, 1.0) if idle_total_us > 0 else 0.0
    calls = " and ".join(f"{v:.1f} {k} a step ({ms_text(u)})" for k, v, u in (
        ("allocations", per["allocs_per_step"], per["alloc_us_per_step"]),
        ("frees", per["frees_per_step"], per["free_us_per_step"])) if v > 0)
    every = "every step" if with_calls == n else "most steps"
    drains = [c for c in present if c in DRAIN_CALLS]
    summary = (f"the CUDA caching allocator went to the driver in {with_calls} of {n} steps after the first: {calls} "
               f"of profiled host time ({', '.join(present)}"
               + (f"; the frees called from {caller}" if caller else "")
               + (f"): device memory is given back and taken again in {every}" if f.any() else
                  f"): device memory is taken from the driver again in {every} (no free in the steps: shapes that "
                  "change, or frees outside them)")
               + (f", and each {' / '.join(drains)} waits for the device to drain" if drains else ""))
    return {"kind": "allocator_churn", "summary": summary, "idle_share": share, "idle_us": idle_us,
            "site": present[0], "causes": present, "caller": caller, **per}


def _caller(trace: Trace, row: int) -> str | None:
    """The innermost python_function event on ``row``'s thread that encloses it, outside torch's own files (the
    code that asked for the free, e.g. the loop's call of torch.cuda.empty_cache()); None when there is none."""
    h = trace.host
    tid = trace.host_str("tid")
    py = np.flatnonzero(trace.host_str_eq("cat", "python_function") & (tid == tid[row])
                        & (h["rank"].to_numpy() == h["rank"].to_numpy()[row]))
    ts, te = h["ts_us"].to_numpy(), h["end_us"].to_numpy()
    enc = py[(ts[py] <= ts[row]) & (te[py] >= te[row])]
    if not len(enc):
        return None
    names = trace.host_str("name")[enc].astype(str)
    own = ~np.char.startswith(names, "torch/") & ~np.char.startswith(names, "<built-in")
    if not own.any():
        return None
    k = np.flatnonzero(own)
    return str(names[k[np.argmax(ts[enc][k])]])
