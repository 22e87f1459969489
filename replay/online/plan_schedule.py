"""A plan carried out ahead of the kernels: its transfers per launch, laid out once at start.

A planned run (`pagecast plan`'s plan.parquet, or the plan a replay makes at start from the model
and the trace: template's) already says, launch by launch, which byte ranges go to the host and
which come to the GPU, in need order. `PlanSchedule` lays those rows out in arrays once, so that the
per-launch work of a runner is a lookup (`at`) and the calls; the GPU runner and the simulator's
`runner` policy (replay/policies/runner.py) read the same object, made by one function
(online/planned.schedule_from_plan) from a plan's rows and its lookahead per launch (`wait_prev`,
`waits_for`, `gate_bytes` as the planner derived them: docs/plan-format.md).

Per launch l (`PlannedLaunch`):
- issued at the callback of launch l - 1 (`ISSUE_AHEAD` launches before it: the copies run while
  the kernel before runs), on the runner's copy stream, in the plan's order: evictions, then
  prefetches in need order. The plan's early prefetches (units for later launches in earlier
  groups) go further ahead: the depth is the plan's, chosen by its trial runs;
- `wait_prev`: the evictions take units launch l - 1 uses, so the copy stream waits for its end
  first (an event recorded after l - 1 is launched: such a group is issued at l's own callback,
  `issued_at`, which costs it nothing, as it could not start before l - 1 ends); otherwise nothing
  of the copy stream waits for a kernel;
- `own`: the first `own` prefetch ranges are l's own; l's stream waits on an event recorded after
  them and on the event of `waits_for` (the latest earlier launch whose group holds a range l
  needs), never on the whole copy stream;
- `after`: per prefetch range, the launch whose index values chose its pages (-1: none). Such a range
  is issued once that launch has ended and the values are read (`gate_bytes` of them copied to the
  host): nothing is prefetched before its values exist;
- ranges are cut at allocation boundaries (`cuts`: the driver takes one allocation per range), and
  `calls` counts the ranges each launch's group issues (the per-call cost).

Evictions go as the plan has them (its victims by next use in the plan's needs); data the plan knows
is dead is not told apart from data it brings back later here (both are evictions in a plan's rows).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

I64 = np.int64
ISSUE_AHEAD = 1   # a launch's group is issued at the callback of the launch before it


@dataclass(frozen=True, slots=True)
class PlannedLaunch:
    """What a runner issues for one launch (views into the schedule's arrays)."""

    evict: np.ndarray       # (n, 2) address, bytes: to the host first
    prefetch: np.ndarray    # (m, 2) address, bytes: to the GPU, in need order
    after: np.ndarray       # (m,) per prefetch range: the launch whose index values it waits for (-1)
    own: int                # the first `own` prefetch ranges are the launch's own
    wait_prev: bool         # the evictions wait for the launch before to end
    waits_for: int          # the latest earlier launch whose group holds a range this one needs (-1)
    gate_bytes: int         # index values copied to the host before the gated ranges

    @property
    def calls(self) -> int:
        return len(self.evict) + len(self.prefetch)


class PlanSchedule:
    """A plan's rows per launch, in arrays (CSR by launch): see the module doc."""

    def __init__(self, n_launches: int, launch, is_evict, address, nbytes, needed_by, after=None, *,
                 wait_prev=None, waits_for=None, gate_bytes=None, cuts=None) -> None:
        """The plan's rows in issue order within each launch (plan.parquet's columns: launch_id,
        action == evict, address, bytes, needed_by, after_launch). `wait_prev`, `waits_for`,
        `gate_bytes`: per launch, as the planner derived them (default: none, none, zero);
        `cuts`: sorted byte addresses where allocations begin or end (ranges are cut there)."""
        n = int(n_launches)
        launch = np.asarray(launch, I64)
        is_evict = np.asarray(is_evict, bool)
        addr = np.asarray(address, I64)
        nb = np.asarray(nbytes, I64)
        need = np.asarray(needed_by, I64)
        aft = np.full(len(launch), -1, I64) if after is None else np.asarray(after, I64)
        if len(launch) and (launch.min() < 0 or launch.max() >= n):
            raise ValueError(f"plan rows name launches outside 0..{n - 1}")
        if cuts is not None and len(cuts) and len(addr):
            launch, is_evict, addr, nb, need, aft = _cut(np.asarray(cuts, I64), launch, is_evict, addr, nb, need, aft)
        self.n = n
        order = np.lexsort((~is_evict, launch))   # stable: the plan's order within each kind
        launch, is_evict, addr, nb, need, aft = (x[order] for x in (launch, is_evict, addr, nb, need, aft))
        ev, pf = is_evict, ~is_evict
        self.ev_ptr = _ptr(launch[ev], n)
        self.ev = np.stack([addr[ev], nb[ev]], axis=1) if ev.any() else np.zeros((0, 2), I64)
        self.pf_ptr = _ptr(launch[pf], n)
        self.pf = np.stack([addr[pf], nb[pf]], axis=1) if pf.any() else np.zeros((0, 2), I64)
        self.pf_after = aft[pf]
        self.pf_needed_by = need[pf]
        # own: a launch's ranges it needs itself come first in need order (the planner lists them so)
        self.own = np.bincount(launch[pf][need[pf] == launch[pf]], minlength=n).astype(I64)
        self.wait_prev = np.zeros(n, bool) if wait_prev is None else np.asarray(wait_prev, bool)
        self.waits_for = np.full(n, -1, I64) if waits_for is None else np.asarray(waits_for, I64)
        self.gate_bytes = np.zeros(n, I64) if gate_bytes is None else np.asarray(gate_bytes, I64)
        self.calls = np.diff(self.ev_ptr) + np.diff(self.pf_ptr)

    def at(self, t: int) -> PlannedLaunch:
        """Launch t's transfers: a lookup (issued at the callback of launch t - ISSUE_AHEAD)."""
        e0, e1, p0, p1 = self.ev_ptr[t], self.ev_ptr[t + 1], self.pf_ptr[t], self.pf_ptr[t + 1]
        return PlannedLaunch(self.ev[e0:e1], self.pf[p0:p1], self.pf_after[p0:p1], int(self.own[t]),
                             bool(self.wait_prev[t]), int(self.waits_for[t]), int(self.gate_bytes[t]))

    def issued_at(self, t: int) -> int:
        """The launch at whose callback launch t's group is issued: ISSUE_AHEAD before it, or its
        own where it waits for the launch before to end (that launch's event exists only then)."""
        return t if self.wait_prev[t] else max(t - ISSUE_AHEAD, 0)


def _ptr(launch: np.ndarray, n: int) -> np.ndarray:
    ptr = np.zeros(n + 1, I64)
    np.cumsum(np.bincount(launch, minlength=n), out=ptr[1:])
    return ptr


def _cut(cuts, launch, is_evict, addr, nb, need, aft):
    """Each row cut at the `cuts` strictly inside it (one range per allocation), order kept."""
    end = addr + nb
    lo = np.searchsorted(cuts, addr, side="right")
    hi = np.searchsorted(cuts, end, side="left")
    inner = np.maximum(hi - lo, 0)
    if not inner.any():
        return launch, is_evict, addr, nb, need, aft
    reps = inner + 1
    row = np.repeat(np.arange(len(addr)), reps)
    k = np.arange(len(row)) - np.repeat(np.cumsum(reps) - reps, reps)   # piece index within its row
    start = np.where(k == 0, addr[row], cuts[np.minimum(lo[row] + k - 1, len(cuts) - 1)])
    stop = np.where(k == inner[row], end[row], cuts[np.minimum(lo[row] + k, len(cuts) - 1)])
    return launch[row], is_evict[row], start, stop - start, need[row], aft[row]
