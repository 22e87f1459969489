"""Scientific workload models: stream, jacobi2d, spmv-cg."""

from __future__ import annotations

import numpy as np

from .engine import READ, READWRITE, WRITE, Builder, Kernel, Range, Ranges, Strided, scaled

# ---------------------------------------------------------------------------
# stream: McCalpin's STREAM kernels over arrays that are reallocated per phase

K_STREAM_INIT = Kernel("stream_init", [("a", "float*"), ("value", "float")], {"a": "linear"})
K_STREAM_COPY = Kernel("stream_copy", [("c", "float*"), ("a", "const float*"), ("n", "long")],
                       {"c": "linear", "a": "linear"})
K_STREAM_SCALE = Kernel("stream_scale", [("b", "float*"), ("c", "const float*"), ("scalar", "float"),
                                         ("n", "long")], {"b": "linear", "c": "linear"})
K_STREAM_ADD = Kernel("stream_add", [("c", "float*"), ("a", "const float*"), ("b", "const float*"),
                                     ("n", "long")], {"c": "linear", "a": "linear", "b": "linear"})
K_STREAM_TRIAD = Kernel("stream_triad", [("a", "float*"), ("b", "const float*"), ("c", "const float*"),
                                         ("scalar", "float"), ("n", "long")],
                        {"a": "linear", "b": "linear", "c": "linear"})
STREAM_KERNELS = [K_STREAM_INIT, K_STREAM_COPY, K_STREAM_SCALE, K_STREAM_ADD, K_STREAM_TRIAD]


def size_factor(scale: float) -> float:
    """How problem sizes (element counts) grow with --scale; launch counts grow linearly."""
    return scale ** 0.25


# Problem sizes are set so that even at the demo's scale 0.2 every capacity holds at least two
# 2 MiB eviction units at 300% oversubscription (the driver evicts whole 2 MiB chunks; a GPU
# smaller than that is not one UVM runs on). STREAM's is the smallest: each of its launches
# touches whole arrays, so a full-mode trace's fault records grow as launches x array size
# (about 3*10^8 at scale 100 with these sizes; twice the size did not fit in 23 GiB when read back).
STREAM_N = 131072 * 8         # elements per array at scale 1 (4 MiB of float32)
JACOBI_SIDE = 512 * 4         # finest grid side at scale 1 (16 MiB per buffer)
SPMV_ROWS = 65536 * 8         # matrix rows at scale 1 (about 40 MiB of CSR values and columns)


def build_stream(b: Builder) -> None:
    rng, s = b.rng, b.scale
    phases = 4
    iters = scaled(625, s)                      # 4 phases x 4 kernels x 625 = 10^4 launches at scale 1
    for _ in range(phases):
        n = scaled(STREAM_N * size_factor(s) * rng.uniform(0.5, 1.5), 1, multiple=256, minimum=256)
        a, bb, c = (b.malloc(4 * n, name) for name in ("a", "b", "c"))
        base = b.reserve(3 + 4 * iters)
        for i, (buf, v) in enumerate(((a, 1.0), (bb, 2.0), (c, 0.0))):
            # the grid covers the array exactly: the footprint follows grid_x * block_x
            b.launch(K_STREAM_INIT, base + i, {"a": buf.ptr(), "value": v}, grid=(n // 256,),
                     touches=[Range(buf, 0, 4 * n, WRITE)])
        t = np.arange(iters, dtype=np.int64)
        ids = base + 3 + 4 * t
        grid = (-(-n // 1024),)  # grid-stride loop, 4 elements per thread
        nb = 4 * n
        scalar = 3.0  # STREAM's scalar
        b.launch(K_STREAM_COPY, ids, {"c": c.ptr(), "a": a.ptr(), "n": n}, grid=grid, flops=0,
                 touches=[Range(c, 0, nb, WRITE), Range(a, 0, nb, READ)])
        b.launch(K_STREAM_SCALE, ids + 1, {"b": bb.ptr(), "c": c.ptr(), "scalar": scalar, "n": n}, grid=grid,
                 flops=n, touches=[Range(bb, 0, nb, WRITE), Range(c, 0, nb, READ)])
        b.launch(K_STREAM_ADD, ids + 2, {"c": c.ptr(), "a": a.ptr(), "b": bb.ptr(), "n": n}, grid=grid,
                 flops=n, touches=[Range(c, 0, nb, WRITE), Range(a, 0, nb, READ), Range(bb, 0, nb, READ)])
        b.launch(K_STREAM_TRIAD, ids + 3, {"a": a.ptr(), "b": bb.ptr(), "c": c.ptr(), "scalar": scalar, "n": n},
                 grid=grid, flops=2 * n,
                 touches=[Range(a, 0, nb, WRITE), Range(bb, 0, nb, READ), Range(c, 0, nb, READ)])
        for buf in (a, bb, c):
            b.free(buf)


# ---------------------------------------------------------------------------
# jacobi2d: weighted-Jacobi smoothing in a multigrid V-cycle

K_JAC_SWEEP = Kernel("jacobi2d_sweep", [("out", "float*"), ("in", "const float*"), ("nx", "int"), ("ny", "int"),
                                         ("omega", "float")], {"out": "linear", "in": "linear"})
K_JAC_HALO = Kernel("jacobi2d_halo", [("u", "float*"), ("nx", "int"), ("ny", "int")], {"u": "strided"})
K_JAC_RESTRICT = Kernel("jacobi2d_restrict", [("coarse", "float*"), ("fine", "const float*"),
                                               ("nxc", "int"), ("nyc", "int")],
                        {"coarse": "linear", "fine": "linear"})
K_JAC_PROLONG = Kernel("jacobi2d_prolong", [("fine", "float*"), ("coarse", "const float*"),
                                             ("nxc", "int"), ("nyc", "int")],
                       {"fine": "linear", "coarse": "linear"})
K_JAC_RESIDUAL = Kernel("jacobi2d_residual", [("u", "const float*"), ("partial", "float*"), ("nx", "int"),
                                               ("ny", "int")], {"u": "linear", "partial": "linear"})
K_REDUCE = Kernel("reduce_sum", [("partial", "const float*"), ("result", "float*"), ("n", "int")],
                  {"partial": "linear", "result": "fixed"})
JACOBI_KERNELS = [K_JAC_SWEEP, K_JAC_HALO, K_JAC_RESTRICT, K_JAC_PROLONG, K_JAC_RESIDUAL, K_REDUCE]


def build_jacobi2d(b: Builder) -> None:
    rng, s = b.rng, b.scale
    side = np.sqrt(size_factor(s))
    nx0 = scaled(JACOBI_SIDE * side * rng.uniform(0.8, 1.25), 1, multiple=64, minimum=128)
    ny0 = scaled(JACOBI_SIDE * side * rng.uniform(0.8, 1.25), 1, multiple=64, minimum=128)
    levels = 4
    dims = [(nx0 >> l, ny0 >> l) for l in range(levels)]
    # two buffers per level, each (ny + 2) rows with one halo row above and below
    bufs = [[b.malloc(4 * nx * (ny + 2), f"u{l}{k}") for k in "ab"] for l, (nx, ny) in enumerate(dims)]
    gx0, gy0 = -(-nx0 // 32), -(-ny0 // 8)
    partial = b.malloc(4 * gx0 * gy0, "partial")
    scalars = b.malloc(4096, "scalars")
    nu = 2
    omega = 0.8
    # one V-cycle as a list of operations; each repeats every cycle
    ops: list[tuple] = []
    for l in range(levels - 1):
        ops += [("sweep", l, 0), ("halo", l, 1), ("sweep", l, 1), ("halo", l, 0)] * (nu // 2)
        ops += [("residual", l), ("reduce", l), ("restrict", l)]
    ops += [("sweep", levels - 1, 0), ("halo", levels - 1, 1), ("sweep", levels - 1, 1), ("halo", levels - 1, 0)]
    for l in range(levels - 2, -1, -1):
        ops += [("prolong", l)]
        ops += [("sweep", l, 0), ("halo", l, 1), ("sweep", l, 1), ("halo", l, 0)] * (nu // 2)
    ops += [("residual", 0), ("reduce", 0)]
    cycles = max(1, round(10_000 * s / len(ops)))
    base = b.reserve(cycles * len(ops))
    cyc = np.arange(cycles, dtype=np.int64) * len(ops)
    for i, op in enumerate(ops):
        ids = base + cyc + i
        kind = op[0]
        if kind == "sweep":
            l, src = op[1], op[2]
            nx, ny = dims[l]
            u_in, u_out = bufs[l][src], bufs[l][1 - src]
            # pointers to the first interior row; the stencil reads one halo row above it
            b.launch(K_JAC_SWEEP, ids, {"out": u_out.ptr(4 * nx), "in": u_in.ptr(4 * nx), "nx": nx, "ny": ny,
                                        "omega": omega},
                     grid=(-(-nx // 32), -(-ny // 8)), block=(32, 8), flops=6 * nx * ny,
                     touches=[Range(u_out, 4 * nx, 4 * nx * ny, WRITE), Range(u_in, 0, 4 * nx * (ny + 2), READ)])
        elif kind == "halo":
            l, k = op[1], op[2]
            nx, ny = dims[l]
            u = bufs[l][k]
            # periodic in y: rows 0,1 and ny,ny+1 (copy row ny into 0 and row 1 into ny+1)
            b.launch(K_JAC_HALO, ids, {"u": u.ptr(), "nx": nx, "ny": ny}, grid=(-(-nx // 256),),
                     touches=[Strided(u, 0, 8 * nx, 4 * nx * ny, 2, READWRITE)])
        elif kind == "restrict":
            l = op[1]
            (nxf, nyf), (nxc, nyc) = dims[l], dims[l + 1]
            fine, coarse = bufs[l][0], bufs[l + 1][0]
            b.launch(K_JAC_RESTRICT, ids, {"coarse": coarse.ptr(4 * nxc), "fine": fine.ptr(4 * nxf),
                                           "nxc": nxc, "nyc": nyc},
                     grid=(-(-nxc // 32), -(-nyc // 8)), block=(32, 8), flops=9 * nxc * nyc,
                     touches=[Range(coarse, 4 * nxc, 4 * nxc * nyc, WRITE), Range(fine, 4 * nxf, 4 * nxf * nyf, READ)])
        elif kind == "prolong":
            l = op[1]
            (nxf, nyf), (nxc, nyc) = dims[l], dims[l + 1]
            fine, coarse = bufs[l][0], bufs[l + 1][0]
            b.launch(K_JAC_PROLONG, ids, {"fine": fine.ptr(4 * nxf), "coarse": coarse.ptr(4 * nxc),
                                          "nxc": nxc, "nyc": nyc},
                     grid=(-(-nxf // 32), -(-nyf // 8)), block=(32, 8), flops=4 * nxf * nyf,
                     touches=[Range(fine, 4 * nxf, 4 * nxf * nyf, READWRITE),
                              Range(coarse, 0, 4 * nxc * (nyc + 2), READ)])
        elif kind == "residual":
            nx, ny = dims[op[1]]
            u = bufs[op[1]][0]
            gx, gy = -(-nx // 32), -(-ny // 8)
            # one partial sum per block: the partial footprint follows the grid
            b.launch(K_JAC_RESIDUAL, ids, {"u": u.ptr(4 * nx), "partial": partial.ptr(), "nx": nx, "ny": ny},
                     grid=(gx, gy), block=(32, 8), flops=7 * nx * ny,
                     touches=[Range(u, 0, 4 * nx * (ny + 2), READ), Range(partial, 0, 4 * gx * gy, WRITE)])
        elif kind == "reduce":
            nx, ny = dims[op[1]]
            nparts = -(-nx // 32) * -(-ny // 8)
            res = 4 * op[1]   # one residual norm per level
            b.launch(K_REDUCE, ids, {"partial": partial.ptr(), "result": scalars.ptr(res), "n": nparts},
                     grid=(1,), block=(1024,), flops=nparts,
                     touches=[Range(partial, 0, 4 * nparts, READ), Range(scalars, res, 4, WRITE)])


# ---------------------------------------------------------------------------
# spmv-cg: conjugate gradient on a CSR matrix, row-partitioned into uneven blocks

K_SPMV = Kernel("spmv_csr_block", [("nrows", "int"), ("nnz", "int"), ("rowptr", "const int*"),
                                   ("colind", "const int*"), ("vals", "const float*"), ("x", "const float*"),
                                   ("y", "float*")],
                {"rowptr": "linear", "colind": "linear", "vals": "linear", "x": "indexed", "y": "linear"})
K_DOT = Kernel("dot_partial", [("a", "const float*"), ("b", "const float*"), ("out", "float*"), ("n", "int")],
               {"a": "linear", "b": "linear", "out": "fixed"})
K_AXPY = Kernel("axpy", [("y", "float*"), ("x", "const float*"), ("alpha", "float"), ("n", "int")],
                {"y": "linear", "x": "linear"})
K_XPAY = Kernel("xpay", [("y", "float*"), ("x", "const float*"), ("beta", "float"), ("n", "int")],
                {"y": "linear", "x": "linear"})
SPMV_KERNELS = [K_SPMV, K_DOT, K_AXPY, K_XPAY, K_REDUCE]


def _csr_columns(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A sparse matrix's row pointers and column indices: a band around the diagonal plus a few
    long-range couplings into random clusters (as in an unstructured mesh after reordering)."""
    per_row = rng.integers(5, 16, n)
    rowptr = np.concatenate([[0], np.cumsum(per_row)]).astype(np.int64)
    nnz = int(rowptr[-1])
    row = np.repeat(np.arange(n), per_row)
    far = rng.random(nnz) < 0.08
    band = row + rng.integers(-48, 49, nnz)
    centers = rng.integers(0, n, max(4, n // 4096))
    cluster = centers[rng.integers(0, len(centers), nnz)] + rng.integers(-256, 257, nnz)
    col = np.clip(np.where(far, cluster, band), 0, n - 1)
    return rowptr, col


def build_spmv_cg(b: Builder) -> None:
    rng, s = b.rng, b.scale
    n = scaled(SPMV_ROWS * size_factor(s) * rng.uniform(0.75, 1.25), 1, multiple=256, minimum=1024)
    rowptr, col = _csr_columns(rng, n)
    nnz = int(rowptr[-1])
    nblk = int(rng.integers(6, 11))
    cuts = np.sort(rng.choice(np.arange(1, n // 64), nblk - 1, replace=False)) * 64
    r0 = np.concatenate([[0], cuts]).astype(np.int64)
    r1 = np.concatenate([cuts, [n]]).astype(np.int64)
    rows = r1 - r0
    k0, k1 = rowptr[r0], rowptr[r1]
    # the pages of x each block gathers (data-dependent), as runs of consecutive pages
    blk_of = np.repeat(np.arange(nblk), k1 - k0)
    pages = np.unique(blk_of.astype(np.int64) << 32 | (col * 4 >> 12))
    pb, pp = pages >> 32, pages & 0xFFFFFFFF
    new = np.ones(len(pages), bool)
    new[1:] = (pb[1:] != pb[:-1]) | (pp[1:] != pp[:-1] + 1)
    ri = np.flatnonzero(new)
    run_blk, run_page = pb[ri], pp[ri]
    run_len = np.diff(np.append(ri, len(pages)))
    xbytes = 4 * n
    run_off = run_page * 4096
    run_nb = np.minimum(run_len * 4096, xbytes - run_off)

    A_rowptr = b.malloc(4 * (n + 1), "rowptr")
    A_col = b.malloc(4 * nnz, "colind")
    A_val = b.malloc(4 * nnz, "vals")
    x, r, p, q = (b.malloc(xbytes, v) for v in "xrpq")
    partial = b.malloc(4 * 64, "partial")
    scalars = b.malloc(4096, "scalars")

    ops: list[tuple] = [("spmv", k) for k in range(nblk)]
    ops += [("dot", "p", "q", k) for k in range(nblk)] + [("reduce", 0)]
    ops += [("axpy", "x", "p", k) for k in range(nblk)] + [("axpy", "r", "q", k) for k in range(nblk)]
    ops += [("dot", "r", "r", k) for k in range(nblk)] + [("reduce", 1)]
    ops += [("xpay", "p", "r", k) for k in range(nblk)]
    iters = max(1, round(10_000 * s / len(ops)))
    base = b.reserve(iters * len(ops))
    it = np.arange(iters, dtype=np.int64)
    alpha = (0.2 + 0.6 * rng.random(iters)).astype(np.float32)   # the step lengths CG finds
    beta = (0.05 + 0.9 * rng.random(iters)).astype(np.float32)
    vec = {"x": x, "r": r, "p": p, "q": q}
    for i, op in enumerate(ops):
        ids = base + it * len(ops) + i
        kind = op[0]
        if kind == "spmv":
            k = op[1]
            sel = np.flatnonzero(run_blk == k)
            which = np.repeat(np.arange(iters), len(sel))
            nr, nz = int(rows[k]), int(k1[k] - k0[k])
            b.launch(K_SPMV, ids, {"nrows": nr, "nnz": nz, "rowptr": A_rowptr.ptr(4 * r0[k]),
                                   "colind": A_col.ptr(4 * k0[k]), "vals": A_val.ptr(4 * k0[k]), "x": p.ptr(),
                                   "y": q.ptr(4 * r0[k])},
                     grid=(-(-nr // 8),), block=(256,), flops=2 * nz,
                     touches=[Range(A_rowptr, 4 * r0[k], 4 * (nr + 1)), Range(A_col, 4 * k0[k], 4 * nz),
                              Range(A_val, 4 * k0[k], 4 * nz),
                              Ranges(p, which, np.tile(run_off[sel], iters), np.tile(run_nb[sel], iters)),
                              Range(q, 4 * r0[k], 4 * nr, WRITE)])
            # the column indices that choose the gathered entries of x (no launch writes them)
            b.values(K_SPMV, "colind", ids, A_col.ptr(4 * k0[k]), col[k0[k]:k1[k]].astype("<i4").tobytes())
        elif kind == "dot":
            va, vb, k = vec[op[1]], vec[op[2]], op[3]
            nr = int(rows[k])
            t = [Range(va, 4 * r0[k], 4 * nr)] + ([Range(vb, 4 * r0[k], 4 * nr)] if vb is not va else [])
            b.launch(K_DOT, ids, {"a": va.ptr(4 * r0[k]), "b": vb.ptr(4 * r0[k]), "out": partial.ptr(4 * k),
                                  "n": nr},
                     grid=(min(1024, -(-nr // 256)),), block=(256,), flops=2 * nr,
                     touches=t + [Range(partial, 4 * k, 4, READWRITE)])
        elif kind == "reduce":
            b.launch(K_REDUCE, ids, {"partial": partial.ptr(), "result": scalars.ptr(4 * op[1]), "n": nblk},
                     grid=(1,), block=(1024,), flops=nblk,
                     touches=[Range(partial, 0, 4 * nblk), Range(scalars, 4 * op[1], 4, WRITE)])
        else:
            vy, vx, k = vec[op[1]], vec[op[2]], op[-1]
            nr = int(rows[k])
            kern = K_AXPY if kind == "axpy" else K_XPAY
            coef = alpha if kind == "axpy" else beta
            if kind == "axpy" and op[1] == "r":
                coef = -alpha
            b.launch(kern, ids, {"y": vy.ptr(4 * r0[k]), "x": vx.ptr(4 * r0[k]),
                                 ("alpha" if kind == "axpy" else "beta"): coef, "n": nr},
                     grid=(-(-nr // 256),), block=(256,), flops=2 * nr,
                     touches=[Range(vy, 4 * r0[k], 4 * nr, READWRITE), Range(vx, 4 * r0[k], 4 * nr)])


# ---------------------------------------------------------------------------

from .workload import workload  # noqa: E402

WORKLOADS = [
    workload("stream", "scientific",
             "STREAM copy/scale/add/triad (float scalar beside an 8-byte n) over three arrays, reallocated "
             "(same addresses reused) with a new size in each of 4 phases; stream_init's footprint follows "
             "grid_x*block_x*4 with no size argument. Templates: linear (size 4*n; grid-derived).",
             build_stream, STREAM_KERNELS,
             summary="STREAM copy/scale/add/triad over arrays reallocated each phase"),
    workload("jacobi2d", "scientific",
             "Weighted-Jacobi smoothing in a 4-level multigrid V-cycle with ping-pong buffers; the stencil "
             "reads through a pointer to the first interior row, so its region starts one row before the "
             "pointer (negative offset -4*nx, size 4*nx*(ny+2)); periodic halo rows (strided: 2 chunks of "
             "8*nx bytes, stride 4*nx*ny); restriction/prolongation; a residual at each level whose per-block "
             "partial sums follow the grid (grid_x*grid_y*4 bytes), and a 4-byte reduction result per level. Templates: linear, strided, fixed.",
             build_jacobi2d, JACOBI_KERNELS,
             summary="weighted Jacobi in a multigrid V-cycle: halo rows, ping-pong buffers"),
    workload("spmv-cg", "scientific",
             "Conjugate gradient on a CSR matrix (band plus clustered long-range couplings) split into 6-10 "
             "uneven row blocks: per block a CSR SpMV whose gather of x follows the column indices "
             "(indexed: data-dependent, the trace records the column indices), with rowptr/colind/vals/y pointers offset into their allocations "
             "(linear in nrows and nnz), dot products into per-block 4-byte partials (fixed), axpy/xpay with "
             "float coefficients beside int n, and a reduction. Templates: linear, fixed, indexed.",
             build_spmv_cg, SPMV_KERNELS, constant={"reduce_sum": ("partial",)},
             summary="conjugate gradient: CSR SpMV with a data-dependent gather, dot, axpy"),
]
