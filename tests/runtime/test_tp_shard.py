"""Tensor parallelism in one process (runtime/tp; DESIGN.md "Tensor parallelism"): each rank's slice of the target
is the right rows / columns of the full weights (recomputed here by index), the ranks' partial sums add up to the
whole model (two ranks as two threads whose all-reduce sums their tensors), an engine per rank emits the one-process
tokens, the late-rank fault sleeps on the last rank only, and the per-rank capture names. The spawned processes
(gloo, the CLI, captures) are test_tp_ranks.py's (slow)."""
from __future__ import annotations

import os
import re

import pytest

torch = pytest.importorskip("torch")

from gaptrace.runtime.annotate import record_host_ranges  # noqa: E402
from gaptrace.runtime.capture_run import rank_trace_paths  # noqa: E402
from gaptrace.runtime.config import ConfigError, ModelConfig, RuntimeConfig  # noqa: E402
from gaptrace.runtime.engine import Engine  # noqa: E402
from gaptrace.runtime.faults import Faults, late_rank  # noqa: E402
from gaptrace.runtime.presets import bench_target_config, tiny_draft_config, tiny_target_config  # noqa: E402
from gaptrace.runtime.tp import RowParallelLinear, TPGroup, shard_config, shard_target  # noqa: E402

from _runtime_models import hybrid_target  # noqa: E402
from _tp_ranks import ThreadRanks, decode_configs, f64_pair  # noqa: E402

torch.set_num_threads(1)
CPU = torch.device("cpu")


def _group(rank, world):
    return TPGroup(rank, world, None, CPU)


def test_shard_config_divides_the_heads_and_refuses_what_does_not_split():
    for cfg in (tiny_target_config(), bench_target_config(), hybrid_target().config):
        s = shard_config(cfg, 2)
        assert (s.num_attention_heads, s.num_key_value_heads, s.intermediate_size) == (
            cfg.num_attention_heads // 2, cfg.num_key_value_heads // 2, cfg.intermediate_size // 2)
        assert (s.linear_num_key_heads, s.linear_num_value_heads) == (cfg.linear_num_key_heads // 2,
                                                                      cfg.linear_num_value_heads // 2)
        assert (s.hidden_size, s.head_dim, s.vocab_size, s.layer_types) == (cfg.hidden_size, cfg.head_dim,
                                                                            cfg.vocab_size, cfg.layer_types)
    assert shard_config(tiny_target_config(), 1) is not None
    with pytest.raises(ConfigError, match="num_attention_heads 3 does not split into 2 ranks"):
        shard_config(tiny_draft_config(), 2)  # the draft stays whole (replicated)
    with pytest.raises(ConfigError, match="experts"):
        shard_config(ModelConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64), 2)
    with pytest.raises(ConfigError, match="num_key_value_heads 4 does not split into 8"):
        shard_config(bench_target_config(), 8)  # 16 query heads would, its 4 KV heads do not


def _rows(start_blocks, rank, world):
    """Rank's row indices: for each (offset, size) block, its contiguous 1/world."""
    out = []
    for off, size in start_blocks:
        n = size // world
        out += list(range(off + rank * n, off + (rank + 1) * n))
    return out


def test_each_rank_holds_its_rows_and_columns_of_the_full_weights():
    full = hybrid_target()
    cfg = full.config
    H, Hkv, D, inter = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.intermediate_size
    hk, hv, dk, dv = cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim, \
        cfg.linear_value_head_dim
    fp = dict(full.named_parameters())
    for rank in (0, 1):
        s = shard_target(full, _group(rank, 2))
        sp = dict(s.named_parameters())
        assert list(sp) == list(fp)  # the same names: a slice of the target's state dict
        for name, p in sp.items():
            i = name.split(".")[2] if name.startswith("model.layers.") else None
            w = fp[name]
            key = name.split(".", 3)[-1] if i is not None else name
            rows = {"self_attn.q_proj.weight": [(0, H * D)], "self_attn.k_proj.weight": [(0, Hkv * D)],
                    "self_attn.v_proj.weight": [(0, Hkv * D)], "mlp.gate_proj.weight": [(0, inter)],
                    "mlp.up_proj.weight": [(0, inter)],
                    "linear_attn.in_proj_qkv.weight": [(0, hk * dk), (hk * dk, hk * dk), (2 * hk * dk, hv * dv)],
                    "linear_attn.in_proj_gates.weight": [(0, hv), (hv, hv), (2 * hv, hv)],
                    "linear_attn.A_log": [(0, hv)], "linear_attn.dt_bias": [(0, hv)]}.get(key)
            cols = {"self_attn.o_proj.weight": H * D, "linear_attn.out_proj.weight": hv * dv,
                    "mlp.down_proj.weight": inter}.get(key)
            if rows is not None:
                assert torch.equal(p, w[_rows(rows, rank, 2)]), name
            elif cols is not None:
                n = cols // 2
                assert torch.equal(p, w[:, rank * n:(rank + 1) * n]), name
            else:  # replicated: embeddings, every norm
                assert torch.equal(p, w) and re.search(r"norm|embed", name), name
        kinds = {n: type(m) for n, m in s.named_modules()}
        assert {n for n, k in kinds.items() if k is RowParallelLinear} == {
            n for n in kinds if n.endswith(("o_proj", "out_proj", "down_proj"))} and len(
            [k for k in kinds.values() if k is RowParallelLinear]) == 2 * cfg.num_layers
        assert s.tp.rank == rank and full.tp is None
    one = _group(0, 1)
    assert shard_target(full, one) is full  # one rank: the model itself, untouched


def test_two_ranks_sum_to_the_whole_model():
    """The plain forward (attention, gated delta rule, MLP, every layer) of two ranks whose row-parallel outputs
    are summed equals the whole model's, in float64, to a few float32 ulps: RMSNorm, the q/k normalisation and the
    delta rule compute in float32 as the reference models do (``x.float()``), so a 1e-16 difference in the sharded
    GEMMs' float64 sums (their order depends on the CPU's BLAS kernels) can flip one float32 rounding (2.4e-7 at
    the residual's magnitude; 7.5e-8 on the logits measured on an AVX2 EPYC, 0 on another build machine). A wrong
    shard is off by O(0.1)."""
    full, _ = f64_pair()
    tokens = torch.randint(0, full.config.vocab_size, (2, 11), generator=torch.Generator().manual_seed(3))
    want = full(tokens)
    got = ThreadRanks(2).run(lambda tp: shard_target(full, tp)(tokens))
    for g in got:
        torch.testing.assert_close(g, want, rtol=0, atol=1e-6)
    assert torch.equal(got[0], got[1])  # every rank holds the same logits, bit for bit


def test_an_engine_per_rank_emits_the_one_process_tokens():
    """Two engines, one per rank (threads), with the whole draft each: tokens, per-round accept lengths and round
    count equal one process's, overlap scheduler, 7 prompts through 3 slots (admission, retirement)."""
    target, draft = f64_pair()
    want = decode_configs(target, draft, [{}])
    got = ThreadRanks(2).run(lambda tp: decode_configs(shard_target(target, tp), draft, [{"tensor_parallel": 2}]))
    assert got[0] == got[1] == want and want[0]["rounds"] > 5


def test_the_config_and_the_runner_agree_on_the_ranks():
    target, draft = f64_pair()
    with pytest.raises(ConfigError, match="tensor_parallel 2, but the target is split over 1 rank"):
        Engine(target, draft, RuntimeConfig(batch_size=1, tensor_parallel=2))
    assert Engine(target, draft, RuntimeConfig(batch_size=1)).runner.tp is None  # one process: no group
    with pytest.raises(ConfigError, match="needs --tp 2 or more"):
        RuntimeConfig(faults=("late-rank",))
    with pytest.raises(ConfigError, match="--tp must be an integer >= 1"):
        RuntimeConfig(tensor_parallel=0)
    with pytest.raises(ConfigError, match="float64 runs on the CPU only"):
        RuntimeConfig(dtype="float64", device="cuda")
    with pytest.raises(ConfigError, match="late-rank delay"):
        RuntimeConfig(late_rank_ms=0)


def test_late_rank_sleeps_on_the_last_rank_only_in_its_range():
    f = Faults.from_names(["late-rank"])
    assert f.late_rank and f.names == ("late-rank",)
    with record_host_ranges() as ranges:
        ranges.active = True
        assert late_rank(_group(1, 2), 30.0) is True
        assert late_rank(_group(0, 2), 30.0) is False
        f.before_plan(_group(0, 2), 30.0)
        f.before_plan(None, 30.0)          # one process: nothing
        Faults().before_plan(_group(1, 2), 30.0)  # fault off: nothing
        f.before_plan(_group(2, 3), 10.0)  # the last of three
    assert ranges.count == {"late_rank": 2}
    assert 0.040 <= ranges.total_s["late_rank"] < 0.5


def test_rank_trace_paths(tmp_path):
    d = tmp_path / "tp2_overlap"
    paths = rank_trace_paths(str(d), 2)
    assert [os.path.relpath(p, tmp_path) for p in paths] == ["tp2_overlap/tp2_overlap.rank0.json.gz",
                                                             "tp2_overlap/tp2_overlap.rank1.json.gz"]
    from gaptrace.loader import trace_files
    d.mkdir()
    for p in paths:
        open(p, "w").close()
        open(p.replace(".json.gz", ".gaptrace.json"), "w").close()
    assert [r for r, _ in trace_files(str(d))] == [0, 1]  # the loader ranks them by name, sidecars left out
    assert rank_trace_paths(str(d) + os.sep, 2) == paths  # a trailing separator; existing own files are fine
    (d / "old.json").write_text("{}")
    with pytest.raises(ValueError, match="holds old.json"):
        rank_trace_paths(str(d), 2)
    (tmp_path / "afile").write_text("")
    with pytest.raises(ValueError, match="this is a file"):
        rank_trace_paths(str(tmp_path / "afile"), 2)
    with pytest.raises(ValueError, match="rank<N>"):
        rank_trace_paths(str(tmp_path / "run_rank3"), 2)
    with pytest.raises(ValueError, match="parent directory does not exist"):
        rank_trace_paths(str(tmp_path / "no" / "dir"), 2)


def test_the_runtime_never_makes_a_multicast_object():
    """No cuMulticastCreate call, no symmetric memory anywhere in the runtime: its one collective is all_reduce."""
    root = os.path.join(os.path.dirname(__file__), "..", "..", "runtime")
    hits = []
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f.endswith(".py"):
                text = open(os.path.join(dirpath, f), encoding="utf-8").read()
                hits += [(f, pat) for pat in ("cuMulticastCreate(", "symmetric_memory", "symm_mem.", "multimem")
                         if pat in text]
    assert hits == []
    collectives = re.findall(r"dist\.(\w+)\(", open(os.path.join(root, "tp", "group.py")).read())
    assert "all_reduce" in collectives and set(collectives) <= {"all_reduce", "init_process_group", "barrier",
                                                                 "destroy_process_group", "is_initialized"}
