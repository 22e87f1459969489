"""Small synthetic traces for the predictor's tests and benchmarks.

Not a workload model (those live in pagecast.datasets): a direct way to make a
trace from hand-made launches and true byte ranges, with full-mode fault data
the way the UVM driver reports it (one fault per touched 64 KiB big page at a
page touched there, coherence migrations of the touched big pages clipped to
the allocation, optionally a share of fault and migration records lost, counted in the
manifest's `dropped_records` as CUPTI counts its overflows).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from pagecast import trace as T
from pagecast.uvm import BIG_PAGE as BIG
from pagecast.uvm import PAGE as PS

HEAP = 0x7F40_0000_0000


@dataclass
class SynthTrace:
    allocs: list = field(default_factory=list)      # (address, bytes, first_launch, last_launch|None)
    launches: list = field(default_factory=list)    # (kernel, sizes, data bytes, grid, block)
    truth: list = field(default_factory=list)       # (launch, address, bytes)
    _next: int = HEAP
    _tail: int = HEAP

    def malloc(self, nbytes: int, align: int | None = None) -> int:
        """A managed allocation: 2 MiB aligned with a free 2 MiB after it (cudaMallocManaged), or,
        with `align`, right after the previous one at that alignment (a caching allocator's
        blocks carved from one segment: neighbours may share a big page)."""
        a = self._next if align is None else -(-self._tail // align) * align
        if align is None:
            self._next += -(-int(nbytes) // (2 << 20)) * (2 << 20) + (2 << 20)
        else:
            self._next = max(self._next, -(-(a + int(nbytes)) // (2 << 20)) * (2 << 20) + (2 << 20))
        self._tail = a + int(nbytes)
        self.allocs.append([a, int(nbytes), len(self.launches), None])
        return a

    def free(self, address: int) -> None:
        for al in self.allocs:
            if al[0] == address and al[3] is None:
                al[3] = len(self.launches) - 1

    def launch(self, kernel: str, params: list[tuple[str, object]], touches: list[tuple[int, int]],
               grid=(1, 1, 1), block=(128, 1, 1)) -> int:
        """params: (struct format, value) pairs, e.g. ("Q", ptr), ("i", n), ("16s", blob)."""
        data = b""
        sizes = []
        offsets = []
        for fmt, v in params:
            size = struct.calcsize("<" + fmt)
            align = min(8, size) if size in (1, 2, 4, 8) else 8
            while len(data) % align:
                data += b"\0"
            offsets.append(len(data))
            sizes.append(size)
            data += struct.pack("<" + fmt, v)
        lid = len(self.launches)
        self.launches.append((kernel, sizes, offsets, data, tuple(grid), tuple(block)))
        for a, n in touches:
            if n > 0:
                self.truth.append((lid, int(a), int(n)))
        return lid

    def write(self, path, *, drop: float = 0.0, seed: int = 0, mode: str = "full", with_truth: bool = True,
              faults: bool = True, force: bool = True, count_dropped: bool = True):
        """Write the trace. `drop`: share of fault and migration records lost (independently),
        counted in the manifest's dropped_records unless `count_dropped` is False (a collector
        that cannot count them)."""
        rng = np.random.default_rng(seed)
        n = len(self.launches)
        L = {T.LAUNCH_ID: np.arange(n, dtype=np.int64),
             T.KERNEL: [x[0] for x in self.launches],
             T.DEVICE: np.zeros(n, np.int32), T.STREAM: np.zeros(n, np.int64),
             T.GRID_X: [x[4][0] for x in self.launches], T.GRID_Y: [x[4][1] for x in self.launches],
             T.GRID_Z: [x[4][2] for x in self.launches], T.BLOCK_X: [x[5][0] for x in self.launches],
             T.BLOCK_Y: [x[5][1] for x in self.launches], T.BLOCK_Z: [x[5][2] for x in self.launches],
             T.SHARED_MEM_BYTES: np.zeros(n, np.int32),
             T.START_NS: np.arange(n, dtype=np.int64) * 1000, T.END_NS: np.arange(n, dtype=np.int64) * 1000 + 900,
             T.PARAM_OFFSETS: [x[2] for x in self.launches], T.PARAM_SIZES: [x[1] for x in self.launches],
             T.PARAM_DATA: [x[3] for x in self.launches]}
        A = {T.ALLOC_ID: np.arange(len(self.allocs), dtype=np.int64),
             T.ADDRESS: np.array([a[0] for a in self.allocs], np.uint64),
             T.BYTES: np.array([a[1] for a in self.allocs], np.int64),
             T.KIND: ["managed"] * len(self.allocs), T.DEVICE: np.zeros(len(self.allocs), np.int32),
             T.FIRST_LAUNCH: np.array([a[2] for a in self.allocs], np.int64),
             T.LAST_LAUNCH: [a[3] for a in self.allocs]}
        aaddr = np.array([a[0] for a in self.allocs], np.int64)
        aend = np.array([a[0] + -(-a[1] // PS) * PS for a in self.allocs], np.int64)
        fl, fa, ml, ma, mb = [], [], [], [], []
        seen_bp: set = set()
        for lid, addr, nb in self.truth:
            j = int(np.searchsorted(aaddr, addr, side="right") - 1)
            bp0, bp1 = addr // BIG, (addr + nb - 1) // BIG
            for bp in range(bp0, bp1 + 1):
                if mode == "natural":
                    if (j, bp) in seen_bp:
                        continue
                    seen_bp.add((j, bp))
                lo = max(addr, bp * BIG) // PS
                hi = (min(addr + nb, bp * BIG + BIG) - 1) // PS
                page = int(rng.integers(lo, hi + 1))
                fl.append(lid), fa.append(page * PS)
                s = bp * BIG
                e = min(bp * BIG + BIG, int(aend[j]))
                ml.append(lid), ma.append(s), mb.append(e - s)
        fl, fa = np.array(fl, np.int64), np.array(fa, np.int64)
        # lost records: their own stream, faults and migrations independently (CUPTI's overflows)
        loss = np.random.default_rng([*np.atleast_1d(seed).tolist(), 99])
        keep = loss.random(len(fl)) >= drop
        if not faults:
            keep[:] = False
        F = {T.TIME_NS: fl[keep] * 1000 + 10, T.ADDRESS: fa[keep].astype(np.uint64),
             T.COUNT: np.ones(int(keep.sum()), np.int32), T.ACCESS: ["read"] * int(keep.sum()),
             T.DEVICE: np.zeros(int(keep.sum()), np.int32),
             T.LAUNCH_ID: fl[keep] if mode == "full" else [None] * int(keep.sum())}
        ml = np.array(ml, np.int64)
        mk = (loss.random(len(ml)) >= drop) if faults else np.zeros(len(ml), bool)
        dropped = int((~keep).sum() + (~mk).sum()) if faults else 0
        M = {T.START_NS: ml[mk] * 1000 + 20, T.END_NS: ml[mk] * 1000 + 30,
             T.ADDRESS: np.array(ma, np.uint64)[mk], T.BYTES: np.array(mb, np.int64)[mk],
             T.DIRECTION: ["htod"] * int(mk.sum()), T.CAUSE: ["coherence"] * int(mk.sum()),
             T.LAUNCH_ID: ml[mk] if mode == "full" else [None] * int(mk.sum())}
        tables = {T.LAUNCHES: L, T.ALLOCATIONS: A, T.FAULTS: F, T.MIGRATIONS: M}
        if with_truth:
            tables[T.TRUTH] = {T.LAUNCH_ID: np.array([t[0] for t in self.truth], np.int64),
                               T.ADDRESS: np.array([t[1] for t in self.truth], np.uint64),
                               T.BYTES: np.array([t[2] for t in self.truth], np.int64),
                               T.ACCESS: ["readwrite"] * len(self.truth)}
        man = T.new_manifest(mode=mode, source="synthetic", workload={"name": "synth", "argv": None},
                             driver_prefetch=False, **({"dropped_records": dropped} if count_dropped else {}))
        return T.write_trace(path, man, tables, force=force)


def vector_workload(scale: int, seed: int = 0, iters: int = 4) -> SynthTrace:
    """vector add (linear 4*n), a halo stencil (start -4*nx, end 4*nx*ny + 4*nx), a fixed
    reduction buffer, a channel slice (strided) and a random gather (irregular)."""
    rng = np.random.default_rng(seed)
    st = SynthTrace()
    n = 262144 * scale + int(rng.integers(0, 4096))
    x, y, z = st.malloc(4 * n), st.malloc(4 * n), st.malloc(4 * n)
    red = st.malloc(256)
    nx, ny = 512 * scale + 16 * int(rng.integers(0, 8)), 256 + 64 * scale
    g0, g1 = st.malloc(4 * nx * (ny + 2)), st.malloc(4 * nx * (ny + 2))
    C, H, W = 16, 8 * scale + 8, 1024
    t = st.malloc(4 * C * H * W * 4)
    gat = st.malloc(64 << 20)
    for it in range(iters):
        st.launch("vadd", [("Q", x), ("Q", y), ("Q", z), ("i", n)],
                  [(x, 4 * n), (y, 4 * n), (z, 4 * n)], grid=(-(-n // 256), 1, 1), block=(256, 1, 1))
        st.launch("reduce", [("Q", x), ("Q", red), ("i", n)], [(x, 4 * n), (red, 8)])
        a, b = (g0, g1) if it % 2 == 0 else (g1, g0)
        st.launch("stencil", [("Q", a + 4 * nx), ("Q", b + 4 * nx), ("i", nx), ("i", ny), ("f", 0.25)],
                  [(a, 4 * nx * (ny + 2)), (b + 4 * nx, 4 * nx * ny)])
        c = int(rng.integers(0, C))
        st.launch("slice", [("Q", t), ("i", c), ("i", H * W), ("i", C)],
                  [(t + 4 * (k * C * H * W + c * H * W), 4 * H * W) for k in range(4)])
        idx = rng.integers(0, (64 << 20) // BIG, size=8)
        st.launch("gather", [("Q", gat), ("i", 8)], [(gat + int(i) * BIG + 128, 512) for i in idx])
    return st
