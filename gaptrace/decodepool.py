"""Worker processes that decode spans of a ``traceEvents`` array into columns, so both cores decode.

msgspec holds the GIL while it decodes, so a second thread cannot share that work; forked processes can. Each
worker owns one shared anonymous memory slot (created before the fork): the reader copies a span of the
events array into it (``sep {...}, ..., {...} sep``), the worker turns the two separator bytes into ``[`` and
``]`` and decodes the slot in place with :func:`gaptrace.eventcols.decode_piece`, interning strings into its
own symbol table, and sends back the columns plus the symbols it added since its last reply. Spans are
committed in the order they were read; one that fails (a guessed cut that was wrong, odd JSON) comes back as a
failure and the reader redoes it serially from where it starts, so the result never depends on the workers.

Only where ``fork`` exists (Linux): elsewhere, or with ``workers=0``, the reader decodes everything itself.
"""
from __future__ import annotations

import mmap
import multiprocessing
import os
import threading
from collections import deque
from dataclasses import dataclass

import numpy as np

from .eventcols import Symbols, decode_piece

__all__ = ["DecodePool", "SpanResult", "default_workers"]


def default_workers() -> int:
    """Worker processes for a big trace: one per core (at most 4); 0 where ``fork`` is unavailable or other
    threads run in this process (a notebook kernel: forking a threaded process can deadlock the child)."""
    if "fork" not in multiprocessing.get_all_start_methods() or threading.active_count() > 1:
        return 0
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return min(4, cores) if cores > 1 else 0


@dataclass
class SpanResult:
    ok: bool
    elements: int
    cols: dict | None
    table: np.ndarray  # the worker's symbol ids -> the reader's, with a trailing -1


def _serve(conn, slot: mmap.mmap) -> None:
    symbols = Symbols()
    sent = 0
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        n, rank = msg
        ok, elements, cols = True, 0, None
        with memoryview(slot) as mv:
            mv[0] = 0x5B  # '['
            mv[n - 1] = 0x5D  # ']'
            try:
                with mv[:n] as piece:
                    elements, cols = decode_piece(piece, rank, symbols)
            except Exception:  # the reader redoes the span serially and reports any real error itself
                ok = False
        new = symbols.symbols[sent:]
        sent = len(symbols.symbols)
        conn.send((ok, elements, cols, new))


class _Worker:
    def __init__(self, ctx, slot_bytes: int) -> None:
        self.slot = mmap.mmap(-1, slot_bytes)
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, self.slot), daemon=True, name="gaptrace-decode")
        self.proc.start()
        child.close()
        self.local: list[int] = []  # worker symbol id -> reader symbol id
        self.busy = False


class DecodePool:
    """``workers`` forked decoders with a slot of ``slot_bytes`` each; spans commit in submission order.

    Fork it before any reader thread starts. ``submit`` copies a span into an idle worker's slot (False when no
    worker is idle or the span does not fit); ``collect`` waits for the oldest span's :class:`SpanResult`.
    """

    def __init__(self, workers: int, slot_bytes: int, symbols: Symbols) -> None:
        ctx = multiprocessing.get_context("fork")
        self.slot_bytes = slot_bytes
        self.symbols = symbols
        self.workers = [_Worker(ctx, slot_bytes) for _ in range(workers)]
        self.order: deque[_Worker] = deque()
        self.usable = True  # False once a worker has died: the reader then decodes the rest itself

    @property
    def in_flight(self) -> int:
        return len(self.order)

    def idle(self) -> bool:
        return any(not w.busy for w in self.workers)

    def kill_one_for_tests(self) -> None:
        """SIGKILL one worker (the tests' way to check that a dying worker changes nothing but the speed)."""
        self.workers[0].proc.kill()
        self.workers[0].proc.join()

    def submit(self, buf: bytearray, start: int, end: int, rank: int) -> bool:
        """Send buf[start:end] (separator, elements, separator) to an idle worker."""
        n = end - start
        if n > self.slot_bytes:
            return False
        for w in self.workers:
            if not w.busy:
                w.slot[:n] = buf[start:end] if n < 1 << 16 else memoryview(buf)[start:end]
                try:
                    w.conn.send((n, rank))
                except OSError:  # the worker died
                    self.usable = False
                    return False
                w.busy = True
                self.order.append(w)
                return True
        return False

    def collect(self) -> SpanResult:
        """The oldest span's result; a failed one (``ok`` False) if its worker died (the pool is then unusable)."""
        w = self.order.popleft()
        w.busy = False
        try:
            ok, elements, cols, new = w.conn.recv()
        except (EOFError, OSError):
            self.usable = False
            return SpanResult(False, 0, None, np.array([-1], np.int32))
        w.local.extend(self.symbols.intern(s) for s in new)
        table = np.array(w.local + [-1], dtype=np.int32)
        return SpanResult(ok, elements, cols, table)

    def close(self) -> None:
        while self.order:
            self.collect()
        for w in self.workers:
            try:
                w.conn.send(None)
            except OSError:
                pass
        for w in self.workers:
            w.proc.join(timeout=5)
            if w.proc.is_alive():
                w.proc.terminate()
                w.proc.join()
            w.conn.close()
            w.slot.close()
