"""Plain reference computations for the steps / verdicts tests: stdlib json and Python loops over the raw events,
sharing no code with gaptrace.analyses (only tests/_idle_reference.py's raw reader and brute-force busy spans)."""
from __future__ import annotations

import re
import statistics

from _idle_reference import Busy, raw_events

HOST = {"python_function", "cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "Operator", "Runtime"}
DEVICE = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}


def complete(name: str) -> list[dict]:
    return [e for e in raw_events(name) if e.get("ph") == "X" and "ts" in e and "dur" in e]


def step_intervals(events: list[dict]) -> tuple[str, list[tuple[float, float, str]]]:
    """(rule, [(start, end, tid)]) by the documented rules, written out plainly."""
    ua = [e for e in events if e.get("cat") == "user_annotation"]
    rounds = [e for e in ua if re.fullmatch(r"round(?:[_ #-]?\d+)?", e["name"])]
    if len(rounds) >= 2:
        return "round", sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"]), str(e["tid"])) for e in rounds)
    ps = [e for e in events if e.get("cat") in ("user_annotation", "cpu_op", "Operator")
          and re.fullmatch(r"ProfilerStep#\d+", e["name"])]
    if ps:
        return "profiler_step", sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"]), str(e["tid"])) for e in ps)
    es = [e for e in ua if re.fullmatch(r"step\[[A-Z_]+[^\]]*\]|execute_.*context_.*generation_.*", e["name"])]
    outer = []
    for e in es:  # outermost on its thread
        s, t = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        if not any(o is not e and o["tid"] == e["tid"] and float(o["ts"]) <= s and float(o["ts"]) + float(o["dur"]) >= t
                   and (float(o["ts"]), -float(o["dur"])) < (s, -float(e["dur"])) for o in es):
            outer.append((s, t, str(e["tid"])))
    if outer:
        return "engine_step", sorted(outer)
    return "none", []


def device_busy(events: list[dict], device: int, t0: float, t1: float) -> Busy:
    iv = []
    for e in events:
        if e.get("cat") not in DEVICE:
            continue
        args = e.get("args") or {}
        if int(args.get("device", e.get("pid"))) != device:
            continue
        iv.append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    return Busy(iv, t0, t1)


def busy_in(busy: Busy, s: float, e: float) -> float:
    return (e - s) - busy.idle_between(s, e)


LAUNCH = re.compile(r"^(?:cuda|cu|hip)\w*Launch\w*$")


def eager_launches(events: list[dict], s: float, e: float) -> list[dict]:
    return sorted((x for x in events if x.get("cat") in ("cuda_runtime", "cuda_driver", "Runtime")
                   and LAUNCH.match(x["name"]) and "GraphLaunch" not in x["name"] and s <= float(x["ts"]) < e), key=lambda x: float(x["ts"]))


def launch_paced_length(launches: list[dict], s: float, e: float, gap_us: float = 1000.0) -> float:
    """Length of the union of each launch call and, per thread, the stretch to the next launch when it starts less
    than gap_us later, clipped to [s, e]."""
    iv = []
    by_tid: dict[str, list[dict]] = {}
    for x in launches:
        by_tid.setdefault(str(x["tid"]), []).append(x)
    for xs in by_tid.values():
        for a, b in zip(xs, xs[1:] + [None]):
            iv.append((float(a["ts"]), float(a["ts"]) + float(a["dur"])))
            if b is not None and float(b["ts"]) - float(a["ts"]) < gap_us:
                iv.append((float(a["ts"]), float(b["ts"])))
    total, cur_s, cur_e = 0.0, None, None
    for a, b in sorted((max(a, s), min(b, e)) for a, b in iv if min(b, e) > max(a, s)):
        if cur_e is None or a > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = a, b
        else:
            cur_e = max(cur_e, b)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def median_launch_lag(events: list[dict], device: int, s: float, e: float) -> float:
    """Median over launch calls starting in [s, e] (eager and graph) of first device start − call end."""
    first: dict[int, float] = {}
    for x in events:
        if x.get("cat") in DEVICE:
            args = x.get("args") or {}
            if int(args.get("device", x.get("pid"))) != device or args.get("correlation") is None:
                continue
            c = int(args["correlation"])
            first[c] = min(first.get(c, float("inf")), float(x["ts"]))
    lags = []
    for x in events:
        if x.get("cat") in ("cuda_runtime", "cuda_driver", "Runtime") and LAUNCH.match(x["name"]) \
                and s <= float(x["ts"]) < e:
            c = (x.get("args") or {}).get("correlation")
            if c is not None and int(c) in first:
                lags.append(first[int(c)] - (float(x["ts"]) + float(x["dur"])))
    return statistics.median(lags)


def device_side_idle(events: list[dict], busy: Busy, device: int, s: float, e: float) -> float:
    """Idle in [s, e] inside gaps whose ending activity was launched by a call that had ended when the gap began."""
    launch_end: dict[int, float] = {}
    for x in events:
        if x.get("cat") in ("cuda_runtime", "cuda_driver", "Runtime"):
            c = (x.get("args") or {}).get("correlation")
            if c is not None and int(c) >= 0:
                launch_end[int(c)] = max(launch_end.get(int(c), float("-inf")), float(x["ts"]) + float(x["dur"]))
    starts: dict[float, list[int]] = {}
    for x in events:
        if x.get("cat") in DEVICE:
            args = x.get("args") or {}
            if int(args.get("device", x.get("pid"))) == device:
                starts.setdefault(float(x["ts"]), []).append(int(args.get("correlation", -1)))
    total = 0.0
    for g0, g1 in busy.gaps():
        cs = starts.get(g1)
        if not cs:
            continue
        c = cs[0]
        if c in launch_end and launch_end[c] <= g0:
            total += max(0.0, min(g1, e) - max(g0, s))
    return total


def host_wait_gaps(events: list[dict], device: int) -> list[tuple[float, float]]:
    """The idle gaps of ``device`` over its first to last activity that are host wait: every gap but those whose
    ending activity was launched by a call that had ended when the gap began (device-side, as device_side_idle)."""
    dev = [x for x in events if x.get("cat") in DEVICE
           and int((x.get("args") or {}).get("device", x.get("pid"))) == device]
    t0 = min(float(x["ts"]) for x in dev)
    t1 = max(float(x["ts"]) + float(x["dur"]) for x in dev)
    busy = Busy([(float(x["ts"]), float(x["ts"]) + float(x["dur"])) for x in dev], t0, t1)
    launch_end: dict[int, float] = {}
    for x in events:
        if x.get("cat") in ("cuda_runtime", "cuda_driver", "Runtime"):
            c = (x.get("args") or {}).get("correlation")
            if c is not None and int(c) >= 0:
                launch_end[int(c)] = max(launch_end.get(int(c), float("-inf")), float(x["ts"]) + float(x["dur"]))
    starts: dict[float, list[int]] = {}
    for x in dev:
        starts.setdefault(float(x["ts"]), []).append(int((x.get("args") or {}).get("correlation", -1)))
    out = []
    for g0, g1 in busy.gaps():
        cs = starts.get(g1)
        if cs and cs[0] in launch_end and launch_end[cs[0]] <= g0:
            continue
        out.append((g0, g1))
    return out


def idle_under(gaps: list[tuple[float, float]], intervals: list[tuple[float, float]]) -> float:
    """µs of ``gaps`` covered by the union of ``intervals`` (plain sweep over the merged intervals)."""
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    total = 0.0
    for g0, g1 in gaps:
        for a, b in merged:
            total += max(0.0, min(g1, b) - max(g0, a))
    return total


def spans(events: list[dict], pred) -> list[tuple[float, float]]:
    """(start, end) of every complete event for which ``pred(event)`` holds."""
    return [(float(x["ts"]), float(x["ts"]) + float(x["dur"])) for x in events
            if x.get("ph") == "X" and "dur" in x and pred(x)]
