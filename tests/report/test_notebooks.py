"""The three hunts in notebooks/ run top to bottom with nbclient, and the figures each prints in its last cell (one
JSON line) are checked against an independent computation from the raw JSON (stdlib json and plain loops,
tests/_idle_reference.py; the launch fit's Theil–Sen line written out again here). What the replay predicts is
checked against what the capture measured without the profiler (its sidecar, and pairs.json for the pairs).
Also: the notebooks are committed without outputs, and an HTML export (nbconvert) of the first one run on a trace
whose names are markup keeps them escaped."""
from __future__ import annotations

import gzip
import json
import os
import re
import statistics
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: _idle_reference

from _idle_reference import Busy, device_intervals, raw_events  # noqa: E402

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NB_DIR = os.path.join(ROOT, "notebooks")
SLOW = os.path.join(NB_DIR, "why_is_my_decode_slow.ipynb")
FIX = os.path.join(NB_DIR, "did_my_fix_work.ipynb")
LYING = os.path.join(NB_DIR, "is_the_profiler_lying.ipynb")
SYNC = "h200_pairs/bench_sync_bs8_B12"
OVERLAP = "h200_pairs/bench_overlap_bs8_B12_clean_a"
PAIR_FAULT = "h200_pairs/bench_overlap_bs8_B12_lengths-copy"
PAIR_CLEAN = "h200_pairs/bench_overlap_bs8_B12_clean_a"
TRACES = os.path.join(ROOT, "fixtures", "traces")
HOST_CATS = {"python_function", "cpu_op", "user_annotation", "cuda_runtime", "cuda_driver"}
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
PLOTLY = "application/vnd.plotly.v1+json"


def run_notebook(path: str, params: dict, cwd) -> "nbformat.NotebookNode":
    """Execute the notebook in ``cwd`` (outside the repository: it must find its traces) with ``params`` appended
    to its parameters cell."""
    nb = nbformat.read(path, as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    cell.source += "\n" + "\n".join(f"{k} = {v!r}" for k, v in params.items())
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


def figures(nb) -> dict:
    """The JSON line the notebook's last cell prints."""
    out = [o for o in nb.cells[-1].get("outputs", []) if o.output_type == "stream"]
    return json.loads(out[-1].text.strip().splitlines()[-1])


def errors(nb) -> list:
    return [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]


def plots(nb) -> int:
    return sum(PLOTLY in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))


def sidecar(name: str) -> dict:
    with open(os.path.join(TRACES, name + ".gaptrace.json")) as f:
        return json.load(f)


def window_busy(name: str, events: list[dict]) -> Busy:
    """Busy timeline of GPU 0 over the sidecar's window (first start to last end of its ranges), from raw JSON."""
    window = sidecar(name)["analysis_window"]
    ann = [e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation" and e["name"] == window]
    t0, t1 = min(e["ts"] for e in ann), max(e["ts"] + e["dur"] for e in ann)
    return Busy(device_intervals(events, device=0), t0, t1)


def round_starts(events: list[dict]) -> list[float]:
    return sorted(e["ts"] for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"
                  and e["name"] == "round")


def periods(events: list[dict]) -> list[float]:
    s = round_starts(events)
    return [b - a for a, b in zip(s, s[1:])]


def steady_mean(p: list[float]) -> float:
    """Mean round period over the steady rounds: all but the first when the first is shorter than 75% of the
    median period (it began on a drained device queue; analyses/rounds.py, its module docstring)."""
    return statistics.mean(p[1:] if len(p) >= 3 and p[0] < 0.75 * statistics.median(p) else p)


def unprofiled_ms(name: str) -> float:
    return statistics.median(sidecar(name)["unprofiled_round_ms"])


def frame_key(name: str) -> str:
    """Object addresses out of a frame name (``... object at 0x7f...>``), so calls aggregate per call site."""
    return re.sub(r"0x[0-9a-fA-F]{4,}", "0x…", re.sub(r"\s+at\s+0x[0-9a-fA-F]+", "", name))


def device_side_gaps(events: list[dict], busy: Busy) -> list[tuple[float, float]]:
    """The gaps of ``busy`` whose ending activity (the first, in file order, starting where the gap ends) had been
    launched before the gap began: its launch call (same correlation id) ended at or before the gap's start."""
    launch_end = {e["args"]["correlation"]: e["ts"] + e["dur"] for e in events
                  if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")
                  and (e.get("args") or {}).get("correlation", -1) >= 0}
    first_at: dict[float, int] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS and int(e["args"].get("device", -1)) == 0:
            first_at.setdefault(float(e["ts"]), e["args"].get("correlation", -1))
    return [(a, b) for a, b in busy.gaps() if b in first_at and launch_end.get(first_at[b], float("inf")) <= a]


@pytest.fixture(scope="module")
def sync_events():
    return raw_events(SYNC)


@pytest.fixture(scope="module")
def overlap_events():
    return raw_events(OVERLAP)


@pytest.mark.parametrize("path", [SLOW, FIX, LYING])
def test_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)
    assert sum("parameters" in c.metadata.get("tags", []) for c in code) == 1


# --- why_is_my_decode_slow.ipynb -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    nb = run_notebook(SLOW, {}, tmp_path_factory.mktemp("slow"))
    return nb, figures(nb)


def test_slow_ran_with_its_charts(slow):
    nb, fig = slow
    assert not errors(nb)
    assert plots(nb) == 5  # occupancy strip, idle split, icicle, rounds, what-if savings
    assert fig["trace"] == os.path.basename(SYNC) + ".json.gz" and fig["window"] == "round"


def test_slow_occupancy_and_idle_split_are_the_raw_ones(slow, sync_events):
    _, fig = slow
    busy = window_busy(SYNC, sync_events)
    assert fig["window_ms"] == pytest.approx((busy.t1 - busy.t0) / 1e3, abs=1e-6)
    assert fig["busy_ms"] == pytest.approx(busy.busy / 1e3, abs=1e-6)
    assert fig["idle_ms"] == pytest.approx(busy.idle / 1e3, abs=1e-6)
    assert fig["occupancy"] == pytest.approx(busy.busy / (busy.t1 - busy.t0), abs=1e-9)
    assert fig["gaps"] == len(busy.gaps())
    device_side = sum(b - a for a, b in device_side_gaps(sync_events, busy))
    assert fig["device_side_ms"] == pytest.approx(device_side / 1e3, abs=1e-3)
    assert fig["host_wait_ms"] + fig["device_side_ms"] == pytest.approx(busy.idle / 1e3, abs=1e-5)


def test_slow_frames_hold_the_raw_idle(slow, sync_events):
    _, fig = slow
    busy = window_busy(SYNC, sync_events)
    # host-wait idle only: the device-side gaps (charged to no host frame) count as busy here
    busy = Busy(device_intervals(sync_events, device=0) + device_side_gaps(sync_events, busy), busy.t0, busy.t1)
    by_frame: dict[str, list] = {}
    for e in sync_events:
        if e.get("ph") == "X" and e.get("cat") in HOST_CATS:
            by_frame.setdefault(frame_key(e["name"]), []).append((e["ts"], e["ts"] + e["dur"]))
    assert len(fig["frames"]) == 8
    for r in fig["frames"]:  # inclusive idle of a frame = idle under the union of its occurrences (brute force)
        assert r["inclusive_idle_ms"] == pytest.approx(busy.idle_under_union(by_frame[r["frame"]]) / 1e3,
                                                       rel=1e-9, abs=1e-9), r["frame"]
        assert r["self_idle_ms"] <= r["inclusive_idle_ms"] + 1e-9
    assert [r["self_idle_ms"] for r in fig["frames"]] == sorted((r["self_idle_ms"] for r in fig["frames"]),
                                                                reverse=True)


def test_slow_top_sync_is_the_lengths_copy(slow, sync_events):
    _, fig = slow
    top = fig["top_sync"]
    assert top["call"] == "cudaMemcpyAsync" and top["aten_op"] == "aten::to"
    assert top["site"].endswith("device_lengths_to_host")
    busy = window_busy(SYNC, sync_events)
    outer = [(e["ts"], e["ts"] + e["dur"]) for e in sync_events if e.get("cat") == "python_function"
             and e["name"] == top["site"] and busy.t0 <= e["ts"] < busy.t1]
    copies = [e for e in sync_events if e.get("cat") == "cuda_runtime" and e["name"] == "cudaMemcpyAsync"
              and any(s <= e["ts"] and e["ts"] + e["dur"] <= t for s, t in outer)]
    assert top["count"] == len(copies) == len(outer) == 8  # one per profiled round (8 in the shipped capture)
    assert 0.5 < top["idle_share"] <= 1


def test_slow_rounds_and_whatif_against_the_measured_round(slow, sync_events):
    _, fig = slow
    p = periods(sync_events)
    rr = fig["rounds"]
    assert rr["rounds"] == len(p) == 7
    assert rr["t_round_ms"] == pytest.approx(steady_mean(p) / 1e3, rel=1e-9)
    assert rr["tpot_ms"] == pytest.approx(rr["t_round_ms"] / rr["tau"], rel=1e-9)
    w = fig["whatif"]
    assert w["profiled_round_ms"] == pytest.approx(statistics.median(p) / 1e3, rel=1e-9)
    meas = unprofiled_ms(SYNC)
    assert w["measured_unprofiled_ms"] == pytest.approx(meas, rel=1e-12)
    # the replay takes most of the profiler out: the prediction is nearer the measured round than the profiled one
    assert abs(w["predicted_round_ms"] - meas) < 0.1 * meas
    assert abs(w["predicted_round_ms"] - meas) < abs(w["profiled_round_ms"] - meas)
    from gaptrace import load_trace
    from gaptrace.analyses.whatif import whatif
    from gaptrace.capture import read_sidecar
    path = os.path.join(TRACES, SYNC + ".json.gz")
    assert w["predicted_round_ms"] == pytest.approx(
        whatif(load_trace(path), sidecar=read_sidecar(path)).data["before_round_us"] / 1e3, rel=1e-9)
    sav = {r["site"]: r["saving_ms"] for r in fig["savings"]}
    assert list(sav.values()) == sorted(sav.values(), reverse=True)
    # the blocking copy is among the best fixes (at least half the largest saving: here the plan's host work, which
    # overlaps it); the idle under the graph launches is charged to the launch (the profiler's cost, no fix), not to
    # the graph's Python launch frame: that frame is no longer a finding, or one that buys almost nothing
    assert sav[fig["top_sync"]["site"]] >= 0.5 * max(sav.values())
    launch = [k for k in sav if "graphs.py(" in k and k.endswith(": __call__")]
    assert all(sav[k] < 0.2 * sav[fig["top_sync"]["site"]] for k in launch), sav
    assert fig["top_sync"]["site"] in list(sav)[:3] and sav[fig["top_sync"]["site"]] > 0.05 * meas  # 8.5% of the round


def test_html_export_escapes_hostile_names(tmp_path, monkeypatch):
    """Frame, range and GPU names that are markup, shown by the notebook (tables, charts, printed lines) and
    exported to HTML with nbconvert. The trace has no sidecar and no rounds: those sections say so and step aside."""
    nbconvert = pytest.importorskip("nbconvert")
    # nbconvert's templates live under the prefix it was installed in (share/jupyter), which a virtual environment
    # layered over another one does not have as its own: name it
    shared = os.path.join(os.path.dirname(nbconvert.__file__), *[os.pardir] * 4, "share", "jupyter")
    if os.path.isdir(os.path.join(shared, "nbconvert", "templates")):
        monkeypatch.setenv("JUPYTER_PATH", os.pathsep.join(filter(None, [os.environ.get("JUPYTER_PATH"),
                                                                          os.path.normpath(shared)])))
    small = os.path.join(TRACES, "tracelens_mi300x_sglang_qwen3_8b_decode.json.gz")
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
    nb = run_notebook(SLOW, {"TRACE": str(trace)}, tmp_path)
    assert not errors(nb)
    text = "".join(o.text for c in nb.cells for o in c.get("outputs", []) if o.output_type == "stream")
    assert "no what-if" in text and "no verify rounds" in text
    html, _ = nbconvert.HTMLExporter().from_notebook_node(nb)
    for k, s in enumerate(hostile, 1):
        assert s not in html, s
        assert html.count(f"alert({k})") >= 1  # shown, escaped
    for raw in ("<script>alert", "<img src=x", "<svg onload"):
        assert raw not in html


# --- did_my_fix_work.ipynb ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fix(tmp_path_factory):
    nb = run_notebook(FIX, {}, tmp_path_factory.mktemp("fix"))
    return nb, figures(nb)


def test_fix_ran_with_its_charts(fix):
    nb, fig = fix
    assert not errors(nb)
    assert plots(nb) == 2  # occupancy before/after, measured vs predicted


def test_fix_occupancy_and_rounds_are_the_raw_ones(fix, sync_events, overlap_events):
    _, fig = fix
    for k, (name, events) in enumerate(((SYNC, sync_events), (OVERLAP, overlap_events))):
        busy = window_busy(name, events)
        assert fig["occupancy"][k] == pytest.approx(busy.busy / (busy.t1 - busy.t0), abs=1e-9)
        assert fig["idle_ms"][k] == pytest.approx(busy.idle / 1e3, abs=1e-6)
        assert fig["profiled_round_ms"][k] == pytest.approx(steady_mean(periods(events)) / 1e3, rel=1e-9)
        assert fig["measured_unprofiled_ms"][k] == pytest.approx(unprofiled_ms(name), rel=1e-12)
    assert fig["occupancy"][1] > fig["occupancy"][0] + 0.1
    assert fig["measured_saving_ms"] == pytest.approx(unprofiled_ms(SYNC) - unprofiled_ms(OVERLAP), rel=1e-9)
    assert fig["tpot_wins"] and fig["tpot_ms"][1] < fig["tpot_ms"][0]


def test_fix_the_copy_vanished(fix, sync_events, overlap_events):
    _, fig = fix
    assert "cudaMemcpyAsync (aten::to) from runtime/engine/model_runner.py: device_lengths_to_host" in fig["syncs_vanished"]
    assert "runtime/engine/model_runner.py: device_lengths_to_host" in fig["frames_vanished"]

    def names(events, cat):
        return {e["name"] for e in events if e.get("cat") == cat}
    # the raw traces: the frame and its stream synchronize are in A and not in B
    assert any(n.endswith("device_lengths_to_host") for n in names(sync_events, "python_function"))
    assert not any(n.endswith("device_lengths_to_host") for n in names(overlap_events, "python_function"))
    assert "cudaStreamSynchronize" in names(sync_events, "cuda_runtime")
    assert "cudaStreamSynchronize" not in names(overlap_events, "cuda_runtime")
    # appeared: B's raw trace has the frame (line numbers aside) under host-wait idle; in A it is absent or holds
    # under 0.1% of the window's idle (summary.FRAME_MIN_SHARE: the analysis keeps frames from that share of the whole
    # idle, device-side gaps included, up)
    strip = lambda n: re.sub(r"\(\d+\)(?=: )", "", frame_key(n))  # noqa: E731
    busy_a = window_busy(SYNC, sync_events)
    busy_a = Busy(device_intervals(sync_events, device=0) + device_side_gaps(sync_events, busy_a), busy_a.t0,
                  busy_a.t1)
    b_frames = {strip(e["name"]) for e in overlap_events if e.get("cat") in HOST_CATS}
    for f in fig["frames_appeared"][:5]:
        assert f in b_frames
        occ = [(e["ts"], e["ts"] + e["dur"]) for e in sync_events
               if e.get("ph") == "X" and e.get("cat") in HOST_CATS and strip(e["name"]) == f]
        assert busy_a.idle_under_union(occ) < 0.001 * window_busy(SYNC, sync_events).idle, f


def test_fix_prediction_against_the_measured_saving(fix):
    _, fig = fix
    meas, pred = fig["measured_saving_ms"], fig["predicted_saving_ms"]
    assert pred > 0 and abs(pred - meas) < 0.35 * meas
    assert fig["predicted_round_ms"][0] - fig["predicted_round_ms"][1] == pytest.approx(pred, rel=1e-9)


def test_fix_on_a_pair_reads_the_pairs_measurement(tmp_path):
    """A fault / clean pair of h200_pairs: the measured rounds are pairs.json's, the prediction near them."""
    nb = run_notebook(FIX, {"BEFORE": f"fixtures/traces/{PAIR_FAULT}.json.gz",
                            "AFTER": f"fixtures/traces/{PAIR_CLEAN}.json.gz", "CAUSE": "lengths_copy"}, tmp_path)
    assert not errors(nb)
    fig = figures(nb)
    with open(os.path.join(TRACES, "h200_pairs", "pairs.json")) as f:
        pairs = json.load(f)
    a, b = (pairs["captures"][os.path.basename(n)]["median_ms"] for n in (PAIR_FAULT, PAIR_CLEAN))
    assert fig["measured_unprofiled_ms"] == pytest.approx([a, b], abs=1e-4)
    assert fig["measured_saving_ms"] == pytest.approx(a - b, abs=2e-4)
    pair = next(p for p in pairs["pairs"] if p["cause"] == "lengths_copy")
    # the pair's saving is against the mean of both clean twins; they agree to within 0.012 ms (pairs.json)
    c = [pairs["captures"][n]["median_ms"] for n in pair["fixed"]]
    assert fig["measured_saving_ms"] == pytest.approx(pair["measured_saving_ms"], abs=abs(c[0] - c[1]) / 2 + 1e-4)
    assert fig["predicted_saving_ms"] > 0
    assert abs(fig["predicted_saving_ms"] - fig["measured_saving_ms"]) < max(0.35 * fig["measured_saving_ms"], 0.06)
    assert "cudaMemcpyAsync (aten::to) from runtime/engine/model_runner.py: device_lengths_to_host" in fig["syncs_vanished"]


# --- is_the_profiler_lying.ipynb ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def lying(tmp_path_factory):
    nb = run_notebook(LYING, {}, tmp_path_factory.mktemp("lying"))
    return nb, figures(nb), raw_events(PAIR_FAULT)


def _weighted_median(values, weights):
    """Lower weighted median; the midpoint of two values when the cumulative weight hits half exactly."""
    pairs = sorted(zip(values, weights))
    half, acc = sum(weights) / 2, 0.0
    for k, (v, w) in enumerate(pairs):
        acc += w
        if abs(acc - half) < 1e-9 * max(half, 1) and k + 1 < len(pairs):
            return (v + pairs[k + 1][0]) / 2
        if acc >= half:
            return v
    return pairs[-1][0]


def _median(xs):
    xs = sorted(xs)
    n = len(xs)
    return (xs[(n - 1) // 2] + xs[n // 2]) / 2


def test_lying_ran_with_its_charts(lying):
    nb, _, _ = lying
    assert not errors(nb)
    assert plots(nb) == 3  # launch fit, profiler bill, predicted vs measured


def test_lying_rounds_are_the_raw_ones(lying):
    _, fig, events = lying
    p = periods(events)
    assert fig["rounds"] == len(p)
    assert fig["profiled_round_ms"] == pytest.approx(_median(p) / 1e3, rel=1e-12)
    assert fig["unprofiled_round_ms"] == pytest.approx(unprofiled_ms(PAIR_FAULT), rel=1e-12)
    assert fig["excess_ms"] == pytest.approx(fig["profiled_round_ms"] - fig["unprofiled_round_ms"], rel=1e-9)
    assert fig["excess_ms"] > 0.1 * fig["unprofiled_round_ms"]


def _launches(events):
    """(N, host µs, ts) per cudaGraphLaunch whose correlation id owns device work, from raw JSON."""
    nodes: dict[int, int] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS:
            c = e["args"].get("correlation", -1)
            nodes[c] = nodes.get(c, 0) + 1
    return [(nodes[e["args"]["correlation"]], e["dur"], e["ts"]) for e in events
            if e.get("cat") == "cuda_runtime" and e["name"].startswith("cudaGraphLaunch")
            and nodes.get(e["args"].get("correlation", -1))]


def test_lying_kappa_is_theil_sen_on_the_raw_launches(lying):
    _, fig, events = lying
    pts = _launches(events)
    assert fig["launches"] == len(pts) == 24
    sizes = sorted({n for n, _, _ in pts})
    med = {n: _median([d for m, d, _ in pts if m == n]) for n in sizes}
    cnt = {n: sum(m == n for m, _, _ in pts) for n in sizes}
    slopes, weights = [], []
    for i, a in enumerate(sizes):
        for b in sizes[i + 1:]:
            slopes.append((med[b] - med[a]) / (b - a))
            weights.append(cnt[a] * cnt[b])
    kappa = _weighted_median(slopes, weights)
    t0 = _weighted_median([med[n] - kappa * n for n in sizes], [cnt[n] for n in sizes])
    assert fig["kappa_us_per_node"] == pytest.approx(kappa, rel=1e-9)
    assert fig["t0_us"] == pytest.approx(t0, rel=1e-9, abs=1e-9)
    lo, hi = fig["kappa_interval_us_per_node"]
    assert lo < kappa < hi and hi - lo < 0.5 * kappa  # three sizes far apart pin κ down
    unprof = {}
    for g in sidecar(PAIR_FAULT)["graphs"]:
        if g.get("unprofiled_launches") and g.get("unprofiled_launch_us"):
            unprof[g["nodes"]] = g["unprofiled_launch_us"]
    for g in fig["graphs"]:
        assert g["profiled_median_us"] == pytest.approx(med[g["nodes"]], rel=1e-12)
        assert g["kappa_n_us"] == pytest.approx(kappa * g["nodes"], rel=1e-9)
        assert g["unprofiled_us"] == pytest.approx(unprof[g["nodes"]], rel=1e-12)
    big = [g for g in fig["graphs"] if g["nodes"] > 100]
    assert big and all(g["profiled_median_us"] > 10 * g["unprofiled_us"] for g in big)  # the instrument, not CUDA


def test_lying_bill_is_the_raw_events_times_the_calibration(lying):
    _, fig, events = lying
    with open(os.path.join(TRACES, "h200_pairs", "calibration_h200.json")) as f:
        cal = json.load(f)
    cost = {"cpu_op": cal["aten_op_us"], "user_annotation": cal["aten_op_us"],
            "python_function": cal["python_frame_us"], "cuda_runtime": cal["runtime_call_us"],
            "cuda_driver": cal["runtime_call_us"]}
    starts = round_starts(events)
    s0, s1, n = starts[0], starts[-1], len(starts) - 1
    pts = _launches(events)
    tid = statistics.mode(e["tid"] for e in events if e.get("cat") == "cuda_runtime"
                          and e["name"].startswith("cudaGraphLaunch"))  # the launching thread
    counts: dict[str, int] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in cost and e.get("tid") == tid and s0 <= e["ts"] < s1:
            counts[e["cat"]] = counts.get(e["cat"], 0) + 1
    bill, per = fig["bill_ms_per_round"], fig["events_per_round"]
    for cat, c in counts.items():
        assert per[f"{cat} events"] == pytest.approx(c / n, rel=1e-12), cat
        assert bill[f"{cat} events"] == pytest.approx(c / n * cost[cat] / 1e3, rel=1e-9), cat
    unprof = {g["nodes"]: g["unprofiled_launch_us"] for g in sidecar(PAIR_FAULT)["graphs"]
              if g.get("unprofiled_launches") and g.get("unprofiled_launch_us")}
    excess = [d - unprof[m] for m, d, ts in pts if s0 <= ts < s1]
    assert per["graph launches (beyond unprofiled)"] == pytest.approx(len(excess) / n, rel=1e-12)
    assert bill["graph launches (beyond unprofiled)"] == pytest.approx(sum(excess) / n / 1e3, rel=1e-9)
    dev_ops = sum(1 for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS
                  and s0 <= e["ts"] < s1)
    assert bill["device ops (CUPTI, on the GPU)"] == pytest.approx(dev_ops / n * cal["device_op_us"] / 1e3,
                                                                    rel=1e-9)


def test_lying_prediction_against_the_measured_round(lying):
    _, fig, _ = lying
    meas = fig["unprofiled_round_ms"]
    for label, pred in fig["predicted_round_ms"].items():  # both calibrations: within 11% of the measured round
        assert abs(pred - meas) < 0.11 * meas, label
        assert abs(pred - meas) < abs(fig["profiled_round_ms"] - meas), label
    assert fig["replayed_round_ms"] == pytest.approx(fig["profiled_round_ms"], rel=0.02)
