"""Learn per-kernel templates from fault traces (never from truth).

For every kernel, for every base word (an 8-byte parameter word that points
into a live allocation), the pages observed in that allocation at each launch
give bounds on where the region starts and ends:

- start page in [A_s, min(first fault page, end of the first big page)]
- end page in [max(last fault page + 1, start of the last big page + 1), A_e]

where O (the big pages the records show touched, `observe.TraceObs`) holds [O_s, O_e)
and A extends it with the pages that may have been touched (the driver's prefetch
migrations, big pages allocations share). The inner sides are positive evidence; the
outer ones only say that nothing was seen, which lost records fake. Relative to the base
pointer these are byte intervals; launches with equal features form groups, and
`fit_solve` finds the simplest integer formulas that hold for all launches but those lost
records explain (`fit_params.FitParams`), `fit_likelihood` chooses among formulas that
hold by where the faults landed, `fit_strided` fits chunked regions. Several traces are
pooled: a template must hold in all of them. docs/template-model.md explains it all.

Long because fitting is one search (bounds, formula candidates, classes) over per-kernel state
that its steps share; the parts that stand alone (features, formula, observe, fit_solve,
fit_likelihood, fit_strided) are modules of their own.
"""

from __future__ import annotations

import time
from collections import defaultdict

import numpy as np
import pyarrow as pa

from pagecast import PRODUCER
from pagecast import trace as T
from pagecast.errors import TraceError, UsageError
from pagecast.footprints import _ranges, coarsen_intervals, merge_intervals  # noqa: PLC2701 - the core's CSR helpers

from . import formula as FM
from .features import (GRID_NAMES, MAX_FEATURE, Word, candidate_words, factorize_rows, grid_matrix, layouts,
                       param_matrix)
from .fit_likelihood import _aligned_odds, _argument_backed, _likeliest, _within
from .fit_params import FitParams, trace_loss
from .fit_shapes import RangeEvidence, shared_shape, vocabulary
from .fit_solve import _evidence, _solve_pair, _split_groups
from .fit_indexed import fit_indexed
from .fit_strided import _clean_runs, _fit_strided, _gather, _holes_from_loss, _verify
from .model_io import KernelModel, Model, Region
from .observe import TraceObs

DEFAULT = FitParams()


def fit_model(traces: list, progress=None, params: FitParams | None = None) -> Model:
    """One model from several traces (different scales / seeds of the same program).

    `params`: the thresholds the fit decides with (`FitParams`, recorded in the model)."""
    params = params or DEFAULT
    if not traces:
        raise UsageError("fit needs at least one trace")
    ps = {t.page_size for t in traces}
    if len(ps) != 1:
        raise TraceError("traces have different page sizes: " + ", ".join(f"{t.path}: {t.page_size}" for t in traces))
    ps = ps.pop()
    if sum(t.n_launches for t in traces) == 0:
        raise TraceError("no launches in " + ", ".join(str(t.path) for t in traces) + ": nothing to learn from")
    obs = [TraceObs(t, params.big_page) for t in traces]
    for o in obs:
        o.loss = trace_loss(o.trace, params)
    if sum(o.n_records for o in obs) == 0:
        raise TraceError("no faults or migrations in " + ", ".join(str(t.path) for t in traces)
                         + ": nothing to learn from (was unified-memory profiling on?)")
    model = Model(page_size=ps, big_page=params.big_page, fit_params=params.to_json(), created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  producer=PRODUCER,
                  traces=[{"path": str(t.path), "workload": t.name, "mode": t.mode, "launches": t.n_launches}
                          for t in traces])
    parts: dict[str, list] = defaultdict(list)
    for o in obs:
        whole = o.trace.whole_launches()   # a launch cut off while it ran shows part of its footprint
        for name, idx in zip(o.names, o.groups):
            idx = idx[whole[idx]]
            if len(idx):
                parts[name].append((o, idx))
    names = sorted(parts)
    for name in names:
        model.kernels[name] = fit_kernel(name, parts[name], ps, params)
        if progress is not None:
            progress.advance(1) if hasattr(progress, "advance") else progress(1)
    return model


# ---- one kernel ------------------------------------------------------------------

class KernelData:
    """A kernel's launches pooled over traces: words, features, groups."""

    def __init__(self, name: str, parts: list, ps: int, params: FitParams = DEFAULT) -> None:
        self.name, self.ps, self.params = name, ps, params
        self.bigp = max(1, params.big_page // ps)
        # the record loss its traces say they had (the worst of them): how many launches lost
        # records may leave unexplained
        self.loss = max([getattr(o, "loss", params.assumed_loss) for o, _ in parts] or [params.assumed_loss])
        o0, idx0 = parts[0]
        self.sizes, self.offsets, _ = layouts(o0.trace.launches, idx0)
        width = max([s + o for s, o in zip(self.sizes, self.offsets)] or [0])
        self.parts = []  # (obs, launch ids, byte matrix, grid matrix)
        self.skipped = 0
        for o, idx in parts:
            s, off, mask = layouts(o.trace.launches, idx)
            if (s, off) != (self.sizes, self.offsets):
                # this trace's majority layout differs: keep only launches with ours
                mask = self._same_layout(o.trace.launches, idx)
            self.skipped += int((~mask).sum())
            idx = idx[mask]
            if len(idx) == 0:
                continue
            self.parts.append((o, idx, param_matrix(o.trace.launches, idx, width), grid_matrix(o.trace.launches, idx)))
        self.n = sum(len(p[1]) for p in self.parts)
        self.traces = len(self.parts)
        ptrs, ints = candidate_words(self.sizes, self.offsets)
        # bases: 8-byte words that point into live allocations
        self.bases: list[tuple[Word, list[np.ndarray]]] = []
        non_ptr: list[Word] = []
        for w in ptrs:
            vals = [w.pointer_batch(m, self.offsets) for _, _, m, _ in self.parts]
            hits = sum(int((o.index.lookup(v, idx) >= 0).sum()) for (o, idx, _, _), v in zip(self.parts, vals))
            if self.n and hits >= params.pointer_share * self.n:
                self.bases.append((w, vals))
            else:
                non_ptr.append(w)
        base_spans = [(w.param, w.within, w.within + 8) for w, _ in self.bases]
        words = [w for w in ints if not any(w.param == p and w.within < e and w.within + w.size > s
                                            for p, s, e in base_spans)]
        words += non_ptr
        words += [Word(g, -1, i, 4) for i, g in enumerate(GRID_NAMES)]
        # decode, filter floats and huge values
        self.feat_names: list[str] = []
        cols: list[np.ndarray] = []
        seen: dict[bytes, str] = {}
        for w in words:
            v = np.concatenate([w.batch(m, self.offsets, g) for _, _, m, g in self.parts]) if self.parts \
                else np.zeros(0, np.int64)
            if len(v) == 0 or _float_like(w, v) or np.abs(v).max() > MAX_FEATURE:
                continue
            if ".d" in w.name and np.abs(v).max() >= 1 << 32:
                continue  # two 4-byte fields read as one (their 4-byte words are features already)
            key = v.tobytes()
            if key in seen:
                continue
            seen[key] = w.name
            self.feat_names.append(w.name)
            cols.append(v)
        F = np.stack(cols, axis=1) if cols else np.zeros((self.n, 0), np.int64)
        varying = np.array([len(np.unique(F[:, j][:4096])) > 1 or np.any(F[:, j] != F[0, j]) for j in range(F.shape[1])],
                           bool) if self.n else np.zeros(F.shape[1], bool)
        is_grid = np.array([n in GRID_NAMES for n in self.feat_names], bool)
        small = np.array([self.n > 0 and 1 < abs(int(F[0, j])) <= 1 << 16 for j in range(F.shape[1])], bool)
        vi = [j for j in range(F.shape[1]) if varying[j]]
        vi = sorted(vi, key=lambda j: is_grid[j])[:params.max_varying]
        ci = [j for j in range(F.shape[1]) if not varying[j] and small[j] and not is_grid[j]][:params.max_const]
        sel = vi + ci
        self.sel_names = [self.feat_names[j] for j in sel]
        self.sel_varying = np.array([varying[j] for j in sel], bool)
        Fs = F[:, sel]
        if Fs.shape[1]:
            self.uniq, self.group = factorize_rows(Fs)
        else:
            self.uniq = np.zeros((1 if self.n else 0, 0), np.int64)
            self.group = np.zeros(self.n, np.int64)
        self.U = len(self.uniq)
        self.values = {n: self.uniq[:, k] for k, n in enumerate(self.sel_names)}
        self._mono = None

    def allowed(self, n: int, edges=2) -> int:
        """Launches of n a template may leave unexplained (lost records; FitParams); `edges`: the
        edges each launch's evidence has (2 for a range, 2 per run seen of a strided region)."""
        return self.params.allowed_unexplained(int(n), self.loss, edges)

    def _same_layout(self, launches, idx):
        offs = launches.column(T.PARAM_OFFSETS).take(pa.array(idx)).to_pylist()
        sizes = launches.column(T.PARAM_SIZES).take(pa.array(idx)).to_pylist()
        return np.array([tuple(s) == self.sizes and tuple(o) == self.offsets for s, o in zip(sizes, offs)], bool)

    def mono(self, groups: np.ndarray) -> FM.Monomials:
        # a feature that varies over the kernel's launches may stand alone even where it is
        # constant over these groups (a stride of 128*max_seq seen at one max_seq)
        return FM.monomials(self.sel_names, self.uniq[groups], self.sel_varying_on(groups) | self.sel_varying)

    def sel_varying_on(self, groups):
        u = self.uniq[groups]
        return np.array([len(np.unique(u[:, k])) > 1 for k in range(u.shape[1])], bool) if len(u) else \
            np.zeros(u.shape[1], bool)


def _float_like(w: Word, v: np.ndarray) -> bool:
    """A word whose values read as 'nice' floats and as huge integers is a float, not a size."""
    nz = v[v != 0]
    if len(nz) == 0:
        return False
    if w.size == 4:
        big = np.abs(nz) > (1 << 24)
        f = nz.astype(np.int64).astype(np.uint32).view(np.float32)
        nice = np.isfinite(f) & (np.abs(f) >= 1e-6) & (np.abs(f) <= 1e9) & ((nz.astype(np.uint32) & 0x3FF) == 0)
        return bool(np.mean(big & nice) > 0.5)
    if w.size == 8:
        big = np.abs(nz) > (1 << 40)
        f = nz.astype(np.int64).view(np.float64)
        nice = np.isfinite(f) & (np.abs(f) >= 1e-9) & (np.abs(f) <= 1e15)
        return bool(np.mean(big & nice) > 0.5)
    return False


def fit_kernel(name: str, parts: list, ps: int, params: FitParams = DEFAULT) -> KernelModel:
    kd = KernelData(name, parts, ps, params)
    km = KernelModel(name, kd.sizes, kd.offsets, launches=kd.n, traces=kd.traces)
    if kd.n == 0:
        km.note = "no launches with a consistent parameter layout"
        return km
    if not kd.bases:
        km.note = "no parameter points into an allocation: footprint unexplained (fallback)"
        return km
    regions: list[tuple[tuple, Region]] = []
    shapes: list[tuple[Region, RangeEvidence | None]] = []
    any_obs = False
    fences = _fences(kd)
    for (w, vals), fe in zip(kd.bases, fences):
        r, sig, shape = fit_region(kd, w, vals, fe)
        if r is None:
            continue
        any_obs = True
        regions.append((sig, r))
        shapes.append((r, shape))
    # ends the records leave open take the sizes the kernel's other regions are proven to have
    tier1, tier2 = vocabulary(kd, shapes)
    for r, shape in shapes:
        shared_shape(kd, r, shape, tier1, tier2)
    # two words that always point into the same allocation see the same pages: keep the simpler
    best: dict[tuple, Region] = {}
    order: list[tuple] = []
    for sig, r in regions:
        if sig not in best:
            best[sig] = r
            order.append(sig)
        elif _region_score(r) < _region_score(best[sig]):
            best[sig] = r
    km.regions = [best[s] for s in order]
    if not any_obs:
        km.note = "no faults observed in the allocations its parameters point into"
    if kd.skipped:
        km.note = (km.note + "; " if km.note else "") + f"{kd.skipped} launches with another parameter layout skipped"
    return km


def _region_score(r: Region) -> tuple:
    rank = {"fixed": 0, "linear": 1, "strided": 2, "allocation": 3, "indexed": 4, "irregular": 5}[r.cls]
    fs = r.formulas().values()
    return (rank, sum(f.score()[0] for f in fs), sum(f.score()[1] for f in fs))


def _fences(kd: KernelData) -> list[list]:
    """Per base word and trace: the pages [lo, hi) of its allocation this word owns.

    When several base words point into one allocation, each owns the part from its
    pointer to the next pointer above it (the lowest one also owns what lies below).
    """
    B = len(kd.bases)
    out = [[None] * len(kd.parts) for _ in range(B)]
    if B < 2:
        return out
    ps = kd.ps
    for ti, (o, idx, _, _) in enumerate(kd.parts):
        P = np.stack([vals[ti].astype(np.int64) for _, vals in kd.bases], axis=1)      # (n, B)
        A = np.stack([o.index.lookup(vals[ti], idx) for _, vals in kd.bases], axis=1)
        big = np.int64(1) << np.int64(62)
        for b in range(B):
            same = (A == A[:, b:b + 1]) & (A[:, b:b + 1] >= 0)
            same[:, b] = False
            above = same & (P > P[:, b:b + 1])
            below = same & (P < P[:, b:b + 1])
            hi = np.where(above, P, big).min(axis=1)
            soft = np.where(hi < big, -((-hi) // ps), big)
            # the next pointer's big page belongs to it (its region starts there); a region of
            # ours may still run into that big page, up to the pointer itself (soft fence)
            bigp = kd.bigp
            hard = np.where(hi < big, (hi // ps // bigp) * bigp, big)
            hard = np.where(hard <= P[:, b] // ps, soft, hard)
            lo_page = np.where(below.any(axis=1), P[:, b] // ps, -big)
            fault_hi = np.where(hi < big, hi // ps, big)  # the next pointer's first page may hold its faults
            if above.any() or below.any():
                out[b][ti] = (lo_page, hard, soft, fault_hi)
    return out


def fit_region(kd: KernelData, w: Word, vals: list[np.ndarray], fences=None):
    """Fit one base word's region: (region, signature, RangeEvidence of a range region's end or
    None); (None, None, None) when it never points at observed pages."""
    ps = kd.ps
    bigp = kd.bigp
    fences = fences or [None] * len(kd.parts)
    obs = [o.region(idx, v, *(fe if fe is not None else (None, None, None, None)))
           for (o, idx, _, _), v, fe in zip(kd.parts, vals, fences)]
    natural = np.concatenate([np.full(len(idx), o.trace.mode != "full") for o, idx, _, _ in kd.parts])
    cat = {k: np.concatenate([ob[k] for ob in obs]) for k in obs[0]}
    trace_no = np.concatenate([np.full(len(ob["valid"]), i) for i, ob in enumerate(obs)])
    sig = (hash(np.concatenate([ob["base"] for ob in obs]).tobytes()),)
    valid = cat["valid"]
    nonempty = valid & (cat["npieces"] > 0)
    n_valid, n_obs = int(valid.sum()), int(nonempty.sum())
    if n_obs == 0:
        return None, None, None
    fit = {"launches": n_valid, "observed": n_obs,
           "traces": int((np.bincount(trace_no[nonempty], minlength=len(obs)) > 0).sum()),
           "groups": int((np.bincount(kd.group[nonempty], minlength=kd.U) > 0).sum())}
    sel = np.flatnonzero(nonempty)
    g = kd.group[sel]
    base = cat["base"][sel]
    O_s, O_e = cat["O_s"][sel], cat["O_e"][sel]
    I_s, I_e = cat["I_s"][sel], cat["I_e"][sel]
    nat = natural[sel]
    al_s, al_e = cat["alloc_s"][sel], cat["alloc_e"][sel]
    # launches whose records cover the whole allocation (up to the big pages lost records may hide)
    whole = (O_s <= al_s) & (O_e >= al_e) & _few_holes(kd, cat, sel, al_e - al_s)
    maxp = int(cat["npieces"][sel].max())
    region = shape = None
    tried_indexed = False   # fit_indexed already tried (an ugly linear formula asked it first)

    def strided():
        multi = sel[cat["npieces"][sel] >= 2]
        multi = multi[_clean_runs(kd, cat, multi, bigp)]
        both = np.union1d(multi, sel[cat["npieces"][sel] == 1])
        # a constant stride seen over a narrow range of sizes may really follow an argument; a
        # start known to its big page only may lie where the first chunk's page faulted
        for stride_terms, aligned in ((0, False), (1, False), (0, True), (1, True)):
            r = _fit_strided(kd, w, cat, both, kd.group[both], bigp, fit, shape=np.isin(both, multi),
                             stride_terms=stride_terms, aligned=aligned)
            if r is not None:
                ok = _verify(kd, r, cat, sel, bigp)
                fit["exact"] = round(float(ok.mean()), 6)
                fit["unexplained"] = int((~ok).sum())
                if fit["unexplained"] <= kd.allowed(len(sel), 2 * cat["npieces"][sel]):
                    return r
            fit.pop("evidence", None)
        return None

    # several runs in a launch: the chunks of a strided region, or big pages whose records were
    # all lost (holes: a strided fit that predicts no gap a big page wide is refused, `_verify`)
    if maxp > 1:
        region = strided()
    hull_ok = maxp == 1
    if region is None and maxp > 1:
        # one contiguous range over the runs (the hull), when the gaps inside are a sliver:
        # chunks that nearly always merge in fault data, or big pages whose records were lost
        # (but never for gathers)
        own, ps_, pe_ = _gather(kd, cat, sel, "O")
        covered = int((pe_ - ps_).sum())
        hull = int((O_e - O_s).sum())
        # or big pages without a record, as many as lost records explain (`_few_holes`)
        hull_ok = hull > 0 and (covered >= (1 - kd.params.hull_gaps) * hull
                                or bool(_few_holes(kd, cat, sel, O_e - O_s).all()))
    if region is None and hull_ok:
        s_lo, s_hi, e_lo, e_hi = range_bounds(kd, cat, sel, nat)
        if all(fe is None for fe in fences):  # shared big pages (other pointers) spoil the statistic
            s_lo, e_hi = _fault_statistics(kd, g, s_lo, s_hi, e_lo, e_hi, O_s, O_e, I_s, I_e, nat)
        res = _solve_pair(kd, g, [(s_lo, s_hi), (e_lo, e_hi)], hard={0: "hi", 1: "lo"})
        # the region's edges inside the faulting pages: offsets that follow arguments by less than a
        # big page (a row under a page at pos * row_bytes) show only in which page faulted
        f1 = (I_s >= 0) & (I_s // bigp == O_s // bigp) & ~nat
        f2 = (I_e >= 0) & ((I_e - 1) // bigp == (O_e - 1) // bigp) & ~nat
        s_lo_a = np.where(f1, np.maximum(s_lo, I_s * ps - base), s_lo)
        e_hi_a = np.where(f2, np.minimum(e_hi, I_e * ps - base), e_hi)
        if res is not None:
            vals_ = {n: kd.uniq[g, k] for k, n in enumerate(kd.sel_names)}
            one_ = np.ones(len(g), np.int64)
            inside = _within(res[0][0], vals_, one_, s_lo_a, s_hi) & _within(res[0][1], vals_, one_, e_lo, e_hi_a)
        if (res is None or (~inside).sum() > kd.allowed(len(g))) and \
                ((s_lo_a != s_lo).any() or (e_hi_a != e_hi).any()) and \
                _split_groups(kd, g, s_lo_a, s_hi) + _split_groups(kd, g, e_lo, e_hi_a) <= kd.allowed(len(g)):
            # the plain solution leaves its edges off the faulting pages: try one that does not
            res_a = _solve_pair(kd, g, [(s_lo_a, s_hi), (e_lo, e_hi_a)], hard={0: "hi", 1: "lo"}, max_terms=kd.params.aligned_terms)
            if res_a is not None and (res is None or res_a[0] != res[0]) and (
                    res is None or _aligned_odds(kd, g, res[0], res_a[0], base, O_s, O_e, I_s, I_e, f1, f2)
                    >= kd.params.odds_per_term):
                res = res_a
        guessed = False
        if res is not None:
            res = _likeliest(kd, g, res, [(s_lo, s_hi), (e_lo, e_hi)], base, O_s, O_e, f1, f2)
            if not nat.any():   # natural mode bounds ends by the allocation: no page to compare
                guess = _argument_backed(kd, g, res, e_lo, e_hi, base)
                guessed, res = guess is not res, guess
        if res is not None:
            (fs, fe), exact, unexplained = res
            if not fs.terms and not fe.terms and fe.const <= fs.const:
                fe = FM.Formula(fs.const + 1, ())  # an observed region is not empty
            cls = "fixed" if not fs.terms and not fe.terms else "linear"
            ugly = max([FM.odd(c) for c, _ in fs.terms + fe.terms] or [0]) > kd.params.simple_odd
            if cls == "linear" and ugly:
                # a coefficient no element size times dimensions gives (FitParams.simple_odd) is a
                # formula bent through lost records; where index values explain the launches, the
                # indexed template is the better-founded one (docs/template-model.md, "indexed")
                region = fit_indexed(kd, w, cat, sel, nat, fit, range_bounds(kd, cat, sel, nat))
                tried_indexed = True
            if region is None and not (cls == "linear" and ugly and _mostly(kd, whole)):
                region = Region(w.name, cls, start=fs, end=fe)
                fit["exact"] = exact
                fit["unexplained"] = unexplained
                fit["evidence"] = _evidence(kd, g, s_lo, s_hi, e_lo, e_hi)
                if maxp > 1:
                    fit["hull_of_runs"] = True
                if not nat.any():   # the kernel's own sizes may settle the end (fit_shapes)
                    shape = RangeEvidence(g, s_lo, s_hi, e_lo, e_hi, base, O_s, O_e, f2, guessed, whole,
                                          cat["alloc_eb"][sel] - base)
    if region is None and not tried_indexed:
        # pages chosen by index values another pointer's buffer holds (the trace's values table):
        # tried before `allocation`, which the fitting runs' values may happen to cover whole (a
        # gather over a small vector) while a larger run's do not
        region = fit_indexed(kd, w, cat, sel, nat, fit, range_bounds(kd, cat, sel, nat))
    if region is None and _mostly(kd, whole):
        region = Region(w.name, "allocation")
        fit["exact"] = round(float(whole.mean()), 6)
        fit["unexplained"] = int((~whole).sum())
    if region is None:
        region = Region(w.name, "irregular", history=_history(kd, obs, ps))
        fit["exact"] = 0.0
    region.fit = fit
    return region, sig, shape


def range_bounds(kd: KernelData, cat: dict, sel: np.ndarray, nat: np.ndarray):
    """Byte bounds, relative to the base pointer, of where a region's first byte and its end lie at
    launches `sel` (module doc): (s_lo, s_hi, e_lo, e_hi). The inner sides (s_hi, e_lo) are the
    pages the records show touched; in natural mode the outer ones are the allocation's edges."""
    ps, bigp = kd.ps, kd.bigp
    O_s, O_e, A_s, A_e = cat["O_s"][sel], cat["O_e"][sel], cat["A_s"][sel], cat["A_e"][sel]
    I_s, I_e, base = cat["I_s"][sel], cat["I_e"][sel], cat["base"][sel]
    sp_lo = np.where(nat, cat["alloc_s"][sel], A_s)
    sp_hi = np.minimum((O_s // bigp) * bigp + bigp - 1, O_e - 1)
    sp_hi = np.where(I_s >= 0, np.minimum(sp_hi, I_s), sp_hi)
    ep_lo = np.maximum(((O_e - 1) // bigp) * bigp + 1, O_s + 1)
    ep_lo = np.where(I_e >= 0, np.maximum(ep_lo, I_e), ep_lo)
    ep_hi = np.where(nat, cat["alloc_e"][sel], A_e)
    return sp_lo * ps - base, (sp_hi + 1) * ps - 1 - base, (ep_lo - 1) * ps + 1 - base, ep_hi * ps - base


def _mostly(kd: KernelData, ok: np.ndarray) -> bool:
    """All launches but the few lost records may leave unexplained."""
    return bool(len(ok)) and int((~ok).sum()) <= kd.allowed(len(ok))


def _few_holes(kd: KernelData, cat: dict, sel: np.ndarray, span: np.ndarray) -> np.ndarray:
    """Per launch: do the observed pieces cover `span` pages (their hull), but for big pages whose
    records lost records may have taken (no more of them over all launches than that loss hides)?"""
    own, s, e = _gather(kd, cat, sel, "O")
    covered = np.bincount(own, weights=(e - s).astype(np.float64), minlength=len(sel))
    holes = np.maximum(span - covered, 0) / kd.bigp
    if _holes_from_loss(kd, holes[holes > 0], span):
        return np.ones(len(sel), bool)
    return holes == 0


def _fault_statistics(kd: KernelData, g, s_lo, s_hi, e_lo, e_hi, O_s, O_e, I_s, I_e, nat):
    """Tighten the big-page-wide bounds with the fault records' statistics.

    Each touched big page faults once, at a page the launch touched there, chosen at
    random. Over many launches with equal features the faulting pages of the first and
    last big page cover the touched pages, so the region cannot end more than a few pages
    past the last faulting page seen (nor start much before the first). Applied to feature
    groups with >= stat_launches launches whose fault records reach into the region's last
    (first) big page, in full mode: a launch whose record there was lost does not count,
    and does not stop the others from counting.
    """
    P = kd.params
    U, ps, bigp = kd.U, kd.ps, kd.bigp
    at_end = (I_e >= 0) & ((I_e - 1) // bigp == (O_e - 1) // bigp) & ~nat
    at_start = (I_s >= 0) & (I_s // bigp == O_s // bigp) & ~nat
    n_end = np.bincount(g, weights=at_end.astype(np.float64), minlength=U)
    n_start = np.bincount(g, weights=at_start.astype(np.float64), minlength=U)
    if not ((n_end >= P.stat_launches).any() or (n_start >= P.stat_launches).any()):
        return s_lo, e_hi
    lo_e = np.full(U, -FM.INF, np.int64)
    np.maximum.at(lo_e, g, e_lo)
    hi_s = np.full(U, FM.INF, np.int64)
    np.minimum.at(hi_s, g, s_hi)
    me, ms = (n_end >= P.stat_launches)[g], (n_start >= P.stat_launches)[g]
    e_hi = np.where(me, np.minimum(e_hi, lo_e[g] + P.stat_slack_pages * ps), e_hi)
    s_lo = np.where(ms, np.maximum(s_lo, hi_s[g] - P.stat_slack_pages * ps), s_lo)
    return s_lo, e_hi


def _history(kd: KernelData, obs: list[dict], ps: int) -> list[list[int]]:
    """Pages an irregular region touched, relative to its allocation's first page (coarsened)."""
    ss, ee = [], []
    for (o, idx, _, _), ob in zip(kd.parts, obs):
        n = ob["npieces"]
        ri = _ranges(ob["r0"], n)
        if len(ri) == 0:
            continue
        rel0 = np.repeat(ob["alloc_s"], n)
        ss.append(np.maximum(o.os[ri], np.repeat(ob["lo_f"], n)) - rel0)
        ee.append(np.minimum(o.oe[ri], np.repeat(ob["hi_f"], n)) - rel0)
    if not ss:
        return []
    s, e = np.concatenate(ss), np.concatenate(ee)
    _, s, e = merge_intervals(np.zeros(len(s), np.int64), s, e, 1)
    s, e = coarsen_intervals(s, e, kd.params.history_intervals)
    return [[int(a), int(b)] for a, b in zip(s, e)]
