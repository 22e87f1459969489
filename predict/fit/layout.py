"""Strided layouts the arguments describe, checked on every launch.

The driver migrates big pages, and its prefetcher merges what lies close: a region of `count`
chunks every `stride` bytes shows, at big-page grain, fewer and longer runs than it has chunks
(heads closer than a big page read as one run), and a different number at each size. Fitting
count and stride from the runs seen then describes the merged picture (2 chunks every 2*stride)
or nothing at all once two profiles merge differently.

This module proposes layouts from the arguments instead: a count that is an argument (or a
product of two), a stride that is an element size times a product of arguments (element size x
dimensions: `2 * max_seq * head_dim`). For each, every launch's chunk is bounded slot by slot
(`chunk_bounds`: the observed pages in each slot bound the chunk from below, the observed run
holding each slot's start from above), one chunk formula is solved over all launches and the
layout is verified against every launch (`strided.verify_region`). `fault_pages_loglik` scores a
template by every fault it puts in its big page (each touched big page faults once, at a touched
page drawn at random: docs/template-model.md, "Where the faults land"), which separates a layout
that holds the faults with fewer pages from the merged one (docs/template-model.md, "Layouts
from the arguments").
"""

from __future__ import annotations

import itertools

import numpy as np

from pagecast.footprints import merge_intervals

from .. import formula as FM
from ..model_io import Region
from ..observe import RegionObs
from .data import KernelData
from .solve import group_evidence, solve_pair
from .strided import chunk_pages, gather_pieces, verify_region

ELEMENT_SIZES = (1, 2, 4, 8)
MAX_COUNT = 1 << 12          # chunks a proposed layout may have
MAX_SLOTS = 1 << 21          # (launch, chunk) pairs one layout's check may build
MAX_CANDIDATES = 48          # layouts checked per region (the likeliest first: fewest chunks)
LOGLIK_LAUNCHES = 4096       # launches the fault likelihood reads (an even spread)


def _product_values(kd: KernelData, g: np.ndarray, max_factors: int):
    """(formula, per-launch value) of each product of 1..max_factors selected features. A factor
    no launch varied enters as its value, a constant coefficient (the fit never leans on an
    argument whose dependence it could not see): `2*max_seq*head_dim` at one max_seq and head_dim
    is the constant 163840; `8*pos*n_heads` is `128*pos` at 16 heads."""
    names = kd.sel_names
    out, seen = [], set()
    for d in range(1, max_factors + 1):
        for combo in itertools.combinations(range(len(names)), d):
            v = np.ones(len(g), np.int64)
            coef = 1
            vary = []
            for k in combo:
                v = v * kd.uniq[g, k]
                if kd.sel_varying[k]:
                    vary.append(names[k])
                else:
                    coef *= int(kd.uniq[0, k]) if len(kd.uniq) else 1
            if (v <= 0).any() or v.max() > 1 << 40:
                continue
            f = FM.Formula(0, ((coef, tuple(vary)),)) if vary else FM.Formula(int(v[0]), ())
            if f not in seen:
                seen.add(f)
                out.append((f, v))
    return out


def candidate_layouts(kd: KernelData, cat: RegionObs, sel: np.ndarray, s0_lo: np.ndarray) -> list:
    """(count formula, stride formula, count values, stride values) the arguments describe whose
    slots reach every launch's observed pages: a count no launch shows more runs than (runs only
    merge, but for what lost records split), a stride (element size x a product of arguments)
    whose last slot holds the last page observed. Fewest chunks first."""
    g = kd.group[sel]
    runs = cat.npieces[sel]
    allowed = kd.allowed(len(sel))
    last = cat.O_e[sel] * kd.ps - cat.base[sel]          # one past the last byte observed, from the base
    counts, seen = [], set()
    for f, v in _product_values(kd, g, 2):
        if v.max() < 2 or v.max() > MAX_COUNT or int((v < runs).sum()) > allowed or f in seen:
            continue
        seen.add(f)
        counts.append((f, v))
    strides, seen_s = [], set()
    for f, v in _product_values(kd, g, 3):
        for e in ELEMENT_SIZES:
            fe = FM.Formula(f.const * e, tuple((c * e, n) for c, n in f.terms))
            if fe in seen_s:
                continue
            seen_s.add(fe)
            strides.append((fe, v * e))
    out = []
    for (fc, c), (fs, s) in itertools.product(counts, strides):
        if int(c.sum()) > MAX_SLOTS:
            continue
        # the last chunk starts at or before the last page seen and its slot reaches past it
        # (the chunk cannot outgrow its stride: `chunk_bounds` caps it there)
        reach = (s0_lo + (c - 1) * s <= last) & (last <= s0_lo + c * s + kd.bigp * kd.ps)
        if (s < kd.ps).any() or int((~reach).sum()) > allowed:
            continue
        out.append((fc, fs, c, s))
    out.sort(key=lambda t: (float(np.mean(t[2])), t[0].score(), t[1].score()))
    return out[:MAX_CANDIDATES]


def _keyed(own: np.ndarray, page: np.ndarray, pmin: int) -> np.ndarray:
    return own.astype(np.int64) * np.int64(1 << 40) + (page - pmin)


def chunk_bounds(kd: KernelData, cat: RegionObs, sel: np.ndarray, s0: np.ndarray, c: np.ndarray, sd: np.ndarray):
    """Per launch of `sel`, the chunk's byte bounds (lo, hi) under the layout `c` chunks every `sd`
    bytes from `s0` (absolute bytes): slot j is [s0 + j*sd, s0 + (j+1)*sd). The chunk reaches at
    least into the big page of the last page observed in each slot (short of the big page the
    next slot starts in, which either chunk may have touched), past its last fault there; and no
    further than the end of the observed run (with what prefetch may have touched) that holds its
    slot's start, nor past its slot. A slot whose start no observed run holds allows no chunk."""
    ps, bigp, n = kd.ps, kd.bigp, len(sel)
    own, o_s, o_e = gather_pieces(kd, cat, sel, "O")
    owna, a_s, a_e = gather_pieces(kd, cat, sel, "A")
    cc = np.clip(c, 0, MAX_COUNT)
    rep = np.repeat(np.arange(n), cc)
    j = np.arange(len(rep)) - np.repeat(np.cumsum(cc) - cc, cc)
    start_b = s0[rep] + j * sd[rep]                        # slot start, bytes
    a_pg = start_b // ps                                   # slot's first page
    nxt_b = start_b + sd[rep]
    b_pg = -(-nxt_b // ps)
    last_slot = j == cc[rep] - 1
    # pages of the big page the next slot starts in are the next chunk's as much as this one's
    amb = np.where(last_slot | (nxt_b % (bigp * ps) == 0), b_pg, (nxt_b // ps) // bigp * bigp)
    lim = np.maximum(np.minimum(b_pg, amb), a_pg)
    pmin = int(min(o_s.min() if len(o_s) else 0, a_pg.min() if len(a_pg) else 0, a_s.min() if len(a_s) else 0))
    # the last observed page below lim, in this slot
    ko = _keyed(own, o_s, pmin)
    k = np.searchsorted(ko, _keyed(rep, lim, pmin), side="left") - 1
    kc = np.maximum(k, 0)
    has = (k >= 0) & (own[kc] == rep) & (o_e[kc] > a_pg) if len(ko) else np.zeros(len(rep), bool)
    lastp = np.where(has, np.minimum(o_e[kc], lim) - 1, -1)
    lo_abs = np.where(has, np.maximum((lastp // bigp) * bigp, a_pg) * ps + 1, start_b + 1)
    # the last fault in [slot start, lim)
    keys = np.zeros(len(rep), np.int64)
    lo_all = np.full(len(rep), 1, np.int64)
    offsets = np.cumsum([0] + [len(p.idx) for p in kd.parts])
    for ti, p in enumerate(kd.parts):
        m = (sel[rep] >= offsets[ti]) & (sel[rep] < offsets[ti + 1]) & has
        if m.any():
            keys[m] = cat.key[sel[rep[m]]]
            _, fl = p.obs.fault_bounds(keys[m], a_pg[m], lim[m])
            lo_all[m] = np.where(fl >= 0, (fl - 1) * ps + 1, 1)
    lo_abs = np.maximum(lo_abs, lo_all)
    lo_j = np.maximum(lo_abs - start_b, 1)
    # the observed (or possibly touched) run that holds the slot's first page
    ka = _keyed(owna, a_s, pmin)
    q = np.searchsorted(ka, _keyed(rep, a_pg, pmin), side="right") - 1
    qc = np.maximum(q, 0)
    inside = (q >= 0) & (owna[qc] == rep) & (a_e[qc] > a_pg) if len(ka) else np.zeros(len(rep), bool)
    hi_j = np.where(inside, np.minimum(a_e[qc] * ps, nxt_b) - start_b, 0)
    lo = np.full(n, 1, np.int64)
    hi = np.full(n, FM.INF, np.int64)
    np.maximum.at(lo, rep, lo_j)
    np.minimum.at(hi, rep, hi_j)
    return lo, hi


def fit_layouts(kd: KernelData, w, cat: RegionObs, sel: np.ndarray, s0_bounds) -> list:
    """Strided regions of the layouts the arguments describe (`candidate_layouts`) that lost
    records explain at every launch but a few: [(region, fit statistics)], fewest unexplained first."""
    g = kd.group[sel]
    base = cat.base[sel]
    s0_lo, s0_hi = s0_bounds
    bud = (0.0, 0.0, kd.params.strided_budget)
    res = (solve_pair(kd, g, [(s0_lo, s0_hi)], budgets=bud, max_terms=1, hard={0: "hi"})
           or solve_pair(kd, g, [(s0_lo, s0_hi)], hard={0: "hi"}))
    if res is None:
        return []
    (fs,), _, _ = res
    vals = {nm: kd.uniq[g, k] for k, nm in enumerate(kd.sel_names)}
    one = np.ones(len(g), np.int64)
    s0r = np.asarray(fs.evaluate(vals), np.int64) * one
    out = []
    for fc, fst, c, sd in candidate_layouts(kd, cat, sel, s0r):
        lo, hi = chunk_bounds(kd, cat, sel, base + s0r, c, sd)
        r2 = solve_pair(kd, g, [(lo, hi)], budgets=bud, max_terms=1, hard={0: "lo"}) \
            or solve_pair(kd, g, [(lo, hi)], hard={0: "lo"})
        if r2 is None:
            continue
        (fch,), exact, _ = r2
        if not fch.terms:
            fch = _argument_chunk(kd, cat, sel, Region(w.name, "strided", start=fs, count=fc, chunk=fch, stride=fst),
                                  lo, hi)
        chunk = np.asarray(fch.evaluate(vals), np.int64) * one
        if not (chunk < sd).any() or (chunk <= 0).any():
            continue   # chunks that fill their stride are one range
        region = Region(w.name, "strided", start=fs, count=fc, chunk=fch, stride=fst)
        ok = verify_region(kd, region, cat, sel, kd.bigp)
        if int((~ok).sum()) > kd.allowed(len(sel), 2 * cat.npieces[sel]):
            continue
        fit = {"exact": round(float(ok.mean()), 6), "unexplained": int((~ok).sum()), "layout": "arguments",
               "evidence": {**group_evidence(kd, g, lo, hi, lo, hi), "of": "chunk"}}
        out.append((region, fit))
    out.sort(key=lambda t: t[1]["unexplained"])
    return out


def _argument_chunk(kd: KernelData, cat: RegionObs, sel: np.ndarray, region: Region, lo, hi) -> FM.Formula:
    """A constant chunk, or one an argument describes (element size x a product of arguments, at
    least one varying, plus an element size x a constant argument or nothing) that lies inside
    every launch's chunk bounds but those lost records explain, verifies, holds every fault and
    makes the faults `odds_per_term` times likelier: a profile at one size shows the chunk grow
    only by the pages where its faults land."""
    g = kd.group[sel]
    const = region.chunk
    allowed = kd.allowed(len(sel))
    ll0, held0, _ = fault_pages_loglik(kd, region, cat, sel)
    best, best_ll = const, ll0 + np.log(kd.params.odds_per_term)
    prods = _product_values(kd, g, 3)
    offsets = [0] + sorted({int(f.const) for f, _ in _product_values(kd, g, 1) if not f.terms})
    for f, v in prods:
        if not f.terms:
            continue
        for e in ELEMENT_SIZES:
            for off in offsets:
                y = e * v + e * off
                if int(((y < lo) | (y > hi)).sum()) > allowed:
                    continue
                cand = FM.Formula(e * off, tuple((c * e, n) for c, n in f.terms))
                trial = Region(region.base, "strided", start=region.start, count=region.count, chunk=cand,
                               stride=region.stride)
                if int((~verify_region(kd, trial, cat, sel, kd.bigp)).sum()) > kd.allowed(len(sel), 2 * cat.npieces[sel]):
                    continue
                ll, held, _ = fault_pages_loglik(kd, trial, cat, sel)
                if (held or not held0) and ll > best_ll + 1e-9:
                    best, best_ll = cand, ll
    return best


def fault_pages_loglik(kd: KernelData, region: Region, cat: RegionObs, sel: np.ndarray, pages=None):
    """How likely every fault the records hold in the region is under a strided or range template:
    each touched big page faults once, at a touched page drawn at random, so a fault on one of
    the m pages the template puts in its big page has probability 1/m; a fault on a page the
    template leaves out has none. Read on an even spread of at most LOGLIK_LAUNCHES launches.
    `pages`, for other classes: a function of the launches read that gives their template pages
    (launch as a position among them, start page, end page; fit.index_values.indexed_pages).
    Returns (summed log-likelihood of the faults it holds, whether it holds them all, faults read)."""
    if len(sel) > LOGLIK_LAUNCHES:
        sel = sel[np.unique(np.linspace(0, len(sel) - 1, LOGLIK_LAUNCHES).round().astype(np.int64))]
    n, bigp = len(sel), kd.bigp
    if pages is not None:
        rep, sp, ep = pages(sel)
    elif region.cls == "strided":
        rep, sp, ep = chunk_pages(kd, region, cat, sel)
    else:
        g = kd.group[sel]
        vals = {nm: kd.uniq[g, k] for k, nm in enumerate(kd.sel_names)}
        one = np.ones(n, np.int64)
        base = cat.base[sel]
        rep = np.arange(n)
        sp = (base + np.asarray(region.start.evaluate(vals), np.int64) * one) // kd.ps
        ep = -(-(base + np.asarray(region.end.evaluate(vals), np.int64) * one) // kd.ps)
    keep = ep > sp
    rep, sp, ep = merge_intervals(rep[keep], sp[keep], ep[keep], n)[:3] if keep.any() else (rep[:0], sp[:0], ep[:0])
    # the faults: the first in each observed big page
    own, o_s, o_e = gather_pieces(kd, cat, sel, "O")
    nb = -(-(o_e - o_s) // bigp)
    bo = np.repeat(own, nb)
    bs = np.repeat(o_s // bigp * bigp, nb) + bigp * (np.arange(len(bo)) - np.repeat(np.cumsum(nb) - nb, nb))
    fpage = np.full(len(bo), -1, np.int64)
    offsets = np.cumsum([0] + [len(p.idx) for p in kd.parts])
    for ti, p in enumerate(kd.parts):
        m = (sel[bo] >= offsets[ti]) & (sel[bo] < offsets[ti + 1])
        if m.any():
            f, _ = p.obs.fault_bounds(cat.key[sel[bo[m]]], np.maximum(bs[m], cat.lo_f[sel[bo[m]]]),
                                      np.minimum(bs[m] + bigp, cat.hi_f[sel[bo[m]]]))
            fpage[m] = f
    has = fpage >= 0
    bo, bs, fpage = bo[has], bs[has], fpage[has]
    if not len(bo):
        return 0.0, True, 0
    pmin = int(min(sp.min() if len(sp) else 0, bs.min()))
    cum = np.cumsum(ep - sp)
    first_of = np.searchsorted(rep, np.arange(n), side="left")
    ks = _keyed(rep, sp, pmin)

    def below(o, x):   # template pages of launch o below page x
        k = np.searchsorted(ks, _keyed(o, x, pmin), side="right") - 1
        kc = np.maximum(k, 0)
        mine = (k >= 0) & (rep[kc] == o) if len(ks) else np.zeros(len(o), bool)
        before = np.where(first_of[o] > 0, cum[np.maximum(first_of[o] - 1, 0)], 0)
        return np.where(mine, cum[kc] - (ep[kc] - sp[kc]) + np.minimum(ep[kc], x) - sp[kc] - before, 0)

    m = below(bo, bs + bigp) - below(bo, bs)
    held = (below(bo, fpage + 1) - below(bo, fpage)) > 0
    ll = float(-np.log(np.maximum(m[held], 1)).sum())
    return ll, bool(held.all()), int(len(bo))
