"""The planner's choices narrowed on a sample of the timeline, made on the whole.

A planned policy chooses how to plan (template: which of its needs, `alternatives.py`; every
planned policy: the span and whether launches larger than memory get their front first,
`spans.choose_span`) by planning every candidate and running each plan in the simulator: about
20 plans and 21 trial runs a capacity for template, each over every launch, where the plan kept
is one of them. A long profile repeats itself (a serving engine's decode steps are the same
kernels thousands of times), so the candidates are first compared on a sample of the timeline:
PIECES stretches of consecutive launches spread evenly over it, the first at its start and the
last at its end, `choose_on` launches in all, run as one timeline. The fastest candidate there
names the needs (template's alternatives) and the span; choose_span then judges that span and
its kin (`spans.kin`: block and fitted) on the whole timeline, fronts and what to leave to
faults included, as it judges every span without a sample.

Why the kin: the fitted span narrows the block span's plan where it sees no reuse of what
widening brought, and a sample cuts that reuse short (on the measured case the whole timeline's
trials put block 0.4% ahead of fitted, a sample put fitted ahead, and the runs of the two plans
differed by 7-9%: docs/performance.md, "Choices on a sample"). Why 32,768 launches: candidates'
trials often differ by a fraction of a percent, and shorter stretches ranked them otherwise
(same section). Where the whole timeline's choice is the sample's needs at one of the spans
judged, the plan, its trial and the run are the ones the comparison on the whole gives, byte for
byte (the planner is deterministic). A timeline of at most `choose_on` launches is its own
sample (nothing changes); `--choose-on 0` compares on the whole timeline, however long.

Two rounds. Template's candidates are its four needs at up to four spans (16 pairs, each with and
without fronts where a launch is larger than memory), and most of them lose by far (the unit span,
the whole allocations: 14-70% slower on the sample). Successive halving (Jamieson and Talwalkar,
"Non-stochastic best arm identification and hyperparameter optimization", AISTATS 2016), one
round of it: where there are more than KEEP (needs, span) pairs, every candidate is first tried
on a sample of the sample a FIRST-th as long, and only the KEEP fastest pairs there are tried on
the sample. The shorter sample ranks close candidates otherwise (the longer sample's winner was
first to third of 15 in the runs measured: docs/performance.md, "Two rounds, runs at once"), so
it only drops the candidates far behind; the longer sample still chooses among the close ones.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from ..cells import each
from ..unit_space import I64, Needs, Workload
from .alternatives import best_plan
from .spans import alloc_touches, choose_span, kin

CHOOSE_ON = 32768   # launches the choices are narrowed on (SimConfig.choose_on, --choose-on)
PIECES = 4          # stretches the sample is cut into, spread over the timeline
FIRST = 4           # the first round's sample is this many times shorter (narrowed)
KEEP = 4            # (needs, span) candidates the first round keeps


@dataclass(frozen=True)
class Sample:
    """Steps [s0, s1) of a timeline, in order (`ranges`), and the ascending steps they hold."""

    ranges: tuple[tuple[int, int], ...]
    steps: np.ndarray

    @classmethod
    def of(cls, n_steps: int, launches: int, pieces: int = PIECES) -> Sample | None:
        """The sample of a timeline of `n_steps` launches: None where `launches` is 0 or the timeline
        is no longer than it (compared on the whole)."""
        if launches <= 0 or n_steps <= launches:
            return None
        pieces = max(1, min(pieces, launches))
        size = launches // pieces
        starts = [0] if pieces == 1 else \
            [int(round(i * (n_steps - size) / (pieces - 1))) for i in range(pieces)]
        ranges: list[tuple[int, int]] = []
        for s0 in starts:
            s1 = min(s0 + size, n_steps)
            if ranges and s0 <= ranges[-1][1]:
                ranges[-1] = (ranges[-1][0], s1)   # touching stretches are one
            else:
                ranges.append((s0, s1))
        steps = np.concatenate([np.arange(a, b, dtype=I64) for a, b in ranges])
        return cls(tuple(ranges), steps)

    def needs(self, n: Needs) -> Needs:
        """`n`'s steps in the sample, as a timeline of their own: a use that waits for a step
        outside it waits for the sample's last step before that one (nothing where none is)."""
        ptr = np.asarray(n.ptr)
        pieces = [(int(ptr[a]), int(ptr[b])) for a, b in self.ranges]
        sizes = np.concatenate([np.diff(ptr[a:b + 1]) for a, b in self.ranges])
        out_ptr = np.zeros(len(sizes) + 1, I64)
        np.cumsum(sizes, out=out_ptr[1:])
        unit = np.concatenate([n.unit[u0:u1] for u0, u1 in pieces])
        vb = None if n.value_bytes is None else np.concatenate([n.value_bytes[a:b] for a, b in self.ranges])
        pages = n.pages
        out = Needs(out_ptr, unit, None, vb,
                    None if pages is None else np.concatenate([pages[u0:u1] for u0, u1 in pieces]))
        if pages is None and n.pages_later is not None:
            out.pages_later = lambda: _cut(n.page_counts(), pieces)
        if n.gated:
            use, step = [], []
            base = 0
            for u0, u1 in pieces:
                lo, hi = np.searchsorted(n.gate_use, [u0, u1])
                use.append(n.gate_use[lo:hi] - u0 + base)
                step.append(np.asarray(n.gate_step[lo:hi], I64))
                base += u1 - u0
            use_a, step_a = np.concatenate(use), np.concatenate(step)
            new = np.searchsorted(self.steps, step_a, side="right") - 1   # the last kept step at or before
            keep = new >= 0
            out.set_gates(use_a[keep], new[keep])
        return out

    def workload(self, w: Workload) -> Workload:
        """`w`'s timeline cut to the sample: its launches, in order, touching `w.truth`'s units. What
        a trial run and choose_span read of `w.extra` comes along, cut to the sample (the launch
        times of the planner's view; the allocations' needs, or how many units they hold)."""
        st = replace(w, step_task=w.step_task[self.steps], step_launch=w.step_launch[self.steps],
                     truth=self.needs(w.truth), extra={})
        tasks, alloc = w.extra.get("trial_tasks"), w.extra.get("alloc")
        if tasks is not None:
            st.extra["trial_tasks"] = tasks
        if alloc is not None:
            st.extra["alloc"] = self.needs(alloc)
        else:   # choose_span reads how many units the allocation span would plan (spans.alloc_units)
            st.extra["alloc_touches"] = alloc_touches(w)[self.steps]
        return st


def _cut(a: np.ndarray | None, pieces) -> np.ndarray | None:
    return None if a is None else np.concatenate([a[u0:u1] for u0, u1 in pieces])


def _sample_of(w: Workload, choose_on: int, spans, profile) -> Sample | None:
    """The sample the choices are compared on: None where there is nothing to compare by trial runs
    (no cost profile, one span: as choose_span plans then) or the timeline is short enough."""
    if profile is None or len(spans) < 2:
        return None
    return Sample.of(w.n_steps, choose_on)


def narrowed(sample: Sample, w: Workload, needs: Needs, alternatives, cap_units: int, spans, fronts, trial_of,
             profile) -> tuple[int, tuple[str, ...]]:
    """(which needs: -1 `needs`, else that alternative; the spans to judge on the whole timeline):
    the needs of the candidate whose plan runs fastest on the sample, with its span and that span's
    kin (spans.kin). Every span and front of each needs is planned on the sample and tried there on
    `needs` (choose_span's candidates, nothing left to faults); ties keep choose_span's and
    best_plan's order.

    With more than KEEP (needs, span) candidates, they are first ranked on a sample of the sample a
    FIRST-th as long, and only the KEEP fastest there are planned and tried on the sample:
    successive halving, one round (module doc, "Two rounds"). Each alternative is made on the whole
    timeline once (a pass over every launch's predictions) and cut to the sample; the cut is what
    both rounds read."""
    ws = sample.workload(w)
    pn = ws.truth if needs is w.truth else sample.needs(needs)
    cands = [pn, *(sample.needs(a) for a in alternatives)]   # each alternative's whole needs go once cut
    kept = None   # (which, span) pairs tried on the sample; None: every one
    first = Sample.of(ws.n_steps, ws.n_steps // FIRST) if len(cands) * len(spans) > KEEP else None
    if first is not None:
        ranked = _ranked(first.workload(ws), [first.needs(c) for c in cands], cap_units, spans, fronts, trial_of,
                         profile, None)
        pairs = list(dict.fromkeys((which, span) for _, which, span in ranked))
        if len(pairs) > KEEP:
            kept = set(pairs[:KEEP])
    _, which, span = _ranked(ws, cands, cap_units, spans, fronts, trial_of, profile, kept)[0]
    return which, tuple(s for s in spans if s in kin(span))


def _ranked(ws: Workload, cands: list[Needs], cap_units: int, spans, fronts, trial_of, profile, kept) -> list[tuple]:
    """[((time, which, the candidate's place in choose_span's order), which, span)] of the plans of
    `cands` (which: its place less one, -1 the predicted needs, on which every plan is tried) planned
    and tried on the timeline `ws`, fastest first: every (which, span) pair, or those in `kept` (a
    kept fitted span is made from its block span's plan, so that plan is made and tried too, and
    left out of the ranking where its pair is not kept)."""
    todo = []   # (which, its needs, the spans it is planned at)
    for which, sn in enumerate(cands, start=-1):
        sp = spans if kept is None else \
            tuple(s for s in spans if (which, s) in kept or (s == "block" and (which, "fitted") in kept))
        if sp:
            todo.append((which, sn, sp))
    # each needs' plans and trials are independent of the others': pieces for idle cores (cells.py)
    tried = each([partial(choose_span, ws, sn, cap_units, sp, fronts, trial_of(ws, cands[0]), profile=profile,
                          faults=False, whole_run=False, choice_only=True, always_try=True) for _, sn, sp in todo])
    out = [((t, which, spans.index(span), fronts.index(front)), which, span)
           for (which, _, _), ranked in zip(todo, tried) for t, span, front in ranked
           if kept is None or (which, span) in kept]
    out.sort(key=lambda x: x[0])
    return out


def choose_span_on(choose_on: int, w: Workload, needs: Needs, cap_units: int, spans, fronts, trial_of, profile,
                   faults: bool = True, whole_run: bool = True) -> tuple:
    """spans.choose_span (its arguments and result), its spans narrowed on the sample of `w`'s
    timeline of `choose_on` launches (module doc). `trial_of(workload, needs)` makes the trial run
    of plans of `needs` on `workload` (policies/base.py's plan_trial)."""
    sample = _sample_of(w, choose_on, spans, profile)
    if sample is not None:
        _, spans = narrowed(sample, w, needs, [], cap_units, spans, fronts, trial_of, profile)
    return choose_span(w, needs, cap_units, spans, fronts, trial_of(w, needs), profile=profile, faults=faults,
                       whole_run=whole_run, always_try=sample is not None)


def best_plan_on(choose_on: int, w: Workload, needs: Needs, alternatives, cap_units: int, spans, fronts, trial_of,
                 profile, faults: bool) -> tuple:
    """alternatives.best_plan with choose_span on `needs` first, as template plans: (span, span needs,
    plan, its trial's time or None). With a sample of `w`'s timeline (module doc), the needs and the
    spans are chosen there, and choose_span judges those spans on the whole timeline; every plan is
    tried on `needs` (trial_of as in choose_span_on)."""
    sample = _sample_of(w, choose_on, spans, profile)
    if sample is None:
        def first():
            return choose_span(w, needs, cap_units, spans, fronts, trial_of(w, needs), profile=profile,
                               faults=faults, whole_run=False)   # best_plan reads its time
        return best_plan(w, first, alternatives, cap_units, spans, fronts, lambda: trial_of(w, needs), profile,
                         faults, needs=needs)
    which, kept = narrowed(sample, w, needs, alternatives, cap_units, spans, fronts, trial_of, profile)
    span, sn, g, run = choose_span(w, needs if which < 0 else alternatives[which], cap_units, kept, fronts,
                                   trial_of(w, needs), profile=profile, faults=faults, whole_run=False,
                                   always_try=True)
    return span, sn, g, None if run is None else float(run.end[-1])
