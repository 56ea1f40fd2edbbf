"""Capture a steady-state torch.profiler trace of any step loop, plus the ``TRACE.gaptrace.json`` sidecar.

This module is the torch side of the sidecar only: it writes it; :mod:`gaptrace.sidecar` reads and checks it.

    from gaptrace.capture import Capture
    with Capture("decode.json.gz", active_steps=20, config={"model": "my-model"}) as cap:
        for batch in loader:
            run_one_step(batch)
            cap.step()

The profiler is entered only after ``warmup_steps`` unprofiled steps (graph capture, compile and allocator warm-up
stay out of the trace, and no warm-up step pays an entered profiler's per-step cost) and one discarded profiler
warm-up step; then ``active_steps`` steps are recorded with Python
stacks (``with_stack=True``) and, where the installed torch supports it, CUDA sync events
(``_ExperimentalConfig(enable_cuda_sync_events=True)``). The unprofiled step periods (wall time from one ``step()``
to the next, no device sync added) are kept in the sidecar (``unprofiled_step_ms``, every warm-up step but the first,
which includes whatever ran before the loop) so the profiler's own cost can be measured against them: the default
``warmup_steps`` (:data:`DEFAULT_WARMUP_STEPS`, 31) gives :data:`MIN_UNPROFILED_STEPS` (30) of them, the reference
block the replay model fits the profiler's cost to (docs/DESIGN.md "The replay model" "Fitted to the capture's own unprofiled
rounds"); fewer (an explicit small ``warmup_steps``) are kept as they are, and the sidecar's ``unprofiled_steps``
says how many. Over the same steps every ``torch.profiler.record_function`` block is timed on the host clock
(:class:`gaptrace.rangetimes.RecordFunctionTimes`; ``time_ranges=False`` turns it off): the sidecar's
``unprofiled_ranges`` (per range name: mean µs per occurrence, occurrences per step) and ``unprofiled_range_rounds``
(the steps timed), which the replay gives those ranges instead of the calibration's estimate (docs/DESIGN.md 5.2
"Measured ranges").

Outputs are written to a temporary name in the target directory and renamed, so a crash leaves nothing half-written:
the trace is exported to a temporary file at the last active step and renamed with its sidecar when the ``with``
block exits, never a new trace beside an old sidecar. An exception in the block before the last active step leaves
both outputs as they were; one after it still commits the complete capture (``commit_on_error``, the default; the
runtime's capture turns it off, so its refusals and a SIGTERM, which the CLI turns into SystemExit, leave the outputs
as they were). Without the CLI, SIGTERM kills the process with no clean-up: a trace already exported stays behind as
a ``.tmp-*`` file. Anything the caller adds to ``extra`` inside the block goes into the sidecar;
both outputs (trace and sidecar) pass :func:`gaptrace.outputs.resolve_output` when the :class:`Capture` is made, before
any step runs. A write that fails (ENOSPC, ...) removes its temporaries and raises OSError naming the output.
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

from gaptrace.outputs import discard, resolve_output, set_output_mode, write_text_atomic
from gaptrace.rangetimes import RecordFunctionTimes

# the sidecar's reading and checking live in gaptrace.sidecar (torch-free); re-exported for callers of this module
from gaptrace.sidecar import (SIDECAR_SUFFIX, load_sidecar_checked, positive_number,  # noqa: F401
                              read_sidecar, read_sidecar_checked, sidecar_field_problems, sidecar_path,
                              sidecar_problem, usable_tau)

__all__ = ["Capture", "profiler_kwargs", "write_json_atomic", "MIN_UNPROFILED_STEPS", "DEFAULT_WARMUP_STEPS"]

MIN_UNPROFILED_STEPS = 30  # unprofiled step periods a capture keeps by default: the reference for the replay model
DEFAULT_WARMUP_STEPS = MIN_UNPROFILED_STEPS + 1  # the first warm-up step's period includes the set-up: not kept


def write_json_atomic(path: str, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` via a temporary file in the same directory and ``os.replace``."""
    write_text_atomic(path, json.dumps(obj, indent=1, sort_keys=True, default=str))


def _export_trace_tmp(prof: Any, path: str) -> str:
    """Export the profiler's Chrome trace to a temporary file beside ``path`` (gzipped when ``path`` ends in .gz),
    with the permission bits ``path`` will have; returns the temporary's path, for the caller to rename (or
    discard). Nothing is left behind on an error."""
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
            done, gz_tmp = gz_tmp, None
        else:
            done, raw = raw, None
        set_output_mode(done, path)
        return done
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

    Call :meth:`step` once at the end of every step. After the last active step the trace is exported to a
    temporary file; when the ``with`` block exits it is renamed to ``path`` together with the sidecar
    (:func:`sidecar_path` of it); later ``step()`` calls are no-ops. ``config`` (any JSON-able dict) and ``extra``
    (set by callers such as the runtime's capture: graphs, rounds) go into the sidecar. ``time_ranges``: time every
    ``record_function`` block of the kept warm-up steps (module docstring); the runtime, which times its own NVTX
    ranges, passes False. ``commit_on_error``: an exception that ends the block after the last active step (a loop
    stopped with Ctrl-C) still puts the complete capture in place; the runtime, which adds sidecar fields after
    that step, passes False, and its refusals leave the outputs as they were.

    Both outputs are checked here, before any step (:func:`gaptrace.outputs.resolve_output`: a missing or
    unwritable directory, a directory/device/FIFO at the path, or one of ``inputs`` raises ValueError, one line);
    symlinks are followed (``trace_out``/``sidecar_out`` are the real paths written). A failed write raises OSError
    with ``filename`` = the output, after removing its temporaries.
    """

    def __init__(self, path: str, warmup_steps: int = DEFAULT_WARMUP_STEPS, active_steps: int = 20,
                 config: dict | None = None,
                 with_stack: bool = True, inputs: tuple[str, ...] = (), time_ranges: bool = True,
                 commit_on_error: bool = True):
        if warmup_steps < 0 or active_steps < 1:
            raise ValueError(f"warmup_steps must be >= 0 and active_steps >= 1 (got {warmup_steps}, {active_steps})")
        if os.path.basename(path).endswith(SIDECAR_SUFFIX):
            # a trace named like a sidecar would overwrite another capture's sidecar, and its own would be X.gaptrace.gaptrace.json
            raise ValueError(f"{path}: a trace output cannot end with {SIDECAR_SUFFIX}, the name of a capture "
                             "sidecar (use .json.gz)")
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
        self._trace_tmp: str | None = None  # the exported trace, renamed to trace_out with the sidecar at the exit
        self.commit_on_error = commit_on_error
        self._n = 0
        self._t_last: float | None = None
        self._prof = None
        self._failed = False
        self._entered = False
        self._exited = False
        self._ranges = RecordFunctionTimes() if time_ranges and warmup_steps >= 2 else None
        self._ranges_installed = False
        self.range_steps = 0  # warm-up steps whose record_function blocks were timed

    def __enter__(self) -> "Capture":
        if self._entered:
            raise RuntimeError("a Capture records one capture: make a new one for the next")
        self._entered = True
        if self._ranges is not None:
            self._ranges_installed = self._ranges.install()
        if self.warmup_steps == 0:
            self._start_profiler()
        self._t_last = time.perf_counter()
        return self

    def _start_profiler(self) -> None:
        # The profiler is entered only after the warm-up steps: under an entered torch.profiler (its schedule's
        # wait phase) every step pays profile.step()'s Python, so the warm-up periods would not be unprofiled ones
        # (docs/DESIGN.md "Fitted to the capture's own unprofiled rounds").
        import torch
        import torch.profiler as tp

        if torch.autograd.profiler._is_profiler_enabled:
            # nested profilers crash torch's trace export (a segfault with schedules): refuse up front
            raise RuntimeError("another torch profiler is already running on this thread: a Capture needs its own")
        sched = tp.schedule(wait=0, warmup=1, active=self.active_steps, repeat=1)
        self._prof = tp.profile(schedule=sched, on_trace_ready=self._ready, **profiler_kwargs(self.with_stack))
        self._prof.__enter__()

    def step(self) -> None:
        """Mark the end of one step (advances the profiler schedule; records the step's wall time)."""
        if self.done or not self._entered or self._exited:
            return
        now = time.perf_counter()
        dt_ms = (now - self._t_last) * 1e3 if self._t_last is not None else float("nan")
        if self._n < self.warmup_steps:
            if self._n > 0:  # the first step includes whatever ran before the loop
                self.unprofiled_step_ms.append(dt_ms)
        elif self._n > self.warmup_steps:
            self.profiled_step_ms.append(dt_ms)
        self._t_last = now
        if self._ranges is not None:
            # the ranges of the steps whose periods are kept (the 2nd to the last warm-up step) are timed
            self.range_steps += self._ranges.active
            self._ranges.new_step()
            self._ranges.active = self._ranges_installed and 1 <= self._n + 1 < self.warmup_steps
        self._n += 1
        if self._prof is not None:
            self._prof.step()
        elif self._n == self.warmup_steps:
            if self._ranges is not None:
                self._ranges.uninstall()  # no wrapper under the profiler
            self._start_profiler()  # the next step is the profiler's warm-up step
            self._t_last = time.perf_counter()  # the profiler's own start is no step's time

    def _ready(self, prof: Any) -> None:
        # torch also calls this when the profiler stops early (context exit): write only a complete capture
        if self._n < self.warmup_steps + 1 + self.active_steps or self._failed:
            return
        try:
            self._trace_tmp = _export_trace_tmp(prof, self.trace_out)
        except OSError as e:
            self._failed = True
            raise OSError(e.errno, e.strerror or str(e), self.path) from None
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
            "unprofiled_steps": len(self.unprofiled_step_ms),
            "profiled_step_ms": self.profiled_step_ms,
            **({"unprofiled_ranges": self._ranges.summary(self.range_steps),
                "unprofiled_range_rounds": self.range_steps} if self._ranges_installed else {}),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
            **self.extra,
        }

    def __exit__(self, *exc: Any) -> None:
        self._exited = True
        try:
            if self._ranges is not None:
                self._ranges.uninstall()
            prof, self._prof = self._prof, None
            if prof is not None:
                prof.__exit__(*exc)
            if exc[0] is None and not self.done:
                raise RuntimeError(f"capture ended after {self._n} steps, before the {self.warmup_steps} warm-up "
                                   f"+ 1 + {self.active_steps} active steps it needs; nothing was written")
            # a loop stopped by an exception once every active step was recorded (a server loop ended with Ctrl-C)
            # keeps its complete capture, unless the caller still had sidecar fields to add (commit_on_error False)
            if self.done and (exc[0] is None or self.commit_on_error):
                try:
                    self._commit(self.sidecar())
                except BaseException as e:
                    if exc[0] is not None:  # the block's own exception stays the one shown, the failure attached
                        raise e from exc[1]
                    raise
        finally:
            # an exception in the block before the last active step (or with commit_on_error False: a refusal,
            # SIGTERM's SystemExit in the CLI), or a failed commit: the exported trace is dropped and the outputs
            # keep what they held before
            discard(self._trace_tmp)
            self._trace_tmp = None

    def _commit(self, side: dict[str, Any]) -> None:
        """Put the trace and its sidecar in place together: the sidecar written to a temporary file, then both
        renamed, trace first (the two renames are the only moment a stop could pair them wrongly). OSError with
        ``filename`` = the output that failed."""
        d = os.path.dirname(os.path.abspath(self.sidecar_out))
        text = json.dumps(side, indent=1, sort_keys=True, default=str)  # a sidecar that is no JSON fails here
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=".json")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            set_output_mode(tmp, self.sidecar_out)
        except BaseException as e:
            discard(tmp)
            if isinstance(e, OSError):
                raise OSError(e.errno, e.strerror or str(e), sidecar_path(self.path)) from None
            raise
        try:
            os.replace(self._trace_tmp, self.trace_out)
            self._trace_tmp = None
        except OSError as e:
            discard(tmp)
            raise OSError(e.errno, e.strerror or str(e), self.path) from None
        try:
            os.replace(tmp, self.sidecar_out)
        except OSError as e:
            # the trace is in place: an earlier capture's sidecar beside it would describe another run, so it goes
            discard(tmp, self.sidecar_out)
            raise OSError(e.errno, f"{e.strerror or e}; the trace was written without its sidecar",
                          sidecar_path(self.path)) from None
