"""The simulator against a peer (libCacheSim), its policies, plans, sweeps and timing."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from pagecast import trace as T
from pagecast.footprints import footprints
from pagecast.replay import policies as P
from pagecast.replay.policies import alloc as PA
from pagecast.replay.plan import groups as PG
from pagecast.replay.policies import template as PT
from pagecast.replay.sim import run as R
from pagecast.replay.sim import stack as ST
from pagecast.replay.costs import load_profile
from pagecast.replay.sim.sweep import SimConfig, replay_sim
from pagecast.replay.unit_space import ID, build_workload, unit_width

lcs = pytest.importorskip("libcachesim")

PS = 4096
BASE = 0x7F10_0000_0000
INT64_MAX = np.iinfo(np.int64).max


def page_trace(path, launches, *, name="pages", n_allocs=1, base=BASE, compute_ns=10_000, top=None):
    """A synthetic trace: launch i touches exactly the pages launches[i] (offsets from `base`);
    the span (up to the last page touched, or `top` pages) is cut into n_allocs allocations and each
    launch points at those it touches."""
    n = len(launches)
    if top is None:
        top = max((int(p.max()) for p in launches if len(p)), default=0) + 1
    cuts = np.unique(np.linspace(0, top, n_allocs + 1).astype(np.int64))
    a_lo, a_hi = cuts[:-1], cuts[1:]
    params = []
    for p in launches:
        hit = [k for k in range(len(a_lo)) if len(p) and ((p >= a_lo[k]) & (p < a_hi[k])).any()] or [0]
        params.append(hit)
    start = np.arange(n, dtype=np.int64) * (compute_ns + 1000)
    L = {T.LAUNCH_ID: np.arange(n), T.KERNEL: ["_Z1kPf"] * n, T.DEVICE: np.zeros(n, np.int32),
         T.STREAM: np.zeros(n, np.int64), **{c: np.ones(n, np.int32) for c in T.GRID_COLUMNS},
         T.SHARED_MEM_BYTES: np.zeros(n, np.int32), T.START_NS: start, T.END_NS: start + compute_ns,
         T.PARAM_OFFSETS: [[8 * j for j in range(len(h))] for h in params],
         T.PARAM_SIZES: [[8] * len(h) for h in params],
         T.PARAM_DATA: [b"".join(struct.pack("<Q", base + int(a_lo[k]) * PS) for k in h) for h in params]}
    A = {T.ALLOC_ID: np.arange(len(a_lo)), T.ADDRESS: (base + a_lo * PS).astype(np.uint64),
         T.BYTES: (a_hi - a_lo) * PS, T.KIND: ["managed"] * len(a_lo), T.DEVICE: np.zeros(len(a_lo), np.int32),
         T.FIRST_LAUNCH: np.zeros(len(a_lo), np.int64), T.LAST_LAUNCH: [None] * len(a_lo)}
    tl, ta = [], []
    for i, p in enumerate(launches):
        p = np.unique(np.asarray(p, np.int64))
        tl.append(np.full(len(p), i)), ta.append(base + p * PS)
    n_tr = int(sum(len(x) for x in tl))
    TR = {T.LAUNCH_ID: np.concatenate(tl), T.ADDRESS: np.concatenate(ta).astype(np.uint64),
          T.BYTES: np.full(n_tr, PS), T.ACCESS: ["read"] * n_tr}
    empty_f = {T.TIME_NS: [], T.ADDRESS: np.zeros(0, np.uint64), T.COUNT: np.zeros(0, np.int32), T.ACCESS: [],
               T.DEVICE: np.zeros(0, np.int32), T.LAUNCH_ID: np.zeros(0, np.int64)}
    empty_m = {T.START_NS: [], T.END_NS: [], T.ADDRESS: np.zeros(0, np.uint64), T.BYTES: np.zeros(0, np.int64),
               T.DIRECTION: [], T.CAUSE: [], T.LAUNCH_ID: np.zeros(0, np.int64)}
    man = T.new_manifest(mode="full", source="synthetic", workload={"name": name, "argv": None})
    T.write_trace(path, man, {T.LAUNCHES: L, T.ALLOCATIONS: A, T.FAULTS: empty_f, T.MIGRATIONS: empty_m,
                              T.TRUTH: TR})
    return T.read_trace(path)


def page_sequence(trace) -> np.ndarray:
    """Each launch's footprint pages in ascending address order, concatenated."""
    fp = footprints(trace)
    return np.concatenate([fp.pages(i) for i in range(fp.n_launches)])


def lcs_misses(cls, seq: np.ndarray, cap_pages: int) -> int:
    """libCacheSim's misses; its cache_size is in bytes (objects weigh obj_size)."""
    c = cls(cache_size=cap_pages * PS)
    r = lcs.Request()
    miss = 0
    for t, u in enumerate(seq.tolist()):
        r.obj_id, r.obj_size, r.clock_time = u, PS, t
        miss += not c.get(r)
    return miss


def lcs_belady(seq: np.ndarray, cap_pages: int) -> int:
    nxt = np.full(len(seq), INT64_MAX, np.int64)
    last: dict[int, int] = {}
    for t in range(len(seq) - 1, -1, -1):
        u = int(seq[t])
        nxt[t] = last.get(u, INT64_MAX)
        last[u] = t
    c = lcs.Belady(cache_size=cap_pages * PS)
    r = lcs.Request()
    miss = 0
    for t, u in enumerate(seq.tolist()):
        r.obj_id, r.obj_size, r.clock_time, r.next_access_vtime = u, PS, t, int(nxt[t])
        miss += not c.get(r)
    return miss


NONE = load_profile("none")
PEER = SimConfig(costs="none", granularity=PS, eviction_unit=PS, driver_prefetch=False)


def pages_in(run) -> int:
    return run["htod_bytes"] // PS


@pytest.fixture(scope="module")
def workloads(tmp_path_factory):
    """Several page-touch patterns: datasets' workload models and random ones."""
    from pagecast.datasets.registry import make_trace
    d = tmp_path_factory.mktemp("wl")
    out = {}
    for name, scale in (("jacobi2d", 0.05), ("spmv-cg", 0.05), ("stream", 0.02)):
        out[name] = T.read_trace(make_trace(name, d / f"{name}.pctrace", scale=scale, seed=5))
    rng = np.random.default_rng(7)
    # random ranges over 300 pages, 1..40 pages per launch, some reuse
    L = [np.arange(s, s + k) for s, k in zip(rng.integers(0, 260, 400), rng.integers(1, 40, 400))]
    out["ranges"] = page_trace(d / "ranges.pctrace", L, name="ranges")
    # zipf-ish scattered pages
    L = [np.unique(rng.zipf(1.4, rng.integers(1, 12)) % 500) for _ in range(600)]
    out["scatter"] = page_trace(d / "scatter.pctrace", L, name="scatter")
    return out


@pytest.mark.parametrize("name", ["jacobi2d", "spmv-cg", "stream", "ranges", "scatter"])
@pytest.mark.parametrize("eviction", ["lru", "fifo"])
def test_demand_equals_libcachesim(workloads, name, eviction):
    """4 KiB units and eviction, no driver prefetch: pages brought in == libCacheSim's misses."""
    tr = workloads[name]
    seq = page_sequence(tr)
    fp = footprints(tr)
    largest = int(fp.pages_per_launch().max())
    union = fp.union_pages()
    caps = sorted({largest, (largest + union) // 2, max(largest, union * 2 // 3), union})
    cfg = SimConfig(costs="none", granularity=PS, eviction_unit=PS, driver_prefetch=False, eviction=eviction)
    runs, _ = replay_sim([tr], ["demand"], capacity=[c * PS for c in caps], config=cfg)
    ref = lcs.LRU if eviction == "lru" else lcs.FIFO
    for c, run in zip(caps, runs):
        assert pages_in(run) == run["faults"] == lcs_misses(ref, seq, c), (name, eviction, c)


def test_lru_one_pass_matches_per_capacity_runs(workloads):
    """The stack-distance sweep and the step-by-step engine agree on every counter and time."""
    tr = workloads["ranges"]
    prof = load_profile("pcie4")
    w = build_workload([tr], gran=PS, eviction_unit=PS, profile=prof)
    caps = [40, 90, 150, 250]
    one = ST.demand_lru_all(w, caps, prof)
    for cap, r1 in zip(caps, one):
        r2 = R.run_policy(w, P.Demand(), cap, prof, P.Options(eviction="lru", driver_prefetch=False))
        np.testing.assert_array_equal(r1.counters, r2.counters)
        np.testing.assert_allclose(r1.end, r2.end)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_oracle_equals_belady_on_single_page_launches(tmp_path, seed):
    rng = np.random.default_rng(seed)
    U = int(rng.integers(20, 80))
    seq = (rng.zipf(1.3, 1500) % U) if seed % 2 else rng.integers(0, U, 1500)
    tr = page_trace(tmp_path / "one.pctrace", [np.array([p]) for p in seq], name="single")
    s = page_sequence(tr)
    caps = [1, U // 4, U // 2, U - 1]
    runs, _ = replay_sim([tr], ["oracle"], capacity=[c * PS for c in caps], config=PEER)
    for c, run in zip(caps, runs):
        assert run["faults"] == 0
        assert pages_in(run) == lcs_belady(s, c), (seed, c)


def test_oracle_equals_belady_on_workload_pages(workloads):
    """Belady on each launch's pages, counted in transfers, when the capacity holds every launch:
    the planner moves no more pages than libCacheSim's Belady misses, and faults none."""
    tr = workloads["ranges"]
    fp = footprints(tr)
    largest = int(fp.pages_per_launch().max())
    runs, _ = replay_sim([tr], ["oracle", "demand"], capacity=[largest * PS, 2 * largest * PS], config=PEER)
    seq = page_sequence(tr)
    for run in runs:
        if run["policy"] == "oracle":
            assert run["faults"] == 0
            # launches as units make Belady's choice coarser than per page: never better than it
            assert pages_in(run) >= lcs_belady(seq, run["capacity_bytes"] // PS)
            demand = next(r for r in runs if r["policy"] == "demand" and r["capacity_bytes"] == run["capacity_bytes"])
            assert pages_in(run) <= pages_in(demand)


def test_planned_policies_beat_demand_on_a_mix(workloads):
    trs = [workloads["jacobi2d"], workloads["spmv-cg"], workloads["stream"]]
    runs, tl = replay_sim(trs, ["demand", "alloc", "oracle", "swap"], oversub=[1.5, 3.0],
                          config=SimConfig(costs="msched-rtx5080", timeslice_ms=0.05))
    by = {(r["policy"], r["oversub"]): r for r in runs}
    for o in (1.5, 3.0):
        assert by[("oracle", o)]["time_s"] < by[("demand", o)]["time_s"]
        assert by[("oracle", o)]["speedup_vs_demand"] > 1
        assert by[("oracle", o)]["fraction_of_oracle"] == 1.0
        assert by[("demand", o)]["stall_s"] > by[("oracle", o)]["stall_s"]
    r = runs[0]
    assert r["tasks"] == ["jacobi2d", "spmv-cg", "stream"] and r["workload"] == "jacobi2d+spmv-cg+stream"
    # the timeline: one row per launch per run, ordered in time, tasks interleaved
    assert tl.num_rows == len(runs) * sum(t.n_launches for t in trs)
    first = tl.filter(tl.column("run").to_numpy() == 0)
    st = first.column("start_s").to_numpy()
    en = first.column("end_s").to_numpy()
    assert (np.diff(st) >= 0).all() and (en >= st).all()
    tasks = first.column("task").to_numpy()
    assert (tasks[1:] != tasks[:-1]).sum() >= 6
    assert first.column("faults").to_numpy().sum() == runs[0]["faults"]


def test_none_profile_charges_nothing_and_costs_scale(workloads):
    tr = workloads["jacobi2d"]
    r0, _ = replay_sim([tr], ["demand"], oversub=[2], config=SimConfig(costs="none"))
    assert r0[0]["time_s"] == 0 and r0[0]["stall_s"] == 0 and r0[0]["faults"] > 0
    r3, _ = replay_sim([tr], ["demand"], oversub=[2], config=SimConfig(costs="pcie3"))
    r5, _ = replay_sim([tr], ["demand"], oversub=[2], config=SimConfig(costs="msched-rtx5080"))
    assert r3[0]["faults"] == r5[0]["faults"] and r3[0]["stall_s"] > r5[0]["stall_s"] > 0


def test_fault_cost_model_by_hand(tmp_path):
    """Two launches, cold memory, prefetcher off: a fault per 4 KiB page, each launch's faults one batch
    in one VA block, charged per fault, per block and per batch; the rest is compute."""
    tr = page_trace(tmp_path / "t.pctrace", [np.arange(0, 32), np.arange(32, 48)], compute_ns=50_000)
    cfg = SimConfig(costs="msched-rtx5080", driver_prefetch=False)
    runs, tl = replay_sim([tr], ["demand"], capacity=[64 << 20], config=cfg)
    r = runs[0]
    p = load_profile("msched-rtx5080")
    assert r["faults"] == 48 and r["htod_bytes"] == 48 * PS and r["dtoh_bytes"] == 0
    assert r["fault_batches"] == 2 and r["blocks_serviced"] == 2
    stall = 48 * p.fault_time_s + 2 * (p.block_service_s + p.batch_overhead_s)
    assert r["stall_s"] == pytest.approx(stall)
    assert r["time_s"] == pytest.approx(stall + 2 * 50e-6)
    assert tl.column("faults").to_pylist() == [32, 16]


def test_tree_prefetcher_cuts_sequential_faults(tmp_path):
    """A 2 MiB block read one big page a launch: faults at units 0, 1, 2, 4, 8, 16 (past 51%, the
    region fills), 16 pages each; without the prefetcher every 4 KiB page faults."""
    tr = page_trace(tmp_path / "t.pctrace", [np.arange(16 * i, 16 * i + 16) for i in range(32)])
    on, _ = replay_sim([tr], ["demand"], capacity=[64 << 20], config=SimConfig(costs="none"))
    off, _ = replay_sim([tr], ["demand"], capacity=[64 << 20], config=SimConfig(costs="none", driver_prefetch=False))
    assert off[0]["faults"] == 512
    assert on[0]["faults"] == 6 * 16 and on[0]["fault_batches"] == 6
    assert on[0]["htod_bytes"] == off[0]["htod_bytes"] == 2 << 20


def test_thrashing_launch_is_simulated_not_refused(tmp_path):
    tr = page_trace(tmp_path / "t.pctrace", [np.arange(0, 64)] * 5)
    runs, _ = replay_sim([tr], ["demand", "oracle"], capacity=[32 * PS], config=PEER)
    for r in runs:
        assert r["thrashing_launches"] == 5 and r["faults"] > 0
    oracle = next(r for r in runs if r["policy"] == "oracle")
    # it streams: at most one launch's overflow (plus one unit) faults per launch
    assert oracle["faults"] <= 5 * (64 - 32 + 1) + 32


def test_swap_moves_whole_tasks(tmp_path):
    a = page_trace(tmp_path / "a.pctrace", [np.arange(0, 16)] * 40, name="a")
    b = page_trace(tmp_path / "b.pctrace", [np.arange(0, 16)] * 40, name="b")
    runs, _ = replay_sim([a, b], ["swap", "demand"], capacity=[20 * PS],
                         config=SimConfig(costs="msched-rtx5080", granularity=PS, eviction_unit=PS,
                                          timeslice_ms=0.05))
    swap = runs[0]
    assert swap["faults"] == 0 and swap["prefetch_bytes"] > 0
    assert runs[0]["tasks"] == ["a", "b"]


def test_interval_difference():
    s, e = PT.interval_difference([0, 10], [5, 20], [3, 12], [4, 15])
    assert s.tolist() == [0, 4, 10, 15] and e.tolist() == [3, 5, 12, 20]
    s, e = PT.interval_difference([0], [5], [], [])
    assert s.tolist() == [0] and e.tolist() == [5]


def test_stack_distances_small():
    d = ST.lru_stack_distances(np.array([1, 2, 1, 3, 2, 1], np.int64), 4)
    inf = np.iinfo(np.int64).max
    assert d.tolist() == [inf, inf, 2, inf, 3, 3]


def test_oversized_launches_degrade_to_demand_not_below(tmp_path):
    """Launches larger than memory (three arrays swept in order): planned policies stream
    through them with the driver's chunk eviction and tree prefetcher, never worse than demand."""
    L = [np.arange(0, 3 * 8 * 512)] * 6             # 48 MiB: 3 arrays x 8 blocks of 2 MiB
    tr = page_trace(tmp_path / "t.pctrace", L, compute_ns=200_000)
    runs, _ = replay_sim([tr], ["demand", "alloc", "oracle"], capacity=[24 << 20, 40 << 20],  # 50%, 83%
                         config=SimConfig(costs="msched-rtx5080"))
    by = {(r["policy"], r["capacity_bytes"]): r for r in runs}
    for cap in (24 << 20, 40 << 20):
        assert by[("oracle", cap)]["thrashing_launches"] == 6
        for p in ("alloc", "oracle"):
            assert by[(p, cap)]["faults"] <= by[("demand", cap)]["faults"]
            assert by[(p, cap)]["time_s"] < by[("demand", cap)]["time_s"]


def test_alloc_plans_on_chunks_when_needs_are_huge(workloads, monkeypatch):
    """Past CHUNK_PLAN_OCCURRENCES unit touches alloc plans on 2 MiB chunks: whole allocations
    still arrive before their launches (no faults when they fit), and it stays ahead of demand."""
    tr = workloads["stream"]
    base, _ = replay_sim([tr], ["demand", "alloc"], oversub=[0.2, 1.5], config=SimConfig())
    monkeypatch.setattr(PA, "CHUNK_PLAN_OCCURRENCES", 0)
    chunk, _ = replay_sim([tr], ["alloc"], oversub=[0.2, 1.5], config=SimConfig())
    b = {(r["policy"], r["oversub"]): r for r in base}
    c = {r["oversub"]: r for r in chunk}
    assert c[0.2]["faults"] == b[("alloc", 0.2)]["faults"] == 0
    assert c[0.2]["htod_bytes"] == b[("alloc", 0.2)]["htod_bytes"]
    assert c[1.5]["time_s"] < b[("demand", 1.5)]["time_s"]


def test_chunk_groups_expand_to_units():
    g = PG.Groups.empty(2)
    g.pf_ptr, g.pf_unit = np.array([0, 2, 3]), np.array([1, 0, 2])
    g.need_now = np.array([1, 1])
    g.ev_ptr, g.ev_unit = np.array([0, 0, 1]), np.array([0])
    out = PG.chunk_groups_to_units(g, np.array([0, 3, 5]), np.array([3, 5, 9]))
    assert out.pf_unit.tolist() == [3, 4, 0, 1, 2, 5, 6, 7, 8]
    assert out.pf_ptr.tolist() == [0, 5, 9] and out.need_now.tolist() == [2, 4]
    assert out.ev_unit.tolist() == [0, 1, 2] and out.ev_ptr.tolist() == [0, 0, 3]
    # the units held in the universe's width (int16 here: unit_space.unit_width); no prefetch waits for values:
    # no -1 per prefetch held
    assert out.pf_unit.dtype == np.int16 and len(out.pf_after) == 0 and not out.waits_for_values()
    assert out.prefetch_after().tolist() == [-1] * 9 and (out.gate == -1).all()


def test_a_plan_holds_pf_after_only_where_a_prefetch_waits_for_values():
    g = PG.Groups.empty(2)
    g2 = PG.Groups(g.ev_ptr, g.ev_unit, np.array([0, 1, 2]), np.array([4, 5]), np.array([1, 1]), g.wait_prev,
                   g.blocking, g.thrash, pf_after=np.array([-1, -1]))
    assert len(g2.pf_after) == 0 and g2.prefetch_after().tolist() == [-1, -1]
    g3 = PG.Groups(g.ev_ptr, g.ev_unit, np.array([0, 1, 2]), np.array([4, 5]), np.array([1, 1]), g.wait_prev,
                   g.blocking, g.thrash, pf_after=np.array([-1, 0]))
    assert g3.waits_for_values() and g3.pf_after.tolist() == [-1, 0] and g3.gate.tolist() == [-1, 0]
    kept = PG.keep_prefetches(g3, np.array([True, False]), np.array([0, 1]))
    assert len(kept.pf_after) == 0 and (kept.gate == -1).all()


def test_adaptive_fallback_keeps_only_proven_history():
    from pagecast.replay.plan.adaptive import _proven
    kernel = np.array([0, 1, 0, 1, 0, 1, 0])
    asks = np.array([1, 1, 1, 1, 0, 1, 1], bool)
    extra = np.array([10, 10, 10, 10, 0, 10, 10])
    used = np.array([9, 1, 9, 1, 0, 9, 9])      # kernel 0 precise, kernel 1 not (until late)
    keep = _proven(kernel, asks, extra, used, 0.5)
    # a launch is judged on earlier launches of its kernel only; the first never has evidence
    assert keep.tolist() == [False, False, True, False, False, False, True]


def test_template_beats_demand_on_data_dependent_routing(tmp_path):
    """MoE expert routing: the trace records the router's expert ids, the expert FFN's weights are
    an indexed template, so template is well ahead of demand; the fallback (history over-predicts,
    adaptive falls back to demand paging for what the templates cannot tell) adds nothing more."""
    from pagecast.datasets.registry import make_trace
    from pagecast.predict.fit import fit_model
    fit = [T.read_trace(make_trace("moe-decode", tmp_path / f"m{s}.pctrace", scale=0.1, seed=s)) for s in (1, 2)]
    tr = T.read_trace(make_trace("moe-decode", tmp_path / "m3.pctrace", scale=0.1, seed=3))
    model = fit_model(fit)
    runs, _ = replay_sim([tr], ["demand", "template"], oversub=[1.5, 3.0], config=SimConfig(), model=model,
                         timeline=False)
    hist, _ = replay_sim([tr], ["template"], oversub=[1.5, 3.0], config=SimConfig(fallback="history"),
                         model=model, timeline=False)
    by = {(r["policy"], r["oversub"]): r for r in runs}
    assert any(r.cls == "indexed" for km in model.kernels.values() for r in km.regions)
    for o, h in zip((1.5, 3.0), hist):
        assert by[("template", o)]["time_s"] * 2 < by[("demand", o)]["time_s"]
        # what the fallback would add is measured in all bytes moved to the GPU: a plan that leaves a
        # unit to fault moves the tree prefetcher's region on the fault path, outside prefetch_bytes
        assert by[("template", o)]["htod_bytes"] <= h["htod_bytes"]


def test_chunk_needs_equal_their_expansion_of_every_use(workloads):
    """chunk_needs_from writes each step's chunk ids once and counts the steps per interval: the
    same CSR as expanding every interval and counting a launch id per use."""
    from pagecast import footprints as F
    from pagecast.replay.unit_space import unit_intervals
    tr = workloads["stream"]
    prof = SimConfig().profile()
    w = build_workload([tr], gran=prof.granularity, eviction_unit=prof.eviction_unit, profile=prof)
    fps = [t.alloc_fp for t in w.tasks]
    got = w.chunk_needs_from(fps)
    u, n = w.universe, tr.n_launches
    l, s, e = unit_intervals(fps[0], w.gran)
    d0, d1, ok = u.dense_intervals(0, s, e)
    l, c0, c1 = F.merge_intervals(l[ok], u.unit_chunk[d0[ok]], u.unit_chunk[d1[ok] - 1] + 1, n)
    ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(np.repeat(l, c1 - c0), minlength=n), out=ptr[1:])
    assert len(got.unit) > 0 and got.unit.dtype == np.int16   # the chunks' width (unit_space.unit_width)
    np.testing.assert_array_equal(got.ptr, ptr)
    np.testing.assert_array_equal(got.unit, F.expand_intervals(c0, c1))


def test_group_order_is_the_lexsort_of_group_late_unit():
    """belady.group_order (a counting sort by group, then a stable sort by unit) gives np.lexsort's
    order, pointers and per-group counts, duplicates and either width included."""
    from pagecast.replay.plan import belady as PB
    rng = np.random.default_rng(7)
    for _ in range(200):
        G, n = int(rng.integers(1, 30)), int(rng.integers(0, 300))
        g = rng.integers(0, G, n).astype(rng.choice([np.int32, np.int64]))
        u = rng.integers(0, int(rng.integers(1, 40)), n).astype(rng.choice([np.int32, np.int64]))
        own = rng.random(n) < 0.5
        for late in (None, ~own):
            ref = np.lexsort((u, g)) if late is None else np.lexsort((u, late, g))
            order, ptr, first = PB.group_order(g, late, u, G)
            np.testing.assert_array_equal(order, ref)
            np.testing.assert_array_equal(ptr, np.searchsorted(g[ref], np.arange(G + 1)))
            if late is not None:
                np.testing.assert_array_equal(first, np.bincount(g[own], minlength=G))


def test_capacities_run_at_once_give_the_same_runs(workloads):
    """A planned policy's runs at several capacities in threads (SimConfig.jobs) are the runs one
    after the other: rows and timelines equal."""
    from dataclasses import replace
    trs = [workloads["jacobi2d"], workloads["spmv-cg"]]
    cfg = SimConfig(costs="msched-rtx5080", timeslice_ms=0.05)
    one, tl1 = replay_sim(trs, ["demand", "alloc", "oracle"], oversub=[1.5, 2.0, 3.0], config=replace(cfg, jobs=1))
    many, tl3 = replay_sim(trs, ["demand", "alloc", "oracle"], oversub=[1.5, 2.0, 3.0], config=replace(cfg, jobs=3))
    auto, _ = replay_sim(trs, ["demand", "alloc", "oracle"], oversub=[1.5, 2.0, 3.0], config=replace(cfg, jobs=None),
                         timeline=False)
    assert one == many == auto
    assert tl1.equals(tl3)


def test_sweep_jobs_is_bounded_by_capacities():
    from pagecast.replay.sim.sweep import sweep_jobs
    for n in (1, 2, 3, 8):
        assert 1 <= sweep_jobs(n) <= n


def test_gate_at_is_maximum_at():
    """belady._gate_at: np.maximum.at over the gated prefetch entries."""
    from pagecast.replay.plan import belady as PB
    rng = np.random.default_rng(3)
    for _ in range(100):
        G, n = int(rng.integers(1, 40)), int(rng.integers(0, 200))
        dt = rng.choice([np.int32, np.int64])
        g = rng.integers(0, G, n).astype(dt)
        a = np.where(rng.random(n) < 0.3, rng.integers(0, G, n), -1).astype(dt)
        gt = np.full(G, -1, np.int64)
        gated = PB._gate_at(gt, g, a)
        ref_gt = np.full(G, -1, np.int64)
        np.maximum.at(ref_gt, g[a >= 0], a[a >= 0])
        np.testing.assert_array_equal(gt, ref_gt)
        assert gated == bool((a >= 0).any())
        assert not PB._gate_at(gt, g, a[:0])   # no list: nothing waits


def test_the_core_writes_need_group_and_late_flags_from_each_prefetchs_step(monkeypatch):
    """The Belady core's need_group (per step, the latest earlier group prefetching for it) and late
    flags, against np.maximum.at over the steps it lists where the needs have gates (every use -1:
    the plan is the same), and the plan without gates equal to it."""
    from pagecast.replay.plan import belady as PB
    seen = []
    core = PB._belady_plan

    def spy(*a):
        out = core(*a)
        seen.append(out)
        return out

    monkeypatch.setattr(PB, "_belady_plan", spy)
    rng = np.random.default_rng(5)
    early = 0
    for _ in range(40):
        steps, units = int(rng.integers(2, 30)), int(rng.integers(2, 25))
        sizes = np.minimum(rng.integers(0, 6, steps), units)
        ptr = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        # ids in the universe's width and gates in int32, as the planner passes them (the core's compiles)
        unit = np.concatenate([np.sort(rng.choice(units, int(k), replace=False)) for k in sizes]).astype(unit_width(units))
        cap = int(rng.integers(1, units + 1))
        args = (ptr, unit, units, cap, 0, np.zeros(units, np.uint8), PB.LOOKAHEAD_STEPS, cap)
        seen.clear()
        plain = PB.belady_plan(*args)
        gated = PB.belady_plan(*args, need_after=np.full(len(unit), -1, ID))
        for x, y in zip(plain[:10], gated[:10]):
            np.testing.assert_array_equal(x, y)
        pf_g, late, pf_n, need_group = seen[1][2], seen[1][3], seen[1][8], seen[1][9]
        assert len(pf_n) == len(pf_g) and len(seen[0][8]) == 0   # listed only where the needs have gates
        np.testing.assert_array_equal(late, (pf_n != pf_g).astype(np.uint8))
        ref = np.full(steps, -1, np.int64)
        np.maximum.at(ref, pf_n[pf_n != pf_g].astype(np.int64), pf_g[pf_n != pf_g].astype(np.int64))
        np.testing.assert_array_equal(need_group, ref)
        np.testing.assert_array_equal(seen[0][9], ref)
        early += int((ref >= 0).sum())
    assert early > 0   # prefetches for later steps were drawn
