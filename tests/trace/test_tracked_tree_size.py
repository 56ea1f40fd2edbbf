"""The repository's tracked files fit in 64 MiB, so the whole work tree travels to a GPU machine as it is
(fixtures/traces/*/MANIFEST.md say how each capture was cut to the rounds its tests need: maintainer/trim_trace.py).
Measured as ``git ls-files -z | xargs -0 du -cb``: the bytes of the tracked files in the work tree."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
LIMIT_BYTES = 64 * 1024 * 1024


def _tracked_files() -> list[str]:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    try:
        out = subprocess.run(["git", "-C", REPO, "ls-files", "-z"], capture_output=True, check=True, timeout=60).stdout
    except subprocess.CalledProcessError:
        pytest.skip("not a git checkout")
    return [p for p in out.decode("utf-8", "surrogateescape").split("\0") if p]


def test_tracked_tree_fits_in_64_mib():
    files = _tracked_files()
    if not files:
        pytest.skip("not a git checkout")
    sizes = {}
    for rel in files:
        p = os.path.join(REPO, rel)
        if os.path.isfile(p) and not os.path.islink(p):  # a file deleted in the work tree but not yet in git: 0
            sizes[rel] = os.path.getsize(p)
    total = sum(sizes.values())
    largest = sorted(sizes.items(), key=lambda kv: -kv[1])[:5]
    assert total <= LIMIT_BYTES, (f"tracked files hold {total:,} bytes, over 64 MiB ({LIMIT_BYTES:,}); largest: "
                                  + ", ".join(f"{k} {v:,}" for k, v in largest))
