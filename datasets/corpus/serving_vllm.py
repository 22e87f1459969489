"""A serving engine's step loop over vLLM's Triton kernels (vllm 0.34.0, loaded from the
installed package: engines.py), launched as vLLM's GPU model runner and its Triton attention
backend launch them, `--calls` scheduler steps long, the load following `--scale` (prompt and
output lengths; the model, the KV pool and the persistent buffers are fixed). The scheduler is
serving.py's (requests arriving and finishing, chunked prefill, a pool whose free list is in no
order, pages freed and reused); what differs is how vLLM's runner turns a batch into kernel
inputs, so the same load reaches the kernels through other index structures.

    pagecast collect --interpret -- python -m pagecast.datasets.corpus.serving_vllm --scale 1

vLLM's runner keeps its inputs in persistent buffers: a block table with a row per request in
batch order, as wide as the longest context (entries past a row's blocks are stale ids from
earlier requests), a slot mapping padded with -1, and per request state (a slot that stays the
request's while it runs) its computed-token count. The host writes the table rows and the slot
mapping (vLLM's input batch computes them on the CPU) and the batch's mapping from batch index
to request state (`idx_mapping`) and its query start offsets (`query_start_loc`). Kernels per
step, in order:
- `_prepare_pos_seq_lens_kernel`: each request's positions and sequence length from its
  computed tokens (through idx_mapping) and query_start_loc, one program per request and one
  more that zeroes the padded sequence lengths;
- `reshape_and_cache_kernel_flash`: the new tokens' K and V written through the slot mapping,
  one program per padded token (-1 slots write nothing);
- `kernel_unified_attention` (2D): every request's queries against its KV blocks, read through
  the forward pass's block table up to its sequence length, the request found from
  query_start_loc;
- `fused_moe_kernel`, twice, as vLLM's fused_experts launches it: the gate/up projection of the
  routed tokens, through a sorted, padded token order with an expert per block of BLOCK_SIZE_M
  (aligned on the host, as vLLM's CUDA alignment op does) or, for a batch small enough that its
  experts are sparse, one (token, expert) pair per block straight from the router's top-k ids
  (vLLM's naive block assignment); then, after the activation, the down projection with the
  same routing, each (token, expert) pair's activation row (`top_k` 1, a constexpr, so the same
  parameter layout reads rows by another rule) scaled by its router weight.
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

from . import engines as E
from .serving import (BLOCK_M, CHUNK, CONTEXT_PAGES, FFN, HEAD_DIM, HEADS, HIDDEN, KV_HEADS, MAX_BATCH,
                      MAX_EXTEND, MAX_REQS, OUTPUT, PAGE, POOL_PAGES, PROMPT, VOCAB)
from .serving import Engine as SchedulerEngine
from .serving import run_engine

EXPERTS_VLLM = 64        # enough experts that a decode batch's top-k is sparse (vLLM's naive assignment)
ARRIVALS = 0.4           # requests arriving per step, on average
FP8_RANGE = torch.finfo(torch.float8_e4m3fn)


def _pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 2))


class Engine(SchedulerEngine):
    """serving.py's scheduler, with vLLM's runner buffers and kernel launches."""

    def __init__(self, run, scale: float) -> None:   # noqa: PLR0915 - the runner's buffers, listed once
        self.run, self.rng = run, run.rng
        g = self.gen = torch.Generator().manual_seed(run.seed)
        sz = run.size
        self.vocab, self.hidden, self.ffn, self.pool_pages = VOCAB, HIDDEN, FFN, POOL_PAGES
        self.prompt_mean, self.output_mean = sz(PROMPT, lo=8), sz(OUTPUT, lo=4)
        self.max_pages = max(CONTEXT_PAGES, -(-(2 * self.prompt_mean + 2 * self.output_mean) // PAGE))
        self.mods = {k: E.load("vllm", v) for k, v in {
            "batch": "v1/worker/gpu/input_batch.py",
            "table": "v1/worker/gpu/block_table.py",
            "cache": "v1/attention/ops/triton_reshape_and_cache_flash.py",
            "attn": "v1/attention/ops/triton_unified_attention.py",
            "moe": "model_executor/layers/fused_moe/fused_moe.py",
        }.items()}
        self.emb_w = torch.randn(self.vocab, self.hidden, generator=g)
        self.k_cache = torch.zeros(self.pool_pages, PAGE, KV_HEADS, HEAD_DIM)
        self.v_cache = torch.zeros(self.pool_pages, PAGE, KV_HEADS, HEAD_DIM)
        self.w_qkv = torch.randn(self.hidden, (HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=g) * 0.05
        self.router = torch.randn(self.hidden, EXPERTS_VLLM, generator=g)
        self.w13 = torch.randn(EXPERTS_VLLM, 2 * self.ffn, self.hidden, generator=g) * 0.05
        self.w2 = torch.randn(EXPERTS_VLLM, self.hidden, self.ffn, generator=g) * 0.05
        maxtok, maxreq = MAX_BATCH + CHUNK, MAX_BATCH + MAX_EXTEND
        self.max_tokens, self.max_reqs = maxtok, maxreq
        # the runner's persistent state: per request state (slot) and per batch index
        self.req_to_page = torch.zeros(MAX_REQS, self.max_pages, dtype=torch.int32)   # per request state
        self.num_computed = torch.zeros(MAX_REQS, dtype=torch.int32)
        self.input_table = torch.zeros(maxreq, self.max_pages, dtype=torch.int32)
        self.idx_mapping = torch.zeros(maxreq, dtype=torch.int32)
        self.query_start_loc = torch.zeros(maxreq + 1, dtype=torch.int32)
        self.positions = torch.zeros(maxtok, dtype=torch.int64)
        self.seq_lens = torch.zeros(maxreq, dtype=torch.int32)
        self.slot_mapping = torch.full((maxtok,), -1, dtype=torch.int64)
        self.att_out = torch.zeros(maxtok, HEADS, HEAD_DIM)
        numel_max = maxtok * 2
        self.topk_ids = torch.zeros(numel_max, dtype=torch.int32)
        max_padded = numel_max + EXPERTS_VLLM * (BLOCK_M - 1)
        self.sorted_ids = torch.zeros(max_padded, dtype=torch.int32)
        self.expert_ids = torch.zeros(-(-max_padded // BLOCK_M), dtype=torch.int32)
        self.post_pad = torch.zeros(1, dtype=torch.int32)
        self.moe_out = torch.zeros(maxtok, 2, 2 * self.ffn)   # fused_experts' intermediate caches 1, 2, 3
        self.moe_act = torch.zeros(maxtok * 2, self.ffn)
        self.moe_down = torch.zeros(maxtok, 2, self.hidden)
        self.free_pages = list(self.rng.permutation(self.pool_pages).tolist())
        self.free_slots = list(range(MAX_REQS))
        self.waiting, self.running, self.next_rid = [], [], 0

    # ---- the step: serving.py's batch, vLLM's runner ------------------------------------------
    def arrive(self) -> None:
        """Requests arrive at random, ARRIVALS a step on average (at most two wait): some steps
        find none waiting and only decode, as a server between bursts does."""
        for _ in range(int(self.rng.poisson(ARRIVALS))):
            if len(self.waiting) >= 2:
                break
            self.new_request()

    def step(self) -> None:
        st = self.begin_step()
        if st is None:
            return
        batch, counts, ntok = st.batch, st.counts, st.tokens
        b = len(batch)
        for r in batch:   # a slot's count restarts with its request (a reused slot holds its last one's)
            self.num_computed[r.slot] = r.done
        # the input batch's host side: rows in batch order (whole rows: their tails stale)
        self.input_table[:b] = self.req_to_page[[r.slot for r in batch]]
        self.idx_mapping[:b] = torch.tensor([r.slot for r in batch], dtype=torch.int32)
        self.query_start_loc[: b + 1] = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32)
        self.prepare(b)
        for r, c in zip(batch, counts):
            r.done += c
            self.num_computed[r.slot] = r.done
        x = self.emb_w[torch.randint(0, self.vocab, (ntok,), generator=self.gen)]
        qkv = x @ self.w_qkv
        q = qkv[:, : HEADS * HEAD_DIM].reshape(ntok, HEADS, HEAD_DIM).contiguous()
        k = qkv[:, HEADS * HEAD_DIM:(HEADS + KV_HEADS) * HEAD_DIM].reshape(ntok, KV_HEADS, HEAD_DIM)
        v = qkv[:, (HEADS + KV_HEADS) * HEAD_DIM:].reshape(ntok, KV_HEADS, HEAD_DIM)
        self.cache_write(k, v, ntok)
        self.attention(q, b, max(counts))
        self.moe(x)
        self.retire(st.decode, st.ext)

    # ---- the launches, as vLLM's runner and backends make them -------------------------------
    def prepare(self, b: int) -> None:
        self.mods["batch"]._prepare_pos_seq_lens_kernel[(b + 1,)](
            self.positions, self.seq_lens, self.idx_mapping, self.query_start_loc, self.num_computed,
            self.seq_lens.shape[0], BLOCK_SIZE=1024)

    def cache_write(self, k, v, ntok: int) -> None:
        padded = min(self.max_tokens, _pow2(ntok))   # the CUDA graph's padded token count
        kp = torch.zeros(padded, KV_HEADS, HEAD_DIM)
        vp = torch.zeros(padded, KV_HEADS, HEAD_DIM)
        kp[:ntok], vp[:ntok] = k, v
        kc, vc = self.k_cache, self.v_cache
        n = KV_HEADS * HEAD_DIM
        self.mods["cache"].reshape_and_cache_kernel_flash[(padded, triton.cdiv(n, min(2048, _pow2(n))))](
            key_ptr=kp, value_ptr=vp, key_cache_ptr=kc, value_cache_ptr=vc,
            slot_mapping_ptr=self.slot_mapping[:padded], k_scale=1.0, v_scale=1.0,
            key_stride=kp.stride(0), value_stride=vp.stride(0), block_stride=kc.stride(0), head_stride=kc.stride(2),
            dim_stride_k=0, dim_stride_v=0, page_stride=kc.stride(1), num_heads=KV_HEADS, head_size=HEAD_DIM,
            block_size=PAGE, x=1, USE_HEAD_MAJOR_LAYOUT=False, INTERLEAVED_V_PACK_FACTOR=0, FP8_KV_CACHE=False,
            TILE_SIZE=min(2048, _pow2(n)))

    def attention(self, q, b: int, max_q: int) -> None:
        kc, vc, out = self.k_cache, self.v_cache, self.att_out
        nqpkv = HEADS // KV_HEADS
        block_m = 16 if nqpkv <= 16 else _pow2(nqpkv)
        block_q = block_m // nqpkv
        self.mods["attn"].kernel_unified_attention[(q.shape[0] // block_q + b, KV_HEADS)](
            output_ptr=out, query_ptr=q, key_cache_ptr=kc, value_cache_ptr=vc, sink_ptr=None,
            block_tables_ptr=self.input_table[:b], seq_lens_ptr=self.seq_lens[:b], alibi_slopes_ptr=None,
            qq_bias_ptr=None, scale=HEAD_DIM ** -0.5, q_scale=None, k_scale=1.0, v_scale=1.0, out_scale=1.0,
            softcap=0.0, num_query_heads=HEADS, num_queries_per_kv=nqpkv,
            block_table_stride=self.input_table.stride(0), query_stride_0=q.stride(0), query_stride_1=q.stride(1),
            output_stride_0=out.stride(0), output_stride_1=out.stride(1), qq_bias_stride_0=0, BLOCK_SIZE=PAGE,
            TILE_SIZE=32, HEAD_SIZE=HEAD_DIM, HEAD_SIZE_PADDED=_pow2(HEAD_DIM), USE_ALIBI_SLOPES=False,
            USE_ALIBI_SQRT=False, USE_QQ_BIAS=False, USE_SOFTCAP=False, USE_SINKS=False, SLIDING_WINDOW=0,
            USE_CAUSAL=True, USE_PER_SEQ_CAUSAL=False, per_seq_causal_ptr=None, USE_MM_PREFIX=False,
            MAX_MM_RANGES=0, mm_prefix_range_ptr=None, rswa_prefix_lens_ptr=self.seq_lens[:b], R_SWA_WINDOW=0,
            USE_R_SWA=False, stride_k_cache_0=kc.stride(0), stride_k_cache_1=kc.stride(1),
            stride_k_cache_2=kc.stride(2), stride_k_cache_3=kc.stride(3), stride_v_cache_0=vc.stride(0),
            stride_v_cache_1=vc.stride(1), stride_v_cache_2=vc.stride(2), stride_v_cache_3=vc.stride(3),
            query_start_len_ptr=self.query_start_loc, BLOCK_Q=block_q, num_seqs=b, BLOCK_M=block_m,
            NUM_SEGMENTS_PER_SEQ=1, USE_FP8=False, IS_3D=False, KV_QUANT_MODE=0, Q_IS_FP8=False,
            FP8_MIN=FP8_RANGE.min, FP8_MAX=FP8_RANGE.max)

    def align(self, numel: int) -> int:
        """vLLM's moe_align_block_size, on the host: the (token, expert) pairs sorted by expert,
        each expert's run padded to BLOCK_M with `numel`; one expert id per block. EM."""
        ids = self.topk_ids[:numel].long()
        order = torch.sort(ids, stable=True).indices
        counts = torch.bincount(ids, minlength=EXPERTS_VLLM)
        padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
        self.sorted_ids.fill_(numel)
        starts = torch.cat([torch.zeros(1, dtype=torch.long), padded.cumsum(0)[:-1]])
        pos = starts[ids[order]] + (torch.arange(numel) - torch.cat(
            [torch.zeros(1, dtype=torch.long), counts.cumsum(0)[:-1]])[ids[order]])
        self.sorted_ids[pos] = order.to(torch.int32)
        total = int(padded.sum())
        self.expert_ids[: total // BLOCK_M] = torch.repeat_interleave(
            torch.arange(EXPERTS_VLLM), padded // BLOCK_M).to(torch.int32)
        self.post_pad[0] = total
        return self.sorted_ids.numel()

    def moe(self, x) -> None:
        ntok, top_k = x.shape[0], 2
        w, ids = torch.topk(torch.softmax(x @ self.router, -1), top_k, dim=-1)
        numel = ntok * top_k
        self.topk_ids[:numel] = ids.reshape(-1).to(torch.int32)
        naive = numel * 4 <= EXPERTS_VLLM
        if naive:                                    # one (token, expert) pair per block
            sorted_ids, expert_ids = None, self.topk_ids[:numel]
            self.post_pad[0] = numel * BLOCK_M
            em = ntok * top_k * BLOCK_M
        else:
            sorted_ids, expert_ids = self.sorted_ids, self.expert_ids
            em = self.align(numel)
            if ntok < BLOCK_M:
                em = min(em, ntok * top_k * BLOCK_M)
        routed = w.reshape(-1).contiguous()
        self.fused_moe(x, self.w13, self.moe_out, routed, sorted_ids, expert_ids, em, numel, top_k, False)
        # the activation (a CUDA op in vLLM; torch here), then the down projection: the same
        # kernel and routing, each (token, expert) pair's row of the activation (top_k 1) times
        # its expert's w2, scaled by its router weight, as vLLM's fused_experts launches it
        act = self.moe_out[:ntok].reshape(numel, 2 * self.ffn)
        self.moe_act[:numel] = torch.nn.functional.silu(act[:, : self.ffn]) * act[:, self.ffn:]
        self.fused_moe(self.moe_act, self.w2, self.moe_down, routed, sorted_ids, expert_ids, em, numel, 1, True)

    def fused_moe(self, a, b, c, routed, sorted_ids, expert_ids, em: int, numel: int, top_k: int,
                  mul_routed: bool) -> None:
        """One fused_moe_kernel launch: a's rows (token, or (token, expert) pair where top_k is 1)
        times their experts' b, into c's [token, k] rows."""
        n, kdim, bn, bk = b.shape[1], b.shape[2], 64, 64
        naive = sorted_ids is None
        self.mods["moe"].fused_moe_kernel[(triton.cdiv(em, BLOCK_M) * triton.cdiv(n, bn),)](
            a, b, None, c, None, None, None, routed, sorted_ids, expert_ids,
            self.post_pad, None, n, kdim, em, numel, a.stride(0), a.stride(1), b.stride(0),
            b.stride(2), b.stride(1), c.stride(1), c.stride(2), 0, 0, 0, 0, 0, 0, 0, 0, 0,
            MUL_ROUTED_WEIGHT=mul_routed, top_k=top_k, compute_type=tl.float32, use_fp8_w8a8=False,
            use_int8_w8a8=False, use_int8_w8a16=False, per_channel_quant=False, naive_block_assignment=naive,
            HAS_BIAS=False, BLOCK_SIZE_K=bk, SWAP_AB=False, USE_TD=False, USE_TMA_B=False, USE_TMA_A=False,
            C_IS_SORTED=False, BLOCK_SIZE_M=BLOCK_M, BLOCK_SIZE_N=bn, GROUP_SIZE_M=1, SPLIT_K=1)


def main(argv=None) -> int:
    return run_engine(Engine, argv, __doc__)


if __name__ == "__main__":
    sys.exit(main())
