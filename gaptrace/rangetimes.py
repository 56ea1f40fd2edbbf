"""Host time per ``record_function`` range without the profiler: the sidecar's ``unprofiled_ranges``.

The replay model gives a range the host time the unprofiled run measured for it instead of the calibration's
estimate (docs/DESIGN.md 5.2 "Measured ranges"). The runtime times its own NVTX ranges
(``runtime.annotate.record_host_ranges``); any other loop's ranges are ``torch.profiler.record_function`` blocks
(``torch.autograd.profiler.record_function``, the class both names refer to), which :class:`RecordFunctionTimes`
times on the host clock while :class:`gaptrace.capture.Capture` runs its unprofiled warm-up steps.

How: while installed, ``record_function.__enter__`` / ``__exit__`` are wrapped at class level (the one place every
``with record_function(...)`` and every ``@record_function(...)``-decorated call passes through; torch exposes no
Python observer of RecordFunction without a profiler). A block counts when it is entered while ``active``, on the
installing thread, and is not nested in an open block of its name; its time is ``perf_counter`` after the original
``__enter__`` returns to just before the original ``__exit__`` runs, the span the trace's ``user_annotation`` event
covers. The open blocks live in the timer, not on the record_function objects, so nothing of one timer leaks into
the next. The wrapper costs two ``perf_counter`` calls and a dict update per
block (``benchmarks/bench_range_timer.py`` measures it); the originals are restored by :meth:`uninstall`, and only one
timer is installed at a time (a nested :class:`Capture` times nothing). TorchScript code that calls
``torch.ops.profiler._record_function_enter_new`` directly is not seen.
"""
from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Any, Mapping

__all__ = ["RecordFunctionTimes", "range_summary"]

_MARK = "_gaptrace_range_timer"  # class attribute naming the installed timer


def range_summary(total_s: Mapping[str, float], count: Mapping[str, int], rounds: int) -> list[dict]:
    """The sidecar's ``unprofiled_ranges``: per range timed over ``rounds`` rounds or steps, {"name", "mean_us"
    (host µs per occurrence, inclusive: nested ranges and any wait inside count), "per_round" (occurrences per round
    or step)}, sorted by name; [] when no round was timed. ``total_s``: seconds per name; ``count``: occurrences."""
    if not rounds:
        return []
    return [{"name": k, "mean_us": 1e6 * total_s[k] / count[k], "per_round": count[k] / rounds}
            for k in sorted(total_s) if count.get(k)]


class RecordFunctionTimes:
    """Inclusive host seconds (``total_s``) and occurrences (``count``) per ``record_function`` name, of the blocks
    entered while ``active`` is set on the thread that called :meth:`install` (the loop's thread: a range of the
    same name on a helper thread is not this loop's), between :meth:`install` and :meth:`uninstall` (module
    docstring). A block nested in a block of the same name on that thread (a decorated function that recurses) is
    part of the outer one, as the trace's merged occurrences of a name are: only the outermost counts."""

    def __init__(self) -> None:
        self.active = False
        self.total_s: dict[str, float] = defaultdict(float)
        self.count: dict[str, int] = defaultdict(int)
        self._cls: Any = None
        self._orig: tuple[Any, Any] | None = None
        self._thread: int | None = None
        self._open: dict[str, list] = {}  # name -> [depth, start, step entered] of the open outermost block
        self._step = 0

    def _enter(self, rf: Any) -> None:
        if not self.active or threading.get_ident() != self._thread:
            return
        o = self._open.get(rf.name)
        if o is None:
            self._open[rf.name] = [1, time.perf_counter(), self._step]
        else:
            o[0] += 1

    def _exit(self, rf: Any) -> None:
        if threading.get_ident() != self._thread:
            return
        o = self._open.get(rf.name)
        if o is None:
            return
        o[0] -= 1
        if o[0] == 0:
            del self._open[rf.name]
            self.total_s[rf.name] += time.perf_counter() - o[1]
            self.count[rf.name] += 1

    def new_step(self) -> None:
        """A step ended: a block of a name still open since before the previous step (its exit skipped, say by an
        exception the loop caught) is dropped, so that it does not hold every later block of its name as nested. A
        block open across one step boundary still counts when it ends."""
        self._step += 1
        for name in [n for n, o in self._open.items() if o[2] < self._step - 1]:
            del self._open[name]

    def install(self) -> bool:
        """Wrap ``record_function``'s ``__enter__``/``__exit__``; False (nothing done) when another timer is
        installed or torch has no ``record_function``. The wrappers keep the originals' signatures and time only
        outside TorchScript (``torch.jit.is_scripting()``), so a function scripted meanwhile compiles as before
        (its blocks are not timed)."""
        try:
            import torch
            from torch.autograd.profiler import record_function as cls
        except ImportError:
            return False
        if getattr(cls, _MARK, None) is not None:
            return False
        enter, exit_ = cls.__enter__, cls.__exit__

        def __enter__(self):  # noqa: N807 - the wrapped method
            out = self._gaptrace_enter()
            if not torch.jit.is_scripting():
                _TIMERS[0]._enter(self)
            return out

        def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any):  # noqa: N807
            if not torch.jit.is_scripting():
                _TIMERS[0]._exit(self)
            self._gaptrace_exit(exc_type, exc_value, traceback)

        _TIMERS[:] = [self]
        cls._gaptrace_enter, cls._gaptrace_exit = enter, exit_
        cls.__enter__, cls.__exit__ = __enter__, __exit__
        setattr(cls, _MARK, self)
        self._cls, self._orig = cls, (enter, exit_)
        self._thread = threading.get_ident()
        return True

    def uninstall(self) -> None:
        """Restore the original methods (a no-op when :meth:`install` did nothing). A block entered before and left
        after this call is not counted."""
        self.active = False
        self._open.clear()
        if self._cls is None or self._orig is None:
            return
        self._cls.__enter__, self._cls.__exit__ = self._orig
        # _gaptrace_enter / _gaptrace_exit stay (the originals): a `with` entered before this call already holds the
        # wrapper's __exit__, which still calls them when the block ends, on any thread
        if _MARK in vars(self._cls):
            delattr(self._cls, _MARK)
        _TIMERS[:] = [_IDLE]
        self._cls = self._orig = None

    def summary(self, rounds: int) -> list[dict]:
        """:func:`range_summary` of what was timed over ``rounds`` steps."""
        return range_summary(self.total_s, self.count, rounds)


class _Idle:
    """What a wrapper still on the class calls once its timer is gone (a method object captured before uninstall)."""

    def _enter(self, rf: Any) -> None:
        pass

    def _exit(self, rf: Any) -> None:
        pass


_IDLE = _Idle()
# the installed timer, read by the wrappers (at most one is installed: install() refuses a second); a one-slot list
# rather than a closure so that TorchScript, which compiles the wrapped methods, sees no Python-only free variables
_TIMERS: list[Any] = [_IDLE]
