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

Outputs are written to a temporary name in the target directory and renamed, so a crash leaves nothing half-written.
torch is imported here only; the analysis side of gaptrace never needs it.
"""
from __future__ import annotations

import gzip
import json
import os
import shutil
import tempfile
import time
from typing import Any

from gaptrace.outputs import make_readable, write_text_atomic

__all__ = ["Capture", "sidecar_path", "write_json_atomic", "read_sidecar"]

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
    except (OSError, ValueError):
        return None


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
            make_readable(gz_tmp)
            os.replace(gz_tmp, path)
            gz_tmp = None
        else:
            make_readable(raw)
            os.replace(raw, path)
            raw = None
    finally:
        for p in (raw, gz_tmp):
            if p and os.path.exists(p):
                os.unlink(p)


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
    """

    def __init__(self, path: str, warmup_steps: int = 5, active_steps: int = 20, config: dict | None = None,
                 with_stack: bool = True):
        if warmup_steps < 0 or active_steps < 1:
            raise ValueError(f"warmup_steps must be >= 0 and active_steps >= 1 (got {warmup_steps}, {active_steps})")
        d = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(d):
            raise ValueError(f"{path}: output directory {d} does not exist")
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
        if self._n < self.warmup_steps + 1 + self.active_steps:
            return
        _export_gz_atomic(prof, self.path)
        self.done = True

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
            write_json_atomic(sidecar_path(self.path), self.sidecar())
