"""Small HTML building blocks for the report: escaped text, tables, and the page assembly.

Every value placed in the page goes through :func:`h` (``html.escape``), numbers through the ``fmt_*`` helpers.
The page is one file: plotly.js (from the installed ``plotly`` package) and the report's own script are inlined,
and a Content-Security-Policy allows exactly those two scripts (by SHA-256) and no network access at all, so a
name from a hostile trace could not run anything even if it escaped the escaping.
"""
from __future__ import annotations

import base64
import hashlib
import html
import json
import math
from importlib import resources
from string import Template
from typing import Any, Iterable, Sequence

from gaptrace.trace import clean_text

__all__ = ["h", "fmt_ms", "fmt_us", "fmt_pct", "table", "kv_table", "page", "plotly_js", "figures_script"]


def h(s: object) -> str:
    """``html.escape(str(s))`` (quotes too, so the result is safe in attributes), lone surrogates (a path from
    argv bytes that are not UTF-8, a sidecar string) replaced by U+FFFD so the page can be written as UTF-8, and
    other non-printable characters (ESC, BEL, bidi overrides from trace names) shown as escapes, as the text output
    shows them (:func:`gaptrace.text.escape_controls`)."""
    from gaptrace.text import escape_controls

    return html.escape(escape_controls(clean_text("" if s is None else str(s))), quote=True)


def _num(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def fmt_ms(us: Any, digits: int = 3) -> str:
    """µs -> ``"1,234.567"`` in ms (the unit is in the column header); "–" for missing values."""
    v = _num(us)
    return "–" if v is None else f"{v / 1000.0:,.{digits}f}"


def fmt_us(us: Any, digits: int = 1) -> str:
    v = _num(us)
    return "–" if v is None else f"{v:,.{digits}f}"


def fmt_pct(frac: Any, digits: int = 1) -> str:
    """A fraction in [0, 1] as a percentage (reports show percentages; the data keeps fractions)."""
    v = _num(frac)
    return "–" if v is None else f"{100.0 * v:.{digits}f}%"


def table(headers: Sequence[tuple[str, str]], rows: Iterable[Sequence[Any]], raw_cols: Sequence[int] = ()) -> str:
    """An HTML table. ``headers``: (title, css class) per column ("num" right-aligns, "frame" is monospace).
    Cells are escaped, except columns listed in ``raw_cols`` whose cells the caller built from escaped parts."""
    head = "".join(f'<th class="{c}">{h(t)}</th>' for t, c in headers)
    body = []
    for row in rows:
        cells = []
        for i, ((_, c), v) in enumerate(zip(headers, row)):
            cells.append(f'<td class="{c}">{v if i in raw_cols else h(v)}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    if not body:
        return '<p class="empty">none</p>'
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def kv_table(items: Iterable[tuple[str, Any]]) -> str:
    """A two-column key/value table; non-string values are shown as compact JSON (cut at 300 characters)."""
    rows = []
    for k, v in items:
        if not isinstance(v, str):
            v = json.dumps(v, default=str, separators=(", ", ": "))
        if len(v) > 300:
            v = v[:299] + "…"
        rows.append(f"<tr><td>{h(k)}</td><td>{h(v)}</td></tr>")
    return f'<table class="kv"><tbody>{"".join(rows)}</tbody></table>' if rows else ""


def plotly_js() -> str:
    """The minified plotly.js bundled with the installed ``plotly`` Python package (nothing is fetched)."""
    return resources.files("plotly").joinpath("package_data", "plotly.min.js").read_text(encoding="utf-8")


def _finite(obj):
    """Figures with every non-finite number (NaN, ±inf: a corrupt trace's overflowing times) as None, which plotly
    draws as a gap; JSON has no other spelling for them."""
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):
        return _finite(obj.tolist())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def figures_script(figures: dict[str, dict]) -> str:
    """``var FIGURES = {...};`` followed by the report's renderer. The JSON has ``<``, ``>``, ``&`` and the
    JavaScript line separators escaped as ``\\uXXXX``, so no string in it can close the script element; the other
    non-printable characters (C1 controls, bidi overrides from trace names) as JSON escapes too (same values)."""
    from gaptrace.text import escape_json_controls

    blob = escape_json_controls(clean_text(json.dumps(_finite(figures), separators=(",", ":"), allow_nan=False,
                                                      ensure_ascii=False)))
    for ch, rep in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                    ("\u2029", "\\u2029")):
        blob = blob.replace(ch, rep)
    app = resources.files("gaptrace.report").joinpath("report.js").read_text(encoding="utf-8")
    return f"var FIGURES = {blob};\n{app}"


def _sha256(s: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(s.encode("utf-8")).digest()).decode("ascii") + "'"


def page(title: str, body_html: str, figures: dict[str, dict], version: str) -> str:
    """The whole report page. ``title`` is plain text (escaped here); ``body_html`` is already-escaped HTML."""
    pkg = resources.files("gaptrace.report")
    css = pkg.joinpath("report.css").read_text(encoding="utf-8")
    plotly = plotly_js()
    app = figures_script(figures)
    if "</script" in plotly.lower():  # would end the inlined element early; plotly's bundle never holds it
        raise RuntimeError("the installed plotly.min.js contains '</script' and cannot be inlined")
    csp = (f"default-src 'none'; script-src {_sha256(plotly)} {_sha256(app)}; style-src 'unsafe-inline'; "
           "img-src data: blob:; font-src data:; connect-src 'none'; base-uri 'none'; form-action 'none'")
    # Template.substitute scans only the template, never the substituted values.
    return Template(pkg.joinpath("template.html").read_text(encoding="utf-8")).substitute(
        csp=csp, version=h(version), title=h(title), css=css, body=body_html, plotly_js=plotly, app_js=app)
