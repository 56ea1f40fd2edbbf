"""The two draft-tree builders against each other on a device (runtime/spec/tree.py): the batched
``build_tree_torch`` on DEVICE against the host's ``build_tree_heapq``, on random top-k inputs of which half are
drawn from a few values (many exact ties). Used by tests/runtime/test_runtime_tree.py (CPU) and
tests/runtime/test_gpu.py (CUDA, ``pytest -m gpu``).
"""
from __future__ import annotations

import numpy as np


def check_builders(device: str, cases: int, seed: int = 0) -> tuple[int, int]:
    """(trees compared, trees that differ in any field) over ``cases`` random batches."""
    import torch

    from gaptrace.runtime.spec.tree import Tree, build_tree_heapq, build_tree_torch

    rng = np.random.default_rng(seed)
    ties = np.log(np.array([1.0, 0.5, 0.25, 0.125], np.float32))
    compared = differ = 0
    for case in range(cases):
        nb, D, k, N = (int(x) for x in (rng.integers(1, 9), rng.integers(0, 8), rng.integers(1, 6),
                                        rng.integers(1, 24)))
        if case % 2:
            lp = rng.choice(ties, size=(nb, D, k))
        else:
            lp = np.log(rng.dirichlet(np.ones(k), size=(nb, D)))
        lp = -np.sort(-lp.astype(np.float32), axis=-1)
        ids = rng.integers(0, 1000, size=(nb, D, k))
        tree = build_tree_torch(torch.from_numpy(lp).to(device), torch.from_numpy(ids).to(device), N)
        host = {f: getattr(tree, f).cpu().numpy() for f in Tree.FIELDS}
        for b in range(nb):
            ref = build_tree_heapq(lp[b], ids[b], N)
            compared += 1
            differ += any(not np.array_equal(host[f][b], ref[f]) for f in Tree.FIELDS)
    return compared, differ
