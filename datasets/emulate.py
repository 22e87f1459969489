"""The workload models' driver emulation and clock, for truth recorded elsewhere.

`collect --interpret` records what each launch of a real Triton kernel touched; this
module turns those truth rows into what a full-mode CUPTI collection would have shown,
with the same UVM driver emulation the workload models use (engine.py's `_Driver`: one
fault per touched 64 KiB big page, coherence migrations of the touched big pages, the
tree prefetcher's 2 MiB blocks, ~0.1% of fault records lost as a real fault buffer loses
them), and the same roofline clock (H200-like HBM bandwidth, a fixed per-kernel cost,
small idle gaps). `drop` additionally loses fault and migration records independently at
that rate, as CUPTI does when its activity buffers overflow.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from pagecast import trace as T

from .engine import BIG_SHIFT, GAP_NS, HBM_BYTES_PER_S, LAUNCH_OVERHEAD_NS, PAGE, _Driver, lose_records

CHUNK_BIGPAGES = 1 << 23     # (launch, big page) pairs emulated at once, as datasets/engine.py does


@dataclass
class RooflineClock:
    """Start and end times of serialized launches from the bytes each one moves (engine.py's clock)."""

    rng: np.random.Generator
    now: int = 1_000_000        # the process starts 1 ms before the first kernel, as in the models

    def times(self, moved_bytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        moved = np.asarray(moved_bytes, np.float64)
        dur = np.ceil(moved / HBM_BYTES_PER_S * 1e9).astype(np.int64) + LAUNCH_OVERHEAD_NS
        gap = self.rng.integers(GAP_NS[0], GAP_NS[1], len(moved))
        end = self.now + np.cumsum(gap + dur)
        start = end - dur
        if len(moved):
            self.now = int(end[-1])
        return start, end


@dataclass
class FullModeEmulator:
    """Faults and migrations of full-mode launches, chunk by chunk of launches in issue order."""

    prefetch: bool
    rng: np.random.Generator
    drop: float = 0.0
    dropped: dict = field(default_factory=lambda: {"faults": 0, "migrations": 0})

    def __post_init__(self) -> None:
        if not 0.0 <= self.drop < 1.0:
            raise ValueError(f"drop must be in [0, 1), not {self.drop}")

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
        emu = _Driver("full", self.prefetch, a_addr, a_end, self.rng)
        aid, addr = np.asarray(aid, np.int64), np.asarray(addr, np.int64)
        nbytes, access = np.asarray(nbytes, np.int64), np.asarray(access, np.int8)
        start, end = np.asarray(start, np.int64), np.asarray(end, np.int64)
        # memory stays bounded: chunks of at most CHUNK_BIGPAGES pairs, ended on a launch boundary
        cum = np.cumsum(((addr + nbytes - 1) >> BIG_SHIFT) - (addr >> BIG_SHIFT) + 1)
        out_f, out_m = [], []
        lo = 0
        while lo < len(lid):
            base = cum[lo - 1] if lo else 0
            hi = max(int(np.searchsorted(cum, base + CHUNK_BIGPAGES, side="right")), lo + 1)
            if hi < len(lid):
                hi = int(np.searchsorted(lid, lid[hi - 1], side="right"))
            f, m = emu.chunk(lid[lo:hi], aid[lo:hi], addr[lo:hi], nbytes[lo:hi], access[lo:hi], start, end)
            out_f.append(f)
            out_m.append(m)
            lo = hi
        faults, migs = _concat(out_f), _concat(out_m)
        faults[T.LAUNCH_ID] = faults[T.LAUNCH_ID] + first_launch
        migs[T.LAUNCH_ID] = migs[T.LAUNCH_ID] + first_launch
        if self.drop:
            faults = self._lose(faults, T.TIME_NS, "faults")
            migs = self._lose(migs, T.START_NS, "migrations")
        return faults, migs

    def _lose(self, cols: dict, key: str, what: str) -> dict:
        cols, lost = lose_records(cols, key, self.drop, self.rng)
        self.dropped[what] += lost
        return cols


class FullModeEmulation:
    """The clock and the driver emulation together, as `collect --interpret` takes them
    (`collect_interpreted(..., emulation=FullModeEmulation)`): one random stream from `seed`."""

    def __init__(self, *, prefetch: bool = True, seed: int = 0, drop: float = 0.0) -> None:
        rng = np.random.default_rng([int(seed), 7])
        self.clock = RooflineClock(rng)
        self.emulator = FullModeEmulator(bool(prefetch), rng, float(drop))

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
