"""llm-decode on a GPU: token-by-token decoding of a Llama-style bf16 model (CuPy, managed memory).

Mirrors the `llm-decode` workload model (datasets/llm.py): all weights in one
allocation (per-layer pointers are offsets inside it), the KV cache of every
layer in one pool ([n_kv_heads, max_seq, head_dim] for K and V), and the
decode kernels with the model's parameter lists: embedding_lookup (its row is
chosen by the token the previous step sampled, in device memory), rmsnorm
(hidden size a compile-time constant), gemv_bf16, rope_apply, kv_append,
attention_decode (reads the first pos + 1 cache rows per head), residual_add,
silu_mul and sample_top_p (greedy here, so runs are deterministic). Requests
resume a cached context at a random position and generate a few tokens.
`--scale S` multiplies the number of layers by S (at least 2).

    python -m pagecast.datasets.gpu.llm_decode --scale 1
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .common import BF16_HELPERS, Gpu, cdiv, f32, i32, parse_args, to_bf16

HIDDEN = 1024

CODE = BF16_HELPERS + r"""
#define HIDDEN 1024
__device__ float block_sum(float v, float* s) {
    s[threadIdx.x] = v; __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) { if (threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w]; __syncthreads(); }
    float r = s[0]; __syncthreads();
    return r;
}
__device__ float block_max(float v, float* s) {
    s[threadIdx.x] = v; __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) { if (threadIdx.x < w) s[threadIdx.x] = fmaxf(s[threadIdx.x], s[threadIdx.x + w]); __syncthreads(); }
    float r = s[0]; __syncthreads();
    return r;
}

extern "C" __global__ void embedding_lookup(bf16* out, const bf16* table, const int* token, int dim) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < dim) out[i] = table[(long)token[0] * dim + i];
}

extern "C" __global__ void rmsnorm(bf16* out, const bf16* x, const bf16* weight, float eps) {
    __shared__ float s[1024];
    float v = 0.0f;
    for (int i = threadIdx.x; i < HIDDEN; i += blockDim.x) { float f = bf2f(x[i]); v += f * f; }
    float inv = rsqrtf(block_sum(v, s) / HIDDEN + eps);
    for (int i = threadIdx.x; i < HIDDEN; i += blockDim.x) out[i] = f2bf(bf2f(x[i]) * inv * bf2f(weight[i]));
}

extern "C" __global__ void gemv_bf16(const bf16* W, const bf16* x, bf16* y, int rows, int cols) {
    // four warps per block, one row per warp
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int r = blockIdx.x * 4 + warp;
    if (r >= rows) return;
    const bf16* w = W + (long)r * cols;
    float acc = 0.0f;
    for (int c = lane; c < cols; c += 32) acc += bf2f(w[c]) * bf2f(x[c]);
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
    if (lane == 0) y[r] = f2bf(acc);
}

extern "C" __global__ void rope_apply(bf16* qk, const float* cos_sin, int pos, int n_heads, int head_dim, float theta) {
    // cos_sin points at this position's row: head_dim / 2 cosines then head_dim / 2 sines
    int h = blockIdx.x, i = threadIdx.x, half = head_dim / 2;
    if (h >= n_heads || i >= half) return;
    float c = cos_sin[i], s = cos_sin[half + i];
    bf16* v = qk + (long)h * head_dim;
    float a = bf2f(v[i]), b = bf2f(v[i + half]);
    v[i] = f2bf(a * c - b * s);
    v[i + half] = f2bf(a * s + b * c);
}

extern "C" __global__ void kv_append(bf16* k_cache, bf16* v_cache, const bf16* kv, int pos, int max_seq,
                                     int n_kv_heads, int head_dim) {
    int h = blockIdx.x, t = threadIdx.x;
    if (h >= n_kv_heads || t >= head_dim) return;
    long dst = ((long)h * max_seq + pos) * head_dim + t;
    k_cache[dst] = kv[h * head_dim + t];
    v_cache[dst] = kv[(n_kv_heads + h) * head_dim + t];
}

extern "C" __global__ void attention_decode(bf16* out, const bf16* q, const bf16* k_cache, const bf16* v_cache,
                                            int pos, int max_seq, int n_heads, int n_kv_heads, int head_dim,
                                            float softmax_scale) {
    extern __shared__ float sh[];          // max_seq scores, then blockDim.x for reductions
    float* score = sh;
    float* red = sh + max_seq;
    int h = blockIdx.x, kvh = h / (n_heads / n_kv_heads), n = pos + 1;
    const bf16* qh = q + (long)h * head_dim;
    const bf16* K = k_cache + (long)kvh * max_seq * head_dim;
    const bf16* V = v_cache + (long)kvh * max_seq * head_dim;
    float m = -3.0e38f;
    for (int t = threadIdx.x; t < n; t += blockDim.x) {
        float acc = 0.0f;
        for (int d = 0; d < head_dim; ++d) acc += bf2f(qh[d]) * bf2f(K[(long)t * head_dim + d]);
        score[t] = acc * softmax_scale;
        m = fmaxf(m, score[t]);
    }
    __syncthreads();
    m = block_max(m, red);
    float sum = 0.0f;
    for (int t = threadIdx.x; t < n; t += blockDim.x) { score[t] = expf(score[t] - m); sum += score[t]; }
    __syncthreads();
    sum = block_sum(sum, red);
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int t = 0; t < n; ++t) acc += score[t] * bf2f(V[(long)t * head_dim + d]);
        out[(long)h * head_dim + d] = f2bf(acc / sum);
    }
}

extern "C" __global__ void residual_add(bf16* x, const bf16* y) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;   // the grid covers the hidden size exactly
    x[i] = f2bf(bf2f(x[i]) + bf2f(y[i]));
}

extern "C" __global__ void silu_mul(bf16* out, const bf16* gate_up, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = bf2f(gate_up[i]), u = bf2f(gate_up[n + i]);
    out[i] = f2bf(g / (1.0f + expf(-g)) * u);
}

extern "C" __global__ void sample_top_p(const bf16* logits, int* token, int vocab, float temperature, float top_p,
                                        unsigned long rng_offset) {
    // greedy (argmax, lowest index on ties): deterministic; temperature, top_p and rng_offset kept for the signature
    __shared__ float sv[1024];
    __shared__ int si[1024];
    float best = -3.0e38f; int arg = 0x7fffffff;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float v = bf2f(logits[i]);
        if (v > best || (v == best && i < arg)) { best = v; arg = i; }
    }
    sv[threadIdx.x] = best; si[threadIdx.x] = arg; __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) {
            float b = sv[threadIdx.x + w]; int j = si[threadIdx.x + w];
            if (b > sv[threadIdx.x] || (b == sv[threadIdx.x] && j < si[threadIdx.x])) { sv[threadIdx.x] = b; si[threadIdx.x] = j; }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) token[0] = si[0];
}
"""
KERNELS = ["embedding_lookup", "rmsnorm", "gemv_bf16", "rope_apply", "kv_append", "attention_decode",
           "residual_add", "silu_mul", "sample_top_p"]


@dataclass
class Model:
    layers: int
    d: int = HIDDEN
    n_heads: int = 16
    n_kv: int = 4
    head_dim: int = 64
    ffn: int = 2816
    vocab: int = 16000
    max_seq: int = 2048

    @property
    def qkv_rows(self) -> int:
        return (self.n_heads + 2 * self.n_kv) * self.head_dim


def weight_offsets(m: Model) -> tuple[dict[str, int], int]:
    """Element offsets of every weight inside the one allocation (256-byte aligned)."""
    o, off = {}, 0

    def add(key, nelem):
        nonlocal off
        o[key] = off
        off += -(-nelem // 128) * 128
    add("embed", m.vocab * m.d)
    for l in range(m.layers):
        add(f"{l}.attn_norm", m.d)
        add(f"{l}.wqkv", m.qkv_rows * m.d)
        add(f"{l}.wo", m.d * m.d)
        add(f"{l}.ffn_norm", m.d)
        add(f"{l}.wgu", 2 * m.ffn * m.d)
        add(f"{l}.wdown", m.d * m.ffn)
    add("final_norm", m.d)
    add("lm_head", m.vocab * m.d)
    return o, off


def plan(scale: float) -> tuple[Model, int]:
    m = Model(layers=max(2, int(round(4 * scale))))
    _, nw = weight_offsets(m)
    kv = 2 * m.layers * m.n_kv * m.max_seq * m.head_dim
    scratch = m.d * 4 + m.qkv_rows + 2 * m.ffn * 2 + m.vocab
    return m, 2 * (nw + kv + scratch) + 4 * m.max_seq * m.head_dim + 16384


def main(argv=None) -> None:
    a = parse_args("llm_decode", __doc__.splitlines()[0], argv)
    m, nbytes = plan(a.scale)
    g = Gpu("llm_decode", nbytes)
    K = g.module(CODE, KERNELS)
    rng = np.random.default_rng(a.seed)
    o, nw = weight_offsets(m)
    d, hd = m.d, m.head_dim
    # weights: small random values (norm weights 1); filled in slices to keep host memory low
    W = g.empty(nw, np.uint16)
    chunk = 1 << 24
    for s in range(0, nw, chunk):
        e = min(nw, s + chunk)
        W[s:e].set(to_bf16(rng.standard_normal(e - s).astype(np.float32) * np.float32(0.02)))
    for key in [f"{l}.attn_norm" for l in range(m.layers)] + [f"{l}.ffn_norm" for l in range(m.layers)] + ["final_norm"]:
        W[o[key]:o[key] + d].set(to_bf16(np.ones(d, np.float32)))
    per = m.n_kv * m.max_seq * hd
    KV = g.array(to_bf16(rng.standard_normal(2 * m.layers * per).astype(np.float32) * np.float32(0.5)))
    inv = 1.0 / (10000.0 ** (np.arange(hd // 2) * 2.0 / hd))
    ang = np.arange(m.max_seq)[:, None] * inv[None, :]
    rope = g.array(np.concatenate([np.cos(ang), np.sin(ang)], axis=1).astype(np.float32).reshape(-1))
    f = m.ffn
    x, h = g.empty(d, np.uint16), g.empty(d, np.uint16)
    qkv = g.empty(m.qkv_rows, np.uint16)
    att = g.empty(max(d, f), np.uint16)
    ff = g.empty(2 * f, np.uint16)
    logits = g.empty(m.vocab, np.uint16)
    tok = g.array(np.array([int(rng.integers(0, m.vocab))] + [0] * 1023, np.int32))
    attn_smem = 4 * (m.max_seq + 128)

    def gemv(key, rows, cols, src, dst):
        g.launch(K["gemv_bf16"], (cdiv(rows, 4),), (128,), (W[o[key]:], src, dst, i32(rows), i32(cols)))

    def norm(key):
        g.launch(K["rmsnorm"], (1,), (1024,), (h, x, W[o[key]:], f32(1e-5)))

    def step(pos: int, seq: int) -> None:
        g.launch(K["embedding_lookup"], (d // 256,), (256,), (x, W[o["embed"]:], tok, i32(d)))
        for l in range(m.layers):
            norm(f"{l}.attn_norm")
            gemv(f"{l}.wqkv", m.qkv_rows, d, h, qkv)
            nh = m.n_heads + m.n_kv
            g.launch(K["rope_apply"], (nh,), (hd // 2,), (qkv, rope[pos * hd:], i32(pos), i32(nh), i32(hd), f32(10000.0)))
            kvk, kvv = KV[2 * l * per:], KV[(2 * l + 1) * per:]
            g.launch(K["kv_append"], (m.n_kv,), (hd,),
                     (kvk, kvv, qkv[m.n_heads * hd:], i32(pos), i32(m.max_seq), i32(m.n_kv), i32(hd)))
            g.launch(K["attention_decode"], (m.n_heads,), (128,),
                     (att, qkv, kvk, kvv, i32(pos), i32(m.max_seq), i32(m.n_heads), i32(m.n_kv), i32(hd),
                      f32(hd ** -0.5)), shared_mem=attn_smem)
            gemv(f"{l}.wo", d, d, att, h)
            g.launch(K["residual_add"], (d // 256,), (256,), (x, h))
            norm(f"{l}.ffn_norm")
            gemv(f"{l}.wgu", 2 * f, d, h, ff)
            g.launch(K["silu_mul"], (cdiv(f, 256),), (256,), (att, ff, i32(f)))
            gemv(f"{l}.wdown", d, f, att, h)
            g.launch(K["residual_add"], (d // 256,), (256,), (x, h))
        norm("final_norm")
        gemv("lm_head", m.vocab, d, h, logits)
        g.launch(K["sample_top_p"], (1,), (1024,),
                 (logits, tok, i32(m.vocab), f32(0.7), f32(0.9), np.uint64(seq * 4)))

    tokens, seq = [], 0
    for _ in range(2):  # two requests, each resuming a cached context and generating 6 tokens
        p0 = int(rng.integers(16, m.max_seq - 8))
        for pos in range(p0, p0 + 6):
            step(pos, seq)
            seq += 1
        tokens.append(int(tok[:1].get()[0]))
    g.done(f"{m.layers} layers, {seq} tokens decoded, last tokens {tokens}")


if __name__ == "__main__":
    main()
