"""The vLLM serving program (datasets/corpus/serving_vllm.py): vLLM's Triton kernels, loaded from
the installed package with the Triton functions their files import from the package's other
files (datasets/corpus/engines.py), compute under the interpreter what their torch peers
compute, step after step, and `datasets make serving-vllm` records them with their index values."""

from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"   # before any @triton.jit

import pytest
import torch

from pagecast.collect import interpret_compat
from pagecast.datasets import corpus
from pagecast.datasets.corpus import engines as E
from pagecast.datasets.corpus import serving as S
from pagecast.datasets.corpus import serving_vllm as SV
from pagecast.datasets.corpus.corpus_run import parse
from serving_checks import assert_recorded_padding, check_attention, check_cache_write, flash_rows, read_recording

interpret_compat.apply_all()


def test_the_loader_binds_what_kernels_import_from_the_package_and_leaves_library_values_out():
    attn = E.load("vllm", "v1/attention/ops/triton_unified_attention.py")
    helpers = E.load("vllm", "v1/attention/ops/triton_attention_helpers.py")
    # `from vllm.triton_utils import tl, triton`: Triton's own
    import triton
    assert attn.triton is triton
    # `from vllm.v1.attention.ops.triton_attention_helpers import find_seq_idx, ...`: the same jit functions
    assert attn.find_seq_idx is helpers.find_seq_idx
    assert attn.find_seq_idx.fn.__code__.co_filename.endswith("triton_attention_helpers.py")
    # a default taken from the engine's platform layer (an fp8 type's range) names a stand-in
    fn = attn.kernel_unified_attention.fn
    assert isinstance(fn.__globals__["float8_info"], E.LeftOut)
    assert "left out: float8_info.min" in repr(fn.__globals__["float8_info"].min)
    # a relative import (`from .prefix_prefill import context_attention_fwd`) names no kernel: left out
    paged = E.load("vllm", "v1/attention/ops/chunked_prefill_paged_decode.py")
    assert "kernel_paged_attention_2d" in vars(paged) and "context_attention_fwd" not in vars(paged)
    import ast
    here = "v1/attention/ops/chunked_prefill_paged_decode.py"
    rel = ast.parse("from .prefix_prefill import context_attention_fwd").body[0]
    assert E._package_file("vllm", here, rel) == "v1/attention/ops/prefix_prefill.py"
    up = ast.parse("from ..backends.utils import x").body[0]
    assert E._package_file("vllm", here, up) == "v1/attention/backends/utils.py"
    assert E._package_file("vllm", here, ast.parse("from vllm.platforms import p").body[0]) is None   # a package
    assert "vllm" not in sys.modules


class Checked(SV.Engine):
    """The vLLM engine, each launch compared with its torch peer right after it ran."""

    def prepare(self, b):
        super().prepare(b)
        qs = self.query_start_loc[: b + 1].tolist()
        for r in range(b):
            done = int(self.num_computed[int(self.idx_mapping[r])])
            assert int(self.seq_lens[r]) == done + qs[r + 1] - qs[r]
            assert self.positions[qs[r]:qs[r + 1]].tolist() == list(range(done, done + qs[r + 1] - qs[r]))
        assert (self.seq_lens[b:] == 0).all()      # the padded requests' lengths zeroed
        self.checked.add("prepare")

    def cache_write(self, k, v, ntok):
        before = self.k_cache.clone()
        super().cache_write(k, v, ntok)
        check_cache_write(self, before, k, v)
        self.checked.add("cache")

    def attention(self, q, b, max_q):
        super().attention(q, b, max_q)
        check_attention(self, q, b, flash_rows(self.k_cache), flash_rows(self.v_cache))
        self.checked.add("attention")

    def moe(self, x):
        self.moe_out.zero_()
        self.moe_down.zero_()
        super().moe(x)
        ntok = x.shape[0]
        ids = self.topk_ids[: ntok * 2].long()
        w = torch.topk(torch.softmax(x @ self.router, -1), 2, dim=-1).values.reshape(-1)
        self.checked.add("moe naive" if ntok * 2 * 4 <= SV.EXPERTS_VLLM else "moe aligned")
        for p in range(ntok * 2):   # each (token, slot): the gate/up projection by its expert, then the down one
            up = self.w13[ids[p]] @ x[p // 2]
            torch.testing.assert_close(self.moe_out[p // 2, p % 2], up, atol=1e-3, rtol=1e-3)
            act = torch.nn.functional.silu(up[: self.ffn]) * up[self.ffn:]
            torch.testing.assert_close(self.moe_down[p // 2, p % 2], w[p] * (self.w2[ids[p]] @ act),
                                       atol=1e-3, rtol=1e-3)


@pytest.mark.slow
def test_vllm_kernels_match_torch_over_a_serving_loop():
    run = parse(["--scale", "0.25", "--seed", "3"], "t", calls=20)
    eng = Checked(run, run.scale)
    eng.checked = set()
    for _ in range(run.calls):
        eng.step()
    # both MoE paths ran: one (token, expert) pair a block for the sparse decode batches, the
    # sorted, padded order for the batches with prefill chunks
    assert eng.checked == {"prepare", "cache", "attention", "moe naive", "moe aligned"}
    assert eng.next_rid > 3 and len(eng.free_slots) > S.MAX_REQS - eng.next_rid   # some finished
    assert len(eng.free_pages) + sum(len(r.pages) for r in eng.running + eng.waiting) == eng.pool_pages


@pytest.mark.slow
def test_datasets_make_records_the_vllm_loop_with_its_index_values(tmp_path):
    from pagecast.datasets.registry import make_trace
    out = make_trace("serving-vllm", tmp_path / "v.pctrace", scale=0.25, seed=5)
    tr = read_recording(out, corpus.SERVING_VLLM_KERNELS)
    assert_recorded_padding(tr, "reshape_and_cache_kernel_flash")
