"""The GPU runner on a real GPU (skipped without one: CI has none).

Small and quick: the driver interface on managed memory, the UVM counters on a
touch kernel, and `run_gpu_replay` on a tiny CuPy workload under demand and
alloc at an emulated capacity.
"""

from __future__ import annotations

import json
import os

import pytest

from pagecast.replay.gpu.driver import no_gpu_reason

MiB = 2**20


def _observe(what: str, value) -> None:
    """Print (pytest -rs shows it with -s) and record, for the device-check report, what the driver did."""
    print(f"OBSERVED {what}: {value}")
    path = os.environ.get("PAGECAST_DEVICE_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"test": "runner-observed", "what": what, "value": value}, default=str) + "\n")


_WHY = no_gpu_reason()
REASON = None if _WHY is None else f"needs an NVIDIA GPU with a CUDA 13 driver ({_WHY})"
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=REASON or "")]


def test_driver_interface_on_managed_memory():
    from pagecast.replay.gpu.driver import open_cuda

    cuda = open_cuda()
    free, total = cuda.mem_info()
    assert 0 < free <= total
    base = cuda.alloc_managed(8 * MiB)
    try:
        a = cuda.allocation_of(base + 4096)
        assert a.base == base and a.size >= 8 * MiB and a.managed
        s = cuda.new_stream()
        cuda.prefetch_to_gpu(base, 8 * MiB, s)
        cuda.prefetch_to_host(base, 4 * MiB, s)
        cuda.launch_touch(base, 16, 64 * 1024, s)
        cuda.synchronize()
    finally:
        cuda.free(base)
    assert cuda.allocation_of(1 << 20) is None


UVM_SCRIPT = """
import json, sys
from pagecast.replay.gpu.cupti_monitor import CuptiMonitor
from pagecast.replay.gpu.driver import open_cuda
mon = CuptiMonitor(0)
mon.start()
cuda = open_cuda()
base = cuda.alloc_managed(64 * 2**20)
cuda.prefetch_to_host(base, 64 * 2**20, 0)
cuda.synchronize()
cuda.launch_touch(base, 256, 64 * 1024, 0)
cuda.synchronize()
c = mon.stop()
cuda.free(base)
print(json.dumps({"faults": c.faults, "htod": c.htod_bytes, "kernels": c.kernels}))
"""


def test_uvm_counters_see_the_faults_of_a_touch_kernel():
    import json
    import subprocess
    import sys

    # in its own process: CUPTI's activity callbacks are process-wide
    p = subprocess.run([sys.executable, "-c", UVM_SCRIPT], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    c = json.loads(p.stdout.strip().splitlines()[-1])
    assert c["faults"] > 0 and c["htod"] >= 64 * 1024 and c["kernels"] >= 1


WORKLOAD = """
import cupy as cp
cp.cuda.set_allocator(cp.cuda.MemoryPool(cp.cuda.malloc_managed).malloc)
xs = [cp.ones(16 * 2**20 // 4, dtype=cp.float32) for _ in range(4)]
for step in range(10):
    for i in range(4):
        xs[i] *= 1.0001
cp.cuda.Device().synchronize()
"""


def test_run_gpu_replay_on_a_tiny_cupy_workload(tmp_path):
    pytest.importorskip("cupy")
    from pagecast.replay.gpu.backend import run_gpu_replay
    from pagecast.replay.request import ReplayRequest

    script = tmp_path / "w.py"
    script.write_text(WORKLOAD)
    cfg = ReplayRequest(backend="gpu", workload=("python", str(script)), policies=("demand", "alloc"),
                        capacity=(32 * MiB,))
    rows, timeline = run_gpu_replay(cfg)
    by = {r["policy"]: r for r in rows}
    assert set(by) == {"demand", "alloc"}
    # the first repeat of each run reports its kernels' timeline
    assert timeline is not None and set(timeline.column("policy").to_pylist()) == {"demand", "alloc"}
    assert by["demand"]["launches"] >= 40 and by["demand"]["faults"] > 0
    assert by["alloc"]["prefetch_bytes"] > 0 and by["alloc"]["evict_bytes"] > 0
    assert by["alloc"]["faults"] < by["demand"]["faults"]
    assert all(r["time_s"] > 0 and r["backend"] == "gpu" for r in rows)


def _launch(kernel: str, words: list[int], stream: int = 0):
    import struct

    from pagecast.collect.launch_hook import LaunchArgs

    return LaunchArgs(kernel=kernel, function=0, grid_x=1, grid_y=1, grid_z=1, block_x=1, block_y=1, block_z=1,
                      shared_mem_bytes=0, stream=stream, correlation_id=0,
                      param_offsets=tuple(8 * i for i in range(len(words))), param_sizes=(8,) * len(words),
                      param_data=struct.pack(f"<{len(words)}Q", *words))


def test_calibration_kernels_touch_one_word_per_stride_and_copy_exactly():
    """The hand-written PTX (KERNELS_PTX), JIT-compiled by this driver: pagecast_touch adds 1 to the
    word at base + i * stride for i < n and nothing else; pagecast_copy copies n bytes."""
    import ctypes

    from pagecast.replay.gpu.driver import open_cuda

    cuda = open_cuda()
    n, stride = 300, 64 * 1024                     # 300 threads: two blocks, the second partly idle
    base = cuda.alloc_managed((n + 2) * stride)
    src = cuda.alloc_managed(4 * MiB)
    dst = cuda.alloc_managed(4 * MiB)
    try:
        ctypes.memset(base, 0, (n + 2) * stride)  # managed memory is host-accessible (nothing queued)
        s = cuda.new_stream()
        cuda.launch_touch(base, n, stride, s)
        cuda.synchronize()
        words = [ctypes.c_uint32.from_address(base + i * stride).value for i in range(n + 2)]
        assert words == [1] * n + [0, 0]
        assert ctypes.c_uint32.from_address(base + 4).value == 0
        pattern = bytes(range(256)) * (4 * MiB // 256)
        ctypes.memmove(src, pattern, len(pattern))
        ctypes.memset(dst, 0, 4 * MiB)
        cuda.launch_copy(dst, src, 4 * MiB, s)
        cuda.synchronize()
        assert ctypes.string_at(dst, 4 * MiB) == pattern
    finally:
        for b in (base, src, dst):
            cuda.free(b)


def test_the_default_stream_handles_the_engine_names():
    """gpu_engine.launch_stream turns a launch's stream 0 into CU_STREAM_LEGACY / CU_STREAM_PER_THREAD:
    prefetches, event records and waits on those handles must be accepted."""
    from pagecast.replay.gpu.driver import open_cuda
    from pagecast.replay.gpu.cuda_engine import LEGACY_STREAM, PER_THREAD_STREAM

    cuda = open_cuda()
    base = cuda.alloc_managed(4 * MiB)
    try:
        side, ev = cuda.new_stream(), cuda.new_event()
        for st in (LEGACY_STREAM, PER_THREAD_STREAM):
            cuda.prefetch_to_gpu(base, 4 * MiB, st)
            cuda.record_event(ev, st)
            cuda.stream_wait_event(side, ev)
            cuda.prefetch_to_host(base, 2 * MiB, side)
            cuda.record_event(ev, side)
            cuda.stream_wait_event(st, ev)
            cuda.launch_touch(base, 64, 64 * 1024, st)
        cuda.synchronize()
    finally:
        cuda.free(base)


def test_prefetches_stay_within_one_allocation():
    """The engine cuts ranges at allocation boundaries (gpu_ranges.AllocationMap.pieces). Observed too:
    whether this driver takes one cuMemPrefetchAsync over two adjacent managed allocations."""
    from pagecast.replay.gpu.driver import CudaCallError, open_cuda
    from pagecast.replay.gpu.cuda_engine import Engine
    from pagecast.replay.online.ranges import pointer_words

    cuda = open_cuda()
    bufs = [cuda.alloc_managed(2 * MiB) for _ in range(16)]
    try:
        pairs = sorted((a, b) for a in bufs for b in bufs if b == a + 2 * MiB)
        if pairs:
            a, _ = pairs[0]
            try:
                cuda.prefetch_to_gpu(a, 4 * MiB, 1)
                cuda.synchronize()
                seen = "accepted"
            except CudaCallError as e:
                seen = f"refused ({e})"
        else:
            seen = "not tried: no two of 16 managed 2 MiB allocations were adjacent"
        _observe("cuMemPrefetchAsync over two adjacent managed allocations", seen)
        # each launch needs four buffers (8 MiB, the capacity): the next four evict them; ranges over
        # adjacent buffers are merged by the estimate and cut again for the driver
        e = Engine(cuda, "alloc", capacity=8 * MiB,
                   predict=lambda la, al: [(w, 2 * MiB) for w in pointer_words(la.param_data)])
        for i in range(4):
            e.on_launch(_launch("k", sorted(bufs)[4 * i:4 * i + 4]))
        cuda.synchronize()
        assert e.stats.errors == 0 and e.stats.failed_calls == 0, e.stats.last_error
        assert e.stats.prefetches >= 16 and e.stats.evictions > 0
    finally:
        for b in bufs:
            cuda.free(b)


UVM_AFTER_CONTEXT = """
import json
from pagecast.replay.gpu.cupti_monitor import CuptiMonitor
from pagecast.replay.gpu.driver import open_cuda
cuda = open_cuda()                      # the context exists first, as in a user's program
base = cuda.alloc_managed(64 * 2**20)
mon = CuptiMonitor(0)
try:
    mon.start(keep_records=True, live=True)
except Exception as e:
    print(json.dumps({"error": str(e)}))
    raise SystemExit(0)
cuda.prefetch_to_host(base, 64 * 2**20, 1)
cuda.synchronize()
cuda.launch_touch(base, 256, 64 * 1024, 1)
cuda.synchronize()
c = mon.stop()
cuda.free(base)
print(json.dumps({"faults": c.faults, "htod": c.htod_bytes, "kernels": c.kernels, "fault_records": len(c.fault_records)}))
"""


def test_uvm_counters_started_after_the_context_exists():
    """Counters started inside a program whose CUDA context already exists (gpu_child, calibrate and
    pagecast.prefetching start them before): they start, and kernels are recorded, but on an H200
    (driver 580.159, CUPTI 13.5) they counted no faults: `prefetching(feedback=True)` warns where it
    finds a context already there. Also exercises the live flush thread (live=True) for a hang."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", UVM_AFTER_CONTEXT], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    c = json.loads(p.stdout.strip().splitlines()[-1])
    _observe("CUPTI unified-memory counters started after the context exists (256 pages touched)", c)
    assert "error" not in c, c["error"]
    assert c["kernels"] >= 1          # the faults are recorded above (0 on an H200), not required
