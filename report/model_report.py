"""Sections of the model report: how well a fitted model predicts a trace's footprints.

Uses the predictor only through its public seams: `model_io.load_model`,
`evaluate.evaluate(model, trace, fallback)` (cli.md's evaluate JSON plus
`by_class`, `baseline` and `unseen`) and `predictor.predict_footprints`.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from pagecast.predict.evaluate import evaluate
from pagecast.predict.model_io import CLASSES, load_model
from pagecast.predict.predictor import predict_footprints

from pagecast import trace as T
from pagecast.demangle import base_name, demangle
from pagecast.footprints import Footprints, footprints, intersection_pages, merge_intervals
from pagecast.units import format_size

from .page import FIG_W, PALETTE, Section, esc, figure, setup_matplotlib, short
from .trace_report import kernel_codes, size_unit

FALLBACK = "history"
TOP_KERNELS = 20
WORST_KERNELS = 10
EXAMPLE_LAUNCHES = 4
# the model file's classes in their order, then kernels the model has not seen
CLASS_ORDER = [*CLASSES, "unseen"]
C_PREC, C_REC, C_BASE = PALETTE[0], PALETTE[2], "#999999"
C_HIT, C_MISS, C_EXTRA = "#2ca02c", "#e3120b", "#ffb000"


def _num(v) -> float | None:
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _pct(v) -> str:
    f = _num(v)
    return "—" if f is None else f"{100 * f:.2f}%"


def _entries(obj, key: str = "class") -> list[dict]:
    """by_class / baseline sub-documents as a list of dicts with `key`, whether given as dict or list."""
    if obj is None:
        return []
    if isinstance(obj, dict):
        return [dict(v, **{key: k}) for k, v in obj.items() if isinstance(v, dict)]
    if isinstance(obj, list):
        return [dict(v) for v in obj if isinstance(v, dict)]
    return []


def _baseline_overall(ev: dict) -> dict | None:
    b = ev.get("baseline")
    if not isinstance(b, dict):
        return None
    if "overall" in b and isinstance(b["overall"], dict):
        return b["overall"]
    return b if "precision" in b or "recall" in b else None


def _baseline_kernels(ev: dict) -> dict[str, dict]:
    b = ev.get("baseline")
    if isinstance(b, dict) and isinstance(b.get("kernels"), list):
        return {k.get("kernel"): k for k in b["kernels"] if isinstance(k, dict)}
    if isinstance(b, dict) and isinstance(b.get("kernels"), dict):
        return {k: v for k, v in b["kernels"].items() if isinstance(v, dict)}
    return {}


def _missed_extra(k: dict) -> tuple[float, float]:
    p, r = _num(k.get("precision")), _num(k.get("recall"))
    fb, pb = float(k.get("footprint_bytes") or 0), float(k.get("predicted_bytes") or 0)
    missed = fb * (1 - r) if r is not None else fb
    extra = pb * (1 - p) if p is not None else 0.0
    return missed, extra


def per_kernel_plot(ev: dict, kernels: list[dict]):
    plt = setup_matplotlib()
    top = sorted(kernels, key=lambda k: -(k.get("footprint_bytes") or 0))[:TOP_KERNELS]
    bk = _baseline_kernels(ev)
    bo = _baseline_overall(ev)
    fig, ax = plt.subplots(figsize=(FIG_W, 1.2 + 0.42 * max(len(top), 1)))
    y = np.arange(len(top))[::-1].astype(float)
    h = 0.27
    prec = [(_num(k.get("precision")) or 0) * 100 for k in top]
    rec = [(_num(k.get("recall")) or 0) * 100 for k in top]
    ax.barh(y + h, prec, h, color=C_PREC, label="precision (template model)")
    ax.barh(y, rec, h, color=C_REC, label="recall (template model)")
    if any(_num(k.get("baseline_precision")) is not None for k in top):
        bp = [(_num(k.get("baseline_precision")) or 0) * 100 for k in top]
        ax.barh(y - h, bp, h, color=C_BASE, label="precision (allocation baseline)")
    elif bk:
        bp = [(_num(bk.get(k["kernel"], {}).get("precision")) or 0) * 100 for k in top]
        ax.barh(y - h, bp, h, color=C_BASE, label="precision (allocation baseline)")
    elif bo is not None and _num(bo.get("precision")) is not None:
        ax.axvline(100 * _num(bo["precision"]), color=C_BASE, ls="--", lw=1.2,
                   label="allocation baseline precision (all kernels)")
    labels = [f"{short(base_name(k['kernel']), 34)} [{'/'.join(k.get('templates') or []) or '?'}]" for k in top]
    ax.set_yticks(y, labels, fontsize=7.5)
    ax.set_xlim(0, 145)   # room on the right for the legend: bars end at 100
    ax.set_xticks([0, 20, 40, 60, 80, 100])
    ax.set_xlabel("precision and recall (% of bytes)")
    ax.set_ylabel("kernel [template classes]")
    ax.set_title(f"Precision and recall per kernel (top {len(top)} by footprint)")
    ax.legend(loc="lower right", fontsize=7)
    return figure(fig, "Precision and recall per kernel",
                  "Bars short of 100% mark kernels whose templates miss pages (low recall: faults remain) or "
                  "over-fetch (low precision: wasted transfers); the grey baseline shows how much whole-allocation "
                  "prefetching over-fetches.")


def per_class_plot(ev: dict):
    plt = setup_matplotlib()
    classes = _entries(ev.get("by_class"), "class")
    classes.sort(key=lambda c: CLASS_ORDER.index(c["class"]) if c["class"] in CLASS_ORDER else 99)
    bo = _baseline_overall(ev)
    ov = ev.get("overall") or {}
    groups = [("all (model)", ov)] + [(c["class"], c) for c in classes]
    if bo is not None:
        groups.append(("allocation baseline", bo))
    fig, ax = plt.subplots(figsize=(FIG_W, 4.2))
    x = np.arange(len(groups))
    w = 0.38
    p = [(_num(g.get("precision")) or 0) * 100 for _, g in groups]
    r = [(_num(g.get("recall")) or 0) * 100 for _, g in groups]
    b1 = ax.bar(x - w / 2, p, w, color=C_PREC, label="precision")
    b2 = ax.bar(x + w / 2, r, w, color=C_REC, label="recall")
    if bo is not None:
        b1[-1].set_color(C_BASE)
        b2[-1].set_color("#cccccc")
    for xi, (pi, ri) in enumerate(zip(p, r)):
        ax.text(xi - w / 2, pi + 1, f"{pi:.1f}", ha="center", fontsize=7)
        ax.text(xi + w / 2, ri + 1, f"{ri:.1f}", ha="center", fontsize=7)
    labels = []
    for name, g in groups:
        n, nk = g.get("launches"), g.get("kernels")
        lab = name
        if isinstance(nk, int) and not isinstance(nk, bool):
            lab += f"\n{nk} kernel{'s' if nk != 1 else ''}"
        if isinstance(n, int) and not isinstance(n, bool):
            lab += f"\n{n:,} launches"
        labels.append(lab)
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylim(0, 112)
    ax.set_ylabel("precision / recall (% of bytes)")
    ax.set_xlabel("template class")
    ax.set_title("Precision and recall per template class, beside the allocation baseline")
    ax.legend(loc="lower left")
    return figure(fig, "Precision and recall per template class",
                  "fixed, linear and strided templates should be near 100% on both; the allocation baseline keeps "
                  "recall high but its precision shows how many bytes whole-allocation prefetching wastes.")


def _set_ops(a_s, a_e, b_s, b_e):
    """Elementary segments of two interval sets: (start, end, in_a, in_b) for the union's pieces."""
    edges = np.unique(np.concatenate([a_s, a_e, b_s, b_e]))
    if len(edges) < 2:
        z = np.zeros(0, np.int64)
        return z, z, z.astype(bool), z.astype(bool)
    s, e = edges[:-1], edges[1:]

    def member(xs, xe, pts):
        k = np.searchsorted(xs, pts, side="right") - 1
        return (k >= 0) & (pts < xe[np.maximum(k, 0)]) if len(xs) else np.zeros(len(pts), bool)

    ia, ib = member(a_s, a_e, s), member(b_s, b_e, s)
    keep = ia | ib
    return s[keep], e[keep], ia[keep], ib[keep]


def pick_launches(trace: T.Trace, truth: Footprints, pred: Footprints, worst: list[str], n: int) -> list[int]:
    """A few launches worth looking at: the worst launch of each worst kernel, then the biggest."""
    inter = intersection_pages(truth, pred)
    tp, pp = truth.pages_per_launch(), pred.pages_per_launch()
    wrong = (tp - inter) + (pp - inter)
    names, codes = kernel_codes(trace)
    code_of = {str(nm): i for i, nm in enumerate(names)}
    out: list[int] = []
    for k in worst:
        c = code_of.get(k)
        if c is None:
            continue
        ids = np.flatnonzero(codes == c)
        if len(ids) and wrong[ids].max() > 0:
            out.append(int(ids[np.argmax(wrong[ids])]))
        if len(out) >= n:
            return out
    for i in np.argsort(-tp, kind="stable"):
        if len(out) >= n:
            break
        if int(i) not in out and tp[i] > 0:
            # one launch per kernel
            if codes[i] not in {codes[j] for j in out}:
                out.append(int(i))
    return out[:n]


def footprint_picture(trace: T.Trace, truth: Footprints, pred: Footprints, launches: list[int]):
    """One panel per launch: footprint and prediction on an axis made of the pieces either of them covers
    (in address order, the gaps between them removed, a dashed line where a gap was)."""
    plt = setup_matplotlib()
    ps = trace.page_size
    names, codes = kernel_codes(trace)
    n = max(len(launches), 1)
    fig, axes = plt.subplots(n, 1, figsize=(FIG_W, 0.7 + 1.3 * n), squeeze=False)
    for ax, lid in zip(axes[:, 0], launches):
        ts, te = truth.of(lid)
        qs, qe = pred.of(lid)
        s, e, in_t, in_p = _set_ops(ts, te, qs, qe)
        tpg, ppg = int((te - ts).sum()), int((qe - qs).sum())
        hit = int(((e - s)[in_t & in_p]).sum()) if len(s) else 0
        # the launch's own axis: union pieces stacked
        _, us, ue = merge_intervals(np.zeros(len(s), np.int64), s, e, 1)
        off = np.concatenate([[0], np.cumsum(ue - us)]).astype(np.int64)
        k = np.searchsorted(us, s, side="right") - 1
        xs = off[k] + (s - us[k]) if len(s) else np.zeros(0, np.int64)
        width = e - s
        total = max(int(off[-1]), 1)
        div, unit = size_unit(total * ps)
        scale = ps / div
        for row, member in ((1, in_t), (0, in_p)):
            for cls, colour in (("hit", C_HIT), ("miss", C_MISS), ("extra", C_EXTRA)):
                sel = member & ((in_t & in_p) if cls == "hit" else (in_t & ~in_p) if cls == "miss" else (~in_t & in_p))
                if sel.any():
                    ax.broken_barh(list(zip(xs[sel] * scale, np.maximum(width[sel] * scale, total * scale / 600))),
                                   (row - 0.35, 0.7), facecolors=colour, lw=0)
        for j, b in enumerate(off[1:-1]):
            ax.axvline(b * scale, color="#555", ls="--", lw=0.7)
        for j in range(len(us)):
            if (ue[j] - us[j]) >= 0.12 * total:   # label pieces wide enough to carry one
                ax.text(off[j] * scale, 1.45, f" 0x{int(us[j]) * ps:x}", fontsize=6.5, color="#555", va="bottom")
        prec = f"{100 * hit / ppg:.1f}%" if ppg else "—"
        rec = f"{100 * hit / tpg:.1f}%" if tpg else "—"
        ax.set_yticks([0, 1], ["predicted", "footprint"], fontsize=8)
        ax.set_ylim(-0.6, 1.9)
        ax.set_xlim(0, total * scale)
        ax.set_title(f"launch {lid}: {short(base_name(names[codes[lid]]), 50)} — footprint {format_size(tpg * ps)}, "
                     f"predicted {format_size(ppg * ps)}, precision {prec}, recall {rec}", fontsize=9, loc="left")
        ax.set_xlabel(f"{unit} of address space this launch touched or was predicted to touch "
                      "(pieces in address order; dashed = gap removed)", fontsize=8)
        ax.grid(axis="y", visible=False)
    from matplotlib.patches import Patch
    fig.suptitle("Predicted against observed footprint for a few launches", fontweight="bold")
    fig.legend(handles=[Patch(color=C_HIT, label="predicted and touched"),
                        Patch(color=C_MISS, label="touched, not predicted (would fault)"),
                        Patch(color=C_EXTRA, label="predicted, not touched (wasted transfer)")],
               loc="lower center", ncol=3, bbox_to_anchor=(0.5, -0.02), frameon=False)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return figure(fig, "Predicted against observed footprint",
                  "Green is right; red pages would still fault (a template too small or a missed region), orange "
                  "pages would be moved for nothing (a template too large).")


def _pinned(km) -> str:
    """How well the fitting profile pinned the kernel's templates down (model_io.Pinning)."""
    if km is None or km.pinned is None:
        return "—"
    return ("yes: " if km.pinned.pinned else "no: ") + km.pinned.text()


def model_sections(model_path: Path, trace: T.Trace) -> list[Section]:

    model = load_model(model_path)
    ev = evaluate(model, trace, fallback=FALLBACK)
    ov = ev.get("overall") or {}
    kernels = [k for k in ev.get("kernels") or [] if isinstance(k, dict)]
    bo = _baseline_overall(ev)
    unseen = ev.get("unseen")

    summ = Section("Prediction accuracy", anchor="accuracy",
                   intro=f"How well the model's templates predict each launch's footprint in this trace, in pages "
                         f"weighted by bytes (precision = predicted and touched / predicted; recall = predicted and "
                         f"touched / touched). Irregular and unseen kernels use the '{FALLBACK}' fallback. "
                         f"Footprints come from the trace's "
                         f"{'truth table' if trace.truth is not None else 'observed faults'}.")
    nums = [("precision", _pct(ov.get("precision"))), ("recall", _pct(ov.get("recall"))),
            ("predicted", format_size(ov.get("predicted_bytes") or 0)),
            ("footprint", format_size(ov.get("footprint_bytes") or 0)),
            ("launches", f"{ov.get('launches', trace.n_launches):,}"),
            ("kernels in model", f"{len(model.kernels):,}")]
    if bo is not None:
        nums += [("allocation baseline precision", _pct(bo.get("precision"))),
                 ("allocation baseline recall", _pct(bo.get("recall"))),
                 ("allocation baseline predicted", format_size(bo.get("predicted_bytes") or 0))]
    det = ev.get("determined")
    if isinstance(det, dict) and det.get("launches"):
        nums += [("precision, argument-determined kernels", _pct(det.get("precision"))),
                 ("recall, argument-determined kernels", _pct(det.get("recall")))]
    summ.add_numbers(nums)
    if isinstance(unseen, dict):
        u = unseen.get("kernels")
        ul = unseen.get("launches")
        if u or ul:
            summ.add_text(f"Kernels of this trace the model has not seen: {u if not isinstance(u, list) else len(u)}"
                          + (f" ({ul:,} launches)" if isinstance(ul, int) else "") + ".", "note")
    elif isinstance(unseen, list) and unseen:
        summ.add_text(f"Kernels of this trace the model has not seen: {len(unseen)}.", "note")
    summ.add_figure(per_class_plot(ev))
    summ.add_figure(per_kernel_plot(ev, kernels))

    worst_sec = Section("Worst-predicted kernels", anchor="worst",
                        intro="Kernels ordered by bytes predicted wrongly (missed plus over-fetched), with the "
                              "formulas the model learned for them: each region is [base + start, base + end) in "
                              "bytes, where pN is the N-th parameter word and grid/block are the launch configuration.")
    ranked = sorted(kernels, key=lambda k: -sum(_missed_extra(k)))
    worst = [k for k in ranked if sum(_missed_extra(k)) > 0][:WORST_KERNELS]
    rows = []
    for k in worst:
        km = model.kernels.get(k["kernel"])
        formulas = "; ".join(r.text() for r in km.regions) if km is not None and km.regions else (
            "(not in the model: unseen kernel)" if km is None else (km.note or "no regions"))
        missed, extra = _missed_extra(k)
        rows.append((k["kernel"], "/".join(k.get("templates") or []) or "—", f"{k.get('launches', 0):,}",
                     _pct(k.get("precision")), _pct(k.get("recall")), format_size(missed), format_size(extra),
                     formulas))
    if rows:
        worst_sec.add_table(["kernel", "class", "launches", "precision", "recall", "missed", "over-fetched",
                             "formulas"], _demangled(rows), numeric=[False, False, True, True, True, True, True, False],
                            code_cols=(0, 7))
        loose = [(k[0], _pinned(model.kernels.get(k[0]))) for k in rows
                 if model.kernels.get(k[0]) is not None and model.kernels[k[0]].pinned is not None
                 and not model.kernels[k[0]].pinned.pinned]
        if loose:
            worst_sec.add_text("Of these, the profile did not pin down the templates of: "
                               + "; ".join(f"{esc(base_name(n))} ({p})" for n, p in loose)
                               + ". A profile whose launches vary those arguments, or another profile, pins them.",
                               "note")
    else:
        worst_sec.add_text("Every kernel is predicted exactly: no missed and no over-fetched bytes.")
    all_rows = []
    for k in sorted(kernels, key=lambda k: -(k.get("footprint_bytes") or 0)):
        km = model.kernels.get(k["kernel"])
        all_rows.append((k["kernel"], "/".join(k.get("templates") or []) or "—", f"{k.get('launches', 0):,}",
                         _pct(k.get("precision")), _pct(k.get("recall")),
                         format_size(k.get("footprint_bytes") or 0),
                         "; ".join(r.text() for r in km.regions) if km is not None and km.regions else "—",
                         _pinned(km)))
    worst_sec.add_html(f"<details><summary>All {len(all_rows)} kernels</summary>")
    worst_sec.add_table(["kernel", "class", "launches", "precision", "recall", "footprint", "formulas",
                         "pinned down"], _demangled(all_rows),
                        numeric=[False, False, True, True, True, True, False, False], code_cols=(0, 6))
    worst_sec.add_html("</details>")

    pic = Section("Predicted against observed", anchor="launches")
    truth = footprints(trace)
    pred = predict_footprints(model, trace, FALLBACK)
    launches = pick_launches(trace, truth, pred, [k["kernel"] for k in worst], EXAMPLE_LAUNCHES)
    if launches:
        pic.intro = ("A few launches: the worst launch of the worst-predicted kernels first, then the largest "
                     "launches of other kernels.")
        pic.add_figure(footprint_picture(trace, truth, pred, launches))
    else:
        pic.add_text("No launch in this trace touched any page.", "note")
    return [summ, worst_sec, pic]


__all__ = ["model_sections", "esc"]


def _demangled(rows: list[tuple]) -> list[tuple]:
    """Table rows with their first cell, a kernel's symbol, demangled for the reader."""
    return [(demangle(r[0]),) + tuple(r[1:]) for r in rows]
