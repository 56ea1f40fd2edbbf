"""Shared by the H200 benchmark scripts: markdown tables, number formatting, and results written as JSON + .md
(atomically: a step killed by its timeout leaves the previous complete file, never half of one)."""
from __future__ import annotations

import json
import math
import os
import platform
import time

from gaptrace.outputs import write_text_atomic


def fmt(v, digits: int = 2) -> str:
    """A table cell: '–' for None/NaN, thousands separators for large numbers, ``digits`` decimals otherwise."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if isinstance(v, bool) or isinstance(v, str):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}f}"


def pct(v) -> str:
    """A fraction in [0, 1] as a percentage cell."""
    return "–" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{100 * v:.1f}%"


def md_table(header: list[str], rows: list[list]) -> str:
    """A GitHub markdown table; cells are str()-ed (format them first)."""
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def machine() -> dict:
    """Where the numbers came from: host, Python, torch, GPU (when torch is importable)."""
    info = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "host": platform.node(), "python": platform.python_version(),
            "cpus": os.cpu_count()}
    try:
        import torch

        info["torch"] = torch.__version__
        info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        pass
    return info


def _atomic_write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_text_atomic(path, text)


def _clean(obj):
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def out_dir_arg(path: str) -> str:
    """argparse ``type=`` of a results directory option, checked before the benchmark runs (nothing is made here;
    :func:`write_results` makes a missing directory): refused, one argparse error line, when the path cannot be one
    (empty, an existing file or a file above it, a dangling or looping symlink) or when neither it nor the first
    existing directory above it is writable (the probe of :func:`gaptrace.outputs.resolve_output`)."""
    import argparse

    from gaptrace.outputs import can_create_in

    if not path:
        raise argparse.ArgumentTypeError("an empty path; give a directory")
    if os.path.lexists(path) and not os.path.exists(path):
        raise argparse.ArgumentTypeError(f"{path}: a symlink to nothing (or a loop): cannot be made a directory")
    if os.path.exists(path) and not os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"{path}: exists and is not a directory")
    up = os.path.abspath(path)
    while not os.path.exists(up) and up != os.path.dirname(up):  # the first ancestor that exists: a directory too
        up = os.path.dirname(up)
    if not os.path.isdir(up):
        raise argparse.ArgumentTypeError(f"{path}: {up} is not a directory")
    if not (os.access(up, os.W_OK | os.X_OK) and can_create_in(up)):
        raise argparse.ArgumentTypeError(f"{path}: {up} is not writable")
    return path


def write_results(out_dir: str, name: str, data: dict, markdown: str) -> tuple[str, str]:
    """Write ``out_dir/name.json`` (``data``, NaN -> null) and ``out_dir/name.md``; returns both paths."""
    j, m = os.path.join(out_dir, name + ".json"), os.path.join(out_dir, name + ".md")
    _atomic_write(j, json.dumps(_clean(data), indent=1, sort_keys=True, default=str) + "\n")
    _atomic_write(m, markdown.rstrip() + "\n")
    return j, m


def print_and_write(out_dir: str | None, name: str, data: dict, markdown: str) -> int:
    """Print a benchmark's markdown table and, with ``out_dir``, write it with its data (:func:`write_results`);
    returns 0, the script's exit code."""
    print(markdown)
    if out_dir:
        write_results(out_dir, name, data, markdown)
    return 0


def read_results(out_dir: str, name: str) -> dict | None:
    """``out_dir/name.json`` as a dict, or None when absent or unreadable."""
    try:
        with open(os.path.join(out_dir, name + ".json"), encoding="utf-8") as f:
            d = json.load(f)
        return d if isinstance(d, dict) else None
    except (OSError, ValueError):
        return None
