"""The GPU runner's capacity emulation: the residency estimate and how it chooses victims (pure),
as Python objects: the reference the runner's compiled estimate (`unit_residency.UnitResidency`,
`period.PeriodTracker`) is tested against and benchmarked beside (`LaunchDecider(compiled=False)`
runs on these).

`Residency` holds the bytes the runner believes are on the emulated GPU,
grouped in 2 MiB units, and says what to evict before a launch whose
estimated footprint would not fit. Victims, by policy (each policy's `victims`):

- `demand`, `alloc`: FIFO of 2 MiB units in the order they became resident,
  as the driver's eviction (its victim list is ordered by allocation);
- `template`: furthest predicted next use (`SequenceNextUse`). Only the
  current launch is known ahead of time, so the next use of a unit is
  predicted from the kernel sequence seen so far: when the launch sequence is
  periodic with period P (training steps, decode steps, solver sweeps;
  `PeriodDetector`), a unit used at launch s in the last period is predicted
  to be used again at s + P, and a unit not used in the last period is
  predicted never to be used again (first victim); until a period is found,
  least recently used;
- `oracle`: Belady's OPT (`FutureNextUse`), with next uses read from the trace.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import OrderedDict, deque
from typing import Any, Callable, Iterable, Sequence

from .ranges import UNIT, merge_ranges, split_by_unit, subtract_ranges


class PeriodDetector:
    """The period of the kernel-name sequence seen so far, if it repeats.

    P is accepted when the last max(P, min_match) launches equal the ones P
    before them. Checked in O(1) per launch while it holds; when it breaks,
    searched again among the distances back to earlier launches of the same
    kernel (smallest first, up to max_period), at most every `search_every`
    launches, backing off (up to 32x) while the sequence stays aperiodic.
    """

    def __init__(self, max_period: int = 1024, min_match: int = 16, search_every: int = 8) -> None:
        self.max_period = max_period
        self.min_match = min_match
        self.search_every = search_every
        self.seq: list[int] = []
        self.period: int | None = None
        self._ids: dict[str, int] = {}
        self._pos: dict[int, deque] = {}
        self._next_search = 0
        self._backoff = 1

    def observe(self, kernel: str) -> int | None:
        k = self._ids.setdefault(kernel, len(self._ids))
        seq = self.seq
        seq.append(k)
        t = len(seq) - 1
        pos = self._pos.get(k)
        if pos is None:
            pos = self._pos[k] = deque()
        if self.period is not None and seq[t - self.period] == k:
            pass
        else:
            self.period = None
            if t >= self._next_search:
                self.period, checked = self._search(pos)
                if self.period is None and checked:
                    self._backoff = min(self._backoff * 2, 32)   # a real miss, not too little history
                elif self.period is not None:
                    self._backoff = 1
                self._next_search = t + self.search_every * self._backoff
        pos.append(t)
        while pos and pos[0] < t - self.max_period:
            pos.popleft()
        return self.period

    def _search(self, pos: deque) -> tuple[int | None, bool]:
        """(period or None, whether any candidate had enough history to be checked)."""
        seq, n = self.seq, len(self.seq)
        t = n - 1
        checked = False
        for prev in reversed(pos):        # nearest earlier launch of the same kernel first
            p = t - prev
            if p > self.max_period:
                break
            m = max(p, self.min_match)
            if m + p > n:
                break
            checked = True
            ok = True
            for j in range(n - m, n):
                if seq[j] != seq[j - p]:
                    ok = False
                    break
            if ok:
                return p, True
        return None, checked


class SequenceNextUse:
    """Predicted next use of a unit from the uses seen so far (the template policy's victims).

    With a period P: a unit used at s in (t - P, t] is next used at s + P
    (the earliest such s); a unit unused in the last period, never. Without
    a period: least recently used. Scores are distances (larger: evict first).
    """

    def __init__(self, detector: PeriodDetector, keep: int = 4096) -> None:
        self.detector = detector
        self.keep = keep
        self.uses: dict[int, deque] = {}

    def record(self, t: int, units: Iterable[int]) -> None:
        for u in units:
            d = self.uses.get(u)
            if d is None:
                d = self.uses[u] = deque()
            if not d or d[-1] != t:
                d.append(t)
            while d and d[0] < t - self.keep:
                d.popleft()

    def forget(self, u: int) -> None:
        pass  # use history outlives residency: an evicted unit's pattern still predicts

    def score(self, u: int, t: int) -> float:
        d = self.uses.get(u)
        if not d:
            return math.inf
        p = self.detector.period
        if p is None:
            return float(t - d[-1])  # LRU
        lo = t - p
        first = None
        for s in reversed(d):  # newest first: only the uses of the last period are looked at
            if s <= lo:
                break
            first = s
        return math.inf if first is None else float(first + p - t)


class FutureNextUse:
    """Belady's next use from known future uses: uses[key] = ascending launch ids."""

    def __init__(self, uses: dict[Any, Sequence[int]], keys_of: Callable[[int], Iterable[Any]]) -> None:
        self.uses = uses
        self.keys_of = keys_of

    def score(self, u: int, t: int) -> float:
        best = math.inf
        for k in self.keys_of(u):
            arr = self.uses.get(k)
            if arr is None or len(arr) == 0:
                continue
            i = bisect.bisect_right(arr, t)
            if i < len(arr):
                best = min(best, float(arr[i] - t))
        return best


def _covers(have: list[tuple[int, int]], rs: list[tuple[int, int]]) -> bool:
    """Does `have` (merged ranges) contain every range of `rs`?"""
    for a, n in rs:
        e = a + n
        for h, m in have:
            if h <= a and e <= h + m:
                break
        else:
            return False
    return True


class Residency:
    """The runner's estimate of what is on the emulated GPU: byte ranges, grouped in `unit` chunks.

    `admit(ranges, t)` makes room for a launch's ranges and records them as
    resident; it returns the byte ranges to evict first (to the host). The
    capacity is counted in whole units, as the driver hands GPU memory out in
    2 MiB chunks (a VA block's first resident page takes its whole chunk; the
    simulator's uvm_driver.room_for): a unit with any resident byte takes its
    whole size. (An allocation's partial last block takes 64 KiB chunks in the
    driver; the estimate counts it whole too, which can only leave room unused.)
    `resident_bytes` still reports the bytes held. Victims are whole units. The launch's own units are never victims; when its own bytes
    alone exceed the capacity everything else is evicted, the launch counts
    as an overflow (the driver thrashes inside the kernel) and, when the ranges
    are a prediction rather than a guess, only its last units, a capacity's
    worth, are counted resident after it.

    victim: `fifo` (order of becoming resident), `lru` (order of last use),
    `next-use` / `belady` (largest `next_use.score(unit, t)` first).
    """

    def __init__(self, capacity_bytes: int, unit: int = UNIT, victim: str = "fifo",
                 next_use: Any = None) -> None:
        if victim not in ("fifo", "lru", "next-use", "belady"):
            raise ValueError(f"unknown victim rule {victim!r}")
        if victim in ("next-use", "belady") and next_use is None:
            raise ValueError(f"victim rule {victim!r} needs a next_use scorer")
        self.capacity = max(1, int(capacity_bytes))
        self.capacity_units = max(1, self.capacity // unit)
        self.unit = unit
        self.charge = min(unit, self.capacity)   # what a resident unit takes (a chunk larger than memory: all)
        self.victim = victim
        self.next_use = next_use
        self.resident: OrderedDict[int, list[tuple[int, int]]] = OrderedDict()
        self._bytes: dict[int, int] = {}
        self.resident_bytes = 0
        self.overflows = 0
        self.evicted_bytes = 0
        self.evictions = 0

    @property
    def resident_units(self) -> int:
        return len(self.resident)

    def missing(self, ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
        """The parts of `ranges` the estimate does not already hold (what a prefetch must still move)."""
        out: list[tuple[int, int]] = []
        for u, rs in split_by_unit(merge_ranges(ranges), self.unit).items():
            have = self.resident.get(u)
            if not have:
                out.extend(rs)
            elif not _covers(have, rs):
                out.extend(subtract_ranges(rs, have))
        return merge_ranges(out)

    def release(self, ranges: Iterable[tuple[int, int]]) -> int:
        """Forget the parts of `ranges` the estimate holds (freed memory: nothing to evict,
        no room taken). Returns the bytes released."""
        freed = 0
        for u, rs in split_by_unit(merge_ranges(ranges), self.unit).items():
            have = self.resident.get(u)
            if not have:
                continue
            left = subtract_ranges(have, rs)
            b = sum(n for _, n in left)
            freed += self._bytes[u] - b
            self.resident_bytes -= self._bytes[u] - b
            if left:
                self.resident[u] = left
                self._bytes[u] = b
            else:
                del self.resident[u]
                del self._bytes[u]
        return freed

    def observe(self, ranges: Iterable[tuple[int, int]], t: int) -> None:
        """Record `ranges` resident without making room: they moved already (a kernel's faults, the
        driver's prefetch, reported by the unified-memory counters), so they took their room; the
        next launch's admission evicts what no longer fits, by the victim rule."""
        cap = self.capacity
        self.capacity = 1 << 62
        try:
            self.admit(ranges, t, streams=False)
        finally:
            self.capacity = cap

    def admit(self, ranges: Iterable[tuple[int, int]], t: int, streams: bool = True) -> list[tuple[int, int]]:
        """Make room for `ranges` (a launch's footprint) and record them resident; returns the
        byte ranges to evict first. `streams`: the ranges are the launch's real footprint (a
        prediction, not a guess such as whole allocations), so when they exceed the capacity the
        launch streams through memory and only its last units are counted resident after it."""
        parts = split_by_unit(merge_ranges(ranges), self.unit)
        merged: dict[int, tuple[list[tuple[int, int]], int]] = {}
        growth = own = 0
        mine: dict[int, int] = {}   # the launch's own bytes per unit (own also counts co-resident ones)
        for u, rs in parts.items():
            mine[u] = sum(n for _, n in rs)
            have = self.resident.get(u)
            if have and _covers(have, rs):   # the common case: all of it is there already
                m, b = have, self._bytes[u]
            else:
                m = merge_ranges((have or []) + rs)
                b = sum(n for _, n in m)
            merged[u] = (m, b)
            # memory is taken in chunks: a unit takes its whole size while any byte of it is resident
            growth += 0 if u in self.resident else self.charge
            own += self.charge
        over = len(self.resident) * self.charge + growth - self.capacity
        victims: list[int] = []
        if over > 0:
            victims = self._victims(set(parts), over, t)
            if own > self.capacity:
                self.overflows += 1
        out: list[tuple[int, int]] = []
        for u in victims:
            out.extend(self.resident.pop(u))
            self.resident_bytes -= self._bytes.pop(u)
        launch = len(mine) * self.charge
        if launch > self.capacity and streams:
            # the launch streams through memory: the driver's fault path evicts as it goes, so
            # what stays is the launch's last units (in address order, as a sweep leaves them),
            # a capacity's worth; the rest are counted gone, to be fetched again when needed
            for u in sorted(merged):
                if launch <= self.capacity:
                    break
                merged.pop(u)
                if u in self.resident:
                    self.resident_bytes -= self._bytes.pop(u)
                    del self.resident[u]
                launch -= self.charge
        for u, (m, b) in merged.items():
            if u in self.resident:
                self.resident[u] = m
                if self.victim == "lru":
                    self.resident.move_to_end(u)
            else:
                self.resident[u] = m
            self.resident_bytes += b - self._bytes.get(u, 0)
            self._bytes[u] = b
        out = merge_ranges(out)
        self.evictions += len(victims)
        self.evicted_bytes += sum(n for _, n in out)
        return out

    def _victims(self, need: set[int], over: int, t: int) -> list[int]:
        """Units to evict, in victim order, until `over` bytes are freed, each unit its whole size
        (or nothing else is left)."""
        cands: Iterable[int] = (u for u in self.resident if u not in need)
        out, freed = [], 0
        if self.victim not in ("fifo", "lru"):
            # furthest next use first (ties: lowest unit): a heap, since a launch usually needs
            # one or two victims out of all resident units
            scored = [(-self.next_use.score(u, t), u) for u in cands]
            heapq.heapify(scored)
            while scored and freed < over:
                u = heapq.heappop(scored)[1]
                out.append(u)
                freed += self.charge
            return out
        for u in cands:
            out.append(u)
            freed += self.charge
            if freed >= over:
                break
        return out
