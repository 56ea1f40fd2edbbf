"""Collective kernels (NCCL / RCCL) of each rank, the same collective matched across ranks, and the ranks' clocks
aligned (DESIGN.md "Fleets and stragglers").

- **Recognised** by the device kernel's name: ``ncclDevKernel_AllReduce_Sum_f32_RING_LL``, ``ncclKernel_SendRecv_…``
  (NCCL), ``rccl…`` / the same ``nccl…`` names under HIP (RCCL). Kineto writes the collective's args on the kernel
  (PyTorch >= 2.2: ``Collective name``, ``Process Group Name``, ``Group size``, ...) and on the ``record_param_comms``
  cpu_op that launched it, which shares the kernel's ``External id``; both are read by
  :func:`gaptrace.loader.comm_args`. A collective replayed from a CUDA graph has neither: only its kernel name and
  the graph launch's correlation.
- **Matched** across ranks (:func:`match_collectives`) by (process group, ``Seq``) when every kernel carries a
  sequence number, else by order: the k-th kernel of one name in one process group (or, without args, the k-th of
  that name on the rank) is the same collective on every rank. A collective found on fewer than two ranks is left
  out.
- **Clocks**: each rank's times are shifted onto one clock by its own ``baseTimeNanoseconds`` (Kineto's epoch
  offset of the trace's ``ts``): offset_us(r) = (base_ns(r) − base_ns(ref)) / 1000 with ref the smallest base, so
  the sum stays in float64's exact range. The check: a collective ends together on every rank (its last step is a
  rendezvous), so after the shift each rank's median of (end − the instance's median end) is its residual clock
  error (:func:`clock_check`).
"""
from __future__ import annotations

import re
from typing import Any, Iterable

import numpy as np
import pandas as pd

from gaptrace.trace import Trace

__all__ = ["COLLECTIVE_KERNEL_RE", "is_collective_kernel", "collective_op", "collective_kernels", "base_time_ns",
           "clock_offsets_us", "match_collectives", "clock_check", "KERNEL_COLUMNS"]

# NCCL: ncclDevKernel_<Op>_..., ncclKernel_<Op>_...; RCCL (HIP) keeps NCCL's names and adds rccl*-named kernels
COLLECTIVE_KERNEL_RE = re.compile(r"^(?:nccl|rccl)", re.IGNORECASE)
_OP_RE = re.compile(r"^(?:nccl|rccl)(?:Dev)?Kernel_([A-Za-z]+)", re.IGNORECASE)
KERNEL_COLUMNS = ["rank", "device", "stream", "name", "label", "ts_us", "end_us", "dur_us", "correlation",
                  "external_id", "process_group", "collective", "group_size", "seq"]


def is_collective_kernel(name: str) -> bool:
    """True for an NCCL / RCCL device kernel name (``ncclDevKernel_*``, ``ncclKernel_*``, ``rccl*``)."""
    return bool(COLLECTIVE_KERNEL_RE.match(name))


def collective_op(name: str) -> str:
    """The collective a kernel name runs, as a label: ``ncclDevKernel_AllReduce_Sum_f32_RING_LL`` ->
    ``ncclAllReduce``, ``ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(...)`` -> ``ncclSendRecv``; another collective
    kernel name -> its name up to the first ``(``."""
    m = _OP_RE.match(name)
    if m:
        return ("rccl" if name[:4].lower() == "rccl" else "nccl") + m.group(1)
    return name.split("(", 1)[0]


def collective_kernels(trace: Trace, comm: pd.DataFrame | None = None) -> pd.DataFrame:
    """The collective kernels of ``trace`` (every rank), one row each, sorted by (rank, ts_us).

    Columns ``KERNEL_COLUMNS``: rank, device, stream, name (the kernel's, up to its argument list), label
    (:func:`collective_op`), ts_us, end_us, dur_us (µs, the trace's own clock), correlation, external_id, and from
    the collective's args (the kernel's own, else its ``record_param_comms`` launch's by External id; ``comm``:
    :func:`gaptrace.loader.comm_args` of the trace, read when None): process_group, collective (str, "" when
    absent), group_size, seq (-1 when absent).
    """
    dev = trace.device
    if dev.empty:
        return pd.DataFrame({c: [] for c in KERNEL_COLUMNS})
    codes = dev["name"].cat.codes.to_numpy()
    is_coll = np.array([is_collective_kernel(str(s)) for s in trace.symbols] + [False], dtype=bool)
    rows = dev[(dev["kind"] == "kernel").to_numpy() & is_coll[codes]]
    out = pd.DataFrame({
        "rank": rows["rank"].to_numpy(np.int64),
        "device": rows["device"].to_numpy(np.int64),
        "stream": rows["stream"].to_numpy(np.int64),
        "name": [str(n).split("(", 1)[0] for n in rows["name"]],
        "ts_us": rows["ts_us"].to_numpy(), "end_us": rows["end_us"].to_numpy(), "dur_us": rows["dur_us"].to_numpy(),
        "correlation": rows["correlation"].to_numpy(np.int64), "external_id": rows["external_id"].to_numpy(np.int64),
    })
    out.insert(4, "label", [collective_op(n) for n in out["name"]])
    out["process_group"], out["collective"] = "", ""
    out["group_size"], out["seq"] = -1, -1
    if len(out):
        if comm is None:
            from gaptrace.loader import comm_args
            comm = comm_args(trace)
        _join_args(out, comm)
    return out.sort_values(["rank", "ts_us"], kind="stable").reset_index(drop=True)[KERNEL_COLUMNS]


def _join_args(out: pd.DataFrame, comm: pd.DataFrame) -> None:
    """Fill process_group / collective / group_size / seq of ``out`` in place: a kernel's own args row (same rank,
    cat kernel, same correlation) first, else its launch's ``record_param_comms`` row (same rank, same
    External id)."""
    if comm is None or comm.empty:
        return
    fields = ["process_group", "collective", "group_size", "seq"]

    def lookup(rows: pd.DataFrame, key: str) -> dict:
        rows = rows[rows[key].to_numpy() >= 0].drop_duplicates(["rank", key], keep="first")
        return {(int(r), int(k)): v for r, k, *v in rows[["rank", key, *fields]].itertuples(index=False)}

    own = lookup(comm[comm["cat"].astype(str) == "kernel"], "correlation")
    launch = lookup(comm[comm["name"].astype(str) == "record_param_comms"], "external_id")
    vals = {f: out[f].tolist() for f in fields}
    for i, (r, c, x) in enumerate(zip(out["rank"], out["correlation"], out["external_id"])):
        v = own.get((int(r), int(c))) if c >= 0 else None
        if v is None and x >= 0:
            v = launch.get((int(r), int(x)))
        if v is None:
            continue
        for f, val in zip(fields, v):
            if f in ("process_group", "collective"):
                vals[f][i] = "" if val is None or (isinstance(val, float) and np.isnan(val)) else str(val)
            else:
                vals[f][i] = int(val)
    for f in fields:
        out[f] = vals[f]


def base_time_ns(metadata: dict[str, Any]) -> int | None:
    """The trace's ``baseTimeNanoseconds`` (an int ≥ 0), or None when absent or not an integer."""
    v = metadata.get("baseTimeNanoseconds") if isinstance(metadata, dict) else None
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63 else None


def clock_offsets_us(bases_ns: dict[int, int | None]) -> tuple[dict[int, float], str | None]:
    """Per rank the µs to add to its times to put them on the fleet's clock: (base_ns(r) − min base) / 1000, exact
    integer arithmetic before the one division. ({rank: 0.0}, a warning line) when any rank lacks its base."""
    missing = sorted(r for r, b in bases_ns.items() if b is None)
    if missing:
        return ({r: 0.0 for r in bases_ns},
                f"ranks {', '.join(map(str, missing))} have no baseTimeNanoseconds: their clocks are taken as equal")
    ref = min(bases_ns.values()) if bases_ns else 0
    return {r: (b - ref) / 1000.0 for r, b in bases_ns.items()}, None


def _keys(t: pd.DataFrame) -> tuple[pd.Series, str]:
    """The instance key of each kernel row and how it was made ("seq" or "order")."""
    if len(t) and (t["seq"].to_numpy() >= 0).all() and (t["process_group"] != "").all():
        return t["process_group"] + "#" + t["seq"].astype(str), "seq"
    group = t["process_group"] + "|" + t["name"]
    k = t.groupby(["rank", "process_group", "name"], sort=False).cumcount()
    return group + "|" + k.astype(str), "order"


def match_collectives(kernels: Iterable[pd.DataFrame], offsets_us: dict[int, float] | None = None
                      ) -> tuple[pd.DataFrame, str]:
    """The same collective on every rank: (long table, key kind).

    ``kernels``: :func:`collective_kernels` tables (one per rank, or one of several ranks). ``offsets_us``: per
    rank µs added to its times (:func:`clock_offsets_us`; default none). Returns one row per (instance, rank) with
    columns instance (0.. in order of the instance's first arrival), key, label, rank, start_us, end_us, dur_us
    (aligned µs), and the key kind: "seq" (process group + Seq on every kernel) or "order" (k-th kernel of one
    name in one process group per rank). Instances seen on fewer than two ranks are dropped.
    """
    parts = [k for k in kernels if len(k)]
    cols = ["instance", "key", "label", "rank", "start_us", "end_us", "dur_us"]
    t = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    if t.empty:
        return pd.DataFrame({c: [] for c in cols}), "order"
    t = t.sort_values(["rank", "ts_us"], kind="stable").reset_index(drop=True)
    key, kind = _keys(t)
    off = t["rank"].map(offsets_us or {}).fillna(0.0).to_numpy(np.float64)
    long = pd.DataFrame({"key": key.to_numpy(), "label": t["label"].to_numpy(), "rank": t["rank"].to_numpy(),
                         "start_us": t["ts_us"].to_numpy() + off, "end_us": t["end_us"].to_numpy() + off,
                         "dur_us": t["dur_us"].to_numpy()})
    long = long.drop_duplicates(["key", "rank"], keep="first")
    n = long.groupby("key")["rank"].transform("size")
    long = long[n.to_numpy() >= 2]
    first = long.groupby("key")["start_us"].min().sort_values(kind="stable")
    order = pd.Series(np.arange(len(first)), index=first.index)
    long.insert(0, "instance", long["key"].map(order).to_numpy(np.int64))
    return long.sort_values(["instance", "rank"], kind="stable").reset_index(drop=True)[cols], kind


def clock_check(long: pd.DataFrame) -> dict[int, float]:
    """Per rank, the median over its matched instances of (its end − the instance's median end), µs: the residual
    clock error after alignment (a collective ends together on every rank). {} without matched instances."""
    if long.empty:
        return {}
    med = long.groupby("instance")["end_us"].transform("median")
    resid = long["end_us"] - med
    return {int(r): float(v) for r, v in resid.groupby(long["rank"]).median().items()}
