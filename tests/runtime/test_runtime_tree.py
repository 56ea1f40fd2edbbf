"""Draft trees (DDTree): the two builders build the same trees (random inputs, exact ties); a tree is the
N - 1 best rank paths (brute force); the linear-attention tree recurrence equals the chain recurrence along each
node's ancestor path, bit for bit; tree decoding is exact at temperature 0 against the target's own greedy
decoding (random hybrid pair and the shipped tiny pair, both builders, both schedulers); a top-1 tree of N = B
nodes IS the chain (same tokens, same tau every round); after each tree round the caches (target KV compacted,
target linear state, draft KV and linear state re-fed) equal a fresh prefill of the committed sequence; config
errors; and the H200 driver script's CPU smoke run, whose cpu-heapq capture holds the ``cpu_tree_build`` range
with the host copy and the heapq frames inside it."""
from __future__ import annotations

import gzip
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gaptrace.runtime.config import ConfigError, RuntimeConfig  # noqa: E402
from gaptrace.runtime.engine import Engine  # noqa: E402
from gaptrace.runtime.models.gdn import gated_delta_rule_ref, gated_delta_rule_tree  # noqa: E402
from gaptrace.runtime.engine.sequence import Request  # noqa: E402
from gaptrace.runtime.spec.reference import greedy_reference  # noqa: E402
from gaptrace.runtime.spec.tree import Tree, build_tree_heapq, build_tree_torch  # noqa: E402

from _runtime_models import greedy_setup, near_copy  # noqa: E402

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[2]
MAX_NEW, CHUNK = 24, 16
LENGTHS = (5, 23, 40, 1, 31)


# ------------------------------------------------------------------------------------------------ builders
def _random_topk(rng, nb, D, k, ties: bool):
    if ties:  # a handful of values: exact ties within a depth and between paths
        lp = rng.choice(np.log(np.array([1.0, 0.5, 0.25, 0.125], np.float32)), size=(nb, D, k))
    else:
        lp = np.log(rng.dirichlet(np.ones(k), size=(nb, D)))
    return -np.sort(-lp.astype(np.float32), axis=-1), rng.integers(0, 50, size=(nb, D, k))


@pytest.mark.parametrize("ties", [False, True])
def test_builders_identical(ties):
    rng = np.random.default_rng(3 + ties)
    n_padded = 0
    for _ in range(120):
        nb, D, k, N = (int(rng.integers(*r)) for r in ((1, 5), (0, 6), (1, 5), (1, 20)))
        lp, ids = _random_topk(rng, nb, D, k, ties)
        dev = build_tree_torch(torch.from_numpy(lp), torch.from_numpy(ids), N)
        for b in range(nb):
            host = build_tree_heapq(lp[b], ids[b], N)
            for f in Tree.FIELDS:
                assert np.array_equal(getattr(dev, f)[b].numpy(), host[f]), (f, b, lp[b], N)
            n_padded += int(not host["exists"].all())
    assert n_padded > 10  # budgets past the whole top-k lattice (padding nodes) were exercised


def _rank_path(tree: dict, t: int, ids: np.ndarray) -> tuple:
    """Node t's path as ranks (ids[d, r] = r * 1000 + d in the test below)."""
    out = []
    while t > 0:
        out.append(int(tree["tokens"][t]) // 1000)
        t = int(tree["parent"][t])
    return tuple(reversed(out))


def test_tree_is_the_best_paths():
    """Without ties, a tree of budget N holds exactly the N - 1 rank paths of highest score (brute force over the
    whole top-k lattice, scores summed in float32 along each path in the same order)."""
    rng = np.random.default_rng(11)
    for _ in range(40):
        D, k, N = int(rng.integers(1, 5)), int(rng.integers(1, 4)), int(rng.integers(2, 30))
        lp = _random_topk(rng, 1, D, k, ties=False)[0][0]
        ids = np.array([[r * 1000 + d for r in range(k)] for d in range(D)])
        scores = {}
        for depth in range(1, D + 1):
            for path in itertools.product(range(k), repeat=depth):
                s = np.float32(0)
                for d, r in enumerate(path):
                    s = np.float32(s + lp[d, r])
                scores[path] = s
        best = sorted(scores, key=lambda p: -scores[p])[: N - 1]
        tree = build_tree_heapq(lp, ids, N)
        got = {_rank_path(tree, t, ids) for t in range(1, N) if tree["exists"][t]}
        assert got == set(best)
        for t in range(1, N):  # a node's score is its path's, its depth the path length, parents come first
            if tree["exists"][t]:
                p = _rank_path(tree, t, ids)
                assert tree["score"][t] == scores[p] and tree["depth"][t] == len(p) and tree["parent"][t] < t
                assert tree["anc"][t].sum() == len(p) + 1  # itself, its ancestors, the root


def test_gdn_tree_recurrence_equals_chain_along_each_path():
    g = torch.Generator().manual_seed(0)
    bs, T, H, dk, dv = 2, 7, 3, 4, 5
    q, k = torch.randn(bs, T, H, dk, generator=g), torch.randn(bs, T, H, dk, generator=g)
    v = torch.randn(bs, T, H, dv, generator=g)
    gate, beta = -torch.rand(bs, T, H, generator=g), torch.rand(bs, T, H, generator=g)
    s0 = torch.randn(bs, H, dk, dv, generator=g)
    parents = torch.tensor([[-1, 0, 0, 1, 2, 3, 1], [-1, 0, 1, 2, 0, 4, -1]])
    o, states = gated_delta_rule_tree(q, k, v, gate, beta, parents, s0)
    for b in range(bs):
        for t in range(T):
            path, a = [], t
            while a >= 0:
                path.append(a)
                a = int(parents[b, a])
            path = path[::-1]
            sel = lambda x: x[b:b + 1, path]  # noqa: E731
            o_ref, s_ref = gated_delta_rule_ref(sel(q), sel(k), sel(v), sel(gate), sel(beta), s0[b:b + 1])
            assert torch.equal(o[b, t], o_ref[0, -1]) and torch.equal(states[b, t], s_ref[0])


# ------------------------------------------------------------------------------------------------ decoding
@pytest.fixture(scope="module")
def pair():
    """A random hybrid target (linear + full attention), a hybrid near-copy draft, prompts, greedy references."""
    target, prompts, eos, refs = greedy_setup(LENGTHS, MAX_NEW, CHUNK, eos_at=9)
    return target, near_copy(target, 0.3), prompts, refs, eos


def _decode(pair, **kw):
    target, draft, prompts, _, eos = pair
    rc = RuntimeConfig(**{"block_size": 4, "page_size": 4, "window": 16, "batch_size": 3, "max_seq_len": 128,
                          "prefill_chunk": CHUNK, **kw})
    reqs, stats = Engine(target, draft, rc, eos).generate(prompts, MAX_NEW)
    return [r.output for r in reqs], stats


@pytest.mark.parametrize("kw, both", [
    (dict(tree_budget=6, tree_topk=3), True),
    (dict(tree_budget=12, tree_topk=4, block_size=5, batch_size=2), False),
    (dict(tree_budget=5, tree_topk=2, scheduler="sync", batch_size=1), True),
    (dict(tree_budget=3, tree_topk=2, block_size=1), False),           # depth 0: root only, the rest padding
    (dict(tree_budget=7, tree_topk=3, faults=("eager-commit-glue", "dd-gather")), False),
], ids=["N6k3", "N12k4B5", "sync-bs1", "B1", "faults"])
def test_tree_exact(pair, kw, both):
    """Tree decoding == the target's greedy decoding (W = 16 < the sequences: the window slides; EOS stops one
    request; 5 prompts in fewer slots: admission into freed slots); with ``both``, the cpu-heapq builder gives the
    same tokens, per-round accept lengths and round count as the gpu builder."""
    outs, stats = _decode(pair, **kw)
    assert outs == pair[3]
    assert 1.0 <= stats.tau <= kw.get("block_size", 4)
    if both:
        cpu_outs, cpu = _decode(pair, tree_builder="cpu-heapq", **kw)
        assert (cpu_outs, cpu.round_tau, cpu.rounds) == (outs, stats.round_tau, stats.rounds)


def test_top1_tree_is_the_chain(pair):
    """k = 1, N = B: the tree is the draft's chain, so tokens and every round's tau equal chain decoding."""
    c_out, c = _decode(pair, block_size=5)
    t_out, t = _decode(pair, block_size=5, tree_budget=5, tree_topk=1)
    assert c_out == t_out == pair[3]
    assert c.round_tau == t.round_tau and c.rounds == t.rounds
    assert c.tau > 1.1  # drafted tokens were accepted: the multi-token path ran


def test_caches_after_tree_rounds_equal_a_prefill(pair):
    """After every tree round, slot 0's committed state equals a fresh prefill of the same sequence into slot 1:
    target KV (compacted from tree slots), target linear states (the last accepted node's), draft KV and draft
    linear state (re-fed). Rounds where the accepted path left the draft's own greedy chain must occur."""
    target, draft, prompts, _, _ = pair
    rc = RuntimeConfig(block_size=4, page_size=4, window=128, batch_size=2, max_seq_len=256, prefill_chunk=CHUNK,
                       tree_budget=8, tree_topk=4)
    eng = Engine(target, draft, rc)
    run, st = eng.runner, eng.runner.state
    prompt = prompts[4]  # 31 tokens, a varied continuation; the sequence stays inside W = 128 (prefill reads no window)
    req = Request(0, list(prompt), 100, None, slot=0, committed_len=len(prompt))
    run.blocks.ensure(0, len(prompt) + rc.round_span)
    run.upload_page_tables()
    seq = list(prompt) + [int(run.prefill(0, prompt)[0])]
    deviated = 0
    with torch.no_grad():
        for i in range(24):
            plan = eng.plan_round(i, {0: req})
            chain = run.run_draft(plan.nb)[0][0].clone()
            data = eng.strategy.run_round(plan).readback().get()
            tau = int(data["tau"][0])
            tree = eng.strategy.trees[plan.nb]
            node_tokens = [int(tree.tokens[0, t]) for t in range(rc.tree_budget)]
            accepted = [int(x) for x in data["pred"][0, :tau]]
            deviated += any(tok != int(chain[j]) for j, tok in enumerate(accepted[:-1]))
            assert all(tok in node_tokens for tok in accepted[:-1])
            seq += accepted
            req.committed_len += tau
            L = req.committed_len
            assert int(st.lengths[0]) == L and int(st.last_tok[0]) == seq[-1]
            run.blocks.ensure(1, L + rc.round_span)
            run.upload_page_tables()
            run.prefill(1, seq[:L])
            m0, m1 = st.token_map(torch.tensor([0]))[0, :L], st.token_map(torch.tensor([1]))[0, :L]
            for pool in (*st.tgt_k, *st.tgt_v, *st.drf_k, *st.drf_v):
                torch.testing.assert_close(pool[m0], pool[m1], rtol=1e-4, atol=1e-4)
            for lin in (st.tgt_lin, st.drf_lin):
                torch.testing.assert_close(lin.pool[:, 0], lin.pool[:, 1], rtol=1e-4, atol=1e-4)
            st.lengths[1] = 0
            if deviated >= 2 and i >= 5:
                break
    assert deviated >= 2


def test_shipped_tiny_pair_tree_exact():
    """The shipped tiny pair (hybrid target: 6 gated-delta-rule + 2 full-attention layers): tree decoding at the
    chain's verify width, both builders, equals the target's greedy decoding; and tau(tree) >= tau(chain)."""
    from gaptrace.runtime.session import build_setup, encode_prompts

    texts = [json.loads(line)["prompt"] for line in (REPO / "fixtures/prompts/heldout.jsonl").read_text().splitlines()
             if line.strip()][:3]
    s = build_setup("tiny", block_size=6, batch_size=3, max_seq_len=512)
    ids = encode_prompts(s, texts, 16)
    refs = [greedy_reference(s.target, p, 16, s.eos_token_id, s.rcfg.prefill_chunk, "cpu").tokens for p in ids]
    taus = {}
    for kw in (dict(), dict(tree_budget=6, tree_topk=3), dict(tree_budget=6, tree_topk=3, tree_builder="cpu-heapq")):
        reqs, stats = Engine(s.target, s.draft, s.rcfg.replace(**kw), s.eos_token_id).generate(ids, 16)
        assert [r.output for r in reqs] == refs, kw
        taus[kw.get("tree_builder", "gpu") if kw else "chain"] = stats.round_tau
    assert taus["gpu"] == taus["cpu-heapq"]
    mean = lambda rt: sum(map(sum, rt)) / sum(map(len, rt))  # noqa: E731
    assert mean(taus["gpu"]) >= mean(taus["chain"])


# ------------------------------------------------------------------------------------------------ config, CLI
def test_tree_config_errors():
    with pytest.raises(ConfigError, match="needs tree mode"):
        RuntimeConfig(faults=("cpu-tree-build",))
    with pytest.raises(ConfigError, match="needs tree mode"):
        RuntimeConfig(tree_builder="cpu-heapq")
    with pytest.raises(ConfigError, match="unknown tree builder 'fast'"):
        RuntimeConfig(tree_budget=4, tree_builder="fast")
    with pytest.raises(ConfigError, match="top-k must be >= 1"):
        RuntimeConfig(tree_budget=4, tree_topk=0)
    with pytest.raises(ConfigError, match="tree budget must be"):
        RuntimeConfig(tree_budget=-1)
    with pytest.raises(ConfigError, match="needs real acceptance"):
        RuntimeConfig(tree_budget=4, sim_accept_rate=0.5)
    rc = RuntimeConfig(tree_budget=4, tree_builder="cpu-heapq")
    assert rc.faults == ("cpu-tree-build",) and rc.cpu_tree_build
    assert RuntimeConfig(tree_budget=4, faults=("cpu-tree-build",)).tree_builder == "cpu-heapq"
    assert RuntimeConfig(block_size=8, tree_budget=12).round_span == 12
    assert RuntimeConfig(block_size=8).verify_width == 8 and RuntimeConfig(tree_budget=5).verify_width == 5


# ------------------------------------------------------------------------------------------------ H200 driver
@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """The driver's CPU smoke mode, two of its steps (the gpu-builder tree decode, the cpu-heapq capture at bs 1;
    every step is a decode or a capture with these options) and the table; the others are reported missing."""
    out = tmp_path_factory.mktemp("tree_smoke")
    env = {**os.environ, "SMOKE": "1", "PYTHON": sys.executable,
           "STEPS": "decode_tree_gpu_N4 h200_tiny_tree_cpu-heapq_bs1"}
    r = subprocess.run(["bash", "maintainer/gpu/tree_h200.sh", str(out), "cpu"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return out, r.stdout


def test_driver_smoke(smoke):
    out, stdout = smoke
    for name in ("decode_tree_gpu_N4", "h200_tiny_tree_cpu-heapq_bs1"):
        assert f"{name}: rc=0" in stdout, stdout
    assert "decode_chain_B4: rc" not in stdout and "h200_tiny_tree_gpu_bs1: rc" not in stdout  # not asked for
    table = json.loads((out / "tree_h200_table.json").read_text())
    dec = {r["run"]: r for r in table["decode"]}
    assert dec["chain"]["error"] == dec["tree cpu-heapq"]["error"] == "missing"  # not run: a row, not a crash
    tree = dec["tree gpu"]
    raw = json.loads((out / "decode_tree_gpu_N4.json").read_text())
    assert tree["tau"] == raw["tau"] and tree["exact_match_rate"] == 1.0 == raw["exact_match_rate"]
    assert raw["verify_width"] == tree["verify_width"] == 4 and raw["tree_budget"] == 4 and raw["block_size"] == 4
    assert tree["builder"] == raw["tree_builder"] == "gpu" and raw["faults"] == []
    (cap,) = table["captures"]
    side = json.loads((out / "h200_tiny_tree_cpu-heapq_bs1.gaptrace.json").read_text())
    assert cap["tau"] == pytest.approx(np.mean([r["tau"] for r in side["rounds"]]))
    assert side["config"]["tree_builder"] == "cpu-heapq" and side["config"]["faults"] == ["cpu-tree-build"]
    assert (out / "tree_h200_table.txt").read_text() in stdout


def test_cpu_tree_build_range_in_capture(smoke):
    """In the cpu-heapq capture, every profiled round has one ``tree`` range holding one ``cpu_tree_build``
    range, inside which are the blocking host copies (aten::to) and one build_tree_heapq frame per request."""
    out, _ = smoke
    with gzip.open(out / "h200_tiny_tree_cpu-heapq_bs1.json.gz", "rt") as f:
        evs = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]

    def within(outer, cat=None, name=None):
        return [e for e in evs if e is not outer and e["tid"] == outer["tid"] and outer["ts"] <= e["ts"]
                and e["ts"] + e["dur"] <= outer["ts"] + outer["dur"] and (cat is None or e.get("cat") == cat)
                and (name is None or e["name"] == name or (cat == "python_function" and name in e["name"]))]

    rounds = [e for e in evs if e.get("cat") == "user_annotation" and e["name"] == "round"]
    assert len(rounds) == 2
    for rd in rounds:
        (tree,) = within(rd, "user_annotation", "tree")
        (build,) = within(tree, "user_annotation", "cpu_tree_build")
        assert len(within(build, "cpu_op", "aten::to")) >= 2
        assert len(within(build, "python_function", ": build_tree_heapq")) == 1  # bs 1: one request
        assert within(build, "python_function", "built-in function heappop")
        assert not within(rd, "user_annotation", "gpu_tree_build")


def test_builders_check_script():
    """tests/_tree_builders.py (the builder check tests/runtime/test_gpu.py runs on CUDA), run here on the CPU."""
    from _tree_builders import check_builders

    compared, differ = check_builders("cpu", 30)
    assert compared > 60 and differ == 0


def test_table_script_on_fabricated_outputs(tmp_path):
    """maintainer/gpu/tree_h200_table.py: the tree/chain tau ratio, the builders' token comparison, a broken file."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("tree_h200_table", REPO / "maintainer/gpu/tree_h200_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    req = lambda toks: {"tokens": toks}  # noqa: E731
    base = {"batch_size": 8, "verify_width": 8, "tokens_per_s": 100.0, "tpot_ms": 1.0, "exact_match_rate": 1.0,
            "rounds": 10}
    (tmp_path / "decode_chain_B8.json").write_text(json.dumps({**base, "tau": 2.0, "requests": [req([1, 2])]}))
    (tmp_path / "decode_tree_gpu_N8.json").write_text(json.dumps(
        {**base, "tau": 2.5, "tree_builder": "gpu", "requests": [req([1, 2])]}))
    (tmp_path / "decode_tree_cpu-heapq_N8.json").write_text(json.dumps(
        {**base, "tau": 2.5, "tree_builder": "cpu-heapq", "requests": [req([1, 3])]}))
    (tmp_path / "h200_tiny_tree_gpu_bs8.gaptrace.json").write_text("{not json")
    assert mod.main([str(tmp_path)]) == 0
    text = (tmp_path / "tree_h200_table.txt").read_text()
    assert "tau tree / tau chain = 1.250" in text and "tokens == gpu builder: NO" in text
    assert "h200_tiny_tree_gpu_bs8" in text and "unreadable" in text


@pytest.mark.parametrize("builder", ["cpu-heapq", "gpu"])
def test_graph_warmup_on_the_initial_trees_keeps_the_decode_exact(pair, builder):
    """On CUDA the verify and commit graphs are warmed up and captured with every row on the scratch slot, reading
    each bucket's initial tree (the cpu-heapq builder has no tree graph that fills it first). The same calls here
    on the CPU, before decoding: every cache stays finite and the decode after them stays exact (initial trees of
    all-zero ancestors once put NaN into the scratch slot's pages and the decode ended after one round on the H200)."""
    target, draft, prompts, refs, eos = pair
    rc = RuntimeConfig(block_size=4, page_size=4, window=16, batch_size=3, max_seq_len=128, prefill_chunk=CHUNK,
                       tree_budget=6, tree_topk=3, tree_builder=builder)
    eng = Engine(target, draft, rc, eos)
    run, st = eng.runner, eng.runner.state
    with torch.no_grad():
        for nb in run.buckets:
            pred, states = eng.strategy.verify(nb)
            eng.strategy.accept_commit(nb, pred, states)
    for name in ("tgt_k", "tgt_v", "drf_k", "drf_v"):
        assert all(torch.isfinite(t).all() for t in getattr(st, name)), name
    assert torch.isfinite(st.tgt_lin.pool).all() and torch.isfinite(st.drf_lin.pool).all()
    reqs, _ = eng.generate(prompts, MAX_NEW)
    assert [r.output for r in reqs] == refs


@pytest.mark.parametrize("args, message", [
    (["--tree-topk", "4"], "--tree-topk / --tree-builder need tree mode"),
    (["--tree-builder", "gpu"], "--tree-topk / --tree-builder need tree mode"),
    (["--tree-budget", "4", "--tree-builder", "gpu", "--fault", "cpu-tree-build"], "contradicts --fault cpu-tree-build"),
])
def test_tree_options_that_would_be_ignored_are_refused(args, message):
    r = subprocess.run([sys.executable, "-m", "gaptrace.cli", "decode", "--preset", "tiny", "--prompt", "def f(",
                        "--max-new-tokens", "4", *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
