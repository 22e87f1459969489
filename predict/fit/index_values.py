"""Fitting the `indexed` class: a region whose chunks lie where index values put them.

A region the other classes cannot explain (docs/template-model.md: an expert FFN's weights, an
embedding's rows, a CSR gather of x, paged KV blocks) may follow the integers another pointer
parameter points to, when the trace records them (its `values` table): chunk i is `chunk` bytes
at `base + start + stride * v[i]`, for i < count. Fitted from the same fault evidence as every
class (never the truth table):

- the index word: another base word of the kernel whose buffer the values table holds at most
  of the launches (a majority, as pointer words are chosen: `FitParams.pointer_share`), its values
  read as int32 or int64 (int64 first where every odd 4-byte word is a sign extension);
- the count (`index_counts`): the number of values each launch's row holds, as a formula of the
  arguments (rows recorded exactly, as the workload models and `collect --interpret` record
  them), else an argument or grid dimension that never exceeds the row (rows clipped at the
  trace's limit or the allocation's end; a prefix of a persistent buffer), else another traced
  buffer's value at position 0 or at an argument or grid dimension (`v(p2)[grid_x]`: an indptr's
  entry ends the range of indices a batch reads, an index chain), possibly over a power of two
  rounded up (`ceil(v(p11)[0] / 16)`: a padded token count over the block size), else a
  two-dimensional table, row r read up to another buffer's value at r over a divisor (a block
  table read to each sequence's length; entries past it are stale), and only where no table
  verifies, a table whose rows a third buffer's value (or difference) at r filters
  (`row_filter`; `_leaves_most_out` keeps chance filters on small buffers out); negative values
  are sentinels that select nothing; where the values select whole chunks, each chunk may be
  read only up to another buffer's value at the same position (`_with_lengths`,
  `_length_regions`), or run to the next value only where a buffer's value at the position
  allows (`_run_regions`: rows back to back, a varlen batch's start offsets, and a
  one-dimensional `row_filter`: a prefill kernel skipping decodes), where the rows without the
  filter do not verify (and, once the kernel's regions are fitted, with the filter another of its
  regions holds: `fit_filtered_runs`, fit.program_filters);
- start and stride: the smallest value a launch reads, v0, sets where its first chunk starts,
  and the largest, v1, where its last one ends. With v0 and v1 as two more features, the robust
  solver (`solve.solve_pair`) finds the simplest formulas for `start + stride*v0` and
  `start + stride*v1 + chunk` within a range's byte bounds (`region.range_bounds`), both with the
  same positive stride; one more solve, for whole chunks, finds the stride from where the last
  one ends, `start + stride*(v1+1)` (where the records leave the stride loose, the free solve may
  take stride 1 and a chunk as wide as the values' spread); whole chunks (chunk = stride) first;
- verification: every observed launch's chunks, rounded out to big pages, must cover what the
  records show touched and stay inside what they may have touched (`strided.verify_pages`),
  but for the launches lost records may leave unexplained (`KernelData.allowed`).

Where no count verifies, or the one that does leaves fault pages out, the values over a power of
two (`value_div`, `_divided`): a slot mapping's slot over the block size is a head-major cache's
block, whose bytes a slot's write spreads over the whole block.

Long because the passes (values as they are, tables, filtered tables, lengths, runs, divided values)
share the count candidates, the stride solves and verification in one `_fit_with`; split, each
part would reach into the others' helpers.

Launches whose values were not recorded do not take part (the predictor gives them the fallback).
Natural-mode launches do not either: only first touches fault there, so a launch's faults do not
show the chunks its values chose.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from pagecast import values as V

from .. import formula as FM
from .. import indexed as IX
from ..features import factorize_rows
from ..model_io import Region, RowFilter
from ..observe import RegionObs
from .data import KernelData
from .index_counts import (MAX_LENGTH_VALUES, Count, buffer_count_candidates, count_candidates, launch_positions,
                           length_candidates, prefix_values, row_bytes, table_candidates, value_elems, value_rows)
from .row_filters import RowForms, filtered_table_candidates, length_filters
from .index_split import best_split, block_strides
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
                max_terms: int = 3, empty: np.ndarray | None = None) -> Region | None:
    """An indexed region for base word `w` at its observed launches `sel` (positions in kd; `nat`:
    which are natural mode; `bounds`: region.range_bounds at sel), or None (module doc). Fills `fit`.
    `max_terms`: terms the edges' formulas (the value's term among them) may have. `empty`:
    full-mode launches whose records show nothing in the word's part of the allocation; given,
    a region must also predict no page at them but those lost records explain (`empty_hits`),
    and rows no filter leaves out verify only where they do (a decode kernel's programs that
    return at once for a prefill's rows: a launch of prefills only touches none)."""
    if not any(o.trace.values is not None for o, _, _, _ in kd.parts):
        return None
    part, lid = launch_positions(kd)
    s_lo, s_hi, e_lo, e_hi = bounds
    words = _index_words(kd, w, sel, nat, part, lid)
    # whole chunks (rows, experts, blocks) at every index word and count before part chunks at
    # any: a part chunk as wide as a small table verifies with a wrong index word or count too
    # (an expert table of a few big pages, most of them touched by most launches)
    seen: dict = {}
    found = []
    for whole in (True, "divided", False):   # the values over a divisor only where none fits as they are
        for iw, iptr, rows, use in words:
            sv = sel[use]
            for elem in value_elems(kd, part[sv], rows[sv]):
                f = dict(fit)
                r = _fit_with(kd, w, iw, elem, cat, sel, sv, use, part, lid, rows, iptr,
                              (s_lo[use], s_hi[use], e_lo[use], e_hi[use]), f, whole, seen, max_terms, empty)
                if r is not None and empty is None:
                    fit.update(f)
                    return r
                if r is not None:
                    found.append((r, f))
    return _likeliest(kd, found, cat, sel, nat, fit)


def _index_words(kd: KernelData, w, sel: np.ndarray, nat: np.ndarray, part, lid) -> list:
    """The kernel's other base words whose values the trace records at most of the launches `sel`
    (`FitParams.pointer_share`), each as (word, its pointer per launch, its value row per launch,
    which of `sel` have values and are not natural mode)."""
    words = []
    for iw, ivals in kd.bases:
        if iw.name == w.name:
            continue
        iptr = np.concatenate(ivals)
        rows = value_rows(kd, part, lid, iptr)
        have = rows[sel] >= 0
        if have.sum() < kd.params.pointer_share * len(sel):
            continue
        use = have & ~nat
        if use.any():
            words.append((iw, iptr, rows, use))
    return words


def fit_filtered_runs(kd: KernelData, w, cat: RegionObs, sel: np.ndarray, nat: np.ndarray, fit: dict, bounds,
                      only: RowFilter, empty: np.ndarray) -> Region | None:
    """Rows back to back (`_run_regions`) read only where filter `only` allows, which another
    region of the kernel holds (fit.program_filters: a program that returns early reads none of
    its buffers), for base word `w` at its observed launches `sel` (`bounds`: region.range_bounds
    at sel; `empty`: the full-mode launches whose records show nothing in its part). The first,
    over the index words and the counts of arguments (`count_candidates`), that verifies, holds
    every fault page its launches record and names a page at no more launches of `empty` than
    lost records explain; None where none does. Fills `fit` as fit_indexed does."""
    part, lid = launch_positions(kd)
    for iw, iptr, rows, use in _index_words(kd, w, sel, nat, part, lid):
        sv = sel[use]
        g = kd.group[sv]
        vals = {n: kd.uniq[g, k] for k, n in enumerate(kd.sel_names)}
        b = tuple(x[use] for x in bounds)
        for elem in value_elems(kd, part[sv], rows[sv]):
            row_len = row_bytes(kd, part[sv], rows[sv]) // elem
            solved: dict = {}
            for cf in itertools.islice(count_candidates(kd, g, row_len), MAX_RUN_COUNTS):
                k = np.minimum(np.asarray(cf.evaluate(vals), np.int64) * np.ones(len(sv), np.int64), row_len)
                if (k < 1).any():
                    continue
                c = Count(cf, None, 4, 1, k)
                for r in _run_regions(kd, w, iw, elem, g, vals, c, b, sv, part, lid, rows, 3, solved, None, only):
                    okv = verify_indexed(kd, r, cat, sel, sv, part, lid, iptr)
                    unexplained = int((~okv).sum())
                    if unexplained <= kd.allowed(len(sv)) and _holds_own_faults(kd, r, cat, sv) \
                            and empty_hits(kd, r, cat, empty) <= kd.allowed(len(empty)):
                        return _fitted((r, okv, unexplained, None, k), fit, sel, sv, use, elem)
    return None


MAX_RUN_COUNTS = 8   # counts of arguments fit_filtered_runs tries per index word and width at most


def region_parts(r: Region) -> int:
    """What an indexed region is made of, each part counted as the solver counts a term: its
    formulas' terms, and each of a table's rows, a count from another buffer, a count over a
    divisor, a row filter, a count_sub, values over a divisor, a last chunk read in part."""
    return (sum(f.n_terms for f in r.formulas().values()) + (r.row_stride is not None) + (r.count_index is not None)
            + (r.count_div > 1) + (r.row_filter is not None) + (r.count_sub is not None) + (r.value_div > 1)
            + bool(r.part_last))


def _likeliest(kd: KernelData, found: list, cat: RegionObs, sel: np.ndarray, nat: np.ndarray, fit: dict):
    """Of the regions `found` [(region, its fit record)], each index word's first that verifies,
    the simplest (`region_parts`) of those that hold every fault page (on the launches whose
    values all of them have), and of those alike the one under which the faults are likeliest
    (`fault_pages_loglik`); its record into `fit`; None where none holds them. With launches
    that touch nothing to hold to (`fit_indexed`'s `empty`), every word's region is found: in a
    buffer of a big page or two, rows chosen by some other word's values verify by chance (a
    block table's entries read as byte offsets, to a count less a row value, rows a chance
    filter keeps), and hold the faults as well; the kernel's rows are the simpler."""
    if not found:
        return None
    have = np.ones(len(sel), bool)
    for r, _ in found:
        have &= indexed_pages(kd, r, cat, sel)[1]
    use = sel[have & ~nat]
    best, best_key = None, None
    for r, f in found:
        ll, held, n = fault_pages_loglik(kd, r, cat, use, pages=lambda s, a=r: indexed_pages(kd, a, cat, s)[0])
        key = (region_parts(r), -ll)
        if held and (best_key is None or key < best_key):
            best, best_key = (r, f), key
    if best is None:
        return None
    fit.update(best[1])
    return best[0]


def _fit_with(kd, w, iw, elem, cat, sel, sv, use, part, lid, rows, iptr, bounds, fit, whole: bool,
              seen: dict, max_terms: int = 3, empty: np.ndarray | None = None) -> Region | None:
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
        row_len = row_bytes(kd, part[sv], rows[sv]) // elem
        cands = (Count(c, None, 4, 1, np.asarray(c.evaluate(vals), np.int64) * np.ones(len(sv), np.int64))
                 for c in count_candidates(kd, g, row_len))
        seen[key] = ([], itertools.chain(cands, buffer_count_candidates(kd, w, iw, g, sv, part, lid, row_len),
                                         table_candidates(kd, w, iw, elem, g, sv, part, lid, rows[sv], row_len)),
                     row_len, {}, filtered_table_candidates(kd, w, iw, elem, g, sv, part, lid, rows[sv], row_len))
    kept, more, row_len, solved, filtered = seen[key]
    best = None

    def quiet(r: Region) -> bool:
        # where launches show nothing, a small buffer's rows may be chosen by chance: every fault
        # page held too (a record's page was certainly touched)
        return empty is None or (empty_hits(kd, r, cat, empty) <= kd.allowed(len(empty))
                                 and _holds_own_faults(kd, r, cat, sv))

    if whole == "divided":   # every count of this word and width was tried whole: the values over a divisor
        best = _divided(kd, w, iw, elem, cat, sel, sv, part, lid, rows, iptr, g, vals, bounds, kept, solved, max_terms)
        return None if best is None or not quiet(best[0]) else _fitted(best, fit, sel, sv, use, elem)

    def candidates():
        yield from kept
        for c in more:
            if c.rs is None:
                c.k = np.minimum(c.k, row_len)
            if (c.k < 1).any():
                continue
            kept.append(c)
            yield c
        # tables whose rows another buffer filters, or whose counts are less its values: only
        # where no count without either verifies; then the one that verifies less each row value
        # (the candidates after it with its filter, tried as tighter counts)
        for c in filtered if best is None else ():
            if best is not None and (c.sub is None or c.rf != best[0].row_filter):
                return
            kept.append(c)
            yield c

    def verifies(r: Region) -> bool:
        return int((~verify_indexed(kd, r, cat, sel, sv, part, lid, iptr)).sum()) <= kd.allowed(len(sv)) and quiet(r)

    for c in candidates():
        k = c.k
        if best is not None:
            best = _tighter(kd, best, c, cat, sel, sv, part, lid, iptr)
            continue
        in_part = _may_part(c)   # may a row's last chunk be read in part
        if c.strides is None:
            # a table's stride is a constant (the value's own term): its candidates are many, and
            # the constant solve is what keeps trying them cheap
            c.strides = _strides(kd, g, part[sv], rows[sv], k, elem, bounds, max_terms if c.rs is None else 1,
                                 c.extremes(), solved, part_last=in_part)
        if not c.strides:
            continue
        v0, v1, strides = c.strides

        def with_count(regions):
            for r in regions:
                for f, x in c.fields().items():
                    setattr(r, f, x)
                yield r
        tries = with_count(r for stride in strides
                           for r in _regions_for(kd, w, iw, elem, g, vals, stride, c.count, v0, v1, bounds, whole,
                                                 in_part))
        if whole and c.rs is None and c.cidx is None:
            # then rows longer than a big page, read in part: each up to another buffer's value
            tries = itertools.chain(tries, _length_regions(kd, w, iw, elem, g, vals, c, bounds, sv, part, lid, rows),
                                    _run_regions(kd, w, iw, elem, g, vals, c, bounds, sv, part, lid, rows, max_terms,
                                                 solved, verifies))
        for r in tries:
            okv = verify_indexed(kd, r, cat, sel, sv, part, lid, iptr)
            unexplained = int((~okv).sum())
            if unexplained > kd.allowed(len(sv)) and in_part:
                # page-exact records (fit --from truth) show a row's last block read in part
                r = dataclasses.replace(r, part_last=True)
                okv = verify_indexed(kd, r, cat, sel, sv, part, lid, iptr)
                unexplained = int((~okv).sum())
            if unexplained <= kd.allowed(len(sv)) and (r.row_filter is None and r.count_sub is None
                                                      or _leaves_most_out(kd, r, cat, sv, part, lid, iptr)) \
                    and quiet(r):
                best = (r, okv, unexplained, None, k)
                break
    if whole and best is not None and best[0].row_stride is None and not _holds_own_faults(kd, best[0], cat, sv):
        # the count that verifies leaves fault pages out (verification is to the big page): the
        # values over a divisor, where that holds them
        div = _divided(kd, w, iw, elem, cat, sel, sv, part, lid, rows, iptr, g, vals, bounds, kept, solved, max_terms)
        if div is not None and _holds_own_faults(kd, div[0], cat, sv):
            best = div
    if best is None:
        return None
    if best[0].row_stride is not None and best[0].count_div > 1 and not best[0].part_last:
        # a row's last block read up to its count (a sequence's last KV block, filled to its
        # length): kept where it verifies and holds every fault page the whole block holds
        r = dataclasses.replace(best[0], part_last=True, fit={})
        okv = verify_indexed(kd, r, cat, sel, sv, part, lid, iptr)
        unexplained = int((~okv).sum())
        if unexplained <= kd.allowed(len(sv)) and _holds_faults_of(kd, r, best[0], cat, sv):
            best = (r, okv, unexplained, None, best[4])
    if whole and best[0].row_stride is None and best[0].count_index is None:
        best = _with_lengths(kd, w, iw, best, cat, sel, sv, part, lid, iptr)
    if not quiet(best[0]):   # a divided or tightened region that names pages where none were touched
        return None
    return _fitted(best, fit, sel, sv, use, elem)


def _fitted(best: tuple, fit: dict, sel, sv, use, elem) -> Region:
    """The best tuple's region, its fit record filled in `fit`."""
    r, okv, unexplained, _, _ = best
    fit["exact"] = round(float(okv.mean()), 6)
    fit["unexplained"] = unexplained
    fit["values"] = {"launches": int(len(sv)), "without_values": int(len(sel) - use.sum()), "elem": elem}
    return r


def _length_regions(kd, w, iw, elem, g, vals, c: Count, bounds, sv, part, lid, rows):
    """Regions for count `c` whose chunk i is as long as another buffer's value at position i says
    (index_counts.length_candidates), at each of c's strides: the start solved from where the
    first chunks begin, and kept where the chunk of the largest value (the one that ends last:
    chunks lie a stride apart and none is longer) ends where the launches' last pages allow."""
    s_lo, s_hi, e_lo, e_hi = bounds
    n = len(g)
    v0, v1, strides = c.strides
    if not strides:
        # no stride follows both edges (the last chunk's end follows its length too): from the start
        sd = edge_stride(kd, g, v0, v1, (s_lo, s_hi), "hi", pure=True, max_terms=1)
        strides = [] if sd is None else [sd]
    k = c.k
    if int(k.sum()) > MAX_LENGTH_VALUES:   # as length_sets: nothing to try, and too many to hold
        return
    v = prefix_values(kd, part[sv], rows[sv], k, elem)
    lv = np.repeat(np.arange(n), k)
    at_max = v == v1[lv]
    made = 0
    starts = [(stride, x) for stride in strides if (x := start_for(kd, g, vals, stride, v0, s_lo, s_hi)) is not None]
    for fields, ch in length_candidates(kd, w, iw, sv, part, lid, k) if starts else ():
        last = np.zeros(n, np.int64)
        np.maximum.at(last, lv[at_max], ch[at_max])
        for stride, (sd, start, c0) in starts:
            if int(((last < e_lo - sd * v1 - c0) | (last > e_hi - sd * v1 - c0)).sum()) > kd.allowed(n):
                continue
            yield Region(w.name, "indexed", start=start, stride=stride, count=c.count, index=iw.name, elem=elem,
                         **fields)
            made += 1
            if made >= MAX_LENGTHS:
                return


def _run_regions(kd, w, iw, elem, g, vals, c: Count, bounds, sv, part, lid, rows, max_terms, solved, verify,
                 only: RowFilter | None = None):
    """Rows back to back (`_runs`: value i's chunk runs to value i+1's, `stride` bytes a unit of
    their difference, `[p0 + S*v(p2)[i], +S*(v(p2)[i+1] - v(p2)[i]))`: a varlen batch's rows from
    its start offsets) read only where a buffer's value at the row allows
    (row_filters.length_filters: a prefill kernel's query rows, where the query is longer than a
    decode's one token), where the same rows without a filter do not verify (`verify(region)`:
    do they?): every row read is one range from the first row's start, which the buffer's first
    rows up to a count (region.CASCADE) say more simply, and a filter the records do not need
    would leave out rows whose pages were already resident. The stride is solved from the rows
    read: the first one's start and the last one's end (one past it, the next row's start), as
    whole chunks' are; a filter's rows left out no longer widen them. `only`: that filter alone,
    tried whether or not the rows without it verify (fit_filtered_runs)."""
    s_lo, s_hi, e_lo, e_hi = bounds
    n = len(g)
    k = c.k
    if int(k.sum()) > MAX_LENGTH_VALUES:
        return
    runs = _runs(kd, iw, elem, k, sv, part, rows)
    if runs is None:
        return
    fields, v, ln = runs
    lv = np.repeat(np.arange(n), k)

    def filters():   # the other buffers' values are read only where the rows without a filter fail
        forms = RowForms(kd, w, iw, sv, part, lid, own=(iw, rows[sv], elem))
        if only is None:
            yield from length_filters(forms, k, ln)
            return
        ri = np.arange(len(lv), dtype=np.int64) - np.repeat(np.cumsum(k) - k, k)
        for fi in range(len(forms.buffers)):
            for rv, f in forms.at("lengths", lv, ri, fi):
                if (rv.index, rv.elem, rv.diff) == (only.index, only.elem, only.diff):
                    yield only, IX.filter_keeps(only, f)
    made = 0
    unfiltered = [] if only is not None else [(None, np.ones(len(ln), bool))]
    for rf, keep in itertools.chain(unfiltered, filters()):
        read = keep & (ln > 0)
        lo = np.full(n, np.iinfo(np.int64).max)
        hi = np.full(n, -1, np.int64)
        np.minimum.at(lo, lv[read], v[read])
        np.maximum.at(hi, lv[read], (v + ln)[read])
        ok = hi >= 0
        found = _strides(kd, g, part[sv], rows[sv], k, elem, bounds, max_terms, (lo, hi - 1, ok), solved)
        for stride in found[2] if found else ():
            x = start_for(kd, g, vals, stride, lo, s_lo, s_hi)
            if x is None:
                continue
            sd, start, c0 = x
            end = sd * hi + c0
            if int(((end < e_lo) | (end > e_hi)).sum()) > kd.allowed(n) and only is not None:
                # a view of every row's part of a wider row (a fused QKV projection's K): whole
                # rows of the wider one, the start where the last row read ends at its end
                x = start_for(kd, g, vals, stride, lo, np.maximum(s_lo, e_lo - sd * (hi - lo)),
                              np.minimum(s_hi, e_hi - sd * (hi - lo)))
                if x is None:
                    continue
                sd, start, c0 = x
                end = sd * hi + c0
            if int(((end < e_lo) | (end > e_hi)).sum()) > kd.allowed(n):
                continue
            r = Region(w.name, "indexed", start=start, stride=stride, count=c.count, index=iw.name, elem=elem,
                       chunk=stride, row_filter=rf, **fields)
            if rf is None:
                if verify(r):
                    return
                continue
            yield r
            made += 1
            if made >= MAX_LENGTHS:
                return


def _runs(kd, iw, elem: int, k, sv, part, rows) -> tuple[dict, np.ndarray, np.ndarray] | None:
    """Rows back to back: the first k[l] values of each launch's index row, value i's length the
    difference of values i+1 and i (the row holds k + 1 values and they never fall: a varlen
    batch's start offsets). (The Region fields but the chunk, the values, their lengths) or None."""
    if (row_bytes(kd, part[sv], rows[sv]) // elem < k + 1).any():
        return None
    v = prefix_values(kd, part[sv], rows[sv], k + 1, elem)
    nxt = np.repeat(np.arange(len(k)), k + 1)
    nxt = nxt[1:] == nxt[:-1]
    ln = (v[1:] - v[:-1])[nxt]
    if (ln < 0).any() or not (ln > 0).any():
        return None
    return dict(count_index=iw.name, count_elem=elem, count_div=1, lengths=True, length_diff=True), \
        (v[:-1])[nxt], ln


MAX_LENGTHS = 16   # length regions verified per count at most (each end check passed: usually one)


def _with_lengths(kd: KernelData, w, iw, best: tuple, cat, sel, sv, part, lid, iptr) -> tuple:
    """`best` (whole chunks, a count of arguments) with each chunk read up to another buffer's value
    at its position (index_counts.length_candidates), where one verifies, holds every fault page
    the whole chunks hold and predicts fewer pages at the fitting launches: the first such, the
    one reading the most (a row of a page table read up to its request's length). Else `best`."""
    whole_pages = None
    for f, _ in length_candidates(kd, w, iw, sv, part, lid, best[4]):
        r = dataclasses.replace(best[0], **f, fit={})
        pieces = indexed_pieces(kd, r, cat, sv, part, lid, iptr)
        okv = verify_indexed(kd, r, cat, sel, sv, part, lid, iptr, pieces)
        unexplained = int((~okv).sum())
        if unexplained > kd.allowed(len(sv)):
            continue
        if whole_pages is None:
            _, s0, e0 = indexed_pieces(kd, best[0], cat, sv, part, lid, iptr)
            whole_pages = int((e0 - s0).sum())
        if int((pieces[2] - pieces[1]).sum()) < whole_pages and _holds_faults_of(kd, r, best[0], cat, sv):
            return (r, okv, unexplained, None, best[4])
    return best


MAX_VALUE_DIV = 1 << 10   # value divisors tried: 2, 4, ... up to it (a KV block's slots)
DIVIDED_COUNTS = 4        # the first counts (one-dimensional) tried with a divisor


def _divided(kd, w, iw, elem, cat, sel, sv, part, lid, rows, iptr, g, vals, bounds, kept, solved, max_terms):
    """Whole chunks at `stride*floor(v / d)`, d a power of two, at the first counts: the smallest d
    whose region verifies and holds every fault page, else (None where none holds) the first that
    verifies. A slot mapping's values over the block size select a head-major cache's blocks: a
    slot's bytes lie all over its block, and a stride of the slot itself puts them in no chunk
    that holds its faults. A best tuple, or None."""
    first = None
    for c in [c for c in kept if c.rs is None][:DIVIDED_COUNTS]:
        v0, v1, ok = _extremes(kd, part[sv], rows[sv], c.k, elem) if c.extremes() is None else c.extremes()
        if not ok.all():
            continue
        for d in (1 << b for b in range(1, MAX_VALUE_DIV.bit_length())):
            v0d, v1d = v0 // d, v1 // d
            found = _strides(kd, g, part[sv], rows[sv], c.k, elem, bounds, max_terms, (v0d, v1d, ok), solved)
            for stride in found[2] if found else ():
                for r in _regions_for(kd, w, iw, elem, g, vals, stride, c.count, v0d, v1d, bounds, True):
                    r = dataclasses.replace(r, **c.fields(), value_div=d)
                    okv = verify_indexed(kd, r, cat, sel, sv, part, lid, iptr)
                    unexplained = int((~okv).sum())
                    if unexplained > kd.allowed(len(sv)):
                        continue
                    found_best = (r, okv, unexplained, None, c.k)
                    if _holds_own_faults(kd, r, cat, sv):
                        return _split_blocks(kd, _tightest(kd, found_best, kept, cat, sel, sv, part, lid, iptr), cat, sel, sv,
                                      part, lid, iptr)
                    first = first or found_best
    if first is None:
        return _solved_blocks(kd, w, iw, elem, cat, sel, sv, part, lid, rows, iptr, g, vals, bounds, kept)
    return _split_blocks(kd, _tightest(kd, first, kept, cat, sel, sv, part, lid, iptr), cat, sel, sv, part, lid, iptr)


def _solved_blocks(kd, w, iw, elem, cat, sel, sv, part, lid, rows, iptr, g, vals, bounds, kept):
    """Where no whole block verifies (a slot's bytes in a part of each of its block's big pages):
    the block's stride solved from where launches begin (index_split.block_strides), each d, and
    its splits (index_split.best_split) that verify and hold every fault page. A best tuple or None."""
    s_lo, s_hi, e_lo, e_hi = bounds
    for c in [c for c in kept if c.rs is None][:DIVIDED_COUNTS]:
        v0, v1, ok = _extremes(kd, part[sv], rows[sv], c.k, elem) if c.extremes() is None else c.extremes()
        if not ok.all():
            continue
        for d in (1 << b for b in range(1, MAX_VALUE_DIV.bit_length())):
            for stride in block_strides(kd, g, v0 // d, v1 // d, bounds, _WithValues):
                found = start_for(kd, g, vals, stride, v0 // d, s_lo - stride.const, s_hi)
                if found is None:
                    continue
                r = Region(w.name, "indexed", start=found[1], stride=stride, chunk=stride, count=c.count, index=iw.name,
                           elem=elem, value_div=d)
                r = dataclasses.replace(r, **c.fields())
                best = _split_blocks(kd, (r, None, kd.allowed(len(sv)) + 1, None, c.k), cat, sel, sv, part, lid, iptr)
                if best[0] is not r:
                    # tightened as a whole block is (`_divided`): a padded mapping's whole row
                    # verifies as well as the live slots an argument counts
                    return _tightest(kd, best, kept, cat, sel, sv, part, lid, iptr)
    return None


def _split_blocks(kd, best, cat, sel, sv, part, lid, iptr):
    """`best`, a whole-block region, or the split of its blocks that the faults favour (fit.index_split)."""
    def check(r):
        okv = verify_indexed(kd, r, cat, sel, sv, part, lid, iptr)
        return okv, int((~okv).sum())
    return best_split(kd, best, cat, sel, sv, check, lambda r: (lambda s: indexed_pages(kd, r, cat, s)[0]))


def _holds_own_faults(kd, r: Region, cat, sv) -> bool:
    """Does region `r` hold every fault page its launches `sv` record (a page certainly touched)?"""
    return fault_pages_loglik(kd, r, cat, sv, pages=lambda s: indexed_pages(kd, r, cat, s)[0])[1]


def _tighter(kd, best, c, cat, sel, sv, part, lid, iptr):
    """`best` with count `c` where c reads fewer of the same values (none more at any launch,
    fewer at some) and the verified region's start, stride and chunk with it verify again and
    hold every fault page the looser one holds (no new solve); else `best`."""
    if (c.k > best[4]).any() or (c.k == best[4]).all():
        return best
    r = dataclasses.replace(best[0], **c.fields(), fit={})
    okv = verify_indexed(kd, r, cat, sel, sv, part, lid, iptr)
    unexplained = int((~okv).sum())
    if unexplained <= kd.allowed(len(sv)) and _holds_faults_of(kd, r, best[0], cat, sv):
        return (r, okv, unexplained, None, c.k)
    return best


def _tightest(kd, best, kept, cat, sel, sv, part, lid, iptr):
    """`best` tightened by each one-dimensional count in turn (_tighter, as _fit_with tightens a
    count: a persistent buffer's whole row verifies as well)."""
    for c in kept:
        if c.rs is None:
            best = _tighter(kd, best, c, cat, sel, sv, part, lid, iptr)
    return best


def _leaves_most_out(kd: KernelData, region: Region, cat: RegionObs, sv, part, lid, iptr) -> bool:
    """Does a filtered table (`row_filter`) or one whose counts are less a row value (`count_sub`)
    predict under half its allocation's pages at more than half the launches `sv`? Either is
    tried where no table verifies, so a small buffer (a few
    pages, its records at most a big page or two) would verify some filter by chance: there the
    allocation says as much, and the evidence cannot tell a filter from none."""
    rep, sp, ep = indexed_pieces(kd, region, cat, sv, part, lid, iptr)
    pages = np.bincount(rep, weights=ep - sp, minlength=len(sv))
    alloc = (cat.alloc_e[sv] - cat.alloc_s[sv]).astype(np.float64)
    return bool((pages * 2 < alloc).mean() > 0.5)


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


def _may_part(c: Count) -> bool:
    """May count `c`'s rows end in a chunk read in part (`region.part_last`: a table's rows read
    up to a length over a divisor)?"""
    return c.rs is not None and c.cdiv > 1


def _strides(kd, g, part, rows, k, elem, bounds, max_terms: int = 3, ext=None, solved: dict | None = None,
             part_last: bool = False):
    """(v0, v1, the strides to try) for a count reading `k` values per launch (or whose values'
    extremes are `ext`), or () where a launch's values are all sentinels. `solved` keeps the
    strides per (v0, v1): counts that read other values with the same extremes share them.
    `part_last`: the largest value's chunk may be read in part (_solve_strides)."""
    v0, v1, ok = _extremes(kd, part, rows, k, elem) if ext is None else ext
    if not ok.all():
        return ()
    key = (v0.tobytes(), v1.tobytes(), max_terms, part_last)
    if solved is not None and key in solved:
        return v0, v1, solved[key]
    strides = _solve_strides(kd, g, v0, v1, bounds, max_terms, part_last)
    if solved is not None:
        solved[key] = strides
    return v0, v1, strides


def _solve_strides(kd, g, v0, v1, bounds, max_terms: int = 3, part_last: bool = False) -> list:
    """The strides to try for values whose extremes per launch are v0 and v1 (_strides), solved
    from the evidence directly rather than searched for among formulas over the values
    (docs/template-model.md, "Strides solved, not searched"):

    1. a constant stride with a constant start: the start edge `start + S*v0`, the end edge
       `start + S*v1 + chunk` and, for whole chunks, `start + S*(v1+1)`, each a one-term solve over
       the value alone (`pure`: the feasible coefficients are an interval, from the pairwise
       conditions, formula.solve), so that launches of all argument groups pin S together;
    2. a stride of the arguments (`stride_bounds`): each launch's chunks span v1 - v0 + 1
       strides, and two launches with equal arguments (one stride, one start) whose smallest (or
       largest) values differ by d lie d strides apart, so each gives S an interval of integers
       directly; the intervals of a feature group intersect (robustly, as every bound does:
       `solve.group_bounds`), and one solve over the arguments (the kernel's own features, not
       products with the values) finds the simplest formula within them.

    `part_last`: the largest value's chunk may be read in part (the records exact to the page:
    fit --from truth), so the end edge of whole chunks is not required. Each solve is one pass over
    the launches (O(launches), a handful of columns), whatever the number of candidate formulas;
    `max_terms` 1: the constant stride (1.) only."""
    s_lo, s_hi, e_lo, e_hi = bounds
    strides: list = []

    def add(f):
        if f is not None and f not in strides:
            strides.append(f)
    # the end of whole chunks (one stride past the largest value), the first chunk's start, the
    # last chunk's start below the end (part chunks)
    for top, edge, side in ((v1 + 1, (e_lo, e_hi), "lo"), (v1, (s_lo, s_hi), "hi"), (v1, (e_lo, e_hi), "lo")):
        if strides and side == "lo" and top is v1:
            break   # the part chunks' end only where neither edge above gave a stride
        ex = _WithValues(kd, g, v0, top, True, True)
        res = solve_pair(ex, ex.group, [edge], hard={0: side}, min_terms={0: 1}, max_terms=1)
        sp_ = _split(res[0][0]) if res is not None else None
        if sp_ is not None and sp_[0].n_terms == 0 and sp_[0].const > 0:
            add(sp_[0])
    if max_terms > 1:
        for whole in (True, False):
            gg, lo, hi = stride_bounds(g, v0, v1, bounds, whole)
            if gg is None:
                continue
            # a constant where every launch's interval admits one (robustly), which the joint
            # solves above pin more tightly where they found it; else one term of the arguments
            # (a row of p5 heads of p6 bytes: `2*p5*p6`)
            res = solve_pair(kd, gg, [(lo, hi)], modes={0: "round"}, max_terms=0 if strides else 1)
            if res is not None and len(res[0]) and _positive(res[0][0], kd, g):
                add(res[0][0])
    return strides


def _positive(f: FM.Formula, kd, g) -> bool:
    """Is formula `f` positive at every launch (groups `g` of kd)?"""
    vals = {n: kd.uniq[g, k] for k, n in enumerate(kd.sel_names)}
    return bool((np.asarray(f.evaluate(vals), np.int64) * np.ones(len(g), np.int64) > 0).all())


def stride_bounds(g, v0, v1, bounds, whole: bool = True):
    """Per constraint (one per launch and pair), the integer interval the stride S must lie in, with
    the group of the launch it belongs to: (groups, lo, hi) as arrays over the constraints, or
    (None, None) where no constraint bounds S. From the launches' byte bounds on the first
    chunk's start (s) and the last one's end (e):

    - each launch: its chunks span v1 - v0 + 1 strides (whole chunks: exactly, `e - s`; part
      chunks of at most a stride: more than v1 - v0 strides and at most v1 - v0 + 1);
    - each launch against the launch of its group with the smallest v0 (the same start and
      stride): `S * (v0_i - v0_j)` lies in `[s_lo_i - s_hi_j, s_hi_i - s_lo_j]`; the same for the
      ends against the smallest v1.

    Returned as (groups, lo, hi), the form `solve_pair` takes: a group per constraint, repeated (the solver intersects a group's intervals, and a launch whose lost records moved a
    bound is outvoted, not obeyed)."""
    s_lo, s_hi, e_lo, e_hi = (np.asarray(x, np.int64) for x in bounds)
    inf = float(FM.INF)
    out_g, out_lo, out_hi = [], [], []

    def interval(d, lo, hi, strict_hi=False):
        # S * d in [lo, hi] with d > 0: S in [ceil(lo/d), floor(hi/d)] (floats for the infinite bounds)
        m = d > 0
        df = d[m].astype(np.float64)
        lf, hf = lo[m].astype(np.float64), hi[m].astype(np.float64)
        a = np.where(np.abs(lf) >= inf / 2, -inf, np.ceil(lf / df))
        b = np.where(np.abs(hf) >= inf / 2, inf, np.floor((hf - (1 if strict_hi else 0)) / df))
        return m, np.clip(a, 1, inf), np.clip(b, -inf, inf)

    def fin(*xs):
        return np.all([np.abs(x) < FM.INF // 2 for x in xs], axis=0)
    # each launch's own span
    span = v1 - v0
    okw = fin(s_lo, s_hi, e_lo, e_hi)
    L = np.where(okw, e_lo - s_hi, -FM.INF)
    H = np.where(okw, e_hi - s_lo, FM.INF)
    m, a, b = interval(span + 1, L, H)
    if not whole:   # more than span strides: at most (H - 1) / span
        _, _, b2 = interval(np.maximum(span, 1), L, H, strict_hi=True)
        b = np.where(span[m] > 0, b2, inf)
    out_g.append(g[m]), out_lo.append(a), out_hi.append(b)
    # each launch against its group's smallest v0 (starts) and smallest v1 (ends)
    for x, lo_b, hi_b in ((v0, s_lo, s_hi), (v1, e_lo, e_hi)):
        if not len(g):
            break
        o = np.lexsort((x, g))
        first = np.r_[True, g[o][1:] != g[o][:-1]]
        ref = o[np.flatnonzero(first)[np.cumsum(first) - 1]]     # per launch (in o's order): its group's smallest
        i = o
        d = x[i] - x[ref]
        ok = fin(lo_b[i], hi_b[i], lo_b[ref], hi_b[ref])
        m, a, b = interval(np.where(ok, d, 0), lo_b[i] - hi_b[ref], hi_b[i] - lo_b[ref])
        out_g.append(g[i][m]), out_lo.append(a), out_hi.append(b)
    gg = np.concatenate(out_g)
    lo = np.concatenate(out_lo)
    hi = np.concatenate(out_hi)
    bounded = (lo > 1) | (hi < inf)
    if not bounded.any():
        return None, None, None
    return gg, lo.astype(np.int64), np.minimum(hi, float(FM.INF)).astype(np.int64)


def edge_stride(kd, g, v0, v1, edge, side: str, pure: bool = False, max_terms: int = 3) -> FM.Formula | None:
    """The stride of the simplest formula, with a value's term, for one edge within `edge` (lo, hi),
    `side` its hard bound (solve_pair): the first chunk's start (v0) or the last one's end (v1 one
    past the largest value); None where none holds or no single term multiplies a value."""
    ex = _WithValues(kd, g, v0, v1, True, pure)
    res = solve_pair(ex, ex.group, [edge], hard={0: side}, min_terms={0: 1}, max_terms=max_terms)
    sp_ = _split(res[0][0]) if res is not None else None
    return None if sp_ is None else sp_[0]


def start_for(kd, g, vals, stride: FM.Formula, v0, s_lo, s_hi):
    """(the stride per launch, the start formula, the start per launch) that puts the chunk of
    each launch's smallest value v0 where its first pages begin, or None (a stride not positive
    everywhere, or no start the bounds allow)."""
    n = len(g)
    sd = np.asarray(stride.evaluate(vals), np.int64) * np.ones(n, np.int64)
    if (sd <= 0).any():
        return None
    res = solve_pair(kd, g, [(s_lo - sd * v0, s_hi - sd * v0)], hard={0: "hi"})
    if res is None:
        return None
    start = res[0][0]
    return sd, start, np.asarray(start.evaluate(vals), np.int64) * np.ones(n, np.int64)


def _regions_for(kd, w, iw, elem, g, vals, stride: FM.Formula, count: FM.Formula, v0, v1, bounds, whole: bool,
                 part_last: bool = False):
    """The region with this stride to verify: its start from where the first chunks begin, its
    chunk (`whole`) the stride itself where the last ones' ends allow it (rows, blocks, experts
    are whole; with `part_last`, a last chunk read in part may end short of it), or (not `whole`)
    the simplest chunk formula that ends where they end (a part of each row: a column range)."""
    s_lo, s_hi, e_lo, e_hi = bounds
    n = len(g)
    found = start_for(kd, g, vals, stride, v0, s_lo, s_hi)
    if found is None:
        return
    sd, start, c = found
    ch_lo, ch_hi = e_lo - sd * v1 - c, e_hi - sd * v1 - c
    chunks = []
    if whole:
        if int(((sd < ch_lo) | (sd > ch_hi if not part_last else ch_hi < 1)).sum()) <= kd.allowed(n):
            chunks.append(stride)
    else:
        # one term: a column range of the arguments (`4*p7`); a chunk needing more is a layout
        # the stride and start already say more simply, or none
        res = solve_pair(kd, g, [(ch_lo, ch_hi)], hard={0: "lo"}, max_terms=1)
        if res is not None and res[0][0] != stride and \
                (np.asarray(res[0][0].evaluate(vals), np.int64) * np.ones(n, np.int64) > 0).all():
            chunks.append(res[0][0])
    for chunk in chunks:
        yield Region(w.name, "indexed", start=start, stride=stride, chunk=chunk, count=count, index=iw.name,
                     elem=elem)


def empty_hits(kd, region: Region, cat, empty: np.ndarray) -> int:
    """Launches of `empty` (positions in kd whose records show nothing in the region's part of
    the allocation) at which indexed `region` predicts a page: each one where, if it holds, every
    record of the launch's pages there was lost."""
    if not len(empty):
        return 0
    rep, sp, ep = indexed_pages(kd, region, cat, empty)[0]
    lo, hi = cat.lo_f[empty][rep], cat.hi_f[empty][rep]
    return len(np.unique(rep[np.minimum(ep, hi) > np.maximum(sp, lo)]))


def verify_indexed(kd, region: Region, cat, sel, sv, part, lid, iptr, pieces=None) -> np.ndarray:
    """Per launch of `sv`: do its predicted chunks cover what its records show (strided.verify_pages)?
    `pieces`: the region's indexed_pieces at `sv`, where the caller has them already."""
    pos = np.searchsorted(sel, sv)            # sv is a subset of sel, both ascending
    rep, sp, ep = indexed_pieces(kd, region, cat, sv, part, lid, iptr) if pieces is None else pieces
    ok = verify_pages(kd, cat, sel, kd.bigp, pos[rep], sp, ep)
    return ok[pos]


def indexed_pieces(kd, region: Region, cat, sv, part, lid, iptr):
    """The pages an indexed region predicts at launches `sv` (positions in kd): (which launch,
    as a position in sv; start page; end page), merged per launch."""
    ps = kd.ps
    cptr = None if region.count_index is None else \
        np.concatenate(next(v for cw, v in kd.bases if cw.name == region.count_index)).astype(np.int64)
    fptr, sptr = (None if rv is None else np.concatenate(next(v for w, v in kd.bases if w.name == rv.index)).astype(np.int64)
                  for rv in (region.row_filter, region.count_sub))
    reps, sps, eps = [], [], []
    for ti, (o, _, _, _) in enumerate(kd.parts):
        m = np.flatnonzero(part[sv] == ti)
        if not len(m):
            continue
        p = sv[m]
        g = kd.group[p]
        vals = {n: kd.uniq[g, k] for k, n in enumerate(kd.sel_names)}
        res = IX.batch_pieces(region, vals, cat.base[p], iptr[p], lid[p], V.image(o.trace), ps,
                              cat.alloc_s[p], cat.alloc_e[p], None if cptr is None else cptr[p],
                              None if fptr is None else fptr[p], None if sptr is None else sptr[p])
        reps.append(m[res["l"]]), sps.append(res["s"]), eps.append(res["e"])
    z = np.zeros(0, np.int64)
    return (np.concatenate(reps) if reps else z, np.concatenate(sps) if sps else z,
            np.concatenate(eps) if eps else z)


def indexed_pages(kd: KernelData, region: Region, cat: RegionObs, sel: np.ndarray):
    """An indexed region's pages at launches `sel` (positions in kd) and which of them have
    their values recorded: ((launch as a position in sel, start page, end page), has values)."""
    part, lid = launch_positions(kd)
    iname = region.index if region.index is not None else region.count_index   # rows by position: no index
    iptr = np.concatenate(next(v for iw, v in kd.bases if iw.name == iname)).astype(np.int64)
    rep, sp, ep = indexed_pieces(kd, region, cat, sel, part, lid, iptr)
    have = value_rows(kd, part[sel], lid[sel], iptr[sel]) >= 0
    if region.count_index is not None:
        cptr = np.concatenate(next(v for cw, v in kd.bases if cw.name == region.count_index)).astype(np.int64)
        have &= value_rows(kd, part[sel], lid[sel], cptr[sel]) >= 0
    return (rep, sp, ep), have
