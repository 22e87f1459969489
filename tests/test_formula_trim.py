"""The solver's trimmed refit (`formula._refit_trimmed`): where the budget may leave launches out,
a launch far off the formula (its last chunk's records lost, so its end lies far below) must not
pull the least-squares proposals off the formula every other launch follows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagecast.predict import formula as FM

SETTINGS = dict(deadline=None, derandomize=True, max_examples=40)


def _case(seed: int, U: int, n_out: int, stride: int, const: int):
    """Edges `const + stride*x` within intervals of up to a few KiB, `n_out` of them far below."""
    rng = np.random.default_rng(seed)
    x = rng.choice(np.arange(1, 6000), U, replace=False).astype(np.int64)
    z = rng.integers(1, 64, U).astype(np.int64)          # a column the formula does not use
    y = const + stride * x
    lo = y - rng.integers(0, 1024, U)
    hi = y + rng.integers(0, 1024, U)
    out = rng.choice(U, n_out, replace=False)
    drop = rng.integers(20, 400, n_out) * stride          # the outliers' records end this far short
    lo[out] -= drop
    hi[out] -= drop
    mono = FM.Monomials([("x",), ("z",)], np.column_stack([x, z]), np.ones(2, np.int64))
    return mono, lo.astype(np.int64), hi.astype(np.int64), out


@settings(**SETTINGS)
@given(seed=st.integers(0, 2**32 - 1), U=st.integers(12, 48), n_out=st.integers(1, 2),
       stride=st.sampled_from([64, 4096, 8192, 12345]), const=st.integers(-(1 << 20), 1 << 20))
def test_outliers_the_budget_allows_do_not_hide_the_formula(seed, U, n_out, stride, const):
    mono, lo, hi, out = _case(seed, U, n_out, stride, const)
    weight = np.ones(U)
    f = FM.solve(mono, lo, hi, weight, budget=float(n_out), max_terms=2)
    assert f is not None
    y = np.asarray(f.evaluate({"x": mono.values[:, 0], "z": mono.values[:, 1]}), np.int64) * np.ones(U, np.int64)
    clean = np.setdiff1d(np.arange(U), out)
    assert ((y[clean] >= lo[clean]) & (y[clean] <= hi[clean])).all()
    assert dict((t[1], t[0]) for t in f.terms) == {("x",): stride}
    # without the budget the outliers bind: nothing simple holds them all
    assert FM.solve(mono, lo, hi, weight, budget=0.0, max_terms=1) is None


def test_the_plain_fit_alone_misses_it(monkeypatch):
    """The same solve without the refit finds nothing: the outlier pulls every proposal off."""
    mono, lo, hi, _ = _case(7, 30, 1, 8192, 1000)
    weight = np.ones(30)
    assert FM.solve(mono, lo, hi, weight, budget=1.0, max_terms=2) is not None
    monkeypatch.setattr(FM, "_refit_trimmed", lambda *a, **k: None)
    assert FM.solve(mono, lo, hi, weight, budget=1.0, max_terms=2) is None


@pytest.mark.parametrize("budget", [0.0, 1.0])
def test_no_outlier_no_change(monkeypatch, budget):
    """Where the plain fit holds every row, the refit changes nothing."""
    mono, lo, hi, _ = _case(3, 24, 0, 4096, 77)
    weight = np.ones(24)
    a = FM.solve(mono, lo, hi, weight, budget=budget, max_terms=2, candidates=True)
    monkeypatch.setattr(FM, "_refit_trimmed", lambda *a, **k: None)
    b = FM.solve(mono, lo, hi, weight, budget=budget, max_terms=2, candidates=True)
    assert a == b
