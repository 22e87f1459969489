"""The compiled predictor's kernel (numba, cache=True): one launch's parameter bytes in, its merged
predicted ranges out, in one call.

Everything the kernel reads or writes is one int64 array, the *state* (one array because numba's
dispatcher costs about 0.1 us per argument, and the call's budget is 1 us; docs/performance.md):

- `META` slots: where the other sections start;
- the allocation table: the predictor's live allocations, (base, end) pairs sorted by base;
- the miss set: pointers known to land in no managed allocation (open addressing);
- `io`: the launch configuration in (`io[0:6]`), a value handed back (`io[6]`), the output mode
  (`io[7]`), the kernel's feature values, then the ranges out (from `io[H_POFF]`);
- the *program*: the model compiled by `predict.compiled` (layout constants below): a header
  (`H_*`), per kernel (`K_*`) whether it is predicted by regions or by scanning every 8-byte word
  (kernels the model never saw, or has no regions for) and its rows in the tables; per feature
  word (`W_*`) parameter bytes or launch configuration, absolute byte offset, size, signedness;
  per region (`R_*`) the base pointer's offset, the class, its formulas, its stored history; per
  formula (`F*`) constant and terms; per term (`T*`) coefficient and factors (feature words of the
  kernel); the irregular regions' stored histories (page pairs relative to the allocation); the
  `history` fallback's observed pages, keyed by (kernel id, allocation base), sorted.

Arithmetic is int64, as in the batch predictor (`predict.predictor._predict_pieces`, numpy int64):
formulas, pages and clipping are the same expressions as there and in `OnlinePredictor`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# ---- the state's sections --------------------------------------------------------------------
M_TABLE, M_TCAP, M_NEG, M_NCAP, M_IO, M_IOLEN, M_PROG, M_PLEN = range(8)
META = 8

# ---- the program's layout (predict/compiled.py writes it; offsets relative to the program) ----
H_NK, H_KOFF, H_WOFF, H_ROFF, H_FOFF, H_TOFF, H_XOFF, H_SOFF, H_PS, H_FB, H_DKEY, H_DN, H_DPOOL, H_POFF = range(14)
HEADER = 16
K_MODE, K_W0, K_W1, K_R0, K_R1 = range(5)
KW = 5
W_KIND, W_OFF, W_SIZE, W_SIGNED = range(4)
WW = 4
R_BASE, R_CLS, R_START, R_END, R_COUNT, R_CHUNK, R_STRIDE, R_H0, R_H1 = range(9)
RW = 9
FW = 3       # const, first term, end term
TW = 3       # coefficient, first factor, end factor
DW = 4       # observed history key: kernel id, allocation base, first interval, interval count

MODE_REGIONS, MODE_SCAN = 0, 1
KIND_PARAM, KIND_GRID = 0, 1
CLS_FIXED, CLS_LINEAR, CLS_STRIDED, CLS_ALLOCATION, CLS_IRREGULAR = range(5)
FB_NONE, FB_ALLOCATION, FB_HISTORY = range(3)

# io slots: [0:6] grid and block in; the value handed back (the pointer to resolve, the ranges
# that need room); the output mode in (0: page ranges [start, end), as OnlinePredictor.predict;
# 1: byte ranges (address, nbytes), empty ones dropped, as the runner hands them on)
IO_VALUE, IO_MODE, IO_VALUES = 6, 7, 8
ST_RESOLVE, ST_ROOM, ST_SHORT = -1, -2, -3

FEW_CHUNKS = 64          # strided counts up to this are walked as they are (predictor._FEW_CHUNKS)
MAX_CHUNKS = 1 << 20     # the most chunks one strided region yields (predictor.py's bound)
NEG_EMPTY = np.iinfo(np.int64).min   # an empty slot of the miss set (that word is never cached)


def code_of(row: int, hid: int) -> int:
    """The kernel argument of `predict_launch`: program row (-1: scan every word) and kernel id."""
    return ((row + 1) << 32) | hid


@njit(cache=True)
def _word(data, off, size, signed):
    """The little-endian integer of `size` bytes at `off` (int64; 8-byte words wrap as numpy's do)."""
    v = np.uint64(0)
    for i in range(size):
        v |= np.uint64(data[off + i]) << np.uint64(8 * i)
    if signed and size < 8:
        if v & (np.uint64(1) << np.uint64(8 * size - 1)):
            return np.int64(v) - (np.int64(1) << np.int64(8 * size))
    return np.int64(v)


@njit(cache=True)
def find_alloc(st, v):
    """Row of the allocation with the largest base <= v, when v <= its end (one past it counts, as
    OnlinePredictor._alloc_of's bisect does); else -1. Rows: st[t + 1 + 2i], st[t + 2 + 2i]."""
    t = st[M_TABLE]
    lo, hi = 0, st[t]
    while lo < hi:
        mid = (lo + hi) >> 1
        if st[t + 1 + 2 * mid] <= v:
            lo = mid + 1
        else:
            hi = mid
    i = lo - 1
    if i >= 0 and v <= st[t + 2 + 2 * i]:
        return i
    return -1


@njit(cache=True)
def table_insert(st, base, end):
    """Insert or update (base, end) in the sorted table; False when it is full."""
    t = st[M_TABLE]
    n = st[t]
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) >> 1
        if st[t + 1 + 2 * mid] < base:
            lo = mid + 1
        else:
            hi = mid
    if lo < n and st[t + 1 + 2 * lo] == base:
        st[t + 2 + 2 * lo] = end
        return True
    if n >= st[M_TCAP]:
        return False
    for j in range(n - 1, lo - 1, -1):
        st[t + 3 + 2 * j] = st[t + 1 + 2 * j]
        st[t + 4 + 2 * j] = st[t + 2 + 2 * j]
    st[t + 1 + 2 * lo] = base
    st[t + 2 + 2 * lo] = end
    st[t] = n + 1
    return True


@njit(cache=True)
def table_remove(st, base):
    t = st[M_TABLE]
    n = st[t]
    for i in range(n):
        if st[t + 1 + 2 * i] == base:
            for j in range(i, n - 1):
                st[t + 1 + 2 * j] = st[t + 3 + 2 * j]
                st[t + 2 + 2 * j] = st[t + 4 + 2 * j]
            st[t] = n - 1
            return True
    return False


@njit(cache=True)
def _neg_slot(st, v):
    """Slot of v in the miss set, or the empty slot where it would go (linear probing)."""
    g = st[M_NEG]
    mask = st[M_NCAP] - 1
    i = ((v * np.int64(-7046029254386353131)) >> np.int64(17)) & mask
    while True:
        k = st[g + 2 + i]
        if k == v or k == NEG_EMPTY:
            return g + 2 + i
        i = (i + 1) & mask


@njit(cache=True)
def neg_has(st, v):
    """Is v known to land in no managed allocation? st[neg]: 1 when misses are looked up (the
    predictor has a resolver; without one every miss is final), st[neg + 1]: entries."""
    if st[st[M_NEG]] == 0:
        return True
    if v == NEG_EMPTY:
        return False
    return st[_neg_slot(st, v)] == v


@njit(cache=True)
def neg_add(st, v):
    """Remember a miss; False when the set is half full (the caller clears it)."""
    if v == NEG_EMPTY:
        return True
    g = st[M_NEG]
    if 2 * (st[g + 1] + 1) > st[M_NCAP]:
        return False
    s = _neg_slot(st, v)
    if st[s] != v:
        st[s] = v
        st[g + 1] += 1
    return True


@njit(cache=True)
def _formula(st, p, f, vo):
    """Formula f of the program at p, over the feature values at st[vo:]."""
    fo = p + st[p + H_FOFF] + f * FW
    to = p + st[p + H_TOFF]
    xo = p + st[p + H_XOFF]
    acc = st[fo]
    for t in range(st[fo + 1], st[fo + 2]):
        v = st[to + t * TW]
        for x in range(st[to + t * TW + 1], st[to + t * TW + 2]):
            v *= st[vo + st[xo + x]]
        acc += v
    return acc


@njit(cache=True)
def _put(st, out, end, n, s, e):
    if out + 2 * n + 1 < end:
        st[out + 2 * n] = s
        st[out + 2 * n + 1] = e
    return n + 1


@njit(cache=True)
def _observed(st, p, hid, a):
    """Index of the observed-history key (kernel hid, allocation a), or -1 (binary search)."""
    d = p + st[p + H_DKEY]
    lo, hi = 0, st[p + H_DN]
    while lo < hi:
        mid = (lo + hi) >> 1
        k0, k1 = st[d + mid * DW], st[d + mid * DW + 1]
        if k0 < hid or (k0 == hid and k1 < a):
            lo = mid + 1
        else:
            hi = mid
    if lo < st[p + H_DN] and st[d + lo * DW] == hid and st[d + lo * DW + 1] == a:
        return lo
    return -1


@njit(cache=True)
def _fallback(st, p, hid, a, a_s, a_e, h0, h1, n):
    """OnlinePredictor._fallback_alloc: the allocation, its observed history, else the stored one."""
    out = st[M_IO] + st[p + H_POFF]
    end = st[M_IO] + st[M_IOLEN]
    fb = st[p + H_FB]
    if fb == FB_ALLOCATION:
        return _put(st, out, end, n, a_s, a_e)
    if fb == FB_HISTORY:
        d = _observed(st, p, hid, a)
        if d >= 0:
            key = p + st[p + H_DKEY] + d * DW
            pool = p + st[p + H_DPOOL]
            for i in range(st[key + 2], st[key + 2] + st[key + 3]):
                n = _put(st, out, end, n, st[pool + 2 * i], st[pool + 2 * i + 1])
        else:
            so = p + st[p + H_SOFF]
            for i in range(h0, h1):
                s, e = st[so + 2 * i], st[so + 2 * i + 1]
                if a_s + s < a_e:
                    n = _put(st, out, end, n, max(a_s, a_s + s), min(a_e, a_s + e))
    return n


@njit(cache=True)
def _merge(st, out, n):
    """Sort the n pieces at st[out:] by start and merge those that overlap or touch, in place."""
    if n <= 1:
        return n
    if n <= 16:
        for i in range(1, n):   # insertion sort: launches have a few pieces
            s, e = st[out + 2 * i], st[out + 2 * i + 1]
            j = i - 1
            while j >= 0 and (st[out + 2 * j] > s or (st[out + 2 * j] == s and st[out + 2 * j + 1] > e)):
                st[out + 2 * j + 2] = st[out + 2 * j]
                st[out + 2 * j + 3] = st[out + 2 * j + 1]
                j -= 1
            st[out + 2 * j + 2] = s
            st[out + 2 * j + 3] = e
    else:   # the order of pieces with equal starts does not change their union
        s0 = st[out:out + 2 * n:2].copy()
        e0 = st[out + 1:out + 2 * n:2].copy()
        order = np.argsort(s0, kind="mergesort")
        for i in range(n):
            st[out + 2 * i] = s0[order[i]]
            st[out + 2 * i + 1] = e0[order[i]]
    return coalesce(st, out, n)


@njit(cache=True)
def coalesce(rs, at, n):
    """Merge the n (start, end) rows at rs[at:], sorted by start, that overlap or touch, in place
    (ranges.merge_ranges); returns their count. The runner's residency kernels use it too."""
    if n == 0:
        return 0
    m = 0
    for i in range(1, n):
        s, e = rs[at + 2 * i], rs[at + 2 * i + 1]
        if s <= rs[at + 2 * m + 1]:
            if e > rs[at + 2 * m + 1]:
                rs[at + 2 * m + 1] = e
        else:
            m += 1
            rs[at + 2 * m] = s
            rs[at + 2 * m + 1] = e
    return m + 1


@njit(cache=True)
def _lookup(st, io, v):
    """(row or -1, status): status ST_RESOLVE hands v back (io[IO_VALUE]) to be looked up."""
    row = find_alloc(st, v)
    if row >= 0 or neg_has(st, v):
        return row, 0
    st[io + IO_VALUE] = v
    return -1, ST_RESOLVE


@njit(cache=True)
def predict_launch_grid(st, data, code, gx, gy, gz, bx, by, bz):
    """predict_launch for a kernel whose formulas read the launch configuration."""
    io = st[M_IO]
    st[io], st[io + 1], st[io + 2], st[io + 3], st[io + 4], st[io + 5] = gx, gy, gz, bx, by, bz
    return predict_launch(st, data, code)


@njit(cache=True)
def predict_launch(st, data, code):
    """One launch (`code_of(row, kernel id)`; the id keys the observed histories).

    Returns the number of merged ranges written at io + H_POFF, or ST_RESOLVE (io[6]: the
    pointer), ST_ROOM (io[6]: the ranges that need room) or ST_SHORT (the buffer is shorter than a
    word the model reads: struct.error in OnlinePredictor)."""
    k = (code >> 32) - 1
    hid = code & 0xFFFFFFFF
    p = st[M_PROG]
    io = st[M_IO]
    end = io + st[M_IOLEN]
    ps = st[p + H_PS]
    out = io + st[p + H_POFF]
    t = st[M_TABLE]
    n = 0
    mode = MODE_SCAN if k < 0 else st[p + st[p + H_KOFF] + k * KW + K_MODE]
    if mode == MODE_SCAN:
        if st[p + H_FB] == FB_NONE:
            return 0
        for off in range(0, len(data) - 7, 8):
            v = _word(data, off, 8, False)
            row, status = _lookup(st, io, v)
            if status != 0:
                return status
            if row >= 0:
                a = st[t + 1 + 2 * row]
                n = _fallback(st, p, hid, a, a // ps, -((-st[t + 2 + 2 * row]) // ps), 0, 0, n)
    else:
        ko = p + st[p + H_KOFF] + k * KW
        w0, w1 = st[ko + K_W0], st[ko + K_W1]
        vo = io + IO_VALUES
        wo = p + st[p + H_WOFF]
        for w in range(w0, w1):
            x = wo + w * WW
            if st[x + W_KIND] == KIND_GRID:
                st[vo + w - w0] = st[io + st[x + W_OFF]]
            else:
                o, size = st[x + W_OFF], st[x + W_SIZE]
                if o + size > len(data):
                    return ST_SHORT
                st[vo + w - w0] = _word(data, o, size, st[x + W_SIGNED] != 0)
        ro0 = p + st[p + H_ROFF]
        for r in range(st[ko + K_R0], st[ko + K_R1]):
            ro = ro0 + r * RW
            o = st[ro + R_BASE]
            if o + 8 > len(data):
                return ST_SHORT
            v = _word(data, o, 8, False)
            row, status = _lookup(st, io, v)
            if status != 0:
                return status
            if row < 0:
                continue
            a = st[t + 1 + 2 * row]
            a_s, a_e = a // ps, -((-st[t + 2 + 2 * row]) // ps)
            cls = st[ro + R_CLS]
            if cls == CLS_FIXED or cls == CLS_LINEAR:
                sp = (v + _formula(st, p, st[ro + R_START], vo)) // ps
                ep = -((-(v + _formula(st, p, st[ro + R_END], vo))) // ps)
                sp = a_s if sp < a_s else sp
                ep = a_e if ep > a_e else ep
                if ep > sp:
                    n = _put(st, out, end, n, sp, ep)
            elif cls == CLS_STRIDED:
                s0 = v + _formula(st, p, st[ro + R_START], vo)
                cnt = _formula(st, p, st[ro + R_COUNT], vo)
                ch = _formula(st, p, st[ro + R_CHUNK], vo)
                sd = _formula(st, p, st[ro + R_STRIDE], vo)
                if cnt > FEW_CHUNKS:   # predictor._useful_chunks: the chunks that can touch the allocation
                    if sd > 0:
                        useful = -((-(a_e * ps - s0)) // sd)
                    elif sd < 0:
                        useful = -((-(s0 + ch - a_s * ps)) // (-sd))
                    else:
                        useful = 1
                    cnt = min(cnt, max(useful, 0))
                for j in range(max(0, min(cnt, MAX_CHUNKS))):
                    b0 = s0 + j * sd
                    sp = max(b0 // ps, a_s)
                    ep = min(-((-(b0 + ch)) // ps), a_e)
                    if ep > sp:
                        n = _put(st, out, end, n, sp, ep)
            elif cls == CLS_ALLOCATION:
                n = _put(st, out, end, n, a_s, a_e)
            else:
                n = _fallback(st, p, hid, a, a_s, a_e, st[ro + R_H0], st[ro + R_H1], n)
    if out + 2 * n > end:
        st[io + IO_VALUE] = n
        return ST_ROOM
    m = _merge(st, out, n)
    if st[io + IO_MODE] == 1:   # byte ranges, empty ones dropped
        j = 0
        for i in range(m):
            s, e = st[out + 2 * i], st[out + 2 * i + 1]
            if e > s:
                st[out + 2 * j] = s * ps
                st[out + 2 * j + 1] = (e - s) * ps
                j += 1
        return j
    return m
