"""The GPU replay runner's CPU-testable parts, with cuda_iface's stand-in (FakeCuda).

Ranges, allocation lookup, period detection, next-use prediction, the
residency estimate and victim choice, relocation of a trace's footprints, the
order of evictions / prefetches / waits per launch, argument handling, the
child run (with a stand-in hook and workload) and the no-GPU failure.
"""

from __future__ import annotations

import json
from pathlib import Path
import struct
import time
import sys
import types
from argparse import Namespace

import pytest

from pagecast import trace as T
from pagecast.collect.launch_hook import CB_cuLaunchKernel_ptsz, LaunchArgs
from pagecast.errors import NoGPUError, UsageError
from pagecast.replay.gpu import child as C
from pagecast.replay.gpu import cuda_engine as E
from pagecast.replay.online import relocate as O
from pagecast.replay.online import ranges as R
from pagecast.replay.online import residency as RS
from pagecast.replay.commands import replay_request
from pagecast.replay.plan.sample import CHOOSE_ON
from pagecast.replay.request import ReplayRequest
from pagecast.replay.gpu import backend as G
from pagecast.replay.gpu import prefetching as PF
from pagecast.replay.policies import add_relative
from cuda_standin import FakeCuda, FakeHook, FakeMonitor
from pagecast.replay.gpu.driver import no_gpu_reason

MiB = 2**20
UNIT = R.UNIT


HAS_GPU = no_gpu_reason() is None


def mk_launch(kernel: str, words: list[int], *, stream: int = 7, corr: int = 0, cbid: int = 0) -> LaunchArgs:
    data = struct.pack(f"<{len(words)}Q", *words)
    return LaunchArgs(kernel=kernel, function=0, grid_x=1, grid_y=1, grid_z=1, block_x=256, block_y=1, block_z=1,
                      shared_mem_bytes=0, stream=stream, correlation_id=corr,
                      param_offsets=tuple(8 * i for i in range(len(words))), param_sizes=(8,) * len(words),
                      param_data=data, cbid=cbid)


# ---- ranges and allocations ---------------------------------------------------

def test_merge_ranges_merges_touching_and_overlapping():
    assert R.merge_ranges([(10, 5), (0, 10), (30, 1), (31, 0), (20, 15)]) == [(0, 15), (20, 15)]
    assert R.merge_ranges([]) == []


def test_split_by_unit_and_units_of():
    parts = R.split_by_unit([(UNIT - 100, 300)], UNIT)
    assert parts == {0: [(UNIT - 100, 100)], 1: [(UNIT, 200)]}
    assert R.units_of([(0, 1), (3 * UNIT, UNIT + 1)], UNIT) == {0, 3, 4}


def test_subtract_ranges():
    assert R.subtract_ranges([(0, 100)], [(10, 10), (50, 60)]) == [(0, 10), (20, 30)]
    assert R.subtract_ranges([(0, 10), (20, 10)], []) == [(0, 10), (20, 10)]
    assert R.subtract_ranges([(0, 10)], [(0, 10)]) == []
    assert R.subtract_ranges([(5, 10), (30, 5)], [(0, 7), (32, 100)]) == [(7, 8), (30, 2)]


def test_residency_missing_is_what_a_prefetch_must_still_move():
    r = RS.Residency(10 * UNIT, UNIT, "fifo")
    r.admit([(0, 4096), (UNIT, UNIT)], 0)
    assert r.missing([(0, 8192), (UNIT + 100, 50), (5 * UNIT, 10)]) == [(4096, 4096), (5 * UNIT, 10)]


def test_allocation_map_caches_and_clips_to_managed_allocations():
    f = FakeCuda()
    f.add_allocation(1 << 40, 4 * MiB)
    f.add_allocation((1 << 40) + 8 * MiB, 2 * MiB, managed=False)
    calls = []

    def lookup(a):
        calls.append(a)
        return f.allocation_of(a)

    am = R.AllocationMap(lookup)
    base = 1 << 40
    assert am.find(base + 100).base == base
    assert am.find(base + 200).base == base and len(calls) == 1   # cached
    assert am.find(base + 5 * MiB) is None and am.find(base + 5 * MiB) is None and len(calls) == 2
    # a predicted range that runs past its allocation, one in device memory, one nowhere
    got = am.clip([(base + MiB, 8 * MiB), (base + 8 * MiB, MiB), (base + 20 * MiB, MiB)])
    assert got == [(base + MiB, 3 * MiB)]


def test_pointer_words_and_allocation_ranges():
    f = FakeCuda()
    base = 1 << 40
    f.add_allocation(base, 3 * MiB)
    data = struct.pack("<QQI", base + 4096, 1000, 7) + b"\0" * 4
    assert R.pointer_words(data) == [base + 4096]          # 1000 is too small to be a pointer
    am = R.AllocationMap(f.allocation_of)
    assert R.allocation_ranges(data, am) == [(base, 3 * MiB)]


# ---- next-use prediction ---------------------------------------------------------

def test_period_detector_finds_the_step_of_an_iterative_workload():
    d = RS.PeriodDetector(min_match=8, search_every=1)
    step = ["embed", "attn", "mlp", "attn", "mlp", "head"]
    got = [d.observe(k) for k in step * 6]
    assert got[-1] == 6
    assert got[5] is None                      # one step alone proves nothing
    d.observe("something-else")
    assert d.period is None                    # broken, until it repeats again


def test_period_detector_finds_a_long_step_soon_after_it_repeated():
    import random

    rng = random.Random(1)
    step = [f"k{rng.randrange(40)}" for _ in range(300)]
    d = RS.PeriodDetector()
    first = next(i for i in range(2000) if d.observe(step[i % 300]) is not None)
    assert d.period == 300 and first < 2 * 300 + 32 * 8
    # random launches: no period is claimed
    d = RS.PeriodDetector()
    assert all(d.observe(f"k{rng.randrange(40)}") is None for _ in range(3000))


def test_sequence_next_use_predicts_from_the_last_period_and_falls_back_to_lru():
    d = RS.PeriodDetector(min_match=4, search_every=1)
    nu = RS.SequenceNextUse(d)
    # no period yet: LRU distance
    nu.record(0, [1])
    nu.record(1, [2])
    assert d.period is None
    assert nu.score(1, 2) > nu.score(2, 2)
    # period 4: unit 10 used at step offset 0, unit 11 at offset 2, unit 12 not in the last period
    d.period = 4
    nu.record(8, [10])
    nu.record(10, [11])
    nu.record(3, [12])
    t = 11
    assert nu.score(10, t) == 8 + 4 - t        # next at 12
    assert nu.score(11, t) == 10 + 4 - t       # next at 14
    assert nu.score(12, t) == float("inf")     # predicted never: first victim
    assert nu.score(99, t) == float("inf")


def test_future_next_use_is_belady():
    fut = RS.FutureNextUse({"a": [1, 5, 9], "b": [2, 3]}, lambda u: {"a"} if u == 0 else {"b"})
    assert fut.score(0, 1) == 4 and fut.score(1, 1) == 1 and fut.score(1, 3) == float("inf")


# ---- the residency estimate ---------------------------------------------------------

def U(i, n=1):
    return (i * UNIT, n * UNIT)


def test_residency_fifo_evicts_in_arrival_order_and_never_the_launchs_own_units():
    r = RS.Residency(3 * UNIT, UNIT, "fifo")
    assert r.admit([U(0), U(1), U(2)], 0) == []
    assert r.admit([U(1)], 1) == []                 # already resident: no change in order
    ev = r.admit([U(0), U(3)], 2)                   # needs 1 unit; 0 is needed, so 1 goes
    assert ev == [U(1)]
    assert set(r.resident) == {0, 2, 3} and r.resident_units <= 3


def test_residency_lru_refreshes_on_use():
    r = RS.Residency(2 * UNIT, UNIT, "lru")
    r.admit([U(0)], 0)
    r.admit([U(1)], 1)
    r.admit([U(0)], 2)
    assert r.admit([U(2)], 3) == [U(1)]


def test_residency_next_use_evicts_the_furthest():
    scores = {0: 5.0, 1: float("inf"), 2: 1.0}

    class S:
        def score(self, u, t):
            return scores.get(u, 0.0)

    r = RS.Residency(3 * UNIT, UNIT, "next-use", S())
    r.admit([U(0), U(1), U(2)], 0)
    assert r.admit([U(3), U(4)], 1) == R.merge_ranges([U(1), U(0)])
    assert set(r.resident) == {2, 3, 4}


def test_residency_evicts_only_the_bytes_that_were_admitted():
    r = RS.Residency(8192, UNIT, "fifo")
    r.admit([(100, 4096), (UNIT - 4096, 4096)], 0)    # two small allocations inside one unit
    ev = r.admit([(5 * UNIT, 10)], 1)
    assert ev == [(100, 4096), (UNIT - 4096, 4096)]
    assert r.evicted_bytes == 8192 and r.resident_bytes == 10


def test_residency_counts_whole_units_as_the_driver_s_chunks():
    """GPU memory is handed out in 2 MiB chunks: small ranges in many units take a whole unit each
    of the capacity, however few bytes they hold."""
    r = RS.Residency(4 * UNIT, UNIT, "fifo")
    assert r.admit([(u * UNIT, 64 * 1024) for u in range(4)], 0) == []   # 256 KiB in 4 units: memory full
    assert r.resident_units == 4 and r.resident_bytes == 4 * 64 * 1024
    ev = r.admit([(100 * UNIT, 64 * 1024)], 1)                          # 64 KiB more: a fifth chunk
    assert ev == [(0, 64 * 1024)]                                        # the oldest unit, and only it
    assert r.resident_units == 4 and r.resident_bytes == 4 * 64 * 1024


def test_residency_overflow_when_one_launch_exceeds_the_capacity():
    r = RS.Residency(2 * UNIT, UNIT, "fifo")
    r.admit([U(9)], 0)
    ev = r.admit([U(0, 3)], 1)
    assert ev == [U(9)] and r.overflows == 1
    # the launch streamed through memory: only its last units, a capacity's worth, are counted there
    assert set(r.resident) == {1, 2} and r.resident_bytes == 2 * UNIT
    assert r.missing([U(0, 3)]) == [U(0)]


def test_residency_keeps_a_guessed_footprint_larger_than_memory():
    """Whole allocations, the guess for a launch with no prediction, say nothing of how it streams."""
    r = RS.Residency(2 * UNIT, UNIT, "fifo")
    r.admit([U(0, 3)], 0, streams=False)
    assert r.overflows == 1 and set(r.resident) == {0, 1, 2}


def test_residency_streams_on_the_launchs_own_units_not_its_bytes():
    """A launch's size is the units (chunks) it touches: 12 KiB in three units fits three units of
    memory, already partly resident for other launches, and streams through two."""
    r = RS.Residency(3 * UNIT, UNIT, "fifo")
    r.admit([U(0, 2)], 0)
    r.admit([(0, 4096), (UNIT, 4096), (2 * UNIT, 4096)], 1)
    assert set(r.resident) == {0, 1, 2} and r.overflows == 0
    r = RS.Residency(2 * UNIT, UNIT, "fifo")
    r.admit([U(0, 2)], 0)
    r.admit([(0, 4096), (UNIT, 4096), (2 * UNIT, 4096)], 1)
    assert set(r.resident) == {1, 2} and r.overflows == 1   # only its last units, a capacity's worth


@pytest.mark.parametrize("victim", ["fifo", "lru"])
def test_residency_matches_a_reference_cache_on_a_random_sequence(victim):
    """Misses of single-unit admissions equal those of a plain FIFO/LRU cache of the same size."""
    import random
    from collections import OrderedDict

    rng = random.Random(3)
    seq = [rng.randrange(12) for _ in range(2000)]
    r = RS.Residency(5 * UNIT, UNIT, victim)
    ref: OrderedDict = OrderedDict()
    miss_r = miss_ref = 0
    for t, u in enumerate(seq):
        miss_r += u not in r.resident
        r.admit([U(u)], t)
        assert r.resident_units <= 5
        if u in ref:
            if victim == "lru":
                ref.move_to_end(u)
        else:
            miss_ref += 1
            if len(ref) == 5:
                ref.popitem(last=False)
            ref[u] = True
    assert miss_r == miss_ref


# ---- the engine ------------------------------------------------------------------------

BASE = 1 << 40


def fake_with_buffers(n: int, size: int = 4 * MiB) -> tuple[FakeCuda, list[int]]:
    f = FakeCuda()
    bases = [BASE + i * 16 * MiB for i in range(n)]
    for b in bases:
        f.add_allocation(b, size)
    return f, bases


def test_demand_adds_nothing_without_a_capacity():
    f, bases = fake_with_buffers(2)
    e = E.Engine(f, "demand")
    e.on_launch(mk_launch("k", [bases[0], 64]))
    assert [x for x in f.log if x[0] in ("gpu", "host", "wait")] == []
    assert e.stats.launches == 1 and e.stats.errors == 0


def test_alloc_prefetches_whole_allocations_on_the_launch_stream():
    f, bases = fake_with_buffers(2)
    e = E.Engine(f, "alloc")
    e.on_launch(mk_launch("k", [bases[0] + 4096, bases[1], 12345], stream=42))
    assert [x for x in f.log if x[0] == "gpu"] == [("gpu", bases[0], 4 * MiB, 42), ("gpu", bases[1], 4 * MiB, 42)]


def test_default_streams_are_named_explicitly():
    """Regression: a launch on stream 0 got its prefetches on stream 0, which cuda-bindings reads as the
    per-thread stream when CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM=1 (not the launch's legacy stream)."""
    assert E.launch_stream(mk_launch("k", [], stream=0, cbid=CB_cuLaunchKernel_ptsz)) == E.PER_THREAD_STREAM == 2
    assert E.launch_stream(mk_launch("k", [], stream=0)) == E.LEGACY_STREAM == 1
    assert E.launch_stream(mk_launch("k", [], stream=0x7F00, cbid=CB_cuLaunchKernel_ptsz)) == 0x7F00
    f, bases = fake_with_buffers(1)
    e = E.Engine(f, "alloc")
    e.on_launch(mk_launch("k", [bases[0]], stream=0))
    assert [x for x in f.log if x[0] == "gpu"] == [("gpu", bases[0], 4 * MiB, 1)]


def test_a_prefetch_never_spans_two_allocations():
    """Regression: two managed allocations back to back merged into one cuMemPrefetchAsync range;
    the driver's range must be managed memory of one allocation (the stand-in refuses it)."""
    f = FakeCuda()
    a, b = BASE, BASE + 2 * MiB
    f.add_allocation(a, 2 * MiB)
    f.add_allocation(b, 2 * MiB)
    e = E.Engine(f, "alloc", capacity=UNIT, predict=lambda la, al: [(a, 4 * MiB)])
    e.on_launch(mk_launch("k", [a, b]))
    assert [x[1:3] for x in f.log if x[0] == "gpu"] == [(a, 2 * MiB), (b, 2 * MiB)]
    f.log.clear()
    e.on_launch(mk_launch("k2", [BASE + 64 * MiB]))       # nothing of it is managed: no eviction needed
    e2 = E.Engine(f, "template", predict=lambda la, al: [(a + MiB, 2 * MiB)])
    e2.on_launch(mk_launch("k", [a]))
    assert [x[1:3] for x in f.log if x[0] == "gpu"] == [(a + MiB, MiB), (b, MiB)]
    assert e.stats.errors == e2.stats.errors == e.stats.failed_calls == 0
    assert R.AllocationMap(f.allocation_of).clip([(a, 4 * MiB)]) == [(a, 4 * MiB)]   # clip still merges


def test_a_refused_prefetch_does_not_stop_the_others_and_the_allocation_is_looked_up_again():
    """Regression: the first refused range (an allocation freed and its address reused since it was
    cached) aborted every later prefetch of the launch."""
    f, bases = fake_with_buffers(2)
    e = E.Engine(f, "alloc")
    e.on_launch(mk_launch("k", [bases[0], bases[1]]))
    f.free(bases[0])
    f.add_allocation(bases[0], 1 * MiB)                 # the address is reused by a smaller allocation
    f.log.clear()
    e.on_launch(mk_launch("k", [bases[0], bases[1]]))   # the cached 4 MiB range is refused ...
    assert [x[1:3] for x in f.log if x[0] == "gpu"] == [(bases[1], 4 * MiB)]   # ... the next one still goes
    assert e.stats.errors == 0 and e.stats.failed_calls == 1 and "INVALID_VALUE" in e.stats.last_error
    f.log.clear()
    e.on_launch(mk_launch("k", [bases[0], bases[1]]))   # looked up afresh: the new size
    assert [x[1:3] for x in f.log if x[0] == "gpu"] == [(bases[0], 1 * MiB), (bases[1], 4 * MiB)]
    assert e.stats.failed_calls == 1


def test_template_prefetches_the_prediction_clipped_to_managed_memory():
    f, bases = fake_with_buffers(1)

    def predict(la, allocs):
        p, n = struct.unpack_from("<QQ", la.param_data)
        return [(p, n), (p + 100 * MiB, 4096)]          # the second lands in no allocation

    e = E.Engine(f, "template", predict=predict, model_kernels={"k"})
    e.on_launch(mk_launch("k", [bases[0], 2 * MiB]))
    assert [x for x in f.log if x[0] == "gpu"] == [("gpu", bases[0], 2 * MiB, 7)]
    assert e.stats.predicted_launches == 1 and e.stats.predict_s >= 0


def test_unseen_kernels_warn_once():
    f, bases = fake_with_buffers(1)
    warnings = []
    e = E.Engine(f, "template", predict=lambda la, a: [], model_kernels={"k"}, warn=warnings.append)
    for _ in range(3):
        e.on_launch(mk_launch("other", [bases[0]]))
    assert len(warnings) == 1 and "other" in warnings[0]
    assert e.stats.unseen_kernels == ["other"]


def test_capacity_emulation_orders_evict_prefetch_wait():
    """Evictions go to the host on a side stream, the launch's stream waits for them before the kernel."""
    f, bases = fake_with_buffers(3, size=2 * MiB)

    def predict(la, allocs):
        return [(struct.unpack_from("<Q", la.param_data)[0], 2 * MiB)]

    e = E.Engine(f, "template", capacity=2 * UNIT, predict=predict)
    for b in bases:
        e.on_launch(mk_launch("k", [b], stream=5))
    ops = [x for x in f.log if x[0] in ("gpu", "host", "record", "wait", "stream")]
    # third launch: the side stream waits for what is queued on the launch's stream, evicts one unit,
    # records an event; the prefetch goes on the launch's stream, which then waits for the eviction
    side = [x for x in ops if x[0] == "stream"][0][1]
    tail = ops[-6:]
    assert tail[0][0] == "record" and tail[0][2] == 5
    assert tail[1] == ("wait", side, tail[0][1])
    assert tail[2][0] == "host" and tail[2][3] == side
    assert tail[3][0] == "record" and tail[3][2] == side
    assert tail[4] == ("gpu", bases[2], 2 * MiB, 5)
    assert tail[5] == ("wait", 5, tail[3][1])
    assert e.stats.evict_bytes == 2 * MiB and e.residency.resident_units == 2


def test_a_launch_larger_than_the_capacity_gets_only_its_first_capacitys_worth_prefetched():
    """It streams through memory: what it uses first, a capacity's worth in address order, comes in
    bulk before it; prefetching all of it would leave only its end resident, and the first faults
    would evict that before the kernel reached it. A launch that fits gets all of it."""
    f, bases = fake_with_buffers(1, size=8 * UNIT)

    def predict(la, allocs):
        p, n = struct.unpack_from("<QQ", la.param_data)
        return [(p, n)]

    e = E.Engine(f, "template", capacity=3 * UNIT, predict=predict)
    e.on_launch(mk_launch("k", [bases[0], 8 * UNIT], stream=5))
    assert [x for x in f.log if x[0] == "gpu"] == [("gpu", bases[0], 3 * UNIT, 5)]
    assert e.stats.overflow_launches == 1
    f.log.clear()
    e.on_launch(mk_launch("k", [bases[0] + 5 * UNIT, 2 * UNIT], stream=5))
    gpu = [x for x in f.log if x[0] == "gpu"]
    assert sum(x[2] for x in gpu) <= 2 * UNIT and e.stats.overflow_launches == 1


def run_cycle(policy: str, steps: int = 12, cap_units: int = 3, predict_ok: bool = True):
    """A periodic workload over 4 buffers of one unit each on an emulated GPU of `cap_units`; faults counted."""
    f, bases = fake_with_buffers(4, size=UNIT)

    def predict(la, allocs):
        return [(struct.unpack_from("<Q", la.param_data)[0], UNIT)] if predict_ok else []

    e = E.Engine(f, policy, capacity=cap_units * UNIT, predict=predict if policy == "template" else None)
    for _ in range(steps):
        for i, b in enumerate(bases):
            e.on_launch(mk_launch(f"k{i}", [b]))
            f.touch(b, UNIT)                      # the kernel runs: it touches its whole buffer
            assert f.resident_bytes() <= cap_units * UNIT
    return f, e


def test_template_beats_demand_on_a_cyclic_workload_in_the_stand_in():
    fd, ed = run_cycle("demand")
    ft, et = run_cycle("template")
    fa, ea = run_cycle("alloc")
    assert fd.faults > 0 and ft.faults == 0 and fa.faults == 0
    # demand's FIFO is the worst case on a cycle bigger than memory: every launch misses
    assert fd.faults == 12 * 4 * (UNIT // FakeCuda.BIG_PAGE)
    # once the period is known, the template policy evicts the unit used furthest ahead, not the oldest
    assert et.stats.period == 4
    assert et.stats.evict_bytes < ea.stats.evict_bytes


def test_policy_errors_never_reach_the_workload():
    f, bases = fake_with_buffers(1)

    def broken(la, allocs):
        raise RuntimeError("bad formula")

    e = E.Engine(f, "template", predict=broken)
    e.on_launch(mk_launch("k", [bases[0]]))
    assert e.stats.errors == 1 and "bad formula" in e.stats.last_error


def test_engine_refuses_impossible_policies():
    f = FakeCuda()
    with pytest.raises(UsageError, match="model"):
        E.Engine(f, "template")
    with pytest.raises(UsageError, match="trace"):
        E.Engine(f, "oracle")
    with pytest.raises(UsageError, match="unknown policy"):
        E.Engine(f, "lru")


# ---- the oracle's relocation ----------------------------------------------------------------

TB = 0x7F00_0000_0000  # trace-space base


def oracle_trace(tmp_path, n_steps: int = 3, nbytes: int = 3 * MiB):
    """Two kernels alternating over two managed buffers of 4 MiB, each reading `nbytes` of its own,
    with truth."""
    kernels, datas, truth = [], [], {T.LAUNCH_ID: [], T.ADDRESS: [], T.BYTES: [], T.ACCESS: []}
    for i in range(2 * n_steps):
        k = i % 2
        kernels.append(f"k{k}")
        datas.append(struct.pack("<QQ", TB + k * 8 * MiB, 4096))
        truth[T.LAUNCH_ID].append(i)
        truth[T.ADDRESS].append(TB + k * 8 * MiB)
        truth[T.BYTES].append(nbytes)
        truth[T.ACCESS].append("read")
    n = len(kernels)
    launches = {T.LAUNCH_ID: list(range(n)), T.KERNEL: kernels, T.DEVICE: [0] * n, T.STREAM: [0] * n,
                **{c: [1] * n for c in T.GRID_COLUMNS}, T.SHARED_MEM_BYTES: [0] * n,
                T.PARAM_OFFSETS: [[0, 8]] * n, T.PARAM_SIZES: [[8, 8]] * n, T.PARAM_DATA: datas}
    allocations = {T.ALLOC_ID: [0, 1], T.ADDRESS: [TB, TB + 8 * MiB], T.BYTES: [4 * MiB, 4 * MiB],
                   T.KIND: ["managed", "managed"], T.DEVICE: [0, 0], T.FIRST_LAUNCH: [0, 0]}
    empty_f = {T.TIME_NS: [], T.ADDRESS: [], T.COUNT: [], T.ACCESS: [], T.DEVICE: []}
    empty_m = {T.START_NS: [], T.END_NS: [], T.ADDRESS: [], T.BYTES: [], T.DIRECTION: [], T.CAUSE: []}
    p = T.write_trace(tmp_path / "o.pctrace", T.new_manifest(mode="full"),
                      {T.LAUNCHES: launches, T.ALLOCATIONS: allocations, T.FAULTS: empty_f,
                       T.MIGRATIONS: empty_m, T.TRUTH: truth})
    return T.read_trace(p)


def test_relocator_moves_footprints_by_each_allocations_delta(tmp_path):
    tr = oracle_trace(tmp_path)
    rel = O.Relocator(tr)
    run = [BASE, BASE + 64 * MiB]                      # this run's allocations live elsewhere
    assert rel.observe(0, "k0", struct.pack("<QQ", run[0], 4096))
    assert rel.footprint(0) == [(run[0], 3 * MiB)]
    assert rel.observe(1, "k1", struct.pack("<QQ", run[1], 4096))
    assert rel.footprint(1) == [(run[1], 3 * MiB)]
    fut = rel.future_uses()
    assert fut[TB // UNIT] == [0, 2, 4]
    # a run that launches something else stops matching
    assert not rel.observe(2, "other", b"")
    assert rel.mismatch and "other" in rel.mismatch and rel.footprint(2) == []


def test_oracle_policy_prefetches_the_relocated_truth_and_evicts_by_belady(tmp_path):
    tr = oracle_trace(tmp_path)
    f = FakeCuda()
    run = [BASE, BASE + 64 * MiB]
    for b in run:
        f.add_allocation(b, 4 * MiB)
    e = E.Engine(f, "oracle", relocator=O.Relocator(tr), capacity=2 * UNIT)
    for i in range(tr.n_launches):
        e.on_launch(mk_launch(f"k{i % 2}", [run[i % 2], 4096]))
    gpu = [x for x in f.log if x[0] == "gpu"]
    assert gpu[0] == ("gpu", run[0], 3 * MiB, 7) and gpu[1] == ("gpu", run[1], 3 * MiB, 7)
    assert e.stats.errors == 0 and e.stats.evict_bytes > 0


def footprint_trace(tmp_path, steps: list[list[int]], n_bufs: int):
    """One kernel per launch over one-unit managed buffers: launch i touches buffers steps[i] (truth),
    and passes them all as pointer arguments."""
    kernels, datas, offs, sizes = [], [], [], []
    truth = {T.LAUNCH_ID: [], T.ADDRESS: [], T.BYTES: [], T.ACCESS: []}
    for i, bufs in enumerate(steps):
        kernels.append(f"k{i}")
        datas.append(struct.pack(f"<{len(bufs)}Q", *(TB + b * 8 * MiB for b in bufs)))
        offs.append([8 * j for j in range(len(bufs))])
        sizes.append([8] * len(bufs))
        for b in bufs:
            truth[T.LAUNCH_ID].append(i)
            truth[T.ADDRESS].append(TB + b * 8 * MiB)
            truth[T.BYTES].append(UNIT)
            truth[T.ACCESS].append("read")
    n = len(steps)
    launches = {T.LAUNCH_ID: list(range(n)), T.KERNEL: kernels, T.DEVICE: [0] * n, T.STREAM: [0] * n,
                **{c: [1] * n for c in T.GRID_COLUMNS}, T.SHARED_MEM_BYTES: [0] * n,
                T.PARAM_OFFSETS: offs, T.PARAM_SIZES: sizes, T.PARAM_DATA: datas}
    allocations = {T.ALLOC_ID: list(range(n_bufs)), T.ADDRESS: [TB + b * 8 * MiB for b in range(n_bufs)],
                   T.BYTES: [UNIT] * n_bufs, T.KIND: ["managed"] * n_bufs, T.DEVICE: [0] * n_bufs,
                   T.FIRST_LAUNCH: [0] * n_bufs}
    empty_f = {T.TIME_NS: [], T.ADDRESS: [], T.COUNT: [], T.ACCESS: [], T.DEVICE: []}
    empty_m = {T.START_NS: [], T.END_NS: [], T.ADDRESS: [], T.BYTES: [], T.DIRECTION: [], T.CAUSE: []}
    p = T.write_trace(tmp_path / "f.pctrace", T.new_manifest(mode="full"),
                      {T.LAUNCHES: launches, T.ALLOCATIONS: allocations, T.FAULTS: empty_f,
                       T.MIGRATIONS: empty_m, T.TRUTH: truth})
    return T.read_trace(p)


def test_oracle_never_evicts_what_the_launch_needs_and_is_already_resident(tmp_path):
    """Regression: the oracle's estimate was only the part of its footprint not yet resident, so a
    resident unit the launch needs was a victim candidate (Belady even picked it: no use after now)."""
    A, B, C = 0, 1, 2
    tr = footprint_trace(tmp_path, [[A], [B], [A, C], [B]], 3)
    f = FakeCuda()
    run = [BASE + b * 64 * MiB for b in range(3)]
    for b in run:
        f.add_allocation(b, UNIT)
    e = E.Engine(f, "oracle", relocator=O.Relocator(tr), capacity=2 * UNIT)
    for i, bufs in enumerate([[A], [B], [A, C], [B]]):
        f.log.clear()
        e.on_launch(mk_launch(f"k{i}", [run[b] for b in bufs]))
        if i == 2:
            assert [x[1] for x in f.log if x[0] == "host"] == [run[B]]      # not A: launch 2 reads it
            assert [x[1] for x in f.log if x[0] == "gpu"] == [run[C]]
            assert sorted(e.residency.resident) == sorted([run[A] // UNIT, run[C] // UNIT])
    assert e.stats.errors == 0


def test_alloc_with_a_partial_prediction_keeps_every_allocation_it_prefetches():
    """Regression: with a capacity, alloc's estimate is the model's prediction; a whole allocation the
    policy wants and that is already resident was left out of what the launch needs, so evicted."""
    f, bases = fake_with_buffers(3, size=UNIT)
    A, B, C = bases

    def predict(la, allocs):          # a model that only knows the first pointer's buffer
        return [(struct.unpack_from("<Q", la.param_data)[0], UNIT)]

    e = E.Engine(f, "alloc", capacity=2 * UNIT, predict=predict)
    e.on_launch(mk_launch("k", [A]))
    e.on_launch(mk_launch("k", [B]))
    f.log.clear()
    e.on_launch(mk_launch("k", [C, A]))       # alloc wants A and C; A is resident, B is the only victim
    assert [x[1] for x in f.log if x[0] == "host"] == [B]
    assert [x[1] for x in f.log if x[0] == "gpu"] == [C]
    assert sorted(e.residency.resident) == [A // UNIT, C // UNIT]


# ---- workload command, aggregation -------------------------------------------------------------

@pytest.mark.parametrize("argv,want", [
    (["python", "train.py", "--n", "3"], ("path", "train.py", ["--n", "3"])),
    (["python3", "-u", "-m", "pkg.mod", "x"], ("module", "pkg.mod", ["x"])),
    (["--", "script.py"], ("path", "script.py", [])),
    ([sys.executable, "-m", "m"], ("module", "m", [])),
    (["-m", "pkg.mod", "--scale", "2"], ("module", "pkg.mod", ["--scale", "2"])),
])
def test_parse_workload(argv, want):
    assert C.parse_workload(argv) == want


@pytest.mark.parametrize("argv,msg", [([], "after '--'"), (["./a.out"], "not python"), (["python"], "names no script"),
                                      (["python", "-c", "x"], "unsupported")])
def test_parse_workload_rejects(argv, msg):
    with pytest.raises(UsageError, match=msg):
        C.parse_workload(argv)


def test_aggregate_takes_the_median_and_spread():
    runs = [{"time_s": t, "faults": f, "htod_bytes": 10, "dtoh_bytes": 0, "wall_s": t + 1}
            for t, f in ((2.0, 5), (1.0, 3), (4.0, 9))]
    a = G.aggregate(runs)
    assert a["time_s"] == 2.0 and a["faults"] == 5 and a["repeats"] == 3
    assert a["time_s_min"] == 1.0 and a["time_s_max"] == 4.0 and a["time_s_spread"] == pytest.approx(1.5)
    assert a["wall_s"] == 3.0


def test_speedups_are_per_capacity():
    rows = [{"policy": "demand", "capacity_bytes": 1, "time_s": 10.0},
            {"policy": "template", "capacity_bytes": 1, "time_s": 2.0},
            {"policy": "oracle", "capacity_bytes": 1, "time_s": 1.0},
            {"policy": "template", "capacity_bytes": 2, "time_s": 1.0}]
    add_relative(rows)
    assert rows[1]["speedup_vs_demand"] == 5.0 and rows[1]["fraction_of_oracle"] == 0.5
    assert rows[3]["speedup_vs_demand"] is None


# ---- the child run, with stand-ins for the GPU, CUPTI and the hook ----------------------------------

@pytest.fixture
def fake_launch_module(monkeypatch):
    mod = types.ModuleType("pagecast_test_launch")
    fake, bases = fake_with_buffers(4, size=UNIT)

    def launch(i):
        FakeHook.current.on_launch(mk_launch(f"k{i}", [bases[i]]))
        fake.touch(bases[i], UNIT)

    mod.launch = launch
    mod.fake = fake
    monkeypatch.setitem(sys.modules, "pagecast_test_launch", mod)
    return mod


def job_argv(tmp_path, policy, result, workload, capacity=None):
    """The child's argv as the GPU runner makes it: one JSON file holding the job."""
    req = ReplayRequest(backend="gpu", policies=(policy,), capacity=None if capacity is None else (capacity,),
                        workload=tuple(workload))
    path = tmp_path / f"job-{policy}.json"
    path.write_text(C.ChildJob(request=req, result=str(result)).to_json())
    return [str(path)]


def test_child_run_writes_its_measurements(tmp_path, fake_launch_module):
    script = tmp_path / "work.py"
    script.write_text("import pagecast_test_launch as L\nfor _ in range(5):\n    for i in range(4):\n        L.launch(i)\n")
    res = tmp_path / "r.json"
    fake = fake_launch_module.fake
    code = C.child_main(job_argv(tmp_path, "demand", res, ["python", str(script)], capacity=2 * UNIT),
                        cuda=fake, monitor=FakeMonitor(fake), hook_factory=FakeHook)
    out = json.loads(res.read_text())
    assert code == 0 and "error" not in out
    assert out["launches"] == 20 and out["faults"] == fake.faults > 0
    assert out["evict_bytes"] > 0 and out["time_s"] >= 0 and out["wall_s"] >= out["time_s"]
    assert ("sync",) in fake.log


def test_child_run_warns_when_runtime_launches_are_seen_after_their_kernels(tmp_path, fake_launch_module):
    """The launch hook delivers the first runtime launch at the runtime call's exit when no driver launch
    callback follows it (collect/launch_hook.py): that kernel is queued by then, its prefetch too late."""
    class RuntimeOnlyHook(FakeHook):
        runtime_reaches_driver = False

    script = tmp_path / "work.py"
    script.write_text("import pagecast_test_launch as L\nL.launch(0)\n")
    res = tmp_path / "r.json"
    fake = fake_launch_module.fake
    assert C.child_main(job_argv(tmp_path, "alloc", str(res), ["python", str(script)]),
                        cuda=fake, monitor=FakeMonitor(fake), hook_factory=RuntimeOnlyHook) == 0
    out = json.loads(res.read_text())
    assert out["runtime_reaches_driver"] is False
    assert any("too late" in w for w in out["warnings"])


def test_child_run_reports_a_crashing_workload(tmp_path, fake_launch_module):
    script = tmp_path / "bad.py"
    script.write_text("raise ValueError('boom')\n")
    res = tmp_path / "r.json"
    fake = fake_launch_module.fake
    code = C.child_main(job_argv(tmp_path, "demand", str(res), ["python", str(script)]),
                        cuda=fake, monitor=FakeMonitor(fake), hook_factory=FakeHook)
    assert code == 1 and "boom" in json.loads(res.read_text())["error"]


def test_child_run_nonzero_exit(tmp_path, fake_launch_module):
    script = tmp_path / "exit3.py"
    script.write_text("import sys\nsys.exit(3)\n")
    res = tmp_path / "r.json"
    fake = fake_launch_module.fake
    assert C.child_main(job_argv(tmp_path, "alloc", str(res), ["python", str(script)]),
                        cuda=fake, monitor=FakeMonitor(fake), hook_factory=FakeHook) == 1
    assert "status 3" in json.loads(res.read_text())["error"]


# ---- run_gpu_replay's argument handling ----------------------------------------------------------

def ns(**kw):
    """The replay command's flags, parsed into a ReplayRequest as the command does (lists as the
    comma-separated flags they are)."""
    d = dict(traces=[], policy=["demand"], capacity=None, oversub=None, model=None, plan=None, feedback=False,
             costs=None, repeat=1, allow_oversubscription=False, workload=["python", "w.py"], json=False,
             output=None, force=False, backend="gpu", span="auto", oversub_of="managed", placement="device",
             choose_on=CHOOSE_ON)
    d.update(kw)
    for k in ("policy", "capacity", "oversub"):
        if d[k] is not None:
            d[k] = ",".join(str(x) for x in d[k])
    return replay_request(Namespace(**d))


@pytest.mark.parametrize("kw,msg", [
    ({"workload": []}, "after '--'"),
    ({"policy": ["template"]}, "--model"),
    ({"policy": ["oracle"]}, "full-mode trace"),
    ({"policy": ["belady"]}, "not available"),
    ({"oversub": [2.0], "oversub_of": "touched"}, "--oversub-of touched needs a trace"),
    ({"repeat": 0}, "--repeat"),
    ({"capacity": [0]}, "--capacity"),
    ({"traces": ["a", "b"]}, "at most one trace"),
])
def test_run_gpu_replay_checks_its_arguments_first(kw, msg):
    with pytest.raises(UsageError, match=msg):
        G.run_gpu_replay(ns(**kw))


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU path; this machine has a GPU")
def test_run_gpu_replay_without_gpu_is_a_one_line_exit_2():
    with pytest.raises(NoGPUError) as ei:
        G.run_gpu_replay(ns())
    assert ei.value.exit_code == 2 and "\n" not in str(ei.value)


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU path; this machine has a GPU")
def test_run_gpu_replay_says_span_is_for_the_simulator(capsys):
    with pytest.raises(NoGPUError):
        G.run_gpu_replay(ns(span="block"))
    assert "--span is for the simulator" in capsys.readouterr().err
    with pytest.raises(NoGPUError):
        G.run_gpu_replay(ns())   # an old namespace without span, or auto: no warning
    assert "--span" not in capsys.readouterr().err


def test_pagecast_prefetching_is_exported_lazily():
    import pagecast

    assert pagecast.prefetching is PF.prefetching
    with pytest.raises(AttributeError):
        pagecast.no_such_thing  # noqa: B018


def test_prefetching_context_manager_with_stand_ins(monkeypatch):
    f, bases = fake_with_buffers(1)
    monkeypatch.setattr(PF, "make_online_predict", lambda model, fallback: (lambda la, a: [(bases[0], MiB)]))
    model = types.SimpleNamespace(kernels={"k": None})
    with PF.prefetching(model, capacity="64MiB", cuda=f, hook_factory=FakeHook) as eng:
        FakeHook.current.on_launch(mk_launch("k", [bases[0]]))
    assert FakeHook.current is None
    assert eng.stats.prefetch_bytes == MiB and eng.residency.capacity_units == 32


class OrderedMonitor(FakeMonitor):
    def __init__(self, cuda, order):
        super().__init__(cuda)
        self.order = order

    def start(self, keep_records: bool = False, live: bool = False) -> None:
        self.order.append("monitor.start")
        super().start(keep_records, live)


@pytest.mark.parametrize("context_before", [False, True])
def test_prefetching_with_feedback_starts_the_counters_before_the_context(monkeypatch, context_before):
    """On an H200, CUPTI's unified-memory counters started after the CUDA context counted no faults:
    with feedback the monitor starts first, and a program that already had a context is told so."""
    f, bases = fake_with_buffers(1)
    order = []
    monkeypatch.setattr(PF, "make_online_predict", lambda model, fallback: (lambda la, a: []))
    monkeypatch.setattr(PF.driver, "context_exists", lambda device=0: context_before)
    monkeypatch.setattr(PF.driver, "open_cuda", lambda device=0: order.append("open_cuda") or f)
    monkeypatch.setattr(PF.cupti_monitor, "CuptiMonitor", lambda device=0: OrderedMonitor(f, order))
    model = types.SimpleNamespace(kernels={"k": None})
    import warnings
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with PF.prefetching(model, feedback=True, hook_factory=FakeHook):
            pass
    assert order == ["monitor.start", "open_cuda"]
    said = [str(x.message) for x in w if "first CUDA call" in str(x.message)]
    assert len(said) == int(context_before)


def test_prefetching_falls_back_to_history_only_with_feedback(monkeypatch):
    """Without feedback the fit's history is stale (every expert a MoE fit saw): no fallback."""
    f, bases = fake_with_buffers(1)
    seen = []
    monkeypatch.setattr(PF, "make_online_predict",
                        lambda model, fallback: seen.append(fallback) or (lambda la, a: []))
    model = types.SimpleNamespace(kernels={"k": None})
    with PF.prefetching(model, cuda=f, hook_factory=FakeHook):
        pass
    with PF.prefetching(model, fallback="allocation", cuda=f, hook_factory=FakeHook):
        pass
    assert seen == ["none", "allocation"]
    from pagecast.replay.online.prediction import default_fallback
    assert default_fallback(True) == "history" and default_fallback(False) == "none"


# ---- feedback: faults the prediction missed, attributed to their launch ---------------------------

def test_feedback_attributes_missed_faults_to_the_launch_that_ran():
    f, bases = fake_with_buffers(2)
    b0, b1 = bases
    preds = {b0: [(b0, 8192)], b1: [(b1, 4096)]}
    e = E.Engine(f, "template", predict=lambda la, a: preds[struct.unpack_from("<Q", la.param_data)[0]])
    e.on_launch(mk_launch("k", [b0], corr=11))
    e.on_launch(mk_launch("k", [b1], corr=12))
    kernels = [(100, 200, 11, "k"), (300, 400, 12, "k")]
    faults = [(150, b0 + 4096, 1),          # predicted: not missed
              (160, b0 + 3 * 4096, 1),      # missed by launch 11
              (170, b0 + 4 * 4096, 2),      # missed by launch 11 (adjacent page: one interval)
              (350, b1 + 2 * 4096, 1),      # missed by launch 12
              (250, b1 + 9 * 4096, 1),      # between kernels: not attributed
              (900, b1, 1)]                 # after every known kernel: kept for the next round
    got = []
    n, later = e.feedback_from(faults, kernels, lambda la, ivs: got.append((la.correlation_id, ivs)) or True)
    ps = 4096
    assert n == 2 and e.stats.feedback_updates == 2
    assert sorted(got) == [(11, [(b0 // ps + 3, b0 // ps + 5)]), (12, [(b1 // ps + 2, b1 // ps + 3)])]
    assert later == [(900, b1, 1)]
    assert e.feedback_from([], kernels, lambda la, ivs: True) == (0, [])
    assert e.feedback_from(faults[:1], [], lambda la, ivs: True) == (0, faults[:1])


# ---- run_gpu_replay end to end with stand-ins (the subprocess replaced by an in-process child) ---------

CLI_FIELDS = {"policy", "backend", "capacity_bytes", "oversub", "time_s", "stall_s", "faults", "htod_bytes",
              "dtoh_bytes", "speedup_vs_demand"}


@pytest.mark.parametrize("of, expected", [("managed", 4 * MiB), ("touched", 1 * MiB)])
def test_the_gpu_runner_sizes_oversub_as_the_request_says(tmp_path, monkeypatch, of, expected):
    """--oversub R divides the managed bytes allocated (two 4 MiB buffers) by default and the touched
    footprint (1 MiB read of each) with --oversub-of touched, as the simulator sizes it."""
    import subprocess

    import pagecast.replay.gpu.driver as CI

    tr = oracle_trace(tmp_path, n_steps=2, nbytes=1 * MiB)
    caps = []

    def fake_child(cmd):
        job = json.loads(Path(cmd[-1]).read_text())
        caps.append(job["request"]["capacity"])
        Path(job["result"]).write_text(json.dumps({"time_s": 1.0, "faults": 0}))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(CI, "open_cuda", lambda device=0: FakeCuda())
    monkeypatch.setattr(G, "_run_child", fake_child)
    rows, _ = G.run_gpu_replay(ns(traces=[str(tr.path)], policy=["demand"], oversub=[2.0], oversub_of=of,
                                  workload=["python", "w.py"]))
    assert [r["capacity_bytes"] for r in rows] == [expected] and caps == [[expected]]
    assert rows[0]["oversub"] == 2.0


def test_oversub_without_a_trace_is_sized_by_a_first_run(tmp_path, monkeypatch):
    """README's `replay --backend gpu --oversub 2 -- python train.py` (no trace) failed with '--oversub
    needs a trace' before the GPU was even looked for. Now a first run under demand at the whole GPU
    measures the managed memory the workload allocates (the most live at once) and --oversub divides it."""
    import subprocess

    import pagecast.replay.gpu.driver as CI

    jobs = []

    def fake_child(cmd):
        job = json.loads(Path(cmd[-1]).read_text())
        jobs.append(job)
        out = {"time_s": 1.0, "faults": 0}
        if job["managed"]:
            out["managed_peak_bytes"] = 12 * MiB
        Path(job["result"]).write_text(json.dumps(out))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(CI, "open_cuda", lambda device=0: FakeCuda())
    monkeypatch.setattr(G, "_run_child", fake_child)
    rows, _ = G.run_gpu_replay(ns(policy=["demand", "alloc"], oversub=[2.0, 3.0]))
    assert jobs[0]["managed"] and jobs[0]["request"]["capacity"] is None
    assert jobs[0]["request"]["policies"] == ["demand"]
    assert [j["request"]["capacity"] for j in jobs[1:]] == [[6 * MiB]] * 2 + [[4 * MiB]] * 2
    assert not any(j["managed"] for j in jobs[1:])
    assert [(r["oversub"], r["oversub_of"], r["managed_bytes"]) for r in rows] == [(2.0, "managed", 12 * MiB)] * 2 \
        + [(3.0, "managed", 12 * MiB)] * 2

    def no_managed(cmd):
        job = json.loads(Path(cmd[-1]).read_text())
        Path(job["result"]).write_text(json.dumps({"time_s": 1.0, "faults": 0, "managed_peak_bytes": 0}))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(G, "_run_child", no_managed)
    with pytest.raises(UsageError, match="allocated no managed memory"):
        G.run_gpu_replay(ns(policy=["demand"], oversub=[2.0]))


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU path; this machine has a GPU")
def test_the_readme_gpu_example_fails_at_the_gpu_check_here(capsys, tmp_path):
    """`replay --backend gpu ... --oversub 2 -- python train.py` with no trace: on a machine without a
    GPU, the one line says so (it said '--oversub needs a trace', which it also said on a GPU)."""
    from pagecast.cli import main

    (tmp_path / "train.py").write_text("print('hi')\n")
    assert main(["replay", "--backend", "gpu", "--policy", "demand,alloc", "--oversub", "2",
                 "--", "python", str(tmp_path / "train.py")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "no usable NVIDIA GPU" in err


def test_child_job_asks_for_the_managed_peak():
    """With `managed`, the child watches managed allocations and frees (collect's tracker) beside the
    engine's frees, and reports the most live at once; the job's JSON carries the flag."""
    req = ReplayRequest(backend="gpu", policies=("demand",), workload=("python", "w.py"))
    job = C.ChildJob(request=req, result="r.json", managed=True)
    assert C.ChildJob.from_json(job.to_json()).managed is True
    assert C.ChildJob.from_json(C.ChildJob(request=req, result="r.json").to_json()).managed is False
    seen = []
    cbs = C._chain({(1, 2): lambda site, cb: seen.append(("a", site))},
                   {(1, 2): lambda site, cb: seen.append(("b", site)), (3, 4): lambda site, cb: seen.append(("c", site))})
    cbs[(1, 2)](0, None)
    cbs[(3, 4)](1, None)
    assert seen == [("a", 0), ("b", 0), ("c", 1)]


def test_run_gpu_replay_rows_have_the_simulators_shape(tmp_path, monkeypatch):
    import subprocess

    import pagecast.replay.gpu.driver as CI

    # each launch reads its whole 4 MiB buffer, two 2 MiB chunks: memory is taken in chunks, so at
    # 100% both buffers fit and at 200% they evict each other
    tr = oracle_trace(tmp_path, n_steps=4, nbytes=4 * MiB)
    run = [BASE, BASE + 64 * MiB]
    mod = types.ModuleType("pagecast_test_oracle")
    state = {}

    def launch(i):
        fake = state["fake"]
        FakeHook.current.on_launch(mk_launch(f"k{i % 2}", [run[i % 2], 4096]))
        fake.touch(run[i % 2], 4 * MiB)

    mod.launch = launch
    monkeypatch.setitem(sys.modules, "pagecast_test_oracle", mod)
    script = tmp_path / "w.py"
    script.write_text(f"import pagecast_test_oracle as L\nfor i in range({tr.n_launches}):\n    L.launch(i)\n")

    def fresh():
        f = FakeCuda()
        for b in run:
            f.add_allocation(b, 4 * MiB)
        return f

    def fake_child(cmd):
        fake = state["fake"] = fresh()   # every run starts from a cold GPU, as a new process does
        argv = cmd[cmd.index("pagecast.replay.gpu.child") + 1:]
        code = C.child_main(argv, cuda=fake, monitor=FakeMonitor(fake), hook_factory=FakeHook)
        return subprocess.CompletedProcess(cmd, code)

    monkeypatch.setattr(CI, "open_cuda", lambda device=0: fresh())
    monkeypatch.setattr(G, "_run_child", fake_child)
    rows, timeline = G.run_gpu_replay(ns(traces=[str(tr.path)], policy=["demand", "alloc", "oracle"],
                                         oversub=[1.0, 2.0], repeat=2, workload=["python", str(script)]))
    assert timeline is None and len(rows) == 6
    for r in rows:
        assert CLI_FIELDS <= set(r) and r["backend"] == "gpu" and r["repeats"] == 2
        assert r["stall_s"] is None and r["time_s"] > 0 and r["speedup_vs_demand"] > 0
    by = {(r["oversub"], r["policy"]): r for r in rows}
    fp = 2 * 4 * MiB   # union of the truth: 4 MiB in each of the two buffers
    assert by[(2.0, "demand")]["capacity_bytes"] == fp // 2
    # demand faults every page in; with its whole footprint prefetched the oracle takes no faults
    assert by[(1.0, "demand")]["faults"] > 0 and by[(1.0, "oracle")]["faults"] == 0
    # at 200% the buffers evict each other: demand faults more than at 100%
    assert by[(2.0, "demand")]["faults"] > by[(1.0, "demand")]["faults"]
    assert by[(2.0, "oracle")]["evict_bytes"] > 0
    assert by[(1.0, "demand")]["speedup_vs_demand"] == 1.0
    # the replay command writes and prints them as it does the simulator's
    from pagecast.replay.results_table import results_table
    from pagecast.replay.results_io import read_results, write_results

    out = write_results(tmp_path / "gpu.parquet", rows, timeline)
    back, tl = read_results(out)
    assert back.num_rows == 6 and tl is None
    assert set(back.column("backend").to_pylist()) == {"gpu"}
    assert back.column("faults").to_pylist() == [r["faults"] for r in rows]
    assert sum(t.row_count for t in results_table(rows).renderables) == 6


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU path; this machine has a GPU")
def test_replay_command_gpu_backend_without_gpu(capsys, tmp_path):
    from pagecast.cli import main

    (tmp_path / "w.py").write_text("print('hi')\n")
    assert main(["replay", "--backend", "gpu", "--policy", "demand,alloc", "--json",
                 "--", "python", str(tmp_path / "w.py")]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and len(cap.err.strip().splitlines()) == 1 and "no usable NVIDIA GPU" in cap.err


def test_cupti_monitor_folds_activity_records():
    """The real monitor's record handling, fed stand-in records with cupti-python's field names."""
    pytest.importorskip("cupti")
    from types import SimpleNamespace as R

    from pagecast.replay.gpu.cupti_monitor import CuptiMonitor

    m = CuptiMonitor(0)
    m._keep = True
    m._completed([
        R(kind=25, counter_kind=4, value=3, start=150, end=150, address=1 << 40, flags_=1),      # 3 GPU faults
        R(kind=25, counter_kind=1, value=65536, start=160, end=170, address=1 << 40, flags_=2),  # htod, coherence
        R(kind=25, counter_kind=1, value=2 << 20, start=10, end=90, address=1 << 41, flags_=1),  # htod, user prefetch
        R(kind=25, counter_kind=2, value=4096, start=300, end=310, address=1 << 40, flags_=4),   # dtoh, eviction
        R(kind=10, start=100, end=200, correlation_id=7, name="k"),
        R(kind=10, start=250, end=400, correlation_id=8, name="k"),
        R(kind=25),                                                                              # unreadable
    ])
    c = m.poll()
    assert c.faults == 3 and c.fault_groups == 1 and c.fault_records == [(150, 1 << 40, 3)]
    assert c.htod_bytes == 65536 + (2 << 20) and c.htod_by_cause == {"coherence": 65536, "user": 2 << 20}
    assert c.dtoh_bytes == 4096 and c.dtoh_by_cause == {"eviction": 4096}
    assert c.kernels == 2 and c.kernel_busy_s == pytest.approx(250e-9) and c.gpu_span_s == pytest.approx(300e-9)
    assert [k[2] for k in c.kernel_records] == [7, 8] and c.dropped == 1
    faults, kernels = m.take()
    assert len(faults) == 1 and len(kernels) == 2 and m.take() == ([], [])


# ---- the per-kernel timeline ------------------------------------------------------------------------

def test_build_timeline_attributes_faults_and_transfers_to_kernels():
    from pagecast.replay.gpu.cupti_monitor import UvmCounts

    c = UvmCounts()
    c.kernel_records = [(1000, 2000, 7, "a"), (3000, 5000, 8, "b")]
    c.fault_records = [(1500, 0, 3), (4000, 0, 2), (2500, 0, 9)]        # the last one: between kernels
    c.htod_records = [(1200, 1300, 0, 65536, "coherence"),             # during a
                      (2500, 2900, 0, 1 << 20, "user"),                # a prefetch before b: counts for b
                      (9000, 9100, 0, 4096, "user")]                   # after every kernel: dropped
    c.dtoh_records = [(3500, 3600, 0, 2 << 20, "eviction")]
    tl = C.build_timeline(c, {7: 0, 8: 1})
    assert tl["launch_id"] == [0, 1] and tl["kernel"] == ["a", "b"]
    assert tl["start_s"] == [0.0, pytest.approx(2e-6)] and tl["end_s"] == [pytest.approx(1e-6), pytest.approx(4e-6)]
    assert tl["faults"] == [3, 2] and tl["htod_bytes"] == [65536, 1 << 20] and tl["dtoh_bytes"] == [0, 2 << 20]
    assert tl["stall_s"] == [None, None]
    assert C.build_timeline(UvmCounts(), {}) is None


def test_run_gpu_replay_assembles_the_timeline_of_the_first_repeat(tmp_path, monkeypatch):
    import subprocess

    import pagecast.replay.gpu.driver as CI

    seen = []

    def child(cmd):
        job = C.read_job(cmd[cmd.index("pagecast.replay.gpu.child") + 1:])
        seen.append(job)
        res = Path(job.result)
        policy = job.policy
        out = {"policy": policy, "time_s": 2.0 if policy == "demand" else 1.0, "faults": 1, "htod_bytes": 0,
               "dtoh_bytes": 0, "launches": 2, "warnings": []}
        if job.timeline:
            out["timeline"] = {"launch_id": [0, 1], "kernel": ["a", "b"], "start_s": [0.0, 1.0],
                               "end_s": [0.5, 1.5], "stall_s": [None, None], "faults": [1, 0],
                               "htod_bytes": [0, 0], "dtoh_bytes": [0, 0]}
        res.write_text(json.dumps(out))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(CI, "open_cuda", lambda device=0: FakeCuda())
    monkeypatch.setattr(G, "_run_child", child)
    rows, tl = G.run_gpu_replay(ns(policy=["demand", "alloc"], capacity=[64 * MiB], repeat=3,
                                   workload=["python", "-m", "pkg.work", "--scale", "1"]))
    assert sum(j.timeline for j in seen) == 2 and len(seen) == 6     # only the first repeat
    assert tl.num_rows == 4
    assert tl.column("run").to_pylist() == [0, 0, 1, 1]
    assert tl.column("policy").to_pylist() == ["demand", "demand", "alloc", "alloc"]
    assert set(tl.column("task_name").to_pylist()) == {"work"}
    assert rows[1]["speedup_vs_demand"] == 2.0
    from pagecast.replay.results_io import read_results, write_results

    _, back = read_results(write_results(tmp_path / "r.parquet", rows, tl))
    assert back.num_rows == 4 and back.column("faults").to_pylist() == [1, 0, 1, 0]


def test_residency_release_forgets_freed_bytes():
    r = RS.Residency(4 * UNIT, UNIT, "fifo")
    r.admit([U(0, 3)], 0)
    assert r.release([(UNIT + 4096, UNIT)]) == UNIT          # the tail of unit 1 and the head of unit 2
    assert r.resident_bytes == 2 * UNIT and set(r.resident) == {0, 1, 2}
    assert r.release([U(0, 3)]) == 2 * UNIT and r.resident_bytes == 0 and not r.resident
    assert r.release([U(7)]) == 0


def test_a_freed_allocation_leaves_the_residency_estimate_and_the_allocation_cache():
    """Regression: freed memory kept its room in the emulated capacity (later launches evicted live
    data for it, and evicting it was refused) and its cached allocation answered for a reused address."""
    f, bases = fake_with_buffers(3)
    e = E.Engine(f, "alloc", capacity=8 * MiB)
    e.on_launch(mk_launch("k", [bases[0], bases[1]]))
    assert e.residency.resident_bytes == 8 * MiB and e.allocs.cached(bases[0]) is not None
    e.on_free(bases[0] + 123)
    assert e.residency.resident_bytes == 4 * MiB and e.allocs.cached(bases[0]) is None
    f.log.clear()
    e.on_launch(mk_launch("k", [bases[2]]))                   # fits beside bases[1]: nothing evicted
    assert [x for x in f.log if x[0] == "host"] == [] and e.stats.errors == e.stats.failed_calls == 0
    e.on_free(BASE - 1 * MiB)                                  # not an allocation it knows: nothing happens
    assert e.residency.resident_bytes == 8 * MiB and e.stats.errors == 0


def test_free_callbacks_report_the_freed_pointer_at_enter():
    from types import SimpleNamespace as NS

    from pagecast.collect import launch_hook as lh
    from pagecast.collect.managed import CB_cudaFree, CB_cuMemFree_v2, free_callbacks
    freed = []
    views = {"drv_free": lambda p: NS(dptr=p + 1), "rt_free": lambda p: NS(dev_ptr=p + 2)}
    cbs = free_callbacks(freed.append, views)
    assert set(cbs) == {(lh.DOMAIN_DRIVER, CB_cuMemFree_v2), (lh.DOMAIN_RUNTIME, CB_cudaFree)}
    for (dom, cbid), fn in cbs.items():
        fn(lh.API_ENTER, NS(function_params=100 * dom))
        fn(lh.API_EXIT, NS(function_params=100 * dom))
    assert sorted(freed) == [101, 202]


def test_the_runner_watches_frees(tmp_path, fake_launch_module):
    from pagecast.collect import launch_hook as lh
    from pagecast.collect.managed import CB_cudaFree, CB_cuMemFree_v2
    script = tmp_path / "work.py"
    script.write_text("import pagecast_test_launch as L\nL.launch(0)\n")
    fake = fake_launch_module.fake
    made = []

    class Hook(FakeHook):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            made.append(self)

    assert C.child_main(job_argv(tmp_path, "alloc", str(tmp_path / "r.json"), ["python", str(script)]),
                        cuda=fake, monitor=FakeMonitor(fake), hook_factory=Hook) == 0
    assert {(lh.DOMAIN_DRIVER, CB_cuMemFree_v2), (lh.DOMAIN_RUNTIME, CB_cudaFree)} <= set(made[0].api_callbacks)


def test_launches_from_several_threads_go_through_the_engine_one_at_a_time():
    """PyTorch launches from its autograd thread beside the main one: the residency estimate and the
    caches are not thread-safe, so the engine takes its launches one at a time."""
    import threading
    f, bases = fake_with_buffers(4)
    e = E.Engine(f, "alloc", capacity=8 * MiB)
    inside, most = [0], [0]
    real = e._launch

    def slow(t, la):
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        time.sleep(0.001)
        real(t, la)
        inside[0] -= 1

    e._launch = slow
    threads = [threading.Thread(target=lambda i=i: [e.on_launch(mk_launch("k", [bases[(i + j) % 4]]))
                                                    for j in range(20)]) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert most[0] == 1 and e.stats.launches == 80 and e.stats.errors == 0
    assert e.residency.resident_bytes <= 8 * MiB
