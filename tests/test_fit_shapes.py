"""Shared shapes and argument-backed ends: what a one-profile fit may add to a size the records pin."""

from __future__ import annotations

from pagecast import trace as T
from pagecast.datasets.engine import WRITE, Builder, Kernel, Range
from pagecast.predict.evaluate import evaluate
from pagecast.predict.fit import fit_model


K_GEMM_W = Kernel("gemm_weights", [("M", "int"), ("N", "int"), ("K", "int"), ("A", "const float*"),
                                   ("B", "const float*"), ("C", "float*")],
                  {"A": "linear", "B": "linear", "C": "linear"})


def _gemm_w(seed: int, steps: int = 30) -> Builder:
    """C[M x N] = A[M x K] B[K x N], B a weight matrix of K*N floats that ends on a page, a bias
    after it in the same allocation; M (the batch) drawn per launch, K and N fixed."""
    b = Builder("gemm-weights", seed=seed)
    K, N = 384, 1000
    w = b.malloc(4 * K * N + 4 * N, "weights")
    a, c = b.malloc(4 * 32 * K, "a"), b.malloc(4 * 32 * N, "c")
    for _ in range(steps):
        M = int(b.rng.integers(1, 17))
        i0 = b.reserve(1)
        b.launch(K_GEMM_W, [i0], {"M": M, "N": N, "K": K, "A": a.ptr(), "B": w.ptr(), "C": c.ptr()},
                 grid=(8, 1), touches=[Range(a, 0, 4 * M * K), Range(w, 0, 4 * K * N), Range(c, 0, 4 * M * N, WRITE)])
    return b


def test_a_weight_matrix_keeps_its_constant_size_without_an_arguments_crumbs(tmp_path):
    """The weights' end is pinned at 4*K*N (375 pages, K and N fixed): neither the activations'
    `4*M*K` (a shared shape `4*M + 1536000`) nor `argument_backed` (`M + 1536000`, whose premise,
    a region under a page, does not hold) may add the batch to it: on a page-aligned end that is
    a page of the bias past it at every launch."""
    fit = _gemm_w(1).write(tmp_path / "f.pctrace")
    test = _gemm_w(2).write(tmp_path / "t.pctrace")
    model = fit_model([T.read_trace(fit)])
    km = next(km for n, km in model.kernels.items() if "gemm_weights" in n)
    assert next(x for x in km.regions if x.base == "p4").text() == "[p4, p4 + 1536000)"
    ev = evaluate(model, T.read_trace(test), "none")
    k = next(x for x in ev["kernels"] if "gemm_weights" in x["kernel"])
    assert k["precision"] == 1.0 and k["recall"] == 1.0, k
