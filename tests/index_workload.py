"""A hand-made data-dependent workload for the tests of the values table and indexed templates:
a kernel writes a small index buffer, an unrelated kernel runs, and a gather reads the rows of a
table the indices name (so its values are written two launches before it reads them).

    write_ids(ids*, n)            writes ids[0:n]
    scale(buf*, n)                reads and writes buf[0:n] (floats), nothing to do with the ids
    gather_rows(out*, table*, ids*, n, dim)   reads table[ids[i]] (dim floats) for i < n
"""

from __future__ import annotations

import numpy as np

from pagecast.datasets.engine import READWRITE, WRITE, Builder, Kernel, Range, Ranges
from pagecast.predict.formula import Formula
from pagecast.predict.model_io import Region

K_WRITE = Kernel("write_ids", [("ids", "int*"), ("n", "int")], {"ids": "linear"})
K_SCALE = Kernel("scale_buf", [("buf", "float*"), ("n", "int")], {"buf": "linear"})
K_GATHER = Kernel("gather_rows", [("out", "float*"), ("table", "const float*"), ("ids", "const int*"),
                                  ("n", "int"), ("dim", "int")],
                  {"out": "linear", "table": "indexed", "ids": "linear"})


def build(seed: int = 0, steps: int = 24, rows: int = 4096, dim: int = 2048, n: int = 3, big: int = 6 << 20,
          record: bool = True) -> Builder:
    """steps x (write_ids, scale_buf, gather_rows): `n` row ids per step out of `rows` rows of `dim` floats."""
    b = Builder("index-gather", seed=seed)
    rng = b.rng
    table = b.malloc(4 * rows * dim, "table")
    ids = b.malloc(4096, "ids")
    out = b.malloc(4 * n * dim, "out")
    buf = b.malloc(big, "buf")
    for _ in range(steps):
        v = rng.choice(rows, n, replace=False).astype(np.int64)
        i0 = b.reserve(3)
        b.launch(K_WRITE, [i0], {"ids": ids.ptr(), "n": n}, grid=(1,), touches=[Range(ids, 0, 4 * n, WRITE)])
        b.launch(K_SCALE, [i0 + 1], {"buf": buf.ptr(), "n": big // 4}, grid=(big // 1024,),
                 touches=[Range(buf, 0, big, READWRITE)])
        b.launch(K_GATHER, [i0 + 2], {"out": out.ptr(), "table": table.ptr(), "ids": ids.ptr(), "n": n, "dim": dim},
                 grid=(n,), touches=[Range(ids, 0, 4 * n), Range(out, 0, 4 * n * dim, WRITE),
                                     Ranges(table, np.zeros(n, np.int64), v * 4 * dim, 4 * dim)])
        if record:
            b.values(K_GATHER, "ids", [i0 + 2], ids.ptr(), v.astype("<i4")[None])
    return b


def indexed_region() -> Region:
    """gather_rows' table region as a template: [p1 + 4*p4*v(p2)[i], +4*p4) for i < p3."""
    per_row = Formula(0, ((4, ("p4",)),))
    return Region("p1", "indexed", start=Formula(0), stride=per_row, chunk=per_row,
                  count=Formula(0, ((1, ("p3",)),)), index="p2", elem=4)


def with_indexed(model):
    """`model` with gather_rows' table predicted by the indexed region (in place of what was fitted)."""
    for name, km in model.kernels.items():
        if "gather_rows" in name:
            km.regions = [r for r in km.regions if r.base != "p1"] + [indexed_region()]
    return model
