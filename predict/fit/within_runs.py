"""Strided chunks smaller than a big page, inside runs the records show whole.

Chunks every `stride` bytes whose gaps are smaller than a big page (a column slice of rows a
pitch apart, the pitch under 64 KiB) touch every big page of their hull: the records show one
run per launch, and the range attempt would take the hull. The fault pages still tell the
chunks apart: each touched big page faults once, at a page one of its chunks touched (docs/
template-model.md, "Where the faults land"), so modulo the stride every fault lies in the arc
the chunk covers. For each layout the arguments describe (`layout.candidate_layouts`: a count
and a stride of the arguments) the faults of each launch group (equal arguments: one start,
stride and count) are reduced modulo the stride, and the start solved directly from them:

- the residues (`(fault page - base) mod stride`) of a group's fault pages, each a page wide,
  are sorted on the circle; the largest gap between them is where no chunk lies, and the page
  after it (the residue `a`) holds a chunk's first byte (`a <= start mod stride < a + page`);
- the first chunk is the first position with that residue at or after the first big page the
  records show (`start` in `[x, x + page)`, x = a + k*stride the first >= that big page), and one
  solve over the arguments (`solve.solve_pair`) finds the start's formula from those bounds;
- the chunk is bounded as every layout's is (`layout.chunk_bounds`: each slot's last fault from
  below, its run and the next slot from above) and solved the same way.

A layout is kept where it verifies on every launch but those lost records explain, holds every
fault page, and the faults are `odds_per_term` times likelier under it per term it adds than
under the runs the records show (every page of them). A range whose faults fill every residue
(one contiguous run) leaves no gap a page wide and is never read as chunks. Groups with fewer
than MIN_FAULTS faults give no bound of their own (the solve leans on the others).
"""

from __future__ import annotations

import numpy as np

from ..model_io import Region
from ..observe import RegionObs
from .data import KernelData
from .layout import _argument_chunk, candidate_layouts, chunk_bounds, fault_pages_loglik
from .solve import group_evidence, solve_pair
from .strided import chunk_pages, gather_pieces, verify_pages
from .. import formula as FM

MIN_FAULTS = 8          # faults a launch group needs before its residues bound the start
MIN_GAP = 64           # bytes of the circle no fault covers, at least, before the residues are read
MAX_FINE_LAYOUTS = 8    # layouts whose residues leave a gap that are solved and checked at most


def fault_pages(kd: KernelData, cat: RegionObs, sel: np.ndarray):
    """(launch as a position in sel, fault page): the first fault record in each big page of the
    launches' observed runs (a page certainly touched)."""
    bigp = kd.bigp
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
    return bo[has], fpage[has]


def residue_starts(kd: KernelData, g: np.ndarray, own: np.ndarray, fpage: np.ndarray, base: np.ndarray,
                   first: np.ndarray, sd: np.ndarray):
    """Per launch, byte bounds (lo, hi) on its first chunk's start (from its base) under stride
    `sd` (per launch), from its group's fault pages modulo the stride (module doc); (-INF, INF)
    where the group has fewer than MIN_FAULTS faults or they leave no gap wider than MIN_GAP.
    None where no group bounds it. `first`: the first observed byte (from the base) per launch.
    Vectorized over the groups (a sort of the residues, the widest gap per group)."""
    ps, n = kd.ps, len(g)
    lo = np.full(n, -FM.INF, np.int64)
    hi = np.full(n, FM.INF, np.int64)
    if not len(own):
        return None
    S_f = sd[own]
    r = (fpage * ps - base[own]) % S_f
    gf = g[own]
    # per group (its launches share start and stride): its residues, sorted and without repeats
    o = np.lexsort((r, gf))
    gs, rs, Ss = gf[o], r[o], S_f[o]
    keep = np.r_[True, (gs[1:] != gs[:-1]) | (rs[1:] != rs[:-1])]
    faults = np.bincount(gs, minlength=kd.U)
    gs, rs, Ss = gs[keep], rs[keep], Ss[keep]
    head = np.r_[True, gs[1:] != gs[:-1]]
    first_i = np.flatnonzero(head)
    start_of = first_i[np.cumsum(head) - 1]                  # each residue's group's first residue
    last = np.r_[head[1:], True]
    # the gap from each residue to the next (circularly, the last to the first plus the stride)
    nxt = np.where(last, rs[start_of] + Ss, np.r_[rs[1:], 0])
    gaps = nxt - rs
    # the widest gap per group: the last of each group once sorted by (group, gap)
    o2 = np.lexsort((gaps, gs))
    w = o2[np.r_[gs[o2][1:] != gs[o2][:-1], True]]
    grp, gap, S = gs[w], gaps[w], Ss[w]
    res = nxt[w] % S                                          # the residue after the widest gap
    # a gap must leave a page position empty (positions lie q = gcd(page, stride) apart: a stride
    # of one page has one position, and its residues say nothing)
    use = (faults[grp] >= MIN_FAULTS) & (gap > np.maximum(MIN_GAP, 2 * np.gcd(ps, S) - 1))
    if not use.any():
        return None
    grp, res, S = grp[use], res[use], S[use]
    # page starts lie on a grid of q = gcd(page, stride) modulo the stride: the first page a
    # chunk touches starts in (start - page, start - page + q], so the start lies in
    # [res + page - q, res + page - 1]; placed at the first such position at or after the first
    # big page the records show
    q = np.gcd(ps, S)
    at = np.full(kd.U, -1, np.int64)
    at[grp] = np.arange(len(grp))
    k = at[g]
    m = np.flatnonzero(k >= 0)
    hi_r = res[k[m]] + ps - 1
    Sm = S[k[m]]
    kk = -(-(first[m] - hi_r) // Sm)
    hi[m] = hi_r + kk * Sm
    lo[m] = hi[m] - (q[k[m]] - 1)
    return lo, hi


DENSE = 16          # faults a launch group needs before a page its chunks name and none of them hit refutes them
MAX_CLASSES = 256   # page positions modulo the stride checked per group at most


def _unfaulted_pages(kd: KernelData, g, own, fpage, base, s0, chunk, sd) -> bool:
    """Does the layout name, at a launch group with DENSE faults or more, a page position (a page
    start modulo the stride, on the grid gcd(page, stride)) on which none of them landed? Every
    chunk touches the same positions, and each touched big page faults at one of its touched
    pages at random: at 16 faults a position of two left empty has odds of 2^-15. A start the
    residues placed only to a page (the stride a multiple of it) may be off by the pages its
    chunk then reaches: those are refuted here, not predicted."""
    ps = kd.ps
    S = sd[own]
    q = np.gcd(ps, S)
    dense = np.bincount(g[own], minlength=kd.U) >= DENSE
    m = dense[g[own]] & (S // q <= MAX_CLASSES)
    if not m.any():
        return False
    # the faults' positions: (launch's group, page start modulo the stride, on the grid)
    r0 = (-base[own]) % q                       # the grid's offset at each fault's launch
    t = ((fpage * ps - base[own]) % S - r0) // q
    key_f = np.unique((g[own][m].astype(np.int64) << 20) | t[m])
    # the positions each dense group's chunk names: for each launch of those groups, every grid
    # position whose page meets [start, start + chunk) modulo the stride
    L = np.unique(own[m])
    nL = sd[L] // np.gcd(ps, sd[L])              # grid positions per stride at each launch
    rep = np.repeat(L, nL)
    j = np.arange(len(rep)) - np.repeat(np.cumsum(nL) - nL, nL)
    qq = np.gcd(ps, sd[rep])
    pos = ((-base[rep]) % qq) + qq * j
    rel = (pos - (s0[rep] - base[rep])) % sd[rep]
    named = (rel < chunk[rep]) | (rel > sd[rep] - ps)
    key_p = np.unique((g[rep][named].astype(np.int64) << 20) | j[named])
    return bool(len(np.setdiff1d(key_p, key_f)))


def fit_within_runs(kd: KernelData, w, cat: RegionObs, sel: np.ndarray):
    """The strided region of chunks under a big page inside the runs (module doc), with its fit
    statistics, or None."""
    if len(sel) == 0 or kd.bigp <= 1:
        return None
    ps = kd.ps
    g = kd.group[sel]
    base = cat.base[sel]
    own, fpage = fault_pages(kd, cat, sel)
    if len(own) < MIN_FAULTS:
        return None
    first = cat.O_s[sel] * ps - base
    vals = {nm: kd.uniq[g, k] for k, nm in enumerate(kd.sel_names)}
    one = np.ones(len(g), np.int64)
    bud = (0.0, 0.0, kd.params.strided_budget)
    rng = lambda s: gather_pieces(kd, cat, s, "O")   # noqa: E731 - the runs as template pages
    ll_runs = None
    tried = 0
    for fc, fst, c, sd in candidate_layouts(kd, cat, sel, first):
        if (sd >= kd.bigp * ps).all():
            continue   # gaps the runs show already (the strided attempt's)
        b = residue_starts(kd, g, own, fpage, base, first, sd)
        if b is None:
            continue
        tried += 1
        if tried > MAX_FINE_LAYOUTS:
            break
        res = (solve_pair(kd, g, [b], budgets=bud, max_terms=1, hard={0: "hi"})
               or solve_pair(kd, g, [b], hard={0: "hi"}))
        if res is None:
            continue
        (fs,), _, _ = res
        s0r = np.asarray(fs.evaluate(vals), np.int64) * one
        lo, hi = chunk_bounds(kd, cat, sel, base + s0r, c, sd)
        r2 = solve_pair(kd, g, [(lo, hi)], budgets=bud, max_terms=1, hard={0: "lo"}) \
            or solve_pair(kd, g, [(lo, hi)], hard={0: "lo"})
        if r2 is None:
            continue
        (fch,), _, _ = r2
        if not fch.terms:
            # a constant chunk: the least that reaches every slot's last fault (positive evidence;
            # the simplest constant within the bounds may reach pages no fault shows touched)
            fch = FM.Formula(int(np.clip(lo, 1, None).max()), ())
        region = Region(w.name, "strided", start=fs, count=fc, chunk=fch, stride=fst)
        if not fch.terms:
            fch = _argument_chunk(kd, cat, sel, region, lo, hi)
            region = Region(w.name, "strided", start=fs, count=fc, chunk=fch, stride=fst)
        chunk = np.asarray(fch.evaluate(vals), np.int64) * one
        if (chunk <= 0).any() or not (chunk < sd).all():
            continue   # chunks that fill their stride are one range
        # at big-page grain the chunks are one run: verified as such (verify_region refuses chunks
        # that show no gap a big page wide, which these never do)
        ok = verify_pages(kd, cat, sel, kd.bigp, *chunk_pages(kd, region, cat, sel))
        if int((~ok).sum()) > kd.allowed(len(sel), 2 * cat.npieces[sel]):
            continue
        ll, held, _ = fault_pages_loglik(kd, region, cat, sel)
        if not held:
            continue
        if ll_runs is None:
            ll_runs = fault_pages_loglik(kd, region, cat, sel, pages=rng)[0]
        terms = sum(f.n_terms for f in region.formulas().values())
        if ll - ll_runs < np.log(kd.params.odds_per_term) * max(terms, 1):
            continue
        if _unfaulted_pages(kd, g, own, fpage, base, base + s0r, chunk, sd):
            continue
        fit = {"exact": round(float(ok.mean()), 6), "unexplained": int((~ok).sum()), "layout": "within runs",
               "evidence": {**group_evidence(kd, g, lo, hi, lo, hi), "of": "chunk"}}
        return region, fit
    return None
