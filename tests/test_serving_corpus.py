"""The serving corpus (datasets/corpus/serving.py): sglang's and flashinfer's Triton kernels,
loaded from the installed packages (datasets/corpus/engines.py), compute under the interpreter
what their torch peers compute, step after step of the engine loop, and `datasets make serving`
records them with their index values."""

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
from pagecast.datasets.corpus.corpus_run import parse
from serving_checks import assert_recorded_padding, check_cache_write, read_recording

interpret_compat.apply_all()


def test_kernels_load_from_the_installed_files_without_importing_the_engines():
    mod = E.load("flashinfer", "triton/page.py")
    fn = mod.get_batch_indices_positions_kernel.fn
    assert fn.__code__.co_filename.startswith(str(E.package_dir("flashinfer")))
    moe = E.load("sglang", "kernels/ops/moe/fused_moe_triton_kernels.py")
    assert "fused_moe_kernel" in vars(moe)
    assert "sglang" not in sys.modules and "flashinfer" not in sys.modules
    with pytest.raises(E.EngineMissing, match="not found"):
        E.load("sglang", "kernels/ops/no_such_file.py")


class Checked(S.Engine):
    """The engine, each launch compared with its torch peer right after it ran."""

    def embedding(self, ntok):
        out = super().embedding(ntok)
        assert torch.equal(out, self.emb_w[self.input_ids[:ntok]])
        self.checked.add("embedding")
        return out

    def batch_positions(self, b):
        super().batch_positions(b)
        ip, lens = self.append_indptr[: b + 1].tolist(), self.seq_lens[:b].tolist()
        for r in range(b):
            s, e = ip[r], ip[r + 1]
            assert (self.batch_indices[s:e] == r).all()
            assert self.positions[s:e].tolist() == list(range(lens[r] - (e - s), lens[r]))
        self.checked.add("positions")

    def cache_write(self, k, v):
        before = self.k_cache.clone()
        super().cache_write(k, v)
        check_cache_write(self, before, k, v)
        self.checked.add("cache")

    def kv_indices_from_table(self, nd):
        super().kv_indices_from_table(nd)
        ip = self.kv_indptr[: nd + 1].tolist()
        for r in range(nd):
            n = int(self.seq_lens[r])
            row = self.req_to_page[int(self.req_pool_indices[r])]
            pos = torch.arange(n)
            want = row[pos // S.PAGE].long() * S.PAGE + pos % S.PAGE
            assert torch.equal(self.kv_indices[ip[r]:ip[r + 1]].long(), want)
        self.checked.add("kv_indices")

    def decode_attention(self, q, nd):
        super().decode_attention(q, nd)
        ip = self.kv_indptr[: nd + 1].tolist()
        kb = self.k_cache.view(-1, S.KV_HEADS, S.HEAD_DIM)
        vb = self.v_cache.view(-1, S.KV_HEADS, S.HEAD_DIM)
        g = S.HEADS // S.KV_HEADS
        for r in range(nd):
            idx = self.kv_indices[ip[r]:ip[r + 1]].long()
            k = kb[idx].repeat_interleave(g, dim=1)         # [n, heads, d]
            v = vb[idx].repeat_interleave(g, dim=1)
            att = torch.softmax(torch.einsum("hd,nhd->hn", q[r], k) * S.HEAD_DIM ** -0.5, -1)
            torch.testing.assert_close(self.att_o[r], torch.einsum("hn,nhd->hd", att, v), atol=1e-4, rtol=1e-4)
        self.checked.add("attention")

    def extend_attention(self, q, nd, ne):
        super().extend_attention(q, nd, ne)
        qo = self.ext_qo_indptr[: ne + 1].tolist()
        kb = self.k_cache.view(-1, S.KV_HEADS, S.HEAD_DIM)
        vb = self.v_cache.view(-1, S.KV_HEADS, S.HEAD_DIM)
        g = S.HEADS // S.KV_HEADS
        for r in range(ne):
            n = int(self.seq_lens[nd + r])
            row = self.req_to_page[int(self.req_pool_indices[nd + r])]
            npg = -(-n // S.PAGE)
            assert torch.equal(self.page_table[r, :npg], row[:npg])     # the block table's row
            pos = torch.arange(n)
            idx = row[pos // S.PAGE].long() * S.PAGE + pos % S.PAGE
            k = kb[idx].repeat_interleave(g, dim=1)
            v = vb[idx].repeat_interleave(g, dim=1)
            ql = qo[r + 1] - qo[r]
            for t in range(ql):   # causal: query token t of the chunk sees the prefix and itself
                see = n - ql + t + 1
                att = torch.softmax(torch.einsum("hd,nhd->hn", q[qo[r] + t], k[:see]) * S.HEAD_DIM ** -0.5, -1)
                torch.testing.assert_close(self.ext_out[qo[r] + t, :, 0], torch.einsum("hn,nhd->hd", att, v[:see]),
                                           atol=1e-4, rtol=1e-4)
        self.checked.add("extend")

    def moe(self, x):
        super().moe(x)
        ntok = x.shape[0]
        numel = ntok * S.TOP_K
        ids = self.topk_ids[:numel].long()
        total = int(self.post_pad)
        sorted_ids = self.sorted_ids[:total].long()
        valid = sorted_ids < numel
        assert sorted(sorted_ids[valid].tolist()) == list(range(numel))      # every (token, slot) once
        blocks = self.expert_ids[: total // S.BLOCK_M].long()
        assert torch.equal(ids[sorted_ids[valid]], blocks.repeat_interleave(S.BLOCK_M)[valid])
        for p in range(numel):   # the gate/up projection of each (token, slot) by its expert
            want = self.w13[ids[p]] @ x[p // S.TOP_K]
            torch.testing.assert_close(self.moe_out[p], want, atol=1e-3, rtol=1e-3)
        self.checked.add("moe")


@pytest.mark.slow
def test_engine_kernels_match_torch_over_a_serving_loop():
    run = parse(["--scale", "0.25", "--seed", "3"], "t", calls=10)
    eng = Checked(run, run.scale)
    eng.checked = set()
    for _ in range(run.calls):
        eng.step()
    assert eng.checked == {"embedding", "positions", "cache", "kv_indices", "attention", "extend", "moe"}
    assert eng.next_rid > 3        # requests arrived, finished, and their pages went back
    assert len(eng.free_pages) + sum(len(r.pages) for r in eng.running + eng.waiting) == eng.pool_pages


@pytest.mark.slow
def test_datasets_make_records_the_serving_loop_with_its_index_values(tmp_path):
    from pagecast.datasets.registry import make_trace
    out = make_trace("serving", tmp_path / "s.pctrace", scale=0.25, seed=5)
    tr = read_recording(out, corpus.SERVING_KERNELS)
    assert corpus.CORPUS["serving"].irregular == corpus.SERVING_KERNELS
    assert_recorded_padding(tr, "reshape_and_cache_flash")
