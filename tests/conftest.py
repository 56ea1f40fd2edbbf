"""Shared by every layer folder (tests/trace, analyses, report, runtime, cli).

- tests/ goes on sys.path, so the helper modules import by their names from any folder:
  ``from _idle_reference import ...``, ``from _report_helpers import ...``, ``from _runtime_models import ...``.
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


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items or _cuda_available():
        return
    skip = pytest.mark.skip(reason="gpu test: needs torch with a CUDA device (run `pytest -m gpu` on a GPU machine)")
    for item in gpu_items:
        item.add_marker(skip)
