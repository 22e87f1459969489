"""Strided regions: count chunks of chunk bytes every stride bytes, each an integer formula.

Chunks closer than a big page merge in fault data: the count is fitted first, then start and
stride from the launches whose runs are the chunks, then the chunk; `verify_region` checks every
launch against the prediction rounded out to big pages (docs/template-model.md, "Strided
regions").
"""

from __future__ import annotations

import itertools
import numpy as np

from pagecast.footprints import Footprints, _ranges, intersection_pages  # noqa: PLC2701 - the core's CSR helper

from .. import formula as FM
from ..features import Word
from ..model_io import Region
from ..observe import RegionObs
from ..predictor import region_bytes
from .data import KernelData
from .solve import group_evidence, solve_pair



def fit_strided(kd: KernelData, w: Word, cat: RegionObs, sel: np.ndarray, g: np.ndarray, bigp: int, fit: dict,
                 shape: np.ndarray | None = None, stride_terms: int = 0, aligned: bool = False):
    """count chunks of chunk bytes every stride bytes: each of the four an integer formula."""
    if len(sel) == 0:
        return None
    ps = kd.ps
    parts_obs = []
    # gather the runs of each selected launch from its trace's observation arrays
    offsets = np.cumsum([0] + [len(idx) for _, idx, _, _ in kd.parts])
    starts_l, ends_l, owner, ff_l, fl_l = [], [], [], [], []
    for ti, (o, idx, _, _) in enumerate(kd.parts):
        m = (sel >= offsets[ti]) & (sel < offsets[ti + 1])
        s = sel[m]
        r0 = cat.r0[s]
        n = cat.npieces[s]
        ri = _ranges(r0, n)
        rs_ = np.maximum(o.os[ri], np.repeat(cat.lo_f[s], n))
        re_c = np.minimum(o.oe[ri], np.repeat(cat.hi_f[s], n))
        starts_l.append(rs_)
        ends_l.append(re_c)
        ff, fl = o.fault_bounds(np.repeat(cat.key[s], n), rs_, re_c)
        ff_l.append(ff)
        fl_l.append(fl)
        owner.append(np.repeat(np.flatnonzero(m), n))
        parts_obs.append(None)
    rs = np.concatenate(starts_l)
    re_ = np.concatenate(ends_l)
    own = np.concatenate(owner)            # index into sel
    ffirst, flast = np.concatenate(ff_l), np.concatenate(fl_l)
    cnt = cat.npieces[sel]
    first = np.concatenate([[0], np.cumsum(cnt)[:-1]])
    j = np.arange(len(rs)) - np.repeat(first, cnt)
    base = cat.base[sel]
    slo_r = rs * ps                                   # run start byte bounds (absolute)
    shi_r = ((rs // bigp) * bigp + bigp) * ps - 1
    shi_r = np.minimum(shi_r, re_ * ps - 1)
    shi_r = np.where(ffirst >= 0, np.minimum(shi_r, (ffirst + 1) * ps - 1), shi_r)
    elo_r = (np.maximum(((re_ - 1) // bigp) * bigp + 1, rs + 1) - 1) * ps + 1
    elo_r = np.where(flast >= 0, np.maximum(elo_r, (flast - 1) * ps + 1), elo_r)
    ehi_r = re_ * ps
    s0_lo, s0_hi = slo_r[first], shi_r[first]
    if aligned:
        # the first chunk starts inside its first faulting page (a chunk under a page at an
        # offset that follows an argument by less than a big page shows only there)
        ff0 = ffirst[first]
        s0_lo = np.where((ff0 >= 0) & (ff0 // bigp == rs[first] // bigp), np.maximum(s0_lo, ff0 * ps), s0_lo)
    n = len(sel)
    # stride from chunk j's start vs chunk 0's
    # (and from chunk j's end vs chunk 0's: equal chunks end one stride apart too; the two
    # bounds together pin strides that starts known to a big page leave loose)
    e0_lo, e0_hi = elo_r[first], ehi_r[first]
    with np.errstate(divide="ignore", invalid="ignore"):
        jj = np.maximum(j, 1)
        st_lo_r = np.where(j > 0, np.maximum(-((-(slo_r - s0_hi[own])) // jj), -((-(elo_r - e0_hi[own])) // jj)),
                           -FM.INF)
        st_hi_r = np.where(j > 0, np.minimum((shi_r - s0_lo[own]) // jj, (ehi_r - e0_lo[own]) // jj), FM.INF)
    st_lo = np.full(n, -FM.INF, np.int64)
    st_hi = np.full(n, FM.INF, np.int64)
    np.maximum.at(st_lo, own, st_lo_r)
    np.minimum.at(st_hi, own, st_hi_r)
    ch_lo = np.full(n, -FM.INF, np.int64)
    ch_hi = np.full(n, FM.INF, np.int64)
    np.maximum.at(ch_lo, own, elo_r - shi_r)
    np.minimum.at(ch_hi, own, ehi_r - slo_r)
    # Chunks closer than a big page merge in fault data: such launches show fewer, longer
    # runs. The count is fitted first (exactly if it can be, else as a lower bound: runs
    # only ever merge), then start, stride and chunk on the launches whose runs are the
    # chunks; verify_region finally checks every launch against the big-page-rounded prediction.
    c64 = cnt.astype(np.int64)
    bud = (0.0, 0.0, kd.params.strided_budget)
    # `shape`: launches that may decide count, start and stride (multi-run ones); the others
    # (a single run: one chunk, or all chunks merged) only bound the chunk
    shape = np.ones(n, bool) if shape is None else shape
    sh = np.flatnonzero(shape)
    if len(sh) == 0:
        return None
    ed = 2 * c64                                     # each run seen has two edges lost records may hide
    rc = (solve_pair(kd, g[sh], [(c64[sh], c64[sh])], budgets=bud, max_terms=1, edges=ed[sh])
          or _count_argument(kd, g[sh], c64[sh])
          or solve_pair(kd, g[sh], [(c64[sh], np.full(len(sh), FM.INF, np.int64))], max_terms=1, edges=ed[sh]))
    if rc is None:
        return None
    (fc,), exact, _ = rc
    vals = {nm: kd.uniq[g, k] for k, nm in enumerate(kd.sel_names)}
    one = np.ones(len(g), np.int64)
    pc_ = np.asarray(fc.evaluate(vals), np.int64) * one
    whole = np.flatnonzero((pc_ == cnt) & shape)
    if len(whole) == 0:
        return None
    gw = g[whole]
    bounds = [((s0_lo - base)[whole], (s0_hi - base)[whole]), (st_lo[whole], st_hi[whole])]
    # a constant stride is most likely a product of constant arguments (max_seq * head_dim * 2)
    const = [k for k in range(kd.uniq.shape[1]) if len(np.unique(kd.uniq[:, k])) == 1 and kd.uniq[0, k] > 1]
    hints = sorted({int(np.prod([kd.uniq[0, k] for k in combo]))
                    for d in (1, 2, 3) for combo in itertools.combinations(const, d)})
    rmode = ("round", tuple(hints))
    mt = {1: stride_terms}
    smode = {1: rmode}
    # the first chunk's start is at or before its first page seen (positive evidence: "hi")
    res = (solve_pair(kd, gw, bounds, smode, budgets=bud, max_terms=1, min_terms=mt, hard={0: "hi"},
                       edges=ed[whole])
           or solve_pair(kd, gw, bounds, smode, min_terms=mt, hard={0: "hi"}, edges=ed[whole]))
    if res is None:
        return None
    (fs, fst), exact1, _ = res
    exact = min(exact, exact1)
    # chunk: bounded by each run's end against where the formulas put its start
    s0 = base + np.asarray(fs.evaluate(vals), np.int64) * one
    sd = np.asarray(fst.evaluate(vals), np.int64) * one
    # a launch whose chunks all merged into one run still bounds the chunk by its end:
    # run end = start + (count - 1) * stride + chunk
    merged = (cnt == 1) & (pc_ > 1)
    jj = np.where(merged[own], pc_[own] - 1, j)
    pstart = s0[own] + jj * sd[own]
    ch_lo = np.full(n, -FM.INF, np.int64)
    ch_hi = np.full(n, FM.INF, np.int64)
    np.maximum.at(ch_lo, own, elo_r - pstart)
    np.minimum.at(ch_hi, own, ehi_r - pstart)
    whole = np.flatnonzero((pc_ == cnt) | merged)
    gb, lo_b, hi_b = g[whole], np.maximum(ch_lo, 1)[whole], ch_hi[whole]
    # a chunk reaches at least the last page seen of its run (positive evidence: "lo")
    res2 = (solve_pair(kd, gb, [(lo_b, hi_b)], budgets=bud, max_terms=1, hard={0: "lo"}, edges=ed[whole])
            or solve_pair(kd, gb, [(lo_b, hi_b)], hard={0: "lo"}, edges=ed[whole]))
    if res2 is None:
        return None
    (fch,), exact2, _ = res2
    exact = min(exact, exact2)
    if not fc.terms and fc.const == 1:
        return None
    fit["exact"] = exact
    # the chunk's per-group byte bounds, kept for fault feedback (a chunk that outgrows a page)
    fit["evidence"] = group_evidence(kd, gb, lo_b, hi_b, lo_b, hi_b)
    fit["evidence"]["of"] = "chunk"
    return Region(w.name, "strided", start=fs, count=fc, chunk=fch, stride=fst)


def _count_argument(kd: KernelData, g: np.ndarray, runs: np.ndarray):
    """A count that is one argument: never below the runs seen (runs only merge) and equal to
    them in most launches. ((formula,), exact, launches where they differ) or None."""
    best = None
    for k, name in enumerate(kd.sel_names):
        v = kd.uniq[g, k]
        if not kd.sel_varying[k] or np.any(v < runs) or np.any(v > 1 << 16):
            continue
        agree = float(np.mean(v == runs))
        if agree >= 0.5 and (best is None or agree > best[0]):
            best = (agree, name)
    if best is None:
        return None
    return (FM.Formula(0, ((1, (best[1],)),)),), round(best[0], 6), int(round((1 - best[0]) * len(runs)))


def clean_runs(kd: KernelData, cat: RegionObs, sel: np.ndarray, bigp: int) -> np.ndarray:
    """Launches whose runs look like whole chunks: equal lengths and equal gaps (within 2 big pages).

    Chunks closer than a big page merge in fault data; where only some of them merged, the
    run count is not the chunk count, so those launches are left to the verification step.
    """
    if len(sel) == 0:
        return np.zeros(0, bool)
    own, s, e = gather_pieces(kd, cat, sel, "O")
    n = len(sel)
    ln = e - s
    big = np.int64(1) << np.int64(62)
    mn = np.full(n, big, np.int64)
    mx = np.full(n, -big, np.int64)
    np.minimum.at(mn, own, ln)
    np.maximum.at(mx, own, ln)
    ok = (mx - mn) <= 2 * bigp
    same = np.r_[False, own[1:] == own[:-1]]
    gap = np.where(same, s - np.r_[0, s[:-1]], 0)
    gmn = np.full(n, big, np.int64)
    gmx = np.full(n, -big, np.int64)
    np.minimum.at(gmn, own[same], gap[same])
    np.maximum.at(gmx, own[same], gap[same])
    return ok & ((gmx - gmn) <= 2 * bigp)


def gather_pieces(kd: KernelData, cat: RegionObs, sel: np.ndarray, which: str):
    """(owner index into sel, start, end) of the O (observed) or A (observed + prefetched) pieces."""
    offsets = np.cumsum([0] + [len(idx) for _, idx, _, _ in kd.parts])
    own, ss, ee = [], [], []
    for ti, (o, _, _, _) in enumerate(kd.parts):
        m = np.flatnonzero((sel >= offsets[ti]) & (sel < offsets[ti + 1]))
        s = sel[m]
        if which == "O":
            r0, n, S, E = cat.r0[s], cat.npieces[s], o.os, o.oe
        else:
            r0, n, S, E = cat.q0[s], cat.a_pieces[s], o.as_, o.ae
        ri = _ranges(r0, n)
        own.append(np.repeat(m, n))
        ss.append(np.maximum(S[ri], np.repeat(cat.lo_f[s], n)))
        ee.append(np.minimum(E[ri], np.repeat(cat.hi_f[s], n)))
    return np.concatenate(own), np.concatenate(ss), np.concatenate(ee)


def verify_region(kd: KernelData, region: Region, cat: RegionObs, sel: np.ndarray, bigp: int) -> np.ndarray:
    """Per launch: do the predicted pages, rounded out to big pages, cover O and stay inside A?"""
    ps = kd.ps
    g = kd.group[sel]
    vals = {n: kd.uniq[g, k] for k, n in enumerate(kd.sel_names)}
    one = np.ones(len(sel), np.int64)
    base = cat.base[sel]
    if region.cls == "strided":
        st, cnt, ch, sd = (np.asarray(x, np.int64) * one for x in region_bytes(region, vals, base))
        cnt = np.clip(cnt, 0, 1 << 16)
        rep = np.repeat(np.arange(len(sel)), cnt)
        j = np.arange(len(rep)) - np.repeat(np.cumsum(cnt) - cnt, cnt)
        sb = st[rep] + j * sd[rep]
        eb = sb + ch[rep]
    else:
        sb, eb = (np.asarray(x, np.int64) * one for x in region_bytes(region, vals, base))
        rep = np.arange(len(sel))
    return verify_pages(kd, cat, sel, bigp, rep, sb // ps, -((-eb) // ps), chunked=region.cls == "strided")


def chunk_pages(kd: KernelData, region: Region, cat: RegionObs, sel: np.ndarray):
    """A strided region's chunks at launches `sel`, as page intervals: (launch position, start, end)."""
    ps = kd.ps
    g = kd.group[sel]
    vals = {n: kd.uniq[g, k] for k, n in enumerate(kd.sel_names)}
    one = np.ones(len(sel), np.int64)
    st, cnt, ch, sd = (np.asarray(x, np.int64) * one for x in region_bytes(region, vals, cat.base[sel]))
    cnt = np.clip(cnt, 0, 1 << 16)
    rep = np.repeat(np.arange(len(sel)), cnt)
    j = np.arange(len(rep)) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    sb = st[rep] + j * sd[rep]
    return rep, sb // ps, -((-(sb + ch[rep])) // ps)


def fault_loglik(kd: KernelData, region: Region, cat: RegionObs, sel: np.ndarray):
    """Per launch of `sel`, how likely its first and last fault pages in the region are under a
    strided template: each touched big page faults once, at a touched page drawn at random
    (docs/template-model.md, "Where the faults land"), so a fault on one of the m pages the
    template puts in its big page has probability 1/m. Returns (log-likelihood per launch, 0 where
    the launch has no such fault; whether the template holds each fault page)."""
    rep, sp, ep = chunk_pages(kd, region, cat, sel)
    n = len(sel)
    ll = np.zeros(n)
    held = np.ones(n, bool)
    for page in (cat.I_s[sel], cat.I_e[sel] - 1):
        has = page >= 0
        b = (page // kd.bigp) * kd.bigp
        m = np.bincount(rep, weights=np.maximum(np.minimum(ep, b[rep] + kd.bigp) - np.maximum(sp, b[rep]), 0),
                        minlength=n)
        inside = np.bincount(rep, weights=((sp <= page[rep]) & (page[rep] < ep)).astype(np.float64), minlength=n) > 0
        held &= ~has | inside
        ll += np.where(has & inside, -np.log(np.maximum(m, 1)), 0.0)
    return ll, held


def verify_pages(kd: KernelData, cat: RegionObs, sel: np.ndarray, bigp: int, rep: np.ndarray, sp: np.ndarray,
                 ep: np.ndarray, chunked: bool = False) -> np.ndarray:
    """verify_region's test on predicted page intervals [sp, ep) of launches sel[rep]: rounded out to big
    pages, do they cover O and stay inside A (but for what lost records may hide)? `chunked`: the
    prediction is chunks, which must show a gap somewhere (as verify_region asks of strided regions)."""
    ps = kd.ps
    a_s, a_e = cat.alloc_s[sel][rep], cat.alloc_e[sel][rep]
    sp = np.maximum(sp // bigp * bigp, a_s)
    ep = np.minimum(-((-ep) // bigp) * bigp, a_e)
    n = len(sel)
    P = Footprints.from_intervals(rep, sp, ep, n, ps)
    O = Footprints.from_intervals(*gather_pieces(kd, cat, sel, "O"), n, ps)
    A = Footprints.from_intervals(*gather_pieces(kd, cat, sel, "A"), n, ps)
    # the prediction must hold every page the records show touched, and may reach past what
    # they show only by the big pages whose records lost records may have taken with them
    pp = P.pages_per_launch()
    outside = (pp - intersection_pages(P, A)) / bigp
    covers = intersection_pages(P, O) == O.pages_per_launch()
    ok = covers & (outside == 0)
    if holes_from_loss(kd, outside[covers & ~ok], pp[covers]):
        ok = covers
    if chunked and not (np.diff(P.indptr) >= 2).any():
        # no launch would show a gap between its chunks (each big-page wide gap would): the
        # runs it was fitted to were holes lost records left, and the region is one range
        ok[:] = False
    return ok


def holes_from_loss(kd: KernelData, holes: np.ndarray, pages: np.ndarray) -> bool:
    """Could lost records have hidden these `holes` (big pages, one entry per launch that has some)
    among launches predicted to touch `pages` pages in all? Counted over all the launches: loss
    hides few big pages, at random, not one in every launch."""
    if not len(holes):
        return True
    if float(holes.max()) > kd.params.allowed_holes(int(np.ceil(pages.max() / kd.bigp)), kd.loss):
        return False
    total_bp = int(np.ceil(float(np.sum(pages)) / kd.bigp))
    return float(holes.sum()) <= kd.params.allowed_holes(total_bp, kd.loss)
