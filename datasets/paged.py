"""The paged-attention workload model: llm-paged-decode (continuous batching over a paged KV cache).

As vLLM serves (docs/workloads.md, "llm-paged-decode", has the sources): the KV cache is a pool
of fixed-size blocks (16 tokens), shared by the running sequences; each sequence owns a block
table (the ids of its blocks, in token order); a scheduler admits waiting requests when blocks
are free, gives a sequence a new block when its length crosses a block boundary, preempts the
youngest sequence when none is free (its blocks freed; it comes back later and recomputes its
tokens), and frees a finished sequence's blocks, which later sequences reuse.

Each step runs one batch (the running sequences' next tokens, plus at most one admitted prompt),
launch by launch:

- `copy_step_inputs` copies the step's inputs, prepared by the host in a staging buffer, into
  the device's input buffer (the prefix that holds them: every section but the last whole) (token ids, positions, slot mapping, the batch's block tables,
  their row pointers, sequence lengths, query starts, the rows to sample): the writer of every
  index value the step's kernels read;
- embedding rows by token id, rotary embedding by position (cos/sin cache rows), the KV write
  of each token at its slot (`reshape_and_cache`: slot = block * 16 + position % 16), paged
  attention reading, for each sequence, the whole blocks of its table up to its length, the
  rows of each sequence's last token gathered for the LM head: indexed by the values the trace
  records (the `values` table);
- RMSNorm, GEMMs with M = the batch's tokens, SiLU, residual adds, sampling: footprints the
  arguments determine.

The block tables are stored as vLLM's FlashInfer backend passes them (and FlashInfer's
paged_kv_indices / paged_kv_indptr): the tables of the batch's sequences concatenated, with row
pointers beside; the KV pool per layer is [block][token in block][kv head][head dim] (the NHD
layout of vLLM's flash-attention backend), so a block is one contiguous 8 KiB chunk per K and V
and a token's slot one contiguous 512-byte chunk.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .engine import READWRITE, WRITE, Builder, Kernel, Range, Ranges, Strided, scaled
from .llm import BF, K_ADD_ROWS, K_EMBED_ROWS, K_GEMM, K_RMSNORM_ROWS, K_SILU, Model, Weights, _tokens
from .scientific import size_factor
from .workload import workload

BLOCK_TOKENS = 16   # vLLM's default KV block size (tokens per block)
MAX_SEQS = 16       # sequences a batch holds at most (vLLM's max_num_seqs, scaled down with the model)


def _k(name, params, classes) -> Kernel:
    return Kernel(name, params, classes, flops_kind="bf16")


K_COPY_INPUTS = _k("copy_step_inputs", [("dst", "int*"), ("src", "const int*"), ("n_bytes", "long")],
                   {"dst": "linear", "src": "linear"})
K_ROPE_POS = _k("rotary_embedding_pos", [("qkv", f"{BF}*"), ("cos_sin_cache", "const float*"),
                                         ("positions", "const int*"), ("rows", "int"), ("n_heads", "int"),
                                         ("head_dim", "int")],
                {"qkv": "linear", "cos_sin_cache": "indexed", "positions": "linear"})
K_RESHAPE_CACHE = _k("reshape_and_cache", [("kv", f"const {BF}*"), ("k_cache", f"{BF}*"), ("v_cache", f"{BF}*"),
                                           ("slot_mapping", "const int*"), ("n_tokens", "int"),
                                           ("row_stride", "int"), ("n_kv_heads", "int"), ("head_dim", "int")],
                     {"kv": "strided", "k_cache": "indexed", "v_cache": "indexed", "slot_mapping": "linear"})
K_PAGED_ATTN = _k("paged_attention", [("out", f"{BF}*"), ("q", f"const {BF}*"), ("k_cache", f"const {BF}*"),
                                      ("v_cache", f"const {BF}*"), ("block_ids", "const int*"),
                                      ("block_indptr", "const int*"), ("seq_lens", "const int*"),
                                      ("query_start", "const int*"), ("n_seqs", "int"), ("n_tokens", "int"),
                                      ("n_blocks", "int"), ("block_size", "int"), ("n_heads", "int"),
                                      ("n_kv_heads", "int"), ("head_dim", "int"), ("softmax_scale", "float")],
                  {"out": "linear", "q": "linear", "k_cache": "indexed", "v_cache": "indexed",
                   "block_ids": "linear", "block_indptr": "linear", "seq_lens": "linear",
                   "query_start": "linear"})
K_GATHER_ROWS = _k("gather_rows", [("out", f"{BF}*"), ("x", f"const {BF}*"), ("indices", "const int*"),
                                   ("rows", "int"), ("dim", "int")],
                   {"out": "linear", "x": "indexed", "indices": "linear"})
K_SAMPLE_ROWS = _k("sample_top_p_rows", [("logits", f"const {BF}*"), ("tokens", "int*"), ("rows", "int"),
                                         ("vocab", "int"), ("temperature", "float"), ("top_p", "float"),
                                         ("rng_offset", "unsigned long")],
                   {"logits": "linear", "tokens": "linear"})
PAGED_KERNELS = [K_COPY_INPUTS, K_EMBED_ROWS, K_RMSNORM_ROWS, K_GEMM, K_ROPE_POS, K_RESHAPE_CACHE, K_PAGED_ATTN,
                 K_ADD_ROWS, K_SILU, K_GATHER_ROWS, K_SAMPLE_ROWS]


@dataclass
class Seq:
    prompt: int              # tokens to prefill when (re)admitted
    remaining: int           # tokens still to generate
    ctx: int = 0             # tokens in the KV cache
    blocks: list[int] = field(default_factory=list)


@dataclass
class Step:
    """One batch: what the host writes into the input buffer, per section."""

    tokens: np.ndarray       # token ids, one per batch token
    positions: np.ndarray
    slots: np.ndarray        # KV slot of each token: block * BLOCK_TOKENS + position % BLOCK_TOKENS
    block_ids: np.ndarray    # the batch's block tables, concatenated
    indptr: np.ndarray       # row pointers into block_ids (n_seqs + 1)
    seq_lens: np.ndarray     # KV length of each sequence after this step's tokens
    query_start: np.ndarray  # first batch token of each sequence (n_seqs + 1)
    last: np.ndarray         # batch row of each sequence's last token (sampled)


class Scheduler:
    """Continuous batching over a pool of `n_blocks` KV blocks (see the module doc)."""

    def __init__(self, rng: np.random.Generator, n_blocks: int, max_prompt: int, max_gen: int,
                 vocab: int) -> None:
        self.rng, self.n_blocks, self.max_prompt, self.max_gen, self.vocab = rng, n_blocks, max_prompt, max_gen, vocab
        # the free blocks, a stack as vLLM's first BlockAllocator kept them (in block order at
        # start; a freed block is the next one handed out: docs/workloads.md)
        self.free: list[int] = list(range(n_blocks - 1, -1, -1))
        self.running: list[Seq] = []
        self.waiting: deque[Seq] = deque()
        self.preempted = self.finished = self.admitted = 0
        # the run starts mid-serving: half a batch of sequences with cached contexts
        for _ in range(MAX_SEQS // 2):
            s = self._request()
            s.ctx = int(rng.integers(16, max_prompt))
            s.remaining = int(rng.integers(1, max_gen))      # part of its generation is done
            s.blocks = [self.free.pop() for _ in range(-(-s.ctx // BLOCK_TOKENS))]
            self.running.append(s)

    def _request(self) -> Seq:
        return Seq(prompt=int(self.rng.integers(16, self.max_prompt)),
                   remaining=int(self.rng.integers(2, self.max_gen)))

    def _release(self, s: Seq) -> None:
        self.free.extend(s.blocks)
        s.blocks = []

    def step(self) -> Step:
        rng = self.rng
        for _ in range(rng.poisson(0.35)):
            self.waiting.append(self._request())
        if not self.running and not self.waiting:
            self.waiting.append(self._request())
        # every running sequence needs a slot for its next token; the youngest are preempted
        # (their blocks freed, recomputed later) while the pool cannot give one
        need = sum(1 for s in self.running if s.ctx % BLOCK_TOKENS == 0)
        while need > len(self.free) and self.running:
            s = self.running.pop()
            need -= s.ctx % BLOCK_TOKENS == 0
            self._release(s)
            s.prompt, s.ctx = s.ctx, 0
            self.waiting.appendleft(s)
            self.preempted += 1
        for s in self.running:
            if s.ctx % BLOCK_TOKENS == 0:
                s.blocks.append(self.free.pop())
        batch = [(s, s.ctx, 1) for s in self.running]
        # admit one waiting prompt if the batch and the pool have room for it
        if self.waiting and len(self.running) < MAX_SEQS:
            s = self.waiting[0]
            nb = -(-s.prompt // BLOCK_TOKENS)
            if nb <= len(self.free):
                self.waiting.popleft()
                s.blocks = [self.free.pop() for _ in range(nb)]
                batch.append((s, 0, s.prompt))
                self.running.append(s)
                self.admitted += 1
        q = np.array([n for _, _, n in batch], np.int64)
        qs = np.zeros(len(batch) + 1, np.int64)
        np.cumsum(q, out=qs[1:])
        pos = np.concatenate([np.arange(c, c + n) for _, c, n in batch])
        tables = [np.asarray(s.blocks, np.int64) for s, _, _ in batch]
        slot_block = np.concatenate([tables[i][pos[qs[i]:qs[i + 1]] // BLOCK_TOKENS] for i in range(len(batch))])
        lens = np.array([len(t) for t in tables], np.int64)
        indptr = np.zeros(len(batch) + 1, np.int64)
        np.cumsum(lens, out=indptr[1:])
        st = Step(tokens=_tokens(rng, len(pos), self.vocab), positions=pos,
                  slots=slot_block * BLOCK_TOKENS + pos % BLOCK_TOKENS, block_ids=np.concatenate(tables),
                  indptr=indptr, seq_lens=np.array([c + n for _, c, n in batch], np.int64), query_start=qs,
                  last=qs[1:] - 1)
        # after the step: each sequence holds its new tokens and has sampled one
        keep = []
        for s, c, n in batch:
            s.ctx = c + n
            s.remaining -= 1
            if s.remaining <= 0:
                self._release(s)
                self.finished += 1
            else:
                keep.append(s)
        self.running = keep
        return st


SECTIONS = ("tokens", "positions", "slots", "block_ids", "indptr", "seq_lens", "query_start", "last")


class Inputs:
    """The step's input buffer (and the host's staging copy): int32 sections at fixed offsets."""

    def __init__(self, b: Builder, max_tokens: int, n_blocks: int) -> None:
        cap = {"tokens": max_tokens, "positions": max_tokens, "slots": max_tokens, "block_ids": n_blocks,
               "indptr": MAX_SEQS + 1, "seq_lens": MAX_SEQS, "query_start": MAX_SEQS + 1, "last": MAX_SEQS}
        self.off: dict[str, int] = {}
        o = 0
        for k in SECTIONS:
            self.off[k] = o
            o += -(-4 * cap[k] // 256) * 256
        self.bytes = o
        self.buf = b.malloc(o, "step_inputs")
        self.staging = b.malloc(o, "step_inputs_staging")

    def ptr(self, k: str):
        return self.buf.ptr(self.off[k])


def _chunks(buf, which: np.ndarray, index: np.ndarray, base: int, size: int, access: int = 0) -> Ranges:
    """`size` bytes at `base + size * index[i]` for launch `which[i]`, as truth ranges, runs of
    consecutive indices of one launch merged into one range (the same bytes in fewer rows: a
    sequence's blocks, a prompt's slots and positions often follow each other)."""
    o = np.lexsort((index, which))
    w, v = which[o], index[o]
    new = np.ones(len(v), bool)
    new[1:] = (w[1:] != w[:-1]) | (v[1:] != v[:-1] + 1)
    first = np.flatnonzero(new)
    n = np.diff(np.append(first, len(v)))
    return Ranges(buf, w[first], base + size * v[first], size * n, access)


def _cat(steps: list[Step], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(step index of each element, the elements) of one section over all steps."""
    arrs = [getattr(s, key) for s in steps]
    n = np.array([len(a) for a in arrs], np.int64)
    return np.repeat(np.arange(len(steps)), n), np.concatenate(arrs)


def build_llm_paged_decode(b: Builder) -> None:
    rng, s = b.rng, b.scale
    sf = size_factor(s)
    m = Model(layers=max(2, int(round(8 * sf))), max_seq=scaled(2048 * sf, 1, multiple=256))
    d, hd, L = m.d, m.head_dim, m.layers
    # 48 MiB of KV at scale 1 (llm-decode's pool holds 64): a full batch of long sequences
    # fills it, so that the scheduler preempts now and then
    n_blocks = scaled(384 * sf, 1, multiple=16)
    max_prompt = m.max_seq // 3
    max_gen = max(8, m.max_seq // 16)
    # a batch's tokens at most: the running sequences' next ones and one prompt, which may be a
    # preempted sequence's whole context (prompt and what it generated)
    max_tokens = max_prompt + max_gen + MAX_SEQS
    w = Weights(b, m)
    W = w.buf
    blk = BLOCK_TOKENS * m.n_kv * hd * 2                   # bytes of one block of K (or V) in one layer
    slot = m.n_kv * hd * 2                                 # bytes of one token's K (or V)
    kv = b.malloc(2 * L * n_blocks * blk, "kv_block_pool")
    rope = b.malloc(m.max_seq * hd * 4, "rope_cos_sin_cache")
    inp = Inputs(b, max_tokens, n_blocks)
    f = m.ffn
    x, h = b.malloc(2 * max_tokens * d, "x"), b.malloc(2 * max_tokens * d, "h")
    qkv = b.malloc(2 * max_tokens * m.qkv_rows, "qkv")
    att = b.malloc(2 * max_tokens * max(d, f), "att")
    ff = b.malloc(2 * max_tokens * 2 * f, "ff")
    hl = b.malloc(2 * MAX_SEQS * d, "last_hidden")
    logits = b.malloc(2 * MAX_SEQS * m.vocab, "logits")
    sampled = b.malloc(4 * MAX_SEQS, "sampled")

    per_step = 12 * L + 6
    n_steps = max(1, round(10_000 * s / per_step))
    sch = Scheduler(rng, n_blocks, max_prompt, max_gen, m.vocab)
    steps = [sch.step() for _ in range(n_steps)]
    T = np.array([len(st.tokens) for st in steps], np.int64)           # batch tokens
    S = np.array([len(st.seq_lens) for st in steps], np.int64)         # batch sequences
    NB = np.array([len(st.block_ids) for st in steps], np.int64)       # blocks the batch reads
    # attention work: each query token against the KV of its sequence up to its position
    att_pairs = np.array([int((st.positions + 1).sum()) for st in steps], np.int64)

    ops: list[tuple] = [("copy",), ("embed",)]
    for l in range(L):
        ops += [("norm", f"{l}.attn_norm"), ("gemm", f"{l}.wqkv", m.qkv_rows, d, h, qkv), ("rope",), ("cache", l),
                ("attn", l), ("gemm", f"{l}.wo", d, d, att, h), ("add",), ("norm", f"{l}.ffn_norm"),
                ("gemm", f"{l}.wgu", 2 * f, d, h, ff), ("silu",), ("gemm", f"{l}.wdown", d, f, att, h), ("add",)]
    ops += [("gather",), ("norm_last",), ("gemm_last",), ("sample",)]
    assert len(ops) == per_step
    base = b.reserve(n_steps * per_step)
    st_idx = np.arange(n_steps, dtype=np.int64)
    tok_step, tok = _cat(steps, "tokens")
    pos_step, pos = _cat(steps, "positions")
    slot_step, slots = _cat(steps, "slots")
    blk_step, bids = _cat(steps, "block_ids")
    last_step, last = _cat(steps, "last")

    def rows(key: str):
        return [getattr(st, key).astype("<i4") for st in steps]

    for i, op in enumerate(ops):
        ids = base + st_idx * per_step + i
        kind = op[0]
        if kind == "copy":
            # the staging buffer's prefix that holds this step's inputs: every section whole but the
            # last (the rows to sample), up to its sequences
            nb = inp.off["last"] + 4 * S
            b.launch(K_COPY_INPUTS, ids, {"dst": inp.buf.ptr(), "src": inp.staging.ptr(), "n_bytes": nb},
                     grid=(-(-nb // 1024),), block=(256,),
                     touches=[Range(inp.staging, 0, nb), Range(inp.buf, 0, nb, WRITE)])
        elif kind == "embed":
            b.launch(K_EMBED_ROWS, ids, {"out": x.ptr(), "table": W.ptr(w.o["embed"]), "tokens": inp.ptr("tokens"),
                                         "rows": T, "dim": d},
                     grid=(T,), touches=[Ranges(W, tok_step, w.o["embed"] + tok * 2 * d, 2 * d),
                                         Range(inp.buf, inp.off["tokens"], 4 * T), Range(x, 0, 2 * T * d, WRITE)])
            b.values(K_EMBED_ROWS, "tokens", ids, inp.ptr("tokens"), rows("tokens"))
        elif kind in ("norm", "norm_last"):
            o = w.o[op[1] if kind == "norm" else "final_norm"]
            src, dst, r = (x, h, T) if kind == "norm" else (hl, hl, S)
            b.launch(K_RMSNORM_ROWS, ids, {"out": dst.ptr(), "x": src.ptr(), "weight": W.ptr(o), "eps": 1e-5,
                                           "rows": r},
                     grid=(r,), block=(1024,), flops=4 * r * d,
                     touches=[Range(src, 0, 2 * r * d, READWRITE if src is dst else 0), Range(W, o, 2 * d)]
                     + ([] if src is dst else [Range(dst, 0, 2 * r * d, WRITE)]))
        elif kind in ("gemm", "gemm_last"):
            _, key, N, K, A, C = op if kind == "gemm" else (None, "lm_head", m.vocab, d, hl, logits)
            M = T if kind == "gemm" else S
            o = w.o[key]
            b.launch(K_GEMM, ids, {"M": M, "N": N, "K": K, "A": A.ptr(), "B": W.ptr(o), "C": C.ptr()},
                     grid=(-(-N // 128), -(-M // 128)), flops=2 * M * N * K,
                     touches=[Range(A, 0, 2 * M * K), Range(W, o, 2 * N * K), Range(C, 0, 2 * M * N, WRITE)])
        elif kind == "rope":
            nh = m.n_heads + m.n_kv
            b.launch(K_ROPE_POS, ids, {"qkv": qkv.ptr(), "cos_sin_cache": rope.ptr(), "positions": inp.ptr("positions"),
                                       "rows": T, "n_heads": nh, "head_dim": hd},
                     grid=(T,), block=(nh * hd // 2,), flops=6 * T * nh * hd,
                     touches=[Range(qkv, 0, 2 * T * m.qkv_rows, READWRITE), Range(inp.buf, inp.off["positions"], 4 * T),
                              _chunks(rope, pos_step, pos, 0, hd * 4)])
            b.values(K_ROPE_POS, "positions", ids, inp.ptr("positions"), rows("positions"))
        elif kind == "cache":
            kb, vb = (2 * op[1]) * n_blocks * blk, (2 * op[1] + 1) * n_blocks * blk
            kvoff = 2 * m.n_heads * hd
            b.launch(K_RESHAPE_CACHE, ids, {"kv": qkv.ptr(kvoff), "k_cache": kv.ptr(kb), "v_cache": kv.ptr(vb),
                                            "slot_mapping": inp.ptr("slots"), "n_tokens": T,
                                            "row_stride": m.qkv_rows, "n_kv_heads": m.n_kv, "head_dim": hd},
                     grid=(T,), block=(m.n_kv * hd,),
                     touches=[Strided(qkv, kvoff, 2 * slot, 2 * m.qkv_rows, T), Range(inp.buf, inp.off["slots"], 4 * T),
                              _chunks(kv, slot_step, slots, kb, slot, WRITE),
                              _chunks(kv, slot_step, slots, vb, slot, WRITE)])
            b.values(K_RESHAPE_CACHE, "slot_mapping", ids, inp.ptr("slots"), rows("slots"))
        elif kind == "attn":
            kb, vb = (2 * op[1]) * n_blocks * blk, (2 * op[1] + 1) * n_blocks * blk
            b.launch(K_PAGED_ATTN, ids, {"out": att.ptr(), "q": qkv.ptr(), "k_cache": kv.ptr(kb), "v_cache": kv.ptr(vb),
                                         "block_ids": inp.ptr("block_ids"), "block_indptr": inp.ptr("indptr"),
                                         "seq_lens": inp.ptr("seq_lens"), "query_start": inp.ptr("query_start"),
                                         "n_seqs": S, "n_tokens": T, "n_blocks": NB, "block_size": BLOCK_TOKENS,
                                         "n_heads": m.n_heads, "n_kv_heads": m.n_kv, "head_dim": hd,
                                         "softmax_scale": 0.125},
                     grid=(m.n_heads, S), block=(128,), flops=4 * m.n_heads * hd * att_pairs,
                     touches=[Range(qkv, 0, 2 * T * m.qkv_rows), Range(inp.buf, inp.off["block_ids"], 4 * NB),
                              Range(inp.buf, inp.off["indptr"], 4 * (S + 1)), Range(inp.buf, inp.off["seq_lens"], 4 * S),
                              Range(inp.buf, inp.off["query_start"], 4 * (S + 1)),
                              # whole blocks, as vLLM's kernel loads them (the tail's tokens are masked)
                              _chunks(kv, blk_step, bids, kb, blk), _chunks(kv, blk_step, bids, vb, blk),
                              Range(att, 0, 2 * T * d, WRITE)])
            b.values(K_PAGED_ATTN, "block_ids", ids, inp.ptr("block_ids"), rows("block_ids"))
        elif kind == "add":
            b.launch(K_ADD_ROWS, ids, {"x": x.ptr(), "y": h.ptr(), "n": T * d}, grid=(-(-T * d // 1024),),
                     flops=T * d, touches=[Range(x, 0, 2 * T * d, READWRITE), Range(h, 0, 2 * T * d)])
        elif kind == "silu":
            b.launch(K_SILU, ids, {"out": att.ptr(), "gate_up": ff.ptr(), "n": T * f}, grid=(-(-T * f // 256),),
                     flops=4 * T * f, touches=[Range(ff, 0, 4 * T * f), Range(att, 0, 2 * T * f, WRITE)])
        elif kind == "gather":
            b.launch(K_GATHER_ROWS, ids, {"out": hl.ptr(), "x": x.ptr(), "indices": inp.ptr("last"), "rows": S,
                                          "dim": d},
                     grid=(S,), block=(128,),
                     touches=[Ranges(x, last_step, last * 2 * d, 2 * d), Range(inp.buf, inp.off["last"], 4 * S),
                              Range(hl, 0, 2 * S * d, WRITE)])
            b.values(K_GATHER_ROWS, "indices", ids, inp.ptr("last"), rows("last"))
        elif kind == "sample":
            b.launch(K_SAMPLE_ROWS, ids, {"logits": logits.ptr(), "tokens": sampled.ptr(), "rows": S,
                                          "vocab": m.vocab, "temperature": 0.7, "top_p": 0.9,
                                          "rng_offset": (ids * 4).astype(np.uint64)},
                     grid=(S,), block=(1024,), flops=5 * S * m.vocab,
                     touches=[Range(logits, 0, 2 * S * m.vocab), Range(sampled, 0, 4 * S, WRITE)])
    b.paged_stats = {"steps": n_steps, "blocks": n_blocks, "admitted": sch.admitted, "finished": sch.finished,
                     "preempted": sch.preempted}


_PAGED = ("Continuous batching over a paged KV cache, as vLLM serves: a pool of 16-token KV blocks "
          "([block][token][kv head][64] bf16 per layer), a block table per sequence, sequences admitted, "
          "preempted and finished at different steps, their blocks freed and reused. Each step a copy "
          "kernel writes the host-prepared inputs (token ids, positions, slot mapping, the batch's block "
          "tables concatenated, their row pointers); embedding rows, rotary cos/sin rows, the KV slot "
          "writes, the attention's whole blocks and the LM head's gathered rows follow those values "
          "(indexed: the trace records them); RMSNorm, GEMMs with M = the batch's tokens, SiLU and residual "
          "adds follow the arguments. Llama-style bf16 weights as llm-decode's.")

WORKLOADS = [
    workload("llm-paged-decode", "llm", _PAGED + " Templates: fixed, linear, strided, indexed.",
             build_llm_paged_decode, PAGED_KERNELS,
             summary="LLM serving over a paged KV cache: block tables (indexed), blocks freed and reused"),
]
