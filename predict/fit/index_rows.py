"""Fitting rows chosen by their position, each read up to a length another buffer holds: an
`indexed` region without an index word (predict/indexed.py, `region.index` None).

A block table has a row per sequence of the batch. The attention kernel reads row i, at
`i * row_stride` entries, only up to the i-th sequence's length over the block size; the kernel
that builds the table writes row i only up to the i-th request's entries, an indptr's
difference. The row is chosen by the program's position, not through an index value, so no index
word explains it, and a range over the rows holds every row whole (a row of 2048 entries for a
sequence of a few hundred tokens reads one page of two). Here chunk i is at
`base + start + stride * i`, `chunk` bytes times ceil(length_i / count_div), for i < count,
clipped to its row (`stride` bytes). Fitted from the same fault evidence as every class:

- the rows: an argument or grid dimension R, more than one at some launch (the number of
  sequences, the grid's first dimension), at most `MAX_ROWS` at a launch and
  `index_counts.MAX_LENGTH_VALUES` over the fitting launches (an argument of millions, a
  vector's length, is no batch of rows, and its rows' arrays would not fit in memory);
- the row's bytes: the width of the region's entries times an argument or grid dimension (the
  row stride in entries), the last row starting inside the allocation; the width is that of the
  region's own recorded values, or 4 and 8 bytes where they were not recorded (a table a kernel
  writes, which a recorder may not record before it is read), the rows' stride then pinning it;
- the lengths: another traced buffer's first R values (recorded at every fitting launch but the
  natural-mode ones, which do not take part), or the differences of its first R + 1
  (`index_counts.length_sets`), over each power-of-two divisor, each within its row at every
  fitting launch (a length that runs past the row is not the row's length);
- the start: solved from where the first row begins (`index_values.start_for`).

A candidate must end where the launches' last pages allow (its last row that reads anything),
verify (`index_values.verify_indexed`) and hold every fault page the records show. They are tried with
the smallest divisor first (1: the length read as it is, the simplest formula and the most a
length may read; faults inside a big page cannot tell divisors apart), a value before a
difference of two, and of those alike the length buffer holding the fewest values past the
lengths first (a row's length is a value a row; a buffer of far more, a token's page ids, holds
something else), and a later one replaces
the one standing only where it makes the faults `odds_per_term` times likelier: it puts fewer
pages around them (rows of two pages of which the kernel reads the first). Once the kernel's
regions are fitted, rows whose buffer a table region reads as its index take that table's
lengths (`rows_of_tables`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .. import formula as FM
from ..model_io import Region
from ..observe import RegionObs
from .data import KernelData
from .index_counts import (MAX_LENGTH_VALUES, buffer_count_candidates, launch_positions, length_sets, own_units,
                           position_names, pow2_divisors)
from .index_values import edge_stride, indexed_pieces, indexed_pages, start_for, verify_indexed
from .layout import fault_pages_loglik

MAX_VERIFIED = 48   # candidates verified per region at most (each passed the end check)
UNITS = (4, 8)      # entry widths tried where the region's own values were not recorded (int32, int64)
MAX_ROWS = 1 << 16   # rows one launch may read by position (a batch's sequences), at most


def fit_by_position(kd: KernelData, w, cat: RegionObs, sel: np.ndarray, nat: np.ndarray, fit: dict,
                    bounds) -> Region | None:
    """Rows by position for base word `w` at its observed launches `sel` (module doc), or None.
    Fills `fit` as fit_indexed does."""
    got = _with_values(kd, sel, nat)
    if got is None:
        return None
    part, lid, sv = got
    # the entries' width: the region's own values where they were recorded, else int32 or int64,
    # which the rows' stride in bytes then pins
    units = own_units(kd, w, sv, part, lid) or list(UNITS)
    g = kd.group[sv]
    n = len(sv)
    s_lo, s_hi, e_lo, e_hi = (b[~nat] for b in bounds)
    vals = {nm: kd.uniq[g, k] for k, nm in enumerate(kd.sel_names)}
    names = position_names(kd)
    cols = {nm: np.asarray(vals[nm], np.int64) * np.ones(n, np.int64) for nm in names}
    room = cat.alloc_eb[sv] - cat.base[sv]   # bytes from the base to its allocation's end
    starts = {}   # (entries a row, width) -> start_for's (row bytes, start, start bytes), or None
    cands = []
    for rn in names:
        R = cols[rn]
        if (R < 1).any() or not (R > 1).any() or (R > MAX_ROWS).any() or R.sum() > MAX_LENGTH_VALUES:
            continue
        lv = i = None
        for cname, ce, diff, c, spare in length_sets(kd, w, None, sv, part, lid, R):
            if lv is None:   # each row's launch and position (once a buffer holds R lengths)
                lv = np.repeat(np.arange(n), R)
                i = np.arange(len(lv), dtype=np.int64) - np.repeat(np.cumsum(R) - R, R)
            entries = [(d, -(-c // d)) for d in pow2_divisors(c)]   # each row's entries read, per divisor
            for sn in names:
                per_row = cols[sn]
                if sn == rn or (per_row < 1).any() or ((R - 1) * per_row * min(units) >= room).any():
                    continue
                # a row read past its end: not its length
                fits = [(d, k) for d, k in entries if not (k > per_row[lv]).any()]
                for u in units if fits else ():
                    if (sn, u) not in starts:
                        starts[sn, u] = start_for(kd, g, vals, FM.Formula(0, ((u, (sn,)),)), np.zeros(n, np.int64),
                                                   s_lo, s_hi)
                    found = starts[sn, u]
                    if found is None or ((R - 1) * found[0] >= room).any():
                        continue
                    sd, start, c0 = found
                    for d, k in fits:
                        ch = u * k
                        if _ends_within(kd, lv, c0[lv] + sd[lv] * i + ch, ch > 0, e_lo, e_hi, n):
                            cands.append((d, diff, spare, Region(
                                w.name, "indexed", start=start, stride=FM.Formula(0, ((u, (sn,)),)),
                                chunk=FM.Formula(u, ()), count=FM.Formula(0, ((1, (rn,)),)), index=None, elem=u,
                                count_index=cname, count_elem=ce, count_div=d, lengths=True, length_diff=diff)))
    # the simplest first (a length read as it is, then over 2, 4, ...: faults inside a big page
    # cannot tell them apart; a value before a difference of two), and of those alike the buffer
    # that holds the fewest values past the lengths (a row's length is one value a row: a buffer
    # of far more, page ids or tokens, holds something else); a later one stands only where the
    # faults are far likelier under it
    cands.sort(key=lambda x: x[:3])
    best = None
    for *_, r in cands[:MAX_VERIFIED]:
        taken = _take(kd, r, cat, sel, sv, part, lid, best)
        if taken is not None:
            best = taken
    return _taken(best, fit, n, len(sel))


def fit_position_range(kd: KernelData, w, cat: RegionObs, sel: np.ndarray, nat: np.ndarray, fit: dict,
                       bounds) -> Region | None:
    """The first rows of base word `w`'s buffer, as many as another traced buffer's value says
    (predict/indexed.py, `position_range`): `[base + start, + stride * count)`, the count the
    value at position 0, or at an argument or grid dimension, of another pointer's values row,
    or that over a power of two, rounded up (`index_counts.buffer_count_candidates`: a query or
    output buffer's rows up to the batch's token count, its query start offsets' last entry).
    The stride, a constant (rows of the same bytes at every launch), is solved from where the
    last row ends, the start from where the first begins; a candidate must verify and hold every fault page, and of those
    that do, one tried later replaces the one standing only where the faults are
    `odds_per_term` times likelier under it. Or None. Fills `fit` as fit_indexed does."""
    got = _with_values(kd, sel, nat)
    if got is None:
        return None
    part, lid, sv = got
    g = kd.group[sv]
    n = len(sv)
    s_lo, s_hi, e_lo, e_hi = (b[~nat] for b in bounds)
    vals = {nm: kd.uniq[g, k] for k, nm in enumerate(kd.sel_names)}
    room = cat.alloc_eb[sv] - cat.base[sv]
    zero = np.zeros(n, np.int64)
    best, tried = None, 0
    strides: dict[bytes, FM.Formula | None] = {}   # counts alike (other buffers, positions) share a solve
    for c in buffer_count_candidates(kd, w, None, g, sv, part, lid, room):
        if tried >= MAX_VERIFIED:
            break
        if (c.k < 1).all():
            continue
        key = c.k.tobytes()
        if key not in strides:
            # a constant row (its bytes the same at every launch: a model's hidden size), the
            # cheap solve this rival of every range of a kernel with values can afford
            strides[key] = edge_stride(kd, g, zero, c.k, (e_lo, e_hi), "lo", pure=True, max_terms=1)
        sd = strides[key]
        found = None if sd is None else start_for(kd, g, vals, sd, zero, s_lo, s_hi)
        if found is None:
            continue
        sdv, start, c0 = found
        if not _ends_within(kd, np.arange(n), c0 + sdv * c.k, c.k > 0, e_lo, e_hi, n):
            continue
        tried += 1
        r = Region(w.name, "indexed", start=start, stride=sd, chunk=sd, count=c.count, index=None, elem=4,
                   count_index=c.cidx, count_elem=c.celem, count_div=c.cdiv, count_valid=c.valid)
        taken = _take(kd, r, cat, sel, sv, part, lid, best)
        if taken is not None:
            best = taken
    return _taken(best, fit, n, len(sel))


def _with_values(kd: KernelData, sel: np.ndarray, nat: np.ndarray):
    """(each launch's trace, its id there, the launches of `sel` that take part: not natural
    mode), or None where no trace holds values or no launch takes part."""
    if not any(o.trace.values is not None for o, _, _, _ in kd.parts):
        return None
    part, lid = launch_positions(kd)
    sv = sel[~nat]
    return (part, lid, sv) if len(sv) else None


def _taken(best, fit: dict, n: int, n_sel: int) -> Region | None:
    """The region `_take` kept last (None: none), its statistics in `fit` (`n` launches with values
    of `n_sel` observed), as fit_indexed fills them."""
    if best is None:
        return None
    r, okv, _ = best
    fit["exact"] = round(float(okv.mean()), 6)
    fit["unexplained"] = int((~okv).sum())
    fit["values"] = {"launches": n, "without_values": int(n_sel - n), "elem": r.elem, "by_position": True}
    return r


def _ends_within(kd: KernelData, lv, ends, reads, e_lo, e_hi, n: int) -> bool:
    """Does each launch's last row that reads anything end where its last pages allow, but for the
    launches lost records may leave unexplained?"""
    last = np.zeros(n, np.int64)
    np.maximum.at(last, lv[reads], ends[reads])
    return int(((last < e_lo) | (last > e_hi)).sum()) <= kd.allowed(n)


def _take(kd: KernelData, r: Region, cat, sel, sv, part, lid, best):
    """(r, its verification, its faults' log-likelihood) where r verifies, holds every fault page
    and, against `best` (the candidate standing, tried before it), makes the faults
    `odds_per_term` times likelier; else None."""
    cptr = np.concatenate(next(v for cw, v in kd.bases if cw.name == r.count_index)).astype(np.int64)
    pieces = indexed_pieces(kd, r, cat, sv, part, lid, cptr)
    okv = verify_indexed(kd, r, cat, sel, sv, part, lid, cptr, pieces)
    if int((~okv).sum()) > kd.allowed(len(sv)):
        return None
    ll, held, _ = fault_pages_loglik(kd, r, cat, sv, pages=lambda s: indexed_pages(kd, r, cat, s)[0])
    if not held:
        return None
    if best is not None and ll < best[2] + np.log(kd.params.odds_per_term):
        return None
    return r, okv, ll


def rows_of_tables(kd: KernelData, regions: list, evidence: dict) -> None:
    """Rows of a buffer a table region of the same kernel reads as its index (the block table
    whose values choose the K/V blocks an attention reads): that table's template says how far
    the kernel reads each row, pinned by the faults of the blocks its values choose, where the
    rows' own records, inside a page of each row, cannot tell one divisor from another. Rows by
    position, and a strided region of the same rows (a chunk a row, records exact to the page
    showing one page a row: `fit --from truth`), take its count buffer and divisor where they
    have the same rows (count, row stride in bytes, start at the base) and the result verifies
    and holds every fault page on the rows' own evidence (`evidence`: base word -> its
    RegionFit). Where the table reads only the rows another buffer allows (`row_filter`: a
    prefill kernel's programs that return for decode queries), the rows take its filter first,
    and where each row's count is less another buffer's value (`count_sub`: a prefill chunk's
    context), that too, before either alone; each kept on the same test. Changes `regions` in
    place."""
    part, lid = launch_positions(kd)
    for r in regions:
        by_pos = r.cls == "indexed" and r.index is None and r.lengths
        if not (by_pos or r.cls == "strided") or r.start.n_terms or r.start.const:
            continue
        rf = evidence.get(r.base)
        for t in regions:
            if t.cls != "indexed" or t.index != r.base or t.row_stride is None or t.count_index is None \
                    or t.count != r.count or (by_pos and t.elem != r.elem) or t.row_stride.const \
                    or t.row_stride.n_terms != 1:
                continue
            stride = FM.Formula(0, ((t.elem * t.row_stride.terms[0][0], t.row_stride.terms[0][1]),))
            same = dict(count_index=t.count_index, count_elem=t.count_elem, count_div=t.count_div, length_diff=False)
            if rf is None:
                break
            if by_pos and all(getattr(r, k) == v for k, v in same.items()):
                cands = []   # the rows as they are read
            elif not _same_rows(kd, r.stride, stride, rf.sel):
                break
            else:
                cands = [Region(r.base, "indexed", start=r.start, stride=stride, chunk=FM.Formula(t.elem, ()),
                                count=r.count, index=None, elem=t.elem, lengths=True, **same)]
            if t.row_filter is not None and r.row_filter is None:
                # the rows the table's filter leaves out (their values choose no block) are not read
                cands.insert(0, dataclasses.replace(cands[0] if cands else r, row_filter=t.row_filter, fit={}))
            if t.count_sub is not None and r.count_sub is None:
                # each row read only as far as the table's: its count less the same row value (a
                # prefill chunk's context, its sequence's length less its query's)
                cands.insert(0, dataclasses.replace(cands[0] if cands else r, count_sub=t.count_sub, fit={}))
            for cand in cands:
                if _take(kd, cand, rf.cat, rf.sel, rf.sel[~rf.nat], part, lid, None) is not None:
                    fit = {**r.fit, "lengths_from": t.base}
                    for f in dataclasses.fields(Region):
                        setattr(r, f.name, getattr(cand, f.name))
                    r.fit = fit
                    break
            break


def _same_rows(kd: KernelData, a: FM.Formula, b: FM.Formula, sel: np.ndarray) -> bool:
    """Do strides `a` and `b` give the same bytes at every launch `sel` (positions in kd)?"""
    g = kd.group[sel]
    vals = {nm: kd.uniq[g, k] for k, nm in enumerate(kd.sel_names)}
    n = len(sel)
    return bool(np.array_equal(np.asarray(a.evaluate(vals), np.int64) * np.ones(n, np.int64),
                               np.asarray(b.evaluate(vals), np.int64) * np.ones(n, np.int64)))
