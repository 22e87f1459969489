"""The GPU runner's capacity emulation is driven by what moved, not by what it decided.

A stand-in driver (tests/cuda_standin.py's FakeCuda) reports, as CUPTI's unified-memory counters
do, migrations the runner never asked for: the pages a kernel faulted in and the rest of each
faulted 2 MiB block that the driver's prefetcher brought along. The ledger must count them and
evict them, so that the emulated GPU holds at most its capacity, in 2 MiB chunks, at every launch
boundary, for demand (which prefetches nothing and cannot know what a kernel reads through a
pointer table) as for a planned policy whose prediction saw only part of what the kernel touches.
"""

from __future__ import annotations

import json
import struct
import sys
import types

import pytest

from pagecast.collect.launch_hook import LaunchArgs
from pagecast.replay.gpu import child as C
from pagecast.replay.gpu import cuda_engine as E
from pagecast.replay.gpu.backend import aggregate
from pagecast.replay.request import ReplayRequest
from pagecast.replay.online.ranges import UNIT
from cuda_standin import FakeCuda, FakeHook, FakeMonitor

MiB = 2**20
BASE = 1 << 40


def mk_launch(kernel: str, words: list[int], stream: int = 7) -> LaunchArgs:
    data = struct.pack(f"<{len(words)}Q", *words)
    return LaunchArgs(kernel=kernel, function=0, grid_x=1, grid_y=1, grid_z=1, block_x=256, block_y=1, block_z=1,
                      shared_mem_bytes=0, stream=stream, correlation_id=0,
                      param_offsets=tuple(8 * i for i in range(len(words))), param_sizes=(8,) * len(words),
                      param_data=data, cbid=0)


def buffers(f: FakeCuda, n: int, size: int = UNIT) -> list[int]:
    return [f.alloc_managed(size) for _ in range(n)]


def run(policy: str, f: FakeCuda, launches, cap_units: int, predict=None):
    """Each launch: the runner's callback, then the kernel (`touch`). Returns the engine and the
    chunks resident on the stand-in GPU at each boundary (after the callback, before the kernel)."""
    mon = FakeMonitor(f)
    mon.start()
    e = E.Engine(f, policy, capacity=cap_units * UNIT, predict=predict)
    e.moved = mon.take_migrations      # what the counters report (the child wires it the same way)
    at_boundary = []
    for la, touched in launches:
        e.on_launch(la)
        at_boundary.append(f.resident_chunks())
        for a, n in touched:
            f.touch(a, n)
    assert e.stats.errors == 0, e.stats.last_error
    return e, at_boundary


def test_demand_evicts_what_kernels_faulted_in_through_a_pointer_table():
    """The kernel's only argument is a table of pointers; what it reads is invisible to the runner."""
    f = FakeCuda(driver_prefetch=True)
    table = f.alloc_managed(4096)
    bufs = buffers(f, 8)
    launches = [(mk_launch("gather", [table]), [(table, 4096), (bufs[i % 8], UNIT // 4), (bufs[(i + 3) % 8], 4096)])
                for i in range(40)]
    e, seen = run("demand", f, launches, cap_units=4)
    assert max(seen) <= 4, seen
    st = e.stats
    assert st.unplanned_htod_bytes > 0 and st.evict_bytes > 0
    assert st.max_excess_bytes == 0 and st.boundaries_over == 0
    # the pages the kernels faulted in (and the driver's prefetch of the rest of their blocks) were evicted
    evicted = {a // UNIT for x in f.log if x[0] == "host" for a in range(x[1], x[1] + x[2], UNIT)}
    assert evicted & {b // UNIT for b in bufs}


def test_a_partial_prediction_still_holds_the_capacity():
    """The model predicts a quarter of one buffer (what a trace's faults showed with the driver's
    prefetcher on); the kernel reads two buffers. The ledger counts the rest from the counters."""
    f = FakeCuda(driver_prefetch=True)
    bufs = buffers(f, 8)

    def predict(la, allocs):
        return [(struct.unpack_from("<Q", la.param_data)[0], UNIT // 4)]

    launches = []
    for i in range(48):
        a, b = bufs[i % 8], bufs[(i + 4) % 8]
        launches.append((mk_launch(f"k{i % 8}", [a, b]), [(a, UNIT), (b, UNIT // 2)]))
    for policy in ("template", "demand"):
        g = FakeCuda(driver_prefetch=True)
        gb = buffers(g, 8)
        assert gb == bufs
        e, seen = run(policy, g, launches, cap_units=3, predict=predict if policy == "template" else None)
        assert max(seen) <= 3, (policy, seen)
        assert e.stats.max_excess_bytes == 0


@pytest.mark.parametrize("policy", ["demand", "template"])
def test_the_ledger_forgets_what_left_by_any_cause(policy):
    """Device-to-host migrations the runner did not make (the host read a buffer back) leave the
    ledger: it does not evict what is no longer there, and has room for more."""
    f = FakeCuda()
    bufs = buffers(f, 4)

    def predict(la, allocs):
        return [(struct.unpack_from("<Q", la.param_data)[0], UNIT)]

    mon = FakeMonitor(f)
    mon.start()
    e = E.Engine(f, policy, capacity=2 * UNIT, predict=predict if policy == "template" else None)
    e.moved = mon.take_migrations
    e.on_launch(mk_launch("k", [bufs[0]]))
    f.touch(bufs[0], UNIT)
    e.on_launch(mk_launch("k", [bufs[1]]))
    f.touch(bufs[1], UNIT)
    f.prefetch_to_host(bufs[0], UNIT)     # not the runner's call: the workload's own, say
    f.log.clear()
    e.on_launch(mk_launch("k", [bufs[2]]))
    assert [x for x in f.log if x[0] == "host"] == []     # bufs[0] left already: room for bufs[2]
    assert e.residency.resident_units == 2


def test_the_child_wires_the_counters_to_the_ledger_and_reports_the_excess(tmp_path, monkeypatch):
    """Through the child's own path: the monitor's migrations drive the ledger; the run reports what
    moved unasked, the largest excess (none) and that it is valid."""
    f = FakeCuda(driver_prefetch=True)
    table = f.alloc_managed(4096)
    bufs = buffers(f, 6)
    mod = types.ModuleType("pagecast_ledger_launch")

    def launch(i):
        FakeHook.current.on_launch(mk_launch("gather", [table]))
        seen.append(f.resident_chunks())
        f.touch(bufs[i % 6], UNIT // 8)

    seen: list[int] = []
    mod.launch = launch
    monkeypatch.setitem(sys.modules, "pagecast_ledger_launch", mod)
    script = tmp_path / "work.py"
    script.write_text("import pagecast_ledger_launch as L\nfor i in range(30):\n    L.launch(i)\n")
    req = ReplayRequest(backend="gpu", policies=("demand",), capacity=(3 * UNIT,), workload=("python", str(script)))
    job = tmp_path / "job.json"
    res = tmp_path / "r.json"
    job.write_text(C.ChildJob(request=req, result=str(res)).to_json())
    assert C.child_main([str(job)], cuda=f, monitor=FakeMonitor(f), hook_factory=FakeHook) == 0
    out = json.loads(res.read_text())
    assert max(seen) <= 3
    assert out["unplanned_htod_bytes"] > 0 and out["evict_bytes"] > 0
    assert out["max_excess_bytes"] == 0 and out["valid"] is True


def test_a_run_over_the_capacity_by_more_than_a_chunk_is_not_valid():
    runs = [{"time_s": 1.0, "max_excess_bytes": 0, "valid": True},
            {"time_s": 2.0, "max_excess_bytes": 3 * UNIT, "valid": False}]
    a = aggregate(runs)
    assert a["max_excess_bytes"] == 3 * UNIT and a["valid"] is False and a["times_s"] == [1.0, 2.0]
