"""Device-side gaps (kernels already queued) against a plain recomputation, and what they change in analyze."""
import gzip
import json

import pytest

import gaptrace
from gaptrace.analyses.occupancy import busy_timeline, device_side_gaps
from gaptrace.analyze import run_analysis
from gaptrace.capture import read_sidecar

OVERLAP = "fixtures/traces/h200_fused/h200_bench_overlap_bs8_B12_fused.json.gz"
SYNC = "fixtures/traces/h200_fused/h200_bench_sync_bs8_B12_fused.json.gz"
FUSED_OVERLAP = "fixtures/traces/h200_fused/h200_bench_overlap_bs8_B12_fused.json.gz"
FUSED_SYNC = "fixtures/traces/h200_fused/h200_bench_sync_bs8_B12_fused.json.gz"


def activities_and_launch_ends(path):
    """(sorted [(start, end, correlation)] of the device activities, {correlation: latest end of its launch call})."""
    ev = json.load(gzip.open(path))["traceEvents"]
    acts = sorted((e["ts"], e["ts"] + e["dur"], e["args"].get("correlation")) for e in ev
                  if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    launch_end = {}
    for e in ev:
        if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e["args"]:
            c = e["args"]["correlation"]
            launch_end[c] = max(launch_end.get(c, -1e300), e["ts"] + e["dur"])
    return acts, launch_end


def plain_device_side_idle(path):
    """Σ gap length over gaps whose ending activity's launch call (by correlation) returned before the gap began."""
    acts, launch_end = activities_and_launch_ends(path)
    side = total = 0.0
    run_end = None
    for s, e, c in acts:
        if run_end is not None and s > run_end:
            total += s - run_end
            if c in launch_end and launch_end[c] <= run_end:
                side += s - run_end
        run_end = e if run_end is None else max(run_end, e)
    return side, total


def plain_graph_node_idle(path):
    """Σ and count of the device-side gaps (the next activity's launch call returned before the gap) whose two
    neighbours (the activity ending where the gap starts, the one starting where it ends) share a correlation id:
    bubbles between two nodes of one graph launch."""
    acts, launch_end = activities_and_launch_ends(path)
    corr_by_end = {}
    for s, e, c in acts:
        corr_by_end.setdefault(e, set()).add(c)
    total, n, run_end = 0.0, 0, None
    for s, e, c in acts:
        if (run_end is not None and s > run_end and c is not None and c in corr_by_end.get(run_end, ())
                and c in launch_end and launch_end[c] <= run_end):
            total += s - run_end
            n += 1
        run_end = e if run_end is None else max(run_end, e)
    return total, n


@pytest.mark.parametrize("path", [OVERLAP, SYNC, FUSED_OVERLAP])
def test_graph_node_bubbles_by_hand(path):
    res = run_analysis(gaptrace.load_trace(path), window=None)
    want, n = plain_graph_node_idle(path)
    split = res["idle_split"]
    assert split["graph_node_gaps"] == n > 1000
    assert split["graph_node_us"] == pytest.approx(want, rel=1e-9)
    assert split["graph_node_us"] <= split["device_side_us"] + 1e-6
    assert 0.2 < split["graph_node_median_us"] < 2.0


@pytest.mark.parametrize("path", [OVERLAP, SYNC])
def test_device_side_idle_by_hand(path):
    trace = gaptrace.load_trace(path)
    tl = busy_timeline(trace)
    mask = device_side_gaps(trace, trace.device_ids[0], tl)
    side = float(tl.gaps()["dur_us"].to_numpy()[mask].sum())
    want_side, want_total = plain_device_side_idle(path)
    assert tl.idle_us == pytest.approx(want_total, rel=1e-9)
    assert side == pytest.approx(want_side, rel=1e-9)


def test_overlap_idle_is_mostly_device_side_and_sync_idle_is_not():
    """In the GPU-bound overlap decode nearly all idle is bubbles between queued graph nodes; in the sync twin most
    idle is host wait after the lengths copy."""
    res = {p: run_analysis(gaptrace.load_trace(p), sidecar=read_sidecar(p)) for p in (OVERLAP, SYNC)}
    assert res[OVERLAP]["idle_split"]["device_side_share"] > 0.8
    assert res[SYNC]["idle_split"]["device_side_share"] < 0.4
    for r in res.values():
        split = r["idle_split"]
        assert split["host_wait_us"] + split["device_side_us"] == pytest.approx(split["idle_us"])
        # attribution explains host-wait idle only: no frame holds more than that
        assert max(f["inclusive_idle_us"] for f in r["gap_attribution"]) <= split["host_wait_us"] + 1e-6
    assert not [f for f in res[OVERLAP]["findings"] if f["kind"] == "blocking_sync"]


def test_fused_captures_floor_and_diagnosis():
    """The fused-path H200 pair (fixtures/traces/h200_fused/MANIFEST.md): overlap is GPU-bound with most of its idle
    the bubbles between graph nodes and no blocking-sync finding; sync's first finding is the lengths copy."""
    res = {p: run_analysis(gaptrace.load_trace(p), sidecar=read_sidecar(p)) for p in (FUSED_OVERLAP, FUSED_SYNC)}
    ov, sy = res[FUSED_OVERLAP], res[FUSED_SYNC]
    assert ov["devices"][0]["occupancy"] > sy["devices"][0]["occupancy"] + 0.2
    assert ov["idle_split"]["graph_node_us"] > 0.7 * ov["idle_split"]["idle_us"]
    assert ov["rounds"]["summary"]["verdict"] == "overlapped" and sy["rounds"]["summary"]["verdict"] == "serialized"
    assert not [f for f in ov["findings"] if f["kind"] == "blocking_sync" and f["idle_share"] > 0.05]
    # ranked by predicted saving, the plan's host work comes first in this serialized loop; the first blocking
    # sync is the lengths copy, holding most of the idle, with a saving of its own
    first = next(f for f in sy["findings"] if f["kind"] == "blocking_sync")
    assert "device_lengths_to_host" in first["summary"] and first["idle_share"] > 0.5 and first["saving_us"] > 0


def test_kernel_gaps_script_adds_up_to_the_idle():
    """benchmarks/probes/kernel_gaps.py: its rows' idle sums to the whole-span idle gaptrace measures (same union
    gaps)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "benchmarks/probes/kernel_gaps.py", FUSED_OVERLAP, "--top", "1000"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines()[1:]]
    idle = sum(float(x[-3]) for x in rows)
    assert idle == pytest.approx(busy_timeline(gaptrace.load_trace(FUSED_OVERLAP)).idle_us, abs=0.1 * len(rows))
    attn = [x for x in rows if x[1] == "_paged_attention_kernel"]
    assert attn and int(attn[0][2]) == 180  # 30 attention calls a round (24 draft steps x layers + 6) x 6 rounds


def plain_node_bubbles_by_pair(path):
    """{(before name, after name): [count, Σ µs]} of the bubbles plain_graph_node_idle counts, the pair being the
    activity of the same launch whose end starts the gap and the one whose start ends it (raw JSON, no gaptrace)."""
    ev = json.load(gzip.open(path))["traceEvents"]
    acts = sorted((e["ts"], e["ts"] + e["dur"], e["args"].get("correlation"), e["name"]) for e in ev
                  if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    _, launch_end = activities_and_launch_ends(path)
    name_by_end = {}
    for s, e, c, n in acts:
        name_by_end.setdefault((e, c), n)
    out, run_end = {}, None
    for s, e, c, n in acts:
        if (run_end is not None and s > run_end and c is not None and (run_end, c) in name_by_end
                and c in launch_end and launch_end[c] <= run_end):
            cell = out.setdefault((name_by_end[run_end, c], n), [0, 0.0])
            cell[0] += 1
            cell[1] += s - run_end
        run_end = e if run_end is None else max(run_end, e)
    return out


@pytest.mark.parametrize("path", [SYNC, FUSED_OVERLAP])
def test_node_bubbles_by_kernel_pair_by_hand(path):
    """Every node bubble charged to the kernel pair at its boundary, as a plain pass over the raw JSON charges it:
    same pairs, counts and sums; the pairs' sum is the idle_split's graph_node_us; sorted, shares summing to 1."""
    from gaptrace.analyses.occupancy import node_bubbles

    trace = gaptrace.load_trace(path)
    df = node_bubbles(trace)
    want = plain_node_bubbles_by_pair(path)
    got = {(r.before, r.after): [r.gaps, r.idle_us] for r in df.itertuples()}
    assert set(got) == set(want) and len(got) > 10
    for k, (n, us) in want.items():
        assert got[k][0] == n and got[k][1] == pytest.approx(us, rel=1e-9, abs=1e-6), k
    total, count = plain_graph_node_idle(path)
    assert df["idle_us"].sum() == pytest.approx(total, rel=1e-9) and df["gaps"].sum() == count
    assert list(df["idle_us"]) == sorted(df["idle_us"], reverse=True) and df["share"].sum() == pytest.approx(1.0)
    res = run_analysis(trace, window=None)
    assert len(res["node_bubbles"]) == len(df) and res["node_bubbles"][0]["before"] == df.iloc[0]["before"]
    assert sum(r["idle_us"] for r in res["node_bubbles"]) == pytest.approx(res["idle_split"]["graph_node_us"], rel=1e-9)


def test_node_bubbles_in_the_text_and_a_trace_without_graphs():
    """analyze prints the pairs (kernel names shortened) after the blocking syncs; a trace without graph launches
    has none and no section."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "gaptrace.cli", "analyze", FUSED_OVERLAP, "--top", "3"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    sec = r.stdout.split("Bubbles between graph nodes, by kernel pair")[1].split("\n\n")[0].splitlines()
    # the 0.96 µs median between a split-K GEMM and cuBLAS's reduce is the costliest pair of this capture
    assert "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_splitK_TNT" in sec[2] and "cublasLt::splitKreduce_kernel<…>" in sec[2]
    assert sec[-1].startswith("  … ") and len(sec) == 2 + 3 + 1
    res = run_analysis(gaptrace.load_trace("fixtures/traces/kineto_v100_resnet50.json.gz"))
    assert res["node_bubbles"] == [] and res["idle_split"]["graph_node_gaps"] == 0


def test_short_kernel_name():
    from gaptrace.analyses.occupancy import short_kernel_name

    long = ("void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<float, float, float, "
            "at::native::binary_internal::MulFunctor<float> >, std::array<char*, 2ul> >(int, at::native::"
            "AUnaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> >, std::array<char*, 2ul>)")
    assert short_kernel_name(long) == "at::native::vectorized_elementwise_kernel<…>"
    assert short_kernel_name("_add_rms_norm_kernel") == "_add_rms_norm_kernel"
    assert short_kernel_name("void k<int>(float*)") == "k<int>"  # short: the template arguments stay
    assert short_kernel_name("Memcpy DtoH (Device -> Pinned)") == "Memcpy DtoH (Device -> Pinned)"
    assert len(short_kernel_name("x" * 200)) == 60
    anon = ("void at::native::(anonymous namespace)::indexSelectSmallIndex<c10::BFloat16, long, unsigned int, 2, 2, "
            "-2>(at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>, long)")
    assert short_kernel_name(anon) == "at::native::(anonymous namespace)::indexSelectSmallIndex<…>"


def test_headline_names_the_costliest_boundary():
    """The device-side sentence of the headline ends with node_bubbles' first pair, its count, median and share."""
    res = run_analysis(gaptrace.load_trace(FUSED_OVERLAP))
    top = res["node_bubbles"][0]
    line = next(h for h in res["headline"] if "device-side" in h)
    assert line.endswith(f"({top['gaps']} gaps, median {top['median_us']:.2f} µs, {top['share']:.0%} of the "
                         "node-bubble idle)")
    assert "the costliest boundary is nvjet_sm90_tst_64x8_64x16_4x1_v_bz_splitK_TNT -> cublasLt::splitKreduce" in line
