"""Placing CPU storages in managed memory: the direct placement, PyTorch's caching allocator's
rules, and storage lifetimes."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pagecast.collect import interpret_memory as M

MiB = 1 << 20


def test_direct_placement_is_2mib_aligned_and_reuses_freed_ranges():
    log = M.AllocationLog()
    p = M.DirectPlacement(log)
    a, addr_a = p.place(100, 0)
    b, addr_b = p.place(3 * MiB, 0)
    assert addr_a % (2 * MiB) == 0 and addr_b == addr_a + 2 * MiB
    p.release(a, 4)
    c, addr_c = p.place(MiB, 5)           # first fit: a's freed range
    assert addr_c == addr_a
    rows = log.rows()
    assert rows["alloc_id"] == [a] and rows["first"] == [0] and rows["last"] == [4]
    rows = log.rows(live_too=True)
    assert sorted(rows["alloc_id"]) == [b, c] and rows["last"] == [None, None]


def test_caching_rules():
    C = M.CachingPlacement
    assert C.round_size(1) == 512 and C.round_size(513) == 1024 and C.round_size(4096) == 4096
    assert C.segment_size(MiB) == 2 * MiB
    assert C.segment_size(MiB + 512) == 20 * MiB
    assert C.segment_size(10 * MiB) == 10 * MiB          # >= 10 MiB: rounded up to 2 MiB
    assert C.segment_size(11 * MiB) == 12 * MiB
    log = M.AllocationLog()
    p = C(log)
    b1, a1 = p.place(1000, 0)                # small pool: a 2 MiB segment, split
    b2, a2 = p.place(3000, 0)
    assert a2 == a1 + 1024 and log.next_id == 1
    p.release(b1, 0)
    b3, a3 = p.place(512, 1)                  # best fit: the freed 1024-byte block, split to 512
    assert a3 == a1
    b4, a4 = p.place(5 * MiB, 1)              # large: a 20 MiB segment; the rest (15 MiB > 1 MiB) split off
    assert log.next_id == 2 and a4 % (2 * MiB) == 0
    b5, a5 = p.place(2 * MiB, 1)
    assert a5 == a4 + 5 * MiB
    p.release(b4, 2)
    p.release(b5, 2)                          # merges with both neighbours: one 20 MiB free block again
    b6, a6 = p.place(19 * MiB, 3)
    assert a6 == a4 and log.next_id == 2
    rows = log.rows(live_too=True)
    assert rows["bytes"] == [2 * MiB, 20 * MiB] and rows["last"] == [None, None]   # segments stay


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 24 * MiB)), min_size=1, max_size=60))
def test_caching_blocks_never_overlap(ops):
    log = M.AllocationLog()
    p = M.CachingPlacement(log)
    live = []
    for free, size in ops:
        if free and live:
            b, _, _ = live.pop(size % len(live))
            p.release(b, 0)
            continue
        b, addr = p.place(size, 0)
        assert addr % 512 == 0
        live.append((b, addr, M.CachingPlacement.round_size(size)))
        seg = [s for s in p.segments() if s[0] <= addr < s[1]]
        assert len(seg) == 1 and addr + M.CachingPlacement.round_size(size) <= seg[0][1]
    spans = sorted((a, a + n) for _, a, n in live)
    for (s0, e0), (s1, _) in zip(spans, spans[1:]):
        assert e0 <= s1
    segs = sorted(p.segments())
    for (s0, e0, _), (s1, _, _) in zip(segs, segs[1:]):
        assert e0 <= s1 and s0 % (2 * MiB) == 0


def test_storage_map_lifetimes_and_translation():
    log = M.AllocationLog()
    issued = [0]
    sm = M.StorageMap(M.DirectPlacement(log), lambda: issued[0])
    issued[0] = 1                               # launch 0 begins
    x = torch.arange(1000, dtype=torch.float32)
    ax = sm.address_of(x)
    assert sm.address_of(x[10:]) == ax + 40      # a view: same storage, offset
    y = torch.zeros(10)
    sm.address_of(y)
    issued[0] = 3                               # launches 1 and 2 issued
    del x
    gc.collect()
    issued[0] = 4
    sm.release_freed()
    rows = log.rows()
    assert rows["alloc_id"] == [0] and rows["first"] == [0] and rows["last"] == [2]
    starts, ends, deltas = sm.index()[:3]
    assert len(starts) == 1 and ends[0] - starts[0] == 40
    z = torch.zeros(1000)                       # may reuse x's CPU address: gets a managed range again
    az = sm.address_of(z)
    assert az % (2 * MiB) == 0
    assert sm.storages == 3


def test_refuses_tensors_off_the_cpu():
    sm = M.StorageMap(M.DirectPlacement(M.AllocationLog()), lambda: 1)
    with pytest.raises(M.NotOnCPU, match="meta"):
        sm.address_of(torch.empty(4, device="meta"))


def test_shared_memory_is_one_range():
    a = np.zeros(1024, np.float32)
    sm = M.StorageMap(M.DirectPlacement(M.AllocationLog()), lambda: 1)
    t1, t2 = torch.from_numpy(a), torch.from_numpy(a[256:])   # two storages over the same memory
    m1 = sm.address_of(t1)
    assert sm.address_of(t2) == m1 + 1024
    assert sm.storages == 1
