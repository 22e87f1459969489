"""CUPTI's unified-memory counters and kernel times: `UvmMonitor` and its cupti-python implementation.

`CuptiMonitor` counts GPU page faults and migrated bytes (activity kind
UNIFIED_MEMORY_COUNTER) and records kernel times (CONCURRENT_KERNEL), on
cupti-python (`from cupti import cupti`, imported on first use: the `gpu`
extra); docs/uvm-facts.md, "CUPTI", lists the kinds and fields it reads.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Protocol

from pagecast.errors import NoGPUError

from pagecast.collect.activity import configure_um_counters, cupti_dropped_records, init_driver

from .driver import _first

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
    dropped: int = 0                # records lost: decode_errors + cupti_dropped
    decode_errors: int = 0          # records that arrived but could not be read
    cupti_dropped: int = 0          # records CUPTI dropped (its buffers were full)
    not_kept: int = 0               # raw records past MAX_KEPT: counted above, missing from the lists
    incomplete: int = 0             # records delivered before CUPTI had their times (start = 0 or end < start)
    # raw records, kept only when asked (feedback, footprint estimate)
    fault_records: list = field(default_factory=list)      # (time_ns, address, count)
    htod_records: list = field(default_factory=list)       # (start_ns, end_ns, address, bytes, cause)
    dtoh_records: list = field(default_factory=list)       # (start_ns, end_ns, address, bytes, cause)
    kernel_records: list = field(default_factory=list)     # (start_ns, end_ns, correlation_id, name)
    _first_ns: int | None = None
    _last_ns: int | None = None


class UvmMonitor(Protocol):
    def start(self, keep_records: bool = False, live: bool = False, flush_every_s: float | None = None) -> None: ...
    def poll(self, force: bool = False) -> UvmCounts: ...   # flush what CUPTI has, return the running totals
    def take(self) -> tuple[list, list]: ...  # (fault records, kernel records) kept since the last take
    def take_migrations(self) -> list: ...  # [(start_ns, +1 htod | -1 dtoh, address, bytes, cause)] since the last call
    def stop(self) -> UvmCounts: ...


MAX_KEPT = 2_000_000  # raw records kept per kind (counts stay exact beyond it)
_CAUSES = {0: "unknown", 1: "user", 2: "coherence", 3: "prefetch", 4: "eviction", 5: "access_counters"}


def _timed(kind: str, rec: dict) -> bool:
    """Whether a record carries its times. A forced flush (activity_flush_all(1)) also hands over
    kernel records CUPTI has not finished, with start = end = 0 (docs/uvm-facts.md, "CUPTI"); a
    unified-memory record's `end` is not always set (thrashing), so only its start is required."""
    start = int(rec.get("start", 0))
    if kind == "kernel":
        return start > 0 and int(rec.get("end", 0)) >= start
    return start > 0


def _add_record(c: UvmCounts, kind: str, rec: dict, keep: bool) -> None:
    """Fold one decoded CUPTI record into the running counts (pure: shared by the real and fake monitors).

    A record without its times is counted in `incomplete`: a kernel's is dropped (its zero start
    would stretch the GPU span to the clock's epoch, about 1.7e9 s, and it would take the faults of
    every kernel after it; CUPTI never delivers the same record again), a unified-memory record's
    value still counts in the totals but it is not kept for attribution by time."""
    if not _timed(kind, rec):
        c.incomplete += 1
        if kind == "kernel":
            return
        keep = False
    if kind == "fault":
        c.faults += int(rec["value"])
        c.fault_groups += 1
        if keep and len(c.fault_records) < MAX_KEPT:
            c.fault_records.append((int(rec["start"]), int(rec["address"]), int(rec["value"])))
        elif keep:
            c.not_kept += 1
    elif kind in ("htod", "dtoh"):
        cause = _CAUSES.get(int(rec.get("flags", 0)), "unknown")
        n = int(rec["value"])
        if kind == "htod":
            c.htod_bytes += n
            c.htod_by_cause[cause] = c.htod_by_cause.get(cause, 0) + n
            if keep and len(c.htod_records) < MAX_KEPT:
                c.htod_records.append((int(rec["start"]), int(rec["end"]), int(rec["address"]), n, cause))
            elif keep:
                c.not_kept += 1
        else:
            c.dtoh_bytes += n
            c.dtoh_by_cause[cause] = c.dtoh_by_cause.get(cause, 0) + n
            if keep and len(c.dtoh_records) < MAX_KEPT:
                c.dtoh_records.append((int(rec["start"]), int(rec["end"]), int(rec["address"]), n, cause))
            elif keep:
                c.not_kept += 1
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
        elif keep:
            c.not_kept += 1


class CuptiMonitor:
    """GPU page faults, migrated bytes and kernel times from CUPTI activity records.

    Uses activity kinds UNIFIED_MEMORY_COUNTER (25) and CONCURRENT_KERNEL (10)
    (docs/uvm-facts.md). Records are delivered in buffers, asynchronously: `poll()`
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
        self._moved_taken = (0, 0)
        self.flush_every_s = self.FLUSH_EVERY_S
        self.refused_kinds: dict[int, int] = {}   # counter kind -> CUPTI's status, for kinds it refused

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
                    self._counts.decode_errors += 1
                    self._counts.dropped += 1

    def start(self, keep_records: bool = False, live: bool = False, flush_every_s: float | None = None) -> None:
        """Start counting. keep_records: keep the raw records too (timeline, feedback, the capacity
        ledger); live: also flush every `flush_every_s` (default FLUSH_EVERY_S) from a thread, so
        records arrive during the run (feedback, the ledger: cuda_engine.py)."""
        c = self._c
        self.flush_every_s = flush_every_s or self.FLUSH_EVERY_S
        self._moved_taken = (0, 0)
        UM = c.ActivityUnifiedMemoryCounterKind
        self._keep = keep_records
        self._counts = UvmCounts()
        self._taken = (0, 0)
        init_driver()   # before the counters: CUPTI answers NOT_READY otherwise; no context yet
        try:
            kinds = [UM.BYTES_TRANSFER_HTOD, UM.BYTES_TRANSFER_DTOH, UM.GPU_PAGE_FAULT, UM.THRASHING]
            # each kind the machine supports (one unsupported kind must not take the faults with it)
            setup = configure_um_counters(c, kinds, self.device)
            self.refused_kinds = dict(setup.refused)
            if int(UM.GPU_PAGE_FAULT) not in setup.enabled:
                raise RuntimeError(f"the GPU page-fault counter was refused ({setup.describe()})")
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

    def poll(self, force: bool = False) -> UvmCounts:
        """Flush what CUPTI holds and return the running totals (not from inside a CUPTI callback).

        By default only buffers whose records are all complete are delivered (flag 0); `force`
        delivers every buffer (flag 1), which may hold unfinished records: only once the GPU is
        idle (after a synchronize) does a forced flush lose nothing."""
        if self._started:
            self._c.activity_flush_all(1 if force else 0)
            self._count_cupti_dropped()
        with self._lock:
            return self._counts

    def _count_cupti_dropped(self) -> None:
        """Add the records CUPTI dropped since the last call (buffers full) to the losses."""
        try:
            n = cupti_dropped_records(self._c)
        except Exception:  # noqa: BLE001 - the count is a report, not a reason to fail the run
            return
        with self._lock:
            self._counts.cupti_dropped += n
            self._counts.dropped += n

    def take(self) -> tuple[list, list]:
        """The fault and kernel records kept (keep_records) since the last take."""
        with self._lock:
            c = self._counts
            f, k = c.fault_records[self._taken[0]:], c.kernel_records[self._taken[1]:]
            self._taken = (len(c.fault_records), len(c.kernel_records))
        return f, k

    def take_migrations(self) -> list:
        """The host-to-device and device-to-host migrations kept (keep_records) since the last call,
        as (start_ns, +1 | -1, address, bytes, cause), in time order (the capacity ledger's input)."""
        with self._lock:
            c = self._counts
            h, d = c.htod_records[self._moved_taken[0]:], c.dtoh_records[self._moved_taken[1]:]
            self._moved_taken = (len(c.htod_records), len(c.dtoh_records))
        out = [(r[0], 1, r[2], r[3], r[4]) for r in h] + [(r[0], -1, r[2], r[3], r[4]) for r in d]
        out.sort(key=lambda r: r[0])
        return out

    def _flusher(self) -> None:
        # records arrive in buffers; with `live` (feedback) they are wanted during the run,
        # so flush from this thread: flushing inside a launch callback could re-enter CUPTI
        # The default flush (flag 0) delivers only buffers whose records are all complete; a forced
        # one here would hand over kernels still running, with start = end = 0.
        while not self._stop_flush.wait(self.flush_every_s):
            try:
                self._c.activity_flush_all(0)
            except Exception:  # noqa: BLE001
                pass

    def stop(self) -> UvmCounts:
        """Stop counting: a forced flush of what is left (call it after a synchronize, so that
        every record is complete; one that is not is counted in `incomplete` and dropped)."""
        if not self._started:
            return self._counts
        c = self._c
        if self._flush_thread is not None:
            self._stop_flush.set()
            self._flush_thread.join(timeout=5)
            self._flush_thread = None
        c.activity_flush_all(1)
        self._count_cupti_dropped()
        for k in self._kinds:
            try:
                c.activity_disable(k)
            except Exception:  # noqa: BLE001
                pass
        self._started = False
        with self._lock:
            return self._counts
