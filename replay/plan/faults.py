"""Leaving some of a plan's prefetches to faults, where a trial run says the launches have time for them.

A planned prefetch costs the copy engines its transfer's fixed charge and its
bytes (`transfer_latency_s` + bytes at the bulk rate); leaving its units to
fault costs the launch that touches them their faults instead (`_transfer_costs`: an entry
per page the launch touches in a unit, a block service per VA block, a batch's overhead). Which is
cheaper depends on which of the two is on the run's critical path there: where
the copy engines are behind (the launch after this one waits for its
transfers), a launch's own faults are hidden in that wait, and every transfer
dropped brings the copy engines' later work forward. docs/cost-model.md ("Left
to faults") says how that came up (scattered rows, each a short transfer, on
the LLM rows of docs/results.md) and what the simulator does and does not
charge for a fault.

`leave_to_faults(plan, needs, base, run, profile, gran)` picks, launch by
launch, the transfers whose faults fit in the time the next launch waited in
`run` (the plan's own trial run), best saving per second of fault first, and
returns the plan without them (None when none fits). A transfer is only left
if the plan brought nothing in it that a later launch uses before the plan
evicts it (those units would fault again later, unplanned). The plan keeps the
room it made for the units it no longer fetches, so their faults evict
nothing. The caller runs the result and keeps it only if it is faster
(spans.choose_span): the rule estimates, the trial run decides.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pagecast.uvm import PAGE

from ..unit_space import I64, ID, Needs
from .groups import Groups, keep_prefetches


def unit_move_seconds(profile, gran: int) -> float:
    """What one unit costs the copy engines in bulk, in and (later) out again: the profile's bulk
    formula for a unit each way, without the per-transfer charge (docs/cost-model.md, "Time")."""
    return float(profile.bulk_time(gran, gran, 0))


def prefetch_uses(g: Groups, needs: Needs, base: Needs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per prefetch entry of `g`: the step it is for (first step of `needs` at or after its group
    holding the unit; -1: none), whether `base` (the footprints before widening) holds the unit at
    that step, and whether it is an extra that some later step of `base` uses before the plan
    evicts it again (useful widening). One backward pass (numba), no sorting."""
    n = g.n_steps
    n_units = int(max(needs.unit.max(initial=-1), base.unit.max(initial=-1), g.pf_unit.max(initial=-1),
                      g.ev_unit.max(initial=-1))) + 1
    # the steps in int32 where they fit (4 bytes a prefetch entry less, as `narrow` keeps steps)
    width = np.empty(0, ID if n + 1 < np.iinfo(ID).max else I64)
    return _prefetch_uses(g.pf_ptr, g.pf_unit, g.ev_ptr, g.ev_unit, needs.ptr, needs.unit, base.ptr, base.unit,
                          (n, n_units), width)   # read only, either width (unit_space.narrow): no copies of every use


@njit(cache=True)
def _prefetch_uses(pf_ptr, pf_unit, ev_ptr, ev_unit, n_ptr, n_unit, b_ptr, b_unit, dims, width):
    n, n_units = dims   # (steps, units)
    none = np.int64(n + 1)
    nxt_need = np.full(n_units, none, np.int64)   # first step >= s whose needs hold the unit
    nxt_base = np.full(n_units, none, np.int64)   # the same in base
    nxt_ev = np.full(n_units, none, np.int64)     # first group > s evicting it
    need = np.full(len(pf_unit), -1, width.dtype)
    own = np.zeros(len(pf_unit), np.bool_)
    useful = np.zeros(len(pf_unit), np.bool_)
    for s in range(n - 1, -1, -1):
        for k in range(n_ptr[s], n_ptr[s + 1]):
            nxt_need[n_unit[k]] = s
        for k in range(b_ptr[s], b_ptr[s + 1]):
            nxt_base[b_unit[k]] = s
        for k in range(pf_ptr[s], pf_ptr[s + 1]):
            u = pf_unit[k]
            j = nxt_need[u]
            if j != none:
                need[k] = j
            used = nxt_base[u]
            own[k] = j != none and used == j
            useful[k] = (not own[k]) and used != none and used < nxt_ev[u]
        for k in range(ev_ptr[s], ev_ptr[s + 1]):
            nxt_ev[ev_unit[k]] = s
    return need, own, useful


HORIZON = 1
BLOCK = 2 << 20   # a VA block: the driver services each once per fault batch


def _entries(g: Groups, base: Needs, need: np.ndarray, gran: int) -> np.ndarray:
    """Per prefetch entry of `g`, the fault-buffer entries its unit makes when it faults at the step
    it is for: the pages that step touches in it (base.pages), else all of the unit's pages (as the
    simulator counts a plan's needs, run.fault_entries)."""
    whole = max(int(gran) // PAGE, 1)
    out = np.full(len(g.pf_unit), whole, ID)   # pages of one unit: int32 (the sums that read them are float64)
    pages = base.page_counts()   # an alternative's are made here, after its plans (Workload.needs_from)
    if pages is None or len(pages) != len(base.unit) or len(base.unit) == 0:
        return out
    _pages_at(base.ptr, base.unit, pages, need, g.pf_unit, out)
    return out


@njit(cache=True)
def _pages_at(ptr, unit, pages, need, pf_unit, out):
    """out[i] = the pages step need[i] touches in unit pf_unit[i], where that step holds it (its
    units ascend: a binary search in the step's own uses; nothing the size of every use is made)."""
    for i in range(len(need)):
        s = need[i]
        if s < 0:
            continue
        lo = ptr[s]
        hi = ptr[s + 1]
        u = pf_unit[i]
        while lo < hi:
            mid = (lo + hi) >> 1
            if unit[mid] < u:
                lo = mid + 1
            else:
                hi = mid
        if lo < ptr[s + 1] and unit[lo] == u:
            out[i] = pages[lo]


@njit(cache=True)
def _pick(order, t_need, cost, wait, cw, n, horizon):
    """The transfers of `order` taken, launch by launch (see leave_to_faults): one compiled pass (a
    Python step per candidate transfer was most of the rule's time), the same float64 sums."""
    out = np.empty(len(order), np.int64)
    m = 0
    d = 0.0
    at = -1
    for i in range(len(order)):
        t = order[i]
        j = t_need[t]
        while at < j:
            at += 1
            if at > 0:
                x = d - wait[at - 1]
                d = x if x > 0.0 else 0.0   # max(0.0, x) as Python takes it
        jj = j + horizon
        if jj > n:
            jj = n
        if d + cost[t] <= cw[jj] - cw[j]:
            out[m] = t
            m += 1
            d += cost[t]
    return out[:m]


@njit(cache=True, nogil=True)
def _transfer_ids(pf_ptr, pf_unit, need, tid):
    """tid[i]: the transfer of prefetch entry i (a new one where a group starts, the unit is not the
    one after the entry before's, or the step it is for changes); returns how many."""
    t = -1
    for s in range(len(pf_ptr) - 1):
        for i in range(pf_ptr[s], pf_ptr[s + 1]):
            if i == pf_ptr[s] or pf_unit[i] - pf_unit[i - 1] != 1 or need[i] != need[i - 1]:
                t += 1
            tid[i] = t
    return t + 1


@njit(cache=True, nogil=True)
def _transfer_costs(tid, nt, need, own, useful, ent, fl, per):
    """Per transfer: the step it is for, the seconds not moving it saves (transfer_latency_s + its
    units at the bulk rate), the seconds its launch's faults on it cost (as the simulator charges
    them, timing.fault_seconds: fault_time_s per page its own entries touch, block_service_s per
    block of ceil(own entries / units a block), batch_overhead_s per batch of up to
    faults_per_batch pages), and whether a later step uses a unit it brings (see leave_to_faults)."""
    latency, unit_s, fault_s, block_s, batch_s = fl[0], fl[1], fl[2], fl[3], fl[4]
    per_block, per_batch = per
    t_need = np.empty(nt, need.dtype)
    size = np.zeros(nt, np.int64)
    faults = np.zeros(nt, np.int64)
    pages = np.zeros(nt, np.float64)
    has_useful = np.zeros(nt, np.bool_)
    for i in range(len(tid)):
        t = tid[i]
        if size[t] == 0:
            t_need[t] = need[i]
        size[t] += 1
        if own[i]:
            faults[t] += 1
            pages[t] += ent[i]
        if useful[i]:
            has_useful[t] = True
    save = np.empty(nt, np.float64)
    cost = np.empty(nt, np.float64)
    for t in range(nt):
        save[t] = latency + size[t] * unit_s
        e = pages[t]
        b = 0.0
        if e > 0:
            b = max(np.ceil(faults[t] / per_block), 1.0)
        cost[t] = e * fault_s + b * block_s + np.ceil(e / per_batch) * batch_s
    return t_need, save, cost, has_useful


def leave_to_faults(g: Groups, needs: Needs, base: Needs, run, profile, gran: int) -> Groups | None:
    """The plan `g` (made on `needs`, widened from `base`) with the transfers whose faults the
    trial `run` has time for left to fault (see the module doc), or None when none qualifies."""
    n = g.n_steps
    if n < 2 or len(g.pf_unit) == 0 or not profile.charges:
        return None
    need, own, useful = prefetch_uses(g, needs, base)
    # a transfer: consecutive units of one group for one step (what the copy engines count as one).
    # Per prefetch entry (a plan of 10^6 launches has tens of millions) only its transfer's id is
    # made (int32 where it fits); what the rule reads of each transfer (its step, the saving of not
    # moving it, the cost of its faults, whether it holds a unit used later) comes from two compiled
    # passes, with the float64 operations the per-entry arrays and bincounts made, in their order:
    # those arrays (some nine of 8 bytes a transfer) were a planned replay's high at scale 10
    tid = np.empty(len(need), ID if len(need) < np.iinfo(ID).max else I64)
    nt = _transfer_ids(g.pf_ptr, g.pf_unit, need, tid)
    ent = _entries(g, base, need, gran)
    fl = np.array([profile.transfer_latency_s, unit_move_seconds(profile, gran), profile.fault_time_s,
                   profile.block_service_s, profile.batch_overhead_s], np.float64)
    t_need, save, cost, has_useful = _transfer_costs(tid, nt, need, own, useful, ent, fl,
                                                     (max(BLOCK // int(gran), 1), max(int(profile.faults_per_batch), 1)))
    del ent, own, useful
    # the time launch j + 1 waited after launch j ended: j's own faults fit in it
    wait = np.zeros(n)
    wait[:-1] = np.maximum(run.start[1:] - run.end[:-1], 0.0)
    ok = (t_need >= 0) & (t_need < n - 1) & ~has_useful & (g.thrash[np.maximum(t_need, 0)] == 0) & (cost > 0)
    cand = np.flatnonzero(ok)
    if len(cand) == 0:
        return None
    # launch by launch, best saving per second of fault first: a launch's faults delay the launches
    # after it until their waits have absorbed the delay; take a transfer while the delay it leaves
    # is absorbed within the next HORIZON launches
    order = cand[np.lexsort((-save[cand] / cost[cand], t_need[cand]))]
    cw = np.concatenate([[0.0], np.cumsum(wait)])
    drop = _pick(order, t_need, cost, wait, cw, n, HORIZON)
    if len(drop) == 0:
        return None
    keep = np.ones(nt, bool)
    keep[drop] = False
    keep = keep[tid]
    del tid
    return keep_prefetches(g, keep, need)
