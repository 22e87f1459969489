"""The residency estimate in arrays: `Residency`'s decisions, one compiled call per launch.

`UnitResidency` keeps what `residency.Residency` keeps (the bytes believed on the emulated GPU,
per 2 MiB unit, the victim order) in one int64 array that `residency_kernels.step` reads and
updates: no dict of Python objects, no per-unit Python loop. Its methods take and return byte
ranges as `Residency`'s do (`admit`, `missing`, `release`, and the counters), and `step` makes a
whole launch's capacity decision at once, reading the launch's ranges straight from another
array (the compiled predictor's state) where they are there.

Victim rules: `fifo`, `lru`, `next-use` (with no scorer: the template policy's sequence scores,
`residency.SequenceNextUse`'s, from uses recorded by `step(record=True)` and the period handed
in) and `belady` or `next-use` with a scorer object (`score(unit, t)`, called from Python for the
candidates, as `FutureNextUse` for the oracle).

`residency.Residency` is the reference it is tested against (tests/test_unit_residency.py) and
what the runner did before (benchmarks/bench_runner.py runs both).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, Iterable

import numpy as np

from pagecast.jit import entry_point

from . import residency_kernels as RK
from .ranges import UNIT

_RULES = {"fifo": RK.RULE_FIFO, "lru": RK.RULE_LRU}
_SECTIONS = (RK.R_SCAL, RK.R_SLOTS, RK.R_HASH, RK.R_POOL, RK.R_LIST, RK.R_LOG, RK.R_IO, RK.R_SCR)


def _flat(ranges) -> np.ndarray:
    a = np.asarray(list(ranges) if not isinstance(ranges, (list, tuple, np.ndarray)) else ranges, np.int64)
    return a.reshape(-1) if a.size else np.zeros(0, np.int64)


class UnitResidency:
    """The runner's estimate of what is on the emulated GPU (see the module doc and `Residency`)."""

    def __init__(self, capacity_bytes: int, unit: int = UNIT, victim: str = "fifo", next_use: Any = None,
                 max_period: int = 1024, sections: dict | None = None) -> None:
        """`max_period`: the period detector's (the use log keeps that many launches' uses);
        `sections`: initial capacities by section (`residency_kernels.R_*`; they grow as needed)."""
        if victim not in ("fifo", "lru", "next-use", "belady"):
            raise ValueError(f"unknown victim rule {victim!r}")
        if victim == "belady" and next_use is None:
            raise ValueError(f"victim rule {victim!r} needs a next_use scorer")
        self.capacity = max(1, int(capacity_bytes))
        self.capacity_units = max(1, self.capacity // unit)
        self.unit = unit
        self.victim = victim
        self.next_use = next_use
        rule = _RULES.get(victim, RK.RULE_SEQ if next_use is None else RK.RULE_SCORED)
        # capacities: slots, hash slots, pool ranges, log entries, io rows, scratch int64s
        self._caps = {RK.R_SLOTS: 64, RK.R_HASH: 256, RK.R_POOL: 256, RK.R_LOG: 1024, RK.R_IO: 64,
                      RK.R_SCR: 4096, **(sections or {})}
        self.rs = np.zeros(0, np.int64)
        self._assemble()
        sc = int(self.rs[RK.R_SCAL])
        self.rs[sc + RK.S_CAP] = self.capacity
        self.rs[sc + RK.S_UNIT] = unit
        self.rs[sc + RK.S_RULE] = rule
        self.rs[sc + RK.S_WINP] = -1
        self.rs[sc + RK.S_MAXP] = max_period
        self.inbuf = np.zeros(64, np.int64)
        self._step, self._release = RK.step, RK.release   # entry points after warm()
        # a scorer with its own compiled step (relocate.RelocatedNextUse: the plan's Belady) scores
        # the candidates inside it
        self._fused = getattr(next_use, "step", None) if victim in ("belady", "next-use") else None

    # -- the state array -------------------------------------------------------------------------
    def _assemble(self, grow: dict | None = None) -> None:
        """Lay the sections out (again), `grow` giving new capacities by section slot."""
        old, caps = self.rs, dict(self._caps)
        for k, v in (grow or {}).items():
            caps[k] = int(v)
        if caps[RK.R_HASH] < 2 * caps[RK.R_SLOTS]:
            caps[RK.R_HASH] = 1 << (2 * caps[RK.R_SLOTS] - 1).bit_length()
        sizes = {RK.R_SCAL: RK.NSCAL, RK.R_SLOTS: RK.NF * caps[RK.R_SLOTS], RK.R_HASH: 2 * caps[RK.R_HASH],
                 RK.R_POOL: 2 * caps[RK.R_POOL], RK.R_LIST: caps[RK.R_SLOTS], RK.R_LOG: RK.LW * caps[RK.R_LOG],
                 RK.R_IO: 2 * caps[RK.R_IO], RK.R_SCR: caps[RK.R_SCR]}
        rs = np.zeros(RK.RMETA + sum(sizes.values()), np.int64)
        at = RK.RMETA
        for sec in _SECTIONS:
            rs[sec] = at
            at += sizes[sec]
        rs[RK.R_SCAP], rs[RK.R_HCAP], rs[RK.R_PCAP] = caps[RK.R_SLOTS], caps[RK.R_HASH], caps[RK.R_POOL]
        rs[RK.R_LCAP], rs[RK.R_IOCAP], rs[RK.R_SCRCAP] = caps[RK.R_LOG], caps[RK.R_IO], caps[RK.R_SCR]
        if len(old):
            for sec in (RK.R_SCAL, RK.R_SLOTS, RK.R_POOL, RK.R_LIST):
                o, n = int(old[sec]), min(sizes[sec], self._size(old, sec))
                rs[int(rs[sec]):int(rs[sec]) + n] = old[o:o + n]
            # the log's entries sit at (entry mod capacity): place the kept ones again
            sc = int(old[RK.R_SCAL])
            logn, ocap = int(old[sc + RK.S_LOGN]), int(old[RK.R_LCAP])
            e = np.arange(max(0, logn - ocap), logn)
            if len(e):
                src = old[int(old[RK.R_LOG]):int(old[RK.R_LOG]) + RK.LW * ocap].reshape(ocap, RK.LW)
                dst = rs[int(rs[RK.R_LOG]):int(rs[RK.R_LOG]) + RK.LW * caps[RK.R_LOG]].reshape(-1, RK.LW)
                dst[e % caps[RK.R_LOG]] = src[e % ocap]
        rs[int(rs[RK.R_HASH]):int(rs[RK.R_HASH]) + 2 * caps[RK.R_HASH]] = RK.EMPTY
        self.rs, self._caps = rs, caps
        self.io_at = int(rs[RK.R_IO])   # where step's outputs are
        if len(old):
            RK.rehash(rs)

    @staticmethod
    def _size(rs, sec) -> int:
        nxt = {RK.R_SCAL: RK.R_SLOTS, RK.R_SLOTS: RK.R_HASH, RK.R_HASH: RK.R_POOL, RK.R_POOL: RK.R_LIST,
               RK.R_LIST: RK.R_LOG, RK.R_LOG: RK.R_IO, RK.R_IO: RK.R_SCR}
        return int(rs[nxt[sec]] - rs[sec]) if sec in nxt else len(rs) - int(rs[sec])

    def _grow(self) -> None:
        sc = int(self.rs[RK.R_SCAL])
        what, need = int(self.rs[sc + RK.S_NEEDWHAT]), int(self.rs[sc + RK.S_NEED])
        sec = {RK.GROW_SLOTS: RK.R_SLOTS, RK.GROW_POOL: RK.R_POOL, RK.GROW_LOG: RK.R_LOG, RK.GROW_IO: RK.R_IO,
               RK.GROW_SCR: RK.R_SCR}[what]
        self._assemble({sec: max(2 * self._caps[sec], need + need // 2 + 16)})

    def warm(self) -> "UnitResidency":
        """Compile (or load from numba's cache) the kernels now, not at the first launch."""
        probe = UnitResidency(self.capacity, self.unit)   # the kernels' types do not depend on the rule
        src = np.array([0, 4096], np.int64)
        self._step = entry_point(RK.step, probe.rs, src, 1, -1, 0, RK.FL_KNOWN | RK.FL_RECORD)
        self._release = entry_point(RK.release, probe.rs, src, 1)
        RK.compact_pool(probe.rs)
        RK.rehash(probe.rs)
        return self

    # -- one launch ----------------------------------------------------------------------------------
    def step_arrays(self, src: np.ndarray, wspec: int, espec: int, t: int, flags: int) -> int:
        """`residency_kernels.step` with growth and Python scores handled; returns its code
        (npf | nev << 24 | overflow << 48), the ranges at `out()`."""
        fused = self._fused
        while True:
            if fused is not None and not flags & RK.FL_SCORED:   # the scorer's own compiled step
                r = fused(self.rs, src, wspec, espec, t, flags)
            else:
                r = self._step(self.rs, src, wspec, espec, t, flags)
            if r >= 0:
                return r
            if r == RK.ST_TOOMANY:
                raise ValueError(f"more than {RK.MAX_RANGES} ranges in one launch's residency step")
            if r == RK.ST_GROW:
                self._grow()
                flags &= ~RK.FL_SCORED   # the scores were in io: ask again
            else:
                flags |= self._score(t)

    def _score(self, t: int) -> int:
        """Python scores for the candidates the kernel wrote to io (victim rules with a scorer)."""
        rs = self.rs
        sc, io = int(rs[RK.R_SCAL]), int(rs[RK.R_IO])
        n = int(rs[sc + RK.S_CANDN])
        seg = rs[io:io + 2 * n]
        view = seg.view(np.float64)
        many = getattr(self.next_use, "scores", None)
        if many is not None:   # all of them in one compiled call (relocate.RelocatedNextUse)
            view[1::2] = many(seg[0::2].copy(), t)
            return RK.FL_SCORED
        units = seg[0::2].tolist()
        view[1::2] = [float(self.next_use.score(u, t)) for u in units]
        return RK.FL_SCORED

    def out(self, first: int, n: int) -> list[tuple[int, int]]:
        """n output ranges from io row `first`."""
        io = int(self.rs[RK.R_IO]) + 2 * first
        flat = self.rs[io:io + 2 * n].tolist()
        return list(zip(flat[0::2], flat[1::2]))

    def _src(self, ranges) -> tuple[np.ndarray, int]:
        flat = _flat(ranges)
        if len(flat) // 2 >= RK.MAX_RANGES:
            raise ValueError(f"more than {RK.MAX_RANGES} ranges in one launch's residency step")
        return flat, len(flat) // 2

    def step(self, want, estimate, t: int, *, known: bool = True, front: bool = False, record: bool = False,
             period: int | None = None) -> tuple[list, list, bool]:
        """One launch from byte-range lists (LaunchDecider's capacity step): (prefetch, evict, overflow)."""
        w = _flat(want)
        e = None if estimate is want else _flat(estimate)
        src = w if e is None else np.concatenate([w, e])
        flags = self.flags(known, front, record, period)
        r = self.step_arrays(src, len(w) // 2, -1 if e is None else (len(w) << 24) | (len(e) // 2), t, flags)
        npf, nev = r & 0xFFFFFF, (r >> 24) & 0xFFFFFF
        return self.out(0, npf), self.out(npf, nev), bool(r >> 48)

    @staticmethod
    def flags(known: bool, front: bool, record: bool, period: int | None) -> int:
        return ((RK.FL_KNOWN if known else 0) | (RK.FL_FRONT if front else 0) | (RK.FL_RECORD if record else 0)
                | ((0 if period is None else int(period) + 1) << 8))

    # -- Residency's methods ----------------------------------------------------------------------
    def admit(self, ranges: Iterable[tuple[int, int]], t: int, streams: bool = True) -> list[tuple[int, int]]:
        """Make room for `ranges` and record them resident; the byte ranges to evict first
        (Residency.admit)."""
        src, n = self._src(ranges)
        r = self.step_arrays(src, n, -1, t, RK.FL_KNOWN if streams else 0)
        npf, nev = r & 0xFFFFFF, (r >> 24) & 0xFFFFFF
        return self.out(npf, nev)

    def observe(self, ranges: Iterable[tuple[int, int]], t: int) -> None:
        """Record `ranges` resident without making room (Residency.observe): they moved already (a
        fault, the driver's prefetch); the next launch's step evicts what no longer fits."""
        sc = int(self.rs[RK.R_SCAL])
        cap = int(self.rs[sc + RK.S_CAP])
        self.rs[sc + RK.S_CAP] = 1 << 62
        try:
            self.admit(ranges, t, streams=False)
        finally:
            self.rs[int(self.rs[RK.R_SCAL]) + RK.S_CAP] = cap   # admit may have laid the state out again

    def missing(self, ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
        """The parts of `ranges` not held (what a prefetch must still move)."""
        src, n = self._src(ranges)
        return self.out(0, self.step_arrays(src, n, -1, 0, RK.FL_MISSING))

    def release(self, ranges: Iterable[tuple[int, int]]) -> int:
        """Forget the parts of `ranges` held (freed memory); the bytes released."""
        src, n = self._src(ranges)
        while True:
            r = self._release(self.rs, src, n)
            if r != RK.ST_GROW:
                return int(r)
            self._grow()

    def _scalar(self, k: int) -> int:
        return int(self.rs[int(self.rs[RK.R_SCAL]) + k])

    @property
    def resident_bytes(self) -> int:
        return self._scalar(RK.S_RBYTES)

    @property
    def resident_units(self) -> int:
        return self._scalar(RK.S_NRES)

    @property
    def overflows(self) -> int:
        return self._scalar(RK.S_OVERFLOWS)

    @property
    def evicted_bytes(self) -> int:
        return self._scalar(RK.S_EVBYTES)

    @property
    def evictions(self) -> int:
        return self._scalar(RK.S_EVICTIONS)

    @property
    def resident(self) -> OrderedDict:
        """unit -> its resident byte ranges, in victim order for fifo/lru (Residency.resident)."""
        so, lo = int(self.rs[RK.R_SLOTS]), int(self.rs[RK.R_LIST])
        pool = int(self.rs[RK.R_POOL])
        rows = []
        for i in range(self.resident_units):
            s = int(self.rs[lo + i])
            f = self.rs[so + s * RK.NF: so + (s + 1) * RK.NF]
            o, c = pool + 2 * int(f[RK.F_OFF]), int(f[RK.F_CNT])
            flat = self.rs[o:o + 2 * c].tolist()
            rows.append((int(f[RK.F_STAMP]), int(f[RK.F_UNIT]),
                         [(a, b - a) for a, b in zip(flat[0::2], flat[1::2])]))
        return OrderedDict((u, r) for _, u, r in sorted(rows))

    def score(self, u: int, t: int, period: int | None) -> float:
        """The template rule's score of unit u at launch t (SequenceNextUse.score), for tests."""
        s = int(RK.find_slot(self.rs, u))
        if s < 0:
            return math.inf
        p = -1 if period is None else int(period)
        RK._sync_window(self.rs, t, p)
        return float(RK._score(self.rs, s, t, p))
