"""Managed memory during collection: the live map, the safety budget, and the
allocators `--managed cupy,torch` installs.

- `ManagedBudget`: the live managed allocations (address -> bytes) and a limit
  (`managed_limit`: the GPU's free memory when collection starts, less a reserve for the
  device memory the workload allocates later, unless `--allow-oversubscription`). `check(n)` raises `OversubscriptionError`
  (a MemoryError) before an allocation that would pass the limit.
- `ManagedTracker`: CUPTI callbacks on cuMemAllocManaged / cudaMallocManaged /
  cuMemFree / cudaFree that keep the budget's live map exact at the moment each
  call returns (MEMORY2 records arrive later, in buffers, too late for eviction
  before the next launch). It checks the budget at API enter; as CUPTI cannot
  cancel a call, it reports the violation to the collector, which stops the
  workload (see collector.py).
- CuPy: `cupy.cuda.set_allocator(cupy.cuda.MemoryPool(cupy.cuda.malloc_managed).malloc)`,
  with the budget checked before each new pool chunk is allocated.
- PyTorch: `torch.cuda.memory.CUDAPluggableAllocator(so, "pagecast_malloc",
  "pagecast_free")` + `change_current_allocator`, as PyTorch documents for custom
  allocators. The shared object is a tiny C file (`_SHIM_C`) compiled at run time
  with the system C compiler (`cc`, or $CC) into ~/.cache/pagecast/. It needs no CUDA
  headers: it finds `cudaMallocManaged`/`cudaFree` already loaded in the process
  (PyTorch's runtime) or falls back to the driver's `cuMemAllocManaged`/`cuMemFree_v2`
  from libcuda.so.1, and refuses (returns NULL) an allocation that would pass the
  byte limit set from Python. PyTorch does not check the pointer its pluggable
  allocator returns (CUDAPluggableAllocator::allocate wraps it in a DataPtr as
  is), so a NULL alone would not stop the workload: the shim also calls a hook
  into Python (`ManagedBudget.refuse`), which reports the violation to the
  collector like the CUPTI tracker does.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any, Callable

from pagecast.errors import UsageError
from pagecast.units import format_size

from . import cupti_params as P
from . import launch_hook as lh

# CUPTI cbids of the calls the tracker watches (cupti.driver_api_trace_cbid / runtime_api_trace_cbid)
CB_cuMemAllocManaged = 371
CB_cuMemFree_v2 = 245
CB_cudaMallocManaged = 206
CB_cudaFree = 22


# Device memory kept free for what the workload allocates outside managed memory after collection
# starts (cudaMalloc'd buffers, library workspaces such as cuBLAS's, kernel modules loaded on first
# use, memory pools): a tenth of the free memory, and at least 1 GiB. Without it the managed
# allocations may take all of it, and a later device allocation then fails or pushes managed pages
# out (oversubscription, which collection is there to avoid). An estimate: docs/collect.md, "Safety".
RESERVE_FRACTION = 0.10
RESERVE_MIN_BYTES = 1 << 30


def managed_limit(free: int, *, allow_oversubscription: bool = False, override: int | None = None) -> int | None:
    """The byte limit live managed memory may not pass: `free` (the GPU's free memory when
    collection starts) less the reserve; None (no limit) with --allow-oversubscription. `override`
    (PAGECAST_MANAGED_LIMIT) can only lower it."""
    if allow_oversubscription:
        return None
    free = max(0, int(free))
    limit = max(0, free - max(RESERVE_MIN_BYTES, int(free * RESERVE_FRACTION)))
    return limit if override is None else min(limit, int(override))


class OversubscriptionError(MemoryError):
    """A managed allocation would pass the GPU's free memory (collection refuses it)."""


class ManagedBudget:
    """Live managed allocations and the byte limit they may not pass."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self._live: dict[int, int] = {}
        self._lock = threading.Lock()
        self.peak = 0
        self.violation: str | None = None
        # Called with the message when an allocator refused an allocation without being
        # able to raise (the PyTorch shim); the collector stops the workload from there.
        self.on_violation: Callable[[str], None] | None = None

    @property
    def live_bytes(self) -> int:
        with self._lock:
            return sum(self._live.values())

    def ranges(self) -> list[tuple[int, int]]:
        with self._lock:
            return sorted(self._live.items())

    def would_exceed(self, nbytes: int) -> bool:
        return self.limit is not None and self.live_bytes + int(nbytes) > self.limit

    def message(self, nbytes: int, live: int | None = None) -> str:
        live = self.live_bytes if live is None else int(live)
        return (f"a managed allocation of {format_size(nbytes)} would bring live managed memory to "
                f"{format_size(live + nbytes)}, past the managed limit ({format_size(self.limit or 0)}: the GPU's "
                "free memory at start less a reserve for device allocations);"
                " pagecast collect refuses to oversubscribe the GPU (pass --allow-oversubscription on your own machine)")

    def refuse(self, nbytes: int, live: int | None = None) -> str:
        """An allocator refused `nbytes` and could not raise: record the violation and report it."""
        msg = self.message(nbytes, live)
        self.violation = msg
        if self.on_violation is not None:
            self.on_violation(msg)
        return msg

    def check(self, nbytes: int) -> None:
        if self.would_exceed(nbytes):
            msg = self.message(nbytes)
            self.violation = msg
            raise OversubscriptionError(msg)

    def add(self, address: int, nbytes: int) -> None:
        with self._lock:
            self._live[int(address)] = int(nbytes)
            self.peak = max(self.peak, sum(self._live.values()))

    def remove(self, address: int) -> int | None:
        with self._lock:
            return self._live.pop(int(address), None)


class ManagedTracker:
    """CUPTI API callbacks that keep a ManagedBudget's live map exact.

    `callbacks()` is the `api_callbacks` mapping for `LaunchHook`. Parameter
    structs are read with `cupti_params`' ctypes structs (or `views` injected in tests).
    `on_violation(message)` runs when an allocation would pass the limit.
    """

    def __init__(self, budget: ManagedBudget, on_violation: Callable[[str], None] | None = None,
                 views: dict[str, Callable[[int], Any]] | None = None) -> None:
        self.budget = budget
        self.on_violation = on_violation
        if on_violation is not None and budget.on_violation is None:
            budget.on_violation = on_violation  # refusals by the PyTorch shim go the same way
        self._views = views
        self._pending = threading.local()
        self.allocations = 0

    def callbacks(self) -> dict[tuple[int, int], Callable[[int, Any], None]]:
        return {(lh.DOMAIN_DRIVER, CB_cuMemAllocManaged): self._drv_alloc,
                (lh.DOMAIN_RUNTIME, CB_cudaMallocManaged): self._rt_alloc,
                **free_callbacks(self.budget.remove, self.views)}

    def views(self) -> dict[str, Callable[[int], Any]]:
        """The parameter-struct readers: `cupti_params`' ctypes structs (cupti-python 13.0.1 has
        no classes for them), unless tests injected others."""
        if self._views is None:
            self._views = {"drv_alloc": P.CuMemAllocManagedParams.at, "rt_alloc": P.CudaMallocManagedParams.at,
                           "drv_free": P.CuMemFreeParams.at, "rt_free": P.CudaFreeParams.at}
        return self._views

    @staticmethod
    def _succeeded(cbdata) -> bool:
        rv = int(getattr(cbdata, "function_return_value", 0) or 0)
        return rv == 0 or ctypes.c_int.from_address(rv).value == 0

    def _alloc(self, site: int, cbdata, out_ptr: int, size: int) -> None:
        if site == lh.API_ENTER:
            if self.budget.would_exceed(size):
                msg = self.budget.message(size)
                self.budget.violation = msg
                if self.on_violation is not None:
                    self.on_violation(msg)
        elif self._succeeded(cbdata) and out_ptr:
            addr = int(ctypes.c_uint64.from_address(out_ptr).value)
            if addr:
                self.budget.add(addr, size)
                self.allocations += 1

    def _drv_alloc(self, site: int, cbdata) -> None:
        p = self.views()["drv_alloc"](P.function_params(cbdata))
        self._alloc(site, cbdata, int(p.dptr), int(p.bytesize))

    def _rt_alloc(self, site: int, cbdata) -> None:
        p = self.views()["rt_alloc"](P.function_params(cbdata))
        self._alloc(site, cbdata, int(p.dev_ptr), int(p.size_))



def free_callbacks(on_free: Callable[[int], None],
                   views: dict | Callable[[], dict] | None = None) -> dict[tuple[int, int], Callable[[int, Any], None]]:
    """`api_callbacks` for LaunchHook that call on_free(address) at the enter of every
    cuMemFree / cudaFree: the budget's live map, and the GPU runner's caches, drop the
    allocation. `views`: the parameter-struct readers (a dict, or a function returning one
    on first use; default `cupti_params`')."""
    if views is None:
        views = ManagedTracker(ManagedBudget(None)).views
    get = views if callable(views) else (lambda: views)

    def drv(site: int, cbdata) -> None:
        if site == lh.API_ENTER:
            on_free(int(get()["drv_free"](P.function_params(cbdata)).dptr))

    def rt(site: int, cbdata) -> None:
        if site == lh.API_ENTER:
            on_free(int(get()["rt_free"](P.function_params(cbdata)).dev_ptr))

    return {(lh.DOMAIN_DRIVER, CB_cuMemFree_v2): drv, (lh.DOMAIN_RUNTIME, CB_cudaFree): rt}


# ---- allocators for --managed -------------------------------------------------

MANAGED_CHOICES = ("cupy", "torch")


def parse_managed(text: str | None) -> list[str]:
    if not text:
        return []
    items = [t.strip().lower() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in MANAGED_CHOICES]
    if bad or not items:
        raise UsageError(f"--managed takes a comma-separated list of {', '.join(MANAGED_CHOICES)}; got {text!r}")
    return list(dict.fromkeys(items))


def install_cupy(budget: ManagedBudget) -> str:
    """Route CuPy's allocations through a memory pool over managed memory."""
    try:
        import cupy
    except ImportError:
        raise UsageError("--managed cupy: CuPy is not installed in this Python") from None

    def malloc_managed_checked(nbytes: int):
        budget.check(nbytes)
        return cupy.cuda.malloc_managed(nbytes)

    pool = cupy.cuda.MemoryPool(malloc_managed_checked)
    cupy.cuda.set_allocator(pool.malloc)
    return "cupy.cuda.MemoryPool(cupy.cuda.malloc_managed)"


_SHIM_C = r"""
/* pagecast: a PyTorch pluggable allocator over CUDA managed memory (see collect/managed.py). */
#include <dlfcn.h>
#include <stdlib.h>
#include <stddef.h>
#include <sys/types.h>

typedef int (*rt_malloc_t)(void **, size_t, unsigned int);
typedef int (*rt_free_t)(void *);
typedef int (*drv_malloc_t)(unsigned long long *, size_t, unsigned int);
typedef int (*drv_free_t)(unsigned long long);

typedef void (*refuse_hook_t)(long long size, long long live);

static rt_malloc_t rt_malloc; static rt_free_t rt_free;
static drv_malloc_t drv_malloc; static drv_free_t drv_free;
static long long limit_bytes = -1, live_bytes = 0, refused = 0;
static refuse_hook_t refuse_hook;

static int resolve(void) {
    if (rt_malloc || drv_malloc) return 1;
    const char *lib = getenv("PAGECAST_SHIM_DRIVER");  /* tests point this at a stand-in */
    if (!lib) {
        rt_malloc = (rt_malloc_t)dlsym(RTLD_DEFAULT, "cudaMallocManaged");
        rt_free = (rt_free_t)dlsym(RTLD_DEFAULT, "cudaFree");
        if (rt_malloc && rt_free) return 1;
        rt_malloc = 0; rt_free = 0;
        lib = "libcuda.so.1";
    }
    void *h = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
    if (!h) return 0;
    drv_malloc = (drv_malloc_t)dlsym(h, "cuMemAllocManaged");
    drv_free = (drv_free_t)dlsym(h, "cuMemFree_v2");
    return drv_malloc && drv_free;
}

void pagecast_set_limit(long long limit) { limit_bytes = limit; }
void pagecast_set_refuse_hook(refuse_hook_t hook) { refuse_hook = hook; }
long long pagecast_live_bytes(void) { return live_bytes; }
long long pagecast_refused(void) { return refused; }

void *pagecast_malloc(ssize_t size, int device, void *stream) {
    (void)device; (void)stream;
    if (size <= 0) return 0;
    if (limit_bytes >= 0 && live_bytes + size > limit_bytes) {
        /* PyTorch does not check for NULL: tell Python, which stops the workload */
        __atomic_add_fetch(&refused, 1, __ATOMIC_SEQ_CST);
        if (refuse_hook) refuse_hook((long long)size, live_bytes);
        return 0;
    }
    if (!resolve()) return 0;
    void *p = 0;
    if (rt_malloc) {
        if (rt_malloc(&p, (size_t)size, 1u /* cudaMemAttachGlobal */) != 0) return 0;
    } else {
        unsigned long long d = 0;
        if (drv_malloc(&d, (size_t)size, 1u /* CU_MEM_ATTACH_GLOBAL */) != 0) return 0;
        p = (void *)d;
    }
    __atomic_add_fetch(&live_bytes, size, __ATOMIC_SEQ_CST);
    return p;
}

void pagecast_free(void *ptr, ssize_t size, int device, void *stream) {
    (void)device; (void)stream;
    if (!ptr) return;
    if (rt_free) rt_free(ptr); else if (drv_free) drv_free((unsigned long long)ptr);
    __atomic_sub_fetch(&live_bytes, size, __ATOMIC_SEQ_CST);
}
"""


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pagecast"


def build_shim(cache: Path | None = None) -> Path:
    """Compile the allocator shim (once per source version) and return the .so path."""
    digest = hashlib.sha256(_SHIM_C.encode()).hexdigest()[:12]
    cache = Path(cache) if cache else _cache_dir()
    so = cache / f"pagecast_managed_alloc-{digest}.so"
    if so.exists():
        return so
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise UsageError("--managed torch: no C compiler found (set CC, or install gcc) to build the "
                         "managed-memory allocator shim")
    cache.mkdir(parents=True, exist_ok=True)
    src = cache / f"pagecast_managed_alloc-{digest}.c"
    src.write_text(_SHIM_C)
    tmp = so.with_name(f".{so.name}.{os.getpid()}")
    r = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(tmp), str(src), "-ldl"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        first = (r.stderr or r.stdout).strip().splitlines()
        raise UsageError(f"--managed torch: compiling the allocator shim with {cc} failed: "
                         f"{first[0] if first else r.returncode}")
    os.replace(tmp, so)
    return so


_TORCH_SHIM: Any = None
_REFUSE_HOOK_T = ctypes.CFUNCTYPE(None, ctypes.c_longlong, ctypes.c_longlong)
_REFUSE_HOOKS: list = []  # ctypes callbacks must outlive every call the shim makes


def load_shim(so: Path, budget: ManagedBudget):
    """Load the compiled shim, set its limit from `budget` and route its refusals to `budget.refuse`."""
    lib = ctypes.CDLL(str(so))
    lib.pagecast_set_limit.argtypes = [ctypes.c_longlong]
    lib.pagecast_set_refuse_hook.argtypes = [_REFUSE_HOOK_T]
    lib.pagecast_set_limit(-1 if budget.limit is None else int(budget.limit))

    def refused(size: int, live: int) -> None:  # called from C: must not raise
        try:
            budget.refuse(int(size), int(live))
        except Exception:
            pass

    hook = _REFUSE_HOOK_T(refused)
    _REFUSE_HOOKS.append(hook)
    lib.pagecast_set_refuse_hook(hook)
    return lib


def set_torch_limit(limit: int | None) -> None:
    """Set (or lift, with None) the PyTorch shim's byte limit."""
    if _TORCH_SHIM is not None:
        _TORCH_SHIM.pagecast_set_limit(-1 if limit is None else int(limit))


def install_torch(budget: ManagedBudget) -> str:
    """Make PyTorch allocate CUDA tensors with cudaMallocManaged (before it allocates anything)."""
    try:
        import torch
    except ImportError:
        raise UsageError("--managed torch: PyTorch is not installed in this Python") from None
    global _TORCH_SHIM
    so = build_shim()
    _TORCH_SHIM = load_shim(so, budget)
    try:
        alloc = torch.cuda.memory.CUDAPluggableAllocator(str(so), "pagecast_malloc", "pagecast_free")
        torch.cuda.memory.change_current_allocator(alloc)
    except RuntimeError as e:
        raise UsageError(f"--managed torch: PyTorch refused the managed allocator ({str(e).splitlines()[0]}); "
                         "it must be installed before the workload touches CUDA") from None
    return f"torch.cuda.memory.CUDAPluggableAllocator({so.name}: cudaMallocManaged)"


def install(names: list[str], budget: ManagedBudget) -> list[str]:
    out = []
    for n in names:
        out.append(install_cupy(budget) if n == "cupy" else install_torch(budget))
    return out
