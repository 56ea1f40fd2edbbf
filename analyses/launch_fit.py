"""Launch fit: how graph-launch host time grows with the graph's node count, t(N) = t0 + κN.

DESIGN.md "Launch fit": under the profiler, CUPTI instruments every kernel node of a CUDA graph at launch, so
``cudaGraphLaunch`` host time grows linearly in the node count N.
The slope κ (µs/node) is the profiler describing itself; κ·N estimates how much of one launch's host time the
profiler added. N is counted from the trace alone: every device activity replayed from a graph carries the
correlation id of the launch that started it (DESIGN.md "Facts from the probe"), so N is the number of
``trace.device`` rows sharing the launch's (rank, correlation). Flow arrows are never used.

The fit is Theil–Sen (Sen 1968, "Estimates of the regression coefficient based on Kendall's tau") over the per-N
medians, each pair of sizes weighted by the product of their launch counts: the weighted median of pairwise
slopes, then t0 = weighted median of (median_i − κ N_i). Medians per size make one outlier launch unable to move
its size's point much, and the weighted median of slopes makes one stray size unable to move κ much. The cost is
O(G²) in the number G of distinct graph sizes (a handful in a real decode), not in the number of launches.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import numpy as np
import pandas as pd

from gaptrace.trace import GRAPH_LAUNCH_NAMES, Trace

__all__ = ["LaunchFit", "launch_points", "robust_affine_fit", "kappa_interval", "r_squared", "launch_fit"]


def launch_points(trace: Trace) -> tuple[pd.DataFrame, int]:
    """(N, host duration) for every graph launch (``GRAPH_LAUNCH_NAMES``) whose correlation id owns device work.

    Returns ``(points, skipped)``: ``points`` has columns rank, name, tid, ts_us, dur_us, correlation, nodes
    (int, > 0), host_row (positional row of ``trace.host``), one row per launch, in trace order; ``skipped`` counts launches whose (rank, correlation) owns no
    device activity (their work is missing from the trace; the loader warns about them too).
    N = number of ``trace.device`` rows (kernel, memcpy, memset) with the launch's rank and correlation id.
    """
    host = trace.host
    is_launch = host["name"].isin(GRAPH_LAUNCH_NAMES).to_numpy()
    launches = host[is_launch].assign(host_row=np.flatnonzero(is_launch))
    cols = ["rank", "name", "tid", "ts_us", "dur_us", "correlation", "host_row"]
    if launches.empty:
        return pd.DataFrame({c: [] for c in cols + ["nodes"]}), 0
    dev = trace.device
    counts = (dev.groupby(["rank", "correlation"], observed=True).size().rename("nodes").reset_index()
              if not dev.empty else pd.DataFrame({"rank": [], "correlation": [], "nodes": []}))
    counts = counts[counts["correlation"] >= 0]
    pts = launches[cols].merge(counts, on=["rank", "correlation"], how="left", sort=False)
    pts["nodes"] = pts["nodes"].fillna(0).astype(np.int64)
    owned = (pts["nodes"] > 0) & (pts["correlation"] >= 0)
    pts = pts[owned].sort_values("ts_us", kind="stable").reset_index(drop=True)
    pts["name"] = pts["name"].astype(str)
    pts["tid"] = pts["tid"].astype(str)
    return pts, int((~owned).sum())


def launch_inflation_us(nodes: np.ndarray, dur_us: np.ndarray, kappa_us_per_node: float | None) -> np.ndarray:
    """(q,) µs: the profiler's share of each graph launch's host time, κN capped at the launch's own host time (the
    profiler cannot add more than was measured; DESIGN.md "Launch fit"); 0 without κ."""
    nodes, dur_us = np.asarray(nodes, dtype=np.float64), np.asarray(dur_us, dtype=np.float64)
    if kappa_us_per_node is None or not np.isfinite(kappa_us_per_node):
        return np.zeros(len(nodes))
    return np.clip(np.minimum(max(kappa_us_per_node, 0.0) * nodes, dur_us), 0.0, None)


def _weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    """The lower weighted median (midpoint when the cumulative weight hits exactly half)."""
    order = np.argsort(values, kind="stable")
    v, w = values[order], weights[order]
    cw = np.cumsum(w)
    half = cw[-1] / 2.0
    k = int(np.searchsorted(cw, half, side="left"))
    if math.isclose(cw[k], half) and k + 1 < len(v):
        return float((v[k] + v[k + 1]) / 2.0)
    return float(v[k])


def robust_affine_fit(nodes: np.ndarray, dur_us: np.ndarray) -> tuple[float, float] | None:
    """Robust affine fit dur = t0 + κ·nodes: weighted Theil–Sen over per-size medians (see the module docstring).

    Shapes: ``nodes`` (n,) numbers of graph nodes, ``dur_us`` (n,) host durations in µs. Returns
    ``(t0_us, kappa_us_per_node)``, or None when fewer than two distinct node counts exist (κ is undefined).
    Raises ValueError when the shapes differ or a value is not finite.
    """
    x, y = _checked(nodes, dur_us)
    sizes, med, cnt = _per_size(x, y)
    if len(sizes) < 2:
        return None
    kappa = _theil_sen_kappa(sizes, med, cnt)
    t0 = _weighted_median(med - kappa * sizes, cnt)
    return t0, kappa


def _checked(nodes, dur_us) -> tuple[np.ndarray, np.ndarray]:
    """``nodes`` and ``dur_us`` as float64 arrays; ValueError unless 1-d, of one length and finite."""
    x = np.asarray(nodes, dtype=np.float64)
    y = np.asarray(dur_us, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"nodes and dur_us must be 1-d arrays of one length, got {x.shape} and {y.shape}")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("nodes and dur_us must be finite")
    return x, y


def _theil_sen_kappa(sizes: np.ndarray, med: np.ndarray, cnt: np.ndarray) -> float:
    """κ: the weighted median of the slopes between every pair of sizes, weighted by the product of their launch
    counts. ``sizes`` (G,) distinct and sorted, ``med`` (G,) the median duration at each, ``cnt`` (G,) launches."""
    i, j = np.triu_indices(len(sizes), k=1)
    return _weighted_median((med[j] - med[i]) / (sizes[j] - sizes[i]), cnt[i] * cnt[j])


def kappa_interval(nodes: np.ndarray, dur_us: np.ndarray, n_boot: int = 400, level: float = 0.95,
                   seed: int = 0) -> tuple[float, float] | None:
    """A bootstrap interval for κ of :func:`robust_affine_fit`: the launches of each graph size resampled with
    replacement (a stratified bootstrap: every size keeps its launch count), κ refitted ``n_boot`` times, and the
    central ``level`` share of those κ (percentile interval; Efron & Tibshirani 1993, ch. 13). It says how well the
    launches pin κ down: sizes that span few nodes (a sync round's draft and verify graphs, 275 and 294 nodes) or
    launches that scatter give a wide interval, whatever R² says.

    Shapes and errors as :func:`robust_affine_fit`; returns (low, high) in µs per node, or None with fewer than
    two distinct sizes. Deterministic for a given ``seed``: for each size in ascending order an (n_boot, n) matrix of
    indices into its durations sorted ascending is drawn from ``numpy.random.default_rng(seed)`` (in blocks of
    rows, which draws the same numbers: numpy's generator fills arrays in row-major order).
    """
    x, y = _checked(nodes, dur_us)
    sizes = np.unique(x)
    if len(sizes) < 2:
        return None
    rng = np.random.default_rng(seed)
    meds = np.empty((n_boot, len(sizes)))
    cnt = np.empty(len(sizes))
    for g, n_i in enumerate(sizes):
        ys = np.sort(y[x == n_i])  # by duration: the interval does not depend on the launches' order in the trace
        cnt[g] = len(ys)
        rows = max(1, 4_000_000 // len(ys))  # index matrices of at most ~4 M entries (32 MB) at a time
        for b in range(0, n_boot, rows):
            k = min(rows, n_boot - b)
            meds[b:b + k, g] = np.median(ys[rng.integers(0, len(ys), (k, len(ys)))], axis=1)
    kappas = np.array([_theil_sen_kappa(sizes, row, cnt) for row in meds])
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(kappas, [tail, 1.0 - tail])
    return float(lo), float(hi)


def _per_size(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct sizes (sorted), the median of y at each, and the number of points at each."""
    if len(x) == 0:
        return np.empty(0), np.empty(0), np.empty(0)
    order = np.lexsort((y, x))
    xs, ys = x[order], y[order]
    first = np.flatnonzero(np.r_[True, xs[1:] != xs[:-1]])
    cnt = np.diff(np.r_[first, len(xs)])
    lo = first + (cnt - 1) // 2
    hi = first + cnt // 2
    return xs[first], (ys[lo] + ys[hi]) / 2.0, cnt.astype(np.float64)


def r_squared(nodes: np.ndarray, dur_us: np.ndarray, t0_us: float, kappa_us_per_node: float,
              weights: np.ndarray | None = None) -> float | None:
    """Coefficient of determination 1 − SS_res/SS_tot of the line t0 + κN on the given points (optionally weighted).

    A robust line is not the least-squares line, so R² can be below 0 when it explains the points worse than
    their mean. None when all durations are equal (SS_tot = 0).
    """
    x = np.asarray(nodes, dtype=np.float64)
    y = np.asarray(dur_us, dtype=np.float64)
    w = np.ones_like(y) if weights is None else np.asarray(weights, dtype=np.float64)
    if len(y) == 0 or w.sum() <= 0:
        return None
    mean = float((w * y).sum() / w.sum())
    ss_tot = float((w * (y - mean) ** 2).sum())
    if ss_tot <= 0:
        return None
    ss_res = float((w * (y - (t0_us + kappa_us_per_node * x)) ** 2).sum())
    return 1.0 - ss_res / ss_tot


@dataclasses.dataclass
class LaunchFit:
    """Result of :func:`launch_fit`. Times in µs; κ in µs per graph node.

    ``graphs``: one row per distinct node count: nodes, launches, median_us, min_us, max_us, fit_us (t0 + κN),
    inflation_us (κN, the profiler's estimated share of one launch), and, when unprofiled timings were given,
    unprofiled_us, ratio (median_us / unprofiled_us) and excess_us (median_us − unprofiled_us).
    ``r2`` is over all launches (outlier launches lower it); ``r2_medians`` over the per-size medians, weighted by
    launch count (how straight the size–time relation is).
    ``points``: the launches themselves (see :func:`launch_points`), for plots.
    ``kappa_interval_us_per_node``: the 95% bootstrap interval of κ (:func:`kappa_interval`), or None.
    κ, t0, R² and the inflation fields are None when fewer than two distinct node counts exist (``reason`` says so).
    """

    launches: int
    skipped_launches: int
    kappa_us_per_node: float | None
    t0_us: float | None
    r2: float | None
    r2_medians: float | None
    graphs: pd.DataFrame
    points: pd.DataFrame
    total_launch_us: float
    inflation_total_us: float | None
    inflation_share: float | None
    unprofiled_ratio: float | None
    reason: str | None
    kappa_interval_us_per_node: tuple[float, float] | None = None

    @property
    def mean_inflation_us(self) -> float | None:
        """Estimated profiler inflation per launch, averaged over the launches (κ · mean N)."""
        if self.inflation_total_us is None or self.launches == 0:
            return None
        return self.inflation_total_us / self.launches

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict: launches, kappa_us_per_node, t0_us, r2, graphs [{nodes, launches, median_us, ...}], ..."""
        graphs = []
        for row in self.graphs.to_dict("records"):
            graphs.append({k: (int(v) if k in ("nodes", "launches") else _num(v)) for k, v in row.items()})
        return {
            "launches": self.launches,
            "skipped_launches": self.skipped_launches,
            "kappa_us_per_node": _num(self.kappa_us_per_node),
            "kappa_interval_us_per_node": (None if self.kappa_interval_us_per_node is None
                                           else [_num(v) for v in self.kappa_interval_us_per_node]),
            "t0_us": _num(self.t0_us),
            "r2": _num(self.r2),
            "r2_medians": _num(self.r2_medians),
            "graphs": graphs,
            "total_launch_us": _num(self.total_launch_us),
            "inflation_total_us": _num(self.inflation_total_us),
            "mean_inflation_us": _num(self.mean_inflation_us),
            "inflation_share": _num(self.inflation_share),
            "unprofiled_ratio": _num(self.unprofiled_ratio),
            "reason": self.reason,
        }


def _num(v: Any) -> float | None:
    if v is None:
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def launch_fit(trace: Trace, unprofiled_us: Mapping[int, float] | None = None) -> LaunchFit | None:
    """Fit graph-launch host time against node count over every graph launch of ``trace`` (DESIGN.md "Launch fit").

    ``unprofiled_us``: optional host cost of one launch measured without the profiler, per node count
    in µs (e.g. ``{25: 5.4, 1600: 14.1}``: :meth:`gaptrace.sidecar.Sidecar.unprofiled_launch_us`); sizes the
    trace lacks are ignored. The result then carries per-size ratios and ``unprofiled_ratio`` = Σ launches·median_us / Σ launches·unprofiled_us over the
    sizes present in both (how much slower this trace's launch mix is under the profiler).

    Returns None when the trace has no graph launch that owns device work. With one distinct node count the
    result has κ, t0, R² and inflation None and ``reason`` saying why (κ needs two sizes). All ranks are pooled:
    the profiler's per-node cost does not depend on the rank.
    """
    pts, skipped = launch_points(trace)
    if pts.empty:
        return None
    x = pts["nodes"].to_numpy(np.float64)
    y = pts["dur_us"].to_numpy(np.float64)
    sizes, med, cnt = _per_size(x, y)
    g = pts.groupby("nodes", sort=True)["dur_us"].agg(["min", "max"])
    graphs = pd.DataFrame({"nodes": sizes.astype(np.int64), "launches": cnt.astype(np.int64), "median_us": med,
                           "min_us": g["min"].to_numpy(), "max_us": g["max"].to_numpy()})
    fit = robust_affine_fit(x, y)
    reason = None
    # the bootstrap is deterministic in (x, y): computed once per trace for the same launches (analyze fits twice)
    interval = (trace.memo(("kappa_interval", x.tobytes(), y.tobytes()), trace.host, lambda: kappa_interval(x, y))
                if fit is not None else None)
    if fit is None:
        t0 = kappa = r2 = r2_med = infl_total = infl_share = None
        graphs["fit_us"] = np.nan
        graphs["inflation_us"] = np.nan
        reason = (f"all {len(pts)} graph launches have N = {int(sizes[0])} device activities: "
                  "κ needs at least two distinct graph sizes")
    else:
        t0, kappa = fit
        r2 = r_squared(x, y, t0, kappa)
        r2_med = r_squared(sizes, med, t0, kappa, weights=cnt)
        graphs["fit_us"] = t0 + kappa * sizes
        graphs["inflation_us"] = kappa * sizes
        infl_total = float(launch_inflation_us(x, y, kappa).sum())
        infl_share = infl_total / float(y.sum()) if y.sum() > 0 else None
    ratio = None
    if unprofiled_us:
        un = pd.Series({int(k): float(v) for k, v in unprofiled_us.items()}, dtype=np.float64)
        graphs["unprofiled_us"] = graphs["nodes"].map(un)
        graphs["ratio"] = graphs["median_us"] / graphs["unprofiled_us"]
        graphs["excess_us"] = graphs["median_us"] - graphs["unprofiled_us"]
        both = graphs["unprofiled_us"].notna() & (graphs["unprofiled_us"] > 0)
        if both.any():
            gb = graphs[both]
            ratio = float((gb["launches"] * gb["median_us"]).sum() / (gb["launches"] * gb["unprofiled_us"]).sum())
    return LaunchFit(launches=len(pts), skipped_launches=skipped, kappa_us_per_node=kappa, t0_us=t0, r2=r2,
                     r2_medians=r2_med, graphs=graphs, points=pts, total_launch_us=float(y.sum()),
                     inflation_total_us=infl_total,
                     inflation_share=infl_share, unprofiled_ratio=ratio, reason=reason,
                     kappa_interval_us_per_node=interval)
