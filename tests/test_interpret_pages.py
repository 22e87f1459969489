"""Pages of memory operations: the compiled one-pass kernel against a plain set-based peer."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pagecast.collect import interpret_pages as P


def _peer(tiles, starts, ends, deltas):
    """Every byte of every active lane, translated, as pages: sets, one Python loop."""
    out = {P.READ: set(), P.WRITE: set()}
    unmapped = 0
    for a, m, kind, es in tiles:
        for x, on in zip(a.reshape(-1).tolist(), (np.ones(a.size, bool) if m is None
                                                  else np.broadcast_to(m, a.shape).reshape(-1)).tolist()):
            if not on:
                continue
            j = [i for i in range(len(starts)) if starts[i] <= x < ends[i]]
            if not j:
                unmapped += 1
                continue
            y = x + deltas[j[0]]
            pages = {b >> 12 for b in range(y, y + es)}
            for k in (P.READ, P.WRITE):
                if kind & k:
                    out[k] |= pages
    return out, unmapped


@st.composite
def _case(draw):
    n_st = draw(st.integers(1, 4))
    starts, ends, deltas = [], [], []
    at = 0x5000_0000
    for i in range(n_st):
        at += draw(st.integers(0, 3)) * 64 + 64
        size = draw(st.integers(1, 40000))
        starts.append(at)
        ends.append(at + size)
        deltas.append(0x7F40_0000_0000 + i * (2 << 20) - at)
        at += size
    tiles = []
    for _ in range(draw(st.integers(1, 6))):
        es = draw(st.sampled_from([1, 2, 4, 8, 16]))
        n = draw(st.integers(1, 300))
        base = draw(st.sampled_from(starts)) + draw(st.integers(-64, 4000))
        stride = draw(st.sampled_from([es, es, 2 * es, 4096, 3]))
        a = (base + stride * np.arange(n)).astype(np.uint64)
        if draw(st.booleans()):
            a = a[np.random.default_rng(n).permutation(n)]
        if draw(st.booleans()):
            a = a.reshape(-1, 1) if n % 2 else a.reshape(2, -1) if n > 1 else a
        m = None if draw(st.booleans()) else (np.random.default_rng(n + 1).random(a.shape) < 0.7)
        tiles.append((a, m, draw(st.sampled_from([P.READ, P.WRITE, P.BOTH])), es))
    return tiles, starts, ends, deltas


@settings(max_examples=150, deadline=None)
@given(_case())
def test_tile_pages_match_the_set_peer(case):
    tiles, starts, ends, deltas = case
    index = (*(np.array(v, np.int64) for v in (starts, ends, deltas)), starts, ends, deltas)
    lp = P.LaunchPages()
    unmapped = sum(lp.add_tile(a, m, kind, index, es) for a, m, kind, es in tiles)
    pages, code = lp.finish()
    want, want_unmapped = _peer(tiles, starts, ends, deltas)
    assert unmapped == want_unmapped
    assert set(pages[(code & P.READ) > 0].tolist()) == want[P.READ]
    assert set(pages[(code & P.WRITE) > 0].tolist()) == want[P.WRITE]
    assert np.all(np.diff(pages) > 0)


def test_buffers_are_merged_and_grow(monkeypatch):
    monkeypatch.setattr(P, "COMPACT_AT", 64)
    monkeypatch.setattr(P, "FIRST_CAP", 8)
    index = (np.array([0], np.int64), np.array([1 << 40], np.int64), np.array([0], np.int64), [0], [1 << 40], [0])
    lp = P.LaunchPages()
    rng = np.random.default_rng(0)
    want = set()
    for _ in range(200):                       # the same 300 pages again and again: merged, bounded
        a = (rng.integers(0, 300, 40) * 4096).astype(np.uint64)
        want |= set((a >> 12).tolist())
        lp.add_tile(a, None, P.READ, index, 4)
        assert lp._r.pos <= 2 * (300 + 80)
    pages, code = lp.finish()
    assert set(pages.tolist()) == want and (code == P.READ).all()


def test_page_intervals_cut_at_allocations_and_codes():
    pages = np.array([10, 11, 12, 13, 20, 21], np.int64)
    code = np.array([1, 1, 3, 3, 2, 2], np.int8)
    seg_start = np.array([10 << 12, 21 << 12], np.int64)
    seg_end = np.array([(12 << 12) + 100, (22 << 12)], np.int64)
    aid, addr, nb, c, outside = P.page_intervals(pages, code, seg_start, seg_end, np.array([5, 6]))
    assert outside == 2                        # pages 13 and 20 lie in no allocation
    assert aid.tolist() == [5, 5, 6]
    assert addr.tolist() == [10 << 12, 12 << 12, 21 << 12]
    assert nb.tolist() == [2 << 12, 100, 1 << 12]    # clipped to the allocation's end
    assert c.tolist() == [1, 3, 2]
