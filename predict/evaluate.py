"""Precision and recall of a model's predictions against a trace's footprints.

Footprints come from truth where the trace has it, else from the observed
faults (`pagecast.footprints.footprints`). Byte-weighted: intersections and
sizes are summed over launches before dividing (trace-format.md).
"""

from __future__ import annotations

import numpy as np

from pagecast import footprints as FP
from pagecast import trace as T

from .features import kernel_groups
from .model_io import CLASSES, Model
from .predictor import _check_fallback, allocation_footprints, predict_with_unseen


def _stats(inter: np.ndarray, pred: np.ndarray, foot: np.ndarray, ps: int, launches: int) -> dict:
    i, p, f = int(inter.sum()), int(pred.sum()), int(foot.sum())
    return {"precision": (i / p) if p else (1.0 if f == 0 else 0.0),
            "recall": (i / f) if f else 1.0,
            "predicted_bytes": p * ps, "footprint_bytes": f * ps, "launches": int(launches)}


def evaluate(model: Model, trace: T.Trace, fallback: str = "history") -> dict:
    """cli.md's `evaluate --json` document, plus by_class, baseline and unseen."""
    _check_fallback(fallback)
    ps = trace.page_size
    truth = FP.footprints(trace)
    pred, unseen = predict_with_unseen(model, trace, fallback)
    inter = FP.intersection_pages(pred, truth)
    pp, fp = pred.pages_per_launch(), truth.pages_per_launch()
    names, codes, groups = kernel_groups(trace.launches)
    kernels = []
    for k, (name, idx) in enumerate(zip(names, groups)):
        km = model.kernels.get(name)
        s = _stats(inter[idx], pp[idx], fp[idx], ps, len(idx))
        templates = km.classes if km is not None else ["unseen"]
        kernels.append({"kernel": name, "templates": templates, "launches": s.pop("launches"),
                        "class": km.cls if km is not None else "unseen", **s})
    kernels.sort(key=lambda d: -d["footprint_bytes"])
    overall = _stats(inter, pp, fp, ps, trace.n_launches)
    # per class: a kernel counts under its summary class (its most demanding region)
    by_class = {}
    klass = np.array([(model.kernels[n].cls if n in model.kernels else "unseen") for n in names] or [""],
                     dtype=object)
    lcls = klass[codes] if len(codes) else np.zeros(0, dtype=object)
    for c in (*CLASSES, "unseen"):
        m = lcls == c
        if m.any():
            d = _stats(inter[m], pp[m], fp[m], ps, int(m.sum()))
            d["kernels"] = int(sum(1 for n in names if (model.kernels[n].cls if n in model.kernels else "unseen") == c))
            by_class[c] = d
    # over the kernels whose footprint the arguments determine (no irregular or indexed region, seen),
    # and those whose footprint index values determine (an indexed region, none irregular)
    det = np.array([n in model.kernels and model.kernels[n].cls not in ("irregular", "indexed") for n in names]
                   or [False])
    dm = det[codes] if len(codes) else np.zeros(0, bool)
    determined = _stats(inter[dm], pp[dm], fp[dm], ps, int(dm.sum()))
    ix = np.array([n in model.kernels and model.kernels[n].cls == "indexed" for n in names] or [False])
    im = ix[codes] if len(codes) else np.zeros(0, bool)
    indexed = _stats(inter[im], pp[im], fp[im], ps, int(im.sum()))
    base = allocation_footprints(trace)
    binter = FP.intersection_pages(base, truth)
    baseline = _stats(binter, base.pages_per_launch(), fp, ps, trace.n_launches)
    baseline["name"] = "allocation"
    bk = {}
    bpp = base.pages_per_launch()
    for name, idx in zip(names, groups):
        bk[name] = _stats(binter[idx], bpp[idx], fp[idx], ps, len(idx))["precision"]
    for d in kernels:
        d["baseline_precision"] = bk[d["kernel"]]
    un = _stats(inter[unseen], pp[unseen], fp[unseen], ps, int(unseen.sum()))
    un["kernels"] = sorted({names[c] for c in np.unique(codes[unseen])}) if unseen.any() else []
    un["fallback"] = fallback
    return {"overall": overall, "kernels": kernels, "by_class": by_class, "determined": determined,
            "indexed": indexed,
            "baseline": baseline, "unseen": un, "fallback": fallback,
            "footprint_source": truth.source, "trace": str(trace.path)}
