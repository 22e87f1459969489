"""Handing freed memory back to the operating system in long, array-heavy commands.

glibc's malloc serves a request of at least its mmap threshold (128 KiB at start) with a mapping
of its own, unmapped when freed; but each time such a block is freed the threshold rises to its
size (up to 32 MiB on 64-bit systems), so later arrays below that size come from the heap, where
freed memory stays with the process while anything above it is live (mallopt(3), M_MMAP_THRESHOLD:
"dynamic mmap threshold"). A replay makes and frees thousands of per-launch and per-use arrays of
1-30 MB between its runs; the heap then grows with freed blocks it cannot return. Setting the
threshold (which turns its dynamic adjustment off) keeps those arrays in mappings of their own,
returned as soon as they are freed: the peak is what is live.

pyarrow's default pool (mimalloc) keeps freed memory of its own for reuse: after a pass that reads
a trace's large tables row group by row group (the faults and migrations of observed footprints,
the index values a model's predictions read), tens of MB the process no longer uses stay in it
until later arrow work reuses them. `release_arrow_memory` hands them back at the end of such a
pass (the pool's `release_unused`).
"""

from __future__ import annotations

import ctypes
import sys

import pyarrow as pa

M_MMAP_THRESHOLD = -3   # <malloc.h>
MMAP_THRESHOLD = 1 << 20   # arrays from 1 MiB on get their own mapping


def return_freed_arrays(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at `threshold` bytes (see the module doc); whether it was set
    (False where the C library is not glibc: nothing changes there)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, int(threshold)))


def release_arrow_memory() -> None:
    """Return what pyarrow's default pool holds freed to the system (see the module doc): called
    where a pass over a trace's large tables ends, before the work that follows allocates again.
    Results do not depend on it."""
    pa.default_memory_pool().release_unused()
