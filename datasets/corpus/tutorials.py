"""The Triton-tutorial kernels (tutorial_kernels.py), each called `--calls` times with a shape
drawn per call from sizes that follow `--scale`; `--buffers preallocated` takes every
tensor as a prefix of a buffer allocated once at its largest size.

    pagecast collect --interpret -- python -m pagecast.datasets.corpus.tutorials --scale 1
"""

from __future__ import annotations

import sys

from . import tutorial_kernels as K
from .corpus_run import Tensors, parse

VEC = 1 << 18         # vector add and dropout: elements
ROWS, COLS = 128, 1024  # softmax and layer norm
MM = 256             # matmul: M, N, K
CTX, HEADS, HEAD_DIM = 256, 4, 64   # attention: sequence length, heads, head size


def main(argv=None) -> int:
    run = parse(argv, __doc__.splitlines()[0])
    t = Tensors(run)
    sp = (0.5, 1.0, 1.5, 2.0)
    vec, rows, cols, mm, ctx = (run.most(VEC, sp, multiple=128), run.most(ROWS, sp), run.most(COLS, sp, multiple=8),
                                run.most(MM, sp, multiple=8), run.most(CTX, sp, multiple=8))
    for role, n in (("add.x", vec), ("add.y", vec), ("add.out", vec), ("drop.x", vec), ("drop.out", vec),
                    ("sm.x", rows * cols), ("sm.y", rows * cols), ("ln.x", rows * cols), ("ln.y", rows * cols),
                    ("ln.w", cols), ("ln.b", cols), ("ln.mean", rows), ("ln.rstd", rows), ("ln.dy", rows * cols),
                    ("ln.dx", rows * cols), ("ln.dw", cols), ("ln.db", cols), ("mm.a", mm * mm), ("mm.b", mm * mm),
                    ("mm.c", mm * mm), *((f"attn.{r}", HEADS * ctx * HEAD_DIM) for r in "qkvo")):
        t.reserve(role, n)
    for call in range(run.calls):
        n = run.pick(VEC, sp, multiple=128)
        x, y = t.randn("add.x", n), t.randn("add.y", n)
        K.add(x, y, t.empty("add.out", n))
        K.seeded_dropout(t.randn("drop.x", n), t.empty("drop.out", n), 0.25, run.seed * 1000 + call)

        r, c = run.pick(ROWS, sp), run.pick(COLS, sp, multiple=8)
        K.softmax(t.randn("sm.x", r, c), t.empty("sm.y", r, c))

        x, w, b = t.randn("ln.x", r, c), t.randn("ln.w", c), t.randn("ln.b", c)
        y, mean, rstd = t.empty("ln.y", r, c), t.empty("ln.mean", r), t.empty("ln.rstd", r)
        block, warps = K.layer_norm_fwd(x, w, b, 1e-5, y, mean, rstd)
        K.layer_norm_bwd(t.randn("ln.dy", r, c), x, w, mean, rstd, t.empty("ln.dx", r, c), t.empty("ln.dw", c),
                         t.empty("ln.db", c), block, warps)

        m, k_, n_ = (run.pick(MM, sp, multiple=8) for _ in range(3))
        K.matmul(t.randn("mm.a", m, k_), t.randn("mm.b", k_, n_), t.empty("mm.c", m, n_))

        s = run.pick(CTX, sp, multiple=8)
        q, k, v = (t.randn(f"attn.{r_}", 1, HEADS, s, HEAD_DIM) for r_ in "qkv")
        K.attention(q, k, v, t.empty("attn.o", 1, HEADS, s, HEAD_DIM), causal=bool(call % 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
