"""Evaluating an `indexed` region: chunk i at `base + start + stride * v[i]`, `chunk` bytes long,
for i < count, v the integers in the buffer the region's `index` pointer points to, read from the
trace's `values` table (batch) or handed in by the runtime that read them (online).

The batch path gathers every launch's values at once (numpy, no per-launch loop): the values
rows are found by (launch, pointer value) in the trace's `pagecast.values.ValueImage`, and a
launch whose row holds fewer than `count` values predicts the chunks of those it has (the rest
were clipped at the trace's limit). Chunks are clipped to the base's allocation, as every
region's pages are; values whose chunk lies wholly outside it name nothing and are counted.
Negative values are sentinels: they select nothing (a -1-padded slot mapping, an expert id of a
filtered token, a stale or unused entry) and are counted apart (`sentinel`), as kernels skip them.
"""

from __future__ import annotations

import numpy as np

from pagecast import footprints as FP
from pagecast import values as V

from .model_io import Region

I64 = np.int64
MAX_INDEXED = 1 << 24   # values read per launch at most (a model edited to a huge count costs nothing more)


def chunk_bytes(region: Region, values) -> tuple:
    """(start offset, stride, chunk, count) of an indexed region, evaluated on `values` (arrays or ints)."""
    return (region.start.evaluate(values), region.stride.evaluate(values), region.chunk.evaluate(values),
            region.count.evaluate(values))


CHUNK_VALUES = 1 << 20   # values decoded at once (memory: a few tens of bytes each)


def batch_pieces(region: Region, vals: dict, base: np.ndarray, iptr: np.ndarray, launch: np.ndarray,
                 im: V.ValueImage, ps: int, a_s: np.ndarray, a_e: np.ndarray) -> dict:
    """Pages of an indexed region over many launches at once.

    `vals`: feature name -> int64 array; `base`, `iptr`: the base and index pointer values;
    `a_s`, `a_e`: the base's allocation in pages, per launch. Returns a dict with `have` (per
    launch: its values were recorded), `rows` (the values row found, -1 none) and the merged
    pieces `l` (index into the launches), `s`, `e` (pages), plus `outside` (values whose chunk
    names no page of the allocation), `sentinel` (negative values: nothing), `short` (values the count
    asked for that the row lacks) and `bytes` (per launch, the bytes of values it reads).

    Launches that read the same row with the same formulas' values from the same base (a static
    CSR matrix's column indices, read at every iteration) are evaluated once."""
    n = len(launch)
    one = np.ones(n, I64)
    st, sd, ch, cnt = (np.asarray(x, I64) * one for x in chunk_bytes(region, vals))
    rows = im.find(launch, iptr)
    have = rows >= 0
    cnt = np.clip(cnt, 0, MAX_INDEXED)
    r = np.maximum(rows, 0)
    e = region.elem
    avail = np.where(have, im.nbytes[r] // e, 0) if len(im.nbytes) else np.zeros(n, I64)
    k = np.where(have, np.minimum(cnt, avail), 0)
    short = int(np.where(have, cnt - k, 0).sum())
    z = np.zeros(0, I64)
    out = {"have": have, "rows": rows, "l": z, "s": z, "e": z, "outside": 0, "sentinel": 0, "short": short,
           "bytes": k * e}
    todo = np.flatnonzero(k > 0)
    if len(todo) == 0:
        return out
    keys = np.stack([r[todo], st[todo], sd[todo], ch[todo], k[todo], np.asarray(base, I64)[todo],
                     a_s[todo], a_e[todo]], axis=1)
    uk, inv = np.unique(keys, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    ug, us, ue = [], [], []
    outside = sentinel = 0
    mult = np.bincount(inv, minlength=len(uk))   # launches per unique key
    ku = uk[:, 4]
    cum = np.cumsum(ku)
    lo = 0
    while lo < len(uk):
        hi = max(lo + 1, int(np.searchsorted(cum, (cum[lo - 1] if lo else 0) + CHUNK_VALUES, side="right")))
        g = np.arange(lo, hi)
        kk = ku[g]
        rep = np.repeat(g, kk)
        j = np.arange(len(rep), dtype=I64) - np.repeat(np.cumsum(kk) - kk, kk)
        # the bytes of value j of each row, gathered at once, read as little-endian integers
        pos = (im.start[uk[rep, 0]] + j * e)[:, None] + np.arange(e)
        v = np.ascontiguousarray(im._raw[pos]).view("<i4" if e == 4 else "<i8").reshape(-1).astype(I64)
        b0 = uk[rep, 5] + uk[rep, 1] + uk[rep, 2] * v
        # pages of [b0, b0 + chunk), clipped to the allocation (floor division: b0 may lie below the base)
        sp = np.maximum(np.floor_divide(b0, ps), uk[rep, 6])
        ep = np.minimum(-np.floor_divide(-(b0 + uk[rep, 3]), ps), uk[rep, 7])
        neg = v < 0
        ok = (ep > sp) & ~neg
        sentinel += int(mult[rep[neg]].sum())
        outside += int(mult[rep[~ok & ~neg]].sum())
        gg, s2, e2 = FP.merge_intervals(rep[ok] - lo, sp[ok], ep[ok], hi - lo)
        ug.append(gg + lo), us.append(s2), ue.append(e2)
        lo = hi
    ug, us, ue = np.concatenate(ug), np.concatenate(us), np.concatenate(ue)
    # each launch takes its unique key's merged pieces
    ptr = np.zeros(len(uk) + 1, I64)
    np.cumsum(np.bincount(ug, minlength=len(uk)), out=ptr[1:])
    c = ptr[inv + 1] - ptr[inv]
    idx = FP._ranges(ptr[inv], c)
    out.update(l=np.repeat(todo, c), s=us[idx], e=ue[idx], outside=outside, sentinel=sentinel)
    return out


def reads(region: Region, values: dict, iptr: int) -> tuple[int, int]:
    """(address, bytes) of the values one launch's indexed region reads (online)."""
    cnt = int(region.count.evaluate(values))
    return int(iptr), max(0, min(cnt, MAX_INDEXED)) * region.elem


def one_pieces(region: Region, fns, values: dict, base: int, data: bytes, ps: int, a_s: int, a_e: int,
               out: list) -> None:
    """An indexed region's page intervals for one launch (online), appended to `out`: `fns` the
    region's compiled (start, stride, chunk, count) functions, `data` the values' bytes."""
    st, sd, ch, cnt = (f(values) for f in fns)
    e = region.elem
    k = max(0, min(int(cnt), len(data) // e, MAX_INDEXED))
    if k == 0:
        return
    v = np.frombuffer(data, "<i4" if e == 4 else "<i8", count=k)
    if k <= 64:   # a few values (experts, a token): Python ints beat numpy's overhead
        for x in v.tolist():
            if x < 0:
                continue
            b0 = base + st + sd * x
            sp, ep = max(b0 // ps, a_s), min(-(-(b0 + ch) // ps), a_e)
            if ep > sp:
                out.append((sp, ep))
        return
    b0 = base + st + sd * v.astype(I64)
    sp = np.maximum(b0 // ps, a_s)
    ep = np.minimum(-((-(b0 + ch)) // ps), a_e)
    keep = (ep > sp) & (v >= 0)
    if keep.any():
        _, ms, me = FP.merge_intervals(np.zeros(int(keep.sum()), I64), sp[keep], ep[keep], 1)
        out.extend(zip(ms.tolist(), me.tolist()))
