"""The `fitted` span: whole 2 MiB blocks where widening pays, the footprint's own units elsewhere.

The `block` span widens every launch's units to the whole 2 MiB VA blocks they
lie in: fewer, longer transfers, and neighbours that later launches use come
in with them (the LLM decoders' small activation buffers share blocks). But it
widens everything: a row chosen by data (an embedding lookup) brings its whole
block of the table, 31 units nobody reads, on every such launch
(docs/cost-model.md, "The plan's span"). `fitted_needs` reads the block plan
itself: for each (launch, block) it fetches, the extra units it brought for
that launch (not in the footprint there) are *useful* if a later launch uses
them before the plan evicts them, and *wasted* otherwise. A (launch, block)
with no useful extra whose wasted units cost the copy engines more than the
transfers the widening merged (`transfer_latency_s` per transfer saved,
against the bulk cost of a unit in and out again per wasted unit) goes back to
its own units; the rest stay widened. The result is planned like any span and
kept only if its trial run is fastest (spans.choose_span).
"""

from __future__ import annotations

import numpy as np

from ..unit_space import I64, Needs, Workload
from .faults import prefetch_uses, unit_move_seconds
from .groups import Groups


def fitted_needs(block_plan: Groups, block_needs: Needs, base: Needs, w: Workload, profile) -> Needs:
    """`block_needs` (the block span of `base`, planned as `block_plan`) with the (launch, block)
    pairs whose widening does not pay (module doc) narrowed back to `base`'s units."""
    n = block_plan.n_steps
    u = w.universe
    m = I64(u.n_units + 1)
    need, own, useful = prefetch_uses(block_plan, block_needs, base)
    fetched = need >= 0
    pair = need[fetched] * m + u.block_lo[block_plan.pf_unit[fetched]]
    keys, inv = np.unique(pair, return_inverse=True)
    wasted = np.bincount(inv, weights=~own[fetched] & ~useful[fetched], minlength=len(keys))
    n_useful = np.bincount(inv, weights=useful[fetched], minlength=len(keys))
    # the transfers widening merged: the footprint's runs of consecutive units in the pair, less one
    bstep = np.repeat(np.arange(n, dtype=I64), np.diff(base.ptr))
    bu = base.unit.astype(I64)
    bpair = bstep * m + u.block_lo[bu]
    run_start = np.ones(len(bu), bool)
    run_start[1:] = (bpair[1:] != bpair[:-1]) | (bu[1:] != bu[:-1] + 1)
    pk, pinv = np.unique(bpair, return_inverse=True)
    runs_of = np.bincount(pinv, weights=run_start, minlength=len(pk))
    where = np.searchsorted(pk, keys)
    found = (where < len(pk)) & (pk[np.minimum(where, max(len(pk) - 1, 0))] == keys) if len(pk) else \
        np.zeros(len(keys), bool)
    runs = np.where(found, runs_of[np.minimum(where, max(len(pk) - 1, 0))] if len(pk) else 0, 0)
    narrow = keys[(n_useful == 0) & (wasted * unit_move_seconds(profile, w.gran)
                                      > np.maximum(runs - 1, 0) * profile.transfer_latency_s)]
    if len(narrow) == 0:
        return block_needs
    sstep = np.repeat(np.arange(n, dtype=I64), np.diff(block_needs.ptr))
    su = block_needs.unit.astype(I64)
    drop = np.isin(sstep * m + u.block_lo[su], narrow)
    add = np.isin(bpair, narrow)
    step = np.concatenate([sstep[~drop], bstep[add]])
    unit = np.concatenate([su[~drop], bu[add]])
    order = np.lexsort((unit, step))
    step, unit = step[order], unit[order]
    ptr = np.zeros(n + 1, I64)
    np.cumsum(np.bincount(step, minlength=n), out=ptr[1:])
    return Needs(ptr, unit)
