"""Stragglers: the time each rank spent inside a collective waiting for the last rank to arrive, charged to that
late rank and to the host frames it had open meanwhile (DESIGN.md "Fleets and stragglers").

For one collective instance i (:func:`gaptrace.analyses.collectives.match_collectives`, times on the fleet's
aligned clock) with arrival = kernel start s_{r,i} and duration d_{r,i} on rank r:

    last_i          = max_r s_{r,i}                      (the late rank L_i: the one arriving last; ties: lowest rank)
    wait_{r,i}      = min(max(last_i − s_{r,i}, 0), d_{r,i})    µs: inside the kernel, before the last arrival
    total_wait_i    = Σ_r wait_{r,i}                     (charged to L_i; L_i's own wait is 0)
    interval_i      = [min_r s_{r,i}, last_i]            the span on L_i's clock during which the others waited

Per rank: ``waited_us`` = Σ_i wait_{r,i}; ``caused_us`` = Σ_i total_wait_i over the instances it was late to;
the wait matrix W[r][l] = Σ wait_{r,i} over the instances whose late rank is l. Occupancy stays as measured (a
waiting NCCL kernel spins on the device: busy); ``busy_without_waiting`` = (busy_us − |∪_i [s_{r,i}, s_{r,i} +
wait_{r,i}]|) / window_us: the waiting intervals lie inside kernels, so their union is exactly the busy time that
was waiting.

Host frames (:func:`charge_frames`): the intervals of one late rank, on its own clock, become the *idle* spans of a
timeline (everything else busy) and the gap-attribution machinery (:func:`gaptrace.analyses.gaps.event_idle_on`,
:func:`gaptrace.analyses.idle_sites.idle_sites`) charges them to the innermost Python frame with a source file
open on the late rank's host, clipped to the intervals and merged over threads, as idle gaps are charged today.
A site's ``charged_wait_us`` = its share of the intervals × the rank's ``caused_us``.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from gaptrace.trace import Trace

from .timeline import BusyTimeline, merge_intervals

__all__ = ["instance_waits", "rank_waits", "wait_matrix", "late_intervals", "charge_frames", "ranks_text",
           "straggler_line"]


def instance_waits(long: pd.DataFrame) -> pd.DataFrame:
    """``long`` (:func:`~gaptrace.analyses.collectives.match_collectives`) with wait_us per row and, per instance,
    last_us (last arrival), first_us (first arrival), late_rank, total_wait_us (module docstring). µs."""
    if long.empty:
        return long.assign(wait_us=[], last_us=[], first_us=[], late_rank=[], total_wait_us=[])
    t = long.copy()
    g = t.groupby("instance")["start_us"]
    t["last_us"] = g.transform("max")
    t["first_us"] = g.transform("min")
    t["wait_us"] = np.clip(t["last_us"] - t["start_us"], 0.0, t["dur_us"].clip(lower=0.0))
    at_last = t[t["start_us"] == t["last_us"]]
    late = at_last.groupby("instance")["rank"].min()
    t["late_rank"] = t["instance"].map(late).astype(np.int64)
    t["total_wait_us"] = t.groupby("instance")["wait_us"].transform("sum")
    return t


def rank_waits(waits: pd.DataFrame, ranks: list[int]) -> dict[int, dict[str, float]]:
    """Per rank: waited_us, caused_us (module docstring), instances (matched instances it took part in),
    late_count (instances it was late to), waiting_union_us (|∪ [s, s + wait]|, for busy_without_waiting)."""
    out = {r: {"waited_us": 0.0, "caused_us": 0.0, "instances": 0, "late_count": 0, "waiting_union_us": 0.0}
           for r in ranks}
    if waits.empty:
        return out
    per = waits.groupby("instance").first()
    for r, grp in waits.groupby("rank"):
        s = grp["start_us"].to_numpy()
        w = grp["wait_us"].to_numpy()
        us, ue = merge_intervals(s[w > 0], (s + w)[w > 0])
        out.setdefault(int(r), dict(out.get(int(r), {})))
        out[int(r)].update(waited_us=float(w.sum()), instances=int(len(grp)), waiting_union_us=float((ue - us).sum()))
    for r, grp in per.groupby("late_rank"):
        if int(r) in out:
            out[int(r)].update(caused_us=float(grp["total_wait_us"].sum()), late_count=int(len(grp)))
    return out


def wait_matrix(waits: pd.DataFrame, ranks: list[int]) -> list[list[float]]:
    """W[i][j] (µs): rank ranks[i]'s wait in the instances whose late rank is ranks[j]. Rows sum to waited_us."""
    idx = {r: i for i, r in enumerate(ranks)}
    m = [[0.0] * len(ranks) for _ in ranks]
    if waits.empty:
        return m
    for (r, late), w in waits.groupby(["rank", "late_rank"])["wait_us"].sum().items():
        if int(r) in idx and int(late) in idx:
            m[idx[int(r)]][idx[int(late)]] = float(w)
    return m


def late_intervals(waits: pd.DataFrame, rank: int, offset_us: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """The intervals [first_us, last_us] of the instances ``rank`` was late to (with a positive total wait), on
    that rank's own clock (aligned µs − ``offset_us``). Shapes (k,), (k,)."""
    if waits.empty:
        return np.empty(0), np.empty(0)
    per = waits.groupby("instance").first()
    per = per[(per["late_rank"] == rank) & (per["total_wait_us"] > 0) & (per["last_us"] > per["first_us"])]
    return per["first_us"].to_numpy() - offset_us, per["last_us"].to_numpy() - offset_us


def charge_frames(trace: Trace, rank: int, starts_us: np.ndarray, ends_us: np.ndarray, caused_us: float,
                  limit: int = 10) -> list[dict[str, Any]]:
    """The host sites of ``rank`` in ``trace`` open during the intervals (its own clock, µs), largest first.

    Each row: site (innermost Python frame with a source file; "(no Python frame)" / "(thread waiting)" as in
    :func:`gaptrace.analyses.idle_sites.idle_sites`), range (the innermost NVTX / record_function range there),
    interval_us (µs of the intervals' union with the site innermost on some thread of the rank), share
    (interval_us / the union's length), charged_wait_us (share × ``caused_us``). At most ``limit`` rows; [] when
    the rank has no host events or the intervals are empty.
    """
    from .gaps import event_idle_on
    from .idle_sites import idle_sites

    s, e = merge_intervals(np.asarray(starts_us, np.float64), np.asarray(ends_us, np.float64))
    total = float((e - s).sum())
    host = trace.host[trace.host["rank"].to_numpy() == rank]
    if total <= 0 or host.empty:
        return []
    t0 = float(min(s[0], host["ts_us"].min()))
    t1 = float(max(e[-1], host["end_us"].max()))
    # the complement of the intervals is "busy": what is left idle is exactly the intervals
    busy_s = np.r_[t0, e]
    busy_e = np.r_[s, t1]
    tl = BusyTimeline.from_intervals(busy_s, busy_e, t0, t1)
    ev = event_idle_on(trace, (rank, -1), tl, exclude_parked=True)
    sites = idle_sites(ev, idle_total_us=total)
    rows = []
    for r in sites.head(limit).itertuples(index=False):
        rows.append({"site": r.site, "range": r.range, "interval_us": float(r.idle_us), "share": float(r.share),
                     "charged_wait_us": float(r.share) * caused_us})
    return rows


def ranks_text(ranks: list[int]) -> str:
    """Ranks as runs: [0, 1, 2, 3, 5] -> "ranks 0–3, 5"; [4] -> "rank 4"."""
    rs = sorted(set(int(r) for r in ranks))
    if len(rs) == 1:
        return f"rank {rs[0]}"
    runs, start, prev = [], rs[0], rs[0]
    for r in rs[1:] + [None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        runs.append(f"{start}" if start == prev else f"{start}–{prev}" if prev > start + 1 else f"{start}, {prev}")
        if r is not None:
            start = prev = r
    return "ranks " + ", ".join(runs)


def straggler_line(waiters: list[int], waited_us: float, steps: int | None, label: str, late: int,
                   site: str | None) -> str:
    """The findings line: "ranks 0–6 waited 1.8 ms a step in ncclAllReduce for rank 7, whose host was in
    scheduler.py(412): plan". ``waited_us``: the waiters' mean wait over all matched instances late rank ``late``
    caused, per step when ``steps`` (> 0) is given, else in all."""
    from .findings import ms_text

    per = waited_us / steps if steps else waited_us
    when = " a step" if steps else " in all"
    where = f", whose host was in {site}" if site else ""
    return f"{ranks_text(waiters)} waited {ms_text(per)}{when} in {label} for rank {late}{where}"
