"""What fixing each finding buys: the predicted unprofiled µs per round saved by removing its cause, from the
replay model (docs/DESIGN.md "The replay model", "Counterfactuals"; :mod:`.whatif`).

A finding's idle share says how much of the *profiled* idle sat under or after its cause; in a host-bound loop an
early cause is charged the whole run's idle, the profiler inflates host causes, and shares of one idle total
overlap. :func:`rank_findings` adds to each finding of :func:`.findings.findings`:

- ``saving_us``: median unprofiled round before − after removing the cause (:func:`.whatif.whatif` with one
  :class:`.whatif.Change`): a blocking sync's call site (its host work and its blocking waits), an idle site's host
  frame, a host-bound finding's NVTX range (its host work). None where the finding has no removable cause (the
  profiler's own cost, lazy loading, a sync with no Python frame), whose site encloses most of the rounds (the
  loop's own frame: ``saving_note`` says so), or when the model has no rounds;
- ``one_off_saving_us``: what the sum over the rounds saves beyond rounds × saving_us (a compile paid once);
- ``saving_with_device_us``, ``saving_with_device_share`` and ``device_items_per_round``: where the cause launches device work inside the rounds
  (eager kernels, copies and memsets from calls inside its site; graph replays stay), the saving when that work goes too
  (:class:`.whatif.Change` ``with_device``: the upper figure when a fix drops or fuses the work instead of moving
  it off the host; docs/DESIGN.md "Counterfactuals"); None without such work;
- ``saving_graphed_us``: for such a cause, the saving when its work is captured in one CUDA graph instead
  (:class:`.whatif.Change` ``graph``: host work and launches become one graph launch, the device work stays, back
  to back), and its share ``saving_graphed_share``; None where the site holds a call that blocks the host (no graph
  can capture it: ``fix`` then leaves the graph out of its advice);
- ``saving_share``: saving_us / the predicted unprofiled round;
- ``cause`` (the site removed) and ``fix`` (what that removal means, in words);

and sorts them by :func:`rank_saving_us` (the larger of saving_us and saving_with_device_us, descending, in steps
of FOLD_SHARE of the round: savings closer than that keep their idle-share order; None after, in their idle-share
order). :func:`whatif_block` is the
``whatif`` object of ``analyze --json``; :func:`saving_headline` the headline sentence.

The baseline replay (:class:`.whatif.Context`) is built once; each cause is one more replay on it.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from gaptrace.trace import Trace, TraceError

from .allocator import FREE_CALLS
from .findings import ms_text
from .profiler_cost import Calibration, load_calibration, shipped_calibration_path, measured_period_source
from .syncs import api_base_name
from .whatif import (BODY_START_SHARE, Change, Context, GraphBlocked, SiteRefused, device_items_launched, loop_body,
                     other_thread_intervals, site_intervals, whatif)

__all__ = ["build_context", "whatif_block", "rank_findings", "rank_saving_us", "saving_headline", "saving_text",
           "finding_cause",
           "resolve_calibration", "FOLD_SHARE"]

# A fix that saves less than this share of the predicted unprofiled round is not stated in the headline.
FOLD_SHARE = 0.01
# A site whose host intervals hold the start of more than this share of the rounds encloses the loop itself (an
# idle site can be the outer frame the host returns to between calls): removing it would remove every round's host
# work, which is no fix of anything; such a finding carries no saving. (A blocking call's site may cover most of
# the span, waiting, and still be a cause: it holds no round start.)
ENCLOSING_SHARE = BODY_START_SHARE  # one figure for "the loop body" in whatif and here


def resolve_calibration(calibration: Calibration | str | None, trace: Trace | None = None,
                        device: int | None = None) -> Calibration | None:
    """A :class:`.profiler_cost.Calibration` as given, else the one in the file; None: the shipped calibration of
    ``trace``'s GPU (:func:`.profiler_cost.shipped_calibration_path`, on ``device``, default the trace's first
    device), or None without a trace (the replay context picks it once the trace is read). ValueError (one line) for
    a file that cannot be used (:func:`.profiler_cost.load_calibration`)."""
    if isinstance(calibration, Calibration):
        return calibration
    if calibration is not None:
        return load_calibration(calibration)
    if trace is None:
        return None
    return load_calibration(shipped_calibration_path(trace.device_name(device if device is not None else 0)))


def build_context(trace: Trace, sidecar: Any, calibration: Calibration | str | None, device: Any,
                  round_name: str) -> tuple[Context | None, str | None]:
    """The replay context of ``trace`` (:class:`.whatif.Context`: model, rounds, unprofiled baseline, built once),
    or (None, the one-line reason) when the model cannot be built (no rounds on the launching thread, ...).
    ``calibration``: a :class:`.profiler_cost.Calibration`, a file path or None (the shipped default); a bad file
    raises ValueError (one line)."""
    cal = resolve_calibration(calibration)  # None: the context picks the shipped one of the trace's GPU
    try:
        return Context(trace, sidecar, cal, device=device, round_name=round_name), None
    except TraceError as e:
        return None, str(e)


def whatif_block(trace: Trace, ctx: Context | None, calibration: Calibration | str | None,
                 sidecar: Any) -> dict[str, Any]:
    """The ``whatif`` object of ``analyze --json``: {profiled_round_us (median measured period of the rounds),
    predicted_unprofiled_round_us (median replayed period with the profiler's cost taken out),
    replayed_round_us, measured_unprofiled_round_us (:func:`.profiler_cost.measured_period_us`: the median of the
    sidecar's ``unprofiled_same_rounds_ms``, else ``unprofiled_round_ms``, else ``unprofiled_step_ms`` (a
    :class:`gaptrace.capture.Capture` sidecar), × 1000, or None), measured_source (which of them:
    :func:`.profiler_cost.measured_period_source`),
    rounds, calibration (source, measured_on and the per-event costs), fitted_to_unprofiled (whether the profiler's
    per-event costs were scaled to reproduce the sidecar's measured unprofiled rounds: then the prediction matches
    them by construction), profiler_cost_fit ("fitted" | "set_aside": no scale in the bounds reaches them and the
    calibration as it is misses them, which is then used (the measured rounds are not like the profiled ones) |
    "unmatched": the round jumps across them with the scale, the closest is kept | "none"; DESIGN.md 5.3), profiler_cost_scale (that scale α), unfitted_round_us (the prediction with the
    calibration alone: the figure whose error DESIGN.md "Error figures" states)}; the round fields None without
    ``ctx``."""
    cal = resolve_calibration(calibration, trace) if ctx is None else ctx.calibration
    from .whatif import _measured_period_us

    meas_us = _measured_period_us(sidecar)
    out = {"profiled_round_us": None, "predicted_unprofiled_round_us": None, "replayed_round_us": None,
           "measured_unprofiled_round_us": meas_us, "measured_source": measured_period_source(sidecar),
           "rounds": None,
           "fitted_to_unprofiled": None, "profiler_cost_fit": None, "profiler_cost_scale": None,
           "unfitted_round_us": None,
           "calibration": (ctx.calibration if ctx is not None else cal).to_dict()}
    if ctx is None:
        return out
    d = whatif(trace, [], context=ctx).data
    out.update(profiled_round_us=d["profiled_round_us"], predicted_unprofiled_round_us=d["before_round_us"],
               replayed_round_us=d["replayed_round_us"], rounds=d["rounds"],
               fitted_to_unprofiled=d["fitted_to_unprofiled"], profiler_cost_fit=d["profiler_cost_fit"],
               profiler_cost_scale=d["profiler_cost_scale"],
               unfitted_round_us=d["unfitted_round_us"])
    return out


def finding_cause(f: dict) -> str | None:
    """The site whose removal is a finding's fix: a blocking sync's or idle site's host frame, a host-bound
    finding's NVTX range; None for the profiler's own cost, lazy loading, or a sync without a Python frame."""
    kind = f.get("kind")
    if kind in ("blocking_sync", "idle_site"):
        site = f.get("site")
        return site if site and not str(site).startswith("(") else None
    if kind in ("host_bound", "host_range"):
        return f.get("range") or None
    if kind == "thread_wait":  # the wait frame: removing it is the other thread's result being ready when asked
        return f.get("site") or None
    if kind == "allocator_churn":  # the driver's allocation calls (with the frees: ``causes``, removed together)
        return f.get("site") or None
    return None


def finding_fix(f: dict, site: str | None, graphable: bool = True) -> str | None:
    """The fix a finding's saving assumes, in words (what :func:`.whatif.whatif` removes); None without a cause.
    ``graphable`` False: the site holds a blocking call, so the generic advice leaves out the CUDA graph."""
    if site is None:
        return None
    kind = f.get("kind")
    if kind == "blocking_sync":
        op = f" ({f['aten_op']})" if f.get("aten_op") else ""
        return (f"stop blocking on {f.get('call')}{op} in {site}: keep the value on the device, or read it a round "
                "late (an overlapped scheduler), and drop the host work around the read")
    if kind == "host_bound":
        return f"cut the host work of range {site}: the GPU waits for it every round"
    if kind == "host_range":
        return (f"cut the host work of range {site}, or move it off the critical path (run it while the device "
                "works, or on the device): the GPU waits while it runs")
    if kind == "allocator_churn":
        where = f" (the frees are called from {f['caller']})" if f.get("caller") else ""
        return ("keep the caching allocator's segments: take torch.cuda.empty_cache() (or whatever returns the "
                f"memory) out of the loop{where} and keep tensor shapes static, so no step calls "
                f"{' or '.join(f.get('causes') or [site])}")
    if kind == "thread_wait":
        from .findings import WAIT_FIX

        return WAIT_FIX + (f" (the wait in {f['caller']})" if f.get("caller") else "")
    if not graphable:
        return (f"take the host work in {site} off the critical path: run it ahead of the device (a graph cannot "
                "capture its blocking call), or make it cheaper")
    return (f"take the host work in {site} off the critical path: move it into the CUDA graph, run it ahead of "
            "the device, or make it cheaper")


def rank_findings(trace: Trace, found: list[dict], ctx: Context | None, block: dict | None = None) -> list[dict]:
    """``found`` (:func:`.findings.findings`) with ``cause``, ``saving_us``, ``one_off_saving_us`` and
    ``saving_share`` added (module docstring), sorted by saving_us descending, None after (stable: ties and None
    keep their idle-share order). Each distinct site is replayed once. Without ``ctx`` every saving is None.
    ``block`` (:func:`whatif_block`): the profiler's own findings (profiler_inflation, profiler_overhead) are no
    fix; their summary states the predicted unprofiled round instead."""
    base = None
    if ctx is not None:
        base = float(np.median(ctx.periods(ctx.base)))
    pred = (block or {}).get("predicted_unprofiled_round_us")
    for f in found:
        if f.get("kind") in ("profiler_inflation", "profiler_overhead") and pred is not None:
            f["summary"] += (f"; the profiler's own cost is no fix: without it the round is predicted to take "
                             f"{ms_text(pred)} (profiled {ms_text(block['profiled_round_us'])})")
    memo: dict[str, dict | str | None] = {}
    for f in found:
        site = finding_cause(f)
        f["cause"] = site
        f["fix"] = finding_fix(f, site)
        f["saving_us"] = f["one_off_saving_us"] = f["saving_share"] = None
        f["saving_with_device_us"] = f["device_items_per_round"] = f["saving_with_device_share"] = None
        if ctx is None or site is None:
            continue
        causes = tuple(f.get("causes") or ())
        w = _replay_site(trace, ctx, causes if len(causes) > 1 else site, memo)
        if w == "encloses" and f.get("kind") == "blocking_sync" and f.get("aten_op"):
            # the blocking call sits in the loop's own body (a step() that reads a value back inline): the fix is
            # the read itself, so the cause removed is the ATen op's calls (their wait and host work)
            op = str(f["aten_op"])
            w2 = _replay_site(trace, ctx, op, memo)
            if isinstance(w2, dict):
                f["cause"], w = op, w2
                f["fix"] = (f"stop blocking on {f.get('call')} ({op}) in {site}, the loop's own body: keep the "
                            "value on the device, or copy it to pinned memory non-blocking and read it a step late")
        if (w == "encloses" and f.get("kind") == "blocking_sync"
                and api_base_name(str(f.get("call") or "")) in FREE_CALLS):
            # a device memory free in the loop's own body (a cudaFree under torch.cuda.empty_cache() called from
            # step()): the cause removed is the frees themselves, their wait and host time (every free of the launching
            # thread: the runtime-call site of whatif)
            w2 = _replay_site(trace, ctx, str(f["call"]), memo)
            if isinstance(w2, dict):
                f["cause"], w = str(f["call"]), w2
                f["fix"] = (f"stop calling {f['call']} in {site}, the loop's own body"
                            + (" (the allocator churn finding's fix)" if any(
                                g.get("kind") == "allocator_churn" and f["call"] in (g.get("causes") or ())
                                for g in found) else ""))
        if w == "encloses":
            f["saving_note"] = (f"no saving: {site} holds the start of most rounds or of a range that fills them (it "
                                "encloses the loop itself; not a cause)")
            continue
        if w is None:
            f["saving_note"] = f"no saving: {site} is not on the launching thread inside the rounds"
            continue
        f["saving_us"] = float(w["saving_us"])
        f["one_off_saving_us"] = float(w["one_off_saving_us"])
        f["saving_share"] = f["saving_us"] / base if base and base > 0 else None
        if w.get("saving_with_device_us") is not None:
            f["saving_with_device_us"] = float(w["saving_with_device_us"])
            f["device_items_per_round"] = float(w["device_items_per_round"])
            f["saving_with_device_share"] = f["saving_with_device_us"] / base if base and base > 0 else None
            f["saving_graphed_us"] = w.get("saving_graphed_us")
            f["saving_graphed_share"] = (f["saving_graphed_us"] / base if f["saving_graphed_us"] is not None
                                         and base and base > 0 else None)
            if w.get("graph_refused") and f.get("fix") == finding_fix(f, site):
                f["fix"] = finding_fix(f, site, graphable=False)  # no CUDA graph can capture its blocking call
    _defer_to_nested(trace, ctx, found, memo, base)
    # savings within FOLD_SHARE of the round of each other are one rank: they keep their idle-share order (two frames
    # of one cause, e.g. a blocking read and the function around it, save the same within the model's error)
    step = FOLD_SHARE * base if base and base > 0 else 1.0
    order = sorted(range(len(found)), key=lambda i: (found[i]["saving_us"] is None,
                                                      -round(rank_saving_us(found[i]) / step), i))
    return [found[i] for i in order]


def _replay_site(trace: Trace, ctx: Context, site: str | tuple[str, ...], memo: dict) -> dict | str | None:
    """The replay with ``site`` removed (memoised by site): the whatif data dict (with the with-device figures
    when it launches device work), "encloses" when the site is the loop body around the round
    (:func:`.whatif.loop_body`), None when the site is not on the launching thread. A tuple of sites is one cause
    that shows as several call names, removed together (the allocator's allocations and frees): None when one of
    them is not on the launching thread; a loop body is looked for only for a single site."""
    if site in memo:
        return memo[site]
    sites = (site,) if isinstance(site, str) else tuple(site)
    try:
        lb = loop_body(trace, ctx, sites[0]) if len(sites) == 1 else None
        if lb is not None and lb.body:
            memo[site] = "encloses"
            return memo[site]
        if lb is None and len(sites) == 1:
            # on another thread: what the launching thread waited on it (whatif.other_thread_intervals)
            other_thread_intervals(trace, ctx.model, sites[0], ctx.window)
            memo[site] = whatif(trace, [Change(sites[0])], context=ctx).data
            return memo[site]
        w = whatif(trace, [Change(x) for x in sites], context=ctx).data
        n_items = sum(device_items_launched(trace, ctx.model, x, ctx.window)[0] for x in sites)
        if n_items:
            wd = whatif(trace, [Change(x, with_device=True) for x in sites], context=ctx).data
            w = dict(w, saving_with_device_us=wd["saving_us"],
                     # the window holds len(starts) rounds (first start to the last round's end), not periods
                     device_items_per_round=n_items / max(len(ctx.starts), 1))
            try:  # the same work captured in one CUDA graph: none where the site holds a blocking call
                w["saving_graphed_us"] = whatif(trace, [Change(x, graph=True) for x in sites], context=ctx
                                                ).data["saving_us"]
            except GraphBlocked:
                w["saving_graphed_us"], w["graph_refused"] = None, True
            except SiteRefused:
                w["saving_graphed_us"] = None
        memo[site] = w
    except TraceError:
        memo[site] = None
    return memo[site]


# _defer_to_nested: a range around a nested cause whose saving is at most this ratio of that cause's (+ slack) marks it
MARKER_SAVING_RATIO = 1.25
MARKER_SAVING_SLACK_US = 10.0


def _overlap_us(gs: np.ndarray, ge: np.ndarray, us: np.ndarray, ue: np.ndarray) -> float:
    """µs of the intervals [gs, ge) inside the merged, sorted intervals [us, ue) (both (n,) µs, one clock)."""
    inside = 0.0
    for a, b in zip(gs, ge):
        j0, j1 = np.searchsorted(ue, a, side="right"), np.searchsorted(us, b, side="left")
        if j1 > j0:
            inside += float((np.minimum(ue[j0:j1], b) - np.maximum(us[j0:j1], a)).clip(min=0).sum())
    return inside


def _defer_to_nested(trace: Trace, ctx: Context | None, found: list[dict], memo: dict | None = None,
                     base: float | None = None) -> None:
    """A cause whose host intervals cover more than ENCLOSING_SHARE of the rounds' window and hold another
    finding's cause (at least 90% of that cause's host time inside them) is the loop body around that cause (a
    ``step()`` that reads a value back inline), not a cause of its own: its saving is dropped (``saving_note``
    names the nested cause); a blocking sync's then goes to its ATen op's calls (their wait and host work), as
    when the site encloses the rounds. In place; ``memo`` and ``base`` as :func:`rank_findings` has
    them."""
    if ctx is None:
        return
    lo, hi = ctx.window
    span = hi - lo
    with_saving = [f for f in found if f.get("saving_us") is not None and f.get("cause")]
    if span <= 0 or len(with_saving) < 2:
        return
    iv: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def intervals(c: str) -> tuple[np.ndarray, np.ndarray]:
        # looked up as needed: a cause deferred below is renamed to its ATen op, which another pass then meets
        if c not in iv:
            try:
                iv[c] = site_intervals(trace, ctx.model, c, ctx.window)
            except TraceError:
                iv[c] = (np.empty(0), np.empty(0))
        return iv[c]

    for f in with_saving:
        us, ue = intervals(f["cause"])
        if float((ue - us).sum()) <= ENCLOSING_SHARE * span:
            continue
        for g in with_saving:
            if g is f or g["cause"] == f["cause"]:
                continue
            gs, ge = intervals(g["cause"])
            total = float((ge - gs).sum())
            if total <= 0:
                continue
            inside = _overlap_us(gs, ge, us, ue)
            # two causes that hold each other (a range around one blocking call and that call) are one window named
            # twice: neither is the loop body around the other
            mutual = _overlap_us(us, ue, gs, ge) >= 0.9 * float((ue - us).sum())
            # an NVTX range that buys no more than the cause it holds is a marker around that cause (a user's range
            # around one read-back), not the loop body: removing a body would buy far more than its nested cause
            marker = (f.get("kind") == "host_range"
                      and f["saving_us"] <= MARKER_SAVING_RATIO * g["saving_us"] + MARKER_SAVING_SLACK_US)
            if inside >= 0.9 * total and not mutual and not marker:
                for k in ("saving_us", "one_off_saving_us", "saving_share", "saving_with_device_us",
                          "device_items_per_round", "saving_with_device_share", "saving_graphed_us",
                          "saving_graphed_share"):
                    f[k] = None
                op = f.get("aten_op")
                w = (_replay_site(trace, ctx, str(op), memo if memo is not None else {})
                     if f.get("kind") == "blocking_sync" and op and f["cause"] == f.get("site") else None)
                if isinstance(w, dict):
                    f["cause"] = str(op)
                    f["fix"] = (f"stop blocking on {f.get('call')} ({op}) in {f.get('site')}, the loop's own body: "
                                "keep the value on the device, or copy it to pinned memory non-blocking and read it "
                                "a step late")
                    f["saving_us"] = float(w["saving_us"])
                    f["one_off_saving_us"] = float(w["one_off_saving_us"])
                    f["saving_share"] = f["saving_us"] / base if base and base > 0 else None
                else:
                    f["saving_note"] = (f"no saving of its own: {f['cause']} spans most of the rounds and holds the "
                                        f"cause of another finding ({g['cause']}): it is the loop body around it")
                break


def rank_saving_us(f: dict) -> float:
    """The figure findings are ranked by: the larger of ``saving_us`` and ``saving_with_device_us`` (what removing
    the cause can buy: its host work alone, or with the eager device work it launches); 0 without a saving."""
    return max(f.get("saving_us") or 0.0, f.get("saving_with_device_us") or 0.0)


def _what(f: dict) -> str:
    """The cause in words, for the headline."""
    if f["kind"] == "blocking_sync" and f["cause"] != f.get("site"):
        return f"the blocking {f.get('call')} ({f['cause']}) in {f.get('site')} (its wait and host work)"
    if f["kind"] == "blocking_sync":
        op = f" ({f['aten_op']})" if f.get("aten_op") else ""
        return f"the blocking {f.get('call')}{op} in {f['cause']} (its wait and host work)"
    if f["kind"] in ("host_bound", "host_range"):
        return f"the host work of range {f['cause']}"
    if f["kind"] == "thread_wait":
        return f"the wait on another thread in {f.get('caller') or f['cause']} ({f['cause']})"
    if f["kind"] == "allocator_churn":
        return f"the allocator's driver calls ({', '.join(f.get('causes') or [f['cause']])}: their host time and waits)"

    where = f", range {f['range']}" if f.get("range") else ""
    return f"the host work in {f['cause']}{where}"


def saving_text(f: dict) -> str:
    """"saves ≈ 0.42 ms a round (11%)" for a finding with a saving; "saves < 1% of a round (12 µs)" below the
    fold; "saves nothing (...)" for a negative one (the replay's error, docs/DESIGN.md "Error figures");
    the one-off saving after it from 1 ms up; "" without a saving."""
    s, share = f.get("saving_us"), f.get("saving_share")
    if s is None:
        return ""
    one = f.get("one_off_saving_us")
    extra = f"; once: {ms_text(one)}" if one is not None and abs(one) >= 1000 else ""
    if share is None or not math.isfinite(share):
        return f"saves ≈ {ms_text(s)} a round{extra}"
    if s < 0:
        return f"saves nothing (the round predicted {ms_text(-s)} longer: within the model's error){extra}"
    if share < FOLD_SHARE:
        return f"saves < 1% of a round ({ms_text(s)}){extra}{_with_device(f)}{_graphed(f)}"
    return f"saves ≈ {ms_text(s)} a round ({share:.0%}){extra}{_with_device(f)}{_graphed(f)}"


def _graphed(f: dict) -> str:
    """"; ≈ 2.48 ms (72%) captured in one CUDA graph" when capturing the cause's work in a graph
    (``saving_graphed_us``, its share ``saving_graphed_share``) saves at least FOLD_SHARE of the round more or less
    than its host-side removal; "" otherwise."""
    s, g = f.get("saving_us"), f.get("saving_graphed_us")
    share, gshare = f.get("saving_share"), f.get("saving_graphed_share")
    if s is None or g is None or share is None or gshare is None or not math.isfinite(gshare):
        return ""
    if abs(gshare - share) < FOLD_SHARE:
        return ""
    return f"; ≈ {ms_text(g)} ({gshare:.0%}) captured in one CUDA graph"


def _with_device(f: dict) -> str:
    """"; ≈ 649 µs (14%) with the 185 eager device ops a round it launches" when dropping the cause's eager device
    work too saves at least FOLD_SHARE of the round more than the host-side removal; "" otherwise."""
    share, wshare = f.get("saving_share"), f.get("saving_with_device_share")
    if share is None or wshare is None or wshare - share < FOLD_SHARE:
        return ""
    n = f.get("device_items_per_round") or 0.0
    return (f"; ≈ {ms_text(f['saving_with_device_us'])} ({wshare:.0%}) with the {n:,.0f} eager device ops a round "
            "it launches")


def saving_headline(found: list[dict], block: dict) -> str | None:
    """The headline sentence on what fixing buys: "removing <cause> saves ≈ X ms a round (Y% of the predicted
    unprofiled round, Z ms)" for the finding that saves most when it saves at least FOLD_SHARE of the round; a
    sentence saying no removable cause does when none does; None without a prediction."""
    pred = block.get("predicted_unprofiled_round_us")
    if pred is None:
        return None
    meas = block.get("measured_unprofiled_round_us")
    if meas is not None and block.get("profiler_cost_fit") == "set_aside":
        # the measured rounds are unlike the profiled ones: the calibration alone predicts; say both
        where = ("its rounds at the profiled positions, unprofiled, are not like the profiled ones"
                 if block.get("measured_source") == "profiled_positions" else
                 "its warm-up rounds are not like the profiled ones")
        round_text = (f"the predicted unprofiled round, {ms_text(pred)} from the calibration alone; the capture's "
                      f"measured {ms_text(meas)} is out of the model's reach ({where}) and was set aside")
    elif meas is not None and block.get("profiler_cost_fit") == "unmatched":
        # no scale reproduces the measured rounds: the prediction does not; say both
        round_text = (f"the predicted unprofiled round, {ms_text(pred)}; measured {ms_text(meas)}: the model could "
                      f"not be fitted to it (profiler cost scale {block.get('profiler_cost_scale'):g}, the closest "
                      "one), so the savings are rough")
    elif meas is not None and block.get("fitted_to_unprofiled"):
        # the profiler's cost is scaled to reproduce the measured rounds: the prediction equals them by construction
        unf = block.get("unfitted_round_us")
        round_text = (f"the unprofiled round, {ms_text(meas)} measured; the model fitted to it"
                      + (f", {ms_text(unf)} from the calibration alone" if unf is not None else ""))
    else:
        round_text = (f"the predicted unprofiled round, {ms_text(pred)}"
                      + (f"; measured {ms_text(meas)}" if meas is not None else ""))
    top = next((f for f in found if f.get("saving_us") is not None), None)
    base = pred if pred else None
    if top is None or (base and rank_saving_us(top) < FOLD_SHARE * base) or (not base and not top.get("saving_share")):
        return (f"no finding's fix is predicted to save 1% of a round ({round_text}): the round is set by the "
                "device work or by causes the findings do not name")
    one = top.get("one_off_saving_us")
    once = f", and {ms_text(one)} once" if one is not None and one >= 1000 else ""
    extra = _with_device(top)
    return (f"removing {_what(top)} saves ≈ {ms_text(top['saving_us'])} a round "
            f"({top['saving_share']:.0%} of {round_text}){extra}{once}")
