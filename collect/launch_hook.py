"""Capture every kernel launch's arguments with a CUPTI API callback.

`LaunchHook(on_launch)` subscribes to CUPTI's callback API for the kernel
launch functions and calls `on_launch(LaunchArgs)` once per launch, at API
enter (before the kernel is queued), with the kernel's name, launch
configuration, stream, correlation id and parameter buffer.

Which callbacks (cbids from cupti-python's `driver_api_trace_cbid` /
`runtime_api_trace_cbid`):

- driver: cuLaunchKernel 307, cuLaunchKernel_ptsz 442, cuLaunchCooperativeKernel
  477/478, cuLaunchKernelEx 652, cuLaunchKernelEx_ptsz 653;
  (not hooked: graph launches, host functions, and the launch APIs CUDA 13 no longer has;
  `NOT_KERNEL_LAUNCHES` in tests/test_cuda13_0_surface.py lists them with the reason)
- runtime: cudaLaunchKernel 211/214, cudaLaunchCooperativeKernel 269/270, cudaLaunchKernelExC
  430/431, and CUDA 13's
  __cudaLaunchKernel 505/506 (`_v13000` / `_ptsz_v13000`: what nvcc 13's `<<<...>>>` stubs call;
  cupti-python 13.4 has them only as the private enum attributes
  `RuntimeApiTraceCbid._RuntimeApiTraceCbid__cudaLaunchKernel_v13000`, so they are named here).

A runtime launch may or may not reach the driver callbacks (the runtime can
call the driver through internal entry points). Both are handled: a runtime
launch is decoded at its API enter but held; if a driver launch callback
follows on the same thread before the runtime call returns, the driver's view
(the CUfunction and its parameter layout) is delivered, carrying the runtime
call's correlation id plus its own; otherwise the held runtime decode is
delivered at the runtime call's exit. Once a runtime launch has been seen with
no driver callback inside, later runtime launches are delivered at their
enter (before the kernel is queued, which a prefetching consumer needs). Each
logical launch is delivered once.
The runtime decode resolves the host stub with `cudaGetFuncBySymbol` from the
libcudart the application loaded; once runtime launches are seen to reach the
driver callbacks it is skipped.

Parameter layout: `cuFuncGetParamInfo` (cuda-bindings, CUDA 12.4+ driver), or
`cuKernelGetParamInfo` where the handle turns out to be a CUkernel, walked from index 0 until
the driver answers CUDA_ERROR_INVALID_VALUE, cached per handle. The count functions
(`cuFuncGetParamCount`, `cuKernelGetParamCount`) came with CUDA 13.2: a 13.0 driver lacks them
(cuda-bindings raises FunctionNotFoundError), so they are used only where the driver has them.
The callbacks' parameter structs are read with `cupti_params` (ctypes), not cupti-python's
classes, which cupti-python 13.0.1 lacks. Bytes come from
`kernelParams` (a `void**`: one pointer per parameter; `decode_kernel_params`)
or, when that is null, from the `extra` array (`decode_extra`).

Calling driver functions inside the callback re-enters CUPTI; a thread-local
flag makes the callback ignore anything that arrives while it is running (only
launch cbids are enabled anyway). The optional `before_launch` / `after_launch`
hooks run at the outermost launch call's enter and exit; the collector uses
them to evict managed memory and to serialize kernels (full mode).

With `ring=` (a `launch_ring.LaunchRing`: the collector's natural mode) the callback records each
launch into that buffer instead (`_capture`, `_deliver`): the same dispatch, the parameter bytes
gathered into a slot, no `LaunchArgs` made and `on_launch` not called; the ring makes the
`LaunchArgs` later, off the callback, equal to what the decoding path delivers.

The pure parts (decoding, launch-config structs, dispatch given a callback-data
object) run on a CPU; only `start()` needs cupti-python and a driver.

Long because one callback decodes every launch API's parameter layout (driver and runtime,
`kernelParams` and `extra`) behind one re-entrancy guard, and the decoders share its state.
"""

from __future__ import annotations

import ctypes
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from pagecast import trace as T
from pagecast.errors import PagecastError

from . import cupti_params as P
from .param_gather import gather_params
from .param_gather import warm as _warm_gather

# ---- callback ids (cupti.driver_api_trace_cbid / runtime_api_trace_cbid) ----
DOMAIN_DRIVER = 1  # cupti.CallbackDomain.DRIVER_API
DOMAIN_RUNTIME = 2  # cupti.CallbackDomain.RUNTIME_API
API_ENTER, API_EXIT = 0, 1

CB_cuLaunchKernel = 307
CB_cuLaunchKernel_ptsz = 442
CB_cuLaunchCooperativeKernel = 477
CB_cuLaunchCooperativeKernel_ptsz = 478
CB_cuLaunchKernelEx = 652
CB_cuLaunchKernelEx_ptsz = 653
CB_cudaLaunchKernel = 211
CB_cudaLaunchKernel_ptsz = 214
CB_cudaLaunchKernelExC = 430
CB_cudaLaunchKernelExC_ptsz = 431
CB_cudaLaunchCooperativeKernel = 269       # _v9000
CB_cudaLaunchCooperativeKernel_ptsz = 270  # _ptsz_v9000
CB___cudaLaunchKernel = 505        # CUDA 13: __cudaLaunchKernel_v13000 (nvcc 13's <<<...>>> stubs)
CB___cudaLaunchKernel_ptsz = 506   # __cudaLaunchKernel_ptsz_v13000

DRIVER_LAUNCH_CBIDS = (CB_cuLaunchKernel, CB_cuLaunchKernel_ptsz, CB_cuLaunchCooperativeKernel,
                       CB_cuLaunchCooperativeKernel_ptsz, CB_cuLaunchKernelEx, CB_cuLaunchKernelEx_ptsz)
RUNTIME_LAUNCH_CBIDS = (CB_cudaLaunchKernel, CB_cudaLaunchKernel_ptsz, CB_cudaLaunchKernelExC,
                        CB_cudaLaunchKernelExC_ptsz, CB_cudaLaunchCooperativeKernel,
                        CB_cudaLaunchCooperativeKernel_ptsz, CB___cudaLaunchKernel, CB___cudaLaunchKernel_ptsz)
PTSZ_CBIDS = frozenset({CB_cuLaunchKernel_ptsz, CB_cuLaunchCooperativeKernel_ptsz, CB_cuLaunchKernelEx_ptsz,
                        CB_cudaLaunchKernel_ptsz, CB_cudaLaunchKernelExC_ptsz, CB_cudaLaunchCooperativeKernel_ptsz,
                        CB___cudaLaunchKernel_ptsz})
# runtime launches whose `func` is a kernel handle (cudaKernel_t, a CUkernel), not a host stub
_KERNEL_HANDLE_CBIDS = frozenset({CB___cudaLaunchKernel, CB___cudaLaunchKernel_ptsz})
# the parameter struct each launch callback hands over (collect/cupti_params.py)
LAUNCH_PARAMS: dict[tuple[int, int], type] = {
    **{(DOMAIN_DRIVER, c): P.CuLaunchKernelParams for c in (CB_cuLaunchKernel, CB_cuLaunchKernel_ptsz)},
    **{(DOMAIN_DRIVER, c): P.CuLaunchCooperativeKernelParams
       for c in (CB_cuLaunchCooperativeKernel, CB_cuLaunchCooperativeKernel_ptsz)},
    **{(DOMAIN_DRIVER, c): P.CuLaunchKernelExParams for c in (CB_cuLaunchKernelEx, CB_cuLaunchKernelEx_ptsz)},
    **{(DOMAIN_RUNTIME, c): P.CudaLaunchKernelParams
       for c in (CB_cudaLaunchKernel, CB_cudaLaunchKernel_ptsz, CB_cudaLaunchCooperativeKernel,
                 CB_cudaLaunchCooperativeKernel_ptsz, CB___cudaLaunchKernel, CB___cudaLaunchKernel_ptsz)},
    **{(DOMAIN_RUNTIME, c): P.CudaLaunchKernelExCParams for c in (CB_cudaLaunchKernelExC, CB_cudaLaunchKernelExC_ptsz)},
}

_LAUNCH_READERS = {k: (cls, P.reader(cls)) for k, cls in LAUNCH_PARAMS.items()}

# cuLaunchKernel's `extra` keys (cuda.h)
CU_LAUNCH_PARAM_END = 0
CU_LAUNCH_PARAM_BUFFER_POINTER = 1
CU_LAUNCH_PARAM_BUFFER_SIZE = 2
_EXTRA_MAX_ENTRIES = 64  # a well-formed extra array has 5 entries; stop runaway reads
_MAX_PARAM_BYTES = 1 << 20  # CUDA 12.1+ allows 32764 bytes of parameters; anything larger is garbage


@dataclass
class LaunchArgs:
    """One kernel launch as the host issued it.

    `param_data[param_offsets[i] : param_offsets[i] + param_sizes[i]]` is
    parameter i (little-endian, as the driver received it). `correlation_id`
    is the outermost launch API call's CUPTI correlation id (the one kernel
    activity records carry); `correlation_ids` lists every launch API call
    that belongs to this launch (a runtime call and the driver call inside it).
    `host_ns` is the CUPTI timestamp at API enter, after `before_launch` ran.
    """

    kernel: str
    function: int
    grid_x: int
    grid_y: int
    grid_z: int
    block_x: int
    block_y: int
    block_z: int
    shared_mem_bytes: int
    stream: int
    correlation_id: int
    param_offsets: tuple[int, ...]
    param_sizes: tuple[int, ...]
    param_data: bytes
    stream_id: int | None = None
    device: int | None = None
    host_ns: int = 0
    cbid: int = 0
    domain: int = DOMAIN_DRIVER
    correlation_ids: list[int] = field(default_factory=list)
    launch_id: int | None = None  # set by the consumer (the collector numbers launches)
    at_exit: bool = False         # delivered at its API's exit: the kernel is queued already

    @property
    def grid(self) -> tuple[int, int, int]:
        return (self.grid_x, self.grid_y, self.grid_z)

    @property
    def block(self) -> tuple[int, int, int]:
        return (self.block_x, self.block_y, self.block_z)

    def param(self, i: int) -> bytes:
        o, s = self.param_offsets[i], self.param_sizes[i]
        return self.param_data[o:o + s]

    @classmethod
    def from_row(cls, row: dict[str, Any], *, param_data: bytes | None = None, stream: int = 0) -> "LaunchArgs":
        """The launch a launches-table row records, as the hook would hand it over (the inverse
        of `to_row`; replays feed traced launches to consumers this way)."""
        return cls(kernel=row[T.KERNEL], function=0, grid_x=row[T.GRID_X], grid_y=row[T.GRID_Y],
                   grid_z=row[T.GRID_Z], block_x=row[T.BLOCK_X], block_y=row[T.BLOCK_Y], block_z=row[T.BLOCK_Z],
                   shared_mem_bytes=row[T.SHARED_MEM_BYTES], stream=stream, correlation_id=row[T.LAUNCH_ID],
                   param_offsets=tuple(row[T.PARAM_OFFSETS]), param_sizes=tuple(row[T.PARAM_SIZES]),
                   param_data=bytes(row[T.PARAM_DATA] if param_data is None else param_data),
                   launch_id=row[T.LAUNCH_ID])

    def to_row(self, launch_id: int | None = None, *, start_ns: int | None = None,
               end_ns: int | None = None) -> dict[str, Any]:
        """A launches-table row (keys are pagecast.trace column names)."""
        lid = self.launch_id if launch_id is None else launch_id
        return {
            T.LAUNCH_ID: int(lid if lid is not None else -1), T.KERNEL: self.kernel,
            T.DEVICE: int(self.device or 0),
            T.STREAM: int(self.stream_id if self.stream_id is not None else self.stream),
            T.GRID_X: self.grid_x, T.GRID_Y: self.grid_y, T.GRID_Z: self.grid_z,
            T.BLOCK_X: self.block_x, T.BLOCK_Y: self.block_y, T.BLOCK_Z: self.block_z,
            T.SHARED_MEM_BYTES: self.shared_mem_bytes, T.START_NS: start_ns, T.END_NS: end_ns,
            T.PARAM_OFFSETS: list(self.param_offsets), T.PARAM_SIZES: list(self.param_sizes),
            T.PARAM_DATA: bytes(self.param_data),
        }


# ---- pure decoding -----------------------------------------------------------

_PTR = ctypes.sizeof(ctypes.c_void_p)


def _read_ptr(addr: int) -> int:
    return int(ctypes.c_void_p.from_address(addr).value or 0)


def decode_kernel_params(kernel_params_ptr: int, offsets, sizes) -> bytes:
    """Pack the parameters behind a `void** kernelParams` into one buffer.

    `kernelParams[i]` points at parameter i's value; it is copied to
    `offsets[i]` in a buffer as long as the furthest parameter's end, in one
    compiled call (`param_gather`; `decode_kernel_params_ctypes` is the same in
    ctypes, the reference it is tested against).
    """
    offsets = offsets if isinstance(offsets, tuple) else tuple(offsets)
    sizes = sizes if isinstance(sizes, tuple) else tuple(sizes)
    if not offsets:
        if sizes:
            raise ValueError("offsets and sizes differ in length")
        return b""
    if not kernel_params_ptr:
        raise ValueError("kernelParams is null")
    return gather_params(kernel_params_ptr, offsets, sizes, _MAX_PARAM_BYTES)


def decode_kernel_params_ctypes(kernel_params_ptr: int, offsets, sizes) -> bytes:
    """`decode_kernel_params` with ctypes, a pointer read and a memmove per parameter."""
    offsets, sizes = list(offsets), list(sizes)
    if len(offsets) != len(sizes):
        raise ValueError("offsets and sizes differ in length")
    if not offsets:
        return b""
    if not kernel_params_ptr:
        raise ValueError("kernelParams is null")
    total = max(o + s for o, s in zip(offsets, sizes))
    if total > _MAX_PARAM_BYTES or min(offsets) < 0 or min(sizes) < 0:
        raise ValueError(f"implausible parameter layout (total {total} bytes)")
    buf = (ctypes.c_char * total)()
    base = ctypes.addressof(buf)
    for i, (o, s) in enumerate(zip(offsets, sizes)):
        p = _read_ptr(kernel_params_ptr + i * _PTR)
        if not p:
            raise ValueError(f"kernelParams[{i}] is null")
        if s:
            ctypes.memmove(base + o, p, s)
    return bytes(buf)


def extra_layout(offsets: tuple, sizes: tuple, nbytes: int) -> tuple[tuple, tuple]:
    """The layout a launch's `extra` buffer of `nbytes` is recorded with: the function's own, where
    it fits in the buffer; else the buffer as one parameter (none when it is empty)."""
    if not offsets or max(o + s for o, s in zip(offsets, sizes)) > nbytes:
        return ((0,), (nbytes,)) if nbytes else ((), ())
    return offsets, sizes


def decode_extra(extra_ptr: int) -> bytes:
    """The parameter buffer of a launch's `extra` array.

    `extra` is a list of (key, value) pointers ended by CU_LAUNCH_PARAM_END (0):
    CU_LAUNCH_PARAM_BUFFER_POINTER (1) -> the buffer, CU_LAUNCH_PARAM_BUFFER_SIZE
    (2) -> a pointer to its size_t length.
    """
    if not extra_ptr:
        raise ValueError("extra is null")
    buf_ptr, size_ptr = None, None
    for i in range(_EXTRA_MAX_ENTRIES):
        key = _read_ptr(extra_ptr + 2 * i * _PTR)
        if key == CU_LAUNCH_PARAM_END:
            break
        value = _read_ptr(extra_ptr + (2 * i + 1) * _PTR)
        if key == CU_LAUNCH_PARAM_BUFFER_POINTER:
            buf_ptr = value
        elif key == CU_LAUNCH_PARAM_BUFFER_SIZE:
            size_ptr = value
        # unknown keys carry a value too; skip it
    else:
        raise ValueError("extra has no CU_LAUNCH_PARAM_END")
    if buf_ptr is None or size_ptr is None:
        raise ValueError("extra lacks CU_LAUNCH_PARAM_BUFFER_POINTER or CU_LAUNCH_PARAM_BUFFER_SIZE")
    size = int(ctypes.c_size_t.from_address(size_ptr).value) if size_ptr else 0
    if size > _MAX_PARAM_BYTES:
        raise ValueError(f"implausible parameter buffer size {size}")
    if size and not buf_ptr:
        raise ValueError("extra's buffer pointer is null")
    return ctypes.string_at(buf_ptr, size) if size else b""


class CUlaunchConfig(ctypes.Structure):
    """cuda.h's CUlaunchConfig (the `config` argument of cuLaunchKernelEx)."""

    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.c_void_p), ("numAttrs", ctypes.c_uint)]


class _Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


class CudaLaunchConfig(ctypes.Structure):
    """cuda_runtime_api.h's cudaLaunchConfig_t (the `config` of cudaLaunchKernelExC)."""

    _fields_ = [("gridDim", _Dim3), ("blockDim", _Dim3), ("dynamicSmemBytes", ctypes.c_size_t),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.c_void_p), ("numAttrs", ctypes.c_uint)]


def read_cu_launch_config(ptr: int) -> tuple[tuple[int, int, int], tuple[int, int, int], int, int]:
    """(grid, block, shared_mem_bytes, stream) from a CUlaunchConfig*."""
    if not ptr:
        raise ValueError("launch config is null")
    c = CUlaunchConfig.from_address(ptr)
    return ((c.gridDimX, c.gridDimY, c.gridDimZ), (c.blockDimX, c.blockDimY, c.blockDimZ),
            int(c.sharedMemBytes), int(c.hStream or 0))


def read_cuda_launch_config(ptr: int) -> tuple[tuple[int, int, int], tuple[int, int, int], int, int]:
    """(grid, block, shared_mem_bytes, stream) from a cudaLaunchConfig_t*."""
    if not ptr:
        raise ValueError("launch config is null")
    c = CudaLaunchConfig.from_address(ptr)
    return ((c.gridDim.x, c.gridDim.y, c.gridDim.z), (c.blockDim.x, c.blockDim.y, c.blockDim.z),
            int(c.dynamicSmemBytes), int(c.stream or 0))


# ---- parameter layout via cuda-bindings --------------------------------------

class ParamInfo:
    """Per-function parameter layout (offsets, sizes) and names, cached by handle.

    `layout(handle)` tries the handle as a CUfunction, then as a CUkernel.
    Tests inject `layout_fn(handle) -> (offsets, sizes)` instead of the driver.
    """

    def __init__(self, layout_fn: Callable[[int], tuple[tuple[int, ...], tuple[int, ...]]] | None = None,
                 name_fn: Callable[[int], str] | None = None,
                 symbol_fn: Callable[[int], int] | None = None) -> None:
        self._layout_fn = layout_fn or _driver_layout
        self._name_fn = name_fn or _driver_name
        self._symbol_fn = symbol_fn or _runtime_func_by_symbol
        self._layouts: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self._names: dict[int, str] = {}
        self._symbols: dict[int, int] = {}
        self._lock = threading.Lock()

    def layout(self, handle: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        got = self._layouts.get(handle)
        if got is None:
            got = self._layout_fn(handle)
            with self._lock:
                self._layouts[handle] = got
        return got

    def name(self, handle: int) -> str:
        got = self._names.get(handle)
        if got is None:
            got = self._name_fn(handle)
            with self._lock:
                self._names[handle] = got
        return got

    def function_of_symbol(self, host_func: int) -> int:
        """The CUfunction behind a runtime launch's host-side stub pointer."""
        got = self._symbols.get(host_func)
        if got is None:
            got = self._symbol_fn(host_func)
            with self._lock:
                self._symbols[host_func] = got
        return got


def _ok(err) -> bool:
    return int(err) == 0


CUDA_ERROR_INVALID_VALUE = 1  # cuda.h: what cu*GetParamInfo answers for an index past the last parameter
_MAX_PARAMS = 4096


def _param_count(count_fn, h) -> int | None:
    """The driver's parameter count, or None where it cannot say: the count functions came with
    CUDA 13.2, and on an older driver cuda-bindings raises FunctionNotFoundError (a RuntimeError)."""
    if count_fn is None:
        return None
    try:
        err, cnt = count_fn(h)
    except RuntimeError:
        return None
    return int(cnt) if _ok(err) else None


def walk_param_info(info_fn, h, count: int | None = None) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(offsets, sizes) from `info_fn(h, i) -> (err, offset, size)` for i = 0, 1, ...: `count`
    entries, or, with no count, until the driver answers CUDA_ERROR_INVALID_VALUE (past the last
    parameter). None when the driver refuses the handle."""
    offsets, sizes = [], []
    i = 0
    while count is None or i < count:
        err, off, size = info_fn(h, i)
        if not _ok(err):
            if count is None and int(err) == CUDA_ERROR_INVALID_VALUE:
                break
            return None
        offsets.append(int(off))
        sizes.append(int(size))
        i += 1
        if i > _MAX_PARAMS:
            return None
    return tuple(offsets), tuple(sizes)


def _driver_layout(handle: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The parameter layout of a CUfunction or CUkernel handle (which one is not known: try both)."""
    from cuda.bindings import driver as drv

    empty = None
    for as_kernel in (False, True):
        h = drv.CUkernel(handle) if as_kernel else drv.CUfunction(handle)
        info_fn = drv.cuKernelGetParamInfo if as_kernel else drv.cuFuncGetParamInfo
        count_fn = getattr(drv, "cuKernelGetParamCount" if as_kernel else "cuFuncGetParamCount", None)
        got = walk_param_info(info_fn, h, _param_count(count_fn, h))
        if got is None:
            continue
        if got[0]:
            return got
        empty = got   # no parameters, or a handle of the other kind: ask as the other kind too
    if empty is not None:
        return empty
    raise RuntimeError(f"no parameter info for function handle {handle:#x}")


def _driver_name(handle: int) -> str:
    from cuda.bindings import driver as drv

    for fn, cls in ((drv.cuFuncGetName, drv.CUfunction), (drv.cuKernelGetName, drv.CUkernel)):
        try:
            err, name = fn(cls(handle))
        except Exception:
            continue
        if _ok(err) and name:
            return name.decode() if isinstance(name, bytes) else str(name)
    return f"<function {handle:#x}>"


_CUDART_LIBS: list | None = None


def _loaded_cudarts() -> list:
    """The CUDA runtime libraries this process has loaded (the application's, e.g. PyTorch's).

    A runtime launch names its kernel by the host stub the application registered
    with its own libcudart, so only that instance can map it (cuda-bindings' runtime
    module is a separate implementation and cannot).
    """
    global _CUDART_LIBS
    if _CUDART_LIBS is None:
        paths = []
        try:
            with open("/proc/self/maps") as f:
                for line in f:
                    path = line.rsplit(None, 1)[-1] if "/" in line else ""
                    if "libcudart" in path.rsplit("/", 1)[-1] and path not in paths:
                        paths.append(path)
        except OSError:
            pass
        libs = []
        for path in paths:
            try:
                lib = ctypes.CDLL(path)  # already loaded: the same instance
                fn = lib.cudaGetFuncBySymbol
            except (OSError, AttributeError):
                continue
            fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
            fn.restype = ctypes.c_int
            libs.append(fn)
        _CUDART_LIBS = libs
    return _CUDART_LIBS


def _runtime_func_by_symbol(host_func: int) -> int:
    for fn in _loaded_cudarts():
        out = ctypes.c_void_p(0)
        if fn(ctypes.byref(out), ctypes.c_void_p(host_func)) == 0 and out.value:
            return int(out.value)
    raise RuntimeError("cudaGetFuncBySymbol: no loaded CUDA runtime knows this kernel's host stub")


# ---- the hook ------------------------------------------------------------------

def _warm_driver() -> None:
    try:
        from cuda.bindings import driver  # noqa: F401
    except ImportError:
        pass


def _default_clock() -> int:
    try:
        from cupti import cupti
        return int(cupti.get_timestamp())
    except Exception:  # no driver: fall back to the host clock (tests)
        return time.monotonic_ns()


class _Pending:
    __slots__ = ("corrs", "args", "delivered", "held", "site_domain", "site_cbid", "runtime_error", "saw_driver")

    def __init__(self, corr: int, domain: int, cbid: int) -> None:
        self.corrs = [corr]
        self.args: LaunchArgs | None = None
        self.delivered = False
        self.held: LaunchArgs | None = None
        self.site_domain = domain
        self.site_cbid = cbid
        self.runtime_error: str | None = None
        self.saw_driver = False


class CuptiBusyError(PagecastError):
    """Another tool in this process holds CUPTI and allows no other subscriber."""

    exit_code = 2

    def __init__(self) -> None:
        super().__init__("another profiling tool in this process holds CUPTI and allows no other "
                         "subscriber: run `pagecast collect` without it (Nsight Systems, a PyTorch or "
                         "CUPTI profiler, CUDA_INJECTION64_PATH)")


class LaunchHook:
    """CUPTI callback subscriber that turns kernel launches into `LaunchArgs`.

    `on_launch(args)` runs at API enter of each launch (once per launch).
    `before_launch()` runs first, at the outermost launch call's enter;
    `after_launch(args)` at its exit (args may be None if decoding failed).
    Exceptions in these are counted in `errors` and never reach CUDA.

    The subscriber asks CUPTI 13 to allow other subscribers (older CUPTI allows
    one per process). cupti-python, however, keeps one Python callback per process
    (`subscribe` stores it in `cupti.globals.pythonCallbacks["callbackFunc"]`, and
    its C wrapper hands every subscriber's callbacks to that one function), so two
    hooks started at once would both receive the later one's callbacks: `start`
    refuses while another LaunchHook of this process is running.
    """

    _running: "LaunchHook | None" = None  # the hook whose callback cupti-python holds now
    _running_lock = threading.Lock()

    def __init__(self, on_launch: Callable[[LaunchArgs], None], *,
                 before_launch: Callable[[], None] | None = None,
                 after_launch: Callable[[LaunchArgs | None], None] | None = None,
                 runtime: bool = True, param_info: ParamInfo | None = None,
                 clock: Callable[[], int] | None = None,
                 stream_id_fn: Callable[[int, int, bool], int] | None = None,
                 device_fn: Callable[[int], int] | None = None,
                 api_callbacks: dict[tuple[int, int], Callable[[int, Any], None]] | None = None,
                 ring=None) -> None:
        self.on_launch = on_launch
        # With a ring (collect/launch_ring.LaunchRing), launches are recorded into it, undecoded,
        # and `on_launch` is not called: its consumer takes them as LaunchArgs off the callback.
        self.ring = ring
        self.before_launch = before_launch
        self.after_launch = after_launch
        self.runtime = runtime
        self.params = param_info or ParamInfo()
        self.clock = clock or _default_clock
        self._stream_id_fn = stream_id_fn
        self._device_fn = device_fn
        # Other API calls to watch through the same subscriber (CUPTI allows one per
        # process): (domain, cbid) -> fn(callback_site, cbdata), at enter and exit.
        self.api_callbacks = dict(api_callbacks or {})
        self._tls = threading.local()
        self._subscriber = None
        self.subscribe_mode = ""   # how start() subscribed: "multiple allowed" or "single (...)"
        self.launches = 0
        self.errors = 0
        self.last_error: str | None = None
        self.callback_ns = 0  # host time spent inside the callback (overhead)
        # Whether runtime launches reach the driver launch callbacks (None: not seen yet).
        # Once they do, runtime launches are not decoded at the runtime level any more.
        self.runtime_reaches_driver: bool | None = None
        self.disabled = False  # set when collection is abandoned: callbacks return at once

    # -- lifecycle (needs cupti-python and a driver) --
    def start(self) -> "LaunchHook":
        from cupti import cupti

        _warm_gather()   # numba compiles (or loads) the parameter gather here, not in the first launch
        _warm_driver()   # and cuda-bindings imported here (0.04-0.1 s), not in a first launch's callback
        if self.clock is _default_clock:
            self.clock = cupti.get_timestamp
        if self._stream_id_fn is None:
            self._stream_id_fn = lambda ctx, stream, ptsz: int(cupti.get_stream_id_ex(ctx, stream, int(ptsz)))
        if self._device_fn is None:
            self._device_fn = lambda ctx: int(cupti.get_device_id(ctx))
        with LaunchHook._running_lock:
            other = LaunchHook._running
            if other is not None and other is not self:
                raise RuntimeError("another launch hook is running in this process: cupti-python delivers every "
                                   "subscriber's callbacks to the one Python function subscribed last, so two "
                                   "cannot run at once (stop the other first)")
            sub = self._subscribe(cupti)
            self._subscriber = sub
            LaunchHook._running = self
        try:
            self._enable_callbacks(cupti, sub, 1)
        except BaseException:
            try:
                self.stop()
            except Exception:
                pass
            raise
        return self

    def _enable_callbacks(self, cupti, sub, on: int) -> None:
        """Switch every callback this hook uses on (1) or off (0)."""
        for cbid in DRIVER_LAUNCH_CBIDS:
            cupti.enable_callback(on, sub, cupti.CallbackDomain.DRIVER_API, cbid)
        if self.runtime:
            for cbid in RUNTIME_LAUNCH_CBIDS:
                cupti.enable_callback(on, sub, cupti.CallbackDomain.RUNTIME_API, cbid)
        for domain, cbid in self.api_callbacks:
            cupti.enable_callback(on, sub, domain, cbid)

    def _subscribe(self, cupti):
        """Subscribe, allowing other subscribers where CUPTI can; else as the one subscriber.

        CUPTI 13's multi-subscriber mode is beta, and `cuptiSubscribe_v2` answers
        MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED where "the request cannot be fulfilled" (seen on an H200
        with CUPTI 13.5 and a 13.0 driver, once the activity API was enabled): then the hook
        subscribes again without asking (`cuptiSubscribe`), as one tool using both the activity and
        callback APIs always could. `subscribe_mode` says which took. Where another tool holds CUPTI
        even so, that is one clear error. (CUPTI can write the other subscriber's name into the
        parameters, but cupti-python 13.4 owns that pointer field: setting it from here corrupts its
        heap, seen as a double free.)"""
        params = self._subscriber_params(cupti)
        if params is None:
            self.subscribe_mode = "single"
            return cupti.subscribe(self._callback, None)
        refused = int(cupti.Result.ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)
        try:
            sub = cupti.subscribe_v2(self._callback, None, params.ptr)
            self.subscribe_mode = "multiple allowed"
            return sub
        except cupti.cuptiError as e:
            if int(getattr(e, "status", -1)) != refused:
                raise
        try:
            sub = cupti.subscribe(self._callback, None)
        except cupti.cuptiError as e:
            if int(getattr(e, "status", -1)) != refused:
                raise
            raise CuptiBusyError() from e
        self.subscribe_mode = "single (CUPTI could not allow others here)"
        return sub

    @staticmethod
    def _subscriber_params(cupti):
        """CUpti_SubscriberParams naming us and allowing other subscribers (CUPTI 13), or None."""
        if not (hasattr(cupti, "SubscriberParams") and hasattr(cupti, "subscribe_v2")):
            return None
        try:
            p = cupti.SubscriberParams()
            p.struct_size = cupti.SUBSCRIBER_PARAMS_SIZE
            p.subscriber_name = "pagecast"
        except (AttributeError, TypeError):
            return None
        # (13.4 names the struct's layout `_subscriber_params_dtype`, 13.0.1 `subscriber_params_dtype`)
        dt = getattr(cupti, "_subscriber_params_dtype", None) or getattr(cupti, "subscriber_params_dtype", None)
        fields = (dt.fields or {}) if dt is not None else {}
        try:
            p.allow_multiple_subscribers = 1
        except AttributeError:  # read-only in cupti-python 13.4: write the byte through its dtype
            # (where the struct has no such field, CUPTI allows one subscriber: nothing to set)
            if "allow_multiple_subscribers" in fields:
                ctypes.c_uint8.from_address(int(p.ptr) + fields["allow_multiple_subscribers"][1]).value = 1
        return p

    def stop(self) -> None:
        if self._subscriber is None:
            return
        from cupti import cupti

        sub, self._subscriber = self._subscriber, None
        try:
            self._enable_callbacks(cupti, sub, 0)
        finally:
            try:
                cupti.unsubscribe(sub)
            finally:
                with LaunchHook._running_lock:
                    if LaunchHook._running is self:
                        LaunchHook._running = None

    def __enter__(self) -> "LaunchHook":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- the callback (pure given cbdata; tests call it with stand-ins) --
    def _callback(self, userdata, domain, cbid, cbdata) -> None:
        tls = self._tls
        if self.disabled or getattr(tls, "busy", False):
            return  # re-entered from a driver call we made inside the callback
        tls.busy = True
        t0 = time.perf_counter_ns()
        try:
            self._dispatch(int(domain), int(cbid), cbdata)
        except Exception as e:  # never let an exception reach the CUDA call
            self.errors += 1
            self.last_error = f"{type(e).__name__}: {e}"
        finally:
            tls.busy = False
            self.callback_ns += time.perf_counter_ns() - t0


    def _dispatch(self, domain: int, cbid: int, cbdata) -> None:
        other = self.api_callbacks.get((domain, cbid))
        if other is not None:
            other(int(cbdata.callback_site), cbdata)
            return
        if (domain, cbid) not in LAUNCH_PARAMS:
            return
        tls = self._tls
        stack: list[_Pending] | None = getattr(tls, "stack", None)
        if stack is None:
            stack = tls.stack = []
        site = int(cbdata.callback_site)
        corr = int(cbdata.correlation_id)
        if site == API_ENTER:
            outer = not stack
            if outer:
                pend = _Pending(corr, domain, cbid)
                if self.before_launch is not None:
                    self._guarded(self.before_launch)
            else:
                pend = stack[0]
                pend.corrs.append(corr)
                if pend.args is not None:
                    pend.args.correlation_ids.append(corr)
            stack.append(pend)
            if pend.delivered:
                return
            if domain == DOMAIN_RUNTIME:
                if not outer or self.runtime_reaches_driver:
                    return  # the driver launch inside this call will be decoded
                try:
                    args = self._decode(domain, cbid, cbdata, pend)
                except Exception as e:
                    pend.runtime_error = f"{type(e).__name__}: {e}"
                    return
                if self.runtime_reaches_driver is False and args is not None:
                    # runtime launches were seen not to reach the driver callbacks: no driver view
                    # will follow, so deliver now, before the kernel is queued (a prefetching
                    # consumer must act before the launch, not at its exit)
                    self._deliver(pend, args)
                else:
                    pend.held = args  # delivered at exit if no driver launch follows
                return
            if not outer and pend.site_domain == DOMAIN_RUNTIME:
                self.runtime_reaches_driver = True
                pend.saw_driver = True
            args = self._decode(domain, cbid, cbdata, pend)
            if args is not None:
                self._deliver(pend, args)
        else:  # API_EXIT
            if not stack:
                return
            pend = stack.pop()
            if stack:
                return
            if not pend.delivered and pend.site_domain == DOMAIN_RUNTIME:
                if not pend.saw_driver:
                    self.runtime_reaches_driver = False
                if pend.held is not None:
                    self._deliver(pend, pend.held, at_exit=True)
                elif not pend.saw_driver:  # (a failed driver decode was counted already)
                    self.errors += 1
                    self.last_error = ("a runtime launch was not decoded "
                                       f"({pend.runtime_error or 'no driver launch callback followed it'})")
            if self.after_launch is not None:
                self._guarded(self.after_launch, pend.args)

    def _guarded(self, fn, *a) -> None:
        tls = self._tls
        try:
            fn(*a)
        except Exception as e:
            self.errors += 1
            self.last_error = f"{type(e).__name__}: {e}"
        finally:
            tls.busy = True

    def _deliver(self, pend: _Pending, args, at_exit: bool = False) -> None:
        if self.ring is not None:   # a capture (`_capture`): into the ring; nothing is decoded here
            self.ring.put(args, pend.corrs, at_exit)
            pend.delivered = True
            self.launches += 1
            return
        args.correlation_id = pend.corrs[0]
        args.correlation_ids = list(pend.corrs)
        args.at_exit = args.at_exit or at_exit
        pend.args = args
        pend.delivered = True
        self.launches += 1
        self.on_launch(args)

    def _decode(self, domain: int, cbid: int, cbdata, pend: _Pending):
        """The launch as a `LaunchArgs`; with a `ring`, the raw capture `_capture` takes instead."""
        if self.ring is not None:
            return self._capture(domain, cbid, cbdata)
        func, grid, block, smem, stream, kparams, extra = self._launch_fields(domain, cbid, cbdata)
        offsets, sizes = self.params.layout(func)
        if kparams:
            data = decode_kernel_params(kparams, offsets, sizes)
        elif extra:
            data = decode_extra(extra)
            offsets, sizes = extra_layout(offsets, sizes, len(data))
        else:
            data = b""
            if offsets:
                raise ValueError("launch has parameters but neither kernelParams nor extra")
        name = self._name_of(func, cbdata)
        stream_id, device = self._stream_and_device(cbdata, stream, cbid in PTSZ_CBIDS)
        return LaunchArgs(kernel=name, function=func, grid_x=grid[0], grid_y=grid[1], grid_z=grid[2],
                          block_x=block[0], block_y=block[1], block_z=block[2], shared_mem_bytes=smem,
                          stream=stream, correlation_id=pend.corrs[0], param_offsets=tuple(offsets),
                          param_sizes=tuple(sizes), param_data=data, stream_id=stream_id, device=device,
                          host_ns=int(self.clock()), cbid=cbid, domain=domain)

    def _launch_fields(self, domain: int, cbid: int, cbdata) -> tuple:
        """(function, grid, block, shared_mem_bytes, stream, kernelParams, extra) from the
        callback's parameter struct; a runtime launch's host stub resolved to its function."""
        cls, read = _LAUNCH_READERS[(domain, cbid)]
        ptr = P.function_params(cbdata)
        if not ptr:
            raise ValueError(f"{cls.__name__}: null parameter pointer")
        v = read(ptr)   # the struct's fields in one read (cls.flat_fields() order)
        if cls is P.CuLaunchKernelParams or cls is P.CuLaunchCooperativeKernelParams:
            # f, grid x/y/z, block x/y/z, sharedMemBytes, hStream, kernelParams[, extra]
            return (v[0], (v[1], v[2], v[3]), (v[4], v[5], v[6]), v[7], v[8], v[9],
                    v[10] if len(v) > 10 else 0)
        if cls is P.CuLaunchKernelExParams:
            config, func, kparams, extra = v
            grid, block, smem, stream = read_cu_launch_config(config)
            return func, grid, block, smem, stream, kparams, extra
        if cls is P.CudaLaunchKernelExCParams:
            config, func, args = v
            grid, block, smem, stream = read_cuda_launch_config(config)
        else:   # func, gridDim x/y/z, blockDim x/y/z, args, sharedMem, stream
            func, grid, block, args, smem, stream = v[0], v[1:4], v[4:7], v[7], v[8], v[9]
        if cbid not in _KERNEL_HANDLE_CBIDS:
            func = self.params.function_of_symbol(func)
        # (else a cudaKernel_t: the driver's CUkernel, which ParamInfo tries as one)
        return func, grid, block, smem, stream, args, 0

    def _name_of(self, func: int, cbdata) -> str:
        """The name as the driver reports it (cuFuncGetName: mangled for C++), which is what
        kernel activity records carry; the callback's symbol name where the driver has none."""
        name = self.params.name(func)
        if name.startswith("<function"):
            try:
                name = cbdata.symbol_name or name
            except Exception:
                pass
        return str(name)

    def _stream_and_device(self, cbdata, stream: int, ptsz: bool) -> tuple[int | None, int | None]:
        """CUPTI's stream id and device of the launch's context (None where they cannot be had)."""
        ctx = int(getattr(cbdata, "context", 0) or 0)
        stream_id = device = None
        if self._stream_id_fn is not None and ctx:
            try:
                stream_id = self._stream_id_fn(ctx, stream, ptsz)
            except Exception:
                stream_id = None
        if self._device_fn is not None and ctx:
            try:
                device = self._device_fn(ctx)
            except Exception:
                device = None
        return stream_id, device

    # -- recording into a ring (the collector's natural mode; collect/launch_ring.py) --
    def _capture(self, domain: int, cbid: int, cbdata) -> tuple:
        """What recording needs, read while the call's memory is valid: the launch's fields, its
        parameter source, CUPTI's stream id and device, a timestamp. Per launch this is struct
        reads and dictionary lookups: a kernel's layout and name are asked of the driver once, at
        its first launch (`LaunchRing.first_sight`); the bytes are gathered by `_deliver`."""
        func, grid, block, smem, stream, kparams, extra = self._launch_fields(domain, cbid, cbdata)
        ring = self.ring
        lay = ring.layouts.get(func)
        if lay is None:
            lay = ring.first_sight(func, self.params.layout(func), self._name_of(func, cbdata))
        if kparams:
            src = kparams
        elif extra:
            src = decode_extra(extra)
        else:
            if lay[0]:
                raise ValueError("launch has parameters but neither kernelParams nor extra")
            src = b""
        stream_id, device = self._stream_and_device(cbdata, stream, cbid in PTSZ_CBIDS)
        return (func, grid, block, smem, stream, stream_id, device, src, lay, int(self.clock()), cbid, domain)
