"""Compare two analyses (A = baseline, B = candidate): what changed, and did it win.

Input: two dicts from :func:`gaptrace.analyses.summary.run_analysis`. Output (:func:`diff_analyses`):

- ``metrics``: {name: {a, b, delta, rel}} for occupancy, busy_us, idle_us, window_us, t_round_us, t_gpu_us,
  t_host_us, t_serial_us, tau, tpot_us, kappa_us_per_node, blocked_us (Σ over sync sites), idle_after_us;
  delta = b − a, rel = delta / a (0 where both are 0; None where only a is 0 or either side is missing);
- ``frames``: idle by frame, {vanished: [...], appeared: [...], changed: [...] (frames in both whose idle differs)}
  (frame, a_us, b_us, delta_us),
  each sorted by |delta|; frames are matched without line numbers and step counters (:func:`_frame_key`), so
  the same function in two versions of the code is one frame; the program's wrapper frames with no self idle are
  folded (:func:`.gaps.frame_table`), and frames with the same idle in both traces (one chain of callers) are one
  row, the one with the most self idle, ``same_idle_frames`` counting the others;
- ``syncs``: the same for blocking-sync sites (keyed by call + site + ATen op);
- ``bubbles``: the same for the bubbles between graph nodes by kernel pair (``node_bubbles``; rows carry
  ``before``, ``after`` and ``pair`` = "before -> after"): the boundaries a fusion removed (vanished) or added;
  None when neither trace has any;
- ``whatif``: the replay model's predicted unprofiled round of A and B (``whatif.predicted_unprofiled_round_us``
  of each analysis) and the change it predicts, beside the measured one where both captures' sidecars hold an
  unprofiled round (``measured_unprofiled_round_us``): {predicted_a_us, predicted_b_us, predicted_delta_us,
  predicted_rel, measured_a_us, measured_b_us, measured_delta_us, measured_rel, measured_source_a, measured_source_b (the
  rounds each measured: figures of different rounds are not compared, measured_delta_us None), calibration_a,
  calibration_b (the calibration file each side's prediction used), statement}; None when neither
  analysis has a prediction;
- ``warnings``: [str]; says when A and B were analysed over different windows (one over its capture sidecar's
  analysis_window, the other over its whole trace or another annotation): their metrics then describe different
  spans (``--window NAME`` analyses the same annotation in both);
- ``accept_length``: the accept-length inequality (DESIGN.md "Diff and gates") for the pair. TPOT = Tround / τ,
  so B's TPOT is lower exactly when (1 + ΔTround/Tround) < (1 + Δτ/τ); to first order a change that costs accept
  length wins only if it cuts the round by a larger fraction: −ΔTround/Tround > −Δτ/τ ("a change wins only if
  ΔTround/Tround > Δτ/τ", with savings counted positive). Reports both fractions, the exact TPOT ratio and the
  verdict.

Gates (:func:`check_gates`): expressions ``METRIC OP NUMBER`` (OP one of < <= > >= == !=), where METRIC is a
metric name (B's value), ``delta_NAME`` or ``rel_NAME``; e.g. ``occupancy < 0.9``, ``rel_tpot_us > 0.02``.
Parsed, never ``eval``-ed.
"""
from __future__ import annotations

import math
import operator
import os
import re
from typing import Any

from .gaps import frame_table

__all__ = ["diff_analyses", "check_gates", "parse_gate", "GateError", "METRICS"]

METRICS = ("occupancy", "busy_us", "idle_us", "window_us", "t_round_us", "t_gpu_us", "t_host_us", "t_serial_us",
           "tau", "tpot_us", "kappa_us_per_node", "blocked_us", "idle_after_us")

_OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq,
        "!=": operator.ne}
# METRIC OP NUMBER. Each part is a run no other part can take a character from (the number's digits before and
# after its point are split by the point itself), so a failed match gives back at most one character per part:
# linear, where "\d+\.?\d*" tried every split of a run of digits (16,000 digits then an "x": 16 s).
_GATE_RE = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|>=|==|!=|<|>)\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*")
MAX_GATE_CHARS = 200


class GateError(ValueError):
    """A --fail-if expression that cannot be parsed or names an unknown metric."""


def _scalars(res: dict) -> dict[str, float | None]:
    """The comparable scalars of one analysis (the device the analysis focused on: the busiest)."""
    out: dict[str, float | None] = {m: None for m in METRICS}
    devs = res.get("devices") or []
    if devs:
        d = max(devs, key=lambda d: d.get("busy_us") or 0)
        for k in ("occupancy", "busy_us", "idle_us", "window_us"):
            out[k] = d.get(k)
    rr = (res.get("rounds") or {}).get("summary") or {}
    for k in ("t_round_us", "t_gpu_us", "t_host_us", "t_serial_us", "tau", "tpot_us"):
        out[k] = rr.get(k)
    fit = res.get("launch_fit") or {}
    out["kappa_us_per_node"] = fit.get("kappa_us_per_node")
    syncs = res.get("blocking_syncs") or []
    out["blocked_us"] = float(sum(s.get("blocked_us") or 0 for s in syncs))
    out["idle_after_us"] = float(sum(s.get("idle_after_us") or 0 for s in syncs))
    return out


def _delta(a: float | None, b: float | None) -> dict[str, float | None]:
    if a is None or b is None:
        return {"a": a, "b": b, "delta": None, "rel": None}
    d = b - a
    return {"a": a, "b": b, "delta": d, "rel": (d / a) if a else (0.0 if d == 0 else None)}


def _one_per_chain(rows: list[dict], self_us: dict[str, float]) -> list[dict]:
    """Frames with the same idle in A and in B (a chain of callers around one loop: ``engine.py: generate``,
    ``engine.py: step``, the ``round`` range) as one row: the frame with the most self idle in A and B (then the
    first by name), with ``same_idle_frames`` the count of the others; the rows' order is kept."""
    best: dict[tuple[float, float], dict] = {}
    count: dict[tuple[float, float], int] = {}
    for r in rows:
        g = (round(r["a_us"], 3), round(r["b_us"], 3))
        count[g] = count.get(g, 0) + 1
        if g not in best or self_us.get(r["key"], 0.0) > self_us.get(best[g]["key"], 0.0):
            best[g] = r
    out = []
    for r in rows:
        g = (round(r["a_us"], 3), round(r["b_us"], 3))
        if best.get(g) is r:
            out.append(dict(r, same_idle_frames=count[g] - 1))
    return out


def _keyed_diff(a_rows: list[dict], b_rows: list[dict], key, value: str, limit: int = 25) -> dict[str, list]:
    a = {key(r): r.get(value) or 0.0 for r in a_rows}
    b = {key(r): r.get(value) or 0.0 for r in b_rows}
    vanished = [{"key": k, "a_us": a[k], "b_us": 0.0, "delta_us": -a[k]} for k in a.keys() - b.keys()]
    appeared = [{"key": k, "a_us": 0.0, "b_us": b[k], "delta_us": b[k]} for k in b.keys() - a.keys()]
    changed = [{"key": k, "a_us": a[k], "b_us": b[k], "delta_us": b[k] - a[k]} for k in a.keys() & b.keys()
               if b[k] != a[k]]  # an unchanged frame is not a change
    # largest change first; ties by key, so the order never depends on set iteration (the hash seed)
    srt = lambda rows: sorted(rows, key=lambda r: (-abs(r["delta_us"]), str(r["key"])))[:limit]  # noqa: E731
    # (limit None: all of them)
    return {"vanished": srt(vanished), "appeared": srt(appeared), "changed": srt(changed)}


_LINE_RE = re.compile(r"\(\d+\)(?=: )")
_STEP_RE = re.compile(r"#\d+$")


def _frame_key(frame: str) -> str:
    """A frame as matched across two traces: without its line number ("engine.py(121): generate" ->
    "engine.py: generate"; an edit above a function must not make it "vanish") and without a step counter
    ("ProfilerStep#12" -> "ProfilerStep")."""
    return _STEP_RE.sub("", _LINE_RE.sub("", frame))


def diff_analyses(a: dict, b: dict) -> dict[str, Any]:
    """Compare analysis ``a`` (baseline) with ``b`` (candidate); see the module docstring for the fields."""
    sa, sb = _scalars(a), _scalars(b)
    metrics = {m: _delta(sa[m], sb[m]) for m in METRICS}
    # the program's wrapper frames (runpy, click, thread bootstrap, <module>) with no self idle folded, as analyze
    # folds them: their inclusive idle is everyone's and would fill the table with one number
    fa, _ = frame_table(a.get("gap_attribution") or [], "inclusive")
    fb, _ = frame_table(b.get("gap_attribution") or [], "inclusive")
    frames = _keyed_diff(fa, fb, lambda r: _frame_key(r["frame"]), "inclusive_idle_us", limit=None)
    self_us: dict[str, float] = {}
    for r in fa + fb:
        k = _frame_key(r["frame"])
        self_us[k] = self_us.get(k, 0.0) + float(r.get("self_idle_us") or 0.0)
    for kind, part in frames.items():
        frames[kind] = _one_per_chain(part, self_us)[:25]
        for r in frames[kind]:
            r["frame"] = r.pop("key")
    syncs = _keyed_diff(a.get("blocking_syncs") or [], b.get("blocking_syncs") or [],
                        lambda r: f"{r.get('call')} ({r.get('aten_op') or '-'}) from {_frame_key(r.get('site') or '-')}",
                        "blocked_us")
    for part in syncs.values():
        for r in part:
            r["site"] = r.pop("key")
    bubbles = None  # neither trace has bubbles between graph nodes: no section
    if a.get("node_bubbles") or b.get("node_bubbles"):
        bubbles = _keyed_diff(a.get("node_bubbles") or [], b.get("node_bubbles") or [],
                              lambda r: (str(r.get("before")), str(r.get("after"))), "idle_us")
    for part in (bubbles or {}).values():
        for r in part:
            r["before"], r["after"] = r.pop("key")
            r["pair"] = f"{r['before']} -> {r['after']}"
    accept = None
    ta, tb, ra, rb = sa["tau"], sb["tau"], sa["t_round_us"], sb["t_round_us"]
    if ta and tb and ra and rb:
        round_saving = (ra - rb) / ra   # fraction of the round B saves
        tau_loss = (ta - tb) / ta       # fraction of accept length B gives up
        tpot_ratio = (rb / tb) / (ra / ta)
        verdict = "B wins" if tpot_ratio < 1 else ("neither wins: the same TPOT" if tpot_ratio == 1 else "B loses")
        accept = {
            "round_saving": round_saving, "tau_loss": tau_loss, "tpot_ratio": tpot_ratio,
            "wins": tpot_ratio < 1.0,
            "statement": (f"B {'saves' if round_saving >= 0 else 'adds'} {abs(round_saving):.1%} of Tround and "
                          f"{'gives up' if tau_loss >= 0 else 'gains'} {abs(tau_loss):.1%} of τ: "
                          f"TPOT changes by {tpot_ratio - 1:+.1%}, so {verdict} "
                          "(TPOT = Tround/τ; a change wins only if its round saving exceeds its τ loss)"),
        }
    return {"a": a.get("trace"), "b": b.get("trace"), "metrics": metrics, "frames": frames, "syncs": syncs,
            "bubbles": bubbles, "accept_length": accept, "whatif": _whatif_diff(a, b),
            "warnings": _window_warnings(a, b)}


def _whatif_diff(a: dict, b: dict) -> dict[str, Any] | None:
    """Predicted (the replay model, each analysis' ``whatif``) against measured (the sidecars' unprofiled rounds)
    change of the unprofiled round from A to B; None when neither analysis has a predicted round."""
    wa, wb = a.get("whatif") or {}, b.get("whatif") or {}
    pa, pb = wa.get("predicted_unprofiled_round_us"), wb.get("predicted_unprofiled_round_us")
    if pa is None and pb is None:
        return None
    ma, mb = wa.get("measured_unprofiled_round_us"), wb.get("measured_unprofiled_round_us")
    # figures of different rounds (the profiled rounds' positions against warm-up rounds) are not compared: their
    # difference holds the rounds' own (a round's device time steps with the context, DESIGN.md 5.3)
    src_a, src_b = wa.get("measured_source"), wb.get("measured_source")
    unlike = ma is not None and mb is not None and src_a != src_b
    pred, meas = _delta(pa, pb), _delta(*((None, None) if unlike else (ma, mb)))
    out = {"predicted_a_us": pa, "predicted_b_us": pb, "predicted_delta_us": pred["delta"],
           "predicted_rel": pred["rel"], "measured_a_us": ma, "measured_b_us": mb,
           "measured_delta_us": meas["delta"], "measured_rel": meas["rel"], "measured_source_a": src_a,
           "measured_source_b": src_b,
           # each side's calibration: without --calibration, the shipped one of its trace's GPU (they may differ)
           "calibration_a": (wa.get("calibration") or {}).get("source"),
           "calibration_b": (wb.get("calibration") or {}).get("source")}
    if pred["delta"] is None:
        text = "the replay model predicts only one side's unprofiled round (the other has no rounds)"
    else:
        text = (f"the replay model predicts the unprofiled round changes by {pred['delta'] / 1000:+.3f} ms "
                f"({pa / 1000:.3f} -> {pb / 1000:.3f} ms)")
        if meas["delta"] is not None:
            text += (f"; the sidecars measured {meas['delta'] / 1000:+.3f} ms ({ma / 1000:.3f} -> {mb / 1000:.3f} ms), "
                     f"a prediction error of {round((pred['delta'] - meas['delta']) / 1000, 3) + 0.0:+.3f} ms")
        elif unlike:
            text += (f"; the sidecars measured different rounds (A: {src_a or 'unknown'}, B: {src_b or 'unknown'}), "
                     "not compared")
        else:
            text += "; no measured unprofiled round in both sidecars to check it against"
    ca, cb = out["calibration_a"], out["calibration_b"]
    if ca or cb:
        text += (f"; calibration {os.path.basename(ca or '?')}" if ca == cb else
                 f"; calibrations A {os.path.basename(ca or '?')}, B {os.path.basename(cb or '?')} (other GPU "
                 "models: the predictions use different profiler costs)")
    out["statement"] = text
    return out


def _window_warnings(a: dict, b: dict) -> list[str]:
    """One line when A and B were analysed over different windows (``window`` / ``window_source`` of
    :func:`gaptrace.analyses.summary.run_analysis`), else none."""
    def span(r: dict) -> str:
        w = r.get("window")
        if w is None:
            return "its whole trace (first to last device activity)"
        how = "its capture sidecar's analysis_window" if r.get("window_source") == "sidecar" else "the annotation"
        return f"{how} {w!r}"

    if a.get("window") == b.get("window"):
        return []
    return [f"A is analysed over {span(a)}, B over {span(b)}: the windows differ, so occupancy, idle and the "
            "rounds compare different spans (--window NAME analyses the same annotation in both)"]


def parse_gate(expr: str) -> tuple[str, str, float]:
    """``"occupancy < 0.9"`` -> ("occupancy", "<", 0.9). GateError for anything else, and for an expression of
    more than ``MAX_GATE_CHARS`` characters (checked before any pattern runs)."""
    if len(expr) > MAX_GATE_CHARS:
        raise GateError(f"gate {expr[:40]!r}… is {len(expr):,} characters long (at most {MAX_GATE_CHARS}): "
                        "expected METRIC OP NUMBER, e.g. 'occupancy < 0.9'")
    m = _GATE_RE.fullmatch(expr)
    if not m:
        raise GateError(f"cannot parse gate {expr!r}: expected METRIC OP NUMBER, e.g. 'occupancy < 0.9'")
    name, op, num = m.group(1), m.group(2), float(m.group(3))
    if not math.isfinite(num):  # 1e999 overflows to inf: refused like the word inf
        raise GateError(f"gate {expr!r}: the number must be finite")
    base = re.sub(r"^(delta|rel)_", "", name)
    if base not in METRICS:
        raise GateError(f"unknown metric {name!r} in gate {expr!r}; metrics: {', '.join(METRICS)} "
                        "(or delta_NAME, rel_NAME)")
    return name, op, num


def check_gates(diff: dict, exprs: list[str]) -> list[dict]:
    """Evaluate gates against a :func:`diff_analyses` result. Returns [{gate, value, tripped}]; a gate whose
    metric is missing (e.g. no rounds in the trace) trips, with value None, so CI never passes silently."""
    out = []
    for expr in exprs:
        name, op, num = parse_gate(expr)
        if name.startswith("delta_"):
            v = diff["metrics"][name[6:]]["delta"]
        elif name.startswith("rel_"):
            v = diff["metrics"][name[4:]]["rel"]
        else:
            v = diff["metrics"][name]["b"]
        tripped = True if v is None else bool(_OPS[op](v, num))
        out.append({"gate": expr, "value": v, "tripped": tripped})
    return out
