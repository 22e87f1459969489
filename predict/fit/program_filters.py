"""A kernel's programs that return early read none of their buffers.

A row filter (`row_filter`, fit.row_filters) says which of a batch's rows a kernel reads: a
prefill kernel's programs return for decode queries of one token and read no KV block for them.
The same programs then read no query row and write no output row for them either. In a buffer
of many big pages the records show that directly, and the buffer's own fit finds the filter.
In a buffer smaller than one big page they cannot: one fault per touched big page says only
that some row was read, so the whole buffer and the kept rows verify alike, and a filter the
buffer's own records do not need is not tried (`index_values._run_regions`).

Once the kernel's regions are fitted, a region read as a range, the whole allocation or the
buffer's first rows up to a count another buffer holds takes,
where another region of the kernel holds a row filter, the rows back to back that filter keeps
(`index_values.fit_filtered_runs`: `[p0 + S*v(p10)[i], +S*(v(p10)[i+1] - v(p10)[i])) for
i < grid_x, rows where v(p10)[i+1] - v(p10)[i] >= 3`): the filter is the kernel's, proven on
another buffer, so it needs no odds of its own. It must verify, hold every fault page the records
show (a record's page was certainly touched: a program that reads a filtered-out row would fault
there at some launch), predict fewer pages, and make the faults likelier
(`layout.fault_pages_loglik`: each touched big page faults at a touched page drawn at random, so
a fault is likelier under fewer pages around it). docs/template-model.md, "Filters a kernel's
programs share".
"""

from __future__ import annotations

import numpy as np

from ..model_io import Region, RowFilter
from .index_values import indexed_pages
from .layout import fault_pages_loglik
from .region import RegionFit

RANGES = ("fixed", "linear", "allocation")


def kernel_filters(regions: list[Region]) -> list[RowFilter]:
    """The row filters the kernel's regions hold, each once, in the regions' order."""
    out: list[RowFilter] = []
    for r in regions:
        if r.row_filter is not None and r.row_filter not in out:
            out.append(r.row_filter)
    return out


def may_take(region: Region) -> bool:
    """Can `region` take a kernel's filter: a range, the whole allocation, or a one-dimensional
    indexed region without a filter (the buffer's first rows up to a count another buffer holds)."""
    return region.cls in RANGES or (region.cls == "indexed" and region.row_filter is None
                                    and region.row_stride is None)


def program_filtered(rf: RegionFit, region: Region, filters: list[RowFilter]) -> Region:
    """`region`, or where it `may_take` one of the kernel's `filters`, the rows back to back that
    filter keeps (module doc), the first that qualifies."""
    if not filters or not may_take(region):
        return region
    kd, cat = rf.kd, rf.cat
    for only in filters:
        r = rf.filtered_runs(only)
        if r is None:
            continue
        (rep, sp, ep), have = indexed_pages(kd, r, cat, rf.sel)
        if region.cls == "indexed":
            have &= indexed_pages(kd, region, cat, rf.sel)[1]
        keep = have & ~rf.nat
        use = rf.sel[keep]
        if not len(use):
            continue
        new = np.bincount(rep, weights=ep - sp, minlength=len(rf.sel))[keep].sum()
        _, sp0, ep0 = _pages(kd, region, cat)(use)
        ll, held, _ = fault_pages_loglik(kd, r, cat, use, pages=_pages(kd, r, cat))
        ll0, _, _ = fault_pages_loglik(kd, region, cat, use, pages=_pages(kd, region, cat))
        if held and new < (ep0 - sp0).sum() and ll >= ll0:
            return rf.take_filtered_runs(only)
    return region


def _pages(kd, region: Region, cat):
    """A function of launches `sel` that gives the region's pages there: (launch as a position in
    sel, start page, end page), a range's and the allocation's clipped to the allocation."""
    if region.cls == "indexed":
        return lambda sel: indexed_pages(kd, region, cat, sel)[0]

    def pages(sel: np.ndarray):
        n = len(sel)
        lo, hi = cat.alloc_s[sel].astype(np.int64), cat.alloc_e[sel].astype(np.int64)
        if region.cls == "allocation":
            return np.arange(n), lo, hi
        g = kd.group[sel]
        vals = {nm: kd.uniq[g, k] for k, nm in enumerate(kd.sel_names)}
        one = np.ones(n, np.int64)
        base = cat.base[sel]
        sp = (base + np.asarray(region.start.evaluate(vals), np.int64) * one) // kd.ps
        ep = -(-(base + np.asarray(region.end.evaluate(vals), np.int64) * one) // kd.ps)
        return np.arange(n), np.clip(sp, lo, hi), np.clip(ep, lo, hi)
    return pages
