"""The one-term coefficient choice (`formula._best_coef`), compiled ternary search and vectorized
candidate costs, against the plain Python it replaced (kept here as the reference): the same
coefficient for every input, in every mode, extreme bounds and int64 wrap-around included."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pagecast.predict import formula as FM

SETTINGS = dict(deadline=None, derandomize=True, max_examples=300)


def _cost(c, g, lo, hi):
    L = int((lo - c * g).max())
    H = int((hi - c * g).min())
    return abs(c) + max(L, 0, -H) + (0 if L <= H else 1e30)


def _reference(g, lo, hi, lo_c, hi_c, mode="tight"):
    cands = set()
    for a, b in ((lo_c, min(hi_c, -1)), (max(lo_c, 1), hi_c)):
        if a > b:
            continue
        while b - a > 2:
            m1 = a + (b - a) // 3
            m2 = b - (b - a) // 3
            c1, c2 = _cost(m1, g, lo, hi), _cost(m2, g, lo, hi)
            if c1 < c2:
                b = m2 - 1
            elif c1 > c2:
                a = m1 + 1
            else:
                a, b = m1, m2
                if b - a <= 2:
                    break
                a += 1
        cands.update(range(a, b + 1))
    for sign, a, b in ((1, max(lo_c, 1), hi_c), (-1, max(-hi_c, 1), -lo_c)):
        if a > b:
            continue
        k = 0
        while (1 << k) <= b:
            for o in range(1, 16, 2):
                v = o << k
                if a <= v <= b:
                    cands.add(sign * v)
            k += 1
    cands.discard(0)
    if not cands:
        return None
    C = np.array(sorted(cands), np.int64)
    L = (lo[None, :] - C[:, None] * g[None, :]).max(axis=1)
    H = (hi[None, :] - C[:, None] * g[None, :]).min(axis=1)
    ok = L <= H
    if not ok.any():
        return None
    oddp = np.array([FM.odd(c) for c in C], np.float64)
    cost = np.full(len(C), np.inf)
    for i in np.flatnonzero(ok):
        cost[i] = oddp[i] ** 2 + FM.odd(FM._pick_const(int(L[i]), int(H[i]), mode))
    if mode == "late":
        simple = np.flatnonzero(ok & (oddp <= 15))
        if len(simple):
            return int(C[simple[np.argmax(np.abs(C[simple]))]])
    return int(C[int(np.lexsort((np.abs(C), cost))[0])])


def _case(seed, U, scale, width, stride, wide):
    rng = np.random.default_rng(seed)
    g = rng.integers(-scale, scale + 1, U).astype(np.int64)
    if wide:   # products of features up to monomials' 2^50: c * g wraps in int64 for large c
        g[: U // 2] = rng.integers(-(1 << 50), 1 << 50, U // 2)
    const = int(rng.integers(-(1 << 30), 1 << 30))
    y = stride * g + const
    w = rng.integers(0, width + 1, U)
    lo, hi = y - w, y + rng.integers(0, width + 1, U)
    if rng.random() < 0.2:                       # open bounds, as the solver passes them
        lo[rng.random(U) < 0.3] = -FM.INF
        hi[rng.random(U) < 0.3] = FM.INF
    return g, lo.astype(np.int64), hi.astype(np.int64)


@settings(**SETTINGS)
@given(seed=st.integers(0, 2**32 - 1), U=st.integers(1, 30), scale=st.sampled_from([3, 100, 1 << 20]),
       width=st.sampled_from([0, 7, 4096, 1 << 21]), stride=st.integers(-5000, 5000),
       span=st.sampled_from([(1, 16), (-16, 16), (-(1 << 24), 1 << 24), (1, 1 << 24), (-(1 << 24), -3)]),
       mode=st.sampled_from(["tight", "late", "round", ("round", (0, 48, 4096))]), wide=st.booleans())
def test_best_coef_is_the_reference_choice(seed, U, scale, width, stride, span, mode, wide):
    g, lo, hi = _case(seed, U, scale, width, stride, wide)
    lo_c, hi_c = span
    assert FM._best_coef(g, lo, hi, lo_c, hi_c, mode) == _reference(g, lo, hi, lo_c, hi_c, mode)


def test_best_coef_finds_the_stride_and_none_where_none_holds():
    """Not vacuous: a stride the bounds pin is found, and bounds no coefficient meets give None."""
    g = np.arange(1, 20, dtype=np.int64)
    y = 96 * g + 4096
    assert FM._best_coef(g, y, y, 1, 1 << 24) == 96
    assert FM._best_coef(g, y, y, -(1 << 24), -1) is None


@settings(deadline=None, derandomize=True, max_examples=60)
@given(seed=st.integers(0, 2**32 - 1), n=st.sampled_from([0, 1, 2, 7, 300, 512, 513, 2000]), k=st.integers(1, 6),
       spread=st.sampled_from([2, 50, 1 << 62]))
def test_factorize_rows_is_np_unique(seed, n, k, spread):
    """The fitter's row factorization, sorted (few rows) or hashed (many), is np.unique's."""
    from pagecast.predict.features import factorize_rows
    M = np.random.default_rng(seed).integers(-spread, spread, (n, k)).astype(np.int64)
    uniq, inv = factorize_rows(M)
    want, winv = np.unique(M, axis=0, return_inverse=True)
    assert uniq.shape == want.shape and (uniq == want).all() and (inv == winv.reshape(-1)).all()
