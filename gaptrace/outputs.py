"""Where gaptrace may write: one check shared by every command that writes a file (report, capture).

Outputs are written to a temporary file in the target's directory and renamed over the target, so a crash never
leaves half a file. A rename replaces whatever sits at the path, so the target must be a regular file or absent:
a symlink is followed (the file it points to is replaced, the link stays), and a directory, a device, a FIFO or a
socket is refused, as is an output that is one of the command's own inputs.
"""
from __future__ import annotations

import os
import stat

__all__ = ["resolve_output"]


def resolve_output(path: str, inputs: tuple[str, ...] = ()) -> str:
    """The real path to write ``path`` to; ValueError (one line naming the path) when it cannot be written safely.

    Follows symlinks; refuses a missing directory, a non-regular existing target, and any of ``inputs``.
    """
    real = os.path.realpath(path)
    d = os.path.dirname(real)
    if not os.path.isdir(d):
        raise ValueError(f"{path}: the output directory {d} does not exist")
    try:
        st = os.stat(real)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file (a device, FIFO or socket)"
        raise ValueError(f"{path}: the output path is {kind}; give a file name")
    for p in inputs:
        if p and os.path.exists(p) and os.path.realpath(p) == real:
            raise ValueError(f"{path}: the output would overwrite the input {p}")
    return real
