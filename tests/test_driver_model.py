"""The simulator's driver model, mechanism by mechanism, on hand-made traces (docs/cost-model.md,
"The driver model"): chunk-granular capacity, batched fault service, the prefetcher's batch counts,
4 KiB faults without the prefetcher, the driver's victim order, the lone fault's charge, managed
oversubscription, and a planner that counts the same chunks."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_replay_sim import page_trace  # noqa: E402 - the same synthetic page traces

from pagecast.replay.costs import load_profile  # noqa: E402
from pagecast.replay.plan.belady import plan_groups  # noqa: E402
from pagecast.replay.sim.sweep import SimConfig, replay_sim  # noqa: E402
from pagecast.replay.unit_space import build_workload, chunk_starts  # noqa: E402

PS = 4096
BLOCK = 512            # pages per 2 MiB block
MiB = 1 << 20


def _one(tr, cap, policies=("demand",), **cfg):
    runs, tl = replay_sim([tr], list(policies), capacity=[cap], config=SimConfig(**cfg))
    return {r["policy"]: r for r in runs}, tl


def test_sparse_blocks_take_whole_chunks(tmp_path):
    """One 4 KiB page in each of 64 blocks, 64 MiB of memory: 32 chunks hold, so every launch after
    the first faults again (counted in touched 64 KiB units it would all fit and never fault)."""
    tr = page_trace(tmp_path / "t.pctrace", [np.arange(64) * BLOCK] * 10, top=64 * BLOCK)
    runs, tl = _one(tr, 64 * MiB, costs="none")
    assert tl.column("faults").to_pylist() == [64] * 10
    # only the resident pages' units go back: 64 KiB each, never the whole chunk
    assert runs["demand"]["dtoh_bytes"] == (640 - 32) * 64 * 1024
    fits, tl2 = _one(tr, 128 * MiB, costs="none")
    assert tl2.column("faults").to_pylist() == [64] + [0] * 9


def test_partial_last_block_uses_small_chunks():
    """A block an allocation covers whole is one 2 MiB chunk; its partial last block 64 KiB chunks."""
    gran = 64 * 1024
    keys = np.array([0, 1, 32, 33, 40], np.int64)            # units: block 0 (whole), block 1 (partial)
    allocs = (np.array([0]), np.array([2 * MiB + 9 * gran + 10]))
    start, size = chunk_starts(keys, gran, 2 * MiB, allocs)
    assert list(size) == [2 * MiB, 2 * MiB, 64 * 1024, 64 * 1024, 64 * 1024]
    assert list(start) == [0, 0, 2 * MiB, 2 * MiB + gran, 2 * MiB + 8 * gran]


def test_chunks_are_decided_per_block_under_address_reuse():
    """Allocations reusing an address with other sizes: a block any of them covers in part has 64 KiB
    chunks for all its units (even those beyond the smallest), never a 2 MiB chunk sharing a start."""
    gran = 64 * 1024
    keys = np.arange(32, dtype=np.int64)                      # one 2 MiB block
    allocs = (np.array([0, 0]), np.array([26 * gran, 16 * gran]))   # 1.6 MiB, then 1 MiB at the same address
    start, size = chunk_starts(keys, gran, 2 * MiB, allocs)
    assert (size == gran).all() and len(np.unique(start)) == 32
    whole = chunk_starts(keys, gran, 2 * MiB, (np.array([0, 0]), np.array([2 * MiB, gran])))
    assert (whole[1] == 2 * MiB).all()


def test_no_prefetcher_moves_4k_a_fault(tmp_path):
    """32 faulted pages in 32 big pages: 128 KiB with the prefetcher off, 32 big pages with it on."""
    tr = page_trace(tmp_path / "t.pctrace", [np.arange(32) * 16], top=BLOCK)
    off, _ = _one(tr, 64 * MiB, costs="none", driver_prefetch=False)
    assert off["demand"]["faults"] == 32 and off["demand"]["htod_bytes"] == 128 * 1024
    on, _ = _one(tr, 64 * MiB, costs="none")
    assert on["demand"]["htod_bytes"] == 32 * 64 * 1024


@pytest.mark.parametrize("costs", ["msched-rtx5080", "pcie4", "pcie3"])
def test_lone_fault_costs_what_the_profile_says(tmp_path, costs):
    """200 launches, each one fault in a block of its own: each stalls exactly the profile's lone
    fault (one fault, one block, one batch): 31.79 us under msched-rtx5080."""
    tr = page_trace(tmp_path / "t.pctrace", [np.array([i * BLOCK]) for i in range(200)], top=200 * BLOCK,
                    compute_ns=1000)
    runs, tl = _one(tr, 1 << 30, costs=costs)
    p = load_profile(costs)
    r = runs["demand"]
    assert r["faults"] == 200 and r["fault_batches"] == 200
    assert r["stall_s"] / 200 == pytest.approx(p.lone_fault_s, rel=1e-9)
    if costs == "msched-rtx5080":
        assert p.lone_fault_s == pytest.approx(31.79e-6)


def test_batches_service_each_block_once(tmp_path):
    """300 faults of one launch in two blocks: a batch of 256 (both blocks) and one of 44 (the second):
    2 batches, 3 block services."""
    pages = np.concatenate([np.arange(150), BLOCK + np.arange(150)])
    tr = page_trace(tmp_path / "t.pctrace", [pages], top=2 * BLOCK)
    runs, _ = _one(tr, 64 * MiB, costs="msched-rtx5080", driver_prefetch=False)
    r = runs["demand"]
    p = load_profile("msched-rtx5080")
    assert (r["faults"], r["fault_batches"], r["blocks_serviced"]) == (300, 2, 3)
    assert r["stall_s"] == pytest.approx(300 * p.fault_time_s + 3 * p.block_service_s + 2 * p.batch_overhead_s)


def test_prefetcher_counts_the_batch_faults(tmp_path):
    """A launch's first touches of 17 of a block's 32 big pages arrive together: all their pages fault
    (none is resident yet; 272 entries, so a batch of 256 and one of 16), and the tree, counting the
    17 faulted big pages, fills the other 15 (17 > 51% of 32); 16 alone (50%) would not."""
    tr = page_trace(tmp_path / "t.pctrace", [np.arange(17 * 16), np.arange(17 * 16, BLOCK)], top=BLOCK)
    runs, tl = _one(tr, 64 * MiB, costs="none")
    assert tl.column("faults").to_pylist() == [272, 0]
    assert runs["demand"]["fault_batches"] == 2 and runs["demand"]["htod_bytes"] == 2 * MiB
    tr16 = page_trace(tmp_path / "t16.pctrace", [np.arange(16 * 16), np.arange(16 * 16, BLOCK)], top=BLOCK)
    _, tl16 = _one(tr16, 64 * MiB, costs="none")
    assert tl16.column("faults").to_pylist()[0] == 256 and tl16.column("faults").to_pylist()[1] > 0


def _victims(tmp_path, launches, eviction):
    tr = page_trace(tmp_path / f"v{eviction}.pctrace", launches, top=3 * BLOCK)
    runs, tl = _one(tr, 4 * MiB, costs="none", driver_prefetch=False, eviction=eviction)
    return tl.column("faults").to_pylist()


def test_driver_victim_order_follows_migrations_not_hits(tmp_path):
    """Blocks A, B fill memory (two chunks); a migration into A moves A to the list's tail (the
    driver's block_mark_memory_used), so C evicts B, and A's first page still hits. FIFO evicts A."""
    A, B, C = 0, BLOCK, 2 * BLOCK
    L = [np.array([A]), np.array([B]), np.array([A + 1]), np.array([C]), np.array([A])]
    assert _victims(tmp_path, L, "driver") == [1, 1, 1, 1, 0]
    assert _victims(tmp_path, L, "fifo") == [1, 1, 1, 1, 1]


def test_driver_victim_order_is_blind_to_hits(tmp_path):
    """A hit on A moves nothing for the driver (C evicts A, whose page then faults again); LRU moves A
    to the tail on the hit and evicts B."""
    A, B, C = 0, BLOCK, 2 * BLOCK
    L = [np.array([A]), np.array([B]), np.array([A]), np.array([C]), np.array([A])]
    assert _victims(tmp_path, L, "driver") == [1, 1, 0, 1, 1]
    assert _victims(tmp_path, L, "lru") == [1, 1, 0, 1, 0]


def test_oversub_divides_managed_bytes(tmp_path):
    """--oversub R: the managed bytes allocated / R (the literature's); --oversub-of touched keeps the
    touched footprint's ratio."""
    tr = page_trace(tmp_path / "t.pctrace", [np.arange(64)], top=64 * BLOCK)    # 128 MiB, 256 KiB touched
    m, _ = replay_sim([tr], ["demand"], oversub=[2.0], config=SimConfig(costs="none"))
    t, _ = replay_sim([tr], ["demand"], oversub=[2.0], config=SimConfig(costs="none", oversub_of="touched"))
    assert m[0]["capacity_bytes"] == 64 * MiB and m[0]["oversub_of"] == "managed"
    assert t[0]["capacity_bytes"] == 128 * 1024 and t[0]["oversub_of"] == "touched"


def test_planner_counts_chunks(tmp_path):
    """Belady's plan on sparse blocks never holds more chunks than fit: 64 blocks of one page each at
    32 chunks of memory (in units it would plan all 64 resident)."""
    tr = page_trace(tmp_path / "t.pctrace", [np.arange(64) * BLOCK, np.arange(64) * BLOCK + 1] * 3,
                    top=64 * BLOCK)
    prof = load_profile("none")
    w = build_workload([tr], gran=prof.granularity, eviction_unit=prof.eviction_unit, profile=prof)
    cap = (64 * MiB) // w.gran
    g = plan_groups(w.truth, w.universe.n_units, cap, universe=w.universe)
    res = np.zeros(w.universe.n_units, bool)
    for i in range(w.n_steps):
        res[g.ev_unit[g.ev_ptr[i]:g.ev_ptr[i + 1]]] = False
        res[g.pf_unit[g.pf_ptr[i]:g.pf_ptr[i + 1]]] = True
        chunks = np.unique(w.universe.unit_chunk[res])
        assert w.universe.chunk_weight[chunks].sum() <= cap
    oracle, _ = _one(tr, 64 * MiB, policies=("demand", "oracle"), costs="msched-rtx5080")
    assert oracle["oracle"]["time_s"] <= oracle["demand"]["time_s"]


def test_a_chunk_comes_in_with_the_evictions_that_made_its_room(tmp_path):
    """Streaming launches, each a whole 2 MiB block never used again, at 3 chunks of memory and no
    lookahead. Every victim is dead for good (the same next use), so Belady may take any; it takes
    the units dead the longest, which leave whole chunks and can go earliest: the group after the
    launch that used them last, one before the launch that needs the room. Only the chunk's first
    unit needs victims; the rest of the chunk needs no room and comes in with it, in that group,
    so in and out share the copy engines. The plan never holds more chunks than fit, and its run
    faults nothing."""
    n = 8
    tr = page_trace(tmp_path / "t.pctrace", [np.arange(BLOCK) + k * BLOCK for k in range(n)], top=n * BLOCK)
    prof = load_profile("none")
    w = build_workload([tr], gran=prof.granularity, eviction_unit=prof.eviction_unit, profile=prof)
    u = w.universe
    cap = (6 * MiB) // w.gran
    g = plan_groups(w.truth, u.n_units, cap, universe=u, lookahead_steps=0)
    pf_group = np.repeat(np.arange(w.n_steps), np.diff(g.pf_ptr))
    ev_group = np.repeat(np.arange(w.n_steps), np.diff(g.ev_ptr))
    for c in range(3, n):          # launch c's chunk needs room: memory holds 3
        groups = np.unique(pf_group[u.unit_chunk[g.pf_unit] == c])
        assert groups.tolist() == [c - 1], f"chunk {c} comes in over groups {groups.tolist()}"
        out = u.unit_chunk[g.ev_unit[ev_group == c - 1]]
        assert out.tolist() == [c - 3] * 32      # the chunk dead the longest leaves whole, in the same group
    res = np.zeros(u.n_units, bool)
    for i in range(w.n_steps):
        res[g.ev_unit[g.ev_ptr[i]:g.ev_ptr[i + 1]]] = False
        res[g.pf_unit[g.pf_ptr[i]:g.pf_ptr[i + 1]]] = True
        assert u.chunk_weight[np.unique(u.unit_chunk[res])].sum() <= cap
    runs, _ = replay_sim([tr], ["oracle"], capacity=[6 * MiB], config=SimConfig(costs="msched-rtx5080"))
    assert runs[0]["faults"] == 0


def test_after_a_launch_larger_than_memory_the_next_one_lists_its_whole_front(tmp_path):
    """Launches larger than memory, one after another (STREAM's shape: arrays of 4 MiB and 3 pages,
    memory for half of them). What such a launch leaves behind is the run's, not the plan's (the
    tree prefetcher refills as it streams), so the next one's group lists its whole front -- the
    first units it needs, as many as memory holds -- even those the planner counts resident: the
    run then brings whatever of it is gone, and a prefetch of a resident unit moves nothing."""
    a = 2 * BLOCK + 3

    def arr(k):
        return np.arange(a) + k * a
    pat = [np.concatenate([arr(0), arr(2)]), np.concatenate([arr(1), arr(2)]),
           np.concatenate([arr(0), arr(1), arr(2)])] * 3
    tr = page_trace(tmp_path / "t.pctrace", pat, top=3 * a, n_allocs=3)
    prof = load_profile("msched-rtx5080")
    w = build_workload([tr], gran=prof.granularity, eviction_unit=prof.eviction_unit, profile=prof)
    u = w.universe
    cap = (3 * a * 4096 // 2) // w.gran
    g = plan_groups(w.truth, u.n_units, cap, universe=u, front=True)
    for i in range(1, w.n_steps):
        need = w.truth.unit[w.truth.ptr[i]:w.truth.ptr[i + 1]]
        assert len(need) > cap
        own = g.pf_unit[g.pf_ptr[i]:g.pf_ptr[i] + g.need_now[i]]
        # its front: its first units in need order, as many as memory holds in chunks
        front, held = [], set()
        for x in need:
            c = u.unit_chunk[x]
            if c not in held and u.chunk_weight[list(held | {c})].sum() > cap:
                break
            held.add(c)
            front.append(x)
        assert set(front) <= set(own.tolist()), f"launch {i} lists {len(set(front) & set(own.tolist()))} of its front"
