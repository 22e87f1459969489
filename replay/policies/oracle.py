"""Policy `oracle`: the fastest plan it knows on the true footprints (the bound).

Oracle is defined as the best of a family of schedules of the same launches on
the same simulated GPU, each run with the truth (docs/cost-model.md, "Oracle"):

- its own plans: Belady on the true footprints at each span (units, whole
  2 MiB blocks, blocks where widening pays, whole allocations), with and
  without launches larger than memory getting their front first, and the
  fastest of those with what its trial run has time to fault left to faults
  (plan/spans.py's choose_span, plan/faults.py);
- every other policy's run at the same capacity in the same replay
  (`with_rivals`, called by the simulator's sweep once those runs are done:
  template's, alloc's, ...).

So no policy in a replay is faster than oracle: by construction, not by
tuning. Which member won is in the run's row (`oracle_plan`: "own" or the
policy whose run it is), and the time of its own best plan (`oracle_own_s`),
so that the docs can say where a rival's plan was faster than oracle's own.
"""

from __future__ import annotations

from dataclasses import replace

from .base import Planned


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

    def launch_prefetch(self, view):
        return view.relocated_footprint()

    def needs(self, ctx):
        return ctx.w.truth

    @classmethod
    def with_rivals(cls, own, rivals: list):
        """Its run at a capacity given the other policies' runs there, [(policy name, run)]: the
        fastest of its own and theirs (the first of equal ones; its own on a tie). The row says
        which won (`oracle_plan`), its own time (`oracle_own_s`), and what the winning run's plan
        was made at, as the rival's row does. No rivals: its own run as it is."""
        if not rivals:
            return own
        own_s = float(own.end[-1]) if len(own.end) else 0.0
        extra = {**own.extra, "oracle_own_s": own_s, "oracle_plan": "own"}
        best, best_s = own, own_s
        for name, r in rivals:
            t = float(r.end[-1]) if len(r.end) else 0.0
            if t < best_s:
                best, best_s = r, t
                extra["oracle_plan"] = name
                for k in ("plan_span", "plan_faulted", "host_bytes"):
                    if k in r.extra:
                        extra[k] = r.extra[k]
                    else:
                        extra.pop(k, None)
        return replace(best, policy=own.policy, cap_units=own.cap_units, extra=extra)
