"""Policy `oracle`: plans on the true footprints (the bound)."""

from __future__ import annotations

from .base import Planned


class Oracle(Planned):
    name = "oracle"
    description = "plans on the true footprints (the bound)"
    # one launch at a time: the launch's footprint from a matching trace, relocated; victims by
    # Belady's next use, read from the same trace
    online = True
    victims = "belady"
    streams_front = True
    needs_relocator = True
    prefetches_footprint = True

    def launch_prefetch(self, view):
        return view.relocated_footprint()

    def needs(self, ctx):
        return ctx.w.truth
