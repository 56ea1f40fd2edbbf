"""How big the report of a big trace is, how long it takes to make, and how long a browser takes to open it.

Builds (once) a trace of about ``--size-mb`` MB of JSON by replicating a real one in time (make_big_trace.py), then
times load, analysis and rendering separately, and the headless-Chromium load of the report: the time from
navigation start until the last chart is drawn, measured inside the page, next to the same for a page holding only
plotly.js (its parse is the floor), median of ``--reps``. Prints one table. Nothing here is a test: the target is
that a 100 MB trace's report opens in under 2 s.

    python benchmarks/bench_report.py [--size-mb 100] [--source TRACE] [--work /tmp/gaptrace_bench] [--reps 3]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SOURCE = os.path.join(HERE, "..", "fixtures", "traces", "h200_graph_launch_probe.json.gz")


def _chromium_seconds(path: str, exe: str) -> tuple[float, float | None]:
    """(wall seconds of ``chromium --dump-dom``, in-page seconds from navigation start to the end of the last
    script, i.e. every chart drawn) for an HTML file. The in-page time comes from a copy of the page with one
    console.log appended and the Content-Security-Policy removed (so the extra script may run)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    text = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", text)
    text = text.replace("</body>", '<script>console.log("gaptrace-drawn-ms " + performance.now())</script></body>')
    with tempfile.TemporaryDirectory() as prof:
        timed = os.path.join(prof, "timed.html")
        with open(timed, "w", encoding="utf-8") as f:
            f.write(text)
        t = time.perf_counter()
        r = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                            "--disable-background-networking", "--disable-component-update", "--disable-sync",
                            f"--user-data-dir={prof}/profile", "--enable-logging=stderr", "--v=0", "--dump-dom",
                            "file://" + timed], capture_output=True, text=True, timeout=300, check=True)
        wall = time.perf_counter() - t
    m = re.search(r"gaptrace-drawn-ms ([0-9.]+)", r.stderr)
    return wall, (float(m.group(1)) / 1000.0 if m else None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=float, default=100.0)
    p.add_argument("--source", default=DEFAULT_SOURCE)
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "gaptrace_bench_report"))
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args()

    from gaptrace import load_trace
    from gaptrace.analyze import run_analysis
    from gaptrace.report import render_report

    os.makedirs(a.work, exist_ok=True)
    trace_path = os.path.join(a.work, f"big_{int(a.size_mb)}mb.json")
    if not os.path.exists(trace_path):
        subprocess.run([sys.executable, os.path.join(HERE, "make_big_trace.py"), trace_path, "--source", a.source,
                        "--size-gb", str(a.size_mb / 1000.0)], check=True)
    rows = []
    t = time.perf_counter()
    trace = load_trace(trace_path)
    rows.append(("load", time.perf_counter() - t))
    t = time.perf_counter()
    analysis = run_analysis(trace)
    rows.append(("run_analysis", time.perf_counter() - t))
    t = time.perf_counter()
    text = render_report(trace, analysis)
    rows.append(("render_report", time.perf_counter() - t))
    out = os.path.join(a.work, "report.html")
    with open(out, "w", encoding="utf-8") as f:
        f.write(text)
    figs = re.search(r"var FIGURES = (\{.*?\});\n", text, re.S).group(1)
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    browser = []
    if exe:
        from gaptrace.report.html import plotly_js

        only = os.path.join(a.work, "plotly_only.html")
        with open(only, "w", encoding="utf-8") as f:
            f.write(f"<!DOCTYPE html><title>plotly only</title><body><script>{plotly_js()}</script></body>")
        for label, path in (("plotly.js alone", only), ("report", out)):
            runs = [_chromium_seconds(path, exe) for _ in range(a.reps)]
            browser.append((label, statistics.median(w for w, _ in runs),
                            statistics.median(d for _, d in runs if d is not None)))

    n_events = len(trace.host) + len(trace.device) + len(trace.gpu_annotations)
    print(f"trace: {trace_path}: {os.path.getsize(trace_path) / 1e6:,.1f} MB JSON, {n_events:,} events, "
          f"{len(trace.device):,} device activities, {len(trace.gpu_annotations) + int((trace.host['cat'] == 'user_annotation').sum()):,} annotation ranges")
    print(f"{'step':<34}{'value':>14}")
    for name, sec in rows:
        print(f"{name + ' (s)':<34}{sec:>14.2f}")
    print(f"{'report size (MB)':<34}{len(text.encode()) / 1e6:>14.2f}")
    print(f"{'  of which chart data (KB)':<34}{len(figs.encode()) / 1e3:>14.1f}")
    print(f"{'  chart traces / points':<34}{_count(json.loads(figs)):>14}")
    for label, wall, drawn in browser:
        print(f"{'chromium: ' + label + ', drawn (s)':<34}{drawn:>14.2f}")
        print(f"{'  wall incl. browser start (s)':<34}{wall:>14.2f}")
    if not browser:
        print("chromium not found: browser open time not measured")
    print(f"(median of {a.reps}; 'drawn' = navigation start to the last chart drawn, measured in the page; "
          f"{os.cpu_count()} CPUs)")


def _count(figs: dict) -> str:
    traces = sum(len(f["data"]) for f in figs.values())
    points = sum(len(t.get("x") or t.get("values") or []) for f in figs.values() for t in f["data"])
    return f"{traces} / {points:,}"


if __name__ == "__main__":
    main()
