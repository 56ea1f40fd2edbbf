"""scripts/long_prompts.py (long prompts for the token-list-rebuild capture) and `gaptrace capture --queue`'s input
checks: prompts within the token budget, one error line + exit 2 on bad input, nothing written."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "long_prompts.py")


def _run(*args, cwd=None):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd)


def test_long_prompts_within_budget(tmp_path):
    from gaptrace.runtime.presets import get_preset
    from gaptrace.runtime.tokenizer import load_tokenizer

    out = tmp_path / "p.jsonl"
    r = _run(SCRIPT, "--tokens", "400", "--count", "5", "-o", str(out))
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    p = get_preset("tiny")
    tok = load_tokenizer(p.tokenizer, vocab_size=p.target.vocab_size)
    assert len(rows) == 5 and len({row["prompt"] for row in rows}) == 5  # each a different rotation
    for row in rows:
        n = len(tok.encode(row["prompt"]))
        assert n == row["tokens"] and 300 <= n <= 400  # whole source prompts up to the budget


@pytest.mark.parametrize("args, needle", [
    (["--tokens", "1"], "below the shortest prompt"),
    (["--tokens", "300", "-o", "{tmp}"], "is a directory"),
    (["--tokens", "300", "-o", "{tmp}/missing/x.jsonl"], "does not exist"),
    (["--tokens", "300", "--source", "{tmp}/none.jsonl"], "none.jsonl"),
    (["--tokens", "300", "--source", "{tmp}/src.jsonl", "-o", "{tmp}/src.jsonl"], "overwrite the input"),
])
def test_long_prompts_bad_input(tmp_path, args, needle):
    (tmp_path / "src.jsonl").write_text(open(os.path.join(REPO, "fixtures", "prompts", "heldout.jsonl")).read())
    args = [a.format(tmp=tmp_path) for a in args]
    if "-o" not in args:
        args += ["-o", str(tmp_path / "out.jsonl")]
    before = sorted(os.listdir(tmp_path))
    r = _run(SCRIPT, *args)
    assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert sorted(os.listdir(tmp_path)) == before  # nothing written, no temporary left


@pytest.mark.parametrize("extra, needle", [
    (["--prompt", "a", "--prompt", "b", "--max-new-tokens", "8"], "--queue needs more prompts than --batch-size 2"),
    (["--prompt", "a", "--prompt", "b", "--prompt", "c"], "--queue needs --max-new-tokens"),
])
def test_capture_queue_refusals(tmp_path, extra, needle):
    out = tmp_path / "t.json.gz"
    r = _run("-m", "gaptrace.cli", "capture", "--preset", "tiny", "--batch-size", "2", "--queue", *extra,
             "-o", str(out))
    assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("args, needle", [
    (["decode", "--kernels", "nope", "--prompt", "a"], "Invalid value for '--kernels'"),
    (["nosuch"], "No such command 'nosuch'"),
    (["analyze"], "Missing argument 'TRACE'"),
    (["capture", "--preset", "tiny", "--bogus", "-o", "x.json.gz"], "No such option"),
])
def test_cli_usage_errors_are_one_line(tmp_path, args, needle):
    """click's usage errors (bad choice, unknown command or option, missing argument): one line, exit 2."""
    r = _run("-m", "gaptrace.cli", *args, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("gaptrace: error: ") and needle in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and os.listdir(tmp_path) == []
