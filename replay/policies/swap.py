"""Policy `swap`: whole-process swapping, the incoming task's allocations moved in bulk at every switch."""

from __future__ import annotations

import numpy as np

from ..plan.groups import Groups
from ..unit_space import I64, narrow
from .base import Policy


class Swap(Policy):
    name = "swap"
    description = "whole-process swapping: at every task switch the incoming task's allocations move in bulk"

    def prefetch(self, ctx):
        w = ctx.w
        n = w.n_steps
        sets = []
        for t, task in enumerate(w.tasks):
            lo, hi = w.universe.task_lo[t], w.universe.task_lo[t + 1]
            sets.append(np.arange(lo, hi, dtype=I64)[:ctx.cap_units])
        switch = np.ones(n, bool)
        switch[1:] = w.step_task[1:] != w.step_task[:-1]
        sizes = np.zeros(n, I64)
        sw = np.flatnonzero(switch)
        sizes[sw] = [len(sets[t]) for t in w.step_task[sw]]
        pf_ptr = np.zeros(n + 1, I64)
        np.cumsum(sizes, out=pf_ptr[1:])
        pf = np.concatenate([sets[t] for t in w.step_task[sw]]) if len(sw) else np.zeros(0, I64)
        g = Groups.empty(n)
        # in the width Groups gives its transfers (set after it is made, so narrowed here): the engine
        # then runs swap's plan in a compile it has for other plans
        g.pf_ptr, g.pf_unit = pf_ptr, narrow(pf)
        g.need_now = sizes.copy()
        g.blocking = switch.astype(np.uint8)
        return g
