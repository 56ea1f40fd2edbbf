"""Fleets of traces: every rank file analysed as an independent task on Dask (``dask.distributed``), the results
merged into one fleet summary (:func:`gaptrace.analyses.fleet_summary.merge_fleet`; DESIGN.md "Fleets and
stragglers").

Each task loads one rank file and runs the single-trace analysis (:func:`gaptrace.analyses.summary.summarize`), and
returns only a small JSON-able result (occupancy, verdict, first cause, the collective kernels, a busy strip): the
events never leave the worker. The ranks that made the others wait get a second task each, which loads that rank
again and charges the wait intervals to its host frames (:func:`gaptrace.analyses.stragglers.charge_frames`): one
more load per late rank, none when no rank waited.

Cluster: a ``LocalCluster`` of one process per core (one thread each) by default, each worker's memory limit the
memory available now divided by the workers; or an existing cluster (``scheduler`` = its address, ``--dask-scheduler``
on the command line), whose workers' smallest memory limit is the limit. Inside a task the loader decodes on the
task's own core (it forks no decoder processes in a threaded process), so two workers on two cores do what one
serial load with two decoder processes does: expect ~1× on a 2-core machine; the gain is N machines.

Memory: every rank file is checked up front against a worker's memory limit and the fleet refused, in one line,
when one is larger: need = 200 MB + 0.9 × its JSON bytes (the loader's own estimate,
:data:`gaptrace.loader.LOAD_BYTES_PER_JSON_BYTE`; a plain file's size, a gzip file's trailer size lifted by 4 GiB
steps to at least 4× the compressed size).

Dask is imported here only when a cluster is used (``workers`` > 0 or a scheduler address); the single-trace path
(``gaptrace analyze FILE``) never imports this module. Progress per rank goes to stderr (tqdm).
"""
from __future__ import annotations

import glob
import os
import re
import sys
from typing import Any

from gaptrace.trace import TraceError

__all__ = ["fleet_files", "rank_need_bytes", "check_fleet_memory", "run_fleet", "render_fleet_text",
           "default_workers", "analyse_rank_file", "charge_rank_file", "peak_rss_bytes"]


def _has_glob(p: str) -> bool:
    return any(c in p for c in "*?[")


def fleet_files(paths: list[str]) -> list[tuple[int, str]]:
    """The (rank, file) pairs of a fleet given as one directory of rank files, a glob, or several paths (each a
    file, a directory or a glob). Ranks: a ``rank<N>`` in every file name, else the sorted order. Raises
    TraceError (one line) for a missing path, a glob matching no trace file, two files of one rank, or a file
    named twice (what :func:`gaptrace.loader.trace_files` refuses for a directory)."""
    from gaptrace.loader import trace_files

    files: list[str] = []
    for p in paths:
        if not os.path.exists(p) and _has_glob(p):
            hits = sorted(f for f in glob.glob(p) if f.endswith((".json", ".json.gz"))
                          and not f.endswith(".gaptrace.json"))
            if not hits:
                raise TraceError(f"{p}: the pattern matches no .json or .json.gz trace file")
            for f in hits:
                files.extend(f2 for _, f2 in trace_files(f))
        else:
            files.extend(f for _, f in trace_files(p))
    real = [os.path.realpath(f) for f in files]
    if len(set(real)) != len(real):
        dup = next(f for f, r in zip(files, real) if real.count(r) > 1)
        raise TraceError(f"{dup}: the same trace file is named twice in the fleet")
    ranks = [re.search(r"rank[_-]?(\d+)", os.path.basename(f)) for f in files]
    if all(ranks):
        pairs = sorted((int(m.group(1)), f) for m, f in zip(ranks, files))
        for (r, f), (r2, f2) in zip(pairs, pairs[1:]):
            if r == r2:
                raise TraceError(f"two files name rank {r} ({f}, {f2}); keep one per rank")
        return pairs
    return list(enumerate(sorted(files)))


def rank_need_bytes(path: str) -> int:
    """Memory one rank's load needs (bytes): 200 MB + 0.9 × its JSON bytes (module docstring)."""
    from gaptrace.loader import LOAD_BASE_BYTES, LOAD_BYTES_PER_JSON_BYTE, _json_size_hint, json_size_bytes

    return int(LOAD_BASE_BYTES + LOAD_BYTES_PER_JSON_BYTE * max(json_size_bytes(path), _json_size_hint(path)))


def check_fleet_memory(files: list[tuple[int, str]], limit_bytes: int) -> None:
    """TraceError (one line, the file, its need and the limit) for the first rank file whose
    :func:`rank_need_bytes` exceeds a worker's ``limit_bytes``; nothing is loaded."""
    for _, f in files:
        need = rank_need_bytes(f)
        if need > limit_bytes:
            raise TraceError(f"{f}: too big for one fleet worker: its load needs about {need / 1e9:.3g} GB, over the "
                             f"worker's memory limit of {limit_bytes / 1e9:.3g} GB (fewer --workers, or "
                             "--memory-limit-gb, or a cluster with larger workers)")


def default_workers() -> int:
    """One LocalCluster worker per core this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


# ------------------------------------------------------------------------------------------- the tasks


def analyse_rank_file(path: str, rank: int, window: str | None = None, round_name: str = "round",
                      calibration: Any = None, memory_limit_bytes: int | None = None) -> dict[str, Any]:
    """One task: load ``path`` and analyse it alone; the small result of
    :func:`gaptrace.analyses.fleet_summary.rank_result`. The rank file's capture sidecar is used as ``analyze``
    uses it; a sidecar that cannot be used is ignored with a warning in the result. TraceError / ValueError (one
    line) propagate to the caller."""
    from gaptrace.analyses import fleet_summary
    from gaptrace.analyses.summary import no_gpu_message, summarize
    from gaptrace.loader import load_trace
    from gaptrace.sidecar import as_sidecar, check_sidecar, read_sidecar_checked, sidecar_path

    import time

    t_start = time.perf_counter()
    trace = load_trace(path, memory_limit_bytes=memory_limit_bytes)
    notes = []
    side, why = read_sidecar_checked(path)
    if side is not None:
        side, why, fields = check_sidecar(side, trace, window, sidecar_path(path))
        if fields:
            notes.append(fields)
    if why:
        notes.append(f"capture sidecar ignored: {why}")
    summary = summarize(trace, window=window, sidecar=as_sidecar(side), round_name=round_name,
                        calibration=calibration).to_json()
    if not summary["devices"]:
        raise TraceError(no_gpu_message(path, trace.warnings))
    summary["warnings"] = notes + summary["warnings"]
    out = fleet_summary.rank_result(trace, summary, rank, path)
    out["task_s"] = time.perf_counter() - t_start  # load + analysis of this rank (reported under cluster)
    return out


def peak_rss_bytes() -> int:
    """This process's peak resident set so far (bytes; ru_maxrss is KiB on Linux)."""
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _cluster_info(kind: str, workers: int, limit: int, results: list[dict], peaks: dict | None) -> dict:
    return {"kind": kind, "workers": workers, "memory_limit_bytes": limit,
            "task_s": {str(r["rank"]): r.get("task_s") for r in sorted(results, key=lambda r: r["rank"])},
            "worker_peak_rss_bytes": peaks}


def charge_rank_file(path: str, rank: int, starts_us: list[float], ends_us: list[float], caused_us: float,
                     memory_limit_bytes: int | None = None) -> list[dict]:
    """The second task of a late rank: load ``path`` again and charge the wait intervals (its own clock) to its
    host sites (:func:`gaptrace.analyses.stragglers.charge_frames`)."""
    import numpy as np

    from gaptrace.analyses import stragglers
    from gaptrace.loader import load_trace

    trace = load_trace(path, memory_limit_bytes=memory_limit_bytes)
    trace_rank = int(trace.host["rank"].iloc[0]) if len(trace.host) else 0
    return stragglers.charge_frames(trace, trace_rank, np.asarray(starts_us), np.asarray(ends_us), caused_us)


# ------------------------------------------------------------------------------------------- running


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(total: int, desc: str, enabled: bool):
    """A tqdm bar on stderr, drawn only on a terminal (disable=None: a CI log gets no bar lines). Without its monitor
    thread: a second thread in this process would stop the loader from forking its decoder processes (serial runs).
    """
    if not enabled or not sys.stderr.isatty():
        return _NoBar()
    from tqdm import tqdm

    tqdm.monitor_interval = 0
    return tqdm(total=total, desc=desc, unit="rank", file=sys.stderr, leave=False)


def run_fleet(files: list[tuple[int, str]], *, workers: int | None = None, scheduler: str | None = None,
              memory_limit_bytes: int | None = None, window: str | None = None, round_name: str = "round",
              calibration: Any = None, progress: bool = True) -> dict[str, Any]:
    """Analyse every rank of ``files`` ((rank, path) pairs) and merge: the fleet summary of
    :func:`gaptrace.analyses.fleet_summary.merge_fleet`, plus ``cluster`` ({kind: serial | local | address,
    workers, memory_limit_bytes, task_s: {rank: seconds of its load + analysis}, worker_peak_rss_bytes: {worker:
    peak RSS} or None}).

    ``workers``: LocalCluster processes (default :func:`default_workers`; 0 runs the tasks one after the other in
    this process, without Dask). ``scheduler``: an existing cluster's address (then ``workers`` is ignored).
    ``memory_limit_bytes``: a worker's limit (default: MemAvailable / workers; with a scheduler, the smallest of
    its workers' limits). Raises TraceError (one line) for a rank file too big for a worker, before any load, and
    for whatever a task raises.
    """
    from gaptrace.analyses import fleet_summary
    from gaptrace.loader import default_memory_limit_bytes

    n = default_workers() if workers is None else workers
    if scheduler is None and n == 0:
        limit = memory_limit_bytes or default_memory_limit_bytes()
        check_fleet_memory(files, limit)
        bar = _progress(len(files), "ranks", progress)
        results = []
        for r, f in files:
            results.append(analyse_rank_file(f, r, window, round_name, calibration, limit))
            bar.update(1)
            bar.set_postfix_str(f"rank {r} done")
        bar.close()
        frames = {r: charge_rank_file(dict(files)[r], r, q["starts_us"], q["ends_us"], q["caused_us"], limit)
                  for r, q in fleet_summary.late_requests(results).items()}
        out = fleet_summary.merge_fleet(results, frames)
        out["cluster"] = _cluster_info("serial", 0, limit, results, {"this process": peak_rss_bytes()})
        return out
    return _run_dask(files, n, scheduler, memory_limit_bytes, window, round_name, calibration, progress)


def _run_dask(files, n, scheduler, memory_limit_bytes, window, round_name, calibration, progress):
    import logging

    try:
        from dask.distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise TraceError("a fleet of rank files runs on Dask, which is not installed: pip install 'gaptrace[fleet]' "
                         "(or --workers 0: one rank after the other, without it)") from None

    from gaptrace.analyses import fleet_summary
    from gaptrace.loader import default_memory_limit_bytes

    cluster = None
    if scheduler is None:
        limit = memory_limit_bytes or max(1, default_memory_limit_bytes() // n)
        check_fleet_memory(files, limit)  # before a worker starts
        cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, memory_limit=limit,
                               # a free port for the HTTP endpoints the scheduler always serves: a busy 8787 (another
                               # cluster) would print a warning beside the one result or error line
                               dashboard_address=":0", silence_logs=logging.CRITICAL)
        client = Client(cluster)
        kind = "local"
    else:
        try:
            client = Client(scheduler, timeout="5s")
        except (OSError, TimeoutError, ValueError) as e:
            raise TraceError(f"{scheduler}: cannot reach the Dask scheduler ({e})") from None
        limits = [w.get("memory_limit") or 0 for w in client.scheduler_info().get("workers", {}).values()]
        limit = memory_limit_bytes or (min(x for x in limits if x > 0) if any(limits) else default_memory_limit_bytes())
        n = len(limits)
        kind = scheduler
        try:
            check_fleet_memory(files, limit)
        except TraceError:
            client.close()
            raise
    try:
        futs = {client.submit(analyse_rank_file, f, r, window, round_name, calibration, limit,
                              key=f"gaptrace-rank-{r}", pure=False): r for r, f in files}
        bar = _progress(len(futs), "ranks", progress)
        results = []
        for fut in as_completed(futs):
            results.append(fut.result())  # a task's TraceError is raised here, as one line
            bar.update(1)
            bar.set_postfix_str(f"rank {futs[fut]} done")
        bar.close()
        paths = dict(files)
        late = fleet_summary.late_requests(results)
        ffuts = {r: client.submit(charge_rank_file, paths[r], r, q["starts_us"], q["ends_us"], q["caused_us"], limit,
                                  key=f"gaptrace-frames-{r}", pure=False) for r, q in late.items()}
        frames = {r: f.result() for r, f in ffuts.items()}
        try:
            peaks = client.run(peak_rss_bytes)
        except Exception:  # noqa: BLE001 (a remote cluster may refuse run(); the figure is optional)
            peaks = None
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    out = fleet_summary.merge_fleet(results, frames)
    out["cluster"] = _cluster_info(kind, n, limit, results, peaks)
    return out


# ------------------------------------------------------------------------------------------- text


def render_fleet_text(res: dict[str, Any]) -> str:
    """The fleet summary as text: the headline, one row per rank, the stragglers with their host sites, the wait
    matrix; every string from the traces escaped first (:func:`gaptrace.text.escape_strings`)."""
    from gaptrace.text import escape_strings

    res = escape_strings(res)
    parts = [*res["headline"], "", "Ranks:"]
    head = f"  {'rank':>4}  {'occupancy':>9}  {'busy w/o waiting':>16}  {'waited':>9}  {'caused':>9}  verdict / first cause"
    parts.append(head)
    for r in res["ranks"]:
        occ = f"{r['occupancy']:.1%}" if r["occupancy"] is not None else "-"
        bww = f"{r['busy_without_waiting']:.1%}" if r["busy_without_waiting"] is not None else "-"
        what = (r["verdict"] or r["bound"] or "-").replace("_", "-")
        cause = r["first_cause"] or ""
        parts.append(f"  {r['rank']:>4}  {occ:>9}  {bww:>16}  {r['waited_us'] / 1000:>6.2f} ms  "
                     f"{r['caused_us'] / 1000:>6.2f} ms  {what}" + (f"; {cause}" if cause else ""))
    c = res["collectives"]
    parts += ["", f"Collectives: {c['instances']} matched across ranks (by {'process group and Seq' if c['key_kind'] == 'seq' else 'order per kernel name'})"]
    for b in c["by_label"]:
        parts.append(f"  {b['label']}: {b['instances']} instances on {b['ranks']} ranks, mean {b['mean_dur_us']:,.0f} µs, "
                     f"waiting {b['total_wait_us'] / 1000:.2f} ms in all")
    if res["stragglers"]:
        parts += ["", "Stragglers:"]
        for s in res["stragglers"]:
            parts.append(f"  {s['line']}")
            for site in s["sites"][:3]:
                parts.append(f"    {site['share']:.0%} of the wait: {site['site']}"
                             + (f" (in range {site['range']})" if site["range"] else ""))
    m = res["wait_matrix"]
    if any(any(v > 0 for v in row) for row in m["wait_us"]):
        parts += ["", "Wait matrix (ms; row waited for column):",
                  "  " + " " * 6 + "".join(f"{r:>9}" for r in m["ranks"])]
        for r, row in zip(m["ranks"], m["wait_us"]):
            parts.append(f"  {r:>6}" + "".join(f"{v / 1000:>9.2f}" for v in row))
    warn = list(res["warnings"]) + [f"rank {r['rank']}: {w}" for r in res["ranks"] for w in (r.get("warnings") or [])]
    if warn:
        parts += ["", "Warnings:"] + [f"  - {w}" for w in warn]
    return "\n".join(parts)
