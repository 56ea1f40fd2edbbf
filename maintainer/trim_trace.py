"""Cut a Kineto trace (and its gaptrace sidecar) to a time window of whole profiled rounds, so a fixture stays small.

    python maintainer/trim_trace.py IN.json.gz OUT.json.gz --rounds 0:2
    python maintainer/trim_trace.py IN.json.gz OUT.json.gz --end-at 'runtime/cache/window.py(12): window_start:6'
    python maintainer/trim_trace.py IN.trace.json.gz OUT.trace.json.gz --rounds 0:2 --round-name step

``--rounds A:B`` keeps the profiled rounds A..B (0-based, both included, in time order of the host's ``round``
annotations): the window runs from the start of the profiler step holding round A to the end of the step holding
round B. ``--round-name NAME`` takes another host annotation as the round (a training or decode loop's ``step``
range); ``--round-name ProfilerStep`` takes the profiler's own steps (``ProfilerStep#N``), for a loop that marks no
range of its own: a name matches when it equals NAME or is NAME followed by ``#`` and a number. Every event that overlaps the window is kept as it is (a kernel that started inside and ends after it, a
host frame that opened before it), and so is the other end of each kept launch (the kernel of a launch in the window,
the launch of a kernel in it: matched by ``args.correlation``) and the flow arrows between them, so no kept launch
loses its device work and no kept kernel its launch. Metadata (every top-level key, ``ph: M`` events, the device
properties) is kept unchanged.

``--end-at NAME:INDEX`` is for a capture whose one long round (a prefill) is what a test needs: the window starts
with the trace's first profiler step and ends at the host timestamp of the INDEX-th event named NAME (Python
indexing, time order; e.g. the start of the 7th prefill chunk: the first six chunks are kept); host events and GPU
annotations open at that moment (the ``round`` range, its ``ProfilerStep``, the enclosing Python frames) are clipped
to end there, so the round window is the cut, and the rounds after it are dropped. ``--start-at NAME:INDEX`` is the
same from the other side (the window runs from that event to the end of the last profiler step). Say in the
fixture's MANIFEST that the round was cut.

The sidecar (IN.gaptrace.json, when present) is written next to OUT with its per-round fields cut the same way:
``rounds``, ``profiled_step_ms`` (the clipped step's duration under ``--start-at``) and ``active_steps``; ``trace``
names OUT. Unprofiled measurements, graph node counts and the capture config stay (they describe the capture).
Numbers are re-serialised by Python's json (the shortest text that reads back as the same double, so every value the
loader sees is unchanged), without whitespace. Outputs are written to temporary files, then renamed.

Bad input (no round annotations, a range outside them, NAME absent): one line on stderr, exit 2.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import sys
import tempfile

HOST_CATS = {"user_annotation", "python_function", "cpu_op", "cuda_runtime", "cuda_driver", "gpu_user_annotation"}


class TrimError(ValueError):
    pass


def sidecar_path(trace_path: str) -> str:
    """The gaptrace sidecar of a trace: X.json.gz / X.json -> X.gaptrace.json."""
    base = trace_path[:-len(".json.gz")] if trace_path.endswith(".json.gz") else os.path.splitext(trace_path)[0]
    return base + ".gaptrace.json"


def _end(e: dict) -> float:
    return e["ts"] + e.get("dur", 0)


def is_round(e: dict, round_name: str) -> bool:
    """Whether host event ``e`` is a round annotation: a user_annotation named ``round_name``, or ``round_name#N``."""
    if e.get("ph") != "X" or e.get("cat") != "user_annotation":
        return False
    name = str(e.get("name", ""))
    return name == round_name or re.fullmatch(re.escape(round_name) + r"#\d+", name) is not None


def _window_of_rounds(events: list[dict], first: int, last: int, round_name: str = "round"
                      ) -> tuple[float, float, list[int]]:
    """(t0, t1, kept profiler-step indexes) for rounds first..last (rounds: the annotations ``round_name``)."""
    rounds = sorted((e for e in events if is_round(e, round_name)), key=lambda e: e["ts"])
    if not rounds:
        raise TrimError(f"no {round_name!r} annotations in the trace")
    if not 0 <= first <= last < len(rounds):
        raise TrimError(f"rounds {first}:{last} outside the trace's {len(rounds)} rounds (0:{len(rounds) - 1})")
    steps = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"
                    and str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"])

    def step_of(r):
        for i, s in enumerate(steps):
            if s["ts"] <= r["ts"] and _end(r) <= _end(s):
                return i, s
        return None, r

    i0, s0 = step_of(rounds[first])
    i1, s1 = step_of(rounds[last])
    kept = list(range(first, last + 1)) if i0 is None or i1 is None else list(range(i0, i1 + 1))
    return s0["ts"], _end(s1), kept


def trim_events(events: list[dict], t0: float, t1: float, clip_at_t0: bool, clip_at_t1: bool = False) -> list[dict]:
    """The events of the window [t0, t1] plus the correlated partners of kept launches and kernels (see above)."""
    keep = [False] * len(events)
    corr = set()
    for i, e in enumerate(events):
        if e.get("ph") == "M" or "ts" not in e:
            keep[i] = True
        elif e.get("ph") == "X":
            if _end(e) >= t0 and e["ts"] <= t1:
                keep[i] = True
                c = (e.get("args") or {}).get("correlation")
                if c is not None:
                    corr.add(c)
        elif e.get("ph") not in ("s", "f", "t"):
            keep[i] = t0 <= e["ts"] <= t1
    for i, e in enumerate(events):
        if not keep[i] and e.get("ph") == "X" and (e.get("args") or {}).get("correlation") in corr:
            keep[i] = True  # the launch of a kept kernel, or the kernel of a kept launch
        elif e.get("ph") in ("s", "f", "t"):
            keep[i] = e.get("id") in corr if e.get("cat") == "ac2g" else t0 <= e["ts"] <= t1
    out = []
    for k, e in zip(keep, events):
        if not k:
            continue
        if clip_at_t0 and e.get("ph") == "X" and e.get("cat") in HOST_CATS and e["ts"] < t0 < _end(e):
            e = {**e, "ts": t0, "dur": _end(e) - t0}
        if clip_at_t1 and e.get("ph") == "X" and e.get("cat") in HOST_CATS and e["ts"] < t1 < _end(e):
            e = {**e, "dur": t1 - e["ts"]}
        if clip_at_t1 and e.get("ph") == "X" and e.get("cat") in HOST_CATS and e["ts"] >= t1:
            continue  # a host event of the partner pass that starts after the cut: its launch is not in the window
        out.append(e)
    return out


def trim(trace: dict, side: dict | None, rounds: tuple[int, int] | None, start_at: tuple[str, int] | None,
         end_at: tuple[str, int] | None = None, round_name: str = "round"):
    """(trimmed trace, trimmed sidecar or None); TrimError on bad input. ``round_name``: see ``--round-name``."""
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        raise TrimError("no traceEvents list")
    steps = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"
                    and str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"])
    clip_end = False
    if rounds is not None:
        t0, t1, kept_steps = _window_of_rounds(events, *rounds, round_name)
        kept_rounds = list(range(rounds[0], rounds[1] + 1))
        clip = False
    elif end_at is not None:
        name, index = end_at
        marks = sorted(e["ts"] for e in events if e.get("ph") == "X" and e.get("name") == name)
        if not marks:
            raise TrimError(f"no event named {name!r} in the trace")
        try:
            t1 = marks[index]
        except IndexError:
            raise TrimError(f"{name!r} occurs {len(marks)} times; index {index} is outside") from None
        if not steps:
            raise TrimError("no ProfilerStep annotations in the trace")
        t0 = steps[0]["ts"]
        kept_steps = [i for i, s in enumerate(steps) if s["ts"] < t1]
        kept_rounds = list(range(len(kept_steps)))
        clip, clip_end = False, True
    else:
        name, index = start_at
        marks = sorted(e["ts"] for e in events if e.get("ph") == "X" and e.get("name") == name)
        if not marks:
            raise TrimError(f"no event named {name!r} in the trace")
        try:
            t0 = marks[index]
        except IndexError:
            raise TrimError(f"{name!r} occurs {len(marks)} times; index {index} is outside") from None
        if not steps:
            raise TrimError("no ProfilerStep annotations in the trace")
        t1 = _end(steps[-1])
        kept_steps = [i for i, s in enumerate(steps) if _end(s) > t0]
        n_rounds = len(side["rounds"]) if side and isinstance(side.get("rounds"), list) else 0
        kept_rounds = list(range(n_rounds - len(kept_steps), n_rounds))
        clip = True
    new_events = trim_events(events, t0, t1, clip, clip_end)
    out = {k: v for k, v in trace.items() if k != "traceEvents"}
    out["traceEvents"] = new_events
    if side is None:
        return out, None
    side = dict(side)
    if isinstance(side.get("rounds"), list):
        side["rounds"] = [side["rounds"][i] for i in kept_rounds if 0 <= i < len(side["rounds"])]
    if isinstance(side.get("profiled_step_ms"), list):
        ms = side["profiled_step_ms"]
        kept = [ms[i] for i in kept_steps if 0 <= i < len(ms)]
        if clip and kept:
            first = steps[kept_steps[0]]
            kept[0] = (_end(first) - max(first["ts"], t0)) / 1000.0
        if clip_end and kept:
            last = steps[kept_steps[-1]]
            kept[-1] = (min(_end(last), t1) - last["ts"]) / 1000.0
        side["profiled_step_ms"] = kept
    if isinstance(side.get("active_steps"), int):
        side["active_steps"] = len(kept_steps)
    return out, side


def _write_atomic(path: str, data: bytes) -> None:
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".trim-", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("input")
    ap.add_argument("output")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--rounds", help="A:B, profiled rounds A..B (0-based, inclusive)")
    g.add_argument("--start-at", help="NAME:INDEX, the window starts at that event (the last profiler step ends it)")
    g.add_argument("--end-at", help="NAME:INDEX, the window ends at that event (the first profiler step starts it)")
    ap.add_argument("--round-name", default="round",
                    help="with --rounds: the host annotation marking a round (default: round; ProfilerStep: the "
                         "profiler's steps)")
    a = ap.parse_args(argv)
    try:
        rounds = start_at = end_at = None
        if a.rounds:
            try:
                lo, hi = (int(x) for x in a.rounds.split(":"))
            except ValueError:
                raise TrimError(f"--rounds must be A:B (integers), got {a.rounds!r}") from None
            rounds = (lo, hi)
        else:
            spec = a.start_at or a.end_at
            name, _, idx = spec.rpartition(":")
            try:
                mark = (name, int(idx))
            except ValueError:
                raise TrimError(f"--start-at / --end-at must be NAME:INDEX, got {spec!r}") from None
            start_at, end_at = (mark, None) if a.start_at else (None, mark)
        opener = gzip.open if a.input.endswith(".gz") else open
        try:
            with opener(a.input, "rb") as f:
                trace = json.load(f)
        except (OSError, ValueError) as e:
            raise TrimError(f"{a.input}: not a readable Kineto trace ({str(e).splitlines()[0][:80]})") from None
        side_in = sidecar_path(a.input)
        side = json.load(open(side_in)) if os.path.exists(side_in) else None
        out, side_out = trim(trace, side, rounds, start_at, end_at, a.round_name)
    except TrimError as e:
        print(f"trim_trace: {e}", file=sys.stderr)
        return 2
    text = json.dumps(out, separators=(",", ":")).encode()
    data = gzip.compress(text, 9, mtime=0) if a.output.endswith(".gz") else text
    _write_atomic(a.output, data)
    if side_out is not None:
        side_out["trace"] = os.path.basename(a.output)
        _write_atomic(sidecar_path(a.output), (json.dumps(side_out, indent=1) + "\n").encode())
    n_in, n_out = len(trace["traceEvents"]), len(out["traceEvents"])
    print(f"{a.output}: {n_out} of {n_in} events, {len(data):,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
