"""One rank of a tensor-parallel decode: its process group, its all-reduce, and its environment.

``RANK_ENV`` keeps NVLink multicast off in every rank and in every process a rank starts (the variables are set in
``os.environ`` before the process group exists, so NCCL, torch's symmetric memory and NVSHMEM read them at their
initialisation and child processes inherit them): NCCL's NVLS algorithms (``NCCL_NVLS_ENABLE=0``), torch's
symmetric-memory multicast (``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``) and NVSHMEM's (``NVSHMEM_DISABLE_NVLS=1``). The
runtime itself never calls ``cuMulticastCreate`` (no symmetric memory, no multicast object): its only collective
is ``torch.distributed.all_reduce`` over the default process group.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..config import ConfigError

# NVLink multicast (NVLS) off, in the ranks and whatever they spawn: on a shared multi-GPU host a program that
# uses it can take the host's GPUs out of service
RANK_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


@dataclass(frozen=True)
class TPGroup:
    """A rank's place in a tensor-parallel decode: ``rank`` in [0, ``world``), the process group, the device."""

    rank: int
    world: int
    group: object  # torch.distributed ProcessGroup
    device: torch.device

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum ``t`` over the ranks, in place; returns it. NCCL on CUDA: enqueued on the current stream with no host
        wait, and captured into a CUDA graph when called inside one; gloo on the CPU: the host waits for the others."""
        dist.all_reduce(t, group=self.group)
        return t

    @property
    def last(self) -> bool:
        """This is the last rank (``world - 1``): the one the fault ``late-rank`` delays."""
        return self.rank == self.world - 1


def set_rank_environment(environ=None) -> None:
    """Put ``RANK_ENV`` into ``environ`` (default ``os.environ``: this process and every process it starts)."""
    (os.environ if environ is None else environ).update(RANK_ENV)


def init_rank(rank: int, world: int, device: str, init_method: str) -> TPGroup:
    """Join the process group of ``world`` ranks as ``rank`` (rendezvous at ``init_method``, e.g. ``file://...``):
    NCCL and GPU ``rank`` on CUDA (``torch.cuda.set_device``; the communicator made now, before any graph
    capture), gloo on the CPU. Sets ``RANK_ENV`` first. ConfigError (one line) when CUDA has fewer GPUs than ranks."""
    set_rank_environment()
    if device == "cuda":
        n = torch.cuda.device_count()
        if n < world:
            raise ConfigError(f"--tp {world} on CUDA needs {world} GPUs, torch sees {n}")
        torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank)
        dist.init_process_group("nccl", init_method=init_method, rank=rank, world_size=world, device_id=dev)
    else:
        dev = torch.device("cpu")
        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    return TPGroup(rank, world, dist.group.WORLD, dev)


def close_rank() -> None:
    """Leave the process group (after a barrier, so no rank tears its communicator down under another's last
    collective). Call it once the rank's CUDA graphs are gone: destroying a communicator that live graphs captured
    can hang."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
