"""runtime.annotate's unprofiled host timer: what each range took on the host clock, only while active."""
from __future__ import annotations

import time

import pytest

pytest.importorskip("torch")

from gaptrace.runtime.annotate import annotate, record_host_ranges  # noqa: E402


def test_host_range_times_count_only_active_ranges_nested_inclusive():
    with annotate("outside"):  # no recorder: nothing to count
        pass
    with record_host_ranges() as rec:
        with annotate("round"):
            time.sleep(0.002)
        rec.active = True
        for _ in range(2):
            with annotate("round"):
                with annotate("verify"):
                    time.sleep(0.01)
                time.sleep(0.005)
        rec.active = False
        with annotate("round"):
            time.sleep(0.002)
    with annotate("round"):  # the recorder is gone after the block
        pass
    assert dict(rec.count) == {"round": 2, "verify": 2}
    per = rec.per_round_ms(2)
    assert 10.0 <= per["verify"] < per["round"] and per["round"] >= 15.0
    assert per["round"] - per["verify"] >= 5.0
    assert rec.per_round_ms(0) == {}
