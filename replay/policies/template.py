"""Policy `template`: follows a plan made from the learned templates (mispredictions fault)."""

from __future__ import annotations

import copy

import numpy as np

from pagecast import footprints as F
from pagecast.errors import UsageError
from pagecast.predict.feedback import apply_feedback

from ..plan.adaptive import predicted_gated
from ..plan.belady import plan_groups
from ..plan.groups import Groups
from ..plan.alternatives import value_alternatives
from ..plan.sample import best_plan_on
from ..plan.spans import PLAN_SPANS, span_needs
from ..unit_space import I64
from .base import Context, Planned, trials_of


class Template(Planned):
    """Plans on the model's predicted footprints; `--feedback` refines the model after misses."""

    name = "template"
    description = "follows a plan made from the learned templates (mispredictions fault)"
    # one launch at a time: the launch's predicted footprint; victims by predicted next use
    # (the launch sequence's period, online.residency.SequenceNextUse)
    online = True
    victims = "next-use"
    streams_front = True
    predicts = True

    def launch_prefetch(self, view):
        return view.predicted or []

    # Leaving transfers to faults (plan/faults.py), tried on its predictions as oracle tries it on the
    # truth; what it gains and costs, measured: docs/cost-model.md, "Left to faults".
    faults = True

    requires = "model-or-plan"
    follows_plan = True
    reads_arguments = True
    chooses_span = True
    places = "predicted"

    @classmethod
    def for_replay(cls, setup):
        return setup.template   # built by the replay: from the model, or following a fixed plan

    def __init__(self, model=None, plan_groups_fixed: Groups | None = None, fallback: str = "adaptive"):
        self.model = model
        self.fixed = plan_groups_fixed
        self.fallback = fallback
        self.fixed_needs = None
        self.fixed_span = "unit"
        self.fixed_plan = None   # the plan file `plan_groups_fixed` was read from (plan_io.Plan), if any

    @property
    def wants_misses(self) -> bool:  # type: ignore[override]
        return self._feedback

    _feedback = False

    def predicted_gates(self, ctx: Context) -> list:
        """Per task (predicted footprints, the pieces index values chose with when those exist). A
        subclass that gives its own footprints (`predicted`) gives them with no index values."""
        if type(self).predicted is not Template.predicted:
            return [(fp, None) for fp in self.predicted(ctx)]
        return ctx.w.kept(("predicted", id(self.model), self.fallback),
                          lambda: [predicted_gated(self.model, t.trace, self.fallback) for t in ctx.w.tasks])

    def predicted(self, ctx: Context) -> list[F.Footprints]:
        return [fp for fp, _ in self.predicted_gates(ctx)]

    def needs(self, ctx):
        """The predicted needs, with the units index values chose gated on their values' writer
        (a plan brings them in no earlier than after it: plan/belady.py)."""
        def make():
            pg = self.predicted_gates(ctx)
            return ctx.w.gated_needs_from([fp for fp, _ in pg], [g for _, g in pg])
        return ctx.w.kept(("pneeds", id(self.model), self.fallback), make)

    def prefetch(self, ctx):
        if self.fixed is not None:
            if self.fixed_needs is not None:
                # the plan's predicted needs (its model at hand): Belady within
                # a launch larger than memory, as the plan was made
                ctx.state["plan_needs"] = self.fixed_needs
            ctx.state["plan_span"] = self.fixed_span
            return self.fixed
        if self.model is None:
            raise UsageError("policy template needs --model MODEL or --plan PLAN")
        self._feedback = ctx.options.feedback
        if self._feedback:
            # feedback changes the model: give this run its own copy and predictions
            ctx.state["model"] = copy.deepcopy(self.model)
            ctx.state["pred"] = list(self.predicted(ctx))
            ctx.state["gates"] = [g for _, g in self.predicted_gates(ctx)]
            ctx.state["needs"] = self.needs(ctx)
            ctx.state["feedback_changes"] = 0
        return self._or_values_left_to_faults(ctx)

    def _or_values_left_to_faults(self, ctx) -> Groups:
        """The plan on every prediction, or one leaving the indexed pieces out, whichever the
        trial on the predicted needs finds faster (plan/alternatives.py). The plan on every
        prediction is made by best_plan, which holds no plan while the next is made."""
        if self._feedback:
            return super().prefetch(ctx)
        pg = self.predicted_gates(ctx)
        alts = value_alternatives(ctx.w, self.model, [t.trace for t in ctx.w.tasks], self.fallback, pg)
        if not alts:
            return super().prefetch(ctx)
        spans = self.spans or PLAN_SPANS
        needs = self.needs(ctx)
        faults = self.faults and len(spans) > 1
        span, sn, g, trial_s = best_plan_on(ctx.options.choose_on, ctx.w, needs, alts, ctx.cap_units, spans,
                                            self.fronts, trials_of(ctx), ctx.profile, faults)
        ctx.state.update(plan_needs=sn, plan_span=span, plan_front=g.front, plan_faulted=g.faulted)
        if trial_s is not None:
            ctx.state["plan_trial_s"] = trial_s
        return g

    def on_miss(self, ctx, step, missed):
        w = ctx.w
        t = int(w.step_task[step])
        lid = int(w.step_launch[step])
        task = w.tasks[t]
        ps, pe = task.truth.of(lid)
        qs, qe = ctx.state["pred"][t].of(lid)
        ms, me = interval_difference(ps, pe, qs, qe)
        if len(ms) == 0:
            return None
        model = ctx.state["model"]
        if not apply_feedback(model, task.trace, lid, ms, me):
            return None
        ctx.state["feedback_changes"] += 1
        ctx.state["pred"][t], ctx.state["gates"][t] = predicted_gated(model, task.trace, self.fallback)
        needs = w.gated_needs_from(ctx.state["pred"], ctx.state["gates"])
        ctx.state["needs"] = needs
        mem = ctx.memory
        # re-planned at the span chosen for the run (one more choice per miss would cost a run each;
        # nothing is left to faults in a re-plan: that takes a trial run)
        needs = span_needs(needs, ctx.state.get("plan_span", "unit"), w, ctx.cap_units, ctx.profile,
                           start_step=step + 1, init_resident=mem.resident, front=ctx.state.get("plan_front", False))
        ctx.state["plan_needs"] = needs
        return plan_groups(needs, w.universe.n_units, ctx.cap_units, start_step=step + 1,
                           init_resident=mem.resident, belady_in=True, universe=w.universe,
                           front=ctx.state.get("plan_front", False))


def interval_difference(as_, ae, bs, be):
    """[as, ae) minus [bs, be): sorted disjoint half-open intervals (vectorized)."""
    as_, ae, bs, be = (np.asarray(x, I64) for x in (as_, ae, bs, be))
    if len(as_) == 0:
        return as_, ae
    pts = np.unique(np.concatenate([as_, ae, bs, be]))
    lo, hi = pts[:-1], pts[1:]
    ina = (np.searchsorted(as_, lo, side="right") - 1)
    in_a = (ina >= 0) & (lo < ae[np.maximum(ina, 0)])
    inb = (np.searchsorted(bs, lo, side="right") - 1)
    in_b = (inb >= 0) & (lo < be[np.maximum(inb, 0)]) if len(bs) else np.zeros(len(lo), bool)
    keep = in_a & ~in_b
    if not keep.any():
        z = np.zeros(0, I64)
        return z, z.copy()
    _, s, e = F.merge_intervals(np.zeros(int(keep.sum()), I64), lo[keep], hi[keep], 1)
    return s, e

