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
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from . import convert as C

OnRecords = Callable[[list], None]


class ActivitySource(Protocol):
    info: dict[str, Any]

    def start(self, on_records: OnRecords) -> None: ...

    def flush(self, force: bool = False) -> None: ...

    def stop(self) -> None: ...

    def dropped(self) -> int: ...


@dataclass
class UmCounterSetup:
    """What `configure_um_counters` got: the kinds configured, and CUPTI's status for each refused one."""

    enabled: list[int] = field(default_factory=list)
    refused: dict[int, int] = field(default_factory=dict)

    def describe(self) -> str | None:
        if not self.refused:
            return None
        return "; ".join(f"counter kind {k}: CUPTI error {st}" for k, st in sorted(self.refused.items()))


def _status(e: BaseException) -> int:
    return int(getattr(e, "status", -1))


_KEEP: list = []   # configuration arrays CUPTI was given (it may read them later)


def init_driver() -> bool:
    """`cuInit(0)`, which creates no context; whether it succeeded.

    CUPTI answers NOT_READY (13) to enabling the unified-memory counter activity before the
    driver is initialized (seen on an H200: driver 580.159, CUPTI 13.5), while the counters must be
    configured before any context exists. So every user of the counters initializes the driver
    first, alone. Without a driver (CPU machines, stand-in tests) nothing happens here: the CUPTI
    calls that follow report that."""
    try:
        from cuda.bindings import driver as drv
    except ImportError:
        return False
    try:
        err = drv.cuInit(0)
    except Exception:  # noqa: BLE001 - no libcuda: cuda-bindings raises instead of answering
        return False
    err = err[0] if isinstance(err, tuple) else err
    return int(err) == 0


def configure_um_counters(cupti, kinds, device: int) -> UmCounterSetup:
    """Configure CUPTI's unified-memory counters `kinds` for `device`, keeping every kind this
    machine supports.

    One `activity_configure_unified_memory_counter` call with every kind is refused as a whole
    when one kind is unsupported (CUPTI error 30 for a kind that needs P2P, say), and a
    virtualized, MIG, confidential-computing or unprivileged setup answers 33, 35, 40, 41 or 43.
    So: all kinds in one call; if CUPTI refuses, each kind alone, to learn which it takes; then
    the kinds it took, together, in one last call (whether a call adds to the configuration or
    replaces it, the result is the same). A CUPTI error never escapes: a kind it refuses is
    left out, with its status."""
    scope = int(cupti.ActivityUnifiedMemoryCounterScope.PROCESS_SINGLE_DEVICE)

    def call(ks: list[int]) -> None:
        cfg = cupti.ActivityUnifiedMemoryCounterConfig(len(ks))
        for i, kind in enumerate(ks):   # every element set: scope, device, enable, kind
            cfg[i].scope = scope
            cfg[i].device_id = device
            cfg[i].enable = 1
            cfg[i].kind = int(kind)
        _KEEP.append(cfg)
        cupti.activity_configure_unified_memory_counter(cfg.ptr, len(ks))

    kinds = [int(k) for k in kinds]
    try:
        call(kinds)
        return UmCounterSetup(enabled=kinds)
    except cupti.cuptiError:
        pass
    setup = UmCounterSetup()
    for k in kinds:
        try:
            call([k])
            setup.enabled.append(k)
        except cupti.cuptiError as e:
            setup.refused[k] = _status(e)
    if len(setup.enabled) > 1:
        try:
            call(setup.enabled)
        except cupti.cuptiError as e:
            setup.refused.update({k: _status(e) for k in setup.enabled})
            setup.enabled = []
    return setup


def cupti_dropped_records(cupti) -> int:
    """Records CUPTI dropped (its buffers were full) since the previous call, all contexts."""
    n = ctypes.c_size_t(0)
    cupti.activity_get_num_dropped_records(0, 0, ctypes.addressof(n))
    return int(n.value)


class CuptiActivitySource:
    """CONCURRENT_KERNEL, MEMORY2 and UNIFIED_MEMORY_COUNTER records from CUPTI.

    The unified-memory counters are configured before they are enabled, each kind the machine
    supports (`configure_um_counters`). If it supports none (or refuses the activity kind),
    collection goes on without faults and migrations and `info["uvm_counters"]` says why;
    `info["uvm_counters_refused"]` names the kinds left out and CUPTI's status for each.
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
        init_driver()   # before the unified-memory counters (NOT_READY otherwise); no context yet
        cupti.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
        for kind in (cupti.ActivityKind.CONCURRENT_KERNEL, cupti.ActivityKind.MEMORY2):
            cupti.activity_enable(kind)
            self._enabled.append(int(kind))
        setup = configure_um_counters(cupti, self.counters, self.device)
        self.info["uvm_counters_enabled"] = list(setup.enabled)
        if setup.refused:
            self.info["uvm_counters_refused"] = {str(k): v for k, v in sorted(setup.refused.items())}
        if not setup.enabled:
            self.info["uvm_counters"] = False
            self.info["uvm_counters_error"] = f"unified-memory profiling is not available here ({setup.describe()})"
            return
        try:
            cupti.activity_enable(cupti.ActivityKind.UNIFIED_MEMORY_COUNTER)
        except cupti.cuptiError as e:
            self.info["uvm_counters"] = False
            self.info["uvm_counters_error"] = (f"CUPTI error {_status(e)} enabling the unified-memory counters: "
                                               "unified-memory profiling is not available here")
            return
        self._enabled.append(int(cupti.ActivityKind.UNIFIED_MEMORY_COUNTER))
        self.info["uvm_counters"] = True

    def flush(self, force: bool = False) -> None:
        from cupti import cupti

        cupti.activity_flush_all(1 if force else 0)

    def dropped(self) -> int:
        """Records CUPTI dropped so far (its buffers were full)."""
        from cupti import cupti

        try:
            self._dropped += cupti_dropped_records(cupti)  # CUPTI counts since the previous call
        except Exception:
            pass
        return self._dropped

    def stop(self) -> None:
        from cupti import cupti

        for kind in reversed(self._enabled):
            try:
                cupti.activity_disable(kind)
            except Exception:
                pass
        self._enabled = []
