"""One simulated run: a policy at one capacity over a workload's timeline.

`run_policy(w, policy, cap_units, profile, options)` asks the policy for its
plan (`prefetch`), then runs the steps in numba (kernels.run_engine),
returning to Python only for the per-launch hooks a policy asks for, and
charges time (timing.py). `new_context` is the `Context` a policy sees, with
the simulator's run filled in for the planner's trial runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numba import njit

from pagecast.errors import UsageError
from pagecast.uvm import FAULT_BATCH, PAGE

from ..plan.groups import Groups
from ..policies.base import Context, Options, Policy
from ..unit_space import I64, UNIT_ID, Needs, Workload, unit_width
from . import kernels as C
from .uvm_driver import DriverRules, chunk_weights
from .timing import run_timing

class Memory:
    """The GPU's residency state for one run (numpy arrays, mutated by kernels.py)."""

    def __init__(self, w: Workload, cap_units: int):
        u = w.universe
        self.cap = int(cap_units)
        self.resident = np.zeros(u.n_units, np.uint8)
        self.planned = np.zeros(u.n_units, np.uint8)
        self.chunk_count = np.zeros(u.n_chunks, I64)
        self.prev = np.full(u.n_chunks + 1, -1, I64)
        self.nxt = np.full(u.n_chunks + 1, -1, I64)
        self.prev[u.n_chunks] = u.n_chunks
        self.nxt[u.n_chunks] = u.n_chunks
        self.st = np.zeros(3, I64)       # units of capacity taken (populated chunks); head and tail of uq
        self.uq = np.zeros(max(u.n_units, 1), I64)   # units brought in by faults, oldest first (a ring)
        self.src_group = np.full(u.n_units, -1, I64)   # the planned group that brought each unit in (-1: none)
        self.src_pos = np.zeros(u.n_units, I64)

    def state(self) -> C.Mem:
        """The arrays as the kernels take them (the same arrays: kernels mutate them in place)."""
        return C.Mem(self.cap, self.st, self.resident, self.planned, self.chunk_count, self.prev, self.nxt, self.uq,
                     self.src_group, self.src_pos)


def space_of(w: Workload, cap_units: int) -> C.Space:
    """The universe's geometry as the kernels take it, its chunks weighed for a run at `cap_units`."""
    u = w.universe
    return C.Space(u.unit_chunk, u.chunk_lo, u.chunk_hi, u.key, u.block_lo, u.block_hi, int(u.upb),
                   chunk_weights(u.chunk_weight, cap_units))


@dataclass
class RunResult:
    policy: str
    cap_units: int
    counters: np.ndarray       # n_steps x N_COUNTERS
    start: np.ndarray
    end: np.ndarray
    stall: np.ndarray
    compute: np.ndarray
    extra: dict = field(default_factory=dict)


def compact(r: RunResult) -> RunResult:
    """`r` as much as `summarize` and a policy that runs last (its rivals' runs) read of it: the
    counters summed over the launches, the last launch's end, the stall and compute summed. What a
    replay that writes no timeline keeps of each run once it has finished (the per-launch arrays,
    15 numbers a launch, let go: 9 runs of 10^6 launches held 1.1 GB of them). The summary of the
    compact run is the run's own, number for number."""
    if len(r.counters) <= 1:
        return r
    return RunResult(r.policy, r.cap_units, r.counters.sum(axis=0, keepdims=True), r.start[:1].copy(),
                     r.end[-1:].copy(), np.array([r.stall.sum()]), np.array([r.compute.sum()]), r.extra)


def step_compute(w: Workload) -> np.ndarray:
    comp = [t.compute_s for t in w.tasks]
    out = np.empty(w.n_steps)
    for t, c in enumerate(comp):
        m = w.step_task == t
        out[m] = c[w.step_launch[m]]
    return out


def new_context(w: Workload, cap_units: int, options: Options, profile, memory: Memory | None = None) -> Context:
    """What a policy sees of a run, with `simulate` (the planner's trial runs) set to run_policy."""
    return Context(w, cap_units, options, memory=memory, profile=profile, simulate=run_policy)


def run_policy(w: Workload, policy: Policy, cap_units: int, profile, options: Options) -> RunResult:
    """Simulate one policy at one capacity (in units)."""
    if cap_units < 1:
        raise UsageError(f"capacity is smaller than one migration unit ({w.gran} bytes)")
    ctx = new_context(w, cap_units, options, profile)
    mem = Memory(w, cap_units)
    ctx.memory = mem
    groups = policy.prefetch(ctx)
    n = w.n_steps
    on_launch, on_evict = bool(policy.wants_launches), bool(policy.wants_evictions)
    done = ctx.state.pop("trial_run", None)
    if done is not None and not (policy.wants_misses or on_launch or on_evict):
        # the planner's winning trial ran this very plan on these very needs (oracle)
        return RunResult(policy.name, cap_units, done.counters, done.start, done.end, done.stall, done.compute,
                         _run_extra(ctx))
    # a policy moving units online is tracked as a planned one (faults evict what it did not bring first)
    has_plan = groups is not None or on_launch
    if groups is None:
        groups = Groups.empty(n)
    elif on_launch:
        groups.wait_prev = groups.wait_prev.copy()   # on_launch may mark steps: not in the policy's own plan
        groups.gate, groups.gate_bytes = groups.gate.copy(), groups.gate_bytes.copy()
    counters = np.zeros((n, C.N_COUNTERS), I64)
    u = w.universe
    rules_d = driver_rules(policy, profile, options)
    tree = rules_d.prefetch and u.upb > 1
    sp, m = space_of(w, cap_units), mem.state()
    maxstep = int(w.truth.sizes().max()) if n else 0
    missed = np.zeros(max(maxstep, 1), I64)
    s = 0
    stop = bool(policy.wants_misses)
    pages = fault_entries(w)
    nu_for = None
    next_use = np.zeros(1, I64)
    while s < n:
        pn = ctx.state.get("plan_needs")
        if pn is not None and pn is not nu_for:
            # read only by launches larger than memory (Belady within the launch)
            next_use = _next_use_cached(w, pn) if maxstep > cap_units else np.zeros(1, I64)
            nu_for = pn
        s0 = s
        before = mem.resident.copy() if on_evict else None
        rules = C.Rules(rules_d.victim_code, tree, float(profile.prefetch_threshold), has_plan, nu_for is not None,
                        stop, int(rules_d.faults_per_batch))
        truth = C.Steps(w.truth.ptr, w.truth.unit, next_use, pages)
        if on_launch:
            mv = policy.on_launch(ctx, s0)
            if mv is not None:
                if _apply_now(mv, truth, sp, m, rules, u.n_units, counters, s0,
                              w.truth.of(s0 - 1) if s0 > 0 else None):
                    groups.wait_prev[s0] = 1
                if len(mv) > 3 and mv[3] is not None and 0 <= mv[3][0] < s0:
                    # the group's index values: read once their writer (step) has ended, a copy of bytes
                    groups.gate[s0], groups.gate_bytes[s0] = int(mv[3][0]), int(mv[3][1])
        plan = C.PlanArrays(groups.ev_ptr, groups.ev_unit, groups.pf_ptr, groups.pf_unit, groups.need_now, 0)
        # `what` passed, as _apply_now does: an omitted default is its own numba signature (one more
        # compile of the engine for each set of array widths)
        s, nm = C.run_engine(s, s + 1 if (on_launch or on_evict) else n, truth, plan, sp, m, rules, missed, counters,
                             C.GROUP | C.LAUNCH)
        if on_evict:
            gone = np.flatnonzero((before == 1) & (mem.resident == 0))
            if len(gone):
                policy.on_evict(ctx, s0, gone)
        if stop and nm > 0 and s < n:
            new = policy.on_miss(ctx, s - 1, missed[:nm])
            if new is not None:
                groups = groups.splice(new, s)
    comp = step_compute(w)
    start, end, stall = run_timing(counters, comp, w.gran, groups, profile)
    return RunResult(policy.name, cap_units, counters, start, end, stall, comp, _run_extra(ctx))


def fault_entries(w: Workload) -> np.ndarray:
    """Per occurrence of the launches' units, the faults it makes when missing: the pages the launch
    touches in it (Needs.pages), or all of the unit's pages where the needs do not say (a plan's)."""
    if w.truth.pages is not None and len(w.truth.pages) == len(w.truth.unit):
        return w.truth.pages   # read only, either width (unit_space.narrow): no copy of every use per run
    ps = w.tasks[0].trace.page_size if w.tasks else PAGE
    per_unit = max(w.gran // ps, 1)
    # int16 where it fits, as Needs.pages are (unit_space.narrow_small): one engine compile for both
    return np.full(len(w.truth.unit), per_unit, UNIT_ID if per_unit < np.iinfo(UNIT_ID).max else I64)


def driver_rules(policy: Policy, profile, options: Options) -> DriverRules:
    """The fault path's rules for a run: the policy's victim order if it has one, else the run's."""
    return DriverRules(policy.evict_order or options.eviction, bool(options.driver_prefetch),
                       int(profile.faults_per_batch))


def _run_extra(ctx: Context) -> dict:
    """What a run reports beside its counters: feedback changes, the plan's span and what it left to
    faults, and for oracle which member of its family won (policies/oracle.py)."""
    return {k: v for k, v in ctx.state.items() if k in ("feedback_changes", "plan_span", "plan_faulted", "oracle_plan",
                                                        "oracle_own_s", "plan_trial_s", "host_bytes")}


def _apply_now(mv, truth: C.Steps, sp: C.Space, m: C.Mem, rules: C.Rules, n_units: int, counters: np.ndarray,
               step: int, prev_units) -> bool:
    """An on_launch hook's (evict, prefetch[, wait]) units, carried out as a planned group of
    `step`. Returns whether the group waits for the launch before to end: `wait` if given and
    true, and in any case when the group took from memory a unit that launch touches -- named
    in `evict`, or evicted by a prefetch that found memory full (a transfer cannot overlap the
    launch whose pages it moves out; charged as overlapping, an online policy that left its
    evictions to its prefetches ran ahead of the launch before it)."""
    ev, pf = (np.asarray(x, I64).ravel() for x in mv[:2])
    bad = [x for x in (ev, pf) if len(x) and (x.min() < 0 or x.max() >= n_units)]
    if bad:
        raise ValueError(f"on_launch named units outside 0..{n_units - 1}")
    # in the universe's width (every id checked above fits it), as a planned policy's groups and the
    # trace's own ids are: the engine is not compiled once more for int64 groups
    ev, pf = (x.astype(unit_width(n_units), copy=False) for x in (ev, pf))
    need = len(pf) if len(mv) < 5 or mv[4] is None else min(int(mv[4]), len(pf))   # the launch's own: the first
    one = C.PlanArrays(np.array([0, len(ev)], I64), ev, np.array([0, len(pf)], I64), pf, np.array([need], I64),
                       step)   # one group, for this step
    held = None if prev_units is None else m.resident[prev_units] == 1   # the launch before's units held now
    C.run_engine(step, step + 1, truth, one, sp, m, rules, np.zeros(1, I64), counters, C.GROUP)
    took = held is not None and bool((held & (m.resident[prev_units] == 0)).any())
    return took or (len(mv) > 2 and bool(mv[2]))


RUN_ONLY = "next_use"   # the key of w.extra that a replay drops after each run (_next_use_cached)


def _next_use_cached(w: Workload, needs: Needs) -> np.ndarray:
    """next_use_of(w.truth, needs), kept in w.extra for the last few needs (the planner's trial
    runs of one span's plans share them; the needs are held, so their ids stay theirs)."""
    cache = w.extra.setdefault(RUN_ONLY, [])
    for truth, nd, nu in cache:
        if truth is w.truth and nd is needs:
            return nu
    nu = next_use_of(w.truth, needs)
    cache.append((w.truth, needs, nu))
    del cache[:-4]
    return nu


def next_use_of(truth: Needs, needs: Needs) -> np.ndarray:
    """For each occurrence of `truth` (unit u at step s): the first step after s
    at which `needs` holds u (the number of steps when none). What a planned
    policy knows of a unit's next use, for Belady within a launch larger than
    memory. One backward pass over the steps (numba)."""
    n_units = int(max(truth.unit.max(initial=-1), needs.unit.max(initial=-1))) + 1
    return _next_use(truth.ptr, truth.unit, needs.ptr, needs.unit, n_units)


@njit(cache=True)
def _next_use(t_ptr, t_unit, n_ptr, n_unit, n_units):
    n = len(t_ptr) - 1
    nxt = np.full(n_units, n, np.int64)   # first step > s whose needs hold the unit
    out = np.empty(len(t_unit), np.int64)
    for s in range(n - 1, -1, -1):
        for k in range(t_ptr[s], t_ptr[s + 1]):
            out[k] = nxt[t_unit[k]]
        for k in range(n_ptr[s], n_ptr[s + 1]):
            nxt[n_unit[k]] = s
    return out


def summarize(r: RunResult, w: Workload, batch: int = FAULT_BATCH) -> dict[str, Any]:
    c = r.counters.sum(axis=0) if len(r.counters) else np.zeros(C.N_COUNTERS, I64)
    gran = w.gran
    sizes = w.truth.sizes()
    return {
        "time_s": float(r.end[-1]) if len(r.end) else 0.0,
        "stall_s": float(r.stall.sum()),
        "compute_s": float(r.compute.sum()),
        "faults": int(c[C.C_FAULTS]),
        "htod_bytes": int((c[C.C_FAULT_IN] + c[C.C_TREE_IN] + c[C.C_PREFETCH_IN]) * gran),
        "dtoh_bytes": int((c[C.C_FAULT_DTOH] + c[C.C_GROUP_DTOH]) * gran),
        "prefetch_bytes": int(c[C.C_PREFETCH_IN] * gran),
        "fault_batches": int(c[C.C_BATCHES]),
        "blocks_serviced": int(c[C.C_BLOCKS]),
        "thrashing_launches": int((sizes > r.cap_units).sum()),
        "launches": int(w.n_steps),
    }
