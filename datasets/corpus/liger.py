"""Liger-Kernel's Triton ops, forward and backward (through autograd), `--calls` times each with
shapes drawn per call from sizes that follow `--scale`: RMSNorm, LayerNorm, SwiGLU, GeGLU,
RoPE, cross-entropy, fused linear cross-entropy, softmax, group norm, KL divergence, JSD.
`--buffers preallocated` takes every input as a prefix of a buffer allocated once at its
largest size (Liger's own host code still allocates its outputs and gradients).

    pagecast collect --interpret -- python -m pagecast.datasets.corpus.liger --scale 1

Needs liger-kernel (pip install --no-deps liger-kernel packaging: its own requirements would
replace torch).
"""

from __future__ import annotations

import sys

import torch
from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction
from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction
from liger_kernel.ops.geglu import LigerGELUMulFunction
from liger_kernel.ops.group_norm import LigerGroupNormFunction
from liger_kernel.ops.jsd import LigerJSDFunction
from liger_kernel.ops.kl_div import LigerKLDivLossFunction
from liger_kernel.ops.layer_norm import LigerLayerNormFunction
from liger_kernel.ops.rms_norm import LigerRMSNormFunction
from liger_kernel.ops.rope import LigerRopeFunction
from liger_kernel.ops.softmax import LigerSoftmaxFunction
from liger_kernel.ops.swiglu import LigerSiLUMulFunction

from .corpus_run import Tensors, parse

ROWS, HIDDEN, INTER, VOCAB = 96, 1024, 2048, 4096
HEADS, KV_HEADS, SEQ, HEAD_DIM = 8, 4, 128, 64
GN_CHANNELS, GN_GROUPS, GN_LEN = 16, 4, 2048


def main(argv=None) -> int:
    run = parse(argv, __doc__.splitlines()[0])
    t = Tensors(run)
    sp = (0.5, 1.0, 1.5, 2.0)
    rows, hidden, inter, vocab = (run.most(ROWS, sp), run.most(HIDDEN, sp, multiple=16), run.most(INTER, sp, multiple=16),
                                  run.most(VOCAB, sp, multiple=16))
    seq, gn_len = run.most(SEQ, sp), run.most(GN_LEN, sp, multiple=8)
    for role, n in (("x", rows * max(hidden, inter, vocab)), ("y", rows * max(inter, vocab)), ("w", vocab * hidden),
                    ("b", max(hidden, GN_CHANNELS)), ("q", HEADS * seq * HEAD_DIM), ("k", KV_HEADS * seq * HEAD_DIM),
                    ("cos", seq * HEAD_DIM), ("sin", seq * HEAD_DIM), ("gn", GN_CHANNELS * gn_len * 2),
                    ("dy", rows * max(hidden, inter, vocab))):
        t.reserve(role, n)
    t.reserve("target", rows, torch.int64)

    def leaf(x):
        return x.requires_grad_()

    for _ in range(run.calls):
        r, h = run.pick(ROWS, sp), run.pick(HIDDEN, sp, multiple=16)
        x, w = leaf(t.randn("x", r, h)), leaf(t.randn("w", h))
        LigerRMSNormFunction.apply(x, w, 1e-6).backward(t.randn("dy", r, h))
        x, w, b = leaf(t.randn("x", r, h)), leaf(t.randn("w", h)), leaf(t.randn("b", h))
        LigerLayerNormFunction.apply(x, w, b, 1e-6).backward(t.randn("dy", r, h))
        i = run.pick(INTER, sp, multiple=16)
        for op in (LigerSiLUMulFunction, LigerGELUMulFunction):
            a, g = leaf(t.randn("x", r, i)), leaf(t.randn("y", r, i))
            op.apply(a, g).backward(t.randn("dy", r, i))
        s = run.pick(SEQ, sp)
        q, k = leaf(t.randn("q", 1, HEADS, s, HEAD_DIM)), leaf(t.randn("k", 1, KV_HEADS, s, HEAD_DIM))
        cos, sin = t.randn("cos", 1, s, HEAD_DIM), t.randn("sin", 1, s, HEAD_DIM)
        q2, k2 = LigerRopeFunction.apply(q, k, cos, sin)
        (q2.sum() + k2.sum()).backward()
        v = run.pick(VOCAB, sp, multiple=16)
        logits, target = leaf(t.randn("x", r, v)), t.randint("target", v, r)
        LigerCrossEntropyFunction.apply(logits, target, None)[0].backward()
        x, wv = leaf(t.randn("x", r, h)), leaf(t.randn("w", v, h, scale=0.05))
        LigerFusedLinearCrossEntropyFunction.apply(x, wv, t.randint("target", v, r))[0].backward()
        x = leaf(t.randn("x", r, v))
        LigerSoftmaxFunction.apply(x).backward(t.randn("dy", r, v))
        ln = run.pick(GN_LEN, sp, multiple=8)
        x = leaf(t.randn("gn", 2, GN_CHANNELS, ln))
        w, b = leaf(t.randn("w", GN_CHANNELS)), leaf(t.randn("b", GN_CHANNELS))
        LigerGroupNormFunction.apply(x, w, b, GN_CHANNELS, GN_GROUPS, 1e-6).backward(t.randn("dy", 2, GN_CHANNELS, ln))
        def logp(role, probs=False):
            z = torch.randn(r, v, generator=t.gen)
            return t.holding(role, z.softmax(-1) if probs else z.log_softmax(-1))

        LigerKLDivLossFunction.apply(leaf(logp("x")), logp("y", True), "batchmean", False, 1e-10).backward()
        LigerJSDFunction.apply(leaf(logp("x")), logp("y"), None, 0.5, -100).backward()
    return 0


if __name__ == "__main__":
    sys.exit(main())
