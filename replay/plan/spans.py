"""The planner's span: what a plan is made on (units, whole 2 MiB blocks, blocks where widening
pays, whole allocations), and `choose_span`, which keeps the plan that runs fastest in trial runs.

The trial runs are the simulator's; the planner does not import it: the caller
passes `trial(groups, needs) -> run` (policies/base.py's `plan_trial` builds one
from a simulator function), or None to plan at the first span without trials.
"""

from __future__ import annotations

import threading
from collections import namedtuple
from contextlib import nullcontext
from typing import Any, Callable

import numpy as np
from numba import njit

from pagecast import footprints as F

from ..unit_space import I64, Needs, Workload, attach_after, unit_intervals
from . import plan_io
from .belady import plan_groups
from .faults import leave_to_faults
from .fitted import fitted_needs
from .groups import Groups

# What choose_span keeps of a trial run when its caller wants only the times (`whole_run=False`): the
# launches' starts and ends, what leave_to_faults and best_plan read (a whole run also holds its
# counters, 13 int64 a launch: ~0.1 GB at 10^6 launches).
TrialTimes = namedtuple("TrialTimes", "start end")

PLAN_SPANS = plan_io.SPANS   # ("unit", "block", "fitted", "allocation"): a plan file names the one chosen
# spans judged together: the fitted span is the block span's plan narrowed where that plan says
# widening does not pay, a reading of reuse over the whole timeline that a sample of it cuts short
# (plan/sample.py judges such spans together on the whole timeline)
KIN = (("block", "fitted"),)


def kin(span: str) -> tuple[str, ...]:
    """`span` and the spans judged together with it (KIN), in PLAN_SPANS' order."""
    for group in KIN:
        if span in group:
            return group
    return (span,)


def span_needs(needs: Needs, span: str, w: Workload, cap_units: int | None = None, profile=None,
               start_step: int = 0, init_resident: np.ndarray | None = None, front: bool = False) -> Needs:
    """`needs` at a planning span, each coarser than the last (fewer, longer transfers;
    more bytes): "unit" as they are; "block" each step's units widened to the whole
    2 MiB VA blocks they lie in (the universe's units of them); "fitted" the block span
    narrowed back where its own plan (at `cap_units`, from `start_step` with
    `init_resident`) says widening does not pay under `profile` (plan/fitted.py);
    "allocation" with the whole allocations the launch's pointer parameters point into
    added (what the `alloc` baseline moves, known from the launch arguments as the
    predictions are)."""
    if span == "fitted":
        if cap_units is None or profile is None:
            raise ValueError("the fitted span needs the capacity and the cost profile (its block plan's)")
        bn = span_needs(needs, "block", w)
        g = plan_groups(bn, w.universe.n_units, cap_units, start_step=start_step, init_resident=init_resident,
                        belady_in=True, universe=w.universe, front=front)
        # the uses' index values carried over, as choose_span makes the span
        return attach_after(fitted_needs(g, bn, needs, w, profile), needs, w.universe.block_lo)
    if span == "unit":
        return needs
    n = len(needs.ptr) - 1
    if span == "block":
        u = w.universe
        ptr, units = widen_to_blocks(needs.ptr, needs.unit, u.block_lo, u.block_hi)
        if ptr is not None:
            return Needs(ptr, units)
        # each use's step (int64, 8 bytes a use): made only where the blocks are merged as intervals
        step = np.repeat(np.arange(n, dtype=I64), np.diff(needs.ptr))
        lid, s, e = F.merge_intervals(step, u.block_lo[needs.unit], u.block_hi[needs.unit], n)
        ptr = np.zeros(n + 1, I64)
        np.cumsum(np.bincount(lid, weights=e - s, minlength=n).astype(I64), out=ptr[1:])
        return Needs(ptr, F.expand_intervals(s, e).astype(I64, copy=False))
    if span == "allocation":
        step = np.repeat(np.arange(n, dtype=I64), np.diff(needs.ptr))
        a = alloc_needs(w)
        astep = np.repeat(np.arange(n, dtype=I64), np.diff(a.ptr))
        m = I64(w.universe.n_units + 1)
        key = np.concatenate([step * m + needs.unit, astep * m + a.unit])
        key.sort()
        key = key[np.concatenate([[True], key[1:] != key[:-1]])] if len(key) else key
        ptr = np.zeros(n + 1, I64)
        np.cumsum(np.bincount(key // m, minlength=n), out=ptr[1:])
        return Needs(ptr, (key % m).astype(I64, copy=False))
    raise ValueError(f"unknown plan span {span!r}; known: {', '.join(PLAN_SPANS)}")


def widen_to_blocks(ptr: np.ndarray, unit: np.ndarray, block_lo: np.ndarray, block_hi: np.ndarray):
    """Each step's units widened to the whole blocks they lie in: (ptr, units), or (None, None)
    where a step's units are not ascending (then the caller merges intervals). Blocks are runs of
    consecutive ids, ascending with the ids (unit_space.Universe), so ascending units meet their
    blocks in order and a step's blocks are written as met: two passes over the units (count,
    then write), memory for the result only (the interval merge sorted copies of every use:
    what the block span of 10^6 launches peaked on)."""
    out_ptr = _blocks_count(ptr, unit, block_lo, block_hi)   # either width (unit_space.narrow): no copy
    if out_ptr[0] < 0:
        return None, None
    return out_ptr, _blocks_fill(ptr, unit, block_lo, block_hi, out_ptr)


@njit(cache=True)
def _blocks_count(ptr, unit, block_lo, block_hi):
    n = len(ptr) - 1
    out = np.zeros(n + 1, np.int64)
    for s in range(n):
        c = 0
        hi = -1
        prev = -1
        for k in range(ptr[s], ptr[s + 1]):
            x = unit[k]
            if x < prev:
                out[0] = -1   # not ascending
                return out
            prev = x
            if block_lo[x] >= hi:
                hi = block_hi[x]
                c += hi - block_lo[x]
        out[s + 1] = out[s] + c
    return out


@njit(cache=True)
def _blocks_fill(ptr, unit, block_lo, block_hi, out_ptr):
    n = len(ptr) - 1
    out = np.empty(out_ptr[n], unit.dtype)   # ids of the same universe: the width of `unit`
    for s in range(n):
        j = out_ptr[s]
        hi = -1
        for k in range(ptr[s], ptr[s + 1]):
            x = unit[k]
            if block_lo[x] >= hi:
                hi = block_hi[x]
                for v in range(block_lo[x], hi):
                    out[j] = v
                    j += 1
    return out


def alloc_needs(w: Workload) -> Needs:
    """Per step, the units of the whole allocations its pointer parameters point into."""
    return w.kept("alloc", lambda: w.needs_from([t.alloc_fp for t in w.tasks]))


def alloc_units(w: Workload) -> int:
    """len(alloc_needs(w).unit), without building them when they are not built yet."""
    a = w.extra.get("alloc")
    return int(alloc_touches(w).sum()) if a is None else len(a.unit)


def alloc_touches(w: Workload) -> np.ndarray:
    """Per step, how many units the whole allocations its pointer parameters point into hold (the
    sizes of alloc_needs(w)'s steps, counted without building them), made once and kept in
    `w.extra` (a sample of the timeline cuts it: plan/sample.py)."""
    def make():
        per = []
        for t in w.tasks:
            launch, s, e = unit_intervals(t.alloc_fp, w.gran)
            per.append(np.bincount(launch, weights=e - s, minlength=t.alloc_fp.n_launches).astype(I64))
        first = np.cumsum([0] + [len(x) for x in per])[:-1]
        return np.concatenate(per)[first[w.step_task] + w.step_launch] if per else np.zeros(w.n_steps, I64)
    return w.kept("alloc_touches", make)


def needs_fingerprint(n: Needs) -> tuple:
    """Sizes and a 128-bit hash of a Needs' steps and units: choose_span's test that a wider span named
    nothing new, without holding every span's needs at once (10^6 launches: hundreds of MB each)."""
    return _fingerprint((n.ptr, n.unit))


def plan_fingerprint(g: Groups) -> tuple:
    """Sizes and a 128-bit hash of the arrays `groups.same_plan` compares: choose_span's test that a
    span's plan with fronts is the plan without, without holding the one while the other is made."""
    return _fingerprint([getattr(g, f) for f in PLAN_FIELDS])


PLAN_FIELDS = ("ev_ptr", "ev_unit", "pf_ptr", "pf_unit", "need_now", "wait_prev", "need_group", "gate")   # same_plan's


def _fingerprint(arrays) -> tuple:
    """The arrays' sizes and a 128-bit hash of their values in order, each read as int64 whatever
    the width it is held in (unit_space.narrow), in one compiled pass that copies nothing (blake2b
    over an int64 copy of each piece was a fourteenth of a scale-10 replay's time). Two lanes of
    xxHash64's round over each value, each lane with its own primes; not cryptographic: the arrays
    are the planner's own, never chosen to collide."""
    h = np.array([_SEED1, _SEED2], np.uint64)
    for a in arrays:
        _hash_values(np.ascontiguousarray(a), h)
    return tuple(len(a) for a in arrays) + (f"{int(h[0]):016x}{int(h[1]):016x}",)


_SEED1, _SEED2 = 0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F


@njit(cache=True, nogil=True)
def _hash_values(a, h):
    p1 = np.uint64(0x9E3779B185EBCA87)
    p2 = np.uint64(0xC2B2AE3D27D4EB4F)
    p3 = np.uint64(0x165667B19E3779F9)
    p4 = np.uint64(0x85EBCA77C2B2AE63)
    r31 = np.uint64(31)
    r33 = np.uint64(33)
    r27 = np.uint64(27)
    r37 = np.uint64(37)
    h1 = h[0]
    h2 = h[1]
    for i in range(len(a)):
        x = np.uint64(np.int64(a[i]))   # the value as int64, its bits as uint64 (wrapping arithmetic)
        h1 = h1 + x * p2
        h1 = ((h1 << r31) | (h1 >> r33)) * p1
        h2 = h2 ^ (x * p4)
        h2 = ((h2 << r27) | (h2 >> r37)) * p3
    h[0] = h1
    h[1] = h2


SPAN_GROWTH = 8   # a wider span is tried only while it names at most this many times the units
# choose_span holds the block span's plan and needs (rather than make them again) up to this size: a
# few seconds of planning at 10^5 launches against what two runs planning at once may hold at 10^6
# (docs/performance.md, "Two rounds, runs at once")
HOLD_BYTES = 128 << 20

# Judging spans on the whole timeline of a long profile holds several times its needs (the needs at
# each span, a plan, its trial run): where a sweep's runs go at once, two such judgings at once made
# the replay's peak at 10^6 launches (docs/performance.md, "One large judging at a time", with the
# sizes measured). Needs of more than ALONE_BYTES are judged one at a time, smaller ones at once.
ALONE_BYTES = 64 << 20
_ALONE = threading.Lock()


def _nbytes(*objs) -> int:
    """The bytes of the arrays the records `objs` hold (plans, needs)."""
    return sum(v.nbytes for o in objs for v in vars(o).values() if isinstance(v, np.ndarray))


def choose_span(w: Workload, needs: Needs, cap_units: int, spans: tuple[str, ...] = PLAN_SPANS,
                fronts: tuple[bool, ...] = (False, True),
                trial: Callable[[Groups, Needs], Any] | None = None, profile=None,
                faults: bool = True, whole_run: bool = True, choice_only: bool = False,
                always_try: bool = False) -> tuple:
    """Plan `needs` at each span and keep the plan that runs fastest when `needs`
    are what the launches touch: the planner's own view of the future (predictions
    for template, the truth for oracle), never anything it could not know.
    `trial(plan, needs at its span)` runs a plan so (a simulator run; its `end[-1]`
    is the time); None (no cost profile) keeps the first span. Ties keep the
    earlier span. Where a launch is larger than memory, each span is also planned
    with each of `fronts` (plan_groups' `front`: such a launch's first units
    brought in before it), ties keeping the earlier. The `fitted` span is made from
    the block span's plan (plan/fitted.py; it needs `profile`, and "block" before it
    in `spans` to be tried). With `faults`, the fastest plan is then tried with the
    transfers its trial run has time to fault left to faults (plan/faults.py), kept
    if faster. Returns (span, needs at that span, plan, the winning trial run or None);
    the plan's `front` and `faulted` say which. When `needs` are the truth, the
    winning trial run is the run itself (the simulator then does not run it again). Without
    `whole_run`, only the winning run's times are kept and returned (TrialTimes), and a losing
    run goes before the next trial.

    No plan is held while the next is made but one: what is kept of the fastest so far is how it
    was made (its span and front) with its time and run, and unless it is the last one made it is
    made again at the end (`_plan_at`; the planner is deterministic, so it is the plan that would
    have been kept). The one: the block span's plan without fronts, which the fitted span is made
    from, so it is held while the fitted span's needs are made; where it is the fastest so far it
    is held on through the fitted span's plan and trial instead of being made again after them,
    where plan and needs are at most HOLD_BYTES (21-27 MiB at 10^5 launches, where the peaks
    measured did not rise; about ten times that at 10^6, made again there: docs/performance.md,
    "Two rounds, runs at once").

    With `always_try`, one span with one front is tried too (and what its trial has time to fault
    left to faults where faster), as where it is one of several: the comparison that narrowed the
    spans to it was made elsewhere (sample.py). With `choice_only`, returns every plan tried as (its
    trial's time, span, front), in the order tried, with nothing made again and nothing left to
    faults (sample.py ranks candidates so).

    Needs of more than ALONE_BYTES are judged one at a time where runs go at once (`_ALONE`; a
    narrowing on a sample, `choice_only`, is not held back)."""
    with _ALONE if not choice_only and _nbytes(needs) > ALONE_BYTES else nullcontext():
        return _choose_span(w, needs, cap_units, spans, fronts, trial, profile, faults, whole_run, choice_only,
                            always_try)


def _choose_span(w: Workload, needs: Needs, cap_units: int, spans: tuple[str, ...] = PLAN_SPANS,
                 fronts: tuple[bool, ...] = (False, True),
                 trial: Callable[[Groups, Needs], Any] | None = None, profile=None,
                 faults: bool = True, whole_run: bool = True, choice_only: bool = False,
                 always_try: bool = False) -> tuple:
    """choose_span's work (its doc)."""
    best = None   # (span, front, time, run) of the fastest plan so far: how it was made, not the plan
    made = None   # (span, front, its needs, its plan) of the plan made last
    tried: list[tuple] = []   # fingerprints of the needs planned so far (the needs themselves are let go)
    ranked: list[tuple] = []  # (time, span, front) of every plan tried (`choice_only`)
    limit = max(SPAN_GROWTH * len(needs.unit), 1)
    block = None   # the block span's plan without fronts, and its needs (what `fitted` reads)
    held = None    # (span, front, needs, plan) of the fastest so far where that is the block span's (below)
    for k, span in enumerate(spans):
        last = k == len(spans) - 1 and best is None   # nothing planned yet: this one is planned whatever it costs
        if span == "allocation" and alloc_units(w) > limit and not last:
            continue  # many times the units to plan (launches pointing into one huge allocation)
        if span == "fitted":
            if block is not None and profile is not None:
                made = None   # the plan made before goes (`block` keeps the block span's without fronts)
                sn = attach_after(fitted_needs(block[0], block[1], needs, w, profile), needs, w.universe.block_lo)
                # the block span's plan is the fastest so far: held, not made again at the end (where
                # small: HOLD_BYTES)
                held = ("block", False, block[1], block[0]) \
                    if best is not None and best[:2] == ("block", False) and _nbytes(*block) <= HOLD_BYTES else None
                block = None   # read by nothing after this: its needs go unless its plan is the best so far
            elif last:
                made = None
                sn = span_needs(needs, span, w, cap_units, profile)
            else:
                continue   # made from the block span's plan, which was not made (or was the unit plan)
        else:
            made = None   # the plan made before goes before this span's needs are made
            sn = span_needs(needs, span, w)
        if tried and len(sn.unit) > limit and not last:
            continue
        fp = needs_fingerprint(sn)
        if fp in tried:
            continue  # widening added nothing: the same plan
        tried.append(fp)
        # launches larger than memory: also the plan that brings their front in first
        tries = fronts if trial is not None and len(sn.ptr) > 1 and \
            int(np.diff(sn.ptr).max()) > cap_units else fronts[:1]
        plans: list[tuple] = []   # fingerprints of this span's plans (a plan goes before the next is made)
        for front in tries:
            made = None   # (the block span's plan is still `block` where the fitted span reads it)
            g = plan_groups(sn, w.universe.n_units, cap_units, belady_in=True, universe=w.universe, front=front)
            if span == "block" and not front:
                block = (g, sn)
            if trial is None or (len(spans) == 1 and len(tries) == 1 and not always_try):
                return [(0.0, span, front)] if choice_only else (span, sn, g, None)
            fg = plan_fingerprint(g)
            if fg in plans:
                del g
                continue   # no launch's front changed anything: the same run
            plans.append(fg)
            r = trial(g, sn)
            t = float(r.end[-1]) if len(r.end) else 0.0
            ranked.append((t, span, front))
            if best is None or t < best[2]:
                best = (span, front, t, r if whole_run else TrialTimes(r.start, r.end))
                held = None
            made = (span, front, sn, g)
            del r, g   # a loser's run goes before the next trial and plan
    block = sn = None
    if choice_only:
        return ranked
    if made is not None and made[:2] == best[:2]:
        span, front, sn, g = made
    elif held is not None and held[:2] == best[:2]:
        span, front, sn, g = held
    else:
        made = None   # the last plan goes before the fastest is made again
        span, front = best[:2]
        sn, g = _plan_at(w, needs, span, front, cap_units, profile)
    made = None
    t, run = best[2:]
    if faults and profile is not None:
        fg = leave_to_faults(g, sn, needs, run, profile, w.gran)
        if fg is not None:
            r = trial(fg, sn)
            ft = float(r.end[-1]) if len(r.end) else 0.0
            if ft < t:
                g, run = fg, r if whole_run else TrialTimes(r.start, r.end)
            del r
    return span, sn, g, run


def _plan_at(w: Workload, needs: Needs, span: str, front: bool, cap_units: int, profile) -> tuple[Needs, Groups]:
    """(needs at `span`, Belady's plan of them with `front`): the plan choose_span made at that span,
    made again as it made it (the fitted span from the block span's plan without fronts)."""
    sn = span_needs(needs, span, w, cap_units, profile)
    return sn, plan_groups(sn, w.universe.n_units, cap_units, belady_in=True, universe=w.universe, front=front)
