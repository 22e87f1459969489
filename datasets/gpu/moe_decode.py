"""moe-decode on a GPU: token-by-token decoding through mixture-of-experts layers (CuPy, managed memory).

A data-dependent workload: each layer's router picks, per token, the top-2 of its experts and
writes their ids to device memory; the expert kernels read only the chosen experts' weight slices,
found through those ids (`moe_expert_up`, `moe_expert_down`). Which pages a launch touches is
known only once the launch before it has run: what a template must read from the index values
(indexed regions), and what an allocation-level prefetch gets wrong by the whole layer.

Per layer: the router's weights [experts, hidden], the experts' gate and up weights [experts,
2 x ffn, hidden] and down weights [experts, hidden, ffn], bf16, one allocation each; the weights
are filled on the GPU by a hash kernel (no host copy of a GiB). Per decode step and layer:
router, expert up (gate and up, SiLU), expert down (weighted by the router's scores, into the next
layer's input). `--scale S` multiplies the number of layers (at least 2); about 0.38 GiB of
managed memory a layer.

    python -m pagecast.datasets.gpu.moe_decode --scale 1
"""

from __future__ import annotations

import numpy as np

from .common import BF16_HELPERS, Gpu, cdiv, i32, i64, parse_args

HIDDEN = 1024
FFN = 1024
EXPERTS = 64
TOP_K = 2
STEPS = 8

CODE = BF16_HELPERS + r"""
extern "C" __global__ void moe_init(bf16* w, long n, unsigned int seed) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    long stride = (long)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        unsigned int h = (unsigned int)(i * 2654435761u) ^ seed;
        h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
        w[i] = f2bf(((float)(h & 0xFFFF) / 65536.0f - 0.5f) * 0.0625f);
    }
}

extern "C" __global__ void moe_router(const bf16* w_router, const float* x, int* expert_ids, float* expert_w,
                                      int n_experts, int dim) {
    // one block; thread e scores expert e, thread 0 keeps the top two and their softmax weights
    __shared__ float logit[1024];
    int e = threadIdx.x;
    if (e < n_experts) {
        const bf16* w = w_router + (long)e * dim;
        float acc = 0.0f;
        for (int c = 0; c < dim; ++c) acc += bf2f(w[c]) * x[c];
        logit[e] = acc;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int a = 0, b = 1;
        if (logit[b] > logit[a]) { a = 1; b = 0; }
        for (int k = 2; k < n_experts; ++k) {
            if (logit[k] > logit[a]) { b = a; a = k; }
            else if (logit[k] > logit[b]) { b = k; }
        }
        float m = logit[a], ea = 1.0f, eb = __expf(logit[b] - m);
        expert_ids[0] = a; expert_ids[1] = b;
        expert_w[0] = ea / (ea + eb); expert_w[1] = eb / (ea + eb);
    }
}

extern "C" __global__ void moe_expert_up(const bf16* w_up, const int* expert_ids, const float* x, float* h,
                                         int top_k, int ffn, int dim) {
    // blockIdx.y: which chosen expert; one warp per row of its gate and up halves
    int kk = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int r = blockIdx.x * (blockDim.x / 32) + warp;
    if (kk >= top_k || r >= ffn) return;
    const bf16* w = w_up + (long)expert_ids[kk] * 2 * ffn * dim;
    float g = 0.0f, u = 0.0f;
    for (int c = lane; c < dim; c += 32) {
        g += bf2f(w[(long)r * dim + c]) * x[c];
        u += bf2f(w[(long)(ffn + r) * dim + c]) * x[c];
    }
    for (int o = 16; o > 0; o >>= 1) {
        g += __shfl_down_sync(0xffffffffu, g, o);
        u += __shfl_down_sync(0xffffffffu, u, o);
    }
    if (lane == 0) h[(long)kk * ffn + r] = g / (1.0f + __expf(-g)) * u;
}

extern "C" __global__ void moe_expert_down(const bf16* w_down, const int* expert_ids, const float* expert_w,
                                           const float* h, float* y, int top_k, int ffn, int dim) {
    // one warp per output row, summed over the chosen experts, weighted by the router
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int r = blockIdx.x * (blockDim.x / 32) + warp;
    if (r >= dim) return;
    float acc = 0.0f;
    for (int kk = 0; kk < top_k; ++kk) {
        const bf16* w = w_down + ((long)expert_ids[kk] * dim + r) * ffn;
        float s = 0.0f;
        for (int c = lane; c < ffn; c += 32) s += bf2f(w[c]) * h[(long)kk * ffn + c];
        acc += expert_w[kk] * s;
    }
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
    if (lane == 0) y[r] = acc;
}
"""
KERNELS = ["moe_init", "moe_router", "moe_expert_up", "moe_expert_down"]


def layer_bytes() -> int:
    return 2 * (EXPERTS * HIDDEN + EXPERTS * 2 * FFN * HIDDEN + EXPERTS * HIDDEN * FFN)


def plan(scale: float) -> tuple[int, int]:
    layers = max(2, int(round(2 * scale)))
    act = 4 * (STEPS * HIDDEN + 2 * HIDDEN + TOP_K * FFN) + 4 * TOP_K * 2 * layers + 4096
    return layers, layers * layer_bytes() + act


def main(argv=None) -> None:
    a = parse_args("moe_decode", __doc__.splitlines()[0], argv)
    layers, nbytes = plan(a.scale)
    g = Gpu("moe_decode", nbytes)
    K = g.module(CODE, KERNELS)
    rng = np.random.default_rng(a.seed)
    weights = []
    for layer in range(layers):
        w = {"router": g.empty(EXPERTS * HIDDEN, np.uint16), "up": g.empty(EXPERTS * 2 * FFN * HIDDEN, np.uint16),
             "down": g.empty(EXPERTS * HIDDEN * FFN, np.uint16)}
        for k, arr in w.items():
            n = int(arr.size)
            seed = np.uint32(rng.integers(1, 2**31))
            g.launch(K["moe_init"], (min(4096, cdiv(n, 256)),), (256,), (arr, i64(n), seed))
        weights.append(w)
    inputs = g.array(rng.standard_normal(STEPS * HIDDEN).astype(np.float32))
    xs = [g.empty(HIDDEN, np.float32), g.empty(HIDDEN, np.float32)]
    h = g.empty(TOP_K * FFN, np.float32)
    ids = [g.empty(TOP_K, np.int32) for _ in range(layers)]
    gates = [g.empty(TOP_K, np.float32) for _ in range(layers)]
    chosen = []
    for step in range(STEPS):
        x = inputs[step * HIDDEN:]
        for layer, w in enumerate(weights):
            y = xs[layer % 2]
            g.launch(K["moe_router"], (1,), (EXPERTS,), (w["router"], x, ids[layer], gates[layer], i32(EXPERTS),
                                                          i32(HIDDEN)))
            g.launch(K["moe_expert_up"], (cdiv(FFN, 8), TOP_K), (256,), (w["up"], ids[layer], x, h, i32(TOP_K),
                                                                        i32(FFN), i32(HIDDEN)))
            g.launch(K["moe_expert_down"], (cdiv(HIDDEN, 8),), (256,), (w["down"], ids[layer], gates[layer], h, y,
                                                                       i32(TOP_K), i32(FFN), i32(HIDDEN)))
            x = y
        chosen.append(ids[0].get().tolist())
    g.done(f"{layers} layers of {EXPERTS} experts, {STEPS} tokens; layer 0 chose {chosen[:3]}")


if __name__ == "__main__":
    main()
