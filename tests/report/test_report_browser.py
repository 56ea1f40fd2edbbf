"""The report in a real browser (headless Chromium, no network): no console errors, the charts drew, and a hostile
trace's names stay text. `.ci/run` installs Debian's chromium (`apt-get install -y chromium`)."""
from __future__ import annotations

import os
import re

import numpy as np
import pytest

from _report_helpers import MARK, chromium, console_lines, hostile_trace, read_png, run_chromium
from gaptrace.report import write_report

HERE = os.path.dirname(os.path.abspath(__file__))
PROBE = os.path.join(HERE, "..", "..", "fixtures", "traces", "h200_graph_launch_probe.json.gz")

pytestmark = pytest.mark.skipif(chromium() is None, reason="needs chromium (apt-get install -y chromium)")


def _dom(report: str, profile: str) -> tuple[str, list[str]]:
    r = run_chromium("file://" + report, profile, "--dump-dom")
    assert r.returncode == 0, r.stderr[-2000:]
    # the inlined scripts are part of the DOM text; drop them before looking at elements
    return re.sub(r"<script>.*?</script>", "", r.stdout, flags=re.S), console_lines(r.stderr)


def test_probe_report_renders_without_console_errors(tmp_path):
    report = str(tmp_path / "probe.html")
    write_report(PROBE, report)
    dom, console = _dom(report, str(tmp_path / "profile"))
    assert console == []
    # every chart div was filled by plotly (an SVG root per chart)
    for fig in ("fig-timeline", "fig-icicle", "fig-launch"):
        m = re.search(rf'<div class="chart[^"]*" id="{fig}"[^>]*>(.*?)</div>\s*(<p|<div class="row|</div>|<h2)', dom,
                      re.S)
        assert m and "main-svg" in m.group(1), f"{fig} did not render"

    png = str(tmp_path / "shot.png")
    r = run_chromium("file://" + report, str(tmp_path / "profile2"), f"--screenshot={png}",
                     "--window-size=1400,4000")  # the verdict block and "what fixing it buys" come first
    assert r.returncode == 0 and console_lines(r.stderr) == []
    img = read_png(png)[..., :3].astype(int)
    colours = np.unique(img.reshape(-1, 3) @ np.array([65536, 256, 1]))
    assert len(colours) > 100, "screenshot is (nearly) blank"
    # the occupancy strip's busy colour (#2a7f62 line, the same colour at 45% over white as fill) is on screen
    fill = np.array([42, 127, 98]) * 0.45 + 255 * 0.55
    near = (np.abs(img - fill).max(axis=2) <= 12) | (np.abs(img - [42, 127, 98]).max(axis=2) <= 12)
    assert near.sum() > 2000
    # the icicle's darkest box (#990000, the frame with the most self idle) is on screen
    assert ((np.abs(img - [153, 0, 0]).max(axis=2) <= 12).sum()) > 2000


def test_hostile_trace_runs_nothing(tmp_path):
    trace = hostile_trace(str(tmp_path / f"evil<img src=x onerror=\"document.title='{MARK}'\">.json"))
    report = str(tmp_path / "evil.html")
    write_report(trace, report)
    dom, console = _dom(report, str(tmp_path / "profile"))
    assert console == []  # no script error and no blocked inline script or handler (CSP reports those)
    title = re.search(r"<title>(.*?)</title>", dom, re.S).group(1)
    assert title.strip() != MARK and title.startswith("gaptrace: evil")
    assert not re.search(r"<(img|svg|a|b)\b[^>]*(onerror|onload|onmouseover|javascript:)", dom, re.I)
    assert "&lt;script&gt;document.title=" in dom  # the payload is on the page, as text
    assert dom.count("main-svg") >= 3
