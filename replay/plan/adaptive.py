"""The template policy's predictions: the model's templates plus an adaptive fallback.

The predictor's `history` fallback predicts, for a kernel it cannot model
(data-dependent MoE expert routing, embedding lookups, pointer chasing), the
union of the pages earlier launches of that kernel touched in each
allocation. Where the accesses really are data dependent that union grows to
the whole table while each launch reads a few rows of it: prefetching it moves
and keeps resident mostly memory that is never used, and under
oversubscription it evicts what the next launches need. MSched falls back to
demand paging for such kernels.

`adaptive` keeps the history prediction of a kernel only while it has proven
precise: for each launch, over the *earlier* launches of the same kernel that
had a fallback prediction, the share of the fallback's extra pages (history
minus templates) that those launches really touched must be at least
`min_precision`. Otherwise the launch gets the templates' prediction alone and
the rest of its footprint faults in, as under demand paging.

Information used: the same records the history fallback itself reads -- the
pages earlier launches of the kernel touched, as the replayed trace observed
them (faults and coherence migrations; `observed_footprints`, never the
truth table), and nothing of the launch being predicted. A runner on a real
GPU sees only the faults of what it did not prefetch, not whether a
prefetched page was used; it can apply the same rule to launches it runs
without the fallback (their faults are their footprint beyond what was
resident), which is where this rule sends every kernel whose history has not
proven precise.
"""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc

from pagecast import footprints as F
from pagecast import trace as T
from pagecast.memory import release_arrow_memory
from pagecast.predict.features import release_views
from pagecast.predict.predictor import Gates, predict_footprints, predict_gated

MIN_PRECISION = 0.5   # keep a kernel's history while at least half of what it adds is used
FALLBACKS = ("adaptive", "history", "allocation", "none")


def predicted_footprints(model, trace: T.Trace, fallback: str = "adaptive",
                         min_precision: float = MIN_PRECISION) -> F.Footprints:
    """Predicted footprints of every launch for planning (see module doc)."""
    if fallback != "adaptive":
        return predict_footprints(model, trace, fallback)
    base = predict_footprints(model, trace, "none")
    hist = predict_footprints(model, trace, "history")
    keep = _keep_history(trace, base, hist, min_precision)
    return base if keep is None else _combine(trace, hist, base, keep)


def predicted_gated(model, trace: T.Trace, fallback: str = "adaptive",
                    min_precision: float = MIN_PRECISION) -> tuple[F.Footprints, Gates]:
    """predicted_footprints, and the pieces of it that index values chose with the launch after
    which their values exist (predict.predictor.Gates; its `plain`: the rest, by the same rule)."""
    fp, g = _predicted_gated(model, trace, fallback, min_precision)
    # the predictions read the trace's index values and records through pyarrow; the views of its
    # tables they kept, and what its pool freed, go back before the planner's per-use arrays are made
    # (pagecast/memory.py)
    release_views()
    release_arrow_memory()
    return fp, g


def _predicted_gated(model, trace, fallback, min_precision):
    if fallback != "adaptive":
        fp, g, _ = predict_gated(model, trace, fallback)
        return fp, g
    base, g, _ = predict_gated(model, trace, "none")
    if not len(g.launch):
        g = Gates.empty(base)
    hist = predict_footprints(model, trace, "history")
    keep = _keep_history(trace, base, hist, min_precision)
    if keep is None:
        return base, g
    fp = _combine(trace, hist, base, keep)
    g.plain = _combine(trace, hist, g.plain, keep) if g.plain is not None else fp
    return fp, g


def _keep_history(trace, base, hist, min_precision):
    """Per launch, whether the history fallback's prediction is kept (None: for none)."""
    extra = hist.pages_per_launch() - base.pages_per_launch()
    asks = extra > 0
    if not asks.any():
        return None
    obs = F.observed_footprints(trace)
    used = F.intersection_pages(hist, obs) - F.intersection_pages(base, obs)
    keep = _proven(pc.dictionary_encode(trace.launches.column(T.KERNEL)).combine_chunks().indices
                   .to_numpy(zero_copy_only=False).astype(np.int64), asks, extra, used, min_precision)
    return keep if keep.any() else None


def _combine(trace, hist, base, keep):
    """hist's intervals for the launches `keep` marks, base's for the rest."""
    take_h = keep[hist.launch_of_interval()]
    take_b = ~keep[base.launch_of_interval()]
    return F.Footprints.from_intervals(
        np.concatenate([hist.launch_of_interval()[take_h], base.launch_of_interval()[take_b]]),
        np.concatenate([hist.start[take_h], base.start[take_b]]),
        np.concatenate([hist.end[take_h], base.end[take_b]]),
        trace.n_launches, trace.page_size, "predicted")


def _proven(kernel: np.ndarray, asks: np.ndarray, extra: np.ndarray, used: np.ndarray,
            min_precision: float) -> np.ndarray:
    """Per launch: do the earlier asking launches of its kernel show the fallback precise enough?"""
    n = len(kernel)
    idx = np.flatnonzero(asks)
    order = idx[np.lexsort((idx, kernel[idx]))]   # by kernel, then launch order
    k = kernel[order]
    ex = extra[order].astype(np.float64)
    us = np.maximum(used[order], 0).astype(np.float64)
    cex = np.cumsum(ex) - ex                         # exclusive running sums ...
    cus = np.cumsum(us) - us
    first = np.r_[True, k[1:] != k[:-1]]
    gstart = np.maximum.accumulate(np.where(first, np.arange(len(k)), 0))
    cex -= cex[gstart]                               # ... within each kernel
    cus -= cus[gstart]
    ok = (cex > 0) & (cus >= min_precision * cex)
    out = np.zeros(n, bool)
    out[order] = ok
    return out
