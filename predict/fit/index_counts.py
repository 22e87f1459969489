"""Counts for the `indexed` fit (predict/fit/index_values.py): how many index values a launch
reads and which, as candidates to verify, from the simplest on:

- the rows' lengths as a formula of the arguments, then each argument or grid dimension never
  longer than the row (`count_candidates`);
- a value read from another traced buffer at position 0 or at an argument or grid dimension,
  or that value over a power of two, rounded up (`buffer_count_candidates`);
- a two-dimensional table: R rows of rs entries, row r read up to another buffer's value at
  position r over a power of two (`table_candidates`; predict/indexed.py evaluates them; the
  same tables with their rows filtered by a third buffer's values are fit.row_filters');
- for values that select whole chunks, each chunk read up to another buffer's value at the same
  position, or the difference of its consecutive values (`length_candidates`, `length_sets`;
  fit.index_rows reads rows chosen by position with them).

Each is a `Count`: the fields a Region takes (count, count_index, count_elem, count_div,
row_stride), the values each launch reads, and, where they are not a prefix of the row, the
smallest and largest of them (`TableCount.extremes`). Also the values rows and widths those
searches and the fit share (`value_rows`, `value_elems`, `launch_positions`, `row_bytes`,
`prefix_values`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import numpy as np

from pagecast import footprints as FP
from pagecast import values as V

from .. import formula as FM
from .. import indexed as IX
from ..model_io import RowFilter, RowValue
from .data import KernelData
from .solve import solve_pair


def launch_positions(kd: KernelData):
    """For each launch of kd (concatenated over its traces): its trace part and launch id."""
    part = np.concatenate([np.full(len(idx), ti) for ti, (_, idx, _, _) in enumerate(kd.parts)])
    lid = np.concatenate([idx for _, idx, _, _ in kd.parts])
    return part, lid


def value_rows(kd: KernelData, part: np.ndarray, lid: np.ndarray, iptr: np.ndarray) -> np.ndarray:
    """The values row each launch read from `iptr` (-1: none recorded)."""
    out = np.full(len(lid), -1, np.int64)
    for ti, (o, _, _, _) in enumerate(kd.parts):
        m = part == ti
        if m.any() and o.trace.values is not None:
            out[m] = V.image(o.trace).find(lid[m], iptr[m])
    return out


def value_elems(kd: KernelData, part, rows) -> list[int]:
    """Value widths to try: int64 first where the rows read as int64 (every odd 4-byte word the
    sign of the even one before it), else int32."""
    odd_ok = True
    for ti, r in zip(part[:64], rows[:64]):
        im = V.image(kd.parts[ti][0].trace)
        n = int(im.nbytes[r]) // 4
        w = im.ints(int(r), n, 4)
        if n % 2 or not len(w):
            odd_ok = False
            continue
        lo, hi = w[0::2], w[1::2]
        odd_ok &= bool(np.all(hi == np.where(lo < 0, -1, 0)))
    return [8, 4] if odd_ok else [4]


def count_candidates(kd: KernelData, g: np.ndarray, row_len: np.ndarray):
    """Count formulas to try: the rows' lengths as a formula of the arguments (rows recorded
    exactly), then each argument or grid dimension never longer than the row (rows clipped, or
    a prefix of a persistent buffer read: one program per token reads `grid_x` ids of a buffer
    allocated once at the largest batch, whose later entries are stale or -1 padding)."""
    res = solve_pair(kd, g, [(row_len, row_len)], max_terms=1)
    if res is not None:
        yield res[0][0]
    for name in position_names(kd):
        v = kd.uniq[g, kd.sel_names.index(name)]
        if (v >= 1).all() and (v <= row_len).all() and not (v == row_len).all():
            yield FM.Formula(0, ((1, (name,)),))


def position_names(kd: KernelData) -> list[str]:
    return [n for n in kd.sel_names if not n.startswith("block_")]


MAX_COUNT_DIV = 1 << 12   # the largest divisor tried for a count read from another buffer


def _divisors(c: np.ndarray, row_len: np.ndarray):
    """Divisors d for which ceil(c / d) is a count of at least one value and at most the row at
    every launch, not the whole row everywhere: 1, then every power of two from the smallest that
    keeps every count within its row up to the first that makes every count one (a count of
    blocks: a tile's size is a power of two, as `tl.arange` needs; past that one, larger divisors
    read the same values). Larger divisors read fewer values; verification keeps the first whose
    chunks cover the faults and stay inside what may have been touched, so the stale entries past
    a launch's blocks reject too small a divisor, and the faults of its last blocks too large a
    one. The smallest divisor that fits says little of the block size: where the rows are much
    longer than the counts need (a buffer allocated for the longest sequence), it is 1 whatever
    the block. Yields (d, counts)."""
    if (c < 1).any():
        return
    for d in pow2_divisors(c):
        k = -(-c // d)
        if (k <= row_len).all() and not (k == row_len).all():
            yield d, k


def pow2_divisors(c: np.ndarray):
    """1, 2, 4, ... up to the first power of two that makes every ceil(c / d) at most one, or
    MAX_COUNT_DIV."""
    d = 1
    while d <= MAX_COUNT_DIV:
        yield d
        if (c <= d).all():
            return
        d *= 2


def count_buffers(kd: KernelData, w, iw, sv, part, lid):
    """The other pointers whose values rows were recorded at every launch `sv`, as (word, each
    launch's values row, value width), each width `_elems` finds."""
    for cw, cvals in kd.bases:
        if cw.name == w.name or (iw is not None and cw.name == iw.name):
            continue
        crow = value_rows(kd, part[sv], lid[sv], np.concatenate(cvals)[sv])
        if (crow < 0).any():
            continue
        for ce in value_elems(kd, part[sv], crow):
            yield cw, crow, ce


def buffer_count_candidates(kd: KernelData, w, iw, g, sv, part, lid, row_len):
    """Counts read from another traced buffer (module doc): the value at position 0, or at an
    argument or grid dimension, of each other pointer's values row (an indptr's entry at the
    batch size: the end of the range it selects), never longer than the index row, or that
    value over a power of two, rounded up (a padded token count over the block size). Yields
    Count (the count formula is the position read)."""
    positions = [FM.Formula(0, ())] + [FM.Formula(0, ((1, (n,)),)) for n in position_names(kd)]
    for cw, crow, ce in count_buffers(kd, w, iw, sv, part, lid):
        for pos in positions:
            pv = np.asarray(pos.evaluate({n: kd.uniq[g, k] for k, n in enumerate(kd.sel_names)}), np.int64) \
                * np.ones(len(sv), np.int64)
            key = np.stack([part[sv], crow, pv], axis=1)
            uk, inv = np.unique(key, axis=0, return_inverse=True)
            cu = np.full(len(uk), -1, np.int64)
            for j, (ti, r, p) in enumerate(uk):
                x = V.image(kd.parts[int(ti)][0].trace).ints(int(r), int(p) + 1, ce)
                if len(x) == p + 1:
                    cu[j] = x[-1]
            for d, k in _divisors(cu[inv.reshape(-1)], row_len):
                yield Count(pos, cw.name, ce, d, k)
    for cw, crow, ce in count_buffers(kd, w, iw, sv, part, lid):
        # the values not negative among the first `pos` (a -1-padded slot mapping's live slots, which
        # no argument carries): where some are negative, a count of its own
        for pos in positions[1:]:
            k = _valid_counts(kd, g, sv, part, crow, ce, pos)
            if k is not None and (k <= row_len).all():
                yield Count(pos, cw.name, ce, 1, k, valid=True)


def _valid_counts(kd: KernelData, g, sv, part, crow, ce: int, pos: FM.Formula):
    """Per launch, the values not negative among the first `pos` of its values row, or None where
    a row is shorter than that or no launch's first `pos` hold a negative value."""
    pv = np.asarray(pos.evaluate({n: kd.uniq[g, k] for k, n in enumerate(kd.sel_names)}), np.int64) \
        * np.ones(len(sv), np.int64)
    key = np.stack([part[sv], crow, pv], axis=1)
    uk, inv = np.unique(key, axis=0, return_inverse=True)
    cu = np.zeros(len(uk), np.int64)
    neg = False
    for j, (ti, r, p) in enumerate(uk):
        if p < 1:
            return None
        x = V.image(kd.parts[int(ti)][0].trace).ints(int(r), int(p), ce)
        if len(x) < p:
            return None
        cu[j] = int((x >= 0).sum())
        neg = neg or cu[j] < p
    return cu[inv.reshape(-1)] if neg else None


@dataclasses.dataclass
class Count:
    """A count to try: the count formula (a position or a number of rows where read from another
    buffer `cidx` of `celem`-byte values, over `cdiv`), `k` the values each launch reads, `rs` a
    table's row stride (None: a prefix), `ext` (v0, v1, ok) where the values are not a prefix,
    and the strides found for it (filled once)."""

    count: FM.Formula
    cidx: str | None
    celem: int
    cdiv: int
    k: np.ndarray
    rs: FM.Formula | None = None
    ext: tuple | None = None
    strides: tuple | None = None
    valid: bool = False      # the count: the values not negative among the first `count` of cidx's


    def extremes(self):
        """(v0, v1, ok) where the values are not a prefix (None: a prefix of k values)."""
        return self.ext

    def fields(self) -> dict:
        return dict(count=self.count, count_index=self.cidx, count_elem=self.celem, count_div=self.cdiv,
                    row_stride=self.rs, row_filter=None, count_sub=None, count_valid=self.valid)


MAX_TABLES = 48   # table candidates tried per index word at most (each may need a solve)


class TableShape(NamedTuple):
    """A table to try (table_shapes): its count buffer's word and value width, the names of its
    row count R and row stride rs, the count divisor, and per row (concatenated over the
    launches) its count value, its launch position, its row number and its rs."""

    cw: Any
    ce: int
    rn: str
    sn: str
    d: int
    c: np.ndarray
    rl: np.ndarray
    ri: np.ndarray
    rs: np.ndarray


def table_shapes(kd: KernelData, w, iw, g, sv, part, lid, row_len):
    """The tables (TableShape) table_candidates tries, in its order."""
    names = position_names(kd)
    n = len(sv)
    cols = {nm: kd.uniq[g, kd.sel_names.index(nm)] * np.ones(n, np.int64) for nm in names}
    for cw, crow, ce in count_buffers(kd, w, iw, sv, part, lid):
        clen = row_bytes(kd, part[sv], crow) // ce
        for rn in names:
            R = cols[rn]
            if (R < 1).any() or (R > clen).any() or not (R > 1).any():
                continue
            sns = [sn for sn in names if sn != rn and (cols[sn] >= 1).all()
                   and ((R - 1) * cols[sn] < row_len).all()]
            if not sns:
                continue
            c = np.maximum(prefix_values(kd, part[sv], crow, R, ce), 0)
            rl = np.repeat(np.arange(n), R)
            ri = np.arange(len(rl), dtype=np.int64) - np.repeat(np.cumsum(R) - R, R)
            for sn in sns:
                rs = cols[sn][rl]
                for d in _row_divisors(c, rs):
                    yield TableShape(cw, ce, rn, sn, d, c, rl, ri, rs)


def table_candidates(kd: KernelData, w, iw, elem: int, g, sv, part, lid, irows, row_len):
    """Two-dimensional tables (predict/indexed.py): the index row read as `R` rows of `rs`
    entries, row r up to ceil(c[r] / d) entries, c another traced buffer's values (a block table
    read up to each sequence's length over the block size; stale ids past it). R and rs are each
    an argument or grid dimension (the number of sequences, the table's row stride); R is more
    than one at some launch, reads no more values than the count buffer holds, and the last row
    starts inside the index row; d is 1 or a power of two that keeps every row's count within
    its row (`_divisors`' rule, per row). Yields Count, its values' extremes (`ext`) made when
    a solve needs them (`TableCount`)."""
    n = len(sv)
    made = 0
    for cw, ce, rn, sn, d, c, rl, ri, rs in table_shapes(kd, w, iw, g, sv, part, lid, row_len):
        kr = -(-c // d)
        k = np.bincount(rl, weights=kr, minlength=n).astype(np.int64)
        if (k < 1).any():
            continue
        yield TableCount(FM.Formula(0, ((1, (rn,)),)), cw.name, ce, d, k,
                         FM.Formula(0, ((1, (sn,)),)), rows=(kd, part[sv], irows, rl, ri * rs, kr, elem))
        made += 1
        if made >= MAX_TABLES:
            return


def length_candidates(kd: KernelData, w, iw, sv, part, lid, k: np.ndarray):
    """Chunks of their own lengths (predict/indexed.py, `lengths`), for a region whose values
    select whole chunks: each of `length_sets`' lengths over every power-of-two divisor, 1 first
    (the most a length may read), in units of the width of the region's own values (an integer
    table read up to a length counts its entries: a request's row of a page table, read to the
    request's length over the page size). Yields (the Region fields, each value's chunk bytes,
    concatenated over the launches as `prefix_values` gives them)."""
    units = own_units(kd, w, sv, part, lid)
    for cname, ce, diff, c, _ in length_sets(kd, w, iw, sv, part, lid, k) if units else ():
        for d in pow2_divisors(c):
            for u in units:
                yield dict(count_index=cname, count_elem=ce, count_div=d, lengths=True, length_diff=diff,
                           chunk=FM.Formula(u, ())), u * (-(-c // d))


def own_units(kd: KernelData, w, sv, part, lid) -> list[int]:
    """The widths the region's own buffer's values read as (value_elems), where they were recorded
    at every launch `sv`; [] where not: nothing then says what a unit of length is."""
    own = next((v for cw, v in kd.bases if cw.name == w.name), None)
    if own is None:
        return []
    orow = value_rows(kd, part[sv], lid[sv], np.concatenate(own)[sv])
    if (orow < 0).any():
        return []
    return value_elems(kd, part[sv], orow)


MAX_LENGTH_VALUES = 1 << 22   # values given lengths over the fitting launches at most (held at once)


def length_sets(kd: KernelData, w, iw, sv, part, lid, k: np.ndarray):
    """Lengths for k[l] values at each launch `sv`, from each other traced buffer holding enough
    values at every launch: its first k values, or the differences of its first k + 1 where they
    never fall (an indptr: value i's entries run from v[i] to v[i+1]). Yields (the buffer's word
    name, its value width, differences or not, the lengths concatenated over the launches,
    negative ones as 0, the values the buffer holds past those read, summed over the launches).
    Nothing where the launches read more than MAX_LENGTH_VALUES values in all (a static matrix's
    column indices read at every iteration: no per-value lengths, and too many to hold)."""
    n = len(sv)
    if int(np.sum(k)) + n > MAX_LENGTH_VALUES:
        return
    for cw, crow, ce in count_buffers(kd, w, iw, sv, part, lid):
        held = row_bytes(kd, part[sv], crow) // ce
        for diff in (False, True):
            if (held < k + diff).any():
                continue
            c = prefix_values(kd, part[sv], crow, k + diff, ce)
            if diff:
                lv = np.repeat(np.arange(n), k + 1)
                nxt = lv[1:] == lv[:-1]
                c = (c[1:] - c[:-1])[nxt]
                if (c < 0).any():
                    continue
            yield cw.name, ce, diff, np.maximum(c, 0), int((held - k - diff).sum())


@dataclasses.dataclass
class TableCount(Count):
    """A table's count (_table_candidates): `rows` what its values' extremes are made from."""

    rows: tuple | None = None
    rf: RowFilter | None = None   # the rows read only where another buffer allows (filtered_table_candidates)
    sub: RowValue | None = None   # the rows' counts less another buffer's values (filtered_table_candidates)

    def extremes(self):
        if self.ext is None:
            self.ext = _table_extremes(*self.rows, n=len(self.k))
        return self.ext

    def fields(self) -> dict:
        return {**super().fields(), "row_filter": self.rf, "count_sub": self.sub}


def row_bytes(kd: KernelData, part, rows) -> np.ndarray:
    """Each launch's values row's length in bytes (rows >= 0)."""
    out = np.zeros(len(rows), np.int64)
    for ti in np.unique(part):
        m = part == ti
        out[m] = V.image(kd.parts[int(ti)][0].trace).nbytes[rows[m]]
    return out


def prefix_values(kd: KernelData, part, crow, n, ce: int) -> np.ndarray:
    """The first n[l] `ce`-byte values of each launch's row, concatenated (rows shared by
    launches read once; rows holding fewer than n[l] values are not passed here)."""
    key = np.stack([part, crow, n], axis=1)
    uk, inv = np.unique(key, axis=0, return_inverse=True)
    vals = [V.image(kd.parts[int(ti)][0].trace).ints(int(r), int(m), ce) for ti, r, m in uk]
    lens = np.array([len(v) for v in vals], np.int64)
    flat = np.concatenate(vals) if vals else np.zeros(0, np.int64)
    return flat[FP._ranges((np.cumsum(lens) - lens)[inv.reshape(-1)], np.asarray(n, np.int64))]


def _row_divisors(c: np.ndarray, rs: np.ndarray):
    """Divisors for per-row counts: every power of two (1 included) that keeps each row's count
    ceil(c / d) within its row of `rs` entries, up to the first that makes every count one
    (`_divisors`: a block table sized for the longest sequence fits its rows' counts at
    divisors far below the block size)."""
    for d in pow2_divisors(c):
        if (-(-c // d) <= rs).all():
            yield d


def _table_extremes(kd: KernelData, part, irows, rl, first, kr, elem: int, n: int):
    """(v0, v1, ok) per launch over the entries a table candidate reads: row entries
    [first, first + kr) of each launch's index row, sentinels left out."""
    v0 = np.full(n, np.iinfo(np.int64).max)
    v1 = np.full(n, -1, np.int64)
    vl = np.repeat(rl, kr)
    pos = FP._ranges(first, kr)
    for ti in np.unique(part):
        im = V.image(kd.parts[int(ti)][0].trace)
        m = part[vl] == ti
        if not m.any():
            continue
        v = IX.ints_at(im, im.start[irows[vl[m]]] + pos[m] * elem, elem)
        keep = v >= 0
        np.minimum.at(v0, vl[m][keep], v[keep])
        np.maximum.at(v1, vl[m][keep], v[keep])
    ok = v1 >= 0
    return np.where(ok, v0, 0), np.where(ok, v1, 0), ok
