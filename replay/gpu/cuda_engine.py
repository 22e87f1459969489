"""The GPU runner's engine: a policy's per-launch decisions, carried out with CUDA calls.

At each launch (CUPTI API-enter callback, before the kernel is queued) the
`Engine` asks the policy's `LaunchDecider` (pagecast.replay.online.decide:
the decisions the simulator's `runner` policy replays too) what to move, and
moves it with cuMemPrefetchAsync:

- prefetches go on the launch's own stream, so they complete before the kernel;
- with an emulated capacity, victims go to the host on a side stream first. The
  side stream waits for the work already queued on the launch's stream
  (earlier kernels may still need the victims), and the launch's stream waits
  for the eviction before the kernel, so eviction overlaps population but
  never a kernel.

- a launch with indexed regions (its pages follow index values another launch wrote: MoE
  expert ids, block tables) first has its values read: an event recorded on its stream marks
  the completion of everything queued before it there, the producer included (the work the
  launch depends on is ordered before it on its stream, by the stream or by the events the
  program made it wait for), the host waits for that event, copies the values on the stream
  (a few bytes to KiB, `CudaIface.copy_to_host`), and only then predicts and prefetches. The
  launch's kernel is not queued yet (this is the launch's API enter), so the prefetches still
  go before it. The wait drains the stream: the price of acting on data-dependent pages,
  which the simulator charges too (the copy and the wait: replay/sim/timing.py).

The ledger (capacity emulation)
-------------------------------
The residency estimate that emulates a capacity is driven by what actually moved, not by what the
runner decided: with `moved` (the monitor's `take_migrations`: CUPTI's unified-memory counters,
host-to-device migrations of every cause (a fault, the driver's prefetcher, the runner's own calls)
and device-to-host ones), each launch boundary first folds in what moved since the last one
(`LaunchDecider.observe_moved`: host-to-device ranges recorded resident, device-to-host ones
released, in the order they happened). Pages the kernels faulted in or the driver prefetched,
which no decision named, are thus counted, and the launch's own step evicts what no longer fits,
by the policy's victim rule (`demand`: the driver's order; planned policies: the plan's). After
each boundary the estimate holds at most the capacity in 2 MiB chunks, unless the launch alone
does not fit; the largest excess seen is reported (`max_excess_bytes`), and a run over by more
than one chunk is not valid (child.py). Counter records arrive in CUPTI's buffers, so on a GPU a
boundary knows what moved up to the last delivered buffer, not up to the instant.

Lookahead (planned runs)
------------------------
With `ahead` (online/lookahead.py's `Lookahead`: the plan's footprints, the trace's for the oracle,
the model's predictions of the trace's launches for template, and how far each launch's callback
looks ahead), each launch's callback also prefetches the plan's window: the next launches' data,
one group per launch (`Decision.ahead_groups`; each unit with the first launch of the window that
uses it), on a copy stream of the runner's own, each group followed by an event. A launch's
stream waits on one event: its own group's, or, where it has none in that callback, the last
group's before it (a unit it shares with an earlier launch came in there), never on the whole copy
stream and never on an eviction: victims are none of the window's units, so the eviction goes on
its own stream after the work queued before the launch (the last planned use of what it evicts has
run), and only the copy stream waits for it (the room its prefetches need). How far ahead comes
from the cost profile and the trace's kernel times, bounded by the emulated capacity (the window
holds only the launches that fit beside the launch; none where the next does not); launches the
plan cannot see ahead (indexed ones, whose values do not exist yet) are prefetched at their own
callback, as without lookahead. Dead data (a freed temporary after its last use) is discarded on
the eviction stream with cuMemDiscardBatchAsync where the driver has it (`Engine.discard`),
after the work queued before the launch, and is not copied back; elsewhere it is left to eviction.
The child switches the lookahead on for planned runs given a trace (`ReplayRequest.lookahead`,
`--no-lookahead`; the schedule is online/lookahead.py's, which the simulator's `runner` reads too).
Not run on a GPU yet.

Planned runs
------------
Given a plan's schedule (`planned`: online/planned.py's `PlannedCalls`, over the `PlanSchedule` the
simulator's `runner` carries out; the child makes it from a `--plan` file), nothing is decided per
launch: each callback looks up the groups due (the next launch's, one launch ahead, or the launch's
own where its evictions wait for the launch before), moves their ranges into this run's addresses by
their allocations' learned deltas and issues them: evictions (and dead data discarded, where the
driver has the call) on the eviction stream after the work queued before the launch, the copy
stream waiting for them; prefetches on the copy stream, a range gated on index values after the
work queued before its callback; an event after each part. The launch's stream waits on its own
event alone (with no range of its own, on the event of the earlier group holding what it needs).
The ledger stays the safety net: where what moved is over the capacity, the launch's room is made as
without a plan (`plan_fallbacks`). A run that leaves the plan's trace is decided launch by launch
from there. Not run on a GPU yet (tests/test_gpu_planned.py: the stand-in driver).

Quiet launches (planned runs): most launches of a plan have nothing to issue at their callback.
Which ones is laid out at start (`_quiet_launches`): no part of any group issued there, no dead
data, no allocation whose address its arguments first show, a kernel the model knows. Such a
launch is counted, its kernel checked against the trace's, its stream made to wait on the event it
needs (its own ranges', brought in at an earlier callback, or that of the earlier group holding
what it needs: `_plan_wait`, as on the full path), and the callback returns: no lookup, no
relocation, no other driver call. The copy stream runs in order, so a stream that waited on an
event recorded later on it (the engine numbers its recordings) needs no other wait: such waits are
left out on both paths (`waits_covered`). A launch that neither issues nor waits is quiet
(`quiet_launches`), one that only waits light (`light_launches`); online/callbacks.py lays the same
out from the schedule for the simulator's runner, which charges each kind (tests/test_gpu_quiet.py
checks that the two agree). The ledger is looked at by the launches that
take the full path, and (in a run emulating a capacity with counters of what moved) by a quiet one
once `LEDGER_EVERY_S` has passed since the last of them (the
child flushes CUPTI's buffers at that period: records arrive no sooner), and where it was over the
capacity at the last boundary every launch takes the full path. Measured on the CPU only
(benchmarks/bench_child_callback.py, tests/test_gpu_quiet.py: the stand-in driver).

Batched calls
-------------
Where the driver hands out `cuMemPrefetchBatchAsync` (CUDA 13.0's driver API; `DriverCuda.
batch_calls`, asked by name through cuGetProcAddress), a launch's prefetches go as one call, and
its evictions as another: its ranges cut at allocation boundaries, those of one allocation that
fall in the same 2 MiB chunk merged into one (the chunk is taken whole anyway), and all of them
handed over at once. Where it does not, one cuMemPrefetchAsync per range, as before. A refused
batch is retried range by range, so that one stale range does not stop the others.

With feedback, faults the prediction missed refine the model (feedback_loop.py's
`FeedbackLoop`, through `Engine.feedback_from`).

Long because the ledger, the indexed launches' value reads, the lookahead (its groups, events and
discards), the planned runs and the batched calls all act on one launch's streams and events, in the order the module
doc gives: one object holds that order.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from pagecast.collect.launch_hook import PTSZ_CBIDS

from ..online.decide import LaunchDecider
from ..online.planned import EVICT, OWN, PlannedCalls
from ..online.ranges import UNIT, AllocationMap
from ..online.relocate import Relocator
from ..policies import online_policy

LEGACY_STREAM = 0x1             # CU_STREAM_LEGACY
PER_THREAD_STREAM = 0x2         # CU_STREAM_PER_THREAD
TIMELINE_MAX = 100_000          # launches per run kept in the timeline
LEDGER_EVERY_S = 0.002          # a quiet launch takes the full path (the ledger) this long after the last one
# planned runs: quiet launches counted and returned, waits the stream covered left out (the module doc);
# False: every launch takes the full path and every wait is issued (benchmarks/bench_child_callback.py)
QUIET = True

_PTSZ = frozenset(PTSZ_CBIDS)


def launch_stream(la) -> int:
    """The CUstream handle a launch runs on, never 0.

    0 in a *_ptsz call is the per-thread default stream, in any other call the
    legacy default stream. Both are named explicitly (CU_STREAM_PER_THREAD,
    CU_STREAM_LEGACY) because what 0 means in the runner's own calls depends on
    how cuda-bindings was set up, not on the launch: with
    CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM=1 it calls the _ptsz entry points
    and 0 is the per-thread stream.
    """
    s = int(la.stream or 0)
    if s == 0:
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
    values_launches: int = 0        # launches whose index values were read before predicting them
    values_bytes: int = 0
    values_wait_s: float = 0.0      # the host waiting for the work queued before such launches
    values_copy_s: float = 0.0      # the copies themselves
    values_errors: int = 0          # copies that failed (those regions get the fallback)
    batch_calls: int = 0            # cuMemPrefetchBatchAsync calls (each counted once in prefetches/evictions)
    ahead_launches: int = 0         # lookahead: launch groups brought in at an earlier launch's callback
    discards: int = 0               # cuMemDiscardBatchAsync calls (dead data, not copied back)
    discard_bytes: int = 0
    plan_fallbacks: int = 0         # planned runs: launches whose room the ledger made without the plan
    quiet_launches: int = 0         # planned runs: launches with nothing due, counted and returned
    light_launches: int = 0         # planned runs: launches with nothing to issue but their stream's wait
    waits_covered: int = 0          # planned runs: stream waits left out (the stream waited on a later event)
    # the ledger (capacity emulation driven by what moved; the module doc)
    moved_htod_bytes: int = 0       # host-to-device migrations reported, every cause
    moved_dtoh_bytes: int = 0       # device-to-host migrations reported
    unplanned_htod_bytes: int = 0   # of them, what no call of the runner's asked for (faults, the driver's prefetch)
    peak_before_evict_bytes: int = 0  # the most the estimate held at a boundary before its evictions (chunks)
    max_excess_bytes: int = 0       # the most it held over the capacity after a boundary's evictions (chunks)
    boundaries_over: int = 0        # boundaries left over the capacity

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["predict_us_mean"] = (1e6 * self.predict_s / self.predicted_launches) if self.predicted_launches else None
        d["predict_us_max"] = 1e6 * self.predict_max_s if self.predicted_launches else None
        return d


class Engine:
    """Applies one policy at each launch: prefetch, and evict to emulate a capacity.

    `on_launch(la)` takes the collector's `LaunchArgs`. `cuda` is a
    `driver.CudaIface`; `policy` a policy name or object that decides one launch
    at a time (pagecast.replay.policies); `predict(la, allocs) -> [(address,
    nbytes)]` is the online prediction (template policy and the footprint
    estimate); `relocator` a `Relocator` for the oracle; `model_kernels` the
    kernels the model knows (None: do not check).
    """

    def __init__(self, cuda, policy, *, capacity: int | None = None,
                 predict: Callable[[Any, AllocationMap], list[tuple[int, int]]] | None = None,
                 relocator: Relocator | None = None, model_kernels: Iterable[str] | None = None,
                 warn: Callable[[str], None] | None = None, unit: int = UNIT, compiled: bool = True,
                 moved: Callable[[], list] | None = None, ahead=None, ahead_skip=frozenset(),
                 planned: PlannedCalls | None = None) -> None:
        """`moved() -> [(order, +1 | -1, address, nbytes, cause)]`: the migrations reported since the
        last call (host to device +1, device to host -1; `cupti_monitor.CuptiMonitor.take_migrations`),
        which drive the capacity emulation's ledger (the module doc). `planned`: a plan's
        `PlanSchedule` per callback (online/planned.py), carried out instead of deciding each launch
        (the module doc's "Planned runs"; `ahead` is then not used)."""
        self.cuda = cuda
        self.moved = moved
        self.policy = online_policy(policy)
        self.capacity = capacity
        self.model_kernels = set(model_kernels) if model_kernels is not None else None
        self.warn = warn or (lambda m: None)
        self.unit = unit
        self.decider = LaunchDecider(self.policy, AllocationMap(cuda.allocation_of), capacity=capacity,
                                     predict=predict, relocator=relocator, warn=self.warn, unit=unit,
                                     compiled=compiled, ahead=ahead, ahead_skip=ahead_skip)
        self.stats = EngineStats()
        # one batched call per launch and direction where this driver has one (the module doc)
        have = cuda.batch_calls() if hasattr(cuda, "batch_calls") else ()
        self.batch = "cuMemPrefetchBatchAsync" in have and hasattr(cuda, "prefetch_batch")
        # dead data discarded where the driver has cuMemDiscardBatchAsync (lookahead.py's `dead`)
        self.discard = "cuMemDiscardBatchAsync" in have and hasattr(cuda, "discard_batch")
        self.decider.discards = self.discard
        self.t = 0
        self.history: deque = deque(maxlen=4096)   # (t, correlation_id, la, predicted ranges)
        self.corr_launch: dict[int, int] = {}       # correlation id -> launch index (timeline), bounded
        self._evict_stream: int | None = None
        self._evict_event: int | None = None
        self._queued_event: int | None = None
        self._values_event: int | None = None
        # lookahead: the copy stream, an event per launch parity, which launch the last ahead event is for
        self._copy_stream: int | None = None
        self._wait_for: dict[int, int] = {}    # launch -> the event its stream waits on (its data's, early)
        self._free_events: list[int] = []
        # a planned run: its schedule per callback, the parts left for a later callback (allocations
        # not known yet), each launch's own event and each group's last event, the freed allocations
        self.planned = planned
        self._later: dict[int, list] = {}
        self._own_ev: dict[int, int] = {}
        self._group_ev: dict[int, int] = {}
        self._group_free: dict[int, list[int]] = {}   # callback -> group events free after it
        self._freed: set[int] = set()
        if planned is not None:   # the last launch waiting on each group's event
            wf = planned.schedule.waits_for
            self._last_waiter = np.full(planned.n, -1, np.int64)
            np.maximum.at(self._last_waiter, wf[wf >= 0], np.flatnonzero(wf >= 0))
        # a planned run's quiet launches (the module doc's "Quiet launches"): where the copy stream's
        # events were recorded (their order) and the latest each launch stream waited on
        self._seq = 0
        self._ev_seq: dict[int, int] = {}
        self._waited: dict[int, int] = {}
        self._over = False             # the ledger was over the capacity at the last full boundary
        self._full_at = 0.0            # when the last launch took the full path (perf_counter)
        self._quiet = self._quiet_launches(planned, self.model_kernels) if planned is not None and QUIET else None
        if self._quiet is not None:   # per launch, as Python objects (a numpy scalar costs more to read)
            self._kernel_at = planned.rel.kernels
            self._waits_for = planned.schedule.waits_for.tolist()
            self._first = planned.rel.first_pointers().tolist()
            # a launch with ranges of its own or data of an earlier group may need its stream's wait
            self._may_wait = ((planned.schedule.own > 0) | (planned.schedule.waits_for >= 0)).tolist()
        # how long a quiet launch may go without the ledger (none to look at without a capacity to emulate)
        self._ledger_every = LEDGER_EVERY_S if moved is not None and capacity is not None else float("inf")
        # launches (and frees) can come from several threads (PyTorch's autograd thread beside the
        # main one): one at a time through the residency estimate and the caches
        self.lock = threading.RLock()

    # what the decisions are made from (the decider owns them)
    @property
    def allocs(self) -> AllocationMap:
        return self.decider.allocs

    @property
    def residency(self):
        return self.decider.residency

    @property
    def relocator(self) -> Relocator | None:
        return self.decider.relocator

    @property
    def predict(self):
        return self.decider.predict

    @predict.setter
    def predict(self, fn) -> None:
        self.decider.predict = fn

    # -- per launch -----------------------------------------------------------
    def on_free(self, addr: int) -> None:
        """The workload freed the allocation at addr (a cuMemFree / cudaFree callback): the decider
        forgets it (see LaunchDecider.on_free)."""
        try:
            with self.lock:
                if self.planned is not None:
                    self._freed.add(int(addr))
                self.decider.on_free(addr)
        except Exception as e:  # noqa: BLE001 - never into the workload's free
            self.stats.errors += 1
            self.stats.last_error = f"on_free: {type(e).__name__}: {e}"

    def on_launch(self, la) -> None:
        t0 = time.perf_counter()
        with self.lock:
            t = self.t
            self.t = t + 1
            st = self.stats
            st.launches += 1
            try:
                q = self._quiet
                if q is None or t >= len(q) or not q[t] or not self._quiet_launch(t, la, t0):
                    self._full_at = t0
                    self._launch(t, la)
            except Exception as e:  # noqa: BLE001 - never break the workload's launch
                st.errors += 1
                st.last_error = f"launch {t} ({la.kernel}): {type(e).__name__}: {e}"
            st.callback_s += time.perf_counter() - t0

    @staticmethod
    def _quiet_launches(pc: PlannedCalls, model_kernels) -> list[bool]:
        """Per launch of a planned run, laid out at start: its callback issues nothing (no part of
        any group, no dead data), it has no ranges of its own to wait for, its arguments teach no
        allocation's address, and the model knows its kernel (online/callbacks.py's rule, with what
        only the engine knows: the parts it issues, the dead data, the pointers it learns from)."""
        q = np.array([not parts for parts in pc.at], bool) & ~pc.rel.layout().first_pointers()
        if pc.dead is not None:
            ptr = np.asarray(pc.dead[0], np.int64)
            m = min(len(ptr) - 1, pc.n)
            q[:m] &= np.diff(ptr)[:m] == 0
        if model_kernels is not None:
            q &= np.array([k in model_kernels for k in pc.rel.kernels[:pc.n]], bool)
        return q.tolist()

    def _quiet_launch(self, t: int, la, now: float) -> bool:
        """Launch t, with nothing to issue by the plan (`_quiet`), done here (the module doc): counted,
        its kernel checked against the trace's, its stream's wait made where it needs one (a light
        launch); False where it needs the full path after all."""
        if (self.planned is None or self._over or now - self._full_at > self._ledger_every
                or la.kernel != self._kernel_at[t] or t in self._later):
            return False
        if self._may_wait[t] and self._plan_wait(t, self._waits_for[t], launch_stream(la)):
            self.stats.light_launches += 1
        else:
            self.stats.quiet_launches += 1
        if len(self.corr_launch) < TIMELINE_MAX:
            self.corr_launch[int(la.correlation_id or 0)] = t
        return True

    def _launch(self, t: int, la) -> None:
        st = self.stats
        kernel = la.kernel
        if self.model_kernels is not None and kernel not in self.model_kernels and kernel not in st.unseen_kernels:
            st.unseen_kernels.append(kernel)
            self.warn(f"kernel {kernel!r} (launch {t}) is not in the model: "
                      "it gets the fallback prediction")
        stream = launch_stream(la)
        res = self.decider.residency
        if res is not None and self.moved is not None:
            self._observe(t)
            units = res.resident_units
            if units * self.unit > st.peak_before_evict_bytes:
                st.peak_before_evict_bytes = units * self.unit
        if self.planned is not None:
            self._carry_out_plan(t, la, stream)
            return
        self._launch_decided(t, la, stream)

    def _launch_decided(self, t: int, la, stream: int) -> None:
        """The launch decided online (`LaunchDecider.decide`) and carried out."""
        st = self.stats
        res = self.decider.residency
        d = self.decider.decide(t, la, self._read_values(t, la, stream))
        if res is not None:
            over = res.resident_units * self.unit - int(self.capacity or 0)
            if over > 0:
                st.boundaries_over += 1
                if over > st.max_excess_bytes:
                    st.max_excess_bytes = over
        st.period = d.period
        ps = d.predict_s
        if ps is not None:
            st.predict_s += ps
            if ps > st.predict_max_s:
                st.predict_max_s = ps
            st.predicted_launches += 1
        corr = int(getattr(la, "correlation_id", 0) or 0)
        self.history.append((t, corr, la, d.predicted))
        if len(self.corr_launch) < TIMELINE_MAX:
            self.corr_launch[corr] = t
        if d.overflow:
            st.overflow_launches += 1
        if self.decider.ahead is not None:
            self._carry_out_ahead(t, la, d, stream)
            return
        if d.evict:
            if self._evict_stream is None:
                self._evict_stream = self.cuda.new_stream()
                self._evict_event = self.cuda.new_event()
                self._queued_event = self.cuda.new_event()
            # evict only after the work already queued on the launch's stream (launches are
            # asynchronous: earlier kernels may not have run yet and may need the victims)
            self.cuda.record_event(self._queued_event, stream)
            self.cuda.stream_wait_event(self._evict_stream, self._queued_event)
            n, nbytes = self._calls(t, la, self.cuda.prefetch_to_host, d.evict, self._evict_stream, to_gpu=False)
            st.evictions += n
            st.evict_bytes += nbytes
            self.cuda.record_event(self._evict_event, self._evict_stream)
        if d.prefetch:
            n, nbytes = self._calls(t, la, self.cuda.prefetch_to_gpu, d.prefetch, stream, to_gpu=True)
            st.prefetches += n
            st.prefetch_bytes += nbytes
        if d.evict:
            # the kernel starts only once its room is made; population above overlaps the eviction
            self.cuda.stream_wait_event(stream, self._evict_event)

    def _observe(self, t: int) -> None:
        """Fold what moved since the last boundary into the ledger (the module doc)."""
        recs = self.moved()
        if not recs:
            return
        h, d, u = self.decider.observe_moved(t, recs)
        st = self.stats
        st.moved_htod_bytes += h
        st.moved_dtoh_bytes += d
        st.unplanned_htod_bytes += u

    def _carry_out_ahead(self, t: int, la, d, stream: int) -> None:
        """Lookahead (the module doc): dead data discarded and evictions on their own stream after the
        work queued before the launch, the launch's own prefetches (what was not brought in early)
        and the later launches' on the copy stream, one group per launch, each followed by an event;
        the launch's stream waits on its own event only."""
        st, cuda = self.stats, self.cuda
        if self._copy_stream is None:
            self._copy_stream = cuda.new_stream()
        copy = self._copy_stream
        if d.evict or d.discard:
            if self._evict_stream is None:
                self._evict_stream = cuda.new_stream()
                self._evict_event = cuda.new_event()
                self._queued_event = cuda.new_event()
            cuda.record_event(self._queued_event, stream)      # after the last planned use of the victims
            cuda.stream_wait_event(self._evict_stream, self._queued_event)
            if d.discard:
                self._discard(t, la, d.discard)
            if d.evict:
                n, nbytes = self._calls(t, la, cuda.prefetch_to_host, d.evict, self._evict_stream, to_gpu=False)
                st.evictions += n
                st.evict_bytes += nbytes
            cuda.record_event(self._evict_event, self._evict_stream)
            cuda.stream_wait_event(copy, self._evict_event)    # the room the copies need; not the kernel
        wait = self._wait_for.pop(t, None)                     # brought in at an earlier callback
        evs = []                                               # (launch, event) of this callback's groups
        if d.prefetch:
            n, nbytes = self._calls(t, la, cuda.prefetch_to_gpu, d.prefetch, copy, to_gpu=True)
            st.prefetches += n
            st.prefetch_bytes += nbytes
            if wait is not None:
                self._free_events.append(wait)                 # the new event comes after it on the copy stream
            wait = self._event()
            cuda.record_event(wait, copy)
            evs.append((t, wait))
        if wait is not None:
            cuda.stream_wait_event(stream, wait)
            self._free_events.append(wait)                     # waited on: free to record again
        groups = d.ahead_groups if d.ahead_groups is not None else (
            [(d.ahead_t, d.ahead)] if d.ahead else [])
        for s, ranges in groups:
            n, nbytes = self._calls(t, la, cuda.prefetch_to_gpu, ranges, copy, to_gpu=True)
            st.prefetches += n
            st.prefetch_bytes += nbytes
            ev = self._event()
            cuda.record_event(ev, copy)
            self._wait(s, ev)
            evs.append((s, ev))
            st.ahead_launches += 1
        if not evs:
            return
        # a launch of the window with no group of its own here may use units an earlier group brought
        # in (a unit goes with the first launch of the window that uses it): it waits for the last
        # group before it
        upto = d.ahead_upto if d.ahead_upto is not None else (groups[-1][0] if groups else t)
        k = 0
        for s in range(t + 1, upto + 1):
            while k + 1 < len(evs) and evs[k + 1][0] <= s:
                k += 1
            if evs[k][0] != s:
                self._wait(s, evs[k][1])

    def _carry_out_plan(self, t: int, la, stream: int) -> None:
        """Planned runs (the module doc): the groups due at this callback, looked up and relocated;
        evictions and dead data on the eviction stream after the work queued before the launch,
        prefetches on the copy stream (index-value gated ones after that work too), an event after
        each part; the launch's stream waits on its own event alone. Where what really moved is over
        the capacity (the ledger), the launch's own evictions go as without a plan first."""
        st, cuda, pc = self.stats, self.cuda, self.planned
        if not pc.rel.observe(t, la.kernel, bytes(la.param_data or b"")):
            self.warn(f"the run no longer matches the plan's trace ({pc.rel.mismatch}): from launch {t} on"
                      " the runner decides one launch at a time")
            self.planned = None
            self._quiet = None
            self._launch_decided(t, la, stream)
            return
        if self._quiet is not None and self._first[t] and not pc.rel.learned(t):
            self._quiet = None   # an address not learned where the trace first shows it: every launch observed
        res = self.decider.residency
        fallback = None
        if res is not None and self.capacity is not None and res.resident_units * self.unit > self.capacity:
            fallback = self.decider.decide(t, la).evict   # the safety net: room made as without a plan
            st.plan_fallbacks += 1
        if res is not None:
            over = res.resident_units * self.unit - int(self.capacity or 0)
            self._over = over > 0
            if over > 0:
                st.boundaries_over += 1
                st.max_excess_bytes = max(st.max_excess_bytes, over)
        corr = int(getattr(la, "correlation_id", 0) or 0)
        self.history.append((t, corr, la, None))
        if len(self.corr_launch) < TIMELINE_MAX:
            self.corr_launch[corr] = t
        if self._copy_stream is None:
            self._copy_stream = cuda.new_stream()
        copy = self._copy_stream
        parts = pc.at[t]
        later = self._later.pop(t, None)
        if later:
            parts = [p for p in parts if p.kind == EVICT] + later + [p for p in parts if p.kind != EVICT]
        queued = False
        evicted = False
        dead = pc.dead_at(t) if self.discard else ()
        dead = [r for r in dead if r[0] not in self._freed]
        if fallback or dead or (parts and parts[0].kind == EVICT):
            if self._evict_stream is None:
                self._evict_stream = cuda.new_stream()
                self._evict_event = cuda.new_event()
                self._queued_event = cuda.new_event()
        for p in parts:
            if p.kind != EVICT:
                break
            ranges, _ = pc.ranges(p)   # an allocation this run has not shown yet holds nothing to evict
            if not ranges:
                continue
            if not queued:
                cuda.record_event(self._queued_event, stream)   # after the last planned use of the victims
                cuda.stream_wait_event(self._evict_stream, self._queued_event)
                queued = True
            n, nbytes = self._plan_calls(t, la, cuda.prefetch_to_host, ranges, self._evict_stream, False)
            st.evictions += n
            st.evict_bytes += nbytes
            evicted = True
        if dead or fallback:
            if not queued:
                cuda.record_event(self._queued_event, stream)
                cuda.stream_wait_event(self._evict_stream, self._queued_event)
                queued = True
            if dead:
                self._discard_ranges(t, la, dead)
            if fallback:
                n, nbytes = self._calls(t, la, cuda.prefetch_to_host, fallback, self._evict_stream, to_gpu=False)
                st.evictions += n
                st.evict_bytes += nbytes
            evicted = True
        if evicted:
            cuda.record_event(self._evict_event, self._evict_stream)
            cuda.stream_wait_event(copy, self._evict_event)    # the room the copies need; not the kernel
        gated = False
        for p in parts:
            if p.kind == EVICT:
                continue
            ranges, rest = pc.ranges(p)
            if rest is not None:
                if p.launch > t:
                    self._later.setdefault(p.launch, []).append(rest)
                else:
                    pc.unmapped_bytes += sum(rest.nbytes)
            if not ranges:
                continue
            if p.gated and not gated:   # nothing before its values exist: after the work queued so far
                if not queued:
                    if self._queued_event is None:
                        self._queued_event = cuda.new_event()
                    cuda.record_event(self._queued_event, stream)
                    queued = True
                cuda.stream_wait_event(copy, self._queued_event)
                gated = True
            n, nbytes = self._plan_calls(t, la, cuda.prefetch_to_gpu, ranges, copy, True)
            st.prefetches += n
            st.prefetch_bytes += nbytes
            ev = self._event()
            cuda.record_event(ev, copy)
            self._seq += 1
            self._ev_seq[ev] = self._seq
            self._planned_event(p.launch, p.kind == OWN, ev)
            if p.launch > t:
                st.ahead_launches += 1
        self._plan_wait(t, int(pc.schedule.waits_for[t]), stream)
        if fallback:   # the room made without the plan comes before the kernel, as without it
            cuda.stream_wait_event(stream, self._evict_event)

    def _plan_wait(self, t: int, wf: int, stream: int) -> bool:
        """Launch t's stream waits on its own event alone (or, with no range of its own, on that of the
        group `wf` before holding what it needs), not where it waited on an event recorded later on
        the copy stream; the group events no later launch waits on are freed. Whether it waited."""
        ev = self._own_ev.pop(t, None)
        if ev is None:
            ev = self._group_ev.get(wf) if wf >= 0 else None
        elif ev != self._group_ev.get(t):
            self._free_events.append(ev)
        waited = False
        if ev is not None:
            seq = self._ev_seq.get(ev, 0)
            if seq > self._waited.get(stream, 0) or not QUIET:
                self.cuda.stream_wait_event(stream, ev)
                self._waited[stream] = seq
                waited = True
            else:
                self.stats.waits_covered += 1
        if self._group_free:
            for g in self._group_free.pop(t, ()):
                old = self._group_ev.pop(g, None)
                if old is not None and old != self._own_ev.get(g):
                    self._free_events.append(old)
        return waited

    def _planned_event(self, lid: int, own: bool, ev: int) -> None:
        """`ev` follows a part of launch lid's group: its own event (own ranges), its group's (waited
        on by later launches until the last of them)."""
        if own:
            old = self._own_ev.get(lid)
            self._own_ev[lid] = ev
            if old is not None and old != self._group_ev.get(lid):
                self._free_events.append(old)
        last = int(self._last_waiter[lid])
        if last > lid:
            old = self._group_ev.get(lid)
            self._group_ev[lid] = ev
            if old is not None and old != self._own_ev.get(lid):
                self._free_events.append(old)
            if old is None:
                self._group_free.setdefault(last, []).append(lid)
        elif not own:
            self._free_events.append(ev)   # no launch waits on it

    def _plan_calls(self, t: int, la, move, ranges: list[tuple[int, int]], stream: int,
                    to_gpu: bool) -> tuple[int, int]:
        """A planned part's ranges (each within one allocation already): one batched call where the
        driver has one, else one call per range; (calls, bytes) the driver took."""
        return self._issue(t, la, move, ranges, ranges, stream, to_gpu, forget=False)

    def _wait(self, s: int, ev: int) -> None:
        """Launch s's stream will wait on `ev` (a later event on the copy stream covers an earlier one)."""
        old = self._wait_for.get(s)
        if old is not None and old != ev:
            self._free_events.append(old)
        self._wait_for[s] = ev

    def _event(self) -> int:
        """An event no launch waits on yet (a freed one, or a new one)."""
        pool = self._free_events
        # free only those that no pending launch still waits on
        while pool:
            ev = pool.pop()
            if ev not in self._wait_for.values():
                return ev
        return self.cuda.new_event()

    def _discard(self, t: int, la, ranges) -> None:
        """Dead data discarded (its contents never copied back), one cuMemDiscardBatchAsync where the
        driver has it; where it does not, left to eviction as before (nothing is called)."""
        if not self.discard:
            return
        self._discard_ranges(t, la, self.allocs.pieces(ranges))

    def _discard_ranges(self, t: int, la, pieces) -> None:
        """`pieces` (each within one allocation) discarded in one call on the eviction stream."""
        cuda, st = self.cuda, self.stats
        try:
            cuda.discard_batch(pieces, self._evict_stream)
        except Exception as e:  # noqa: BLE001 - the data stays; eviction copies it back as before
            st.failed_calls += 1
            st.last_error = f"launch {t} ({la.kernel}): discard: {type(e).__name__}: {e}"
            return
        st.discards += 1
        st.discard_bytes += sum(n for _, n in pieces)

    def _read_values(self, t: int, la, stream: int):
        """The index values launch t's indexed regions read, as `values(address, nbytes) -> bytes |
        None` for the prediction; None when it has none (or the prediction names none). Read after
        everything queued before the launch on its stream has completed (the module doc)."""
        value_reads = getattr(self.decider.predict, "value_reads", None)
        if value_reads is None or not self.policy.predicts:
            return None
        reads = [(int(a), int(n)) for a, n in value_reads(la, self.decider.allocs) if n > 0]
        if not reads:
            return None
        st = self.stats
        cuda = self.cuda
        if self._values_event is None:
            self._values_event = cuda.new_event()
        t0 = time.perf_counter()
        cuda.record_event(self._values_event, stream)
        cuda.event_synchronize(self._values_event)
        t1 = time.perf_counter()
        got: dict[tuple[int, int], bytes] = {}
        for a, n in reads:
            try:
                got[(a, n)] = cuda.copy_to_host(a, n, stream)
            except Exception as e:  # noqa: BLE001 - that region gets the fallback, the launch goes on
                st.values_errors += 1
                st.last_error = f"launch {t} ({la.kernel}): reading index values: {type(e).__name__}: {e}"
        st.values_launches += 1
        st.values_bytes += sum(len(v) for v in got.values())
        st.values_wait_s += t1 - t0
        st.values_copy_s += time.perf_counter() - t1
        return lambda a, n: got.get((int(a), int(n)))

    def _calls(self, t: int, la, move: Callable[[int, int, int], None], ranges, stream: int,
               to_gpu: bool = True) -> tuple[int, int]:
        """Call `move(address, nbytes, stream)` once per piece of `ranges` within one allocation, or
        where the driver batches, one `prefetch_batch` of the pieces merged per 2 MiB chunk; returns
        how many calls, and bytes, the driver took (the stats are updated once per launch).

        One refused piece (an allocation freed and its address reused since it was cached) does not
        stop the others; the allocation is looked up afresh next time.
        """
        pieces = self.allocs.pieces(ranges)
        merged = self._chunk_merge(pieces) if self.batch and len(pieces) > 1 else pieces
        return self._issue(t, la, move, pieces, merged, stream, to_gpu, forget=True)

    def _issue(self, t: int, la, move, pieces, batched, stream: int, to_gpu: bool,
               forget: bool) -> tuple[int, int]:
        """One `prefetch_batch` of `batched` where the driver batches and there are several pieces,
        else (or where the batched call is refused) `move` per piece; (calls, bytes) the driver
        took. `forget`: a refused piece's allocation is looked up afresh next time."""
        if self.batch and len(pieces) > 1:
            try:
                self.cuda.prefetch_batch(batched, to_gpu, stream)
                self.stats.batch_calls += 1
                return 1, sum(m for _, m in batched)
            except Exception as e:  # noqa: BLE001 - range by range below, the refused one counted there
                self.stats.last_error = f"launch {t} ({la.kernel}): batched call: {type(e).__name__}: {e}"
        n = nbytes = 0
        for a, m in pieces:
            try:
                move(a, m, stream)
            except Exception as e:  # noqa: BLE001 - CudaCallError, or the stand-in's
                self.stats.failed_calls += 1
                self.stats.last_error = f"launch {t} ({la.kernel}): {type(e).__name__}: {e}"
                if forget:
                    self.allocs.forget(a)
                continue
            n += 1
            nbytes += m
        return n, nbytes

    def _chunk_merge(self, pieces: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Pieces (sorted, each within one allocation) of one allocation that fall in the same
        `unit` chunk merged into their hull: the chunk is taken whole, the call is one range."""
        out: list[tuple[int, int]] = []
        unit = self.unit
        for a, m in pieces:
            if out:
                pa, pm = out[-1]
                if a // unit == (pa + pm - 1) // unit and a >= pa + pm:
                    al = self.allocs.cached(pa)
                    if al is not None and a + m <= al.base + al.size:
                        out[-1] = (pa, a + m - pa)
                        continue
            out.append((a, m))
        return out

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
