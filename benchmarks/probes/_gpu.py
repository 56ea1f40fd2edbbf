"""Shared by the GPU benchmark scripts: a comma list of names checked against the known ones, the median device
time of a graph's replays timed with CUDA events, and the chain of dependent add_rms_norm nodes the bubble hunt
times (benchmarks/probes/README.md)."""
from __future__ import annotations

import statistics


def name_list(ap, text: str, known: tuple, what: str) -> list[str]:
    """``text`` split on commas (order kept, repeats allowed); ``ap.error`` (exit 2, one line) on a name not in
    ``known``; ``what`` names the option's items ("kind", "stage")."""
    names = [s for s in text.split(",") if s]
    bad = [s for s in names if s not in known]
    if bad:
        ap.error(f"unknown {what} {bad[0]!r} (known: {', '.join(known)})")
    return names


def timed_replay_us(replay, replays: int, torch, prepare=None) -> float:
    """Median device time (µs) of ``replays`` calls of ``replay()`` (a graph's replay), each between two CUDA events
    recorded on the current stream, ``prepare()`` (when given) before each, outside the events; one synchronize at
    the end (the events are read after it)."""
    spans = []
    for _ in range(replays):
        if prepare is not None:
            prepare()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        replay()
        e.record()
        spans.append((s, e))
    torch.cuda.synchronize()  # SYNC (deliberate): the events are read once every replay has run
    return statistics.median(s.elapsed_time(e) * 1000 for s, e in spans)


def add_rms_norm_chain(nodes: int, device, torch):
    """A function that launches ``nodes`` dependent ``fused.add_rms_norm`` kernels on [8, 1024] bfloat16 tensors
    (the bench draft's shape; inputs made once here, on ``device``) and returns the last residual."""
    from gaptrace.runtime.models import fused

    bf16 = torch.bfloat16
    w = torch.ones(1024, device=device, dtype=bf16)
    h0, r0 = (torch.randn(8, 1024, device=device).to(bf16) for _ in range(2))

    def chain():
        h, r = h0, r0
        for _ in range(nodes):
            h, r = fused.add_rms_norm(h, r, w, 1e-6)
        return r

    chain.inputs = (h0, r0)
    return chain
