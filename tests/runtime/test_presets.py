"""The presets' model directory (runtime/presets.py): the tiny pair read from an explicit ``--preset-dir``, and one
line naming the option (exit 2) when the repository's default directory is missing, as in a package installed
without the repository."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from gaptrace.runtime import presets  # noqa: E402
from gaptrace.runtime.cli import decode  # noqa: E402
from gaptrace.runtime.config import ConfigError  # noqa: E402
from gaptrace.runtime.session import build_setup  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SMALL = ["--prompt", "def fib(n):", "--max-new-tokens", "6", "--batch-size", "1", "--block-size", "4"]


def test_preset_dir_names_the_pair():
    d = Path("/somewhere/models")
    p = presets.get_preset("tiny", d)
    assert (p.target_dir, p.draft_dir, p.tokenizer) == (d / "tiny-target", d / "tiny-draft", d / "tokenizer.json")
    assert presets.get_preset("tiny").target_dir == REPO / "fixtures" / "models" / "tiny-target"
    assert presets.get_preset("bench").preset_dir is None  # random weights: no directory needed
    with pytest.raises(ConfigError, match="unknown preset 'huge' \\(known: bench, tiny\\)"):
        presets.get_preset("huge")


def test_missing_default_dir_says_where_to_point_it(monkeypatch, tmp_path):
    missing = tmp_path / "site-packages" / "fixtures" / "models"
    monkeypatch.setattr(presets, "DEFAULT_PRESET_DIR", missing)
    with pytest.raises(ConfigError) as ei:
        build_setup("tiny")
    msg = str(ei.value)
    assert "\n" not in msg and str(missing) in msg and "--preset-dir" in msg
    r = CliRunner().invoke(decode, SMALL)
    assert r.exit_code == 2
    lines = r.stderr.strip().splitlines() if hasattr(r, "stderr") else r.output.strip().splitlines()
    assert len(lines) == 1 and "--preset-dir" in lines[0] and lines[0].startswith("gaptrace: error: ")
    # an explicit directory that does not exist is named as such
    with pytest.raises(ConfigError, match="preset directory not found"):
        build_setup("tiny", preset_dir=str(tmp_path / "nope"))


def _decode_json(*args):
    r = subprocess.run([sys.executable, "-m", "gaptrace.cli", "decode", *SMALL, "--json", *args],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_explicit_preset_dir_decodes_the_same_tokens(tmp_path):
    """A copy of fixtures/models given with --preset-dir (from another working directory) loads the same trained
    pair and tokenizer: the same weights line and token for token the same output as the default."""
    src = REPO / "fixtures" / "models"
    dst = tmp_path / "models"
    shutil.copytree(src, dst)
    default = _decode_json()
    moved = _decode_json("--preset-dir", str(dst))
    assert default["weights"] == moved["weights"] == "checkpoints tiny-target + tiny-draft"
    assert [r["tokens"] for r in moved["requests"]] == [r["tokens"] for r in default["requests"]]
    assert len(default["requests"][0]["tokens"]) == 6
    assert os.path.isdir(dst / "tiny-target")
