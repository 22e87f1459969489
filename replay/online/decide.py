"""One launch at a time: what a policy moves before each launch, for the GPU runner and the
simulator's `runner` policy alike.

`LaunchDecider.decide(t, la)` takes launch t's arguments (the collector's
`LaunchArgs`) and returns a `Decision`: the byte ranges to prefetch to the GPU
and, with an emulated capacity, the ranges to evict to the host first. What
to prefetch is the policy's own (`Policy.launch_prefetch`, one module per
policy in pagecast.replay.policies):

- `demand`: nothing (the driver faults pages in);
- `alloc`: the whole managed allocation each pointer argument lands in;
- `template`: the launch's footprint predicted from its live arguments with
  the model (`prediction.make_online_predict`);
- `oracle`: the launch's real footprint, read from a matching full-mode trace
  of the same workload and relocated into this run's address space
  (`relocate.Relocator`).

The GPU engine (pagecast.replay.gpu.cuda_engine) carries a decision out with
cuMemPrefetchAsync calls on streams; the simulator's `runner` policy moves the
same ranges' units. Both cut the ranges at allocation boundaries with
`AllocationMap.pieces` first (the driver takes one allocation per call).

Capacity emulation
------------------
A capacity emulates a smaller GPU without oversubscribing the real one: the
decider keeps a residency estimate (`unit_residency.UnitResidency`, in arrays,
one compiled call per launch; `residency.Residency` is its Python reference: the
bytes it believes are on the GPU, grouped in 2 MiB units, each unit with a resident byte
taking its whole size of the capacity, as the driver's 2 MiB chunks do) and, before a launch
whose estimated footprint would not fit, names victim units to move to the host. A
launch's estimated footprint is, in order of preference: the relocated
footprint from a matching trace, the model's prediction, or the whole
allocations its pointer arguments land in; what the policy prefetches is added
to it. A launch whose known footprint is larger than the capacity streams
through memory: a policy with `streams_front` (template, oracle) prefetches
only its first capacity's worth of units (address order). Victims follow the policy's
`victims` rule (residency.py).

Lookahead
---------
With a planned run's schedule (lookahead.py's `Lookahead`), each decision also brings in the plan's
window: launches t + 1 .. the schedule's horizon for t, as many as fit beside launch t
(`Decision.ahead_groups`, one group per launch, each unit with the first launch that uses it), and
names the dead data to discard (`Decision.discard`). Per launch that is a lookup and a few
compiled calls (`_window_step`); `LOOKAHEAD_STEP = "python"` keeps the step as it was before
(one launch ahead, units counted in Python sets), the reference it is tested against.

Long because one decider holds the capacity step and the lookahead's window step, with the Python
reference of each that the compiled ones are tested against (`compiled=False`, `LOOKAHEAD_STEP`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from pagecast.errors import UsageError

import numpy as np

from .period import PeriodTracker
from .ranges import (UNIT, AllocationMap, RangeArrays, allocation_ranges, front_units, merge_ranges, subtract_ranges,
                     units_of)
from . import residency_kernels as RK
from .lookahead import Lookahead, Windows
from .relocate import Relocator
from .residency import FutureNextUse, PeriodDetector, Residency, SequenceNextUse
from .unit_residency import UnitResidency


# planned runs decide from footprints laid out once, at start (`PlannedFootprints`); False: the
# trace's footprint is relocated launch by launch in Python (`Relocator.footprint`), as before
# (benchmarks/bench_child_callback.py times both)
PRECOMPUTE = True
# the lookahead step: "compiled" (the window and its split in compiled calls, lookahead.py), or
# "python" (one launch ahead, units counted and split in Python sets, as before; kept as the
# reference the compiled step is tested against, benchmarks/bench_child_callback.py times both)
LOOKAHEAD_STEP = "compiled"


@dataclass(slots=True)
class LaunchView:
    """What a policy sees of one launch when it decides alone (no lookahead)."""

    t: int                              # the launch's index in the run
    la: Any                             # its LaunchArgs
    data: bytes                         # its parameter buffer
    allocs: AllocationMap               # the allocations pointers land in
    predicted: list | None              # the model's prediction (byte ranges), when made
    relocator: Relocator | None         # a matching trace's footprints, relocated
    unit: int                           # the residency estimate's unit (2 MiB)
    laid_out: bool = False              # the relocator's footprints are laid out (PRECOMPUTE)

    def allocation_ranges(self) -> list[tuple[int, int]]:
        """The whole managed allocations the launch's pointer arguments land in."""
        return allocation_ranges(self.data, self.allocs)

    def relocated_footprint(self) -> list[tuple[int, int]]:
        """The launch's footprint in the matching trace, in this run's addresses (managed parts)."""
        if self.laid_out:   # arrays moved in one compiled call; the calls cut them per allocation
            return self.relocator.footprint_arrays(self.t)
        return self.allocs.clip(self.relocator.footprint(self.t, self.unit))


@dataclass(slots=True)
class Decision:
    """What to move before one launch (merged byte ranges), and what deciding it cost."""

    prefetch: list[tuple[int, int]]     # to the GPU, on the launch's stream
    evict: list[tuple[int, int]]        # to the host first (after the work queued before the launch)
    predicted: list | None = None       # the model's prediction, when one was made
    predict_s: float | None = None      # seconds the prediction took (None: not predicted)
    overflow: bool = False              # the launch alone exceeds the capacity
    period: int | None = None           # the kernel sequence's period, when one is found
    ahead: list | None = None           # lookahead: the later launches' ranges to prefetch now, after these
    ahead_t: int | None = None          # ... the first launch they are for
    ahead_groups: list | None = None    # ... per launch: [(launch, ranges)], in launch order (with ranges)
    ahead_upto: int | None = None       # ... the last launch of the window (launches without a group in
                                        # it may use units an earlier group of it brings in)
    discard: list | None = None         # dead data (lookahead.py): ranges to discard, not copy back


class LaunchDecider:
    """A policy's per-launch decisions, with the residency estimate that emulates a capacity.

    `policy` is a Policy object with `online` set (pagecast.replay.policies);
    `allocs` the AllocationMap that pointers are looked up in; `predict(la,
    allocs) -> [(address, nbytes)]` the online prediction (the template policy,
    and the footprint estimate); `relocator` a Relocator for the oracle;
    `warn` receives one-line warnings (the run no longer matches the trace).

    `compiled` (the default): the period and the residency estimate in arrays, one compiled call
    each per launch (`period.PeriodTracker`, `unit_residency.UnitResidency`), reading a compiled
    prediction's ranges where they lie (`predict.last`); `compiled=False`: the Python objects the
    runner used before (`residency.PeriodDetector`, `Residency`, `SequenceNextUse`), kept as the
    reference the compiled ones are tested against and that benchmarks/bench_runner.py times
    beside them. Both make the same decisions.
    """

    def __init__(self, policy, allocs: AllocationMap, *, capacity: int | None = None,
                 predict: Callable[[Any, AllocationMap], list[tuple[int, int]]] | None = None,
                 relocator: Relocator | None = None, warn: Callable[[str], None] | None = None,
                 unit: int = UNIT, compiled: bool = True, ahead=None, ahead_skip=frozenset()) -> None:
        """`ahead`: a `lookahead.Lookahead` (its plan, skip set, horizon and dead data), or a
        Relocator over the plan's footprints (the trace's for the oracle, the model's predictions of
        the trace's launches for template; one launch ahead), which turns lookahead on: each decision
        also names the window's ranges per launch, prefetched early (`Decision.ahead_groups`; the
        engine issues them on a copy stream of its own). `ahead_skip`: launches never prefetched
        early (indexed ones: nothing before their values exist)."""
        if not getattr(policy, "online", False):
            raise UsageError(f"policy {policy.name!r} decides on the whole timeline, not one launch at a time")
        if policy.predicts and predict is None:
            raise UsageError(f"policy {policy.name} needs a model (--model MODEL)")
        if policy.needs_relocator and relocator is None:
            raise UsageError(f"policy {policy.name} needs a matching full-mode trace of the workload")
        self.policy = policy
        self.allocs = allocs
        self.capacity = capacity
        self.predict = predict
        self.relocator = relocator
        self.warn = warn or (lambda m: None)
        self.unit = unit
        self.compiled = compiled
        victims = policy.victims
        self._plan_scorer = None
        sched = ahead if isinstance(ahead, Lookahead) else None
        if isinstance(ahead, Lookahead):   # the schedule (lookahead.py) the simulator's runner reads too
            if ahead.plan_victims and victims == "next-use":   # the plan knows the next uses: Belady on it
                victims = "belady"
                self._plan_scorer = ahead.plan
            ahead, ahead_skip = ahead.plan, ahead.skip
        self.victims = victims
        self.ahead = ahead.layout() if ahead is not None else None
        self._sent: tuple[int, list] | None = None   # (launch, ranges) prefetched ahead, without a capacity
        self._sent_at: dict[int, list] = {}         # the same, per launch of a window
        self._sent_upto = -1                        # the last launch brought in
        self.ahead_skip = frozenset(ahead_skip)
        self.schedule = (sched if sched is not None else
                         Lookahead(ahead, self.ahead_skip) if ahead is not None else None)
        self._window_of = getattr(self.ahead, "footprint_window", None)
        # per launch, looked up: the window's last launch, and whether data dies before it
        sc = self.schedule
        self._horizon = sc.horizon.tolist() if sc is not None and sc.horizon is not None else None
        self._dead_at = (frozenset(np.flatnonzero(np.diff(sc.dead[0])).tolist())
                         if sc is not None and sc.dead is not None else frozenset())
        self._windows: Windows | None = None
        # whoever carries the decisions out discards dead data (the GPU engine, where the driver has
        # cuMemDiscardBatchAsync); otherwise it stays, left to eviction, and in the residency estimate
        self.discards = False
        # the trace's footprints laid out in arrays at start: per launch a lookup, not a Python walk
        self.laid_out = bool(PRECOMPUTE and compiled and relocator is not None)
        if self.laid_out:
            relocator.layout()
        self.detector = PeriodTracker().warm() if compiled else PeriodDetector()
        self._seq_next = None if compiled else SequenceNextUse(self.detector)
        self.residency: Residency | UnitResidency | None = None
        if capacity is not None:
            if compiled:   # next-use: the sequence scores are the residency's own (recorded in its step)
                scorer = None if victims == "next-use" else self._scorer(victims)
                self.residency = UnitResidency(capacity, unit, victims, scorer,
                                               max_period=self.detector.max_period).warm()
            else:
                self.residency = Residency(capacity, unit, victims, self._scorer(victims))
        self._inbuf = np.zeros(64, np.int64)
        res = self.residency
        # the step's flags that do not change from launch to launch
        self._flags = 0 if res is None or not compiled else (
            (RK.FL_FRONT if policy.streams_front else 0)
            | (RK.FL_RECORD if res.victim == "next-use" and res.next_use is None else 0))

    @property
    def predict(self):
        return self._predict

    @predict.setter
    def predict(self, fn) -> None:
        self._predict = fn
        self._clipped = bool(getattr(fn, "clipped", False))   # the online predictor's ranges are
        self._last = getattr(fn, "last", None)                # the compiled one: where it left them

    def _scorer(self, victims: str):
        """The next-use scorer a victim rule needs (None for fifo and lru)."""
        if victims == "next-use":
            return self._seq_next
        if victims == "belady":
            if self._plan_scorer is not None:   # the lookahead's plan (lookahead.py)
                sc = self._plan_scorer.next_use_scorer(self.unit)
                return sc if LOOKAHEAD_STEP == "compiled" else _OneAtATime(sc)
            rel = self.relocator
            if self.laid_out:
                return rel.next_use_scorer(self.unit)
            return FutureNextUse(rel.future_uses(self.unit), lambda u: rel.origin.get(u, ()))
        return None

    def on_free(self, addr: int) -> None:
        """The workload freed the allocation at addr: drop it from the allocation cache and its
        pages from the residency estimate (they take no room now, and evicting them would be
        refused), and its history from the predictor."""
        a = self.allocs.cached(int(addr))
        if a is not None and self.residency is not None:
            self.residency.release([(a.base, a.size)])
        self.allocs.forget(int(addr))
        forget = getattr(self.predict, "forget", None)
        if forget is not None:
            forget(int(addr))

    def observe_moved(self, t: int, recs) -> tuple[int, int, int]:
        """What moved since the last launch, as the unified-memory counters report it: `recs` are
        (order, +1 host-to-device | -1 device-to-host, address, nbytes, cause), in the order they
        happened. Runs of host-to-device ranges are recorded resident without making room (they
        took it already: faults, the driver's prefetch, the runner's own calls) and runs of
        device-to-host ones released; the launch's step then evicts what no longer fits. One pass:
        contiguous ranges of a run are joined as they come (a batch's migrations mostly are).
        Returns (host-to-device bytes, device-to-host bytes, host-to-device bytes no call of the
        runner's asked for)."""
        res = self.residency
        htod = dtoh = unplanned = 0
        run: list[list[int]] = []
        d = 0
        for r in recs:
            n = r[3]
            if n <= 0:
                continue
            if r[1] > 0:
                htod += n
                if r[4] != "user":
                    unplanned += n
            else:
                dtoh += n
            if r[1] != d:
                if run and res is not None:
                    self._fold(t, d, run)
                run, d = [], r[1]
            a = r[2]
            if run and run[-1][0] + run[-1][1] == a:
                run[-1][1] += n
            else:
                run.append([a, n])
        if run and res is not None:
            self._fold(t, d, run)
        return htod, dtoh, unplanned

    def _fold(self, t: int, direction: int, run: list[list[int]]) -> None:
        ranges = [(a, n) for a, n in run]
        if direction > 0:   # what lies in the managed allocations still there (not one freed since)
            self.residency.observe(self.allocs.clip(ranges), t)
        else:
            self.residency.release(ranges)

    def decide(self, t: int, la, values=None) -> Decision:
        """What to move before launch t. `values(address, nbytes) -> bytes | None`: the index values
        the launch's indexed regions read, once the launch that wrote them has ended (the
        predictor's `values`; None: none known, those regions get the fallback;
        the GPU runner reads them in gpu/cuda_engine.py)."""
        period = self.detector.observe(la.kernel)
        data = bytes(la.param_data or b"")
        rel = self.relocator
        if rel is not None and rel.matching:
            if not rel.observe(t, la.kernel, data):
                self.warn(f"the run no longer matches the trace ({rel.mismatch});"
                          " the oracle stops prefetching from here")
        ahead = self.ahead
        if ahead is not None and ahead is not rel and ahead.matching:
            ahead.observe(t, la.kernel, data)
        predicted, predict_s = None, None
        if self.predict is not None and (self.policy.predicts or self.residency is not None):
            p0 = time.perf_counter()
            predicted = self._predict(la, self.allocs) if values is None else self._predict(la, self.allocs, values)
            if not self._clipped:   # the online predictor's already are
                predicted = self.allocs.clip(predicted)
            predict_s = time.perf_counter() - p0
        view = LaunchView(t, la, data, self.allocs, predicted, rel, self.unit, self.laid_out)
        prefetch = self.policy.launch_prefetch(view)
        evict: list[tuple[int, int]] = []
        overflow = False
        res = self.residency
        if ahead is not None and self.compiled:
            if LOOKAHEAD_STEP == "compiled":
                d = self._window_step(t, view, prefetch, period, predicted, predict_s)
                if d is not None:
                    return d
            else:
                nxt = self._next_footprint(t)
                if nxt is not None or res is None:
                    return self._ahead_step(t, view, prefetch, nxt, period, predicted, predict_s)
        if res is not None and self.compiled:
            prefetch, evict, overflow = self._capacity_step(t, view, prefetch, period)
        elif res is not None:
            # with an emulated capacity the estimate knows what is already there: move only the rest
            # (pages the host touched in between fault back in; that costs time, never correctness).
            # What the launch needs is everything the policy wants there, resident or not: the
            # already-resident part must be admitted too, or its units could be chosen as victims.
            want = prefetch
            estimate, known = self._estimate(view, want)
            if known and self.policy.streams_front and len(units_of(estimate, self.unit)) > res.capacity_units:
                # a launch larger than memory streams through it: bring in only its first capacity's
                # worth (address order, as the residency estimate has it sweep), which it uses
                # before faulting and which its faults then evict; prefetching all of it would
                # leave only its last part resident, evicted by its first faults before use
                prefetch = res.missing(front_units(want, res.capacity_units, self.unit))
            else:
                prefetch = res.missing(want)
            admitted = merge_ranges(list(estimate) + list(want))
            if res.victim == "next-use":
                self._seq_next.record(t, units_of(admitted, self.unit))
            overflow_before = res.overflows
            # a footprint the decider knows streams through memory when larger than it; a guess may not
            evict = res.admit(admitted, t, streams=known)
            overflow = res.overflows > overflow_before
        return Decision(prefetch, evict, predicted, predict_s, overflow, period)

    def _window(self, t0: int, t1: int) -> tuple[np.ndarray, np.ndarray]:
        """The plan's footprints of launches t0 .. t1-1 in this run's addresses: (flat pairs, the
        pair index where each launch's start)."""
        if self._window_of is not None:
            return self._window_of(t0, t1)
        parts = [_flat_of(self.ahead.footprint_arrays(s)) for s in range(t0, t1)]
        wptr = np.zeros(len(parts) + 1, np.int64)
        np.cumsum([len(p) // 2 for p in parts], out=wptr[1:])
        return (np.concatenate(parts) if parts else np.zeros(0, np.int64)), wptr

    def _window_step(self, t: int, view: LaunchView, want, period, predicted, predict_s) -> Decision | None:
        """Launch t's decision with the plan's window (launches t + 1 .. its horizon, lookahead.py)
        brought in at its callback, in a few compiled calls: the window relocated, how much of it fits
        beside launch t (`window_fit`), one residency step for all of it (victims are none of theirs),
        and its prefetch split per launch (`split_groups`). None: launch t alone (no window, or not even
        the next launch fits beside it), by the capacity step."""
        ahead, res = self.ahead, self.residency
        hz = self._horizon
        h = t if not ahead.matching else (hz[t] if hz is not None and t < len(hz) else
                                          self.schedule.horizon_at(t, ahead.n))
        discard = self._dead(t) if self.discards and t in self._dead_at else None
        if res is None:   # no estimate: what went at an earlier callback is not asked for again
            sent = self._sent_at.pop(t, None)
            own = subtract_ranges(merge_ranges(list(want)), sent) if sent else list(want)
            groups = []
            lo = max(self._sent_upto, t) + 1
            if h >= lo:
                win, wptr = self._window(lo, h + 1)
                for j in range(h + 1 - lo):
                    flat = win[2 * wptr[j]:2 * wptr[j + 1]].tolist()
                    if flat:
                        r = list(zip(flat[0::2], flat[1::2]))
                        self._sent_at[lo + j] = r
                        groups.append((lo + j, r))
                self._sent_upto = h
            return _with_groups(Decision(own, [], predicted, predict_s, False, period, discard=discard), groups, h)
        estimate, known = self._estimate(view, want)
        if h <= t:
            return self._alone(t, view, want, period, predicted, predict_s, discard, (estimate, known))
        wf = want.flat if isinstance(want, RangeArrays) else _flat_of(want)
        if estimate is want:
            ef = own = wf
        else:
            ef = estimate.flat if isinstance(estimate, RangeArrays) else _flat_of(estimate)
            own = np.concatenate((ef, wf))
        if self._windows is None:
            self._windows = Windows(ahead, self.unit, res.capacity_units)
        m, win, wptr = self._windows.fit(t, h, own)
        if m == 0:   # not even the next launch fits beside this one: t alone
            return self._alone(t, view, want, period, predicted, predict_s, discard, (estimate, known))
        wn = win[:2 * int(wptr[m])]
        both_w = np.concatenate((wf, wn))
        both_e = both_w if ef is wf else np.concatenate((ef, wn))
        pf_flat, evict, overflow = self._capacity_step(t, view, RangeArrays(both_w), period,
                                                       estimate=(RangeArrays(both_e), known), flat=True)
        if not len(pf_flat):   # all of it resident: nothing to split
            return _with_groups(Decision([], evict, predicted, predict_s, overflow, period, discard=discard), [], t + m)
        out, gptr = self._windows.split(pf_flat, own, win, wptr, m)
        flat = out.tolist()
        g = gptr.tolist()
        g1 = 2 * g[1]
        first = list(zip(flat[0:g1:2], flat[1:g1:2]))
        groups = []
        if g[m + 1] > g[1]:   # the later launches' ranges (most callbacks have none: all resident)
            for j in range(1, m + 1):
                a, b = 2 * g[j], 2 * g[j + 1]
                if b > a:
                    groups.append((t + j, list(zip(flat[a:b:2], flat[a + 1:b:2]))))
        return _with_groups(Decision(first, evict, predicted, predict_s, overflow, period, discard=discard),
                            groups, t + m)

    def _alone(self, t, view, want, period, predicted, predict_s, discard, estimate) -> Decision:
        prefetch, evict, overflow = self._capacity_step(t, view, want, period, estimate=estimate)
        return Decision(prefetch, evict, predicted, predict_s, overflow, period, discard=discard)

    def _dead(self, t: int) -> list | None:
        """The ranges of this run whose data is dead at launch t's callback (lookahead.py's `dead`),
        while the run matches the trace; each dropped from the residency estimate (they take no room
        once discarded)."""
        sched = self.schedule
        if sched is None or sched.dead is None:
            return None
        ids = sched.dead_at(t)
        if not len(ids):
            return None
        truth = self.relocator if self.relocator is not None else self.ahead
        if not truth.matching:
            return None
        out = []
        for j in ids.tolist():
            r = truth.run_range(j)
            if r is None:
                continue
            a = self.allocs.cached(r[0])
            if a is None or a.base != r[0] or a.size != r[1] or not a.managed:
                continue
            out.append(r)
        if out and self.residency is not None:
            self.residency.release(out)
        return out or None

    def _next_footprint(self, t: int) -> RangeArrays | None:
        """Launch t + 1's planned footprint in this run's addresses (what its allocations known so
        far cover), or None: no next launch, one never prefetched early, or the run left the plan."""
        ahead = self.ahead
        if not ahead.matching or t + 1 >= ahead.n or (t + 1) in self.ahead_skip:
            return None
        nxt = ahead.footprint_arrays(t + 1)
        return nxt if nxt else None

    def _ahead_step(self, t: int, view: LaunchView, want, nxt: RangeArrays | None, period, predicted,
                    predict_s) -> Decision:
        """Launch t's decision with the next launch's footprint brought in one launch early. With an
        emulated capacity, only when both launches fit together: one residency step admits both
        (victims are neither's), and its prefetch is split into launch t's units and the rest."""
        res = self.residency
        if res is None:   # no estimate: what went at the previous callback is not asked for again
            sent = self._sent if self._sent is not None and self._sent[0] == t else None
            own = subtract_ranges(merge_ranges(list(want)), sent[1]) if sent else list(want)
            self._sent = (t + 1, nxt.tolist()) if nxt is not None else None
            return Decision(own, [], predicted, predict_s, False, period,
                            ahead=self._sent[1] if self._sent else None, ahead_t=t + 1)
        estimate, known = self._estimate(view, want)
        own = _flat_of(estimate) if estimate is not want else _flat_of(want)
        both_w = np.concatenate([_flat_of(want), nxt.flat])
        both_e = np.concatenate([own, nxt.flat]) if estimate is not want else both_w
        if _units_count(both_e, self.unit) > res.capacity_units:   # they do not fit together: t alone
            prefetch, evict, overflow = self._capacity_step(t, view, want, period)
            return Decision(prefetch, evict, predicted, predict_s, overflow, period)
        pf, evict, overflow = self._capacity_step(t, view, RangeArrays(both_w), period,
                                                  estimate=(RangeArrays(both_e), known))
        mine = _units_set(own, self.unit) | _units_set(_flat_of(want), self.unit)
        first, later = [], []
        for a, n in pf:
            for u0, part in _by_unit(a, n, self.unit):
                (first if u0 in mine else later).append(part)
        return Decision(merge_ranges(first), evict, predicted, predict_s, overflow, period,
                        ahead=merge_ranges(later), ahead_t=t + 1)

    def _capacity_step(self, t: int, view: LaunchView, want, period, estimate=None, flat: bool = False
                       ) -> tuple[list, list, bool]:
        """The reference's capacity branch (decide, below it), as one UnitResidency step: the
        prefetch (its front when the launch is larger than memory and the policy streams), the
        uses recorded for next-use, the admission and its victims."""
        res = self.residency
        estimate, known = self._estimate(view, want) if estimate is None else estimate
        last = self._last
        predicted = view.predicted
        if last is not None and predicted is not None and (want is predicted or not want) \
                and (estimate is predicted or estimate is want):
            # the prediction's ranges where the predictor left them (template: all of it)
            src, at, n = last.st, last.out_at, len(predicted)
            wspec = (at << 24) | n if want is predicted else 0
            espec = -1 if estimate is want else (at << 24) | n
        else:
            w = want.flat if isinstance(want, RangeArrays) else [x for r in want for x in r]
            e = ([] if estimate is want else estimate.flat if isinstance(estimate, RangeArrays)
                 else [x for r in estimate for x in r])
            if len(w) + len(e) > len(self._inbuf):
                self._inbuf = np.zeros(2 * (len(w) + len(e)), np.int64)
            src = self._inbuf
            src[:len(w)] = w
            src[len(w):len(w) + len(e)] = e
            wspec = len(w) // 2
            espec = -1 if estimate is want else ((len(w) << 24) | (len(e) // 2))
        if len(want) >= RK.MAX_RANGES or len(estimate) >= RK.MAX_RANGES:   # counts are 24 bits
            raise ValueError(f"more than {RK.MAX_RANGES} ranges in one launch's residency step")
        flags = self._flags | (RK.FL_KNOWN if known else 0) | ((0 if period is None else period + 1) << 8)
        r = res.step_arrays(src, wspec, espec, t, flags)
        npf, nev = r & 0xFFFFFF, (r >> 24) & 0xFFFFFF
        io = res.io_at
        if flat:   # the prefetch as its flat array (the lookahead's split takes it)
            ev = res.rs[io + 2 * npf:io + 2 * (npf + nev)].tolist() if nev else []
            return (res.rs[io:io + 2 * npf].copy(), list(zip(ev[0::2], ev[1::2])), bool(r >> 48))
        out = res.rs[io:io + 2 * (npf + nev)].tolist()
        pf = list(zip(out[0:2 * npf:2], out[1:2 * npf:2]))
        return pf, (list(zip(out[2 * npf::2], out[2 * npf + 1::2])) if nev else []), bool(r >> 48)

    def _estimate(self, view: LaunchView, want) -> tuple[list[tuple[int, int]], bool]:
        """What the launch will touch, for the residency estimate (see the module docstring), and
        whether that is known (the trace's footprint or a prediction) rather than guessed (the
        allocations its pointers point into).

        `want`: everything the policy prefetches for it (before subtracting what is resident)."""
        if view.relocator is not None and view.relocator.matching:
            if self.policy.prefetches_footprint:
                return want, True
            return view.relocated_footprint(), True
        if view.predicted is not None:
            return view.predicted, True
        return view.allocation_ranges(), False


class _OneAtATime:
    """A scorer's `score` alone (the residency then scores candidates one Python call each, as the
    lookahead's Python step did)."""

    def __init__(self, scorer) -> None:
        self.score = scorer.score


def _with_groups(d: Decision, groups: list, upto: int) -> Decision:
    """`d` with the later launches' groups (`ahead_groups`: those with ranges to move), all their
    ranges (`ahead`) and the window's last launch (`ahead_upto`)."""
    d.ahead_upto = upto
    if groups:   # the groups' ranges are disjoint (each unit goes with one launch), each in address order
        d.ahead_groups = groups
        d.ahead = [r for _, rs in groups for r in rs]
        d.ahead_t = groups[0][0]
    return d


def _flat_of(ranges) -> np.ndarray:
    if isinstance(ranges, RangeArrays):
        return ranges.flat
    return np.array([x for r in ranges for x in r], np.int64)


def _units_set(flat: np.ndarray, unit: int) -> set[int]:
    out: set[int] = set()
    for a, n in zip(flat[0::2].tolist(), flat[1::2].tolist()):
        if n > 0:
            out.update(range(a // unit, (a + n - 1) // unit + 1))
    return out


def _units_count(flat: np.ndarray, unit: int) -> int:
    return len(_units_set(flat, unit))


def _by_unit(a: int, n: int, unit: int):
    """(unit, (address, nbytes)) for each unit's part of one range."""
    end = a + n
    while a < end:
        u = a // unit
        b = min(end, (u + 1) * unit)
        yield u, (a, b - a)
        a = b
