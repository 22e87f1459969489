"""Policy `runner`: the GPU runner's engine driven by a trace, its transfers replayed in the simulator."""

from __future__ import annotations

import numpy as np
import pytest

from pagecast import trace as T
from pagecast.errors import UsageError
from pagecast.replay import policies as P
from pagecast.replay.sim import run as R
from pagecast.replay.sim.sweep import SimConfig, replay_sim
from pagecast.replay.policies.runner import Runner, TraceAllocations


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    from pagecast.datasets.registry import make_trace
    from pagecast.predict.fit import fit_model
    d = tmp_path_factory.mktemp("runner")
    out = {}
    for name in ("jacobi2d", "llm-prefill-decode"):
        fit = [T.read_trace(make_trace(name, d / f"{name}{s}.pctrace", scale=0.05, seed=s)) for s in (1, 2)]
        out[name] = (fit_model(fit), T.read_trace(make_trace(name, d / f"{name}3.pctrace", scale=0.05, seed=3)))
    return out


def test_trace_cuda_answers_the_allocation_live_at_each_launch(fitted):
    """llm-prefill-decode frees its prompt temporaries and reuses their addresses."""
    _, tr = fitted["llm-prefill-decode"]
    from pagecast.replay.online.relocate import Relocator
    cuda = TraceAllocations(Relocator(tr))
    a = tr.allocations.to_pylist()
    assert len({r[T.ADDRESS] for r in a}) < len(a)          # the trace does reuse addresses
    rng = np.random.default_rng(0)
    for r in a:
        last = r[T.LAST_LAUNCH] if r[T.LAST_LAUNCH] is not None else tr.n_launches - 1
        for t in {r[T.FIRST_LAUNCH], last, int(rng.integers(r[T.FIRST_LAUNCH], last + 1))}:
            cuda.t = t
            for addr in (r[T.ADDRESS], r[T.ADDRESS] + r[T.BYTES] - 1):
                got = cuda.allocation_of(addr)
                assert got is not None and (got.base, got.size) == (r[T.ADDRESS], r[T.BYTES]), (r, t)
    cuda.t = 0
    assert cuda.allocation_of(1) is None


@pytest.mark.parametrize("name", ["jacobi2d", "llm-prefill-decode"])
def test_runner_replays_the_engines_transfers(fitted, name):
    model, tr = fitted[name]
    cfg = SimConfig()
    runs, _ = replay_sim([tr], ["demand", "runner", "template"], oversub=[0.5, 1.5, 3.0], config=cfg, model=model)
    by = {(r["policy"], r["oversub"]): r for r in runs}
    again, _ = replay_sim([tr], ["runner"], oversub=[1.5], config=cfg, model=model)
    assert again[0]["time_s"] == by[("runner", 1.5)]["time_s"]          # deterministic
    # memory for everything: the engine evicts nothing, and what it prefetches never faults again
    roomy = by[("runner", 0.5)]
    assert roomy["dtoh_bytes"] == 0 and roomy["faults"] <= by[("demand", 0.5)]["faults"]
    assert roomy["prefetch_bytes"] > 0
    for o in (1.5, 3.0):
        r = by[("runner", o)]
        assert r["prefetch_bytes"] > 0 and r["dtoh_bytes"] > 0
        assert r["htod_bytes"] >= r["prefetch_bytes"]


def test_runner_transfers_are_the_engines(fitted):
    """The units the simulator moves for `runner` are the ranges the engine asked for."""
    from pagecast.replay.unit_space import build_workload
    model, tr = fitted["jacobi2d"]
    prof = SimConfig().profile()
    w = build_workload([tr], gran=prof.granularity, eviction_unit=prof.eviction_unit, profile=prof)
    cap = w.universe.n_units // 2
    pol = Runner(model, planned=False)   # one launch at a time: the engine's own decisions
    ctx = R.new_context(w, cap, P.Options(), memory=R.Memory(w, cap), profile=prof)
    pol.prefetch(ctx)
    asked = 0
    pages = set()
    ahead = 0
    for step in range(w.n_steps):
        mv = pol.on_launch(ctx, step)
        ev, pf = mv[:2]
        asked += sum(n for _, n in pol.to_gpu) + sum(n for _, n in pol.ahead)
        assert len(np.unique(pf)) == len(pf) and len(np.unique(ev)) == len(ev)
        if pol.ahead:   # lookahead: the launch's own units first, the next launch's after them
            ahead += 1
            assert len(mv) == 5 and mv[4] <= len(pf)
        # each range's first and last 64 KiB unit is among the units handed to the simulator
        for a, n in pol.to_gpu + pol.ahead:
            for b in (a, a + n - 1):
                d0, _, inside = w.universe.dense_intervals(0, np.array([b // w.gran]), np.array([b // w.gran + 1]))
                if inside[0]:
                    assert d0[0] in set(pf.tolist())
        pages.update(pf.tolist())
    assert asked == pol.prefetch_bytes > 0 and pages and ahead > 0


@pytest.mark.parametrize("name", ["jacobi2d", "llm-prefill-decode"])
def test_the_planned_runner_carries_out_templates_plan(fitted, name):
    """Given a plan, the runner issues template's plan launch by launch: the same units in the same
    order, its own part first, the same evictions and flags; each range (cut at allocations) one call,
    so it is never faster than template, and what it moves is what template moves."""
    from pagecast.replay.policies.template import Template
    from pagecast.replay.sim import kernels as K
    from pagecast.replay.unit_space import build_workload
    model, tr = fitted[name]
    prof = SimConfig().profile()
    w = build_workload([tr], gran=prof.granularity, eviction_unit=prof.eviction_unit, profile=prof)
    cap = w.universe.n_units // 3
    plan = Template(model).prefetch(R.new_context(w, cap, P.Options(), memory=R.Memory(w, cap), profile=prof))
    pol = Runner(model)
    assert not pol.wants_launches   # laid out at start: no per-launch hook
    got = pol.prefetch(R.new_context(w, cap, P.Options(), memory=R.Memory(w, cap), profile=prof))
    for f in ("ev_ptr", "ev_unit", "pf_ptr", "pf_unit", "need_now", "wait_prev", "need_group", "gate"):
        assert np.array_equal(getattr(got, f), getattr(plan, f)), f
    assert np.array_equal(got.prefetch_after(), plan.prefetch_after())
    assert got.pf_unit.size > 0 and got.ev_unit.size > 0
    sched = pol.schedule
    for t in range(tr.n_launches):
        la = sched.at(t)
        assert la.calls == got.calls[t] and 0 <= la.own <= len(la.prefetch)
        # the launch's own ranges are those its plan needs first, the rest for later launches
        units = la.prefetch[:la.own, 1].sum() // w.gran if la.own else 0
        assert units == plan.need_now[t]
    runs = {p.name: R.run_policy(w, p, cap, prof, P.Options()) for p in (Template(model), Runner(model))}
    t, r = runs["template"], runs["runner"]
    assert np.array_equal(r.counters[:, K.C_PREFETCH_IN], t.counters[:, K.C_PREFETCH_IN])
    assert np.array_equal(r.counters[:, K.C_GROUP_DTOH], t.counters[:, K.C_GROUP_DTOH])
    assert r.end[-1] >= t.end[-1]
    # a callback longer than every kernel: the runner's run is at least that long per launch
    slow = R.run_policy(w, Runner(model, callback_s=1e-3), cap, prof, P.Options())
    assert slow.end[-1] >= tr.n_launches * 1e-3 > r.end[-1]


def test_the_planned_runners_host_cost_grows_with_its_calls(fitted):
    """The planned runner's callback costs a base plus a per-call cost times the calls issued there
    (runner option or the profile's host_call_s, the same charge), a quiet one (nothing issued or
    waited on: online/callbacks.py) its own cost: a callback that issues more calls keeps the GPU
    waiting longer, and the run's clock grows with calls x host_call_s."""
    import dataclasses

    from pagecast.replay.online.callbacks import callback_work

    model, tr = fitted["jacobi2d"]
    prof = SimConfig().profile()
    assert prof.host_call_s == 0.0 and prof.host_launch_s == 0.0
    from pagecast.replay.unit_space import build_workload
    w = build_workload([tr], gran=prof.granularity, eviction_unit=prof.eviction_unit, profile=prof)
    cap = w.universe.n_units // 3
    pol = Runner(model, call_s=1e-3)
    got = pol.prefetch(R.new_context(w, cap, P.Options(), memory=R.Memory(w, cap), profile=prof))
    work = callback_work(pol.schedule)
    calls = work.calls.astype(np.float64)   # per callback: the ranges issued there
    assert calls.sum() == np.asarray(got.calls).sum() > 0
    assert np.array_equal(got.host_s, 1e-3 * calls)   # no base: the profile's 0
    base = R.run_policy(w, Runner(model), cap, prof, P.Options())
    per_call = R.run_policy(w, Runner(model, call_s=1e-3), cap, prof, P.Options())
    assert per_call.end[-1] >= calls.sum() * 1e-3 > base.end[-1]
    # twice the per-call cost: the clock grows by at least the calls' share (each launch's kernel is
    # shorter than 1 ms a call here, so the host's time is what the GPU waits for)
    twice = R.run_policy(w, Runner(model, call_s=2e-3), cap, prof, P.Options())
    assert twice.end[-1] - per_call.end[-1] >= 0.9 * calls.sum() * 1e-3
    # the profile's field charges the same as the option
    prof_calls = dataclasses.replace(prof, host_call_s=1e-3)
    from_prof = R.run_policy(w, Runner(model), cap, prof_calls, P.Options())
    assert from_prof.end[-1] == pytest.approx(per_call.end[-1])
    # base + per call
    both = Runner(model, callback_s=5e-4, call_s=1e-3).prefetch(
        R.new_context(w, cap, P.Options(), memory=R.Memory(w, cap), profile=prof))
    assert np.allclose(both.host_s, 5e-4 + 1e-3 * calls)   # a quiet callback: the base, where none is given
    # a quiet callback's own cost (option or the profile's host_quiet_s, the same charge)
    assert 0 < work.quiet.sum() < len(calls)
    quiet = Runner(model, callback_s=5e-4, call_s=1e-3, quiet_s=1e-5).prefetch(
        R.new_context(w, cap, P.Options(), memory=R.Memory(w, cap), profile=prof))
    assert np.allclose(quiet.host_s, np.where(work.quiet, 1e-5, 5e-4 + 1e-3 * calls))
    # ... and a light one's (nothing issued, the stream's wait alone)
    assert work.light.sum() > 0
    light = Runner(model, callback_s=5e-4, call_s=1e-3, quiet_s=1e-5, wait_s=2e-5).prefetch(
        R.new_context(w, cap, P.Options(), memory=R.Memory(w, cap), profile=prof))
    assert np.allclose(light.host_s, np.where(work.quiet, 1e-5, np.where(work.light, 2e-5, 5e-4 + 1e-3 * calls)))
    prof_q = dataclasses.replace(prof, host_launch_s=5e-4, host_call_s=1e-3, host_quiet_s=1e-5, host_wait_s=2e-5)
    assert np.allclose(Runner(model).prefetch(R.new_context(w, cap, P.Options(), memory=R.Memory(w, cap),
                                                            profile=prof_q)).host_s, light.host_s)


def test_runner_needs_a_model_and_one_trace(fitted):
    model, tr = fitted["jacobi2d"]
    with pytest.raises(UsageError, match="--model"):
        replay_sim([tr], ["runner"], oversub=[2.0])
    with pytest.raises(UsageError, match="one trace"):
        replay_sim([tr, tr], ["runner"], oversub=[2.0], model=model)


def test_runner_predicts_an_indexed_launch_from_its_values(tmp_path):
    """The hand-made gather (tests/index_workload.py) with its indexed template: the runner's
    decisions read the trace's values as the engine reads the buffer, and prefetch the rows they
    name; without them the rows fault."""
    import index_workload as IW
    from pagecast.predict.fit import fit_model
    from pagecast.replay.unit_space import build_workload

    model = IW.with_indexed(fit_model([T.read_trace(IW.build(seed=1).write(tmp_path / "fit.pctrace"))]))
    tr = T.read_trace(IW.build(seed=4).write(tmp_path / "run.pctrace"))
    prof = SimConfig().profile()
    w = build_workload([tr], gran=prof.granularity, eviction_unit=prof.eviction_unit, profile=prof)
    cap = w.universe.n_units   # room for everything
    asked = {}
    for read in (True, False):
        pol = Runner(model, values=read, planned=False)
        ctx = R.new_context(w, cap, P.Options(), memory=R.Memory(w, cap), profile=prof)
        pol.prefetch(ctx)
        gathered = 0
        for step in range(w.n_steps):
            pol.on_launch(ctx, step)
            if "gather_rows" in pol.launches[int(w.step_launch[step])].kernel:
                gathered += sum(n for _, n in pol.to_gpu)
        asked[read] = (gathered, pol.values_launches)
    table_row = 4 * 2048
    assert asked[True][1] == 24 and asked[False][1] == 0
    # with the values: every row a gather names, once (later uses find it resident)
    rows = {int(x) for d in tr.values.column(T.DATA).to_pylist() for x in np.frombuffer(d, "<i4")}
    assert asked[True][0] >= len(rows) * table_row > asked[False][0]
