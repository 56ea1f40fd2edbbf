"""Multi-rank traces built from one real single-rank capture, with a planted late rank whose answer is known by
construction (the fleet and straggler tests).

:func:`build_fleet` copies the capture into N rank files. Before each of the capture's ``round`` ranges (host time
h_k, the range's start) every rank's timeline is cut open by ``delay_us``: each event starting at or after h_k moves
``delay_us`` later, each host event (and GPU annotation) open across h_k grows by ``delay_us``, a device activity in
flight at h_k stays as it was. In that opening every rank launches one all-reduce (a ``cudaLaunchKernel`` host
event and an ``ncclDevKernel_AllReduce_Sum_f32_RING_LL`` kernel on a stream of its own, matched by a fresh
correlation id): rank r ≠ L launches at h_k + j_r (j_r = 2 + r µs), the late rank L first runs the planted host
frame ``serving/scheduler.py(412): plan`` over [h_k, h_k + delay − 6] (inside it a ``<built-in function
sorted>`` call over [h_k + 1, h_k + delay − 7]) and launches at h_k + delay − 5. Every kernel
starts 8 µs after its launch and all end together, 30 µs after the last start. Each rank's clock is its own: rank r's
times are the capture's minus r × 1,000,000.123 µs and its ``baseTimeNanoseconds`` the capture's plus r ×
1,000,000,123 ns, so aligning by the base gives back one clock.

So, by construction, rank L is late to every all-reduce and rank r ≠ L waits delay − 5 − j_r µs in each; the tests
recompute the waits from the written JSON with stdlib json and loops (:func:`raw_collectives`).
"""
from __future__ import annotations

import copy
import gzip
import json
import os

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "traces", "h200_fused",
                      "h200_bench_overlap_bs8_B12_fused.json.gz")
KERNEL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
PLANTED = "serving/scheduler.py(412): plan"
PLANTED_CALL = "<built-in function sorted>"  # what plan runs: the host sits in a call made from plan
RANK_SHIFT_NS = 1_000_000_123
NCCL_STREAM = 20
HOST_CATS = {"python_function", "cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "gpu_user_annotation",
             "Trace"}


def _load(path: str) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def _open_at(events: list[dict], h: float, delay: float) -> None:
    """Cut every event list open at h by delay (the module docstring's rule), in place."""
    for e in events:
        ts = e.get("ts")
        if not isinstance(ts, (int, float)):
            continue
        if ts >= h:
            e["ts"] = ts + delay
        elif e.get("ph") == "X" and e.get("cat") in HOST_CATS and ts + e.get("dur", 0) > h:
            e["dur"] = e["dur"] + delay


def build_fleet(out_dir: str, n_ranks: int = 4, late_rank: int = 3, delay_us: float = 600.0,
                args_on: str = "kernel", source: str = SOURCE, gzip_out: bool = False,
                rounds: int | None = None, planted: str = PLANTED) -> dict:
    """Write ``out_dir/fleet.rank<r>.json`` (or ``.json.gz``) for r < n_ranks; return what was planted:
    {late_rank, delay_us, points_us (h_k on the capture's clock), files}.

    ``args_on``: where the collective's args go: "kernel" (Kineto >= 2.2: Collective name, Process Group Name,
    Group size, Seq on the kernel), "launch" (on a ``record_param_comms`` cpu_op around the launch, sharing the
    kernel's External id; no Seq), "none" (a graph-replayed collective: only the kernel name). ``rounds``: plant
    before the first this many rounds only (default all). ``planted``: the late rank's frame name.
    """
    assert 0 <= late_rank < n_ranks and delay_us > 20
    doc = _load(source)
    ev = doc["traceEvents"]
    pid = next(e["pid"] for e in ev if e.get("cat") == "python_function")
    tid = next(e["tid"] for e in ev if e.get("cat") == "python_function")
    points = sorted(e["ts"] for e in ev if e.get("cat") == "user_annotation" and e.get("name") == "round")
    points = points[:rounds] if rounds is not None else points
    corr0 = 1 + max(int(e.get("args", {}).get("correlation", 0) or 0) for e in ev if isinstance(e.get("args"), dict))
    ext0 = 1 + max(int(e.get("args", {}).get("External id", 0) or 0) for e in ev if isinstance(e.get("args"), dict))
    os.makedirs(out_dir, exist_ok=True)
    files = []
    for r in range(n_ranks):
        d = copy.deepcopy(doc)
        events = d["traceEvents"]
        shifted = []  # h_k after the earlier openings
        for k, h in enumerate(points):
            h_now = h + k * delay_us
            _open_at(events, h_now, delay_us)
            shifted.append(h_now)
        for k, h in enumerate(shifted):
            if r == late_rank:
                launch = h + delay_us - 5.0
                events.append({"ph": "X", "cat": "python_function", "name": planted, "pid": pid, "tid": tid,
                               "ts": h, "dur": delay_us - 6.0, "args": {"Python id": 10_000_000 + k}})
                events.append({"ph": "X", "cat": "python_function", "name": PLANTED_CALL, "pid": pid, "tid": tid,
                               "ts": h + 1.0, "dur": delay_us - 8.0, "args": {"Python id": 20_000_000 + k,
                                                                             "Python parent id": 10_000_000 + k}})
            else:
                launch = h + 2.0 + r
            last = h + delay_us - 5.0 + 8.0
            corr, ext = corr0 + k, ext0 + k
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": tid,
                           "ts": launch, "dur": 4.0, "args": {"correlation": corr, "External id": ext}})
            kargs = {"External id": ext, "device": 0, "stream": NCCL_STREAM, "correlation": corr}
            comm = {"Collective name": "allreduce", "Process Group Name": "0", "Group size": n_ranks,
                    "dtype": "Float", "In msg nelems": 4096}
            if args_on == "kernel":
                kargs.update(comm, Seq=k)
            elif args_on == "launch":
                events.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": pid, "tid": tid,
                               "ts": launch - 0.5, "dur": 5.0, "args": {"External id": ext, **comm}})
            start = launch + 8.0
            events.append({"ph": "X", "cat": "kernel", "name": KERNEL, "pid": 0, "tid": NCCL_STREAM, "ts": start,
                           "dur": last + 30.0 - start, "args": kargs})
        shift_us = r * RANK_SHIFT_NS / 1000.0
        for e in events:
            if isinstance(e.get("ts"), (int, float)):
                e["ts"] = e["ts"] - shift_us
        d["baseTimeNanoseconds"] = doc["baseTimeNanoseconds"] + r * RANK_SHIFT_NS
        d["distributedInfo"] = {"backend": "nccl", "rank": r, "world_size": n_ranks}
        name = os.path.join(out_dir, f"fleet.rank{r}.json" + (".gz" if gzip_out else ""))
        data = json.dumps(d).encode()
        with (gzip.open(name, "wb") if gzip_out else open(name, "wb")) as f:
            f.write(data)
        files.append(name)
    return {"late_rank": late_rank, "delay_us": delay_us, "points_us": points, "files": files}


def raw_collectives(files: list[str]) -> dict:
    """The plain recomputation from the written JSON (stdlib json and loops): per rank its NCCL kernels in time order
    on the aligned clock (ts + (base − min base) / 1000), the k-th kernel of each rank matched, and per instance
    the waits min(max(last − start, 0), dur), the late rank and the total. Returns {instances: [{late, last,
    waits: {rank: µs}, total}], waited: {rank: µs}, caused: {rank: µs}, matrix: {(r, l): µs}}."""
    per_rank, bases = {}, {}
    for r, f in enumerate(files):
        opener = gzip.open if f.endswith(".gz") else open
        with opener(f, "rt") as fh:
            d = json.load(fh)
        bases[r] = d.get("baseTimeNanoseconds", 0)  # absent: the clocks are taken as equal, as the fleet does
        ks = []
        for e in d["traceEvents"]:
            if e.get("ph") == "X" and e.get("cat") == "kernel" and e.get("name", "").startswith("nccl"):
                ks.append((e["ts"], e["dur"]))
        ks.sort()
        per_rank[r] = ks
    ref = min(bases.values())
    n = min(len(v) for v in per_rank.values())
    out = {"instances": [], "waited": {r: 0.0 for r in per_rank}, "caused": {r: 0.0 for r in per_rank}, "matrix": {}}
    for k in range(n):
        starts = {r: per_rank[r][k][0] + (bases[r] - ref) / 1000.0 for r in per_rank}
        durs = {r: per_rank[r][k][1] for r in per_rank}
        last = max(starts.values())
        late = min(r for r in starts if starts[r] == last)
        waits = {}
        for r in starts:
            w = last - starts[r]
            if w < 0:
                w = 0.0
            if w > durs[r]:
                w = durs[r]
            waits[r] = w
            out["waited"][r] += w
            out["matrix"][(r, late)] = out["matrix"].get((r, late), 0.0) + w
        total = sum(waits.values())
        out["caused"][late] += total
        out["instances"].append({"late": late, "last": last, "waits": waits, "total": total})
    return out
