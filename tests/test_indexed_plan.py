"""Acting on index values: nothing is prefetched before its values exist.

On a hand-made gather (tests/index_workload.py: the ids are written two launches before the
gather reads the rows they name) and on random needs with random value writers: every planned
prefetch of a unit that only index values name sits in a group after the writer's step, the
simulator starts that group only once the writer has ended and the values are copied, plans
written to disk carry the writer (`after_launch`) and replay the same, and the online predictor,
handed the values, predicts what the batch one does."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagecast import trace as T
from pagecast.cli import main
from pagecast.predict.evaluate import evaluate
from pagecast.predict.fit import fit_model
from pagecast.predict.model_io import load_model, save_model
from pagecast.predict.predictor import OnlinePredictor, predict_footprints
from pagecast.replay import policies as P
from pagecast.replay.costs import load_profile, replace
from pagecast.replay.plan import belady as PB
from pagecast.replay.plan import groups as PG
from pagecast.replay.plan import plan_io
from pagecast.replay.plan.adaptive import predicted_gated
from pagecast.replay.sim import run as R
from pagecast.replay.sim.sweep import SimConfig, capacities_for, replay_sim
from pagecast.replay.sim.timing import gate_seconds
from pagecast.replay.unit_space import I64, Needs, build_workload

import index_workload as IW

PROF = load_profile("msched-rtx5080")


@pytest.fixture(scope="module")
def gather(tmp_path_factory):
    d = tmp_path_factory.mktemp("gather")
    traces = [IW.build(seed=s).write(d / f"g{s}.pctrace") for s in (1, 2, 3)]
    model = IW.with_indexed(fit_model([T.read_trace(p) for p in traces[:2]]))
    save_model(model, d / "m.json")
    return d, [T.read_trace(p) for p in traces], model


def test_the_indexed_template_predicts_the_gather_exactly(gather):
    d, traces, model = gather
    ev = evaluate(model, traces[2])
    k = next(x for x in ev["kernels"] if "gather_rows" in x["kernel"])
    assert k["templates"][-1] == "indexed" and k["precision"] == 1.0 and k["recall"] == 1.0
    assert ev["indexed"]["launches"] == 24


def _plan(w, needs, cap):
    return PB.plan_groups(needs, w.universe.n_units, cap, belady_in=True, universe=w.universe)


def test_gated_prefetches_come_after_their_writer_and_the_run_waits(gather):
    d, traces, model = gather
    tr = traces[2]
    fp, gates = predicted_gated(model, tr)
    prof = replace(PROF, transfer_latency_s=2e-3)   # a copy this slow shows in every gated group's start
    w = build_workload([tr], gran=prof.granularity, eviction_unit=prof.eviction_unit, profile=prof, extra_fps=[[fp]])
    needs = w.gated_needs_from([fp], [gates])
    assert needs.gated and needs.value_bytes.sum() == 24 * 12
    (cap, _), = capacities_for(w.footprint_bytes, None, [2.0])
    g = _plan(w, needs, cap // w.gran)
    step = PG.prefetch_steps(g)
    ga = g.pf_after >= 0
    assert ga.any() and (step[ga] > g.pf_after[ga]).all()
    # the gather's values are written two launches before it: its units wait for that launch
    kern = np.array(tr.launches.column(T.KERNEL).to_pylist(), dtype=object)
    first = PG.first_need(step[ga], g.pf_unit[ga], needs, w.n_steps)
    assert all("gather_rows" in kern[w.step_launch[f]] for f in first)
    assert (first - g.pf_after[ga] == 2).all()
    run = R.run_policy(w, P.Given(g, needs), cap // w.gran, prof, P.Options())
    gs = gate_seconds(g, prof)
    for i in np.flatnonzero((g.gate >= 0) & (g.need_now > 0)):
        own = g.pf_unit[g.pf_ptr[i]:g.pf_ptr[i] + g.need_now[i]]
        if np.isin(own, w.truth.of(i)).any():
            assert run.start[i] >= run.end[g.gate[i]] + gs[i] - 1e-12


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31), st.integers(4, 40), st.integers(2, 60))
def test_no_planned_prefetch_precedes_its_values(seed, steps, cap):
    """Random needs, a random share of uses known only after a random earlier step: the plan never
    brings a unit in a group unless a use of it from then on is known by then, and keeps the capacity."""
    rng = np.random.default_rng(seed)
    n_units = 80
    sizes = rng.integers(1, 12, steps)
    units = [np.sort(rng.choice(n_units, k, replace=False)) for k in sizes]
    ptr = np.concatenate([[0], np.cumsum(sizes)]).astype(I64)
    unit = np.concatenate(units).astype(I64)
    step = np.repeat(np.arange(steps), sizes)
    after = np.where((rng.random(len(unit)) < 0.5) & (step > 0), rng.integers(0, np.maximum(step, 1)), -1)
    needs = Needs(ptr, unit, after.astype(I64), np.full(steps, 8, I64))
    g = PB.plan_groups(needs, n_units, cap)
    ps = PG.prefetch_steps(g)
    # a prefetch in group p of unit u is for a use of u at a step >= p whose values exist by then
    # (known from the arguments, or written at a step before p)
    ok = np.array([((unit == u) & (step >= p) & (after < p)).any() for u, p in zip(g.pf_unit, ps)], bool)
    assert ok.all()
    pa = g.prefetch_after()   # -1 for every prefetch where none waits (pf_after is then empty)
    assert len(pa) == len(g.pf_unit) and ((pa < 0) | (pa < ps)).all()
    # the gate of each group is its prefetches' latest writer
    assert np.array_equal(g.gate, PG.gate_of(g.pf_ptr, pa))
    # the plan never holds more than the capacity (replayed on its own needs)
    res = np.zeros(n_units, bool)
    for i in range(steps):
        res[g.ev_unit[g.ev_ptr[i]:g.ev_ptr[i + 1]]] = False
        res[g.pf_unit[g.pf_ptr[i]:g.pf_ptr[i + 1]]] = True
        assert res.sum() <= cap
        res[units[i]] = True
        if res.sum() > cap:   # the run faults the rest in, evicting (not planned): stop checking
            break


def test_plans_on_disk_carry_the_writer_and_replay_the_same(gather, tmp_path):
    d, traces, model = gather
    tr = traces[2]
    out = tmp_path / "p.plan"
    assert main(["plan", str(d / "m.json"), str(tr.path), "--oversub", "2", "-o", str(out)]) == 0
    plan = plan_io.read_plan(out, tr)
    cols = plan.columns()
    aft = cols[plan_io.AFTER_LAUNCH]
    gated = aft >= 0
    assert gated.any() and (aft[gated] < cols[plan_io.LAUNCH_ID][gated]).all()
    kern = np.array(tr.launches.column(T.KERNEL).to_pylist(), dtype=object)
    assert all("write_ids" in k for k in kern[aft[gated]])
    cfg = SimConfig(costs="msched-rtx5080")
    a, _ = replay_sim([tr], ["template"], oversub=[2.0], config=cfg, model=model, timeline=False)
    b, _ = replay_sim([tr], ["template"], oversub=[2.0], config=cfg, plan_path=out, timeline=False)
    assert a[0]["time_s"] == pytest.approx(b[0]["time_s"], rel=1e-9)


def test_a_plan_whose_writer_is_not_earlier_is_refused(gather, tmp_path):
    d, traces, model = gather
    out = tmp_path / "q.plan"
    assert main(["plan", str(d / "m.json"), str(traces[2].path), "--oversub", "2", "-o", str(out)]) == 0
    import pyarrow as pa
    import pyarrow.parquet as pq
    t = pq.read_table(out / plan_io.TABLE)
    t = t.set_column(t.schema.get_field_index(plan_io.AFTER_LAUNCH), plan_io.AFTER_LAUNCH,
                     pa.array(t.column(plan_io.LAUNCH_ID).to_numpy()))
    pq.write_table(t, out / plan_io.TABLE)
    assert main(["replay", str(traces[2].path), "--plan", str(out), "--policy", "template", "--oversub", "2"]) == 2


def test_the_online_predictor_with_values_predicts_as_the_batch_one(gather):
    d, traces, model = gather
    tr = traces[2]
    from pagecast import values as V
    im = V.image(tr)
    batch = predict_footprints(model, tr, "none")
    op = OnlinePredictor(model, "none")
    for r in tr.allocations.to_pylist():
        op.add_allocation(r[T.ADDRESS], r[T.BYTES], r[T.ALLOC_ID])
    rows = tr.launches.to_pylist()
    for i, r in enumerate(rows):
        args = (r[T.KERNEL], r[T.PARAM_DATA], r[T.PARAM_OFFSETS], r[T.PARAM_SIZES])
        reads = op.value_reads(*args)

        def values(addr, nb, i=i):
            row = im.find([i], np.array([addr], np.uint64))[0]
            return None if row < 0 else im.data(row)[:nb]
        got = op.predict(*args, values=values)
        s, e = batch.of(i)
        assert got == list(zip(s.tolist(), e.tolist())), i
        if "gather_rows" in r[T.KERNEL]:
            assert reads and reads[0][1] == 12
        else:
            assert reads == []
    # without the values the indexed region is its fallback (here: nothing)
    g = next(r for r in rows if "gather_rows" in r[T.KERNEL])
    full = op.predict(g[T.KERNEL], g[T.PARAM_DATA], g[T.PARAM_OFFSETS], g[T.PARAM_SIZES])
    bs, be = batch.of(rows.index(g))
    assert sum(e - s for s, e in full) < int((be - bs).sum())


def test_model_file_round_trip_and_text(gather, tmp_path):
    d, traces, model = gather
    m2 = load_model(d / "m.json")
    km = next(v for k, v in m2.kernels.items() if "gather_rows" in k)
    r = next(x for x in km.regions if x.cls == "indexed")
    assert r.text() == "[p1 + 4*p4*v(p2)[i], +4*p4) for i < p3"
    assert (r.index, r.elem) == ("p2", 4)
    import json
    doc = json.loads((d / "m.json").read_text())
    name = next(k for k in doc["kernels"] if "gather_rows" in k)
    for bad, msg in (({"elem": 3}, "elem"), ({"index": "p9"}, "names parameter 9"), ({"index": "p3"}, "8-byte")):
        dd = json.loads((d / "m.json").read_text())
        reg = next(x for x in dd["kernels"][name]["regions"] if x["class"] == "indexed")
        reg.update(bad)
        (tmp_path / "bad.json").write_text(json.dumps(dd))
        with pytest.raises(Exception, match=msg):
            load_model(tmp_path / "bad.json")


def test_the_runner_policy_predicts_with_the_values_and_waits_for_their_writer(gather):
    """Policy `runner` (the GPU runner's decisions in the simulator): the gather is predicted from
    the values its writer left (fewer faults than the same model without a values table), and its
    group starts no earlier than the writer's end plus the copy of the values."""
    from pagecast.replay.policies.runner import Runner
    d, traces, model = gather
    tr = traces[2]
    prof = replace(PROF, transfer_latency_s=2e-3)
    w = build_workload([tr], gran=prof.granularity, eviction_unit=prof.eviction_unit, profile=prof)
    (cap, _), = capacities_for(w.footprint_bytes, None, [0.5])
    # one launch at a time (no plan): the runner predicts each launch from the values it reads
    with_values = R.run_policy(w, Runner(model, planned=False), cap // w.gran, prof, P.Options())
    blind = T.read_trace(IW.build(seed=3, record=False).write(d / "blind.pctrace"))   # the same run, no values
    wb = build_workload([blind], gran=prof.granularity, eviction_unit=prof.eviction_unit, profile=prof)
    without = R.run_policy(wb, Runner(model, planned=False), cap // wb.gran, prof, P.Options())
    from pagecast.replay.sim.kernels import C_FAULTS, C_PREFETCH_IN
    assert with_values.counters[:, C_FAULTS].sum() < without.counters[:, C_FAULTS].sum()
    kern = np.array(tr.launches.column(T.KERNEL).to_pylist(), dtype=object)
    gathers = [i for i in range(w.n_steps) if "gather_rows" in kern[w.step_launch[i]]]
    # the ids are written two launches before each gather: its group waits for that one, then the copy
    moved = [i for i in gathers if with_values.counters[i, C_PREFETCH_IN] > 0]
    assert moved
    for i in moved:
        assert with_values.start[i] >= with_values.end[i - 2] + 2e-3 - 1e-12
    # carrying out template's plan: the rows the values chose are gated on their writer as the plan
    # has them, and a launch whose own rows are gated starts no earlier than its writer's end + the copy
    planned = R.run_policy(w, Runner(model), cap // w.gran, prof, P.Options())
    blind_planned = R.run_policy(wb, Runner(model), cap // wb.gran, prof, P.Options())
    assert planned.counters[:, C_FAULTS].sum() < blind_planned.counters[:, C_FAULTS].sum()
    g = Runner(model).prefetch(R.new_context(w, cap // w.gran, P.Options(), memory=R.Memory(w, cap // w.gran),
                                             profile=prof))
    from pagecast.replay.policies.template import Template
    tg = Template(model).prefetch(R.new_context(w, cap // w.gran, P.Options(), memory=R.Memory(w, cap // w.gran),
                                                profile=prof))
    for f in ("pf_ptr", "pf_unit", "need_now", "need_group", "gate"):
        assert np.array_equal(getattr(g, f), getattr(tg, f)), f
    after = g.prefetch_after()
    assert np.array_equal(after, tg.prefetch_after())
    # (launch, the writer its rows wait for): rows of its own group, or of the earlier group it waits for
    waits = [(i, g.gate[i]) for i in range(w.n_steps) if g.gate[i] >= 0 and planned.counters[i, C_PREFETCH_IN] > 0
             and (after[g.pf_ptr[i]:g.pf_ptr[i] + g.need_now[i]] >= 0).any()]
    waits += [(i, g.gate[j]) for i, j in enumerate(g.need_group.tolist())
              if j >= 0 and g.gate[j] >= 0 and planned.counters[j, C_PREFETCH_IN] > 0]
    # (here template's plan gates none: an alternative without the values was faster, plan/alternatives.py)
    assert bool(waits) == bool((after >= 0).any())
    for i, writer in waits:
        assert planned.start[i] >= planned.end[writer] + 2e-3 - 1e-12


def test_the_planner_also_tries_the_indexed_regions_without_their_values(gather):
    """`template` plans on three alternatives beside the predictions (plan/alternatives.py): the
    indexed pieces left out, predicted as irregular ones, and predicted as their whole allocation;
    the last names every row of the table at each gather (no values, so nothing waits)."""
    from pagecast.replay.plan.alternatives import value_alternatives, without_indexed

    d, traces, model = gather
    blind = without_indexed(model, "allocation")
    assert not any(r.cls == "indexed" for km in blind.kernels.values() for r in km.regions)
    assert any(r.cls == "indexed" for km in model.kernels.values() for r in km.regions)   # a copy
    tr = traces[2]
    w = build_workload([tr], gran=PROF.granularity, eviction_unit=PROF.eviction_unit, profile=PROF)
    pg = [predicted_gated(model, tr, "adaptive")]
    plain, hist, whole = value_alternatives(w, model, [tr], "adaptive", pg)
    table = next(a for a in tr.allocations.to_pylist() if a[T.BYTES] == 4 * 4096 * 2048)
    lo, hi = w.universe.dense(0, np.zeros(1, I64), np.array([table[T.ADDRESS] // w.gran]),
                              np.array([(table[T.ADDRESS] + table[T.BYTES]) // w.gran]), 1)[1][[0, -1]]
    steps = [i for i, t in enumerate(np.asarray(w.step_launch).tolist())
             if "gather_rows" in tr.launches.column(T.KERNEL)[t].as_py()]

    def table_units(needs, s):
        u = needs.unit[needs.ptr[s]:needs.ptr[s + 1]]
        return int(((u >= lo) & (u <= hi)).sum())
    n_table = int(hi - lo + 1)
    assert all(table_units(whole, s) == n_table for s in steps)
    assert all(table_units(plain, s) == 0 for s in steps)
    assert all(table_units(plain, s) < table_units(whole, s) for s in steps)


def test_replay_of_records_left_on_disk_equals_replay_of_loaded_ones(gather, tmp_path):
    """`pagecast replay` reads a trace's records a row group at a time (read_trace(lazy=...)) and shares
    the predictions every capacity plans on; runs equal those of the whole trace in memory, on a trace
    whose template uses index values (observed writes, the history fallback, the value alternatives)."""
    d, traces, model = gather
    p = traces[2].path
    pol = ["demand", "template", "oracle"]
    a, _ = replay_sim([T.read_trace(p)], pol, oversub=[1.5, 3.0], model=model, timeline=False)
    lazy = T.read_trace(p, lazy=T.LAZY_TABLES)
    b, _ = replay_sim([lazy], pol, oversub=[1.5, 3.0], model=model, timeline=False)
    keys = ("policy", "oversub", "time_s", "stall_s", "faults", "htod_bytes", "dtoh_bytes", "plan_span")
    assert [[r.get(k) for k in keys] for r in a] == [[r.get(k) for k in keys] for r in b]
    assert set(lazy.lazy) == {T.FAULTS, T.MIGRATIONS}   # the records were never loaded whole
