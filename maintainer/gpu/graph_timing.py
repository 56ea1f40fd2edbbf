"""Where the runtime's device time goes in the unprofiled rounds: a capture whose graph replays are timed on the
device (a CUDA event pair around each, as the capture does in the rounds after the trace) in every warm-up round, written as one
absolute device timeline, and a table of it.

Why: on the tiny bs-1 overlap captures the replay's device-bound round fell ~125 µs short of the measured unprofiled
round while the profiled draft graph's kernels summed to 1.50 ms against its 1.15 ms timed span, when the capture
timed the replays in warm-up rounds 3-8. This timeline (H100, 80 warm-up rounds) showed why: the draft graph's span
steps up with the context (1060 µs in rounds 3-5, 1260 from round 6, 1490 from round 38, 1543 by round 80; the
verify graph 695 -> 742), so the capture now times the rounds right after the profiled ones. Timed in every round,
the profiled rounds carry the event records too: a diagnostic capture, not a reference one.

  python3 maintainer/gpu/graph_timing.py capture OUT.timeline.json CAPTURE-ARGS...   (on the GPU machine; CAPTURE-ARGS
      as `gaptrace capture`, e.g. --preset tiny --device cuda --batch-size 1 --block-size 12 --prompts
      fixtures/prompts/heldout.jsonl --warmup-rounds 80 --rounds 8 --scheduler overlap -o /tmp/t.json.gz)
  python3 maintainer/gpu/graph_timing.py table OUT.timeline.json SIDECAR.gaptrace.json   (anywhere)
"""
from __future__ import annotations

import json
import sys


def capture(out: str, args: list[str]) -> None:
    """Run ``gaptrace capture ARGS`` with every warm-up round's graph replays timed, and write [[start_us, end_us,
    graph key], ...] (µs from the earliest timed replay's start event) to ``out``."""
    # the modules `gaptrace capture` imports (the runtime installed as gaptrace.runtime), not runtime.* beside them
    import gaptrace.runtime.capture_run as cr
    from gaptrace.runtime.engine import graphs as G
    from gaptrace.runtime.engine.engine import Engine

    on_round = cr.CaptureHooks.on_round

    def on_round_timed_from_2(self, event):
        if event.index == 2:  # every round from the third on (the capture itself times the rounds after the trace)
            event.time_graph_device(True)
        on_round(self, event)

    cr.CaptureHooks.on_round = on_round_timed_from_2

    def timed(self):
        gs = self.runner.graphs
        pairs = [(str(k), s, e) for k, g in gs.items() for s, e in g.device_events]
        if pairs:
            for _, _, e in pairs:
                e.synchronize()  # deliberate host sync: after the decode
            first = pairs[0][1]
            ref = min((p[1] for p in pairs), key=first.elapsed_time)
            rows = sorted((ref.elapsed_time(s) * 1e3, ref.elapsed_time(e) * 1e3, k) for k, s, e in pairs)
            with open(out, "w") as f:
                json.dump(rows, f)
        return G.device_us(gs)

    Engine.graph_device_us = timed
    from gaptrace.cli import main
    sys.argv = ["gaptrace", "capture", *args]
    main()


def table(timeline: str, sidecar: str) -> None:
    """Print each graph's device span early / mid / last 10 rounds, the gaps between consecutive replays, and the
    device period against the sidecar's kept unprofiled periods (µs)."""
    import numpy as np

    rows = json.load(open(timeline))
    per = np.array(json.load(open(sidecar))["unprofiled_round_ms"]) * 1e3
    keys = sorted({r[2] for r in rows})
    first = next((k for k in keys if "rect" in k), keys[0])
    st = np.array([r[0] for r in rows if r[2] == first])
    print(f"| {len(rows)} replays | kept unprofiled period median {np.median(per):.1f} µs | device period (start to "
          f"start of {first}) median {np.median(np.diff(st)):.1f}, last 30 {np.median(np.diff(st)[-30:]):.1f} µs |")
    print("| graph | replays | span rounds 1-6 µs | middle 10 | last 10 |\n| --- | --- | --- | --- | --- |")
    for k in keys:
        sp = np.array([r[1] - r[0] for r in rows if r[2] == k])
        n = len(sp)
        print(f"| {k} | {n} | {np.median(sp[:6]):.1f} | {np.median(sp[max(n // 2 - 5, 0):n // 2 + 5]):.1f} | "
              f"{np.median(sp[-10:]):.1f} |")
    gaps: dict = {}
    for a, b in zip(rows[:-1], rows[1:]):
        gaps.setdefault((a[2], b[2]), []).append(b[0] - a[1])
    print("| gap | n | median µs | last 10 |\n| --- | --- | --- | --- |")
    for (a, b), v in gaps.items():
        print(f"| {a} -> {b} | {len(v)} | {np.median(v):.1f} | {np.median(v[-10:]):.1f} |")


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "capture":
        capture(sys.argv[2], sys.argv[3:])
    elif len(sys.argv) == 4 and sys.argv[1] == "table":
        table(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
