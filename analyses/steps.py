"""Steps of any torch.profiler loop, found without being told: which host range marks one iteration of the loop.

A loop's step is the unit every per-step figure (step time, GPU busy share, TPOT) divides by. The rules, tried in
order (the first that applies decides; ``Steps.rule`` says which):

``round``           the runtime's own verify-round range (``round`` or ``round_<n>``, :mod:`.rounds`), at least two:
                    what ``--rounds`` reads today.
``profiler_step``   torch.profiler's own ``ProfilerStep#N`` ranges, written once per ``prof.step()`` (a
                    user_annotation, or a cpu_op in Kineto before 2022), at least one. Each spans from one
                    ``step()`` call to the next: one training iteration, one decode step, or one whole
                    ``generate()`` when the user steps the profiler per request.
``engine_step``     a serving engine's own per-step range, at least one: SGLang's ``step[DECODE bs=32]`` /
                    ``step[EXTEND ...]`` (``model_runner._build_step_span_name``) and vLLM's
                    ``execute_<...>context_<...>generation_<...>`` (the v1 model runner's per-``execute_model``
                    range); when both are present the outermost one on the thread is the step.
``repeating_range`` a host annotation (user_annotation: record_function / NVTX range) that repeats with a regular
                    period: among the ranges with no enclosing range on their thread, grouped by name with digit
                    runs folded (``decode_3`` and ``decode_4`` are one name), the most frequent one with at least
                    ``MIN_REPEATS`` occurrences on one thread whose start-to-start periods are regular
                    (median absolute deviation <= ``REGULAR_MAD_SHARE`` × median period, a robust rule so that one
                    compile step cannot break it); ties go to the larger total duration.
``none``            no rule applies; ``Steps.reason`` says why in one line.

Outlier steps (``OUTLIER_FACTOR``): a step longer than 5× the median step (at least three steps). The factor is a
ratio, not a MAD rule, on purpose: a serving loop's steps are bimodal (prefill and decode steps, batch buckets differ
2–3× from one another) so a MAD rule flags the workload's own steps, while what the user must be told about (a Triton
or Inductor compile, lazy module loading, the first step on a new shape) costs 10–1000× a step. Each outlier is
reported as itself (:class:`OutlierStep`) with what was open in it: the chain of longest host events inside it, the
compile marker on that chain when there is one (:data:`COMPILE_FRAME_RE`: ``triton/compiler``, Inductor's and
Dynamo's compile paths, ``subprocess.py: _try_wait`` of a compile worker, runtime module loading), and the
innermost user frame above it ("step 14 took 0.9 s (75× the median 12 ms): a Triton compile in allocate_slots").
``Steps.summary`` has the step time with and without the outliers.

``holds_request``: whether one step holds a whole request (a ``generate()`` call: a Python frame whose function is
``generate`` inside every step), so that the headline can say "TPOT is per step, not per token";
``forwards_per_step`` counts the outermost ``nn.Module`` forward frames per step (the tokens a ``generate()`` step
decoded, plus the prefill). None without Python stacks (the trace cannot tell).
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import numpy as np
import pandas as pd

from gaptrace.trace import Trace

from . import stacks
from .occupancy import resolve_device

__all__ = ["Steps", "OutlierStep", "find_steps", "step_outliers", "COMPILE_FRAME_RE", "OUTLIER_FACTOR",
           "MIN_REPEATS", "REGULAR_MAD_SHARE", "is_compile_frame"]

MIN_REPEATS = 3
REGULAR_MAD_SHARE = 0.5
OUTLIER_FACTOR = 5.0
CULPRIT_SHARE = 0.5  # the chain of longest events is followed while an event holds half the step's excess time

_PROFILER_STEP_RE = re.compile(r"ProfilerStep#\d+")
# SGLang's step span and vLLM v1's execute_model range
_ENGINE_STEP_RE = re.compile(r"step\[[A-Z_]+[^\]]*\]|execute_.*context_.*generation_.*")
_DIGITS_RE = re.compile(r"\d+")
# A compile (or a module load) in progress: Triton's compiler, Inductor's and Dynamo's compile paths (not the
# eval_frame wrapper every compiled call passes through), a compile worker waited on, runtime module loading.
COMPILE_FRAME_RE = re.compile(
    r"(?:^|[/\\])triton[/\\]compiler[/\\]"
    r"|(?:^|[/\\])torch[/\\]_inductor[/\\](?:compile_fx|async_compile|codecache|codegen[/\\]|graph\.py|scheduler\.py"
    r"|lowering\.py|select_algorithm\.py|autotune_process\.py)"
    r"|(?:^|[/\\])torch[/\\]_dynamo[/\\](?:convert_frame|symbolic_convert|output_graph|bytecode_transformation)"
    r"|(?:^|[/\\])subprocess\.py\(\d+\): (?:_try_wait|_wait|communicate)"
    r"|(?:^|[/\\])torch[/\\]utils[/\\]cpp_extension\.py"
    r"|^(?:cuModuleLoad\w*|cuLibraryLoad\w*|cudaLibraryLoad\w*|hipModuleLoad\w*|nvrtc\w+)$")
_GENERATE_RE = re.compile(r"\(\d+\): generate$")
_MODULE_PREFIX = "nn.Module: "
# frames that are plumbing, not the user's site, when naming where a compile ran
_PLUMBING_RE = re.compile(r"(?:^|[/\\])(?:torch|triton|subprocess\.py|threading\.py|selectors\.py|concurrent[/\\]"
                          r"|functools\.py|contextlib\.py|site-packages[/\\](?:torch|triton)[/\\])|^<built-in|^nn\.Module: ")


def to_jsonable(obj: Any) -> Any:
    """numpy / pandas scalars and containers -> plain JSON types (NaN / inf -> None), for the ``to_dict`` methods of
    this module, :mod:`.verdicts`, :mod:`.thread_waits` and :mod:`.launch_idle` (kept here so that analyses import
    nothing from the command layer)."""
    t = type(obj)
    if t is str or t is int or obj is None:
        return obj
    if t is float:
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        v = float(obj)
        return v if np.isfinite(v) else None
    return obj


def is_compile_frame(name: str) -> bool:
    """True for a frame name that means a compile or a module load is running (:data:`COMPILE_FRAME_RE`)."""
    return COMPILE_FRAME_RE.search(name) is not None


def compile_kind(name: str) -> str:
    """What kind of compile a :data:`COMPILE_FRAME_RE` frame is, in words ("a Triton compile", ...)."""
    if re.search(r"triton[/\\]compiler", name):
        return "a Triton compile"
    if "_inductor" in name:
        return "a torch.compile (Inductor) compile"
    if "_dynamo" in name:
        return "a torch.compile (Dynamo) trace"
    if "subprocess" in name:
        return "a wait on a compile subprocess"
    if "cpp_extension" in name or name.startswith("nvrtc"):
        return "a C++/CUDA extension build"
    return "a runtime module load"


@dataclasses.dataclass
class OutlierStep:
    """One step longer than ``OUTLIER_FACTOR`` × the median step. Times in µs.

    ``chain``: frame names from the step's outermost event down the longest event at each level while it holds
    ``CULPRIT_SHARE`` of the excess (dur_us − median); ``culprit``/``culprit_us``: the deepest of them;
    ``compile_frame``: the first compile marker (:data:`COMPILE_FRAME_RE`) on the chain or, failing that, the longest
    compile-marker event of the rank inside the step (any thread) that holds that share, else None;
    ``site``: the innermost frame above the culprit that is the user's own code (not torch, triton, subprocess,
    threading, a built-in, an nn.Module wrapper), else None; ``summary``: the sentence for the findings.
    """

    step: int
    start_us: float
    dur_us: float
    median_us: float
    ratio: float
    chain: list[str]
    culprit: str | None
    culprit_us: float
    compile_frame: str | None
    site: str | None
    summary: str


@dataclasses.dataclass
class Steps:
    """The steps of a trace (:func:`find_steps`). Times in µs on the trace clock.

    ``rule``: "round" | "profiler_step" | "engine_step" | "repeating_range" | "none"; ``name``: the step range's name
    (for folded names, the first occurrence's name; ``name_pattern`` the folded form) or None; ``reason``: one line,
    why this rule (or why none); ``table``: one row per step in time order: step (0..), name, rank, pid, tid,
    host_row (positional row of ``trace.host``), start_us, end_us, dur_us, period_us (start to the next step's
    start; NaN for the last and across a join of two profiler windows), outlier (bool), launches (cuda_runtime /
    cuda_driver launch calls inside the step on
    its rank: eager kernel launches plus graph launches), forwards (outermost ``nn.Module`` frames inside; -1 without
    Python stacks), generate (frames named ``generate`` inside; -1 without Python stacks).
    ``holds_request``: True when every step holds a ``generate`` frame, False when none does and the trace has
    Python stacks, None otherwise; ``request_evidence``: the sentence behind it.
    ``outliers``: :class:`OutlierStep` per outlier; ``summary``: steps, outliers, median_step_us, mean_step_us,
    mean_step_us_without_outliers, total_step_us, total_step_us_without_outliers, launches_per_step (median).
    """

    rule: str
    name: str | None
    name_pattern: str | None
    reason: str
    table: pd.DataFrame
    holds_request: bool | None = None
    request_evidence: str | None = None
    outliers: list[OutlierStep] = dataclasses.field(default_factory=list)
    summary: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: rule, name, name_pattern, reason, holds_request, request_evidence, summary, outliers, steps."""
        return to_jsonable({"rule": self.rule, "name": self.name, "name_pattern": self.name_pattern,
                            "reason": self.reason, "holds_request": self.holds_request,
                            "request_evidence": self.request_evidence, "summary": self.summary,
                            "outliers": [dataclasses.asdict(o) for o in self.outliers],
                            "steps": self.table.to_dict("records")})


STEP_COLUMNS = ["step", "name", "rank", "pid", "tid", "host_row", "start_us", "end_us", "dur_us", "period_us",
                "outlier", "launches", "forwards", "generate"]

_LAUNCH_NAME_RE = re.compile(r"^(?:cuda|cu|hip)\w*Launch\w*$")


def is_launch_call(name: str) -> bool:
    """True for a runtime / driver call that launches device work: a cuda* / cu* / hip* name containing "Launch"
    (cudaLaunchKernel(ExC), cuLaunchKernel(Ex), hipLaunchKernel, hipModuleLaunchKernel, hipExtModuleLaunchKernel,
    cudaLaunchCooperativeKernel, cudaLaunchHostFunc) and the graph launches (cudaGraphLaunch, hipGraphLaunch)."""
    return _LAUNCH_NAME_RE.match(name) is not None


def _rank_of(trace: Trace, device) -> int:
    if not trace.device.empty:
        return resolve_device(trace, device)[0]
    return int(trace.host["rank"].iloc[0]) if len(trace.host) else 0


def _name_mask(trace: Trace, rows: np.ndarray, pred) -> np.ndarray:
    """Evaluate ``pred(name)`` once per symbol, then per host row in ``rows``."""
    codes = trace.host["name"].cat.codes.to_numpy()[rows]
    used = np.unique(codes[codes >= 0])
    lut = np.zeros(len(trace.symbols) + 1, dtype=bool)
    lut[used] = [bool(pred(str(trace.symbols[c]))) for c in used]
    return np.where(codes >= 0, lut[np.maximum(codes, 0)], False)


def _rows_table(trace: Trace, rows: np.ndarray) -> pd.DataFrame:
    h = trace.host
    sub = h.iloc[rows]
    t = pd.DataFrame({"name": sub["name"].astype(str).to_numpy(), "rank": sub["rank"].to_numpy(),
                      "pid": sub["pid"].astype(str).to_numpy(), "tid": sub["tid"].astype(str).to_numpy(),
                      "host_row": rows.astype(np.int64), "start_us": sub["ts_us"].to_numpy(np.float64),
                      "end_us": sub["end_us"].to_numpy(np.float64)})
    return t.sort_values(["start_us", "host_row"], kind="stable").reset_index(drop=True)


def _outermost(trace: Trace, rows: np.ndarray) -> np.ndarray:
    """The rows among ``rows`` with no enclosing row of ``rows`` on their thread."""
    tree = stacks.host_tree(trace)
    mask = np.zeros(tree.n, dtype=bool)
    nodes = tree.nodes(rows)
    mask[nodes] = True
    return rows[stacks.enclosing(tree, nodes, mask) < 0]


def _regular(starts: np.ndarray) -> tuple[bool, float, float]:
    """(regular, median period, MAD of periods) of sorted start times (module docstring, ``repeating_range``)."""
    p = np.diff(np.sort(starts))
    med = float(np.median(p))
    mad = float(np.median(np.abs(p - med)))
    return med > 0 and mad <= REGULAR_MAD_SHARE * med, med, mad


def _one_name_or(trace: Trace, rows: np.ndarray, pattern: str) -> str:
    """The steps' name: their one real name when every step range has it (``llama3_decode`` stays itself, so that
    ``--window NAME`` takes it back), else the digit-folded ``pattern`` (``step[#]`` over step[1], step[2], ...)."""
    names = trace.host["name"].iloc[np.asarray(rows, dtype=np.int64)].astype(str).unique()
    return str(names[0]) if len(names) == 1 else pattern


def _repeating(trace: Trace, rank: int) -> tuple[np.ndarray | None, str | None, str]:
    """The ``repeating_range`` rule: (rows, folded name, reason)."""
    h = trace.host
    cand = np.flatnonzero((h["cat"] == "user_annotation").to_numpy() & (h["rank"].to_numpy() == rank))
    if len(cand) == 0:
        return None, None, "no round, ProfilerStep#N or engine step range, and no host annotation (NVTX range / " \
                           "record_function) to repeat"
    top = _outermost(trace, cand)
    names = h["name"].iloc[top].astype(str).to_numpy()
    folded = np.array([_DIGITS_RE.sub("#", n) for n in names], dtype=object)
    tid = h["tid"].iloc[top].astype(str).to_numpy()
    df = pd.DataFrame({"row": top, "pattern": folded, "tid": tid, "ts": h["ts_us"].to_numpy()[top],
                       "dur": h["dur_us"].to_numpy()[top]})
    best, best_key, notes = None, None, []
    for (pat, t), g in df.groupby(["pattern", "tid"], sort=True):
        if len(g) < MIN_REPEATS:
            continue
        ok, med, mad = _regular(g["ts"].to_numpy())
        if not ok:
            notes.append(f"'{pat}' ({len(g)}×) repeats irregularly (period median {med:,.0f} µs, MAD {mad:,.0f} µs)")
            continue
        key = (len(g), float(g["dur"].sum()))
        if best_key is None or key > best_key:
            best, best_key = (g["row"].to_numpy(), pat), key
    if best is None:
        most = df.groupby(["pattern", "tid"]).size().sort_values(ascending=False)
        top_txt = f"the most frequent top-level range is '{most.index[0][0]}' ({int(most.iloc[0])}×)" if len(most) else ""
        reason = (notes[0] if notes else
                  f"no top-level host annotation repeats {MIN_REPEATS} or more times on one thread ({top_txt})")
        return None, None, "no round, ProfilerStep#N or engine step range; " + reason
    rows, pat = best
    pat = _one_name_or(trace, rows, pat)
    return rows, pat, (f"no round, ProfilerStep#N or engine step range: '{pat}' is the most frequent top-level host "
                       f"range ({len(rows)}×, regular period)")


def find_steps(trace: Trace, device: int | tuple[int, int] | None = None, round_name: str | None = None) -> Steps:
    """The steps of ``trace`` by the first rule that applies (module docstring), on the rank of ``device``
    (default: the busiest device's rank; the first host event's rank in a trace without device activity).
    ``round_name``: the verify-round range the ``round`` rule looks for (default ``round``; ``--rounds NAME``).

    Never raises for a trace without annotations: ``rule`` is then "none" with ``reason`` saying why. Cost: one
    pass over the user_annotation / cpu_op rows of the rank plus :func:`gaptrace.analyses.stacks.host_tree`.
    """
    from .rounds import ROUND_NAME, _round_annotations, duplicate_ranges

    h = trace.host
    rank = _rank_of(trace, device)
    in_rank = h["rank"].to_numpy() == rank
    rule, rows, pattern, reason = "none", None, None, ""
    round_name = round_name or ROUND_NAME
    ua, match, ua_rows, _, n_inside = _round_annotations(trace, rank, round_name)
    if int(match.sum()) >= 2:
        rule, rows, pattern = "round", ua_rows[match], round_name
        reason = (f"the trace carries the runtime's verify-round range '{round_name}' ({int(match.sum())}×)"
                  if round_name == ROUND_NAME else f"the trace carries the step range '{round_name}' ({int(match.sum())}×)")
        if n_inside:
            reason += (f"; {n_inside} more '{round_name}' ranges start inside another on their thread (overlapping "
                       "or nested: not rounds of their own), left out")
    if rows is None:
        cand = np.flatnonzero(h["cat"].isin(("user_annotation", "cpu_op")).to_numpy() & in_rank)
        ps = cand[_name_mask(trace, cand, _PROFILER_STEP_RE.fullmatch)]
        if len(ps):
            rule, rows, pattern = "profiler_step", ps, "ProfilerStep#N"
            reason = f"torch.profiler's own ProfilerStep#N ranges ({len(ps)}×, one per prof.step())"
    if rows is None:
        cand = np.flatnonzero((h["cat"] == "user_annotation").to_numpy() & in_rank)
        es = cand[_name_mask(trace, cand, _ENGINE_STEP_RE.fullmatch)]
        if len(es):
            es = _outermost(trace, es)
            rule, rows = "engine_step", es
            pattern = _one_name_or(trace, es, _DIGITS_RE.sub("#", str(h["name"].iloc[es[0]])))
            reason = f"a serving engine's per-step range (SGLang step[...] / vLLM execute_...), {len(es)}×"
    if rows is None:
        rows, pattern, reason = _repeating(trace, rank)
        if rows is not None:
            rule = "repeating_range"
    if rows is None:
        return Steps(rule="none", name=None, name_pattern=None, reason=reason,
                     table=pd.DataFrame({c: [] for c in STEP_COLUMNS}), summary={"steps": 0})
    t = _rows_table(trace, np.asarray(rows, dtype=np.int64))
    dup = duplicate_ranges(trace.host.iloc[t["host_row"].to_numpy()])
    if dup.any():  # an exact copy of a step range is one step (rounds.duplicate_ranges)
        t = t[~dup].reset_index(drop=True)
        reason += f"; {int(dup.sum())} exact copies of a step range (same thread, start and end) counted once"
    t.insert(0, "step", np.arange(len(t)))
    t["dur_us"] = t["end_us"] - t["start_us"]
    period = np.r_[np.diff(t["start_us"].to_numpy()), np.nan] if len(t) else np.zeros(0)
    if len(t) > 1:  # a period across two profiler windows is no step's (Trace.window_joins): NaN
        period[:-1][trace.window_joins(t["start_us"].to_numpy(), rank)] = np.nan
    t["period_us"] = period
    t["launches"], t["forwards"], t["generate"] = _per_step_counts(trace, t, rank)
    med = float(np.median(t["dur_us"])) if len(t) else 0.0
    t["outlier"] = (t["dur_us"] > OUTLIER_FACTOR * med) if len(t) >= 3 else False
    steps = Steps(rule=rule, name=str(t["name"].iloc[0]), name_pattern=pattern, reason=reason, table=t[STEP_COLUMNS])
    steps.holds_request, steps.request_evidence = _holds_request(trace, t)
    steps.outliers = step_outliers(trace, t)
    d = t["dur_us"].to_numpy()
    keep = ~t["outlier"].to_numpy(bool)
    steps.summary = {"steps": len(t), "outliers": int((~keep).sum()), "median_step_us": med,
                     "mean_step_us": float(d.mean()), "mean_step_us_without_outliers": float(d[keep].mean()),
                     "total_step_us": float(d.sum()), "total_step_us_without_outliers": float(d[keep].sum()),
                     "launches_per_step": float(np.median(t["launches"]))}
    return steps


def _per_step_counts(trace: Trace, t: pd.DataFrame, rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per step: launch calls, outermost nn.Module frames and ``generate`` frames that start inside it, on its
    rank (-1 for the last two without Python stacks)."""
    h = trace.host
    in_rank = np.flatnonzero(h["rank"].to_numpy() == rank)
    ts = h["ts_us"].to_numpy()
    s, e = t["start_us"].to_numpy(), t["end_us"].to_numpy()

    def count(rows: np.ndarray) -> np.ndarray:
        x = np.sort(ts[rows])
        return np.searchsorted(x, e, side="right") - np.searchsorted(x, s, side="left")

    rt = in_rank[h["cat"].iloc[in_rank].isin(("cuda_runtime", "cuda_driver")).to_numpy()]
    launches = count(rt[_name_mask(trace, rt, is_launch_call)])
    py = in_rank[(h["cat"].iloc[in_rank] == "python_function").to_numpy()]
    if len(py) == 0:
        neg = np.full(len(t), -1)
        return launches, neg, neg
    mods = py[_name_mask(trace, py, lambda n: n.startswith(_MODULE_PREFIX))]
    forwards = count(_outermost(trace, mods)) if len(mods) else np.zeros(len(t), dtype=np.int64)
    gen = py[_name_mask(trace, py, _GENERATE_RE.search)]
    return launches, forwards, count(gen) if len(gen) else np.zeros(len(t), dtype=np.int64)


def _holds_request(trace: Trace, t: pd.DataFrame) -> tuple[bool | None, str]:
    if len(t) == 0:
        return None, "no steps"
    gen, fw = t["generate"].to_numpy(), t["forwards"].to_numpy()
    if (gen < 0).all():
        return None, "the trace has no Python stacks (with_stack=False): cannot tell whether a step is one request"
    if (gen > 0).all():
        return True, (f"every step holds a generate() call ({int(np.median(fw))} model forwards a step, median): "
                      "one step is one whole request, so a per-step time is a request latency and TPOT is per step, "
                      "not per token")
    if (gen == 0).all():
        return False, f"no step holds a generate() call ({int(np.median(fw))} outermost model forwards a step, median)"
    return None, f"{int((gen > 0).sum())} of {len(t)} steps hold a generate() call"


def step_outliers(trace: Trace, table: pd.DataFrame) -> list[OutlierStep]:
    """An :class:`OutlierStep` for every row of ``table`` (:attr:`Steps.table`) with ``outlier`` True: the chain of
    longest host events inside it, the compile marker and the user's frame (rules: :class:`OutlierStep`)."""
    if table.empty or not table["outlier"].any():
        return []
    tree = stacks.host_tree(trace)
    med = float(np.median(table["dur_us"]))
    frames = tree.frames.to_numpy(dtype=object)
    comp_frame = np.array([is_compile_frame(f) for f in frames], dtype=bool)
    out = []
    for r in table[table["outlier"]].itertuples(index=False):
        excess = float(r.dur_us) - med
        node = int(tree.nodes(np.array([r.host_row]))[0])
        k = int(tree.thread[node])
        lo, hi = int(tree.thread_bounds[k]), int(tree.thread_bounds[k + 1])
        inside = lo + np.flatnonzero((tree.start_us[lo:hi] >= r.start_us) & (tree.end_us[lo:hi] <= r.end_us + stacks.EPS_US))
        chain_nodes, cur = [], node
        while True:
            kids = inside[tree.parent[inside] == cur]
            if len(kids) == 0:
                break
            dur = tree.end_us[kids] - tree.start_us[kids]
            best = int(kids[int(np.argmax(dur))])
            if float(dur.max()) < CULPRIT_SHARE * excess:
                break
            chain_nodes.append(best)
            cur = best
        chain = [str(frames[tree.frame[n]]) for n in chain_nodes]
        culprit = chain[-1] if chain else None
        culprit_us = float(tree.end_us[chain_nodes[-1]] - tree.start_us[chain_nodes[-1]]) if chain else 0.0
        comp_at = next((i for i, n in enumerate(chain_nodes) if comp_frame[tree.frame[n]]), None)
        compile_frame = chain[comp_at] if comp_at is not None else _longest_compile(trace, tree, comp_frame, r, excess)
        upto = chain[:comp_at] if comp_at is not None else chain[:-1] if chain else []
        site = next((f for f in reversed(upto) if stacks._has_source(f) and not _PLUMBING_RE.search(f)), None)
        what = (compile_kind(compile_frame) + f" ({compile_frame})" if compile_frame
                else f"{culprit} took {culprit_us / 1e3:,.1f} ms of it" if culprit else "no host event explains it")
        where = f" in {site}" if site else ""
        summary = (f"step {int(r.step)} took {_fmt_us(r.dur_us)} ({r.dur_us / med:.0f}× the median {_fmt_us(med)}): "
                   f"{what}{where}")
        out.append(OutlierStep(step=int(r.step), start_us=float(r.start_us), dur_us=float(r.dur_us), median_us=med,
                               ratio=float(r.dur_us) / med if med > 0 else float("inf"), chain=chain, culprit=culprit,
                               culprit_us=culprit_us, compile_frame=compile_frame, site=site, summary=summary))
    return out


def _longest_compile(trace: Trace, tree, comp_frame: np.ndarray, r, excess: float) -> str | None:
    """The longest compile-marker event of the step's rank (any thread) inside the step holding
    ``CULPRIT_SHARE`` of the excess, else None."""
    rank_of_thread = tree.threads["rank"].to_numpy()
    sel = np.flatnonzero(comp_frame[np.maximum(tree.frame, 0)] & (tree.frame >= 0)
                         & (rank_of_thread[tree.thread] == r.rank)
                         & (tree.start_us >= r.start_us) & (tree.end_us <= r.end_us + stacks.EPS_US))
    if len(sel) == 0:
        return None
    dur = tree.end_us[sel] - tree.start_us[sel]
    best = int(sel[int(np.argmax(dur))])
    return str(tree.frames[tree.frame[best]]) if dur.max() >= CULPRIT_SHARE * excess else None


def _fmt_us(us: float) -> str:
    us = float(us)
    return f"{us / 1e6:.2f} s" if us >= 1e6 else f"{us / 1e3:.1f} ms" if us >= 1e3 else f"{us:.0f} µs"
