"""CUPTI activity records and launch arguments -> trace rows (pure; no CUDA needed).

CUPTI hands activity records to `buffer_completed` as objects whose memory is
reused once the callback returns, so `snapshot(record)` copies the fields we
need into small tuples right there. `RowBuilder` then joins and converts:

- kernels (CONCURRENT_KERNEL) joined with `LaunchArgs` by correlation id ->
  launches, numbered densely in host issue order (the order the launch hook
  saw them). Launch rows are released strictly in launch_id order, each once
  its kernel record has arrived (or after `launch_timeout_s`, or at the end,
  with null times), so whatever reached disk is always launches 0..k: a
  partial trace stays readable.
- MEMORY2 managed / device / pinned allocations and releases -> allocations,
  with first_launch (launches issued before the allocation) and last_launch
  (the last one issued before the release).
- UNIFIED_MEMORY_COUNTER: GPU_PAGE_FAULT -> faults (access from flags_),
  BYTES_TRANSFER_HTOD/DTOH/DTOD -> migrations (direction from the counter
  kind, cause from flags_), THRASHING / THROTTLING / REMOTE_MAP -> uvm_events.
- Attribution: in `full` mode the collector closes a host-time window per
  launch (from after its eviction to after its synchronize); a record whose
  start falls in a window gets that launch_id. Kernels are serialized there,
  so windows do not overlap. In `natural` mode launch_id stays null and
  readers attribute by time.

The record field names used here are listed in `KERNEL_FIELDS`,
`MEMORY_FIELDS` and `UM_FIELDS`; a test checks them against cupti-python's
classes, so stand-in records in tests exercise exactly this code.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any, Iterable, NamedTuple

from pagecast import trace as T
from pagecast.uvm import PAGE

from .launch_hook import LaunchArgs

# ---- CUPTI enumerations (cupti.ActivityKind, ...; values from cupti-python 13.4) ----
KIND_KERNEL = 3
KIND_CONCURRENT_KERNEL = 10
KIND_UNIFIED_MEMORY_COUNTER = 25
KIND_MEMORY2 = 49

UM_BYTES_TRANSFER_HTOD = 1
UM_BYTES_TRANSFER_DTOH = 2
UM_CPU_PAGE_FAULT_COUNT = 3
UM_GPU_PAGE_FAULT = 4
UM_THRASHING = 5
UM_THROTTLING = 6
UM_REMOTE_MAP = 7
UM_BYTES_TRANSFER_DTOD = 8
UM_COUNTER_KINDS = (UM_GPU_PAGE_FAULT, UM_BYTES_TRANSFER_HTOD, UM_BYTES_TRANSFER_DTOH, UM_BYTES_TRANSFER_DTOD,
                    UM_THRASHING, UM_THROTTLING, UM_REMOTE_MAP)

MEMORY_KIND_PAGEABLE, MEMORY_KIND_PINNED, MEMORY_KIND_DEVICE = 1, 2, 3
MEMORY_KIND_MANAGED, MEMORY_KIND_DEVICE_STATIC, MEMORY_KIND_MANAGED_STATIC = 5, 6, 7
MEMORY_OP_ALLOCATION, MEMORY_OP_RELEASE = 1, 2

ALLOC_KIND_OF_MEMORY = {MEMORY_KIND_MANAGED: "managed", MEMORY_KIND_MANAGED_STATIC: "managed",
                        MEMORY_KIND_DEVICE: "device", MEMORY_KIND_DEVICE_STATIC: "device",
                        MEMORY_KIND_PINNED: "host"}
ACCESS_OF_FLAGS = {1: "read", 2: "write", 3: "atomic", 4: "prefetch"}  # CUpti_ActivityUnifiedMemoryAccessType
CAUSE_OF_FLAGS = {1: "user", 2: "coherence", 3: "prefetch", 4: "eviction", 5: "access_counters"}
DIRECTION_OF_COUNTER = {UM_BYTES_TRANSFER_HTOD: "htod", UM_BYTES_TRANSFER_DTOH: "dtoh",
                        UM_BYTES_TRANSFER_DTOD: "dtod"}
EVENT_OF_COUNTER = {UM_THRASHING: "thrashing", UM_THROTTLING: "throttling", UM_REMOTE_MAP: "remote_map"}

# Field names read from each record class (checked against cupti.cupti in the tests).
KERNEL_FIELDS = ("kind", "name", "start", "end", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z",
                 "dynamic_shared_memory", "correlation_id", "stream_id", "device_id")
MEMORY_FIELDS = ("kind", "address", "bytes", "memory_kind", "memory_operation_type", "timestamp", "device_id",
                 "correlation_id")
UM_FIELDS = ("kind", "counter_kind", "value", "start", "end", "address", "src_id", "dst_id", "flags_")
# The cupti-python classes CUPTI 13 hands out for those kinds (any version listed must have the fields).
KERNEL_CLASSES = ("ActivityKernel9", "ActivityKernel10", "ActivityKernel11", "ActivityKernel12", "ActivityKernel13")
MEMORY_CLASSES = ("ActivityMemory4",)
UM_CLASSES = ("ActivityUnifiedMemoryCounter2", "ActivityUnifiedMemoryCounter3")


class KernelRec(NamedTuple):
    name: str
    start: int
    end: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    correlation_id: int
    stream_id: int
    device: int


class MemRec(NamedTuple):
    address: int
    bytes: int
    memory_kind: int
    op: int
    timestamp: int
    device: int
    correlation_id: int


class UMRec(NamedTuple):
    counter_kind: int
    value: int
    start: int
    end: int
    address: int
    src_id: int
    dst_id: int
    flags: int


def snapshot(r: Any) -> KernelRec | MemRec | UMRec | None:
    """Copy the fields we use out of one activity record (None for other kinds)."""
    kind = int(r.kind)
    if kind in (KIND_CONCURRENT_KERNEL, KIND_KERNEL):
        return KernelRec(str(r.name), int(r.start), int(r.end), (int(r.grid_x), int(r.grid_y), int(r.grid_z)),
                         (int(r.block_x), int(r.block_y), int(r.block_z)), int(r.dynamic_shared_memory),
                         int(r.correlation_id), int(r.stream_id), int(r.device_id))
    if kind == KIND_MEMORY2:
        return MemRec(int(r.address), int(r.bytes), int(r.memory_kind), int(r.memory_operation_type),
                      int(r.timestamp), int(r.device_id), int(r.correlation_id))
    if kind == KIND_UNIFIED_MEMORY_COUNTER:
        return UMRec(int(r.counter_kind), int(r.value), int(r.start), int(r.end), int(r.address),
                     int(r.src_id), int(r.dst_id), int(r.flags_))
    return None


def snapshots(records: Iterable[Any]) -> list:
    out = []
    for r in records:
        s = snapshot(r)
        if s is not None:
            out.append(s)
    return out


# ---- attribution -----------------------------------------------------------------

def attribute(times: list[int], windows: list[tuple[int, int, int]]) -> list[int | None]:
    """Launch id of the window [lo, hi] holding each time (windows sorted, disjoint), else None."""
    los = [w[0] for w in windows]
    out: list[int | None] = []
    for t in times:
        k = bisect.bisect_right(los, t) - 1
        out.append(windows[k][2] if k >= 0 and t <= windows[k][1] else None)
    return out


# ---- the builder -----------------------------------------------------------------

@dataclass
class _Launch:
    args: LaunchArgs | None
    kernel: KernelRec | None
    added: float


@dataclass
class _Alloc:
    alloc_id: int
    address: int
    bytes: int
    kind: str
    device: int
    first_launch: int
    alloc_ns: int | None


@dataclass
class Stats:
    launches: int = 0
    launches_without_args: int = 0
    launches_without_kernel_record: int = 0
    kernel_records: int = 0
    allocations: int = 0
    faults: int = 0
    fault_count: int = 0
    migrations: int = 0
    uvm_events: int = 0
    unattributed_faults: int = 0
    releases_without_allocation: int = 0
    allocations_never_live: int = 0
    kernel_name_mismatches: int = 0
    ignored_records: int = 0
    kernels_after_stop: int = 0   # kernels the workload ran after collection stopped (not in the trace)

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class RowBuilder:
    """Joins launches with activity records and hands out trace rows as they become final.

    Not thread-safe: the collector calls it under one lock. `now` is a
    monotonic time in seconds (injected, so tests are deterministic).
    """

    def __init__(self, mode: str = "full", *, page_size: int = PAGE, launch_timeout_s: float = 10.0) -> None:
        if mode not in T.MODES:
            raise ValueError(f"mode must be one of {T.MODES}")
        self.mode = mode
        self.page_size = page_size
        self.launch_timeout_s = launch_timeout_s
        self.stats = Stats()
        self._launches: dict[int, _Launch] = {}
        self._next_id = 0
        self._next_emit = 0
        self._by_corr: dict[int, int] = {}
        self._corr_sorted: list[int] = []  # correlation ids of hooked launches, sorted
        self._host_sorted: list[int] = []  # their host timestamps, sorted
        self._windows: list[tuple[int, int, int]] = []  # (lo, hi, launch_id), sorted by lo
        self._window_hi = -1  # all records before this time can be attributed now
        self._um_pending: list[UMRec] = []
        self._sealed_at: int | None = None   # seal(): kernels starting later without args are left out
        self._live: dict[int, _Alloc] = {}
        self._next_alloc = 0
        self._out: dict[str, dict[str, list]] = {}

    # -- inputs --
    def add_launch(self, args: LaunchArgs, now: float = 0.0) -> int:
        """Number a launch (host issue order) and wait for its kernel record."""
        lid = self._next_id
        self._next_id += 1
        args.launch_id = lid
        self._launches[lid] = _Launch(args, None, now)
        for c in (args.correlation_ids or [args.correlation_id]):
            self._by_corr[int(c)] = lid
        bisect.insort(self._corr_sorted, int(args.correlation_id))
        bisect.insort(self._host_sorted, int(args.host_ns))
        self.stats.launches += 1
        return lid

    def seal(self, at_ns: int) -> None:
        """Collection stopped at `at_ns` (CUPTI's clock) while the workload may run on (the collector
        abandons a workload stuck in its callbacks and writes the trace from another thread): kernel
        records that arrive later for kernels that started after it, which the hook no longer saw, are
        left out of the trace and counted, not written as launches without arguments."""
        self._sealed_at = int(at_ns)

    def close_window(self, launch_id: int, lo: int, hi: int) -> None:
        """Full mode: records whose start lies in [lo, hi] belong to this launch."""
        if hi < lo:
            lo, hi = hi, lo
        if self._windows and lo < self._windows[-1][0]:
            bisect.insort(self._windows, (lo, hi, launch_id))
        else:
            self._windows.append((lo, hi, launch_id))
        self._window_hi = max(self._window_hi, hi)

    def add_records(self, recs: Iterable[KernelRec | MemRec | UMRec], now: float = 0.0) -> None:
        mems = []
        for r in recs:
            if isinstance(r, KernelRec):
                self._add_kernel(r, now)
            elif isinstance(r, MemRec):
                mems.append(r)
            elif isinstance(r, UMRec):
                self._um_pending.append(r)
            else:
                self.stats.ignored_records += 1
        mems.sort(key=lambda m: (m.timestamp, m.correlation_id))
        for m in mems:
            self._add_memory(m)

    def _add_kernel(self, k: KernelRec, now: float) -> None:
        self.stats.kernel_records += 1
        lid = self._by_corr.get(k.correlation_id)
        if lid is not None and lid in self._launches and self._launches[lid].kernel is None:
            self._launches[lid].kernel = k
            return
        if self._sealed_at is not None and k.start > self._sealed_at:
            self.stats.kernels_after_stop += 1
            return
        # A kernel the hook did not see (a graph node, an unhooked launch API, no hook at all).
        lid = self._next_id
        self._next_id += 1
        self._launches[lid] = _Launch(None, k, now)
        self.stats.launches += 1
        self.stats.launches_without_args += 1
        bisect.insort(self._corr_sorted, k.correlation_id)

    def _launches_before(self, corr: int, ts: int) -> int:
        if corr > 0 and self._corr_sorted:
            return bisect.bisect_left(self._corr_sorted, corr)
        return bisect.bisect_left(self._host_sorted, ts)

    def _add_memory(self, m: MemRec) -> None:
        kind = ALLOC_KIND_OF_MEMORY.get(m.memory_kind)
        if kind is None:
            self.stats.ignored_records += 1
            return
        n_before = self._launches_before(m.correlation_id, m.timestamp)
        if m.op == MEMORY_OP_ALLOCATION:
            if m.bytes <= 0:
                self.stats.ignored_records += 1
                return
            old = self._live.pop(m.address, None)
            if old is not None:  # its release was lost: it ended before this one began
                self._emit_alloc(old, n_before - 1, None)
            self._live[m.address] = _Alloc(self._next_alloc, m.address, m.bytes, kind, m.device, n_before,
                                           m.timestamp or None)
            self._next_alloc += 1
        elif m.op == MEMORY_OP_RELEASE:
            a = self._live.pop(m.address, None)
            if a is None:
                self.stats.releases_without_allocation += 1
                return
            self._emit_alloc(a, n_before - 1, m.timestamp or None)
        else:
            self.stats.ignored_records += 1

    def live_bytes(self, kind: str = "managed") -> int:
        return sum(a.bytes for a in self._live.values() if a.kind == kind)

    def live_ranges(self, kind: str = "managed") -> list[tuple[int, int]]:
        return [(a.address, a.bytes) for a in self._live.values() if a.kind == kind]

    # -- outputs --
    def _row(self, table: str, row: dict) -> None:
        cols = self._out.setdefault(table, {})
        if not cols:
            for f in T.SCHEMAS[table].names:
                cols[f] = []
        for f, lst in cols.items():
            lst.append(row.get(f))

    def _emit_alloc(self, a: _Alloc, last: int | None, free_ns: int | None) -> None:
        if last is not None and last < a.first_launch:
            # Made and freed with no launch in between: live for no launch (and a
            # last_launch of -1 would read like null to some readers). Counted, not written.
            self.stats.allocations_never_live += 1
            return
        self.stats.allocations += 1
        self._row(T.ALLOCATIONS, {T.ALLOC_ID: a.alloc_id, T.ADDRESS: a.address, T.BYTES: a.bytes, T.KIND: a.kind,
                                  T.DEVICE: a.device, T.FIRST_LAUNCH: a.first_launch, T.LAST_LAUNCH: last,
                                  T.ALLOC_NS: a.alloc_ns, T.FREE_NS: free_ns})

    def _emit_launches(self, now: float, final: bool) -> None:
        while self._next_emit in self._launches:
            L = self._launches[self._next_emit]
            if L.kernel is None and not final and now - L.added < self.launch_timeout_s:
                break
            del self._launches[self._next_emit]
            k, a = L.kernel, L.args
            if a is not None:
                row = a.to_row(self._next_emit, start_ns=k.start if k else None, end_ns=k.end if k else None)
                if k is not None:
                    row[T.STREAM] = k.stream_id
                    row[T.DEVICE] = k.device
                    if k.name != a.kernel:  # the hook's name is kept (the replay sees the same one)
                        self.stats.kernel_name_mismatches += 1
                else:
                    self.stats.launches_without_kernel_record += 1
            else:
                row = {T.LAUNCH_ID: self._next_emit, T.KERNEL: k.name, T.DEVICE: k.device, T.STREAM: k.stream_id,
                       T.GRID_X: k.grid[0], T.GRID_Y: k.grid[1], T.GRID_Z: k.grid[2],
                       T.BLOCK_X: k.block[0], T.BLOCK_Y: k.block[1], T.BLOCK_Z: k.block[2],
                       T.SHARED_MEM_BYTES: k.shared_mem, T.START_NS: k.start, T.END_NS: k.end,
                       T.PARAM_OFFSETS: [], T.PARAM_SIZES: [], T.PARAM_DATA: b""}
            for c in T.GRID_COLUMNS:  # a zero dimension means "not reported"; the format wants >= 1
                row[c] = max(1, int(row[c]))
            self._row(T.LAUNCHES, row)
            self._next_emit += 1

    def _emit_um(self, final: bool) -> None:
        if not self._um_pending:
            return
        if self.mode == "full" and not final:
            ready = [r for r in self._um_pending if r.start <= self._window_hi]
            self._um_pending = [r for r in self._um_pending if r.start > self._window_hi]
        else:
            ready, self._um_pending = self._um_pending, []
        if not ready:
            return
        lids = (attribute([r.start for r in ready], self._windows) if self.mode == "full"
                else [None] * len(ready))
        ps = self.page_size
        for r, lid in zip(ready, lids):
            ck = r.counter_kind
            if ck == UM_GPU_PAGE_FAULT:
                self.stats.faults += 1
                self.stats.fault_count += max(1, r.value)
                if lid is None:
                    self.stats.unattributed_faults += 1
                self._row(T.FAULTS, {T.TIME_NS: r.start, T.ADDRESS: r.address - r.address % ps,
                                     T.COUNT: max(1, min(r.value, 2**31 - 1)),
                                     T.ACCESS: ACCESS_OF_FLAGS.get(r.flags, "unknown"),
                                     T.DEVICE: r.src_id, T.LAUNCH_ID: lid})
            elif ck in DIRECTION_OF_COUNTER:
                if r.value <= 0:
                    continue
                self.stats.migrations += 1
                self._row(T.MIGRATIONS, {T.START_NS: r.start, T.END_NS: max(r.end, r.start), T.ADDRESS: r.address,
                                         T.BYTES: r.value, T.DIRECTION: DIRECTION_OF_COUNTER[ck],
                                         T.CAUSE: CAUSE_OF_FLAGS.get(r.flags, "unknown"), T.LAUNCH_ID: lid})
            elif ck in EVENT_OF_COUNTER:
                self.stats.uvm_events += 1
                self._row(T.UVM_EVENTS, {T.TIME_NS: r.start, T.EVENT: EVENT_OF_COUNTER[ck], T.ADDRESS: r.address,
                                         T.VALUE: r.value, T.DEVICE: r.src_id, T.LAUNCH_ID: lid})
            else:
                self.stats.ignored_records += 1

    def drain(self, now: float = 0.0, *, final: bool = False) -> dict[str, dict[str, list]]:
        """Rows that are final now, per table (columns as lists). `final` releases everything."""
        self._emit_launches(now, final)
        self._emit_um(final)
        if final:
            for a in sorted(self._live.values(), key=lambda a: a.alloc_id):
                self._emit_alloc(a, None, None)
            self._live.clear()
        out, self._out = self._out, {}
        return out
