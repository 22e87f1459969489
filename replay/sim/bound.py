"""A lower bound on a replay's time that no policy can beat, computed without any plan.

`lower_bound(w, cap_units, profile)` (seconds) holds for every run of the
simulator on workload `w` at that capacity, whatever the policy: it is derived
from the clock's own charges (timing.py) and what any residency must move, not
from a plan (docs/cost-model.md, "The lower bound", gives the argument and how
tight it is on the workload models):

- Launches run one after another and each takes at least its kernel time, so
  launch i cannot end before the kernel times of launches 0..i.
- Some units must come in: the fewest fetches any residency of `cap_units`
  units makes for the touches of launches 0..i is Belady's (furthest next use
  first, on the touches in order: a launch touches its units in ascending
  order), and Belady's misses in a prefix are the fewest for that prefix.
- A unit comes in one of three ways: a planned transfer on the copy engines
  (at least granularity / htod_bandwidth of copy-engine time, which starts at
  0 and runs one transfer at a time; a launch waits for the transfers of the
  units it touches), a fault (fault_time_s of its launch's time) or the tree
  prefetcher after a fault in the same 2 MiB block (at least granularity /
  htod_bandwidth of the launch's time, at most `tree_fill` units per fault).
  The simulator charges the copy engines and the launches' fault path
  separately (it does not model their contention), so the two run side by
  side: x units by the copy engines take x * c_copy, the rest at least
  c_fault each on the launches' path, beside the kernels.
- Planned transfers run between launches, so a launch larger than memory
  brings at least (its units - capacity) in on the faults' path (M_i in all
  up to launch i).

So launch i ends no earlier than min over x <= F_i - M_i of max(x * c_copy, K_i +
(F_i - x) * c_fault) (K_i: kernel time of 0..i, F_i: Belady's fetches in 0..i),
and the run no earlier than that plus the kernel time and the in-launch fetches
of the launches after i; the bound is the largest over i. Evictions,
per-transfer charges and waits are left out (each only adds time), which is
what keeps it a bound for every plan.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..plan.belady import _heap_pop, _heap_push
from ..unit_space import Workload
from .run import fault_entries

INF = np.iinfo(np.int64).max


@njit(cache=True, nogil=True)
def belady_misses(ptr, unit, n_units, cap):
    """Per step, the misses of Belady's algorithm on the touches in order (step by step, each
    step's units in the order given), with room for `cap` units: the fewest fetches any residency
    makes for every prefix of the steps."""
    n_steps = len(ptr) - 1
    n = len(unit)
    nxt_pos = np.full(n, INF, np.int64)
    last = np.full(n_units, INF, np.int64)
    for k in range(n - 1, -1, -1):
        u = unit[k]
        nxt_pos[k] = last[u]
        last[u] = k
    key = np.full(n_units, -1, np.int64)     # next use (position) of each resident unit; -1: not resident
    # a push per touch; stale entries are dropped when the heap fills (it stays a few times the units)
    cap_heap = min(n, 4 * n_units + 1024) + n_units + 16
    hk = np.empty(cap_heap, np.int64)
    hu = np.empty(cap_heap, np.int64)
    size = 0
    held = 0
    out = np.zeros(n_steps, np.int64)
    for s in range(n_steps):
        for k in range(ptr[s], ptr[s + 1]):
            u = unit[k]
            if key[u] < 0:
                out[s] += 1
                if held >= cap:
                    while size > 0:
                        v = hu[0]
                        kv = hk[0]
                        size = _heap_pop(hk, hu, size)
                        if key[v] == kv:   # not stale
                            key[v] = -1
                            held -= 1
                            break
                held += 1
            key[u] = nxt_pos[k]
            size = _heap_push(hk, hu, size, nxt_pos[k], u)
            if size >= cap_heap - 1:
                size = _rebuild(hk, hu, key)
    return out


@njit(cache=True, nogil=True)
def _rebuild(hk, hu, key):
    size = 0
    for u in range(len(key)):
        if key[u] >= 0:
            size = _heap_push(hk, hu, size, key[u], u)
    return size


def max_resident_units(chunk_units: np.ndarray, chunk_weight: np.ndarray, cap_units: int) -> int:
    """The most units any residency can hold at once when memory is taken in chunks (chunk c holds
    up to chunk_units[c] units and takes chunk_weight[c] of the `cap_units` capacity while any of
    them is resident; weights capped at the capacity, uvm_driver.chunk_weights): at most the best
    choice of chunks whose weights fit. Exact over the chunks of the largest weight (each count of
    them tried), the rest filled as a fractional knapsack (densest first), which can only
    overestimate: the result never undercounts, so Belady's misses at it stay a lower bound."""
    cap = int(cap_units)
    n = np.asarray(chunk_units, np.int64)
    wt = np.minimum(np.asarray(chunk_weight, np.int64), max(cap, 1))
    keep = (n > 0) & (wt > 0)
    n, wt = n[keep], wt[keep]
    if len(n) == 0 or cap <= 0:
        return max(cap, 0)
    W = int(wt.max())
    big = np.sort(n[wt == W])[::-1]
    rn, rw = n[wt != W], wt[wt != W]
    order = np.argsort(-(rn / rw), kind="stable")
    rn, rw = rn[order].astype(float), rw[order].astype(float)
    cu = np.concatenate([[0.0], np.cumsum(rn)])
    cw = np.concatenate([[0.0], np.cumsum(rw)])
    k = np.arange(min(len(big), cap // W) + 1)
    held = np.concatenate([[0], np.cumsum(big)])[k]
    rem = (cap - k * W).astype(float)
    j = np.searchsorted(cw, rem, side="right") - 1          # whole chunks of the rest that fit
    frac = np.zeros(len(k))
    part = j < len(rn)
    frac[part] = (rem[part] - cw[j[part]]) * (rn[j[part]] / rw[j[part]])
    best = held + cu[j] + frac
    return int(min(cap, np.floor(best.max() + 1e-9)))


def unit_charges(profile, gran: int, units_per_block: int, tree: bool = True,
                 pages: int = 1) -> tuple[float, float]:
    """(c_copy, c_fault): the least time one unit coming in costs the copy engines, and the least it
    costs the launches' fault path: a fault on a unit the launch touches in at least `pages` pages
    (a fault-buffer entry per page, fault_time_s each, and their share of a batch's overhead: a
    batch holds at most faults_per_batch entries; and its share of its block's service: a block
    serves at most units_per_block faulted units of a batch, and at most faults_per_batch // pages
    of them), or with the tree prefetcher a share of one, each fault filling at most the region it
    finds more than `prefetch_threshold` resident (at most `fill` units of a block of
    `units_per_block`) at the bulk rate."""
    c_copy = gran / profile.htod_bandwidth
    e = max(int(pages), 1)
    fpb = max(int(profile.faults_per_batch), 1)
    per_block = max(min(int(units_per_block), fpb // e), 1)
    per_fault = e * (profile.fault_time_s + profile.batch_overhead_s / fpb) + profile.block_service_s / per_block
    fill = tree_fill(int(units_per_block), float(profile.prefetch_threshold)) if tree else 0
    c_fault = min(per_fault, (per_fault + fill * c_copy) / (fill + 1))
    return c_copy, c_fault


def tree_fill(units_per_block: int, threshold: float) -> int:
    """The most units one fault's tree prefetch brings in: it fills the non-resident units of one
    aligned region of S <= units_per_block units more than `threshold` resident, so at most
    S - floor(threshold * S) - 1 (kernels.py's _tree_prefetch; docs/uvm-facts.md)."""
    best, size = 0, 2
    while size <= units_per_block:
        best = max(best, size - int(np.floor(threshold * size)) - 1)
        size *= 2
    return best


def split_bound(fetches: np.ndarray, kernel: np.ndarray, c_copy: float, c_fault: float,
                in_launch: np.ndarray | None = None) -> np.ndarray:
    """min over x in [0, F - M] of max(x * c_copy, K + (F - x) * c_fault), elementwise: F fetches,
    M of them (`in_launch`) only possible on the faults' path, K the kernels' time (module doc)."""
    F = np.asarray(fetches, float)
    K = np.asarray(kernel, float)
    M = np.zeros_like(F) if in_launch is None else np.asarray(in_launch, float)
    forced = K + M * c_fault
    if c_copy <= 0:
        return forced
    cross = c_copy * (K + F * c_fault) / (c_copy + c_fault)
    free = np.where(F * c_copy <= K, K, np.maximum(cross, K))
    return np.maximum(free, forced)


def lower_bound(w: Workload, cap_units: int, profile, compute: np.ndarray, tree: bool = True) -> float:
    """Seconds no policy's run of `w` at `cap_units` can beat under `profile` (module doc).
    `compute`: each step's kernel time, as the run charges it (run.step_compute); `tree`: whether
    the run has the tree prefetcher."""
    n = w.n_steps
    if n == 0 or not profile.charges:
        return 0.0
    # memory is taken in chunks: no residency holds more units than the best chunks that fit
    uni = w.universe
    held = max_resident_units(uni.chunk_hi - uni.chunk_lo, uni.chunk_weight, int(cap_units))
    misses = belady_misses(w.truth.ptr, w.truth.unit, int(uni.n_units), held)
    F = np.cumsum(misses)
    comp = np.asarray(compute, float)
    K = np.cumsum(comp)
    # a launch larger than memory starts with at most cap_units of its units resident: the rest come
    # in while it runs, which only the faults' path does (planned transfers run between launches)
    over = np.maximum(np.diff(w.truth.ptr) - held, 0)
    M = np.cumsum(over)
    # a fault makes one entry per page its launch touches in the unit (run.fault_entries): any fetch
    # on the faults' path costs at least the fewest entries of any use; an in-launch one, the fewest
    # of its own launch's uses
    pages = fault_entries(w)
    p_all = int(pages.min()) if len(pages) else 1
    c_copy, c_fault = unit_charges(profile, w.gran, w.universe.upb, tree, p_all)
    sizes = np.diff(w.truth.ptr)
    p_step = np.full(n, p_all, np.int64)
    has = sizes > 0
    if has.any():
        p_step[has] = np.minimum.reduceat(pages, w.truth.ptr[:-1][has])
    c_step = np.array([unit_charges(profile, w.gran, w.universe.upb, tree, int(p))[1] for p in np.unique(p_step)])
    c_in = c_step[np.searchsorted(np.unique(p_step), p_step)]   # per launch, its in-launch fetch's least cost
    M_cost = np.cumsum(over * c_in)
    # the in-launch fetches cost c_in each, the rest at least c_fault: K carries the difference
    ends = split_bound(F, K + (M_cost - M * c_fault), c_copy, c_fault, M)
    # after launch i, every later launch still takes its kernel time and its own in-launch fetches
    rest = (K[-1] - K) + (M_cost[-1] - M_cost)
    return float(max((ends + rest).max(), K[-1] + M_cost[-1]))
