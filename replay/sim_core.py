"""The simulator's hot loops, compiled with numba (cache=True).

Everything here works on dense *unit* ids (0..U-1): a unit is one migration
granule (default 64 KiB) that some launch touches, some plan moves or some
allocation covers. Units of one eviction chunk (2 MiB) have consecutive ids
[chunk_lo[c], chunk_hi[c]); units of one 2 MiB VA block likewise
[block_lo[u], block_hi[u]). `key[u]` is the unit's number in its task's
address space (address // granularity), used by the tree prefetcher.

State arrays are plain numpy arrays owned by `simulator.Memory`; the functions
here mutate them in place and return per-launch counters.
"""

from __future__ import annotations

import numpy as np
from numba import njit

INF = np.iinfo(np.int64).max

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


@njit(cache=True)
def _inlaunch_victims(units, nextuse, lo, hi, k, n_cap, hk, hu, hst, aside, resident, block_lo, bl, want, out):
    """Belady within a launch larger than memory (units[lo:hi], its fault at
    position k): up to `want` of the units it already used (positions < k,
    resident), next use (nextuse, capped at n_cap) furthest first, ties
    earliest first -- but those in the faulting unit's 2 MiB block (bl) last,
    earliest first (the sweep's block stays dense, so the tree prefetcher
    works as under demand paging). hst = [heap size, next position to push]
    persists over the launch. Writes victims to out; returns how many."""
    L = hi - lo
    while hst[1] < k:
        p = hst[1]
        nx = nextuse[p]
        if nx > n_cap:
            nx = n_cap
        hst[0] = _heap_push(hk, hu, hst[0], nx * (L + 1) + (hi - 1 - p), p)
        hst[1] += 1
    n = 0
    na = 0
    while hst[0] > 0 and n < want:
        p = hu[0]
        hst[0] = _heap_pop(hk, hu, hst[0])
        v = units[p]
        if resident[v] == 0:
            continue
        if block_lo[v] == bl:
            aside[na] = p
            na += 1
            continue
        out[n] = v
        n += 1
    if na > 0:
        ap = np.sort(aside[:na])
        for a in range(na):
            p = ap[a]
            if n < want:
                out[n] = units[p]
                n += 1
            else:
                nx = nextuse[p]
                if nx > n_cap:
                    nx = n_cap
                hst[0] = _heap_push(hk, hu, hst[0], nx * (L + 1) + (hi - 1 - p), p)
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


# ---- LRU for every capacity at once: stack distances --------------------------

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


# ---- Belady planner ----------------------------------------------------------

@njit(cache=True)
def _heap_push(hk, hu, size, k, u):
    i = size
    hk[i] = k
    hu[i] = u
    while i > 0:
        p = (i - 1) >> 1
        if hk[p] >= hk[i]:
            break
        hk[p], hk[i] = hk[i], hk[p]
        hu[p], hu[i] = hu[i], hu[p]
        i = p
    return size + 1


@njit(cache=True)
def _heap_pop(hk, hu, size):
    size -= 1
    hk[0] = hk[size]
    hu[0] = hu[size]
    i = 0
    while True:
        l = 2 * i + 1
        if l >= size:
            break
        r = l + 1
        m = l
        if r < size and hk[r] > hk[l]:
            m = r
        if hk[m] <= hk[i]:
            break
        hk[m], hk[i] = hk[i], hk[m]
        hu[m], hu[i] = hu[i], hu[m]
        i = m
    return size


@njit(cache=True)
def next_occurrence(step_of, unit_of, n_units):
    """For occurrence k (unit u at step s), the step of u's next occurrence, INF if none."""
    n = len(unit_of)
    out = np.full(n, INF, np.int64)
    nxt = np.full(n_units, INF, np.int64)
    for k in range(n - 1, -1, -1):
        u = unit_of[k]
        out[k] = nxt[u]
        nxt[u] = step_of[k]
    return out


@njit(cache=True)
def _belady_plan(need_ptr, need_unit, n_units, cap, start_step, init_resident, lookahead_steps,
                lookahead_units, belady_in, unit_want, unit_block, front):
    """Plan evictions and prefetches for steps start_step.. on predicted needs.

    need_ptr/need_unit: CSR of each step's predicted units (ascending).
    For step i: fetch its missing units, evicting the resident unit whose next
    predicted use is furthest (Belady). Each such exchange is issued as early
    as it can be: in the group of the step after the one following the
    victim's last use (the victim is dead from then on), and not before the
    fetched unit's own last eviction -- so transfers overlap earlier kernels
    while every fetch and eviction stays Belady's. Then, looking ahead in
    need order (at most lookahead_steps steps and lookahead_units units), it
    prefetches later steps' units into free space or in place of units never
    needed again. (A lookahead that evicted units needed later could cost
    fetches Belady would not make: their next uses are judged before steps
    i..j-1 run.) Units that cannot fit (a step larger than the capacity) are
    left to fault, one unit kept free for them; with `front`, such a step's
    first units (in need order, as many as fit) come in before it in place of
    the units it needs last, which its first faults would evict before it got
    to them (bulk transfers instead of faults; not Belady's, so the planner
    tries plans with and without it, see simulator.choose_span).

    Returns CSR arrays over groups start_step..: ev_ptr, ev_unit, pf_ptr,
    pf_unit (each group's prefetches: those its own step needs first, then
    the early ones, each by address), need_now (how many of a group's
    prefetches its own step needs), wait_prev (the group evicts units of the
    step before it, so it starts after that step ends), thrash (step could
    not be made resident).
    """
    n_steps = len(need_ptr) - 1
    n_occ = len(need_unit)
    step_of = np.empty(n_occ, np.int64)
    for s in range(n_steps):
        for k in range(need_ptr[s], need_ptr[s + 1]):
            step_of[k] = s
    nocc = next_occurrence(step_of, need_unit, n_units)
    # key[u]: next predicted use at or after the current step
    key = np.full(n_units, INF, np.int64)
    for k in range(n_occ - 1, need_ptr[start_step] - 1, -1):
        key[need_unit[k]] = step_of[k]
    resident = init_resident.copy()
    last_use = np.full(n_units, -1, np.int64)
    ev_at = np.full(n_units, -1, np.int64)   # group of the unit's last eviction
    in_at = np.full(n_units, -1, np.int64)   # group of the unit's last fetch
    cap_heap = n_occ + 2 * n_units + 16
    hk = np.empty(cap_heap, np.int64)
    hu = np.empty(cap_heap, np.int64)
    hsize = 0
    n_res = 0
    for u in range(n_units):
        if resident[u]:
            n_res += 1
            hsize = _heap_push(hk, hu, hsize, key[u], u)
    G = n_steps - start_step
    m0 = max(n_occ, 16)
    ev_g = np.empty(m0, np.int64)
    ev_u = np.empty(m0, np.int64)
    pf_g = np.empty(m0, np.int64)
    pf_n = np.empty(m0, np.int64)
    pf_u = np.empty(m0, np.int64)
    n_ev = 0
    n_pf = 0
    wait_prev = np.zeros(G, np.uint8)
    thrash = np.zeros(G, np.uint8)
    aside_u = np.empty(n_units + 1, np.int64)
    ahead = need_ptr[start_step]
    for i in range(start_step, n_steps):
        g = i - start_step
        n_aside = 0
        # a step larger than memory streams through it: keep one unit free for
        # its faults, as the simulator runs it (so plan and memory agree after)
        cap_i = cap - 1 if (need_ptr[i + 1] - need_ptr[i] > cap and cap > 1) else cap
        big_i = front and need_ptr[i + 1] - need_ptr[i] > cap
        front_end = need_ptr[i] + cap_i     # its first cap_i units, in need order
        tail_k = need_ptr[i + 1] - 1        # where the search for its last resident units goes on
        in_flight = 0
        # step i's own units first (some may have been prefetched, then evicted
        # again by a more urgent need), then the lookahead from where it stopped
        k = need_ptr[i]
        end_m = need_ptr[i + 1]
        while k < n_occ:
            if k == end_m:
                if ahead > k:
                    k = ahead
                end_m = -1
                if k >= n_occ:
                    break
            j = step_of[k]
            mandatory = j <= i
            if not mandatory:
                if j - i > lookahead_steps or in_flight >= lookahead_units:
                    break
            u = need_unit[k]
            if resident[u]:
                k += 1
                continue
            ok = True
            at = i
            if n_res >= cap_i:
                found = False
                while hsize > 0:
                    kk = hk[0]
                    v = hu[0]
                    if resident[v] == 0 or key[v] != kk:
                        hsize = _heap_pop(hk, hu, hsize)  # stale
                        continue
                    # the lookahead takes only free space or units never needed
                    # again: it then never costs a fetch that Belady would not make
                    if kk <= i or (not mandatory and kk != INF):
                        break
                    if last_use[v] == i - 1 and i > start_step:
                        if not mandatory:
                            hsize = _heap_pop(hk, hu, hsize)
                            aside_u[n_aside] = v
                            n_aside += 1
                            continue
                    hsize = _heap_pop(hk, hu, hsize)
                    found = True
                    break
                if not found and mandatory and big_i and k < front_end:
                    # a step larger than memory: its front comes in in place of the units it
                    # needs last, which its first faults would evict before it got to them
                    while tail_k > k:
                        v = need_unit[tail_k]
                        tail_k -= 1
                        if resident[v] and key[v] == i:
                            found = True
                            break
                if found:
                    if mandatory:
                        # issue the exchange once the victim is dead
                        at = last_use[v] + 2
                        if at < in_at[v] + 1:
                            at = in_at[v] + 1
                        if at < ev_at[u] + 1:
                            at = ev_at[u] + 1
                        if at < start_step:
                            at = start_step
                        if at > i:
                            at = i
                        if at == i and last_use[v] == i - 1 and i > start_step:
                            wait_prev[g] = 1
                    resident[v] = 0
                    n_res -= 1
                    if n_ev >= len(ev_u):
                        ev_u = _grow(ev_u)
                        ev_g = _grow(ev_g)
                    ev_g[n_ev] = at - start_step
                    ev_u[n_ev] = v
                    ev_at[v] = at
                    n_ev += 1
                else:
                    ok = False
            if not ok:
                if mandatory:
                    thrash[g] = 1
                    k += 1
                    continue  # leave it to fault
                break
            resident[u] = 1
            n_res += 1
            key[u] = j
            in_at[u] = at
            hsize = _heap_push(hk, hu, hsize, j, u)
            if n_pf >= len(pf_u):
                pf_u = _grow(pf_u)
                pf_g = _grow(pf_g)
                pf_n = _grow(pf_n)
            pf_g[n_pf] = at - start_step
            pf_n[n_pf] = j - start_step
            pf_u[n_pf] = u
            n_pf += 1
            if not mandatory:
                in_flight += 1
            k += 1
        if k > ahead:
            ahead = k
        if ahead < need_ptr[i + 1]:
            ahead = need_ptr[i + 1]
        for a in range(n_aside):
            v = aside_u[a]
            if resident[v]:
                hsize = _heap_push(hk, hu, hsize, key[v], v)
        if need_ptr[i + 1] - need_ptr[i] > cap_i:
            # a step larger than memory streams through it: units it used are
            # evicted to fault in the rest; follow what it ends holding (as the
            # simulator runs it), or the plan would count on units that are gone
            # and move ones already there. Without belady_in: its *last* cap_i units
            s0 = need_ptr[i]
            L = need_ptr[i + 1] - s0
            if belady_in:
                # the simulator runs it as Belady within the launch: a fault
                # that finds memory full evicts up to unit_want[u] of the units
                # the step already used, furthest next use first (ties:
                # earliest first): follow it unit by unit
                hk2 = np.empty(L, np.int64)
                hu2 = np.empty(L, np.int64)
                aside2 = np.empty(L, np.int64)
                vict2 = np.empty(L, np.int64)
                hst2 = np.zeros(2, np.int64)
                hst2[1] = s0
                for kk2 in range(s0, s0 + L):
                    u = need_unit[kk2]
                    if resident[u]:
                        continue
                    if n_res >= cap:
                        nv = _inlaunch_victims(need_unit, nocc, s0, s0 + L, kk2, n_steps, hk2, hu2, hst2, aside2,
                                               resident, unit_block, unit_block[u], unit_want[u], vict2)
                        for a in range(nv):
                            v = vict2[a]
                            resident[v] = 0
                            n_res -= 1
                            ev_at[v] = i
                        # as the run does: the units it needs last make up a chunk's worth
                        for kk3 in range(s0 + L - 1, kk2, -1):
                            if nv >= unit_want[u]:
                                break
                            v = need_unit[kk3]
                            if resident[v]:
                                resident[v] = 0
                                n_res -= 1
                                ev_at[v] = i
                                nv += 1
                        if nv == 0:
                            continue
                    resident[u] = 1
                    n_res += 1
                    in_at[u] = i
            else:
                tail = need_ptr[i + 1] - cap_i
                for kk2 in range(s0, s0 + L):
                    u = need_unit[kk2]
                    if kk2 < tail:
                        if resident[u]:
                            resident[u] = 0
                            n_res -= 1
                            ev_at[u] = i
                    elif resident[u] == 0:
                        if n_res < cap_i:
                            resident[u] = 1
                            n_res += 1
                            in_at[u] = i
        # execute step i: its units' keys move to their next predicted use. A
        # unit the next step needs again is not pushed now: it cannot be a
        # victim while step i+1 is planned (keys <= i+1 never are), and step
        # i+1 pushes it with its next use (a unit that every launch touches,
        # as whole allocations are, costs no heap work until its last use)
        for kk2 in range(need_ptr[i], need_ptr[i + 1]):
            u = need_unit[kk2]
            last_use[u] = i
            key[u] = nocc[kk2]
            if resident[u] and nocc[kk2] != i + 1:
                hsize = _heap_push(hk, hu, hsize, key[u], u)
        # drop stale entries once they outnumber the units 3 to 1: a small heap
        # stays in cache (a unit is pushed at every use, each push goes stale)
        if hsize > cap_heap - n_units - 8 or hsize > 4 * n_units + 1024:
            hsize = _heap_rebuild(hk, hu, resident, key, n_units)
    return ev_g[:n_ev], ev_u[:n_ev], pf_g[:n_pf], pf_n[:n_pf], pf_u[:n_pf], wait_prev, thrash


@njit(cache=True)
def _group_ptr(sorted_g, G):
    """CSR row pointers of G groups from ascending group numbers (one pass, no G-sized bincount)."""
    ptr = np.empty(G + 1, np.int64)
    k = 0
    n = len(sorted_g)
    for g in range(G + 1):
        while k < n and sorted_g[k] < g:
            k += 1
        ptr[g] = k
    return ptr


@njit(cache=True)
def _own_counts(sorted_g, own, G):
    out = np.zeros(G, np.int64)
    for k in range(len(sorted_g)):
        if own[k]:
            out[sorted_g[k]] += 1
    return out


def belady_plan(need_ptr, need_unit, n_units, cap, start_step, init_resident, lookahead_steps,
                lookahead_units, belady_in=False, unit_want=None, unit_block=None, front=False):
    """`_belady_plan` (see there) as CSR arrays over groups start_step..:
    ev_ptr, ev_unit, pf_ptr, pf_unit, need_now, wait_prev, thrash, need_group
    (per step, the latest earlier group that prefetches a unit it needs; -1: none).

    Inside a group: evictions by address; the prefetches its own step needs
    first, then the early ones, each by address (so neighbours merge into one
    transfer); need_now counts the first kind."""
    ev_g, ev_u, pf_g, pf_n, pf_u, wait_prev, thrash = _belady_plan(
        need_ptr, need_unit, n_units, cap, start_step, init_resident, lookahead_steps, lookahead_units,
        bool(belady_in and unit_want is not None),
        np.zeros(1, np.int64) if unit_want is None else np.asarray(unit_want, np.int64),
        np.zeros(1, np.int64) if unit_block is None else np.asarray(unit_block, np.int64), bool(front))
    G = len(need_ptr) - 1 - start_step
    oe = np.lexsort((ev_u, ev_g))
    own = pf_n == pf_g
    op = np.lexsort((pf_u, ~own, pf_g))
    ev_ptr = _group_ptr(ev_g[oe], G)
    pf_ptr = _group_ptr(pf_g[op], G)
    need_now = _own_counts(pf_g[op], own[op], G)
    # the latest earlier group holding a unit a step needs (its launch waits for that group)
    need_group = np.full(G, -1, np.int64)
    early = ~own
    np.maximum.at(need_group, pf_n[early], pf_g[early])
    return ev_ptr, ev_u[oe], pf_ptr, pf_u[op], need_now, wait_prev, thrash, need_group


@njit(cache=True)
def _grow(a):
    b = np.empty(2 * len(a), a.dtype)
    b[:len(a)] = a
    return b


@njit(cache=True)
def _heap_rebuild(hk, hu, resident, key, n_units):
    size = 0
    for u in range(n_units):
        if resident[u]:
            size = _heap_push(hk, hu, size, key[u], u)
    return size


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


@njit(cache=True)
def fault_seconds(faults, charges, fault_time_s, faults_per_batch, batch_overhead_s):
    if not charges or faults <= 0:
        return 0.0
    batches = (faults + faults_per_batch - 1) // faults_per_batch
    return faults * fault_time_s + batches * batch_overhead_s


@njit(cache=True)
def bulk_seconds(h, d, transfers, charges, htod_bw, dtoh_bw, duplex, pipelined_bw, latency):
    if not charges:
        return 0.0
    th = h / htod_bw
    td = d / dtoh_bw
    if duplex:
        t = max(th, td, (h + d) / pipelined_bw)
    else:
        t = th + td
    return t + transfers * latency


@njit(cache=True)
def timing(counters, compute, gran, blocking, wait_prev, need_group, charges, fault_time_s, faults_per_batch,
           batch_overhead_s, htod_bw, dtoh_bw, duplex, pipelined_bw, latency):
    """Simulated time per step. A planned group is issued while the previous
    launch runs (after it, when `wait_prev` or `blocking`) and runs on the copy
    engines in issue order; a launch starts when the previous one ended, the
    part of its own group it needs has arrived (the whole group when
    `blocking`) and the earlier group `need_group` holding units it needs has
    finished; its faults (and the evictions and driver prefetches they cause)
    stall it. Returns start, end, stall per step."""
    n = counters.shape[0]
    start = np.empty(n)
    end = np.empty(n)
    stall = np.empty(n)
    g_end = np.zeros(n)
    prev_start = 0.0
    prev_end = 0.0
    ce = 0.0
    for i in range(n):
        c = counters[i]
        pf_in = c[C_PREFETCH_IN]
        g_out = c[C_GROUP_DTOH]
        ready = prev_end
        g_end[i] = ce
        if pf_in > 0 or g_out > 0:
            tg = bulk_seconds(pf_in * gran, g_out * gran, c[C_TRANSFERS], charges, htod_bw, dtoh_bw, duplex,
                              pipelined_bw, latency)
            after = prev_end if (blocking[i] or wait_prev[i]) else prev_start
            gs = max(ce, after)
            ce = gs + tg
            g_end[i] = ce
            if blocking[i]:
                ready = max(ready, ce)
            elif c[C_PREFETCH_NEED] > 0:
                ready = max(ready, gs + tg * (c[C_PREFETCH_NEED] / pf_in))
        e = need_group[i]
        if e >= 0 and e < i:
            ready = max(ready, g_end[e])
        f = fault_seconds(c[C_FAULTS], charges, fault_time_s, faults_per_batch, batch_overhead_s)
        f += bulk_seconds(c[C_TREE_IN] * gran, c[C_FAULT_DTOH] * gran, 0, charges, htod_bw, dtoh_bw, False,
                          pipelined_bw, 0.0)
        start[i] = ready
        end[i] = ready + compute[i] + f
        stall[i] = ready - prev_end + f
        prev_start = start[i]
        prev_end = end[i]
    return start, end, stall
