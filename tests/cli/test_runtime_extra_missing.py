"""`gaptrace decode` / `gaptrace capture` without the runtime extra: one error line naming the extra, exit 2.

The child process gets a sitecustomize that puts a finder first on ``sys.meta_path`` which refuses a module of
the extra (ModuleNotFoundError, as when it is not installed), so the test runs on a machine that has torch."""
import os
import subprocess
import sys

import pytest

BLOCKER = """import sys
class _Blocker:
    def find_spec(self, name, path=None, target=None):
        if name == {mod!r} or name.startswith({mod!r} + "."):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, _Blocker())
"""


def _run_without(module: str, args: list[str], tmp_path) -> subprocess.CompletedProcess:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER.format(mod=module))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    return subprocess.run([sys.executable, "-m", "gaptrace.cli", *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)


@pytest.mark.parametrize("args", [
    ["decode", "--preset", "tiny", "--prompt", "def f(", "--max-new-tokens", "2"],
    ["capture", "--preset", "tiny", "--prompt", "def f(", "-o", "out.json.gz"],
])
def test_without_torch_one_line_naming_the_extra(args, tmp_path):
    r = _run_without("torch", args, tmp_path)
    lines = r.stderr.splitlines()
    assert r.returncode == 2, r.stderr
    assert lines == [f"gaptrace: error: `gaptrace {args[0]}` needs torch: pip install 'gaptrace[runtime]'"]
    assert r.stdout == "" and not (tmp_path / "out.json.gz").exists()
    # the blocker really hides torch from the child, and the trace-side commands still run there
    h = _run_without("torch", ["--help"], tmp_path)
    assert h.returncode == 0 and "(unavailable: torch is not installed)" in h.stdout, h.stderr


def test_a_missing_module_of_the_extra_inside_the_command_is_one_line(tmp_path):
    """torch present, tokenizers missing: the tokenizer's import sits inside the decode, past registration."""
    r = _run_without("tokenizers", ["decode", "--preset", "tiny", "--prompt", "def f(", "--max-new-tokens", "2"],
                     tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == ["gaptrace: error: `gaptrace decode` needs tokenizers: pip install "
                                     "'gaptrace[runtime]'"]
