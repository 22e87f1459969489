"""The UVM driver's fault path, rule by rule, as the simulator's engine calls it (numba, cache=True).

Each rule follows a function of nvidia-uvm (kernel-open/nvidia-uvm in NVIDIA's open-gpu-kernel-modules);
docs/cost-model.md, "The driver model", names them and gives the argument. The named hooks:

- **service granularity** (`service_granularity`): what one fault moves. The 64 KiB big page is the
  prefetcher's widening (`grow_fault_granularity`); with the prefetcher off a fault moves its 4 KiB
  page, so the run's migration unit is the trace's page.
- **capacity in chunks** (`room_for`, `populate`, `depopulate`): GPU memory is handed out in chunks
  (unit_space.chunk_starts); a chunk takes its whole size of the capacity while any unit of it is
  resident, and leaves as a whole (`evict_chunk`: only its resident units are copied back).
- **victim order** (`VICTIM_*`, `on_migrate`): the chunk list's order. The driver's (`driver`) moves a
  chunk to the tail when it is allocated and on every migration into it (`block_mark_memory_used`) and
  evicts from the head (`pick_root_chunk_to_evict`); `fifo` (first residency only) and `lru` (every
  touch) are kept as labelled alternatives.
- **batches** (`FaultBatch` in the engine, counted here by `count_service`): faults are serviced in
  batches of up to `faults_per_batch`, each 2 MiB VA block once per batch; the charges are per fault,
  per serviced block and per batch (timing.fault_seconds).
- **prefetch** (`tree_prefetch`): the tree prefetcher, run once per faulted unit at the end of its batch,
  so its counts hold the resident units and every unit the batch faulted in the block
  (`compute_prefetch_region`); it never leaves the block and never evicts.
- Thrashing detection (`uvm_perf_thrashing.c`) is not a rule here: it reacts only to consecutive
  migrations of a page to different processors, and a trace of GPU launches has none
  (docs/cost-model.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from pagecast.errors import UsageError
from pagecast.uvm import PAGE

from ..policies.base import VICTIM_ORDERS as ORDER_NAMES

VICTIM_FIFO, VICTIM_LRU, VICTIM_DRIVER = 0, 1, 2
CODES = {"driver": VICTIM_DRIVER, "fifo": VICTIM_FIFO, "lru": VICTIM_LRU}
VICTIM_ORDERS = {name: CODES[name] for name in ORDER_NAMES}   # every order --eviction names, coded


@dataclass(frozen=True)
class DriverRules:
    """The fault path's settings for one run: its victim order, whether the prefetcher runs (and so
    what a fault moves) and the fault batch."""

    victim_order: str = "driver"
    prefetch: bool = True
    faults_per_batch: int = 256

    def __post_init__(self) -> None:
        if self.victim_order not in VICTIM_ORDERS:
            raise UsageError(f"--eviction must be one of {', '.join(VICTIM_ORDERS)}, not {self.victim_order!r}")

    @property
    def victim_code(self) -> int:
        return VICTIM_ORDERS[self.victim_order]


def chunk_weights(weight, cap_units: int):
    """The chunks' weights for a run at `cap_units`: a chunk larger than memory counts as all of it."""
    return np.minimum(weight, max(int(cap_units), 1))


def service_granularity(profile_granularity: int, prefetch: bool, page_size: int = PAGE) -> int:
    """Bytes one fault moves: the profile's big page (64 KiB) when the prefetcher widens faults to it
    (`grow_fault_granularity`), else one page."""
    return int(profile_granularity) if prefetch else min(int(profile_granularity), int(page_size))


# ---- the chunk list -------------------------------------------------------------------------
# A doubly linked list over chunks with sentinel index C (prev/next sized C+1); head = next victim.

@njit(cache=True)
def list_remove(prev, nxt, c):
    p = prev[c]
    n = nxt[c]
    nxt[p] = n
    prev[n] = p
    prev[c] = -1
    nxt[c] = -1


@njit(cache=True)
def list_append(prev, nxt, c, sentinel):
    t = prev[sentinel]
    nxt[t] = c
    prev[c] = t
    nxt[c] = sentinel
    prev[sentinel] = c


@njit(cache=True)
def to_tail(prev, nxt, c, sentinel):
    list_remove(prev, nxt, c)
    list_append(prev, nxt, c, sentinel)


@njit(cache=True)
def room_for(u, unit_chunk, chunk_count, weight):
    """Units of capacity bringing u in takes: its chunk's whole size if the chunk is not populated.
    (A chunk's weight is capped at the capacity, `chunk_weights`: a chunk larger than memory takes
    all of it, and each unit beyond the cap one more, so resident units never exceed the capacity.)"""
    c = unit_chunk[u]
    n = chunk_count[c]
    if n == 0:
        return weight[c]
    return 1 if n >= weight[c] else 0


@njit(cache=True)
def populate(u, st, resident, unit_chunk, chunk_count, weight, prev, nxt, sentinel, order):
    """u becomes resident: a chunk not yet populated takes its weight of the capacity (st[0]) and
    goes to the list's tail; with the driver's order, so does a populated one (a migration into it)."""
    resident[u] = 1
    c = unit_chunk[u]
    if chunk_count[c] == 0:
        list_append(prev, nxt, c, sentinel)
        st[0] += weight[c]
    else:
        if chunk_count[c] >= weight[c]:
            st[0] += 1
        if order == VICTIM_DRIVER:
            to_tail(prev, nxt, c, sentinel)
    chunk_count[c] += 1


@njit(cache=True)
def depopulate(u, st, resident, planned, unit_chunk, chunk_count, weight, prev, nxt):
    """u leaves the GPU; its chunk is freed (its weight back to the capacity) when it empties."""
    resident[u] = 0
    planned[u] = 0
    c = unit_chunk[u]
    if chunk_count[c] > weight[c]:
        st[0] -= 1
    chunk_count[c] -= 1
    if chunk_count[c] == 0:
        list_remove(prev, nxt, c)
        st[0] -= weight[c]


@njit(cache=True)
def on_touch(c, prev, nxt, sentinel, order):
    """A launch touched a resident unit of chunk c: only LRU reorders on a hit."""
    if order == VICTIM_LRU:
        to_tail(prev, nxt, c, sentinel)


@njit(cache=True)
def on_fault(c, prev, nxt, sentinel, order):
    """A fault brought a unit of chunk c in: LRU counts it as an access (populate moved it already for
    the driver's order; FIFO keeps its first place)."""
    if order == VICTIM_LRU:
        to_tail(prev, nxt, c, sentinel)


@njit(cache=True)
def evict_chunk(c, sp, m):
    """Evict chunk c whole (`evict_root_chunk` -> `uvm_va_block_evict_chunks`: its resident units go back
    to the host). `sp`, `m`: the engine's Space and Mem bundles (sim/kernels.py). Returns the units
    copied out."""
    resident = m.resident
    n = 0
    for u in range(sp.chunk_lo[c], sp.chunk_hi[c]):
        if resident[u] == 1:
            depopulate(u, m.st, resident, m.planned, sp.unit_chunk, m.chunk_count, sp.chunk_weight, m.prev, m.nxt)
            n += 1
    return n


@njit(cache=True)
def head_chunk(prev, nxt, sentinel):
    """The next victim (`pick_root_chunk_to_evict`: the head of the list), or -1."""
    c = nxt[sentinel]
    return -1 if c == sentinel else c
