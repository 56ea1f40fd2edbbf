"""Verify rounds: the round timing model (Tround, TGPU, Thost, Tserial, τ, TPOT) read off a trace.

With one host annotation per verify round (the runtime's NVTX/record_function range ``round``), for round i with
host range [s_i, e_i] and period [s_i, s_{i+1}) (start to start; the last round has no period and is dropped):

- ``t_round_us``  = s_{i+1} − s_i, the round period;
- ``t_gpu_us``    = device busy time inside the period (busy(s_{i+1}) − busy(s_i); DESIGN.md "Rounds": TGPU);
- ``t_host_us``   = host dispatch time inside the round: the round range's length e_i − s_i minus the time its thread
  spent blocked in sync calls inside it (blocked_us of :mod:`.syncs`), i.e. the host's own work;
- ``t_serial_us`` = device idle time inside the period: host work that ran against an idle device.
  t_round_us = t_gpu_us + t_serial_us exactly, since busy + idle = period.
- ``tau`` and ``tpot_us`` = t_round_us / tau when the capture sidecar holds the accepted tokens per round.

Verdict: an overlapped scheduler runs at Tround ≈ max(TGPU, Thost); with even one sync point inside the
round it degrades to Tround ≈ TGPU + Tserial, because the host is pinned to the device's clock. A trace is called
``serialized`` when the median round holds blocking sync time (``blocked_us``, from :mod:`.syncs`) of at least
``SERIAL_BLOCKED_SHARE`` of Tround, else ``overlapped``; ``bound`` says which side is longer (GPU or host) and
``overlap_excess`` = (Tround − max(TGPU, Thost)) / Tround how far the period is from the overlapped ideal (idle that
no sync explains: late launches, profiler-inflated graph launches). The summary uses per-round medians so that one
warm-up round cannot decide it.

The summary's figures are means over the steady rounds (``rounds_steady``; ``rounds_excluded`` lists the others):
every round but the first when the first period is shorter than (1 − ``STEADY_TOLERANCE``) × the median period. The
first period after the profiler starts begins on a drained device queue (the start synchronises, and the overlapped
host's next round does not wait on a readback): short by a third on the shipped fused bs-8 capture, it made an
all-round mean understate Tround by 7% there and the profiled round look faster than the unprofiled one. Other short
or long rounds are the workload's own (a smaller batch bucket, a JIT compile) and stay in the mean.

A trace of several profiler windows (:attr:`gaptrace.trace.Trace.windows`: a ``schedule`` with ``repeat``, joined
files) has periods that run from a round in one window to a round in the next, across a stretch the profiler did
not record: those periods (``window_join`` in the table, ``window_joins`` in the summary) are in no figure, and the
first-period rule applies to each window's first period.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Sequence

import numpy as np
import pandas as pd

from gaptrace.sidecar import Sidecar, as_sidecar
from gaptrace.text import to_jsonable
from gaptrace.trace import Trace

from .launch_fit import launch_inflation_us, launch_points
from .occupancy import busy_timeline, resolve_device

__all__ = ["RoundsReport", "rounds", "duplicate_ranges", "ranges_inside_earlier", "inside_note", "SERIAL_BLOCKED_SHARE", "STEADY_TOLERANCE", "ROUND_NAME"]

ROUND_NAME = "round"
SERIAL_BLOCKED_SHARE = 0.05
STEADY_TOLERANCE = 0.25  # a first round shorter than 75% of the median period started on a drained queue


@dataclasses.dataclass
class RoundsReport:
    """Per-round table and the trace-level verdict. Times in µs.

    ``table`` columns: round, start_us, t_round_us, t_gpu_us, t_host_us, t_serial_us, blocked_us, launch_nodes
    (Σ graph nodes launched in the round), tau, tpot_us (NaN without a sidecar), window_join (the period spans
    two profiler windows: module docstring).
    With κ: ``launch_inflation_us`` per round, Σ min(κ·N, host time) over its graph launches (the profiler's share
    of their host time), ``exposed_inflation_us``, Σ min(that, device idle during the launch's host call) (the part
    the device waited through: what the inflation can have added to the round; inflation under queued device work
    adds nothing), and ``t_host_less_inflation_us`` = t_host_us − launch_inflation_us.
    ``host_ranges``: :func:`host_by_range`.
    ``summary``: means of those over the steady rounds (they add up; ``rounds_steady``, ``rounds_excluded``: see the
    module docstring), ``verdict`` ("overlapped" | "serialized", from medians), ``bound``
    ("GPU" when median TGPU >= median Thost, else "host"), ``overlap_excess`` ((Tround −
    max(TGPU, Thost)) / Tround), and the profiler check when the sidecar has unprofiled round times:
    ``unprofiled_round_us``, ``profiler_excess_us`` (profiled − unprofiled Tround) and ``kappa_explained_us``
    (κ · mean Σ N per round, the launch fit's estimate of the profiler's share) with ``kappa_explained_share``, and
    ``kappa_exposed_us`` (mean ``exposed_inflation_us``: the κ·N the device waited through, the inflation's
    critical-path share) with ``kappa_exposed_share`` (of ``profiler_excess_us``).
    """

    table: pd.DataFrame
    summary: dict[str, Any]
    host_ranges: pd.DataFrame = dataclasses.field(default_factory=pd.DataFrame)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able {summary, rounds: [table rows], host_ranges: [rows]} (NaN -> None)."""
        return to_jsonable({"summary": self.summary, "rounds": self.table.to_dict("records"),
                            "host_ranges": self.host_ranges.to_dict("records")})


def rounds(trace: Trace, name: str = ROUND_NAME, device: int | tuple[int, int] | None = None,
           sidecar: Sidecar | dict | None = None, kappa_us_per_node: float | None = None,
           sync_calls: pd.DataFrame | None = None, launches: pd.DataFrame | None = None, *,
           taus: Sequence[float] | None = None, unprofiled_round_ms: float | None = None) -> RoundsReport | None:
    """The round table of ``trace`` (module docstring), or None when it has fewer than two ``name`` annotations.

    ``taus``: tokens accepted per round in trace order (NaN: unknown; :attr:`gaptrace.sidecar.Sidecar.round_taus`);
    ``unprofiled_round_ms``: the unprofiled round period in ms (:attr:`gaptrace.sidecar.Sidecar.measured_round_ms`);
    ``sidecar``: a capture sidecar (a :class:`gaptrace.sidecar.Sidecar` or its parsed dict) to take both from
    instead; ``kappa_us_per_node``: κ from :func:`gaptrace.analyses.launch_fit.launch_fit` for the profiler check;
    ``sync_calls``: :attr:`.syncs.SyncReport.calls` already computed over a window containing the rounds;
    ``launches``: :func:`.launch_fit.launch_points` already computed (the fit's ``points``).
    Rounds are the host user_annotation ranges named ``name`` (or ``name_<n>``) on the rank of the analysed device, sorted by start.
    """
    from . import syncs

    h = trace.host
    if trace.device.empty:
        return None
    key = resolve_device(trace, device)
    ua, match, ua_rows, n_dup, n_inside = _round_annotations(trace, key[0], name)
    sel = ua[match].sort_values("ts_us", kind="stable")
    if len(sel) < 2:
        return None
    s = sel["ts_us"].to_numpy()
    e = sel["end_us"].to_numpy()
    tid = sel["tid"].astype(str).to_numpy()
    tl = busy_timeline(trace, key, (float(s[0]), float(s[-1])))
    ps, pe = s[:-1], s[1:]
    t_round = pe - ps
    t_gpu = tl.busy_between(ps, pe)
    t_serial = t_round - t_gpu
    # blocked time of sync calls inside each round, on the round's own thread
    # blocked time per call does not depend on the window: reuse the caller's blocking calls when given
    calls = (sync_calls if sync_calls is not None
             else syncs.blocking_syncs(trace, window=(float(s[0]), float(s[-1]))).calls)
    blocked = np.zeros(len(ps))
    if not calls.empty:
        c = calls[calls["rank"].to_numpy() == key[0]]
        cts = c["ts_us"].to_numpy()
        idx = np.searchsorted(ps, cts, side="right") - 1
        ok = (idx >= 0) & (idx < len(ps))
        ok &= cts < e[:-1][np.clip(idx, 0, len(ps) - 1)]
        ok &= c["tid"].astype(str).to_numpy() == tid[:-1][np.clip(idx, 0, len(ps) - 1)]
        blocked = np.bincount(idx[ok], weights=c["blocked_us"].to_numpy()[ok], minlength=len(ps))
    t_host = np.maximum((e[:-1] - ps) - blocked, 0.0)
    # graph nodes launched per round (for κ·ΣN), and the profiler's share of those launches' host time
    nodes = np.zeros(len(ps))
    inflation = np.zeros(len(ps))
    exposed = np.zeros(len(ps))
    if launches is None:
        launches = launch_points(trace)[0]
    launches = launches[launches["rank"].to_numpy() == key[0]]
    linfl = launch_inflation_us(launches["nodes"], launches["dur_us"], kappa_us_per_node)
    if len(launches):
        lts = launches["ts_us"].to_numpy()
        li = np.searchsorted(ps, lts, side="right") - 1
        ok = (li >= 0) & (lts < pe[np.clip(li, 0, len(ps) - 1)])
        nodes = np.bincount(li[ok], weights=launches["nodes"].to_numpy(np.float64)[ok], minlength=len(ps))
        inflation = np.bincount(li[ok], weights=linfl[ok], minlength=len(ps))
        # the part of each launch's inflation the device waited through: it idled for want of launched work during
        # the launch's host call (host-wait idle: device-side bubbles between queued kernels do not count), so a
        # launch shorter by kN would have started the graph up to that much sooner (a critical-path bound);
        # inflation hidden behind queued device work costs the round nothing
        lend = lts + launches["dur_us"].to_numpy(np.float64)
        wait_tl = busy_timeline(trace, key, (float(s[0]), float(s[-1])), host_wait_only=True)
        waited = wait_tl.idle_between(lts[ok], np.minimum(lend[ok], pe[li[ok]]))
        exposed = np.bincount(li[ok], weights=np.minimum(linfl[ok], waited), minlength=len(ps))
    side = as_sidecar(sidecar)
    if side is not None:
        taus, unprofiled_round_ms = side.round_taus, side.measured_round_ms
    tau = np.full(len(ps), np.nan)
    if taus:
        m = min(len(taus), len(ps))
        tau[:m] = taus[:m]
    table = pd.DataFrame({"round": np.arange(len(ps)), "start_us": ps, "t_round_us": t_round, "t_gpu_us": t_gpu,
                          "t_host_us": t_host, "t_serial_us": t_serial, "blocked_us": blocked,
                          "launch_nodes": nodes, "launch_inflation_us": inflation,
                          "exposed_inflation_us": exposed,
                          "t_host_less_inflation_us": t_host - inflation, "tau": tau,
                          "tpot_us": np.divide(t_round, tau, out=np.full(len(ps), np.nan), where=tau > 0)})
    # the figures are means over the steady rounds (they add up: Tround = TGPU + Tserial); the verdict and the bound
    # use medians, so one warm-up or hiccup round (lazy loading, a JIT compile) cannot decide them
    # a period whose two starts lie in different profiler windows spans a stretch the profiler did not record
    # (Trace.window_joins): no round of the loop, kept in the table, out of every figure
    joins = trace.window_joins(s, key[0])
    table["window_join"] = joins
    med = table[~joins].median(numeric_only=True) if (~joins).any() else table.median(numeric_only=True)
    steady = ~joins
    # the first period of each window may begin on a drained queue (module docstring)
    for f in np.flatnonzero(np.concatenate(([True], joins[:-1]))):
        if f < len(t_round) and not joins[f]:
            steady[f] = len(t_round) < 3 or t_round[f] >= (1.0 - STEADY_TOLERANCE) * med["t_round_us"]
    if not steady.any():
        steady = ~joins if (~joins).any() else np.ones(len(t_round), dtype=bool)
    mean = table[steady].mean(numeric_only=True)
    bound = max(mean["t_gpu_us"], mean["t_host_us"])
    excess = (mean["t_round_us"] - bound) / mean["t_round_us"] if mean["t_round_us"] > 0 else 0.0
    tau_s = tau[steady]
    tau_mean = float(np.nanmean(tau_s)) if np.isfinite(tau_s).any() else None
    summary: dict[str, Any] = {
        "rounds": len(table), "annotation": name, "rounds_steady": int(steady.sum()),
        "window_joins": int(joins.sum()), "duplicate_rounds": n_dup, "rounds_inside_others": n_inside,
        "rounds_excluded": [int(i) for i in np.flatnonzero(~steady)],
        "t_round_us": mean["t_round_us"], "t_gpu_us": mean["t_gpu_us"], "t_host_us": mean["t_host_us"],
        "t_serial_us": mean["t_serial_us"], "blocked_us": mean["blocked_us"],
        # τ: mean tokens per request-round; TPOT = mean Tround / mean τ (TPOT = Tround / τ)
        "tau": tau_mean,
        "tpot_us": (mean["t_round_us"] / tau_mean) if tau_mean else None,
        "overlap_excess": excess,
        "verdict": "serialized" if med["blocked_us"] >= SERIAL_BLOCKED_SHARE * med["t_round_us"] else "overlapped",
        "bound": "GPU" if med["t_gpu_us"] >= med["t_host_us"] else "host",
        "t_host_less_inflation_us": mean["t_host_less_inflation_us"],
        # which side is longer once the profiler's launch inflation is taken out of the host's time
        "bound_less_inflation": "GPU" if med["t_gpu_us"] >= med["t_host_less_inflation_us"] else "host",
    }
    unprof = unprofiled_round_ms
    if unprof is not None:
        summary["unprofiled_round_us"] = float(unprof) * 1e3
        summary["profiler_excess_us"] = mean["t_round_us"] - float(unprof) * 1e3
        if kappa_us_per_node is not None:
            explained = kappa_us_per_node * mean["launch_nodes"]
            summary["kappa_explained_us"] = explained
            summary["kappa_explained_share"] = (explained / summary["profiler_excess_us"]
                                                if summary["profiler_excess_us"] > 0 else None)
            summary["kappa_exposed_us"] = mean["exposed_inflation_us"]
            summary["kappa_exposed_share"] = (mean["exposed_inflation_us"] / summary["profiler_excess_us"]
                                              if summary["profiler_excess_us"] > 0 else None)
    ua_rows = ua_rows[match]
    round_rows = ua_rows[np.argsort(h["ts_us"].to_numpy()[ua_rows], kind="stable")][:-1]  # the rounds with a period
    ranges = host_by_range(trace, round_rows, launches["host_row"].to_numpy(np.int64), linfl,
                           calls[calls["rank"].to_numpy() == key[0]] if not calls.empty else calls)
    return RoundsReport(table=table, summary=summary, host_ranges=ranges)


def _round_annotations(trace: Trace, rank: int | None, name: str
                       ) -> tuple[pd.DataFrame, np.ndarray, np.ndarray, int, int]:
    """The host user_annotation rows of ``rank`` (every rank when None), a bool mask of the round ranges among them
    (``name``, or numbered ranges such as "round_3" / "round 3": one name per round), and their positions in
    ``trace.host``, how many exact copies were left out: a copy of a round range (the same rank, thread, start
    and end as another: a trace written or joined twice over) is one round, only its first row matches
    (:func:`duplicate_ranges`); and how many ranges that start inside an earlier one of the thread were left out
    (:func:`ranges_inside_earlier`)."""
    h = trace.host
    keep = (h["cat"] == "user_annotation").to_numpy()
    if rank is not None:
        keep = keep & (h["rank"].to_numpy() == rank)
    ua = h[keep]
    # the pattern tested once per distinct name
    codes, uniq = pd.factorize(trace.host_str("name")[keep])
    match = pd.Series(uniq, dtype=object).str.fullmatch(re.escape(name) + r"(?:[_ #-]?\d+)?").to_numpy(dtype=bool)[codes]
    n_dup = n_inside = 0
    if match.any():
        m = np.flatnonzero(match)
        dup = duplicate_ranges(ua.iloc[m])
        match[m[dup]] = False
        n_dup = int(dup.sum())
        m = np.flatnonzero(match)
        inside = ranges_inside_earlier(ua.iloc[m])
        match[m[inside]] = False
        n_inside = int(inside.sum())
    return ua, match, np.flatnonzero(keep), n_dup, n_inside


def inside_note(n: int, name: str) -> str:
    """The warning for ``n`` ranges named ``name`` left out by :func:`ranges_inside_earlier` (analyze's rounds and the
    replay's round starts say it in the same words)."""
    return (f"{n} {name!r} ranges start inside another {name!r} range on their thread (overlapping or nested: not "
            "rounds of their own): left out, the outer ranges are the rounds")


def ranges_inside_earlier(rows: pd.DataFrame) -> np.ndarray:
    """(len(rows),) bool: the host rows that start inside an earlier kept row of the same (rank, tid). Rows are
    taken by start; a row is kept when it starts at or after the end of the last row kept on its thread (ranges
    that only touch do not overlap), else marked. Rounds of one loop follow each other on their thread; a round
    range that starts while a kept one is open (a second loop's ranges under the same name, a range opened twice, a
    nested call) is no round of its own: the outer ones are the rounds, and a period between a range and one inside
    it would be a fraction of a round. O(n log n) for the sort, then one pass over the rows (round ranges: a few per
    millisecond of trace)."""
    n = len(rows)
    out = np.zeros(n, dtype=bool)
    if n < 2:
        return out
    ts, end = rows["ts_us"].to_numpy(np.float64), rows["end_us"].to_numpy(np.float64)
    grp = pd.factorize(pd.Series(rows["rank"].to_numpy()).astype(str) + "|" + rows["tid"].astype(str).to_numpy())[0]
    order = np.lexsort((ts, grp))
    last_group, last_end = -1, -np.inf
    for i in order.tolist():
        if grp[i] != last_group:
            last_group, last_end = grp[i], end[i]
        elif ts[i] < last_end:
            out[i] = True
        else:
            last_end = end[i]
    return out


def duplicate_ranges(rows: pd.DataFrame) -> np.ndarray:
    """(len(rows),) bool: the host rows that repeat an earlier row's (rank, tid, ts_us, end_us) exactly. Two ranges
    of one thread cannot both start and end at the same µs unless one is a copy of the other (a nested range of the
    same name would have to have the same length too)."""
    if not len(rows):
        return np.zeros(0, dtype=bool)
    key = pd.DataFrame({"rank": rows["rank"].to_numpy(), "tid": rows["tid"].astype(str).to_numpy(),
                        "ts": rows["ts_us"].to_numpy(), "end": rows["end_us"].to_numpy()})
    return key.duplicated(keep="first").to_numpy()


def range_inclusive_us(trace: Trace, name: str = ROUND_NAME, device: int | tuple[int, int] | None = None
                       ) -> dict[str, float]:
    """Inclusive host time per round of every annotation range (NVTX / record_function) that starts inside a round
    period (from one ``name`` range's start to the next one's, the periods :func:`rounds` counts), summed per range
    name and divided by the number of periods: {range: µs per round}, ``name`` itself included; {} with fewer than
    two rounds. The profiled side of the profiler's host cost per range; the unprofiled side is
    ``runtime.annotate.HostRangeTimes`` (same ranges, host clock, no profiler)."""
    if trace.host.empty:
        return {}
    ua, match, _, _, _ = _round_annotations(trace, resolve_device(trace, device)[0] if not trace.device.empty else None,
                                      name)
    names = ua["name"].astype(str)
    starts = np.sort(ua["ts_us"].to_numpy(dtype=np.float64)[match])
    if len(starts) < 2:
        return {}
    ts = ua["ts_us"].to_numpy(dtype=np.float64)
    inside = (ts >= starts[0]) & (ts < starts[-1])
    dur = (ua["end_us"].to_numpy(dtype=np.float64) - ts)[inside]
    per = pd.Series(dur).groupby(names.to_numpy(dtype=object)[inside], sort=True).sum() / (len(starts) - 1)
    return {str(k): float(v) for k, v in per.items()}


def host_by_range(trace: Trace, round_rows: np.ndarray, launch_rows: np.ndarray, launch_inflation: np.ndarray,
                  calls: pd.DataFrame | None) -> pd.DataFrame:
    """Where the host's round time went, by NVTX / record_function range: columns range, host_us_per_round,
    share (of the summed range time), sorted by host_us_per_round descending.

    ``round_rows``: host rows of the rounds counted (the round annotations); a range counts when it lies inside
    one of them. A range's host time is its own time: its length minus its child ranges', minus the time its sync
    calls blocked (``calls``: :attr:`.syncs.SyncReport.calls` of the rank; the host waited, it did not work) and
    minus the profiler's inflation of the graph launches inside it (``launch_rows`` with ``launch_inflation`` µs
    each, :func:`.launch_fit.launch_inflation_us`): the host work an unprofiled run would still do there. Summed over the rounds and divided by their number."""
    from .stacks import CAT_CODE, enclosing, host_tree

    cols = ["range", "host_us_per_round", "share"]
    tree = host_tree(trace)
    if tree.n == 0 or len(round_rows) == 0:
        return pd.DataFrame({c: [] for c in cols})
    ua = tree.cat == CAT_CODE["user_annotation"]
    is_round = np.zeros(tree.n, dtype=bool)
    is_round[tree.nodes(round_rows)] = True
    ranges = np.flatnonzero(ua & ~is_round)
    ranges = ranges[enclosing(tree, ranges, is_round) >= 0]
    if not len(ranges):
        return pd.DataFrame({c: [] for c in cols})
    inner = ua & ~is_round
    dur = tree.end_us - tree.start_us
    own = np.zeros(tree.n)
    own[ranges] = dur[ranges]

    def take(nodes: np.ndarray, us: np.ndarray) -> None:  # charge to the innermost enclosing range
        r = enclosing(tree, nodes, inner)
        ok = r >= 0
        np.subtract.at(own, r[ok], us[ok])

    take(ranges, dur[ranges])
    if len(launch_rows):
        take(tree.nodes(launch_rows), np.asarray(launch_inflation, dtype=np.float64))
    if calls is not None and not calls.empty and "host_row" in calls.columns:
        take(tree.nodes(calls["host_row"].to_numpy(dtype=np.int64)), calls["blocked_us"].to_numpy(dtype=np.float64))
    names = np.array([str(trace.symbols[k]) for k in tree.name[ranges]], dtype=object)
    per = pd.Series(np.maximum(own[ranges], 0.0)).groupby(names, sort=False).sum() / len(round_rows)
    per = per.sort_values(ascending=False, kind="stable")
    total = float(per.sum())
    return pd.DataFrame({"range": per.index.to_numpy(dtype=object), "host_us_per_round": per.to_numpy(),
                         "share": per.to_numpy() / total if total > 0 else 0.0})
