"""LRU demand paging at every capacity in one pass: stack distances (numba)."""

from __future__ import annotations

import numpy as np
from numba import njit

from ..plan.groups import Groups
from ..unit_space import I64, Workload
from .kernels import C_BATCHES, C_BLOCKS, C_FAULT_DTOH, C_FAULT_IN, C_FAULTS, N_COUNTERS
from .run import RunResult, fault_entries, step_compute
from .timing import run_timing

INF = np.iinfo(np.int64).max

@njit(cache=True)
def lru_stack_distances(seq, n_units):
    """LRU stack distance of every access (1-based; INF for a first access).

    A Fenwick tree over access times marks each unit's latest access; the
    distance of an access is the number of marks after its unit's previous
    access, plus one. O(N log N), O(N + U) memory.
    """
    n = len(seq)
    tree = np.zeros(n + 1, np.int32)
    last = np.full(n_units, -1, np.int64)
    out = np.empty(n, np.int64)
    total = 0
    for t in range(n):
        u = seq[t]
        p = last[u]
        if p < 0:
            out[t] = INF
        else:
            # marks in (p, t) = total - prefix(p)
            s = 0
            i = p + 1
            while i > 0:
                s += tree[i]
                i -= i & (-i)
            out[t] = total - s + 1
            i = p + 1
            while i <= n:
                tree[i] -= 1
                i += i & (-i)
            total -= 1
        i = t + 1
        while i <= n:
            tree[i] += 1
            i += i & (-i)
        total += 1
        last[u] = t
    return out


def batch_counts(miss: np.ndarray, ptr: np.ndarray, block: np.ndarray, batch: int,
                 entries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per step, the fault batches and the VA-block services its misses make: each step's misses, in
    order, their `entries` (fault-buffer entries each) filling batches of `batch`, each block serviced
    once per batch (as kernels.run_engine counts; without the prefetcher, nothing comes in between)."""
    n = len(ptr) - 1
    step = np.repeat(np.arange(n, dtype=I64), np.diff(ptr))[miss]
    _batches, _blocks = _batch_walk(step, block[miss].astype(I64), entries[miss].astype(I64), n, int(batch))
    return _batches, _blocks


@njit(cache=True)
def _batch_walk(step, blk, ent, n, batch):
    batches = np.zeros(n, np.int64)
    blocks = np.zeros(n, np.int64)
    nb = 0
    last_step = -1
    last_block = -1
    for j in range(len(step)):
        s = step[j]
        if s != last_step:
            nb = 0
            last_step = s
        e = ent[j]
        if nb > 0 and nb + e > batch:
            nb = 0
        if nb == 0:
            batches[s] += (e + batch - 1) // batch
            last_block = -1
        if blk[j] != last_block:
            blocks[s] += 1
            last_block = blk[j]
        nb += e
        if nb >= batch:
            nb = 0
    return batches, blocks


def demand_lru_all(w: Workload, caps_units: list[int], profile) -> list[RunResult]:
    """LRU demand paging at every capacity in one pass (stack distances).

    Exact when a unit is both the migration and the eviction unit and the tree
    prefetcher is off: then LRU is a stack algorithm and a touch misses at
    capacity c exactly when its stack distance exceeds c.
    """
    seq = w.truth.unit
    dist = lru_stack_distances(seq, w.universe.n_units)
    n = w.n_steps
    ptr = w.truth.ptr
    nonempty = np.flatnonzero(np.diff(ptr) > 0)
    comp = step_compute(w)
    g = Groups.empty(n)
    out = []
    for cap in caps_units:
        miss = dist > cap
        counters = np.zeros((n, N_COUNTERS), I64)
        if len(seq):
            per = np.add.reduceat(miss.astype(I64), ptr[nonempty])
            counters[nonempty, C_FAULTS] = per
            counters[nonempty, C_FAULT_IN] = per
            entries = fault_entries(w)
            counters[nonempty, C_FAULTS] = np.add.reduceat((miss * entries).astype(I64), ptr[nonempty])
            counters[:, C_BATCHES], counters[:, C_BLOCKS] = batch_counts(
                miss, ptr, w.universe.block_lo[seq], int(profile.faults_per_batch), entries)
            cum = np.cumsum(counters[:, C_FAULT_IN])
            ev = np.maximum(cum - cap, 0)
            counters[:, C_FAULT_DTOH] = np.diff(np.concatenate([[0], ev]))
        start, end, stall = run_timing(counters, comp, w.gran, g, profile)
        out.append(RunResult("demand", cap, counters, start, end, stall, comp, {"one_pass": True}))
    return out
