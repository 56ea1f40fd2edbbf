"""The tiny pair's corpus: CPython's own standard-library source, split by a rule on the path.

Every machine with Python has this corpus, so the shipped pair (fixtures/models/tiny-target, tiny-draft) can be
retrained anywhere from the repo alone. The corpus is *defined by the rule*, not by a file list: the files differ
slightly between Python versions (3.11 here, 3.12 on the GPU machine), and the rule picks the same split for every
path both versions share.

Rule:
  - every ``*.py`` file under ``sysconfig.get_paths()["stdlib"]``, walked recursively;
  - excluding any file with a path component in ``EXCLUDED_DIRS`` (the test suites and site-packages);
  - a file is HELD OUT when ``int(sha256(relpath).hexdigest()[:8], 16) % HELDOUT_MODULUS == 0``, where ``relpath``
    is the POSIX path relative to the stdlib root (about 1 file in 20); everything else is TRAIN.

No torch here: the tokenizer script uses this module too.
"""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

EXCLUDED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "__pycache__"})
HELDOUT_MODULUS = 20
EOS_TOKEN = "<|endoftext|>"


def stdlib_root() -> Path:
    """The running interpreter's standard-library directory (``sysconfig.get_paths()["stdlib"]``)."""
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(relpath: str) -> bool:
    """True when the file at POSIX path ``relpath`` (relative to the stdlib root) belongs to the held-out split.

    Deterministic on the path alone: sha256 of the UTF-8 path, first 32 bits, modulo ``HELDOUT_MODULUS`` == 0.
    """
    digest = hashlib.sha256(relpath.encode("utf-8")).hexdigest()
    return int(digest[:8], 16) % HELDOUT_MODULUS == 0


def corpus_files(root: Path | None = None) -> list[str]:
    """Sorted POSIX relative paths of every corpus file under ``root`` (default: the running stdlib)."""
    root = stdlib_root() if root is None else Path(root)
    out = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if any(part in EXCLUDED_DIRS for part in rel.parts[:-1]):
            continue
        if path.is_file():
            out.append(rel.as_posix())
    return sorted(out)


def read_text(root: Path, relpath: str) -> str:
    """One corpus file as text (UTF-8, undecodable bytes replaced: a handful of stdlib files carry latin-1)."""
    return (Path(root) / relpath).read_bytes().decode("utf-8", errors="replace")


def split_files(root: Path | None = None) -> tuple[list[str], list[str]]:
    """(train, heldout) relative paths under ``root`` by the rule in the module docstring."""
    files = corpus_files(root)
    train = [f for f in files if not is_heldout(f)]
    heldout = [f for f in files if is_heldout(f)]
    return train, heldout
