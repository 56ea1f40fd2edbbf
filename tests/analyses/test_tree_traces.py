"""gaptrace on the H200 captures of draft-tree decoding (fixtures/traces/h200_tree/MANIFEST.md; the captures are the
current runtime's, bs 8, in fixtures/traces/h200_pairs): the cpu-heapq builder (fault cpu-tree-build) is the first
finding, the gpu builder has no sync finding, and `diff` shows the idle the gpu builder removed."""
import os

import pytest

import gaptrace
from gaptrace.analyses.diff import diff_analyses
from gaptrace.analyze import run_analysis
from gaptrace.capture import read_sidecar

PAIRS = "fixtures/traces/h200_pairs"


def tree_path(builder, bs):
    return os.path.join(PAIRS, f"tiny_tree_{builder}_bs{bs}.json.gz")


def analysis(builder, bs):
    path = tree_path(builder, bs)
    return run_analysis(gaptrace.load_trace(path), sidecar=read_sidecar(path))


@pytest.mark.parametrize("bs,min_share", [(8, 0.5)])
def test_cpu_heapq_build_is_the_first_finding(bs, min_share):
    res = analysis("cpu-heapq", bs)
    first = res["findings"][0]
    assert first["kind"] == "blocking_sync" and first["call"] == "cudaMemcpyAsync" and first["aten_op"] == "aten::to"
    assert first["site"].endswith(": cpu_tree_build") and first["idle_share"] >= min_share
    top = res["blocking_syncs"][0]
    assert top["stack"][0].endswith(": cpu_tree_build") and any(f.endswith(": run_round") and "tree_round.py(" in f for f in top["stack"])
    assert top["idle_after_us"] > 0  # the heapq build runs after the copy, with the GPU idle
    assert res["rounds"]["summary"]["verdict"] == "serialized"
    sidecar = read_sidecar(tree_path("cpu-heapq", bs))
    assert sidecar["config"]["tree_builder"] == "cpu-heapq" and sidecar["config"]["verify_width"] == 8


@pytest.mark.parametrize("bs", [8])
def test_gpu_builder_has_no_sync_finding(bs):
    res = analysis("gpu", bs)
    assert not [f for f in res["findings"] if f["kind"] == "blocking_sync" and f["idle_share"] > 0.05]
    assert res["rounds"]["summary"]["verdict"] == "overlapped"


def test_diff_of_the_builders_shows_the_idle_removed():
    a, b = analysis("cpu-heapq", 8), analysis("gpu", 8)
    d = diff_analyses(a, b)
    m = d["metrics"]
    assert m["occupancy"]["delta"] > 0.1 and m["idle_us"]["rel"] < -0.5 and m["t_round_us"]["rel"] < -0.15
    # the same trees up to ties (the heapq and the device builder may order equal-scored nodes differently: τ 0.02
    # apart over these 8 rounds): only the host side changed
    assert abs(m["tau"]["delta"]) < 0.05
    vanished = {r["frame"]: r for r in d["frames"]["vanished"]}
    assert {"runtime/faults.py: cpu_tree_build", "runtime/spec/tree.py: build_tree_heapq"} <= set(vanished)
    # what vanished under the heapq build is idle A had there: its inclusive idle in A's own table
    a_rows = {r["frame"]: r for r in a["gap_attribution"]}
    row = [r for f, r in a_rows.items() if f.startswith("runtime/faults.py(") and f.endswith(": cpu_tree_build")]
    assert row and abs(-vanished["runtime/faults.py: cpu_tree_build"]["delta_us"] - row[0]["inclusive_idle_us"]) < 1.0
