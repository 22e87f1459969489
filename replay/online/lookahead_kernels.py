"""The lookahead's per-launch kernels (lookahead.py's `Windows` calls them): how many launches of
a window fit beside the launch's own units, relocating them as it goes (`window_kernel`; on plain
arrays, `window_fit`), and a prefetch cut into per-launch groups, each unit with the first launch
that uses it (`split_groups`); and, at start, the copy stream's schedule the depth comes from
(`copy_schedule`)."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _count_units(lo, hi, k):
    """Distinct units covered by unit intervals [lo[i], hi[i]) for i < k."""
    if k == 0:
        return 0
    o = np.argsort(lo[:k])
    n = 0
    cur_lo, cur_hi = lo[o[0]], hi[o[0]]
    for i in range(1, k):
        a, b = lo[o[i]], hi[o[i]]
        if a > cur_hi:
            n += cur_hi - cur_lo
            cur_lo, cur_hi = a, b
        elif b > cur_hi:
            cur_hi = b
    return n + cur_hi - cur_lo


@njit(cache=True)
def _own_intervals(own, unit, lo, hi):
    """Launch t's own ranges `own` (flat address, nbytes pairs) as unit intervals [lo, hi) from
    index 0; returns how many (empty ranges are left out)."""
    k = 0
    for i in range(0, len(own) - 1, 2):
        if own[i + 1] > 0:
            lo[k] = own[i] // unit
            hi[k] = (own[i] + own[i + 1] - 1) // unit + 1
            k += 1
    return k


@njit(cache=True)
def window_fit(own, win, wptr, m, unit, cap):
    """How many of the window's launches (0 .. m; their ranges win[2*wptr[j]:2*wptr[j+1]]) fit in
    `cap` units beside launch t's own ranges `own` (flat address, nbytes pairs): the most m' with
    the units of own and the first m' launches at most cap; 0 where not even the first does."""
    tot = len(own) // 2 + wptr[m]
    lo = np.empty(max(tot, 1), np.int64)
    hi = np.empty(max(tot, 1), np.int64)
    k = _own_intervals(own, unit, lo, hi)
    for j in range(m):
        for i in range(wptr[j], wptr[j + 1]):
            if win[2 * i + 1] > 0:
                lo[k] = win[2 * i] // unit
                hi[k] = (win[2 * i] + win[2 * i + 1] - 1) // unit + 1
                k += 1
        if _count_units(lo, hi, k) > cap:
            return j
    return m


@njit(cache=True)
def window_kernel(lay, t0, t1, own, unit, cap, out, wptr):
    """`window_fit` on a laid-out Relocator's footprints (`lay`: relocate.py's arrays ptr, aj, off,
    nb, base, known), relocating launches
    t0 .. t1-1 as it goes: their ranges at out[0:], launch t0 + j's pairs at [wptr[j], wptr[j+1]),
    up to the first launch that does not fit beside `own` in `cap` units; returns how many fit.
    Intervals of allocations whose address in this run is not known yet are left out."""
    ptr, aj, off, nb, base, known = lay
    tot = len(own) // 2 + ptr[t1] - ptr[t0]
    lo = np.empty(max(tot, 1), np.int64)
    hi = np.empty(max(tot, 1), np.int64)
    k = _own_intervals(own, unit, lo, hi)
    w = 0
    wptr[0] = 0
    for t in range(t0, t1):
        w0 = w
        for i in range(ptr[t], ptr[t + 1]):
            j = aj[i]
            if known[j] and nb[i] > 0:
                a = base[j] + off[i]
                out[2 * w] = a
                out[2 * w + 1] = nb[i]
                w += 1
                lo[k] = a // unit
                hi[k] = (a + nb[i] - 1) // unit + 1
                k += 1
        if _count_units(lo, hi, k) > cap:
            return t - t0
        # sorted by address within the launch (insertion sort: few, nearly sorted)
        for i in range(w0 + 1, w):
            a, n = out[2 * i], out[2 * i + 1]
            m = i - 1
            while m >= w0 and out[2 * m] > a:
                out[2 * m + 2] = out[2 * m]
                out[2 * m + 3] = out[2 * m + 1]
                m -= 1
            out[2 * m + 2] = a
            out[2 * m + 3] = n
        wptr[t - t0 + 1] = w
    return t1 - t0


@njit(cache=True)
def split_groups(pf, own, win, wptr, m, unit):
    """The prefetch `pf` (flat pairs) cut per unit into groups: 0, the units launch t's own ranges
    `own` cover; j (1 .. m), the units window launch j - 1 uses first (of those not in earlier
    groups); unclaimed units go with group 0. Returns (out, gptr): each group's ranges merged, in
    address order, at out[2*gptr[g]:2*gptr[g+1]]."""
    npf = len(pf) // 2
    # the prefetch's units, sorted and distinct
    nu = 0
    for i in range(npf):
        if pf[2 * i + 1] > 0:
            nu += (pf[2 * i] + pf[2 * i + 1] - 1) // unit - pf[2 * i] // unit + 1
    us = np.empty(max(nu, 1), np.int64)
    k = 0
    for i in range(npf):
        a, n = pf[2 * i], pf[2 * i + 1]
        if n > 0:
            for u in range(a // unit, (a + n - 1) // unit + 1):
                us[k] = u
                k += 1
    us = np.unique(us[:k])
    grp = np.full(len(us), m + 1, np.int64)
    for i in range(0, len(own) - 1, 2):
        if own[i + 1] > 0:
            _claim(us, grp, own[i] // unit, (own[i] + own[i + 1] - 1) // unit + 1, 0)
    for j in range(m):
        for i in range(wptr[j], wptr[j + 1]):
            if win[2 * i + 1] > 0:
                _claim(us, grp, win[2 * i] // unit, (win[2 * i] + win[2 * i + 1] - 1) // unit + 1, j + 1)
    for i in range(len(grp)):
        if grp[i] > m:
            grp[i] = 0
    # pieces (address, nbytes, group), each within one unit
    pa = np.empty(max(k, 1), np.int64)
    pn = np.empty(max(k, 1), np.int64)
    pg = np.empty(max(k, 1), np.int64)
    q = 0
    for i in range(npf):
        a, n = pf[2 * i], pf[2 * i + 1]
        e = a + n
        while a < e:
            u = a // unit
            b = min(e, (u + 1) * unit)
            pa[q], pn[q], pg[q] = a, b - a, grp[np.searchsorted(us, u)]
            q += 1
            a = b
    o = np.argsort(pg[:q], kind="mergesort")
    out = np.empty(2 * max(q, 1), np.int64)
    gptr = np.zeros(m + 2, np.int64)
    w = 0
    last_g = -1
    for i in range(q):
        x = o[i]
        g = pg[x]
        while last_g < g:
            last_g += 1
            gptr[last_g] = w
        if w > gptr[g] and out[2 * (w - 1)] + out[2 * (w - 1) + 1] == pa[x]:
            out[2 * (w - 1) + 1] += pn[x]
        else:
            out[2 * w] = pa[x]
            out[2 * w + 1] = pn[x]
            w += 1
    while last_g < m + 1:
        last_g += 1
        gptr[last_g] = w
    return out[:2 * w], gptr


@njit(cache=True)
def _claim(us, grp, u0, u1, g):
    i = np.searchsorted(us, u0)
    while i < len(us) and us[i] < u1:
        if grp[i] > g:
            grp[i] = g
        i += 1


@njit(cache=True)
def copy_schedule(kt, need):
    """One copy stream beside the kernels (lookahead.py, "How far ahead"): for each launch s, when
    its copy starts (S[s]) and when its kernel starts (K[s]), the copy of s going as late as its
    kernel allows but never before the copy stream is free, and the kernel waiting for its copy.
    `kt`: kernel seconds per launch; `need`: copy seconds per launch (0: nothing to move)."""
    n = len(kt)
    S = np.zeros(n)
    K = np.zeros(n)
    free = 0.0
    for s in range(1, n):
        k = K[s - 1] + kt[s - 1]
        if need[s] > 0:
            start = max(k - need[s], free)
            free = start + need[s]
            S[s] = start
            K[s] = max(k, free)
        else:
            S[s] = k
            K[s] = k
    return S, K
