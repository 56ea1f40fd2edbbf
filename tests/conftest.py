"""Shared by every layer folder (tests/trace, analyses, report, runtime, cli).

- tests/ goes on sys.path, so the helper modules import by their names from any folder:
  ``from _idle_reference import ...``, ``from _report_helpers import ...``, ``from _runtime_models import ...``.
- ``slow``: every test in the modules of SLOW_MODULES and the tests of SLOW_TESTS (below) is marked slow. The
  default run (pyproject's addopts: ``-m 'not slow and not gpu'``, the README's test command) leaves them out;
  ``.ci/run`` runs them after it with ``-m slow``. A single slow test elsewhere can carry ``@pytest.mark.slow`` itself.
- ``gpu``-marked tests run only where torch sees a CUDA device (``pytest -m gpu`` on the GPU machine); elsewhere
  they are skipped with that reason. The markers (``slow``, ``gpu``) are registered in pyproject.toml.
"""
from __future__ import annotations

import os
import sys

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)


# whole modules that decode with the runtime, run notebooks, a browser, the benchmark scripts, the fuzzer, or Triton's
# interpreter: minutes each on a 2-core machine (README, "Tests")
SLOW_MODULES = frozenset({
    "cli/test_bench_gpu_scripts.py",
    "cli/test_benchmarks_smoke.py",
    "report/test_notebooks.py",
    "report/test_report_browser.py",
    "trace/test_fuzz.py",
    "runtime/test_fused_kernels.py",
    "runtime/test_long_prompts_queue.py",
    "runtime/test_runtime_capture.py",
    "runtime/test_runtime_checkpoint_cli.py",
    "runtime/test_runtime_exact.py",
    "runtime/test_runtime_faults.py",
    "runtime/test_runtime_graph_wiring.py",
    "runtime/test_runtime_inputs.py",
    "runtime/test_runtime_plain.py",
    "runtime/test_runtime_recompute.py",
    "runtime/test_runtime_tree.py",
    "runtime/test_tiny_pair.py",
    "runtime/test_tp_ranks.py",
})


# single tests (a nodeid prefix: every parameter of it) that take tens of seconds each there: subprocess CLIs on the
# largest real traces, the HolisticTraceAnalysis cross-check, the by-hand bubble recomputations
SLOW_TESTS = (
    "analyses/test_diff.py::test_diff_and_analyze_warn_when_the_sidecar_window_is_not_in_the_trace",
    "analyses/test_diff.py::test_diff_bubbles_by_kernel_pair",
    "analyses/test_diff.py::test_sidecar_fields_the_analyses_skip_are_named_in_one_warning",
    "analyses/test_diff.py::test_diff_cli_on_real_traces",
    "analyses/test_diff.py::test_diff_of_a_trace_against_itself_says_no_change",
    "analyses/test_occupancy.py::test_occupancy_agrees_with_hta",
    "analyses/test_device_side.py::test_node_bubbles_by_kernel_pair_by_hand",
    "analyses/test_device_side.py::test_graph_node_bubbles_by_hand",
    "cli/test_analyze_cli.py::test_host_only_trace_is_one_error_line_exit_2",
)


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        rel = os.path.relpath(str(item.path), TESTS_DIR).replace(os.sep, "/")
        name = rel + "::" + item.name.split("[")[0]
        if rel in SLOW_MODULES or any(name.startswith(t) for t in SLOW_TESTS):
            item.add_marker(pytest.mark.slow)
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items or _cuda_available():
        return
    skip = pytest.mark.skip(reason="gpu test: needs torch with a CUDA device (run `pytest -m gpu` on a GPU machine)")
    for item in gpu_items:
        item.add_marker(skip)
