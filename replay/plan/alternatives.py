"""Plans that leave the index values' pieces out, tried beside the plan on every prediction.

Bringing in a unit that index values chose waits for the launch that wrote those values and
for their copy to the host (plan/belady.py, sim/timing.py); a unit the plan leaves out faults
in instead, and a plan that knows fewer units evicts differently. Either can be faster: a single
embedding row per token costs a plan more than its fault (llm-decode at 150%: 10.25x with the
rows planned, 10.29x without), a gather's exact pages more than keeping the vector it gathers
from (spmv-cg at 200%: 4.92x planned on the rows, 4.95x leaving them to faults, 4.96x
bringing the whole vector), while the experts a router chose are most of moe-decode's
traffic (7.12x with them planned, 1.39x without). So `template` (and `pagecast plan`, which
writes the plan template would follow) also plans on the needs the arguments name without the
indexed pieces (`plain`), and on those with the indexed regions predicted as irregular ones
are (the fallback: earlier launches' pages), and on those with each indexed region predicted
as its whole allocation (no values needed, so nothing waits: what the model predicted before it
had indexed templates), and keeps the plan whose trial run on the full
predicted needs, indexed pieces included, is fastest: every plan is judged on the predictions
alone, as `spans.choose_span` judges spans.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable

from ..unit_space import Needs, Workload, ahead
from .adaptive import predicted_gated
from .belady import plan_groups
from .faults import leave_to_faults
from .spans import TrialTimes, choose_span, span_needs


def without_indexed(model, cls: str = "irregular"):
    """A copy of `model` whose indexed regions are `cls`: irregular (predicted by the fallback) or
    allocation (every page the values could choose: the class the fitter tries after indexed)."""
    m = copy.deepcopy(model)
    for km in m.kernels.values():
        for r in km.regions:
            if r.cls == "indexed":
                r.cls, r.index = cls, None
                r.start = r.end = r.count = r.chunk = r.stride = r.row_stride = None
    return m


def value_alternatives(w: Workload, model, traces, fallback: str, pg: list) -> Alternatives:
    """The needs of the alternatives (module doc) for tasks `traces` whose (footprints, gates)
    predictions are `pg`; empty when no indexed region predicted anything. Each is made when it is
    read (`Alternatives`), so that a planner going through them holds one at a time."""
    if not any(gt is not None and len(gt.launch) for _, gt in pg):
        return Alternatives([])
    # each one's page counts are read only where choose_span leaves transfers to faults, after its
    # plans are made: they are made then (Needs.page_counts), not held while it plans
    makers = [lambda: w.needs_from([fp if gt is None or gt.plain is None else gt.plain for fp, gt in pg],
                                   with_pages="later")]
    for cls in BLIND:
        makers.append(lambda cls=cls: w.needs_from(blind_predictions(w, model, cls, traces, fallback),
                                                   with_pages="later"))
    return Alternatives(makers)


class Alternatives(Sequence):
    """The alternatives' needs, each made from its predictions when it is read and not kept: every
    one is a per-use array as large as the predicted needs (10^6 launches: hundreds of MB each),
    and `best_plan` reads them one after the other. The predictions they are made from are kept
    (`blind_predictions`), so reading one twice gives equal needs."""

    def __init__(self, makers: list[Callable[[], Needs]]):
        self._makers = makers

    def __len__(self) -> int:
        return len(self._makers)

    def __getitem__(self, i: int) -> Needs:
        return self._makers[i]()


BLIND = ("irregular", "allocation")   # the classes the alternatives predict indexed regions as


def blind_predictions(w: Workload, model, cls: str, traces, fallback: str) -> list:
    """The footprints `without_indexed(model, cls)` predicts for `traces`, made once per workload and
    kept in `w.extra` (every capacity of a sweep plans on them: the predictions are the costly part,
    a Python pass per kernel; the intervals kept are small beside the needs made from them per run),
    or made ahead (`blind_ahead`)."""
    return w.kept(_blind_key(model, cls, traces, fallback), lambda: _blind(model, cls, traces, fallback))[1]


def blind_ahead(model, traces, fallback: str) -> dict[tuple, Future]:
    """Start making the blind predictions of every class in a thread of their own, for a replay that
    builds its workload meanwhile: {key: Future} to put in the workload's `extra` (Workload.kept
    waits for them there; unit_space.ahead). Empty where the model has no indexed region (no
    alternatives). They depend on the model and the traces alone, and they are most of a template
    run's work before its first trial (the fallback's pass over the trace's records; measured in
    docs/performance.md, "Made ahead"), made while one core builds the workload and the other waits."""
    if not any(r.cls == "indexed" for km in model.kernels.values() for r in km.regions):
        return {}
    made: dict[str, Future] = {cls: Future() for cls in BLIND}

    def make():
        for cls, f in made.items():
            if f.set_running_or_notify_cancel():
                try:
                    f.set_result(_blind(model, cls, traces, fallback))
                except BaseException as e:   # raised where it is read (Workload.kept)
                    f.set_exception(e)

    # a daemon thread (not an executor's, which the interpreter waits for at exit): a replay that
    # stops on bad input or Ctrl-C does not wait for predictions nothing will read
    threading.Thread(target=make, name="pagecast-ahead", daemon=True).start()
    return {ahead(_blind_key(model, cls, traces, fallback)): f for cls, f in made.items()}


def _blind_key(model, cls: str, traces, fallback: str) -> tuple:
    return ("blind", id(model), cls, fallback, tuple(id(t) for t in traces))


def _blind(model, cls: str, traces, fallback: str) -> tuple:
    blind = without_indexed(model, cls)
    return model, [predicted_gated(blind, t, fallback)[0] for t in traces]   # model held: id stays its


def best_plan(w: Workload, first: Callable[[], tuple], alternatives: list[Needs], cap_units: int, spans, fronts,
              trial: Callable[[], Callable[[Any, Needs], Any] | None], profile, faults: bool,
              needs: Needs | None = None) -> tuple:
    """The plan on every prediction, made by `first()` (choose_span's (span, span needs, plan, its
    trial run or None) on `needs`), or the fastest alternative's: (span, span needs, plan, its trial
    run's time or None where no trial ran). Each is judged by its
    trial run on the full predicted needs (`trial()` makes a trial function: one per plan, so that
    nothing a trial caches outlives its plan); `first`'s own plan without alternatives or trials.

    No plan is held while the next alternative is planned: each plan at the block span of 10^6
    launches is hundreds of MB (its needs, 1.7 uses a use, and its transfer lists). What is kept of
    the fastest so far is how it was made (`Made`: which needs, its span, front and what it left to
    faults) and its time; unless it is the last one planned, it is made again at the end
    (`Made.again`), the planner being deterministic: the plan that would have been kept. Without
    `needs`, the plan on every prediction is held instead (it cannot be made again but by `first`)."""
    if not alternatives or (t := trial()) is None:
        span, sn, g, run = first()
        return span, sn, g, None if run is None else float(run.end[-1])
    span, sn, g, run = first()
    if run is None:
        run = t(g, sn)
    best, made = run.end[-1], Made(-1, span, g.front, g.faulted)
    held = (span, sn, g) if needs is None else None
    last = (span, sn, g)
    del span, sn, g, run, t
    for i in range(len(alternatives)):
        last = None   # the plan made before goes before the next alternative is made
        span, sn, g, run = choose_span(w, alternatives[i], cap_units, spans, fronts, trial(), profile=profile,
                                       faults=faults, whole_run=False)   # only its time is read
        if run is not None and run.end[-1] < best:
            best, made, held = run.end[-1], Made(i, span, g.front, g.faulted), None
        last = (span, sn, g)
        del span, sn, g, run   # the losers' needs and plan go before the next alternative is made
    if made.which == len(alternatives) - 1:
        out = last
    elif held is not None:
        out = held
    else:
        del last
        out = made.again(w, needs if made.which < 0 else alternatives[made.which], cap_units, trial(), profile)
    return (*out, float(best))


@dataclass(frozen=True)
class Made:
    """How `best_plan`'s fastest plan so far was made: on which needs (-1: the predicted needs, else
    that alternative), at which span, with or without fronts, and whether transfers were then left
    to faults (choose_span's choices)."""

    which: int
    span: str
    front: bool
    faulted: int

    def again(self, w: Workload, needs: Needs, cap_units: int, trial, profile) -> tuple:
        """(span, span needs, plan): the plan choose_span made on `needs` with these choices, made
        again as choose_span made it (its span's needs, Belady's plan, and where it left transfers
        to faults, those its trial run has time to fault)."""
        sn = span_needs(needs, self.span, w, cap_units, profile)
        g = plan_groups(sn, w.universe.n_units, cap_units, belady_in=True, universe=w.universe, front=self.front)
        if self.faulted:
            r = trial(g, sn)
            g = leave_to_faults(g, sn, needs, TrialTimes(r.start, r.end), profile, w.gran)
            if g is None or g.faulted != self.faulted:
                raise AssertionError("a plan made again differs from the one its trial ran")
        return self.span, sn, g
