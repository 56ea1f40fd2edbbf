"""Gap attribution on real traces, against brute-force idle computed from the raw events with plain loops."""
from __future__ import annotations

import bisect
from collections import defaultdict

import numpy as np
import pytest

from gaptrace.analyses.gaps import event_idle, gap_attribution, gap_table
from gaptrace.analyses.stacks import normalize_frame
from gaptrace.loader import load_trace
from gaptrace.trace import TraceError

from _idle_reference import Busy, device_intervals, raw_events, trace_path

PROBE = "h200_graph_launch_probe"
TRACES = [
    PROBE,
    "tracelens_b200_eager",
    "tracelens_h100_owlv2",
    "tracelens_vllm_prefilldecode_piecewise",
    "hta_a100_graph_launches_rank0",
    "kineto_v100_resnet50",
]


@pytest.fixture(scope="module", params=TRACES)
def case(request):
    name = request.param
    t = load_trace(trace_path(name))
    r = event_idle(t)
    busy = Busy(device_intervals(raw_events(name)))
    h = t.host
    host = {
        "thread": list(zip(h["rank"].tolist(), h["pid"].astype(str).tolist(), h["tid"].astype(str).tolist())),
        "ts": h["ts_us"].to_numpy(),
        "end": h["end_us"].to_numpy(),
        "frame": [normalize_frame(s) for s in h["name"].astype(str)],
    }
    return name, t, r, busy, host


def _by_thread(host):
    out = defaultdict(list)
    for i, k in enumerate(host["thread"]):
        out[k].append(i)
    return out


def _later_union_inside(host, rows, i):
    """Brute force: the parts of event i where a later-starting event of its thread (sort order ts asc, end desc)
    is open, i.e. where i is not the innermost event."""
    s, e = host["ts"][i], host["end"][i]
    out = []
    for j in rows:
        if j == i:
            continue
        sj, ej = host["ts"][j], host["end"][j]
        later = (sj, -ej, j) > (s, -e, i)  # after i in the tree's order (ts asc, end desc, row)
        if later and sj < e and ej > sj:
            out.append((sj, min(ej, e)))
    return out


def test_window_idle_matches_hand_computation(case):
    _, _, r, busy, _ = case
    assert r.timeline.idle_us == pytest.approx(busy.idle, abs=1e-6)
    assert (r.timeline.t0_us, r.timeline.t1_us) == (busy.t0, busy.t1)


def test_inclusive_idle_on_sampled_events_equals_brute_force(case):
    _, t, r, busy, host = case
    rng = np.random.default_rng(7)
    rows = rng.choice(len(t.host), size=min(300, len(t.host)), replace=False)
    nodes = r.tree.nodes(rows)
    for row, node in zip(rows, nodes):
        assert r.inclusive_us[node] == pytest.approx(busy.idle_between(host["ts"][row], host["end"][row]),
                                                     abs=1e-6)
    # and the biggest holders too, where sampling rarely lands
    top = np.argsort(-r.inclusive_us)[:20]
    for node in top:
        row = r.tree.order[node]
        assert r.inclusive_us[node] == pytest.approx(busy.idle_between(host["ts"][row], host["end"][row]),
                                                     abs=1e-6)


def test_self_idle_sums_to_the_threads_covered_idle(case):
    """Per thread: sum of self idle over its events == idle under the union of its events == the inclusive
    idle of its roots when the roots do not overlap (brute force for the union and the roots)."""
    _, _, r, busy, host = case
    tree = r.tree
    threads = _by_thread(host)
    covered = r.thread_covered_idle_us()
    n_checked_roots = 0
    for k, key in enumerate(zip(tree.threads["rank"], tree.threads["pid"], tree.threads["tid"])):
        rows = threads[key]
        nodes = tree.nodes(np.array(rows))
        self_sum = float(r.self_us[nodes].sum())
        union = busy.idle_under_union([(host["ts"][i], host["end"][i]) for i in rows])
        assert self_sum == pytest.approx(union, abs=1e-6 * max(1.0, union) + 1e-6)
        assert covered[k] == pytest.approx(union, abs=1e-6 * max(1.0, union) + 1e-6)
        # roots by brute force: events contained in no other event of the thread (1 ns slack)
        order = sorted(rows, key=lambda i: (host["ts"][i], -host["end"][i]))
        roots, reach = [], -np.inf
        for i in order:
            if host["ts"][i] >= reach or host["end"][i] > reach + 1e-3:
                roots.append(i)
            reach = max(reach, host["end"][i])
        disjoint = all(host["end"][a] <= host["ts"][b] for a, b in zip(roots, roots[1:]))
        if disjoint:
            n_checked_roots += 1
            root_sum = sum(busy.idle_between(host["ts"][i], host["end"][i]) for i in roots)
            assert self_sum == pytest.approx(root_sum, abs=1e-6 * max(1.0, root_sum) + 1e-6)
    assert n_checked_roots >= 1


def test_self_idle_on_sampled_events_equals_brute_force(case):
    _, t, r, busy, host = case
    threads = _by_thread(host)
    rng = np.random.default_rng(11)
    # sample among events that saw idle (most events see none)
    cand = r.tree.order[np.flatnonzero(r.inclusive_us > 0)]
    rows = rng.choice(cand, size=min(60, len(cand)), replace=False)
    for i in rows:
        same = threads[host["thread"][i]]
        later = merge_clip(_later_union_inside(host, same, i))
        expect = busy.idle_between(host["ts"][i], host["end"][i]) - sum(busy.idle_between(a, b) for a, b in later)
        node = r.tree.nodes(np.array([i]))[0]
        assert r.self_us[node] == pytest.approx(expect, abs=1e-6)


def merge_clip(iv):
    out = []
    for s, e in sorted(iv):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def test_frame_table_matches_brute_force(case):
    name, t, r, busy, host = case
    table = gap_attribution(t, result=r)
    assert (np.diff(table["inclusive_idle_us"].to_numpy()) <= 0).all()
    assert ((table["share"] > 0) & (table["share"] <= 1 + 1e-12)).all()
    assert (table["self_idle_us"] <= table["inclusive_idle_us"] + 1e-6).all()
    by_frame = defaultdict(list)
    for i, f in enumerate(host["frame"]):
        by_frame[f].append(i)
    gaps = busy.gaps()
    gap_ends = [b for _, b in gaps]
    check = list(table["frame"].head(12)) + list(table["frame"].sample(min(12, len(table)), random_state=3))
    for f in check:
        row = table[table["frame"] == f].iloc[0]
        iv = [(host["ts"][i], host["end"][i]) for i in by_frame[f]]
        assert row["inclusive_idle_us"] == pytest.approx(busy.idle_under_union(iv), abs=1e-6)
        assert row["share"] == pytest.approx(busy.idle_under_union(iv) / busy.idle, rel=1e-9)
        spans = merge_clip(iv)
        hit = set()
        for s, e in spans:  # walk the gaps from the first one ending after s
            k = bisect.bisect_right(gap_ends, s)
            while k < len(gaps) and gaps[k][0] < e:
                if min(gaps[k][1], e) > max(gaps[k][0], s):
                    hit.add(k)
                k += 1
        hit = len(hit)
        assert row["gaps"] == hit, f
        inwin = sum(1 for s, e in iv if s < busy.t1 and (e > busy.t0 or s >= busy.t0))
        assert row["events"] == inwin


def test_recursive_frame_counts_its_outermost_occurrence_only():
    """owlv2 nests nn.Module._call_impl inside itself: summing its events' inclusive idle would count the same
    idle many times; the frame's inclusive idle is the idle under the union of its occurrences."""
    name = "tracelens_h100_owlv2"
    t = load_trace(trace_path(name))
    r = event_idle(t)
    table = gap_attribution(t, result=r).set_index("frame")
    tree = r.tree
    frame = [f for f in table.index if f.endswith("): _call_impl")][0]
    code = tree.frames.get_loc(frame)
    nodes = np.flatnonzero(tree.frame == code)
    ancestors_same = 0
    for n in nodes:
        p = tree.parent[n]
        while p >= 0:
            if tree.frame[p] == code:
                ancestors_same += 1
                break
            p = tree.parent[p]
    assert ancestors_same > 100  # it really recurses
    summed = float(r.inclusive_us[nodes].sum())
    busy = Busy(device_intervals(raw_events(name)))
    union = busy.idle_under_union(list(zip(tree.start_us[nodes], tree.end_us[nodes])))
    outer = [n for n in nodes if not _has_ancestor(tree, n, code)]
    assert table.loc[frame, "inclusive_idle_us"] == pytest.approx(union, abs=1e-6)
    assert union == pytest.approx(float(r.inclusive_us[outer].sum()), abs=1e-6)
    assert summed > 1.5 * union


def _has_ancestor(tree, n, code):
    p = tree.parent[n]
    while p >= 0:
        if tree.frame[p] == code:
            return True
        p = tree.parent[p]
    return False


def _innermost_by_brute_force(host, rows_by_thread, a, b):
    """Per frame: idle µs of gap [a, b] during which the frame was the innermost open event of a thread."""
    held = defaultdict(float)
    for rows in rows_by_thread.values():
        inside = [i for i in rows if host["ts"][i] < b and host["end"][i] > a]
        if not inside:
            continue
        cuts = sorted({a, b} | {x for i in inside for x in (host["ts"][i], host["end"][i]) if a < x < b})
        for lo, hi in zip(cuts, cuts[1:]):
            open_ = [i for i in inside if host["ts"][i] <= lo and host["end"][i] > lo]
            if open_:
                top = max(open_, key=lambda i: (host["ts"][i], -host["end"][i], i))
                held[host["frame"][top]] += hi - lo
    return held


def test_gap_table_largest_gaps_match_brute_force(case):
    _, t, r, busy, host = case
    table = gap_table(t, result=r)
    gaps = busy.gaps()
    assert len(table) == len(gaps)
    assert np.allclose(table["dur_us"].to_numpy(), [b - a for a, b in gaps])
    threads = _by_thread(host)
    for _, row in table.nlargest(4, "dur_us").iterrows():
        held = _innermost_by_brute_force(host, threads, row["start_us"], row["end_us"])
        if not held:
            assert row["frame"] == "" and row["frame_idle_us"] == 0
            continue
        best = max(held.values())
        assert row["frame_idle_us"] == pytest.approx(best, abs=1e-6)
        assert held[row["frame"]] == pytest.approx(best, abs=1e-6)


def test_probe_idle_story():
    """What the probe shows, recomputed by brute force: the Python root holds all the idle; the first round
    holds most of it (cuBLAS and kernel-module loading on first use); its first matmul is the largest gap."""
    t = load_trace(trace_path(PROBE))
    ev = raw_events(PROBE)
    busy = Busy(device_intervals(ev))
    table = gap_attribution(t, host_wait_only=False, exclude_parked=False).set_index("frame")
    x = [e for e in ev if e.get("ph") == "X"]

    def share(pred):
        return busy.idle_under_union([(e["ts"], e["ts"] + e["dur"]) for e in x if pred(e)]) / busy.idle

    assert table["share"].iloc[0] == pytest.approx(share(lambda e: e["name"] == "probe1.py(69): <module>"))
    assert table.index[0] == "probe1.py(69): <module>" and table["share"].iloc[0] > 0.999
    assert table.loc["round_0", "share"] == pytest.approx(share(lambda e: e["name"] == "round_0"))
    assert table.loc["round_0", "share"] > 0.85
    later_rounds = [table.loc[f"round_{i}", "share"] for i in range(1, 6)]
    assert max(later_rounds) < 0.05
    # the top ATen op by brute force is the top cpu_op in the table
    ops = {e["name"] for e in x if e.get("cat") == "cpu_op"}
    brute = {o: share(lambda e, o=o: e["name"] == o) for o in ops}
    top_ops = sorted(brute, key=brute.get, reverse=True)[:3]
    got = list(table[table["cat"] == "cpu_op"].index[:3])
    assert got == top_ops
    assert top_ops[0] == "aten::matmul"
    # graph launches: their inclusive idle is exactly the idle under them (they never overlap each other)
    launches = [(e["ts"], e["ts"] + e["dur"]) for e in x if e["name"] == "cudaGraphLaunch"]
    assert len(launches) == 42
    assert table.loc["cudaGraphLaunch", "inclusive_idle_us"] == pytest.approx(
        sum(busy.idle_between(a, b) for a, b in launches), abs=1e-6)
    assert table.loc["cudaGraphLaunch", "self_idle_us"] == pytest.approx(
        table.loc["cudaGraphLaunch", "inclusive_idle_us"], abs=1e-6)  # leaves on the host
    gt = gap_table(t)
    biggest = gt.loc[gt["dur_us"].idxmax()]
    mm = [e for e in x if e["name"] == "aten::mm"]
    first_mm = min(mm, key=lambda e: e["ts"])
    assert biggest["start_us"] <= first_mm["ts"] < biggest["end_us"]  # the first matmul sits in it
    assert biggest["frame"] == "aten::mm"


def test_unknown_device_raises():
    t = load_trace(trace_path(PROBE))
    with pytest.raises(TraceError, match="device 5"):
        event_idle(t, device=5)


def test_multi_rank_trace_keys_devices_by_rank_and_attributes_per_rank(tmp_path):
    """A directory of two per-rank files: each (rank, device) gets the numbers its own file gives alone, and a
    rank's idle is charged to its own host threads only."""
    import shutil

    from gaptrace.analyses.occupancy import occupancy

    a, b = PROBE, "tracelens_mi300x_sglang_qwen3_8b_decode"
    shutil.copy(trace_path(a), tmp_path / "trace_rank0.json.gz")
    shutil.copy(trace_path(b), tmp_path / "trace_rank1.json.gz")
    both = load_trace(str(tmp_path))
    occ = occupancy(both)
    assert list(zip(occ["rank"], occ["device"])) == [(0, 0), (1, 9)]
    for rank, name in [(0, a), (1, b)]:
        alone = load_trace(trace_path(name))
        one = occupancy(alone).iloc[0]
        row = occ[occ["rank"] == rank].iloc[0]
        assert row["busy_us"] == one["busy_us"] and row["window_us"] == one["window_us"]
        r = event_idle(both, device=(rank, int(row["device"])))
        assert (r.inclusive_us[~r.in_rank] == 0).all() and (r.self_us[~r.in_rank] == 0).all()
        got = gap_attribution(both, result=r)
        ref = gap_attribution(alone, host_wait_only=False, exclude_parked=False)
        assert got["frame"].tolist() == ref["frame"].tolist()
        assert np.allclose(got["inclusive_idle_us"], ref["inclusive_idle_us"])
        assert np.allclose(got["self_idle_us"], ref["self_idle_us"])
        assert got["gaps"].tolist() == ref["gaps"].tolist() and got["events"].tolist() == ref["events"].tolist()
