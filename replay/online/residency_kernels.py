"""The residency estimate's kernels (numba, cache=True): one launch's prefetch, victims and
bookkeeping in one call over one int64 state array (`unit_residency.UnitResidency` owns it).

Long because the launch's step is one kernel (one call per launch is the budget: numba's
dispatcher costs 0.1 us per argument), its helpers stay in its file (numba's cache is per file: a
kernel calling another file's functions keeps its cached code after they change) and its phases
share the state's layout: it first decides
everything without changing the state (what to prefetch, the victims, what streams), so that a
section that must grow (`ST_GROW`) or victim scores that Python must supply (`ST_SCORES`) can be
handed back and the call repeated, then changes the state.

The state, sections found through its first `R_*` slots:

- scalars (`S_*`): capacity, unit, victim rule, resident bytes, counters, the stamp and call
  counters, the pool's top, the use log's counters;
- slots: one per 2 MiB unit ever seen (`F_*` fields): its unit number, whether it is resident and
  with how many bytes, its resident byte ranges (a segment of the pool: offset, count, capacity),
  its stamp (FIFO order of becoming resident, LRU order of use), its place in the resident list,
  its last use, its first use within the period (an entry of the use log), its last log entry;
- a hash table from unit numbers to slots (open addressing);
- the pool of resident byte ranges (start, end), per slot a segment, merged as
  `Residency.resident[u]` is;
- the list of resident slots (what victims are chosen from);
- the use log (template's next-use victims): a ring of (launch, slot, next entry of that slot),
  holding at least the last `max_period` launches' uses;
- io: outputs (prefetch then evict ranges, (address, nbytes)); candidates and their scores.

Victims are the resident units outside the launch, by score (largest first, ties: lowest unit),
as `Residency._victims`: fifo/lru by stamp, next-use from the use log (the unit's first use in the
last period P is predicted again P launches later; none: never; no period: least recently used),
belady or any Python scorer from scores handed in. Choosing them scores every resident unit
(a heap over them), as the reference does: O(resident units) per launch that evicts.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pagecast.predict.compiled_kernels import coalesce   # merging sorted rows, shared

# ---- sections --------------------------------------------------------------------------------
(R_SCAL, R_SLOTS, R_SCAP, R_HASH, R_HCAP, R_POOL, R_PCAP, R_LIST, R_LOG, R_LCAP, R_IO, R_IOCAP,
 R_SCR, R_SCRCAP) = range(14)
RMETA = 16
# scalars
(S_CAP, S_UNIT, S_RULE, S_RBYTES, S_OVERFLOWS, S_EVBYTES, S_EVICTIONS, S_NSLOT, S_STAMP, S_PTOP, S_LIVE,
 S_NRES, S_CALL, S_LOGN, S_EXP, S_WINP, S_MAXP, S_RET, S_NEED, S_NEEDWHAT, S_CANDN) = range(21)
NSCAL = 24
# slot fields
(F_UNIT, F_RES, F_BYTES, F_OFF, F_CNT, F_CAP, F_STAMP, F_RPOS, F_LAST, F_FIRST, F_LASTE, F_MARK, F_MINE,
 F_NEWB, F_NEWCNT, F_DROP) = range(16)
NF = 16
LW = 3   # log entry: launch, slot, next entry

RULE_FIFO, RULE_LRU, RULE_SEQ, RULE_SCORED = range(4)
GROW_SLOTS, GROW_POOL, GROW_LOG, GROW_IO, GROW_SCR = range(5)
ST_GROW, ST_SCORES, ST_TOOMANY = -1, -2, -3
MAX_RANGES = 1 << 24     # ranges in or out of one step (its counts are packed in 24 bits)
# flags of `step`
FL_KNOWN, FL_FRONT, FL_RECORD, FL_SCORED, FL_MISSING = 1, 2, 4, 8, 16
EMPTY = -1
INF_KEY = np.inf


@njit(cache=True)
def find_slot(rs, u):
    """The slot of unit u, or -1."""
    h = rs[R_HASH]
    mask = rs[R_HCAP] - 1
    i = ((u * np.int64(-7046029254386353131)) >> np.int64(20)) & mask
    while True:
        k = rs[h + 2 * i]
        if k == u:
            return rs[h + 2 * i + 1]
        if k == EMPTY:
            return -1
        i = (i + 1) & mask


@njit(cache=True)
def _new_slot(rs, u):
    sc, so = rs[R_SCAL], rs[R_SLOTS]
    s = rs[sc + S_NSLOT]
    rs[sc + S_NSLOT] = s + 1
    b = so + s * NF
    for f in range(NF):
        rs[b + f] = 0
    rs[b + F_UNIT] = u
    rs[b + F_RPOS] = -1
    rs[b + F_LAST] = -1
    rs[b + F_FIRST] = -1
    rs[b + F_LASTE] = -1
    rs[b + F_MARK] = -1
    rs[b + F_DROP] = -1
    h = rs[R_HASH]
    mask = rs[R_HCAP] - 1
    i = ((u * np.int64(-7046029254386353131)) >> np.int64(20)) & mask
    while rs[h + 2 * i] != EMPTY:
        i = (i + 1) & mask
    rs[h + 2 * i] = u
    rs[h + 2 * i + 1] = s
    return s


@njit(cache=True)
def rehash(rs):
    """Fill the (empty, resized) hash table from the slots."""
    h = rs[R_HASH]
    for i in range(rs[R_HCAP]):
        rs[h + 2 * i] = EMPTY
    so = rs[R_SLOTS]
    mask = rs[R_HCAP] - 1
    for s in range(rs[rs[R_SCAL] + S_NSLOT]):
        u = rs[so + s * NF + F_UNIT]
        i = ((u * np.int64(-7046029254386353131)) >> np.int64(20)) & mask
        while rs[h + 2 * i] != EMPTY:
            i = (i + 1) & mask
        rs[h + 2 * i] = u
        rs[h + 2 * i + 1] = s


@njit(cache=True)
def _grow(rs, what, need):
    sc = rs[R_SCAL]
    rs[sc + S_NEEDWHAT] = what
    rs[sc + S_NEED] = need
    return ST_GROW


# ---- ranges in the scratch section (rows of (start, end)) ----------------------------------------
@njit(cache=True)
def _sort_rows(rs, at, n):
    """Sort n (start, end) rows at rs[at:] by start (then end)."""
    if n <= 16:
        for i in range(1, n):
            s, e = rs[at + 2 * i], rs[at + 2 * i + 1]
            j = i - 1
            while j >= 0 and (rs[at + 2 * j] > s or (rs[at + 2 * j] == s and rs[at + 2 * j + 1] > e)):
                rs[at + 2 * j + 2] = rs[at + 2 * j]
                rs[at + 2 * j + 3] = rs[at + 2 * j + 1]
                j -= 1
            rs[at + 2 * j + 2] = s
            rs[at + 2 * j + 3] = e
        return
    s0 = rs[at:at + 2 * n:2].copy()
    e0 = rs[at + 1:at + 2 * n:2].copy()
    order = np.argsort(s0, kind="mergesort")
    for i in range(n):
        rs[at + 2 * i] = s0[order[i]]
        rs[at + 2 * i + 1] = e0[order[i]]


@njit(cache=True)
def _load(rs, at, src, off, n):
    """(address, nbytes) pairs of src -> sorted, merged (start, end) rows at rs[at:], empty ones
    dropped, as merge_ranges does; returns the count."""
    k = 0
    for i in range(n):
        a, b = src[off + 2 * i], src[off + 2 * i + 1]
        if b > 0:
            rs[at + 2 * k] = a
            rs[at + 2 * k + 1] = a + b
            k += 1
    _sort_rows(rs, at, k)
    return coalesce(rs, at, k)


@njit(cache=True)
def _span_units(src, off, n, unit):
    c = 0
    for i in range(n):
        a, b = src[off + 2 * i], src[off + 2 * i + 1]
        if b > 0:
            c += (a + b - 1) // unit - a // unit + 1
    return c


# ---- per-unit range arithmetic over a slot's segment ---------------------------------------------
@njit(cache=True)
def _minus(rs, s, a, e, out, n):
    """[a, e) minus slot s's resident ranges, appended at rs[out:] from row n; returns the count."""
    if s < 0 or rs[rs[R_SLOTS] + s * NF + F_RES] == 0:
        rs[out + 2 * n] = a
        rs[out + 2 * n + 1] = e
        return n + 1
    b = rs[R_SLOTS] + s * NF
    po = rs[R_POOL] + 2 * rs[b + F_OFF]
    cur = a
    for i in range(rs[b + F_CNT]):
        hs, he = rs[po + 2 * i], rs[po + 2 * i + 1]
        if he <= cur:
            continue
        if hs >= e:
            break
        if hs > cur:
            rs[out + 2 * n] = cur
            rs[out + 2 * n + 1] = hs
            n += 1
        cur = max(cur, he)
        if cur >= e:
            break
    if cur < e:
        rs[out + 2 * n] = cur
        rs[out + 2 * n + 1] = e
        n += 1
    return n


@njit(cache=True)
def _union(rs, s, pieces, k, out):
    """Slot s's resident ranges (if resident) merged with k sorted rows at pieces, written at
    rs[out:]; returns (count, bytes)."""
    n = 0
    cnt = 0
    po = 0
    if s >= 0 and rs[rs[R_SLOTS] + s * NF + F_RES] != 0:
        b = rs[R_SLOTS] + s * NF
        cnt = rs[b + F_CNT]
        po = rs[R_POOL] + 2 * rs[b + F_OFF]
    i = j = 0
    while i < cnt or j < k:
        if j >= k or (i < cnt and rs[po + 2 * i] <= rs[pieces + 2 * j]):
            a, e = rs[po + 2 * i], rs[po + 2 * i + 1]
            i += 1
        else:
            a, e = rs[pieces + 2 * j], rs[pieces + 2 * j + 1]
            j += 1
        if n > 0 and a <= rs[out + 2 * n - 1]:
            if e > rs[out + 2 * n - 1]:
                rs[out + 2 * n - 1] = e
        else:
            rs[out + 2 * n] = a
            rs[out + 2 * n + 1] = e
            n += 1
    tot = 0
    for q in range(n):
        tot += rs[out + 2 * q + 1] - rs[out + 2 * q]
    return n, tot


@njit(cache=True)
def _set_ranges(rs, s, at, n):
    """Slot s's resident ranges := the n rows at rs[at:] (a new segment when they outgrow it)."""
    b = rs[R_SLOTS] + s * NF
    if n > rs[b + F_CAP]:
        sc = rs[R_SCAL]
        c = max(4, 2 * n)
        rs[b + F_OFF] = rs[sc + S_PTOP]
        rs[b + F_CAP] = c
        rs[sc + S_PTOP] += c
    po = rs[R_POOL] + 2 * rs[b + F_OFF]
    for i in range(2 * n):
        rs[po + i] = rs[at + i]
    rs[b + F_CNT] = n


@njit(cache=True)
def compact_pool(rs):
    """Move the resident slots' segments down to the pool's start (their capacity = their count)."""
    sc, so, lo = rs[R_SCAL], rs[R_SLOTS], rs[R_LIST]
    nres = rs[sc + S_NRES]
    offs = np.empty(nres, np.int64)
    for i in range(nres):
        offs[i] = rs[so + rs[lo + i] * NF + F_OFF]
    order = np.argsort(offs, kind="mergesort")
    top = 0
    pool = rs[R_POOL]
    for q in range(nres):
        s = rs[lo + order[q]]
        b = so + s * NF
        src = pool + 2 * rs[b + F_OFF]
        for i in range(2 * rs[b + F_CNT]):
            rs[pool + 2 * top + i] = rs[src + i]
        rs[b + F_OFF] = top
        rs[b + F_CAP] = rs[b + F_CNT]
        top += rs[b + F_CNT]
    for s in range(rs[sc + S_NSLOT]):
        if rs[so + s * NF + F_RES] == 0:
            rs[so + s * NF + F_CAP] = 0
            rs[so + s * NF + F_CNT] = 0
    rs[sc + S_PTOP] = top


@njit(cache=True)
def _make_resident(rs, s):
    sc, so, lo = rs[R_SCAL], rs[R_SLOTS], rs[R_LIST]
    b = so + s * NF
    rs[b + F_RES] = 1
    n = rs[sc + S_NRES]
    rs[lo + n] = s
    rs[b + F_RPOS] = n
    rs[sc + S_NRES] = n + 1
    rs[sc + S_STAMP] += 1
    rs[b + F_STAMP] = rs[sc + S_STAMP]


@njit(cache=True)
def _drop_resident(rs, s):
    """Slot s leaves the estimate (evicted, streamed out, released)."""
    sc, so, lo = rs[R_SCAL], rs[R_SLOTS], rs[R_LIST]
    b = so + s * NF
    rs[sc + S_RBYTES] -= rs[b + F_BYTES]
    rs[sc + S_LIVE] -= rs[b + F_CNT]
    pos = rs[b + F_RPOS]
    last = rs[lo + rs[sc + S_NRES] - 1]
    rs[lo + pos] = last
    rs[so + last * NF + F_RPOS] = pos
    rs[sc + S_NRES] -= 1
    rs[b + F_RES] = 0
    rs[b + F_BYTES] = 0
    rs[b + F_CNT] = 0
    rs[b + F_RPOS] = -1


# ---- the use log and next-use scores ------------------------------------------------------------
@njit(cache=True)
def _log_row(rs, e):
    return rs[R_LOG] + LW * (e % rs[R_LCAP])


@njit(cache=True)
def _sync_window(rs, t, p):
    """Keep each slot's first use in (t - p, t] (F_FIRST: a log entry, -1 none) for period p."""
    sc, so = rs[R_SCAL], rs[R_SLOTS]
    if p < 1:
        rs[sc + S_WINP] = -1
        return
    logn = rs[sc + S_LOGN]
    if rs[sc + S_WINP] != p:
        for s in range(rs[sc + S_NSLOT]):
            rs[so + s * NF + F_FIRST] = -1
        lo = max(logn - rs[R_LCAP], 0)
        e = logn - 1
        while e >= lo and rs[_log_row(rs, e)] > t - p:
            e -= 1
        for q in range(e + 1, logn):
            s = rs[_log_row(rs, q) + 1]
            if rs[so + s * NF + F_FIRST] == -1:
                rs[so + s * NF + F_FIRST] = q
        rs[sc + S_EXP] = e + 1
        rs[sc + S_WINP] = p
        return
    q = rs[sc + S_EXP]
    while q < logn and rs[_log_row(rs, q)] <= t - p:
        r = _log_row(rs, q)
        s = rs[r + 1]
        if rs[so + s * NF + F_FIRST] == q:
            rs[so + s * NF + F_FIRST] = rs[r + 2]
        q += 1
    rs[sc + S_EXP] = q


@njit(cache=True)
def _score(rs, s, t, p):
    """SequenceNextUse.score of slot s at launch t with period p (< 1: none)."""
    b = rs[R_SLOTS] + s * NF
    if rs[b + F_LAST] < 0:
        return INF_KEY
    if p < 1:
        return float(t - rs[b + F_LAST])
    f = rs[b + F_FIRST]
    if f < 0:
        return INF_KEY
    return float(rs[_log_row(rs, f)] + p - t)


@njit(cache=True)
def _record(rs, s, t, p):
    """A use of slot s at launch t (SequenceNextUse.record)."""
    sc = rs[R_SCAL]
    b = rs[R_SLOTS] + s * NF
    if rs[b + F_LAST] == t:
        return
    e = rs[sc + S_LOGN]
    r = _log_row(rs, e)
    rs[r] = t
    rs[r + 1] = s
    rs[r + 2] = -1
    prev = rs[b + F_LASTE]
    if prev >= 0 and prev >= e + 1 - rs[R_LCAP]:
        rs[_log_row(rs, prev) + 2] = e
    rs[b + F_LASTE] = e
    rs[b + F_LAST] = t
    if p >= 1 and rs[sc + S_WINP] == p and rs[b + F_FIRST] == -1:
        rs[b + F_FIRST] = e
    rs[sc + S_LOGN] = e + 1


# ---- victims --------------------------------------------------------------------------------------
@njit(cache=True)
def _before(sc_, un_, i, j):
    """Heap order: larger score first, then lower unit."""
    return sc_[i] > sc_[j] or (sc_[i] == sc_[j] and un_[i] < un_[j])


@njit(cache=True)
def _sift(sc_, un_, sl_, i, n):
    while True:
        c = 2 * i + 1
        if c >= n:
            return
        if c + 1 < n and _before(sc_, un_, c + 1, c):
            c += 1
        if not _before(sc_, un_, c, i):
            return
        sc_[i], sc_[c] = sc_[c], sc_[i]
        un_[i], un_[c] = un_[c], un_[i]
        sl_[i], sl_[c] = sl_[c], sl_[i]
        i = c


@njit(cache=True)
def _victims(rs, serial, over, t, p, scored, out):
    """Victim slots, in order, written at rs[out:] (one per row); returns their count, or
    ST_SCORES after writing the candidates' units to io (Python scores them)."""
    sc, so, lo = rs[R_SCAL], rs[R_SLOTS], rs[R_LIST]
    rule = rs[sc + S_RULE]
    nres = rs[sc + S_NRES]
    io = rs[R_IO]
    n = 0
    for i in range(nres):
        s = rs[lo + i]
        if rs[so + s * NF + F_MARK] != serial:
            n += 1
    if rule == RULE_SCORED and n > rs[R_IOCAP]:
        return _grow(rs, GROW_IO, n)   # the candidates and their scores go through io
    if rule == RULE_SCORED and not scored:
        k = 0
        for i in range(nres):
            s = rs[lo + i]
            if rs[so + s * NF + F_MARK] != serial:
                rs[io + 2 * k] = rs[so + s * NF + F_UNIT]
                k += 1
        rs[sc + S_CANDN] = k
        return ST_SCORES
    score = np.empty(n, np.float64)
    unit = np.empty(n, np.int64)
    slot = np.empty(n, np.int64)
    given = rs[io:io + 2 * n].view(np.float64) if rule == RULE_SCORED else np.empty(0, np.float64)
    if rule == RULE_SEQ:
        _sync_window(rs, t, p)
    k = 0
    for i in range(nres):
        s = rs[lo + i]
        b = so + s * NF
        if rs[b + F_MARK] == serial:
            continue
        if rule == RULE_FIFO or rule == RULE_LRU:
            score[k] = -float(rs[b + F_STAMP])
        elif rule == RULE_SEQ:
            score[k] = _score(rs, s, t, p)
        else:
            score[k] = given[2 * k + 1]
        unit[k] = rs[b + F_UNIT]
        slot[k] = s
        k += 1
    for i in range(n // 2 - 1, -1, -1):
        _sift(score, unit, slot, i, n)
    freed = 0
    m = 0
    while n > 0 and freed < over:
        rs[out + m] = slot[0]
        m += 1
        freed += min(rs[sc + S_UNIT], rs[sc + S_CAP])   # a unit's chunk: its whole size (capped at memory)
        n -= 1
        score[0], unit[0], slot[0] = score[n], unit[n], slot[n]
        _sift(score, unit, slot, 0, n)
    return m


@njit(cache=True)
def _units_in(rs, at, n, unit):
    """Distinct units the n merged (start, end) rows at rs[at:] touch."""
    cnt = 0
    lastu = -1
    for i in range(n):
        a, e = rs[at + 2 * i], rs[at + 2 * i + 1]
        if e <= a:
            continue
        u0, u1 = a // unit, (e - 1) // unit
        cnt += u1 - u0 + 1 - (1 if u0 == lastu else 0)
        lastu = u1
    return cnt


# ---- one launch -------------------------------------------------------------------------------------
@njit(cache=True)
def step(rs, src, wspec, espec, t, flags):
    """One launch's residency decisions (LaunchDecider.decide's capacity part and Residency.admit).

    Inputs are (address, nbytes) pairs in `src`: the policy's prefetch at wspec = offset << 24 |
    count, the launch's estimated footprint at espec (-1: the same ranges). flags: FL_KNOWN (the
    estimate is known, not guessed: it streams), FL_FRONT (the policy prefetches the front of a
    launch larger than memory), FL_RECORD (record the uses for next-use), FL_SCORED (scores are in
    io), FL_MISSING (only what of the prefetch is missing; nothing changes); bits 8+: the period
    + 1 (0: none).

    Returns npf | nev << 24 | overflow << 48, the prefetch then the evict ranges (address,
    nbytes) at io, or ST_GROW / ST_SCORES (nothing changed)."""
    sc, so = rs[R_SCAL], rs[R_SLOTS]
    unit, cap = rs[sc + S_UNIT], rs[sc + S_CAP]
    # memory is taken in chunks: a unit with any resident byte takes its whole size of the capacity
    # (a chunk larger than memory all of it, as uvm_driver.chunk_weights caps it)
    wu = min(unit, cap)
    p = (flags >> 8) - 1
    woff, nw = wspec >> 24, wspec & 0xFFFFFF
    same = espec < 0
    eoff = woff if same else espec >> 24
    ne = nw if same else espec & 0xFFFFFF
    spanned = _span_units(src, woff, nw, unit) + (0 if same else _span_units(src, eoff, ne, unit))
    live, nres = rs[sc + S_LIVE], rs[sc + S_NRES]
    need = 14 * (nw + ne) + 10 * spanned + 6 * live + nres + 16   # int64s of scratch, at most
    if need > rs[R_SCRCAP]:
        return _grow(rs, GROW_SCR, need)
    scr = rs[R_SCR]
    # the prefetch (merged), its front when the launch is larger than memory, and what is missing
    w_at = scr
    nwm = _load(rs, w_at, src, woff, nw)
    cur = w_at + 2 * nwm
    if same:
        e_at, nem = w_at, nwm
    else:
        e_at = cur
        nem = _load(rs, e_at, src, eoff, ne)
        cur = e_at + 2 * nem
    f_at, nf = w_at, nwm
    if flags & FL_KNOWN and flags & FL_FRONT:
        # memory is taken in whole units (2 MiB chunks): the launch is larger than memory when its
        # units are more than the capacity's, and its front is its first capacity's worth of units
        cap_units = cap // wu
        if _units_in(rs, e_at, nem, unit) > cap_units:
            f_at = cur
            nf = 0
            seen = 0
            lastu = -1
            for i in range(nwm):
                a, e = rs[w_at + 2 * i], rs[w_at + 2 * i + 1]
                cut = e
                x = a
                while x < e:
                    u = x // unit
                    if u != lastu:
                        if seen >= cap_units:
                            cut = x
                            break
                        seen += 1
                        lastu = u
                    x = (u + 1) * unit
                if cut > a:
                    rs[f_at + 2 * nf] = a
                    rs[f_at + 2 * nf + 1] = cut
                    nf += 1
                if cut < e:
                    break
            cur = f_at + 2 * nf
    pf_at = cur
    npf = 0
    for i in range(nf):
        a, e = rs[f_at + 2 * i], rs[f_at + 2 * i + 1]
        while a < e:
            b = min(e, (a // unit + 1) * unit)
            npf = _minus(rs, find_slot(rs, a // unit), a, b, pf_at, npf)
            a = b
    npf = coalesce(rs, pf_at, npf)
    cur = pf_at + 2 * npf
    if flags & FL_MISSING:
        if npf > rs[R_IOCAP]:
            return _grow(rs, GROW_IO, npf)
        _emit(rs, pf_at, npf, 0)
        return npf
    # what the launch is counted to hold: the estimate and the prefetch, merged, split per unit
    if same:
        a_at, na = w_at, nwm
    else:
        a_at = cur
        for i in range(nem):
            rs[a_at + 2 * i] = rs[e_at + 2 * i]
            rs[a_at + 2 * i + 1] = rs[e_at + 2 * i + 1]
        for i in range(nwm):
            rs[a_at + 2 * (nem + i)] = rs[w_at + 2 * i]
            rs[a_at + 2 * (nem + i) + 1] = rs[w_at + 2 * i + 1]
        _sort_rows(rs, a_at, nem + nwm)
        na = coalesce(rs, a_at, nem + nwm)
        cur = a_at + 2 * na
    parts = cur
    npart = 0
    for i in range(na):
        a, e = rs[a_at + 2 * i], rs[a_at + 2 * i + 1]
        while a < e:
            b = min(e, (a // unit + 1) * unit)
            rs[parts + 2 * npart] = a
            rs[parts + 2 * npart + 1] = b
            npart += 1
            a = b
    cur = parts + 2 * npart
    # per unit: its slot, the launch's own bytes, the bytes it will hold; room for what is new
    rs[sc + S_CALL] += 1
    serial = rs[sc + S_CALL]
    units = cur            # rows: (slot or -unit-1 when new, first part)
    nu = 0
    new = 0
    grow_pool = 0     # segment rows the units may take (each at most twice its ranges, and 4)
    rows = 0          # the most ranges one unit may hold
    i = 0
    while i < npart:
        u = rs[parts + 2 * i] // unit
        j = i
        while j < npart and rs[parts + 2 * j] // unit == u:
            j += 1
        s = find_slot(rs, u)
        rs[units + 2 * nu] = s if s >= 0 else -u - 1
        rs[units + 2 * nu + 1] = i
        nu += 1
        k = j - i
        if s < 0:
            new += 1
        else:
            k += rs[so + s * NF + F_CNT]
        grow_pool += 2 * k + 4
        rows = max(rows, k)
        i = j
    rs[units + 2 * nu + 1] = npart
    cur = units + 2 * nu + 2
    nslot = rs[sc + S_NSLOT]
    if nslot + new > rs[R_SCAP] or 2 * (nslot + new) > rs[R_HCAP]:
        return _grow(rs, GROW_SLOTS, nslot + new)
    if live + grow_pool > rs[R_PCAP]:
        return _grow(rs, GROW_POOL, live + grow_pool)
    if flags & FL_RECORD:
        ret = rs[sc + S_RET]
        while ret < rs[sc + S_LOGN] and rs[_log_row(rs, ret)] <= t - rs[sc + S_MAXP]:
            ret += 1
        rs[sc + S_RET] = ret
        if rs[sc + S_LOGN] + nu - rs[R_LCAP] > ret:
            return _grow(rs, GROW_LOG, rs[sc + S_LOGN] + nu - ret)
    tmp = cur   # one unit's union at a time
    growth = own = launch = 0
    for q in range(nu):
        s = rs[units + 2 * q]
        i0, i1 = rs[units + 2 * q + 1], rs[units + 2 * q + 3]
        mine = 0
        for i in range(i0, i1):
            mine += rs[parts + 2 * i + 1] - rs[parts + 2 * i]
        launch += wu   # each unit's chunk takes its whole size (uvm_driver.room_for)
        n, b = _union(rs, s, parts + 2 * i0, i1 - i0, tmp)
        if s >= 0:
            x = so + s * NF
            rs[x + F_MARK] = serial
            rs[x + F_MINE] = mine
            rs[x + F_NEWB] = b
            rs[x + F_NEWCNT] = n
            if rs[x + F_RES] == 0:
                growth += wu
        else:
            growth += wu
        own += wu
    over = rs[sc + S_NRES] * wu + growth - cap
    vict = tmp + 2 * rows
    nv = 0
    overflow = 0
    if over > 0:
        nv = _victims(rs, serial, over, t, p, flags & FL_SCORED, vict)
        if nv < 0:
            return nv   # ST_SCORES, or ST_GROW for io
        if own > cap:
            overflow = 1
    # the victims' ranges, merged: what to evict
    ev_at = vict + nv
    nev = 0
    for q in range(nv):
        x = so + rs[vict + q] * NF
        po = rs[R_POOL] + 2 * rs[x + F_OFF]
        for i in range(rs[x + F_CNT]):
            rs[ev_at + 2 * nev] = rs[po + 2 * i]
            rs[ev_at + 2 * nev + 1] = rs[po + 2 * i + 1]
            nev += 1
    _sort_rows(rs, ev_at, nev)
    nev = coalesce(rs, ev_at, nev)
    if npf >= MAX_RANGES or nev >= MAX_RANGES:
        return ST_TOOMANY
    if npf + nev > rs[R_IOCAP]:
        return _grow(rs, GROW_IO, npf + nev)
    # ---- from here on the state changes ----
    if rs[R_PCAP] - rs[sc + S_PTOP] < grow_pool:
        compact_pool(rs)
    streams = (flags & FL_KNOWN) != 0 and launch > cap
    for q in range(nu):   # every unit has a slot (the uses are recorded before admission)
        s = rs[units + 2 * q]
        if s < 0:
            s = _new_slot(rs, -s - 1)
            rs[units + 2 * q] = s
            i0, i1 = rs[units + 2 * q + 1], rs[units + 2 * q + 3]
            x = so + s * NF
            rs[x + F_MARK] = serial
            mine = 0
            for i in range(i0, i1):
                mine += rs[parts + 2 * i + 1] - rs[parts + 2 * i]
            rs[x + F_MINE] = mine
            rs[x + F_NEWB] = mine
            rs[x + F_NEWCNT] = i1 - i0
    if flags & FL_RECORD:
        if p >= 1 and rs[sc + S_WINP] == p:
            _sync_window(rs, t, p)   # before entries are overwritten
        for q in range(nu):
            _record(rs, rs[units + 2 * q], t, p)
    for q in range(nv):
        _drop_resident(rs, rs[vict + q])
    if streams:   # only the launch's last units, a capacity's worth, stay (Residency.admit)
        for q in range(nu):
            if launch <= cap:
                break
            s = rs[units + 2 * q]
            rs[so + s * NF + F_DROP] = serial
            if rs[so + s * NF + F_RES] != 0:
                _drop_resident(rs, s)
            launch -= wu
    lru = rs[sc + S_RULE] == RULE_LRU
    for q in range(nu):
        s = rs[units + 2 * q]
        x = so + s * NF
        if rs[x + F_DROP] == serial:
            continue
        i0, i1 = rs[units + 2 * q + 1], rs[units + 2 * q + 3]
        was = rs[x + F_RES] != 0
        n, b = _union(rs, s, parts + 2 * i0, i1 - i0, tmp)
        old_cnt = rs[x + F_CNT] if was else 0
        if not was or n != old_cnt or b != rs[x + F_BYTES]:
            _set_ranges(rs, s, tmp, n)
        rs[sc + S_LIVE] += n - old_cnt
        if was:
            rs[sc + S_RBYTES] += b - rs[x + F_BYTES]
            if lru:
                rs[sc + S_STAMP] += 1
                rs[x + F_STAMP] = rs[sc + S_STAMP]
        else:
            _make_resident(rs, s)
            rs[sc + S_RBYTES] += b
        rs[x + F_BYTES] = b
    rs[sc + S_EVICTIONS] += nv
    evb = 0
    for i in range(nev):
        evb += rs[ev_at + 2 * i + 1] - rs[ev_at + 2 * i]
    rs[sc + S_EVBYTES] += evb
    rs[sc + S_OVERFLOWS] += overflow
    _emit(rs, pf_at, npf, 0)
    _emit(rs, ev_at, nev, npf)
    return npf | (nev << 24) | (overflow << 48)


@njit(cache=True)
def _emit(rs, at, n, row):
    """(start, end) rows -> (address, nbytes) at io row `row`."""
    io = rs[R_IO] + 2 * row
    for i in range(n):
        rs[io + 2 * i] = rs[at + 2 * i]
        rs[io + 2 * i + 1] = rs[at + 2 * i + 1] - rs[at + 2 * i]


@njit(cache=True)
def release(rs, src, spec):
    """Forget the parts of the ranges at src (spec = offset << 24 | count) the estimate holds
    (Residency.release); returns the bytes released, or ST_GROW (nothing changed)."""
    sc, so = rs[R_SCAL], rs[R_SLOTS]
    unit = rs[sc + S_UNIT]
    off, n = spec >> 24, spec & 0xFFFFFF
    spanned = _span_units(src, off, n, unit)
    live = rs[sc + S_LIVE]
    need = 6 * n + 4 * spanned + 2 * live + 16
    if need > rs[R_SCRCAP]:
        return _grow(rs, GROW_SCR, need)
    scr = rs[R_SCR]
    m = _load(rs, scr, src, off, n)
    parts = scr + 2 * m
    npart = 0
    for i in range(m):
        a, e = rs[scr + 2 * i], rs[scr + 2 * i + 1]
        while a < e:
            b = min(e, (a // unit + 1) * unit)
            rs[parts + 2 * npart] = a
            rs[parts + 2 * npart + 1] = b
            npart += 1
            a = b
    grow_pool = 0
    i = 0
    while i < npart:
        j = i
        while j < npart and rs[parts + 2 * j] // unit == rs[parts + 2 * i] // unit:
            j += 1
        s = find_slot(rs, rs[parts + 2 * i] // unit)
        if s >= 0:
            grow_pool += 2 * (rs[so + s * NF + F_CNT] + j - i) + 4
        i = j
    if live + grow_pool > rs[R_PCAP]:
        return _grow(rs, GROW_POOL, live + grow_pool)
    if rs[R_PCAP] - rs[sc + S_PTOP] < grow_pool:
        compact_pool(rs)
    tmp = parts + 2 * npart
    freed = 0
    i = 0
    while i < npart:
        u = rs[parts + 2 * i] // unit
        j = i
        while j < npart and rs[parts + 2 * j] // unit == u:
            j += 1
        s = find_slot(rs, u)
        if s >= 0 and rs[so + s * NF + F_RES] != 0:
            x = so + s * NF
            po = rs[R_POOL] + 2 * rs[x + F_OFF]
            k = 0
            for q in range(rs[x + F_CNT]):   # the slot's ranges minus the pieces (subtract_ranges)
                cur, he = rs[po + 2 * q], rs[po + 2 * q + 1]
                for r in range(i, j):
                    a, b = rs[parts + 2 * r], rs[parts + 2 * r + 1]
                    if b <= cur or a >= he:
                        continue
                    if a > cur:
                        rs[tmp + 2 * k] = cur
                        rs[tmp + 2 * k + 1] = a
                        k += 1
                    cur = max(cur, b)
                if cur < he:
                    rs[tmp + 2 * k] = cur
                    rs[tmp + 2 * k + 1] = he
                    k += 1
            left = 0
            for q in range(k):
                left += rs[tmp + 2 * q + 1] - rs[tmp + 2 * q]
            freed += rs[x + F_BYTES] - left
            if k == 0:
                _drop_resident(rs, s)
            else:
                old = rs[x + F_CNT]
                rs[sc + S_RBYTES] -= rs[x + F_BYTES] - left
                _set_ranges(rs, s, tmp, k)
                rs[sc + S_LIVE] += k - old
                rs[x + F_BYTES] = left
        i = j
    return freed
