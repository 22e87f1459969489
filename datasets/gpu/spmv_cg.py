"""spmv-cg on a GPU: conjugate gradient on a CSR matrix in uneven row blocks (CuPy, managed memory).

Mirrors the `spmv-cg` workload model (datasets/scientific.py): the same
kernels and parameter lists (spmv_csr_block, dot_partial, axpy, xpay,
reduce_sum), a banded matrix with long-range couplings into clusters, so each
row block gathers a data-dependent set of x pages. The matrix is symmetric
and diagonally dominant, so CG converges; alpha and beta come back to the host
each iteration, as in a real solver. `--scale S` multiplies the rows by S.

    python -m pagecast.datasets.gpu.spmv_cg --scale 1
"""

from __future__ import annotations

import numpy as np

from .common import REDUCE_SUM, Gpu, cdiv, f32, i32, parse_args, round_to

CODE = r"""
extern "C" __global__ void spmv_csr_block(int nrows, int nnz, const int* rowptr, const int* colind,
                                          const float* vals, const float* x, float* y) {
    // rowptr, colind, vals and y point at this block's first row / entry; rowptr holds global offsets
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= nrows) return;
    int base = rowptr[0];
    float acc = 0.0f;
    for (int k = rowptr[r] - base; k < rowptr[r + 1] - base && k < nnz; ++k) acc += vals[k] * x[colind[k]];
    y[r] = acc;
}

extern "C" __global__ void dot_partial(const float* a, const float* b, float* out, int n) {
    __shared__ float s[512];
    float v = 0.0f;
    for (int k = threadIdx.x; k < n; k += blockDim.x) v += a[k] * b[k];
    s[threadIdx.x] = v;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[0] = s[0];
}

extern "C" __global__ void axpy(float* y, const float* x, float alpha, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += alpha * x[i];
}

extern "C" __global__ void xpay(float* y, const float* x, float beta, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] + beta * y[i];
}

""" + REDUCE_SUM
KERNELS = ["spmv_csr_block", "dot_partial", "axpy", "xpay", "reduce_sum"]
ITERS = 6  # enough iterations that the gather pattern of x, seen once, dominates


def matrix(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Symmetric, diagonally dominant CSR: a band plus couplings into random clusters."""
    per_row = rng.integers(2, 7, n)
    row = np.repeat(np.arange(n), per_row)
    m = len(row)
    far = rng.random(m) < 0.08
    band = row + rng.integers(-48, 49, m)
    centers = rng.integers(0, n, max(4, n // 4096))
    cluster = centers[rng.integers(0, len(centers), m)] + rng.integers(-256, 257, m)
    col = np.clip(np.where(far, cluster, band), 0, n - 1)
    keep = col != row
    r, c = row[keep], col[keep]
    r, c = np.concatenate([r, c]), np.concatenate([c, r])      # symmetric pattern
    key = np.sort(r.astype(np.int64) * n + c)
    key = key[np.concatenate([[True], key[1:] != key[:-1]])]
    r, c = key // n, key % n
    lo, hi = np.minimum(r, c), np.maximum(r, c)
    v = -(0.05 + 0.1 * ((lo * 7919 + hi * 104729) % 1000) / 1000.0)  # symmetric values
    diag = np.bincount(r, weights=np.abs(v), minlength=n) + 1.0
    r = np.concatenate([r, np.arange(n)])
    c = np.concatenate([c, np.arange(n)])
    v = np.concatenate([v, diag])
    order = np.argsort(r * n + c, kind="stable")
    r, c, v = r[order], c[order], v[order]
    rowptr = np.concatenate([[0], np.cumsum(np.bincount(r, minlength=n))]).astype(np.int32)
    return rowptr, c.astype(np.int32), v.astype(np.float32)


def plan(scale: float) -> tuple[int, int]:
    n = round_to(65536 * scale, 256, 1024)
    est_nnz = 10 * n
    return n, 4 * (n + 1) + 8 * est_nnz + 4 * 4 * n + 8192


def main(argv=None) -> None:
    a = parse_args("spmv_cg", __doc__.splitlines()[0], argv)
    n, nbytes = plan(a.scale)
    g = Gpu("spmv_cg", nbytes)
    K = g.module(CODE, KERNELS)
    rng = np.random.default_rng(a.seed)
    rowptr_h, col_h, val_h = matrix(rng, n)
    nblk = int(rng.integers(6, 11))
    cuts = np.sort(rng.choice(np.arange(1, n // 64), nblk - 1, replace=False)) * 64
    r0 = np.concatenate([[0], cuts]).astype(np.int64)
    r1 = np.concatenate([cuts, [n]]).astype(np.int64)
    k0 = rowptr_h[r0].astype(np.int64)
    rowptr, colind, vals = g.array(rowptr_h), g.array(col_h), g.array(val_h)
    b = rng.standard_normal(n).astype(np.float32)
    x = g.array(np.zeros(n, np.float32))
    r = g.array(b)
    p = g.array(b)
    q = g.empty(n, np.float32)
    partial = g.empty(64, np.float32)
    scalars = g.empty(1024, np.float32)

    def dot(u, v, slot):
        for k in range(nblk):
            s, e = int(r0[k]), int(r1[k])
            g.launch(K["dot_partial"], (1,), (512,), (u[s:], v[s:], partial[k:], i32(e - s)))
        g.launch(K["reduce_sum"], (1,), (1024,), (partial, scalars[slot:], i32(nblk)))
        return float(scalars[slot:slot + 1].get()[0])

    def blocks(fn, y, xv, scalar):
        for k in range(nblk):
            s, e = int(r0[k]), int(r1[k])
            g.launch(K[fn], (cdiv(e - s, 256),), (256,), (y[s:], xv[s:], f32(scalar), i32(e - s)))

    rr = dot(r, r, 0)
    rr0 = rr
    for _ in range(ITERS):
        for k in range(nblk):
            s, e = int(r0[k]), int(r1[k])
            nz = int(rowptr_h[e] - rowptr_h[s])
            g.launch(K["spmv_csr_block"], (cdiv(e - s, 128),), (128,),
                     (i32(e - s), i32(nz), rowptr[s:], colind[int(k0[k]):], vals[int(k0[k]):], p, q[s:]),
                     values={"colind": col_h[int(k0[k]):int(k0[k]) + nz]})   # the host has them (footprints)
        pq = dot(p, q, 1)
        if pq == 0.0 or rr == 0.0:  # converged exactly (never with this matrix and a random b)
            break
        alpha = rr / pq
        blocks("axpy", x, p, alpha)
        blocks("axpy", r, q, -alpha)
        rr_new = dot(r, r, 2)
        blocks("xpay", p, r, rr_new / rr)
        rr = rr_new
    g.done(f"n={n}, nnz={len(col_h)}, {nblk} row blocks, |r|^2 {rr0:.4g} -> {rr:.4g}")


if __name__ == "__main__":
    main()
