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
from numba import njit

from ..unit_space import I64, Needs, Workload
from .faults import prefetch_uses, unit_move_seconds
from .groups import Groups


def fitted_needs(block_plan: Groups, block_needs: Needs, base: Needs, w: Workload, profile) -> Needs:
    """`block_needs` (the block span of `base`, planned as `block_plan`) with the (launch, block)
    pairs whose widening does not pay (module doc) narrowed back to `base`'s units."""
    u = w.universe
    m = I64(u.n_units + 1)
    need, own, useful = prefetch_uses(block_plan, block_needs, base)
    fetched = need >= 0
    pair = need[fetched] * m + u.block_lo[block_plan.pf_unit[fetched]]
    del need
    # the pairs' keys and each entry's key (np.unique's inverse made by its argsort: five arrays of
    # every prefetch entry; a sort and a search are two), counted on the entries that count
    keys = np.sort(pair)
    keys = keys[np.concatenate([[True], keys[1:] != keys[:-1]])] if len(keys) else keys
    inv = np.searchsorted(keys, pair)
    del pair
    own, useful = own[fetched], useful[fetched]
    wasted = np.bincount(inv[~own & ~useful], minlength=len(keys))
    n_useful = np.bincount(inv[useful], minlength=len(keys))
    del inv, own, useful, fetched
    cand = (n_useful == 0) & (wasted > 0)
    if not cand.any():
        return block_needs
    # the transfers widening merged: the footprint's runs of consecutive units in the pair, less one
    bkeys, bruns = _pair_runs(base.ptr, base.unit, u.block_lo, m)
    where = np.minimum(np.searchsorted(bkeys, keys[cand]), max(len(bkeys) - 1, 0))
    runs = np.where(bkeys[where] == keys[cand], bruns[where], 1) if len(bkeys) else np.ones(int(cand.sum()))
    narrow = keys[cand][wasted[cand] * unit_move_seconds(profile, w.gran)
                        > np.maximum(runs - 1, 0) * profile.transfer_latency_s]
    if len(narrow) == 0:
        return block_needs
    ptr, unit = _narrowed(block_needs.ptr, block_needs.unit, base.ptr, base.unit, u.block_lo, np.sort(narrow), m)
    return Needs(ptr, unit)


@njit(cache=True)
def _pair_runs(ptr, unit, block_lo, m):
    """Per (step, block) pair of a needs CSR (ascending units in a step, so pairs come in order):
    its key step * m + block and how many runs of consecutive units it holds."""
    n = len(unit)
    keys = np.empty(n, np.int64)
    runs = np.zeros(n, np.int64)
    p = -1
    for s in range(len(ptr) - 1):
        for k in range(ptr[s], ptr[s + 1]):
            key = s * m + block_lo[unit[k]]
            if p < 0 or keys[p] != key:
                p += 1
                keys[p] = key
                runs[p] = 1
            elif unit[k] != unit[k - 1] + 1:
                runs[p] += 1
    return keys[:p + 1], runs[:p + 1]


@njit(cache=True)
def _narrowed(s_ptr, s_unit, b_ptr, b_unit, block_lo, narrow, m):
    """The needs `s` (widened) with the (step, block) pairs in `narrow` (sorted keys) replaced by
    the units `b` (the footprint) holds there; units stay ascending within a step."""
    n = len(s_ptr) - 1
    out = np.empty(len(s_unit) + len(b_unit), s_unit.dtype)   # units of s's universe: s's width (unit_space.narrow)
    ptr = np.zeros(n + 1, np.int64)
    o = 0
    q = 0
    for s in range(n):
        while q < len(narrow) and narrow[q] < s * m:
            q += 1
        k = s_ptr[s]
        kb = b_ptr[s]
        while k < s_ptr[s + 1]:
            bl = block_lo[s_unit[k]]
            key = s * m + bl
            while q < len(narrow) and narrow[q] < key:
                q += 1
            if q < len(narrow) and narrow[q] == key:
                while kb < b_ptr[s + 1] and block_lo[b_unit[kb]] < bl:
                    kb += 1
                while kb < b_ptr[s + 1] and block_lo[b_unit[kb]] == bl:
                    out[o] = b_unit[kb]
                    o += 1
                    kb += 1
                while k < s_ptr[s + 1] and block_lo[s_unit[k]] == bl:
                    k += 1
            else:
                out[o] = s_unit[k]
                o += 1
                k += 1
        ptr[s + 1] = o
    return ptr, out[:o].copy()
