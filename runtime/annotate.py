"""One annotation helper: an NVTX range (the ``nvtx`` package, a no-op where it is absent) and a
``torch.profiler.record_function`` of the same name, so Nsight and Kineto traces both carry every phase
(round, plan, draft, verify, accept, commit, sample, prefill, read). DESIGN.md "The runtime"."""
from __future__ import annotations

import contextlib

import torch

try:
    import nvtx as _nvtx
except Exception:  # not installed, or no NVTX library on this machine
    _nvtx = None

DOMAIN = "gaptrace"


@contextlib.contextmanager
def annotate(name: str):
    """Open the NVTX range ``name`` (domain "gaptrace") and a record_function of the same name around a block."""
    with torch.profiler.record_function(name):
        if _nvtx is None:
            yield
        else:
            with _nvtx.annotate(name, domain=DOMAIN):
                yield


def nvtx_available() -> bool:
    """True when the nvtx package imported."""
    return _nvtx is not None
