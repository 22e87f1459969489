"""Belady's planner in pieces: its next occurrences made a piece of steps at a time and its transfer
lists put in group order without an order array give the plan made at once, array for array.

Random needs (launches larger than memory included, so Belady within a launch reads the next
occurrences too; with and without gates, fronts and chunks) are planned with pieces of one use
(every step a piece of its own) and with one piece of every use."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pagecast.replay.plan import belady as PB

FIELDS = ("ev_ptr", "ev_unit", "pf_ptr", "pf_unit", "need_now", "wait_prev", "thrash", "need_group", "gate",
          "gate_bytes", "pf_after")


def _plan(ptr, unit, n_units, cap, gates, front, window, start=0):
    rng = np.random.default_rng(len(unit) + cap)
    block = (np.arange(n_units) // 4 * 4).astype(np.int64)
    chunk = (np.arange(n_units) // 2).astype(np.int64)
    weight = np.full(int(chunk.max(initial=0)) + 1, 2, np.int64)
    after = None
    if gates:
        steps = np.repeat(np.arange(len(ptr) - 1), np.diff(ptr))
        after = np.where(rng.random(len(unit)) < 0.3, steps - 1 - rng.integers(0, 3, len(unit)), -1)
        after = np.maximum(after, -1).astype(np.int32)
    return PB.belady_plan(ptr, unit, n_units, cap, start, np.zeros(n_units, np.uint8), 1 << 20, cap, True,
                          np.full(n_units, 2, np.int64), block, front, after, np.full(len(ptr) - 1, 8, np.int64),
                          chunk, weight, window=window)


needs_st = st.lists(st.lists(st.integers(0, 23), max_size=14).map(lambda s: sorted(set(s))), min_size=1, max_size=30)


@settings(max_examples=60, deadline=None)
@given(needs_st, st.integers(2, 10), st.booleans(), st.booleans(), st.integers(0, 3))
def test_a_plan_made_with_its_next_occurrences_in_pieces_is_the_plan_made_at_once(steps, cap, gates, front, start):
    ptr = np.zeros(len(steps) + 1, np.int64)
    ptr[1:] = np.cumsum([len(s) for s in steps])
    unit = np.array([u for s in steps for u in s], np.int32)
    start = min(start, len(steps))
    whole = _plan(ptr, unit, 24, cap, gates, front, window=max(len(unit), 1), start=start)
    for window in (1, 3):
        pieces = _plan(ptr, unit, 24, cap, gates, front, window=window, start=start)
        for name, a, b in zip(FIELDS, whole, pieces):
            if a is None or b is None:
                assert a is None and b is None, name
            else:
                assert np.array_equal(a, b), name


def test_the_pieces_cover_the_steps_and_give_next_occurrence():
    rng = np.random.default_rng(5)
    sizes = rng.integers(0, 9, 200)
    ptr = np.zeros(201, np.int64)
    ptr[1:] = np.cumsum(sizes)
    unit = np.concatenate([np.sort(rng.choice(40, s, replace=False)) for s in sizes]).astype(np.int32)
    width = np.empty(0, np.int32)
    want = PB.next_occurrence(ptr, unit, 40, np.iinfo(np.int32).max, width)
    for start, window in ((0, 1), (0, 17), (13, 50), (0, 10 ** 6)):
        ws = PB._window_starts(ptr, start, window)
        assert ws[0] == start and ws[-1] == 200 and (np.diff(ws) > 0).all()
        ends = PB._window_ends(ptr, unit, 40, np.iinfo(np.int32).max, width, ws)
        got = np.empty(len(unit), np.int32)
        for w in range(len(ws) - 1):
            s0, s1 = ws[w], ws[w + 1]
            assert s1 - s0 == 1 or ptr[s1] - ptr[s0] <= window
            piece = np.empty(max(ptr[s1] - ptr[s0], 1), np.int32)
            PB._window_fill(ptr, unit, s0, s1, ends[w], piece)
            got[ptr[s0]:ptr[s1]] = piece[:ptr[s1] - ptr[s0]]
        assert np.array_equal(got[ptr[start]:], want[ptr[start]:])


def test_units_by_group_is_the_units_in_group_order():
    rng = np.random.default_rng(3)
    for n, G in ((0, 4), (500, 7), (3000, 50)):
        g = rng.integers(0, G, n).astype(np.int32)
        late_of = np.where(rng.random(n) < 0.4, g + rng.integers(1, 3, n), g).astype(np.int32)
        u = rng.integers(0, 30, n).astype(np.int32)
        for lo in (None, late_of):
            order, ptr, first = PB.group_order(g, None if lo is None else lo != g, u, G)
            got_u, got_ptr, got_first = PB.units_by_group(g, None if lo is None else lo != g, u, G)
            if lo is not None:   # the core's flags: uint8, 1 where late
                flags = PB.units_by_group(g, (lo != g).astype(np.uint8), u, G)
                assert all(np.array_equal(x, y) for x, y in zip(flags, (got_u, got_ptr, got_first)))
            assert np.array_equal(got_u, u[order]) and got_u.dtype == u.dtype
            assert np.array_equal(got_ptr, ptr) and np.array_equal(got_first, first)
