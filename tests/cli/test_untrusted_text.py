"""Names from a trace are untrusted: control characters in kernel, range and Python frame names reach the
terminal escaped (text, errors) or as JSON escapes (--json), never raw. Input: the shipped fused overlap capture
with every such name suffixed by an ANSI colour sequence, a bell, an 8-bit CSI and a bidi override."""
import gzip
import json

import pytest
from click.testing import CliRunner

from gaptrace.cli import escape_controls, escape_json_controls, main

FUSED_OVERLAP = "fixtures/traces/h200_fused/h200_bench_overlap_bs8_B12_fused.json.gz"
HOSTILE = "\x1b[31mRED\x1b[0m\x07\x9b2J\u202e"
SHOWN = "\\x1b[31mRED\\x1b[0m\\x07\\x9b2J\\u202e"  # what a terminal must show instead
RAW = ("\x1b", "\x07", "\x9b", "\u202e")
NAMED = ("kernel", "user_annotation", "gpu_user_annotation", "python_function")


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """(clean copy, hostile copy) of the fused capture, neither with a sidecar."""
    d = tmp_path_factory.mktemp("untrusted")
    with gzip.open(FUSED_OVERLAP, "rt") as f:
        doc = json.load(f)
    clean = d / "clean.json.gz"
    with gzip.open(clean, "wt") as f:
        json.dump(doc, f)
    for e in doc["traceEvents"]:
        if e.get("cat") in NAMED and isinstance(e.get("name"), str):
            e["name"] += HOSTILE
    hostile = d / "hostile.json.gz"
    with gzip.open(hostile, "wt") as f:
        json.dump(doc, f)
    return str(clean), str(hostile)


def run(*args, code=0):
    r = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert r.exit_code == code, r.output
    return r


def test_escape_controls_is_repr_like_and_keeps_printable_text():
    hostile = "a\x1b[0m\x07\r\x7f\x9b\u202e\U000e0001b"
    assert escape_controls(hostile) == "a\\x1b[0m\\x07\\r\\x7f\\x9b\\u202e\\U000e0001b"
    plain = "κ = 1.333 µs/node → τ 4.20\t× 12\n  … 27 more \\x1b"
    assert escape_controls(plain) == plain
    text = json.dumps({"name": "k" + HOSTILE + "\U000e0001"}, ensure_ascii=False)
    safe = escape_json_controls(text)
    assert json.loads(safe) == json.loads(text) and not any(c in safe for c in RAW + ("\U000e0001",))


def test_analyze_text_escapes_trace_names(traces):
    clean, hostile = traces
    res = json.loads(run("analyze", hostile, "--json").stdout)
    top = res["gap_attribution"][0]["frame"]
    assert top.endswith(HOSTILE)  # the JSON round-trips the name exactly
    out = run("analyze", hostile, "--frames-by", "inclusive").stdout  # the JSON's order: the top frame is listed
    assert not any(c in out for c in RAW)
    assert escape_controls(top) in out and SHOWN in out
    out = run("analyze", hostile).stdout  # by self idle (the default)
    assert not any(c in out for c in RAW) and SHOWN in out
    # the clean capture's text is what it always was: nothing in it needed escaping
    assert "\\x" not in run("analyze", clean).stdout


def test_node_bubble_kernel_names_are_escaped_in_the_text(traces):
    """The bubbles-by-kernel-pair table names kernels from the trace: shortened, then escaped like every name."""
    res = json.loads(run("analyze", traces[1], "--json").stdout)
    assert res["node_bubbles"] and res["node_bubbles"][0]["before"].endswith(HOSTILE)
    out = run("analyze", traces[1]).stdout
    section = out.split("Bubbles between graph nodes, by kernel pair")[1].split("\n\n")[0]
    assert SHOWN in section and not any(c in section for c in RAW)


def test_analyze_json_has_no_raw_controls(traces):
    out = run("analyze", traces[1], "--json").stdout_bytes
    assert not any(c.encode() in out for c in RAW)
    assert b"\\u001b[31mRED\\u001b[0m\\u0007\\u009b2J\\u202e" in out


def test_diff_text_and_json_escape_trace_names(traces):
    clean, hostile = traces
    d = json.loads(run("diff", clean, hostile, "--json").stdout)
    appeared = [r["frame"] for r in d["frames"]["appeared"]]
    assert appeared and all(f.endswith(HOSTILE) for f in appeared)
    out = run("diff", clean, hostile).stdout
    assert not any(c in out for c in RAW)
    assert escape_controls(appeared[0]) in out and SHOWN in out
    assert not any(c.encode() in run("diff", clean, hostile, "--json").stdout_bytes for c in RAW)


def test_error_line_escapes_trace_names(traces):
    """A window that matches nothing lists the trace's annotation names on the one error line (exit 2)."""
    r = run("analyze", traces[1], "--window", "no such range", code=2)
    err = r.stderr
    assert err.startswith("gaptrace: error: ") and err.count("\n") == 1
    assert not any(c in err for c in RAW)
    assert "plan" + SHOWN in err


def test_a_newline_in_a_name_cannot_forge_a_row_or_a_second_error_line(tmp_path):
    """A frame named with a newline and a fake diff row after it: analyze and diff print it inside its own line
    (escaped: ``\\n``), the fake row never starts a line; an error quoting a name or a window with a newline stays
    one line."""
    fake = "  appeared   +999,999 µs  FAKE LINE"
    with gzip.open(FUSED_OVERLAP, "rt") as f:
        doc = json.load(f)
    for e in doc["traceEvents"]:
        if e.get("cat") == "python_function" and "generate" in str(e.get("name")):
            e["name"] += "\n" + fake + "\r\t"
    p = tmp_path / "nl.json.gz"
    with gzip.open(p, "wt") as f:
        json.dump(doc, f)
    for args in (("analyze", str(p), "--top", "200"), ("diff", FUSED_OVERLAP, str(p))):
        out = run(*args).output
        assert "FAKE LINE" in out and "\\n  appeared" in out
        assert not [line for line in out.splitlines() if line.lstrip().startswith("appeared   +999,999")]
        assert "\r" not in out
    r = run("analyze", str(p), "--window", "no\nsuch\rwindow", code=2)
    assert len(r.output.strip().splitlines()) == 1 and "no\\nsuch\\rwindow" in r.output


def test_report_html_holds_no_raw_control_bytes(traces, tmp_path):
    """The HTML report of the hostile trace: names shown with their controls as visible escapes (as in the text
    output), no raw ESC, BEL, CSI or bidi override anywhere in the page (the charts' JSON escapes them too)."""
    out = tmp_path / "r.html"
    run("report", traces[1], "-o", str(out))
    page = out.read_text(encoding="utf-8")
    assert not [c for c in RAW if c in page]
    assert "\\x1b[31mRED" in page
