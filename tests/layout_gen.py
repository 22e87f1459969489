"""A generator of data-dependent layouts as serving engines build them, for the fitter's tests
(tests/test_fit_layouts.py): each drawn `Layout` is one kernel whose pages follow index values
another buffer holds, written into a trace at a given size with its truth, the driver's
emulated faults and migrations, lost records and the values table (datasets.engine.Builder).

Classes (`Layout.cls`), each drawn with its widths, strides and paddings at random:

- `gather`: rows of a table chosen by a per-token index (an embedding, a slot-major cache row per
  token); int32 or int64 ids; the ids buffer persistent (allocated at the largest batch, the kernel
  reads a prefix, past it stale ids or -1 padding); the count an argument or the grid;
- `slot_div`: a -1-padded slot mapping into a head-major paged cache: a slot's block is
  slot // block_size, and its bytes lie in every head's part of the block;
- `layers`: the `gather` rows inside one allocation that holds several layers' caches (or K and V
  interleaved), the kernel handed a pointer to its layer's part;
- `block_table`: a persistent block table (a row per request, stale ids past each row's length)
  read up to each request's length over the block size, the lengths in another buffer;
- `indptr`: indptr -> indices -> rows: a batch's indices read up to the indptr's entry at the
  batch size (an argument);
- `addr_table`: a table of 64-bit addresses choosing which allocation each row comes from (no
  pointer argument names the rows' allocations).

`argument` classes (no values): `strided` rows of random strides, `diagonal` wavefronts (the
d-th anti-diagonal's rows of a square or non-square matrix).

Sizes 1 and 2 are the profile, 3 the unseen size: counts grow with the size, allocations are made
once at the largest size (as engines make them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pagecast.datasets.engine import READWRITE, WRITE, Builder, Kernel, Range, Ranges

VALUE_CLASSES = ("gather", "slot_div", "layers", "block_table", "indptr", "addr_table")
ARG_CLASSES = ("strided", "diagonal")
CLASSES = VALUE_CLASSES + ARG_CLASSES
LAUNCHES = 10   # launches per kernel per trace


@dataclass(frozen=True)
class Layout:
    """One drawn kernel: its class and the numbers that shape it (all drawn, none keyed to a
    model of the project)."""

    cls: str
    key: int          # distinguishes kernels of one trace
    elem: int         # index width: 4 or 8 bytes
    row: int          # bytes of a row (a token's K or V, a table row)
    pad: str          # what lies past the prefix a launch reads: "stale", "neg" or "none"
    count: str        # where the count comes from: "arg" or "grid"
    base_n: int       # tokens (or requests) at size 1
    rows: int         # rows of the table (allocation)
    block: int        # slots per block (slot_div, block_table)
    layers: int       # layers (or K/V) in one allocation
    heads: int        # heads of a head-major block (slot_div)
    seed: int

    @property
    def name(self) -> str:
        return f"{self.cls}_{self.key}"

    def n_at(self, size: int, rng) -> int:
        """A launch's count at `size`: grows with the size, drawn around it."""
        lo = self.base_n * size
        return int(rng.integers(max(1, lo // 2), lo + 1))


def draw(rng: np.random.Generator, cls: str, key: int) -> Layout:
    """A layout of class `cls` with every number drawn from `rng`."""
    elem = int(rng.choice([4, 8]))
    row = int(rng.choice([2, 4])) * int(rng.choice([32, 64, 96, 128, 192, 256])) * int(rng.integers(1, 9))
    return Layout(cls=cls, key=key, elem=elem, row=row, pad=str(rng.choice(["stale", "neg", "none"])),
                  count=str(rng.choice(["arg", "grid"])), base_n=int(rng.integers(8, 48)),
                  rows=int(rng.integers(600, 4000)), block=int(rng.choice([8, 16, 32])),
                  layers=int(rng.integers(2, 5)), heads=int(rng.choice([1, 2, 4, 8])),
                  seed=int(rng.integers(0, 1 << 30)))


def _ids(x: np.ndarray, elem: int) -> np.ndarray:
    return x.astype("<i4" if elem == 4 else "<i8")


def _kernel(lay: Layout, params: list, classes: dict) -> Kernel:
    return Kernel(lay.name, params, classes)


def emit(b: Builder, lay: Layout, size: int, max_size: int = 3) -> None:
    """Launch `lay`'s kernel LAUNCHES times at `size` into builder `b` (its buffers made here,
    at the largest size's needs)."""
    rng = np.random.default_rng([lay.seed, size, 7])
    itype = "const int*" if lay.elem == 4 else "const long*"
    top = lay.base_n * max_size
    if lay.cls in ("gather", "layers"):
        k = _kernel(lay, [("out", "float*"), ("table", "const float*"), ("ids", itype), ("n", "int")],
                    {"out": "linear", "table": "indexed", "ids": "linear"})
        layer_bytes = lay.rows * lay.row
        table = b.malloc(layer_bytes * (lay.layers if lay.cls == "layers" else 1), f"{lay.name}.table")
        ids = b.malloc(top * lay.elem, f"{lay.name}.ids")      # persistent: the largest batch
        out = b.malloc(top * lay.row, f"{lay.name}.out")
        for _ in range(LAUNCHES):
            n = lay.n_at(size, rng)
            v = rng.integers(0, lay.rows, size=top)
            v[n:] = -1 if lay.pad == "neg" else v[n:]
            layer = int(rng.integers(0, lay.layers)) if lay.cls == "layers" else 0
            tp = table.ptr(layer * layer_bytes)
            i = b.reserve(1)
            grid = n if lay.count == "grid" else 1
            b.launch(k, [i], {"out": out.ptr(), "table": tp, "ids": ids.ptr(), "n": n}, grid=(grid,),
                     touches=[Range(ids, 0, n * lay.elem), Range(out, 0, n * lay.row, WRITE),
                              Ranges(table, np.zeros(n, np.int64), layer * layer_bytes + v[:n] * lay.row, lay.row)])
            rec = v if lay.pad != "none" else v[:n]
            b.values(k, "ids", [i], ids.ptr(), [_ids(rec, lay.elem).tobytes()])
    elif lay.cls == "slot_div":
        # cache [blocks, heads, block, head_bytes]: slot s writes head_bytes in each head's part of
        # block s // block, at offset (s % block) * head_bytes
        hb = max(lay.row // lay.heads, 16)
        blk = lay.heads * lay.block * hb
        nblocks = max(lay.rows // lay.block, 4)
        k = _kernel(lay, [("key", "const float*"), ("cache", "float*"), ("slots", "const long*"), ("n", "int")],
                    {"key": "linear", "cache": "indexed", "slots": "linear"})
        cache = b.malloc(nblocks * blk, f"{lay.name}.cache")
        slots = b.malloc(top * 8, f"{lay.name}.slots")
        key = b.malloc(top * lay.heads * hb, f"{lay.name}.key")
        for _ in range(LAUNCHES):
            n = lay.n_at(size, rng)
            s = rng.choice(nblocks * lay.block, size=top, replace=False)
            s[n:] = -1                                    # padded to the graph's batch
            i = b.reserve(1)
            bi, off = s[:n] // lay.block, s[:n] % lay.block
            h = np.arange(lay.heads)
            starts = (bi[:, None] * blk + h[None, :] * lay.block * hb + off[:, None] * hb).reshape(-1)
            b.launch(k, [i], {"key": key.ptr(), "cache": cache.ptr(), "slots": slots.ptr(),
                              "n": top if lay.count == "arg" else n}, grid=(top,),
                     touches=[Range(slots, 0, top * 8), Range(key, 0, n * lay.heads * hb),
                              Ranges(cache, np.zeros(len(starts), np.int64), starts, hb, WRITE)])
            b.values(k, "slots", [i], slots.ptr(), [_ids(s, 8).tobytes()])
    elif lay.cls == "block_table":
        # table [max_reqs, width] of block ids, row r read to ceil(len[r] / block); cache rows of
        # `row` bytes a slot, a block of `block` slots
        width = max(4, -(-lay.base_n * max_size * 4 // lay.block))
        max_reqs = 16
        nblocks = max(lay.rows // lay.block, width * 2)
        blk = lay.block * lay.row
        k = _kernel(lay, [("out", "float*"), ("cache", "const float*"), ("table", "const int*"),
                          ("lens", "const int*"), ("width", "int"), ("nreq", "int")],
                    {"out": "linear", "cache": "indexed", "table": "linear", "lens": "linear"})
        cache = b.malloc(nblocks * blk, f"{lay.name}.cache")
        table = b.malloc(max_reqs * width * 4, f"{lay.name}.table")
        lens = b.malloc(max_reqs * 4, f"{lay.name}.lens")
        out = b.malloc(max_reqs * 4096, f"{lay.name}.out")
        for _ in range(LAUNCHES):
            nreq = int(rng.integers(2, 6 + 2 * size))
            ln = rng.integers(1, lay.base_n * size * 4 + 1, size=max_reqs).astype(np.int64)
            tab = rng.integers(0, nblocks, size=(max_reqs, width))   # stale past each row's blocks
            i = b.reserve(1)
            starts, which = [], []
            for r in range(nreq):
                nb = -(-int(ln[r]) // lay.block)
                full = np.minimum(int(ln[r]) - np.arange(nb) * lay.block, lay.block)
                starts.append(tab[r, :nb] * blk), which.append(full * lay.row)
            st_, nb_ = np.concatenate(starts), np.concatenate(which)
            b.launch(k, [i], {"out": out.ptr(), "cache": cache.ptr(), "table": table.ptr(), "lens": lens.ptr(),
                              "width": width, "nreq": nreq}, grid=(nreq,),
                     touches=[Range(table, 0, max_reqs * width * 4), Range(lens, 0, nreq * 4),
                              Range(out, 0, nreq * 4096, WRITE),
                              Ranges(cache, np.zeros(len(st_), np.int64), st_, nb_)])
            b.values(k, "table", [i], table.ptr(), [_ids(tab.reshape(-1), 4).tobytes()])
            b.values(k, "lens", [i], lens.ptr(), [_ids(ln, 4).tobytes()])
    elif lay.cls == "indptr":
        k = _kernel(lay, [("out", "float*"), ("cache", "const float*"), ("indptr", "const int*"),
                          ("indices", itype), ("nreq", "int")],
                    {"out": "linear", "cache": "indexed", "indptr": "linear", "indices": "linear"})
        max_reqs = 16
        cap = max_reqs * lay.base_n * max_size * 2
        cache = b.malloc(lay.rows * lay.row * 4, f"{lay.name}.cache")
        indptr = b.malloc((max_reqs + 1) * 4, f"{lay.name}.indptr")
        indices = b.malloc(cap * lay.elem, f"{lay.name}.indices")
        out = b.malloc(max_reqs * 4096, f"{lay.name}.out")
        for _ in range(LAUNCHES):
            nreq = int(rng.integers(2, 6 + 2 * size))
            per = rng.integers(1, lay.base_n * size * 2 + 1, size=max_reqs)
            ip = np.r_[0, np.cumsum(per)]
            ind = rng.integers(0, lay.rows * 4, size=cap)
            tot = int(ip[nreq])
            i = b.reserve(1)
            b.launch(k, [i], {"out": out.ptr(), "cache": cache.ptr(), "indptr": indptr.ptr(),
                              "indices": indices.ptr(), "nreq": nreq}, grid=(nreq,),
                     touches=[Range(indptr, 0, (nreq + 1) * 4), Range(indices, 0, tot * lay.elem),
                              Range(out, 0, nreq * 4096, WRITE),
                              Ranges(cache, np.zeros(tot, np.int64), ind[:tot] * lay.row, lay.row)])
            b.values(k, "indptr", [i], indptr.ptr(), [_ids(ip, 4).tobytes()])
            b.values(k, "indices", [i], indices.ptr(), [_ids(ind[:int(ip[-1])] if lay.pad == "none" else ind,
                                                             lay.elem).tobytes()])
    elif lay.cls == "addr_table":
        # a buffer of 64-bit row addresses, each in one of several allocations (adapters' weights)
        nalloc = lay.layers
        k = _kernel(lay, [("out", "float*"), ("ptrs", "const long*"), ("slot", "const int*"), ("n", "int")],
                    {"out": "linear", "ptrs": "linear", "slot": "linear"})
        ws = [b.malloc(lay.rows * lay.row // 4 + lay.row, f"{lay.name}.w{j}") for j in range(nalloc)]
        ptrs = b.malloc(nalloc * 8, f"{lay.name}.ptrs")
        slot = b.malloc(top * 4, f"{lay.name}.slot")
        out = b.malloc(top * lay.row, f"{lay.name}.out")
        for _ in range(LAUNCHES):
            n = lay.n_at(size, rng)
            sl = rng.integers(0, nalloc, size=top)
            rowi = rng.integers(0, lay.rows // 4, size=n)
            i = b.reserve(1)
            touches = [Range(ptrs, 0, nalloc * 8), Range(slot, 0, n * 4), Range(out, 0, n * lay.row, WRITE)]
            for j, w in enumerate(ws):
                m = np.flatnonzero(sl[:n] == j)
                if len(m):
                    touches.append(Ranges(w, np.zeros(len(m), np.int64), rowi[m] * lay.row, lay.row))
            b.launch(k, [i], {"out": out.ptr(), "ptrs": ptrs.ptr(), "slot": slot.ptr(), "n": n}, grid=(n,),
                     touches=touches)
            b.values(k, "ptrs", [i], ptrs.ptr(), [np.array([w.address for w in ws], "<u8").tobytes()])
            b.values(k, "slot", [i], slot.ptr(), [_ids(sl, 4).tobytes()])
    elif lay.cls == "strided":
        # a channel slice: `cnt` chunks of `row` bytes, `pitch` bytes apart, from column c
        pitch = lay.row * lay.layers * 2   # a drawn multiple of the chunk
        k = _kernel(lay, [("x", "const float*"), ("c", "int"), ("cnt", "int"), ("pitch", "int")], {"x": "strided"})
        x = b.malloc(pitch * lay.base_n * max_size * 8, f"{lay.name}.x")
        for _ in range(LAUNCHES):
            cnt = lay.n_at(size, rng) * 4
            c = int(rng.integers(0, pitch // lay.row))
            i = b.reserve(1)
            b.launch(k, [i], {"x": x.ptr(), "c": c, "cnt": cnt, "pitch": pitch}, grid=(cnt,),
                     touches=[Ranges(x, np.zeros(cnt, np.int64), c * lay.row + np.arange(cnt) * pitch, lay.row)])
    elif lay.cls == "diagonal":
        # anti-diagonal d of an (R x C) matrix of `row`-byte cells: cells (i, d - i)
        R = lay.base_n * size * 4
        C = R if lay.pad == "none" else R + lay.base_n * size
        k = _kernel(lay, [("m", "float*"), ("d", "int"), ("cols", "int"), ("rows_", "int")], {"m": "strided"})
        m = b.malloc((lay.base_n * max_size * 5) ** 2 * lay.row, f"{lay.name}.m")
        for _ in range(LAUNCHES):
            d = int(rng.integers(1, R + C - 2))
            i0, i1 = max(0, d - C + 1), min(R - 1, d)
            ii = np.arange(i0, i1 + 1)
            i = b.reserve(1)
            b.launch(k, [i], {"m": m.ptr(), "d": d, "cols": C, "rows_": R}, grid=(len(ii),),
                     touches=[Ranges(m, np.zeros(len(ii), np.int64), (ii * C + (d - ii)) * lay.row, lay.row, READWRITE)])
    else:
        raise ValueError(f"unknown layout class {lay.cls!r}")


def write_trace(layouts: list[Layout], size: int, path, drop: float = 0.0, seed: int = 0):
    """One trace of every layout's kernel at `size`, `drop` of its records lost."""
    b = Builder(f"layouts-{size}", seed=seed + size)
    for lay in layouts:
        emit(b, lay, size)
    return b.write(path, drop=drop, force=True)
