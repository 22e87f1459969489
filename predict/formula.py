"""Integer affine formulas over products of launch features, and the exact solver.

A `Formula` is `const + sum(coef_i * prod(features_i))` with integer
coefficients. It evaluates on numpy arrays (the batch predictor) and on Python
ints (the online predictor) with the same code.

`solve` finds the simplest formula consistent with interval observations: for
each group of launches with equal features, the value must lie in [lo, hi]
(bytes; the bounds come from page-rounded, big-page-rounded fault data).
Candidates are ordered by (number of terms, sum of |coef|, degree, |const|):
fewest terms and smallest coefficients first, as MSched's templates are.
One-term fits are solved exactly (the feasible coefficients form an interval,
from the pairwise conditions); two and three terms take least-squares proposals
rounded to integers, and exact integer checks decide.

Long because the solver's passes (exact one-term intervals, least-squares proposals, the
vectorized bound that spares most proposals their exact check) share `check` and the candidate
order; split, each would reach into the others' helpers.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field

import numpy as np
from numba import njit

from pagecast.uvm import PAGE

INF = np.int64(1) << np.int64(62)
MAX_COEF = 1 << 24
# a formula read from a model file evaluates in int64, multiplied by argument values: its numbers
# are byte offsets and sizes, so nothing beyond the 48-bit address space (2**62 passed int64 and
# silently overflowed in the products)
_LIMIT = 1 << 48
MAX_TERMS_READ, MAX_FACTORS_READ = 64, 16   # what a model file may hold (fit writes far less)


def odd(c: int) -> int:
    """The odd part of |c|: coefficients are element sizes times dimensions, mostly powers of two."""
    c = abs(int(c))
    if c == 0:
        return 0
    return c >> ((c & -c).bit_length() - 1)


_COMPILED: dict = {}


@dataclass(frozen=True)
class Formula:
    const: int = 0
    terms: tuple[tuple[int, tuple[str, ...]], ...] = ()

    @property
    def n_terms(self) -> int:
        return len(self.terms)

    def names(self) -> set[str]:
        return {n for _, f in self.terms for n in f}

    def evaluate(self, values) -> "np.ndarray | int":
        """values: mapping feature name -> int64 array (batch) or int (online)."""
        return self.function()(values)

    def function(self):
        """The formula compiled once to a Python function of the values mapping (works on
        numpy arrays and on ints alike: the batch and online predictors share it)."""
        fn = _COMPILED.get(self)
        if fn is None:
            parts = [repr(int(self.const))]
            for c, fac in self.terms:
                parts.append(" * ".join([repr(int(c))] + [f"v[{n!r}]" for n in fac]))
            fn = eval("lambda v: " + " + ".join(parts), {})  # noqa: S307 - built from validated names and ints
            _COMPILED[self] = fn
        return fn

    def score(self) -> tuple:
        grid = sum(1 for _, f in self.terms for n in f if n.startswith(("grid_", "block_")))
        return (len(self.terms), grid, sum(odd(c) ** 2 for c, _ in self.terms) + odd(self.const),
                sum(len(f) for _, f in self.terms), sum(abs(c) for c, _ in self.terms))

    def text(self) -> str:
        parts = []
        for c, fac in self.terms:
            prod = "*".join(fac)
            parts.append(prod if c == 1 else f"-{prod}" if c == -1 else f"{c}*{prod}")
        if self.const or not parts:
            parts.append(str(self.const))
        s = " + ".join(parts)
        return s.replace("+ -", "- ")

    def to_json(self) -> dict:
        return {"const": int(self.const), "terms": [[int(c), list(f)] for c, f in self.terms],
                "text": self.text()}

    @staticmethod
    def from_json(d) -> "Formula":
        """A formula of a model file (ValueError says what is wrong)."""
        if not isinstance(d, dict):
            raise ValueError("a formula must be an object with const and terms")
        const = d.get("const", 0)
        if not isinstance(const, int) or isinstance(const, bool) or not -_LIMIT <= const <= _LIMIT:
            raise ValueError(f"formula const must be an integer within +-2**48, found {const!r}")
        terms = []
        raw = d.get("terms", [])
        if not isinstance(raw, list) or len(raw) > MAX_TERMS_READ:
            # the fitter writes at most 3; thousands made compiling the formula recurse too deep
            raise ValueError(f"formula terms must be a list of at most {MAX_TERMS_READ}")
        for t in raw:
            if isinstance(t, (list, tuple)) and len(t) == 2 and isinstance(t[1], (list, tuple)) \
                    and len(t[1]) > MAX_FACTORS_READ:
                raise ValueError(f"a formula term may multiply at most {MAX_FACTORS_READ} features")
            if (not isinstance(t, (list, tuple)) or len(t) != 2 or not isinstance(t[0], int)
                    or isinstance(t[0], bool) or not -_LIMIT <= t[0] <= _LIMIT or not isinstance(t[1], (list, tuple))
                    or not all(isinstance(x, str) for x in t[1]) or not t[1]):
                raise ValueError(f"formula term must be [integer within +-2**48, [feature, ...]], found {t!r}")
            terms.append((int(t[0]), tuple(t[1])))
        return Formula(int(const), tuple(terms))


@dataclass
class Monomials:
    """Product features over the groups: names per column and an int64 matrix (groups x cols)."""

    names: list[tuple[str, ...]]
    values: np.ndarray  # int64 (U, M)
    degree: np.ndarray = field(default=None)


def monomials(feat_names: list[str], feat_vals: np.ndarray, varying: np.ndarray,
              max_degree: int = 3, max_cols: int = 1000, limit: float = 2.0 ** 50) -> Monomials:
    """Products of up to `max_degree` features with at least one varying factor.

    Columns equal over all groups are kept once (the simplest name), columns
    whose magnitude exceeds `limit` are dropped (no exact int64 arithmetic).
    """
    if feat_vals.shape[0] > MONO_MEMO_ROWS:   # a large matrix: made for the one call
        return _monomials(feat_names, feat_vals, varying, max_degree, max_cols, limit)
    key = (tuple(feat_names), feat_vals.shape, feat_vals.dtype.str, np.ascontiguousarray(feat_vals).tobytes(),
           np.asarray(varying, bool).tobytes(), max_degree, max_cols, limit)
    got = _MONO_MEMO.get(key)
    if got is None:
        got = _monomials(feat_names, feat_vals, varying, max_degree, max_cols, limit)
        got.values.setflags(write=False)   # shared by the solves that ask for the same columns
        if len(_MONO_MEMO) >= MONO_MEMO:
            _MONO_MEMO.pop(next(iter(_MONO_MEMO)))
        _MONO_MEMO[key] = got
    return got


MONO_MEMO = 64   # monomial matrices kept (the fit asks for one group set's again for each stride, start, end)
MONO_MEMO_ROWS = 512   # of at most this many groups (the solver's samples: FitParams.max_search_groups)
_MONO_MEMO: dict = {}


def _monomials(feat_names, feat_vals, varying, max_degree, max_cols, limit) -> Monomials:
    U = feat_vals.shape[0]
    vi = [i for i in range(len(feat_names)) if varying[i]]
    ci = [i for i in range(len(feat_names)) if not varying[i]]
    names: list[tuple[str, ...]] = []
    cols: list[np.ndarray] = []
    seen: dict[bytes, int] = {}
    fv = feat_vals.astype(np.float64)

    def add(ix):
        v = np.ones(U, np.float64)
        for i in ix:
            v = v * fv[:, i]
        if not np.all(np.abs(v) < limit):
            return
        iv = np.ones(U, np.int64)
        for i in ix:
            iv = iv * feat_vals[:, i]
        key = iv.tobytes()
        if key in seen:
            return
        seen[key] = len(cols)
        names.append(tuple(feat_names[i] for i in ix))
        cols.append(iv)

    for d in range(1, max_degree + 1):
        for combo in itertools.combinations_with_replacement(vi + ci, d):
            if not any(varying[i] for i in combo):
                continue
            add(combo)
            if len(cols) >= max_cols:
                break
        if len(cols) >= max_cols:
            break
    vals = np.stack(cols, axis=1) if cols else np.zeros((U, 0), np.int64)
    return Monomials(names, vals, np.array([len(n) for n in names], np.int64))




@functools.lru_cache(maxsize=1 << 16)
def _roundest(lo: int, hi: int) -> int:
    """The value in [lo, hi] with the smallest odd(v) * |v| (ties: smallest |v|)."""
    best = (odd(lo) * abs(lo), abs(lo), lo)
    for v in (hi,):
        best = min(best, (odd(v) * abs(v), abs(v), v))
    sign = 1 if lo > 0 else -1
    a, b = (lo, hi) if lo > 0 else (-hi, -lo)
    k = 0
    while (1 << k) <= b:
        for o in range(1, 16, 2):
            v = o << k
            if a <= v <= b:
                best = min(best, (o * v, v, sign * v))
        k += 1
    return int(best[2])


def roundest(lo: int, hi: int) -> int:
    """The value in [lo, hi] the solver prefers for a coefficient: the smallest odd part times
    its size (ties: the smallest); lo <= hi."""
    return _roundest(int(lo), int(hi))


def _pick_const(lo: int, hi: int, mode: str = "tight") -> int:
    """A constant in [lo, hi]: 0 when allowed; else the roundest value, either anywhere in the
    interval (mode "round": strides) or within a page of the tight end (mode "tight": the
    fewest predicted pages, for starts, ends and chunk sizes)."""
    lo, hi = int(lo), int(hi)
    if lo <= 0 <= hi:
        return 0
    if isinstance(mode, tuple):  # ("round", hints): prefer small multiples of constant-argument products
        best = None
        for h in mode[1]:
            if h <= 0:
                continue
            for c in range(max(1, -(-lo // h)), min(hi // h, 64) + 1):
                key = (odd(c), c)
                if best is None or key < best[0]:
                    best = (key, c * h)
        if best is not None:
            return int(best[1])
        mode = mode[0]
    if mode in ("tight", "late"):
        if lo > 0:
            hi = min(hi, -(-lo // PAGE) * PAGE)
        else:
            lo = max(lo, (hi // PAGE) * PAGE)
    return _roundest(lo, hi)


def check(formula_vals: np.ndarray, lo: np.ndarray, hi: np.ndarray, weight: np.ndarray,
          budget: float, mode: str = "tight", hard: str | None = None, hard_budget: float = 0.0) -> tuple[bool, int]:
    """Is there a const with (lo <= vals + const <= hi) everywhere but `budget` weight? (ok, const).

    `hard` ("lo" or "hi"): that side of the intervals is positive evidence (pages the records show
    touched): lost records never violate it, so it holds but for `hard_budget` weight (odd
    records), while the other side may take the rest of the budget."""
    a = lo - formula_vals
    b = hi - formula_vals
    amax, bmin = int(a.max()), int(b.min())
    if amax <= bmin:
        return True, _pick_const(amax, bmin, mode)
    if budget <= 0:
        return False, 0
    if hard in ("lo", "hi"):
        # the hard side holds but for `hard_budget` weight (odd records, never lost ones): the
        # const at the edge that leaves that much outside, the fewest soft violations there
        side, other = (a, b) if hard == "lo" else (-b, -a)
        o = np.argsort(-side, kind="stable")
        out_w = np.cumsum(weight[o])
        k = int(np.searchsorted(out_w, hard_budget, side="right"))    # the first one that must hold
        edge = int(side[o][min(k, len(o) - 1)])
        bad = float(weight[(side > edge) | (other < edge)].sum())
        if bad > budget:
            return False, 0
        room = other[(other >= edge) & (side <= edge)]
        far = int(room.min()) if len(room) else edge
        return True, (_pick_const(edge, far, mode) if hard == "lo" else _pick_const(-far, -edge, mode))
    # sweep: the const covering the most weight
    ev = np.concatenate([a, b + 1])
    w = np.concatenate([weight, -weight])
    o = np.lexsort((w, ev))  # removals (negative) before additions at equal points
    cov = np.cumsum(w[o])
    k = int(np.argmax(cov))
    total = float(weight.sum())
    if total - cov[k] > budget:
        return False, 0
    # 0 where it is within the budget (a one-byte-short bound of a launch that lost a record must
    # not buy a constant of -1 for covering one launch more), else the most covered interval
    pos = ev[o]
    at0 = int(np.searchsorted(pos, 0, side="right")) - 1
    if 0 <= at0 < len(cov) and total - cov[at0] <= budget and (at0 + 1 >= len(pos) or pos[at0 + 1] > 0):
        return True, 0
    # the interval of consts reaching that coverage
    lo_c = int(ev[o][k])
    hi_c = int(ev[o][k + 1] - 1) if k + 1 < len(ev) else lo_c
    return True, _pick_const(lo_c, max(lo_c, hi_c), mode)


def solve(mono: Monomials, lo: np.ndarray, hi: np.ndarray, weight: np.ndarray,
          budget: float = 0.0, max_terms: int = 3, mode: str = "tight", min_terms: int = 0,
          hard: str | None = None, candidates: bool = False, hard_budget: float = 0.0):
    """The simplest integer formula whose value lies in [lo, hi] for each group (up to `budget` weight;
    `hard`: the side of the intervals the budget may not violate, as in `check`).

    `candidates`: instead, every formula found with the fewest terms, simplest first."""
    lo = np.asarray(lo, np.int64)
    hi = np.asarray(hi, np.int64)
    weight = np.asarray(weight, np.float64)
    ok, c0 = check(np.zeros(len(lo), np.int64), lo, hi, weight, budget, mode, hard, hard_budget)
    if ok and min_terms == 0:
        return [Formula(c0, ())] if candidates else Formula(c0, ())
    G = mono.values
    M = G.shape[1]
    if M == 0 or len(lo) < 2 or max_terms < 1:
        return [] if candidates else None
    mid = _midpoints(lo, hi)
    best: list[tuple[tuple, Formula]] = []
    # ---- one term: exact coefficient interval from pairwise conditions
    U = len(lo)
    sub = _subsample(U, 48)
    i1, i2 = np.triu_indices(len(sub), 1)
    i1, i2 = sub[i1], sub[i2]
    fin = (lo > -INF) & (hi < INF)
    dG = (G[i1] - G[i2]).astype(np.float64)                    # (P, M)
    with np.errstate(divide="ignore", invalid="ignore"):
        # lo_i - hi_j <= c (g_i - g_j)  and  lo_j - hi_i <= c (g_j - g_i)
        A = (lo[i1] - hi[i2]).astype(np.float64)[:, None]
        B = (hi[i1] - lo[i2]).astype(np.float64)[:, None]
        pos, neg = dG > 0, dG < 0
        lower = np.where(pos, A / dG, np.where(neg, B / dG, -np.inf))
        upper = np.where(pos, B / dG, np.where(neg, A / dG, np.inf))
    cmin = np.nanmax(np.where(np.isnan(lower), -np.inf, lower), axis=0) if len(i1) else np.full(M, -np.inf)
    cmax = np.nanmin(np.where(np.isnan(upper), np.inf, upper), axis=0) if len(i1) else np.full(M, np.inf)
    feas = np.flatnonzero(np.ceil(cmin - 1e-9) <= np.floor(cmax + 1e-9))
    for m in feas:
        lo_c = int(np.ceil(max(cmin[m], -MAX_COEF) - 1e-9))
        hi_c = int(np.floor(min(cmax[m], MAX_COEF) + 1e-9))
        if lo_c > hi_c:
            continue
        c = _best_coef(G[:, m], lo, hi, lo_c, hi_c, mode)
        if c is None:
            continue
        f = _try(mono, [m], [c], lo, hi, weight, budget, mode, hard, hard_budget)
        if f is not None:
            best.append((f.score(), f))
    if budget > 0:
        # pairwise bounds ignore the budget (outliers close the interval): round least squares too
        best += _ls_candidates(mono, [[m] for m in range(M)], mid, fin, lo, hi, weight, budget, mode, hard,
                               hard_budget)
    if best:
        return _pick(best, candidates)
    if max_terms < 2:
        return [] if candidates else None
    # ---- two and three terms: least-squares proposals, exact checks
    for k in (2, 3):
        if k > max_terms or U < k + 1:
            break
        limit = {2: 160, 3: 40}[k]
        cols = list(range(min(M, limit)))
        subsets = [list(s) for s in itertools.combinations(cols, k)]
        best = _ls_candidates(mono, subsets, mid, fin, lo, hi, weight, budget, mode, hard, hard_budget)
        if best:
            return _pick(best, candidates)
    return [] if candidates else None


def _pick(best: list, candidates: bool):
    if not candidates:
        return min(best, key=lambda t: t[0])[1]
    out, seen = [], set()
    for _, f in sorted(best, key=lambda t: t[0]):
        if f not in seen:
            seen.add(f)
            out.append(f)
    return out


@njit(cache=True)
def _ternary(g, lo, hi, a, b):
    """The integer ternary search for the c in [a, b] of least cost |c| + max(L, 0, -H), where
    L = max(lo - c*g) and H = min(hi - c*g) (convex in c; plus 1e30 where L > H: no constant
    fits): the interval it ends on, every value of which `_best_coef` tries. Exact: the sum is a
    uint64 (at most 2^63 + |c|), the int64 products wrap as numpy's do, and two infeasible costs
    compare as floats, each its sum plus 1e30; a feasible one is below every infeasible one."""
    while b - a > 2:
        m1 = a + (b - a) // 3
        m2 = b - (b - a) // 3
        f = np.zeros(2, np.bool_)
        v = np.zeros(2, np.uint64)
        for j in range(2):
            c = m1 if j == 0 else m2
            L = lo[0] - c * g[0]
            H = hi[0] - c * g[0]
            for i in range(1, len(g)):
                x = lo[i] - c * g[i]
                if x > L:
                    L = x
                y = hi[i] - c * g[i]
                if y < H:
                    H = y
            m = np.uint64(L) if L > 0 else np.uint64(0)
            if H < 0:
                nh = np.uint64(-(H + 1)) + np.uint64(1)
                if nh > m:
                    m = nh
            f[j] = L <= H
            v[j] = np.uint64(c if c >= 0 else -c) + m
        if f[0] and f[1]:
            lt, gt = v[0] < v[1], v[0] > v[1]
        elif f[0] or f[1]:
            lt, gt = f[0], f[1]
        else:
            x1, x2 = np.float64(v[0]) + 1e30, np.float64(v[1]) + 1e30
            lt, gt = x1 < x2, x1 > x2
        if lt:
            b = m2 - 1
        elif gt:
            a = m1 + 1
        else:
            a, b = m1, m2
            if b - a <= 2:
                break
            a += 1
    return a, b


# every o * 2^k (o odd, <= 15) in int64, ascending: _best_coef's round coefficients
_ROUND = np.unique(np.array([o << k for k in range(63) for o in range(1, 16, 2) if o << k < 1 << 63], np.int64))


def _odd_arr(x: np.ndarray) -> np.ndarray:
    """`odd` of each value of an int64 array (as int64; the extremes through `odd` itself)."""
    a = np.abs(x)
    out = np.zeros(len(x), np.int64)
    big = (a < 0) | (a >= 1 << 62)
    nz = (a > 0) & ~big
    out[nz] = a[nz] // (a[nz] & -a[nz])
    for i in np.flatnonzero(big):
        out[i] = odd(int(x[i]))
    return out


def _pick_consts(L: np.ndarray, H: np.ndarray, mode: str) -> np.ndarray:
    """`_pick_const(L[i], H[i], mode)` for each i, `mode` a name ("tight", "late", "round")."""
    out = np.zeros(len(L), np.int64)
    todo = np.flatnonzero(~((L <= 0) & (H >= 0)))
    if not len(todo):
        return out
    far = (np.abs(L[todo]) >= 1 << 61) | (np.abs(H[todo]) >= 1 << 61)   # where int64 could wrap: as it is
    for i in todo[far]:
        out[i] = _pick_const(int(L[i]), int(H[i]), mode)
    todo = todo[~far]
    lo, hi = L[todo], H[todo]
    if mode in ("tight", "late"):
        pos = lo > 0
        hi = np.where(pos, np.minimum(hi, -(-lo // PAGE) * PAGE), hi)
        lo = np.where(pos, lo, np.maximum(lo, (hi // PAGE) * PAGE))
    for j, (a, b) in enumerate(zip(lo.tolist(), hi.tolist())):
        out[todo[j]] = _roundest(a, b)
    return out


def _best_coef(g: np.ndarray, lo: np.ndarray, hi: np.ndarray, lo_c: int, hi_c: int,
               mode: str = "tight") -> int | None:
    """The nonzero integer c in [lo_c, hi_c] with the smallest odd(c) * |c| + |const|.

    Candidates: the minimizer of |c| + |const| (convex in c: integer ternary search)
    and every c = o * 2^k (o odd <= 15) in the interval.
    """
    parts = []
    # fresh C-ordered, writable int64 arrays: the compiled search has one signature
    gc, loc, hic = (np.array(x, np.int64, order="C") for x in (g, lo, hi))
    for a, b in ((lo_c, min(hi_c, -1)), (max(lo_c, 1), hi_c)):
        if a > b:
            continue
        a, b = _ternary(gc, loc, hic, int(a), int(b))
        parts.append(np.arange(a, b + 1, dtype=np.int64))
    for sign, a, b in ((1, max(lo_c, 1), hi_c), (-1, max(-hi_c, 1), -lo_c)):
        if a > b:
            continue
        parts.append(sign * _ROUND[(_ROUND >= a) & (_ROUND <= b)])
    C = np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.int64)
    C = C[C != 0]
    if not len(C):
        return None
    L = (lo[None, :] - C[:, None] * g[None, :]).max(axis=1)
    H = (hi[None, :] - C[:, None] * g[None, :]).min(axis=1)
    ok = L <= H
    if not ok.any():
        return None
    oddp = _odd_arr(C).astype(np.float64)
    cost = np.full(len(C), np.inf)
    okw = np.flatnonzero(ok)
    if isinstance(mode, str):
        cost[okw] = oddp[okw] ** 2 + _odd_arr(_pick_consts(L[okw], H[okw], mode)).astype(np.float64)
    else:
        for i in okw:
            cost[i] = oddp[i] ** 2 + odd(_pick_const(int(L[i]), int(H[i]), mode))
    if mode == "late":
        # the latest start the bounds allow among simple coefficients (odd part <= 15): a start
        # known only to its big page, whose smallest simple coefficient would leave the chunk to
        # span the gap (a slot written at pos*row)
        simple = np.flatnonzero(ok & (oddp <= 15))
        if len(simple):
            return int(C[simple[np.argmax(np.abs(C[simple]))]])
    i = int(np.lexsort((np.abs(C), cost))[0])
    return int(C[i])


def _pick_nonzero(lo: float, hi: float, shift: int = 0) -> int | None:
    if lo > hi:
        return None
    if lo <= 0 <= hi:
        c = 1 if hi >= 1 else -1 if lo <= -1 else None
        if c is None:
            return None
    else:
        c = int(lo) if lo > 0 else int(hi)
    c += shift
    if c == 0 or c < lo or c > hi or abs(c) > MAX_COEF:
        return None
    return int(c)


def _subsample(U: int, k: int) -> np.ndarray:
    if U <= k:
        return np.arange(U)
    return np.unique(np.linspace(0, U - 1, k).round().astype(np.int64))


def _midpoints(lo, hi):
    lof = lo.astype(np.float64)
    hif = hi.astype(np.float64)
    return np.where(lo <= -INF, hif, np.where(hi >= INF, lof, (lof + hif) / 2))


def _try(mono: Monomials, cols, coefs, lo, hi, weight, budget, mode="tight", hard=None,
         hard_budget: float = 0.0) -> Formula | None:
    vals = np.zeros(len(lo), np.int64)
    for m, c in zip(cols, coefs):
        vals = vals + np.int64(c) * mono.values[:, m]
    ok, c0 = check(vals, lo, hi, weight, budget, mode, hard, hard_budget)
    if not ok:
        return None
    terms = tuple(sorted(((int(c), mono.names[m]) for m, c in zip(cols, coefs)),
                         key=lambda t: (len(t[1]), t[1])))
    return Formula(c0, terms)


def _ls_candidates(mono, subsets, mid, fin, lo, hi, weight, budget, mode="tight", hard=None, hard_budget=0.0):
    if not subsets:
        return []
    G = mono.values.astype(np.float64)
    rows = np.flatnonzero(np.isfinite(mid))
    rows = rows[_subsample(len(rows), 64)]
    y = mid[rows]
    S = np.array(subsets)                                         # (S, k)
    k = S.shape[1]
    X = np.concatenate([np.ones((len(S), len(rows), 1)), G[rows][:, S].transpose(1, 0, 2)], axis=2)
    coef = _lstsq(X, _rep(y, len(S)))
    res = np.abs(np.einsum("sij,sj->si", X, coef) - y[None, :])                   # (S, rows)
    resid = res.max(axis=1)
    width = (hi - lo).astype(np.float64)
    tol = np.nanmax(np.where(np.isfinite(width) & (width < INF), width, 0)) + 1
    if budget > 0:
        _refit_trimmed(X, y, coef, res, resid, weight[rows], budget, 4 * tol)
    good = np.flatnonzero((resid <= 4 * tol) & np.all(np.abs(coef[:, 1:]) < MAX_COEF, axis=1))
    good = good[np.argsort(resid[good])][:200]
    deltas = np.array(list(itertools.product((0, -1, 1), repeat=k)), np.int64)      # (D, k)
    coefs = np.round(coef[good, 1:]).astype(np.int64)[:, None, :] + deltas[None]     # (n, D, k)
    may = _may_hold(mono.values, S[good], coefs, lo, hi, weight, budget)           # (n, D)
    out = []
    for i, s in enumerate(good):
        for j in np.flatnonzero(may[i] & (coefs[i] != 0).all(axis=1)):
            f = _try(mono, list(S[s]), [int(x) for x in coefs[i, j]], lo, hi, weight, budget, mode, hard,
                     hard_budget)
            if f is not None:
                out.append((f.score(), f))
                break
    return out


def _may_hold(G: np.ndarray, cols: np.ndarray, coefs: np.ndarray, lo, hi, weight, budget: float) -> np.ndarray:
    """Which candidate formulas (coefficients `coefs[i, j]` on the columns `cols[i]` of G) might
    `check` accept, in any mode: those for which some const lies inside all the intervals
    [lo - vals, hi - vals] but `budget` weight. Every const `check` may pick leaves out at least
    the weight the best const leaves out (the sweep's), so a candidate refused here is refused
    there; this pass only spares the per-candidate calls, vectorized (a solve that finds nothing
    tries every one of them). The same int64 values as `_try`'s; empty intervals (lo > hi) count
    as left out by every const."""
    n, D, _ = coefs.shape
    U = len(lo)
    may = np.zeros((n, D), bool)
    total = float(weight.sum())
    step = max(1, (1 << 21) // max(D * U, 1))   # candidates per block: about 2M values at a time
    for a0 in range(0, n, step):
        Gs = G[:, cols[a0:a0 + step]]                                  # (U, b, k)
        vals = np.einsum("ubk,bdk->bdu", Gs, coefs[a0:a0 + step])       # (b, D, U), int64
        a, b1 = lo - vals, hi - vals + 1
        w = np.where(a < b1, weight, 0.0)
        ev = np.concatenate([b1, a], axis=2)             # removals first: ties keep them before additions
        o = np.argsort(ev, axis=2, kind="stable")
        cov = np.cumsum(np.take_along_axis(np.concatenate([-w, w], axis=2), o, axis=2), axis=2).max(axis=2)
        may[a0:a0 + step] = total - cov <= budget + 1e-9 * max(total, 1.0)
    return may


def _rep(y, n):
    return np.broadcast_to(y, (n, len(y)))


def _lstsq(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares per column set: X (S, rows, k), y (S, rows) -> coefficients (S, k), the
    columns scaled to their largest value for the conditioning."""
    scale = np.abs(X).max(axis=1, keepdims=True)
    scale[scale == 0] = 1
    return np.einsum("sij,sj->si", np.linalg.pinv(X / scale), y) / scale[:, 0, :]


TRIM_SETS, TRIM_ROUNDS = 200, 2


def _trim(res: np.ndarray, w: np.ndarray, budget: float) -> np.ndarray:
    """Per column set, the rows kept when those of largest residual are left out while their
    weight stays within `budget`."""
    order = np.argsort(-res, axis=1, kind="stable")
    keep = np.ones(res.shape, bool)
    np.put_along_axis(keep, order, np.cumsum(w[order], axis=1) > budget, axis=1)
    return keep


def _refit_trimmed(X, y, coef, res, resid, w, budget: float, tol: float) -> None:
    """Least squares again without the rows the budget may leave out, for the column sets whose
    plain fit misses a row by more than `tol` (`res`: its residuals per row; in place: `coef`,
    and `resid` then over the rows kept). One launch whose records were lost (its last chunk unrecorded: its end far below
    the formula's) pulls the plain fit off every launch, and its rounded coefficients off the
    formula that holds for all the others; the budget is there to leave that launch out. Refitted:
    the `TRIM_SETS` sets that miss least once their worst rows are left out, `TRIM_ROUNDS` times
    (each round leaves out the rows the last fit misses most)."""
    bad = np.flatnonzero(resid > tol)
    if not len(bad):
        return
    trimmed = np.where(_trim(res[bad], w, budget), res[bad], 0).max(axis=1)
    bad = bad[np.argsort(trimmed, kind="stable")[:TRIM_SETS]]
    Xb, rb = X[bad], res[bad]
    for _ in range(TRIM_ROUNDS):
        keep = _trim(rb, w, budget)
        cb = _lstsq(Xb * keep[:, :, None], y[None, :] * keep)
        rb = np.abs(np.einsum("sij,sj->si", Xb, cb) - y[None, :])
    coef[bad] = cb
    resid[bad] = np.where(_trim(rb, w, budget), rb, 0).max(axis=1)
