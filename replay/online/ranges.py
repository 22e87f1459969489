"""Byte ranges for the runner's per-launch decisions: merging, splitting in 2 MiB units, and the
managed allocations that a launch's pointer arguments land in (pure, apart from `AllocationMap`'s
lookup, which asks the driver on a GPU and a trace in the simulator's `runner` policy).

Ranges are (address, nbytes) pairs. These are per-launch helpers on short
Python lists (the launch callback's hot path); `pagecast.footprints` merges
whole traces' page intervals with numpy instead.
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from pagecast.uvm import ROOT_CHUNK

UNIT = ROOT_CHUNK               # eviction unit: the driver's 2 MiB root chunk (docs/uvm-facts.md)
MIN_PTR = 1 << 16               # a parameter word in [MIN_PTR, MAX_PTR) may be a pointer
MAX_PTR = 1 << 57


@dataclass
class Allocation:
    """An allocation a pointer lands in: its base, size and whether it is managed (UVM) memory."""

    base: int
    size: int
    managed: bool


def merge_ranges(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge (address, nbytes) ranges that overlap or touch; drop empty ones; sorted."""
    if not isinstance(ranges, list):
        ranges = list(ranges)
    if len(ranges) == 1:   # the common case on the hot path: one range
        a, n = ranges[0]
        return [(int(a), int(n))] if n > 0 else []
    rs = sorted((int(a), int(a) + int(n)) for a, n in ranges if int(n) > 0)
    out: list[list[int]] = []
    for a, b in rs:
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1][1] = b
        else:
            out.append([a, b])
    return [(a, b - a) for a, b in out]


def front(ranges: Iterable[tuple[int, int]], nbytes: int) -> list[tuple[int, int]]:
    """The first `nbytes` of `ranges` in address order (merged)."""
    out: list[tuple[int, int]] = []
    for a, n in merge_ranges(ranges):
        if nbytes <= 0:
            break
        out.append((a, min(n, nbytes)))
        nbytes -= n
    return out


def front_units(ranges: Iterable[tuple[int, int]], n_units: int, unit: int = UNIT) -> list[tuple[int, int]]:
    """The part of `ranges` (merged, address order) in their first `n_units` units: a launch's
    first capacity's worth when memory is taken in whole units."""
    out: list[tuple[int, int]] = []
    seen, last = 0, -1
    for a, n in merge_ranges(ranges):
        e, x, cut = a + n, a, a + n
        while x < e:
            u = x // unit
            if u != last:
                if seen >= n_units:
                    cut = x
                    break
                seen, last = seen + 1, u
            x = (u + 1) * unit
        if cut > a:
            out.append((a, cut - a))
        if cut < e:
            break
    return out


class RangeArrays:
    """Byte ranges held as one int64 array [address0, nbytes0, address1, nbytes1, ...], sorted by
    address (not merged): what a precomputed footprint hands the residency step as it is, without
    a Python tuple per range. Iterating gives (address, nbytes) tuples, as a range list does."""

    __slots__ = ("flat",)

    def __init__(self, flat) -> None:
        self.flat = flat

    def __len__(self) -> int:
        return len(self.flat) // 2

    def __bool__(self) -> bool:
        return len(self.flat) > 0

    def __iter__(self):
        f = self.flat.tolist()
        return iter(zip(f[0::2], f[1::2]))

    def tolist(self) -> list[tuple[int, int]]:
        return list(self)


def units_of(ranges: Iterable[tuple[int, int]], unit: int = UNIT) -> set[int]:
    s: set[int] = set()
    for a, n in ranges:
        if n > 0:
            s.update(range(a // unit, (a + n - 1) // unit + 1))
    return s


def split_by_unit(ranges: Iterable[tuple[int, int]], unit: int = UNIT) -> dict[int, list[tuple[int, int]]]:
    """The part of each range inside each unit: unit -> [(address, nbytes)]."""
    out: dict[int, list[tuple[int, int]]] = {}
    for a, n in ranges:
        end = a + n
        while a < end:
            u = a // unit
            b = min(end, (u + 1) * unit)
            out.setdefault(u, []).append((a, b - a))
            a = b
    return out


def subtract_ranges(ranges: Iterable[tuple[int, int]], minus: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of `ranges` not covered by `minus` (both (address, nbytes)); merged, sorted."""
    a = merge_ranges(ranges)
    b = merge_ranges(minus)
    out: list[tuple[int, int]] = []
    j = 0
    for s, n in a:
        e = s + n
        while j < len(b) and b[j][0] + b[j][1] <= s:
            j += 1
        k = j
        cur = s
        while k < len(b) and b[k][0] < e:
            bs, be = b[k][0], b[k][0] + b[k][1]
            if bs > cur:
                out.append((cur, bs - cur))
            cur = max(cur, be)
            k += 1
        if cur < e:
            out.append((cur, e - cur))
    return out


class AllocationMap:
    """Which allocation a pointer lands in, cached over `CudaIface.allocation_of`.

    Hits are served from sorted bases (bisect); misses ask the driver once and
    are remembered (negative answers in a bounded set). A free the launch hook
    sees (cuMemFree / cudaFree) drops its allocation (`forget`); one it does not
    see is found when a prefetch into the stale range is refused.
    """

    def __init__(self, lookup: Callable[[int], Any]) -> None:
        self._lookup = lookup
        self._bases: list[int] = []
        self._ends: list[int] = []      # base + size of each cached allocation (pieces' hot path)
        self._allocs: list[Any] = []
        self._miss: set[int] = set()
        # bumped whenever an answer of `find` may change (an allocation cached or forgotten, the
        # misses cleared): a cache of its answers (the compiled predictor's misses) is valid while
        # it stays the same
        self.generation = 0

    def find(self, addr: int):
        i = bisect.bisect_right(self._bases, addr) - 1
        if i >= 0 and addr < self._ends[i]:
            return self._allocs[i]
        if addr < MIN_PTR or addr >= MAX_PTR or addr in self._miss:
            return None
        a = self._lookup(addr)
        if a is None:
            if len(self._miss) > 100_000:
                self._miss.clear()
                self.generation += 1
            self._miss.add(addr)
            return None
        self.generation += 1
        j = bisect.bisect_left(self._bases, a.base)
        if j < len(self._bases) and self._bases[j] == a.base:
            self._allocs[j] = a
            self._ends[j] = a.base + a.size
        else:
            self._bases.insert(j, a.base)
            self._ends.insert(j, a.base + a.size)
            self._allocs.insert(j, a)
        return a

    def managed(self) -> list:
        return [a for a in self._allocs if a.managed]

    def cached(self, addr: int):
        """The cached allocation holding addr, or None (never asks the driver)."""
        i = bisect.bisect_right(self._bases, addr) - 1
        if i >= 0 and addr < self._ends[i]:
            return self._allocs[i]
        return None

    def forget(self, addr: int) -> None:
        """Drop what is cached about the allocation holding addr (it was freed: look it up again)."""
        i = bisect.bisect_right(self._bases, addr) - 1
        if i >= 0 and addr < self._ends[i]:
            del self._bases[i]
            del self._ends[i]
            del self._allocs[i]
        self._miss.discard(addr)
        self.generation += 1

    def clip(self, ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
        """Keep the parts of ranges that lie in managed allocations (prefetch fails elsewhere)."""
        return merge_ranges(self.pieces(ranges))

    def pieces(self, ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
        """The parts of ranges that lie in managed allocations, cut at allocation boundaries, in order.

        What a prefetch is given: cuMemPrefetchAsync's range must be managed memory, and two
        allocations that happen to be adjacent are not one range to the driver.
        """
        out = []
        bases, ends, allocs = self._bases, self._ends, self._allocs   # find changes them in place
        have, lo, hi = False, 0, 0     # the managed allocation of the previous piece, [lo, hi)
        right = bisect.bisect_right
        for a, n in ranges:
            end = a + n
            if have and lo <= a and end <= hi:
                out.append((a, n))   # fast path: inside the allocation of the previous range
                continue
            while a < end:
                i = right(bases, a) - 1
                if i >= 0 and a < ends[i]:   # find's cached answer, inline
                    al, top = allocs[i], ends[i]
                else:
                    al = self.find(a)
                    if al is None:
                        # skip to the next known allocation inside the range, if any
                        i = right(bases, a)
                        if i >= len(bases) or bases[i] >= end:
                            break
                        a = bases[i]
                        continue
                    top = al.base + al.size
                b = min(end, top)
                if al.managed:
                    out.append((a, b - a))
                    have, lo, hi = True, al.base, top
                a = b
        return out


def pointer_words(param_data: bytes) -> list[int]:
    """Every 8-byte-aligned little-endian word of a parameter buffer that could be a pointer."""
    n = len(param_data) // 8
    if n == 0:
        return []
    words = struct.unpack_from(f"<{n}Q", param_data)
    return [w for w in words if MIN_PTR <= w < MAX_PTR]


def allocation_ranges(param_data: bytes, allocs: AllocationMap) -> list[tuple[int, int]]:
    """The whole managed allocations the launch's pointer arguments land in (the `alloc` policy)."""
    out = []
    for w in pointer_words(param_data):
        a = allocs.find(w)
        if a is not None and a.managed:
            out.append((a.base, a.size))
    return merge_ranges(out)
