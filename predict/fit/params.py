"""Every threshold the template fitter decides with, in one place, with where each value comes from.

`fit_model(traces, params=FitParams())` takes them; the model file records the ones it was
fitted with (`"fit_params"`), so a model says how it was made. Model files written before this
object existed load without it (`FitParams.from_json(None)` gives the defaults).

How lost records are handled (docs/template-model.md, "Lost records"): a record is lost
independently at a rate q (CUPTI loses activity records when its buffers overflow and counts them
in the manifest's `dropped_records`). A touched big page goes unseen only when every record that
shows it is lost: its fault record and the coherence migration that covers it, q**2. A launch's
evidence contradicts the true template when its first or last touched big page went unseen, so
about 2*q**2 of launches per region; the fitter lets a template leave that many launches
unexplained (counted in the model's fit statistics), on top of a `floor_unexplained` share.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from statistics import NormalDist

import numpy as np

from pagecast.uvm import BIG_PAGE, VA_BLOCK

from ..observe import lone_records


@dataclass(frozen=True)
class FitParams:
    # -- the driver (docs/uvm-facts.md, "How the NVIDIA UVM driver behaves")
    big_page: int = BIG_PAGE
    """bytes the driver widens a fault to and migrates as one (64 KiB big pages)."""
    va_block: int = VA_BLOCK
    """the driver services faults per 2 MiB VA block and its migrations never cross one, so one
    migration record covers at most this many bytes of consecutive big pages."""

    # -- which parameter words are pointers and features
    pointer_share: float = 0.5
    """a word is a base pointer if it points into a live allocation in at least this share of the
    kernel's launches: a majority vote (a pointer argument may be null or stale now and then)."""
    max_varying: int = 12
    """at most this many varying features enter the products (12 give 454 products of up to three
    factors; the solver's pair and triple searches take the first 160 and 40 of them)."""
    max_const: int = 6
    """at most this many constant parameter words may multiply varying ones (`4*N*K` with K
    constant in training)."""
    max_search_groups: int = 256
    """feature groups the solver searches at once; the others verify and add their violators
    (a subsample of the extremes and an even spread; bounds the cost of a 10^6-launch fit)."""

    # -- evidence, lost records and what a template may leave unexplained
    assumed_loss: float = 0.05
    """record-loss rate assumed for a trace whose manifest does not count its dropped records and
    whose records give no estimate (no faults with coherence migrations to compare: `record_loss`):
    'up to a few percent', from CUPTI buffer overflows."""
    floor_unexplained: float = 0.01
    """share of a region's launches a template may leave unexplained whatever the loss: records
    the driver drops without counting (its fault buffer, ~0.1% in the workload models), records
    attributed by time to a neighbouring launch."""
    confidence: float = 0.999
    """a template may leave unexplained the launches that lost records would contradict up to
    this quantile of their (Poisson) count: 1 in 1000 true templates may still be refused (a
    model holds hundreds of regions; at 0.99 a few of them would be, with one launch of 30
    contradicting the template)."""

    # -- fault statistics (docs/template-model.md, "Fault statistics")
    stat_launches: int = 32
    """launches of one feature group with a fault in the region's first (last) big page before
    the faulting pages bound its start (end) tighter than the big page."""
    stat_slack_pages: int = 4
    """pages a region may end past the last faulting page seen (start before the first) in such a
    group: each big page faults at a touched page drawn at random, so with 32 launches the chance
    that all 32 fault pages land 5 or more pages short of the end of a 16-page big page is
    (11/16)**32 < 1e-5."""

    # -- choosing between formulas that all hold (docs/template-model.md, "Where the faults land")
    odds_per_term: float = 1e3
    """a formula with more terms (or its edges on the faulting pages) wins over a simpler one that
    also holds only when the faults are at least this much likelier under it (a likelihood ratio:
    each touched big page faults at a touched page drawn at random; 7 launches whose single
    fault lands on the page of the row they write, where the simpler formula spreads them over 3
    pages, reach it). The winner is always the tighter prediction: if it is wrong it misses
    pages, which fault feedback repairs, where the looser one over-predicts for good."""
    aligned_terms: int = 2
    """terms an edge placed on the faulting pages may have (an offset of one or two products of
    arguments: pos*row, batch*seq*row + pos*row); more would search every triple of products
    again for each region."""

    # -- shapes
    hull_gaps: float = 0.02
    """a region whose observed runs leave gaps under this share of their hull may be fitted as one
    range (chunks closer than a big page merge in fault data, so their gaps are slivers)."""
    strided_budget: float = 0.10
    """share of launches a strided count, start or stride may disagree with before verification
    decides (merged chunks show fewer runs than chunks; verification then checks every launch)."""
    simple_odd: int = 15
    """coefficients whose odd part is at most this are 'simple' (element sizes times dimensions:
    4, 1024, 3*2^k, 15*2^k); an odd part above it on a region that always covers its whole
    allocation means `allocation`, not a formula."""
    cv_max_launches: int = 20_000
    """kernels of at most this many launches are cross-validated across launch groups (two more
    fits, each of half the groups: `model.pinning`); larger ones keep the fit's cost at one fit."""
    history_intervals: int = 64
    """an irregular region stores at most this many page intervals of history (a model file
    stays small)."""

    # ---- derived
    def contradiction_rate(self, loss: float, edges=2):
        """Share of a region's launches whose evidence lost records contradict: any of its `edges`
        edge big pages (first and last of each run: 2 for one range, 2 per chunk seen of a
        strided region) unseen, each with probability loss**2 (module docstring)."""
        unseen = min(1.0, loss) ** 2
        return 1.0 - (1.0 - unseen) ** np.asarray(edges, np.float64)

    def allowed_unexplained(self, n: int, loss: float, edges=2) -> int:
        """How many of n launches a template may leave unexplained at this loss rate: the odd
        records of any trace (floor_unexplained) plus those lost records contradict (the
        `confidence` quantile of their Poisson count), two independent sources. `edges`: per
        launch (or for all) the edges its evidence has."""
        rate = self.contradiction_rate(loss, edges)
        expected = float(np.sum(rate)) if np.ndim(rate) else n * float(rate)
        return int(self.floor_unexplained * n) + poisson_quantile(expected, self.confidence)

    def allowed_holes(self, big_pages: int, loss: float) -> int:
        """Touched big pages a launch of `big_pages` may show no record of. A big page goes
        unseen when the migration over it and its own fault record are both lost; the lost
        migrations come in whole records of up to a VA block, so the holes cluster: count the
        lost migrations (Poisson over the launch's blocks), then the lost faults among the big
        pages they expose, each at this confidence."""
        q = min(1.0, loss)
        if q <= 0 or big_pages <= 0:
            return 0
        per_block = max(1, self.va_block // self.big_page)
        lost = poisson_quantile(-(-big_pages // per_block) * q, self.confidence)
        return poisson_quantile(min(big_pages, lost * per_block) * q, self.confidence)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d) -> "FitParams":
        """The parameters a model file records (unknown keys ignored, missing ones default;
        ValueError for a value of the wrong type)."""
        if d is None:
            return cls()
        if not isinstance(d, dict):
            raise ValueError("fit_params must be an object")
        kw = {}
        for f in fields(cls):
            if f.name not in d:
                continue
            v = d[f.name]
            want = float if f.type in ("float", float) else int
            if isinstance(v, bool) or not isinstance(v, (int, float)) or (want is int and not isinstance(v, int)) \
                    or not math.isfinite(v) or v < 0:
                raise ValueError(f"fit_params.{f.name} must be a non-negative {want.__name__}, found {v!r}")
            kw[f.name] = want(v)
        return cls(**kw)


def poisson_quantile(mean: float, p: float) -> int:
    """The smallest k with P(X <= k) >= p for X ~ Poisson(mean)."""
    if mean <= 0:
        return 0
    if mean > 50:   # normal approximation (exp(-mean) underflows long before counts get large)
        return int(math.ceil(mean + NormalDist().inv_cdf(p) * math.sqrt(mean)))
    term = math.exp(-mean)
    cdf, k = term, 0
    while cdf < p:
        k += 1
        term *= mean / k
        cdf += term
    return k


@dataclass(frozen=True)
class RecordLoss:
    """A trace's record-loss rate and where it came from: "manifest" (its dropped_records count),
    "estimated" (from its lone records, `observe.lone_records`) or "assumed"
    (`FitParams.assumed_loss`: the trace holds no fault with migrations to compare)."""

    rate: float
    source: str
    records: int = 0        # the records the rate was measured on

    def to_json(self) -> dict:
        return {"loss": round(self.rate, 6), "loss_source": self.source}


def record_loss(trace, params: FitParams) -> RecordLoss:
    """The share of fault and migration records a trace lost: its manifest's dropped_records over
    all the records it should hold, where counted; else estimated from the records themselves
    (faults without their migration, single-big-page migrations without their fault: each share
    estimates the rate, and the larger is taken, at its `confidence` upper bound); else (no
    faults and migrations to compare) params.assumed_loss."""
    d = trace.manifest.get("dropped_records")
    if not (isinstance(d, bool) or not isinstance(d, int) or d < 0):
        kept = trace.faults.num_rows + trace.migrations.num_rows
        return RecordLoss(d / (kept + d) if kept + d else 0.0, "manifest", kept + d)
    nf, lone_f, nm, lone_m = lone_records(trace, params.big_page)
    rates = [(poisson_quantile(k, params.confidence) / n, n) for k, n in ((lone_f, nf), (lone_m, nm)) if n]
    # a trace whose faults mostly lack migrations records no coherence migrations at all (a
    # recorder that leaves them out): nothing to estimate from
    if not rates or nm == 0 or lone_f > nf / 2:
        return RecordLoss(params.assumed_loss, "assumed")
    rate, n = max(rates)
    return RecordLoss(min(rate, 1.0), "estimated", nf + nm)


def trace_loss(trace, params: FitParams) -> float:
    """`record_loss(trace, params).rate`."""
    return record_loss(trace, params).rate
