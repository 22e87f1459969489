"""pagecast report: the three kinds of HTML report, bad input, and a real headless browser."""

from __future__ import annotations

import re
import shutil
import struct
import time
from pathlib import Path

import numpy as np
import pytest

from pagecast import trace as T
from pagecast.cli import main
from pagecast.demangle import demangle

MiB = 1 << 20
BASE = 0x7F00_0000_0000
KERNELS = ["_Z4vaddPfPKfS1_i", "_Z7stencilPfPKfii", "_Z6reducePKfPfi"]
# kernel -> [(allocation, offset, bytes)] it touches on every launch
RANGES = {0: [(0, 0, 32 * MiB), (1, 0, 32 * MiB), (2, 0, 32 * MiB)],
          1: [(1, 0, 64 * MiB), (3, 0, 96 * MiB)],
          2: [(3, 16 * MiB, 16 * MiB), (0, 0, 8 * MiB)]}
ALLOC_BYTES = np.array([64 * MiB, 64 * MiB, 32 * MiB, 128 * MiB], np.int64)
ALLOC_ADDR = BASE + np.arange(4, dtype=np.int64) * (1 << 30)   # 1 GiB apart: the layout removes the gaps


def make_trace(path: Path, n_launches: int = 12, pages_step: int = 16, seed: int = 0,
               with_migrations: bool = True) -> Path:
    """A full-mode trace of three kernels over four allocations; faults every `pages_step` pages."""
    rng = np.random.default_rng(seed)
    ps = 4096
    kid = np.arange(n_launches) % 3
    dur = 2_000_000
    start = np.arange(n_launches, dtype=np.int64) * 3_000_000 + 10**9
    L = {T.LAUNCH_ID: np.arange(n_launches), T.KERNEL: [KERNELS[k] for k in kid],
         T.DEVICE: np.zeros(n_launches, np.int32), T.STREAM: np.zeros(n_launches, np.int64),
         **{c: np.ones(n_launches, np.int32) for c in T.GRID_COLUMNS},
         T.SHARED_MEM_BYTES: np.zeros(n_launches, np.int32), T.START_NS: start, T.END_NS: start + dur,
         T.PARAM_OFFSETS: [[0, 8]] * n_launches, T.PARAM_SIZES: [[8, 4]] * n_launches,
         T.PARAM_DATA: [struct.pack("<Qi", int(ALLOC_ADDR[0]), 1024) + b"\0" * 4] * n_launches}
    tl, ta, tb, fl, fa, ft = [], [], [], [], [], []
    for i in range(n_launches):
        for a, off, nb in RANGES[int(kid[i])]:
            tl.append(i), ta.append(int(ALLOC_ADDR[a]) + off), tb.append(nb)
            pages = np.arange(0, nb // ps, pages_step)
            fl.append(np.full(len(pages), i))
            fa.append(ALLOC_ADDR[a] + off + pages * ps)
            ft.append(start[i] + np.sort(rng.integers(0, dur, len(pages))))
    fl, fa, ft = np.concatenate(fl), np.concatenate(fa), np.concatenate(ft)
    n = len(fa)
    F = {T.TIME_NS: ft, T.ADDRESS: fa.astype(np.uint64), T.COUNT: np.ones(n, np.int32),
         T.ACCESS: np.full(n, "read"), T.DEVICE: np.zeros(n, np.int32), T.LAUNCH_ID: fl}
    blk = 2 * MiB
    mb = np.unique(np.stack([fl, fa // blk]), axis=1) if with_migrations else np.zeros((2, 0), np.int64)
    ms = start[mb[0]] + 1000
    M = {T.START_NS: ms, T.END_NS: ms + 50_000, T.ADDRESS: (mb[1] * blk).astype(np.uint64),
         T.BYTES: np.full(mb.shape[1], blk), T.DIRECTION: np.full(mb.shape[1], "htod"),
         T.CAUSE: np.full(mb.shape[1], "coherence"), T.LAUNCH_ID: mb[0]}
    A = {T.ALLOC_ID: np.arange(4), T.ADDRESS: ALLOC_ADDR.astype(np.uint64), T.BYTES: ALLOC_BYTES,
         T.KIND: ["managed"] * 4, T.DEVICE: np.zeros(4, np.int32),
         T.FIRST_LAUNCH: np.zeros(4, np.int64), T.LAST_LAUNCH: [None] * 4}
    TR = {T.LAUNCH_ID: tl, T.ADDRESS: np.array(ta, np.uint64), T.BYTES: tb, T.ACCESS: ["readwrite"] * len(tl)}
    man = T.new_manifest(mode="full", source="synthetic", workload={"name": "toy", "argv": None})
    return T.write_trace(path, man, {T.LAUNCHES: L, T.ALLOCATIONS: A, T.FAULTS: F, T.MIGRATIONS: M, T.TRUTH: TR})


def make_results(path: Path, *, with_timeline: bool = True, n_launches: int = 60) -> Path:
    """Replay results as `pagecast replay -o` writes them (through results_io), three policies x three ratios."""
    from pagecast.replay.results_io import write_results
    tasks = ["jacobi2d", "stream", "resnet"]
    fp = 48 << 30
    runs, cols = [], {k: [] for k in ("run", "policy", "capacity_bytes", "task", "task_name", "launch_id",
                                      "kernel", "start_s", "end_s", "stall_s", "faults", "htod_bytes", "dtoh_bytes")}
    i = 0
    for ov in (1.5, 2.0, 3.0):
        cap = int(fp / ov)
        demand_t = None
        for p, stall in (("demand", 0.02), ("template", 0.001), ("oracle", 0.0005)):
            t = total_stall = 0.0
            for l in range(n_launches):
                st = stall * ov * (1 + (l % 5) / 10)
                for k, v in (("run", i), ("policy", p), ("capacity_bytes", cap), ("task", l % 3),
                             ("task_name", tasks[l % 3]), ("launch_id", l // 3), ("kernel", f"k{l % 3}"),
                             ("start_s", t), ("end_s", t + st + 0.002), ("stall_s", st), ("faults", int(st * 3e4)),
                             ("htod_bytes", 1 << 26), ("dtoh_bytes", 1 << 25)):
                    cols[k].append(v)
                t += st + 0.002
                total_stall += st
            demand_t = t if p == "demand" else demand_t
            runs.append(dict(policy=p, backend="sim", capacity_bytes=cap, oversub=ov, time_s=t, stall_s=total_stall,
                             faults=int(total_stall * 3e4), htod_bytes=int(fp * ov), dtoh_bytes=int(fp * (ov - 1)),
                             speedup_vs_demand=demand_t / t, workload="toy-mix", tasks=tasks, run=i,
                             **({} if p == "demand" else
                                {"plan_span": "block" if (p, ov) == ("template", 1.5) else "unit"})))
            i += 1
    return write_results(path, runs, cols if with_timeline else None)


@pytest.fixture(scope="module")
def toy_trace(tmp_path_factory) -> Path:
    return make_trace(tmp_path_factory.mktemp("rep") / "toy.pctrace")


@pytest.fixture(scope="module")
def toy_results(tmp_path_factory) -> Path:
    pytest.importorskip("pagecast.replay.results_io")
    return make_results(tmp_path_factory.mktemp("res") / "RESULTS.parquet")


@pytest.fixture(scope="module")
def trace_html(toy_trace, tmp_path_factory) -> Path:
    from pagecast.report.render import write_report
    return write_report(toy_trace, tmp_path_factory.mktemp("html") / "trace.html")


@pytest.fixture(scope="module")
def replay_html(toy_results, tmp_path_factory) -> Path:
    from pagecast.report.render import write_report
    return write_report(toy_results, tmp_path_factory.mktemp("html") / "replay.html")


@pytest.fixture(scope="module")
def model_html(mlp_model, tmp_path_factory) -> Path:
    from pagecast.report.render import write_report
    model_path, test = mlp_model
    return write_report(test, tmp_path_factory.mktemp("html") / "model.html", model=model_path)


def _images(html: str) -> list[str]:
    return re.findall(r'src="data:image/(svg\+xml|png);base64,', html)


def _figure_titles(html: str) -> list[str]:
    return re.findall(r'<figure class="plot"[^>]*><h3>([^<]*)</h3>', html)


def _check_every_figure_explained(html: str) -> None:
    figs = re.findall(r'<figure class="plot".*?</figure>', html, flags=re.S)
    assert figs
    for f in figs:
        assert re.search(r"<h3>[^<]+</h3>", f)
        look = re.search(r'<p class="look"><b>What to look for:</b> ([^<]+)</p>', f)
        assert look and len(look.group(1)) > 20 and look.group(1).rstrip().endswith(".")


def _svg_texts(html: str) -> str:
    """Decoded text of every embedded SVG (axis labels and titles are text there)."""
    import base64
    return "\n".join(base64.b64decode(b).decode() for b in re.findall(r'data:image/svg\+xml;base64,([^"]+)"', html))


# ---- the trace report ---------------------------------------------------------

def test_trace_report_has_plots_and_numbers(toy_trace, trace_html):
    from pagecast.summary import trace_summary

    html = trace_html.read_text()
    assert _figure_titles(html) == ["Fault scatter: time against virtual address", "Faults and migrated bytes over time",
                                    "Bytes touched per kernel", "Allocation map"]
    assert len(_images(html)) == 4
    assert 'data:image/png' in html            # the fault scatter is a raster
    _check_every_figure_explained(html)
    s = trace_summary(T.read_trace(toy_trace))
    assert f"<div class=\"v\">{s['launches']:,}</div>" in html
    # per 3 launches: vadd 3 x 512, stencil 1024 + 1536, reduce 256 + 128 fault records of one fault each
    assert s["faults"] == 4 * 4480 and f"{s['faults']:,}" in html
    # union footprint: 32 + 64 + 32 + 96 MiB (reduce's ranges lie inside the others')
    assert s["footprint_bytes"] == 224 * MiB and "224.0 MiB" in html
    for k in KERNELS:   # demangled for the reader
        assert demangle(k) in _html_unescape(html) and k not in html
    svg = _svg_texts(html)
    for label in ("GPU page faults per ms", "migrated GB/s", "bytes touched, summed over launches (MiB)",
                  "launch id (bar: first to last launch"):
        assert label in svg
    assert "every fault record drawn" in html
    assert "http://" not in html.replace("http://www.w3.org", "")  # nothing fetched at view time
    assert "<script" not in html


def test_trace_report_allocation_touched_fraction(toy_trace):
    from pagecast.footprints import footprints
    from pagecast.report.trace_report import touched_pages

    tr = T.read_trace(toy_trace)
    touched = touched_pages(footprints(tr), ALLOC_ADDR, ALLOC_BYTES, tr.page_size) * tr.page_size
    # allocation 0: vadd 32 MiB (reduce's 8 MiB inside it); 1: stencil 64; 2: vadd 32; 3: stencil 96 (reduce inside)
    assert touched.tolist() == [32 * MiB, 64 * MiB, 32 * MiB, 96 * MiB]


def test_address_layout_removes_gaps_and_keeps_stray_faults(toy_trace):
    from pagecast.report.trace_report import AddressLayout

    tr = T.read_trace(toy_trace)
    stray = np.array([BASE + (10 << 30) + 4096], np.int64)   # outside every allocation
    lay = AddressLayout(tr, stray)
    assert lay.total == int(ALLOC_BYTES.sum()) + (2 << 20)
    y = lay.map(np.array([ALLOC_ADDR[0], ALLOC_ADDR[1] + 5, ALLOC_ADDR[3], stray[0], BASE - 1], np.int64))
    assert y[:4].tolist() == [0, 64 * MiB + 5, (64 + 64 + 32) * MiB, ALLOC_BYTES.sum() + 4096]
    assert np.isnan(y[4])


def test_fault_scatter_is_binned_above_threshold(toy_trace, monkeypatch):
    from pagecast.report import trace_report as R

    tr = T.read_trace(toy_trace)
    names, codes = R.kernel_codes(tr)
    view = R.FaultView(tr, names, codes, R.time_origin(tr))
    monkeypatch.setattr(R, "SCATTER_MAX_POINTS", 100)
    fig = R.fault_scatter(tr, view)
    assert fig.kind == "png" and fig.note.startswith("binned: 17,920 fault records (17,920 faults) drawn as 900 x 500")
    monkeypatch.setattr(R, "SCATTER_MAX_POINTS", 10**6)
    assert R.fault_scatter(tr, view).note == "every fault record drawn (17,920 records)"


def test_large_trace_renders_quickly_and_stays_small(tmp_path):
    # 51 launches, a fault record every 8th page: 152,320 records, binned
    tr = make_trace(tmp_path / "big.pctrace", n_launches=51, pages_step=8)
    from pagecast.report.render import write_report
    t0 = time.perf_counter()
    out = write_report(tr, tmp_path / "big.html")
    took = time.perf_counter() - t0
    html = out.read_text()
    assert "binned: 152,320 fault records" in html
    # a zoom on the first launches, where single launches can be seen (8 x 8,960 records: binned too)
    assert _figure_titles(html)[1] == "Fault scatter, zoomed on the first 24 launches" and len(_images(html)) == 5
    assert "binned: 71,680 fault records" in html
    assert took < 20, f"report of 152k fault records took {took:.1f} s"
    assert out.stat().st_size < 1_500_000


def test_trace_without_migrations_or_allocations(tmp_path):
    from pagecast.report.render import write_report
    p = make_trace(tmp_path / "t.pctrace", n_launches=3, with_migrations=False)
    shutil.rmtree(p / T.ALLOCATIONS)
    (p / T.ALLOCATIONS).mkdir()
    html = write_report(p, tmp_path / "r.html").read_text()
    assert len(_images(html)) == 4
    assert "no allocations recorded" in _svg_texts(html)
    assert "no migrations recorded" in _svg_texts(html)


def test_trace_without_faults(toy_trace, tmp_path):
    from pagecast.report.render import write_report
    tr = T.read_trace(toy_trace)
    events = {T.TIME_NS: [1, 2, 3], T.EVENT: ["thrashing", "throttling", "thrashing"], T.ADDRESS: [None] * 3,
              T.VALUE: [1, 1, 1], T.DEVICE: [0, 0, 0], T.LAUNCH_ID: [0, 1, 2]}
    p = T.write_trace(tmp_path / "nofaults.pctrace", tr.manifest,
                      {T.LAUNCHES: tr.launches, T.ALLOCATIONS: tr.allocations, T.TRUTH: tr.truth,
                       T.UVM_EVENTS: events})
    html = write_report(p, tmp_path / "r.html").read_text()
    assert len(_images(html)) == 4
    assert "thrashing 2, throttling 1" in html      # the collector's optional uvm_events table
    assert "no GPU page faults in this trace" in html or "nothing faulted" in html.lower()


# ---- the replay report --------------------------------------------------------

def test_replay_report_has_plots_and_numbers(toy_results, replay_html):
    from pagecast.replay.results_io import read_results

    html = replay_html.read_text()
    assert _figure_titles(html) == ["Speedup per policy against oversubscription", "Bytes moved per policy",
                                    "Stall timeline per launch", "Multitask timeline"]
    assert len(_images(html)) == 4
    _check_every_figure_explained(html)
    runs, _ = read_results(toy_results)
    best = max(runs.column("speedup_vs_demand").to_pylist())
    assert f"{best:.3g}x" in html
    for pol in ("demand", "template", "oracle"):
        assert f"<td class=\"\">{pol}</td>" in html
    assert "<td class=\"\">template (blocks)</td>" in html   # a plan wider than units is named
    assert "jacobi2d" in html
    svg = _svg_texts(html)
    assert "speedup over demand paging (x)" in svg and "oversubscription (managed memory allocated / GPU capacity)" in svg
    assert "cumulative stall (s)" in svg
    assert "300% oversubscribed" in html   # timelines at the most oversubscribed capacity


def test_replay_report_without_timeline(tmp_path):
    pytest.importorskip("pagecast.replay.results_io")
    from pagecast.report.render import write_report
    res = make_results(tmp_path / "R.parquet", with_timeline=False)
    html = write_report(res, tmp_path / "r.html").read_text()
    assert len(_images(html)) == 2
    assert "No timeline beside" in html


def test_replay_report_of_several_workloads(tmp_path):
    """Results of a suite (as `pagecast demo` writes): speedups per workload, their geometric mean, and the
    timelines of the workload with most tasks."""
    pytest.importorskip("pagecast.replay.results_io")
    from pagecast.replay.results_io import read_results, timeline_path, write_results
    from pagecast.report.render import write_report
    import pyarrow.parquet as pq
    src = make_results(tmp_path / "R.parquet", n_launches=6)
    runs, tl = read_results(src)
    rows, tl_rows = [], []
    for j, (wl, tasks, factor) in enumerate((("stream", ["stream"], 2.0), ("jacobi2d", ["jacobi2d"], 0.5),
                                             ("mix:scientific", ["jacobi2d", "stream", "resnet"], 1.0))):
        for r in runs.to_pylist():
            sp = r["speedup_vs_demand"] * factor if r["policy"] != "demand" else 1.0
            rows.append(dict(r, workload=wl, tasks=tasks, run=r["run"] + 100 * j, speedup_vs_demand=sp))
        tl_rows += [dict(t, run=t["run"] + 100 * j) for t in tl.to_pylist()]
    import pyarrow as pa
    res = write_results(tmp_path / "S.parquet", rows, pa.Table.from_pylist(tl_rows, schema=tl.schema))
    assert pq.read_table(timeline_path(res)).num_rows == 3 * tl.num_rows
    html = write_report(res, tmp_path / "r.html").read_text()
    assert len(_images(html)) == 4
    assert '<div class="v">3</div><div class="k">workloads</div>' in html
    # geometric mean over the three workloads: factor 2 x 0.5 x 1 = 1, so it equals the one-workload speedup
    one = {(r["policy"], r["oversub"]): r["speedup_vs_demand"] for r in runs.to_pylist()}
    assert f"{one[('oracle', 3.0)]:.3g}x" in html and "geometric mean over 3 workloads" in html
    svg = _svg_texts(html)
    for wl in ("stream", "jacobi2d", "mix:scientific", "geometric mean over 3 workloads"):
        assert f">{wl}<" in svg
    assert "summed over 3 workloads" in svg
    assert "mix:scientific, capacity" in html        # the timelines show the multitask mix


def test_replay_report_dense_timelines_are_binned(toy_results, tmp_path, monkeypatch):
    from pagecast.report import replay_report
    from pagecast.report.render import write_report
    monkeypatch.setattr(replay_report, "MAX_STALL_POINTS", 10)   # the toy runs have 60 launches each
    html = write_report(toy_results, tmp_path / "r.html").read_text()
    assert len(_images(html)) == 4
    assert "the top panel shows the share of time stalled in 200 time bins" in html
    assert "each row is drawn in 900 time bins" in html
    assert "time stalled (% of each bin)" in _svg_texts(html)


def test_stall_share_and_segment_merging_are_exact():
    from pagecast.report.replay_report import _covered_before, _merge_segments
    s, e = np.array([0.0, 5, 7]), np.array([2.0, 6, 10])
    t = np.array([0, 1, 2, 3, 5.5, 8, 11])
    assert _covered_before(s, e, t).tolist() == [0, 1, 2, 2, 2.5, 4, 6]
    a, b = _merge_segments(np.array([0.0, 1, 5, 5.05, 9]), np.array([1.0, 2, 5.02, 6, 9]), 0.1)
    assert a.tolist() == [0, 5] and b.tolist() == [2, 6]      # touching and near segments merge; empty dropped


@pytest.mark.parametrize("variant", ["capacity-only", "no-demand", "sim-and-gpu"])
def test_replay_report_variants(variant, tmp_path):
    pytest.importorskip("pagecast.replay.results_io")
    from pagecast.replay.results_io import read_results, write_results
    from pagecast.report.render import write_report
    runs, _ = read_results(make_results(tmp_path / "R.parquet", with_timeline=False, n_launches=3))
    rows = runs.to_pylist()
    if variant == "capacity-only":      # runs made with --capacity: no oversubscription ratio
        for r in rows:
            r["oversub"] = None
    elif variant == "no-demand":        # no demand run: no speedups
        rows = [dict(r, speedup_vs_demand=None) for r in rows if r["policy"] != "demand"]
    else:                               # the same runs on the GPU backend beside the simulator's
        rows = rows + [dict(r, backend="gpu", run=r["run"] + 100) for r in rows]
    res = write_results(tmp_path / "V.parquet", rows)
    html = write_report(res, tmp_path / "r.html").read_text()
    assert len(_images(html)) == 2
    svg = _svg_texts(html)
    if variant == "capacity-only":
        assert svg.count("GPU capacity (GiB)") == 2   # x axis of both plots
    elif variant == "sim-and-gpu":
        assert "template (gpu)" in svg and "oracle (gpu)" in svg and "gpu, sim" in html
    else:
        assert "run time (s)" in svg and "No 'demand' run" in _html_unescape(html)


def _first_cards(html: str) -> list[tuple[str, str]]:
    return re.findall(r'<div class="num"><div class="v">([^<]*)</div><div class="k">([^<]*)</div>', html)


def test_replay_report_first_card_is_templates_result_beside_oracles_bound(toy_results, replay_html):
    """pagecast's own result comes first, the bound beside it: not the bound as the headline."""
    from pagecast.replay.results_io import read_results
    html = _html_unescape(replay_html.read_text())
    (v1, k1), (v2, k2) = _first_cards(html)[:2]
    assert k1.startswith("template: speedup over demand") and k2.startswith("oracle (the bound")
    runs = read_results(toy_results)[0].to_pylist()
    for card, pol in ((v1, "template"), (v2, "oracle")):
        want = [f"{r['speedup_vs_demand']:.3g}x" for r in sorted(runs, key=lambda r: r["oversub"])
                if r["policy"] == pol]
        assert card.startswith(" · ".join(want)) and card.endswith("at 150% · 200% · 300%"), card


def _grab_figures(monkeypatch) -> dict:
    """The replay report's matplotlib figures, measured (in pixels) as drawn, by title."""
    from pagecast.report import replay_report
    got, orig = {}, replay_report.figure

    def grab(fig, title, *a, **kw):
        fig.canvas.draw()
        r = fig.canvas.get_renderer()
        got[title] = {
            "axes": [(ax.get_window_extent(r), ax.title.get_window_extent(r)) for ax in fig.axes],
            "legends": [lg.get_window_extent(r) for lg in fig.legends],
            "lines": {ln.get_label(): (ln.get_linestyle(), ln.get_linewidth()) for ax in fig.axes
                      for ln in ax.get_lines()},
            "polys": [(c.get_paths(), c.get_facecolors()) for ax in fig.axes for c in ax.collections
                      if hasattr(c, "get_paths") and len(c.get_paths())],
            "images": [im.get_array() for ax in fig.axes for im in ax.get_images()],
            "suptitle": fig._suptitle.get_window_extent(r) if fig._suptitle is not None else None,
        }
        return orig(fig, title, *a, **kw)
    monkeypatch.setattr(replay_report, "figure", grab)
    return got


def test_replay_report_timelines_keep_clear_of_each_other(toy_results, tmp_path, monkeypatch):
    """No panel title struck through by the panel above; the stall legend off the lines; a policy
    whose line lies on another's (template on oracle) drawn in another style, beneath it."""
    from pagecast.report.render import write_report
    figs = _grab_figures(monkeypatch)
    write_report(toy_results, tmp_path / "r.html")
    g = figs["Multitask timeline"]
    panels = g["axes"]
    assert len(panels) == 3
    assert g["suptitle"].y0 >= panels[0][1].y1 - 0.5             # the figure's title above the first panel's
    for (upper, _), (_, title) in zip(panels, panels[1:]):
        assert title.y1 <= upper.y0 + 0.5, (title, upper)           # each title below the panel above
    assert g["legends"] and all(lg.y1 <= panels[-1][0].y0 + 0.5 for lg in g["legends"])   # the key below
    st = figs["Stall timeline per launch"]
    (top, _), (bottom, _) = st["axes"]
    for lg in st["legends"]:
        assert lg.y0 >= top.y1 - 0.5                                # above the panels, not on the 100% line
    (ls_t, lw_t), (ls_o, lw_o) = st["lines"]["template"], st["lines"]["oracle"]
    assert ls_t != ls_o and lw_t > lw_o                             # the wider line beneath shows


def _stall_heavy_results(path: Path, n_launches: int, waits: bool = False) -> Path:
    """Two tasks sharing the GPU under one policy that stalls 90% of the time (as alloc can): in each
    launch, or (`waits`) before each launch starts, its data still moving (the simulator's clock
    counts that wait in the launch's stall)."""
    from pagecast.replay.results_io import write_results
    cols = {k: [] for k in ("run", "policy", "capacity_bytes", "task", "task_name", "launch_id", "kernel",
                            "start_s", "end_s", "stall_s", "faults", "htod_bytes", "dtoh_bytes")}
    t = 0.0
    for l in range(n_launches):
        for k, v in (("run", 0), ("policy", "alloc"), ("capacity_bytes", 1 << 30), ("task", l % 2),
                     ("task_name", f"t{l % 2}"), ("launch_id", l // 2), ("kernel", "k"),
                     ("start_s", t + 0.009 * waits), ("end_s", t + 0.01), ("stall_s", 0.009), ("faults", 0),
                     ("htod_bytes", 1 << 20),
                     ("dtoh_bytes", 0)):
            cols[k].append(v)
        t += 0.01
    run = dict(policy="alloc", backend="sim", capacity_bytes=1 << 30, oversub=2.0, time_s=t,
               stall_s=0.009 * n_launches, faults=0, htod_bytes=1 << 30, dtoh_bytes=0, speedup_vs_demand=None,
               workload="mix", tasks=["t0", "t1"], run=0)
    return write_results(path, [run], cols)


@pytest.mark.parametrize("waits", [False, True])
@pytest.mark.parametrize("dense", [False, True])
def test_multitask_timeline_draws_stalls_in_the_legends_red(tmp_path, monkeypatch, dense, waits):
    """A run stalled 90% of the time is 90% red, as its title and the legend say, drawn per launch or binned."""
    from matplotlib.colors import to_rgb
    from pagecast.report import replay_report
    from pagecast.report.render import write_report
    if dense:
        monkeypatch.setattr(replay_report, "MAX_STALL_POINTS", 10)
    figs = _grab_figures(monkeypatch)
    write_report(_stall_heavy_results(tmp_path / "R.parquet", 40, waits), tmp_path / "r.html")
    g = figs["Multitask timeline"]
    red = np.array(to_rgb(replay_report.STALL_RED))
    if not dense:
        widths = {True: 0.0, False: 0.0}
        for paths, colours in g["polys"]:
            for p, c in zip(paths, colours):
                x = p.vertices[:, 0]
                widths[bool(np.allclose(c[:3], red))] += x.max() - x.min()
        assert abs(widths[True] / (widths[True] + widths[False]) - 0.9) < 0.02
    else:
        rgb = np.concatenate([np.asarray(im)[0] for im in g["images"]])
        rgb = rgb[rgb[:, 3] > 0, :3]   # the bins a task ran in: from its colour (computing) to red (stalled)
        redness = 1 - np.linalg.norm(rgb - red, axis=1) / np.linalg.norm(rgb - red, axis=1).max()
        assert len(rgb) > 100 and abs(redness.mean() - 0.9) < 0.05


def test_single_task_report_draws_no_multitask_timeline(tmp_path):
    """One workload alone: the stall timeline, but no one-row multitask panel."""
    from pagecast.replay.results_io import read_results, write_results
    from pagecast.report.render import write_report
    runs, tl = read_results(make_results(tmp_path / "R.parquet", n_launches=6))
    one = tl.to_pylist()
    for t in one:
        t["task"], t["task_name"] = 0, "jacobi2d"
    import pyarrow as pa
    rows = [dict(r, workload="jacobi2d", tasks=["jacobi2d"]) for r in runs.to_pylist()]
    html = write_report(write_results(tmp_path / "S.parquet", rows, pa.Table.from_pylist(one, schema=tl.schema)),
                        tmp_path / "r.html").read_text()
    assert _figure_titles(html) == ["Speedup per policy against oversubscription", "Bytes moved per policy",
                                    "Stall timeline per launch"]


# ---- the model report ----------------------------------------------------------

@pytest.fixture(scope="module")
def mlp_model(tmp_path_factory):
    """A model fitted on one mlp-train trace, and another trace of the same workload (another seed)."""
    pytest.importorskip("pagecast.predict.fit")
    from pagecast.datasets.registry import make_trace as make_workload
    from pagecast.predict.fit import fit_model
    from pagecast.predict.model_io import save_model
    d = tmp_path_factory.mktemp("model")
    train = make_workload("mlp-train", d / "train.pctrace", scale=0.05, seed=0)
    test = make_workload("mlp-train", d / "test.pctrace", scale=0.05, seed=1)
    model = save_model(fit_model([T.read_trace(train)]), d / "model.json")
    return model, test


def test_model_report_has_plots_and_numbers(mlp_model, model_html):
    from pagecast.predict.evaluate import evaluate
    from pagecast.predict.model_io import load_model

    model_path, test = mlp_model
    html = model_html.read_text()
    assert _figure_titles(html) == ["Precision and recall per template class", "Precision and recall per kernel",
                                    "Predicted against observed footprint"]
    assert len(_images(html)) == 3
    _check_every_figure_explained(html)
    model = load_model(model_path)
    ev = evaluate(model, T.read_trace(test), fallback="history")
    ov, base = ev["overall"], ev["baseline"]
    for label, v in (("precision", ov["precision"]), ("recall", ov["recall"]),
                     ("allocation baseline precision", base["precision"])):
        assert f'<div class="v">{100 * v:.2f}%</div><div class="k">{label}</div>' in html
    # every kernel is listed with its formulas, as the model writes them
    for k in ev["kernels"]:
        assert _html_escape(demangle(k["kernel"])) in html   # demangled for the reader
        km = model.kernels.get(k["kernel"])
        if km is not None and km.regions:
            assert _html_escape(km.regions[0].text()) in html
    svg = _svg_texts(html)
    assert "precision and recall (% of bytes)" in svg and "template class" in svg
    assert "allocation baseline" in svg
    assert re.search(r"launch \d+: ", svg)


def _html_escape(s: str) -> str:
    import html as _h
    return _h.escape(s, quote=True)


def test_model_report_with_unseen_kernels(mlp_model, tmp_path):
    from pagecast.report.render import write_report
    model_path, _ = mlp_model
    other = make_trace(tmp_path / "toy.pctrace", n_launches=6, pages_step=64)   # kernels the model never saw
    html = write_report(other, tmp_path / "m.html", model=model_path).read_text()
    assert len(_images(html)) == 3
    assert "not seen" in html and "(not in the model: unseen kernel)" in html


def test_set_ops_splits_hits_misses_and_extras():
    from pagecast.report.model_report import _set_ops
    a_s, a_e = np.array([0, 10]), np.array([5, 20])      # footprint
    b_s, b_e = np.array([3, 15]), np.array([12, 25])     # prediction
    s, e, ia, ib = _set_ops(a_s, a_e, b_s, b_e)
    got = [(int(x), int(y), bool(p), bool(q)) for x, y, p, q in zip(s, e, ia, ib)]
    assert got == [(0, 3, True, False), (3, 5, True, True), (5, 10, False, True), (10, 12, True, True),
                   (12, 15, True, False), (15, 20, True, True), (20, 25, False, True)]


# ---- command line and bad input ---------------------------------------------------

def test_cli_writes_refuses_overwrite_and_forces(tmp_path, capsys):
    toy_trace = make_trace(tmp_path / "tiny.pctrace", n_launches=3, pages_step=256)
    out = tmp_path / "r.html"
    assert main(["report", str(toy_trace), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "wrote report" in err and str(out) in err
    size = out.stat().st_size
    assert main(["report", str(toy_trace), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "exists" in err and "--force" in err and len(err.strip().splitlines()) == 1
    assert out.stat().st_size == size
    assert main(["report", str(toy_trace), "-o", str(out), "--force"]) == 0


@pytest.mark.parametrize("what", ["text-file", "plain-dir", "missing", "parquet", "empty-trace",
                                  "symlink-loop", "results-without-policy"])
def test_bad_input_is_one_line_exit_2(what, tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq
    if what == "text-file":
        p = tmp_path / "x.txt"
        p.write_text("hello")
    elif what == "plain-dir":
        p = tmp_path / "d"
        p.mkdir()
    elif what == "missing":
        p = tmp_path / "nope.pctrace"
    elif what == "parquet":
        p = tmp_path / "other.parquet"
        pq.write_table(pa.table({"a": [1, 2]}), p)
    elif what == "symlink-loop":  # was an internal error (RuntimeError from Path.resolve)
        p = tmp_path / "loop1"
        p.symlink_to(tmp_path / "loop2")
        (tmp_path / "loop2").symlink_to(p)
    elif what == "results-without-policy":  # was an internal error (KeyError)
        p = make_results(tmp_path / "R.parquet")
        pq.write_table(pq.read_table(p).drop_columns(["policy"]), p)
    else:
        p = T.write_trace(tmp_path / "empty.pctrace", T.new_manifest(), {})
    out = tmp_path / "r.html"
    assert main(["report", str(p), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("pagecast report: error:") and str(p) in err
    assert "Traceback" not in err
    if what == "empty-trace":
        assert "no launches" in err
    assert not out.exists()


@pytest.mark.parametrize("what", ["timeline-garbage", "timeline-without-start_s", "timeline-is-results",
                                  "timeline-all-strings", "timeline-end-inf", "results-time-as-string",
                                  "results-version-99", "results-version-abc"])
def test_malformed_results_or_timeline_is_one_line_exit_2(what, tmp_path, capsys):
    # a-e were internal errors (ArrowInvalid, KeyError, ArrowTypeError, matplotlib's "Axis limits cannot be
    # NaN or Inf", ValueError of a format code), exit 1; results of another version were reported
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pagecast.replay.results_io import timeline_path
    p = make_results(tmp_path / "R.parquet", n_launches=6)
    tl_path = timeline_path(p)
    runs, tl = pq.read_table(p), pq.read_table(tl_path)
    named, needle = (tl_path if what.startswith("timeline") else p), {
        "timeline-garbage": "unreadable Parquet", "timeline-without-start_s": "without the column 'start_s'",
        "timeline-is-results": "not the timeline of replay results", "timeline-all-strings": "not integers",
        "timeline-end-inf": "'end_s' holds inf", "results-time-as-string": "'time_s' holds string, not numbers",
        "results-version-99": "results version is '99'", "results-version-abc": "results version is 'abc'"}[what]
    if what == "timeline-garbage":
        tl_path.write_bytes(b"PAR1" + bytes(range(256)) * 3)
    elif what == "timeline-without-start_s":
        pq.write_table(tl.drop_columns(["start_s"]), tl_path)
    elif what == "timeline-is-results":
        tl_path.write_bytes(p.read_bytes())
    elif what == "timeline-all-strings":
        pq.write_table(pa.table({c: tl.column(c).cast(pa.string()) for c in tl.column_names})
                       .replace_schema_metadata(tl.schema.metadata), tl_path)
    elif what == "timeline-end-inf":
        end = pa.array([float("inf")] * tl.num_rows)
        pq.write_table(tl.set_column(tl.schema.get_field_index("end_s"), "end_s", end), tl_path)
    elif what == "results-time-as-string":
        i = runs.schema.get_field_index("time_s")
        pq.write_table(runs.set_column(i, "time_s", runs.column(i).cast(pa.string())), p)
    else:
        pq.write_table(runs.replace_schema_metadata({**runs.schema.metadata,
                                                     b"pagecast.version": what.rsplit("-", 1)[1].encode()}), p)
    out = tmp_path / "r.html"
    assert main(["report", str(p), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"pagecast report: error: {named}: "), err
    assert needle in err and "Traceback" not in err
    assert not out.exists()


def test_report_never_overwrites_its_input(toy_results, capsys):
    size = toy_results.stat().st_size
    assert main(["report", str(toy_results), "-o", str(toy_results), "--force"]) == 2
    err = capsys.readouterr().err   # refused before any work: its suffix names Parquet, not HTML
    assert "overwrite its own input" in err or "report writes HTML, not Parquet" in err, err
    assert toy_results.stat().st_size == size


def test_model_with_results_is_refused(toy_results, tmp_path, capsys):
    m = tmp_path / "m.json"
    m.write_text("{}")
    assert main(["report", str(toy_results), "--model", str(m), "-o", str(tmp_path / "r.html")]) == 2
    assert "take no --model" in capsys.readouterr().err


def test_missing_or_malformed_model_file(toy_trace, tmp_path, capsys):
    assert main(["report", str(toy_trace), "--model", str(tmp_path / "none.json"), "-o", str(tmp_path / "r.html")]) == 2
    assert "no such model" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["report", str(toy_trace), "--model", str(bad), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(bad) in err and not (tmp_path / "r.html").exists()


# ---- a real headless browser ---------------------------------------------------

def _chromium():
    from pagecast.report.browser import find_chromium
    return find_chromium()


@pytest.mark.skipif(_chromium() is None, reason="chromium is not installed (CI installs Debian's chromium)")
def test_reports_render_in_headless_chromium(trace_html, model_html, replay_html):
    from pagecast.report.browser import probe
    paths = [(trace_html, 4), (model_html, 3), (replay_html, 4)]
    for p, n_figures in paths:
        got = probe(p, width=1366, height=900)
        assert got["errors"] == [], got["errors"]
        assert got["figures"] == n_figures and len(got["imgs"]) == n_figures
        for im in got["imgs"]:
            assert im["ok"] and im["nw"] > 100 and im["nh"] > 100 and im["w"] > 100 and im["h"] > 50, im
        assert got["width"] <= got["viewport"], "the page scrolls sideways on a laptop-sized window"


@pytest.mark.skipif(_chromium() is None, reason="chromium is not installed (CI installs Debian's chromium)")
def test_replay_report_screenshots(replay_html, tmp_path):
    """The replay report as scripts/report_screenshots.py takes it: a full-page PNG at 1400 px, and a
    single-task report with its three figures (no multitask panel) renders too."""
    from PIL import Image

    from pagecast.replay.results_io import read_results, write_results
    from pagecast.report.browser import probe, screenshot
    from pagecast.report.render import write_report
    png = screenshot(replay_html, tmp_path / "replay.png")
    with Image.open(png) as im:
        assert im.size[0] == 1400 and im.size[1] > 1500
    runs, tl = read_results(make_results(tmp_path / "R.parquet", n_launches=6))
    import pyarrow as pa
    one = [dict(t, task=0, task_name="jacobi2d") for t in tl.to_pylist()]
    res = write_results(tmp_path / "S.parquet", [dict(r, workload="jacobi2d", tasks=["jacobi2d"])
                                                 for r in runs.to_pylist()],
                        pa.Table.from_pylist(one, schema=tl.schema))
    got = probe(write_report(res, tmp_path / "one.html"))
    assert got["errors"] == [] and got["figures"] == 3


def _html_unescape(s: str) -> str:
    import html as _h
    return _h.unescape(s)


def test_replay_report_panels_readable(tmp_path):
    """Twelve workloads (the demo's count): every one has a panel; ticks sit at the data (150/200/300%, not
    1.6...3.0); template equal to oracle stays visible (its share of oracle is written in each panel); every
    panel has one y scale, and the figure says which."""
    pytest.importorskip("pagecast.replay.results_io")
    from pagecast.replay.results_io import read_results, write_results
    from pagecast.report.render import write_report
    runs, _ = read_results(make_results(tmp_path / "R.parquet", with_timeline=False, n_launches=3))
    one = runs.to_pylist()
    oracle_t = {r["oversub"]: r["time_s"] for r in one if r["policy"] == "oracle"}
    rows = []
    for j in range(12):
        f = 30.0 if j == 0 else 1.0   # one workload's speedups far above the others': a log scale for all
        for r in one:
            t = oracle_t[r["oversub"]] if r["policy"] == "template" else r["time_s"]   # template on oracle
            sp = 1.0 if r["policy"] == "demand" else f * r["speedup_vs_demand"]
            rows.append(dict(r, workload=f"wl{j:02d}", tasks=[f"wl{j:02d}"], run=r["run"] + 100 * j, time_s=t,
                             speedup_vs_demand=sp))
    html = write_report(write_results(tmp_path / "S.parquet", rows, None), tmp_path / "r.html").read_text()
    svg = _svg_texts(html)
    for j in range(12):
        assert f">wl{j:02d}<" in svg
    assert "first 11" not in html
    for tick in (">150%<", ">200%<", ">300%<"):
        assert tick in svg
    assert svg.count("template = 100% · 100% · 100% of oracle") == 12   # under each panel's title
    assert "log scale" in svg and "one logarithmic y scale" in html
    assert ">1.6<" not in svg
