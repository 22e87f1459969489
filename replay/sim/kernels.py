"""The simulator's memory model, compiled with numba (cache=True).

Everything here works on dense *unit* ids (0..U-1): a unit is one migration
granule (default 64 KiB) that some launch touches, some plan moves or some
allocation covers. Units of one eviction chunk (2 MiB) have consecutive ids
[chunk_lo[c], chunk_hi[c]); units of one 2 MiB VA block likewise
[block_lo[u], block_hi[u]). `key[u]` is the unit's number in its task's
address space (address // granularity), used by the tree prefetcher.

The state travels in three bundles (namedtuples of arrays, so that no kernel
takes more than about ten arguments): `Space`, the universe's read-only
geometry; `Mem`, the residency state (arrays owned by `run.Memory`, mutated in
place); `Rules`, the run's switches. A plan's arrays are `PlanArrays`, a
launch sequence `Steps`. The functions return per-launch counters. Belady within a
launch larger than memory is the planner's (plan/belady.py), so that plan and
run agree; numba caches per file, so after editing it, clear this file's
cache too (remove replay/sim/__pycache__).
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit

from ..plan.belady import INF, InLaunch, _inlaunch_victims
from . import uvm_driver as D

# The universe's geometry (read only): each unit's chunk and 2 MiB block, chunk ranges, address keys,
# units per block.
Space = namedtuple("Space", "unit_chunk chunk_lo chunk_hi key block_lo block_hi upb chunk_weight")
# The residency state: capacity (units), st = [units of capacity taken (populated chunks' weights,
# driver.populate), head and tail of uq], per unit
# resident/planned, per chunk its resident count and its place in the FIFO/LRU list (prev/nxt,
# sentinel = n_chunks), uq, the queue of units brought in by faults (a ring, st[1] <= st[2]), and per
# unit the planned group that last brought it in and its place among that group's transfers (src_group,
# -1 when a fault or the tree prefetcher brought it; src_pos), so that a launch waits for the transfers
# whose units it really touches (timing.py).
Mem = namedtuple("Mem", "cap st resident planned chunk_count prev nxt uq src_group src_pos")
# A run's switches: LRU list order, the tree prefetcher and its threshold, whether the policy plans
# (faults first evict what the plan does not count on), whether next uses are known (Belady within a
# launch larger than memory), whether to stop after a step that faulted (feedback).
# `order`: the victim order (uvm_driver.VICTIM_*), `batch`: fault-buffer entries per batch (uvm_driver.py).
Rules = namedtuple("Rules", "order tree threshold track_unplanned has_next_use stop_on_miss batch")
# A plan's groups (plan.groups.Groups' arrays; step i's group is group i - base), and a launch sequence's
# units in CSR form with, per occurrence, its next use (rules.has_next_use).
PlanArrays = namedtuple("PlanArrays", "ev_ptr ev_unit pf_ptr pf_unit need_now base")
# `pages`: per occurrence, the pages the launch touches in the unit (its fault-buffer entries there).
Steps = namedtuple("Steps", "ptr unit next_use pages")
GROUP, LAUNCH = 1, 2   # what run_engine runs of each step

# Indices of the per-step counter vector returned by the access/apply kernels.
# C_USED_GROUP: 1 + the latest earlier group whose transfers brought a unit the launch touches (0: none),
# C_USED_POS: how many of that group's units came in up to the last one it touches; C_USED_OWN: the same
# for its own group (the copy engines run groups in order, each in its order: these are the last arrivals).
(C_FAULTS, C_FAULT_IN, C_TREE_IN, C_FAULT_DTOH, C_PREFETCH_IN, C_PREFETCH_NEED, C_TRANSFERS, C_GROUP_DTOH,
 C_USED_GROUP, C_USED_POS, C_USED_OWN, C_BATCHES, C_BLOCKS) = range(13)
N_COUNTERS = 13


@njit(cache=True, inline="always")
def _evict_unplanned(sp, m, limit):
    """Evict the oldest unit brought in by a fault (the plan does not count on
    it) together with the other such units of its eviction chunk, as the
    driver evicts whole chunks: the room lets the tree prefetcher work for the
    faults that follow, as it does under demand paging. At most `limit` units.
    Returns units evicted."""
    resident, planned, uq, st = m.resident, m.planned, m.uq, m.st
    while st[1] < st[2]:
        u = uq[st[1] % len(uq)]
        st[1] += 1
        if resident[u] == 1 and planned[u] == 0:
            c = sp.unit_chunk[u]
            _out(u, m, sp)
            n = 1
            for v in range(sp.chunk_lo[c], sp.chunk_hi[c]):
                if n >= limit:
                    break
                if resident[v] == 1 and planned[v] == 0:
                    _out(v, m, sp)
                    n += 1
            return n
    return 0


@njit(cache=True, inline="always")
def _out(u, m, sp):
    D.depopulate(u, m.st, m.resident, m.planned, sp.unit_chunk, m.chunk_count, sp.chunk_weight, m.prev, m.nxt)


@njit(cache=True)
def _evict_one_chunk(sp, m):
    """Evict room for one unit: first a resident unit the plan does not count on
    (brought in by a fault), else the whole chunk at the head of the list.
    Returns units evicted (0 when nothing is resident)."""
    st, uq, resident, planned = m.st, m.uq, m.resident, m.planned
    sentinel = len(m.chunk_count)
    # unplanned units first (planned policies only: st[2] > st[1])
    while st[1] < st[2]:
        u = uq[st[1] % len(uq)]
        st[1] += 1
        if resident[u] == 1 and planned[u] == 0:
            _out(u, m, sp)
            return 1
    c = D.head_chunk(m.prev, m.nxt, sentinel)
    if c < 0:
        return 0
    return D.evict_chunk(c, sp, m)


@njit(cache=True)
def _tree_prefetch(u, sp, m, rules, counters, row):
    """nvidia-uvm's tree prefetcher, inside u's 2 MiB block: the largest
    aligned region around u more than `threshold` resident is filled
    (docs/uvm-facts.md, "The driver")."""
    key, resident, upb, threshold = sp.key, m.resident, sp.upb, rules.threshold
    lo = sp.block_lo[u]
    hi = sp.block_hi[u]
    ku = key[u]
    best_lo = -1
    best_hi = -1
    size = 2
    while size <= upb:
        r0 = ku - ku % size
        r1 = r0 + size
        cnt = 0
        for v in range(lo, hi):
            if key[v] >= r0 and key[v] < r1 and resident[v] == 1:
                cnt += 1
        if cnt > threshold * size:
            best_lo = r0
            best_hi = r1
        size *= 2
    if best_lo < 0:
        return
    for v in range(lo, hi):
        if key[v] >= best_lo and key[v] < best_hi and resident[v] == 0:
            if m.st[0] + D.room_for(v, sp.unit_chunk, m.chunk_count, sp.chunk_weight) > m.cap:
                return  # the prefetcher never evicts
            D.populate(v, m.st, m.resident, sp.unit_chunk, m.chunk_count, sp.chunk_weight, m.prev, m.nxt,
                       len(m.chunk_count), rules.order)
            m.src_group[v] = -1
            counters[row, C_TREE_IN] += 1
            if rules.track_unplanned:
                m.uq[m.st[2] % len(m.uq)] = v
                m.st[2] += 1


@njit(cache=True)
def _batch_prefetch(missed, b0, b1, sp, m, rules, counters, row):
    """The end of a fault batch: the tree prefetcher around each of its faulted units still resident,
    its counts holding the resident units and the batch's faulted ones (uvm_driver.py)."""
    for j in range(b0, b1):
        u = missed[j]
        if m.resident[u] == 1:
            _tree_prefetch(u, sp, m, rules, counters, row)


@njit(cache=True, nogil=True)
def run_engine(s0, s1, steps, plan, sp, m, rules, missed, counters, what=GROUP | LAUNCH):
    """Steps s0..s1-1 of `steps`: each step's planned group (when
    rules.track_unplanned: the policy plans; group i - plan.base of `plan`),
    then its launch, or only one of the two (`what`: GROUP, LAUNCH).

    A group: evictions, then prefetches in need order; prefetches that find
    memory full evict unplanned units, then list heads; transfers are counted
    as runs of consecutive unit ids. A launch touches its units (ascending):
    hits and misses refresh LRU order, misses fault in their unit (evicting
    chunks as needed) and may trigger the tree prefetcher; its missed units go
    to `missed`. Returns (next step, misses of the last step) -- stopping after
    a step with misses when rules.stop_on_miss (for online feedback).

    Every bundle is unpacked here, once per call: a function taking bundles
    pays for unpacking them at every call (numba counts references to each
    array it takes out), which per launch cost the simulator about 20% on
    launches of 64 units."""
    need_ptr, need_unit, next_use, need_pages = steps.ptr, steps.unit, steps.next_use, steps.pages
    ev_ptr, evict, pf_ptr, prefetch, need_now_of, base = (plan.ev_ptr, plan.ev_unit, plan.pf_ptr, plan.pf_unit,
                                                          plan.need_now, plan.base)
    cap, st_i, resident, planned, prev, nxt = m.cap, m.st, m.resident, m.planned, m.prev, m.nxt
    unplanned_q, chunk_count, src_group, src_pos = m.uq, m.chunk_count, m.src_group, m.src_pos
    unit_chunk, chunk_lo, chunk_hi, block_lo = sp.unit_chunk, sp.chunk_lo, sp.chunk_hi, sp.block_lo
    order, tree, track_unplanned, has_next_use = rules.order, rules.tree, rules.track_unplanned, rules.has_next_use
    weight, batch = sp.chunk_weight, rules.batch
    sentinel = len(chunk_count)
    vict1 = np.empty(1, np.int64)
    sc1 = InLaunch(np.empty(1, np.int64), np.empty(1, np.int64), np.zeros(2, np.int64), np.empty(1, np.int64), vict1,
                   INF - 1)
    for i in range(s0, s1):
        row = i
        if (what & GROUP) and track_unplanned:
            g = i - base
            elo, ehi, plo, phi, need_now = ev_ptr[g], ev_ptr[g + 1], pf_ptr[g], pf_ptr[g + 1], need_now_of[g]
            last = -2
            for k in range(elo, ehi):
                u = evict[k]
                if resident[u] == 1:
                    D.depopulate(u, st_i, resident, planned, unit_chunk, chunk_count, weight, prev, nxt)
                    counters[row, C_GROUP_DTOH] += 1
                    if u != last + 1:
                        counters[row, C_TRANSFERS] += 1
                    last = u
                elif u < len(planned):
                    planned[u] = 0
            last = -2
            needed_in = 0
            for k in range(plo, phi):
                u = prefetch[k]
                if resident[u] == 1:
                    planned[u] = 1
                    continue
                while st_i[0] + D.room_for(u, unit_chunk, chunk_count, weight) > cap:
                    ev = _evict_one_chunk(sp, m)
                    if ev == 0:
                        break
                    counters[row, C_GROUP_DTOH] += ev
                if st_i[0] + D.room_for(u, unit_chunk, chunk_count, weight) > cap:
                    break
                D.populate(u, st_i, resident, unit_chunk, chunk_count, weight, prev, nxt, sentinel, order)
                planned[u] = 1
                counters[row, C_PREFETCH_IN] += 1
                src_group[u] = i
                src_pos[u] = counters[row, C_PREFETCH_IN]
                if k - plo < need_now:
                    needed_in += 1
                if u != last + 1:
                    counters[row, C_TRANSFERS] += 1
                last = u
            counters[row, C_PREFETCH_NEED] += needed_in
        if not (what & LAUNCH):
            continue
        units, lo, hi = need_unit, need_ptr[i], need_ptr[i + 1]
        nmiss = 0
        used_ptr = lo
        oversized = hi - lo > cap
        # Belady within a launch larger than memory (planned policies that know the
        # next use of each of its units, next_use[k]: the step, capped): its used
        # units leave furthest next use first, ties earliest first
        belady_in = track_unplanned and oversized and has_next_use
        L = hi - lo
        if belady_in:
            hst = np.zeros(2, np.int64)
            hst[1] = lo
            vict = np.empty(L, np.int64)
            sc = InLaunch(np.empty(L, np.int64), np.empty(L, np.int64), hst, np.empty(L, np.int64), vict, INF - 1)
        else:
            vict, sc = vict1, sc1   # read only by Belady within the launch: the others allocate none (5 arrays a launch)
        used_group = -1
        used_pos = 0
        used_own = 0
        nb = 0            # faults in the open batch
        bstart = 0        # its first fault's place in `missed`
        last_block = -1   # the block last serviced in it
        for k in range(lo, hi):
            u = units[k]
            if resident[u] == 1:
                sg = src_group[u]
                if sg == i:
                    if src_pos[u] > used_own:
                        used_own = src_pos[u]
                elif sg > used_group:
                    used_group = sg
                    used_pos = src_pos[u]
                elif sg == used_group and src_pos[u] > used_pos:
                    used_pos = src_pos[u]
                D.on_touch(unit_chunk[u], prev, nxt, sentinel, order)
                continue
            # a fault: its pages are the next entries of the open batch, or of a new one when they
            # do not fit (the batch is serviced first: its prefetches may bring this unit in); a
            # batch's blocks are serviced once each (a launch's units ascend, so do their blocks)
            e = need_pages[k]
            if nb > 0 and nb + e > batch:
                if tree:
                    _batch_prefetch(missed, bstart, nmiss, sp, m, rules, counters, row)
                nb = 0
                if resident[u] == 1:
                    D.on_touch(unit_chunk[u], prev, nxt, sentinel, order)
                    continue
            if nb == 0:
                counters[row, C_BATCHES] += (e + batch - 1) // batch
                last_block = -1
                bstart = nmiss
            counters[row, C_FAULTS] += e
            if block_lo[u] != last_block:
                counters[row, C_BLOCKS] += 1
                last_block = block_lo[u]
            missed[nmiss] = u
            nmiss += 1
            nb += e
            while st_i[0] + D.room_for(u, unit_chunk, chunk_count, weight) > cap:
                if track_unplanned:
                    # planned policies: a fault first displaces what the plan does not
                    # count on, then what this launch already used (it streams
                    # through a launch larger than memory), then the oldest chunk;
                    # a launch larger than memory takes its own used units first
                    # (what it faulted in ahead of its sweep is not dead yet)
                    ev = 0
                    if not oversized:
                        ev = _evict_unplanned(sp, m, cap)
                    if ev == 0:
                        # as the driver frees a whole chunk: room for up to a
                        # chunk's worth, so the tree prefetcher works as under demand
                        want = min(chunk_hi[unit_chunk[u]] - chunk_lo[unit_chunk[u]], cap)
                        if belady_in:
                            nv = _inlaunch_victims(units, next_use, lo, hi, k, want, sc, resident, block_lo, block_lo[u])
                            for a in range(nv):
                                D.depopulate(vict[a], st_i, resident, planned, unit_chunk, chunk_count, weight,
                                             prev, nxt)
                                ev += 1
                            used_ptr = k
                            # too few used units for a chunk's worth (the sweep has just begun): the
                            # units it needs last make up the rest, or each fault would evict the
                            # unit faulted just before, leaving the tree prefetcher no room
                            for kk in range(hi - 1, k, -1):
                                if ev >= want:
                                    break
                                v = units[kk]
                                if resident[v] == 1:
                                    D.depopulate(v, st_i, resident, planned, unit_chunk, chunk_count, weight,
                                                 prev, nxt)
                                    ev += 1
                        while used_ptr < k and ev < want:
                            v = units[used_ptr]
                            used_ptr += 1
                            if resident[v] == 1:
                                D.depopulate(v, st_i, resident, planned, unit_chunk, chunk_count, weight,
                                             prev, nxt)
                                ev += 1
                    if ev == 0 and oversized:
                        ev = _evict_unplanned(sp, m, cap)
                    if ev == 0:
                        # nothing used yet: give up the units this launch needs last
                        # (a chunk's worth, room for the tree prefetcher)
                        want = min(chunk_hi[unit_chunk[u]] - chunk_lo[unit_chunk[u]], cap)
                        for kk in range(hi - 1, k, -1):
                            v = units[kk]
                            if resident[v] == 1:
                                D.depopulate(v, st_i, resident, planned, unit_chunk, chunk_count, weight,
                                             prev, nxt)
                                ev += 1
                                if ev >= want:
                                    break
                    if ev > 0:
                        counters[row, C_FAULT_DTOH] += ev
                        continue
                # synchronous eviction on the fault path (block_alloc_gpu_chunk -> evict, retry)
                ev = _evict_one_chunk(sp, m)
                if ev == 0:
                    break
                counters[row, C_FAULT_DTOH] += ev
            D.populate(u, st_i, resident, unit_chunk, chunk_count, weight, prev, nxt, sentinel, order)
            src_group[u] = -1
            D.on_fault(unit_chunk[u], prev, nxt, sentinel, order)
            counters[row, C_FAULT_IN] += 1
            if track_unplanned:
                unplanned_q[st_i[2] % len(unplanned_q)] = u
                st_i[2] += 1
            if nb >= batch:
                if tree:
                    _batch_prefetch(missed, bstart, nmiss, sp, m, rules, counters, row)
                nb = 0
        if nb > 0 and tree:
            _batch_prefetch(missed, bstart, nmiss, sp, m, rules, counters, row)
        counters[row, C_USED_GROUP] = used_group + 1
        counters[row, C_USED_POS] = used_pos
        counters[row, C_USED_OWN] = used_own
        if track_unplanned and oversized:
            # a launch larger than memory streamed through it; the plan (the
            # planner follows it) counts on the units it ends holding: planned now
            for k in range(lo, hi):
                if resident[units[k]] == 1:
                    planned[units[k]] = 1
        if rules.stop_on_miss and nmiss > 0:
            return i + 1, nmiss
    return s1, 0
