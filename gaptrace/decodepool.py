"""Workers that decode spans of a ``traceEvents`` array into columns, so every core decodes.

With the compiled scanner (:mod:`gaptrace.eventscan`, which releases the GIL) the workers are threads. Without
it, msgspec holds the GIL while it decodes, so a second thread cannot share that work; forked processes can. Each
worker owns one shared anonymous memory slot (created before the fork): the reader copies a span of the
events array into it (``sep {...}, ..., {...} sep``), the worker turns the two separator bytes into ``[`` and
``]`` and decodes the slot in place with :func:`gaptrace.eventcols.decode_piece`, interning strings into its
own symbol table, and sends back the columns plus the symbols it added since its last reply. Spans are
committed in the order they were read; one that fails (a guessed cut that was wrong, odd JSON) comes back as a
failure and the reader redoes it serially from where it starts, so the result never depends on the workers.

Processes only where ``fork`` exists (Linux): elsewhere, or with ``workers=0``, the reader decodes everything
itself.
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


def default_workers(threads: bool = False) -> int:
    """Workers for a big trace: one per core (at most 4). For processes (``threads`` False), 0 where ``fork`` is
    unavailable or other threads run in this process (a notebook kernel: forking a threaded process can deadlock
    the child)."""
    if not threads and ("fork" not in multiprocessing.get_all_start_methods() or threading.active_count() > 1):
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


class _SpanDecoder:
    """One worker's side: its symbol table, and the decode of one span in its slot into columns."""

    def __init__(self, slot, scan: bool) -> None:
        self.slot = slot
        self.symbols = Symbols(scan)
        self.sent = 0

    def decode(self, n: int, rank: int) -> tuple:
        """(ok, elements, columns, the symbols added since the last reply) for the span slot[:n]."""
        ok, elements, cols = True, 0, None
        with memoryview(self.slot) as mv:
            mv[0] = 0x5B  # '['
            mv[n - 1] = 0x5D  # ']'
            try:
                with mv[:n] as piece:
                    elements, cols = decode_piece(piece, rank, self.symbols)
            except Exception:  # the reader redoes the span serially and reports any real error itself
                ok = False
        return self._reply(ok, elements, cols)

    def decode_view(self, view: memoryview, rank: int) -> tuple:
        """As :meth:`decode`, for a span read in place (``sep {...}, ..., {...} sep``, a view of the reader's
        buffer) by the compiled scanner; a span it gives up on is copied into the slot and decoded there."""
        from .eventscan import scan_piece

        try:
            done = scan_piece(view, rank, self.symbols, self.symbols.scan_state, bare=True)
        except Exception:
            done = None
        if done is None:
            self.slot = bytearray(view)
            return self.decode(len(view), rank)
        return self._reply(True, *done)

    def _reply(self, ok: bool, elements: int, cols) -> tuple:
        new = self.symbols.symbols[self.sent:]
        self.sent = len(self.symbols.symbols)
        return ok, elements, cols, new


def _serve(conn, slot: mmap.mmap, scan: bool) -> None:
    decoder = _SpanDecoder(slot, scan)
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        conn.send(decoder.decode(*msg))


class _Worker:
    """A forked decoder process with its shared-memory slot."""

    def __init__(self, ctx, slot_bytes: int, scan: bool) -> None:
        self.slot = mmap.mmap(-1, slot_bytes)
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, self.slot, scan), daemon=True, name="gaptrace-decode")
        self.proc.start()
        child.close()
        self.local: list[int] = []  # worker symbol id -> reader symbol id
        self.busy = False

    def send(self, n: int, rank: int) -> None:
        self.conn.send((n, rank))

    def recv(self) -> tuple:
        return self.conn.recv()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join()

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass

    def join(self) -> None:
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join()
        self.conn.close()
        self.slot.close()


class _ThreadWorker:
    """A decoder thread for the compiled scanner, which releases the GIL while it scans a span of the reader's
    buffer in place: nothing is copied or pickled (a span the scanner gives up on is copied and decoded by msgspec
    under the GIL: slower, same result)."""

    def __init__(self, scan: bool) -> None:
        self.decoder = _SpanDecoder(bytearray(), scan)  # a slot only for a span the scanner gives up on
        self.local: list[int] = []
        self.busy = False
        self.job: tuple | None = None
        self.done: tuple | None = None
        self.ready = threading.Semaphore(0)
        self.finished = threading.Semaphore(0)
        self.thread = threading.Thread(target=self._run, daemon=True, name="gaptrace-scan")
        self.thread.start()

    def _run(self) -> None:
        while True:
            self.ready.acquire()
            if self.job is None:
                return
            view, rank = self.job
            try:
                self.done = self.decoder.decode_view(view, rank)
            except Exception:  # never leave the reader waiting: a failed span is redone serially by the reader
                self.done = self.decoder._reply(False, 0, None)
            finally:
                view.release()
                self.job = (None, None)
                self.finished.release()

    def take(self, buf: bytearray, start: int, end: int, rank: int) -> None:
        """Decode buf[start:end] in place (the reader leaves those bytes as they are until the span is collected)."""
        self.job = (memoryview(buf)[start:end], rank)
        self.ready.release()

    def recv(self) -> tuple:
        self.finished.acquire()
        if self.done is None:
            raise EOFError("the decoder thread stopped")
        done, self.done = self.done, None
        return done

    def kill(self) -> None:
        self.stop()
        self.thread.join()
        self.finished.release()  # a recv after this sees no result

    def stop(self) -> None:
        self.job = None
        self.ready.release()

    def join(self) -> None:
        self.thread.join()


class DecodePool:
    """``workers`` decoders with a slot of ``slot_bytes`` each; spans commit in submission order.

    Forked processes by default (fork it before any reader thread starts); with ``symbols.scan_state`` threads
    that run the compiled scanner (:mod:`gaptrace.eventscan`, compiled or loaded from numba's cache first), which
    releases the GIL. ``submit`` copies a span into an idle worker's slot, or, for threads (``in_place``), hands
    over a view of it (False when no worker is idle or the span does not fit); ``collect`` waits for the oldest span's :class:`SpanResult`.
    """

    def __init__(self, workers: int, slot_bytes: int, symbols: Symbols) -> None:
        self.slot_bytes = slot_bytes
        self.symbols = symbols
        if symbols.scan_state is not None:
            from .eventscan import warm_up

            warm_up()
            self.workers = [_ThreadWorker(True) for _ in range(workers)]
            self.in_place = True  # threads read the reader's buffer itself: it must not move under them
        else:
            self.in_place = False
            ctx = multiprocessing.get_context("fork")
            self.workers = [_Worker(ctx, slot_bytes, False) for _ in range(workers)]
        self.order: deque = deque()
        self.usable = True  # False once a worker has died: the reader then decodes the rest itself

    @property
    def in_flight(self) -> int:
        return len(self.order)

    def idle(self) -> bool:
        return any(not w.busy for w in self.workers)

    def kill_one_for_tests(self) -> None:
        """Kill one worker (the tests' way to check that a dying worker changes nothing but the speed)."""
        self.workers[0].kill()

    def submit(self, buf: bytearray, start: int, end: int, rank: int) -> bool:
        """Send buf[start:end] (separator, elements, separator) to an idle worker."""
        n = end - start
        if n > self.slot_bytes:
            return False
        for w in self.workers:
            if not w.busy:
                try:
                    if self.in_place:
                        w.take(buf, start, end, rank)
                    else:
                        w.slot[:n] = buf[start:end] if n < 1 << 16 else memoryview(buf)[start:end]
                        w.send(n, rank)
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
            ok, elements, cols, new = w.recv()
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
            w.stop()
        for w in self.workers:
            w.join()
