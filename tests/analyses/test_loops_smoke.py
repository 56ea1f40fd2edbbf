"""CPU smoke runs of the measured loops (benchmarks/loops): every loop's both variants take steps inside their
``step`` and planted-site ranges, the twins compute the same values, a capture is a valid Kineto trace with those
ranges, a measurement's figures follow from its recorded periods, and the driver runs end to end."""
import gzip
import json
import os
import statistics
import subprocess
import sys
import tarfile
import time

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # ~50 s on a loaded 2-core machine (most of it importing transformers, two processes)

from benchmarks.loops import LOOPS, loop_module  # noqa: E402
from benchmarks.loops import _worker, run_pairs  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CPU = torch.device("cpu")


def _build(name, variant):
    if name == "hf_generate":
        pytest.importorskip("transformers")
    return loop_module(name).build(variant, CPU)


def _close(loop):
    if hasattr(loop, "close"):
        loop.close()


@pytest.mark.parametrize("variant", ["planted", "fixed"])
@pytest.mark.parametrize("name", LOOPS)
def test_each_loop_steps_inside_its_ranges(name, variant):
    """3 steps: 4 ticks; one ``step`` range per step (none in the ProfilerStep loop) and its planted site per step."""
    mod = loop_module(name)
    loop = _build(name, variant)
    ticks = []
    try:
        loop.run(1, lambda: None)  # warm-up, outside the profile
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            loop.run(3, lambda: ticks.append(time.perf_counter()))
    finally:
        _close(loop)
    assert len(ticks) == 4 and ticks == sorted(ticks)
    names = [e.name for e in prof.events()]
    assert names.count("step") == (3 if getattr(mod, "HAS_STEP_RANGE", True) else 0)
    assert names.count(mod.SITE) == 3
    assert mod.SITE.startswith("planted_") and mod.CAUSE and mod.FIX


def _run_both(name, steps, state):
    out = {}
    for v in ("planted", "fixed"):
        loop = _build(name, v)
        try:
            loop.run(steps, lambda: None)
            out[v] = state(loop)
        finally:
            _close(loop)
    return out


def test_twins_compute_the_same_values():
    """The fix changes only how the cause's value reaches the host, not what is computed."""
    r = _run_both("graph_readback", 6, lambda l: l.tokens.tolist())
    assert r["planted"] == r["fixed"]
    r = _run_both("launch_bound", 4, lambda l: l.x.clone())
    assert torch.equal(r["planted"], r["fixed"])
    r = _run_both("per_request_readback", 5, lambda l: [list(q) for q in l.requests])
    assert r["planted"] == r["fixed"] and len(r["planted"][0]) == 5
    r = _run_both("host_detokenize", 5, lambda l: ([list(h) for h in l.history], l.stopped))
    assert r["planted"] == r["fixed"]
    r = _run_both("empty_cache", 4, lambda l: l.tokens.tolist())
    assert r["planted"] == r["fixed"]
    r = _run_both("eager_sampling", 5, lambda l: (l.tokens.tolist(), l.history.tolist(), int(l.pos)))
    assert r["planted"] == r["fixed"] and r["planted"][2] == 5
    r = _run_both("copy_stream_sync", 4, lambda l: (float(l.last), l.n))
    assert r["planted"] == r["fixed"] and r["planted"][1] == 4
    # the mask loop with an end-of-sequence id that the first step hits for some requests: frozen counts and pads
    def first_hit(loop):
        loop.eos = int(loop.model.logits(loop.tokens).argmax(-1)[0])
    r = {}
    for v in ("planted", "fixed"):
        loop = _build("mask_index", v)
        first_hit(loop)
        loop.run(4, lambda: None)
        r[v] = (loop.tokens.tolist(), loop.steps.tolist(), loop.finished.tolist(), loop.active_steps.tolist())
    assert r["planted"][:3] == r["fixed"][:3] and r["planted"][2][0] and r["planted"][1][0] == 0
    assert r["planted"][3] == [s for s, f in zip(r["fixed"][1], r["fixed"][2]) if not f]
    pytest.importorskip("transformers")
    scores = torch.randn(1, loop_module("hf_generate").CPU_SIZE["vocab"])
    r = {v: _build("hf_generate", v).processors[0](None, scores.clone()) for v in ("planted", "fixed")}
    assert torch.equal(r["planted"], r["fixed"])
    assert int(torch.isinf(r["fixed"]).sum()) == loop_module("hf_generate").CPU_SIZE["banned"]
    r = _run_both("train_step_logging", 5, lambda l: list(l.losses))
    assert len(r["planted"]) == 5 and r["fixed"] == r["planted"][:4]  # the fix logs one step late


def _trace_events(path):
    with gzip.open(path, "rt") as f:
        obj = json.load(f)
    assert isinstance(obj, dict) and isinstance(obj["traceEvents"], list)
    return obj["traceEvents"]


def _ranges(events, name):
    return [(e["ts"], e["ts"] + e["dur"]) for e in events
            if e.get("ph") == "X" and e.get("cat") == "user_annotation" and e.get("name") == name]


def test_capture_is_kineto_json_with_step_and_site(tmp_path):
    """3 profiled steps: 3 ``step`` ranges, 3 ProfilerStep ranges, every site range inside a step range, Python
    stack events present (with_stack), and gaptrace's sidecar next to the trace."""
    trace = tmp_path / "graph_readback.planted.trace.json.gz"
    info = tmp_path / "info.json"
    assert _worker.main(["capture", "graph_readback", "planted", "--device", "cpu", "--warmup", "2",
                         "--active", "3", "--out", str(trace), "--info", str(info)]) == 0
    ev = _trace_events(trace)
    steps = _ranges(ev, "step")
    sites = _ranges(ev, "planted_readback")
    assert len(steps) == 3 and len(sites) == 3
    assert len([e for e in ev if str(e.get("name", "")).startswith("ProfilerStep#")]) == 3
    assert all(any(a <= s0 and s1 <= b for a, b in steps) for s0, s1 in sites)
    assert any(e.get("cat") == "python_function" for e in ev)
    meta = json.loads(info.read_text())
    assert meta["trace_bytes"] == trace.stat().st_size
    if meta["profiler_kwargs_from"] == "gaptrace.capture":
        side = json.loads((tmp_path / meta["sidecar"]).read_text())
        assert side["active_steps"] == 3 and side["config"]["loop"] == "graph_readback"


def test_capture_without_gaptrace_replicates_its_settings(tmp_path, monkeypatch):
    """Where gaptrace cannot be imported (a bare GPU host), the worker profiles with the same settings itself:
    the trace has the step and site ranges and Python stack events, and no sidecar is written."""
    monkeypatch.setitem(sys.modules, "gaptrace.capture", None)  # import gaptrace.capture now raises ImportError
    kw, source = _worker.profiler_kwargs()
    assert source == "replicated" and kw["with_stack"] is True and kw["record_shapes"] is False
    trace = tmp_path / "x.json.gz"
    info = tmp_path / "info.json"
    assert _worker.main(["capture", "host_detokenize", "fixed", "--device", "cpu", "--warmup", "2",
                         "--active", "3", "--out", str(trace), "--info", str(info)]) == 0
    ev = _trace_events(trace)
    assert len(_ranges(ev, "step")) == 3 and len(_ranges(ev, "planted_detokenize")) == 3
    assert any(e.get("cat") == "python_function" for e in ev)
    meta = json.loads(info.read_text())
    assert meta["profiler_kwargs_from"] == "replicated" and meta["sidecar"] is None
    assert sorted(os.listdir(tmp_path)) == ["info.json", "x.json.gz"]  # no temporaries left


def test_capture_of_the_profiler_step_loop(tmp_path):
    """The training loop is profiled by its own schedule + prof.step(): ProfilerStep ranges, no ``step`` range."""
    trace = tmp_path / "t.json.gz"
    assert _worker.main(["capture", "train_step_logging", "fixed", "--device", "cpu", "--warmup", "2",
                         "--active", "3", "--out", str(trace)]) == 0
    ev = _trace_events(trace)
    assert len([e for e in ev if str(e.get("name", "")).startswith("ProfilerStep#")]) == 3
    assert _ranges(ev, "step") == [] and len(_ranges(ev, "planted_loss_logging")) == 3


def test_measurement_figures_follow_from_the_periods(tmp_path):
    """The worker's median is the median of its step-start intervals after the first 10%; the loop summary's
    per-process figures, medians and saving are those files' figures."""
    for k in range(2):
        for v in ("planted", "fixed"):
            assert _worker.main(["measure", "per_request_readback", v, "--device", "cpu", "--warmup", "2",
                                 "--steps", "12", "--out", str(tmp_path / f"per_request_readback.{v}.m{k}.json")]) == 0
    m = json.loads((tmp_path / "per_request_readback.fixed.m0.json").read_text())
    p = m["step_periods_ms"]
    assert len(p) == 11 and all(x > 0 for x in p)
    assert m["median_period_ms"] == pytest.approx(statistics.median(p[1:]), abs=1e-4)
    assert m["wall_period_ms"] > 0
    s = run_pairs.summarize_loop("per_request_readback", str(tmp_path))
    meds = {v: [json.loads((tmp_path / f"per_request_readback.{v}.m{k}.json").read_text())["median_period_ms"]
                for k in range(2)] for v in ("planted", "fixed")}
    for v in ("planted", "fixed"):
        assert s[v]["periods_ms_per_process"] == meds[v]
        assert s[v]["median_ms"] == pytest.approx(statistics.median(meds[v]))
        assert s[v]["spread"]["range_ms"] == pytest.approx(max(meds[v]) - min(meds[v]))
    assert s["saving_ms"] == pytest.approx(statistics.median(meds["planted"]) - statistics.median(meds["fixed"]))
    assert s["saving_range_ms"] == pytest.approx([min(meds["planted"]) - max(meds["fixed"]),
                                                  max(meds["planted"]) - min(meds["fixed"])])
    assert s["separated"] == (min(meds["planted"]) > max(meds["fixed"]))
    assert s["ratio"] == pytest.approx(statistics.median(meds["planted"]) / statistics.median(meds["fixed"]))
    assert s["site"] == "planted_per_request_readback" and s["size"] == loop_module("per_request_readback").CPU_SIZE
    md = run_pairs.summary_markdown([s], {"device": "cpu", "steps": 12})
    assert "| per_request_readback |" in md and f"{s['saving_ms']:.4f}" in md


def test_paired_measurement_in_the_capture_process(tmp_path):
    """``--paired-blocks``: both variants measured in the capture's process, blocks alternating; the file's per-round
    savings are planted − fixed of its block medians, the saving their median, the range their min and max; the
    summary carries it; the capture is still written."""
    trace = tmp_path / "host_detokenize.planted.trace.json.gz"
    out = tmp_path / "host_detokenize.paired.json"
    assert _worker.main(["capture", "host_detokenize", "planted", "--device", "cpu", "--warmup", "2", "--active",
                         "2", "--paired-blocks", "3", "--paired-steps", "11", "--paired-out", str(out),
                         "--out", str(trace)]) == 0
    m = json.loads(out.read_text())
    bm = m["block_median_ms"]
    assert m["blocks"] == 3 and len(bm["planted"]) == 3 and len(bm["fixed"]) == 3
    diff = [a - b for a, b in zip(bm["planted"], bm["fixed"])]
    assert m["saving_per_block_ms"] == pytest.approx(diff)
    assert m["saving_ms"] == pytest.approx(statistics.median(diff))
    assert m["saving_range_ms"] == pytest.approx([min(diff), max(diff)])
    assert m["median_ms"]["planted"] == pytest.approx(statistics.median(bm["planted"]))
    assert len(_ranges(_trace_events(trace), "step")) == 2
    s = run_pairs.summarize_loop("host_detokenize", str(tmp_path))
    assert s["paired"]["saving_ms"] == m["saving_ms"] and s["paired"]["blocks"] == 3
    assert f"{m['saving_ms']:.4f}" in run_pairs.summary_markdown([s], {"device": "cpu", "steps": 11})
    with pytest.raises(SystemExit) as e:  # paired needs a file to go to
        _worker.main(["capture", "host_detokenize", "planted", "--device", "cpu", "--paired-blocks", "2",
                      "--out", str(tmp_path / "x.json.gz")])
    assert e.value.code == 2


def test_size_override_reaches_the_loop(tmp_path):
    """``--size KEY=VALUE`` changes the preset the loop is built with and is recorded; an unknown key exits 2."""
    out = tmp_path / "m.json"
    assert _worker.main(["measure", "per_request_readback", "fixed", "--device", "cpu", "--warmup", "1",
                         "--steps", "4", "--size", "batch=3", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["size"] == {**loop_module("per_request_readback").CPU_SIZE, "batch": 3}
    with pytest.raises(SystemExit) as e:
        _worker.main(["measure", "per_request_readback", "fixed", "--device", "cpu", "--size", "nope=1",
                      "--out", str(tmp_path / "n.json")])
    assert e.value.code == 2 and not (tmp_path / "n.json").exists()


def test_driver_end_to_end(tmp_path):
    """Two fresh processes (one per variant), the loop's pairs file, summary.md, run.json and the bundle."""
    out = tmp_path / "pairs"
    r = subprocess.run([sys.executable, "-m", "benchmarks.loops.run_pairs", "--loops", "graph_readback",
                        "--device", "cpu", "--processes", "1", "--steps", "6", "--warmup", "2", "--no-capture",
                        "--out", str(out), "--bundle", str(tmp_path / "b.tar.gz")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    pairs = json.loads((out / "graph_readback.pairs.json").read_text())
    for v in ("planted", "fixed"):
        m = json.loads((out / f"graph_readback.{v}.m0.json").read_text())
        assert pairs[v]["periods_ms_per_process"] == [m["median_period_ms"]]
    run = json.loads((out / "run.m0.json").read_text())  # a --no-capture call from round 0
    assert [p["variant"] for p in run["processes"]] == ["planted", "fixed"]
    assert all(p["rc"] == 0 for p in run["processes"])
    with tarfile.open(tmp_path / "b.tar.gz") as t:
        names = t.getnames()
    assert "pairs/summary.md" in names and "pairs/graph_readback.pairs.json" in names


def test_driver_refuses_an_unknown_loop(tmp_path):
    r = subprocess.run([sys.executable, "-m", "benchmarks.loops.run_pairs", "--loops", "nope", "--device", "cpu",
                        "--out", str(tmp_path / "o")], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unknown loop 'nope'" in r.stderr
    assert not (tmp_path / "o").exists()


def test_eager_sampling_draws_inside_top_k():
    """The loop's sampler keeps only the top-k of the penalised, tempered logits: 300 draws on random logits never
    leave that set, and (Gumbel-max over the kept ones) take more than one id per row."""
    from benchmarks.loops.eager_sampling import PENALTY, TEMPERATURE, TOP_K, sample

    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 500, generator=g)
    hist = torch.randint(0, 500, (3, 8), generator=g)
    seen = torch.gather(x, 1, hist)
    pen = x.scatter(1, hist, torch.where(seen > 0, seen / PENALTY, seen * PENALTY)) / TEMPERATURE
    top = torch.topk(pen, TOP_K, dim=-1).indices
    draws = torch.stack([sample(x, hist) for _ in range(300)])
    for r in range(3):
        got = set(draws[:, r].tolist())
        assert got <= set(top[r].tolist()) and len(got) > 1


def test_measurement_files_are_readable_like_the_traces(tmp_path):
    """The worker's JSON files are written atomically (a temporary file renamed) with a plain file's mode, not
    mkstemp's 0600."""
    p = tmp_path / "m.json"
    _worker._write_json(str(p), {"a": 1})
    umask = os.umask(0)
    os.umask(umask)
    assert (os.stat(p).st_mode & 0o777) == (0o666 & ~umask)
