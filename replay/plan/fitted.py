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

from ..unit_space import Needs, Workload
from .faults import prefetch_uses, unit_move_seconds
from .groups import Groups


def fitted_needs(block_plan: Groups, block_needs: Needs, base: Needs, w: Workload, profile) -> Needs:
    """`block_needs` (the block span of `base`, planned as `block_plan`) with the (launch, block)
    pairs whose widening does not pay (module doc) narrowed back to `base`'s units.

    A pair is a run of `block_needs`' uses (a step's units ascend and a block's units are
    consecutive ids), so what the rule counts per pair is kept per use of `block_needs`, one int32
    each (`_tally`), and the pairs are judged and narrowed in passes over the steps: no key per
    prefetch entry, no sort, nothing the size of every use but that tally (a key, a sorted copy
    and an inverse per entry, the base's pairs and a buffer of both needs were ~14 bytes a use of
    the block span more, the largest transient of template's planning)."""
    u = w.universe
    need, own, useful = prefetch_uses(block_plan, block_needs, base)
    tally = _tally(block_needs.ptr, block_needs.unit, block_plan.pf_unit, need, own, useful)
    del need, own, useful
    n = _judge(block_needs.ptr, block_needs.unit, base.ptr, base.unit, u.block_lo, tally,
               unit_move_seconds(profile, w.gran), float(profile.transfer_latency_s))
    if n == 0:
        return block_needs
    ptr = _narrowed_ptr(block_needs.ptr, block_needs.unit, base.ptr, base.unit, u.block_lo, tally)
    return Needs(ptr, _narrowed(block_needs.ptr, block_needs.unit, base.ptr, base.unit, u.block_lo, tally, ptr))


USEFUL = -1     # a tally's mark: a useful extra came in for the pair (it stays widened)
NARROWED = -2   # at a pair's first use, once judged: it goes back to the footprint's own units


@njit(cache=True)
def _find(unit, lo, hi, x):
    """The first position of `x` in the ascending unit[lo:hi] (hi where it is not there)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if unit[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def _tally(n_ptr, n_unit, pf_unit, need, own, useful):
    """Per use of the needs: USEFUL where a useful extra was fetched for that (step, unit), else how
    many wasted extras (neither the footprint's own nor useful) were: each prefetch entry counted
    at the use of its unit in the step it is for (`need`; -1: none)."""
    out = np.zeros(len(n_unit), np.int32)
    for k in range(len(need)):
        j = need[k]
        if j < 0 or own[k]:
            continue
        p = _find(n_unit, n_ptr[j], n_ptr[j + 1], pf_unit[k])
        if useful[k]:
            out[p] = USEFUL
        elif out[p] != USEFUL:
            out[p] += 1
    return out


@njit(cache=True)
def _judge(s_ptr, s_unit, b_ptr, b_unit, block_lo, tally, unit_s, latency_s):
    """Each (step, block) pair of the widened needs `s` with no useful extra and some wasted: marked
    NARROWED at its first use where its wasted units cost more (`unit_s` each) than the transfers
    the widening merged save (`latency_s` per run of consecutive units of the footprint `b` there,
    less one; one run where `b` has none). Returns how many were marked."""
    marked = 0
    for s in range(len(s_ptr) - 1):
        k = s_ptr[s]
        kb = b_ptr[s]
        while k < s_ptr[s + 1]:
            bl = block_lo[s_unit[k]]
            first = k
            wasted = 0
            any_useful = False
            while k < s_ptr[s + 1] and block_lo[s_unit[k]] == bl:
                if tally[k] == USEFUL:
                    any_useful = True
                else:
                    wasted += tally[k]
                k += 1
            if any_useful or wasted == 0:
                continue
            while kb < b_ptr[s + 1] and block_lo[b_unit[kb]] < bl:
                kb += 1
            runs = 0
            q = kb
            while q < b_ptr[s + 1] and block_lo[b_unit[q]] == bl:
                if runs == 0 or b_unit[q] != b_unit[q - 1] + 1:
                    runs += 1
                q += 1
            if runs == 0:
                runs = 1
            if wasted * unit_s > max(runs - 1, 0) * latency_s:
                tally[first] = NARROWED
                marked += 1
    return marked


@njit(cache=True)
def _narrowed_ptr(s_ptr, s_unit, b_ptr, b_unit, block_lo, tally):
    """The row pointers of `_narrowed`'s result (its first pass: memory for the result only)."""
    n = len(s_ptr) - 1
    ptr = np.zeros(n + 1, np.int64)
    for s in range(n):
        c = 0
        k = s_ptr[s]
        kb = b_ptr[s]
        while k < s_ptr[s + 1]:
            bl = block_lo[s_unit[k]]
            if tally[k] == NARROWED:
                while kb < b_ptr[s + 1] and block_lo[b_unit[kb]] < bl:
                    kb += 1
                while kb < b_ptr[s + 1] and block_lo[b_unit[kb]] == bl:
                    c += 1
                    kb += 1
                while k < s_ptr[s + 1] and block_lo[s_unit[k]] == bl:
                    k += 1
            else:
                c += 1
                k += 1
        ptr[s + 1] = ptr[s] + c
    return ptr


@njit(cache=True)
def _narrowed(s_ptr, s_unit, b_ptr, b_unit, block_lo, tally, ptr):
    """The needs `s` (widened) with the (step, block) pairs marked NARROWED at their first use
    replaced by the units `b` (the footprint) holds there; units stay ascending within a step."""
    n = len(s_ptr) - 1
    out = np.empty(ptr[n], s_unit.dtype)   # units of s's universe: s's width (unit_space.narrow)
    o = 0
    for s in range(n):
        k = s_ptr[s]
        kb = b_ptr[s]
        while k < s_ptr[s + 1]:
            bl = block_lo[s_unit[k]]
            if tally[k] == NARROWED:
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
    return out
