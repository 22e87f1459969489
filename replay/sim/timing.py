"""The simulator's clock: when each launch starts and ends, from its counters and the cost profile
(numba; docs/cost-model.md, "Time")."""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit

from ..plan.groups import Groups
from .kernels import (C_BATCHES, C_BLOCKS, C_FAULT_DTOH, C_FAULTS, C_GROUP_DTOH, C_PREFETCH_IN, C_PREFETCH_NEED, C_TRANSFERS, C_TREE_IN,
                      C_USED_GROUP, C_USED_OWN, C_USED_POS)

# What the clock charges, from a cost profile (replay/costs.py's fields of the same names).
Costs = namedtuple("Costs", "charges fault_time_s faults_per_batch batch_overhead_s htod_bw dtoh_bw duplex "
                            "pipelined_bw latency block_service_s")
# When a step's planned group may start and what its launch waits for (plan.groups.Groups' flags), and
# the step whose end the group's index values wait for, with the seconds their copy to the host takes.
# `gate_frac`: the share of the group's planned prefetches that wait for the gate, `own_plain`: the
# share that are the launch's own and do not (moved first), `own_gated`: whether the launch's own
# planned units include gated ones; `calls`: the transfers a runtime issues for the group, each charged
# the per-call latency (-1: the runs of consecutive units the group moved, counted by the engine).
# `host`: per step, the host seconds of a runtime's launch callback at that launch (empty: none), and
# `host_ahead`: how many launches the host may run ahead of the GPU (0: as far as it likes; below).
Order = namedtuple("Order", "blocking wait_prev need_group gate gate_s gate_frac own_plain own_gated calls "
                            "host host_ahead")


@njit(cache=True)
def fault_seconds(faults, blocks, batches, c):
    """The fault path's charge for a launch's faults: per fault, per VA block serviced in a batch and
    per batch (docs/cost-model.md, "Time"); a lone fault costs the three together."""
    if not c.charges or faults <= 0:
        return 0.0
    return faults * c.fault_time_s + blocks * c.block_service_s + batches * c.batch_overhead_s


@njit(cache=True)
def bulk_seconds(h, d, transfers, c, duplex, latency):
    """Seconds to move h bytes in and d out in `transfers` ranges (`duplex`: on two copy engines)."""
    if not c.charges:
        return 0.0
    th = h / c.htod_bw
    td = d / c.dtoh_bw
    if duplex:
        t = max(th, td, (h + d) / c.pipelined_bw)
    else:
        t = th + td
    return t + transfers * latency


@njit(cache=True)
def _timing(counters, compute, gran, order, c):
    """Simulated time per step. A planned group is issued while the previous
    launch runs (after it, when `wait_prev` or `blocking`) and runs on the copy
    engines in issue order; a launch starts when the previous one ended, the
    part of its own group it needs has arrived (the whole group when
    `blocking`) and the earlier group `need_group` holding units it needs has
    finished -- what it needs being what its plan says and what it really
    touches (the counters' C_USED_OWN and C_USED_GROUP: a plan made on
    predictions may bring a unit for a later launch that an earlier one
    touches); its faults (and the evictions and driver prefetches they cause)
    stall it. A group with a `gate` moves the launch's own units that need no
    index values first, as any group starts, then the lookahead's until the
    gate's step has ended and the values are copied (`gate_s`), then the units
    index values chose (`gate_frac` of its transfers' time), then the rest of
    the lookahead's; a launch whose own planned units include gated ones waits
    for the gated part.

    With `host` (a runtime's launch callback, the GPU runner's), the host runs its callbacks one after
    another, asynchronously to the GPU (a launch returns before its kernel runs): callback i ends at
    `hc` = the previous callback's end + host[i], or, with `host_ahead` = d > 0, no earlier than kernel
    i - d started + host[i] (the host at most d launches ahead). Kernel i is queued when its callback
    ends, so it starts no earlier than that; the group the callback issues starts no earlier either.
    The host's time thus delays a kernel only where the GPU would otherwise wait for the launch.
    Returns start, end, stall per step."""
    blocking, wait_prev, need_group = order.blocking, order.wait_prev, order.need_group
    host, host_ahead = order.host, order.host_ahead
    nh = len(host)
    hc = 0.0
    hc_prev = 0.0
    gate, gate_s, gate_frac, own_gated = order.gate, order.gate_s, order.gate_frac, order.own_gated
    own_plain, calls = order.own_plain, order.calls
    n = counters.shape[0]
    start = np.empty(n)
    end = np.empty(n)
    stall = np.empty(n)
    g_end = np.zeros(n)
    g_start = np.zeros(n)
    g_time = np.zeros(n)
    prev_start = 0.0
    prev_end = 0.0
    ce = 0.0
    for i in range(n):
        k = counters[i]
        pf_in = k[C_PREFETCH_IN]
        g_out = k[C_GROUP_DTOH]
        ready = prev_end
        issued = 0.0
        if nh:
            hc_prev = hc
            if host_ahead > 0 and i >= host_ahead:
                hc = max(hc, start[i - host_ahead])
            hc += host[i]
            ready = max(ready, hc)
            issued = hc if (blocking[i] or wait_prev[i]) else hc_prev   # the callback issuing group i
        g_end[i] = ce
        if pf_in > 0 or g_out > 0:
            nt = calls[i] if calls[i] >= 0 else k[C_TRANSFERS]
            tg = bulk_seconds(pf_in * gran, g_out * gran, nt, c, c.duplex, c.latency)
            after = prev_end if (blocking[i] or wait_prev[i]) else prev_start
            gs = max(ce, after, issued)
            p = gate[i]
            gated = p >= 0 and p < i
            gated_end = gs
            if gated:
                fr = min(max(gate_frac[i], 0.0), 1.0)
                op = min(max(own_plain[i], 0.0), 1.0 - fr)
                # the lookahead's units fill the copy engine until the values are there (a
                # runtime issues them range by range), the gated ones go next, then the rest
                t0 = gs + tg * op
                tgate = max(t0, end[p] + gate_s[i])
                look = tg * (1.0 - fr - op)
                gated_end = tgate + tg * fr
                ce = gated_end + look - min(look, tgate - t0)
            else:
                ce = gs + tg
            g_end[i] = ce
            g_start[i] = gs
            g_time[i] = ce - gs
            own = max(k[C_PREFETCH_NEED], k[C_USED_OWN])
            if blocking[i]:
                ready = max(ready, ce)
            elif gated and own_gated[i] and own > 0:
                ready = max(ready, gated_end)
            elif own > 0 and pf_in > 0:
                ready = max(ready, gs + tg * (min(own, pf_in) / pf_in))
        e = need_group[i]
        if e >= 0 and e < i:
            ready = max(ready, g_end[e])
        e = k[C_USED_GROUP] - 1
        if e >= 0 and e < i and counters[e, C_PREFETCH_IN] > 0:
            # the last unit it touches of that group has arrived (groups run in order, each in its order)
            ready = max(ready, g_start[e] + g_time[e] * (min(k[C_USED_POS], counters[e, C_PREFETCH_IN])
                                                        / counters[e, C_PREFETCH_IN]))
        f = fault_seconds(k[C_FAULTS], k[C_BLOCKS], k[C_BATCHES], c)
        f += bulk_seconds(k[C_TREE_IN] * gran, k[C_FAULT_DTOH] * gran, 0, c, False, 0.0)
        start[i] = ready
        end[i] = ready + compute[i] + f
        stall[i] = ready - prev_end + f
        prev_start = start[i]
        prev_end = end[i]
    return start, end, stall


def costs_of(profile) -> Costs:
    """A cost profile's charges, as the clock takes them."""
    p = profile
    return Costs(bool(p.charges), float(p.fault_time_s), int(p.faults_per_batch), float(p.batch_overhead_s),
                 float(p.htod_bandwidth), float(p.dtoh_bandwidth), bool(p.duplex), float(p.pipelined_bandwidth),
                 float(p.transfer_latency_s), float(p.block_service_s))


def gate_seconds(groups: Groups, profile) -> np.ndarray:
    """Per group, what copying its index values to the host costs once their writer has ended: one
    transfer (the profile's `transfer_latency_s`) of `gate_bytes` at device-to-host bandwidth."""
    if not profile.charges:
        return np.zeros(groups.n_steps)
    return np.where(groups.gate >= 0, float(profile.transfer_latency_s)
                    + groups.gate_bytes / float(profile.dtoh_bandwidth), 0.0)


def gate_shares(groups: Groups) -> tuple[np.ndarray, np.ndarray]:
    """Per group: the share of its planned prefetches that wait for its gate (all of them, for
    each gate, wait for the latest: the copy of the values comes once), the share that are its
    launch's own (the first `need_now`) and do not, and whether the launch's own include gated ones. A gated group whose prefetches the plan
    does not list (an online policy's, `on_launch`) waits for the gate with all of them."""
    n = groups.n_steps
    ptr = groups.pf_ptr
    size = np.diff(ptr)
    unlisted = (groups.gate >= 0) & (size == 0)
    frac = unlisted.astype(np.float64)
    own = unlisted.copy()
    own_plain = np.zeros(n)
    if not groups.waits_for_values():
        return frac, own_plain, own
    gated, plain_own, gated_own = _gate_counts(ptr, groups.pf_after, groups.need_now)
    frac = np.maximum(frac, gated / np.maximum(size, 1))
    own_plain = plain_own / np.maximum(size, 1)
    own |= gated_own > 0
    return frac.astype(np.float64), own_plain.astype(np.float64), own


@njit(cache=True, nogil=True)
def _gate_counts(ptr, pf_after, need_now):
    """Per group: its prefetches that wait for index values, its launch's own (the first
    `need_now`) that do not, and its launch's own that do. One pass over the prefetches; the step,
    position and flag of every prefetch as arrays (some six 8-byte arrays a prefetch) were a
    planned replay's high at scale 10 (+70 MB in a trial run; docs/performance.md)."""
    n = len(ptr) - 1
    gated = np.zeros(n, np.int64)
    plain_own = np.zeros(n, np.int64)
    gated_own = np.zeros(n, np.int64)
    for s in range(n):
        lo = ptr[s]
        for k in range(lo, ptr[s + 1]):
            mine = k - lo < need_now[s]
            if pf_after[k] >= 0:
                gated[s] += 1
                if mine:
                    gated_own[s] += 1
            elif mine:
                plain_own[s] += 1
    return gated, plain_own, gated_own


def run_timing(counters, comp, gran, groups: Groups, profile):
    """start, end and stall per step of a run's counters under `profile` (see _timing)."""
    frac, own_plain, own = gate_shares(groups)
    calls = np.full(len(counters), -1, np.int64) if groups.calls is None else np.asarray(groups.calls, np.int64)
    hl = float(getattr(profile, "host_launch_s", 0.0) or 0.0)
    host = np.zeros(0)
    if profile.charges and groups.host_s is not None:
        # a runtime that charges its own callback (the planned runner: its quiet launches, its base and
        # calls; policies/runner.py): the host's clock, asynchronous to the GPU (_timing)
        host = np.asarray(groups.host_s, np.float64)
    elif profile.charges and hl > 0:
        # the GPU runner's callback runs on the host at each launch, while the kernel before it runs:
        # a kernel shorter than the callback leaves the GPU waiting for the next launch
        comp = np.maximum(comp, hl)
    return _timing(counters, comp, float(gran), Order(groups.blocking, groups.wait_prev, groups.need_group,
                                                      groups.gate.astype(np.int64), gate_seconds(groups, profile),
                                                      frac, own_plain, own, calls, host, int(groups.host_ahead)),
                   costs_of(profile))
