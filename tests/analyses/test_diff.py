"""`gaptrace diff`: the accept-length inequality, gates, and the command on real traces."""
import os
import json
import subprocess
import sys

import pytest

from gaptrace.analyses.diff import GateError, check_gates, diff_analyses, parse_gate

A_PATH = "fixtures/traces/hta_a100_trace_diff_control.json.gz"
B_PATH = "fixtures/traces/hta_v100_trace_diff_test.json.gz"


def analysis(t_round_us, tau, occupancy=0.9, frames=(), syncs=()):
    return {"trace": "x", "devices": [{"occupancy": occupancy, "busy_us": 1.0, "idle_us": 1.0, "window_us": 2.0}],
            "rounds": {"summary": {"t_round_us": t_round_us, "tau": tau, "tpot_us": t_round_us / tau}},
            "launch_fit": None, "gap_attribution": list(frames), "blocking_syncs": list(syncs)}


def test_fp8_head_loses():
    """The accept-length inequality on a known case (DESIGN.md "Diff and gates"): an fp8 draft sampling head cut
    τ 4.28 -> 4.16 (2.8%) and saved ~2% of the round: a net loss."""
    a = analysis(16_200.0, 4.28)
    b = analysis(16_200.0 * 0.98, 4.16)
    acc = diff_analyses(a, b)["accept_length"]
    assert acc["tau_loss"] == pytest.approx(0.12 / 4.28)
    assert acc["round_saving"] == pytest.approx(0.02)
    assert not acc["wins"]
    assert acc["tpot_ratio"] == pytest.approx((0.98 / 4.16) * 4.28)


def test_round_saving_beats_tau_loss_wins():
    acc = diff_analyses(analysis(20_900.0, 4.4), analysis(16_200.0, 4.3))["accept_length"]
    assert acc["wins"] and acc["tpot_ratio"] < 1


def test_frames_vanish_and_appear():
    a = analysis(1.0, 1.0, frames=[{"frame": "plan", "inclusive_idle_us": 500.0},
                                   {"frame": "launch", "inclusive_idle_us": 100.0}])
    b = analysis(1.0, 1.0, frames=[{"frame": "launch", "inclusive_idle_us": 40.0},
                                   {"frame": "commit", "inclusive_idle_us": 70.0}])
    f = diff_analyses(a, b)["frames"]
    assert [r["frame"] for r in f["vanished"]] == ["plan"]
    assert [r["frame"] for r in f["appeared"]] == ["commit"]
    assert f["changed"][0]["delta_us"] == pytest.approx(-60.0)


def test_gates():
    d = diff_analyses(analysis(100.0, 2.0, occupancy=0.95), analysis(110.0, 2.0, occupancy=0.85))
    res = check_gates(d, ["occupancy < 0.9", "rel_t_round_us > 0.2", "delta_occupancy<0", "kappa_us_per_node > 1"])
    assert [g["tripped"] for g in res] == [True, False, True, True]  # missing κ trips, never passes silently
    assert parse_gate(" tpot_us >= 1e3") == ("tpot_us", ">=", 1000.0)
    for bad in ["occupancy", "occupancy < x", "__import__('os') < 1", "nosuch < 1", "occupancy < 1e999", "occupancy < inf"]:
        with pytest.raises(GateError):
            parse_gate(bad)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "gaptrace.cli", *args], capture_output=True, text=True)


def test_diff_cli_on_real_traces():
    r = _cli("diff", A_PATH, B_PATH, "--json", "--fail-if", "occupancy < 0.5")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    occ = d["metrics"]["occupancy"]
    assert occ["delta"] == pytest.approx(occ["b"] - occ["a"])
    assert 0.8 < occ["a"] < 0.9 and 0.9 < occ["b"] < 1.0
    r = _cli("diff", A_PATH, B_PATH, "--fail-if", "occupancy < 0.99")
    assert r.returncode == 1 and "TRIPPED" in r.stdout
    r = _cli("diff", A_PATH, B_PATH, "--fail-if", "occupancy <")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_diff_of_a_trace_against_itself_says_no_change(tmp_path):
    """Identical traces: every rel is 0 (0 -> 0 included, so a rel gate does not trip on 'undefined'), neither side
    wins the accept-length inequality, and the frame, sync and bubble sections say "(no change)" instead of empty
    headings."""
    f = "fixtures/traces/h200_pairs/bench_sync_bs8_B12.json.gz"
    r = _cli("diff", f, f, "--fail-if", "rel_idle_after_us > 0", "--fail-if", "rel_occupancy != 0")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "so neither wins: the same TPOT" in r.stdout and "so B loses" not in r.stdout
    assert r.stdout.count("  (no change)") == 3  # idle by frame, blocking syncs, bubbles between graph nodes
    d = json.loads(_cli("diff", f, f, "--json").stdout)
    assert all(m["rel"] == 0 for m in d["metrics"].values() if m["a"] is not None)


def test_diff_and_analyze_warn_when_the_sidecar_window_is_not_in_the_trace(tmp_path):
    """A sidecar whose analysis_window names no annotation of its trace (another capture's) is ignored with one
    warning line, as report does, instead of silently analysing the whole trace against the other side's rounds."""
    import shutil

    src = "fixtures/traces/h200_pairs/bench_sync_bs8_B12"
    dst = tmp_path / "t.json.gz"
    shutil.copy(src + ".json.gz", dst)
    side = json.loads(open(src + ".gaptrace.json").read())
    side_window = side["analysis_window"]
    side["analysis_window"] = "nonexistent_range"
    (tmp_path / "t.gaptrace.json").write_text(json.dumps(side))
    for args, side in ((("analyze", str(dst)), ""), (("diff", src + ".json.gz", str(dst)), "B: ")):
        r = _cli(*args)
        assert r.returncode == 0, r.stderr
        warn = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(warn) == 1 and warn[0].startswith(f"gaptrace: warning: {side}capture sidecar ignored:")
        assert '"nonexistent_range" names no annotation' in warn[0]
    # an explicit --window does not make another capture's sidecar (its τ, its round times) this trace's
    r = _cli("analyze", str(dst), "--window", "round")
    assert r.returncode == 0 and "capture sidecar ignored" in r.stderr
    assert json.loads(_cli("analyze", str(dst), "--window", "round", "--json").stdout)["rounds"]["summary"].get(
        "tau") is None
    # a CI that reads only --json learns it too, and diff says that A and B now cover different spans
    res = json.loads(_cli("analyze", str(dst), "--json").stdout)
    assert res["window"] is None and res["warnings"][0].startswith("capture sidecar ignored: ")
    assert '"nonexistent_range" names no annotation' in res["warnings"][0]
    d = json.loads(_cli("diff", src + ".json.gz", str(dst), "--json").stdout)
    assert d["warnings"][0].startswith("B: capture sidecar ignored: ") and len(d["warnings"]) == 2
    assert d["warnings"][1].startswith(f"A is analysed over its capture sidecar's analysis_window "
                                       f"{side_window!r}, B over its whole trace") and "windows differ" in d["warnings"][1]
    text = _cli("diff", src + ".json.gz", str(dst)).stdout
    assert "Warnings:\n  - A is analysed over its capture sidecar's analysis_window" in text
    # the same window on both sides: no warning
    assert json.loads(_cli("diff", src + ".json.gz", src + ".json.gz", "--json").stdout)["warnings"] == []
    d = json.loads(_cli("diff", src + ".json.gz", str(dst), "--json", "--window", "round").stdout)
    assert len(d["warnings"]) == 1 and d["warnings"][0].startswith("B: capture sidecar ignored: ")  # no window line


def test_sidecar_fields_the_analyses_skip_are_named_in_one_warning(tmp_path):
    """Wrong-typed sidecar fields (a string round time, a boolean or infinite τ, a graph without nodes) used to be
    dropped without a word, silently removing τ, TPOT or the profiler check: analyze, diff and report now name them
    in one warning line and go on (the fields are still skipped; the rest of the sidecar is used)."""
    import shutil

    src = "fixtures/traces/h200_pairs/bench_sync_bs8_B12"
    dst = tmp_path / "bench_sync_bs8_B12.json.gz"
    shutil.copy(src + ".json.gz", dst)
    side = json.loads(open(src + ".gaptrace.json").read())
    side["unprofiled_round_ms"] = "abc"
    side["rounds"][1]["tau"] = True
    side["rounds"][2]["tau"] = 1e400  # json.dumps writes Infinity
    side["graphs"][0]["nodes"] = -3
    side["graphs"][1]["nodes"] = 10 ** 400  # an integer no float holds: skipped, not an OverflowError traceback
    del side["rounds"][3]["tau"]  # a round without τ drops out of the τ mean: named too
    side["rounds"][4]["tau"] = 10 ** 400
    side["profiled_step_ms"] = [10 ** 400]  # only shown by the report's Capture section: shown as it is
    (tmp_path / "bench_sync_bs8_B12.gaptrace.json").write_text(json.dumps(side))
    for args in (("analyze", str(dst)), ("diff", src + ".json.gz", str(dst)),
                 ("report", str(dst), "-o", str(tmp_path / "r.html"))):
        r = _cli(*args)
        assert r.returncode == 0, r.stderr
        warn = [ln for ln in r.stderr.splitlines() if ln.startswith("gaptrace: warning:")]
        assert len(warn) == 1, r.stderr
        for name in ("unprofiled_round_ms (not a period from 0.001 to 1e+12 ms)", "rounds[1].tau", "rounds[2].tau", "rounds[3].tau"):
            assert name in warn[0], warn[0]
        assert warn[0].endswith("and 3 more")  # rounds[4].tau, graphs[0], graphs[1]: four named, then a count
    from gaptrace.capture import sidecar_field_problems

    bad = sidecar_field_problems(json.loads((tmp_path / "bench_sync_bs8_B12.gaptrace.json").read_text()))
    assert [b.split(" ")[0] for b in bad] == ["unprofiled_round_ms", "rounds[1].tau", "rounds[2].tau", "rounds[3].tau",
                                             "rounds[4].tau", "graphs[0]", "graphs[1]"]
    # the τ of the good rounds is still read: the window is the sidecar's, τ is there
    res = json.loads(_cli("analyze", str(dst), "--json").stdout)
    assert res["window_source"] == "sidecar" and res["rounds"]["summary"]["tau"] > 0
    assert "unprofiled_round_us" not in res["rounds"]["summary"]
    assert res["warnings"][0].startswith("capture sidecar fields skipped: unprofiled_round_ms (not a period from")
    # an empty list of unprofiled round times drops the profiler check too: named, not silent
    assert sidecar_field_problems({"unprofiled_round_ms": []}) == ["unprofiled_round_ms (an empty list)"]
    assert sidecar_field_problems({"unprofiled_round_ms": [3.9, 4.1]}) == []
    # the shipped sidecar itself has nothing to skip
    r = _cli("analyze", src + ".json.gz")
    assert "gaptrace: warning" not in r.stderr


def test_diff_bubbles_by_kernel_pair():
    """An eager-era overlap capture (the tiny preset) against the fused bench one: the elementwise-kernel boundaries
    vanish, the fused kernels' appear, each with B's (or A's) idle for that pair exactly; a trace against itself
    changes no pair."""
    a = "fixtures/traces/h200_runtime/h200_tiny_overlap_bs8_B12.json.gz"
    b = "fixtures/traces/h200_fused/h200_bench_overlap_bs8_B12_fused.json.gz"
    d = json.loads(_cli("diff", a, b, "--json").stdout)
    rb = json.loads(_cli("analyze", b, "--json").stdout)
    ra = json.loads(_cli("analyze", a, "--json").stdout)
    want_b = {(r["before"], r["after"]): r["idle_us"] for r in rb["node_bubbles"]}
    want_a = {(r["before"], r["after"]): r["idle_us"] for r in ra["node_bubbles"]}
    appeared = {(r["before"], r["after"]): r["delta_us"] for r in d["bubbles"]["appeared"]}
    vanished = {(r["before"], r["after"]): r["delta_us"] for r in d["bubbles"]["vanished"]}
    assert appeared and vanished
    assert all(v == pytest.approx(want_b[k]) and k not in want_a for k, v in appeared.items())
    assert all(v == pytest.approx(-want_a[k]) and k not in want_b for k, v in vanished.items())
    assert ("_qkv_rope_write_kernel", "_paged_attention_kernel") in appeared
    assert all(r["pair"] == f"{r['before']} -> {r['after']}" for r in d["bubbles"]["changed"])
    text = _cli("diff", a, b).stdout
    assert "Bubbles between graph nodes, by kernel pair:\n  vanished" in text
    assert "_qkv_rope_write_kernel -> _paged_attention_kernel" in text
    same = json.loads(_cli("diff", b, b, "--json").stdout)["bubbles"]
    assert same == {"vanished": [], "appeared": [], "changed": []}
    # traces without graph launches: no bubbles section at all
    v100 = "fixtures/traces/kineto_v100_resnet50.json.gz"
    assert json.loads(_cli("diff", v100, v100, "--json").stdout)["bubbles"] is None
    assert "Bubbles between graph nodes" not in _cli("diff", v100, v100).stdout


def test_diff_rows_do_not_depend_on_the_hash_seed():
    """Rows of equal change come in key order: two interpreters with different hash seeds print the same diff."""
    import subprocess
    import sys

    sync = "fixtures/traces/h200_pairs/bench_sync_bs8_B12.json.gz"
    over = "fixtures/traces/h200_pairs/bench_overlap_bs8_B12_clean_a.json.gz"
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    outs = [subprocess.run([sys.executable, "-m", "gaptrace.cli", "diff", sync, over, "--json"], cwd=root,
                           capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": seed}).stdout
            for seed in ("1", "2")]
    assert outs[0] and outs[0] == outs[1]


def test_frames_without_wrappers_one_row_per_chain():
    """The README's A/B pair: the program's wrapper frames (runpy, click, <module>) do not fill the frame table,
    and a chain of callers with the same idle in A and B is one row (the frame with the most self idle), the
    count of the rest beside it; the vanished rect_packed and _fill_rect still lead."""
    from gaptrace import load_trace
    from gaptrace.analyses.gaps import WRAPPER_RE
    from gaptrace.analyses.summary import run_analysis
    from gaptrace.sidecar import read_sidecar_checked
    root = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "traces", "h200_pairs")
    res = []
    for n in ("bench_sync_bs8_B12", "bench_overlap_bs8_B12_clean_a"):
        p = os.path.join(root, n + ".json.gz")
        res.append(run_analysis(load_trace(p), sidecar=read_sidecar_checked(p)[0]))
    d = diff_analyses(*res)
    for kind, rows in d["frames"].items():
        assert not any(WRAPPER_RE.search(r["frame"]) for r in rows), kind
        pairs = [(round(r["a_us"], 3), round(r["b_us"], 3)) for r in rows]
        assert len(pairs) == len(set(pairs)), kind
    assert [r["frame"] for r in d["frames"]["vanished"][:2]] == ["runtime/engine/model_runner.py: _fill_rect",
                                                               "runtime/spec/plan.py: rect_packed"]
    top = d["frames"]["changed"][0]
    a_rows = {r["frame"]: r for r in res[0]["gap_attribution"]}
    same = [f for f, r in a_rows.items() if round(r["inclusive_idle_us"], 3) == round(top["a_us"], 3)
            and not (r.get("self_idle_us", 0) < 0.5 and WRAPPER_RE.search(f))]
    assert top["same_idle_frames"] >= 1 and top["same_idle_frames"] <= len(same) - 1


def test_diff_does_not_compare_measured_rounds_of_different_kinds(tmp_path):
    """A capture measured at the profiled rounds' positions against one measured in its warm-up rounds (an older or
    --queue capture; here the same trace with the positions removed from its sidecar): the two measured figures are
    of different rounds (2.272 against 2.040 ms on tiny bs 1), so diff states both kinds and no measured change; the
    same kind on both sides is compared."""
    import shutil

    src = "fixtures/traces/h100_same_rounds/tiny_overlap_bs1_B12_clean_a"
    b = str(tmp_path / "b.json.gz")
    shutil.copy(src + ".json.gz", b)
    with open(src + ".gaptrace.json", encoding="utf-8") as f:
        side = json.load(f)
    side["unprofiled_same_rounds_ms"] = None
    with open(str(tmp_path / "b.gaptrace.json"), "w", encoding="utf-8") as f:
        json.dump(side, f)
    d = json.loads(_cli("diff", src + ".json.gz", b, "--json").stdout)["whatif"]
    assert (d["measured_source_a"], d["measured_source_b"]) == ("profiled_positions", "warmup_rounds")
    assert d["measured_a_us"] == pytest.approx(2272.2, abs=0.1) and d["measured_b_us"] == pytest.approx(2039.8, abs=0.1)
    assert d["measured_delta_us"] is None
    assert "the sidecars measured different rounds (A: profiled_positions, B: warmup_rounds), not compared" in d["statement"]
    d = json.loads(_cli("diff", src + ".json.gz", src + ".json.gz", "--json").stdout)["whatif"]
    assert d["measured_delta_us"] == 0.0 and d["measured_source_a"] == d["measured_source_b"] == "profiled_positions"


def test_diff_names_each_sides_calibration():
    """Without --calibration each side takes the shipped calibration of its trace's GPU: an H100 capture against an
    H200 one uses two, and the diff's whatif says which, in its JSON and in its statement."""
    import os
    from gaptrace.analyses.diff import diff_analyses
    from gaptrace.analyses.summary import run_analysis
    from gaptrace.loader import load_trace
    from gaptrace.sidecar import read_sidecar_checked
    root = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "traces")
    res = []
    for s in ("h100_loops", "h200_loops"):
        t = os.path.join(root, s, "per_request_readback.planted.trace.json.gz")
        res.append(run_analysis(load_trace(t), sidecar=read_sidecar_checked(t)[0]))
    w = diff_analyses(*res)["whatif"]
    assert os.path.basename(w["calibration_a"]) == "calibration_h100.json"
    assert os.path.basename(w["calibration_b"]) == "calibration_default.json"
    assert "calibrations A calibration_h100.json, B calibration_default.json" in w["statement"]
    # each trace's predicted round is fitted to its own measured one: the error is 0, printed without a sign flip
    assert "a prediction error of +0.000 ms" in w["statement"]
