"""Host time of the GPU runner's launch callback, timed launch by launch and fitted by kind.

What the simulator's planned `runner` charges a callback (policies/runner.py, online/callbacks.py)
depends on what the callback does: nothing due (a quiet launch: counted and returned), only its
stream's wait (a light launch), or calls that move memory (a base plus a cost per call). Both
`pagecast calibrate` (calibrate.py, on this machine's driver) and benchmarks/bench_child_callback.py
(the child's own code with a CUDA stand-in) measure those costs the same way, here:

- `CountingCuda` wraps a `CudaIface` (driver.py's, or a stand-in) and counts, as the driver takes
  them (a refused call is not counted), the ranges moved (each `cuMemPrefetchAsync`, each range of
  a batched call) and the events (records and stream waits);
- `time_callbacks` calls the callback on each launch and records its host time, the ranges and
  the events it issued;
- `fit_callbacks` splits the launches into those with no range and no event (quiet), no range but
  an event (light) and the others, and fits the others' time as base + per call x ranges: the
  least-squares line, and the line through the medians per range count, each count weighted by
  its launches (robust to the rare slow callback a loaded host gives).
"""

from __future__ import annotations

import bisect
import gc
import struct
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np

from pagecast import trace as T
from pagecast.collect.launch_hook import LaunchArgs


class CountingCuda:
    """`cuda` with its calls that move memory (`calls`: ranges) and its events (`events`) counted."""

    def __init__(self, cuda) -> None:
        self._cuda = cuda
        self.calls = 0
        self.events = 0

    def __getattr__(self, name):   # everything else is the wrapped driver's
        return getattr(self._cuda, name)

    def prefetch_to_gpu(self, addr, nbytes, stream=0):
        r = self._cuda.prefetch_to_gpu(addr, nbytes, stream)
        self.calls += 1   # counted once the driver took it (a refused call raises)
        return r

    def prefetch_to_host(self, addr, nbytes, stream=0):
        r = self._cuda.prefetch_to_host(addr, nbytes, stream)
        self.calls += 1   # counted once the driver took it (a refused call raises)
        return r

    def prefetch_batch(self, ranges, to_gpu, stream=0):
        r = self._cuda.prefetch_batch(ranges, to_gpu, stream)
        self.calls += len(ranges)
        return r

    def discard_batch(self, ranges, stream=0):
        r = self._cuda.discard_batch(ranges, stream)
        self.calls += len(ranges)
        return r

    def discard_and_prefetch_batch(self, ranges, to_gpu, stream=0):
        r = self._cuda.discard_and_prefetch_batch(ranges, to_gpu, stream)
        self.calls += len(ranges)
        return r

    def record_event(self, event, stream=0):
        r = self._cuda.record_event(event, stream)
        self.events += 1
        return r

    def stream_wait_event(self, stream, event):
        r = self._cuda.stream_wait_event(stream, event)
        self.events += 1
        return r


@dataclass
class CallbackTimes:
    """Per launch: host seconds of its callback, ranges moved and events issued there."""

    seconds: list = field(default_factory=list)
    calls: list = field(default_factory=list)
    events: list = field(default_factory=list)

    def extend(self, other: "CallbackTimes") -> None:
        self.seconds += other.seconds
        self.calls += other.calls
        self.events += other.events


def time_callbacks(on_launch: Callable, launches: Iterable, cuda: CountingCuda,
                   out: CallbackTimes | None = None) -> CallbackTimes:
    """Call `on_launch(la)` for each launch, timing each call (the collector off meanwhile);
    `cuda` is the `CountingCuda` the callback issues its calls through."""
    out = CallbackTimes() if out is None else out
    clock = time.perf_counter
    secs, calls, events = out.seconds, out.calls, out.events
    gc.collect()
    gc.disable()
    try:
        for la in launches:
            c0, e0 = cuda.calls, cuda.events
            t0 = clock()
            on_launch(la)
            secs.append(clock() - t0)
            calls.append(cuda.calls - c0)
            events.append(cuda.events - e0)
    finally:
        gc.enable()
    return out


@dataclass(frozen=True)
class CallbackFit:
    """The callbacks' host time by kind (seconds; None where no launch was of that kind)."""

    quiet_n: int                       # launches with no range and no event
    quiet_s: float | None              # ... their median
    wait_n: int                        # launches with no range but an event (a stream wait)
    wait_s: float | None               # ... their median
    calls_n: int                       # launches with ranges
    lsq_base_s: float | None = None    # their time = base + per call x ranges, least squares
    lsq_per_call_s: float | None = None
    median_base_s: float | None = None     # ... the line through the medians per range count
    median_per_call_s: float | None = None
    calls_mean: float | None = None    # ranges per launch with ranges
    by_calls: dict = field(default_factory=dict)   # ranges -> (launches, median seconds)


def fit_callbacks(times: CallbackTimes) -> CallbackFit:
    """`times` split by kind and fitted (the module doc)."""
    t = np.asarray(times.seconds, np.float64)
    c = np.asarray(times.calls, np.float64)
    e = np.asarray(times.events, np.float64)
    idle = (c == 0) & (e == 0)
    light = (c == 0) & (e > 0)
    quiet = float(np.median(t[idle])) if idle.any() else None
    wait = float(np.median(t[light])) if light.any() else None
    t, c = t[c > 0], c[c > 0]
    if len(t) == 0:
        return CallbackFit(int(idle.sum()), quiet, int(light.sum()), wait, 0)
    if np.ptp(c) > 0:
        per_call, base = (float(x) for x in np.polyfit(c, t, 1))
    else:
        per_call, base = 0.0, float(np.mean(t))
    by = {int(k): (int((c == k).sum()), float(np.median(t[c == k]))) for k in np.unique(c)}
    ks = np.array(sorted(by), np.float64)
    med = np.array([by[int(k)][1] for k in ks])
    wts = np.array([by[int(k)][0] for k in ks], np.float64)
    if len(ks) > 1:
        m_call, m_base = (float(x) for x in np.polyfit(ks, med, 1, w=np.sqrt(wts)))
    else:
        m_call, m_base = 0.0, float(med[0])
    return CallbackFit(int(idle.sum()), quiet, int(light.sum()), wait, len(t), base, per_call, m_base, m_call,
                       float(c.mean()), by)


def trace_launches(trace, moved: dict[int, int], stream: int = 0) -> list[LaunchArgs]:
    """The trace's launches as the launch hook hands them over, each 8-byte argument that points
    into a trace allocation moved to that allocation's new base (`moved`: trace base -> base in
    this run; allocations not in it keep their addresses), on `stream`."""
    al = trace.allocations
    spans = sorted((int(a), int(a) + int(n), int(moved.get(int(a), a)))
                   for a, n in zip(al.column(T.ADDRESS).to_pylist(), al.column(T.BYTES).to_pylist()))
    starts = [s for s, _, _ in spans]
    cols = {c: trace.launches.column(c).to_pylist() for c in (
        T.KERNEL, T.GRID_X, T.GRID_Y, T.GRID_Z, T.BLOCK_X, T.BLOCK_Y, T.BLOCK_Z, T.SHARED_MEM_BYTES,
        T.PARAM_OFFSETS, T.PARAM_SIZES, T.PARAM_DATA)}
    out = []
    for i in range(trace.n_launches):
        data = bytearray(cols[T.PARAM_DATA][i] or b"")
        for off, size in zip(cols[T.PARAM_OFFSETS][i], cols[T.PARAM_SIZES][i]):
            if size == 8:
                (w,) = struct.unpack_from("<Q", data, off)
                k = bisect.bisect_right(starts, w) - 1
                if k >= 0 and w < spans[k][1]:
                    struct.pack_into("<Q", data, off, spans[k][2] + (w - spans[k][0]))
        out.append(LaunchArgs(kernel=cols[T.KERNEL][i], function=0, grid_x=cols[T.GRID_X][i],
                              grid_y=cols[T.GRID_Y][i], grid_z=cols[T.GRID_Z][i], block_x=cols[T.BLOCK_X][i],
                              block_y=cols[T.BLOCK_Y][i], block_z=cols[T.BLOCK_Z][i],
                              shared_mem_bytes=cols[T.SHARED_MEM_BYTES][i], stream=stream, correlation_id=i,
                              param_offsets=tuple(cols[T.PARAM_OFFSETS][i]),
                              param_sizes=tuple(cols[T.PARAM_SIZES][i]), param_data=bytes(data), cbid=0))
    return out
