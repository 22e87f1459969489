"""Index values in the CUPTI collector's full mode (collect/values_copy.py), on the CPU with
stand-ins: what each launch's pointers point to, copied before its kernel runs, within the
per-launch budget, repeats left out, read back by the trace's ValueImage. Not run on a GPU."""

from __future__ import annotations

import ctypes


import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagecast import trace as T
from pagecast import values as V
from pagecast.collect import values_copy as VC

import collect_standin as S

PAGE = S.PAGE
pytest.importorskip("cupti.cupti", reason="cupti-python is not installed (pip install .[test])")


_read = S.read_quiet


def test_values_are_what_the_buffers_held_before_each_launch(tmp_path):
    c, gpu = S.make_collector(tmp_path / "t", mode="full", memory=True)
    dev = gpu.dev
    seen = []

    def workload():
        idx = gpu.malloc_managed(4 * 64)              # a small index buffer (its allocation: 256 bytes)
        y = gpu.malloc_managed(64 * PAGE)
        for step in range(4):
            ids = np.arange(64, dtype="<i4") * (1 + step // 2)   # the same for two launches in a row
            dev.write(idx, ids.tobytes())               # the host (or a producer kernel) writes them
            seen.append(ids)
            gpu.saxpy(idx, y, 64)
            dev.write(idx, b"\xff" * 256)               # changed after the launch: not what it read
        gpu.free(idx)

    assert c.run(workload) == 0
    t = _read(tmp_path / "t")
    m = t.manifest[T.VALUES_KEY]
    assert m["repeats"] == "omitted" and m["limit_bytes"] == VC.LIMIT
    im = V.image(t)
    x = np.frombuffer(b"".join(t.launches.column(T.PARAM_DATA).to_pylist()), np.uint8).reshape(4, -1)
    idx = int(x[0, :8].view("<u8")[0])
    rows = im.find(np.arange(4), np.full(4, idx, np.uint64))
    assert (rows >= 0).all()
    for i in range(4):
        assert np.array_equal(im.ints(int(rows[i]), 64), seen[i])
    # launches 1 and 3 repeat the row before them: left out, found all the same
    assert len({int(r) for r in rows}) == 2
    info = t.manifest["collection"]
    assert info["values_launches"] == 4 and info["values_late"] == 0 and info["values_errors"] == 0


def test_small_buffers_come_whole_beside_a_large_one_and_the_rest_is_clipped(tmp_path):
    c, gpu = S.make_collector(tmp_path / "t", mode="full", memory=True, values_limit=16 << 10)
    dev = gpu.dev

    def workload():
        big = gpu.malloc_managed(64 * PAGE)             # 256 KiB: more than the budget
        small = gpu.malloc_managed(1024)
        dev.write(small, bytes(range(256)) * 4)
        gpu.saxpy(big, small, 256)

    assert c.run(workload) == 0
    t = _read(tmp_path / "t")
    v = t.values
    by_off = {o: (a, n) for o, a, n in zip(v.column(T.PARAM_OFFSET).to_pylist(), v.column(T.ADDRESS).to_pylist(),
                                           v.column(T.BYTES).to_pylist())}
    assert by_off[8][1] == 1024 and by_off[0][1] == (16 << 10) - 1024   # the small one whole, the big clipped
    assert v.column(T.DATA)[[k for k, o in enumerate(v.column(T.PARAM_OFFSET).to_pylist()) if o == 8][0]].as_py() \
        == bytes(range(256)) * 4
    m = t.manifest[T.VALUES_KEY]
    assert m["clipped_launches"] == 1 and m["clipped_bytes"] == 64 * PAGE - ((16 << 10) - 1024)
    assert sum(n for _, n in dev.reads) <= 16 << 10


def test_no_values_outside_full_mode_or_without_a_copying_device(tmp_path):
    for kw in ({"mode": "natural", "memory": True}, {"mode": "full", "memory": False},
               {"mode": "full", "memory": True, "values_limit": 0}):
        out = tmp_path / f"t{len(list(tmp_path.iterdir()))}"
        c, gpu = S.make_collector(out, **kw)

        def workload():
            x = gpu.malloc_managed(4 * PAGE)
            gpu.saxpy(x, x, 16)

        assert c.run(workload) == 0
        t = _read(out)
        assert t.values is None and T.VALUES_KEY not in t.manifest


def test_a_late_launch_and_a_failed_copy_are_counted_not_fatal():
    live = [(0x1000, 4096)]
    calls = []

    def read(a, n):
        calls.append((a, n))
        raise RuntimeError("cuMemcpyDtoH: CUDA_ERROR_ILLEGAL_ADDRESS")

    cp = VC.ValuesCopier(read, lambda: live, limit=1024)
    data = (0x1000).to_bytes(8, "little") + (0x1800).to_bytes(8, "little") + (7).to_bytes(4, "little")
    assert cp.record(0, (0, 8, 16), (8, 8, 4), data, late=True) == 0 and not calls
    assert cp.record(1, (0, 8, 16), (8, 8, 4), data) == 0
    assert cp.stats.errors == 2 and cp.stats.late == 1 and "ILLEGAL_ADDRESS" in cp.stats.last_error


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 1 << 20), max_size=8), st.integers(1, 1 << 18))
def test_water_filling_keeps_the_budget_and_gives_short_buffers_their_all(ns, limit):
    ns = sorted(ns)
    reads = [(8 * i, 0x1000 + i, n) for i, n in enumerate(ns)]
    ks = VC.share(reads, limit)
    assert sum(ks) <= limit and all(0 <= k <= n for k, n in zip(ks, ns))
    # every clipped read got at least what any later read got, and no budget is left over when one is clipped
    clipped = [i for i, (k, n) in enumerate(zip(ks, ns)) if k < n]
    if clipped:
        assert limit - sum(ks) < len(ns)
        assert all(ks[i] >= ks[j] - 1 or ks[j] == ns[j] for i in clipped for j in range(i + 1, len(ns)))
    # a read no larger than an equal share comes whole
    assert all(k == n for k, n in zip(ks, ns) if n * len(ns) <= limit)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(1, 8)), min_size=1, max_size=6, unique_by=lambda t: t[0]),
       st.lists(st.integers(0, 50 << 16), max_size=6))
def test_pointer_reads_find_the_allocation_each_word_points_into(allocs, ptrs):
    live = sorted(((a << 16), n << 12) for a, n in allocs)
    live = [r for k, r in enumerate(live) if k == 0 or live[k - 1][0] + live[k - 1][1] <= r[0]]
    data = b"".join(p.to_bytes(8, "little") for p in ptrs) + b"\0\0\0\0"
    offs = tuple(8 * i for i in range(len(ptrs))) + (8 * len(ptrs),)
    sizes = (8,) * len(ptrs) + (4,)
    got = VC.pointer_reads(offs, sizes, data, live)
    want = []
    for i, p in enumerate(ptrs):
        for a, n in live:
            if a <= p < a + n:
                want.append((8 * i, p, a + n - p))
    assert sorted(got) == sorted(want)
    assert [g[2] for g in got] == sorted(g[2] for g in got)


class _UvmDriver:
    """The cuda-bindings driver calls `CudaDevice` makes, over a page-residency model of managed
    memory: a prefetch to the host moves pages there; a device-to-host copy (cuMemcpyDtoH) is
    done by the GPU, modelled as bringing the source pages to the GPU (what the driver may do
    before its copy engine reads them)."""

    def __init__(self) -> None:
        self.on_gpu: set[int] = set()     # page numbers resident on the GPU
        self.calls: list[str] = []

    @staticmethod
    def _pages(addr: int, n: int) -> range:
        return range(addr // PAGE, (addr + n - 1) // PAGE + 1)

    def CUdeviceptr(self, v):
        return int(v)

    def cuCtxSynchronize(self):
        self.calls.append("sync")
        return (0,)

    def cuMemPrefetchAsync(self, ptr, n, location, flags, stream):
        self.calls.append("prefetch")
        self.on_gpu.difference_update(self._pages(int(ptr), int(n)))
        return (0,)

    def cuMemcpyDtoH(self, dst, src, n):
        self.calls.append("dtoh")
        self.on_gpu.update(self._pages(int(src), int(n)))
        ctypes.memmove(dst, int(src), int(n))
        return (0,)


class _ModelledCudaDevice(S.StandInDevice):
    """The collector's real CudaDevice (synchronize, evict, read) over `_UvmDriver`; the clock is
    the host's."""

    def __init__(self) -> None:
        super().__init__()
        from pagecast.collect.cuda_device import CudaDevice

        self.real = CudaDevice.__new__(CudaDevice)
        self.real.drv, self.real.device, self.real._host = _UvmDriver(), 0, None
        self.real.errors, self.real.last_error = 0, None
        self.synchronize, self.evict, self.read = self.real.synchronize, self.real.evict, self.real.read


def test_copying_values_does_not_bring_pages_to_the_gpu_before_the_kernel(tmp_path):
    """Full mode evicts every managed range to the host before a launch so that the kernel faults
    on what it touches; the index values are copied after that. The copy must leave the pages on
    the host: read through the GPU (cuMemcpyDtoH) the driver may migrate them there first, and
    the kernel's faults on them would not be seen."""
    c, gpu = S.make_collector(tmp_path / "t", mode="full")
    dev = _ModelledCudaDevice()
    c.device = gpu.dev = dev
    from pagecast.collect.values_copy import ValuesCopier
    c.values = ValuesCopier(dev.read, c.budget.ranges)
    arena = ctypes.create_string_buffer(8 << 20)     # host memory standing in for managed memory
    base = (ctypes.addressof(arena) + (2 << 20) - 1) // (2 << 20) * (2 << 20)
    gpu.next_addr = base
    drv = dev.real.drv
    at_kernel = []
    after = c.after_launch

    def after_launch(args):                          # the kernel ran between the enter and here
        at_kernel.append(set(drv.on_gpu))
        after(args)

    c.hook.after_launch = after_launch

    def workload():
        idx = gpu.malloc_managed(4 * 64)
        y = gpu.malloc_managed(16 * PAGE)
        for step in range(3):
            ctypes.memmove(idx, (np.arange(64, dtype="<i4") * step).tobytes(), 256)
            drv.on_gpu.update(_UvmDriver._pages(idx, 256))       # the previous kernel left them on the GPU
            drv.on_gpu.update(_UvmDriver._pages(y, 16 * PAGE))
            gpu.saxpy(idx, y, 64)

    assert c.run(workload) == 0
    assert len(at_kernel) == 3 and all(not pages for pages in at_kernel), at_kernel
    assert "dtoh" not in drv.calls
    t = _read(tmp_path / "t")
    im = V.image(t)
    rows = im.find(np.arange(3), np.full(3, base, np.uint64))
    assert all(np.array_equal(im.ints(int(r), 64), np.arange(64) * s) for s, r in enumerate(rows))
