"""Blocking syncs: host calls that waited for the device, grouped by call site (DESIGN.md "Blocking syncs").

Which calls count (the candidates), by API contract, as Nsight Systems' expert rules classify them
(``nsys analyze``: *CUDA Synchronization APIs*, *Synchronous Memcpy*, *Async Memcpy with Pageable Memory*) and as
the CUDA Runtime API's "API synchronization behavior" section states:

``sync_api``          cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize (cu*/hip* equivalents):
                      the host blocks until the device work they name is done. No device op of their own. Also
                      cudaFree / cuMemFree: a device memory free waits for the device to drain (CUDA C++
                      Programming Guide, "Implicit Synchronization").
``pageable_memcpy``   a cudaMemcpy* / hipMemcpy* whose device memcpy (joined on the correlation id) goes to or
                      from pageable host memory (``host_memory`` "Pageable"; HIP writes "Host" and does not tell
                      pinned from pageable, so "Host" is treated as pageable). A copy to pageable memory returns
                      only once the copy has completed.
``memcpy_then_sync``  a memcpy followed by a sync API on the same thread (the next runtime/driver call there, inside
                      the same innermost ATen op (``stacks.innermost_aten_op``), or within ``pair_gap_us`` when
                      neither has one): ``aten::item`` →
                      ``_local_scalar_dense`` → cudaMemcpyAsync + cudaStreamSynchronize. The pair is ONE blocking
                      call, named after the copy (``call``), the sync in ``sync_call``; the sync is not reported
                      again on its own.
``sync_memcpy``       a synchronous copy API (cudaMemcpy, cuMemcpyDtoH, hipMemcpy, hipMemcpyWithStream: no "Async"
                      in the name) between host and device (HtoD / DtoH; a synchronous DtoD copy does not block the
                      host): it returns only once the copy is done.
``sync_event``        any host call that a ``cuda_sync`` device event (``enable_cuda_sync_events``) names by
                      correlation id, except device-side waits (sync kinds containing "Wait", cudaStreamWaitEvent)
                      and polls (cudaEventQuery, cudaStreamQuery: CUPTI records an "Event Sync" for them too,
                      seen on the H200 with torch 2.11, but they return at once).

Which candidates are reported (the threshold): only those that show evidence of having waited for the device, and
blocked_us > ``min_blocked_us`` (default 0 µs). Evidence: for a copy (alone or paired), its device memcpy ended
before the host call returned; for a sync, some activity of its device ended while the call ran. The threshold is
deliberately evidence, not a host duration: under the profiler a sync that finds nothing to wait for still costs
5–20 µs (the probe's syncs after a completed pageable copy take 15 µs), while a 6 µs pinned copy plus sync behind
``aten::nonzero`` really did wait for the kernel that produced the count. A pinned async copy with no sync after it
is never a candidate, whatever its duration. Candidates without evidence are counted in ``not_blocking``, not listed:
they are sync points that happened to find an idle device (they still forbid run-ahead, but idled nothing).

Per blocking call (all µs, DESIGN.md "A way to compute them in n log n"; BusyTimeline of the call's device):

- ``blocked_us``: host time beyond the device op's own duration: host duration for a sync; host duration − device
  memcpy duration (floor 0) for a copy; (copy + sync host durations) − device memcpy duration for a pair.
- ``device_busy_during``: busy(host intervals) / their length, in [0, 1] (the device's own work while the host
  waited: 1 means the host waited on real work, 0 on nothing but latency).
- ``idle_during_us``: the device's idle time during those host intervals (host time − busy time): a call that blocks
  while the device idles waited on something other than device work (a 463 ms ``hipMemcpyWithStream`` of a 4.5 µs
  copy on an idle MI300X); gap attribution charges that idle to the call itself.
- ``idle_after_us``: the idle from the call's end until the device resumes sustained work (the serialized tail:
  everything the host did after the call ran against an idle device), clipped to the window. "Resumes" is
  :meth:`BusyTimeline.next_sustained_start`: the first busy span from which the device stays >= 50% busy for
  ``RESUME_WINDOW_US``; a few tiny kernels launched by the host's own bookkeeping (a gather between two syncs)
  do not end the tail, and their busy time is not counted as idle. When several blocking calls end inside the
  same tail (the sync scheduler's chain: the lengths copy, then ``.max().item()``, then ``masked_select``), the
  first one to return takes the whole tail and the later ones get 0: they found the device already drained, so
  they added no idle of their own (DESIGN.md "Blocking syncs", "Rounds": the host is pinned to the device's
  clock, and what it does afterwards runs against an idle device). No idle is counted twice; the shares sum to
  at most 1.

A call's device is its device op's; for a sync, the device its thread last launched work on (by correlation id),
else the first device of its rank. Sites group calls by (call, site frame, ATen op); see :func:`sync_sites`.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np
import pandas as pd

from gaptrace.trace import Trace

from . import stacks
from .timeline import BusyTimeline

__all__ = [
    "SYNC_API_NAMES",
    "PAGEABLE_HOST_MEMORY",
    "api_base_name",
    "is_sync_api",
    "is_memcpy_api",
    "SyncReport",
    "blocking_calls",
    "sync_sites",
    "blocking_syncs",
]

# a device memory free synchronizes the device (CUDA C++ Programming Guide, "Implicit Synchronization"; the
# stream-ordered cudaFreeAsync does not): the caching allocator's frees (torch.cuda.empty_cache()); the replay's
# blocking frees and the allocator-churn finding's drains are these names too
FREE_SYNC_NAMES = ("cudaFree", "cuMemFree")
SYNC_API_NAMES = frozenset({
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaThreadSynchronize",
    "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize",
    "hipStreamSynchronize", "hipDeviceSynchronize", "hipEventSynchronize", "hipCtxSynchronize",
    *FREE_SYNC_NAMES,
})
PAGEABLE_HOST_MEMORY = ("Pageable", "Host")
_MEMCPY_PREFIXES = ("cudaMemcpy", "cuMemcpy", "hipMemcpy")
_RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
RESUME_WINDOW_US = 200.0  # the device "resumes" when it stays >= 50% busy for this long (idle_after_us)


_API_SUFFIX_RE = re.compile(r"(?:_v\d+|_ptsz|_ptds)+$")


def api_base_name(name: str) -> str:
    """A runtime/driver API name without CUPTI's version and per-thread suffixes:
    ``cudaStreamSynchronize_v3020`` -> ``cudaStreamSynchronize``,
    ``cudaMemcpyAsync_ptsz_v7000`` -> ``cudaMemcpyAsync``."""
    return _API_SUFFIX_RE.sub("", name)


def is_sync_api(name: str) -> bool:
    """True for a host API that blocks until device work completes (``SYNC_API_NAMES``, any CUPTI suffix)."""
    return api_base_name(name) in SYNC_API_NAMES


def is_memcpy_api(name: str) -> bool:
    """True for a host memcpy API name (cudaMemcpy, cudaMemcpyAsync, cuMemcpyDtoH_v2, hipMemcpyWithStream, ...)."""
    return name.startswith(_MEMCPY_PREFIXES)


@dataclasses.dataclass
class SyncReport:
    """Result of :func:`blocking_syncs`.

    ``calls``: one row per blocking call (see :func:`blocking_calls` for the columns).
    ``sites``: one row per call site, sorted by blocked_us desc (see :func:`sync_sites`).
    ``total_idle_us``: idle time of all devices over their windows (the denominator of ``idle_share``).
    ``not_blocking``: candidates that showed no evidence of waiting (see the module docstring).
    ``windows``: {(rank, device): (t0_us, t1_us)} used for each device.
    """

    calls: pd.DataFrame
    sites: pd.DataFrame
    total_idle_us: float
    not_blocking: int
    windows: dict[tuple[int, int], tuple[float, float]]

    def to_list(self) -> list[dict[str, Any]]:
        """The ``blocking_syncs`` JSON list: [{call, site, stack, count, blocked_us, idle_after_us, idle_share,
        device_busy_during, ...}], sorted by blocked_us desc."""
        out = []
        for row in self.sites.to_dict("records"):
            d = {}
            for k, v in row.items():
                if k == "stack":
                    d[k] = list(v)
                elif isinstance(v, (np.integer,)):
                    d[k] = int(v)
                elif isinstance(v, (float, np.floating)):
                    d[k] = float(v) if np.isfinite(v) else None
                else:
                    d[k] = v
            out.append(d)
        return out


def _name_flags(names: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(is_sync_api, is_memcpy_api) per row, computed once per symbol of the categorical ``names``."""
    cats = names.cat.categories
    sync = np.fromiter((is_sync_api(str(c)) for c in cats), dtype=bool, count=len(cats))
    memcpy = np.fromiter((is_memcpy_api(str(c)) for c in cats), dtype=bool, count=len(cats))
    codes = names.cat.codes.to_numpy()
    ok = codes >= 0
    return (np.where(ok, sync[np.maximum(codes, 0)], False), np.where(ok, memcpy[np.maximum(codes, 0)], False))


def _device_memcpys(trace: Trace) -> pd.DataFrame:
    """Device memcpys per (rank, correlation): dev_op_us (summed), dev_end_us (last end), device, host_memory,
    memcpy_kind, bytes (summed). One row per correlation id."""
    d = trace.device
    d = d[(d["kind"] == "memcpy") & (d["correlation"] >= 0)]
    if d.empty:
        return pd.DataFrame(columns=["rank", "correlation", "dev_op_us", "dev_end_us", "device", "host_memory",
                                     "memcpy_kind", "bytes"])
    g = d.groupby(["rank", "correlation"], sort=False, observed=True)
    out = g.agg(dev_op_us=("dur_us", "sum"), dev_end_us=("end_us", "max"), device=("device", "first"),
                host_memory=("host_memory", "first"), memcpy_kind=("memcpy_kind", "first"),
                bytes=("bytes", "sum")).reset_index()
    out["host_memory"] = out["host_memory"].astype(str)
    out["memcpy_kind"] = out["memcpy_kind"].astype(str)
    return out


def _thread_codes(rt: pd.DataFrame) -> np.ndarray:
    """One integer per (rank, pid, tid) host thread (dense codes; pid/tid are codes into the symbol table)."""
    n_sym = max(len(rt["pid"].cat.categories), 1)
    key = ((rt["rank"].to_numpy().astype(np.int64) * n_sym + rt["pid"].cat.codes.to_numpy().astype(np.int64))
           * n_sym + rt["tid"].cat.codes.to_numpy().astype(np.int64))
    return np.unique(key, return_inverse=True)[1].reshape(-1)


def _thread_devices(trace: Trace, rt: pd.DataFrame) -> np.ndarray:
    """For each runtime row: the device its thread last launched work on (by correlation id), else the next one it
    launches on, else the first device of its rank, else -1. Vectorised (a per-thread forward/backward fill)."""
    dev = trace.device
    first_dev = (dev[dev["correlation"] >= 0].groupby(["rank", "correlation"], sort=False, observed=True)["device"]
                 .first().rename("launched").reset_index())
    m = rt[["rank", "correlation"]].merge(first_dev, on=["rank", "correlation"], how="left")
    launched = pd.Series(m["launched"].to_numpy(), index=rt.index, dtype="float64")
    code = _thread_codes(rt)
    order = np.lexsort((rt["ts_us"].to_numpy(), code))
    s = launched.iloc[order]
    grp = code[order]
    filled = s.groupby(grp).ffill().groupby(grp).bfill()
    out = pd.Series(filled.to_numpy(), index=s.index).reindex(rt.index)
    if out.isna().any():
        rank_first = dev.groupby("rank", observed=True)["device"].min()
        out = out.fillna(rt["rank"].map(rank_first))
    return out.fillna(-1).to_numpy(np.int64)


def _next_runtime_call(rt: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """For each of ``rows`` (positions in ``rt``): the position in ``rt`` of the first runtime/driver call on the same
    (rank, pid, tid) that starts at or after the row's end (nested driver calls start before it ends), or -1.
    Loops over threads, searchsorted inside each."""
    out = np.full(len(rows), -1, dtype=np.int64)
    if len(rows) == 0:
        return out
    codes = _thread_codes(rt)
    ts = rt["ts_us"].to_numpy()
    ends = rt["end_us"].to_numpy()
    row_codes = codes[rows]
    for c in np.unique(row_codes):
        members = np.flatnonzero(codes == c)
        members = members[np.argsort(ts[members], kind="stable")]
        want = np.flatnonzero(row_codes == c)
        k = np.searchsorted(ts[members], ends[rows[want]], side="left")
        ok = k < len(members)
        out[want[ok]] = members[k[ok]]
    return out


def _device_windows(trace: Trace, window: tuple[float, float] | None, host_wait_only: bool = False
                    ) -> dict[tuple[int, int], tuple[BusyTimeline, np.ndarray]]:
    """Per (rank, device): its BusyTimeline over ``window`` (default: first to last activity of that device;
    with ``host_wait_only`` its device-side gaps count as busy) and the sorted end times of its activities (for the
    evidence test)."""
    from .occupancy import busy_timeline

    out = {}
    dev = trace.device
    for (rank, device), d in dev.groupby(["rank", "device"], sort=True, observed=True):
        key = (int(rank), int(device))
        tl = busy_timeline(trace, key, window, host_wait_only=host_wait_only)  # shared with the other analyses
        out[key] = (tl, np.sort(d["end_us"].to_numpy()))
    return out


def _ends_within(ends_sorted: np.ndarray, s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """True where some end time lies in [s, e]."""
    return np.searchsorted(ends_sorted, e, side="right") > np.searchsorted(ends_sorted, s, side="left")


CALL_COLUMNS = ["host_row", "sync_row", "rank", "pid", "tid", "device", "call", "sync_call", "kind", "ts_us",
                "end_us", "host_us", "device_op_us", "memcpy_kind", "host_memory", "bytes", "blocked_us",
                "busy_us", "device_busy_during", "idle_during_us", "idle_after_us", "aten_row"]


def blocking_calls(trace: Trace, window: tuple[float, float] | None = None, min_blocked_us: float = 0.0,
                   pair_gap_us: float = 50.0, host_wait_only: bool = False) -> tuple[pd.DataFrame, int, dict]:
    """Every host call of ``trace`` that waited for the device (rules and formulas: the module docstring).

    ``window``: (t0_us, t1_us) on the trace clock for every device; default per (rank, device) its first to last
    activity. Calls whose host interval misses the window are left out.
    Returns ``(calls, not_blocking, timelines)``: ``calls`` has one row per blocking call, in time order, with
    columns ``CALL_COLUMNS``: host_row (positional row of the call in ``trace.host``; the copy for a pair),
    sync_row (the paired sync's, or -1), rank, pid, tid, device, call, sync_call ("" if none), kind,
    ts_us / end_us (the unit's span), host_us (host time inside the calls), device_op_us, memcpy_kind,
    host_memory, bytes, blocked_us, busy_us, device_busy_during (0..1), idle_during_us, idle_after_us,
    aten_row (innermost enclosing ATen op's host row, or -1);
    ``not_blocking`` counts candidates without evidence of waiting; ``timelines`` maps (rank, device) to its
    BusyTimeline. Vectorised over calls; loops over threads and devices only.
    """
    host = trace.host
    empty = pd.DataFrame({c: [] for c in CALL_COLUMNS})
    rt_rows = np.flatnonzero(host["cat"].isin(_RUNTIME_CATS).to_numpy())
    if len(rt_rows) == 0:
        return empty, 0, {}
    rt = host.iloc[rt_rows]
    is_sync, is_memcpy = _name_flags(rt["name"])
    name_cats = rt["name"].cat.categories.to_numpy(dtype=object)
    name_codes = rt["name"].cat.codes.to_numpy()

    def names(pos: np.ndarray) -> np.ndarray:
        return np.where(name_codes[pos] >= 0, name_cats[np.maximum(name_codes[pos], 0)], "")

    rt_dev = _thread_devices(trace, rt) if not trace.device.empty else np.full(len(rt), -1, dtype=np.int64)
    tree = stacks.host_tree(trace)
    aten = stacks.innermost_aten_op(tree, rt_rows)

    # sync events (cuda_sync on the device row, joined by correlation)
    ev_device = np.full(len(rt), -1, dtype=np.int64)
    has_event = np.zeros(len(rt), dtype=bool)
    ds = trace.device_syncs
    if not ds.empty:
        kind = ds["sync_kind"].astype(str) + " " + ds["name"].astype(str)
        ds = ds[~kind.str.contains("Wait", case=False) & (ds["correlation"] >= 0)]
        ev = ds.groupby(["rank", "correlation"], observed=True)["device"].first().rename("ev_device").reset_index()
        m = rt[["rank", "correlation"]].merge(ev, on=["rank", "correlation"], how="left")
        # CUPTI also records an "Event Sync" for cudaEventQuery / cudaStreamQuery, which poll and never block
        # tested once per distinct name (a missing name reads "nan": no poll)
        poll_name = np.array(["Query" in str(c) for c in name_cats], dtype=bool)
        polls = np.where(name_codes >= 0, poll_name[np.maximum(name_codes, 0)], False) if len(poll_name) else (
            np.zeros(len(rt), dtype=bool))
        has_event = m["ev_device"].notna().to_numpy() & (rt["correlation"].to_numpy() >= 0) & ~polls
        ev_device = m["ev_device"].fillna(-1).to_numpy(np.int64)

    # copies and their device memcpys
    mc_pos = np.flatnonzero(is_memcpy)
    dm = _device_memcpys(trace)
    mc = rt.iloc[mc_pos][["rank", "correlation"]].merge(dm, on=["rank", "correlation"], how="left")
    pageable = mc["host_memory"].isin(PAGEABLE_HOST_MEMORY).to_numpy()

    # copy followed by a sync: the next runtime call on the thread, same ATen op (or close when neither has one)
    nxt = _next_runtime_call(rt, mc_pos)
    ok = nxt >= 0
    nx = np.maximum(nxt, 0)
    same_op = aten[mc_pos] == aten[nx]
    close = (aten[mc_pos] >= 0) | (rt["ts_us"].to_numpy()[nx] - rt["end_us"].to_numpy()[mc_pos] <= pair_gap_us)
    paired = ok & is_sync[nx] & same_op & close
    sync_row = np.where(paired, nx, -1)
    absorbed = np.zeros(len(rt), dtype=bool)
    absorbed[sync_row[paired]] = True

    host_side = mc["memcpy_kind"].isin(("DtoH", "HtoD")).to_numpy()
    sync_copy = np.fromiter(("Async" not in api_base_name(str(n)) for n in names(mc_pos)), dtype=bool,
                            count=len(mc_pos)) & host_side
    mc_cand = paired | pageable | sync_copy | has_event[mc_pos]
    sync_pos = np.flatnonzero((is_sync | has_event) & ~absorbed & ~is_memcpy)
    ts = rt["ts_us"].to_numpy()
    end = rt["end_us"].to_numpy()
    dur = rt["dur_us"].to_numpy()

    c_mc = mc_pos[mc_cand]
    mcc = mc[mc_cand]
    sr = sync_row[mc_cand]
    has_sync = sr >= 0
    srr = np.maximum(sr, 0)
    dev_op = mcc["dev_op_us"].fillna(0.0).to_numpy()
    mc_dev = mcc["device"].to_numpy()
    mc_dev = np.where(np.isnan(mc_dev.astype(float)), rt_dev[c_mc], mc_dev).astype(np.int64)
    mc_dev = np.where(has_event[c_mc], np.where(mc_dev >= 0, mc_dev, ev_device[c_mc]), mc_dev)
    part_mc = pd.DataFrame({
        "pos": c_mc, "sync_pos": sr, "device": mc_dev, "sync_call": np.where(has_sync, names(srr), ""),
        "kind": np.select([has_sync, pageable[mc_cand], sync_copy[mc_cand]],
                          ["memcpy_then_sync", "pageable_memcpy", "sync_memcpy"], "sync_event"),
        "ts_us": ts[c_mc], "end_us": np.where(has_sync, end[srr], end[c_mc]),
        "host_us": dur[c_mc] + np.where(has_sync, dur[srr], 0.0),
        "device_op_us": dev_op, "dev_end_us": mcc["dev_end_us"].to_numpy(np.float64),
        "memcpy_kind": mcc["memcpy_kind"].fillna("").to_numpy(),
        "host_memory": mcc["host_memory"].fillna("").to_numpy(),
        "bytes": mcc["bytes"].fillna(-1).to_numpy(np.int64),
        "s2": np.where(has_sync, ts[srr], np.nan), "e2": np.where(has_sync, end[srr], np.nan),
    })
    part_sync = pd.DataFrame({
        "pos": sync_pos, "sync_pos": -1,
        "device": np.where(ev_device[sync_pos] >= 0, ev_device[sync_pos], rt_dev[sync_pos]),
        "sync_call": "", "kind": np.where(is_sync[sync_pos], "sync_api", "sync_event"),
        "ts_us": ts[sync_pos], "end_us": end[sync_pos], "host_us": dur[sync_pos], "device_op_us": 0.0,
        "dev_end_us": np.nan, "memcpy_kind": "", "host_memory": "", "bytes": -1, "s2": np.nan, "e2": np.nan,
    })
    cand = pd.concat([part_mc, part_sync], ignore_index=True)
    # an empty part (no memcpy tied to its call: a trace without memcpy activity) has object columns: typed here,
    # so that the sums and bincounts over these columns stay numeric
    cand = cand.astype({"pos": np.int64, "sync_pos": np.int64, "device": np.int64, "bytes": np.int64,
                        **{c: np.float64 for c in ("ts_us", "end_us", "host_us", "device_op_us", "dev_end_us",
                                                   "s2", "e2")}})
    cand["blocked_us"] = np.maximum(cand["host_us"] - cand["device_op_us"], 0.0)
    pos = cand["pos"].to_numpy()
    cand["host_row"] = rt_rows[pos]
    cand["sync_row"] = np.where(cand["sync_pos"] >= 0, rt_rows[np.maximum(cand["sync_pos"], 0)], -1)
    cand["rank"] = rt["rank"].to_numpy()[pos]
    cand["pid"] = rt["pid"].iloc[pos].astype(str).to_numpy()
    cand["tid"] = rt["tid"].iloc[pos].astype(str).to_numpy()
    cand["call"] = names(pos)
    cand["aten_row"] = aten[pos]

    timelines = _device_windows(trace, window, host_wait_only)
    cand["evidence"] = cand["device"] < 0  # no device to test against (a host-only trace): keep the candidate
    cand["busy_us"] = np.nan
    cand["idle_after_us"] = np.nan
    cand["in_window"] = cand["device"] < 0
    for key, (tl, ends_sorted) in timelines.items():
        sel = np.flatnonzero((cand["rank"].to_numpy() == key[0]) & (cand["device"].to_numpy() == key[1]))
        if len(sel) == 0:
            continue
        c = cand.iloc[sel]
        s, e = c["ts_us"].to_numpy(), c["end_us"].to_numpy()
        s2, e2 = c["s2"].to_numpy(), c["e2"].to_numpy()
        two = ~np.isnan(s2)
        # host intervals: the call, plus the paired sync for a pair
        e1 = np.where(two, rt["end_us"].to_numpy()[c["pos"].to_numpy()], e)
        busy = tl.busy_between(s, e1) + np.where(two, tl.busy_between(np.nan_to_num(s2), np.nan_to_num(e2)), 0.0)
        dev_end = c["dev_end_us"].to_numpy()
        has_op = ~np.isnan(dev_end)
        evid = np.where(has_op, np.nan_to_num(dev_end, nan=np.inf) <= e, _ends_within(ends_sorted, s, e))
        cand.loc[cand.index[sel], "busy_us"] = busy
        cand.loc[cand.index[sel], "evidence"] = evid
        cand.loc[cand.index[sel], "in_window"] = (e > tl.t0_us) & (s < tl.t1_us)
    cand = cand[cand["in_window"]]
    is_blocking = cand["evidence"].to_numpy(bool) & (cand["blocked_us"].to_numpy() > min_blocked_us)
    not_blocking = int((~is_blocking).sum())
    calls = cand[is_blocking].sort_values("ts_us", kind="stable").reset_index(drop=True)
    calls["device_busy_during"] = np.where(calls["host_us"] > 0, calls["busy_us"] / calls["host_us"].where(
        calls["host_us"] > 0, 1.0), 0.0)
    calls["idle_during_us"] = np.maximum(calls["host_us"] - calls["busy_us"], 0.0)
    # idle after each call up to the device's next busy span; of the calls ending in one idle gap, the first to
    # return takes the tail (see the module docstring)
    for key, (tl, _) in timelines.items():
        sel = np.flatnonzero((calls["rank"].to_numpy() == key[0]) & (calls["device"].to_numpy() == key[1]))
        if len(sel) == 0:
            continue
        c = calls.iloc[sel]
        order = np.argsort(c["end_us"].to_numpy(), kind="stable")
        e = c["end_us"].to_numpy()[order]
        stop = tl.next_sustained_start(e, RESUME_WINDOW_US)  # non-decreasing in e
        first = np.r_[True, stop[1:] != stop[:-1]]
        idle = np.empty(len(sel))
        idle[order] = np.where(first, tl.idle_between(e, stop), 0.0)
        calls.loc[calls.index[sel], "idle_after_us"] = idle
    calls["busy_us"] = calls["busy_us"].astype(float)
    return calls[CALL_COLUMNS], not_blocking, {k: v[0] for k, v in timelines.items()}



SITE_COLUMNS = ["call", "site", "aten_op", "stack", "count", "blocked_us", "idle_after_us", "idle_share",
                "device_busy_during", "max_blocked_us", "mean_blocked_us", "host_us", "idle_during_us", "kind",
                "sync_call", "inner_op"]


def _call_context(trace: Trace, calls: pd.DataFrame) -> pd.DataFrame:
    """Site, ATen ops, annotation and stack of each blocking call, from :mod:`gaptrace.analyses.stacks`.

    site: innermost enclosing python frame with a source file ("" when the trace has no Python stacks);
    aten_op: outermost op of the ATen chain around the call (``aten::item``, ``aten::to``, ``aten::nonzero``);
    inner_op: the innermost one (``aten::_local_scalar_dense``, ``aten::copy_``); annotation: innermost
    record_function / NVTX range; stack: python frames from the site outward, or, without a site, the annotation
    and op frames from the call outward.
    """
    tree = stacks.host_tree(trace)
    rows = calls["host_row"].to_numpy(np.int64)
    site_rows = stacks.innermost_site(tree, rows)
    outer_rows = stacks.outermost_aten_op(tree, rows)
    inner_rows = calls["aten_row"].to_numpy(np.int64)
    ann_mask = tree.cat == stacks.CAT_CODE["user_annotation"]
    ann_nodes = stacks.enclosing(tree, tree.nodes(rows), ann_mask)
    sid, py_stacks = stacks.frame_stacks(tree, site_rows)
    stack = [py_stacks[i] for i in sid]
    no_site = np.flatnonzero(site_rows < 0)
    if len(no_site):
        sid2, op_stacks = stacks.frame_stacks(tree, rows[no_site], cats=("user_annotation", "cpu_op"),
                                              include_self=False)
        for k, i in zip(no_site, sid2):
            stack[k] = op_stacks[i]
    return pd.DataFrame({
        "site": tree.frame_names(tree.nodes(site_rows)),
        "aten_op": tree.frame_names(tree.nodes(outer_rows)),
        "inner_op": tree.frame_names(tree.nodes(inner_rows)),
        "annotation": tree.frame_names(ann_nodes),
        "stack": stack,
    }, index=calls.index)


def sync_sites(calls: pd.DataFrame, total_idle_us: float) -> pd.DataFrame:
    """Blocking calls grouped by call site: (call, site, aten_op), sorted by blocked_us desc.

    ``calls`` needs the columns of :func:`blocking_calls` plus site, aten_op, inner_op, stack (see
    :func:`blocking_syncs`). Columns ``SITE_COLUMNS``: count, blocked_us (sum), idle_after_us (sum), idle_share
    (idle_after_us / ``total_idle_us``, 0..1), device_busy_during (time-weighted: Σ busy / Σ host time),
    max_blocked_us, mean_blocked_us, host_us, idle_during_us (sums); stack: the site's stack with the most blocked
    time; kind, sync_call and inner_op: the most frequent value in the site.
    """
    if calls.empty:
        return pd.DataFrame({c: [] for c in SITE_COLUMNS})
    key = ["call", "site", "aten_op"]
    c = calls.copy()
    c["stack_key"] = [tuple(s) for s in c["stack"]]
    g = c.groupby(key, sort=False)
    out = g.agg(count=("blocked_us", "size"), blocked_us=("blocked_us", "sum"), host_us=("host_us", "sum"),
                max_blocked_us=("blocked_us", "max"), mean_blocked_us=("blocked_us", "mean"))
    for col in ("idle_after_us", "busy_us", "idle_during_us"):  # NaN (no device timeline) stays NaN
        out[col] = g[col].sum(min_count=1)
    for col in ("kind", "sync_call", "inner_op"):
        out[col] = g[col].agg(lambda s: s.value_counts().index[0])
    per_stack = c.groupby(key + ["stack_key"], sort=False)["blocked_us"].sum().reset_index()
    best = per_stack.loc[per_stack.groupby(key, sort=False)["blocked_us"].idxmax()].set_index(key)["stack_key"]
    out["stack"] = best.reindex(out.index)
    out["idle_share"] = out["idle_after_us"] / total_idle_us if total_idle_us > 0 else 0.0
    out["device_busy_during"] = np.where(out["host_us"] > 0, out["busy_us"] / out["host_us"].where(
        out["host_us"] > 0, 1.0), 0.0)
    out = out.reset_index().sort_values(["blocked_us", "count"], ascending=False, kind="stable")
    return out[SITE_COLUMNS].reset_index(drop=True)


def blocking_syncs(trace: Trace, window: tuple[float, float] | None = None, min_blocked_us: float = 0.0,
                   pair_gap_us: float = 50.0, host_wait_only: bool = False) -> SyncReport:
    """Blocking syncs of ``trace`` per call site (DESIGN.md "Blocking syncs").

    ``window``: (t0_us, t1_us) for every device, default per (rank, device) its first to last activity;
    ``min_blocked_us``: report only calls blocked longer than this (default 0: any positive blocked time);
    ``pair_gap_us``: how close a sync must follow a copy to pair with it when neither sits in an ATen op;
    ``host_wait_only``: busy/idle during and after each call from a timeline whose device-side gaps count as busy
    (:func:`gaptrace.analyses.occupancy.fill_device_side`), so sub-µs bubbles between queued kernels are not
    charged to the call; ``idle_share`` then divides by host-wait idle.
    Rules and formulas: the module docstring. ``idle_share`` divides by the idle time of all devices over their
    windows. A trace without GPU events still gets its sync API calls (no evidence test, busy/idle NaN).
    """
    calls, not_blocking, timelines = blocking_calls(trace, window, min_blocked_us, pair_gap_us, host_wait_only)
    if not calls.empty:
        calls = pd.concat([calls, _call_context(trace, calls)], axis=1)
    total_idle = float(sum(tl.idle_us for tl in timelines.values()))
    sites = sync_sites(calls, total_idle)
    windows = {k: (tl.t0_us, tl.t1_us) for k, tl in timelines.items()}
    return SyncReport(calls=calls, sites=sites, total_idle_us=total_idle, not_blocking=not_blocking,
                      windows=windows)
