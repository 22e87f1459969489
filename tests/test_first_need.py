"""first_need made over unit ranges (groups.FIRST_NEED_PIECE) answers as one sort of every need entry."""

from types import SimpleNamespace

import numpy as np
import pytest

import pagecast.replay.plan.groups as G


def _one_sort(step, units, needs, n):
    occ = np.repeat(np.arange(n, dtype=np.int64), np.diff(needs.ptr))
    key = np.sort(needs.unit.astype(np.int64) * (n + 1) + occ)
    hit = G.first_at_or_after(key, units, step, n + 1)
    return np.where(hit < n + 1, hit, -1)


@pytest.mark.parametrize("seed", range(40))
def test_pieces_match_one_sort(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    n_units = int(rng.integers(1, 80))
    per = [np.sort(rng.choice(n_units, int(rng.integers(0, min(n_units, 25) + 1)), replace=False)) for _ in range(n)]
    needs = SimpleNamespace(ptr=np.concatenate([[0], np.cumsum([len(p) for p in per])]).astype(np.int64),
                            unit=np.concatenate(per).astype(np.int32))
    m = int(rng.integers(0, 150))
    step, units = rng.integers(0, n, m), rng.integers(0, n_units + 4, m).astype(np.int32)
    want = _one_sort(step, units, needs, n)
    for piece in (1, 2, 7, 1 << 20):
        monkeypatch.setattr(G, "FIRST_NEED_PIECE", piece)
        assert np.array_equal(G.first_need(step, units, needs, n), want)
