"""gaptrace: profiler-driven performance diagnostics for GPU LLM decoding.

Load a trace with :func:`load_trace`; each analysis in :mod:`gaptrace.analyses` is a function over the
:class:`Trace` model. Nothing here imports torch.
"""
from .trace import Trace, TraceError

__version__ = "0.1.0"


def load_trace(path: str) -> Trace:
    """Load a Kineto/Chrome trace (``.json``, ``.json.gz`` or a directory of per-rank files).

    Raises :class:`TraceError` with one line naming the file and the problem.
    """
    from .loader import load_trace as _load

    return _load(path)


__all__ = ["Trace", "TraceError", "load_trace", "__version__"]
