"""One base word's region: the evidence gathered once, then the template classes tried in order.

`fit_region` gathers what the records show in the allocation the word points into at each launch
(`RegionFit`) and runs `CASCADE`, an ordered list of per-class attempts: the first that returns a
region wins. Each attempt is one function of the `RegionFit`; adding a template class is one
more `Attempt` in the list (and its fitter module), with its rank among duplicates
(`region_score`). docs/template-model.md explains each class.

Long because the cascade's attempts and the evidence they share (`RegionFit`, its cached indexed
fits, the range bounds and fault statistics every attempt reads) are one step of the fit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from pagecast.footprints import _ranges, coarsen_intervals, merge_intervals  # noqa: PLC2701 - the core's CSR helpers

from .. import formula as FM
from ..features import Word
from ..model_io import Region
from ..observe import RegionObs
from .data import KernelData
from .index_rows import fit_by_position, fit_position_range
from .index_counts import launch_positions
from .index_values import _index_words as index_words  # noqa: PLC2701 - the words the indexed fit tries
from .index_values import empty_hits, fit_filtered_runs, fit_indexed, indexed_pages
from .layout import LOGLIK_LAUNCHES, fault_pages_loglik, fit_layouts
from .likelihood import aligned_odds, argument_backed, in_bounds, likeliest
from .shapes import RangeEvidence
from .solve import group_evidence, solve_pair, split_groups
from .strided import clean_runs, fault_loglik, fit_strided, gather_pieces, holes_from_loss, verify_region
from .within_runs import fit_within_runs

@dataclass
class RegionFit:
    """One base word's evidence at its observed launches `sel` (positions in `kd`), shared by the
    attempts; `fit` collects the statistics the model records, `shape` a range region's end
    evidence for the kernel's second look (fit.shapes)."""

    kd: KernelData
    w: Word
    obs: list[RegionObs]              # per trace
    cat: RegionObs                    # concatenated over traces
    fences: list
    sel: np.ndarray
    nat: np.ndarray                   # natural-mode launches
    whole: np.ndarray                 # launches whose records cover their whole allocation
    maxp: int                         # most runs one launch shows
    fit: dict
    empty: np.ndarray                 # full-mode launches (positions in kd) with no record in its part
    shape: RangeEvidence | None = None
    _indexed: dict = field(default_factory=dict, repr=False)   # max_terms -> (region, statistics)

    def unexplained(self, r: Region) -> int | None:
        """Launches the range or strided template `r` leaves unexplained on this evidence
        (`verify_region`); None for other classes."""
        if r.cls not in ("fixed", "linear", "strided"):
            return None
        return int((~verify_region(self.kd, r, self.cat, self.sel, self.kd.bigp)).sum())

    def fault_odds(self, r: Region, than: Region) -> float | None:
        """How many times likelier every fault of this evidence is under `than` than under `r`
        (`fault_pages_loglik`); inf where `r` leaves out a fault page `than` holds; None for
        classes without pages to compare."""
        if r.cls not in ("fixed", "linear", "strided") or than.cls not in ("fixed", "linear", "strided"):
            return None
        ll, held, _ = fault_pages_loglik(self.kd, r, self.cat, self.sel)
        ll0, held0, _ = fault_pages_loglik(self.kd, than, self.cat, self.sel)
        if held0 and not held:
            return float("inf")
        return float(np.exp(min(ll0 - ll, 700.0)))

    @property
    def g(self) -> np.ndarray:
        return self.kd.group[self.sel]

    def indexed(self, max_terms: int = 3) -> Region | None:
        """The indexed fit with edges of at most `max_terms` terms, tried once (the range attempt
        may ask first); its statistics go into `fit` when it is taken (`take_indexed`)."""
        if max_terms not in self._indexed:
            f = dict(self.fit)
            r = fit_indexed(self.kd, self.w, self.cat, self.sel, self.nat, f,
                            range_bounds(self.kd, self.cat, self.sel, self.nat), max_terms=max_terms)
            self._indexed[max_terms] = (r, f)
        return self._indexed[max_terms][0]

    def index_words(self) -> bool:
        """Does another base word of the kernel have its values recorded at most of these launches
        (an index word fit.index_values would try)?"""
        if not any(o.trace.values is not None for o, _, _, _ in self.kd.parts):
            return False
        part, lid = launch_positions(self.kd)
        return bool(index_words(self.kd, self.w, self.sel, self.nat, part, lid))

    def by_position(self) -> Region | None:
        """Rows chosen by their position, read to their lengths (fit.index_rows), tried once."""
        if BY_POSITION not in self._indexed:
            f = dict(self.fit)
            r = fit_by_position(self.kd, self.w, self.cat, self.sel, self.nat, f,
                                range_bounds(self.kd, self.cat, self.sel, self.nat))
            self._indexed[BY_POSITION] = (r, f)
        return self._indexed[BY_POSITION][0]

    def position_range(self) -> Region | None:
        """The buffer's first rows up to a count another buffer holds (fit.index_rows), tried once."""
        if POSITION_RANGE not in self._indexed:
            f = dict(self.fit)
            r = fit_position_range(self.kd, self.w, self.cat, self.sel, self.nat, f,
                                   range_bounds(self.kd, self.cat, self.sel, self.nat))
            self._indexed[POSITION_RANGE] = (r, f)
        return self._indexed[POSITION_RANGE][0]

    def quiet_indexed(self) -> Region | None:
        """The indexed fit that also predicts nothing where the records show nothing (`empty`:
        `fit_indexed`'s `empty`), tried once."""
        if QUIET not in self._indexed:
            f = dict(self.fit)
            r = fit_indexed(self.kd, self.w, self.cat, self.sel, self.nat, f,
                            range_bounds(self.kd, self.cat, self.sel, self.nat), empty=self.empty)
            self._indexed[QUIET] = (r, f)
        return self._indexed[QUIET][0]

    def filtered_runs(self, only) -> Region | None:
        """Rows back to back read only where row filter `only` allows (index_values.fit_filtered_runs),
        tried once per filter; not taken (`take_filtered_runs`)."""
        key = (FILTERED, only)
        if key not in self._indexed:
            f = dict(self.fit)
            r = fit_filtered_runs(self.kd, self.w, self.cat, self.sel, self.nat, f,
                                  range_bounds(self.kd, self.cat, self.sel, self.nat), only, self.empty)
            self._indexed[key] = (r, f)
        return self._indexed[key][0]

    def take_filtered_runs(self, only) -> Region:
        """`filtered_runs(only)` (found) as this word's region, its statistics recorded."""
        r = self.filtered_runs(only)
        self.fit.clear()
        self.fit.update(self._indexed[FILTERED, only][1])
        self.shape = None
        r.fit = self.fit
        return r

    def hits(self, r: Region) -> int:
        """Launches of `empty` at which region `r` names a page of the word's part of the
        allocation: each a launch whose records show nothing there, all of its pages' records
        lost if `r` holds. Ranges, whole allocations and indexed regions; 0 for the others."""
        e = self.empty
        if not len(e) or r.cls not in ("fixed", "linear", "allocation", "indexed"):
            return 0
        if r.cls == "allocation":
            return len(e)
        if r.cls == "indexed":
            return empty_hits(self.kd, r, self.cat, e)
        g = self.kd.group[e]
        vals = {n: self.kd.uniq[g, k] for k, n in enumerate(self.kd.sel_names)}
        one = np.ones(len(e), np.int64)
        base = self.cat.base[e]
        lo = np.maximum(base + np.asarray(r.start.evaluate(vals), np.int64) * one, self.cat.lo_f[e] * self.kd.ps)
        hi = np.minimum(base + np.asarray(r.end.evaluate(vals), np.int64) * one, self.cat.hi_f[e] * self.kd.ps)
        return int((hi > lo).sum())

    def take_indexed(self, max_terms: int | str = 3) -> Region | None:
        """The indexed fit (`max_terms`, BY_POSITION: rows by position, POSITION_RANGE, or QUIET)
        as this word's region, its statistics recorded; the rows by position where no index word
        explains the launches."""
        if max_terms in (POSITION_RANGE, BY_POSITION, QUIET):
            r = {POSITION_RANGE: self.position_range, BY_POSITION: self.by_position,
                 QUIET: self.quiet_indexed}[max_terms]()
        else:
            r = self.indexed(max_terms)
        if r is None and max_terms not in (BY_POSITION, POSITION_RANGE, QUIET):
            return self.take_indexed(BY_POSITION)
        if r is not None:
            self.fit.clear()
            self.fit.update(self._indexed[max_terms][1])
        return r


BY_POSITION = "by_position"   # RegionFit's key for the rows-by-position fit
POSITION_RANGE = "position_range"   # and for the first rows up to a count another buffer holds
QUIET = "quiet"   # and for the indexed fit that predicts nothing where the records show nothing
FILTERED = "filtered"   # and, with the filter, for rows back to back a kernel's row filter keeps


def _try_strided(rf: RegionFit) -> Region | None:
    """Several runs in a launch: the chunks of a strided region (or big pages whose records were
    all lost: a strided fit that predicts no gap a big page wide is refused, `verify_region`)."""
    if rf.maxp <= 1:
        return None
    kd, cat, sel, fit, bigp = rf.kd, rf.cat, rf.sel, rf.fit, rf.kd.bigp
    multi = sel[cat.npieces[sel] >= 2]
    multi = multi[clean_runs(kd, cat, multi, bigp)]
    both = np.union1d(multi, sel[cat.npieces[sel] == 1])
    # a constant stride seen over a narrow range of sizes may really follow an argument; a
    # start known to its big page only may lie where the first chunk's page faulted. Of the
    # variants that verify, the first (the simplest) stands unless the faults are far likelier
    # under a later one (`_likelier`), as for ranges (docs/template-model.md, "Where the faults land")
    best = None
    start = dict(fit)
    for stride_terms, aligned in ((0, False), (1, False), (0, True), (1, True)):
        trial = dict(start)
        r = fit_strided(kd, rf.w, cat, both, kd.group[both], bigp, trial, shape=np.isin(both, multi),
                        stride_terms=stride_terms, aligned=aligned)
        if r is not None:
            ok = verify_region(kd, r, cat, sel, bigp)
            trial["exact"] = round(float(ok.mean()), 6)
            trial["unexplained"] = int((~ok).sum())
            if trial["unexplained"] <= kd.allowed(len(sel), 2 * cat.npieces[sel]) and \
                    (best is None or _likelier(rf, r, best[0])):
                best = (r, trial)
                ll, held = fault_loglik(kd, r, cat, sel)
                if held.all() and not ll.any():
                    break   # every fault on the one page its big page holds: nothing is likelier
                continue
        if best is None:   # what a refused variant left in the statistics, as before
            trial.pop("evidence", None)
            fit.clear()
            fit.update(trial)
    best = _layout_or(rf, best)
    if best is None:
        return None
    fit.clear()
    fit.update(best[1])
    return best[0]


def _try_within_runs(rf: RegionFit) -> Region | None:
    """Chunks under a big page inside runs the records show whole (fit.within_runs: their faults
    modulo a stride the arguments describe leave a gap), where the faults are far likelier
    under them than under the runs. Full-mode launches only (natural mode faults first touches)."""
    if rf.nat.any() or rf.index_words():
        return None   # where another word's index values are recorded, the indexed attempts decide
    found = fit_within_runs(rf.kd, rf.w, rf.cat, rf.sel)
    if found is None:
        return None
    rf.fit.update(found[1])
    return found[0]


def _layout_or(rf: RegionFit, best):
    """The layout the arguments describe (fit.layout) in place of the strided fit from the runs,
    where it explains at least as many launches and the faults are likelier under it: it holds
    every fault the runs' fit holds, with fewer pages around them (`odds_per_term` times likelier
    when it uses more argument terms). Where the runs gave nothing, the layout that explains the
    most launches."""
    kd, cat, sel = rf.kd, rf.cat, rf.sel
    ps, bigp = kd.ps, kd.bigp
    O_s, base = cat.O_s[sel], cat.base[sel]
    s_hi = (O_s // bigp * bigp + bigp) * ps - 1
    s_hi = np.where(cat.I_s[sel] >= 0, np.minimum(s_hi, (cat.I_s[sel] + 1) * ps - 1), s_hi)
    layouts = fit_layouts(kd, rf.w, cat, sel, (O_s * ps - base, s_hi - base))
    if not layouts:
        return best
    if best is None:
        r, fit = layouts[0]
        return r, {**rf.fit, **fit}
    ll_old, held_old, _ = fault_pages_loglik(kd, best[0], cat, sel)
    terms_old = region_terms(best[0])
    for r, fit in layouts:
        if fit["unexplained"] > best[1].get("unexplained", 0) or r.text() == best[0].text():
            continue
        ll, held, _ = fault_pages_loglik(kd, r, cat, sel)
        terms = region_terms(r)
        need = np.log(kd.params.odds_per_term) * max(terms - terms_old, 0) + 1e-9
        if (held or not held_old) and ll >= ll_old + need:
            best, ll_old, held_old, terms_old = (r, {**rf.fit, **fit}), ll, held, terms
    return best


def _likelier(rf: RegionFit, new: Region, old: Region) -> bool:
    """Do the launches' fault pages favour the strided template `new` over `old`, which also
    verifies? Each touched big page faults at a touched page drawn at random, so a template that
    puts fewer pages around each fault explains it better: `new` wins when it holds every fault
    page `old` holds and the faults are `odds_per_term` times likelier under it (the odds a term
    needs against a constant elsewhere) - a tighter template errs toward pages that fault
    feedback can add back."""
    if region_terms(new) > region_terms(old) + 1:
        return False
    ll_new, held_new = fault_loglik(rf.kd, new, rf.cat, rf.sel)
    ll_old, held_old = fault_loglik(rf.kd, old, rf.cat, rf.sel)
    if (held_old & ~held_new).any():
        return False
    use = held_new & held_old
    return float(ll_new[use].sum() - ll_old[use].sum()) >= np.log(rf.kd.params.odds_per_term)


def _hull_ok(rf: RegionFit) -> bool:
    """One contiguous range may stand for the runs (their hull) when the gaps inside are a sliver:
    chunks that nearly always merge in fault data, or big pages whose records were lost, as many
    as lost records explain (`_few_holes`); never for gathers."""
    if rf.maxp == 1:
        return True
    kd, cat, sel = rf.kd, rf.cat, rf.sel
    O_s, O_e = cat.O_s[sel], cat.O_e[sel]
    covered = int(_hull_covered(kd, cat, sel).sum())
    hull = int((O_e - O_s).sum())
    return hull > 0 and (covered >= (1 - kd.params.hull_gaps) * hull
                         or bool(_few_holes(kd, cat, sel, O_e - O_s).all()))


def _one_stride(kd: KernelData, cat: RegionObs, sel: np.ndarray) -> np.ndarray:
    """Per launch of `sel` (each with STRIDE_RUNS runs or more): do its runs start one stride apart,
    within two big pages (the records place a run by the big pages that faulted), the gaps next
    to its first and last run aside (a chunk cut by the edge of what the launch reads)?"""
    own, s, _ = gather_pieces(kd, cat, sel, "O")
    same = own[1:] == own[:-1]
    gap, o = (s[1:] - s[:-1])[same], own[1:][same]
    # the interior gaps: not a launch's first or last
    first = np.r_[True, o[1:] != o[:-1]]
    last = np.r_[o[1:] != o[:-1], True]
    inner = ~(first | last)
    gap, o = gap[inner], o[inner]
    n, b = len(sel), kd.bigp
    big = np.int64(1) << np.int64(62)
    lo = np.full(n, big, np.int64)
    np.minimum.at(lo, o, gap)
    m = lo[o]
    # each gap the smallest within two big pages, or (a stride of four big pages or more) a
    # multiple of it within two (runs whose records were lost, chunks that merged); the smallest
    # at least two big pages (a random lookup's dense rows leave gaps of a big page or two)
    fits = (gap - m <= 2 * b) | ((m >= 4 * b) & (np.abs(gap - np.round(gap / np.maximum(m, 1)) * m) <= 2 * b))
    bad = np.bincount(o[~fits], minlength=n)
    # (one gap in eight may miss: two chunks' big pages that merged with a lost record's)
    return (lo < big) & (lo >= 2 * b) & (8 * bad <= np.bincount(o, minlength=n))


def _try_range(rf: RegionFit) -> Region | None:
    """`fixed` or `linear`: one range whose start and end are formulas of the arguments."""
    if not _hull_ok(rf):
        return None
    kd, w, cat, sel, nat, fit, whole = rf.kd, rf.w, rf.cat, rf.sel, rf.nat, rf.fit, rf.whole
    ps, bigp, g = kd.ps, kd.bigp, rf.g
    base = cat.base[sel]
    O_s, O_e = cat.O_s[sel], cat.O_e[sel]
    I_s, I_e = cat.I_s[sel], cat.I_e[sel]
    s_lo, s_hi, e_lo, e_hi = range_bounds(kd, cat, sel, nat)
    if all(fe is None for fe in rf.fences):  # shared big pages (other pointers) spoil the statistic
        s_lo, e_hi = _fault_statistics(kd, g, s_lo, s_hi, e_lo, e_hi, O_s, O_e, I_s, I_e, nat)
    res = solve_pair(kd, g, [(s_lo, s_hi), (e_lo, e_hi)], hard={0: "hi", 1: "lo"})
    # the region's edges inside the faulting pages: offsets that follow arguments by less than a
    # big page (a row under a page at pos * row_bytes) show only in which page faulted
    f1 = (I_s >= 0) & (I_s // bigp == O_s // bigp) & ~nat
    f2 = (I_e >= 0) & ((I_e - 1) // bigp == (O_e - 1) // bigp) & ~nat
    s_lo_a = np.where(f1, np.maximum(s_lo, I_s * ps - base), s_lo)
    e_hi_a = np.where(f2, np.minimum(e_hi, I_e * ps - base), e_hi)
    if res is not None:
        vals_ = {n: kd.uniq[g, k] for k, n in enumerate(kd.sel_names)}
        one_ = np.ones(len(g), np.int64)
        inside = in_bounds(res[0][0], vals_, one_, s_lo_a, s_hi) & in_bounds(res[0][1], vals_, one_, e_lo, e_hi_a)
    if (res is None or (~inside).sum() > kd.allowed(len(g))) and \
            ((s_lo_a != s_lo).any() or (e_hi_a != e_hi).any()) and \
            split_groups(kd, g, s_lo_a, s_hi) + split_groups(kd, g, e_lo, e_hi_a) <= kd.allowed(len(g)):
        # the plain solution leaves its edges off the faulting pages: try one that does not
        res_a = solve_pair(kd, g, [(s_lo_a, s_hi), (e_lo, e_hi_a)], hard={0: "hi", 1: "lo"},
                           max_terms=kd.params.aligned_terms)
        if res_a is not None and (res is None or res_a[0] != res[0]) and (
                res is None or aligned_odds(kd, g, res[0], res_a[0], base, O_s, O_e, I_s, I_e, f1, f2)
                >= kd.params.odds_per_term):
            res = res_a
    guessed = False
    if res is not None:
        res = likeliest(kd, g, res, [(s_lo, s_hi), (e_lo, e_hi)], base, O_s, O_e, f1, f2)
        if not nat.any():   # natural mode bounds ends by the allocation: no page to compare
            guess = argument_backed(kd, g, res, e_lo, e_hi, base)
            guessed, res = guess is not res, guess
    if res is None:
        return None
    (fs, fe), exact, unexplained = res
    if not fs.terms and not fe.terms and fe.const <= fs.const:
        fe = FM.Formula(fs.const + 1, ())  # an observed region is not empty
    cls = "fixed" if not fs.terms and not fe.terms else "linear"
    ugly = max([FM.odd(c) for c, _ in fs.terms + fe.terms] or [0]) > kd.params.simple_odd
    if cls == "linear" and ugly:
        # a coefficient no element size times dimensions gives (FitParams.simple_odd) is a
        # formula bent through lost records; where index values explain the launches, the
        # indexed template is the better-founded one (docs/template-model.md, "indexed")
        region = rf.take_indexed()
        if region is not None:
            return region
        if _mostly(kd, whole):
            return None
        many = rf.sel[cat.npieces[rf.sel] >= STRIDE_RUNS]
        if len(many) >= 2 and int((~_one_stride(kd, cat, many)).sum()) <= kd.allowed(len(many)):
            # the hull of runs at one stride, bent to them: the chunks' layout, which the strided
            # attempt did not solve, is what the records show (the fallback says so: unresolved)
            return None
    region = Region(w.name, cls, start=fs, end=fe)
    alt = _indexed_likelier(rf, region)
    if alt is not None:
        return rf.take_indexed(alt)
    fit["exact"] = exact
    fit["unexplained"] = unexplained
    fit["evidence"] = group_evidence(kd, g, s_lo, s_hi, e_lo, e_hi)
    if rf.maxp > 1:
        fit["hull_of_runs"] = True
    if not nat.any():   # the kernel's own sizes may settle the end (fit.shapes)
        rf.shape = RangeEvidence(g, s_lo, s_hi, e_lo, e_hi, base, O_s, O_e, f2, guessed, whole,
                                 cat.alloc_eb[sel] - base)
    return region


COMPARE_TERMS = 1   # an indexed rival of a range: the value's own term (a constant stride) only


def _indexed_likelier(rf: RegionFit, rng: Region) -> int | str | None:
    """Does an indexed template explain this word's faults far better than the range `rng`, which
    also explains the launches? A range is the hull of what the launches touched; where index
    values choose the pages (a sequence's KV blocks, a position's rows of a small table), the
    hull holds every chunk and the gaps between, and a pool or table a few big pages wide shows
    few gaps a big page wide, so the range verifies. Each touched big page faults once, at a
    touched page drawn at random (`fault_pages_loglik`): the indexed template wins when, on the
    launches whose values were recorded, it holds every fault page the range holds and the faults
    are `odds_per_term` times likelier under it (the odds an added term needs). Tried only where
    the traces hold values. The indexed fit here is a cheaper search (`COMPARE_TERMS`: edges that
    add a constant stride times the value, no other term), as it runs for every range of a kernel
    with values; a stride that follows an argument varies within the profile, which a range
    rarely explains. Rows chosen by their position (`BY_POSITION`: a block table's own rows, each
    read to its sequence's length) are another rival, and the buffer's first rows up to a count
    another buffer holds (`POSITION_RANGE`: an output buffer's rows up to the batch's token count)
    the third; an index word that verifies may still explain the faults worse. Returns the key (`take_indexed`) of the likelier rival that wins,
    or None."""
    kd, cat, sel = rf.kd, rf.cat, rf.sel
    if not any(p.obs.trace.values is not None for p in kd.parts):
        return None
    # a rival's log-likelihood is at most 0 and is weighed on some of these launches, so it gains
    # no more than the range loses on all of them: under the odds, no rival is fitted (read where
    # that is one read of the likelihood, as each rival's is)
    full = sel[~rf.nat]
    if not len(full) or len(full) <= LOGLIK_LAUNCHES and \
            -fault_pages_loglik(kd, rng, cat, full)[0] + 1e-6 < np.log(kd.params.odds_per_term):
        return None
    won, best = None, -np.inf
    for key in (COMPARE_TERMS, BY_POSITION, POSITION_RANGE):
        alt = {BY_POSITION: rf.by_position, POSITION_RANGE: rf.position_range}.get(key, lambda: rf.indexed(key))()
        if alt is None:
            continue
        _, have = indexed_pages(kd, alt, cat, sel)
        use = sel[have & ~rf.nat]
        if not len(use):
            continue
        ll_i, held_i, n = fault_pages_loglik(kd, alt, cat, use, pages=lambda s, a=alt: indexed_pages(kd, a, cat, s)[0])
        ll_r, held_r, _ = fault_pages_loglik(kd, rng, cat, use)
        gain = ll_i - ll_r
        if n > 0 and (held_i or not held_r) and gain >= np.log(kd.params.odds_per_term) and gain > best:
            won, best = key, gain
    return won


def _try_indexed(rf: RegionFit) -> Region | None:
    """Pages chosen by index values another pointer's buffer holds (the trace's values table):
    tried before `allocation`, which the fitting runs' values may happen to cover whole (a gather
    over a small vector) while a larger run's do not."""
    return rf.take_indexed()


def _try_allocation(rf: RegionFit) -> Region | None:
    """The whole allocation, where the records cover it at all launches but those lost records explain."""
    if not _mostly(rf.kd, rf.whole):
        return None
    rf.fit["exact"] = round(float(rf.whole.mean()), 6)
    rf.fit["unexplained"] = int((~rf.whole).sum())
    return Region(rf.w.name, "allocation")


def _try_position_range(rf: RegionFit) -> Region | None:
    """The buffer's first rows, as many as another buffer's value says (fit.index_rows,
    `fit_position_range`): tried after the whole allocation, so that a fresh buffer a kernel
    reads whole stays `allocation` whatever value happens to match its rows."""
    return rf.take_indexed(POSITION_RANGE)


def _try_fallback(rf: RegionFit) -> Region:
    """What nothing else explains: `unresolved` where the records hold what should choose its
    pages (`unresolved_reason`), predicted as its allocation, the fit saying it cannot; else
    `irregular`, the pages it touched as history (pages that follow data no buffer records: a
    random lookup's, whose runs fall anywhere)."""
    rf.fit["exact"] = 0.0
    why = unresolved_reason(rf)
    if why:
        rf.fit["unresolved"] = why
        return Region(rf.w.name, "unresolved")
    return Region(rf.w.name, "irregular", history=_history(rf.kd, rf.obs, rf.kd.ps))


def unresolved_reason(rf: RegionFit) -> str:
    """Why no template explains this word's launches though the records hold what chooses its
    pages ("" where they do not): another word's index values, recorded at most of its launches
    (`index_values._index_words`), that no indexed formula the fitter solves maps onto the pages;
    or, at nearly every launch, one run or runs at one stride (`_one_stride`: a wavefront's
    diagonal, a slice whose count or start no formula of the arguments gives), which a random
    lookup's runs are not."""
    kd, cat, sel = rf.kd, rf.cat, rf.sel
    if any(p.obs.trace.values is not None for p in kd.parts):
        part, lid = launch_positions(kd)
        words = index_words(kd, rf.w, sel, rf.nat, part, lid)
        if words:
            return "index values of " + ", ".join(iw.name for iw, *_ in words) + " recorded; no indexed formula verifies"
    multi = sel[cat.npieces[sel] >= 2]
    many = sel[cat.npieces[sel] >= STRIDE_RUNS]
    if not len(multi) or (len(many) >= 2 and int((~_one_stride(kd, cat, many)).sum()) <= kd.allowed(len(many))):
        return "one run or chunks at one stride per launch; no formula of the arguments gives their count and start"
    return ""


STRIDE_RUNS = 5   # runs a launch shows, at least, for their gaps to say chunks at one stride


@dataclass(frozen=True)
class Attempt:
    """One step of the cascade: the classes it may give, with their rank among regions two words
    share (lower: kept), and the function that tries them."""

    ranks: dict[str, int]
    run: Callable[[RegionFit], Region | None]


# tried in this order; the first region returned wins (the last attempt always returns one)
CASCADE: list[Attempt] = [
    Attempt({"strided": 2}, _try_strided),
    Attempt({"strided": 2}, _try_within_runs),
    Attempt({"fixed": 0, "linear": 1}, _try_range),
    Attempt({"indexed": 4}, _try_indexed),
    Attempt({"allocation": 3}, _try_allocation),
    Attempt({"indexed": 4}, _try_position_range),
    Attempt({"irregular": 5, "unresolved": 6}, _try_fallback),
]
CLASS_RANK: dict[str, int] = {c: r for a in CASCADE for c, r in a.ranks.items()}


def region_terms(r: Region) -> int:
    """The terms of a region's formulas, all edges together (each must buy `odds_per_term`)."""
    return sum(f.n_terms for f in r.formulas().values())


def region_score(r: Region) -> tuple:
    """Of two words that always point into the same allocation, the lower score is kept."""
    fs = r.formulas().values()
    return (CLASS_RANK[r.cls], sum(f.score()[0] for f in fs), sum(f.score()[1] for f in fs))


def fit_region(kd: KernelData, w: Word, vals: list[np.ndarray], fences=None):
    """Fit one base word's region: (region, signature, RangeEvidence of a range region's end or
    None, the evidence `RegionFit`); (None, None, None, None) when it never points at observed pages."""
    fences = fences or [None] * len(kd.parts)
    obs = [p.obs.region(p.idx, v, *(fe if fe is not None else (None, None, None, None)))
           for p, v, fe in zip(kd.parts, vals, fences)]
    natural = np.concatenate([np.full(len(p.idx), p.obs.trace.mode != "full") for p in kd.parts])
    cat = RegionObs.concat(obs)
    trace_no = np.concatenate([np.full(len(ob.valid), i) for i, ob in enumerate(obs)])
    sig = (hash(cat.base.tobytes()),)
    nonempty = cat.valid & (cat.npieces > 0)
    n_valid, n_obs = int(cat.valid.sum()), int(nonempty.sum())
    if n_obs == 0:
        return None, None, None, None
    fit = {"launches": n_valid, "observed": n_obs,
           "traces": int((np.bincount(trace_no[nonempty], minlength=len(obs)) > 0).sum()),
           "groups": int((np.bincount(kd.group[nonempty], minlength=kd.U) > 0).sum())}
    sel = np.flatnonzero(nonempty)
    O_s, O_e, al_s, al_e = cat.O_s[sel], cat.O_e[sel], cat.alloc_s[sel], cat.alloc_e[sel]
    # launches whose records cover the whole allocation (up to the big pages lost records may hide)
    whole = (O_s <= al_s) & (O_e >= al_e) & _few_holes(kd, cat, sel, al_e - al_s)
    empty = np.flatnonzero(cat.valid & (cat.npieces == 0) & ~natural)
    rf = RegionFit(kd, w, obs, cat, fences, sel, natural[sel], whole, int(cat.npieces[sel].max()), fit, empty)
    region = None
    for attempt in CASCADE:
        region = attempt.run(rf)
        if region is not None:
            break
    region.fit = fit
    return region, sig, rf.shape, rf


def quieter(rf: RegionFit, region: Region) -> Region:
    """`region`, or where it names pages at more launches whose records show none in the word's
    part of the allocation than lost records explain (`RegionFit.hits`), the indexed region that
    predicts nothing there (`RegionFit.quiet_indexed`: a decode kernel's programs return at once
    for a prefill's rows, and a batch of prefills touches no query row), where one is found.
    Asked once the kernel's regions are settled (rows by position take a table's rows and
    filter from it: fit.index_rows.rows_of_tables)."""
    if rf.hits(region) <= rf.kd.allowed(len(rf.empty)) or rf.quiet_indexed() is None:
        return region
    rf.shape = None
    r = rf.take_indexed(QUIET)
    r.fit = rf.fit
    return r


def range_bounds(kd: KernelData, cat: RegionObs, sel: np.ndarray, nat: np.ndarray):
    """Byte bounds, relative to the base pointer, of where a region's first byte and its end lie at
    launches `sel` (module doc): (s_lo, s_hi, e_lo, e_hi). The inner sides (s_hi, e_lo) are the
    pages the records show touched; in natural mode the outer ones are the allocation's edges."""
    ps, bigp = kd.ps, kd.bigp
    O_s, O_e, A_s, A_e = cat.O_s[sel], cat.O_e[sel], cat.A_s[sel], cat.A_e[sel]
    I_s, I_e, base = cat.I_s[sel], cat.I_e[sel], cat.base[sel]
    sp_lo = np.where(nat, cat.alloc_s[sel], A_s)
    sp_hi = np.minimum((O_s // bigp) * bigp + bigp - 1, O_e - 1)
    sp_hi = np.where(I_s >= 0, np.minimum(sp_hi, I_s), sp_hi)
    ep_lo = np.maximum(((O_e - 1) // bigp) * bigp + 1, O_s + 1)
    ep_lo = np.where(I_e >= 0, np.maximum(ep_lo, I_e), ep_lo)
    ep_hi = np.where(nat, cat.alloc_e[sel], A_e)
    return sp_lo * ps - base, (sp_hi + 1) * ps - 1 - base, (ep_lo - 1) * ps + 1 - base, ep_hi * ps - base


def _mostly(kd: KernelData, ok: np.ndarray) -> bool:
    """All launches but the few lost records may leave unexplained."""
    return bool(len(ok)) and int((~ok).sum()) <= kd.allowed(len(ok))


def _hull_covered(kd: KernelData, cat: RegionObs, sel: np.ndarray) -> np.ndarray:
    """Per launch: the pages inside the hull of its observed pieces [O_s, O_e) that the records show
    touched, or migrated by the driver's prefetcher for that launch (A): a big page the prefetcher
    brought in before the kernel reached it cannot fault, so its missing fault is no hole
    (docs/template-model.md, 'Holes the prefetcher fills', has the measurement). Without prefetch
    migrations A is O, and this is the observed pieces' cover."""
    own, s, e = gather_pieces(kd, cat, sel, "A")
    s = np.maximum(s, cat.O_s[sel][own])
    e = np.minimum(e, cat.O_e[sel][own])
    return np.bincount(own, weights=np.clip(e - s, 0, None).astype(np.float64), minlength=len(sel))


def _few_holes(kd: KernelData, cat: RegionObs, sel: np.ndarray, span: np.ndarray) -> np.ndarray:
    """Per launch: do the observed pieces, with the big pages the driver prefetched inside their hull
    (`_hull_covered`), cover `span` pages (their hull), but for big pages whose records lost records
    may have taken (no more of them over all launches than that loss hides)?"""
    covered = _hull_covered(kd, cat, sel)
    holes = np.maximum(span - covered, 0) / kd.bigp
    if holes_from_loss(kd, holes[holes > 0], span):
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


def _history(kd: KernelData, obs: list[RegionObs], ps: int) -> list[list[int]]:
    """Pages an irregular region touched, relative to its allocation's first page (coarsened)."""
    ss, ee = [], []
    for (o, idx, _, _), ob in zip(kd.parts, obs):
        n = ob.npieces
        ri = _ranges(ob.r0, n)
        if len(ri) == 0:
            continue
        rel0 = np.repeat(ob.alloc_s, n)
        ss.append(np.maximum(o.os[ri], np.repeat(ob.lo_f, n)) - rel0)
        ee.append(np.minimum(o.oe[ri], np.repeat(ob.hi_f, n)) - rel0)
    if not ss:
        return []
    s, e = np.concatenate(ss), np.concatenate(ee)
    _, s, e = merge_intervals(np.zeros(len(s), np.int64), s, e, 1)
    s, e = coarsen_intervals(s, e, kd.params.history_intervals)
    return [[int(a), int(b)] for a, b in zip(s, e)]
