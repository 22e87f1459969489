"""Policy `demand`: UVM demand paging, nothing moved ahead (the baseline every speedup is over)."""

from __future__ import annotations

from .base import Policy


class Demand(Policy):
    name = "demand"
    compared_as = "speedup_vs_demand"   # the reference time of every run at the same capacity
    sizes_runs = True
    description = "UVM demand paging: a fault per missing big page, evictions by 2 MiB chunk (FIFO or LRU)"
    # one launch at a time: nothing prefetched; an emulated capacity evicts in the order units
    # became resident, as the driver's victim list is ordered by allocation (docs/uvm-facts.md)
    online = True
    victims = "fifo"
    lru_one_pass = True
