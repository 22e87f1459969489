"""The simulator's memory model, compiled with numba (cache=True).

Everything here works on dense *unit* ids (0..U-1): a unit is one migration
granule (default 64 KiB) that some launch touches, some plan moves or some
allocation covers. Units of one eviction chunk (2 MiB) have consecutive ids
[chunk_lo[c], chunk_hi[c]); units of one 2 MiB VA block likewise
[block_lo[u], block_hi[u]). `key[u]` is the unit's number in its task's
address space (address // granularity), used by the tree prefetcher.

State arrays are plain numpy arrays owned by `run.Memory`; the functions
here mutate them in place and return per-launch counters. Belady within a
launch larger than memory is the planner's (plan/belady.py), so that plan and
run agree; numba caches per file, so after editing it, clear this file's
cache too (remove replay/sim/__pycache__).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..plan.belady import INF, _inlaunch_victims

# Indices of the per-step counter vector returned by the access/apply kernels.
C_FAULTS, C_FAULT_IN, C_TREE_IN, C_FAULT_DTOH, C_PREFETCH_IN, C_PREFETCH_NEED, C_TRANSFERS, C_GROUP_DTOH = range(8)
N_COUNTERS = 8


# ---- chunk list (FIFO / LRU order of eviction chunks) ------------------------
# A doubly linked list over chunks with sentinel index C (prev/next sized C+1).

@njit(cache=True)
def _list_remove(prev, nxt, c):
    p = prev[c]
    n = nxt[c]
    nxt[p] = n
    prev[n] = p
    prev[c] = -1
    nxt[c] = -1



@njit(cache=True)
def _list_append(prev, nxt, c, sentinel):
    t = prev[sentinel]
    nxt[t] = c
    prev[c] = t
    nxt[c] = sentinel
    prev[sentinel] = c



@njit(cache=True)
def _unit_out(u, resident, unit_chunk, chunk_count, prev, nxt, planned):
    """Mark u non-resident; drop its chunk from the list when it empties."""
    resident[u] = 0
    planned[u] = 0
    c = unit_chunk[u]
    chunk_count[c] -= 1
    if chunk_count[c] == 0:
        _list_remove(prev, nxt, c)



@njit(cache=True)
def _unit_in(u, resident, unit_chunk, chunk_count, prev, nxt, sentinel):
    resident[u] = 1
    c = unit_chunk[u]
    if chunk_count[c] == 0:
        _list_append(prev, nxt, c, sentinel)
    chunk_count[c] += 1



@njit(cache=True)
def _evict_unplanned(st_i, resident, unit_chunk, chunk_count, chunk_lo, chunk_hi, prev, nxt, planned,
                     unplanned_q, uq_state, limit):
    """Evict the oldest unit brought in by a fault (the plan does not count on
    it) together with the other such units of its eviction chunk, as the
    driver evicts whole chunks: the room lets the tree prefetcher work for the
    faults that follow, as it does under demand paging. At most `limit` units.
    Returns units evicted."""
    while uq_state[0] < uq_state[1]:
        u = unplanned_q[uq_state[0] % len(unplanned_q)]
        uq_state[0] += 1
        if resident[u] == 1 and planned[u] == 0:
            c = unit_chunk[u]
            _unit_out(u, resident, unit_chunk, chunk_count, prev, nxt, planned)
            n = 1
            for v in range(chunk_lo[c], chunk_hi[c]):
                if n >= limit:
                    break
                if resident[v] == 1 and planned[v] == 0:
                    _unit_out(v, resident, unit_chunk, chunk_count, prev, nxt, planned)
                    n += 1
            st_i[0] -= n
            return n
    return 0



@njit(cache=True)
def _evict_one_chunk(st_i, resident, unit_chunk, chunk_count, chunk_lo, chunk_hi, prev, nxt, planned,
                     unplanned_q, uq_state):
    """Evict room for one unit: first a resident unit the plan does not count on
    (brought in by a fault), else the whole chunk at the head of the list.
    Returns units evicted (0 when nothing is resident)."""
    sentinel = len(chunk_count)
    # unplanned units first (planned policies only: uq_state[1] > uq_state[0])
    while uq_state[0] < uq_state[1]:
        u = unplanned_q[uq_state[0] % len(unplanned_q)]
        uq_state[0] += 1
        if resident[u] == 1 and planned[u] == 0:
            _unit_out(u, resident, unit_chunk, chunk_count, prev, nxt, planned)
            st_i[0] -= 1
            return 1
    c = nxt[sentinel]
    if c == sentinel:
        return 0
    n = 0
    for u in range(chunk_lo[c], chunk_hi[c]):
        if resident[u] == 1:
            _unit_out(u, resident, unit_chunk, chunk_count, prev, nxt, planned)
            n += 1
    st_i[0] -= n
    return n



@njit(cache=True, inline="always")
def access_launch(units, lo, hi, cap, st_i, resident, unit_chunk, chunk_count, chunk_lo, chunk_hi, prev, nxt,
                  planned, unplanned_q, uq_state, lru, tree, threshold, key, block_lo, block_hi, upb,
                  track_unplanned, missed_out, counters, row, next_use, has_next_use):
    """One launch touches `units` (ascending): hits and misses refresh LRU
    order, misses fault in their unit (evicting chunks as needed) and may
    trigger the tree prefetcher. st_i[0] is the resident-unit count. Writes missed units to
    missed_out and returns how many."""
    sentinel = len(chunk_count)
    nmiss = 0
    used_ptr = lo
    oversized = hi - lo > cap
    # Belady within a launch larger than memory (planned policies that know the
    # next use of each of its units, next_use[k]: the step, capped): its used
    # units leave furthest next use first, ties earliest first
    belady_in = track_unplanned and oversized and has_next_use
    L = hi - lo
    hk = np.empty(L if belady_in else 1, np.int64)
    hu = np.empty(L if belady_in else 1, np.int64)
    aside = np.empty(L if belady_in else 1, np.int64)
    vict = np.empty(L if belady_in else 1, np.int64)
    hst = np.zeros(2, np.int64)
    hst[1] = lo
    for k in range(lo, hi):
        u = units[k]
        if resident[u] == 1:
            if lru:
                c = unit_chunk[u]
                _list_remove(prev, nxt, c)
                _list_append(prev, nxt, c, sentinel)
            continue
        # a fault
        counters[row, C_FAULTS] += 1
        missed_out[nmiss] = u
        nmiss += 1
        while st_i[0] + 1 > cap:
            if track_unplanned:
                # planned policies: a fault first displaces what the plan does not
                # count on, then what this launch already used (it streams
                # through a launch larger than memory), then the oldest chunk;
                # a launch larger than memory takes its own used units first
                # (what it faulted in ahead of its sweep is not dead yet)
                ev = 0
                if not oversized:
                    ev = _evict_unplanned(st_i, resident, unit_chunk, chunk_count, chunk_lo, chunk_hi, prev, nxt,
                                          planned, unplanned_q, uq_state, cap)
                if ev == 0:
                    # as the driver frees a whole chunk: room for up to a
                    # chunk's worth, so the tree prefetcher works as under demand
                    want = min(chunk_hi[unit_chunk[u]] - chunk_lo[unit_chunk[u]], cap)
                    if belady_in:
                        nv = _inlaunch_victims(units, next_use, lo, hi, k, INF - 1, hk, hu, hst, aside, resident,
                                               block_lo, block_lo[u], want, vict)
                        for a in range(nv):
                            _unit_out(vict[a], resident, unit_chunk, chunk_count, prev, nxt, planned)
                            st_i[0] -= 1
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
                                _unit_out(v, resident, unit_chunk, chunk_count, prev, nxt, planned)
                                st_i[0] -= 1
                                ev += 1
                    while used_ptr < k and ev < want:
                        v = units[used_ptr]
                        used_ptr += 1
                        if resident[v] == 1:
                            _unit_out(v, resident, unit_chunk, chunk_count, prev, nxt, planned)
                            st_i[0] -= 1
                            ev += 1
                if ev == 0 and oversized:
                    ev = _evict_unplanned(st_i, resident, unit_chunk, chunk_count, chunk_lo, chunk_hi, prev, nxt,
                                          planned, unplanned_q, uq_state, cap)
                if ev == 0:
                    # nothing used yet: give up the units this launch needs last
                    # (a chunk's worth, room for the tree prefetcher)
                    want = min(chunk_hi[unit_chunk[u]] - chunk_lo[unit_chunk[u]], cap)
                    for kk in range(hi - 1, k, -1):
                        v = units[kk]
                        if resident[v] == 1:
                            _unit_out(v, resident, unit_chunk, chunk_count, prev, nxt, planned)
                            st_i[0] -= 1
                            ev += 1
                            if ev >= want:
                                break
                if ev > 0:
                    counters[row, C_FAULT_DTOH] += ev
                    continue
            ev = _evict_one_chunk(st_i, resident, unit_chunk, chunk_count, chunk_lo, chunk_hi, prev, nxt,
                                  planned, unplanned_q, uq_state)
            if ev == 0:
                break
            counters[row, C_FAULT_DTOH] += ev
        _unit_in(u, resident, unit_chunk, chunk_count, prev, nxt, sentinel)
        if lru:
            # a fault is an access: its chunk becomes the most recently used
            # (_unit_in appends only a chunk that was not resident)
            c = unit_chunk[u]
            _list_remove(prev, nxt, c)
            _list_append(prev, nxt, c, sentinel)
        st_i[0] += 1
        counters[row, C_FAULT_IN] += 1
        if track_unplanned:
            unplanned_q[uq_state[1] % len(unplanned_q)] = u
            uq_state[1] += 1
        if tree:
            _tree_prefetch(u, cap, st_i, resident, unit_chunk, chunk_count, chunk_lo, chunk_hi, prev, nxt,
                           planned, unplanned_q, uq_state, key, block_lo, block_hi, upb, threshold,
                           track_unplanned, counters, row)
    if track_unplanned and oversized:
        # a launch larger than memory streamed through it; the plan (the
        # planner follows it) counts on the units it ends holding: planned now
        for k in range(lo, hi):
            if resident[units[k]] == 1:
                planned[units[k]] = 1
    return nmiss



@njit(cache=True)
def _tree_prefetch(u, cap, st_i, resident, unit_chunk, chunk_count, chunk_lo, chunk_hi, prev, nxt,
                   planned, unplanned_q, uq_state, key, block_lo, block_hi, upb, threshold,
                   track_unplanned, counters, row):
    """nvidia-uvm's tree prefetcher, inside u's 2 MiB block: the largest
    aligned region around u more than `threshold` resident is filled."""
    sentinel = len(chunk_count)
    lo = block_lo[u]
    hi = block_hi[u]
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
            if st_i[0] + 1 > cap:
                return  # the prefetcher never evicts
            _unit_in(v, resident, unit_chunk, chunk_count, prev, nxt, sentinel)
            st_i[0] += 1
            counters[row, C_TREE_IN] += 1
            if track_unplanned:
                unplanned_q[uq_state[1] % len(unplanned_q)] = v
                uq_state[1] += 1



@njit(cache=True, inline="always")
def apply_group(evict, elo, ehi, prefetch, plo, phi, cap, st_i, resident, unit_chunk, chunk_count, chunk_lo, chunk_hi, prev, nxt,
                planned, unplanned_q, uq_state, need_now, counters, row):
    """Carry out one planned group: evictions, then prefetches (in need order).
    Prefetches that find memory full evict unplanned units, then list heads.
    Counts transfers as runs of consecutive unit ids. Returns the units moved
    in for the first `need_now` prefetch entries (what the next launch waits for)."""
    sentinel = len(chunk_count)
    last = -2
    for k in range(elo, ehi):
        u = evict[k]
        if resident[u] == 1:
            _unit_out(u, resident, unit_chunk, chunk_count, prev, nxt, planned)
            st_i[0] -= 1
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
        while st_i[0] + 1 > cap:
            ev = _evict_one_chunk(st_i, resident, unit_chunk, chunk_count, chunk_lo, chunk_hi, prev, nxt,
                                  planned, unplanned_q, uq_state)
            if ev == 0:
                break
            counters[row, C_GROUP_DTOH] += ev
        if st_i[0] + 1 > cap:
            break
        _unit_in(u, resident, unit_chunk, chunk_count, prev, nxt, sentinel)
        planned[u] = 1
        st_i[0] += 1
        counters[row, C_PREFETCH_IN] += 1
        if k - plo < need_now:
            needed_in += 1
        if u != last + 1:
            counters[row, C_TRANSFERS] += 1
        last = u
    counters[row, C_PREFETCH_NEED] += needed_in
    return needed_in


# ---- whole runs -----------------------------------------------------------------

@njit(cache=True)
def run_engine(s0, s1, need_ptr, need_unit, has_plan, ev_ptr, ev_unit, pf_ptr, pf_unit, need_now,
               cap, st_i, resident, unit_chunk, chunk_count, chunk_lo, chunk_hi, prev, nxt, planned,
               unplanned_q, uq_state, lru, tree, threshold, key, block_lo, block_hi, upb, track_unplanned,
               stop_on_miss, missed_buf, counters, next_use, has_next_use):
    """Steps s0..s1-1: each step's planned group (if any), then its launch.
    Returns (next step, misses of the last step) -- stopping after a step
    with misses when stop_on_miss (for online feedback)."""
    for i in range(s0, s1):
        if has_plan:
            apply_group(ev_unit, ev_ptr[i], ev_ptr[i + 1], pf_unit, pf_ptr[i], pf_ptr[i + 1], cap, st_i, resident,
                        unit_chunk, chunk_count, chunk_lo, chunk_hi, prev, nxt, planned, unplanned_q, uq_state,
                        need_now[i], counters, i)
        nm = access_launch(need_unit, need_ptr[i], need_ptr[i + 1], cap, st_i, resident, unit_chunk, chunk_count,
                           chunk_lo, chunk_hi, prev, nxt, planned, unplanned_q, uq_state, lru, tree, threshold,
                           key, block_lo, block_hi, upb, track_unplanned, missed_buf, counters, i, next_use,
                           has_next_use)
        if stop_on_miss and nm > 0:
            return i + 1, nm
    return s1, 0
