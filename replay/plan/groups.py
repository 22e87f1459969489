"""A plan in unit space: per step, the units to evict and then to prefetch before it.

`Groups` is what planned policies hand the simulator (`Policy.prefetch`) and
what plan files hold once mapped back to byte ranges (plan/plan_rows.py). Its
per-step flags say when a group may start and what the launch waits for; a new
kind of constraint on when a transfer may start belongs here, beside them (`gate`:
a group bringing units that index values chose starts only once the launch that
wrote those values has ended and the values are copied to the host).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from ..unit_space import I64, ID, narrow, ranges, unit_width

@dataclass
class Groups:
    """Per step: units to evict, then units to prefetch (need order)."""

    ev_ptr: np.ndarray
    ev_unit: np.ndarray
    pf_ptr: np.ndarray
    pf_unit: np.ndarray
    need_now: np.ndarray     # prefetch entries of the group its own step needs
    wait_prev: np.ndarray    # uint8: the group evicts units of the step before: start after it ends
    blocking: np.ndarray     # uint8: the launch waits for the whole group (swapping)
    thrash: np.ndarray       # uint8: the planner could not fit the step
    need_group: np.ndarray | None = None  # per step: latest earlier group prefetching a unit it needs (-1: none)
    front: bool = False      # planned with launches larger than memory getting their front first (belady_plan)
    faulted: int = 0         # prefetches the plan's needs name that it leaves to faults (plan/faults.py)
    # per step: the latest step whose end the group's index values wait for (-1: none), and the bytes
    # of those values a runtime copies from the GPU once it has ended, before the group may start
    gate: np.ndarray | None = None
    gate_bytes: np.ndarray | None = None
    pf_after: np.ndarray | None = None   # per prefetch entry: the step its values wait for (-1: none)
    # per step: the transfers a runtime issues for the group (the runner's ranges, cut at allocations:
    # online/plan_schedule.py), each charged the per-call cost; None: the runs of consecutive units moved
    calls: np.ndarray | None = None
    # per step: host seconds of a runtime's launch callback at its launch (the runner's, where it charges
    # its own: the host's clock, sim/timing.py); None: only the profile's host_launch_s
    host_s: np.ndarray | None = None
    host_ahead: int = 0      # launches the host may run ahead of the GPU with host_s (0: no bound)

    def __post_init__(self) -> None:
        if self.need_group is None:
            self.need_group = np.full(len(self.need_now), -1, I64)
        # no prefetch waiting for index values is held as an empty pf_after, not one -1 per prefetch
        # (most plans have none: an array the size of the prefetch list for nothing; prefetch_after)
        if self.pf_after is None or (len(self.pf_after) == len(self.pf_unit) and not (self.pf_after >= 0).any()):
            self.pf_after = np.zeros(0, ID)
        # the per-transfer arrays as int32 where they fit (unit_space.narrow: unit ids the universe made
        # int16 stay so); the per-step ones as given
        self.ev_unit, self.pf_unit, self.pf_after = narrow(self.ev_unit), narrow(self.pf_unit), narrow(self.pf_after)
        if self.gate is None:
            self.gate = gate_of(self.pf_ptr, self.pf_after)
        if self.gate_bytes is None:
            self.gate_bytes = np.zeros(len(self.need_now), I64)

    @property
    def n_steps(self) -> int:
        return len(self.need_now)

    def prefetch_after(self) -> np.ndarray:
        """pf_after, or -1 for every prefetch where none waits (an empty pf_after, or a caller set
        pf_unit without it): made for the caller, not kept."""
        if len(self.pf_after) != len(self.pf_unit):
            return narrow(np.full(len(self.pf_unit), -1, I64))
        return self.pf_after

    def waits_for_values(self) -> bool:
        """Whether some prefetch waits for index values (a pf_after entry >= 0)."""
        return len(self.pf_after) == len(self.pf_unit) and bool((self.pf_after >= 0).any())

    @classmethod
    def empty(cls, n: int) -> "Groups":
        z = np.zeros(n + 1, I64)
        return cls(z, np.zeros(0, I64), z.copy(), np.zeros(0, I64), np.zeros(n, I64), np.zeros(n, np.uint8),
                   np.zeros(n, np.uint8), np.zeros(n, np.uint8))

    def splice(self, other: "Groups", s: int) -> "Groups":
        """Steps < s from self, steps >= s from other (a full-length Groups)."""
        def cat(ptr_a, u_a, ptr_b, u_b):
            head = u_a[:ptr_a[s]]
            tail = u_b[ptr_b[s]:]
            ptr = np.concatenate([ptr_a[:s + 1], ptr_b[s + 1:] - ptr_b[s] + ptr_a[s]])
            return ptr, np.concatenate([head, tail])
        ev_ptr, ev = cat(self.ev_ptr, self.ev_unit, other.ev_ptr, other.ev_unit)
        pf_ptr, pf = cat(self.pf_ptr, self.pf_unit, other.pf_ptr, other.pf_unit)
        _, pa_ = cat(self.pf_ptr, self.prefetch_after(), other.pf_ptr, other.prefetch_after())
        def j(a, b):
            return np.concatenate([a[:s], b[s:]])
        return Groups(ev_ptr, ev, pf_ptr, pf, j(self.need_now, other.need_now), j(self.wait_prev, other.wait_prev),
                      j(self.blocking, other.blocking), j(self.thrash, other.thrash),
                      j(self.need_group, other.need_group), self.front, self.faulted,
                      j(self.gate, other.gate), j(self.gate_bytes, other.gate_bytes), pa_,
                      None if self.calls is None or other.calls is None else j(self.calls, other.calls),
                      None if self.host_s is None or other.host_s is None else j(self.host_s, other.host_s),
                      self.host_ahead)


def gate_of(pf_ptr: np.ndarray, pf_after: np.ndarray) -> np.ndarray:
    """Per group, the latest step its prefetches' values wait for (-1: none)."""
    n = len(pf_ptr) - 1
    gate = np.full(n, -1, I64)
    if len(pf_after):
        step = np.repeat(np.arange(n, dtype=I64), np.diff(pf_ptr))
        np.maximum.at(gate, step, pf_after)
    return gate


def prefetch_steps(g: Groups) -> np.ndarray:
    """The group (step) of each of `g`'s prefetch entries (int32 where the steps fit)."""
    return np.repeat(np.arange(g.n_steps, dtype=ID if g.n_steps < np.iinfo(ID).max else I64), np.diff(g.pf_ptr))


def first_need(step: np.ndarray, units: np.ndarray, needs, n: int) -> np.ndarray:
    """For each (group step, unit), the first step >= group step whose needs contain the unit (-1: none).

    Made over ranges of unit ids holding about `FIRST_NEED_PIECE` need entries each: a unit's
    entries all fall in its range, so each answer is the one a sort of every entry gives, and the
    sorted keys (and the step of each entry) exist for one range at a time, not for all the needs."""
    units = np.asarray(units)
    step = np.asarray(step, I64)
    out = np.full(len(units), -1, I64)
    nu = needs.unit
    if not len(nu) or not len(units):
        return out
    ptr = np.asarray(needs.ptr, I64)
    # unit range bounds: cut where the entries so far pass a multiple of the piece
    cum = np.cumsum(np.bincount(nu))
    cuts = np.searchsorted(cum, np.arange(FIRST_NEED_PIECE, int(cum[-1]), FIRST_NEED_PIECE), side="left") + 1
    bounds = np.unique(np.concatenate([[0], cuts, [len(cum)]]))
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        at = np.flatnonzero((nu >= lo) & (nu < hi)) if len(bounds) > 2 else np.arange(len(nu), dtype=I64)
        q = np.flatnonzero((units >= lo) & (units < hi)) if len(bounds) > 2 else np.arange(len(units), dtype=I64)
        if not len(q) or not len(at):
            continue
        occ_step = np.searchsorted(ptr, at, side="right") - 1
        key = nu[at].astype(I64) * (n + 1) + occ_step
        del at, occ_step
        key.sort()
        hit = first_at_or_after(key, units[q], step[q], n + 1)
        del key
        out[q] = np.where(hit < n + 1, hit, -1)
    return out


FIRST_NEED_PIECE = 1 << 20   # need entries whose keys first_need sorts at a time (8 bytes each)


def first_at_or_after(keys: np.ndarray, units: np.ndarray, step: np.ndarray, m: int) -> np.ndarray:
    """`keys`: sorted unit * m + step of some (unit, step) pairs. For each (unit, step) asked, the
    first step >= it at which that unit has a pair; m where none."""
    q = np.asarray(units, I64) * m + np.asarray(step, I64)
    pos = np.searchsorted(keys, q, side="left")
    if len(keys) == 0:
        return np.full(len(q), m, I64)
    hit = keys[np.minimum(pos, len(keys) - 1)]
    good = (pos < len(keys)) & (hit // m == np.asarray(units, I64))
    return np.where(good, hit % m, m).astype(I64)


def keep_prefetches(g: Groups, keep: np.ndarray, need: np.ndarray) -> Groups:
    """`g` with only the prefetch entries `keep` marks (its evictions unchanged): what each launch
    waits for (`need_now`, `need_group`) follows from the entries left. `need`: the step each
    entry is for (first_need on the plan's needs). One compiled pass over the groups: the step of
    every entry, and its kept and own subsets, were a planned replay's high (plan/faults.py's caller,
    ~15 bytes a prefetch entry)."""
    ptr, need_now, need_group, units = _kept(g.pf_ptr, keep, need, g.pf_unit)
    pa_ = g.pf_after[keep] if g.waits_for_values() else None
    gate = gate_of(ptr, np.zeros(0, I64) if pa_ is None else pa_)
    return Groups(g.ev_ptr, g.ev_unit, ptr, units, need_now,
                  g.wait_prev, g.blocking, g.thrash, need_group, g.front, g.faulted + int(len(keep) - len(units)),
                  gate, np.where(gate >= 0, g.gate_bytes, 0), pa_)


@njit(cache=True, nogil=True)
def _kept(pf_ptr, keep, need, pf_unit):
    """keep_prefetches' arrays: per group its kept entries' pointers, how many its own step needs
    (need == group), per step the latest earlier group keeping an entry for it (need > group), and
    the kept units in order."""
    n = len(pf_ptr) - 1
    ptr = np.zeros(n + 1, np.int64)
    need_now = np.zeros(n, np.int64)
    need_group = np.full(n, -1, np.int64)
    m = 0
    for k in range(len(keep)):
        if keep[k]:
            m += 1
    units = np.empty(m, pf_unit.dtype)
    m = 0
    for s in range(n):
        for k in range(pf_ptr[s], pf_ptr[s + 1]):
            if not keep[k]:
                continue
            units[m] = pf_unit[k]
            m += 1
            j = need[k]
            if j == s:
                need_now[s] += 1
            elif j > s and s > need_group[j]:
                need_group[j] = s
        ptr[s + 1] = m
    return ptr, need_now, need_group, units


def same_plan(a: Groups, b: Groups) -> bool:
    return all(np.array_equal(getattr(a, f), getattr(b, f))
               for f in ("ev_ptr", "ev_unit", "pf_ptr", "pf_unit", "need_now", "wait_prev", "need_group", "gate"))


def chunk_groups_to_units(g: Groups, chunk_lo: np.ndarray, chunk_hi: np.ndarray) -> Groups:
    """A plan over chunk ids -> the same plan over their units (order kept)."""
    size = chunk_hi - chunk_lo
    width = unit_width(int(chunk_hi.max(initial=0)))

    def expand(ptr, ch):
        cs = np.concatenate([[0], np.cumsum(size[ch])]).astype(I64)
        # the units written once in the universe's width (F._ranges made three int64 arrays of
        # every unit: the peak of an alloc plan over chunks)
        return cs[ptr], ranges(chunk_lo[ch], size[ch], width), cs
    ev_ptr, ev, _ = expand(g.ev_ptr, g.ev_unit)
    pf_ptr, pf, cs = expand(g.pf_ptr, g.pf_unit)
    need_now = cs[g.pf_ptr[:-1] + g.need_now] - cs[g.pf_ptr[:-1]]
    after = np.repeat(g.pf_after, size[g.pf_unit]) if g.waits_for_values() else None
    return Groups(ev_ptr, ev, pf_ptr, pf, need_now.astype(I64), g.wait_prev, g.blocking, g.thrash, g.need_group,
                  gate=g.gate, gate_bytes=g.gate_bytes, pf_after=after)
