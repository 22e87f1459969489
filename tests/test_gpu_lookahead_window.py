"""The lookahead's window, depth and dead data, with the stand-in driver: how far ahead follows the
cost profile and the trace's kernel times, bounded by the capacity; dead data (a freed temporary
after its last use) is discarded with cuMemDiscardBatchAsync only where the driver has it; the
compiled window step makes the Python step's decisions one launch ahead."""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest

from pagecast import trace as T
from pagecast.collect.launch_hook import LaunchArgs
from pagecast.replay.gpu import cuda_engine as E
from pagecast.replay.online import decide as D
from pagecast.replay.online import lookahead as L
from pagecast.replay.online.ranges import UNIT, units_of
from pagecast.replay.online.relocate import Relocator
from pagecast.replay.policies import online_policy
from pagecast.replay.unit_space import managed_bytes
from cuda_standin import FakeCuda
from test_gpu_lookahead import LAUNCH_STREAM, Plan, callback_ops, mk

TRACE = Path(__file__).resolve().parent / "data" / "h200" / "jacobi2d-1.pctrace"
BATCH = frozenset({"cuMemPrefetchBatchAsync", "cuMemDiscardBatchAsync", "cuMemDiscardAndPrefetchBatchAsync"})
SHIFT = 1 << 36


# -- depth from the costs ---------------------------------------------------------------------------
def toy(units: list[list[int]], kernel_us: float):
    """Launch i touching the 2 MiB units units[i] (whole), each kernel `kernel_us` long."""
    n = len(units)
    ind = np.zeros(n + 1, np.int64)
    np.cumsum([len(u) for u in units], out=ind[1:])
    st = np.array([u for us in units for u in us], np.int64) * UNIT
    plan = SimpleNamespace(n=n, fp_indptr=ind, fp_start=st, fp_end=st + UNIT)
    start = np.arange(n, dtype=np.int64) * int(kernel_us * 1000)
    trace = SimpleNamespace(launches=pa.table({T.START_NS: start, T.END_NS: start + int(kernel_us * 1000)}))
    return plan, trace


def costs(us_per_unit: float, per_call_us: float = 0.0):
    return SimpleNamespace(htod_bandwidth=UNIT / (us_per_unit * 1e-6), transfer_latency_s=per_call_us * 1e-6)


def test_the_depth_follows_the_costs():
    # a new unit each launch, 100 us kernels: one launch ahead whether the copies are shorter than
    # the kernels or longer (then the copy stream is never idle: an earlier call gains nothing)
    plan, trace = toy([[i] for i in range(6)], 100.0)
    assert L.depth_of(plan, trace, costs(50.0)).tolist() == [1] * 6
    assert L.depth_of(plan, trace, costs(150.0)).tolist() == [1] * 6
    # three launches on what is resident, then one that needs three new units (300 us): its copy
    # goes while the copy stream is idle, from launch 0's callback on
    plan, trace = toy([[0], [0], [0], [1, 2, 3], [0], [0]], 100.0)
    assert L.depth_of(plan, trace, costs(100.0)).tolist() == [1, 1, 1, 3, 1, 1]
    # cheap copies: one launch ahead is enough; the per-call cost counts as the bytes do
    assert L.depth_of(plan, trace, costs(10.0)).tolist() == [1] * 6
    assert L.depth_of(plan, trace, costs(10.0, per_call_us=250.0)).tolist() == [1, 1, 1, 3, 1, 1]
    # the launch that brings unit 0 back after it: the copy stream is free again by then
    slow = L.depth_of(plan, trace, costs(1000.0))
    assert slow.tolist()[3] == 3 and slow.max() <= L.MAX_DEPTH


def test_without_kernel_times_or_costs_one_launch_ahead():
    plan, trace = toy([[0], [1], [2], [3]], 0.0)
    assert L.depth_of(plan, trace, costs(150.0)) is None
    tr = T.read_trace(TRACE)
    sched = L.lookahead_for(online_policy("oracle"), tr)
    assert sched.horizon is None and sched.depth == 1
    assert sched.horizon_at(5, tr.n_launches) == 6


def test_the_horizon_stops_before_an_indexed_launch():
    d = np.array([1, 1, 3, 3, 3, 1], np.int64)
    # launch s is brought in at launch max(s - depth[s], 0)'s callback; a callback's horizon is the
    # furthest launch brought in by then
    assert L.horizon_of(d, frozenset()).tolist() == [3, 4, 4, 4, 5, 5]
    # launch 3 is indexed: no window before it reaches it (it comes at its own callback)
    assert L.horizon_of(d, frozenset({3})).tolist() == [2, 2, 2, 4, 5, 5]


def cyclic_window(horizon, cap_units):
    """test_gpu_lookahead's cyclic run (six buffers, one a launch) with a window per launch."""
    f = FakeCuda()
    bufs = [f.alloc_managed(UNIT) for _ in range(6)]
    seq = [i % 6 for i in range(24)]
    plan = Plan([[(bufs[i], UNIT)] for i in seq])
    sched = L.Lookahead(plan, frozenset(), depth=int(max(np.asarray(horizon) - np.arange(len(seq)))),
                        horizon=np.asarray(horizon, np.int64), plan_victims=False)   # the stand-in plan scores nothing
    e = E.Engine(f, "template", capacity=cap_units * UNIT, ahead=sched,
                 predict=lambda la, allocs: [(struct.unpack_from("<Q", la.param_data)[0], UNIT)])
    marks = []
    for t, i in enumerate(seq):
        marks.append(len(f.log))
        e.on_launch(mk(f"k{i}", [bufs[i]]))
        f.log.append(("kernel", t))
        f.touch(bufs[i], UNIT)
    assert e.stats.errors == 0, e.stats.last_error
    return f, e, bufs, seq, marks


@pytest.mark.parametrize("cap, reach", [(4, 2), (3, 2), (2, 1)])
def test_a_deeper_window_goes_as_far_as_the_capacity_allows(cap, reach):
    """Horizon t + 2 at every launch: launch t's callback brings in t + 2's buffer while both fit
    beside launch t (three units); with room for two, only t + 1 comes early."""
    n = 24
    horizon = np.minimum(np.arange(n) + 2, n - 1)
    f, e, bufs, seq, marks = cyclic_window(horizon, cap)
    copy = [x[1] for x in f.log if x[0] == "stream"][0]
    for t in range(4, n - 2):
        ops = callback_ops(f, marks, t)
        far = ("gpu", bufs[seq[t + reach]], UNIT, copy)
        assert far in ops and ("kernel", t) not in ops[:ops.index(far)], (t, ops)
        if reach == 1:   # t + 2's buffer does not come before its own window
            assert ("gpu", bufs[seq[t + 2]], UNIT, copy) not in ops
        # the launch's stream waits on one event, recorded after its buffer's prefetch
        waits = [x for x in ops if x[0] == "wait" and x[1] == LAUNCH_STREAM]
        assert len(waits) == 1, (t, ops)
    assert f.faults == 0


# -- dead data ----------------------------------------------------------------------------------------
def shifted(tr):
    al = tr.allocations
    lo = min(al.column(T.ADDRESS).to_pylist())
    hi = max(a + n for a, n in zip(al.column(T.ADDRESS).to_pylist(), al.column(T.BYTES).to_pylist()))
    out = []
    for t, row in enumerate(tr.launches.select([T.KERNEL, T.PARAM_OFFSETS, T.PARAM_SIZES, T.PARAM_DATA]).to_pylist()):
        data = bytearray(row[T.PARAM_DATA] or b"")
        for off, size in zip(row[T.PARAM_OFFSETS], row[T.PARAM_SIZES]):
            if size == 8 and lo <= struct.unpack_from("<Q", data, off)[0] < hi:
                struct.pack_into("<Q", data, off, struct.unpack_from("<Q", data, off)[0] + SHIFT)
        out.append(LaunchArgs(kernel=row[T.KERNEL], function=0, grid_x=1, grid_y=1, grid_z=1, block_x=1,
                              block_y=1, block_z=1, shared_mem_bytes=0, stream=LAUNCH_STREAM, correlation_id=t,
                              param_offsets=tuple(row[T.PARAM_OFFSETS]), param_sizes=tuple(row[T.PARAM_SIZES]),
                              param_data=bytes(data), cbid=0))
    return out


def oracle_run(batch, discard_unfreed=False, capacity_of=2):
    tr = T.read_trace(TRACE)
    f = FakeCuda(batch=batch)
    al = tr.allocations
    for a, n in zip(al.column(T.ADDRESS).to_pylist(), al.column(T.BYTES).to_pylist()):
        f.add_allocation(a + SHIFT, n)
    rel = Relocator(tr)
    sched = L.lookahead_for(online_policy("oracle"), tr, relocator=rel, discard_unfreed=discard_unfreed)
    e = E.Engine(f, "oracle", capacity=managed_bytes(tr) // capacity_of, relocator=rel, ahead=sched)
    marks = []
    for la in shifted(tr):
        marks.append(len(f.log))
        e.on_launch(la)
    assert e.stats.errors == 0, e.stats.last_error
    return tr, f, e, marks


def last_uses(tr) -> dict[int, int]:
    """Trace allocation base -> the last launch whose footprint or arguments touch it."""
    rel = Relocator(tr)
    out: dict[int, int] = {}
    for t in range(tr.n_launches):
        for a, n in rel.trace_ranges(t):
            j = rel.find_alloc(a, t)
            if j is not None:
                out[int(rel.a_addr[j])] = t
        for w in (struct.unpack_from(f"<{len(rel.param_data[t]) // 8}Q", rel.param_data[t]) if rel.param_data[t] else ()):
            j = rel.find_alloc(w, t)
            if j is not None:
                out[int(rel.a_addr[j])] = max(out.get(int(rel.a_addr[j]), -1), t)
    return out


def test_a_freed_temporary_is_discarded_after_its_last_use():
    tr, f, e, marks = oracle_run(BATCH)
    freed = {a: lst is not None for a, lst in zip(tr.allocations.column(T.ADDRESS).to_pylist(),
                                                   tr.allocations.column(T.LAST_LAUNCH).to_pylist())}
    last = last_uses(tr)
    seen = 0
    for t in range(len(marks)):
        ops = callback_ops(f, marks, t)
        for x in ops:
            if x[0] != "discard":
                continue
            seen += 1
            side = x[2]
            for a, n in x[1]:
                base = a - SHIFT
                assert freed[base], "only freed allocations are discarded by default"
                assert last[base] < t, (t, base, last[base])        # after its last use, never before
            # on the eviction stream, after the work queued before launch t
            rec = [y for y in ops if y[0] == "record" and y[2] == LAUNCH_STREAM]
            assert rec and ops.index(("wait", side, rec[0][1])) < ops.index(x)
    assert seen > 0 and e.stats.discards == seen and e.stats.discard_bytes > 0
    # what was discarded was not copied back
    gone = {a for x in f.log if x[0] == "discard" for a, _ in x[1]}
    assert not any(x[0] in ("host",) and x[1] in gone for x in f.log)


@pytest.mark.parametrize("batch", [frozenset(), frozenset({"cuMemPrefetchBatchAsync"})])
def test_nothing_is_discarded_where_the_driver_lacks_the_call(batch):
    tr, f, e, marks = oracle_run(batch)
    assert not [x for x in f.log if x[0] == "discard"] and e.stats.discards == 0
    # the data stays on the GPU, left to eviction: the residency estimate keeps counting it
    assert not e.decider.discards


def test_data_never_freed_is_discarded_only_when_asked():
    tr = T.read_trace(TRACE)
    rel = Relocator(tr)
    never = ~np.asarray(tr.allocations.column(T.LAST_LAUNCH).is_valid(), bool)
    plain = L.dead_of(rel, tr)
    assert plain is not None and not never[plain[1]].any()
    asked = L.dead_of(rel, tr, discard_unfreed=True)
    if never[asked[1]].any():
        assert set(plain[1].tolist()) < set(asked[1].tolist())
    else:   # this trace's never-freed data is used up to its last launch: nothing more to discard
        assert set(plain[1].tolist()) == set(asked[1].tolist())


def test_a_host_read_after_the_last_use_keeps_the_data():
    """A device-to-host fault migration (the host read it) after the last use: not dead."""
    tr = T.read_trace(TRACE)
    rel = Relocator(tr)
    base = L.dead_of(rel, tr)
    j = int(base[1][0])
    m = tr.migrations
    row = {c: m.column(c)[0].as_py() for c in m.column_names}
    row.update({T.ADDRESS: int(rel.a_addr[j]), T.DIRECTION: "dtoh", T.CAUSE: "coherence",
                T.START_NS: int(tr.launches.column(T.START_NS)[tr.n_launches - 1].as_py())})
    extra = pa.Table.from_pylist([row], schema=m.schema)
    tr2 = SimpleNamespace(migrations=pa.concat_tables([m, extra]), launches=tr.launches,
                          allocations=tr.allocations)
    read = L._host_reads_after(tr2, rel, np.where(np.arange(len(rel.a_addr)) == j, 0, -1))
    assert read[j] and read.sum() == 1


# -- the compiled step makes the Python step's decisions ---------------------------------------------
@pytest.mark.parametrize("cap_div", [None, 2, 1])
def test_the_compiled_window_step_decides_as_the_python_step(cap_div, monkeypatch):
    from pagecast.replay.online.ranges import AllocationMap, merge_ranges

    tr = T.read_trace(TRACE)
    las = shifted(tr)
    runs = {}
    for step in ("python", "compiled"):
        monkeypatch.setattr(D, "LOOKAHEAD_STEP", step)
        f = FakeCuda()
        al = tr.allocations
        for a, n in zip(al.column(T.ADDRESS).to_pylist(), al.column(T.BYTES).to_pylist()):
            f.add_allocation(a + SHIFT, n)
        rel = Relocator(tr)
        sched = dataclasses.replace(L.lookahead_for(online_policy("oracle"), tr, relocator=rel), dead=None)
        dec = D.LaunchDecider(online_policy("oracle"), AllocationMap(f.allocation_of), relocator=rel, ahead=sched,
                              capacity=None if cap_div is None else managed_bytes(tr) // cap_div)
        runs[step] = [(merge_ranges(d.prefetch), merge_ranges(d.evict), merge_ranges(d.ahead or []))
                      for d in (dec.decide(t, la) for t, la in enumerate(las))]
    assert runs["python"] == runs["compiled"]
    assert any(x[2] for x in runs["compiled"])


def test_the_plans_belady_scores_in_one_call_match_one_at_a_time():
    tr = T.read_trace(TRACE)
    rel = Relocator(tr).layout()
    las = shifted(tr)
    sc = rel.next_use_scorer(UNIT)
    for t, la in enumerate(las):
        rel.observe(t, la.kernel, la.param_data)
        if t % 9 == 0:
            units = np.array(sorted(units_of(rel.footprint_arrays(t)) | {(SHIFT >> 21) + 1, 0}), np.int64)
            assert sc.scores(units, t).tolist() == [sc.score(int(u), t) for u in units]
