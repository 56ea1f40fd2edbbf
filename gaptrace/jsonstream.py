"""Streaming a Kineto JSON document: chunks of bytes in, pieces of the ``traceEvents`` array out.

The file is read in chunks of ``chunk_bytes`` straight into a fixed buffer; a gzip file is gunzipped on a
background thread (zlib releases the GIL, so the second core decompresses while the first decodes).
:class:`DocumentReader` walks the top-level document (an object, or a bare list of events) and holds a few
chunks of it at most:

- inside ``traceEvents`` it cuts the buffer after the last ``}`` that looks like an element end (``}`` then
  ``,{`` or ``]``, found by a regex over the buffer's tail) and hands ``[`` + that piece + ``]`` to the sink's
  msgspec decoder, in place (or to a worker process, :mod:`gaptrace.decodepool`). A successful decode proves
  the cut: the piece is a sequence of complete elements, because a cut inside a string or a nested value
  leaves it unbalanced. When the decode fails, the exact cut is found by :func:`bracket_depths` (vectorised:
  quote parity with backslash escapes, bracket depth by cumsum; about 3 ns a byte, so only on that path) and
  the piece is decoded again; if it still fails there, the JSON itself is bad (stdlib json gets the last word,
  for the ``NaN`` / ``Infinity`` it accepts and msgspec does not);
- every other top-level value (metadata such as ``deviceProperties``, before or after ``traceEvents``) is
  delimited exactly and parsed with stdlib ``json``, as the reference reader would.

Errors are :class:`~gaptrace.trace.TraceError`, one line naming the file: truncated or corrupt gzip, not JSON,
a document that ends before it closes (truncated), no ``traceEvents`` list, an empty ``traceEvents``.
"""
from __future__ import annotations

import json
import os
import queue
import re
import stat
import sys
import threading
import zlib
from collections import deque
from typing import Any

import msgspec
import numpy as np

from .trace import TraceError

__all__ = ["ChunkReader", "DocumentReader", "JsonBudget", "bracket_depths", "CHUNK_BYTES", "MAX_VALUE_BYTES"]

CHUNK_BYTES = 8 << 20
_GZIP_MAGIC = b"\x1f\x8b"
_WS = re.compile(rb"[ \t\r\n]*")
_SCALAR = re.compile(rb"[^ \t\r\n,\]}]*")
# an element end inside the events array: "}" followed by ",{" or by "]"
_ELEMENT_END = re.compile(rb"\}[ \t\r\n]*(?:,[ \t\r\n]*\{|\])")

# One event or one metadata value larger than this is refused: Kineto's are at most a few KB (deviceProperties,
# a kernel with a long templated name), and bounding it keeps the search for a value's end linear in the file.
MAX_VALUE_BYTES = 64 << 20
_NONZERO = re.compile(rb"[^\x00]")
_MIN_FEED, _MAX_FEED = 1 << 12, 1 << 22

NESTED_TOO_DEEP = "JSON nested too deeply to read (arrays or objects thousands of levels deep)"


_NOT_WS = np.ones(256, dtype=bool)
_NOT_WS[list(b" \t\r\n")] = False
_WS_BLOCK = 1 << 20


def _skip_whitespace(buf: bytearray, pos: int, end: int) -> int:
    """The first position in ``buf[pos:end]`` that is not JSON whitespace (``end`` if none). A short run is
    matched by the regex; a long one (gigabytes of spaces in a small gzip) is scanned by numpy in 1 MiB blocks,
    ten times the regex's speed."""
    stop = _WS.match(buf, pos, min(end, pos + 256)).end()
    if stop < min(end, pos + 256) or stop == end:
        return stop
    while stop < end:
        n = min(_WS_BLOCK, end - stop)
        hit = _NOT_WS[np.frombuffer(buf, np.uint8, n, stop)]
        if hit.any():
            return stop + int(hit.argmax())
        stop += n
    return end


class JsonBudget:
    """The decompressed JSON bytes a load may read (``max_bytes``, from a memory limit of ``limit_bytes``), counted
    over all the files of one load as they stream; :meth:`take` raises TraceError past it."""

    def __init__(self, max_bytes: int, limit_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.limit_bytes = limit_bytes
        self.read_bytes = 0

    def take(self, n: int, path: str) -> None:
        self.read_bytes += n
        if self.read_bytes > self.max_bytes:
            raise TraceError(f"{path}: too big to load here: more than {self.max_bytes / 1e9:.2f} GB of JSON "
                             f"(counted while decompressing) needs more than the limit of "
                             f"{self.limit_bytes / 1e9:.3g} GB of memory")


class ChunkReader:
    """The decompressed bytes of one file, copied into the caller's buffer by :meth:`readinto`.

    A plain file is read straight into that buffer. A gzip file is decompressed on a daemon thread (zlib
    releases the GIL, so this runs on the other core) into pieces of at most ``chunk_bytes``, two ahead.
    Raises TraceError for a read error, a truncated or corrupt gzip stream (checked by zlib: deflate end
    marker, CRC-32 and length trailer), or trailing garbage after the last gzip member. Multi-member gzip files
    are read like ``gzip.decompress`` reads them (zero padding after a member is skipped).
    """

    def __init__(self, path: str, chunk_bytes: int = CHUNK_BYTES, budget: JsonBudget | None = None) -> None:
        self.path = path
        self.chunk_bytes = chunk_bytes
        self.budget = budget
        try:  # O_NONBLOCK: a FIFO put in place after the listing's check must not block the open
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        except OSError as e:
            raise TraceError(f"{path}: cannot read ({e.strerror or e})") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise TraceError(f"{path}: not a regular file (a FIFO, socket or device)")
        try:
            if hasattr(os, "set_blocking"):
                os.set_blocking(fd, True)
            self._file = os.fdopen(fd, "rb")
            self.gzip = self._file.read(2) == _GZIP_MAGIC
            self._file.seek(0)
        except OSError as e:
            raise TraceError(f"{path}: cannot read ({e.strerror or e})") from None
        self._rest = memoryview(b"")
        self._done = False
        self._thread = None
        if self.gzip:
            self._q: queue.Queue = queue.Queue(maxsize=3)
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._run, name="gaptrace-gunzip", daemon=True)
            self._thread.start()

    def readinto(self, mv: memoryview) -> int:
        """Fill ``mv`` as far as the data goes; the number of bytes written, 0 at the end of the file."""
        if not self.gzip:
            try:
                n = self._file.readinto(mv)
            except OSError as e:
                raise TraceError(f"{self.path}: cannot read ({e})") from None
            if self.budget is not None:
                self.budget.take(n, self.path)
            return n
        n = self._gzip_readinto(mv)
        if self.budget is not None:
            self.budget.take(n, self.path)
        return n

    def _gzip_readinto(self, mv: memoryview) -> int:
        n = 0
        while n < len(mv):
            if not self._rest:
                if self._done:
                    break
                item = self._q.get()
                if isinstance(item, BaseException):
                    self._done = True
                    raise item
                if not item:
                    self._done = True
                    break
                self._rest = memoryview(item)
            k = min(len(mv) - n, len(self._rest))
            mv[n:n + k] = self._rest[:k]
            self._rest = self._rest[k:]
            n += k
        return n

    def close(self) -> None:
        if self._thread is not None:
            self._stop.set()
            while self._thread.is_alive():
                try:
                    self._q.get(timeout=0.05)
                except queue.Empty:
                    pass
            self._thread.join()
        self._file.close()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            self._gunzip(self._file)
            self._put(b"")
        except TraceError as e:
            self._put(e)
        except OSError as e:
            self._put(TraceError(f"{self.path}: cannot read ({e})"))
        except BaseException as e:  # never leave the consumer waiting
            self._put(TraceError(f"{self.path}: reading failed ({type(e).__name__}: {e})"))

    def _gunzip(self, f) -> None:
        """Decompress every member of ``f`` into pieces of at most ``chunk_bytes``.

        Input is fed from a memoryview of each 4 MiB read, in slices that start at 4 KiB and double while one
        member goes on: what zlib copies at a member's end (``unused_data``) is at most the last slice, about the
        member's own size, so a file of many tiny members costs its size, not members x read size.
        """
        buf, off, d, step, members = b"", 0, None, _MIN_FEED, 0
        while not self._stop.is_set():
            if d is None:  # between members: skip zero padding, then a member must start
                m = _NONZERO.search(buf, off)
                if m is None:
                    buf, off = f.read(_MAX_FEED), 0
                    if not buf:
                        if members:
                            return
                        raise TraceError(f"{self.path}: truncated gzip (no compressed data)")
                    continue
                off = m.start()
                if len(buf) - off < 2:
                    more = f.read(_MAX_FEED)
                    if not more:
                        raise TraceError(f"{self.path}: corrupt gzip (trailing garbage after the compressed data)")
                    buf, off = buf[off:] + more, 0
                    continue
                if buf[off:off + 2] != _GZIP_MAGIC:
                    raise TraceError(f"{self.path}: corrupt gzip (trailing garbage after the compressed data)")
                d, step, members = zlib.decompressobj(16 + zlib.MAX_WBITS), _MIN_FEED, members + 1
            with memoryview(buf) as mv:
                piece = mv[off:off + step]
                try:
                    out = d.decompress(piece, self.chunk_bytes)
                except zlib.error as e:
                    raise TraceError(f"{self.path}: corrupt gzip ({e})") from None
                fed = len(piece)
                piece.release()
            if d.eof:  # (after the end marker unconsumed_tail repeats unused_data)
                off += fed - len(d.unused_data)
                d = None
            else:
                off += fed - len(d.unconsumed_tail)
                if not d.unconsumed_tail:
                    step = min(2 * step, _MAX_FEED)
                if off >= len(buf) and len(out) < self.chunk_bytes:  # input used up, no output pending
                    buf, off = f.read(_MAX_FEED), 0
                    if not buf:
                        raise TraceError(f"{self.path}: truncated gzip (the compressed stream ends before its end "
                                         "marker)")
            if out and not self._put(out):
                return


def bracket_depths(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Brackets outside strings in a byte array that starts outside any string.

    Returns ``(positions, depth, quotes)``: the positions of ``{ [ } ]`` that are not inside a string, the nesting
    depth just after each (opening +1, closing -1, starting from 0), and the positions of the unescaped quotes.
    A quote is escaped when an odd run of backslashes precedes it. All numpy, no loop over bytes.
    """
    quotes = np.flatnonzero(a == 0x22)
    bs = np.flatnonzero(a == 0x5C)
    if bs.size:
        brk = np.flatnonzero(np.diff(bs) != 1)
        run_start = np.concatenate(([bs[0]], bs[brk + 1]))
        run_end = np.concatenate((bs[brk], [bs[-1]]))
        escaped = run_end[((run_end - run_start) & 1) == 0] + 1  # odd run length
        quotes = quotes[~np.isin(quotes, escaped)]
    folded = a | 0x20  # '[' -> '{', ']' -> '}'; no other byte maps onto them
    pos = np.flatnonzero((folded == 0x7B) | (folded == 0x7D))
    pos = pos[(np.searchsorted(quotes, pos) & 1) == 0]
    depth = np.cumsum(np.where(folded[pos] == 0x7B, 1, -1), dtype=np.int64)
    return pos, depth, quotes


class DocumentReader:
    """Walks one trace document, handing ``traceEvents`` pieces to ``sink`` and collecting the other keys.

    ``sink`` has ``add_json(piece)`` (raises ``msgspec.DecodeError`` on malformed JSON and changes nothing then),
    ``add_python(events)``, ``discard_rank()`` and ``elements``. After :meth:`read`, ``metadata`` holds every
    top-level key except ``traceEvents`` (empty for a bare list), parsed by stdlib json.
    """

    def __init__(self, path: str, sink, chunk_bytes: int = CHUNK_BYTES, pool=None,
                 budget: JsonBudget | None = None) -> None:
        self.path = path
        self.budget = budget
        self.sink = sink
        self.chunk_bytes = chunk_bytes
        self.pool = pool  # a DecodePool, or None to decode everything here
        self.pin: int | None = None  # absolute offset _more must keep (the oldest span a worker still holds)
        self.metadata: dict[str, Any] = {}
        # the data is buf[:end]; grows (2x) only when it must. With workers, the spans they hold stay live: room
        # for several chunks behind them makes moving the live bytes to the front rare
        self.buf = bytearray((2 + 4 * len(pool.workers) if pool is not None else 2) * chunk_bytes)
        self.end = 0
        self.pos = 0
        self.dropped = 0  # stream offset of buf[0] (bytes dropped from the front)
        self.eof = False
        self._reader: ChunkReader | None = None
        self._spare: bytearray | None = None  # the buffer before the last move (decoder threads may still read it)

    # ---- errors
    def _fail(self, what: str) -> TraceError:
        return TraceError(f"{self.path}: {what}")

    def _truncated(self) -> TraceError:
        return self._fail(f"JSON ends before the document closes at byte {self.dropped + self.end:,} "
                          "(truncated file?)")

    def _not_json(self, what: str, at: int) -> TraceError:
        return self._fail(f"not valid JSON ({what} near byte {self.dropped + at:,})")

    def _check_size(self, start: int, what: str) -> None:
        """TraceError when the value starting at ``start`` has not closed within MAX_VALUE_BYTES."""
        if self.end - start > MAX_VALUE_BYTES:
            raise self._fail(f"{what} at byte {self.dropped + start:,} is over {MAX_VALUE_BYTES >> 20} MiB long "
                             "(no Kineto event or metadata value is): refusing to read it")

    # ---- buffer
    def _more(self, keep_from: int) -> bool:
        """Read up to ``chunk_bytes`` more (buf[:keep_from] may be dropped to make room); False at the end.

        The buffer has a fixed capacity: the live bytes move to its front only when a chunk does not fit behind
        them (into a bigger buffer only when they do not fit at all); the reader writes straight into it.
        """
        if self.eof:
            return False
        if self.pin is not None:
            keep_from = min(keep_from, self.pin - self.dropped)
        if self.end + self.chunk_bytes > len(self.buf):
            live = self.end - keep_from
            if live + self.chunk_bytes > len(self.buf):
                bigger = bytearray(max(2 * len(self.buf), live + 2 * self.chunk_bytes))
                bigger[:live] = memoryview(self.buf)[keep_from:self.end]
                self.buf = bigger
            elif self.pin is not None and getattr(self.pool, "in_place", False):
                # decoder threads are reading spans of this buffer: the live bytes go to the spare one instead (a
                # memoryview holds a reference to its buffer, so the spare is free when only we refer to it)
                free = (self._spare is not None and len(self._spare) == len(self.buf)
                        and sys.getrefcount(self._spare) == 2)  # the attribute and the call's argument
                spare = self._spare if free else bytearray(len(self.buf))
                spare[:live] = memoryview(self.buf)[keep_from:self.end]
                self._spare, self.buf = self.buf, spare
                del spare
            else:
                with memoryview(self.buf) as mv:
                    mv[:live] = mv[keep_from:self.end]
            self.dropped += keep_from
            self.pos -= keep_from
            self.end = live
        with memoryview(self.buf) as mv, mv[self.end:self.end + self.chunk_bytes] as room:
            n = self._reader.readinto(room)
        if n == 0:
            self.eof = True
            return False
        self.end += n
        return True

    def _peek(self) -> int | None:
        """Skip whitespace; the next byte (reading more as needed), or None at the end of the file."""
        while True:
            self.pos = _skip_whitespace(self.buf, self.pos, self.end)
            if self.pos < self.end:
                return self.buf[self.pos]
            if not self._more(self.pos):
                return None

    def _expect(self) -> int:
        c = self._peek()
        if c is None:
            raise self._truncated()
        return c

    # ---- document
    def read(self) -> None:
        self._reader = ChunkReader(self.path, self.chunk_bytes, self.budget)
        try:
            self._read()
        finally:
            self._reader.close()
            self.buf = bytearray()
            self.end = 0

    def _read(self) -> None:
        c = self._peek()
        if c is None:
            raise self._fail("empty file (not a JSON trace)")
        if self.buf.startswith(b"\xef\xbb\xbf", self.pos, self.end):  # UTF-8 byte order mark, as json.loads allows
            self.pos += 3
            c = self._expect()
        if c == ord("["):
            self._events()
        elif c == ord("{"):
            self._object()
        else:
            raise self._not_json("a JSON trace starts with '{' or '['", self.pos)
        if self._peek() is not None:
            raise self._not_json("extra data after the document", self.pos)

    def _object(self) -> None:
        self.pos += 1
        events_seen = events_ok = False
        c = self._expect()
        while c != ord("}"):
            if c != ord('"'):
                raise self._not_json("expected a key", self.pos)
            key = self._value()
            if self._expect() != ord(":"):
                raise self._not_json("expected ':'", self.pos)
            self.pos += 1
            c = self._expect()
            if key == "traceEvents":
                if events_seen:
                    self.sink.discard_rank()
                events_seen = True
                events_ok = c == ord("[")
                if events_ok:
                    self._events()
                else:
                    self._value()
            else:
                self.metadata[key] = self._value()
            c = self._expect()
            if c == ord(","):
                self.pos += 1
                c = self._expect()
                if c == ord("}"):
                    raise self._not_json("trailing comma", self.pos)
            elif c != ord("}"):
                raise self._not_json("expected ',' or '}'", self.pos)
        self.pos += 1
        if not events_ok:
            raise self._fail("no 'traceEvents' list (is this a Kineto/Chrome trace?)")

    def _value(self) -> Any:
        """Parse the (non-events) JSON value at pos with stdlib json; pos moves past it."""
        start = self.pos
        while True:
            end = self._value_end(start)
            if end is not None:
                break
            self._check_size(start, "a metadata value")
            if self.pool is None and self.end - start >= self.chunk_bytes:
                self.chunk_bytes = min(2 * self.chunk_bytes, MAX_VALUE_BYTES)
            if not self._more(start):
                raise self._truncated()
            start = self.pos
        try:
            value = json.loads(bytes(self.buf[start:end]))
        except json.JSONDecodeError as e:
            raise self._not_json(e.msg, start + e.pos) from None
        except (ValueError, UnicodeDecodeError) as e:
            raise self._not_json(str(e).split(":")[0], start) from None
        except RecursionError:
            raise self._not_json(NESTED_TOO_DEEP, start) from None
        self.pos = end
        return value

    def _value_end(self, start: int) -> int | None:
        """End (exclusive) of the JSON value starting at ``start``, or None when the buffer ends first.

        Containers and strings are delimited by :func:`bracket_depths` over a window that grows 4x until the
        value closes inside it (metadata values are small; this keeps each one's cost near its own size).
        """
        c = self.buf[start]
        if c in b"{[\"":
            window = 1 << 16
            while True:
                stop = min(self.end, start + window)
                pos, depth, quotes = bracket_depths(np.frombuffer(bytes(self.buf[start:stop]), np.uint8))
                if c == ord('"'):
                    if len(quotes) > 1:
                        return start + int(quotes[1]) + 1
                else:
                    closed = np.flatnonzero(depth == 0)
                    if closed.size:
                        return start + int(pos[closed[0]]) + 1
                if stop == self.end:
                    return None
                window *= 4
        end = _SCALAR.match(self.buf, start, self.end).end()
        if end == start:
            raise self._not_json("expected a value", start)
        return end if end < self.end or self.eof else None

    # ---- events
    def _events(self) -> None:
        """The events array at pos ('['): decode it piece by piece; pos ends past its ']'.

        A piece runs from an element's start ``s`` to a cut: the ``}`` of :meth:`_candidate`, or the exact one of
        :meth:`_exact_piece` when that guess fails. With a pool, pieces whose guessed cut is followed by ``,{``
        go to the workers and the reader moves on; anything else (the array's end, a failed span) is done here
        after the workers' spans are committed.
        """
        self.pos += 1
        c = self._expect()
        if c == ord("]"):
            self.pos += 1
            raise self._fail("traceEvents is empty")
        spans: deque[int] = deque()  # absolute element start of each span in flight, oldest first
        failures = 0
        while True:
            s = self.pos  # an element starts here; buf[s - 1] is '[', ',' or whitespace
            if not self.eof and self.end - s < self.chunk_bytes:
                self._more(s - 1)
                s = self.pos
            cut = self._candidate(s)
            if (self.pool is not None and self.pool.usable and failures < 3 and cut is not None
                    and self.buf[_WS.match(self.buf, cut + 1, self.end).end()] == ord(",")):
                if not self.pool.idle() and not self._commit(spans):
                    failures += 1
                    continue  # pos is back at the failed span's start
                if self.pool.submit(self.buf, s - 1, cut + 2, self.sink.rank):
                    spans.append(self.dropped + s)
                    self.pin = spans[0] - 1
                    self._after_element(cut)
                    continue
            if spans:  # the serial step below needs every earlier span committed
                if not self._drain(spans):
                    failures += 1
                continue
            if cut is None or not self._decode(s, cut, exact=False):
                cut = self._exact_piece(s)
                if cut is None:
                    continue  # more data was read
                if cut < 0:  # the array ended without a bracketed element in the piece
                    break
            if self._after_element(cut):
                break
        if self.sink.elements == 0:
            raise self._fail("traceEvents is empty")

    def _after_element(self, cut: int) -> bool:
        """Move past the element ending at ``cut`` and its separator; True when the array closed there."""
        self.pos = cut + 1
        c = self._expect()
        if c == ord(","):
            self.pos += 1
            if self._expect() == ord("]"):
                raise self._not_json("trailing comma", self.pos)
            return False
        if c == ord("]"):
            self.pos += 1
            return True
        raise self._not_json("expected ',' or ']' after an event", self.pos)

    def _commit(self, spans: deque) -> bool:
        """Commit the oldest span. On a failed span: drop the later ones, rewind pos to its start, False."""
        start = spans.popleft()
        result = self.pool.collect()  # a worker that died makes the pool unusable and this span failed
        if result.ok:
            self.sink.add_columns(result.elements, result.cols, result.table)
            self.pin = spans[0] - 1 if spans else None
            return True
        while spans:
            spans.popleft()
            self.pool.collect()
        self.pin = None
        self.pos = start - self.dropped
        return False

    def _drain(self, spans: deque) -> bool:
        while spans:
            if not self._commit(spans):
                return False
        return True

    def _candidate(self, s: int) -> int | None:
        """Position of the last '}' in buf[s:end] that looks like an element end, or None.

        The regex runs over a tail window that grows 8x until it holds a match (events are a few hundred bytes,
        so the first 16 KiB window nearly always does).
        """
        window = 1 << 14
        while True:
            lo = max(s, self.end - window)
            last = None
            for last in _ELEMENT_END.finditer(self.buf, lo, self.end):
                pass
            if last is not None:
                return last.start()
            if lo == s:
                return None
            window *= 8

    def _exact_piece(self, s: int) -> int | None:
        """Decode up to the exact last element end in the buffer. Returns that cut, -1 when the array ended
        (pos is then past its ']'), or None after reading more data (nothing complete yet)."""
        pos, depth, _ = bracket_depths(np.frombuffer(bytes(self.buf[s:self.end]), np.uint8))
        closes = np.flatnonzero(depth < 0)
        limit = int(pos[closes[0]]) if closes.size else self.end - s - 1
        if closes.size and self.buf[s + limit] != ord("]"):
            raise self._not_json("'}' closes the events array", s + limit)
        ends = pos[(depth == 0) & (pos < limit)]
        if ends.size:
            cut = s + int(ends[-1])
            self._decode(s, cut, exact=True)
            return cut
        if closes.size:  # only scalars (or nothing) before the array's end
            self._decode_generic(s, s + limit)
            self.pos = s + limit + 1
            return -1
        self._check_size(s, "one event")
        if self.pool is None and self.end - s >= self.chunk_bytes:  # a long element: read in doubling steps, so
            self.chunk_bytes = min(2 * self.chunk_bytes, MAX_VALUE_BYTES)  # its rescans sum to its size, not n^2
        if not self._more(s - 1):
            raise self._truncated()
        return None

    def _decode(self, s: int, cut: int, exact: bool) -> bool:
        """Decode buf[s:cut+1] as a list of events, bracketed in place. False if malformed and not ``exact``."""
        buf = self.buf
        saved = buf[cut + 1]
        buf[s - 1] = 0x5B  # '['
        buf[cut + 1] = 0x5D  # ']'
        try:
            with memoryview(buf) as mv, mv[s - 1:cut + 2] as piece:
                self.sink.add_json(piece)
            return True
        except msgspec.DecodeError:
            if not exact:
                return False
        except RecursionError:  # arrays or objects nested thousands deep: no Kineto event is
            raise self._not_json(f"in traceEvents: {NESTED_TOO_DEEP}", s) from None
        finally:
            buf[cut + 1] = saved
        # a balanced piece msgspec rejects: stdlib json also reads NaN / Infinity; anything else is bad JSON
        self._decode_generic(s, cut + 1)
        return True

    def _decode_generic(self, s: int, end: int) -> None:
        try:
            events = json.loads(b"[" + bytes(self.buf[s:end]) + b"]")
        except json.JSONDecodeError as e:
            # e's line, column and char are of this piece: name the file's byte instead (the piece is buf[s:end]
            # behind one added '[')
            raise self._not_json(f"in traceEvents: {e.msg}", s + max(e.pos - 1, 0)) from None
        except (ValueError, UnicodeDecodeError) as e:
            raise self._not_json(f"in traceEvents: {e}", s) from None
        except RecursionError:
            raise self._not_json(f"in traceEvents: {NESTED_TOO_DEEP}", s) from None
        self.sink.add_python(events)
