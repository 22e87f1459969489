"""Hand-made traces for checking the driver model: launches that touch single words at given offsets.

    from pagecast.datasets.handmade import touch_trace, one_page_per_block
    touch_trace("lone.pctrace", one_page_per_block(200, per_launch=1))   # 200 lone faults

A trace made here is an ordinary trace (format v1, with truth, `full` mode): launch i of the
kernel `touch_pages(float* p, int n, long stride)` touches 4 bytes at each offset of
`launches[i]` inside one managed allocation. One touch per 2 MiB VA block leaves the tree
prefetcher nothing to widen, so each is a lone fault of its own block (docs/driver-validation.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from pagecast.uvm import VA_BLOCK

from .engine import READ, Builder, Kernel, Ranges

K_TOUCH = Kernel("touch_pages", [("p", "float*"), ("n", "int"), ("stride", "long")], {"p": "strided"})


def one_page_per_block(blocks: int, per_launch: int = 1) -> list[np.ndarray]:
    """Offsets touching one word in each of `blocks` different 2 MiB blocks, `per_launch` blocks a launch."""
    offs = np.arange(blocks, dtype=np.int64) * VA_BLOCK
    return [offs[i:i + per_launch] for i in range(0, blocks, per_launch)]


def touch_trace(path: str | Path, launches: Sequence[np.ndarray], *, name: str = "touch",
                force: bool = True) -> Path:
    """Write a trace whose launch i touches 4 bytes at each offset in launches[i] of one allocation."""
    launches = [np.asarray(o, dtype=np.int64) for o in launches]
    if not launches or any(len(o) == 0 for o in launches):
        raise ValueError("every launch needs at least one offset")
    if min(int(o.min()) for o in launches) < 0:
        raise ValueError("offsets must be >= 0")
    top = max(int(o.max()) for o in launches) + 4096
    b = Builder(name, seed=0)
    buf = b.malloc(top, "p")
    base = b.reserve(len(launches))
    which = np.concatenate([np.full(len(o), i) for i, o in enumerate(launches)])
    n = np.array([len(o) for o in launches])
    b.launch(K_TOUCH, base + np.arange(len(launches)), {"p": buf.ptr(), "n": n, "stride": VA_BLOCK}, grid=(1,),
             touches=[Ranges(buf, which, np.concatenate(launches), 4, READ)])
    return b.write(Path(path), mode="full", force=force, workload={"name": name, "argv": None})
