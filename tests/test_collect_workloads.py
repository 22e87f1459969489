"""The GPU workloads' host code on the CPU, against a stand-in CuPy that checks
every launch against the kernel's C signature (argument count, scalar types,
pointer element types, pointers inside their arrays, launch shape). The
kernels themselves only run on a GPU (tests/test_collect_gpu.py)."""

from __future__ import annotations

import re
import sys
import types

import numpy as np
import pytest

C_SCALARS = {"int": np.int32, "long": np.int64, "float": np.float32, "unsigned long": np.uint64}
C_POINTEES = {"float": np.float32, "int": np.int32, "long": np.int64, "bf16": np.uint16}


def signatures(code: str) -> dict[str, list[tuple[str, str]]]:
    """kernel -> [(C type, parameter name)] for every extern "C" kernel in the source."""
    out = {}
    for name, params in re.findall(r'extern "C" __global__ void (\w+)\(([^)]*)\)', code):
        ps = []
        for q in (q.strip() for q in params.split(",")):
            if "*" in q:
                t, n = q.rsplit("*", 1)
                ps.append((t.strip() + "*", n.strip()))
            else:
                *t, n = q.split()
                ps.append((" ".join(t), n))
        out[name] = ps
    return out


def _gemm(a, ta=False, tb=False):
    M, N, K = a["M"], a["N"], a["K"]
    A = (K - 1) * a["lda"] + M if ta else (M - 1) * a["lda"] + K
    B = (N - 1) * a["ldb"] + K if tb else (K - 1) * a["ldb"] + N
    return [("A", 0, A), ("B", 0, B), ("C", 0, (M - 1) * a["ldc"] + N)]


# What each kernel reads and writes, in elements relative to each pointer argument (its C code);
# `v(name)` is the value a pointer argument points at (data-dependent accesses), g / b grid and block.
EXTENTS = {
    "jacobi2d_sweep": lambda a, v, g, b: [("out", 0, a["nx"] * a["ny"]), ("in", -a["nx"], (a["ny"] + 1) * a["nx"])],
    "jacobi2d_halo": lambda a, v, g, b: [("u", 0, (a["ny"] + 2) * a["nx"])],
    "jacobi2d_restrict": lambda a, v, g, b: [("coarse", 0, a["nxc"] * a["nyc"]), ("fine", 0, 4 * a["nxc"] * a["nyc"])],
    "jacobi2d_prolong": lambda a, v, g, b: [("fine", 0, 4 * a["nxc"] * a["nyc"]), ("coarse", 0, a["nxc"] * a["nyc"])],
    "jacobi2d_residual": lambda a, v, g, b: [("u", -a["nx"], (a["ny"] + 1) * a["nx"]),
                                            ("partial", 0, int(np.prod(g)))],
    "reduce_sum": lambda a, v, g, b: [("partial", 0, a["n"]), ("result", 0, 1)],
    "spmv_csr_block": lambda a, v, g, b: [("rowptr", 0, a["nrows"] + 1), ("colind", 0, a["nnz"]), ("vals", 0, a["nnz"]),
                                         ("y", 0, a["nrows"]), ("x", 0, int(v("colind")[:a["nnz"]].max()) + 1)],
    "dot_partial": lambda a, v, g, b: [("a", 0, a["n"]), ("b", 0, a["n"]), ("out", 0, 1)],
    "axpy": lambda a, v, g, b: [("y", 0, a["n"]), ("x", 0, a["n"])],
    "xpay": lambda a, v, g, b: [("y", 0, a["n"]), ("x", 0, a["n"])],
    "sgemm_nn": lambda a, v, g, b: _gemm(a),
    "sgemm_tn": lambda a, v, g, b: _gemm(a, ta=True),
    "sgemm_nt": lambda a, v, g, b: _gemm(a, tb=True),
    "bias_add": lambda a, v, g, b: [("y", 0, a["rows"] * a["cols"]), ("bias", 0, a["cols"])],
    "relu_inplace": lambda a, v, g, b: [("x", 0, g[0] * b[0])],
    "softmax_xent": lambda a, v, g, b: [("logits", 0, a["batch"] * a["classes"]), ("labels", 0, a["batch"]),
                                       ("loss", 0, 1), ("dlogits", 0, a["batch"] * a["classes"])],
    "relu_backward": lambda a, v, g, b: [("dy", 0, a["n"]), ("y", 0, a["n"])],
    "bias_grad": lambda a, v, g, b: [("dy", 0, a["rows"] * a["cols"]), ("db", 0, a["cols"])],
    "sgd_momentum": lambda a, v, g, b: [("numel", 0, 1)] + [(k, 0, int(v("numel")[0]))
                                                           for k in ("params", "grads", "momentum")],
    "embedding_lookup": lambda a, v, g, b: [("out", 0, a["dim"]), ("token", 0, 1),
                                           ("table", int(v("token")[0]) * a["dim"], (int(v("token")[0]) + 1) * a["dim"])],
    "rmsnorm": lambda a, v, g, b: [("out", 0, 1024), ("x", 0, 1024), ("weight", 0, 1024)],
    "gemv_bf16": lambda a, v, g, b: [("W", 0, a["rows"] * a["cols"]), ("x", 0, a["cols"]), ("y", 0, a["rows"])],
    "rope_apply": lambda a, v, g, b: [("qk", 0, a["n_heads"] * a["head_dim"]), ("cos_sin", 0, a["head_dim"])],
    "kv_append": lambda a, v, g, b: [("k_cache", 0, a["n_kv_heads"] * a["max_seq"] * a["head_dim"]),
                                    ("v_cache", 0, a["n_kv_heads"] * a["max_seq"] * a["head_dim"]),
                                    ("kv", 0, 2 * a["n_kv_heads"] * a["head_dim"])],
    "attention_decode": lambda a, v, g, b: [("out", 0, a["n_heads"] * a["head_dim"]), ("q", 0, a["n_heads"] * a["head_dim"]),
                                           ("k_cache", 0, a["n_kv_heads"] * a["max_seq"] * a["head_dim"]),
                                           ("v_cache", 0, a["n_kv_heads"] * a["max_seq"] * a["head_dim"])],
    "residual_add": lambda a, v, g, b: [("x", 0, g[0] * b[0]), ("y", 0, g[0] * b[0])],
    "silu_mul": lambda a, v, g, b: [("out", 0, a["n"]), ("gate_up", 0, 2 * a["n"])],
    "sample_top_p": lambda a, v, g, b: [("logits", 0, a["vocab"]), ("token", 0, 1)],
}


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
        for pname, lo, hi in EXTENTS[name](vals, lambda n: ptrs[n].a, tuple(grid), tuple(block)):
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
