"""benchmarks/bench_runtime.py with one variant patched in, for a side-by-side run (the graph-node bubble hunt):

    python benchmarks/probes/runtime_variant.py VARIANT [SCRIPT.py] [the script's arguments]   # default bench_runtime.py

VARIANT: ``none`` (as is); ``carveout<PCT>`` (every Triton kernel's preferred shared-memory carveout set to PCT
percent: bench_node_gap.set_triton_carveout); ``default_graph`` (the runtime's graphs made by
``torch.cuda.CUDAGraph()`` instead of ``keep_graph=True`` + ``instantiate()``; no node counts then); ``one_bucket``
(graphs for the largest batch bucket only, not every power of two below it: 4 graphs instead of 16 at bs 8);
``two_graphs`` (that bucket's draft and verify graphs only: the window rectangle and the commit run eager).
"""
import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [HERE, os.path.join(ROOT, "benchmarks")]  # bench_node_gap (a probe), then benchmarks/
import torch
variant = sys.argv[1]
if variant.startswith("carveout"):
    from bench_node_gap import set_triton_carveout
    counts = set_triton_carveout(int(variant[len("carveout"):]))
    import atexit
    atexit.register(lambda: print("carveout set on", counts, file=sys.stderr))
elif variant == "default_graph":
    import gaptrace.runtime.engine.graphs as rg
    _orig = torch.cuda.CUDAGraph

    class _Default(_orig):
        def __new__(cls, keep_graph=False):
            return _orig.__new__(cls)

        def __init__(self, keep_graph=False):
            super().__init__()

        def instantiate(self):
            pass

    torch.cuda.CUDAGraph = _Default
    rg.graph_node_count = lambda g: None
elif variant in ("one_bucket", "two_graphs"):
    import gaptrace.runtime.engine.model_runner as mr
    mr.batch_buckets = lambda max_batch: [max_batch]
    if variant == "two_graphs":
        import gaptrace.runtime.engine.rounds as rounds

        def _capture_bucket(self, nb, pool):
            r = self.runner
            d = r.graphs["draft", nb] = mr.GraphedCall(f"draft_bs{nb}", r.draft_fn(nb), pool)
            r.graphs["verify", nb] = mr.GraphedCall(f"verify_bs{nb}", r.verify_fn(nb, d.outputs[0]), pool)

        rounds.ChainRound.capture_bucket = _capture_bucket
rest = sys.argv[2:]
script = rest.pop(0) if rest and rest[0].endswith(".py") else "benchmarks/bench_runtime.py"
sys.argv = [script] + rest
runpy.run_path(os.path.join(ROOT, script), run_name="__main__")
