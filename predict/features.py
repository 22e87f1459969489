"""Launch arguments as numbers: parameter words, pointers (bases) and size features.

A kernel's parameter buffer is sliced into named words:

- `p3`            parameter 3 when it is a scalar of 1, 2, 4 or 8 bytes;
- `p0.w2`         the 4-byte word at byte 8 (= 4*2) of struct parameter 0;
- `p0.d2`         the 8-byte word at byte 8 (= 4*2) of struct parameter 0
                  (only where the word is 8-byte aligned in the buffer);
- `p1:u`          the unsigned reading of a 4-byte word (where it differs);
- `grid_x` ... `block_z`  the launch configuration.

8-byte words whose value points into (or one past the end of) an allocation
live at that launch are *bases*; the others, decoded as integers, are
*features*. The same `Word` objects decode a whole kernel's launches at once
(numpy, `batch`) or one launch's bytes (`one`), so the batch and the online
predictors read arguments identically.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pagecast import trace as T
from pagecast.allocations import AllocIndex  # noqa: F401  (re-exported: the predictor's modules import it here)
from pagecast.footprints import _ranges

GRID_NAMES = T.GRID_COLUMNS  # grid_x .. block_z
MAX_FEATURE = 1 << 40        # larger integers are addresses, hashes or floats, never sizes
_NAME = re.compile(r"^p(\d+)(?:\.([wd])(\d+))?(:u)?$")


@dataclass(frozen=True)
class Word:
    """One named integer read from the parameter buffer (or the grid)."""

    name: str
    param: int          # parameter index (-1 for grid/block)
    within: int         # byte offset inside the parameter
    size: int           # 1, 2, 4 or 8
    signed: bool = True

    @staticmethod
    def parse(name: str) -> "Word":
        if name in GRID_NAMES:
            return Word(name, -1, GRID_NAMES.index(name), 4, True)
        m = _NAME.match(name)
        if not m:
            raise ValueError(f"not a parameter word name: {name!r}")
        p, kind, k, u = m.groups()
        if kind is None:
            return Word(name, int(p), 0, 0, u is None)  # size from the layout
        return Word(name, int(p), 4 * int(k), 4 if kind == "w" else 8, u is None)

    def resolve(self, sizes) -> "Word":
        """Fill in the size of a whole-parameter word from the kernel's layout."""
        if self.param >= 0 and self.size == 0:
            return Word(self.name, self.param, 0, int(sizes[self.param]), self.signed)
        return self

    def offset(self, offsets) -> int:
        return int(offsets[self.param]) + self.within

    def batch(self, mat: np.ndarray, offsets, grid: np.ndarray | None = None) -> np.ndarray:
        """Decode this word for every row of a (launches x bytes) uint8 matrix (int64 out)."""
        if self.param < 0:
            return grid[:, self.within].astype(np.int64)
        o = self.offset(offsets)
        raw = np.ascontiguousarray(mat[:, o:o + self.size])
        dt = {1: "i1", 2: "i2", 4: "i4", 8: "i8"}[self.size]
        if not self.signed:
            dt = "u" + dt[1:]
        return raw.view("<" + dt).reshape(-1).astype(np.int64)

    def one(self, data: bytes, offsets, grid=None) -> int:
        if self.param < 0:
            return int(grid[self.within])
        o = self.offset(offsets)
        return int.from_bytes(data[o:o + self.size], "little", signed=self.signed)

    def pointer_batch(self, mat: np.ndarray, offsets) -> np.ndarray:
        o = self.offset(offsets)
        return np.ascontiguousarray(mat[:, o:o + 8]).view("<u8").reshape(-1)

    def pointer_one(self, data: bytes, offsets) -> int:
        o = self.offset(offsets)
        return int.from_bytes(data[o:o + 8], "little", signed=False)


def candidate_words(sizes, offsets) -> tuple[list[Word], list[Word]]:
    """(8-byte words that may be pointers, other integer words) of a layout."""
    ptrs: list[Word] = []
    ints: list[Word] = []
    for i, (s, o) in enumerate(zip(sizes, offsets)):
        s, o = int(s), int(o)
        if s in (1, 2, 4):
            ints.append(Word(f"p{i}", i, 0, s))
            if s == 4:
                ints.append(Word(f"p{i}:u", i, 0, 4, False))
        elif s == 8:
            ptrs.append(Word(f"p{i}", i, 0, 8))
        elif s > 0:
            for b in range(0, s - 3, 4):
                ints.append(Word(f"p{i}.w{b // 4}", i, b, 4))
                ints.append(Word(f"p{i}.w{b // 4}:u", i, b, 4, False))
                if (o + b) % 8 == 0 and b + 8 <= s:
                    ptrs.append(Word(f"p{i}.d{b // 4}", i, b, 8))
    return ptrs, ints


# ---- parameter bytes ----------------------------------------------------------

def param_matrix(launches: pa.Table, idx: np.ndarray, width: int) -> np.ndarray:
    """Parameter bytes of launches `idx` as an (n, width) uint8 matrix (zero padded)."""
    n = len(idx)
    if n == 0 or width == 0:
        return np.zeros((n, width), np.uint8)
    col = launches.column(T.PARAM_DATA)
    arr = col.take(pa.array(idx)) if len(idx) != launches.num_rows or not _is_arange(idx) else col
    arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    if pa.types.is_large_binary(arr.type):
        offs = np.frombuffer(arr.buffers()[1], np.int64, n + 1, arr.offset * 8)
    else:
        offs = np.frombuffer(arr.buffers()[1], np.int32, n + 1, arr.offset * 4).astype(np.int64)
    data = np.frombuffer(arr.buffers()[2], np.uint8) if arr.buffers()[2] is not None else np.zeros(0, np.uint8)
    lens = np.diff(offs)
    if np.all(lens == width):
        return data[offs[0]:offs[0] + n * width].reshape(n, width)
    pos = offs[:-1, None] + np.arange(width)[None, :]
    ok = np.arange(width)[None, :] < lens[:, None]
    out = np.zeros((n, width), np.uint8)
    if len(data):
        out[ok] = data[np.minimum(pos, len(data) - 1)][ok]
    return out


def _is_arange(idx: np.ndarray) -> bool:
    return len(idx) > 0 and idx[0] == 0 and idx[-1] == len(idx) - 1 and np.all(np.diff(idx) == 1)


_CACHE: dict = {}


def _cached(launches: pa.Table, what: str, make):
    """Per-table numpy views (the table object is kept alive in the cache entry, so ids stay unique)."""
    key = (id(launches), what)
    hit = _CACHE.get(key)
    if hit is None or hit[0] is not launches:
        if len(_CACHE) > 32:
            _CACHE.clear()
        hit = (launches, make())
        _CACHE[key] = hit
    return hit[1]


def release_views() -> None:
    """Forget the per-table views `_cached` made (and the tables they keep alive): called where a
    prediction pass over a trace ends (replay/plan/adaptive.py), so that they are not held through the
    planning that follows (a few int64 arrays a launch: docs/performance.md has a measured case).
    The next pass makes them again."""
    _CACHE.clear()


def grid_matrix(launches: pa.Table, idx: np.ndarray) -> np.ndarray:
    if not len(idx):
        return np.zeros((0, 6), np.int64)
    full = _cached(launches, "grid", lambda: np.stack([launches.column(c).to_numpy() for c in GRID_NAMES], axis=1))
    return full[idx]


def kernel_groups(launches: pa.Table) -> tuple[list[str], np.ndarray, list[np.ndarray]]:
    """(kernel names, code per launch, launch indices per kernel in issue order)."""
    if launches.num_rows == 0:
        return [], np.zeros(0, np.int64), []
    enc = launches.column(T.KERNEL).combine_chunks().dictionary_encode()
    names = enc.dictionary.to_pylist()
    codes = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(names) + 1))
    return names, codes, [order[bounds[k]:bounds[k + 1]] for k in range(len(names))]


def layout_groups(launches: pa.Table, idx: np.ndarray, most: int = 8) -> list[tuple[tuple, tuple, np.ndarray]]:
    """The parameter layouts of these launches, most common first: (sizes, offsets, mask over
    `idx`), at most `most` of them (launches of rarer ones in none). One kernel name may have
    several: a Triton kernel is specialized on an argument passed as None, which then leaves
    the parameter buffer."""
    out = []
    rest = np.arange(len(idx))
    while len(rest) and len(out) < most:
        sizes, offsets, m = layouts(launches, idx[rest])
        mask = np.zeros(len(idx), bool)
        mask[rest[m]] = True
        out.append((sizes, offsets, mask))
        rest = rest[~m]
    return out


def layouts(launches: pa.Table, idx: np.ndarray) -> tuple[tuple, tuple, np.ndarray]:
    """The most common (sizes, offsets) of these launches and a mask of launches that have it."""
    n = len(idx)
    if n == 0:
        return (), (), np.zeros(0, bool)

    def whole():
        offs = launches.column(T.PARAM_OFFSETS)
        sizes = launches.column(T.PARAM_SIZES)
        lens_all = pc.list_value_length(offs).to_numpy(zero_copy_only=False).astype(np.int64)
        return (lens_all, np.concatenate([[0], np.cumsum(lens_all)]).astype(np.int64),
                pc.list_flatten(offs).to_numpy(zero_copy_only=False).astype(np.int64),
                pc.list_flatten(sizes).to_numpy(zero_copy_only=False).astype(np.int64))

    lens_all, starts_all, fo_all, fs_all = _cached(launches, "layout", whole)
    lens = lens_all[idx]
    k = int(lens[0])
    if np.all(lens == k):
        pos = (starts_all[idx][:, None] + np.arange(k)[None, :]).reshape(-1)
        fo, fs = fo_all[pos], fs_all[pos]
    else:
        pos = _ranges(starts_all[idx], lens)
        fo, fs = fo_all[pos], fs_all[pos]
    if np.all(lens == k):
        so = np.concatenate([fs.reshape(n, k), fo.reshape(n, k)], axis=1) if k else np.zeros((n, 0), np.int64)
        if (so == so[0]).all():
            return tuple(int(x) for x in so[0, :k]), tuple(int(x) for x in so[0, k:]), np.ones(n, bool)
        uniq, inv, cnt = np.unique(so, axis=0, return_inverse=True, return_counts=True)
        best = int(np.argmax(cnt))
        row = uniq[best]
        return tuple(int(x) for x in row[:k]), tuple(int(x) for x in row[k:]), inv.reshape(-1) == best
    # lengths differ: take the first launch's layout, keep launches equal to it
    starts = np.concatenate([[0], np.cumsum(lens)])
    keys = [(tuple(fs[starts[i]:starts[i + 1]]), tuple(fo[starts[i]:starts[i + 1]])) for i in range(n)]
    (s0, o0), _ = Counter(keys).most_common(1)[0]
    return s0, o0, np.array([kk == (s0, o0) for kk in keys])


# ---- allocations ---------------------------------------------------------------

SMALL_ROWS = 512   # factorize_rows sorts up to this many rows, hashes more


def factorize_rows(M: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(unique rows sorted, inverse) of an int64 matrix, by hashing (much faster than np.unique(axis=0))."""
    n, k = M.shape
    if k == 0:
        return np.zeros((1 if n else 0, 0), np.int64), np.zeros(n, np.int64)
    if n <= SMALL_ROWS:   # a sort: the hash's per-column calls cost more on a few rows (the fitter's groups)
        if n == 0:
            return M[:0], np.zeros(0, np.int64)
        o = np.lexsort(M.T[::-1])
        s = M[o]
        new = np.empty(n, bool)
        new[0] = True
        np.any(s[1:] != s[:-1], axis=1, out=new[1:])
        inv = np.empty(n, np.int64)
        inv[o] = np.cumsum(new) - 1
        return s[new], inv
    import pandas as pd
    code = np.zeros(n, np.int64)
    card = 1
    for j in range(k):
        c, u = pd.factorize(M[:, j], sort=True)
        if card * max(len(u), 1) >= 2 ** 62:
            uniq, inv = np.unique(M, axis=0, return_inverse=True)
            return uniq, inv.reshape(-1)
        code = code * len(u) + c
        card *= max(len(u), 1)
    c, u = pd.factorize(code, sort=True)
    first = np.zeros(len(u), np.int64)
    first[c[::-1]] = np.arange(n - 1, -1, -1)
    return M[first], c.astype(np.int64)


