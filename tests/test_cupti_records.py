"""The GPU runner's CUPTI monitor on activity buffers laid out as CUPTI lays them out.

Each buffer is a byte array holding records back to back in cupti-python's own
record layouts (`activity_kernel*_dtype`, `activity_unified_memory_counter3_dtype`:
the C structs CUPTI writes), and every record is read through cupti-python's
record classes (`from_ptr`), as cupti-python hands a completed buffer to the
monitor. cupti-python is in the `test` extra, so this runs on any CPU machine.

What is checked: a kernel record delivered unfinished (start = end = 0, as a
forced flush can deliver it) neither stretches the GPU span nor takes the
faults of the kernels after it; the monitor's periodic flush never forces.
"""

from __future__ import annotations

import ctypes
import re
import threading

import numpy as np
import pytest

from pagecast.replay.gpu import child as CH
from pagecast.replay.gpu.cupti_monitor import CuptiMonitor

cupti = pytest.importorskip("cupti.cupti", reason="cupti-python is in the test extra")

KERNEL_CLASSES = sorted((n for n in dir(cupti) if re.fullmatch(r"ActivityKernel\d+", n)),
                        key=lambda n: int(n[len("ActivityKernel"):]))
T0 = 1_700_000_000_000_000_000   # CUPTI's clock: ns since the epoch, about 1.7e18


def _dtype_of(cls_name: str) -> np.dtype:
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", cls_name).lower()           # ActivityKernel10 -> activity_kernel10
    snake = re.sub(r"_(\d+)$", r"\1", snake)
    return getattr(cupti, snake.replace("kernel_", "kernel") + "_dtype")


class Buffer:
    """Records packed back to back in one byte buffer, each in its C layout (CUPTI's activity buffer)."""

    def __init__(self) -> None:
        self.parts: list[tuple[str, np.ndarray]] = []
        self.names: list = []            # the kernel names' C strings, kept alive

    def kernel(self, cls_name: str, start: int, end: int, corr: int, name: str) -> None:
        r = np.zeros(1, dtype=_dtype_of(cls_name))
        s = ctypes.create_string_buffer(name.encode())
        self.names.append(s)
        r["kind"], r["start"], r["end"] = int(cupti.ActivityKind.CONCURRENT_KERNEL), start, end
        r["correlation_id"], r["name"] = corr, ctypes.addressof(s)
        self.parts.append((cls_name, r))

    def um(self, counter_kind, value: int, start: int, end: int, address: int, flags: int = 0) -> None:
        r = np.zeros(1, dtype=cupti.activity_unified_memory_counter3_dtype)
        r["kind"], r["counter_kind"] = int(cupti.ActivityKind.UNIFIED_MEMORY_COUNTER), int(counter_kind)
        r["value"], r["start"], r["end"], r["address"], r["flags_"] = value, start, end, address, flags
        self.parts.append(("ActivityUnifiedMemoryCounter3", r))

    def records(self):
        """(the buffer, cupti-python's record objects pointing into it)."""
        raw = np.frombuffer(b"".join(r.tobytes() for _, r in self.parts), dtype=np.uint8).copy()
        objs, off = [], 0
        for cls_name, r in self.parts:
            objs.append(getattr(cupti, cls_name).from_ptr(raw.ctypes.data + off, owner=raw))
            off += r.dtype.itemsize
        return raw, objs


def test_the_record_layouts_are_cuptis():
    assert KERNEL_CLASSES, "cupti-python has no ActivityKernel record class"
    for n in KERNEL_CLASSES:
        names = _dtype_of(n).names
        assert {"kind", "start", "end", "correlation_id", "name"} <= set(names), n
    um = cupti.activity_unified_memory_counter3_dtype.names
    assert {"kind", "counter_kind", "value", "start", "end", "address", "flags_"} <= set(um)


@pytest.mark.parametrize("kernel_cls", KERNEL_CLASSES)
def test_an_unfinished_kernel_record_breaks_neither_the_span_nor_the_attribution(kernel_cls):
    UM = cupti.ActivityUnifiedMemoryCounterKind
    b = Buffer()
    b.kernel(kernel_cls, T0 + 1000, T0 + 2000, 7, "first")
    b.um(UM.GPU_PAGE_FAULT, 3, T0 + 1500, T0 + 1500, 1 << 40)
    b.kernel(kernel_cls, 0, 0, 8, "unfinished")                       # what a forced flush can deliver
    b.kernel(kernel_cls, T0 + 3000, T0 + 5000, 9, "last")
    b.um(UM.GPU_PAGE_FAULT, 2, T0 + 4000, T0 + 4000, 1 << 40)
    b.um(UM.BYTES_TRANSFER_HTOD, 65536, T0 + 1200, T0 + 1300, 1 << 40, flags=2)
    b.um(UM.GPU_PAGE_FAULT, 5, 0, 0, 1 << 40)                        # a fault record without its time
    raw, objs = b.records()

    m = CuptiMonitor(0)
    m._keep = True
    m._completed(objs)
    raw[:] = 0                       # CUPTI reuses the buffer once the callback returns
    c = m.poll()
    assert c.dropped == 0 and c.incomplete == 2
    assert c.kernels == 2 and [k[2] for k in c.kernel_records] == [7, 9]
    assert [k[3] for k in c.kernel_records] == ["first", "last"]
    assert c.gpu_span_s == pytest.approx(4000e-9) and c.kernel_busy_s == pytest.approx(3000e-9)
    assert c.faults == 10 and c.fault_records == [(T0 + 1500, 1 << 40, 3), (T0 + 4000, 1 << 40, 2)]
    tl = CH.build_timeline(c, {7: 0, 9: 1})
    assert tl["kernel"] == ["first", "last"] and tl["faults"] == [3, 2] and tl["htod_bytes"] == [65536, 0]
    assert tl["start_s"] == [0.0, pytest.approx(2e-6)] and max(tl["end_s"]) < 1e-5


class _FlushSpy:
    """Stands in for cupti-python's module where only activity_flush_all is called."""

    def __init__(self) -> None:
        self.flags: list[int] = []
        self.seen = threading.Event()

    def activity_flush_all(self, flag: int) -> None:
        self.flags.append(int(flag))
        if len(self.flags) >= 3:
            self.seen.set()

    def activity_disable(self, kind: int) -> None:
        pass


def test_the_periodic_flush_never_forces_and_stop_does():
    m = CuptiMonitor(0)
    spy = _FlushSpy()
    m._c, m._started, m.FLUSH_EVERY_S = spy, True, 0.001
    m._flush_thread = threading.Thread(target=m._flusher, daemon=True)
    m._flush_thread.start()
    assert spy.seen.wait(5)
    m.poll()
    m.stop()
    assert spy.flags[-1] == 1 and set(spy.flags[:-1]) == {0}
