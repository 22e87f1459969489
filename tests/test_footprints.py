"""Footprint merging and set arithmetic, checked against a plain-Python model (hypothesis)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from pagecast.footprints import (Footprints, coarsen_intervals, expand_intervals, intersection_pages,
                                 merge_intervals, page_span)

intervals = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 200), st.integers(0, 40)), max_size=60)


def _as_sets(rows, n):
    sets = [set() for _ in range(n)]
    for g, s, ln in rows:
        sets[g].update(range(s, s + ln))
    return sets


def _fp(rows, n=6):
    g = np.array([r[0] for r in rows], np.int64)
    s = np.array([r[1] for r in rows], np.int64)
    e = s + np.array([r[2] for r in rows], np.int64)
    return Footprints.from_intervals(g, s, e, n, 4096)


@settings(max_examples=200, deadline=None)
@given(intervals)
def test_merge_matches_sets(rows):
    fp = _fp(rows)
    want = _as_sets(rows, 6)
    for i in range(6):
        s, e = fp.of(i)
        assert set(expand_intervals(s, e).tolist()) == want[i]
        # merged: sorted, disjoint and not touching
        assert np.all(e > s)
        assert np.all(s[1:] > e[:-1])
    assert fp.pages_per_launch().tolist() == [len(x) for x in want]
    us, ue = fp.union()
    assert set(expand_intervals(us, ue).tolist()) == set().union(*want)


@settings(max_examples=200, deadline=None)
@given(intervals, intervals)
def test_intersection_matches_sets(a, b):
    from pagecast import footprints as FP
    fa, fb = _fp(a), _fp(b)
    sa, sb = _as_sets(a, 6), _as_sets(b, 6)
    want = [len(x & y) for x, y in zip(sa, sb)]
    assert intersection_pages(fa, fb).tolist() == want
    old = FP.INTERSECTION_INTERVALS
    try:
        for piece in (1, 2, 5):   # the union made a launch or a few at a time: the same counts
            FP.INTERSECTION_INTERVALS = piece
            assert intersection_pages(fa, fb).tolist() == want
    finally:
        FP.INTERSECTION_INTERVALS = old


@settings(max_examples=100, deadline=None)
@given(intervals, st.lists(st.integers(0, 5), max_size=8))
def test_select_renumbers(rows, pick):
    fp = _fp(rows)
    sub = fp.select(np.array(pick, np.int64))
    assert sub.n_launches == len(pick)
    for k, i in enumerate(pick):
        assert np.array_equal(sub.pages(k), fp.pages(i))


def test_merge_far_apart_groups_uses_fallback():
    # Page numbers near 2^52 with many groups overflow the lifted cummax; the fallback must agree.
    big = np.int64(2**51)
    g = np.array([0, 0, 1, 1], np.int64)
    s = np.array([0, big, 5, 3], np.int64)
    e = np.array([10, big + 2, 9, 6], np.int64)
    gg, ss, ee = merge_intervals(g, s, e, 2**20)
    assert gg.tolist() == [0, 0, 1] and ss.tolist() == [0, big, 3] and ee.tolist() == [10, big + 2, 9]


@given(st.integers(0, 2**47), st.integers(1, 2**30))
def test_page_span_covers_bytes(addr, n):
    s, e = page_span(np.array([addr], np.uint64), np.array([n]), 4096)
    assert s[0] * 4096 <= addr and e[0] * 4096 >= addr + n
    assert (e[0] - s[0]) * 4096 < n + 2 * 4096


@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 50)), max_size=60), st.integers(1, 12))
@settings(max_examples=200, deadline=None)
def test_coarsen_intervals_keeps_at_most_k_and_covers_everything(raw, k):
    s = np.array([a for a, _ in raw], np.int64)
    e = np.array([a + n for a, n in raw], np.int64)
    _, s, e = merge_intervals(np.zeros(len(s), np.int64), s, e, 1)
    cs, ce = coarsen_intervals(s, e, k)
    assert len(cs) <= k
    assert np.all(cs[1:] > ce[:-1])                       # still sorted and disjoint
    assert set(cs.tolist()) <= set(s.tolist()) and set(ce.tolist()) <= set(e.tolist())
    j = np.searchsorted(cs, s, side="right") - 1         # every input interval lies in one output
    assert np.all(j >= 0) and np.all(ce[j] >= e)
    if len(s) <= k:
        assert np.array_equal(cs, s) and np.array_equal(ce, e)
