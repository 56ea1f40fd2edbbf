"""`gaptrace calibrate`: the per-event profiler costs it writes are the non-negative least-squares solution, in
relative terms, of its own benchmarks' timings and event counts (checked here from the JSON it writes)."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch")

from gaptrace.analyses.profiler_cost import load_calibration  # noqa: E402
from gaptrace.calibrate import _nnls, fit_costs  # noqa: E402


def test_nnls_by_hand():
    A = np.array([[3.0, 0.0], [1.0, 1.0]])
    np.testing.assert_allclose(_nnls(A, np.array([3.0, 3.0])), [1.0, 2.0])
    np.testing.assert_allclose(_nnls(A, np.array([3.0, 0.0])), [0.9, 0.0], atol=1e-12)  # b would be negative


def test_nnls_is_exact_with_three_categories():
    """With a third category (a GPU calibration's runtime calls) dropping every negative coefficient at once is not
    the optimum; the solution meets the Karush-Kuhn-Tucker conditions of NNLS on random problems: x >= 0, the
    gradient A^T(Ax − y) zero where x > 0 and non-negative where x = 0."""
    rng = np.random.default_rng(7)
    for _ in range(500):
        A = rng.normal(size=(5, 3))
        y = rng.normal(size=5)
        x = _nnls(A, y)
        g = A.T @ (A @ x - y)
        assert (x >= 0).all()
        assert np.all(np.abs(g[x > 1e-12]) < 1e-8) and np.all(g[x <= 1e-12] >= -1e-8), (A, y, x, g)


def _row(name, events, plain_us, profiled_us):
    return {"benchmark": name, "events": events, "plain_s": plain_us * 1e-6, "profiled_s": profiled_us * 1e-6}


def test_fit_costs_weighs_each_benchmark_per_recorded_event():
    """Rows divided by their event count: a model benchmark (350 events) and micro-benchmarks (40,000-60,000 events)
    weigh alike, and a row whose Δ is small noise gets no more weight than any other; a row the profiler did not
    slow down (Δ <= 0) is left out, and a category only it records gets no cost."""
    rows = [_row("python_chain", {"python_function": 60000, "cpu_op": 0, "cuda_runtime": 0}, 0.0, 12000.0),  # 0.2
            _row("aten_ops", {"python_function": 20000, "cpu_op": 20000, "cuda_runtime": 0}, 0.0, 24000.0),   # 1.0
            _row("model", {"python_function": 250, "cpu_op": 100, "cuda_runtime": 0}, 1000.0, 1300.0),
            _row("noise", {"python_function": 250, "cpu_op": 100, "cuda_runtime": 50}, 1000.0, 900.0)]
    cats, x = fit_costs(rows)
    assert cats == ["python_function", "cpu_op"]  # cuda_runtime only in the left-out row
    # by hand: minimise Σ_b ((A_b·x − y_b) / n_b)² over the first three rows, n_b their event counts
    A = np.array([[60000.0, 0.0], [20000.0, 20000.0], [250.0, 100.0]])
    y = np.array([12000.0, 24000.0, 300.0])
    n = A.sum(axis=1)
    ref, *_ = np.linalg.lstsq(A / n[:, None], y / n, rcond=None)
    assert (ref >= 0).all()
    np.testing.assert_allclose(x, ref, rtol=1e-9)
    # the model row pulls the ATen cost above the micro-benchmarks' own 1.0 (their exact solution: 0.2, 1.0)
    assert x[1] > 1.0
    # unweighted, the micro-benchmarks' 10^4-event rows would decide alone
    x_abs, *_ = np.linalg.lstsq(A, y, rcond=None)
    assert abs(x_abs[1] - 1.0) < abs(x[1] - 1.0)
    # a model row whose Δ is 1 µs of noise pulls like any row, no more: neither cost collapses (weighted by 1/Δ it
    # decided the fit alone, both costs near 0)
    rows[2] = _row("model", {"python_function": 250, "cpu_op": 100, "cuda_runtime": 0}, 1000.0, 1001.0)
    _, x_noise = fit_costs(rows)
    assert x_noise[0] > 0.2 / 3 and x_noise[1] > 1.0 / 3, x_noise


def test_calibrate_writes_a_usable_calibration(tmp_path):
    out = tmp_path / "cal.json"
    r = subprocess.run([sys.executable, "-m", "gaptrace.cli", "calibrate", "-o", str(out), "--iterations", "2000"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    rows = d["benchmarks"]
    cats = ["python_function", "cpu_op"] + (["cuda_runtime"] if d["runtime_call_measured"] else [])
    A = np.array([[b["events"][c] for c in cats] for b in rows], dtype=float)
    y = np.array([(b["profiled_s"] - b["plain_s"]) * 1e6 for b in rows])
    keep = y > 0
    n = A[keep].sum(axis=1)
    x = _nnls(A[keep] / n[:, None], y[keep] / n)
    for b in rows:  # each row carries the fit's own figure beside its measured Δ
        assert b["fitted_delta_s"] == pytest.approx(sum(b["events"][c] * v for c, v in zip(cats, x)) * 1e-6)
    assert d["python_frame_us"] == pytest.approx(x[0]) and d["aten_op_us"] == pytest.approx(x[1])
    assert rows[0]["events"]["python_function"] >= 2 * 2000  # the Python chain: 3 frames an iteration
    assert rows[1]["events"]["cpu_op"] >= 2000               # one aten::add an iteration
    by = {b["benchmark"]: b for b in rows}
    # the model benchmarks: 2000 // 100 iterations of an eight-block nn.Module forward (Linear, LayerNorm, GELU:
    # nested ATen ops under module calls) and of a sampling step
    assert by["module_forward"]["iterations"] == 20 and by["sampling"]["iterations"] == 20
    assert by["module_forward"]["events"]["cpu_op"] >= 20 * 8 * 3
    assert by["module_forward"]["events"]["python_function"] >= 20 * 8 * 3
    c = load_calibration(str(out))
    assert c.measured_on == d["measured_on"] and c.source == str(out)
    # no CUDA here: the graph launch's per-node cost is not measured, 0, and said so
    assert d["graph_node_measured"] is False and d["graph_node_us"] == 0.0 and c.graph_node_us == 0.0
    # nor the queued-launch gap: not measured, and the replay keeps the trace's own
    assert d["queue_gap_measured"] is False and d["queued_chain"] is None and c.queue_gap_us is None


def test_calibrate_bad_output_dir(tmp_path):
    r = subprocess.run([sys.executable, "-m", "gaptrace.cli", "calibrate", "-o", str(tmp_path / "no" / "c.json")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_calibrate_refuses_a_fifo_or_a_directory_as_its_output(tmp_path):
    """The output is checked before the benchmarks run: a FIFO (or a device) at the path is never replaced by a
    regular file (the rename of the temporary file would do that), a directory neither; one line, exit 2."""
    import os
    fifo = tmp_path / "f.json"
    os.mkfifo(fifo)
    for out in (fifo, tmp_path):
        r = subprocess.run([sys.executable, "-m", "gaptrace.cli", "calibrate", "-o", str(out), "--iterations", "100"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    import stat
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
