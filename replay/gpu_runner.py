"""The GPU backend of `pagecast replay`, and `pagecast.prefetching` for users' own programs.

How a GPU replay runs
---------------------
`run_gpu_replay(args)` (called by the replay command with `--backend gpu`) runs
the workload once per (capacity, policy, repeat), each time in a fresh
subprocess: `python -m pagecast.replay.gpu_runner --policy P ... -- python
SCRIPT ARGS`. The child subscribes to kernel launches with the collector's
`pagecast.collect.launch_hook.LaunchHook`, starts CUPTI's unified-memory
counters (`cuda_iface.CuptiMonitor`), runs the script in-process (runpy), waits
for the GPU and writes its measurements as JSON to a file the parent names. The
parent takes the median and the spread over repeats and returns rows shaped as
the simulator's (cli.md `replay --json`, `backend: "gpu"`).

At each launch (CUPTI API-enter callback, before the kernel is queued) the
`Engine` does what the policy says:

- `demand`: adds nothing (the driver faults pages in);
- `alloc`: prefetches to the GPU the whole managed allocation each pointer
  argument lands in;
- `template`: predicts the launch's footprint from its live arguments with the
  model (`pagecast.predict.predictor.OnlinePredictor`) and prefetches the merged
  predicted ranges; with `--feedback`, faults the prediction missed refine the
  model (`pagecast.predict.feedback.apply_feedback`) as CUPTI delivers them;
- `oracle`: prefetches the launch's real footprint, read from a matching
  full-mode trace of the same workload and relocated into this run's address
  space (see `Relocator`).

Prefetches go on the launch's own stream, so they complete before the kernel.

Capacity emulation
------------------
`--capacity` / `--oversub` emulate a smaller GPU without oversubscribing the
real one: the engine keeps a residency estimate (`Residency`: the bytes it
believes are on the GPU, grouped in 2 MiB units) and, before a launch whose
estimated footprint would not fit, moves victim units to the host (`cuMemPrefetchAsync` to
the CPU) on a side stream. The side stream first waits for the work already
queued on the launch's stream (earlier kernels may still need the victims), and
the launch's stream waits for the eviction before the kernel, so eviction
overlaps population but never a kernel. A launch's estimated footprint is, in order of preference:
the relocated footprint from a matching trace, the model's prediction, or the
whole allocations its pointer arguments land in; what a policy prefetches is
added to it. Victims:

- `demand`, `alloc`: FIFO of 2 MiB units in the order they became resident,
  as the driver's eviction (its victim list is ordered by allocation);
- `template`: furthest predicted next use. Only the current launch is known
  ahead of time, so the next use of a unit is predicted from the kernel
  sequence seen so far: when the launch sequence is periodic with period P
  (training steps, decode steps, solver sweeps; `PeriodDetector`), a unit used
  at launch s in the last period is predicted to be used again at s + P, and a
  unit not used in the last period is predicted never to be used again (first
  victim); until a period is found, least recently used;
- `oracle`: Belady's OPT, with next uses read from the trace.

Real oversubscription (a workload larger than the GPU's free memory) is refused
unless `--allow-oversubscription` is given.

The first repeat of each run also reports a per-kernel timeline (kernel times
from CUPTI, faults and migrated bytes attributed to kernels by time), which the
replay command writes beside the results (RESULTS.timeline.parquet).

Timing: `time_s` is the GPU part of the workload, host wall time from the first
kernel launch to the completion of all GPU work (a synchronize after the
script returns); `wall_s` is the whole script including Python start-up and
imports; `gpu_kernel_s` is the sum of kernel durations (CUPTI). Stall time is
not measurable from outside the kernels (`stall_s` is null).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import math
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from pagecast.errors import NoGPUError, PagecastError, UsageError

UNIT = 2 * 1024 * 1024          # eviction unit: the driver's 2 MiB root chunk (background.md)
POLICIES = ("demand", "alloc", "template", "oracle")
VICTIMS = {"demand": "fifo", "alloc": "fifo", "template": "next-use", "oracle": "belady"}
PER_THREAD_STREAM = 0x2         # CU_STREAM_PER_THREAD
TIMELINE_MAX = 100_000          # launches per run kept in the timeline
_MIN_PTR = 1 << 16
_MAX_PTR = 1 << 57


class GpuRunError(PagecastError):
    """The workload failed under the runner (exit 1: not the user's flags)."""

    exit_code = 1


# ---------------------------------------------------------------------------
# Byte ranges (pure)
# ---------------------------------------------------------------------------

def merge_ranges(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge (address, nbytes) ranges that overlap or touch; drop empty ones; sorted."""
    rs = sorted((int(a), int(a) + int(n)) for a, n in ranges if int(n) > 0)
    out: list[list[int]] = []
    for a, b in rs:
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1][1] = b
        else:
            out.append([a, b])
    return [(a, b - a) for a, b in out]


def units_of(ranges: Iterable[tuple[int, int]], unit: int = UNIT) -> set[int]:
    s: set[int] = set()
    for a, n in ranges:
        if n > 0:
            s.update(range(a // unit, (a + n - 1) // unit + 1))
    return s


def split_by_unit(ranges: Iterable[tuple[int, int]], unit: int = UNIT) -> dict[int, list[tuple[int, int]]]:
    """The part of each range inside each unit: unit -> [(address, nbytes)]."""
    out: dict[int, list[tuple[int, int]]] = {}
    for a, n in ranges:
        end = a + n
        while a < end:
            u = a // unit
            b = min(end, (u + 1) * unit)
            out.setdefault(u, []).append((a, b - a))
            a = b
    return out


def subtract_ranges(ranges: Iterable[tuple[int, int]], minus: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of `ranges` not covered by `minus` (both (address, nbytes)); merged, sorted."""
    a = merge_ranges(ranges)
    b = merge_ranges(minus)
    out: list[tuple[int, int]] = []
    j = 0
    for s, n in a:
        e = s + n
        while j < len(b) and b[j][0] + b[j][1] <= s:
            j += 1
        k = j
        cur = s
        while k < len(b) and b[k][0] < e:
            bs, be = b[k][0], b[k][0] + b[k][1]
            if bs > cur:
                out.append((cur, bs - cur))
            cur = max(cur, be)
            k += 1
        if cur < e:
            out.append((cur, e - cur))
    return out


class AllocationMap:
    """Which allocation a pointer lands in, cached over `CudaIface.allocation_of`.

    Hits are served from sorted bases (bisect); misses ask the driver once and
    are remembered (negative answers in a bounded set). Freed and reused
    addresses are not noticed: workloads with pooling allocators (CuPy,
    PyTorch) rarely return memory to the driver while running.
    """

    def __init__(self, lookup: Callable[[int], Any]) -> None:
        self._lookup = lookup
        self._bases: list[int] = []
        self._allocs: list[Any] = []
        self._miss: set[int] = set()

    def find(self, addr: int):
        i = bisect.bisect_right(self._bases, addr) - 1
        if i >= 0:
            a = self._allocs[i]
            if addr < a.base + a.size:
                return a
        if addr < _MIN_PTR or addr >= _MAX_PTR or addr in self._miss:
            return None
        a = self._lookup(addr)
        if a is None:
            if len(self._miss) > 100_000:
                self._miss.clear()
            self._miss.add(addr)
            return None
        j = bisect.bisect_left(self._bases, a.base)
        if j < len(self._bases) and self._bases[j] == a.base:
            self._allocs[j] = a
        else:
            self._bases.insert(j, a.base)
            self._allocs.insert(j, a)
        return a

    def managed(self) -> list:
        return [a for a in self._allocs if a.managed]

    def clip(self, ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
        """Keep the parts of ranges that lie in managed allocations (prefetch fails elsewhere)."""
        out = []
        last = None
        for a, n in ranges:
            end = a + n
            if last is not None and last.base <= a and end <= last.base + last.size:
                out.append((a, n))   # fast path: inside the allocation of the previous range
                continue
            while a < end:
                al = self.find(a)
                if al is None:
                    # skip to the next known allocation inside the range, if any
                    i = bisect.bisect_right(self._bases, a)
                    if i >= len(self._bases) or self._bases[i] >= end:
                        break
                    a = self._bases[i]
                    continue
                b = min(end, al.base + al.size)
                if al.managed:
                    out.append((a, b - a))
                    last = al
                a = b
        return merge_ranges(out)


def pointer_words(param_data: bytes) -> list[int]:
    """Every 8-byte-aligned little-endian word of a parameter buffer that could be a pointer."""
    n = len(param_data) // 8
    if n == 0:
        return []
    words = struct.unpack_from(f"<{n}Q", param_data)
    return [w for w in words if _MIN_PTR <= w < _MAX_PTR]


def allocation_ranges(param_data: bytes, allocs: AllocationMap) -> list[tuple[int, int]]:
    """The whole managed allocations the launch's pointer arguments land in (the `alloc` policy)."""
    out = []
    for w in pointer_words(param_data):
        a = allocs.find(w)
        if a is not None and a.managed:
            out.append((a.base, a.size))
    return merge_ranges(out)


# ---------------------------------------------------------------------------
# Next-use prediction and the residency estimate (pure)
# ---------------------------------------------------------------------------

class PeriodDetector:
    """The period of the kernel-name sequence seen so far, if it repeats.

    P is accepted when the last max(P, min_match) launches equal the ones P
    before them. Checked in O(1) per launch while it holds; when it breaks,
    searched again among the distances back to earlier launches of the same
    kernel (smallest first, up to max_period), at most every `search_every`
    launches, backing off (up to 32x) while the sequence stays aperiodic.
    """

    def __init__(self, max_period: int = 1024, min_match: int = 16, search_every: int = 8) -> None:
        self.max_period = max_period
        self.min_match = min_match
        self.search_every = search_every
        self.seq: list[int] = []
        self.period: int | None = None
        self._ids: dict[str, int] = {}
        self._pos: dict[int, deque] = {}
        self._next_search = 0
        self._backoff = 1

    def observe(self, kernel: str) -> int | None:
        k = self._ids.setdefault(kernel, len(self._ids))
        seq = self.seq
        seq.append(k)
        t = len(seq) - 1
        pos = self._pos.get(k)
        if pos is None:
            pos = self._pos[k] = deque()
        if self.period is not None and seq[t - self.period] == k:
            pass
        else:
            self.period = None
            if t >= self._next_search:
                self.period, checked = self._search(pos)
                if self.period is None and checked:
                    self._backoff = min(self._backoff * 2, 32)   # a real miss, not too little history
                elif self.period is not None:
                    self._backoff = 1
                self._next_search = t + self.search_every * self._backoff
        pos.append(t)
        while pos and pos[0] < t - self.max_period:
            pos.popleft()
        return self.period

    def _search(self, pos: deque) -> tuple[int | None, bool]:
        """(period or None, whether any candidate had enough history to be checked)."""
        seq, n = self.seq, len(self.seq)
        t = n - 1
        checked = False
        for prev in reversed(pos):        # nearest earlier launch of the same kernel first
            p = t - prev
            if p > self.max_period:
                break
            m = max(p, self.min_match)
            if m + p > n:
                break
            checked = True
            ok = True
            for j in range(n - m, n):
                if seq[j] != seq[j - p]:
                    ok = False
                    break
            if ok:
                return p, True
        return None, checked


class SequenceNextUse:
    """Predicted next use of a unit from the uses seen so far (the template policy's victims).

    With a period P: a unit used at s in (t - P, t] is next used at s + P
    (the earliest such s); a unit unused in the last period, never. Without
    a period: least recently used. Scores are distances (larger: evict first).
    """

    def __init__(self, detector: PeriodDetector, keep: int = 4096) -> None:
        self.detector = detector
        self.keep = keep
        self.uses: dict[int, deque] = {}

    def record(self, t: int, units: Iterable[int]) -> None:
        for u in units:
            d = self.uses.get(u)
            if d is None:
                d = self.uses[u] = deque()
            if not d or d[-1] != t:
                d.append(t)
            while d and d[0] < t - self.keep:
                d.popleft()

    def forget(self, u: int) -> None:
        pass  # use history outlives residency: an evicted unit's pattern still predicts

    def score(self, u: int, t: int) -> float:
        d = self.uses.get(u)
        if not d:
            return math.inf
        p = self.detector.period
        if p is None:
            return float(t - d[-1])  # LRU
        lo = t - p
        for s in d:  # ascending
            if s > lo:
                return float(s + p - t)
        return math.inf


class FutureNextUse:
    """Belady's next use from known future uses: uses[key] = ascending launch ids."""

    def __init__(self, uses: dict[Any, Sequence[int]], keys_of: Callable[[int], Iterable[Any]]) -> None:
        self.uses = uses
        self.keys_of = keys_of

    def score(self, u: int, t: int) -> float:
        best = math.inf
        for k in self.keys_of(u):
            arr = self.uses.get(k)
            if arr is None or len(arr) == 0:
                continue
            i = bisect.bisect_right(arr, t)
            if i < len(arr):
                best = min(best, float(arr[i] - t))
        return best


class Residency:
    """The runner's estimate of what is on the emulated GPU: byte ranges, grouped in `unit` chunks.

    `admit(ranges, t)` makes room for a launch's ranges and records them as
    resident; it returns the byte ranges to evict first (to the host). The
    capacity is counted in resident bytes (as `--oversub` divides a footprint
    counted in pages); victims are whole units (the driver evicts 2 MiB
    chunks). The launch's own units are never victims; when its own bytes
    alone exceed the capacity everything else is evicted and the launch counts
    as an overflow (the driver would thrash inside the kernel).

    victim: `fifo` (order of becoming resident), `lru` (order of last use),
    `next-use` / `belady` (largest `next_use.score(unit, t)` first).
    """

    def __init__(self, capacity_bytes: int, unit: int = UNIT, victim: str = "fifo",
                 next_use: Any = None) -> None:
        if victim not in ("fifo", "lru", "next-use", "belady"):
            raise ValueError(f"unknown victim rule {victim!r}")
        if victim in ("next-use", "belady") and next_use is None:
            raise ValueError(f"victim rule {victim!r} needs a next_use scorer")
        self.capacity = max(1, int(capacity_bytes))
        self.capacity_units = max(1, self.capacity // unit)
        self.unit = unit
        self.victim = victim
        self.next_use = next_use
        self.resident: OrderedDict[int, list[tuple[int, int]]] = OrderedDict()
        self._bytes: dict[int, int] = {}
        self.resident_bytes = 0
        self.overflows = 0
        self.evicted_bytes = 0
        self.evictions = 0

    @property
    def resident_units(self) -> int:
        return len(self.resident)

    def missing(self, ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
        """The parts of `ranges` the estimate does not already hold (what a prefetch must still move)."""
        out: list[tuple[int, int]] = []
        for u, rs in split_by_unit(merge_ranges(ranges), self.unit).items():
            have = self.resident.get(u)
            out.extend(subtract_ranges(rs, have) if have else rs)
        return merge_ranges(out)

    def admit(self, ranges: Iterable[tuple[int, int]], t: int) -> list[tuple[int, int]]:
        parts = split_by_unit(merge_ranges(ranges), self.unit)
        merged: dict[int, tuple[list[tuple[int, int]], int]] = {}
        growth = own = 0
        for u, rs in parts.items():
            m = merge_ranges(self.resident.get(u, []) + rs)
            b = sum(n for _, n in m)
            merged[u] = (m, b)
            growth += b - self._bytes.get(u, 0)
            own += b
        over = self.resident_bytes + growth - self.capacity
        victims: list[int] = []
        if over > 0:
            victims = self._victims(set(parts), over, t)
            if own > self.capacity:
                self.overflows += 1
        out: list[tuple[int, int]] = []
        for u in victims:
            out.extend(self.resident.pop(u))
            self.resident_bytes -= self._bytes.pop(u)
        for u, (m, b) in merged.items():
            if u in self.resident:
                self.resident[u] = m
                if self.victim == "lru":
                    self.resident.move_to_end(u)
            else:
                self.resident[u] = m
            self.resident_bytes += b - self._bytes.get(u, 0)
            self._bytes[u] = b
        out = merge_ranges(out)
        self.evictions += len(victims)
        self.evicted_bytes += sum(n for _, n in out)
        return out

    def _victims(self, need: set[int], over: int, t: int) -> list[int]:
        """Units to evict, in victim order, until `over` bytes are freed (or nothing else is left)."""
        cands: Iterable[int] = (u for u in self.resident if u not in need)
        if self.victim not in ("fifo", "lru"):
            cands = [u for _, u in sorted(((self.next_use.score(u, t), u) for u in cands),
                                          key=lambda x: (-x[0], x[1]))]
        out, freed = [], 0
        for u in cands:
            out.append(u)
            freed += self._bytes[u]
            if freed >= over:
                break
        return out


# ---------------------------------------------------------------------------
# The oracle: a trace's footprints, relocated into this run's address space
# ---------------------------------------------------------------------------

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

    def __init__(self, trace) -> None:
        import numpy as np

        from pagecast import trace as T
        from pagecast.footprints import footprints

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
        fp = footprints(trace)
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
                if a < _MIN_PTR or a >= _MAX_PTR:
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


# ---------------------------------------------------------------------------
# The engine: what happens at each launch
# ---------------------------------------------------------------------------

_PTSZ: frozenset | None = None


def launch_stream(la) -> int:
    """The CUstream handle a launch runs on (0 in a *_ptsz call is the per-thread stream)."""
    global _PTSZ
    s = int(la.stream or 0)
    if s == 0:
        if _PTSZ is None:
            try:
                from pagecast.collect.launch_hook import PTSZ_CBIDS
                _PTSZ = frozenset(PTSZ_CBIDS)
            except Exception:  # noqa: BLE001
                _PTSZ = frozenset()
        if int(getattr(la, "cbid", 0) or 0) in _PTSZ:
            return PER_THREAD_STREAM
    return s


@dataclass
class EngineStats:
    launches: int = 0
    prefetch_bytes: int = 0
    prefetches: int = 0
    evict_bytes: int = 0
    evictions: int = 0
    overflow_launches: int = 0
    predict_s: float = 0.0
    predict_max_s: float = 0.0
    predicted_launches: int = 0
    callback_s: float = 0.0
    errors: int = 0
    last_error: str | None = None
    unseen_kernels: list = field(default_factory=list)
    feedback_updates: int = 0
    period: int | None = None

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["predict_us_mean"] = (1e6 * self.predict_s / self.predicted_launches) if self.predicted_launches else None
        d["predict_us_max"] = 1e6 * self.predict_max_s if self.predicted_launches else None
        return d


class Engine:
    """Applies one policy at each launch: prefetch, and evict to emulate a capacity.

    `on_launch(la)` takes the collector's `LaunchArgs`. `cuda` is a
    `cuda_iface.CudaIface`; `predict(la, allocs) -> [(address, nbytes)]` is the
    online prediction (template policy and the footprint estimate); `relocator`
    a `Relocator` for the oracle; `model_kernels` the kernels the model knows
    (None: do not check).
    """

    def __init__(self, cuda, policy: str, *, capacity: int | None = None,
                 predict: Callable[[Any, AllocationMap], list[tuple[int, int]]] | None = None,
                 relocator: Relocator | None = None, model_kernels: Iterable[str] | None = None,
                 warn: Callable[[str], None] | None = None, unit: int = UNIT) -> None:
        if policy not in POLICIES:
            raise UsageError(f"unknown policy {policy!r} for the GPU backend (choose from {', '.join(POLICIES)})")
        if policy == "template" and predict is None:
            raise UsageError("policy template needs a model (--model MODEL)")
        if policy == "oracle" and relocator is None:
            raise UsageError("policy oracle needs a matching full-mode trace of the workload")
        self.cuda = cuda
        self.policy = policy
        self.capacity = capacity
        self.predict = predict
        self.relocator = relocator
        self.model_kernels = set(model_kernels) if model_kernels is not None else None
        self.warn = warn or (lambda m: None)
        self.unit = unit
        self.allocs = AllocationMap(cuda.allocation_of)
        self.stats = EngineStats()
        self.detector = PeriodDetector()
        self.t = 0
        self.history: deque = deque(maxlen=4096)   # (t, correlation_id, la, predicted ranges)
        self.corr_launch: dict[int, int] = {}       # correlation id -> launch index (timeline), bounded
        self.residency: Residency | None = None
        self._seq_next = SequenceNextUse(self.detector)
        if capacity is not None:
            victim = VICTIMS[policy]
            scorer = None
            if victim == "next-use":
                scorer = self._seq_next
            elif victim == "belady":
                fut = relocator.future_uses(unit)
                scorer = FutureNextUse(fut, lambda u: relocator.origin.get(u, ()))
            self.residency = Residency(capacity, unit, victim, scorer)
        self._evict_stream: int | None = None
        self._evict_event: int | None = None
        self._queued_event: int | None = None

    # -- per launch -----------------------------------------------------------
    def on_launch(self, la) -> None:
        t0 = time.perf_counter()
        t = self.t
        self.t += 1
        st = self.stats
        st.launches += 1
        try:
            self._launch(t, la)
        except Exception as e:  # noqa: BLE001 - never break the workload's launch
            st.errors += 1
            st.last_error = f"launch {t} ({la.kernel}): {type(e).__name__}: {e}"
        st.callback_s += time.perf_counter() - t0

    def _launch(self, t: int, la) -> None:
        st = self.stats
        kernel = la.kernel
        if self.model_kernels is not None and kernel not in self.model_kernels and kernel not in st.unseen_kernels:
            st.unseen_kernels.append(kernel)
            self.warn(f"kernel {kernel!r} (launch {t}) is not in the model: "
                      "it gets the fallback prediction")
        st.period = self.detector.observe(kernel)
        data = bytes(la.param_data or b"")
        if self.relocator is not None and self.relocator.matching:
            if not self.relocator.observe(t, kernel, data):
                self.warn(f"the run no longer matches the trace ({self.relocator.mismatch});"
                          " the oracle stops prefetching from here")

        predicted: list[tuple[int, int]] | None = None
        if self.predict is not None and (self.policy == "template" or self.residency is not None):
            p0 = time.perf_counter()
            predicted = self.allocs.clip(self.predict(la, self.allocs))
            dt = time.perf_counter() - p0
            st.predict_s += dt
            st.predict_max_s = max(st.predict_max_s, dt)
            st.predicted_launches += 1

        if self.policy == "alloc":
            prefetch = allocation_ranges(data, self.allocs)
        elif self.policy == "template":
            prefetch = predicted or []
        elif self.policy == "oracle":
            prefetch = self.allocs.clip(self.relocator.footprint(t, self.unit))
        else:
            prefetch = []
        corr = int(getattr(la, "correlation_id", 0) or 0)
        self.history.append((t, corr, la, predicted))
        if len(self.corr_launch) < TIMELINE_MAX:
            self.corr_launch[corr] = t

        stream = launch_stream(la)
        if self.residency is not None:
            # with an emulated capacity the estimate knows what is already there: move only the rest
            # (pages the host touched in between fault back in; that costs time, never correctness)
            prefetch = self.residency.missing(prefetch)
            estimate = self._estimate(t, la, data, predicted, prefetch)
            admitted = merge_ranges(list(estimate) + list(prefetch))
            if self.residency.victim == "next-use":
                self._seq_next.record(t, units_of(admitted, self.unit))
            overflow_before = self.residency.overflows
            evict = self.residency.admit(admitted, t)
            if self.residency.overflows > overflow_before:
                st.overflow_launches += 1
            if evict:
                if self._evict_stream is None:
                    self._evict_stream = self.cuda.new_stream()
                    self._evict_event = self.cuda.new_event()
                    self._queued_event = self.cuda.new_event()
                # evict only after the work already queued on the launch's stream (launches are
                # asynchronous: earlier kernels may not have run yet and may need the victims)
                self.cuda.record_event(self._queued_event, stream)
                self.cuda.stream_wait_event(self._evict_stream, self._queued_event)
                for a, n in evict:
                    self.cuda.prefetch_to_host(a, n, self._evict_stream)
                    st.evict_bytes += n
                    st.evictions += 1
                self.cuda.record_event(self._evict_event, self._evict_stream)
        else:
            evict = []
        for a, n in prefetch:
            self.cuda.prefetch_to_gpu(a, n, stream)
            st.prefetch_bytes += n
            st.prefetches += 1
        if evict:
            # the kernel starts only once its room is made; population above overlaps the eviction
            self.cuda.stream_wait_event(stream, self._evict_event)

    def _estimate(self, t: int, la, data: bytes, predicted, prefetch) -> list[tuple[int, int]]:
        """What launch t will touch, for the residency estimate (see the module docstring)."""
        if self.relocator is not None and self.relocator.matching:
            if self.policy == "oracle":
                return prefetch
            return self.allocs.clip(self.relocator.footprint(t, self.unit))
        if predicted is not None:
            return predicted
        return allocation_ranges(data, self.allocs)

    # -- feedback -------------------------------------------------------------
    def feedback_from(self, faults: list, kernels: list, apply: Callable[[Any, list[tuple[int, int]]], bool],
                      page_size: int = 4096) -> tuple[int, list]:
        """Hand faults the prediction missed to `apply(la, missed_page_intervals)`.

        `faults`: (time_ns, address, count) records; `kernels`: (start_ns,
        end_ns, correlation_id, name) records. A fault is attributed to the
        launch whose kernel ran when it was recorded (CUPTI kernel records
        carry the launch's correlation id). Returns (launches whose `apply`
        said the model changed, faults recorded after the last known kernel
        ended: their kernel's record may not have arrived yet).
        """
        if not faults:
            return 0, []
        kernels = sorted(kernels)
        if not kernels:
            return 0, list(faults)
        starts = [k[0] for k in kernels]
        last_end = max(k[1] for k in kernels)
        by_corr = {c: (t, la, pred) for t, c, la, pred in self.history}
        missed: dict[int, set[int]] = {}
        later = []
        for rec in faults:
            time_ns, addr = rec[0], rec[1]
            if time_ns > last_end:
                later.append(rec)
                continue
            i = bisect.bisect_right(starts, time_ns) - 1
            if i < 0 or time_ns > kernels[i][1]:
                continue
            corr = kernels[i][2]
            if corr not in by_corr:
                continue
            t, la, pred = by_corr[corr]
            page = addr // page_size
            if pred and any(a // page_size <= page < (a + n + page_size - 1) // page_size for a, n in pred):
                continue
            missed.setdefault(corr, set()).add(page)
        changed = 0
        for corr, pages in missed.items():
            t, la, pred = by_corr[corr]
            ivs: list[tuple[int, int]] = []
            for p in sorted(pages):
                if ivs and ivs[-1][1] == p:
                    ivs[-1] = (ivs[-1][0], p + 1)
                else:
                    ivs.append((p, p + 1))
            if apply(la, ivs):
                changed += 1
        self.stats.feedback_updates += changed
        return changed, later


# ---------------------------------------------------------------------------
# The predictor, through its public seam (pagecast.predict)
# ---------------------------------------------------------------------------

def load_model_file(path):
    from pagecast.predict.model_io import load_model

    return load_model(path)


def model_kernel_names(model) -> set[str] | None:
    """The kernels a model has templates for (None when the model does not say)."""
    for name in ("kernels", "kernel_names"):
        k = getattr(model, name, None)
        if callable(k):
            k = k()
        if isinstance(k, dict):
            return set(k)
        if k is not None:
            try:
                return {getattr(x, "kernel", x) for x in k}
            except TypeError:
                pass
    return None


def _launch_table(las: list, allocs: AllocationMap):
    """A minimal in-memory Trace of the given launches (for the predictor's trace-based seams)."""
    from pagecast import trace as T

    rows = [la.to_row(i) for i, la in enumerate(las)]
    launches = T.to_table(T.LAUNCHES, {k: [r[k] for r in rows] for k in rows[0]})
    managed = allocs.managed()
    allocations = T.to_table(T.ALLOCATIONS, {
        T.ALLOC_ID: list(range(len(managed))), T.ADDRESS: [a.base for a in managed],
        T.BYTES: [a.size for a in managed], T.KIND: ["managed"] * len(managed),
        T.DEVICE: [0] * len(managed), T.FIRST_LAUNCH: [0] * len(managed)})
    empty = {n: T.SCHEMAS[n].empty_table() for n in (T.FAULTS, T.MIGRATIONS)}
    manifest = T.new_manifest(mode="natural", source="gpu-runner")
    manifest["complete"] = True
    return T.Trace(path=Path("<gpu-runner>"), manifest=manifest, launches=launches, allocations=allocations,
                   faults=empty[T.FAULTS], migrations=empty[T.MIGRATIONS])


def make_online_predict(model, fallback: str = "history") -> Callable[[Any, AllocationMap], list[tuple[int, int]]]:
    """`predict(la, allocs) -> [(address, nbytes)]` from the predictor's OnlinePredictor.

    The managed allocations the launch's pointer words land in are handed to
    the predictor (`add_allocation`) the first time they are seen; its page
    intervals come back as byte ranges. The predictor notices model changes
    (feedback) by itself (`Model.version_counter`).
    """
    from pagecast.predict.predictor import OnlinePredictor

    op = OnlinePredictor(model, fallback)
    ps = int(getattr(op, "ps", None) or model.page_size)
    known: set[int] = set()
    seen: set[int] = set()   # pointer words already looked up (bounded below)

    def predict(la, allocs: AllocationMap) -> list[tuple[int, int]]:
        data = bytes(la.param_data or b"")
        for w in pointer_words(data):
            if w in seen:
                continue
            seen.add(w)
            a = allocs.find(w)
            if a is not None and a.managed and a.base not in known:
                op.add_allocation(a.base, a.size)
                known.add(a.base)
        if len(seen) > 1_000_000:
            seen.clear()
        pages = op.predict(la.kernel, data, la.param_offsets, la.param_sizes, la.grid, la.block)
        return [(int(s) * ps, (int(e) - int(s)) * ps) for s, e in pages if e > s]

    predict.online = op  # type: ignore[attr-defined]  (feedback feeds it the pages it missed)
    return predict


# ---------------------------------------------------------------------------
# Workload command (pure)
# ---------------------------------------------------------------------------

def parse_workload(argv: Sequence[str]) -> tuple[str, str, list[str]]:
    """`python SCRIPT ARGS` / `python -m MODULE ARGS` / `SCRIPT.py ARGS` / `-m MODULE ARGS` -> (kind, target, args).

    The runner runs the workload in its own process (CUPTI sees only its own
    process's launches), so it must be Python.
    """
    argv = list(argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise UsageError("the GPU backend needs the workload after '--', e.g. "
                         "'-- python train.py' or '-- python -m pagecast.datasets.gpu.jacobi2d --scale 1'")
    if argv[0] == "-m":
        argv = ["python"] + argv
    first = os.path.basename(argv[0])
    if first.endswith(".py"):
        return "path", argv[0], argv[1:]
    if not (first.startswith("python") or Path(argv[0]).resolve() == Path(sys.executable).resolve()):
        raise UsageError(f"the GPU backend runs Python workloads in-process; {argv[0]!r} is not python "
                         "(write '-- python SCRIPT [ARGS]' or '-- python -m MODULE [ARGS]')")
    rest = argv[1:]
    while rest and rest[0] in ("-u", "-B", "-O", "-X") or (rest and rest[0].startswith("-W")):
        if rest[0] == "-X" and len(rest) > 1:
            rest = rest[2:]
        else:
            rest = rest[1:]
    if not rest:
        raise UsageError("the workload command names no script: write '-- python SCRIPT [ARGS]'")
    if rest[0] == "-m":
        if len(rest) < 2:
            raise UsageError("'-m' needs a module name")
        return "module", rest[1], rest[2:]
    if rest[0].startswith("-"):
        raise UsageError(f"unsupported python option {rest[0]!r} in the workload command")
    return "path", rest[0], rest[1:]


def run_workload(kind: str, target: str, args: list[str]) -> int:
    """Run a Python script or module in this process as `python` would; its exit code."""
    import runpy

    old_argv = sys.argv
    sys.argv = [target if kind == "path" else target] + list(args)
    code = 0
    try:
        if kind == "path":
            if not Path(target).exists():
                raise UsageError(f"{target}: no such workload script")
            sys.path.insert(0, str(Path(target).resolve().parent))
            runpy.run_path(target, run_name="__main__")
        else:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        c = e.code
        code = 0 if c is None else (c if isinstance(c, int) else 1)
    finally:
        sys.argv = old_argv
    return code


# ---------------------------------------------------------------------------
# Aggregation over repeats (pure)
# ---------------------------------------------------------------------------

_SUM_FIELDS = ("faults", "htod_bytes", "dtoh_bytes", "prefetch_bytes", "evict_bytes")


def aggregate(runs: list[dict]) -> dict:
    """Median and spread of repeated measurements of one (policy, capacity)."""
    times = [r["time_s"] for r in runs]
    med = statistics.median(times)
    out = dict(runs[0])
    out["time_s"] = med
    out["time_s_min"] = min(times)
    out["time_s_max"] = max(times)
    out["time_s_spread"] = (max(times) - min(times)) / med if med > 0 else None
    out["repeats"] = len(runs)
    for k in _SUM_FIELDS + ("wall_s", "gpu_kernel_s", "gpu_span_s"):
        vals = [r[k] for r in runs if r.get(k) is not None]
        if vals:
            m = statistics.median(vals)
            out[k] = int(round(m)) if k in _SUM_FIELDS else m
    return out


def add_speedups(rows: list[dict]) -> list[dict]:
    """speedup_vs_demand and fraction_of_oracle within each capacity (null where absent)."""
    by_cap: dict[Any, dict[str, dict]] = {}
    for r in rows:
        by_cap.setdefault(r.get("capacity_bytes"), {})[r["policy"]] = r
    for r in rows:
        peers = by_cap[r.get("capacity_bytes")]
        d = peers.get("demand")
        o = peers.get("oracle")
        r["speedup_vs_demand"] = (d["time_s"] / r["time_s"]) if d and r["time_s"] else None
        r["fraction_of_oracle"] = (o["time_s"] / r["time_s"]) if o and r["time_s"] else None
    return rows


def build_timeline(counts, corr_launch: dict[int, int], limit: int = TIMELINE_MAX) -> dict | None:
    """Per-kernel rows (results_io's timeline columns) from CUPTI's kernel, fault and transfer records.

    A fault counts for the kernel running when it was recorded; a transfer for
    the kernel running when it started, else the next kernel to start (a
    prefetch prepares the launch after it). Times are seconds from the first
    kernel's start. `stall_s` is null: it is not measurable from outside.
    """
    ks = sorted(counts.kernel_records)[:limit]
    if not ks:
        return None
    starts = [k[0] for k in ks]
    n = len(ks)
    faults, htod, dtoh = [0] * n, [0] * n, [0] * n

    def running(time_ns: int) -> int | None:
        i = bisect.bisect_right(starts, time_ns) - 1
        return i if i >= 0 and time_ns <= ks[i][1] else None

    for tm, _addr, cnt in counts.fault_records:
        i = running(tm)
        if i is not None:
            faults[i] += int(cnt)
    for recs, acc in ((counts.htod_records, htod), (counts.dtoh_records, dtoh)):
        for st, _e, _a, nbytes, _cause in recs:
            i = running(st)
            if i is None:
                i = bisect.bisect_right(starts, st)
                if i >= n:
                    continue
            acc[i] += int(nbytes)
    t0 = ks[0][0]
    return {
        "launch_id": [corr_launch.get(k[2]) for k in ks],
        "kernel": [k[3] for k in ks],
        "start_s": [(k[0] - t0) * 1e-9 for k in ks],
        "end_s": [(k[1] - t0) * 1e-9 for k in ks],
        "stall_s": [None] * n,
        "faults": faults, "htod_bytes": htod, "dtoh_bytes": dtoh,
    }


# ---------------------------------------------------------------------------
# The parent: run_gpu_replay
# ---------------------------------------------------------------------------

def _footprint_bytes(trace) -> int:
    from pagecast.footprints import footprints

    fp = footprints(trace)
    return fp.union_pages() * fp.page_size


def _child_cmd(policy: str, capacity: int | None, ns, result: Path, trace_path: str | None) -> list[str]:
    cmd = [sys.executable, "-m", "pagecast.replay.gpu_runner", "--policy", policy, "--result", str(result)]
    if capacity is not None:
        cmd += ["--capacity", str(int(capacity))]
    if getattr(ns, "model", None):
        cmd += ["--model", str(ns.model)]
    if trace_path:
        cmd += ["--trace", str(trace_path)]
    if getattr(ns, "feedback", False):
        cmd.append("--feedback")
    if getattr(ns, "fallback", None):
        cmd += ["--fallback", str(ns.fallback)]
    return cmd + ["--"] + list(ns.workload)


def run_gpu_replay(args) -> tuple[list[dict], Any]:
    """Run the workload under each policy and capacity on the GPU; rows as the simulator's."""
    from pagecast import console
    from pagecast import trace as T

    policies = list(getattr(args, "policy", None) or ["demand"])
    for p in policies:
        if p not in POLICIES:
            raise UsageError(f"policy {p!r} is not available on the GPU backend (choose from {', '.join(POLICIES)})")
    workload = list(getattr(args, "workload", None) or [])
    parse_workload(workload)  # raises UsageError on a bad command
    model = getattr(args, "model", None)
    if "template" in policies and not model:
        raise UsageError("policy template needs --model MODEL (make one with 'pagecast fit TRACE -o MODEL')")
    if model:
        load_model_file(model)  # a bad model fails here, before any run
    if getattr(args, "plan", None):
        console.warn("the GPU backend makes its decisions online; --plan is ignored")
    traces = [str(t) for t in (getattr(args, "traces", None) or [])]
    if len(traces) > 1:
        raise UsageError("the GPU backend replays one workload: give at most one trace (a full-mode trace of it)")
    trace = T.read_trace(traces[0]) if traces else None
    if "oracle" in policies:
        if trace is None:
            raise UsageError("policy oracle needs a full-mode trace of the same workload (pagecast collect --mode full)")
        if trace.mode != "full":
            console.warn(f"{traces[0]} is a {trace.mode}-mode trace: the oracle's footprints may be incomplete")
    footprint = _footprint_bytes(trace) if trace is not None else None

    capacity = getattr(args, "capacity", None)
    oversub = getattr(args, "oversub", None)
    if capacity and oversub:
        raise UsageError("give --capacity or --oversub, not both")
    if oversub:
        if footprint is None:
            raise UsageError("--oversub needs a trace of the workload to size its footprint; give one or use --capacity")
        for r in oversub:
            if r <= 0:
                raise UsageError(f"--oversub must be > 0, found {r}")
        caps: list[int | None] = [max(1, int(footprint / r)) for r in oversub]
        levels = {c: float(r) for c, r in zip(caps, oversub)}
    elif capacity:
        caps = [int(c) for c in capacity]
        for c in caps:
            if c <= 0:
                raise UsageError(f"--capacity must be > 0, found {c}")
        levels = {c: (footprint / c if footprint else None) for c in caps}
    else:
        caps = [None]
        levels = {None: None}
    repeat = getattr(args, "repeat", None)
    repeat = 1 if repeat is None else int(repeat)
    if repeat < 1:
        raise UsageError(f"--repeat must be >= 1, found {repeat}")

    # Needs a GPU from here on (NoGPUError: one line, exit 2).
    from .cuda_iface import open_cuda

    cuda = open_cuda()
    free, total = cuda.mem_info()
    device = cuda.device_info()
    if footprint is not None and footprint > free and not getattr(args, "allow_oversubscription", False):
        raise UsageError(f"the workload's footprint ({footprint} bytes) exceeds the GPU's free memory ({free} bytes);"
                         " that would oversubscribe the real GPU: pass --allow-oversubscription to do it anyway,"
                         " or run a smaller scale (capacity is emulated)")
    for c in caps:
        if c is not None and c > free:
            console.warn(f"capacity {c} bytes is more than the GPU's free memory ({free} bytes): not emulated exactly")

    rows: list[dict] = []
    timelines: list[dict] = []
    total_runs = len(caps) * len(policies) * repeat
    with tempfile.TemporaryDirectory(prefix="pagecast-gpu-") as tmp, \
            console.progress("GPU replay", total_runs) as bar:
        k = 0
        for cap in caps:
            for policy in policies:
                measured = []
                for r in range(repeat):
                    k += 1
                    res = Path(tmp) / f"run-{k}.json"
                    cmd = _child_cmd(policy, cap, args, res, traces[0] if trace is not None else None)
                    if r == 0:
                        cmd.insert(cmd.index("--"), "--timeline")
                    bar.update(description=f"{policy} @ {cap if cap is not None else 'full GPU'} ({r + 1}/{repeat})")
                    # the workload's stdout goes to our stderr: stdout is kept for --json
                    proc = _run_child(cmd)
                    out = json.loads(res.read_text()) if res.exists() else None
                    if proc.returncode != 0 or out is None or out.get("error"):
                        why = (out or {}).get("error") or f"exit status {proc.returncode}"
                        if (out or {}).get("exit_code") == 2:
                            raise NoGPUError(why) if (out or {}).get("no_gpu") else UsageError(why)
                        raise GpuRunError(f"the workload failed under policy {policy}: {why}")
                    for w in out.get("warnings", []):
                        if r == 0 and cap == caps[0]:
                            console.warn(w)
                    measured.append(out)
                    bar.advance()
                tl = measured[0].pop("timeline", None)
                for m_ in measured[1:]:
                    m_.pop("timeline", None)
                if tl:
                    k_run = len(rows)
                    nrow = len(tl["kernel"])
                    tl.update(run=[k_run] * nrow, policy=[policy] * nrow,
                              capacity_bytes=[cap if cap is not None else total] * nrow,
                              task=[0] * nrow, task_name=[_workload_name(workload)] * nrow)
                    timelines.append(tl)
                row = aggregate(measured)
                row.update({
                    "policy": policy, "backend": "gpu",
                    "capacity_bytes": cap if cap is not None else total,
                    "oversub": levels[cap],
                    "stall_s": None, "footprint_bytes": footprint,
                    "workload": " ".join(workload), "traces": traces, "model": str(model) if model else None,
                    "feedback": bool(getattr(args, "feedback", False)), "costs": None,
                    "device": device.get("name"), "eviction_unit": UNIT,
                    "eviction": VICTIMS[policy] if cap is not None else None,
                })
                rows.append(row)
    add_speedups(rows)
    for i, r in enumerate(rows):
        r["run"] = i
    timeline = None
    if timelines:
        from .results_io import timeline_table
        cols = {k: [v for tl in timelines for v in tl[k]] for k in timelines[0]}
        timeline = timeline_table(cols)
    return rows, timeline


def _workload_name(workload: list[str]) -> str:
    try:
        kind, target, _ = parse_workload(workload)
    except UsageError:
        return " ".join(workload)
    return target.rsplit(".", 1)[-1] if kind == "module" else Path(target).stem


def _run_child(cmd: list[str]) -> subprocess.CompletedProcess:
    """Run one measured child; the workload's stdout goes to our stderr (stdout is kept for --json)."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # stderr replaced by a non-file (tests)
        fd = None
    if fd is not None:
        return subprocess.run(cmd, stdout=fd, stderr=fd, env=_child_env())
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_child_env(), text=True)
    sys.stderr.write(proc.stdout or "")
    return proc


def _child_env() -> dict:
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


# ---------------------------------------------------------------------------
# The child: one measured run
# ---------------------------------------------------------------------------

def _child_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pagecast.replay.gpu_runner",
                                description="One measured GPU run of a workload under a policy (used by "
                                            "'pagecast replay --backend gpu').")
    p.add_argument("--policy", required=True, choices=POLICIES)
    p.add_argument("--capacity", type=int, default=None)
    p.add_argument("--model", default=None)
    p.add_argument("--trace", default=None)
    p.add_argument("--feedback", action="store_true")
    p.add_argument("--fallback", default="history")
    p.add_argument("--result", required=True)
    p.add_argument("--feedback-every", type=int, default=256, help="launches between feedback rounds")
    p.add_argument("--timeline", action="store_true", help="report per-kernel rows too")
    p.add_argument("workload", nargs=argparse.REMAINDER)
    return p


class _Warnings:
    def __init__(self) -> None:
        self.items: list[str] = []

    def __call__(self, msg: str) -> None:
        if len(self.items) < 50:
            self.items.append(msg)


def child_main(argv: list[str] | None = None, *, cuda=None, monitor=None, hook_factory=None) -> int:
    """One run: set up the policy, run the workload in-process, write the measurements as JSON.

    `cuda`, `monitor` and `hook_factory` default to the real ones; tests pass stand-ins.
    """
    ns = _child_parser().parse_args(argv)
    result = Path(ns.result)
    warns = _Warnings()
    out: dict[str, Any] = {"policy": ns.policy, "capacity_bytes": ns.capacity}

    def finish(code: int) -> int:
        out["warnings"] = warns.items
        result.write_text(json.dumps(out, default=str))
        return code

    keep_records = bool(ns.feedback and ns.policy == "template")
    try:
        kind, target, wargs = parse_workload(ns.workload)
        if monitor is None:
            from .cuda_iface import CuptiMonitor
            monitor = CuptiMonitor(0)
        # unified-memory counters are configured and enabled before the CUDA context exists
        monitor.start(keep_records=True, live=keep_records)
        if cuda is None:
            from .cuda_iface import open_cuda
            cuda = open_cuda()
        model = load_model_file(ns.model) if ns.model else None
        predict = make_online_predict(model, ns.fallback) if model is not None else None
        relocator = None
        if ns.trace:
            from pagecast import trace as T
            relocator = Relocator(T.read_trace(ns.trace))
        engine = Engine(cuda, ns.policy, capacity=ns.capacity,
                        predict=predict if (ns.policy == "template" or ns.capacity is not None) else None,
                        relocator=relocator, model_kernels=model_kernel_names(model) if model is not None else None,
                        warn=warns)
    except PagecastError as e:
        if monitor is not None:
            monitor.stop()
        out.update(error=str(e), exit_code=e.exit_code, no_gpu=isinstance(e, NoGPUError))
        return finish(e.exit_code)

    feedback = None
    if ns.feedback and ns.policy == "template":
        feedback = _FeedbackLoop(engine, monitor, model, ns.fallback, predict, every=ns.feedback_every)

    on_launch = engine.on_launch if feedback is None else feedback.on_launch
    first_launch: list[float] = []

    def hooked(la) -> None:
        if not first_launch:
            first_launch.append(time.perf_counter())
        on_launch(la)

    if hook_factory is None:
        from pagecast.collect.launch_hook import LaunchHook
        hook_factory = LaunchHook
    hook = hook_factory(hooked)
    hook.start()
    t0 = time.perf_counter()
    try:
        code = run_workload(kind, target, wargs)
    except PagecastError as e:
        hook.stop()
        monitor.stop()
        out.update(error=str(e), exit_code=e.exit_code)
        return finish(e.exit_code)
    except BaseException as e:  # noqa: BLE001 - report the workload's crash to the parent
        hook.stop()
        monitor.stop()
        out.update(error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", exit_code=1)
        return finish(1)
    cuda.synchronize()
    t1 = time.perf_counter()
    hook.stop()
    counts = monitor.stop()
    if feedback is not None:
        feedback.round()
    if code != 0:
        out.update(error=f"the workload exited with status {code}", exit_code=1)
        return finish(1)
    st = engine.stats.to_dict()
    if getattr(hook, "errors", 0):
        warns(f"the launch hook failed on {hook.errors} launch(es): {getattr(hook, 'last_error', '')}")
    if st["errors"]:
        warns(f"the policy failed on {st['errors']} launch(es): {st['last_error']}")
    if engine.stats.launches == 0:
        warns("the workload launched no kernels that the runner saw")
    if relocator is not None and relocator.matching and engine.stats.launches != relocator.n:
        warns(f"the run launched {engine.stats.launches} kernels, the trace has {relocator.n}")
    out.update({
        "time_s": (t1 - first_launch[0]) if first_launch else (t1 - t0),
        "wall_s": t1 - t0,
        "gpu_kernel_s": counts.kernel_busy_s,
        "gpu_span_s": counts.gpu_span_s,
        "faults": counts.faults,
        "htod_bytes": counts.htod_bytes,
        "dtoh_bytes": counts.dtoh_bytes,
        "htod_by_cause": counts.htod_by_cause,
        "dtoh_by_cause": counts.dtoh_by_cause,
        "thrashing": counts.thrashing,
        "launches": engine.stats.launches,
        "prefetch_bytes": st["prefetch_bytes"],
        "evict_bytes": st["evict_bytes"],
        "overflow_launches": st["overflow_launches"],
        "predict_us_mean": st["predict_us_mean"],
        "predict_us_max": st["predict_us_max"],
        "callback_us_mean": 1e6 * st["callback_s"] / st["launches"] if st["launches"] else None,
        "unseen_kernels": st["unseen_kernels"],
        "period": st["period"],
        "feedback_updates": st["feedback_updates"],
        "oracle_unmapped_bytes": relocator.unmapped_bytes if relocator is not None else None,
        "dropped_records": counts.dropped,
        "timeline": build_timeline(counts, engine.corr_launch) if ns.timeline else None,
    })
    return finish(0)


class _FeedbackLoop:
    """Every `every` launches, refine the model from the faults the prediction missed.

    Records come from the monitor's `take()` (CUPTI delivers them in buffers,
    flushed by the monitor's own thread, never from inside a launch callback).
    Kernel records are kept a while (their faults may arrive later); faults
    newer than every known kernel wait for the next round.
    """

    KEEP_KERNELS = 20_000
    KEEP_FAULTS = 200_000

    def __init__(self, engine: Engine, monitor, model, fallback: str, predict, every: int = 256) -> None:
        self.engine, self.monitor, self.model, self.fallback = engine, monitor, model, fallback
        self.predict = predict
        self.every = max(1, every)
        self.n = 0
        self._kernels: list = []
        self._faults: list = []

    def on_launch(self, la) -> None:
        self.engine.on_launch(la)
        self.n += 1
        if self.n % self.every == 0:
            self.round()

    def round(self) -> None:
        try:
            from pagecast.predict.feedback import apply_feedback
        except ImportError:  # the predictor without feedback: only the history fallback learns
            apply_feedback = None
        online = getattr(self.predict, "online", None)
        page_size = int(getattr(self.model, "page_size", 4096))

        def apply(la, ivs) -> bool:
            if online is not None and hasattr(online, "observe"):
                online.observe(la.kernel, ivs)
            if apply_feedback is None:
                return False
            tr = _launch_table([la], self.engine.allocs)
            return bool(apply_feedback(self.model, tr, 0, [a for a, _ in ivs], [b for _, b in ivs]))

        try:
            faults, kernels = self.monitor.take()
            self._kernels = (self._kernels + list(kernels))[-self.KEEP_KERNELS:]
            _, later = self.engine.feedback_from(self._faults + list(faults), self._kernels, apply, page_size)
            self._faults = later[-self.KEEP_FAULTS:]
        except Exception as e:  # noqa: BLE001 - feedback is best effort; the run goes on
            self.engine.stats.errors += 1
            self.engine.stats.last_error = f"feedback: {type(e).__name__}: {e}"


# ---------------------------------------------------------------------------
# pagecast.prefetching: the template policy in-process
# ---------------------------------------------------------------------------

@contextlib.contextmanager
def prefetching(model, capacity: int | str | None = None, fallback: str = "history",
                feedback: bool = False, *, cuda=None, hook_factory=None, monitor=None) -> Iterator[Engine]:
    """Apply the template policy to the kernels launched inside the block.

    `model`: a model path or a loaded model (`pagecast fit`). `capacity`: bytes
    or a size string (`"8GiB"`) to emulate a smaller GPU (evicting to the host);
    None uses the whole GPU. Yields the `Engine` (its `stats` say what was
    prefetched). Needs an NVIDIA GPU (NoGPUError otherwise) and no other CUPTI
    subscriber in the process (e.g. not inside `pagecast collect`).

        import pagecast
        with pagecast.prefetching("model.json", capacity="16GiB") as eng:
            train()
        print(eng.stats.prefetch_bytes)
    """
    from pagecast.units import parse_size

    if isinstance(model, (str, os.PathLike)):
        model = load_model_file(model)
    cap = parse_size(capacity) if capacity is not None else None
    if cuda is None:
        from .cuda_iface import open_cuda
        cuda = open_cuda()
    predict = make_online_predict(model, fallback)
    engine = Engine(cuda, "template", capacity=cap, predict=predict, model_kernels=model_kernel_names(model),
                    warn=lambda m: __import__("warnings").warn(m, stacklevel=3))
    fb = None
    if feedback:
        if monitor is None:
            from .cuda_iface import CuptiMonitor
            monitor = CuptiMonitor(cuda.device)
        monitor.start(keep_records=True, live=True)
        fb = _FeedbackLoop(engine, monitor, model, fallback, predict)
    if hook_factory is None:
        from pagecast.collect.launch_hook import LaunchHook
        hook_factory = LaunchHook
    hook = hook_factory(engine.on_launch if fb is None else fb.on_launch)
    hook.start()
    try:
        yield engine
    finally:
        hook.stop()
        if fb is not None:
            monitor.stop()
            fb.round()


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - exercised through subprocesses
    return child_main(argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
