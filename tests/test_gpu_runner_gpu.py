"""The GPU runner on a real GPU (skipped without one: CI has none).

Small and quick: the driver interface on managed memory, the UVM counters on a
touch kernel, and `run_gpu_replay` on a tiny CuPy workload under demand and
alloc at an emulated capacity.
"""

from __future__ import annotations

from argparse import Namespace

import pytest

from pagecast.replay.cuda_iface import no_gpu_reason

MiB = 2**20


_WHY = no_gpu_reason()
REASON = None if _WHY is None else f"needs an NVIDIA GPU with a CUDA 13 driver ({_WHY})"
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=REASON or "")]


def test_driver_interface_on_managed_memory():
    from pagecast.replay.cuda_iface import open_cuda

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
from pagecast.replay.cuda_iface import CuptiMonitor, open_cuda
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
    from pagecast.replay.gpu_runner import run_gpu_replay

    script = tmp_path / "w.py"
    script.write_text(WORKLOAD)
    args = Namespace(traces=[], policy=["demand", "alloc"], capacity=[32 * MiB], oversub=None, model=None,
                     plan=None, feedback=False, costs=None, repeat=1, allow_oversubscription=False,
                     workload=["python", str(script)], json=True, output=None, force=False)
    rows, timeline = run_gpu_replay(args)
    by = {r["policy"]: r for r in rows}
    assert set(by) == {"demand", "alloc"} and timeline is None
    assert by["demand"]["launches"] >= 40 and by["demand"]["faults"] > 0
    assert by["alloc"]["prefetch_bytes"] > 0 and by["alloc"]["evict_bytes"] > 0
    assert by["alloc"]["faults"] < by["demand"]["faults"]
    assert all(r["time_s"] > 0 and r["backend"] == "gpu" for r in rows)
