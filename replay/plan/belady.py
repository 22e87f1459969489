"""Belady on needs: the planner's numba core, and `plan_groups` around it.

`_belady_plan` walks the steps (scheduled launches) in order and, for each,
fetches the units it needs that are not resident, evicting the resident unit
whose next use is furthest (Belady's OPT), then prefetches later steps' units
into free space (lookahead). Its output is a `Groups` plan (plan/groups.py):
per step, what to evict and then what to prefetch before it.

`_inlaunch_victims` (Belady within a launch larger than memory) is used by the
planner and by the simulator's fault path (sim/kernels.py) alike, so that a
plan and its run agree on what such a launch leaves resident. numba caches
each file's functions on their own: after editing a function here, the
simulator's cached kernels that call it are stale until sim/kernels.py changes
too (or its __pycache__ is removed).

Long because the planner's core, its heap and the in-launch victims are one
numba compilation unit that the simulator's kernels share (split across files,
numba's per-file cache would leave callers stale, as said above), and index
values (uses known only after a writer's step, set aside and tried again)
are a rule of that same walk.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit

from ..unit_space import I64, ID, Needs, grow
from .groups import Groups

INF = np.iinfo(np.int64).max

# `_inlaunch_victims`' state over one launch: its heap (keys, positions), [heap size, next position to
# push], positions set aside (the faulting block's), the victims it writes, and the cap on next uses.
InLaunch = namedtuple("InLaunch", "hk hu hst aside out cap_next")
# `_belady_plan`'s knobs: how far the lookahead goes (steps, units), whether a launch larger than memory
# runs as Belady within it (the simulator's rule), whether such a launch's front comes in first, and
# how many uses at most (whole steps) each piece of the next occurrences is made for (`next_use_window`).
PlanKnobs = namedtuple("PlanKnobs", "lookahead_steps lookahead_units belady_in front window")
# Each unit's memory chunk and each chunk's weight in units (capacity is counted in chunks: sim/uvm_driver.py).
# Also each unit's 2 MiB block (its first unit's id), for Belady within a launch.
PlanChunks = namedtuple("PlanChunks", "unit_chunk weight unit_block")
# Per use: the step after which its values exist (-1: none; empty: no use waits); an empty array of
# the width `_belady_plan`'s per-use arrays of steps and positions take (int32 where every step and
# use fits), with that width's "no next use".
PlanUses = namedtuple("PlanUses", "after width none")

# The heap's sifts move the entries they pass over one place and write the moving entry once, where
# it stops: the comparisons and every entry's place are those of swapping at each level (the order
# of equal keys, which decides among units of the same key, included), with half the writes.
@njit(cache=True)
def _heap_push(hk, hu, size, k, u):
    i = size
    while i > 0:
        p = (i - 1) >> 1
        if hk[p] >= k:
            break
        hk[i] = hk[p]
        hu[i] = hu[p]
        i = p
    hk[i] = k
    hu[i] = u
    return size + 1


@njit(cache=True)
def _heap_pop(hk, hu, size):
    size -= 1
    k = hk[size]
    u = hu[size]
    i = 0
    while True:
        l = 2 * i + 1
        if l >= size:
            break
        r = l + 1
        m = l
        if r < size and hk[r] > hk[l]:
            m = r
        if hk[m] <= k:
            break
        hk[i] = hk[m]
        hu[i] = hu[m]
        i = m
    hk[i] = k
    hu[i] = u
    return size


@njit(cache=True)
def next_occurrence(ptr, unit_of, n_units, none, width):
    """For occurrence k (unit u at step s: CSR `ptr` over steps), the step of u's next occurrence,
    `none` if none; in the width of `width` (an array). Walks the steps, so no per-use array of
    steps is made."""
    n = len(unit_of)
    out = np.full(n, none, width.dtype)
    nxt = np.full(n_units, none, width.dtype)
    for s in range(len(ptr) - 2, -1, -1):
        for k in range(ptr[s + 1] - 1, ptr[s] - 1, -1):
            u = unit_of[k]
            out[k] = nxt[u]
            nxt[u] = s
    return out


def next_use_window(n_uses: int, n_units: int) -> int:
    """The uses each piece of `_belady_plan`'s next occurrences is made for: about sqrt(uses x units),
    which makes the piece and the pieces' starting points (a step per unit at each piece's end) about
    the same size, both far below a step per use (10^5 launches at the block span: 9.5 M uses, 38 MB
    as one array, ~1 MB each in pieces). At least 2^16."""
    return max(1 << 16, int(np.sqrt(float(max(n_uses, 1)) * float(max(n_units, 1)))))


@njit(cache=True)
def _window_starts(ptr, start_step, window):
    """Steps start_step.. cut into pieces of whole steps, each of at most `window` uses (a step of more
    is a piece of its own): the pieces' first steps, then the end (len(ptr) - 1)."""
    n = len(ptr) - 1
    out = np.empty(n - start_step + 2, np.int64)
    m = 0
    s = start_step
    while s < n:
        out[m] = s
        m += 1
        t = s + 1
        while t < n and ptr[t + 1] - ptr[s] <= window:
            t += 1
        s = t
    out[m] = n
    return out[:m + 1]


@njit(cache=True)
def _window_ends(ptr, unit_of, n_units, none, width, wstart):
    """Per piece (wstart), the next occurrence of each unit at or after the piece's end step (`none`:
    none): where `_window_fill` starts from. One backward pass over the steps."""
    nw = len(wstart) - 1
    ends = np.empty((max(nw, 1), n_units), width.dtype)
    nxt = np.full(n_units, none, width.dtype)
    n = len(ptr) - 1
    s = n - 1
    for w in range(nw - 1, -1, -1):
        ends[w, :] = nxt
        while s >= wstart[w]:
            for k in range(ptr[s + 1] - 1, ptr[s] - 1, -1):
                nxt[unit_of[k]] = s
            s -= 1
    return ends


@njit(cache=True)
def _window_fill(ptr, unit_of, s0, s1, after_end, out):
    """out[k - ptr[s0]] = the step of the next occurrence of use k's unit (steps s0..s1-1), as
    `next_occurrence` gives it, from each unit's first step at or after s1 (`after_end`)."""
    nxt = after_end.copy()
    base = ptr[s0]
    for s in range(s1 - 1, s0 - 1, -1):
        for k in range(ptr[s + 1] - 1, ptr[s] - 1, -1):
            u = unit_of[k]
            out[k - base] = nxt[u]
            nxt[u] = s


@njit(cache=True)
def _inlaunch_victims(units, nextuse, lo, hi, k, want, sc, resident, block_lo, bl):
    """Belady within a launch larger than memory (units[lo:hi], its fault at
    position k): up to `want` of the units it already used (positions < k,
    resident), next use (nextuse, capped at sc.cap_next) furthest first, ties
    earliest first -- but those in the faulting unit's 2 MiB block (bl) last,
    earliest first (the sweep's block stays dense, so the tree prefetcher
    works as under demand paging). sc (InLaunch) persists over the launch.
    Writes victims to sc.out; returns how many."""
    hk, hu, hst, aside, out, n_cap = sc.hk, sc.hu, sc.hst, sc.aside, sc.out, sc.cap_next
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
def _occ_in(u, unit_chunk, ccount, weight, occ):
    """u planned resident: its chunk takes its weight of the capacity if it held nothing (the GPU's
    memory is handed out in chunks; the weights capped at the capacity, each unit beyond the cap one
    more: replay/sim/uvm_driver.py, as the simulator counts). Returns the capacity taken."""
    occ += _room(u, unit_chunk, ccount, weight)
    ccount[unit_chunk[u]] += 1
    return occ


@njit(cache=True, inline="always")
def _occ_out(u, unit_chunk, ccount, weight, occ):
    c = unit_chunk[u]
    if ccount[c] > weight[c]:
        occ -= 1
    ccount[c] -= 1
    return occ - weight[c] if ccount[c] == 0 else occ


@njit(cache=True, inline="always")
def _room(u, unit_chunk, ccount, weight):
    c = unit_chunk[u]
    if ccount[c] == 0:
        return weight[c]
    return 1 if ccount[c] >= weight[c] else 0


@njit(cache=True, inline="always")
def _hkey(nxt, last, n_steps):
    """A resident unit's key in Belady's heap (the largest is the victim): its next use (INF: past
    every step), then, among units of the same next use, the one whose last use is earliest -- the
    choice is Belady's either way, and that victim is dead the longest, so the exchange can be issued
    earliest, and units used together leave together (their chunk is freed whole)."""
    nu = nxt if nxt < n_steps else n_steps
    return nu * (n_steps + 2) + (n_steps - last)


@njit(cache=True, inline="always")
def _with_filler(u, c, at, c_fill, c_fill_at, resident, in_at, last_use, ev_at, floor):
    """The group of a fetch that needs no victim because its chunk `c` is resident: that of the fetch
    that found the chunk empty (and made its room), where it is sure to hold the chunk then -- so
    the chunk's units come in with the evictions that made room for it, on both copy engines at
    once, instead of one group after the other. Not before u's own last eviction nor before `floor`
    (its values exist, the plan's first group); `at` (its own step's group) where no such group is
    known."""
    f = c_fill[c]
    a = c_fill_at[c]
    if f < 0 or resident[f] == 0 or in_at[f] != a:
        return at
    # f stays from group a until its eviction, which goes at last_use[f] + 2 at the earliest
    lim = last_use[f] + 1 if last_use[f] + 1 > a else a
    if a < ev_at[u] + 1:
        a = ev_at[u] + 1
    if a < floor:
        a = floor
    return a if a <= lim and a < at else at


@njit(cache=True, nogil=True)
def _belady_plan(need_ptr, need_unit, n_units, cap, start_step, init_resident, knobs, unit_want, uses, chunks):
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
    tries plans with and without it, see spans.choose_span).

    `need_after` (per occurrence; -1: none): the step after whose end that
    use's unit is known (from index values an earlier launch wrote): no group
    before step need_after + 1 may bring it in for that use. A mandatory fetch
    goes no earlier than that group; the lookahead sets such a use aside while
    it is not known yet and tries it again at each later step, before going on.

    Capacity is counted in chunks (`unit_chunk`, `chunk_weight`: a chunk takes its weight while
    any unit of it is planned resident), as the simulator's memory counts it; a fetch into an
    empty chunk evicts, furthest next use first, until a chunk's room is free.

    Returns CSR arrays over groups start_step..: ev_ptr, ev_unit, pf_ptr,
    pf_unit (each group's prefetches: those its own step needs first, then
    the early ones, each by address), need_now (how many of a group's
    prefetches its own step needs), wait_prev (the group evicts units of the
    step before it, so it starts after that step ends), thrash (step could
    not be made resident), and per prefetch the step its values wait for
    (where the needs have gates: else none is listed).
    """
    lookahead_steps, lookahead_units, belady_in, front = (knobs.lookahead_steps, knobs.lookahead_units,
                                                          knobs.belady_in, knobs.front)
    unit_chunk, chunk_weight, unit_block = chunks.unit_chunk, chunks.weight, chunks.unit_block
    need_after, width, step_none = uses.after, uses.width, uses.none
    n_steps = len(need_ptr) - 1
    n_occ = len(need_unit)
    # the next occurrences, the uses set aside and the transfer lists' steps are held in `width`'s
    # width (the wrapper's choice: int32 where steps and uses fit), `step_none` its "no next use" (INF
    # in int64): per-use arrays of the needs planned, several bytes a use each. A use's own step is
    # not held per use (it was 4 bytes a planned use more): the walk knows it (see `j` below). The
    # next occurrences are read only for the step being planned, so they are made a piece of steps
    # at a time (`knobs.window` uses at most, whole steps: `_window_fill`), from each unit's next
    # step after the piece (`wends`, made in one backward pass): not an array of every use
    wstart = _window_starts(need_ptr, start_step, knobs.window)
    wends = _window_ends(need_ptr, need_unit, n_units, step_none, width, wstart)
    wlen = 1
    for w in range(len(wstart) - 1):
        if need_ptr[wstart[w + 1]] - need_ptr[wstart[w]] > wlen:
            wlen = need_ptr[wstart[w + 1]] - need_ptr[wstart[w]]
    nocc = np.empty(wlen, width.dtype)   # the current piece's: nocc[k - wbase] for use k
    wcur = -1
    wbase = 0
    # key[u]: next predicted use at or after the current step
    key = np.full(n_units, INF, np.int64)
    for s in range(n_steps - 1, start_step - 1, -1):
        for k in range(need_ptr[s + 1] - 1, need_ptr[s] - 1, -1):
            key[need_unit[k]] = s
    resident = init_resident.copy()
    last_use = np.full(n_units, -1, np.int64)
    ev_at = np.full(n_units, -1, np.int64)   # group of the unit's last eviction
    in_at = np.full(n_units, -1, np.int64)   # group of the unit's last fetch
    # per chunk: the unit whose fetch last found it empty (-1: none yet), and that fetch's group
    c_fill = np.full(len(chunk_weight), -1, np.int64)
    c_fill_at = np.full(len(chunk_weight), -1, np.int64)
    # per chunk: the latest step an eviction of one of its units is issued before. A chunk that
    # empties frees its room only once all of them are out, which the steps of other fetches'
    # victims (issued once each is dead) may put after a fetch's own
    c_out_at = np.full(len(chunk_weight), -1, np.int64)
    cap_heap = n_occ + 2 * n_units + 16
    hk = np.empty(cap_heap, np.int64)
    hu = np.empty(cap_heap, np.int64)
    hsize = 0
    ccount = np.zeros(len(chunk_weight), np.int64)
    occ = 0
    for u in range(n_units):
        if resident[u]:
            occ = _occ_in(u, unit_chunk, ccount, chunk_weight, occ)
            hsize = _heap_push(hk, hu, hsize, _hkey(key[u], last_use[u], n_steps), u)
    G = n_steps - start_step
    m0 = max(n_occ, 16)
    ev_g = np.empty(m0, width.dtype)
    ev_u = np.empty(m0, need_unit.dtype)   # unit ids: the width the needs have them in
    pf_g = np.empty(m0, width.dtype)
    pf_late = np.empty(m0, np.uint8)   # 1: for a later step than its group's (else its own step's)
    pf_u = np.empty(m0, need_unit.dtype)
    n_ev = 0
    n_pf = 0
    gated = len(need_after) == n_occ
    pf_a = np.empty(m0 if gated else 0, width.dtype)   # written only where uses wait for values
    pf_n = np.empty(m0 if gated else 0, width.dtype)   # and the step each is for (gate_bytes reads it)
    # per step, the latest earlier group prefetching a unit it needs (written here: a list of every
    # prefetch's step, 4 bytes an entry, was made for it and the late flags alone)
    need_group = np.full(G, -1, np.int64)
    pend = np.empty(n_occ if gated else 1, width.dtype)   # lookahead uses set aside until their values exist
    pend_j = np.empty(n_occ if gated else 1, width.dtype)   # and their steps
    npend = 0
    pend_step = np.full(n_units if gated else 1, INF, np.int64)   # per unit, its earliest use set aside
    wait_prev = np.zeros(G, np.uint8)
    thrash = np.zeros(G, np.uint8)
    aside_u = np.empty(n_units + 1, np.int64)
    ahead = need_ptr[start_step]
    js = start_step   # the lookahead's step: need_ptr[js] <= k < need_ptr[js + 1] (k only grows there)
    for i in range(start_step, n_steps):
        g = i - start_step
        n_aside = 0
        if wcur < 0 or i >= wstart[wcur + 1]:
            wcur += 1
            wbase = need_ptr[wstart[wcur]]
            _window_fill(need_ptr, need_unit, wstart[wcur], wstart[wcur + 1], wends[wcur], nocc)
        # a step larger than memory streams through it: keep one unit free for
        # its faults, as the simulator runs it (so plan and memory agree after)
        big_i = front and need_ptr[i + 1] - need_ptr[i] > cap
        # (with its front first it takes all of memory: the room its first fault needs is made by
        # the fault path's eviction of a chunk's worth of the units it used, as the simulator runs it)
        cap_i = cap - 1 if (need_ptr[i + 1] - need_ptr[i] > cap and cap > 1 and not big_i) else cap
        front_end = need_ptr[i] + cap_i     # its first cap_i units, in need order
        tail_k = need_ptr[i + 1] - 1        # where the search for its last resident units goes on
        in_flight = 0
        # step i's own units first (some may have been prefetched, then evicted
        # again by a more urgent need), then the uses set aside whose values now
        # exist, then the lookahead from where it stopped
        k = need_ptr[i]
        end_m = need_ptr[i + 1]
        phase = 0        # 0: step i's own units, 1: the uses set aside, 2: the lookahead
        pi = 0
        keep_p = 0       # the uses set aside kept so far (compacted in place)
        while True:
            if phase == 0:
                if k >= end_m:
                    phase = 1
                    continue
                kq = k
                j = i
            elif phase == 1:
                if pi >= npend:
                    npend = keep_p
                    phase = 2
                    k = ahead if ahead > end_m else end_m
                    continue
                kq = pend[pi]
                j = pend_j[pi]
            else:
                if k >= n_occ:
                    break
                kq = k
                while need_ptr[js + 1] <= kq:
                    js += 1
                while need_ptr[js] > kq:
                    js -= 1
                j = js
            mandatory = j <= i
            if phase == 1 and (mandatory or resident[need_unit[kq]]):
                pi += 1           # its own step fetches it (or it is there): no longer set aside
                continue
            if not mandatory:
                if j - i > lookahead_steps or in_flight >= lookahead_units:
                    break
                if gated and need_after[kq] >= i:
                    # not known before step need_after + 1: set aside, tried again then
                    if phase == 1:
                        pend[keep_p] = kq
                        pend_j[keep_p] = j
                        keep_p += 1
                        pi += 1
                    else:
                        pend[npend] = kq
                        pend_j[npend] = j
                        npend += 1
                        if j < pend_step[need_unit[kq]]:
                            pend_step[need_unit[kq]] = j
                        k += 1
                    continue
            u = need_unit[kq]
            if resident[u]:
                if big_i and phase == 0 and kq < front_end and i > start_step and need_ptr[i] - need_ptr[i - 1] > cap:
                    # after a launch larger than memory, what it left behind is the run's (the tree
                    # prefetcher refills as it streams): its front is listed whole, so that the run
                    # brings whatever of it is gone (a prefetch of a resident unit moves nothing)
                    if n_pf >= len(pf_u):
                        pf_u = grow(pf_u)
                        pf_g = grow(pf_g)
                        pf_late = grow(pf_late)
                        if gated:
                            pf_a = grow(pf_a)
                            pf_n = grow(pf_n)
                    pf_g[n_pf] = g
                    pf_late[n_pf] = 0
                    pf_u[n_pf] = u
                    if gated:
                        pf_a[n_pf] = -1
                        pf_n[n_pf] = g
                    n_pf += 1
                k += 1
                continue
            ok = True
            at = i
            first = True
            while occ + _room(u, unit_chunk, ccount, chunk_weight) > cap_i:
                found = False
                while hsize > 0:
                    v = hu[0]
                    if resident[v] == 0 or _hkey(key[v], last_use[v], n_steps) != hk[0]:
                        hsize = _heap_pop(hk, hu, hsize)  # stale
                        continue
                    kk = key[v]
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
                if not found:
                    ok = False
                    break
                at_v = i
                if mandatory:
                    # issue the exchange once the victim is dead
                    at_v = last_use[v] + 2
                    if at_v < in_at[v] + 1:
                        at_v = in_at[v] + 1
                    if at_v < ev_at[u] + 1:
                        at_v = ev_at[u] + 1
                    if gated and at_v < need_after[kq] + 1:
                        at_v = need_after[kq] + 1   # and once its values exist
                    if at_v < start_step:
                        at_v = start_step
                    if at_v > i:
                        at_v = i
                    if at_v == i and last_use[v] == i - 1 and i > start_step:
                        wait_prev[g] = 1
                # the fetch goes once every victim it needed is out
                at = at_v if first or at_v > at else at
                first = False
                resident[v] = 0
                occ = _occ_out(v, unit_chunk, ccount, chunk_weight, occ)
                cv = unit_chunk[v]
                if at_v > c_out_at[cv]:
                    c_out_at[cv] = at_v
                if ccount[cv] == 0 and c_out_at[cv] > at:
                    # the room this victim makes is its chunk's, free once every unit of it is out
                    at = c_out_at[cv]
                if n_ev >= len(ev_u):
                    ev_u = grow(ev_u)
                    ev_g = grow(ev_g)
                ev_g[n_ev] = at_v - start_step
                ev_u[n_ev] = v
                ev_at[v] = at_v
                n_ev += 1
            if not ok:
                if mandatory:
                    thrash[g] = 1
                    k += 1
                    continue  # leave it to fault
                break
            c = unit_chunk[u]
            if mandatory and first and ccount[c] > 0:
                at = _with_filler(u, c, at, c_fill, c_fill_at, resident, in_at, last_use, ev_at,
                                  max(need_after[kq] + 1 if gated else 0, start_step))
            elif ccount[c] == 0:
                c_fill[c] = u
                c_fill_at[c] = at
            resident[u] = 1
            occ = _occ_in(u, unit_chunk, ccount, chunk_weight, occ)
            if gated and pend_step[u] < j:
                j = pend_step[u]     # an earlier use of it is set aside: that is its next use
            key[u] = j
            in_at[u] = at
            hsize = _heap_push(hk, hu, hsize, _hkey(j, last_use[u], n_steps), u)
            if n_pf >= len(pf_u):
                pf_u = grow(pf_u)
                pf_g = grow(pf_g)
                pf_late = grow(pf_late)
                if gated:
                    pf_a = grow(pf_a)
                    pf_n = grow(pf_n)
            pf_g[n_pf] = at - start_step
            pf_late[n_pf] = 1 if j != at else 0
            if j != at and at - start_step > need_group[j - start_step]:
                need_group[j - start_step] = at - start_step
            pf_u[n_pf] = u
            if gated:
                pf_a[n_pf] = need_after[kq]
                pf_n[n_pf] = j - start_step
            n_pf += 1
            if not mandatory:
                in_flight += 1
            if phase == 1:
                pi += 1
            else:
                k += 1
        if phase == 1:
            # stopped among the uses set aside: keep the rest of them
            while pi < npend:
                pend[keep_p] = pend[pi]
                pend_j[keep_p] = pend_j[pi]
                keep_p += 1
                pi += 1
            npend = keep_p
        if phase == 2 and k > ahead:
            ahead = k
        if ahead < need_ptr[i + 1]:
            ahead = need_ptr[i + 1]
        for a in range(n_aside):
            v = aside_u[a]
            if resident[v]:
                hsize = _heap_push(hk, hu, hsize, _hkey(key[v], last_use[v], n_steps), v)
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
                vict2 = np.empty(L, np.int64)
                hst2 = np.zeros(2, np.int64)
                hst2[1] = s0 - wbase   # positions in the piece of next occurrences (`nocc`, `wunits`)
                wunits = need_unit[wbase:]
                sc2 = InLaunch(np.empty(L, np.int64), np.empty(L, np.int64), hst2, np.empty(L, np.int64), vict2,
                               n_steps)
                for kk2 in range(s0, s0 + L):
                    u = need_unit[kk2]
                    if resident[u]:
                        continue
                    if occ + _room(u, unit_chunk, ccount, chunk_weight) > cap:
                        nv = _inlaunch_victims(wunits, nocc, s0 - wbase, s0 + L - wbase, kk2 - wbase, unit_want[u],
                                               sc2, resident, unit_block, unit_block[u])
                        for a in range(nv):
                            v = vict2[a]
                            resident[v] = 0
                            occ = _occ_out(v, unit_chunk, ccount, chunk_weight, occ)
                            ev_at[v] = i
                            c_out_at[unit_chunk[v]] = i
                        # as the run does: the units it needs last make up a chunk's worth
                        for kk3 in range(s0 + L - 1, kk2, -1):
                            if nv >= unit_want[u]:
                                break
                            v = need_unit[kk3]
                            if resident[v]:
                                resident[v] = 0
                                occ = _occ_out(v, unit_chunk, ccount, chunk_weight, occ)
                                ev_at[v] = i
                                c_out_at[unit_chunk[v]] = i
                                nv += 1
                        if nv == 0:
                            continue
                    resident[u] = 1
                    occ = _occ_in(u, unit_chunk, ccount, chunk_weight, occ)
                    in_at[u] = i
            else:
                tail = need_ptr[i + 1] - cap_i
                for kk2 in range(s0, s0 + L):
                    u = need_unit[kk2]
                    if kk2 < tail:
                        if resident[u]:
                            resident[u] = 0
                            occ = _occ_out(u, unit_chunk, ccount, chunk_weight, occ)
                            ev_at[u] = i
                            c_out_at[unit_chunk[u]] = i
                    elif resident[u] == 0:
                        if occ + _room(u, unit_chunk, ccount, chunk_weight) <= cap_i:
                            resident[u] = 1
                            occ = _occ_in(u, unit_chunk, ccount, chunk_weight, occ)
                            in_at[u] = i
        # execute step i: its units' keys move to their next predicted use. A
        # unit the next step needs again is not pushed now: it cannot be a
        # victim while step i+1 is planned (keys <= i+1 never are), and step
        # i+1 pushes it with its next use (a unit that every launch touches,
        # as whole allocations are, costs no heap work until its last use)
        for kk2 in range(need_ptr[i], need_ptr[i + 1]):
            u = need_unit[kk2]
            last_use[u] = i
            nx = nocc[kk2 - wbase]
            key[u] = INF if nx == step_none else nx
            if gated and pend_step[u] <= i:
                pend_step[u] = INF
            if resident[u] and nx != i + 1:
                hsize = _heap_push(hk, hu, hsize, _hkey(key[u], last_use[u], n_steps), u)
        # drop stale entries once they outnumber the units 3 to 1: a small heap
        # stays in cache (a unit is pushed at every use, each push goes stale)
        if hsize > cap_heap - n_units - 8 or hsize > 4 * n_units + 1024:
            hsize = _heap_rebuild(hk, hu, resident, key, last_use, n_units, n_steps)
    return (ev_g[:n_ev], ev_u[:n_ev], pf_g[:n_pf], pf_late[:n_pf], pf_u[:n_pf], wait_prev, thrash,
            pf_a[:n_pf if gated else 0], pf_n[:n_pf if gated else 0], need_group)


@njit(cache=True, nogil=True)
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


def group_order(g, late, u, G):
    """The order np.lexsort((u, late, g)) gives the entries of groups `g` (0..G-1; `late`: entries
    that go after the group's others, None: none), with the groups' CSR pointers and, per group, how
    many entries are not `late`: a counting sort over the (group, late) buckets, stable, and a stable
    sort of each bucket by `u` (the lexsort of tens of millions of transfers, with its int64 keys,
    was a seventh of a replay's time). Groups out of 0..G-1 take the lexsort."""
    lt = np.zeros(len(g), np.uint8) if late is None else late.astype(np.uint8)
    if len(g) and (int(g.min()) < 0 or int(g.max()) >= G):
        order = np.lexsort((u, lt, g))
        sg = g[order]
        return order, _group_ptr(sg, G), _own_counts(sg, lt[order] == 0, G)
    return _group_order(g, lt, u, G)


@njit(cache=True, nogil=True)
def _group_order(g, late, u, G):
    n = len(g)
    cnt = np.zeros(2 * G + 1, np.int64)
    for k in range(n):
        cnt[2 * g[k] + late[k] + 1] += 1
    for b in range(2 * G):
        cnt[b + 1] += cnt[b]
    start = cnt.copy()
    order = np.empty(n, np.int64)
    for k in range(n):
        b = 2 * g[k] + late[k]
        order[cnt[b]] = k
        cnt[b] += 1
    for b in range(2 * G):
        lo = start[b]
        hi = start[b + 1]
        if hi - lo > 1:
            srt = True
            for k in range(lo + 1, hi):
                if u[order[k]] < u[order[k - 1]]:
                    srt = False
                    break
            if not srt:
                seg = order[lo:hi].copy()
                o = np.argsort(u[seg], kind="mergesort")
                for k in range(hi - lo):
                    order[lo + k] = seg[o[k]]
    ptr = np.empty(G + 1, np.int64)
    first = np.empty(G, np.int64)
    for x in range(G):
        ptr[x] = start[2 * x]
        first[x] = start[2 * x + 1] - start[2 * x]
    ptr[G] = n
    return order, ptr, first


def units_by_group(g, late, u, G):
    """u[group_order(g, late, u, G)[0]] with the groups' pointers and per group how many entries are
    not late (`late`: per entry, nonzero where it goes after its group's others, a prefetch for a
    later step than its group's; None: none is): the units in that order without the order itself
    (8 bytes an entry). Only the units are kept, so entries of equal unit in one (group, late) bucket
    are alike whatever their order. Groups out of 0..G-1: group_order."""
    if len(g) and (int(g.min()) < 0 or int(g.max()) >= G):
        order, ptr, first = group_order(g, late, u, G)
        return u[order], ptr, first
    return _units_by_group(g, np.empty(0, np.uint8) if late is None else late.view(np.uint8)
                           if late.dtype == np.bool_ else late, u, G)


@njit(cache=True, nogil=True)
def _units_by_group(g, late, u, G):
    n = len(g)
    listed = len(late) == n
    cnt = np.zeros(2 * G + 1, np.int64)
    for k in range(n):
        cnt[2 * g[k] + (1 if listed and late[k] != 0 else 0) + 1] += 1
    for b in range(2 * G):
        cnt[b + 1] += cnt[b]
    start = cnt.copy()
    out = np.empty(n, u.dtype)
    for k in range(n):
        b = 2 * g[k] + (1 if listed and late[k] != 0 else 0)
        out[cnt[b]] = u[k]
        cnt[b] += 1
    for b in range(2 * G):
        lo = start[b]
        hi = start[b + 1]
        for k in range(lo + 1, hi):
            if out[k] < out[k - 1]:
                out[lo:hi].sort()
                break
    ptr = np.empty(G + 1, np.int64)
    first = np.empty(G, np.int64)
    for x in range(G):
        ptr[x] = start[2 * x]
        first[x] = start[2 * x + 1] - start[2 * x]
    ptr[G] = n
    return out, ptr, first


@njit(cache=True, nogil=True)
def _own_counts(sorted_g, own, G):
    out = np.zeros(G, np.int64)
    for k in range(len(sorted_g)):
        if own[k]:
            out[sorted_g[k]] += 1
    return out


def belady_plan(need_ptr, need_unit, n_units, cap, start_step, init_resident, lookahead_steps,
                lookahead_units, belady_in=False, unit_want=None, unit_block=None, front=False,
                need_after=None, value_bytes=None, unit_chunk=None, chunk_weight=None, window=None):
    """`_belady_plan` (see there) as CSR arrays over groups start_step..:
    ev_ptr, ev_unit, pf_ptr, pf_unit, need_now, wait_prev, thrash, need_group
    (per step, the latest earlier group that prefetches a unit it needs; -1: none),
    gate (per group, the latest step whose end its values wait for; -1: none),
    gate_bytes (the index values the runtime copies before the group: those of
    the launches its gated prefetches are for; `value_bytes` per step) and, per
    prefetch, the step its values wait for (None where none waits: not a -1 per prefetch).

    Inside a group: evictions by address; the prefetches its own step needs
    first, then the early ones, each by address (so neighbours merge into one
    transfer); need_now counts the first kind. `window`: the uses each piece of the core's next
    occurrences is made for (None: next_use_window's); the plan is the same whatever it is."""
    # the core's per-use arrays of steps and positions: int32 where every step and use fits (see there)
    steps = ID if max(len(need_ptr), len(need_unit)) < np.iinfo(ID).max else np.int64
    ev_g, ev_u, pf_g, pf_late, pf_u, wait_prev, thrash, pf_a, pf_n, need_group = _belady_plan(
        need_ptr, need_unit, n_units, cap, start_step, init_resident,
        PlanKnobs(int(lookahead_steps), int(lookahead_units), bool(belady_in and unit_want is not None), bool(front),
                  int(next_use_window(len(need_unit), n_units) if window is None else window)),
        np.zeros(1, np.int64) if unit_want is None else np.asarray(unit_want, np.int64),
        # either width, no copy; none given: empty in the width gated needs come in (one compile for both)
        PlanUses(np.zeros(0, ID) if need_after is None else need_after,
                 np.empty(0, steps), np.iinfo(steps).max),
        PlanChunks(np.arange(n_units, dtype=np.int64) if unit_chunk is None else np.asarray(unit_chunk, np.int64),
                   np.ones(n_units, np.int64) if chunk_weight is None
                   else np.minimum(np.asarray(chunk_weight, np.int64), max(int(cap), 1)),
                   np.zeros(1, np.int64) if unit_block is None else np.asarray(unit_block, np.int64)))
    G = len(need_ptr) - 1 - start_step
    # each transfer list is let go as soon as what is made from it exists (a plan of 10^6 launches
    # has tens of millions of transfers: every list held to the end was ~8 bytes a use more); the
    # units are put in group order without an order array (units_by_group)
    ev_u, ev_ptr, _ = units_by_group(ev_g, None, ev_u, G)
    del ev_g
    # per group the latest step whose values its prefetches wait for (np.maximum.at's result, in one
    # pass: ufunc.at took a tenth of a replay's time); the core made need_group
    gate = np.full(G, -1, np.int64)
    gated = _gate_at(gate, pf_g, pf_a)   # an empty pf_a: the needs have no gates
    gate_bytes = np.zeros(G, np.int64)
    if gated:
        ga = pf_a >= 0
        if value_bytes is not None:
            # one copy per launch whose values a group's prefetches wait for
            pair = np.unique(pf_g[ga].astype(np.int64) * (G + 1) + pf_n[ga])
            np.add.at(gate_bytes, pair // (G + 1), np.asarray(value_bytes, np.int64)[pair % (G + 1) + start_step])
        del ga
    if not gated:
        # no prefetch waits: none is listed (Groups holds none), and only the units are put in order
        pf_u, pf_ptr, need_now = units_by_group(pf_g, pf_late, pf_u, G)
        del pf_g, pf_late
        return ev_ptr, ev_u, pf_ptr, pf_u, need_now, wait_prev, thrash, need_group, gate, gate_bytes, None
    del pf_n
    op, pf_ptr, need_now = group_order(pf_g, pf_late, pf_u, G)
    del pf_g, pf_late
    return (ev_ptr, ev_u, pf_ptr, pf_u[op], need_now, wait_prev, thrash, need_group, gate, gate_bytes, pf_a[op])


@njit(cache=True, nogil=True)
def _gate_at(gate, pf_g, pf_a):
    """gate[g] = max(gate[g], a) over the prefetch entries waiting for values (a >= 0); whether any
    waits. An empty `pf_a`: no entry waits (the core lists none where the needs have no gates)."""
    gated = False
    if len(pf_a) != len(pf_g):
        return gated
    for k in range(len(pf_g)):
        a = pf_a[k]
        if a >= 0:
            gated = True
            g = pf_g[k]
            if a > gate[g]:
                gate[g] = a
    return gated


@njit(cache=True)
def _heap_rebuild(hk, hu, resident, key, last_use, n_units, n_steps):
    size = 0
    for u in range(n_units):
        if resident[u]:
            size = _heap_push(hk, hu, size, _hkey(key[u], last_use[u], n_steps), u)
    return size


LOOKAHEAD_STEPS = 1 << 20


def plan_groups(needs: Needs, n_units: int, cap_units: int, start_step: int = 0,
                init_resident: np.ndarray | None = None, lookahead_steps: int = LOOKAHEAD_STEPS,
                lookahead_units: int | None = None, belady_in: bool = False, universe=None,
                front: bool = False, unit_weight: np.ndarray | None = None) -> Groups:
    """Belady on (predicted) needs: see belady_plan. Full-length Groups.
    `belady_in`: the run gives a launch larger than memory the next uses of its
    units (`next_use_of`), so it ends holding those needed soonest. `front`: such
    a launch's first units come in before it in place of those it needs last. With `universe`,
    capacity is counted in its chunks (a chunk takes its whole weight while any unit of it is
    resident), as the simulator's memory counts it; with `unit_weight` (needs whose units are
    chunks), each unit weighs that; else one each."""
    n = len(needs.ptr) - 1
    res = np.zeros(n_units, np.uint8) if init_resident is None else init_resident.astype(np.uint8)
    la_units = cap_units if lookahead_units is None else lookahead_units
    want = None
    if belady_in and universe is not None:
        # a fault's eviction in such a launch: a chunk's worth, at most all of memory (as the simulator runs it)
        csize = (universe.chunk_hi - universe.chunk_lo)[universe.unit_chunk]
        want = np.minimum(csize, max(cap_units, 1)).astype(I64)
    after = needs.dense_after()   # per use, while this plan is made (Needs holds it sparse)
    ev_ptr, ev, pf_ptr, pf, nn, wp, th, ng, gt, gb, pa_ = belady_plan(
        needs.ptr, needs.unit, n_units, cap_units, start_step, res, lookahead_steps, la_units, belady_in, want,
        None if want is None else universe.block_lo, front, after, needs.value_bytes,
        None if universe is None else universe.unit_chunk,
        unit_weight if universe is None else universe.chunk_weight)
    pad = np.zeros(start_step, I64)
    ng = np.where(ng >= 0, ng + start_step, -1)
    gt = np.where(gt >= 0, gt, -1)   # steps of the whole timeline already
    return Groups(np.concatenate([pad, ev_ptr]), ev, np.concatenate([pad, pf_ptr]), pf,
                  np.concatenate([pad, nn]), np.concatenate([pad.astype(np.uint8), wp]),
                  np.zeros(n, np.uint8), np.concatenate([pad.astype(np.uint8), th]),
                  np.concatenate([pad - 1, ng]), front, gate=np.concatenate([pad - 1, gt]),
                  gate_bytes=np.concatenate([pad, gb]), pf_after=pa_)
