"""The attack suite (benchmarks/attack_suite.py), one small version of each attack, through the real CLI.

Each must end within its time bound (generous: several times what it takes here, a fraction of what the code that
failed took) in a result or exactly one ``gaptrace: error:`` line with exit 2, leave every input unchanged and no
temporary file beside the output. The sizes are chosen so the growth shows in seconds: 4,000 devices took ~120 s
and 3,000 rank files 93 s where each device's or file's work rescanned them all; 16,000 digits in a gate 16 s.
"""
from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
sys.path.insert(0, ROOT)

import attack_suite as A  # noqa: E402

BY_FUNC = {a.build.__name__: a for a in A.ATTACKS}


def _run(tmp_path, func: str, scale: float, time_limit_s: float) -> A.Outcome:
    a = BY_FUNC[func]
    if a.root_only and os.geteuid() != 0:
        pytest.skip("needs root to plant a link owned by another user")
    if a.not_root and os.geteuid() == 0:
        pytest.skip("root reads any file")
    o = A.run_attack(a, str(tmp_path), scale, time_limit_s=time_limit_s, rss_limit_gb=2)
    assert o.held, f"{a.name}: {o.why} ({o.seconds:.1f} s, {o.rss_gb:.2f} GB)"
    return o


@pytest.mark.parametrize("func", ["a_output_is_member", "a_output_is_member_gz_link", "a_output_is_hard_link"])
def test_an_output_is_never_an_input(tmp_path, func):
    _run(tmp_path, func, 0.01, 30)


@pytest.mark.parametrize("func", ["a_fifo_member", "a_dir_member", "a_unreadable_member", "a_rank_beyond_int32",
                                  "a_rank_named_twice"])
def test_trace_directory_members(tmp_path, func):
    _run(tmp_path, func, 0.01, 20)  # a FIFO blocked forever


def test_gzip_zero_padding_is_not_4_gb(tmp_path):
    _run(tmp_path, "a_gzip_zero_padding", 0.01, 20)  # ISIZE 0 read as 4.29 GB: refused under 0.5 GB


def test_whitespace_in_a_small_gzip_stops_at_the_limit(tmp_path):
    """0.6 GB of spaces in a 0.6 MB gzip under a 0.5 GB limit: refused in one line once the JSON counted passes
    what the limit allows (the trailer's ISIZE described the last member only and let it through)."""
    o = _run(tmp_path, "a_whitespace_gzip", 0.075, 60)
    assert o.returncode == 2


def test_a_symlink_planted_in_a_sticky_directory_is_refused(tmp_path):
    _run(tmp_path, "a_planted_symlink", 0.01, 20)


def test_a_link_of_ones_own_in_a_sticky_directory_is_still_followed(tmp_path):
    """Only another user's link is refused: one's own symlink (and any outside sticky directories) is followed."""
    from gaptrace.outputs import resolve_output
    pub = tmp_path / "pub"
    pub.mkdir()
    os.chmod(pub, 0o1777)
    target = tmp_path / "mine.html"
    target.write_text("x")
    os.symlink(target, pub / "r.html")
    assert resolve_output(str(pub / "r.html")) == str(target)


@pytest.mark.parametrize("func, scale", [("a_many_devices", 0.2), ("a_many_rank_files", 1.0)])
def test_thousands_of_devices_and_rank_files_are_linear(tmp_path, func, scale):
    """4,000 devices of one kernel each (~120 s when every device's rows were found by a mask over all rows and
    the device list rebuilt per call) and 3,000 tiny rank files (93 s): each in a few seconds now."""
    _run(tmp_path, func, scale, 40)


def test_device_rows_come_from_one_index():
    """The per-device rows are those of a mask over the whole frame, in the frame's order, for every device."""
    import numpy as np
    from analyses.occupancy import _device_column, _device_index, _device_rows
    from gaptrace.loader import load_trace
    t = load_trace(os.path.join(ROOT, "fixtures", "traces", "hta_a100_graph_launches_rank0.json.gz"))
    ids, _ = _device_index(t)
    assert ids == t.device_ids
    for key in ids:
        d = t.device
        want = d[(d["rank"].to_numpy() == key[0]) & (d["device"].to_numpy() == key[1])]
        assert _device_rows(t, key).index.equals(want.index)
        assert np.array_equal(_device_column(t, key, "ts_us"), want["ts_us"].to_numpy())
