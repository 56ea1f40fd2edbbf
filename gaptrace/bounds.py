"""Bounds on what an output may hold, whatever the trace: the length of one name, the depth and size of one stack.

A name from a trace is untrusted in size as in content: 40 frames of 1 MB names under 40 blocking syncs (a 47 KB
gzip) made a 1.7 GB report when every site repeated its stack in full. So a name longer than ``MAX_NAME_CHARS`` is
cut once, where the trace is built (every table, chart and JSON field then holds the cut name), and a stack keeps
its innermost frames up to ``MAX_STACK_FRAMES`` frames and ``MAX_STACK_CHARS`` characters. Each cut says what it
cut: ``…[N more characters #hash]`` (the hash of the whole name keeps two names that differ only past the cut
apart) and a last frame ``… N more frames``.
"""
from __future__ import annotations

import hashlib

__all__ = ["MAX_NAME_CHARS", "MAX_STACK_FRAMES", "MAX_STACK_CHARS", "MAX_LIST_ROWS", "bound_name", "bound_stack"]

MAX_NAME_CHARS = 1024  # Kineto's longest names (templated CUTLASS kernels) are a few hundred characters
MAX_STACK_FRAMES = 48
MAX_STACK_CHARS = 8192
MAX_LIST_ROWS = 500  # rows of a per-site JSON list (blocking syncs); the rest is counted in a warning


def bound_name(name: str) -> str:
    """``name`` unchanged up to ``MAX_NAME_CHARS`` characters, else its first ``MAX_NAME_CHARS`` then
    ``…[N more characters #h]`` (N the characters cut, h 8 hex digits of the BLAKE2b hash of the whole name)."""
    if len(name) <= MAX_NAME_CHARS:
        return name
    h = hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=4).hexdigest()
    return f"{name[:MAX_NAME_CHARS]}…[{len(name) - MAX_NAME_CHARS:,} more characters #{h}]"


def more_frames(n: int) -> str:
    """The frame that stands for ``n`` outer frames cut from a stack."""
    return f"… {n:,} more frame{'s' if n != 1 else ''}"


def bound_stack(frames: tuple[str, ...] | list[str], depth: int | None = None) -> tuple[str, ...]:
    """The innermost frames of a stack (innermost first) within ``MAX_STACK_FRAMES`` frames and
    ``MAX_STACK_CHARS`` characters, then :func:`more_frames` for the rest. ``depth``: the stack's full depth when
    ``frames`` holds only its innermost part (default ``len(frames)``)."""
    depth = len(frames) if depth is None else depth
    keep, chars = [], 0
    for f in frames[:MAX_STACK_FRAMES]:
        if keep and chars + len(f) > MAX_STACK_CHARS:
            break
        keep.append(f)
        chars += len(f)
    return tuple(keep) + ((more_frames(depth - len(keep)),) if depth > len(keep) else ())
