"""What a replay keeps smaller to bound its memory, against the full-size computation it replaces:
`attach_after` made a few steps at a time, a finished run kept as its summary (`run.compact`), the
value alternatives made one at a time, the glibc threshold that returns freed arrays, the per-use
arrays held narrowed (`unit_space.narrow`, `narrow_small`) against the same replay all in int64."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagecast.memory import return_freed_arrays
from pagecast.replay import unit_space as U
from pagecast.replay.costs import load_profile
from pagecast.replay.sim import sweep as SW
from pagecast.replay.sim.kernels import N_COUNTERS
from pagecast.replay.sim.run import compact, summarize
from pagecast.replay.unit_space import I64, Needs

import index_workload as IW


def _needs(rng, n_steps, n_units, dense):
    ptr, units = [0], []
    for _ in range(n_steps):
        u = np.flatnonzero(rng.random(n_units) < dense)
        units.append(u)
        ptr.append(ptr[-1] + len(u))
    return np.asarray(ptr, I64), np.concatenate(units).astype(I64) if units else np.zeros(0, I64)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), steps=st.integers(1, 30), units=st.integers(1, 40),
       shuffled=st.booleans(), scattered=st.booleans())
def test_attach_after_carries_each_uses_after_over(seed, steps, units, shuffled, scattered):
    """attach_after's compiled pass against the rule written use by use, with base's units in or out
    of order (a unit listed twice: its first use's), and blocks ascending with the ids or not."""
    rng = np.random.default_rng(seed)
    block_lo = (np.arange(units, dtype=I64) // 4) * 4
    if scattered:
        block_lo = rng.permutation(block_lo)
    bptr, bunit = _needs(rng, steps, units, 0.3)
    if shuffled and len(bunit):
        for s in range(steps):
            seg = bunit[bptr[s]:bptr[s + 1]]
            if len(seg) > 1:
                seg[:] = rng.permutation(seg)
                seg[-1] = seg[0]   # a unit listed twice
    after = np.where(rng.random(len(bunit)) < 0.5, -1, rng.integers(0, steps, len(bunit))).astype(I64)
    base = Needs(bptr, bunit, after, np.arange(steps, dtype=I64))
    dptr, dunit = _needs(rng, steps, units, 0.5)
    derived = Needs(dptr, dunit)
    parts = U.attach_after(derived, base, block_lo)
    # held sparse: the uses that wait, ascending, with their steps in int32 (unit_space.narrow)
    assert (np.diff(parts.gate_use) > 0).all() and (parts.gate_step >= 0).all()
    got = parts.after if parts.gated else np.full(len(dunit), -1, I64)
    if parts.gated:
        assert parts.after.dtype == parts.gate_step.dtype == U.ID
    assert parts.value_bytes is base.value_bytes and parts.unit is derived.unit
    # and the rule itself, use by use: an exact use keeps its own, else the earliest in its block
    for s in range(steps):
        bu, ba = bunit[bptr[s]:bptr[s + 1]], after[bptr[s]:bptr[s + 1]]
        for k in range(dptr[s], dptr[s + 1]):
            x = dunit[k]
            if (bu == x).any():
                want = ba[np.flatnonzero(bu == x)[0]]
            else:
                same = block_lo[bu] == block_lo[x]
                want = ba[same].min() if same.any() else -1
            assert got[k] == want


@pytest.fixture(scope="module")
def gathered(tmp_path_factory):
    from pagecast import trace as T
    from pagecast.predict.fit import fit_model
    d = tmp_path_factory.mktemp("mem")
    paths = [IW.build(seed=s).write(d / f"g{s}.pctrace") for s in (1, 2, 3)]
    model = IW.with_indexed(fit_model([T.read_trace(p) for p in paths[:2]]))
    return T.read_trace(paths[2]), model


def test_a_prediction_pass_lets_the_tables_views_go_and_predicts_the_same(gathered):
    """predicted_gated forgets the per-table views the predictor cached (predict.features), and a
    second pass, which makes them again, predicts the same pieces and gates."""
    from pagecast.predict import features as FT
    from pagecast.replay.plan.adaptive import predicted_gated
    tr, model = gathered
    fp1, g1 = predicted_gated(model, tr, "adaptive")
    assert not FT._CACHE
    FT.layouts(tr.launches, np.arange(2))   # a view made outside a pass is forgotten by the next
    assert FT._CACHE
    fp2, g2 = predicted_gated(model, tr, "adaptive")
    assert not FT._CACHE
    for f in ("start", "end", "indptr"):
        np.testing.assert_array_equal(getattr(fp1, f), getattr(fp2, f))
    assert len(g1.launch) > 0   # the gathered model's indexed kernel predicts gated pieces
    for f in ("launch", "start", "end", "after"):
        np.testing.assert_array_equal(getattr(g1, f), getattr(g2, f))


def test_a_replay_without_timeline_reports_what_the_full_runs_report(gathered, monkeypatch):
    """The runs kept compact (no timeline) give the rows the full runs give, number for number, and
    oracle still sees its rivals' runs."""
    tr, model = gathered
    pols = ["demand", "template", "oracle"]
    full, tl = SW.replay_sim([tr], pols, oversub=[1.5, 3], model=model, timeline=True)
    kept = []
    real = SW.compact
    monkeypatch.setattr(SW, "compact", lambda r: kept.append(real(r)) or kept[-1])
    small, none = SW.replay_sim([tr], pols, oversub=[1.5, 3], model=model, timeline=False)
    assert none is None and tl is not None and tl.num_rows == len(full) * tr.n_launches
    assert len(kept) == len(full) and all(len(r.counters) == 1 for r in kept)
    assert small == full


def test_compact_keeps_the_summary():
    rng = np.random.default_rng(3)
    n = 50
    r = SW.RunResult("x", 7, rng.integers(0, 9, (n, N_COUNTERS)).astype(I64), np.cumsum(rng.random(n)),
                     np.cumsum(rng.random(n)) + 1, rng.random(n), rng.random(n), {"plan_span": "unit"})

    class W:
        gran = 65536
        n_steps = n
        truth = Needs(np.arange(0, 2 * n + 1, 2, dtype=I64), np.zeros(2 * n, I64))
    c = compact(r)
    assert summarize(c, W) == summarize(r, W) and c.extra is r.extra and c.end[-1] == r.end[-1]
    assert compact(c) is c


def test_the_alternatives_are_made_when_read(gathered):
    from pagecast.replay.plan.adaptive import predicted_gated
    from pagecast.replay.plan.alternatives import value_alternatives
    tr, model = gathered
    prof = load_profile("msched-rtx5080")
    w = U.build_workload([tr], gran=prof.granularity, eviction_unit=prof.eviction_unit, profile=prof)
    alts = value_alternatives(w, model, [tr], "adaptive", [predicted_gated(model, tr, "adaptive")])
    assert len(alts) == 3 and alts
    a, b = alts[2], alts[2]
    assert a is not b   # made again, not kept
    np.testing.assert_array_equal(a.ptr, b.ptr)
    np.testing.assert_array_equal(a.unit, b.unit)


def test_blind_predictions_made_ahead_are_those_made_in_place(gathered):
    """The replay starts the alternatives' blind predictions in a thread before its workload exists
    (blind_ahead); Workload.kept waits for them once, keeps them as it keeps what it makes, and they
    are the predictions made in place. A model without indexed regions has none to make."""
    from concurrent.futures import Future

    from pagecast.replay.plan.alternatives import BLIND, blind_ahead, blind_predictions, without_indexed
    tr, model = gathered
    prof = load_profile("msched-rtx5080")
    made = blind_ahead(model, [tr], "adaptive")
    assert len(made) == len(BLIND) and all(isinstance(f, Future) for f in made.values())
    w = U.build_workload([tr], gran=prof.granularity, eviction_unit=prof.eviction_unit, profile=prof)
    here = U.build_workload([tr], gran=prof.granularity, eviction_unit=prof.eviction_unit, profile=prof)
    w.extra.update(made)
    for cls in BLIND:
        got, ref = blind_predictions(w, model, cls, [tr], "adaptive"), blind_predictions(here, model, cls, [tr], "adaptive")
        assert [(a.start.tolist(), a.end.tolist(), a.indptr.tolist()) for a in got] == \
            [(b.start.tolist(), b.end.tolist(), b.indptr.tolist()) for b in ref]
        assert blind_predictions(w, model, cls, [tr], "adaptive") is got   # kept, not waited for again
    assert not set(made) & set(w.extra)   # each future read once and let go
    assert blind_ahead(without_indexed(model), [tr], "adaptive") == {}


@pytest.mark.parametrize("alone_bytes", [None, 0])
def test_a_template_sweep_with_predictions_made_ahead_is_the_sweep_one_at_a_time(gathered, monkeypatch, alone_bytes):
    """Runs at once (the blind predictions made while the workload is built, the bounds in cells,
    and with ALONE_BYTES 0 every judging on the whole timeline one at a time) give the rows of runs
    one at a time."""
    from dataclasses import replace

    from pagecast.replay.plan import spans as SP
    if alone_bytes is not None:
        monkeypatch.setattr(SP, "ALONE_BYTES", alone_bytes)
    tr, model = gathered
    cfg = SW.SimConfig(costs="msched-rtx5080")
    rows = [SW.replay_sim([tr], ["demand", "template", "oracle"], oversub=[1.5, 3.0], model=model,
                          config=replace(cfg, jobs=j), timeline=False)[0] for j in (1, 2)]
    assert rows[0] == rows[1]


def test_a_value_made_ahead_that_failed_fails_where_it_is_read():
    from concurrent.futures import Future
    w = U.Workload.__new__(U.Workload)
    w.extra = {}
    bad: Future = Future()
    bad.set_exception(ValueError("made ahead"))
    w.extra[U.ahead("k")] = bad
    with pytest.raises(ValueError, match="made ahead"):
        w.kept("k", lambda: 1)
    assert w.kept("k", lambda: 2) == 2   # the failure is not kept: made in place the next time


def test_the_threshold_is_set_on_glibc():
    import platform
    got = return_freed_arrays()
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert got
    else:
        assert got is False


def test_narrow_keeps_int32_only_where_every_value_fits():
    a = np.array([-1, 0, 5, 2**31 - 1], I64)
    n = U.narrow(a)
    assert n.dtype == U.ID
    np.testing.assert_array_equal(n, a)
    big = np.array([0, 2**31], I64)
    assert U.narrow(big) is big   # would wrap: kept int64
    assert U.narrow(np.array([-2**31 - 1], I64)).dtype == I64
    assert U.narrow(None) is None
    assert U.narrow(np.zeros(0, I64)).dtype == U.ID
    f = np.zeros(3)
    assert U.narrow(f) is f
    nd = Needs(np.array([0, 2], I64), np.array([3, 4], I64), np.array([-1, 0], I64), None, np.array([1, 16], I64))
    # unit ids and steps as int32 (narrow), page counts as int16 (narrow_small), the step pointers as given
    assert nd.unit.dtype == nd.after.dtype == U.ID and nd.pages.dtype == U.UNIT_ID and nd.ptr.dtype == I64
    assert Needs(np.array([0, 1], I64), np.array([7], np.int16)).unit.dtype == np.int16   # a universe's width kept


def test_narrow_small_keeps_int16_only_below_its_largest_value():
    a = np.array([-1, 0, 5, 2**15 - 2], I64)
    n = U.narrow_small(a)
    assert n.dtype == U.UNIT_ID
    np.testing.assert_array_equal(n, a)
    # the largest int16 itself is left to `narrow`: an id + 1 (a run's end) must not wrap
    assert U.narrow_small(np.array([0, 2**15 - 1], I64)).dtype == U.ID
    assert U.narrow_small(np.array([0, 2**20], I64)).dtype == U.ID
    big = np.array([0, 2**31], I64)
    assert U.narrow_small(big) is big
    assert U.narrow_small(None) is None
    assert U.narrow_small(np.zeros(0, I64)).dtype == U.UNIT_ID
    assert U.narrow_small(np.arange(2**15, dtype=I64)).dtype == U.ID


def test_unit_ids_take_the_universes_width_not_their_values():
    """Unit ids are int16 only in a universe of fewer than 2^15 - 1 units: the planner's kernels
    write ids an array does not hold (a step's whole blocks) in that array's width. Ids below 2^15
    of a larger universe stay int32, and their blocks widen past 2^15 without wrapping."""
    from pagecast.replay.plan.spans import widen_to_blocks
    assert U.unit_width(2**15 - 2) == U.UNIT_ID and U.unit_width(2**15 - 1) == U.ID
    assert U.unit_width(2**31) == I64
    nd = Needs(np.array([0, 1], I64), np.array([32760], I64))
    assert nd.unit.dtype == U.ID   # no int16 from the values alone
    n_units = 32800
    ids = np.arange(n_units, dtype=I64)   # blocks of 32 units, the last one 32736..32799
    block_lo = np.where(ids >= 32736, 32736, ids // 32 * 32).astype(I64)
    block_hi = np.where(ids >= 32736, n_units, block_lo + 32).astype(I64)
    ptr, units = widen_to_blocks(nd.ptr, nd.unit, block_lo, block_hi)
    assert units.tolist() == list(range(32736, 32800)) and ptr.tolist() == [0, 64]


def _wide(monkeypatch):
    """Every Needs and Groups kept in int64, as before `narrow` (the reference the int32 replay must equal)."""
    from pagecast.replay.plan import belady as B
    from pagecast.replay.plan import groups as G
    monkeypatch.setattr(U, "narrow", lambda a: a)
    monkeypatch.setattr(G, "narrow", lambda a: a)
    monkeypatch.setattr(U, "narrow_small", lambda a: a)
    monkeypatch.setattr(U, "unit_width", lambda n: I64)   # the dense ids `dense` and the chunk needs write
    monkeypatch.setattr(G, "unit_width", lambda n: I64)   # a plan over chunks expanded to its units
    monkeypatch.setattr(U, "ID", I64)   # the steps attach_after and gated_needs_from write
    monkeypatch.setattr(B, "ID", I64)   # the Belady core's steps and positions


def test_a_replay_in_narrow_widths_equals_the_same_replay_in_int64(gathered, monkeypatch):
    """The whole planned replay (template's spans, alternatives and faults left out; oracle; the
    bound) gives the same rows, timeline included, with its per-use arrays narrowed (unit ids and
    page counts in int16, steps in int32) as in int64."""
    tr, model = gathered
    pols = ["demand", "template", "oracle"]
    runs32, tl32 = SW.replay_sim([tr], pols, oversub=[1.5, 2, 3], model=model)
    prof = load_profile("msched-rtx5080")
    w = U.build_workload([tr], gran=prof.granularity, eviction_unit=prof.eviction_unit, profile=prof)
    assert w.truth.unit.dtype == w.truth.pages.dtype == U.UNIT_ID   # what the replay above ran on
    with monkeypatch.context() as m:
        _wide(m)
        w64 = U.build_workload([tr], gran=prof.granularity, eviction_unit=prof.eviction_unit, profile=prof)
        assert w64.truth.unit.dtype == I64
        runs64, tl64 = SW.replay_sim([tr], pols, oversub=[1.5, 2, 3], model=model)
    assert runs32 == runs64
    assert tl32.equals(tl64)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), steps=st.integers(2, 25), units=st.integers(2, 48),
       cap=st.integers(1, 30), front=st.booleans(), gated=st.booleans())
def test_the_planner_kernels_agree_in_every_width(seed, steps, units, cap, front, gated):
    """Belady's plan, the block span, the uses of a plan's prefetches, the pages they fault and the
    next uses: equal whether the per-use arrays come narrowed (int16 units and pages, int32 steps),
    in int32 or in int64 (numba compiles each)."""
    from pagecast.replay.plan import faults as FL
    from pagecast.replay.plan import belady as B
    from pagecast.replay.plan.belady import plan_groups
    from pagecast.replay.plan.spans import widen_to_blocks
    from pagecast.replay.sim.run import next_use_of
    rng = np.random.default_rng(seed)
    ptr, unit = _needs(rng, steps, units, 0.35)
    after = (np.where(rng.random(len(unit)) < 0.5, -1, rng.integers(0, steps, len(unit))).astype(I64)
             if gated else None)
    pages = rng.integers(1, 17, len(unit)).astype(I64)
    block_lo = (np.arange(units, dtype=I64) // 4) * 4
    block_hi = np.minimum(block_lo + 4, units)

    def build(small, step):
        nd = Needs(ptr, unit, after, np.ones(steps, I64), pages)
        # set after construction: Needs narrows what it is given
        for f, dtype in (("unit", small), ("gate_step", step), ("pages", small)):
            if getattr(nd, f) is not None:
                setattr(nd, f, getattr(nd, f).astype(dtype))
        return nd

    # (unit ids and page counts, steps): as narrow_small and narrow keep them, all int32, all int64
    widths = ((U.UNIT_ID, U.ID), (U.ID, U.ID), (I64, I64))
    out = {}
    for small, step in widths:
        nd = build(small, step)
        old = B.ID
        try:
            B.ID = step   # the Belady core's steps and positions in that width too (belady_plan's choice)
            g = plan_groups(nd, units, cap, front=front)
        finally:
            B.ID = old
        for f, dtype in (("ev_unit", small), ("pf_unit", small), ("pf_after", step)):
            setattr(g, f, getattr(g, f).astype(dtype))
        bp, bu = widen_to_blocks(nd.ptr, nd.unit, block_lo, block_hi)
        wide = Needs(bp, bu)
        wide.unit = wide.unit.astype(small)
        uses = FL.prefetch_uses(g, wide, nd)
        ent = FL._entries(g, nd, uses[0], 65536)
        out[small, step] = (g, bp, bu, uses, ent, next_use_of(nd, wide))
    b = out[I64, I64]
    assert b[0].pf_unit.dtype == I64
    for key in widths[:2]:
        a = out[key]
        assert a[0].pf_unit.dtype == key[0]
        for f in ("ev_ptr", "ev_unit", "pf_ptr", "pf_unit", "need_now", "wait_prev", "thrash", "need_group", "gate",
                  "gate_bytes", "pf_after"):
            np.testing.assert_array_equal(getattr(a[0], f), getattr(b[0], f))
        for x, y in zip(a[1:], b[1:]):
            for xx, yy in zip(x if isinstance(x, tuple) else (x,), y if isinstance(y, tuple) else (y,)):
                np.testing.assert_array_equal(xx, yy)


def test_the_pages_a_plan_faults_match_the_search_over_every_use():
    """faults._entries (a binary search in the step's own uses) against the search it replaced (a
    key for every use of every step)."""
    from pagecast.replay.plan import faults as FL
    from pagecast.replay.plan.belady import plan_groups
    rng = np.random.default_rng(11)
    for _ in range(30):
        steps, units = int(rng.integers(2, 30)), int(rng.integers(2, 60))
        ptr, unit = _needs(rng, steps, units, 0.3)
        nd = Needs(ptr, unit, None, None, rng.integers(1, 17, len(unit)))
        if len(unit) == 0:
            continue
        g = plan_groups(nd, units, int(rng.integers(1, units + 1)))
        need = FL.prefetch_uses(g, nd, nd)[0]
        got = FL._entries(g, nd, need, 65536)
        n_units = int(max(unit.max(), g.pf_unit.max(initial=-1))) + 1
        keys = np.repeat(np.arange(steps, dtype=I64), np.diff(ptr)) * n_units + unit
        want_k = np.maximum(need, 0) * n_units + g.pf_unit.astype(I64)
        at = np.minimum(np.searchsorted(keys, want_k), len(keys) - 1)
        hit = (keys[at] == want_k) & (need >= 0)
        want = np.full(len(g.pf_unit), 16, I64)
        want[hit] = nd.pages[at[hit]]
        np.testing.assert_array_equal(got, want)


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 8), k=st.integers(0, 30), m=st.integers(0, 40))
def test_covered_matches_a_search_of_every_interval(seed, n, k, m):
    """footprints._covered (a fault's interval inside a merged migration of its launch) against a
    brute-force search."""
    from pagecast import footprints as FP
    rng = np.random.default_rng(seed)
    l, s = rng.integers(0, n, k), rng.integers(0, 50, k)
    cov = FP.Footprints.from_intervals(l, s, s + rng.integers(1, 10, k), n, 4096)
    ql, qs = rng.integers(-1, n + 1, m), rng.integers(0, 60, m)
    qe = qs + rng.integers(1, 4, m)
    got = FP._covered(cov, ql, qs, qe)
    cl = cov.launch_of_interval()
    want = [bool(((cl == ql[j]) & (cov.start <= qs[j]) & (qe[j] <= cov.end)).any()) for j in range(m)]
    assert got.tolist() == want


def test_observed_footprints_equal_every_record_merged_at_once(gathered):
    """The observed footprints (migrations first, the faults they cover dropped, piece by piece)
    are those of every record merged at once, as they were made before."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pagecast import footprints as FP
    from pagecast import trace as T
    tr, _ = gathered
    ps, n = tr.page_size, tr.n_launches
    clock = FP.LaunchClock(tr)
    f = tr.faults
    page = (f.column(T.ADDRESS).to_numpy().astype(np.uint64) // np.uint64(ps)).astype(I64)
    m = tr.migrations.filter(pc.is_in(tr.migrations.column(T.CAUSE), value_set=pa.array(["coherence"])))
    ms, me = FP.page_span(m.column(T.ADDRESS).to_numpy(), m.column(T.BYTES).to_numpy(), ps)
    lid = np.concatenate([clock.attribute(f.column(T.LAUNCH_ID), f.column(T.TIME_NS)),
                          clock.attribute(m.column(T.LAUNCH_ID), m.column(T.START_NS))])
    want = FP.Footprints.from_intervals(lid, np.concatenate([page, ms]), np.concatenate([page + 1, me]), n, ps)
    got = FP._observed(T.read_trace(tr.path, lazy=("faults", "migrations")), False)
    assert len(f) and len(want.start)
    for k in ("indptr", "start", "end"):
        np.testing.assert_array_equal(getattr(got, k), getattr(want, k))


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 8), k=st.integers(0, 40), merged=st.booleans(),
       gran=st.sampled_from([4096, 16384, 65536, 1 << 21]), by_start=st.booleans())
def test_unit_page_counts_in_one_pass_equal_the_sort(seed, n, k, merged, gran, by_start):
    """unit_page_counts' pass over launches whose intervals come in order (merged footprints)
    against its sort of every use (what it does where they do not come in order, or overlap: then
    a unit's count may pass the pages of a unit, and the pass's narrow width would not hold it)."""
    from pagecast import footprints as FP
    rng = np.random.default_rng(seed)
    lid, s = rng.integers(0, n, k), rng.integers(0, 200, k)
    e = s + rng.integers(1, 40, k)
    if merged:
        fp = FP.Footprints.from_intervals(lid, s, e, n, 4096)
    else:   # overlapping, unsorted within a launch (or sorted by start, still overlapping)
        o = np.lexsort((s, lid)) if by_start else np.argsort(lid, kind="stable")
        ip = np.zeros(n + 1, I64)
        np.cumsum(np.bincount(lid, minlength=n), out=ip[1:])
        fp = FP.Footprints(ip, s[o].astype(I64), e[o].astype(I64), 4096, "predicted")
    got = U.unit_page_counts(fp, gran)
    one_pass = U._unit_pages_in_order
    U._unit_pages_in_order = lambda *a: (np.array([-1], I64), None)   # "not in order": the sort
    try:
        want = U.unit_page_counts(fp, gran)
    finally:
        U._unit_pages_in_order = one_pass
    for x, y in zip(got, want):
        np.testing.assert_array_equal(x, y)
        assert x.dtype == y.dtype


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(0, 9), min_size=1, max_size=30), other=st.integers(0, 10_000),
       uses=st.integers(1, 20))
def test_step_pieces_cover_every_step_in_whole_pieces_under_the_limit(sizes, other, uses):
    rng = np.random.default_rng(other)
    a = np.concatenate([[0], np.cumsum(sizes)]).astype(I64)
    b = np.concatenate([[0], np.cumsum(rng.integers(0, 9, len(sizes)))]).astype(I64)
    pieces = list(U.step_pieces(a, b, uses=uses))
    assert pieces[0][0] == 0 and pieces[-1][1] == len(sizes)
    for (s0, s1), nxt in zip(pieces, pieces[1:] + [(len(sizes), None)]):
        assert s1 > s0 and nxt[0] == s1   # in order, whole steps, nothing left out
        if s1 - s0 > 1:   # more than one step only while both stay under the limit
            assert a[s1] - a[s0] <= uses and b[s1] - b[s0] <= uses


def test_gated_needs_in_pieces_equal_all_at_once(gathered):
    """gated_needs_from matches uses to their gates a few steps at a time (step_pieces): the same
    needs, gates and page counts as with every use at once."""
    from pagecast.replay.plan.adaptive import predicted_gated
    tr, model = gathered
    prof = load_profile("msched-rtx5080")
    fp, gates = predicted_gated(model, tr)
    w = U.build_workload([tr], gran=prof.granularity, eviction_unit=prof.eviction_unit, profile=prof,
                         extra_fps=[[fp]])
    old = U.ATTACH_USES
    try:
        U.ATTACH_USES = 1 << 40
        whole = w.gated_needs_from([fp], [gates])
        U.ATTACH_USES = 5
        parts = w.gated_needs_from([fp], [gates])
    finally:
        U.ATTACH_USES = old
    assert whole.gated and (whole.after >= 0).sum() > 0 and (whole.after < 0).sum() > 0   # both kinds there
    assert len(list(U.step_pieces(whole.ptr, uses=5))) > 10   # many pieces
    for f in ("ptr", "unit", "after", "gate_use", "gate_step", "value_bytes", "pages"):
        np.testing.assert_array_equal(getattr(parts, f), getattr(whole, f))
    assert parts.after.dtype == U.ID


def test_the_span_fingerprint_reads_values_whatever_their_width_and_tells_changes_apart():
    from pagecast.replay.plan import spans as S
    rng = np.random.default_rng(5)
    ptr, unit = _needs(rng, 12, 30, 0.4)
    nd = Needs(ptr, unit)
    assert nd.unit.dtype == U.ID
    fp = S.needs_fingerprint(nd)
    assert fp[:2] == (len(ptr), len(unit))
    assert S.needs_fingerprint(Needs(ptr.astype(I64), unit.astype(I64))) == fp   # int64 copies: the same
    assert S._fingerprint((ptr, unit[::-1])) != fp   # order counts
    moved = unit.copy()
    moved[len(moved) // 2] += 1
    assert S.needs_fingerprint(Needs(ptr, moved)) != fp
    # values of either sign, any width
    neg = np.array([-1, -2, 0, 7], np.int32)
    assert S._fingerprint([neg]) == S._fingerprint([neg.astype(I64)]) != S._fingerprint([-neg])
    assert S._fingerprint([np.array([255], np.uint8)]) == S._fingerprint([np.array([255], I64)])


def _fitted_by_sort(block_plan, block_needs, base, block_lo, n_units, unit_s, latency_s):
    """The fitted span's rule as it was first written (a key per prefetch entry, sorted; the base's
    pairs and their runs; a buffer of both needs), in plain numpy and Python: fitted_needs' reference."""
    from pagecast.replay.plan.faults import prefetch_uses
    m = n_units + 1
    need, own, useful = prefetch_uses(block_plan, block_needs, base)
    fetched = need >= 0
    pair = need[fetched] * m + block_lo[block_plan.pf_unit[fetched]]
    keys = np.unique(pair)
    inv = np.searchsorted(keys, pair)
    own, useful = own[fetched], useful[fetched]
    wasted = np.bincount(inv[~own & ~useful], minlength=len(keys))
    n_useful = np.bincount(inv[useful], minlength=len(keys))
    cand = (n_useful == 0) & (wasted > 0)
    runs = {}
    for s in range(len(base.ptr) - 1):
        prev = None
        for x in base.unit[base.ptr[s]:base.ptr[s + 1]].tolist():
            k = s * m + int(block_lo[x])
            runs[k] = runs.get(k, 0) + (1 if prev is None or k != prev[0] or x != prev[1] + 1 else 0)
            prev = (k, x)
    narrow = {int(k) for k, w in zip(keys[cand], wasted[cand]) if w * unit_s > max(runs.get(int(k), 1) - 1, 0) * latency_s}
    if not narrow:
        return block_needs
    ptr, out = [0], []
    for s in range(len(block_needs.ptr) - 1):
        own_units = base.unit[base.ptr[s]:base.ptr[s + 1]].tolist()
        done = set()
        for x in block_needs.unit[block_needs.ptr[s]:block_needs.ptr[s + 1]].tolist():
            k = s * m + int(block_lo[x])
            if k not in narrow:
                out.append(x)
            elif k not in done:
                done.add(k)
                out += [y for y in own_units if block_lo[y] == block_lo[x]]
        ptr.append(len(out))
    return Needs(np.array(ptr, I64), np.array(out, I64))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), steps=st.integers(2, 25), units=st.integers(4, 48),
       cap=st.integers(2, 30), front=st.booleans(), latency=st.sampled_from([0.0, 1e-6, 5e-6, 1e-4]))
def test_the_fitted_span_tallied_per_use_equals_the_sort_of_every_entry(seed, steps, units, cap, front, latency):
    """fitted_needs (a tally per use of the block span, judged and narrowed in passes over the steps)
    against the rule by a sort of every prefetch entry's (step, block) key."""
    from types import SimpleNamespace
    from pagecast.replay.plan.belady import plan_groups
    from pagecast.replay.plan.fitted import fitted_needs
    from pagecast.replay.plan.spans import widen_to_blocks
    rng = np.random.default_rng(seed)
    ptr, unit = _needs(rng, steps, units, 0.35)
    base = Needs(ptr, unit)
    block_lo = (np.arange(units, dtype=I64) // 4) * 4
    block_hi = np.minimum(block_lo + 4, units)
    bp, bu = widen_to_blocks(base.ptr, base.unit, block_lo, block_hi)
    wide = Needs(bp, bu)
    g = plan_groups(wide, units, cap, front=front)
    unit_s = 2e-6
    w = SimpleNamespace(universe=SimpleNamespace(block_lo=block_lo), gran=65536)
    profile = SimpleNamespace(transfer_latency_s=latency, bulk_time=lambda *a: unit_s)
    got = fitted_needs(g, wide, base, w, profile)
    want = _fitted_by_sort(g, wide, base, block_lo, units, unit_s, latency)
    assert (got is wide) == (want is wide)
    np.testing.assert_array_equal(got.ptr, want.ptr)
    np.testing.assert_array_equal(got.unit, want.unit)


def test_a_plan_made_again_from_its_choices_is_the_plan_choose_span_made(gathered):
    """best_plan keeps how its fastest plan was made, not the plan, and makes it again (Made.again):
    on the predicted needs and on every alternative, at capacities with and without launches larger
    than memory, the plan made again equals choose_span's, array for array."""
    from pagecast.replay.plan.adaptive import predicted_gated
    from pagecast.replay.plan.alternatives import Made, value_alternatives
    from pagecast.replay.plan.spans import PLAN_SPANS, choose_span
    from pagecast.replay.policies.base import Options, plan_trial
    from pagecast.replay.sim.run import run_policy
    tr, model = gathered
    prof = load_profile("msched-rtx5080")
    w = U.build_workload([tr], gran=prof.granularity, eviction_unit=prof.eviction_unit, profile=prof)
    pg = [predicted_gated(model, tr, "adaptive")]
    needs = w.gated_needs_from([fp for fp, _ in pg], [g for _, g in pg])
    alts = value_alternatives(w, model, [tr], "adaptive", pg)
    faulted = 0
    for cap in (max(int(w.truth.sizes().max()) // 2, 1), len(np.unique(w.truth.unit)) // 2):
        def trial():
            return plan_trial(w, needs, cap, prof, Options(), run_policy)
        for i, nd in enumerate([needs, *alts]):
            span, sn, g, run = choose_span(w, nd, cap, PLAN_SPANS, (False, True), trial(), profile=prof,
                                           faults=True, whole_run=False)
            faulted += g.faulted > 0
            span2, sn2, g2 = Made(i - 1, span, g.front, g.faulted).again(w, nd, cap, trial(), prof)
            assert span2 == span
            for f in ("ptr", "unit", "after"):
                x, y = getattr(sn, f), getattr(sn2, f)
                assert (x is None) == (y is None) and (x is None or np.array_equal(x, y))
            for f in ("ev_ptr", "ev_unit", "pf_ptr", "pf_unit", "need_now", "wait_prev", "thrash", "need_group",
                      "gate", "gate_bytes", "front", "faulted"):
                np.testing.assert_array_equal(getattr(g, f), getattr(g2, f))
            np.testing.assert_array_equal(g.prefetch_after(), g2.prefetch_after())
    assert faulted   # a plan that left transfers to faults was made again too


def test_a_plans_fingerprint_says_what_same_plan_says():
    """choose_span tells a span's plan with fronts from the one without by fingerprints (the plan
    goes before the next is made): equal where same_plan is true, whatever the arrays' widths."""
    import copy

    from pagecast.replay.plan.belady import plan_groups
    from pagecast.replay.plan.groups import same_plan
    from pagecast.replay.plan.spans import PLAN_FIELDS, plan_fingerprint
    rng = np.random.default_rng(3)
    ptr, unit = _needs(rng, 20, 40, 0.4)
    a = plan_groups(Needs(ptr, unit), 40, 12)
    b = copy.copy(a)
    for f in PLAN_FIELDS:
        setattr(b, f, getattr(a, f).astype(I64))
    assert same_plan(a, b) and plan_fingerprint(a) == plan_fingerprint(b)
    c = plan_groups(Needs(ptr, unit), 40, 6)
    assert not same_plan(a, c) and plan_fingerprint(a) != plan_fingerprint(c)


def test_choose_span_returns_the_fastest_plan_it_tried_though_it_held_none(gathered):
    """choose_span keeps the fastest plan's span and front, not the plan, and makes it again at the
    end: what it returns is the plan of the fastest (span, front) a trial of each finds, array for
    array, with that plan's own trial times, at capacities with and without launches larger than
    memory."""
    from pagecast.replay.plan.adaptive import predicted_gated
    from pagecast.replay.plan.belady import plan_groups
    from pagecast.replay.plan.spans import PLAN_SPANS, SPAN_GROWTH, choose_span, span_needs
    from pagecast.replay.policies.base import Options, plan_trial
    from pagecast.replay.sim.run import run_policy
    tr, model = gathered
    prof = load_profile("msched-rtx5080")
    w = U.build_workload([tr], gran=prof.granularity, eviction_unit=prof.eviction_unit, profile=prof)
    pg = [predicted_gated(model, tr, "adaptive")]
    needs = w.gated_needs_from([fp for fp, _ in pg], [g for _, g in pg])
    for cap in (max(int(w.truth.sizes().max()) // 2, 1), len(np.unique(w.truth.unit)) // 2):
        def trial():
            return plan_trial(w, needs, cap, prof, Options(), run_policy)
        # the second: a slower plan is the last made (the fastest is made again)
        for spans, fronts in ((PLAN_SPANS, (False, True)), (("unit", "block"), (False,))):
            span, sn, g, run = choose_span(w, needs, cap, spans, fronts, trial(), profile=prof,
                                           faults=False, whole_run=False)
            times = {}
            for s in spans:
                n = span_needs(needs, s, w, cap, prof)
                if len(n.unit) > SPAN_GROWTH * len(needs.unit):
                    continue
                for front in fronts:
                    p = plan_groups(n, w.universe.n_units, cap, belady_in=True, universe=w.universe, front=front)
                    times[s, front] = float(trial()(p, n).end[-1])
            assert times[span, g.front] == min(times.values()) == float(run.end[-1])
            want = plan_groups(span_needs(needs, span, w, cap, prof), w.universe.n_units, cap, belady_in=True,
                               universe=w.universe, front=g.front)
            for f in ("ev_ptr", "ev_unit", "pf_ptr", "pf_unit", "need_now", "wait_prev", "need_group", "gate"):
                np.testing.assert_array_equal(getattr(g, f), getattr(want, f))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), steps=st.integers(1, 25), units=st.integers(1, 30), cap=st.integers(1, 20),
       front=st.booleans())
def test_needs_without_gates_list_no_value_step_per_prefetch(seed, steps, units, cap, front):
    """Belady's core lists the step a prefetch's values wait for only where the needs have gates:
    without, the plan is the plan of the same needs gated at -1 everywhere (no use waits), array for
    array, and no -1 is written per prefetch (None in its place)."""
    from pagecast.replay.plan.belady import belady_plan
    rng = np.random.default_rng(seed)
    ptr, unit = _needs(rng, steps, units, 0.4)
    unit = unit.astype(U.unit_width(units))   # the universe's width, as the planner passes them
    args = (ptr, unit, units, cap, 0, np.zeros(units, np.uint8), 4, cap, True, np.ones(units, I64),
            np.arange(units, dtype=I64), front)
    plain = belady_plan(*args)
    gated = belady_plan(*args, need_after=np.full(len(unit), -1, U.ID))   # int32, as gated needs give it
    assert plain[-1] is None and gated[-1] is None   # none waits: none listed
    for a, b in zip(plain[:-1], gated[:-1]):
        np.testing.assert_array_equal(a, b)


def test_the_alternatives_page_counts_are_made_when_read_and_equal_those_made_at_once(gathered):
    """An alternative's page counts (read only where choose_span leaves transfers to faults, after its
    plans) are not made with its needs but when first read, equal to needs_from's made at once."""
    from pagecast.replay.plan.adaptive import predicted_gated
    from pagecast.replay.plan.alternatives import blind_predictions, value_alternatives
    tr, model = gathered
    prof = load_profile("msched-rtx5080")
    w = U.build_workload([tr], gran=prof.granularity, eviction_unit=prof.eviction_unit, profile=prof)
    alts = value_alternatives(w, model, [tr], "adaptive", [predicted_gated(model, tr, "adaptive")])
    for i, cls in ((1, "irregular"), (2, "allocation")):
        a = alts[i]
        assert a.pages is None
        at_once = w.needs_from(blind_predictions(w, model, cls, [tr], "adaptive"))
        assert at_once.pages is not None and len(at_once.pages) == len(a.unit)
        np.testing.assert_array_equal(a.page_counts(), at_once.pages)
        assert a.pages is a.page_counts() and a.pages_later is None   # made once


def _gate_shares_by_arrays(groups):
    """gate_shares as it was: the step, position and flag of every prefetch as arrays (the peer)."""
    n = groups.n_steps
    ptr = groups.pf_ptr
    size = np.diff(ptr)
    unlisted = (groups.gate >= 0) & (size == 0)
    frac, own, own_plain = unlisted.astype(np.float64), unlisted.copy(), np.zeros(n)
    if not groups.waits_for_values():
        return frac, own_plain, own
    pa = groups.pf_after
    step = np.repeat(np.arange(n), size)
    g = pa >= 0
    mine = (np.arange(len(pa)) - ptr[step]) < groups.need_now[step]
    frac = np.maximum(frac, np.bincount(step[g], minlength=n) / np.maximum(size, 1))
    own_plain = np.bincount(step[~g & mine], minlength=n) / np.maximum(size, 1)
    own |= np.bincount(step[g & mine], minlength=n) > 0
    return frac, own_plain, own


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), steps=st.integers(1, 30), gated=st.floats(0, 1))
def test_gate_shares_in_one_pass_equal_the_per_prefetch_arrays(seed, steps, gated):
    """timing.gate_shares (one compiled pass over the prefetches) against the per-prefetch arrays it
    replaced, bit for bit, in either width of pf_after."""
    from pagecast.replay.plan.groups import Groups
    from pagecast.replay.sim.timing import gate_shares
    rng = np.random.default_rng(seed)
    size = rng.integers(0, 6, steps)
    ptr = np.concatenate([[0], np.cumsum(size)]).astype(I64)
    m = int(ptr[-1])
    g = Groups.empty(steps)
    g.pf_ptr, g.pf_unit = ptr, rng.integers(0, 50, m).astype(I64)
    g.need_now = np.minimum(rng.integers(0, 7, steps), size).astype(I64)
    g.pf_after = np.where(rng.random(m) < gated, rng.integers(0, steps, m), -1).astype(I64)
    g.gate = np.where(rng.random(steps) < 0.3, rng.integers(0, steps, steps), -1).astype(I64)
    for after in (g.pf_after, g.pf_after.astype(U.ID)):
        g.pf_after = after
        for x, y in zip(gate_shares(g), _gate_shares_by_arrays(g)):
            np.testing.assert_array_equal(x, y)
            assert x.dtype == y.dtype


@pytest.mark.parametrize("piece", [1, 7, 64])
def test_plan_rows_merged_a_few_steps_at_a_time_equal_the_whole_pass(gathered, monkeypatch, piece):
    """groups_to_table merges each pass `ROWS_PIECE` entries at a time (whole steps): the rows, their
    order and every column equal those of the pass merged at once (indexed prefetches included)."""
    from pagecast.replay.plan import plan_rows as PR
    tr, model = gathered
    monkeypatch.setattr(PR, "ROWS_PIECE", 1 << 40)
    whole = SW.make_plan(model, tr, oversub=2.0)
    monkeypatch.setattr(PR, "ROWS_PIECE", piece)
    parts = SW.make_plan(model, tr, oversub=2.0)
    assert whole.table.num_rows > 10 and parts.table.equals(whole.table)
    assert parts.launches.equals(whole.launches)


def _schedule_units_per_unit(ptr, rng, w):
    """runner.schedule_units as it was: the launch of every unit compared (the peer)."""
    n = len(ptr) - 1
    launch = np.repeat(np.arange(n, dtype=I64), np.diff(ptr))
    s, e = rng[:, 0] // w.gran, -((-(rng[:, 0] + rng[:, 1])) // w.gran)
    _, units = w.universe.dense(0, launch, s, e, n)
    rid = np.repeat(np.arange(len(rng), dtype=I64), e - s)
    keep = np.ones(len(units), bool)
    keep[1:] = (units[1:] != units[:-1]) | (launch[rid[1:]] != launch[rid[:-1]])
    rid = rid[keep]
    uptr = np.zeros(n + 1, I64)
    np.cumsum(np.bincount(launch[rid], minlength=n), out=uptr[1:])
    return uptr, units[keep], np.bincount(rid, minlength=len(rng)).astype(I64), rid


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), launches=st.integers(1, 12))
def test_schedule_units_compared_per_range_equal_the_per_unit_launches(gathered, seed, launches):
    """The runner's ranges -> units, launches compared per range, against the per-unit launch arrays
    it replaced: ranges cut inside a unit (the unit moves once), a launch's first range starting in
    the unit the launch before ended in (it moves again), launches with no range."""
    from pagecast.replay.policies.runner import schedule_units
    tr, _ = gathered
    prof = load_profile("msched-rtx5080")
    w = U.build_workload([tr], gran=prof.granularity, eviction_unit=prof.eviction_unit, profile=prof)
    us, ue, _ = w.universe.iv[0]
    rng_ = np.random.default_rng(seed)
    per = rng_.integers(0, 4, launches)
    ptr = np.concatenate([[0], np.cumsum(per)]).astype(I64)
    rows = []
    for _ in range(int(ptr[-1])):
        k = int(rng_.integers(0, len(us)))
        lo, hi = int(us[k]) * w.gran, int(ue[k]) * w.gran
        a = int(rng_.integers(lo, hi))
        if rows and rng_.random() < 0.4:   # start inside the unit the range before ended in, if it fits
            prev_end = rows[-1][0] + rows[-1][1]
            if lo <= prev_end - 1 < hi:
                a = prev_end - int(rng_.integers(0, min(w.gran, prev_end - lo)))
        b = int(rng_.integers(1, max(2, min(hi - a, 3 * w.gran))))
        rows.append((a, b))
    rng = np.array(rows, I64).reshape(-1, 2)
    got, want = schedule_units(ptr, rng, w), _schedule_units_per_unit(ptr, rng, w)
    for x, y in zip(got, want):
        np.testing.assert_array_equal(x, y)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), steps=st.integers(1, 20), gran=st.sampled_from([65536, 1 << 21]))
def test_transfer_costs_in_two_passes_equal_the_per_entry_arrays(seed, steps, gran):
    """faults._transfer_ids/_transfer_costs against the per-entry arrays and bincounts they replaced
    (the peer, below): the same transfers and, bit for bit, the same saving and fault cost of each."""
    from pagecast.replay.costs import load_profile
    from pagecast.replay.plan import faults as FL
    prof = load_profile("msched-rtx5080")
    rng = np.random.default_rng(seed)
    size = rng.integers(0, 8, steps)
    ptr = np.concatenate([[0], np.cumsum(size)]).astype(I64)
    m = int(ptr[-1])
    unit = np.cumsum(rng.integers(1, 3, m)).astype(np.int16)   # runs of consecutive units, and gaps
    need = np.where(rng.random(m) < 0.2, -1, rng.integers(0, steps, m)).astype(U.ID)
    need = np.sort(need)   # runs of one step
    own, useful = rng.random(m) < 0.6, rng.random(m) < 0.1
    ent = rng.integers(1, 17, m).astype(U.ID)
    # the peer: the arrays leave_to_faults made
    new = np.ones(m, bool)
    new[1:] = (np.diff(unit) != 1) | (need[1:] != need[:-1])
    first = ptr[:-1]
    new[first[first < m]] = True
    tid_w = np.cumsum(new, dtype=U.ID) - 1
    nt_w = int(tid_w[-1]) + 1 if m else 0
    fault_count = np.bincount(tid_w[own], minlength=nt_w)
    save_w = prof.transfer_latency_s + np.bincount(tid_w, minlength=nt_w) * FL.unit_move_seconds(prof, gran)
    e = np.bincount(tid_w[own], weights=ent[own], minlength=nt_w).astype(float)
    b = np.where(e > 0, np.maximum(np.ceil(fault_count / max(FL.BLOCK // gran, 1)), 1.0), 0.0)
    cost_w = (e * prof.fault_time_s + b * prof.block_service_s
              + np.ceil(e / max(int(prof.faults_per_batch), 1)) * prof.batch_overhead_s)
    useful_w = np.bincount(tid_w[useful], minlength=nt_w) > 0
    # the compiled passes
    tid = np.empty(m, U.ID)
    nt = FL._transfer_ids(ptr, unit, need, tid)
    fl = np.array([prof.transfer_latency_s, FL.unit_move_seconds(prof, gran), prof.fault_time_s,
                   prof.block_service_s, prof.batch_overhead_s], np.float64)
    t_need, save, cost, has_useful = FL._transfer_costs(tid, nt, need, own, useful, ent, fl,
                                                        (max(FL.BLOCK // gran, 1), max(int(prof.faults_per_batch), 1)))
    assert nt == nt_w
    np.testing.assert_array_equal(tid, tid_w)
    np.testing.assert_array_equal(t_need, need[new])
    np.testing.assert_array_equal(save, save_w)
    np.testing.assert_array_equal(cost, cost_w)
    np.testing.assert_array_equal(has_useful, useful_w)
