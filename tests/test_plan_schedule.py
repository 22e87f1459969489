"""online/plan_schedule.py: a plan's rows laid out per launch, as the runner issues them."""

from __future__ import annotations

import numpy as np
import pytest

from pagecast.replay.online.plan_schedule import PlanSchedule

MB = 1 << 20


def test_rows_per_launch_evictions_first_own_ranges_counted_and_cut_at_allocations():
    # launch 1: an eviction, its own range (crossing the allocation boundary at 4 MiB), an early one for 2;
    # launch 2: a range its index values chose (written by launch 0)
    sched = PlanSchedule(3, launch=[1, 1, 1, 2], is_evict=[False, True, False, False],
                         address=[3 * MB, 10 * MB, 6 * MB, 8 * MB], nbytes=[2 * MB, MB, MB, MB],
                         needed_by=[1, -1, 2, 2], after=[-1, -1, -1, 0],
                         wait_prev=[0, 1, 0], waits_for=[-1, -1, 1], gate_bytes=[0, 0, 64],
                         cuts=[0, 4 * MB, 12 * MB])
    assert sched.at(0).calls == 0
    one = sched.at(1)
    assert one.evict.tolist() == [[10 * MB, MB]]
    assert one.prefetch.tolist() == [[3 * MB, MB], [4 * MB, MB], [6 * MB, MB]]   # cut at 4 MiB, order kept
    assert one.own == 2 and one.wait_prev and one.calls == 4
    two = sched.at(2)
    assert two.after.tolist() == [0] and two.waits_for == 1 and two.gate_bytes == 64 and two.own == 1
    assert sched.issued_at(2) == 1 and sched.issued_at(0) == 0
    assert sched.issued_at(1) == 1   # its evictions wait for launch 0's end: issued at its own callback
    assert sched.calls.tolist() == [0, 4, 1]


def test_rows_outside_the_launches_are_refused():
    with pytest.raises(ValueError, match="outside"):
        PlanSchedule(2, launch=[2], is_evict=[False], address=[0], nbytes=[MB], needed_by=[2])
    empty = PlanSchedule(2, launch=np.zeros(0), is_evict=np.zeros(0), address=np.zeros(0), nbytes=np.zeros(0),
                         needed_by=np.zeros(0))
    assert empty.at(1).calls == 0 and empty.calls.tolist() == [0, 0]
