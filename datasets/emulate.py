"""The workload models' driver emulation and clock, for truth recorded elsewhere.

`collect --interpret` records what each launch of a real Triton kernel touched; this
module turns those truth rows into what a full-mode CUPTI collection would have shown,
with the same UVM driver emulation the workload models use (engine.py's `_Driver`: one
fault per touched 64 KiB big page, coherence migrations of the touched big pages, the
tree prefetcher's 2 MiB blocks, ~0.1% of fault records lost as a real fault buffer loses
them), and the same roofline clock (H200-like HBM bandwidth, a fixed per-kernel cost,
small idle gaps). `drop` additionally loses fault and migration records independently at
that rate, as CUPTI does when its activity buffers overflow.

A recording is a function of the workload and the seed alone: each launch's driver draws come
from its own random stream (the seed and its launch id), and the clock draws one number per
launch from a stream of its own, so where the recorder cuts the launches into flushes (every
few thousand launches, and every `part_seconds` of wall time, docs/collect.md) changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from pagecast import trace as T

from .engine import GAP_NS, HBM_BYTES_PER_S, LAUNCH_OVERHEAD_NS, PAGE, _Driver, lose_records


@dataclass
class RooflineClock:
    """Start and end times of serialized launches from the bytes each one moves (engine.py's clock).
    One uniform draw per launch, in launch order (a double is one draw of the stream, so calls
    for 3 and then 5 launches take the draws one call for 8 takes)."""

    rng: np.random.Generator
    now: int = 1_000_000        # the process starts 1 ms before the first kernel, as in the models

    def times(self, moved_bytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        moved = np.asarray(moved_bytes, np.float64)
        dur = np.ceil(moved / HBM_BYTES_PER_S * 1e9).astype(np.int64) + LAUNCH_OVERHEAD_NS
        gap = GAP_NS[0] + (self.rng.random(len(moved)) * (GAP_NS[1] - GAP_NS[0])).astype(np.int64)
        end = self.now + np.cumsum(gap + dur)
        start = end - dur
        if len(moved):
            self.now = int(end[-1])
        return start, end


@dataclass
class FullModeEmulator:
    """Faults and migrations of full-mode launches, a launch at a time in issue order, each from
    its own random stream: `np.random.default_rng([*seed, launch id])` (the full-mode driver keeps
    no state between launches, so a launch's records depend on nothing else)."""

    prefetch: bool
    seed: tuple[int, ...]
    drop: float = 0.0
    dropped: dict = field(default_factory=lambda: {"faults": 0, "migrations": 0})

    def __post_init__(self) -> None:
        if not 0.0 <= self.drop < 1.0:
            raise ValueError(f"drop must be in [0, 1), not {self.drop}")
        self.seed = tuple(int(x) for x in np.atleast_1d(self.seed))

    def records(self, first_launch: int, lid, aid, addr, nbytes, access, start, end, alloc_addr, alloc_bytes):
        """(faults, migrations) column dicts for truth rows of launches first_launch.. (sorted by launch).

        `aid` indexes `alloc_addr`/`alloc_bytes` (the allocations these rows fall in);
        `start[i]`, `end[i]` are the times of launch first_launch + i; `access` holds
        engine codes (0 read, 1 write, 2 readwrite).
        """
        lid = np.asarray(lid, np.int64) - first_launch
        if len(lid) == 0:
            return _empty(T.FAULTS), _empty(T.MIGRATIONS)
        a_addr = np.asarray(alloc_addr, np.int64)
        a_end = a_addr + -(-np.asarray(alloc_bytes, np.int64) // PAGE) * PAGE
        emu = _Driver("full", self.prefetch, a_addr, a_end, None)
        aid, addr = np.asarray(aid, np.int64), np.asarray(addr, np.int64)
        nbytes, access = np.asarray(nbytes, np.int64), np.asarray(access, np.int8)
        start, end = np.asarray(start, np.int64), np.asarray(end, np.int64)
        cut = np.flatnonzero(np.diff(lid)) + 1
        out_f, out_m = [], []
        for lo, hi in zip(np.r_[0, cut], np.r_[cut, len(lid)]):
            emu.rng = np.random.default_rng([*self.seed, first_launch + int(lid[lo])])
            f, m = emu.chunk(lid[lo:hi], aid[lo:hi], addr[lo:hi], nbytes[lo:hi], access[lo:hi], start, end)
            if self.drop:   # records in launch order, then time order: the collector's order
                f = self._lose(f, T.TIME_NS, "faults", emu.rng)
                m = self._lose(m, T.START_NS, "migrations", emu.rng)
            out_f.append(f)
            out_m.append(m)
        faults, migs = _concat(out_f), _concat(out_m)
        faults[T.LAUNCH_ID] = faults[T.LAUNCH_ID] + first_launch
        migs[T.LAUNCH_ID] = migs[T.LAUNCH_ID] + first_launch
        return faults, migs

    def _lose(self, cols: dict, key: str, what: str, rng: np.random.Generator) -> dict:
        cols, lost = lose_records(cols, key, self.drop, rng)
        self.dropped[what] += lost
        return cols


class FullModeEmulation:
    """The clock and the driver emulation together, as `collect --interpret` takes them
    (`collect_interpreted(..., emulation=FullModeEmulation)`): the clock's stream and the
    launches' streams all from `seed`, apart."""

    def __init__(self, *, prefetch: bool = True, seed: int = 0, drop: float = 0.0) -> None:
        self.clock = RooflineClock(np.random.default_rng([int(seed), 7]))
        self.emulator = FullModeEmulator(bool(prefetch), (int(seed), 8), float(drop))

    def times(self, moved_bytes):
        return self.clock.times(moved_bytes)

    def records(self, *args):
        return self.emulator.records(*args)

    @property
    def dropped(self) -> dict:
        return self.emulator.dropped


def _concat(parts: list[dict]) -> dict:
    """Column dicts (numpy arrays or pyarrow arrays per column) concatenated."""
    return {k: (pa.concat_arrays([p[k] for p in parts]) if isinstance(parts[0][k], pa.Array)
                else np.concatenate([p[k] for p in parts])) for k in parts[0]}


def _empty(table: str):
    return T.SCHEMAS[table].empty_table()
