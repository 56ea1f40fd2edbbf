"""Cross-stream dependencies in the replay (docs/DESIGN.md "The replay model", cross-stream edges): a
``cudaStreamWaitEvent`` after a ``cudaEventRecord`` holds the waiting stream's next item until the recorded work is
done, and a host sync that a counterfactual takes out keeps the device order it gave. Small hand-written two-stream
Kineto traces whose answers are known by construction, and the shipped two-stream capture."""
from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest

import gaptrace
from gaptrace.analyses import replay as R

PID = 100
COPY_STREAM, COMPUTE_STREAM = 13, 7
STEP_US = 1000.0
COPY_US = 500.0
ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "traces")


def _call(name, ts, dur, corr):
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": PID, "tid": PID, "ts": ts, "dur": dur,
            "args": {"correlation": corr}}


def _kernel(ts, dur, corr, stream=COMPUTE_STREAM):
    return {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"device": 0, "stream": stream, "correlation": corr}}


def _copy(ts, dur, corr):
    return {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "pid": 0, "tid": COPY_STREAM,
            "ts": ts, "dur": dur, "args": {"device": 0, "stream": COPY_STREAM, "correlation": corr,
                                           "bytes": 1 << 24}}


def _steps(ordering: str, steps: int = 4) -> list[dict]:
    """``steps`` steps of STEP_US: a pinned copy of COPY_US on the copy stream; then the compute stream is ordered
    after it, by ``ordering``: "event" (cudaEventRecord, cudaStreamWaitEvent on the compute stream, with its
    cuda_sync row) or "sync" (the host waits in cudaStreamSynchronize until the copy is done); then a kernel on the
    compute stream that consumes the copy (after an event wait it starts 2 µs after the copy ends; after the host
    sync, λ after its launch), and two free kernels later in the step (started 5 µs after their launch: λ)."""
    ev, corr = [], 1
    for t in range(steps):
        T = t * STEP_US
        ev += [_call("cudaMemcpyAsync", T, 5, corr), _copy(T + 10, COPY_US, corr)]
        copy_end = T + 10 + COPY_US
        corr += 1
        if ordering == "event":
            ev += [_call("cudaEventRecordWithFlags", T + 8, 2, corr),
                   _call("cudaStreamWaitEvent", T + 12, 3, corr + 1),
                   {"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": 0, "tid": COMPUTE_STREAM,
                    "ts": T + 12.5, "dur": 2, "args": {"cuda_sync_kind": "Stream Wait Event", "stream": COMPUTE_STREAM,
                                                      "correlation": corr + 1, "device": 0, "wait_on_stream": -1,
                                                      "wait_on_cuda_event_record_corr_id": -1}}]
            corr += 2
            launch, start = T + 20, copy_end + 2
        else:
            ev += [_call("cudaStreamSynchronize", T + 8, copy_end + 2 - (T + 8), corr)]
            corr += 1
            launch = copy_end + 4
            start = launch + 5
        ev += [_call("cudaLaunchKernel", launch, 4, corr), _kernel(start, 100, corr)]
        corr += 1
        for off in (700, 800):
            ev += [_call("cudaLaunchKernel", T + off, 4, corr), _kernel(T + off + 5, 50, corr)]
            corr += 1
    return ev


def _load(tmp_path, events, name="t.json"):
    p = tmp_path / name
    p.write_text(json.dumps({"traceEvents": events, "deviceProperties": [{"id": 0, "name": "Test GPU"}]}))
    return gaptrace.load_trace(str(p))


def _no_edges(m: R.ReplayModel) -> R.ReplayModel:
    return dataclasses.replace(m, edge_item=np.zeros(0, np.int64), edge_on=np.zeros(0, np.int64))


def _consumers(m: R.ReplayModel) -> tuple[np.ndarray, np.ndarray]:
    """(the consuming kernels, the copies), one each a step: the first compute-stream item after each copy."""
    copies = np.flatnonzero(m.item_stream == COPY_STREAM)
    comp = np.flatnonzero(m.item_stream == COMPUTE_STREAM)
    cons = comp[np.searchsorted(comp, copies)]
    return cons, copies


@pytest.mark.parametrize("compiled", [True, False])
def test_an_event_wait_holds_the_waiting_stream_until_the_recorded_copy_is_done(tmp_path, compiled):
    tr = _load(tmp_path, _steps("event"))
    m = R.build_model(tr)
    cons, copies = _consumers(m)
    assert m.edge_counts["event_waits"] == 4 and m.edge_counts["event_waits_unmatched"] == 0
    assert sorted(zip(m.edge_item.tolist(), m.edge_on.tolist())) == sorted(zip(cons.tolist(), copies.tolist()))
    # λ from the free kernels only (5 µs), not from the consumers held ~490 µs by the copy
    assert m.latency_us["kernel"] == pytest.approx(5.0)
    # the wait's own latency, from the held consumers: each starts 2 µs after its copy ends
    assert m.latency_us["stream_wait"] == pytest.approx(2.0) and m.latency_us["stream_waits_held"] == 4
    res = R.replay(m, compiled=compiled)
    # unchanged: the consumers start when the copies end + the wait's latency, as measured
    np.testing.assert_allclose(res.item_start_us[cons], m.item_start_us[cons], atol=1e-6)
    # the host work gone: the launches come sooner, the consumers still wait for their copies
    fast = R.replay(m, work_us=np.zeros(m.calls), compiled=compiled)
    assert np.all(fast.item_start_us[cons] >= fast.item_end_us[copies] + 2.0 - 1e-9)
    assert fast.item_end_us[copies][0] - fast.item_start_us[copies][0] == pytest.approx(COPY_US)
    free = R.replay(_no_edges(m), work_us=np.zeros(m.calls), compiled=compiled)
    assert np.all(free.item_start_us[cons] < free.item_end_us[copies] - 100)  # without the edges they would not


@pytest.mark.parametrize("compiled", [True, False])
def test_a_removed_host_sync_keeps_the_device_order_it_gave(tmp_path, compiled):
    tr = _load(tmp_path, _steps("sync"))
    m = R.build_model(tr)
    cons, copies = _consumers(m)
    assert m.edge_counts["event_waits"] == 0 and m.edge_counts["sync_orders"] >= 4
    assert set(zip(cons.tolist(), copies.tolist())) <= set(zip(m.edge_item.tolist(), m.edge_on.tolist()))
    res = R.replay(m, compiled=compiled)
    np.testing.assert_allclose(res.item_start_us[cons], m.item_start_us[cons], atol=1e-6)
    no_wait = np.zeros(m.calls, dtype=bool)
    out = R.replay(m, wait=no_wait, compiled=compiled)
    assert out.call_end_us[-1] < res.call_end_us[-1] - 1000  # the host no longer waits 4 × ~500 µs
    assert np.all(out.item_start_us[cons] >= out.item_end_us[copies] - 1e-9)  # the device still does
    free = R.replay(_no_edges(m), wait=no_wait, compiled=compiled)
    assert np.all(free.item_start_us[cons] < free.item_end_us[copies] - 100)


def test_one_stream_has_no_edges_and_the_shipped_two_stream_capture_keeps_its_timeline():
    """A one-stream capture gets no edge; on the shipped two-stream capture (a copy stream and the compute stream
    ordered by event waits both ways), every event wait but the first (its record came before the trace) is matched,
    each edge holds in the measured timeline, and the replay unchanged still reproduces the step periods within
    1%."""
    one = R.build_model(gaptrace.load_trace(os.path.join(ROOT, "h200_loops", "per_request_readback.fixed.trace.json.gz")))
    assert len(one.edge_item) == 0 and one.edge_counts["event_waits"] == 0
    p = os.path.join(ROOT, "h200_loops", "pageable_htod.fixed.trace.json.gz")
    tr = gaptrace.load_trace(p)
    m = R.build_model(tr)
    assert m.edge_counts["event_waits"] == 11 and m.edge_counts["event_waits_unmatched"] == 1
    assert set(np.unique(m.item_stream[m.edge_item])) == {7, 13}  # both directions
    assert np.all(m.item_end_us[m.edge_on] <= m.item_start_us[m.edge_item] + R.RELEASE_EPS_US)
    err = R.unchanged_error(tr, m, "step")
    assert err["round_period_error"] < 0.01
    a, b = R.replay(m), R.replay(m, compiled=False)
    np.testing.assert_allclose(a.item_end_us, b.item_end_us, rtol=0, atol=1e-6)


def _stream_sync_steps(with_rows: bool, steps: int = 3) -> list[dict]:
    """Each step (a ``round`` range of 400 µs): a 2,000 µs kernel on the compute stream, then a 300 µs copy on the
    copy stream, then cudaStreamSynchronize of the copy stream (its cuda_sync "Stream Sync" row names stream 13 when
    ``with_rows``): the host returns when the copy is done (t + 320), long before the kernel ends, and launches the
    next step. The kernels queue behind each other on the compute stream, overlapping the copies."""
    ev, corr, t = [], 1, 0.0
    for _ in range(steps):
        ev.append({"ph": "X", "cat": "user_annotation", "name": "round", "pid": PID, "tid": PID, "ts": t - 0.5,
                   "dur": 399, "args": {}})
        ev += [_call("cudaLaunchKernel", t, 5, corr), _kernel(t + 10, 2000, corr)]
        corr += 1
        ev += [_call("cudaMemcpyAsync", t + 6, 5, corr), _copy(t + 15, 300, corr)]
        corr += 1
        ev += [_call("cudaStreamSynchronize", t + 12, 320 - 12, corr)]
        if with_rows:
            ev.append({"ph": "X", "cat": "cuda_sync", "name": "Stream Sync", "pid": 0, "tid": COPY_STREAM,
                       "ts": t + 314, "dur": 2, "args": {"cuda_sync_kind": "Stream Sync", "stream": COPY_STREAM,
                                                          "correlation": corr, "device": 0}})
        corr += 1
        t += 400
    return ev


@pytest.mark.parametrize("compiled", [True, False])
def test_a_stream_sync_waits_for_its_own_stream_only(tmp_path, compiled):
    """With the cuda_sync row naming the synchronized stream, the sync waits for its copy, not for the long kernel on
    the other stream: the replay keeps the measured 400 µs steps, each sync waiting for its copy. Without the row the
    call would wait for every stream, which its measured return (before the kernel ended) contradicts: it is left
    waiting for nothing, with a warning, and keeps no order."""
    m = R.build_model(_load(tmp_path, _stream_sync_steps(True)))
    assert (m.await_stream >= 0).sum() == 3 and set(m.await_stream[m.await_stream >= 0]) == {COPY_STREAM}
    res = R.replay(m, compiled=compiled)
    np.testing.assert_allclose(res.call_end_us, m.call_end_us, atol=1e-6)
    # its order behind the copy (not the kernel) is kept when the wait is taken out: the next kernel may start early
    kernels = np.flatnonzero(m.item_stream == COMPUTE_STREAM)
    copies = np.flatnonzero(m.item_stream == COPY_STREAM)
    assert set(zip(m.edge_item.tolist(), m.edge_on.tolist())) == set(zip(kernels[1:].tolist(), copies[:-1].tolist()))
    syncs = np.flatnonzero(m.blocking)
    assert np.all(res.call_end_us[syncs] >= res.item_end_us[copies] - 1e-9)
    longer = m.item_dur_us.copy()
    longer[copies] += 50.0  # a slower copy: each step's sync returns 50 µs later
    assert np.diff(R.replay(m, item_dur_us=longer, compiled=compiled).call_start_us[::3]) == pytest.approx([450.0, 450.0])
    # without the rows: a sync that returned while the kernel still ran cannot have waited for every stream; it is
    # taken to have synchronized the stream whose last item ended latest before its return (the copy stream)
    m_all = R.build_model(_load(tmp_path, _stream_sync_steps(False), "all.json"))
    np.testing.assert_array_equal(m_all.await_stream, m.await_stream)
    assert not any("returned before the device work" in w for w in m_all.warnings)
    np.testing.assert_array_equal(m_all.edge_item, m.edge_item)


def test_occupancy_of_overlapping_streams_is_their_union(tmp_path):
    """The compute stream's kernels run back to back (busy the whole time) while copies overlap them: the replayed
    occupancy is the union of the two streams' busy time (100%, as `analyze` measures it), not their sum (175%)."""
    from gaptrace.analyses.whatif import Context, whatif

    tr = _load(tmp_path, _stream_sync_steps(True, steps=8))
    w = whatif(tr, [], context=Context(tr, None, fit=False)).to_dict()
    assert 0.99 <= w["occupancy_before"] <= 1.0 + 1e-9
    assert w["stream_edges"] == {"event_waits": 0, "event_waits_unmatched": 0, "sync_orders": 7}
