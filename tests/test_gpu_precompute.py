"""Planned runs decide from footprints laid out once (decide.PRECOMPUTE): the same bytes and the
same decisions as the launch-by-launch Python path, on a real H200 trace relocated to other
addresses (benchmarks/bench_child_callback.py times both)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from pagecast import trace as T
from pagecast.collect.launch_hook import LaunchArgs
from pagecast.replay.gpu import cuda_engine as E
from pagecast.replay.online import decide as D
from pagecast.replay.online.ranges import Allocation, merge_ranges
from pagecast.replay.online.relocate import Relocator
from pagecast.replay.unit_space import managed_bytes
from cuda_standin import InertCuda

TRACE = Path(__file__).resolve().parent / "data" / "h200" / "jacobi2d-1.pctrace"
SHIFT = 1 << 36


class LogCuda(InertCuda):
    def __init__(self, allocs):
        super().__init__()
        self.allocs = sorted(allocs)
        self.log = []

    def allocation_of(self, addr):
        for a, n in self.allocs:
            if a <= addr < a + n:
                return Allocation(a, n, True)
        return None

    def prefetch_to_gpu(self, addr, nbytes, stream=0):
        self.log.append(("gpu", addr, nbytes))

    def prefetch_to_host(self, addr, nbytes, stream=0):
        self.log.append(("host", addr, nbytes))


@pytest.fixture(scope="module")
def run():
    tr = T.read_trace(TRACE)
    al = tr.allocations
    lo = min(al.column(T.ADDRESS).to_pylist())
    hi = max(a + n for a, n in zip(al.column(T.ADDRESS).to_pylist(), al.column(T.BYTES).to_pylist()))
    las = []
    for i, row in enumerate(tr.launches.select([T.KERNEL, T.PARAM_OFFSETS, T.PARAM_SIZES, T.PARAM_DATA]).to_pylist()):
        data = bytearray(row[T.PARAM_DATA] or b"")
        for off, size in zip(row[T.PARAM_OFFSETS], row[T.PARAM_SIZES]):
            if size == 8 and lo <= struct.unpack_from("<Q", data, off)[0] < hi:
                struct.pack_into("<Q", data, off, struct.unpack_from("<Q", data, off)[0] + SHIFT)
        las.append(LaunchArgs(kernel=row[T.KERNEL], function=0, grid_x=1, grid_y=1, grid_z=1, block_x=1, block_y=1,
                              block_z=1, shared_mem_bytes=0, stream=7, correlation_id=i,
                              param_offsets=tuple(row[T.PARAM_OFFSETS]), param_sizes=tuple(row[T.PARAM_SIZES]),
                              param_data=bytes(data), cbid=0))
    allocs = [(a + SHIFT, n) for a, n in zip(al.column(T.ADDRESS).to_pylist(), al.column(T.BYTES).to_pylist())]
    return tr, las, allocs


def test_the_laid_out_footprints_are_the_relocated_ones(run):
    tr, las, _ = run
    slow, fast = Relocator(tr), Relocator(tr).layout()
    moved = 0
    for t, la in enumerate(las):
        assert slow.observe(t, la.kernel, la.param_data) and fast.observe(t, la.kernel, la.param_data)
        a = merge_ranges(slow.footprint(t))
        b = merge_ranges(fast.footprint_arrays(t).tolist())
        assert a == b, t
        moved += sum(n for _, n in b)
    assert moved > 0 and slow.unmapped_bytes == fast.unmapped_bytes and slow.delta == fast.delta
    assert all(d == SHIFT for d in fast.delta.values())


@pytest.mark.parametrize("policy", ["demand", "template", "oracle"])
def test_precomputed_and_python_paths_decide_alike(run, policy, monkeypatch):
    tr, las, allocs = run
    cap = managed_bytes(tr) // 2

    def predict(la, am):   # the trace's own footprint stands in for a model: both paths get the same
        return []

    logs = {}
    for pre in (False, True):
        monkeypatch.setattr(D, "PRECOMPUTE", pre)
        cuda = LogCuda(allocs)
        e = E.Engine(cuda, policy, capacity=cap, relocator=Relocator(tr),
                     predict=predict if policy == "template" else None)
        for la in las:
            e.on_launch(la)
        assert e.stats.errors == 0, e.stats.last_error
        logs[pre] = (cuda.log, e.stats.evict_bytes, e.stats.prefetch_bytes)
    if policy == "oracle":   # Belady's scores come through the allocations a unit overlaps, not the
        # ranges seen in it so far: ties may fall otherwise; the bytes moved in are the footprints
        assert logs[True][2] == pytest.approx(logs[False][2], rel=0.05)
    else:
        assert logs[True] == logs[False]
