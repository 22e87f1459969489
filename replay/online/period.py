"""The kernel sequence's period, one compiled call per launch (`residency.PeriodDetector`'s rule).

`PeriodTracker` gives the same answers as `PeriodDetector` (tests compare them on periodic and
random sequences): P is accepted when the last max(P, min_match) launches equal the ones P before
them, checked in O(1) per launch while it holds; when it breaks it is searched again among the
distances back to earlier launches of the same kernel (nearest first, up to max_period), at most
every `search_every` launches, backing off (up to 32x) while the sequence stays aperiodic. The
sequence is kept in a ring of the last 2 * max_period launches (all a search reads), not in a
list that grows with the run.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pagecast.jit import entry_point

P_N, P_PERIOD, P_NEXT, P_BACKOFF, P_MAXP, P_MINM, P_EVERY, P_RING = range(8)
PHEAD = 8


@njit(cache=True)
def observe_kernel(d, k):
    """Launch t = d[P_N] is kernel k: its period (-1: none)."""
    ring = d[P_RING]
    t = d[P_N]
    d[PHEAD + t % ring] = k
    n = t + 1
    d[P_N] = n
    per = d[P_PERIOD]
    if per > 0 and d[PHEAD + (t - per) % ring] == k:
        return per
    per = -1
    if t >= d[P_NEXT]:
        checked = False
        maxp, minm = d[P_MAXP], d[P_MINM]
        for j in range(t - 1, max(t - maxp, 0) - 1, -1):   # earlier launches of k, nearest first
            if d[PHEAD + j % ring] != k:
                continue
            p = t - j
            m = max(p, minm)
            if m + p > n:
                break
            checked = True
            ok = True
            for q in range(n - m, n):
                if d[PHEAD + q % ring] != d[PHEAD + (q - p) % ring]:
                    ok = False
                    break
            if ok:
                per = p
                break
        if per < 0 and checked:
            d[P_BACKOFF] = min(d[P_BACKOFF] * 2, 32)   # a real miss, not too little history
        elif per > 0:
            d[P_BACKOFF] = 1
        d[P_NEXT] = t + d[P_EVERY] * d[P_BACKOFF]
    d[P_PERIOD] = per
    return per


class PeriodTracker:
    """`PeriodDetector` (same constructor, `observe(kernel) -> period | None`, `period`) in arrays."""

    def __init__(self, max_period: int = 1024, min_match: int = 16, search_every: int = 8) -> None:
        self.max_period, self.min_match, self.search_every = max_period, min_match, search_every
        ring = 1 << (2 * max(max_period, min_match) + 2).bit_length()
        self.d = np.zeros(PHEAD + ring, np.int64)
        self.d[P_PERIOD] = -1
        self.d[P_BACKOFF] = 1
        self.d[P_MAXP], self.d[P_MINM], self.d[P_EVERY], self.d[P_RING] = max_period, min_match, search_every, ring
        self._ids: dict[str, int] = {}
        self._observe = observe_kernel   # the entry point after warm()

    def warm(self) -> "PeriodTracker":
        self._observe = entry_point(observe_kernel, self.d.copy(), 0)
        return self

    def observe(self, kernel: str) -> int | None:
        k = self._ids.get(kernel)
        if k is None:
            k = self._ids[kernel] = len(self._ids)
        p = self._observe(self.d, k)
        return None if p < 0 else p

    @property
    def period(self) -> int | None:
        p = int(self.d[P_PERIOD])
        return None if p < 0 else p

    @period.setter
    def period(self, p: int | None) -> None:
        self.d[P_PERIOD] = -1 if p is None else int(p)
