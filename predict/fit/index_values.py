"""Fitting the `indexed` class: a region whose chunks lie where index values put them.

A region the other classes cannot explain (docs/template-model.md: an expert FFN's weights, an
embedding's rows, a CSR gather of x, paged KV blocks) may follow the integers another pointer
parameter points to, when the trace records them (its `values` table): chunk i is `chunk` bytes
at `base + start + stride * v[i]`, for i < count. Fitted from the same fault evidence as every
class (never the truth table):

- the index word: another base word of the kernel whose buffer the values table holds at most
  of the launches (a majority, as pointer words are chosen: `FitParams.pointer_share`), its values
  read as int32 or int64 (int64 first where every odd 4-byte word is a sign extension);
- the count: the number of values each launch's row holds, as a formula of the arguments (rows
  recorded exactly, as the workload models and `collect --interpret` record them), else each
  argument or grid dimension that never exceeds the row (rows clipped at the trace's limit or the
  allocation's end; a prefix of a persistent buffer), else a value read from another traced
  buffer at position 0 or at an argument or grid dimension (`v(p2)[grid_x]`: an indptr's entry
  at the batch size ends the range of indices the batch reads, so an index chain indptr ->
  indices -> rows), never exceeding the row, or that value divided by a power of two and rounded
  up (`ceil(v(p11)[0] / 16)`: a padded token count over the block size is the number of blocks,
  each reading one expert id), the smallest divisor that keeps every count within its row first
  (`_buffer_count_candidates`), else a two-dimensional table: R rows of rs entries (each an
  argument or grid dimension), row r read up to another buffer's value at position r over a
  divisor (a block table read to each sequence's length over the block size; entries past it
  are stale: `_table_candidates`);
  negative values are sentinels that select nothing (v0 and v1 leave them out);
- start and stride: the smallest value a launch reads, v0, sets where its first chunk starts,
  and the largest, v1, where its last one ends (strides are positive). With v0 and v1 as two more
  features, the robust solver (`solve.solve_pair`) finds the simplest formulas for the first
  chunk's start and the last chunk's end within the same byte bounds a range has
  (`region.range_bounds`): `start + stride*v0` and `start + stride*v1 + chunk`. Both must multiply
  the value by the same stride; one more solve, for whole chunks, finds the stride from where the
  last one ends, `start + stride*(v1+1)` (where the records leave the stride loose, the free solve
  may take stride 1 and a chunk as wide as the values' spread); every stride is tried with whole
  chunks (chunk = stride) before any with part chunks;
- verification: every observed launch's chunks, rounded out to big pages, must cover what the
  records show touched and stay inside what they may have touched (`strided.verify_pages`),
  but for the launches lost records may leave unexplained (`KernelData.allowed`).

Launches whose values were not recorded do not take part (the predictor gives them the fallback).
Natural-mode launches do not either: only first touches fault there, so a launch's faults do not
show the chunks its values chose.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from pagecast import footprints as FP
from pagecast import values as V

from .. import formula as FM
from .. import indexed as IX
from ..features import factorize_rows
from ..model_io import Region
from ..observe import RegionObs
from .data import KernelData
from .layout import fault_pages_loglik
from .solve import solve_pair
from .strided import verify_pages


V0, V1 = "v0", "v1"   # the smallest and largest index value a launch reads, as two more features


class _WithValues:
    """A KernelData's launches `sel` with v0 and v1 added to their features (for the solver).
    `force`: only products with v0 or v1 in them (an edge that must follow a value); `pure`: v0
    and v1 alone."""

    def __init__(self, kd: KernelData, g: np.ndarray, v0: np.ndarray, v1: np.ndarray, force: bool = False,
                 pure: bool = False) -> None:
        self.kd, self.params, self.loss, self.force, self.pure = kd, kd.params, kd.loss, force, pure
        self.uniq, self.group = factorize_rows(np.column_stack([kd.uniq[g], v0, v1]))
        self.U = len(self.uniq)
        self.sel_names = list(kd.sel_names) + [V0, V1]
        self.sel_varying = np.r_[kd.sel_varying, True, True]

    def allowed(self, n: int, edges=2) -> int:
        return self.kd.allowed(n, edges)

    def mono(self, groups: np.ndarray) -> FM.Monomials:
        u = self.uniq[groups]
        if self.pure:   # v0 and v1 alone (a constant stride times the value)
            return FM.Monomials([(V0,), (V1,)], np.ascontiguousarray(u[:, -2:]), np.ones(2, np.int64))
        on = np.array([len(np.unique(u[:, k])) > 1 for k in range(u.shape[1])], bool) if len(u) \
            else np.zeros(u.shape[1], bool)
        m = FM.monomials(self.sel_names, u, on | self.sel_varying)
        if self.force:
            keep = [i for i, nm in enumerate(m.names) if V0 in nm or V1 in nm]
            m = FM.Monomials([m.names[i] for i in keep], m.values[:, keep], m.degree[keep])
        return m


def _positions(kd: KernelData):
    """For each launch of kd (concatenated over its traces): its trace part and launch id."""
    part = np.concatenate([np.full(len(idx), ti) for ti, (_, idx, _, _) in enumerate(kd.parts)])
    lid = np.concatenate([idx for _, idx, _, _ in kd.parts])
    return part, lid


def _rows(kd: KernelData, part: np.ndarray, lid: np.ndarray, iptr: np.ndarray) -> np.ndarray:
    """The values row each launch read from `iptr` (-1: none recorded)."""
    out = np.full(len(lid), -1, np.int64)
    for ti, (o, _, _, _) in enumerate(kd.parts):
        m = part == ti
        if m.any() and o.trace.values is not None:
            out[m] = V.image(o.trace).find(lid[m], iptr[m])
    return out


def _elems(kd: KernelData, part, rows) -> list[int]:
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


def _extremes(kd: KernelData, part, rows, k, elem):
    """(v0, v1) over the first k values of each launch's row (rows shared by launches read once),
    negative values left out: they are sentinels that select nothing (predict/indexed.py)."""
    key = np.stack([part, rows, k], axis=1)
    uk, inv = np.unique(key, axis=0, return_inverse=True)
    lo = np.zeros(len(uk), np.int64)
    hi = np.zeros(len(uk), np.int64)
    ok = np.zeros(len(uk), bool)
    for j, (ti, r, kk) in enumerate(uk):
        v = V.image(kd.parts[int(ti)][0].trace).ints(int(r), int(kk), elem)
        v = v[v >= 0]
        if len(v):
            lo[j], hi[j], ok[j] = v.min(), v.max(), True
    inv = inv.reshape(-1)
    return lo[inv], hi[inv], ok[inv]


def _split(f: FM.Formula):
    """(the term that multiplies an index value, without it, as a Formula; the rest) or None."""
    hit = [i for i, (c, fac) in enumerate(f.terms) if V0 in fac or V1 in fac]
    if len(hit) != 1 or sum(n in (V0, V1) for n in f.terms[hit[0]][1]) != 1:
        return None
    c, fac = f.terms[hit[0]]
    rest_fac = tuple(n for n in fac if n not in (V0, V1))
    stride = FM.Formula(int(c), ()) if not rest_fac else FM.Formula(0, ((int(c), rest_fac),))
    rest = FM.Formula(f.const, tuple(t for i, t in enumerate(f.terms) if i != hit[0]))
    return stride, rest


def fit_indexed(kd: KernelData, w, cat: RegionObs, sel: np.ndarray, nat: np.ndarray, fit: dict, bounds,
                max_terms: int = 3) -> Region | None:
    """An indexed region for base word `w` at its observed launches `sel` (positions in kd; `nat`:
    which are natural mode; `bounds`: region.range_bounds at sel), or None (module doc). Fills `fit`.
    `max_terms`: terms the edges' formulas (the value's term among them) may have."""
    if not any(o.trace.values is not None for o, _, _, _ in kd.parts):
        return None
    part, lid = _positions(kd)
    s_lo, s_hi, e_lo, e_hi = bounds
    words = []
    for iw, ivals in kd.bases:
        if iw.name == w.name:
            continue
        iptr = np.concatenate(ivals)
        rows = _rows(kd, part, lid, iptr)
        have = rows[sel] >= 0
        if have.sum() < kd.params.pointer_share * len(sel):
            continue
        use = have & ~nat
        if not use.any():
            continue
        words.append((iw, iptr, rows, use))
    # whole chunks (rows, experts, blocks) at every index word and count before part chunks at
    # any: a part chunk as wide as a small table verifies with a wrong index word or count too
    # (an expert table of a few big pages, most of them touched by most launches)
    seen: dict = {}
    for whole in (True, False):
        for iw, iptr, rows, use in words:
            sv = sel[use]
            for elem in _elems(kd, part[sv], rows[sv]):
                r = _fit_with(kd, w, iw, elem, cat, sel, sv, use, part, lid, rows, iptr,
                              (s_lo[use], s_hi[use], e_lo[use], e_hi[use]), fit, whole, seen, max_terms)
                if r is not None:
                    return r
    return None


def _count_candidates(kd: KernelData, g: np.ndarray, row_len: np.ndarray):
    """Count formulas to try: the rows' lengths as a formula of the arguments (rows recorded
    exactly), then each argument or grid dimension never longer than the row (rows clipped, or
    a prefix of a persistent buffer read: one program per token reads `grid_x` ids of a buffer
    allocated once at the largest batch, whose later entries are stale or -1 padding)."""
    res = solve_pair(kd, g, [(row_len, row_len)], max_terms=1)
    if res is not None:
        yield res[0][0]
    for name in _position_names(kd):
        v = kd.uniq[g, kd.sel_names.index(name)]
        if (v >= 1).all() and (v <= row_len).all() and not (v == row_len).all():
            yield FM.Formula(0, ((1, (name,)),))


def _position_names(kd: KernelData) -> list[str]:
    return [n for n in kd.sel_names if not n.startswith("block_")]


MAX_COUNT_DIV = 1 << 12   # the largest divisor tried for a count read from another buffer
DIVS_TRIED = 3            # divisors tried per value (powers of two from the smallest that fits)


def _divisors(c: np.ndarray, row_len: np.ndarray):
    """Divisors d for which ceil(c / d) is a count of at least one value and at most the row at
    every launch, not the whole row everywhere: 1, then the smallest power of two that keeps
    every count within its row and the next ones, DIVS_TRIED in all (a count of blocks: a tile's
    size is a power of two, as `tl.arange` needs). Larger divisors read fewer values; verification
    keeps the first whose chunks cover the faults and stay inside what may have been touched, so
    the stale entries past a launch's blocks reject too small a divisor, and the faults of its
    last blocks too large a one. Yields (d, counts)."""
    if (c < 1).any():
        return
    tried, d = 0, 1
    while d <= MAX_COUNT_DIV and tried < DIVS_TRIED:
        k = -(-c // d)
        if (k <= row_len).all() and not (k == row_len).all():
            yield d, k
            tried += 1
        d *= 2


def _count_buffers(kd: KernelData, w, iw, sv, part, lid):
    """The other pointers whose values rows were recorded at every launch `sv`, as (word, each
    launch's values row, value width), each width `_elems` finds."""
    for cw, cvals in kd.bases:
        if cw.name in (w.name, iw.name):
            continue
        crow = _rows(kd, part[sv], lid[sv], np.concatenate(cvals)[sv])
        if (crow < 0).any():
            continue
        for ce in _elems(kd, part[sv], crow):
            yield cw, crow, ce


def _buffer_count_candidates(kd: KernelData, w, iw, g, sv, part, lid, row_len):
    """Counts read from another traced buffer (module doc): the value at position 0, or at an
    argument or grid dimension, of each other pointer's values row (an indptr's entry at the
    batch size: the end of the range it selects), never longer than the index row, or that
    value over a power of two, rounded up (a padded token count over the block size). Yields
    _Count (the count formula is the position read)."""
    positions = [FM.Formula(0, ())] + [FM.Formula(0, ((1, (n,)),)) for n in _position_names(kd)]
    for cw, crow, ce in _count_buffers(kd, w, iw, sv, part, lid):
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
                yield _Count(pos, cw.name, ce, d, k)


@dataclasses.dataclass
class _Count:
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

    def extremes(self):
        """(v0, v1, ok) where the values are not a prefix (None: a prefix of k values)."""
        return self.ext

    def fields(self) -> dict:
        return dict(count=self.count, count_index=self.cidx, count_elem=self.celem, count_div=self.cdiv,
                    row_stride=self.rs)


MAX_TABLES = 48   # table candidates tried per index word at most (each may need a solve)


def _table_candidates(kd: KernelData, w, iw, elem: int, g, sv, part, lid, irows, row_len):
    """Two-dimensional tables (predict/indexed.py): the index row read as `R` rows of `rs`
    entries, row r up to ceil(c[r] / d) entries, c another traced buffer's values (a block table
    read up to each sequence's length over the block size; stale ids past it). R and rs are each
    an argument or grid dimension (the number of sequences, the table's row stride); R is more
    than one at some launch, reads no more values than the count buffer holds, and the last row
    starts inside the index row; d is 1 or a power of two that keeps every row's count within
    its row (`_divisors`' rule, per row). Yields _Count, its values' extremes (`ext`) made when
    a solve needs them (`_TableCount`)."""
    names = _position_names(kd)
    n = len(sv)
    cols = {nm: kd.uniq[g, kd.sel_names.index(nm)] * np.ones(n, np.int64) for nm in names}
    made = 0
    for cw, crow, ce in _count_buffers(kd, w, iw, sv, part, lid):
        clen = _row_bytes(kd, part[sv], crow) // ce
        for rn in names:
            R = cols[rn]
            if (R < 1).any() or (R > clen).any() or not (R > 1).any():
                continue
            sns = [sn for sn in names if sn != rn and (cols[sn] >= 1).all()
                   and ((R - 1) * cols[sn] < row_len).all()]
            if not sns:
                continue
            c = np.maximum(_prefix_values(kd, part[sv], crow, R, ce), 0)
            rl = np.repeat(np.arange(n), R)
            ri = np.arange(len(rl), dtype=np.int64) - np.repeat(np.cumsum(R) - R, R)
            for sn in sns:
                rs = cols[sn][rl]
                for d in _row_divisors(c, rs):
                    kr = -(-c // d)
                    k = np.bincount(rl, weights=kr, minlength=n).astype(np.int64)
                    if (k < 1).any():
                        continue
                    yield _TableCount(FM.Formula(0, ((1, (rn,)),)), cw.name, ce, d, k,
                                      FM.Formula(0, ((1, (sn,)),)), rows=(kd, part[sv], irows, rl, ri * rs, kr, elem))
                    made += 1
                    if made >= MAX_TABLES:
                        return


@dataclasses.dataclass
class _TableCount(_Count):
    """A table's count (_table_candidates): `rows` what its values' extremes are made from."""

    rows: tuple | None = None

    def extremes(self):
        if self.ext is None:
            self.ext = _table_extremes(*self.rows, n=len(self.k))
        return self.ext


def _row_bytes(kd: KernelData, part, rows) -> np.ndarray:
    """Each launch's values row's length in bytes (rows >= 0)."""
    out = np.zeros(len(rows), np.int64)
    for ti in np.unique(part):
        m = part == ti
        out[m] = V.image(kd.parts[int(ti)][0].trace).nbytes[rows[m]]
    return out


def _prefix_values(kd: KernelData, part, crow, n, ce: int) -> np.ndarray:
    """The first n[l] `ce`-byte values of each launch's row, concatenated (rows shared by
    launches read once; rows holding fewer than n[l] values are not passed here)."""
    key = np.stack([part, crow, n], axis=1)
    uk, inv = np.unique(key, axis=0, return_inverse=True)
    vals = [V.image(kd.parts[int(ti)][0].trace).ints(int(r), int(m), ce) for ti, r, m in uk]
    lens = np.array([len(v) for v in vals], np.int64)
    flat = np.concatenate(vals) if vals else np.zeros(0, np.int64)
    return flat[FP._ranges((np.cumsum(lens) - lens)[inv.reshape(-1)], np.asarray(n, np.int64))]


def _row_divisors(c: np.ndarray, rs: np.ndarray):
    """Divisors for per-row counts: the smallest power of two (1 included) that keeps every
    row's count ceil(c / d) within its row of `rs` entries, and the next ones (DIVS_TRIED in
    all)."""
    tried, d = 0, 1
    while d <= MAX_COUNT_DIV and tried < DIVS_TRIED:
        if (-(-c // d) <= rs).all():
            yield d
            tried += 1
        d *= 2


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


def _fit_with(kd, w, iw, elem, cat, sel, sv, use, part, lid, rows, iptr, bounds, fit, whole: bool,
              seen: dict, max_terms: int = 3) -> Region | None:
    """The region with index word `iw`, values of `elem` bytes, whole chunks or (not `whole`)
    part ones, that verifies with the fewest values read: after the first count that verifies,
    only counts that read no more values at any launch and fewer at some are tried (a whole
    persistent row, stale entries and all, verifies where most of a small table is touched
    anyway; the count the kernel reads is tighter). `seen` keeps each count's values and
    strides for the other pass."""
    key = (iw.name, elem)
    g = kd.group[sv]
    vals = {n: kd.uniq[g, k] for k, n in enumerate(kd.sel_names)}
    if key not in seen:
        row_len = np.array([int(V.image(kd.parts[ti][0].trace).nbytes[r]) // elem
                            for ti, r in zip(part[sv], rows[sv])], np.int64)
        cands = (_Count(c, None, 4, 1, np.asarray(c.evaluate(vals), np.int64) * np.ones(len(sv), np.int64))
                 for c in _count_candidates(kd, g, row_len))
        seen[key] = ([], itertools.chain(cands, _buffer_count_candidates(kd, w, iw, g, sv, part, lid, row_len),
                                         _table_candidates(kd, w, iw, elem, g, sv, part, lid, rows[sv], row_len)),
                     row_len, {})
    kept, more, row_len, solved = seen[key]
    best = None

    def candidates():
        yield from kept
        for c in more:
            if c.rs is None:
                c.k = np.minimum(c.k, row_len)
            if (c.k < 1).any():
                continue
            kept.append(c)
            yield c
    for c in candidates():
        k = c.k
        if best is not None:
            # a tighter count reads fewer of the same values: the verified region's start, stride
            # and chunk with this count, verified again (no new solve)
            if (k > best[4]).any() or (k == best[4]).all():
                continue
            r = dataclasses.replace(best[0], **c.fields(), fit={})
            okv = _verify(kd, r, cat, sel, sv, part, lid, iptr)
            unexplained = int((~okv).sum())
            if unexplained <= kd.allowed(len(sv)) and _holds_faults_of(kd, r, best[0], cat, sv):
                best = (r, okv, unexplained, None, k)
            continue
        if c.strides is None:
            # a table's stride is a constant (the value's own term): its candidates are many, and
            # the constant solve is what keeps trying them cheap
            c.strides = _strides(kd, g, part[sv], rows[sv], k, elem, bounds, max_terms if c.rs is None else 1,
                                 c.extremes(), solved)
        if not c.strides:
            continue
        v0, v1, strides = c.strides
        for r in (r for stride in strides
                  for r in _regions_for(kd, w, iw, elem, g, vals, stride, c.count, v0, v1, bounds, whole)):
            for f, x in c.fields().items():
                setattr(r, f, x)
            okv = _verify(kd, r, cat, sel, sv, part, lid, iptr)
            unexplained = int((~okv).sum())
            if unexplained <= kd.allowed(len(sv)):
                best = (r, okv, unexplained, None, k)
                break
    if best is None:
        return None
    if best[0].row_stride is not None and best[0].count_div > 1:
        # a row's last block read up to its count (a sequence's last KV block, filled to its
        # length): kept where it verifies and holds every fault page the whole block holds
        r = dataclasses.replace(best[0], part_last=True, fit={})
        okv = _verify(kd, r, cat, sel, sv, part, lid, iptr)
        unexplained = int((~okv).sum())
        if unexplained <= kd.allowed(len(sv)) and _holds_faults_of(kd, r, best[0], cat, sv):
            best = (r, okv, unexplained, None, best[4])
    r, okv, unexplained, _, _ = best
    fit["exact"] = round(float(okv.mean()), 6)
    fit["unexplained"] = unexplained
    fit["values"] = {"launches": int(len(sv)), "without_values": int(len(sel) - use.sum()), "elem": elem}
    return r


def _holds_faults_of(kd: KernelData, tight: Region, loose: Region, cat: RegionObs, sv: np.ndarray) -> bool:
    """Does the `tight` count's region hold every fault page the `loose` one holds, page by page?
    Verification rounds chunks out to big pages, so where the values a launch reads reach every
    big page of a small buffer (a gather of a vector of a few big pages, its entries spread over
    all of them) a count that reads a fraction of them verifies as well as the count the kernel
    reads. A fault record's page was certainly touched, and lost records only hide pages: a
    fault page the tighter count leaves out is evidence against it that no loss explains."""
    held_t = fault_pages_loglik(kd, tight, cat, sv, pages=lambda s: indexed_pages(kd, tight, cat, s)[0])[1]
    if held_t:
        return True
    return not fault_pages_loglik(kd, loose, cat, sv, pages=lambda s: indexed_pages(kd, loose, cat, s)[0])[1]


def _strides(kd, g, part, rows, k, elem, bounds, max_terms: int = 3, ext=None, solved: dict | None = None):
    """(v0, v1, the strides to try) for a count reading `k` values per launch (or whose values'
    extremes are `ext`), or () where a launch's values are all sentinels. `solved` keeps the
    strides per (v0, v1): counts that read other values with the same extremes share them."""
    v0, v1, ok = _extremes(kd, part, rows, k, elem) if ext is None else ext
    if not ok.all():
        return ()
    key = (v0.tobytes(), v1.tobytes(), max_terms)
    if solved is not None and key in solved:
        return v0, v1, solved[key]
    strides = _solve_strides(kd, g, v0, v1, bounds, max_terms)
    if solved is not None:
        solved[key] = strides
    return v0, v1, strides


def _solve_strides(kd, g, v0, v1, bounds, max_terms: int = 3) -> list:
    """The strides to try for values whose extremes per launch are v0 and v1 (_strides)."""
    s_lo, s_hi, e_lo, e_hi = bounds
    # the stride from whichever edge follows a value: a start within the first big page at every
    # launch is a constant to the solver (the first chunk's offset shows in the end), and where
    # neither edge needs one (the smallest and largest value the same at every launch: Zipf-like
    # token ids reach the vocabulary's ends), edges made to follow a value still bound it
    strides = []
    # max_terms 1: a constant stride only (the value's own term; a range's rival, region._indexed_likelier)
    pure = max_terms == 1
    for force in (False, True)[pure:]:
        ex = _WithValues(kd, g, v0, v1, force, pure)
        res = solve_pair(ex, ex.group, [(s_lo, s_hi), (e_lo, e_hi)], hard={0: "hi", 1: "lo"}, max_terms=max_terms,
                          min_terms={0: 1, 1: 1} if force else None)
        for f in (res[0] if res is not None else ()):
            sp_ = _split(f)
            if sp_ is not None and sp_[0] not in strides:
                strides.append(sp_[0])
    # whole chunks: the last one ends one stride past the largest value (`start + stride*(v1+1)`).
    # Where the records leave the stride loose (a table of a few big pages read a row at a
    # time), the free solve above may take stride 1 and a chunk as wide as the values' spread,
    # which verification accepts; this solve pins the stride by where the last row ends
    ex = _WithValues(kd, g, v0, v1 + 1, True, pure)
    res = solve_pair(ex, ex.group, [(e_lo, e_hi)], hard={0: "lo"}, min_terms={0: 1}, max_terms=max_terms)
    sp_ = _split(res[0][0]) if res is not None else None
    if sp_ is not None and sp_[0] not in strides:
        strides.append(sp_[0])
    return strides


def _regions_for(kd, w, iw, elem, g, vals, stride: FM.Formula, count: FM.Formula, v0, v1, bounds, whole: bool):
    """The region with this stride to verify: its start from where the first chunks begin, its
    chunk (`whole`) the stride itself where the last ones' ends allow it (rows, blocks, experts
    are whole), or (not `whole`) the simplest chunk formula that ends where they end (a part of
    each row: a column range)."""
    s_lo, s_hi, e_lo, e_hi = bounds
    n = len(g)
    sd = np.asarray(stride.evaluate(vals), np.int64) * np.ones(n, np.int64)
    if (sd <= 0).any():
        return
    res = solve_pair(kd, g, [(s_lo - sd * v0, s_hi - sd * v0)], hard={0: "hi"})
    if res is None:
        return
    start = res[0][0]
    c = np.asarray(start.evaluate(vals), np.int64) * np.ones(n, np.int64)
    ch_lo, ch_hi = e_lo - sd * v1 - c, e_hi - sd * v1 - c
    chunks = []
    if whole:
        if int(((sd < ch_lo) | (sd > ch_hi)).sum()) <= kd.allowed(n):
            chunks.append(stride)
    else:
        res = solve_pair(kd, g, [(ch_lo, ch_hi)], hard={0: "lo"})
        if res is not None and res[0][0] != stride and \
                (np.asarray(res[0][0].evaluate(vals), np.int64) * np.ones(n, np.int64) > 0).all():
            chunks.append(res[0][0])
    for chunk in chunks:
        yield Region(w.name, "indexed", start=start, stride=stride, chunk=chunk, count=count, index=iw.name,
                     elem=elem)


def _verify(kd, region: Region, cat, sel, sv, part, lid, iptr) -> np.ndarray:
    """Per launch of `sv`: do its predicted chunks cover what its records show (strided.verify_pages)?"""
    pos = np.searchsorted(sel, sv)            # sv is a subset of sel, both ascending
    rep, sp, ep = _pieces(kd, region, cat, sv, part, lid, iptr)
    ok = verify_pages(kd, cat, sel, kd.bigp, pos[rep], sp, ep)
    return ok[pos]


def _pieces(kd, region: Region, cat, sv, part, lid, iptr):
    """The pages an indexed region predicts at launches `sv` (positions in kd): (which launch,
    as a position in sv; start page; end page), merged per launch."""
    ps = kd.ps
    cptr = None if region.count_index is None else \
        np.concatenate(next(v for cw, v in kd.bases if cw.name == region.count_index)).astype(np.int64)
    reps, sps, eps = [], [], []
    for ti, (o, _, _, _) in enumerate(kd.parts):
        m = np.flatnonzero(part[sv] == ti)
        if not len(m):
            continue
        p = sv[m]
        g = kd.group[p]
        vals = {n: kd.uniq[g, k] for k, n in enumerate(kd.sel_names)}
        res = IX.batch_pieces(region, vals, cat.base[p], iptr[p], lid[p], V.image(o.trace), ps,
                              cat.alloc_s[p], cat.alloc_e[p], None if cptr is None else cptr[p])
        reps.append(m[res["l"]]), sps.append(res["s"]), eps.append(res["e"])
    z = np.zeros(0, np.int64)
    return (np.concatenate(reps) if reps else z, np.concatenate(sps) if sps else z,
            np.concatenate(eps) if eps else z)


def indexed_pages(kd: KernelData, region: Region, cat: RegionObs, sel: np.ndarray):
    """An indexed region's pages at launches `sel` (positions in kd) and which of them have
    their values recorded: ((launch as a position in sel, start page, end page), has values)."""
    part, lid = _positions(kd)
    iptr = np.concatenate(next(v for iw, v in kd.bases if iw.name == region.index)).astype(np.int64)
    rep, sp, ep = _pieces(kd, region, cat, sel, part, lid, iptr)
    have = _rows(kd, part[sel], lid[sel], iptr[sel]) >= 0
    if region.count_index is not None:
        cptr = np.concatenate(next(v for cw, v in kd.bases if cw.name == region.count_index)).astype(np.int64)
        have &= _rows(kd, part[sel], lid[sel], cptr[sel]) >= 0
    return (rep, sp, ep), have
