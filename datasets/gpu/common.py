"""Shared plumbing of the GPU workloads: arguments, managed allocation, kernels.

Every workload allocates its arrays with `cudaMallocManaged` (CuPy's
`malloc_managed`, one allocation per array, no pool, so the trace's
allocations table shows each array), refuses to start when its planned
footprint would pass 80% of the GPU's free memory, launches only its own
`extern "C"` kernels (CuPy's `RawModule`), passes every scalar with an explicit
NumPy type so the parameter buffer matches the C signature, and is
deterministic for a given `--scale` and `--seed`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from .extents import EXTENTS, signatures

# bf16 kept as raw 16-bit storage (no cuda_bf16.h needed at run time): round to nearest even
# Both scientific workloads finish a dot product with the same block reduction.
REDUCE_SUM = r"""
extern "C" __global__ void reduce_sum(const float* partial, float* result, int n) {
    __shared__ float s[1024];
    float v = 0.0f;
    for (int k = threadIdx.x; k < n; k += blockDim.x) v += partial[k];
    s[threadIdx.x] = v;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) result[0] = s[0];
}
"""

BF16_HELPERS = r"""
typedef unsigned short bf16;
__device__ __forceinline__ float bf2f(bf16 v) { return __uint_as_float(((unsigned int)v) << 16); }
__device__ __forceinline__ bf16 f2bf(float f) {
    unsigned int u = __float_as_uint(f);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (bf16)(u >> 16);
}
"""


def parse_args(name: str, description: str, argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=f"python -m pagecast.datasets.gpu.{name}", description=description)
    p.add_argument("--scale", type=float, default=1.0, help="problem size multiplier (default 1)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    a = p.parse_args(argv)
    if not (a.scale > 0):
        p.error("--scale must be > 0")
    return a


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16), round to nearest even."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


class Gpu:
    """Managed arrays and kernels for one workload run."""

    def __init__(self, name: str, planned_bytes: int) -> None:
        try:
            import cupy
        except ImportError:
            sys.exit(f"{name}: CuPy is not installed (pip install cupy-cuda13x)")
        self.cp = cupy
        free, total = cupy.cuda.runtime.memGetInfo()
        if planned_bytes > 0.8 * free:
            sys.exit(f"{name}: needs {planned_bytes / 2**30:.2f} GiB of managed memory but the GPU has "
                     f"{free / 2**30:.2f} GiB free; use a smaller --scale (never oversubscribe the GPU)")
        cupy.cuda.set_allocator(cupy.cuda.malloc_managed)  # one cudaMallocManaged per array
        self.name = name
        self.planned = planned_bytes
        self.launches = 0
        self.t0 = time.perf_counter()
        self.t_first: float | None = None   # the first launch (a run's time_s counts from it)
        # the launches' own footprints (extents.py), recorded when PAGECAST_FOOTPRINTS names a file:
        # the oracle's truth for a collected trace (truth.py)
        self.footprints_path = os.environ.get(FOOTPRINTS_ENV) or None
        self._sigs: dict[int, tuple[str, list]] = {}
        self._kernels: list[str] = []
        self._truth: list[tuple[int, int, int]] = []

    def empty(self, n: int, dtype) -> "object":
        return self.cp.empty(int(n), dtype=dtype)

    def array(self, host: np.ndarray):
        return self.cp.asarray(host)

    def module(self, code: str, names: list[str]) -> dict:
        mod = self.cp.RawModule(code=code)
        fns = {n: mod.get_function(n) for n in names}
        if self.footprints_path:
            sigs = signatures(code)
            for n, f in fns.items():
                self._sigs[id(f)] = (n, sigs[n])
        return fns

    def launch(self, fn, grid, block, args, shared_mem: int = 0, values: dict | None = None) -> None:
        """Launch `fn`. `values`: what data-dependent extents read from a pointer argument (name ->
        host array), where the host has it already; otherwise those few values are copied back
        (only when footprints are recorded)."""
        if self.t_first is None:
            self.t_first = time.perf_counter()
        grid = tuple(int(g) for g in grid)
        block = tuple(int(b) for b in block)
        if self.footprints_path and id(fn) in self._sigs:
            self._record(fn, grid, block, args, values or {})
        fn(grid, block, tuple(args), shared_mem=int(shared_mem))
        self.launches += 1

    def _record(self, fn, grid, block, args, values: dict) -> None:
        name, sig = self._sigs[id(fn)]
        scal, ptrs = {}, {}
        for (t, pname), a in zip(sig, args):
            if t.endswith("*"):
                ptrs[pname] = a
            else:
                scal[pname] = int(a) if not isinstance(a, (np.floating, float)) else a

        def v(pname: str, k: int = 1):
            if pname in values:
                return np.asarray(values[pname])[:k]
            return np.asarray(ptrs[pname][:k].get())

        t = self.launches
        self._kernels.append(name)
        for pname, lo, hi in EXTENTS[name](scal, v, grid, block):
            a = ptrs[pname]
            size = int(a.itemsize)
            self._truth.append((t, int(a.data.ptr) + lo * size, (hi - lo) * size))

    def sync(self) -> None:
        self.cp.cuda.runtime.deviceSynchronize()

    def done(self, summary: str) -> None:
        self.sync()
        t = time.perf_counter()
        dt = t - self.t0
        print(f"{self.name}: {self.launches} launches, {self.planned / 2**20:.1f} MiB managed, {dt:.2f} s; {summary}")
        # one machine-readable line: the run's time as `pagecast replay --backend gpu` counts it (first
        # launch to the end of all GPU work), for the validation's no-runner baseline
        print("PAGECAST_WORKLOAD " + json.dumps({
            "workload": self.name, "launches": self.launches, "managed_bytes": self.planned, "wall_s": dt,
            "time_s": t - (self.t_first if self.t_first is not None else self.t0)}), flush=True)
        if self.footprints_path:
            with open(self.footprints_path, "w") as f:
                json.dump({"workload": self.name, "kernels": self._kernels,
                           "truth": [list(r) for r in self._truth]}, f)


FOOTPRINTS_ENV = "PAGECAST_FOOTPRINTS"   # a file the workload writes its launches' footprints to


def i32(v) -> np.int32:
    return np.int32(v)


def i64(v) -> np.int64:
    return np.int64(v)


def f32(v) -> np.float32:
    return np.float32(v)


def cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def round_to(x: float, m: int, minimum: int) -> int:
    return max(minimum, int(round(x / m)) * m)
