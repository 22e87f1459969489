"""The machinery behind the workload models: kernels, allocations, launches, truth,
a roofline clock and an emulation of the NVIDIA UVM driver's faults and migrations.

A workload model describes its run as blocks of launches of one kernel at a time
(all launches of a kernel in one call, with per-launch argument arrays and the
launch ids they take in host issue order), and the byte ranges each launch
touches. `Builder.write` turns that into a trace (format v1, with truth):

- kernel times from a roofline on an H200-like GPU (HBM 4.8 TB/s, 60 TFLOP/s
  fp32, 900 TFLOP/s bf16), launches serialized with small gaps;
- managed allocations at 2 MiB-aligned addresses, first-fit reuse of freed ranges
  (so a freed address comes back);
- the driver (docs/uvm-facts.md, "The driver"):
  `full` mode: every launch starts with nothing resident; it faults once per
  touched 64 KiB big page at a page it touched there (a record may stand for a
  few coalesced faults), with `coherence` htod migrations covering the touched
  big pages (merged when consecutive inside a 2 MiB block, clipped to the
  allocation); with the tree prefetcher on, a 2 MiB block of which more than 51%
  of the big pages were touched has the rest migrated too (cause `prefetch`).
  `natural` mode: the same, but only a big page's first touch in the whole run
  faults (per allocation: a freed and reused range faults again), the prefetcher
  acts on cumulative residency, nothing is evicted, and launch_id is left null.
  About 0.1% of fault records are dropped, as a real fault buffer loses some
  (the driver does not count them).
- record loss (`drop`): on top of that, fault and migration records are lost
  independently at a given rate, as CUPTI loses activity records when its
  buffers overflow, and counted in the manifest's `dropped_records` as CUPTI
  counts them. The loss draws from its own random stream, so a lossy trace is
  the clean trace of the same seed with records removed.

Everything is vectorized per kernel block and per chunk of launches, so 10^6
launches and 10^8 touched pages fit in a few GB.

Long because the builder, the roofline clock and the driver emulation work on the same
per-block launch arrays; the workload models themselves are modules of their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from pagecast import trace as T
from pagecast.uvm import BIG_PAGE, PAGE, PREFETCH_THRESHOLD, VA_BLOCK
from pagecast.values import ValuesRecorder

from .mangle import mangle

BIG_SHIFT = 16
PAGES_PER_BIG = BIG_PAGE // PAGE          # 16
BIGS_PER_BLOCK = VA_BLOCK // BIG_PAGE     # 32
FAULT_LOSS = 0.001                        # share of fault records lost

# Roofline of an H200-like GPU (NVIDIA H200 SXM datasheet: 4.8 TB/s HBM3e;
# ~60 TFLOP/s fp32 non-tensor; ~900 TFLOP/s dense bf16 tensor).
HBM_BYTES_PER_S = 4.8e12
PEAK_FLOPS = {"fp32": 60e12, "bf16": 900e12}
LAUNCH_OVERHEAD_NS = 2_000                # fixed per-kernel cost (launch + tail)
GAP_NS = (500, 2_500)                     # idle gap between serialized launches
MIGRATE_BYTES_PER_S = 25e9                # for migration timestamps only (PCIe-4-like)

HEAP_BASE = 0x7F40_0000_0000              # where managed allocations start (2 MiB aligned)

READ, WRITE, READWRITE = 0, 1, 2
ACCESS_NAMES = ("read", "write", "readwrite")

# ---- parameter layouts -------------------------------------------------------

_SCALARS = {  # C type -> (numpy dtype, size); pointers are 8-byte unsigned addresses
    "int": ("<i4", 4), "unsigned int": ("<u4", 4), "long": ("<i8", 8), "unsigned long": ("<u8", 8),
    "long long": ("<i8", 8), "float": ("<f4", 4), "double": ("<f8", 8), "bool": ("u1", 1),
    "char": ("i1", 1), "short": ("<i2", 2),
}


@dataclass(frozen=True)
class Struct:
    """A struct passed by value: fields at natural alignment, size padded to its alignment."""

    name: str
    fields: tuple[tuple[str, str], ...]

    def layout(self) -> tuple[list[tuple[str, str, int, int]], int, int]:
        out, off, align = [], 0, 1
        for fname, ctype in self.fields:
            dt, sz = _scalar(ctype)
            off = (off + sz - 1) // sz * sz
            out.append((fname, dt, off, sz))
            off += sz
            align = max(align, sz)
        return out, (off + align - 1) // align * align, align


STRUCTS: dict[str, Struct] = {}


def register_struct(s: Struct) -> Struct:
    STRUCTS[s.name] = s
    return s


def _scalar(ctype: str) -> tuple[str, int]:
    c = ctype.replace("const ", "").strip()
    if c.endswith("*"):
        return "<u8", 8
    if c in _SCALARS:
        return _SCALARS[c]
    raise ValueError(f"not a scalar C type: {ctype!r}")


# Template classes (cli.md): the intended class of each pointer parameter.
CLASSES = ("fixed", "linear", "strided", "allocation", "indexed", "irregular")
_CLASS_RANK = {c: i for i, c in enumerate(CLASSES)}


@dataclass
class Kernel:
    """One kernel: its C++ signature (mangled as nvcc would) and the intended template class
    of each pointer parameter it dereferences."""

    name: str
    params: list[tuple[str, str]]                      # (parameter name, C type)
    classes: dict[str, str] = field(default_factory=dict)  # pointer param (or struct.field) -> class
    template_ints: list[int] | None = None
    flops_kind: str = "fp32"

    def __post_init__(self) -> None:
        for c in self.classes.values():
            if c not in CLASSES:
                raise ValueError(f"{self.name}: unknown template class {c!r}")
        self.mangled = mangle(self.name, [t for _, t in self.params], self.template_ints)
        self.offsets: list[int] = []
        self.sizes: list[int] = []
        self.fields: list[tuple[str, str, int, int]] = []  # (key, dtype, offset, size)
        off = 0
        for pname, ctype in self.params:
            base = ctype.replace("const ", "").strip()
            if base in STRUCTS:
                flds, size, align = STRUCTS[base].layout()
                off = (off + align - 1) // align * align
                for fname, dt, foff, fsz in flds:
                    self.fields.append((f"{pname}.{fname}", dt, off + foff, fsz))
            else:
                dt, size = _scalar(ctype)
                off = (off + size - 1) // size * size
                self.fields.append((pname, dt, off, size))
            self.offsets.append(off)
            self.sizes.append(size)
            off += size
        self.param_bytes = off

    @property
    def tclass(self) -> str:
        """The kernel's class: the hardest of its parameters' classes."""
        if not self.classes:
            return "fixed"
        return max(self.classes.values(), key=_CLASS_RANK.__getitem__)

    def pack(self, n: int, args: dict[str, Any]) -> np.ndarray:
        """Parameter buffers of n launches as an (n, param_bytes) uint8 matrix."""
        mat = np.zeros((n, self.param_bytes), np.uint8)
        missing = [k for k, _, _, _ in self.fields if k not in args]
        if missing:
            raise ValueError(f"{self.name}: missing arguments {missing}")
        for key, dt, off, size in self.fields:
            v = np.broadcast_to(np.asarray(args[key]), (n,))
            if dt == "<u8" and v.dtype.kind == "i" and (v < 0).any():
                raise ValueError(f"{self.name}: negative pointer for {key}")
            col = np.ascontiguousarray(v.astype(dt))
            mat[:, off:off + size] = col.view(np.uint8).reshape(n, size)
        return mat


# ---- allocations ---------------------------------------------------------------

@dataclass
class Buffer:
    alloc_id: int
    address: int
    bytes: int
    label: str
    kind: str = "managed"

    def ptr(self, offset: Any = 0) -> Any:
        """Address of byte `offset` inside the buffer (arrays welcome)."""
        return np.uint64(self.address) + np.asarray(offset).astype(np.uint64)


# ---- the builder ---------------------------------------------------------------

@dataclass
class _Block:
    kernel: Kernel
    ids: np.ndarray
    grid: np.ndarray     # (n, 6) grid_x, grid_y, grid_z, block_x, block_y, block_z
    shared: np.ndarray
    params: np.ndarray   # (n, param_bytes) uint8
    flops: np.ndarray


def _arr(v: Any, n: int, dtype=np.int64) -> np.ndarray:
    return np.broadcast_to(np.asarray(v, dtype=dtype), (n,)).copy()


class Builder:
    """Collects a workload's allocations, launches and truth, then writes the trace."""

    def __init__(self, name: str, *, seed: int = 0, scale: float = 1.0) -> None:
        self.name = name
        self.seed = seed
        self.scale = scale
        self.rng = np.random.default_rng([seed, _stable_hash(name)])
        self.cursor = 0                          # next launch id
        self.blocks: list[_Block] = []
        self.buffers: list[Buffer] = []
        self._first: list[int] = []
        self._last: list[int | None] = []
        self._free: list[tuple[int, int]] = []   # (address, bytes) free ranges, sorted
        self._top = HEAP_BASE
        # truth pieces: (launch id, alloc id, address, bytes, access)
        self._truth: list[tuple[np.ndarray, ...]] = []
        self.kernels: dict[str, Kernel] = {}
        # index values read through pointer parameters: (launch ids, param offset, addresses, data per launch)
        self._values: list[tuple[np.ndarray, int, np.ndarray, list]] = []

    # -- launch ids
    def reserve(self, n: int) -> int:
        """Take the next n launch ids (host issue order); returns the first."""
        base = self.cursor
        self.cursor += int(n)
        return base

    # -- memory
    def malloc(self, nbytes: int, label: str, kind: str = "managed") -> Buffer:
        """cudaMallocManaged: a 2 MiB-aligned range, first fit among freed ranges (reuse)."""
        nbytes = int(nbytes)
        if nbytes <= 0:
            raise ValueError(f"{label}: allocation of {nbytes} bytes")
        span = -(-nbytes // VA_BLOCK) * VA_BLOCK
        addr = None
        for i, (a, sz) in enumerate(self._free):
            if sz >= span:
                addr = a
                if sz == span:
                    self._free.pop(i)
                else:
                    self._free[i] = (a + span, sz - span)
                break
        if addr is None:
            addr = self._top
            self._top += span
        buf = Buffer(len(self.buffers), addr, nbytes, label, kind)
        self.buffers.append(buf)
        self._first.append(self.cursor)
        self._last.append(None)
        return buf

    def free(self, buf: Buffer) -> None:
        """cudaFree: the range may be handed out again to a later malloc."""
        if self._last[buf.alloc_id] is not None:
            raise ValueError(f"{buf.label} freed twice")
        self._last[buf.alloc_id] = self.cursor - 1
        span = -(-buf.bytes // VA_BLOCK) * VA_BLOCK
        self._free.append((buf.address, span))
        self._free.sort()
        merged: list[tuple[int, int]] = []
        for a, sz in self._free:
            if merged and merged[-1][0] + merged[-1][1] == a:
                merged[-1] = (merged[-1][0], merged[-1][1] + sz)
            else:
                merged.append((a, sz))
        if merged and merged[-1][0] + merged[-1][1] == self._top:  # give the tail back
            self._top = merged.pop()[0]
        self._free = merged

    # -- launches
    def launch(self, kernel: Kernel, ids: Any, args: dict[str, Any], *,
               grid: Sequence[Any], block: Sequence[Any] = (256, 1, 1), shared: Any = 0,
               flops: Any = 0, touches: Sequence["Touch"] = ()) -> None:
        """Record len(ids) launches of one kernel, with per-launch arrays (or scalars)."""
        ids = np.atleast_1d(np.asarray(ids, dtype=np.int64))
        n = len(ids)
        if n == 0:
            return
        if not isinstance(grid, (tuple, list)):
            grid = (grid,)
        if not isinstance(block, (tuple, list)):
            block = (block,)
        if len(grid) > 3 or len(block) > 3:
            raise ValueError(f"{kernel.name}: grid and block have at most 3 dimensions")
        prev = self.kernels.setdefault(kernel.mangled, kernel)
        if prev is not kernel and prev.params != kernel.params:
            raise ValueError(f"two kernels mangle to {kernel.mangled}")
        g = np.stack([_arr(v, n) for v in (*grid, *(1,) * (3 - len(grid)))]
                     + [_arr(v, n) for v in (*block, *(1,) * (3 - len(block)))], axis=1)
        if (g < 1).any():
            raise ValueError(f"{kernel.name}: grid and block dimensions must be >= 1")
        self.blocks.append(_Block(kernel, ids, g.astype(np.int32), _arr(shared, n, np.int32),
                                  kernel.pack(n, args), _arr(flops, n, np.float64)))
        for t in touches:
            lid, aid, addr, nb, acc = t.expand(ids)
            keep = nb > 0
            self._truth.append((lid[keep], aid[keep], addr[keep], nb[keep], acc[keep]))

    def values(self, kernel: Kernel, param: str, ids: Any, address: Any, data: Any) -> None:
        """Record what launches `ids` of `kernel` read through pointer parameter `param` from
        `address` (per launch, or one for all): the index values that choose their pages (the
        trace's `values` table). `data`: per launch a bytes object or an integer array (its bytes
        as stored), or one of them for every launch (a buffer no launch changes)."""
        ids = np.atleast_1d(np.asarray(ids, dtype=np.int64))
        n = len(ids)
        if n == 0:
            return
        names = [p for p, _ in kernel.params]
        if param not in names:
            raise ValueError(f"{kernel.name} has no parameter {param!r}")
        off = kernel.offsets[names.index(param)]
        addr = np.broadcast_to(np.asarray(address).astype(np.uint64), (n,)).copy()
        if isinstance(data, (bytes, bytearray, memoryview)):
            rows = [bytes(data)] * n
        elif isinstance(data, np.ndarray) and data.ndim == 2:
            a = np.ascontiguousarray(data)
            rows = [r.tobytes() for r in a]
        elif isinstance(data, np.ndarray) and data.ndim == 1 and n > 1 and data.dtype != object:
            rows = [np.ascontiguousarray(data).tobytes()] * n
        else:
            rows = [x if isinstance(x, bytes) else np.ascontiguousarray(x).tobytes() for x in data]
        if len(rows) != n:
            raise ValueError(f"{kernel.name}.{param}: {len(rows)} value rows for {n} launches")
        self._values.append((ids, off, addr, rows))

    # -- output
    def write(self, out: Path, *, mode: str = "full", driver_prefetch: bool = True,
              force: bool = False, workload: dict | None = None,
              chunk_bigpages: int = 1 << 23, progress=None, drop: float = 0.0,
              values_limit: int = T.VALUES_LIMIT) -> Path:
        return _write(self, Path(out), mode=mode, driver_prefetch=driver_prefetch, force=force,
                      workload=workload, chunk_bigpages=chunk_bigpages, progress=progress, drop=drop,
                      values_limit=values_limit)


def _stable_hash(s: str) -> int:
    h = 2166136261
    for ch in s.encode():
        h = ((h ^ ch) * 16777619) & 0xFFFFFFFF
    return h


# ---- what a launch touches ---------------------------------------------------

class Touch:
    def expand(self, ids: np.ndarray) -> tuple[np.ndarray, ...]:  # pragma: no cover
        raise NotImplementedError


def _check_inside(buf: Buffer, lo: np.ndarray, hi: np.ndarray) -> None:
    if len(lo) and (lo.min() < 0 or hi.max() > buf.bytes):
        raise ValueError(f"touch outside {buf.label}: [{lo.min()}, {hi.max()}) of {buf.bytes} bytes")


@dataclass
class Range(Touch):
    """Each launch touches bytes [offset, offset + nbytes) of buf."""

    buf: Buffer
    offset: Any
    nbytes: Any
    access: int = READ

    def expand(self, ids):
        n = len(ids)
        off, nb = _arr(self.offset, n), _arr(self.nbytes, n)
        _check_inside(self.buf, off, off + nb)
        return (ids, np.full(n, self.buf.alloc_id, np.int64), off + self.buf.address, nb,
                np.full(n, self.access, np.int8))


@dataclass
class Strided(Touch):
    """Each launch touches `count` chunks of `chunk` bytes, `stride` bytes apart, from `offset`."""

    buf: Buffer
    offset: Any
    chunk: Any
    stride: Any
    count: Any
    access: int = READ

    def expand(self, ids):
        n = len(ids)
        off, ch, st, cnt = (_arr(v, n) for v in (self.offset, self.chunk, self.stride, self.count))
        total = int(cnt.sum())
        rep = np.repeat(np.arange(n), cnt)
        k = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(cnt) - cnt, cnt)
        start = off[rep] + k * st[rep]
        nb = ch[rep]
        _check_inside(self.buf, start, start + nb)
        return (ids[rep], np.full(total, self.buf.alloc_id, np.int64), start + self.buf.address, nb,
                np.full(total, self.access, np.int8))


@dataclass
class Ranges(Touch):
    """Arbitrary ranges: `which[i]` is the index (within the block) of the launch touching
    bytes [offset[i], offset[i] + nbytes[i]) of buf. For data-dependent (irregular) accesses."""

    buf: Buffer
    which: Any
    offset: Any
    nbytes: Any
    access: int = READ

    def expand(self, ids):
        which = np.asarray(self.which, np.int64)
        m = len(which)
        off, nb = _arr(self.offset, m), _arr(self.nbytes, m)
        _check_inside(self.buf, off, off + nb)
        return (ids[which], np.full(m, self.buf.alloc_id, np.int64), off + self.buf.address, nb,
                np.full(m, self.access, np.int8))


# ---- writing: launches, clock, truth, driver emulation ------------------------

def _values_rows(b: Builder, limit: int) -> tuple[dict | None, dict | None]:
    """The builder's value reads as values-table columns (launch order, the limit applied, repeats
    left out) and the manifest's `values` object; (None, None) when the model recorded none."""
    if not b._values:
        return None, None
    lid = np.concatenate([v[0] for v in b._values])
    src = np.concatenate([np.full(len(v[0]), k, np.int64) for k, v in enumerate(b._values)])
    pos = np.concatenate([np.arange(len(v[0]), dtype=np.int64) for v in b._values])
    order = np.lexsort((pos, src, lid))   # by launch, then in the order the model recorded them
    rec = ValuesRecorder(limit=limit, omit_repeats=True)
    k = 0
    m = len(order)
    while k < m:
        j = k
        launch = lid[order[k]]
        reads = []
        while j < m and lid[order[j]] == launch:
            i = order[j]
            ids, off, addr, rows = b._values[src[i]]
            reads.append((off, addr[pos[i]], rows[pos[i]]))
            j += 1
        rec.launch(int(launch), reads)
        k = j
    return rec.take(), rec.manifest()


def _write(b: Builder, out: Path, *, mode: str, driver_prefetch: bool, force: bool,
           workload: dict | None, chunk_bigpages: int, progress, drop: float = 0.0,
           values_limit: int = T.VALUES_LIMIT) -> Path:
    if mode not in T.MODES:
        raise ValueError(f"mode must be one of {T.MODES}")
    if not 0.0 <= drop < 1.0:
        raise ValueError(f"drop must be in [0, 1), not {drop!r}")
    n = b.cursor
    if not b.blocks:
        raise ValueError("no launches")
    ids = np.concatenate([bl.ids for bl in b.blocks])
    if len(ids) != n or not np.array_equal(np.sort(ids), np.arange(n)):
        raise ValueError(f"{b.name}: launch ids are not dense 0..{n - 1} (got {len(ids)} launches)")
    rng = np.random.default_rng([b.seed, _stable_hash(b.name), 7])

    # truth, sorted by launch
    tl = np.concatenate([t[0] for t in b._truth])
    order = np.argsort(tl, kind="stable")
    tl = tl[order]
    ta = np.concatenate([t[1] for t in b._truth])[order]
    taddr = np.concatenate([t[2] for t in b._truth]).astype(np.int64)[order]
    tb = np.concatenate([t[3] for t in b._truth]).astype(np.int64)[order]
    tacc = np.concatenate([t[4] for t in b._truth])[order]
    del order
    b._truth = [(tl, ta, taddr, tb, tacc)]

    # roofline clock
    flops = np.zeros(n)
    peak = np.zeros(n)
    for bl in b.blocks:
        flops[bl.ids] = bl.flops
        peak[bl.ids] = PEAK_FLOPS[bl.kernel.flops_kind]
    moved = np.bincount(tl, weights=tb, minlength=n)
    dur = np.ceil(np.maximum(moved / HBM_BYTES_PER_S, flops / peak) * 1e9).astype(np.int64) + LAUNCH_OVERHEAD_NS
    gap = rng.integers(GAP_NS[0], GAP_NS[1], n)
    start = np.cumsum(gap + dur) - dur + 1_000_000  # the process starts 1 ms before the first kernel
    end = start + dur

    launches = _launch_table(b, n, start, end)
    allocs = _alloc_table(b, n, start, end)

    manifest = T.new_manifest(page_size=PAGE, mode=mode, source="synthetic",
                              workload=workload or {"name": b.name, "argv": None},
                              device={"name": "NVIDIA H200 (emulated)", "index": 0,
                                      "memory_bytes": 150754820096},
                              driver_prefetch=bool(driver_prefetch))
    alloc_addr = np.array([x.address for x in b.buffers], np.int64)
    alloc_end = np.array([x.address + -(-x.bytes // PAGE) * PAGE for x in b.buffers], np.int64)
    emu = _Driver(mode, driver_prefetch, alloc_addr, alloc_end, rng)
    # record loss from its own stream: the rest of the trace is the clean one of this seed
    lost = _RecordLoss(drop, np.random.default_rng([b.seed, _stable_hash(b.name), 8]))

    values, values_manifest = _values_rows(b, values_limit)
    if values_manifest is not None:
        manifest[T.VALUES_KEY] = values_manifest
    with T.TraceWriter(out, manifest, force=force,
                       tables=(*T.REQUIRED_TABLES, T.TRUTH) + ((T.VALUES,) if values is not None else ()),
                       part_rows=4_000_000, part_seconds=1e9) as w:
        w.append(T.LAUNCHES, launches)
        w.append(T.ALLOCATIONS, allocs)
        if values is not None:
            w.append(T.VALUES, values)
        nbig = ((taddr + tb - 1) >> BIG_SHIFT) - (taddr >> BIG_SHIFT) + 1
        cum = np.cumsum(nbig)
        lo = 0
        total = len(tl)
        while lo < total:
            base = cum[lo - 1] if lo else 0
            hi = int(np.searchsorted(cum, base + chunk_bigpages, side="right"))
            hi = max(hi, lo + 1)
            if hi < total:  # end the chunk on a launch boundary
                hi = int(np.searchsorted(tl, tl[hi - 1], side="right"))
            sl = slice(lo, hi)
            w.append(T.TRUTH, {T.LAUNCH_ID: tl[sl], T.ADDRESS: taddr[sl].astype(np.uint64),
                               T.BYTES: tb[sl],
                               T.ACCESS: _strings(tacc[sl].astype(np.int32), ACCESS_NAMES)})
            faults, migs = emu.chunk(tl[sl], ta[sl], taddr[sl], tb[sl], tacc[sl], start, end)
            w.append(T.FAULTS, lost(faults, T.TIME_NS))
            w.append(T.MIGRATIONS, lost(migs, T.START_NS))
            if progress is not None:
                progress(hi - lo)
            lo = hi
        w.update_manifest(dropped_records=lost.dropped)
    return out


class _RecordLoss:
    """Fault and migration records lost independently at rate `rate` (CUPTI's buffer overflows),
    counted as CUPTI counts them (the manifest's dropped_records)."""

    def __init__(self, rate: float, rng: np.random.Generator) -> None:
        self.rate, self.rng, self.dropped = float(rate), rng, 0

    def __call__(self, cols: dict, key: str) -> dict:
        if self.rate <= 0:
            return cols
        cols, lost = lose_records(cols, key, self.rate, self.rng)
        self.dropped += lost
        return cols


def lose_records(cols: dict, key: str, rate: float, rng: np.random.Generator) -> tuple[dict, int]:
    """Each row of the column dict `cols` (as many as `cols[key]`) lost independently at `rate`:
    (the rows kept, how many were lost). The one record-loss rule of the models and of
    `collect --interpret`'s emulation."""
    n = len(cols[key])
    keep = rng.random(n) >= rate
    idx = np.flatnonzero(keep)
    return ({k: (v.take(pa.array(idx)) if isinstance(v, pa.Array) else np.asarray(v)[idx]) for k, v in cols.items()},
            int(n - len(idx)))


def _launch_table(b: Builder, n: int, start: np.ndarray, end: np.ndarray) -> pa.Table:
    parts = []
    for bl in b.blocks:
        k = bl.kernel
        m = len(bl.ids)
        pb = k.param_bytes
        data = pa.FixedSizeBinaryArray.from_buffers(pa.binary(pb), m, [None, pa.py_buffer(bl.params.tobytes())]) \
            if pb else pa.array([b""] * m, pa.binary())
        offs = pa.ListArray.from_arrays(pa.array(np.arange(m + 1, dtype=np.int32) * len(k.offsets)),
                                        pa.array(np.tile(np.array(k.offsets, np.int32), m)))
        sizes = pa.ListArray.from_arrays(pa.array(np.arange(m + 1, dtype=np.int32) * len(k.sizes)),
                                         pa.array(np.tile(np.array(k.sizes, np.int32), m)))
        cols = {T.LAUNCH_ID: bl.ids, T.KERNEL: pa.array(np.full(m, k.mangled, dtype=object), pa.string()),
                T.DEVICE: np.zeros(m, np.int32), T.STREAM: np.full(m, 7, np.int64),
                T.SHARED_MEM_BYTES: bl.shared, T.START_NS: start[bl.ids], T.END_NS: end[bl.ids],
                T.PARAM_OFFSETS: offs, T.PARAM_SIZES: sizes, T.PARAM_DATA: data.cast(pa.binary())}
        for i, c in enumerate(T.GRID_COLUMNS):
            cols[c] = bl.grid[:, i]
        parts.append(T.to_table(T.LAUNCHES, cols))
    t = pa.concat_tables(parts)
    order = np.argsort(t.column(T.LAUNCH_ID).to_numpy(), kind="stable")
    return t.take(pa.array(order))


def _alloc_table(b: Builder, n: int, start: np.ndarray, end: np.ndarray) -> pa.Table:
    first = np.array(b._first, np.int64)
    last = np.array([-1 if x is None else x for x in b._last], np.int64)
    freed = last >= 0
    # host timestamps: just before the first launch issued after the malloc / after the last before the free
    alloc_ns = np.where(first < n, start[np.minimum(first, n - 1)] - 700, end[-1] + 700)
    free_ns = np.where(freed, end[np.clip(last, 0, n - 1)] + 300, 0)
    return T.to_table(T.ALLOCATIONS, {
        T.ALLOC_ID: np.arange(len(b.buffers), dtype=np.int64),
        T.ADDRESS: np.array([x.address for x in b.buffers], np.uint64),
        T.BYTES: np.array([x.bytes for x in b.buffers], np.int64),
        T.KIND: pa.array([x.kind for x in b.buffers], pa.string()),
        T.DEVICE: np.zeros(len(b.buffers), np.int32),
        T.FIRST_LAUNCH: first,
        T.LAST_LAUNCH: pa.array(last, pa.int64(), mask=~freed),
        T.ALLOC_NS: alloc_ns,
        T.FREE_NS: pa.array(free_ns, pa.int64(), mask=~freed),
    })


def _sorted(cols: dict, by: str) -> dict:
    order = np.argsort(cols[by], kind="stable")
    return {k: (v.take(pa.array(order)) if isinstance(v, pa.Array) else np.asarray(v)[order]) for k, v in cols.items()}


def _strings(codes: np.ndarray, names: Sequence[str]) -> pa.Array:
    """A string column from small integer codes, without building Python strings."""
    return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), pa.array(list(names))).cast(pa.string())


def _runs(key: np.ndarray, bp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Runs of consecutive big pages with the same key and inside one 2 MiB block.
    Input sorted by (key, bp), unique. Returns (first index of each run, run length)."""
    m = len(bp)
    if m == 0:
        z = np.zeros(0, np.int64)
        return z, z
    new = np.ones(m, bool)
    new[1:] = (key[1:] != key[:-1]) | (bp[1:] != bp[:-1] + 1) | ((bp[1:] >> 5) != (bp[:-1] >> 5))
    idx = np.flatnonzero(new)
    return idx, np.diff(np.append(idx, m))


class _Driver:
    """UVM driver emulation over chunks of launches (see the module docstring)."""

    def __init__(self, mode: str, prefetch: bool, alloc_addr: np.ndarray, alloc_end: np.ndarray,
                 rng: np.random.Generator) -> None:
        self.mode, self.prefetch, self.rng = mode, prefetch, rng
        self.alloc_addr, self.alloc_end = alloc_addr, alloc_end
        bp0 = alloc_addr >> BIG_SHIFT
        nbp = ((alloc_end - 1) >> BIG_SHIFT) - bp0 + 1
        self.alloc_bp0, self.alloc_nbp = bp0, nbp
        nblk = -(-nbp // BIGS_PER_BLOCK)
        self.bp_base = np.concatenate([[0], np.cumsum(nbp)])[:-1]
        self.blk_base = np.concatenate([[0], np.cumsum(nblk)])[:-1]
        if mode == "natural":
            self.resident = np.zeros(int(nbp.sum()), bool)
            self.blk_count = np.zeros(int(nblk.sum()), np.int64)

    def _blk_bigpages(self, aid: np.ndarray, bp: np.ndarray) -> np.ndarray:
        """Big pages of the (allocation-clipped) 2 MiB block that big page bp lies in."""
        blk_start = (bp >> 5) << 5
        return np.minimum(BIGS_PER_BLOCK, self.alloc_bp0[aid] + self.alloc_nbp[aid] - blk_start)

    def chunk(self, lid, aid, addr, nbytes, acc, start, end):
        rng = self.rng
        a1 = addr + nbytes
        bp0 = addr >> BIG_SHIFT
        nbp = ((a1 - 1) >> BIG_SHIFT) - bp0 + 1
        row = np.repeat(np.arange(len(lid)), nbp)
        bp = bp0[row] + (np.arange(len(row), dtype=np.int64) - np.repeat(np.cumsum(nbp) - nbp, nbp))
        plo = np.maximum(addr[row] >> 12, bp * PAGES_PER_BIG)
        phi = np.minimum(((a1[row] - 1) >> 12) + 1, bp * PAGES_PER_BIG + PAGES_PER_BIG)
        l = lid[row]
        # one entry per (launch, big page); a random touching range is the one that faults
        l0, b0 = int(l[0]), int(bp.min())
        order = np.argsort(((l - l0) << 36) | (bp - b0), kind="stable")
        l, bp = l[order], bp[order]
        new = np.ones(len(l), bool)
        new[1:] = (l[1:] != l[:-1]) | (bp[1:] != bp[:-1])
        g = np.flatnonzero(new)
        size = np.diff(np.append(g, len(l)))
        span = phi - plo
        pages = np.minimum(np.add.reduceat(span[order], g), PAGES_PER_BIG) if len(g) else np.zeros(0, np.int64)
        pick = order[g + (rng.random(len(g)) * size).astype(np.int64)]
        l, bp, row, plo, phi = l[g], bp[g], row[pick], plo[pick], phi[pick]
        del order, span, pick
        a = aid[row]
        fpage = plo + (rng.random(len(g)) * (phi - plo)).astype(np.int64)
        faccess = (acc[row] != READ).astype(np.int32)
        cnt = 1 + rng.binomial(np.maximum(pages - 1, 0), 0.25)
        if self.mode == "full":
            fault_sel = np.ones(len(l), bool)
            pf_key, pf_bp = self._prefetch_full(l, a, bp) if self.prefetch else (None, None)
        else:
            _, fault_sel, pf_key, pf_bp = self._natural(l, a, bp)
            l, bp, a = l[fault_sel], bp[fault_sel], a[fault_sel]
            fpage, faccess, cnt, pages = fpage[fault_sel], faccess[fault_sel], cnt[fault_sel], pages[fault_sel]
        # faults (a few lost)
        keep = rng.random(len(l)) >= FAULT_LOSS
        s, e = start[l], end[l]
        ft = s + (rng.random(len(l)) * 0.6 * (e - s)).astype(np.int64)
        lid_col = l if self.mode == "full" else None
        faults = {T.TIME_NS: ft[keep], T.ADDRESS: (fpage[keep] * PAGE).astype(np.uint64),
                  T.COUNT: cnt[keep].astype(np.int32), T.ACCESS: _strings(faccess[keep], ("read", "write")),
                  T.DEVICE: np.zeros(int(keep.sum()), np.int32)}
        if lid_col is not None:
            faults[T.LAUNCH_ID] = lid_col[keep]
        # coherence migrations: runs of touched big pages
        mig = [self._migrations(l, a, bp, "coherence", start, end, 0.15)]
        if pf_key is not None and len(pf_key):
            mig.append(self._migrations(pf_key, pf_bp[1], pf_bp[0], "prefetch", start, end, 0.7))
        migs = {k: (pa.concat_arrays([m[k] for m in mig]) if isinstance(mig[0][k], pa.Array)
                    else np.concatenate([m[k] for m in mig])) for k in mig[0]}
        if self.mode != "full":
            migs.pop(T.LAUNCH_ID)
        # records arrive in time order, as a collector sees them
        return _sorted(faults, T.TIME_NS), _sorted(migs, T.START_NS)

    def _migrations(self, l, a, bp, cause, start, end, at):
        idx, length = _runs(l, bp)
        l, a, b0 = l[idx], a[idx], bp[idx]
        addr = b0 << BIG_SHIFT
        stop = np.minimum((b0 + length) << BIG_SHIFT, self.alloc_end[a])
        nb = stop - addr
        s, e = start[l], end[l]
        ms = s + (at * (e - s)).astype(np.int64) + (self.rng.random(len(l)) * 0.1 * (e - s)).astype(np.int64)
        me = np.minimum(ms + np.ceil(nb / MIGRATE_BYTES_PER_S * 1e9).astype(np.int64), e)
        return {T.START_NS: ms, T.END_NS: np.maximum(me, ms), T.ADDRESS: addr.astype(np.uint64), T.BYTES: nb,
                T.DIRECTION: _strings(np.zeros(len(l), np.int32), ("htod",)),
                T.CAUSE: _strings(np.zeros(len(l), np.int32), (cause,)), T.LAUNCH_ID: l}

    def _expand_blocks(self, a: np.ndarray, blk_bp0: np.ndarray, nb: np.ndarray):
        rep = np.repeat(np.arange(len(a)), nb)
        k = np.arange(len(rep), dtype=np.int64) - np.repeat(np.cumsum(nb) - nb, nb)
        return rep, blk_bp0[rep] + k

    def _prefetch_full(self, l, a, bp):
        """Blocks of which a launch touched > 51% of the big pages: the rest is prefetched."""
        blk = bp >> 5
        new = np.ones(len(l), bool)
        new[1:] = (l[1:] != l[:-1]) | (blk[1:] != blk[:-1])
        g = np.flatnonzero(new)
        touched = np.diff(np.append(g, len(l)))
        nb = self._blk_bigpages(a[g], bp[g])
        trig = g[(touched > PREFETCH_THRESHOLD * nb) & (touched < nb)]
        if len(trig) == 0:
            return np.zeros(0, np.int64), (np.zeros(0, np.int64), np.zeros(0, np.int64))
        tl, ta = l[trig], a[trig]
        rep, cand = self._expand_blocks(ta, (bp[trig] >> 5) << 5, self._blk_bigpages(ta, bp[trig]))
        cl = tl[rep]
        # drop candidates the launch touched: (l, bp) pairs are sorted and unique
        base = bp.min()
        span = int(max(bp.max(), cand.max()) - base + 1)
        k_t = (l - l.min()) * span + (bp - base)
        k_c = (cl - l.min()) * span + (cand - base)
        pos = np.searchsorted(k_t, k_c)
        hit = (pos < len(k_t)) & (k_t[np.minimum(pos, len(k_t) - 1)] == k_c)
        return cl[~hit], (cand[~hit], ta[rep][~hit])

    def _natural(self, l, a, bp):
        """First touch per (allocation, big page) over the run; the prefetcher on cumulative residency."""
        gkey = self.bp_base[a] + (bp - self.alloc_bp0[a])
        idx_f = np.flatnonzero(~self.resident[gkey])
        # entries are sorted by launch, so the first occurrence of a key is its first touch
        _, first = np.unique(gkey[idx_f], return_index=True)
        ci = np.sort(idx_f[first])
        sel = np.zeros(len(l), bool)
        sel[ci] = True
        pf_l = np.zeros(0, np.int64)
        pf = (np.zeros(0, np.int64), np.zeros(0, np.int64))
        if self.prefetch and len(ci):
            cl, ca, cb = l[ci], a[ci], bp[ci]
            gblk = self.blk_base[ca] + ((cb - self.alloc_bp0[ca]) >> 5)
            o = np.lexsort((cl, gblk))
            cl, ca, cb, gblk, ci = cl[o], ca[o], cb[o], gblk[o], ci[o]
            # groups: the first touches one launch makes in one block
            newg = np.ones(len(cl), bool)
            newg[1:] = (gblk[1:] != gblk[:-1]) | (cl[1:] != cl[:-1])
            gi = np.flatnonzero(newg)
            gb = gblk[gi]
            cs = np.cumsum(np.diff(np.append(gi, len(cl))))
            blk_first = np.ones(len(gi), bool)
            blk_first[1:] = gb[1:] != gb[:-1]
            seg_start = np.maximum.accumulate(np.where(blk_first, np.arange(len(gi)), 0))
            before = np.where(seg_start > 0, cs[np.maximum(seg_start - 1, 0)], 0)
            resident_after = self.blk_count[gb] + cs - before
            nb = self._blk_bigpages(ca[gi], cb[gi])
            ov_idx = np.flatnonzero(resident_after > PREFETCH_THRESHOLD * nb)
            _, firsts = np.unique(gb[ov_idx], return_index=True)
            trig = ov_idx[firsts]                       # the launch group that tips each block
            trig_l = np.full(len(self.blk_count), -1, np.int64)
            trig_l[gb[trig]] = cl[gi[trig]]
            tl_e = trig_l[gblk]
            late = (tl_e >= 0) & (cl > tl_e)            # first touched after its block was prefetched
            sel[ci[late]] = False
            if len(trig):
                tg_l, tg_a, tg_b = cl[gi[trig]], ca[gi[trig]], cb[gi[trig]]
                rep, cbp = self._expand_blocks(tg_a, (tg_b >> 5) << 5, self._blk_bigpages(tg_a, tg_b))
                ga = tg_a[rep]
                gk = self.bp_base[ga] + (cbp - self.alloc_bp0[ga])
                on_time = np.sort(self.bp_base[ca[~late]] + (cb[~late] - self.alloc_bp0[ca[~late]]))
                pos = np.minimum(np.searchsorted(on_time, gk), len(on_time) - 1)
                hit = on_time[pos] == gk
                need = ~self.resident[gk] & ~hit
                pl, pb, pa_ = tg_l[rep][need], cbp[need], ga[need]
                o2 = np.lexsort((pb, pl))
                pf_l, pf = pl[o2], (pb[o2], pa_[o2])
                self.resident[gk] = True
            np.add.at(self.blk_count, gblk[~late], 1)
        self.resident[gkey[sel]] = True
        return l, sel, pf_l, pf


# ---- helpers the models share ---------------------------------------------------

def scaled(base: float, scale: float, power: float = 1.0, *, multiple: int = 1, minimum: int = 1) -> int:
    """round(base * scale**power) to a multiple, at least `minimum`."""
    v = base * scale ** power
    return max(minimum, int(round(v / multiple)) * multiple)

