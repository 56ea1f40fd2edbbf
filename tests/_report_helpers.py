"""Helpers shared by the report tests: a hostile synthetic trace, a tiny PNG decoder, the headless browser."""
from __future__ import annotations

import gzip
import json
import os
import shutil
import struct
import subprocess
import zlib

import numpy as np

MARK = "PWNED"
# Each payload would set the page title to MARK if it ever ran as HTML or script.
PAYLOADS = [
    f"<script>document.title='{MARK}'</script>",
    f"<img src=x onerror=\"document.title='{MARK}'\">",
    f"</script><script>document.title='{MARK}'</script>",
    f"<svg onload=\"document.title='{MARK}'\"></svg>",
    f"<a href=\"javascript:document.title='{MARK}'\">click</a>",
    f"<b onmouseover=\"document.title='{MARK}'\">bold</b> %{{x}} &amp; \u2028",
]
RAW_TAGS = ("<script>document", "<img src=x", "<svg onload", "<a href=\"javascript", "<b onmouseover")


def hostile_trace(path: str) -> str:
    """Write a small but complete Kineto trace whose kernel, frame, op, annotation and device names are all
    payloads: a Python stack, ATen ops, kernel launches, a blocking pageable copy, two graph launches of different
    sizes, host and GPU annotations, and idle gaps between device work."""
    p = PAYLOADS
    ev = []

    def x(cat, name, ts, dur, pid=100, tid=100, **args):
        ev.append({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args})

    x("python_function", f"evil.py(1): {p[0]}", 0, 2000, **{"Python id": 1, "Python parent id": 0})
    x("python_function", f"evil.py(7): {p[1]}", 10, 1900, **{"Python id": 2, "Python parent id": 1})
    x("user_annotation", p[3], 15, 1800, **{"External id": 1})
    x("cpu_op", f"aten::{p[2]}", 20, 200, **{"External id": 2})
    x("cuda_runtime", "cudaLaunchKernel", 30, 10, correlation=1, cbid=211)
    x("kernel", p[1], 50, 100, pid=0, tid=7, device=0, stream=7, correlation=1)
    x("cpu_op", "aten::_local_scalar_dense", 300, 420, **{"External id": 3})
    x("cuda_runtime", "cudaMemcpyAsync", 310, 400, correlation=2, cbid=41)
    x("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", 690, 2, pid=0, tid=7, device=0, stream=7, correlation=2,
      bytes=32)
    for k, (corr, n, t) in enumerate([(3, 3, 800), (4, 6, 1100), (5, 3, 1400), (6, 6, 1700)]):
        x("cuda_runtime", "cudaGraphLaunch", t, 20 + 3 * n, correlation=corr, cbid=311)
        for j in range(n):
            x("kernel", p[(k + j) % len(p)], t + 40 + 12 * j, 10, pid=0, tid=7, device=0, stream=7,
              correlation=corr)
    x("gpu_user_annotation", p[3], 50, 1800, pid=0, tid=7, device=0, stream=7, **{"External id": 1})
    x("gpu_user_annotation", p[4], 800, 300, pid=0, tid=7, device=0, stream=7, **{"External id": 4})
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": p[5]}], "traceEvents": ev,
           "traceName": p[0]}
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as f:
        json.dump(doc, f)
    return path


def read_png(path: str) -> np.ndarray:
    """Decode an 8-bit, non-interlaced RGB/RGBA PNG (what headless Chromium writes) into (h, w, channels) uint8.

    Filters 0-2 are vectorised per row; 3 (average) and 4 (Paeth) run a plain loop per byte (PNG spec, section 9).
    """
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, w, h, bpp = 8, [], 0, 0, 0
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        typ, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if typ == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and interlace == 0 and ctype in (2, 6), (depth, ctype, interlace)
            bpp = 3 if ctype == 2 else 4
        elif typ == b"IDAT":
            idat.append(body)
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), np.uint8).reshape(h, 1 + w * bpp)
    out = np.zeros((h, w * bpp), np.uint8)
    prev = np.zeros(w * bpp, np.int64)
    for y in range(h):
        f, line = raw[y, 0], raw[y, 1:].astype(np.int64)
        if f == 0:
            cur = line
        elif f == 1:
            cur = np.cumsum(line.reshape(w, bpp), axis=0).reshape(-1) % 256
        elif f == 2:
            cur = (line + prev) % 256
        else:
            ln, pv, c = line.tolist(), prev.tolist(), [0] * (w * bpp)
            for i in range(w * bpp):
                a = c[i - bpp] if i >= bpp else 0
                b = pv[i]
                if f == 3:
                    pred = (a + b) // 2
                else:
                    cc = pv[i - bpp] if i >= bpp else 0
                    pa, pb, pc = abs(b - cc), abs(a - cc), abs(a + b - 2 * cc)
                    pred = a if pa <= pb and pa <= pc else (b if pb <= pc else cc)
                c[i] = (ln[i] + pred) & 255
            cur = np.array(c, dtype=np.int64)
        out[y] = cur
        prev = cur
    return out.reshape(h, w, bpp)


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        p = shutil.which(name)
        if p:
            return p
    return None


def run_chromium(url: str, profile_dir: str, *extra: str, timeout: float = 90) -> subprocess.CompletedProcess:
    """Headless Chromium on ``url`` with no network, no first-run, a throwaway profile, console logged to stderr."""
    exe = chromium()
    assert exe is not None
    os.makedirs(profile_dir, exist_ok=True)
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-dev-shm-usage", f"--user-data-dir={profile_dir}", "--enable-logging=stderr", "--v=0",
           "--hide-scrollbars", "--virtual-time-budget=10000", *extra, url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def console_lines(stderr: str) -> list[str]:
    """The page's console messages (errors, warnings, logs and CSP violations) from Chromium's stderr log."""
    return [ln for ln in stderr.splitlines() if ":CONSOLE" in ln]
