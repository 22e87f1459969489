"""Rows read only where another traced buffer's values allow, and counts less its values, for
the `indexed` fit (predict/fit/index_values.py; predict/indexed.py evaluates them):

- `filtered_table_candidates`: index_counts' tables with their rows filtered by another
  buffer's value at the row (`row_filter`: a decode kernel's programs that return for the
  batch's prefill requests), or their counts less its value (`count_sub`: a prefill chunk's
  context, the sequence's length less the query's);
- `length_filters`: the same filters for chunks of their own lengths, one dimension (a prefill
  kernel's query rows, read where the query is longer than a decode's one token).

A row's value (model_io.RowValue) is a buffer's value at the row, or the difference of its
values at r+1 and r (`RowForms`).
"""

from __future__ import annotations

import numpy as np

from .. import formula as FM
from .. import indexed as IX
from ..model_io import RowFilter, RowValue
from .data import KernelData
from .index_counts import (TableCount, TableShape, count_buffers, table_shapes, prefix_values, row_bytes)


FILTER_SHAPES = 24   # tables tried per row filter and count buffer at most (table_candidates' order)


def filtered_table_candidates(kd: KernelData, w, iw, elem: int, g, sv, part, lid, irows, row_len):
    """table_candidates' tables with their rows filtered by another traced buffer, or their
    counts less another buffer's values (the fit tries them only where no table without either
    verifies; predict/indexed.py, `row_filter`, `count_sub`). A row value f(r) is a buffer's
    value at r or the difference of its values at r+1 and r (a query's length from its start
    offsets; model_io.RowValue).

    Filters: row r read only where f(r) <= t or f(r) >= t. Per buffer and form, t is the
    tightest bound that leaves some row out and keeps one at every launch of the table (the
    smallest value f takes for <=, the largest for >=), and more than one at some launch (a
    table, as table_candidates' R: a filter that keeps only the first row names no table); for
    >=, the loosest that leaves only f's smallest value out first (`_ge_bounds`). The
    rows left unread no longer widen the values' extremes the stride solve starts from (a decode
    kernel's programs that return for the batch's prefill requests). Each filter's table is
    followed by the same with its rows' counts less each row value `_subs` allows, the filter's
    own first (a prefill kernel that skips decode queries and reads its context: the sequence's
    length less the query's).

    Then the tables without a filter, their counts less each row value `_subs` allows. Yields
    TableCount with its `rf` and `sub`, over the first FILTER_SHAPES tables of each count buffer."""
    n = len(sv)
    shapes = []
    per_buffer: dict = {}
    for shape in table_shapes(kd, w, iw, g, sv, part, lid, row_len):
        # the first tables of each count buffer (its divisors are many: a buffer listed before
        # another, a query's start offsets before the sequences' lengths, must not take them all)
        if per_buffer.setdefault(shape.cw.name, 0) < FILTER_SHAPES:
            per_buffer[shape.cw.name] += 1
            shapes.append(shape)
    if not shapes:
        return
    forms = RowForms(kd, w, iw, sv, part, lid)

    def table(shape, kr, rf=None, sub=None):
        cw, ce, rn, sn, d, c, rl, ri, rs = shape
        return TableCount(FM.Formula(0, ((1, (rn,)),)), cw.name, ce, d,
                          np.bincount(rl, weights=kr, minlength=n).astype(np.int64), FM.Formula(0, ((1, (sn,)),)),
                          rows=(kd, part[sv], irows, rl, ri * rs, kr, elem), rf=rf, sub=sub)

    for fi in range(len(forms.buffers)):
        for shape in shapes:
            cw, ce, rn, sn, d, c, rl, ri, rs = shape
            kr0 = -(-c // d)
            live = kr0 > 0
            for rv, f in forms.of(shape, fi):
                for rf, keep in _row_filters(rv, f, rl, live, n):
                    # a filter leaves a table: more than one row read at some launch, as for R
                    if not (np.bincount(rl, weights=keep & live, minlength=n) > 1).any():
                        continue
                    yield table(shape, np.where(keep, kr0, 0), rf)
                    for sub, cs in _subs(forms, shape, keep, rv):
                        yield table(shape, np.where(keep, -(-cs // d), 0), rf, sub)
    for shape in shapes:
        for sub, cs in _subs(forms, shape, shape.c > 0, None):
            yield table(shape, -(-cs // shape.d), None, sub)


def _row_filters(rv: RowValue, f: np.ndarray, rl: np.ndarray, live: np.ndarray, n: int):
    """The RowFilters on row value `rv` (f its value per row; rl the row's launch position, `live`
    the rows that read something) that leave some row out and keep a live one at every launch:
    `<=` the largest of the launches' smallest values, `>=` `_ge_bounds`' bounds (the tightest
    the smallest of their largest). Yields (RowFilter, the rows it keeps)."""
    lo = np.full(n, np.iinfo(np.int64).max)
    hi = np.full(n, np.iinfo(np.int64).min)
    np.minimum.at(lo, rl[live], f[live])
    np.maximum.at(hi, rl[live], f[live])
    if (hi < lo).any():   # a launch whose rows read nothing
        return
    for op, t in (("le", int(lo.max())), *(("ge", t) for t in _ge_bounds(f[live], int(hi.min())))):
        rf = RowFilter(rv.index, rv.elem, rv.diff, op, t)
        keep = IX.filter_keeps(rf, f)
        if not keep.all():
            yield rf, keep


def length_filters(forms: RowForms, k: np.ndarray, lengths: np.ndarray):
    """Row filters for chunks of their own lengths (a one-dimensional `row_filter`): the first k[l]
    values of each launch read only where a buffer's value at their position allows (a prefill
    kernel's query rows, from each request's start offset for its query length, where the query
    is longer than a decode's one token). The values whose `lengths` are 0 read nothing, so
    bound no filter. Yields (RowFilter, the values it keeps) in filtered_table_candidates' order."""
    n = len(forms.sv)
    k = np.asarray(k, np.int64)
    rl = np.repeat(np.arange(n), k)
    ri = np.arange(len(rl), dtype=np.int64) - np.repeat(np.cumsum(k) - k, k)
    for fi in range(len(forms.buffers)):
        for rv, f in forms.at("lengths", rl, ri, fi):
            yield from _row_filters(rv, f, rl, lengths > 0, n)


def _ge_bounds(f: np.ndarray, tight: int) -> list[int]:
    """Bounds t for a filter `f(r) >= t`, the loosest first: the second smallest value f takes
    (only the rows at its smallest value left out: a prefill kernel's programs that return for
    decode queries, one token each, while the chunks it reads run from two tokens to thousands)
    where it is below `tight`, then `tight` (the smallest of the launches' largest values: the
    tightest that keeps a row at every launch)."""
    u = np.unique(f)
    return ([int(u[1])] if len(u) > 1 and u[1] < tight else []) + [tight]


class RowForms:
    """The row values (model_io.RowValue) a table's rows may take from the other traced buffers:
    per buffer, its value at each row, and the difference of its values at r+1 and r. `own`: the
    index's own buffer too, as (word, each launch's values row, value width), first."""

    def __init__(self, kd: KernelData, w, iw, sv, part, lid, own: tuple | None = None) -> None:
        self.kd, self.sv, self.part = kd, sv, part
        self.buffers = [(fw, frow, fe, row_bytes(kd, part[sv], frow) // fe)
                        for fw, frow, fe in ([own] if own is not None else []) + list(
                            count_buffers(kd, w, iw, sv, part, lid))]
        self._vals: dict = {}

    def of(self, shape: TableShape, fi: int):
        """(RowValue, its value per row of the table `shape`) of buffer `fi`: its values, then
        their differences, each where the buffer holds enough values at every launch."""
        return self.at(shape.rn, shape.rl, shape.ri, fi)

    def at(self, rn, rl: np.ndarray, ri: np.ndarray, fi: int):
        """`of` for rows (launch position rl, row ri; rn names them for the cache)."""
        fw, frow, fe, flen = self.buffers[fi]
        Rs = np.bincount(rl, minlength=len(self.sv)).astype(np.int64)
        for diff in (False, True):
            m = Rs + int(diff)
            if (m > flen).any():
                continue
            key = (fi, rn, diff)
            if key not in self._vals:
                vals = prefix_values(self.kd, self.part[self.sv], frow, m, fe)
                at = np.repeat(np.cumsum(m) - m, Rs) + ri
                self._vals[key] = vals[at + 1] - vals[at] if diff else vals[at]
            yield RowValue(fw.name, int(fe), diff), self._vals[key]

    def all(self, shape: TableShape, first: RowValue | None):
        """Every buffer's row values for `shape`, `first`'s first."""
        got = [x for fi in range(len(self.buffers)) for x in self.of(shape, fi)]
        return sorted(got, key=lambda x: x[0] != first)


def _subs(forms: RowForms, shape: TableShape, keep: np.ndarray, first: RowValue | None):
    """Row values a table's counts may be less (`count_sub`): at its kept rows, never more than
    the row's count value (a context's length is not negative), more than 0 at some, and less
    than it at some (a count of nothing names no table). Yields (RowValue, each row's count
    value less it, at least 0), `first` first."""
    c = shape.c
    for rv, f in forms.all(shape, first) if keep.any() else ():
        cs = c - f
        if (cs[keep] < 0).any() or not (f[keep] > 0).any() or not (cs[keep] > 0).any():
            continue
        yield rv, np.maximum(cs, 0)
