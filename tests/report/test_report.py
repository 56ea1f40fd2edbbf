"""`gaptrace report`: content checked against independent computations on a real H200 trace, escaping of hostile
names, the sidecar, atomic output and bad input. The headless-browser checks are in test_report_browser.py."""
from __future__ import annotations

import gzip
import html
import json
import os
import re
import shutil
import statistics

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from _report_helpers import PAYLOADS, RAW_TAGS, hostile_trace
from gaptrace.cli import main
from gaptrace.report import N_BINS, render_report, write_report
from gaptrace.report.lanes import MAX_BARS_PER_LANE, annotation_lanes
from gaptrace.report.stacks import nest_parents

HERE = os.path.dirname(os.path.abspath(__file__))
PROBE = os.path.join(HERE, "..", "..", "fixtures", "traces", "h200_graph_launch_probe.json.gz")


def _events(path: str) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return json.load(f)["traceEvents"]


def _union_us(intervals: list[tuple[float, float]]) -> float:
    """Total length of a union of intervals, by a plain sort-and-sweep."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (cur_e - cur_s if cur_e is not None else 0.0)


def _figures(text: str) -> dict:
    m = re.search(r"var FIGURES = (\{.*?\});\n", text, re.S)
    assert m, "no figure data in the report"
    return json.loads(m.group(1))


def _outside_plotly(text: str) -> str:
    """The page with the inlined plotly.js bundle cut out (it legitimately contains tag-like strings)."""
    scripts = [m.span() for m in re.finditer(r"<script>.*?</script>", text, re.S)]
    assert len(scripts) == 2
    (a, b), _ = scripts
    return text[:a] + text[b:]


@pytest.fixture(scope="module")
def probe_report(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("report") / "probe.html"
    write_report(PROBE, str(out))
    return out.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def probe_busy() -> tuple[float, float, float]:
    """(occupancy, window start µs, window end µs) of the probe computed from the raw JSON: union of kernel,
    memcpy and memset intervals over first-to-last device activity."""
    iv = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in _events(PROBE)
          if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    t0, t1 = min(s for s, _ in iv), max(e for _, e in iv)
    return _union_us(iv) / (t1 - t0), t0, t1


def test_report_states_real_occupancy(probe_report, probe_busy):
    occ, t0, t1 = probe_busy
    row = re.search(r"<td class=\"num\">0</td><td class=\"\">NVIDIA H200</td>(.*?)</tr>", probe_report)
    assert row, "devices table row for GPU 0 missing"
    assert f"{100 * occ:.1f}%" in row.group(1)
    assert f"{(t1 - t0) / 1000:,.3f}" in row.group(1)


def test_strip_bins_are_exact_busy_fractions(probe_report, probe_busy):
    occ, t0, t1 = probe_busy
    strip = _figures(probe_report)["fig-timeline"]["data"][0]
    x, y = np.array(strip["x"]), np.array(strip["y"])
    assert len(x) == N_BINS + 1  # bin starts plus the last end (step line)
    assert x[0] == 0.0 and x[-1] == pytest.approx((t1 - t0) / 1000, abs=1e-5)
    widths = np.diff(x)
    assert float((y[:-1] * widths).sum() / widths.sum()) == pytest.approx(occ, abs=2e-4)  # 4-digit bins
    assert 0.0 <= y.min() and y.max() <= 1.0


def test_icicle_totals_match_idle_under_host_events(probe_report, probe_busy):
    """The thread's box equals the host-wait idle under the union of its host events, computed by sweeping the gaps.

    Host-wait idle: a gap is device-side (and not attributed) when the activity that ends it was launched by a host
    call that had already returned when the gap began."""
    occ, t0, t1 = probe_busy
    ev = _events(PROBE)
    acts = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"]), e["args"].get("correlation")) for e in ev
                  if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    launch_end = {}
    for e in ev:
        if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e["args"]:
            c = e["args"]["correlation"]
            launch_end[c] = max(launch_end.get(c, -1e300), float(e["ts"]) + float(e["dur"]))
    dev, run_end = [], None
    for s, e, c in acts:  # gaps between merged spans, filled where device-side
        if run_end is not None and s > run_end and c in launch_end and launch_end[c] <= run_end:
            dev.append((run_end, s))
        dev.append((s, e))
        run_end = e if run_end is None else max(run_end, e)
    dev.sort()
    host = [(max(float(e["ts"]), t0), min(float(e["ts"]) + float(e["dur"]), t1)) for e in ev
            if e.get("ph") == "X" and e.get("cat") in ("python_function", "cpu_op", "user_annotation",
                                                         "cuda_runtime", "cuda_driver")]
    host = [(s, e) for s, e in host if e > s]
    # idle under host events = |host union| - |host union ∩ busy union|
    inter = 0.0
    merged = []
    for s, e in sorted(host):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    bm = []
    for s, e in dev:
        if bm and s <= bm[-1][1]:
            bm[-1][1] = max(bm[-1][1], e)
        else:
            bm.append([s, e])
    i = j = 0
    while i < len(merged) and j < len(bm):
        lo, hi = max(merged[i][0], bm[j][0]), min(merged[i][1], bm[j][1])
        inter += max(0.0, hi - lo)
        if merged[i][1] < bm[j][1]:
            i += 1
        else:
            j += 1
    idle_under_host = _union_us(host) - inter
    ice = _figures(probe_report)["fig-icicle"]["data"][0]
    total = sum(ice["values"])  # remainder semantics: boxes add up to the root's size
    assert total == pytest.approx(idle_under_host, rel=1e-6, abs=1.0)
    assert len(ice["ids"]) <= 300
    assert set(ice["parents"]) - {""} <= set(ice["ids"])
    # the single-caller chain <module> -> step is one box, under the thread
    chain = ice["labels"].index("probe1.py(69): &lt;module&gt; › probe1.py(56): step")
    assert ice["parents"][chain] == ice["ids"][ice["labels"].index("thread 415/415")]


def test_launch_fit_figure_has_every_launch(probe_report):
    ev = _events(PROBE)
    n_launch = sum(1 for e in ev if e.get("ph") == "X" and e.get("name") == "cudaGraphLaunch")
    fig = _figures(probe_report)["fig-launch"]
    pts = next(t for t in fig["data"] if t["name"] == "profiled launches")
    assert len(pts["x"]) == n_launch == 42
    assert "κ (µs per node)" in probe_report


def test_report_is_small_and_self_contained(probe_report):
    assert len(probe_report.encode()) < 5.6e6  # plotly.js (~4.8 MB) plus the report
    assert len(json.dumps(_figures(probe_report))) < 400_000
    page = _outside_plotly(probe_report)
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", page), "the page must not reference the network"
    assert "connect-src 'none'" in probe_report


def test_hostile_names_are_escaped(tmp_path):
    trace = hostile_trace(str(tmp_path / "evil.json"))
    out = tmp_path / "evil.html"
    write_report(trace, str(out))
    text = out.read_text(encoding="utf-8")
    assert len(re.findall(r"<script", text, re.I)) == 2  # plotly's and the report's, nothing else
    page = _outside_plotly(text)
    for tag in RAW_TAGS:
        assert tag not in page
    for p in PAYLOADS[:2]:
        assert html.escape(p) in page  # shown as text in the tables
    # the node-bubble table's kernel names (shown shortened, whole in the title attribute) are escaped too
    bubbles = page.split('<h2 id="bubbles">')[1].split("<h2")[0]
    assert f'title="{html.escape(PAYLOADS[1])}"' in bubbles and 'href="#bubbles"' in page
    blob = re.search(r"var FIGURES = (\{.*?\});\n", text, re.S).group(1)
    assert "document.title" in blob and "<" not in blob and ">" not in blob  # nothing can close the script
    # no chart string carries a tag other than the report's own line breaks and hover suffixes
    strings = []

    def walk(v):
        if isinstance(v, str):
            strings.append(v)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    walk(_figures(text))
    for st in strings:
        assert "<" not in re.sub(r"<br>|<extra>[a-z]*</extra>", "", st), st
    # the chart labels were HTML-escaped before JSON encoding (plotly parses tags in labels)
    labels = [lbl for t in _figures(text)["fig-icicle"]["data"] for lbl in t["labels"]]
    assert any("&lt;script&gt;" in lbl for lbl in labels)
    assert not any("<" in lbl for lbl in labels)


def test_sidecar_unprofiled_launches(tmp_path):
    trace = tmp_path / "probe.json.gz"
    shutil.copy(PROBE, trace)
    side = {"config": {"preset": "probe", "name": PAYLOADS[0]}, "future_field": {"x": 1},
            "graphs": [{"name": PAYLOADS[1], "nodes": 100, "unprofiled_launch_us": 7.5},
                       {"name": "g1600", "nodes": 1600, "unprofiled_launch_us": 14.1}],
            "unprofiled_step_ms": [1.0, 1.2, 1.1], "profiled_step_ms": [3.0, 3.2, 3.1]}
    (tmp_path / "probe.gaptrace.json").write_text(json.dumps(side))
    out = tmp_path / "r.html"
    info = write_report(str(trace), str(out))
    assert info["sidecar"].endswith("probe.gaptrace.json")
    text = out.read_text(encoding="utf-8")
    med100 = statistics.median(float(e["dur"]) for e in _events(PROBE)
                               if e.get("name") == "cudaGraphLaunch" and e.get("ph") == "X"
                               and _nodes_of(e) == 100)
    assert "Unprofiled launch cost" in text
    assert f"{med100 / 7.5:,.1f}×" in text
    assert html.escape(PAYLOADS[1]) in _outside_plotly(text)
    assert "future_field" in text
    assert "the profiler adds 2.000 ms per step" in text
    unprof = next(t for t in _figures(text)["fig-launch"]["data"] if t["name"].startswith("unprofiled"))
    assert unprof["y"] == [7.5, 14.1]


_NODES: dict[int, int] = {}


def _nodes_of(launch: dict) -> int:
    if not _NODES:
        for e in _events(PROBE):
            if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
                c = (e.get("args") or {}).get("correlation")
                _NODES[c] = _NODES.get(c, 0) + 1
    return _NODES.get(launch["args"]["correlation"], 0)


def test_broken_sidecar_is_a_warning_unless_named(tmp_path):
    trace = tmp_path / "probe.json.gz"
    shutil.copy(PROBE, trace)
    (tmp_path / "probe.gaptrace.json").write_text("{not json")
    out = tmp_path / "r.html"
    write_report(str(trace), str(out))
    assert "capture sidecar ignored" in out.read_text(encoding="utf-8")
    r = CliRunner().invoke(main, ["report", str(trace), "-o", str(tmp_path / "r2.html"),
                                  "--sidecar", str(tmp_path / "probe.gaptrace.json")])
    assert r.exit_code == 2
    assert not (tmp_path / "r2.html").exists()


def test_rounds_section(tmp_path):
    """The probe annotates round_0..round_5: Tround is start-to-next-start of those ranges (from the raw JSON);
    τ from the sidecar gives TPOT = Tround / τ."""
    from gaptrace import load_trace
    from gaptrace.analyze import run_analysis

    starts = sorted(float(e["ts"]) for e in _events(PROBE)
                    if e.get("ph") == "X" and e.get("cat") == "user_annotation" and e["name"].startswith("round_"))
    periods = np.diff(starts)
    trace = load_trace(PROBE)
    analysis = run_analysis(trace)
    taus = [4, 3, 5, 2, 6]
    text = render_report(trace, analysis, {"rounds": [{"tau": t} for t in taus]})
    section = text[text.index('id="rounds"'):text.index('id="warnings"')]
    rows = re.findall(r"<tr>(.*?)</tr>", section, re.S)[1:]  # after the header row
    assert len(rows) == len(periods) == 5
    for row, period, tau in zip(rows, periods, taus):
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row)
        assert cells[1] == f"{period / 1000:,.3f}"  # Tround (ms)
        assert cells[-2] == f"{tau:,.2f}" and cells[-1] == f"{period / tau / 1000:,.3f}"  # τ, TPOT (ms)
    assert "fig-rounds" in _figures(text)
    assert "No per-round analysis" in render_report(trace, {**analysis, "rounds": None})


def test_cli_writes_atomically_and_rejects_bad_input(tmp_path):
    runner = CliRunner()
    out = tmp_path / "ok.html"
    r = runner.invoke(main, ["report", PROBE, "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert out.stat().st_size > 1e6
    assert [p.name for p in tmp_path.iterdir()] == ["ok.html"]  # no temporary left behind

    bad = tmp_path / "bad.json"
    bad.write_text("this is not json")
    r = runner.invoke(main, ["report", str(bad), "-o", str(tmp_path / "bad.html")])
    assert r.exit_code == 2
    assert len(r.output.strip().splitlines()) == 1 and "bad.json" in r.output
    assert not (tmp_path / "bad.html").exists()

    r = runner.invoke(main, ["report", PROBE, "-o", str(tmp_path / "missing" / "r.html")])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json", "ok.html"]

    r = runner.invoke(main, ["report", PROBE, "-o", str(tmp_path / "w.html"), "--window", "no_such_range"])
    assert r.exit_code == 2 and "no_such_range" in r.output
    assert not (tmp_path / "w.html").exists()

    host_only = tmp_path / "host_only.json"
    ev = [e for e in _events(PROBE) if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset")]
    host_only.write_text(json.dumps({"traceEvents": ev}))
    r = runner.invoke(main, ["report", str(host_only), "-o", str(tmp_path / "h.html")])
    assert r.exit_code == 2 and "no GPU activity" in r.output and len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "h.html").exists()


def test_nest_parents_matches_a_stack_sweep():
    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(1, 50))
        g = rng.integers(0, 3, n)
        s = rng.integers(0, 30, n).astype(float)
        e = s + rng.integers(0, 12, n)
        parent, depth = nest_parents(g, s, e)
        order = np.lexsort((np.arange(n), -e, s, g))
        want = np.full(n, -1)
        for a, i in enumerate(order):  # nearest earlier event of the group (in order) that reaches as far
            for b in range(a - 1, -1, -1):
                j = order[b]
                if g[j] != g[i]:
                    break
                if e[j] >= e[i]:
                    want[i] = j
                    break
        assert (parent == want).all()
        for i in range(n):
            k, d = i, 0
            while want[k] >= 0:
                k, d = want[k], d + 1
            assert depth[i] == d


def test_lanes_merge_many_ranges():
    n = 5000
    s = np.arange(n) * 10.0
    host = pd.DataFrame({"cat": ["user_annotation"] * n, "pid": ["1"] * n, "tid": ["1"] * n,
                         "name": np.where(np.arange(n) % 2, "draft", "verify"), "ts_us": s, "end_us": s + 6.0})
    gpu = pd.DataFrame({c: [] for c in ("name", "device", "stream", "ts_us", "end_us")})
    lanes = annotation_lanes(host, gpu, 0.0, float(s[-1] + 6.0), n_bins=1500)
    assert set(lanes["lane"]) == {"host ranges"}
    assert len(lanes) <= MAX_BARS_PER_LANE
    assert int(lanes["count"].sum()) == n
    # every range lies inside some bar
    idx = np.searchsorted(lanes["start_us"].to_numpy(), s, side="right") - 1
    assert (idx >= 0).all() and (lanes["end_us"].to_numpy()[idx] >= s + 6.0).all()
    few = annotation_lanes(host.head(10), gpu, 0.0, 200.0)
    assert len(few) == 10 and (few["count"] == 1).all() and list(few["name"][:2]) == ["verify", "draft"]


def test_report_needs_no_torch(tmp_path):
    """The report runs on an analyst's laptop: rendering must not import torch (DESIGN.md "Layout": an
    analyst renders the report on a laptop without torch)."""
    import subprocess
    import sys

    code = ("import sys; from gaptrace.report import write_report; "
            f"write_report({PROBE!r}, {str(tmp_path / 'r.html')!r}); print('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_profiled_steps_shorter_than_unprofiled_are_no_profiler_cost(tmp_path):
    """Profiled steps shorter than the unprofiled ones (other positions, a one-off in the reference) are named as
    such: never "the profiler adds −X ms"."""
    trace = tmp_path / "probe.json.gz"
    shutil.copy(PROBE, trace)
    side = {"unprofiled_step_ms": [3.0, 3.2, 3.1], "profiled_step_ms": [1.0, 1.2, 1.1]}
    (tmp_path / "probe.gaptrace.json").write_text(json.dumps(side))
    out = tmp_path / "r.html"
    write_report(str(trace), str(out))
    text = out.read_text(encoding="utf-8")
    assert "the profiled steps took 2.000 ms less" in text
    assert "the profiler adds -" not in text and "the profiler adds −" not in text


@pytest.mark.parametrize("unprof,prof", [([0.0] * 5, [1.0, 1.2]), ([1.0, 1.1], [float("nan")] * 3),
                                         ([1.0], [0.0, 0.0]), ([1e-300] * 5, [1.0]), ([True] * 3, [1.0]),
                                         (["0.6"], [1.0]), ([[0.6]], [1.0])])
def test_unusable_median_steps_give_no_profiler_sentence(tmp_path, unprof, prof):
    """A sidecar whose steps are not periods the sidecar reader accepts (0, NaN, 1e-300, booleans, strings, lists:
    analyze and whatif skip them) gets no "profiler adds" sentence, no "nan" in its Capture table and no traceback:
    the report is written."""
    trace = tmp_path / "probe.json.gz"
    shutil.copy(PROBE, trace)
    (tmp_path / "probe.gaptrace.json").write_text(json.dumps({"unprofiled_step_ms": unprof,
                                                               "profiled_step_ms": prof}))
    out = tmp_path / "r.html"
    write_report(str(trace), str(out))
    text = out.read_text(encoding="utf-8")
    cap = text[text.index('<h2 id="capture">'):]
    cap = cap[:cap.find("<h2", 5) if "<h2" in cap[5:] else len(cap)]
    assert "Median step:" not in cap and "nan" not in cap.lower()
