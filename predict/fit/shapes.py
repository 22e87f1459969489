"""Shared shapes: a region's size taken from the sizes the kernel's other regions are proven to have.

A kernel's buffers are shaped by the same arguments: a row-wise kernel reads rows of `4*n_cols`
bytes from X, writes them to Y, and reads `4*n_cols` bytes of a weight; its per-row statistics
are `4*n_rows` bytes; a rotary kernel reads cos and sin tables of the same shape. Where the fault
records pin a region's size (it spans big pages, and no constant holds), its formula is evidence
of the kernel's *vocabulary*: its terms, their element sizes (coefficients) and the dimensions they
multiply. Where they do not (a region inside one big page of a larger allocation, used in part,
from a handful of launches: one fault page per launch is all the records say, and a constant end
holds as well as the argument that explains the size), the fit asks the vocabulary first
(docs/template-model.md, "Shared shapes"):

1. tier 1, a size of the kernel's own: another region's end (or chunk) formula, or one of its
   terms with a sub-product of its factors at the same coefficient (`4*n_cols` from
   `4*n_cols*n_rows`: the element size and the dimensions the kernel is known to use);
2. tier 2, a product of the vocabulary's factors with the coefficient this region's own bounds
   give (the simplest, as the solver prefers).

A candidate must hold at every launch the constant holds (the same evidence, lost records
included); of those that do, the simplest wins (the solver's preference), then the likeliest.
Only regions whose formulas have one term each make the vocabulary. Over several big pages'
worth of pages it wins unless the faults are `odds_per_term` times likelier under the constant
(`FitParams.odds_per_term`, the same odds a term needs against a constant outside the
vocabulary); under a page at every launch (where the faults are
as likely under either), it replaces the smallest-coefficient guess of `argument_backed`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
import numpy as np

from .. import formula as FM
from ..model_io import Region
from .data import KernelData
from .likelihood import region_pages_in
from .solve import group_bounds



@dataclass
class RangeEvidence:
    """What a range region's end was decided from (kept for the kernel's second look)."""

    g: np.ndarray            # feature group per launch
    s_lo: np.ndarray         # start / end byte bounds relative to the base
    s_hi: np.ndarray
    e_lo: np.ndarray
    e_hi: np.ndarray
    base: np.ndarray
    O_s: np.ndarray          # observed pages
    O_e: np.ndarray
    f2: np.ndarray           # launches with a fault record in the region's last big page
    guessed: bool            # the end was an `argument_backed` guess (under a page everywhere)
    whole: np.ndarray        # launches whose records cover their whole allocation
    to_alloc: np.ndarray     # bytes from the base to the allocation's end


def vocabulary(kd: KernelData, regions: list[tuple[Region, RangeEvidence | None]]):
    """(tier-1 formulas, tier-2 factor tuples) from the regions whose formulas the records pin.

    A range region's end counts unless it was a guess or a constant; its start, and every formula
    of a strided region, count by their terms. A region counts only if each of its formulas has
    at most one term: a size is an element size times a product of dimensions, and a formula of
    several terms fitted from a handful of launches (`641*p2 + 2674*p3 - 1945600` through three
    points, for a region of `p2*p3` bytes) is as likely a fit of big-page bounds as a shape."""
    sizes: dict[FM.Formula, None] = {}
    terms: dict[tuple[int, tuple[str, ...]], None] = {}
    for r, _ in regions:
        # an indexed region reads `count` chunks of `chunk` bytes: a gather writes (or a scatter
        # reads) that many bytes, one row per index read (`2048*rows` from 2048-byte rows, `rows` ids)
        t = _gathered(r)
        if t is not None:
            sizes[FM.Formula(0, (t,))] = None
            terms[t] = None
    for r, ev in regions:
        if r.cls not in ("fixed", "linear", "strided") or any(f.n_terms > 1 for f in r.formulas().values()):
            continue
        for name, f in r.formulas().items():
            if not f.terms or (name == "end" and ev is not None and ev.guessed):
                continue
            if name in ("end", "chunk"):
                sizes[f] = None
            for t in f.terms:
                terms[t] = None
    varying = {n for n, v in zip(kd.sel_names, kd.sel_varying) if v}
    tier1: dict[FM.Formula, None] = dict(sizes)
    factors: dict[tuple[str, ...], None] = {}
    for c, fac in terms:
        for k in range(1, len(fac) + 1):
            for sub in itertools.combinations(fac, k):
                if any(n in varying for n in sub):
                    tier1[FM.Formula(0, ((c, sub),))] = None
                    factors[sub] = None
    return list(tier1), list(factors)


def _gathered(r: Region) -> tuple[int, tuple[str, ...]] | None:
    """The one term `chunk * count` of an indexed region whose count is an argument formula and
    whose chunk and count have at most one term and no constant beside it, or None. A block split
    moves a chunk in each of its parts (a head-major cache's slot: its bytes in every head): the
    bytes of one value are the chunk times the parts."""
    if r.cls != "indexed" or r.count_index is not None or r.count is None or r.chunk is None:
        return None
    ch, cn = r.chunk, r.count
    if ch.n_terms + cn.n_terms != 1 or (ch.terms and ch.const) or (cn.terms and cn.const):
        return None
    (c, fac), k = (ch.terms[0], cn.const) if ch.terms else (cn.terms[0], ch.const)
    parts = r.block_split.parts if r.block_split is not None else 1
    return (int(c) * int(k) * parts, tuple(fac)) if c * k > 0 else None


def shared_shape(kd: KernelData, region: Region, ev: RangeEvidence, tier1: list, tier2: list) -> bool:
    """Give a range region whose end the records leave open the kernel's own size; True if changed."""
    # an end of one term (`2048*n + 8192`, `2048*n`: bounds of big pages, lost records among them,
    # fitted where `2304*n` holds as well) may take a size of the kernel's own, one term and no
    # constant (tier 1 only)
    # an end of several terms (`20628*p3 - 651*p3^2 + 8*p3^3 - 131072`: bent through the bounds of
    # a launch whose records were lost) may take one too, where it holds the positive evidence
    # (every launch's last observed byte) wherever the bent one does, and passes the upper bounds
    # the bent one holds at no more launches than lost records explain (they only hide pages)
    if ev is None or region.cls not in ("fixed", "linear"):
        return False
    offset_size = region.end.n_terms == 1 and not ev.guessed
    bent = region.end.n_terms > 1 and not ev.guessed
    if region.end.terms and not ev.guessed and not offset_size and not bent:
        return False
    g, e_lo, e_hi = ev.g, ev.e_lo, ev.e_hi
    vals = {n: kd.uniq[g, k] for k, n in enumerate(kd.sel_names)}
    one = np.ones(len(g), np.int64)

    def value(f):
        return np.asarray(f.evaluate(vals), np.int64) * one

    fs, fe = region.start, region.end
    y0 = value(fe)
    ok0 = (y0 >= e_lo) & (y0 <= e_hi)
    # the launches at which a candidate may pass the upper bound the end holds (a bent end's)
    loose = kd.allowed(len(g)) if bent else 0
    offset_size = offset_size or bent
    best = None
    tiers = (_tier1(kd, g, e_lo, e_hi, tier1),) if offset_size else \
        (_tier1(kd, g, e_lo, e_hi, tier1), _tier2(kd, g, e_lo, e_hi, tier2))
    for cands in tiers:
        held = []
        for f in cands:
            if offset_size and (f.const or f.n_terms != 1):
                continue
            y = value(f)
            ok = (y >= e_lo) & (y <= e_hi)
            # it holds wherever the end it would replace holds (lost records included)
            # a size: the region stays non-empty, growing with its arguments
            # a size is an element size times dimensions: a constant below minus one element
            # (`128*pos - 76416`) is a fit of this profile's bounds, empty at smaller arguments
            # and a constant above what the terms add at every launch makes the size that constant
            # with an argument's crumbs (`4*M + 1536000` for a 1536000-byte weight matrix)
            if f == fe or int((ok0 & ~ok).sum()) > loose or ((y < e_lo) & (y0 >= e_lo)).any() or \
                    (y <= value(fs)).any() or any(c <= 0 for c, _ in f.terms) or \
                    f.const < -max(c for c, _ in f.terms) or (f.const > 0 and (y - f.const < f.const).all()):
                continue
            # a size equal to the allocation's at every launch (sizes that vary) is the tensor's
            alloc = bool(ev.whole.all() and (y == ev.to_alloc).all() and len(np.unique(ev.to_alloc)) > 1)
            # the simplest first (as the solver prefers: a re-solved constant of odd part 37 is
            # not simple), then the likeliest of equally simple ones (`likeliest`)
            held.append((not alloc, f.score()[:3], -_loglik(kd, ev, fs, f), f.score(), f))
        if held:
            best = min(held, key=lambda t: t[:4])
            break
    if best is None:
        return False
    _, _, nll, _, f = best
    # the end it replaces keeps its place only if the faults are far likelier under it
    if nll + _loglik(kd, ev, fs, fe) >= np.log(kd.params.odds_per_term):
        return False
    s = value(fs)
    y = value(f)
    okf = (s >= ev.s_lo) & (s <= ev.s_hi) & (y >= e_lo) & (y <= e_hi)
    region.end = f
    region.cls = "linear"
    region.fit["exact"] = round(float(okf.mean()), 6)
    region.fit["unexplained"] = int((~okf).sum())
    region.fit["shared_shape"] = f.text()
    return True


def _tier1(kd, g, e_lo, e_hi, formulas):
    """The vocabulary's sizes, with their constants re-solved where 0 does not hold."""
    out = []
    vals = {n: kd.uniq[g, k] for k, n in enumerate(kd.sel_names)}
    w = np.ones(len(g), np.float64)
    for f in formulas:
        if any(n not in vals for n in f.names()):
            continue
        y = np.asarray(FM.Formula(0, f.terms).evaluate(vals), np.int64) * np.ones(len(g), np.int64)
        ok, c = FM.check(y, e_lo, e_hi, w, 0.0, "tight")
        out.append(FM.Formula(c if ok else f.const, f.terms))
    return out


def _tier2(kd, g, e_lo, e_hi, factors):
    """One term over a product of the vocabulary's factors, its coefficient from these bounds."""
    if not factors:
        return []
    groups, lo_g, hi_g, w = group_bounds(g, e_lo, e_hi, kd.U)
    mono = kd.mono(groups)
    keep = [j for j, n in enumerate(mono.names) if tuple(sorted(n)) in {tuple(sorted(f)) for f in factors}]
    if not keep:
        return []
    sub = FM.Monomials([mono.names[j] for j in keep], mono.values[:, keep], mono.degree[keep])
    return FM.solve(sub, lo_g, hi_g, w, 0.0, max_terms=1, min_terms=1, candidates=True) or []


def _loglik(kd, ev, fs, fe) -> float:
    """Log-likelihood of the launches' fault pages in the region's last big page under (fs, fe):
    each touched big page faults once at a touched page drawn at random (likelihood)."""
    big0 = ((ev.O_e - 1) // kd.bigp) * kd.bigp
    m = region_pages_in(kd, ev.g, fs, fe, ev.base, big0)
    use = ev.f2 & (m > 0)
    return -float(np.log(np.maximum(m[use], 1)).sum())


def position_ends(kd: KernelData, regions: list[tuple[Region, RangeEvidence | None]]) -> list[Region]:
    """Ends guessed from an argument (`argument_backed`, or the kernel's vocabulary through
    `shared_shape`, for a region under a page at every launch) that lean on a position, not a
    size, go back to their constant: an argument the kernel's other
    regions use only in start offsets (a decode step's `128*pos` into each head's cache) and never in a
    size (an end, chunk or count) moves where they lie, and merely correlates with this region's
    end within the profile (docs/template-model.md, "When faults cannot separate fixed from an
    argument"). Returns the regions changed."""
    positions = position_args(regions)
    changed = []
    for r, ev in regions:
        if ev is None or not ev.guessed or r.cls != "linear" or r.start.terms \
                or not r.end.terms or not r.end.names() <= positions:
            continue
        e = max(int(ev.e_lo.max()), int(r.start.const) + 1)
        if e > int(ev.e_hi.min()):
            continue
        r.fit["position_end"] = r.end.text()      # the guess given up
        r.fit.pop("shared_shape", None)
        r.end = FM.Formula(e, ())
        r.cls = "fixed"
        changed.append(r)
    return changed


def position_args(regions: list[tuple[Region, RangeEvidence | None]]) -> set[str]:
    """The arguments the regions use in a start or stride (where a region lies) and never in a size
    (an end, chunk or count; an end guessed under a page everywhere is no evidence of a size)."""
    starts: set[str] = set()
    sizes: set[str] = set()
    for r, ev in regions:
        if r.cls not in ("fixed", "linear", "strided"):
            continue
        for name, f in r.formulas().items():
            if name == "end" and ev is not None and ev.guessed:
                continue   # a guess (under a page everywhere) is no evidence of a size
            (starts if name in ("start", "stride") else sizes).update(f.names())
    return starts - sizes


ELEMENT_SIZES = (1, 2, 4, 8)   # bytes per element: the coefficients a layout's size may have
LAYOUT_FACTORS = 3             # dimensions a layout's size multiplies, at most (as in the features' products)


def layout_size(kd: KernelData, region: Region, ev: RangeEvidence | None) -> bool:
    """Read a constant size as the layout the launch's own arguments describe, where it is one;
    True if changed (docs/template-model.md, "A constant size the arguments describe").

    A range region whose size is the same at every launch of the profile gets a constant end: the
    records cannot tell a constant from a product of arguments no launch varied (a weight matrix of
    `K*N` floats, K and N fixed). Where an element size times a product of those arguments is that
    size at every launch, exactly as far as the records tell (inside the end's bounds wherever the
    constant is, ending in the same page at every launch), the size is that layout: the profile's
    predictions do not change, and a run whose arguments describe another layout (another network's
    K) is predicted from them. Only where the records pin the size (the region spans a big page:
    an end under a page is any size to them), from arguments, never grid or block dimensions
    (thread counts only round sizes), and only where one size fits: products of different
    values that both fit leave the constant (the records cannot say which layout it is). A size no
    argument carries stays a constant."""
    if ev is None or ev.guessed or region.cls not in ("fixed", "linear") or region.start.terms or region.end.terms:
        return False
    s0, e0 = int(region.start.const), int(region.end.const)
    if e0 - s0 < kd.bigp * kd.ps:
        return False
    const = [(n, int(kd.uniq[0, k])) for k, n in enumerate(kd.sel_names) if not kd.sel_varying[k]] if kd.U else []
    if not const:
        return False
    ps = kd.ps
    ok0 = (e0 >= ev.e_lo) & (e0 <= ev.e_hi)
    page0 = -(-(ev.base + e0) // ps)
    hits: dict[int, list[FM.Formula]] = {}
    for k in range(1, LAYOUT_FACTORS + 1):
        for combo in itertools.combinations_with_replacement(const, k):
            prod = int(np.prod([v for _, v in combo], dtype=object))
            for c in ELEMENT_SIZES:
                y = s0 + c * prod
                ok = (y >= ev.e_lo) & (y <= ev.e_hi)
                if (ok0 & ~ok).any() or (-(-(ev.base + y) // ps) != page0).any():
                    continue
                hits.setdefault(y, []).append(FM.Formula(s0, ((c, tuple(n for n, _ in combo)),)))
    if len(hits) != 1:
        return False
    (f,) = [min(fs, key=lambda f: (len(f.terms[0][1]), f.score())) for fs in hits.values()]
    region.fit["layout_size"] = f.text()
    region.fit["constant_size"] = region.end.text()
    region.end = f
    region.cls = "linear"
    return True


def growing_ends(kd: KernelData, region: Region, ev: RangeEvidence | None, names: list[str],
                 odds=None) -> list[Region]:
    """For a range region whose constant end the records leave open (`model.open_ends`: its last
    page in one big page at every launch while arguments varied), the ends of one term and no
    constant, `c*n` for each varying argument `n` (a size is an element size times dimensions, as
    in `shared_shape`), that the profile admits: inside the end's bounds and the big page of its
    last fault at every launch, holding its fault pages, and (`odds(r)`: how many times likelier
    the faults are under `region` than under `r`, `RegionFit.fault_odds`) under which the faults
    are not `odds_per_term` times less likely than under the constant (a constant end that stayed
    put while `n` tripled, its faults never past it, is told apart by them). Of each argument's
    admitted coefficients the steepest, whose end is the union of the admitted ones wherever `n`
    is at least the profile's (below it, the constant end covers them): the region with it, so
    that the kernel is predicted as the union of the constant and the growing end
    (docs/template-model.md, "What the fit does not know"). `names` leaves out the arguments the
    kernel uses only as positions (`position_args`), as `position_ends` does. Where exactly one slope
    the arguments describe (`layout_slopes`: rows of an element size times arguments no launch
    varied) lies among the admitted ones, its end alone, flagged `layout_end`: it takes the
    constant's place (`admitted_union`), the kernel still not pinned."""
    if ev is None or region.cls not in ("fixed", "linear") or region.end.terms:
        return []
    # and inside the big page of its last fault: were it past it, the next big page would have
    # faulted (a driver's prefetch may have migrated pages there, which the bounds allow)
    e_hi = np.minimum(ev.e_hi, ((ev.O_e - 1) // kd.bigp + 1) * kd.bigp * kd.ps - ev.base)
    out = []
    s = np.asarray(region.start.evaluate({n: kd.uniq[ev.g, k] for k, n in enumerate(kd.sel_names)}), np.int64) \
        * np.ones(len(ev.g), np.int64)

    def grown(n, c):
        return Region(region.base, "linear", start=region.start, end=FM.Formula(0, ((c, (n,)),)))

    def likely(n, c):
        return odds is None or odds(grown(n, c)) < kd.params.odds_per_term

    layouts: dict[tuple[str, int], list[FM.Formula]] = {}
    for n in names:
        if n not in kd.sel_names:
            continue
        v = kd.uniq[ev.g, kd.sel_names.index(n)].astype(np.int64)
        if not len(v) or (v <= 0).any() or len(np.unique(v)) < 2:
            continue
        c_hi = int((e_hi // v).min())                    # the end stays inside its bounds
        c_lo = max(int((-(-ev.e_lo // v)).max()), 1)     # and holds every launch's faults
        if c_lo > c_hi or (c_lo * v <= s).any() or not likely(n, c_lo):
            continue
        while c_lo < c_hi:                               # the steepest the faults allow
            mid = (c_lo + c_hi + 1) // 2
            c_lo, c_hi = (mid, c_hi) if likely(n, mid) else (c_lo, mid - 1)
        out.append(grown(n, c_lo))
        # the slopes the arguments describe, `n` rows of c bytes or `n + 1` (row n included): their
        # union, `c*n + c`, inside the bounds and holding every fault
        for c, f in layout_slopes(kd, n):
            y = c * v + c
            if c <= c_lo and (y <= e_hi).all() and (y >= ev.e_lo).all() and (c * v > s).all():
                layouts.setdefault((n, c), []).append(f)
    # one slope the arguments describe among those admitted (the faults not `odds_per_term` times
    # likelier under the constant): the layout's end, in place of the constant and the steepest
    if len(layouts) == 1:
        (fs,) = layouts.values()
        f = min(fs, key=lambda f: (sum(len(t) for _, t in f.terms), f.score()))
        r = Region(region.base, "linear", start=region.start, end=f)
        if odds is not None and odds(r) < kd.params.odds_per_term:
            r.fit = {"layout_end": f.text()}
            return [r]
    return out


def layout_slopes(kd: KernelData, n: str) -> list[tuple[int, FM.Formula]]:
    """The ends an argument `n` gives as a layout's dimension, `n + 1` rows of `c` bytes: `c` an
    element size times a product of at most `LAYOUT_FACTORS - 1` of the launch's own arguments that
    no launch varied (never grid or block dimensions, as in `layout_size`); each with its `c`."""
    const = [(m, int(kd.uniq[0, k])) for k, m in enumerate(kd.sel_names) if not kd.sel_varying[k]] if kd.U else []
    out = []
    for k in range(LAYOUT_FACTORS):
        for combo in itertools.combinations_with_replacement(const, k):
            row = tuple(sorted(m for m, _ in combo))
            prod = int(np.prod([x for _, x in combo], dtype=object)) if combo else 1
            for e in ELEMENT_SIZES:
                grow = (e, tuple(sorted(row + (n,))))
                out.append((e * prod, FM.Formula(0, (grow, (e, row))) if row else FM.Formula(e, (grow,))))
    return out


def described_growth(kd: KernelData, region: Region) -> bool:
    """The region's end grows with a varying argument `n` at a slope the arguments describe (one
    term `c*n`, `c` among `layout_slopes`, or such a layout's `c*n + c`)."""
    if region.cls not in ("fixed", "linear") or not region.end.terms:
        return False
    t = region.end.terms
    varying = {m for m, v in zip(kd.sel_names, kd.sel_varying) if v}
    if len(t) == 1 and len(t[0][1]) == 1 and t[0][1][0] in varying:
        n, c = t[0][1][0], t[0][0]
        return any(x == c for x, _ in layout_slopes(kd, n))
    return any(f == region.end for n in region.end.names() & varying for _, f in layout_slopes(kd, n))


ONE_SET_LAYOUTS = 4   # sizes the arguments of one set describe, at most, that are predicted beside a constant


def one_set_layouts(kd: KernelData, region: Region, ev: RangeEvidence | None) -> list[Region]:
    """For a kernel fitted from one set of arguments (nothing varied), the ends of a constant-size
    range region that a layout of its arguments describes: an element size times a product of at
    most `LAYOUT_FACTORS` of its integer words (`KernelData.const_words`, of any size: a node count
    of 300,000 too), inside the end's bounds at every launch. The records pin the size at these
    arguments only, so the kernel is predicted as the union of the constant and these (at most
    `ONE_SET_LAYOUTS` sizes, else none: the arguments then say nothing), and another set of
    arguments is predicted from them too (docs/template-model.md, "What the fit does not know").
    Regions under a big page are left out (any small product fits them)."""
    if ev is None or kd.U != 1 or region.cls not in ("fixed", "linear") or region.start.terms or region.end.terms:
        return []
    s0, e0 = int(region.start.const), int(region.end.const)
    if e0 - s0 < kd.bigp * kd.ps:
        return []
    words = sorted(kd.const_words.items())
    hits: dict[int, list[FM.Formula]] = {}
    for k in range(1, LAYOUT_FACTORS + 1):
        for combo in itertools.combinations_with_replacement(words, k):
            prod = int(np.prod([x for _, x in combo], dtype=object))
            for c in ELEMENT_SIZES:
                y = s0 + c * prod
                if (y >= ev.e_lo).all() and (y <= ev.e_hi).all():
                    hits.setdefault(y, []).append(FM.Formula(s0, ((c, tuple(m for m, _ in combo)),)))
    if len(hits) > ONE_SET_LAYOUTS:
        return []
    return [Region(region.base, "linear", start=region.start,
                   end=min(fs, key=lambda f: (len(f.terms[0][1]), f.score()))) for _, fs in sorted(hits.items())]
