"""The CUDA Unified Memory driver's geometry: the one place its sizes are defined.

Every module that needs a page, big-page, VA-block or eviction-chunk size, the
fault batch or the tree prefetcher's threshold imports it from here. What each
number is and where it comes from (the nvidia-uvm driver's sources, MSched's
paper) is in docs/uvm-facts.md.
"""

from __future__ import annotations

PAGE = 4096                     # a UVM page on x86-64: the unit pages are tracked in
BIG_PAGE = 64 * 1024            # a GPU fault is widened to its 64 KiB big page (the migration unit)
VA_BLOCK = 2 * 1024 * 1024      # a VA block: the tree prefetcher's scope, never crossed
ROOT_CHUNK = 2 * 1024 * 1024    # a root chunk: what the driver evicts at once
FAULT_BATCH = 256               # fault-buffer entries fetched and serviced together
PREFETCH_THRESHOLD = 0.51       # the tree prefetcher fills a region more than this share resident
