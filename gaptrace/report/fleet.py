"""The report of a fleet (``gaptrace report DIR_OR_GLOB ...``): one offline page with the fleet summary
(:func:`gaptrace.analyses.fleet_summary.merge_fleet`): the headline, per-rank occupancy and busy-without-waiting,
the per-rank timeline strip of busy / idle on the aligned clock, the stragglers with their host sites, and the wait
matrix. Every string from the traces goes through :func:`gaptrace.report.html.h`; the strip is inline SVG (markup,
no script), so the page's Content-Security-Policy stays the single-trace report's."""
from __future__ import annotations

import datetime as _dt
from typing import Any

from .html import fmt_ms, fmt_pct, h, page, table

__all__ = ["render_fleet_report", "strip_svg"]

STRIP_W, ROW_H = 900, 16


def strip_svg(res: dict[str, Any]) -> str:
    """Per rank a row of STRIP_BINS cells over its analysis window, placed on the fleet's aligned clock (the rank's
    window start + its clock offset), each cell's darkness its busy fraction, its waits inside collectives
    (``wait_spans_us``) over them in orange; the stragglers' late rank outlined."""
    rows = []
    spans = []
    for r in res["ranks"]:
        s = (r.get("strip") or {})
        if s.get("busy"):
            off = r.get("clock_offset_us") or 0.0
            spans.append((r["rank"], s["t0_us"] + off, s["t1_us"] + off, s["busy"]))
    if not spans:
        return '<p class="empty">no device activity to draw</p>'
    t0 = min(a for _, a, _, _ in spans)
    t1 = max(b for _, _, b, _ in spans)
    width = max(t1 - t0, 1e-9)
    late = {s["late_rank"] for s in res.get("stragglers") or []}
    waiting = {r["rank"]: r.get("wait_spans_us") or [] for r in res["ranks"]}
    label_w = 70
    for i, (rank, a, b, busy) in enumerate(spans):
        y = i * (ROW_H + 4)
        x0 = label_w + (a - t0) / width * STRIP_W
        cell = (b - a) / width * STRIP_W / len(busy)
        rows.append(f'<text x="0" y="{y + ROW_H - 4}" font-size="12">rank {h(rank)}</text>')
        for k, f in enumerate(busy):
            rows.append(f'<rect x="{x0 + k * cell:.2f}" y="{y}" width="{cell + 0.05:.2f}" height="{ROW_H}" '
                        f'fill="#1f77b4" fill-opacity="{max(0.0, min(1.0, float(f or 0.0))):.3f}"/>')
        for ws, we in waiting.get(rank, []):  # the time it spun in a collective waiting for a late rank
            wx = label_w + (ws - t0) / width * STRIP_W
            rows.append(f'<rect x="{wx:.2f}" y="{y}" width="{max((we - ws) / width * STRIP_W, 0.5):.2f}" '
                        f'height="{ROW_H}" fill="#ff7f0e" fill-opacity="0.85"/>')
        stroke = "#d62728" if rank in late else "#999"
        rows.append(f'<rect x="{x0:.2f}" y="{y}" width="{(b - a) / width * STRIP_W:.2f}" height="{ROW_H}" '
                    f'fill="none" stroke="{stroke}" stroke-width="{2 if rank in late else 0.5}"/>')
    hgt = len(spans) * (ROW_H + 4)
    legend = (f"{width / 1000:,.2f} ms across; blue: busy (darker = busier); orange: waiting inside a collective for "
              "a late rank (busy on the device, no work); red outline: a late rank")
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_w + STRIP_W + 10}" height="{hgt}" '
            f'role="img" aria-label="busy fraction per rank">{"".join(rows)}</svg>'
            f'<p class="how">{h(legend)}</p>')


def _matrix(res: dict[str, Any]) -> str:
    m = res["wait_matrix"]
    ranks, w = m["ranks"], m["wait_us"]
    top = max((v for row in w for v in row), default=0.0) or 1.0
    head = "".join(f'<th class="num">{h(f"for rank {r}")}</th>' for r in ranks)
    body = []
    for r, row in zip(ranks, w):
        cells = "".join(f'<td class="num" style="background: rgba(214, 39, 40, {v / top * 0.6:.3f})">'
                        f"{h(fmt_ms(v))}</td>" for v in row)
        body.append(f"<tr><td>{h(f'rank {r} waited (ms)')}</td>{cells}</tr>")
    return f"<table><thead><tr><th></th>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def render_fleet_report(res: dict[str, Any], title: str) -> str:
    """The fleet report page as one HTML string. ``res``: the fleet summary (``gaptrace analyze DIR --json``'s
    object, with each rank's ``strip``); ``title``: plain text (escaped here). Pure: writes nothing."""
    from gaptrace import __version__

    body = ["<header><h1>gaptrace report: a fleet of ranks</h1>",
            f'<div class="meta">{h(title)} · {h(len(res["ranks"]))} ranks · generated '
            f'{h(_dt.datetime.now().strftime("%Y-%m-%d %H:%M"))} by gaptrace {h(__version__)}</div></header>',
            '<section class="headline" id="headline">'
            + "".join(f"<p>{h(line)}</p>" for line in res["headline"]) + "</section>"]
    rows = [(r["rank"], r.get("device_name") or "", fmt_pct(r["occupancy"]), fmt_pct(r["busy_without_waiting"]),
             fmt_ms(r["waited_us"]), fmt_ms(r["caused_us"]),
             (r.get("verdict") or r.get("bound") or "–").replace("_", "-"),
             r.get("first_cause") or "–") for r in res["ranks"]]
    body.append('<h2 id="ranks">Ranks</h2><p class="how">Occupancy as measured; busy without waiting = busy time less '
                "the time spent inside a collective before the last rank arrived, over the window.</p>"
                + table([("rank", "num"), ("device", ""), ("occupancy", "num"), ("busy without waiting", "num"),
                         ("waited (ms)", "num"), ("made others wait (ms)", "num"), ("verdict", ""),
                         ("first cause", "")], rows))
    body.append('<h2 id="strip">Busy and idle per rank, on one clock</h2>' + strip_svg(res))
    body.append('<h2 id="stragglers">Stragglers</h2>')
    if res["stragglers"]:
        for s in res["stragglers"]:
            body.append(f"<p>{h(s['line'])}</p>")
            body.append(table([("host site of the late rank", "frame"), ("range", ""), ("share of the wait", "num"),
                               ("charged wait (ms)", "num")],
                              [(x["site"], x["range"] or "", fmt_pct(x["share"]), fmt_ms(x["charged_wait_us"]))
                               for x in s["sites"]]))
    else:
        body.append('<p class="empty">no rank waited for another in a matched collective</p>')
    body.append('<h2 id="wait-matrix">Wait matrix</h2><p class="how">Row: the rank that waited; column: the late rank '
                "it waited for (ms, summed over the matched collectives).</p>" + _matrix(res))
    c = res["collectives"]
    body.append('<h2 id="collectives">Collectives</h2>' + table(
        [("collective", "frame"), ("instances", "num"), ("ranks", "num"), ("mean (µs)", "num"),
         ("waiting (ms)", "num")],
        [(b["label"], b["instances"], b["ranks"], f"{b['mean_dur_us']:,.1f}", fmt_ms(b["total_wait_us"]))
         for b in c["by_label"]]))
    # the fleet's own warnings, then each rank's (a rank's trace and sidecar warnings, as analyze of it alone says)
    warn = list(res.get("warnings") or []) + [f"rank {r['rank']}: {w}" for r in res["ranks"]
                                              for w in (r.get("warnings") or [])]
    body.append('<h2 id="warnings">Warnings</h2>' + ("<ul>" + "".join(f"<li>{h(w)}</li>" for w in warn) + "</ul>"
                                                      if warn else '<p class="empty">none</p>'))
    return page(f"gaptrace fleet: {title}", "\n".join(body), {}, __version__)
