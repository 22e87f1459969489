"""The trace-driven UVM simulator: policies, the planner, runs and sweeps.

A run replays a `Workload` (one or more traces, scheduled on one GPU) under a
policy at one capacity and charges time from a cost profile. Every policy
shares one memory model (sim_core): units resident or not, eviction chunks in
a FIFO (allocation order, the driver's) or LRU list, faults per missing unit,
the tree prefetcher. Policies differ in what they move before each launch.

Policies are small objects with named hooks, in libCacheSim's spirit:
- `prefetch(ctx) -> Groups | None`: the transfers (evictions, then prefetches
  in need order) to issue before each step; policies see the whole timeline
  (which task runs next and its upcoming launches), so they plan it at once;
- `on_launch(ctx, step) -> (evict_units, prefetch_units[, wait]) | None`: called
  before every step, when `wants_launches`, for policies that decide online;
- `on_miss(ctx, step, missed_units) -> Groups | None`: called after a step
  that faulted, when `wants_misses`; may re-plan the steps after it;
- `on_evict(ctx, step, evicted_units)`: called after a step that evicted
  units (its group's or its faults', still gone at its end), when `wants_evictions`;
- `evict_order`: how fault-path evictions pick victims ("fifo", "lru", or
  None for the run's `--eviction`); planned policies first evict units the
  plan does not count on (brought in by faults).
Registered by name in POLICIES.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from pagecast import footprints as F
from pagecast.errors import UsageError

from . import plan_io
from . import sim_core as C
from .workload import I64, Needs, Workload

# ---- planned transfers -----------------------------------------------------------


@dataclass
class Groups:
    """Per step: units to evict, then units to prefetch (need order)."""

    ev_ptr: np.ndarray
    ev_unit: np.ndarray
    pf_ptr: np.ndarray
    pf_unit: np.ndarray
    need_now: np.ndarray     # prefetch entries of the group its own step needs
    wait_prev: np.ndarray    # uint8: the group evicts units of the step before: start after it ends
    blocking: np.ndarray     # uint8: the launch waits for the whole group (swapping)
    thrash: np.ndarray       # uint8: the planner could not fit the step
    need_group: np.ndarray | None = None  # per step: latest earlier group prefetching a unit it needs (-1: none)
    front: bool = False      # planned with launches larger than memory getting their front first (belady_plan)

    def __post_init__(self) -> None:
        if self.need_group is None:
            self.need_group = np.full(len(self.need_now), -1, I64)

    @property
    def n_steps(self) -> int:
        return len(self.need_now)

    @classmethod
    def empty(cls, n: int) -> "Groups":
        z = np.zeros(n + 1, I64)
        return cls(z, np.zeros(0, I64), z.copy(), np.zeros(0, I64), np.zeros(n, I64), np.zeros(n, np.uint8),
                   np.zeros(n, np.uint8), np.zeros(n, np.uint8))

    def splice(self, other: "Groups", s: int) -> "Groups":
        """Steps < s from self, steps >= s from other (a full-length Groups)."""
        def cat(ptr_a, u_a, ptr_b, u_b):
            head = u_a[:ptr_a[s]]
            tail = u_b[ptr_b[s]:]
            ptr = np.concatenate([ptr_a[:s + 1], ptr_b[s + 1:] - ptr_b[s] + ptr_a[s]])
            return ptr, np.concatenate([head, tail])
        ev_ptr, ev = cat(self.ev_ptr, self.ev_unit, other.ev_ptr, other.ev_unit)
        pf_ptr, pf = cat(self.pf_ptr, self.pf_unit, other.pf_ptr, other.pf_unit)
        j = lambda a, b: np.concatenate([a[:s], b[s:]])
        return Groups(ev_ptr, ev, pf_ptr, pf, j(self.need_now, other.need_now), j(self.wait_prev, other.wait_prev),
                      j(self.blocking, other.blocking), j(self.thrash, other.thrash),
                      j(self.need_group, other.need_group), self.front)


LOOKAHEAD_STEPS = 1 << 20


def plan_groups(needs: Needs, n_units: int, cap_units: int, start_step: int = 0,
                init_resident: np.ndarray | None = None, lookahead_steps: int = LOOKAHEAD_STEPS,
                lookahead_units: int | None = None, belady_in: bool = False, universe=None,
                front: bool = False) -> Groups:
    """Belady on (predicted) needs: see sim_core.belady_plan. Full-length Groups.
    `belady_in`: the run gives a launch larger than memory the next uses of its
    units (`next_use_of`), so it ends holding those needed soonest. `front`: such
    a launch's first units come in before it in place of those it needs last."""
    n = len(needs.ptr) - 1
    res = np.zeros(n_units, np.uint8) if init_resident is None else init_resident.astype(np.uint8)
    la_units = cap_units if lookahead_units is None else lookahead_units
    want = None
    if belady_in and universe is not None:
        # a fault's eviction in such a launch: a chunk's worth, at most all of memory (as sim_core runs it)
        csize = (universe.chunk_hi - universe.chunk_lo)[universe.unit_chunk]
        want = np.minimum(csize, max(cap_units, 1)).astype(I64)
    ev_ptr, ev, pf_ptr, pf, nn, wp, th, ng = C.belady_plan(needs.ptr, needs.unit, n_units, cap_units, start_step,
                                                           res, lookahead_steps, la_units, belady_in, want,
                                                           None if want is None else universe.block_lo, front)
    pad = np.zeros(start_step, I64)
    ng = np.where(ng >= 0, ng + start_step, -1)
    return Groups(np.concatenate([pad, ev_ptr]), ev, np.concatenate([pad, pf_ptr]), pf,
                  np.concatenate([pad, nn]), np.concatenate([pad.astype(np.uint8), wp]),
                  np.zeros(n, np.uint8), np.concatenate([pad.astype(np.uint8), th]),
                  np.concatenate([pad - 1, ng]), front)


# ---- the run context -------------------------------------------------------------


@dataclass
class Options:
    eviction: str = "fifo"             # fault-path victim order
    driver_prefetch: bool = True       # the tree prefetcher
    feedback: bool = False


class Memory:
    """The GPU's residency state for one run (numpy arrays, mutated by sim_core)."""

    def __init__(self, w: Workload, cap_units: int):
        u = w.universe
        self.cap = int(cap_units)
        self.resident = np.zeros(u.n_units, np.uint8)
        self.planned = np.zeros(u.n_units, np.uint8)
        self.chunk_count = np.zeros(u.n_chunks, I64)
        self.prev = np.full(u.n_chunks + 1, -1, I64)
        self.nxt = np.full(u.n_chunks + 1, -1, I64)
        self.prev[u.n_chunks] = u.n_chunks
        self.nxt[u.n_chunks] = u.n_chunks
        self.st = np.zeros(1, I64)
        self.uq = np.zeros(max(u.n_units, 1), I64)
        self.uq_state = np.zeros(2, I64)


@dataclass
class Context:
    """What a policy sees: the workload (timeline, true needs), capacity, options,
    memory, and the cost profile (planned policies simulate their candidate plans)."""

    w: Workload
    cap_units: int
    options: Options
    memory: Memory | None = None
    state: dict = field(default_factory=dict)
    profile: Any = None


class Policy:
    """A policy's hooks (override what it needs; see the module doc). The per-step hooks
    cost a Python call per launch, so the built-in policies plan in `prefetch` instead."""

    name = ""
    description = ""
    evict_order: str | None = None
    wants_misses = False      # on_miss after each launch that faulted
    wants_launches = False    # on_launch before every launch
    wants_evictions = False   # on_evict after every launch that evicted units

    def prefetch(self, ctx: Context) -> Groups | None:
        """The planned transfers before every step, at once (the whole timeline is known)."""
        return None

    def on_launch(self, ctx: Context, step: int) -> tuple | None:
        """Before step `step` (before its planned group, if any): (units to evict, units to
        prefetch in need order[, wait]), issued like a planned group; the launch waits for the
        prefetches. The group overlaps the launch before unless `wait` (default: it evicts a
        unit that launch touches)."""
        return None

    def on_miss(self, ctx: Context, step: int, missed: np.ndarray) -> Groups | None:
        """After step `step` faulted on `missed` units: a full-length plan to follow from the
        next step on, or None."""
        return None

    def on_evict(self, ctx: Context, step: int, evicted: np.ndarray) -> None:
        """Units that left the GPU during step `step` (its group, its launch's faults) and were
        not back by its end (the tree prefetcher may return one within the step)."""
        return None


class Demand(Policy):
    name = "demand"
    description = "UVM demand paging: a fault per missing big page, evictions by 2 MiB chunk (FIFO or LRU)"


class Planned(Policy):
    """Follows a Belady plan made on some needs (predicted, allocation-level or true),
    at the span (PLAN_SPANS) whose plan the policy's own needs say is fastest."""

    spans: tuple[str, ...] | None = None   # None: every one of PLAN_SPANS
    fronts: tuple[bool, ...] = (False, True)   # plans tried for launches larger than memory (plan_groups)

    def needs(self, ctx: Context) -> Needs:
        raise NotImplementedError

    def prefetch(self, ctx: Context) -> Groups:
        trial: list = []
        span, needs, g = choose_span(ctx.w, self.needs(ctx), ctx.cap_units, ctx.profile, ctx.options,
                                     self.spans or PLAN_SPANS, trial, self.fronts)
        ctx.state["plan_needs"] = needs
        ctx.state["plan_span"] = span
        ctx.state["plan_front"] = g.front
        if trial:
            ctx.state["trial_run"] = trial[0]
        return g


# ---- the planner's span ----------------------------------------------------------

PLAN_SPANS = plan_io.SPANS   # ("unit", "block", "allocation"): a plan file names the one chosen


def span_needs(needs: Needs, span: str, w: Workload) -> Needs:
    """`needs` at a planning span, each coarser than the last (fewer, longer transfers;
    more bytes): "unit" as they are; "block" each step's units widened to the whole
    2 MiB VA blocks they lie in (the universe's units of them); "allocation" with the
    whole allocations the launch's pointer parameters point into added (what the
    `alloc` baseline moves, known from the launch arguments as the predictions are)."""
    if span == "unit":
        return needs
    n = len(needs.ptr) - 1
    step = np.repeat(np.arange(n, dtype=I64), np.diff(needs.ptr))
    if span == "block":
        u = w.universe
        lid, s, e = F.merge_intervals(step, u.block_lo[needs.unit], u.block_hi[needs.unit], n)
        ptr = np.zeros(n + 1, I64)
        np.cumsum(np.bincount(lid, weights=e - s, minlength=n).astype(I64), out=ptr[1:])
        return Needs(ptr, F.expand_intervals(s, e).astype(I64))
    if span == "allocation":
        a = alloc_needs(w)
        astep = np.repeat(np.arange(n, dtype=I64), np.diff(a.ptr))
        m = I64(w.universe.n_units + 1)
        key = np.concatenate([step * m + needs.unit, astep * m + a.unit])
        key.sort()
        key = key[np.concatenate([[True], key[1:] != key[:-1]])] if len(key) else key
        ptr = np.zeros(n + 1, I64)
        np.cumsum(np.bincount(key // m, minlength=n), out=ptr[1:])
        return Needs(ptr, (key % m).astype(I64))
    raise ValueError(f"unknown plan span {span!r}; known: {', '.join(PLAN_SPANS)}")


def alloc_needs(w: Workload) -> Needs:
    """Per step, the units of the whole allocations its pointer parameters point into."""
    if "alloc" not in w.extra:
        w.extra["alloc"] = w.needs_from([t.alloc_fp for t in w.tasks])
    return w.extra["alloc"]


def _alloc_touches(w: Workload) -> int:
    """len(alloc_needs(w).unit), without building them when they are not built yet."""
    if "alloc" in w.extra:
        return len(w.extra["alloc"].unit)
    return sum(unit_touches(t.alloc_fp, w.gran) for t in w.tasks)


class _Given(Policy):
    """A plan already made (for choose_span's trial runs)."""

    def __init__(self, groups: Groups, needs: Needs):
        self.groups, self.plan_needs = groups, needs

    def prefetch(self, ctx):
        ctx.state["plan_needs"] = self.plan_needs
        return self.groups


SPAN_GROWTH = 8   # a wider span is tried only while it names at most this many times the units


def choose_span(w: Workload, needs: Needs, cap_units: int, profile, options: Options,
                spans: tuple[str, ...] = PLAN_SPANS, trial: list | None = None,
                fronts: tuple[bool, ...] = (False, True)) -> tuple[str, Needs, Groups]:
    """Plan `needs` at each span and keep the plan that runs fastest when `needs`
    are what the launches touch: the planner's own view of the future (predictions
    for template, the truth for oracle), never anything it could not know. Ties
    and a missing profile keep the earlier span. Where a launch is larger than memory,
    each span is also planned with each of `fronts` (plan_groups' `front`: such a
    launch's first units brought in before it), ties keeping the earlier. Returns
    (span, needs at that span, plan; the plan's `front` says which). When `needs`
    are the truth, the winning trial run is the run itself: it is put in `trial`
    (run_policy then does not run it again)."""
    best = None
    tried: list[Needs] = []
    view = None
    limit = max(SPAN_GROWTH * len(needs.unit), 1)
    for span in spans:
        if span == "allocation" and _alloc_touches(w) > limit:
            continue  # many times the units to plan (launches pointing into one huge allocation)
        sn = span_needs(needs, span, w)
        if tried and len(sn.unit) > limit:
            continue
        if any(np.array_equal(sn.ptr, o.ptr) and np.array_equal(sn.unit, o.unit) for o in tried):
            continue  # widening added nothing: the same plan
        tried.append(sn)
        # launches larger than memory: also the plan that brings their front in first
        tries = fronts if profile is not None and len(sn.ptr) > 1 and \
            int(np.diff(sn.ptr).max()) > cap_units else fronts[:1]
        plans: list[Groups] = []
        for front in tries:
            g = plan_groups(sn, w.universe.n_units, cap_units, belady_in=True, universe=w.universe, front=front)
            if profile is None or (len(spans) == 1 and len(tries) == 1):
                return span, sn, g
            if any(_same_plan(g, o) for o in plans):
                continue   # no launch's front changed anything: the same run
            plans.append(g)
            if view is None:
                view = copy.copy(w)
                view.truth, view.extra = needs, {}
            r = run_policy(view, _Given(g, sn), cap_units, profile, options)
            t = float(r.end[-1]) if len(r.end) else 0.0
            if best is None or t < best[3]:
                best = (span, sn, g, t, r)
    if trial is not None and needs is w.truth:
        trial.append(best[4])
    return best[0], best[1], best[2]


def _same_plan(a: Groups, b: Groups) -> bool:
    return all(np.array_equal(getattr(a, f), getattr(b, f))
               for f in ("ev_ptr", "ev_unit", "pf_ptr", "pf_unit", "need_now", "wait_prev", "need_group"))


def next_use_of(truth: Needs, needs: Needs) -> np.ndarray:
    """For each occurrence of `truth` (unit u at step s): the first step after s
    at which `needs` holds u (the number of steps when none). What a planned
    policy knows of a unit's next use, for Belady within a launch larger than
    memory."""
    n = len(truth.ptr) - 1
    m = n + 1
    ns = np.repeat(np.arange(n, dtype=I64), np.diff(needs.ptr))
    nk = np.sort(needs.unit.astype(I64) * m + ns)
    ts = np.repeat(np.arange(n, dtype=I64), np.diff(truth.ptr))
    tu = truth.unit.astype(I64)
    idx = np.searchsorted(nk, tu * m + ts, side="right")
    out = np.full(len(tu), n, I64)
    ok = idx < len(nk)
    hit = nk[np.minimum(idx, max(len(nk) - 1, 0))] // m == tu if len(nk) else np.zeros(len(tu), bool)
    ok &= hit
    out[ok] = nk[idx[ok]] % m
    return out


class Oracle(Planned):
    name = "oracle"
    description = "plans on the true footprints (the bound)"

    def needs(self, ctx):
        return ctx.w.truth


class Alloc(Planned):
    """Whole allocations before each launch (MSched's baseline).

    Planned on units like the others, unless the needs hold more than
    CHUNK_PLAN_OCCURRENCES unit touches (a long trace whose kernels all point
    into one large allocation needs every unit of it at every launch): then
    planned on the driver's eviction chunks (2 MiB), whole chunks but for an
    allocation's first and last, at 1/32 of the work, a chunk counting as
    the largest chunk's units of capacity."""

    name = "alloc"
    description = "before each launch, whole allocations its pointer parameters point into (MSched's baseline)"
    spans = ("unit",)   # the baseline as MSched defines it: whole allocations, nothing else
    fronts = (False,)

    def needs(self, ctx):
        return alloc_needs(ctx.w)

    def chunk_needs(self, ctx):
        if "alloc_chunks" not in ctx.w.extra:
            ctx.w.extra["alloc_chunks"] = ctx.w.chunk_needs_from([t.alloc_fp for t in ctx.w.tasks])
        return ctx.w.extra["alloc_chunks"]

    def prefetch(self, ctx):
        occ = sum(unit_touches(t.alloc_fp, ctx.w.gran) for t in ctx.w.tasks)
        if occ <= CHUNK_PLAN_OCCURRENCES:
            return super().prefetch(ctx)
        u = ctx.w.universe
        upc = max(int((u.chunk_hi - u.chunk_lo).max()), 1) if u.n_chunks else 1
        cap_chunks = max(ctx.cap_units // upc, 1)
        g = plan_groups(self.chunk_needs(ctx), u.n_chunks, cap_chunks)
        return chunk_groups_to_units(g, u.chunk_lo, u.chunk_hi)


CHUNK_PLAN_OCCURRENCES = 20_000_000


def unit_touches(fp: F.Footprints, gran: int) -> int:
    """Units a footprint's launches touch in all (without expanding them)."""
    from .workload import unit_intervals
    _, s, e = unit_intervals(fp, gran)
    return int((e - s).sum())


def chunk_groups_to_units(g: Groups, chunk_lo: np.ndarray, chunk_hi: np.ndarray) -> Groups:
    """A plan over chunk ids -> the same plan over their units (order kept)."""
    size = chunk_hi - chunk_lo

    def expand(ptr, ch):
        cs = np.concatenate([[0], np.cumsum(size[ch])]).astype(I64)
        return cs[ptr], F._ranges(chunk_lo[ch], size[ch]), cs
    ev_ptr, ev, _ = expand(g.ev_ptr, g.ev_unit)
    pf_ptr, pf, cs = expand(g.pf_ptr, g.pf_unit)
    need_now = cs[g.pf_ptr[:-1] + g.need_now] - cs[g.pf_ptr[:-1]]
    return Groups(ev_ptr, ev, pf_ptr, pf, need_now.astype(I64), g.wait_prev, g.blocking, g.thrash, g.need_group)


class Template(Planned):
    """Plans on the model's predicted footprints; `--feedback` refines the model after misses."""

    name = "template"
    description = "follows a plan made from the learned templates (mispredictions fault)"

    def __init__(self, model=None, plan_groups_fixed: Groups | None = None, fallback: str = "adaptive"):
        self.model = model
        self.fixed = plan_groups_fixed
        self.fallback = fallback
        self.fixed_needs = None
        self.fixed_span = "unit"

    @property
    def wants_misses(self) -> bool:  # type: ignore[override]
        return self._feedback

    _feedback = False

    def predicted(self, ctx: Context) -> list[F.Footprints]:
        key = ("predicted", id(self.model), self.fallback)
        if key not in ctx.w.extra:
            from .adaptive import predicted_footprints
            ctx.w.extra[key] = [predicted_footprints(self.model, t.trace, self.fallback) for t in ctx.w.tasks]
        return ctx.w.extra[key]

    def needs(self, ctx):
        key = ("pneeds", id(self.model), self.fallback)
        if key not in ctx.w.extra:
            ctx.w.extra[key] = ctx.w.needs_from(self.predicted(ctx))
        return ctx.w.extra[key]

    def prefetch(self, ctx):
        if self.fixed is not None:
            if self.fixed_needs is not None:
                # the plan's predicted needs (its model at hand): Belady within
                # a launch larger than memory, as the plan was made
                ctx.state["plan_needs"] = self.fixed_needs
            ctx.state["plan_span"] = self.fixed_span
            return self.fixed
        if self.model is None:
            raise UsageError("policy template needs --model MODEL or --plan PLAN")
        self._feedback = ctx.options.feedback
        if self._feedback:
            # feedback changes the model: give this run its own copy and predictions
            ctx.state["model"] = copy.deepcopy(self.model)
            ctx.state["pred"] = list(self.predicted(ctx))
            ctx.state["needs"] = self.needs(ctx)
            ctx.state["feedback_changes"] = 0
        return super().prefetch(ctx)

    def on_miss(self, ctx, step, missed):
        from pagecast.predict.feedback import apply_feedback

        from .adaptive import predicted_footprints
        w = ctx.w
        t = int(w.step_task[step])
        lid = int(w.step_launch[step])
        task = w.tasks[t]
        ps, pe = task.truth.of(lid)
        qs, qe = ctx.state["pred"][t].of(lid)
        ms, me = interval_difference(ps, pe, qs, qe)
        if len(ms) == 0:
            return None
        model = ctx.state["model"]
        if not apply_feedback(model, task.trace, lid, ms, me):
            return None
        ctx.state["feedback_changes"] += 1
        ctx.state["pred"][t] = predicted_footprints(model, task.trace, self.fallback)
        needs = w.needs_from(ctx.state["pred"])
        ctx.state["needs"] = needs
        mem = ctx.memory
        # re-planned at the span chosen for the run (one more choice per miss would cost a run each)
        needs = span_needs(needs, ctx.state.get("plan_span", "unit"), w)
        ctx.state["plan_needs"] = needs
        return plan_groups(needs, w.universe.n_units, ctx.cap_units, start_step=step + 1,
                           init_resident=mem.resident, belady_in=True, universe=w.universe,
                           front=ctx.state.get("plan_front", False))


class Swap(Policy):
    name = "swap"
    description = "whole-process swapping: at every task switch the incoming task's allocations move in bulk"

    def prefetch(self, ctx):
        w = ctx.w
        n = w.n_steps
        sets = []
        for t, task in enumerate(w.tasks):
            lo, hi = w.universe.task_lo[t], w.universe.task_lo[t + 1]
            sets.append(np.arange(lo, hi, dtype=I64)[:ctx.cap_units])
        switch = np.ones(n, bool)
        switch[1:] = w.step_task[1:] != w.step_task[:-1]
        sizes = np.zeros(n, I64)
        sw = np.flatnonzero(switch)
        sizes[sw] = [len(sets[t]) for t in w.step_task[sw]]
        pf_ptr = np.zeros(n + 1, I64)
        np.cumsum(sizes, out=pf_ptr[1:])
        pf = np.concatenate([sets[t] for t in w.step_task[sw]]) if len(sw) else np.zeros(0, I64)
        g = Groups.empty(n)
        g.pf_ptr, g.pf_unit = pf_ptr, pf
        g.need_now = sizes.copy()
        g.blocking = switch.astype(np.uint8)
        return g


def interval_difference(as_, ae, bs, be):
    """[as, ae) minus [bs, be): sorted disjoint half-open intervals (vectorized)."""
    as_, ae, bs, be = (np.asarray(x, I64) for x in (as_, ae, bs, be))
    if len(as_) == 0:
        return as_, ae
    pts = np.unique(np.concatenate([as_, ae, bs, be]))
    lo, hi = pts[:-1], pts[1:]
    ina = (np.searchsorted(as_, lo, side="right") - 1)
    in_a = (ina >= 0) & (lo < ae[np.maximum(ina, 0)])
    inb = (np.searchsorted(bs, lo, side="right") - 1)
    in_b = (inb >= 0) & (lo < be[np.maximum(inb, 0)]) if len(bs) else np.zeros(len(lo), bool)
    keep = in_a & ~in_b
    if not keep.any():
        z = np.zeros(0, I64)
        return z, z.copy()
    _, s, e = F.merge_intervals(np.zeros(int(keep.sum()), I64), lo[keep], hi[keep], 1)
    return s, e


def _runner(*a, **k) -> Policy:
    from .runner_policy import Runner
    return Runner(*a, **k)


_runner.description = ("the GPU runner's own decisions, one launch at a time (template, no lookahead), "  # type: ignore[attr-defined]
                       "replayed in the simulator")

POLICIES: dict[str, Callable[..., Policy]] = {
    "demand": Demand, "alloc": Alloc, "template": Template, "oracle": Oracle, "swap": Swap, "runner": _runner,
}


def check_policies(names: list[str]) -> list[str]:
    for n in names:
        if n not in POLICIES:
            raise UsageError(f"unknown policy {n!r}; known policies: {', '.join(POLICIES)}")
    return names


# ---- one run ------------------------------------------------------------------------


@dataclass
class RunResult:
    policy: str
    cap_units: int
    counters: np.ndarray       # n_steps x N_COUNTERS
    start: np.ndarray
    end: np.ndarray
    stall: np.ndarray
    compute: np.ndarray
    extra: dict = field(default_factory=dict)


def step_compute(w: Workload) -> np.ndarray:
    comp = [t.compute_s for t in w.tasks]
    out = np.empty(w.n_steps)
    for t, c in enumerate(comp):
        m = w.step_task == t
        out[m] = c[w.step_launch[m]]
    return out


def run_policy(w: Workload, policy: Policy, cap_units: int, profile, options: Options) -> RunResult:
    """Simulate one policy at one capacity (in units)."""
    if cap_units < 1:
        raise UsageError(f"capacity is smaller than one migration unit ({w.gran} bytes)")
    ctx = Context(w, cap_units, options, profile=profile)
    mem = Memory(w, cap_units)
    ctx.memory = mem
    groups = policy.prefetch(ctx)
    n = w.n_steps
    on_launch, on_evict = bool(policy.wants_launches), bool(policy.wants_evictions)
    done = ctx.state.pop("trial_run", None)
    if done is not None and not (policy.wants_misses or on_launch or on_evict):
        # the planner's winning trial ran this very plan on these very needs (oracle)
        return RunResult(policy.name, cap_units, done.counters, done.start, done.end, done.stall, done.compute,
                         _run_extra(ctx))
    # a policy moving units online is tracked as a planned one (faults evict what it did not bring first)
    has_plan = groups is not None or on_launch
    if groups is None:
        groups = Groups.empty(n)
    elif on_launch:
        groups.wait_prev = groups.wait_prev.copy()   # on_launch may mark steps: not in the policy's own plan
    counters = np.zeros((n, C.N_COUNTERS), I64)
    u = w.universe
    order = policy.evict_order or options.eviction
    lru = order == "lru"
    tree = bool(options.driver_prefetch) and u.upb > 1
    maxstep = int(w.truth.sizes().max()) if n else 0
    missed = np.zeros(max(maxstep, 1), I64)
    s = 0
    stop = bool(policy.wants_misses)
    nu_for = None
    next_use = np.zeros(1, I64)
    while s < n:
        pn = ctx.state.get("plan_needs")
        if pn is not None and pn is not nu_for:
            next_use = next_use_of(w.truth, pn)
            nu_for = pn
        s0 = s
        before = mem.resident.copy() if on_evict else None
        if on_launch:
            mv = policy.on_launch(ctx, s0)
            if mv is not None:
                if _apply_now(mv, mem, u, counters, s0, w.truth.of(s0 - 1) if s0 > 0 else None):
                    groups.wait_prev[s0] = 1
        s, nm = C.run_engine(s, s + 1 if (on_launch or on_evict) else n, w.truth.ptr, w.truth.unit, has_plan,
                             groups.ev_ptr, groups.ev_unit,
                             groups.pf_ptr, groups.pf_unit, groups.need_now, mem.cap, mem.st, mem.resident,
                             u.unit_chunk, mem.chunk_count, u.chunk_lo, u.chunk_hi, mem.prev, mem.nxt, mem.planned,
                             mem.uq, mem.uq_state, lru, tree, profile.prefetch_threshold, u.key, u.block_lo,
                             u.block_hi, u.upb, has_plan, stop, missed, counters, next_use, nu_for is not None)
        if on_evict:
            gone = np.flatnonzero((before == 1) & (mem.resident == 0))
            if len(gone):
                policy.on_evict(ctx, s0, gone)
        if stop and nm > 0 and s < n:
            new = policy.on_miss(ctx, s - 1, missed[:nm])
            if new is not None:
                groups = groups.splice(new, s)
    comp = step_compute(w)
    start, end, stall = timing(counters, comp, w.gran, groups, profile)
    return RunResult(policy.name, cap_units, counters, start, end, stall, comp, _run_extra(ctx))


def _run_extra(ctx: Context) -> dict:
    """What a run reports beside its counters: feedback changes, the plan's span."""
    return {k: v for k, v in ctx.state.items() if k in ("feedback_changes", "plan_span")}


def _apply_now(mv, mem: Memory, u, counters: np.ndarray, step: int, prev_units) -> bool:
    """An on_launch hook's (evict, prefetch[, wait]) units, carried out as a planned group of
    `step`. Returns whether the group waits for the launch before to end: `wait` if given,
    else whether it evicts a unit that launch touches (as the planner decides)."""
    ev, pf = (np.asarray(x, I64).ravel() for x in mv[:2])
    bad = [x for x in (ev, pf) if len(x) and (x.min() < 0 or x.max() >= u.n_units)]
    if bad:
        raise ValueError(f"on_launch named units outside 0..{u.n_units - 1}")
    C.apply_group(ev, 0, len(ev), pf, 0, len(pf), mem.cap, mem.st, mem.resident, u.unit_chunk, mem.chunk_count,
                  u.chunk_lo, u.chunk_hi, mem.prev, mem.nxt, mem.planned, mem.uq, mem.uq_state, len(pf),
                  counters, step)
    if len(mv) > 2:
        return bool(mv[2])
    return prev_units is not None and len(ev) > 0 and bool(np.isin(ev, prev_units).any())


def timing(counters, comp, gran, groups: Groups, profile):
    p = profile
    return C.timing(counters, comp, float(gran), groups.blocking, groups.wait_prev, groups.need_group,
                    bool(p.charges),
                    float(p.fault_time_s), int(p.faults_per_batch), float(p.batch_overhead_s),
                    float(p.htod_bandwidth), float(p.dtoh_bandwidth), bool(p.duplex),
                    float(p.pipelined_bandwidth), float(p.transfer_latency_s))


def demand_lru_all(w: Workload, caps_units: list[int], profile) -> list[RunResult]:
    """LRU demand paging at every capacity in one pass (stack distances).

    Exact when a unit is both the migration and the eviction unit and the tree
    prefetcher is off: then LRU is a stack algorithm and a touch misses at
    capacity c exactly when its stack distance exceeds c.
    """
    seq = w.truth.unit
    dist = C.lru_stack_distances(seq, w.universe.n_units)
    n = w.n_steps
    ptr = w.truth.ptr
    nonempty = np.flatnonzero(np.diff(ptr) > 0)
    comp = step_compute(w)
    g = Groups.empty(n)
    out = []
    for cap in caps_units:
        miss = dist > cap
        counters = np.zeros((n, C.N_COUNTERS), I64)
        if len(seq):
            per = np.add.reduceat(miss.astype(I64), ptr[nonempty])
            counters[nonempty, C.C_FAULTS] = per
            counters[:, C.C_FAULT_IN] = counters[:, C.C_FAULTS]
            cum = np.cumsum(counters[:, C.C_FAULTS])
            ev = np.maximum(cum - cap, 0)
            counters[:, C.C_FAULT_DTOH] = np.diff(np.concatenate([[0], ev]))
        start, end, stall = timing(counters, comp, w.gran, g, profile)
        out.append(RunResult("demand", cap, counters, start, end, stall, comp, {"one_pass": True}))
    return out


def summarize(r: RunResult, w: Workload, batch: int = 256) -> dict[str, Any]:
    c = r.counters.sum(axis=0) if len(r.counters) else np.zeros(C.N_COUNTERS, I64)
    gran = w.gran
    sizes = w.truth.sizes()
    return {
        "time_s": float(r.end[-1]) if len(r.end) else 0.0,
        "stall_s": float(r.stall.sum()),
        "compute_s": float(r.compute.sum()),
        "faults": int(c[C.C_FAULTS]),
        "htod_bytes": int((c[C.C_FAULT_IN] + c[C.C_TREE_IN] + c[C.C_PREFETCH_IN]) * gran),
        "dtoh_bytes": int((c[C.C_FAULT_DTOH] + c[C.C_GROUP_DTOH]) * gran),
        "prefetch_bytes": int(c[C.C_PREFETCH_IN] * gran),
        "fault_batches": int(np.ceil(r.counters[:, C.C_FAULTS] / batch).sum()) if len(r.counters) else 0,
        "thrashing_launches": int((sizes > r.cap_units).sum()),
        "launches": int(w.n_steps),
    }
