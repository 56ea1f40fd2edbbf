"""Steps and verdicts on the shipped public traces, checked against figures recomputed from the raw JSON
(stdlib json and loops: tests/analyses/_steps_reference.py). fixtures/traces/MANIFEST_public.md lists the results."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

import gaptrace  # noqa: E402
from gaptrace.analyses import steps as steps_mod  # noqa: E402
from gaptrace.analyses import verdicts as verdicts_mod  # noqa: E402

import _steps_reference as ref  # noqa: E402
from _idle_reference import trace_path  # noqa: E402

_CACHE: dict[str, tuple] = {}


def analysed(name: str):
    if name not in _CACHE:
        tr = gaptrace.load_trace(trace_path(name))
        st = steps_mod.find_steps(tr)
        _CACHE[name] = (tr, st, verdicts_mod.step_verdicts(tr, st), ref.complete(name))
    return _CACHE[name]


CASES = [
    # trace, rule, device, verdict
    ("kineto_v100_resnet50", "profiler_step", 0, "host_bound"),
    ("tracelens_h100_qwen1.5_0.5b", "profiler_step", 0, "gpu_bound"),
    ("tracelens_mi300x_sglang_qwen3_8b_decode", "engine_step", 9, "sync_bound"),
    ("tracelens_vllm_prefilldecode_piecewise", "engine_step", 2, "gpu_bound"),
    ("tracelens_b200_eager", "engine_step", 0, "launch_bound"),
    ("hta_a100_graph_launches_rank0", "profiler_step", 0, "gpu_bound"),
    ("tracelens_h100_owlv2", "profiler_step", 0, "host_bound"),
    ("hta_a100_trace_diff_control", "profiler_step", 3, "launch_bound"),
    ("hta_v100_trace_diff_test", "profiler_step", 1, "gpu_bound"),
    ("h200_pairs/bench_sync_bs8_B12", "round", 0, "sync_bound"),
    ("h200_pairs/bench_overlap_bs8_B12_clean_a", "round", 0, "gpu_bound"),
]


@pytest.mark.parametrize("name,rule,device,verdict", CASES)
def test_steps_and_gpu_busy_match_the_raw_events(name, rule, device, verdict):
    tr, st, v, ev = analysed(name)
    ref_rule, iv = ref.step_intervals(ev)
    assert st.rule == rule == ref_rule
    t = st.table
    assert len(t) == len(iv)
    for row, (s, e, tid) in zip(t.itertuples(index=False), iv):
        assert row.start_us == pytest.approx(s, abs=1e-3) and row.end_us == pytest.approx(e, abs=1e-3)
        assert str(row.tid) == tid
    dev = [e for e in ev if e.get("cat") in ref.DEVICE]
    t0 = min(min(float(e["ts"]) for e in dev), t["start_us"].min())
    t1 = max(max(float(e["ts"]) + float(e["dur"]) for e in dev), t["end_us"].max())
    busy = ref.device_busy(ev, device, t0, t1)
    periods = [(s, max(e, nxt[0]) if nxt[2] == tid and nxt[0] >= e else e)
               for (s, e, tid), nxt in zip(iv, iv[1:] + [(None, None, None)])]
    for (s, e), vr in zip(periods, v.table.itertuples(index=False)):
        assert (vr.interval_start_us, vr.interval_end_us) == (pytest.approx(s, abs=1e-3), pytest.approx(e, abs=1e-3))
        assert vr.gpu_busy_us == pytest.approx(ref.busy_in(busy, s, e), rel=1e-9, abs=1e-3)
        assert vr.eager_launches == len(ref.eager_launches(ev, s, e))
    assert v.overall["verdict"] == verdict


def test_resnet_host_bound_on_the_data_loader():
    tr, st, v, ev = analysed("kineto_v100_resnet50")
    dev = [e for e in ev if e.get("cat") in ref.DEVICE]
    busy = ref.device_busy(ev, 0, min(min(float(e["ts"]) for e in dev), st.table["start_us"].min()),
                           max(float(e["ts"]) + float(e["dur"]) for e in dev))
    loader = [e for e in ev if e["name"].startswith("enumerate(DataLoader)#")]
    for row, vr in zip(st.table.itertuples(index=False), v.table.itertuples(index=False)):
        assert vr.verdict == "host_bound"
        assert (vr.gpu_busy_us + vr.device_side_us) / vr.step_us < verdicts_mod.GPU_BOUND_SHARE
        assert vr.top_host == "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
        # the GPU idles longer under the data loader's ranges in the step than under all its back-to-back launching
        s, t = vr.interval_start_us, vr.interval_end_us  # checked against the raw periods above
        idle = sum(busy.idle_between(max(float(e["ts"]), s), min(float(e["ts"]) + float(e["dur"]), t))
                   for e in loader if float(e["ts"]) < t and float(e["ts"]) + float(e["dur"]) > s)
        assert idle > vr.launch_idle_us
        assert idle >= 0.5 * vr.other_host_idle_us


def test_qwen_one_step_gpu_bound_not_a_request():
    tr, st, v, ev = analysed("tracelens_h100_qwen1.5_0.5b")
    row = st.table.iloc[0]
    busy = ref.device_busy(ev, 0, row.start_us, row.end_us)
    assert busy.busy / (row.end_us - row.start_us) >= verdicts_mod.GPU_BOUND_SHARE
    assert st.holds_request is False  # one Qwen2Model forward, no generate()
    assert not any(e["name"].endswith(": generate") for e in ev if e.get("cat") == "python_function")


def test_sglang_step_is_one_blocking_copy():
    tr, st, v, ev = analysed("tracelens_mi300x_sglang_qwen3_8b_decode")
    row, vr = st.table.iloc[0], v.table.iloc[0]
    assert row["name"].startswith("execute_32_context_0")  # the outermost of execute_... and step[DECODE bs=32]
    assert any(e["name"] == "step[DECODE bs=32]" for e in ev)
    copies = [e for e in ev if e.get("cat") == "cuda_runtime" and e["name"] == "hipMemcpyWithStream"
              and row.start_us <= float(e["ts"]) < row.end_us]
    longest = max(copies, key=lambda e: float(e["dur"]))
    dev = [e for e in ev if e.get("cat") in ref.DEVICE]
    busy = ref.device_busy(ev, 9, min(float(e["ts"]) for e in dev), max(float(e["ts"]) + float(e["dur"]) for e in dev))
    idle_under = busy.idle_between(float(longest["ts"]), float(longest["ts"]) + float(longest["dur"]))
    assert idle_under >= 0.9 * (row.end_us - row.start_us)
    assert vr.sync_idle_us >= idle_under - 1e-3
    assert "hipMemcpyWithStream" in vr.top_sync and "populate_from_forward_batch" in vr.top_sync


def test_vllm_piecewise_host_ran_ahead():
    tr, st, v, ev = analysed("tracelens_vllm_prefilldecode_piecewise")
    row, vr = st.table.iloc[0], v.table.iloc[0]
    lag = ref.median_launch_lag(ev, 2, row.start_us, row.end_us)
    assert vr.device_lag_us == pytest.approx(lag, abs=1e-3)
    assert lag > verdicts_mod.LAG_SHARE * (row.end_us - row.start_us)
    assert vr.gpu_busy_us == 0.0
    assert "ran ahead" in vr.figure


def test_b200_launch_bound_figures():
    tr, st, v, ev = analysed("tracelens_b200_eager")
    row, vr = st.table.iloc[0], v.table.iloc[0]
    launches = ref.eager_launches(ev, row.start_us, row.end_us)
    paced = ref.launch_paced_length(launches, row.start_us, row.end_us)
    # the step thread's one thread wait (1.9 µs) lies inside a launch-paced stretch: not host time, it comes off
    assert 0 < vr.wait_us < 5 and vr.blocked_us == 0.0
    assert vr.launch_paced_us == pytest.approx(paced - vr.wait_us, abs=1e-3)
    assert vr.host_us == pytest.approx(row.end_us - row.start_us - vr.wait_us, abs=1e-3)
    assert vr.host_us_per_launch == pytest.approx(vr.launch_paced_us / len(launches), rel=1e-9)
    assert len(launches) >= verdicts_mod.MIN_EAGER_LAUNCHES
    assert vr.launch_paced_share >= 0.8
    assert vr.sync_idle_us == 0.0
    assert v.overall["figure"].startswith(f"the one step launch-bound: {len(launches)} eager launches a step")


def test_hta_a100_gpu_bound_by_queued_work():
    tr, st, v, ev = analysed("hta_a100_graph_launches_rank0")
    dev = [e for e in ev if e.get("cat") in ref.DEVICE]
    t0 = min(float(e["ts"]) for e in dev)
    t1 = max(max(float(e["ts"]) + float(e["dur"]) for e in dev), st.table["end_us"].max())
    busy = ref.device_busy(ev, 0, min(t0, st.table["start_us"].min()), t1)
    for row, vr in zip(st.table.itertuples(index=False), v.table.itertuples(index=False)):
        s, t = vr.interval_start_us, vr.interval_end_us  # checked against the raw periods above
        side = ref.device_side_idle(ev, busy, 0, s, t)
        assert vr.device_side_us == pytest.approx(side, abs=1e-3)
        lag = ref.median_launch_lag(ev, 0, s, t)
        assert vr.device_lag_us == pytest.approx(lag, abs=1e-3)
        gpu_side = (vr.gpu_busy_us + side) / vr.step_us
        assert gpu_side >= verdicts_mod.GPU_BOUND_SHARE or lag > verdicts_mod.LAG_SHARE * vr.step_us
    assert "stream / event dependencies" in v.overall["figure"]


def test_runtime_sync_rounds_name_the_lengths_copy():
    tr, st, v, ev = analysed("h200_pairs/bench_sync_bs8_B12")
    assert set(v.table["verdict"]) == {"sync_bound"}
    assert "device_lengths_to_host" in v.overall["top_sync"]
    assert st.holds_request is False and st.summary["outliers"] == 0


def test_jit_compile_round_is_an_outlier_with_its_compile():
    name = "h200_faults/h200_tiny_overlap_bs8_B12_jit-new-shape"
    tr = gaptrace.load_trace(trace_path(name))
    st = steps_mod.find_steps(tr)
    ev = ref.complete(name)
    _, iv = ref.step_intervals(ev)
    durs = [e - s for s, e, _ in iv]
    med = sorted(durs)[len(durs) // 2 - 1: len(durs) // 2 + 1]
    med = sum(med) / 2 if len(durs) % 2 == 0 else sorted(durs)[len(durs) // 2]
    outliers = [i for i, d in enumerate(durs) if d > steps_mod.OUTLIER_FACTOR * med]
    assert [o.step for o in st.outliers] == outliers and len(outliers) == 1  # the compile round, and only it
    k = outliers[0]
    s, e, _ = iv[k]
    comp = [x for x in ev if x.get("cat") == "python_function" and x["name"] == "triton/compiler/compiler.py(226): compile"
            and s <= float(x["ts"]) and float(x["ts"]) + float(x["dur"]) <= e]
    assert comp and max(float(x["dur"]) for x in comp) >= steps_mod.CULPRIT_SHARE * (durs[k] - med)
    o = st.outliers[0]
    assert o.compile_frame == "triton/compiler/compiler.py(226): compile"
    assert o.site == "runtime/faults.py(105): window_lengths"
    v = verdicts_mod.step_verdicts(tr, st)
    assert v.table.iloc[k]["verdict"] == "compile_bound" and v.overall["outliers_left_out"] == 1
