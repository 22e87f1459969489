"""Per-launch footprints as merged page intervals (trace-format.md, "Footprints").

A footprint is the set of pages a launch touched. It is kept as sorted,
disjoint, half-open page intervals [start, end) grouped by launch in CSR form
(`indptr`), so a trace touching 10^8 pages costs a few bytes per *interval*,
not per page. Everything downstream (fitting, evaluation, planning, the
simulator, reports) takes footprints from here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import trace as T
from .memory import release_arrow_memory

_I64 = np.int64


@dataclass(frozen=True)
class Footprints:
    """Merged page intervals per launch; launch i owns rows indptr[i]:indptr[i+1]."""

    indptr: np.ndarray   # int64, n_launches + 1
    start: np.ndarray    # int64 first page (inclusive)
    end: np.ndarray      # int64 last page + 1 (exclusive)
    page_size: int
    source: str = "observed"  # "truth", "observed" or "predicted"

    @property
    def n_launches(self) -> int:
        return len(self.indptr) - 1

    @property
    def n_intervals(self) -> int:
        return len(self.start)

    def launch_of_interval(self) -> np.ndarray:
        return np.repeat(np.arange(self.n_launches, dtype=_I64), np.diff(self.indptr))

    def pages_per_launch(self) -> np.ndarray:
        cs = np.concatenate([[0], np.cumsum(self.end - self.start)]).astype(_I64)
        return cs[self.indptr[1:]] - cs[self.indptr[:-1]]

    def total_pages(self) -> int:
        return int((self.end - self.start).sum())

    def of(self, launch: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = self.indptr[launch], self.indptr[launch + 1]
        return self.start[a:b], self.end[a:b]

    def pages(self, launch: int) -> np.ndarray:
        """Every page of one launch, ascending (small footprints only: tests, plots)."""
        s, e = self.of(launch)
        return expand_intervals(s, e)

    def union(self) -> tuple[np.ndarray, np.ndarray]:
        """The union of all launches' footprints as merged intervals."""
        return merge_intervals(np.zeros(len(self.start), _I64), self.start, self.end, 1)[1:]

    def union_pages(self) -> int:
        s, e = self.union()
        return int((e - s).sum())

    def select(self, launches: np.ndarray) -> "Footprints":
        """Footprints of the given launch ids, renumbered 0..len-1 in that order."""
        launches = np.asarray(launches, dtype=_I64)
        counts = self.indptr[launches + 1] - self.indptr[launches]
        idx = _ranges(self.indptr[launches], counts)
        indptr = np.concatenate([[0], np.cumsum(counts)]).astype(_I64)
        return Footprints(indptr, self.start[idx], self.end[idx], self.page_size, self.source)

    @classmethod
    def empty(cls, n_launches: int, page_size: int, source: str = "observed") -> "Footprints":
        z = np.zeros(0, _I64)
        return cls(np.zeros(n_launches + 1, _I64), z, z.copy(), page_size, source)

    @classmethod
    def from_intervals(cls, launch: np.ndarray, start: np.ndarray, end: np.ndarray,
                       n_launches: int, page_size: int, source: str = "observed") -> "Footprints":
        """Merge arbitrary (possibly overlapping, unsorted) page intervals per launch."""
        keep = (np.asarray(end) > np.asarray(start)) & (np.asarray(launch) >= 0) & (np.asarray(launch) < n_launches)
        l, s, e = merge_intervals(np.asarray(launch, _I64)[keep], np.asarray(start, _I64)[keep],
                                  np.asarray(end, _I64)[keep], n_launches)
        indptr = np.zeros(n_launches + 1, _I64)
        np.cumsum(np.bincount(l, minlength=n_launches), out=indptr[1:])
        return cls(indptr, s, e, page_size, source)


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenate arange(s, s + c) for each pair, vectorized."""
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, _I64)
    offs = np.cumsum(counts) - counts
    return np.repeat(starts - offs, counts) + np.arange(total, dtype=_I64)


def expand_intervals(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """All integers in the half-open intervals, concatenated."""
    return _ranges(np.asarray(start, _I64), np.asarray(end, _I64) - np.asarray(start, _I64))


def merge_intervals(group: np.ndarray, start: np.ndarray, end: np.ndarray,
                    n_groups: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge overlapping or touching [start, end) intervals within each group.

    Returns (group, start, end) sorted by group then start. Vectorized: a
    segmented running maximum of `end` decides where a new interval begins.
    """
    if len(start) == 0:
        z = np.zeros(0, _I64)
        return z, z.copy(), z.copy()
    order = np.lexsort((start, group))
    g, s, e = group[order], start[order], end[order]
    runmax = _segmented_cummax(g, e, n_groups)
    new = np.ones(len(s), bool)
    new[1:] = (g[1:] != g[:-1]) | (s[1:] > runmax[:-1])
    idx = np.flatnonzero(new)
    out_end = np.maximum.reduceat(e, idx)
    return g[idx], s[idx], out_end


def coarsen_intervals(start: np.ndarray, end: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """At most `k` intervals covering sorted, disjoint [start, end) intervals: the smallest gaps
    between them are closed (ties at the cut close together, so there may be fewer than k)."""
    if len(start) <= k:
        return start, end
    gaps = start[1:] - end[:-1]
    cut = np.sort(gaps)[len(start) - k - 1]
    idx = np.flatnonzero(np.r_[True, gaps > cut])
    return start[idx], np.maximum.reduceat(end, idx)


def _segmented_cummax(g: np.ndarray, e: np.ndarray, n_groups: int) -> np.ndarray:
    """Running maximum of e that restarts at each group (g sorted)."""
    lo, hi = int(e.min()), int(e.max())
    span = hi - lo + 1
    if span * max(n_groups, 1) < 2**62:
        # Lift each group into its own band so one global cummax never crosses groups.
        lifted = (e - lo) + g * span
        return np.maximum.accumulate(lifted) - g * span + lo
    # pandas only here, for bands past 2^62: importing it costs about 0.4 s and 100 MiB, which
    # every `collect --interpret` run paid (docs/collect.md, "Overhead")
    import pandas as pd
    return pd.Series(e).groupby(g).cummax().to_numpy()


def page_span(address: np.ndarray, nbytes: np.ndarray, page_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Pages [first, last + 1) covering byte ranges [address, address + nbytes)."""
    a = np.asarray(address).astype(np.uint64)
    b = a + np.asarray(nbytes).astype(np.uint64)
    ps = np.uint64(page_size)
    return (a // ps).astype(_I64), ((b + ps - np.uint64(1)) // ps).astype(_I64)


# ---- footprints of a trace --------------------------------------------------

def truth_footprints(trace: T.Trace) -> Footprints:
    """Footprints from the truth table (what each launch really touched)."""
    if trace.truth is None:
        raise ValueError(f"{trace.path}: trace has no truth table")
    t = trace.truth
    s, e = page_span(t.column(T.ADDRESS).to_numpy(), t.column(T.BYTES).to_numpy(), trace.page_size)
    return Footprints.from_intervals(t.column(T.LAUNCH_ID).to_numpy(), s, e,
                                     trace.n_launches, trace.page_size, "truth")


class LaunchClock:
    """The launches' [start_ns, end_ns] windows, sorted once: `attribute` fills missing launch ids
    (-1 / null) with the launch running at that time, else -1 (records read piece by piece share it)."""

    def __init__(self, trace: T.Trace):
        L = trace.launches
        st = pc.fill_null(L.column(T.START_NS), -1).to_numpy()
        en = pc.fill_null(L.column(T.END_NS), -1).to_numpy()
        ok = (st >= 0) & (en >= st)
        ids = np.flatnonzero(ok)
        order = np.argsort(st[ids], kind="stable")
        self.ids, self.st, self.en = ids[order], st[ids][order], en[ids][order]

    def attribute(self, launch_id, time_ns) -> np.ndarray:
        lid = pc.fill_null(launch_id, -1).to_numpy().astype(_I64) if hasattr(launch_id, "null_count") \
            else np.asarray(launch_id, _I64).copy()
        missing = lid < 0
        if not missing.any() or len(self.ids) == 0:
            return lid
        t = np.asarray(pc.fill_null(time_ns, -1).to_numpy() if hasattr(time_ns, "null_count") else time_ns, _I64)
        k = np.searchsorted(self.st, t[missing], side="right") - 1
        hit = (k >= 0) & (t[missing] <= self.en[np.maximum(k, 0)])
        lid[missing] = np.where(hit, self.ids[np.maximum(k, 0)], -1)
        return lid

    def after(self, time_ns) -> np.ndarray:
        """Per time: the launch that ended last before it, where no launch is running then (the gap
        before the next one starts), else -1."""
        t = np.asarray(time_ns, _I64)
        if not len(self.ids):
            return np.full(len(t), -1, _I64)
        k = np.searchsorted(self.st, t, side="right") - 1
        kc = np.maximum(k, 0)
        return np.where((k >= 0) & (t > self.en[kc]), self.ids[kc], -1).astype(_I64)


def attribute_by_time(trace: T.Trace, launch_id, time_ns) -> np.ndarray:
    """Fill missing launch ids (-1 / null) with the launch running at that time, else -1."""
    return LaunchClock(trace).attribute(launch_id, time_ns)


def observed_footprints(trace: T.Trace, *, include_prefetch: bool = False) -> Footprints:
    """Footprints from faults plus coherence migrations (never the truth table).

    Records without a launch_id are attributed by time to the launch whose
    [start_ns, end_ns] holds them; those that fall in no launch are dropped.
    `include_prefetch` also counts the driver's speculative migrations.

    The records are read piece by piece (`Trace.batches`: a row group at a time when the trace
    was read lazily), each piece merged into intervals before the next is read, so memory follows
    the intervals, not the records (a trace of 10^6 launches can hold tens of millions of fault
    records: docs/performance.md). Made once
    per Trace object (kept in its __dict__, as pagecast.values keeps its writes): the simulator's
    planners ask for it at every capacity and for every model they predict with.
    """
    key = f"{T.DERIVED}observed_{bool(include_prefetch)}"
    fp = trace.__dict__.get(key)
    if fp is None:
        fp = trace.__dict__[key] = _observed(trace, include_prefetch)
    return fp


def resident_after(trace: T.Trace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(launch, first page, end page) of what a full-mode collector evicted after each launch.

    Full mode moves every live managed range to the host before each launch, so what moves back
    to the host in the gap after launch i (device-to-host migrations between its end and the next
    start) was on the GPU after it: brought in by launch i, touched or prefetched. That is
    possible evidence, never certain: eviction moves whole resident chunks. It matters where the
    migrations in go unrecorded (docs/template-model.md, "What full mode evicts after a launch").
    Empty outside full mode."""
    z = np.zeros(0, np.int64)
    m = trace.migrations
    if trace.mode != "full" or not m.num_rows:
        return z, z.copy(), z.copy()
    m = m.filter(pc.equal(m.column(T.DIRECTION), "dtoh"))
    if not m.num_rows:
        return z, z.copy(), z.copy()
    lid = LaunchClock(trace).after(pc.fill_null(m.column(T.START_NS), -1).to_numpy())
    s, e = page_span(m.column(T.ADDRESS).to_numpy(), m.column(T.BYTES).to_numpy(), trace.page_size)
    ok = lid >= 0
    return lid[ok], s[ok], e[ok]


def possible_footprints(trace: T.Trace) -> Footprints:
    """What the records allow a launch to have touched: the observed footprint, the driver's
    prefetch migrations, and in full mode what was evicted after the launch
    (`resident_after`). A launch touched a subset of this and a superset of the observed
    footprint, so a prediction's precision lies between its precision against the two."""
    a = observed_footprints(trace, include_prefetch=True)
    rl, rs, re_ = resident_after(trace)
    if not len(rl):
        return a
    return Footprints.from_intervals(np.concatenate([a.launch_of_interval(), rl]), np.concatenate([a.start, rs]),
                                     np.concatenate([a.end, re_]), trace.n_launches, trace.page_size)


def _observed(trace: T.Trace, include_prefetch: bool) -> Footprints:
    ps = trace.page_size
    n = trace.n_launches
    clock = LaunchClock(trace)
    causes = pa.array(["coherence"] + (["prefetch"] if include_prefetch else []))
    ls, ss, es = [], [], []
    merged = [0]   # intervals in the last merge of the pieces so far
    cover = None   # the migrations' intervals, merged: what a fault inside them adds nothing to

    def add(lid, s, e):
        # each piece merged on its own; a fault's page inside a migration of the same launch is
        # dropped first (the union is the same): faults are most records, and few of them touch
        # (many times the intervals left once the migrations that cover them are merged in:
        # docs/performance.md has the figures), so merging them all at the end sorted tens of
        # millions of intervals at once (some 5 GB)
        if cover is not None and len(s):
            keep = ~_covered(cover, lid, s, e)
            lid, s, e = lid[keep], s[keep], e[keep]
        piece = Footprints.from_intervals(lid, s, e, n, ps)
        ls.append(piece.launch_of_interval())
        ss.append(piece.start)
        es.append(piece.end)
        # the pieces' intervals merged into one as they grow past what was merged before: the
        # merge at the end (some ten 8-byte temporaries an interval) then sees at most twice the
        # result, not every piece's intervals at once (a launch's faults fall in several pieces)
        held = sum(len(x) for x in ss)
        if held > 2 * merged[0] and held > OBSERVED_ROWS:
            acc = Footprints.from_intervals(np.concatenate(ls), np.concatenate(ss), np.concatenate(es), n, ps)
            ls[:], ss[:], es[:] = [acc.launch_of_interval()], [acc.start], [acc.end]
            merged[0] = len(acc.start)

    for m in _pieces(trace, T.MIGRATIONS, (T.START_NS, T.ADDRESS, T.BYTES, T.CAUSE, T.LAUNCH_ID)):
        m = m.filter(pc.is_in(m.column(T.CAUSE), value_set=causes))
        if m.num_rows:
            s, e = page_span(m.column(T.ADDRESS).to_numpy(), m.column(T.BYTES).to_numpy(), ps)
            add(clock.attribute(m.column(T.LAUNCH_ID), m.column(T.START_NS)), s, e)
    if ls:
        cover = Footprints.from_intervals(np.concatenate(ls), np.concatenate(ss), np.concatenate(es), n, ps)
        ls[:], ss[:], es[:] = [cover.launch_of_interval()], [cover.start], [cover.end]
        merged[0] = len(cover.start)
    for f in _pieces(trace, T.FAULTS, (T.TIME_NS, T.ADDRESS, T.LAUNCH_ID)):
        page = (f.column(T.ADDRESS).to_numpy().astype(np.uint64) // np.uint64(ps)).astype(_I64)
        add(clock.attribute(f.column(T.LAUNCH_ID), f.column(T.TIME_NS)), page, page + 1)
    # the records' buffers (every row group of both tables, read and freed here) go back to the
    # system, not kept by pyarrow's pool: ~65 MB after a scale-10 llm-decode trace, which stayed in
    # a planned replay's high (pagecast/memory.py, docs/performance.md)
    release_arrow_memory()
    if not ls:
        return Footprints.empty(n, ps, "observed")
    return Footprints.from_intervals(np.concatenate(ls), np.concatenate(ss), np.concatenate(es), n, ps, "observed")


OBSERVED_ROWS = 1 << 18   # records per piece of _observed


def _pieces(trace: T.Trace, name: str, columns) -> Iterable[pa.Table]:
    """`trace.batches(name, columns)` in pieces of at most OBSERVED_ROWS records. Each record takes
    some ten 8-byte temporaries in `_observed` (its page, launch, search bounds and merge); a row
    group at once (2^20) was the high of a planned replay of 10^5 launches (~220 MB,
    docs/performance.md). The union is the same piece by piece, so the result does not depend on
    the cut."""
    for t in trace.batches(name, columns, rows=OBSERVED_ROWS):
        yield t
        del t
        release_arrow_memory()   # the piece read and its decoding buffers, before the next is read


def _covered(cover: Footprints, lid: np.ndarray, s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Whether each interval [s, e) of launch `lid` lies inside one of `cover`'s intervals of that
    launch (a launch outside 0..n-1 is not covered)."""
    lid = np.asarray(lid, _I64)
    n = cover.n_launches
    ok = (lid >= 0) & (lid < n)
    if not len(cover.start) or not ok.any():
        return np.zeros(len(lid), bool)
    lc = np.where(ok, lid, 0)
    # the last interval of the launch starting at or before s: searched within the launch's own rows
    lo, hi = cover.indptr[lc], cover.indptr[lc + 1]
    p = _search_rows(cover.start, lo, hi, np.asarray(s, _I64)) - 1
    pp = np.clip(p, 0, len(cover.start) - 1)
    return ok & (p >= lo) & (np.asarray(e, _I64) <= cover.end[pp])


def _search_rows(a: np.ndarray, lo: np.ndarray, hi: np.ndarray, x: np.ndarray) -> np.ndarray:
    """For each i: lo[i] + the number of a[lo[i]:hi[i]] (ascending) that are <= x[i] (a vectorized
    binary search over each row's own slice)."""
    lo, hi = lo.copy(), hi.copy()
    while True:
        act = lo < hi
        if not act.any():
            return lo
        mid = (lo + hi) >> 1
        go = act & (a[np.minimum(mid, len(a) - 1)] <= x)
        lo = np.where(go, mid + 1, lo)
        hi = np.where(act & ~go, mid, hi)


def footprints(trace: T.Trace) -> Footprints:
    """Truth where the trace has it, else the observed footprint."""
    return truth_footprints(trace) if trace.truth is not None else observed_footprints(trace)


def intersection_pages(a: Footprints, b: Footprints) -> np.ndarray:
    """Pages in both footprints, per launch: |A| + |B| - |A u B| (vectorized). The union is made a
    few launches at a time (about INTERSECTION_INTERVALS intervals of both): its merge takes some
    ten 8-byte arrays an interval, and over every launch at once (~700,000 intervals at scale 10)
    that was ~70 MB at a planned replay's high; each launch's count is its own either way."""
    if a.n_launches != b.n_launches:
        raise ValueError("footprints cover different numbers of launches")
    n = a.n_launches
    out = a.pages_per_launch() + b.pages_per_launch()
    both = a.indptr + b.indptr   # intervals of both before each launch
    l0 = 0
    while l0 < n:
        l1 = min(max(l0 + 1, int(np.searchsorted(both, both[l0] + INTERSECTION_INTERVALS, side="right")) - 1), n)
        pa_, pb = a.indptr[l0:l1 + 1], b.indptr[l0:l1 + 1]
        lid = np.concatenate([np.repeat(np.arange(l1 - l0, dtype=_I64), np.diff(pa_)),
                              np.repeat(np.arange(l1 - l0, dtype=_I64), np.diff(pb))])
        u = Footprints.from_intervals(lid, np.concatenate([a.start[pa_[0]:pa_[-1]], b.start[pb[0]:pb[-1]]]),
                                      np.concatenate([a.end[pa_[0]:pa_[-1]], b.end[pb[0]:pb[-1]]]),
                                      l1 - l0, a.page_size)
        out[l0:l1] -= u.pages_per_launch()
        l0 = l1
    return out


INTERSECTION_INTERVALS = 1 << 18   # intervals of both footprints merged at a time (intersection_pages)
