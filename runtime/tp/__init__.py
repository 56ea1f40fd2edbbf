"""Tensor parallelism (DESIGN.md "Tensor parallelism"): the target split over N ranks, one process each.

    group.py    TPGroup (rank, world size, process group, the all-reduce), the ranks' environment (NVLink
                multicast off), init_rank / close_rank: one rank's process group (NCCL on CUDA, gloo on the CPU)
    shard.py    shard_config / shard_target: a rank's slice of the target (attention heads, MLP columns and
                linear-attention heads split column / row parallel, Megatron-style), RowParallelLinear (the layer
                whose output is all-reduced)
    launch.py   spawn_ranks: run a function in N fresh processes (torch.multiprocessing, start method spawn), one
                per rank, and collect what each returns

With ``tensor_parallel`` 1 none of this is imported: one process, no process group, the same model and ops.
"""
from .group import RANK_ENV, TPGroup
from .launch import RankError, spawn_ranks
from .shard import RowParallelLinear, shard_config, shard_target

__all__ = ["RANK_ENV", "RankError", "RowParallelLinear", "TPGroup", "shard_config", "shard_target", "spawn_ranks"]
