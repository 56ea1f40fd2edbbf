"""Measured loops with one planted cause each and its fixed twin, and the driver that measures them.

Each module is one loop (see its docstring for the cause, the fix and the expected saving) with ``NAME``,
``CAUSE``, ``FIX`` and ``build(variant, device, size=None)``; :data:`LOOPS` lists them in the driver's order.
``python -m benchmarks.loops.run_pairs --help`` runs them (README.md in this folder).
"""
from __future__ import annotations

import importlib
import os

LOOP_MODULES = ("graph_readback", "hf_generate", "launch_bound", "per_request_readback", "host_detokenize",
                "pageable_htod", "helper_thread", "train_step_logging", "empty_cache", "mask_index",
                "eager_sampling", "copy_stream_sync")
LOOPS = LOOP_MODULES


def loop_module(name: str):
    """The module of loop ``name`` (one of :data:`LOOPS`); ValueError naming the known ones otherwise."""
    if name not in LOOP_MODULES:
        raise ValueError(f"unknown loop {name!r} (known: {', '.join(LOOP_MODULES)})")
    return importlib.import_module(f"{__name__}.{name}")


def readable(path: str) -> None:
    """Give a file made by ``tempfile.mkstemp`` (mode 0600) the mode a plain ``open`` would: 0666 less the umask
    (the drivers' measurement files are read like the traces beside them)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)
