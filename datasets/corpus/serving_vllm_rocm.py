"""A serving engine's step loop over vLLM's Triton kernels as its ROCm attention backend launches
them (vllm 0.34.0, loaded from the installed package: engines.py): serving_vllm.py's scheduler,
runner buffers, positions and fused MoE, with the attention and the cache write of vLLM's
`RocmAttentionImpl` where it takes its Triton path.

    pagecast collect --interpret -- python -m pagecast.datasets.corpus.serving_vllm_rocm --scale 1

That backend keeps the KV cache head-major, K and V as the two halves of one allocation (the
K/V group first): K as [block, kv head, head_dim / x, slot, x] with x = 16 bytes over the
element size, V as [block, kv head, head_dim, slot]. Per step, in place of serving_vllm.py's
cache write and unified attention:
- `reshape_and_cache_kernel_flash` with `USE_HEAD_MAJOR_LAYOUT`: the new tokens' K and V
  written through the -1-padded slot mapping (vLLM's stride-aware Triton writer; for a block
  size of 16 or 32 with the native layout the backend calls a HIP op that writes the same
  bytes, which Triton's interpreter cannot run);
- `chunked_prefill_paged_decode`'s two launches, as it makes them when it falls back from
  ROCm's custom paged attention to Triton: where the batch holds a prefill chunk,
  prefix_prefill's `_fwd_kernel` with `SKIP_DECODE` (a program per request, head and block of
  query tokens; a request whose query is one token returns at once, the others read their
  context's KV blocks through the block table and their new tokens' K and V); then
  `kernel_paged_attention_2d` with `filter_by_query_len` over every request (a program per
  request and KV head; one whose query is longer than a token returns before it reads), so each
  kernel reads the rows of the block table the other leaves.
"""

from __future__ import annotations

import sys

import torch
import triton

from . import engines as E
from . import serving_vllm as SV
from .serving import HEAD_DIM, HEADS, KV_HEADS, PAGE, run_engine

X = 16 // 4   # the K cache's innermost group: 16 bytes of float32


class Engine(SV.Engine):
    """serving_vllm.py's engine, with the ROCm attention backend's cache and attention."""

    def __init__(self, run, scale: float) -> None:
        super().__init__(run, scale)
        self.mods["paged"] = E.load("vllm", "v1/attention/ops/chunked_prefill_paged_decode.py")
        self.mods["prefill"] = E.load("vllm", "v1/attention/ops/prefix_prefill.py")
        del self.k_cache, self.v_cache
        half = self.pool_pages * KV_HEADS * HEAD_DIM * PAGE
        self.kv_cache = torch.zeros(2, half)   # the K/V groups first, as the backend's layout puts them
        self.k_cache = self.kv_cache[0].view(self.pool_pages, KV_HEADS, HEAD_DIM // X, PAGE, X)
        self.v_cache = self.kv_cache[1].view(self.pool_pages, KV_HEADS, HEAD_DIM, PAGE)

    def cache_write(self, k, v, ntok: int) -> None:
        padded = min(self.max_tokens, SV._pow2(ntok))   # the CUDA graph's padded token count
        kp = torch.zeros(padded, KV_HEADS, HEAD_DIM)
        vp = torch.zeros(padded, KV_HEADS, HEAD_DIM)
        kp[:ntok], vp[:ntok] = k, v
        kc, vc = self.k_cache, self.v_cache
        n = KV_HEADS * HEAD_DIM
        tile = min(2048, SV._pow2(n))
        self.mods["cache"].reshape_and_cache_kernel_flash[(padded, triton.cdiv(n, tile))](
            key_ptr=kp, value_ptr=vp, key_cache_ptr=kc, value_cache_ptr=vc,
            slot_mapping_ptr=self.slot_mapping[:padded], k_scale=1.0, v_scale=1.0,
            key_stride=kp.stride(0), value_stride=vp.stride(0), block_stride=kc.stride(0), head_stride=kc.stride(1),
            dim_stride_k=kc.stride(2), dim_stride_v=vc.stride(2), page_stride=kc.stride(1), num_heads=KV_HEADS,
            head_size=HEAD_DIM, block_size=PAGE, x=X, USE_HEAD_MAJOR_LAYOUT=True, INTERLEAVED_V_PACK_FACTOR=0,
            FP8_KV_CACHE=False, TILE_SIZE=tile)
        self.new_kv = (k, v)   # the prefill kernel reads the chunk's own K and V from here

    def attention(self, q, b: int, max_q: int) -> None:
        kc, vc, out = self.k_cache, self.v_cache, self.att_out
        table, seq_lens, qsl = self.input_table[:b], self.seq_lens[:b], self.query_start_loc[: b + 1]
        nqpkv = HEADS // KV_HEADS
        if max_q > 1:
            k, v = self.new_kv
            self.mods["prefill"]._fwd_kernel[(b, HEADS, triton.cdiv(max_q, 128))](
                q, k, v, kc, vc, None, table, HEAD_DIM ** -0.5, 1.0, 1.0, 1.0, qsl, seq_lens, X, out,
                table.stride(0), table.stride(1), q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1),
                k.stride(2), v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
                stride_k_cache_bs=kc.stride(0), stride_k_cache_h=kc.stride(1), stride_k_cache_d=kc.stride(2),
                stride_k_cache_bl=kc.stride(3), stride_k_cache_x=kc.stride(4), stride_v_cache_bs=vc.stride(0),
                stride_v_cache_h=vc.stride(1), stride_v_cache_d=vc.stride(2), stride_v_cache_bl=vc.stride(3),
                BLOCK_SIZE=32, PHYSICAL_BLOCK_SIZE=PAGE, num_queries_per_kv=nqpkv, IN_PRECISION=None,
                BLOCK_DMODEL=HEAD_DIM, BLOCK_DMODEL_PADDED=SV._pow2(HEAD_DIM), SLIDING_WINDOW=0, SKIP_DECODE=True,
                USE_FP8=False, BLOCK_M=128, BLOCK_N=64, num_unroll_cache=4, num_unroll_request=1,
                USE_SINKS=False, INTERLEAVED_V_PACK_FACTOR=0, CAUSAL=True, KV_FROM_CACHE=False,
                FP8_MIN=SV.FP8_RANGE.min, FP8_MAX=SV.FP8_RANGE.max)
        self.mods["paged"].kernel_paged_attention_2d[(b, KV_HEADS)](
            output_ptr=out, query_ptr=q, key_cache_ptr=kc, value_cache_ptr=vc, sink_ptr=None,
            block_tables_ptr=table, seq_lens_ptr=seq_lens, alibi_slopes_ptr=None, scale=HEAD_DIM ** -0.5,
            k_scale=1.0, v_scale=1.0, out_scale_inv=1.0, num_query_heads=HEADS, num_queries_per_kv=nqpkv,
            num_queries_per_kv_padded=max(triton.next_power_of_2(nqpkv), 16), block_table_stride=table.stride(0),
            query_stride_0=q.stride(0), query_stride_1=q.stride(1), output_stride_0=out.stride(0),
            output_stride_1=out.stride(1), BLOCK_SIZE=PAGE, PHYSICAL_BLOCK_SIZE=PAGE, HEAD_SIZE=HEAD_DIM,
            HEAD_SIZE_PADDED=SV._pow2(HEAD_DIM), USE_ALIBI_SLOPES=False, SLIDING_WINDOW=0, x=X,
            stride_k_cache_0=kc.stride(0), stride_k_cache_1=kc.stride(1), stride_k_cache_2=kc.stride(2),
            stride_k_cache_3=kc.stride(3), stride_k_cache_4=kc.stride(4), stride_v_cache_0=vc.stride(0),
            stride_v_cache_1=vc.stride(1), stride_v_cache_2=vc.stride(2), stride_v_cache_3=vc.stride(3),
            filter_by_query_len=True, query_start_len_ptr=qsl, USE_SINKS=False, USE_FP8=False,
            INTERLEAVED_V_PACK_FACTOR=0, FP8_MIN=SV.FP8_RANGE.min, FP8_MAX=SV.FP8_RANGE.max)


def main(argv=None) -> int:
    return run_engine(Engine, argv, __doc__)


if __name__ == "__main__":
    sys.exit(main())
