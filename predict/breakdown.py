"""Where one kernel's predictions miss: its predicted and touched pages split by the buffer they
lie in (`evaluate --kernel NAME`).

A kernel under the bar over-predicts or misses in some of its buffers, not all: a paged
attention's KV cache may be exact while its output rows are predicted whole. Each launch's
region base words point into allocations; the pages of the prediction and of the footprint are
counted inside each such allocation, keyed by the words that point into it at that launch (two
words into one allocation, a fused QKV's K and V views, share a row), and what lies in no
allocation a word points into is counted as `elsewhere`. Page counts come from interval
arithmetic (|A n W| = |A| + |W| - |A u W|), never from expanding pages.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pagecast import footprints as FP
from pagecast import trace as T
from pagecast.allocations import AllocIndex

from .features import Word, layout_groups, param_matrix
from .model_io import KernelModel

ELSEWHERE = "elsewhere"   # the key of pages in no allocation a region's base word points into


@dataclass
class BufferStats:
    """One buffer of a kernel (the words pointing into it), its templates and its pages summed over
    the kernel's launches: predicted, touched (footprint), both (hits)."""

    words: str             # "p3" or "p1,p2" (words into the same allocation), or ELSEWHERE
    templates: list[str]   # each word's region as the model file writes it
    launches: int          # launches at which the words point into an allocation
    predicted_pages: int
    footprint_pages: int
    hit_pages: int

    @property
    def false_pages(self) -> int:
        return self.predicted_pages - self.hit_pages

    @property
    def missed_pages(self) -> int:
        return self.footprint_pages - self.hit_pages



def buffer_breakdown(trace: T.Trace, km: KernelModel, idx: np.ndarray, pred: FP.Footprints,
                     truth: FP.Footprints) -> list[BufferStats]:
    """The kernel's launches `idx` (of `trace`), their predicted and touched pages split by buffer
    (module doc), the most false pages first, ELSEWHERE last."""
    n = trace.n_launches
    ps = trace.page_size
    ix = AllocIndex(trace.allocations)
    union = FP.Footprints.from_intervals(
        np.concatenate([pred.launch_of_interval(), truth.launch_of_interval()]),
        np.concatenate([pred.start, truth.start]), np.concatenate([pred.end, truth.end]), n, ps)
    # per (launch, allocation row): the words pointing into it
    lids, rows, words, texts = [], [], [], {}
    for sizes, offsets, mask in layout_groups(trace.launches, idx):
        m = km.for_layout(sizes, offsets)
        if m is None:
            continue
        sub = idx[mask]
        mat = param_matrix(trace.launches, sub, max((o + z for o, z in zip(offsets, sizes)), default=0))
        for r in m.regions:
            texts.setdefault(r.base, r.text())
            ptr = Word.parse(r.base).resolve(sizes).pointer_batch(mat, offsets)
            row = ix.lookup(ptr, sub)
            ok = row >= 0
            lids.append(sub[ok])
            rows.append(row[ok])
            words.extend([r.base] * int(ok.sum()))
    out: list[BufferStats] = []
    inside_p = np.zeros(n, np.int64)
    inside_t = np.zeros(n, np.int64)
    inside_h = np.zeros(n, np.int64)
    if lids:
        # one key per (launch, allocation): the words into it, in the model's order
        order = {w: k for k, w in enumerate(texts)}
        pair = np.concatenate(lids) * (ix.n + 1) + np.concatenate(rows)
        keys: dict[int, list[str]] = {}
        for p_, w in zip(pair.tolist(), words):
            keys.setdefault(p_, []).append(w)
        joined = [",".join(sorted(set(ws), key=order.get)) for ws in keys.values()]
        names = sorted(set(joined))
        kid = {k: i for i, k in enumerate(names)}
        pairs = np.fromiter(keys, np.int64, len(keys))
        key_of = np.array([kid[j] for j in joined], np.int64)
        pl, pr = pairs // (ix.n + 1), pairs % (ix.n + 1)
        s = (ix.addr[pr] // np.uint64(ps)).astype(np.int64)
        e = -(-ix.end[pr].astype(np.int64) // ps)
        # allocations never overlap (sorted by start, their ends are sorted too), but two may
        # share a page at their edges: it counts for the lower one, so no page counts twice
        o = np.lexsort((s, pl))
        pl, s, e, key_of = pl[o], s[o], e[o], key_of[o]
        same = np.r_[False, pl[1:] == pl[:-1]]
        s = np.where(same, np.maximum(s, np.r_[0, e[:-1]]), s)
        for k, key in enumerate(names):
            m = key_of == k
            win = FP.Footprints.from_intervals(pl[m], s[m], np.maximum(e[m], s[m]), n, ps)
            p_in, t_in, u_in = (FP.intersection_pages(x, win) for x in (pred, truth, union))
            h_in = p_in + t_in - u_in
            inside_p += p_in
            inside_t += t_in
            inside_h += h_in
            out.append(BufferStats(key, [texts[w] for w in key.split(",")], len(np.unique(pl[m])),
                                   int(p_in.sum()), int(t_in.sum()), int(h_in.sum())))
    out.sort(key=lambda b: (-b.false_pages, -b.missed_pages, b.words))
    hits = pred.pages_per_launch() + truth.pages_per_launch() - union.pages_per_launch()
    pp, tp, hp = (x[idx] for x in (pred.pages_per_launch(), truth.pages_per_launch(), hits))
    rest = BufferStats(ELSEWHERE, [], len(idx), int(pp.sum() - inside_p[idx].sum()),
                       int(tp.sum() - inside_t[idx].sum()), int(hp.sum() - inside_h[idx].sum()))
    if rest.predicted_pages or rest.footprint_pages:
        out.append(rest)
    return out
