"""The planner's choices on a sample of the timeline (replay/plan/sample.py): the sample's steps and
needs against a gather of every step, the plan made on the whole with the sample's choice against
choose_span's own plan at that choice, and the sample's choice against trials of every candidate."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagecast.replay import unit_space as U
from pagecast.replay.costs import load_profile
from pagecast.replay.plan.sample import CHOOSE_ON, PIECES, Sample, choose_span_on
from pagecast.replay.unit_space import I64, Needs

import index_workload as IW

PLAN_FIELDS = ("ev_ptr", "ev_unit", "pf_ptr", "pf_unit", "need_now", "wait_prev", "thrash", "need_group", "gate",
               "gate_bytes", "front", "faulted")


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 5000), launches=st.integers(0, 600), pieces=st.integers(1, 6))
def test_a_sample_is_evenly_spread_whole_stretches_from_start_to_end(n, launches, pieces):
    s = Sample.of(n, launches, pieces)
    if launches == 0 or n <= launches:
        assert s is None   # compared on the whole
        return
    size = launches // min(pieces, launches)
    assert s.ranges[0][0] == 0   # the start is in it, and the end where it has two pieces or more
    assert s.ranges[-1][1] == n or min(pieces, launches) == 1
    assert all(b <= c for (_, b), (c, _) in zip(s.ranges, s.ranges[1:]))   # in order, not overlapping
    assert all(b - a >= size for a, b in s.ranges)
    assert len(s.steps) == sum(b - a for a, b in s.ranges) <= launches
    assert np.all(np.diff(s.steps) > 0)


def _needs(rng, n_steps, n_units, gated):
    ptr, units = [0], []
    for _ in range(n_steps):
        u = np.flatnonzero(rng.random(n_units) < 0.3)
        units.append(u)
        ptr.append(ptr[-1] + len(u))
    ptr, unit = np.asarray(ptr, I64), np.concatenate(units).astype(I64)
    step = np.repeat(np.arange(n_steps), np.diff(ptr))
    # a use waits for an earlier step (its values' writer), or for none
    after = np.where((rng.random(len(unit)) < 0.3) & (step > 0), rng.integers(0, np.maximum(step, 1)), -1) \
        if gated else None
    return Needs(ptr, unit, after, rng.integers(0, 100, n_steps).astype(I64), rng.integers(1, 17, len(unit)))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), steps=st.integers(2, 60), launches=st.integers(1, 40),
       pieces=st.integers(1, 5), gated=st.booleans(), later=st.booleans())
def test_a_samples_needs_are_its_steps_gathered_use_for_use(seed, steps, launches, pieces, gated, later):
    """Sample.needs against a gather of each kept step: units, pages (also where they are made when
    read), value bytes, and each use's gate moved to the last kept step at or before its own (none
    where no kept step is)."""
    rng = np.random.default_rng(seed)
    nd = _needs(rng, steps, 24, gated)
    s = Sample.of(steps, launches, pieces)
    if s is None:
        return
    if later:
        pages = nd.pages
        nd.pages, nd.pages_later = None, (lambda: pages)
    out = s.needs(nd)
    after = nd.after if nd.gated else np.full(len(nd.unit), -1)
    full_pages = nd.page_counts()
    want_ptr, want_unit, want_pages, want_after = [0], [], [], []
    for new, old in enumerate(s.steps):
        a, b = nd.ptr[old], nd.ptr[old + 1]
        want_unit.append(nd.unit[a:b])
        want_pages.append(full_pages[a:b])
        for g in after[a:b]:
            kept = s.steps[s.steps <= g] if g >= 0 else s.steps[:0]
            want_after.append(int(np.searchsorted(s.steps, kept[-1])) if len(kept) else -1)
        want_ptr.append(want_ptr[-1] + b - a)
    np.testing.assert_array_equal(out.ptr, want_ptr)
    np.testing.assert_array_equal(out.unit, np.concatenate(want_unit))
    np.testing.assert_array_equal(out.page_counts(), np.concatenate(want_pages))
    np.testing.assert_array_equal(out.value_bytes, nd.value_bytes[s.steps])
    got_after = out.after if out.gated else np.full(len(out.unit), -1)
    np.testing.assert_array_equal(got_after, want_after)
    # a gate is always an earlier step of the sample's own timeline
    step = np.repeat(np.arange(len(s.steps)), np.diff(out.ptr))
    assert np.all(out.gate_step < step[out.gate_use])


@pytest.fixture(scope="module")
def indexed_alts(tmp_path_factory):
    """A workload with indexed regions (tests/index_workload.py), its predicted needs and template's
    alternatives (made when read)."""
    from pagecast import trace as T
    from pagecast.predict.fit import fit_model
    from pagecast.replay.plan.adaptive import predicted_gated
    from pagecast.replay.plan.alternatives import value_alternatives
    d = tmp_path_factory.mktemp("sample")
    paths = [IW.build(seed=s).write(d / f"g{s}.pctrace") for s in (1, 2, 3)]
    model = IW.with_indexed(fit_model([T.read_trace(p) for p in paths[:2]]))
    tr = T.read_trace(paths[2])
    prof = load_profile("msched-rtx5080")
    w = U.build_workload([tr], gran=prof.granularity, eviction_unit=prof.eviction_unit, profile=prof, need_alloc=True)
    pg = [predicted_gated(model, tr, "adaptive")]
    needs = w.gated_needs_from([fp for fp, _ in pg], [g for _, g in pg])
    return w, needs, value_alternatives(w, model, [tr], "adaptive", pg), prof


@pytest.fixture(scope="module")
def indexed(indexed_alts):
    w, needs, _, prof = indexed_alts
    return w, needs, prof


def _trials(cap, prof):
    from pagecast.replay.policies.base import Options, plan_trial
    from pagecast.replay.sim.run import run_policy
    return lambda w, needs: plan_trial(w, needs, cap, prof, Options(), run_policy)


def _caps(w):
    return (max(int(w.truth.sizes().max()) // 2, 1), len(np.unique(w.truth.unit)) // 2)


def test_choose_span_over_kin_keeps_the_whole_timelines_choice(indexed):
    """choose_span over a subset of the spans that holds the span it chooses over all of them (with
    `always_try`: one span is tried too) makes its plan array for array, what it left to faults
    included, with the same trial time: a sample that names the whole timeline's choice gives the
    replay the comparison on the whole gives."""
    from pagecast.replay.plan.spans import PLAN_SPANS, choose_span, kin
    w, needs, prof = indexed
    for cap in _caps(w):
        trial_of = _trials(cap, prof)
        for nd in (needs, w.truth):
            span, sn, g, run = choose_span(w, nd, cap, PLAN_SPANS, (False, True), trial_of(w, nd), profile=prof,
                                           faults=True, whole_run=False)
            for subset in ((span,), tuple(s for s in PLAN_SPANS if s in kin(span))):
                span2, sn2, g2, run2 = choose_span(w, nd, cap, subset, (False, True), trial_of(w, nd), profile=prof,
                                                   faults=True, whole_run=False, always_try=True)
                assert span2 == span and float(run2.end[-1]) == float(run.end[-1])
                np.testing.assert_array_equal(sn.unit, sn2.unit)
                for f in PLAN_FIELDS:
                    np.testing.assert_array_equal(getattr(g, f), getattr(g2, f))


def _sample_times(w, samples, nds, cap, prof, trial_of):
    """{(which, span, front): the trial time on the sample} of every candidate plan of `nds` (which:
    its place in `nds`, less one: -1 the predicted needs), planned here span by span (spans whose
    needs are a span's before them, or over SPAN_GROWTH times the needs, are not candidates). The
    sample: `samples` applied in turn, each to the timeline the one before cut."""
    from pagecast.replay.plan.belady import plan_groups
    from pagecast.replay.plan.spans import PLAN_SPANS, SPAN_GROWTH, needs_fingerprint, span_needs

    def cut(nd):
        for s in samples:
            nd = s.needs(nd)
        return nd
    ws = w
    for s in samples:
        ws = s.workload(ws)
    pn = cut(nds[0])
    times = {}
    for which, nd in enumerate(nds, start=-1):
        sn = cut(nd)
        seen = set()
        for span in PLAN_SPANS:
            n = span_needs(sn, span, ws, cap, prof)
            fp = needs_fingerprint(n)
            if (span != "unit" and len(n.unit) > SPAN_GROWTH * len(sn.unit)) or fp in seen:
                continue
            seen.add(fp)
            fronts = (False, True) if int(np.diff(n.ptr).max()) > cap else (False,)
            for front in fronts:
                p = plan_groups(n, ws.universe.n_units, cap, belady_in=True, universe=ws.universe, front=front)
                times[(which, span, front)] = float(trial_of(ws, pn)(p, n).end[-1])
    return times


def _order(times):
    """The candidates fastest first, ties in the order tried (needs, then span, then front)."""
    from pagecast.replay.plan.spans import PLAN_SPANS
    return sorted(times, key=lambda c: (times[c], c[0], PLAN_SPANS.index(c[1]), c[2]))


@pytest.mark.parametrize("keep", [None, 2])
def test_the_sample_names_the_needs_and_spans_the_whole_timeline_judges(indexed_alts, keep, monkeypatch):
    """With a sample: the needs and span whose plan runs fastest on the sample (every needs, span and
    front planned and tried here on the sample's predicted needs), that span and its kin judged on
    the whole timeline by choose_span; for template (best_plan_on) and for a policy on one needs
    (choose_span_on). With more (needs, span) pairs than KEEP, the sample only tries the KEEP
    fastest pairs on a sample of the sample FIRST times shorter (two rounds; `keep` 2 makes them cut
    here)."""
    from pagecast.replay.plan import sample as S
    from pagecast.replay.plan.sample import best_plan_on
    from pagecast.replay.plan.spans import PLAN_SPANS, choose_span, kin
    if keep is not None:
        monkeypatch.setattr(S, "KEEP", keep)
    w, needs, alts, prof = indexed_alts
    launches = w.n_steps // 3
    s = Sample.of(w.n_steps, launches)
    ws = s.workload(w)
    first = Sample.of(ws.n_steps, ws.n_steps // S.FIRST)   # the first round's: a sample of the sample
    assert first is not None
    assert ws.n_steps == len(s.steps) and len(ws.truth.ptr) == len(s.steps) + 1
    cut = 0
    for cap in _caps(w):
        trial_of = _trials(cap, prof)
        for with_alts in (False, True):
            nds = [needs, *(alts if with_alts else [])]
            times = _sample_times(w, [s], nds, cap, prof, trial_of)
            if len(nds) * len(PLAN_SPANS) > S.KEEP:
                pairs = list(dict.fromkeys(c[:2] for c in _order(_sample_times(w, [s, first], nds, cap, prof, trial_of))))
                if len(pairs) > S.KEEP:
                    kept = set(pairs[:S.KEEP])
                    cut += any(c[:2] not in kept for c in times)
                    times = {c: t for c, t in times.items() if c[:2] in kept}
            which, span, _ = _order(times)[0]
            kept_spans = tuple(x for x in PLAN_SPANS if x in kin(span))
            want = choose_span(w, nds[which + 1], cap, kept_spans, (False, True), trial_of(w, needs), profile=prof,
                               faults=True, whole_run=False, always_try=True)
            if with_alts:
                got = best_plan_on(launches, w, needs, alts, cap, PLAN_SPANS, (False, True), trial_of, prof, True)
                assert got[3] == float(want[3].end[-1])
            else:
                got = choose_span_on(launches, w, needs, cap, PLAN_SPANS, (False, True), trial_of, prof,
                                     faults=True, whole_run=False)
                assert float(got[3].end[-1]) == float(want[3].end[-1])
            assert got[0] == want[0]
            for f in PLAN_FIELDS:
                np.testing.assert_array_equal(getattr(got[2], f), getattr(want[2], f))
    assert keep is None or cut   # the first round left candidates out


def test_a_timeline_no_longer_than_the_sample_is_compared_on_the_whole(indexed):
    from pagecast.replay.plan.spans import PLAN_SPANS, choose_span
    w, needs, prof = indexed
    cap = _caps(w)[1]
    trial_of = _trials(cap, prof)
    a = choose_span_on(w.n_steps, w, needs, cap, PLAN_SPANS, (False, True), trial_of, prof, whole_run=False)
    b = choose_span(w, needs, cap, PLAN_SPANS, (False, True), trial_of(w, needs), profile=prof, whole_run=False)
    assert a[0] == b[0]
    for f in PLAN_FIELDS:
        np.testing.assert_array_equal(getattr(a[2], f), getattr(b[2], f))


def test_the_cli_default_is_the_planners(capsys):
    """The flag's default is written in the CLI (no planner import at start-up): it must be CHOOSE_ON.
    A negative count is one line and exit 2."""
    import argparse

    from pagecast.cli import main
    from pagecast.replay import commands
    p = argparse.ArgumentParser()
    commands._add_span_flag(p)
    assert p.parse_args([]).choose_on == CHOOSE_ON and PIECES >= 1
    assert main(["replay", "nowhere", "--policy", "demand", "--oversub", "2", "--choose-on", "-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--choose-on" in err[0]
