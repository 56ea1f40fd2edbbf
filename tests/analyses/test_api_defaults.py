"""The Python API's defaults agree with the CLI's: gap attribution charges what `analyze` charges, occupancy reads
the capture sidecar's window, `import gaptrace` reaches gaptrace.analyses.*, a Trace's repr fits a screen."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import gaptrace
from gaptrace.analyses.summary import run_analysis

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SYNC = os.path.join(ROOT, "fixtures/traces/h200_pairs/bench_sync_bs8_B12.json.gz")
HELPER = os.path.join(ROOT, "fixtures/traces/h200_loops/helper_thread.planted.trace.json.gz")


def test_gap_attribution_default_is_the_cli_table():
    """helper_thread has a parked producer thread: the default leaves it out, as `analyze --json` does."""
    t = gaptrace.load_trace(HELPER)
    table = gaptrace.analyses.gaps.gap_attribution(t)
    cli = json.loads(subprocess.run([sys.executable, "-m", "gaptrace.cli", "analyze", HELPER, "--json"],
                                    capture_output=True, text=True, check=True, cwd=ROOT).stdout)
    rows = {r["frame"]: r for r in cli["gap_attribution"]}
    for r in table.head(20).itertuples(index=False):
        assert rows[r.frame]["inclusive_idle_us"] == pytest.approx(r.inclusive_idle_us, rel=1e-9)
        assert rows[r.frame]["self_idle_us"] == pytest.approx(r.self_idle_us, rel=1e-9)
    everything = gaptrace.analyses.gaps.gap_attribution(t, host_wait_only=False, exclude_parked=False)
    assert everything["inclusive_idle_us"].iloc[0] >= table["inclusive_idle_us"].iloc[0]


def test_occupancy_reads_the_sidecar_window_like_analyze():
    t = gaptrace.load_trace(SYNC)
    side = json.load(open(SYNC.replace(".json.gz", ".gaptrace.json")))
    occ = gaptrace.analyses.occupancy.occupancy(t)
    assert side["analysis_window"] and (occ["window"] == side["analysis_window"]).all()
    res = run_analysis(t, sidecar=side)
    assert res["window_source"] == "sidecar"
    assert occ["window_us"].iloc[0] == pytest.approx(res["devices"][0]["window_us"], rel=1e-12)
    plain = gaptrace.analyses.occupancy.occupancy(t, sidecar=None)
    assert plain["window_us"].iloc[0] > occ["window_us"].iloc[0]  # first to last activity: the profiler's edges too


def test_import_gaptrace_reaches_the_analyses():
    code = ("import gaptrace; t = gaptrace.load_trace(%r); "
            "print(gaptrace.analyses.steps.find_steps(t).rule, gaptrace.analyses.verdicts.VERDICTS[0])" % HELPER)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.split() == ["profiler_step", "gpu_bound"]


def test_trace_repr_fits_a_screen():
    t = gaptrace.load_trace(SYNC)
    r = repr(t)
    assert "\n" not in r and len(r) < 400
    assert f"{len(t.host):,} host events" in r and f"{len(t.device):,} device events" in r


def test_diff_gate_values_are_rounded_in_the_text():
    from click.testing import CliRunner

    from gaptrace.cli import main

    probe = os.path.join(ROOT, "fixtures/traces/h200_graph_launch_probe.json.gz")
    r = CliRunner().invoke(main, ["diff", probe, probe, "--fail-if", "occupancy < 0.9"])
    line = next(x for x in r.output.splitlines() if x.startswith("gate "))
    value = line.split("value ", 1)[1].split(" ->")[0]
    assert len(value.replace(".", "").lstrip("0")) <= 4  # 4 significant digits
    occ = gaptrace.analyses.occupancy.occupancy(gaptrace.load_trace(probe))["occupancy"].iloc[0]
    assert float(value) == pytest.approx(occ, rel=1e-3) and r.exit_code == 1
