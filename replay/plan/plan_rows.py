"""Plans and plan files: a plan's `Groups` as plan.parquet rows, and plan rows back as `Groups`.

`groups_to_table` is what `pagecast plan` writes (merging runs of consecutive
units into one transfer), `launches_table` its lookahead per launch (launches.parquet:
what the planner derived, which the rows alone do not say); `groups_from_plan` is how the
simulator replays a plan file (`replay --plan`), reading the lookahead where the file has it
and otherwise deriving it from the predictions the plan was made on, when its model can be read.
The simulator's `runner` and the GPU runner lay a plan out from these same two tables
(online/planned.schedule_from_plan).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pagecast import footprints as F
from pagecast import trace as T
from pagecast.predict.model_io import load_model

from ..unit_space import I64, Workload, narrow, step_pieces
from . import plan_io
from .adaptive import predicted_gated
from .groups import Groups, first_need, gate_of

def groups_to_table(g: Groups, needs, w: Workload) -> pa.Table:
    """Groups (single task) -> plan rows, merging runs of consecutive units into one transfer.

    Each pass (evictions, prefetches) is merged a few steps at a time (`ROWS_PIECE` entries): a row
    never spans two steps, so the rows are those of the whole pass at once, and its per-entry arrays
    (step, need, gate, address, key: ~8 bytes an entry each) exist for one piece, not for the plan
    (the runner makes these rows at every capacity; whole, they were its high at scale 10)."""
    parts = []
    for is_ev, ptr, units in ((True, g.ev_ptr, g.ev_unit), (False, g.pf_ptr, g.pf_unit)):
        if len(units) == 0:
            continue
        ptr = np.asarray(ptr, I64)
        after_all = None if is_ev else g.prefetch_after()
        for s0, s1 in step_pieces(ptr, uses=ROWS_PIECE):
            a, b = int(ptr[s0]), int(ptr[s1])
            if a == b:
                continue
            parts.append(_rows(is_ev, ptr[s0:s1 + 1] - a, s0, units[a:b], None if is_ev else after_all[a:b],
                               needs, w, a))
    return _table(parts, w)


ROWS_PIECE = 1 << 20   # entries of a pass merged into rows at a time (groups_to_table)


def _rows(is_ev: bool, ptr: np.ndarray, s0: int, units: np.ndarray, after, needs, w: Workload, base: int) -> tuple:
    """The rows of steps s0.. of one pass: `ptr` their entries' offsets within `units` (those
    steps' entries), `base` the first one's position in the pass."""
    n = w.n_steps
    step = np.repeat(np.arange(s0, s0 + len(ptr) - 1, dtype=I64), np.diff(ptr))
    if is_ev:
        need_by = np.full(len(units), -1, I64)
        after = np.full(len(units), -1, I64)
    else:
        # the step that first needs each prefetched unit at or after its group
        need_by = first_need(step, units, needs, n)
    addr, key = w.universe.address_ranges(0, units)
    # merge consecutive entries of the same step with consecutive addresses and the same need
    new = np.ones(len(units), bool)
    # (a group's own needs and its early prefetches stay apart: a runner waits for the first;
    # so do transfers that wait for other launches' index values)
    own = need_by == step
    new[1:] = (step[1:] != step[:-1]) | (key[1:] != key[:-1] + 1) | (own[1:] != own[:-1]) | \
        (after[1:] != after[:-1])
    del key, own
    idx = np.flatnonzero(new)
    del new
    cnt = np.diff(np.concatenate([idx, [len(units)]]))
    row_need = np.minimum.reduceat(np.where(need_by < 0, np.iinfo(I64).max, need_by), idx)
    row_need = np.where(row_need == np.iinfo(I64).max, -1, row_need)
    return (step[idx], np.full(len(idx), is_ev), addr[idx].astype(np.uint64), cnt * w.gran,
            row_need, idx + base, after[idx])


def _table(parts: list[tuple], w: Workload) -> pa.Table:
    """The passes' rows as plan.parquet's table: per launch, evictions first, then prefetches in
    need order."""
    if not parts:
        return pa.Table.from_pylist([], schema=plan_io.SCHEMA)
    lid = np.concatenate([p[0] for p in parts])
    ev = np.concatenate([p[1] for p in parts])
    addr = np.concatenate([p[2] for p in parts])
    nb = np.concatenate([p[3] for p in parts]).astype(I64)
    nbv = np.concatenate([p[4] for p in parts])
    pos = np.concatenate([p[5] for p in parts])
    aft = np.concatenate([p[6] for p in parts])
    order = np.lexsort((pos, ~ev, lid))  # per launch: evictions first, then prefetches in need order
    lid, ev, addr, nb, nbv, aft = lid[order], ev[order], addr[order], nb[order], nbv[order], aft[order]
    first = np.searchsorted(lid, lid, side="left")
    ordn = np.arange(len(lid), dtype=I64) - first
    launch = w.step_launch[lid]
    return pa.table({plan_io.LAUNCH_ID: launch, plan_io.ACTION: np.where(ev, plan_io.EVICT, plan_io.PREFETCH),
                     plan_io.ADDRESS: addr, plan_io.BYTES: nb, plan_io.ORDER: ordn,
                     plan_io.NEEDED_BY: np.where(nbv >= 0, w.step_launch[np.maximum(nbv, 0)], -1),
                     plan_io.AFTER_LAUNCH: np.where(aft >= 0, w.step_launch[np.maximum(aft, 0)], -1)},
                    schema=plan_io.SCHEMA)


def launches_table(g: Groups, w: Workload) -> pa.Table:
    """A plan's lookahead per launch (plan_io.LAUNCH_SCHEMA, single task), as its planner derived
    it: the groups whose evictions wait for the launch before (`wait_prev`), the latest earlier
    group each waits for (`need_group`), the index-value bytes copied before its gated prefetches
    (`gate_bytes`); only the launches with one of them set."""
    n = w.n_steps
    wait_prev = np.asarray(g.wait_prev, bool)
    waits_for = np.asarray(g.need_group, I64)
    gate_bytes = np.asarray(g.gate_bytes, I64) if g.gate_bytes is not None else np.zeros(n, I64)
    keep = np.flatnonzero(wait_prev | (waits_for >= 0) | (gate_bytes > 0))
    launch = w.step_launch
    return pa.table({plan_io.LAUNCH_ID: np.asarray(launch[keep], I64), plan_io.WAIT_PREV: wait_prev[keep],
                     plan_io.WAITS_FOR: np.where(waits_for[keep] >= 0, launch[np.maximum(waits_for[keep], 0)], -1),
                     plan_io.GATE_BYTES: gate_bytes[keep]}, schema=plan_io.LAUNCH_SCHEMA)


def groups_from_plan(plan: plan_io.Plan, w: Workload, needs=None) -> Groups:
    """A plan's rows -> Groups over the (single-task) workload's steps.

    `needs`: the predicted needs the plan was made on (its model's), when they
    can be read. The file does not say which groups evict units the launch
    before uses (they start once it ends) nor, for a merged row of early
    prefetches, every launch that waits for it (its `needed_by` is the first):
    both are derived from `needs` as the planner derived them, so the plan
    replays as template planned on the fly does. Without them: the launch
    before's true footprint, and each row's `needed_by`. A plan with its lookahead
    (launches.parquet) is read as written: the planner's own."""
    cols = plan.columns()
    n = w.n_steps
    gran = w.gran
    lid = cols[plan_io.LAUNCH_ID]
    addr = cols[plan_io.ADDRESS].astype(np.uint64)
    nb = cols[plan_io.BYTES].astype(np.uint64)
    s = (addr // np.uint64(gran)).astype(I64)
    e = ((addr + nb + np.uint64(gran - 1)) // np.uint64(gran)).astype(I64)
    is_ev = cols[plan_io.ACTION]
    need = cols[plan_io.NEEDED_BY] == lid
    out = {}
    for name, sel in (("ev", is_ev), ("pf", ~is_ev)):
        # keep row order inside a launch: a row index as the secondary key
        rows = np.flatnonzero(sel)
        counts = e[rows] - s[rows]
        units = F.expand_intervals(s[rows], e[rows])
        row_of = np.repeat(rows, counts)
        us, ue, off = w.universe.iv[0]
        k = np.searchsorted(us, units, side="right") - 1
        kk = np.maximum(k, 0)
        ok = (k >= 0) & (units < ue[kk]) if len(us) else np.zeros(len(units), bool)
        d = (off[kk] + units - us[kk])[ok]
        row_of = row_of[ok]
        step = w.step_of(0, lid[row_of])
        order = np.lexsort((row_of, step))
        d, row_of, step = d[order], row_of[order], step[order]
        ptr = np.zeros(n + 1, I64)
        np.cumsum(np.bincount(step, minlength=n), out=ptr[1:])
        aft = cols[plan_io.AFTER_LAUNCH][row_of]
        out[name] = (ptr, d, np.bincount(step[need[row_of]], minlength=n) if name == "pf" else None,
                     np.where(aft >= 0, w.step_of(0, np.maximum(aft, 0)), -1).astype(I64))
    g = Groups.empty(n)
    # narrowed as Groups narrows what it is made with (these are set after): no engine compile of their own
    g.ev_ptr, g.ev_unit = out["ev"][0], narrow(out["ev"][1])
    g.pf_ptr, g.pf_unit = out["pf"][0], narrow(out["pf"][1])
    g.need_now = out["pf"][2].astype(I64)
    g.pf_after = out["pf"][3]
    g.gate = gate_of(g.pf_ptr, g.pf_after)
    if plan.launches is not None:   # the lookahead as the planner derived it (launches.parquet)
        lt = plan.launches
        step = w.step_of(0, lt.column(plan_io.LAUNCH_ID).to_numpy())
        wf = lt.column(plan_io.WAITS_FOR).to_numpy()
        g.wait_prev = np.zeros(n, np.uint8)
        g.wait_prev[step] = lt.column(plan_io.WAIT_PREV).to_numpy(zero_copy_only=False)
        g.need_group = np.full(n, -1, I64)
        g.need_group[step] = np.where(wf >= 0, w.step_of(0, np.maximum(wf, 0)), -1)
        g.gate_bytes[step] = lt.column(plan_io.GATE_BYTES).to_numpy()
        return g
    if needs is not None and needs.value_bytes is not None:
        # one copy per launch whose values a group's prefetches wait for (as the planner counts them)
        pf_step = np.repeat(np.arange(n, dtype=I64), np.diff(g.pf_ptr))
        ga = g.pf_after >= 0
        first = first_need(pf_step[ga], g.pf_unit[ga], needs, n)
        pair = np.unique(pf_step[ga] * (n + 1) + np.maximum(first, 0))
        np.add.at(g.gate_bytes, pair // (n + 1), needs.value_bytes[pair % (n + 1)])
    # per step, the latest earlier group holding a prefetch it needs
    need_group = np.full(n, -1, I64)
    if needs is not None:
        pf_step = np.repeat(np.arange(n, dtype=I64), np.diff(g.pf_ptr))
        first = first_need(pf_step, g.pf_unit, needs, n)
        early = first > pf_step
        np.maximum.at(need_group, first[early], pf_step[early])
    else:
        pf = ~is_ev & (cols[plan_io.NEEDED_BY] > lid)
        if pf.any():
            np.maximum.at(need_group, w.step_of(0, cols[plan_io.NEEDED_BY][pf]), w.step_of(0, lid[pf]))
    g.need_group = need_group
    # a group that evicts units the launch before uses starts once it ends (as the planner marks it)
    used = needs if needs is not None else w.truth
    ev_step = np.repeat(np.arange(n, dtype=I64), np.diff(g.ev_ptr))
    m = ev_step > 0
    if m.any():
        prev_step = ev_step[m] - 1
        occ_step = np.repeat(np.arange(n, dtype=I64), np.diff(used.ptr))
        occ = np.sort(used.unit.astype(I64) * (n + 1) + occ_step)
        q = g.ev_unit[m].astype(I64) * (n + 1) + prev_step
        pos = np.minimum(np.searchsorted(occ, q), max(len(occ) - 1, 0))
        hit = occ[pos] == q if len(occ) else np.zeros(len(q), bool)
        g.wait_prev = np.zeros(n, np.uint8)
        g.wait_prev[ev_step[m][hit]] = 1
    return g


def plan_model_predictions(plan: plan_io.Plan, trace: T.Trace, fallback: str):
    """The predictions the plan was made on (footprints, and the pieces index values chose:
    adaptive.predicted_gated), when its model (manifest) can be read: a launch larger than
    memory then runs as planned (Belady within the launch on the predicted next uses); without
    it, such launches give up their first units."""
    path = plan.manifest.get("model")
    if not path:
        return None
    try:
        return predicted_gated(load_model(path), trace, plan.manifest.get("fallback") or fallback)
    except Exception:  # noqa: BLE001 -- a moved or unreadable model: replay without it
        return None


def plan_footprints(plan: plan_io.Plan, trace: T.Trace) -> F.Footprints:
    cols = plan.columns()
    s, e = F.page_span(cols[plan_io.ADDRESS], cols[plan_io.BYTES], trace.page_size)
    return F.Footprints.from_intervals(cols[plan_io.LAUNCH_ID], s, e, trace.n_launches, trace.page_size, "predicted")
