"""What each GPU workload kernel reads and writes: its footprint, from its C code.

`EXTENTS[kernel](a, v, grid, block)` lists (pointer parameter, first element, end element) relative
to where that pointer argument points: `a` maps parameter names to the launch's scalar values,
`v(name, n=1)` gives the first `n` values a pointer argument points at (data-dependent accesses:
an embedding row chosen by a token, a CSR block's column indices), `grid` and `block` the launch
shape. `signatures(code)` reads each `extern "C"` kernel's parameters from a module's source.

The workloads record their own launches' footprints with these (`common.Gpu`, when
PAGECAST_FOOTPRINTS names a file: the oracle's truth, attached to a collected trace by `truth.py`),
and tests/test_collect_workloads.py checks every launch's extents against its arrays' bounds.
"""

from __future__ import annotations

import re

import numpy as np

C_SCALARS = {"int": np.int32, "long": np.int64, "float": np.float32, "unsigned long": np.uint64,
             "unsigned int": np.uint32}
C_POINTEES = {"float": np.float32, "int": np.int32, "long": np.int64, "bf16": np.uint16}


def signatures(code: str) -> dict[str, list[tuple[str, str]]]:
    """kernel -> [(C type, parameter name)] for every extern "C" kernel in the source."""
    out = {}
    for name, params in re.findall(r'extern "C" __global__ void (\w+)\(([^)]*)\)', code):
        ps = []
        for q in (q.strip() for q in params.split(",")):
            if "*" in q:
                t, n = q.rsplit("*", 1)
                ps.append((t.strip() + "*", n.strip()))
            else:
                *t, n = q.split()
                ps.append((" ".join(t), n))
        out[name] = ps
    return out


def _gemm(a, ta=False, tb=False):
    M, N, K = a["M"], a["N"], a["K"]
    A = (K - 1) * a["lda"] + M if ta else (M - 1) * a["lda"] + K
    B = (N - 1) * a["ldb"] + K if tb else (K - 1) * a["ldb"] + N
    return [("A", 0, A), ("B", 0, B), ("C", 0, (M - 1) * a["ldc"] + N)]


EXTENTS = {
    "jacobi2d_sweep": lambda a, v, g, b: [("out", 0, a["nx"] * a["ny"]), ("in", -a["nx"], (a["ny"] + 1) * a["nx"])],
    "jacobi2d_halo": lambda a, v, g, b: [("u", 0, (a["ny"] + 2) * a["nx"])],
    "jacobi2d_restrict": lambda a, v, g, b: [("coarse", 0, a["nxc"] * a["nyc"]), ("fine", 0, 4 * a["nxc"] * a["nyc"])],
    "jacobi2d_prolong": lambda a, v, g, b: [("fine", 0, 4 * a["nxc"] * a["nyc"]), ("coarse", 0, a["nxc"] * a["nyc"])],
    "jacobi2d_residual": lambda a, v, g, b: [("u", -a["nx"], (a["ny"] + 1) * a["nx"]),
                                            ("partial", 0, int(np.prod(g)))],
    "reduce_sum": lambda a, v, g, b: [("partial", 0, a["n"]), ("result", 0, 1)],
    "spmv_csr_block": lambda a, v, g, b: [("rowptr", 0, a["nrows"] + 1), ("colind", 0, a["nnz"]), ("vals", 0, a["nnz"]),
                                         ("y", 0, a["nrows"]), ("x", 0, int(v("colind", a["nnz"]).max()) + 1)],
    "dot_partial": lambda a, v, g, b: [("a", 0, a["n"]), ("b", 0, a["n"]), ("out", 0, 1)],
    "axpy": lambda a, v, g, b: [("y", 0, a["n"]), ("x", 0, a["n"])],
    "xpay": lambda a, v, g, b: [("y", 0, a["n"]), ("x", 0, a["n"])],
    "sgemm_nn": lambda a, v, g, b: _gemm(a),
    "sgemm_tn": lambda a, v, g, b: _gemm(a, ta=True),
    "sgemm_nt": lambda a, v, g, b: _gemm(a, tb=True),
    "bias_add": lambda a, v, g, b: [("y", 0, a["rows"] * a["cols"]), ("bias", 0, a["cols"])],
    "relu_inplace": lambda a, v, g, b: [("x", 0, g[0] * b[0])],
    "softmax_xent": lambda a, v, g, b: [("logits", 0, a["batch"] * a["classes"]), ("labels", 0, a["batch"]),
                                       ("loss", 0, 1), ("dlogits", 0, a["batch"] * a["classes"])],
    "relu_backward": lambda a, v, g, b: [("dy", 0, a["n"]), ("y", 0, a["n"])],
    "bias_grad": lambda a, v, g, b: [("dy", 0, a["rows"] * a["cols"]), ("db", 0, a["cols"])],
    "sgd_momentum": lambda a, v, g, b: [("numel", 0, 1)] + [(k, 0, int(v("numel")[0]))
                                                           for k in ("params", "grads", "momentum")],
    "embedding_lookup": lambda a, v, g, b: [("out", 0, a["dim"]), ("token", 0, 1),
                                           ("table", int(v("token")[0]) * a["dim"], (int(v("token")[0]) + 1) * a["dim"])],
    "rmsnorm": lambda a, v, g, b: [("out", 0, 1024), ("x", 0, 1024), ("weight", 0, 1024)],
    "gemv_bf16": lambda a, v, g, b: [("W", 0, a["rows"] * a["cols"]), ("x", 0, a["cols"]), ("y", 0, a["rows"])],
    "rope_apply": lambda a, v, g, b: [("qk", 0, a["n_heads"] * a["head_dim"]), ("cos_sin", 0, a["head_dim"])],
    "kv_append": lambda a, v, g, b: [("k_cache", 0, a["n_kv_heads"] * a["max_seq"] * a["head_dim"]),
                                    ("v_cache", 0, a["n_kv_heads"] * a["max_seq"] * a["head_dim"]),
                                    ("kv", 0, 2 * a["n_kv_heads"] * a["head_dim"])],
    "attention_decode": lambda a, v, g, b: [("out", 0, a["n_heads"] * a["head_dim"]), ("q", 0, a["n_heads"] * a["head_dim"]),
                                           ("k_cache", 0, a["n_kv_heads"] * a["max_seq"] * a["head_dim"]),
                                           ("v_cache", 0, a["n_kv_heads"] * a["max_seq"] * a["head_dim"])],
    "residual_add": lambda a, v, g, b: [("x", 0, g[0] * b[0]), ("y", 0, g[0] * b[0])],
    "silu_mul": lambda a, v, g, b: [("out", 0, a["n"]), ("gate_up", 0, 2 * a["n"])],
    "sample_top_p": lambda a, v, g, b: [("logits", 0, a["vocab"]), ("token", 0, 1)],
    # moe_decode: the experts' weights are read through the ids the router wrote (top two)
    "moe_init": lambda a, v, g, b: [("w", 0, a["n"])],
    "moe_router": lambda a, v, g, b: [("w_router", 0, a["n_experts"] * a["dim"]), ("x", 0, a["dim"]),
                                     ("expert_ids", 0, 2), ("expert_w", 0, 2)],
    "moe_expert_up": lambda a, v, g, b: [("w_up", e * 2 * a["ffn"] * a["dim"], (e + 1) * 2 * a["ffn"] * a["dim"])
                                        for e in sorted({int(x) for x in v("expert_ids", a["top_k"])})]
    + [("expert_ids", 0, a["top_k"]), ("x", 0, a["dim"]), ("h", 0, a["top_k"] * a["ffn"])],
    "moe_expert_down": lambda a, v, g, b: [("w_down", e * a["dim"] * a["ffn"], (e + 1) * a["dim"] * a["ffn"])
                                          for e in sorted({int(x) for x in v("expert_ids", a["top_k"])})]
    + [("expert_ids", 0, a["top_k"]), ("expert_w", 0, a["top_k"]), ("h", 0, a["top_k"] * a["ffn"]),
       ("y", 0, a["dim"])],
}
