"""Host placement: allocations left in host memory, which the GPU reads and writes over the link.

A managed range whose preferred location is the CPU and that the GPU may access
(`cudaMemAdviseSetPreferredLocation(cpu)` with `cudaMemAdviseSetAccessedBy(gpu)`) stays in host
memory under nvidia-uvm on a host without ATS: the GPU maps its pages remotely, never migrates
them, holds no GPU memory for them, and a page the GPU reaches before any processor holds it
faults once (it is populated on the host, then mapped). Host memory is mapped uncached, so every
launch's accesses cross the link again. docs/cost-model.md, "Host placement", gives the driver's
functions and what the simulator charges.

Migrating such a range can cost far more: GPU memory is handed out in whole 2 MiB chunks, so a
launch that reads a few pages from many blocks (a KV pool whose requests' pages are scattered)
needs a chunk for each block, and at high oversubscription every policy evicts and brings back
chunks at every step. `host_candidates` names the allocations where leaving them on the host
can win on the bytes alone: the launches' accesses to them, over the whole run, carry fewer
bytes than the chunks their touched blocks take. Whether it does win is for a trial run to say
(sim/sweep.py runs the planned policies with and without them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow.compute as pc

from pagecast import footprints as F
from pagecast import trace as T

I64 = np.int64


@dataclass(frozen=True)
class HostRanges:
    """Byte ranges [start, end) placed on the host, sorted and disjoint."""

    start: np.ndarray
    end: np.ndarray

    @classmethod
    def none(cls) -> HostRanges:
        return cls(np.zeros(0, I64), np.zeros(0, I64))

    def __len__(self) -> int:
        return len(self.start)

    @property
    def nbytes(self) -> int:
        return int((self.end - self.start).sum())

    def pages(self, page_size: int) -> tuple[np.ndarray, np.ndarray]:
        """The ranges in pages of `page_size`: every page any byte of a range lies in."""
        return self.start // page_size, -((-self.end) // page_size)


def split_footprints(fp: F.Footprints, hs: np.ndarray, he: np.ndarray) -> tuple[F.Footprints, F.Footprints]:
    """`fp` cut at page ranges [hs, he) (sorted, disjoint): (the pieces outside them, the pieces inside)."""
    s, e, lid = fp.start, fp.end, fp.launch_of_interval()
    if len(hs) == 0 or len(s) == 0:
        return fp, F.Footprints(np.zeros(fp.n_launches + 1, I64), s[:0], e[:0], fp.page_size, fp.source)
    cuts = np.unique(np.concatenate([hs, he]))
    lo = np.searchsorted(cuts, s, side="right")      # first cut > s
    n = np.searchsorted(cuts, e, side="left") - lo   # cuts strictly inside (s, e)
    n = np.maximum(n, 0)
    pieces = n + 1
    rep = np.repeat(np.arange(len(s), dtype=I64), pieces)
    k = np.arange(int(pieces.sum()), dtype=I64) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    top = len(cuts) - 1
    ps = np.where(k == 0, s[rep], cuts[np.clip(lo[rep] + k - 1, 0, top)])
    pe = np.where(k == n[rep], e[rep], cuts[np.clip(lo[rep] + k, 0, top)])
    j = np.searchsorted(hs, ps, side="right") - 1
    inside = (j >= 0) & (ps < he[np.maximum(j, 0)])
    pl = lid[rep]

    def part(mask: np.ndarray) -> F.Footprints:
        ptr = np.zeros(fp.n_launches + 1, I64)
        np.cumsum(np.bincount(pl[mask], minlength=fp.n_launches), out=ptr[1:])
        return F.Footprints(ptr, ps[mask], pe[mask], fp.page_size, fp.source)

    return part(~inside), part(inside)


def first_touches(host: F.Footprints) -> np.ndarray:
    """Per launch, the pages of `host` that no earlier launch touched: each faults once (the GPU
    reaches it before any processor holds it). The host pieces are few (host_candidates: fewer
    bytes over the run than a few chunks), so they are expanded page by page."""
    lid = np.repeat(host.launch_of_interval(), host.end - host.start)
    pages = F.expand_intervals(host.start, host.end)
    out = np.zeros(host.n_launches, I64)
    if len(pages):
        _, first = np.unique(pages, return_index=True)   # launches are in order: the first row is the first touch
        np.add.at(out, lid[first], 1)
    return out


def _allocation_ranges(trace: T.Trace) -> tuple[np.ndarray, np.ndarray]:
    """The trace's managed allocations as byte ranges, sorted; ranges that overlap another (an address
    reused after a free) are left out: a placement is one advice over a range, for the whole run."""
    A = trace.allocations
    if A.num_rows == 0:
        return np.zeros(0, I64), np.zeros(0, I64)
    m = np.asarray(pc.equal(A.column(T.KIND), "managed").fill_null(False).to_numpy(zero_copy_only=False), bool)
    a = A.column(T.ADDRESS).to_numpy().astype(I64)[m]
    b = a + A.column(T.BYTES).to_numpy().astype(I64)[m]
    o = np.argsort(a, kind="stable")
    a, b = a[o], b[o]
    if len(a) < 2:
        return a, b
    hi_before = np.maximum.accumulate(b)
    clash = np.zeros(len(a), bool)
    clash[1:] = a[1:] < hi_before[:-1]          # starts inside an earlier range
    clash[:-1] |= b[:-1] > a[1:]                 # runs into the next
    return a[~clash], b[~clash]


def host_candidates(trace: T.Trace, fp: F.Footprints, eviction_unit: int) -> HostRanges:
    """The managed allocations of `trace` worth leaving on the host by the bytes alone, judged on
    footprints `fp` (a planner's own view: predictions for template, the truth for oracle): the
    launches' accesses to the allocation, summed over the run, carry fewer bytes than the chunks
    its touched `eviction_unit` blocks take. Allocations smaller than one block are left out (they
    take 64 KiB chunks, not whole blocks), as are those no launch touches."""
    a, b = _allocation_ranges(trace)
    keep = (b - a) >= eviction_unit
    a, b = a[keep], b[keep]
    if len(a) == 0 or fp.n_intervals == 0:
        return HostRanges.none()
    ps = fp.page_size
    _, inside = split_footprints(fp, a // ps, -((-b) // ps))
    if inside.n_intervals == 0:
        return HostRanges.none()
    j = np.searchsorted(a // ps, inside.start, side="right") - 1
    carried = np.bincount(j, weights=(inside.end - inside.start) * float(ps), minlength=len(a))
    b0 = inside.start * ps // eviction_unit
    b1 = (inside.end * ps - 1) // eviction_unit + 1
    blocks = F.expand_intervals(b0, b1)
    owner = np.repeat(j, b1 - b0)
    pairs = np.unique(owner * (int(blocks.max()) + 1) + blocks) // (int(blocks.max()) + 1)
    chunk_bytes = np.bincount(pairs, minlength=len(a)).astype(np.float64) * eviction_unit
    pick = (carried > 0) & (carried < chunk_bytes)
    return HostRanges(a[pick], b[pick])


def host_split(truth: F.Footprints, host: HostRanges) -> tuple[F.Footprints, np.ndarray, np.ndarray]:
    """A task's footprints with `host` placed on the host: (what stays for GPU memory, per launch the
    bytes it reads and writes over the link, per launch its first-touch faults)."""
    if len(host) == 0:
        z = np.zeros(truth.n_launches, I64)
        return truth, z, z.copy()
    kept, on_host = split_footprints(truth, *host.pages(truth.page_size))
    return kept, on_host.pages_per_launch() * truth.page_size, first_touches(on_host)
