"""Learn per-kernel templates from fault traces (never from truth): the model and each kernel.

For every kernel, for every base word (an 8-byte parameter word that points
into a live allocation), the pages observed in that allocation at each launch
give bounds on where the region starts and ends:

- start page in [A_s, min(first fault page, end of the first big page)]
- end page in [max(last fault page + 1, start of the last big page + 1), A_e]

where O (the big pages the records show touched, `observe.TraceObs`) holds [O_s, O_e)
and A extends it with the pages that may have been touched (the driver's prefetch
migrations, big pages allocations share). The inner sides are positive evidence; the
outer ones only say that nothing was seen, which lost records fake. Relative to the base
pointer these are byte intervals; launches with equal features form groups (`data.KernelData`),
`region.fit_region` runs the template classes in order, `solve` finds the simplest integer
formulas that hold for all launches but those lost records explain (`params.FitParams`),
`likelihood` chooses among formulas that hold by where the faults landed, `strided` and
`index_values` fit chunked regions, `shapes` settles ends the records leave open. Several traces are
pooled: a template must hold in all of them. docs/template-model.md explains it all.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from collections.abc import Collection

import numpy as np

from pagecast import PRODUCER
from pagecast.errors import TraceError, UsageError

from pagecast import values as V

from .. import formula as FM
from ..model_io import KernelModel, Model, Pinning, Region
from ..features import Word, layout_groups
from ..observe import TraceObs
from ..truth_obs import TRUTH_OBSERVATIONS
from .data import DEFAULT, KernelData
from .index_counts import launch_positions, value_rows
from .index_rows import rows_of_tables
from .params import FitParams, record_loss
from .program_filters import kernel_filters, program_filtered
from .region import fit_region, quieter, region_score, region_terms
from .shapes import (RangeEvidence, described_growth, growing_ends, layout_size, one_set_layouts, position_args,
                     position_ends, shared_shape, vocabulary)


def fit_model(traces: list, progress=None, params: FitParams | None = None,
              kernels: Collection[str] | None = None) -> Model:
    """One model from several traces (different scales / seeds of the same program).

    `params`: the thresholds the fit decides with (`FitParams`, recorded in the model). `kernels`:
    fit only these (None: every kernel). A kernel's templates come from its own launches alone,
    so models of disjoint kernel sets, each from the traces that run them, merge into the model
    of them all (the demo fits kernels in parallel that way)."""
    params = params or DEFAULT
    if not traces:
        raise UsageError("fit needs at least one trace")
    ps = {t.page_size for t in traces}
    if len(ps) != 1:
        raise TraceError("traces have different page sizes: " + ", ".join(f"{t.path}: {t.page_size}" for t in traces))
    ps = ps.pop()
    if params.big_page > ps and all(t.manifest.get("observations") == TRUTH_OBSERVATIONS for t in traces):
        # records rebuilt from exact footprints (fit --from truth) are exact to the page: no driver
        # widened a fault to a big page, so a prediction rounded out to one reaches untouched pages
        params = dataclasses.replace(params, big_page=ps)
    if sum(t.n_launches for t in traces) == 0:
        raise TraceError("no launches in " + ", ".join(str(t.path) for t in traces) + ": nothing to learn from")
    obs = [TraceObs(t, params.big_page) for t in traces]
    losses = [record_loss(t, params) for t in traces]
    for o, lo in zip(obs, losses):
        o.loss = lo.rate
    if sum(o.n_records for o in obs) == 0:
        raise TraceError("no faults or migrations in " + ", ".join(str(t.path) for t in traces)
                         + ": nothing to learn from (was unified-memory profiling on?)")
    model = Model(page_size=ps, big_page=params.big_page, fit_params=params.to_json(), created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  producer=PRODUCER,
                  traces=[{"path": str(t.path), "workload": t.name, "mode": t.mode, "launches": t.n_launches,
                           **lo.to_json()} for t, lo in zip(traces, losses)])
    parts: dict[str, list] = defaultdict(list)
    for o in obs:
        whole = o.trace.whole_launches()   # a launch cut off while it ran shows part of its footprint
        for name, idx in zip(o.names, o.groups):
            idx = idx[whole[idx]]
            if len(idx):
                parts[name].append((o, idx))
    names = sorted(parts) if kernels is None else sorted(n for n in parts if n in kernels)
    for name in names:
        km = model.kernels[name] = fit_kernel(name, parts[name], ps, params)
        for vparts in other_layouts(parts[name], km):
            km.variants.append(fit_kernel(name, vparts, ps, params))
        if progress is not None:
            progress.advance(1) if hasattr(progress, "advance") else progress(1)
    return model


MIN_VARIANT_LAUNCHES = 2   # launches of another parameter layout a variant is fitted from, at least


def other_layouts(parts: list, km: KernelModel) -> list[list]:
    """The kernel's launches `parts` [(TraceObs, launch ids)] by parameter layout, for each layout
    other than `km`'s with at least MIN_VARIANT_LAUNCHES launches: the parts to fit its variant
    from (KernelModel.variants), the most launches first."""
    by: dict[tuple, list] = {}
    for o, idx in parts:
        for sizes, offsets, mask in layout_groups(o.trace.launches, idx):
            if (sizes, offsets) != (tuple(km.param_sizes), tuple(km.param_offsets)):
                by.setdefault((sizes, offsets), []).append((o, idx[mask]))
    out = [ps for ps in by.values() if sum(len(i) for _, i in ps) >= MIN_VARIANT_LAUNCHES]
    return sorted(out, key=lambda ps: -sum(len(i) for _, i in ps))


def fit_kernel(name: str, parts: list, ps: int, params: FitParams = DEFAULT, assess: bool = True) -> KernelModel:
    """The kernel's templates from its launches `parts` [(TraceObs, launch ids)]; `assess`: also say
    how well they are pinned down (`pinning`)."""
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
    evidence = {}
    for (w, vals), fe in zip(kd.bases, fences):
        r, sig, shape, rf = fit_region(kd, w, vals, fe)
        if r is None:
            continue
        evidence[w.name] = rf
        any_obs = True
        regions.append((sig, r))
        shapes.append((r, shape))
    # rows by position, or strided rows, read as far as a table region of the kernel reads them
    # for its index values
    rows_of_tables(kd, [r for _, r in regions], evidence)
    # regions that name pages where the records show none, where index values say why
    for i, (sig, r) in enumerate(regions):
        q = quieter(evidence[r.base], r)
        if q is not r:
            regions[i], shapes[i] = (sig, q), (q, None)
    # ranges a filter of the kernel's programs leaves rows out of (a prefill kernel's query rows)
    filters = kernel_filters([r for _, r in regions])
    for i, (sig, r) in enumerate(regions):
        q = program_filtered(evidence[r.base], r, filters)
        if q is not r:
            regions[i], shapes[i] = (sig, q), (q, None)
    # ends the records leave open take the sizes the kernel's other regions are proven to have
    tier1, tier2 = vocabulary(kd, shapes)
    for r, shape in shapes:
        shared_shape(kd, r, shape, tier1, tier2)
    position_ends(kd, shapes)
    for r, shape in shapes:
        layout_size(kd, r, shape)
    # two words that always point into the same allocation see the same pages: keep the simpler
    best: dict[tuple, Region] = {}
    order: list[tuple] = []
    for sig, r in regions:
        if sig not in best:
            best[sig] = r
            order.append(sig)
        elif region_score(r) < region_score(best[sig]):
            best[sig] = r
    km.regions = [best[s] for s in order] + address_tables(kd)
    if not any_obs:
        km.note = "no faults observed in the allocations its parameters point into"
    if kd.skipped:
        km.note = (km.note + "; " if km.note else "") + f"{kd.skipped} launches with another parameter layout skipped"
    if assess:
        km.pinned = pinning(kd, km, params, evidence)
    return km


def address_tables(kd: KernelData) -> list[Region]:
    """Pages in allocations no pointer word of the kernel points into, at its launches, where one
    word's recorded values, read as 64-bit addresses, point into every one of them at all launches
    but those lost records explain (a table of addresses choosing the allocation a row comes from:
    adapters' weights): an `unresolved` region on that word (`index`, 8-byte values; `count` the
    most addresses a launch's row held), predicted as the allocations those addresses point into.
    The pages inside them follow an index no formula here writes (docs/template-model.md,
    "Recovered or said so")."""
    if not kd.bases or not any(p.obs.trace.values is not None for p in kd.parts):
        return []
    part, lid = launch_positions(kd)
    pos0, need = 0, []   # (launch position, allocation) pairs no word points into
    for ti, (o, idx, _, _) in enumerate(kd.parts):
        pointed = np.stack([o.index.lookup(vals[ti], idx) for _, vals in kd.bases], axis=1)
        lk, ak = o.okey // o.nA, o.okey % o.nA
        order = np.argsort(idx, kind="stable")
        at = np.searchsorted(idx[order], lk)
        m = (at < len(idx)) & (idx[order][np.minimum(at, len(idx) - 1)] == lk)
        p = order[at[m]]
        a = ak[m]
        free = ~(pointed[p] == a[:, None]).any(axis=1)
        need.append((pos0 + p[free], ti, a[free]))
        pos0 += len(idx)
    lpos = np.concatenate([n[0] for n in need])
    tis = np.concatenate([np.full(len(n[0]), n[1]) for n in need])
    allocs = np.concatenate([n[2] for n in need])
    if not len(lpos):
        return []
    hit = np.unique(lpos)
    out = []
    for iw, ivals in kd.bases:
        iptr = np.concatenate(ivals)
        rows = value_rows(kd, part, lid, iptr)
        if (rows[hit] < 0).sum() > kd.allowed(len(hit)):
            continue
        missed, most = set(), 0
        for lp, ti, a in zip(lpos, tis, allocs):
            r = rows[lp]
            if r < 0:
                missed.add(int(lp))
                continue
            im = V.image(kd.parts[ti][0].trace)
            v = im.ints(int(r), int(im.nbytes[r]) // 8, 8)
            most = max(most, len(v))
            if not (kd.parts[ti][0].index.lookup(v.astype(np.uint64), int(lid[lp])) == a).any():
                missed.add(int(lp))
        if len(missed) <= kd.allowed(len(hit)) and most:
            out.append(Region(iw.name, "unresolved", index=iw.name, elem=8, count=FM.Formula(most, ()),
                              fit={"unresolved": f"pages in allocations no parameter points to, at the 64-bit "
                                                 f"addresses {iw.name}'s buffer holds", "launches": int(len(hit)),
                                   "unexplained": len(missed)}))
            break
    return out


def open_ends(kd: KernelData, km: KernelModel, evidence: dict) -> tuple[list[str], list[Region]]:
    """The bases of range regions whose end is a constant while some argument varied, where the
    records place that end only to a big page at every launch (its last touched page in the one
    big page throughout) and the allocation runs on past it: an extent that moved less than a big
    page across the profile reads as constant whether or not it grows with an argument (issue:
    one profile cannot tell; a decode loop's K/V extent from one short trace). With them, the
    regions whose end grows with a varying argument as the profile admits (`shapes.growing_ends`;
    not an argument the kernel uses only to place its regions, `shapes.position_args`), to be
    predicted beside the constant (`admitted_union`). Where the launches point into different
    big pages (other layers' allocations, each head's part of a cache), the big page the end lies
    in is counted from the base's, and the end is open only where a growing end is admitted: an
    end that stayed in its pointer's big page while the pointer moved is no evidence of growth."""
    if not any(kd.sel_varying):
        return [], []
    grow = [n for n, v in zip(kd.sel_names, kd.sel_varying) if v]
    # an argument the kernel uses only to place its regions moves them, not their ends
    place = position_args([(r, evidence[r.base].shape if r.base in evidence else None) for r in km.regions])
    out, grown = [], []
    for r in km.regions:
        rf = evidence.get(r.base)
        if r.cls not in ("fixed", "linear") or r.end.terms or rf is None or rf.shape is None:
            continue
        sh = rf.shape
        last = (sh.O_e - 1) // kd.bigp
        rel = last - (sh.base // kd.ps) // kd.bigp
        if not len(last) or rel.min() != rel.max() or not bool((sh.to_alloc > r.end.const).all()):
            continue
        g = growing_ends(kd, r, sh, [n for n in grow if n not in place], lambda alt, r=r, rf=rf: rf.fault_odds(alt, r))
        if g or last.min() == last.max():
            out.append(r.base)
            grown += g
    return out, grown


def pinning(kd: KernelData, km: KernelModel, params: FitParams, evidence: dict | None = None) -> Pinning:
    """How well the launches pin the kernel's templates down (model_io.Pinning): the arguments its
    formulas use that no launch varied, and split-half cross-validation across launch groups (the
    groups alternately in two halves by their argument values, each half fitted alone, each
    region's formulas compared with the full fit's)."""
    used = {n for r in km.regions for f in r.formulas().values() for n in f.names()}
    const = {n for n, v in zip(kd.sel_names, kd.sel_varying) if not v}
    out = Pinning(groups=int(kd.U), unvaried=sorted(used & const))
    if kd.U == 1 and not out.unvaried and km.regions:
        # one set of arguments throughout: the templates' constants may be sizes its arguments
        # give (3 launches of one size fit constants an argument contradicts at another size);
        # the parameters (not the grid) that a second profile should vary are named
        ptrs = {w.name for w, _ in kd.bases}
        # from one profile, the words past the fit's features too (a count past 65536)
        words = const | set(kd.const_words) if kd.traces == 1 else const
        out.unvaried = sorted(n for n in words if Word.parse(n).param >= 0 and n not in ptrs)
    evidence = evidence or {}
    out.open_ends, grown = open_ends(kd, km, evidence)
    if kd.U == 1 and kd.traces == 1:   # sizes the one set of arguments describes, beside the constants
        grown += [g for r in km.regions if r.base in evidence
                  for g in one_set_layouts(kd, r, evidence[r.base].shape)]
    if out.open_ends:
        out.grow = [n for n, v in zip(kd.sel_names, kd.sel_varying) if v]
    if kd.U < 4 or kd.n > params.cv_max_launches:
        if kd.U < 4:
            out.cv = "too few groups"
        out.union = admitted_union(km, {}, [], evidence, params, grown)
        return out
    order = np.argsort(np.lexsort(kd.uniq.T[::-1])) if kd.uniq.shape[1] else np.arange(kd.U)
    half_of_group = order % 2                        # neighbours in argument order go to different halves
    half = half_of_group[kd.group]
    starts = np.cumsum([0] + [len(p.idx) for p in kd.parts])
    full = {r.base: r.text() for r in km.regions}
    got, halves = [], []
    for h in (0, 1):
        parts = [(p.obs, p.idx[half[a:b] == h]) for p, a, b in zip(kd.parts, starts[:-1], starts[1:])]
        parts = [(o, idx) for o, idx in parts if len(idx)]
        sub = fit_kernel(kd.name, parts, kd.ps, params, assess=False)
        got.append({r.base: r.text() for r in sub.regions})
        halves.append(sub.regions)
    out.differ = {b: [got[0].get(b, "none"), got[1].get(b, "none")] for b, t in full.items()
                  if got[0].get(b) != t or got[1].get(b) != t}
    out.cv = "differ" if out.differ else "agree"
    out.union = admitted_union(km, out.differ, halves, evidence, params, grown)
    return out


def admitted_union(km: KernelModel, differ: dict, halves: list, evidence: dict, params: FitParams,
                   grown: Collection[Region] = ()) -> list[str]:
    """Where the halves of the profile give other formulas than the whole (`differ`), the evidence
    admits several: each half's region that explains every launch of the whole profile the chosen
    one explains (`RegionFit.unexplained`), holding every fault, under which the faults are not
    `odds_per_term` times less likely (`RegionFit.fault_odds`), and `odds_per_term` times likelier
    for each term it has past the chosen one's, is added to the kernel's regions, flagged
    (`fit["union_of"]`), so that the prediction is their union and errs toward pages needed
    (docs/template-model.md, "What the fit does not know"). Where an end is left open
    (`open_ends`), the regions `grown` with an end that grows with a varying argument
    (`shapes.growing_ends`) are admitted the same way, their odds asked there without the term's
    price: the constant stays and the union holds what either predicts at another size.
    Returns the texts of those added."""
    added = []
    cands = [(base, alt, True) for base in differ for regs in halves for alt in regs if alt.base == base]
    cands += [(alt.base, alt, False) for alt in grown]
    seen, n0s = set(), {}
    for base, alt, ask_odds in cands:
        rf = evidence.get(base)
        chosen = next((r for r in km.regions if r.base == base and "union_of" not in r.fit), None)
        if rf is None or chosen is None or alt.text() in seen | {chosen.text()}:
            continue
        seen.add(alt.text())
        if base not in n0s:
            n0s[base] = rf.unexplained(chosen)
        n0 = n0s[base]
        if n0 is None:
            continue
        kd = getattr(rf, "kd", None)
        n = rf.unexplained(_at_constants(kd, alt) if kd is not None else alt)
        if n is None or n > n0:
            continue
        if ask_odds:
            # a half's constant beside an end growing as the arguments describe: the layout
            # explains the growth the constant would deny (an open end takes it alone too)
            if kd is not None and alt.cls in ("fixed", "linear") and not alt.end.terms \
                    and described_growth(kd, chosen):
                continue
            odds = rf.fault_odds(alt, chosen)   # the faults far likelier under the chosen: not admitted
            # each term more than the chosen one has must buy its likelihood, as in the fit's
            # own choice: a formula bent through lost records fits them with extra terms
            extra = max(region_terms(alt) - region_terms(chosen), 0)
            if odds is None or odds * params.odds_per_term ** extra >= params.odds_per_term:
                continue
        if "layout_end" in alt.fit:   # the slope the arguments describe: the end, in place of the constant
            chosen.fit["open_end"], chosen.fit["layout_end"] = chosen.end.text(), alt.end.text()
            chosen.end, chosen.cls = alt.end, "linear"
            continue
        alt.fit = {"union_of": chosen.text(), "union_unexplained": n, "launches": chosen.fit.get("launches", 0)}
        if not ask_odds:
            alt.fit["open_end"] = chosen.end.text()
        km.regions.append(alt)
        added.append(alt.text())
    return added


def _at_constants(kd: KernelData, r: Region) -> Region:
    """`r` with the words its formulas use outside the fit's features (`KernelData.const_words`,
    one value at every launch: `shapes.one_set_layouts`) put in as numbers, to check it against
    the records."""
    if not any(n not in kd.sel_names for f in r.formulas().values() for n in f.names()):
        return r

    def sub(f: FM.Formula) -> FM.Formula:
        const, terms = f.const, []
        for c, fac in f.terms:
            keep = tuple(n for n in fac if n in kd.sel_names)
            c *= int(np.prod([kd.const_words[n] for n in fac if n not in kd.sel_names], dtype=object))
            if keep:
                terms.append((c, keep))
            else:
                const += c
        return FM.Formula(const, tuple(terms))
    return dataclasses.replace(r, **{k: sub(f) for k, f in r.formulas().items()})


def _fences(kd: KernelData) -> list[list]:
    """Per base word and trace: the pages [lo, hi) of its allocation this word owns.

    When several base words point into one allocation, each owns the part from its
    pointer to the next pointer above it (the lowest one also owns what lies below); words whose
    pointers lie in one page own the same part (page-granular records cannot split a page).
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
            # a pointer in this word's own page fences nothing the records can show (a fused
            # projection's K and V views, interleaved a row apart): both own the same part
            page = P // ps
            above = same & (page > page[:, b:b + 1])
            below = same & (page < page[:, b:b + 1])
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
