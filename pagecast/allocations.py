"""Which allocation live at a launch an address points into: `AllocIndex`, vectorized over many
addresses and launches (allocations freed and their addresses reused are told apart by the
launches they are live for). Used by the trace reader's checks of the `values` table and by
the predictor."""

from __future__ import annotations

import bisect

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import trace as T


class AllocIndex:
    """Which allocation (live at a launch) an address points into, vectorized.

    `lookup` accepts one past the end as inside (a pointer to the end of a buffer).
    """

    def __init__(self, allocations: pa.Table) -> None:
        a = allocations
        addr = a.column(T.ADDRESS).to_numpy().astype(np.uint64) if a.num_rows else np.zeros(0, np.uint64)
        order = np.argsort(addr, kind="stable")
        self.addr = addr[order]
        self.size = a.column(T.BYTES).to_numpy().astype(np.uint64)[order] if a.num_rows else np.zeros(0, np.uint64)
        self.end = self.addr + self.size
        self.first = a.column(T.FIRST_LAUNCH).to_numpy()[order] if a.num_rows else np.zeros(0, np.int64)
        self.last = (pc.fill_null(a.column(T.LAST_LAUNCH), np.iinfo(np.int64).max).to_numpy()[order]
                     if a.num_rows else np.zeros(0, np.int64))
        self.alloc_id = a.column(T.ALLOC_ID).to_numpy()[order] if a.num_rows else np.zeros(0, np.int64)
        self.n = len(self.addr)
        self.maxsize = np.uint64(self.size.max()) if self.n else np.uint64(0)

    def lookup_one(self, value: int, launch: int, one_past: bool = True) -> int:
        """`lookup` for one value (Python ints, bisect): the online path, a few microseconds."""
        py = self.__dict__.get("_py")
        if py is None:
            py = self._py = (self.addr.tolist(), self.end.tolist(), self.first.tolist(), self.last.tolist(),
                             int(self.maxsize))
        addr, end, first, last, maxsize = py
        j = bisect.bisect_right(addr, value) - 1
        while j >= 0 and addr[j] + maxsize >= value:
            if (value < end[j] or (one_past and value == end[j])) and first[j] <= launch <= last[j]:
                return j
            j -= 1
        return -1

    def lookup(self, values: np.ndarray, launch: np.ndarray, *, one_past: bool = True,
               depth: int = 100_000) -> np.ndarray:
        """Row (in address order) of the live allocation holding each value, else -1."""
        v = np.asarray(values).astype(np.uint64)
        launch = np.broadcast_to(np.asarray(launch, np.int64), v.shape)
        out = np.full(len(v), -1, np.int64)
        if self.n == 0 or len(v) == 0:
            return out
        j = np.searchsorted(self.addr, v, side="right").astype(np.int64) - 1
        todo = np.arange(len(v))
        for _ in range(depth):
            jj = j[todo]
            ok = jj >= 0
            jc = np.maximum(jj, 0)
            inside = (v[todo] < self.end[jc]) | (one_past & (v[todo] == self.end[jc]))
            live = (self.first[jc] <= launch[todo]) & (launch[todo] <= self.last[jc])
            hit = ok & inside & live
            out[todo[hit]] = jc[hit]
            # keep walking down (freed and reused ranges) while an allocation could still reach v
            more = ~hit & ok & (self.addr[jc] + self.maxsize >= v[todo])
            todo = todo[more]
            if len(todo) == 0:
                break
            j[todo] -= 1
        return out
