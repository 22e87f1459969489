"""The pages one launch touches, gathered from the interpreter's memory operations.

Each load, store or atomic hands over a tile of CPU addresses and a mask. `tile_pages`
drops the masked-off lanes, translates the addresses into managed memory through the live
storages (sorted CPU ranges and their offsets; one offset for the whole tile when it lies
in one storage, the common case), takes the page of each element's first byte (and of its
last, when elements are not aligned to their size), and collapses runs of one page (a tile
is rows of consecutive elements, so this leaves about one entry per row and page). A few
numpy passes over the tile: no compiled code, so nothing to load or compile at start-up
(numba's first call cost 0.6 s here, more than the whole collection of a short script).
Reads and writes go to separate buffers. When a buffer fills, it is merged (sorted,
unique) in place, so a launch holds at most its own footprint's pages plus one buffer:
memory stays bounded however many addresses the kernel computes. At the end of the
launch the pages become intervals, cut at allocation boundaries, each marked read,
write or readwrite.
"""

from __future__ import annotations

import bisect

import numpy as np

PAGE_SHIFT = 12
PAGE = 1 << PAGE_SHIFT
FIRST_CAP = 1 << 12      # entries a launch's buffer starts with (grows by doubling)
COMPACT_AT = 1 << 21     # entries a buffer may hold before it is merged (16 MiB of int64)

READ, WRITE, BOTH = 1, 2, 3


def tile_pages(a: np.ndarray, m: np.ndarray | None, index, elem_bytes: int) -> tuple[np.ndarray, int]:
    """Managed pages of the bytes a[i] .. a[i] + elem_bytes - 1 where m[i] (runs of one page collapsed),
    and how many addresses lay outside every storage. `a` is 1-D uint64, `m` 1-D bool or None;
    `index`: the live storages as (starts, ends, deltas) int64 arrays and the same as lists."""
    if m is not None and not m.all():
        a = a[m]
    if a.size == 0:
        return _EMPTY, 0
    x = a.view(np.int64)
    lo, hi = x.min(), x.max()
    starts, ends, deltas, ls, le, ld = index
    j = bisect.bisect_right(ls, lo) - 1
    unmapped = 0
    if j >= 0 and hi < le[j]:
        y = x + ld[j]
    else:                                 # several storages, or addresses in none
        k = np.searchsorted(starts, x, side="right") - 1
        ok = (k >= 0) & (x < ends[np.maximum(k, 0)])
        if not ok.all():
            unmapped = int((~ok).sum())
            x, k = x[ok], k[ok]
        y = x + deltas[k]
    p = y >> PAGE_SHIFT
    if elem_bytes > 1 and (elem_bytes & (elem_bytes - 1) or np.bitwise_or.reduce(y) & (elem_bytes - 1)):
        q = (y + (elem_bytes - 1)) >> PAGE_SHIFT          # an unaligned element may run into the next page
        if (q != p).any():
            p = np.stack([p, q], axis=1).reshape(-1)
    if len(p) > 1:
        keep = np.empty(len(p), bool)
        keep[0] = True
        np.not_equal(p[1:], p[:-1], out=keep[1:])
        p = p[keep]
    return p, unmapped


_EMPTY = np.zeros(0, np.int64)


class _Buffer:
    __slots__ = ("buf", "pos")

    def __init__(self) -> None:
        self.buf = np.empty(FIRST_CAP, np.int64)
        self.pos = 0

    def room(self, n: int) -> np.ndarray:
        """The buffer, with room for n more entries (merging or growing it first)."""
        if self.pos + n > len(self.buf):
            if self.pos + n > COMPACT_AT:
                u = np.unique(self.buf[:self.pos])
                self.pos = len(u)
                if self.pos + n > len(self.buf):
                    self.buf = np.empty(max(2 * len(self.buf), 2 * (self.pos + n)), np.int64)
                self.buf[:self.pos] = u
            else:
                grown = np.empty(max(2 * len(self.buf), self.pos + n), np.int64)
                grown[:self.pos] = self.buf[:self.pos]
                self.buf = grown
        return self.buf

    def pages(self) -> np.ndarray:
        return np.unique(self.buf[:self.pos])


class LaunchPages:
    """Pages read and written by one launch, merged as they come."""

    __slots__ = ("_r", "_w")

    def __init__(self) -> None:
        self._r = _Buffer()
        self._w = _Buffer()

    def add_tile(self, a: np.ndarray, m: np.ndarray | None, kind: int, index, elem_bytes: int) -> int:
        """Record one memory operation; returns how many addresses lay in no known storage.

        `a`: uint64 CPU addresses (any shape); `m`: the mask (broadcastable) or None;
        `index`: the live storages (StorageMap.index())."""
        if m is not None:
            m = (m if m.shape == a.shape else np.broadcast_to(m, a.shape)).reshape(-1)
        p, unmapped = tile_pages(a.reshape(-1), m, index, elem_bytes)
        for b, k in ((self._r, READ), (self._w, WRITE)):
            if kind & k:
                buf = b.room(len(p))
                buf[b.pos:b.pos + len(p)] = p
                b.pos += len(p)
        return unmapped

    def finish(self) -> tuple[np.ndarray, np.ndarray]:
        """(pages, codes): sorted unique pages and READ / WRITE / BOTH for each."""
        r, w = self._r.pages(), self._w.pages()
        pages = np.union1d(r, w)
        code = np.zeros(len(pages), np.int8)
        if len(r):
            code[np.searchsorted(pages, r)] |= READ
        if len(w):
            code[np.searchsorted(pages, w)] |= WRITE
        return pages, code


def page_intervals(pages: np.ndarray, code: np.ndarray, seg_start: np.ndarray, seg_end: np.ndarray,
                   seg_id: np.ndarray):
    """Runs of consecutive pages with one code inside one allocation, clipped to its bytes.

    `seg_*`: the live allocations, sorted by address. Returns (alloc id, address, bytes,
    code, pages outside every allocation)."""
    if len(pages) == 0 or len(seg_start) == 0:
        z = np.zeros(0, np.int64)
        return z, z, z, np.zeros(0, np.int8), int(len(pages))
    addr = pages << PAGE_SHIFT
    k = np.searchsorted(seg_start, addr, side="right") - 1
    inside = (k >= 0) & (addr < seg_end[np.maximum(k, 0)])
    outside = int((~inside).sum())
    if outside:
        pages, code, k = pages[inside], code[inside], k[inside]
    if len(pages) == 0:
        z = np.zeros(0, np.int64)
        return z, z, z, np.zeros(0, np.int8), outside
    new = np.ones(len(pages), bool)
    new[1:] = (pages[1:] != pages[:-1] + 1) | (code[1:] != code[:-1]) | (k[1:] != k[:-1])
    first = np.flatnonzero(new)
    last = np.r_[first[1:], len(pages)] - 1
    seg = k[first]
    start = np.maximum(pages[first] << PAGE_SHIFT, seg_start[seg])
    end = np.minimum((pages[last] + 1) << PAGE_SHIFT, seg_end[seg])
    return seg_id[seg], start, end - start, code[first], outside
