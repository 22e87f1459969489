"""The real-kernel corpus: the kernels compute what their peers (torch) compute under the
interpreter with the compatibility fixes, and `datasets make` records the programs."""

from __future__ import annotations

import os
import warnings

os.environ["TRITON_INTERPRET"] = "1"   # before any @triton.jit

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pagecast import trace as T
from pagecast.collect import interpret_compat
from pagecast.datasets import corpus
from pagecast.datasets.corpus import gather_kernels as G
from pagecast.datasets.corpus import tutorial_kernels as K

interpret_compat.apply_all()
GEN = torch.Generator().manual_seed(0)


def _randn(*shape):
    return torch.randn(*shape, generator=GEN)


def test_tutorial_kernels_match_torch():
    x, y = _randn(3000), _randn(3000)
    assert torch.equal(K.add(x, y, torch.empty(3000)), x + y)
    s = _randn(50, 300)
    torch.testing.assert_close(K.softmax(s, torch.empty(50, 300)), torch.softmax(s, -1))
    a, b = _randn(70, 40), _randn(40, 90)
    torch.testing.assert_close(K.matmul(a, b, torch.empty(70, 90)), a @ b, atol=1e-4, rtol=1e-4)
    out = K.seeded_dropout(torch.ones(20000), torch.empty(20000), 0.25, 7)
    assert set(out.unique().tolist()) <= {0.0, float(torch.tensor(1 / 0.75))} and abs((out == 0).float().mean() - 0.25) < 0.02
    assert torch.equal(out, K.seeded_dropout(torch.ones(20000), torch.empty(20000), 0.25, 7))
    xs = _randn(37, 200).requires_grad_()
    w, bb = _randn(200).requires_grad_(), _randn(200).requires_grad_()
    yy, mean, rstd = torch.empty(37, 200), torch.empty(37), torch.empty(37)
    block, warps = K.layer_norm_fwd(xs.detach(), w.detach(), bb.detach(), 1e-5, yy, mean, rstd)
    ref = F.layer_norm(xs, (200,), w, bb, 1e-5)
    torch.testing.assert_close(yy, ref.detach(), atol=1e-5, rtol=1e-5)
    dy = _randn(37, 200)
    ref.backward(dy)
    dx, dw, db = torch.empty(37, 200), torch.empty(200), torch.empty(200)
    K.layer_norm_bwd(dy, xs.detach(), w.detach(), mean, rstd, dx, dw, db, block, warps)
    for got, want in ((dx, xs.grad), (dw, w.grad), (db, bb.grad)):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    q, k, v = (_randn(1, 2, 45, 32) for _ in range(3))
    for causal in (False, True):
        got = K.attention(q, k, v, torch.empty(1, 2, 45, 32), causal)
        torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                                   atol=1e-4, rtol=1e-4)


def test_data_dependent_kernels_match_torch():
    table, idx = _randn(300, 70), torch.randint(0, 300, (40,), generator=GEN)
    assert torch.equal(G.embedding_gather(idx, table, torch.empty(40, 70)), table[idx])
    src = _randn(40, 70)
    torch.testing.assert_close(G.scatter_add(idx, src, torch.zeros(300, 70)),
                               torch.zeros(300, 70).index_add_(0, idx, src))


def test_liger_ops_match_torch_with_the_fixes():
    """Each fix is needed by some of these (docs/collect.md), and none changes a result."""
    from liger_kernel.ops.geglu import LigerGELUMulFunction
    from liger_kernel.ops.layer_norm import LigerLayerNormFunction
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction
    x, w = _randn(16, 64).requires_grad_(), _randn(64).requires_grad_()
    y = LigerRMSNormFunction.apply(x, w, 1e-6)
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)
    g = _randn(16, 64)
    (rx,) = torch.autograd.grad(ref, x, g.clone())
    (gx,) = torch.autograd.grad(y, x, g)          # Liger's backward writes dX over dY (in_place)
    torch.testing.assert_close(gx, rx, atol=1e-4, rtol=1e-4)
    b = _randn(64)
    torch.testing.assert_close(LigerLayerNormFunction.apply(x, w, b, 1e-6), F.layer_norm(x, (64,), w, b, 1e-6),
                               atol=1e-5, rtol=1e-5)
    a, c = _randn(8, 96), _randn(8, 96)
    torch.testing.assert_close(LigerGELUMulFunction.apply(a, c), F.gelu(a, approximate="tanh") * c,
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(LigerSiLUMulFunction.apply(a, c), F.silu(a) * c, atol=1e-5, rtol=1e-5)


def test_registry_lists_and_describes_the_corpus():
    assert set(corpus.CORPUS) == {"liger", "liger-prealloc", "tutorials", "tutorials-prealloc", "data-dependent",
                                  "serving", "serving-vllm", "serving-vllm-rocm"}
    assert corpus.CORPUS["data-dependent"].irregular == ("embedding_gather_kernel", "scatter_add_kernel")
    with pytest.raises(Exception, match="unknown corpus workload"):
        corpus.get("nope")


def test_datasets_make_records_a_corpus_program(tmp_path):
    from pagecast.cli import main
    from pagecast.datasets.registry import reuse_or_make
    out = tmp_path / "dd.pctrace"
    assert main(["datasets", "make", "data-dependent", "-o", str(out), "--scale", "0.1", "--seed", "4"]) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", T.TraceWarning)
        tr = T.read_trace(out)
    wl = tr.manifest["workload"]
    assert (wl["name"], wl["scale"], wl["seed"], wl["revision"]) == ("data-dependent", 0.1, 4, corpus.REVISION)
    assert tr.complete and tr.truth.num_rows > 0 and tr.faults.num_rows > 0
    assert set(tr.launches.column(T.KERNEL).to_pylist()) == {"embedding_gather_kernel", "scatter_add_kernel"}
    mtime = (out / T.MANIFEST).stat().st_mtime_ns
    assert reuse_or_make("data-dependent", out, scale=0.1, seed=4) == out
    assert (out / T.MANIFEST).stat().st_mtime_ns == mtime          # reused, not recorded again
    assert main(["datasets", "make", "data-dependent", "-o", str(out), "--mode", "natural", "--force"]) == 2


@pytest.mark.slow
def test_preallocated_buffers_are_used_in_part(tmp_path):
    from pagecast.datasets.registry import make_trace
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", T.TraceWarning)
        fresh = T.read_trace(make_trace("tutorials", tmp_path / "f", scale=0.05, seed=1))
        pre = T.read_trace(make_trace("tutorials-prealloc", tmp_path / "p", scale=0.05, seed=1))
    kernels = {"add_kernel", "softmax_kernel", "matmul_kernel", "_seeded_dropout", "_layer_norm_fwd_fused",
               "_layer_norm_bwd_dx_fused", "_layer_norm_bwd_dwdb", "_attn_fwd"}
    assert set(fresh.launches.column(T.KERNEL).to_pylist()) == kernels
    assert set(pre.launches.column(T.KERNEL).to_pylist()) == kernels
    assert pre.n_launches == fresh.n_launches
    # the same buffers again and again: fewer allocations, each touched in part by some launch
    assert pre.allocations.num_rows < fresh.allocations.num_rows
    # (whether a buffer the program dropped is recorded as freed at the last launch or as live at
    # the end depends on when Python's collector runs, so lifetimes are compared, not nulls)
    assert _long_lived(pre) > _long_lived(fresh)
    assert _touched_in_part(pre) > _touched_in_part(fresh)


def _long_lived(trace) -> int:
    """Allocations that live through at least half of the trace's launches."""
    a = trace.allocations
    first = a.column(T.FIRST_LAUNCH).to_numpy()
    last = a.column(T.LAST_LAUNCH).fill_null(trace.n_launches - 1).to_numpy()
    return int(np.count_nonzero(last - first >= trace.n_launches // 2))


def _touched_in_part(trace) -> int:
    """(launch, allocation) pairs where the launch's truth covers less than the whole allocation."""
    a, t = trace.allocations, trace.truth
    lo = a.column(T.ADDRESS).to_numpy().astype(np.int64)
    hi = lo + a.column(T.BYTES).to_numpy()
    addr = t.column(T.ADDRESS).to_numpy().astype(np.int64)
    size = t.column(T.BYTES).to_numpy()
    lid = t.column(T.LAUNCH_ID).to_numpy()
    first = a.column(T.FIRST_LAUNCH).to_numpy()
    last = a.column(T.LAST_LAUNCH).fill_null(trace.n_launches - 1).to_numpy()
    covered: dict[tuple[int, int], int] = {}
    for x, n, launch in zip(addr, size, lid):
        for k in np.flatnonzero((lo <= x) & (x < hi) & (first <= launch) & (launch <= last)):
            covered[(int(launch), int(k))] = covered.get((int(launch), int(k)), 0) + int(n)
    return sum(1 for (_, k), n in covered.items() if n < hi[k] - lo[k])
