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


def _edited(tmp_path, name, edit):
    """The empty_cache capture with ``edit(events)`` applied to its raw events, and its sidecar beside it."""
    import shutil
    with gzip.open(EMPTY, "rt", encoding="utf-8") as f:
        doc = json.load(f)
    edit(doc["traceEvents"])
    out = tmp_path / f"{name}.json.gz"
    with gzip.open(out, "wt", encoding="utf-8") as f:
        json.dump(doc, f)
    shutil.copy(EMPTY.replace(".json.gz", ".gaptrace.json"), tmp_path / f"{name}.gaptrace.json")
    return str(out)


def test_churn_on_another_thread_and_without_frees(tmp_path):
    """Allocation calls on a thread that launches nothing are not the loop's: no finding, and whatif says they are on
    another thread (not that they launch device work). A loop that allocates every step with no free in the steps
    says so, without claiming a device drain."""
    from gaptrace.analyses.summary import run_analysis

    def move(ev):
        for e in ev:
            if e.get("name") in ("cudaMalloc", "cudaFree"):
                e["tid"] = 4242
    moved = _edited(tmp_path, "moved", move)
    s = run_analysis(load_trace(moved), sidecar=read_sidecar_checked(moved)[0])
    assert not any(f["kind"] == "allocator_churn" for f in s["findings"])
    r = subprocess.run([sys.executable, "-m", "gaptrace.cli", "whatif", moved, "--rounds", "step", "--remove",
                        "cudaMalloc"], capture_output=True, text=True)
    assert r.returncode == 2 and "another thread" in r.stderr and r.stderr.count("\n") == 1

    def drop_frees(ev):
        ev[:] = [e for e in ev if e.get("name") != "cudaFree"]
    nofree = _edited(tmp_path, "nofree", drop_frees)
    f = next(x for x in run_analysis(load_trace(nofree), sidecar=read_sidecar_checked(nofree)[0])["findings"]
             if x["kind"] == "allocator_churn")
    assert f["causes"] == ["cudaMalloc"] and f["frees_per_step"] == 0
    assert "no free in the steps" in f["summary"] and "drain" not in f["summary"]


def test_a_free_that_waits_in_the_loop_body_is_charged_to_the_frees(tmp_path):
    """The kernel before each step's first cudaFree stretched to end inside the free: the free waited (a blocking
    sync). Its site is the loop's own step() (it encloses the rounds), so the cause removed is the frees themselves,
    and the fix points to the allocator churn finding."""
    from gaptrace.analyses.summary import run_analysis

    def stretch(ev):
        frees = sorted((e for e in ev if e.get("name") == "cudaFree"), key=lambda e: e["ts"])
        kernels = sorted((e for e in ev if e.get("cat") == "kernel"), key=lambda e: e["ts"])
        last = None
        for fr in frees:
            before = [k for k in kernels if k["ts"] + k["dur"] <= fr["ts"]]
            if before and before[-1] is not last:
                last = before[-1]
                last["dur"] = fr["ts"] + 0.6 * fr["dur"] - last["ts"]
    drain = _edited(tmp_path, "drain", stretch)
    s = run_analysis(load_trace(drain), sidecar=read_sidecar_checked(drain)[0])
    bs = [f for f in s["findings"] if f["kind"] == "blocking_sync" and f.get("call") == "cudaFree"]
    assert bs and bs[0]["cause"] == "cudaFree" and bs[0]["saving_us"] is not None and bs[0]["saving_us"] > 0
    assert "allocator churn" in bs[0]["fix"]


def test_one_call_under_two_names_is_one_site():
    from gaptrace.analyses.whatif import check_changes
    with pytest.raises(ValueError, match="name the same site"):
        check_changes([Change("cudaMalloc"), Change("cudaMalloc_v3020", factor=2.0)])
