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
from .solve import group_bounds, group_evidence, solve_pair
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
    `sd` (per launch), from its group's fault pages modulo the stride (module doc), and how far
    its lower bound may give way where its faults may have missed the arc's first position
    (`give`, bytes); (-INF, INF) where the group has fewer than MIN_FAULTS faults or they leave
    no gap wider than MIN_GAP. None where no group bounds it. `first`: the first observed byte
    (from the base) per launch. Vectorized over the groups (a sort of the residues, the widest
    gap per group)."""
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
    grp, res, S, span = grp[use], res[use], S[use], (S - gap)[use]
    # page starts lie on a grid of q = gcd(page, stride) modulo the stride: the first page a
    # chunk touches starts in (start - page, start - page + q], so the start lies in
    # [res + page - q, res + page - 1]; placed at the first such position at or after the first
    # big page the records show. The upper bound is positive evidence (a fault at `res`); the
    # lower one holds only where the faults hit the arc's first position: a group whose faults
    # span less of the circle than the widest span at its stride may have missed positions at
    # either end, so its lower bound may give way by the difference (`give`: a few faults over 6
    # positions miss the first one often: 17 faults, one time in 22)
    widest = np.zeros(len(S), np.int64)
    for val in np.unique(S):
        at_s = S == val
        widest[at_s] = span[at_s].max()
    slack = widest - span
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
    give = np.zeros(n, np.int64)
    give[m] = slack[k[m]]
    return lo, hi, give


DENSE = 16          # faults a launch group needs before a page its chunks name and none of them hit refutes them
EMPTY_ODDS = 2.0 ** -15   # the chance of a named position left empty by the faults, at most, for it to refute
MAX_CLASSES = 256   # page positions modulo the stride checked per group at most


def _unfaulted_pages(kd: KernelData, g, own, fpage, base, s0, chunk, sd) -> bool:
    """Does the layout name, at a launch group with DENSE faults or more, a page position (a page
    start modulo the stride, on the grid gcd(page, stride)) on which none of them landed? Every
    chunk touches the same positions, and each touched big page faults at one of its touched
    pages at random: at 16 faults a position of two left empty has odds of 2^-15, and a group
    refutes only at those odds or below (m positions named: m*(1 - 1/m)^faults; a pitch of 2.25
    pages names 6 of 9 positions, and 17 faults leave one of them empty one time in four). A
    start the residues placed only to a page (the stride a multiple of it) may be off by the
    pages its chunk then reaches: those are refuted here, not predicted."""
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
    empty = np.setdiff1d(key_p, key_f)
    if not len(empty):
        return False
    # a group refutes where its faults would leave one of the m positions it names empty by
    # chance at odds below EMPTY_ODDS: m * (1 - 1/m)^faults (m = 2 at DENSE faults: 2^-15)
    per = np.bincount(key_p >> 20, minlength=kd.U)
    faults = np.bincount(g[own], minlength=kd.U)
    grp = np.unique(empty >> 20)
    mm = per[grp].astype(np.float64)
    chance = np.where(mm > 1, np.log(mm) + faults[grp] * np.log1p(-1.0 / np.maximum(mm, 2.0)), -np.inf)
    return bool((chance <= np.log(EMPTY_ODDS)).any())


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
    bud = (0.0, 0.0, kd.params.strided_budget)
    rng = lambda s: gather_pieces(kd, cat, s, "O")   # noqa: E731 - the runs as template pages
    ll_runs: list = []
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
        # of the starts whose layout passes every check, the likeliest (each term at `odds_per_term`)
        best = None
        for fs in start_candidates(kd, g, b, bud):
            found = _with_start(kd, w, cat, sel, fs, fc, fst, c, sd, own, fpage, base, rng, ll_runs)
            if found is not None and (best is None or found[2] > best[2]):
                best = found
        if best is not None:
            return best[0], best[1]
    return None


MAX_STARTS = 4   # start formulas tried per layout at most (the solver's simplest first)


def start_candidates(kd: KernelData, g: np.ndarray, b, bud):
    """Start formulas for the bounds `b` (lo, hi, give) per launch that `residue_starts` gives,
    at most MAX_STARTS: first a column times a row's bytes (`pure_starts`: one term, no
    constant), then the robust solve's simplest, then the simplest of each monomial that every
    bounded launch group allows (formula.solve's candidates), the last two within the bounds as
    they are (the robust solve leaves out a share of launches of its own; within the bounds as
    far as they give way, its simplest is a rounder and wider guess, and the solve takes longer).
    Only launches whose residues bound the start take part: a launch
    whose chunks touch every page position modulo the stride says nothing of where they start,
    and its check is the fault pages the layout must hold (`_with_start`). The simplest formula
    within the bounds need not be the kernel's (`512*c*c` and `1024*c + 1024` put columns 0 and
    3 of 1536-byte chunks a 6144-byte pitch apart in the same pages as `1536*c`, and columns 1
    and 2 elsewhere), so each is checked against every launch's faults, and the likeliest kept."""
    lo, hi, give = b
    m = (lo > -FM.INF) | (hi < FM.INF)
    if not m.any():
        return
    gm, tight, loose = g[m], (lo[m], hi[m]), (lo[m] - give[m], hi[m])
    seen: list = []

    def new(f):
        if f in seen or len(seen) >= MAX_STARTS:
            return False
        seen.append(f)
        return True
    for f in pure_starts(kd, gm, tight, loose):
        if new(f):
            yield f
    res = solve_pair(kd, gm, [tight], budgets=bud, max_terms=1, hard={0: "hi"}) or \
        solve_pair(kd, gm, [tight], hard={0: "hi"})
    if res is not None and new(res[0][0]):
        yield res[0][0]
    groups, lo_g, hi_g, w = group_bounds(gm, *tight, kd.U, "hi")
    for f in FM.solve(kd.mono(groups), lo_g, hi_g, w, 0.0, max_terms=1, hard="hi", candidates=True) or []:
        if new(f):
            yield f


def pure_starts(kd: KernelData, g: np.ndarray, tight, loose) -> list:
    """Starts of one term and no constant, `x*m` for a monomial m of the arguments (a column
    times a row's bytes), simplest first: each launch's bounds give x an interval
    ([ceil(lo/m), floor(hi/m)]), the interval most launches share is taken (`solve.group_bounds`
    over one group: a launch whose faults missed its arc's first position is outvoted, not
    obeyed), and its roundest value (`formula.roundest`) kept where no more launches than
    lost records, and the share of launches the strided fit's robust solve may leave out
    (`FitParams.strided_budget`), leave outside the bounds as far as they may give way (`loose`;
    the interval is read from the `tight` ones, which the wider ones would leave to the roundest
    of a wider range). None where a start at 0 holds as well."""
    lo, hi = (np.asarray(x, np.int64) for x in tight)
    lo_l = np.asarray(loose[0], np.int64)
    mono = kd.mono(g)
    allowed = kd.allowed(len(g)) + int(kd.params.strided_budget * len(g))
    if int(((lo > 0) | (hi < 0)).sum()) <= allowed:
        return []   # a start at 0 holds: simpler than any product (the solves below give it)
    one = np.zeros(len(g), np.int64)
    out = []
    for j, names in enumerate(mono.names):
        v = mono.values[:, j].astype(np.int64)
        if (v < 0).any() or not (v > 0).any():
            continue
        pos = v > 0
        # a launch at m = 0 puts its start at 0: outside its bounds, it is one that falls outside
        zero_bad = int(((~pos) & ((lo_l > 0) | (hi < 0))).sum())
        if zero_bad > allowed:
            continue
        vp = v[pos]
        x_lo = np.where(lo[pos] > -FM.INF, -(-lo[pos] // vp), -FM.INF)
        x_hi = np.where(hi[pos] < FM.INF, hi[pos] // vp, FM.INF)
        _, a, z, _ = group_bounds(one[pos], x_lo, x_hi, 1, "hi")
        if not len(a) or max(int(a[0]), 1) > min(int(z[0]), FM.MAX_COEF):
            continue
        x = FM.roundest(max(int(a[0]), 1), min(int(z[0]), FM.MAX_COEF))
        bad = zero_bad + int(((x * vp < lo_l[pos]) | (x * vp > hi[pos])).sum())
        if bad <= allowed:
            out.append(FM.Formula(0, ((int(x), tuple(names)),)))
    return sorted(out, key=lambda f: f.score())


def fault_reach(kd: KernelData, own, fpage, s0, sd) -> np.ndarray:
    """Per launch, the chunk its fault pages need at least under chunks every `sd` bytes from `s0`
    (absolute): a fault page starting d bytes past a chunk's start, modulo the stride (d in [1,
    stride - page]: a page that does not hold the chunk's first byte), is touched only if the
    chunk is longer than d. Positive evidence (a fault record's page was touched), exact to the
    byte where the page grid and the stride are not aligned (a 6144-byte pitch puts pages at 3
    offsets, and the faults at the last one the chunk reaches bound it)."""
    ps = kd.ps
    out = np.ones(len(s0), np.int64)
    if not len(own):
        return out
    S = sd[own]
    d = (fpage * ps - s0[own]) % S
    need = np.where((d >= 1) & (d <= S - ps), d + 1, 1)
    np.maximum.at(out, own, need)
    return out


def placement_price(kd: KernelData, own, s0r, sd) -> float:
    """The log-odds a layout's empty arc is worth by chance: its start was placed where the
    faults left the circle empty (the widest gap of each group's residues), so each placement
    (a start modulo the stride, at the launches with faults) chose one of the stride's `m` page
    positions, and random faults over a contiguous range leave some arc empty: its price is
    log m per placement. A contiguous tensor read in three launches of one size, 960 faults over
    the 2019 positions of an 8076-byte stride, leaves 16 positions empty where the widest gap
    falls, 8 nats likelier under chunks than under the runs, and log 2019 = 7.6 of it chance."""
    if not len(own):
        return 0.0
    L = np.unique(own)
    S = sd[L]
    key = np.unique(np.stack([S, s0r[L] % S], axis=1), axis=0)
    m = key[:, 0] // np.gcd(kd.ps, key[:, 0])
    return float(np.log(np.maximum(m, 1)).sum())


def _with_start(kd: KernelData, w, cat: RegionObs, sel: np.ndarray, fs, fc, fst, c, sd, own, fpage, base, rng,
                ll_runs: list):
    """The layout (count fc, stride fst) with start `fs`: its chunk bounded and solved, checked
    (`fit_within_runs`); (region, fit, the faults' log-likelihood less `odds_per_term` per term)
    or None. `ll_runs`: a one-item cache of the runs' fault log-likelihood."""
    g = kd.group[sel]
    vals = {nm: kd.uniq[g, k] for k, nm in enumerate(kd.sel_names)}
    one = np.ones(len(g), np.int64)
    bud = (0.0, 0.0, kd.params.strided_budget)
    s0r = np.asarray(fs.evaluate(vals), np.int64) * one
    lo, hi = chunk_bounds(kd, cat, sel, base + s0r, c, sd)
    lo = np.maximum(lo, fault_reach(kd, own, fpage, base + s0r, sd))
    r2 = solve_pair(kd, g, [(lo, hi)], budgets=bud, max_terms=1, hard={0: "lo"}) \
        or solve_pair(kd, g, [(lo, hi)], hard={0: "lo"})
    if r2 is None:
        return None
    (fch,), _, _ = r2
    if not fch.terms:
        # a constant chunk: the least that reaches every slot's last fault (positive evidence;
        # the simplest constant within the bounds may reach pages no fault shows touched), or,
        # where the start is a column times its width (`x*c`, one term and no constant) and the
        # bounds allow x at every launch, the column's width: chunks as wide as the columns they
        # start at (where no launch's column put the chunk's end in another page, the least
        # reaching the faults says nothing of where the end lies at other columns)
        fch = FM.Formula(int(np.clip(lo, 1, None).max()), ())
        if fs.n_terms == 1 and not fs.const and len(fs.terms[0][1]) == 1:
            x = int(fs.terms[0][0])
            if x > fch.const and bool(((x >= lo) & (x <= hi)).all()):
                fch = FM.Formula(x, ())
    region = Region(w.name, "strided", start=fs, count=fc, chunk=fch, stride=fst)
    if not fch.terms:
        fch = _argument_chunk(kd, cat, sel, region, lo, hi)
        region = Region(w.name, "strided", start=fs, count=fc, chunk=fch, stride=fst)
    chunk = np.asarray(fch.evaluate(vals), np.int64) * one
    if (chunk <= 0).any() or not (chunk < sd).all():
        return None   # chunks that fill their stride are one range
    # at big-page grain the chunks are one run: verified as such (verify_region refuses chunks
    # that show no gap a big page wide, which these never do)
    ok = verify_pages(kd, cat, sel, kd.bigp, *chunk_pages(kd, region, cat, sel))
    if int((~ok).sum()) > kd.allowed(len(sel), 2 * cat.npieces[sel]):
        return None
    ll, held, _ = fault_pages_loglik(kd, region, cat, sel)
    if not held:
        return None
    if not ll_runs:
        ll_runs.append(fault_pages_loglik(kd, region, cat, sel, pages=rng)[0])
    terms = sum(f.n_terms for f in region.formulas().values())
    if ll - ll_runs[0] - placement_price(kd, own, s0r, sd) < np.log(kd.params.odds_per_term) * max(terms, 1):
        return None
    if _unfaulted_pages(kd, g, own, fpage, base, base + s0r, chunk, sd):
        return None
    fit = {"exact": round(float(ok.mean()), 6), "unexplained": int((~ok).sum()), "layout": "within runs",
           "evidence": {**group_evidence(kd, g, lo, hi, lo, hi), "of": "chunk"}}
    return region, fit, ll - np.log(kd.params.odds_per_term) * terms
