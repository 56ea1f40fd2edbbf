"""benchmarks/make_big_trace.py's two layouts (compact, one event a line; Kineto's own indented one) hold the same
events, and the streaming loader reads the Kineto layout to the same columns as the reference reader; the
benchmark's --scaling table counts the events each replicated size holds."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
import make_big_trace  # noqa: E402

from gaptrace.loader import load_raw  # noqa: E402
from gaptrace.reference import events_to_raw  # noqa: E402

DECODE = os.path.join(REPO, "fixtures", "traces", "h200_fused", "h200_bench_overlap_bs8_B12_fused.json.gz")


def test_kineto_layout_holds_the_compact_layouts_events(tmp_path):
    compact, kineto = tmp_path / "c.json", tmp_path / "k.json"
    a = make_big_trace.build(DECODE, str(compact), 8_000_000, False, 6)
    b = make_big_trace.build(DECODE, str(kineto), 8_000_000, False, 6, kineto_format=True)
    assert a["copies"] >= 2 and b["copies"] >= 2  # at least one shifted copy: ids and times were offset
    doc_c, doc_k = json.loads(compact.read_bytes()), json.loads(kineto.read_bytes())
    copies = min(a["copies"], b["copies"])
    per_copy = a["events"] // a["copies"]
    assert doc_k["traceEvents"][:copies * per_copy] == doc_c["traceEvents"][:copies * per_copy]
    assert {k: v for k, v in doc_k.items() if k != "traceEvents"} == \
           {k: v for k, v in doc_c.items() if k != "traceEvents"}
    text = kineto.read_text()
    assert '\n  {\n    "ph": "X", "cat": ' in text and '\n    "args": {\n      ' in text  # Kineto's indentation
    # Kineto's layout spends more bytes per event than the compact one (the source: 311 bytes an event)
    assert b["json_bytes"] / b["events"] > a["json_bytes"] / a["events"]

    raw, _ = load_raw(str(kineto), workers=0, chunk_bytes=1 << 20)
    ref = events_to_raw([(0, doc_k["traceEvents"])])
    assert len(raw.ts) == len(ref.ts) == sum(e.get("ph") == "X" for e in doc_k["traceEvents"])
    for col in ("ts", "dur", "correlation", "external_id", "python_id", "python_parent_id", "device", "stream"):
        np.testing.assert_array_equal(getattr(raw, col), getattr(ref, col))
    names = np.array(raw.symbols, dtype=object)[raw.name_id]
    np.testing.assert_array_equal(names, np.array(ref.symbols, dtype=object)[ref.name_id])


def test_scaling_table_counts_each_sizes_events(tmp_path):
    out = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "bench_analysis.py"), "--scaling", DECODE,
                          "--sizes-gb", "0.003,0.006", "--repeat", "1", "--scratch", str(tmp_path)],
                         capture_output=True, text=True, cwd=REPO, timeout=600)
    assert out.returncode == 0, out.stderr
    rows = [ln for ln in out.stdout.splitlines() if ln.startswith("| ") and ln[2].isdigit()]
    assert len(rows) == 2
    per_copy = 12328  # the source's events (its traceEvents list), written whole in every copy
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert int(cells[1].replace(",", "")) % per_copy == 0
        assert float(cells[2]) > 0 and cells[3].startswith("1: ")
    assert rows[1].rstrip(" |").split("|")[-1].strip()  # the second row has a growth exponent
    assert not list(tmp_path.iterdir())  # the replicated traces were deleted
