"""The report's charts as plain plotly figure dicts (``{"data": [...], "layout": {...}}``), ready for JSON.

No plotly Python objects are built: the dicts go straight into the page and plotly.js draws them. Every string that
comes from a trace goes through :func:`esc` first: plotly draws labels as SVG text but parses a small set of
HTML-like tags in them (``<b>``, ``<br>``, ``<a href>``, ``<span style>``) and in hover text, so ``<``, ``>`` and
``&`` are turned into entities, which plotly shows as the literal characters.
"""
from __future__ import annotations

import html
import re

import numpy as np
import pandas as pd

from .stacks import StackTree

__all__ = ["esc", "occupancy_figure", "icicle_figure", "launch_fit_figure", "rounds_figure", "savings_figure",
           "PALETTE"]

MAX_LEGEND = 10  # annotation names with their own colour and legend entry

PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
           "#bab0ac"]
BUSY_COLOUR = "#2a7f62"
HEAT = [[0.0, "#fdecd2"], [0.35, "#fdbb84"], [0.7, "#ef6548"], [1.0, "#990000"]]
FONT = {"family": "system-ui, -apple-system, Segoe UI, sans-serif", "size": 12}


def esc(s: object, limit: int | None = None) -> str:
    """``str(s)`` with ``&``, ``<``, ``>`` escaped for plotly labels and hover text (optionally shortened first),
    after the characters that are not printable (bidi overrides, NUL, ESC, line breaks) are written as their
    visible escapes (:func:`gaptrace.cli.escape_line`, as the tables do): drawn raw in the SVG, ``\u202egnp.exe``
    would read "exe.png"."""
    from gaptrace.text import escape_line
    s = escape_line(str(s))
    if limit is not None and len(s) > limit:
        s = s[: limit - 1] + "…"
    return html.escape(s, quote=False)


def esc_tail(s: object, limit: int) -> str:
    """Like :func:`esc`, but a long source path keeps its end (``…/managers/scheduler.py(812): run``)."""
    from gaptrace.text import escape_line
    s = escape_line(str(s))
    if len(s) > limit and "/" in s:
        s = "…" + s[len(s) - limit + 1:]
    return esc(s, limit)


def _ms(x: np.ndarray | float, t0_us: float) -> np.ndarray:
    return np.round((np.asarray(x, dtype=np.float64) - t0_us) / 1000.0, 6)


def occupancy_figure(strips: list[tuple[str, pd.DataFrame]], lanes: pd.DataFrame, t0_us: float,
                     t1_us: float) -> dict:
    """Busy-fraction strips (one per device) over time, with the annotation lanes below them.

    ``strips``: (device label, frame with start_us, end_us, busy_fraction) per device, e.g. from
    ``BusyTimeline.busy_fraction_bins``. ``lanes``: from :func:`gaptrace.report.lanes.annotation_lanes`.
    Time is shown in ms from ``t0_us`` (the window start) to ``t1_us``. The ``MAX_LEGEND`` range names with the
    most time get their own colour and legend entry; the others are grey.
    """
    lane_names = list(dict.fromkeys(lanes["lane"])) if len(lanes) else []
    n_strips = max(len(strips), 1)
    strip_px, lane_px, gap_px = 150, 26, 30
    lanes_px = lane_px * len(lane_names)
    height = 60 + n_strips * (strip_px + gap_px) + (lanes_px + gap_px + 60 if lane_names else 0) + 40
    plot_px = height - 100
    data: list[dict] = []
    layout: dict = {
        "height": height, "margin": {"l": 110, "r": 20, "t": 20, "b": 50}, "font": FONT, "showlegend": False,
        "hovermode": "closest", "plot_bgcolor": "#ffffff", "bargap": 0.15, "barmode": "overlay",
        "uniformtext": {"minsize": 9, "mode": "hide"},
        "xaxis": {"title": {"text": "time from window start (ms)"}, "zeroline": False,
                  "range": [0.0, float(_ms(t1_us, t0_us))], "showgrid": True,
                  "gridcolor": "#eeeeee", "anchor": f"y{n_strips + (1 if lane_names else 0)}"
                  if n_strips + (1 if lane_names else 0) > 1 else "y"},
    }
    top = 1.0
    for k, (label, bins) in enumerate(strips):
        axis = "y" if k == 0 else f"y{k + 1}"
        h = strip_px / plot_px
        dom = [max(top - h, 0.0), top]
        top = dom[0] - gap_px / plot_px
        x = np.r_[_ms(bins["start_us"], t0_us), _ms(bins["end_us"].iloc[-1:], t0_us)] if len(bins) else []
        y = np.r_[bins["busy_fraction"].to_numpy(), bins["busy_fraction"].to_numpy()[-1:]] if len(bins) else []
        y = np.round(np.asarray(y, dtype=np.float64), 4)
        data.append({
            "type": "scatter", "mode": "lines", "x": list(map(float, x)), "y": list(map(float, y)),
            "xaxis": "x", "yaxis": axis, "line": {"shape": "hv", "width": 1, "color": BUSY_COLOUR},
            "fill": "tozeroy", "fillcolor": "rgba(42,127,98,0.45)", "name": esc(label), "showlegend": False,
            "hovertemplate": "%{x:.3f} ms: busy %{y:.1%}<extra></extra>",
        })
        layout["yaxis" if k == 0 else f"yaxis{k + 1}"] = {
            "domain": dom, "range": [0, 1.02], "tickformat": ".0%", "title": {"text": esc(label, 24)},
            "anchor": "x", "gridcolor": "#eeeeee", "fixedrange": True}
    if lane_names:
        axis_no = n_strips + 1
        layout[f"yaxis{axis_no}"] = {
            "domain": [0.0, max(top, 0.0)], "type": "category", "categoryorder": "array",
            "categoryarray": lane_names[::-1], "anchor": "x", "fixedrange": True, "showgrid": False}
        names = lanes["name"].to_numpy(dtype=object)
        start = _ms(lanes["start_us"], t0_us)
        dur = np.maximum(_ms(lanes["end_us"], t0_us) - start, 0.0)
        counts = lanes["count"].to_numpy()
        # one trace (and legend entry) per name, the MAX_LEGEND names with the most time; the rest share one
        total = pd.Series(dur).groupby(pd.Series(names)).sum().sort_values(ascending=False)
        top = [n for n in total.index if n][:MAX_LEGEND]
        group = np.where(pd.Series(names).isin(top).to_numpy(), names, "")
        for k, n in enumerate([*top, ""]):
            m = group == n
            if not m.any():
                continue
            text = [esc(x, 40) if x else f"{c} ranges" for x, c in zip(names[m], counts[m])]
            hover = [f"{esc(x, 200) if x else 'several names'}{f' ({c} ranges merged)' if c > 1 else ''}"
                     f"<br>{s:.3f} ms + {d:.3f} ms" for x, c, s, d in zip(names[m], counts[m], start[m], dur[m])]
            data.append({
                "type": "bar", "orientation": "h", "base": list(map(float, start[m])),
                "x": list(map(float, dur[m])), "y": list(lanes["lane"].to_numpy()[m]), "xaxis": "x",
                "yaxis": f"y{axis_no}", "marker": {"color": PALETTE[k % len(PALETTE)] if n else "#bbbbbb"},
                "text": text, "textposition": "inside", "insidetextanchor": "start", "hovertext": hover,
                "hoverinfo": "text", "name": esc(n, 40) if n else "other ranges", "showlegend": True,
                "textfont": {"color": "#ffffff"}, "width": 0.8,
            })
        layout["showlegend"] = True
        layout["legend"] = {"orientation": "h", "x": 0, "y": -60 / plot_px, "yanchor": "top",
                            "font": {"size": 11}}
    return {"data": data, "layout": layout}


def icicle_figure(tree: StackTree, max_nodes: int = 300, min_share: float = 0.002) -> dict:
    """Icicle chart of the gap-clipped stacks: thread → outermost frame → ... → innermost, sized by idle µs.

    A box's size is the self idle of its subtree (so the boxes under a thread add up to the idle under that
    thread's events, counted once). Keeps at most ``max_nodes`` boxes (largest first) and drops boxes under
    ``min_share`` of the device's idle; a dropped box's idle stays in its parent's box. A node is only kept with
    its parent. Colour = the box's own idle, including that of dropped children (pale: the time sits deeper;
    dark red: it sits right here).
    """
    nodes = tree.nodes
    total = tree.total_idle_us if tree.total_idle_us > 0 else 1.0
    nodes = nodes[nodes["subtree_idle_us"] >= min_share * total]
    if nodes.empty:  # no stacks, or none holding idle (a window without idle)
        return {"data": [], "layout": {"height": 120, "font": FONT}}
    nodes = nodes.sort_values(["subtree_idle_us", "depth"], ascending=[False, True]).head(max_nodes)
    nodes = nodes.sort_values("depth", kind="stable")
    kept = set(nodes["node"].tolist())
    ok = nodes["parent"].isin(kept) | (nodes["parent"] < 0)
    while not ok.all():  # close the set under "parent kept"
        nodes = nodes[ok]
        kept = set(nodes["node"].tolist())
        ok = nodes["parent"].isin(kept) | (nodes["parent"] < 0)
    size = nodes.set_index("node")["subtree_idle_us"]
    kept_child = nodes[nodes["parent"] >= 0].groupby("parent")["subtree_idle_us"].sum()
    own = (size - kept_child.reindex(size.index, fill_value=0.0)).clip(lower=0.0)
    boxes = _collapse_chains(nodes, own)
    info = nodes.set_index("node")
    ids, parents, labels, values, hover = [], [], [], [], []
    for rep, chain, parent in boxes:
        ids.append(f"n{rep}")
        parents.append("" if parent < 0 else f"n{parent}")
        inner = info.loc[chain[-1]]
        labels.append(_chain_label([str(info.loc[c, "label"]) for c in chain]))
        values.append(float(round(sum(own.loc[c] for c in chain), 3)))
        frames = "<br>".join(("  " * k + "› " if k else "") + esc_tail(info.loc[c, "label"], 140)
                             for k, c in enumerate(chain[-12:]))
        more = f"({len(chain) - 12} outer frames not shown)<br>" if len(chain) > 12 else ""
        i_us, s_us = float(inner["inclusive_idle_us"]), float(inner["self_idle_us"])
        hover.append(f"{more}{frames}<br>inclusive idle {i_us / 1000:,.3f} ms ({i_us / total:.1%} of GPU idle)"
                     f"<br>self idle {s_us / 1000:,.3f} ms ({s_us / total:.1%})<br>{int(inner['events'])} host "
                     "event(s)")
    depth = {rep: 0 for rep, _, _ in boxes}
    for rep, _, parent in boxes:  # boxes come parents first
        depth[rep] = depth[parent] + 1 if parent >= 0 else 0
    return {
        "data": [{
            "type": "icicle", "ids": ids, "labels": labels, "parents": parents, "values": values,
            "branchvalues": "remainder", "hovertext": hover, "hoverinfo": "text", "textinfo": "label",
            "sort": False, "tiling": {"orientation": "v"}, "maxdepth": min(max(depth.values()) + 1, 12),
            "marker": {"colors": [v / total for v in values], "colorscale": HEAT, "cmin": 0.0,
                       "cmax": max(max(values) / total, 1e-9)},
            "root": {"color": "#f4f4f4"}, "pathbar": {"visible": True},
        }],
        "layout": {"height": int(min(max(100 * (max(depth.values()) + 1), 220), 640)),
                   "margin": {"l": 5, "r": 5, "t": 30, "b": 5}, "font": FONT},
    }


_SOURCE_RE = re.compile(r"\(\d+\):\s")


def _chain_label(frames: list[str]) -> str:
    """Label of a collapsed chain (outer to inner): its last two frames, preceded by the innermost Python frame
    with a source file when that one is further out (the call site an engineer looks for)."""
    if len(frames) == 1:
        return esc_tail(frames[0], 60)
    tail = frames[-2:]
    k = next((k for k in range(len(frames) - 3, -1, -1)
              if _SOURCE_RE.search(frames[k]) and not frames[k].startswith("<built-in")), None)
    parts = [esc_tail(f, 50) for f in tail]
    if k is not None:
        parts = [esc_tail(frames[k], 50)] + (["⋯"] if k < len(frames) - 3 else []) + parts
    elif len(frames) > 2:
        parts = ["⋯"] + parts
    return " › ".join(parts)


def _collapse_chains(nodes: pd.DataFrame, own: pd.Series, keep_share: float = 0.01) -> list[tuple[int, list, int]]:
    """Merge pass-through frames: a box whose only child holds all but ``keep_share`` of it takes the child in.

    Deep Python stacks are mostly chains of single callers (``<module>`` → ``main`` → ``run`` → ...); one box per
    frame would spend the icicle's rows on them. Returns (box id, [node ids of the chain, outer to inner],
    parent box id or -1) per box, parents before children. Thread roots are never merged. At most ``max_nodes``
    nodes, so plain Python over nodes is fine here.
    """
    parent = dict(zip(nodes["node"], nodes["parent"]))
    size = dict(zip(nodes["node"], nodes["subtree_idle_us"]))
    n_children: dict[int, int] = {}
    for p in nodes["parent"]:
        n_children[p] = n_children.get(p, 0) + 1
    box_of: dict[int, int] = {}
    chains: dict[int, list] = {}
    order = []
    for n in nodes["node"]:  # sorted by depth: parents first
        p = parent[n]
        if (p >= 0 and parent[p] >= 0 and n_children.get(p, 0) == 1
                and own.loc[p] <= keep_share * size[p]):
            box_of[n] = box_of[p]
            chains[box_of[p]].append(n)
        else:
            box_of[n] = n
            chains[n] = [n]
            order.append(n)
    return [(b, chains[b], box_of[parent[b]] if parent[b] >= 0 else -1) for b in order]


def launch_fit_figure(points: pd.DataFrame, fit: dict | None, unprofiled: pd.DataFrame | None) -> dict:
    """Scatter of (N device activities, host µs) per graph launch, the fitted line t0 + κN, per-N medians, and the
    unprofiled launch costs the capture measured (``unprofiled``: columns name, nodes, unprofiled_launch_us).

    ``points``: columns nodes, host_us. ``fit``: the analysis's ``launch_fit`` dict (kappa_us_per_node, t0_us,
    r2, graphs) or None. DESIGN.md "Launch fit".
    """
    data: list[dict] = []
    if len(points):
        data.append({"type": "scatter", "mode": "markers", "name": "profiled launches",
                     "x": points["nodes"].astype(float).tolist(), "y": np.round(points["host_us"], 3).tolist(),
                     "marker": {"size": 6, "color": "rgba(78,121,167,0.55)"},
                     "hovertemplate": "N=%{x:.0f}: %{y:,.1f} µs<extra>launch</extra>"})
    xmax = float(points["nodes"].max()) if len(points) else 1.0
    if unprofiled is not None and len(unprofiled):
        xmax = max(xmax, float(unprofiled["nodes"].max()))
    if fit and fit.get("kappa_us_per_node") is not None and fit.get("t0_us") is not None:
        k, t0 = float(fit["kappa_us_per_node"]), float(fit["t0_us"])
        data.append({"type": "scatter", "mode": "lines", "name": f"fit: {t0:,.1f} µs + {k:.3f} µs × N",
                     "x": [0.0, xmax * 1.05], "y": [t0, t0 + k * xmax * 1.05],
                     "line": {"color": "#e15759", "width": 2, "dash": "dash"}, "hoverinfo": "skip"})
    graphs = (fit or {}).get("graphs") or []
    if graphs:
        g = pd.DataFrame(graphs)
        if {"nodes", "median_us"} <= set(g.columns):
            data.append({"type": "scatter", "mode": "markers", "name": "median per N",
                         "x": g["nodes"].astype(float).tolist(), "y": g["median_us"].astype(float).tolist(),
                         "marker": {"symbol": "diamond", "size": 11, "color": "#f28e2b",
                                    "line": {"width": 1, "color": "#333"}},
                         "hovertemplate": "N=%{x:.0f}: median %{y:,.1f} µs<extra>profiled</extra>"})
    if unprofiled is not None and len(unprofiled):
        names = [esc(n, 60) for n in unprofiled["name"]]
        data.append({"type": "scatter", "mode": "markers", "name": "unprofiled (capture sidecar)",
                     "x": unprofiled["nodes"].astype(float).tolist(),
                     "y": unprofiled["unprofiled_launch_us"].astype(float).tolist(),
                     "marker": {"symbol": "x", "size": 12, "color": "#59a14f"},
                     "hovertext": [f"{n}: N={x:.0f}, {y:,.1f} µs without the profiler" for n, x, y in
                                   zip(names, unprofiled["nodes"], unprofiled["unprofiled_launch_us"])],
                     "hoverinfo": "text"})
    return {"data": data, "layout": {
        "height": 420, "margin": {"l": 70, "r": 20, "t": 20, "b": 50}, "font": FONT, "plot_bgcolor": "#ffffff",
        "xaxis": {"title": {"text": "N: device activities launched by one cudaGraphLaunch"}, "rangemode": "tozero",
                  "gridcolor": "#eeeeee"},
        "yaxis": {"title": {"text": "host time of the launch (µs)"}, "rangemode": "tozero", "gridcolor": "#eeeeee"},
        "legend": {"x": 0.01, "y": 0.99, "bgcolor": "rgba(255,255,255,0.8)"}}}


def rounds_figure(rounds: list[dict]) -> dict:
    """Per verify round: Tround as a stacked bar of TGPU (device busy) and Tserial (device idle), with Thost as
    markers (DESIGN.md "Rounds": overlapped, Tround ≈ max(TGPU, Thost); synced, TGPU + Tserial).

    ``rounds``: dicts with keys round, troundus, tgpuus, tserialus, thostus (µs; normalised names, missing -> gap).
    """
    def col(key: str) -> list[float | None]:
        out = []
        for r in rounds:
            try:
                out.append(round(float(r[key]) / 1000.0, 6))
            except (KeyError, TypeError, ValueError):
                out.append(None)
        return out

    x = [esc(r.get("round", i)) for i, r in enumerate(rounds)]
    data = [
        {"type": "bar", "name": "TGPU (device busy)", "x": x, "y": col("tgpuus"), "marker": {"color": BUSY_COLOUR},
         "hovertemplate": "round %{x}: TGPU %{y:,.3f} ms<extra></extra>"},
        {"type": "bar", "name": "Tserial (device idle)", "x": x, "y": col("tserialus"),
         "marker": {"color": "#e15759"}, "hovertemplate": "round %{x}: Tserial %{y:,.3f} ms<extra></extra>"},
        {"type": "scatter", "mode": "markers", "name": "Thost (host dispatch)", "x": x, "y": col("thostus"),
         "marker": {"symbol": "diamond", "size": 10, "color": "#4e79a7", "line": {"width": 1, "color": "#222"}},
         "hovertemplate": "round %{x}: Thost %{y:,.3f} ms<extra></extra>"},
    ]
    return {"data": data, "layout": {
        "height": 320, "barmode": "stack", "margin": {"l": 70, "r": 20, "t": 20, "b": 50}, "font": FONT,
        "plot_bgcolor": "#ffffff", "xaxis": {"title": {"text": "round"}, "type": "category"},
        "yaxis": {"title": {"text": "ms"}, "rangemode": "tozero", "gridcolor": "#eeeeee"},
        "legend": {"orientation": "h", "x": 0, "y": 1.12}}}


def savings_figure(rows: list[tuple[str, float, float | None]], predicted_us: float,
                   measured_us: float | None = None) -> dict:
    """What fixing it buys: one horizontal bar per finding from the predicted unprofiled round after its fix to
    the predicted round as it is (a dashed line; the bar's length is the saving, ms) and the measured unprofiled round when the sidecar has one
    (a dotted line). ``rows``: (label, after_round_us, saving_us or None) in the findings' order (by saving)."""
    labels = [esc_tail(lbl, 70) for lbl, _, _ in rows]
    after = [round(float(a) / 1000.0, 6) for _, a, _ in rows]
    text = [("saves %.3f ms" % (s / 1000.0)) if s is not None else "" for _, _, s in rows]
    pred = round(predicted_us / 1000.0, 6)
    shapes = [{"type": "line", "x0": pred, "x1": pred, "yref": "paper", "y0": 0, "y1": 1,
               "line": {"color": "#e15759", "dash": "dash", "width": 2}}]
    # the notes sit above the plot, bottom-anchored and shifted in pixels (paper units would overlap on a short plot)
    notes = [{"x": pred, "y": 1, "yref": "paper", "yanchor": "bottom", "yshift": 2, "text": "predicted round now",
              "showarrow": False, "font": {"size": 11, "color": "#e15759"}, "xanchor": "right"}]
    if measured_us is not None:
        m = round(measured_us / 1000.0, 6)
        shapes.append({"type": "line", "x0": m, "x1": m, "yref": "paper", "y0": 0, "y1": 1,
                       "line": {"color": "#555555", "dash": "dot", "width": 1}})
        # a line of its own above the other note: the two are often at one x (the model fitted to the measurement)
        notes.append({"x": m, "y": 1, "yref": "paper", "yanchor": "bottom", "yshift": 18,
                      "text": "measured unprofiled", "showarrow": False,
                      "font": {"size": 11, "color": "#555555"}, "xanchor": "right"})
    # each bar runs from the round after the fix to the round as it is: its length is the saving
    saved = [round(pred - a, 6) for a in after]
    lo = min([*after, pred] + ([round(measured_us / 1000.0, 6)] if measured_us is not None else []))
    data = [{"type": "bar", "orientation": "h", "name": "predicted saving", "y": labels, "x": saved, "base": after,
             "text": text, "textposition": "auto", "marker": {"color": BUSY_COLOUR}, "customdata": after,
             "hovertemplate": "%{y}<br>round after the fix %{customdata:,.3f} ms<br>%{text}<extra></extra>"}]
    return {"data": data, "layout": {
        "height": 130 + 34 * max(len(rows), 1), "margin": {"l": 20, "r": 20, "t": 70, "b": 45}, "font": FONT,
        "plot_bgcolor": "#ffffff", "shapes": shapes, "annotations": notes,
        "xaxis": {"title": {"text": "predicted unprofiled round (ms): after the fix (bar start) to now (dashed)"},
                  # room right of the dashed line for a short bar's label ("saves 0.056 ms"), which sits outside it
                  "range": [round(0.97 * lo, 6), round(pred + 0.25 * max(pred - 0.97 * lo, 1e-6), 6)],
                  "gridcolor": "#eeeeee"},
        "yaxis": {"autorange": "reversed", "automargin": True, "type": "category"}, "showlegend": False}}
