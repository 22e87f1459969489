"""A `PlanSchedule` per callback, in this run's addresses: what the GPU runner issues at each launch.

The simulator's `runner` (policies/runner.py) carries a plan out from a `PlanSchedule`; the GPU
engine (gpu/cuda_engine.py) carries out the same schedule. `PlannedCalls` lays it out once, at
start, by the callback that issues each part of it, so that the per-launch work is a lookup, the
ranges moved into this run's addresses by their allocations' deltas (the trace's allocations as a
`Relocator` learns them from the launches' pointer arguments), and the calls:

- launch l's group is issued at the callback `PlanSchedule.issued_at(l)` (the launch before, or
  its own where its evictions wait for the launch before to end);
- a range whose pages index values chose (`after` = a) goes no earlier than the callback of launch
  a + 1 (the first at which launch a's end can be waited for), the copy stream waiting for the work
  queued before that callback: nothing is prefetched before its values exist;
- a range whose allocation's address in this run is not known yet at its callback (its first
  pointer argument is the launch's own) waits for the launch's own callback; one still unknown
  there is left to faults (`unmapped_bytes`);
- each part ends with an event: the launch's own ranges' (`OWN`), on which the launch's stream
  waits, and the whole group's (`GROUP`), which covers the early ranges of later launches (the
  copy stream is in order: a launch's own event comes after every earlier group's).

`schedule_from_plan` makes the schedule from a plan's two tables, its rows (plan.parquet) and its
lookahead per launch (launches.parquet: `wait_prev`, `waits_for`, `gate_bytes` as the planner
derived them), with the trace's allocation boundaries as its cuts. It is the one construction: the
GPU runner's child calls it on the plan file it is given (`pagecast plan`, or the plan the replay
makes at start), the simulator's `runner` on the same two tables made from its planner's plan
(plan/plan_rows.py, what `pagecast plan` writes). A plan written without its lookahead gets it
derived here, from its rows and the trace: `waits_for` from the rows' `needed_by` (a merged row
names its first need only), `wait_prev` where a launch's evictions overlap the trace's footprint of
the launch before, no index-value bytes.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from pagecast import trace as T

from .plan_schedule import PlanSchedule
from .relocate import Relocator

I64 = np.int64
EVICT, OWN, EARLY = 0, 1, 2   # a part's kind: evictions, the launch's own prefetches, later launches'


@dataclass(frozen=True, slots=True)
class Part:
    """Ranges of launch `launch`'s group issued at one callback: trace allocation, offset, bytes."""

    launch: int
    kind: int
    gated: bool        # issued after the work queued before the callback (index values, wait_prev)
    alloc: tuple       # trace allocation per range
    off: tuple         # offset in it
    nbytes: tuple


class PlannedCalls:
    """`schedule` per callback (the module doc), relocated by `relocator` (laid out, the trace's);
    `dead`: lookahead.dead_of's (indptr per launch, trace allocation ids) or None."""

    def __init__(self, schedule: PlanSchedule, relocator: Relocator, dead: tuple | None = None) -> None:
        self.schedule = schedule
        self.rel = relocator.layout()
        self.dead = dead
        self.n = schedule.n
        self.unmapped_bytes = 0
        n = self.n
        ev_j, ev_o = self._allocs(schedule.ev, np.repeat(np.arange(n, dtype=I64), np.diff(schedule.ev_ptr)))
        pf_j, pf_o = self._allocs(schedule.pf, schedule.pf_needed_by)
        at: list[list[Part]] = [[] for _ in range(n)]
        ev_ptr, pf_ptr = schedule.ev_ptr.tolist(), schedule.pf_ptr.tolist()
        ev_n, pf_n = schedule.ev[:, 1].tolist(), schedule.pf[:, 1].tolist()
        after, own = schedule.pf_after.tolist(), schedule.own.tolist()
        wait_prev = schedule.wait_prev.tolist()
        for lid in range(n):
            c0 = schedule.issued_at(lid)
            e0, e1 = ev_ptr[lid], ev_ptr[lid + 1]
            if e1 > e0:
                at[c0].append(Part(lid, EVICT, bool(wait_prev[lid]), tuple(ev_j[e0:e1]), tuple(ev_o[e0:e1]),
                                   tuple(ev_n[e0:e1])))
            p0, p1 = pf_ptr[lid], pf_ptr[lid + 1]
            if p1 == p0:
                continue
            by: dict[tuple[int, int, bool], list[int]] = {}   # (callback, kind, gated) -> rows, in order
            for i in range(p0, p1):
                kind = OWN if i - p0 < own[lid] else EARLY
                a = after[i]
                c = max(c0, a + 1) if a >= 0 else c0
                by.setdefault((c, kind, a >= 0), []).append(i)
            for (c, kind, gated), rows in sorted(by.items()):
                at[c].append(Part(lid, kind, gated, tuple(pf_j[i] for i in rows), tuple(pf_o[i] for i in rows),
                                  tuple(pf_n[i] for i in rows)))
        for parts in at:   # per callback: the launches in order, evictions first (their own stream)
            parts.sort(key=lambda p: (p.kind != EVICT, p.launch, p.kind, p.gated))
        self.at = at

    def _allocs(self, rng: np.ndarray, lid: np.ndarray) -> tuple[list[int], list[int]]:
        """Each range's trace allocation (live at launch `lid`, the range's evicting or needing
        launch; -1: none) and offset in it."""
        rel = self.rel
        if not len(rng):
            return [], []
        addr = rng[:, 0]
        lid = np.asarray(lid, I64)
        pos = np.searchsorted(rel.sorted_addr, addr, side="right") - 1
        j = rel.order[np.maximum(pos, 0)] if len(rel.order) else np.zeros(len(addr), I64)
        ok = (pos >= 0) & (addr >= rel.a_addr[j]) & (addr + rng[:, 1] <= rel.a_addr[j] + rel.a_bytes[j]) \
            & (rel.a_first[j] <= lid) & (lid <= rel.a_last[j]) if len(rel.order) else np.zeros(len(addr), bool)
        j = np.where(ok, j, -1)
        for i in np.flatnonzero(~ok).tolist():   # an address reused by another allocation: looked up
            k = rel.find_alloc(int(addr[i]), int(lid[i]))
            j[i] = -1 if k is None else k
        off = np.where(j >= 0, addr - rel.a_addr[np.maximum(j, 0)], 0)
        return j.tolist(), off.tolist()

    def ranges(self, part: Part) -> tuple[list[tuple[int, int]], Part | None]:
        """(part's ranges in this run's addresses, the rest: those whose allocation is not known yet)."""
        delta = self.rel.delta
        out, rest = [], []
        for k, (j, o, nb) in enumerate(zip(part.alloc, part.off, part.nbytes)):
            d = delta.get(j)
            if d is None:
                rest.append(k)
            else:
                out.append((int(self.rel.a_addr[j]) + d + o, nb))
        if not rest:
            return out, None
        return out, Part(part.launch, part.kind, part.gated, tuple(part.alloc[k] for k in rest),
                         tuple(part.off[k] for k in rest), tuple(part.nbytes[k] for k in rest))

    def dead_at(self, t: int) -> list[tuple[int, int]]:
        """This run's ranges of the trace allocations whose data is dead at launch t's callback."""
        if self.dead is None or t + 1 >= len(self.dead[0]):
            return []
        ptr, ids = self.dead
        out = []
        for j in ids[ptr[t]:ptr[t + 1]].tolist():
            r = self.rel.run_range(j)
            if r is not None:
                out.append(r)
        return out


def schedule_from_plan(table, launches, trace, relocator: Relocator | None = None) -> PlanSchedule:
    """A plan's rows (plan_io's SCHEMA, sorted by launch and order) and lookahead per launch
    (plan_io's LAUNCH_SCHEMA; None: a plan without it, derived from the rows and the trace, with
    `relocator`'s footprints of it when given) as a `PlanSchedule` for `trace` (the module doc)."""
    n = trace.n_launches
    lid = np.asarray(table.column("launch_id").to_numpy(), I64)
    ev = np.asarray(table.column("action").to_numpy(zero_copy_only=False) == "evict", bool)
    addr = np.asarray(table.column("address").to_numpy(), np.uint64).astype(I64)
    nb = np.asarray(table.column("bytes").to_numpy(), I64)
    need = np.asarray(table.column("needed_by").to_numpy(), I64)
    after = np.asarray(table.column("after_launch").to_numpy(), I64)
    if launches is not None:
        at = np.asarray(launches.column("launch_id").to_numpy(), I64)
        wait_prev = np.zeros(n, bool)
        wait_prev[at] = launches.column("wait_prev").to_numpy(zero_copy_only=False)
        waits_for = np.full(n, -1, I64)
        waits_for[at] = launches.column("waits_for").to_numpy()
        gate_bytes = np.zeros(n, I64)
        gate_bytes[at] = launches.column("gate_bytes").to_numpy()
    else:
        wait_prev, waits_for = _derived(n, lid, ev, addr, nb, need, relocator or Relocator(trace))
        gate_bytes = None
    al = trace.allocations
    a = np.asarray(al.column(T.ADDRESS).to_numpy(), np.uint64).astype(I64) if al.num_rows else np.zeros(0, I64)
    b = a + np.asarray(al.column(T.BYTES).to_numpy(), I64) if al.num_rows else a
    cuts = np.unique(np.concatenate([a, b])) if len(a) else None
    return PlanSchedule(n, lid, ev, addr, nb, need, after, wait_prev=wait_prev, waits_for=waits_for,
                        gate_bytes=gate_bytes, cuts=cuts)


def _derived(n, lid, ev, addr, nb, need, relocator: Relocator) -> tuple[np.ndarray, np.ndarray]:
    """(wait_prev, waits_for) of a plan without its lookahead, from its rows and the trace."""
    # the latest earlier group holding a range each launch needs
    waits_for = np.full(n, -1, I64)
    early = ~ev & (need > lid) & (need < n)
    np.maximum.at(waits_for, need[early], lid[early])
    # evictions that take units the launch before uses wait for it to end
    wait_prev = np.zeros(n, bool)
    ind = np.asarray(relocator.fp_indptr, I64)
    st, en = np.asarray(relocator.fp_start, I64), np.asarray(relocator.fp_end, I64)
    for i in np.flatnonzero(ev & (lid > 0)).tolist():
        lo, hi = int(ind[lid[i] - 1]), int(ind[lid[i]])
        if hi <= lo or wait_prev[lid[i]]:
            continue
        k = bisect.bisect_right(st[lo:hi].tolist(), int(addr[i] + nb[i]) - 1) if hi - lo < 64 else \
            int(np.searchsorted(st[lo:hi], addr[i] + nb[i] - 1, side="right"))
        if k and int(en[lo:hi][:k].max()) > int(addr[i]):
            wait_prev[lid[i]] = True
    return wait_prev, waits_for
