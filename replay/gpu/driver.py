"""Every CUDA driver call the GPU runner and `calibrate` make, behind one small interface.

`CudaIface` is what pagecast.replay.gpu uses: prefetch a byte range to the GPU
or to the host on a stream, find the allocation a pointer lands in, streams
and events, the free/total memory, managed allocations and the calibration
kernels. `DriverCuda` implements it on cuda-bindings 13
(`cuda.bindings.driver`, imported on first use: the `gpu` extra);
`open_cuda()` returns one or raises `NoGPUError` (exit 2, one line) when no
GPU or CUDA driver is usable. CUPTI's counters are cupti_monitor.py's. The
CPU tests' stand-ins (FakeCuda) live in tests/cuda_standin.py.
"""

from __future__ import annotations

import ctypes
from typing import Any, Protocol

from pagecast.errors import NoGPUError

from ..online.ranges import Allocation

# A kernel that touches one 4-byte word every `stride` bytes from `base`, one
# per thread: n threads -> n page faults under demand paging (stride 64 KiB,
# the driver's big page, so that no two threads share a fault). Written in PTX
# so that calibrate needs no compiler: the driver JIT-compiles it for the GPU.
TOUCH_PTX = r"""
.version 7.0
.target sm_70
.address_size 64

.visible .entry pagecast_touch(
    .param .u64 pagecast_touch_base,
    .param .u64 pagecast_touch_n,
    .param .u64 pagecast_touch_stride
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<6>;
    .reg .b64 %rd<9>;

    ld.param.u64 %rd1, [pagecast_touch_base];
    ld.param.u64 %rd2, [pagecast_touch_n];
    ld.param.u64 %rd3, [pagecast_touch_stride];
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    cvt.u64.u32 %rd4, %r1;
    cvt.u64.u32 %rd5, %r2;
    cvt.u64.u32 %rd6, %r3;
    mad.lo.u64 %rd4, %rd4, %rd5, %rd6;
    setp.ge.u64 %p1, %rd4, %rd2;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd7, %rd1;
    mad.lo.u64 %rd8, %rd4, %rd3, %rd7;
    ld.global.u32 %r4, [%rd8];
    add.u32 %r5, %r4, 1;
    st.global.u32 [%rd8], %r5;
DONE:
    ret;
}

.visible .entry pagecast_copy(
    .param .u64 pagecast_copy_dst,
    .param .u64 pagecast_copy_src,
    .param .u64 pagecast_copy_n
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<5>;
    .reg .b64 %rd<14>;

    ld.param.u64 %rd1, [pagecast_copy_dst];
    ld.param.u64 %rd2, [pagecast_copy_src];
    ld.param.u64 %rd3, [pagecast_copy_n];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mov.u32 %r4, %nctaid.x;
    cvt.u64.u32 %rd4, %r1;
    cvt.u64.u32 %rd5, %r2;
    cvt.u64.u32 %rd6, %r3;
    cvt.u64.u32 %rd7, %r4;
    mad.lo.u64 %rd8, %rd4, %rd5, %rd6;
    mul.lo.u64 %rd9, %rd7, %rd5;
COPY_LOOP:
    setp.ge.u64 %p1, %rd8, %rd3;
    @%p1 bra COPY_DONE;
    shl.b64 %rd10, %rd8, 3;
    add.u64 %rd11, %rd2, %rd10;
    ld.global.u64 %rd12, [%rd11];
    add.u64 %rd13, %rd1, %rd10;
    st.global.u64 [%rd13], %rd12;
    add.u64 %rd8, %rd8, %rd9;
    bra COPY_LOOP;
COPY_DONE:
    ret;
}
"""
KERNELS_PTX = TOUCH_PTX  # both calibration kernels live in one module
TOUCH_KERNEL = "pagecast_touch"
COPY_KERNEL = "pagecast_copy"  # grid-stride copy of n 8-byte words: device bandwidth
TOUCH_BLOCK = 256


class CudaIface(Protocol):
    """What pagecast.replay.gpu needs from CUDA. Addresses and handles are ints."""

    device: int

    def device_info(self) -> dict: ...
    def mem_info(self) -> tuple[int, int]: ...                       # (free, total) bytes
    def prefetch_to_gpu(self, addr: int, nbytes: int, stream: int = 0) -> None: ...
    def prefetch_to_host(self, addr: int, nbytes: int, stream: int = 0) -> None: ...
    def allocation_of(self, addr: int) -> Allocation | None: ...
    def new_stream(self) -> int: ...
    def new_event(self, timing: bool = False) -> int: ...
    def record_event(self, event: int, stream: int = 0) -> None: ...
    def stream_wait_event(self, stream: int, event: int) -> None: ...
    def event_elapsed_s(self, start: int, end: int) -> float: ...
    def event_synchronize(self, event: int) -> None: ...                # the host waits for the event
    def copy_to_host(self, addr: int, nbytes: int, stream: int = 0) -> bytes: ...   # ordered on stream
    def synchronize(self) -> None: ...
    def alloc_managed(self, nbytes: int) -> int: ...
    def free(self, addr: int) -> None: ...
    def launch_touch(self, base: int, n: int, stride: int, stream: int = 0) -> None: ...
    def launch_copy(self, dst: int, src: int, nbytes: int, stream: int = 0) -> None: ...


def _driver():
    try:
        from cuda.bindings import driver
    except Exception as e:  # noqa: BLE001 - any import problem means no usable CUDA
        raise NoGPUError(f"no usable NVIDIA GPU: cuda-bindings is not importable ({_first(e)});"
                         " install pagecast[gpu] on a machine with a CUDA 13 driver") from None
    return driver


def _first(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return s[0] if s else type(e).__name__


class CudaCallError(RuntimeError):
    """A CUDA driver call failed (an internal error unless it says otherwise)."""


def _check(res: Any, what: str) -> Any:
    """cuda-bindings returns (CUresult, values...): raise on an error, return the values."""
    if isinstance(res, tuple):
        err, rest = res[0], res[1:]
    else:
        err, rest = res, ()
    if int(err) != 0:
        name = getattr(err, "name", str(err))
        raise CudaCallError(f"{what} failed: {name}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


class DriverCuda:
    """CudaIface on the CUDA driver API, sharing the primary context with CuPy / PyTorch."""

    def __init__(self, device: int = 0) -> None:
        d = _driver()
        self._d = d
        try:
            res = d.cuInit(0)
        except Exception as e:  # noqa: BLE001 - libcuda missing raises (DynamicLibNotFoundError)
            raise NoGPUError(f"no usable NVIDIA GPU: the CUDA driver library cannot be loaded ({_first(e)})") from None
        if int(res[0] if isinstance(res, tuple) else res) != 0:
            err = res[0] if isinstance(res, tuple) else res
            raise NoGPUError(f"no usable NVIDIA GPU: cuInit failed ({getattr(err, 'name', err)})")
        count = _check(d.cuDeviceGetCount(), "cuDeviceGetCount")
        if int(count) <= device:
            raise NoGPUError(f"no usable NVIDIA GPU: device {device} requested, {int(count)} present")
        self.device = device
        self._dev = _check(d.cuDeviceGet(device), "cuDeviceGet")
        ctx = _check(d.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if ctx is None or int(ctx) == 0:
            ctx = _check(d.cuDevicePrimaryCtxRetain(self._dev), "cuDevicePrimaryCtxRetain")
            _check(d.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        self._ctx = ctx
        self._gpu_loc = d.CUmemLocation()
        self._gpu_loc.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        self._gpu_loc.id = device
        self._host_loc = d.CUmemLocation()
        self._host_loc.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST
        self._host_loc.id = 0
        self._module = None
        self._funcs: dict[str, Any] = {}
        self._streams: list = []
        self._events: dict[int, Any] = {}

    def _ensure_ctx(self) -> None:
        # Threads that the workload did not start may have no current context.
        ctx = _check(self._d.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if ctx is None or int(ctx) == 0:
            _check(self._d.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")

    def device_info(self) -> dict:
        d = self._d
        name = _check(d.cuDeviceGetName(256, self._dev), "cuDeviceGetName")
        name = bytes(name).split(b"\0", 1)[0].decode(errors="replace")
        total = int(_check(d.cuDeviceTotalMem(self._dev), "cuDeviceTotalMem"))
        ver = int(_check(d.cuDriverGetVersion(), "cuDriverGetVersion"))
        return {"name": name, "index": self.device, "memory_bytes": total,
                "driver_cuda_version": f"{ver // 1000}.{(ver % 1000) // 10}"}

    def mem_info(self) -> tuple[int, int]:
        free, total = _check(self._d.cuMemGetInfo(), "cuMemGetInfo")
        return int(free), int(total)

    def _stream(self, stream: int):
        return self._d.CUstream(int(stream))

    def prefetch_to_gpu(self, addr: int, nbytes: int, stream: int = 0) -> None:
        if nbytes > 0:
            _check(self._d.cuMemPrefetchAsync(self._d.CUdeviceptr(int(addr)), int(nbytes), self._gpu_loc, 0,
                                              self._stream(stream)), "cuMemPrefetchAsync (to GPU)")

    def prefetch_to_host(self, addr: int, nbytes: int, stream: int = 0) -> None:
        if nbytes > 0:
            _check(self._d.cuMemPrefetchAsync(self._d.CUdeviceptr(int(addr)), int(nbytes), self._host_loc, 0,
                                              self._stream(stream)), "cuMemPrefetchAsync (to host)")

    # the batched calls of CUDA 13.0's driver API (one call, many ranges); `batch_calls()` says which
    # this driver hands out (cuGetProcAddress answers CUDA_ERROR_NOT_FOUND for a function it lacks)
    BATCH_CALLS = ("cuMemPrefetchBatchAsync", "cuMemDiscardBatchAsync", "cuMemDiscardAndPrefetchBatchAsync")

    def batch_calls(self) -> frozenset:
        """The batched calls this driver has (asked once, by name, through cuGetProcAddress)."""
        got = getattr(self, "_batch", None)
        if got is None:
            d, have = self._d, set()
            flags = int(getattr(d.CUdriverProcAddress_flags, "CU_GET_PROC_ADDRESS_DEFAULT", 0))
            for name in self.BATCH_CALLS:
                try:
                    res = d.cuGetProcAddress(name.encode(), 13000, flags)
                    if int(res[0]) == 0 and int(res[1] or 0) != 0:
                        have.add(name)
                except Exception:  # noqa: BLE001 - an older cuda-bindings: treat as absent
                    pass
            got = self._batch = frozenset(have)
        return got

    def prefetch_batch(self, ranges, to_gpu: bool, stream: int = 0) -> None:
        """cuMemPrefetchBatchAsync: every (address, nbytes) of `ranges` to one location, one call."""
        d = self._d
        rs = [(int(a), int(n)) for a, n in ranges if n > 0]
        if rs:
            _check(d.cuMemPrefetchBatchAsync([d.CUdeviceptr(a) for a, _ in rs], [n for _, n in rs], len(rs),
                                             [self._gpu_loc if to_gpu else self._host_loc], [0], 1, 0,
                                             self._stream(stream)), "cuMemPrefetchBatchAsync")

    def discard_batch(self, ranges, stream: int = 0) -> None:
        """cuMemDiscardBatchAsync: the ranges' contents are dead; nothing is copied back."""
        d = self._d
        rs = [(int(a), int(n)) for a, n in ranges if n > 0]
        if rs:
            _check(d.cuMemDiscardBatchAsync([d.CUdeviceptr(a) for a, _ in rs], [n for _, n in rs], len(rs), 0,
                                            self._stream(stream)), "cuMemDiscardBatchAsync")

    def discard_and_prefetch_batch(self, ranges, to_gpu: bool, stream: int = 0) -> None:
        """cuMemDiscardAndPrefetchBatchAsync: discard the ranges' contents and place them (no copy)."""
        d = self._d
        rs = [(int(a), int(n)) for a, n in ranges if n > 0]
        if rs:
            _check(d.cuMemDiscardAndPrefetchBatchAsync([d.CUdeviceptr(a) for a, _ in rs], [n for _, n in rs], len(rs),
                                                       [self._gpu_loc if to_gpu else self._host_loc], [0], 1, 0,
                                                       self._stream(stream)), "cuMemDiscardAndPrefetchBatchAsync")

    def allocation_of(self, addr: int) -> Allocation | None:
        d = self._d
        res = d.cuMemGetAddressRange(d.CUdeviceptr(int(addr)))
        if int(res[0]) != 0:
            return None
        base, size = int(res[1]), int(res[2])
        res = d.cuPointerGetAttribute(d.CUpointer_attribute.CU_POINTER_ATTRIBUTE_IS_MANAGED, d.CUdeviceptr(int(addr)))
        managed = bool(res[1]) if int(res[0]) == 0 else False
        return Allocation(base, size, managed)

    def new_stream(self) -> int:
        s = _check(self._d.cuStreamCreate(int(self._d.CUstream_flags.CU_STREAM_NON_BLOCKING)), "cuStreamCreate")
        self._streams.append(s)
        return int(s)

    def new_event(self, timing: bool = False) -> int:
        flags = 0 if timing else int(self._d.CUevent_flags.CU_EVENT_DISABLE_TIMING)
        ev = _check(self._d.cuEventCreate(flags), "cuEventCreate")
        self._events[int(ev)] = ev
        return int(ev)

    def record_event(self, event: int, stream: int = 0) -> None:
        _check(self._d.cuEventRecord(self._events[event], self._stream(stream)), "cuEventRecord")

    def stream_wait_event(self, stream: int, event: int) -> None:
        _check(self._d.cuStreamWaitEvent(self._stream(stream), self._events[event], 0), "cuStreamWaitEvent")

    def event_elapsed_s(self, start: int, end: int) -> float:
        _check(self._d.cuEventSynchronize(self._events[end]), "cuEventSynchronize")
        ms = _check(self._d.cuEventElapsedTime(self._events[start], self._events[end]), "cuEventElapsedTime")
        return float(ms) * 1e-3

    def event_synchronize(self, event: int) -> None:
        _check(self._d.cuEventSynchronize(self._events[event]), "cuEventSynchronize")

    def copy_to_host(self, addr: int, nbytes: int, stream: int = 0) -> bytes:
        """`nbytes` at device address `addr`, copied on `stream` (after the work queued there) into
        a host buffer; returns once they are there (a launch's index values: cuda_engine.py)."""
        buf = ctypes.create_string_buffer(int(nbytes))
        _check(self._d.cuMemcpyDtoHAsync(ctypes.addressof(buf), self._d.CUdeviceptr(int(addr)), int(nbytes),
                                         self._stream(stream)), "cuMemcpyDtoHAsync")
        _check(self._d.cuStreamSynchronize(self._stream(stream)), "cuStreamSynchronize")
        return buf.raw

    def synchronize(self) -> None:
        self._ensure_ctx()
        _check(self._d.cuCtxSynchronize(), "cuCtxSynchronize")

    def alloc_managed(self, nbytes: int) -> int:
        flags = int(self._d.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL)
        return int(_check(self._d.cuMemAllocManaged(int(nbytes), flags), "cuMemAllocManaged"))

    def free(self, addr: int) -> None:
        _check(self._d.cuMemFree(self._d.CUdeviceptr(int(addr))), "cuMemFree")

    def _function(self, name: str):
        d = self._d
        if self._module is None:
            # a NUL-terminated PTX image, passed by address as cuda-python's samples do
            self._ptx = ctypes.create_string_buffer(KERNELS_PTX.encode())
            self._module = _check(d.cuModuleLoadData(ctypes.addressof(self._ptx)),
                                  "cuModuleLoadData (calibration kernels)")
        if name not in self._funcs:
            self._funcs[name] = _check(d.cuModuleGetFunction(self._module, name.encode()), "cuModuleGetFunction")
        return self._funcs[name]

    def launch_touch(self, base: int, n: int, stride: int, stream: int = 0) -> None:
        f = self._function(TOUCH_KERNEL)
        grid = max(1, (int(n) + TOUCH_BLOCK - 1) // TOUCH_BLOCK)
        params = ((int(base), int(n), int(stride)), (ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64))
        _check(self._d.cuLaunchKernel(f, grid, 1, 1, TOUCH_BLOCK, 1, 1, 0, self._stream(stream), params, 0),
               "cuLaunchKernel (touch kernel)")

    def launch_copy(self, dst: int, src: int, nbytes: int, stream: int = 0) -> None:
        f = self._function(COPY_KERNEL)
        words = int(nbytes) // 8
        grid = max(1, min(8192, (words + TOUCH_BLOCK - 1) // TOUCH_BLOCK))
        params = ((int(dst), int(src), words), (ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64))
        _check(self._d.cuLaunchKernel(f, grid, 1, 1, TOUCH_BLOCK, 1, 1, 0, self._stream(stream), params, 0),
               "cuLaunchKernel (copy kernel)")


def context_exists(device: int = 0) -> bool | None:
    """Whether `device`'s primary context is active in this process already (None: no driver).
    CUPTI's unified-memory counters started after that count no faults (seen on an H200)."""
    try:
        d = _driver()
        res = d.cuInit(0)
        if int(res[0] if isinstance(res, tuple) else res) != 0:
            return None
        dev = _check(d.cuDeviceGet(device), "cuDeviceGet")
        _flags, active = _check(d.cuDevicePrimaryCtxGetState(dev), "cuDevicePrimaryCtxGetState")
        return bool(active)
    except Exception:  # noqa: BLE001 - no driver (CPU machines): unknown
        return None


def open_cuda(device: int = 0) -> DriverCuda:
    """The real CudaIface, or NoGPUError (one line, exit 2) when none is usable."""
    return DriverCuda(device)


def no_gpu_reason(device: int = 0) -> str | None:
    """Why `open_cuda(device)` fails here (the first line of its error), or None when it works.

    For skipping GPU tests and choosing no-GPU paths; it opens the device once to find out.
    """
    try:
        open_cuda(device)
    except Exception as e:  # noqa: BLE001
        return _first(e)
    return None
