"""A graph replay's unprofiled device span, timed by the capture (sidecar ``graphs[].unprofiled_device_us``), replaces
the calibration's per-op device cost for the replays of that graph (docs/DESIGN.md "The profiler taken out")."""
from __future__ import annotations

import copy
import json
import os

import numpy as np

from gaptrace import load_trace
from gaptrace.analyses.profiler_cost import load_calibration, sidecar_device_us, unprofiled_inputs
from gaptrace.analyses.replay import build_model
from gaptrace.sidecar import Sidecar, sidecar_field_problems

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "traces", "h200_pairs")
NAME = "bench_overlap_bs8_B12_clean_a"


def _load():
    tr = load_trace(os.path.join(ROOT, NAME + ".json.gz"))
    with open(os.path.join(ROOT, NAME + ".gaptrace.json")) as f:
        side = json.load(f)
    return tr, side


def test_sidecar_device_span_replaces_the_calibrated_device_cost():
    tr, side = _load()
    model = build_model(tr)
    cal = load_calibration(None)
    # the graphs of this capture, by node count, and the profiled spans of their replays in the trace
    item_nodes = np.where(model.item_call >= 0, model.graph_nodes[np.maximum(model.item_call, 0)], 0)
    sizes = sorted({int(g["nodes"]) for g in side["graphs"]} & set(item_nodes.tolist()))
    assert len(sizes) >= 2
    timed = copy.deepcopy(side)
    given = {}
    for g in timed["graphs"]:
        n = int(g["nodes"])
        spans = model.item_dur_us[item_nodes == n]
        if n == sizes[0]:
            g["unprofiled_device_us"] = given[n] = float(np.median(spans)) * 0.5  # shorter than every replay
        elif n == sizes[1]:
            g["unprofiled_device_us"] = given[n] = float(spans.max()) * 2.0  # longer than every replay
        else:
            g.pop("unprofiled_device_us", None)
    assert sidecar_device_us(timed) == given
    plain = unprofiled_inputs(tr, model, cal, side)
    got = unprofiled_inputs(tr, model, cal, timed)
    assert plain["device_source"] == "calibration" and got["device_source"] == "sidecar"
    a = item_nodes == sizes[0]
    np.testing.assert_allclose(got["item_dur_us"][a], np.minimum(model.item_dur_us[a], given[sizes[0]]))
    b = item_nodes == sizes[1]  # never longer than the profiled span: the profiler only adds
    np.testing.assert_allclose(got["item_dur_us"][b], model.item_dur_us[b])
    rest = ~(a | b)
    np.testing.assert_allclose(got["item_dur_us"][rest], plain["item_dur_us"][rest])


def test_sidecar_device_span_is_checked():
    _tr, side = _load()
    bad = copy.deepcopy(side)
    bad["graphs"][0]["unprofiled_device_us"] = -3.0
    assert any("unprofiled_device_us" in p for p in sidecar_field_problems(bad))
    assert Sidecar.from_dict(bad).graphs[0].unprofiled_device_us is None
    assert Sidecar.from_dict(side).unprofiled_device_us() is None  # captured before the device timing existed
