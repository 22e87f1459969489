"""Policy `runner`: the GPU runner in the simulator.

`template` in the simulator plans the whole timeline ahead (Belady with lookahead on the predicted
footprints, its span and what it leaves to faults chosen by trial runs). The GPU runner (`replay
--backend gpu`, `pagecast.prefetching`) runs the workload launch by launch. This policy is that
runner, in two modes:

Given a plan (the default, `PLANNED`; template's: the replay's `--plan` file, or the plan the replay
makes at start from the model and the trace), the runner carries it out ahead of the kernels:
`online.plan_schedule.PlanSchedule` lays the plan's transfers out per launch once, at start, made
as the GPU runner makes it (`online.planned.schedule_from_plan`, from the two tables `pagecast plan`
writes of the plan: its rows and its lookahead per launch; docs/plan-format.md) (runs
of consecutive units as byte ranges, the launch's own apart from those for later launches, cut at
the trace's allocation boundaries), and each launch's group is issued at the callback of the launch
before, on the runner's copy stream: evictions as the plan has them (where they take the launch
before's units, after it ends, issued at the launch's own callback), then prefetches in need
order; the launch waits for its own ranges and the earlier group holding ranges it needs, never for
the whole copy stream. Ranges whose pages index
values chose go once the launch that wrote the values has ended and the values are copied (the
plan's gates): nothing is prefetched before its values exist. The simulator moves the units of those
ranges (the groups `prefetch` returns) and charges each range one call (`Groups.calls`: the profile's
`transfer_latency_s`), and each launch's callback its host time, as the GPU engine spends it
(online/callbacks.py's rule): a quiet one (nothing issued, nothing to wait for: the engine counts the
launch and returns) `quiet_s` (`QUIET_S`, else the profile's `host_quiet_s`, else the base), a light
one (nothing issued, the launch's stream made to wait) `wait_s` (`WAIT_S`, else the profile's
`host_wait_s`, else the base), the others
a base (the lookup, the event record, the stream wait: `callback_s`, `CALLBACK_S`, else the profile's
`host_base_s`, else its `host_launch_s`) plus a per-call cost times the calls issued there (`call_s`, `CALL_S`, else the
profile's `host_call_s`). The host runs the callbacks asynchronously to the GPU (CUDA's launches
return before their kernels run), at most `host_ahead` launches ahead (`HOST_AHEAD`; 0: no bound):
the clock (sim/timing.py) delays a kernel only where its callback had not ended by the time the GPU
could start it.

Unplanned (`planned=False`): one launch at a time. The runner predicts the launch's footprint,
prefetches what its residency estimate says is missing and, to emulate a capacity, evicts 2 MiB
units chosen by predicted next use. This policy makes those very decisions (`online.decide.LaunchDecider`
with the template policy and the runner's default fallback: the code the GPU engine runs) from the
trace's launches, with allocations looked up in the trace instead of the driver, and hands the
simulator the units of the ranges the engine would move, launch by launch (the `on_launch` hook).
The difference between `template` and this mode is what planning ahead is worth; it against a GPU
measurement is the cost model alone (scripts/gpu_validation.py).

Index values (unplanned): a launch whose indexed regions read index values (the trace's `values`
table) is predicted with them, as the runner does once the launch that wrote them has ended (it
copies them from the GPU after that launch's completion event); the simulator starts the launch's
group no earlier than the end of that writer (`pagecast.values.producers`, the launch that last
wrote the buffer as observed) plus the copy (replay/sim/timing.py).

Lookahead (unplanned, `LOOKAHEAD`): the decider reads the same schedule as the GPU runner's child
builds (online/lookahead.py: template's predictions of the trace's launches, indexed launches
skipped), so each launch's group holds the launch's own units first and then the next launch's,
issued while the kernel before it runs; the launch waits for its own only (the hook's `own`), and a
group that evicts waits for the launch before, as the engine's copy stream waits for its evictions.
Per-call and per-launch host costs are the clock's: the profile's `transfer_latency_s` per transfer
and `host_launch_s` per launch (replay/sim/timing.py).

Not replayed: the runner's fault feedback (`--feedback` on the GPU; the simulator's `--feedback`
refines the offline template only); unplanned, its host-side time per launch, including the wait for
an indexed launch's values (the GPU runner drains the launch's stream before reading them). The GPU
engine (replay/gpu/cuda_engine.py) carries out the same `PlanSchedule` given a plan file (`--plan`,
online/planned.py); without one (the plan made at start here) it decides one launch at a time.
"""

from __future__ import annotations

import numpy as np

from pagecast import values as V
from pagecast.collect.launch_hook import LaunchArgs
from pagecast.errors import UsageError

from ..online.callbacks import CallbackWork, callback_work
from ..online.decide import LaunchDecider
from ..online.lookahead import lookahead_for
from ..online.plan_schedule import PlanSchedule
from ..online.planned import schedule_from_plan
from ..online.prediction import default_fallback, make_online_predict
from ..online.ranges import Allocation, AllocationMap
from ..online.relocate import Relocator
from ..plan.groups import Groups
from ..plan.plan_rows import groups_to_table, launches_table
from ..unit_space import I64, ID, Workload, unit_width
from .base import Context, Policy
from .template import Template


# the runner's lookahead for planned runs (online/lookahead.py), as the GPU runner's child switches it
# on by default; False: one launch at a time, as before (benchmarks/runner_lookahead.py runs both)
LOOKAHEAD = True
# given a plan (template's: a plan file, or the one the replay makes from the model and the trace),
# the runner carries it out ahead of the kernels (online/plan_schedule.py); False: it decides one
# launch at a time with the lookahead above (benchmarks/runner_lookahead.py runs both)
PLANNED = True
# host seconds of the planned runner's launch callback, charged to its own runs: a base per launch
# (the lookup, event record, stream wait; None: the profile's host_launch_s, which every policy's
# run pays) plus CALL_S per call the launch issues (None: the profile's host_call_s).
# benchmarks/bench_child_callback.py fits both on the child's own path (docs/performance.md)
CALLBACK_S: float | None = None
CALL_S: float | None = None
# host seconds of a quiet callback (nothing issued or waited on; None: the profile's host_quiet_s, else
# the base), and how many launches the host may run ahead of the GPU (0: no bound; sim/timing.py)
QUIET_S: float | None = None
WAIT_S: float | None = None      # ... of a light callback (nothing issued, one wait; None: host_wait_s, else the base)
HOST_AHEAD = 0


class TraceAllocations:
    """Allocation lookups answered from a trace: the allocation live at the current launch `t`
    (looked up as the oracle's relocator does), and the allocations freed before each launch."""

    def __init__(self, relocator: Relocator) -> None:
        self.rel = relocator
        self.t = 0
        self._freed: dict[int, list[int]] = {}   # launch -> allocations freed just before it
        for a, last in zip(relocator.a_addr.tolist(), relocator.a_last.tolist()):
            self._freed.setdefault(last + 1, []).append(a)

    def allocation_of(self, addr: int):
        j = self.rel.find_alloc(int(addr), self.t)
        return None if j is None else Allocation(int(self.rel.a_addr[j]), int(self.rel.a_bytes[j]), True)

    def freed_before(self, t: int) -> list[int]:
        """Addresses of the allocations whose last launch is t - 1."""
        return self._freed.get(t, [])


class LaunchRows:
    """The trace's launches as the hook hands them over (`LaunchArgs`, by row), made
    `LAUNCH_CHUNK` rows at a time as they are read and let go when the next chunk is: the runner
    reads them in launch order, and one per launch held for the run grew with the launches."""

    def __init__(self, table) -> None:
        self.table = table
        self._at = -1
        self._chunk: list[LaunchArgs] = []

    def __len__(self) -> int:
        return self.table.num_rows

    def __getitem__(self, t: int) -> LaunchArgs:
        if not 0 <= t < self.table.num_rows:
            raise IndexError(t)
        c = t // LAUNCH_CHUNK
        if c != self._at:
            self._chunk = []   # the last chunk goes before the next is made
            rows = self.table.slice(c * LAUNCH_CHUNK, LAUNCH_CHUNK).to_pylist()
            self._chunk, self._at = [LaunchArgs.from_row(r, stream=7) for r in rows], c
        return self._chunk[t - c * LAUNCH_CHUNK]


LAUNCH_CHUNK = 4096   # launches made into LaunchArgs at a time (LaunchRows)


class Runner(Policy):
    name = "runner"
    description = ("the GPU runner in the simulator: template's plan carried out ahead of the kernels "
                   "(or, unplanned, its decisions one launch at a time)")

    requires = "model"
    follows_plan = True   # a --plan given: carried out, as template carries it out (no model needed)
    reads_arguments = True

    @classmethod
    def for_replay(cls, setup):
        return cls(setup.model, planner=setup.template)

    def __init__(self, model=None, fallback: str | None = None, policy: Policy | None = None,
                 values: bool = True, lookahead: bool | None = None, planned: bool | None = None,
                 planner: Template | None = None, callback_s: float | None = None,
                 call_s: float | None = None, quiet_s: float | None = None,
                 wait_s: float | None = None, host_ahead: int | None = None) -> None:
        """`policy`: whose per-launch decisions to replay (default: template, the runner's);
        `values`: predict indexed regions with the trace's index values (False: their fallback,
        as a runner that reads none; one launch at a time only: a plan has its own); `lookahead`: the runner's lookahead for planned runs
        (online/lookahead.py, as the GPU runner's child switches it on; False: one launch at a
        time, as the GPU runner with --no-lookahead; None: `LOOKAHEAD`); `planned`: carry out
        template's plan (online/plan_schedule.py; None: `PLANNED`), made by `planner` (the replay's
        template: from the model, or a plan file) or from `model`; only for policy template;
        `callback_s`: host seconds of its launch callback's base, charged to its runs (None:
        `CALLBACK_S`, else the profile's `host_base_s`, else its `host_launch_s`); `call_s`: host seconds each call it
        issues there adds (None: `CALL_S`, else the profile's `host_call_s`); `quiet_s`: host seconds
        of a callback with nothing due (None: `QUIET_S`, else the profile's `host_quiet_s`, else the
        base); `wait_s`: of a callback that issues nothing but the stream's wait (None: `WAIT_S`, else
        the profile's `host_wait_s`, else the base); `host_ahead`: launches the host may run ahead of
        the GPU (None: `HOST_AHEAD`; 0: no bound)."""
        self.callback_s = CALLBACK_S if callback_s is None else callback_s
        self.call_s = CALL_S if call_s is None else call_s
        self.quiet_s = QUIET_S if quiet_s is None else quiet_s
        self.wait_s = WAIT_S if wait_s is None else wait_s
        self.host_ahead = HOST_AHEAD if host_ahead is None else int(host_ahead)
        self.planned = (PLANNED if planned is None else planned) and (policy is None or isinstance(policy, Template))
        self.planner = planner if planner is not None else (Template(model) if model is not None else None)
        self.schedule: PlanSchedule | None = None
        self.lookahead = LOOKAHEAD if lookahead is None else lookahead
        self.use_values = values
        self.model = model
        self.fallback = default_fallback(False) if fallback is None else fallback   # the runner's, without feedback
        self.policy = Template() if policy is None else policy
        self.to_gpu: list[tuple[int, int]] = []    # the ranges of the last launch, as the engine would move them
        self.to_host: list[tuple[int, int]] = []
        self.ahead: list[tuple[int, int]] = []     # ... and the next launch's, brought in early (lookahead)
        self.prefetch_bytes = 0

    @property
    def wants_launches(self) -> bool:  # type: ignore[override]
        return not self.planned   # a planned run's transfers are laid out at start: no per-launch hook

    @property
    def carries_out_plan(self) -> bool:  # type: ignore[override]
        return self.planned

    def prefetch(self, ctx: Context) -> Groups | None:
        if self.policy.predicts and self.model is None and (self.planner is None or not self.planned):
            raise UsageError("policy runner needs --model MODEL")
        w = ctx.w
        if len(w.tasks) != 1:
            raise UsageError("policy runner replays one trace (the GPU runner runs one workload)")
        if self.planned:
            return self._carry_out_plan(ctx)
        trace = w.tasks[0].trace
        rel = Relocator(trace, w.tasks[0].truth)   # the workload's footprints of the trace, not computed again
        self.lookup = TraceAllocations(rel)
        # the runner is given the workload's trace for --oversub: its residency estimate uses it
        sched = lookahead_for(self.policy, trace, model=self.model, fallback=self.fallback,
                              relocator=rel, costs=ctx.profile) if self.lookahead else None
        self.decider = LaunchDecider(self.policy, AllocationMap(self.lookup.allocation_of),
                                     capacity=ctx.cap_units * w.gran, relocator=rel, ahead=sched,
                                     predict=None if self.model is None else make_online_predict(self.model,
                                                                                                 self.fallback))
        self.launches = LaunchRows(trace.launches)
        self.values_launches = 0   # launches predicted with values they read
        self.prefetch_bytes = 0
        self.values = V.image(trace) if trace.values is not None and self.use_values else None
        self.trace = trace
        self.w = w   # launch -> step: the workload's own index (w.step_of), not a dict per launch
        return None

    def _carry_out_plan(self, ctx: Context) -> Groups:
        """Template's plan at this capacity (its span, what it leaves to faults, its index-value
        gates), laid out as the runner issues it (`PlanSchedule`: ranges cut at allocations, own
        ranges first), and the units of those ranges handed to the simulator as its groups, each
        group charged a call per range."""
        w = ctx.w
        trace = w.tasks[0].trace
        if w.n_steps != trace.n_launches or not np.array_equal(w.step_launch, np.arange(w.n_steps)):
            raise UsageError("policy runner replays every launch of its trace in order")
        if self.planner is None:
            raise UsageError("policy runner needs --model MODEL")
        # the last capacity's schedule (read by nothing once its run ended) goes before this one's plan
        self.schedule = None
        g = self.planner.prefetch(ctx)
        if g.n_steps != w.n_steps:
            raise UsageError("policy runner: the plan's launches are not the trace's")
        ctx.state.pop("trial_run", None)   # the runner's run is its own (its calls), not the trial's
        table, launches = self._plan_tables(g, ctx)
        # laid out as the GPU runner lays out the same plan written to a file (one construction; a
        # plan file without its lookahead has it derived there from the trace, as the child does)
        self.schedule = schedule_from_plan(table, launches, trace)
        self.prefetch_bytes = int(self.schedule.pf[:, 1].sum()) if len(self.schedule.pf) else 0
        out = groups_of(self.schedule, g, w)
        out.host_s = self.host_seconds(callback_work(self.schedule), ctx.profile)
        out.host_ahead = self.host_ahead
        return out

    def _plan_tables(self, g: Groups, ctx: Context):
        """(rows, lookahead per launch) of the plan carried out: the plan file's where the planner
        follows one (its lookahead None where the file has none), else the two tables `pagecast
        plan` writes of the planner's plan `g` (plan/plan_rows.py, on the needs it was made on)."""
        fixed = getattr(self.planner, "fixed_plan", None)
        if fixed is not None:
            return fixed.table, fixed.launches
        return groups_to_table(g, ctx.state["plan_needs"], ctx.w), launches_table(g, ctx.w)

    def host_seconds(self, work: CallbackWork, profile) -> np.ndarray | None:
        """Host seconds of each launch's callback (online/callbacks.py's `work`): a quiet one the quiet
        cost, a light one the wait's, the others the base plus the per-call cost times the calls issued
        there (None where all are 0: the profile's `host_launch_s`, charged to every run, is all)."""
        base = self.callback_s if self.callback_s is not None else float(
            getattr(profile, "host_base_s", 0.0) or getattr(profile, "host_launch_s", 0.0) or 0.0)
        per_call = self.call_s if self.call_s is not None else float(getattr(profile, "host_call_s", 0.0) or 0.0)
        quiet = self.quiet_s if self.quiet_s is not None else float(getattr(profile, "host_quiet_s", 0.0) or 0.0) or base
        wait = self.wait_s if self.wait_s is not None else float(getattr(profile, "host_wait_s", 0.0) or 0.0) or base
        if not base and not per_call and not quiet and not wait:
            return None
        return np.where(work.quiet, float(quiet), np.where(work.light, float(wait), float(base)
                                                           + float(per_call) * work.calls.astype(np.float64)))

    def _values_for(self, t: int):
        """(values(address, nbytes) for launch t's predictor, the rows it read): the trace's rows
        of launch t, as the runner would copy them once their writer has ended."""
        im = self.values
        read: list[int] = []

        def values(addr: int, nb: int):
            r = int(im.find(np.array([t]), np.array([addr], np.uint64))[0])
            if r < 0:
                return None
            if not read:
                self.values_launches += 1
            read.append(r)
            return im.data(r)[:nb]
        return values, read

    def _gate(self, t: int, step: int, rows: list[int]):
        """(the step whose end the values wait for, bytes copied), or None."""
        if not rows:
            return None
        after = V.producers(self.trace, np.full(len(rows), t), np.array(rows))
        gate = max(self._step_of(int(a)) for a in after.tolist())
        nbytes = int(self.values.nbytes[np.array(rows)].sum())
        return (gate, nbytes) if 0 <= gate < step else (-1, 0)

    def _step_of(self, launch: int) -> int:
        """The step of `launch`, -1 where no step runs it."""
        return int(self.w.step_of(0, launch)) if 0 <= launch < self.trace.n_launches else -1

    def on_launch(self, ctx: Context, step: int):
        w = ctx.w
        t = int(w.step_launch[step])
        dec = self.decider
        try:
            for a in self.lookup.freed_before(t):
                dec.on_free(a)
            self.lookup.t = t
            values, rows = self._values_for(t) if self.values is not None else (None, [])
            d = dec.decide(t, self.launches[t], values)
            # what the engine would hand the driver: ranges cut at allocation boundaries
            self.to_host = dec.allocs.pieces(d.evict) if d.evict else []
            self.to_gpu = dec.allocs.pieces(d.prefetch)
            # lookahead: the next launch's ranges, issued after this launch's on the same copy
            # stream (the engine's `_carry_out_ahead`); this launch waits for its own only
            ahead = dec.allocs.pieces(d.ahead) if d.ahead else []
            self.ahead = ahead
        except Exception as e:  # noqa: BLE001 -- the run cannot go on without the runner's decisions
            raise RuntimeError(f"the runner's decisions failed at launch {t}: {type(e).__name__}: {e}") from e
        self.prefetch_bytes += sum(n for _, n in self.to_gpu) + sum(n for _, n in ahead)
        own = _units(w, self.to_gpu)
        if not ahead:
            # the runner's evictions wait for the work queued before the launch (gpu/cuda_engine.py)
            mv = (_units(w, self.to_host), own, bool(self.to_host))
            gate = self._gate(t, step, rows)
            return mv if gate is None else mv + (gate,)
        # with lookahead the copy stream waits for the evictions (after the work queued before the
        # launch), the launch's stream for its own units only: the first len(own) of the group
        gate = self._gate(t, step, rows)
        return (_units(w, self.to_host), np.concatenate([own, _units(w, ahead)]), bool(self.to_host), gate, len(own))


def groups_of(sched: PlanSchedule, g: Groups, w: Workload) -> Groups:
    """The schedule's ranges as the simulator's groups: their units in issue order, the launch's own
    (its first `own` ranges) first, each range's index-value gate; a call per range."""
    n = sched.n
    ev_ptr, ev, _, _ = schedule_units(sched.ev_ptr, sched.ev, w)
    pf_ptr, pf, size, rid = schedule_units(sched.pf_ptr, sched.pf, w)
    # the launch's own units: those of its first `own` ranges
    csum = np.concatenate([[0], np.cumsum(size)]).astype(I64)
    need_now = csum[sched.pf_ptr[:-1] + sched.own] - csum[sched.pf_ptr[:-1]]
    after = sched.pf_after[rid] if (sched.pf_after >= 0).any() else None
    return Groups(ev_ptr, ev, pf_ptr, pf, need_now.astype(I64), sched.wait_prev.astype(np.uint8),
                  np.zeros(n, np.uint8), g.thrash, sched.waits_for, g.front, g.faulted, None, sched.gate_bytes.copy(),
                  after, sched.calls.astype(I64))


def schedule_units(ptr: np.ndarray, rng: np.ndarray, w: Workload):
    """A schedule's byte ranges (`rng`: address, bytes; CSR `ptr` by launch) as units: (CSR by launch
    of the ranges' units, units per range, the range of each unit). Per unit only the ids, their
    range (int32 where it fits) and a flag are made, and launches are compared per range: per-unit
    launch arrays were the runner's high after its plan rows at scale 10 (docs/performance.md)."""
    ptr = np.asarray(ptr, I64)
    n = len(ptr) - 1
    launch = np.repeat(np.arange(n, dtype=I64), np.diff(ptr))   # per range
    if not len(rng):
        # no unit: none in the universe's width, as `dense` gives them (one engine compile for both)
        return np.zeros(n + 1, I64), np.zeros(0, unit_width(w.universe.n_units)), np.zeros(0, I64), np.zeros(0, I64)
    s, e = rng[:, 0] // w.gran, -((-(rng[:, 0] + rng[:, 1])) // w.gran)
    _, units = w.universe.dense(0, launch, s, e, n)
    cnt = e - s
    if len(units) != int(cnt.sum()):
        raise ValueError("the plan names units outside the trace's footprint")
    # a range cut inside a unit (an allocation boundary off a unit's edge): the unit moves once,
    # unless the unit before it is another launch's (the first unit of a launch's first range)
    keep = np.ones(len(units), bool)
    keep[1:] = units[1:] != units[:-1]
    full = np.flatnonzero(cnt > 0)
    first = (np.cumsum(cnt) - cnt)[full]
    keep[first[1:][launch[full][1:] != launch[full][:-1]]] = True
    rid = np.repeat(np.arange(len(rng), dtype=ID if len(rng) < np.iinfo(ID).max else I64), cnt)[keep]
    size = np.bincount(rid, minlength=len(rng)).astype(I64)
    csum = np.concatenate([[0], np.cumsum(size)]).astype(I64)
    return csum[ptr], units[keep], size, rid


def _units(w, ranges: list[tuple[int, int]]) -> np.ndarray:
    """Byte ranges of task 0 -> its dense unit ids (in range order; units outside the universe dropped)."""
    if not ranges:
        return np.zeros(0, I64)
    a = np.array([r[0] for r in ranges], dtype=np.int64)
    n = np.array([r[1] for r in ranges], dtype=np.int64)
    g = w.gran
    s, e = a // g, -((-(a + n)) // g)
    _, units = w.universe.dense(0, np.zeros(len(s), I64), s, e, 1)
    return units
