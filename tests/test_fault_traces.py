"""gaptrace names each runtime pathology in its H200 capture (fixtures/traces/h200_faults/MANIFEST.md)."""
import os

import pytest

import gaptrace
from gaptrace.analyses.diff import diff_analyses
from gaptrace.analyze import run_analysis
from gaptrace.capture import read_sidecar

FAULTS = "fixtures/traces/h200_faults"
CLEAN = "fixtures/traces/h200_runtime"


def analysis(path):
    return run_analysis(gaptrace.load_trace(path), sidecar=read_sidecar(path))


def fault(preset, name):
    return analysis(os.path.join(FAULTS, f"h200_{preset}_overlap_bs8_B12_{name}.json.gz"))


@pytest.fixture(scope="module")
def clean_bench():
    return analysis(os.path.join(CLEAN, "h200_bench_overlap_bs8_B12.json.gz"))


@pytest.mark.parametrize("preset,min_share", [("bench", 0.5), ("tiny", 0.3)])
def test_lengths_copy_is_the_first_finding(preset, min_share):
    res = fault(preset, "lengths-copy")
    first = res["findings"][0]
    assert first["kind"] == "blocking_sync" and first["call"] == "cudaMemcpyAsync" and first["aten_op"] == "aten::to"
    assert first["site"].endswith("device_lengths_to_host") and first["idle_share"] >= min_share
    top = res["blocking_syncs"][0]
    assert any(f.endswith(": lengths_copy") for f in top["stack"])  # called from the fault's function
    assert res["rounds"]["summary"]["verdict"] == "serialized"


def test_dd_gather_is_the_first_finding():
    res = fault("bench", "dd-gather")
    first = res["findings"][0]
    assert first["kind"] == "blocking_sync" and first["aten_op"] == "aten::item"
    assert first["site"].endswith("rect_packed") and first["idle_share"] >= 0.5
    ops = {s["aten_op"] for s in res["blocking_syncs"]}
    assert {"aten::item", "aten::masked_select"} <= ops


def test_jit_new_shape_first_finding_is_in_its_range():
    res = fault("bench", "jit-new-shape")
    first = res["findings"][0]
    assert first["kind"] == "idle_site" and first["range"] == "jit_new_shape" and first["idle_share"] >= 0.2


def test_eager_commit_glue_costs_host_time_and_appears_in_the_diff(clean_bench):
    res = fault("bench", "eager-commit-glue")
    d = diff_analyses(clean_bench, res)
    assert d["metrics"]["t_host_us"]["rel"] > 0.1  # the glue lengthens every round's host work
    appeared = {r["frame"] for r in d["frames"]["appeared"]}
    assert "runtime/faults.py: eager_commit_glue" in appeared
    # GPU-bound overlap hides it: no blocking sync claims the idle
    assert not [f for f in res["findings"] if f["kind"] == "blocking_sync" and f["idle_share"] > 0.05]


def test_token_list_rebuild_is_present_but_small():
    path = os.path.join(FAULTS, "h200_bench_overlap_bs8_B12_token-list-rebuild.json.gz")
    trace = gaptrace.load_trace(path)
    h = trace.host
    assert ((h["cat"] == "user_annotation") & (h["name"] == "token_list_rebuild")).sum() >= 8
    res = run_analysis(trace, sidecar=read_sidecar(path))
    assert not [f for f in res["findings"] if "token_list_rebuild" in f["summary"]]


def test_clean_overlap_has_no_sync_finding_above_5_percent(clean_bench):
    assert not [f for f in clean_bench["findings"] if f["kind"] == "blocking_sync" and f["idle_share"] > 0.05]
