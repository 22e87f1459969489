"""Evaluating an `indexed` region: chunk i at `base + start + stride * v[i]` (`floor(v[i] /
value_div)` where the region divides its values), `chunk` bytes long, for i < count, v the
integers in the buffer the region's `index` pointer points to, read from the trace's `values`
table (batch) or handed in by the runtime that read them (online).

The batch path gathers every launch's values at once (numpy, no per-launch loop): the values
rows are found by (launch, pointer value) in the trace's `pagecast.values.ValueImage`, and a
launch whose row holds fewer than `count` values predicts the chunks of those it has (the rest
were clipped at the trace's limit). Chunks are clipped to the base's allocation, as every
region's pages are; values whose chunk lies wholly outside it name nothing and are counted.
Negative values are sentinels: they select nothing (a -1-padded slot mapping, an expert id of a
filtered token, a stale or unused entry) and are counted apart (`sentinel`), as kernels skip them.

A two-dimensional table (`region.row_stride` set): the values are rows of `row_stride` entries
(a block table, a row per request), `count` rows are read, and row r is read up to its own count,
ceil(v(count_index)[r] / count_div) entries (a sequence length over the block size); the entries
past it are stale ids that select nothing. A row's count larger than the row is clipped to the
row and counted with the values its row lacks (`short`). A table whose rows' counts are over
a divisor may read a part of each row's last chunk (`region.part_last`): a row of c units
(tokens) in blocks of d reads c - d*(k-1) of its last block's d units, the chunk's bytes in
proportion (a sequence's last KV block, filled up to its length), rounded up. A table's rows may
be read only where another buffer's values allow it (`region.row_filter`, model_io.RowFilter:
row r where v(f)[r], or v(f)[r+1] - v(f)[r], is at most or at least a constant: a decode
kernel's programs that return for a query longer than one token); a row whose filter value was
not recorded is read, and a filtered row reads nothing, as if its count were 0. A row's count
value may be less another buffer's value at the row, taken the same way (`region.count_sub`,
model_io.RowValue: a prefill chunk's context, its sequence's length less its query's, read from
the cache while the chunk's own tokens are not), before the divisor; a row whose value was not
recorded is read to its whole count.

Chunks of their own lengths (`region.lengths`): value i's chunk is `chunk` bytes times
ceil(v(count_index)[i] / count_div), another buffer's value at the same position (a request's
row of a page table, chosen through the request's index and read up to the request's length
over the page size). Values whose length was not recorded are counted with those the row lacks
(`short`) and read nothing. A length may be the difference of the buffer's consecutive values
(`region.length_diff`: an indptr, v[i+1] - v[i], the entries of request i), and less another
buffer's value at the position (`region.count_sub`, as a table row's count: a prefill chunk's
row of the block table read for its context); a length of 0 reads nothing. Rows may be chosen
by their position rather than through an index (`region.index` None: value i is i itself, a
block table's own row i read up to the i-th sequence's length); such a row's read stops at the
row's end, the next row's start (`stride` bytes on), and a length past it is counted as `short`.

Rows by position with a count read from another buffer and no lengths (`region.index` None,
`region.lengths` False, `region.count_index` set): chunk i at `start + stride * i`, `chunk` bytes,
for i < ceil(v(count_index)[count] / count_div): the first rows of a persistent buffer, as many
as another buffer's value says (a query or output buffer's rows up to the batch's token count,
the last entry of its query start offsets, which no argument gives). Nothing is read from an
index; the count is read as every count from another buffer is.

A divided region may place a slot within its block (`region.block_split`, model_io.BlockSplit):
value v's chunks are `parts` pieces at `start + stride*floor(v / value_div) + slot_bytes*(v mod
value_div) + part_stride*h`, h < parts (a head-major paged cache: a slot's row in each head's part
of its block; `split_firsts`). A count read from another buffer may be the number of its values
that are not negative among the first `count` (`region.count_valid`: a -1-padded slot mapping's
live slots, the rows of keys a launch reads).

Long because each form's batch path (numpy over every launch at once) and online path (one
launch, Python ints) sit side by side: they must agree launch for launch (the tests compare them).
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


def ints_at(im: V.ValueImage, at: np.ndarray, e: int) -> np.ndarray:
    """The `e`-byte little-endian integers at byte offsets `at` of the values image, as int64."""
    pos = np.asarray(at, I64)[:, None] + np.arange(e)
    return np.ascontiguousarray(im._raw[pos]).view("<i4" if e == 4 else "<i8").reshape(-1).astype(I64)


def buffer_counts(region: Region, pos: np.ndarray, launch: np.ndarray, cptr: np.ndarray, im: V.ValueImage):
    """A count read from another buffer (`region.count_index`): per launch, the value at position
    `pos` of the row recorded for `cptr` (an indptr's entry at the batch size, a padded token
    count), divided by `region.count_div` and rounded up (blocks of a padded count; negative
    values count as 0). Returns (counts, the values rows, ok: the row holds that position)."""
    n = len(launch)
    rows = im.find(launch, cptr)
    ce = region.count_elem
    r = np.maximum(rows, 0)
    pos = np.asarray(pos, I64) * np.ones(n, I64)
    ok = (rows >= 0) & (pos >= 0)
    if len(im.nbytes):
        ok &= (pos + 1) * ce <= np.where(rows >= 0, im.nbytes[r], 0)
    else:
        ok[:] = False
    cnt = np.zeros(n, I64)
    if region.count_valid:   # the values not negative among the first `pos` (ok: the row holds them all)
        ok = (rows >= 0) & (pos >= 0)
        if len(im.nbytes):
            ok &= pos * ce <= np.where(rows >= 0, im.nbytes[r], 0)
        m = np.flatnonzero(ok & (pos > 0))
        k = np.minimum(pos[m], MAX_INDEXED)
        if len(m):
            at = np.repeat(im.start[r[m]], k) + (np.arange(int(k.sum()), dtype=I64) - np.repeat(np.cumsum(k) - k, k)) * ce
            cnt[m] = np.bincount(np.repeat(np.arange(len(m)), k), weights=ints_at(im, at, ce) >= 0,
                                 minlength=len(m)).astype(I64)
        return divide_count(region, cnt), rows, ok
    if ok.any():
        cnt[ok] = ints_at(im, im.start[r[ok]] + pos[ok] * ce, ce)
    return divide_count(region, np.maximum(cnt, 0)), rows, ok


def divide_count(region: Region, value):
    """The count a value read from another buffer gives: ceil(value / count_div) (value >= 0)."""
    d = int(region.count_div)
    return value if d == 1 else -(-value // d)


def batch_pieces(region: Region, vals: dict, base: np.ndarray, iptr: np.ndarray, launch: np.ndarray,
                 im: V.ValueImage, ps: int, a_s: np.ndarray, a_e: np.ndarray, cptr: np.ndarray | None = None,
                 fptr: np.ndarray | None = None, sptr: np.ndarray | None = None) -> dict:
    """Pages of an indexed region over many launches at once (`cptr`, `fptr`, `sptr`: the count's,
    the row filter's and the count_sub's buffer pointers per launch, where the region has them).

    `vals`: feature name -> int64 array; `base`, `iptr`: the base and index pointer values;
    `a_s`, `a_e`: the base's allocation in pages, per launch. Returns a dict with `have` (per
    launch: its values were recorded), `rows` (the values row found, -1 none) and the merged
    pieces `l` (index into the launches), `s`, `e` (pages), plus `outside` (values whose chunk
    names no page of the allocation), `sentinel` (negative values: nothing), `short` (values the count
    asked for that the row lacks) and `bytes` (per launch, the bytes of values it reads).

    Launches that read the same row with the same formulas' values from the same base (a static
    CSR matrix's column indices, read at every iteration) are evaluated once."""
    n = len(launch)
    if region.position_range:
        return _position_pieces(region, vals, base, launch, im, ps, a_s, a_e, cptr)
    if region.row_stride is not None:
        return _table_pieces(region, vals, base, iptr, launch, im, ps, a_s, a_e, cptr, fptr, sptr)
    if region.lengths and region.count_index is not None:
        return _length_pieces(region, vals, base, iptr, launch, im, ps, a_s, a_e, cptr, fptr, sptr)
    one = np.ones(n, I64)
    st, sd, ch, cnt = (np.asarray(x, I64) * one for x in chunk_bytes(region, vals))
    rows = im.find(launch, iptr)
    have = rows >= 0
    crows = None
    if region.count_index is not None:
        cnt, crows, okc = buffer_counts(region, cnt, launch, np.asarray(cptr, I64), im)
        have &= okc
    cnt = np.clip(cnt, 0, MAX_INDEXED)
    r = np.maximum(rows, 0)
    e = region.elem
    avail = np.where(have, im.nbytes[r] // e, 0) if len(im.nbytes) else np.zeros(n, I64)
    k = np.where(have, np.minimum(cnt, avail), 0)
    short = int(np.where(have, cnt - k, 0).sum())
    z = np.zeros(0, I64)
    out = {"have": have, "rows": rows, "crows": crows, "l": z, "s": z, "e": z, "outside": 0, "sentinel": 0, "short": short,
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
        v = ints_at(im, im.start[uk[rep, 0]] + j * e, e)
        first = uk[rep, 5] + uk[rep, 1]
        lead = None
        if region.block_split is not None:   # each value's bytes in every part of its block
            idx, first, lead = split_firsts(region, v, first)
            rep, v = rep[idx], v[idx]
        sp, ep, ok, neg = _value_pages(v, first, uk[rep, 2], uk[rep, 3], ps, uk[rep, 6], uk[rep, 7],
                                       region.value_div)
        once = neg if lead is None else neg & lead   # counted once a value
        sentinel += int(mult[rep[once]].sum())
        out_ = _outside(ok, neg, uk[rep, 3])
        outside += int(mult[rep[out_ if lead is None else out_ & lead]].sum())
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


def _position_chunks(k, first, stride, chunk):
    """(owner, byte start, byte end) of chunks [first + stride*i, +chunk) for i < k, per owner:
    one span where the chunks touch (chunk >= stride: rows read whole, a range), else each chunk
    (k at most MAX_INDEXED each)."""
    k = np.clip(np.asarray(k, I64), 0, MAX_INDEXED)
    first, stride, chunk = (np.asarray(x, I64) * np.ones(len(k), I64) for x in (first, stride, chunk))
    span = (chunk >= stride) & (stride > 0)
    own = np.flatnonzero(span & (k > 0))
    o, b0, b1 = [own], [first[own]], [first[own] + stride[own] * (k[own] - 1) + chunk[own]]
    rest = np.flatnonzero(~span & (k > 0))
    if len(rest):
        rep = np.repeat(rest, k[rest])
        i = np.arange(len(rep), dtype=I64) - np.repeat(np.cumsum(k[rest]) - k[rest], k[rest])
        o.append(rep), b0.append(first[rep] + stride[rep] * i), b1.append(first[rep] + stride[rep] * i + chunk[rep])
    return np.concatenate(o), np.concatenate(b0), np.concatenate(b1)


def _position_pieces(region: Region, vals: dict, base, launch, im: V.ValueImage, ps: int, a_s, a_e, cptr) -> dict:
    """batch_pieces for rows by position up to a count read from another buffer (position_range)."""
    n = len(launch)
    one = np.ones(n, I64)
    st, sd, ch, pos = (np.asarray(x, I64) * one for x in chunk_bytes(region, vals))
    cnt, crows, have = buffer_counts(region, pos, launch, np.asarray(cptr, I64) * one, im)
    k = np.where(have, cnt, 0)
    own, b0, b1 = _position_chunks(k, np.asarray(base, I64) * one + st, sd, ch)
    sp = np.maximum(np.floor_divide(b0, ps), a_s[own])
    ep = np.minimum(-np.floor_divide(-b1, ps), a_e[own])
    ok = (ep > sp) & (b1 > b0)
    gg, s2, e2 = FP.merge_intervals(own[ok], sp[ok], ep[ok], n)
    return {"have": have, "rows": crows, "crows": crows, "l": gg, "s": s2, "e": e2, "outside": int((~ok).sum()),
            "sentinel": 0, "short": 0, "bytes": np.zeros(n, I64)}


def split_firsts(region: Region, v: np.ndarray, first: np.ndarray):
    """A divided region's values with their block split (`region.block_split`): each value's
    pieces, one per part of its block: (which value each piece is, the piece's first byte before
    the block's stride: `first + slot_bytes*(v mod value_div) + part_stride*h`, is it the value's
    first piece)."""
    bs = region.block_split
    n, P = len(v), int(bs.parts)
    idx = np.repeat(np.arange(n), P)
    h = np.tile(np.arange(P, dtype=I64), n)
    f = np.asarray(first, I64)[idx] if np.ndim(first) else np.full(n * P, int(first), I64)
    f = f + bs.slot_bytes * np.mod(v[idx], region.value_div) + bs.part_stride * h
    return idx, f, h == 0


def _value_pages(v, first, stride, chunk, ps: int, a_s, a_e, vdiv: int = 1):
    """Pages [sp, ep) of the chunks [first + stride*floor(v / vdiv), +chunk), clipped to the
    allocation's pages [a_s, a_e) (floor division: a chunk may start below the base); `ok`: the
    chunk names a page and its value is not a sentinel; `neg`: the value is a sentinel. A chunk
    of no bytes (a length of 0, a row its filter leaves out) names no page, wherever it starts."""
    b0 = first + stride * (v if vdiv == 1 else np.floor_divide(v, vdiv))
    sp = np.maximum(np.floor_divide(b0, ps), a_s)
    ep = np.minimum(-np.floor_divide(-(b0 + chunk), ps), a_e)
    neg = v < 0
    return sp, ep, (ep > sp) & ~neg & (np.asarray(chunk) > 0), neg


def _outside(ok: np.ndarray, neg: np.ndarray, chunk) -> np.ndarray:
    """Of `_value_pages`' chunks, those that name bytes but no page of the allocation (a value out
    of range): neither kept, nor a sentinel, nor of no bytes."""
    return ~ok & ~neg & (np.asarray(chunk) > 0)


MAX_ROWS = 1 << 20   # rows of a table read per launch at most


def count_values(region: Region, want, launch: np.ndarray, cptr: np.ndarray, im: V.ValueImage):
    """The first `want` values (per launch, at most MAX_ROWS) of the count buffer
    (`region.count_index`) each launch reads: (the launch of each value, its position, the value,
    the count buffer's values rows, ok per launch: its values were recorded, values asked for
    that the row lacks)."""
    n = len(launch)
    ce = region.count_elem
    crows = im.find(launch, cptr)
    ok = crows >= 0
    cr = np.maximum(crows, 0)
    avail = np.where(ok, im.nbytes[cr] // ce, 0) if len(im.nbytes) else np.zeros(n, I64)
    want = np.where(ok, np.clip(np.asarray(want, I64) * np.ones(n, I64), 0, MAX_ROWS), 0)
    R = np.minimum(want, avail)
    rl = np.repeat(np.arange(n), R)
    r = np.arange(len(rl), dtype=I64) - np.repeat(np.cumsum(R) - R, R)
    c = ints_at(im, im.start[cr[rl]] + r * ce, ce) if len(rl) else np.zeros(0, I64)
    return rl, r, c, crows, ok, int((want - R).sum())


def length_values(region: Region, want, launch: np.ndarray, cptr: np.ndarray, im: V.ValueImage):
    """The lengths of the first `want` values of each launch (`region.lengths`): the count
    buffer's values, or with `region.length_diff` the differences of its consecutive values
    (want + 1 of them read); negative lengths read nothing. Returns count_values' (launch, position,
    length, the count buffer's values rows, ok) without the missing count."""
    if not region.length_diff:
        rl, r, c, crows, ok, _ = count_values(region, want, launch, cptr, im)
        return rl, r, np.maximum(c, 0), crows, ok
    want = np.asarray(want, I64)
    rl, r, c, crows, ok, _ = count_values(region, np.where(want > 0, want + 1, 0), launch, cptr, im)
    nxt = rl[1:] == rl[:-1]
    return rl[:-1][nxt], r[:-1][nxt], np.maximum(c[1:] - c[:-1], 0)[nxt], crows, ok


def table_rows(region: Region, nrows, rs, launch: np.ndarray, cptr: np.ndarray, im: V.ValueImage, fptr=None,
               sptr=None):
    """The rows of a two-dimensional table each launch reads (module doc): per launch, `nrows`
    rows of `rs` entries, row r read up to ceil((v(count_index)[r] - s(r)) / count_div) entries,
    clipped to the row, none where the row filter (fptr: its buffer's pointer per launch) leaves
    r out; s(r) the count_sub's value (sptr its buffer's pointer; 0 where the region has none or
    the value was not recorded). Returns (the launch of each row, the row's first entry, entries
    read, the units of the last one read (row_entries), the count buffer's values rows, ok per
    launch: its count values were recorded, rows or entries asked for that are not there)."""
    n = len(launch)
    rl, r, c, crows, ok, missing = count_values(region, nrows, launch, cptr, im)
    c = filtered_counts(region, rl, r, less_sub(region, rl, r, c, launch, sptr, im), launch, fptr, im)
    rsl = (np.asarray(rs, I64) * np.ones(n, I64))[rl]
    k, kk, last = row_entries(region, c, rsl)
    return rl, r * rsl, kk, last, crows, ok, missing + int((k - kk).sum())


def less_sub(region: Region, rl: np.ndarray, r: np.ndarray, c: np.ndarray, launch: np.ndarray, sptr,
             im: V.ValueImage) -> np.ndarray:
    """Counts `c` per row (launch position rl, row r) less the region's count_sub value at the row
    (sptr: its buffer's pointer per launch; nothing taken where it was not recorded), a count
    below 0 counting as 0 first, as `row_counts` does online."""
    if region.count_sub is None or sptr is None or not len(rl):
        return c
    sub, sok = row_values(region.count_sub, rl, r, launch, sptr, im)
    return np.maximum(c, 0) - np.where(sok, sub, 0)


def _aux_rows(out: dict, region: Region, launch: np.ndarray, im: V.ValueImage, fptr, sptr) -> None:
    """The values rows of the row filter's and count_sub's buffers (`frows`, `srows` in a
    batch_pieces result), where the region has them: those buffers must be recorded too."""
    one = np.ones(len(launch), I64)
    for key, rv, ptr in (("frows", region.row_filter, fptr), ("srows", region.count_sub, sptr)):
        if rv is not None and ptr is not None:
            out[key] = im.find(launch, np.asarray(ptr, I64) * one)


def filtered_counts(region: Region, rl: np.ndarray, r: np.ndarray, c: np.ndarray, launch: np.ndarray, fptr,
                    im: V.ValueImage) -> np.ndarray:
    """Counts `c` per row (launch position rl, row r: a table's rows, or chunks of their own
    lengths) with the rows the region's row filter leaves out set to 0 (fptr: its buffer's pointer
    per launch); a row whose filter value was not recorded keeps its count."""
    if region.row_filter is None or fptr is None or not len(rl):
        return c
    f, fok = row_values(region.row_filter, rl, r, launch, fptr, im)
    return np.where(~fok | filter_keeps(region.row_filter, f), c, 0)


def row_values(rv, rl: np.ndarray, r: np.ndarray, launch: np.ndarray, ptr: np.ndarray,
               im: V.ValueImage) -> tuple[np.ndarray, np.ndarray]:
    """Per table row (launch position rl, row r): the RowValue `rv` (model_io: a row filter's or
    count_sub's value), its value at r (less the one at r+1's, `rv.diff`) in the buffer's row
    recorded for the launch (`ptr` its pointer per launch), and whether it was recorded."""
    e = rv.elem
    frows = im.find(launch, np.asarray(ptr, I64) * np.ones(len(launch), I64))[rl]
    fr = np.maximum(frows, 0)
    last = r + (2 if rv.diff else 1)
    ok = (frows >= 0) & (last * e <= (im.nbytes[fr] if len(im.nbytes) else 0))
    f = np.zeros(len(rl), I64)
    if ok.any():
        at = im.start[fr[ok]] + r[ok] * e
        f[ok] = ints_at(im, at, e)
        if rv.diff:
            f[ok] = ints_at(im, at + e, e) - f[ok]
    return f, ok


def filter_keeps(rf, f: np.ndarray) -> np.ndarray:
    """Which filter values let their rows be read (model_io.RowFilter)."""
    return f <= rf.value if rf.op == "le" else f >= rf.value


def row_entries(region: Region, c: np.ndarray, rs: np.ndarray):
    """Per row of a table, from its count value c: (entries asked for, ceil(c / count_div);
    entries read, clipped to the row's rs; the units of the last entry read, of count_div: all
    of them unless the region reads a part of its last chunk and the row was not clipped)."""
    c = np.maximum(np.asarray(c, I64), 0)
    d = int(region.count_div)
    k = divide_count(region, c)
    kk = np.minimum(k, np.maximum(rs, 0))
    last = np.full(len(kk), d, I64)
    if region.part_last and d > 1:
        whole = (kk == k) & (k > 0)
        last[whole] = c[whole] - d * (k[whole] - 1)
    return k, kk, last


def _last_chunks(region: Region, ch, kr, last):
    """Each value's chunk bytes: `ch` (per value), the last value of each row (kr values, its
    units `last` of count_div) in proportion, rounded up."""
    d = int(region.count_div)
    if not region.part_last or d == 1 or not len(kr):
        return ch
    ch = np.array(ch, I64, copy=True)
    end = np.cumsum(kr) - 1
    has = kr > 0
    ch[end[has]] = -(-ch[end[has]] * last[has] // d)
    return ch


def _table_pieces(region: Region, vals: dict, base, iptr, launch, im: V.ValueImage, ps: int, a_s, a_e, cptr,
                  fptr=None, sptr=None) -> dict:
    """batch_pieces for a two-dimensional table (`region.row_stride`; module doc)."""
    n = len(launch)
    one = np.ones(n, I64)
    st, sd, ch, nrows = (np.asarray(x, I64) * one for x in chunk_bytes(region, vals))
    rs = np.asarray(region.row_stride.evaluate(vals), I64) * one
    rows = im.find(launch, iptr)
    have = rows >= 0
    cptr = np.asarray(cptr, I64) * one
    rl, first, k, last, crows, okc, short = table_rows(region, np.where(have, nrows, 0), rs, launch, cptr, im, fptr,
                                                       sptr)
    have &= okc
    e = region.elem
    r = np.maximum(rows, 0)
    avail = np.where(have, im.nbytes[r] // e, 0) if len(im.nbytes) else np.zeros(n, I64)
    k2 = np.where(have[rl], np.clip(np.minimum(k, avail[rl] - first), 0, None), 0)
    short += int(np.where(have[rl], k - k2, 0).sum())
    last = np.where(k2 == k, last, region.count_div)   # a row the values' end cut reads whole chunks
    span = np.zeros(n, I64)
    if len(rl):
        np.maximum.at(span, rl, np.where(k2 > 0, first + k2, 0))
    z = np.zeros(0, I64)
    out = {"have": have, "rows": rows, "crows": crows, "l": z, "s": z, "e": z, "outside": 0, "sentinel": 0,
           "short": short, "bytes": span * e}
    _aux_rows(out, region, launch, im, fptr, sptr)
    per = np.bincount(rl, weights=k2, minlength=n).astype(I64) if len(rl) else np.zeros(n, I64)
    cum = np.cumsum(per)
    ls, ss, es = [], [], []
    outside = sentinel = 0
    lo = 0
    while lo < n:   # launches a few million values at a time
        hi = max(lo + 1, int(np.searchsorted(cum, (cum[lo - 1] if lo else 0) + CHUNK_VALUES, side="right")))
        m = slice(*np.searchsorted(rl, [lo, hi]))   # rl ascends
        kr = k2[m]
        vl = np.repeat(rl[m], kr)
        pos = np.repeat(first[m], kr) + np.arange(len(vl), dtype=I64) - np.repeat(np.cumsum(kr) - kr, kr)
        if len(vl):
            v = ints_at(im, im.start[r[vl]] + pos * e, e)
            chv = _last_chunks(region, ch[vl], kr, last[m])
            sp, ep, ok, neg = _value_pages(v, base[vl] + st[vl], sd[vl], chv, ps, a_s[vl], a_e[vl], region.value_div)
            sentinel += int(neg.sum())
            outside += int(_outside(ok, neg, chv).sum())
            gg, s2, e2 = FP.merge_intervals(vl[ok] - lo, sp[ok], ep[ok], hi - lo)
            ls.append(gg + lo), ss.append(s2), es.append(e2)
        lo = hi
    if ls:
        out.update(l=np.concatenate(ls), s=np.concatenate(ss), e=np.concatenate(es))
    out.update(outside=outside, sentinel=sentinel)
    return out


def _length_pieces(region: Region, vals: dict, base, iptr, launch, im: V.ValueImage, ps: int, a_s, a_e, cptr,
                   fptr=None, sptr=None) -> dict:
    """batch_pieces for chunks of their own lengths (`region.lengths`; module doc): value i of
    each launch's first `count` selects `chunk` bytes times its length over count_div, rounded up;
    by position (`region.index` None), row i of `stride` bytes, the read clipped to it. A value
    the row filter leaves out (fptr: its buffer's pointer per launch) reads nothing; a length
    less the count_sub's value at its position (sptr), as a table's row count is."""
    n = len(launch)
    one = np.ones(n, I64)
    st, sd, ch, cnt = (np.asarray(x, I64) * one for x in chunk_bytes(region, vals))
    e = region.elem
    want = np.clip(cnt, 0, MAX_INDEXED)
    by_pos = region.index is None
    if by_pos:   # as many rows as lengths were recorded
        rows, have, avail = None, np.ones(n, bool), want
    else:
        rows = im.find(launch, iptr)
        have = rows >= 0
        r = np.maximum(rows, 0)
        avail = np.where(have, im.nbytes[r] // e, 0) if len(im.nbytes) else np.zeros(n, I64)
    want = np.where(have, want, 0)
    # the lengths of the values the index row holds; a value without its length reads nothing
    vl, pos, c, crows, okc = length_values(region, np.minimum(want, avail), launch, np.asarray(cptr, I64) * one, im)
    have &= okc
    keep = have[vl]
    vl, pos, c = vl[keep], pos[keep], c[keep]
    k = np.bincount(vl, minlength=n).astype(I64) if len(vl) else np.zeros(n, I64)
    short = int(np.where(have, want - k, 0).sum())
    c = filtered_counts(region, vl, pos, less_sub(region, vl, pos, c, launch, sptr, im), launch, fptr, im)
    z = np.zeros(0, I64)
    out = {"have": have, "rows": crows if by_pos else rows, "crows": crows, "l": z, "s": z, "e": z, "outside": 0,
           "sentinel": 0, "short": short, "bytes": k * (0 if by_pos else e)}
    _aux_rows(out, region, launch, im, fptr, sptr)
    if not len(vl):
        return out
    chv = ch[vl] * divide_count(region, c)
    if by_pos:
        v = pos
        row = np.maximum(sd[vl], 0)
        out["short"] += int((chv > row).sum())
        chv = np.minimum(chv, row)
    else:
        v = ints_at(im, im.start[r[vl]] + pos * e, e)
    sp, ep, ok, neg = _value_pages(v, np.asarray(base, I64)[vl] + st[vl], sd[vl], chv, ps, a_s[vl], a_e[vl],
                                   region.value_div)
    gg, s2, e2 = FP.merge_intervals(vl[ok], sp[ok], ep[ok], n)
    out.update(l=gg, s=s2, e=e2, sentinel=int(neg.sum()), outside=int(_outside(ok, neg, chv).sum()))
    return out


def _row_reads(region: Region, values: dict, counts: np.ndarray) -> tuple:
    """A table's rows one launch reads (online): (each row's first entry, entries read, the
    units of the last one: row_entries), from the per-row count values decode_count gave."""
    rs = max(0, int(region.row_stride.evaluate(values)))
    _, k, last = row_entries(region, counts, np.full(len(counts), rs, I64))
    return np.arange(len(k), dtype=I64) * rs, k, last


def reads(region: Region, values: dict, iptr: int, count=None) -> tuple[int, int]:
    """(address, bytes) of the values one launch's indexed region reads (online); `count`: the
    count read from another buffer (count_read), where the region's count is one. A table's rows
    are read as one span, from the first row to the last entry any row reads."""
    if region.row_stride is not None:
        first, k, _ = _row_reads(region, values, count)
        span = int((first + k)[k > 0].max()) if (k > 0).any() else 0
        return int(iptr), min(span, MAX_INDEXED) * region.elem
    if region.position_range:   # no index values
        return int(iptr), 0
    if region.lengths and region.count_index is not None:
        if region.index is None:   # rows by position: no index values
            return int(iptr), 0
        # the values whose lengths were read (count_read reads the count's worth of lengths)
        cnt = min(int(region.count.evaluate(values)), 0 if count is None else len(count))
    else:
        cnt = int(region.count.evaluate(values)) if count is None else int(count)
    return int(iptr), max(0, min(cnt, MAX_INDEXED)) * region.elem


def count_read(region: Region, values: dict, cptr: int) -> tuple[int, int]:
    """(address, bytes) a region reads from another buffer for its count (online): that buffer's
    values up to the count's position (a read from the buffer's pointer, as values are recorded);
    for a table, one value per row read; for lengths, one per value (one more for their differences)."""
    pos = int(region.count.evaluate(values))
    if region.row_stride is not None or region.lengths:
        n = min(pos + (1 if region.length_diff and pos > 0 else 0), MAX_ROWS)   # as count_values clips
    else:
        n = min(pos + (0 if region.count_valid else 1), MAX_INDEXED)   # valid: the first `count` values
    return int(cptr), max(0, n) * region.count_elem


def row_read(rv, region: Region, values: dict, ptr: int) -> tuple[int, int]:
    """(address, bytes) a table's RowValue `rv` (its row filter or count_sub) reads (online): a
    value per row (one more for differences), as count_read reads the rows' counts."""
    pos = int(region.count.evaluate(values))
    n = min(pos + (1 if rv.diff and pos > 0 else 0), MAX_ROWS)
    return int(ptr), max(0, n) * rv.elem


def _decode_rows(rv, data: bytes) -> np.ndarray:
    """A RowValue's per-row values from the bytes row_read read (online)."""
    f = np.frombuffer(data, "<i4" if rv.elem == 4 else "<i8", count=len(data) // rv.elem).astype(I64)
    return np.diff(f) if rv.diff else f


def row_counts(region: Region, counts: np.ndarray, fdata: bytes | None, sdata: bytes | None = None) -> np.ndarray:
    """A table's per-row count values (decode_count) less its count_sub's values (`sdata`), with
    the rows its filter (`fdata`) leaves out set to 0 (online, as table_rows does in batch); rows
    whose values the data lacks are read as they are."""
    if counts is None or not len(counts):
        return counts
    out = np.array(counts, I64, copy=True)
    if region.count_sub is not None and sdata is not None:
        s = _decode_rows(region.count_sub, sdata)
        m = min(len(s), len(out))
        out[:m] = np.maximum(out[:m], 0) - s[:m]   # as less_sub: a count value below 0 counts as 0
    rf = region.row_filter
    if rf is not None and fdata is not None:
        f = _decode_rows(rf, fdata)
        m = min(len(f), len(out))
        out[:m] = np.where(filter_keeps(rf, f[:m]), out[:m], 0)
    return out


def decode_count(region: Region, data: bytes | None, nbytes: int):
    """The count: the last value of count_read's `nbytes` bytes (None: not known); for a table,
    each row's count value, undivided, and for chunks of their own lengths each value's length
    value (or the differences of consecutive ones: `length_diff`), undivided (an array; empty
    where nothing is read; where `data` holds fewer values than asked, those it holds)."""
    ce = region.count_elem
    fmt = "<i4" if ce == 4 else "<i8"
    if region.row_stride is not None or region.lengths:
        if nbytes <= 0:
            return np.zeros(0, I64)
        if data is None or len(data) < ce:
            return None
        # fewer values than asked (a trace's clipped row): the rows they give, as the batch path reads them
        c = np.frombuffer(data, fmt, count=min(len(data), nbytes) // ce).astype(I64)
        return np.maximum(np.diff(c) if region.length_diff else c, 0)
    if region.count_valid:   # the values not negative among those read
        if nbytes <= 0:
            return divide_count(region, 0)
        if data is None or len(data) < nbytes:
            return None
        return divide_count(region, int((np.frombuffer(data[:nbytes], fmt, count=nbytes // ce) >= 0).sum()))
    if data is None or nbytes < ce or len(data) < nbytes:
        return None
    return divide_count(region, max(0, int(np.frombuffer(data[nbytes - ce:nbytes], fmt, count=1)[0])))


def one_pieces(region: Region, fns, values: dict, base: int, data: bytes, ps: int, a_s: int, a_e: int,
               out: list, count: int | None = None) -> None:
    """An indexed region's page intervals for one launch (online), appended to `out`: `fns` the
    region's compiled (start, stride, chunk, count) functions, `data` the values' bytes; `count`
    the count read from another buffer (decode_count), where the region's count is one."""
    st, sd, ch, cnt = (f(values) for f in fns)
    e = region.elem
    if region.position_range:
        if count is None:
            return
        _, b0, b1 = _position_chunks(np.array([count], I64), base + st, sd, ch)
        sp, ep = np.maximum(b0 // ps, a_s), np.minimum(-(-b1 // ps), a_e)
        _append_merged(out, sp, ep, ep > sp)
        return
    if region.row_stride is not None:
        if count is None:
            return
        first, k, last = _row_reads(region, values, count)
        have = len(data) // e
        k2 = np.clip(np.minimum(k, have - first), 0, None)   # the values' end, as the batch path cuts rows
        last = np.where(k2 == k, last, region.count_div)
        pos = FP._ranges(first, k2)
        v = np.frombuffer(data, "<i4" if e == 4 else "<i8", count=have).astype(I64)[pos]
        chv = _last_chunks(region, np.full(len(v), ch, I64), k2, last)
        sp, ep, keep, _ = _value_pages(v, base + st, sd, chv, ps, a_s, a_e, region.value_div)
        _append_merged(out, sp, ep, keep)
        return
    if region.lengths and region.count_index is not None:
        if count is None:
            return
        by_pos = region.index is None
        held = len(count) if by_pos else min(len(data) // e, len(count))   # the values with their lengths
        k = max(0, min(int(cnt), held, MAX_INDEXED))
        v = np.arange(k, dtype=I64) if by_pos else np.frombuffer(data, "<i4" if e == 4 else "<i8", count=k).astype(I64)
        chv = ch * divide_count(region, np.asarray(count[:k], I64))
        if by_pos:   # a row's read stops at the row's end
            chv = np.minimum(chv, max(int(sd), 0))
        sp, ep, keep, _ = _value_pages(v, base + st, sd, chv, ps, a_s, a_e, region.value_div)
        _append_merged(out, sp, ep, keep)
        return
    if region.count_index is not None:
        cnt = 0 if count is None else count
    k = max(0, min(int(cnt), len(data) // e, MAX_INDEXED))
    if k == 0:
        return
    v = np.frombuffer(data, "<i4" if e == 4 else "<i8", count=k)
    bs = region.block_split
    if k <= 64:   # a few values (experts, a token): Python ints beat numpy's overhead
        for x in v.tolist():
            if x < 0:
                continue
            b0 = base + st + sd * (x // region.value_div)
            for h in range(1 if bs is None else bs.parts):
                b = b0 if bs is None else b0 + bs.slot_bytes * (x % region.value_div) + bs.part_stride * h
                sp, ep = max(b // ps, a_s), min(-(-(b + ch) // ps), a_e)
                if ep > sp and ch > 0:
                    out.append((sp, ep))
        return
    v = v.astype(I64)
    first = base + st
    if bs is not None:
        idx, first, _ = split_firsts(region, v, first)
        v = v[idx]
    sp, ep, keep, _ = _value_pages(v, first, sd, ch, ps, a_s, a_e, region.value_div)
    _append_merged(out, sp, ep, keep)


def _append_merged(out: list, sp, ep, keep) -> None:
    """The kept page intervals [sp, ep) of one launch, merged, appended to `out` (online)."""
    if keep.any():
        _, ms, me = FP.merge_intervals(np.zeros(int(keep.sum()), I64), sp[keep], ep[keep], 1)
        out.extend(zip(ms.tolist(), me.tolist()))
