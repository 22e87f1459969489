"""Stand-ins for CUPTI and the GPU, used by the collector tests.

- Record classes carry exactly the field names of cupti-python's record classes
  (tests check them against `cupti.cupti`).
- `StandInSource` subclasses the real `CuptiActivitySource` and delivers its
  records through the real `_buffer_completed`, from a background thread like
  CUPTI's, and synchronously on `flush`.
- `StandInDevice` counts synchronizations and evictions and reads the clock.
- `StandInHook` is the real `LaunchHook` minus the CUPTI subscription: the
  stand-in workload calls its `_callback` the way CUPTI would, with real
  parameter structs (cupti-python's dtypes over numpy memory).
- `StandInGPU.launch(...)` plays one kernel: the driver callbacks around it, its
  kernel record and the page faults / migrations it causes.

Run as a script, it collects an endless stand-in workload into a trace (the
crash-safety tests kill it): `python tests/collect_standin.py OUT [--mode M]`.
"""

from __future__ import annotations

import ctypes
import struct
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pagecast import trace as T  # noqa: E402
from pagecast.collect import convert as C  # noqa: E402
from pagecast.collect import launch_hook as lh  # noqa: E402
from pagecast.collect import managed as M  # noqa: E402
from pagecast.collect.activity import CuptiActivitySource  # noqa: E402
from pagecast.collect.collector import Collector  # noqa: E402

PAGE = 4096


class Rec(SimpleNamespace):
    """A record object: attributes only, as cupti-python's classes present them."""


def kernel_record(*, name, start, end, grid, block, smem, corr, stream_id=7, device_id=0):
    return Rec(kind=C.KIND_CONCURRENT_KERNEL, name=name, start=start, end=end, grid_x=grid[0], grid_y=grid[1],
               grid_z=grid[2], block_x=block[0], block_y=block[1], block_z=block[2], dynamic_shared_memory=smem,
               correlation_id=corr, stream_id=stream_id, device_id=device_id)


def memory_record(*, address, nbytes, memory_kind, op, timestamp, corr, device_id=0):
    return Rec(kind=C.KIND_MEMORY2, address=address, bytes=nbytes, memory_kind=memory_kind,
               memory_operation_type=op, timestamp=timestamp, device_id=device_id, correlation_id=corr)


def um_record(*, counter_kind, value, start, end, address, flags, src_id=0, dst_id=0):
    return Rec(kind=C.KIND_UNIFIED_MEMORY_COUNTER, counter_kind=counter_kind, value=value, start=start, end=end,
               address=address, src_id=src_id, dst_id=dst_id, flags_=flags)


class StandInSource(CuptiActivitySource):
    def __init__(self, *, interval_s: float = 0.05, dropped: int = 0) -> None:
        super().__init__()
        self.info = {"source": "stand-in", "uvm_counters": True}
        self._queue: list = []
        self._qlock = threading.Lock()
        self._dlock = threading.RLock()   # a batch taken is delivered before another delivery starts
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._dropped_total = dropped
        self.flushes = 0

    def emit(self, *recs) -> None:
        with self._qlock:
            self._queue.extend(recs)

    def _deliver(self) -> None:
        # taken and delivered under one lock: a flush waits for a batch the source's thread has taken
        # and not yet delivered, as `activity_flush_all` returns only once every completed buffer was
        # delivered (collect/activity.py). Taken and delivered apart, a loaded machine let the final
        # flush find the queue empty while the last batch was still on its way, and that launch was
        # written without its kernel record.
        with self._dlock:
            with self._qlock:
                batch, self._queue = self._queue, []
            if batch:
                self._buffer_completed(batch)  # the real callback: snapshots taken there

    def start(self, on_records) -> None:
        self._on_records = on_records
        if self._interval:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._deliver()

    def flush(self, force: bool = False) -> None:
        self.flushes += 1
        self._deliver()

    def dropped(self) -> int:
        return self._dropped_total

    def stop(self) -> None:
        self._stop.set()


class StandInDevice:
    def __init__(self, sync_s: float = 0.0) -> None:
        self.syncs = 0
        self.evicted: list[list[tuple[int, int]]] = []
        self.sync_s = sync_s

    def synchronize(self) -> None:
        self.syncs += 1
        if self.sync_s:
            time.sleep(self.sync_s)  # the launching thread waits inside the launch callback

    def evict(self, ranges) -> int:
        self.evicted.append(list(ranges))
        return 0

    def now(self) -> int:
        return time.monotonic_ns()


class StandInMemoryDevice(StandInDevice):
    """A StandInDevice whose managed memory holds bytes: tests write into it (standing in for the
    kernels and the host), and the collector's index-value copies read it (`read`, as
    CudaDevice.read does, on the host, after the eviction). Unwritten bytes read as zeros."""

    def __init__(self, sync_s: float = 0.0) -> None:
        super().__init__(sync_s)
        self.mem: dict[int, int] = {}       # address -> byte (sparse)
        self.reads: list[tuple[int, int]] = []

    def write(self, address: int, data: bytes) -> None:
        for i, b in enumerate(data):
            self.mem[address + i] = b

    def read(self, address: int, nbytes: int) -> bytes:
        self.reads.append((address, nbytes))
        return bytes(self.mem.get(address + i, 0) for i in range(nbytes))


class StandInHook(lh.LaunchHook):
    def start(self):
        return self

    def stop(self) -> None:
        pass


def _struct(dtype_name: str, **fields):
    from cupti import cupti

    dt = getattr(cupti, dtype_name)
    rec = np.zeros(1, dtype=dt)
    for k, v in fields.items():
        rec[k] = v
    return rec


class StandInGPU:
    """Plays kernels and managed allocations through a collector's hook and source."""

    LAYOUT = ((0, 8, 16), (8, 8, 4))  # (float* x, float* y, int n)

    def __init__(self, collector: Collector, source: StandInSource, device: StandInDevice) -> None:
        self.c, self.src, self.dev = collector, source, device
        self.corr = 100
        self.next_addr = 0x7F00_0000_0000
        self._keep: list = []

    def _cb(self, site, corr, ptr, symbol="saxpy", ret=0):
        rv = ctypes.c_int(ret)
        self._keep.append(rv)
        return SimpleNamespace(callback_site=site, correlation_id=corr, function_params=ptr, symbol_name=symbol,
                               context=0, function_return_value=ctypes.addressof(rv))

    def malloc_managed(self, nbytes: int) -> int:
        """cudaMallocManaged as CUPTI shows it: runtime callbacks, then a MEMORY2 record."""
        self.corr += 1
        addr = self.next_addr
        self.next_addr += (nbytes + (1 << 21) - 1) // (1 << 21) * (1 << 21)
        out = ctypes.c_uint64(0)
        rec = _struct("cuda_malloc_managed_v6000params_dtype", dev_ptr=ctypes.addressof(out), size_=nbytes, flags_=1)
        self._keep.append((out, rec))
        hook = self.c.hook
        hook._callback(None, lh.DOMAIN_RUNTIME, M.CB_cudaMallocManaged, self._cb(lh.API_ENTER, self.corr, rec.ctypes.data))
        out.value = addr  # the allocation happens between enter and exit
        hook._callback(None, lh.DOMAIN_RUNTIME, M.CB_cudaMallocManaged, self._cb(lh.API_EXIT, self.corr, rec.ctypes.data))
        self.src.emit(memory_record(address=addr, nbytes=nbytes, memory_kind=C.MEMORY_KIND_MANAGED,
                                    op=C.MEMORY_OP_ALLOCATION, timestamp=self.dev.now(), corr=self.corr))
        return addr

    def free(self, addr: int) -> None:
        self.corr += 1
        rec = _struct("cuda_free_v3020params_dtype", dev_ptr=addr)
        self._keep.append(rec)
        hook = self.c.hook
        hook._callback(None, lh.DOMAIN_RUNTIME, M.CB_cudaFree, self._cb(lh.API_ENTER, self.corr, rec.ctypes.data))
        hook._callback(None, lh.DOMAIN_RUNTIME, M.CB_cudaFree, self._cb(lh.API_EXIT, self.corr, rec.ctypes.data))
        self.src.emit(memory_record(address=addr, nbytes=0, memory_kind=C.MEMORY_KIND_MANAGED,
                                    op=C.MEMORY_OP_RELEASE, timestamp=self.dev.now(), corr=self.corr))

    def saxpy(self, x: int, y: int, n: int, *, block: int = 256) -> None:
        """One launch: callbacks at enter/exit; its kernel record and faults on every page it touches."""
        self.corr += 1
        corr = self.corr
        vals = [struct.pack("<Q", x), struct.pack("<Q", y), struct.pack("<i", n)]
        bufs = [ctypes.create_string_buffer(v, len(v)) for v in vals]
        arr = (ctypes.c_void_p * 3)(*[ctypes.addressof(b) for b in bufs])
        grid = (n + block - 1) // block
        rec = _struct("cu_launch_kernel_params_dtype", f=0xF00, grid_dim_x=grid, grid_dim_y=1, grid_dim_z=1,
                      block_dim_x=block, block_dim_y=1, block_dim_z=1, kernel_params=ctypes.addressof(arr))
        self._keep = [bufs, arr, rec]
        hook = self.c.hook
        hook._callback(None, lh.DOMAIN_DRIVER, lh.CB_cuLaunchKernel, self._cb(lh.API_ENTER, corr, rec.ctypes.data))
        start = self.dev.now()
        recs = []
        nbytes = 4 * n
        for base, access in ((x, 1), (y, 2)):  # x read, y written
            for off in range(0, nbytes, PAGE):
                recs.append(um_record(counter_kind=C.UM_GPU_PAGE_FAULT, value=1, start=self.dev.now(), end=0,
                                      address=base + off + 16, flags=access))
            recs.append(um_record(counter_kind=C.UM_BYTES_TRANSFER_HTOD, value=nbytes, start=self.dev.now(),
                                  end=self.dev.now() + 10, address=base, flags=2))
        end = self.dev.now()
        recs.append(kernel_record(name="_Z5saxpyPfS_i", start=start, end=end, grid=(grid, 1, 1), block=(block, 1, 1),
                                  smem=0, corr=corr))
        self.src.emit(*recs)
        hook._callback(None, lh.DOMAIN_DRIVER, lh.CB_cuLaunchKernel, self._cb(lh.API_EXIT, corr, rec.ctypes.data))


def make_collector(out, *, mode="full", limit=None, interval_s=0.05, part_seconds=0.3, dropped=0, force=False,
                   sync_s=0.0, memory=False, **kw):
    """A Collector on stand-ins; `memory`: a device whose memory holds bytes (index values)."""
    source = StandInSource(interval_s=interval_s, dropped=dropped)
    device = (StandInMemoryDevice if memory else StandInDevice)(sync_s)
    info = lh.ParamInfo(layout_fn=lambda h: StandInGPU.LAYOUT, name_fn=lambda h: "_Z5saxpyPfS_i", symbol_fn=lambda h: h)
    manifest = T.new_manifest(mode=mode, source="cupti", workload={"name": "standin", "argv": ["standin"]})
    c = Collector(out, mode=mode, source=source, device=device, budget=M.ManagedBudget(limit),
                  hook_cls=StandInHook, hook_kwargs={"param_info": info, "clock": device.now},
                  part_seconds=part_seconds, tick_s=0.05, force=force, manifest=manifest, **kw)
    return c, StandInGPU(c, source, device)


def main(argv: list[str]) -> int:
    out = argv[0]
    mode = argv[argv.index("--mode") + 1] if "--mode" in argv else "full"
    sync_ms = float(argv[argv.index("--sync-ms") + 1]) if "--sync-ms" in argv else 0.0
    c, gpu = make_collector(out, mode=mode, sync_s=sync_ms / 1000)

    def workload():
        x = gpu.malloc_managed(64 * PAGE)
        y = gpu.malloc_managed(64 * PAGE)
        print("ready", flush=True)
        i = 0
        while True:  # until killed
            gpu.saxpy(x, y, 1024 * (1 + i % 8))
            i += 1
            if not sync_ms:
                time.sleep(0.002)

    return c.run(workload)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


def read_quiet(path):
    """The trace at `path`, without the TraceWarnings a partial stand-in collection raises."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", T.TraceWarning)
        return T.read_trace(path)
