"""gaptrace names each runtime pathology in its H200 capture (fixtures/traces/h200_faults/MANIFEST.md: the tiny preset;
the bench preset's lengths-copy, dd-gather and eager-commit-glue and the tiny bs-1 eager-commit-glue are the captures
of the current runtime in fixtures/traces/h200_pairs, MANIFEST.md there)."""
import os

import pytest

import gaptrace
from gaptrace.analyses.diff import diff_analyses
from gaptrace.analyze import run_analysis
from gaptrace.capture import read_sidecar

FAULTS = "fixtures/traces/h200_faults"
CLEAN = "fixtures/traces/h200_runtime"
PAIRS = "fixtures/traces/h200_pairs"
# faults whose capture is the current runtime's (h200_pairs); the others are in h200_faults
IN_PAIRS = {("bench", "lengths-copy", 8): "bench_overlap_bs8_B12_lengths-copy",
            ("bench", "dd-gather", 8): "bench_overlap_bs8_B12_dd-gather",
            ("bench", "eager-commit-glue", 8): "bench_overlap_bs8_B12_eager-commit-glue",
            ("tiny", "eager-commit-glue", 1): "tiny_overlap_bs1_B12_eager-commit-glue_a"}


def analysis(path):
    return run_analysis(gaptrace.load_trace(path), sidecar=read_sidecar(path))


def fault(preset, name, bs=8):
    if (preset, name, bs) in IN_PAIRS:
        return analysis(os.path.join(PAIRS, IN_PAIRS[preset, name, bs] + ".json.gz"))
    return analysis(os.path.join(FAULTS, f"h200_{preset}_overlap_bs{bs}_B12_{name}.json.gz"))


@pytest.fixture(scope="module")
def clean_bench():
    """The clean twin of the bench bs-8 faults in h200_pairs (the same runtime, in the same capture run)."""
    return analysis(os.path.join(PAIRS, "bench_overlap_bs8_B12_clean_a.json.gz"))


@pytest.mark.parametrize("preset,min_share", [("bench", 0.5), ("tiny", 0.3)])
def test_lengths_copy_is_the_first_finding(preset, min_share):
    res = fault(preset, "lengths-copy")
    first = res["findings"][0]
    assert first["kind"] == "blocking_sync" and first["call"] == "cudaMemcpyAsync" and first["aten_op"] == "aten::to"
    assert first["site"].endswith("device_lengths_to_host") and first["idle_share"] >= min_share
    top = res["blocking_syncs"][0]
    assert any(f.endswith(": lengths_copy") for f in top["stack"])  # called from the fault's function
    assert res["rounds"]["summary"]["verdict"] == "serialized"


@pytest.mark.parametrize("preset,min_share", [("bench", 0.5), ("tiny", 0.25)])
def test_dd_gather_is_the_first_finding(preset, min_share):
    res = fault(preset, "dd-gather")
    first = res["findings"][0]
    assert first["kind"] == "blocking_sync" and first["aten_op"] == "aten::item"
    assert first["site"].endswith("rect_packed") and first["idle_share"] >= min_share
    ops = {s["aten_op"] for s in res["blocking_syncs"]}
    assert {"aten::item", "aten::masked_select"} <= ops


@pytest.mark.parametrize("preset,min_share", [("tiny", 0.15)])
def test_jit_new_shape_first_finding_is_in_its_range(preset, min_share):
    """The first finding names the jit_new_shape range: as an idle site over the 8 captured rounds; over the compile's
    round and the next one, which the fixture keeps, the compile makes the rounds host-bound, so the first finding is
    host_bound with jit_new_shape as the range holding most host time. Either way the idle site of Triton waiting
    for its compiler subprocess, in that range, holds at least min_share of the idle."""
    res = fault(preset, "jit-new-shape")
    first = res["findings"][0]
    assert first["kind"] in ("idle_site", "host_bound") and first["range"] == "jit_new_shape"
    waits = [f for f in res["findings"] if f["kind"] == "idle_site" and f["range"] == "jit_new_shape"
             and "_try_wait" in f["site"]]  # Triton waiting for its compiler subprocess
    assert waits and waits[0]["idle_share"] >= min_share


def test_eager_commit_glue_costs_host_time_and_appears_in_the_diff(clean_bench):
    res = fault("bench", "eager-commit-glue")
    d = diff_analyses(clean_bench, res)
    assert d["metrics"]["t_host_us"]["rel"] > 0.1  # the glue lengthens every round's host work
    appeared = {r["frame"] for r in d["frames"]["appeared"]}
    assert "runtime/faults.py: eager_commit_glue" in appeared
    # host work, not a wait: no blocking sync claims the idle (on this runtime the glue makes the round host-bound)
    assert not [f for f in res["findings"] if f["kind"] == "blocking_sync" and f["idle_share"] > 0.05]


def test_eager_commit_glue_on_a_host_bound_round_is_the_first_finding():
    """Tiny preset, bs 1 (the current runtime's capture a of h200_pairs and its clean twin a): the glue adds host time
    every round (over the shipped rounds Thost +232%, Tround +204% against the clean capture's) and the rounds stay
    host-bound even without the profiler's launch inflation, so the first finding is host_bound: the host-wait idle is
    the host being late, and the NVTX range holding most of its own time is eager_commit_glue. The next finding is the
    glue's own frame in its range (half the idle: the GPU, ahead of the late host, waits through the glue); in the
    eager-era capture the idle sat inside the next profiler-inflated draft-graph launch instead."""
    clean = analysis(os.path.join(PAIRS, "tiny_overlap_bs1_B12_clean_a.json.gz"))
    res = fault("tiny", "eager-commit-glue", bs=1)
    d = diff_analyses(clean, res)
    assert d["metrics"]["t_host_us"]["rel"] > 0.5 and d["metrics"]["t_round_us"]["rel"] > 0.5
    first, second = res["findings"][:2]
    assert first["kind"] == "host_bound" and first["range"] == "eager_commit_glue" and first["idle_share"] >= 0.5
    assert abs(first["idle_share"] - res["idle_split"]["host_wait_us"] / res["idle_split"]["idle_us"]) < 1e-9
    assert second["kind"] == "idle_site" and second["range"] == "eager_commit_glue"
    assert second["site"].startswith("runtime/faults.py(") and second["site"].endswith(": eager_commit_glue")
    assert res["rounds"]["summary"]["bound_less_inflation"] == "host"
    # the clean capture is GPU-bound once the profiler's launch inflation is taken out: no host_bound finding there
    assert clean["rounds"]["summary"]["bound_less_inflation"] == "GPU"
    assert not [f for f in clean["findings"] if f["kind"] == "host_bound"]


@pytest.mark.parametrize("preset", ["tiny"])
def test_token_list_rebuild_is_present_but_small(preset):
    path = os.path.join(FAULTS, f"h200_{preset}_overlap_bs8_B12_token-list-rebuild.json.gz")
    trace = gaptrace.load_trace(path)
    h = trace.host
    ranges = h[h["cat"] == "user_annotation"]
    # at least once per profiled round (2 rounds in these fixtures, cut to fit the repo; 8 captured)
    assert (ranges["name"] == "token_list_rebuild").sum() >= (ranges["name"] == "round").sum() >= 2
    res = run_analysis(trace, sidecar=read_sidecar(path))
    assert not [f for f in res["findings"] if "token_list_rebuild" in f["summary"]]


# two ~59k-token prompts prefilled in 2,048-token chunks; the fixtures keep the profiled prefill round up to the start
# of its 3rd chunk (maintainer/trim_trace.py --end-at; the MANIFEST): its first two chunks, the most host-bound ones
LONG = "h200_tiny_overlap_bs2_B8_long60k"
LONG_CHUNKS = 2


@pytest.fixture(scope="module")
def long_pair():
    return tuple(analysis(os.path.join(FAULTS, f"{LONG}{sfx}.json.gz")) for sfx in ("", "_token-list-rebuild"))


def test_token_list_rebuild_is_the_first_finding_on_long_prompts(long_pair):
    """The rebuild costs O(context) host time a prefill chunk (~2.5 ms at 59k tokens): with the prefill's GDN inputs
    made in one node (models.fused.gdn_inputs) the eager prefill's own dispatch no longer outweighs it, and the first
    finding is the fault's frame in its range. Every figure from the raw JSON (tests/_idle_reference.py): the
    window's idle, and the idle while the host was inside the fault's frame (the site is charged only the moments
    its own frame is the innermost one with a source file, so at most that) and inside its NVTX range."""
    import gzip
    import json
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    from _idle_reference import Busy, device_intervals

    clean, res = long_pair
    # the capture's profiled window holds one ProfilerStep, no verify rounds: the first finding is the fault's own
    # range (host_range: the idle while it was open, its gap-attribution row), the fault's frame inside it next
    head = res["findings"][0]
    assert head["kind"] == "host_range" and head["range"] == "token_list_rebuild"
    first = res["findings"][1]
    assert first["kind"] == "idle_site" and first["range"] == "token_list_rebuild"
    assert first["site"] == "runtime/faults.py(151): token_list_rebuild"
    with gzip.open(os.path.join(FAULTS, f"{LONG}_token-list-rebuild.json.gz")) as f:
        ev = json.load(f)["traceEvents"]
    rounds = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") == "user_annotation" and e["name"] == "round"]
    busy = Busy(device_intervals(ev), min(s for s, _ in rounds), max(e for _, e in rounds))
    dev = res["devices"][0]
    assert abs(busy.idle - dev["idle_us"]) < 1.0
    frame = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") == "python_function"
             and e["name"].endswith("runtime/faults.py(151): token_list_rebuild")]
    rng = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") == "user_annotation"
           and e["name"] == "token_list_rebuild"]
    # one per prefill chunk, the 3rd's too: a chunk's rebuild runs before its window_start, where the cut is
    assert len(frame) == len(rng) == LONG_CHUNKS + 1
    site = res["idle_sites"][0]
    assert site["site"] == first["site"] and abs(first["idle_share"] - site["idle_us"] / busy.idle) < 1e-9
    under_frame, under_range = busy.idle_under_union(frame), busy.idle_under_union(rng)
    assert 0.7 * under_frame < site["idle_us"] <= under_frame + 1.0
    assert first["idle_share"] > 0.08 and under_range / busy.idle > 0.1  # 10% (6.7 ms); 11% inside the range
    # the range's inclusive idle as gaptrace reports it (7.85 ms: host-wait idle only, the device-side gaps between
    # already-queued kernels left out) is that raw figure less at most the trace's device-side idle
    rng_row = [r for r in res["gap_attribution"] if r["frame"] == "token_list_rebuild"][0]
    assert under_range - res["idle_split"]["device_side_us"] <= rng_row["inclusive_idle_us"] <= under_range + 1.0
    assert head["idle_us"] == rng_row["inclusive_idle_us"]
    # ahead of every other site, the eager prefill's own frames included
    assert all(s["idle_us"] < site["idle_us"] for s in res["idle_sites"][1:])
    # the clean capture of the same decode: no such range, no sync finding above 5%
    assert not [f for f in clean["findings"] if "token_list_rebuild" in f["summary"]]
    assert not [f for f in clean["findings"] if f["kind"] == "blocking_sync" and f["idle_share"] > 0.05]


def test_token_list_rebuild_diff_on_long_prompts(long_pair):
    """gaptrace diff clean -> fault over the same two prefill chunks: the same GPU work (busy within 1%), idle +31%,
    the window (the chunks' wall time) +23%, the fault's frame among the appeared ones. (The cut keeps one round, so
    there is no round period or TPOT to compare: the whole captures' diff gave Tround +17% at equal τ.)"""
    d = diff_analyses(*long_pair)
    m = d["metrics"]
    assert abs(m["busy_us"]["rel"]) < 0.01 and m["idle_us"]["rel"] > 0.3
    clean, fault = (r["devices"][0]["window_us"] for r in long_pair)
    assert fault / clean - 1 > 0.1
    assert "runtime/faults.py: token_list_rebuild" in {r["frame"] for r in d["frames"]["appeared"]}


def test_clean_overlap_has_no_sync_finding_above_5_percent(clean_bench):
    assert not [f for f in clean_bench["findings"] if f["kind"] == "blocking_sync" and f["idle_share"] > 0.05]


@pytest.mark.parametrize("name", ["h200_tiny_overlap_bs8_B12", "h200_tiny_overlap_bs1_B12"])
def test_clean_tiny_overlap_has_no_sync_finding_above_5_percent(name):
    res = analysis(os.path.join(CLEAN, f"{name}.json.gz"))
    assert not [f for f in res["findings"] if f["kind"] == "blocking_sync" and f["idle_share"] > 0.05]


def test_eager_commit_glue_hidden_at_bs8_on_the_tiny_preset_too():
    """GPU-bound at bs 8 (TGPU 14.8 ms > Thost 9.2 ms a round): the overlap scheduler hides the glue."""
    res = fault("tiny", "eager-commit-glue")
    assert res["rounds"]["summary"]["bound"] == "GPU" and res["idle_split"]["device_side_share"] > 0.8
    assert not [f for f in res["findings"] if f["kind"] in ("blocking_sync", "idle_site") and f["idle_share"] > 0.05]
