"""The oracle's footprints one launch at a time: a trace's footprints, relocated into this run's address space.

Two ways to get launch t's footprint, the same bytes:

- `footprint(t)`: the trace's intervals looked up and moved one by one in Python (the reference,
  and what the runner did before: 50-700 us a launch on a real trace);
- `footprint_arrays(t)` after `layout()`: every interval's allocation and offset found once, at
  start, in arrays; per launch one compiled call moves them by their allocations' deltas
  (`relocate_kernel`) and the learned deltas come from a precomputed list of the launch's
  pointer words (`observe`). The GPU runner uses it (decide.PRECOMPUTE).
"""

from __future__ import annotations

import bisect
import math
import struct
from typing import Iterator

import numpy as np

from pagecast import trace as T
from pagecast.footprints import footprints

from numba import njit

from pagecast.jit import entry_point

from . import residency_kernels as RK
from .ranges import MAX_PTR, MIN_PTR, UNIT, RangeArrays, merge_ranges, split_by_unit, units_of
from .unit_residency import UnitResidency


@njit(cache=True)
def relocate_kernel(ptr, aj, off, nb, base, known, t, out):
    """Launch t's laid-out intervals moved into this run: (address, nbytes) pairs at out[0:],
    sorted by address; returns count | unmapped bytes << 24 (intervals of allocations whose
    address in this run is not known yet are left out)."""
    lo, hi = ptr[t], ptr[t + 1]
    k = 0
    unmapped = 0
    for i in range(lo, hi):
        j = aj[i]
        if known[j]:
            out[2 * k] = base[j] + off[i]
            out[2 * k + 1] = nb[i]
            k += 1
        else:
            unmapped += nb[i]
    # insertion sort by address (a launch's intervals: few, and nearly sorted already)
    for i in range(1, k):
        a, n = out[2 * i], out[2 * i + 1]
        m = i - 1
        while m >= 0 and out[2 * m] > a:
            out[2 * m + 2] = out[2 * m]
            out[2 * m + 3] = out[2 * m + 1]
            m -= 1
        out[2 * m + 2] = a
        out[2 * m + 3] = n
    return k | (unmapped << 24)


@njit(cache=True)
def relocate_window(ptr, aj, off, nb, base, known, t0, t1, wptr):
    """Launches t0 .. t1-1's laid-out intervals moved into this run, one launch after the other
    (each sorted by address, as `relocate_kernel`): the flat pairs, launch j's at
    [2*wptr[j], 2*wptr[j+1]); returns (pairs, unmapped bytes)."""
    out = np.empty(2 * max(1, ptr[t1] - ptr[t0]), np.int64)
    k = 0
    unmapped = 0
    wptr[0] = 0
    for t in range(t0, t1):
        r = relocate_kernel(ptr, aj, off, nb, base, known, t, out[2 * k:])
        k += r & 0xFFFFFF
        unmapped += r >> 24
        wptr[t - t0 + 1] = k
    return out[:2 * k], unmapped


class Relocator:
    """Maps a trace's per-launch footprints into the running process's addresses.

    Addresses differ between runs. The trace's launch t and this run's launch
    t pass the same allocations in the same parameter slots, so each pointer
    word pairs a trace allocation with its new address: delta = run value -
    trace value. A footprint range moves by its allocation's delta; ranges in
    allocations not yet seen in any argument are dropped (counted in
    `unmapped_bytes`). The kernel name of every launch is checked against the
    trace; on the first mismatch the relocator stops (`matching` false).
    """

    def __init__(self, trace, fp=None) -> None:
        """`fp`: the trace's footprints (`footprints(trace)`) when the caller has them already."""
        self.trace = trace
        self.n = trace.n_launches
        self.kernels = trace.launches.column(T.KERNEL).to_pylist()
        self.param_data = trace.launches.column(T.PARAM_DATA).to_pylist()
        al = trace.allocations
        self.a_addr = np.asarray(al.column(T.ADDRESS).to_numpy(zero_copy_only=False), dtype=np.int64)
        self.a_bytes = np.asarray(al.column(T.BYTES).to_numpy(zero_copy_only=False), dtype=np.int64)
        self.a_first = trace.column(T.ALLOCATIONS, T.FIRST_LAUNCH).astype(np.int64)
        last = trace.column(T.ALLOCATIONS, T.LAST_LAUNCH).astype(np.int64)
        self.a_last = np.where(last < 0, np.iinfo(np.int64).max, last)
        order = np.argsort(self.a_addr, kind="stable")
        self.order = order
        self.sorted_addr = self.a_addr[order]
        fp = footprints(trace) if fp is None else fp
        ps = fp.page_size
        self.fp_indptr, self.fp_start, self.fp_end, self.ps = fp.indptr, fp.start * ps, fp.end * ps, ps
        self.delta: dict[int, int] = {}
        self.matching = True
        self.mismatch: str | None = None
        self.unmapped_bytes = 0
        # Belady: trace-space unit -> ascending launch ids
        self._future: dict[int, list[int]] | None = None
        self.origin: dict[int, set[int]] = {}   # run-space unit -> trace-space units
        self._laid = False

    # -- laid out once: footprints as (allocation, offset, bytes) rows per launch --------------------
    def layout(self) -> "Relocator":
        """Find every footprint interval's allocation once (cut where an interval passes its
        allocation's end, as `footprint` does), and every launch's pointer words; then
        `footprint_arrays` and `observe` do per launch only what depends on this run."""
        if self._laid:
            return self
        ind = np.asarray(self.fp_indptr, np.int64)
        st, en = np.asarray(self.fp_start, np.int64), np.asarray(self.fp_end, np.int64)
        lid = np.repeat(np.arange(self.n, dtype=np.int64), np.diff(ind))
        a_addr, a_bytes = self.a_addr, self.a_bytes
        if len(a_addr):
            pos = np.searchsorted(self.sorted_addr, st, side="right") - 1
            j = self.order[np.maximum(pos, 0)]
            fits = ((pos >= 0) & (st >= a_addr[j]) & (en <= a_addr[j] + a_bytes[j])
                    & (self.a_first[j] <= lid) & (lid <= self.a_last[j]))
        else:
            j = np.zeros(len(st), np.int64)
            fits = np.zeros(len(st), bool)
        rows = [(lid[fits], j[fits], st[fits] - a_addr[j[fits]], en[fits] - st[fits])]
        # the rest, as footprint() walks them: an address reused by another allocation, a range past
        # its allocation's end, pages in no allocation (skipped)
        xt, xj, xo, xn = [], [], [], []
        for i in np.flatnonzero(~fits).tolist():
            t, a, end = int(lid[i]), int(st[i]), int(en[i])
            while a < end:
                jj = self.find_alloc(a, t)
                if jj is None:
                    a = ((a // self.ps) + 1) * self.ps
                    continue
                b = min(end, int(a_addr[jj] + a_bytes[jj]))
                xt.append(t)
                xj.append(jj)
                xo.append(a - int(a_addr[jj]))
                xn.append(b - a)
                a = b
        rows.append(tuple(np.asarray(x, np.int64) for x in (xt, xj, xo, xn)))
        t_all, j_all, o_all, n_all = (np.concatenate([r[k] for r in rows]) for k in range(4))
        order = np.argsort(t_all, kind="stable")
        self._aj, self._off, self._nb = j_all[order], o_all[order], n_all[order]
        self._ptr = np.zeros(self.n + 1, np.int64)
        np.cumsum(np.bincount(t_all, minlength=self.n)[:self.n], out=self._ptr[1:])
        self._base = np.zeros(max(1, len(a_addr)), np.int64)
        self._known = np.zeros(max(1, len(a_addr)), np.bool_)
        self._out = np.zeros(2 * max(16, int(np.diff(self._ptr).max(initial=0))), np.int64)
        # every launch's pointer words that land in a trace allocation: (word index, allocation)
        words: list[list[tuple[int, int]]] = []
        for t in range(self.n):
            tr = self.param_data[t] or b""
            nw = len(tr) // 8
            pairs = []
            for wi, a in enumerate(struct.unpack_from(f"<{nw}Q", tr) if nw else ()):
                if MIN_PTR <= a < MAX_PTR:
                    jj = self.find_alloc(a, t)
                    if jj is not None:
                        pairs.append((wi, jj, a))
            words.append(pairs)
        self._words = words
        self._run_bases: list[tuple[int, int]] = []   # (address in this run, allocation), sorted
        self._reloc = entry_point(relocate_kernel, self._ptr, self._aj, self._off, self._nb, self._base,
                                  self._known, 0, self._out)
        self._laid = True
        return self

    def _learn(self, j: int, delta: int) -> None:
        self.delta[j] = delta
        if self._laid:
            self._base[j] = int(self.a_addr[j]) + delta
            self._known[j] = True
            bisect.insort(self._run_bases, (int(self.a_addr[j]) + delta, j))

    def footprint_arrays(self, t: int) -> RangeArrays:
        """Launch t's footprint in this run's addresses (after observe(t, ...)), sorted, as arrays
        (`layout()` first): `footprint(t)`'s bytes without a Python step per interval."""
        if not self.matching or t >= self.n:
            return RangeArrays(np.zeros(0, np.int64))
        r = self._reloc(self._ptr, self._aj, self._off, self._nb, self._base, self._known, t, self._out)
        k, unmapped = r & 0xFFFFFF, r >> 24
        self.unmapped_bytes += unmapped
        return RangeArrays(self._out[:2 * k].copy())

    def footprint_window(self, t0: int, t1: int) -> tuple[np.ndarray, np.ndarray]:
        """Launches t0 .. t1-1's footprints in this run's addresses (`layout()` first), in one
        compiled call: (flat address, nbytes pairs; launch t0 + j's pairs at [wptr[j], wptr[j+1]])."""
        wptr = np.zeros(max(0, t1 - t0) + 1, np.int64)
        if not self.matching or t1 <= t0 or t1 > self.n:
            return np.zeros(0, np.int64), wptr
        flat, unmapped = relocate_window(self._ptr, self._aj, self._off, self._nb, self._base, self._known,
                                         t0, t1, wptr)
        self.unmapped_bytes += unmapped
        return flat, wptr

    def run_range(self, j: int) -> tuple[int, int] | None:
        """Trace allocation j's (address, bytes) in this run, once an argument has shown its delta."""
        d = self.delta.get(int(j))
        return None if d is None else (int(self.a_addr[j]) + d, int(self.a_bytes[j]))

    def next_use_scorer(self, unit: int = UNIT) -> "RelocatedNextUse":
        """Belady's next use of a run-space unit, through the allocations it overlaps (`layout()`)."""
        return RelocatedNextUse(self, unit)

    def find_alloc(self, addr: int, t: int) -> int | None:
        """Index of the trace allocation containing addr and live at launch t."""
        i = int(bisect.bisect_right(self.sorted_addr, addr)) - 1
        steps = 0
        while i >= 0 and steps < 64:
            j = int(self.order[i])
            if self.a_addr[j] <= addr < self.a_addr[j] + self.a_bytes[j] and self.a_first[j] <= t <= self.a_last[j]:
                return j
            i -= 1
            steps += 1
        return None

    def first_pointers(self) -> np.ndarray:
        """Per launch (after `layout`): whether one of its pointer words is the first, in launch
        order, into its allocation (where `observe` learns that allocation's delta)."""
        out = np.zeros(self.n, bool)
        seen: set[int] = set()
        for t, ws in enumerate(self._words):
            for _, j, _ in ws:
                if j not in seen:
                    seen.add(j)
                    out[t] = True
        return out

    def learned(self, t: int) -> bool:
        """Whether every allocation launch t's pointer words point into has its delta (after `layout`)."""
        return all(j in self.delta for _, j, _ in self._words[t])

    def observe(self, t: int, kernel: str, param_data: bytes) -> bool:
        """Learn deltas from launch t's arguments; False once the run stops matching the trace."""
        if not self.matching:
            return False
        if t >= self.n or self.kernels[t] != kernel:
            self.matching = False
            want = self.kernels[t] if t < self.n else "(end of trace)"
            self.mismatch = f"launch {t}: the trace has {want!r}, the run launched {kernel!r}"
            return False
        if self._laid:
            for wi, j, a in self._words[t]:
                if j not in self.delta and 8 * wi + 8 <= len(param_data):
                    self._learn(j, struct.unpack_from("<Q", param_data, 8 * wi)[0] - a)
            return True
        tr = self.param_data[t] or b""
        nw = min(len(tr), len(param_data)) // 8
        if nw:
            tw = struct.unpack_from(f"<{nw}Q", tr)
            rw = struct.unpack_from(f"<{nw}Q", param_data)
            for a, b in zip(tw, rw):
                if a < MIN_PTR or a >= MAX_PTR:
                    continue
                j = self.find_alloc(a, t)
                if j is not None and j not in self.delta:
                    self.delta[j] = b - a
        return True

    def trace_ranges(self, t: int) -> list[tuple[int, int]]:
        lo, hi = int(self.fp_indptr[t]), int(self.fp_indptr[t + 1])
        return [(int(s), int(e - s)) for s, e in zip(self.fp_start[lo:hi], self.fp_end[lo:hi])]

    def footprint(self, t: int, unit: int = UNIT) -> list[tuple[int, int]]:
        """Launch t's footprint in this run's addresses (after observe(t, ...))."""
        if not self.matching or t >= self.n:
            return []
        out = []
        for a, n in self.trace_ranges(t):
            end = a + n
            while a < end:
                j = self.find_alloc(a, t)
                if j is None:
                    a = ((a // self.ps) + 1) * self.ps  # not in any allocation: skip a page
                    continue
                b = min(end, int(self.a_addr[j] + self.a_bytes[j]))
                d = self.delta.get(j)
                if d is None:
                    self.unmapped_bytes += b - a
                else:
                    out.append((a + d, b - a))
                    for ru, tus in _unit_origin(a, b - a, d, unit):
                        self.origin.setdefault(ru, set()).update(tus)
                a = b
        return merge_ranges(out)

    def future_uses(self, unit: int = UNIT) -> dict[int, list[int]]:
        """Trace-space unit -> ascending launch ids that touch it (for Belady)."""
        if self._future is None and self._laid:
            # in arrays: every (unit, launch) an interval spans, deduplicated, grouped by unit
            lid = np.repeat(np.arange(self.n, dtype=np.int64), np.diff(self.fp_indptr))
            s0 = np.asarray(self.fp_start, np.int64) // unit
            s1 = (np.asarray(self.fp_end, np.int64) - 1) // unit + 1
            cnt = s1 - s0
            rep = np.repeat(np.arange(len(s0)), cnt)
            first = np.repeat(np.cumsum(cnt) - cnt, cnt)
            u = s0[rep] + (np.arange(int(cnt.sum())) - first)
            key = np.unique(np.stack([u, lid[rep]], axis=1), axis=0) if len(u) else np.zeros((0, 2), np.int64)
            fut: dict[int, list[int]] = {}
            if len(key):
                cut = np.flatnonzero(np.diff(key[:, 0])) + 1
                for grp in np.split(key, cut):
                    fut[int(grp[0, 0])] = grp[:, 1].tolist()
            self._future = fut
        if self._future is None:
            fut: dict[int, list[int]] = {}
            for t in range(self.n):
                for u in units_of(self.trace_ranges(t), unit):
                    fut.setdefault(u, []).append(t)
            self._future = fut
        return self._future


def _unit_origin(a: int, n: int, delta: int, unit: int) -> Iterator[tuple[int, set[int]]]:
    """For a trace range moved by delta: run-space unit -> the trace-space units it came from."""
    for ra, rn in split_by_unit([(a + delta, n)], unit).items():
        srcs = units_of([(x - delta, m) for x, m in rn], unit)
        yield ra, srcs


@njit(cache=True)
def next_use_scores(units, t, unit, runmap, widest, uses, out):
    """`RelocatedNextUse.score` of each of `units` at launch t, into out (float64), in one call:
    `runmap`, the run's allocations sorted by base (bases, allocation ids) with their sizes and
    deltas, and `uses`, the trace units' future uses as CSR (unit ids sorted, indptr, launches)."""
    rb_base, rb_j, a_bytes, delta = runmap
    ukeys, uptr, ulaunch = uses
    for x in range(len(units)):
        u = units[x]
        lo, hi = u * unit, (u + 1) * unit
        i = np.searchsorted(rb_base, hi) - 1
        best = np.inf
        while i >= 0:
            b, j = rb_base[i], rb_j[i]
            size = a_bytes[j]
            if b + size <= lo:
                if b + widest <= lo:
                    break
                i -= 1
                continue
            d = delta[j]
            a0, a1 = max(lo, b) - d, min(hi, b + size) - d
            for tu in range(a0 // unit, (a1 - 1) // unit + 1):
                k = np.searchsorted(ukeys, tu)
                if k < len(ukeys) and ukeys[k] == tu:
                    p0, p1 = uptr[k], uptr[k + 1]
                    q = p0 + np.searchsorted(ulaunch[p0:p1], t, side="right")
                    if q < p1 and ulaunch[q] - t < best:
                        best = float(ulaunch[q] - t)
            i -= 1
        out[x] = best


@njit(cache=True)
def step_scored(rs, src, wspec, espec, t, flags, unit, runmap, widest, uses):
    """`residency_kernels.step` with the plan's Belady scores filled in by `next_use_scores` where
    it asks for them, in one compiled call (no Python between the two steps); returns the step's
    code, or ST_GROW (Python grows the state and calls again)."""
    r = RK.step(rs, src, wspec, espec, t, flags)
    if r != RK.ST_SCORES:
        return r
    io = rs[RK.R_IO]
    n = rs[rs[RK.R_SCAL] + RK.S_CANDN]
    units = rs[io:io + 2 * n:2].copy()
    out = np.empty(n, np.float64)
    next_use_scores(units, t, unit, runmap, widest, uses, out)
    view = rs[io:io + 2 * n].view(np.float64)
    for i in range(n):
        view[2 * i + 1] = out[i]
    return RK.step(rs, src, wspec, espec, t, flags | RK.FL_SCORED)


class RelocatedNextUse:
    """Belady's victim score (the distance to the next use, larger first) of a unit in this run's
    address space: its bytes lie in allocations whose delta is known, which map them to the
    trace's units, whose future uses the trace lists (`Relocator.future_uses`). `scores` gives a
    launch's candidates theirs in one compiled call (`next_use_scores`); `score` one at a time, the
    reference."""

    def __init__(self, rel: Relocator, unit: int = UNIT) -> None:
        self.rel = rel
        self.unit = unit
        self.uses = rel.future_uses(unit)
        self.widest = int(rel.a_bytes.max()) if len(rel.a_bytes) else 0
        keys = sorted(self.uses)
        self._ukeys = np.asarray(keys, np.int64)
        lens = np.fromiter((len(self.uses[k]) for k in keys), np.int64, len(keys))
        self._uptr = np.zeros(len(keys) + 1, np.int64)
        np.cumsum(lens, out=self._uptr[1:])
        self._ulaunch = (np.concatenate([np.asarray(self.uses[k], np.int64) for k in keys]) if keys
                         else np.zeros(0, np.int64))
        self._delta = np.zeros(max(1, len(rel.a_addr)), np.int64)
        self._rb: tuple | None = None   # (count, bases, allocations) of rel._run_bases when last laid out
        self._f = None
        self._step = None

    def _refresh(self) -> None:
        rel = self.rel
        rb = rel._run_bases
        if self._rb is None or self._rb[0] != len(rb):   # allocations learned since: laid out again
            for j, d in rel.delta.items():
                self._delta[j] = d
            self._rb = (len(rb), np.asarray([b for b, _ in rb], np.int64), np.asarray([j for _, j in rb], np.int64))
            self._runmap = (self._rb[1], self._rb[2], rel.a_bytes, self._delta)
            self._uses = (self._ukeys, self._uptr, self._ulaunch)

    def step(self, rs: np.ndarray, src: np.ndarray, wspec: int, espec: int, t: int, flags: int) -> int:
        """A residency step (unit_residency.py) scored by this plan in the same compiled call
        (`step_scored`)."""
        self._refresh()
        if self._step is None:   # compiled on a probe's state (entry_point runs it once)
            probe = UnitResidency(2 * self.unit, self.unit).rs
            self._step = entry_point(step_scored, probe, np.array([0, 4096], np.int64), 1, -1, 0, RK.FL_KNOWN,
                                     int(self.unit), self._runmap, int(self.widest), self._uses)
        return self._step(rs, src, wspec, espec, t, flags, self.unit, self._runmap, self.widest, self._uses)

    def scores(self, units: np.ndarray, t: int) -> np.ndarray:
        """The scores of `units` (int64) at launch t, as float64."""
        self._refresh()
        out = np.empty(len(units), np.float64)
        if self._f is None:
            self._f = entry_point(next_use_scores, units, int(t), int(self.unit), self._runmap, int(self.widest),
                                  self._uses, out)
        self._f(units, t, self.unit, self._runmap, self.widest, self._uses, out)
        return out

    def score(self, u: int, t: int) -> float:
        rel, unit = self.rel, self.unit
        lo, hi = u * unit, (u + 1) * unit
        bases = rel._run_bases
        i = bisect.bisect_right(bases, (hi, -1)) - 1
        best = math.inf
        while i >= 0:
            b, j = bases[i]
            size = int(rel.a_bytes[j])
            if b + size <= lo:
                if b + self.widest <= lo:
                    break
                i -= 1
                continue
            d = rel.delta[j]
            a0, a1 = max(lo, b) - d, min(hi, b + size) - d
            for tu in range(a0 // unit, (a1 - 1) // unit + 1):
                arr = self.uses.get(tu)
                if arr:
                    k = bisect.bisect_right(arr, t)
                    if k < len(arr) and arr[k] - t < best:
                        best = float(arr[k] - t)
            i -= 1
        return best
