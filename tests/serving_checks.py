"""Checks shared by the serving corpora's tests (test_serving_corpus.py, test_serving_vllm_corpus.py,
test_serving_vllm_rocm_corpus.py):
what a cache write through a -1-padded slot mapping must leave behind, and the padding a recorded
cache write's index values must hold."""

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
