"""The runtime on the GPU: ``overlap`` against ``sync`` over batch sizes x block sizes B, against the
target's plain greedy decoding (the floor), what the profiler costs, and how long a capture takes to become a report.

Per cell (scheduler, bs, B) one engine is built (CUDA graphs captured) and one decode is run on full batches of
the prompts (no request finishes inside the measured rounds, so no admission or bucket change lands there):

1. ``--warmup-rounds`` rounds, not measured (admission, prefill, the first replays);
2. ``--timed-rounds`` rounds, unprofiled, no profiler object in existence. Tround = the median period between
   consecutive rounds measured with the host clock (``time.perf_counter`` in the engine's per-round hook, which runs
   once per loop iteration: plan, enqueue round i, read round i - 1's results one round late). No sync or CUDA event
   is added: in steady state the host is throttled only by the scheduler's own one-round-late readback (an event
   wait), so the host period equals the device's. τ = mean tokens per live request-round over those rounds
   (accepted prefix + bonus), TPOT = Tround / τ (DESIGN.md "Rounds"), tokens/s = bs·τ / Tround;
3. then, in the same decode, a :class:`gaptrace.capture.Capture` is armed (one discarded profiler warm-up round)
   and ``--profiled-rounds`` rounds are recorded with Python stacks, as ``gaptrace capture`` does, with a sidecar
   holding τ per round, the graphs' node counts and unprofiled launch costs, and the unprofiled round periods of
   step 2. gaptrace's own :func:`gaptrace.analyze.run_analysis` reads the trace: decode-window occupancy (window:
   the profiled ``round`` ranges), TGPU, Thost, Tround of the profiled rounds (analyses/rounds.py), the launch
   fit's κ (µs per graph node) and ΣN (graph nodes launched per round). Reported: Tround / max(TGPU, Thost)
   (1.0 = perfectly overlapped), and the profiler's cost: profiled − unprofiled Tround and the share of it that
   κ·ΣN explains (DESIGN.md "Launch fit").

The floor: :class:`gaptrace.runtime.engine.PlainEngine`, the same runtime decoding one token per request per round
with no draft (a one-token target step, graphed per bucket), timed the same way; the speculative speed-up
TPOT_plain / TPOT_spec is shown next to τ (speed-up / τ = Tround_plain / Tround_spec: the share of the ideal).

Capture-to-report (``--capture-report-rounds R``): one cell captured over R rounds; the capture's wall time
(arming the profiler to the trace written, export included), then ``gaptrace report TRACE`` in a subprocess.

On the bench preset acceptance is simulated (each drafted token accepted with probability 0.78): τ is the law's,
not a trained pair's; timings are the real model's. Results go to ``--out``/``--name``.json and .md after every
cell (``--resume`` keeps the cells already there), and the tables are printed.

    python benchmarks/bench_runtime.py --device cuda                                   # the whole grid
    python benchmarks/bench_runtime.py --batch-sizes 8 --blocks 12 --out results       # one row, both schedulers
    python benchmarks/bench_runtime.py --no-grid --capture-report-rounds 200 --resume  # capture -> report only
    python benchmarks/bench_runtime.py --preset tiny --device cpu --batch-sizes 2 --blocks 4 \\
        --warmup-rounds 2 --timed-rounds 3 --profiled-rounds 2                         # CPU smoke run
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from _results import fmt, machine, md_table, pct, read_results, write_results  # noqa: E402


# NVTX ranges of a round (runtime/engine/): those that hold the graph replays, and all that do host work
# without waiting on the device (plan waits in the sync scheduler's lengths copy, read in overlap's event wait)
GRAPH_RANGES = ("draft", "verify", "tree")
WORK_RANGES = ("draft", "tree", "verify", "accept", "commit", "sample")


class _Stop(Exception):
    """Raised from the round hook once every needed round has run and been read back."""


def ints(text: str) -> list[int]:
    """'1,8,32' -> [1, 8, 32]."""
    return [int(x) for x in text.split(",") if x.strip()]


def gz_uncompressed_bytes(path: str) -> int | None:
    """Uncompressed size of a .gz file from its trailer (ISIZE, modulo 2**32: exact below 4 GB), else None."""
    if not path.endswith(".gz"):
        return os.path.getsize(path)
    with open(path, "rb") as f:
        f.seek(-4, os.SEEK_END)
        return struct.unpack("<I", f.read(4))[0]


def steady_decode(engine, ids: list, max_new: int, warmup: int, timed: int, profiled: int = 0,
                  trace_path: str | None = None, config: dict | None = None) -> dict:
    """Run ``engine.generate(ids)`` for ``warmup`` + ``timed`` rounds (+ 1 + ``profiled`` under the profiler),
    then stop it. Returns {periods_ms [timed], taus [timed rounds' per-request τ lists], launch_us {(phase, nb):
    [µs]}, profiled_taus, capture_s, export_s, range_ms {NVTX range: inclusive host ms per timed round}}. Raises
    RuntimeError if the decode ends too early."""
    import torch

    from gaptrace.capture import Capture
    from gaptrace.runtime.annotate import record_host_ranges
    from gaptrace.runtime.engine.graphs import collect_launch_us

    t: dict[int, float] = {}
    launch_us: dict = {}
    st = {"cap": None, "cap_t0": None, "capture_s": None, "export_s": None}
    need = warmup + timed + (1 + profiled if profiled else 0)

    def hook(i: int) -> None:
        t[i] = time.perf_counter()
        ranges.active = warmup <= i < warmup + timed  # each NVTX range's host time in the timed rounds
        if warmup < i <= warmup + timed:  # unprofiled host cost of each graph replay (two clock reads, no sync)
            collect_launch_us(engine.runner.graphs, launch_us)
        cap = st["cap"]
        if profiled and i == warmup + timed:
            st["cap_t0"] = time.perf_counter()
            cap = st["cap"] = Capture(trace_path, warmup_steps=0, active_steps=profiled, config=config,
                                      commit_on_error=False)  # its sidecar fields are added after the decode
            cap.__enter__()
        elif cap is not None and not cap.done:
            t0 = time.perf_counter()
            cap.step()
            if cap.done:  # this step stopped the profiler and exported the trace
                now = time.perf_counter()
                st["export_s"], st["capture_s"] = now - t0, now - st["cap_t0"]
        if len(engine.round_tau) >= need and (cap is None or cap.done):
            raise _Stop

    try:
        with record_host_ranges() as ranges:
            engine.generate(ids, max_new, on_round=hook)
        raise RuntimeError(f"the decode ended after {len(engine.round_tau)} rounds, before the {need} it needs")
    except _Stop:
        pass
    except BaseException as e:  # stop a profiler that is still armed; nothing half-written is kept
        if st["cap"] is not None:
            st["cap"].__exit__(type(e), e, e.__traceback__)
        raise
    finally:
        if engine.runner.device.type == "cuda":
            torch.cuda.synchronize()  # SYNC (deliberate, after the measurement): drain the abandoned rounds
    taus = engine.round_tau[warmup:warmup + timed]
    out = {"periods_ms": [1e3 * (t[i] - t[i - 1]) for i in range(warmup + 1, warmup + timed + 1)],
           "taus": taus, "launch_us": launch_us, "capture_s": st["capture_s"], "export_s": st["export_s"],
           "profiled_taus": engine.round_tau[warmup + timed + 1: need] if profiled else [], "cap": st["cap"],
           "range_ms": ranges.per_round_ms(timed)}
    return out


def timing_summary(run: dict, bs: int) -> dict:
    """Tround (median, p10, p90 of the timed periods), τ, TPOT, tokens/s from :func:`steady_decode`'s output."""
    p = sorted(run["periods_ms"])
    flat = [x for r in run["taus"] for x in r]
    tau = sum(flat) / len(flat) if flat else float("nan")
    tround = statistics.median(p)
    q = lambda f: p[min(len(p) - 1, int(f * len(p)))]  # noqa: E731
    return {"tround_ms": tround, "tround_p10_ms": q(0.1), "tround_p90_ms": q(0.9), "tau": tau,
            "tpot_ms": tround / tau, "tokens_per_s": bs * tau / tround * 1e3, "timed_rounds": len(p)}


def analyse_capture(path: str) -> dict:
    """Decode-window occupancy, the round model, the launch fit and the profiler check of one capture, from
    :func:`gaptrace.analyze.run_analysis` (times in ms)."""
    from gaptrace import load_trace
    from gaptrace.analyses.rounds import range_inclusive_us
    from gaptrace.analyze import run_analysis
    from gaptrace.capture import read_sidecar

    t0 = time.perf_counter()
    trace = load_trace(path)
    res = run_analysis(trace, sidecar=read_sidecar(path))
    out = {"analysis_s": time.perf_counter() - t0, "trace_bytes": os.path.getsize(path),
           "trace_json_bytes": gz_uncompressed_bytes(path), "window": res.get("window")}
    devs = res.get("devices") or []
    out["occupancy"] = None  # no device activity (a CPU capture)
    if devs:
        d = max(devs, key=lambda x: x["busy_us"])
        out.update(occupancy=d["occupancy"], window_ms=d["window_us"] / 1e3, window_start_us=d["window_start_us"],
                   window_end_us=d["window_end_us"], device=d["device"])
    fit = res.get("launch_fit") or {}
    out.update(kappa_us_per_node=fit.get("kappa_us_per_node"), launch_t0_us=fit.get("t0_us"), launch_r2=fit.get("r2"),
               launches=fit.get("launches"))
    rr = res.get("rounds") or {}
    s = rr.get("summary") or {}
    ms = lambda k: s[k] / 1e3 if isinstance(s.get(k), (int, float)) else None  # noqa: E731
    out.update(rounds=s.get("rounds"), t_round_ms=ms("t_round_us"), t_gpu_ms=ms("t_gpu_us"), t_host_ms=ms("t_host_us"),
               t_serial_ms=ms("t_serial_us"), blocked_ms=ms("blocked_us"), verdict=s.get("verdict"),
               bound=s.get("bound"), overlap_excess=s.get("overlap_excess"), tau=s.get("tau"),
               unprofiled_round_ms=ms("unprofiled_round_us"), profiler_excess_ms=ms("profiler_excess_us"),
               kappa_explained_ms=ms("kappa_explained_us"), kappa_explained_share=s.get("kappa_explained_share"),
               kappa_exposed_ms=ms("kappa_exposed_us"), kappa_exposed_share=s.get("kappa_exposed_share"))
    out["profiled_range_ms"] = {k: v / 1e3 for k, v in range_inclusive_us(trace).items()}
    nodes = [r.get("launch_nodes") for r in rr.get("rounds") or [] if isinstance(r.get("launch_nodes"), (int, float))]
    out["launch_nodes_per_round"] = sum(nodes) / len(nodes) if nodes else None
    tg, th = out["t_gpu_ms"], out["t_host_ms"]
    if out["t_round_ms"] and tg is not None and th is not None:
        bound = max(tg, th)
        out["ratio_round_to_bound"] = out["t_round_ms"] / bound if bound > 0 else None
        if out["kappa_us_per_node"] is not None and out["launch_nodes_per_round"] is not None:
            # the profiler's graph-launch inflation κ·ΣN lands on the host; through the overlapped round model
            # Tround ≈ max(TGPU, Thost) it lengthens the round only by what sticks out past TGPU
            host_unprof = th - out["kappa_us_per_node"] * out["launch_nodes_per_round"] / 1e3
            out["overlap_model_excess_ms"] = bound - max(tg, host_unprof)
            if out["unprofiled_round_ms"]:
                out["ratio_unprofiled_est"] = out["unprofiled_round_ms"] / max(tg, host_unprof)
    return out


def _cleanup() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def run_cell(setup, texts: list[str], kind: str, scheduler: str, bs: int, B: int, a, trace_path: str | None,
             profiled: int, timed: int | None = None, keep_trace: bool = False, kernels: str = "auto") -> dict:
    """One measured cell: ``kind`` "spec" (block-speculative, Engine) or "plain" (PlainEngine, B = 1);
    ``kernels`` as RuntimeConfig.kernels (auto | fused | eager)."""
    from gaptrace.capture import sidecar_path
    from gaptrace.runtime.capture_run import fill_batch
    from gaptrace.runtime.engine import Engine
    from gaptrace.runtime.engine import PlainEngine
    from gaptrace.runtime.session import encode_prompts

    timed = a.timed_rounds if timed is None else timed
    B_eff = 1 if kind == "plain" else B
    rc = setup.rcfg.replace(scheduler=scheduler, batch_size=bs, block_size=B_eff, kernels=kernels)
    kernels = "fused" if rc.fused_kernels else "eager"
    cs = dataclasses.replace(setup, rcfg=rc)
    W = a.warmup_rounds
    max_new = (W + timed + 1 + profiled + 3) * B_eff
    ids = encode_prompts(cs, fill_batch(texts, bs), max_new)
    t0 = time.perf_counter()
    if kind == "plain":
        engine = PlainEngine(cs.target, rc, cs.eos_token_id, draft=cs.draft)
    else:
        engine = Engine(cs.target, cs.draft, rc, cs.eos_token_id)
    build_s = time.perf_counter() - t0
    config = {"preset": cs.preset.name, "weights": cs.weights, "scheduler": scheduler, "device": rc.device,
              "dtype": rc.dtype, "batch_size": bs, "block_size": B_eff, "page_size": rc.page_size,
              "window": rc.window, "max_seq_len": rc.max_seq_len, "max_new_tokens": max_new, "kind": kind,
              "warmup_rounds": W + timed, "rounds": profiled, "cuda_graphs": bool(engine.graph_nodes),
              "kernels": kernels,
              "simulated_acceptance": rc.sim_accept_rate if cs.simulated else None}
    run = steady_decode(engine, ids, max_new, W, timed, profiled, trace_path, config)
    rec = {"kind": kind, "scheduler": scheduler, "batch_size": bs, "block_size": B_eff, "build_s": build_s,
           "kernels": kernels,
           "graph_nodes": {f"{p}_bs{nb}": g.num_nodes for (p, nb), g in sorted(engine.runner.graphs.items())},
           **timing_summary(run, bs)}
    rec["unprofiled_launch_us"] = {f"{p}_bs{nb}": statistics.median(v) for (p, nb), v in sorted(run["launch_us"].items())}
    rec["unprofiled_range_ms"] = run["range_ms"]
    cap = run["cap"]
    if cap is not None:
        graphs = []
        for (phase, nb), g in sorted(engine.runner.graphs.items()):
            host = run["launch_us"].get((phase, nb), [])
            graphs.append({"name": f"{phase}_bs{nb}", "phase": phase, "bucket": nb, "nodes": g.num_nodes,
                           "unprofiled_launch_us": statistics.median(host) if host else None,
                           "unprofiled_launches": len(host)})
        cap.extra.update({
            "rounds": [{"round": W + timed + 2 + k, "tau": sum(x) / len(x) if x else None, "accepted": list(x)}
                       for k, x in enumerate(run["profiled_taus"])],
            "graphs": graphs, "unprofiled_round_ms": run["periods_ms"], "analysis_window": "round",
            "unprofiled_range_ms": run["range_ms"],
            "simulated_acceptance": (f"acceptance simulated on the device with rate {rc.sim_accept_rate}"
                                     if cs.simulated else None)})
        cap.__exit__(None, None, None)  # writes the sidecar (the trace was written when the last round ended)
        rec["capture"] = {"profiled_rounds": profiled, "capture_s": run["capture_s"], "export_s": run["export_s"],
                          **analyse_capture(trace_path)}
        if not (a.keep_traces or keep_trace):
            for p in (trace_path, sidecar_path(trace_path)):
                if os.path.exists(p):
                    os.unlink(p)
    del engine
    _cleanup()
    return rec


def cell_key(kind: str, scheduler: str, bs: int, B: int, kernels: str = "auto") -> str:
    return f"{kind}/{scheduler}/bs{bs}/B{B}/{kernels}"


def render(data: dict) -> str:
    """The markdown tables of everything measured so far."""
    cells = [c for c in data["cells"].values() if "error" not in c]
    spec = sorted((c for c in cells if c["kind"] == "spec"),
                  key=lambda c: (c["batch_size"], -c["block_size"], c.get("kernels", "eager") != "fused",
                                 c["scheduler"] != "overlap"))
    plain = {(c["batch_size"], c.get("kernels", "eager")): c for c in cells if c["kind"] == "plain"}
    kern = lambda c: c.get("kernels", "eager")  # noqa: E731  (results before the switch ran the eager ops)
    m = data["machine"]
    cfg = data["config"]
    parts = [f"# gaptrace runtime benchmark ({cfg['preset']} preset, {cfg['dtype']}, {m.get('gpu') or 'CPU'})",
             "",
             f"{m['date']}, torch {m.get('torch')}; Tround = median host period between rounds over "
             f"{cfg['timed_rounds']} unprofiled rounds after {cfg['warmup_rounds']} warm-up rounds (no added sync); "
             f"capture columns from {cfg['profiled_rounds']} profiled rounds of the same decode, read by "
             "gaptrace's run_analysis." + (f" {cfg['simulated']}." if cfg.get("simulated") else ""),
             "", "## Rounds: overlap vs sync", ""]
    rows = []
    for c in spec:
        k = c.get("capture") or {}
        floor = plain.get((c["batch_size"], kern(c)))
        rows.append([kern(c), c["scheduler"], c["batch_size"], c["block_size"], fmt(c["tround_ms"]), fmt(c["tau"]),
                     fmt(c["tpot_ms"], 3), fmt(c["tokens_per_s"], 0), pct(k.get("occupancy")), fmt(k.get("t_round_ms")),
                     fmt(k.get("t_gpu_ms")), fmt(k.get("t_host_ms")), fmt(k.get("ratio_round_to_bound"), 3),
                     k.get("verdict") or "–",
                     fmt(floor["tpot_ms"] / c["tpot_ms"]) + "×" if floor else "–"])
    parts.append(md_table(["kernels", "scheduler", "bs", "B", "Tround ms", "τ", "TPOT ms", "tok/s", "occupancy",
                           "Tround ms (profiled)", "TGPU ms", "Thost ms", "Tround / max(TGPU, Thost)", "verdict",
                           "speed-up vs plain"], rows))
    if plain:
        parts += ["", "## Floor: the target's plain greedy decoding in the runtime (one-token graphed step, no draft)",
                  ""]
        parts.append(md_table(["kernels", "bs", "Tround = TPOT ms", "tok/s", "graph replay µs (unprofiled)"],
                              [[k, bs, fmt(p["tround_ms"], 3), fmt(p["tokens_per_s"], 0),
                                fmt(next(iter(p["unprofiled_launch_us"].values()), None), 1)]
                               for (bs, k), p in sorted(plain.items())]))
        rows = []
        for c in spec:
            floor = plain.get((c["batch_size"], kern(c)))
            if floor:
                sp = floor["tpot_ms"] / c["tpot_ms"]
                rows.append([kern(c), c["scheduler"], c["batch_size"], c["block_size"], fmt(c["tau"]), fmt(sp) + "×",
                             pct(sp / c["tau"]), fmt(c["tround_ms"] / floor["tround_ms"])])
        parts += ["", "Speculative speed-up against τ (speed-up / τ = Tround_plain / Tround_spec: the share of the "
                      "ideal τ× that the longer round leaves):", ""]
        parts.append(md_table(["kernels", "scheduler", "bs", "B", "τ", "speed-up (TPOT)", "speed-up / τ",
                               "Tround_spec / Tround_plain"], rows))
    caps = [c for c in spec if c.get("capture", {}).get("profiler_excess_ms") is not None]
    if caps:
        parts += ["", "## Profiler cost: unprofiled vs profiled round, and how much κ·ΣN explains", ""]
        parts.append(md_table(
            ["kernels", "scheduler", "bs", "B", "Tround unprofiled ms", "Tround profiled ms", "difference ms",
             "ΣN per round",
             "κ µs/node", "κ·ΣN ms", "κ·ΣN / difference", "κ·ΣN the device waited through ms",
             "waited-through / difference", "overlap-model difference ms",
             "Tround unprofiled / max(TGPU, Thost − κ·ΣN)"],
            [[kern(c), c["scheduler"], c["batch_size"], c["block_size"], fmt(c["capture"]["unprofiled_round_ms"]),
              fmt(c["capture"]["t_round_ms"]), fmt(c["capture"]["profiler_excess_ms"]),
              fmt(c["capture"]["launch_nodes_per_round"], 0), fmt(c["capture"]["kappa_us_per_node"]),
              fmt(c["capture"]["kappa_explained_ms"]), pct(c["capture"]["kappa_explained_share"]),
              fmt(c["capture"].get("kappa_exposed_ms")), pct(c["capture"].get("kappa_exposed_share")),
              fmt(c["capture"].get("overlap_model_excess_ms")) if c["capture"].get("verdict") != "serialized"
              else "n/a (serialized)", fmt(c["capture"].get("ratio_unprofiled_est"), 3)]
             for c in caps]))
        parts += ["", "κ·ΣN is the host time the profiler adds to the round's graph launches (gaptrace's launch fit); "
                      "the round grows by it only where the host is on the critical path. The overlap-model difference "
                      "= max(TGPU, Thost) − max(TGPU, Thost − κ·ΣN): what κ·ΣN should add to an overlapped round. Waited through: "
                      "per launch min(κ·N, host-wait idle of the device during the launch call), summed per round "
                      "(analyses/rounds.py): the inflation on the critical path."]
    by_range = [c for c in spec if c.get("unprofiled_range_ms") and (c.get("capture") or {}).get("profiled_range_ms")]
    if by_range:
        parts += ["", "## Profiler cost on the host, by NVTX range (inclusive host ms per round)", ""]
        rows = []
        for c in by_range:
            u, p = c["unprofiled_range_ms"], c["capture"]["profiled_range_ms"]
            excess = {k: p[k] - u[k] for k in u if k in p}
            graph = sum(excess.get(k, 0.0) for k in GRAPH_RANGES)
            kn = c["capture"].get("kappa_explained_ms")
            rows.append([kern(c), c["scheduler"], c["batch_size"], c["block_size"],
                         " · ".join(f"{k} {fmt(u[k], 3)} → {fmt(p[k], 3)}" for k in sorted(excess)),
                         fmt(graph, 3), fmt(kn, 3), pct(kn / graph) if kn is not None and graph > 0 else "–",
                         fmt(sum(v for k, v in excess.items() if k in WORK_RANGES), 3)])
        parts.append(md_table(["kernels", "scheduler", "bs", "B", "range: unprofiled → profiled",
                               "excess of the graph-launch ranges (draft, verify, tree)", "κ·ΣN ms",
                               "κ·ΣN / that excess", "excess of the work ranges ms"], rows))
        parts += ["", "Unprofiled: runtime.annotate.HostRangeTimes over the timed rounds (host clock, no sync); "
                      "profiled: analyses.rounds.range_inclusive_us over the profiled rounds. The graph-launch "
                      "ranges hold little but the graph replays, so their excess is what the launch fit's κ·ΣN "
                      "claims to be; the work ranges (everything the host does but wait: " + ", ".join(WORK_RANGES)
                  + ") add the profiler's cost on the eager ops. `round` and `read` also hold waits on the device, "
                    "which shrink when the profiled host is slower."]
    pairs = [(c, f) for c in spec if kern(c) == "eager"
             for f in spec if kern(f) == "fused" and all(f[k] == c[k] for k in ("scheduler", "batch_size", "block_size"))]
    if pairs:
        parts += ["", "## Fused kernels against eager ops (same cell, same run)", ""]
        parts.append(md_table(
            ["scheduler", "bs", "B", "Tround fused / eager", "graph nodes per round eager → fused",
             "occupancy eager → fused", "TGPU ms eager → fused", "Thost ms eager → fused"],
            [[c["scheduler"], c["batch_size"], c["block_size"], fmt(f["tround_ms"] / c["tround_ms"], 3),
              f"{fmt((c.get('capture') or {}).get('launch_nodes_per_round'), 0)} → "
              f"{fmt((f.get('capture') or {}).get('launch_nodes_per_round'), 0)}",
              f"{pct((c.get('capture') or {}).get('occupancy'))} → {pct((f.get('capture') or {}).get('occupancy'))}",
              f"{fmt((c.get('capture') or {}).get('t_gpu_ms'))} → {fmt((f.get('capture') or {}).get('t_gpu_ms'))}",
              f"{fmt((c.get('capture') or {}).get('t_host_ms'))} → {fmt((f.get('capture') or {}).get('t_host_ms'))}"]
             for c, f in pairs]))
    cr = data.get("capture_report")
    if cr and "error" not in cr:
        parts += ["", "## Capture to report", ""]
        parts.append(md_table(
            ["cell", "profiled rounds", "trace MB (gz)", "trace MB (JSON)", "capture s (arm → trace written)",
             "of which export s", "gaptrace report s", "report MB"],
            [[f"{cr['scheduler']} bs {cr['batch_size']} B {cr['block_size']}", cr["profiled_rounds"],
              fmt(cr["trace_bytes"] / 1e6, 1), fmt((cr.get("trace_json_bytes") or 0) / 1e6, 1),
              fmt(cr["capture_s"], 1), fmt(cr["export_s"], 1),
              fmt(cr["report_s"], 1) if "report_error" not in cr else "failed",
              fmt(cr["report_bytes"] / 1e6, 1) if cr.get("report_bytes") else "–"]]))
        if "report_error" in cr:
            parts += ["", f"`gaptrace report` failed: {cr['report_error']}"]
    bad = [f"{k}: {c['error']}" for k, c in data["cells"].items() if "error" in c]
    if cr and "error" in cr:
        bad.append(f"capture_report: {cr['error']}")
    bad += [f"{k}: not run ({why})" for k, why in data.get("skipped", {}).items()]
    if bad:
        parts += ["", "## Not measured", ""] + [f"- {b}" for b in bad]
    return "\n".join(parts)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="bench")
    p.add_argument("--device", default=None, help="cuda | cpu (default: cuda when available)")
    p.add_argument("--dtype", default=None, help="default: the preset's")
    p.add_argument("--max-seq-len", type=int, default=None)
    p.add_argument("--prompts", default=os.path.join(REPO, "fixtures", "prompts", "heldout.jsonl"))
    p.add_argument("--schedulers", default="overlap,sync")
    p.add_argument("--kernels", default="auto", help="comma list of RuntimeConfig.kernels to run each cell with "
                                                     "(auto | fused | eager), e.g. fused,eager side by side")
    p.add_argument("--batch-sizes", default="1,8,32", help="in the order to run them")
    p.add_argument("--blocks", default="12,8,4", help="block sizes B, in the order to run them")
    p.add_argument("--warmup-rounds", type=int, default=5)
    p.add_argument("--timed-rounds", type=int, default=30)
    p.add_argument("--profiled-rounds", type=int, default=8, help="0: no capture")
    p.add_argument("--no-floor", action="store_true", help="skip the plain greedy floor")
    p.add_argument("--no-grid", action="store_true", help="skip the grid (and floor): capture-to-report only")
    p.add_argument("--capture-report-rounds", type=int, default=0, help="e.g. 200; 0: skip")
    p.add_argument("--capture-report-cell", default="overlap,8,12", help="scheduler,bs,B")
    p.add_argument("--out", default="bench_results")
    p.add_argument("--name", default="runtime")
    p.add_argument("--work", default=None, help="where traces go (default: a temporary directory)")
    p.add_argument("--keep-traces", action="store_true")
    p.add_argument("--resume", action="store_true", help="keep the cells already in OUT/NAME.json, run the rest")
    p.add_argument("--time-budget-s", type=float, default=None,
                   help="start no cell that would end past this many seconds from the start")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--isolate", choices=("auto", "yes", "no"), default="auto",
                   help="run every cell in a process of its own (auto: on CUDA). A process that has made more than "
                        "a few CUDA graphs runs every graph node ~0.18 µs slower on an H200, so an earlier cell's "
                        "engine would slow the later cells (benchmarks/probes/README.md)")
    p.add_argument("--cell", default=None, help=argparse.SUPPRESS)  # --isolate's child: run this cell key only
    a = p.parse_args(argv)
    if a.warmup_rounds < 1 or a.timed_rounds < 1 or a.profiled_rounds < 0 or a.capture_report_rounds < 0:
        p.error("--warmup-rounds and --timed-rounds must be >= 1, --profiled-rounds and --capture-report-rounds >= 0")
    start = time.perf_counter()

    import torch

    from gaptrace.runtime.cli import read_prompts_file
    from gaptrace.runtime.session import build_setup

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)
    schedulers, sizes, blocks = a.schedulers.split(","), ints(a.batch_sizes), ints(a.blocks)
    kernel_list = a.kernels.split(",")
    texts = read_prompts_file(a.prompts)
    setup = build_setup(a.preset, seed=a.seed, device=device, dtype=a.dtype, max_seq_len=a.max_seq_len,
                        batch_size=max(sizes + [ints(a.capture_report_cell.split(",", 1)[1])[0]]))
    work = a.work or tempfile.mkdtemp(prefix="gaptrace_bench_runtime_")
    os.makedirs(work, exist_ok=True)
    os.makedirs(a.out, exist_ok=True)
    old = read_results(a.out, a.name) if a.resume else None
    data = {"machine": machine(), "cells": {}, "skipped": {},
            "config": {"preset": a.preset, "dtype": setup.rcfg.dtype, "device": device,
                       "warmup_rounds": a.warmup_rounds, "timed_rounds": a.timed_rounds,
                       "profiled_rounds": a.profiled_rounds, "weights": setup.weights,
                       "simulated": (f"acceptance simulated (rate {setup.rcfg.sim_accept_rate})"
                                     if setup.simulated else None),
                       "command": "python benchmarks/bench_runtime.py " + " ".join(sys.argv[1:] if argv is None
                                                                                   else argv)}}
    if old:
        data["cells"] = {k: c for k, c in old.get("cells", {}).items() if "error" not in c}
        if old.get("capture_report") and "error" not in old["capture_report"]:
            data["capture_report"] = old["capture_report"]

    def save() -> None:
        write_results(a.out, a.name, data, render(data))

    plan = []
    if not a.no_grid:
        for bs in sizes:
            plan += [("spec", s, bs, B, k) for B in blocks for k in kernel_list for s in schedulers]
            if not a.no_floor:
                plan += [("plain", "overlap", bs, 1, k) for k in kernel_list]
    if a.cell is not None:
        plan = [c for c in plan if cell_key(*c) == a.cell]
    isolate = a.cell is None and (a.isolate == "yes" or (a.isolate == "auto" and device == "cuda"))
    durations: list[float] = []
    for kind, sched, bs, B, kernels in plan:
        key = cell_key(kind, sched, bs, B, kernels)
        if key in data["cells"]:
            continue
        elapsed = time.perf_counter() - start
        if a.time_budget_s is not None and durations and elapsed + max(durations) > a.time_budget_s:
            data["skipped"][key] = f"time budget {a.time_budget_s:.0f} s"
            continue
        t0 = time.perf_counter()
        print(f"[{elapsed:6.1f} s] {key} ...", file=sys.stderr, flush=True)
        trace = os.path.join(work, key.replace("/", "_") + ".json")  # not gzipped: analysed, then deleted
        if isolate:
            save()  # the child resumes from what is on disk, adds its cell, and this process reads it back
            child = [sys.executable, os.path.abspath(__file__), *(sys.argv[1:] if argv is None else argv),
                     "--cell", key, "--resume", "--isolate", "no", "--capture-report-rounds", "0", "--work", work]
            r = subprocess.run(child, stdout=subprocess.DEVNULL)
            got = (read_results(a.out, a.name) or {}).get("cells", {}).get(key)
            data["cells"][key] = got if got is not None else {
                "kind": kind, "scheduler": sched, "batch_size": bs, "block_size": B, "kernels": kernels,
                "error": f"the cell's process exited {r.returncode} without a result"}
            durations.append(time.perf_counter() - t0)
            save()
            continue
        try:
            data["cells"][key] = run_cell(setup, texts, kind, sched, bs, B, a, trace,
                                          a.profiled_rounds if kind == "spec" else 0, kernels=kernels)
            data["cells"][key]["pid"] = os.getpid()  # which process ran it (--isolate: one each)
        except Exception as e:  # one bad cell (e.g. out of memory) must not lose the others
            data["cells"][key] = {"kind": kind, "scheduler": sched, "batch_size": bs, "block_size": B, "kernels": kernels,
                                  "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
            _cleanup()
        durations.append(time.perf_counter() - t0)
        c = data["cells"][key]
        print(f"           {'error: ' + c['error'] if 'error' in c else 'Tround %.3f ms, tau %.2f, %.0f tok/s' % (c['tround_ms'], c['tau'], c['tokens_per_s'])}"
              f" ({durations[-1]:.1f} s)", file=sys.stderr, flush=True)
        save()
    if a.capture_report_rounds and "capture_report" not in data:
        sched, bs, B = a.capture_report_cell.split(",")
        trace = os.path.join(work, f"capture_report_{sched}_bs{bs}_B{B}.json.gz")
        print(f"[{time.perf_counter() - start:6.1f} s] capture-to-report, {a.capture_report_rounds} rounds ...",
              file=sys.stderr, flush=True)
        try:
            rec = run_cell(setup, texts, "spec", sched, int(bs), int(B), a, trace, a.capture_report_rounds,
                           timed=min(a.timed_rounds, 5), keep_trace=True, kernels=kernel_list[0])
            cap = rec["capture"]
            data["capture_report"] = cr = {
                "scheduler": sched, "batch_size": int(bs), "block_size": int(B),
                "profiled_rounds": a.capture_report_rounds, "capture_s": cap["capture_s"], "export_s": cap["export_s"],
                "trace_bytes": cap["trace_bytes"], "trace_json_bytes": cap["trace_json_bytes"],
                "analysis_s": cap["analysis_s"], "occupancy": cap.get("occupancy"), "rounds_analysed": cap.get("rounds")}
            html = os.path.join(work, "capture_report.html")
            t0 = time.perf_counter()
            r = subprocess.run([sys.executable, "-m", "gaptrace.cli", "report", trace, "-o", html],
                               capture_output=True, text=True)
            cr["report_s"] = time.perf_counter() - t0
            if r.returncode == 0:
                cr["report_bytes"] = os.path.getsize(html)
            else:  # e.g. a CPU capture: no GPU activity to report
                cr["report_error"] = f"gaptrace report exited {r.returncode}: {r.stderr.strip()[-300:]}"
            if not a.keep_traces:
                from gaptrace.capture import sidecar_path

                for f in (trace, sidecar_path(trace), html):
                    if os.path.exists(f):
                        os.unlink(f)
        except Exception as e:
            data["capture_report"] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
            _cleanup()
        save()
    save()
    print(render(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
