"""The GPU workloads' host code on the CPU, against a stand-in CuPy that checks
every launch against the kernel's C signature (argument count, scalar types,
pointer element types, pointers inside their arrays, launch shape). The
kernels themselves only run on a GPU (tests/test_collect_gpu.py)."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from pagecast.datasets.gpu.extents import C_POINTEES, C_SCALARS, EXTENTS, signatures


class FakeArray:
    def __init__(self, a: np.ndarray, base: np.ndarray | None = None) -> None:
        self.a = a
        self.base = a if base is None else base  # the whole allocation this view points into

    @property
    def offset(self) -> int:
        return (self.a.ctypes.data - self.base.ctypes.data) // self.a.itemsize

    @property
    def dtype(self):
        return self.a.dtype

    @property
    def itemsize(self):
        return self.a.itemsize

    @property
    def data(self):   # CuPy's MemoryPointer: where the view starts
        return types.SimpleNamespace(ptr=self.a.ctypes.data)

    @property
    def size(self):
        return self.a.size

    def __getitem__(self, idx):
        v = self.a[idx]
        return FakeArray(v, self.base) if isinstance(v, np.ndarray) else v

    def set(self, host) -> None:
        host = np.asarray(host)
        assert host.shape == self.a.shape and host.dtype == self.a.dtype, (host.shape, host.dtype, self.a.shape)
        self.a[...] = host

    def get(self) -> np.ndarray:
        return self.a.copy()


class FakeCupy(types.ModuleType):
    def __init__(self) -> None:
        super().__init__("cupy")
        self.launches: list[tuple[str, tuple, tuple, int]] = []
        self.allocated = 0
        fake = self

        class Runtime:
            @staticmethod
            def memGetInfo():
                return 64 << 30, 80 << 30

            @staticmethod
            def deviceSynchronize():
                pass

        class Cuda:
            runtime = Runtime

            @staticmethod
            def set_allocator(f):
                fake.allocator = f

            @staticmethod
            def malloc_managed(n):
                raise AssertionError("not called by the stand-in")

        self.cuda = Cuda
        self.allocator = None

        class RawModule:
            def __init__(self, code: str, **kw) -> None:
                self.sigs = signatures(code)

            def get_function(self, name: str):
                assert name in self.sigs, f"no extern \"C\" kernel {name}"
                return lambda grid, block, args, shared_mem=0: fake._launch(name, self.sigs[name], grid, block,
                                                                          args, shared_mem)

        self.RawModule = RawModule

    def empty(self, n, dtype):
        assert self.allocator is not None, "allocate after choosing the managed allocator"
        self.allocated += int(n) * np.dtype(dtype).itemsize
        return FakeArray(np.ones(int(n), dtype))  # uninitialised on a GPU; ones keep scalars finite here

    def asarray(self, host):
        assert self.allocator is not None, "allocate after choosing the managed allocator"
        host = np.asarray(host)
        self.allocated += host.nbytes
        return FakeArray(host.copy())

    def every_kernel_has_extents(self) -> bool:
        return all(n in EXTENTS for n, *_ in self.launches)

    def _launch(self, name, sig, grid, block, args, shared_mem):
        assert len(args) == len(sig), f"{name}: {len(args)} arguments for {len(sig)} parameters"
        for i, ((t, _), a) in enumerate(zip(sig, args)):
            if t.endswith("*"):
                base = t[:-1].replace("const", "").strip()
                assert isinstance(a, FakeArray), f"{name} arg {i} ({t}): {type(a).__name__}"
                assert a.dtype == C_POINTEES[base], f"{name} arg {i} ({t}): array of {a.dtype}"
                assert a.size > 0, f"{name} arg {i}: pointer past the end of its array"
            else:
                assert type(a) is C_SCALARS[t], f"{name} arg {i} ({t}): {type(a).__name__}"
        assert len(grid) in (1, 2, 3) and all(isinstance(g, int) and g >= 1 for g in grid), (name, grid)
        assert all(isinstance(b, int) and b >= 1 for b in block) and np.prod(block) <= 1024, (name, block)
        assert 0 <= shared_mem <= 48 * 1024, (name, shared_mem)
        vals = {n: (int(a) if not isinstance(a, (FakeArray, np.floating)) else a) for (_, n), a in zip(sig, args)}
        ptrs = {n: a for (_, n), a in zip(sig, args) if isinstance(a, FakeArray)}
        for pname, lo, hi in EXTENTS[name](vals, lambda n, k=1: ptrs[n].a[:k], tuple(grid), tuple(block)):
            arr = ptrs[pname]
            assert 0 <= arr.offset + lo and arr.offset + hi <= arr.base.size and lo < hi, \
                (f"{name}: {pname} touches elements [{arr.offset + lo}, {arr.offset + hi}) "
                 f"of an allocation of {arr.base.size}")
        self.launches.append((name, tuple(grid), tuple(block), shared_mem))


@pytest.fixture
def fake_cupy(monkeypatch):
    fake = FakeCupy()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    return fake


def _run(module, argv, capsys):
    module.main(argv)
    return capsys.readouterr().out


def test_jacobi2d_host_code(fake_cupy, capsys):
    from pagecast.datasets.gpu import jacobi2d as m

    out = _run(m, ["--scale", "0.5"], capsys)
    names = [l[0] for l in fake_cupy.launches]
    assert set(names) == set(m.KERNELS)
    per_cycle = 4 * m.LEVELS + 2 * (m.LEVELS - 1) + 2 + 4 * (m.LEVELS - 1)
    assert len(names) == m.CYCLES * per_cycle and "jacobi2d:" in out
    assert fake_cupy.allocated <= m.plan(0.5)[1]


def test_spmv_cg_host_code(fake_cupy, capsys, monkeypatch):
    from pagecast.datasets.gpu import spmv_cg as m

    monkeypatch.setattr(m, "plan", lambda s: (4096, 4 << 20))  # a small matrix: the CPU builds it
    _run(m, ["--scale", "1"], capsys)
    names = [l[0] for l in fake_cupy.launches]
    assert set(names) == set(m.KERNELS)
    nblk = names.count("spmv_csr_block") // m.ITERS
    assert 6 <= nblk <= 10 and names.count("reduce_sum") == 1 + 2 * m.ITERS


def test_spmv_matrix_is_symmetric_and_diagonally_dominant():
    from pagecast.datasets.gpu.spmv_cg import matrix

    rowptr, col, val = matrix(np.random.default_rng(0), 1024)
    A = np.zeros((1024, 1024))
    for i in range(1024):
        A[i, col[rowptr[i]:rowptr[i + 1]]] = val[rowptr[i]:rowptr[i + 1]]
    assert np.allclose(A, A.T)
    assert (np.diag(A) > np.abs(A).sum(1) - np.diag(A)).all()
    assert (np.diff(rowptr) > 1).all() and rowptr[-1] == len(col)


def test_mlp_train_host_code(fake_cupy, capsys):
    from pagecast.datasets.gpu import mlp_train as m

    out = _run(m, ["--scale", "0.5"], capsys)
    names = [l[0] for l in fake_cupy.launches]
    assert set(names) == set(m.KERNELS)
    assert names.count("sgd_momentum") == m.STEPS and "loss" in out
    relu = [l for l in fake_cupy.launches if l[0] == "relu_inplace"]
    assert relu and all(l[2] == (256,) for l in relu)


def test_llm_decode_host_code(fake_cupy, capsys, monkeypatch):
    from dataclasses import dataclass

    from pagecast.datasets.gpu import llm_decode as m

    @dataclass
    class Small(m.Model):  # the same code paths on smaller weights
        vocab: int = 1024
        ffn: int = 256
        max_seq: int = 128

    monkeypatch.setattr(m, "Model", Small)
    out = _run(m, ["--scale", "0.5"], capsys)
    names = [l[0] for l in fake_cupy.launches]
    assert set(names) == set(m.KERNELS)
    steps = names.count("sample_top_p")
    assert steps == 12 and len(names) == steps * (12 * 2 + 4) and "tokens decoded" in out
    attn = [l for l in fake_cupy.launches if l[0] == "attention_decode"]
    assert all(l[3] == 4 * (128 + 128) for l in attn)


def test_workloads_refuse_to_pass_free_memory(fake_cupy, monkeypatch):
    from pagecast.datasets.gpu import jacobi2d as m

    monkeypatch.setattr(fake_cupy.cuda.runtime, "memGetInfo", staticmethod(lambda: (1 << 20, 80 << 30)))
    with pytest.raises(SystemExit, match="never oversubscribe"):
        m.main(["--scale", "1"])
    assert fake_cupy.launches == []


def test_bf16_rounding_matches_the_kernels_helper():
    from pagecast.datasets.gpu.common import to_bf16

    x = np.array([1.0, -2.5, 3.14159, 65504.0, 1e-3, 0.0], np.float32)
    back = (to_bf16(x).astype(np.uint32) << 16).view(np.float32)
    assert np.allclose(back, x, rtol=1 / 128)
    assert to_bf16(np.array([1.0], np.float32))[0] == 0x3F80


def test_the_stand_in_catches_out_of_bounds_and_mistyped_launches(fake_cupy):
    fake_cupy.cuda.set_allocator(object())
    k = fake_cupy.RawModule(code='extern "C" __global__ void axpy(float* y, const float* x, float alpha, int n) {}')
    axpy = k.get_function("axpy")
    a, b = fake_cupy.empty(100, np.float32), fake_cupy.empty(100, np.float32)
    axpy((1,), (256,), (a[80:], b, np.float32(1), np.int32(20)))  # [80, 100): fine
    with pytest.raises(AssertionError, match="touches elements"):
        axpy((1,), (256,), (a[90:], b, np.float32(1), np.int32(20)))
    with pytest.raises(AssertionError, match="arg 3"):
        axpy((1,), (256,), (a, b, np.float32(1), 20))  # a Python int is not a C int
    with pytest.raises(AssertionError, match="array of int32"):
        axpy((1,), (256,), (a, fake_cupy.empty(100, np.int32), np.float32(1), np.int32(20)))
    with pytest.raises(AssertionError, match="3 arguments"):
        axpy((1,), (256,), (a, b, np.float32(1)))


# ---- the workloads' own footprints: the oracle's truth -----------------------------------------

def _small_llm(monkeypatch):
    from dataclasses import dataclass

    from pagecast.datasets.gpu import llm_decode as m

    @dataclass
    class Small(m.Model):
        vocab: int = 1024
        ffn: int = 256
        max_seq: int = 128

    monkeypatch.setattr(m, "Model", Small)
    return m, ["--scale", "0.5"]


def _small_moe(monkeypatch):
    from pagecast.datasets.gpu import moe_decode as m

    monkeypatch.setattr(m, "EXPERTS", 8)    # the same code paths on smaller weights
    monkeypatch.setattr(m, "FFN", 64)
    monkeypatch.setattr(m, "HIDDEN", 128)
    return m, ["--scale", "1"]


def test_moe_decode_host_code(fake_cupy, capsys, monkeypatch):
    m, argv = _small_moe(monkeypatch)
    out = _run(m, argv, capsys)
    names = [l[0] for l in fake_cupy.launches]
    assert set(names) == set(m.KERNELS)
    layers = m.plan(1)[0]
    assert names.count("moe_router") == names.count("moe_expert_up") == m.STEPS * layers
    assert names.count("moe_init") == 3 * layers and "experts" in out


def test_moe_decode_plans_about_a_third_of_a_gib_a_layer():
    from pagecast.datasets.gpu import moe_decode as m

    assert m.plan(1.5)[1] >= 2**30 > m.plan(1.2)[1]


@pytest.mark.parametrize("name", ["jacobi2d", "spmv_cg", "mlp_train", "llm_decode", "moe_decode"])
def test_workloads_record_their_own_footprints_inside_their_arrays(name, fake_cupy, capsys, monkeypatch, tmp_path):
    import importlib
    import json

    m = importlib.import_module(f"pagecast.datasets.gpu.{name}")
    argv = ["--scale", "0.5"]
    if name == "spmv_cg":
        monkeypatch.setattr(m, "plan", lambda s: (4096, 4 << 20))
    if name == "llm_decode":
        m, argv = _small_llm(monkeypatch)
    if name == "moe_decode":
        m, argv = _small_moe(monkeypatch)
    allocs = []
    real_empty, real_asarray = fake_cupy.empty, fake_cupy.asarray
    monkeypatch.setattr(fake_cupy, "empty", lambda n, dtype: allocs.append(real_empty(n, dtype)) or allocs[-1])
    monkeypatch.setattr(fake_cupy, "asarray", lambda h: allocs.append(real_asarray(h)) or allocs[-1])
    fp = tmp_path / "fp.json"
    monkeypatch.setenv("PAGECAST_FOOTPRINTS", str(fp))
    _run(m, argv, capsys)
    doc = json.loads(fp.read_text())
    assert doc["kernels"] == [n for n, *_ in fake_cupy.launches]
    spans = sorted((a.a.ctypes.data, a.a.ctypes.data + a.a.nbytes) for a in allocs)
    starts = [s for s, _ in spans]
    seen = set()
    for t, addr, nbytes in doc["truth"]:
        i = np.searchsorted(starts, addr, side="right") - 1
        assert i >= 0 and addr + nbytes <= spans[i][1] and nbytes > 0, (t, doc["kernels"][t])
        seen.add(t)
    assert seen == set(range(len(doc["kernels"])))   # every launch has a footprint


def test_the_truth_is_attached_to_a_trace_of_the_same_run(tmp_path):
    from pagecast import trace as T
    from pagecast.datasets.gpu.truth import attach_truth, main
    from pagecast.footprints import footprints
    import json

    n = 3
    launches = {T.LAUNCH_ID: list(range(n)), T.KERNEL: ["a", "b", "a"], T.DEVICE: [0] * n, T.STREAM: [0] * n,
                **{c: [1] * n for c in (T.GRID_X, T.GRID_Y, T.GRID_Z, T.BLOCK_X, T.BLOCK_Y, T.BLOCK_Z)},
                T.SHARED_MEM_BYTES: [0] * n, T.START_NS: [None] * n, T.END_NS: [None] * n,
                T.PARAM_OFFSETS: [[]] * n, T.PARAM_SIZES: [[]] * n, T.PARAM_DATA: [b""] * n}
    base = 1 << 40
    allocs = {T.ALLOC_ID: [0], T.ADDRESS: [base], T.BYTES: [16 << 20], T.KIND: ["managed"], T.DEVICE: [0],
              T.FIRST_LAUNCH: [0]}
    src = tmp_path / "w.pctrace"
    T.write_trace(src, T.new_manifest(mode="full", source="test"), {T.LAUNCHES: launches, T.ALLOCATIONS: allocs})
    fp = tmp_path / "fp.json"
    fp.write_text(json.dumps({"kernels": ["a", "b", "a"], "truth": [[0, base, 8192], [1, base + (4 << 20), 4096],
                                                                   [2, base, 4096]]}))
    attach_truth(src, fp, tmp_path / "t.pctrace")
    f = footprints(T.read_trace(tmp_path / "t.pctrace"))
    assert f.source == "truth" and list(f.pages_per_launch()) == [2, 1, 1]
    fp.write_text(json.dumps({"kernels": ["a", "c", "a"], "truth": []}))
    assert main([str(src), str(fp), "-o", str(tmp_path / "u.pctrace")]) == 2
    assert not (tmp_path / "u.pctrace").exists()
