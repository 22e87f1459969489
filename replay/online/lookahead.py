"""The lookahead schedule of a planned run: which launches' footprints a runner brings in at each
launch's callback, which data it discards once dead, read by the GPU engine (gpu/cuda_engine.py,
through `LaunchDecider`) and by the simulator's `runner` policy alike, so that the rule is written
once. Everything here is laid out at start, in arrays; per launch the decider looks up its row and
makes a few compiled calls (lookahead_kernels.py: `window_kernel`, `split_groups`).

A run can look ahead where it knows the launches to come: a trace of the workload (the plan's
launch sequence). The footprints it looks ahead with are the plan's own:

- `oracle`: the trace's footprints (what its launches touched), relocated into the run;
- `template`: the model's predictions of the trace's launches (`predict_footprints`, with the
  runner's fallback), relocated the same way.

Launches whose footprint depends on index values a producer launch writes (a kernel with an
`indexed` region in the model) are never prefetched early: their values do not exist before the
producer has run, so they are prefetched at their own callback, after their values are read, as
without lookahead; a window never reaches past one. The oracle's footprints are the trace's own,
not values-dependent, so it skips none.

Victims: with a plan, the runner knows each unit's next use in it, so a policy whose victims are
chosen by predicted next use (template: the kernel sequence's period) evicts by the plan's next use
instead (Belady on the plan's footprints, as the oracle does on the trace's).

How far ahead (`depth_of`, `horizon_of`)
----------------------------------------
Launch s's data must be on the GPU when kernel s starts. Bringing it in takes
`need[s] = per_call + new_bytes[s] / bandwidth`: the calibrated profile's cost of one call
(`transfer_latency_s`) and host-to-device bandwidth (`htod_bandwidth`; `pagecast calibrate`
measures both), and the plan's bytes of launch s in 2 MiB units launch s - 1 does not use (what
is still resident from the launch before need not move; 0: nothing to copy). The copies go one
after the other on the copy stream while the kernels before s run (the trace's kernel times,
end_ns - start_ns). `copy_schedule` plays that out from the first launch: the copy of s starts as
late as lets it end when kernel s would start, but never before the copy stream is free (the
copies before it ended), and kernel s starts when the kernel before it has ended and its copy is
in. Launch s is issued at the callback of the last launch whose kernel starts by then (a callback
runs before its kernel is queued): its depth, at least 1 and at most `MAX_DEPTH` (a bound on the
host's work per callback, not a tuning). Going further ahead than that gains nothing: an earlier
call would wait on the copy stream all the same. So a run whose copies are shorter than its kernels
stays one launch ahead, a run bound by its copies too (the copy stream is never idle), and a
launch with a large copy after launches with little to move goes as far back as the idle copy
stream lets it. The horizon of launch t's callback is the furthest launch issued there; a window
stops before an indexed launch. The capacity bounds it at run time: the decider brings in only as
many launches of the window as fit beside launch t (`window_kernel`), none where launch t and the
next do not fit together. Without costs (no profile given) or without kernel times in the trace
(a natural-mode trace), the depth is 1.

Dead data (`dead_of`)
---------------------
Data whose last use has run need not be copied back to make room: it can be discarded (CUDA
13.0's cuMemDiscardBatchAsync, where the driver has it; gpu/cuda_engine.py). A freed temporary is
dead after its last use: an allocation the trace records as freed (its `last_launch` is set), from
the callback after the last launch that touched it (its footprint in the trace) or passed a pointer
into it, unless the trace records a host access to it after that launch began (a device-to-host
`coherence` migration of its pages: the host read it before freeing it), in which case it is left
to eviction. Data never freed may still be read by the host after the run's last launch (a result
the program copies out, a checkpoint): it is discarded only with `discard_unfreed` (off by default;
`ReplayRequest.discard_unfreed`), after its last use in the trace.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pagecast import trace as T
from pagecast.jit import entry_point

from pagecast.predict.predictor import predict_footprints

from .lookahead_kernels import copy_schedule, split_groups, window_fit, window_kernel
from .ranges import UNIT
from .relocate import Relocator

DEPTH = 1        # launches ahead without costs or kernel times (the module doc)
MAX_DEPTH = 16   # the most launches one callback brings in (a bound on its host work)


@dataclass(frozen=True)
class Lookahead:
    """A planned run's lookahead: the plan's footprints per launch (`plan`, a Relocator, laid out by
    the decider), launches never prefetched early (`skip`), the furthest launch each launch's
    callback brings in (`horizon`, int64 per launch; None: one launch ahead), the deepest window
    (`depth`), whether victims go by the plan's next use (`plan_victims`), and the trace
    allocations whose data dies before each launch (`dead`: (indptr per launch, allocation ids),
    None: nothing discarded)."""

    plan: Relocator
    skip: frozenset
    depth: int = DEPTH
    plan_victims: bool = True   # victims by the plan's next use (Belady on its footprints), not the period's
    horizon: np.ndarray | None = None
    dead: tuple | None = None

    def horizon_at(self, t: int, n: int) -> int:
        """The last launch launch t's callback brings in (t: none)."""
        h = self.horizon
        if h is None:
            s = t + 1
            return s if s < n and s not in self.skip else t
        return int(h[t]) if t < len(h) else t

    def dead_at(self, t: int) -> np.ndarray:
        """Trace allocation ids whose data is dead at launch t's callback."""
        if self.dead is None or t + 1 >= len(self.dead[0]):
            return _NONE
        ptr, ids = self.dead
        return ids[ptr[t]:ptr[t + 1]]


_NONE = np.zeros(0, np.int64)


def indexed_launches(model, trace) -> frozenset:
    """Launches of `trace` whose kernel has an `indexed` region in `model`."""
    kernels = {name for name, km in model.kernels.items() if any(r.cls == "indexed" for r in km.regions)}
    if not kernels:
        return frozenset()
    names = trace.launches.column(T.KERNEL).to_pylist()
    return frozenset(t for t, k in enumerate(names) if k in kernels)


def applies(policy) -> bool:
    """Whether a policy looks ahead when given a plan: those that prefetch a plan's footprints
    (template's predictions, oracle's truth)."""
    return bool(getattr(policy, "online", False) and (policy.predicts or policy.needs_relocator))


def lookahead_for(policy, trace, *, model=None, fallback: str = "none", relocator: Relocator | None = None,
                  costs=None, discard_unfreed: bool = False) -> Lookahead | None:
    """The lookahead of `policy` (a policy object) over `trace`, or None where it has none (a policy
    that does not plan, or template without a model). `relocator`: the trace's own (the oracle's),
    reused as the plan; `fallback`: the runner's, for kernels the model cannot predict; `costs`: a
    cost profile (its `transfer_latency_s` and `htod_bandwidth`) the depth comes from (None: one
    launch ahead); `discard_unfreed`: data never freed is dead after its last use too (the module
    doc)."""
    if trace is None or not applies(policy):
        return None
    truth = relocator if relocator is not None else Relocator(trace)
    if policy.predicts:
        if model is None:
            return None
        plan, skip = Relocator(trace, predict_footprints(model, trace, fallback)), indexed_launches(model, trace)
    else:
        plan, skip = truth, frozenset()
    horizon, depth = None, DEPTH
    if costs is not None:
        d = depth_of(plan, trace, costs)
        if d is not None:
            horizon = horizon_of(d, skip)
            depth = int(d.max(initial=DEPTH))
    return Lookahead(plan, skip, depth=depth, horizon=horizon, dead=dead_of(truth, trace, discard_unfreed))


# -- how far ahead ------------------------------------------------------------------------------------
def kernel_times(trace) -> np.ndarray | None:
    """Each launch's kernel time in seconds from the trace's timestamps, or None where it has none."""
    la = trace.launches
    if T.START_NS not in la.column_names or T.END_NS not in la.column_names or la.num_rows == 0:
        return None
    s, e = la.column(T.START_NS), la.column(T.END_NS)
    if s.null_count or e.null_count:
        return None
    d = (np.asarray(e.to_numpy(zero_copy_only=False), np.int64)
         - np.asarray(s.to_numpy(zero_copy_only=False), np.int64))
    if not (d > 0).any():
        return None
    return np.maximum(d, 0).astype(np.float64) * 1e-9


def new_bytes(plan: Relocator, unit: int = UNIT) -> np.ndarray:
    """Per launch, the plan's bytes in units (of trace addresses) the launch before does not use."""
    n = plan.n
    ind = np.asarray(plan.fp_indptr, np.int64)
    st, en = np.asarray(plan.fp_start, np.int64), np.asarray(plan.fp_end, np.int64)
    lid = np.repeat(np.arange(n, dtype=np.int64), np.diff(ind))
    s0, s1 = st // unit, (en - 1) // unit + 1
    cnt = np.maximum(s1 - s0, 0)
    rep = np.repeat(np.arange(len(st)), cnt)
    k = np.arange(int(cnt.sum()), dtype=np.int64) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    u = s0[rep] + k
    nb = np.minimum(en[rep], (u + 1) * unit) - np.maximum(st[rep], u * unit)
    t = lid[rep]
    out = np.zeros(n, np.float64)
    if not len(u):
        return out
    key = np.stack([u, t], axis=1)
    uniq, inv = np.unique(key, axis=0, return_inverse=True)
    per = np.bincount(inv.reshape(-1), weights=nb, minlength=len(uniq))
    # (unit, launch - 1) present among the keys: the unit is resident from the launch before
    code = uniq[:, 0] * (n + 1) + uniq[:, 1]
    prev = uniq[:, 0] * (n + 1) + (uniq[:, 1] - 1)
    pos = np.searchsorted(code, prev)
    had = (pos < len(code)) & (code[np.minimum(pos, len(code) - 1)] == prev) & (uniq[:, 1] > 0)
    np.add.at(out, uniq[~had, 1], per[~had])
    return out


def depth_of(plan: Relocator, trace, costs, unit: int = UNIT) -> np.ndarray | None:
    """Per launch s, how many launches early its data is issued (the module doc), or None without
    kernel times in the trace."""
    kt = kernel_times(trace)
    bw = float(getattr(costs, "htod_bandwidth", 0.0) or 0.0)
    if kt is None or bw <= 0 or plan.n == 0:
        return None
    nb = new_bytes(plan, unit)
    need = np.where(nb > 0, float(getattr(costs, "transfer_latency_s", 0.0) or 0.0) + nb / bw, 0.0)
    S, K = copy_schedule(kt.astype(np.float64), need.astype(np.float64))
    issue = np.searchsorted(K, S, side="right") - 1          # the last launch whose kernel starts by then
    s = np.arange(plan.n)
    return np.clip(s - issue, 1, MAX_DEPTH).astype(np.int64)


def horizon_of(depth: np.ndarray, skip: frozenset) -> np.ndarray:
    """Per launch t, the last launch its callback brings in: the furthest s with s - depth[s] <= t,
    never past an indexed launch after t (nor the trace's end); t itself where none."""
    n = len(depth)
    s = np.arange(n, dtype=np.int64)
    at = np.maximum(s - depth, 0)
    h = np.full(n, -1, np.int64)
    np.maximum.at(h, at, s)
    h = np.maximum.accumulate(h)
    h = np.maximum(h, s)
    if skip:
        sk = np.zeros(n + 1, bool)
        sk[[x for x in skip if 0 <= x < n]] = True
        sk[n] = True
        # the first skipped launch after t
        nxt = np.where(sk, np.arange(n + 1), n + 1)
        nxt = np.minimum.accumulate(nxt[::-1])[::-1]
        h = np.minimum(h, nxt[np.minimum(s + 1, n)] - 1)
    return np.maximum(np.minimum(h, n - 1), s)


# -- dead data ----------------------------------------------------------------------------------------
def dead_of(truth: Relocator, trace, discard_unfreed: bool = False) -> tuple | None:
    """(indptr per launch, trace allocation ids): the allocations whose data is dead at each launch's
    callback (the module doc), from the trace's footprints (`truth`), arguments and migrations; None
    where none is."""
    n = truth.n
    na = len(truth.a_addr)
    if n == 0 or na == 0:
        return None
    last = np.full(na, -1, np.int64)
    # the last launch whose footprint touches each allocation
    ind = np.asarray(truth.fp_indptr, np.int64)
    st = np.asarray(truth.fp_start, np.int64)
    lid = np.repeat(np.arange(n, dtype=np.int64), np.diff(ind))
    pos = np.searchsorted(truth.sorted_addr, st, side="right") - 1
    ok = pos >= 0
    j = truth.order[np.maximum(pos, 0)]
    ok &= st < truth.a_addr[j] + truth.a_bytes[j]
    np.maximum.at(last, j[ok], lid[ok])
    # ... or is passed a pointer into it (the pointer words the relocator lays out anyway)
    words = truth.layout()._words
    wt = np.fromiter((t for t, ws in enumerate(words) for _ in ws), np.int64)
    wj = np.fromiter((w[1] for ws in words for w in ws), np.int64, len(wt))
    np.maximum.at(last, wj, wt)
    freed = np.asarray(trace.allocations.column(T.LAST_LAUNCH).is_valid(), bool)
    want = freed | bool(discard_unfreed)
    cand = np.flatnonzero(want & (last >= 0) & (last + 1 < n))
    if not len(cand):
        return None
    read = _host_reads_after(trace, truth, last)
    cand = cand[~read[cand]]
    if not len(cand):
        return None
    at = last[cand] + 1
    order = np.argsort(at, kind="stable")
    ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(at, minlength=n)[:n], out=ptr[1:])
    return ptr, cand[order].astype(np.int64)


def _host_reads_after(trace, rel: Relocator, last: np.ndarray) -> np.ndarray:
    """Per allocation: the trace records a host access to it (a device-to-host `coherence`
    migration) at or after the start of its last use."""
    out = np.zeros(len(rel.a_addr), bool)
    m = trace.migrations
    if m is None or m.num_rows == 0:
        return out
    d = np.asarray(m.column(T.DIRECTION).to_pylist(), dtype=object)
    c = np.asarray(m.column(T.CAUSE).to_pylist(), dtype=object)
    sel = np.flatnonzero((d == "dtoh") & (c == "coherence"))
    if not len(sel):
        return out
    addr = np.asarray(m.column(T.ADDRESS).to_numpy(zero_copy_only=False), np.int64)[sel]
    when = np.asarray(m.column(T.START_NS).to_numpy(zero_copy_only=False), np.int64)[sel]
    starts = np.asarray(trace.launches.column(T.START_NS).to_numpy(zero_copy_only=False), np.int64)
    pos = np.searchsorted(rel.sorted_addr, addr, side="right") - 1
    ok = pos >= 0
    j = rel.order[np.maximum(pos, 0)]
    ok &= addr < rel.a_addr[j] + rel.a_bytes[j]
    lu = last[j]
    ok &= (lu >= 0) & (when >= starts[np.maximum(lu, 0)])
    out[j[ok]] = True
    return out


# -- per launch: the window, in compiled calls (lookahead_kernels.py) ------------------------------------
class Windows:
    """The window of launch t's callback, fitted to the capacity, in one compiled call on a
    laid-out Relocator (`window_kernel`), or relocated launch by launch and fitted (`window_fit`)
    on any other plan (a test's stand-in)."""

    def __init__(self, plan, unit: int, cap_units: int) -> None:
        self.plan, self.unit, self.cap = plan, unit, cap_units
        self._fast = hasattr(plan, "_ptr") and hasattr(plan, "_known")
        self._out = np.zeros(64, np.int64)
        self._wptr = np.zeros(MAX_DEPTH + 2, np.int64)
        self._kernel = None
        if self._fast:
            p = plan
            # the relocator's arrays (its allocations' bases and known flags change in place)
            self._arrays = (p._ptr, p._aj, p._off, p._nb, p._base, p._known)
            self._ptrl = p._ptr.tolist()
            self._kernel = entry_point(window_kernel, self._arrays, 0, 0, np.zeros(2, np.int64), int(unit),
                                       int(cap_units), self._out, self._wptr)
            self._split = entry_point(split_groups, np.zeros(2, np.int64), np.zeros(2, np.int64),
                                      np.zeros(2, np.int64), np.zeros(2, np.int64), 0, int(unit))
        else:
            self._split = split_groups

    def fit(self, t: int, h: int, own: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
        """(m, ranges, wptr): how many of launches t+1 .. h fit beside `own`, and their ranges."""
        if self._fast:
            ptr = self._ptrl
            need = 2 * (ptr[h + 1] - ptr[t + 1])
            if need > len(self._out) or h - t + 1 > len(self._wptr):
                self._out = np.zeros(max(2 * need, len(self._out)), np.int64)
                self._wptr = np.zeros(max(h - t + 2, len(self._wptr)), np.int64)
            m = self._kernel(self._arrays, t + 1, h + 1, own, self.unit, self.cap, self._out, self._wptr)
            return m, self._out, self._wptr
        p = self.plan
        parts = [_flat(p.footprint_arrays(s)) for s in range(t + 1, h + 1)]
        wptr = np.zeros(len(parts) + 1, np.int64)
        np.cumsum([len(x) // 2 for x in parts], out=wptr[1:])
        win = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return int(window_fit(own, win, wptr, h - t, self.unit, self.cap)), win, wptr

    def split(self, pf: np.ndarray, own: np.ndarray, win: np.ndarray, wptr: np.ndarray, m: int):
        return self._split(pf, own, win, wptr, m, self.unit)


def _flat(r) -> np.ndarray:
    return r.flat if hasattr(r, "flat") else np.array([x for a in r for x in a], np.int64)


