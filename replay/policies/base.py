"""The policy abstraction: what a policy decides, for the simulator and the GPU runner alike.

A policy is a small object with named hooks, in libCacheSim's spirit, registered
by name in `pagecast.replay.policies.POLICIES` (what `--policy` looks up), one
module per policy in this folder.

The simulator (`pagecast.replay.sim`) replays a whole timeline and calls:
- `prefetch(ctx) -> Groups | None`: the transfers (evictions, then prefetches
  in need order) to issue before each step; policies see the whole timeline
  (which task runs next and its upcoming launches), so they plan it at once;
- `on_launch(ctx, step) -> (evict_units, prefetch_units[, wait[, (gate, nbytes)[, own]]]) | None`:
  called before every step, when `wants_launches`, for policies that decide online; `(gate,
  nbytes)`: the group waits for step `gate` to end and for `nbytes` of index values to be copied
  to the host (its prefetches follow them: replay/sim/timing.py charges both); `own`: how many
  of the first prefetch units are the step's own (the rest are for later steps: the launch
  waits for these only; default all);
- `on_miss(ctx, step, missed_units) -> Groups | None`: called after a step
  that faulted, when `wants_misses`; may re-plan the steps after it;
- `on_evict(ctx, step, evicted_units)`: called after a step that evicted
  units (its group's or its faults', still gone at its end), when `wants_evictions`;
- `evict_order`: how fault-path evictions pick victims ("fifo", "lru", or
  None for the run's `--eviction`); planned policies first evict units the
  plan does not count on (brought in by faults).

One launch at a time (the GPU runner, `pagecast.replay.gpu`, and the
simulator's `runner` policy, which replays the runner's decisions), a policy
with `online = True` says:
- `launch_prefetch(view) -> [(address, nbytes)]`: what to bring in before the
  launch (`view`: its arguments, the allocations they point into, the model's
  prediction and the relocated trace footprint, `online.decide.LaunchView`);
- `victims`: how the runner's residency estimate chooses victims when an
  emulated capacity is full (`online.residency`: "fifo", "next-use", "belady");
- `streams_front`: a launch whose known footprint is larger than the capacity
  gets only its first capacity's worth prefetched (it streams through memory);
- `predicts` / `needs_relocator`: it needs the model's prediction of every
  launch / a matching trace of the workload.
`online.decide.LaunchDecider` makes those decisions once per launch; the GPU
engine carries them out with CUDA calls, the `runner` policy in the simulator.

The simulator passes planned policies a way to run their candidate plans
(`ctx.simulate`, for the planner's span choice), so nothing here imports it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..plan.groups import Groups
from ..plan.sample import CHOOSE_ON, choose_span_on
from ..plan.spans import PLAN_SPANS
from ..unit_space import Needs, Workload

@dataclass
class ReplaySetup:
    """What a replay hands the policies it builds (`Policy.for_replay`): the model, and the template
    policy as the replay made it (from the model or a fixed plan)."""

    model: Any = None
    template: Any = None


# the fault path's victim orders, as --eviction names them (sim/uvm_driver.py carries each out)
VICTIM_ORDERS = ("driver", "fifo", "lru")


@dataclass
class Options:
    eviction: str = "driver"           # fault-path victim order (VICTIM_ORDERS)
    driver_prefetch: bool = True       # the tree prefetcher
    feedback: bool = False
    # with more launches than this, planned policies narrow their candidate plans on a sample of this
    # many launches and judge the survivors on the whole timeline (plan/sample.py); 0: every candidate
    # on the whole timeline
    choose_on: int = CHOOSE_ON


@dataclass
class Context:
    """What a policy sees: the workload (timeline, true needs), capacity, options,
    memory, the cost profile, and `simulate(w, policy, cap_units, profile, options)`,
    the simulator's run of one policy (planned policies try their candidate plans
    with it; `pagecast.replay.sim.run.new_context` fills it in)."""

    w: Workload
    cap_units: int
    options: Options
    memory: Any = None
    state: dict = field(default_factory=dict)
    profile: Any = None
    simulate: Callable | None = None


class Policy:
    """A policy's hooks (override what it needs; see the module doc). The per-step hooks
    cost a Python call per launch, so the built-in policies plan in `prefetch` instead."""

    name = ""
    description = ""
    evict_order: str | None = None
    wants_misses = False      # on_miss after each launch that faulted
    wants_launches = False    # on_launch before every launch
    wants_evictions = False   # on_evict after every launch that evicted units
    # -- how a replay builds and runs it (replay/sim/sweep.py reads these, never the names) ----
    requires = ""             # "model": needs --model; "model-or-plan": --model or --plan
    compared_as: str | None = None   # every run row's field for its time relative to this policy's (add_relative)
    sizes_runs = False        # moves nothing ahead: the GPU backend's run that measures the managed memory
                              # a workload allocates (--oversub without a trace) is of this policy
    reads_arguments = False   # reads the launches' pointer arguments (the trace must hold their bytes)
    runs_last = False         # its run at a capacity is judged with the others' runs there (with_rivals)
    chooses_span = False      # plans at the replay's --span (or chooses it)
    carries_out_plan = False  # runs the replay's template plan as given (a --plan's host placement too)
    follows_plan = False      # given the replay's --plan, carries that plan out (its model not needed then)
    # with --placement auto, what the policy judges host placement on (placement.py): "predicted"
    # (its model's footprints; kept where its plan's trial run says it is faster), "truth" (kept
    # where the run is faster), or None (the driver's default placement only)
    places: str | None = None
    lru_one_pass = False      # its LRU runs at every capacity are one stack-distance pass (sim/stack.py)
    # its runs at different capacities keep nothing on the policy object (all in their Context), so a
    # sweep may run them at once (replay/cells.py)
    concurrent_capacities = False

    @classmethod
    def for_replay(cls, setup: ReplaySetup) -> Policy:
        """The policy object a replay runs."""
        return cls()

    @classmethod
    def with_rivals(cls, own, rivals: list):
        """A policy that runs last (`runs_last`): its run at a capacity (a sim.run.RunResult) given
        the other policies' runs at that capacity in the same replay, [(policy name, run)], once
        they are done (the sweep plans and runs its own first, beside them: replay/cells.py)."""
        return own

    def prefetch(self, ctx: Context) -> Groups | None:
        """The planned transfers before every step, at once (the whole timeline is known)."""
        return None

    def on_launch(self, ctx: Context, step: int) -> tuple | None:
        """Before step `step` (before its planned group, if any): (units to evict, units to
        prefetch in need order[, wait]), issued like a planned group; the launch waits for the
        prefetches. The group overlaps the launch before unless `wait`, or it takes from memory
        a unit that launch touches (named, or evicted by its prefetches finding memory full)."""
        return None

    def on_miss(self, ctx: Context, step: int, missed: np.ndarray) -> Groups | None:
        """After step `step` faulted on `missed` units: a full-length plan to follow from the
        next step on, or None."""
        return None

    def on_evict(self, ctx: Context, step: int, evicted: np.ndarray) -> None:
        """Units that left the GPU during step `step` (its group, its launch's faults) and were
        not back by its end (the tree prefetcher may return one within the step)."""
        return None

    # -- one launch at a time (the GPU runner; see the module doc) ---------------------------
    online = False            # has per-launch decisions: the GPU backend runs only these
    victims = "fifo"          # the runner's victim rule with an emulated capacity (online.residency)
    streams_front = False     # a launch known larger than the capacity: prefetch its front only
    predicts = False          # needs the model's prediction of every launch
    needs_relocator = False   # needs a matching trace of the workload (its footprints, relocated)
    prefetches_footprint = False   # launch_prefetch is the launch's relocated trace footprint

    def launch_prefetch(self, view) -> list[tuple[int, int]]:
        """Byte ranges to bring to the GPU before the launch `view` describes."""
        return []


class Planned(Policy):
    """Follows a Belady plan made on some needs (predicted, allocation-level or true),
    at the span (PLAN_SPANS) whose plan the policy's own needs say is fastest, with
    what its trial run has time to fault left to faults (plan/faults.py) when the span
    is chosen (a fixed span is Belady's plan at that span, nothing left out)."""

    spans: tuple[str, ...] | None = None   # None: every one of PLAN_SPANS
    fronts: tuple[bool, ...] = (False, True)   # plans tried for launches larger than memory (plan_groups)
    faults: bool = True    # with the span chosen, also try leaving what the trial run has time to fault
    concurrent_capacities = True   # its plan and trial runs are the run's (Context.state)

    def needs(self, ctx: Context) -> Needs:
        raise NotImplementedError

    def prefetch(self, ctx: Context) -> Groups:
        needs = self.needs(ctx)
        spans = self.spans or PLAN_SPANS
        span, sn, g, run = choose_span_on(ctx.options.choose_on, ctx.w, needs, ctx.cap_units, spans, self.fronts,
                                          trials_of(ctx), ctx.profile, faults=self.faults and len(spans) > 1)
        ctx.state["plan_needs"] = sn
        ctx.state["plan_span"] = span
        ctx.state["plan_front"] = g.front
        ctx.state["plan_faulted"] = g.faulted
        if run is not None:
            ctx.state["plan_trial_s"] = float(run.end[-1])   # what the policy's own needs say its plan takes
        if run is not None and needs is ctx.w.truth:
            # the winning trial ran this very plan on these very needs: it is the run (oracle)
            ctx.state["trial_run"] = run
        return g


class Given(Policy):
    """A plan already made (the planner's trial runs)."""

    def __init__(self, groups: Groups, needs: Needs):
        self.groups, self.plan_needs = groups, needs

    def prefetch(self, ctx):
        ctx.state["plan_needs"] = self.plan_needs
        return self.groups


def trials_of(ctx: Context) -> Callable[[Workload, Needs], Callable | None]:
    """(workload, needs) -> the trial run of plans of `needs` on that workload at the context's
    capacity, profile and options (plan_trial), for a planner that compares plans on a sample of
    the timeline as well as on the whole (plan/sample.py)."""
    return lambda w, needs: plan_trial(w, needs, ctx.cap_units, ctx.profile, ctx.options, ctx.simulate)


def plan_trial(w: Workload, needs: Needs, cap_units: int, profile, options: Options,
               simulate: Callable | None) -> Callable[[Groups, Needs], Any] | None:
    """A trial run for `choose_span`: a plan simulated (`simulate`) on a copy of `w` whose launches
    touch `needs`; None without a cost profile (no trials)."""
    if profile is None:
        return None
    if simulate is None:
        raise ValueError("planning with a cost profile needs the simulator's run (Context.simulate;"
                         " pagecast.replay.sim.run.new_context makes such a context)")
    view = None

    def trial(g: Groups, sn: Needs):
        nonlocal view
        if view is None:
            view = copy.copy(w)
            view.truth, view.extra = needs, {}
            tasks = w.extra.get("trial_tasks")   # launch times as the planner's own view has them (sim/sweep.py)
            if tasks is not None:
                view.tasks = tasks
        return simulate(view, Given(g, sn), cap_units, profile, options)

    return trial
