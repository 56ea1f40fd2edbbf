"""The profiler taken out of a replay model (docs/DESIGN.md "The replay model", "The profiler taken out").

Under ``torch.profiler`` with ``with_stack=True`` the host pays for every event it records: each ATen op and
user annotation (cpu_op, user_annotation), each Python frame (python_function), each CUPTI-traced runtime call
(cuda_runtime, cuda_driver), and, per CUDA graph launch, κ per graph node (DESIGN.md "Launch fit"). The unprofiled
host chain is the measured one with those costs subtracted:

- host work before call k: work'_k = max(0, work_k − Σ_c n_{k,c} · cost_c), n_{k,c} the events of category c that
  start inside that interval on the launching thread;
- call k's own cost: cost'_k = max(0, cost_k − cost_runtime − Σ_c m_{k,c} · cost_c) over the events nested in it;
  a graph launch of N nodes costs the sidecar's unprofiled launch time for a graph of N nodes where the capture
  measured one, else max(0, cost_k − κN) − cost_runtime (κ: :func:`gaptrace.analyses.launch_fit.launch_fit`; where
  the trace gives none, one graph size, the calibration's ``graph_node_us``);
- the profiler's own buffer handling (the trace's ``overhead`` events: Buffer Flush, Activity Buffer Request) and
  torch.profiler's own Python code on the launching thread (``profile.step()``: the frames of
  torch/profiler/profiler.py, :func:`profiler_frames`; the events inside them are not charged again) are taken out
  of every interval they overlap.

The per-event costs come from a calibration JSON (``gaptrace calibrate``: the same small benchmark with and without
the profiler, :mod:`gaptrace.calibrate`), else the shipped default ``data/calibration_default.json``; the result
names the one used.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import stat
from typing import Any

import numpy as np
import pandas as pd

from gaptrace.sidecar import Sidecar, as_sidecar, median_period_ms

from gaptrace.trace import Trace, clean_text

from .launch_fit import launch_fit
from .replay import ReplayModel, _coverage, _intersect, _merge

__all__ = ["Calibration", "load_calibration", "shipped_calibration_path", "name_codes", "profiler_frames", "DEFAULT_CALIBRATION", "unprofiled_inputs", "sidecar_launch_us", "sidecar_device_us",
           "thread_wait_cost", "THREAD_WAIT_PREFIX", "gil_held_in_waits", "lock_waits_in", "GIL_RELEASING_PREFIX", "measured_period_us",
           "measured_period_source", "measured_period",
           "COST_KEYS"]

DEFAULT_CALIBRATION = os.path.join(os.path.dirname(__file__), "data", "calibration_default.json")
COST_KEYS = {"cpu_op": "aten_op_us", "user_annotation": "aten_op_us", "python_function": "python_frame_us",
             "cuda_runtime": "runtime_call_us", "cuda_driver": "runtime_call_us"}


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Per-event host costs of the profiler, µs: ``aten_op_us`` (one recorded ATen op or user annotation),
    ``python_frame_us`` (one recorded Python frame), ``runtime_call_us`` (one CUPTI-traced runtime call),
    ``device_op_us`` (extra device time per traced device op; optional in the file, 0 when absent);
    ``graph_node_us`` (host cost per CUDA graph node of a launch under the profiler, κ measured by
    ``gaptrace calibrate``; optional, 0 when absent); ``queue_gap_us`` (the device's unprofiled queued-launch gap
    between two eager kernels, :func:`gaptrace.calibrate.queued_chain_us`; None when not measured: a file without
    it, or one made without CUDA); ``graph_launch_t0_us`` / ``graph_launch_node_us`` (the unprofiled host cost of a
    cudaGraphLaunch, t0 + per node × N, from the file's ``graph_plain``: :func:`gaptrace.calibrate.graph_plain_us`;
    None when not measured); ``source`` (the file), ``measured_on`` (what machine and torch measured it)."""

    aten_op_us: float
    python_frame_us: float
    runtime_call_us: float
    source: str
    measured_on: str
    device_op_us: float = 0.0
    graph_node_us: float = 0.0
    queue_gap_us: float | None = None
    graph_launch_t0_us: float | None = None
    graph_launch_node_us: float | None = None

    def cost_of(self, cat: str) -> float:
        return float(getattr(self, COST_KEYS[cat])) if cat in COST_KEYS else 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@functools.lru_cache(maxsize=None)
def _shipped_by_device() -> dict[str, str]:
    """{GPU name: path} of the shipped ``data/calibration_*.json`` files (read once a process; the first file of a
    name, in sorted order, wins)."""
    d = os.path.dirname(DEFAULT_CALIBRATION)
    out: dict[str, str] = {}
    for name in sorted(os.listdir(d)):
        if not (name.startswith("calibration_") and name.endswith(".json")):
            continue
        p = os.path.join(d, name)
        try:
            with open(p, encoding="utf-8") as f:
                dev = json.load(f).get("device")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(dev, str):
            out.setdefault(dev, p)
    return out


def shipped_calibration_path(device_name: str | None) -> str:
    """The shipped calibration for a trace whose GPU is ``device_name`` (:meth:`gaptrace.trace.Trace.device_name`):
    the file of ``data/calibration_*.json`` whose ``device`` is that name, else :data:`DEFAULT_CALIBRATION` (the
    H200 host's). The profiler's device cost per op and the queued-launch gap are the GPU's (0.22 µs per op on an
    H100, 0.76 on the H200: docs/DESIGN.md 5.2); the host costs are the capture host's CPU, which no trace names."""
    return _shipped_by_device().get(device_name, DEFAULT_CALIBRATION) if device_name else DEFAULT_CALIBRATION


CALIBRATION_MAX_BYTES = 1 << 20  # a calibration file is a few kB
MEASURED_ON_MAX = 200
EVENT_COST_MAX_US = 1000.0  # a profiler cost per recorded event, node or op above 1 ms is no measurement (µs each)
QUEUE_GAP_MAX_US = 1000.0  # a queued-launch gap is a µs or two; beyond a millisecond it is no gap
GRAPH_LAUNCH_MAX_US = 1000.0  # a graph launch's t0 is a few µs, its host cost per node a fraction of one


def _cost(v: Any, hi: float = math.inf) -> bool:
    """A JSON number (not a boolean), finite, in [0, hi]; a Python int too large for a float is none."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v) and 0 <= v <= hi
    except OverflowError:
        return False


def load_calibration(path: str | None = None) -> Calibration:
    """The calibration in ``path`` (a ``gaptrace calibrate`` JSON), or the shipped default when None.
    ValueError, one line naming the file, when it is not a regular file (a FIFO would block the read), is over 1 MiB,
    cannot be read or parsed, or a cost is missing, negative, not finite or over 1 ms (``EVENT_COST_MAX_US``: the
    costs measured are 0.1–3 µs); ``queue_gap_us`` over 1 ms or a
    ``queue_gap_measured`` that is not true or false is refused too, and a ``graph_plain`` without its two launch
    figures (each 0 to 1 ms)."""
    p = path or DEFAULT_CALIBRATION
    try:
        st = os.stat(p)
    except OSError as e:
        raise ValueError(f"{p}: cannot read the calibration: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{p}: the calibration is not a regular file")
    if st.st_size > CALIBRATION_MAX_BYTES:
        raise ValueError(f"{p}: the calibration is {st.st_size:,} bytes, over the {CALIBRATION_MAX_BYTES:,} a "
                         "calibration file can be")
    try:
        with open(p, encoding="utf-8") as f:
            obj = json.load(f)
    except RecursionError:
        raise ValueError(f"{p}: cannot read the calibration: JSON nested too deep") from None
    except (OSError, ValueError) as e:
        raise ValueError(f"{p}: cannot read the calibration: {getattr(e, 'strerror', None) or e}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{p}: the calibration is not a JSON object")
    vals = {}
    for k in ("aten_op_us", "python_frame_us", "runtime_call_us"):
        v = obj.get(k)
        if not _cost(v, EVENT_COST_MAX_US):
            raise ValueError(f"{p}: calibration field {k} must be a number from 0 to {EVENT_COST_MAX_US:g} µs "
                             f"(got {str(v)[:40]!r})")
        vals[k] = float(v)
    for k in ("device_op_us", "graph_node_us"):  # optional: older files have neither
        d = obj.get(k, 0.0)
        if not _cost(d, EVENT_COST_MAX_US):
            raise ValueError(f"{p}: calibration field {k} must be a number from 0 to {EVENT_COST_MAX_US:g} µs "
                             f"(got {str(d)[:40]!r})")
        vals[k] = float(d)
    measured = obj.get("queue_gap_measured", True)
    if not isinstance(measured, bool):
        raise ValueError(f"{p}: calibration field queue_gap_measured must be true or false (got {str(measured)[:40]!r})")
    q = obj.get("queue_gap_us")
    if q is not None:  # optional: measured with CUDA only
        if not _cost(q, QUEUE_GAP_MAX_US):
            raise ValueError(f"{p}: calibration field queue_gap_us must be a number from 0 to {QUEUE_GAP_MAX_US:g} µs "
                             f"(got {str(q)[:40]!r})")
        if measured:
            vals["queue_gap_us"] = float(q)
    gp = obj.get("graph_plain")
    if gp is not None:  # optional: measured with CUDA only
        t0, node = (gp.get("graph_launch_t0_us"), gp.get("graph_launch_node_us")) if isinstance(gp, dict) else (0, 0)
        if not isinstance(gp, dict) or not _cost(t0, GRAPH_LAUNCH_MAX_US) or not _cost(node, GRAPH_LAUNCH_MAX_US):
            raise ValueError(f"{p}: calibration field graph_plain must hold graph_launch_t0_us and graph_launch_node_us, "
                             f"numbers from 0 to {GRAPH_LAUNCH_MAX_US:g} µs (got {str(gp)[:60]!r})")
        vals["graph_launch_t0_us"], vals["graph_launch_node_us"] = float(t0), float(node)
    on = obj.get("measured_on")
    if not isinstance(on, str):
        on = "; ".join(str(obj.get(k)) for k in ("cpu", "device", "torch") if obj.get(k) is not None) or "unknown"
    if len(on) > MEASURED_ON_MAX:  # a file's text reaches every output: a machine's description is short
        on = on[:MEASURED_ON_MAX] + "…"
    # the path and the file's text reach UTF-8 outputs: a lone surrogate (a byte that is no UTF-8 in a file name, a
    # "\udcff" escape in the JSON) is replaced here, where they come in
    return Calibration(**vals, source=clean_text(os.path.abspath(p)), measured_on=clean_text(on))


def sidecar_device_us(sidecar: "Sidecar | dict | None") -> dict[int, float]:
    """{graph node count: unprofiled device µs of one replay} from a capture sidecar
    (:meth:`gaptrace.sidecar.Sidecar.unprofiled_device_us`); {} without one."""
    side = as_sidecar(sidecar)
    return (side.unprofiled_device_us() or {}) if side is not None else {}


def sidecar_launch_us(sidecar: "Sidecar | dict | None") -> dict[int, float]:
    """{graph node count: unprofiled host launch cost µs} from a capture sidecar (typed :class:`gaptrace.sidecar.
    Sidecar` or its dict; :meth:`~gaptrace.sidecar.Sidecar.unprofiled_launch_us`: usable entries only, a later
    entry of one size replacing an earlier one); {} without one."""
    side = as_sidecar(sidecar)
    return (side.unprofiled_launch_us() or {}) if side is not None else {}


# the C primitive every threading wait ends in (Condition.wait, Queue.get, Event.wait, Thread.join, Semaphore,
# Lock): a python_function of the launching thread with this name that lasts is the thread blocked on another one
THREAD_WAIT_PREFIX = ("<built-in method acquire of _thread.lock", "<built-in method acquire of _thread.RLock")
THREAD_WAIT_MIN_US = 20.0


# torch.profiler's own Python code on the launching thread: ``profile.step()`` (the schedule's transitions, the
# ProfilerStep#N range) and the rest of torch/profiler/profiler.py. The unprofiled loop runs none of it.
PROFILER_FRAME_RE = r"(?:^|/)torch/profiler/profiler\.py\(\d+\): "


def _factor(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(uniques as a str array, codes (n,) int64) of ``values`` by hashing (pandas.factorize, first-seen order):
    np.unique's sort of millions of strings is the cost it avoids."""
    if len(values) == 0:
        return np.array([], dtype=str), np.zeros(0, dtype=np.int64)
    codes, uniq = pd.factorize(values)
    return np.asarray(uniq, dtype=str), codes.astype(np.int64)


def _factor_host(trace: Trace, column: str, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``_factor(trace.host_str(column)[rows])`` (rows: positions, a bool mask or None for all) from the column's
    categorical codes: hashing small ints, not millions of strings, and the same first-seen order, since distinct
    str categories are distinct strings. Falls back to the strings for a column that is not such a categorical."""
    col = trace.host[column]
    cats = col.cat.categories if isinstance(col.dtype, pd.CategoricalDtype) else None
    if cats is None or not all(isinstance(c, str) for c in cats):
        vals = trace.host_str(column)
        return _factor(vals if rows is None else vals[rows])
    codes = col.cat.codes.to_numpy()
    sub = codes if rows is None else codes[rows]
    if len(sub) == 0:
        return np.array([], dtype=str), np.zeros(0, dtype=np.int64)
    if (sub < 0).any():  # a missing value: its "nan" string may equal a category's
        vals = trace.host_str(column)
        return _factor(vals if rows is None else vals[rows])
    c, u = pd.factorize(sub)
    return np.asarray(cats.to_numpy(dtype=object)[u], dtype=str), c.astype(np.int64)


def name_codes(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """(names, codes): the distinct host event names (str array, first-seen order) and, per host row, the index of its name,
    so a name test runs once per distinct name; memoised on the trace (:meth:`gaptrace.trace.Trace.memo`)."""
    def build():
        return _factor_host(trace, "name")
    return trace.memo("host_name_codes", trace.host, build)


def profiler_frames(trace: Trace, model: ReplayModel) -> tuple[np.ndarray, np.ndarray]:
    """The merged intervals (starts, ends: µs from ``model.t0_us``, sorted, disjoint) of the launching thread's
    Python frames in torch.profiler's own module (:data:`PROFILER_FRAME_RE`: ``profile.step()`` and what it calls),
    host time the unprofiled loop does not spend (docs/DESIGN.md "The profiler taken out"); empty arrays for a
    trace recorded without stacks. Cached on the model."""
    cached = getattr(model, "_profiler_frames", None)
    if cached is not None:
        return cached
    h = trace.host
    sel = ((h["rank"].to_numpy() == model.key[0]) & trace.host_str_eq("tid", model.tid)
           & trace.host_str_eq("cat", "python_function"))
    rows = np.flatnonzero(sel)
    out = (np.zeros(0), np.zeros(0))
    if len(rows):
        uniq, codes = name_codes(trace)
        hit = pd.Series(uniq, dtype=object).str.contains(PROFILER_FRAME_RE, regex=True).to_numpy(dtype=bool)
        rows = rows[hit[codes[rows]]]
        if len(rows):
            out = _merge(h["ts_us"].to_numpy()[rows] - model.t0_us, h["end_us"].to_numpy()[rows] - model.t0_us)
    try:
        model._profiler_frames = out
    except AttributeError:
        pass
    return out


def _event_bins(trace: Trace, model: ReplayModel) -> dict[str, Any]:
    """Per category of the launching thread's recorded events (not the chain's calls, nor events inside
    torch.profiler's own frames, :func:`profiler_frames`, whose whole time goes): ``n_work`` / ``n_call``
    ((K, C) counts of events starting in the host work before call k / inside call k) and ``cats`` (C,); computed
    once per model (cached on it): the per-event costs only weight them."""
    cached = getattr(model, "_profiler_bins", None)
    if cached is not None:
        return cached
    h = trace.host
    sel = (h["rank"].to_numpy() == model.key[0]) & trace.host_str_eq("tid", model.tid)
    ts = h["ts_us"].to_numpy()[sel] - model.t0_us
    rows = np.flatnonzero(sel)
    chain = np.zeros(len(h), dtype=bool)
    chain[model.call_row] = True
    not_chain = ~chain[rows]
    ps, pe = profiler_frames(trace, model)
    if len(ps):
        j = np.searchsorted(ps, ts, side="right") - 1
        not_chain &= ~((j >= 0) & (ts < pe[np.maximum(j, 0)]))
    s, e = model.call_start_us, model.call_end_us
    K = model.calls
    # boundaries s0 e0 s1 e1 ...: an odd position is inside call (pos-1)//2, an even one the work before call pos//2
    bounds = np.empty(2 * K)
    bounds[0::2], bounds[1::2] = s, e
    pos = np.searchsorted(bounds, ts, side="right")
    in_call = (pos % 2 == 1) & not_chain
    in_work = (pos % 2 == 0) & (pos // 2 < K) & not_chain & (pos > 0)
    uc, ci = _factor_host(trace, "cat", sel)
    n_work = np.zeros((K, len(uc)))
    n_call = np.zeros((K, len(uc)))
    np.add.at(n_work, (pos[in_work] // 2, ci[in_work]), 1.0)
    np.add.at(n_call, ((pos[in_call] - 1) // 2, ci[in_call]), 1.0)
    out = {"cats": [str(c) for c in uc], "n_work": n_work, "n_call": n_call}
    try:
        model._profiler_bins = out
    except AttributeError:
        pass
    return out


def _event_costs(cats: np.ndarray, calibration: Calibration) -> np.ndarray:
    """(n,) µs per recorded event of category ``cats[i]`` (:data:`COST_KEYS`; 0 for other categories)."""
    if len(cats) == 0:
        return np.zeros(0)
    uniq, inv = _factor(cats)
    return np.array([calibration.cost_of(c) for c in uniq], dtype=np.float64)[inv]


def thread_wait_cost(trace: Trace, model: ReplayModel, calibration: Calibration, scale: float = 1.0
                     ) -> np.ndarray:
    """(K,) µs of other threads' profiler cost that the launching thread waited out in the host work before each
    call: for each wait of the launching thread on a lock (:data:`THREAD_WAIT_PREFIX`, at least
    :data:`THREAD_WAIT_MIN_US` long: Condition.wait, Queue.get, Thread.join end there), Σ cost_c × scale over the
    recorded events of the same rank's other threads that start inside it, at most the wait's length. The waited-for
    thread's work is inflated by its own recorded events; the waiter's wait shrinks by as much
    (docs/DESIGN.md "The profiler taken out")."""
    K = model.calls
    out = np.zeros(K)
    w = _thread_waits(trace, model)
    if w is None:
        return out
    cvec = np.array([calibration.cost_of(c) for c in w["cats"]], dtype=np.float64) * scale
    per_wait = np.minimum(w["counts"] @ cvec, w["we"] - w["ws"])
    np.add.at(out, w["k"], per_wait)
    return out


# frames in which a Python thread waits with the GIL released (time.sleep, lock waits, select/poll on sockets and
# pipes): another thread's time inside them is no Python work that competes with the launching thread
GIL_RELEASING_PREFIX = ("<built-in function sleep>", *THREAD_WAIT_PREFIX, "<built-in function select>",
                        "<built-in method poll", "<built-in method select", "<built-in method recv",
                        "<built-in method read")


def lock_waits_in(model: ReplayModel, trace: Trace, us: np.ndarray, ue: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The launching thread's lock waits (:func:`_thread_waits`) inside the merged intervals [us, ue) (µs from t0),
    merged; empty arrays without any."""
    w = _thread_waits(trace, model)
    if w is None or not len(us):
        return np.zeros(0), np.zeros(0)
    return _intersect(us, ue, *_merge(np.asarray(w["ws"], dtype=np.float64), np.asarray(w["we"], dtype=np.float64)))


def gil_held_in_waits(trace: Trace, model: ReplayModel, ws: np.ndarray, we: np.ndarray,
                      unprofiled_wait_us: np.ndarray) -> np.ndarray:
    """(K,) µs per host work interval of the Python work other threads of the rank did while the launching thread
    waited on them in the merged lock waits [ws, we) (µs from t0; :func:`lock_waits_in`): what a fix that stops the
    wait still pays, since that work then runs beside the launching thread and holds the GIL it needs (DESIGN.md 5.5
    "A wait on another thread"). ``unprofiled_wait_us`` (K,): the replay's unprofiled µs of those waits in each
    interval (the measured range where the capture timed one). The waited-for thread's time splits into Python work
    (inflated by the profiler) and time in frames that release the GIL (:data:`GIL_RELEASING_PREFIX`: sleeps, lock
    and socket waits, which the profiler does not stretch); so per other thread, with F_k the share of the waits
    its Python frames cover and R_k the µs of its GIL-releasing frames in them, the held work is
    max(0, unprofiled_wait_k · F_k − R_k); summed over threads, at most ``unprofiled_wait_us``."""
    K = model.calls
    out = np.zeros(K)
    if not len(ws):
        return out
    h = trace.host
    tid = trace.host_str("tid")
    other = np.flatnonzero((h["rank"].to_numpy() == model.key[0]) & (tid != model.tid)
                           & trace.host_str_eq("cat", "python_function"))
    if not len(other):
        return out
    ts = h["ts_us"].to_numpy()[other] - model.t0_us
    te = h["end_us"].to_numpy()[other] - model.t0_us
    un, ni = _factor_host(trace, "name", other)
    releases = pd.Series(un, dtype=object).str.startswith(GIL_RELEASING_PREFIX).to_numpy(dtype=bool)[ni]
    s, e = model.call_start_us, model.call_end_us
    a = np.concatenate(([s[0]], e[:-1]))
    waited = _coverage(ws, we, a, s)
    otid = tid[other]
    for t in np.unique(otid):
        on = otid == t
        fs, fe = _intersect(*_merge(ts[on], te[on]), ws, we)
        if not len(fs):
            continue
        cover = np.divide(_coverage(fs, fe, a, s), waited, out=np.zeros(K), where=waited > 0)
        rel = on & releases
        released = _coverage(*_intersect(*_merge(ts[rel], te[rel]), ws, we), a, s) if rel.any() else 0.0
        out += np.maximum(unprofiled_wait_us * cover - released, 0.0)
    return np.minimum(out, unprofiled_wait_us)


def _thread_waits(trace: Trace, model: ReplayModel) -> dict[str, Any] | None:
    """The launching thread's lock waits (merged, at least :data:`THREAD_WAIT_MIN_US`): ``ws`` / ``we`` (µs from
    t0), ``k`` (the call whose host work holds each), ``counts`` ((W, C): the other threads' recorded events of each
    category starting inside each wait), ``cats``; None without any. Cached on the model."""
    if hasattr(model, "_thread_waits"):
        return model._thread_waits
    h = trace.host
    K = model.calls
    res = None
    rank = h["rank"].to_numpy() == model.key[0]
    tid = trace.host_str("tid")
    on = rank & (tid == model.tid) & trace.host_str_eq("cat", "python_function")
    w = np.flatnonzero(on)
    if len(w):
        uniq, inv = _factor_host(trace, "name", w)
        is_wait = pd.Series(uniq, dtype=object).str.startswith(THREAD_WAIT_PREFIX).to_numpy(dtype=bool)
        w = w[is_wait[inv]]
    if len(w):
        ws = h["ts_us"].to_numpy()[w] - model.t0_us
        we = h["end_us"].to_numpy()[w] - model.t0_us
        keep = (we - ws) >= THREAD_WAIT_MIN_US
        ws, we = _merge(ws[keep], we[keep])
        # each wait sits in the host work before the first call that starts after it began
        k = np.searchsorted(model.call_start_us, ws, side="left")
        ok = k < K
        ws, we, k = ws[ok], we[ok], k[ok]
        if len(ws):
            other = rank & (tid != model.tid)
            ots = h["ts_us"].to_numpy()[other] - model.t0_us
            j = np.searchsorted(ws, ots, side="right") - 1
            inside = (j >= 0) & (ots < we[np.maximum(j, 0)])
            uc, ci = _factor_host(trace, "cat", other)
            counts = np.zeros((len(ws), len(uc)))
            np.add.at(counts, (j[inside], ci[inside]), 1.0)
            res = {"ws": ws, "we": we, "k": k, "counts": counts, "cats": [str(c) for c in uc]}
    try:
        model._thread_waits = res
    except AttributeError:
        pass
    return res


def _starts_inside(us: np.ndarray, ue: np.ndarray, t: np.ndarray) -> np.ndarray:
    """(len(t),) bool: t inside one of the sorted, disjoint intervals [us, ue)."""
    if not len(us):
        return np.zeros(len(t), dtype=bool)
    i = np.searchsorted(us, t, side="right") - 1
    return (i >= 0) & (t < ue[np.maximum(i, 0)])


def measured_period(sidecar: "Sidecar | dict | None") -> tuple[float | None, str | None]:
    """The capture's own measured unprofiled period, µs, and which rounds it measured, in this order of preference
    (DESIGN.md 5.3): the profiled rounds' positions decoded unprofiled (the sidecar's ``unprofiled_same_rounds_ms``:
    "profiled_positions"), the warm-up rounds (``unprofiled_round_ms``: "warmup_rounds"), the warm-up steps of
    :class:`gaptrace.capture.Capture` (``unprofiled_step_ms``: "warmup_steps"); each the median of its usable values.
    (None, None) without one. Two figures of different sources are of different rounds."""
    side = as_sidecar(sidecar)
    if side is None:
        return None, None
    if side.same_rounds_ms is not None:
        return side.same_rounds_ms * 1e3, "profiled_positions"
    if side.unprofiled_round_ms is not None:
        return side.unprofiled_round_ms * 1e3, "warmup_rounds"
    v = (side.raw or {}).get("unprofiled_step_ms")
    ms = median_period_ms(v) if isinstance(v, list) else None
    return (ms * 1e3, "warmup_steps") if ms is not None else (None, None)


def measured_period_source(sidecar: "Sidecar | dict | None") -> str | None:
    """Which rounds :func:`measured_period_us` measured (:func:`measured_period`'s source), or None."""
    return measured_period(sidecar)[1]


def measured_period_us(sidecar: "Sidecar | dict | None") -> float | None:
    """The capture's own measured unprofiled period, µs (:func:`measured_period`'s value), or None."""
    return measured_period(sidecar)[0]


BLOCKED_RANGE_WAIT_SHARE = 0.1  # a range whose blocking calls waited at most this share of its time is set too


def measured_ranges(trace: Trace, model: ReplayModel, sidecar: "Sidecar | dict | None", work_us: np.ndarray,
                    cost_us: np.ndarray, window: tuple[float, float] | None = None,
                    item_dur_us: np.ndarray | None = None, item_gap_us: np.ndarray | None = None
                    ) -> tuple[np.ndarray, np.ndarray, dict[str, dict[str, Any]]]:
    """The host work inside the NVTX ranges the capture timed unprofiled (sidecar ``unprofiled_ranges``), set to
    what was measured (DESIGN.md 5.2 "Measured ranges"). For a range R on the launching thread with measured mean
    m_R µs per occurrence and n occurrences j inside ``window`` (trace clock; the whole trace when None), occurrence
    j is given T_j = n·m_R · p_j / Σ p (p_j its profiled length: the measured total spread over the occurrences as
    the profiled run spread it). Its calls keep their modeled cost C_j (all scaled by T_j / C_j when that is less),
    and the rest, T_j − C_j, replaces the modeled host work inside it, spread over its host work intervals in
    proportion to their profiled µs: the range's time is set, not scaled from the residue of subtracting the
    per-event costs, which can be zero (a range of thousands of recorded Python frames) or swing by the profiler's
    own jitter from one occurrence to the next. Each range replaces its part of an interval at the interval's rate
    before any range was set, so ranges that share an interval do not take from each other. The occurrences are
    the merged ones (a name nested in itself is one, as the capture times only the outermost block). Occurrences
    with neither host work nor calls take no share. A range whose calls block holds their waits in its measured
    time, which the replay derives: it is set only when ``item_dur_us`` (the unprofiled device durations) is given
    and its blocking calls waited little, both in the profiled trace and in a replay of ``work_us`` / ``cost_us``
    (together at most :data:`BLOCKED_RANGE_WAIT_SHARE` of its measured time: the device was done before the host
    got there, as in a host-bound loop), and it was measured no longer than profiled (the profiler only adds host
    time: a longer one waited longer unprofiled); then each T_j less the replay's wait inside occurrence j.
    Otherwise it is left as modeled. It is also left as modeled when it holds another range applied here (innermost
    first: the outer one's measurement holds the inner one's), when its measured time a round exceeds the capture's
    measured unprofiled round (no time of this loop), or when it is not on the launching thread.

    ``work_us`` / ``cost_us``: (K,) the unprofiled inputs after the calibration's costs. Returns (work, cost, {name:
    {"measured_us_per_round", "modeled_us_per_round", "applied", "why", "scale" (Σ T_j over the modeled time, when
    applied)}}, the applied ranges as [(merged starts, ends (µs from t0), unprofiled host work per profiled µs of
    host work inside each merged occurrence)], disjoint: what :func:`site_share` needs), per round = per occurrence
    × ``per_round``."""
    side = as_sidecar(sidecar)
    work, cost = np.asarray(work_us, dtype=np.float64).copy(), np.asarray(cost_us, dtype=np.float64).copy()
    info: dict[str, dict[str, Any]] = {}
    if side is None or not side.unprofiled_ranges or not model.calls:
        return work, cost, info, []
    h = trace.host
    on = (trace.host_str_eq("cat", "user_annotation") & (h["rank"].to_numpy() == model.key[0])
          & trace.host_str_eq("tid", model.tid))
    if window is not None:
        ts = h["ts_us"].to_numpy()
        on = on & (ts >= window[0]) & (ts < window[1])
    names = trace.host_str("name")
    s, e = model.call_start_us, model.call_end_us
    a = np.concatenate(([s[0]], e[:-1]))  # host work interval k: [e_{k-1}, s_k]
    found = []
    for name, r in side.unprofiled_ranges.items():
        m = on & (names == name)
        row = {"measured_us_per_round": r.mean_us * r.per_round, "modeled_us_per_round": None,
               "applied": False, "why": None}
        info[name] = row
        if not m.any():
            row["why"] = "not on the launching thread inside the rounds"
            continue
        us, ue = _merge(h["ts_us"].to_numpy()[m] - model.t0_us, h["end_us"].to_numpy()[m] - model.t0_us)
        found.append((float(np.sum(ue - us)), name, us, ue, int(m.sum()), r))
    applied: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    # the unprofiled work per profiled µs of each host work interval before any range is set: each range replaces
    # only its own part of an interval, whatever another range did to the rest of it
    rate = np.divide(work, model.work_us, out=np.zeros(len(s)), where=model.work_us > 0)
    period_us = measured_period_us(side)
    waited_rep = waited_prof = None
    if item_dur_us is not None and found and model.blocking.any():
        from .replay import replay
        rep = replay(model, work, cost, item_dur_us=item_dur_us, item_gap_us=item_gap_us)
        # the wait of each blocking call: its span beyond its own cost (the replay's, and the profiled trace's)
        waited_rep = np.where(model.blocking, np.maximum(rep.call_end_us - rep.call_start_us - cost, 0.0), 0.0)
        waited_prof = np.where(model.blocking, np.maximum(e - s - model.cost_us, 0.0), 0.0)
    for _span, name, us, ue, _n_events, r in sorted(found, key=lambda x: x[0]):  # innermost (shortest) first
        row = info[name]
        n = len(us)  # occurrences: a name nested in itself is one occurrence, as the capture times it
        inside = _starts_inside(us, ue, s)
        occ = np.searchsorted(us, s, side="right") - 1  # the merged occurrence a call starts in (where inside)
        # per occurrence: profiled µs of host work inside it, the modeled unprofiled work there, its calls' cost
        length_j = _coverage(a, s, us, ue)
        modeled_work_j = _coverage(a, s, us, ue, weights=rate)
        cost_j = np.bincount(occ[inside], weights=cost[inside], minlength=len(us))
        modeled = float(modeled_work_j.sum() + cost_j.sum())
        row["modeled_us_per_round"] = modeled / n * r.per_round
        row["occurrences"] = n
        # checked first: a time no round of this loop can hold says more than any other reason
        if period_us is not None and r.mean_us * r.per_round > period_us:
            row["why"] = (f"its measured time a round ({r.mean_us * r.per_round:,.0f} µs) exceeds the measured "
                          f"unprofiled round ({period_us:,.0f} µs): not a time of this loop")
            continue
        wait_j = np.zeros(len(us))
        if model.blocking[inside].any():
            blocked = inside & model.blocking
            total = r.mean_us * n
            if waited_rep is None or max(waited_rep[blocked].sum(), waited_prof[blocked].sum()) > (
                    BLOCKED_RANGE_WAIT_SHARE * total):
                row["why"] = "a call inside it blocks: its measured time holds the wait, which the replay derives"
                continue
            if total > float(np.sum(ue - us)):
                # the profiler only adds host time: a blocking range measured longer than profiled waited longer
                row["why"] = ("a call inside it blocks and it was measured longer than profiled: its measured time "
                              "holds waits the profiled run did not have, which the replay derives")
                continue
            # the device was done before the host got there: the measured time is host time but for the replay's
            # own (small) waits, which it derives again
            wait_j = np.bincount(occ[blocked], weights=waited_rep[blocked], minlength=len(us))
            row["waits_us_per_round"] = float(wait_j.sum()) / n * r.per_round
        if any(_starts_inside(us, ue, inner_s).any() for inner_s, _inner_e, _k in applied):
            row["why"] = "it holds a range whose measured time is used: its own measurement holds that one's"
            continue
        has = (length_j > 0) | (cost_j > 0)
        if not has.any():
            row["why"] = "no host time inside it to set"
            continue
        p = np.where(has, ue - us, 0.0)
        target = np.maximum(r.mean_us * n * p / p.sum() - wait_j, 0.0)
        call_scale = np.minimum(1.0, np.divide(target, cost_j, out=np.ones(len(us)), where=cost_j > 0))
        rest = np.maximum(target - cost_j, 0.0)
        density = np.divide(rest, length_j, out=np.zeros(len(us)), where=length_j > 0)
        # interval k: its modeled work inside the occurrences out, each occurrence's density × its µs there in
        work = np.maximum(work - rate * _coverage(us, ue, a, s) + _coverage(us, ue, a, s, weights=density), 0.0)
        cost[inside] *= call_scale[occ[inside]]
        row["applied"] = True
        row["scale"] = float(target.sum() / modeled) if modeled > 0 else None
        applied.append((us, ue, density))
    return work, cost, info, applied


def unprofiled_inputs(trace: Trace, model: ReplayModel, calibration: Calibration,
                      sidecar: dict | None = None, kappa_us_per_node: float | None = None,
                      scale: float = 1.0, window: tuple[float, float] | None = None) -> dict[str, Any]:
    """``work_us`` and ``cost_us`` ((K,) arrays for :func:`gaptrace.analyses.replay.replay`) and ``item_dur_us``
    ((I,): each item less ``device_op_us`` per op, or, for a graph replay whose size the sidecar timed unprofiled,
    min(its profiled span, the sidecar's ``unprofiled_device_us``): ``device_source`` says which) with the profiler's
    host cost subtracted (module docstring), ``item_gap_us`` ((I,): each item's queued-launch gap q_i: the model's,
    except that an eager item the trace never showed queued takes the calibration's ``queue_gap_us`` when it has one;
    ``queue_gap_source``: calibration | trace), plus ``removed_us`` (a dict: the µs taken out per source over the whole
    trace: events per category, graph launches) and ``kappa_us_per_node`` / ``launch_source`` (sidecar | kappa |
    calibration | none) for each graph launch size. κ is fitted on ``trace`` when not given. ``scale`` multiplies every
    per-event host cost of the calibration (not ``device_op_us``, a device figure the calibration measures directly,
    nor the sidecar's measured launch costs, nor κ): the factor fitted to the capture's own unprofiled rounds
    (:func:`gaptrace.analyses.whatif.fit_profiler_scale`)."""
    s, e = model.call_start_us, model.call_end_us
    K = model.calls
    b = _event_bins(trace, model)
    cvec = np.array([calibration.cost_of(c) for c in b["cats"]], dtype=np.float64) * scale
    work_cost = b["n_work"] @ cvec
    call_cost = b["n_call"] @ cvec
    # the profiler's own buffer handling (Kineto "overhead" events: Buffer Flush, Activity Buffer Request) runs
    # on the host inside whatever the thread was doing: its overlap with each interval goes too
    ov = trace.overhead
    ov = ov[ov["rank"].to_numpy() == model.key[0]] if "rank" in ov else ov
    ov_work = np.zeros(K)
    ov_call = np.zeros(K)
    a = np.concatenate(([s[0]], e[:-1]))
    ps, pe = profiler_frames(trace, model)
    pf_work = _coverage(ps, pe, a, s) if len(ps) else np.zeros(K)
    if len(ov) or len(ps):
        # Kineto's overhead events and torch.profiler's own frames, as one union (an overlap counted once)
        us, ue = _merge(np.concatenate((ov["ts_us"].to_numpy() - model.t0_us, ps)),
                        np.concatenate((ov["end_us"].to_numpy() - model.t0_us, pe)))
        ov_work = _coverage(us, ue, a, s)
        ov_call = _coverage(us, ue, s, e)
    waited = thread_wait_cost(trace, model, calibration, scale)
    work = np.maximum(model.work_us - work_cost - ov_work - waited, 0.0)
    removed: dict[str, float] = {}
    for j, c in enumerate(b["cats"]):
        removed[str(c)] = float((b["n_work"][:, j].sum() + b["n_call"][:, j].sum()) * cvec[j])
    cost = model.cost_us.copy()
    launch = model.graph_nodes > 0
    by_size = sidecar_launch_us(sidecar)
    if kappa_us_per_node is None and launch.any():
        fit = launch_fit(trace)
        kappa_us_per_node = fit.kappa_us_per_node if fit is not None else None
    kappa = float(kappa_us_per_node) if kappa_us_per_node is not None and kappa_us_per_node > 0 else 0.0
    # no κ from the trace (one graph size, or a flat fit): the calibration's κ, measured directly on its machine
    kappa_source = "kappa" if kappa else ("calibration" if calibration.graph_node_us > 0 else "none")
    kappa_used = kappa or calibration.graph_node_us
    sources = {}
    new_launch = np.zeros(K)
    for k in np.flatnonzero(launch):
        n = int(model.graph_nodes[k])
        if n in by_size:
            new_launch[k] = by_size[n]
            sources[n] = "sidecar"
        else:
            new_launch[k] = max(0.0, cost[k] - kappa_used * n - calibration.runtime_call_us * scale)
            sources.setdefault(n, kappa_source)
    other = ~launch
    new_cost = np.where(other, np.maximum(cost - calibration.runtime_call_us * scale - call_cost - ov_call, 0.0),
                        new_launch)
    removed["graph_launches"] = float((cost - new_cost)[launch].sum())
    removed["runtime_calls"] = float((cost - new_cost)[other].sum())
    removed["host_work"] = float((model.work_us - work).sum())
    removed["profiler_overhead_events"] = float(ov_work.sum() - pf_work.sum() + ov_call[other].sum())
    removed["profiler_step_frames"] = float(pf_work.sum())
    removed["other_threads_waited"] = float(waited.sum())
    # device: each traced op's extra device time, out of its item's duration (never below the ops' own busy time
    # less that cost); a graph replay whose unprofiled device span the capture timed takes that span instead (never
    # longer than the profiled one: the profiler only adds)
    warnings: list[str] = []
    n_ops = np.bincount(model.op_item, minlength=len(model.item_call)).astype(np.float64)
    item_nodes = np.where(model.item_call >= 0, model.graph_nodes[np.maximum(model.item_call, 0)], 0)  # 0: eager
    item_dur = np.maximum(model.item_dur_us - n_ops * calibration.device_op_us, 0.0)
    dev_by_size = sidecar_device_us(sidecar)
    device_source = "calibration"
    if dev_by_size and len(model.item_call):
        item_graph = (item_nodes > 0) & ~model.item_prior
        timed = np.array([dev_by_size.get(int(n), np.nan) for n in item_nodes[item_graph]], dtype=np.float64)
        ok = np.isfinite(timed)
        idx = np.flatnonzero(item_graph)[ok]
        item_dur[idx], long_replays = _timed_graph_durations(model.item_dur_us[idx], item_nodes[idx], timed[ok])
        if long_replays:
            warnings.append(long_replays)
        device_source = "sidecar" if len(idx) else device_source
    removed["device_ops"] = float((model.item_dur_us - item_dur).sum())
    # queued-launch gaps: an eager item the trace never showed queued has no gap of its own; where a change lets it
    # queue, it takes the calibration's measured unprofiled gap (the trace's median q of queued items is often only
    # cuBLAS's split-K pairs, which overlap), else the trace's q
    item_gap = model.item_gap_us
    gap_source = "trace"
    if calibration.queue_gap_us is not None and len(item_gap) and model.item_queued is not None:
        eager = ~model.item_prior & (item_nodes == 0)
        item_gap = np.where(eager & ~model.item_queued, calibration.queue_gap_us, item_gap)
        gap_source = "calibration"
    # the ranges the capture timed without the profiler take their measured host time (measured_ranges)
    before = float(work.sum() + new_cost.sum())
    base_work = work
    work, new_cost, ranges, applied = measured_ranges(trace, model, sidecar, work, new_cost, window, item_dur,
                                                      item_gap)
    removed["measured_ranges"] = before - float(work.sum() + new_cost.sum())
    return {"work_us": work, "cost_us": new_cost, "item_dur_us": item_dur, "item_gap_us": item_gap,
            "queue_gap_source": gap_source, "removed_us": removed, "kappa_us_per_node": kappa or None,
            "launch_source": {str(k): v for k, v in sorted(sources.items())}, "device_source": device_source,
            "measured_ranges": ranges, "measured_scale": (base_work, applied), "warnings": warnings}


def site_share(model: ReplayModel, us: np.ndarray, ue: np.ndarray, work_us: np.ndarray,
               measured: tuple[np.ndarray, list] | None = None) -> np.ndarray:
    """(K,) the share of each host work interval's unprofiled work ``work_us`` that the merged site intervals
    [us, ue) (µs from t0) hold. Without measured ranges it is the site's share of the interval's profiled length,
    o_k / work_k (the profiler's cost spread evenly); with them (``measured``: the unprofiled inputs'
    ``measured_scale``, (the work before :func:`measured_ranges`, its applied ranges)) the site's part is b_k · o_k +
    Σ_R Σ_j (d_{R,j} − b_k) · |site ∩ occurrence j of R ∩ interval k|, with b_k the interval's unprofiled work per
    profiled µs before the ranges and d_{R,j} the density the range's occurrence j was given, over
    ``work_us``: a measured range's time counts as measured."""
    s, e = model.call_start_us, model.call_end_us
    a = np.concatenate(([s[0]], e[:-1]))
    o = _coverage(us, ue, a, s)
    if measured is None or not measured[1]:
        return np.clip(np.divide(o, model.work_us, out=np.zeros_like(o), where=model.work_us > 0), 0.0, 1.0)
    base, applied = measured
    rate = np.divide(base, model.work_us, out=np.zeros_like(o), where=model.work_us > 0)
    part = rate * o
    for rs, re_, density in applied:
        i_s, i_e = _intersect(us, ue, rs, re_)
        if not len(i_s):
            continue
        # each piece of the site inside the range lies in one merged occurrence j, whose work runs at density_j
        j = np.clip(np.searchsorted(rs, i_s, side="right") - 1, 0, len(rs) - 1)
        part += _coverage(i_s, i_e, a, s, weights=np.asarray(density, dtype=np.float64)[j]) \
            - rate * _coverage(i_s, i_e, a, s)
    return np.clip(np.divide(part, work_us, out=np.zeros_like(o), where=work_us > 0), 0.0, 1.0)


LONG_REPLAY_FACTOR = 2.0  # a replay over twice its size's median profiled span is the workload's (or an edit)


def _timed_graph_durations(profiled_us: np.ndarray, nodes: np.ndarray, timed_us: np.ndarray
                           ) -> tuple[np.ndarray, str | None]:
    """Unprofiled device durations of graph replays whose size the capture timed unprofiled (DESIGN.md 5.2).
    ``profiled_us`` (n,) each replay's profiled span, ``nodes`` (n,) its CUDA graph node count, ``timed_us`` (n,)
    the sidecar's unprofiled span for that size. The profiler's device cost of a size is what its typical replay
    loses: c_N = max(median profiled span of size N − timed_N, 0); a replay becomes min(p, max(p − c_N, timed_N)):
    the typical one the timed span, one that ran long (a stall, a hand-edited op) keeps its excess over the
    typical one rather than being cut to the timed span, since the profiler cannot add more than it adds to every
    replay of that size. Returns (durations (n,), one warning line or None for replays over ``LONG_REPLAY_FACTOR``
    × their size's median)."""
    out = np.minimum(profiled_us, timed_us)
    if not len(profiled_us):
        return out, None
    sizes, inv = np.unique(nodes, return_inverse=True)
    med = np.array([np.median(profiled_us[inv == j]) for j in range(len(sizes))])[inv]
    c = np.maximum(med - timed_us, 0.0)
    out = np.minimum(profiled_us, np.maximum(profiled_us - c, timed_us))
    long_ = profiled_us > LONG_REPLAY_FACTOR * med
    if not long_.any():
        return out, None
    j = int(np.argmax(np.where(long_, profiled_us / np.maximum(med, 1e-9), -np.inf)))
    return out, (f"{int(long_.sum())} CUDA graph replays ran over {LONG_REPLAY_FACTOR:g}x their size's median "
                 f"profiled device span (the longest {profiled_us[j]:,.1f} µs against {med[j]:,.1f} µs for "
                 f"{int(nodes[j])} nodes): kept as measured less the profiler's cost per replay of that size, not "
                 "cut to the unprofiled timing (a device stall or an edited trace, not the profiler)")
