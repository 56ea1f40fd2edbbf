"""One annotation helper: an NVTX range (the ``nvtx`` package, a no-op where it is absent) and a
``torch.profiler.record_function`` of the same name, so Nsight and Kineto traces both carry every phase
(round, plan, draft, verify, accept, commit, sample, prefill, read). DESIGN.md "The runtime"."""
from __future__ import annotations

import contextlib
import contextvars
import time
from collections import defaultdict

import torch

try:
    import nvtx as _nvtx
except Exception:  # not installed, or no NVTX library on this machine
    _nvtx = None

DOMAIN = "gaptrace"


class HostRangeTimes:
    """Unprofiled host time per range: what each ``annotate`` block took on the host clock (perf_counter; no device
    sync), summed per name while ``active``. The profiled trace holds the same ranges, so the two give the profiler's
    host cost per range (benchmarks/bench_runtime.py). Installed for a block by :func:`record_host_ranges`."""

    def __init__(self) -> None:
        self.active = False
        self.total_s: dict[str, float] = defaultdict(float)
        self.count: dict[str, int] = defaultdict(int)

    def per_round_ms(self, rounds: int) -> dict[str, float]:
        """{range: inclusive host ms per round} over ``rounds`` recorded rounds."""
        return {k: 1e3 * v / rounds for k, v in sorted(self.total_s.items())} if rounds else {}


_host_ranges: contextvars.ContextVar[HostRangeTimes | None] = contextvars.ContextVar("gaptrace_host_ranges",
                                                                                    default=None)


@contextlib.contextmanager
def record_host_ranges():
    """Within the block, every ``annotate`` range adds its host time to the yielded :class:`HostRangeTimes` while
    its ``active`` flag is set (a range counts when it starts while active)."""
    rec = HostRangeTimes()
    token = _host_ranges.set(rec)
    try:
        yield rec
    finally:
        _host_ranges.reset(token)


@contextlib.contextmanager
def annotate(name: str):
    """Open the NVTX range ``name`` (domain "gaptrace") and a record_function of the same name around a block; under
    :func:`record_host_ranges` also time it on the host."""
    rec = _host_ranges.get()
    t0 = time.perf_counter() if rec is not None and rec.active else None
    with torch.profiler.record_function(name):
        if _nvtx is None:
            yield
        else:
            with _nvtx.annotate(name, domain=DOMAIN):
                yield
    if t0 is not None:
        rec.total_s[name] += time.perf_counter() - t0
        rec.count[name] += 1


def nvtx_available() -> bool:
    """True when the nvtx package imported."""
    return _nvtx is not None
