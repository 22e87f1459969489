"""What a trace's fault data says about each launch, split by allocation.

Built from `pagecast.footprints.observed_footprints` (faults + coherence
migrations = pages certainly inside touched big pages), the same with the
driver's prefetch migrations (pages that may have been touched without
faulting), and the fault addresses themselves (pages certainly touched).
Intervals are split at allocation boundaries and keyed by
(launch, allocation row) so that a pointer word's region at a launch is one
`searchsorted` away. Never reads the truth table.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pagecast import footprints as FP
from pagecast import trace as T
from pagecast.uvm import BIG_PAGE

from .features import AllocIndex, kernel_groups

NONE = np.int64(-1)


def split_by_alloc(index: AllocIndex, ps: int, launch, s, e):
    """Cut page intervals at allocation ends; drop pieces outside live allocations.

    A page two allocations share (one ends inside it, the next begins there: blocks a caching
    allocator carves from one segment) goes to both. Returns (key = launch * n_alloc + row,
    start, end) sorted by key then start.
    """
    L, S, E = (np.asarray(x, np.int64) for x in (launch, s, e))
    outs = []
    if index.n == 0:   # no allocations: nothing is inside one
        z = np.zeros(0, np.int64)
        return z, z.copy(), z.copy()
    aend_page = ((index.end + np.uint64(ps - 1)) // np.uint64(ps)).astype(np.int64)
    Q = S.astype(np.uint64) * np.uint64(ps)          # the byte whose allocation the piece is in
    for _ in range(256):
        if len(S):
            a = index.lookup(Q, L, one_past=False)
            has = a >= 0
            ac = np.maximum(a, 0)
            cut = np.minimum(E, aend_page[ac])
            outs.append((L[has] * max(index.n, 1) + a[has], S[has], cut[has]))
            # the rest begins where the next allocation does (inside this one's last page, if they
            # share it)
            nxt = np.searchsorted(index.addr, index.end[ac], side="left")
            Q = index.addr[np.minimum(nxt, index.n - 1)]
            S = np.maximum((Q // np.uint64(ps)).astype(np.int64), cut - 1)
            rest = has & (nxt < index.n) & (E > S)
            L, S, E, Q = L[rest], S[rest], E[rest], Q[rest]
    if not outs:
        z = np.zeros(0, np.int64)
        return z, z.copy(), z.copy()
    k = np.concatenate([o[0] for o in outs])
    s_ = np.concatenate([o[1] for o in outs])
    e_ = np.concatenate([o[2] for o in outs])
    o = np.lexsort((s_, k))
    return k[o], s_[o], e_[o]


@dataclass
class RegionObs:
    """What the records show in the allocation a pointer word points into, one entry per launch
    (`TraceObs.region`; arrays of equal length, concatenated over a kernel's traces by `concat`).
    Pages are absolute page numbers; `base` and `alloc_eb` are bytes."""

    valid: np.ndarray      # the word points into a live allocation
    alloc: np.ndarray      # that allocation's row in the AllocIndex (-1: none)
    key: np.ndarray        # launch * n_alloc + row: the key of the launch's pieces
    r0: np.ndarray         # first observed piece (index into TraceObs.os/oe)
    npieces: np.ndarray    # observed pieces (runs) inside the fences
    O_s: np.ndarray        # the observed hull [O_s, O_e): big pages the records show touched
    O_e: np.ndarray
    A_s: np.ndarray        # the hull extended by what may have been touched (prefetch, shared big pages)
    A_e: np.ndarray
    a_pieces: np.ndarray   # pieces that may have been touched (index q0 into TraceObs.as_/ae)
    I_s: np.ndarray        # first / past-last fault page (NONE: no fault record)
    I_e: np.ndarray
    q0: np.ndarray
    lo_f: np.ndarray       # the fences: the part of the allocation this word owns
    hi_f: np.ndarray
    alloc_s: np.ndarray    # the allocation's pages [alloc_s, alloc_e)
    alloc_e: np.ndarray
    alloc_eb: np.ndarray   # the allocation's end byte
    base: np.ndarray       # the pointer's value (bytes)

    @classmethod
    def concat(cls, parts: list[RegionObs]) -> RegionObs:
        return cls(**{f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(cls)})


class TraceObs:
    """Per (launch, allocation) observations of one trace."""

    def __init__(self, trace: T.Trace, big_page: int = BIG_PAGE) -> None:
        self.trace = trace
        self.ps = ps = trace.page_size
        self.bigp = bigp = max(1, big_page // ps)
        self.index = ix = AllocIndex(trace.allocations)
        self.nA = max(ix.n, 1)
        self.alloc_s = (ix.addr // np.uint64(ps)).astype(np.int64)
        self.alloc_e = ((ix.end + np.uint64(ps - 1)) // np.uint64(ps)).astype(np.int64)
        self.names, self.codes, self.groups = kernel_groups(trace.launches)
        obs, maybe = touched_big_pages(trace, ix, bigp)
        self.n_records = trace.faults.num_rows + trace.migrations.num_rows
        lo = obs.launch_of_interval()
        self.okey, self.os, self.oe = split_by_alloc(ix, ps, lo, obs.start, obs.end)
        # A = O plus the driver's prefetch migrations (pages that may have been touched unfaulted)
        # and the big pages allocations share (touched by one of them, which one unknown)
        m = trace.migrations
        if m.num_rows:
            m = m.filter(pc.equal(m.column(T.CAUSE), "prefetch"))
        resident = FP.resident_after(trace)
        if m.num_rows or len(maybe[0]) or len(resident[0]):
            mlid = FP.attribute_by_time(trace, m.column(T.LAUNCH_ID), m.column(T.START_NS))
            ms, me = FP.page_span(m.column(T.ADDRESS).to_numpy(), m.column(T.BYTES).to_numpy(), ps)
            mlid, ms, me = (np.concatenate([x, y, z]) for x, y, z in zip((mlid, ms, me), maybe, resident))
            ok = mlid >= 0
            pk, p_s, p_e = split_by_alloc(ix, ps, mlid[ok], ms[ok], me[ok])
            keys = np.concatenate([self.okey, pk])
            uk, g = np.unique(keys, return_inverse=True)
            g, a_s, a_e = FP.merge_intervals(g.reshape(-1).astype(np.int64), np.concatenate([self.os, p_s]),
                                             np.concatenate([self.oe, p_e]), len(uk))
            self.akey, self.as_, self.ae = uk[g], a_s, a_e
        else:
            self.akey, self.as_, self.ae = self.okey.copy(), self.os.copy(), self.oe.copy()
        lows = [self.as_.min()] if len(self.as_) else []
        highs = [self.ae.max()] if len(self.ae) else []
        if ix.n:
            lows.append(self.alloc_s.min())
            highs.append(self.alloc_e.max())
        pmin = int(min(lows)) if lows else 0
        pmax = int(max(highs)) if highs else 0
        self.pmin, self.span = pmin, pmax - pmin + 1
        self.aukeys, arank = _sorted_unique(self.akey)
        if len(self.aukeys) * self.span >= 2 ** 62:  # pragma: no cover - absurd address spans
            raise ValueError(f"{trace.path}: address span too large to index")
        self.acomp = arank * self.span + (self.as_ - pmin)
        self.oukeys, orank = _sorted_unique(self.okey)
        self.ocomp_s = orank * self.span + (self.os - pmin)
        self.ocomp_e = orank * self.span + (self.oe - pmin)
        # certainly-touched pages: the fault addresses (not the driver's prefetch faults),
        # keyed through the O piece that holds them (O includes every fault page)
        self._fuk = self.oukeys
        self._fcomp = self._fp = np.zeros(0, np.int64)
        f = trace.faults
        if f.num_rows:
            f = f.filter(pc.not_equal(f.column(T.ACCESS), "prefetch"))
        if f.num_rows and len(self.os):
            flid = FP.attribute_by_time(trace, f.column(T.LAUNCH_ID), f.column(T.TIME_NS))
            fpage = (f.column(T.ADDRESS).to_numpy().astype(np.uint64) // np.uint64(ps)).astype(np.int64)
            olaunch = self.okey // self.nA
            lspan = np.int64(self.span)
            ocl = olaunch * lspan + (self.os - pmin)          # sorted: pieces are in (launch, start) order
            q = flid * lspan + (fpage - pmin)
            p = np.searchsorted(ocl, q, side="right") - 1
            pc_ = np.maximum(p, 0)
            good = (flid >= 0) & (p >= 0) & (olaunch[pc_] == flid) & (fpage < self.oe[pc_]) & (fpage >= pmin)
            comp = np.sort(orank[pc_[good]] * lspan + (fpage[good] - pmin))
            self._fcomp = comp
            self._fp = comp % lspan + pmin

    def fault_bounds(self, key: np.ndarray, lo: np.ndarray, hi: np.ndarray):
        """First and last+1 fault page inside [lo, hi) under each key; -1 where none."""
        if not len(self._fp):
            m = np.full(len(key), -1, np.int64)
            return m, m.copy()
        r = np.searchsorted(self._fuk, key)
        rc = np.minimum(r, len(self._fuk) - 1)
        known = self._fuk[rc] == key
        c_lo = rc * self.span + (lo - self.pmin)
        c_hi = rc * self.span + (hi - self.pmin)
        i = np.searchsorted(self._fcomp, c_lo, side="left")
        j = np.searchsorted(self._fcomp, c_hi, side="left") - 1
        has = known & (j >= i)
        first = np.where(has, self._fp[np.minimum(i, len(self._fp) - 1)], -1)
        last = np.where(has, self._fp[np.maximum(j, 0)] + 1, -1)
        return first, last

    def a_piece(self, key: np.ndarray, page: np.ndarray) -> np.ndarray:
        """Index of the A piece (observed or prefetched) holding `page` under `key`."""
        r = np.searchsorted(self.aukeys, key)
        rc = np.minimum(r, max(len(self.aukeys) - 1, 0))
        comp = rc * self.span + (page - self.pmin)
        p = np.searchsorted(self.acomp, comp, side="right") - 1
        return np.maximum(p, 0)

    def region(self, lids: np.ndarray, ptr: np.ndarray, lo_fence=None, hi_fence=None, hi_soft=None,
               fault_hi=None) -> RegionObs:
        """What was observed in the allocation `ptr` points into, at launches `lids` (vectorized).

        `lo_fence`/`hi_fence` (pages) limit the pieces to the part of the allocation this
        pointer owns when other pointer words point into the same allocation.
        """
        ix = self.index
        a = ix.lookup(ptr, lids)
        valid = a >= 0
        ac = np.maximum(a, 0)
        key = lids * self.nA + ac
        al_s, al_e = self.alloc_s[ac], self.alloc_e[ac]
        lo_f = al_s if lo_fence is None else np.maximum(lo_fence, al_s)
        hi_f = al_e if hi_fence is None else np.minimum(hi_fence, al_e)
        hi_s = al_e if hi_soft is None else np.minimum(np.maximum(hi_soft, hi_f), al_e)
        n0 = len(self.os)
        if n0:
            ur, comp_s, comp_e = self.oukeys, self.ocomp_s, self.ocomp_e
            qr = np.minimum(np.searchsorted(ur, key), len(ur) - 1)
            known = ur[qr] == key
            r0 = np.searchsorted(comp_e, qr * self.span + (lo_f - self.pmin), side="right")
            r1 = np.searchsorted(comp_s, qr * self.span + (hi_f - self.pmin), side="left")
            npieces = np.where(valid & known & (hi_f > lo_f), np.maximum(r1 - r0, 0), 0)
        else:
            r0 = np.zeros(len(lids), np.int64)
            npieces = np.zeros(len(lids), np.int64)
        ne = npieces > 0
        r0c = np.minimum(r0, max(n0 - 1, 0))
        r1c = np.maximum(np.minimum(r0 + npieces - 1, n0 - 1), 0)
        O_s = np.where(ne, np.maximum(self.os[r0c], lo_f) if n0 else 0, 0)
        O_e = np.where(ne, np.minimum(self.oe[r1c], hi_f) if n0 else 0, 0)
        if len(self.as_):
            pa_ = self.a_piece(key, O_s)
            pb_ = self.a_piece(key, np.maximum(O_e - 1, 0))
            A_s = np.where(ne, np.maximum(np.minimum(self.as_[pa_], O_s), lo_f), O_s)
            A_e = np.where(ne, np.minimum(np.maximum(self.ae[pb_], O_e), hi_s), O_e)
            q0 = np.searchsorted(self.akey, key, side="left")
            q1 = np.searchsorted(self.akey, key, side="right")
            a_pieces = q1 - q0
        else:
            A_s, A_e, a_pieces = O_s, np.where(ne, np.minimum(np.maximum(self.oe[r1c] if n0 else 0, O_e), hi_s),
                                               O_e), np.zeros(len(lids), np.int64)
            q0 = np.zeros(len(lids), np.int64)
        I_s, I_e = self.fault_bounds(key, O_s, O_e if fault_hi is None else np.minimum(O_e, fault_hi))
        I_s = np.where(ne, I_s, NONE)
        I_e = np.where(ne, I_e, NONE)
        return RegionObs(valid=valid, alloc=a, key=key, r0=r0, npieces=npieces, O_s=O_s, O_e=O_e, A_s=A_s, A_e=A_e,
                         a_pieces=a_pieces, I_s=I_s, I_e=I_e, q0=q0, lo_f=lo_f, hi_f=hi_f, alloc_s=al_s, alloc_e=al_e,
                         alloc_eb=ix.end[ac].astype(np.int64), base=ptr.astype(np.int64))


def touched_big_pages(trace: T.Trace, index: AllocIndex, bigp: int):
    """Per launch, the pages its records show touched: coherence migrations, and each fault page
    no migration of its launch holds widened to its big page (clipped to the allocation holding it).
    Returns (those Footprints, the (launch, start, end) pages that may have been touched).

    The driver migrates what a fault brings in, a 64 KiB big page (docs/uvm-facts.md), so on a
    complete record each fault page lies inside a coherence migration and this is the observed
    footprint. When the migration record was lost, the fault record alone still shows its big
    page touched: a lost migration leaves the evidence whole instead of cutting it into single
    pages (holes a fit would read as gaps in the region).

    Blocks a caching allocator carves from one segment may share a big page (or a page): the
    driver migrates it for a touch of either, and a fault address is page-aligned, so there the
    records show that one of them was touched, not which. Those parts are possible pages of
    both (the second value), never certain ones."""
    ps = trace.page_size
    m = trace.migrations
    m = m.filter(pc.equal(m.column(T.CAUSE), "coherence")) if m.num_rows else m
    m_lid = FP.attribute_by_time(trace, m.column(T.LAUNCH_ID), m.column(T.START_NS))
    ms, me = FP.page_span(m.column(T.ADDRESS).to_numpy(), m.column(T.BYTES).to_numpy(), ps)
    big_cuts = _shared_units(index, ps, bigp)
    (ms, me, m_lid), (xs, xe, xl) = _cut_units(big_cuts, bigp, m_lid, ms, me)
    f = trace.faults
    f_lid = FP.attribute_by_time(trace, f.column(T.LAUNCH_ID), f.column(T.TIME_NS))
    f_page = (f.column(T.ADDRESS).to_numpy().astype(np.uint64) // np.uint64(ps)).astype(np.int64)
    fs, fe = f_page, f_page + 1
    maybe = [(xl, xs, xe)]
    if index.n and len(f_page):
        lone = ~_covered(m_lid, ms, me, f_lid, f_page)
        ambiguous = np.zeros(len(f_page), bool)
        page_cuts = _shared_units(index, ps, 1)
        if len(page_cuts):
            ambiguous = np.isin(f_page, page_cuts)
        fs, fe = f_page.copy(), f_page + 1
        li = np.flatnonzero(lone)          # on a complete record, none: every fault has its migration
        if len(li):
            a = index.lookup(f_page[li].astype(np.uint64) * np.uint64(ps), np.maximum(f_lid[li], 0), one_past=False)
            ac = np.maximum(a, 0)
            a_s = (index.addr[ac] // np.uint64(ps)).astype(np.int64)
            a_e = ((index.end[ac] + np.uint64(ps - 1)) // np.uint64(ps)).astype(np.int64)
            bs = (f_page[li] // bigp) * bigp
            # a lone fault in a big page allocations share shows that big page touched, by one of
            # them (possible pages of both); elsewhere its big page, in its own allocation
            shared = np.isin(bs, big_cuts) if len(big_cuts) else np.zeros(len(li), bool)
            wide = (a >= 0) & ~shared
            fs[li] = np.where(wide, np.maximum(bs, a_s), f_page[li])
            fe[li] = np.where(wide, np.minimum(bs + bigp, a_e), f_page[li] + 1)
            sh = shared & (a >= 0) & ~ambiguous[li]
            maybe.append((f_lid[li][sh], bs[sh], bs[sh] + bigp))
        # a fault on a page two allocations share says one of them was touched, not which
        maybe.append((f_lid[ambiguous], f_page[ambiguous], f_page[ambiguous] + 1))
        # a fault a migration holds adds nothing to the union
        keep = lone & ~ambiguous
        f_lid, fs, fe = f_lid[keep], fs[keep], fe[keep]
    certain = FP.Footprints.from_intervals(np.concatenate([f_lid, m_lid]), np.concatenate([fs, ms]),
                                           np.concatenate([fe, me]), trace.n_launches, ps, "observed")
    return certain, tuple(np.concatenate([m_[i] for m_ in maybe]) for i in range(3))


def lone_records(trace: T.Trace, bigp: int) -> tuple[int, int, int, int]:
    """The trace's own evidence of lost records: (faults, faults no coherence migration of their
    launch holds, single-big-page coherence migrations, those no fault of their launch lies in).

    On a complete record every fault's big page migrates (docs/uvm-facts.md): a fault whose
    migration is missing lost that record, and a migration of one big page whose fault is
    missing lost that one; each share estimates the loss rate (migrations over several big
    pages are left out: they lose their evidence only when every fault inside is lost)."""
    ps = trace.page_size
    m, f = trace.migrations, trace.faults
    if m.num_rows:
        m = m.filter(pc.equal(m.column(T.CAUSE), "coherence"))
    if f.num_rows:
        f = f.filter(pc.not_equal(f.column(T.ACCESS), "prefetch"))
    if not m.num_rows or not f.num_rows:
        return int(f.num_rows), 0, int(m.num_rows), 0
    m_lid = np.asarray(FP.attribute_by_time(trace, m.column(T.LAUNCH_ID), m.column(T.START_NS)), np.int64)
    ms, me = FP.page_span(m.column(T.ADDRESS).to_numpy(), m.column(T.BYTES).to_numpy(), ps)
    f_lid = np.asarray(FP.attribute_by_time(trace, f.column(T.LAUNCH_ID), f.column(T.TIME_NS)), np.int64)
    f_page = (f.column(T.ADDRESS).to_numpy().astype(np.uint64) // np.uint64(ps)).astype(np.int64)
    fo, mo = f_lid >= 0, m_lid >= 0
    f_lid, f_page = f_lid[fo], f_page[fo]
    m_lid, ms, me = m_lid[mo], np.asarray(ms, np.int64)[mo], np.asarray(me, np.int64)[mo]
    if not len(f_page) or not len(ms):
        return int(len(f_page)), 0, int(len(ms)), 0
    lone_f = int((~_covered(m_lid, ms, me, f_lid, f_page)).sum())
    one = (me - ms) <= bigp
    lo = min(int(ms.min()), int(f_page.min()))
    span = np.int64(max(int(me.max()), int(f_page.max())) - lo + 1)
    fk = np.sort(f_lid * span + (f_page - lo))
    a = np.searchsorted(fk, m_lid[one] * span + (ms[one] - lo), side="left")
    b = np.searchsorted(fk, m_lid[one] * span + (me[one] - lo), side="left")
    return int(len(f_page)), lone_f, int(one.sum()), int((b == a).sum())


def _covered(m_lid, ms, me, lid, page) -> np.ndarray:
    """Is each (launch, page) inside a migrated range of that launch? (Ranges sorted by launch and
    start once; a launch's migrations do not overlap, each big page migrates once.)"""
    lid = np.asarray(lid, np.int64)
    page = np.asarray(page, np.int64)
    if not len(ms):
        return np.zeros(len(page), bool)
    lo = min(int(ms.min()), int(page.min()))
    span = np.int64(max(int(me.max()), int(page.max())) - lo + 1)
    km = np.asarray(m_lid, np.int64) * span + (ms - lo)
    if len(km) > 1 and not (km[1:] >= km[:-1]).all():
        o = np.argsort(km)
        km, ends, ml = km[o], me[o], np.asarray(m_lid, np.int64)[o]
    else:
        ends, ml = me, np.asarray(m_lid, np.int64)
    j = np.searchsorted(km, lid * span + (page - lo), side="right") - 1
    jc = np.maximum(j, 0)
    return (j >= 0) & (ml[jc] == lid) & (ends[jc] > page)


def _inside(fp: FP.Footprints, launch: np.ndarray, page: np.ndarray) -> np.ndarray:
    """Is each (launch, page) inside one of the launch's (merged) intervals?"""
    launch = np.asarray(launch, np.int64)
    if not len(fp.start):
        return np.zeros(len(page), bool)
    return _covered(fp.launch_of_interval(), fp.start, fp.end, launch, page) & (launch >= 0) & \
        (launch < fp.n_launches)


def _shared_units(index: AllocIndex, ps: int, unit: int) -> np.ndarray:
    """First pages of the units (`unit` pages: a big page, or one page) two allocations share:
    one ends inside it and another begins there (ranges that overlap are one address reused over
    time, never live together). Sorted."""
    if index.n < 2:
        return np.zeros(0, np.int64)
    u = np.int64(unit) * ps
    addr, end = index.addr.astype(np.int64), index.end.astype(np.int64)
    nxt = np.searchsorted(addr, end, side="left")
    hi = (end % u != 0) & (nxt < len(addr)) & (addr[np.minimum(nxt, len(addr) - 1)] < -(-end // u) * u)
    ends = np.sort(end)
    prv = np.searchsorted(ends, addr, side="right") - 1
    lo = (addr % u != 0) & (prv >= 0) & (ends[np.maximum(prv, 0)] > (addr // u) * u)
    return np.unique(np.concatenate([addr[lo], end[hi]]) // u * unit)


def _cut_units(cuts: np.ndarray, unit: int, lid, ms, me):
    """Split page ranges into the parts outside the units starting at `cuts` and the parts inside:
    ((start, end, launch) outside, (start, end, launch) inside)."""
    lid = np.asarray(lid)
    if not len(cuts) or not len(ms):
        z = np.zeros(0, np.int64)
        return (ms, me, lid), (z, z.copy(), z.copy())
    big_lo, big_hi = cuts, cuts + unit
    out, ins = ([], [], []), ([], [], [])
    s, e, l = np.asarray(ms), np.asarray(me), lid
    while len(s):
        k = np.minimum(np.searchsorted(big_hi, s, side="right"), len(big_lo) - 1)
        hit = (big_hi[k] > s) & (big_lo[k] < e)          # the next shared unit overlaps the range
        for acc, v in zip(out, (s[~hit], e[~hit], l[~hit])):
            acc.append(v)
        s, e, l, k = s[hit], e[hit], l[hit], k[hit]
        before = big_lo[k] > s                           # the part before it, the part in it, the rest
        for acc, v in zip(out, (s[before], big_lo[k][before], l[before])):
            acc.append(v)
        for acc, v in zip(ins, (np.maximum(s, big_lo[k]), np.minimum(e, big_hi[k]), l)):
            acc.append(v)
        s = big_hi[k]
        keep = e > s
        s, e, l = s[keep], e[keep], l[keep]
    return tuple(np.concatenate(a) for a in out), tuple(np.concatenate(a) for a in ins)


def _sorted_unique(keys: np.ndarray):
    """(unique values, rank of each) of an already sorted array, without sorting again."""
    if len(keys) == 0:
        return keys.copy(), np.zeros(0, np.int64)
    new = np.r_[True, keys[1:] != keys[:-1]]
    return keys[new], np.cumsum(new) - 1


def prefetch_free(trace: T.Trace) -> bool:
    return trace.manifest.get("driver_prefetch") is False


def launch_column(trace: T.Trace, col: str, idx: np.ndarray) -> np.ndarray:
    return trace.launches.column(col).take(pa.array(idx)).to_numpy()
