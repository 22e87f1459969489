"""Solving a region's formulas from its launches' bounds: per feature group, strict, then robust.

Bounds are byte intervals per launch, one per quantity (start, end, count, stride, chunk).
Launches with equal features touch the same offsets, so they form groups; `solve_pair` finds
the simplest formulas that hold in every group (strict) or leave unexplained no more launches
than lost records explain (robust), and returns how many launches they leave unexplained
(docs/template-model.md, "Lost records").
"""

from __future__ import annotations

import numpy as np

from .. import formula as FM
from ..features import factorize_rows
from .data import KernelData



def group_bounds(g: np.ndarray, lo: np.ndarray, hi: np.ndarray, U: int, hard: str | None = None):
    """Per feature group, the interval most of its launches' bounds agree on:
    (groups present, lo, hi, launches).

    Launches with equal features touch the same offsets, so their bounds intersect. Lost
    records make a launch's bounds too tight (a missing migration hides a touched big page at
    the region's edge), and one such launch would empty the intersection: observations are
    evidence, not constraints. Where the intersection is empty, the group takes the interval
    covered by the most launches' bounds (a sweep over their ends); the launches outside it
    are the ones a template will leave unexplained. `hard` ("lo" or "hi"): the side of the
    bounds that is positive evidence; of intervals covered by as many launches, the one furthest
    toward it (lost records only hide pages: a launch whose end bound lies below another's
    observed end lost the records of its last big page)."""
    lo_g = np.full(U, -FM.INF, np.int64)
    hi_g = np.full(U, FM.INF, np.int64)
    np.maximum.at(lo_g, g, lo)
    np.minimum.at(hi_g, g, hi)
    cnt = np.bincount(g, minlength=U)
    bad = (lo_g > hi_g) & (cnt > 0)
    if bad.any():
        m = bad[g] & (lo <= hi)              # a launch whose own bounds are empty agrees with none
        gl, ll, hl = g[m], lo[m], hi[m]
        one = np.ones(len(gl), np.int64)
        pos = np.concatenate([ll, hl + 1])
        d = np.concatenate([one, -one])
        gg = np.concatenate([gl, gl])
        o = np.lexsort((d, pos, gg))         # per group, by position, ends before starts
        pos, d, gg = pos[o], d[o], gg[o]
        cov = np.cumsum(d)                   # every group's events sum to 0: a running count
        best = np.zeros(U, np.int64)
        np.maximum.at(best, gg, cov)
        top = np.flatnonzero((cov == best[gg]) & (d > 0))
        if hard == "lo":   # the last of each group's best intervals
            grp, last = np.unique(gg[top][::-1], return_index=True)
            k = top[::-1][last]
        else:
            grp, first = np.unique(gg[top], return_index=True)
            k = top[first]
        lo_g[grp] = pos[k]
        hi_g[grp] = pos[k + 1] - 1
    present = np.flatnonzero(cnt > 0)
    return present, lo_g[present], hi_g[present], cnt[present].astype(np.float64)


def split_groups(kd: KernelData, g, lo, hi) -> int:
    """Launches in feature groups whose bounds do not intersect (equal features, different answers:
    no formula of the features holds there)."""
    lo_g = np.full(kd.U, -FM.INF, np.int64)
    hi_g = np.full(kd.U, FM.INF, np.int64)
    np.maximum.at(lo_g, g, lo)
    np.minimum.at(hi_g, g, hi)
    return int(np.bincount(g, minlength=kd.U)[lo_g > hi_g].sum())


def _launch_bounds(g: np.ndarray, lo: np.ndarray, hi: np.ndarray):
    """Each launch's (group, lo, hi), equal ones merged: (groups, lo, hi, launches)."""
    u, inv = factorize_rows(np.stack([g, lo, hi], axis=1))
    return u[:, 0], u[:, 1], u[:, 2], np.bincount(inv, minlength=len(u)).astype(np.float64)


def _solve_one(kd: KernelData, groups, lo, hi, w, budget: float, mode="tight", max_terms: int = 3,
               min_terms: int = 0, hard: str | None = None, hard_share: float = 0.0):
    """Solve on a subsample of groups, verify on all, add violators and repeat."""
    U = len(groups)
    cap = kd.params.max_search_groups
    if U <= cap:
        sample = np.arange(U)
    else:
        # the extremes of every feature plus an even spread
        ext = set(np.linspace(0, U - 1, cap // 2).round().astype(int).tolist())
        u = kd.uniq[groups]
        for k in range(u.shape[1]):
            ext.add(int(np.argmin(u[:, k])))
            ext.add(int(np.argmax(u[:, k])))
        sample = np.array(sorted(ext))
    for _ in range(4):
        mono = kd.mono(groups[sample])
        f = FM.solve(mono, lo[sample], hi[sample], w[sample], budget * w[sample].sum(), mode=mode,
                     max_terms=max_terms, min_terms=min_terms, hard=hard,
                     hard_budget=hard_share * w[sample].sum())
        if f is None:
            return None
        if len(sample) == U:
            return f
        vals = {n: kd.uniq[groups, k] for k, n in enumerate(kd.sel_names)}
        y = np.asarray(f.evaluate(vals), np.int64) * np.ones(U, np.int64)
        bad = (y < lo) | (y > hi)
        hard_bad = (y < lo) if hard == "lo" else (y > hi) if hard == "hi" else np.zeros(U, bool)
        if w[bad].sum() <= budget * w.sum() and w[hard_bad].sum() <= hard_share * w.sum():
            return f
        sample = np.union1d(sample, np.flatnonzero(bad)[:cap])
    return None


def solve_pair(kd, g, bounds, modes=None, budgets=None, max_terms: int = 3, min_terms=None, hard=None,
                edges=2):
    """Fit several quantities (start, end, ...) on the same launches: the simplest formulas that
    explain all launches but those lost records may have contradicted.

    Each quantity's formula is solved over its feature groups' bounds (`group_bounds`): once
    inside every group (strict), and once with the groups of a share of the launches allowed
    outside (robust: `KernelData.allowed`, plus each extra budget for passes that leave launches
    to a later check). `hard[q]` ("lo" or "hi") names the side of quantity q's bounds that is
    positive evidence (the region reaches at least the pages the records show touched): the
    robust pass never violates it, since lost records only hide pages. The robust solution wins
    where it is simpler than the strict one: one launch that lost a record must not bend the
    formula (a stride of 128*n - 1 to avoid it). Returns ((formulas...), share explained,
    launches unexplained) or None."""
    n = len(g)
    allowed = kd.allowed(n, edges)
    hard = hard or {}
    vals = {nm: kd.uniq[g, k] for k, nm in enumerate(kd.sel_names)}
    found = []
    for i, budget in enumerate((0.0, *(budgets or (0.0,)))):
        strict = i == 0
        share = 0.0 if strict else budget + allowed / max(n, 1)
        if not strict and share <= 0:
            continue
        out = []
        ok = np.ones(n, bool)
        for q, (lo, hi) in enumerate(bounds):
            # strict: one interval per feature group; robust: every launch's own bounds (equal ones
            # merged), so that the budget counts launches, not the groups one of them spoiled
            groups, lo_g, hi_g, w = group_bounds(g, lo, hi, kd.U, hard.get(q)) if strict else _launch_bounds(g, lo, hi)
            # a robust solution wins only by being simpler: no more terms than the strict one's
            mt = max_terms if strict or not found else min(max_terms, found[0][1][q].n_terms)
            # positive evidence may be contradicted (odd records: the floor) only where no formula
            # holds everywhere; a simpler formula must not win by contradicting it
            hard_share = 0.0 if strict or found else min(share, kd.params.floor_unexplained)
            f = _solve_one(kd, groups, lo_g, hi_g, w, share, (modes or {}).get(q, "tight"), mt,
                           (min_terms or {}).get(q, 0), hard.get(q), hard_share)
            if f is None:
                break
            out.append(f)
            y = np.asarray(f.evaluate(vals), np.int64) * np.ones(n, np.int64)
            ok &= (y >= lo) & (y <= hi)
        else:
            bad = int(n - ok.sum())
            if not strict and found and agreeing_discarded(kd, g, bounds, ok, edges):
                continue   # the strict solution explains a group this one leaves whole
            if bad <= int(budget * n) + allowed:
                found.append((tuple(map(sum, zip(*(f.score() for f in out)))), out, ok, strict))
                if not strict:
                    break
    if not found:
        return None
    # the simplest (fewest terms, then simplest coefficients); on a tie the strict solution
    _, out, ok, _ = min(found, key=lambda t: (t[0], not t[3]))
    return out, round(float(ok.mean()) if n else 1.0, 6), int(n - ok.sum())


def agreeing_discarded(kd: KernelData, g, bounds, ok, edges=2) -> bool:
    """Does a solution leave unexplained every launch of a feature group of several launches,
    where lost records would hardly have contradicted them all? Lost records contradict
    launches one by one, at random (each with the rate `FitParams.contradiction_rate` gives):
    a whole group contradicted (launches with equal arguments, which touch the same pages) is
    evidence against the solution, not loss (docs/template-model.md, "Lost records")."""
    if ok.all():
        return False
    n_g = np.bincount(g, minlength=kd.U)
    bad_g = np.bincount(g[~ok], minlength=kd.U)
    cand = (bad_g == n_g) & (n_g >= 2)
    if not cand.any():
        return False
    rate = np.broadcast_to(np.asarray(kd.params.contradiction_rate(kd.loss, edges), np.float64), (len(g),))
    logp = np.bincount(g, weights=np.log(np.maximum(rate, 1e-300)), minlength=kd.U)
    return bool((cand & (logp < np.log(1.0 - kd.params.confidence))).any())


def group_evidence(kd: KernelData, g, s_lo, s_hi, e_lo, e_hi, limit: int = 64) -> dict:
    """Up to `limit` feature groups with their start/end byte bounds, kept for fault feedback."""
    groups, sl, sh, w = group_bounds(g, s_lo, s_hi, kd.U)
    _, el, eh, _ = group_bounds(g, e_lo, e_hi, kd.U)
    pick = np.unique(np.linspace(0, len(groups) - 1, min(limit, len(groups))).round().astype(np.int64))
    rows = [[int(x) for x in kd.uniq[groups[i]]] + [int(sl[i]), int(sh[i]), int(el[i]), int(eh[i]), int(w[i])]
            for i in pick]
    return {"features": list(kd.sel_names), "rows": rows}
