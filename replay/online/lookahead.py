"""The lookahead schedule of a planned run: which launches' footprints a runner may bring in one
launch early, read by the GPU engine (gpu/cuda_engine.py, through `LaunchDecider`) and by the
simulator's `runner` policy alike, so that the rule is written once.

A run can look ahead where it knows the launches to come: a trace of the workload (the plan's
launch sequence). The footprints it looks ahead with are the plan's own:

- `oracle`: the trace's footprints (what its launches touched), relocated into the run;
- `template`: the model's predictions of the trace's launches (`predict_footprints`, with the
  runner's fallback), relocated the same way.

Launches whose footprint depends on index values a producer launch writes (a kernel with an
`indexed` region in the model) are never prefetched early: their values do not exist before the
producer has run, so they are prefetched at their own callback, after their values are read, as
without lookahead. The oracle's footprints are the trace's own, not values-dependent, so it
skips none.

Victims: with a plan, the runner knows each unit's next use in it, so a policy whose victims are
chosen by predicted next use (template: the kernel sequence's period) evicts by the plan's next use
instead (Belady on the plan's footprints, as the oracle does on the trace's).

How far ahead: one launch. `LaunchDecider` admits launch t and t + 1 together when both fit the
emulated capacity, and brings t + 1 in at its own callback otherwise; a depth chosen from the
calibrated costs (issue the next k launches' bytes while the kernels before them run) is not
built: it needs a residency step that admits k launches at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagecast import trace as T

from pagecast.predict.predictor import predict_footprints

from .relocate import Relocator

DEPTH = 1   # launches ahead (the module doc: why one)


@dataclass(frozen=True)
class Lookahead:
    """A planned run's lookahead: the plan's footprints per launch (`plan`, a Relocator, laid out by
    the decider), launches never prefetched early (`skip`), how many launches ahead (`depth`) and
    whether victims go by the plan's next use (`plan_victims`)."""

    plan: Relocator
    skip: frozenset
    depth: int = DEPTH
    plan_victims: bool = True   # victims by the plan's next use (Belady on its footprints), not the period's


def indexed_launches(model, trace) -> frozenset:
    """Launches of `trace` whose kernel has an `indexed` region in `model`."""
    kernels = {name for name, km in model.kernels.items() if any(r.cls == "indexed" for r in km.regions)}
    if not kernels:
        return frozenset()
    names = trace.launches.column(T.KERNEL).to_pylist()
    return frozenset(t for t, k in enumerate(names) if k in kernels)


def applies(policy) -> bool:
    """Whether a policy looks ahead when given a plan: those that prefetch a plan's footprints
    (template's predictions, oracle's truth)."""
    return bool(getattr(policy, "online", False) and (policy.predicts or policy.needs_relocator))


def lookahead_for(policy, trace, *, model=None, fallback: str = "none", relocator: Relocator | None = None
                  ) -> Lookahead | None:
    """The lookahead of `policy` (a policy object) over `trace`, or None where it has none (a policy
    that does not plan, or template without a model). `relocator`: the trace's own (the oracle's),
    reused as the plan; `fallback`: the runner's, for kernels the model cannot predict."""
    if trace is None or not applies(policy):
        return None
    if policy.predicts:
        if model is None:
            return None
        return Lookahead(Relocator(trace, predict_footprints(model, trace, fallback)),
                         indexed_launches(model, trace))
    return Lookahead(relocator if relocator is not None else Relocator(trace), frozenset())
