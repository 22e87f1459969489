"""Index values in full mode: the buffers a launch's pointer parameters point to, copied to the
host before its kernel runs (docs/collect.md, "Index values").

In full mode the collector serializes kernels: before a launch is queued, the previous kernel
has ended (the launch hook's `before_launch` synchronized), so what a buffer holds then is what
the launch will read when it starts, which is what the trace's `values` table records
(docs/trace-format.md, "values"). For each parameter word of the launch that points into a live
managed allocation, the copier copies, device to host, the bytes from the pointer towards the
end of that allocation, within a per-launch budget shared out by water-filling: pointers are
taken from the shortest remainder up, each gets at most an equal share of what is left, so a
router's expert ids or a batch's block tables (a few KiB) come whole even beside a pointer into
a weight matrix, whose share is clipped. The collector cannot tell an index buffer from any
other (it sees addresses, not types), hence every pointer; the budget bounds the cost.
What is clipped is counted (the manifest's `values` object), and a row that repeats the latest
row from its address is left out (`pagecast.values.ValuesRecorder`).

A launch the hook delivers only at its API's exit (a runtime launch before the hook learned
whether such launches reach the driver callbacks: the first of a run at most) is already queued,
so its buffers may be changing: its values are not recorded, and counted (`late`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from pagecast.values import ValuesRecorder

# Bytes of values copied per launch at most: the size the issue on data-dependent kernels gives
# (a few KiB of expert ids, token ids or block tables fit many times over); docs/collect.md has
# the cost this puts on a full-mode collection.
LIMIT = 64 << 10
POINTER_BYTES = 8


@dataclass
class CopyStats:
    launches: int = 0       # launches whose values were looked at
    copies: int = 0         # device-to-host copies made
    bytes: int = 0          # bytes copied
    copy_ns: int = 0        # time spent copying (host clock)
    late: int = 0           # launches delivered after they were queued: not recorded
    errors: int = 0         # copies that failed (the launch's other rows are kept)
    last_error: str | None = None

    def as_dict(self) -> dict:
        n = max(1, self.launches)
        return {"launches": self.launches, "copies": self.copies, "bytes": self.bytes, "late": self.late,
                "errors": self.errors, "last_error": self.last_error,
                "copy_us_per_launch": round(self.copy_ns / n / 1e3, 3)}


def pointer_reads(offsets, sizes, data: bytes, live: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(param offset, address, bytes to the end of its allocation) of each 8-byte parameter word
    that points into a live allocation of `live` ((address, bytes) sorted by address), ordered by
    those bytes (then offset)."""
    if not live:
        return []
    starts = np.fromiter((a for a, _ in live), np.uint64, len(live))
    ends = starts + np.fromiter((n for _, n in live), np.uint64, len(live))
    out = []
    for off, size in zip(offsets, sizes):
        if size != POINTER_BYTES or off + size > len(data):
            continue
        v = int.from_bytes(data[off:off + size], "little")
        i = int(np.searchsorted(starts, np.uint64(v), side="right")) - 1
        if i >= 0 and v < int(ends[i]):
            out.append((int(off), v, int(ends[i]) - v))
    out.sort(key=lambda r: (r[2], r[0]))
    return out


def share(reads: list[tuple[int, int, int]], limit: int) -> list[int]:
    """Bytes to copy for each read (in the given order, shortest first): water-filling of `limit`."""
    left, out = int(limit), []
    for j, (_, _, n) in enumerate(reads):
        k = min(n, left // (len(reads) - j))
        out.append(k)
        left -= k
    return out


class ValuesCopier:
    """Copies each launch's pointed-to buffers (`read(address, nbytes) -> bytes`, device to host)
    into a ValuesRecorder; `live()` gives the live managed allocations as (address, bytes)."""

    def __init__(self, read: Callable[[int, int], bytes], live: Callable[[], list[tuple[int, int]]],
                 limit: int = LIMIT) -> None:
        self.read = read
        self.live = live
        self.recorder = ValuesRecorder(limit=limit, omit_repeats=True)
        self.stats = CopyStats()
        self._lock = threading.Lock()   # record (the launching thread) against take (the writer's)

    def record(self, launch_id: int, offsets, sizes, data: bytes, *, late: bool = False) -> int:
        """Copy and record one launch's values; returns the bytes copied."""
        st = self.stats
        st.launches += 1
        if late:
            st.late += 1
            return 0
        reads = pointer_reads(offsets, sizes, data, self.live())
        if not reads:
            return 0
        ks = share(reads, self.recorder.limit)
        rows, clipped = [], 0
        t0 = time.perf_counter_ns()
        for (off, addr, n), k in zip(reads, ks):
            clipped += n - k
            if k <= 0:
                continue
            try:
                d = self.read(addr, k)
            except Exception as e:   # a failed copy loses that row, not the collection
                st.errors += 1
                st.last_error = f"{type(e).__name__}: {e}"
                continue
            st.copies += 1
            st.bytes += len(d)
            rows.append((off, addr, d))
        st.copy_ns += time.perf_counter_ns() - t0
        rec = self.recorder
        with self._lock:
            if clipped:
                rec.clipped_bytes += clipped
                rec.clipped_launches += 1
            rec.launch(launch_id, rows)
        return sum(len(d) for _, _, d in rows)

    def take(self) -> dict:
        with self._lock:
            return self.recorder.take()

    def manifest(self) -> dict:
        with self._lock:
            return self.recorder.manifest()
