"""A planned run's quiet launches on the CUDA stand-in (gpu/cuda_engine.py, "Quiet launches"): a launch
with nothing due is counted and returned, with no driver call; a launch with work still waits on its
event; a wait the launch's stream already covered is left out. online/callbacks.py's rule, which the
simulator's runner charges, agrees with what the engine did."""

from __future__ import annotations

import numpy as np
import pytest

from pagecast import trace as T
from pagecast.replay.gpu import cuda_engine as E
from pagecast.replay.online.callbacks import callback_work
from pagecast.replay.online.planned import PlannedCalls, schedule_from_plan
from pagecast.replay.online.relocate import Relocator
from pagecast.replay.unit_space import managed_bytes
from test_gpu_planned import LAUNCH_STREAM, TRACE, fake_for, ops_at, shifted_rows

CALLS = ("gpu", "host", "batch", "discard")


@pytest.fixture(scope="module")
def jacobi():
    from pagecast.predict.fit import fit_model
    from pagecast.replay.sim.sweep import make_plan

    tr = T.read_trace(TRACE)
    plan = make_plan(fit_model([tr]), tr, capacity=managed_bytes(tr) // 2)
    return tr, schedule_from_plan(plan.table, plan.launches, tr, Relocator(tr))


def _run(tr, sched, observed=None, moved=None):
    f = fake_for(tr)
    rel = Relocator(tr)
    if observed is not None:
        orig = rel.observe

        def observe(t, kernel, data):
            observed.append(t)
            return orig(t, kernel, data)
        rel.observe = observe
    e = E.Engine(f, "template", capacity=managed_bytes(tr) // 2, predict=lambda la, allocs: [],
                 planned=PlannedCalls(sched, rel), moved=moved)
    marks = []
    for t, la in shifted_rows(tr):
        marks.append(len(f.log))
        e.on_launch(la)
        f.log.append(("kernel", t))
    assert e.stats.errors == 0, e.stats.last_error
    return f, e, marks


def test_a_launch_with_nothing_due_issues_no_call_and_is_not_observed(jacobi):
    """Quiet launches: no driver call (no range, no event recorded, no wait) and none of the per-launch
    Python of a launch with work (the trace's relocation is not consulted); light ones (nothing to
    issue but a wait) make their stream's wait alone; the others take the full path."""
    tr, sched = jacobi
    observed: list[int] = []
    f, e, marks = _run(tr, sched, observed=observed)
    short = sorted(set(range(sched.n)) - set(observed))
    assert e.stats.quiet_launches + e.stats.light_launches == len(short)
    assert e.stats.quiet_launches > sched.n // 4 and e.stats.light_launches > 0
    waited = 0
    for t in short:
        ops = ops_at(f, marks, t)
        assert ops[-1] == ("kernel", t) and not e.planned.at[t]   # nothing to issue there
        assert len(ops) == 1 or (len(ops) == 2 and ops[0][:2] == ("wait", LAUNCH_STREAM)), (t, ops)
        waited += len(ops) == 2
    assert waited == e.stats.light_launches
    # a launch with ranges of its own still waits on their event, recorded on the copy stream after them
    copy = next(x[1] for x in f.log if x[0] == "stream")
    for t in np.flatnonzero(sched.own > 0).tolist():
        ops = ops_at(f, marks, t)
        waits = [x for x in ops if x[0] == "wait" and x[1] == LAUNCH_STREAM]
        if not waits:   # its own ranges are of an allocation this run has not shown yet (left to faults)
            continue
        before = f.log[:marks[t] + ops.index(waits[0])]
        i = max(k for k, x in enumerate(before) if x[0] == "record" and x[1] == waits[0][2])
        assert before[i][2] == copy and before[i - 1][0] in ("gpu", "batch")


def test_a_wait_the_stream_already_covered_is_left_out(jacobi, monkeypatch):
    """Against the engine that waits at every launch needing an earlier group: the same calls, fewer
    waits, and every wait left out is covered by one the stream made before on an event recorded
    later on the copy stream (the copy stream runs in order)."""
    tr, sched = jacobi
    f, e, _ = _run(tr, sched)
    monkeypatch.setattr(E, "QUIET", False)   # the engine before quiet launches: every wait issued
    ref, e_ref, _ = _run(tr, sched)
    assert e.stats.waits_covered > 0 and e_ref.stats.waits_covered == 0

    def strip(log):
        """(the log without the launch stream's waits, [(kernel index, position of the event's last
        record) per such wait])"""
        out, waits, last = [], [], {}
        for x in log:
            if x[0] == "wait" and x[1] == LAUNCH_STREAM:
                waits.append((sum(1 for y in out if y[0] == "kernel"), last[x[2]]))
                continue
            if x[0] == "record":
                last[x[1]] = len(out)
            out.append(x)
        return out, waits

    got, got_w = strip(f.log)
    want, want_w = strip(ref.log)
    assert got == want
    assert len(got_w) < len(want_w)
    for k, rec in want_w:   # before kernel k, the stream waited on something recorded at or after `rec`
        assert any(k2 <= k and rec2 >= rec for k2, rec2 in got_w), (k, rec)


def test_the_simulators_rule_agrees_with_the_engine(jacobi):
    """online/callbacks.py's `waits` (what the simulator's runner charges) against the waits the engine
    made, launch by launch; the launches it calls quiet issue no call in the engine. The engine differs
    only where an allocation is not known yet in the run (its first launches)."""
    tr, sched = jacobi
    f, e, marks = _run(tr, sched)
    work = callback_work(sched)
    waited = np.array([any(x[0] == "wait" and x[1] == LAUNCH_STREAM for x in ops_at(f, marks, t))
                       for t in range(sched.n)])
    calls = np.array([sum(x[0] in CALLS for x in ops_at(f, marks, t)) for t in range(sched.n)])
    assert (waited != work.waits).sum() <= 2
    assert not calls[work.quiet].any()
    assert np.array_equal(work.calls == 0, np.array([not p for p in PlannedCalls(sched, Relocator(tr)).at]))


def test_the_ledger_is_looked_at_within_its_period(jacobi, monkeypatch):
    """A quiet launch takes the full path (the ledger, the fallback) once LEDGER_EVERY_S has passed
    since the last launch that did: with 0, every launch does, as before quiet launches; without a
    ledger (no counters of what moved) it never needs to."""
    tr, sched = jacobi
    monkeypatch.setattr(E, "LEDGER_EVERY_S", 0.0)
    f, e, _ = _run(tr, sched, moved=lambda: [])
    assert e.stats.quiet_launches == 0
    f, e, _ = _run(tr, sched)
    assert e.stats.quiet_launches > 0
