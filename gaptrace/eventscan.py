"""A compiled scanner for the common case: a piece of the ``traceEvents`` array straight into columns.

:func:`scan_piece` walks the bytes of one JSON array of events in a numba-compiled loop (no Python object per
event), validates the JSON as it goes, and writes the columns of its complete (``"ph": "X"``) events. Strings
of the symbol columns (cat, name, pid, tid, ``cuda_sync_kind``) are interned by their raw bytes into a hash table
that lives in numpy arrays (:class:`ScanState`); only each new distinct raw string is decoded in Python (by
msgspec, as the typed path decodes it) and interned into the caller's :class:`~gaptrace.eventcols.Symbols`.

The scanner accepts a strict subset of what the typed msgspec path (:mod:`gaptrace.eventcols`) accepts, and gives
the same values on it; anything outside the subset makes it give up on the whole piece (``None``), and the caller
decodes that piece the typed way, so the result never depends on the scanner. Outside the subset:

- anything that is not well-formed JSON (the reader's guessed cuts are checked by this: a cut inside a string
  leaves the piece unbalanced, and the msgspec path then raises as before);
- a non-ASCII byte, or an escape in an object key (the typed path compares decoded keys);
- a repeated key among the ones read (top level: ``ph cat name pid tid ts dur args``; in ``args``: the keys of
  :class:`~gaptrace.eventcols.Args`);
- an element that is not an object, has no ``ph``, or a ``ph`` that is not one of the phases the typed path knows;
- in a complete event: a ``cat``/``name`` that is not a string; a ``pid``/``tid`` that is neither a string nor an
  integer of at most 18 digits; a ``ts``/``dur`` that is not a number of at most 18 significant digits read
  exactly by one of two methods: Clinger's fast path (mantissa <= 2**53 and a decimal exponent within ±22, where
  one IEEE division or multiplication of exact operands is the correctly rounded value: W. D. Clinger, "How to
  read floating point numbers accurately", PLDI 1990), or, for a larger mantissa with a fraction of at most 18
  digits, integer division rounded to the 53 bits of the integer part's binade, ties to even (IEEE 754 round to
  nearest); an
  ``args`` that is not an object; an ``args`` integer that is neither ``null`` nor an integer of at most 18
  digits (a fraction, a string ``bytes``); a ``cuda_sync_kind`` that is neither ``null`` nor a string;
- nesting deeper than :data:`MAX_DEPTH`.

Throughput (``benchmarks/bench_analysis.py``): see DESIGN.md "What parsing a big trace costs".
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import msgspec
import numpy as np
from numba import carray, njit, types
from llvmlite import ir
from numba.extending import intrinsic

__all__ = ["ScanState", "scan_piece", "warm_up", "MAX_DEPTH"]

MAX_DEPTH = 64
_MISSING = -(2**63)  # as in eventcols: "absent" for the keys that have a spelling variant

_OK, _BAIL, _GROW_OUT, _GROW_TABLE = 0, 1, 2, 3

# rows of the integer output: the args keys, in this order (see _ARGS_KEYS)
_I_ROWS = ("correlation", "external_id", "external_id_lc", "python_id", "python_parent_id", "cbid", "cid", "device",
           "stream", "bytes")
# rows of the raw string ids: cat, name, pid, tid, cuda_sync_kind
_S_ROWS = ("cat_id", "name_id", "pid_id", "tid_id", "sync_kind_id")

# the keys read, as bytes; a key's index is its slot in the span table (top level 0-7, args 8-18)
_TOP_KEYS = (b"ph", b"cat", b"name", b"pid", b"tid", b"ts", b"dur", b"args")
_ARGS_KEYS = (b"correlation", b"External id", b"external id", b"Python id", b"Python parent id", b"cbid", b"cid",
              b"device", b"stream", b"bytes", b"cuda_sync_kind")
_K_PH, _K_CAT, _K_NAME, _K_PID, _K_TID, _K_TS, _K_DUR, _K_ARGS = range(8)
_N_TOP = len(_TOP_KEYS)
_K_SYNC = _N_TOP + 10
_N_SPANS = _N_TOP + len(_ARGS_KEYS)


def _pack(key: bytes) -> tuple[int, int]:
    """The first and the next eight bytes of a key as little-endian integers (how the compiled code reads it)."""
    key = key.ljust(16, b"\0")
    return int.from_bytes(key[:8], "little"), int.from_bytes(key[8:16], "little")


# module-level ints are compile-time constants to numba (a global array is read slowly in a hot loop)
(_W_PH, _), (_W_CAT, _), (_W_NAME, _), (_W_PID, _), (_W_TID, _), (_W_TS, _), (_W_DUR, _), (_W_ARGS, _) = map(
    _pack, _TOP_KEYS)
((_W_CORR, _V_CORR), (_W_EXT, _V_EXT), (_W_EXT_LC, _V_EXT_LC), (_W_PYID, _V_PYID), (_W_PYPAR, _V_PYPAR),
 (_W_CBID, _), (_W_CID, _), (_W_DEVICE, _), (_W_STREAM, _), (_W_BYTES, _), (_W_SYNC, _V_SYNC)) = map(_pack, _ARGS_KEYS)
# the phases of the typed path's other structs (eventcols._OTHER_PHASES): skipped, not bailed on; a bit mask
# over the byte values 0-127
_OTHER_MASK = sum(1 << c for c in set(b"BEiICbnestfPNODMVvRc()"))
_OTHER_LO, _OTHER_HI = _OTHER_MASK & (2**64 - 1), _OTHER_MASK >> 64
_MANT_MAX = 1 << 53


@njit(cache=True, nogil=True, inline="always")
def _ws(b, i, n):
    while i < n:
        c = b[i]
        if c != 32 and c != 10 and c != 13 and c != 9:
            return i
        i += 1
    return i


_ONES = np.uint64(0x0101010101010101)
_SPACES = np.uint64(0x2020202020202020)
_HIGHS = np.uint64(0x8080808080808080)
_QUOTES = np.uint64(0x2222222222222222)
_BACKSLASHES = np.uint64(0x5C5C5C5C5C5C5C5C)


@intrinsic
def _load8(typingctx, arr, i):
    """Eight bytes of a uint8 array from position i (i + 8 <= its length), as one little-endian uint64."""
    sig = types.uint64(arr, types.intp)

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        word = builder.bitcast(builder.gep(data, [args[1]]), ir.IntType(64).as_pointer())
        return builder.load(word, align=1)

    return sig, codegen


@njit(cache=True, nogil=True, inline="always")
def _string_end(b, i, n):
    """b[i] is '"'. (position after the closing quote, had an escape) or (-1, _) for anything unsupported."""
    i += 1
    esc = False
    while i < n:
        # eight plain bytes at a time (SWAR: no '"', no backslash, no byte < 0x20 or >= 0x80 in the word;
        # a flag can be spurious only above a real one, so the byte loop below settles any flagged word)
        while i + 8 <= n:
            w = _load8(b, i)
            q = w ^ _QUOTES
            k = w ^ _BACKSLASHES
            flags = (((q - _ONES) & ~q) | ((k - _ONES) & ~k) | (w - _SPACES) | w) & _HIGHS
            if flags != 0:
                break
            i += 8
        c = b[i] if i < n else 0
        if c != 34 and c != 92 and 32 <= c < 128:
            i += 1
            continue
        if i >= n:
            break
        if c == 34:
            return i + 1, esc
        if c != 92:  # a control byte, or not ASCII
            return -1, esc
        esc = True
        i += 1
        if i >= n:
            return -1, esc
        e = b[i]
        if e == 117:  # \uXXXX
            if i + 4 >= n:
                return -1, esc
            for j in range(i + 1, i + 5):
                h = b[j]
                if not ((48 <= h <= 57) or (65 <= h <= 70) or (97 <= h <= 102)):
                    return -1, esc
            i += 4
        elif not (e == 34 or e == 92 or e == 47 or e == 98 or e == 102 or e == 110 or e == 114 or e == 116):
            return -1, esc
        i += 1
    return -1, esc


@njit(cache=True, nogil=True, inline="always")
def _number_end(b, i, n):
    """A JSON number at i: (end, is an integer without fraction or exponent) or (-1, False)."""
    if i < n and b[i] == 45:
        i += 1
    if i >= n:
        return -1, False
    if b[i] == 48:
        i += 1
    elif (48 <= b[i] <= 57):
        while i < n and (48 <= b[i] <= 57):
            i += 1
    else:
        return -1, False
    integer = True
    if i < n and b[i] == 46:
        integer = False
        i += 1
        if i >= n or not (48 <= b[i] <= 57):
            return -1, False
        while i < n and (48 <= b[i] <= 57):
            i += 1
    if i < n and (b[i] == 101 or b[i] == 69):
        integer = False
        i += 1
        if i < n and (b[i] == 43 or b[i] == 45):
            i += 1
        if i >= n or not (48 <= b[i] <= 57):
            return -1, False
        while i < n and (48 <= b[i] <= 57):
            i += 1
    return i, integer


@njit(cache=True, nogil=True, inline="always")
def _literal(b, i, n):
    """true / false / null at i: the end, or -1."""
    c = b[i]
    if c == 116 and i + 4 <= n and b[i + 1] == 114 and b[i + 2] == 117 and b[i + 3] == 101:
        return i + 4
    if c == 102 and i + 5 <= n and b[i + 1] == 97 and b[i + 2] == 108 and b[i + 3] == 115 and b[i + 4] == 101:
        return i + 5
    if c == 110 and i + 4 <= n and b[i + 1] == 117 and b[i + 2] == 108 and b[i + 3] == 108:
        return i + 4
    return -1


@njit(cache=True, nogil=True)
def _skip_value(b, i, n, stack):
    """Validate the JSON value at i (whitespace skipped); its end, or -1. ``stack``: MAX_DEPTH bytes."""
    depth = 0
    while True:
        i = _ws(b, i, n)
        if i >= n:
            return -1
        c = b[i]
        if c == 123 or c == 91:  # '{' '['
            j = _ws(b, i + 1, n)
            if j >= n:
                return -1
            if (c == 123 and b[j] == 125) or (c == 91 and b[j] == 93):
                i = j + 1
            else:
                if depth == stack.shape[0]:
                    return -1
                stack[depth] = c
                depth += 1
                i = j
                if c == 123:
                    if b[i] != 34:
                        return -1
                    i, _ = _string_end(b, i, n)
                    if i < 0:
                        return -1
                    i = _ws(b, i, n)
                    if i >= n or b[i] != 58:
                        return -1
                    i += 1
                continue
        elif c == 34:
            i, _ = _string_end(b, i, n)
        elif c == 45 or (48 <= c <= 57):
            i, _ = _number_end(b, i, n)
        else:
            i = _literal(b, i, n)
        if i < 0:
            return -1
        # a value is complete: close containers, or move to the next member
        while True:
            if depth == 0:
                return i
            i = _ws(b, i, n)
            if i >= n:
                return -1
            c = b[i]
            top = stack[depth - 1]
            if c == 44:  # ','
                i = _ws(b, i + 1, n)
                if top == 123:
                    if i >= n or b[i] != 34:
                        return -1
                    i, _ = _string_end(b, i, n)
                    if i < 0:
                        return -1
                    i = _ws(b, i, n)
                    if i >= n or b[i] != 58:
                        return -1
                    i += 1
                break
            if (c == 125 and top == 123) or (c == 93 and top == 91):
                depth -= 1
                i += 1
                continue
            return -1


@njit(cache=True, nogil=True, inline="always")
def _scalar_or_skip(b, i, n, stack):
    """The value at i: a string, number or literal read here; a container by _skip_value (not inlined)."""
    c = b[i]
    if c == 34:
        i, _ = _string_end(b, i, n)
        return i
    if c == 45 or (48 <= c <= 57):
        i, _ = _number_end(b, i, n)
        return i
    if c == 123 or c == 91:
        return _skip_value(b, i, n, stack)
    return _literal(b, i, n)


@njit(cache=True, nogil=True, inline="always")
def _key_words(b, ks, ke):
    """(length, first eight bytes, next eight bytes) of the key b[ks:ke] as little-endian integers; length -1
    for a key longer than 16 bytes (none that is read is)."""
    m = ke - ks
    if m > 16:
        return -1, 0, 0
    w0 = 0
    w1 = 0
    for j in range(min(m, 8)):
        w0 |= np.int64(b[ks + j]) << (8 * j)
    for j in range(8, m):
        w1 |= np.int64(b[ks + j]) << (8 * (j - 8))
    return m, w0, w1


@njit(cache=True, nogil=True, inline="always")
def _top_key(b, ks, ke):
    """Slot (0-7) of a top-level key that is read, or -1."""
    m, w, _ = _key_words(b, ks, ke)
    if m == 2:
        return _K_PH if w == _W_PH else _K_TS if w == _W_TS else -1
    if m == 3:
        return (_K_CAT if w == _W_CAT else _K_PID if w == _W_PID else _K_TID if w == _W_TID
                else _K_DUR if w == _W_DUR else -1)
    if m == 4:
        return _K_NAME if w == _W_NAME else _K_ARGS if w == _W_ARGS else -1
    return -1


@njit(cache=True, nogil=True, inline="always")
def _args_key(b, ks, ke):
    """Slot (8-18) of an ``args`` key that is read, or -1."""
    m, w, v = _key_words(b, ks, ke)
    k = -1
    if m == 11:
        k = 0 if w == _W_CORR and v == _V_CORR else 1 if w == _W_EXT and v == _V_EXT else (
            2 if w == _W_EXT_LC and v == _V_EXT_LC else -1)
    elif m == 9:
        k = 3 if w == _W_PYID and v == _V_PYID else -1
    elif m == 16:
        k = 4 if w == _W_PYPAR and v == _V_PYPAR else -1
    elif m == 4:
        k = 5 if w == _W_CBID else -1
    elif m == 3:
        k = 6 if w == _W_CID else -1
    elif m == 6:
        k = 7 if w == _W_DEVICE else 8 if w == _W_STREAM else -1
    elif m == 5:
        k = 9 if w == _W_BYTES else -1
    elif m == 14:
        k = 10 if w == _W_SYNC and v == _V_SYNC else -1
    return -1 if k < 0 else _N_TOP + k


@njit(cache=True, nogil=True, inline="always")
def _member_key(b, i, n):
    """At a member's key (b[i] should be '"'): (key start, key end, position of its value) or -1s."""
    if i >= n or b[i] != 34:
        return -1, -1, -1
    ks = i + 1
    i, esc = _string_end(b, i, n)
    if i < 0 or esc:  # an escaped key: the typed path compares decoded keys
        return -1, -1, -1
    ke = i - 1
    i = _ws(b, i, n)
    if i >= n or b[i] != 58:
        return -1, -1, -1
    i = _ws(b, i + 1, n)
    if i >= n:
        return -1, -1, -1
    return ks, ke, i


@njit(cache=True, nogil=True, inline="always")
def _member_next(b, i, n):
    """After a member's value: (position of the next key, 0), (past the '}', 1) or (-1, 1)."""
    i = _ws(b, i, n)
    if i >= n:
        return -1, 1
    if b[i] == 44:
        return _ws(b, i + 1, n), 0
    if b[i] == 125:
        return i + 1, 1
    return -1, 1


@njit(cache=True, nogil=True, inline="always")
def _record(spans, k, vs, ve):
    """Keep a known key's value span; False for a repeated key (the typed path decides which one counts)."""
    if k >= 0:
        if spans[k, 0] >= 0:
            return False
        spans[k, 0] = vs
        spans[k, 1] = ve
    return True


@njit(cache=True, nogil=True, inline="always")
def _args_members(b, i, n, spans, stack):
    """The ``args`` object at b[i] == '{': spans of the Args keys' values; its end, or -1 to give up."""
    i = _ws(b, i + 1, n)
    if i < n and b[i] == 125:
        return i + 1
    while True:
        ks, ke, vs = _member_key(b, i, n)
        if vs < 0:
            return -1
        i = _scalar_or_skip(b, vs, n, stack)
        if i < 0 or not _record(spans, _args_key(b, ks, ke), vs, i):
            return -1
        i, done = _member_next(b, i, n)
        if i < 0 or done:
            return i


@njit(cache=True, nogil=True, inline="always")
def _event_members(b, i, n, spans, stack):
    """The event object at b[i] == '{': spans of the known keys' values (``args`` read by _args_members)."""
    i = _ws(b, i + 1, n)
    if i < n and b[i] == 125:
        return i + 1
    while True:
        ks, ke, vs = _member_key(b, i, n)
        if vs < 0:
            return -1
        k = _top_key(b, ks, ke)
        if k == _K_ARGS and b[vs] == 123:
            i = _args_members(b, vs, n, spans, stack)
        else:
            i = _scalar_or_skip(b, vs, n, stack)
        if i < 0 or not _record(spans, k, vs, i):
            return -1
        i, done = _member_next(b, i, n)
        if i < 0 or done:
            return i


@njit(cache=True, nogil=True, inline="always")
def _hash(b, s, e):
    """A 64-bit hash of b[s:e], eight bytes a step (FNV-1a's constants on words, then a xor-shift mix); equal
    hashes are always confirmed by comparing the bytes, so a collision costs time, never a wrong symbol."""
    h = np.uint64(14695981039346656037) ^ np.uint64(e - s)
    j = s
    while j + 8 <= e:
        w = (np.uint64(b[j]) | (np.uint64(b[j + 1]) << np.uint64(8)) | (np.uint64(b[j + 2]) << np.uint64(16))
             | (np.uint64(b[j + 3]) << np.uint64(24)) | (np.uint64(b[j + 4]) << np.uint64(32))
             | (np.uint64(b[j + 5]) << np.uint64(40)) | (np.uint64(b[j + 6]) << np.uint64(48))
             | (np.uint64(b[j + 7]) << np.uint64(56)))
        h = (h ^ w) * np.uint64(1099511628211)
        h ^= h >> np.uint64(29)
        j += 8
    while j < e:
        h = (h ^ np.uint64(b[j])) * np.uint64(1099511628211)
        j += 1
    h ^= h >> np.uint64(32)
    return h * np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True, nogil=True, inline="always")
def _intern(b, s, e, arena, offs, hashes, table, st):
    """Raw id of the bytes b[s:e] (st[0]: arena bytes used, st[1]: raw strings); -1: a table or the arena is full."""
    h = _hash(b, s, e)
    mask = table.shape[0] - 1
    slot = np.int64(h & np.uint64(mask))
    m = e - s
    while True:
        r = table[slot]
        if r < 0:
            nraw = st[1]
            if 2 * (nraw + 1) > table.shape[0] or nraw + 2 > offs.shape[0] or st[0] + m > arena.shape[0]:
                return -1
            a = st[0]
            for j in range(m):
                arena[a + j] = b[s + j]
            offs[nraw + 1] = a + m
            hashes[nraw] = h
            table[slot] = nraw
            st[0] = a + m
            st[1] = nraw + 1
            return nraw
        if hashes[r] == h and offs[r + 1] - offs[r] == m:
            a = offs[r]
            same = True
            for j in range(m):
                if arena[a + j] != b[s + j]:
                    same = False
                    break
            if same:
                return r
        slot = (slot + 1) & mask


@njit(cache=True, nogil=True, inline="always")
def _int_value(b, s, e):
    """(ok, value) for an integer of at most 18 digits at b[s:e] (a number span)."""
    neg = b[s] == 45
    j = s + 1 if neg else s
    if e - j > 18 or e - j < 1:
        return False, 0
    v = 0
    for q in range(j, e):
        c = b[q]
        if not (48 <= c <= 57):
            return False, 0
        v = v * 10 + (c - 48)
    return True, -v if neg else v


@njit(cache=True, nogil=True, inline="always")
def _float_value(b, s, e):
    """(ok, value) for a JSON number at b[s:e], correctly rounded, where one of two exact methods applies (see the
    module docstring); (False, 0.0) elsewhere."""
    j = s
    neg = b[j] == 45
    if neg:
        j += 1
    mant = 0
    digits = 0
    exp10 = 0
    while j < e and (48 <= b[j] <= 57):
        if mant != 0 or b[j] != 48:
            digits += 1
        mant = mant * 10 + (b[j] - 48)
        j += 1
        if digits > 18:
            return False, 0.0
    integer = True
    if j < e and b[j] == 46:
        integer = False
        j += 1
        while j < e and (48 <= b[j] <= 57):
            if mant != 0 or b[j] != 48:
                digits += 1
            mant = mant * 10 + (b[j] - 48)
            exp10 -= 1
            j += 1
            if digits > 18:
                return False, 0.0
    if j < e:  # an exponent
        integer = False
        j += 1
        eneg = b[j] == 45
        if b[j] == 45 or b[j] == 43:
            j += 1
        x = 0
        while j < e:
            x = x * 10 + (b[j] - 48)
            j += 1
            if x > 400:
                return False, 0.0
        exp10 += -x if eneg else x
    if mant <= _MANT_MAX and -22 <= exp10 <= 22:
        # Clinger's fast path: mant and 10**|exp10| are exact doubles, one IEEE operation rounds correctly
        p = 1.0
        for _ in range(abs(exp10)):  # 10.0**k by products of exact integers: exact for k <= 22
            p *= 10.0
        v = float(mant)
        v = v / p if exp10 < 0 else v * p
        if integer:  # an integer in a float field is converted as an int: -0 is 0.0
            return True, float(-mant) if neg else v
        return True, -v if neg else v
    if exp10 >= 0 or exp10 < -18:
        return False, 0.0
    # mant > 2**53 with a fraction (17-18 digits, as 1623142623460111.25): q + r/D with D = 10**-exp10, rounded
    # in integers to the 53 bits of q's binade (ties to even), then scaled by an exact power of two
    d = 1
    for _ in range(-exp10):
        d *= 10
    q = mant // d
    r = mant - q * d
    if q == 0 or q >= _MANT_MAX:
        return False, 0.0
    t = 0
    while (q << (t + 1)) < _MANT_MAX:
        t += 1
    if t > 0 and r >= (1 << (62 - t)):
        return False, 0.0
    num = r << t
    f = num // d
    r2 = num - f * d
    m = (q << t) + f
    if r2 > d - r2 or (r2 == d - r2 and (m & 1) == 1):
        m += 1
    v = math.ldexp(float(m), -t)
    return True, -v if neg else v


@intrinsic
def _data_ptr(typingctx, arr):
    """The data pointer of an array, typed (``CPointer(dtype)``)."""
    sig = types.CPointer(arr.dtype)(arr)

    def codegen(context, builder, signature, args):
        return context.make_array(signature.args[0])(context, builder, args[0]).data

    return sig, codegen


@njit(cache=True, nogil=True, inline="always")
def _unowned(a):
    """A view of ``a`` without a reference count (numba's ``carray`` over its data pointer). The compiled code
    passes arrays between its functions many times an event; an owned array costs an atomic increment and
    decrement each time (a quarter of the scan's time, measured with perf). Only for arrays that outlive the
    call, as every argument of _scan does."""
    return carray(_data_ptr(a), a.shape)


@njit(cache=True, nogil=True)
def _scan(b, out_f, out_i, out_s, arena, offs, hashes, table, st, spans, stack, bare):
    """(status, array elements, complete events written). Status: 0 ok, 1 give up, 2 output full, 3 table full.
    ``bare``: b[0] and b[-1] stand for the array's brackets whatever they hold (a span of the reader's buffer)."""
    b, out_f, out_i, out_s = _unowned(b), _unowned(out_f), _unowned(out_i), _unowned(out_s)
    arena, offs, hashes, table = _unowned(arena), _unowned(offs), _unowned(hashes), _unowned(table)
    st, spans, stack = _unowned(st), _unowned(spans), _unowned(stack)
    n = b.shape[0]
    cap = out_f.shape[1]
    if bare:
        if n < 2:
            return 1, 0, 0
        n -= 1  # b[n] is the closing bracket
        i = _ws(b, 1, n)
        if i >= n:
            return 0, 0, 0
    else:
        i = _ws(b, 0, n)
        if i >= n or b[i] != 91:
            return 1, 0, 0
        i = _ws(b, i + 1, n)
        if i < n and b[i] == 93:
            return (0 if _ws(b, i + 1, n) == n else 1), 0, 0
    elements = 0
    nx = 0
    while True:
        if i >= n or b[i] != 123:
            return 1, elements, nx  # not an object (the typed path's validation fails on it)
        for q in range(_N_SPANS):
            spans[q, 0] = -1
        i = _event_members(b, i, n, spans, stack)
        if i < 0:
            return 1, elements, nx
        elements += 1
        ps, pe = spans[_K_PH, 0], spans[_K_PH, 1]
        if ps < 0 or pe - ps != 3 or b[ps] != 34:
            return 1, elements, nx
        ph = b[ps + 1]
        if ph == 88:  # 'X': a complete event
            if nx == cap:
                return 2, elements, nx
            for k in range(_N_TOP):
                s, e = spans[k, 0], spans[k, 1]
                if k == _K_PH or k == _K_ARGS:
                    continue
                if k <= _K_TID:
                    r = -1
                    if s >= 0:
                        if b[s] == 34:
                            r = _intern(b, s, e, arena, offs, hashes, table, st)
                        elif k >= _K_PID and (b[s] == 45 or (48 <= b[s] <= 57)):
                            ok, _v = _int_value(b, s, e)
                            if not ok:
                                return 1, elements, nx
                            r = _intern(b, s, e, arena, offs, hashes, table, st)
                        else:
                            return 1, elements, nx
                        if r < 0:
                            return 3, elements, nx
                    out_s[k - 1, nx] = r
                else:  # ts, dur
                    v = np.nan
                    if s >= 0:
                        if not (b[s] == 45 or (48 <= b[s] <= 57)):
                            return 1, elements, nx
                        ok, v = _float_value(b, s, e)
                        if not ok:
                            return 1, elements, nx
                    out_f[k - _K_TS, nx] = v
            s = spans[_K_ARGS, 0]
            if s >= 0 and b[s] != 123:
                return 1, elements, nx
            for q in range(10):
                s, e = spans[_N_TOP + q, 0], spans[_N_TOP + q, 1]
                if s < 0:
                    out_i[q, nx] = _MISSING if q == 1 or q == 2 or q == 5 or q == 6 else -1
                elif b[s] == 110:  # null: the typed path's None, -1 (present, so a variant spelling is not read)
                    out_i[q, nx] = -1
                else:
                    ok, v = _int_value(b, s, e)
                    if not ok:
                        return 1, elements, nx
                    out_i[q, nx] = v
            s, e = spans[_K_SYNC, 0], spans[_K_SYNC, 1]
            r = -1
            if s >= 0 and b[s] != 110:  # null: None, as absent
                if b[s] != 34:
                    return 1, elements, nx
                r = _intern(b, s, e, arena, offs, hashes, table, st)
                if r < 0:
                    return 3, elements, nx
            out_s[4, nx] = r
            nx += 1
        elif not ((ph < 64 and (_OTHER_LO >> ph) & 1) or (64 <= ph < 128 and (_OTHER_HI >> (ph - 64)) & 1)):
            return 1, elements, nx
        i = _ws(b, i, n)
        if i >= n:
            return (0 if bare else 1), elements, nx
        if b[i] == 44:
            i = _ws(b, i + 1, n)
            if bare and i >= n:
                return 1, elements, nx  # a trailing comma
            continue
        if b[i] == 93 and not bare:
            return (0 if _ws(b, i + 1, n) == n else 1), elements, nx
        return 1, elements, nx


@njit(cache=True, nogil=True)
def _rehash(offs, hashes, nraw, table):
    mask = table.shape[0] - 1
    for r in range(nraw):
        slot = np.int64(hashes[r] & np.uint64(mask))
        while table[slot] >= 0:
            slot = (slot + 1) & mask
        table[slot] = r


@dataclass
class ScanState:
    """One decoder's raw-string table: distinct raw spellings (quotes kept, so ``7`` and ``"7"`` differ) in an
    arena, an open-addressing hash table over them, and each one's symbol id once decoded (-2 before)."""

    arena: np.ndarray = field(default_factory=lambda: np.empty(1 << 20, np.uint8))
    offs: np.ndarray = field(default_factory=lambda: np.zeros(1 << 14, np.int64))
    hashes: np.ndarray = field(default_factory=lambda: np.zeros(1 << 14, np.uint64))
    table: np.ndarray = field(default_factory=lambda: np.full(1 << 15, -1, np.int64))
    st: np.ndarray = field(default_factory=lambda: np.zeros(2, np.int64))  # arena bytes used, raw strings
    symbol_of: np.ndarray = field(default_factory=lambda: np.full(1 << 14, -2, np.int32))
    spans: np.ndarray = field(default_factory=lambda: np.empty((_N_SPANS, 2), np.int64))
    stack: np.ndarray = field(default_factory=lambda: np.empty(MAX_DEPTH, np.uint8))

    def grow(self) -> None:
        """Double what is full (a piece is then scanned again: the strings it added are kept)."""
        nraw, used = int(self.st[1]), int(self.st[0])
        if 2 * (nraw + 1) <= self.table.shape[0] and nraw + 2 <= self.offs.shape[0]:  # the arena was full
            self.arena = np.concatenate([self.arena, np.empty(max(self.arena.shape[0], used), np.uint8)])
        else:
            size = 2 * self.offs.shape[0]
            self.offs = np.concatenate([self.offs, np.zeros(size - self.offs.shape[0], np.int64)])
            self.hashes = np.concatenate([self.hashes, np.zeros(size - self.hashes.shape[0], np.uint64)])
            self.symbol_of = np.concatenate([self.symbol_of, np.full(size - self.symbol_of.shape[0], -2, np.int32)])
            self.table = np.full(2 * size, -1, np.int64)
            _rehash(self.offs, self.hashes, nraw, self.table)

    def symbols_for(self, raw_ids: np.ndarray, symbols) -> np.ndarray | None:
        """Symbol ids (int32) of raw ids (-1 stays -1); None when a raw string does not decode (the typed path
        then decides). New raw strings are decoded by msgspec, as the typed path decodes a ``str`` field."""
        table = self.symbol_of
        need = np.unique(raw_ids[raw_ids >= 0])
        need = need[table[need] == -2]
        if need.size:
            arena, offs = self.arena, self.offs
            for r in need.tolist():
                raw = arena[offs[r]:offs[r + 1]].tobytes()
                try:
                    text = msgspec.json.decode(raw) if raw[:1] == b'"' else str(int(raw))
                except (msgspec.DecodeError, ValueError):
                    return None
                if not isinstance(text, str):
                    return None
                table[r] = symbols.intern(text)
        out = table[raw_ids]
        out[raw_ids < 0] = -1
        return out


def scan_piece(piece, rank: int, symbols, state: ScanState,
               bare: bool = False) -> tuple[int, dict[str, np.ndarray]] | None:
    """(array elements, columns of the complete events) of one JSON array of events, as
    :func:`gaptrace.eventcols.decode_piece` gives them; None when the piece is outside the scanner's subset
    (module docstring). ``piece``: bytes-like; ``symbols``: the :class:`~gaptrace.eventcols.Symbols` the symbol
    columns index; ``state``: this decoder's :class:`ScanState` (kept across pieces). With ``bare``, the first
    and last bytes of ``piece`` stand for ``[`` and ``]`` whatever they hold (a span of the reader's buffer,
    read in place: ``sep {...}, ..., {...} sep``)."""
    b = np.frombuffer(piece, np.uint8)
    if b.flags.writeable:
        b = b.view()
        b.flags.writeable = False  # one compiled specialisation for bytes and buffers alike
    cap = max(1024, b.shape[0] // 160)
    while True:
        out_f = np.empty((2, cap), np.float64)
        out_i = np.empty((10, cap), np.int64)
        out_s = np.empty((5, cap), np.int64)
        status, elements, nx = _scan(b, out_f, out_i, out_s, state.arena, state.offs, state.hashes, state.table,
                                     state.st, state.spans, state.stack, bare)
        if status == _OK:
            break
        if status == _BAIL:
            return None
        if status == _GROW_OUT:
            cap = max(cap * 2, b.shape[0] // 10 + 1)
        else:
            state.grow()
    ids = state.symbols_for(out_s[:, :nx], symbols)
    if ids is None:
        return None
    cols = {c: ids[j].astype(np.int32) for j, c in enumerate(_S_ROWS)}
    cols["ts"] = out_f[0, :nx].copy()
    cols["dur"] = out_f[1, :nx].copy()
    iv = {c: out_i[j, :nx] for j, c in enumerate(_I_ROWS)}
    for main, variant in (("external_id", "external_id_lc"), ("cbid", "cid")):
        v = np.where(iv[main] == _MISSING, iv[variant], iv[main])
        v[v == _MISSING] = -1
        cols[main] = v
    for c in ("correlation", "python_id", "python_parent_id", "device", "stream", "bytes"):
        cols[c] = iv[c].copy()
    cols["rank"] = np.full(nx, rank, np.int32)
    return elements, cols


class _Discard:
    """A symbol table that keeps nothing (the warm-up's)."""

    def intern(self, s: str) -> int:
        return 0


def warm_up() -> None:
    """Compile (or load from numba's cache) the scanner now, e.g. before decoder threads start. The first compile on
    a machine takes about 55 s (two cores, 1.1 GB peak RSS); numba's cache (``__pycache__`` beside this file, else its user-wide
    cache) makes it about 1 s after that; a line on a terminal's stderr says so while it compiles."""
    import sys

    if not _cached() and sys.stderr is not None and sys.stderr.isatty():
        print("gaptrace: compiling the trace scanner (once on this machine, about a minute)", file=sys.stderr)
    scan_piece(b'[{"ph":"X","cat":"c","name":"n","pid":1,"tid":"t","ts":1.5,"dur":2,"args":{"correlation":3}}]',
               0, _Discard(), ScanState())


def _cached() -> bool:
    """Whether numba's cache holds the scanner (numba's cache index file; True when that cannot be told)."""
    try:
        return bool(_scan.signatures) or os.path.exists(_scan._cache._cache_file._index_path)
    except AttributeError:
        return True
