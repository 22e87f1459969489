"""A plan's lookahead per launch (launches.parquet) and the one construction of its `PlanSchedule`:
the simulator's `runner` and the GPU runner's child lay out the same plan through
online/planned.schedule_from_plan from the same two tables, so the schedule the simulator charges is
the one the GPU engine carries out, field for field."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pagecast import trace as T
from pagecast.errors import PlanError
from pagecast.replay.online.planned import schedule_from_plan
from pagecast.replay.online.relocate import Relocator
from pagecast.replay.plan import plan_io
from pagecast.replay.policies import runner as RN
from pagecast.replay.sim.sweep import make_plan, replay_sim

JACOBI = Path(__file__).resolve().parent / "data" / "h200" / "jacobi2d-1.pctrace"
FIELDS = ("n", "ev_ptr", "ev", "pf_ptr", "pf", "pf_after", "pf_needed_by", "own", "wait_prev", "waits_for",
          "gate_bytes", "calls")


@pytest.fixture(scope="module")
def workloads(tmp_path_factory):
    """name -> (model, trace): the collected jacobi2d-1 (its model fitted on it) and a generated
    llm-prefill-decode (freed temporaries, index values; fitted on another seed)."""
    from pagecast.datasets.registry import make_trace
    from pagecast.predict.fit import fit_model
    d = tmp_path_factory.mktemp("launches")
    tr = T.read_trace(JACOBI)
    out = {"jacobi2d-1": (fit_model([tr]), tr)}
    fit, own = (T.read_trace(make_trace("llm-prefill-decode", d / f"l{s}.pctrace", scale=0.05, seed=s)) for s in (2, 1))
    out["llm-prefill-decode"] = (fit_model([fit]), own)
    return out


def runners_schedule(monkeypatch, tr, **kw):
    """(capacity in bytes, the PlanSchedule the simulator's runner carried out) of a replay (with
    template, which reads a --plan given: the runner then carries out that plan)."""
    got = []
    carry_out = RN.Runner._carry_out_plan

    def spy(self, ctx):
        out = carry_out(self, ctx)
        got.append(self.schedule)
        return out
    monkeypatch.setattr(RN.Runner, "_carry_out_plan", spy)
    rows, _ = replay_sim([tr], ["template", "runner"] if "plan_path" in kw else ["runner"], timeline=False, **kw)
    monkeypatch.undo()
    assert len(got) == 1
    return rows[-1]["capacity_bytes"], got[0]


def gpu_schedule(path, tr):
    """The schedule the GPU runner's child lays out from the plan directory `path` (gpu/child.py)."""
    plan = plan_io.read_plan(path, tr)
    return schedule_from_plan(plan.table, plan.launches, tr, Relocator(tr))


def assert_same(a, b):
    for f in FIELDS:
        x, y = np.asarray(getattr(a, f)), np.asarray(getattr(b, f))
        assert x.shape == y.shape and np.array_equal(x, y), (f, int(np.sum(x != y)) if x.shape == y.shape else None)


@pytest.mark.parametrize("name", ["jacobi2d-1", "llm-prefill-decode"])
def test_the_runner_and_the_gpu_runner_carry_out_one_schedule(workloads, monkeypatch, tmp_path, name):
    """At 200%: the simulator's runner's schedule (its planner's plan) is the one the GPU child builds
    from that plan written by `pagecast plan` (make_plan at the runner's capacity), field for field:
    the ranges, what each launch needs first, and the waits the planner derived, which the rows
    alone do not say (a merged row of early prefetches names its first need only)."""
    model, tr = workloads[name]
    cap, sim = runners_schedule(monkeypatch, tr, oversub=[2.0], model=model)
    plan = make_plan(model, tr, capacity=cap)
    assert plan.launches is not None and plan.launches.num_rows > 0
    path = plan.save(tmp_path / "p.plan")
    assert (path / plan_io.LAUNCHES).is_file()
    gpu = gpu_schedule(path, tr)
    assert_same(sim, gpu)
    assert len(gpu.pf) and len(gpu.ev) and gpu.wait_prev.any() and (gpu.waits_for >= 0).any()
    if name == "llm-prefill-decode":
        assert (gpu.gate_bytes > 0).any()   # index values copied before value-chosen prefetches
    # the runner replaying that plan file (--plan) carries out the same schedule
    _, from_file = runners_schedule(monkeypatch, tr, capacity=[cap], model=model, plan_path=str(path))
    assert_same(from_file, gpu)


def test_a_plan_without_its_lookahead_is_derived_once_for_both(workloads, monkeypatch, tmp_path):
    """A plan written before launches.parquet: the runner replaying it and the GPU child derive its
    lookahead by the same function, from the same rows and trace."""
    model, tr = workloads["jacobi2d-1"]
    plan = make_plan(model, tr, oversub=2.0)
    old = plan_io.Plan(plan.table, plan.manifest).save(tmp_path / "old.plan")
    assert not (old / plan_io.LAUNCHES).exists() and plan_io.read_plan(old, tr).launches is None
    gpu = gpu_schedule(old, tr)
    _, sim = runners_schedule(monkeypatch, tr, capacity=[plan.capacity_bytes], model=model, plan_path=str(old))
    assert_same(sim, gpu)
    # the same ranges as the plan with its lookahead
    full = gpu_schedule(plan.save(tmp_path / "new.plan"), tr)
    assert np.array_equal(full.pf, gpu.pf) and np.array_equal(full.ev, gpu.ev)


def test_the_lookahead_table_round_trips(workloads, tmp_path):
    model, tr = workloads["jacobi2d-1"]
    plan = make_plan(model, tr, oversub=2.0)
    back = plan_io.read_plan(plan.save(tmp_path / "p.plan"), tr)
    assert back.launches.equals(plan.launches)
    lid = back.launches.column(plan_io.LAUNCH_ID).to_numpy()
    assert (np.diff(lid) > 0).all() and lid.max() < tr.n_launches


@pytest.mark.parametrize("change,words", [
    (lambda t: t.drop_columns([plan_io.WAITS_FOR]), "column 'waits_for' is missing"),
    (lambda t: t.set_column(2, plan_io.WAITS_FOR, pa.array(t.column(0).to_numpy())), "is not an earlier launch"),
    (lambda t: t.take(pa.array(np.arange(t.num_rows)[::-1])), "must be sorted"),
    (lambda t: t.set_column(3, plan_io.GATE_BYTES, pa.array(np.full(t.num_rows, -1))), "must be >= 0"),
    (lambda t: t.set_column(0, plan_io.LAUNCH_ID, pa.array(t.column(0).to_numpy() + 10_000)), "launch_id outside"),
])
def test_a_damaged_lookahead_table_is_one_line(workloads, tmp_path, change, words):
    model, tr = workloads["jacobi2d-1"]
    plan = make_plan(model, tr, oversub=2.0)
    path = plan.save(tmp_path / "p.plan")
    pq.write_table(change(plan.launches), path / plan_io.LAUNCHES)
    with pytest.raises(PlanError, match=words) as e:
        plan_io.read_plan(path, tr)
    assert "\n" not in str(e.value)


def test_template_replays_a_plan_as_planned_without_its_model(workloads, tmp_path):
    """A plan whose model cannot be read (none named): with its lookahead, template replaying it
    runs as template planning on the fly does; without it the waits are guessed from the trace and
    the run differs (jacobi2d-1 at 150%)."""
    model, tr = workloads["jacobi2d-1"]
    plan = make_plan(model, tr, oversub=1.5)
    assert plan.manifest["model"] is None
    cap = [plan.capacity_bytes]

    def time_of(**kw):
        rows, _ = replay_sim([tr], ["template"], capacity=cap, timeline=False, **kw)
        return rows[0]["time_s"]
    fly = time_of(model=model)
    assert time_of(plan_path=str(plan.save(tmp_path / "new.plan"))) == fly
    old = plan_io.Plan(plan.table, plan.manifest).save(tmp_path / "old.plan")
    assert time_of(plan_path=str(old)) != fly
