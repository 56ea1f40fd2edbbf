"""gaptrace: profiler-driven performance diagnostics for GPU LLM decoding.

Load a trace with :func:`load_trace`; each analysis in :mod:`gaptrace.analyses` is a function over the
:class:`Trace` model. Nothing here imports torch.
"""
from .trace import Trace, TraceError

__version__ = "0.1.0"


def load_trace(path: str, *, memory_limit_bytes: int | None = None) -> Trace:
    """Load a Kineto/Chrome trace (``.json``, ``.json.gz`` or a directory of per-rank files).

    ``memory_limit_bytes``: refuse, before reading, a trace whose load is estimated to need more (default: the
    memory available now; :func:`gaptrace.loader.load_raw`).
    Raises :class:`TraceError` with one line naming the file and the problem.
    """
    from .loader import load_trace as _load

    return _load(path, memory_limit_bytes=memory_limit_bytes)


def __getattr__(name: str):
    """``gaptrace.analyses`` (and ``gaptrace.analyses.<module>``) reachable after a bare ``import gaptrace``: the
    package is imported on first access (PEP 562), so loading a trace never pays for it."""
    if name == "analyses":
        import importlib

        return importlib.import_module(f"{__name__}.analyses")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Trace", "TraceError", "load_trace", "__version__"]
