"""The GPU runner's engine: what happens at each kernel launch under a policy.

At each launch (CUPTI API-enter callback, before the kernel is queued) the
`Engine` does what the policy says:

- `demand`: adds nothing (the driver faults pages in);
- `alloc`: prefetches to the GPU the whole managed allocation each pointer
  argument lands in;
- `template`: predicts the launch's footprint from its live arguments with the
  model (`gpu_predict.make_online_predict`) and prefetches the merged
  predicted ranges; with feedback, faults the prediction missed refine the
  model (`gpu_predict.FeedbackLoop`, through `Engine.feedback_from`);
- `oracle`: prefetches the launch's real footprint, read from a matching
  full-mode trace of the same workload and relocated into this run's address
  space (`gpu_oracle.Relocator`).

Prefetches go on the launch's own stream, so they complete before the kernel.

Capacity emulation
------------------
A capacity emulates a smaller GPU without oversubscribing the real one: the
engine keeps a residency estimate (`gpu_residency.Residency`: the bytes it
believes are on the GPU, grouped in 2 MiB units) and, before a launch whose
estimated footprint would not fit, moves victim units to the host
(`cuMemPrefetchAsync` to the CPU) on a side stream. The side stream first
waits for the work already queued on the launch's stream (earlier kernels may
still need the victims), and the launch's stream waits for the eviction before
the kernel, so eviction overlaps population but never a kernel. A launch's
estimated footprint is, in order of preference: the relocated footprint from a
matching trace, the model's prediction, or the whole allocations its pointer
arguments land in; what a policy prefetches is added to it. A launch whose
known footprint is larger than the capacity streams through memory: `template`
and `oracle` prefetch only its first capacity's worth (address order).
Victims: see `gpu_residency`.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from pagecast.errors import UsageError

from .gpu_oracle import Relocator
from .gpu_ranges import UNIT, AllocationMap, allocation_ranges, front, merge_ranges, units_of
from .gpu_residency import FutureNextUse, PeriodDetector, Residency, SequenceNextUse

POLICIES = ("demand", "alloc", "template", "oracle")
VICTIMS = {"demand": "fifo", "alloc": "fifo", "template": "next-use", "oracle": "belady"}
LEGACY_STREAM = 0x1             # CU_STREAM_LEGACY
PER_THREAD_STREAM = 0x2         # CU_STREAM_PER_THREAD
TIMELINE_MAX = 100_000          # launches per run kept in the timeline

_PTSZ: frozenset | None = None


def launch_stream(la) -> int:
    """The CUstream handle a launch runs on, never 0.

    0 in a *_ptsz call is the per-thread default stream, in any other call the
    legacy default stream. Both are named explicitly (CU_STREAM_PER_THREAD,
    CU_STREAM_LEGACY) because what 0 means in the runner's own calls depends on
    how cuda-bindings was set up, not on the launch: with
    CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM=1 it calls the _ptsz entry points
    and 0 is the per-thread stream.
    """
    global _PTSZ
    s = int(la.stream or 0)
    if s == 0:
        if _PTSZ is None:
            try:
                from pagecast.collect.launch_hook import PTSZ_CBIDS
                _PTSZ = frozenset(PTSZ_CBIDS)
            except Exception:  # noqa: BLE001
                _PTSZ = frozenset()
        if int(getattr(la, "cbid", 0) or 0) in _PTSZ:
            return PER_THREAD_STREAM
        return LEGACY_STREAM
    return s


@dataclass
class EngineStats:
    launches: int = 0
    prefetch_bytes: int = 0
    prefetches: int = 0
    evict_bytes: int = 0
    evictions: int = 0
    overflow_launches: int = 0
    predict_s: float = 0.0
    predict_max_s: float = 0.0
    predicted_launches: int = 0
    callback_s: float = 0.0
    errors: int = 0                 # launches whose policy step failed
    failed_calls: int = 0           # prefetch / eviction calls the driver refused (the rest went on)
    last_error: str | None = None
    unseen_kernels: list = field(default_factory=list)
    feedback_updates: int = 0
    period: int | None = None

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["predict_us_mean"] = (1e6 * self.predict_s / self.predicted_launches) if self.predicted_launches else None
        d["predict_us_max"] = 1e6 * self.predict_max_s if self.predicted_launches else None
        return d


class Engine:
    """Applies one policy at each launch: prefetch, and evict to emulate a capacity.

    `on_launch(la)` takes the collector's `LaunchArgs`. `cuda` is a
    `cuda_iface.CudaIface`; `predict(la, allocs) -> [(address, nbytes)]` is the
    online prediction (template policy and the footprint estimate); `relocator`
    a `Relocator` for the oracle; `model_kernels` the kernels the model knows
    (None: do not check).
    """

    def __init__(self, cuda, policy: str, *, capacity: int | None = None,
                 predict: Callable[[Any, AllocationMap], list[tuple[int, int]]] | None = None,
                 relocator: Relocator | None = None, model_kernels: Iterable[str] | None = None,
                 warn: Callable[[str], None] | None = None, unit: int = UNIT) -> None:
        if policy not in POLICIES:
            raise UsageError(f"unknown policy {policy!r} for the GPU backend (choose from {', '.join(POLICIES)})")
        if policy == "template" and predict is None:
            raise UsageError("policy template needs a model (--model MODEL)")
        if policy == "oracle" and relocator is None:
            raise UsageError("policy oracle needs a matching full-mode trace of the workload")
        self.cuda = cuda
        self.policy = policy
        self.capacity = capacity
        self.predict = predict
        self.relocator = relocator
        self.model_kernels = set(model_kernels) if model_kernels is not None else None
        self.warn = warn or (lambda m: None)
        self.unit = unit
        self.allocs = AllocationMap(cuda.allocation_of)
        self.stats = EngineStats()
        self.detector = PeriodDetector()
        self.t = 0
        self.history: deque = deque(maxlen=4096)   # (t, correlation_id, la, predicted ranges)
        self.corr_launch: dict[int, int] = {}       # correlation id -> launch index (timeline), bounded
        self.residency: Residency | None = None
        self._seq_next = SequenceNextUse(self.detector)
        if capacity is not None:
            victim = VICTIMS[policy]
            scorer = None
            if victim == "next-use":
                scorer = self._seq_next
            elif victim == "belady":
                fut = relocator.future_uses(unit)
                scorer = FutureNextUse(fut, lambda u: relocator.origin.get(u, ()))
            self.residency = Residency(capacity, unit, victim, scorer)
        self._evict_stream: int | None = None
        self._evict_event: int | None = None
        self._queued_event: int | None = None
        # launches (and frees) can come from several threads (PyTorch's autograd thread beside the
        # main one): one at a time through the residency estimate and the caches
        self.lock = threading.RLock()

    # -- per launch -----------------------------------------------------------
    def on_free(self, addr: int) -> None:
        """The workload freed the allocation at addr (a cuMemFree / cudaFree callback): drop it
        from the allocation cache and its pages from the residency estimate (they take no room
        now, and evicting them would be refused)."""
        try:
            with self.lock:
                a = self.allocs.cached(int(addr))
                if a is not None and self.residency is not None:
                    self.residency.release([(a.base, a.size)])
                self.allocs.forget(int(addr))
                forget = getattr(self.predict, "forget", None)
                if forget is not None:
                    forget(int(addr))
        except Exception as e:  # noqa: BLE001 - never into the workload's free
            self.stats.errors += 1
            self.stats.last_error = f"on_free: {type(e).__name__}: {e}"

    def on_launch(self, la) -> None:
        t0 = time.perf_counter()
        with self.lock:
            t = self.t
            self.t += 1
            st = self.stats
            st.launches += 1
            try:
                self._launch(t, la)
            except Exception as e:  # noqa: BLE001 - never break the workload's launch
                st.errors += 1
                st.last_error = f"launch {t} ({la.kernel}): {type(e).__name__}: {e}"
            st.callback_s += time.perf_counter() - t0

    def _launch(self, t: int, la) -> None:
        st = self.stats
        kernel = la.kernel
        if self.model_kernels is not None and kernel not in self.model_kernels and kernel not in st.unseen_kernels:
            st.unseen_kernels.append(kernel)
            self.warn(f"kernel {kernel!r} (launch {t}) is not in the model: "
                      "it gets the fallback prediction")
        st.period = self.detector.observe(kernel)
        data = bytes(la.param_data or b"")
        if self.relocator is not None and self.relocator.matching:
            if not self.relocator.observe(t, kernel, data):
                self.warn(f"the run no longer matches the trace ({self.relocator.mismatch});"
                          " the oracle stops prefetching from here")

        predicted: list[tuple[int, int]] | None = None
        if self.predict is not None and (self.policy == "template" or self.residency is not None):
            p0 = time.perf_counter()
            predicted = self.predict(la, self.allocs)
            if not getattr(self.predict, "clipped", False):   # the online predictor's already are
                predicted = self.allocs.clip(predicted)
            dt = time.perf_counter() - p0
            st.predict_s += dt
            st.predict_max_s = max(st.predict_max_s, dt)
            st.predicted_launches += 1

        if self.policy == "alloc":
            prefetch = allocation_ranges(data, self.allocs)
        elif self.policy == "template":
            prefetch = predicted or []
        elif self.policy == "oracle":
            prefetch = self.allocs.clip(self.relocator.footprint(t, self.unit))
        else:
            prefetch = []
        corr = int(getattr(la, "correlation_id", 0) or 0)
        self.history.append((t, corr, la, predicted))
        if len(self.corr_launch) < TIMELINE_MAX:
            self.corr_launch[corr] = t

        stream = launch_stream(la)
        if self.residency is not None:
            # with an emulated capacity the estimate knows what is already there: move only the rest
            # (pages the host touched in between fault back in; that costs time, never correctness).
            # What the launch needs is everything the policy wants there, resident or not: the
            # already-resident part must be admitted too, or its units could be chosen as victims.
            want = prefetch
            estimate, known = self._estimate(t, la, data, predicted, want)
            if known and self.policy in ("template", "oracle") \
                    and sum(n for _, n in merge_ranges(estimate)) > self.residency.capacity:
                # a launch larger than memory streams through it: bring in only its first capacity's
                # worth (address order, as the residency estimate has it sweep), which it uses
                # before faulting and which its faults then evict; prefetching all of it would
                # leave only its last part resident, evicted by its first faults before use
                prefetch = self.residency.missing(front(want, self.residency.capacity))
            else:
                prefetch = self.residency.missing(want)
            admitted = merge_ranges(list(estimate) + list(want))
            if self.residency.victim == "next-use":
                self._seq_next.record(t, units_of(admitted, self.unit))
            overflow_before = self.residency.overflows
            # a footprint the engine knows streams through memory when larger than it; a guess may not
            evict = self.residency.admit(admitted, t, streams=known)
            if self.residency.overflows > overflow_before:
                st.overflow_launches += 1
            if evict:
                if self._evict_stream is None:
                    self._evict_stream = self.cuda.new_stream()
                    self._evict_event = self.cuda.new_event()
                    self._queued_event = self.cuda.new_event()
                # evict only after the work already queued on the launch's stream (launches are
                # asynchronous: earlier kernels may not have run yet and may need the victims)
                self.cuda.record_event(self._queued_event, stream)
                self.cuda.stream_wait_event(self._evict_stream, self._queued_event)
                for a, n in self._calls(t, la, self.cuda.prefetch_to_host, evict, self._evict_stream):
                    st.evict_bytes += n
                    st.evictions += 1
                self.cuda.record_event(self._evict_event, self._evict_stream)
        else:
            evict = []
        for a, n in self._calls(t, la, self.cuda.prefetch_to_gpu, prefetch, stream):
            st.prefetch_bytes += n
            st.prefetches += 1
        if evict:
            # the kernel starts only once its room is made; population above overlaps the eviction
            self.cuda.stream_wait_event(stream, self._evict_event)

    def _calls(self, t: int, la, move: Callable[[int, int, int], None], ranges, stream: int):
        """Call `move(address, nbytes, stream)` once per piece of `ranges` within one allocation;
        yield the pieces that the driver took.

        One refused piece (an allocation freed and its address reused since it was cached) does not
        stop the others; the allocation is looked up afresh next time.
        """
        for a, n in self.allocs.pieces(ranges):
            try:
                move(a, n, stream)
            except Exception as e:  # noqa: BLE001 - CudaCallError, or the stand-in's
                self.stats.failed_calls += 1
                self.stats.last_error = f"launch {t} ({la.kernel}): {type(e).__name__}: {e}"
                self.allocs.forget(a)
                continue
            yield a, n

    def _estimate(self, t: int, la, data: bytes, predicted, want) -> tuple[list[tuple[int, int]], bool]:
        """What launch t will touch, for the residency estimate (see the module docstring), and
        whether that is known (the trace's footprint or a prediction) rather than guessed (the
        allocations its pointers point into).

        `want`: everything the policy prefetches for it (before subtracting what is resident)."""
        if self.relocator is not None and self.relocator.matching:
            if self.policy == "oracle":
                return want, True
            return self.allocs.clip(self.relocator.footprint(t, self.unit)), True
        if predicted is not None:
            return predicted, True
        return allocation_ranges(data, self.allocs), False

    # -- feedback -------------------------------------------------------------
    def feedback_from(self, faults: list, kernels: list, apply: Callable[[Any, list[tuple[int, int]]], bool],
                      page_size: int = 4096) -> tuple[int, list]:
        """Hand faults the prediction missed to `apply(la, missed_page_intervals)`.

        `faults`: (time_ns, address, count) records; `kernels`: (start_ns,
        end_ns, correlation_id, name) records. A fault is attributed to the
        launch whose kernel ran when it was recorded (CUPTI kernel records
        carry the launch's correlation id). Returns (launches whose `apply`
        said the model changed, faults recorded after the last known kernel
        ended: their kernel's record may not have arrived yet).
        """
        if not faults:
            return 0, []
        kernels = sorted(kernels)
        if not kernels:
            return 0, list(faults)
        starts = [k[0] for k in kernels]
        last_end = max(k[1] for k in kernels)
        by_corr = {c: (t, la, pred) for t, c, la, pred in self.history}
        missed: dict[int, set[int]] = {}
        later = []
        for rec in faults:
            time_ns, addr = rec[0], rec[1]
            if time_ns > last_end:
                later.append(rec)
                continue
            i = bisect.bisect_right(starts, time_ns) - 1
            if i < 0 or time_ns > kernels[i][1]:
                continue
            corr = kernels[i][2]
            if corr not in by_corr:
                continue
            t, la, pred = by_corr[corr]
            page = addr // page_size
            if pred and any(a // page_size <= page < (a + n + page_size - 1) // page_size for a, n in pred):
                continue
            missed.setdefault(corr, set()).add(page)
        changed = 0
        for corr, pages in missed.items():
            t, la, pred = by_corr[corr]
            ivs: list[tuple[int, int]] = []
            for p in sorted(pages):
                if ivs and ivs[-1][1] == p:
                    ivs[-1] = (ivs[-1][0], p + 1)
                else:
                    ivs.append((p, p + 1))
            if apply(la, ivs):
                changed += 1
        self.stats.feedback_updates += changed
        return changed, later
