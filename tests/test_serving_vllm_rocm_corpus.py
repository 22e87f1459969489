"""The vLLM ROCm-backend serving program (datasets/corpus/serving_vllm_rocm.py): the head-major
cache write, prefix_prefill's `_fwd_kernel` that skips decoding requests and the paged decode
that skips prefill chunks, loaded from the installed package, compute under the interpreter what
their torch peers compute over mixed batches, and `datasets make serving-vllm-rocm` records them
with their index values."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"   # before any @triton.jit

import pytest
import torch

from pagecast.collect import interpret_compat
from pagecast.datasets import corpus
from pagecast.datasets.corpus import serving as S
from pagecast.datasets.corpus import serving_vllm_rocm as R
from pagecast.datasets.corpus.corpus_run import parse
from serving_checks import assert_recorded_padding, check_attention, check_cache_write, read_recording

interpret_compat.apply_all()


def k_rows(cache: torch.Tensor) -> torch.Tensor:
    """The head-major K cache ([block, kv head, head_dim / x, slot, x]) as a row per slot."""
    return cache.permute(0, 3, 1, 2, 4).reshape(-1, S.KV_HEADS, S.HEAD_DIM)


def v_rows(cache: torch.Tensor) -> torch.Tensor:
    """The head-major V cache ([block, kv head, head_dim, slot]) as a row per slot."""
    return cache.permute(0, 3, 1, 2).reshape(-1, S.KV_HEADS, S.HEAD_DIM)


class Checked(R.Engine):
    """The ROCm-backend engine, its cache write and attention compared with torch after each
    launch; the attention output poisoned first, so a row no kernel wrote fails."""

    def cache_write(self, k, v, ntok):
        before = self.k_cache.clone()
        super().cache_write(k, v, ntok)
        check_cache_write(self, before, k, v, k_rows, v_rows)

    def attention(self, q, b, max_q):
        self.att_out.fill_(float("nan"))
        super().attention(q, b, max_q)
        lens = check_attention(self, q, b, k_rows(self.k_cache), v_rows(self.v_cache))
        if max(lens) > 1:
            self.kinds.add("mixed" if min(lens) == 1 else "prefill only")
        else:
            self.kinds.add("decode only")


@pytest.mark.slow
def test_rocm_backend_kernels_match_torch_over_mixed_batches():
    run = parse(["--scale", "0.25", "--seed", "3"], "t", calls=20)
    eng = Checked(run, run.scale)
    eng.kinds = set()
    for _ in range(run.calls):
        eng.step()
    # batches mixing decoding requests with prefill chunks ran (each kernel skipping the other's
    # requests), and batches that only decode (no prefill launch)
    assert {"mixed", "decode only"} <= eng.kinds, eng.kinds
    # K and V are halves of one allocation, as the backend's layout keeps them
    assert eng.k_cache.untyped_storage().data_ptr() == eng.v_cache.untyped_storage().data_ptr()


@pytest.mark.slow
def test_datasets_make_records_the_rocm_loop_with_its_index_values(tmp_path):
    from pagecast.datasets.registry import make_trace
    out = make_trace("serving-vllm-rocm", tmp_path / "r.pctrace", scale=0.25, seed=5)
    tr = read_recording(out, corpus.SERVING_VLLM_ROCM_KERNELS)
    assert_recorded_padding(tr, "reshape_and_cache_kernel_flash")
