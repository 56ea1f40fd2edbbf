"""`gaptrace whatif`: text and JSON output, bad input as one line and exit 2."""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "traces")
FAULT = os.path.join(ROOT, "h200_pairs", "bench_overlap_bs8_B12_lengths-copy.json.gz")


def _run(*args):
    return subprocess.run([sys.executable, "-m", "gaptrace.cli", "whatif", *args], capture_output=True, text=True)


def test_json_and_text():
    r = _run(FAULT, "--remove", "lengths_copy", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["changes"] == [{"site": "lengths_copy", "factor": None, "action": "remove",
                             "matched": {"how": "range", "names": ["lengths_copy"], "events": d["rounds"] + 1}}]
    assert d["after_round_us"] < d["before_round_us"] and d["calibration"]["source"].endswith(".json")
    # the clean twin's measured unprofiled round (the median of its sidecar's rounds, another process of the same
    # H200 session): the prediction is within 10% of it
    with open(os.path.join(ROOT, "h200_pairs", "bench_overlap_bs8_B12_clean_a.gaptrace.json")) as f:
        u = sorted(json.load(f)["unprofiled_round_ms"])
        clean = (u[len(u) // 2 - 1] + u[len(u) // 2]) / 2 * 1e3 if len(u) % 2 == 0 else u[len(u) // 2] * 1e3
    assert abs(d["after_round_us"] - clean) / clean < 0.10
    t = _run(FAULT, "--remove", "lengths_copy", "--speedup", "plan=2")
    assert t.returncode == 0 and "predicted unprofiled round" in t.stdout and "plan 2x faster" in t.stdout


def test_bad_input_one_line_exit_2(tmp_path):
    bad_cal = tmp_path / "c.json"
    bad_cal.write_text("[]")
    for args in ([FAULT, "--remove", "no_such_range"], [FAULT, "--speedup", "plan=0"],
                 [str(tmp_path / "missing.json")], [FAULT, "--calibration", str(bad_cal)],
                 # an empty site would match every frame (a name contains ""): refused, not a whole-loop removal
                 [FAULT, "--remove", ""], [FAULT, "--remove-with-device", "  "], [FAULT, "--speedup", " =2"],
                 # one site, two changes: the result would depend on their order
                 [FAULT, "--remove", "plan", "--speedup", "plan=2"], [FAULT, "--speedup", "plan=2", "--speedup",
                                                                      "plan=3"],
                 # an empty file or range name is no default: refused
                 [FAULT, "--remove", "plan", "--calibration", ""], [FAULT, "--remove", "plan", "--rounds", " "]):
        r = _run(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("gaptrace: error:")


def test_sidecar_checked_as_analyze_checks_it(tmp_path):
    """A sidecar of another capture (its analysis_window names no annotation here) is ignored by whatif as by
    analyze: the same warning line, no fit to its round times; a field it cannot use is named, in the JSON too."""
    import shutil
    t = tmp_path / "t.json.gz"
    shutil.copy(FAULT, t)
    with open(FAULT.replace(".json.gz", ".gaptrace.json")) as f:
        side = json.load(f)
    (tmp_path / "t.gaptrace.json").write_text(json.dumps(dict(side, analysis_window="no_such_range")))
    r = _run(str(t), "--remove", "lengths_copy", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert "capture sidecar ignored" in r.stderr and any("capture sidecar ignored" in w for w in d["warnings"])
    assert d["unprofiled_round_us"] is None
    assert d["profiler_cost_fit"] == "none" and not d["fitted_to_unprofiled"]
    (tmp_path / "t.gaptrace.json").write_text(json.dumps(dict(side, unprofiled_round_ms="4.4")))
    r = _run(str(t), "--json")
    d = json.loads(r.stdout)
    assert r.returncode == 0 and any("unprofiled_round_ms (not a period" in w for w in d["warnings"])


def test_a_sidecar_of_another_capture_of_the_same_loop_is_ignored(tmp_path):
    """graph_readback's fixed twin's sidecar beside its planted trace (same ranges, so the analysis_window check
    passes): its profiled steps (0.157 ms median) are not the trace's ProfilerStep#N ranges (0.210 ms), so it is
    ignored, not fitted to (it used to give a confident 0.10 ms round, the fixed twin's). The planted trace's own
    sidecar under the new name is used. A trace JSON in the sidecar's place is refused as one."""
    import shutil
    loops = os.path.join(ROOT, "h100_loops")
    t = tmp_path / "swap.trace.json.gz"
    shutil.copy(os.path.join(loops, "graph_readback.planted.trace.json.gz"), t)
    shutil.copy(os.path.join(loops, "graph_readback.fixed.trace.gaptrace.json"), tmp_path / "swap.trace.gaptrace.json")
    r = _run(str(t), "--remove", "aten::item", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert "0.157 ms median" in r.stderr and "0.210 ms median" in r.stderr and "another capture" in r.stderr
    assert d["unprofiled_round_us"] is None and not d["fitted_to_unprofiled"]
    shutil.copy(os.path.join(loops, "graph_readback.planted.trace.gaptrace.json"), tmp_path / "swap.trace.gaptrace.json")
    r = _run(str(t), "--remove", "aten::item", "--json")
    d = json.loads(r.stdout)
    assert d["unprofiled_round_us"] is not None and "capture sidecar" not in r.stderr
    (tmp_path / "swap.trace.gaptrace.json").write_text(json.dumps({"traceEvents": []}))
    r = _run(str(t), "--json")
    assert r.returncode == 0 and "a profiler trace (it holds traceEvents), not a capture sidecar" in r.stderr


def test_an_absurd_calibration_is_set_aside(tmp_path):
    """An absurd calibration (999 µs per ATen op, just under the 1 ms a file may hold): only α ≈ 0.008 would bring
    the replayed round to the measured one, far below the least α the calibration's measurements allow (0.5,
    whatif.SCALE_MIN), and at 0.5 the replayed round misses it by 10%: out of reach, set aside (α = 1, the warning
    says so), never "fitted"."""
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "analyses", "data", "calibration_default.json")) as f:
        cal = json.load(f)
    p = tmp_path / "cal.json"
    p.write_text(json.dumps(dict(cal, aten_op_us=999.0)))
    sync = os.path.join(ROOT, "h200_pairs", "bench_sync_bs8_B12.json.gz")
    r = _run(sync, "--calibration", str(p), "--json")
    d = json.loads(r.stdout)
    assert r.returncode == 0 and d["profiler_cost_fit"] == "set_aside" and not d["fitted_to_unprofiled"]
    assert d["profiler_cost_scale"] == 1.0
    out = [w for w in d["warnings"] if "reached only at a profiler cost scale of 0.0081, below the 0.5" in w]
    assert out and "(4.449 ms)" in out[0]


def test_a_small_jump_beside_the_measured_round_is_unmatched(monkeypatch):
    """Bisection that ends beside a small jump (the replayed round misses the measured one by more than 1% but less
    than the period goal, and does not leap across it by more than that): "unmatched", the closest α kept, NOT
    fitted. Made here by a measured round 5% above the calibration's own prediction and a fit that returns α = 1."""
    import gaptrace.analyses.whatif as w
    from gaptrace.loader import load_trace
    from gaptrace.sidecar import read_sidecar_checked

    sync = os.path.join(ROOT, "h200_pairs", "bench_sync_bs8_B12.json.gz")
    tr = load_trace(sync)
    side = read_sidecar_checked(sync)[0]
    unfitted = w.Context(tr, side, fit=False).unfitted_round_us
    side = dict(side, unprofiled_round_ms=[1.05 * unfitted / 1e3])
    monkeypatch.setattr(w, "fit_profiler_scale", lambda ctx, target: (1.0, ctx.unprof))
    ctx = w.Context(tr, side)
    assert ctx.fit_status == "unmatched" and ctx.scale == 1.0 and not ctx.fitted
    assert "no profiler cost scale reproduces" in ctx.fit_warning and "(-4.8%)" in ctx.fit_warning


def test_a_runtime_call_is_named_as_one():
    """analyze's frame table lists cudaGraphLaunch as a frame; whatif cannot remove a runtime call and says so."""
    r = _run(FAULT, "--remove", "cudaGraphLaunch")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "'cudaGraphLaunch' is a CUDA runtime call" in r.stderr and "NVTX range or Python frame" in r.stderr


def test_a_measured_round_out_of_reach_either_way_is_set_aside(tmp_path):
    """A measured unprofiled round longer than the replay even with no profiler cost taken out (α = 0) is set aside
    like one shorter than α = 8 reaches: α = 1 (the calibration as it is), "set_aside", a warning; never α kept at a
    bound. A device-bound round the calibration as it is reproduces within 1% is a fit at α = 1."""
    import shutil
    for src, factor, fit, scale in ((FAULT, 1.5, "set_aside", 1.0), (FAULT, 0.1, "set_aside", 1.0),
                                    (os.path.join(ROOT, "h200_pairs", "bench_overlap_bs8_B12_clean_a.json.gz"),
                                     1.0, "fitted", None)):
        t = tmp_path / f"t{factor}.json.gz"
        shutil.copy(src, t)
        with open(src.replace(".json.gz", ".gaptrace.json")) as f:
            side = json.load(f)
        (tmp_path / f"t{factor}.gaptrace.json").write_text(
            json.dumps(dict(side, unprofiled_round_ms=[v * factor for v in side["unprofiled_round_ms"]])))
        d = json.loads(_run(str(t), "--json").stdout)
        assert d["profiler_cost_fit"] == fit, (src, factor, d["profiler_cost_fit"], d["warnings"])
        if fit == "set_aside":
            assert d["profiler_cost_scale"] == scale and not d["fitted_to_unprofiled"]
            assert d["before_round_us"] == d["unfitted_round_us"]  # the calibration alone predicts
            assert any("out of reach" in w and "set aside" in w for w in d["warnings"])
        else:
            # the clean bench round is device-bound: at α = 1 the replay is within 1% of the measured round
            assert abs(d["unfitted_round_us"] - d["unprofiled_round_us"]) <= 0.01 * d["unprofiled_round_us"]
            assert d["fitted_to_unprofiled"] and not any("reach" in w for w in d["warnings"])


def _edited_readback(tmp_path, name, edit):
    import gzip
    src = os.path.join(ROOT, "h100_loops", "graph_readback.planted.trace.json.gz")
    with gzip.open(src, "rt") as f:
        doc = json.load(f)
    edit(doc["traceEvents"])
    out = tmp_path / f"{name}.json.gz"
    with gzip.open(out, "wt") as f:
        json.dump(doc, f)
    return str(out)


def test_a_device_the_replay_cannot_tie_to_its_launches_is_refused(tmp_path):
    """Every correlation id set to 1 (no device op tied to one launch call), or every device op moved 1 ms before
    its launch (clocks that disagree): the replay cannot derive the device timeline. whatif refuses in one line
    (exit 2) instead of a confident saving (84 and 95 µs against 59 µs on the intact trace); analyze keeps its
    other figures and gives no saving, saying why."""
    def same_ids(ev):
        for e in ev:
            if isinstance(e.get("args"), dict) and "correlation" in e["args"]:
                e["args"]["correlation"] = 1

    def early(ev):
        for e in ev:
            if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
                e["ts"] -= 1000
    for name, edit, needle in (("ids", same_ids, "only 0 of 192 device ops are tied"),
                               ("early", early, "192 of 192 device ops start before their launch call")):
        p = _edited_readback(tmp_path, name, edit)
        r = _run(p, "--remove", "aten::item")
        assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1 and needle in r.stderr, r.stderr
        a = subprocess.run([sys.executable, "-m", "gaptrace.cli", "analyze", p, "--json"], capture_output=True,
                           text=True)
        d = json.loads(a.stdout)
        assert a.returncode == 0 and d["whatif"]["predicted_unprofiled_round_us"] is None
        assert all(f.get("saving_us") is None for f in d["findings"])
        assert any(needle in w for w in d["warnings"])


def _notes(needle: str, *args: str) -> list[str]:
    """The warnings of ``gaptrace whatif ARGS --json`` that contain ``needle``."""
    return [w for w in json.loads(_run(*args, "--json").stdout)["warnings"] if needle in w]


def test_round_names_and_round_starts_are_checked():
    """A --round-name the trace lacks is an error (as analyze --rounds), not a silent fall-back to the steps; a
    removed site that holds round starts is named: one start (ProfilerStep#3: the periods beside it are not whole
    rounds, and the median round that grows 11 µs is said to, not only clipped to a 0 saving), or most of them
    (the `round` range itself: the loop body, to which analyze gives no saving)."""
    p = os.path.join(ROOT, "h100_loops", "graph_readback.planted.trace.json.gz")
    r = _run(p, "--round-name", "nosuch")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "'nosuch'" in r.stderr and "ProfilerStep#N" in r.stderr
    # the hint names the steps the loop has without the option (the runtime's 'round' ranges), not the fall-back
    # the missing name led to
    r = _run(FAULT, "--remove", "lengths_copy", "--round-name", "nosuch")
    assert r.returncode == 2 and r.stderr.rstrip().endswith("without it the loop's steps are 'round')")
    d = json.loads(_run(p, "--remove", "ProfilerStep#3", "--json").stdout)
    assert d["saving_us"] == 0.0 and d["after_round_us"] - d["before_round_us"] > 5
    assert any("'ProfilerStep#3' holds the start of 1 of 6 rounds" in w for w in d["warnings"])
    assert any("longer than before" in w for w in d["warnings"])
    d = json.loads(_run(FAULT, "--remove", "round", "--json").stdout)
    assert any("'round' holds the start of 8 of 8 rounds: it is the loop body" in w for w in d["warnings"])
    d = json.loads(_run(p, "--remove", "planted_readback", "--json").stdout)
    assert not any("holds the start" in w or "loop body" in w for w in d["warnings"]) and d["saving_us"] > 50
    # the loop's `step` frame starts after each ProfilerStep#N (no round start inside) but holds the range that
    # fills the rounds: the loop body in whatif's note as in analyze's ranking (one rule, whatif.loop_body)
    site = "benchmarks/loops/graph_readback.py(59): step"
    assert _notes("loop body", p, "--remove", site) == [
        f"{site!r} holds most occurrences of 'step', a range that fills the rounds: it is the loop body "
        "around the round, not a cause (analyze gives it no saving); the prediction removes the round's own host work"]
    # the range that fills the rounds itself (most of the window and of its launches): named as the loop body or its
    # forward; a speedup says it speeds up, not removes
    h = os.path.join(ROOT, "h100_loops", "pageable_htod.planted.trace.json.gz")
    assert _notes("fills the rounds", h, "--remove", "step") == [
        "'step' is a range that fills the rounds (96% of the window and most of its launch calls): the loop body or "
        "its forward; the prediction removes most of the round's host work"]
    d = json.loads(_run(h, "--speedup", "benchmarks/loops/pageable_htod.py(76): step=2", "--json").stdout)
    assert any(w.endswith("the prediction speeds up (x2) the round's own host work") for w in d["warnings"])
    # a site that spans most of the window without holding round starts or a body range: named with its share,
    # since analyze calls it the loop body when it holds another finding's cause (train_step_logging's step frame)
    t = os.path.join(ROOT, "h100_loops", "train_step_logging.planted.trace.json.gz")
    assert _notes("of the rounds' window", t, "--remove", "benchmarks/loops/train_step_logging.py(56): step") == [
        "'benchmarks/loops/train_step_logging.py(56): step' spans 97% of the rounds' window: analyze calls a site that "
        "long the loop body when it holds another finding's cause (one that does not also hold it) and then gives it "
        "no saving of its own (DESIGN.md 5.10); this prediction removes all of its host work"]
    a = json.loads(subprocess.run([sys.executable, "-m", "gaptrace.cli", "analyze", t, "--json"], capture_output=True,
                                  text=True).stdout)
    f = next(f for f in a["findings"] if f.get("cause") == "benchmarks/loops/train_step_logging.py(56): step")
    assert f["saving_us"] is None and "loop body around it" in f["saving_note"]
    a = json.loads(subprocess.run([sys.executable, "-m", "gaptrace.cli", "analyze", p, "--json"], capture_output=True,
                                  text=True).stdout)
    f = next(f for f in a["findings"] if f.get("cause") == site)
    assert f["saving_us"] is None and "encloses the loop itself" in f["saving_note"]


def test_a_site_whose_events_were_dropped_says_so(tmp_path):
    """Every planted_readback range given a negative duration: the loader drops them (a warning), and the site that
    matches nothing says events were dropped, not only that no range has that name."""
    def negative(ev):
        for e in ev:
            if e.get("name") == "planted_readback":
                e["dur"] = -100
    r = _run(_edited_readback(tmp_path, "neg", negative), "--remove", "planted_readback")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "named 'planted_readback'" in r.stderr and "12 events with negative durations were dropped" in r.stderr


def test_a_site_matching_many_frames_by_substring_is_named():
    """A site that is no range or frame name but a substring of many (a short or mistyped name) changes all of them:
    the warning says how many distinct frames and events it took; an exact name gets no such warning."""
    d = json.loads(_run(FAULT, "--remove", "py", "--json").stdout)
    m = d["changes"][0]["matched"]
    assert m["how"] == "frames containing" and len(m["names"]) > 1
    assert [w for w in d["warnings"] if "names no NVTX range or frame exactly" in w] == [
        f"'py' names no NVTX range or frame exactly: it matched {len(m['names']):,} distinct frames containing it "
        f"({m['events']:,} host events), all changed; name one frame as analyze prints it, or an NVTX range, to "
        "change only that"]
    assert _notes("names no NVTX range", FAULT, "--remove", "lengths_copy") == []
