"""The findings as time-placed tracks: what ``gaptrace annotate`` writes back into a trace for Perfetto UI.

Four tables over the analysed device's window (times on the trace's own clock, µs), each row one slice or sample
(docs/DESIGN.md "Findings as trace tracks"):

- ``blocking``: one slice per blocking host call (:func:`gaptrace.analyses.syncs.blocking_syncs`): its host span,
  the call and its site, ``blocked_us``, ``idle_after_us``;
- ``gaps``: one slice per idle gap of the device (a maximal interval inside the window with nothing running,
  :meth:`gaptrace.analyses.timeline.BusyTimeline.gaps`), charged to its top site: the innermost Python frame with a
  source file that the host had open for most of the gap (summed over the rank's threads; threads parked for the
  whole window left out, and a thread waiting in a lock / condition / sleep named "(thread waiting)" only when no
  other thread ran code then, as :func:`gaptrace.analyses.gaps.event_idle` and the idle sites do), with the share
  of the gap it held, and the NVTX / record_function range it sat in;
- ``rounds``: one slice per verify round (:func:`gaptrace.analyses.rounds.rounds`), its period with TGPU, Thost,
  the blocked time and the round's own verdict: ``serialized`` when its blocked time is at least
  ``SERIAL_BLOCKED_SHARE`` of its period (the rule the trace-level verdict applies to the median round), else
  ``overlapped``; ``GPU-bound`` when TGPU ≥ Thost, else ``host-bound``;
- ``occupancy``: the busy fraction of the device in equal bins over the window (exact, from busy(t)).

Every figure is one the analyses already report (the same functions, the same window), placed in time.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from gaptrace.trace import Trace

from . import stacks
from .gaps import event_idle
from .idle_sites import site_codes
from .occupancy import busy_timeline, resolve_device

__all__ = ["Tracks", "findings_tracks", "gap_sites"]

DEFAULT_BINS = 200


@dataclasses.dataclass
class Tracks:
    """Result of :func:`findings_tracks`. Frames (columns, all times µs on the trace clock):

    ``blocking``: ts_us, dur_us, call, site, aten_op, blocked_us, idle_after_us (NaN without a timeline);
    ``gaps``: ts_us, dur_us, site ("(no host frame)" when no thread had a frame with a source file open),
    range ("" if none), site_share (0..1: the site's share of the gap's length);
    ``rounds``: round, ts_us, dur_us, t_gpu_us, t_host_us, blocked_us, verdict, bound;
    ``occupancy``: ts_us, busy_fraction (0..1), one row per bin start plus one at the window's end.
    ``rank``/``device``: the analysed device; ``window_us``: (t0_us, t1_us).
    """

    rank: int
    device: int
    window_us: tuple[float, float]
    blocking: pd.DataFrame
    gaps: pd.DataFrame
    rounds: pd.DataFrame
    occupancy: pd.DataFrame


def gap_sites(trace: Trace, device: int | tuple[int, int] | None = None,
              window: str | tuple[float, float] | None = None) -> pd.DataFrame:
    """Every idle gap of the device in the window with its top site (module docstring).

    Columns ts_us, dur_us, site, range, site_share. Shapes: one row per gap, in time order. The host segments of
    :func:`gaptrace.analyses.gaps.event_idle` (each with the innermost open host event) are cut at the gap
    boundaries (vectorised: each segment repeated once per gap it overlaps); per (gap, site) the overlap lengths
    are summed over threads and the largest wins (ties: the lower frame code).
    Raises TraceError as :func:`event_idle` does.
    """
    res = event_idle(trace, device, window, exclude_parked=True)
    g = res.timeline.gaps()
    gs, ge = g["start_us"].to_numpy(np.float64), g["end_us"].to_numpy(np.float64)
    out = pd.DataFrame({"ts_us": gs, "dur_us": ge - gs, "site": "(no host frame)", "range": "",
                        "site_share": 0.0})
    tree = res.tree
    act = np.flatnonzero(res.seg_node >= 0)
    if len(gs) == 0 or tree.n == 0 or len(act) == 0:
        return out
    s, e, node = res.seg_start_us[act], res.seg_end_us[act], res.seg_node[act]
    # the gaps each segment overlaps: [first, last] by binary search on the sorted, disjoint gaps
    first = np.searchsorted(ge, s, side="right")
    last = np.searchsorted(gs, e, side="left") - 1
    n_over = np.maximum(last - first + 1, 0)
    seg = np.repeat(np.arange(len(s)), n_over)
    gap = np.repeat(first, n_over) + (np.arange(len(seg)) - np.repeat(np.cumsum(n_over) - n_over, n_over))
    ov = np.minimum(e[seg], ge[gap]) - np.maximum(s[seg], gs[gap])
    keep = ov > 0
    seg, gap, ov = seg[keep], gap[keep], ov[keep]
    if len(seg) == 0:
        return out
    n_frames = len(tree.frames)
    site = site_codes(tree, node[seg])  # the same site rule as the idle sites
    ann = stacks.enclosing(tree, node[seg], tree.cat == stacks.CAT_CODE["user_annotation"], include_self=True)
    rng = np.where(ann >= 0, tree.frame[np.maximum(ann, 0)], -1)
    pairs = pd.DataFrame({"gap": gap, "site": site, "range": rng, "ov": ov})
    per_site = pairs.groupby(["gap", "site"], sort=True)["ov"].sum().reset_index()
    per_site["waiting"] = per_site["site"] == n_frames + 1  # a parked thread's wait explains a gap last
    best = per_site.sort_values(["gap", "waiting", "ov", "site"], ascending=[True, True, False, True],
                                kind="stable").drop_duplicates("gap")
    per_range = pairs.groupby(["gap", "site", "range"], sort=True)["ov"].sum().reset_index() \
        .sort_values(["gap", "site", "ov", "range"], ascending=[True, True, False, True], kind="stable") \
        .drop_duplicates(["gap", "site"])
    best = best.merge(per_range[["gap", "site", "range"]], on=["gap", "site"], how="left")
    names = np.r_[tree.frames.to_numpy(dtype=object), np.array(["(no host frame)", "(thread waiting)"], dtype=object)]
    gi = best["gap"].to_numpy()
    out.loc[gi, "site"] = names[best["site"].to_numpy()]
    r = best["range"].to_numpy()
    out.loc[gi, "range"] = np.where(r >= 0, names[np.maximum(r, 0)], "")
    out.loc[gi, "site_share"] = np.minimum(best["ov"].to_numpy() / np.maximum(out["dur_us"].to_numpy()[gi], 1e-300),
                                           1.0)
    return out


def _blocking(trace: Trace, key: tuple[int, int], t0: float, t1: float) -> pd.DataFrame:
    from .syncs import blocking_syncs

    rep = blocking_syncs(trace, window=(t0, t1))
    c = rep.calls
    cols = ["ts_us", "dur_us", "call", "site", "aten_op", "blocked_us", "idle_after_us"]
    if c.empty:
        return pd.DataFrame({k: [] for k in cols})
    c = c[(c["rank"] == key[0]) & (c["device"] == key[1])]
    return pd.DataFrame({"ts_us": c["ts_us"].to_numpy(np.float64),
                         "dur_us": (c["end_us"] - c["ts_us"]).to_numpy(np.float64),
                         "call": c["call"].astype(str).to_numpy(), "site": c["site"].astype(str).to_numpy(),
                         "aten_op": c["aten_op"].astype(str).to_numpy(),
                         "blocked_us": c["blocked_us"].to_numpy(np.float64),
                         "idle_after_us": c["idle_after_us"].to_numpy(np.float64)})


def _rounds(trace: Trace, key: tuple[int, int], round_name: str, sidecar) -> pd.DataFrame:
    from .rounds import SERIAL_BLOCKED_SHARE, rounds

    cols = ["round", "ts_us", "dur_us", "t_gpu_us", "t_host_us", "blocked_us", "verdict", "bound"]
    rep = rounds(trace, round_name, key, sidecar=sidecar)
    if rep is None or rep.table.empty:
        return pd.DataFrame({k: [] for k in cols})
    t = rep.table
    tr = t["t_round_us"].to_numpy(np.float64)
    blocked = t["blocked_us"].to_numpy(np.float64)
    return pd.DataFrame({
        "round": t["round"].to_numpy(), "ts_us": t["start_us"].to_numpy(np.float64), "dur_us": tr,
        "t_gpu_us": t["t_gpu_us"].to_numpy(np.float64), "t_host_us": t["t_host_us"].to_numpy(np.float64),
        "blocked_us": blocked,
        "verdict": np.where(blocked >= SERIAL_BLOCKED_SHARE * tr, "serialized", "overlapped"),
        "bound": np.where(t["t_gpu_us"].to_numpy(np.float64) >= t["t_host_us"].to_numpy(np.float64),
                          "GPU-bound", "host-bound"),
    })


def findings_tracks(trace: Trace, device: int | tuple[int, int] | None = None,
                    window: str | tuple[float, float] | None = None, round_name: str = "round",
                    sidecar=None, n_bins: int = DEFAULT_BINS) -> Tracks:
    """The four tracks of the module docstring for one device and window.

    ``device``: int, (rank, device) or None (the busiest); ``window``: None (first to last device activity), an
    annotation name, or (t0_us, t1_us); ``sidecar``: the capture sidecar for the rounds' τ (optional);
    ``n_bins``: occupancy bins (≥ 1). Raises TraceError (no device activity, unknown window) or ValueError
    (n_bins < 1).
    """
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    key = resolve_device(trace, device)
    tl = busy_timeline(trace, key, window)
    t0, t1 = tl.t0_us, tl.t1_us
    bins = tl.busy_fraction_bins(n_bins)
    occ = pd.DataFrame({"ts_us": np.r_[bins["start_us"].to_numpy(np.float64), [t1]],
                        "busy_fraction": np.r_[bins["busy_fraction"].to_numpy(np.float64), [0.0]]})
    return Tracks(rank=key[0], device=key[1], window_us=(t0, t1), blocking=_blocking(trace, key, t0, t1),
                  gaps=gap_sites(trace, key, (t0, t1)), rounds=_rounds(trace, key, round_name, sidecar),
                  occupancy=occ)
