"""Learn per-kernel templates from fault traces (never from truth).

For every kernel, for every base word (an 8-byte parameter word that points
into a live allocation), the pages observed in that allocation at each launch
give bounds on where the region starts and ends:

- start page in [A_s, min(first fault page, end of the first big page)]
- end page in [max(last fault page + 1, start of the last big page + 1), A_e]

where the observed run [O_s, O_e) is rounded out to 64 KiB big pages by the
driver, and A extends it with the driver's prefetch migrations (pages that may
have been touched without faulting). Relative to the base pointer these are
byte intervals; launches with equal features are intersected into one group.
`formula.solve` then finds the simplest integer formula inside every group's
interval. Several traces are pooled: a template must hold in all of them.
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict

import numpy as np

from pagecast import PRODUCER
from pagecast import trace as T
from pagecast.errors import TraceError, UsageError

from . import formula as FM
from .features import (GRID_NAMES, MAX_FEATURE, Word, candidate_words, factorize_rows, grid_matrix, layouts,
                       param_matrix)
from .fit_params import FitParams, trace_loss
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
        for name, idx in zip(o.names, o.groups):
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
        import pyarrow as pa
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
    any_obs = False
    fences = _fences(kd)
    for (w, vals), fe in zip(kd.bases, fences):
        r, sig = fit_region(kd, w, vals, fe)
        if r is None:
            continue
        any_obs = True
        regions.append((sig, r))
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
    rank = {"fixed": 0, "linear": 1, "strided": 2, "allocation": 3, "irregular": 4}[r.cls]
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
    """Fit one base word's region; (None, None) when it never points at observed pages."""
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
        return None, None
    fit = {"launches": n_valid, "observed": n_obs,
           "traces": int((np.bincount(trace_no[nonempty], minlength=len(obs)) > 0).sum()),
           "groups": int((np.bincount(kd.group[nonempty], minlength=kd.U) > 0).sum())}
    sel = np.flatnonzero(nonempty)
    g = kd.group[sel]
    base = cat["base"][sel]
    O_s, O_e, A_s, A_e = cat["O_s"][sel], cat["O_e"][sel], cat["A_s"][sel], cat["A_e"][sel]
    I_s, I_e = cat["I_s"][sel], cat["I_e"][sel]
    nat = natural[sel]
    al_s, al_e = cat["alloc_s"][sel], cat["alloc_e"][sel]
    # launches whose records cover the whole allocation (up to the big pages lost records may hide)
    whole = (O_s <= al_s) & (O_e >= al_e) & _few_holes(kd, cat, sel, al_e - al_s)
    maxp = int(cat["npieces"][sel].max())
    region = None

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
        hull_ok = hull > 0 and covered >= (1 - kd.params.hull_gaps) * hull
    if region is None and hull_ok:
        sp_lo = np.where(nat, al_s, A_s)
        sp_hi = np.minimum((O_s // bigp) * bigp + bigp - 1, O_e - 1)
        sp_hi = np.where(I_s >= 0, np.minimum(sp_hi, I_s), sp_hi)
        ep_lo = np.maximum(((O_e - 1) // bigp) * bigp + 1, O_s + 1)
        ep_lo = np.where(I_e >= 0, np.maximum(ep_lo, I_e), ep_lo)
        ep_hi = np.where(nat, al_e, A_e)
        s_lo, s_hi = sp_lo * ps - base, (sp_hi + 1) * ps - 1 - base
        e_lo, e_hi = (ep_lo - 1) * ps + 1 - base, ep_hi * ps - base
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
        if res is not None:
            res = _likeliest(kd, g, res, [(s_lo, s_hi), (e_lo, e_hi)], base, O_s, O_e, f1, f2)
            res = _argument_backed(kd, g, res, e_lo, e_hi, base)
        if res is not None:
            (fs, fe), exact, unexplained = res
            if not fs.terms and not fe.terms and fe.const <= fs.const:
                fe = FM.Formula(fs.const + 1, ())  # an observed region is not empty
            cls = "fixed" if not fs.terms and not fe.terms else "linear"
            ugly = max([FM.odd(c) for c, _ in fs.terms + fe.terms] or [0]) > kd.params.simple_odd
            if not (cls == "linear" and ugly and _mostly(kd, whole)):
                region = Region(w.name, cls, start=fs, end=fe)
                fit["exact"] = exact
                fit["unexplained"] = unexplained
                fit["evidence"] = _evidence(kd, g, s_lo, s_hi, e_lo, e_hi)
                if maxp > 1:
                    fit["hull_of_runs"] = True
    if region is None and _mostly(kd, whole):
        region = Region(w.name, "allocation")
        fit["exact"] = round(float(whole.mean()), 6)
        fit["unexplained"] = int((~whole).sum())
    if region is None:
        region = Region(w.name, "irregular", history=_history(kd, obs, ps))
        fit["exact"] = 0.0
    region.fit = fit
    return region, sig


def _region_pages_in(kd: KernelData, g, fs, fe, base, big0):
    """Pages of the region [base + fs, base + fe) inside the big page starting at page big0, per launch."""
    vals = {n: kd.uniq[g, k] for k, n in enumerate(kd.sel_names)}
    one = np.ones(len(g), np.int64)
    sp = (base + np.asarray(fs.evaluate(vals), np.int64) * one) // kd.ps
    ep = -(-(base + np.asarray(fe.evaluate(vals), np.int64) * one) // kd.ps)
    return np.maximum(np.minimum(ep, big0 + kd.bigp) - np.maximum(sp, big0), 0)


def _aligned_odds(kd: KernelData, g, plain, aligned, base, O_s, O_e, I_s, I_e, f1, f2) -> float:
    """How much likelier the launches' fault pages are under the `aligned` (start, end) formulas than
    under the `plain` ones.

    Each touched big page faults once, at a touched page drawn at random (background.md), so a
    template that puts m of its pages into the big page holding a fault record explains the
    fault's page with probability 1/m. A formula that puts a region's first (last) page exactly
    on the faulting page at every launch, where the simpler one spreads it over many pages,
    explains the faults far better: the odds multiply over launches (first and last big page)."""
    b1 = (O_s // kd.bigp) * kd.bigp
    b2 = ((O_e - 1) // kd.bigp) * kd.bigp
    two = f2 & (b2 != b1)
    logs = np.zeros(len(g))
    for big0, has in ((b1, f1), (b2, two)):
        mp = _region_pages_in(kd, g, plain[0], plain[1], base, big0)
        ma = _region_pages_in(kd, g, aligned[0], aligned[1], base, big0)
        use = has & (mp > 0) & (ma > 0)
        logs += np.where(use, np.log(np.maximum(mp, 1)) - np.log(np.maximum(ma, 1)), 0.0)
    return float(np.exp(min(logs.sum(), 700.0)))


def _likeliest(kd: KernelData, g, res, bounds, base, O_s, O_e, f1, f2):
    """Among formulas that explain as many launches, the one under which the fault pages are
    likeliest, within reason.

    Each touched big page faults at a touched page drawn at random, so a formula that puts m of
    its pages into the first (last) big page explains that big page's fault with probability
    1/m. Of equally simple formulas that hold, the likeliest wins: the one that does not spread
    the region over pages no fault ever landed on (`4*M*K` for an M-row slice, not `128*K` for
    a buffer sized for 32 rows). A constant loses to one term of an argument only when the
    faults are `odds_per_term` times likelier under the term (an 11-page constant against the
    one page of a 1-row slice at every launch): fewer terms otherwise."""
    (fs, fe), exact, unexplained = res
    vals = {n: kd.uniq[g, k] for k, n in enumerate(kd.sel_names)}
    one = np.ones(len(g), np.int64)
    b1 = (O_s // kd.bigp) * kd.bigp
    b2 = ((O_e - 1) // kd.bigp) * kd.bigp
    out = [fs, fe]
    for q, (big0, has) in enumerate(((b1, f1), (b2, f2))):
        f = out[q]
        if not has.any() or f.n_terms > 1:
            continue
        lo, hi = bounds[q]
        groups, lo_g, hi_g, w = _group_bounds(g, lo, hi, kd.U)
        if len(groups) > kd.params.max_search_groups:
            continue
        ok0 = _within(f, vals, one, lo, hi).sum()

        def loglik(c):
            trial = [c, out[1]] if q == 0 else [out[0], c]
            m = _region_pages_in(kd, g, trial[0], trial[1], base, big0)
            return -float(np.log(np.maximum(m[has & (m > 0)], 1)).sum())

        best, best_ll = f, loglik(f)
        mono = kd.mono(groups)
        for terms in sorted({f.n_terms, 1}):
            for c in FM.solve(mono, lo_g, hi_g, w, 0.0, max_terms=terms, min_terms=terms, candidates=True):
                if c == f or _within(c, vals, one, lo, hi).sum() < ok0:
                    continue
                if terms == f.n_terms and c.score()[:3] != f.score()[:3]:
                    continue
                ll = loglik(c)
                need = 0.0 if terms == best.n_terms else np.log(kd.params.odds_per_term)
                if ll > best_ll + need + 1e-9:
                    best, best_ll = c, ll
        out[q] = best
    return (out[0], out[1]), exact, unexplained


def _within(f, vals, one, lo, hi) -> np.ndarray:
    y = np.asarray(f.evaluate(vals), np.int64) * one
    return (y >= lo) & (y <= hi)


def _argument_backed(kd: KernelData, g, res, e_lo, e_hi, base):
    """Where the faults cannot separate a constant end from one an argument explains, prefer the
    argument (docs/template-model.md, "When faults cannot separate fixed from an argument").

    A region under a page at every fitting launch shows one faulting page whatever its size, so
    a constant end and `c * m` (m a product with a varying argument, no constant: a size that
    grows with the argument) both hold at every launch and predict the same pages there. The
    constant would miss every page past it once the argument grows; `c * m`, with the smallest
    simple coefficient that holds at every launch, predicts the fewest pages that still grow
    with the argument, and fault feedback raises the coefficient from the misses of a larger
    run (it sees misses, never over-prediction, so erring small is the side it can repair)."""
    (fs, fe), exact, unexplained = res
    if fe.terms or fs.terms:
        return res
    groups, lo_g, hi_g, w = _group_bounds(g, e_lo, e_hi, kd.U)
    mono = kd.mono(groups)
    best = None
    for j, names in enumerate(mono.names):
        col = mono.values[:, j]
        if not any(kd.sel_varying[kd.sel_names.index(nm)] for nm in names) or (col <= 0).any():
            continue
        c = int(max(1, (-(-lo_g // col)).max()))                  # the smallest c with c*m >= lo
        c = _simple_at_least(c, kd.params.simple_odd)
        if c is None or (c * col > hi_g).any():
            continue
        f = FM.Formula(0, ((c, names),))
        # a size proportional to one argument before a product of several, then the simplest
        if best is None or (len(names), f.score()) < (len(best.terms[0][1]), best.score()):
            best = f
    if best is None:
        return res
    vals = {nm: kd.uniq[g, k] for k, nm in enumerate(kd.sel_names)}
    y = np.asarray(best.evaluate(vals), np.int64) * np.ones(len(g), np.int64)
    same = (-(-(base + y) // kd.ps)) == (-(-(base + fe.const) // kd.ps))
    if not ((y >= e_lo) & (y <= e_hi)).all() or not same.all():
        return res
    return (fs, best), exact, unexplained


def _simple_at_least(c: int, simple_odd: int) -> int | None:
    """The smallest o * 2**k >= c with o odd and at most simple_odd."""
    best = None
    for o in range(1, simple_odd + 1, 2):
        k = max(0, int(np.ceil(np.log2(max(c / o, 1)))))
        while o << k < c:
            k += 1
        v = o << k
        if best is None or v < best:
            best = v
    return best


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


def _holes_from_loss(kd: KernelData, holes: np.ndarray, pages: np.ndarray) -> bool:
    """Could lost records have hidden these `holes` (big pages, one entry per launch that has some)
    among launches predicted to touch `pages` pages in all? Counted over all the launches: loss
    hides few big pages, at random, not one in every launch."""
    if not len(holes):
        return True
    if float(holes.max()) > kd.params.allowed_holes(int(np.ceil(pages.max() / kd.bigp)), kd.loss):
        return False
    total_bp = int(np.ceil(float(np.sum(pages)) / kd.bigp))
    return float(holes.sum()) <= kd.params.allowed_holes(total_bp, kd.loss)


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


def _evidence(kd: KernelData, g, s_lo, s_hi, e_lo, e_hi, limit: int = 64) -> dict:
    """Up to `limit` feature groups with their start/end byte bounds, kept for fault feedback."""
    groups, sl, sh, w = _group_bounds(g, s_lo, s_hi, kd.U)
    _, el, eh, _ = _group_bounds(g, e_lo, e_hi, kd.U)
    pick = np.unique(np.linspace(0, len(groups) - 1, min(limit, len(groups))).round().astype(np.int64))
    rows = [[int(x) for x in kd.uniq[groups[i]]] + [int(sl[i]), int(sh[i]), int(el[i]), int(eh[i]), int(w[i])]
            for i in pick]
    return {"features": list(kd.sel_names), "rows": rows}


def _group_bounds(g: np.ndarray, lo: np.ndarray, hi: np.ndarray, U: int):
    """Per feature group, the interval most of its launches' bounds agree on:
    (groups present, lo, hi, launches).

    Launches with equal features touch the same offsets, so their bounds intersect. Lost
    records make a launch's bounds too tight (a missing migration hides a touched big page at
    the region's edge), and one such launch would empty the intersection: observations are
    evidence, not constraints. Where the intersection is empty, the group takes the interval
    covered by the most launches' bounds (a sweep over their ends); the launches outside it
    are the ones a template will leave unexplained."""
    lo_g = np.full(U, -FM.INF, np.int64)
    hi_g = np.full(U, FM.INF, np.int64)
    np.maximum.at(lo_g, g, lo)
    np.minimum.at(hi_g, g, hi)
    cnt = np.bincount(g, minlength=U)
    bad = (lo_g > hi_g) & (cnt > 0)
    if bad.any():
        m = bad[g] & (lo <= hi)              # a launch whose own bounds are empty agrees with none
        gl, ll, hl = g[m], lo[m], hi[m]
        one = np.ones(len(gl), np.int64)
        pos = np.concatenate([ll, hl + 1])
        d = np.concatenate([one, -one])
        gg = np.concatenate([gl, gl])
        o = np.lexsort((d, pos, gg))         # per group, by position, ends before starts
        pos, d, gg = pos[o], d[o], gg[o]
        cov = np.cumsum(d)                   # every group's events sum to 0: a running count
        best = np.zeros(U, np.int64)
        np.maximum.at(best, gg, cov)
        top = np.flatnonzero((cov == best[gg]) & (d > 0))
        grp, first = np.unique(gg[top], return_index=True)
        k = top[first]
        lo_g[grp] = pos[k]
        hi_g[grp] = pos[k + 1] - 1
    present = np.flatnonzero(cnt > 0)
    return present, lo_g[present], hi_g[present], cnt[present].astype(np.float64)


def _split_groups(kd: KernelData, g, lo, hi) -> int:
    """Launches in feature groups whose bounds do not intersect (equal features, different answers:
    no formula of the features holds there)."""
    lo_g = np.full(kd.U, -FM.INF, np.int64)
    hi_g = np.full(kd.U, FM.INF, np.int64)
    np.maximum.at(lo_g, g, lo)
    np.minimum.at(hi_g, g, hi)
    return int(np.bincount(g, minlength=kd.U)[lo_g > hi_g].sum())


def _launch_bounds(g: np.ndarray, lo: np.ndarray, hi: np.ndarray):
    """Each launch's (group, lo, hi), equal ones merged: (groups, lo, hi, launches)."""
    from .features import factorize_rows
    u, inv = factorize_rows(np.stack([g, lo, hi], axis=1))
    return u[:, 0], u[:, 1], u[:, 2], np.bincount(inv, minlength=len(u)).astype(np.float64)


def _solve_one(kd: KernelData, groups, lo, hi, w, budget: float, mode="tight", max_terms: int = 3,
               min_terms: int = 0, hard: str | None = None):
    """Solve on a subsample of groups, verify on all, add violators and repeat."""
    U = len(groups)
    cap = kd.params.max_search_groups
    if U <= cap:
        sample = np.arange(U)
    else:
        # the extremes of every feature plus an even spread
        ext = set(np.linspace(0, U - 1, cap // 2).round().astype(int).tolist())
        u = kd.uniq[groups]
        for k in range(u.shape[1]):
            ext.add(int(np.argmin(u[:, k])))
            ext.add(int(np.argmax(u[:, k])))
        sample = np.array(sorted(ext))
    for _ in range(4):
        mono = kd.mono(groups[sample])
        f = FM.solve(mono, lo[sample], hi[sample], w[sample], budget * w[sample].sum(), mode=mode,
                     max_terms=max_terms, min_terms=min_terms, hard=hard)
        if f is None:
            return None
        if len(sample) == U:
            return f
        vals = {n: kd.uniq[groups, k] for k, n in enumerate(kd.sel_names)}
        y = np.asarray(f.evaluate(vals), np.int64) * np.ones(U, np.int64)
        bad = (y < lo) | (y > hi)
        if w[bad].sum() <= budget * w.sum() and not (hard == "lo" and (y < lo).any()) \
                and not (hard == "hi" and (y > hi).any()):
            return f
        sample = np.union1d(sample, np.flatnonzero(bad)[:cap])
    return None


def _solve_pair(kd, g, bounds, modes=None, budgets=None, max_terms: int = 3, min_terms=None, hard=None,
                edges=2):
    """Fit several quantities (start, end, ...) on the same launches: the simplest formulas that
    explain all launches but those lost records may have contradicted.

    Each quantity's formula is solved over its feature groups' bounds (`_group_bounds`): once
    inside every group (strict), and once with the groups of a share of the launches allowed
    outside (robust: `KernelData.allowed`, plus each extra budget for passes that leave launches
    to a later check). `hard[q]` ("lo" or "hi") names the side of quantity q's bounds that is
    positive evidence (the region reaches at least the pages the records show touched): the
    robust pass never violates it, since lost records only hide pages. The robust solution wins
    where it is simpler than the strict one: one launch that lost a record must not bend the
    formula (a stride of 128*n - 1 to avoid it). Returns ((formulas...), share explained,
    launches unexplained) or None."""
    n = len(g)
    allowed = kd.allowed(n, edges)
    hard = hard or {}
    vals = {nm: kd.uniq[g, k] for k, nm in enumerate(kd.sel_names)}
    found = []
    for i, budget in enumerate((0.0, *(budgets or (0.0,)))):
        strict = i == 0
        share = 0.0 if strict else budget + allowed / max(n, 1)
        if not strict and share <= 0:
            continue
        out = []
        ok = np.ones(n, bool)
        for q, (lo, hi) in enumerate(bounds):
            # strict: one interval per feature group; robust: every launch's own bounds (equal ones
            # merged), so that the budget counts launches, not the groups one of them spoiled
            groups, lo_g, hi_g, w = _group_bounds(g, lo, hi, kd.U) if strict else _launch_bounds(g, lo, hi)
            # a robust solution wins only by being simpler: no more terms than the strict one's
            mt = max_terms if strict or not found else min(max_terms, found[0][1][q].n_terms)
            f = _solve_one(kd, groups, lo_g, hi_g, w, share, (modes or {}).get(q, "tight"), mt,
                           (min_terms or {}).get(q, 0), hard.get(q))
            if f is None:
                break
            out.append(f)
            y = np.asarray(f.evaluate(vals), np.int64) * np.ones(n, np.int64)
            ok &= (y >= lo) & (y <= hi)
        else:
            bad = int(n - ok.sum())
            if bad <= int(budget * n) + allowed:
                found.append((tuple(map(sum, zip(*(f.score() for f in out)))), out, ok, strict))
                if not strict:
                    break
    if not found:
        return None
    # the simplest (fewest terms, then simplest coefficients); on a tie the strict solution
    _, out, ok, _ = min(found, key=lambda t: (t[0], not t[3]))
    return out, round(float(ok.mean()) if n else 1.0, 6), int(n - ok.sum())


def _fit_strided(kd: KernelData, w: Word, cat: dict, sel: np.ndarray, g: np.ndarray, bigp: int, fit: dict,
                 shape: np.ndarray | None = None, stride_terms: int = 0, aligned: bool = False):
    """count chunks of chunk bytes every stride bytes: each of the four an integer formula."""
    if len(sel) == 0:
        return None
    from pagecast.footprints import _ranges  # noqa: PLC2701 - the CSR helper of the core
    ps = kd.ps
    parts_obs = []
    # gather the runs of each selected launch from its trace's observation arrays
    offsets = np.cumsum([0] + [len(idx) for _, idx, _, _ in kd.parts])
    starts_l, ends_l, owner, ff_l, fl_l = [], [], [], [], []
    for ti, (o, idx, _, _) in enumerate(kd.parts):
        m = (sel >= offsets[ti]) & (sel < offsets[ti + 1])
        s = sel[m]
        r0 = cat["r0"][s]
        n = cat["npieces"][s]
        ri = _ranges(r0, n)
        rs_ = np.maximum(o.os[ri], np.repeat(cat["lo_f"][s], n))
        re_c = np.minimum(o.oe[ri], np.repeat(cat["hi_f"][s], n))
        starts_l.append(rs_)
        ends_l.append(re_c)
        ff, fl = o.fault_bounds(np.repeat(cat["key"][s], n), rs_, re_c)
        ff_l.append(ff)
        fl_l.append(fl)
        owner.append(np.repeat(np.flatnonzero(m), n))
        parts_obs.append(None)
    rs = np.concatenate(starts_l)
    re_ = np.concatenate(ends_l)
    own = np.concatenate(owner)            # index into sel
    ffirst, flast = np.concatenate(ff_l), np.concatenate(fl_l)
    cnt = cat["npieces"][sel]
    first = np.concatenate([[0], np.cumsum(cnt)[:-1]])
    j = np.arange(len(rs)) - np.repeat(first, cnt)
    base = cat["base"][sel]
    slo_r = rs * ps                                   # run start byte bounds (absolute)
    shi_r = ((rs // bigp) * bigp + bigp) * ps - 1
    shi_r = np.minimum(shi_r, re_ * ps - 1)
    shi_r = np.where(ffirst >= 0, np.minimum(shi_r, (ffirst + 1) * ps - 1), shi_r)
    elo_r = (np.maximum(((re_ - 1) // bigp) * bigp + 1, rs + 1) - 1) * ps + 1
    elo_r = np.where(flast >= 0, np.maximum(elo_r, (flast - 1) * ps + 1), elo_r)
    ehi_r = re_ * ps
    s0_lo, s0_hi = slo_r[first], shi_r[first]
    if aligned:
        # the first chunk starts inside its first faulting page (a chunk under a page at an
        # offset that follows an argument by less than a big page shows only there)
        ff0 = ffirst[first]
        s0_lo = np.where((ff0 >= 0) & (ff0 // bigp == rs[first] // bigp), np.maximum(s0_lo, ff0 * ps), s0_lo)
    n = len(sel)
    # stride from chunk j's start vs chunk 0's
    # (and from chunk j's end vs chunk 0's: equal chunks end one stride apart too; the two
    # bounds together pin strides that starts known to a big page leave loose)
    e0_lo, e0_hi = elo_r[first], ehi_r[first]
    with np.errstate(divide="ignore", invalid="ignore"):
        jj = np.maximum(j, 1)
        st_lo_r = np.where(j > 0, np.maximum(-((-(slo_r - s0_hi[own])) // jj), -((-(elo_r - e0_hi[own])) // jj)),
                           -FM.INF)
        st_hi_r = np.where(j > 0, np.minimum((shi_r - s0_lo[own]) // jj, (ehi_r - e0_lo[own]) // jj), FM.INF)
    st_lo = np.full(n, -FM.INF, np.int64)
    st_hi = np.full(n, FM.INF, np.int64)
    np.maximum.at(st_lo, own, st_lo_r)
    np.minimum.at(st_hi, own, st_hi_r)
    ch_lo = np.full(n, -FM.INF, np.int64)
    ch_hi = np.full(n, FM.INF, np.int64)
    np.maximum.at(ch_lo, own, elo_r - shi_r)
    np.minimum.at(ch_hi, own, ehi_r - slo_r)
    # Chunks closer than a big page merge in fault data: such launches show fewer, longer
    # runs. The count is fitted first (exactly if it can be, else as a lower bound: runs
    # only ever merge), then start, stride and chunk on the launches whose runs are the
    # chunks; _verify finally checks every launch against the big-page-rounded prediction.
    c64 = cnt.astype(np.int64)
    bud = (0.0, 0.0, kd.params.strided_budget)
    # `shape`: launches that may decide count, start and stride (multi-run ones); the others
    # (a single run: one chunk, or all chunks merged) only bound the chunk
    shape = np.ones(n, bool) if shape is None else shape
    sh = np.flatnonzero(shape)
    if len(sh) == 0:
        return None
    ed = 2 * c64                                     # each run seen has two edges lost records may hide
    rc = (_solve_pair(kd, g[sh], [(c64[sh], c64[sh])], budgets=bud, max_terms=1, edges=ed[sh])
          or _count_argument(kd, g[sh], c64[sh])
          or _solve_pair(kd, g[sh], [(c64[sh], np.full(len(sh), FM.INF, np.int64))], max_terms=1, edges=ed[sh]))
    if rc is None:
        return None
    (fc,), exact, _ = rc
    vals = {nm: kd.uniq[g, k] for k, nm in enumerate(kd.sel_names)}
    one = np.ones(len(g), np.int64)
    pc_ = np.asarray(fc.evaluate(vals), np.int64) * one
    whole = np.flatnonzero((pc_ == cnt) & shape)
    if len(whole) == 0:
        return None
    gw = g[whole]
    bounds = [((s0_lo - base)[whole], (s0_hi - base)[whole]), (st_lo[whole], st_hi[whole])]
    # a constant stride is most likely a product of constant arguments (max_seq * head_dim * 2)
    const = [k for k in range(kd.uniq.shape[1]) if len(np.unique(kd.uniq[:, k])) == 1 and kd.uniq[0, k] > 1]
    hints = sorted({int(np.prod([kd.uniq[0, k] for k in combo]))
                    for d in (1, 2, 3) for combo in itertools.combinations(const, d)})
    rmode = ("round", tuple(hints))
    mt = {1: stride_terms}
    smode = {1: rmode}
    res = (_solve_pair(kd, gw, bounds, smode, budgets=bud, max_terms=1, min_terms=mt, edges=ed[whole])
           or _solve_pair(kd, gw, bounds, smode, min_terms=mt, edges=ed[whole]))
    if res is None:
        return None
    (fs, fst), exact1, _ = res
    exact = min(exact, exact1)
    # chunk: bounded by each run's end against where the formulas put its start
    s0 = base + np.asarray(fs.evaluate(vals), np.int64) * one
    sd = np.asarray(fst.evaluate(vals), np.int64) * one
    # a launch whose chunks all merged into one run still bounds the chunk by its end:
    # run end = start + (count - 1) * stride + chunk
    merged = (cnt == 1) & (pc_ > 1)
    jj = np.where(merged[own], pc_[own] - 1, j)
    pstart = s0[own] + jj * sd[own]
    ch_lo = np.full(n, -FM.INF, np.int64)
    ch_hi = np.full(n, FM.INF, np.int64)
    np.maximum.at(ch_lo, own, elo_r - pstart)
    np.minimum.at(ch_hi, own, ehi_r - pstart)
    whole = np.flatnonzero((pc_ == cnt) | merged)
    gb, lo_b, hi_b = g[whole], np.maximum(ch_lo, 1)[whole], ch_hi[whole]
    res2 = (_solve_pair(kd, gb, [(lo_b, hi_b)], budgets=bud, max_terms=1, edges=ed[whole])
            or _solve_pair(kd, gb, [(lo_b, hi_b)], edges=ed[whole]))
    if res2 is None:
        return None
    (fch,), exact2, _ = res2
    exact = min(exact, exact2)
    if not fc.terms and fc.const == 1:
        return None
    fit["exact"] = exact
    # the chunk's per-group byte bounds, kept for fault feedback (a chunk that outgrows a page)
    fit["evidence"] = _evidence(kd, gb, lo_b, hi_b, lo_b, hi_b)
    fit["evidence"]["of"] = "chunk"
    return Region(w.name, "strided", start=fs, count=fc, chunk=fch, stride=fst)


def _count_argument(kd: KernelData, g: np.ndarray, runs: np.ndarray):
    """A count that is one argument: never below the runs seen (runs only merge) and equal to
    them in most launches. ((formula,), exact, launches where they differ) or None."""
    best = None
    for k, name in enumerate(kd.sel_names):
        v = kd.uniq[g, k]
        if not kd.sel_varying[k] or np.any(v < runs) or np.any(v > 1 << 16):
            continue
        agree = float(np.mean(v == runs))
        if agree >= 0.5 and (best is None or agree > best[0]):
            best = (agree, name)
    if best is None:
        return None
    return (FM.Formula(0, ((1, (best[1],)),)),), round(best[0], 6), int(round((1 - best[0]) * len(runs)))


def _clean_runs(kd: KernelData, cat: dict, sel: np.ndarray, bigp: int) -> np.ndarray:
    """Launches whose runs look like whole chunks: equal lengths and equal gaps (within 2 big pages).

    Chunks closer than a big page merge in fault data; where only some of them merged, the
    run count is not the chunk count, so those launches are left to the verification step.
    """
    if len(sel) == 0:
        return np.zeros(0, bool)
    own, s, e = _gather(kd, cat, sel, "O")
    n = len(sel)
    ln = e - s
    big = np.int64(1) << np.int64(62)
    mn = np.full(n, big, np.int64)
    mx = np.full(n, -big, np.int64)
    np.minimum.at(mn, own, ln)
    np.maximum.at(mx, own, ln)
    ok = (mx - mn) <= 2 * bigp
    same = np.r_[False, own[1:] == own[:-1]]
    gap = np.where(same, s - np.r_[0, s[:-1]], 0)
    gmn = np.full(n, big, np.int64)
    gmx = np.full(n, -big, np.int64)
    np.minimum.at(gmn, own[same], gap[same])
    np.maximum.at(gmx, own[same], gap[same])
    return ok & ((gmx - gmn) <= 2 * bigp)


def _gather(kd: KernelData, cat: dict, sel: np.ndarray, which: str):
    """(owner index into sel, start, end) of the O (observed) or A (observed + prefetched) pieces."""
    from pagecast.footprints import _ranges  # noqa: PLC2701
    offsets = np.cumsum([0] + [len(idx) for _, idx, _, _ in kd.parts])
    own, ss, ee = [], [], []
    for ti, (o, _, _, _) in enumerate(kd.parts):
        m = np.flatnonzero((sel >= offsets[ti]) & (sel < offsets[ti + 1]))
        s = sel[m]
        if which == "O":
            r0, n, S, E = cat["r0"][s], cat["npieces"][s], o.os, o.oe
        else:
            r0, n, S, E = cat["q0"][s], cat["a_pieces"][s], o.as_, o.ae
        ri = _ranges(r0, n)
        own.append(np.repeat(m, n))
        ss.append(np.maximum(S[ri], np.repeat(cat["lo_f"][s], n)))
        ee.append(np.minimum(E[ri], np.repeat(cat["hi_f"][s], n)))
    return np.concatenate(own), np.concatenate(ss), np.concatenate(ee)


def _verify(kd: KernelData, region: Region, cat: dict, sel: np.ndarray, bigp: int) -> np.ndarray:
    """Per launch: do the predicted pages, rounded out to big pages, cover O and stay inside A?"""
    from pagecast.footprints import Footprints, intersection_pages
    from .predictor import region_bytes
    ps = kd.ps
    g = kd.group[sel]
    vals = {n: kd.uniq[g, k] for k, n in enumerate(kd.sel_names)}
    one = np.ones(len(sel), np.int64)
    base = cat["base"][sel]
    if region.cls == "strided":
        st, cnt, ch, sd = (np.asarray(x, np.int64) * one for x in region_bytes(region, vals, base))
        cnt = np.clip(cnt, 0, 1 << 16)
        rep = np.repeat(np.arange(len(sel)), cnt)
        j = np.arange(len(rep)) - np.repeat(np.cumsum(cnt) - cnt, cnt)
        sb = st[rep] + j * sd[rep]
        eb = sb + ch[rep]
    else:
        sb, eb = (np.asarray(x, np.int64) * one for x in region_bytes(region, vals, base))
        rep = np.arange(len(sel))
    a_s, a_e = cat["alloc_s"][sel][rep], cat["alloc_e"][sel][rep]
    sp = np.maximum((sb // ps) // bigp * bigp, a_s)
    ep = np.minimum(-(-(-((-eb) // ps)) // bigp) * bigp, a_e)
    n = len(sel)
    P = Footprints.from_intervals(rep, sp, ep, n, ps)
    O = Footprints.from_intervals(*_gather(kd, cat, sel, "O"), n, ps)
    A = Footprints.from_intervals(*_gather(kd, cat, sel, "A"), n, ps)
    # the prediction must hold every page the records show touched, and may reach past what
    # they show only by the big pages whose records lost records may have taken with them
    pp = P.pages_per_launch()
    outside = (pp - intersection_pages(P, A)) / bigp
    covers = intersection_pages(P, O) == O.pages_per_launch()
    ok = covers & (outside == 0)
    if _holes_from_loss(kd, outside[covers & ~ok], pp[covers]):
        ok = covers
    if region.cls == "strided" and not (np.diff(P.indptr) >= 2).any():
        # no launch would show a gap between its chunks (each big-page wide gap would): the
        # runs it was fitted to were holes lost records left, and the region is one range
        ok[:] = False
    return ok


def _history(kd: KernelData, obs: list[dict], ps: int) -> list[list[int]]:
    """Pages an irregular region touched, relative to its allocation's first page (coarsened)."""
    from pagecast.footprints import _ranges, coarsen_intervals, merge_intervals  # noqa: PLC2701
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
