"""Fleets of rank traces: collectives recognised and matched across ranks, the waits and the late rank against a
plain recomputation over the raw JSON (tests/_fleet_builders.py: a real H200 capture copied into N ranks with a
planted late rank), the host site charged, the clocks aligned, and the command line (Dask and serial alike; the
single-trace path imports no Dask)."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from _fleet_builders import PLANTED, PLANTED_CALL, build_fleet, raw_collectives
from gaptrace.analyses import collectives, stragglers
from gaptrace.fleet import fleet_files, run_fleet

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
GAPTRACE = [sys.executable, "-m", "gaptrace.cli"]


def _cli(*args, **kw):
    return subprocess.run([*GAPTRACE, *args], capture_output=True, text=True, cwd=ROOT, **kw)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    d = tmp_path_factory.mktemp("fleet")
    planted = build_fleet(str(d), n_ranks=4, late_rank=2, delay_us=600.0)
    res = run_fleet(fleet_files([str(d)]), workers=0, progress=False)
    return d, planted, res


def test_collective_names():
    assert collectives.is_collective_kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)")
    assert collectives.is_collective_kernel("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long)")
    assert collectives.is_collective_kernel("rcclGenericKernel<1, false>")
    assert not collectives.is_collective_kernel("void at::native::vectorized_elementwise_kernel<4>")
    assert collectives.collective_op("ncclDevKernel_AllReduce_Sum_f32_RING_LL") == "ncclAllReduce"
    assert collectives.collective_op("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(x)") == "ncclSendRecv"


def test_public_trace_collective_args_match_the_raw_json():
    """TraceLens's B200 rank-0 trace: its NCCL kernel's args (on the kernel, Kineto >= 2.2) as read from the raw
    JSON with a loop."""
    import gaptrace

    path = os.path.join(ROOT, "fixtures", "traces", "tracelens_b200_eager.json.gz")
    with gzip.open(path, "rt") as f:
        ev = json.load(f)["traceEvents"]
    want = sorted((e["ts"], e["args"].get("Process Group Name"), e["args"].get("Collective name"),
                   e["args"].get("Group size")) for e in ev
                  if e.get("ph") == "X" and e.get("cat") == "kernel" and e["name"].startswith("nccl"))
    got = collectives.collective_kernels(gaptrace.load_trace(path))
    assert len(want) >= 1
    assert [(t, pg, c, g) for t, pg, c, g in zip(got["ts_us"], got["process_group"], got["collective"],
                                                  got["group_size"])] == want


@pytest.mark.parametrize("args_on, kind", [("kernel", "seq"), ("launch", "order"), ("none", "order")])
def test_waits_match_the_raw_json(tmp_path, args_on, kind):
    planted = build_fleet(str(tmp_path), n_ranks=3, late_rank=1, delay_us=400.0, args_on=args_on, rounds=4)
    truth = raw_collectives(planted["files"])
    res = run_fleet(fleet_files([str(tmp_path)]), workers=0, progress=False)
    assert res["collectives"]["key_kind"] == kind
    assert res["collectives"]["instances"] == len(truth["instances"]) == 4
    for r in res["ranks"]:
        assert r["waited_us"] == pytest.approx(truth["waited"][r["rank"]], abs=1e-3)
        assert r["caused_us"] == pytest.approx(truth["caused"][r["rank"]], abs=1e-3)
    m = res["wait_matrix"]
    for i, r in enumerate(m["ranks"]):
        for j, late in enumerate(m["ranks"]):
            assert m["wait_us"][i][j] == pytest.approx(truth["matrix"].get((r, late), 0.0), abs=1e-3)
    # by construction: rank r != 1 waits delay - 5 - (2 + r) in each of the 4 all-reduces
    assert truth["waited"] == pytest.approx({0: 4 * 393.0, 1: 0.0, 2: 4 * 391.0}, abs=1e-3)
    if args_on == "launch":  # the args came from record_param_comms through the External id
        import gaptrace
        k = collectives.collective_kernels(gaptrace.load_trace(planted["files"][0]))
        assert set(k["process_group"]) == {"0"} and set(k["collective"]) == {"allreduce"}


def test_late_rank_and_its_host_site(fleet):
    d, planted, res = fleet
    late = planted["late_rank"]
    s = res["stragglers"][0]
    assert s["late_rank"] == late and s["label"] == "ncclAllReduce"
    assert s["waiters"] == [r for r in range(4) if r != late]
    assert s["sites"][0]["site"] == PLANTED
    # plain recomputation: the time the planted call (innermost under plan) overlaps [first arrival, last arrival]
    truth = raw_collectives(planted["files"])
    with open(planted["files"][late]) as f:
        doc = json.load(f)
    ref = min(json.load(open(p))["baseTimeNanoseconds"] for p in planted["files"])
    off = (doc["baseTimeNanoseconds"] - ref) / 1000.0
    calls = sorted((e["ts"] + off, e["ts"] + off + e["dur"]) for e in doc["traceEvents"]
                   if e.get("name") == PLANTED_CALL and e.get("ts", 0) + off > 0)
    overlap = total = 0.0
    for inst in truth["instances"]:
        first = min(inst["last"] - w for w in inst["waits"].values())  # wait = last - start (all below dur here)
        total += inst["last"] - first
        for cs, ce in calls:
            overlap += max(0.0, min(ce, inst["last"]) - max(cs, first))
    assert s["sites"][0]["interval_us"] == pytest.approx(overlap, abs=1e-3)
    assert s["sites"][0]["share"] == pytest.approx(overlap / total, rel=1e-9)
    assert s["caused_us"] == pytest.approx(truth["caused"][late], abs=1e-3)
    n_steps = res["ranks"][0]["steps"]
    assert n_steps == 6
    mean_wait = np.mean([truth["waited"][r] for r in range(4) if r != late])
    assert s["per_step_us"] == pytest.approx(mean_wait / n_steps, abs=1e-3)
    assert s["line"] == (f"ranks 0, 1, 3 waited {mean_wait / n_steps:.0f} µs a step in ncclAllReduce for rank {late}, "
                         f"whose host was in {PLANTED}")
    assert res["worst_rank"]["rank"] == late


def test_busy_without_waiting_and_clocks(fleet):
    d, planted, res = fleet
    truth = raw_collectives(planted["files"])
    for r in res["ranks"]:
        assert r["clock_offset_us"] == pytest.approx(r["rank"] * 1_000_000.123, abs=1e-6)
        assert abs(r["clock_residual_us"]) < 1e-3  # the common end, after alignment
        # the waits of one rank never overlap (one all-reduce at a time): the union is the sum
        want = r["occupancy"] - truth["waited"][r["rank"]] / r["window_us"]
        assert r["busy_without_waiting"] == pytest.approx(want, abs=1e-9)
    assert res["warnings"] == []


def test_skewed_clock_is_warned_about(tmp_path):
    planted = build_fleet(str(tmp_path), n_ranks=2, late_rank=1, delay_us=300.0, rounds=2)
    p = planted["files"][0]
    doc = json.load(open(p))
    doc["baseTimeNanoseconds"] += 200_000  # rank 0's clock 200 µs off
    open(p, "w").write(json.dumps(doc))
    res = run_fleet(fleet_files([str(tmp_path)]), workers=0, progress=False)
    r0 = res["ranks"][0]
    assert r0["clock_residual_us"] == pytest.approx(100.0, abs=1e-3)  # median of two: half the skew each way
    assert any("common end is off" in w for w in res["warnings"])


def test_waits_rule_clips_at_zero_and_the_duration():
    import pandas as pd
    long = pd.DataFrame({"instance": [0, 0, 0], "key": "k", "label": "ncclAllReduce", "rank": [0, 1, 2],
                         "start_us": [0.0, 50.0, 100.0], "end_us": [20.0, 150.0, 150.0], "dur_us": [20.0, 100.0, 50.0]})
    w = stragglers.instance_waits(long)
    assert w["wait_us"].tolist() == [20.0, 50.0, 0.0]  # rank 0 clipped at its 20 µs kernel
    assert set(w["late_rank"]) == {2} and set(w["total_wait_us"]) == {70.0}
    assert stragglers.ranks_text([0, 1, 2, 3, 4, 5, 6]) == "ranks 0–6"
    assert stragglers.ranks_text([0, 1, 3]) == "ranks 0, 1, 3"


def test_cli_dask_equals_serial_and_glob_and_paths(fleet):
    d, planted, _ = fleet
    a = _cli("analyze", str(d), "--json")
    assert a.returncode == 0, a.stderr
    b = _cli("analyze", str(d), "--json", "--workers", "0")
    g = _cli("analyze", os.path.join(str(d), "fleet.rank*.json"), "--json", "--workers", "0")
    p = _cli("analyze", *planted["files"], "--json", "--workers", "0")
    ja, jb, jg, jp = (json.loads(x.stdout) for x in (a, b, g, p))
    assert ja.pop("cluster")["kind"] == "local" and jb.pop("cluster")["kind"] == "serial"
    jg.pop("cluster"), jp.pop("cluster")
    assert ja == jb == jg == jp
    assert set(ja) >= {"ranks", "collectives", "stragglers"}
    text = _cli("analyze", str(d), "--workers", "0")
    assert text.returncode == 0 and "for rank 2, whose host was in " + PLANTED in text.stdout


def test_cli_merged_keeps_the_one_trace_analysis(fleet):
    d, _, _ = fleet
    r = _cli("analyze", str(d), "--merged", "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert "devices" in res and sorted({x["rank"] for x in res["devices"]}) == [0, 1, 2, 3]


def test_rank_too_big_for_a_worker_is_refused_up_front(fleet):
    d, planted, _ = fleet
    r = _cli("analyze", str(d), "--memory-limit-gb", "0.1")
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "too big for one fleet worker" in lines[0] and "fleet.rank0.json" in lines[0]


def test_hostile_names_are_escaped_in_text(tmp_path):
    build_fleet(str(tmp_path), n_ranks=2, late_rank=1, delay_us=300.0, rounds=2,
                planted="evil.py(1): x\x1b[31m\nFAKE")
    r = _cli("analyze", str(tmp_path), "--workers", "0")
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "\nFAKE" not in r.stdout and "\\x1b" in r.stdout


def test_single_trace_path_imports_no_dask():
    code = ("import sys\nfrom gaptrace.cli import main\ntry:\n    main(['analyze', sys.argv[1], '--json'])\n"
            "except SystemExit:\n    pass\n"
            "sys.stderr.write('DASK=%s' % any(m.split('.')[0] in ('dask', 'distributed') for m in sys.modules))")
    path = os.path.join(ROOT, "fixtures", "traces", "h200_fused", "h200_bench_overlap_bs8_B12_fused.json.gz")
    r = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, cwd=ROOT)
    assert "DASK=False" in r.stderr and json.loads(r.stdout)["devices"]


def test_ranks_without_collectives_merge(tmp_path):
    """Two ranks with no collective kernel: no instance, no straggler, busy without waiting = occupancy; the worst
    rank is the one with the lowest occupancy."""
    src = os.path.join(ROOT, "fixtures", "traces", "h200_fused")
    import shutil
    shutil.copyfile(os.path.join(src, "h200_bench_overlap_bs8_B12_fused.json.gz"), tmp_path / "a.rank0.json.gz")
    shutil.copyfile(os.path.join(src, "h200_bench_sync_bs8_B12_fused.json.gz"), tmp_path / "a.rank1.json.gz")
    res = run_fleet(fleet_files([str(tmp_path)]), workers=0, progress=False)
    assert res["collectives"]["instances"] == 0 and res["stragglers"] == []
    occ = [r["occupancy"] for r in res["ranks"]]
    assert [r["busy_without_waiting"] for r in res["ranks"]] == pytest.approx(occ, abs=1e-12)
    assert res["worst_rank"]["rank"] == int(np.argmin(occ))
    assert res["ranks"][0]["verdict"] != res["ranks"][1]["verdict"] and res["shared"]["verdict"] is None


def test_fleet_report_page(tmp_path):
    d = tmp_path / "ranks"
    planted = build_fleet(str(d), n_ranks=3, late_rank=2, delay_us=300.0, rounds=3,
                          planted="evil.py(1): <script>alert(1)</script>\x1b[31m")
    out = tmp_path / "fleet.html"
    r = _cli("report", str(d), "--workers", "0", "-o", str(out))
    assert r.returncode == 0, r.stderr
    page = out.read_text()
    body = page[page.index("<body>"):page.index("<script>")]
    assert "<script>alert" not in body and "\x1b" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;\\x1b[31m" in body
    for section in ('id="strip"', 'id="stragglers"', 'id="wait-matrix"', "<svg"):
        assert section in body
    truth = raw_collectives(planted["files"])
    assert f"{truth['matrix'][(0, 2)] / 1000:,.3f}" in body  # rank 0's wait for rank 2, in ms
    # the output may not be one of the fleet's files
    r = _cli("report", str(d), "--workers", "0", "-o", planted["files"][0])
    assert r.returncode == 2 and "input" in r.stderr and json.load(open(planted["files"][0]))["traceEvents"]


def test_diff_of_two_fleets(tmp_path):
    """A fleet with a 600 µs late rank against one with 200 µs: B waits less; the per-rank waits and the gate values
    are the two fleets' own (each against the raw JSON)."""
    a = build_fleet(str(tmp_path / "a"), n_ranks=2, late_rank=1, delay_us=600.0, rounds=3)
    b = build_fleet(str(tmp_path / "b"), n_ranks=2, late_rank=1, delay_us=200.0, rounds=3)
    ta, tb = raw_collectives(a["files"]), raw_collectives(b["files"])
    r = _cli("diff", str(tmp_path / "a"), str(tmp_path / "b"), "--json", "--fail-if", "delta_waited_us > 0",
             "--workers", "0")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["metrics"]["waited_us"]["a"] == pytest.approx(sum(ta["waited"].values()), abs=1e-3)
    assert d["metrics"]["waited_us"]["b"] == pytest.approx(sum(tb["waited"].values()), abs=1e-3)
    assert d["ranks"][0]["waited_us_a"] == pytest.approx(ta["waited"][0], abs=1e-3)
    assert d["gates"] == [{"gate": "delta_waited_us > 0", "value": pytest.approx(
        sum(tb["waited"].values()) - sum(ta["waited"].values()), abs=1e-3), "tripped": False}]
    r = _cli("diff", str(tmp_path / "b"), str(tmp_path / "a"), "--fail-if", "delta_waited_us > 0", "--workers", "0")
    assert r.returncode == 1 and "TRIPPED" in r.stdout
    r = _cli("diff", str(tmp_path / "a"), a["files"][0])
    assert r.returncode == 2 and "one side is a fleet" in r.stderr
    r = _cli("diff", str(tmp_path / "a"), str(tmp_path / "b"), "--fail-if", "tau < 3")
    assert r.returncode == 2 and "unknown fleet metric" in r.stderr


def test_a_glob_of_one_file_is_the_single_trace_path():
    pattern = os.path.join(ROOT, "fixtures", "traces", "h200_fused", "h200_bench_overlap_bs8_B12_fused.json.g?")
    r = _cli("analyze", pattern, "--json")
    assert r.returncode == 0, r.stderr
    want = json.loads(_cli("analyze", pattern[:-1] + "z", "--json").stdout)
    got = json.loads(r.stdout)
    assert got["devices"] == want["devices"] and "ranks" not in got
    r = _cli("analyze", os.path.join(ROOT, "fixtures", "nothing-*.json"))
    assert r.returncode == 2 and "matches no" in r.stderr


def test_an_existing_cluster_by_address(fleet):
    """--dask-scheduler: the tasks run on a cluster started elsewhere (here, by the test); the same summary; its
    worker's memory limit is the one each rank is checked against. An address with no scheduler: one line, exit 2."""
    from dask.distributed import LocalCluster

    d, _, serial = fleet
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None,
                      memory_limit="3GB") as cluster:
        r = _cli("analyze", str(d), "--json", "--dask-scheduler", cluster.scheduler_address)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    c = res.pop("cluster")
    assert c["kind"] == cluster.scheduler_address and c["workers"] == 1 and c["memory_limit_bytes"] == 3_000_000_000
    serial = {k: v for k, v in serial.items() if k != "cluster"}
    assert res == json.loads(json.dumps(serial))
    r = _cli("analyze", str(d), "--dask-scheduler", "tcp://127.0.0.1:9")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "cannot reach" in r.stderr


def test_a_bad_rank_file_is_one_line_on_the_cluster_too(tmp_path):
    planted = build_fleet(str(tmp_path), n_ranks=2, late_rank=1, delay_us=300.0, rounds=2)
    with open(planted["files"][1], "w") as f:
        f.write('{"traceEvents": [')
    for extra in ((), ("--workers", "0")):
        r = _cli("analyze", str(tmp_path), *extra)
        assert r.returncode == 2 and r.stdout == "", r.stderr
        assert r.stderr.strip().splitlines() == [f"gaptrace: error: {planted['files'][1]}: JSON ends before the "
                                                 "document closes at byte 17 (truncated file?)"]


def test_public_two_rank_trace_matches_the_raw_json():
    """HolisticTraceAnalysis's two-rank test trace (fixtures/traces/hta_multirank, MANIFEST.md): the SendRecv
    kernels matched by order, each rank's waits and the waits it caused as the plain recomputation from the raw JSON
    gives them, and the missing baseTimeNanoseconds said in a warning."""
    d = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "traces", "hta_multirank")
    files = fleet_files([d])
    truth = raw_collectives([f for _, f in files])
    res = run_fleet(files, workers=0, progress=False)
    assert res["collectives"]["key_kind"] == "order"
    assert res["collectives"]["instances"] == len(truth["instances"]) == 10
    for r in res["ranks"]:
        assert r["waited_us"] == pytest.approx(truth["waited"][r["rank"]], abs=1e-3)
        assert r["caused_us"] == pytest.approx(truth["caused"][r["rank"]], abs=1e-3)
    assert truth["waited"][0] > truth["waited"][1] > 0  # both waited; rank 0 the longer
    assert any("baseTimeNanoseconds" in w for w in res["warnings"])


def test_identical_ranks_name_no_worst_rank_and_keep_their_warnings(tmp_path):
    """Two copies of one capture: no collective, the same occupancy: no worst rank is named (a tie is not a
    straggler), and each rank's own warnings reach the fleet's text and report."""
    import shutil
    src = os.path.join(ROOT, "fixtures", "traces", "h200_fused", "h200_bench_overlap_bs8_B12_fused.json.gz")
    for r in (0, 1):
        shutil.copyfile(src, tmp_path / f"a.rank{r}.json.gz")
    res = run_fleet(fleet_files([str(tmp_path)]), workers=0, progress=False)
    assert res["ranks"][0]["occupancy"] == res["ranks"][1]["occupancy"]
    assert res["worst_rank"]["rank"] is None and "same occupancy" in res["headline"][-1]
    from gaptrace.fleet import render_fleet_text
    from gaptrace.report.fleet import render_fleet_report
    text, page = render_fleet_text(res), render_fleet_report(res, "t")
    for r in res["ranks"]:
        for w in r["warnings"]:
            assert f"rank {r['rank']}: {w}"[:60] in text
    assert res["ranks"][0]["warnings"] and "<li>rank 0: " in page  # this capture warns (names cut, overlaps)
