"""Fault feedback: refine a model from pages a launch touched that were not predicted.

`apply_feedback(model, trace, launch_id, missed_start, missed_end)` takes the
missed pages of one launch (page intervals) and, for each allocation they fall
in, the region whose base points there:

- fixed / linear: first try to *replace* the formulas with the simplest ones
  that explain the stored fit evidence plus this launch (the missed pages must
  lie inside); failing that, *widen* the formula that nearly held (shift its
  constant by the missing pages); a region widened `DEMOTE_AFTER` times is
  *demoted* to irregular (its misses become its history);
- strided / allocation: counted; strided regions are demoted like the others;
- indexed: its pages follow the launch's index values, which no formula of the arguments can
  widen: each launch it misses is counted, and one missed `DEMOTE_AFTER` times is demoted;
- irregular: the missed pages join its history;
- an allocation no region covers, or a kernel the model never saw: a new
  irregular region for the pointer word that points there (history = the misses).

Returns True when the model changed (and bumps `model.version_counter`).
"""

from __future__ import annotations

import numpy as np

from pagecast import footprints as FP
from pagecast import trace as T

from . import formula as FM
from .features import AllocIndex, Word, candidate_words
from .fit.params import FitParams   # the same bound on a region's stored history as the fit's
from .model_io import KernelModel, Model, Region
from .predictor import predict_footprints

DEMOTE_AFTER = 3           # widenings of one region before it is declared irregular
NEAR = 0.5                 # a miss within this share of the region's size (or 2 big pages) "nearly held"
FEEDBACK_ROWS = 64         # launches' bounds kept beside the fit's evidence

def _index(trace: T.Trace) -> AllocIndex:
    holder = getattr(trace, "_pc_alloc_index", None)
    if holder is None:
        holder = AllocIndex(trace.allocations)
        try:
            object.__setattr__(trace, "_pc_alloc_index", holder)
        except Exception:  # pragma: no cover
            pass
    return holder


def _launch(trace: T.Trace, lid: int):
    """One launch's kernel, parameter bytes, layout and grid (no whole-row conversion: this
    runs once per launch with misses, online)."""
    L = trace.launches
    g = getattr(trace, "_pc_grid", None)
    if g is None:
        g = np.stack([L.column(c).to_numpy() for c in T.GRID_COLUMNS], axis=1).astype(np.int64)
        try:
            object.__setattr__(trace, "_pc_grid", g)
        except Exception:  # pragma: no cover
            pass
    grid = tuple(g[lid].tolist())
    return (L.column(T.KERNEL)[lid].as_py(), L.column(T.PARAM_DATA)[lid].as_py(),
            tuple(L.column(T.PARAM_SIZES)[lid].as_py()), tuple(L.column(T.PARAM_OFFSETS)[lid].as_py()), grid)


_WORDS: dict = {}


def _word(name: str, sizes) -> Word:
    key = (name, tuple(sizes))
    w = _WORDS.get(key)
    if w is None:
        if len(_WORDS) > 65536:
            _WORDS.clear()
        w = _WORDS[key] = Word.parse(name).resolve(sizes)
    return w


def apply_feedback(model: Model, trace: T.Trace, launch_id: int, missed_start, missed_end) -> bool:
    ms = np.atleast_1d(np.asarray(missed_start, np.int64))
    me = np.atleast_1d(np.asarray(missed_end, np.int64))
    keep = me > ms
    ms, me = ms[keep], me[keep]
    if len(ms) == 0:
        return False
    ps = model.page_size
    kernel, data, sizes, offsets, grid = _launch(trace, int(launch_id))
    ix = _index(trace)
    lid = int(launch_id)
    if len(ms) <= 8:  # the usual online case: a few missed intervals
        arow = np.array([ix.lookup_one(int(x) * ps, lid, one_past=False) for x in ms.tolist()], np.int64)
    else:
        arow = ix.lookup(ms.astype(np.uint64) * np.uint64(ps), np.full(len(ms), lid), one_past=False)
    ok = arow >= 0
    if not ok.any():
        return False
    ms, me, arow = ms[ok], me[ok], arow[ok]
    km = model.kernels.get(kernel)
    changed = False
    if km is None:
        km = KernelModel(kernel, sizes, offsets, launches=0, traces=0,
                         note="added by fault feedback (never fitted)")
        model.kernels[kernel] = km
        changed = True
    km = km.for_layout(sizes, offsets) or km   # the model of this launch's layout (a variant's)
    km.feedback["events"] = int(km.feedback.get("events", 0)) + 1
    km.feedback["missed_pages"] = int(km.feedback.get("missed_pages", 0)) + int((me - ms).sum())
    same_layout = tuple(km.param_sizes) == sizes and tuple(km.param_offsets) == offsets
    values = _values(km, data, offsets, grid) if same_layout else {}
    # where every region's base points at this launch (one vectorized lookup)
    ptr = [_word(r.base, km.param_sizes).pointer_one(data, offsets) for r in km.regions] if same_layout else []
    prow = np.array([ix.lookup_one(int(v), lid) for v in ptr], np.int64)
    for a in np.unique(arow):
        sel = arow == a
        s_, e_ = ms[sel], me[sel]
        a_s = int(ix.addr[a]) // ps
        a_e = -(-int(ix.end[a]) // ps)
        cands = [(ptr[i], km.regions[i]) for i in np.flatnonzero(prow == a)]
        if not cands:
            changed |= _new_irregular(km, data, sizes, offsets, ix, lid, a, s_, e_, a_s)
            continue
        km.feedback["misses"] = int(km.feedback.get("misses", 0)) + 1
        # several pointers into one allocation: each owns the part from its own page up to the
        # next pointer above it (observe.py), so a missed interval goes to the highest pointer
        # at or below it (the lowest one for pages below every pointer)
        cands.sort(key=lambda x: x[0])
        bp = np.array([v // ps for v, _ in cands], np.int64)
        who = np.maximum(np.searchsorted(bp, s_, side="right") - 1, 0)
        for i in np.unique(who):
            base, region = cands[int(i)]
            m_ = who == i
            changed |= _refine(km, region, values, base, s_[m_], e_[m_], a_s, a_e, ps)
    if changed:
        model.version_counter += 1
    return changed


def _values(km: KernelModel, data: bytes, offsets, grid) -> dict:
    names = set()
    for r in km.regions:
        names |= r.feature_names()
        ev = r.fit.get("evidence") if isinstance(r.fit, dict) else None
        if ev:
            names |= set(ev.get("features", []))
    out = {}
    for n in names:
        try:
            out[n] = _word(n, km.param_sizes).one(data, offsets, grid)
        except (ValueError, IndexError):
            pass
    return out


def _new_irregular(km, data, sizes, offsets, ix, lid, a, s_, e_, alloc_page) -> bool:
    ptrs, _ = candidate_words(sizes, offsets)
    if not ptrs:
        return False
    rows = np.array([ix.lookup_one(int(w.pointer_one(data, offsets)), lid) for w in ptrs], np.int64)
    for i in np.flatnonzero(rows == a):
        w = ptrs[int(i)]
        if True:
            if any(r.base == w.name for r in km.regions):
                return False
            km.regions.append(Region(w.name, "irregular", history=_merge_hist([], s_ - alloc_page, e_ - alloc_page),
                                     fit={"launches": 0, "observed": 0, "traces": 0, "exact": 0.0,
                                          "source": "feedback"}))
            return True
    return False


def _merge_hist(hist, s, e):
    hs = np.array([h[0] for h in hist] + list(s), np.int64)
    he = np.array([h[1] for h in hist] + list(e), np.int64)
    _, hs, he = FP.merge_intervals(np.zeros(len(hs), np.int64), hs, he, 1)
    hs, he = FP.coarsen_intervals(hs, he, FitParams().history_intervals)  # the fit's bound on stored history
    return [[int(x), int(y)] for x, y in zip(hs, he)]


def _demote(region: Region, s_, e_, alloc_page) -> None:
    region.cls = "irregular"
    region.start = region.end = region.count = region.chunk = region.stride = region.row_stride = None
    region.index = None
    region.history = _merge_hist(region.history, s_ - alloc_page, e_ - alloc_page)
    region.fit["demoted_by_feedback"] = True


def _refine(km: KernelModel, r: Region, values: dict, base: int, s_, e_, a_s: int, a_e: int, ps: int) -> bool:
    if r.cls == "irregular":
        before = list(r.history)
        r.history = _merge_hist(r.history, s_ - a_s, e_ - a_s)
        return r.history != before
    if r.predicts == "allocation":   # an `unresolved` region too (model_io.PREDICTED_AS)
        return False  # a miss inside the allocation cannot be: the prediction already held it
    if r.cls == "strided":
        return _refine_strided(r, values, base, s_, e_, a_s, a_e, ps)
    if r.cls == "indexed":
        # values that chose other pages than the template says (or none recorded, the fallback's
        # misses): nothing to widen; one that keeps missing is not what the values choose
        r.fit["feedback_misses"] = int(r.fit.get("feedback_misses", 0)) + 1
        if r.fit["feedback_misses"] >= DEMOTE_AFTER:
            _demote(r, s_, e_, a_s)
            return True
        return False   # counted; its predictions stay what they were
    # fixed / linear: where is the current prediction?
    try:
        sb = base + int(r.start.evaluate(values))
        eb = base + int(r.end.evaluate(values))
    except KeyError:
        _demote(r, s_, e_, a_s)
        return True
    sp, ep = max(sb // ps, a_s), min(-(-eb // ps), a_e)
    lo_need, hi_need = int(s_.min()), int(e_.max())
    if lo_need >= sp and hi_need <= ep:
        return False  # already covered (an earlier refinement took care of it)
    # 1. replace: the simplest formulas explaining the evidence plus this launch
    need_s, need_e = min(lo_need, sp), max(hi_need, ep)
    row = [-int(FM.INF), (need_s + 1) * ps - 1 - base, (need_e - 1) * ps + 1 - base, int(FM.INF)]
    res = _resolve(r, values, row, pair=True)
    if res is not None:
        fs, fe = res
        r.start, r.end = fs, fe
        r.cls = "fixed" if not fs.terms and not fe.terms else "linear"
        r.fit["replaced_by_feedback"] = int(r.fit.get("replaced_by_feedback", 0)) + 1
        return True
    # 2. widen the formula that nearly held, 3. demote one that keeps missing
    r.fit["feedback_misses"] = int(r.fit.get("feedback_misses", 0)) + 1
    size = max(ep - sp, 1)
    near = max(NEAR * size, 32)
    if r.fit["feedback_misses"] >= DEMOTE_AFTER or sp - lo_need > near or hi_need - ep > near:
        _demote(r, s_, e_, a_s)
        return True
    if lo_need < sp:
        r.start = FM.Formula(r.start.const - (sp - lo_need) * ps, r.start.terms)
    if hi_need > ep:
        r.end = FM.Formula(r.end.const + (hi_need - ep) * ps, r.end.terms)
    r.cls = "fixed" if not r.start.terms and not r.end.terms else "linear"
    r.fit["widened_by_feedback"] = int(r.fit.get("widened_by_feedback", 0)) + 1
    return True


def _resolve(r: Region, values: dict, row: list, pair: bool):
    """Re-solve a region's formula(s) over its stored evidence plus one new row of bounds.

    `row` holds [start_lo, start_hi, end_lo, end_hi] in bytes relative to the base (for a
    strided region's chunk, the chunk's bounds twice). The evidence keeps the fit's feature
    groups; rows added by feedback are kept apart (at most FEEDBACK_ROWS, oldest dropped)
    so that the fit's own groups are never forgotten. Strict: every row must hold.
    """
    ev = r.fit.get("evidence") if isinstance(r.fit, dict) else None
    if not ev or not all(n in values for n in ev["features"]):
        return None
    feats = list(ev["features"])
    new = [int(values[n]) for n in feats] + [int(x) for x in row] + [1]
    rows = [list(x) for x in ev["rows"]] + [list(x) for x in ev.get("feedback_rows", [])] + [new]
    R = np.array(rows, dtype=np.int64)
    U = R[:, :len(feats)]
    varying = np.array([len(np.unique(U[:, k])) > 1 for k in range(U.shape[1])], bool)
    mono = FM.monomials(feats, U, varying)
    w = np.ones(len(R), np.float64)
    if pair:
        fs = FM.solve(mono, R[:, -5], R[:, -4], w)
        if fs is None:
            return None
        fe = FM.solve(mono, R[:, -3], R[:, -2], w)
        if fe is None:
            return None
        out = (fs, fe)
    else:
        f = FM.solve(mono, R[:, -3], R[:, -2], w)
        if f is None:
            return None
        out = (f,)
    ev["feedback_rows"] = (list(ev.get("feedback_rows", [])) + [new])[-FEEDBACK_ROWS:]
    return out


def _refine_strided(r: Region, values: dict, base: int, s_, e_, a_s: int, a_e: int, ps: int) -> bool:
    """A strided region whose chunk outgrew the training scales: re-solve the chunk."""
    try:
        start = base + int(r.start.evaluate(values))
        stride = int(r.stride.evaluate(values))
        count = int(r.count.evaluate(values))
        chunk = int(r.chunk.evaluate(values))
    except KeyError:
        _demote(r, s_, e_, a_s)
        return True
    if count < 1 or chunk < 1:
        _demote(r, s_, e_, a_s)
        return True
    # which chunk each missed interval extends: the last chunk starting at or before it
    cs = np.asarray(s_, np.int64) * ps
    ce = np.asarray(e_, np.int64) * ps
    k = np.clip((cs + ps - 1 - start) // stride if stride > 0 else np.zeros(len(cs), np.int64), 0, count - 1)
    cstart = start + k * stride
    covered = (-(-(cstart + chunk) // ps)) * ps  # the prediction is page-rounded
    miss = ce > covered
    before = cs + ps - 1 < cstart
    if not miss.any() and not before.any():
        return False
    if not before.any():
        need = int(((ce - ps + 1) - cstart)[miss].max())   # chunk must reach into the last missed page
        res = _resolve(r, values, [need, int(FM.INF), need, int(FM.INF)], pair=False)
        if res is not None:
            r.chunk = res[0]
            r.fit["replaced_by_feedback"] = int(r.fit.get("replaced_by_feedback", 0)) + 1
            return True
    r.fit["feedback_misses"] = int(r.fit.get("feedback_misses", 0)) + 1
    if r.fit["feedback_misses"] >= DEMOTE_AFTER or before.any():
        _demote(r, s_, e_, a_s)
        return True
    need = int(((ce - cstart)[miss]).max())
    if need - chunk > max(NEAR * chunk, 32 * ps):
        _demote(r, s_, e_, a_s)
        return True
    r.chunk = FM.Formula(r.chunk.const + (-(-(need - chunk) // ps)) * ps, r.chunk.terms)
    r.fit["widened_by_feedback"] = int(r.fit.get("widened_by_feedback", 0)) + 1
    return True


def fault_misses(model: Model, trace: T.Trace, fallback: str = "history"):
    """The misses of a trace under a model: fault pages the model's predictions do not hold.

    Every fault record's page was certainly touched (observe.py); in a trace recorded while
    running with the model's predictions those are the misses, and in a full-mode trace
    (recorded without them) the fault pages outside the predicted pages are exactly what the
    prediction would have missed — never the rest of a fault's 64 KiB big page, which the
    driver widens to but the launch need not have touched. Irregular regions and unseen
    kernels are predicted by `fallback` (`history`, the default of `pagecast predict`), so
    their misses are the pages they had not touched before. Returns (launch, start, end)
    page intervals sorted by launch.
    """
    ps = trace.page_size
    f = trace.faults
    lid = FP.attribute_by_time(trace, f.column(T.LAUNCH_ID), f.column(T.TIME_NS))
    page = (f.column(T.ADDRESS).to_numpy().astype(np.uint64) // np.uint64(ps)).astype(np.int64)
    faults = FP.Footprints.from_intervals(lid, page, page + 1, trace.n_launches, ps, "observed")
    pred = predict_footprints(model, trace, fallback)
    return _difference(faults, pred)


def feedback_from_trace(model: Model, trace: T.Trace, progress=None) -> int:
    """Apply feedback for every launch of a trace, in launch order (see `fault_misses`).

    The misses are computed once against the model as it was; a refinement made at one
    launch covers later launches' misses, which `apply_feedback` then ignores (it checks
    each miss against the current formulas). Returns how many launches changed the model.
    """
    lo, s, e = fault_misses(model, trace)
    changed = 0
    if len(lo) == 0:
        return 0
    starts = np.flatnonzero(np.r_[True, lo[1:] != lo[:-1]])
    ends = np.r_[starts[1:], len(lo)]
    for a, b in zip(starts, ends):
        if apply_feedback(model, trace, int(lo[a]), s[a:b], e[a:b]):
            changed += 1
    return changed


def _difference(a: FP.Footprints, b: FP.Footprints):
    """Pages in a but not in b, as (launch, start, end) intervals sorted by launch."""
    la, lb = a.launch_of_interval(), b.launch_of_interval()
    # boundaries: each a-interval cut by b-intervals; done page-exact with events
    n = a.n_launches
    span = int(max(a.end.max() if len(a.end) else 0, b.end.max() if len(b.end) else 0)) + 1
    if span * max(n, 1) >= 2 ** 62:  # pragma: no cover
        raise ValueError("address span too large")
    pos = np.concatenate([la * span + a.start, la * span + a.end, lb * span + b.start, lb * span + b.end])
    da = np.concatenate([np.ones(len(la), np.int64), -np.ones(len(la), np.int64),
                         np.zeros(2 * len(lb), np.int64)])
    db = np.concatenate([np.zeros(2 * len(la), np.int64), np.ones(len(lb), np.int64), -np.ones(len(lb), np.int64)])
    o = np.argsort(pos, kind="stable")
    pos, da, db = pos[o], da[o], db[o]
    ca, cb = np.cumsum(da), np.cumsum(db)
    # coverage after each event holds until the next event position
    inside = (ca > 0) & (cb == 0)
    nxt = np.r_[pos[1:], pos[-1]] if len(pos) else pos
    seg = inside & (nxt > pos)
    s, e = pos[seg], nxt[seg]
    lid = s // span
    s, e = s - lid * span, e - lid * span
    # segments never cross launches (every launch's intervals close before the next opens)
    g, s, e = FP.merge_intervals(lid, s, e, n)
    return g, s, e
