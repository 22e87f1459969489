"""Choosing between formulas that all hold by where the launches' faults landed.

Each touched big page faults once, at a touched page drawn at random (a modelling assumption: docs/template-model.md, "Where the faults land"), so a
template that puts m of its pages into the big page holding a fault explains that fault's page
with probability 1/m: the likelihood of the fault pages under a template. Where even that cannot
separate a constant from an argument (a region under a page at every launch), the argument wins
(docs/template-model.md, "When faults cannot separate fixed from an argument").
"""

from __future__ import annotations

import numpy as np

from .. import formula as FM
from .data import KernelData
from .solve import group_bounds



def region_pages_in(kd: KernelData, g, fs, fe, base, big0):
    """Pages of the region [base + fs, base + fe) inside the big page starting at page big0, per launch."""
    vals = {n: kd.uniq[g, k] for k, n in enumerate(kd.sel_names)}
    one = np.ones(len(g), np.int64)
    sp = (base + np.asarray(fs.evaluate(vals), np.int64) * one) // kd.ps
    ep = -(-(base + np.asarray(fe.evaluate(vals), np.int64) * one) // kd.ps)
    return np.maximum(np.minimum(ep, big0 + kd.bigp) - np.maximum(sp, big0), 0)


def aligned_odds(kd: KernelData, g, plain, aligned, base, O_s, O_e, I_s, I_e, f1, f2) -> float:
    """How much likelier the launches' fault pages are under the `aligned` (start, end) formulas than
    under the `plain` ones.

    Each touched big page faults once, at a touched page drawn at random (a modelling assumption: docs/template-model.md, "Where the faults land"), so a
    template that puts m of its pages into the big page holding a fault record explains the
    fault's page with probability 1/m. A formula that puts a region's first (last) page exactly
    on the faulting page at every launch, where the simpler one spreads it over many pages,
    explains the faults far better: the odds multiply over launches (first and last big page)."""
    b1 = (O_s // kd.bigp) * kd.bigp
    b2 = ((O_e - 1) // kd.bigp) * kd.bigp
    two = f2 & (b2 != b1)
    logs = np.zeros(len(g))
    for big0, has in ((b1, f1), (b2, two)):
        mp = region_pages_in(kd, g, plain[0], plain[1], base, big0)
        ma = region_pages_in(kd, g, aligned[0], aligned[1], base, big0)
        use = has & (mp > 0) & (ma > 0)
        logs += np.where(use, np.log(np.maximum(mp, 1)) - np.log(np.maximum(ma, 1)), 0.0)
    return float(np.exp(min(logs.sum(), 700.0)))


def likeliest(kd: KernelData, g, res, bounds, base, O_s, O_e, f1, f2):
    """Among formulas that explain as many launches, the one under which the fault pages are
    likeliest, within reason.

    Each touched big page faults at a touched page drawn at random, so a formula that puts m of
    its pages into the first (last) big page explains that big page's fault with probability
    1/m. Of equally simple formulas that hold, the likeliest wins: the one that does not spread
    the region over pages no fault ever landed on (`4*M*K` for an M-row slice, not `128*K` for
    a buffer sized for 32 rows). A constant loses to one term of an argument only when the
    faults are `odds_per_term` times likelier under the term (an 11-page constant against the
    one page of a 1-row slice at every launch): fewer terms otherwise."""
    (fs, fe), exact, unexplained = res
    vals = {n: kd.uniq[g, k] for k, n in enumerate(kd.sel_names)}
    one = np.ones(len(g), np.int64)
    b1 = (O_s // kd.bigp) * kd.bigp
    b2 = ((O_e - 1) // kd.bigp) * kd.bigp
    out = [fs, fe]
    for q, (big0, has) in enumerate(((b1, f1), (b2, f2))):
        f = out[q]
        if not has.any() or f.n_terms > 1:
            continue
        lo, hi = bounds[q]
        groups, lo_g, hi_g, w = group_bounds(g, lo, hi, kd.U)
        if len(groups) > kd.params.max_search_groups:
            continue
        ok0 = in_bounds(f, vals, one, lo, hi).sum()

        def loglik(c):
            trial = [c, out[1]] if q == 0 else [out[0], c]
            m = region_pages_in(kd, g, trial[0], trial[1], base, big0)
            return -float(np.log(np.maximum(m[has & (m > 0)], 1)).sum())

        best, best_ll = f, loglik(f)
        mono = kd.mono(groups)
        for terms in sorted({f.n_terms, 1}):
            for c in FM.solve(mono, lo_g, hi_g, w, 0.0, max_terms=terms, min_terms=terms, candidates=True):
                if c == f or in_bounds(c, vals, one, lo, hi).sum() < ok0:
                    continue
                if terms == f.n_terms and c.score()[:3] != f.score()[:3]:
                    continue
                ll = loglik(c)
                need = 0.0 if terms == best.n_terms else np.log(kd.params.odds_per_term)
                if ll > best_ll + need + 1e-9:
                    best, best_ll = c, ll
        out[q] = best
    return (out[0], out[1]), exact, unexplained


def in_bounds(f, vals, one, lo, hi) -> np.ndarray:
    y = np.asarray(f.evaluate(vals), np.int64) * one
    return (y >= lo) & (y <= hi)


def argument_backed(kd: KernelData, g, res, e_lo, e_hi, base):
    """Where the faults cannot separate a constant end from one an argument explains, prefer the
    argument (docs/template-model.md, "When faults cannot separate fixed from an argument").

    A region under a page at every fitting launch shows one faulting page whatever its size, so
    the constant end E and `E + c*m` (m a product of arguments, at least one varying) both hold
    at every launch and predict the same pages there. The constant misses every page past it
    once the argument grows; `E + c*m` never predicts less than E, and with the smallest simple
    c it predicts the fewest pages that still grow with the argument. Fault feedback, which sees
    misses and never over-prediction, raises the coefficient from the misses of a larger run:
    erring small is the side it can repair."""
    (fs, fe), exact, unexplained = res
    if fe.terms or fs.terms:
        return res
    # the premise: under a page at every launch (a region over many pages whose end lies where
    # its last page faulted is pinned by its size: `4*M + 1536000` for a weight matrix is not a shape)
    if ((base + int(fs.const)) // kd.ps != (base + max(int(fe.const), int(fs.const) + 1) - 1) // kd.ps).any():
        return res
    groups, lo_g, hi_g, w = group_bounds(g, e_lo, e_hi, kd.U)
    mono = kd.mono(groups)
    E = int(fe.const)
    best = None
    for j, names in enumerate(mono.names):
        col = mono.values[:, j]
        if not any(kd.sel_varying[kd.sel_names.index(nm)] for nm in names) or (col < 0).any() or not col.any():
            continue
        need = np.where(col > 0, -(-(lo_g - E) // np.maximum(col, 1)), 0)
        c = _simple_at_least(int(max(1, need.max())), kd.params.simple_odd)   # E + c*m >= lo everywhere
        if c is None or (E + c * col > hi_g).any():
            continue
        f = FM.Formula(E, ((c, names),))
        # a size following one argument before a product of several, then the simplest
        if best is None or (len(names), f.score()) < (len(best.terms[0][1]), best.score()):
            best = f
    if best is None:
        return res
    vals = {nm: kd.uniq[g, k] for k, nm in enumerate(kd.sel_names)}
    y = np.asarray(best.evaluate(vals), np.int64) * np.ones(len(g), np.int64)
    same = (-(-(base + y) // kd.ps)) == (-(-(base + E) // kd.ps))
    if not ((y >= e_lo) & (y <= e_hi)).all() or not same.all():
        return res
    return (fs, best), exact, unexplained


def _simple_at_least(c: int, simple_odd: int) -> int | None:
    """The smallest o * 2**k >= c with o odd and at most simple_odd."""
    best = None
    for o in range(1, simple_odd + 1, 2):
        k = max(0, int(np.ceil(np.log2(max(c / o, 1)))))
        while o << k < c:
            k += 1
        v = o << k
        if best is None or v < best:
            best = v
    return best
