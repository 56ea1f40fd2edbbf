"""notebooks/your_own_trace.ipynb run top to bottom with nbclient; the numbers it prints and the CSV it writes are
checked against an independent computation from the raw JSON (tests/_idle_reference.py: stdlib json, plain loops).
Also: the notebook is committed without outputs, and its HTML export (nbconvert) escapes hostile trace names."""
from __future__ import annotations

import csv
import gzip
import json
import os
import re

import pytest

from _idle_reference import Busy, device_intervals, raw_events

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOK = os.path.join(ROOT, "notebooks", "your_own_trace.ipynb")
DEFAULT = "h200_runtime/h200_tiny_sync_bs1_B12"  # the notebook's default trace, under fixtures/traces
HOST_CATS = {"python_function", "cpu_op", "user_annotation", "cuda_runtime", "cuda_driver"}
NUM = r"(-?[\d.]+)"


def run_notebook(params: dict, cwd) -> "nbformat.NotebookNode":
    """Execute the notebook in ``cwd`` with ``params`` appended to its parameters cell."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    cell.source += "\n" + "\n".join(f"{k} = {v!r}" for k, v in params.items())
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


def printed(nb) -> str:
    return "".join(o.text for c in nb.cells for o in c.get("outputs", []) if o.output_type == "stream")


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """The notebook as shipped (default trace and window), run from a directory outside the repository."""
    cwd = tmp_path_factory.mktemp("nb")
    csv_path = cwd / "idle.csv"
    nb = run_notebook({"CSV_PATH": str(csv_path)}, cwd)
    return nb, printed(nb), csv_path


@pytest.fixture(scope="module")
def reference():
    """Window, busy timeline and host events of the default trace, from the raw JSON."""
    events = raw_events(DEFAULT)
    with open(os.path.join(ROOT, "fixtures", "traces", DEFAULT + ".gaptrace.json")) as f:
        window = json.load(f)["analysis_window"]
    ann = [e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation" and e["name"] == window]
    t0, t1 = min(e["ts"] for e in ann), max(e["ts"] + e["dur"] for e in ann)
    busy = Busy(device_intervals(events, device=0), t0, t1)
    host = [e for e in events if e.get("ph") == "X" and e.get("cat") in HOST_CATS]
    return window, t0, t1, busy, host


def _frame(name: str) -> str:
    """Object addresses out of a frame name (``... object at 0x7f...>``), so calls aggregate per call site."""
    return re.sub(r"0x[0-9a-fA-F]{4,}", "0x…", re.sub(r"\s+at\s+0x[0-9a-fA-F]+", "", name))


def test_committed_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)


def test_ran_without_errors(default_run):
    nb, text, _ = default_run
    assert not [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    plots = [o for c in nb.cells for o in c.get("outputs", []) if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert len(plots) == 2  # busy fraction over time, idle by frame


def test_printed_window_and_occupancy_are_the_independent_ones(default_run, reference):
    _, text, _ = default_run
    window, t0, t1, busy, _ = reference
    m = re.search(rf"window '{window}' on GPU 0 \(rank 0\): \[{NUM}, {NUM}\] µs", text)
    assert m, text
    assert float(m.group(1)) == pytest.approx(t0, abs=1e-3) and float(m.group(2)) == pytest.approx(t1, abs=1e-3)
    m = re.search(rf"occupancy {NUM}: busy {NUM} µs of {NUM} µs, idle {NUM} µs in (\d+) gaps", text)
    assert m, text
    occ, busy_us, window_us, idle_us, n_gaps = (float(g) for g in m.groups())
    assert window_us == pytest.approx(t1 - t0, abs=1e-3)
    assert busy_us == pytest.approx(busy.busy, abs=1e-3) and idle_us == pytest.approx(busy.idle, abs=1e-3)
    assert occ == pytest.approx(busy.busy / (t1 - t0), abs=1e-6)
    assert n_gaps == len(busy.gaps())


def test_csv_has_the_frames_with_their_idle(default_run, reference):
    _, text, csv_path = default_run
    _, _, _, busy, host = reference
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["frame", "cat", "self_idle_us", "inclusive_idle_us", "share", "gaps", "events", "parked"]
    assert not [n for n in os.listdir(csv_path.parent) if n.endswith(".tmp")]
    self_us = [float(r["self_idle_us"]) for r in rows]
    assert self_us == sorted(self_us, reverse=True)  # ranked by self idle
    by_frame: dict[str, list] = {}
    for e in host:
        by_frame.setdefault(_frame(e["name"]), []).append((e["ts"], e["ts"] + e["dur"]))
    # inclusive idle of a frame = idle under the union of its occurrences (brute force), share = that / window idle
    check = sorted(rows, key=lambda r: -float(r["inclusive_idle_us"]))[:10] + rows[:10]
    for r in check:
        incl = busy.idle_under_union(by_frame[r["frame"]])
        assert float(r["inclusive_idle_us"]) == pytest.approx(incl, rel=1e-9, abs=1e-6), r["frame"]
        assert float(r["share"]) == pytest.approx(incl / busy.idle, rel=1e-9), r["frame"]
        assert float(r["self_idle_us"]) <= float(r["inclusive_idle_us"]) + 1e-6
    # every frame whose occurrences overlap idle time is in the CSV, and nothing else
    holding = {f for f, iv in by_frame.items() if busy.idle_under_union(iv) > 0}
    assert {r["frame"] for r in rows} == holding
    top = next(r for r in rows if r["parked"] == "False")
    m = re.search(rf"wrote .*idle\.csv: (\d+) frames; most self idle: (.+) \({NUM} µs self, {NUM} µs inclusive\)",
                  text)
    assert m and int(m.group(1)) == len(rows) and m.group(2) == top["frame"], text
    assert float(m.group(3)) == pytest.approx(float(top["self_idle_us"]), abs=1e-3)


def test_html_export_escapes_hostile_names(tmp_path):
    """Frame, range and GPU names that are markup, shown by the notebook and exported to HTML with nbconvert."""
    nbconvert = pytest.importorskip("nbconvert")
    small = os.path.join(ROOT, "fixtures", "traces", "tracelens_mi300x_sglang_qwen3_8b_decode.json.gz")
    with gzip.open(small) as f:
        doc = json.load(f)
    hostile = ["</script><script>alert(1)</script>", "<img src=x onerror=alert(2)>", "\"'><svg onload=alert(3)>"]
    ev = doc["traceEvents"]
    frames = sorted({e["name"] for e in ev if e.get("cat") == "python_function"})
    for e in ev:  # every Python frame, every ATen op and every range gets a hostile name
        if e.get("cat") == "python_function":
            e["name"] = f"{hostile[0]} {frames.index(e['name'])}"
        elif e.get("cat") == "cpu_op":
            e["name"] = hostile[1]
        elif e.get("cat") == "user_annotation":
            e["name"] = hostile[2]
    device = next(e["args"]["device"] for e in ev if e.get("cat") == "kernel")
    doc["deviceProperties"] = [{"id": device, "name": hostile[1]}]
    trace = tmp_path / "hostile.json"
    trace.write_text(json.dumps(doc))
    nb = run_notebook({"TRACE": str(trace), "CSV_PATH": str(tmp_path / "h.csv")}, tmp_path)
    html, _ = nbconvert.HTMLExporter().from_notebook_node(nb)
    for k, s in enumerate(hostile, 1):
        assert s not in html, s
        assert html.count(f"alert({k})") >= 1  # shown, escaped
    for raw in ("<script>alert", "<img src=x", "<svg onload"):
        assert raw not in html


# --- notebooks/bottleneck_hunt.ipynb: the bottleneck hunt, numbers checked against the raw JSON -----------------

HUNT = os.path.join(ROOT, "notebooks", "bottleneck_hunt.ipynb")
HUNT_SYNC = "h200_runtime/h200_bench_sync_bs8_B12"
HUNT_OVERLAP = "h200_runtime/h200_bench_overlap_bs8_B12"


def _round_busy(name: str) -> Busy:
    """Busy timeline of GPU 0 over the sidecar's window (first "round" range start to last end), from raw JSON."""
    events = raw_events(name)
    with open(os.path.join(ROOT, "fixtures", "traces", name + ".gaptrace.json")) as f:
        window = json.load(f)["analysis_window"]
    ann = [e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation" and e["name"] == window]
    t0, t1 = min(e["ts"] for e in ann), max(e["ts"] + e["dur"] for e in ann)
    return Busy(device_intervals(events, device=0), t0, t1)


@pytest.fixture(scope="module")
def hunt_run(tmp_path_factory):
    nb = nbformat.read(HUNT, as_version=4)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(ROOT)}}).execute()
    return nb, printed(nb)


def _num(text: str, label: str) -> float:
    m = re.search(rf"{label}={NUM}", text)
    assert m, (label, text)
    return float(m.group(1))


def test_hunt_committed_without_outputs_and_runs_clean(hunt_run):
    committed = nbformat.read(HUNT, as_version=4)
    nbformat.validate(committed)
    assert all(not c.outputs and c.execution_count is None for c in committed.cells if c.cell_type == "code")
    nb, _ = hunt_run
    assert not [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    plots = [o for c in nb.cells for o in c.get("outputs", []) if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert len(plots) == 3  # busy fraction (sync), sync vs overlap, launch scatter


def test_hunt_occupancy_and_idle_split_are_the_raw_ones(hunt_run):
    _, text = hunt_run
    for name, label in ((HUNT_SYNC, "sync"), (HUNT_OVERLAP, "overlap")):
        busy = _round_busy(name)
        m = re.search(rf"occupancy_{label}={NUM} busy_us={NUM} window_us={NUM} idle_us={NUM}", text)
        assert m, text
        o, b, w, i = (float(g) for g in m.groups())
        assert b == pytest.approx(busy.busy, abs=1e-3) and i == pytest.approx(busy.idle, abs=1e-3)
        assert o == pytest.approx(busy.busy / w, abs=1e-6) and w == pytest.approx(busy.busy + busy.idle, abs=1e-3)
        f = re.search(rf"final_occupancy sync={NUM} overlap={NUM}", text)
        assert float(f.group(1 if label == "sync" else 2)) == pytest.approx(o, abs=1e-6)
    # the overlap capture's idle is almost all device-side; host-wait + device-side = the raw idle
    busy = _round_busy(HUNT_OVERLAP)
    m = re.search(rf"idle_split_overlap idle_us={NUM} host_wait_us={NUM} device_side_us={NUM} device_side_share={NUM}",
                  text)
    idle, host_wait, dev_side, share = (float(g) for g in m.groups())
    assert idle == pytest.approx(busy.idle, abs=1e-3)
    assert host_wait + dev_side == pytest.approx(idle, abs=3e-3) and share == pytest.approx(dev_side / idle, abs=1e-4)
    assert share > 0.5
    assert _num(text, "occupancy_overlap") > _num(text, "occupancy_sync")


def test_hunt_points_at_the_lengths_copy(hunt_run):
    _, text = hunt_run
    import gaptrace
    from gaptrace.analyze import run_analysis
    from gaptrace.capture import read_sidecar
    path = os.path.join(ROOT, "fixtures", "traces", HUNT_SYNC + ".json.gz")
    top = run_analysis(gaptrace.load_trace(path), sidecar=read_sidecar(path))["blocking_syncs"][0]
    assert re.search(r"top_sync_call=(.+)", text).group(1) == top["call"] == "cudaMemcpyAsync"
    assert re.search(r"top_sync_site=(.+)", text).group(1) == top["site"]
    assert "device_lengths_to_host" in top["site"]
    assert re.search(r"top_sync_aten=(.+)", text).group(1) == "aten::to"
    assert _num(text, "top_sync_idle_share") == pytest.approx(top["idle_share"], abs=1e-4)
    # the raw trace: one cudaMemcpyAsync per profiled round under device_lengths_to_host, 8 rounds
    assert int(_num(text, "count")) == 8


def test_hunt_bound_holds_on_the_grid(hunt_run):
    _, text = hunt_run
    if "bound_check=skipped" in text:
        pytest.skip("runtime namespace not importable")
    assert _num(text, "bound_grid_points") > 100_000 and _num(text, "bound_violations") == 0
    for W, P in ((1024, 64), (100, 16), (7, 3)):  # the claim, brute force in plain Python
        for L in range(0, 3 * W + 5 * P):
            c = L - ((L - min(L, W)) // P) * P
            for Lplan in range(L, L + 13):
                assert c <= min(Lplan, W + P - 1)
        m = re.search(rf"W={W} P={P}: max c\(L\)=(\d+) rect_width=(\d+)", text)
        assert int(m.group(1)) == int(m.group(2)) == W + P - 1


def test_hunt_glue_layer_and_launch_fit(hunt_run):
    _, text = hunt_run
    a, b = _num(text, "t_host_clean_us"), _num(text, "t_host_glue_us")
    assert b > a and _num(text, "delta_t_host_us") == pytest.approx(b - a, abs=1e-2)
    assert "glue_frame_appeared=True" in text
    # launch fit: per-graph profiled medians from the raw cudaGraphLaunch durations (the two graphs' launches do
    # not overlap in duration on this capture: split the sorted durations in half), unprofiled from the sidecar
    events = raw_events(HUNT_SYNC)
    durs = sorted(e["dur"] for e in events if e.get("ph") == "X" and e.get("cat") == "cuda_runtime"
                  and e["name"].startswith("cudaGraphLaunch"))
    assert len(durs) == int(_num(text, "launches")) == 16
    with open(os.path.join(ROOT, "fixtures", "traces", HUNT_SYNC + ".gaptrace.json")) as f:
        unprof = {g["nodes"]: g["unprofiled_launch_us"] for g in json.load(f)["graphs"] if g["unprofiled_launches"]}
    kappa, t0 = _num(text, "launch_kappa_us_per_node"), _num(text, "launch_t0_us")
    rows = re.findall(rf"graph nodes=(\d+) launches=(\d+) profiled_median_us={NUM} kappaN_us={NUM} "
                      rf"unprofiled_us={NUM}", text)
    assert len(rows) == 2
    for (nodes, n, med, kn, up), half in zip(sorted(rows, key=lambda r: int(r[0])), (durs[:8], durs[8:])):
        assert float(med) == pytest.approx((half[3] + half[4]) / 2, abs=1e-2)
        assert float(kn) == pytest.approx(kappa * int(nodes), rel=1e-3)
        assert float(up) == pytest.approx(unprof[int(nodes)], abs=1e-2)
        assert float(kn) > 10 * float(up)  # the profiler, not the driver
    assert 0 <= _num(text, "launch_r2") <= 1 and abs(t0) < kappa * 1000


def test_hunt_final_diff(hunt_run):
    _, text = hunt_run
    def pair(name):
        m = re.search(rf"final_{name} sync={NUM} overlap={NUM}", text)
        return float(m.group(1)), float(m.group(2))
    (rs, ro), (ps, po), (ts, to) = pair("t_round_us"), pair("tpot_us"), pair("tau")
    assert ps == pytest.approx(rs / ts, rel=1e-6) and po == pytest.approx(ro / to, rel=1e-6)
    assert po < ps and "accept_length_wins=True" in text and "so B wins" in text
    m = re.search(r"B saves \+?([\d.]+)% of Tround", text)
    assert m and float(m.group(1)) == pytest.approx(100 * (rs - ro) / rs, abs=0.06)
