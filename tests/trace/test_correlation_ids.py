"""Broken correlation ids: analyze says the device-side idle split is unavailable or partial instead of printing
0 µs device-side. Inputs are the shipped fused overlap capture with its ids rewritten; expected counts and the
partial split are recomputed from the raw JSON with plain Python."""
import gzip
import json

import pytest
from click.testing import CliRunner
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "analyses"))
from test_device_side import plain_device_side_idle  # noqa: E402  (the plain recomputation lives beside its test)

from gaptrace.cli import main

FUSED_OVERLAP = "fixtures/traces/h200_fused/h200_bench_overlap_bs8_B12_fused.json.gz"
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
WARNING = "cannot be tied to the runtime call that launched them"


@pytest.fixture(scope="module")
def doc():
    with gzip.open(FUSED_OVERLAP, "rt") as f:
        return json.load(f)


def write_variant(doc, path, mutate=None, cats=None):
    """A copy of ``doc`` at ``path`` (gzip JSON, no sidecar: the window is the device's whole activity span) with
    ``mutate(args)`` applied to the args of every event that carries a correlation id (only events of ``cats``
    when given)."""
    d = json.loads(json.dumps(doc))
    for e in d["traceEvents"]:
        a = e.get("args")
        if mutate and isinstance(a, dict) and "correlation" in a and (cats is None or e.get("cat") in cats):
            mutate(a)
    with gzip.open(path, "wt") as f:
        json.dump(d, f)
    return str(path)


def by_hand(path):
    """(GPU events, those with no usable id, those whose id no runtime/driver call carries, ids that more than one
    runtime/driver call carries) from the raw JSON."""
    with gzip.open(path, "rt") as f:
        ev = json.load(f)["traceEvents"]
    launch_ids = [e["args"]["correlation"] for e in ev if e.get("ph") == "X" and e.get("cat") in
                  ("cuda_runtime", "cuda_driver") and isinstance(e["args"].get("correlation"), int)
                  and e["args"]["correlation"] >= 0]
    gpu = [e["args"].get("correlation") for e in ev if e.get("ph") == "X" and e.get("cat") in GPU_CATS]
    no_id = sum(1 for c in gpu if c is None or c < 0)
    no_launch = sum(1 for c in gpu if c is not None and c >= 0 and c not in set(launch_ids))
    return len(gpu), no_id, no_launch, len(launch_ids) - len(set(launch_ids))


def analyze(path, *extra):
    r = CliRunner().invoke(main, ["analyze", path, *extra], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return r.stdout


@pytest.fixture(scope="module")
def clean(doc, tmp_path_factory):
    path = write_variant(doc, tmp_path_factory.mktemp("clean") / "clean.json.gz")
    return path, json.loads(analyze(path, "--json"))


def test_clean_trace_links_and_does_not_warn(clean):
    path, res = clean
    n, no_id, no_launch, shared = by_hand(path)
    split = res["idle_split"]
    assert shared == 0  # the shipped capture: one launch call per id
    assert split["gpu_events"] == n > 3000  # the fused overlap capture's six rounds
    assert split["unlinked_gpu_events"] == no_launch and no_id == 0  # launches made before the capture began
    assert split["unlinked_by_cause"] == {"no_id": 0, "shared_id": 0, "no_launch": no_launch}
    assert split["device_side_us"] == pytest.approx(plain_device_side_idle(path)[0], rel=1e-9)
    assert split["device_side_share"] > 0.8
    assert not [w for w in res["warnings"] if WARNING in w]
    text = analyze(path)
    assert WARNING not in text and "is device-side" in text


@pytest.mark.parametrize("name, mutate, cats, cause", [
    ("one value", lambda a: a.__setitem__("correlation", 7), None, "shared_id"),
    ("deleted", lambda a: a.pop("correlation"), None, "no_id"),
    ("negated", lambda a: a.__setitem__("correlation", -a["correlation"] - 1), None, "no_id"),
    ("launch ids moved", lambda a: a.__setitem__("correlation", a["correlation"] + 10**9), ("cuda_runtime",),
     "no_launch"),
])
def test_broken_ids_make_the_split_unavailable(doc, tmp_path, clean, name, mutate, cats, cause):
    path = write_variant(doc, tmp_path / "broken.json.gz", mutate, cats)
    n, _, _, _ = by_hand(path)
    res = json.loads(analyze(path, "--json"))
    split = res["idle_split"]
    assert split["gpu_events"] == split["unlinked_gpu_events"] == n
    assert split["unlinked_by_cause"] == {"no_id": 0, "shared_id": 0, "no_launch": 0, cause: n}
    # not 0 µs: nobody could measure it
    for k in ("host_wait_us", "device_side_us", "device_side_share", "graph_node_us", "graph_node_gaps",
              "graph_node_median_us"):
        assert split[k] is None, k
    assert split["idle_us"] == pytest.approx(clean[1]["idle_split"]["idle_us"], rel=1e-12)  # busy time is id-free
    warned = [w for w in res["warnings"] if WARNING in w]
    assert len(warned) == 1 and warned[0].startswith(f"{n:,} of {n:,} GPU events") and "unavailable" in warned[0]
    text = analyze(path)
    lines = [line for line in text.splitlines() if WARNING in line]
    assert len(lines) == 1 and f"{n:,} of {n:,}" in lines[0] and "split is unavailable" in lines[0]
    assert "is device-side" not in text


def test_half_the_ids_lost_makes_the_split_partial(doc, tmp_path, clean):
    """GPU events with an odd id lose it: those gaps fall back to host wait, so device-side idle shrinks to exactly
    what the plain recomputation finds and is stated as a lower bound."""
    path = write_variant(doc, tmp_path / "half.json.gz",
                         lambda a: a.__setitem__("correlation", -1) if a["correlation"] % 2 else None, GPU_CATS)
    n, no_id, no_launch, _ = by_hand(path)
    assert 0.1 * n <= no_id < n
    res = json.loads(analyze(path, "--json"))
    split = res["idle_split"]
    assert split["unlinked_gpu_events"] == no_id + no_launch
    assert split["unlinked_by_cause"] == {"no_id": no_id, "shared_id": 0, "no_launch": no_launch}
    assert split["device_side_us"] == pytest.approx(plain_device_side_idle(path)[0], rel=1e-9)
    assert 0 < split["device_side_us"] < clean[1]["idle_split"]["device_side_us"]
    assert split["host_wait_us"] + split["device_side_us"] == pytest.approx(split["idle_us"])
    warned = [w for w in res["warnings"] if WARNING in w]
    assert len(warned) == 1 and warned[0].startswith(f"{no_id + no_launch:,} of {n:,} GPU events")
    assert "partial" in warned[0] and f"{no_id:,} with no correlation id" in warned[0]


def test_device_work_before_its_launch_is_warned(doc, tmp_path):
    """The fused overlap capture with every device activity moved 20 ms earlier: the activities whose launch call
    (same correlation id, carried by one call) starts after them are counted, by hand here, and named in one
    warning; the capture as shipped has none."""
    import copy
    from gaptrace import load_trace
    from gaptrace.trace import EARLY_DEVICE_US
    d = copy.deepcopy(doc)
    for e in d["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in GPU_CATS:
            e["ts"] = e["ts"] - 20000.0
    p = tmp_path / "early.json.gz"
    with gzip.open(p, "wt") as f:
        json.dump(d, f)
    calls = {}
    for e in d["traceEvents"]:
        c = (e.get("args") or {}).get("correlation")
        if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver") and isinstance(c, int) and c > 0:
            calls.setdefault(c, []).append(float(e["ts"]))
    dev = [e for e in d["traceEvents"] if e.get("ph") == "X" and e.get("cat") in GPU_CATS
           and len(calls.get((e.get("args") or {}).get("correlation"), ())) == 1]
    early = sum(float(e["ts"]) < calls[e["args"]["correlation"]][0] - EARLY_DEVICE_US for e in dev)
    assert early > 100
    w = [x for x in load_trace(str(p)).warnings if "before that call starts" in x]
    assert w == [w[0]] and w[0].startswith(f"{early} of {len(dev)} device activities")
    assert not [x for x in load_trace(FUSED_OVERLAP).warnings if "before that call starts" in x]
