"""Stand-ins for CUDA and CUPTI in the CPU tests (never imported by pagecast itself).

- `InertCuda`: streams and events that do nothing; subclasses answer
  `allocation_of` and say what a prefetch does (benchmarks/bench_runner.py).
- `FakeCuda`: a CudaIface that keeps a log of the calls, a toy residency
  model (pages on the GPU or not) and bytes tests write (what `copy_to_host` reads), so that tests can check the order of
  prefetches, evictions and launches. It never pretends to measure anything.
- `FakeMonitor`: a UvmMonitor reading FakeCuda's counters.
"""

from __future__ import annotations

from pagecast.replay.gpu.cupti_monitor import UvmCounts
from pagecast.replay.gpu.driver import CudaCallError
from pagecast.replay.online.ranges import Allocation
from pagecast import uvm

HOST = -1  # location id meaning "the host" in FakeCuda's residency map

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

    def event_synchronize(self, event) -> None:
        pass

    def copy_to_host(self, addr, nbytes, stream=0) -> bytes:
        return bytes(nbytes)


class FakeCuda:
    """A CudaIface that logs calls and tracks which 4 KiB pages are on the GPU.

    Tests register allocations with `add_allocation`; `prefetch_*` move pages,
    `touch(ranges)` (called by tests standing in for a kernel) counts a fault per
    64 KiB big page that was not resident and brings it in. Times are not
    simulated: only order and bytes are checked against it.
    """

    PAGE = uvm.PAGE
    BIG_PAGE = uvm.BIG_PAGE

    def __init__(self, total: int = 80 * 2**30, free: int | None = None, device: int = 0,
                 driver_prefetch: bool = False, batch: frozenset = frozenset()) -> None:
        self.device = device
        self.batch = frozenset(batch)   # the batched calls this "driver" hands out (DriverCuda.batch_calls)
        # the driver's tree prefetcher, as it shows on a GPU with uvm_perf_prefetch_enable = 1: a fault
        # in a 2 MiB block brings the rest of the block's allocated part in too (cause `prefetch`)
        self.driver_prefetch = driver_prefetch
        # what moved, as CUPTI's unified-memory counters report it: (seq, +1 host-to-device |
        # -1 device-to-host, address, bytes, cause), cause as CUPTI names it (user: a prefetch call;
        # coherence: a fault; prefetch: the driver's prefetcher)
        self.migrations: list[tuple[int, int, int, int, str]] = []
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
        self.mem: dict[int, int] = {}   # address -> byte: what copy_to_host reads (tests write it)

    # helpers for tests
    def add_allocation(self, base: int, size: int, managed: bool = True) -> None:
        self.allocs[base] = Allocation(base, size, managed)

    def _check_range(self, addr: int, nbytes: int) -> None:
        a = self.allocation_of(addr)
        if a is None or not a.managed or addr + nbytes > a.base + a.size:
            raise CudaCallError(f"cuMemPrefetchAsync failed: CUDA_ERROR_INVALID_VALUE ({addr:#x}+{nbytes})")

    def _moved(self, direction: int, pages, cause: str) -> int:
        """Record the given 4 KiB pages (ascending) as moved, in runs of contiguous pages; bytes moved."""
        n = 0
        run = None
        for p in pages:
            if run is not None and p == run[0] + run[1]:
                run[1] += 1
            else:
                if run is not None:
                    self.migrations.append((len(self.migrations), direction, run[0] * self.PAGE,
                                            run[1] * self.PAGE, cause))
                run = [p, 1]
            n += self.PAGE
        if run is not None:
            self.migrations.append((len(self.migrations), direction, run[0] * self.PAGE, run[1] * self.PAGE, cause))
        return n

    def touch(self, addr: int, nbytes: int) -> int:
        """A kernel touching [addr, addr+nbytes): faults on non-resident big pages (and, with the
        driver's prefetcher, the rest of each faulted 2 MiB block comes in too)."""
        new = 0
        per_big = self.BIG_PAGE // self.PAGE
        for big in range(addr // self.BIG_PAGE, (addr + nbytes - 1) // self.BIG_PAGE + 1):
            pages = range(big * per_big, (big + 1) * per_big)
            if not all(p in self.on_gpu for p in pages):
                new += 1
                fresh = [p for p in pages if p not in self.on_gpu]
                self.on_gpu.update(fresh)
                self.htod += self._moved(+1, fresh, "coherence")
                if self.driver_prefetch:
                    self._prefetch_block(big * self.BIG_PAGE)
        self.faults += new
        self.log.append(("touch", addr, nbytes))
        return new

    def _prefetch_block(self, addr: int) -> None:
        a = self.allocation_of(addr)
        if a is None:
            return
        blk = uvm.VA_BLOCK
        lo, hi = max(a.base, addr // blk * blk), min(a.base + a.size, (addr // blk + 1) * blk)
        rest = [p for p in range(lo // self.PAGE, (hi - 1) // self.PAGE + 1) if p not in self.on_gpu]
        self.on_gpu.update(rest)
        self.htod += self._moved(+1, rest, "prefetch")

    def resident_chunks(self) -> int:
        """2 MiB chunks with any page on the GPU (the driver's unit of GPU memory)."""
        per = uvm.VA_BLOCK // self.PAGE
        return len({p // per for p in self.on_gpu})

    def write(self, addr: int, data: bytes) -> None:
        """Tests standing in for a kernel (or the host) that wrote `data` at `addr`."""
        for i, b in enumerate(data):
            self.mem[addr + i] = b

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
        fresh = [p for p in range(addr // self.PAGE, (addr + nbytes - 1) // self.PAGE + 1) if p not in self.on_gpu]
        self.on_gpu.update(fresh)
        self.htod += self._moved(+1, fresh, "user")

    def prefetch_to_host(self, addr: int, nbytes: int, stream: int = 0) -> None:
        if nbytes <= 0:
            return
        self._check_range(addr, nbytes)
        self.log.append(("host", addr, nbytes, stream))
        gone = [p for p in range(addr // self.PAGE, (addr + nbytes - 1) // self.PAGE + 1) if p in self.on_gpu]
        self.on_gpu.difference_update(gone)
        self.dtoh += self._moved(-1, gone, "user")

    def batch_calls(self) -> frozenset:
        return self.batch

    def prefetch_batch(self, ranges, to_gpu: bool, stream: int = 0) -> None:
        """cuMemPrefetchBatchAsync: every range to one place, one call (only where `batch` has it)."""
        if "cuMemPrefetchBatchAsync" not in self.batch:
            raise CudaCallError("cuMemPrefetchBatchAsync failed: CUDA_ERROR_NOT_FOUND")
        ranges = [(int(a), int(n)) for a, n in ranges]
        for a, n in ranges:
            self._check_range(a, n)
        self.log.append(("batch", tuple(ranges), to_gpu, stream))
        for a, n in ranges:
            pages = range(a // self.PAGE, (a + n - 1) // self.PAGE + 1)
            if to_gpu:
                fresh = [p for p in pages if p not in self.on_gpu]
                self.on_gpu.update(fresh)
                self.htod += self._moved(+1, fresh, "user")
            else:
                gone = [p for p in pages if p in self.on_gpu]
                self.on_gpu.difference_update(gone)
                self.dtoh += self._moved(-1, gone, "user")

    def discard_batch(self, ranges, stream: int = 0) -> None:
        """cuMemDiscardBatchAsync: the ranges' pages leave the GPU, their contents gone (nothing is
        copied back, no migration is reported); only where `batch` has it."""
        if "cuMemDiscardBatchAsync" not in self.batch:
            raise CudaCallError("cuMemDiscardBatchAsync failed: CUDA_ERROR_NOT_FOUND")
        ranges = [(int(a), int(n)) for a, n in ranges]
        for a, n in ranges:
            self._check_range(a, n)
        self.log.append(("discard", tuple(ranges), stream))
        for a, n in ranges:
            self.on_gpu.difference_update(range(a // self.PAGE, (a + n - 1) // self.PAGE + 1))

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

    def event_synchronize(self, event: int) -> None:
        self.log.append(("event_sync", event))

    def copy_to_host(self, addr: int, nbytes: int, stream: int = 0) -> bytes:
        self._check_range(addr, nbytes)
        self.log.append(("dtoh", addr, nbytes, stream))
        return bytes(self.mem.get(addr + i, 0) for i in range(nbytes))

    def synchronize(self) -> None:
        self.log.append(("sync",))

    def alloc_managed(self, nbytes: int) -> int:
        base = self._next_addr
        blk = uvm.VA_BLOCK   # 2 MiB-aligned, a block apart, as the driver places managed allocations
        self._next_addr += ((nbytes + blk - 1) // blk) * blk + blk
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

    def start(self, keep_records: bool = False, live: bool = False, flush_every_s: float | None = None) -> None:
        self._base = (self.cuda.faults, self.cuda.htod, self.cuda.dtoh)
        self._moved_at = len(self.cuda.migrations)

    def take_migrations(self) -> list[tuple[int, int, int, int, str]]:
        """The migrations reported since the last call (the stand-in reports them at once)."""
        m = self.cuda.migrations
        at = getattr(self, "_moved_at", 0)
        self._moved_at = len(m)
        return m[at:]

    def poll(self, force: bool = False) -> UvmCounts:
        f, h, d = self._base
        return UvmCounts(faults=self.cuda.faults - f, htod_bytes=self.cuda.htod - h, dtoh_bytes=self.cuda.dtoh - d)

    def take(self) -> tuple[list, list]:
        return [], []

    def stop(self) -> UvmCounts:
        return self.poll()


class FakeHook:
    """Stands in for LaunchHook: the test's workload calls `FakeHook.current.on_launch(...)`."""

    current = None

    def __init__(self, on_launch, api_callbacks=None):
        self.on_launch = on_launch
        self.api_callbacks = dict(api_callbacks or {})
        self.errors = 0

    def start(self):
        FakeHook.current = self
        return self

    def stop(self):
        FakeHook.current = None
