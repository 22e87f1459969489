"""Predict launches' footprints from a model: the whole trace at once, or one launch at a time.

Both paths decode arguments with the same `features.Word` objects and evaluate
the same `Region` formulas through `region_bytes` / `to_pages`, which work on
numpy arrays (batch) and on Python ints (online).

Fallbacks for `irregular` regions and for kernels the model never saw:
- `allocation`: the whole allocation each pointer word points into;
- `history`: what the kernel touched in that allocation before (batch: the
  union of earlier launches' observed pages of the same kernel in the same
  allocation, plus the pages the model stored for irregular regions);
- `none`: nothing (demand paging).

Long because the batch and the online predictor stay side by side: they evaluate the same
formulas and must agree launch for launch (the tests compare them).
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np
import pyarrow as pa

from pagecast import footprints as FP
from pagecast import trace as T
from pagecast import values as V
from pagecast.errors import UsageError

from . import indexed as IX
from .features import AllocIndex, Word, grid_matrix, kernel_groups, layout_groups, layouts, param_matrix
from .model_io import FALLBACKS, KernelModel, Model, Region
from .observe import split_by_alloc

HISTORY_MAX_INTERVALS = 256


def _check_fallback(fallback: str) -> None:
    if fallback not in FALLBACKS:
        raise UsageError(f"fallback must be one of {', '.join(FALLBACKS)}, not {fallback!r}")


# ---- the formulas, shared by both paths --------------------------------------------

def _lt_max(a, b):
    return np.maximum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else max(a, b)


def _lt_min(a, b):
    return np.minimum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else min(a, b)


def region_bytes(region: Region, values, base):
    """(start byte, end byte) of a fixed/linear region, or (start, count, chunk, stride) when strided."""
    if region.cls == "strided":
        return (base + region.start.evaluate(values), region.count.evaluate(values),
                region.chunk.evaluate(values), region.stride.evaluate(values))
    return base + region.start.evaluate(values), base + region.end.evaluate(values)


def to_pages(start_b, end_b, ps: int, alloc_s, alloc_e):
    """Byte range -> page interval clipped to the allocation's pages."""
    sp = _lt_max(start_b // ps, alloc_s)
    ep = _lt_min(-((-end_b) // ps), alloc_e)
    return sp, ep


@dataclass
class _Compiled:
    km: KernelModel
    bases: list          # resolved Word per region
    words: list          # resolved feature Words (union over regions)
    indexes: list        # per region, the resolved pointer Word of an indexed region's values (else None)
    counts: list         # per region, the resolved pointer Word of the buffer its count is read from (else None)
    filters: list        # per region, the resolved pointer Word of a table's row filter buffer (else None)
    subs: list           # per region, the resolved pointer Word of a table's count_sub buffer (else None)


def _pointed(trace, index, launch: np.ndarray, tptr: np.ndarray, r) -> tuple[np.ndarray, np.ndarray]:
    """(launch, allocation) of each live allocation the first `r.count` 64-bit values recorded at
    `tptr` point into, per launch (a table of addresses; none where no values were recorded)."""
    im = V.image(trace)
    rows = im.find(launch, tptr)
    n = int(r.count.const) if r.count is not None else 0
    ls, vs = [], []
    for row in np.unique(rows[rows >= 0]):
        v = im.ints(int(row), n, 8).astype(np.uint64)
        at = np.flatnonzero(rows == row)
        ls.append(np.repeat(launch[at], len(v)))
        vs.append(np.tile(v, len(at)))
    if not ls:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    lv, vv = np.concatenate(ls), np.concatenate(vs)
    a = index.lookup(vv, lv)
    return lv[a >= 0], a[a >= 0]


def _compile(km: KernelModel) -> _Compiled:
    names: dict[str, Word] = {}
    bases = []
    indexes = []
    counts = []
    filters = []
    subs = []

    def word(text: str | None, cls: str) -> Word | None:
        """An indexed region's pointer word (or an unresolved one's table of addresses), resolved;
        None where the region has none."""
        return Word.parse(text).resolve(km.param_sizes) if cls != "irregular" and text is not None else None

    for r in km.regions:
        bases.append(Word.parse(r.base).resolve(km.param_sizes))
        # rows by position (no index word) take the count buffer's pointer in its place
        indexes.append(word(r.index if r.index is not None else r.count_index, r.cls))
        counts.append(word(r.count_index, r.cls))
        filters.append(word(r.row_filter.index if r.row_filter is not None else None, r.cls))
        subs.append(word(r.count_sub.index if r.count_sub is not None else None, r.cls))
        for n in sorted(r.feature_names()):
            names.setdefault(n, Word.parse(n).resolve(km.param_sizes))
    return _Compiled(km, bases, list(names.values()), indexes, counts, filters, subs)


# ---- batch ---------------------------------------------------------------------

class _Acc:
    """Accumulates predicted (launch, start page, end page, label) pieces, and for the pieces that
    index values chose, the launch after which those values exist (`gates`)."""

    def __init__(self) -> None:
        self.l, self.s, self.e, self.lab = [], [], [], []
        self.labels: list[str] = []
        self._code: dict[str, int] = {}
        self.gates: list[tuple[np.ndarray, ...]] = []
        self.plain: list[tuple[np.ndarray, ...]] = []   # the pieces without a gate
        self.value_reads: list[tuple[np.ndarray, np.ndarray]] = []   # (launch, value bytes read)
        # indexed regions: launches without values, values past the end of their row, values whose
        # chunk lies outside the allocation
        self.stats = {"indexed_launches": 0, "no_values": 0, "short_values": 0, "outside_values": 0,
                      "sentinel_values": 0}

    def add(self, launch, s, e, label: str, after=None) -> None:
        launch, s, e = (np.asarray(x, np.int64) for x in (launch, s, e))
        keep = e > s
        if not keep.any():
            return
        c = self._code.setdefault(label, len(self.labels))
        if c == len(self.labels):
            self.labels.append(label)
        self.l.append(launch[keep])
        self.s.append(s[keep])
        self.e.append(e[keep])
        self.lab.append(np.full(int(keep.sum()), c, np.int32))
        if after is not None:
            self.gates.append((launch[keep], s[keep], e[keep], np.asarray(after, np.int64)[keep]))
        else:
            self.plain.append((launch[keep], s[keep], e[keep]))

    def arrays(self):
        if not self.l:
            z = np.zeros(0, np.int64)
            return z, z.copy(), z.copy(), np.zeros(0, np.int32)
        return (np.concatenate(self.l), np.concatenate(self.s), np.concatenate(self.e), np.concatenate(self.lab))


def _predict_pieces(model: Model, trace: T.Trace, fallback: str, *, baseline: bool = False, gates: bool = False):
    """All predicted pieces of a trace plus, per launch, whether its kernel was unseen. With `gates`,
    the pieces of indexed regions also carry the launch after which their values exist."""
    _check_fallback(fallback)
    if trace.page_size != model.page_size:
        raise UsageError(f"{trace.path}: page size {trace.page_size} differs from the model's {model.page_size}")
    ps = trace.page_size
    L = trace.launches
    index = AllocIndex(trace.allocations)
    a_s = (index.addr // np.uint64(ps)).astype(np.int64)
    a_e = ((index.end + np.uint64(ps - 1)) // np.uint64(ps)).astype(np.int64)
    names, codes, groups = kernel_groups(L)
    acc = _Acc()
    unseen = np.zeros(trace.n_launches, bool)
    fb_l, fb_a, fb_k, fb_h = [], [], [], []   # fallback requests: launch, alloc row, kernel code, stored history

    def scan_pointers(kcode, idx):
        """Every 8-byte aligned word that points into a live allocation (unseen kernels, baseline)."""
        sizes, offsets, _ = layouts(L, idx)
        width = max([s + o for s, o in zip(sizes, offsets)] or [0])
        mat = param_matrix(L, idx, width)
        for off in range(0, width - 7, 8):
            v = np.ascontiguousarray(mat[:, off:off + 8]).view("<u8").reshape(-1)
            a = index.lookup(v, idx)
            ok = a >= 0
            if ok.any():
                yield idx[ok], a[ok]

    def predict_kernel(km, idx, k):
        """The pieces of launches `idx` of kernel code `k`, all of `km`'s parameter layout."""
        comp = _compile(km)
        width = max([s + o for s, o in zip(km.param_sizes, km.param_offsets)] or [0])
        mat = param_matrix(L, idx, width)
        grid = grid_matrix(L, idx)
        values = {w.name: w.batch(mat, km.param_offsets, grid) for w in comp.words}
        for r, bw, iw, cw, fw, sw in zip(km.regions, comp.bases, comp.indexes, comp.counts, comp.filters, comp.subs):
            ptr = bw.pointer_batch(mat, km.param_offsets)
            a = index.lookup(ptr, idx)
            ok = a >= 0
            if not ok.any():
                continue
            l, ac = idx[ok], a[ok]
            if r.cls in ("fixed", "linear"):
                vals = {n: v[ok] for n, v in values.items()}
                sb, eb = region_bytes(r, vals, ptr[ok].astype(np.int64))
                sp, ep = to_pages(np.asarray(sb) * np.ones(len(l), np.int64), np.asarray(eb) * np.ones(len(l), np.int64),
                                  ps, a_s[ac], a_e[ac])
                acc.add(l, sp, ep, r.cls)
            elif r.cls == "strided":
                vals = {n: v[ok] for n, v in values.items()}
                one = np.ones(len(l), np.int64)
                st, cnt, ch, sd = (np.asarray(x, np.int64) * one for x in region_bytes(r, vals, ptr[ok].astype(np.int64)))
                cnt = np.minimum(np.clip(cnt, 0, 1 << 20), _useful_chunks(st, ch, sd, a_s[ac] * ps, a_e[ac] * ps))
                rep = np.repeat(np.arange(len(l)), cnt)
                j = np.arange(len(rep)) - np.repeat(np.cumsum(cnt) - cnt, cnt)
                sb = st[rep] + j * sd[rep]
                sp, ep = to_pages(sb, sb + ch[rep], ps, a_s[ac][rep], a_e[ac][rep])
                acc.add(l[rep], sp, ep, "strided")
            elif r.predicts == "allocation":   # an `unresolved` region too (model_io.PREDICTED_AS)
                acc.add(l, a_s[ac], a_e[ac], r.cls)
                if iw is not None:   # and the allocations its table's 64-bit addresses point into
                    pl, pa = _pointed(trace, index, l, iw.pointer_batch(mat, km.param_offsets)[ok], r)
                    acc.add(pl, a_s[pa], a_e[pa], r.cls)
            elif r.cls == "indexed":
                vals = {n: v[ok] for n, v in values.items()}
                im = V.image(trace)
                cptr = None if cw is None else cw.pointer_batch(mat, km.param_offsets)[ok].astype(np.int64)
                fptr, sptr = (None if w is None else w.pointer_batch(mat, km.param_offsets)[ok].astype(np.int64)
                              for w in (fw, sw))
                res = IX.batch_pieces(r, vals, ptr[ok].astype(np.int64), iw.pointer_batch(mat, km.param_offsets)[ok],
                                      l, im, ps, a_s[ac], a_e[ac], cptr, fptr, sptr)
                have = res["have"]
                st = acc.stats
                st["indexed_launches"] += len(l)
                st["no_values"] += int((~have).sum())
                st["short_values"] += res["short"]
                st["outside_values"] += res["outside"]
                st["sentinel_values"] += res["sentinel"]
                after = None
                if gates:
                    after = np.full(len(l), -1, np.int64)
                    after[have] = V.producers(trace, l[have], res["rows"][have])
                    if res["crows"] is not None:   # the count's buffer must exist too
                        after[have] = np.maximum(after[have], V.producers(trace, l[have], res["crows"][have]))
                    for key in ("frows", "srows"):   # and the row filter's and count_sub's
                        if res.get(key) is not None:
                            after[have] = np.maximum(after[have], V.producers(trace, l[have], res[key][have]))
                    after = after[res["l"]]
                    acc.value_reads.append((l[have], res["bytes"][have]))
                acc.add(l[res["l"]], res["s"], res["e"], "indexed", after=after)
                # a launch whose values the trace does not hold: predicted as an irregular region is
                nv = ~have
                if nv.any():
                    if fallback == "allocation":
                        acc.add(l[nv], a_s[ac[nv]], a_e[ac[nv]], "fallback:allocation")
                    elif fallback == "history":
                        fb_l.append(l[nv]), fb_a.append(ac[nv]), fb_k.append(np.full(int(nv.sum()), k)), fb_h.append(None)
            else:  # irregular
                if fallback == "allocation":
                    acc.add(l, a_s[ac], a_e[ac], "fallback:allocation")
                elif fallback == "history":
                    fb_l.append(l), fb_a.append(ac), fb_k.append(np.full(len(l), k)), fb_h.append(r.history)
    for k, (name, idx) in enumerate(zip(names, groups)):
        km = None if baseline else model.kernels.get(name)
        if km is None or (not km.regions and km.note):
            if km is None and not baseline:
                unseen[idx] = True
            for l, a in scan_pointers(k, idx):
                if baseline or fallback == "allocation":
                    acc.add(l, a_s[a], a_e[a], "allocation" if baseline else "fallback:allocation")
                elif fallback == "history":
                    fb_l.append(l), fb_a.append(a), fb_k.append(np.full(len(l), k)), fb_h.append(None)
            continue
        # each parameter layout by the model fitted for it (the kernel's, or a variant's)
        known = np.zeros(len(idx), bool)
        mine = []
        for sizes, offsets, mask in layout_groups(L, idx):
            kv = km.for_layout(sizes, offsets)
            if kv is not None and (kv.regions or not kv.note):
                known |= mask
                mine.append((kv, idx[mask]))
        other = idx[~known]
        if len(other):
            unseen[other] = True
            for l, a in scan_pointers(k, other):
                if fallback == "allocation":
                    acc.add(l, a_s[a], a_e[a], "fallback:allocation")
                elif fallback == "history":
                    fb_l.append(l), fb_a.append(a), fb_k.append(np.full(len(l), k)), fb_h.append(None)
        for kv, vidx in mine:
            predict_kernel(kv, vidx, k)

    if fb_l:
        _history_fallback(trace, index, a_s, a_e, fb_l, fb_a, fb_k, fb_h, acc)
    return acc, unseen


_FEW_CHUNKS = 64   # strided counts up to this are walked as they are: for so few chunks the numpy on
                   # scalars that finds the useful ones costs more (microseconds) than it saves


def _useful_chunks(st, ch, sd, lo, hi):
    """How many of a strided region's chunks (start st, chunk ch, stride sd bytes) can touch the
    allocation [lo, hi): the rest are clipped away, so a count beyond it (a model edited to 2**48)
    costs nothing. A stride of 0 repeats one chunk."""
    st, ch, sd = np.asarray(st, np.int64), np.asarray(ch, np.int64), np.asarray(sd, np.int64)
    up = -(-(np.asarray(hi, np.int64) - st) // np.maximum(sd, 1))           # st + j*sd < hi
    down = -(-(st + ch - np.asarray(lo, np.int64)) // np.maximum(-sd, 1))   # st + j*sd + ch > lo
    return np.maximum(np.where(sd > 0, up, np.where(sd < 0, down, 1)), 0)


def _history_fallback(trace, index, a_s, a_e, fb_l, fb_a, fb_k, fb_h, acc: _Acc) -> None:
    """Per (kernel, allocation), in launch order: predict the union of what earlier launches touched."""


    # observed pages of the launches that asked only (records without a launch id attributed by
    # time), from the trace's observed footprints: made once per trace (every model and capacity
    # the simulator predicts with shares them), read piece by piece (FP.observed_footprints)
    ids = np.unique(np.concatenate(fb_l))
    obs = FP.observed_footprints(trace)
    o_l = obs.launch_of_interval()
    mine = np.isin(o_l, ids)
    okey, os_, oe = split_by_alloc(index, trace.page_size, o_l[mine], obs.start[mine], obs.end[mine])
    nA = max(index.n, 1)
    out_l, out_s, out_e = [], [], []
    req = []
    for l, a, k, h in zip(fb_l, fb_a, fb_k, fb_h):
        for i in range(len(l)):
            req.append((int(k[i]), int(a[i]), int(l[i]), h))
    req.sort(key=lambda t: (t[0], t[1], t[2]))
    cur_key = None
    cs = ce = None
    for k, a, l, h in req:
        if (k, a) != cur_key:
            cur_key = (k, a)
            if h:
                hs = np.array([p[0] for p in h], np.int64) + a_s[a]
                he = np.array([p[1] for p in h], np.int64) + a_s[a]
                cs, ce = np.maximum(hs, a_s[a]), np.minimum(he, a_e[a])
                keep = ce > cs
                cs, ce = cs[keep], ce[keep]
            else:
                cs = ce = np.zeros(0, np.int64)
        if len(cs):
            out_l.append(np.full(len(cs), l, np.int64)), out_s.append(cs), out_e.append(ce)
        key = l * nA + a
        r0, r1 = np.searchsorted(okey, key), np.searchsorted(okey, key, side="right")
        if r1 > r0:
            ns, ne_ = os_[r0:r1], oe[r0:r1]
            if len(cs):
                p = np.searchsorted(cs, ns, side="right") - 1
                inside = (p >= 0) & (ce[np.maximum(p, 0)] >= ne_) & (cs[np.maximum(p, 0)] <= ns)
                if inside.all():
                    continue
            _, cs, ce = FP.merge_intervals(np.zeros(len(cs) + len(ns), np.int64), np.concatenate([cs, ns]),
                                           np.concatenate([ce, ne_]), 1)
            cs, ce = FP.coarsen_intervals(cs, ce, HISTORY_MAX_INTERVALS)
    if out_l:
        acc.add(np.concatenate(out_l), np.concatenate(out_s), np.concatenate(out_e), "fallback:history")


def _footprints(l, s, e, n: int, ps: int) -> FP.Footprints:
    """Footprints from pieces: one argsort when they are already disjoint, else the core merge."""
    if len(l):
        smin = int(s.min())
        span = int(e.max()) - smin + 1
        if span * max(n, 1) < 2 ** 62:
            o = np.argsort(l * span + (s - smin), kind="stable")
            l2, s2, e2 = l[o], s[o], e[o]
            same = l2[1:] == l2[:-1]
            if not np.any(same & (s2[1:] <= e2[:-1])):
                indptr = np.zeros(n + 1, np.int64)
                np.cumsum(np.bincount(l2, minlength=n), out=indptr[1:])
                return FP.Footprints(indptr, s2, e2, ps, "predicted")
    return FP.Footprints.from_intervals(l, s, e, n, ps, "predicted")


def predict_footprints(model: Model, trace: T.Trace, fallback: str = "history") -> FP.Footprints:
    """Predicted pages of every launch of a trace (source "predicted")."""
    acc, _ = _predict_pieces(model, trace, fallback)
    l, s, e, _ = acc.arrays()
    return _footprints(l, s, e, trace.n_launches, trace.page_size)


@dataclass
class Gates:
    """The predicted pieces that index values chose, each with the launch after which its values
    exist (`after`; -1: before the trace's first launch): nothing may bring them in earlier.
    `value_launch`, `value_bytes`: the bytes of index values each such launch reads; `plain`:
    the footprint of the other pieces (what the arguments alone tell)."""

    launch: np.ndarray
    start: np.ndarray     # pages
    end: np.ndarray
    after: np.ndarray
    value_launch: np.ndarray
    value_bytes: np.ndarray
    plain: FP.Footprints | None = None

    @classmethod
    def empty(cls, plain: FP.Footprints | None = None) -> "Gates":
        z = np.zeros(0, np.int64)
        return cls(z, z.copy(), z.copy(), z.copy(), z.copy(), z.copy(), plain)


def predict_gated(model: Model, trace: T.Trace, fallback: str = "history") -> tuple[FP.Footprints, Gates, dict]:
    """Predicted footprints, the pieces index values chose with when their values exist (`Gates`),
    and the indexed regions' counts (launches without values, values outside their allocation)."""
    acc, _ = _predict_pieces(model, trace, fallback, gates=True)
    l, s, e, _ = acc.arrays()
    n, ps = trace.n_launches, trace.page_size
    fp = _footprints(l, s, e, n, ps)
    if not acc.gates:
        return fp, Gates.empty(fp), dict(acc.stats)
    plain = (FP.Footprints.from_intervals(*(np.concatenate([x[i] for x in acc.plain]) for i in range(3)), n, ps,
                                          "predicted") if acc.plain else FP.Footprints.empty(n, ps, "predicted"))
    vl = np.concatenate([x[0] for x in acc.value_reads]) if acc.value_reads else np.zeros(0, np.int64)
    vb = np.concatenate([x[1] for x in acc.value_reads]) if acc.value_reads else np.zeros(0, np.int64)
    g = Gates(*(np.concatenate([x[i] for x in acc.gates]) for i in range(4)), vl, vb, plain)
    return fp, g, dict(acc.stats)


def predict_with_unseen(model: Model, trace: T.Trace, fallback: str = "history", stats: dict | None = None):
    """(footprints, mask of launches whose kernel the model never saw). `stats`, when given, is
    filled with the indexed regions' counts (launches, without values, values past the end of
    their row, values whose chunk lies outside the allocation)."""
    acc, unseen = _predict_pieces(model, trace, fallback)
    if stats is not None:
        stats.update(acc.stats)
    l, s, e, _ = acc.arrays()
    return _footprints(l, s, e, trace.n_launches, trace.page_size), unseen


def allocation_footprints(trace: T.Trace) -> FP.Footprints:
    """The `allocation` baseline: every pointer word's whole allocation (MSched's "Alloc.")."""
    acc, _ = _predict_pieces(Model(page_size=trace.page_size), trace, "allocation", baseline=True)
    l, s, e, _ = acc.arrays()
    return FP.Footprints.from_intervals(l, s, e, trace.n_launches, trace.page_size, "predicted")


RANGE_SCHEMA = pa.schema([(T.LAUNCH_ID, pa.int64()), (T.ADDRESS, pa.uint64()), (T.BYTES, pa.int64()),
                          ("template", pa.string())])


def predict_ranges(model: Model, trace: T.Trace, fallback: str = "history") -> pa.Table:
    """One row per merged predicted range: launch_id, address, bytes, template (the class that produced it)."""
    acc, _ = _predict_pieces(model, trace, fallback)
    l, s, e, lab = acc.arrays()
    ps = trace.page_size
    ml, ms, me = FP.merge_intervals(l, s, e, trace.n_launches)
    if len(ml):
        # label each merged range with the class of its first piece
        o = np.lexsort((s, l))
        l2, s2, lab2 = l[o], s[o], lab[o]
        # position of each merged range's first piece: pieces sorted (launch, start); merged likewise
        span = int(max(me.max(), e.max()) + 1)
        k_piece = l2 * span + s2 if span * max(trace.n_launches, 1) < 2 ** 62 else None
        if k_piece is not None:
            pos = np.searchsorted(k_piece, ml * span + ms)
            labels = np.array(acc.labels, dtype=object)[lab2[np.minimum(pos, len(lab2) - 1)]]
        else:  # pragma: no cover
            labels = np.full(len(ml), "mixed", dtype=object)
    else:
        labels = np.zeros(0, dtype=object)
    # Field names come from the trace module's constants; "template" is this table's own column.
    return pa.table({T.LAUNCH_ID: pa.array(ml, pa.int64()),
                     T.ADDRESS: pa.array((ms.astype(np.uint64) * np.uint64(ps)), pa.uint64()),
                     T.BYTES: pa.array((me - ms) * ps, pa.int64()),
                     "template": pa.array(labels.tolist(), pa.string())}, schema=RANGE_SCHEMA)


# ---- online ----------------------------------------------------------------------

_FMT = {(1, True): "<b", (2, True): "<h", (4, True): "<i", (8, True): "<q",
        (1, False): "<B", (2, False): "<H", (4, False): "<I", (8, False): "<Q"}


class _IndexWords(NamedTuple):
    """An indexed region's pointer words, as (parameter, byte within it), each None where the
    region has none: its values (or, rows by position, its count buffer), its count's buffer, its
    table's row filter's and count_sub's buffers."""

    index: tuple
    count: tuple | None
    filter: tuple | None
    sub: tuple | None


def _pointer(param_data: bytes, offs, word: tuple) -> int:
    """The 8-byte pointer at (parameter, byte within it) of a launch's parameter bytes."""
    return struct.unpack_from("<Q", param_data, offs[word[0]] + word[1])[0]


def _row_data(values, read: tuple[int, int]) -> bytes | None:
    """The bytes of a table's row values `read` (IX.row_read's address and size) from the
    runtime's `values` callback; None where it reads nothing or they are not known."""
    addr, nb = read
    return values(addr, nb) if nb > 0 else None


class OnlinePredictor:
    """One launch at a time: kernel name, parameter bytes, grid and block in; merged page ranges out.

    Live allocations are kept incrementally (`add_allocation`, `free_allocation`).
    With the `history` fallback, call `observe` with the pages a launch really
    touched (its faults) so later launches of irregular or unseen kernels can
    use them.
    """

    def __init__(self, model: Model, fallback: str = "history") -> None:
        _check_fallback(fallback)
        self.model = model
        self.fallback = fallback
        self.ps = model.page_size
        self._addrs: list[int] = []
        self._ends: dict[int, int] = {}
        self._ids: dict[int, object] = {}
        self._compiled: dict[str, tuple] = {}
        self._history: dict[tuple, list] = {}
        self._merged_len: dict[tuple, int] = {}
        self._model_version = model.version_counter
        # optional: pointer -> (address, nbytes) of the allocation it lands in, or None; asked when
        # a pointer lands in no allocation known yet (the GPU runner looks them up lazily)
        self.resolve: Callable[[int], tuple[int, int] | None] | None = None

    # allocations
    def add_allocation(self, address: int, nbytes: int, alloc_id=None) -> None:
        address = int(address)
        if address not in self._ends:
            bisect.insort(self._addrs, address)
        self._ends[address] = address + int(nbytes)
        self._ids[address] = alloc_id if alloc_id is not None else address

    def free_allocation(self, address: int) -> None:
        address = int(address)
        if address in self._ends:
            del self._ends[address]
            del self._ids[address]
            i = bisect.bisect_left(self._addrs, address)
            del self._addrs[i]
            self._history = {k: v for k, v in self._history.items() if k[1] != address}
            self._merged_len = {k: v for k, v in self._merged_len.items() if k[1] != address}

    def _alloc_of(self, v: int):
        i = bisect.bisect_right(self._addrs, v) - 1
        if i >= 0:
            a = self._addrs[i]
            if v <= self._ends[a]:
                return a
        if self.resolve is not None:
            r = self.resolve(v)
            if r is not None:
                self.add_allocation(r[0], r[1])
                return int(r[0])
        return None

    def warm(self) -> "OnlinePredictor":
        """Compile every kernel of the model now, so that no launch pays for it (the first launch
        of a kernel otherwise compiles its formulas: milliseconds, inside a launch callback)."""
        for name, km in list(self.model.kernels.items()):
            self._kernel(name, None)
            for kv in (km, *km.variants):
                self._kernel(name, kv.param_sizes)
        return self

    def _kernel(self, name: str, sizes):
        if self.model.version_counter != self._model_version:
            self._compiled.clear()
            self._model_version = self.model.version_counter
        key = (name, None if sizes is None else tuple(sizes))
        c = self._compiled.get(key)
        if c is None:
            km = self.model.kernels.get(name)
            if km is not None and sizes is not None:
                km = km.for_layout(sizes)   # the kernel's or a variant's layout; None: neither
            if km is None:
                c = (None, None, None)
            else:
                comp = _compile(km)
                words = [(w.name, w.param, w.within, _FMT[(w.size, w.signed)], w) for w in comp.words]
                bases = []
                for r, b, iw, cw, fw, sw in zip(km.regions, comp.bases, comp.indexes, comp.counts, comp.filters,
                                                comp.subs):
                    if r.cls == "indexed":
                        fns = tuple(f.function() for f in (r.start, r.stride, r.chunk, r.count))
                    else:
                        fns = tuple(f.function() if f is not None else None
                                    for f in (r.start, r.end, r.count, r.chunk, r.stride))
                    ix = None if iw is None else _IndexWords(*((None if w is None else (w.param, w.within))
                                                               for w in (iw, cw, fw, sw)))
                    bases.append((r, b.param, b.within, r.predicts, fns, ix))
                c = (km, words, bases)
            self._compiled[key] = c
        return c

    def _arguments(self, km, words, param_data: bytes, param_offsets, grid, block):
        offs = param_offsets if param_offsets is not None else km.param_offsets
        gb = (*grid, *block)
        values = {}
        for name, p, within, fmt, w in words:
            values[name] = gb[within] if p < 0 else struct.unpack_from(fmt, param_data, offs[p] + within)[0]
        return offs, values

    def value_reads(self, kernel: str, param_data: bytes, param_offsets=None, param_sizes=None,
                    grid=(1, 1, 1), block=(1, 1, 1)) -> list[tuple[int, int]]:
        """The (address, bytes) of the index values the launch's indexed regions read: what a
        runtime copies from the GPU once the launch that writes them has ended, and hands to
        `predict(..., values=...)`. Empty for a launch without indexed regions."""
        km, words, bases = self._kernel(kernel, param_sizes)
        if km is None or not any(b[3] == "indexed" for b in bases):
            return []
        offs, values = self._arguments(km, words, param_data, param_offsets, grid, block)
        out = []
        for r, p, within, cls, fns, ix in bases:
            if cls != "indexed":
                if ix is not None and r.count is not None:   # an unresolved region's table of addresses
                    out.append((_pointer(param_data, offs, ix.index), 8 * int(r.count.const)))
                continue
            if self._alloc_of(_pointer(param_data, offs, (p, within))) is None:
                continue
            if ix.count is not None:   # the count is read first; the values it asks for are known only then
                addr, nb = IX.count_read(r, values, _pointer(param_data, offs, ix.count))
                if nb > 0:
                    out.append((addr, nb))
                for w, rv in ((ix.filter, r.row_filter), (ix.sub, r.count_sub)):   # the table's row values
                    if w is not None:
                        addr, nb = IX.row_read(rv, r, values, _pointer(param_data, offs, w))
                        if nb > 0:
                            out.append((addr, nb))
                continue
            addr, nb = IX.reads(r, values, _pointer(param_data, offs, ix.index))
            if nb > 0:
                out.append((addr, nb))
        return out

    def predict(self, kernel: str, param_data: bytes, param_offsets=None, param_sizes=None,
                grid=(1, 1, 1), block=(1, 1, 1), values: Callable[[int, int], bytes | None] | None = None
                ) -> list[tuple[int, int]]:
        """Merged page ranges [start, end) the launch is predicted to touch. `values(address,
        nbytes)` gives the index values an indexed region reads (bytes, or None when they are not
        known): without them such a region is predicted as an irregular one."""
        km, words, bases = self._kernel(kernel, param_sizes)
        ps = self.ps
        out: list[tuple[int, int]] = []
        if km is None or (not km.regions and km.note):
            self._fallback_scan(kernel, param_data, out)
            return _merge(out)
        offs, args = self._arguments(km, words, param_data, param_offsets, grid, block)
        for r, p, within, cls, fns, ix in bases:
            v = _pointer(param_data, offs, (p, within))
            a = self._alloc_of(v)
            if a is None:
                continue
            a_s, a_e = a // ps, -(-self._ends[a] // ps)
            if cls == "indexed":
                data = cnt = None
                if values is not None:
                    if ix.count is not None:   # a count read from another buffer first
                        caddr, cnb = IX.count_read(r, args, _pointer(param_data, offs, ix.count))
                        cnt = IX.decode_count(r, values(caddr, cnb) if cnb > 0 else None, cnb)
                        if cnt is not None and (ix.filter is not None or ix.sub is not None):
                            # rows the table's filter leaves out read nothing; count_sub is taken off
                            fdata, sdata = (None if w is None else _row_data(values, IX.row_read(rv, r, args,
                                            _pointer(param_data, offs, w)))
                                            for w, rv in ((ix.filter, r.row_filter), (ix.sub, r.count_sub)))
                            cnt = IX.row_counts(r, cnt, fdata, sdata)
                    if ix.count is None or cnt is not None:
                        addr, nb = IX.reads(r, args, _pointer(param_data, offs, ix.index), cnt)
                        data = values(addr, nb) if nb > 0 else b""
                if data is None:
                    self._fallback_alloc(kernel, a, a_s, a_e, r.history, out)
                else:
                    IX.one_pieces(r, fns, args, v, data, ps, a_s, a_e, out, cnt)
                continue
            if cls == "fixed" or cls == "linear":
                # the same compiled formulas as the batch path (region_bytes); pages clipped alike
                sp = (v + fns[0](args)) // ps
                ep = -(-(v + fns[1](args)) // ps)
                sp = a_s if sp < a_s else sp
                ep = a_e if ep > a_e else ep
                if ep > sp:
                    out.append((sp, ep))
            elif cls == "strided":
                st = v + fns[0](args)
                cnt, ch, sd = fns[2](args), fns[3](args), fns[4](args)
                if cnt > _FEW_CHUNKS:   # numpy on scalars costs microseconds: only where it can save more
                    cnt = min(cnt, int(_useful_chunks(st, ch, sd, a_s * ps, a_e * ps)))
                for j in range(max(0, min(cnt, 1 << 20))):
                    b0 = st + j * sd
                    sp, ep = max(b0 // ps, a_s), min(-(-(b0 + ch) // ps), a_e)
                    if ep > sp:
                        out.append((sp, ep))
            elif cls == "allocation":
                out.append((a_s, a_e))
                if ix is not None and values is not None and r.count is not None:
                    # an unresolved region's table of addresses: the allocations they point into
                    data = values(_pointer(param_data, offs, ix.index), 8 * int(r.count.const))
                    for t in (np.frombuffer(data[:len(data) // 8 * 8], "<u8").tolist() if data else ()):
                        b = self._alloc_of(t)
                        if b is not None:
                            out.append((b // ps, -(-self._ends[b] // ps)))
            else:
                self._fallback_alloc(kernel, a, a_s, a_e, r.history, out)
        return _merge(out)

    def _fallback_alloc(self, kernel, a, a_s, a_e, stored, out) -> None:
        if self.fallback == "allocation":
            out.append((a_s, a_e))
        elif self.fallback == "history":
            h = self._history.get((kernel, a))
            if h is not None:
                out.extend(h)
            elif stored:
                out.extend((max(a_s, a_s + s), min(a_e, a_s + e)) for s, e in stored if a_s + s < a_e)

    def _fallback_scan(self, kernel, data: bytes, out) -> None:
        if self.fallback == "none":
            return
        for off in range(0, len(data) - 7, 8):
            v = int.from_bytes(data[off:off + 8], "little")
            a = self._alloc_of(v)
            if a is not None:
                self._fallback_alloc(kernel, a, a // self.ps, -(-self._ends[a] // self.ps), None, out)

    def observe(self, kernel: str, pages) -> None:
        """Record pages a launch of `kernel` touched (page intervals), for the history fallback."""
        for s, e in pages:
            a = self._alloc_of(int(s) * self.ps)
            if a is None:
                continue
            key = (kernel, a)
            h = self._history.setdefault(key, [])
            h.append((int(s), int(e)))
            # merged once it has doubled since the last merge (amortised O(1) per interval, at most
            # 2 x HISTORY_MAX_INTERVALS held), coarsened to HISTORY_MAX_INTERVALS as the batch
            # history is: never cut
            if len(h) > max(64, 2 * self._merged_len.get(key, 0)):
                m = _merge(h)
                if len(m) > HISTORY_MAX_INTERVALS:
                    cs, ce = FP.coarsen_intervals(np.array([x for x, _ in m], np.int64),
                                                  np.array([y for _, y in m], np.int64), HISTORY_MAX_INTERVALS)
                    m = list(zip(cs.tolist(), ce.tolist()))
                self._history[key] = m
                self._merged_len[key] = len(m)


def _merge(iv: list[tuple[int, int]]) -> list[tuple[int, int]]:
    if len(iv) <= 1:
        return [(int(s), int(e)) for s, e in iv]
    iv = sorted(iv)
    out = [list(iv[0])]
    for s, e in iv[1:]:
        if s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1][1] = e
        else:
            out.append([s, e])
    return [(int(s), int(e)) for s, e in out]
