"""Switchable host-side pathologies of the decode loop, each a known diagnosis (DESIGN.md "Known-answer faults").

``--fault NAME`` (repeatable, on ``gaptrace decode`` and ``gaptrace capture``; ``RuntimeConfig.faults``) switches
one on, on top of the overlap scheduler. Each is ONE function below whose work runs inside ONE NVTX range (and
``record_function``) named like the function, so a trace names it twice: by the range and by the Python frame.
The names are parsed once, into :class:`Faults` (one boolean switch per fault); the engine, the scheduler, the
model runner and the round strategies call its hooks at the fault sites and test no fault name themselves.
None changes a generated token (tests/runtime/test_runtime_faults.py decodes with each against without, token for
token).

| --fault              | function / range     | what the round does with it on                 | the default (the fix)        |
| -------------------- | -------------------- | ---------------------------------------------- | ---------------------------- |
| ``lengths-copy``     | ``lengths_copy``     | a blocking DtoH copy of the accept-dependent   | plan with Lplan = Lcommitted |
|                      |                      | lengths, once per round, inside ``plan``       | + B and the bound c <= ...   |
| ``dd-gather``        | ``dd_gather``        | the window rectangle rebuilt with              | fixed-shape rectangle        |
|                      |                      | ``.max().item()`` + ``masked_select``          | (``rect_fixed``)             |
| ``eager-commit-glue``| ``eager_commit_glue``| linear-state commit as per-layer eager ops:    | one gather + one scatter for |
|                      |                      | 2 ``.contiguous()`` + 2 fp32 weight copies +   | all layers (no glue)         |
|                      |                      | 1 fresh index tensor per linear layer          |                              |
| ``jit-new-shape``    | ``jit_new_shape``    | a Triton kernel specialised on                 | prewarm every bucket x width |
|                      |                      | next_power_of_2(nb) and the lengths' int width,| (``prewarm_window_lengths``) |
|                      |                      | warmed for one shape only: a new batch bucket  | or no kernel at all          |
|                      |                      | compiles mid-decode                            |                              |
| ``token-list-rebuild``| ``token_list_rebuild``| every prefill chunk rebuilds the request's    | the prompt uploaded once,    |
|                      |                      | full token list (prompt + output) in Python and| chunks sliced on the device  |
|                      |                      | uploads all of it, then slices the chunk       |                              |
| ``cpu-tree-build``   | ``cpu_tree_build``   | (tree mode) the draft tree built per request   | ``build_tree_torch``: all    |
|                      |                      | on the host: top-k copied to the host, Python  | rows at once on the device,  |
|                      |                      | heapq per request, arrays uploaded (seeds      | fixed shapes, no sync        |
|                      |                      | 003/004); same as ``--tree-builder cpu-heapq`` | (``--tree-builder gpu``)     |
| ``late-rank``        | ``late_rank``        | (``--tp`` >= 2) the last rank's host sleeps    | every rank plans on time     |
|                      |                      | ``late_rank_ms`` at the start of its ``plan``  |                              |
|                      |                      | every round: the other ranks wait in their     |                              |
|                      |                      | first all-reduce of the round for it           |                              |

The host syncs of ``lengths_copy``, ``dd_gather`` and ``cpu_tree_build`` are deliberate (marked SYNC).
``cpu-tree-build`` needs tree mode (``--tree-budget N``); ``late-rank`` a tensor-parallel decode (``--tp N``, N >= 2);
the others work in both modes.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from .annotate import annotate
from .cache.window import compact_len
from .config import FAULT_NAMES, ConfigError

__all__ = ["FAULT_NAMES", "Faults", "lengths_copy", "dd_gather", "eager_commit_glue", "jit_new_shape",
           "token_list_rebuild", "cpu_tree_build", "late_rank", "window_lengths", "prewarm_window_lengths",
           "function_name"]


def function_name(fault: str) -> str:
    """The function (and NVTX range) of a fault: ``lengths-copy`` -> ``lengths_copy``."""
    return fault.replace("-", "_")


@dataclass(frozen=True)
class Faults:
    """The pathologies switched on: one boolean per fault, named like its function (``lengths-copy`` ->
    ``lengths_copy``), parsed once from the names (:meth:`from_names`). The hooks below are what the decode loop
    calls at each fault site; with every switch off each hook does the default (the fix) and nothing else.

    | hook / switch         | read by                                          | fault                     |
    | --------------------- | ------------------------------------------------ | ------------------------- |
    | ``prewarm``           | Engine, at start-up (CUDA)                       | jit-new-shape             |
    | ``after_sizing``      | OverlapScheduler.allocate                        | lengths-copy              |
    | ``build_window_rect`` | ChainRound / TreeRound.prepare (``plan`` range)  | dd-gather, jit-new-shape  |
    | ``prefill_chunk_ids`` | ModelRunner.prefill                              | token-list-rebuild        |
    | ``commit_on_host``    | graph capture (no commit in a graph)             | eager-commit-glue         |
    | ``eager_commit_glue`` | ChainRound.commit, TreeRound's commit            | eager-commit-glue         |
    | ``cpu_tree_build``    | TreeRound.build and its graph capture            | cpu-tree-build            |
    | ``before_plan``       | Engine.plan_round (``plan`` range)               | late-rank                 |
    """

    lengths_copy: bool = False
    dd_gather: bool = False
    eager_commit_glue: bool = False
    jit_new_shape: bool = False
    token_list_rebuild: bool = False
    cpu_tree_build: bool = False
    late_rank: bool = False

    @classmethod
    def from_names(cls, names) -> "Faults":
        """Faults from ``--fault`` names (``FAULT_NAMES``; repeats switch a fault on once). ConfigError (one line)
        for an unknown name. The combinations a config refuses (a fault that needs the overlap scheduler, tree mode
        or pow2 buckets) are RuntimeConfig.validate's."""
        on = {}
        for n in names:
            if n not in FAULT_NAMES:
                raise ConfigError(f"unknown fault {n!r} (known: {', '.join(FAULT_NAMES)})")
            on[function_name(n)] = True
        return cls(**on)

    @property
    def names(self) -> tuple[str, ...]:
        """The switched-on faults' names, in FAULT_NAMES order."""
        return tuple(n for n in FAULT_NAMES if getattr(self, function_name(n)))

    @property
    def commit_on_host(self) -> bool:
        """eager-commit-glue: the linear states are committed by the eager per-layer glue, so the commit stays out
        of every CUDA graph (host work by definition) and the commit does not recompute states from projections."""
        return self.eager_commit_glue

    # ------------------------------------------------------------------------------------------------- hooks
    def prewarm(self, runner, bucket: int) -> None:
        """At start-up on CUDA: jit-new-shape's single-shape warm-up (``bucket``, int64 lengths only)."""
        if self.jit_new_shape:
            prewarm_window_lengths(runner, [bucket], (torch.int64,))

    def after_sizing(self, lengths_to_host: Callable[[], np.ndarray], slots: list[int], bound_cols: int,
                     window: int, page_size: int) -> None:
        """After the overlap scheduler sized the round from the bound: lengths-copy reads the exact lengths."""
        if self.lengths_copy:
            lengths_copy(lengths_to_host, slots, bound_cols, window, page_size)  # SYNC (fault)

    def build_window_rect(self, runner, buf, packed: bool) -> None:
        """The bucket's draft window rectangle: ``runner.build_rect(buf, packed)``, or dd-gather's data-dependent
        rebuild; then jit-new-shape's Triton recompute of its lengths."""
        if self.dd_gather:
            dd_gather(runner, buf)  # SYNC (fault)
        else:
            runner.build_rect(buf, packed=packed)
        if self.jit_new_shape:
            jit_new_shape(runner, buf)

    def prefill_chunk_ids(self, runner, request) -> Callable[[int, int], torch.Tensor] | None:
        """token-list-rebuild: chunk [a, b)'s ids from the request's whole token list rebuilt; None = the default
        (the prompt uploaded once, chunks sliced on the device)."""
        if not self.token_list_rebuild:
            return None
        return lambda a, b: token_list_rebuild(runner, request, a, b)

    def before_plan(self, tp, delay_ms: float) -> None:
        """At the start of each round's plan: late-rank delays the last rank of ``tp`` (a
        :class:`~.tp.group.TPGroup`, None in one process) by ``delay_ms``."""
        if self.late_rank and tp is not None:
            late_rank(tp, delay_ms)

    def replace(self, **kw) -> "Faults":
        """A copy with some switches changed."""
        return dataclasses.replace(self, **kw)


def lengths_copy(lengths_to_host: Callable[[], np.ndarray], slots: list[int], bound_cols: int, window: int,
                 page_size: int) -> np.ndarray:
    """SYNC (fault ``lengths-copy``, DESIGN.md "Known-answer faults", "The plan bound"): copy the exact
    accept-dependent lengths [num_slots] to the host with a blocking device-to-host copy (it waits for every
    queued round), as a production decoder did once per verify round. The sizing stays the overlap scheduler's: the
    exact values are only checked against it (max c(L) over ``slots`` <= ``bound_cols``, the claim
    c(L) <= min(Lplan, W + P - 1)). ``lengths_to_host``: the runner's blocking copy. Returns the host lengths."""
    with annotate("lengths_copy"):
        lengths = lengths_to_host()  # SYNC (fault): the blocking lengths copy
        exact = max((int(compact_len(int(lengths[s]), window, page_size)) for s in slots), default=0)
        assert exact <= bound_cols, f"window bound {bound_cols} < exact compact length {exact}"
    return lengths


def dd_gather(runner, buf) -> None:
    """SYNC (fault ``dd-gather``, DESIGN.md "Known-answer faults"): rebuild the bucket's draft window rectangle
    with the data-dependent gathers (``rect_packed``: a ``.max().item()`` to size the gather, a ``masked_select`` whose
    output length is data-dependent; two device round-trips) instead of the fixed-shape ``rect_fixed``. Same
    values (runtime/spec/plan.py)."""
    with annotate("dd_gather"):
        runner.build_rect(buf, packed=True)


def eager_commit_glue(rows: torch.Tensor, tau: torch.Tensor, commits) -> None:
    """Fault ``eager-commit-glue`` (DESIGN.md "Known-answer faults"): commit the linear-attention states layer by
    layer with per-layer eager glue (a production decoder's state-commit glue), instead of one gather and one
    scatter for all layers (``LinearStatePool.commit``).

    rows [nb], tau [nb] in [1, B]; ``commits``: (pool, model, states_all) per model, states_all
    [n_linear, nb, B, Hv, dk, dv] float32 (or None). Per linear layer and round: a freshly allocated row index
    tensor, the pick of the state after token tau - 1, two ``.contiguous()`` copies of strided views of it (its two
    halves along dv, standing in for k/v views into a fused QKV buffer), fp32 copies of the layer's
    frozen gating weights ``A_log`` and ``dt_bias`` (the same values every round; an fla-style commit kernel
    takes them, ours selects stored per-token states and does not use them), and two scatters into the pool.
    Value-identical to ``LinearStatePool.commit`` (copies and indexing only). Extra device bytes per layer: one
    copy of the picked state [nb, Hv, dk, dv] (float32); the cost meant here is the host's ~10 eager ops."""
    with annotate("eager_commit_glue"):
        for pool, model, states_all in commits:
            if not pool.n_linear or states_all is None:
                continue
            for i, li in enumerate(model.linear_layers):
                gdn = model.model.layers[li].linear_attn
                idx = torch.arange(rows.shape[0], device=rows.device)       # fresh index tensor every round
                picked = states_all[i][idx, tau - 1]                # [nb, Hv, dk, dv]
                h = picked.shape[-1] // 2
                k_part = picked[..., :h].contiguous()               # strided view -> copy
                v_part = picked[..., h:].contiguous()               # strided view -> copy
                _a_log = gdn.A_log.detach().to(torch.float32, copy=True)     # frozen weight, converted again
                _dt_bias = gdn.dt_bias.detach().to(torch.float32, copy=True)
                dest = pool.pool[i]                                 # [num_slots, Hv, dk, dv]
                dest[..., :h].index_copy_(0, rows, k_part)
                dest[..., h:].index_copy_(0, rows, v_part)


# ------------------------------------------------------------------------------------------------ jit-new-shape
def window_lengths(lengths: torch.Tensor, rows: torch.Tensor, out: torch.Tensor, W: int, P: int) -> None:
    """out[i] = c(lengths[rows[i]]) (runtime/cache/window.py), i < rows.shape[0]; lengths int32 or int64.

    On CUDA: one Triton kernel (runtime/window_len_triton.py) whose compiled variant depends on
    next_power_of_2(nb) (the BLOCK constexpr) and on the pointer dtypes (the lengths' integer width): a shape it
    has not seen compiles on the calling thread, in the middle of the round. Elsewhere: the same arithmetic in torch (no compile)."""
    nb = rows.shape[0]
    if lengths.is_cuda:
        from .window_len_triton import next_power_of_2, window_len_kernel  # Triton: imported on CUDA only

        window_len_kernel[(1,)](lengths, rows, out, nb, W, P, BLOCK=next_power_of_2(nb))
    else:
        out.copy_(compact_len(lengths[rows], W, P))


def prewarm_window_lengths(runner, buckets: list[int], dtypes=(torch.int32, torch.int64)) -> int:
    """Compile ``window_lengths`` for every bucket in ``buckets`` x length dtype in ``dtypes`` now, on masked
    dummy tensors (the fix, DESIGN.md "Known-answer faults": prewarm the variant space at start-up).
    ``jit-new-shape`` calls it with the full batch's bucket and int64 only, the single-shape warm-up that leaves
    the other buckets to compile mid-decode. Returns the number of variants run (0 off CUDA)."""
    dev = runner.device
    if dev.type != "cuda":
        return 0
    rc = runner.rcfg
    n = 0
    for nb in buckets:
        rows = torch.full((nb,), runner.scratch, dtype=torch.long, device=dev)
        for dt in dtypes:
            lengths = torch.zeros(runner.scratch + 1, dtype=dt, device=dev)
            window_lengths(lengths, rows, torch.empty(nb, dtype=torch.long, device=dev), rc.window, rc.page_size)
            n += 1
    torch.cuda.synchronize()  # SYNC (deliberate, start-up only): the compiles are done before decoding
    return n


def jit_new_shape(runner, buf) -> None:
    """Fault ``jit-new-shape``: recompute the bucket's window lengths c(L) (already written by the rectangle
    build; same values) with the Triton kernel of ``window_lengths``. The engine warmed it for the full batch's
    bucket only, so the first round in another bucket (requests finished, the batch shrank) pays a Triton compile
    on the host, mid-decode (DESIGN.md "Known-answer faults": a kernel specialised on next_power_of_2(bs) and on
    int widths)."""
    with annotate("jit_new_shape"):
        st = runner.state
        window_lengths(st.lengths, buf.rows, buf.rect_len, st.window, st.page_size)


def token_list_rebuild(runner, request, a: int, b: int) -> torch.Tensor:
    """Fault ``token-list-rebuild`` (DESIGN.md "Known-answer faults"; a production scheduler rebuilt the
    request's full token list, origin + output, a pure Python list concatenation of up to 64k elements, on every
    16k-token prefill chunk, while the output half was still empty): for prefill chunk [a, b), rebuild
    ``prompt + output`` as a new Python list, convert the whole list to an array and upload it, and slice the chunk
    from it. O(context) host work per chunk, O(n^2 / chunk) per prompt, on the path that feeds the GPU the next
    chunk. The fix: the prompt uploaded once per request, chunks sliced on the device (``ModelRunner.prefill``).
    Returns the chunk's token ids [b - a] long on the device (the same ids)."""
    with annotate("token_list_rebuild"):
        full = request.prompt + request.output
        return runner.to_device(np.array(full, dtype=np.int64))[a:b]


def cpu_tree_build(runner, out, logp: torch.Tensor, ids: torch.Tensor, budget: int) -> None:
    """SYNC (fault ``cpu-tree-build`` = ``--tree-builder cpu-heapq``; DESIGN.md "Draft trees"; as a production
    decoder did: ``_build_ddtree_verify_input`` looping ``for i in range(bs)`` over ``build_ddtree_tree_from_topk``,
    a Python heapq, between the draft and the verify graphs): copy the draft's top-k logp [nb, D, k] and ids
    [nb, D, k] to the host (two blocking device-to-host copies: they wait for the draft block), build each request's
    tree with ``spec.tree.build_tree_heapq``, and upload the arrays into ``out`` (the bucket's static ``Tree``, the
    verify graph's input) with non-blocking copies. Same trees as ``build_tree_torch``
    (tests/runtime/test_runtime_tree.py), so no token changes; the device idles from the draft's end until the
    upload and the verify launch."""
    from .spec.tree import Tree, build_tree_heapq

    with annotate("cpu_tree_build"):
        lp = logp.cpu().numpy()   # SYNC (fault): waits for the draft block
        ii = ids.cpu().numpy()    # SYNC (fault)
        trees = [build_tree_heapq(lp[i], ii[i], budget) for i in range(lp.shape[0])]  # per request, Python heapq
        for f in Tree.FIELDS:
            getattr(out, f).copy_(runner.to_device(np.stack([t[f] for t in trees])), non_blocking=True)


def late_rank(tp, delay_ms: float) -> bool:
    """Fault ``late-rank`` (DESIGN.md "Known-answer faults", "Tensor parallelism"): the last rank of ``tp`` (rank
    N - 1 of a ``--tp N`` decode) sleeps ``delay_ms`` on the host at the start of every round's planning, as a rank
    whose host thread was descheduled, paging or collecting garbage would; the other ranks do nothing here. Every
    rank runs the same collectives in the same order, so the others reach the round's first all-reduce (the first
    target layer's, in the verify) that much earlier and wait there for the late one: on CUDA the others' NCCL
    kernel spins on the device while their host runs ahead, on the CPU their host waits inside gloo. A delay longer
    than the round's host slack (the time the host is ahead of the device, < one round) shows as waiting on every
    other rank every round; no token changes. Returns whether this rank slept."""
    if not tp.last:
        return False
    with annotate("late_rank"):
        time.sleep(delay_ms / 1e3)
    return True
