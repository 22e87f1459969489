"""The `values` table at work: recording it within its limit, reading a launch's index values
back, and when they exist (docs/trace-format.md, "values").

- `ValuesRecorder` (writers: the workload models, `collect --interpret`, the CUPTI collector)
  keeps each launch's rows within the per-launch limit, counting what it clips, and with
  `omit_repeats` leaves out a row that repeats, byte for byte, the latest row recorded from the
  same address (the manifest then says `"repeats": "omitted"`): a static index buffer, such as a
  CSR matrix's column indices, is stored once, not at every launch that reads it.
- `ValueImage` (readers) answers "which bytes did the buffer at this address hold when launch c
  started": the row of launch c read from that address, or, where repeats are omitted, the
  latest such row of a launch <= c. Rows reaching past the end of the allocation they point
  into (live at their launch) are clipped to it, and rows pointing into no allocation dropped,
  both counted (`report`), with one warning line.
- `producers` says after which launch a launch's values exist: the launch that last wrote them,
  as the trace observed it (below). Nothing may be prefetched on the strength of values before
  that launch has ended.

When values exist, as observed. In a `full`-mode trace every launch faults on every 64 KiB big
page it touches, and a fault record says whether the access was a write; so the writer of a
buffer is the latest earlier launch with a write (or atomic) fault on a big page the values lie
in (big pages, not pages: the driver records one fault per big page, at any page the launch
touched there, so a neighbouring write counts too, which can only make the answer later). A
row whose content changed since the previous row from that address, with no such writer in
between, was written by the host (a copy between launches): its values exist once the launch
before that row's has ended. Either way the answer is never earlier than what the records show
(a lost write record of the true writer makes a change unexplained, hence the later of the two).
Outside full mode (first touches only) writes are not seen at every launch: the values of
launch c exist, conservatively, after launch c - 1.
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import trace as T
from .allocations import AllocIndex
from .footprints import LaunchClock
from .uvm import BIG_PAGE

I64 = np.int64
WRITES = ("write", "atomic")   # fault access kinds that show a write (trace-format.md, faults)


# ---- writing ----------------------------------------------------------------

@dataclass
class ValuesRecorder:
    """Rows of the values table, launch by launch, within `limit` bytes per launch (clipped bytes
    counted); with `omit_repeats`, a row equal (address, bytes and data) to the latest row kept
    from the same address is left out. Call `launch` in launch order; `table()` and `manifest()`
    give what to write."""

    limit: int = T.VALUES_LIMIT
    omit_repeats: bool = True
    clipped_bytes: int = 0
    clipped_launches: int = 0
    omitted: int = 0
    _last: dict = field(default_factory=dict)     # address -> data of the latest row kept from it
    _cols: dict = field(default_factory=lambda: {k: [] for k in T.SCHEMAS[T.VALUES].names})

    def __post_init__(self) -> None:
        if int(self.limit) < 1:
            raise ValueError(f"the values limit must be at least 1 byte, not {self.limit}")
        self.limit = int(self.limit)

    def launch(self, launch_id: int, reads) -> int:
        """Record one launch's reads, `(param_offset, address, data)` each (data: bytes-like), in the
        order the launch's pointers come; returns the bytes kept. Rows past the limit are clipped."""
        budget = self.limit
        clipped = False
        for off, addr, data in reads:
            d = data if isinstance(data, bytes) else bytes(data)
            if not d:
                continue
            if len(d) > budget:
                self.clipped_bytes += len(d) - budget
                d = d[:budget]
                clipped = True
                if not d:
                    continue
            budget -= len(d)
            a = int(addr)
            last = self._last.get(a)
            if self.omit_repeats and last is not None and (last is d or last == d):
                self.omitted += 1
                continue
            self._last[a] = d
            c = self._cols
            c[T.LAUNCH_ID].append(int(launch_id))
            c[T.PARAM_OFFSET].append(int(off))
            c[T.ADDRESS].append(a)
            c[T.BYTES].append(len(d))
            c[T.DATA].append(d)
        if clipped:
            self.clipped_launches += 1
        return self.limit - budget

    def take(self) -> dict:
        """The rows kept since the last call, as columns (for a TraceWriter's append); cleared."""
        out = self._cols
        self._cols = {k: [] for k in T.SCHEMAS[T.VALUES].names}
        return out

    def manifest(self) -> dict:
        """The manifest's `values` object for what was recorded."""
        return {"limit_bytes": self.limit, "clipped_bytes": int(self.clipped_bytes),
                "clipped_launches": int(self.clipped_launches),
                "repeats": "omitted" if self.omit_repeats else "kept"}


# ---- reading ----------------------------------------------------------------

class ValueImage:
    """A trace's index values, looked up by (launch, address) (see the module doc)."""

    def __init__(self, trace: T.Trace) -> None:
        self.page_size = trace.page_size
        self.n_launches = trace.n_launches
        self.omitted = trace.values_repeats_omitted
        self.report = {"clipped_to_allocation": 0, "outside_allocation": 0}
        t = trace.values
        if t is None or t.num_rows == 0:
            self._empty()
            return
        lid = t.column(T.LAUNCH_ID).to_numpy().astype(I64)
        addr = t.column(T.ADDRESS).to_numpy().astype(np.uint64)
        nb = t.column(T.BYTES).to_numpy().astype(I64)
        data = t.column(T.DATA).combine_chunks()
        # rows reaching past their allocation are clipped to it; rows in none are dropped
        idx = AllocIndex(trace.allocations)
        a = idx.lookup(addr, lid, one_past=False)
        inside = a >= 0
        room = np.where(inside, (idx.end[np.maximum(a, 0)] - addr).astype(I64) if idx.n else 0, 0)
        cut = inside & (room < nb)
        self.report["outside_allocation"] = int((~inside).sum())
        self.report["clipped_to_allocation"] = int((nb - room)[cut].sum())
        nb = np.where(cut, room, nb)
        keep = inside & (nb > 0)
        if self.report["outside_allocation"] or self.report["clipped_to_allocation"]:
            warnings.warn(f"{trace.path / T.VALUES}: {self.report['outside_allocation']} rows point into no"
                          f" allocation live at their launch (dropped); {self.report['clipped_to_allocation']}"
                          " bytes past the end of their allocation (clipped)", T.TraceWarning, stacklevel=2)
        rows = np.flatnonzero(keep)
        self.launch, self.address, self.nbytes = lid[rows], addr[rows], nb[rows]
        bufs = data.buffers()
        offs = np.frombuffer(bufs[1], np.int32 if pa.types.is_binary(data.type) else np.int64,
                             len(data) + 1, data.offset * (4 if pa.types.is_binary(data.type) else 8))
        self._raw = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
        self.start = offs[:-1].astype(I64)[rows]
        # by address, then launch: the rows read from one address in launch order
        ua, rank = np.unique(self.address, return_inverse=True)
        self._ua = ua
        self._key = rank.astype(I64) * (self.n_launches + 1) + self.launch
        self._order = np.argsort(self._key, kind="stable")
        self._skey = self._key[self._order]
        self._since = None

    def _empty(self) -> None:
        z = np.zeros(0, I64)
        self.launch, self.address, self.nbytes, self.start = z, np.zeros(0, np.uint64), z.copy(), z.copy()
        self._raw = np.zeros(0, np.uint8)
        self._ua = np.zeros(0, np.uint64)
        self._key = self._skey = self._order = z.copy()
        self._since = None

    @property
    def n_rows(self) -> int:
        return len(self.launch)

    def find(self, launch, address) -> np.ndarray:
        """Per (launch, pointer value): the row holding what the buffer there held when the launch
        started (-1: none recorded)."""
        launch = np.asarray(launch, I64)
        address = np.asarray(address).astype(np.uint64)
        out = np.full(len(launch), -1, I64)
        if self.n_rows == 0 or len(launch) == 0:
            return out
        r = np.searchsorted(self._ua, address)
        ok = (r < len(self._ua)) & (self._ua[np.minimum(r, len(self._ua) - 1)] == address)
        q = r.astype(I64) * (self.n_launches + 1) + launch
        p = np.searchsorted(self._skey, q, side="right") - 1
        pc_ = np.maximum(p, 0)
        hit = ok & (p >= 0) & (self._skey[pc_] // (self.n_launches + 1) == r)
        row = self._order[pc_]
        if not self.omitted:
            hit &= self.launch[row] == launch
        out[hit] = row[hit]
        return out

    def ints(self, row: int, count: int, elem: int = 4) -> np.ndarray:
        """The first `count` little-endian signed integers of `elem` bytes of a row (fewer when
        the row holds fewer), as int64."""
        if row < 0 or count <= 0:
            return np.zeros(0, I64)
        n = min(int(count), int(self.nbytes[row]) // elem)
        s = int(self.start[row])
        b = self._raw[s:s + n * elem]
        return b.view({1: "<i1", 2: "<i2", 4: "<i4", 8: "<i8"}[elem]).astype(I64)

    def data(self, row: int) -> bytes:
        s = int(self.start[row])
        return self._raw[s:s + int(self.nbytes[row])].tobytes()

    def since(self) -> tuple[np.ndarray, np.ndarray]:
        """Per row: the launch of the first row of its run of equal rows from its address (the
        content was first seen then), and the launch of the row before that run (-1: none)."""
        if self._since is None:
            o = self._order
            n = len(o)
            h = np.array([hashlib.blake2b(self._raw[self.start[i]:self.start[i] + self.nbytes[i]],
                                          digest_size=8).digest() for i in o], dtype="V8") if n else np.zeros(0, "V8")
            k = self._key[o] // (self.n_launches + 1)
            new = np.ones(n, bool)
            new[1:] = (k[1:] != k[:-1]) | (h[1:] != h[:-1]) | (self.nbytes[o][1:] != self.nbytes[o][:-1])
            run0 = np.maximum.accumulate(np.where(new, np.arange(n), 0))
            first_l = self.launch[o][run0]
            first_addr = np.r_[True, k[1:] != k[:-1]] if n else np.zeros(0, bool)
            chain0 = np.maximum.accumulate(np.where(first_addr, np.arange(n), 0))
            prev = np.where(run0 > chain0, self.launch[o][np.maximum(run0 - 1, 0)], -1)
            since, before = np.empty(n, I64), np.empty(n, I64)
            since[o], before[o] = first_l, prev
            self._since = (since, before)
        return self._since


def image(trace: T.Trace) -> ValueImage:
    """The trace's ValueImage, made once per Trace object."""
    im = trace.__dict__.get("_value_image")
    if im is None:
        im = ValueImage(trace)
        trace.__dict__["_value_image"] = im
    return im


# ---- when values exist ------------------------------------------------------------

def _writes(trace: T.Trace) -> np.ndarray:
    """Sorted keys big_page * (n + 1) + launch of the trace's observed writes (write/atomic faults),
    made once per Trace object (the simulator's runner asks `producers` at every indexed launch)."""
    keys = trace.__dict__.get(T.DERIVED + "value_writes")
    if keys is None:
        keys = trace.__dict__[T.DERIVED + "value_writes"] = _observed_writes(trace)
    return keys


def _observed_writes(trace: T.Trace) -> np.ndarray:
    """Read piece by piece (Trace.batches: a row group at a time when the trace was read lazily)."""
    n = trace.n_launches
    clock = None
    keys = []
    for f in trace.batches(T.FAULTS, (T.TIME_NS, T.ADDRESS, T.ACCESS, T.LAUNCH_ID)):
        w = pc.is_in(f.column(T.ACCESS), value_set=pa.array(WRITES)).to_numpy(zero_copy_only=False)
        if not w.any():
            continue
        f = f.filter(pa.array(w))
        clock = clock or LaunchClock(trace)
        lid = clock.attribute(f.column(T.LAUNCH_ID), f.column(T.TIME_NS))
        bp = (f.column(T.ADDRESS).to_numpy().astype(np.uint64) // np.uint64(BIG_PAGE)).astype(I64)
        ok = lid >= 0
        keys.append(np.unique(bp[ok] * (n + 1) + lid[ok]))
    return np.unique(np.concatenate(keys)) if keys else np.zeros(0, I64)


def _latest_write(keys: np.ndarray, n: int, bp0: np.ndarray, bp1: np.ndarray, before: np.ndarray) -> np.ndarray:
    """Per query: the latest launch < before[q] with a write on a big page in [bp0, bp1) (-1: none)."""
    q = len(before)
    out = np.full(q, -1, I64)
    if q == 0 or len(keys) == 0:
        return out
    cnt = np.maximum(bp1 - bp0, 0)
    rep = np.repeat(np.arange(q), cnt)
    bp = np.repeat(bp0, cnt) + (np.arange(len(rep), dtype=I64) - np.repeat(np.cumsum(cnt) - cnt, cnt))
    k = bp * (n + 1) + before[rep] - 1
    p = np.searchsorted(keys, k, side="right") - 1
    pc_ = np.maximum(p, 0)
    hit = (p >= 0) & (keys[pc_] // (n + 1) == bp) & (before[rep] > 0)
    lat = np.where(hit, keys[pc_] % (n + 1), -1)
    np.maximum.at(out, rep, lat)
    return out


def producers(trace: T.Trace, launch, rows) -> np.ndarray:
    """Per (launch c, values row r found for it): the launch after which c's values exist (-1:
    before the trace's first launch). See the module doc."""
    launch = np.asarray(launch, I64)
    rows = np.asarray(rows, I64)
    out = np.maximum(launch - 1, -1)
    if len(launch) == 0 or trace.mode != "full":
        return out
    im = image(trace)
    keys = _writes(trace)
    n = trace.n_launches
    if len(keys) == 0:
        return out        # no write is seen anywhere: c - 1, conservatively
    ok = rows >= 0
    r = np.maximum(rows, 0)
    a = im.address[r]
    bp0 = (a // np.uint64(BIG_PAGE)).astype(I64)
    bp1 = ((a + im.nbytes[r].astype(np.uint64) + np.uint64(BIG_PAGE - 1)) // np.uint64(BIG_PAGE)).astype(I64)
    w = _latest_write(keys, n, bp0, bp1, launch)
    since, prev = im.since()
    first = since[r]
    # the content first seen at `first`: explained by a write after the row before it, else the host's
    w_first = _latest_write(keys, n, bp0, bp1, first)
    explained = w_first >= np.maximum(prev[r], 0) if len(r) else np.zeros(0, bool)
    explained &= w_first >= 0
    host = np.where(explained, -1, first - 1)
    return np.where(ok, np.maximum(w, host), out)
