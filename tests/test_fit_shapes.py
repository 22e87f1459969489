"""Shared shapes and argument-backed ends: what a one-profile fit may add to a size the records pin."""

from __future__ import annotations

from pagecast import trace as T
from pagecast.datasets.engine import WRITE, Builder, Kernel, Range
from pagecast.predict.evaluate import evaluate
from pagecast.predict.fit import fit_model


K_GEMM_W = Kernel("gemm_weights", [("M", "int"), ("N", "int"), ("K", "int"), ("A", "const float*"),
                                   ("B", "const float*"), ("C", "float*")],
                  {"A": "linear", "B": "linear", "C": "linear"})


def _gemm_w(seed: int, steps: int = 30, K: int = 384, N: int = 1000) -> Builder:
    """C[M x N] = A[M x K] B[K x N], B a weight matrix of K*N floats that ends on a page, a bias
    after it in the same allocation; M (the batch) drawn per launch, K and N fixed."""
    b = Builder("gemm-weights", seed=seed)
    w = b.malloc(4 * K * N + 4 * N, "weights")
    a, c = b.malloc(4 * 32 * K, "a"), b.malloc(4 * 32 * N, "c")
    for _ in range(steps):
        M = int(b.rng.integers(1, 17))
        i0 = b.reserve(1)
        b.launch(K_GEMM_W, [i0], {"M": M, "N": N, "K": K, "A": a.ptr(), "B": w.ptr(), "C": c.ptr()},
                 grid=(8, 1), touches=[Range(a, 0, 4 * M * K), Range(w, 0, 4 * K * N), Range(c, 0, 4 * M * N, WRITE)])
    return b


def _scores(model, test) -> dict:
    ev = evaluate(model, T.read_trace(test), "none")
    return next(x for x in ev["kernels"] if "gemm_weights" in x["kernel"])


def test_a_weight_matrix_keeps_its_size_without_an_arguments_crumbs(tmp_path):
    """The weights' end is pinned at 4*K*N (375 pages, K and N fixed): neither the activations'
    `4*M*K` (a shared shape `4*M + 1536000`) nor `argument_backed` (`M + 1536000`, whose premise,
    a region under a page, does not hold) may add the batch to it: on a page-aligned end that is
    a page of the bias past it at every launch. The size is the layout K and N describe."""
    fit = _gemm_w(1).write(tmp_path / "f.pctrace")
    test = _gemm_w(2).write(tmp_path / "t.pctrace")
    model = fit_model([T.read_trace(fit)])
    km = next(km for n, km in model.kernels.items() if "gemm_weights" in n)
    r = next(x for x in km.regions if x.base == "p4")
    assert r.text() == "[p4, p4 + 4*p1*p2)" and r.fit["constant_size"] == "1536000", r.text()
    assert km.pinned.unvaried == ["p1", "p2"] and not km.pinned.pinned
    k = _scores(model, test)
    assert k["precision"] == 1.0 and k["recall"] == 1.0, k


def test_a_constant_size_the_arguments_describe_follows_them_to_another_layout(tmp_path):
    """One profile in which K and N never vary: the weights' size (1536000 bytes, pinned by the
    records over 375 pages) is a constant to the solver, and `4*K*N` at every launch, ending in
    the same page: the layout the arguments describe. Another network's K (320) is predicted
    from it; the constant reached past the weights into the bias (on the old fitter, precision
    below 100%)."""
    fit = _gemm_w(1).write(tmp_path / "f.pctrace")
    model = fit_model([T.read_trace(fit)])
    for K in (320, 512):
        k = _scores(model, _gemm_w(2, K=K).write(tmp_path / f"t{K}.pctrace"))
        assert k["precision"] == 1.0 and k["recall"] == 1.0, (K, k)


K_TABLE = Kernel("table_lookup", [("n", "int"), ("k", "int"), ("table", "const float*"), ("out", "float*")],
                 {"table": "fixed", "out": "linear"})


def test_a_size_no_argument_carries_stays_a_constant(tmp_path):
    """A table of 300 pages and 100 bytes read whole by every launch of a kernel whose arguments
    (n, k fixed; the output `4*n*k` bytes) describe no layout of that size: its end stays the
    constant. (One product of the arguments in the same page as another would be a layout of a
    different size: the records could not say which, and the constant stays there too.)"""
    b = Builder("table", seed=1)
    size = 300 * 4096 + 100
    tab, out = b.malloc(size + 4096, "table"), b.malloc(4 * 1000 * 384, "out")
    for _ in range(30):
        i0 = b.reserve(1)
        b.launch(K_TABLE, [i0], {"n": 1000, "k": 384, "table": tab.ptr(), "out": out.ptr()},
                 grid=(8, 1), touches=[Range(tab, 0, size), Range(out, 0, 4 * 1000 * 384, WRITE)])
    model = fit_model([T.read_trace(b.write(tmp_path / "f.pctrace"))])
    km = next(km for n, km in model.kernels.items() if "table_lookup" in n)
    r = next(x for x in km.regions if x.base == "p2")
    assert not r.end.terms and "layout_size" not in r.fit, r.text()
    o = next(x for x in km.regions if x.base == "p3")
    assert o.text() == "[p3, p3 + 4*p0*p1)", o.text()
