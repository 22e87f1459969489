"""Sections of the trace report: summary numbers, fault scatter, faults and
migrated bytes over time, footprint per kernel, allocation map.

Everything is vectorized with numpy; the fault scatter switches from points to
a 2-D histogram above SCATTER_MAX_POINTS fault records, and the plot says so.
"""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc

from pagecast import trace as T
from pagecast.demangle import base_name, demangle
from pagecast.footprints import Footprints, attribute_by_time, footprints, merge_intervals
from pagecast.summary import trace_summary
from pagecast.units import format_size
from pagecast.uvm import VA_BLOCK

from .page import FIG_W, OTHER_COLOUR, PALETTE, Section, figure, setup_matplotlib, short

SCATTER_MAX_POINTS = 60_000    # above this many fault records the scatter is binned
BIN_T, BIN_A = 900, 500        # cells of the binned scatter (time x address)
TOP_COLOURED_KERNELS = 10
TOP_FOOTPRINT_KERNELS = 15
MAX_ALLOC_BARS = 40
ZOOM_LAUNCHES = 24             # traces with more than twice this many launches get a zoomed scatter too
BLOCK = VA_BLOCK               # the UVM driver's 2 MiB VA block, used to place stray faults


# ---- helpers shared with the model report -----------------------------------

def kernel_codes(trace: T.Trace) -> tuple[np.ndarray, np.ndarray]:
    """(unique kernel names, code of each launch)."""
    names = trace.launches.column(T.KERNEL).to_numpy(zero_copy_only=False)
    if len(names) == 0:
        return np.array([], dtype=object), np.zeros(0, np.int64)
    uniq, inv = np.unique(names, return_inverse=True)
    return uniq, inv.astype(np.int64)


def time_origin(trace: T.Trace) -> int | None:
    lo = None
    for tname, col in ((T.LAUNCHES, T.START_NS), (T.FAULTS, T.TIME_NS), (T.MIGRATIONS, T.START_NS)):
        c = trace.table(tname).column(col)
        if len(c) and c.null_count < len(c):
            v = pc.min(c).as_py()
            lo = v if lo is None else min(lo, v)
    return lo


def size_unit(nbytes: float) -> tuple[float, str]:
    for div, name in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if nbytes >= 4 * div:
            return float(div), name
    return 1.0, "B"


class AddressLayout:
    """Maps virtual addresses onto a compact axis: allocations stacked in address
    order with the (often huge) gaps between them removed. Addresses outside every
    allocation get their 2 MiB VA block added as a segment of its own."""

    def __init__(self, trace: T.Trace, extra_addresses: np.ndarray | None = None) -> None:
        A = trace.allocations
        ps = trace.page_size   # whole pages, so page-rounded footprints of unaligned allocations fit
        a = A.column(T.ADDRESS).to_numpy().astype(np.int64)
        b = a + A.column(T.BYTES).to_numpy().astype(np.int64)
        a, b = a // ps * ps, (b + ps - 1) // ps * ps
        s, e = self._merge(a, b)
        self.n_alloc_segments = len(s)
        if extra_addresses is not None and len(extra_addresses):
            x = np.asarray(extra_addresses, np.int64)
            outside = ~self._inside(s, e, x)
            if outside.any():
                blocks = np.unique(x[outside] // BLOCK) * BLOCK
                s, e = self._merge(np.concatenate([s, blocks]), np.concatenate([e, blocks + BLOCK]))
        self.start, self.end = s, e
        lens = e - s
        self.offset = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64) if len(s) else np.zeros(0, np.int64)
        self.total = int(lens.sum())

    @staticmethod
    def _merge(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if len(a) == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        _, s, e = merge_intervals(np.zeros(len(a), np.int64), a.astype(np.int64), b.astype(np.int64), 1)
        return s, e

    @staticmethod
    def _inside(s: np.ndarray, e: np.ndarray, x: np.ndarray) -> np.ndarray:
        if len(s) == 0:
            return np.zeros(len(x), bool)
        k = np.searchsorted(s, x, side="right") - 1
        return (k >= 0) & (x < e[np.maximum(k, 0)])

    def map(self, x: np.ndarray) -> np.ndarray:
        """Compact position of each address (NaN outside every segment)."""
        x = np.asarray(x, np.int64)
        out = np.full(len(x), np.nan)
        if len(self.start) == 0:
            return out
        k = np.searchsorted(self.start, x, side="right") - 1
        kk = np.maximum(k, 0)
        ok = (k >= 0) & (x < self.end[kk])
        out[ok] = (self.offset[kk] + (x - self.start[kk]))[ok]
        return out


def kernel_colours(labels: np.ndarray, weights: np.ndarray, names: np.ndarray, top: int):
    """Colour index per item: the `top` heaviest kernels get palette colours, the rest 'other'.

    labels: kernel code per item (-1 = unattributed). Returns (colour index per item,
    list of (name, hex colour)), with index len(legend)-1 meaning other/unattributed."""
    K = len(names)
    w = np.bincount(labels[labels >= 0], weights=weights[labels >= 0], minlength=K) if K else np.zeros(0)
    order = [int(i) for i in np.argsort(-w, kind="stable")[:top] if w[i] > 0]
    remap = np.full(K + 1, len(order), np.int64)
    remap[order] = np.arange(len(order))
    idx = remap[np.where(labels >= 0, labels, K)]
    legend = [(short(base_name(names[k]), 40), PALETTE[i % len(PALETTE)]) for i, k in enumerate(order)]
    has_other = bool((idx == len(order)).any())
    legend.append(("other kernels / unattributed", OTHER_COLOUR))
    return idx, legend, has_other


# ---- sections -----------------------------------------------------------------

def summary_section(trace: T.Trace, s: dict) -> Section:
    sec = Section("Summary", anchor="summary")
    span = s["time_span_ns"]
    mig = s["migrated_bytes"]
    sec.add_numbers([
        ("launches", f"{s['launches']:,}"),
        ("kernels", f"{s['kernels']:,}"),
        ("allocations", f"{s['allocations']:,} ({format_size(s['allocated_bytes'])})"),
        ("GPU page faults", f"{s['faults']:,}"),
        ("fault records", f"{s['fault_records']:,}"),
        ("migrations", f"{s['migrations']:,}"),
        ("host→device", format_size(mig.get("htod", 0))),
        ("device→host", format_size(mig.get("dtoh", 0))),
        ("footprint (distinct pages)", format_size(s["footprint_bytes"])),
        ("touched (sum over launches)", format_size(s["touched_bytes"])),
        ("time span", "n/a" if span is None else f"{span / 1e6:,.3f} ms"),
    ])
    dev = trace.manifest.get("device") or {}
    rows = [
        ("workload", s["workload"] or "unnamed"),
        ("source / mode", f"{s['source']} / {s['mode']}"),
        ("complete", "yes" if s["complete"] else "NO: the collector did not finish; parts written so far are shown"),
        ("page size", f"{s['page_size']} B"),
        ("driver prefetch", {True: "on", False: "off", None: "unknown"}.get(s["driver_prefetch"], s["driver_prefetch"])),
        ("device", dev.get("name") or "unknown"),
        ("footprints from", "truth table (what each launch really touched)" if s["footprint_source"] == "truth"
         else "observed faults and coherence migrations"),
        ("migrated by cause", ", ".join(f"{k} {format_size(v)}" for k, v in s["migrated_bytes_by_cause"].items() if v)
         or "none"),
    ]
    ev = trace.extra.get(T.UVM_EVENTS)
    if ev is not None and ev.num_rows:
        counts = ev.group_by(T.EVENT).aggregate([(T.EVENT, "count")]).to_pylist()
        rows.append(("UVM events", ", ".join(f"{r[T.EVENT]} {r[f'{T.EVENT}_count']:,}"
                                             for r in sorted(counts, key=lambda r: str(r[T.EVENT])))))
    sec.add_table(["property", "value"], rows)
    if not s["complete"]:
        sec.add_text("This trace is incomplete.", "warn")
    if s["top_kernels"]:
        sec.add_table(["kernel", "launches", "touched (sum over launches)", "footprint (distinct pages)"],
                      [(demangle(k["kernel"]), f"{k['launches']:,}", format_size(k["touched_bytes"]),
                        format_size(k["footprint_bytes"])) for k in s["top_kernels"]],
                      caption="Kernels by bytes touched", numeric=[False, True, True, True], code_cols=(0,))
    return sec


class FaultView:
    """Fault records placed on the plot: x (ms), y (compact address), colour index, count, launch."""

    def __init__(self, trace: T.Trace, names: np.ndarray, codes: np.ndarray, t0: int | None) -> None:
        F = trace.faults
        self.n = F.num_rows
        addr = F.column(T.ADDRESS).to_numpy().astype(np.int64)
        self.cnt = F.column(T.COUNT).to_numpy().astype(np.float64)
        self.lid = attribute_by_time(trace, F.column(T.LAUNCH_ID), F.column(T.TIME_NS))
        klabel = np.where(self.lid >= 0, codes[np.clip(self.lid, 0, max(len(codes) - 1, 0))] if len(codes) else -1, -1)
        self.cidx, self.legend, self.has_other = kernel_colours(klabel, self.cnt, names, TOP_COLOURED_KERNELS)
        self.colours = np.array([c for _, c in self.legend])
        self.layout = AddressLayout(trace, addr)
        self.div, self.unit = size_unit(max(self.layout.total, 1))
        self.y = self.layout.map(addr) / self.div
        self.x = (F.column(T.TIME_NS).to_numpy().astype(np.int64) - (t0 or 0)) / 1e6


def fault_scatter(trace: T.Trace, v: FaultView, zoom_launches: int | None = None):
    plt = setup_matplotlib()
    layout, div, unit = v.layout, v.div, v.unit
    if zoom_launches is None:
        sel = slice(None)
        n = v.n
    else:
        sel = np.flatnonzero((v.lid >= 0) & (v.lid < zoom_launches))
        n = len(sel)
    x, y, cidx, cnt, colours = v.x[sel], v.y[sel], v.cidx[sel], v.cnt[sel], v.colours

    fig, ax = plt.subplots(figsize=(FIG_W, 5.6 if zoom_launches is None else 4.6))
    # allocations as bands: one collection however many allocations there are
    A = trace.allocations
    if A.num_rows:
        from matplotlib.collections import PolyCollection
        from matplotlib.transforms import blended_transform_factory
        a_addr = A.column(T.ADDRESS).to_numpy().astype(np.int64)
        a_bytes = A.column(T.BYTES).to_numpy().astype(np.int64)
        a_id = A.column(T.ALLOC_ID).to_numpy()
        lo = layout.map(a_addr) / div
        ok = np.flatnonzero(np.isfinite(lo))
        order = ok[np.argsort(lo[ok], kind="stable")]
        if len(order) > 1000:   # bands thinner than about a pixel only add noise (and bytes)
            order = order[a_bytes[order] >= layout.total / 1000]
        b0, b1 = lo[order], lo[order] + a_bytes[order] / div
        verts = np.zeros((len(order), 4, 2))
        verts[:, 1, 0] = verts[:, 2, 0] = 1.0
        verts[:, 0, 1] = verts[:, 1, 1] = b0
        verts[:, 2, 1] = verts[:, 3, 1] = b1
        band = np.where(np.arange(len(order)) % 2 == 0, 0, 1)
        ax.add_collection(PolyCollection(verts, facecolors=np.array(["#dfe8f3", "#f1e9d8"])[band], alpha=0.6,
                                         lw=0, zorder=0, rasterized=True,
                                         transform=blended_transform_factory(ax.transAxes, ax.transData)))
        big = order[a_bytes[order] >= 0.03 * layout.total]
        big = big[np.argsort(-a_bytes[big], kind="stable")][:25]
        for i in big:
            ax.text(1.005, (lo[i] + a_bytes[i] / div / 2) / max(layout.total / div, 1e-12),
                    f"alloc {a_id[i]} ({format_size(a_bytes[i])})", transform=ax.transAxes,
                    fontsize=7, va="center", color="#555")
    note = ""
    if n == 0:
        ax.text(0.5, 0.5, "no GPU page faults in this trace" if zoom_launches is None else
                "no GPU page faults in these launches", transform=ax.transAxes, ha="center", va="center")
    elif n <= SCATTER_MAX_POINTS:
        size = 6 if n < 2000 else (2 if n < 30000 else 0.6)
        order = np.argsort(-cidx, kind="stable")  # draw 'other' first, top kernels on top
        ax.scatter(x[order], y[order], c=colours[cidx[order]], s=size, lw=0, rasterized=True, zorder=2)
        note = f"every fault record drawn ({n:,} records)"
    else:
        ok = np.isfinite(y)
        xs, ys, cs, ws = x[ok], y[ok], cidx[ok], cnt[ok]
        xmin, xmax = float(xs.min()), float(xs.max())
        ymin, ymax = 0.0, layout.total / div
        xmax = xmax if xmax > xmin else xmin + 1e-9
        tb = np.minimum(((xs - xmin) / (xmax - xmin) * BIN_T).astype(np.int64), BIN_T - 1)
        ab = np.minimum(((ys - ymin) / max(ymax - ymin, 1e-12) * BIN_A).astype(np.int64), BIN_A - 1)
        K = len(colours)
        cell = (ab * BIN_T + tb)
        per = np.bincount(cell * K + cs, weights=ws, minlength=BIN_T * BIN_A * K).reshape(BIN_A, BIN_T, K)
        total = per.sum(axis=2)
        dom = per.argmax(axis=2)
        from matplotlib.colors import to_rgba_array
        rgb = to_rgba_array(colours)[dom]
        occupied = total > 0
        alpha = np.zeros_like(total)
        alpha[occupied] = 0.35 + 0.65 * np.log1p(total[occupied]) / np.log1p(total.max())
        rgb[..., 3] = alpha
        ax.imshow(rgb, origin="lower", aspect="auto", interpolation="nearest",
                  extent=(xmin, xmax, ymin, ymax), zorder=2)
        note = (f"binned: {n:,} fault records ({int(cnt.sum()):,} faults) drawn as {BIN_T} x {BIN_A} cells; "
                "a cell's colour is the kernel with most faults in it, its opacity grows with the fault count (log)")
        ax.text(0.01, 0.99, f"binned ({n:,} records)", transform=ax.transAxes, va="top", fontsize=8,
                bbox=dict(fc="white", ec="#999", alpha=0.85))
    ax.set_xlabel("time since trace start (ms)")
    ax.set_ylabel(f"virtual address ({unit}, allocations stacked, gaps removed)")
    if layout.total:
        ax.set_ylim(0, layout.total / div)
    from matplotlib.patches import Patch
    handles = [Patch(color=c, label=l) for l, c in (v.legend if v.has_other else v.legend[:-1])]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0, -0.12), ncol=3, frameon=False)
    if zoom_launches is None:
        ax.set_title(f"GPU page faults over time and address — {trace.name}")
        return figure(fig, "Fault scatter: time against virtual address",
                      "Each kernel should fault on its own address bands; diagonal streaks are sequential sweeps, "
                      "repeated vertical columns at every launch mean the same pages migrate again and again "
                      "(thrashing or full-mode eviction).", raster=True, note=note)
    ax.set_title(f"GPU page faults of the first {zoom_launches} launches — {trace.name}")
    return figure(fig, f"Fault scatter, zoomed on the first {zoom_launches} launches",
                  "Here single launches are visible: each kernel's faults should cover the same address bands on "
                  "every call, with sizes that follow its arguments; that regularity is what templates learn.",
                  raster=True, note=note)


def faults_over_time(trace: T.Trace, t0: int | None, nbins: int = 300):
    plt = setup_matplotlib()
    F, M = trace.faults, trace.migrations
    ft = F.column(T.TIME_NS).to_numpy().astype(np.int64)
    fc = F.column(T.COUNT).to_numpy().astype(np.float64)
    ms = M.column(T.START_NS).to_numpy().astype(np.int64)
    mb = M.column(T.BYTES).to_numpy().astype(np.float64)
    md = M.column(T.DIRECTION).to_numpy(zero_copy_only=False)
    times = [t for t in (ft, ms, M.column(T.END_NS).to_numpy().astype(np.int64)) if len(t)]
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(FIG_W, 5.2), sharex=True)
    if not times:
        a1.text(0.5, 0.5, "no faults or migrations", transform=a1.transAxes, ha="center")
        a1.set_ylabel("faults per ms")
        a2.set_ylabel("migrated GB/s")
        a2.set_xlabel("time since trace start (ms)")
        a1.set_title("Faults and migrated bytes over time")
        return figure(fig, "Faults and migrated bytes over time", "Nothing faulted or migrated in this trace.")
    base = t0 if t0 is not None else min(int(t.min()) for t in times)
    hi = max(int(t.max()) for t in times) - base
    width = max(hi / nbins, 1.0)   # ns per bin
    edges_ms = np.arange(nbins + 1) * width / 1e6
    fb = np.clip(((ft - base) / width).astype(np.int64), 0, nbins - 1)
    frate = np.bincount(fb, weights=fc, minlength=nbins) / (width / 1e6)  # per ms
    a1.stairs(frate, edges_ms, fill=True, color=PALETTE[0], alpha=0.8)
    a1.set_ylabel("GPU page faults per ms")
    a1.set_title(f"Faults and migrated bytes over time — {trace.name}")
    mbins = np.clip(((ms - base) / width).astype(np.int64), 0, nbins - 1)
    for d, colour in (("htod", PALETTE[1]), ("dtoh", PALETTE[2]), ("dtod", PALETTE[4])):
        sel = md == d
        if sel.any():
            rate = np.bincount(mbins[sel], weights=mb[sel], minlength=nbins) / width  # bytes/ns = GB/s
            a2.stairs(rate, edges_ms, label={"htod": "host→device", "dtoh": "device→host",
                                              "dtod": "device→device"}[d], color=colour, lw=1.4)
    if len(ms):
        a2.legend(loc="upper right")
    else:
        a2.text(0.5, 0.5, "no migrations recorded", transform=a2.transAxes, ha="center")
    a2.set_ylabel("migrated GB/s")
    a2.set_xlabel(f"time since trace start (ms); bins of {width / 1e6:.3g} ms")
    return figure(fig, "Faults and migrated bytes over time",
                  "Bursts of faults should line up with host→device traffic; device→host traffic means eviction, "
                  "and a flat, low transfer rate during fault bursts is the cost of fault-driven migration.",
                  note=f"{nbins} time bins of {width / 1e6:.3g} ms each")


def footprint_per_kernel(trace: T.Trace, s_top: list[dict]):
    plt = setup_matplotlib()
    top = s_top[:TOP_FOOTPRINT_KERNELS]
    fig, ax = plt.subplots(figsize=(FIG_W, 0.9 + 0.32 * max(len(top), 1)))
    if not top:
        ax.text(0.5, 0.5, "no launches", ha="center", transform=ax.transAxes)
    else:
        vals = np.array([k["touched_bytes"] for k in top], np.float64)
        div, unit = size_unit(vals.max())
        y = np.arange(len(top))[::-1]
        ax.barh(y, vals / div, color=PALETTE[0], alpha=0.85)
        ax.set_yticks(y, [short(base_name(k["kernel"]), 44) for k in top], fontsize=8)
        for yi, k, v in zip(y, top, vals):
            ax.text(v / div, yi, f"  {k['launches']:,} launches, {format_size(v / max(k['launches'], 1))}/launch",
                    va="center", fontsize=7, color="#333")
        ax.set_xlim(0, vals.max() / div * 1.35)
        ax.set_xlabel(f"bytes touched, summed over launches ({unit})")
    ax.set_ylabel("kernel")
    ax.set_title(f"Bytes touched per kernel (top {len(top)}) — {trace.name}")
    return figure(fig, "Bytes touched per kernel",
                  "The few kernels at the top move most of the data: their templates matter most for prefetching.")


def allocation_map(trace: T.Trace, fp: Footprints):
    plt = setup_matplotlib()
    A = trace.allocations
    n = A.num_rows
    nl = trace.n_launches
    fig_h = 1.2 + 0.24 * min(max(n, 1), MAX_ALLOC_BARS)
    fig, ax = plt.subplots(figsize=(FIG_W, fig_h))
    note = ""
    if n == 0:
        ax.text(0.5, 0.5, "no allocations recorded in this trace", ha="center", transform=ax.transAxes)
    else:
        addr = A.column(T.ADDRESS).to_numpy().astype(np.int64)
        nbytes = A.column(T.BYTES).to_numpy().astype(np.int64)
        first = A.column(T.FIRST_LAUNCH).to_numpy().astype(np.int64)
        last = pc.fill_null(A.column(T.LAST_LAUNCH), max(nl - 1, 0)).to_numpy().astype(np.int64)
        kinds = A.column(T.KIND).to_numpy(zero_copy_only=False)
        ids = A.column(T.ALLOC_ID).to_numpy()
        ps = trace.page_size
        spanned = (addr + nbytes + ps - 1) // ps - addr // ps          # pages the allocation overlaps
        frac = touched_pages(fp, addr, nbytes, ps) / np.maximum(spanned, 1)  # <= 1 even for unaligned ones
        sel = np.arange(n)
        if n > MAX_ALLOC_BARS:
            sel = np.argsort(-nbytes, kind="stable")[:MAX_ALLOC_BARS]
            note = f"the {MAX_ALLOC_BARS} largest of {n:,} allocations are shown"
        sel = sel[np.argsort(addr[sel], kind="stable")][::-1]
        y = np.arange(len(sel))
        kc = {"managed": PALETTE[0], "device": PALETTE[3], "host": PALETTE[2]}
        for yi, i in zip(y, sel):
            ax.barh(yi, max(last[i] - first[i] + 1, 0.6), left=first[i] - 0.5, height=0.7,
                    color=kc.get(kinds[i], OTHER_COLOUR), alpha=0.35 + 0.6 * frac[i])
            ax.text(min(last[i] + 0.5, nl - 0.5) if nl else 0, yi,
                    f"  {format_size(nbytes[i])}, {100 * frac[i]:.0f}% of its pages touched",
                    va="center", fontsize=7, color="#333")
        ax.set_yticks(y, [f"alloc {ids[i]} ({kinds[i]}) @0x{addr[i]:x}" for i in sel], fontsize=7)
        ax.set_xlim(-0.5, max(nl, 1) * 1.25)
    ax.set_xlabel("launch id (bar: first to last launch the allocation is live for; darker = more of it touched)")
    ax.set_ylabel("allocation (by address)")
    ax.set_title(f"Allocation map — {trace.name}")
    return figure(fig, "Allocation map",
                  "Large, pale allocations are mostly untouched: predicting the whole allocation (the baseline) "
                  "would move them for nothing, while per-kernel templates move only the touched part.", note=note)


def touched_pages(fp: Footprints, addr: np.ndarray, nbytes: np.ndarray, page_size: int) -> np.ndarray:
    """Pages of the union of all footprints that fall inside each byte range (vectorized)."""
    s, e = fp.union()
    if len(s) == 0:
        return np.zeros(len(addr), np.int64)
    cum = np.concatenate([[0], np.cumsum(e - s)]).astype(np.int64)

    def covered_below(p):  # union pages < p
        k = np.searchsorted(s, p, side="right") - 1
        kk = np.maximum(k, 0)
        inside = np.clip(p - s[kk], 0, e[kk] - s[kk])
        return np.where(k >= 0, cum[kk] + inside, 0)

    lo = addr // page_size
    hi = (addr + nbytes + page_size - 1) // page_size
    return covered_below(hi) - covered_below(lo)


def trace_sections(trace: T.Trace) -> list[Section]:

    s = trace_summary(trace, top=max(TOP_FOOTPRINT_KERNELS, 10))
    fp = footprints(trace)
    names, codes = kernel_codes(trace)
    t0 = time_origin(trace)
    sections = [summary_section(trace, s)]
    f = Section("Page faults", anchor="faults",
                intro="Where and when the GPU faulted. In full mode every launch starts with its managed memory "
                      "evicted, so its faults show its whole footprint; in natural mode only first touches fault.")
    view = FaultView(trace, names, codes, t0)
    f.add_figure(fault_scatter(trace, view))
    if trace.n_launches > 2 * ZOOM_LAUNCHES:
        f.add_figure(fault_scatter(trace, view, zoom_launches=ZOOM_LAUNCHES))
    f.add_figure(faults_over_time(trace, t0))
    sections.append(f)
    k = Section("Kernels and allocations", anchor="kernels")
    k.add_figure(footprint_per_kernel(trace, s["top_kernels"]))
    k.add_figure(allocation_map(trace, fp))
    sections.append(k)
    return sections
