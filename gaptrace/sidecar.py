"""The capture sidecar ``TRACE.gaptrace.json``: where it lives, how it is read and checked, and its typed form.

A capture (:class:`gaptrace.capture.Capture`, ``gaptrace capture``) writes, next to the trace, one JSON object with
what the trace cannot say: the run's ``config``, the accepted tokens τ of every profiled verify round (``rounds``),
the graphs it launched with their node counts and unprofiled launch costs (``graphs``), the unprofiled round
period (``unprofiled_round_ms``, the warm-up rounds; ``unprofiled_same_rounds_ms``, the profiled rounds' own positions
in an unprofiled decode of the same prompts, where the runtime's capture made one) and the annotation that spans
the profiled rounds (``analysis_window``).

The sidecar is optional and untrusted input. :func:`load_sidecar_checked` refuses a file that cannot be one (not a
regular file, over ``SIDECAR_MAX_BYTES``, not JSON, not an object, a bad ``analysis_window``);
:func:`sidecar_field_problems` names the fields the analyses will skip (each skip drops a figure: τ, TPOT, the
profiler check, the launch fit's unprofiled points); :func:`check_sidecar` refuses a sidecar of another capture
(its ``analysis_window`` names no annotation in the trace, or its profiled steps are not the trace's
``ProfilerStep#N`` ranges). :class:`Sidecar` is the checked object with only the
usable values, in the units the analyses take; the analyses read its fields, never the dict.

Torch-free and analysis-free: the trace model's :class:`gaptrace.trace.Trace` is the only gaptrace type it reads.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import stat
from typing import Any, Mapping

import numpy as np

__all__ = ["Sidecar", "SidecarGraph", "SidecarRange", "SIDECAR_SUFFIX", "sidecar_path", "read_sidecar", "read_sidecar_checked",
           "load_sidecar_checked", "sidecar_problem", "sidecar_field_problems", "positive_number", "usable_tau",
           "as_sidecar", "check_sidecar", "sidecar_window_problem", "sidecar_steps_problem",
           "usable_period_ms", "median_period_ms"]

SIDECAR_SUFFIX = ".gaptrace.json"

# what a capture writes is far inside these; outside them a number is a corrupt or hostile sidecar, and its
# arithmetic (a mean of 1e308s, TPOT over a τ of 1e-320) would overflow into inf or NaN
SIDECAR_MAX_NUMBER = 1e12   # round times (ms), launch costs (µs), node counts
SIDECAR_MIN_NUMBER = 1e-9
TAU_MAX = 1e6                # tokens accepted in one round
TAU_MIN_NONZERO = 1e-6
SIDECAR_MAX_BYTES = 64 * 10 ** 6
SIDECAR_VERSIONS = (1,)  # the "gaptrace_sidecar" format versions this code reads (gaptrace.capture writes 1)
NOT_POSITIVE = f"not a number from {SIDECAR_MIN_NUMBER:g} to {SIDECAR_MAX_NUMBER:g}"  # what positive_number() refuses
PERIOD_MIN_MS = 1e-3  # no decode round or loop step repeats in under 1 µs (a launch alone takes longer)
NOT_A_PERIOD = f"not a period from {PERIOD_MIN_MS:g} to {SIDECAR_MAX_NUMBER:g} ms"


def sidecar_path(trace_path: str) -> str:
    """``run.json.gz`` -> ``run.gaptrace.json`` (next to the trace)."""
    base = trace_path
    for suffix in (".json.gz", ".json", ".gz"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    return base + SIDECAR_SUFFIX


def read_sidecar(trace_path: str) -> dict | None:
    """The sidecar next to ``trace_path`` as a dict, or None when absent or unreadable (it is optional)."""
    p = sidecar_path(trace_path)
    try:
        with open(p) as f:
            obj = json.load(f)
        return obj if isinstance(obj, dict) else None
    except (OSError, ValueError, RecursionError):  # RecursionError: JSON nested thousands deep
        return None


def sidecar_problem(obj: Any) -> str | None:
    """Why ``obj`` (parsed JSON) cannot be used as a capture sidecar, in words; None when it can. Checks the shape
    the analyses rely on: a JSON object whose ``analysis_window``, when present, is an annotation name (a string).
    (Whether that name occurs in a trace needs the trace: :func:`sidecar_window_problem`.)"""
    if not isinstance(obj, dict):
        kind = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean"}
        return f"not a JSON object ({kind.get(type(obj), 'null')})"
    if "traceEvents" in obj and "gaptrace_sidecar" not in obj:
        return "a profiler trace (it holds traceEvents), not a capture sidecar"
    w = obj.get("analysis_window")
    if w is not None and (not isinstance(w, str) or not w):
        return f"its analysis_window is {json.dumps(w)[:60]}, not an annotation name"
    return None


def positive_number(v: Any) -> bool:
    """A JSON number (not a boolean), finite, in [1e-9, 1e12] (SIDECAR_MIN_NUMBER, SIDECAR_MAX_NUMBER): what a
    sidecar's round times, node counts and launch costs must be for the analyses to use them."""
    return _finite(v) and SIDECAR_MIN_NUMBER <= v <= SIDECAR_MAX_NUMBER


def usable_tau(t: Any) -> bool:
    """A sidecar round's ``tau``: a JSON number (not a boolean), 0 or in [1e-6, 1e6] (TAU_MIN_NONZERO, TAU_MAX)."""
    return _finite(t) and (t == 0 or TAU_MIN_NONZERO <= t <= TAU_MAX)


def _finite(v: Any) -> bool:
    """A JSON number (not a boolean) that is a finite float; an integer too large for a float (10**400) is not."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def usable_period_ms(v: Any) -> bool:
    """A round or step period in ms a sidecar may give: :func:`positive_number` and at least PERIOD_MIN_MS."""
    return positive_number(v) and v >= PERIOD_MIN_MS


def sidecar_field_problems(obj: dict) -> list[str]:
    """The fields of a usable sidecar (:func:`sidecar_problem` passed) that the analyses will skip, each as
    ``name (why)``: ``unprofiled_round_ms`` or ``unprofiled_step_ms`` not a positive number (or a list of them), a ``rounds[i].tau`` not a
    number 0 or in [1e-6, 1e6] (an empty list too), a ``graphs[i]`` without positive ``nodes`` and ``unprofiled_launch_us`` (null allowed: no
    unprofiled launch), ``rounds`` or ``graphs`` not a list. Empty when every field present is usable; the caller
    says what was skipped (one warning line), since a skipped field silently drops a figure (τ, TPOT, the
    profiler check, the launch fit's unprofiled points)."""
    out: list[str] = []
    v = obj.get("gaptrace_sidecar")
    if v is not None and (isinstance(v, bool) or v not in SIDECAR_VERSIONS):
        out.append(f"gaptrace_sidecar ({json.dumps(v)[:20]}: not a version this gaptrace writes, "
                   f"{', '.join(map(str, SIDECAR_VERSIONS))}; its fields read as version {SIDECAR_VERSIONS[-1]}'s)")
    for key in ("unprofiled_round_ms", "unprofiled_step_ms", "unprofiled_same_rounds_ms"):
        u = obj.get(key)
        if u is None:
            continue
        if isinstance(u, list) and not u:
            # no unprofiled round: the profiler-cost check has nothing to compare (a capture with too few warm-up
            # steps writes an empty unprofiled_step_ms: nothing skipped)
            if key in ("unprofiled_round_ms", "unprofiled_same_rounds_ms"):
                out.append(f"{key} (an empty list)")
        elif isinstance(u, list):
            out += [f"{key}[{i}] ({NOT_A_PERIOD})" for i, v in enumerate(u) if not usable_period_ms(v)]
        elif not usable_period_ms(u):
            out.append(f"{key} ({NOT_A_PERIOD})")
    for key in ("rounds", "graphs"):
        if key in obj and not isinstance(obj[key], list):
            out.append(f"{key} (not a list)")
    for i, r in enumerate(obj.get("rounds") if isinstance(obj.get("rounds"), list) else []):
        t = r.get("tau") if isinstance(r, dict) else r
        if not usable_tau(t):  # a round without τ drops out of the τ mean: say so
            out.append(f"rounds[{i}].tau (missing, or not 0 or a number from {TAU_MIN_NONZERO:g} to {TAU_MAX:g})")
    for i, g in enumerate(obj.get("graphs") if isinstance(obj.get("graphs"), list) else []):
        us = g.get("unprofiled_launch_us") if isinstance(g, dict) else None
        if not isinstance(g, dict) or not positive_number(g.get("nodes")) or not (us is None or positive_number(us)):
            out.append(f"graphs[{i}] (needs positive nodes and unprofiled_launch_us)")
        elif g.get("unprofiled_device_us") is not None and not positive_number(g.get("unprofiled_device_us")):
            out.append(f"graphs[{i}].unprofiled_device_us ({NOT_POSITIVE})")
    ranges = obj.get("unprofiled_ranges")
    if ranges is not None and not isinstance(ranges, list):
        out.append("unprofiled_ranges (not a list)")
    if not _usable_range_rounds(obj):
        out.append("unprofiled_range_rounds (not a whole number of timed rounds, or 0 beside timed ranges: unprofiled_ranges skipped)")
        ranges = None
    seen: set[str] = set()
    period_us = _round_period_us(obj)
    for i, r in enumerate(ranges if isinstance(ranges, list) else []):
        if not _usable_range(r):
            out.append(f"unprofiled_ranges[{i}] (needs a name, and mean_us and per_round {NOT_POSITIVE[4:]})")
        elif not _usable_range(r, period_us):
            out.append(f"unprofiled_ranges[{i}] ({json.dumps(r['name'])[:60]}: {r['mean_us'] * r['per_round']:.4g} µs "
                       f"a round, more than {RANGE_MAX_ROUNDS:g} rounds of {period_us:.4g} µs)")
        elif r["name"] in seen:
            out.append(f"unprofiled_ranges[{i}] (a second entry for {json.dumps(r['name'])[:60]}: the first one is used)")
        else:
            seen.add(r["name"])
    return out


def _usable_range_rounds(obj: dict) -> bool:
    """``unprofiled_range_rounds`` (how many unprofiled rounds the ranges were timed over) absent, a whole number
    >= 1, or 0 with no range timed (a capture whose warm-up was too short to time any); else the ranges' means come
    from no round and ``unprofiled_ranges`` is skipped."""
    v = obj.get("unprofiled_range_rounds")
    if v is None:
        return True
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        return False
    return v >= 1 or not obj.get("unprofiled_ranges")


# a range's host time per round (mean_us × per_round) may reach this many unprofiled round periods: one thread
# spends at most one period in a range name per round; two threads recording one name, up to two
RANGE_MAX_ROUNDS = 2.0


def _round_period_us(obj: Mapping[str, Any]) -> float | None:
    """The median unprofiled round period in µs (``unprofiled_round_ms``, else ``unprofiled_step_ms``, else
    ``unprofiled_same_rounds_ms``: their usable values), else the profiled steps' (``profiled_step_ms``, longer: a
    looser bound), None without any."""
    for key in ("unprofiled_round_ms", "unprofiled_step_ms", "unprofiled_same_rounds_ms", "profiled_step_ms"):
        ms = median_period_ms(obj.get(key))
        if ms is not None:
            return ms * 1e3
    return None


def _usable_range(r: Any, period_us: float | None = None) -> bool:
    """An ``unprofiled_ranges`` entry the replay can use: a non-empty string ``name``, positive ``mean_us`` and
    ``per_round``, and, given the unprofiled round ``period_us``, a host time per round (mean_us × per_round) of at
    most RANGE_MAX_ROUNDS periods (a range cannot outlast the rounds it was timed in)."""
    return (isinstance(r, dict) and isinstance(r.get("name"), str) and bool(r["name"])
            and positive_number(r.get("mean_us")) and positive_number(r.get("per_round"))
            and (period_us is None or r["mean_us"] * r["per_round"] <= RANGE_MAX_ROUNDS * period_us))


def load_sidecar_checked(path: str) -> tuple[dict | None, str | None]:
    """(sidecar, None) for a usable sidecar file at ``path``; (None, reason) when it cannot be read, is not JSON or
    fails :func:`sidecar_problem`. The reason is one line naming the file."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):  # a FIFO would block the read, a device never end it
            return None, f"{path}: the capture sidecar is not a regular file"
        if st.st_size > SIDECAR_MAX_BYTES:
            return None, (f"{path}: the capture sidecar is {st.st_size / 1e6:,.0f} MB, over the "
                          f"{SIDECAR_MAX_BYTES // 10 ** 6} MB a sidecar can be")
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except (OSError, ValueError, RecursionError) as e:
        msg = ("JSON nested too deeply" if isinstance(e, RecursionError)
               else getattr(e, "strerror", None) or (str(e).splitlines() or [type(e).__name__])[0])
        return None, f"{path}: cannot read the capture sidecar: {msg}"
    why = sidecar_problem(obj)
    if why is not None:
        return None, f"{path}: the capture sidecar is {why}" if why.startswith("not ") else \
            f"{path}: the capture sidecar is unusable: {why}"
    return obj, None


def read_sidecar_checked(trace_path: str) -> tuple[dict | None, str | None]:
    """Like :func:`read_sidecar`, with the reason: (sidecar, None) when the sidecar next to ``trace_path`` is usable,
    (None, None) when there is none, (None, reason) when one is there but cannot be used (the caller says it was
    ignored). :func:`read_sidecar` keeps its contract (dict or None)."""
    p = sidecar_path(trace_path)
    if not os.path.lexists(p):
        return None, None
    return load_sidecar_checked(p)


@dataclasses.dataclass(frozen=True)
class SidecarGraph:
    """One usable entry of the sidecar's ``graphs``: ``name`` (str, "" when absent), ``nodes`` (the CUDA graph's
    node count, > 0), ``unprofiled_launch_us`` (host µs of one cudaGraphLaunch without the profiler, > 0) and
    ``unprofiled_device_us`` (the median device span of one replay without the profiler, timed with a CUDA event
    pair around it in early warm-up rounds; None when the capture did not time it or the value is unusable)."""

    name: str
    nodes: float
    unprofiled_launch_us: float
    unprofiled_device_us: float | None = None


@dataclasses.dataclass(frozen=True)
class SidecarRange:
    """One usable entry of the sidecar's ``unprofiled_ranges``: an NVTX range's host time without the profiler,
    timed by the capture over its kept warm-up rounds: ``name``, ``mean_us`` (inclusive host µs per occurrence:
    nested ranges and any wait inside count) and ``per_round`` (occurrences per round)."""

    name: str
    mean_us: float
    per_round: float


@dataclasses.dataclass(frozen=True)
class Sidecar:
    """A checked capture sidecar: only the values the analyses may use, each by the rules of
    :func:`sidecar_field_problems` (which names what was skipped).

    - ``raw``: the JSON object as read (the report's "Capture" section shows it; nothing else reads it);
    - ``config``: the run's ``config`` object, {} when absent or not an object;
    - ``analysis_window``: the annotation spanning the profiled rounds, or None (not a string);
    - ``round_taus``: τ (tokens accepted) per profiled verify round in trace order, NaN where a round's ``tau`` is
      unusable (:func:`usable_tau`; a round given as a bare number is its τ); None when ``rounds`` is absent or not
      a list;
    - ``round_record_taus``: τ of each round given as an object ({"tau": ...}), in order, None where unusable (the
      report's per-round τ when the analysis has none);
    - ``graphs``: the usable :class:`SidecarGraph` entries, in order (positive ``nodes`` and ``unprofiled_launch_us``);
    - ``unprofiled_round_ms``: the unprofiled round period in ms (the median of the usable values when a list),
      or None;
    - ``same_rounds_ms``: the median usable ``unprofiled_same_rounds_ms`` (the profiled rounds' positions, decoded
      unprofiled), or None; :attr:`measured_round_ms` prefers it;
    - ``unprofiled_ranges``: the usable :class:`SidecarRange` entries (a later entry of one name replacing an
      earlier one), {} when absent.
    """

    raw: Mapping[str, Any]
    config: Mapping[str, Any]
    analysis_window: str | None
    round_taus: tuple[float, ...] | None
    round_record_taus: tuple[float | None, ...]
    graphs: tuple[SidecarGraph, ...]
    unprofiled_round_ms: float | None
    unprofiled_ranges: Mapping[str, SidecarRange] = dataclasses.field(default_factory=dict)
    same_rounds_ms: float | None = None

    @property
    def measured_round_ms(self) -> float | None:
        """The measured unprofiled round the analyses compare with, ms: ``same_rounds_ms`` (the profiled rounds'
        own positions) where present, else ``unprofiled_round_ms`` (the warm-up rounds before them); None without
        either. DESIGN.md 5.3."""
        return self.same_rounds_ms if self.same_rounds_ms is not None else self.unprofiled_round_ms

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> "Sidecar":
        """The typed form of a parsed sidecar object (any dict: unusable fields are dropped, never raised on)."""
        import numpy as np

        rounds = obj.get("rounds")
        taus = records = None
        if isinstance(rounds, list):
            taus = tuple(float(t) if usable_tau(t) else float("nan")
                         for t in (r.get("tau") if isinstance(r, dict) else r for r in rounds))
            records = tuple(float(r["tau"]) if usable_tau(r.get("tau")) else None
                            for r in rounds if isinstance(r, dict))
        graphs = obj.get("graphs")
        usable = tuple(SidecarGraph(str(g.get("name", "")), float(g["nodes"]), float(g["unprofiled_launch_us"]),
                                    float(g["unprofiled_device_us"])
                                    if positive_number(g.get("unprofiled_device_us")) else None)
                       for g in (graphs if isinstance(graphs, list) else [])
                       if isinstance(g, dict) and positive_number(g.get("nodes"))
                       and positive_number(g.get("unprofiled_launch_us")))
        unprof, same = (median_period_ms(obj.get(k)) for k in ("unprofiled_round_ms", "unprofiled_same_rounds_ms"))
        window = obj.get("analysis_window")
        config = obj.get("config")
        ranges = obj.get("unprofiled_ranges") if _usable_range_rounds(obj) else None
        by_name: dict[str, SidecarRange] = {}
        period_us = _round_period_us(obj)
        for r in (ranges if isinstance(ranges, list) else []):
            if _usable_range(r, period_us) and r["name"] not in by_name:  # a second entry of a name is skipped (named so)
                by_name[r["name"]] = SidecarRange(r["name"], float(r["mean_us"]), float(r["per_round"]))
        return cls(raw=obj, config=config if isinstance(config, dict) else {},
                   analysis_window=window if isinstance(window, str) else None, round_taus=taus,
                   round_record_taus=records or (), graphs=usable,
                   unprofiled_round_ms=unprof, unprofiled_ranges=by_name, same_rounds_ms=same)

    def unprofiled_launch_us(self) -> dict[int, float] | None:
        """{graph node count: unprofiled launch µs} for the launch fit
        (:func:`gaptrace.analyses.launch_fit.launch_fit`), a later entry of one size replacing an earlier one;
        None without usable graphs."""
        return {int(g.nodes): g.unprofiled_launch_us for g in self.graphs} or None

    def unprofiled_device_us(self) -> dict[int, float] | None:
        """{graph node count: unprofiled device µs of one replay} (:attr:`SidecarGraph.unprofiled_device_us`), a later
        entry of one size replacing an earlier one; None when no graph carries one."""
        return {int(g.nodes): g.unprofiled_device_us for g in self.graphs
                if g.unprofiled_device_us is not None} or None


def median_period_ms(u: Any) -> float | None:
    """A sidecar period field (a number or a list of them) as the median of its usable values
    (:func:`usable_period_ms`: the items :func:`sidecar_field_problems` does not name as skipped), ms; None without
    one."""
    vals = [float(v) for v in (u if isinstance(u, list) else [u]) if usable_period_ms(v)]
    return float(np.median(vals)) if vals else None


def as_sidecar(side: "Sidecar | Mapping[str, Any] | None") -> Sidecar | None:
    """``side`` as a :class:`Sidecar`: a Sidecar unchanged, a dict through :meth:`Sidecar.from_dict`, anything
    else (None, a list) None. The analyses' entry points accept either form."""
    if isinstance(side, Sidecar):
        return side
    return Sidecar.from_dict(side) if isinstance(side, dict) else None


def sidecar_window_problem(sidecar: "Sidecar | Mapping[str, Any]", trace, path: str) -> str | None:
    """One line when the sidecar's ``analysis_window`` names no annotation in ``trace`` (a
    :class:`gaptrace.trace.Trace`; the sidecar then describes another capture); None when it is absent or found."""
    named = sidecar.analysis_window if isinstance(sidecar, Sidecar) else sidecar.get("analysis_window")
    if not isinstance(named, str):
        return None
    ua = trace.host.loc[trace.host["cat"] == "user_annotation", "name"]
    if (ua == named).any():
        return None
    return (f"{path}: the capture sidecar's analysis_window {json.dumps(named)[:80]} names no annotation in the "
            "trace (a sidecar of another capture?)")


# a sidecar's profiled steps and the trace's ProfilerStep#N ranges are the same steps timed twice (the capture's
# perf_counter between prof.step() calls, the profiler's own range): their medians agree within 2% on the shipped
# captures (12% on a 0.2 ms step, whose Python around step() the range leaves out); outside this ratio and this
# many µs apart the sidecar is another capture's
STEP_MATCH_RATIO = (0.8, 1.25)
STEP_MATCH_MIN_US = 30.0


def sidecar_steps_problem(sidecar: "Sidecar | Mapping[str, Any]", trace, path: str) -> str | None:
    """One line when the sidecar's ``profiled_step_ms`` (the wall time of each profiled step, as the capture timed
    it) disagrees with the trace's ``ProfilerStep#N`` ranges (the same steps as torch.profiler recorded them): the
    medians' ratio outside :data:`STEP_MATCH_RATIO` and more than :data:`STEP_MATCH_MIN_US` apart: the sidecar was
    written by another capture (its unprofiled rounds are another loop's; a sidecar renamed with its trace passes).
    None when either is missing or they agree."""
    raw = sidecar.raw if isinstance(sidecar, Sidecar) else sidecar
    ps = raw.get("profiled_step_ms")
    side_ms = [float(v) for v in ps if usable_period_ms(v)] if isinstance(ps, list) else []
    if not side_ms:
        return None
    names = trace.host["name"]
    cats = names.cat.categories
    hit = np.asarray(cats.astype(str).str.fullmatch(r"ProfilerStep#\d+"), dtype=bool)
    if not hit.any():
        return None
    codes = names.cat.codes.to_numpy()
    rows = (codes >= 0) & hit[np.maximum(codes, 0)]
    dur = trace.host["dur_us"].to_numpy()[rows]
    if not len(dur):
        return None
    a, b = float(np.median(side_ms)) * 1e3, float(np.median(dur))
    lo, hi = STEP_MATCH_RATIO
    if b <= 0 or lo <= a / b <= hi or abs(a - b) <= STEP_MATCH_MIN_US:
        return None
    return (f"{path}: the capture sidecar's profiled steps ({a / 1e3:.3f} ms median) are not the trace's "
            f"ProfilerStep#N ranges ({b / 1e3:.3f} ms median): a sidecar of another capture?")


def check_sidecar(side: "Sidecar | Mapping[str, Any]", trace, window: str | None, path: str
                  ) -> tuple[Sidecar | None, str | None, str | None]:
    """A read sidecar (a dict that passed :func:`sidecar_problem`, or a :class:`Sidecar`) checked against the
    loaded ``trace`` (analyze, diff and report): (sidecar, None, fields) to use it, where ``fields`` is None or one
    line naming the fields the analyses skip (:func:`sidecar_field_problems`; at most 4 named, then a count);
    (None, why, None) when its analysis_window
    names no annotation in the trace (:func:`sidecar_window_problem`) or its profiled steps disagree with the
    trace's (:func:`sidecar_steps_problem`): it describes another capture, so its τ and round times are not this
    trace's, whatever ``window`` the user analyses; (None, None, None) when ``window`` is that same missing name
    (the window's own error says it all)."""
    side = as_sidecar(side)
    why = sidecar_window_problem(side, trace, path)
    if why is not None:
        if window is not None and window == side.analysis_window:
            return None, None, None  # the user's window is the same missing name: its error line says it all
        return None, why, None
    why = sidecar_steps_problem(side, trace, path)
    if why is not None:
        return None, why, None
    bad = sidecar_field_problems(side.raw)
    more = f" and {len(bad) - 4} more" if len(bad) > 4 else ""
    return side, None, (f"capture sidecar fields skipped: {', '.join(bad[:4])}{more}" if bad else None)
