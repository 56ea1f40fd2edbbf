"""What the tensor-parallel tests run inside each rank (runtime/tp.spawn_ranks pickles these module-level functions
into fresh processes) and the two-ranks-in-one-process stand-in the fast tests use (``ThreadRanks``)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import torch

from gaptrace.runtime.tp import RANK_ENV, TPGroup, shard_target

from _runtime_models import hybrid_target, near_copy, random_prompts

LENGTHS = (5, 23, 40, 1, 31, 17, 9)
MAX_NEW = 24


# ------------------------------------------------------------------------------------- fast: threads as ranks
class ThreadRanks:
    """N ranks as N threads of this process: ``group(r)`` is rank r's TPGroup whose all-reduce sums the N threads'
    tensors (a barrier, then every rank adds the N inputs in rank order, then a barrier), as gloo would."""

    def __init__(self, world: int):
        self.world = world
        self.slots: list = [None] * world
        self.barrier = threading.Barrier(world)

    def group(self, rank: int) -> TPGroup:
        outer = self

        class _Group(TPGroup):
            def all_reduce(self, t):
                outer.slots[self.rank] = t.clone()
                outer.barrier.wait()
                total = outer.slots[0].clone()
                for x in outer.slots[1:]:
                    total += x
                outer.barrier.wait()
                t.copy_(total)
                return t

        return _Group(rank, self.world, None, torch.device("cpu"))

    def run(self, fn) -> list:
        """[fn(rank's group) for each rank], each in its own thread."""
        out: list = [None] * self.world
        errors: list = []

        def body(r):
            try:
                out[r] = fn(self.group(r))
            except BaseException as e:  # noqa: BLE001 (re-raised below)
                errors.append(e)
                self.barrier.abort()

        threads = [threading.Thread(target=body, args=(r,)) for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return out


# ------------------------------------------------------------------------------------- slow: spawned ranks
def f64_pair():
    """The runtime tests' hybrid target and its near-copy draft, in float64."""
    target = hybrid_target().double()
    return target, near_copy(target, 0.1).double()


def decode_configs(target, draft, configs: list[dict], prompts=None) -> list[dict]:
    """For each RuntimeConfig keyword set: {tokens per request, per-round accept lengths, rounds}."""
    from gaptrace.runtime.config import RuntimeConfig
    from gaptrace.runtime.engine import Engine

    prompts = prompts or random_prompts(LENGTHS)
    out = []
    for kw in configs:
        rc = RuntimeConfig(**{"block_size": 4, "page_size": 4, "window": 16, "batch_size": 3, "max_seq_len": 128,
                              "prefill_chunk": 16, **kw})
        reqs, stats = Engine(target, draft, rc).generate(prompts, MAX_NEW)
        out.append({"tokens": [r.output for r in reqs], "round_tau": stats.round_tau, "rounds": stats.rounds})
    return out


def decode_rank(tp, configs: list[dict]) -> list[dict]:
    """A rank of the exactness test: its slice of the float64 target, the whole draft, every config."""
    target, draft = f64_pair()
    shard = shard_target(target, tp)
    return decode_configs(shard, draft, [{**kw, "tensor_parallel": tp.world} for kw in configs])


def environment_rank(tp) -> dict:
    """The rank's NVLink-multicast variables, a child process's (what the rank spawns inherits), the backend."""
    import torch.distributed as dist

    code = f"import json, os; print(json.dumps({{k: os.environ.get(k) for k in {sorted(RANK_ENV)!r}}}))"
    child = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                      check=True).stdout)
    return {"rank": tp.rank, "world": tp.world, "backend": str(dist.get_backend()),
            "env": {k: os.environ.get(k) for k in RANK_ENV}, "child_env": child}


def failing_rank(tp, bad_rank: int) -> None:
    """Rank ``bad_rank`` raises a one-line ValueError; the others wait in a collective it never joins."""
    if tp.rank == bad_rank:
        raise ValueError(f"rank {tp.rank} refuses")
    tp.all_reduce(torch.zeros(1))


def late_rank_rank(tp, delay_ms: float) -> dict:
    """A rank of the late-rank test: an overlap decode with the fault, every range's host seconds (unprofiled,
    HostRangeTimes) over all rounds, and the rounds run."""
    from gaptrace.runtime.annotate import record_host_ranges
    from gaptrace.runtime.config import RuntimeConfig
    from gaptrace.runtime.engine import Engine

    target, draft = f64_pair()
    rc = RuntimeConfig(block_size=4, page_size=4, window=16, batch_size=3, max_seq_len=128, prefill_chunk=16,
                       faults=("late-rank",), late_rank_ms=delay_ms, tensor_parallel=tp.world)
    with record_host_ranges() as ranges:
        ranges.active = True
        reqs, stats = Engine(shard_target(target, tp), draft, rc).generate(random_prompts(LENGTHS[:3]), 16)
    return {"rank": tp.rank, "range_s": dict(ranges.total_s), "count": dict(ranges.count), "rounds": stats.rounds,
            "tokens": [r.output for r in reqs]}


def gpu_tiny_rank(tp, configs: list[dict], texts: list[str], max_new: int) -> list[dict]:
    """A rank of the GPU test: the shipped tiny pair in float32 on GPU ``tp.rank``, this rank's slice of the target,
    CUDA graphs (their NCCL all-reduces captured), every config; per config {tokens, round_tau, rounds, graph
    node counts}."""
    return tiny_decode(configs, texts, max_new, tp)


def tiny_decode(configs: list[dict], texts: list[str], max_new: int, tp=None) -> list[dict]:
    """The tiny pair on CUDA (one process when ``tp`` is None), each config decoded; see gpu_tiny_rank."""
    from gaptrace.runtime.engine import Engine
    from gaptrace.runtime.session import build_setup, encode_prompts

    out = []
    for kw in configs:
        setup = build_setup("tiny", device="cuda", dtype="float32", batch_size=8, tp=tp,
                            tensor_parallel=1 if tp is None else tp.world, **kw)
        ids = encode_prompts(setup, texts, max_new)
        engine = Engine(setup.target, setup.draft, setup.rcfg, setup.eos_token_id)
        reqs, stats = engine.generate(ids, max_new)
        out.append({"tokens": [r.output for r in reqs], "round_tau": stats.round_tau, "rounds": stats.rounds,
                    "graph_nodes": {k: dict(v) for k, v in engine.graph_nodes.items()}})
        del engine, setup
        import gc
        gc.collect()
    return out
