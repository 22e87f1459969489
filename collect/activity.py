"""Where activity records come from: CUPTI's activity API, behind a small interface.

An `ActivitySource` delivers lists of record snapshots (collect.convert) to
the `on_records` function given to `start`, from whatever thread it likes;
`flush(force)` makes it deliver what it holds now (synchronously for CUPTI:
`activity_flush_all` calls `buffer_completed` before it returns), `stop()`
ends it, `dropped()` counts records lost so far. The collector drives the real
CUPTI source and test stand-ins through exactly the same calls.
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable, Protocol

from . import convert as C

OnRecords = Callable[[list], None]


class ActivitySource(Protocol):
    info: dict[str, Any]

    def start(self, on_records: OnRecords) -> None: ...

    def flush(self, force: bool = False) -> None: ...

    def stop(self) -> None: ...

    def dropped(self) -> int: ...


# CUPTI result codes that mean unified-memory profiling is unavailable here
_UM_UNSUPPORTED = {27, 28, 29, 30, 31}


class CuptiActivitySource:
    """CONCURRENT_KERNEL, MEMORY2 and UNIFIED_MEMORY_COUNTER records from CUPTI.

    The unified-memory counters are configured before they are enabled (every
    element of the config array set: scope, device, enable, kind). If the
    device or setup does not support them (CUPTI errors 27-31), collection goes
    on without faults and migrations and `info["uvm_counters"]` says why.
    """

    BUFFER_BYTES = 8 << 20

    def __init__(self, *, device: int = 0, counters: tuple[int, ...] = C.UM_COUNTER_KINDS) -> None:
        self.device = device
        self.counters = counters
        self.info: dict[str, Any] = {"source": "cupti", "uvm_counters": None}
        self._on_records: OnRecords | None = None
        self._dropped = 0
        self._enabled: list[int] = []
        self.callback_errors = 0
        self.last_callback_error: str | None = None

    def _buffer_requested(self):
        return self.BUFFER_BYTES, 0

    def _buffer_completed(self, activities) -> None:
        try:
            recs = C.snapshots(activities)  # read every field inside the callback
            if recs and self._on_records is not None:
                self._on_records(recs)
        except Exception as e:  # never raise into CUPTI
            self.callback_errors += 1
            self.last_callback_error = f"{type(e).__name__}: {e}"

    def start(self, on_records: OnRecords) -> None:
        from cupti import cupti

        self._on_records = on_records
        cupti.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
        for kind in (cupti.ActivityKind.CONCURRENT_KERNEL, cupti.ActivityKind.MEMORY2):
            cupti.activity_enable(kind)
            self._enabled.append(int(kind))
        n = len(self.counters)
        cfg = cupti.ActivityUnifiedMemoryCounterConfig(n)
        for i, kind in enumerate(self.counters):
            cfg[i].scope = int(cupti.ActivityUnifiedMemoryCounterScope.PROCESS_SINGLE_DEVICE)
            cfg[i].device_id = self.device
            cfg[i].enable = 1
            cfg[i].kind = int(kind)
        try:
            cupti.activity_configure_unified_memory_counter(cfg.ptr, n)
            cupti.activity_enable(cupti.ActivityKind.UNIFIED_MEMORY_COUNTER)
            self._enabled.append(int(cupti.ActivityKind.UNIFIED_MEMORY_COUNTER))
            self.info["uvm_counters"] = True
        except cupti.cuptiError as e:
            status = int(getattr(e, "status", -1))
            if status not in _UM_UNSUPPORTED:
                raise
            self.info["uvm_counters"] = False
            self.info["uvm_counters_error"] = f"CUPTI error {status}: unified-memory profiling is not supported here"
        self._keep = cfg

    def flush(self, force: bool = False) -> None:
        from cupti import cupti

        cupti.activity_flush_all(1 if force else 0)

    def dropped(self) -> int:
        from cupti import cupti

        n = ctypes.c_size_t(0)
        try:
            cupti.activity_get_num_dropped_records(0, 0, ctypes.addressof(n))
        except Exception:
            return self._dropped
        self._dropped += int(n.value)  # CUPTI counts since the previous call
        return self._dropped

    def stop(self) -> None:
        from cupti import cupti

        for kind in reversed(self._enabled):
            try:
                cupti.activity_disable(kind)
            except Exception:
                pass
        self._enabled = []
