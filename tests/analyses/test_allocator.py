"""Allocator churn and the driver's allocation calls (analyses/allocator.py; cudaFree as a blocking call in the replay;
a runtime call that launches nothing as a whatif site), on the H100 capture of a loop that calls
torch.cuda.empty_cache() every step (fixtures/traces/h100_hidden_syncs), checked against the raw Kineto JSON."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from gaptrace import load_trace
from gaptrace.analyses.allocator import allocator_churn
from gaptrace.analyses.replay import build_model
from gaptrace.analyses.steps import find_steps
from gaptrace.analyses.whatif import Change, Context, site_matches, whatif
from gaptrace.sidecar import read_sidecar_checked

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "traces")
EMPTY = os.path.join(ROOT, "h100_hidden_syncs", "empty_cache.planted.trace.json.gz")
MASK = os.path.join(ROOT, "h100_hidden_syncs", "mask_index.planted.trace.json.gz")


def _raw(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def test_churn_figures_by_hand():
    """Per step after the first (the loop's steps, find_steps: ProfilerStep#N here, each around one ``step``
    range): the cudaMalloc and cudaFree calls that start inside it on its thread, counted and summed from the raw
    events."""
    ev = _raw(EMPTY)
    tr = load_trace(EMPTY)
    st = find_steps(tr, (0, 0))
    assert st.rule == "profiler_step"
    names = set(st.table["name"].astype(str))
    steps = sorted((e["ts"], e["ts"] + e["dur"], e["tid"]) for e in ev
                   if e.get("cat") == "user_annotation" and e["name"] in names)
    assert len(steps) == len(st.table) == 6
    calls = [e for e in ev if e.get("cat") == "cuda_runtime" and e["name"] in ("cudaMalloc", "cudaFree")]
    later = steps[1:]
    per = {"cudaMalloc": [0, 0.0], "cudaFree": [0, 0.0]}
    with_calls = set()
    for c in calls:
        for i, (a, b, tid) in enumerate(later):
            if a <= c["ts"] < b and c["tid"] == tid:
                per[c["name"]][0] += 1
                per[c["name"]][1] += c["dur"]
                with_calls.add(i)
    f = allocator_churn(tr, st, (0, 0), idle_total_us=1.0)
    n = len(later)
    assert f["steps"] == n and f["steps_with_calls"] == len(with_calls) == n
    assert f["allocs_per_step"] == pytest.approx(per["cudaMalloc"][0] / n)
    assert f["frees_per_step"] == pytest.approx(per["cudaFree"][0] / n)
    assert f["alloc_us_per_step"] == pytest.approx(per["cudaMalloc"][1] / n, abs=0.01)
    assert f["free_us_per_step"] == pytest.approx(per["cudaFree"][1] / n, abs=0.01)
    assert f["causes"] == ["cudaMalloc", "cudaFree"] and f["site"] == "cudaMalloc"
    assert f["caller"] == "benchmarks/loops/empty_cache.py(46): step"  # the loop's own frame, not torch's
    # a loop whose allocator keeps its segments: no churn (the mask loop allocates only while its cache grows)
    tm = load_trace(MASK)
    assert allocator_churn(tm, find_steps(tm, (0, 0)), (0, 0), idle_total_us=1.0) is None


def test_a_free_waits_for_the_device_in_the_replay():
    """cudaFree synchronizes the device: the replay model makes it a blocking call that waits for every item
    launched before it; cudaMalloc stays a plain call."""
    tr = load_trace(EMPTY)
    m = build_model(tr)
    names = np.asarray(tr.host_str("name"))[m.call_row].astype(str)
    free, malloc = names == "cudaFree", names == "cudaMalloc"
    assert free.sum() >= 10 and malloc.sum() >= 10
    assert m.blocking[free].all() and not m.blocking[malloc].any()
    k = np.flatnonzero(free)
    before = np.searchsorted(m.item_pos, k, side="left")
    assert (m.await_items[k] == before).all()


def test_a_runtime_call_that_launches_nothing_is_a_site():
    """whatif removes cudaMalloc's calls (their host time), and with cudaFree's (their host time and waits) saves
    more; a launch call is still refused."""
    tr = load_trace(EMPTY)
    ctx = Context(tr, read_sidecar_checked(EMPTY)[0], round_name="step")
    assert site_matches(tr, ctx.model, "cudaMalloc")["how"] == "runtime call"
    one = whatif(tr, [Change("cudaMalloc")], context=ctx).data["saving_us"]
    both = whatif(tr, [Change("cudaMalloc"), Change("cudaFree")], context=ctx).data["saving_us"]
    assert 0 < one < both
    r = subprocess.run([sys.executable, "-m", "gaptrace.cli", "whatif", EMPTY, "--rounds", "step", "--remove",
                        "cudaLaunchKernel"], capture_output=True, text=True)
    assert r.returncode == 2 and "launches device work" in r.stderr and r.stderr.count("\n") == 1
