"""The pages one launch touches, gathered from the interpreter's memory operations.

Each load, store or atomic hands over a tile of CPU addresses and a mask. One compiled
pass (`_tile_pages`, numba) skips the masked-off lanes, translates each address into
managed memory through the live storages (sorted CPU ranges and their offsets), and
appends the page of the element's first and last byte, collapsing runs of one page (a
tile is rows of consecutive elements, so this leaves about one entry per row and page).
Reads and writes go to separate buffers. When a buffer fills, it is merged (sorted,
unique) in place, so a launch holds at most its own footprint's pages plus one buffer:
memory stays bounded however many addresses the kernel computes. At the end of the
launch the pages become intervals, cut at allocation boundaries, each marked read,
write or readwrite.
"""

from __future__ import annotations

import numpy as np
from numba import njit

PAGE_SHIFT = 12
PAGE = 1 << PAGE_SHIFT
FIRST_CAP = 1 << 12      # entries a launch's buffer starts with (grows by doubling)
COMPACT_AT = 1 << 21     # entries a buffer may hold before it is merged (16 MiB of int64)

READ, WRITE, BOTH = 1, 2, 3


@njit(cache=True, nogil=True)
def _tile_pages(a, m, use_mask, starts, ends, deltas, elem_bytes, out, pos):  # pragma: no cover - compiled
    """Append the managed pages of a[i] .. a[i] + elem_bytes - 1 (where m[i]) to out[pos:].

    Returns (new pos, addresses outside every storage). `out` must hold 2 * len(a) more."""
    last = np.int64(-1)
    cur = -1
    lo = np.int64(0)
    hi = np.int64(0)
    d = np.int64(0)
    unmapped = 0
    n_st = len(starts)
    for i in range(len(a)):
        if use_mask and not m[i]:
            continue
        x = np.int64(a[i])
        if cur < 0 or x < lo or x >= hi:
            j = np.searchsorted(starts, x, side="right") - 1
            if j < 0 or j >= n_st or x >= ends[j]:
                unmapped += 1
                cur = -1
                continue
            cur, lo, hi, d = j, starts[j], ends[j], deltas[j]
        y = x + d
        p = y >> PAGE_SHIFT
        if p != last:
            out[pos] = p
            pos += 1
            last = p
        q = (y + elem_bytes - 1) >> PAGE_SHIFT
        if q != last:
            out[pos] = q
            pos += 1
            last = q
    return pos, unmapped


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
        `index`: (starts, ends, deltas) int64 arrays of the live storages."""
        if m is None:
            mm, use = _NO_MASK, False
        else:
            mm, use = (m if m.shape == a.shape else np.broadcast_to(m, a.shape)).reshape(-1), True
        a = a.reshape(-1)
        starts, ends, deltas = index
        first = self._r if kind & READ else self._w
        buf = first.room(2 * len(a))
        pos, unmapped = _tile_pages(a, mm, use, starts, ends, deltas, elem_bytes, buf, first.pos)
        if kind == BOTH:
            new = buf[first.pos:pos]
            wb = self._w.room(len(new))
            wb[self._w.pos:self._w.pos + len(new)] = new
            self._w.pos += len(new)
        first.pos = pos
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


_NO_MASK = np.zeros(0, np.bool_)


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
