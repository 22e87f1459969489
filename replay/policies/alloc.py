"""Policy `alloc`: before each launch, the whole allocations its pointer parameters point into
(MSched's baseline)."""

from __future__ import annotations

from ..plan.belady import plan_groups
from ..plan.groups import chunk_groups_to_units
from ..plan.spans import alloc_needs, alloc_units
from .base import Planned


class Alloc(Planned):
    """Whole allocations before each launch (MSched's baseline).

    Planned on units like the others, unless the needs hold more than
    CHUNK_PLAN_OCCURRENCES unit touches (a long trace whose kernels all point
    into one large allocation needs every unit of it at every launch): then
    planned on the driver's eviction chunks (2 MiB), whole chunks but for an
    allocation's first and last, at 1/32 of the work, a chunk counting as
    its size of capacity."""

    name = "alloc"
    description = "before each launch, whole allocations its pointer parameters point into (MSched's baseline)"
    spans = ("unit",)   # the baseline as MSched defines it: whole allocations, nothing else
    fronts = (False,)
    # one launch at a time: the allocations the launch's pointer arguments land in (the
    # runner looks them up in the driver); an emulated capacity evicts FIFO, as demand's
    online = True
    victims = "fifo"
    reads_arguments = True

    def launch_prefetch(self, view):
        return view.allocation_ranges()

    def needs(self, ctx):
        return alloc_needs(ctx.w)

    def chunk_needs(self, ctx):
        return ctx.w.kept("alloc_chunks", lambda: ctx.w.chunk_needs_from([t.alloc_fp for t in ctx.w.tasks]))

    def prefetch(self, ctx):
        occ = alloc_units(ctx.w)
        if occ <= CHUNK_PLAN_OCCURRENCES:
            return super().prefetch(ctx)
        u = ctx.w.universe
        g = plan_groups(self.chunk_needs(ctx), u.n_chunks, ctx.cap_units, unit_weight=u.chunk_weight)
        return chunk_groups_to_units(g, u.chunk_lo, u.chunk_hi)


CHUNK_PLAN_OCCURRENCES = 20_000_000
