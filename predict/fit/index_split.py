"""A slot's bytes within its block: the split of an indexed region whose values are divided.

A slot mapping's value v names block `floor(v / d)` and slot `v mod d` in it. A slot-major cache
(`[block, slot, head, bytes]`) puts the slot's bytes together at `slot_bytes * (v mod d)`: the
value times `stride / d`, which the plain indexed fit finds. A head-major one (`[block, head,
slot, bytes]`) spreads them over the block: `slot_bytes` bytes in each of P parts (heads),
`stride / P` bytes apart, at `slot_bytes * (v mod d)` in each. With the block's stride S and d
known (the whole-block fit: `index_values._divided`), the split is fixed by P alone: a part is
`S / P` bytes and holds d slots, so `slot_bytes = S / (P*d)`, and P divides `S / d`. Each
divisor P of `S / d` (P = 1 the slot-major reading) is one region; those that verify, hold every
fault page and make the faults likeliest stand against the whole block (`fault_pages_loglik`: a
fault on one of m pages its big page holds has probability 1/m), where the faults are
`odds_per_term` times likelier under the split (at page grain the split names fewer pages around
each fault; where a block lies within a page or two it names the same pages, and the whole block
stands).

Where no whole block verifies (a block wider than a big page, of which a slot touches a part in
each head), the block's stride is solved from the records directly (`block_strides`): the first
byte a launch touches is `start + S*floor(v0 / d) + slot_bytes*(v0 mod d)` for its smallest value
v0 (the map is increasing in v), so the first observed big page bounds `start + S*q0` within a
part's width, and one solve over q0 (`solve.solve_pair`, the value's own term) gives S. Where the
smallest blocks lie in the first big pages at every launch (a few launches, or a pool whose low
blocks every batch touches), that edge leaves S loose (any S a few big pages over q0 holds, and
the simplest of them is checked and refused); there the last touched byte, in the largest
value's block q1, bounds `start + S*(q1 + 1)` from the last observed byte up to a big page past
it, and one solve over q1 + 1 pins S to within a big page over q1 (only where the first edge's S
was refused: each solve and each split it leads to costs fit time at every index word).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .. import formula as FM
from ..model_io import BlockSplit, Region
from .data import KernelData
from .layout import fault_pages_loglik
from .solve import solve_pair

MAX_PARTS = 64   # parts (heads) a block is split into at most


def split_regions(region: Region) -> list[Region]:
    """The block splits of whole-block `region` (a constant stride S, values over d = value_div):
    one region per divisor P of S/d, at most MAX_PARTS, fewest parts first; [] where the
    stride is not a constant or d does not divide it."""
    d, st = int(region.value_div), region.stride
    if d < 2 or st is None or st.n_terms or st.const <= 0 or st.const % d:
        return []
    per = st.const // d
    out = []
    for p in range(1, min(per, MAX_PARTS) + 1):
        if per % p:
            continue
        slot = per // p
        out.append(dataclasses.replace(region, chunk=FM.Formula(slot, ()), fit={},
                                       block_split=BlockSplit(slot_bytes=slot, parts=p, part_stride=st.const // p)))
    return out


def best_split(kd: KernelData, best: tuple, cat, sel, sv, check, pages) -> tuple:
    """`best` (a whole-block best tuple: region, verified, unexplained, -, count values) or the
    block split that verifies (`check(region)` -> (verified per launch, unexplained)), holds
    every fault page and makes the faults likeliest, where they are `odds_per_term` times likelier
    under it than under the whole block (or the whole block leaves fault pages out). `pages(r)`:
    the region's template pages for fault_pages_loglik."""
    r0 = best[0]
    cands = split_regions(r0)
    if not cands:
        return best
    ll0, held0, _ = fault_pages_loglik(kd, r0, cat, sv, pages=pages(r0))
    top, top_ll = None, None
    for r in cands:
        okv, unexplained = check(r)
        if unexplained > kd.allowed(len(sv)):
            continue
        ll, held, _ = fault_pages_loglik(kd, r, cat, sv, pages=pages(r))
        if held and (top_ll is None or ll > top_ll + 1e-9):
            top, top_ll = (r, okv, unexplained, None, best[4]), ll
    if top is None:
        return best
    if held0 and top_ll - ll0 < np.log(kd.params.odds_per_term):
        return best
    return top


def block_strides(kd: KernelData, g, q0, q1, bounds, with_values) -> list:
    """Constant block strides S for values over a divisor, from where each launch's touched bytes
    begin and end: the first lies in the smallest value's block q0, at most a block past its
    start (`start + S*q0` in [first - S, first]), the last in the largest value's block q1
    (`start + S*(q1+1)` in [last, last + S]); one solve over q0 with the first's bounds loosened
    by a big page at a time (the upper bound hard: the first observed byte is touched), each S
    found checked against every launch's blocks. Where the check refuses the S the first edge
    gives (that edge leaves S loose), one solve over q1 + 1 with the last's bounds loosened the
    same way (the lower bound hard: the last observed byte is touched). Fewest big pages of
    slack first (module doc). `with_values`: the solver's view of the launches with a value's
    feature (index_values' own)."""
    s_lo, s_hi, e_lo, e_hi = (np.asarray(x, np.int64) for x in bounds)
    first = with_values(kd, g, q0, q0, True, True)
    last = None
    out: list = []
    for slack in (1, 2, 4):
        w = slack * kd.bigp * kd.ps
        if _add_block_stride(kd, g, q0, q1, (s_hi, e_lo, e_hi), first, (s_lo - w, s_hi), "hi", out) != "refused":
            continue
        last = last or with_values(kd, g, q1 + 1, q1 + 1, True, True)
        _add_block_stride(kd, g, q0, q1, (s_hi, e_lo, e_hi), last, (e_lo, np.minimum(e_hi, FM.INF) + w), "lo", out)
    return out


def _add_block_stride(kd: KernelData, g, q0, q1, bounds, ex, edge, side: str, out: list) -> str:
    """The stride of one edge's solve (`block_strides`), appended to `out` where it is a positive
    constant times the value and every launch's blocks hold its touched bytes (but those lost
    records explain): "kept", "refused" by that check, or "none" (no such stride solved)."""
    s_hi, e_lo, e_hi = bounds
    res = solve_pair(ex, ex.group, [edge], hard={0: side}, min_terms={0: 1}, max_terms=1)
    if res is None:
        return "none"
    f = res[0][0]
    if len(f.terms) != 1 or f.terms[0][0] <= 0:
        return "none"
    S = int(f.terms[0][0])
    c0 = s_hi - S * q0           # the start each launch allows at most
    ok = (c0.min() + S * (q1 + 1) >= e_lo) & (c0.min() + S * q1 < np.minimum(e_hi, FM.INF))
    if int((~ok).sum()) > kd.allowed(len(g)):
        return "refused"
    if FM.Formula(S, ()) not in out:
        out.append(FM.Formula(S, ()))
    return "kept"
