"""The oracle's footprints one launch at a time: a trace's footprints, relocated into this run's address space."""

from __future__ import annotations

import bisect
import struct
from typing import Iterator

import numpy as np

from pagecast import trace as T
from pagecast.footprints import footprints

from .ranges import MAX_PTR, MIN_PTR, UNIT, merge_ranges, split_by_unit, units_of


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

    def observe(self, t: int, kernel: str, param_data: bytes) -> bool:
        """Learn deltas from launch t's arguments; False once the run stops matching the trace."""
        if not self.matching:
            return False
        if t >= self.n or self.kernels[t] != kernel:
            self.matching = False
            want = self.kernels[t] if t < self.n else "(end of trace)"
            self.mismatch = f"launch {t}: the trace has {want!r}, the run launched {kernel!r}"
            return False
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
