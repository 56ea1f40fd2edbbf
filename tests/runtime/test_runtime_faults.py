"""The pathology switches (runtime/faults.py): each fault leaves every generated token unchanged, and each
one's range is in a CPU profiler trace of a short capture, with the host sync inside it where it is one
(lengths-copy: aten::to; dd-gather: aten::item and aten::masked_select). Trace checks read the raw Kineto JSON."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from gaptrace.runtime.config import FAULT_NAMES, TP_FAULTS, TREE_FAULTS, ConfigError, RuntimeConfig  # noqa: E402
from gaptrace.runtime.engine import Engine  # noqa: E402
from gaptrace.runtime.faults import function_name  # noqa: E402

from _runtime_models import hybrid_target, near_copy, random_prompts  # noqa: E402

torch.set_num_threads(1)
LENGTHS = (5, 23, 40, 1, 31, 17, 9)
SYNC_OPS = {"lengths-copy": {"aten::to"}, "dd-gather": {"aten::item", "aten::masked_select"}}
# cpu-tree-build: test_runtime_tree.py; late-rank (tensor parallel): test_tp_ranks.py
CHAIN_FAULTS = tuple(f for f in FAULT_NAMES if f not in TREE_FAULTS + TP_FAULTS)


@pytest.fixture(scope="module")
def pair():
    """A tiny hybrid target and a hybrid near-copy draft (both commit linear states: the glue runs for both)."""
    target = hybrid_target()
    draft = near_copy(target, 0.3)
    prompts = random_prompts(LENGTHS)
    return target, draft, prompts


def _decode(pair, faults=(), bs=3, B=4):
    target, draft, prompts = pair
    rc = RuntimeConfig(block_size=B, page_size=4, window=16, batch_size=bs, max_seq_len=128, prefill_chunk=16,
                       faults=faults)
    reqs, stats = Engine(target, draft, rc).generate(prompts, 30)
    return [r.output for r in reqs], stats.round_tau, stats.rounds


@pytest.fixture(scope="module")
def clean(pair):
    out = _decode(pair)
    assert out[2] > 10 and max(len(t) for t in out[0]) == 30
    return out


@pytest.mark.parametrize("faults", [(f,) for f in CHAIN_FAULTS] + [CHAIN_FAULTS])
def test_fault_leaves_tokens_unchanged(pair, clean, faults):
    """7 prompts in 3 slots (admission, retirement, buckets 3 -> 2 -> 1), a window of 4 pages that slides."""
    assert _decode(pair, faults) == clean  # tokens, per-round accept lengths, round count


def test_fault_config_errors():
    with pytest.raises(ConfigError, match="unknown fault 'nope'"):
        RuntimeConfig(faults=("nope",))
    with pytest.raises(ConfigError, match="needs --scheduler overlap"):
        RuntimeConfig(scheduler="sync", faults=("lengths-copy",))
    assert RuntimeConfig(faults=("dd-gather", "dd-gather")).faults == ("dd-gather",)
    # jit-new-shape is a round in a new batch bucket: the fault keeps the per-power-of-two buckets (one bucket by
    # default, where no round could change shape)
    assert RuntimeConfig(faults=("jit-new-shape",)).graph_bucket_mode == "pow2"
    assert RuntimeConfig(faults=("dd-gather",)).graph_bucket_mode == "max"
    with pytest.raises(ConfigError, match="needs --graph-buckets pow2, not max"):  # not silently overridden
        RuntimeConfig(faults=("jit-new-shape",), graph_buckets="max")


def _events(path):
    with gzip.open(path, "rt") as f:
        evs = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    return evs


def _inside(evs, outer_name, cat="cpu_op"):
    """{name: count} of ``cat`` events that lie inside a user_annotation ``outer_name`` on the same thread."""
    outers = [e for e in evs if e.get("cat") == "user_annotation" and e["name"] == outer_name]
    out: dict = {}
    for e in evs:
        if e.get("cat") != cat:
            continue
        for o in outers:
            if o["tid"] == e["tid"] and o["ts"] <= e["ts"] and e["ts"] + e["dur"] <= o["ts"] + o["dur"]:
                out[e["name"]] = out.get(e["name"], 0) + 1
                break
    return outers, out


@pytest.fixture(scope="module")
def capture_all(tmp_path_factory):
    """One CPU capture with every fault on, the batch cut in half after round 5 (profiled rounds: 5 .. 8)."""
    out = tmp_path_factory.mktemp("faults") / "all.json.gz"
    cmd = [sys.executable, "-m", "gaptrace.cli", "capture", "--preset", "tiny", "--prompt", "def fib(n):",
           "--prompt", "import os\n", "--batch-size", "3", "--block-size", "4", "--warmup-rounds", "3",
           "--rounds", "4", "--shrink-at-round", "5", "-o", str(out)]
    for f in CHAIN_FAULTS:
        cmd += ["--fault", f]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out


def test_token_list_rebuild_runs_per_prefill_chunk(pair, monkeypatch):
    """token-list-rebuild feeds every prefill chunk [a, b) from the whole rebuilt token list (per chunk,
    O(context) each), inside its own range; the chunk ids equal the prompt's."""
    import gaptrace.runtime.faults as mr
    from torch.profiler import ProfilerActivity, profile

    calls = []
    real = mr.token_list_rebuild

    def spy(runner, request, a, b):
        out = real(runner, request, a, b)
        assert out.tolist() == request.prompt[a:b]
        calls.append((request.rid, a, b))
        return out

    monkeypatch.setattr(mr, "token_list_rebuild", spy)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _decode(pair, ("token-list-rebuild",))
    chunks = [(i, a, min(a + 16, n)) for i, n in enumerate(LENGTHS) for a in range(0, n, 16)]
    assert sorted(calls) == chunks  # every chunk of every prompt, none twice (prefill_chunk 16)
    names = [e.name for e in prof.events() if e.name == "token_list_rebuild"]
    assert len(names) == len(chunks)


@pytest.mark.parametrize("fault", [f for f in CHAIN_FAULTS if f != "token-list-rebuild"])
def test_fault_range_in_trace(capture_all, fault):
    evs = _events(capture_all)
    rounds = [e for e in evs if e.get("cat") == "user_annotation" and e["name"] == "round"]
    assert len(rounds) == 4
    outers, ops = _inside(evs, function_name(fault))
    assert len(outers) >= 4  # once per profiled round (token-list-rebuild runs per prefill chunk: test above)
    # the range sits in the Python frame of the fault's function (with_stack): the trace names the function too
    name = function_name(fault)
    frames = [e for e in evs if e.get("cat") == "python_function" and "faults.py" in e["name"]
              and e["name"].endswith(f": {name}")]
    assert all(any(f["tid"] == o["tid"] and f["ts"] <= o["ts"] and o["ts"] + o["dur"] <= f["ts"] + f["dur"]
                   for f in frames) for o in outers), name
    assert SYNC_OPS.get(fault, set()) <= set(ops), (fault, sorted(ops))
    if fault == "lengths-copy":
        assert ops["aten::to"] >= len(outers)  # one blocking copy per range
    if fault == "dd-gather":
        assert ops["aten::item"] >= len(outers) and ops["aten::masked_select"] >= len(outers)


def test_eager_glue_ops_per_layer(capture_all):
    """Per range: 2 contiguous copies + 2 fp32 weight copies + 1 arange per linear layer of the target (tiny: 6)."""
    evs = _events(capture_all)
    outers = [e for e in evs if e.get("cat") == "user_annotation" and e["name"] == "eager_commit_glue"]
    assert len(outers) >= 4
    n_linear = 6
    for o in outers:  # the top-level aten ops of one range (an op called by another op is not counted)
        ops = [e for e in evs if e.get("cat") == "cpu_op" and e["tid"] == o["tid"] and o["ts"] <= e["ts"]
               and e["ts"] + e["dur"] <= o["ts"] + o["dur"]]
        top = [e for e in ops if not any(p is not e and p["ts"] <= e["ts"] and e["ts"] + e["dur"] <= p["ts"] + p["dur"]
                                         and (p["ts"], -p["dur"]) < (e["ts"], -e["dur"]) for p in ops)]
        names = [e["name"] for e in top]
        assert names.count("aten::contiguous") == 2 * n_linear
        assert names.count("aten::to") == 2 * n_linear  # A_log and dt_bias to float32, copied
        assert names.count("aten::arange") == n_linear


def test_shrink_at_round(capture_all):
    side = json.loads(capture_all.with_name("all.gaptrace.json").read_text())
    assert side["config"]["faults"] == list(CHAIN_FAULTS) and side["config"]["shrink_at_round"] == 5
    assert side["config"]["prefill_chunk"] > 0  # the chunk the per-chunk faults ran at (token-list-rebuild)
    # round 5's results finish the cut request; round 6 still carries it (void), round 7 runs in bucket 2
    assert [len(x["accepted"]) for x in side["rounds"]] == [3, 2, 2, 2]


def test_unknown_fault_exits_2(tmp_path):
    for cmd in (["decode", "--prompt", "x"], ["capture", "--prompt", "x", "-o", str(tmp_path / "t.json.gz")]):
        r = subprocess.run([sys.executable, "-m", "gaptrace.cli", *cmd, "--fault", "nope"], capture_output=True,
                           text=True)
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "unknown fault 'nope'" in lines[0]


KERNEL_CHECK = """
import torch
from gaptrace.runtime.window_len_triton import next_power_of_2, window_len_kernel
from gaptrace.runtime.cache.window import compact_len
g = torch.Generator().manual_seed(0)
for dt in (torch.int32, torch.int64):
    for nb in (1, 2, 3, 4, 8, 12):
        lengths = torch.randint(0, 3000, (13,), generator=g).to(dt)
        rows = torch.randint(0, 13, (nb,), generator=g)
        out = torch.full((nb,), -7, dtype=torch.long)
        window_len_kernel[(1,)](lengths, rows, out, nb, 1024, 64, BLOCK=next_power_of_2(nb))
        assert torch.equal(out, compact_len(lengths[rows].long(), 1024, 64)), (dt, nb, out)
print("ok")
"""


def test_window_len_kernel_in_triton_interpreter():
    """The jit-new-shape Triton kernel against compact_len, run by Triton's CPU interpreter (skipped without
    Triton, e.g. on CPU machines)."""
    import importlib.util
    import os

    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton not installed")
    r = subprocess.run([sys.executable, "-c", KERNEL_CHECK], capture_output=True, text=True,
                       env={**os.environ, "TRITON_INTERPRET": "1"})
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
