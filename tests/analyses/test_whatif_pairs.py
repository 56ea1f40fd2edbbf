"""The replay model's counterfactuals against measured fixes on the H200 (docs/DESIGN.md "The replay model" "The proof on
measured fixes"; benchmarks/bench_whatif.py prints the same table): for every pair of
fixtures/traces/h200_pairs/pairs.json, of its repeat (h200_pairs_repeat) and of fixtures/traces/h200_loops/*.pairs.json and
h100_loops/*.pairs.json (the same loops on an H100 machine, their captures timing every record_function range
unprofiled), the predicted unprofiled period of
the with-cause capture (the shipped calibration alone) and the predicted saving of removing the cause (the model as
shipped: profiler cost scale fitted to the capture's own unprofiled rounds) against the measured figures, which are
recomputed here from the raw files (sidecar ``unprofiled_round_ms`` / ``unprofiled_step_ms``, ``LOOP.VARIANT.mK.json``
``step_periods_ms``). The bounds are the errors the model achieves today, slightly rounded up: they say how far it
is from the goal (period within 10%, saving within 35% or 60 µs), not that it meets it. The traces are the shipped
cut to 6 of the 8 profiled rounds / steps (their MANIFEST.md): the figures are those of the cut traces."""
from __future__ import annotations

import glob
import json
import os

import numpy as np
import pytest

from gaptrace.analyses.profiler_cost import THREAD_WAIT_PREFIX, thread_wait_cost
from gaptrace.analyses.whatif import Change, Context, whatif
from gaptrace.loader import load_trace
from gaptrace.sidecar import read_sidecar_checked

pytestmark = pytest.mark.slow  # ~60 s here: twenty-two captures loaded and fitted

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "traces")

# pair -> (|period error| bound vs the same process's measured period, per with-cause capture; |saving error| µs)
RUNTIME = {
    "lengths-copy, bench bs 8": ("lengths_copy", (0.04,), 30),
    "dd-gather, bench bs 8": ("dd_gather", (0.065,), 60),
    "eager-commit-glue, bench bs 8": ("eager_commit_glue", (0.055,), 1075),
    "sync vs overlap, bench bs 8": (("device_lengths_to_host", "rect_packed"), (0.07,), 60),
    "eager-commit-glue, tiny bs 1": ("eager_commit_glue", (0.80, 0.68), 310),
    "cpu-tree-build, tiny tree bs 8": ("cpu_tree_build", (0.065,), 560),
}
# the repeat set: same pairs, same bounds' meaning; its sidecars also time every NVTX range unprofiled (the replay uses
# those measured ranges, docs/DESIGN.md 5.2)
RUNTIME_REPEAT = {
    "lengths-copy, bench bs 8": ("lengths_copy", (0.03,), 15),
    "dd-gather, bench bs 8": ("dd_gather", (0.045,), 55),
    "eager-commit-glue, bench bs 8": ("eager_commit_glue", (0.04,), 1110),
    "sync vs overlap, bench bs 8": (("device_lengths_to_host", "rect_packed"), (0.11,), 40),
    "eager-commit-glue, tiny bs 1": ("eager_commit_glue", (0.035, 0.015), 185),
    "cpu-tree-build, tiny tree bs 8": ("cpu_tree_build", (0.02,), 550),
}
SET_ASIDE = {("h200_pairs_repeat", "eager-commit-glue, bench bs 8")}
SETS = {"h200_pairs": RUNTIME, "h200_pairs_repeat": RUNTIME_REPEAT}  # folder under fixtures/traces -> bounds
# loop -> (|period error| bound, vs the capture's sidecar unprofiled_step_ms, else the mK processes; |saving error| µs
# vs the fresh processes' saving; |saving error| µs vs the paired saving, both variants in the capture's own process)
# (captures entered the profiler only after their unprofiled warm-up steps, docs/DESIGN.md 5.3)
LOOPS = {
    "graph_readback": (0.45, 45, 50),
    "helper_thread": (0.06, 140, 65),
    "hf_generate": None,  # measured figures only: its trace is not shipped (the pair's range includes 0; the H100 one stays)
    "host_detokenize": (0.33, 510, 185),
    "launch_bound": (0.26, 1600, 3100),  # --graph at the scale's floor 0.5 (its warm-up slower than its processes)
    "pageable_htod": (0.62, 690, 495),
    "per_request_readback": (0.05, 180, 35),
    "train_step_logging": (0.05, 15, 90),
}
# the H100 set (same meaning): two fresh processes a variant, and the captures' sidecars hold the loops' record_function
# ranges timed unprofiled (gaptrace.capture.Capture), which the replay gives their measured host time. These traces
# take the shipped H100 calibration (the one of their GPU model), whose host costs are below the H200 host's: the
# calibration-alone period errors grew with it (per_request_readback 0.13 -> 0.42, host_detokenize 0.15 -> 0.39) while
# the savings, fitted to the capture's own steps, kept or improved (launch_bound 510 -> 160 µs)
LOOPS_H100 = {
    "graph_readback": (0.09, 50, 50),
    "helper_thread": (0.36, 20, 20),
    "hf_generate": (9.1, 380, 210),
    "host_detokenize": (0.39, 25, 20),
    "launch_bound": (0.015, 60, 60),  # --graph: 2.481 ms against 2.442 (fresh) and 2.522 (paired)
    "pageable_htod": (0.05, 165, 535),
    "per_request_readback": (0.42, 10, 15),
    "train_step_logging": (0.89, 30, 120),
}
# hf_generate with cuDNN left out of the attention backends (size key cudnn_sdp 0): a stationary step (the default
# backend rebuilds a cuDNN graph per key length, MANIFEST.md), three fresh processes a variant
LOOPS_H100_NOCUDNN = {"hf_generate": (0.39, 70, 10)}
# two loops of hidden syncs on an H100 (four fresh processes a variant, a host that varies between them): the planted
# range alone misses empty_cache's cost (its cudaMalloc calls sit in the next step's forward; the allocator-churn
# finding, below, holds both); mask_index's fresh-process range includes 0, its paired saving does not
LOOPS_H100_HIDDEN = {"empty_cache": (0.52, 190, 210), "mask_index": (1.0, 85, 70)}
# two loops written after the model, on another H100 (eight fresh processes a variant): eager_sampling's fix is its
# sampler captured in the forward's graph (--graph); copy_stream_sync runs on two streams (a copy stream and the compute
# stream ordered by event waits), its host-bound fixed twin bimodal from process to process (0.46-0.89 ms), so its
# fresh-process range includes 0 and the paired saving is its reference
LOOPS_H100_NEW = {"copy_stream_sync": (0.53, 260, 25), "eager_sampling": (0.12, 30, 55)}
# copy_stream_sync made serial (graphed forward, this step's flag read at once: size keys graphed=1, read_back=1): the
# host wait's removal saves only a few µs because the forward stays behind its copy on the device; the cross-stream
# edges give 63 µs against 11 fresh and 8 paired (without them the replay lets the forward overlap the copy: 185 µs)
LOOPS_H100_SERIAL = {"copy_stream_sync": (0.17, 55, 58)}
# the loops whose fixed twin captures the planted range's work in a CUDA graph: predicted by whatif --graph
GRAPH_FIX_LOOPS = ("launch_bound", "eager_sampling")
LOOP_SETS = {"h200_loops": LOOPS, "h100_loops": LOOPS_H100, "h100_hf_nocudnn": LOOPS_H100_NOCUDNN,
             "h100_hidden_syncs": LOOPS_H100_HIDDEN, "h100_new_loops": LOOPS_H100_NEW,
             "h100_new_loops/serial": LOOPS_H100_SERIAL}  # folder -> bounds


def _json(p):
    with open(p, encoding="utf-8") as f:
        return json.load(f)


def _sidecar_median_ms(trace_path: str, key: str) -> float | None:
    p = trace_path.replace(".json.gz", ".gaptrace.json")
    if not os.path.exists(p):
        return None
    v = _json(p).get(key)
    return float(np.median(v)) if v else None


def _mk_ms(path: str) -> float:
    d = _json(path)
    v = d["step_periods_ms"]
    return float(np.median(v[int(d["skip_fraction"] * len(v)):]))


_pred: dict = {}


def _predict(path: str, site: str | None, round_name: str, graph: bool = False) -> dict:
    """whatif of one capture with its cause removed (``graph``: captured in a CUDA graph, the fix of the loops in
    GRAPH_FIX_LOOPS; one Context: fitted scale, unfitted period)."""
    key = (path, site, graph)
    if key not in _pred:
        tr = load_trace(path)
        if site is None:
            names = tr.host.loc[tr.host["cat"] == "user_annotation", "name"].astype(str).unique()
            (site,) = [n for n in names if n.startswith("planted_")]
        side = read_sidecar_checked(path)[0]
        ctx = Context(tr, side, round_name=round_name)
        sites = (site,) if isinstance(site, str) else site
        _pred[key] = whatif(tr, [Change(x, graph=graph) for x in sites], context=ctx).data
    return _pred[key]


def _predict_with_device(path: str, site) -> float:
    """The saving (µs) when the cause's eager device work goes too (Change.with_device), on the same context."""
    tr = load_trace(path)
    ctx = Context(tr, read_sidecar_checked(path)[0], round_name="round")
    sites = (site,) if isinstance(site, str) else site
    return whatif(tr, [Change(x, with_device=True) for x in sites], context=ctx).data["saving_us"]


@pytest.mark.parametrize("pairs_set", sorted(SETS))
def test_runtime_measured_figures_from_the_raw_sidecars(pairs_set):
    pairs_dir = os.path.join(ROOT, pairs_set)
    d = _json(os.path.join(pairs_dir, "pairs.json"))
    for name, c in d["captures"].items():
        assert _sidecar_median_ms(os.path.join(pairs_dir, name + ".json.gz"), "unprofiled_round_ms") == \
            pytest.approx(c["median_ms"], abs=1e-4)
        assert len(_json(os.path.join(pairs_dir, name + ".gaptrace.json"))["unprofiled_round_ms"]) == c["rounds"]
    assert {p["pair"] for p in d["pairs"]} == set(SETS[pairs_set])
    for p in d["pairs"]:
        w = [_sidecar_median_ms(os.path.join(pairs_dir, n + ".json.gz"), "unprofiled_round_ms") for n in p["with_cause"]]
        f = [_sidecar_median_ms(os.path.join(pairs_dir, n + ".json.gz"), "unprofiled_round_ms") for n in p["fixed"]]
        assert np.mean(w) - np.mean(f) == pytest.approx(p["measured_saving_ms"], abs=1e-3)
        assert [min(w) - max(f), max(w) - min(f)] == pytest.approx(p["measured_saving_range_ms"], abs=1e-3)


@pytest.mark.parametrize("loops_set", sorted(LOOP_SETS))
def test_loops_measured_figures_from_the_raw_processes(loops_set):
    LOOPS_DIR = os.path.join(ROOT, loops_set)
    found = sorted(glob.glob(os.path.join(LOOPS_DIR, "*.pairs.json")))
    assert len(found) == len(LOOP_SETS[loops_set])
    for pp in found:
        d = _json(pp)
        loop = d["loop"]
        assert loop in LOOP_SETS[loops_set]
        for var in ("planted", "fixed"):
            per = [_mk_ms(os.path.join(LOOPS_DIR, f)) for f in d[var]["files"]]
            # the files keep each period to 10 ns (5 decimals of a ms)
            assert per == pytest.approx(d[var]["periods_ms_per_process"], abs=1e-5)
            assert float(np.median(per)) == pytest.approx(d[var]["median_ms"], abs=1e-5)
        pl, fx = d["planted"]["periods_ms_per_process"], d["fixed"]["periods_ms_per_process"]
        assert np.median(pl) - np.median(fx) == pytest.approx(d["saving_ms"], abs=1e-12)
        assert [min(pl) - max(fx), max(pl) - min(fx)] == pytest.approx(d["saving_range_ms"], abs=1e-12)
        # the paired measurement: both variants in the planted capture's process, blocks alternating
        pr = _json(os.path.join(LOOPS_DIR, f"{loop}.paired.json"))
        bm = pr["block_median_ms"]
        per_block = [a - b for a, b in zip(bm["planted"], bm["fixed"])]
        assert len(per_block) == pr["blocks"] >= 8 and per_block == pytest.approx(pr["saving_per_block_ms"], abs=1e-12)
        assert float(np.median(per_block)) == pytest.approx(pr["saving_ms"], abs=1e-12)
        assert d["paired"]["saving_ms"] == pytest.approx(pr["saving_ms"], abs=1e-12)


@pytest.mark.parametrize("pairs_set,pair", [(k, p) for k in sorted(SETS) for p in sorted(SETS[k])])
def test_runtime_pair_prediction(pairs_set, pair):
    pairs_dir = os.path.join(ROOT, pairs_set)
    d = {p["pair"]: p for p in _json(os.path.join(pairs_dir, "pairs.json"))["pairs"]}[pair]
    site, period_bounds, saving_bound_us = SETS[pairs_set][pair]
    traces = [os.path.join(pairs_dir, n + ".json.gz") for n in d["with_cause"]]
    savings, ranked = [], []
    for t, bound in zip(traces, period_bounds):
        w = _predict(t, site, "round")
        meas_us = _sidecar_median_ms(t, "unprofiled_round_ms") * 1e3
        assert w["unprofiled_round_us"] == pytest.approx(meas_us)
        assert abs(w["unfitted_round_us"] - meas_us) / meas_us <= bound, (w["unfitted_round_us"], meas_us)
        # the fitted scale reproduces the capture's own unprofiled round, but where the round is device-bound beyond
        # it: the repeat glue capture replays 4.93 ms with no host cost at all against 4.76 measured (the profiler's
        # device cost of its ~1,400 eager ops a round is more than the calibration's 0.76 µs each, and the scale α
        # moves host costs only), so its measured round is set aside (DESIGN.md 5.3)
        if (pairs_set, pair) in SET_ASIDE:
            assert w["profiler_cost_fit"] == "set_aside" and w["profiler_cost_scale"] == 1.0
        else:
            assert w["fitted_to_unprofiled"] and abs(w["before_round_us"] - meas_us) / meas_us < 0.005
        savings.append(w["saving_us"])
        ranked.append(max(w["saving_us"], _predict_with_device(t, site)))
    pred_us = float(np.mean(savings))
    meas_us = d["measured_saving_ms"] * 1e3
    assert abs(pred_us - meas_us) <= saving_bound_us, (pred_us, meas_us)
    lo, hi = d["measured_saving_range_ms"]
    if not lo <= 0 <= hi:  # the sign of what the ranking uses: the host-side saving, or with the device work
        assert (float(np.mean(ranked)) > 0) == (meas_us > 0)


@pytest.mark.parametrize("loops_set,loop", [(k, lp) for k in sorted(LOOP_SETS) for lp in sorted(LOOP_SETS[k])
                                            if LOOP_SETS[k][lp] is not None])
def test_loop_pair_prediction(loops_set, loop):
    LOOPS_DIR = os.path.join(ROOT, loops_set)
    d = _json(os.path.join(LOOPS_DIR, f"{loop}.pairs.json"))
    period_bound, saving_bound_us, paired_bound_us = LOOP_SETS[loops_set][loop]
    t = os.path.join(LOOPS_DIR, f"{loop}.planted.trace.json.gz")
    w = _predict(t, None, "step", graph=loop in GRAPH_FIX_LOOPS)
    same = _sidecar_median_ms(t, "unprofiled_step_ms")
    ref_ms = same if same is not None else float(np.median(
        [_mk_ms(os.path.join(LOOPS_DIR, f)) for f in d["planted"]["files"]]))
    assert abs(w["unfitted_round_us"] / 1e3 - ref_ms) / ref_ms <= period_bound, (w["unfitted_round_us"], ref_ms)
    meas_us = d["saving_ms"] * 1e3
    assert abs(w["saving_us"] - meas_us) <= saving_bound_us, (w["saving_us"], meas_us)
    lo, hi = d["saving_range_ms"]
    if not lo <= 0 <= hi:
        assert (w["saving_us"] > 0) == (meas_us > 0)
    pr = _json(os.path.join(LOOPS_DIR, f"{loop}.paired.json"))
    assert abs(w["saving_us"] - pr["saving_ms"] * 1e3) <= paired_bound_us, (w["saving_us"], pr["saving_ms"])
    assert w["rounds"] >= 4  # 6 profiled steps (the shipped cut): at least 5 periods (the first may start before a launch)


def test_steps_without_a_round_range_replay_the_steps_thread():
    t = os.path.join(ROOT, "h200_loops", "train_step_logging.planted.trace.json.gz")
    w = _predict(t, None, "step")
    assert w["round_rule"] == "profiler_step"
    tr = load_trace(t)
    h = tr.host
    ps = h[h["name"].astype(str).str.match(r"ProfilerStep#\d+$")]
    assert len(ps) == 6 and w["rounds"] == 5
    assert np.diff(np.sort(ps["ts_us"].to_numpy())) == pytest.approx(w["periods_profiled_us"], abs=1e-6)
    assert not w["fitted_to_unprofiled"]  # this loop's capture writes no sidecar


def test_other_threads_profiler_cost_waited_out():
    t = os.path.join(ROOT, "h200_loops", "helper_thread.planted.trace.json.gz")
    tr = load_trace(t)
    ctx = Context(tr, read_sidecar_checked(t)[0], round_name="step", fit=False)
    waited = thread_wait_cost(tr, ctx.model, ctx.calibration)
    h = tr.host
    main = h["tid"].astype(str) == ctx.model.tid
    waits = h[main & h["name"].astype(str).str.startswith(THREAD_WAIT_PREFIX) & (h["dur_us"] >= 20)]
    other = h[~main & (h["rank"] == ctx.model.key[0])]
    cost = {"python_function": ctx.calibration.python_frame_us, "cpu_op": ctx.calibration.aten_op_us,
            "user_annotation": ctx.calibration.aten_op_us, "cuda_runtime": ctx.calibration.runtime_call_us,
            "cuda_driver": ctx.calibration.runtime_call_us}
    c = other["cat"].astype(str).map(cost).fillna(0.0).to_numpy()
    ts = other["ts_us"].to_numpy()
    # by hand: the producer's recorded events that start inside each of the main thread's lock waits, at most the wait
    per = [min(float(c[(ts >= a) & (ts < b)].sum()), b - a) for a, b in zip(waits["ts_us"], waits["end_us"])]
    n_py = sum(int(((ts >= a) & (ts < b) & (other["cat"] == "python_function").to_numpy()).sum())
               for a, b in zip(waits["ts_us"], waits["end_us"]))
    assert n_py > 1000
    assert waited.sum() == pytest.approx(sum(per), rel=1e-6)
    assert waited.sum() <= waits["dur_us"].sum()


def _union_len(iv: list[tuple[float, float]]) -> float:
    out, end = 0.0, -np.inf
    for a, b in sorted(iv):
        if b > end:
            out += b - max(a, end)
            end = b
    return out


def test_gil_held_work_of_the_waited_for_thread_by_hand():
    """What stopping a wait on the producer thread still pays (its Python work then runs beside the loop under the
    GIL): per lock wait of the main thread inside planted_queue_wait, the producer's Python frames there less its
    GIL-releasing ones (time.sleep, lock acquires), counted here from the raw events; with the profiled waits as the
    unprofiled ones (U = the wait) the function gives exactly that held time."""
    t = os.path.join(ROOT, "h100_loops", "helper_thread.planted.trace.json.gz")
    tr = load_trace(t)
    ctx = Context(tr, read_sidecar_checked(t)[0], round_name="step", fit=False)
    m = ctx.model
    from gaptrace.analyses.profiler_cost import gil_held_in_waits, lock_waits_in
    from gaptrace.analyses.whatif import site_intervals
    us, ue = site_intervals(tr, m, "planted_queue_wait", ctx.window)
    ws, we = lock_waits_in(m, tr, us, ue)
    assert len(ws) == 6  # one wait a step, the first before the chain's first call (no host interval holds it)
    s, e = m.call_start_us, m.call_end_us
    a = np.concatenate(([s[0]], e[:-1]))
    profiled = np.array([sum(max(0.0, min(b, y) - max(x, c)) for x, y in zip(ws, we)) for c, b in zip(a, s)])
    got = gil_held_in_waits(tr, m, ws, we, profiled)
    h = tr.host
    other = h[(h["tid"].astype(str) != m.tid) & (h["cat"].astype(str) == "python_function")]
    names = other["name"].astype(str)
    rel = names.str.startswith(("<built-in function sleep>", "<built-in method acquire of _thread.lock"))
    frames = list(zip(other["ts_us"] - m.t0_us, other["end_us"] - m.t0_us))
    releasing = list(zip(other.loc[rel, "ts_us"] - m.t0_us, other.loc[rel, "end_us"] - m.t0_us))
    clip = lambda iv, x, y: [(max(p, x), min(q, y)) for p, q in iv if min(q, y) > max(p, x)]
    by_hand = [_union_len(clip(frames, x, y)) - _union_len(clip(releasing, x, y)) for x, y in zip(ws, we) if x >= s[0]]
    assert len(by_hand) == 5
    assert float(got.sum()) == pytest.approx(sum(by_hand), rel=1e-9)
    sleeps = [_union_len(clip(releasing, x, y)) for x, y in zip(ws, we) if x >= s[0]]
    assert min(sleeps) > 200  # the producer's 0.2 ms sleep sits in every wait (GIL released)


# the eager forward's host work (the first finding on per_request_readback and mask_index, second on helper_thread and
# host_detokenize in the H100 set): what graphing it buys, measured (fixtures/traces/*/forward_graph: the planted
# variant with graph_forward 0 and 1, fresh processes interleaved, on H100 machines), against the prediction of
# removing the frame's host work on the shipped planted capture; bounds = today's errors
FORWARD = "benchmarks/loops/_common.py(153): logits"
# (loop set, loop) -> (|predicted − measured| bound µs, every eager process slower than every graphed one); where the
# host's speed varies between processes (mask_index's host: 0.48-0.70 ms graphed, 0.61-1.05 eager) the processes
# overlap, and the interleaved slots say which is faster instead: the eager one in at least 12 of 14
FORWARD_GRAPH = {("h100_loops", "helper_thread"): (100, True), ("h100_loops", "per_request_readback"): (35, True),
                 ("h100_loops", "host_detokenize"): (10, True), ("h100_hidden_syncs", "mask_index"): (70, False)}


@pytest.mark.parametrize("loops_set,loop", sorted(FORWARD_GRAPH))
def test_graphing_the_eager_forward_against_its_prediction(loops_set, loop):
    d = os.path.join(ROOT, loops_set, "forward_graph")
    files = {g: sorted(glob.glob(os.path.join(d, f"{loop}.g{g}.m*.json"))) for g in (0, 1)}
    assert [os.path.basename(p).split(".")[2] for p in files[0]] == [os.path.basename(p).split(".")[2] for p in files[1]]
    per = {g: [_mk_ms(p) for p in files[g]] for g in (0, 1)}
    assert len(per[0]) == len(per[1]) >= 3
    for g in (0, 1):  # the files say what ran: the planted variant, the forward eager (0) or graphed (1)
        for p in files[g]:
            m = _json(p)
            assert m["variant"] == "planted" and m["size"]["graph_forward"] == g and m["device_name"].startswith("NVIDIA H100")
    meas_us = (float(np.median(per[0])) - float(np.median(per[1]))) * 1e3
    bound_us, separated = FORWARD_GRAPH[(loops_set, loop)]
    if separated:
        assert min(per[0]) > max(per[1])  # every eager process slower than every graphed one
    else:  # slot k: the eager and graphed processes run one after the other
        slower = sum(a > b for a, b in zip(per[0], per[1]))
        assert len(per[0]) == 14 and slower >= 12, (slower, len(per[0]))
    w = _predict(os.path.join(ROOT, loops_set, f"{loop}.planted.trace.json.gz"), FORWARD, "step")
    # before the replay gave a kernel that starts to queue the device's measured gap and kept the device cost per
    # kernel out of the fitted scale, all four were over-predicted, by 27-115 µs (DESIGN.md 5.6)
    assert meas_us > 0 and w["saving_us"] > 0
    assert abs(w["saving_us"] - meas_us) <= bound_us, (w["saving_us"], meas_us)


# the first finding of the H100 hf_generate capture (the attention's host work: cuDNN attention building a graph per
# key length) against what leaving cuDNN out of the attention backends buys, measured: the planted variant with
# cudnn_sdp 1 (fixtures/traces/h100_hf_nocudnn/hf_generate.cudnn1.mK.json, two fresh processes) and 0 (its
# hf_generate.planted.mK.json, three), interleaved; the prediction removes the frame's host work on the shipped
# capture, whose warm-up rounds are set aside (the calibration as it is)
SDPA = "transformers/integrations/sdpa_attention.py(79): sdpa_attention_forward"


def test_first_finding_of_hf_generate_against_its_measured_fix():
    d = os.path.join(ROOT, "h100_hf_nocudnn")
    on = [_json(p) for p in sorted(glob.glob(os.path.join(d, "hf_generate.cudnn1.m*.json")))]
    off = [_json(p) for p in sorted(glob.glob(os.path.join(d, "hf_generate.planted.m*.json")))]
    assert len(on) == 2 and len(off) == 3
    assert {m["size"]["cudnn_sdp"] for m in on} == {1} and {m["size"]["cudnn_sdp"] for m in off} == {0}
    assert {m["variant"] for m in on + off} == {"planted"}
    on_ms = [_mk_ms(p) for p in sorted(glob.glob(os.path.join(d, "hf_generate.cudnn1.m*.json")))]
    off_ms = [_mk_ms(p) for p in sorted(glob.glob(os.path.join(d, "hf_generate.planted.m*.json")))]
    meas_us = (float(np.median(on_ms)) - float(np.median(off_ms))) * 1e3
    assert 30_000 < meas_us < 32_000  # 35.0 against 3.9 ms a step
    w = _predict(os.path.join(ROOT, "h100_loops", "hf_generate.planted.trace.json.gz"), SDPA, "step")
    # its warm-up steps (4.1 ms) are unlike the profiled ones (cuDNN builds a graph per new key length): out of the
    # fit's reach (the closest α still +777%), set aside
    assert w["profiler_cost_fit"] == "set_aside" and not w["fitted_to_unprofiled"]
    assert w["measured_source"] == "warmup_steps"  # a Capture's sidecar: its warm-up steps are the measured step
    assert abs(w["saving_us"] - meas_us) <= 0.35 * meas_us  # within the goal: +10% today
    assert abs(w["saving_us"] - meas_us) <= 3_700, (w["saving_us"], meas_us)
    # and the planted cause, second, saves far less: the order the measurements give
    p = _predict(os.path.join(ROOT, "h100_loops", "hf_generate.planted.trace.json.gz"), None, "step")
    assert 0 < p["saving_us"] < w["saving_us"] / 10


def test_first_finding_of_empty_cache_against_its_measured_fix():
    """empty_cache's first finding is the allocator churn (cudaMalloc and cudaFree every step), and removing both,
    the fix the loop's fixed twin applies (no torch.cuda.empty_cache()), predicts the measured saving within the
    goal, against the fresh processes (+26% today) and the paired blocks (+20%)."""
    from gaptrace.analyses.summary import run_analysis

    d = os.path.join(ROOT, "h100_hidden_syncs")
    t = os.path.join(d, "empty_cache.planted.trace.json.gz")
    s = run_analysis(load_trace(t), sidecar=read_sidecar_checked(t)[0])
    first = s["findings"][0]
    assert first["kind"] == "allocator_churn" and first["causes"] == ["cudaMalloc", "cudaFree"]
    # with the H100 calibration the capture's warm-up steps are out of α's reach: set aside, the calibration as it is
    assert s["whatif"]["profiler_cost_fit"] == "set_aside"
    p = _json(os.path.join(d, "empty_cache.pairs.json"))
    for meas_ms in (p["saving_ms"], p["paired"]["saving_ms"]):
        assert abs(first["saving_us"] - meas_ms * 1e3) <= 0.35 * meas_ms * 1e3, (first["saving_us"], meas_ms)
    # the planted range alone (the frees) saves less than half of it: the allocations it forces lie outside it
    rng = next(f for f in s["findings"] if f.get("cause") == "planted_empty_cache")
    assert rng["saving_us"] < 0.5 * first["saving_us"]


def test_the_serial_two_stream_pair_needs_the_cross_stream_edges():
    """On the serial copy_stream_sync capture the forward waits for its copy on the device once the host's
    copy_stream.synchronize() is gone: with the cross-stream edges the replay predicts 63 µs (measured 11 fresh, 8
    paired); without them it lets the forward start before the copy ends and predicts the copy's time saved."""
    import dataclasses

    from gaptrace.analyses import replay as R
    import gaptrace.analyses.whatif as W

    t = os.path.join(ROOT, "h100_new_loops", "serial", "copy_stream_sync.planted.trace.json.gz")
    tr, sc = load_trace(t), read_sidecar_checked(t)[0]
    with_edges = whatif(tr, [Change("planted_copy_sync")], context=Context(tr, sc, round_name="step")).to_dict()
    orig = W.build_model
    try:
        W.build_model = lambda *a, **k: dataclasses.replace(orig(*a, **k), edge_item=np.zeros(0, np.int64),
                                                            edge_on=np.zeros(0, np.int64))
        without = whatif(tr, [Change("planted_copy_sync")], context=Context(tr, sc, round_name="step")).to_dict()
    finally:
        W.build_model = orig
    paired_us = _json(os.path.join(ROOT, "h100_new_loops", "serial", "copy_stream_sync.paired.json"))["saving_ms"] * 1e3
    assert abs(with_edges["saving_us"] - paired_us) <= 60 < abs(without["saving_us"] - paired_us)
    assert without["saving_us"] > 2.5 * with_edges["saving_us"]
