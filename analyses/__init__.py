"""The analyses over a :class:`gaptrace.trace.Trace`, one module each (imported as ``gaptrace.analyses``).

Each module is imported on first attribute access (PEP 562), so ``import gaptrace`` then
``gaptrace.analyses.occupancy.occupancy(trace)`` works without importing the others first.
"""
import importlib as _importlib

_MODULES = ("diff", "findings", "gaps", "idle_sites", "launch_fit", "launch_idle", "occupancy", "profiler_cost",
            "replay", "rounds", "savings", "stacks", "steps", "summary", "syncs", "thread_waits", "timeline", "tracks",
            "verdicts", "whatif")


def __getattr__(name: str):
    if name in _MODULES:
        return _importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_MODULES))


__all__ = list(_MODULES)
