"""Lookahead on the GPU runner, with the stand-in driver: a planned run prefetches the next launch's
footprint one launch early on a copy stream of its own; a launch's stream waits on that launch's
event alone; evictions never precede the last planned use of what they evict."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from pagecast import trace as T
from pagecast.collect.launch_hook import LaunchArgs
from pagecast.replay.gpu import cuda_engine as E
from pagecast.replay.online.ranges import UNIT, RangeArrays, units_of
from pagecast.replay.online.relocate import Relocator
from pagecast.replay.unit_space import managed_bytes
from cuda_standin import FakeCuda

LAUNCH_STREAM = 77   # the workload's stream (FakeCuda numbers its own from 2)


def mk(kernel, words, stream=LAUNCH_STREAM):
    data = struct.pack(f"<{len(words)}Q", *words)
    return LaunchArgs(kernel=kernel, function=0, grid_x=1, grid_y=1, grid_z=1, block_x=1, block_y=1, block_z=1,
                      shared_mem_bytes=0, stream=stream, correlation_id=0,
                      param_offsets=tuple(8 * i for i in range(len(words))), param_sizes=(8,) * len(words),
                      param_data=data, cbid=0)


class Plan:
    """The plan's footprints in this run's addresses (what a laid-out Relocator hands over)."""

    def __init__(self, ranges: list[list[tuple[int, int]]]) -> None:
        self.ranges, self.n, self.matching = ranges, len(ranges), True

    def layout(self):
        return self

    def observe(self, t, kernel, data):
        return True

    def footprint_arrays(self, t):
        return RangeArrays(np.array([x for r in self.ranges[t] for x in r], np.int64))


def cyclic(n_bufs=6, steps=4, cap_units=3):
    f = FakeCuda()
    bufs = [f.alloc_managed(UNIT) for _ in range(n_bufs)]
    seq = [i % n_bufs for i in range(steps * n_bufs)]
    plan = Plan([[(bufs[i], UNIT)] for i in seq])

    def predict(la, allocs):
        return [(struct.unpack_from("<Q", la.param_data)[0], UNIT)]

    e = E.Engine(f, "template", capacity=None if cap_units is None else cap_units * UNIT, predict=predict, ahead=plan)
    marks = []
    for t, i in enumerate(seq):
        marks.append(len(f.log))
        e.on_launch(mk(f"k{i}", [bufs[i]]))
        f.log.append(("kernel", t))
        f.touch(bufs[i], UNIT)
    assert e.stats.errors == 0, e.stats.last_error
    return f, e, bufs, seq, marks


def callback_ops(f, marks, t):
    end = marks[t + 1] if t + 1 < len(marks) else len(f.log)
    return f.log[marks[t]:end]


@pytest.mark.parametrize("cap", [None, 3])
def test_the_next_launchs_prefetch_goes_early_on_the_copy_stream(cap):
    f, e, bufs, seq, marks = cyclic(cap_units=cap)
    streams = [x[1] for x in f.log if x[0] == "stream"]
    copy = streams[0]
    assert all(x[3] == copy for x in f.log if x[0] == "gpu")           # never on the launch's stream
    for t in range(len(seq) - 1):
        ops = callback_ops(f, marks, t)
        nxt = bufs[seq[t + 1]]
        # issued in launch t's callback, before kernel t is queued: before the previous kernel completes
        assert ("gpu", nxt, UNIT, copy) in ops, (t, ops)
        assert ops.index(("gpu", nxt, UNIT, copy)) < len(ops) and ("kernel", t) not in ops[:ops.index(("gpu", nxt, UNIT, copy))]


@pytest.mark.parametrize("cap", [None, 3])
def test_a_launchs_stream_waits_on_its_own_event_alone(cap):
    f, e, bufs, seq, marks = cyclic(cap_units=cap)
    for t in range(1, len(seq)):
        ops = callback_ops(f, marks, t)
        waits = [x for x in ops if x[0] == "wait" and x[1] == LAUNCH_STREAM]
        assert len(waits) == 1, (t, ops)
        ev = waits[0][2]
        # that event was recorded on the copy stream right after launch t's data was prefetched (at t - 1)
        before = callback_ops(f, marks, t - 1)
        i = max(k for k, x in enumerate(before) if x[0] == "gpu" and x[1] == bufs[seq[t]])
        assert before[i + 1][0] == "record" and before[i + 1][1] == ev
        assert not any(x[0] == "record" and x[1] == ev for x in ops[:ops.index(waits[0])])


def test_evictions_never_precede_the_last_planned_use():
    f, e, bufs, seq, marks = cyclic(cap_units=3)
    assert e.stats.evict_bytes > 0
    side = None
    for t in range(len(seq)):
        ops = callback_ops(f, marks, t)
        ev = [x for x in ops if x[0] == "host"]
        if not ev:
            continue
        side = ev[0][3]
        needed = {bufs[seq[t]] // UNIT} | ({bufs[seq[t + 1]] // UNIT} if t + 1 < len(seq) else set())
        assert not units_of([x[1:3] for x in ev]) & needed          # neither this launch's nor the next's
        # the eviction stream waited for the work queued on the launch's stream before this launch
        rec = [x for x in ops if x[0] == "record" and x[2] == LAUNCH_STREAM]
        assert rec and ("wait", side, rec[0][1]) in ops
        assert ops.index(("wait", side, rec[0][1])) < ops.index(ev[0])
        # the evicted units were last used before launch t: kernel t-1 ran (is queued) before it
        for u in units_of([x[1:3] for x in ev]):
            last = max(s for s in range(t) if bufs[seq[s]] // UNIT == u)
            assert last < t
    # the launch's stream never waits on an eviction
    evict_events = {x[1] for x in f.log if x[0] == "record" and x[2] == side}
    assert not any(x[0] == "wait" and x[1] == LAUNCH_STREAM and x[2] in evict_events for x in f.log)


def test_lookahead_moves_fewer_faults_onto_the_kernels():
    """In the stand-in: with the next launch's data brought in early, the kernels find it resident."""
    f, e, *_ = cyclic(cap_units=3)
    assert f.faults == 0


TRACE = Path(__file__).resolve().parent / "data" / "h200" / "jacobi2d-1.pctrace"


def test_the_oracle_looks_ahead_on_a_real_trace():
    """jacobi2d-1 (H200) at 200% (two 2 MiB chunks), the oracle with its trace as the plan: every
    launch's stream waits on one event at most; no eviction takes a unit of the launch, nor of the
    next one where both fit (where they do not, the next launch is brought in at its own callback)."""
    tr = T.read_trace(TRACE)
    shift = 1 << 36
    f = FakeCuda()
    al = tr.allocations
    for a, n in zip(al.column(T.ADDRESS).to_pylist(), al.column(T.BYTES).to_pylist()):
        f.add_allocation(a + shift, n)
    lo = min(al.column(T.ADDRESS).to_pylist())
    hi = max(a + n for a, n in zip(al.column(T.ADDRESS).to_pylist(), al.column(T.BYTES).to_pylist()))
    rel = Relocator(tr)
    e = E.Engine(f, "oracle", capacity=managed_bytes(tr) // 2, relocator=rel, ahead=rel)
    ahead = 0
    rows = tr.launches.select([T.KERNEL, T.PARAM_OFFSETS, T.PARAM_SIZES, T.PARAM_DATA]).to_pylist()
    for t, row in enumerate(rows):
        data = bytearray(row[T.PARAM_DATA] or b"")
        for off, size in zip(row[T.PARAM_OFFSETS], row[T.PARAM_SIZES]):
            if size == 8 and lo <= struct.unpack_from("<Q", data, off)[0] < hi:
                struct.pack_into("<Q", data, off, struct.unpack_from("<Q", data, off)[0] + shift)
        mark = len(f.log)
        e.on_launch(LaunchArgs(kernel=row[T.KERNEL], function=0, grid_x=1, grid_y=1, grid_z=1, block_x=1,
                               block_y=1, block_z=1, shared_mem_bytes=0, stream=LAUNCH_STREAM, correlation_id=t,
                               param_offsets=tuple(row[T.PARAM_OFFSETS]), param_sizes=tuple(row[T.PARAM_SIZES]),
                               param_data=bytes(data), cbid=0))
        ops = f.log[mark:]
        assert len([x for x in ops if x[0] == "wait" and x[1] == LAUNCH_STREAM]) <= 1
        own = units_of(rel.footprint_arrays(t))
        nxt = units_of(rel.footprint_arrays(t + 1)) if t + 1 < rel.n else set()
        gone = units_of([x[1:3] for x in ops if x[0] == "host"])
        assert not gone & own
        if len(own | nxt) <= e.residency.capacity_units:   # looked ahead: the next launch's are kept too
            assert not gone & nxt
            ahead += 1
    assert e.stats.errors == 0, e.stats.last_error
    assert ahead > 0 and not any(x[0] == "gpu" and x[3] == LAUNCH_STREAM for x in f.log)


def test_with_a_plan_template_evicts_by_the_plans_next_use(tmp_path):
    """Template's victims go by predicted next use (the period); with a lookahead schedule the plan
    knows the next uses, and the residency estimate scores victims by them (Belady on the plan)."""
    from dataclasses import replace

    from pagecast.predict.fit import fit_model
    from pagecast.replay.online.decide import LaunchDecider
    from pagecast.replay.online.lookahead import lookahead_for
    from pagecast.replay.online.prediction import make_online_predict
    from pagecast.replay.online.ranges import AllocationMap
    from pagecast.replay.policies import online_policy

    tr = T.read_trace(TRACE)
    model = fit_model([tr])
    pol = online_policy("template")
    sched = lookahead_for(pol, tr, model=model)
    f = FakeCuda()
    kw = dict(capacity=managed_bytes(tr) // 2, predict=make_online_predict(model, "none"))
    with_plan = LaunchDecider(pol, AllocationMap(f.allocation_of), ahead=sched, **kw)
    assert with_plan.residency.victim == "belady"
    assert with_plan.residency.next_use is not None          # scored from the plan's footprints
    without = LaunchDecider(pol, AllocationMap(f.allocation_of), ahead=replace(sched, plan_victims=False), **kw)
    assert without.residency.victim == "next-use"
    alone = LaunchDecider(pol, AllocationMap(f.allocation_of), **kw)
    assert alone.residency.victim == "next-use"
