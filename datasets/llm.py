"""LLM workload models: llm-decode, llm-prefill-decode, moe-decode (bf16, Llama-style blocks)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .engine import READWRITE, WRITE, Builder, Buffer, Kernel, Range, Ranges, Strided, scaled
from .scientific import size_factor
from .workload import workload

BF = "__nv_bfloat16"
HIDDEN = 1024          # the model's hidden size: a compile-time constant of its norm kernels


def _k(name, params, classes, **kw) -> Kernel:
    return Kernel(name, params, classes, flops_kind="bf16", **kw)


# decode kernels
K_EMBED = _k("embedding_lookup", [("out", f"{BF}*"), ("table", f"const {BF}*"), ("token", "const int*"),
                                  ("dim", "int")], {"out": "linear", "table": "indexed", "token": "fixed"})
K_RMSNORM = _k("rmsnorm", [("out", f"{BF}*"), ("x", f"const {BF}*"), ("weight", f"const {BF}*"), ("eps", "float")],
               {"out": "fixed", "x": "fixed", "weight": "fixed"}, template_ints=[HIDDEN])
K_GEMV = _k("gemv_bf16", [("W", f"const {BF}*"), ("x", f"const {BF}*"), ("y", f"{BF}*"), ("rows", "int"),
                          ("cols", "int")], {"W": "linear", "x": "linear", "y": "linear"})
K_ROPE = _k("rope_apply", [("qk", f"{BF}*"), ("cos_sin", "const float*"), ("pos", "int"), ("n_heads", "int"),
                           ("head_dim", "int"), ("theta", "float")],
            {"qk": "linear", "cos_sin": "linear"})
K_KV_APPEND = _k("kv_append", [("k_cache", f"{BF}*"), ("v_cache", f"{BF}*"), ("kv", f"const {BF}*"),
                               ("pos", "int"), ("max_seq", "int"), ("n_kv_heads", "int"), ("head_dim", "int")],
                 {"k_cache": "strided", "v_cache": "strided", "kv": "linear"})
K_ATTN = _k("attention_decode", [("out", f"{BF}*"), ("q", f"const {BF}*"), ("k_cache", f"const {BF}*"),
                                 ("v_cache", f"const {BF}*"), ("pos", "int"), ("max_seq", "int"),
                                 ("n_heads", "int"), ("n_kv_heads", "int"), ("head_dim", "int"),
                                 ("softmax_scale", "float")],
            {"out": "linear", "q": "linear", "k_cache": "strided", "v_cache": "strided"})
K_ADD = _k("residual_add", [("x", f"{BF}*"), ("y", f"const {BF}*")], {"x": "linear", "y": "linear"})
K_SILU = _k("silu_mul", [("out", f"{BF}*"), ("gate_up", f"const {BF}*"), ("n", "int")],
            {"out": "linear", "gate_up": "linear"})
K_SAMPLE = _k("sample_top_p", [("logits", f"const {BF}*"), ("token", "int*"), ("vocab", "int"),
                               ("temperature", "float"), ("top_p", "float"), ("rng_offset", "unsigned long")],
              {"logits": "linear", "token": "fixed"})
DECODE_KERNELS = [K_EMBED, K_RMSNORM, K_GEMV, K_ROPE, K_KV_APPEND, K_ATTN, K_ADD, K_SILU, K_SAMPLE]

# prefill kernels (a prompt of `rows` tokens at once)
K_EMBED_ROWS = _k("embedding_lookup_rows", [("out", f"{BF}*"), ("table", f"const {BF}*"),
                                            ("tokens", "const int*"), ("rows", "int"), ("dim", "int")],
                  {"out": "linear", "table": "indexed", "tokens": "linear"})
K_RMSNORM_ROWS = _k("rmsnorm_rows", [("out", f"{BF}*"), ("x", f"const {BF}*"), ("weight", f"const {BF}*"),
                                     ("eps", "float"), ("rows", "int")],
                    {"out": "linear", "x": "linear", "weight": "fixed"}, template_ints=[HIDDEN])
K_GEMM = _k("gemm_bf16_tn", [("M", "int"), ("N", "int"), ("K", "int"), ("A", f"const {BF}*"),
                             ("B", f"const {BF}*"), ("C", f"{BF}*")], {"A": "linear", "B": "linear", "C": "linear"})
K_ROPE_ROWS = _k("rope_apply_rows", [("qkv", f"{BF}*"), ("cos_sin", "const float*"), ("rows", "int"),
                                     ("n_heads", "int"), ("head_dim", "int"), ("theta", "float")],
                 {"qkv": "linear", "cos_sin": "linear"})
K_KV_WRITE = _k("kv_write_prompt", [("k_cache", f"{BF}*"), ("v_cache", f"{BF}*"), ("qkv", f"const {BF}*"),
                                    ("rows", "int"), ("max_seq", "int"), ("n_kv_heads", "int"), ("head_dim", "int")],
                {"k_cache": "strided", "v_cache": "strided", "qkv": "linear"})
K_ATTN_PREFILL = _k("attention_prefill_causal", [("out", f"{BF}*"), ("qkv", f"const {BF}*"),
                                                  ("k_cache", f"const {BF}*"), ("v_cache", f"const {BF}*"),
                                                  ("scores", "float*"), ("rows", "int"), ("max_seq", "int"),
                                                  ("n_heads", "int"), ("n_kv_heads", "int"), ("head_dim", "int"),
                                                  ("softmax_scale", "float")],
                    {"out": "linear", "qkv": "linear", "k_cache": "strided", "v_cache": "strided",
                     "scores": "linear"})
K_ADD_ROWS = _k("residual_add_rows", [("x", f"{BF}*"), ("y", f"const {BF}*"), ("n", "long")],
                {"x": "linear", "y": "linear"})
PREFILL_KERNELS = [K_EMBED_ROWS, K_RMSNORM_ROWS, K_GEMM, K_ROPE_ROWS, K_KV_WRITE, K_ATTN_PREFILL, K_ADD_ROWS,
                   K_SILU]

# mixture of experts
K_ROUTER_TOPK = _k("moe_router_topk", [("logits", f"const {BF}*"), ("expert_ids", "int*"),
                                       ("expert_weights", "float*"), ("n_experts", "int"), ("k", "int")],
                   {"logits": "linear", "expert_ids": "linear", "expert_weights": "linear"})
K_MOE_FFN = _k("moe_expert_ffn", [("y", f"{BF}*"), ("x", f"const {BF}*"), ("experts", f"const {BF}*"),
                                  ("expert_ids", "const int*"), ("expert_weights", "const float*"), ("k", "int"),
                                  ("dim", "int"), ("ffn_dim", "int")],
               {"y": "linear", "x": "linear", "experts": "indexed", "expert_ids": "linear",
                "expert_weights": "linear"})
MOE_KERNELS = [K_ROUTER_TOPK, K_MOE_FFN]


@dataclass
class Model:
    d: int = HIDDEN
    n_heads: int = 16
    n_kv: int = 4
    head_dim: int = 64
    ffn: int = 2816
    vocab: int = 16000
    layers: int = 8
    max_seq: int = 2048
    experts: int = 0        # > 0: MoE FFN with this many experts
    top_k: int = 2
    expert_ffn: int = 512

    @property
    def qkv_rows(self) -> int:
        return (self.n_heads + 2 * self.n_kv) * self.head_dim


class Weights:
    """All weights in one allocation: per-layer pointers are offsets inside it."""

    def __init__(self, b: Builder, m: Model) -> None:
        off = 0
        self.o: dict[str, int] = {}

        def add(key, nelem):
            nonlocal off
            self.o[key] = off
            off += -(-2 * nelem // 256) * 256
        add("embed", m.vocab * m.d)
        for l in range(m.layers):
            add(f"{l}.attn_norm", m.d)
            add(f"{l}.wqkv", m.qkv_rows * m.d)
            add(f"{l}.wo", m.d * m.d)
            add(f"{l}.ffn_norm", m.d)
            if m.experts:
                add(f"{l}.router", m.experts * m.d)
            else:
                add(f"{l}.wgu", 2 * m.ffn * m.d)
                add(f"{l}.wdown", m.d * m.ffn)
        add("final_norm", m.d)
        add("lm_head", m.vocab * m.d)
        self.buf = b.malloc(off, "weights")
        self.experts = None
        if m.experts:
            # [layer][expert] -> (gate_up 2f x d, down d x f), one allocation
            self.expert_bytes = 2 * 3 * m.expert_ffn * m.d
            self.experts = b.malloc(m.layers * m.experts * self.expert_bytes, "experts")


class KV:
    """The KV cache of every layer in one pool, per layer [n_kv_heads, max_seq, head_dim] for K and V."""

    def __init__(self, b: Builder, m: Model) -> None:
        self.per = m.n_kv * m.max_seq * m.head_dim * 2
        self.buf = b.malloc(2 * m.layers * self.per, "kv_cache")

    def k(self, l: int) -> int:
        return 2 * l * self.per

    def v(self, l: int) -> int:
        return (2 * l + 1) * self.per


def _decode(b: Builder, m: Model, w: Weights, kv: KV, scratch: dict[str, Buffer], rope: Buffer,
            pos: np.ndarray, tokens: np.ndarray, route: np.ndarray | None = None) -> None:
    """Decode steps at positions `pos` (one token each), vectorized over steps."""
    steps = len(pos)
    if steps == 0:
        return
    d, hd = m.d, m.head_dim
    x, h, qkv, att, ff, logits, tok = (scratch[k] for k in ("x", "h", "qkv", "att", "ff", "logits", "token"))
    W = w.buf
    ops: list[tuple] = [("embed",)]
    for l in range(m.layers):
        ops += [("norm", f"{l}.attn_norm"), ("gemv", f"{l}.wqkv", m.qkv_rows, d, h, qkv), ("rope",), ("kv", l),
                ("attn", l), ("gemv", f"{l}.wo", d, d, att, h), ("add",), ("norm", f"{l}.ffn_norm")]
        if m.experts:
            ops += [("gemv", f"{l}.router", m.experts, d, h, ff), ("topk",), ("moe", l), ("add",)]
        else:
            ops += [("gemv", f"{l}.wgu", 2 * m.ffn, d, h, ff), ("silu",), ("gemv", f"{l}.wdown", d, m.ffn, att, h),
                    ("add",)]
    ops += [("norm", "final_norm"), ("gemv", "lm_head", m.vocab, d, h, logits), ("sample",)]
    base = b.reserve(steps * len(ops))
    st = np.arange(steps, dtype=np.int64)
    n_pos = pos + 1
    for i, op in enumerate(ops):
        ids = base + st * len(ops) + i
        kind = op[0]
        if kind == "embed":
            b.launch(K_EMBED, ids, {"out": x.ptr(), "table": W.ptr(w.o["embed"]), "token": tok.ptr(), "dim": d},
                     grid=(d // 256,), touches=[Range(W, w.o["embed"] + tokens * 2 * d, 2 * d), Range(tok, 0, 4),
                                                Range(x, 0, 2 * d, WRITE)])
            b.values(K_EMBED, "token", ids, tok.ptr(), tokens.astype("<i4")[:, None])
        elif kind == "norm":
            o = w.o[op[1]]
            b.launch(K_RMSNORM, ids, {"out": h.ptr(), "x": x.ptr(), "weight": W.ptr(o), "eps": 1e-5},
                     grid=(1,), block=(1024,), flops=4 * d,
                     touches=[Range(x, 0, 2 * d), Range(W, o, 2 * d), Range(h, 0, 2 * d, WRITE)])
        elif kind == "gemv":
            _, key, rows, cols, src, dst = op
            o = w.o[key]
            b.launch(K_GEMV, ids, {"W": W.ptr(o), "x": src.ptr(), "y": dst.ptr(), "rows": rows, "cols": cols},
                     grid=(-(-rows // 4),), block=(128,), flops=2 * rows * cols,
                     touches=[Range(W, o, 2 * rows * cols), Range(src, 0, 2 * cols), Range(dst, 0, 2 * rows, WRITE)])
        elif kind == "rope":
            nh = m.n_heads + m.n_kv
            b.launch(K_ROPE, ids, {"qk": qkv.ptr(), "cos_sin": rope.ptr(pos * hd * 4), "pos": pos, "n_heads": nh,
                                   "head_dim": hd, "theta": 10000.0},
                     grid=(nh,), block=(hd // 2,), flops=6 * nh * hd,
                     touches=[Range(qkv, 0, 2 * nh * hd, READWRITE), Range(rope, pos * hd * 4, hd * 4)])
        elif kind == "kv":
            l = op[1]
            kvoff = 2 * m.n_heads * hd
            b.launch(K_KV_APPEND, ids, {"k_cache": kv.buf.ptr(kv.k(l)), "v_cache": kv.buf.ptr(kv.v(l)),
                                        "kv": qkv.ptr(kvoff), "pos": pos, "max_seq": m.max_seq,
                                        "n_kv_heads": m.n_kv, "head_dim": hd},
                     grid=(m.n_kv,), block=(hd,),
                     touches=[Strided(kv.buf, kv.k(l) + pos * hd * 2, hd * 2, m.max_seq * hd * 2, m.n_kv, WRITE),
                              Strided(kv.buf, kv.v(l) + pos * hd * 2, hd * 2, m.max_seq * hd * 2, m.n_kv, WRITE),
                              Range(qkv, kvoff, 2 * 2 * m.n_kv * hd)])
        elif kind == "attn":
            l = op[1]
            b.launch(K_ATTN, ids, {"out": att.ptr(), "q": qkv.ptr(), "k_cache": kv.buf.ptr(kv.k(l)),
                                   "v_cache": kv.buf.ptr(kv.v(l)), "pos": pos, "max_seq": m.max_seq,
                                   "n_heads": m.n_heads, "n_kv_heads": m.n_kv, "head_dim": hd,
                                   "softmax_scale": 0.125},
                     grid=(m.n_heads,), block=(128,), flops=4 * m.n_heads * hd * n_pos,
                     touches=[Range(qkv, 0, 2 * m.n_heads * hd),
                              Strided(kv.buf, kv.k(l), n_pos * hd * 2, m.max_seq * hd * 2, m.n_kv),
                              Strided(kv.buf, kv.v(l), n_pos * hd * 2, m.max_seq * hd * 2, m.n_kv),
                              Range(att, 0, 2 * m.n_heads * hd, WRITE)])
        elif kind == "add":
            # d / 256 blocks of 256 threads: the footprint follows the grid
            b.launch(K_ADD, ids, {"x": x.ptr(), "y": h.ptr()}, grid=(d // 256,), block=(256,), flops=d,
                     touches=[Range(x, 0, 2 * d, READWRITE), Range(h, 0, 2 * d)])
        elif kind == "silu":
            f = m.ffn
            b.launch(K_SILU, ids, {"out": att.ptr(), "gate_up": ff.ptr(), "n": f}, grid=(-(-f // 256),),
                     flops=4 * f, touches=[Range(ff, 0, 4 * f), Range(att, 0, 2 * f, WRITE)])
        elif kind == "topk":
            E, k = m.experts, m.top_k
            r = scratch["route"]
            b.launch(K_ROUTER_TOPK, ids, {"logits": ff.ptr(), "expert_ids": r.ptr(), "expert_weights": r.ptr(64),
                                          "n_experts": E, "k": k}, grid=(1,), block=(32,), flops=4 * E,
                     touches=[Range(ff, 0, 2 * E), Range(r, 0, 4 * k, WRITE), Range(r, 64, 4 * k, WRITE)])
        elif kind == "moe":
            l = op[1]
            r = scratch["route"]
            k = m.top_k
            # the experts the router chose for this token (data-dependent)
            chosen = route[:, l, :]                      # (steps, k)
            which = np.repeat(np.arange(steps), k)
            eoff = (l * m.experts + chosen.reshape(-1)) * w.expert_bytes
            b.launch(K_MOE_FFN, ids, {"y": h.ptr(), "x": h.ptr(), "experts": w.experts.ptr(l * m.experts * w.expert_bytes),
                                      "expert_ids": r.ptr(), "expert_weights": r.ptr(64), "k": k, "dim": d,
                                      "ffn_dim": m.expert_ffn},
                     grid=(k, -(-m.expert_ffn // 64)), block=(256,), flops=2 * k * 3 * m.expert_ffn * d,
                     touches=[Range(h, 0, 2 * d, READWRITE), Range(r, 0, 4 * k), Range(r, 64, 4 * k),
                              Ranges(w.experts, which, eoff, w.expert_bytes)])
            b.values(K_MOE_FFN, "expert_ids", ids, r.ptr(), chosen.astype("<i4"))
        elif kind == "sample":
            b.launch(K_SAMPLE, ids, {"logits": logits.ptr(), "token": tok.ptr(), "vocab": m.vocab,
                                     "temperature": 0.7, "top_p": 0.9, "rng_offset": (ids * 4).astype(np.uint64)},
                     grid=(1,), block=(1024,), flops=5 * m.vocab,
                     touches=[Range(logits, 0, 2 * m.vocab), Range(tok, 0, 4, WRITE)])


def _decode_scratch(b: Builder, m: Model) -> dict[str, Buffer]:
    f = max(m.ffn, m.expert_ffn, m.experts)
    return {"x": b.malloc(2 * m.d, "x"), "h": b.malloc(2 * m.d, "h"), "qkv": b.malloc(2 * m.qkv_rows, "qkv"),
            "att": b.malloc(2 * max(m.d, f), "att"), "ff": b.malloc(4 * f, "ff"),
            "logits": b.malloc(2 * m.vocab, "logits"), "token": b.malloc(4096, "token"),
            "route": b.malloc(4096, "route")}


def _model(b: Builder, **kw) -> Model:
    sf = size_factor(b.scale)
    return Model(layers=max(2, int(round(8 * sf))), max_seq=scaled(2048 * sf, 1, multiple=256), **kw)


def _tokens(rng: np.random.Generator, n: int, vocab: int) -> np.ndarray:
    # Zipf-like token ids, as text has
    return np.minimum(rng.zipf(1.3, n) - 1, vocab - 1).astype(np.int64)


def _rope_table(b: Builder, m: Model) -> Buffer:
    return b.malloc(m.max_seq * m.head_dim * 4, "rope_cos_sin")


# ---------------------------------------------------------------------------

def build_llm_decode(b: Builder) -> None:
    rng, s = b.rng, b.scale
    m = _model(b)
    w, kv, rope = Weights(b, m), KV(b, m), _rope_table(b, m)
    scratch = _decode_scratch(b, m)
    per_step = 12 * m.layers + 4
    total = max(1, round(10_000 * s / per_step))
    # requests, each resuming a cached context at a random position and generating some tokens
    while total > 0:
        g = int(min(total, rng.integers(16, 129)))
        p0 = int(rng.integers(16, m.max_seq - g))
        _decode(b, m, w, kv, scratch, rope, np.arange(p0, p0 + g), _tokens(rng, g, m.vocab))
        total -= g


def _prefill(b: Builder, m: Model, w: Weights, kv: KV, rope: Buffer, P: int) -> None:
    """One prompt of P tokens: temporaries allocated, used by one launch per op, and freed."""
    d, hd, W = m.d, m.head_dim, w.buf
    tokens = b.malloc(4 * P, "prompt_tokens")
    x, h = b.malloc(2 * P * d, "prefill_x"), b.malloc(2 * P * d, "prefill_h")
    qkv = b.malloc(2 * P * m.qkv_rows, "prefill_qkv")
    att = b.malloc(2 * P * max(d, m.ffn), "prefill_att")
    ff = b.malloc(2 * P * 2 * m.ffn, "prefill_ff")
    scores = b.malloc(4 * m.n_heads * P * P, "prefill_scores")
    rng = b.rng
    tok = _tokens(rng, P, m.vocab)

    def one(kernel, args, grid, block=(256,), flops=0, touches=()):
        b.launch(kernel, b.reserve(1), args, grid=grid, block=block, flops=flops, touches=touches)

    def gemm(key, N, K, A, C):
        o = w.o[key]
        one(K_GEMM, {"M": P, "N": N, "K": K, "A": A.ptr(), "B": W.ptr(o), "C": C.ptr()},
            grid=(-(-N // 128), -(-P // 128)), flops=2 * P * N * K,
            touches=[Range(A, 0, 2 * P * K), Range(W, o, 2 * N * K), Range(C, 0, 2 * P * N, WRITE)])

    def norm(key):
        o = w.o[key]
        one(K_RMSNORM_ROWS, {"out": h.ptr(), "x": x.ptr(), "weight": W.ptr(o), "eps": 1e-5, "rows": P},
            grid=(P,), block=(1024,), flops=4 * P * d,
            touches=[Range(x, 0, 2 * P * d), Range(W, o, 2 * d), Range(h, 0, 2 * P * d, WRITE)])

    def add():
        one(K_ADD_ROWS, {"x": x.ptr(), "y": h.ptr(), "n": P * d}, grid=(-(-P * d // 1024),), flops=P * d,
            touches=[Range(x, 0, 2 * P * d, READWRITE), Range(h, 0, 2 * P * d)])

    one(K_EMBED_ROWS, {"out": x.ptr(), "table": W.ptr(w.o["embed"]), "tokens": tokens.ptr(), "rows": P, "dim": d},
        grid=(P,), touches=[Ranges(W, np.zeros(P, np.int64), w.o["embed"] + tok * 2 * d, 2 * d),
                            Range(tokens, 0, 4 * P), Range(x, 0, 2 * P * d, WRITE)])
    b.values(K_EMBED_ROWS, "tokens", b.cursor - 1, tokens.ptr(), [tok.astype("<i4")])
    nh = m.n_heads + m.n_kv
    for l in range(m.layers):
        norm(f"{l}.attn_norm")
        gemm(f"{l}.wqkv", m.qkv_rows, d, h, qkv)
        one(K_ROPE_ROWS, {"qkv": qkv.ptr(), "cos_sin": rope.ptr(), "rows": P, "n_heads": nh, "head_dim": hd,
                          "theta": 10000.0}, grid=(P, nh), block=(hd // 2,), flops=6 * P * nh * hd,
            touches=[Range(qkv, 0, 2 * P * m.qkv_rows, READWRITE), Range(rope, 0, P * hd * 4)])
        one(K_KV_WRITE, {"k_cache": kv.buf.ptr(kv.k(l)), "v_cache": kv.buf.ptr(kv.v(l)), "qkv": qkv.ptr(), "rows": P,
                         "max_seq": m.max_seq, "n_kv_heads": m.n_kv, "head_dim": hd}, grid=(P, m.n_kv), block=(hd,),
            touches=[Strided(kv.buf, kv.k(l), P * hd * 2, m.max_seq * hd * 2, m.n_kv, WRITE),
                     Strided(kv.buf, kv.v(l), P * hd * 2, m.max_seq * hd * 2, m.n_kv, WRITE),
                     Range(qkv, 0, 2 * P * m.qkv_rows)])
        one(K_ATTN_PREFILL, {"out": att.ptr(), "qkv": qkv.ptr(), "k_cache": kv.buf.ptr(kv.k(l)),
                             "v_cache": kv.buf.ptr(kv.v(l)), "scores": scores.ptr(), "rows": P, "max_seq": m.max_seq,
                             "n_heads": m.n_heads, "n_kv_heads": m.n_kv, "head_dim": hd, "softmax_scale": 0.125},
            grid=(-(-P // 64), m.n_heads), block=(128,), flops=4 * m.n_heads * hd * P * P,
            touches=[Range(qkv, 0, 2 * P * m.qkv_rows),
                     Strided(kv.buf, kv.k(l), P * hd * 2, m.max_seq * hd * 2, m.n_kv),
                     Strided(kv.buf, kv.v(l), P * hd * 2, m.max_seq * hd * 2, m.n_kv),
                     Range(scores, 0, 4 * m.n_heads * P * P, READWRITE), Range(att, 0, 2 * P * d, WRITE)])
        gemm(f"{l}.wo", d, d, att, h)
        add()
        norm(f"{l}.ffn_norm")
        gemm(f"{l}.wgu", 2 * m.ffn, d, h, ff)
        one(K_SILU, {"out": att.ptr(), "gate_up": ff.ptr(), "n": P * m.ffn}, grid=(-(-P * m.ffn // 256),),
            flops=4 * P * m.ffn, touches=[Range(ff, 0, 4 * P * m.ffn), Range(att, 0, 2 * P * m.ffn, WRITE)])
        gemm(f"{l}.wdown", d, m.ffn, att, h)
        add()
    for buf in (tokens, x, h, qkv, att, ff, scores):
        b.free(buf)


def build_llm_prefill_decode(b: Builder) -> None:
    rng, s = b.rng, b.scale
    m = _model(b)
    w, kv, rope = Weights(b, m), KV(b, m), _rope_table(b, m)
    per_step = 12 * m.layers + 4
    total = max(1, round(10_000 * s))
    while total > 0:
        P = int(rng.integers(32, m.max_seq // 4))
        G = int(min(max(1, (total - 12 * m.layers) // per_step), rng.integers(8, 33)))
        _prefill(b, m, w, kv, rope, P)
        # decode buffers are allocated after the prompt's temporaries are freed: same addresses
        scratch = _decode_scratch(b, m)
        _decode(b, m, w, kv, scratch, rope, np.arange(P, P + G), _tokens(rng, G, m.vocab))
        for buf in scratch.values():
            b.free(buf)
        total -= 12 * m.layers + 1 + G * per_step


def build_moe_decode(b: Builder) -> None:
    rng, s = b.rng, b.scale
    m = _model(b, experts=int(rng.choice([8, 16, 32])), top_k=2)
    w, kv, rope = Weights(b, m), KV(b, m), _rope_table(b, m)
    scratch = _decode_scratch(b, m)
    per_step = 12 * m.layers + 4
    total = max(1, round(10_000 * s / per_step))
    # each layer's router prefers some experts (skewed, Dirichlet(0.4)); tokens are routed independently
    pref = rng.dirichlet(np.full(m.experts, 0.4), m.layers)
    while total > 0:
        g = int(min(total, rng.integers(16, 129)))
        p0 = int(rng.integers(16, m.max_seq - g))
        route = np.empty((g, m.layers, m.top_k), np.int64)
        for l in range(m.layers):
            # top-k without replacement: Gumbel trick over the layer's preferences, per token
            gum = np.log(pref[l])[None] - np.log(-np.log(rng.random((g, m.experts))))
            route[:, l, :] = np.argsort(-gum, axis=1)[:, :m.top_k]
        _decode(b, m, w, kv, scratch, rope, np.arange(p0, p0 + g), _tokens(rng, g, m.vocab), route)
        total -= g


_LLM = ("Llama-style bf16 decoder, hidden 1024 (rmsnorm<1024> is a template: fixed), 16 query / 4 KV "
        "heads of 64, all weights in one allocation (per-layer pointers inside it), KV cache pool "
        "[layer][K|V][kv_head][max_seq][64]: attention reads n_kv_heads chunks of (pos+1)*head_dim*2 bytes "
        "every max_seq*head_dim*2 (strided, linear in the pos argument) and kv_append writes one slot per "
        "head (strided); embedding rows follow the token id in device memory (indexed: the trace records the id); GEMVs are linear in "
        "rows*cols; residual_add's footprint follows the grid; sampling takes floats beside an 8-byte "
        "rng offset.")

# regions whose size never changes in decode (hidden size, heads and vocabulary are the model's)
_DECODE_CONSTANT = {"residual_add": ("x", "y"), "sample_top_p": ("logits",), "embedding_lookup": ("out",),
                       "rope_apply": ("qk",), "kv_append": ("kv",), "attention_decode": ("out", "q")}

WORKLOADS = [
    workload("llm-decode", "llm",
             "Token-by-token decode of requests resuming cached contexts. " + _LLM
             + " Templates: fixed, linear, strided, indexed.",
             build_llm_decode, DECODE_KERNELS,
             constant={**_DECODE_CONSTANT, "silu_mul": ("out", "gate_up")},
             summary="LLM decode: per-layer weights in one allocation, growing KV cache"),
    workload("llm-prefill-decode", "llm",
             "Requests with a prompt prefill (GEMMs with M = prompt length, causal attention with an "
             "n_heads*P*P score buffer, KV writes of P slots per head), then decode. Prefill temporaries are "
             "freed after each prompt and their addresses reused by the decode buffers and the next prompt. "
             + _LLM + " Templates: fixed, linear, strided, indexed.",
             build_llm_prefill_decode, DECODE_KERNELS + PREFILL_KERNELS, constant=_DECODE_CONSTANT,
             summary="LLM prompt prefill then decode; prompt temporaries freed and reused"),
    workload("moe-decode", "llm",
             "Decode through a mixture-of-experts model (8, 16 or 32 experts per layer, top-2): a router GEMV, "
             "a top-k kernel, and an expert FFN that reads the weights of the experts the router chose for "
             "the token (data-dependent, skewed per layer: indexed by the router's expert ids). " + _LLM
             + " Templates: fixed, linear, strided, indexed.",
             build_moe_decode, [k for k in DECODE_KERNELS if k is not K_SILU] + MOE_KERNELS,
             constant={**_DECODE_CONSTANT, "moe_router_topk": ("logits", "expert_ids", "expert_weights"),
                       "moe_expert_ffn": ("y", "x", "expert_ids", "expert_weights")},
             summary="mixture-of-experts decode: router-chosen experts (indexed)"),
]
