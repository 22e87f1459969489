"""Precision and recall of a model's predictions against a trace's footprints.

Footprints come from truth where the trace has it, else from the observed
faults (`pagecast.footprints.footprints`). Byte-weighted: intersections and
sizes are summed over launches before dividing (trace-format.md).

Beside precision and recall, each kernel says how many launches its template leaves
unexplained: in the traces it was fitted on (the model's fit statistics, where lost or odd
records contradicted the template, `unexplained_in_fit`), and in this trace (launches with a
fault record on a page the prediction does not hold, `launches_with_misses`), and how well the
fitting profile pinned its templates down (`pinned`: launch groups, split-half cross-validation,
arguments no launch varied).
"""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc

from pagecast import footprints as FP
from pagecast import trace as T

from pagecast.errors import UsageError

from .breakdown import buffer_breakdown
from .features import kernel_groups
from .model_io import ARGUMENT_CLASSES, CLASSES, Model
from .observe import _inside
from .predictor import _check_fallback, allocation_footprints, predict_with_unseen


def _stats(inter: np.ndarray, pred: np.ndarray, foot: np.ndarray, ps: int, launches: int) -> dict:
    i, p, f = int(inter.sum()), int(pred.sum()), int(foot.sum())
    return {"precision": (i / p) if p else (1.0 if f == 0 else 0.0),
            "recall": (i / f) if f else 1.0,
            "predicted_bytes": p * ps, "footprint_bytes": f * ps, "launches": int(launches)}


def _unexplained(km) -> int:
    """Launches of the fitting traces the kernel's template left unexplained (the most of any of
    its regions: one launch may be unexplained in several)."""
    if km is None:
        return 0
    return max([int(r.fit.get("unexplained", 0)) for r in km.regions
                if isinstance(r.fit, dict) and isinstance(r.fit.get("unexplained", 0), int)] or [0])


def _launches_with_misses(trace: T.Trace, pred: FP.Footprints) -> np.ndarray:
    """Per launch: does a fault record of it land on a page the prediction does not hold?"""

    f = trace.faults
    out = np.zeros(trace.n_launches, bool)
    if not f.num_rows:
        return out
    f = f.filter(pc.not_equal(f.column(T.ACCESS), "prefetch"))
    lid = FP.attribute_by_time(trace, f.column(T.LAUNCH_ID), f.column(T.TIME_NS))
    page = (f.column(T.ADDRESS).to_numpy().astype(np.uint64) // np.uint64(trace.page_size)).astype(np.int64)
    ok = lid >= 0
    miss = ok & ~_inside(pred, lid, page)
    out[lid[miss]] = True
    return out


def evaluate(model: Model, trace: T.Trace, fallback: str = "history", kernel: str | None = None) -> dict:
    """cli.md's `evaluate --json` document, plus by_class, baseline and unseen; with `kernel`, also
    `buffers`: that kernel's pages split by the buffer they lie in (predict/breakdown.py)."""
    _check_fallback(fallback)
    if kernel is not None and kernel not in model.kernels:
        raise UsageError(f"no kernel {kernel!r} in the model (pagecast evaluate lists its kernels)")
    names, codes, groups = kernel_groups(trace.launches)
    if kernel is not None and kernel not in names:
        raise UsageError(f"{trace.path}: kernel {kernel!r} never runs in this trace")
    ps = trace.page_size
    truth = FP.footprints(trace)
    ix_stats: dict = {}
    pred, unseen = predict_with_unseen(model, trace, fallback, ix_stats)
    inter = FP.intersection_pages(pred, truth)
    pp, fp = pred.pages_per_launch(), truth.pages_per_launch()
    # launches cut off while they ran (manifest partial_launches) count nowhere: their footprint is partial
    whole = trace.whole_launches()
    if not whole.all():
        inter, pp, fp = (np.where(whole, a, 0) for a in (inter, pp, fp))
        groups = [g[whole[g]] for g in groups]
    kernels = []
    for k, (name, idx) in enumerate(zip(names, groups)):
        km = model.kernels.get(name)
        s = _stats(inter[idx], pp[idx], fp[idx], ps, len(idx))
        templates = km.classes if km is not None else ["unseen"]
        kernels.append({"kernel": name, "templates": templates, "launches": s.pop("launches"),
                        "class": km.cls if km is not None else "unseen", **s})
    missed = _launches_with_misses(trace, pred)
    for d, idx in zip(kernels, groups):
        km = model.kernels.get(d["kernel"])
        d["unexplained_in_fit"] = _unexplained(km)
        d["fit_launches"] = int(km.launches) if km is not None else 0
        d["launches_with_misses"] = int(missed[idx].sum())
        # how well the fitting profile pinned its templates down (model_io.Pinning; None: not assessed)
        d["pinned"] = km.pinned.to_json() if km is not None and km.pinned is not None else None
    kernels.sort(key=lambda d: -d["footprint_bytes"])
    overall = _stats(inter, pp, fp, ps, int(whole.sum()))
    # per class: a kernel counts under its summary class (its most demanding region)
    by_class = {}
    klass = np.array([(model.kernels[n].cls if n in model.kernels else "unseen") for n in names] or [""],
                     dtype=object)
    lcls = klass[codes] if len(codes) else np.zeros(0, dtype=object)
    for c in (*CLASSES, "unseen"):
        m = (lcls == c) & whole
        if m.any():
            d = _stats(inter[m], pp[m], fp[m], ps, int(m.sum()))
            d["kernels"] = int(sum(1 for n in names if (model.kernels[n].cls if n in model.kernels else "unseen") == c))
            by_class[c] = d
    # over the kernels whose footprint the arguments determine (no irregular, indexed or unresolved
    # region, seen),
    # and those whose footprint index values determine (an indexed region, none irregular)
    det = np.array([n in model.kernels and model.kernels[n].cls in ARGUMENT_CLASSES for n in names]
                   or [False])
    dm = (det[codes] if len(codes) else np.zeros(0, bool)) & whole
    determined = _stats(inter[dm], pp[dm], fp[dm], ps, int(dm.sum()))
    ix = np.array([n in model.kernels and model.kernels[n].cls == "indexed" for n in names] or [False])
    im = (ix[codes] if len(codes) else np.zeros(0, bool)) & whole
    indexed = _stats(inter[im], pp[im], fp[im], ps, int(im.sum()))
    # the indexed regions' launches without recorded values (given the fallback), values the count
    # asked for past the end of their row, values whose chunk named no page of the allocation
    indexed["values"] = {k: int(v) for k, v in ix_stats.items()}
    base = allocation_footprints(trace)
    binter = FP.intersection_pages(base, truth)
    binter, bpp = np.where(whole, binter, 0), np.where(whole, base.pages_per_launch(), 0)
    baseline = _stats(binter, bpp, fp, ps, int(whole.sum()))
    baseline["name"] = "allocation"
    bk = {}
    for name, idx in zip(names, groups):
        bk[name] = _stats(binter[idx], bpp[idx], fp[idx], ps, len(idx))["precision"]
    for d in kernels:
        d["baseline_precision"] = bk[d["kernel"]]
    unseen = unseen & whole
    un = _stats(inter[unseen], pp[unseen], fp[unseen], ps, int(unseen.sum()))
    un["kernels"] = sorted({names[c] for c in np.unique(codes[unseen])}) if unseen.any() else []
    un["fallback"] = fallback
    overall["unexplained_in_fit"] = sum(d["unexplained_in_fit"] for d in kernels)
    overall["launches_with_misses"] = int(missed[whole].sum())
    overall["partial_launches_left_out"] = int((~whole).sum())
    if truth.source == "observed":
        # with the driver's prefetcher on, faults show part of what a launch touched: the precision
        # lies between the one above and the share of predicted pages the records allow at all
        possible = FP.possible_footprints(trace)
        pinter = np.where(whole, FP.intersection_pages(pred, possible), 0)
        if int(pinter.sum()) > int(inter.sum()):
            overall["precision_at_most"] = float(pinter.sum() / max(int(pp.sum()), 1))
            for d, idx in zip(kernels, groups):
                d["precision_at_most"] = float(pinter[idx].sum() / max(int(pp[idx].sum()), 1))
            bp = np.where(whole, FP.intersection_pages(base, possible), 0)
            baseline["precision_at_most"] = float(bp.sum() / max(int(bpp.sum()), 1))
    doc = {"overall": overall, "kernels": kernels, "by_class": by_class, "determined": determined,
            "indexed": indexed,
            "baseline": baseline, "unseen": un, "fallback": fallback,
            "footprint_source": truth.source, "trace": str(trace.path)}
    if kernel is not None:
        idx = groups[names.index(kernel)]
        rows = []
        for b in buffer_breakdown(trace, model.kernels[kernel], idx, pred, truth):
            s = _stats(np.array([b.hit_pages]), np.array([b.predicted_pages]), np.array([b.footprint_pages]), ps,
                       b.launches)
            rows.append({"words": b.words, "templates": b.templates, **s, "false_bytes": b.false_pages * ps,
                         "missed_bytes": b.missed_pages * ps})
        doc["buffers"] = {"kernel": kernel, "launches": int(len(idx)), "page_size": ps, "rows": rows}
    return doc
