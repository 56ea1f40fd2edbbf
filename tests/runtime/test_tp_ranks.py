"""Tensor parallelism through real rank processes (runtime/tp.spawn_ranks: torch.multiprocessing spawn, gloo on the
CPU; DESIGN.md "Tensor parallelism"): every rank's environment keeps NVLink multicast off, and so does a process it
starts; a rank's one-line error reaches the caller; at temperature 0 ``--tp 2`` emits the ``--tp 1`` tokens in
float64, under both schedulers and in tree mode, through the API and the CLI; the late-rank fault's delay lands on
the last rank only, and the other waits for it in the verify's all-reduce; ``gaptrace capture --tp 2`` writes a
trace and a sidecar per rank that gaptrace's loader reads as one two-rank trace."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

from gaptrace.runtime.tp import RANK_ENV, RankError, spawn_ranks  # noqa: E402

from _runtime_models import random_prompts  # noqa: E402
from _tp_ranks import (LENGTHS, decode_configs, decode_rank, environment_rank, f64_pair, failing_rank,  # noqa: E402
                       late_rank_rank)

pytestmark = pytest.mark.slow
torch.set_num_threads(1)
CONFIGS = [{"scheduler": "sync"}, {"scheduler": "overlap"},
           {"scheduler": "overlap", "tree_budget": 6, "tree_topk": 3},
           {"scheduler": "sync", "tree_budget": 5, "tree_topk": 2}]


def test_ranks_keep_nvlink_multicast_off_and_so_do_their_children():
    out = spawn_ranks(environment_rank, 2)
    assert [o["rank"] for o in out] == [0, 1] and {o["world"] for o in out} == {2}
    for o in out:
        assert o["backend"] == "gloo"
        assert o["env"] == o["child_env"] == RANK_ENV == {"NCCL_NVLS_ENABLE": "0",
                                                          "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                                          "NVSHMEM_DISABLE_NVLS": "1"}
    assert not any(k in os.environ for k in RANK_ENV) or os.environ.get("NCCL_NVLS_ENABLE") == "0"


def test_a_rank_error_is_one_line_and_stops_the_others():
    t0 = time.perf_counter()
    with pytest.raises(RankError, match=r"^rank 1 refuses$"):
        spawn_ranks(failing_rank, 2, args=(1,))
    assert time.perf_counter() - t0 < 60


def test_tp2_emits_the_tp1_tokens_in_float64():
    """Both schedulers, chain and tree: tokens, per-round accept lengths and round count, 7 prompts through 3 slots
    (admission into freed slots), a window shorter than the sequences; every rank the same."""
    target, draft = f64_pair()
    want = decode_configs(target, draft, CONFIGS)
    got = spawn_ranks(decode_rank, 2, args=(CONFIGS,))
    assert got[0] == got[1]
    for kw, g, w in zip(CONFIGS, got[0], want):
        assert g == w, kw
        assert w["rounds"] > 5 and max(map(len, w["tokens"])) == 24
    tau = [sum(map(sum, w["round_tau"])) / sum(map(len, w["round_tau"])) for w in want]
    assert min(tau) > 1.2  # the near-copy draft gets tokens accepted: the multi-token paths ran


def _gaptrace(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "gaptrace.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_cli_decode_tp2_equals_tp1_float64_and_greedy():
    args = ("decode", "--preset", "tiny", "--dtype", "float64", "--prompt", "def fib(n):", "--prompt", "import os\n",
            "--max-new-tokens", "20", "--batch-size", "2", "--check-exact", "--json")
    runs = {tp: _gaptrace(*args, "--tp", str(tp)) for tp in (1, 2)}
    for tp, r in runs.items():
        assert r.returncode == 0, r.stderr
    one, two = (json.loads(runs[tp].stdout) for tp in (1, 2))
    assert [q["tokens"] for q in two["requests"]] == [q["tokens"] for q in one["requests"]]
    assert two["exact_match_rate"] == one["exact_match_rate"] == 1.0  # and both equal the target's greedy decoding
    assert (one["tensor_parallel"], two["tensor_parallel"], two["dtype"]) == (1, 2, "float64")
    assert two["tau"] == one["tau"] and two["rounds"] == one["rounds"]


def test_cli_tp_bad_input_is_one_line(tmp_path):
    r = _gaptrace("decode", "--preset", "tiny", "--tp", "2", "--prompt", "x", "--fault", "nope")
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "gaptrace: error: unknown fault 'nope' (known: lengths-copy, dd-gather, eager-commit-glue, jit-new-shape, "
        "token-list-rebuild, cpu-tree-build, late-rank)"]
    (tmp_path / "f").write_text("")
    r = _gaptrace("capture", "--preset", "tiny", "--tp", "2", "--prompt", "x", "-o", str(tmp_path / "f"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "this is a file" in r.stderr
    r = _gaptrace("decode", "--preset", "tiny", "--prompt", "x", "--fault", "late-rank")
    assert r.returncode == 2 and "needs --tp 2 or more" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_late_rank_delays_the_last_rank_and_the_other_waits_in_its_all_reduce():
    delay_ms = 60.0
    out = spawn_ranks(late_rank_rank, 2, args=(delay_ms,))
    r0, r1 = out
    rounds = r0["rounds"]
    assert r1["rounds"] == rounds > 5 and r0["tokens"] == r1["tokens"]
    # the delay is the last rank's: one late_rank range a round, each ~delay long
    assert r1["count"]["late_rank"] == rounds and "late_rank" not in r0["count"]
    assert rounds * delay_ms / 1e3 <= r1["range_s"]["late_rank"] < rounds * (delay_ms / 1e3 + 0.05)
    # rank 0 waits for it in the verify's first all-reduce (the draft is replicated: no collective before it)
    extra_wait_s = r0["range_s"]["verify"] - r1["range_s"]["verify"]
    assert extra_wait_s > 0.6 * rounds * delay_ms / 1e3
    assert r0["range_s"]["draft"] < r1["range_s"]["draft"] + 0.3 * rounds * delay_ms / 1e3
    # no token changes: the same as one process without the fault
    target, draft = f64_pair()
    from gaptrace.runtime.config import RuntimeConfig
    from gaptrace.runtime.engine import Engine
    rc = RuntimeConfig(block_size=4, page_size=4, window=16, batch_size=3, max_seq_len=128, prefill_chunk=16)
    reqs, _ = Engine(target, draft, rc).generate(random_prompts(LENGTHS[:3]), 16)
    assert r0["tokens"] == [r.output for r in reqs]


def _events(path):
    with gzip.open(path, "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def _inside_us(evs, outer, inner_cat, inner_prefix):
    """Total µs of ``inner_cat`` events named ``inner_prefix``* that lie inside a user_annotation range ``outer``
    (any thread: gloo runs the collective on its own worker thread while the caller waits)."""
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in evs if e.get("cat") == "user_annotation" and e["name"] == outer]
    return sum(e["dur"] for e in evs if e.get("cat") == inner_cat and e["name"].startswith(inner_prefix)
               and any(a <= e["ts"] and e["ts"] + e["dur"] <= b for a, b in spans))


def test_capture_tp2_late_rank_writes_a_trace_per_rank(tmp_path):
    from gaptrace import load_trace
    from gaptrace.capture import read_sidecar

    out = tmp_path / "tiny_tp2_late"
    rounds, delay_ms = 4, 80
    r = _gaptrace("capture", "--preset", "tiny", "--tp", "2", "--fault", "late-rank", "--late-rank-ms",
                  str(delay_ms), "--prompt", "def fib(n):", "--prompt", "import os\n", "--batch-size", "2",
                  "--block-size", "4", "--warmup-rounds", "3", "--rounds", str(rounds), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "2 ranks" in r.stderr
    names = sorted(os.listdir(out))
    assert names == ["tiny_tp2_late.rank0.gaptrace.json", "tiny_tp2_late.rank0.json.gz",
                     "tiny_tp2_late.rank1.gaptrace.json", "tiny_tp2_late.rank1.json.gz"]
    sides = [read_sidecar(str(out / f"tiny_tp2_late.rank{k}.json.gz")) for k in (0, 1)]
    for k, side in enumerate(sides):
        assert (side["rank"], side["world_size"]) == (k, 2)
        assert side["config"]["tensor_parallel"] == 2 and side["config"]["faults"] == ["late-rank"]
        assert side["config"]["late_rank_ms"] == delay_ms and len(side["rounds"]) == rounds
    assert sides[0]["rounds"] == sides[1]["rounds"]  # the same accept decisions on both ranks
    evs = [_events(out / f"tiny_tp2_late.rank{k}.json.gz") for k in (0, 1)]
    late = [[e for e in ev if e.get("cat") == "user_annotation" and e["name"] == "late_rank"] for ev in evs]
    assert late[0] == [] and len(late[1]) >= rounds and all(e["dur"] >= delay_ms * 1e3 for e in late[1])
    # rank 0 waits inside gloo's all-reduce in its verify (a range gloo opens: gloo:all_reduce), once a round
    wait = [_inside_us(ev, "verify", "user_annotation", "gloo:all_reduce") for ev in evs]
    assert wait[0] - wait[1] > 0.6 * rounds * delay_ms * 1e3
    long0 = [e for e in evs[0] if e["name"] == "gloo:all_reduce" and e["dur"] >= 0.5 * delay_ms * 1e3]
    assert len(long0) >= rounds
    # a round's collectives are the verify's 2 x 8 all-reduces of the tiny target (after each layer's attention or
    # linear attention and after its MLP; none in the replicated draft), on both ranks; and the overlap round reads
    # nothing back from the device (no .item(), no data-dependent shape): the host plan stays sync-free
    for ev in evs:
        spans = [(e["ts"], e["ts"] + e["dur"]) for e in ev
                 if e.get("cat") == "user_annotation" and e["name"] == "round"]
        ops = [e["name"] for e in ev if e.get("cat") == "cpu_op" and any(a <= e["ts"] <= b for a, b in spans)]
        assert ops.count("c10d::allreduce_") == 2 * 8 * rounds
        assert not {"aten::item", "aten::_local_scalar_dense", "aten::masked_select", "aten::nonzero"} & set(ops)
    # gaptrace's loader reads the directory as one trace of two ranks; its rows are the raw files' events
    trace = load_trace(str(out))
    host = trace.host
    assert sorted(host["rank"].unique().tolist()) == [0, 1]
    for k in (0, 1):
        rows = host[(host["rank"] == k) & (host["cat"] == "user_annotation")]
        assert (rows["name"].astype(str) == "late_rank").sum() == len(late[k])
        raw_rounds = sum(e["name"] == "round" for e in evs[k] if e.get("cat") == "user_annotation")
        assert (rows["name"].astype(str) == "round").sum() == raw_rounds == rounds
    late_rows = host[(host["rank"] == 1) & (host["name"].astype(str) == "late_rank")]
    assert sorted(late_rows["dur_us"].round(3).tolist()) == sorted(round(float(e["dur"]), 3) for e in late[1])
