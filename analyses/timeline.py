"""Busy/idle timeline of one device: the union of its activity intervals and two cumulative functions over it.

DESIGN.md "A way to compute them in n log n": after merging, a device's busy time is a sorted list of disjoint
spans. busy(t) (busy µs before t) and idle(t) = (t - t_start) - busy(t) are piecewise linear with breaks at the span
edges, so ``numpy.searchsorted`` evaluates them for any array of times at once. Inclusive idle under a host event
[s, e] is then idle(e) - idle(s) with no loop over gaps or events.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

__all__ = ["BusyTimeline", "merge_intervals", "device_timeline"]


def merge_intervals(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals [starts[i], ends[i]] as sorted disjoint spans (touching spans are merged).

    Shapes: (n,) float64 µs each -> (m,), (m,) with m <= n. O(n log n), vectorised.
    """
    if len(starts) == 0:
        return np.empty(0), np.empty(0)
    order = np.argsort(starts, kind="stable")
    s = np.asarray(starts, dtype=np.float64)[order]
    e = np.asarray(ends, dtype=np.float64)[order]
    run_end = np.maximum.accumulate(e)
    # a new span begins where the start lies beyond every earlier end
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_end[:-1]
    first = np.flatnonzero(new)
    last = np.r_[first[1:] - 1, len(s) - 1]
    return s[first], run_end[last]


@dataclasses.dataclass(frozen=True)
class BusyTimeline:
    """Disjoint busy spans of one device, clipped to a window [t0_us, t1_us].

    ``span_start_us``/``span_end_us``: (m,) sorted, disjoint, inside the window.
    ``cum_busy_us``: (m + 1,) busy time before each span starts (cum_busy_us[0] = 0).
    """

    t0_us: float
    t1_us: float
    span_start_us: np.ndarray
    span_end_us: np.ndarray
    cum_busy_us: np.ndarray

    @classmethod
    def from_intervals(cls, starts: np.ndarray, ends: np.ndarray, t0_us: float | None = None,
                       t1_us: float | None = None) -> "BusyTimeline":
        """Merge intervals and clip them to [t0_us, t1_us] (default: first start to last end)."""
        s, e = merge_intervals(starts, ends)
        return cls.from_merged(s, e, t0_us, t1_us)

    @classmethod
    def from_merged(cls, s: np.ndarray, e: np.ndarray, t0_us: float | None = None,
                    t1_us: float | None = None) -> "BusyTimeline":
        """:meth:`from_intervals` of spans already merged (:func:`merge_intervals`' output, which may be shared
        between windows: it is not modified)."""
        if t0_us is None:
            t0_us = float(s[0]) if len(s) else 0.0
        if t1_us is None:
            t1_us = float(e[-1]) if len(e) else t0_us
        s = np.clip(s, t0_us, t1_us)
        e = np.clip(e, t0_us, t1_us)
        keep = e > s
        s, e = s[keep], e[keep]
        cum = np.r_[0.0, np.cumsum(e - s)]
        return cls(float(t0_us), float(t1_us), s, e, cum)

    @property
    def window_us(self) -> float:
        return self.t1_us - self.t0_us

    @property
    def busy_us(self) -> float:
        return float(self.cum_busy_us[-1])

    @property
    def idle_us(self) -> float:
        return self.window_us - self.busy_us

    @property
    def occupancy(self) -> float:
        """Busy time / window length, in [0, 1] (DESIGN.md "Busy / occupancy"); 0 for an empty window."""
        return self.busy_us / self.window_us if self.window_us > 0 else 0.0

    def busy_before(self, t_us: np.ndarray) -> np.ndarray:
        """busy(t): busy µs in [t0, t] for each t (clipped to the window). Shape of t_us."""
        t = np.clip(np.asarray(t_us, dtype=np.float64), self.t0_us, self.t1_us)
        if len(self.span_start_us) == 0:  # nothing ran inside the window
            return np.zeros(t.shape)
        # index of the last span starting at or before t
        k = np.searchsorted(self.span_start_us, t, side="right") - 1
        kk = np.maximum(k, 0)
        inside = np.where(k >= 0, np.minimum(t, self.span_end_us[kk]) - self.span_start_us[kk], 0.0)
        return np.where(k >= 0, self.cum_busy_us[kk] + inside, 0.0)

    def idle_before(self, t_us: np.ndarray) -> np.ndarray:
        """idle(t) = (t - t0) - busy(t), for t clipped to the window. Shape of t_us."""
        t = np.clip(np.asarray(t_us, dtype=np.float64), self.t0_us, self.t1_us)
        return (t - self.t0_us) - self.busy_before(t)

    def busy_between(self, s_us: np.ndarray, e_us: np.ndarray) -> np.ndarray:
        """Busy µs inside each [s, e] ∩ window."""
        return self.busy_before(e_us) - self.busy_before(s_us)

    def idle_between(self, s_us: np.ndarray, e_us: np.ndarray) -> np.ndarray:
        """Idle µs inside each [s, e] ∩ window (the gap-clipped idle under a host event)."""
        return self.idle_before(e_us) - self.idle_before(s_us)

    def next_busy_start(self, t_us: np.ndarray) -> np.ndarray:
        """For each t: t itself if the device is busy at t, else the start of the next busy span (t1 if none).

        ``next_busy_start(e) - e`` is the idle that follows a host call ending at e (the serialized tail).
        """
        t = np.asarray(t_us, dtype=np.float64)
        m = len(self.span_start_us)
        if m == 0:
            return np.full(t.shape, self.t1_us)
        k = np.searchsorted(self.span_start_us, t, side="right")  # first span starting after t
        prev = np.maximum(k - 1, 0)
        busy_now = (k > 0) & (t < self.span_end_us[prev])
        start_next = np.where(k < m, self.span_start_us[np.minimum(k, m - 1)], self.t1_us)
        return np.where(busy_now, t, np.maximum(start_next, t))

    def next_idle_start(self, t_us: np.ndarray) -> np.ndarray:
        """For each t (clipped below to t0): t itself if the device is idle at t, else the end of the busy span
        holding it (spans are merged and never touch, so that end starts a gap, or is the window's end)."""
        t = np.maximum(np.asarray(t_us, dtype=np.float64), self.t0_us)
        if len(self.span_start_us) == 0:
            return t
        k = np.searchsorted(self.span_start_us, t, side="right") - 1
        kk = np.maximum(k, 0)
        return np.where((k >= 0) & (self.span_end_us[kk] > t), self.span_end_us[kk], t)

    def next_sustained_start(self, t_us: np.ndarray, window_us: float = 200.0,
                             min_busy_fraction: float = 0.5) -> np.ndarray:
        """For each t: the start of the first busy span at or after t (or the span holding t) from which the device
        stays at least ``min_busy_fraction`` busy over the following ``window_us`` (t1 if none).

        This is when the device "resumes work" after t: blips of a few tiny kernels (a metadata gather between two
        syncs) do not count, a launch-bound stream of short kernels with 1-2 µs gaps does. Vectorised: the spans
        that start sustained work are found once, then searchsorted.
        """
        t = np.asarray(t_us, dtype=np.float64)
        st = self.span_start_us
        if len(st) == 0:
            return np.full(t.shape, self.t1_us)
        horizon = np.minimum(st + window_us, self.t1_us)
        width = horizon - st
        busy = self.busy_before(horizon) - self.busy_before(st)
        sustained = busy >= min_busy_fraction * np.maximum(width, 1e-9)
        starts = st[sustained]
        ends = self.span_end_us[sustained]
        if len(starts) == 0:
            return np.full(t.shape, self.t1_us)
        k = np.searchsorted(starts, t, side="right")  # first sustained span starting after t
        prev = np.maximum(k - 1, 0)
        inside = (k > 0) & (t < ends[prev])  # t falls inside a sustained span
        nxt = np.where(k < len(starts), starts[np.minimum(k, len(starts) - 1)], self.t1_us)
        return np.where(inside, t, np.maximum(nxt, t))

    def gap_count(self) -> int:
        """Number of idle gaps, ``len(self.gaps())`` without building the frame."""
        return int(np.count_nonzero(np.r_[self.span_start_us, self.t1_us] > np.r_[self.t0_us, self.span_end_us]))

    def gap_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """(start_us, end_us) of the idle gaps, (g,) each: :meth:`gaps` without building the frame."""
        s = np.r_[self.t0_us, self.span_end_us]
        e = np.r_[self.span_start_us, self.t1_us]
        keep = e > s
        return s[keep], e[keep]

    def with_gaps_filled(self, fill: np.ndarray) -> "BusyTimeline":
        """This timeline with the gaps where ``fill`` ((g,) bool over :meth:`gap_bounds`) is True counted as busy:
        ``from_intervals(spans + those gaps, t0, t1)`` without a sort. Gap k lies between span k-1 and span k (gap 0
        from t0, gap m to t1; spans never touch, so every inner gap is a gap): a run of spans joined by filled inner
        gaps becomes one span, from t0 when gap 0 is filled, to t1 when gap m is."""
        m = len(self.span_start_us)
        keep = np.r_[self.span_start_us, self.t1_us] > np.r_[self.t0_us, self.span_end_us]
        filled = np.zeros(m + 1, dtype=bool)
        filled[np.flatnonzero(keep)[np.asarray(fill, dtype=bool)]] = True
        if m == 0:
            whole = np.array([self.t0_us, self.t1_us]) if filled[0] else np.empty(0)
            return BusyTimeline.from_merged(whole[:1], whole[1:], self.t0_us, self.t1_us)
        brk = np.flatnonzero(~filled[1:m])  # span brk + 1 starts a new run
        ms = self.span_start_us[np.r_[0, brk + 1]]
        me = self.span_end_us[np.r_[brk, m - 1]]
        if filled[0]:
            ms[0] = self.t0_us
        if filled[m]:
            me[-1] = self.t1_us
        return BusyTimeline.from_merged(ms, me, self.t0_us, self.t1_us)

    def gaps(self) -> pd.DataFrame:
        """Idle gaps: maximal idle intervals inside the window. Columns start_us, end_us, dur_us."""
        s, e = self.gap_bounds()
        return pd.DataFrame({"start_us": s, "end_us": e, "dur_us": e - s})

    def busy_fraction_bins(self, n_bins: int) -> pd.DataFrame:
        """Busy fraction in ``n_bins`` equal time bins over the window (for the occupancy strip).

        Columns: start_us, end_us, busy_fraction (0..1). Exact (from busy(t)), not sampled.
        """
        edges = np.linspace(self.t0_us, self.t1_us, n_bins + 1)
        busy = np.diff(self.busy_before(edges))
        width = np.diff(edges)
        frac = np.divide(busy, width, out=np.zeros_like(busy), where=width > 0)
        return pd.DataFrame({"start_us": edges[:-1], "end_us": edges[1:], "busy_fraction": frac})


def device_timeline(device_frame: pd.DataFrame, t0_us: float | None = None,
                    t1_us: float | None = None) -> BusyTimeline:
    """The busy timeline of the activities in ``device_frame`` (one device, all streams; kernel/memcpy/memset)."""
    return BusyTimeline.from_intervals(device_frame["ts_us"].to_numpy(), device_frame["end_us"].to_numpy(),
                                       t0_us, t1_us)
