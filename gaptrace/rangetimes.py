"""Host time per ``record_function`` range without the profiler: the sidecar's ``unprofiled_ranges``.

The replay model gives a range the host time the unprofiled run measured for it instead of the calibration's
estimate (docs/DESIGN.md 5.2 "Measured ranges"). The runtime times its own NVTX ranges
(``runtime.annotate.record_host_ranges``); any other loop's ranges are ``torch.profiler.record_function`` blocks
(``torch.autograd.profiler.record_function``, the class both names refer to), which :class:`RecordFunctionTimes`
times on the host clock while :class:`gaptrace.capture.Capture` runs its unprofiled warm-up steps.

How: while installed, ``record_function.__enter__`` / ``__exit__`` are wrapped at class level (the one place every
``with record_function(...)`` and every ``@record_function(...)``-decorated call passes through; torch exposes no
Python observer of RecordFunction without a profiler). A block counts when it is entered while ``active``; its time
is ``perf_counter`` after the original ``__enter__`` returns to just before the original ``__exit__`` runs, the span
the trace's ``user_annotation`` event covers. The wrapper costs two ``perf_counter`` calls and a dict update per
block (``benchmarks/bench_range_timer.py`` measures it); the originals are restored by :meth:`uninstall`, and only one
timer is installed at a time (a nested :class:`Capture` times nothing). TorchScript code that calls
``torch.ops.profiler._record_function_enter_new`` directly is not seen.
"""
from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, Mapping

__all__ = ["RecordFunctionTimes", "range_summary"]

_MARK = "_gaptrace_range_timer"  # class attribute naming the installed timer
_T0 = "_gaptrace_t0"             # per instance: its open block's start time (a list when a decorated function recurses)


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
    entered while ``active`` is set, between :meth:`install` and :meth:`uninstall` (module docstring)."""

    def __init__(self) -> None:
        self.active = False
        self.total_s: dict[str, float] = defaultdict(float)
        self.count: dict[str, int] = defaultdict(int)
        self._cls: Any = None
        self._orig: tuple[Any, Any] | None = None

    def install(self) -> bool:
        """Wrap ``record_function``'s ``__enter__``/``__exit__``; False (nothing done) when another timer is
        installed or torch has no ``record_function``."""
        try:
            from torch.autograd.profiler import record_function as cls
        except ImportError:
            return False
        if getattr(cls, _MARK, None) is not None:
            return False
        enter, exit_ = cls.__enter__, cls.__exit__
        timer = self
        clock = time.perf_counter

        total, count = self.total_s, self.count

        def __enter__(rf: Any) -> Any:
            out = enter(rf)
            if timer.active:
                d = rf.__dict__
                prev = d.get(_T0)
                # one float per open block; a list only when the same object is entered again before it exits
                d[_T0] = clock() if prev is None else [*(prev if isinstance(prev, list) else [prev]), clock()]
            return out

        def __exit__(rf: Any, *exc: Any) -> Any:
            t1 = clock()
            d = rf.__dict__
            t0 = d.pop(_T0, None)
            if t0 is not None:
                if isinstance(t0, list):
                    t0, rest = t0[-1], t0[:-1]
                    if rest:
                        d[_T0] = rest if len(rest) > 1 else rest[0]
                name = rf.name
                total[name] += t1 - t0
                count[name] += 1
            return exit_(rf, *exc)

        cls.__enter__, cls.__exit__ = __enter__, __exit__
        setattr(cls, _MARK, self)
        self._cls, self._orig = cls, (enter, exit_)
        return True

    def uninstall(self) -> None:
        """Restore the original methods (a no-op when :meth:`install` did nothing). A block entered before and left
        after this call is not counted."""
        self.active = False
        if self._cls is None or self._orig is None:
            return
        self._cls.__enter__, self._cls.__exit__ = self._orig
        if getattr(self._cls, _MARK, None) is self:
            delattr(self._cls, _MARK)
        self._cls = self._orig = None

    def summary(self, rounds: int) -> list[dict]:
        """:func:`range_summary` of what was timed over ``rounds`` steps."""
        return range_summary(self.total_s, self.count, rounds)
