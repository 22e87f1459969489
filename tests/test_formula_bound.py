"""The solver's vectorized bound (`formula._may_hold`): it may only spare candidates that `check`
would refuse, in every mode, so that `solve` finds exactly what it found by checking each one."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagecast.predict import formula as FM

SETTINGS = dict(deadline=None, derandomize=True, max_examples=60)


def _case(seed: int, U: int, k: int, n: int, inverted: float):
    rng = np.random.default_rng(seed)
    G = rng.integers(-50, 50, (U, 6)).astype(np.int64)
    cols = np.stack([rng.choice(6, k, replace=False) for _ in range(n)])
    coefs = rng.integers(-3, 4, (n, 27 if k == 3 else 9, k)).astype(np.int64)
    centre = rng.integers(-200, 200, U)
    width = rng.integers(0, 120, U)
    lo, hi = centre - width, centre + width
    flip = rng.random(U) < inverted          # bounds that contradict each other (lo > hi)
    lo[flip], hi[flip] = hi[flip] + 1, lo[flip] - 1
    weight = rng.integers(0, 4, U).astype(np.float64)
    return G, cols, coefs, lo.astype(np.int64), hi.astype(np.int64), weight


@settings(**SETTINGS)
@given(seed=st.integers(0, 2**32 - 1), U=st.integers(2, 40), k=st.sampled_from([2, 3]), n=st.integers(1, 12),
       inverted=st.sampled_from([0.0, 0.1]), share=st.sampled_from([0.0, 0.05, 0.3, 0.7]))
def test_the_bound_spares_only_candidates_check_refuses(seed, U, k, n, inverted, share):
    """Every candidate `check` accepts, with no hard side or either one and any hard budget, the
    bound lets through; and it does refuse some (the test can fail both ways)."""
    G, cols, coefs, lo, hi, weight = _case(seed, U, k, n, inverted)
    budget = share * float(weight.sum())
    may = FM._may_hold(G, cols, coefs, lo, hi, weight, budget)
    assert may.shape == coefs.shape[:2]
    for i in range(n):
        for j in range(coefs.shape[1]):
            vals = (G[:, cols[i]] * coefs[i, j]).sum(axis=1)
            for hard, hb in ((None, 0.0), ("lo", 0.0), ("hi", 0.0), ("lo", budget / 2), ("hi", budget)):
                ok, _ = FM.check(vals, lo, hi, weight, budget, "tight", hard, hb)
                assert not ok or may[i, j], (i, j, hard, hb)


def test_the_bound_refuses_what_no_const_covers():
    """Two launches whose intervals a formula puts far apart: no const holds both, so with no
    budget the bound refuses it, and with one launch's weight as budget lets it through."""
    G = np.array([[0], [10]], np.int64)
    cols = np.array([[0]])
    coefs = np.array([[[1], [0]]], np.int64)      # vals (0, 10), then (0, 0)
    lo, hi = np.array([0, 0], np.int64), np.array([1, 1], np.int64)
    w = np.ones(2)
    assert FM._may_hold(G, cols, coefs, lo, hi, w, 0.0).tolist() == [[False, True]]
    assert FM._may_hold(G, cols, coefs, lo, hi, w, 1.0).tolist() == [[True, True]]


def _solve_both(seed: int, U: int, share: float, hard):
    """`solve`'s candidates with the bound and with it switched off (every candidate checked, the
    peer), on bounds around `3*a*b + 7*c + 11` with noise, and outliers a `share` of the budget."""
    rng = np.random.default_rng(seed)
    X = rng.integers(1, 60, (U, 4)).astype(np.int64)
    mono = FM.monomials(["a", "b", "c", "d"], X, np.ones(4, bool), max_degree=2)
    truth = 3 * X[:, 0] * X[:, 1] + 7 * X[:, 2] + 11
    lo, hi = truth - rng.integers(0, 8, U), truth + rng.integers(0, 8, U)
    bad = rng.random(U) < share / 2
    lo[bad] += 300
    hi[bad] += 400
    weight = np.ones(U)
    got = FM.solve(mono, lo, hi, weight, share * U, 3, hard=hard, candidates=True)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(FM, "_may_hold", lambda G, cols, coefs, *a: np.ones(coefs.shape[:2], bool))
        want = FM.solve(mono, lo, hi, weight, share * U, 3, hard=hard, candidates=True)
    return got, want


@settings(**SETTINGS)
@given(seed=st.integers(0, 2**32 - 1), U=st.integers(4, 30), share=st.sampled_from([0.0, 0.05, 0.2]),
       hard=st.sampled_from([None, "lo", "hi"]))
def test_solve_finds_what_checking_every_candidate_finds(seed, U, share, hard):
    """With the bound and without it, `solve` gives the same formulas, in the same order."""
    got, want = _solve_both(seed, U, share, hard)
    assert got == want


def test_solve_with_the_bound_still_finds_the_formula():
    """The bound keeps the formula the bounds were drawn around (the comparison above is not
    between two empty answers)."""
    got, want = _solve_both(0, 20, 0.05, None)
    assert got == want and got[0].text() == "7*c + 3*a*b + 11", [f.text() for f in got]
