"""Sections of the replay report: speedup per policy against oversubscription,
bytes moved per policy, stall per launch over time, and the multitask timeline.

Reads RESULTS.parquet (+ RESULTS.timeline.parquet) through
pagecast.replay.results_io only.

Long because the sections read one set of run rows, one colour and line style per policy and one
chosen capacity: the plots and cards that must agree with each other are drawn in one module.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa

from pagecast.errors import InputError
from pagecast.replay.results_io import read_results
from pagecast.replay.results_table import policy_label
from pagecast.units import format_size

from .page import FIG_W, PALETTE, Section, figure, setup_matplotlib, short

MAX_STALL_POINTS = 3000     # above this many launches per run, stall per launch is binned in time
STALL_BINS = 200
GANTT_BINS = 900            # time bins of the multitask timeline when launches are denser than pixels
MAX_GANTT_PANELS = 4
MAX_WORKLOAD_PANELS = 23    # speedup panels (plus the geometric mean: 8 rows of 3) when results hold several workloads
MAX_TABLE_ROWS = 40         # longer run tables are folded
POLICY_ORDER = ["demand", "alloc", "prefetch", "lru", "fifo", "swap", "runner", "template", "plan", "history", "oracle"]


def _col(t: pa.Table, name: str, default=None) -> list:
    return t.column(name).to_pylist() if name in t.column_names else [default] * t.num_rows


def _policy_sort(policies) -> list[str]:
    uniq = list(dict.fromkeys(policies))
    return sorted(uniq, key=lambda p: (POLICY_ORDER.index(p) if p in POLICY_ORDER else len(POLICY_ORDER), p))


def _colours(policies: list[str]) -> dict[str, str]:
    return {p: PALETTE[i % len(PALETTE)] for i, p in enumerate(policies)}


def _fmt(v, spec: str = ".3g", none: str = "—") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return none
    return format(v, spec)


def _runs(runs: pa.Table) -> list[dict]:
    rows = runs.to_pylist()
    for i, r in enumerate(rows):
        r.setdefault("run", None)
        if r.get("run") is None:
            r["run"] = i
        r["_label"] = r["policy"] + ("" if r.get("backend") in (None, "sim") else f" ({r['backend']})")
        r["_wl"] = str(r.get("workload") or "(unnamed)")
    return rows


def _x_of(r: dict, use_oversub: bool) -> float | None:
    if use_oversub:
        return r.get("oversub")
    c = r.get("capacity_bytes")
    return None if c is None else c / 2**30


def _geomean(v: list[float]) -> float | None:
    v = [x for x in v if x is not None and x > 0 and math.isfinite(x)]
    return float(np.exp(np.mean(np.log(v)))) if v else None


def geomean_rows(rows: list[dict], labels: list[str]) -> list[dict]:
    """Per (policy label, oversub): the geometric mean of speedup over the workloads that have it."""
    out = []
    for lab in labels:
        xs = sorted({r["oversub"] for r in rows if r["_label"] == lab and r.get("oversub") is not None})
        for x in xs:
            v = [r.get("speedup_vs_demand") for r in rows if r["_label"] == lab and r.get("oversub") == x]
            g = _geomean(v)
            if g is not None:
                out.append({"_label": lab, "oversub": x, "speedup_vs_demand": g, "_n": len(v)})
    return out


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">")
DODGE = 0.1   # policies' points are drawn this far apart (in category widths) so equal values stay visible


def x_tick(x: float, use_oversub: bool) -> str:
    """A tick at a datum: oversubscription as the percent it is (2 -> 200%), a capacity in GiB."""
    return f"{100 * x:.4g}%" if use_oversub else f"{x:.3g}"


def log_scale(rows: list[dict], ykey: str) -> bool:
    """One scale for every panel of a figure: log when the values span more than 20x."""
    ys = [r.get(ykey) for r in rows if r.get(ykey)]
    return bool(ys) and max(ys) / max(min(ys), 1e-12) > 20


def share_of_oracle(rows: list[dict], use_oversub: bool) -> list[tuple[float, float]]:
    """(x, template's speed as a share of oracle's: oracle's time / template's) where both ran."""
    t = {_x_of(r, use_oversub): r.get("time_s") for r in rows if r["_label"] == "template"}
    o = {_x_of(r, use_oversub): r.get("time_s") for r in rows if r["_label"] == "oracle"}
    return [(x, o[x] / t[x]) for x in sorted(k for k in t if k in o and k is not None) if t[x] and o[x]]


def _speedup_axes(ax, rows, labels, colours, xs, use_oversub, ykey, annotate: bool, log: bool, fontsize=None):
    n = len(labels)
    for j, lab in enumerate(labels):
        pts = sorted((_x_of(r, use_oversub), r.get(ykey)) for r in rows
                     if r["_label"] == lab and _x_of(r, use_oversub) is not None and r.get(ykey) is not None)
        if not pts:
            continue
        x, ys = zip(*pts)
        # categorical positions at the data, each policy nudged sideways: equal speedups (template
        # on oracle) are two markers side by side, not one hidden under the other
        pos = [xs.index(v) + (j - (n - 1) / 2) * DODGE for v in x]
        ax.plot(pos, ys, marker=MARKERS[j % len(MARKERS)], ms=4 if fontsize else 6, label=lab, color=colours[lab],
                lw=1.4, mfc="white" if j % 2 else colours[lab], mew=1.3)
        if annotate:
            for p, y in zip(pos, ys):
                ax.annotate(f"{y:.3g}{'x' if ykey == 'speedup_vs_demand' else ''}", (p, y),
                            textcoords="offset points", xytext=(4, 4) if j % 2 else (-4, -10),
                            ha="left" if j % 2 else "right", fontsize=7, color=colours[lab])
    ax.set_xticks(range(len(xs)), [x_tick(x, use_oversub) for x in xs])
    ax.set_xlim(-0.5, len(xs) - 0.5)
    if log:
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))   # a labelled tick inside every panel's range
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    if ykey == "speedup_vs_demand":
        ax.axhline(1.0, color="#555", lw=0.8, ls="--")
    share = share_of_oracle(rows, use_oversub)   # under the panel's title (inside, it covered the points)
    return ("template = " + " · ".join(f"{100 * v:.0f}%" for _, v in share) + " of oracle") if share else ""


def oversub_label(rows: list[dict]) -> str:
    """The x axis of oversubscription, as docs/cli.md defines it: what the runs divided by the capacity."""
    touched = rows and all(r.get("oversub_of") == "touched" for r in rows if r.get("oversub") is not None)
    return "oversubscription (" + ("touched footprint" if touched else "managed memory allocated") + " / GPU capacity)"


def speedup_plot(rows: list[dict], labels: list[str], colours: dict[str, str], workloads: list[str]):
    plt = setup_matplotlib()
    use_oversub = any(r.get("oversub") is not None for r in rows)
    have_speedup = any(r.get("speedup_vs_demand") is not None for r in rows)
    ykey = "speedup_vs_demand" if have_speedup else "time_s"
    log = log_scale(rows, ykey) if len(workloads) <= 1 else log_scale(rows + geomean_rows(rows, labels), ykey)
    ylabel = ("speedup over demand paging (x)" if have_speedup else "run time (s)") + (", log scale" if log else "")
    xlabel = oversub_label(rows) if use_oversub else "GPU capacity (GiB)"
    xs = sorted({x for r in rows if (x := _x_of(r, use_oversub)) is not None})
    title = "Speedup per policy against oversubscription" if have_speedup else "Run time per policy"
    look = ("Template prefetching should sit far above demand paging (the dashed 1x line) and close to the "
            "oracle; the gap usually widens as oversubscription grows. Each policy's points are nudged sideways "
            "so equal values stay visible; each panel's title gives template's speed as a share of oracle's "
            "(oracle's time / template's) at each oversubscription." if have_speedup else
            "No 'demand' run was among the policies, so speedups are unknown; lower run time is better.")
    note = ("every panel on one logarithmic y scale (the values span more than 20x)" if log
            else "every panel on a linear y scale")
    if len(workloads) <= 1:
        fig, ax = plt.subplots(figsize=(FIG_W, 4.6))
        share = _speedup_axes(ax, rows, labels, colours, xs, use_oversub, ykey, annotate=len(labels) <= 6, log=log)
        ax.set_ylabel(ylabel)
        ax.set_xlabel(xlabel)
        ax.set_title(title + (f"\n{share}" if share else ""))
        ax.legend(loc="lower right")
        return figure(fig, title, look, note=note)
    # several workloads: the geometric mean first, then one small panel per workload
    panels: list[tuple[str, list[dict], bool]] = []
    if have_speedup and use_oversub:
        panels.append((f"geometric mean over {len(workloads)} workloads", geomean_rows(rows, labels), True))
    shown = workloads[:MAX_WORKLOAD_PANELS]
    if len(workloads) > len(shown):
        note += f"; the first {len(shown)} of {len(workloads)} workloads have a panel, the table lists all"
    for w in shown:
        panels.append((w, [r for r in rows if r["_wl"] == w], False))
    ncol = 3
    nrow = -(-len(panels) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(FIG_W, 0.8 + 2.7 * nrow), squeeze=False)
    for ax, (name, prow, bold) in zip(axes.flat, panels):
        share = _speedup_axes(ax, prow, labels, colours, xs, use_oversub, ykey, annotate=bold and len(labels) <= 6,
                              log=log, fontsize=7)
        ax.set_title(short(name, 40) + (f"\n{share}" if share else ""), fontsize=8, fontweight="bold" if bold else "normal")
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel, fontsize=8)
    for ax in axes[-1, :]:
        ax.set_xlabel(xlabel if ax.get_visible() else "", fontsize=8)
    for ax in axes[-2, :] if nrow > 1 else []:
        if ax.get_visible() and not axes[-1, list(axes[-2, :]).index(ax)].get_visible():
            ax.set_xlabel(xlabel, fontsize=8)
    handles = [plt.Line2D([], [], color=colours[lab], marker=MARKERS[j % len(MARKERS)], label=lab,
                          mfc="white" if j % 2 else colours[lab], mew=1.3) for j, lab in enumerate(labels)]
    fig.legend(handles=handles, loc="upper center", ncol=min(len(labels), 6), bbox_to_anchor=(0.5, 1.0),
               frameon=False)
    fig.suptitle(title + (", per workload" if len(workloads) > 1 else "") + (" (log scale)" if log else ""),
                 fontweight="bold", y=1.04)
    fig.tight_layout()
    return figure(fig, title, look, note=note)


def bytes_plot(rows: list[dict], labels: list[str], colours: dict[str, str], workloads: list[str]):
    plt = setup_matplotlib()
    use_oversub = any(r.get("oversub") is not None for r in rows)
    over_label = oversub_label(rows)   # before the workloads are summed
    if len(workloads) > 1:
        summed: dict[tuple, dict] = {}
        for r in rows:
            k = (r["_label"], r.get("oversub"))
            d = summed.setdefault(k, {"_label": r["_label"], "oversub": r.get("oversub"), "capacity_bytes": None,
                                      "htod_bytes": 0, "dtoh_bytes": 0})
            d["htod_bytes"] += r.get("htod_bytes") or 0
            d["dtoh_bytes"] += r.get("dtoh_bytes") or 0
        rows = list(summed.values())
        use_oversub = True
    xs = sorted({_x_of(r, use_oversub) for r in rows if _x_of(r, use_oversub) is not None})
    fig, ax = plt.subplots(figsize=(FIG_W, 4.4))
    tot = [(r.get("htod_bytes") or 0) + (r.get("dtoh_bytes") or 0) for r in rows]
    div, unit = (2**30, "GiB") if max(tot + [0]) >= 2**30 else (2**20, "MiB")
    w = 0.8 / max(len(labels), 1)
    for j, lab in enumerate(labels):
        by_x = {_x_of(r, use_oversub): r for r in rows if r["_label"] == lab}
        pos = np.arange(len(xs)) - 0.4 + w * (j + 0.5)
        h = np.array([(by_x[x].get("htod_bytes") or 0) / div if x in by_x else 0 for x in xs])
        d = np.array([(by_x[x].get("dtoh_bytes") or 0) / div if x in by_x else 0 for x in xs])
        ax.bar(pos, h, w * 0.95, color=colours[lab], label=f"{lab}")
        ax.bar(pos, d, w * 0.95, bottom=h, color=colours[lab], alpha=0.45, hatch="//", edgecolor="white", lw=0)
    ax.set_xticks(np.arange(len(xs)), [x_tick(x, use_oversub) for x in xs])
    ax.set_xlabel(over_label if use_oversub else "GPU capacity (GiB)")
    ax.set_ylabel(f"bytes moved ({unit}); solid host→device, hatched device→host")
    ax.set_title("Bytes moved per policy" + (f", summed over {len(workloads)} workloads" if len(workloads) > 1 else ""))
    ax.legend(loc="upper left", ncol=min(len(labels), 4))
    return figure(fig, "Bytes moved per policy",
                  "Good policies move little more than the footprint once; tall hatched bars mean heavy eviction "
                  "traffic (pages thrown out and brought back).")


def _pick_capacity(rows: list[dict]) -> int | None:
    """The most oversubscribed (smallest) capacity: where the policies differ most."""
    caps = [r.get("capacity_bytes") for r in rows if r.get("capacity_bytes") is not None]
    return min(caps) if caps else None


def _timeline_runs(tl: pa.Table, rows: list[dict], cap: int | None) -> list[tuple[dict, dict]]:
    """(run row, timeline columns as numpy) for each run at capacity `cap`, in policy order."""
    run_col = np.asarray(tl.column("run").fill_null(-1).to_numpy())
    pol = np.asarray(tl.column("policy").to_numpy(zero_copy_only=False))
    capc = np.asarray(tl.column("capacity_bytes").fill_null(-1).to_numpy())
    out = []
    for r in rows:
        if cap is not None and r.get("capacity_bytes") != cap:
            continue
        sel = run_col == r["run"]
        if not sel.any():
            sel = (pol == r["policy"]) & (capc == (r.get("capacity_bytes") if r.get("capacity_bytes") is not None else -1))
        if not sel.any():
            continue
        idx = np.flatnonzero(sel)
        cols = {c: tl.column(c).take(pa.array(idx)).to_numpy(zero_copy_only=False)
                for c in ("start_s", "end_s", "stall_s", "task", "task_name", "kernel")}
        for c in ("start_s", "end_s", "stall_s"):
            cols[c] = np.nan_to_num(np.asarray(cols[c], np.float64))
        out.append((r, cols))
    return out


def _covered_before(starts: np.ndarray, ends: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Sum over segments of their length before each time t: sum(clip(t - s, 0, e - s)) (vectorized)."""
    def ramp(x):  # sum over x < t of (t - x)
        x = np.sort(x)
        pre = np.concatenate([[0.0], np.cumsum(x)])
        k = np.searchsorted(x, t, side="left")
        return k * t - pre[k]
    return ramp(starts) - ramp(ends)


def stall_spans(start: np.ndarray, end: np.ndarray, stall: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each launch's stall lies: (wait, inside) per launch, in seconds. A launch's stall is
    the wait before it starts (from the end of the launch before it on the GPU, whichever task's,
    to its start: its data still moving) and then its faults, inside it: [start - wait, start)
    and [start, start + inside)."""
    order = np.argsort(start, kind="stable")
    s, e, st = start[order], end[order], stall[order]
    prev_end = np.concatenate([[0.0], np.maximum.accumulate(e)[:-1]]) if len(e) else e
    wait = np.clip(np.minimum(s - prev_end, st), 0, None)
    inside = np.clip(np.minimum(st - wait, e - s), 0, None)
    out_w, out_i = np.empty_like(wait), np.empty_like(inside)
    out_w[order], out_i[order] = wait, inside
    return out_w, out_i


def stall_plot(runs_tl, colours, cap_label: str):
    plt = setup_matplotlib()
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(FIG_W, 5.8), sharex=True, layout="constrained")
    binned = any(len(c["start_s"]) > MAX_STALL_POINTS for _, c in runs_tl)
    styles = line_styles([r["_label"] for r, _ in runs_tl])
    t_end = max((float(c["end_s"].max()) for _, c in runs_tl if len(c["end_s"])), default=1.0)
    edges = np.linspace(0, max(t_end, 1e-12), STALL_BINS + 1)
    for r, c in runs_tl:
        order = np.argsort(c["start_s"], kind="stable")
        t, st = c["start_s"][order], c["stall_s"][order]
        wait, inside = stall_spans(t, c["end_s"][order], st)
        lab = r["_label"]
        ls, lw, z = styles[lab]
        if binned:
            # exact share of each bin spent stalled: the waits before launches and the faults in them
            frac = (np.diff(_covered_before(t - wait, t, edges)) + np.diff(_covered_before(t, t + inside, edges))) \
                / np.diff(edges)
            a1.stairs(100 * frac, edges, color=colours[lab], label=lab, lw=lw * 0.8, ls=ls, zorder=z)
        else:   # a marker of its own each: equal points stay visible
            a1.plot(t, st * 1e3, MARKERS[list(styles).index(lab) % len(MARKERS)], ms=3.5, color=colours[lab],
                    label=lab, rasterized=True, zorder=z)
        a2.plot(np.concatenate([[0], t + inside]), np.concatenate([[0], np.cumsum(st)]), color=colours[lab], lw=lw,
                ls=ls, zorder=z, label=lab)
    if binned:
        a1.set_ylabel("time stalled (% of each bin)")
        a1.set_ylim(0, 105)
    else:
        a1.set_ylabel("stall per launch (ms)")
    a1.set_title(f"Stall per launch over time ({cap_label})")
    # above the panels, off the lines (a stalled policy's line runs along 100%)
    handles, names = a2.get_legend_handles_labels()
    fig.legend(handles, names, loc="outside upper center", ncol=min(len(runs_tl), 6), frameon=False)
    a2.set_ylabel("cumulative stall (s)")
    a2.set_xlabel("simulated time since the run began (s)")
    note = (f"more than {MAX_STALL_POINTS:,} launches per run: the top panel shows the share of time stalled in "
            f"{STALL_BINS} time bins of {t_end / STALL_BINS:.3g} s" if binned else "one point per launch")
    return figure(fig, "Stall timeline per launch",
                  "Demand paging stalls on almost every launch; a good prefetch policy keeps the cumulative stall "
                  "curve flat, with stalls only where a prediction missed or the working set changed.", note=note)


LINE_STYLES = [("-", 2.8), ("--", 2.0), ("-.", 1.6), (":", 1.6)]
MARKERS = [".", "x", "+", "1"]


def line_styles(labels: list[str]) -> dict[str, tuple[str, float, int]]:
    """(linestyle, width, zorder) per policy: each next one thinner, dashed and drawn above, so a
    line that lies exactly on another (template on oracle's) still shows under it."""
    return {lab: (LINE_STYLES[i % len(LINE_STYLES)][0], LINE_STYLES[i % len(LINE_STYLES)][1], 2 + i)
            for i, lab in enumerate(labels)}


# task colours of the multitask timeline: none near the stall red (#d62728)
STALL_RED = "#d62728"
TASK_PALETTE = [c for c in PALETTE if c not in ("#D55E00", "#FF9896", "#CC79A7", "#8C564B", "#FFBB78")]


def _merge_segments(a: np.ndarray, b: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """Merge [a, b) segments that overlap or lie within eps of each other (vectorized)."""
    keep = b > a
    a, b = a[keep], b[keep]
    if len(a) == 0:
        return a, b
    o = np.argsort(a, kind="stable")
    a, b = a[o], b[o]
    run = np.maximum.accumulate(b)
    new = np.ones(len(a), bool)
    new[1:] = a[1:] > run[:-1] + eps
    idx = np.flatnonzero(new)
    return a[idx], np.maximum.reduceat(b, idx)


def gantt_plot(runs_tl, cap_label: str):
    plt = setup_matplotlib()
    runs_tl = runs_tl[:MAX_GANTT_PANELS]
    names_all: list[str] = []
    for _, c in runs_tl:
        for tid, tn in zip(c["task"], c["task_name"]):
            nm = str(tn) if tn is not None else f"task {tid}"
            if nm not in names_all:
                names_all.append(nm)
        if len(names_all) > 40:
            break
    ntask = max(len(names_all), 1)
    fig, axes = plt.subplots(len(runs_tl), 1, figsize=(FIG_W, 1.2 + len(runs_tl) * (0.75 + 0.28 * ntask)),
                             sharex=True, squeeze=False, layout="constrained")   # titles clear of the panel above
    tcol = {n: TASK_PALETTE[i % len(TASK_PALETTE)] for i, n in enumerate(names_all)}
    t_end = max((float(c["end_s"].max()) for _, c in runs_tl if len(c["end_s"])), default=1.0)
    t_end = max(t_end, 1e-12)
    eps = t_end / 3000   # gaps under a third of a pixel are merged: same picture, far fewer bars
    dense = any(len(c["start_s"]) > MAX_STALL_POINTS for _, c in runs_tl)
    edges = np.linspace(0, t_end, GANTT_BINS + 1)
    from matplotlib.colors import to_rgb
    red = np.array(to_rgb(STALL_RED))
    for ax, (r, c) in zip(axes[:, 0], runs_tl):
        nm = np.array([str(tn) if tn is not None else f"task {tid}" for tid, tn in zip(c["task"], c["task_name"])])
        wait_all, inside_all = stall_spans(c["start_s"], c["end_s"], c["stall_s"])   # over every task's launches
        verts, colours = [], []
        for y, name in enumerate(names_all):
            sel = nm == name
            if not sel.any():
                continue
            s, e = c["start_s"][sel], c["end_s"][sel]
            wait, inside = wait_all[sel], inside_all[sel]
            if dense:
                # per time bin: the share the task held the GPU (waiting for its data or running),
                # coloured between its colour (computing) and red (stalled)
                w = np.diff(edges)
                busy = np.clip(np.diff(_covered_before(s - wait, e, edges)) / w, 0, 1)
                busy[busy < 1e-6] = 0   # rounding noise of the prefix sums, not work
                stalled = np.clip((np.diff(_covered_before(s - wait, s, edges))
                                   + np.diff(_covered_before(s, s + inside, edges))) / w, 0, 1)
                share = np.divide(stalled, busy, out=np.zeros_like(busy), where=busy > 0)
                rgba = np.zeros((1, GANTT_BINS, 4))
                rgba[0, :, :3] = (1 - share)[:, None] * np.array(to_rgb(tcol[name])) + share[:, None] * red
                # tasks that share the GPU each run part of a bin: scale so the busiest bin is opaque
                rgba[0, :, 3] = np.where(busy > 0, 0.15 + 0.85 * busy / max(busy.max(), 1e-12), 0)
                ax.imshow(rgba, aspect="auto", interpolation="nearest", extent=(0, t_end, y - 0.35, y + 0.35))
                continue
            for (a, b), colour in ((_merge_segments(s + inside, e, eps), tcol[name]),
                                   (_merge_segments(np.concatenate([s - wait, s]),
                                                    np.concatenate([s, s + inside]), eps), STALL_RED)):
                v = np.zeros((len(a), 4, 2))
                v[:, 0, 0] = v[:, 3, 0] = a
                v[:, 1, 0] = v[:, 2, 0] = np.maximum(b, a + eps / 3)
                v[:, 0, 1] = v[:, 1, 1] = y - 0.35
                v[:, 2, 1] = v[:, 3, 1] = y + 0.35
                verts.append(v)
                colours += [colour] * len(a)
        if verts:
            from matplotlib.collections import PolyCollection
            ax.add_collection(PolyCollection(np.concatenate(verts), facecolors=colours, lw=0, rasterized=True))
        ax.set_xlim(0, t_end * 1.01)
        ax.set_yticks(range(len(names_all)), [short(n, 24) for n in names_all], fontsize=8)
        ax.set_ylim(-0.6, len(names_all) - 0.4)
        ax.set_ylabel("task")
        ax.set_title(f"{r['_label']}: {_fmt(r.get('time_s'))} s total, {_fmt(r.get('stall_s'))} s stalled",
                     fontsize=10, loc="left")
    axes[-1, 0].set_xlabel("simulated time since the run began (s)")
    fig.suptitle(f"Multitask timeline: which task ran when ({cap_label})", fontweight="bold")
    from matplotlib.patches import Patch
    key = [Patch(color=STALL_RED, label="stalled on memory")] + [Patch(color=tcol[n], label=f"{short(n, 24)} computing")
                                                                 for n in names_all[:8]]
    fig.legend(handles=key, loc="outside lower center", ncol=min(len(key), 5), frameon=False, fontsize=8)
    note = (f"more than {MAX_STALL_POINTS:,} launches per run: each row is drawn in {GANTT_BINS} time bins; a bin's "
            "opacity grows with the share of it the task ran, its colour goes from the task's colour (computing) to red "
            "(stalled)" if dense else "one bar per launch: red while it stalled (waiting for its data before it started, "
            "or faulting), the task's colour while it computed")
    return figure(fig, "Multitask timeline",
                  "Red is time a task waited for memory; with template prefetching each task's turn should be "
                  "mostly coloured (computing), and the whole mix should finish sooner than under demand paging.",
                  raster=True, note=note)


def _task_count(runs_tl) -> int:
    """How many tasks the timeline runs hold (tasks sharing the GPU in a multitask replay)."""
    return len({x for _, c in runs_tl for x in np.unique(np.asarray(c["task"]).astype(str)).tolist()})


def _pick_timeline_workload(rows: list[dict], workloads: list[str]) -> str:
    """The workload whose timeline is drawn: the one with most tasks (a multitask mix), else the first."""
    ntask = {w: 0 for w in workloads}
    for r in rows:
        ntask[r["_wl"]] = max(ntask[r["_wl"]], len(r.get("tasks") or []))
    return max(workloads, key=lambda w: (ntask[w], -workloads.index(w)))


def headline_cards(rows: list[dict], labels: list[str], multi: bool) -> list[tuple[str, str]]:
    """The report's first cards: pagecast's own result (template's speedup over demand, per
    oversubscription; with several workloads their geometric mean), then oracle's, the bound
    beside it. Without a template run, the fastest policy's that is not oracle stands first."""
    def series(lab: str) -> dict:
        return {r.get("oversub"): r["speedup_vs_demand"] for r in rows
                if r["_label"] == lab and r.get("speedup_vs_demand") is not None}

    def text(sp: dict) -> str:
        xs = sorted(sp, key=lambda x: (x is None, x or 0))
        vals = " · ".join(f"{sp[x]:.3g}x" for x in xs)
        at = " · ".join(x_tick(x, True) for x in xs if x is not None)
        return vals + (f" at {at}" if at and len(at) < 40 else "")

    kind = "geometric-mean speedup" if multi else "speedup"
    first = next((lab for lab in labels if lab == "template"), None)
    if first is None:
        others = [lab for lab in labels if lab not in ("demand", "oracle") and series(lab)]
        first = max(others, key=lambda lab: max(series(lab).values()), default=None)
    cards = []
    if first is not None and series(first):
        cards.append((f"{first}: {kind} over demand", text(series(first))))
    if "oracle" in labels and series("oracle"):
        cards.append(("oracle (the bound: the fastest plan found with the truth)", text(series("oracle"))))
    return cards


def _run_cells(r: dict, with_workload: bool) -> tuple:
    policy = policy_label(r)   # with the span a planned policy's plan was made at (docs/cost-model.md)
    cells = (policy, r.get("backend"), _fmt(r.get("oversub"), "g"),
             format_size(r["capacity_bytes"]) if r.get("capacity_bytes") is not None else "—",
             _fmt(r.get("time_s"), ".4g"), _fmt(r.get("stall_s"), ".4g"),
             f"{r['faults']:,}" if r.get("faults") is not None else "—",
             format_size(r.get("htod_bytes") or 0), format_size(r.get("dtoh_bytes") or 0),
             (_fmt(r.get("speedup_vs_demand"), ".3g") + "x") if r.get("speedup_vs_demand") is not None else "—")
    return ((r["_wl"],) + cells) if with_workload else cells


def replay_sections(path: Path) -> tuple[list[Section], str]:
    runs, timeline = read_results(path)
    if runs.num_rows == 0:
        raise InputError(f"{path}: the results hold no runs; nothing to report")
    rows = _runs(runs)
    labels = _policy_sort([r["_label"] for r in rows])
    colours = _colours(labels)
    workloads = list(dict.fromkeys(r["_wl"] for r in rows))
    multi = len(workloads) > 1
    label = workloads[0] if not multi else f"{len(workloads)} workloads"

    summ = Section("Runs", anchor="runs",
                   intro="One row per " + ("(workload, policy, capacity)" if multi else "(policy, capacity)") +
                         " run. Speedup is run time under demand paging divided by the policy's run time at the "
                         "same capacity.")
    nums = [("runs", f"{len(rows)}"), ("policies", ", ".join(labels)),
            ("backend", ", ".join(sorted({str(r.get('backend')) for r in rows})))]
    if multi:
        nums.insert(0, ("workloads", f"{len(workloads)}"))
    geo = geomean_rows(rows, labels) if multi else []
    nums[:0] = headline_cards(geo if multi else rows, labels, multi)
    if not multi:
        tasks = list(dict.fromkeys(t for r in rows for t in (r.get("tasks") or [])))
        if tasks:
            nums.append(("tasks", ", ".join(tasks)))
    summ.add_numbers(nums)
    if geo:
        xs = sorted({g["oversub"] for g in geo})
        by = {(g["_label"], g["oversub"]): g["speedup_vs_demand"] for g in geo}
        summ.add_table(["policy"] + [f"{x_tick(x, True)} oversub" for x in xs],
                       [[lab] + [(f"{by[(lab, x)]:.3g}x" if (lab, x) in by else "—") for x in xs] for lab in labels],
                       caption=f"Speedup over demand paging, geometric mean over {len(workloads)} workloads",
                       numeric=[False] + [True] * len(xs))
    header = (["workload"] if multi else []) + ["policy", "backend", "oversub", "capacity", "time (s)", "stall (s)",
                                                "faults", "host→device", "device→host", "speedup vs demand"]
    ordered = sorted(rows, key=lambda r: (workloads.index(r["_wl"]), labels.index(r["_label"]),
                                          r.get("oversub") or 0, -(r.get("capacity_bytes") or 0)))
    fold = len(ordered) > MAX_TABLE_ROWS
    if fold:
        summ.add_html(f"<details><summary>All {len(ordered)} runs</summary>")
    summ.add_table(header, [_run_cells(r, multi) for r in ordered],
                   numeric=([False] if multi else []) + [False, False] + [True] * 8)
    if fold:
        summ.add_html("</details>")

    perf = Section("Policies compared", anchor="policies")
    perf.add_figure(speedup_plot(rows, labels, colours, workloads))
    perf.add_figure(bytes_plot(rows, labels, colours, workloads))
    sections = [summ, perf]

    tl_sec = Section("Timelines", anchor="timelines")
    if timeline is None or timeline.num_rows == 0:
        tl_sec.add_text(f"No timeline beside {path} (RESULTS.timeline.parquet), so the per-launch stall and "
                        "multitask timelines cannot be drawn.", "note")
    else:
        wl = _pick_timeline_workload(rows, workloads)
        wrows = [r for r in rows if r["_wl"] == wl]
        cap = _pick_capacity(wrows)
        runs_tl = _timeline_runs(timeline, wrows, cap)
        runs_tl.sort(key=lambda rc: labels.index(rc[0]["_label"]))
        cap_rows = [r for r, _ in runs_tl]
        ov = cap_rows[0].get("oversub") if cap_rows else None
        cap_label = ((f"{wl}, " if multi else "") + (f"capacity {format_size(cap)}" if cap is not None else "all runs")
                     + (f", {x_tick(ov, True)} oversubscribed" if ov is not None else ""))
        if runs_tl:
            tl_sec.intro = (f"Shown for the most oversubscribed capacity ({cap_label}), where the policies "
                            "differ most" + (f"; of the {len(workloads)} workloads, the one with most tasks. The "
                                             "timeline file holds every run's launches." if multi else "."))
            tl_sec.add_figure(stall_plot(runs_tl, colours, cap_label))
            if _task_count(runs_tl) > 1:   # one task alone: the stall timeline says it all
                tl_sec.add_figure(gantt_plot(runs_tl, cap_label))
            if _task_count(runs_tl) > 1 and len(runs_tl) > MAX_GANTT_PANELS:
                tl_sec.add_text(f"The multitask timeline shows the first {MAX_GANTT_PANELS} of {len(runs_tl)} "
                                "policies.", "note")
        else:
            tl_sec.add_text("The timeline has no rows matching these runs.", "note")
    sections.append(tl_sec)
    return sections, label
