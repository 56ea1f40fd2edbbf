"""The commit by recompute (LinearStatePool.recompute_from, models.fused.gdn_recompute), end to end on the CPU: the
runtime decodes with the fused kernels in Triton's interpreter (TRITON_INTERPRET=1, in a subprocess), once with the
verify handing the commit its layers' projections (the default on the fused path) and once with the verify storing
every per-token state (recompute switched off). The recomputed state is the stored one bit for bit, so the two
decodes must agree token for token, round for round, and leave the same state pool. tests/runtime/test_gpu.py
(``pytest -m gpu``) runs the recompute compiled on a CUDA GPU against plain greedy decoding."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

CHECK = r"""
import sys
import torch
sys.path.insert(0, "tests")
from _runtime_models import hybrid_target, near_copy, random_prompts
from gaptrace.runtime.cache.linear_state import LinearStatePool
from gaptrace.runtime.config import RuntimeConfig
from gaptrace.runtime.engine import Engine
from gaptrace.runtime.engine import PlainEngine

torch.set_num_threads(1)
# the fused path on the CPU: Triton's interpreter runs the kernels (the config refuses fused off CUDA otherwise)
RuntimeConfig.fused_kernels = property(lambda self: self.kernels != "eager")
target = hybrid_target()
draft = near_copy(target, 0.3)
prompts = random_prompts((5, 19, 1))
real = LinearStatePool.recompute_from


def decode(recompute, engine_cls=Engine, **kw):
    LinearStatePool.recompute_from = real if recompute else (lambda self, model: None)
    rc = RuntimeConfig(block_size=4, page_size=4, window=16, batch_size=2, max_seq_len=64, prefill_chunk=16,
                       kernels="auto", **kw)
    eng = Engine(target, draft, rc) if engine_cls is Engine else engine_cls(target, rc, draft=draft)
    assert (eng.runner.state.tgt_lin.recompute is not None) == recompute
    reqs, stats = eng.generate(prompts, 10)
    return [r.output for r in reqs], stats.round_tau, eng.runner.state.tgt_lin.pool.clone()


# simulated acceptance: rows accept different prefixes (1 .. B tokens) round after round
a, b = decode(True, sim_accept_rate=0.6), decode(False, sim_accept_rate=0.6)
assert a[0] == b[0] and a[1] == b[1] and torch.equal(a[2], b[2])
assert len({t for r in a[1] for t in r}) >= 3, a[1]
a, b = decode(True, PlainEngine), decode(False, PlainEngine)
assert a[0] == b[0] and torch.equal(a[2], b[2])
# the fault that needs every per-token state keeps them
LinearStatePool.recompute_from = real
eng = Engine(target, draft, RuntimeConfig(block_size=4, page_size=4, window=16, batch_size=3, max_seq_len=96,
                                          kernels="auto", faults=("eager-commit-glue",)))
assert eng.runner.state.tgt_lin.recompute is None
print("ok")
"""


def test_recompute_commit_equals_stored_states_in_triton_interpreter():
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton not installed")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, env=env, timeout=900,
                       cwd=os.path.join(os.path.dirname(__file__), "..", ".."))
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.stdout[-2000:], r.stderr[-4000:])

