"""The benchmarks of ARIADNE's oversubscription study as workload models (docs/driver-validation.md).

ARIADNE (Shin et al., "ARIADNE: Adaptive UVM Management for Efficient GPU Memory
Oversubscription", HPCA 2026, Table I) measures plain UVM on ten benchmarks from
PolyBench/GPU, Rodinia, HeCBench and XSBench, all modelled here with their kernels'
footprints (whole arrays, rows, tiles, lookups): 2DCONV, ATAX, BICG, GEMM, GESUMMV
(ARIADNE's "GEMV"), MVT, HEL (HeCBench's Hellinger distance), NW (Rodinia's
Needleman-Wunsch wavefront), XSBench's cross-section lookups and Rodinia's BFS (those two
data-dependent: random energies, the graph). Each model runs its benchmark `iters` times
(at least twice: a warm-up and a timed run), so a trace has launches that share pages.

What the models cannot carry: the order in which a kernel's threads touch its
footprint. A thread-per-row matrix-vector kernel (ATAX's first kernel, GESUMMV,
MVT's first kernel) walks every row at once, one page per row at a time, which on a
real GPU thrashes once the matrix exceeds memory; a trace records a launch's
footprint, and the simulator walks it in address order.
"""

from __future__ import annotations

import numpy as np

from .engine import READ, READWRITE, WRITE, Builder, Kernel, Range, Ranges, scaled
from .scientific import size_factor

# A matrix side at scale 1: 8192 x 8192 float32 = 256 MiB per matrix.
SIDE = 8192
TILE = 16          # Needleman-Wunsch: 16 x 16 score tiles per thread block (Rodinia's BLOCK_SIZE)

K_CONV = Kernel("convolution2D_kernel", [("ni", "int"), ("nj", "int"), ("A", "float*"), ("B", "float*")],
                {"A": "linear", "B": "linear"})
K_ATAX1 = Kernel("atax_kernel1", [("nx", "int"), ("ny", "int"), ("A", "float*"), ("x", "float*"),
                                  ("tmp", "float*")], {"A": "linear", "x": "linear", "tmp": "linear"})
K_ATAX2 = Kernel("atax_kernel2", [("nx", "int"), ("ny", "int"), ("A", "float*"), ("y", "float*"),
                                  ("tmp", "float*")], {"A": "linear", "y": "linear", "tmp": "linear"})
K_BICG1 = Kernel("bicg_kernel1", [("nx", "int"), ("ny", "int"), ("A", "float*"), ("r", "float*"),
                                  ("s", "float*")], {"A": "linear", "r": "linear", "s": "linear"})
K_BICG2 = Kernel("bicg_kernel2", [("nx", "int"), ("ny", "int"), ("A", "float*"), ("p", "float*"),
                                  ("q", "float*")], {"A": "linear", "p": "linear", "q": "linear"})
K_GEMM = Kernel("gemm_kernel", [("ni", "int"), ("nj", "int"), ("nk", "int"), ("alpha", "float"), ("beta", "float"),
                                ("a", "float*"), ("b", "float*"), ("c", "float*")],
                {"a": "linear", "b": "linear", "c": "linear"})
K_GESUMMV = Kernel("gesummv_kernel", [("n", "int"), ("alpha", "float"), ("beta", "float"), ("A", "float*"),
                                      ("B", "float*"), ("tmp", "float*"), ("x", "float*"), ("y", "float*")],
                   {"A": "linear", "B": "linear", "tmp": "linear", "x": "linear", "y": "linear"})
K_MVT1 = Kernel("mvt_kernel1", [("n", "int"), ("a", "float*"), ("x1", "float*"), ("y_1", "float*")],
                {"a": "linear", "x1": "linear", "y_1": "linear"})
K_MVT2 = Kernel("mvt_kernel2", [("n", "int"), ("a", "float*"), ("x2", "float*"), ("y_2", "float*")],
                {"a": "linear", "x2": "linear", "y_2": "linear"})
K_HEL = Kernel("hellinger", [("X", "const float*"), ("Y", "const float*"), ("out", "float*"), ("m", "int"),
                             ("n", "int"), ("k", "int")], {"X": "linear", "Y": "linear", "out": "linear"})
K_NW1 = Kernel("needle_cuda_shared_1", [("reference", "int*"), ("matrix", "int*"), ("cols", "int"),
                                        ("penalty", "int"), ("i", "int"), ("block_width", "int")],
               {"reference": "strided", "matrix": "strided"})
K_NW2 = Kernel("needle_cuda_shared_2", [("reference", "int*"), ("matrix", "int*"), ("cols", "int"),
                                        ("penalty", "int"), ("i", "int"), ("block_width", "int")],
               {"reference": "strided", "matrix": "strided"})


def _side(b: Builder, lo: float = 0.8, hi: float = 1.2) -> int:
    return scaled(SIDE * np.sqrt(size_factor(b.scale)) * b.rng.uniform(lo, hi), 1, multiple=64, minimum=256)


def _iters(b: Builder) -> int:
    """Runs of the benchmark's kernels: a warm-up and a timed run at least, more as the scale grows."""
    return 1 + scaled(10, b.scale, minimum=1)


def _ids(b: Builder, per_iter: int, it: int) -> np.ndarray:
    base = b.reserve(per_iter * it)
    return base + per_iter * np.arange(it, dtype=np.int64)


def build_2dconv(b: Builder) -> None:
    n = _side(b)
    A, B = b.malloc(4 * n * n, "A"), b.malloc(4 * n * n, "B")
    ids = _ids(b, 1, _iters(b))
    b.launch(K_CONV, ids, {"ni": n, "nj": n, "A": A.ptr(), "B": B.ptr()}, grid=(n // 32, n // 8), block=(32, 8),
             flops=9 * 2 * n * n, touches=[Range(A, 0, 4 * n * n), Range(B, 0, 4 * n * n, WRITE)])


def _matvec2(b: Builder, k1: Kernel, k2: Kernel, names: tuple[str, str, str, str]) -> None:
    """Two kernels over one matrix and three vectors (ATAX, BICG): each reads the whole matrix."""
    n = _side(b)
    A = b.malloc(4 * n * n, "A")
    v1, v2, v3, v4 = (b.malloc(4 * n, nm) for nm in names)
    ids = _ids(b, 2, _iters(b))
    p1, p2 = [p for p, _ in k1.params if p not in ("nx", "ny", "A")], [p for p, _ in k2.params
                                                                     if p not in ("nx", "ny", "A")]
    for k, ps, (src, dst), off in ((k1, p1, (v1, v2), 0), (k2, p2, (v3, v4), 1)):
        b.launch(k, ids + off, {"nx": n, "ny": n, "A": A.ptr(), ps[0]: src.ptr(), ps[1]: dst.ptr()},
                 grid=(-(-n // 256),), flops=2 * n * n,
                 touches=[Range(A, 0, 4 * n * n), Range(src, 0, 4 * n), Range(dst, 0, 4 * n, READWRITE)])


def build_atax(b: Builder) -> None:
    _matvec2(b, K_ATAX1, K_ATAX2, ("x", "tmp", "y", "tmp2"))


def build_bicg(b: Builder) -> None:
    _matvec2(b, K_BICG1, K_BICG2, ("r", "s", "p", "q"))


def build_gemm(b: Builder) -> None:
    n = _side(b, 0.5, 0.7)      # three matrices
    a, bb, c = (b.malloc(4 * n * n, nm) for nm in ("a", "b", "c"))
    ids = _ids(b, 1, _iters(b))
    b.launch(K_GEMM, ids, {"ni": n, "nj": n, "nk": n, "alpha": 32412.0, "beta": 2123.0, "a": a.ptr(), "b": bb.ptr(),
                           "c": c.ptr()}, grid=(n // 32, n // 8), block=(32, 8), flops=2.0 * n ** 3,
             touches=[Range(a, 0, 4 * n * n), Range(bb, 0, 4 * n * n), Range(c, 0, 4 * n * n, READWRITE)])


def build_gesummv(b: Builder) -> None:
    n = _side(b, 0.6, 0.85)     # two matrices
    A, B = b.malloc(4 * n * n, "A"), b.malloc(4 * n * n, "B")
    tmp, x, y = (b.malloc(4 * n, nm) for nm in ("tmp", "x", "y"))
    ids = _ids(b, 1, _iters(b))
    b.launch(K_GESUMMV, ids, {"n": n, "alpha": 43532.0, "beta": 12313.0, "A": A.ptr(), "B": B.ptr(), "tmp": tmp.ptr(),
                              "x": x.ptr(), "y": y.ptr()}, grid=(-(-n // 256),), flops=4 * n * n,
             touches=[Range(A, 0, 4 * n * n), Range(B, 0, 4 * n * n), Range(x, 0, 4 * n),
                      Range(tmp, 0, 4 * n, WRITE), Range(y, 0, 4 * n, WRITE)])


def build_mvt(b: Builder) -> None:
    n = _side(b)
    a = b.malloc(4 * n * n, "a")
    x1, x2, y1, y2 = (b.malloc(4 * n, nm) for nm in ("x1", "x2", "y_1", "y_2"))
    ids = _ids(b, 2, _iters(b))
    for k, x, y, off in ((K_MVT1, x1, y1, 0), (K_MVT2, x2, y2, 1)):
        xp, yp = ("x1", "y_1") if k is K_MVT1 else ("x2", "y_2")
        b.launch(k, ids + off, {"n": n, "a": a.ptr(), xp: x.ptr(), yp: y.ptr()}, grid=(-(-n // 256),), flops=2 * n * n,
                 touches=[Range(a, 0, 4 * n * n), Range(y, 0, 4 * n), Range(x, 0, 4 * n, READWRITE)])


def build_hellinger(b: Builder) -> None:
    m = _side(b, 0.55, 0.75)    # X (m x k), Y (k x m), out (m x m)
    k = m
    X, Y, out = b.malloc(4 * m * k, "X"), b.malloc(4 * k * m, "Y"), b.malloc(4 * m * m, "out")
    ids = _ids(b, 1, _iters(b))
    b.launch(K_HEL, ids, {"X": X.ptr(), "Y": Y.ptr(), "out": out.ptr(), "m": m, "n": m, "k": k},
             grid=(m // 16, m // 16), block=(16, 16), flops=3.0 * m * m * k,
             touches=[Range(X, 0, 4 * m * k), Range(Y, 0, 4 * k * m), Range(out, 0, 4 * m * m, WRITE)])


def build_nw(b: Builder) -> None:
    """Rodinia's Needleman-Wunsch: (cols x cols) int score and reference matrices, filled in 16 x 16 tiles
    along anti-diagonals; the first kernel sweeps the upper-left triangle of tiles, the second the rest."""
    side = scaled(SIDE * np.sqrt(size_factor(b.scale)) * b.rng.uniform(0.35, 0.5), 1, multiple=TILE, minimum=4 * TILE)
    t = side // TILE                               # tiles per side
    penalty = int(b.rng.integers(1, 21))           # Rodinia takes the gap penalty as an argument
    cols = t * TILE + 1
    ref, mat = b.malloc(4 * cols * cols, "reference"), b.malloc(4 * cols * cols, "matrix")
    it = _iters(b)
    diags = 2 * t - 1
    ids = _ids(b, diags, it)
    # launch d (0 <= d < t: kernel 1 with i = d + 1; else kernel 2 with i = 2t - 1 - d) does the tiles (r, d - r)
    d = np.arange(diags)
    lo, hi = np.maximum(0, d - t + 1), np.minimum(d, t - 1)
    ntile = hi - lo + 1
    which_d = np.repeat(d, ntile)
    r = np.concatenate([np.arange(a, c + 1) for a, c in zip(lo, hi)])
    col = which_d - r
    row_off = (np.repeat(r * TILE, TILE + 1) + np.tile(np.arange(TILE + 1), len(r)))     # the tile and its top row
    col_off = np.repeat(col * TILE, TILE + 1)
    which_rows = np.repeat(which_d, TILE + 1)
    offs = 4 * (row_off * cols + col_off)
    nb = 4 * (TILE + 1)
    for k, sel, ivals in ((K_NW1, d < t, d + 1), (K_NW2, d >= t, 2 * t - 1 - d)):
        ds = np.flatnonzero(sel)
        if not len(ds):
            continue
        pos = {int(x): j for j, x in enumerate(ds)}
        keep = np.isin(which_rows, ds)
        w = np.array([pos[int(x)] for x in which_rows[keep]], dtype=np.int64)
        for rep in range(it):
            lid = ids[rep] + ds
            b.launch(k, lid, {"reference": ref.ptr(), "matrix": mat.ptr(), "cols": cols, "penalty": penalty,
                              "i": ivals[ds], "block_width": t}, grid=(np.minimum(ivals[ds], t),), block=(TILE,),
                     flops=2 * TILE * TILE * np.minimum(ivals[ds], t),
                     touches=[Ranges(ref, w, offs[keep], nb), Ranges(mat, w, offs[keep], nb, READWRITE)])


# ---------------------------------------------------------------------------
# Data-dependent benchmarks: what a launch touches follows random numbers or the graph, not its
# arguments. Their touches are recorded per 4 KiB page (the unit the driver tracks).

def _pages(buf, offsets: np.ndarray, which: np.ndarray | None = None):
    """(launch index, page offset) pairs, unique, for byte offsets into buf (4 KiB pages, clipped)."""
    pg = offsets // 4096
    if which is None:
        which = np.zeros(len(pg), np.int64)
    key = np.unique(which.astype(np.int64) * (1 << 40) + pg)
    w, p = key >> 40, key & ((1 << 40) - 1)
    off = p * 4096
    return w, off, np.minimum(4096, buf.bytes - off)


XS_NUCS = np.array([34, 5, 4, 4, 27, 21, 11, 9, 3, 14, 3, 3])   # XSBench "small": nuclides per material
XS_ISO = 68
XS_MAT_P = np.array([0.140, 0.052, 0.275, 0.134, 0.154, 0.064, 0.066, 0.055, 0.008, 0.015, 0.025, 0.013])

K_XS = Kernel("xs_lookup_kernel_baseline", [("num_nucs", "int*"), ("concs", "double*"), ("mats", "int*"),
                                              ("unionized_energy_array", "double*"), ("index_grid", "int*"),
                                              ("nuclide_grid", "double*"), ("verification", "unsigned long*"),
                                              ("n_isotopes", "int"), ("n_gridpoints", "long"), ("lookups", "int")],
              {"num_nucs": "linear", "concs": "linear", "mats": "linear", "unionized_energy_array": "irregular",
               "index_grid": "irregular", "nuclide_grid": "irregular", "verification": "linear"})


def build_xsbench(b: Builder) -> None:
    """XSBench's event-based lookups: each finds a random energy on the unionized grid, reads that row
    of the index grid and, for each nuclide of a random material, two points of that nuclide's grid."""
    rng = b.rng
    ng = scaled(7000 * size_factor(b.scale) * rng.uniform(0.9, 1.1), 1, minimum=64)
    u = XS_ISO * ng
    egrid, index = b.malloc(8 * u, "unionized_energy_array"), b.malloc(4 * u * XS_ISO, "index_grid")
    ngrid = b.malloc(48 * XS_ISO * ng, "nuclide_grid")
    nn, concs, mats = b.malloc(4 * 12, "num_nucs"), b.malloc(8 * 12 * XS_ISO, "concs"), b.malloc(4 * 12 * XS_ISO, "mats")
    lookups = scaled(20000 * size_factor(b.scale), 1, minimum=1000)
    verif = b.malloc(8 * lookups, "verification")
    it = _iters(b)
    ids = _ids(b, 1, it)
    # materials' nuclides: fuel (0) has the first 34, the others a random subset
    mat_nucs = [np.arange(XS_NUCS[0])] + [np.sort(rng.choice(XS_ISO, k, replace=False)) for k in XS_NUCS[1:]]
    ws, eo, io, no = [], [], [], []
    for r in range(it):
        ui = rng.integers(0, u, lookups)
        m = rng.choice(12, lookups, p=XS_MAT_P / XS_MAT_P.sum())
        ws.append(np.full(lookups, r))
        eo.append(8 * ui)
        io.append(4 * ui * XS_ISO)
        cnt = XS_NUCS[m]
        nuc = np.concatenate([mat_nucs[k] for k in m])
        gp = np.minimum(np.repeat(ui // XS_ISO, cnt), ng - 2)
        no.append(np.stack([np.repeat(np.full(lookups, r), cnt), 48 * (nuc * ng + gp)]))
    w = np.concatenate(ws)
    touches = []
    for buf, off, ww in ((egrid, np.concatenate(eo), w), (index, np.concatenate(io), w),
                         (ngrid, np.concatenate([x[1] for x in no]), np.concatenate([x[0] for x in no]))):
        pw, po, pn = _pages(buf, off, ww)
        touches.append(Ranges(buf, pw, po, pn))
    b.launch(K_XS, ids, {"num_nucs": nn.ptr(), "concs": concs.ptr(), "mats": mats.ptr(),
                         "unionized_energy_array": egrid.ptr(), "index_grid": index.ptr(), "nuclide_grid": ngrid.ptr(),
                         "verification": verif.ptr(), "n_isotopes": XS_ISO, "n_gridpoints": ng, "lookups": lookups},
             grid=(-(-lookups // 256),), flops=200.0 * lookups,
             touches=[*touches, Range(nn, 0, nn.bytes), Range(concs, 0, concs.bytes), Range(mats, 0, mats.bytes),
                      Range(verif, 0, verif.bytes, WRITE)])


K_BFS1 = Kernel("Kernel", [("g_graph_nodes", "int*"), ("g_graph_edges", "int*"), ("g_graph_mask", "bool*"),
                           ("g_updating_graph_mask", "bool*"), ("g_graph_visited", "bool*"), ("g_cost", "int*"),
                           ("no_of_nodes", "int")],
                {"g_graph_nodes": "irregular", "g_graph_edges": "irregular", "g_graph_mask": "linear",
                 "g_updating_graph_mask": "irregular", "g_graph_visited": "irregular", "g_cost": "irregular"})
K_BFS2 = Kernel("Kernel2", [("g_graph_mask", "bool*"), ("g_updating_graph_mask", "bool*"),
                            ("g_graph_visited", "bool*"), ("g_over", "bool*"), ("no_of_nodes", "int")],
                {"g_graph_mask": "linear", "g_updating_graph_mask": "linear", "g_graph_visited": "linear",
                 "g_over": "linear"})


def build_bfs(b: Builder) -> None:
    """Rodinia's BFS on a random graph (degrees 1-11, Rodinia's generator's range): per level, Kernel
    expands the frontier (its nodes' edge lists, the neighbours' cost, visited and updating masks) and
    Kernel2 folds the updating mask into the frontier."""
    rng = b.rng
    n = scaled((1 << 19) * size_factor(b.scale) * rng.uniform(0.9, 1.1), 1, minimum=4096)
    deg = rng.integers(1, 12, n)
    start = np.concatenate([[0], np.cumsum(deg)[:-1]])
    e = int(deg.sum())
    dst = rng.integers(0, n, e)
    nodes, edges = b.malloc(8 * n, "g_graph_nodes"), b.malloc(4 * e, "g_graph_edges")
    mask, upd, vis = (b.malloc(n, nm) for nm in ("g_graph_mask", "g_updating_graph_mask", "g_graph_visited"))
    cost, over = b.malloc(4 * n, "g_cost"), b.malloc(4, "g_over")
    it = _iters(b)
    # the levels of one search from node 0
    levels, seen, front = [], np.zeros(n, bool), np.array([0])
    seen[0] = True
    while len(front):
        nb_ = np.repeat(start[front], deg[front]) + (np.arange(int(deg[front].sum()))
                                                     - np.repeat(np.cumsum(deg[front]) - deg[front], deg[front]))
        nbrs = dst[nb_]
        levels.append((front, nb_, nbrs))
        new = np.unique(nbrs[~seen[nbrs]])
        seen[new] = True
        front = new
    nl = len(levels)
    ids = _ids(b, 2 * nl, it)
    lv = np.arange(nl)
    k1 = (ids[:, None] + 2 * lv[None, :]).ravel()
    k2 = k1 + 1
    per = {}
    for name, buf, size in (("nodes", nodes, 8), ("edges", edges, 4), ("cost", cost, 4), ("upd", upd, 1),
                            ("vis", vis, 1)):
        ws, os_ = [], []
        for li, (front, nb_, nbrs) in enumerate(levels):
            idx = {"nodes": front, "edges": nb_, "cost": nbrs, "upd": nbrs, "vis": np.concatenate([front, nbrs])}[name]
            ws.append(np.full(len(idx), li))
            os_.append(size * idx.astype(np.int64))
        per[name] = _pages(buf, np.concatenate(os_), np.concatenate(ws))
    for r in range(it):
        sel = slice(r * nl, (r + 1) * nl)
        b.launch(K_BFS1, k1[sel], {"g_graph_nodes": nodes.ptr(), "g_graph_edges": edges.ptr(),
                                   "g_graph_mask": mask.ptr(), "g_updating_graph_mask": upd.ptr(),
                                   "g_graph_visited": vis.ptr(), "g_cost": cost.ptr(), "no_of_nodes": n},
                 grid=(-(-n // 512),), block=(512,), flops=0,
                 touches=[Range(mask, 0, n), *(Ranges(buf, *per[nm], access=READWRITE if nm in ("cost", "upd")
                                                      else READ)
                                               for nm, buf in (("nodes", nodes), ("edges", edges), ("cost", cost),
                                                               ("upd", upd), ("vis", vis)))])
        b.launch(K_BFS2, k2[sel], {"g_graph_mask": mask.ptr(), "g_updating_graph_mask": upd.ptr(),
                                   "g_graph_visited": vis.ptr(), "g_over": over.ptr(), "no_of_nodes": n},
                 grid=(-(-n // 512),), block=(512,),
                 touches=[Range(mask, 0, n, READWRITE), Range(upd, 0, n, READWRITE), Range(vis, 0, n, READWRITE),
                          Range(over, 0, 4, WRITE)])


from .workload import workload  # noqa: E402

WORKLOADS = [
    workload("pb-2dconv", "scientific",
             "PolyBench/GPU 2DCONV: a 3x3 convolution of an n x n float matrix into another, one launch per run. "
             "ARIADNE's 2DC. Templates: linear.", build_2dconv, [K_CONV],
             summary="PolyBench 2D convolution (ARIADNE's benchmark set)"),
    workload("pb-atax", "scientific",
             "PolyBench/GPU ATAX: tmp = A x (a thread per row), then y = A^T tmp (a thread per column); both kernels "
             "read the whole n x n matrix. Templates: linear.", build_atax, [K_ATAX1, K_ATAX2],
             summary="PolyBench ATAX: matrix-transpose-vector product (ARIADNE's benchmark set)"),
    workload("pb-bicg", "scientific",
             "PolyBench/GPU BICG: s = A^T r and q = A p, the BiCGStab sub-kernel; both read the whole matrix. "
             "Templates: linear.", build_bicg, [K_BICG1, K_BICG2],
             summary="PolyBench BiCG sub-kernel (ARIADNE's benchmark set)"),
    workload("pb-gemm", "scientific",
             "PolyBench/GPU GEMM: C = alpha A B + beta C on three n x n matrices, compute-bound (2 n^3 flops). "
             "Templates: linear.", build_gemm, [K_GEMM],
             summary="PolyBench GEMM (ARIADNE's benchmark set)"),
    workload("pb-gesummv", "scientific",
             "PolyBench/GPU GESUMMV (ARIADNE's GEMV): y = alpha A x + beta B x, a thread per row over two matrices. "
             "Templates: linear.", build_gesummv, [K_GESUMMV],
             summary="PolyBench GESUMMV, ARIADNE's GEMV (ARIADNE's benchmark set)"),
    workload("pb-mvt", "scientific",
             "PolyBench/GPU MVT: x1 += A y1 (a thread per row) and x2 += A^T y2 (a thread per column) over one "
             "matrix. Templates: linear.", build_mvt, [K_MVT1, K_MVT2],
             summary="PolyBench MVT (ARIADNE's benchmark set)"),
    workload("hel", "scientific",
             "HeCBench hellinger: Hellinger distances between the rows of X and the columns of Y (a GEMM-shaped "
             "dense kernel, compute-bound). ARIADNE's HEL. Templates: linear.", build_hellinger, [K_HEL],
             summary="HeCBench Hellinger distance (ARIADNE's benchmark set)"),
    workload("nw", "scientific",
             "Rodinia Needleman-Wunsch: score and reference matrices filled in 16x16 tiles along anti-diagonals, "
             "one launch per diagonal (two kernels: upper-left, lower-right); each launch touches its tiles' rows "
             "(17 x 68-byte chunks per tile). Templates: strided.", build_nw, [K_NW1, K_NW2],
             summary="Rodinia Needleman-Wunsch wavefront (ARIADNE's benchmark set)"),
    workload("xsbench", "scientific",
             "XSBench (event-based, 'small': 68 isotopes, 12 materials): each lookup finds a random energy on the "
             "unionized grid, reads that row of the index grid and two points of each of its material's nuclides' "
             "grids; one launch per run. Touches recorded per 4 KiB page. Templates: irregular (random energies), "
             "linear.", build_xsbench, [K_XS],
             summary="XSBench cross-section lookups (ARIADNE's benchmark set)"),
    workload("bfs", "scientific",
             "Rodinia BFS on a random graph (degrees 1-11): per level, Kernel expands the frontier's edge lists and "
             "marks neighbours (cost, visited, updating mask), Kernel2 folds the updating mask into the next "
             "frontier. Touches recorded per 4 KiB page. Templates: irregular (the graph), linear (the masks).",
             build_bfs, [K_BFS1, K_BFS2],
             summary="Rodinia breadth-first search (ARIADNE's benchmark set)"),
]

# ARIADNE's Table I names -> these models
ARIADNE = {"2DC": "pb-2dconv", "ATAX": "pb-atax", "BICG": "pb-bicg", "GEMM": "pb-gemm", "GEMV": "pb-gesummv",
           "MVT": "pb-mvt", "XSB": "xsbench", "BFS": "bfs", "HEL": "hel", "NW": "nw"}
