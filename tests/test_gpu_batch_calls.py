"""Batched prefetch calls: used only where the driver hands them out (CUDA 13.0's symbol set, as
tests/standin_libcuda.c answers cuGetProcAddress), one call per launch and direction, ranges of
one allocation merged per 2 MiB chunk; per-range calls everywhere else."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import struct

import pytest

from pagecast.collect.launch_hook import LaunchArgs
from pagecast.replay.gpu import cuda_engine as E
from pagecast.replay.online.ranges import UNIT
from cuda_standin import FakeCuda

ROOT = Path(__file__).resolve().parents[1]
BATCH = frozenset({"cuMemPrefetchBatchAsync", "cuMemDiscardBatchAsync", "cuMemDiscardAndPrefetchBatchAsync"})


def mk(words, stream=5):
    data = struct.pack(f"<{len(words)}Q", *words)
    return LaunchArgs(kernel="k", function=0, grid_x=1, grid_y=1, grid_z=1, block_x=1, block_y=1, block_z=1,
                      shared_mem_bytes=0, stream=stream, correlation_id=0,
                      param_offsets=tuple(8 * i for i in range(len(words))), param_sizes=(8,) * len(words),
                      param_data=data, cbid=0)


def run(batch):
    f = FakeCuda(batch=batch)
    a, b = f.alloc_managed(8 * UNIT), f.alloc_managed(8 * UNIT)

    def predict(la, allocs):   # scattered 4 KiB pieces: three in a's first chunk, one in b, one in a's third
        return [(a, 4096), (a + 65536, 4096), (a + 2 * 65536, 4096), (a + 2 * UNIT, 4096), (b, 8192)]

    e = E.Engine(f, "template", capacity=4 * UNIT, predict=predict)
    e.on_launch(mk([a, b]))
    assert e.stats.errors == 0, e.stats.last_error
    return f, e, a, b


def test_one_batched_call_per_launch_where_the_driver_has_it():
    f, e, a, b = run(BATCH)
    calls = [x for x in f.log if x[0] in ("gpu", "host", "batch")]
    assert calls == [("batch", ((a, 2 * 65536 + 4096), (a + 2 * UNIT, 4096), (b, 8192)), True, 5)]
    assert e.stats.batch_calls == 1 and e.stats.prefetches == 1


def test_range_by_range_where_it_does_not():
    f, e, a, b = run(frozenset())
    assert not [x for x in f.log if x[0] == "batch"]
    assert [x[1:3] for x in f.log if x[0] == "gpu"] == [(a, 4096), (a + 65536, 4096), (a + 2 * 65536, 4096),
                                                       (a + 2 * UNIT, 4096), (b, 8192)]
    assert e.stats.batch_calls == 0 and e.stats.prefetches == 5


def test_a_refused_batch_is_retried_range_by_range():
    f = FakeCuda(batch=BATCH)
    a = f.alloc_managed(4 * UNIT)
    e = E.Engine(f, "template", predict=lambda la, al: [(a, 4096), (a + UNIT, 4096)])
    f.prefetch_batch = lambda *x, **k: (_ for _ in ()).throw(RuntimeError("CUDA_ERROR_INVALID_VALUE"))
    e.on_launch(mk([a]))
    assert [x[1:3] for x in f.log if x[0] == "gpu"] == [(a, 4096), (a + UNIT, 4096)]


PROBE = r'''
import json
from cuda.bindings import driver as drv
from pagecast.replay.gpu.driver import DriverCuda
drv.cuInit(0)
c = object.__new__(DriverCuda)
c._d = drv
print("OUT " + json.dumps(sorted(c.batch_calls())))
'''


@pytest.mark.parametrize("listed", [True, False])
def test_the_driver_is_asked_for_the_batched_calls_by_name(listed, tmp_path):
    """Through the stand-in libcuda.so.1: a CUDA 13.0 symbol set has the three batched calls; a
    driver whose set lacks them gives none, and the runner then calls range by range."""
    pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is not installed")
    import shutil

    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler to build the stand-in libcuda.so.1")
    r = subprocess.run([cc, "-O1", "-shared", "-fPIC", "-o", str(tmp_path / "libcuda.so.1"),
                        str(ROOT / "tests" / "standin_libcuda.c")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    surface = json.loads((ROOT / "tests" / "data" / "cuda13.0-surface.json").read_text())["driver_functions"]
    assert BATCH <= set(surface)            # CUDA 13.0's driver API has them
    names = sorted(set(surface) - (set() if listed else BATCH))
    (tmp_path / "symbols.txt").write_text("\n".join(names) + "\n")
    env = {**os.environ, "LD_LIBRARY_PATH": str(tmp_path), "PAGECAST_STANDIN_CUDA_SYMBOLS": str(tmp_path / "symbols.txt")}
    p = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("OUT ")]
    assert p.returncode == 0 and line, p.stderr[-2000:]
    assert set(json.loads(line[-1][4:])) == (BATCH if listed else set())
