"""benchmarks/bench_runtime.py with one variant patched in, for a side-by-side run (issue 6's bubble hunt):

    python scripts/runtime_variant.py VARIANT [bench_runtime.py arguments]

VARIANT: ``none`` (as is); ``carveout<PCT>`` (every Triton kernel's preferred shared-memory carveout set to PCT
percent: bench_node_gap.set_triton_carveout); ``default_graph`` (the runtime's graphs made by
``torch.cuda.CUDAGraph()`` instead of ``keep_graph=True`` + ``instantiate()``; no node counts then).
"""
import os
import runpy
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import torch
variant = sys.argv[1]
if variant.startswith("carveout"):
    from bench_node_gap import set_triton_carveout
    counts = set_triton_carveout(int(variant[len("carveout"):]))
    import atexit
    atexit.register(lambda: print("carveout set on", counts, file=sys.stderr))
elif variant == "default_graph":
    import gaptrace.runtime.graphs as rg
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
sys.argv = ["bench_runtime.py"] + sys.argv[2:]
runpy.run_path(os.path.join(ROOT, "benchmarks/bench_runtime.py"), run_name="__main__")
