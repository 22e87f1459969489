"""The data-dependent kernels (gather_kernels.py): an embedding gather and a scatter-add with
atomics over random indices, `--calls` times with shapes drawn per call from sizes that
follow `--scale`.

    pagecast collect --interpret -- python -m pagecast.datasets.corpus.data_dependent --scale 1
"""

from __future__ import annotations

import sys

from . import gather_kernels as G
from .corpus_run import Tensors, parse

VOCAB, DIM, LOOKUPS = 16384, 512, 96


def main(argv=None) -> int:
    run = parse(argv, __doc__.splitlines()[0])
    t = Tensors(run)
    sp = (0.5, 1.0, 1.5, 2.0)
    vocab, dim, n = run.most(VOCAB, sp, multiple=64), run.most(DIM, sp, multiple=16), run.most(LOOKUPS, sp)
    for role, size in (("table", vocab * dim), ("idx", n), ("out", n * dim), ("src", n * dim), ("acc", vocab * dim)):
        t.reserve(role, size)
    t.reserve("idx", n, t.torch.int64)
    for _ in range(run.calls):
        v, d, k = run.pick(VOCAB, sp, multiple=64), run.pick(DIM, sp, multiple=16), run.pick(LOOKUPS, sp)
        idx = t.randint("idx", v, k)
        G.embedding_gather(idx, t.randn("table", v, d), t.empty("out", k, d))
        G.scatter_add(t.randint("idx", v, k), t.randn("src", k, d), t.zeros("acc", v, d))
    return 0


if __name__ == "__main__":
    sys.exit(main())
