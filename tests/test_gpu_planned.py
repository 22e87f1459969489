"""A planned run on the GPU runner, with the stand-in driver: the engine carries out the plan's
`PlanSchedule` (the object the simulator's `runner` carries out): at each callback exactly the
groups due, on the copy stream (evictions on their own stream), in this run's addresses; the
launch's stream waits on its own event alone; index-value gated ranges only after the work queued
before their callback; the ledger's safety net evicts where what moved exceeds the capacity."""

from __future__ import annotations

import struct
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from pagecast import trace as T
from pagecast.collect.launch_hook import LaunchArgs
from pagecast.replay.gpu import cuda_engine as E
from pagecast.replay.online.plan_schedule import PlanSchedule
from pagecast.replay.online.planned import PlannedCalls, schedule_from_plan
from pagecast.replay.online.ranges import UNIT
from pagecast.replay.online.relocate import Relocator
from pagecast.replay.unit_space import managed_bytes
from cuda_standin import FakeCuda

LAUNCH_STREAM = 77
SHIFT = 1 << 36
TRACE = Path(__file__).resolve().parent / "data" / "h200" / "jacobi2d-1.pctrace"


def shifted_rows(tr):
    al = tr.allocations
    lo = min(al.column(T.ADDRESS).to_pylist())
    hi = max(a + n for a, n in zip(al.column(T.ADDRESS).to_pylist(), al.column(T.BYTES).to_pylist()))
    rows = tr.launches.select([T.KERNEL, T.PARAM_OFFSETS, T.PARAM_SIZES, T.PARAM_DATA]).to_pylist()
    for t, row in enumerate(rows):
        data = bytearray(row[T.PARAM_DATA] or b"")
        for off, size in zip(row[T.PARAM_OFFSETS], row[T.PARAM_SIZES]):
            if size == 8 and lo <= struct.unpack_from("<Q", data, off)[0] < hi:
                struct.pack_into("<Q", data, off, struct.unpack_from("<Q", data, off)[0] + SHIFT)
        yield t, LaunchArgs(kernel=row[T.KERNEL], function=0, grid_x=1, grid_y=1, grid_z=1, block_x=1, block_y=1,
                            block_z=1, shared_mem_bytes=0, stream=LAUNCH_STREAM, correlation_id=t,
                            param_offsets=tuple(row[T.PARAM_OFFSETS]), param_sizes=tuple(row[T.PARAM_SIZES]),
                            param_data=bytes(data), cbid=0)


def fake_for(tr, **kw):
    f = FakeCuda(**kw)
    al = tr.allocations
    for a, n in zip(al.column(T.ADDRESS).to_pylist(), al.column(T.BYTES).to_pylist()):
        f.add_allocation(a + SHIFT, n)
    return f


def run(tr, sched: PlanSchedule, policy="template", capacity=None, f=None, moved=False):
    rel = Relocator(tr)
    f = f or fake_for(tr)
    pc = PlannedCalls(sched, rel)
    e = E.Engine(f, policy, capacity=capacity, relocator=rel if policy == "oracle" else None,
                 predict=(lambda la, allocs: []) if policy == "template" else None, planned=pc,
                 moved=(lambda: f.migrations[len(f.migrations):]) if moved else None)
    marks = []
    for t, la in shifted_rows(tr):
        marks.append(len(f.log))
        e.on_launch(la)
        f.log.append(("kernel", t))
    assert e.stats.errors == 0, e.stats.last_error
    return f, e, marks


def ops_at(f, marks, t):
    return f.log[marks[t]:marks[t + 1] if t + 1 < len(marks) else len(f.log)]


@pytest.fixture(scope="module")
def jacobi():
    from pagecast.predict.fit import fit_model
    from pagecast.replay.sim.sweep import make_plan

    tr = T.read_trace(TRACE)
    plan = make_plan(fit_model([tr]), tr, capacity=managed_bytes(tr) // 2)
    return tr, schedule_from_plan(plan.table, plan.launches, tr, Relocator(tr))


def first_seen(tr) -> dict[int, int]:
    """Trace allocation -> the first launch passing a pointer into it (when this run learns where it is)."""
    rel = Relocator(tr).layout()
    out: dict[int, int] = {}
    for t, ws in enumerate(rel._words):
        for _, j, _ in ws:
            out.setdefault(j, t)
    return out


def test_the_engine_issues_exactly_the_schedules_groups(jacobi):
    """Each group at the callback the schedule issues it at (the launch before; its own where it
    waits for that launch), or, for a range whose allocation no launch has pointed into yet, at its
    launch's own callback: exactly the schedule's ranges, in this run's addresses."""
    tr, sched = jacobi
    assert len(sched.pf) and len(sched.ev) and not (sched.pf_after >= 0).any()
    f, e, marks = run(tr, sched, capacity=managed_bytes(tr) // 2)
    copy = next(x[1] for x in f.log if x[0] == "stream")
    seen, rel = first_seen(tr), Relocator(tr)
    want_pf: dict[int, Counter] = {}
    want_ev: dict[int, Counter] = {}
    for lid in range(sched.n):
        p = sched.at(lid)
        c0 = sched.issued_at(lid)
        for rows, want, need in ((p.prefetch, want_pf, sched.pf_needed_by[sched.pf_ptr[lid]:]),
                                 (p.evict, want_ev, None)):
            for k, (a, n) in enumerate(rows.tolist()):
                j = rel.find_alloc(a, lid if need is None else int(need[k]))
                c = c0 if seen.get(j, 1 << 60) <= c0 else lid if seen.get(j, 1 << 60) <= lid else None
                if c is not None:
                    want.setdefault(c, Counter())[(a + SHIFT, n)] += 1
    for t in range(sched.n):
        ops = ops_at(f, marks, t)
        assert all(x[3] == copy for x in ops if x[0] == "gpu")          # never on the launch's stream
        assert all(x[3] != LAUNCH_STREAM for x in ops if x[0] == "host")
        assert Counter((x[1], x[2]) for x in ops if x[0] == "gpu") == want_pf.get(t, Counter()), t
        assert Counter((x[1], x[2]) for x in ops if x[0] == "host") == want_ev.get(t, Counter()), t
    assert e.stats.prefetch_bytes == sum(n for c in want_pf.values() for (_, n), k in c.items() for _ in range(k))
    # most of it ahead: at the callback before its launch
    assert e.stats.ahead_launches > 0


def test_a_launchs_stream_waits_on_its_own_event_alone(jacobi):
    tr, sched = jacobi
    f, e, marks = run(tr, sched, capacity=managed_bytes(tr) // 2)
    copy = next(x[1] for x in f.log if x[0] == "stream")
    for t in range(sched.n):
        ops = ops_at(f, marks, t)
        waits = [x for x in ops if x[0] == "wait" and x[1] == LAUNCH_STREAM]
        assert len(waits) <= 1, (t, ops)
        if sched.own[t] == 0 and sched.waits_for[t] < 0:
            assert not waits, t
            continue
        if not waits:   # the stream waited on a later event of the copy stream before (test_gpu_quiet.py)
            assert sched.own[t] == 0 and e.stats.waits_covered > 0, t
            continue
        ev = waits[0][2]
        # the last recording of that event before the wait was on the copy stream, right after one of
        # launch t's own ranges (or, with none of its own, a range of the group it waits for)
        before = f.log[:marks[t] + ops.index(waits[0])]
        i = max(k for k, x in enumerate(before) if x[0] == "record" and x[1] == ev)
        assert before[i][2] == copy and before[i - 1][0] in ("gpu", "batch")
        if sched.own[t]:
            mine = {(int(a) + SHIFT, int(n)) for a, n in sched.at(t).prefetch[:sched.own[t]].tolist()}
            assert (before[i - 1][1], before[i - 1][2]) in mine


def test_index_value_gates_wait_for_the_work_queued_before():
    """A range gated on launch 0's values (after = 0) of launch 2's group goes at callback 1 (issued
    ahead), after the copy stream waited for the work queued on the launch's stream then."""
    tr = T.read_trace(TRACE)
    j = min(j for j, t in first_seen(tr).items() if t == 0)   # an allocation launch 0 points into
    a0, page = int(tr.allocations.column(T.ADDRESS)[j].as_py()), 4096
    sched = PlanSchedule(tr.n_launches, [2, 2], [False, False], [a0, a0 + page], [page, page], [2, 2], [-1, 0])
    f, e, marks = run(tr, sched)
    ops = ops_at(f, marks, 1)
    copy = next(x[1] for x in f.log if x[0] == "stream")
    gpu = [x for x in ops if x[0] == "gpu"]
    assert [(x[1], x[2]) for x in gpu] == [(a0 + SHIFT, page), (a0 + SHIFT + page, page)]
    rec = [x for x in ops if x[0] == "record" and x[2] == LAUNCH_STREAM]
    assert rec and ops.index(("wait", copy, rec[0][1])) < ops.index(gpu[1])
    assert ops.index(gpu[0]) < ops.index(("wait", copy, rec[0][1]))   # the ungated one does not wait
    # launch 2 waits on the event after its last own range only
    waits = [x for x in ops_at(f, marks, 2) if x[0] == "wait" and x[1] == LAUNCH_STREAM]
    assert len(waits) == 1 and ops[ops.index(gpu[1]) + 1] == ("record", waits[0][2], copy)


def test_batched_where_the_driver_has_it(jacobi):
    tr, sched = jacobi
    f = fake_for(tr, batch=frozenset({"cuMemPrefetchBatchAsync"}))
    f2, e, marks = run(tr, sched, capacity=managed_bytes(tr) // 2, f=f)
    assert e.stats.batch_calls > 0
    got = Counter(r for x in f.log if x[0] == "batch" and x[2] for r in x[1])
    got += Counter((x[1], x[2]) for x in f.log if x[0] == "gpu")
    one, _, _ = run(tr, sched, capacity=managed_bytes(tr) // 2)   # the driver without batched calls
    assert got == Counter((x[1], x[2]) for x in one.log if x[0] == "gpu")
    assert not any(x[0] == "batch" for x in one.log)


def test_the_ledger_evicts_where_what_moved_exceeds_the_capacity():
    """The plan brings in more than the capacity (a plan made for a larger GPU): what moved, as the
    counters report it, goes over, and the launch's room is made as without a plan."""
    tr = T.read_trace(TRACE)
    al = tr.allocations
    rows = [(0, a, n) for a, n in zip(al.column(T.ADDRESS).to_pylist(), al.column(T.BYTES).to_pylist())]
    sched = PlanSchedule(tr.n_launches, [r[0] for r in rows], [False] * len(rows), [r[1] for r in rows],
                         [r[2] for r in rows], [0] * len(rows))
    f = fake_for(tr)
    seen = [0]

    def moved():
        new = f.migrations[seen[0]:]
        seen[0] = len(f.migrations)
        return new
    rel = Relocator(tr)
    e = E.Engine(f, "oracle", capacity=2 * UNIT, relocator=rel, planned=PlannedCalls(sched, rel), moved=moved)
    for t, la in shifted_rows(tr):
        e.on_launch(la)
    assert e.stats.errors == 0, e.stats.last_error
    assert e.stats.plan_fallbacks > 0 and e.stats.evict_bytes > 0
    assert np.isfinite(e.stats.max_excess_bytes)


def test_the_child_carries_out_a_plan_file(tmp_path, monkeypatch, jacobi):
    """`--plan` through the child: the plan file's schedule, carried out (every range of it issued,
    in this run's addresses, none on the launch's stream); `--no-lookahead` decides launch by launch."""
    import json

    from pagecast.predict.fit import fit_model
    from pagecast.predict.model_io import save_model
    from pagecast.replay.gpu import child as C
    from pagecast.replay.request import ReplayRequest
    from pagecast.replay.sim.sweep import make_plan
    from cuda_standin import FakeHook, FakeMonitor
    from test_gpu_lookahead_child import _workload

    tr, _ = jacobi
    cap = managed_bytes(tr) // 2
    model = fit_model([tr])
    save_model(model, tmp_path / "m.json", force=True)
    plan = make_plan(model, tr, capacity=cap)
    plan.save(tmp_path / "p.plan")
    outs = []
    for lookahead in (True, False):
        f = FakeCuda()
        script = _workload(tr, f, monkeypatch, tmp_path)
        req = ReplayRequest(backend="gpu", policies=("template",), traces=(str(TRACE),), model=str(tmp_path / "m.json"),
                            plan=str(tmp_path / "p.plan"), capacity=(cap,), workload=("python", str(script)),
                            lookahead=lookahead)
        job, res = tmp_path / "job.json", tmp_path / "r.json"
        job.write_text(C.ChildJob(request=req, result=str(res)).to_json())
        assert C.child_main([str(job)], cuda=f, monitor=FakeMonitor(f), hook_factory=FakeHook) == 0
        out = json.loads(res.read_text())
        assert out.get("error") is None, out
        outs.append((f, out))
    (f, out), (_, off) = outs
    assert out["planned"] and not off["planned"]
    assert out["quiet_launches"] > 0 and off["quiet_launches"] == 0   # launches with nothing due, returned at once
    sched = schedule_from_plan(plan.table, plan.launches, tr, Relocator(tr))
    issued = Counter((x[1] - SHIFT, x[2]) for x in f.log if x[0] == "gpu")
    assert issued and issued <= Counter(tuple(r) for r in sched.pf.tolist())
    assert not any(x[0] == "gpu" and x[3] == 77 for x in f.log)


def test_dead_data_is_discarded_where_the_driver_has_the_call(jacobi):
    """The trace's dead data (lookahead.dead_of, data never freed counted too here) is discarded at the
    callback after its last use, on the eviction stream after the work queued before the launch;
    without cuMemDiscardBatchAsync nothing is discarded."""
    from pagecast.replay.online.lookahead import dead_of

    tr, sched = jacobi
    rel = Relocator(tr)
    dead = dead_of(rel.layout(), tr, discard_unfreed=True)
    assert dead is not None
    for batch, want in ((frozenset({"cuMemDiscardBatchAsync"}), True), (frozenset(), False)):
        f = fake_for(tr, batch=batch)
        rel = Relocator(tr)
        e = E.Engine(f, "template", capacity=managed_bytes(tr) // 2, predict=lambda la, allocs: [],
                     planned=PlannedCalls(sched, rel, dead=dead))
        marks = []
        for t, la in shifted_rows(tr):
            marks.append(len(f.log))
            e.on_launch(la)
        assert e.stats.errors == 0, e.stats.last_error
        got = [(t, x) for t in range(sched.n) for x in ops_at(f, marks, t) if x[0] == "discard"]
        assert bool(got) == want
        for t, x in got:
            ptr, ids = dead
            assert set(x[1]) == {(int(rel.a_addr[j]) + SHIFT, int(rel.a_bytes[j])) for j in ids[ptr[t]:ptr[t + 1]]}
            ops = ops_at(f, marks, t)
            rec = next(o for o in ops if o[0] == "record" and o[2] == LAUNCH_STREAM)
            assert ops.index(("wait", x[2], rec[1])) < ops.index(x)
