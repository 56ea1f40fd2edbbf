"""The replay model's proof on measured fixes: for every measured pair (a capture with a cause and its fixed twin,
each period measured without the profiler), the predicted unprofiled round / step period of the with-cause capture
against its measured one, and the predicted saving of the fix (``whatif --remove`` of the cause; ``whatif --graph``
where the fixed twin captures the cause's work in a CUDA graph) against the measured difference of the two variants
(docs/DESIGN.md "Counterfactuals", "The proof on measured fixes").

Pairs:

- the runtime (``fixtures/traces/h200_pairs/pairs.json``): each fault's NVTX range (``lengths_copy``, ...); sync
  against overlap: the sync scheduler's blocking read, the frame ``device_lengths_to_host``. Measured period of a
  capture: the median of its sidecar's ``unprofiled_round_ms`` (same process, after warm-up).
- the loops that are not the runtime (``fixtures/traces/h200_loops/LOOP.pairs.json``): the ``planted_<cause>``
  range of the planted variant's trace. Measured period: per measurement process ``LOOP.planted.mK.json`` the median
  of ``step_periods_ms`` after the first ``skip_fraction`` of them, the variant's figure the median over processes
  (``summary.md``); the capture process's own warm-up periods (sidecar ``unprofiled_step_ms``) in a second column.
  The steps: the loops' ``step`` range (found by :func:`gaptrace.analyses.steps.find_steps`, or ProfilerStep#N).

Goal: period within 10% of the measured one; saving within 35% of the measured saving or 60 µs. A pair whose
measured saving range (processes' min − max to max − min) includes 0 has no measured saving beyond "small or
none": its row says so and it is counted apart.

    .venv/bin/python benchmarks/bench_whatif.py [--calibration FILE] [--out benchmarks/results/DATE_h200_whatif.md]

Prints one markdown table per calibration (the shipped default, measured on the H200 host of these captures, and
the CPU build machine's). Predicted period: the calibration alone (``unfitted_round_us``); predicted saving: the
model as shipped, its profiler cost scale fitted to the capture's own unprofiled rounds where the sidecar has them
(``profiler_cost_scale``), and, in the next column, the calibration alone.
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

PAIRS_DIR = os.path.join(ROOT, "fixtures", "traces", "h200_pairs")
# the same captures made again on another day, whose sidecars also time every NVTX range unprofiled
# (``unprofiled_ranges``: the replay gives those ranges their measured host time, DESIGN.md 5.2)
REPEAT_DIR = os.path.join(ROOT, "fixtures", "traces", "h200_pairs_repeat")
LOOPS_DIR = os.path.join(ROOT, "fixtures", "traces", "h200_loops")
# the same loops captured and measured on an H100 machine, whose captures time every record_function range
# unprofiled (Capture's ``unprofiled_ranges``) and whose fresh processes vary far less
H100_LOOPS_DIR = os.path.join(ROOT, "fixtures", "traces", "h100_loops")
# hf_generate with cuDNN left out of the attention backends (a stationary step), and its cudnn1 processes: the fix of
# the H100 hf_generate capture's first finding, measured
NOCUDNN_DIR = os.path.join(ROOT, "fixtures", "traces", "h100_hf_nocudnn")
# two loops of hidden syncs measured on an H100: torch.cuda.empty_cache() every step (the allocator's frees and
# mallocs) and nonzero / boolean-mask indexing; loops the model was not tuned on
HIDDEN_SYNCS_DIR = os.path.join(ROOT, "fixtures", "traces", "h100_hidden_syncs")
# loops written after the model (benchmarks/loops/eager_sampling.py, after --graph; copy_stream_sync.py, a loop on two
# streams, after the cross-stream edges), measured on another H100 machine
NEW_LOOPS_DIR = os.path.join(ROOT, "fixtures", "traces", "h100_new_loops")
# copy_stream_sync made serial (size keys graphed=1, read_back=1): the forward stays behind its copy on the device
# once the host wait goes, so the cross-stream edges decide the prediction
SERIAL_DIR = os.path.join(NEW_LOOPS_DIR, "serial")
SDPA_FRAME = "transformers/integrations/sdpa_attention.py(79): sdpa_attention_forward"
H200_CAL = os.path.join(PAIRS_DIR, "calibration_h200.json")  # the same figures as the shipped default
CPU_CAL = os.path.join(ROOT, "analyses", "data", "calibration_cpu_epyc.json")
PERIOD_GOAL = 0.10
SAVING_GOAL = 0.35
SAVING_FLOOR_US = 60.0


def mk_period_ms(path: str) -> float:
    """One measurement process's unprofiled step period: median of ``step_periods_ms`` after the first
    ``skip_fraction`` (the loops' run_pairs rule)."""
    with open(path, encoding="utf-8") as f:
        d = json.load(f)
    v = d["step_periods_ms"]
    return float(np.median(v[int(d.get("skip_fraction", 0.1) * len(v)):]))


def sidecar_period_ms(trace_path: str, key: str) -> float | None:
    """Median of the sidecar's unprofiled periods (``unprofiled_round_ms`` or ``unprofiled_step_ms``), ms."""
    from gaptrace.sidecar import sidecar_path
    p = sidecar_path(trace_path)
    if not os.path.exists(p):
        return None
    with open(p, encoding="utf-8") as f:
        v = json.load(f).get(key)
    return float(np.median(v)) if isinstance(v, list) and v else None


def runtime_pairs(folder: str = PAIRS_DIR, label: str = "") -> list[dict]:
    """The runtime's pairs of one folder: with-cause traces, the site to remove, measured saving and range (ms);
    ``label`` is appended to each pair's name."""
    with open(os.path.join(folder, "pairs.json"), encoding="utf-8") as f:
        d = json.load(f)
    out = []
    for p in d["pairs"]:
        site = list(p["cause"]) if isinstance(p["cause"], list) else [p["cause"]]
        traces = [os.path.join(folder, n + ".json.gz") for n in p["with_cause"]]
        fixed = [sidecar_period_ms(os.path.join(folder, n + ".json.gz"), "unprofiled_round_ms") for n in p["fixed"]]
        meas = [sidecar_period_ms(t, "unprofiled_round_ms") for t in traces]
        lo, hi = min(meas) - max(fixed), max(meas) - min(fixed)
        out.append({"pair": p["pair"] + label, "site": site, "traces": traces, "measured_period_ms": meas,
                    "fixed_traces": [os.path.join(folder, n + ".json.gz") for n in p["fixed"]],
                    "same_process_ms": meas, "measured_saving_ms": float(np.mean(meas) - np.mean(fixed)),
                    "saving_range_ms": (lo, hi), "round_name": "round"})
    return out


def loop_pairs(folder: str = LOOPS_DIR, label: str = "") -> list[dict]:
    """The loops' pairs of one folder: the planted trace, its ``planted_*`` range, measured periods (mK.json) and
    saving (ms); ``label`` is appended to each pair's name."""
    out = []
    for pp in sorted(glob.glob(os.path.join(folder, "*.pairs.json"))):
        loop = os.path.basename(pp).split(".")[0]
        pl = [mk_period_ms(f) for f in sorted(glob.glob(os.path.join(folder, f"{loop}.planted.m*.json")))]
        fx = [mk_period_ms(f) for f in sorted(glob.glob(os.path.join(folder, f"{loop}.fixed.m*.json")))]
        trace = os.path.join(folder, f"{loop}.planted.trace.json.gz")
        if not os.path.exists(trace):  # measured, trace not shipped (the folder's MANIFEST.md says why)
            continue
        out.append(process_pair(f"loop {loop}{label}", None, trace, pl, fx,
                                json.load(open(pp, encoding="utf-8")).get("paired"),
                                fix="graph" if loop in GRAPH_FIX_LOOPS else "remove"))
    return out


def process_pair(name: str, site: list[str] | None, trace: str, with_cause: list[float], fixed: list[float],
                 paired: dict | None = None, fix: str = "remove") -> dict:
    """One loop pair measured in fresh processes: ``with_cause`` and ``fixed`` per-process step periods (ms), the
    saving = the difference of their medians, its range = min − max to max − min; ``paired``: run_pairs' paired
    block summary, or None; ``site`` None: the trace's ``planted_*`` range; ``fix``: the counterfactual that models
    the measured fix, "remove" (``whatif --remove``) or "graph" (``whatif --graph``: the fixed twin captures the
    site's work in a CUDA graph)."""
    return {"pair": name, "site": site, "traces": [trace], "fix": fix,
            "paired_saving_ms": paired["saving_ms"] if paired else None,
            "paired_range_ms": tuple(paired["saving_range_ms"]) if paired else None,
            "measured_period_ms": [float(np.median(with_cause))],
            "same_process_ms": [sidecar_period_ms(trace, "unprofiled_step_ms")],
            "measured_saving_ms": float(np.median(with_cause) - np.median(fixed)),
            "saving_range_ms": (min(with_cause) - max(fixed), max(with_cause) - min(fixed)), "round_name": "step",
            "processes": (with_cause, fixed)}


def first_finding_pairs() -> list[dict]:
    """The fix of a capture's first finding, measured: the H100 hf_generate capture with the attention's host work
    (``SDPA_FRAME``) removed, against the planted variant's processes with cuDNN attention (``cudnn1``) and without it
    (``planted``) in ``NOCUDNN_DIR``."""
    on = [mk_period_ms(f) for f in sorted(glob.glob(os.path.join(NOCUDNN_DIR, "hf_generate.cudnn1.m*.json")))]
    off = [mk_period_ms(f) for f in sorted(glob.glob(os.path.join(NOCUDNN_DIR, "hf_generate.planted.m*.json")))]
    trace = os.path.join(H100_LOOPS_DIR, "hf_generate.planted.trace.json.gz")
    if not on or not off:
        return []
    return [process_pair("hf_generate (H100): its first finding, cuDNN attention left out", [SDPA_FRAME], trace, on, off)]


# the eager forward's frame (the first finding of per_request_readback and mask_index, the second of helper_thread and
# host_detokenize on the H100): its fix, a CUDA graph, measured as the planted variant with graph_forward 0 and 1
FORWARD_FRAME = "benchmarks/loops/_common.py(153): logits"
# the loops whose fixed twin replays the planted range's work as one CUDA graph (benchmarks/loops/launch_bound.py)
GRAPH_FIX_LOOPS = ("launch_bound", "eager_sampling")
FORWARD_GRAPH_LOOPS = ((H100_LOOPS_DIR, "helper_thread"), (H100_LOOPS_DIR, "host_detokenize"),
                       (H100_LOOPS_DIR, "per_request_readback"), (HIDDEN_SYNCS_DIR, "mask_index"))


def forward_graph_pairs() -> list[dict]:
    """Graphing the eager forward, measured (``FOLDER/forward_graph/LOOP.gG.mK.json``, fresh processes interleaved),
    against removing ``FORWARD_FRAME``'s host work on the planted capture."""
    out = []
    for folder, loop in FORWARD_GRAPH_LOOPS:
        d = os.path.join(folder, "forward_graph")
        eager = [mk_period_ms(f) for f in sorted(glob.glob(os.path.join(d, f"{loop}.g0.m*.json")))]
        graphed = [mk_period_ms(f) for f in sorted(glob.glob(os.path.join(d, f"{loop}.g1.m*.json")))]
        trace = os.path.join(folder, f"{loop}.planted.trace.json.gz")
        if not eager or not graphed or not os.path.exists(trace):
            continue
        out.append(process_pair(f"{loop} (H100): the eager forward graphed", [FORWARD_FRAME], trace, eager, graphed,
                                fix="graph"))
    return out


def allocator_pairs(folder: str = HIDDEN_SYNCS_DIR) -> list[dict]:
    """empty_cache's first finding, the allocator churn: its cause is every cudaMalloc and cudaFree of the launching
    thread (the frees inside the planted range, the allocations they force in the next step's forward), removed
    together, against the same measured fix as the planted range's row (the loop without empty_cache)."""
    out = [dict(p, pair="empty_cache (H100): its first finding, the allocator's driver calls",
                site=["cudaMalloc", "cudaFree"]) for p in loop_pairs(folder) if p["pair"] == "loop empty_cache"]
    return out


def planted_site(trace) -> str:
    """The one host range named ``planted_*`` of a loop trace."""
    names = trace.host.loc[trace.host["cat"] == "user_annotation", "name"].astype(str).unique()
    cand = sorted(n for n in names if n.startswith("planted_"))
    if len(cand) != 1:
        raise SystemExit(f"{trace.path}: expected one planted_* range, found {cand}")
    return cand[0]


def _context(path: str, calibration, traces_cache: dict, round_name: str, measured_ranges: bool, fit: bool = True):
    """(trace, Context) of one capture, its sidecar's ``unprofiled_ranges`` left out unless ``measured_ranges``."""
    from gaptrace import load_trace
    from gaptrace.analyses.whatif import Context
    from gaptrace.sidecar import read_sidecar_checked
    if path not in traces_cache:
        traces_cache[path] = load_trace(path)
    tr = traces_cache[path]
    side, _ = read_sidecar_checked(path)
    if side is not None and not measured_ranges:
        side = {k: v for k, v in side.items() if k != "unprofiled_ranges"}
    return tr, Context(tr, side, calibration, round_name=round_name, fit=fit)


def device_work_ms(ctx, res) -> float:
    """Median over the rounds of a replay's device work a round on its busiest stream, ms (the floor of DESIGN.md
    5.5, :func:`gaptrace.analyses.whatif.device_round_busy_us`)."""
    from gaptrace.analyses.whatif import device_round_busy_us
    return float(np.median(device_round_busy_us(ctx.model, res, ctx.starts))) / 1e3


def predict(pair: dict, calibration, traces_cache: dict, measured_ranges: bool = True) -> dict:
    """Predicted period (ms, per with-cause trace) and saving (ms, mean over them) for one pair; for a runtime pair
    also the device work a round (ms, unprofiled replay) of the with-cause capture, of it with the cause's eager
    device work removed, and of the fixed twins' own captures: what the fix changes on the device that the
    with-cause trace cannot show."""
    from gaptrace.analyses.whatif import Change, whatif
    periods, savings, raw, scales, rule, with_dev, set_aside = [], [], [], [], None, [], []
    dev_with, dev_after = [], []
    for t in pair["traces"]:
        tr, ctx = _context(t, calibration, traces_cache, pair["round_name"], measured_ranges)
        sites = pair["site"] or [planted_site(tr)]
        graph = pair.get("fix") == "graph"
        pair["site_used"] = "`, `".join(sites)
        w = whatif(tr, [Change(x, graph=graph) for x in sites], context=ctx).data
        with_dev.append(whatif(tr, [Change(x, with_device=True) for x in sites], context=ctx).data["saving_us"] / 1e3)
        dev_with.append(device_work_ms(ctx, ctx.base))
        dev_after.append(device_work_ms(ctx, ctx.run([Change(x, with_device=True) for x in sites])))
        periods.append(w["unfitted_round_us"] / 1e3)
        savings.append(w["saving_us"] / 1e3)
        scales.append(w["profiler_cost_scale"] if w["fitted_to_unprofiled"] else None)
        set_aside.append(w["profiler_cost_fit"] == "set_aside")
        if w["fitted_to_unprofiled"]:
            _tr, ctx0 = _context(t, calibration, traces_cache, pair["round_name"], measured_ranges, fit=False)
            raw.append(whatif(tr, [Change(x, graph=graph) for x in sites], context=ctx0).data["saving_us"] / 1e3)
        else:
            raw.append(w["saving_us"] / 1e3)
        rule = "range" if w["round_rule"] == "round" else w["round_rule"]
        rule = f"{rule} `{w['round_name']}`"
    dev_fixed = []
    for t in pair.get("fixed_traces", ()):
        _tr, ctx = _context(t, calibration, traces_cache, pair["round_name"], measured_ranges)
        dev_fixed.append(device_work_ms(ctx, ctx.base))
    device = ({"with_cause": float(np.mean(dev_with)), "removed": float(np.mean(dev_after)),
               "fixed": float(np.mean(dev_fixed))} if dev_fixed else None)
    return {"periods_ms": periods, "saving_ms": float(np.mean(savings)), "unfitted_saving_ms": float(np.mean(raw)),
            "with_device_saving_ms": float(np.mean(with_dev)), "scales": scales, "rule": rule, "device_ms": device,
            "set_aside": set_aside}


def judge(pair: dict, pred: dict) -> dict:
    meas_p = pair["measured_period_ms"]
    perr = [(p - m) / m for p, m in zip(pred["periods_ms"], meas_p)]
    same = [s for s in pair["same_process_ms"] if s is not None]
    serr = [(p - m) / m for p, m in zip(pred["periods_ms"], same)] if len(same) == len(pred["periods_ms"]) else []
    # a capture whose own unprofiled periods the model set aside (its warm-up unlike its profiled steps) is judged
    # against the fresh processes' periods
    same_used = bool(serr) and not any(pred.get("set_aside", ()))
    ms, ps = pair["measured_saving_ms"], pred["saving_ms"]
    lo, hi = pair["saving_range_ms"]
    err_ms = ps - ms
    ok_saving = abs(err_ms) <= max(SAVING_GOAL * abs(ms), SAVING_FLOOR_US / 1e3)
    includes0 = lo <= 0 <= hi
    wd = pred["with_device_saving_ms"]
    ok_with_device = abs(wd - ms) <= max(SAVING_GOAL * abs(ms), SAVING_FLOOR_US / 1e3)
    pm = pair.get("paired_saving_ms")
    ok_paired = None if pm is None else abs(ps - pm) <= max(SAVING_GOAL * abs(pm), SAVING_FLOOR_US / 1e3)
    paired0 = pm is not None and pair["paired_range_ms"][0] <= 0 <= pair["paired_range_ms"][1]
    return {"ok_paired": ok_paired, "paired_includes0": paired0, "ok_with_device": ok_with_device, "with_device_err_ms": wd - ms,"period_err": perr, "same_err": serr, "saving_err_ms": err_ms,
            "saving_err_rel": err_ms / ms if ms else math.nan, "ok_saving": ok_saving,
            "ok_period": all(abs(e) <= PERIOD_GOAL for e in (serr if same_used else perr)), "includes0": includes0,
            "same_used": same_used,
            "in_range": lo <= ps <= hi, "sign_ok": includes0 or (ps > 0) == (ms > 0)}


def _cal_line(cal) -> str:
    """The table's calibration line: the file's costs, or (None) each shipped one a trace's GPU selects."""
    from gaptrace.analyses.profiler_cost import DEFAULT_CALIBRATION, load_calibration, shipped_calibration_path

    if cal is not None:
        return (f"Calibration: {os.path.relpath(cal.source, ROOT)} ({cal.measured_on}): aten {cal.aten_op_us:.2f} µs, "
                f"python frame {cal.python_frame_us:.2f} µs, runtime-call cost {cal.runtime_call_us:.2f} µs, device "
                f"op {cal.device_op_us:.2f} µs, queued-launch gap "
                + (f"{cal.queue_gap_us:.2f} µs" if cal.queue_gap_us is not None else "not measured (the trace's)"))
    parts = []
    for path in dict.fromkeys((shipped_calibration_path("NVIDIA H100 80GB HBM3"), DEFAULT_CALIBRATION)):
        c = load_calibration(path)
        parts.append(_cal_line(c).replace("Calibration: ", ""))
    return "Calibration: the shipped one of each trace's GPU model (an H100 trace: the first; any other: the second): " \
        + "; ".join(parts)


def table(rows: list[tuple[dict, dict, dict]], cal) -> str:
    fmt = lambda v: "/".join(f"{x:.3f}" for x in v)
    pct = lambda v: "/".join(f"{x:+.1%}" for x in v)
    out = [_cal_line(cal), "",
           "| pair | removed (graph: captured in a CUDA graph) | steps | measured period ms | same-process ms | predicted ms | error % (vs same process) "
           "| measured saving ms [range] | predicted saving ms (scale α) | error | unfitted saving ms "
           "| with its device work ms (error) | device work a round ms: with cause / its eager work removed / fixed twin "
           "| within goal? | paired saving ms [range] (error): within goal? |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    n_p = n_s = n_s_test = n_wd = 0
    n_pair = n_pair_ok = 0
    for pair, pred, j in rows:
        lo, hi = pair["saving_range_ms"]
        same = [s for s in pair["same_process_ms"] if s is not None]
        err = f"{pct(j['period_err'])}" + (f" ({pct(j['same_err'])}{'' if j['same_used'] else ': set aside'})"
                                           if j["same_err"] and same != pair["measured_period_ms"] else "")
        rel = "" if not pair["measured_saving_ms"] else f" ({j['saving_err_rel']:+.0%})"
        if j["includes0"]:
            verdict = "range includes 0: " + ("prediction inside it" if j["in_range"] else "prediction outside it")
        else:
            n_s_test += 1
            verdict = "yes" if j["ok_saving"] else ("with its device work" if j["ok_with_device"] else "no")
            n_s += j["ok_saving"]
            n_wd += j["ok_saving"] or j["ok_with_device"]
        verdict = ("period yes" if j["ok_period"] else "period no") + "; saving " + verdict
        pm = pair.get("paired_saving_ms")
        if pm is None:
            pcell = "-"
        else:
            plo, phi = pair["paired_range_ms"]
            n_pair += 1
            n_pair_ok += bool(j["ok_paired"])
            pcell = (f"{pm:.3f} [{plo:.3f}, {phi:.3f}] ({(pred['saving_ms'] - pm) * 1e3:+.0f} µs): "
                     + ("yes" if j["ok_paired"] else "no") + ("; range includes 0" if j["paired_includes0"] else ""))
        alpha = "/".join("unfitted" if a is None else f"α {a:.2f}" for a in pred["scales"])
        dv = pred["device_ms"]
        dcell = "-" if dv is None else f"{dv['with_cause']:.3f} / {dv['removed']:.3f} / {dv['fixed']:.3f}"
        n_p += j["ok_period"]
        out.append(f"| {pair['pair']} | {'graph ' if pair.get('fix') == 'graph' else ''}`{pair['site_used']}` | {pred['rule']} | {fmt(pair['measured_period_ms'])} | "
                   f"{fmt(same) if same else '-'} | {fmt(pred['periods_ms'])} | {err} | "
                   f"{pair['measured_saving_ms']:.3f} [{lo:.3f}, {hi:.3f}] | {pred['saving_ms']:.3f} ({alpha}) | "
                   f"{j['saving_err_ms'] * 1e3:+.0f} µs{rel} | {pred['unfitted_saving_ms']:.3f} | "
                   f"{pred['with_device_saving_ms']:.3f} ({j['with_device_err_ms'] * 1e3:+.0f} µs) | {dcell} | {verdict} | "
                   f"{pcell} |")
    out += ["", f"Summary: period within {PERIOD_GOAL:.0%} on {n_p} of {len(rows)} pairs (against the same process's "
            f"unprofiled periods where the capture has them); saving within {SAVING_GOAL:.0%} or "
            f"{SAVING_FLOOR_US:.0f} µs on {n_s} of {n_s_test} pairs whose measured range excludes 0 "
            f"({len(rows) - n_s_test} pairs' measured range includes 0), on {n_wd} of them by the saving or by the "
            f"saving with the cause's device work too; right sign on "
            f"{sum(j['sign_ok'] for _, _, j in rows)} of {len(rows)}."
            + (f" Against the paired saving (both variants measured in the capture's own process): within the goal "
               f"on {n_pair_ok} of {n_pair} loops." if n_pair else "")]
    return "\n".join(out)


def range_table(calibration) -> str:
    """Per NVTX range the repeat captures timed unprofiled (sidecar ``unprofiled_ranges``): its measured host time a
    round against the calibration alone's estimate of it (the profiled range less the per-event costs, α = 1), for
    the ranges the replay can give their measured time (no blocking call inside, no measured range nested)."""
    from gaptrace import load_trace
    from gaptrace.analyses.whatif import Context
    from gaptrace.sidecar import read_sidecar_checked
    rows, errs, used = [], [], set()
    for t in sorted(glob.glob(os.path.join(REPEAT_DIR, "*.json.gz"))):
        side, _ = read_sidecar_checked(t)
        ctx = Context(load_trace(t), side, calibration, fit=False)
        used.add(os.path.relpath(ctx.calibration.source, ROOT))
        for name, r in sorted(ctx.unprof["measured_ranges"].items()):
            if not r["applied"] or name in ("round",):
                continue
            m, e = r["measured_us_per_round"], r["modeled_us_per_round"]
            errs.append((e - m) / m)
            rows.append(f"| {os.path.basename(t)[:-8]} | `{name}` | {m:,.0f} | {e:,.0f} | {(e - m) / m:+.0%} |")
    big = [r for r, x in zip(rows, errs) if abs(x) > 0.25]
    return "\n".join([f"Per-range host time, measured unprofiled against the calibration alone "
                       f"({', '.join(sorted(used))}), on the repeat captures:", "",
                       "| capture | range | measured µs a round | calibration estimate µs | error |",
                       "| --- | --- | --- | --- | --- |"] + rows
                      + ["", f"Median |error| {np.median(np.abs(errs)):.0%} over {len(errs)} ranges; "
                             f"{len(big)} beyond ±25%."])


def main(argv: list[str] | None = None) -> int:
    from gaptrace.analyses.profiler_cost import load_calibration
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibration", action="append", default=None,
                    help="calibration file(s); default: the shipped one (the H200's) and the CPU build machine's")
    ap.add_argument("--only", default=None, help="only pairs whose name contains this")
    ap.add_argument("--out", default=None, help="also write the tables to this markdown file")
    ap.add_argument("--no-measured-ranges", action="store_true",
                    help="leave the sidecars' unprofiled_ranges out (the replay models every range from the "
                         "calibration), to see what the measured range times change")
    ap.add_argument("--h100-loops-dir", default=H100_LOOPS_DIR, help="the H100 loop set (default: the shipped one)")
    a = ap.parse_args(argv)
    measured_ranges = not a.no_measured_ranges
    # None: each trace's shipped calibration (the one measured on its GPU model: profiler_cost.shipped_calibration_path)
    cals = [load_calibration(c) if c else None for c in (a.calibration or [None, CPU_CAL])]
    pairs = (runtime_pairs() + runtime_pairs(REPEAT_DIR, " (repeat)") + loop_pairs()
             + loop_pairs(a.h100_loops_dir, " (H100)") + loop_pairs(NOCUDNN_DIR, " (H100, no cuDNN attention)")
             + first_finding_pairs() + loop_pairs(HIDDEN_SYNCS_DIR, " (H100, hidden syncs)") + allocator_pairs()
             + forward_graph_pairs() + loop_pairs(NEW_LOOPS_DIR, " (another H100, written after the model)")
             + loop_pairs(SERIAL_DIR, " (another H100, serial: graphed forward, read back every step)"))
    if a.only:
        pairs = [p for p in pairs if a.only in p["pair"]]
    cache: dict = {}
    t0 = time.perf_counter()
    parts = []
    for cal in cals:
        rows = []
        for p in pairs:
            pred = predict(p, cal, cache, measured_ranges)
            rows.append((p, pred, judge(p, pred)))
        parts.append(table(rows, cal))
        if measured_ranges and not a.only:
            parts.append(range_table(cal))
    text = ("# What fixing it buys: predicted against measured (H200 and H100 traces)\n\n"
            "`.venv/bin/python benchmarks/bench_whatif.py` (docs/DESIGN.md \"The proof on measured fixes\"). "
            "Measured period: runtime = median of the capture's own `unprofiled_round_ms` (sidecar); loops = median "
            "over the measurement processes (`LOOP.planted.mK.json`), the capture process's own warm-up steps "
            "(sidecar `unprofiled_step_ms`) as the same-process column.\n\n" + "\n\n".join(parts)
            + f"\n\n({time.perf_counter() - t0:.1f} s)\n")
    print(text)
    if a.out:
        tmp = a.out + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
