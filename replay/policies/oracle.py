"""Policy `oracle`: the fastest plan it knows on the true footprints (the bound).

Oracle is defined as the best of a family of schedules of the same launches on
the same simulated GPU, each run with the truth (docs/cost-model.md, "Oracle"):

- its own plans: Belady on the true footprints at each span (units, whole
  2 MiB blocks, blocks where widening pays, whole allocations), with and
  without launches larger than memory getting their front first, and the
  fastest of those with what its trial run has time to fault left to faults
  (plan/spans.py's choose_span, plan/faults.py);
- every other policy's run at the same capacity in the same replay
  (`rivals`, filled in by the simulator's sweep: template's, alloc's, ...).

So no policy in a replay is faster than oracle: by construction, not by
tuning. Which member won is in the run's row (`oracle_plan`: "own" or the
policy whose run it is), and the time of its own best plan (`oracle_own_s`),
so that the docs can say where a rival's plan was faster than oracle's own.
"""

from __future__ import annotations

from .base import Given, Planned


class Oracle(Planned):
    name = "oracle"
    compared_as = "fraction_of_oracle"   # the reference time of every run at the same capacity
    description = "the fastest of its plans on the true footprints and of the other policies' runs (the bound)"
    # one launch at a time: the launch's footprint from a matching trace, relocated; victims by
    # Belady's next use, read from the same trace
    online = True
    victims = "belady"
    streams_front = True
    needs_relocator = True
    prefetches_footprint = True

    runs_last = True
    chooses_span = True
    places = "truth"

    @classmethod
    def for_replay(cls, setup):
        return cls(setup.rivals)

    def __init__(self, rivals: dict | None = None):
        # capacity in units -> [(policy name, its run)] of the other policies in the same replay
        self.rivals = rivals if rivals is not None else {}

    def launch_prefetch(self, view):
        return view.relocated_footprint()

    def needs(self, ctx):
        return ctx.w.truth

    def prefetch(self, ctx):
        g = super().prefetch(ctx)
        rivals = (getattr(self, "rivals", None) or {}).get(ctx.cap_units, [])
        if not rivals:
            return g
        own = ctx.state.get("trial_run")
        if own is None:   # a fixed span: no trial was needed to choose, so run the plan now (it is the run)
            own = ctx.simulate(ctx.w, Given(g, ctx.state["plan_needs"]), ctx.cap_units, ctx.profile, ctx.options)
            ctx.state["trial_run"] = own
        own_s = float(own.end[-1]) if len(own.end) else 0.0
        ctx.state["oracle_own_s"] = own_s
        ctx.state["oracle_plan"] = "own"
        best_s = own_s
        for name, r in rivals:
            t = float(r.end[-1]) if len(r.end) else 0.0
            if t < best_s:
                best_s = t
                ctx.state["trial_run"] = r
                ctx.state["oracle_plan"] = name
                # the row says what the winning run's plan was made at, as the rival's row does
                for k in ("plan_span", "plan_faulted", "host_bytes"):
                    if k in r.extra:
                        ctx.state[k] = r.extra[k]
                    else:
                        ctx.state.pop(k, None)
        return g
