"""mlp-train on a GPU: a 4-layer MLP trained with SGD + momentum (CuPy, managed memory).

Mirrors the `mlp-train` workload model (datasets/dnn.py): BLAS-style GEMMs
(sgemm_nn / sgemm_tn / sgemm_nt with M, N, K, alpha, A, lda, B, ldb, beta, C,
ldc), bias_add, relu_inplace (whose extent follows the grid), softmax_xent,
relu_backward, bias_grad, and sgd_momentum over one flat parameter buffer whose
element count lives only in device memory. The epoch's last batch is short,
so batch sizes vary. `--scale S` multiplies the layer widths by sqrt(S).

    python -m pagecast.datasets.gpu.mlp_train --scale 1
"""

from __future__ import annotations

import numpy as np

from .common import Gpu, cdiv, f32, i32, i64, parse_args, round_to

CODE = r"""
#define TILE 16
// C[M x N] = alpha * op(A) op(B) + beta * C, row-major; TA / TB: A stored K x M, B stored N x K
template <bool TA, bool TB>
__device__ void gemm(int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
                     float beta, float* C, int ldc) {
    __shared__ float As[TILE][TILE + 1], Bs[TILE][TILE + 1];
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        int ka = k0 + threadIdx.x, kb = k0 + threadIdx.y;
        As[threadIdx.y][threadIdx.x] = (row < M && ka < K) ? (TA ? A[(long)ka * lda + row] : A[(long)row * lda + ka]) : 0.0f;
        Bs[threadIdx.y][threadIdx.x] = (kb < K && col < N) ? (TB ? B[(long)col * ldb + kb] : B[(long)kb * ldb + col]) : 0.0f;
        __syncthreads();
        for (int k = 0; k < TILE; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
        __syncthreads();
    }
    if (row < M && col < N) {
        float* c = C + (long)row * ldc + col;
        *c = alpha * acc + (beta != 0.0f ? beta * *c : 0.0f);
    }
}
extern "C" __global__ void sgemm_nn(int M, int N, int K, float alpha, const float* A, int lda, const float* B,
                                    int ldb, float beta, float* C, int ldc) {
    gemm<false, false>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
extern "C" __global__ void sgemm_tn(int M, int N, int K, float alpha, const float* A, int lda, const float* B,
                                    int ldb, float beta, float* C, int ldc) {
    gemm<true, false>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
extern "C" __global__ void sgemm_nt(int M, int N, int K, float alpha, const float* A, int lda, const float* B,
                                    int ldb, float beta, float* C, int ldc) {
    gemm<false, true>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

extern "C" __global__ void bias_add(float* y, const float* bias, int rows, int cols) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (long)rows * cols) y[i] += bias[i % cols];
}

extern "C" __global__ void relu_inplace(float* x) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;   // the grid covers the array exactly
    x[i] = fmaxf(x[i], 0.0f);
}

extern "C" __global__ void softmax_xent(const float* logits, const int* labels, float* loss, float* dlogits,
                                        int batch, int classes) {
    __shared__ float s[256];
    int r = blockIdx.x, t = threadIdx.x;
    const float* z = logits + (long)r * classes;
    float m = -3.0e38f;
    for (int c = t; c < classes; c += blockDim.x) m = fmaxf(m, z[c]);
    s[t] = m; __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) { if (t < w) s[t] = fmaxf(s[t], s[t + w]); __syncthreads(); }
    m = s[0]; __syncthreads();
    float sum = 0.0f;
    for (int c = t; c < classes; c += blockDim.x) sum += expf(z[c] - m);
    s[t] = sum; __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) { if (t < w) s[t] += s[t + w]; __syncthreads(); }
    sum = s[0];
    int label = labels[r];
    for (int c = t; c < classes; c += blockDim.x) {
        float p = expf(z[c] - m) / sum;
        dlogits[(long)r * classes + c] = (p - (c == label ? 1.0f : 0.0f)) / batch;
    }
    if (t == 0) atomicAdd(loss, -(z[label] - m - logf(sum)) / batch);
}

extern "C" __global__ void relu_backward(float* dy, const float* y, long n) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        if (y[i] <= 0.0f) dy[i] = 0.0f;
}

extern "C" __global__ void bias_grad(const float* dy, float* db, int rows, int cols) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float acc = 0.0f;
    for (int r = 0; r < rows; ++r) acc += dy[(long)r * cols + c];
    db[c] = acc;
}

extern "C" __global__ void sgd_momentum(float* params, const float* grads, float* momentum, const long* numel,
                                        float lr, float mu, float weight_decay) {
    long n = numel[0];
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        float g = grads[i] + weight_decay * params[i];
        float m = mu * momentum[i] + g;
        momentum[i] = m;
        params[i] -= lr * m;
    }
}
"""
KERNELS = ["sgemm_nn", "sgemm_tn", "sgemm_nt", "bias_add", "relu_inplace", "softmax_xent", "relu_backward",
           "bias_grad", "sgd_momentum"]
STEPS = 6
CLASSES = 256


def _align(x: int, a: int = 64) -> int:
    return -(-x // a) * a  # in floats: 256 bytes


def plan(scale: float, seed: int):
    rng = np.random.default_rng(seed)
    sf = np.sqrt(scale)
    d_in = round_to(768 * sf, 256, 256)
    hidden = [round_to(1024 * sf * rng.uniform(0.75, 1.25), 256, 256) for _ in range(3)]
    dims = [d_in, *hidden, CLASSES]
    bmax = 128
    dataset = int(bmax * 5.5)          # the epoch's last batch is short
    w_off, b_off, off = [], [], 0
    for l in range(len(dims) - 1):
        w_off.append(off)
        off += _align(dims[l] * dims[l + 1])
        b_off.append(off)
        off += _align(dims[l + 1])
    nbytes = 3 * 4 * off + 2 * sum(4 * bmax * d for d in dims) + 4 * bmax + 8192
    return rng, dims, bmax, dataset, w_off, b_off, off, nbytes


def main(argv=None) -> None:
    a = parse_args("mlp_train", __doc__.splitlines()[0], argv)
    rng, dims, bmax, dataset, w_off, b_off, nparam, nbytes = plan(a.scale, a.seed)
    L = len(dims) - 1
    g = Gpu("mlp_train", nbytes)
    K = g.module(CODE, KERNELS)
    init = np.zeros(nparam, np.float32)
    for l in range(L):
        w = rng.standard_normal(dims[l] * dims[l + 1]).astype(np.float32) * np.float32(np.sqrt(2.0 / dims[l]))
        init[w_off[l]:w_off[l] + w.size] = w
    params = g.array(init)
    grads = g.array(np.zeros(nparam, np.float32))
    mom = g.array(np.zeros(nparam, np.float32))
    meta = g.array(np.array([nparam], np.int64))
    acts = [g.empty(bmax * d, np.float32) for d in dims]
    dacts = [None] + [g.empty(bmax * d, np.float32) for d in dims[1:]]
    data_x = rng.standard_normal((dataset, dims[0])).astype(np.float32)
    data_y = rng.integers(0, CLASSES, dataset).astype(np.int32)
    labels = g.empty(bmax, np.int32)
    loss = g.array(np.zeros(1024, np.float32))
    per_epoch = -(-dataset // bmax)

    def gemm(kind, M, N, Kd, A, B, C, beta=0.0):
        lda = Kd if kind != "sgemm_tn" else M
        ldb = N if kind != "sgemm_nt" else Kd
        g.launch(K[kind], (cdiv(N, 16), cdiv(M, 16)), (16, 16),
                 (i32(M), i32(N), i32(Kd), f32(1.0), A, i32(lda), B, i32(ldb), f32(beta), C, i32(N)))

    losses = []
    for step in range(STEPS):
        j = step % per_epoch
        B = min(bmax, dataset - j * bmax)
        acts[0][:B * dims[0]].set(data_x[j * bmax:j * bmax + B].reshape(-1))   # host -> device copies
        labels[:B].set(data_y[j * bmax:j * bmax + B])
        for l in range(L):
            n = dims[l + 1]
            gemm("sgemm_nn", B, n, dims[l], acts[l], params[w_off[l]:], acts[l + 1])
            g.launch(K["bias_add"], (cdiv(B * n, 256),), (256,), (acts[l + 1], params[b_off[l]:], i32(B), i32(n)))
            if l < L - 1:
                g.launch(K["relu_inplace"], (B * n // 256,), (256,), (acts[l + 1],))
        g.launch(K["softmax_xent"], (B,), (256,), (acts[L], labels, loss[step:], dacts[L], i32(B), i32(dims[L])))
        for l in range(L - 1, -1, -1):
            n = dims[l + 1]
            if l < L - 1:
                g.launch(K["relu_backward"], (cdiv(B * n, 1024),), (256,), (dacts[l + 1], acts[l + 1], i64(B * n)))
            gemm("sgemm_tn", dims[l], n, B, acts[l], dacts[l + 1], grads[w_off[l]:])
            g.launch(K["bias_grad"], (cdiv(n, 256),), (256,), (dacts[l + 1], grads[b_off[l]:], i32(B), i32(n)))
            if l > 0:
                gemm("sgemm_nt", B, dims[l], n, dacts[l + 1], params[w_off[l]:], dacts[l])
        g.launch(K["sgd_momentum"], (1024,), (256,), (params, grads, mom, meta, f32(1e-3), f32(0.9), f32(1e-4)))
    losses = loss[:STEPS].get()
    g.done(f"dims {dims}, batch {bmax} (last {dataset - (per_epoch - 1) * bmax}), "
           f"loss {losses[0]:.4f} -> {losses[-1]:.4f}")


if __name__ == "__main__":
    main()
