"""Every CUDA and CUPTI call the GPU runner and `calibrate` make, behind one small interface.

`CudaIface` is what the rest of `pagecast.replay` uses: prefetch a byte range to
the GPU or to the host on a stream, find the allocation a pointer lands in,
streams and events, the free/total memory, managed allocations and one
calibration kernel. `UvmMonitor` counts GPU page faults and migrated bytes
(CUPTI unified-memory counters) and records kernel times.

Two implementations:
- `DriverCuda` / `CuptiMonitor`: the real thing, on cuda-bindings 13
  (`cuda.bindings.driver`) and cupti-python (`from cupti import cupti`);
- `FakeCuda` / `FakeMonitor`: a stand-in for CPU tests. It keeps a log of the
  calls and a toy residency model (pages on the GPU or not) so that tests can
  check the order of prefetches, evictions and launches. It never pretends to
  measure anything: it is only injected by tests.

`open_cuda()` returns a `DriverCuda` or raises `NoGPUError` (exit 2, one line)
when no GPU or CUDA driver is usable.
"""

from __future__ import annotations

import ctypes
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from pagecast.errors import NoGPUError

HOST = -1  # location id meaning "the host" in FakeCuda's residency map

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


@dataclass
class Allocation:
    base: int
    size: int
    managed: bool


class CudaIface(Protocol):
    """What pagecast.replay needs from CUDA. Addresses and handles are ints."""

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
    def synchronize(self) -> None: ...
    def alloc_managed(self, nbytes: int) -> int: ...
    def free(self, addr: int) -> None: ...
    def launch_touch(self, base: int, n: int, stride: int, stream: int = 0) -> None: ...
    def launch_copy(self, dst: int, src: int, nbytes: int, stream: int = 0) -> None: ...


@dataclass
class UvmCounts:
    """What a UvmMonitor saw between start() and stop()."""

    faults: int = 0                 # GPU page faults (sum of the fault groups' counts)
    fault_groups: int = 0           # fault records
    htod_bytes: int = 0
    dtoh_bytes: int = 0
    htod_by_cause: dict = field(default_factory=dict)
    dtoh_by_cause: dict = field(default_factory=dict)
    thrashing: int = 0
    kernels: int = 0
    kernel_busy_s: float = 0.0      # sum of kernel durations
    gpu_span_s: float | None = None  # first kernel start to last kernel end
    dropped: int = 0
    # raw records, kept only when asked (feedback, footprint estimate)
    fault_records: list = field(default_factory=list)      # (time_ns, address, count)
    htod_records: list = field(default_factory=list)       # (start_ns, end_ns, address, bytes, cause)
    dtoh_records: list = field(default_factory=list)       # (start_ns, end_ns, address, bytes, cause)
    kernel_records: list = field(default_factory=list)     # (start_ns, end_ns, correlation_id, name)
    _first_ns: int | None = None
    _last_ns: int | None = None


class UvmMonitor(Protocol):
    def start(self, keep_records: bool = False, live: bool = False) -> None: ...
    def poll(self) -> UvmCounts: ...   # flush what CUPTI has and return the running totals
    def take(self) -> tuple[list, list]: ...  # (fault records, kernel records) kept since the last take
    def stop(self) -> UvmCounts: ...


MAX_KEPT = 2_000_000  # raw records kept per kind (counts stay exact beyond it)
_CAUSES = {0: "unknown", 1: "user", 2: "coherence", 3: "prefetch", 4: "eviction", 5: "access_counters"}


def _add_record(c: UvmCounts, kind: str, rec: dict, keep: bool) -> None:
    """Fold one decoded CUPTI record into the running counts (pure: shared by the real and fake monitors)."""
    if kind == "fault":
        c.faults += int(rec["value"])
        c.fault_groups += 1
        if keep and len(c.fault_records) < MAX_KEPT:
            c.fault_records.append((int(rec["start"]), int(rec["address"]), int(rec["value"])))
    elif kind in ("htod", "dtoh"):
        cause = _CAUSES.get(int(rec.get("flags", 0)), "unknown")
        n = int(rec["value"])
        if kind == "htod":
            c.htod_bytes += n
            c.htod_by_cause[cause] = c.htod_by_cause.get(cause, 0) + n
            if keep and len(c.htod_records) < MAX_KEPT:
                c.htod_records.append((int(rec["start"]), int(rec["end"]), int(rec["address"]), n, cause))
        else:
            c.dtoh_bytes += n
            c.dtoh_by_cause[cause] = c.dtoh_by_cause.get(cause, 0) + n
            if keep and len(c.dtoh_records) < MAX_KEPT:
                c.dtoh_records.append((int(rec["start"]), int(rec["end"]), int(rec["address"]), n, cause))
    elif kind == "thrashing":
        c.thrashing += 1
    elif kind == "kernel":
        s, e = int(rec["start"]), int(rec["end"])
        c.kernels += 1
        c.kernel_busy_s += max(0, e - s) * 1e-9
        c._first_ns = s if c._first_ns is None else min(c._first_ns, s)
        c._last_ns = e if c._last_ns is None else max(c._last_ns, e)
        c.gpu_span_s = (c._last_ns - c._first_ns) * 1e-9
        if keep and len(c.kernel_records) < MAX_KEPT:
            c.kernel_records.append((s, e, int(rec.get("correlation_id", 0)), rec.get("name")))


# ---------------------------------------------------------------------------
# The real implementation (cuda-bindings 13 driver API)
# ---------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------
# CUPTI unified-memory counters and kernel times
# ---------------------------------------------------------------------------

class CuptiMonitor:
    """GPU page faults, migrated bytes and kernel times from CUPTI activity records.

    Uses activity kinds UNIFIED_MEMORY_COUNTER (25) and CONCURRENT_KERNEL (10)
    (background.md). Records are delivered in buffers, asynchronously: `poll()`
    forces a flush. One per process (CUPTI has one set of activity callbacks).
    """

    BUFFER_BYTES = 8 * 1024 * 1024
    FLUSH_EVERY_S = 0.1

    def __init__(self, device: int = 0) -> None:
        try:
            from cupti import cupti
        except Exception as e:  # noqa: BLE001
            raise NoGPUError(f"no usable NVIDIA GPU: cupti-python is not importable ({_first(e)})") from None
        self._c = cupti
        self.device = device
        self._lock = threading.Lock()
        self._counts = UvmCounts()
        self._keep = False
        self._started = False
        self._kinds: list[int] = []
        self._flush_thread: threading.Thread | None = None
        self._stop_flush = threading.Event()
        self._taken = (0, 0)

    def _requested(self):
        return self.BUFFER_BYTES, 0

    def _completed(self, activities) -> None:
        c = self._c
        K = c.ActivityKind
        UM = c.ActivityUnifiedMemoryCounterKind
        k_um, k_kernel = int(K.UNIFIED_MEMORY_COUNTER), int(K.CONCURRENT_KERNEL)
        um_kind = {int(UM.GPU_PAGE_FAULT): "fault", int(UM.BYTES_TRANSFER_HTOD): "htod",
                   int(UM.BYTES_TRANSFER_DTOH): "dtoh", int(UM.THRASHING): "thrashing"}
        with self._lock:
            for a in activities:
                try:  # read every field inside the callback (the buffer is reused afterwards)
                    kind = int(a.kind)
                    if kind == k_um:
                        what = um_kind.get(int(a.counter_kind))
                        if what is not None:
                            rec = {"value": int(a.value), "start": int(a.start), "end": int(a.end),
                                   "address": int(a.address), "flags": int(a.flags_)}
                            _add_record(self._counts, what, rec, self._keep)
                    elif kind == k_kernel:
                        _add_record(self._counts, "kernel", {"start": int(a.start), "end": int(a.end),
                                                             "correlation_id": int(a.correlation_id),
                                                             "name": str(a.name)}, self._keep)
                except Exception:  # noqa: BLE001 - a record we cannot read must not kill the workload
                    self._counts.dropped += 1

    def start(self, keep_records: bool = False, live: bool = False) -> None:
        """Start counting. keep_records: keep the raw records too (timeline, feedback);
        live: also flush every FLUSH_EVERY_S from a thread, so records arrive during the run (feedback)."""
        c = self._c
        UM = c.ActivityUnifiedMemoryCounterKind
        self._keep = keep_records
        self._counts = UvmCounts()
        self._taken = (0, 0)
        try:
            kinds = [UM.BYTES_TRANSFER_HTOD, UM.BYTES_TRANSFER_DTOH, UM.GPU_PAGE_FAULT, UM.THRASHING]
            cfg = c.ActivityUnifiedMemoryCounterConfig(len(kinds))
            for i, k in enumerate(kinds):
                cfg[i].scope = int(c.ActivityUnifiedMemoryCounterScope.PROCESS_SINGLE_DEVICE)
                cfg[i].device_id = self.device
                cfg[i].kind = int(k)
                cfg[i].enable = 1
            c.activity_configure_unified_memory_counter(cfg.ptr, len(kinds))
            self._cfg = cfg  # keep the configuration array alive while CUPTI may read it
            c.activity_register_callbacks(self._requested, self._completed)
            self._kinds = [int(c.ActivityKind.UNIFIED_MEMORY_COUNTER), int(c.ActivityKind.CONCURRENT_KERNEL)]
            for k in self._kinds:
                c.activity_enable(k)
        except Exception as e:  # noqa: BLE001 - NotSupportedError (no driver) or cuptiError 28..31
            raise NoGPUError(f"no usable NVIDIA GPU: CUPTI unified-memory counters unavailable ({_first(e)})") from None
        self._started = True
        if live:
            self._stop_flush = threading.Event()
            self._flush_thread = threading.Thread(target=self._flusher, name="pagecast-cupti-flush", daemon=True)
            self._flush_thread.start()

    def poll(self) -> UvmCounts:
        """Flush what CUPTI holds and return the running totals (not from inside a CUPTI callback)."""
        if self._started:
            self._c.activity_flush_all(1)
        with self._lock:
            return self._counts

    def take(self) -> tuple[list, list]:
        """The fault and kernel records kept (keep_records) since the last take."""
        with self._lock:
            c = self._counts
            f, k = c.fault_records[self._taken[0]:], c.kernel_records[self._taken[1]:]
            self._taken = (len(c.fault_records), len(c.kernel_records))
        return f, k

    def _flusher(self) -> None:
        # records arrive in buffers; with `live` (feedback) they are wanted during the run,
        # so flush from this thread: flushing inside a launch callback could re-enter CUPTI
        while not self._stop_flush.wait(self.FLUSH_EVERY_S):
            try:
                self._c.activity_flush_all(1)
            except Exception:  # noqa: BLE001
                pass

    def stop(self) -> UvmCounts:
        if not self._started:
            return self._counts
        c = self._c
        if self._flush_thread is not None:
            self._stop_flush.set()
            self._flush_thread.join(timeout=5)
            self._flush_thread = None
        c.activity_flush_all(1)
        for k in self._kinds:
            try:
                c.activity_disable(k)
            except Exception:  # noqa: BLE001
                pass
        self._started = False
        with self._lock:
            return self._counts


# ---------------------------------------------------------------------------
# The stand-ins for CPU tests and CPU-side replays of the engine
# ---------------------------------------------------------------------------

class InertCuda:
    """Streams and events that do nothing, for driving the runner's engine without a GPU
    (the simulator's `runner` policy, benchmarks/bench_runner.py). Subclasses answer
    `allocation_of` and say what a prefetch does."""

    device = 0

    def __init__(self) -> None:
        self._n = 0

    def record_event(self, event, stream=0) -> None:
        pass

    def stream_wait_event(self, stream, event) -> None:
        pass

    def new_stream(self) -> int:
        self._n += 1
        return 1000 + self._n

    def new_event(self, timing=False) -> int:
        self._n += 1
        return 2000 + self._n


class FakeCuda:
    """A CudaIface that logs calls and tracks which 4 KiB pages are on the GPU.

    Tests register allocations with `add_allocation`; `prefetch_*` move pages,
    `touch(ranges)` (called by tests standing in for a kernel) counts a fault per
    64 KiB big page that was not resident and brings it in. Times are not
    simulated: only order and bytes are checked against it.
    """

    PAGE = 4096
    BIG_PAGE = 65536

    def __init__(self, total: int = 80 * 2**30, free: int | None = None, device: int = 0) -> None:
        self.device = device
        self.total = total
        self.free_bytes = total if free is None else free
        self.log: list[tuple] = []
        self.allocs: dict[int, Allocation] = {}
        self.on_gpu: set[int] = set()
        self.faults = 0
        self.htod = 0
        self.dtoh = 0
        self._next_handle = 1
        self._next_addr = 1 << 40
        self._clock = 0.0

    # helpers for tests
    def add_allocation(self, base: int, size: int, managed: bool = True) -> None:
        self.allocs[base] = Allocation(base, size, managed)

    def _check_range(self, addr: int, nbytes: int) -> None:
        a = self.allocation_of(addr)
        if a is None or not a.managed or addr + nbytes > a.base + a.size:
            raise CudaCallError(f"cuMemPrefetchAsync failed: CUDA_ERROR_INVALID_VALUE ({addr:#x}+{nbytes})")

    def touch(self, addr: int, nbytes: int) -> int:
        """A kernel touching [addr, addr+nbytes): faults on non-resident big pages."""
        new = 0
        for big in range(addr // self.BIG_PAGE, (addr + nbytes - 1) // self.BIG_PAGE + 1):
            pages = range(big * (self.BIG_PAGE // self.PAGE), (big + 1) * (self.BIG_PAGE // self.PAGE))
            if not all(p in self.on_gpu for p in pages):
                new += 1
                self.on_gpu.update(pages)
                self.htod += self.BIG_PAGE
        self.faults += new
        self.log.append(("touch", addr, nbytes))
        return new

    def resident_bytes(self) -> int:
        return len(self.on_gpu) * self.PAGE

    # CudaIface
    def device_info(self) -> dict:
        return {"name": "FakeCuda (stand-in, no GPU)", "index": self.device, "memory_bytes": self.total}

    def mem_info(self) -> tuple[int, int]:
        return self.free_bytes, self.total

    def prefetch_to_gpu(self, addr: int, nbytes: int, stream: int = 0) -> None:
        if nbytes <= 0:
            return
        self._check_range(addr, nbytes)
        self.log.append(("gpu", addr, nbytes, stream))
        for p in range(addr // self.PAGE, (addr + nbytes - 1) // self.PAGE + 1):
            if p not in self.on_gpu:
                self.on_gpu.add(p)
                self.htod += self.PAGE

    def prefetch_to_host(self, addr: int, nbytes: int, stream: int = 0) -> None:
        if nbytes <= 0:
            return
        self._check_range(addr, nbytes)
        self.log.append(("host", addr, nbytes, stream))
        for p in range(addr // self.PAGE, (addr + nbytes - 1) // self.PAGE + 1):
            if p in self.on_gpu:
                self.on_gpu.discard(p)
                self.dtoh += self.PAGE

    def allocation_of(self, addr: int) -> Allocation | None:
        for a in self.allocs.values():
            if a.base <= addr < a.base + a.size:
                return a
        return None

    def new_stream(self) -> int:
        self._next_handle += 1
        self.log.append(("stream", self._next_handle))
        return self._next_handle

    def new_event(self, timing: bool = False) -> int:
        self._next_handle += 1
        return self._next_handle

    def record_event(self, event: int, stream: int = 0) -> None:
        self.log.append(("record", event, stream))

    def stream_wait_event(self, stream: int, event: int) -> None:
        self.log.append(("wait", stream, event))

    def event_elapsed_s(self, start: int, end: int) -> float:
        raise NotImplementedError("FakeCuda measures no time")

    def synchronize(self) -> None:
        self.log.append(("sync",))

    def alloc_managed(self, nbytes: int) -> int:
        base = self._next_addr
        self._next_addr += ((nbytes + (2 << 20) - 1) // (2 << 20)) * (2 << 20) + (2 << 20)
        self.add_allocation(base, nbytes, True)
        self.log.append(("alloc", base, nbytes))
        return base

    def free(self, addr: int) -> None:
        self.allocs.pop(addr, None)
        self.log.append(("free", addr))

    def launch_touch(self, base: int, n: int, stride: int, stream: int = 0) -> None:
        self.log.append(("launch_touch", base, n, stride, stream))
        for i in range(n):
            self.touch(base + i * stride, 4)

    def launch_copy(self, dst: int, src: int, nbytes: int, stream: int = 0) -> None:
        self.log.append(("launch_copy", dst, src, nbytes, stream))
        self.touch(src, nbytes)
        self.touch(dst, nbytes)


class FakeMonitor:
    """A UvmMonitor reading FakeCuda's counters (tests only)."""

    def __init__(self, cuda: FakeCuda) -> None:
        self.cuda = cuda
        self._base = (0, 0, 0)

    def start(self, keep_records: bool = False, live: bool = False) -> None:
        self._base = (self.cuda.faults, self.cuda.htod, self.cuda.dtoh)

    def poll(self) -> UvmCounts:
        f, h, d = self._base
        return UvmCounts(faults=self.cuda.faults - f, htod_bytes=self.cuda.htod - h, dtoh_bytes=self.cuda.dtoh - d)

    def take(self) -> tuple[list, list]:
        return [], []

    def stop(self) -> UvmCounts:
        return self.poll()


def monotonic() -> float:
    return time.perf_counter()
