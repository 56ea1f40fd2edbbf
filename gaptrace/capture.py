"""Capture a steady-state torch.profiler trace of any step loop, plus the ``TRACE.gaptrace.json`` sidecar.

    from gaptrace.capture import Capture
    with Capture("decode.json.gz", warmup_steps=5, active_steps=20, config={"model": "my-model"}) as cap:
        for batch in loader:
            run_one_step(batch)
            cap.step()

The profiler is armed only after ``warmup_steps`` unprofiled steps (graph capture, compile and allocator warm-up
stay out of the trace) and one discarded profiler warm-up step; then ``active_steps`` steps are recorded with Python
stacks (``with_stack=True``) and, where the installed torch supports it, CUDA sync events
(``_ExperimentalConfig(enable_cuda_sync_events=True)``). The unprofiled step periods (wall time from one ``step()``
to the next, no device sync added) are kept in the sidecar so the profiler's own cost can be measured against them.

Outputs are written to a temporary name in the target directory and renamed, so a crash leaves nothing half-written;
both outputs (trace and sidecar) pass :func:`gaptrace.outputs.resolve_output` when the :class:`Capture` is made, before
any step runs. A write that fails (ENOSPC, ...) removes its temporaries and raises OSError naming the output.
torch is imported here only; the analysis side of gaptrace never needs it.
"""
from __future__ import annotations

import gzip
import json
import math
import os
import shutil
import stat
import tempfile
import time
from typing import Any

from gaptrace.outputs import discard, resolve_output, set_output_mode, write_text_atomic

__all__ = ["Capture", "sidecar_path", "write_json_atomic", "read_sidecar", "read_sidecar_checked", "sidecar_problem",
           "load_sidecar_checked", "sidecar_field_problems", "positive_number", "usable_tau"]

SIDECAR_SUFFIX = ".gaptrace.json"


def sidecar_path(trace_path: str) -> str:
    """``run.json.gz`` -> ``run.gaptrace.json`` (next to the trace)."""
    base = trace_path
    for suffix in (".json.gz", ".json", ".gz"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    return base + SIDECAR_SUFFIX


def write_json_atomic(path: str, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` via a temporary file in the same directory and ``os.replace``."""
    write_text_atomic(path, json.dumps(obj, indent=1, sort_keys=True, default=str))


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
    (Whether that name occurs in a trace needs the trace: the caller checks it.)"""
    if not isinstance(obj, dict):
        kind = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean"}
        return f"not a JSON object ({kind.get(type(obj), 'null')})"
    w = obj.get("analysis_window")
    if w is not None and (not isinstance(w, str) or not w):
        return f"its analysis_window is {json.dumps(w)[:60]}, not an annotation name"
    return None


# what a capture writes is far inside these; outside them a number is a corrupt or hostile sidecar, and its
# arithmetic (a mean of 1e308s, TPOT over a τ of 1e-320) would overflow into inf or NaN
SIDECAR_MAX_NUMBER = 1e12   # round times (ms), launch costs (µs), node counts
SIDECAR_MIN_NUMBER = 1e-9
TAU_MAX = 1e6                # tokens accepted in one round
TAU_MIN_NONZERO = 1e-6
SIDECAR_MAX_BYTES = 64 * 10 ** 6


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


def sidecar_field_problems(obj: dict) -> list[str]:
    """The fields of a usable sidecar (:func:`sidecar_problem` passed) that the analyses will skip, each as
    ``name (why)``: ``unprofiled_round_ms`` not a positive number (or a list of them), a ``rounds[i].tau`` not a
    finite number >= 0 (an empty list too), a ``graphs[i]`` without positive ``nodes`` and ``unprofiled_launch_us`` (null allowed: no
    unprofiled launch), ``rounds`` or ``graphs`` not a list. Empty when every field present is usable; the caller
    says what was skipped (one warning line), since a skipped field silently drops a figure (τ, TPOT, the
    profiler check, the launch fit's unprofiled points)."""
    out: list[str] = []
    u = obj.get("unprofiled_round_ms")
    if u is not None:
        if isinstance(u, list) and not u:  # no unprofiled round: the profiler-cost check has nothing to compare
            out.append("unprofiled_round_ms (an empty list)")
        elif isinstance(u, list):
            out += [f"unprofiled_round_ms[{i}] (not a positive number)" for i, v in enumerate(u) if not positive_number(v)]
        elif not positive_number(u):
            out.append("unprofiled_round_ms (not a positive number)")
    for key in ("rounds", "graphs"):
        if key in obj and not isinstance(obj[key], list):
            out.append(f"{key} (not a list)")
    for i, r in enumerate(obj.get("rounds") if isinstance(obj.get("rounds"), list) else []):
        t = r.get("tau") if isinstance(r, dict) else r
        if not usable_tau(t):  # a round without τ drops out of the τ mean: say so
            out.append(f"rounds[{i}].tau (missing, or not a finite number >= 0)")
    for i, g in enumerate(obj.get("graphs") if isinstance(obj.get("graphs"), list) else []):
        us = g.get("unprofiled_launch_us") if isinstance(g, dict) else None
        if not isinstance(g, dict) or not positive_number(g.get("nodes")) or not (us is None or positive_number(us)):
            out.append(f"graphs[{i}] (needs positive nodes and unprofiled_launch_us)")
    return out


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


def _export_gz_atomic(prof: Any, path: str) -> None:
    """Export the profiler's Chrome trace to ``path`` (gzipped when it ends in .gz), atomically."""
    d = os.path.dirname(os.path.abspath(path))
    fd, raw = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=".json")
    os.close(fd)
    gz_tmp = None
    try:
        prof.export_chrome_trace(raw)
        if path.endswith(".gz"):
            fd, gz_tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=".json.gz")
            with os.fdopen(fd, "wb") as out, open(raw, "rb") as src, gzip.GzipFile(fileobj=out, mode="wb",
                                                                                  compresslevel=6) as gz:
                shutil.copyfileobj(src, gz, 1 << 20)
            set_output_mode(gz_tmp, path)
            os.replace(gz_tmp, path)
            gz_tmp = None
        else:
            set_output_mode(raw, path)
            os.replace(raw, path)
            raw = None
    finally:
        discard(raw, gz_tmp)


def profiler_kwargs(with_stack: bool = True) -> dict[str, Any]:
    """torch.profiler.profile keyword arguments gaptrace captures with (CPU + CUDA when available, stacks,
    CUDA sync events where this torch supports them)."""
    import torch
    from torch.profiler import ProfilerActivity

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    kw: dict[str, Any] = {"activities": activities, "with_stack": with_stack, "record_shapes": False}
    try:
        kw["experimental_config"] = torch.profiler._ExperimentalConfig(enable_cuda_sync_events=True)
    except (AttributeError, TypeError):  # older torch: no cuda_sync events, the analyses fall back to API calls
        pass
    return kw


class Capture:
    """Context manager: skip ``warmup_steps``, discard one profiler warm-up step, record ``active_steps``.

    Call :meth:`step` once at the end of every step. After the last active step the trace and the sidecar are
    written (``path`` and :func:`sidecar_path` of it); later ``step()`` calls are no-ops. ``config`` (any
    JSON-able dict) and ``extra`` (set by callers such as the runtime's capture: graphs, rounds) go into the sidecar.

    Both outputs are checked here, before any step (:func:`gaptrace.outputs.resolve_output`: a missing or
    unwritable directory, a directory/device/FIFO at the path, or one of ``inputs`` raises ValueError, one line);
    symlinks are followed (``trace_out``/``sidecar_out`` are the real paths written). A failed write raises OSError
    with ``filename`` = the output, after removing its temporaries.
    """

    def __init__(self, path: str, warmup_steps: int = 5, active_steps: int = 20, config: dict | None = None,
                 with_stack: bool = True, inputs: tuple[str, ...] = ()):
        if warmup_steps < 0 or active_steps < 1:
            raise ValueError(f"warmup_steps must be >= 0 and active_steps >= 1 (got {warmup_steps}, {active_steps})")
        self.trace_out = resolve_output(path, tuple(inputs))
        side = sidecar_path(path)
        self.sidecar_out = resolve_output(side, (*inputs, path, self.trace_out))
        if self.sidecar_out == self.trace_out:  # not reachable through sidecar_path's names, but cheap to be sure
            raise ValueError(f"{side}: the sidecar would overwrite the trace {path}")
        self.path = path
        self.warmup_steps = warmup_steps
        self.active_steps = active_steps
        self.config = dict(config or {})
        self.extra: dict[str, Any] = {}
        self.with_stack = with_stack
        self.unprofiled_step_ms: list[float] = []
        self.profiled_step_ms: list[float] = []
        self.done = False
        self._n = 0
        self._t_last: float | None = None
        self._prof = None
        self._failed = False

    def __enter__(self) -> "Capture":
        import torch.profiler as tp

        sched = tp.schedule(wait=self.warmup_steps, warmup=1, active=self.active_steps, repeat=1)
        self._prof = tp.profile(schedule=sched, on_trace_ready=self._ready, **profiler_kwargs(self.with_stack))
        self._prof.__enter__()
        self._t_last = time.perf_counter()
        return self

    def step(self) -> None:
        """Mark the end of one step (advances the profiler schedule; records the step's wall time)."""
        if self.done or self._prof is None:
            return
        now = time.perf_counter()
        dt_ms = (now - self._t_last) * 1e3 if self._t_last is not None else float("nan")
        self._t_last = now
        if self._n < self.warmup_steps:
            if self._n > 0:  # the first step includes whatever ran before the loop
                self.unprofiled_step_ms.append(dt_ms)
        elif self._n > self.warmup_steps:
            self.profiled_step_ms.append(dt_ms)
        self._n += 1
        self._prof.step()

    def _ready(self, prof: Any) -> None:
        # torch also calls this when the profiler stops early (context exit): write only a complete capture
        if self._n < self.warmup_steps + 1 + self.active_steps or self._failed:
            return
        try:
            _export_gz_atomic(prof, self.trace_out)
        except OSError as e:
            self._failed = True
            raise OSError(e.errno, e.strerror or str(e), self.path) from None
        self.done = True

    def write_sidecar(self, side: dict[str, Any]) -> None:
        """Write ``side`` to the sidecar output atomically; OSError with ``filename`` = the sidecar path on failure."""
        try:
            write_json_atomic(self.sidecar_out, side)
        except OSError as e:
            raise OSError(e.errno, e.strerror or str(e), sidecar_path(self.path)) from None

    def sidecar(self) -> dict[str, Any]:
        """The sidecar dict (see module docstring)."""
        import torch

        return {
            "gaptrace_sidecar": 1,
            "trace": os.path.basename(self.path),
            "config": self.config,
            "warmup_steps": self.warmup_steps,
            "active_steps": self.active_steps,
            "unprofiled_step_ms": self.unprofiled_step_ms,
            "profiled_step_ms": self.profiled_step_ms,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
            **self.extra,
        }

    def __exit__(self, *exc: Any) -> None:
        prof, self._prof = self._prof, None
        if prof is not None:
            prof.__exit__(*exc)
        if exc[0] is None:
            if not self.done:
                raise RuntimeError(f"capture ended after {self._n} steps, before the {self.warmup_steps} warm-up + 1 "
                                   f"+ {self.active_steps} active steps it needs; nothing was written")
            self.write_sidecar(self.sidecar())
