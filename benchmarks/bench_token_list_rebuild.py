"""What the fault ``token-list-rebuild`` costs one prefill, by prompt length (DESIGN.md "Known-answer faults"; in a
production scheduler, removing the full token list rebuilt on every prefill chunk cut a 64k cold prefill by 5.1%
once cached).

Per prompt length N (one request, slot 0, the preset's model, unprofiled):

1. the prefill without the fault and with it (``ModelRunner.prefill``: same chunks, same kernels; the fault feeds
   each chunk [a, b) from ``prompt + output`` rebuilt as a Python list, converted to an array, pinned and uploaded
   whole, then sliced): wall seconds from a device sync before to a device sync after (``torch.cuda.synchronize``),
   and the host seconds spent inside ``token_list_rebuild`` (perf_counter around each call);
2. the rebuild's steps timed alone on the host with the device idle (median of ``--repeats``): the list
   concatenation, ``np.array``, ``pin_memory`` and the non-blocking ``.to(device)`` enqueue, in µs.

The fault's cost is the difference of the two walls; whether the host time in the rebuild explains it (it does when
the device waits on the host, not when the host runs ahead) is the last column. Not a test: a table.

    python benchmarks/bench_token_list_rebuild.py --device cuda --tokens 16000,32000,48000,60000 --out results
    python benchmarks/bench_token_list_rebuild.py --device cpu --tokens 300,600 --chunk 64     # CPU smoke run
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _results import fmt, machine, md_table, print_and_write  # noqa: E402


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()  # SYNC (deliberate): the benchmark's wall clock starts and stops on an idle device


class StackSampler:
    """Where the main thread spends a block: its innermost ``depth`` frames sampled every ``interval_s`` from a
    background thread (``sys._current_frames``), counted per (file:line function) chain. A sampling profiler of the
    host only: no torch.profiler, no device effect."""

    def __init__(self, interval_s: float = 0.02, depth: int = 4):
        import collections
        import threading

        self.interval_s, self.depth = interval_s, depth
        self.counts = collections.Counter()
        self._main = threading.main_thread().ident
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            f = sys._current_frames().get(self._main)
            chain = []
            while f is not None and len(chain) < self.depth:
                chain.append(f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno} {f.f_code.co_name}")
                f = f.f_back
            self.counts[" < ".join(chain)] += 1

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def top(self, n: int = 8) -> list:
        """[(share of samples, chain)] of the n most sampled chains."""
        total = sum(self.counts.values()) or 1
        return [(c / total, k) for k, c in self.counts.most_common(n)]


def rebuild_steps_us(prompt: list, device, repeats: int) -> dict:
    """Host µs of each step of one rebuild of ``prompt`` (median of ``repeats``): concat, np.array, pin_memory,
    to(device) (enqueue only)."""
    import numpy as np
    import torch

    times = {"concat_us": [], "np_array_us": [], "pin_memory_us": [], "upload_us": []}
    for _ in range(repeats):
        t0 = time.perf_counter()
        full = prompt + []
        t1 = time.perf_counter()
        arr = np.array(full, dtype=np.int64)
        t2 = time.perf_counter()
        t = torch.as_tensor(arr)
        t = t.pin_memory() if device.type == "cuda" else t
        t3 = time.perf_counter()
        t.to(device, non_blocking=True)
        t4 = time.perf_counter()
        for k, a, b in (("concat_us", t0, t1), ("np_array_us", t1, t2), ("pin_memory_us", t2, t3),
                        ("upload_us", t3, t4)):
            times[k].append((b - a) * 1e6)
        _sync(device)
    return {k: statistics.median(v) for k, v in times.items()}


def run(args) -> dict:
    import numpy as np
    import torch

    import gaptrace.runtime.faults as mr
    from gaptrace.runtime.engine.model_runner import ModelRunner
    from gaptrace.runtime.engine.sequence import Request
    from gaptrace.runtime.session import build_setup

    tokens = sorted(int(t) for t in args.tokens.split(","))
    page = 64
    max_len = -(-(max(tokens) + 256) // page) * page
    setup = build_setup(args.preset, device=args.device, max_seq_len=max_len, page_size=page,
                        prefill_chunk=args.chunk, batch_size=1)
    rc = setup.rcfg
    runners = {"clean": ModelRunner(setup.target, setup.draft, rc),
               "fault": ModelRunner(setup.target, setup.draft, rc.replace(faults=("token-list-rebuild",)))}
    device = runners["clean"].device
    in_rebuild = [0.0]
    real = mr.token_list_rebuild

    def timed(*a):
        t0 = time.perf_counter()
        out = real(*a)
        in_rebuild[0] += time.perf_counter() - t0
        return out

    mr.token_list_rebuild = timed
    rng = np.random.default_rng(0)
    vocab = setup.target.config.vocab_size
    rows, t_start = [], time.perf_counter()
    with torch.no_grad():
        for name, r in runners.items():  # warm-up: kernels compiled, allocator primed (two chunks)
            warm = rng.integers(0, vocab, 2 * args.chunk).tolist()
            r.blocks.ensure(0, len(warm) + rc.round_span)
            r.upload_page_tables()
            r.prefill(0, warm, Request(0, warm, 1))
            r.blocks.free(0)
        _sync(device)
        for n in tokens:
            if time.perf_counter() - t_start > args.time_budget_s:
                print(f"time budget {args.time_budget_s:.0f} s spent: {n} tokens and longer skipped", flush=True)
                break
            prompt = rng.integers(0, vocab, n).tolist()
            row = {"tokens": n, "chunks": -(-n // args.chunk)}
            for name in args.order.split(","):
                r = runners[name]
                r.blocks.ensure(0, n + rc.round_span)
                r.upload_page_tables()
                in_rebuild[0] = 0.0
                _sync(device)
                t0 = time.perf_counter()
                with StackSampler() as sampler:
                    r.prefill(0, prompt, Request(0, prompt, 1))
                    t1 = time.perf_counter()
                    _sync(device)
                t2 = time.perf_counter()
                row[f"{name}_host_samples"] = [[round(s, 3), k] for s, k in sampler.top()]
                r.blocks.free(0)
                row[f"{name}_wall_s"], row[f"{name}_enqueue_s"] = t2 - t0, t1 - t0
                if name == "fault":
                    row["fault_in_rebuild_s"] = in_rebuild[0]
                print(f"[{time.perf_counter() - t_start:7.1f} s] {n} tokens {name}: {t2 - t0:.2f} s", flush=True)
            row.update(rebuild_steps_us(prompt, device, args.repeats))
            rows.append(row)
    mr.token_list_rebuild = real
    return {"machine": machine(), "preset": args.preset, "device": str(device), "chunk": args.chunk,
            "max_seq_len": max_len, "weights": setup.weights, "rows": rows}


def markdown(res: dict) -> str:
    head = (f"# token-list-rebuild: one prefill, by prompt length\n\n{res['machine'].get('date')}, "
            f"{res['machine'].get('gpu') or res['device']}, preset {res['preset']} ({res['weights']}), chunk "
            f"{res['chunk']}, context {res['max_seq_len']}; walls from a device sync to a device sync.\n\n")
    t1 = md_table(["tokens", "chunks", "clean s", "fault s", "fault / clean", "fault − clean s",
                   "host in rebuild s", "enqueue clean / fault s"],
                  [[fmt(r["tokens"]), fmt(r["chunks"]), fmt(r["clean_wall_s"], 3), fmt(r["fault_wall_s"], 3),
                    fmt(r["fault_wall_s"] / r["clean_wall_s"], 3), fmt(r["fault_wall_s"] - r["clean_wall_s"], 3),
                    fmt(r["fault_in_rebuild_s"], 3), f"{fmt(r['clean_enqueue_s'], 3)} / {fmt(r['fault_enqueue_s'], 3)}"]
                   for r in res["rows"]])
    t2 = md_table(["tokens", "concat µs", "np.array µs", "pin_memory µs", "upload enqueue µs", "sum × chunks s"],
                  [[fmt(r["tokens"]), fmt(r["concat_us"], 1), fmt(r["np_array_us"], 1), fmt(r["pin_memory_us"], 1),
                    fmt(r["upload_us"], 1),
                    fmt(r["chunks"] * (r["concat_us"] + r["np_array_us"] + r["pin_memory_us"] + r["upload_us"]) / 1e6,
                        3)]
                   for r in res["rows"]])
    t3 = md_table(["tokens", "run", "share of samples", "main thread (innermost first)"],
                  [[fmt(r["tokens"]), name, f"{100 * s:.0f}%", f"`{k}`"] for r in res["rows"]
                   for name in ("clean", "fault") for s, k in r.get(f"{name}_host_samples", [])[:4]])
    return (head + t1 + "\n\nOne rebuild's host steps, device idle (median):\n\n" + t2
            + "\n\nWhere the host was during each prefill (sampled every 20 ms, the sync at the end included):\n\n"
            + t3 + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tokens", default="16000,32000,48000,60000", help="prompt lengths, comma-separated")
    ap.add_argument("--chunk", type=int, default=256, help="prefill chunk (tokens)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--order", default="clean,fault", help="which prefill runs first at each length (fault,clean: the "
                    "fault on a cold pinned-memory cache)")
    ap.add_argument("--time-budget-s", type=float, default=400.0, help="no new length is started after this")
    ap.add_argument("--out", default=None, help="write token_list_rebuild.json/.md here")
    args = ap.parse_args(argv)
    res = run(args)
    return print_and_write(args.out, "token_list_rebuild", res, markdown(res))


if __name__ == "__main__":
    sys.exit(main())
