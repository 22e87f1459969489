"""A serving engine's decode loop over real engines' Triton kernels (sglang 0.5.23 and
flashinfer-python 0.7.2.post1, loaded from the installed packages: engines.py), launched as
their host code launches them, `--calls` scheduler steps long, the load following `--scale`
(prompt and output lengths; the model's dimensions and the KV pool are fixed, as a deployed
engine's are). The pool is sized as a deployed engine sizes it, to the memory the weights leave
(about 90% of what the run allocates), and its free list is in no order, as a pool's is once it has
served a while, so the pages a step's requests hold lie scattered over it. The page tables have
a row per request slot and an entry per page of the longest context (32k tokens), as an
engine's are, so a request's row is read only up to its length.

    pagecast collect --interpret -- python -m pagecast.datasets.corpus.serving --scale 1

Each step runs one batch: the running requests decode one token each, and the waiting
requests, up to two, add chunks of their prompts within a token budget (chunked prefill).
Requests arrive with drawn prompt and output lengths, and finish when their output is done;
their KV pages go back to the end of the free list and are handed to later requests (reused, in
an order the frees set), and their row of the request-to-page table keeps the stale page ids
until a new request overwrites it. Buffers are persistent and padded as a CUDA-graph engine
keeps them: ids, slot mapping, request indices, sequence lengths and indptrs are prefixes of
buffers allocated once at the largest batch, the slot mapping padded with -1 to the padded
token count (the cache write skips those).

Kernels per step, in order:
- `_vocab_parallel_embedding_kernel` (sglang): the batch's token embeddings, one program per
  token and block of the hidden size;
- `get_batch_indices_positions_kernel` (flashinfer): each appended token's request and
  position, from the append indptr and sequence lengths;
- `reshape_and_cache_flash` (sglang): the new tokens' K and V written into the paged cache
  through the slot mapping, one program per padded token (-1 slots write nothing);
- `create_flashinfer_kv_indices_triton` (sglang): each decoding request's row of the
  request-to-page table, read up to ceil(seq_len / page) entries, expanded into the flat
  kv_indices at kv_indptr;
- `_fwd_kernel_stage1`, `_fwd_kernel_stage2` (sglang): decode attention over the K/V rows
  kv_indptr and kv_indices select, split along the sequence;
- the prefill chunks' attention on another backend, as an engine with separate prefill and
  decode attention backends runs it: `create_flashinfer_kv_indices_triton` for the chunks'
  requests, `scatter_ragged_to_page_table_kernel` (sglang) turning those kv_indices into a
  block table of a row per request (a persistent table: entries past a row's pages are stale),
  and `unified_attention_3d_mtp_kernel` (sglang, in one segment per sequence: its output
  needs no reduction), each program reading its request's row of the table up to
  ceil(seq_len / page) entries, the query tokens found through the chunks' query indptr;
- `_moe_align_small_numel_kernel` (sglang): the router's top-k expert ids sorted into blocks
  of BLOCK_M tokens per expert, padded;
- `fused_moe_kernel` (sglang): each block's expert weights times the tokens the sorted ids
  name, for the gate/up projection.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl

from . import engines as E
from .corpus_run import parse

VOCAB, HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 8192, 128, 4, 2, 64
EXPERTS, TOP_K, FFN = 16, 2, 128
PAGE, POOL_PAGES, MAX_REQS, MAX_PAGES_PER_REQ = 16, 4096, 16, 64
CONTEXT_PAGES = 2048   # the longest context (32k tokens) in pages: the width of the page tables' rows
MAX_BATCH, CHUNK, MAX_EXTEND = 8, 32, 2
PROMPT, OUTPUT = 96, 24
BLOCK_M, MIN_BLOCK_KV, MAX_KV_SPLITS = 16, 32, 4


@dataclass
class Request:
    rid: int
    prompt: int
    output: int
    slot: int = -1                           # row of the request-to-page table
    pages: list[int] = field(default_factory=list)
    done: int = 0                            # tokens in the cache (prompt chunks, then outputs)

    @property
    def prefilled(self) -> bool:
        return self.done >= self.prompt


@dataclass
class Step:
    """One scheduler step's batch: the decoding requests, then the prefill chunks' ones, each
    request's new token count, and their total."""
    decode: list[Request]
    ext: list[Request]
    counts: list[int]
    tokens: int

    @property
    def batch(self) -> list[Request]:
        return self.decode + self.ext


def _pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 2))


class Engine:
    """The host side: page pool, request slots, persistent buffers, kernel launches."""

    def __init__(self, run, scale: float) -> None:
        self.run, self.rng = run, run.rng
        g = self.gen = torch.Generator().manual_seed(run.seed)
        sz = run.size
        # the model and the pool are fixed, as one deployed engine serves one model on one GPU;
        # --scale changes only the load (prompt and output lengths, so batch sizes and steps' work)
        self.vocab, self.hidden, self.ffn, self.pool_pages = VOCAB, HIDDEN, FFN, POOL_PAGES
        self.prompt_mean, self.output_mean = sz(PROMPT, lo=8), sz(OUTPUT, lo=4)
        self.max_pages = max(CONTEXT_PAGES, -(-(2 * self.prompt_mean + 2 * self.output_mean) // PAGE))
        self.mods = {k: E.load(*v) for k, v in {
            "emb": ("sglang", "kernels/ops/embeddings/vocab_parallel_embedding.py"),
            "page": ("flashinfer", "triton/page.py"),
            "cache": ("sglang", "kernels/ops/kvcache/cache_ops.py"),
            "kvi": ("sglang", "kernels/ops/attention/kv_indices.py"),
            "dec": ("sglang", "kernels/ops/attention/decode_attention.py"),
            "table": ("sglang", "kernels/ops/attention/aiter_unified_page_table.py"),
            "unified": ("sglang", "kernels/ops/attention/unified_attention_3d_mtp.py"),
            "align": ("sglang", "kernels/ops/moe/moe_align_small_numel.py"),
            "moe": ("sglang", "kernels/ops/moe/fused_moe_triton_kernels.py"),
        }.items()}
        # weights and the cache: allocated once
        self.emb_w = torch.randn(self.vocab, self.hidden, generator=g)
        self.k_cache = torch.zeros(self.pool_pages, PAGE, KV_HEADS, HEAD_DIM)
        self.v_cache = torch.zeros(self.pool_pages, PAGE, KV_HEADS, HEAD_DIM)
        self.w_qkv = torch.randn(self.hidden, (HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=g) * 0.05
        self.router = torch.randn(self.hidden, EXPERTS, generator=g)
        self.w13 = torch.randn(EXPERTS, 2 * self.ffn, self.hidden, generator=g) * 0.05
        # persistent, padded host-side buffers (CUDA-graph style): prefixes are passed per step
        maxtok = MAX_BATCH + CHUNK
        maxreq = MAX_BATCH + MAX_EXTEND
        self.padded_tokens = maxtok
        self.input_ids = torch.zeros(maxtok, dtype=torch.int64)
        self.slot_mapping = torch.full((maxtok,), -1, dtype=torch.int64)
        self.req_to_page = torch.zeros(MAX_REQS, self.max_pages, dtype=torch.int32)
        self.req_pool_indices = torch.zeros(maxreq + 1, dtype=torch.int64)
        self.seq_lens = torch.zeros(maxreq + 1, dtype=torch.int32)
        self.kv_indptr = torch.zeros(MAX_BATCH + 2, dtype=torch.int32)
        self.append_indptr = torch.zeros(maxreq + 2, dtype=torch.int32)
        # the prefill backend's: its requests' kv_indices and indptr, query indptr, block table
        self.ext_kv_indptr = torch.zeros(MAX_EXTEND + 2, dtype=torch.int32)
        self.ext_kv_indices = torch.zeros(MAX_EXTEND * self.max_pages * PAGE, dtype=torch.int32)
        self.ext_qo_indptr = torch.zeros(MAX_EXTEND + 2, dtype=torch.int32)
        self.page_table = torch.zeros(MAX_EXTEND, self.max_pages, dtype=torch.int32)
        self.ext_out = torch.zeros(CHUNK, HEADS, 1, HEAD_DIM)
        self.ext_m = torch.zeros(CHUNK, HEADS, 1)
        self.ext_l = torch.zeros(CHUNK, HEADS, 1)
        self.kv_indices = torch.zeros(MAX_BATCH * self.max_pages * PAGE, dtype=torch.int32)
        self.batch_indices = torch.zeros(maxtok, dtype=torch.int32)
        self.positions = torch.zeros(maxtok, dtype=torch.int32)
        self.num_kv_splits = torch.zeros(MAX_BATCH, dtype=torch.int32)
        self.att_out = torch.zeros(MAX_BATCH, HEADS, MAX_KV_SPLITS, HEAD_DIM)
        self.att_lse = torch.zeros(MAX_BATCH, HEADS, MAX_KV_SPLITS)
        self.att_o = torch.zeros(MAX_BATCH, HEADS, HEAD_DIM)
        numel_max = maxtok * TOP_K
        self.topk_ids = torch.zeros(numel_max, dtype=torch.int32)
        max_padded = numel_max + (EXPERTS + 1) * (BLOCK_M - 1)
        self.sorted_ids = torch.zeros(max_padded, dtype=torch.int32)
        self.expert_ids = torch.full((-(-max_padded // BLOCK_M),), -1, dtype=torch.int32)
        self.post_pad = torch.zeros(1, dtype=torch.int32)
        self.moe_out = torch.zeros(numel_max, 2 * self.ffn)
        self.free_pages = list(self.rng.permutation(self.pool_pages).tolist())
        self.free_slots = list(range(MAX_REQS))
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.next_rid = 0

    # ---- the scheduler ---------------------------------------------------------------------
    def arrive(self) -> None:
        while len(self.waiting) < 2:
            self.new_request()

    def new_request(self) -> None:
        """A request with drawn prompt and output lengths joins the waiting ones."""
        p = int(self.rng.integers(self.prompt_mean // 2, self.prompt_mean * 3 // 2 + 1))
        o = int(self.rng.integers(self.output_mean // 2, self.output_mean * 3 // 2 + 1))
        self.waiting.append(Request(self.next_rid, p, o))
        self.next_rid += 1

    def grow(self, r: Request, tokens: int) -> list[int]:
        """Cache slots for the next `tokens` tokens of r, taking pages from the free list."""
        out = []
        for pos in range(r.done, r.done + tokens):
            if pos // PAGE >= len(r.pages):
                page = self.free_pages.pop(0)
                self.req_to_page[r.slot, len(r.pages)] = page
                r.pages.append(page)
            out.append(r.pages[pos // PAGE] * PAGE + pos % PAGE)
        return out

    def finish(self, r: Request) -> None:
        # pages go back to the free list in a drawn order; the table row keeps them (stale)
        self.free_pages.extend(self.rng.permutation(r.pages).tolist())
        self.free_slots.append(r.slot)

    def schedule(self) -> tuple[list[Request], list[Request], list[int]]:
        """The step's batch: the running requests that decode (at most MAX_BATCH), then up to
        MAX_EXTEND waiting ones with their prompt chunks within the token budget, while the free
        list keeps room (each takes a request slot on its first chunk)."""
        decode = [r for r in self.running if r.prefilled][:MAX_BATCH]
        pages_needed = len(decode) + CHUNK // PAGE + 2
        ext: list[Request] = []
        chunks: list[int] = []
        budget = CHUNK
        for r in self.waiting[:MAX_EXTEND]:
            if budget <= 0 or len(self.free_pages) <= pages_needed + MAX_PAGES_PER_REQ // 4:
                break
            if r.slot < 0:
                if not self.free_slots:
                    break
                r.slot = self.free_slots.pop(0)
            c = min(budget, r.prompt - r.done)
            ext.append(r), chunks.append(c)
            budget -= c
            pages_needed += -(-c // PAGE)
        return decode, ext, chunks

    def retire(self, decode: list[Request], ext: list[Request]) -> None:
        """After the step: prefilled requests start decoding, finished ones give their pages back."""
        done = {id(r) for r in ext if r.prefilled}
        self.waiting = [r for r in self.waiting if id(r) not in done]
        self.running += [r for r in ext if id(r) in done]
        for r in decode:
            if r.done >= r.prompt + r.output:
                self.finish(r)
        self.running = [r for r in self.running if r.done < r.prompt + r.output]

    def begin_step(self) -> Step | None:
        """Arrivals, the batch, its tokens' cache slots (pages taken as needed) written into the
        slot mapping, padded with -1; None for an empty batch."""
        self.arrive()
        decode, ext, chunks = self.schedule()
        if not decode and not ext:
            return None
        counts = [1] * len(decode) + chunks
        slots: list[int] = []
        for r, c in zip(decode + ext, counts):
            slots += self.grow(r, c)
        self.slot_mapping.fill_(-1)
        self.slot_mapping[: len(slots)] = torch.tensor(slots, dtype=torch.int64)
        return Step(decode, ext, counts, len(slots))

    def step(self) -> None:
        st = self.begin_step()
        if st is None:
            return
        decode, ext, counts, ntok = st.decode, st.ext, st.counts, st.tokens
        batch = st.batch
        for r, c in zip(batch, counts):
            r.done += c
        self.input_ids[:ntok] = torch.randint(0, self.vocab, (ntok,), generator=self.gen)
        b = len(batch)
        lens = [r.done for r in batch]
        self.seq_lens[:b] = torch.tensor(lens, dtype=torch.int32)
        self.req_pool_indices[:b] = torch.tensor([r.slot for r in batch], dtype=torch.int64)
        self.append_indptr[: b + 1] = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32)

        x = self.embedding(ntok)
        self.batch_positions(b)
        qkv = x @ self.w_qkv
        q = qkv[:, : HEADS * HEAD_DIM].reshape(ntok, HEADS, HEAD_DIM)
        k = qkv[:, HEADS * HEAD_DIM:(HEADS + KV_HEADS) * HEAD_DIM].reshape(ntok, KV_HEADS, HEAD_DIM).contiguous()
        v = qkv[:, (HEADS + KV_HEADS) * HEAD_DIM:].reshape(ntok, KV_HEADS, HEAD_DIM).contiguous()
        self.cache_write(k, v)
        nd = len(decode)
        if decode:
            self.kv_indptr[: nd + 1] = torch.tensor([0, *torch.tensor(lens[:nd]).cumsum(0).tolist()],
                                                    dtype=torch.int32)
            self.kv_indices_from_table(nd)
            self.decode_attention(q[:nd].contiguous(), nd)
        if ext:
            self.ext_kv_indptr[: len(ext) + 1] = torch.tensor([0, *torch.tensor(lens[nd:]).cumsum(0).tolist()],
                                                              dtype=torch.int32)
            self.ext_qo_indptr[: len(ext) + 1] = torch.tensor([0, *torch.tensor(counts[nd:]).cumsum(0).tolist()],
                                                              dtype=torch.int32)
            self.extend_attention(q[nd:].contiguous(), nd, len(ext))
        self.moe(x)
        self.retire(decode, ext)

    # ---- the launches, as the engines' host code makes them ----------------------------------
    def embedding(self, ntok: int):
        out = torch.empty(ntok, self.hidden)
        bh = min(1024, _pow2(self.hidden))
        self.mods["emb"]._vocab_parallel_embedding_kernel[(ntok, triton.cdiv(self.hidden, bh))](
            self.input_ids, self.emb_w, out, hidden_dim=self.hidden, weight_stride0=self.emb_w.stride(0),
            org_vocab_start_index=0, org_vocab_end_index=self.vocab, num_org_vocab_padding=0,
            added_vocab_start_index=self.vocab, added_vocab_end_index=self.vocab, BLOCK_H=bh)
        return out

    def batch_positions(self, b: int) -> None:
        self.mods["page"].get_batch_indices_positions_kernel[(b,)](
            self.append_indptr, self.seq_lens, self.batch_indices, self.positions, num_stages=2)

    def cache_write(self, k, v) -> None:
        ntok = k.shape[0]
        padded = min(self.padded_tokens, _pow2(ntok))   # a CUDA graph's padded batch: -1 slots beyond ntok
        kp = torch.zeros(padded, KV_HEADS, HEAD_DIM)
        vp = torch.zeros(padded, KV_HEADS, HEAD_DIM)
        kp[:ntok], vp[:ntok] = k, v
        kc, vc = self.k_cache, self.v_cache
        head_block = 4
        self.mods["cache"].reshape_and_cache_flash[(padded, triton.cdiv(KV_HEADS, head_block))](
            kp, vp, kc, vc, self.slot_mapping, None, kp, vp, kc.stride(0), vc.stride(0),
            cache_token_stride=kc.stride(1), cache_head_stride=kc.stride(2), value_cache_token_stride=vc.stride(1),
            value_cache_head_stride=vc.stride(2), key_stride=kp.stride(0), value_stride=vp.stride(0),
            num_heads=KV_HEADS, head_size=HEAD_DIM, block_size=PAGE, HEAD_BLOCK=head_block,
            BLOCK_D=_pow2(HEAD_DIM), HAS_SWA=False, USE_SCALE=False)

    def kv_indices_from_table(self, nd: int) -> None:
        self.mods["kvi"].create_flashinfer_kv_indices_triton[(nd,)](
            self.req_to_page, self.req_pool_indices, self.seq_lens, self.kv_indptr, None, self.kv_indices,
            self.req_to_page.stride(0), ENTRY_PAGE_SIZE=PAGE)

    def decode_attention(self, q, nd: int) -> None:
        kb = self.k_cache.view(-1, KV_HEADS, HEAD_DIM)
        vb = self.v_cache.view(-1, KV_HEADS, HEAD_DIM)
        lens = self.seq_lens[:nd]
        self.num_kv_splits[:nd] = torch.clamp(-(-lens // 64), 1, MAX_KV_SPLITS).to(torch.int32)
        dec = self.mods["dec"]
        dec._fwd_kernel_stage1[(nd, HEADS, MAX_KV_SPLITS)](
            q, kb, vb, HEAD_DIM ** -0.5, self.kv_indptr, self.kv_indices, self.att_out, self.att_lse,
            self.num_kv_splits, q.stride(0), q.stride(1), kb.stride(0), kb.stride(1), vb.stride(0), vb.stride(1),
            0, 0, 0, 0, self.att_out.stride(0), self.att_out.stride(1), self.att_out.stride(2),
            kv_group_num=HEADS // KV_HEADS, BLOCK_DMODEL=HEAD_DIM, BLOCK_DV=HEAD_DIM, BLOCK_N=32,
            MIN_BLOCK_KV=MIN_BLOCK_KV, logit_cap=0.0, Lk=HEAD_DIM, Lv=HEAD_DIM, xai_temperature_len=-1, PAGE_SIZE=1)
        dec._fwd_kernel_stage2[(nd, HEADS)](
            self.att_out, self.att_lse, self.att_o, 1.0, self.kv_indptr, self.num_kv_splits, None,
            self.att_out.stride(0), self.att_out.stride(1), self.att_out.stride(2), self.att_o.stride(0),
            self.att_o.stride(1), MAX_KV_SPLITS=MAX_KV_SPLITS, MIN_BLOCK_KV=MIN_BLOCK_KV, BLOCK_DV=HEAD_DIM,
            Lv=HEAD_DIM, HAS_SINK=False)

    def extend_attention(self, q, nd: int, ne: int) -> None:
        """The prefill chunks' attention (rows nd.. of the batch), on the unified-attention backend:
        kv_indices for their requests, the block table built from them, then the attention."""
        self.mods["kvi"].create_flashinfer_kv_indices_triton[(ne,)](
            self.req_to_page, self.req_pool_indices[nd:], self.seq_lens[nd:], self.ext_kv_indptr, None,
            self.ext_kv_indices, self.req_to_page.stride(0), ENTRY_PAGE_SIZE=PAGE)
        bs = 32
        self.mods["table"].scatter_ragged_to_page_table_kernel[(ne, triton.cdiv(self.max_pages, bs))](
            self.ext_kv_indices, self.ext_kv_indptr, self.page_table, self.page_table.stride(0), None, None,
            PAGE_SIZE=PAGE, BLOCK_SIZE=bs, HAS_SWA=False)
        ntok = q.shape[0]
        nqpkv = HEADS // KV_HEADS
        block_m = 16
        block_q = block_m // nqpkv
        kc, vc = self.k_cache, self.v_cache
        self.mods["unified"].unified_attention_3d_mtp_kernel[(ntok // block_q + ne, KV_HEADS, 1)](
            self.ext_out, self.ext_m, self.ext_l, q, kc, vc, None, self.page_table, self.seq_lens[nd:], None, None,
            HEAD_DIM ** -0.5, None, None, None, None, 0.0, num_query_heads=HEADS, num_queries_per_kv=nqpkv,
            block_table_stride=self.page_table.stride(0), query_stride_0=q.stride(0), query_stride_1=q.stride(1),
            qq_bias_stride_0=0, BLOCK_SIZE=PAGE, TILE_SIZE=32, HEAD_SIZE=HEAD_DIM, HEAD_SIZE_PADDED=HEAD_DIM,
            USE_ALIBI_SLOPES=False, USE_QQ_BIAS=False, USE_SOFTCAP=False, USE_SINKS=False, SLIDING_WINDOW=0,
            stride_k_cache_0=kc.stride(0), stride_k_cache_1=kc.stride(1), stride_k_cache_2=kc.stride(2),
            stride_k_cache_3=kc.stride(3), stride_v_cache_0=vc.stride(0), stride_v_cache_1=vc.stride(1),
            stride_v_cache_2=vc.stride(2), stride_v_cache_3=vc.stride(3), query_start_len_ptr=self.ext_qo_indptr,
            BLOCK_Q=block_q, num_seqs=ne, BLOCK_M=block_m, num_warps=4, waves_per_eu=1, num_stages=1,
            NUM_SEGMENTS_PER_SEQ=1)

    def moe(self, x) -> None:
        ntok = x.shape[0]
        logits = x @ self.router
        w, ids = torch.topk(torch.softmax(logits, -1), TOP_K, dim=-1)
        numel = ntok * TOP_K
        self.topk_ids[:numel] = ids.reshape(-1).to(torch.int32)
        topk_ids = self.topk_ids[:numel]
        nb = self.expert_ids.numel()
        self.mods["align"]._moe_align_small_numel_kernel[(1,)](
            topk_ids, self.sorted_ids, self.expert_ids, self.post_pad, EXPERTS + 1, BLOCK_M, numel,
            NP=_pow2(numel), NB=_pow2(nb), num_warps=4)
        em = self.sorted_ids.numel()
        n, kdim = 2 * self.ffn, self.hidden
        bn, bk = 64, 64
        c = self.moe_out
        self.mods["moe"].fused_moe_kernel[(triton.cdiv(em, BLOCK_M) * triton.cdiv(n, bn),)](
            x, None, self.w13, None, None, c, None, None, w.reshape(-1).contiguous(), self.sorted_ids, self.expert_ids,
            self.post_pad, None, n, kdim, em, numel, x.stride(0), x.stride(1), self.w13.stride(0),
            self.w13.stride(2), self.w13.stride(1), 0, 0, c.stride(0), c.stride(1), 0, 0, 0, 0, 0,
            group_n=0, group_k=0, BLOCK_SIZE_M=BLOCK_M, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=1,
            MUL_ROUTED_WEIGHT=False, top_k=TOP_K, compute_type=tl.float32, use_fp8_w8a8=False,
            use_int8_w8a8=False, use_int8_w8a16=False, per_channel_quant=False, even_Ks=kdim % bk == 0,
            c_sorted=False, swap_ab=False, FUSE_ADD_TO_OUTPUT=False, MASK_OUTPUT=False, FUSE_SUM_ALL_REDUCE=False,
            ROUTER_TOPK=TOP_K)


def run_engine(engine: type[Engine], argv, doc: str) -> int:
    """A serving program's main: its options, then `--calls` steps of `engine`."""
    run = parse(argv, doc.splitlines()[0], calls=24)
    eng = engine(run, run.scale)
    for _ in range(run.calls):
        eng.step()
    return 0


def main(argv=None) -> int:
    return run_engine(Engine, argv, __doc__)


if __name__ == "__main__":
    sys.exit(main())
