"""What each launch callback of a planned run has to do: the calls it issues and whether it waits.

The GPU engine (gpu/cuda_engine.py, "Planned runs") carries a `PlanSchedule` out at the launches'
callbacks; the simulator's `runner` (policies/runner.py) charges each callback the host time the
engine spends there. Both read the rule here, laid out once per schedule:

- `calls`: the ranges issued at each callback (launch l's group at `PlanSchedule.issued_at(l)`, a
  range gated on index values of launch a no earlier than a + 1: online/planned.py's rule);
- `waits`: whether the launch's stream must wait on an event at its callback. A launch with own
  ranges waits on their event; one that needs an earlier group (`waits_for`) on that group's. The
  copy stream is in order, so a stream that already waited on an event recorded later on it needs
  no other wait: the engine tracks that exactly (the order in which it recorded its events, per
  stream); here the streams are one (a trace's launches replayed in order) and an event's place on
  the copy stream is (the callback that recorded it, its launch);
- `quiet`: nothing is issued and nothing waited on: such a callback only counts the launch (the
  engine's quiet path); `light`: nothing issued, one wait (the engine's light path: the wait alone).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .plan_schedule import PlanSchedule

I64 = np.int64


@dataclass(frozen=True, slots=True)
class CallbackWork:
    """Per launch callback (index = the launch whose API enter it runs at)."""

    calls: np.ndarray     # ranges issued at the callback (evictions and prefetches)
    own: np.ndarray       # bool: the launch has ranges of its own (its stream waits on their event)
    waits: np.ndarray     # bool: the launch's stream waits on an event (one stream, launches in order)

    @property
    def quiet(self) -> np.ndarray:
        """Callbacks that issue nothing and wait on nothing."""
        return (self.calls == 0) & ~self.waits

    @property
    def light(self) -> np.ndarray:
        """Callbacks that issue nothing but make the launch's stream wait."""
        return (self.calls == 0) & self.waits


def issue_callbacks(schedule: PlanSchedule) -> tuple[np.ndarray, np.ndarray]:
    """(the callback each eviction range is issued at, the callback each prefetch range is)."""
    n = schedule.n
    lid = np.arange(n, dtype=I64)
    c0 = np.where(schedule.wait_prev, lid, np.maximum(lid - 1, 0))   # PlanSchedule.issued_at, in arrays
    ev_c = np.repeat(c0, np.diff(schedule.ev_ptr))
    pf_c = np.repeat(c0, np.diff(schedule.pf_ptr))
    after = np.asarray(schedule.pf_after, I64)
    if len(after) == len(pf_c) and len(after):
        pf_c = np.where(after >= 0, np.maximum(pf_c, after + 1), pf_c)
    return np.minimum(ev_c, n - 1), np.minimum(pf_c, n - 1)


def callback_work(schedule: PlanSchedule) -> CallbackWork:
    """The module doc's `calls`, `own` and `waits` of each callback of `schedule`."""
    n = schedule.n
    ev_c, pf_c = issue_callbacks(schedule)
    calls = (np.bincount(ev_c, minlength=n) + np.bincount(pf_c, minlength=n)).astype(I64)[:n]
    own = np.asarray(schedule.own, I64) > 0
    # where each launch's wait event sits on the copy stream, as (callback, launch, own 0 | group 1) in
    # one key: its own ranges' event (after the last of them), else that of the group it waits for
    # (after the group's last range; within a callback a launch's own ranges go before its early ones)
    lid = np.repeat(np.arange(n, dtype=I64), np.diff(schedule.pf_ptr))
    pos = np.arange(len(lid), dtype=I64) - np.asarray(schedule.pf_ptr, I64)[lid] if len(lid) else lid
    mine = pos < np.asarray(schedule.own, I64)[lid] if len(lid) else np.zeros(0, bool)
    last_cb = np.full(n, -1, I64)
    own_cb = np.full(n, -1, I64)
    if len(pf_c):
        np.maximum.at(last_cb, lid, pf_c)
        np.maximum.at(own_cb, lid[mine], pf_c[mine])
    wf = np.asarray(schedule.waits_for, I64)
    key = np.full(n, -1, I64)
    g = np.flatnonzero((wf >= 0) & (last_cb[np.maximum(wf, 0)] >= 0))
    key[g] = (last_cb[wf[g]] * n + wf[g]) * 2 + 1
    o = np.flatnonzero(own & (own_cb >= 0))
    key[o] = (own_cb[o] * n + o) * 2
    # a launch waits where its event comes after every event the stream waited on before
    before = np.concatenate([[-1], np.maximum.accumulate(key)[:-1]]) if n else key
    waits = (key >= 0) & (key > before)
    return CallbackWork(calls, own, waits)
