"""A fleet of per-rank traces as one summary: each rank analysed alone (:func:`rank_result`, small and JSON-able,
what a Dask task returns), then merged (:func:`merge_fleet`): per-rank occupancy, busy-without-waiting, verdict and
first cause, the collectives matched across ranks, the stragglers and the wait matrix, the worst rank and what every
rank shares (DESIGN.md "Fleets and stragglers").

JSON keys of :func:`merge_fleet` (``gaptrace analyze DIR --json`` with two or more rank files):

- ``ranks``: [{rank, path, device, device_name, occupancy, busy_us, window_us, busy_without_waiting, waited_us,
  caused_us, verdict (the step verdict: gpu_bound, sync_bound, ...; None without steps), step_figure, bound and
  round_verdict (the round model's, None without rounds), first_cause (the first finding's summary, None when
  none), headline, steps, clock_offset_us, clock_residual_us, collectives: [{label, count, total_us, mean_us}],
  strip ({t0_us, t1_us: the window on the rank's own clock, busy: STRIP_BINS busy fractions}), wait_spans_us
  ([[start, end]] on the aligned clock: where it waited inside a collective; the first MAX_WAIT_SPANS), warnings}],
  by rank;
- ``collectives``: {key_kind ("seq" | "order"), instances, by_label: [{label, instances, ranks, mean_dur_us,
  total_wait_us, mean_wait_us}]};
- ``stragglers``: [{late_rank, label, instances, caused_us, waiters, mean_wait_us, per_step_us, sites: [{site,
  range, interval_us, share, charged_wait_us}], line}], by caused_us desc;
- ``wait_matrix``: {ranks, wait_us: W[i][j] = rank i's wait for late rank j (µs)};
- ``worst_rank``: {rank, why}: the rank that caused the most wait, else the one with the lowest occupancy;
- ``shared``: {verdict (when every rank has the same), first_cause_kind (likewise), idle_sites (sites in every
  rank's top five), collectives (labels every rank runs)};
- ``headline``: [str]; ``warnings``: [str].
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from gaptrace.text import to_jsonable
from gaptrace.trace import Trace

from . import collectives, stragglers

__all__ = ["rank_result", "merge_fleet", "STRIP_BINS", "TOP_SITES_SHARED"]

STRIP_BINS = 200  # bins of the per-rank busy strip the report draws
MAX_WAIT_SPANS = 2000  # per rank, the waiting intervals kept for the report's strip (the first ones)
TOP_SITES_SHARED = 5


def rank_result(trace: Trace, summary: dict[str, Any], rank: int, path: str) -> dict[str, Any]:
    """The small JSON-able result of one rank: what :func:`merge_fleet` needs, never the events.

    ``summary``: the rank's :meth:`gaptrace.analyses.summary.AnalysisSummary.to_json`. Keys: rank, path, device,
    device_name, occupancy, busy_us, window_us, window_start_us (own clock), verdict, step_figure, bound,
    round_verdict, first_cause, first_cause_kind, headline, steps, idle_sites (top five site names), base_time_ns,
    kernels (the collective kernels, :func:`gaptrace.analyses.collectives.collective_kernels` as records),
    strip ({t0_us, t1_us, busy: STRIP_BINS fractions}, own clock), warnings.
    """
    from . import occupancy, steps as steps_mod, verdicts

    dev = summary["devices"]
    busiest = max(dev, key=lambda d: d["busy_us"]) if dev else None
    verdict = figure = None
    n_steps = 0
    try:
        st = steps_mod.find_steps(trace)
        if st.rule != "none" and len(st.table):
            n_steps = int(len(st.table))
            ov = verdicts.step_verdicts(trace, st).overall
            verdict, figure = ov.get("verdict"), ov.get("figure")
    except ValueError:  # a trace the step rules cannot read: no verdict, the rest stands
        pass
    rounds = (summary.get("rounds") or {}).get("summary") or {}
    first = summary["findings"][0] if summary["findings"] else None
    strip = None
    if busiest is not None:
        key = (busiest["rank"], busiest["device"])
        bins = occupancy.busy_fraction_bins(trace, key, STRIP_BINS, summary.get("window"))
        strip = {"t0_us": float(busiest["window_start_us"]), "t1_us": float(busiest["window_end_us"]),
                 "busy": [float(x) for x in bins["busy_fraction"]]}
    kernels = collectives.collective_kernels(trace)
    return to_jsonable({
        "rank": rank, "path": path,
        "device": busiest["device"] if busiest else None,
        "device_name": busiest["name"] if busiest else None,
        "occupancy": busiest["occupancy"] if busiest else None,
        "busy_us": busiest["busy_us"] if busiest else 0.0,
        "window_us": busiest["window_us"] if busiest else 0.0,
        "window_start_us": busiest["window_start_us"] if busiest else None,
        "verdict": verdict, "step_figure": figure,
        "bound": rounds.get("bound"), "round_verdict": rounds.get("verdict"),
        "first_cause": first["summary"] if first else None, "first_cause_kind": first["kind"] if first else None,
        "headline": summary["headline"], "steps": n_steps,
        "idle_sites": [s["site"] for s in summary["idle_sites"][:TOP_SITES_SHARED]],
        "base_time_ns": collectives.base_time_ns(trace.metadata),
        "kernels": kernels.to_dict("records"),
        "strip": strip,
        "warnings": summary["warnings"],
    })


def _per_label(kernels: list[dict]) -> list[dict]:
    by: dict[str, list[float]] = {}
    for k in kernels:
        by.setdefault(k["label"], []).append(float(k["dur_us"]))
    return [{"label": lab, "count": len(d), "total_us": float(sum(d)), "mean_us": float(np.mean(d))}
            for lab, d in sorted(by.items())]


def merge_fleet(results: list[dict[str, Any]], frames: dict[int, list[dict]] | None = None) -> dict[str, Any]:
    """The fleet summary (module docstring's keys) from per-rank :func:`rank_result` dicts.

    ``frames``: per late rank the sites :func:`gaptrace.analyses.stragglers.charge_frames` found on its host
    (computed where its trace is loaded; :func:`late_requests` says which ranks and intervals). Without them the
    stragglers carry no site.
    """
    res = sorted(results, key=lambda r: r["rank"])
    ranks = [r["rank"] for r in res]
    warnings: list[str] = []
    offsets, why = collectives.clock_offsets_us({r["rank"]: r["base_time_ns"] for r in res})
    if why:
        warnings.append(why)
    tabs = [pd.DataFrame(r["kernels"], columns=collectives.KERNEL_COLUMNS).assign(rank=r["rank"]) for r in res]
    long, kind = collectives.match_collectives(tabs, offsets)
    waits = stragglers.instance_waits(long)
    per = stragglers.rank_waits(waits, ranks)
    resid = collectives.clock_check(long)
    bad = {r: v for r, v in resid.items() if abs(v) > CLOCK_WARN_US}
    if bad:
        warnings.append("after aligning by baseTimeNanoseconds the collectives' common end is off by "
                        + ", ".join(f"{v:+.0f} µs on rank {r}" for r, v in sorted(bad.items()))
                        + ": the ranks' clocks disagree; waits near that size are uncertain")
    spans: dict[int, list[list[float]]] = {}
    if not waits.empty:
        w = waits[waits["wait_us"] > 0]
        for rk, g in w.groupby("rank"):
            s0 = g["start_us"].to_numpy()
            spans[int(rk)] = [[float(a), float(a + d)] for a, d in zip(s0, g["wait_us"].to_numpy())][:MAX_WAIT_SPANS]
    out_ranks = []
    for r in res:
        p = per.get(r["rank"], {})
        window = r["window_us"] or 0.0
        bww = ((r["busy_us"] - p.get("waiting_union_us", 0.0)) / window) if window > 0 else None
        out_ranks.append({
            "rank": r["rank"], "path": r["path"], "device": r["device"], "device_name": r["device_name"],
            "occupancy": r["occupancy"], "busy_us": r["busy_us"], "window_us": r["window_us"],
            "busy_without_waiting": bww, "waited_us": p.get("waited_us", 0.0), "caused_us": p.get("caused_us", 0.0),
            "verdict": r["verdict"], "step_figure": r["step_figure"], "bound": r["bound"],
            "round_verdict": r["round_verdict"], "first_cause": r["first_cause"], "headline": r["headline"],
            "steps": r["steps"], "clock_offset_us": offsets.get(r["rank"], 0.0),
            "clock_residual_us": resid.get(r["rank"]), "collectives": _per_label(r["kernels"]),
            "strip": r["strip"], "wait_spans_us": spans.get(r["rank"], []), "warnings": r["warnings"]})
    by_label = []
    if not waits.empty:
        for lab, g in waits.groupby("label", sort=True):
            inst = g.groupby("instance").first()
            by_label.append({"label": str(lab), "instances": int(len(inst)), "ranks": int(g["rank"].nunique()),
                             "mean_dur_us": float(g["dur_us"].mean()), "total_wait_us": float(g["wait_us"].sum()),
                             "mean_wait_us": float(g["wait_us"].mean())})
    steps = [r["steps"] for r in res if r["steps"]]
    n_steps = int(np.median(steps)) if steps else None
    strag = []
    if not waits.empty:
        inst = waits.groupby("instance").first()
        for (late, lab), g in inst[inst["total_wait_us"] > 0].groupby(["late_rank", "label"]):
            rows = waits[waits["instance"].isin(g.index) & (waits["rank"] != late)]
            waiters = sorted(int(x) for x in rows.loc[rows["wait_us"] > 0, "rank"].unique())
            mean_wait = float(rows.groupby("rank")["wait_us"].sum().mean()) if len(rows) else 0.0
            sites = (frames or {}).get(int(late), [])
            site = sites[0]["site"] if sites else None
            strag.append({"late_rank": int(late), "label": str(lab), "instances": int(len(g)),
                          "caused_us": float(g["total_wait_us"].sum()), "waiters": waiters,
                          "mean_wait_us": mean_wait, "per_step_us": mean_wait / n_steps if n_steps else None,
                          "sites": sites,
                          "line": stragglers.straggler_line(waiters or [r for r in ranks if r != late], mean_wait,
                                                            n_steps, str(lab), int(late), site)})
        strag.sort(key=lambda s: -s["caused_us"])
    caused = {r["rank"]: r["caused_us"] for r in out_ranks}
    if caused and max(caused.values()) > 0:
        worst = max(caused, key=lambda r: (caused[r], -r))
        why_worst = f"it made the others wait {caused[worst] / 1000:.2f} ms in collectives"
    else:
        occ = {r["rank"]: r["occupancy"] for r in out_ranks if r["occupancy"] is not None}
        worst = min(occ, key=lambda r: (occ[r], r)) if occ else None
        why_worst = "the lowest occupancy (no rank made another wait)" if occ else "no rank has GPU activity"
        if occ and len(occ) > 1 and max(occ.values()) - min(occ.values()) < 1e-4:
            worst, why_worst = None, "none: every rank has the same occupancy and none made another wait"
    shared: dict[str, Any] = {}
    verdicts_ = {r["verdict"] for r in res}
    shared["verdict"] = next(iter(verdicts_)) if len(verdicts_) == 1 else None
    kinds = {r["first_cause_kind"] for r in res}
    shared["first_cause_kind"] = next(iter(kinds)) if len(kinds) == 1 else None
    common = set(res[0]["idle_sites"]) if res else set()
    for r in res[1:]:
        common &= set(r["idle_sites"])
    shared["idle_sites"] = [s for s in (res[0]["idle_sites"] if res else []) if s in common]
    labs = [set(k["label"] for k in r["kernels"]) for r in res]
    shared["collectives"] = sorted(set.intersection(*labs)) if labs else []
    headline = [f"{len(res)} ranks; occupancy " + ", ".join(
        f"rank {r['rank']} {r['occupancy']:.1%}" if r["occupancy"] is not None else f"rank {r['rank']} -"
        for r in out_ranks)]
    if strag:
        headline.append(strag[0]["line"])
        bww = [f"rank {r['rank']} {r['busy_without_waiting']:.1%}" for r in out_ranks
               if r["busy_without_waiting"] is not None]
        headline.append("busy without waiting: " + ", ".join(bww))
    headline.append(f"worst rank: {worst} ({why_worst})" if worst is not None else f"worst rank: {why_worst}")
    return to_jsonable({
        "ranks": out_ranks,
        "collectives": {"key_kind": kind, "instances": int(long["instance"].nunique()) if len(long) else 0,
                        "by_label": by_label},
        "stragglers": strag,
        "wait_matrix": {"ranks": ranks, "wait_us": stragglers.wait_matrix(waits, ranks)},
        "worst_rank": {"rank": worst, "why": why_worst},
        "shared": shared,
        "headline": headline,
        "warnings": warnings,
    })


CLOCK_WARN_US = 50.0  # a common end off by more than this after alignment: the clocks disagree


def late_requests(results: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Which late ranks' host frames to charge: {rank: {starts_us, ends_us (its own clock), caused_us}} for every
    rank that made another wait (:func:`gaptrace.analyses.stragglers.late_intervals`)."""
    res = sorted(results, key=lambda r: r["rank"])
    offsets, _ = collectives.clock_offsets_us({r["rank"]: r["base_time_ns"] for r in res})
    tabs = [pd.DataFrame(r["kernels"], columns=collectives.KERNEL_COLUMNS).assign(rank=r["rank"]) for r in res]
    long, _ = collectives.match_collectives(tabs, offsets)
    waits = stragglers.instance_waits(long)
    per = stragglers.rank_waits(waits, [r["rank"] for r in res])
    out = {}
    for r, p in per.items():
        if p["caused_us"] > 0:
            s, e = stragglers.late_intervals(waits, r, offsets.get(r, 0.0))
            out[r] = {"starts_us": s.tolist(), "ends_us": e.tolist(), "caused_us": p["caused_us"]}
    return out


# Fleet-level metrics of :func:`diff_fleets` (the gates of ``gaptrace diff A B`` on two fleets)
FLEET_METRICS = ("occupancy", "busy_without_waiting", "waited_us", "caused_us")


def _fleet_metrics(f: dict[str, Any]) -> dict[str, float | None]:
    """occupancy and busy_without_waiting: the lowest over ranks (a fleet is as fast as its slowest rank);
    waited_us: the ranks' waits summed; caused_us: the most one rank caused."""
    def vals(k):
        return [r[k] for r in f["ranks"] if r.get(k) is not None]

    occ, bww = vals("occupancy"), vals("busy_without_waiting")
    return {"occupancy": min(occ) if occ else None, "busy_without_waiting": min(bww) if bww else None,
            "waited_us": float(sum(vals("waited_us"))), "caused_us": max(vals("caused_us"), default=0.0)}


def diff_fleets(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two fleet summaries (:func:`merge_fleet`; A baseline, B candidate) compared.

    Keys: metrics {name: {a, b, delta (b − a), rel (delta / |a|, None when a is 0 or absent)}} over
    ``FLEET_METRICS`` (:func:`_fleet_metrics`); ranks [{rank, occupancy_a, occupancy_b, busy_without_waiting_a,
    busy_without_waiting_b, waited_us_a, waited_us_b, caused_us_a, caused_us_b}] over the ranks in both;
    stragglers {a: [line], b: [line]}; worst_rank {a, b}; warnings (ranks in one fleet only)."""
    ma, mb = _fleet_metrics(a), _fleet_metrics(b)
    metrics = {}
    for k in FLEET_METRICS:
        x, y = ma[k], mb[k]
        d = None if x is None or y is None else y - x
        metrics[k] = {"a": x, "b": y, "delta": d, "rel": d / abs(x) if d is not None and x else None}
    ra, rb = {r["rank"]: r for r in a["ranks"]}, {r["rank"]: r for r in b["ranks"]}
    ranks = []
    for r in sorted(set(ra) & set(rb)):
        row = {"rank": r}
        for k in ("occupancy", "busy_without_waiting", "waited_us", "caused_us"):
            row[f"{k}_a"], row[f"{k}_b"] = ra[r].get(k), rb[r].get(k)
        ranks.append(row)
    warnings = []
    only = sorted(set(ra) ^ set(rb))
    if only:
        warnings.append(f"ranks {', '.join(map(str, only))} are in one fleet only: left out of the per-rank rows")
    return to_jsonable({"metrics": metrics, "ranks": ranks,
                        "stragglers": {"a": [s["line"] for s in a["stragglers"]],
                                       "b": [s["line"] for s in b["stragglers"]]},
                        "worst_rank": {"a": a["worst_rank"], "b": b["worst_rank"]}, "warnings": warnings})


def check_fleet_gates(d: dict[str, Any], exprs: list[str]) -> list[dict]:
    """``--fail-if`` on a fleet diff: METRIC OP NUMBER over ``FLEET_METRICS`` (B's value) or delta_/rel_ of one;
    [{gate, value, tripped}], a missing value trips. GateError (one line) for anything else."""
    import math
    import re

    from .diff import _GATE_RE, _OPS, MAX_GATE_CHARS, GateError

    out = []
    for expr in exprs:
        m = _GATE_RE.fullmatch(expr) if len(expr) <= MAX_GATE_CHARS else None
        if not m or not math.isfinite(float(m.group(3))):
            raise GateError(f"cannot parse gate {expr[:60]!r}: expected METRIC OP NUMBER, e.g. 'occupancy < 0.9'")
        name, op, num = m.group(1), m.group(2), float(m.group(3))
        base = re.sub(r"^(delta|rel)_", "", name)
        if base not in FLEET_METRICS:
            raise GateError(f"unknown fleet metric {name!r} in gate {expr!r}; metrics: {', '.join(FLEET_METRICS)} "
                            "(or delta_NAME, rel_NAME)")
        field = "delta" if name.startswith("delta_") else "rel" if name.startswith("rel_") else "b"
        v = d["metrics"][base][field]
        out.append({"gate": expr, "value": v, "tripped": True if v is None else bool(_OPS[op](v, num))})
    return out
