"""Checks shared by the serving corpora's tests (test_serving_corpus.py, test_serving_vllm_corpus.py,
test_serving_vllm_rocm_corpus.py): what a cache write through a -1-padded slot mapping must leave
behind, vLLM's attention over a block table against torch, and the padding a recorded cache
write's index values must hold."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from pagecast import trace as T
from pagecast.datasets.corpus import serving as S


def flash_rows(cache: torch.Tensor) -> torch.Tensor:
    """A cache as a row per slot ([slot, kv head, head_dim]): the flash layout's own view."""
    return cache.view(-1, S.KV_HEADS, S.HEAD_DIM)


def check_cache_write(eng, before: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_rows=flash_rows,
                      v_rows=flash_rows) -> None:
    """The first len(k) slots hold k and v; every other row of the K cache is as it was (the -1
    slots past them wrote nothing). `k_rows`, `v_rows`: a cache as a row per slot."""
    ntok = k.shape[0]
    slots = eng.slot_mapping[:ntok]
    assert (slots >= 0).all() and (eng.slot_mapping[ntok:] == -1).all()
    kc = k_rows(eng.k_cache)
    assert torch.equal(kc[slots], k) and torch.equal(v_rows(eng.v_cache)[slots], v)
    untouched = torch.ones(kc.shape[0], dtype=torch.bool)
    untouched[slots] = False
    assert torch.equal(kc[untouched], k_rows(before)[untouched])


def check_attention(eng, q: torch.Tensor, b: int, kb: torch.Tensor, vb: torch.Tensor) -> list[int]:
    """Each of the batch's `b` requests' queries attended causally over its block-table row up
    to its sequence length: the attention output rows equal torch's. `kb`, `vb`: the caches as
    a row per slot. Returns the requests' query lengths."""
    qs = eng.query_start_loc[: b + 1].tolist()
    g = S.HEADS // S.KV_HEADS
    lens = [qs[r + 1] - qs[r] for r in range(b)]
    for r in range(b):
        n = int(eng.seq_lens[r])
        pos = torch.arange(n)
        idx = eng.input_table[r][pos // S.PAGE].long() * S.PAGE + pos % S.PAGE
        k = kb[idx].repeat_interleave(g, dim=1)
        v = vb[idx].repeat_interleave(g, dim=1)
        for t in range(lens[r]):   # causal: query token t sees the prefix and itself
            see = n - lens[r] + t + 1
            att = torch.softmax(torch.einsum("hd,nhd->hn", q[qs[r] + t], k[:see]) * S.HEAD_DIM ** -0.5, -1)
            torch.testing.assert_close(eng.att_out[qs[r] + t], torch.einsum("hn,nhd->hd", att, v[:see]),
                                       atol=1e-4, rtol=1e-4)
    return lens


def read_recording(path, kernels: tuple[str, ...]) -> T.Trace:
    """The recorded trace: every kernel of the corpus launched, index values recorded."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", T.TraceWarning)
        tr = T.read_trace(path)
    assert set(tr.launches.column(T.KERNEL).to_pylist()) == set(kernels)
    assert tr.values is not None and tr.values.num_rows > 0
    return tr


def assert_recorded_padding(tr: T.Trace, cache_kernel: str) -> None:
    """The cache write's recorded slot mapping holds the -1 padding the kernel skips."""
    kern = np.array(tr.launches.column(T.KERNEL).to_pylist())
    lid = tr.launches.column(T.LAUNCH_ID).to_numpy()
    cw = set(lid[kern == cache_kernel].tolist())
    vl = tr.values.column(T.LAUNCH_ID).to_numpy()
    rows = [bytes(b) for b, launch in zip(tr.values.column(T.DATA).to_pylist(), vl) if launch in cw]
    assert any((np.frombuffer(b[: len(b) // 8 * 8], "<i8") == -1).any() for b in rows)
