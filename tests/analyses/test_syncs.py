"""Blocking syncs on real traces; every expected figure is re-derived here the plain way (json.load, dict loops)."""
from __future__ import annotations

import functools
import gzip
import json
import math
import os

import numpy as np
import pytest

from gaptrace.analyses.syncs import blocking_syncs
from gaptrace.loader import load_trace

TRACES = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "traces")
PROBE = os.path.join(TRACES, "h200_graph_launch_probe.json.gz")
HTA_A100 = os.path.join(TRACES, "hta_a100_graph_launches_rank0.json.gz")
MI300X = os.path.join(TRACES, "tracelens_mi300x_sglang_qwen3_8b_decode.json.gz")
OWLV2 = os.path.join(TRACES, "tracelens_h100_owlv2.json.gz")
QWEN = os.path.join(TRACES, "tracelens_h100_qwen1.5_0.5b.json.gz")
B200 = os.path.join(TRACES, "tracelens_b200_eager.json.gz")
ALL = sorted(os.path.join(TRACES, f) for f in os.listdir(TRACES) if f.endswith(".json.gz"))
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")


@functools.lru_cache(maxsize=None)
def report(path):
    return blocking_syncs(load_trace(path))


@functools.lru_cache(maxsize=None)
def events(path):
    with gzip.open(path) as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


# ---------------------------------------------------------------- plain re-derivations

def merged_busy(path):
    """Union of device intervals as a sorted list of [start, end] (one device in these traces)."""
    spans = []
    for s, e in sorted((e["ts"], e["ts"] + e["dur"]) for e in events(path) if e.get("cat") in DEVICE_CATS):
        if spans and s <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], e)
        else:
            spans.append([s, e])
    return spans


def busy_in(spans, s, e):
    return sum(max(0.0, min(e, b) - max(s, a)) for a, b in spans)


def idle_after(spans, t, window=200.0, frac=0.5):
    """Idle from t until the device resumes sustained work: the first span (ending after t) from which the device
    is >= frac busy over the next ``window`` µs; 0 if t lies inside such a span. Plain loops."""
    t1 = spans[-1][1]

    def busy_in_range(x, y):
        return sum(max(0.0, min(b, y) - max(a, x)) for a, b in spans if b > x and a < y)

    for a, b in spans:
        if b <= t:
            continue
        hz = min(a + window, t1)
        if busy_in_range(a, hz) >= frac * max(hz - a, 1e-9):
            resume = max(a, t)
            return (resume - t) - busy_in_range(t, resume)
    return (t1 - t) - busy_in_range(t, t1) if t < t1 else 0.0


def total_idle(spans):
    return (spans[-1][1] - spans[0][0]) - sum(b - a for a, b in spans)


@functools.lru_cache(maxsize=None)
def device_copies(path):
    return {e["args"]["correlation"]: e for e in events(path) if e.get("cat") == "gpu_memcpy"}


def device_op(path, corr):
    return device_copies(path).get(corr)


@functools.lru_cache(maxsize=None)
def runtime_by_thread(path):
    by = {}
    for e in events(path):
        if e.get("cat") in RUNTIME_CATS:
            by.setdefault((e["pid"], e["tid"]), []).append(e)
    return {k: sorted(v, key=lambda e: e["ts"]) for k, v in by.items()}


def next_runtime_call(path, call):
    """The first runtime call on the call's thread starting at or after its end (a linear scan)."""
    end = call["ts"] + call["dur"]
    for e in runtime_by_thread(path)[(call["pid"], call["tid"])]:
        if e["ts"] >= end:
            return e
    return None


def python_site(path, call):
    """Innermost python frame with a source file around ``call``: the innermost python_function containing it,
    then up the Python parent ids while the frame is a <built-in …> or PyTorch's own (torch/…) frame; the
    innermost torch frame when nothing outside torch encloses the call."""
    end = call["ts"] + call["dur"]
    py = [e for e in events(path) if e.get("cat") == "python_function" and e["tid"] == call["tid"]]
    inside = [e for e in py if e["ts"] <= call["ts"] and e["ts"] + e["dur"] >= end]
    f = max(inside, key=lambda e: (e["ts"], -e["dur"]))
    by_id = {e["args"]["Python id"]: e for e in py}
    while f["name"].startswith("<built-in"):
        f = by_id[f["args"]["Python parent id"]]
    first_torch = f
    while f is not None and (f["name"].startswith("torch/") or f["name"].startswith("<built-in")):
        f = by_id.get(f["args"]["Python parent id"])
    return (f or first_torch)["name"]


def plain_pairs(path, memory):
    """(memcpy, sync, device copy) for every cudaMemcpyAsync to ``memory`` host memory followed by a sync."""
    out = []
    for m in events(path):
        if m.get("name") != "cudaMemcpyAsync":
            continue
        op = device_op(path, m["args"]["correlation"])
        nxt = next_runtime_call(path, m)
        if op and memory in op["name"] and nxt and nxt["name"] == "cudaStreamSynchronize":
            out.append((m, nxt, op))
    return out


# ---------------------------------------------------------------- the probe

def test_probe_cpu_call_is_top_blocking_sync():
    r = report(PROBE)
    top = r.sites.iloc[0]
    pairs = plain_pairs(PROBE, "Pageable")
    assert len(pairs) == 6  # one 32-byte .cpu() per round
    assert top["call"] == "cudaMemcpyAsync" and top["aten_op"] == "aten::to" and top["count"] == 6
    # the frame of `v = z[0, :8].cpu()`, as the trace names it (the built-in `cpu` method is the call, not the site)
    assert top["site"] == python_site(PROBE, pairs[0][0])
    assert top["site"].startswith("probe1.py(") and top["site"].endswith(": step")
    assert top["stack"][0] == top["site"] and top["stack"][-1].endswith("<module>")
    blocked = sum(m["dur"] + s["dur"] - op["dur"] for m, s, op in pairs)
    assert top["blocked_us"] == pytest.approx(blocked, rel=1e-9)
    assert top["max_blocked_us"] > 4000  # the 4.3 ms copy of 32 bytes behind a 4096² matmul
    spans = merged_busy(PROBE)
    assert top["idle_after_us"] == pytest.approx(sum(idle_after(spans, s["ts"] + s["dur"]) for _, s, _ in pairs),
                                                 rel=1e-9)
    busy = sum(busy_in(spans, m["ts"], m["ts"] + m["dur"]) + busy_in(spans, s["ts"], s["ts"] + s["dur"])
               for m, s, _ in pairs)
    host = sum(m["dur"] + s["dur"] for m, s, _ in pairs)
    assert top["device_busy_during"] == pytest.approx(busy / host, rel=1e-6)
    assert top["device_busy_during"] > 0.8  # the host waited on the matmul
    assert r.total_idle_us == pytest.approx(total_idle(spans), rel=1e-9)
    assert top["idle_share"] == pytest.approx(top["idle_after_us"] / total_idle(spans), rel=1e-9)


def test_probe_item_and_nonzero_are_syncs():
    sites = report(PROBE).sites.set_index("aten_op")
    pinned = plain_pairs(PROBE, "Pinned")
    assert len(pinned) == 12  # .item() and nonzero: pinned copy + cudaStreamSynchronize inside the op
    for op in ("aten::item", "aten::nonzero"):
        row = sites.loc[op]
        assert row["count"] == 6 and row["call"] == "cudaMemcpyAsync"
        assert row["sync_call"] == "cudaStreamSynchronize" and row["kind"] == "memcpy_then_sync"
        assert row["site"] == sites.loc["aten::to", "site"]
    assert sites.loc["aten::item", "inner_op"] == "aten::_local_scalar_dense"
    blocked = sum(max(m["dur"] + s["dur"] - op["dur"], 0) for m, s, op in pinned)
    assert sites.loc[["aten::item", "aten::nonzero"], "blocked_us"].sum() == pytest.approx(blocked, rel=1e-9)
    # every cudaStreamSynchronize of the probe belongs to a pair: none is reported on its own
    assert set(report(PROBE).calls["call"]) == {"cudaMemcpyAsync"}
    assert len(report(PROBE).calls) == 18


def test_probe_window_one_round():
    rounds = [e for e in events(PROBE) if e.get("cat") == "user_annotation" and e["name"] == "round_5"]
    (rnd,) = rounds
    t0, t1 = rnd["ts"], rnd["ts"] + rnd["dur"]
    r = blocking_syncs(load_trace(PROBE), window=(t0, t1))
    assert sorted(r.sites["aten_op"]) == ["aten::item", "aten::nonzero", "aten::to"]
    assert (r.sites["count"] == 1).all()
    spans = [[max(a, t0), min(b, t1)] for a, b in merged_busy(PROBE) if b > t0 and a < t1]
    assert r.total_idle_us == pytest.approx((t1 - t0) - sum(b - a for a, b in spans), rel=1e-9)


# ---------------------------------------------------------------- public traces

def test_mi300x_463ms_copy():
    r = report(MI300X)
    assert len(r.sites) == 1
    row = r.sites.iloc[0]
    (call,) = [e for e in events(MI300X) if e.get("name") == "hipMemcpyWithStream"]
    op = device_op(MI300X, call["args"]["correlation"])
    assert "Host" in op["name"]  # HIP's "Device -> Host": treated as pageable
    assert row["call"] == "hipMemcpyWithStream" and row["kind"] == "pageable_memcpy"
    assert row["blocked_us"] == pytest.approx(call["dur"] - op["dur"], rel=1e-12)
    assert row["blocked_us"] > 400_000
    spans = merged_busy(MI300X)
    assert row["device_busy_during"] == pytest.approx(busy_in(spans, call["ts"], call["ts"] + call["dur"])
                                                      / call["dur"], rel=1e-6, abs=1e-12)
    assert row["device_busy_during"] < 0.001  # the device idled while the host sat in the copy
    assert row["idle_after_us"] == pytest.approx(idle_after(spans, call["ts"] + call["dur"]), rel=1e-9)
    assert row["site"] == python_site(MI300X, call)
    assert row["aten_op"] == "aten::copy_"


def test_hta_a100_pairs_and_device_sync():
    r = report(HTA_A100)
    pairs = plain_pairs(HTA_A100, "Pageable")
    syncs = [e for e in events(HTA_A100) if e.get("name") == "cudaDeviceSynchronize"]
    assert len(r.calls) == len(pairs) + len(syncs) == 76
    sites = r.sites.set_index("call")
    assert sites.loc["cudaMemcpyAsync", "blocked_us"] == pytest.approx(
        sum(m["dur"] + s["dur"] - op["dur"] for m, s, op in pairs))
    assert sites.loc["cudaDeviceSynchronize", "blocked_us"] == syncs[0]["dur"]
    # no pinned copy without a sync after it is reported
    pinned = [e for e in events(HTA_A100) if e.get("name") == "cudaMemcpyAsync"
              and (op := device_op(HTA_A100, e["args"]["correlation"])) and "Pinned" in op["name"]]
    assert pinned and not set(e["ts"] for e in pinned) & set(r.calls["ts_us"])


def test_b200_pageable_upload_that_returned_before_the_copy_is_not_blocking():
    r = report(B200)
    waits = []
    for m in events(B200):
        if m.get("name") == "cudaMemcpyAsync":
            op = device_op(B200, m["args"]["correlation"])
            if op and "Pageable" in op["name"]:
                waits.append(op["ts"] + op["dur"] <= m["ts"] + m["dur"])
    assert len(waits) == 2 and not any(waits)  # both device copies finished after the host call returned
    assert r.calls.empty and r.not_blocking == 2


@pytest.mark.parametrize("path", ALL, ids=os.path.basename)
def test_invariants(path):
    r = report(path)
    s, c = r.sites, r.calls
    assert (np.diff(s["blocked_us"].to_numpy()) <= 0).all()
    assert (c["blocked_us"] > 0).all() and (c["blocked_us"] <= c["host_us"] + 1e-9).all()
    assert ((c["device_busy_during"] >= 0) & (c["device_busy_during"] <= 1 + 1e-9)).all()
    assert (c["idle_after_us"] >= 0).all()
    assert s["idle_share"].sum() <= 1 + 1e-9
    assert s["count"].sum() == len(c)
    out = r.to_list()
    json.dumps(out)
    for d in out:
        assert {"call", "site", "stack", "count", "blocked_us", "idle_after_us", "idle_share",
                "device_busy_during"} <= set(d)
        assert all(isinstance(f, str) and " at 0x" not in f for f in d["stack"])
        assert math.isfinite(d["blocked_us"])


# ---------------------------------------------------------------- cuda_sync device events

def _with_sync_events(path, tmp_path, rename=None, wait_on=None, renamed_to="cudaMemPoolTrimTo"):
    """The trace plus a cuda_sync event (as enable_cuda_sync_events writes them) for every stream/device sync;
    optionally one sync call renamed to a name outside the API list, and "Stream Wait Event" syncs on launches."""
    with gzip.open(path) as f:
        doc = json.load(f)
    extra = []
    for e in doc["traceEvents"]:
        if e.get("ph") != "X":
            continue
        if e.get("name") in ("cudaStreamSynchronize", "cudaDeviceSynchronize"):
            kind = "Stream Sync" if e["name"] == "cudaStreamSynchronize" else "Context Sync"
            extra.append({"ph": "X", "cat": "cuda_sync", "name": kind, "pid": 0, "tid": 7,
                          "ts": e["ts"], "dur": e["dur"],
                          "args": {"cuda_sync_kind": kind.lower().replace(" ", "_"), "device": 0, "stream": 7,
                                   "correlation": e["args"]["correlation"]}})
            if rename is not None and e["ts"] == rename:
                e["name"] = renamed_to
        if wait_on and e.get("name") == wait_on:
            extra.append({"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": 0, "tid": 7,
                          "ts": e["ts"], "dur": 1.0,
                          "args": {"cuda_sync_kind": "wait_event", "device": 0, "stream": 7,
                                   "correlation": e["args"]["correlation"]}})
    doc["traceEvents"] += extra
    out = tmp_path / "with_sync_events.json"
    out.write_text(json.dumps(doc))
    return load_trace(str(out))


def test_sync_events_change_nothing_for_known_syncs(tmp_path):
    tr = _with_sync_events(PROBE, tmp_path, wait_on="cudaLaunchKernel")
    assert len(tr.device_syncs) == 18 + 2 + 36
    r = blocking_syncs(tr)
    base = report(PROBE)
    assert r.sites[["call", "site", "aten_op", "count"]].equals(base.sites[["call", "site", "aten_op", "count"]])
    np.testing.assert_allclose(r.sites["blocked_us"], base.sites["blocked_us"])


def test_sync_event_names_an_unknown_blocking_call(tmp_path):
    base = report(QWEN)
    lone = base.calls[base.calls["kind"] == "sync_api"]
    assert len(lone) == 2  # torch.cuda.synchronize() twice (8 and 14 ms)
    target = lone.loc[lone["blocked_us"].idxmax()]
    raw_ts = next(e["ts"] for e in events(QWEN)
                  if e.get("name") == "cudaDeviceSynchronize" and abs(e["ts"] - target["ts_us"]) < 1e-6)
    tr = _with_sync_events(QWEN, tmp_path, rename=raw_ts)
    calls = blocking_syncs(tr).calls
    hit = calls[np.isclose(calls["ts_us"], target["ts_us"], rtol=0, atol=1e-6)]
    assert len(hit) == 1 and hit.iloc[0]["call"] == "cudaMemPoolTrimTo" and hit.iloc[0]["kind"] == "sync_event"
    assert hit.iloc[0]["blocked_us"] == pytest.approx(target["blocked_us"])
    # without the device's sync event, a call outside the API list is not a known sync: it is not reported
    tr2 = _with_sync_events(QWEN, tmp_path, rename=raw_ts)
    tr2.device_syncs = tr2.device_syncs.iloc[0:0]
    calls2 = blocking_syncs(tr2).calls
    assert not np.isclose(calls2["ts_us"], target["ts_us"], rtol=0, atol=1e-6).any()
    # a cudaFree is one: a device memory free synchronizes the device, with or without the sync event
    tr3 = _with_sync_events(QWEN, tmp_path, rename=raw_ts, renamed_to="cudaFree")
    tr3.device_syncs = tr3.device_syncs.iloc[0:0]
    hit3 = blocking_syncs(tr3).calls
    hit3 = hit3[np.isclose(hit3["ts_us"], target["ts_us"], rtol=0, atol=1e-6)]
    assert len(hit3) == 1 and hit3.iloc[0]["call"] == "cudaFree" and hit3.iloc[0]["kind"] == "sync_api"
    assert hit3.iloc[0]["blocked_us"] == pytest.approx(target["blocked_us"])


def test_host_only_trace_still_reports_syncs(tmp_path):
    with gzip.open(PROBE) as f:
        doc = json.load(f)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") not in DEVICE_CATS]
    out = tmp_path / "host_only.json"
    out.write_text(json.dumps(doc))
    r = blocking_syncs(load_trace(str(out)))
    # without device copies nothing is known pageable; the 18 copy + sync pairs remain, and the two
    # cudaDeviceSynchronize calls at the end and the one cudaFree (under aten::mm: the allocator freeing a cached
    # block; a free synchronizes the device) are reported on their own (no device, so no window leaves them out and
    # no device activity says they found it idle, as the whole trace does for the cudaFree: not_blocking)
    assert len(r.calls) == 18 + 2 + 1 and r.total_idle_us == 0
    assert (r.calls["call"] == "cudaFree").sum() == 1 and blocking_syncs(load_trace(PROBE)).not_blocking == 1
    assert r.sites.iloc[0]["aten_op"] == "aten::to"
    assert r.sites["device_busy_during"].isna().all()
    assert all(d["idle_after_us"] is None for d in r.to_list())


def test_trace_without_memcpy_activity(tmp_path):
    """A trace whose memcpys were not recorded (no gpu_memcpy events: no copy can be tied to its call) still has
    numeric blocking-call columns and its syncs: the explicit synchronize calls of the sync scheduler's capture stay
    blocking, and analyze's rounds (a bincount over blocked_us) run."""
    src = os.path.join(TRACES, "h200_pairs", "bench_sync_bs8_B12.json.gz")
    doc = json.load(gzip.open(src))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != "gpu_memcpy"]
    p = tmp_path / "no_memcpy.json"
    p.write_text(json.dumps(doc))
    r = blocking_syncs(load_trace(str(p)))
    assert r.calls["blocked_us"].dtype == np.float64 and r.calls["device"].dtype == np.int64
    assert "sync_api" in set(r.calls["kind"])
    from gaptrace.analyses.summary import run_analysis
    out = run_analysis(load_trace(str(p)))
    assert out["devices"] and "rounds" in out
