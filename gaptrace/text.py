"""How gaptrace writes strings it did not make: names from a trace, paths from argv, values from a sidecar.

Strings from a trace are untrusted (an ESC in a kernel name could drive the terminal that prints the analysis, a
newline in a frame name could forge a row or a second error line). Every command, the report and the runtime's
command line escape them through the helpers here before printing; :func:`dumps_json` writes a result dict as the
``--json`` text. Pure functions of their arguments: no click, no trace, no analysis.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np

__all__ = ["escape_controls", "escape_line", "escape_strings", "escape_json_controls", "to_jsonable", "dumps_json",
           "shorten"]

# every character but printable ASCII, tab and newline: the candidates :func:`escape_controls` looks at one by one
_NOT_PLAIN = re.compile(r"[^\t\n\x20-\x7e]")
_NOT_ASCII_PRINTABLE = re.compile(r"[^\x20-\x7e]")  # the candidates escape_line looks at


def escape_controls(text: str) -> str:
    """``text`` safe to print on a terminal: every character ``repr`` would escape (``not str.isprintable()``: the
    C0 controls such as ESC and BEL, DEL, the C1 controls such as the 8-bit CSI, bidi overrides, line separators)
    is replaced by its ``repr`` escape (``\\x1b``, ``\\x07``, ``\\u202e``), except tab and newline. Printable
    text (µ, →, CJK) is unchanged. Names in a trace are untrusted: raw, an ESC in a kernel name could drive the
    terminal that prints the analysis."""
    return _repr_escape(_NOT_PLAIN, text)


def _repr_escape(candidates: re.Pattern, text: str) -> str:
    """Each match of ``candidates`` in ``text`` that is not printable replaced by its ``repr`` escape."""
    return candidates.sub(lambda m: m.group() if m.group().isprintable() else repr(m.group())[1:-1], text)


def escape_line(text: str) -> str:
    """:func:`escape_controls` that also escapes tab, newline and carriage return: ``text`` stays on one line. For
    strings from a trace inside a line of output (a newline in a frame name could forge a row or a second error
    line)."""
    return _repr_escape(_NOT_ASCII_PRINTABLE, text)


def escape_strings(obj):
    """``obj`` (dicts, lists and tuples of JSON-like values, as ``run_analysis`` returns them) with every string,
    keys included, passed through :func:`escape_line`; other values unchanged. Text renderers apply it first, so
    no name from the trace can break a row or a line."""
    if isinstance(obj, str):
        return escape_line(obj)
    if isinstance(obj, dict):
        return {escape_strings(k): escape_strings(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(escape_strings(v) for v in obj)
    return obj


def escape_json_controls(text: str) -> str:
    """JSON text (from ``json.dumps(..., ensure_ascii=False)``, which escapes only the C0 controls) with the other
    non-printable characters of :func:`escape_controls` written as JSON ``\\uXXXX`` escapes (surrogate pairs
    beyond the BMP): the text decodes to the same values and prints safely on a terminal."""
    return _NOT_PLAIN.sub(lambda m: m.group() if m.group().isprintable() else json.dumps(m.group())[1:-1], text)


def to_jsonable(obj: Any) -> Any:
    """numpy/pandas scalars and containers -> plain JSON types (NaN/inf -> None); dict keys become strings."""
    t = type(obj)
    if t is str or t is int or obj is None:
        return obj
    if t is float:
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        v = float(obj)
        return v if math.isfinite(v) else None
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    return obj


def dumps_json(obj: Any) -> str:
    """The ``--json`` text of a result dict: :func:`to_jsonable`, indented, non-ASCII kept, every non-printable
    character escaped (:func:`escape_json_controls`: trace names are untrusted)."""
    return escape_json_controls(json.dumps(to_jsonable(obj), indent=1, ensure_ascii=False))


def shorten(text: str, limit: int = 160, keep: int = 70) -> str:
    """``text`` whole up to ``limit`` characters, else its first and last ``keep`` joined by "…" (a path or a site name
    of thousands of characters, quoted in a one-line message, would fill the terminal)."""
    return text if len(text) <= limit else f"{text[:keep]}…{text[-keep:]}"
