"""What analyses derive from a trace is kept on the Trace (Trace.memo), not in module caches keyed by id(trace):
shared while the source frame is the same object, rebuilt when a new frame is assigned; device_ids is computed once
and equals the (rank, device) pairs read straight from the raw JSON."""
import gzip
import json
import os

import gaptrace
from gaptrace.analyses.occupancy import busy_timeline
from gaptrace.analyses.stacks import host_tree

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TRACE = os.path.join(ROOT, "fixtures", "traces", "h200_runtime", "h200_tiny_sync_bs1_B12.json.gz")


def test_device_ids_memo_and_invalidation():
    doc = json.load(gzip.open(TRACE))
    raw = sorted({(0, int(e["args"]["device"])) for e in doc["traceEvents"]
                  if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")})
    t = gaptrace.load_trace(TRACE)
    assert t.device_ids == raw and raw
    ids = t.device_ids
    ids.append((9, 9))  # the caller's list is its own
    assert t.device_ids == raw
    tree = host_tree(t)
    assert host_tree(t) is tree
    tl = busy_timeline(t, 0)
    assert busy_timeline(t, 0) is tl
    t.device = t.device.iloc[0:0]  # a new frame: what was derived from the old one is not reused
    assert t.device_ids == []
    assert host_tree(t) is tree  # built from trace.host, which did not change
    t2 = gaptrace.load_trace(TRACE)
    assert host_tree(t2) is not tree and t2.device_ids == raw and t2 == t2
