"""torch.profiler's own Python code (``profile.step()``: frames of torch/profiler/profiler.py) is host time the
unprofiled loop does not spend: the replay's unprofiled inputs take it out whole, and the events recorded inside it
are not charged a per-event cost again (docs/DESIGN.md "The profiler taken out"). Checked against the frames' union
recomputed from the raw JSON (stdlib json and plain loops)."""
from __future__ import annotations

import gzip
import json
import os
import re

import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: _idle_reference

from _idle_reference import merge  # noqa: E402  (the plain union of intervals)
from gaptrace import load_trace  # noqa: E402
from gaptrace.analyses.profiler_cost import load_calibration, profiler_frames, unprofiled_inputs  # noqa: E402
from gaptrace.analyses.replay import build_model  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOOPS = os.path.join(ROOT, "fixtures", "traces", "h200_loops")
FRAME = re.compile(r"(?:^|/)torch/profiler/profiler\.py\(\d+\): ")




@pytest.mark.parametrize("loop", ["graph_readback.fixed", "launch_bound.planted", "host_detokenize.planted"])
def test_profiler_step_frames_are_taken_out_whole(loop):
    path = os.path.join(LOOPS, f"{loop}.trace.json.gz")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    launches = [e for e in events if e.get("cat") == "cuda_runtime" and e["name"] in ("cudaLaunchKernel",
                                                                                        "cudaGraphLaunch")]
    tids = {}
    for e in launches:
        tids[e["tid"]] = tids.get(e["tid"], 0) + 1
    tid = max(tids, key=tids.get)
    frames = merge([(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "python_function"
                     and e["tid"] == tid and FRAME.search(e["name"])])
    assert len(frames) >= 5  # one profile.step() a step at least

    trace = load_trace(path)
    model = build_model(trace)
    ps, pe = profiler_frames(trace, model)
    t0 = model.t0_us
    assert len(ps) == len(frames)
    assert np.allclose(ps + t0, [s for s, _ in frames], atol=1e-3) and np.allclose(pe + t0, [e for _, e in frames],
                                                                                  atol=1e-3)
    # what the unprofiled inputs take out: the frames' time inside the host work between the first and the last
    # device-facing call (the chain), none of it inside a call
    s, e = model.call_start_us + t0, model.call_end_us + t0
    want = 0.0
    for a, b in frames:
        a, b = max(a, s[0]), min(b, e[-1])
        if b <= a:
            continue
        inside_calls = sum(max(0.0, min(b, ce) - max(a, cs)) for cs, ce in zip(s, e))
        want += (b - a) - inside_calls
    u = unprofiled_inputs(trace, model, load_calibration(None))
    assert u["removed_us"]["profiler_step_frames"] == pytest.approx(want, rel=1e-9, abs=1e-6)
    assert want > 5 * 20  # tens of µs a step: not a rounding


def test_no_frames_without_stacks():
    """A trace recorded without Python stacks has no profiler frames: nothing is taken out for them."""
    path = os.path.join(ROOT, "fixtures", "traces", "kineto_v100_resnet50.json.gz")
    trace = load_trace(path)
    model = build_model(trace)
    ps, pe = profiler_frames(trace, model)
    names = trace.host.loc[trace.host["cat"] == "python_function", "name"].astype(str)
    assert not names.str.contains(FRAME.pattern, regex=True).any()  # the precondition: no profiler frames
    assert len(ps) == len(pe) == 0
    assert unprofiled_inputs(trace, model, load_calibration(None))["removed_us"]["profiler_step_frames"] == 0.0


def test_single_size_graph_launch_takes_the_calibrations_kappa(tmp_path):
    """A trace whose graphs all have one size gives no launch fit (κ undefined): a calibration's ``graph_node_us``
    (κ measured by ``gaptrace calibrate``) stands in, cost'_k = max(0, cost_k − κ·N − runtime_call_us), checked on
    the raw cudaGraphLaunch durations; without it the launches keep their profiled cost less one runtime call."""
    import dataclasses

    path = os.path.join(LOOPS, "graph_readback.fixed.trace.json.gz")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        raw = sorted(e["dur"] for e in json.load(f)["traceEvents"]
                     if e.get("ph") == "X" and e.get("name") == "cudaGraphLaunch")
    trace = load_trace(path)
    model = build_model(trace)
    launch = model.graph_nodes > 0
    assert sorted(model.cost_us[launch].tolist()) == pytest.approx(raw, abs=1e-3) and set(model.graph_nodes[launch]) == {31}
    cal = load_calibration(None)
    assert cal.graph_node_us == 0.0  # the shipped default has none (docs/DESIGN.md "The profiler taken out")
    with_k = dataclasses.replace(cal, graph_node_us=1.2)
    u0 = unprofiled_inputs(trace, model, cal)
    u1 = unprofiled_inputs(trace, model, with_k)
    assert u0["launch_source"] == {"31": "none"} and u1["launch_source"] == {"31": "calibration"}
    want = np.maximum(model.cost_us[launch] - 1.2 * 31 - cal.runtime_call_us, 0.0)
    assert u1["cost_us"][launch] == pytest.approx(want, abs=1e-9)
    assert u0["cost_us"][launch] == pytest.approx(np.maximum(model.cost_us[launch] - cal.runtime_call_us, 0), abs=1e-9)
    # the file form: a negative κ is refused in one line naming the field
    bad = tmp_path / "cal.json"
    bad.write_text(json.dumps({"aten_op_us": 1, "python_frame_us": 1, "runtime_call_us": 1, "graph_node_us": -1}))
    with pytest.raises(ValueError, match="graph_node_us"):
        load_calibration(str(bad))
