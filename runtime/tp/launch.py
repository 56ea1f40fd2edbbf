"""The runtime's own launcher: one fresh process per rank (``torch.multiprocessing``, start method ``spawn``), each
joined to one process group, each running the same function; what each returns comes back to the caller.

The calling process never joins the group, touches a GPU or imports a CUDA library's state: it only starts the ranks
and waits. A rank that fails stops the others (torch's process context terminates them), and a one-line error a
rank raised as a ValueError (ConfigError, a bad prompt, an unwritable output) reaches the caller as
:class:`RankError` with that line, so the command line still prints one line and exits 2.
"""
from __future__ import annotations

import gc
import logging
import os
import pickle
import tempfile
from typing import Any, Callable

import torch
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessException

from .group import close_rank, init_rank, set_rank_environment


GRACE_S = 10.0  # after one rank failed, how long the others get to end by themselves before they are terminated


class _DropTermination(logging.Filter):
    """Drops torch's "Terminating process N via signal SIGTERM" warning (the failed rank's error line says it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Terminating process")


class RankError(ValueError):
    """A rank ended with a one-line error (a ValueError inside it: its message, as one process would say it), or
    died (the message names the rank and the last line of what it raised)."""


def _write_atomic(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _rank_main(rank: int, fn: Callable, world: int, device: str, work: str, args: tuple) -> None:
    """One rank (the spawned process's entry): environment, process group, ``fn(tp, *args)``, its result written to
    ``work``/result.rank<r>.pkl, garbage collected (CUDA graphs before their communicator), the group left. A
    ValueError is written to ``work``/error.rank<r>.txt (exit 2)."""
    set_rank_environment()  # before anything in this process could read it or start a process
    if device == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)  # the ranks share the host's cores; decode steps are tiny
    try:
        tp = init_rank(rank, world, device, f"file://{os.path.join(work, 'rendezvous')}")
        result = fn(tp, *args)
    except ValueError as e:
        _write_atomic(os.path.join(work, f"error.rank{rank}.txt"), str(e).encode())
        raise SystemExit(2) from None
    _write_atomic(os.path.join(work, f"result.rank{rank}.pkl"), pickle.dumps(result))
    del result
    gc.collect()  # the engines' CUDA graphs (held in reference cycles) go before the communicator they captured
    if tp.device.type == "cuda":
        torch.cuda.synchronize()  # SYNC (deliberate, at exit)
    close_rank()


def spawn_ranks(fn: Callable[..., Any], world: int, device: str = "cpu", args: tuple = ()) -> list[Any]:
    """Run ``fn(tp, *args)`` in ``world`` fresh processes, rank r in the r-th (``tp``: its
    :class:`~.group.TPGroup`; NCCL and GPU r on CUDA, gloo on the CPU; ``RANK_ENV`` in each rank's environment).
    ``fn`` and ``args`` must pickle (a module-level function). Returns each rank's return value, by rank.

    RankError (one line) when a rank raised a ValueError (the lowest such rank's message) or died (its exit code,
    and the last line of its traceback when it raised something else); the other ranks are stopped."""
    if world < 1:
        raise RankError(f"--tp must be >= 1, got {world}")
    with tempfile.TemporaryDirectory(prefix="gaptrace-tp-") as work:
        ctx = mp.start_processes(_rank_main, args=(fn, world, device, work, args), nprocs=world, join=False,
                                 start_method="spawn")
        quiet = _DropTermination()
        spawn_log = logging.getLogger("torch.multiprocessing.spawn")
        spawn_log.addFilter(quiet)  # the one error line below says what failed
        try:
            while not ctx.join(grace_period=GRACE_S):
                pass
        except ProcessException as e:
            for r in range(world):  # a rank's own one-line error, when one wrote it
                p = os.path.join(work, f"error.rank{r}.txt")
                if os.path.exists(p):
                    with open(p) as f:
                        raise RankError(f.read().strip()) from None
            last = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise RankError(f"rank {e.error_index} failed: {last}") from None
        finally:
            spawn_log.removeFilter(quiet)
        out = []
        for r in range(world):
            with open(os.path.join(work, f"result.rank{r}.pkl"), "rb") as f:
                out.append(pickle.load(f))
        return out


__all__ = ["RankError", "spawn_ranks"]
