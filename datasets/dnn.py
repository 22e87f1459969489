"""Deep-learning workload models: mlp-train and cnn-infer."""

from __future__ import annotations

import numpy as np

from .engine import READWRITE, WRITE, Builder, Kernel, Range, Strided, Struct, register_struct, scaled
from .scientific import size_factor
from .workload import workload

# ---------------------------------------------------------------------------
# GEMMs as a BLAS would take them: C[M x N] = alpha * op(A) op(B) + beta * C, row-major

_GEMM_PARAMS = [("M", "int"), ("N", "int"), ("K", "int"), ("alpha", "float"), ("A", "const float*"),
                ("lda", "int"), ("B", "const float*"), ("ldb", "int"), ("beta", "float"), ("C", "float*"),
                ("ldc", "int")]
_GEMM_CLASSES = {"A": "linear", "B": "linear", "C": "linear"}
K_SGEMM_NN = Kernel("sgemm_nn", _GEMM_PARAMS, _GEMM_CLASSES)
K_SGEMM_NT = Kernel("sgemm_nt", _GEMM_PARAMS, _GEMM_CLASSES)
K_SGEMM_TN = Kernel("sgemm_tn", _GEMM_PARAMS, _GEMM_CLASSES)


def gemm(b: Builder, kern: Kernel, ids, M, N, K, A, a_off, B, b_off, C, c_off, *, beta=0.0):
    """One block of GEMM launches; M, N, K (arrays or ints) in elements; offsets in bytes."""
    M, N, K = (np.asarray(v, np.int64) for v in (M, N, K))
    lda = K if kern is not K_SGEMM_TN else M
    ldb = N if kern is not K_SGEMM_NT else K
    b.launch(kern, ids, {"M": M, "N": N, "K": K, "alpha": 1.0, "A": A.ptr(a_off), "lda": lda, "B": B.ptr(b_off),
                         "ldb": ldb, "beta": beta, "C": C.ptr(c_off), "ldc": N},
             grid=(-(-N // 128), -(-M // 128)), block=(256,), flops=2 * M * N * K,
             touches=[Range(A, a_off, 4 * M * K), Range(B, b_off, 4 * K * N),
                      Range(C, c_off, 4 * M * N, READWRITE if beta else WRITE)])


# ---------------------------------------------------------------------------
# mlp-train

K_BIAS_ADD = Kernel("bias_add", [("y", "float*"), ("bias", "const float*"), ("rows", "int"), ("cols", "int")],
                    {"y": "linear", "bias": "linear"})
K_RELU = Kernel("relu_inplace", [("x", "float*")], {"x": "linear"})
K_RELU_BWD = Kernel("relu_backward", [("dy", "float*"), ("y", "const float*"), ("n", "long")],
                    {"dy": "linear", "y": "linear"})
K_BIAS_GRAD = Kernel("bias_grad", [("dy", "const float*"), ("db", "float*"), ("rows", "int"), ("cols", "int")],
                     {"dy": "linear", "db": "linear"})
K_XENT = Kernel("softmax_xent", [("logits", "const float*"), ("labels", "const int*"), ("loss", "float*"),
                                 ("dlogits", "float*"), ("batch", "int"), ("classes", "int")],
                {"logits": "linear", "labels": "linear", "loss": "fixed", "dlogits": "linear"})
K_SGD = Kernel("sgd_momentum", [("params", "float*"), ("grads", "const float*"), ("momentum", "float*"),
                                ("numel", "const long*"), ("lr", "float"), ("mu", "float"),
                                ("weight_decay", "float")],
               {"params": "allocation", "grads": "allocation", "momentum": "allocation", "numel": "fixed"})
MLP_KERNELS = [K_SGEMM_NN, K_SGEMM_NT, K_SGEMM_TN, K_BIAS_ADD, K_RELU, K_RELU_BWD, K_BIAS_GRAD, K_XENT, K_SGD]


def _align(x: int, a: int = 256) -> int:
    return -(-x // a) * a


def build_mlp_train(b: Builder) -> None:
    rng, s = b.rng, b.scale
    sf = np.sqrt(size_factor(s))
    # distinct layer widths (multiples of 256), so that no two GEMM dimensions coincide by accident
    lo, hi = max(1, int(0.6 * 1024 * sf / 256)), max(4, int(1.6 * 1024 * sf / 256)) + 1
    d_in, *hidden = (int(v) * 256 for v in rng.choice(np.arange(lo, hi), 4, replace=False))
    classes = 256
    dims = [d_in, *hidden, classes]
    L = len(dims) - 1
    bmax = int(rng.choice([64, 128, 256]))
    dataset = int(bmax * rng.uniform(5.3, 9.7))   # the last batch of each epoch is short
    # two parameter groups, as optimizers keep them: weights (with weight decay) and biases
    # (without), each one flat buffer (256-byte aligned tensors); grads and momentum alike
    w_off, b_off, woff, boff = [], [], 0, 0
    for l in range(L):
        w_off.append(woff)
        woff += _align(4 * dims[l] * dims[l + 1])
        b_off.append(boff)
        boff += _align(4 * dims[l + 1])
    group_bytes = [woff, boff]
    pg = [b.malloc(n, f"params_{g}") for g, n in zip(("decay", "no_decay"), group_bytes)]
    gg = [b.malloc(n, f"grads_{g}") for g, n in zip(("decay", "no_decay"), group_bytes)]
    mg = [b.malloc(n, f"momentum_{g}") for g, n in zip(("decay", "no_decay"), group_bytes)]
    params, grads = pg[0], gg[0]
    meta = b.malloc(4096, "numel")            # the element counts live only in device memory
    acts = [b.malloc(4 * bmax * d, f"act{l}") for l, d in enumerate(dims)]
    dacts = [None] + [b.malloc(4 * bmax * d, f"dact{l}") for l, d in enumerate(dims) if l > 0]
    labels = b.malloc(4 * bmax, "labels")
    loss = b.malloc(4096, "loss")

    ops: list[tuple] = []
    for l in range(L):
        ops += [("fwd_gemm", l), ("bias_add", l)] + ([("relu", l)] if l < L - 1 else [])
    ops += [("loss",)]
    for l in range(L - 1, -1, -1):
        if l < L - 1:
            ops += [("relu_bwd", l)]
        ops += [("dw", l), ("db", l)] + ([("dx", l)] if l > 0 else [])
    ops += [("sgd", 0), ("sgd", 1)]
    steps = max(1, round(10_000 * s / len(ops)))
    per_epoch = -(-dataset // bmax)
    step = np.arange(steps, dtype=np.int64)
    last = (step % per_epoch) == per_epoch - 1
    B = np.where(last, dataset - (per_epoch - 1) * bmax, bmax).astype(np.int64)
    base = b.reserve(steps * len(ops))
    for i, op in enumerate(ops):
        ids = base + step * len(ops) + i
        kind = op[0]
        if kind == "fwd_gemm":
            l = op[1]
            gemm(b, K_SGEMM_NN, ids, B, dims[l + 1], dims[l], acts[l], 0, params, w_off[l], acts[l + 1], 0)
        elif kind == "bias_add":
            l = op[1]
            n = dims[l + 1]
            b.launch(K_BIAS_ADD, ids, {"y": acts[l + 1].ptr(), "bias": pg[1].ptr(b_off[l]), "rows": B, "cols": n},
                     grid=(-(-B * n // 256),), flops=B * n,
                     touches=[Range(acts[l + 1], 0, 4 * B * n, READWRITE), Range(pg[1], b_off[l], 4 * n)])
        elif kind == "relu":
            l = op[1]
            n = B * dims[l + 1]          # a multiple of 256: the grid covers it exactly
            b.launch(K_RELU, ids, {"x": acts[l + 1].ptr()}, grid=(n // 256,), block=(256,), flops=n,
                     touches=[Range(acts[l + 1], 0, 4 * n, READWRITE)])
        elif kind == "loss":
            n = dims[-1]
            b.launch(K_XENT, ids, {"logits": acts[L].ptr(), "labels": labels.ptr(), "loss": loss.ptr(),
                                   "dlogits": dacts[L].ptr(), "batch": B, "classes": n},
                     grid=B, block=(256,), flops=5 * B * n,
                     touches=[Range(acts[L], 0, 4 * B * n), Range(labels, 0, 4 * B), Range(loss, 0, 4, READWRITE),
                              Range(dacts[L], 0, 4 * B * n, WRITE)])
        elif kind == "relu_bwd":
            l = op[1]
            n = B * dims[l + 1]
            b.launch(K_RELU_BWD, ids, {"dy": dacts[l + 1].ptr(), "y": acts[l + 1].ptr(), "n": n},
                     grid=(-(-n // 1024),), flops=n,
                     touches=[Range(dacts[l + 1], 0, 4 * n, READWRITE), Range(acts[l + 1], 0, 4 * n)])
        elif kind == "dw":
            l = op[1]
            gemm(b, K_SGEMM_TN, ids, dims[l], dims[l + 1], B, acts[l], 0, dacts[l + 1], 0, grads, w_off[l])
        elif kind == "db":
            l = op[1]
            n = dims[l + 1]
            b.launch(K_BIAS_GRAD, ids, {"dy": dacts[l + 1].ptr(), "db": gg[1].ptr(b_off[l]), "rows": B, "cols": n},
                     grid=(-(-n // 256),), flops=B * n,
                     touches=[Range(dacts[l + 1], 0, 4 * B * n), Range(gg[1], b_off[l], 4 * n, WRITE)])
        elif kind == "dx":
            l = op[1]
            gemm(b, K_SGEMM_NT, ids, B, dims[l], dims[l + 1], dacts[l + 1], 0, params, w_off[l], dacts[l], 0)
        elif kind == "sgd":
            g = op[1]
            nb = group_bytes[g]
            b.launch(K_SGD, ids, {"params": pg[g].ptr(), "grads": gg[g].ptr(), "momentum": mg[g].ptr(),
                                  "numel": meta.ptr(8 * g), "lr": 1e-3, "mu": 0.9,
                                  "weight_decay": 1e-4 if g == 0 else 0.0},
                     grid=(1024,), block=(256,), flops=4 * nb // 4,
                     touches=[Range(pg[g], 0, nb, READWRITE), Range(gg[g], 0, nb),
                              Range(mg[g], 0, nb, READWRITE), Range(meta, 8 * g, 8)])


# ---------------------------------------------------------------------------
# cnn-infer: an Inception-style CNN, convolutions as implicit GEMM over NCHW tensors

TENSOR_DESC = register_struct(Struct("TensorDesc", (
    ("data", "float*"), ("n", "int"), ("c", "int"), ("h", "int"), ("w", "int"),
    ("nstride", "long"), ("dtype", "int"), ("layout", "int"))))            # 40 bytes
CONV_PARAMS = register_struct(Struct("ConvParams", (
    ("pad_h", "int"), ("pad_w", "int"), ("stride_h", "int"), ("stride_w", "int"),
    ("dil_h", "int"), ("dil_w", "int"), ("groups", "int"), ("activation", "int"))))  # 32 bytes

K_CONV = Kernel("conv2d_implicit_gemm", [("x", "TensorDesc"), ("w", "TensorDesc"), ("y", "TensorDesc"),
                                         ("bias", "const float*"), ("p", "ConvParams")],
                {"x.data": "linear", "w.data": "linear", "y.data": "strided", "bias": "linear"})
K_MAXPOOL = Kernel("maxpool2d", [("x", "TensorDesc"), ("y", "TensorDesc"), ("k", "int"), ("stride", "int")],
                   {"x.data": "linear", "y.data": "linear"})
K_AVGPOOL = Kernel("global_avgpool", [("x", "TensorDesc"), ("out", "float*")],
                   {"x.data": "linear", "out": "linear"})
K_SOFTMAX = Kernel("softmax_rows", [("x", "float*"), ("rows", "int"), ("cols", "int")], {"x": "linear"})
CNN_KERNELS = [K_CONV, K_MAXPOOL, K_AVGPOOL, K_SGEMM_NN, K_BIAS_ADD, K_SOFTMAX]


def _desc(prefix: str, buf, off, n, c, h, w, nstride) -> dict:
    return {f"{prefix}.data": buf.ptr(off), f"{prefix}.n": n, f"{prefix}.c": c, f"{prefix}.h": h,
            f"{prefix}.w": w, f"{prefix}.nstride": nstride, f"{prefix}.dtype": 0, f"{prefix}.layout": 0}


def build_cnn_infer(b: Builder) -> None:
    rng, s = b.rng, b.scale
    side = scaled(48 * np.sqrt(size_factor(s)), 1, multiple=8, minimum=24)
    c0 = int(rng.choice([24, 40, 48]))
    stages = 4
    # channels per stage and per inception branch (1x1, 3x3, pool-proj)
    chans, c = [], c0
    for st in range(stages):
        # branch widths: seeded multiples of 8 (of 16 for the 3x3 branch, which has a reduce of half)
        br = (8 * (st + 1) * int(rng.integers(2, 6)), 16 * (st + 1) * int(rng.integers(2, 6)),
              8 * (st + 1) * int(rng.integers(1, 4)))
        chans.append((c, br, sum(br)))
        c = sum(br)
    n_classes = 1000
    # flat weights: stem, per stage (b1 1x1, b2 reduce 1x1, b2 3x3, b3 proj 1x1), fc
    w_layout: dict[str, tuple[int, int]] = {}
    off = 0

    def addw(key, nelem):
        nonlocal off
        w_layout[key] = (off, nelem)
        off += _align(4 * nelem)
    addw("stem", c0 * 3 * 3 * 3)
    addw("stem_b", c0)
    for st, (cin, (b1, b2, b3), cout) in enumerate(chans):
        addw(f"s{st}b1", b1 * cin)
        addw(f"s{st}b2r", (b2 // 2) * cin)
        addw(f"s{st}b2", b2 * (b2 // 2) * 9)
        addw(f"s{st}b3", b3 * cin)
        addw(f"s{st}bias", cout + b2 // 2)
    c_last = chans[-1][2]
    addw("fc", c_last * n_classes)
    addw("fc_b", n_classes)
    weights = b.malloc(off, "weights")
    nmax = 32
    # activation arena: two ping-pong buffers plus two temporaries, each as big as the largest tensor
    biggest = max(nmax * max(cout, cin) * (side >> st) ** 2 for st, (cin, _, cout) in enumerate(chans))
    biggest = max(biggest, nmax * 3 * side * side, nmax * c0 * side * side)
    act = [b.malloc(4 * biggest, f"act{i}") for i in range(2)]
    tmp = [b.malloc(4 * biggest, f"tmp{i}") for i in range(2)]
    pooled = b.malloc(4 * nmax * c_last, "pooled")
    logits = b.malloc(4 * nmax * n_classes, "logits")

    ops: list[tuple] = [("stem",)]
    for st in range(stages):
        ops += [("b1", st), ("b2r", st), ("b2", st), ("b3pool", st), ("b3", st), ("pool", st)]
    ops += [("avgpool",), ("fc",), ("fc_bias",), ("softmax",)]
    reqs = max(1, round(10_000 * s / len(ops)))
    N = rng.integers(1, nmax + 1, reqs).astype(np.int64)   # images per request
    base = b.reserve(reqs * len(ops))
    r = np.arange(reqs, dtype=np.int64)

    def conv(ids, x, xoff, cin, h, y, yoff, cout_slice, cout_total, wkey, bias_off, k, flops_k):
        hw = h * h
        woff, _ = w_layout[wkey]
        args = {**_desc("x", x, xoff, N, cin, h, h, cin * hw),
                **_desc("w", weights, woff, cout_slice, cin, k, k, cin * k * k),
                **_desc("y", y, yoff, N, cout_slice, h, h, cout_total * hw),
                "bias": weights.ptr(bias_off), "p.pad_h": k // 2, "p.pad_w": k // 2, "p.stride_h": 1,
                "p.stride_w": 1, "p.dil_h": 1, "p.dil_w": 1, "p.groups": 1, "p.activation": 1}
        b.launch(K_CONV, ids, args, grid=(-(-N * hw // 128), -(-cout_slice // 64)), block=(256,),
                 shared=49152, flops=2 * N * hw * cout_slice * cin * flops_k,
                 touches=[Range(x, xoff, 4 * N * cin * hw), Range(weights, woff, 4 * cout_slice * cin * k * k),
                          Range(weights, bias_off, 4 * cout_slice),
                          Strided(y, yoff, 4 * cout_slice * hw, 4 * cout_total * hw, N, WRITE)])

    for i, op in enumerate(ops):
        ids = base + r * len(ops) + i
        kind = op[0]
        if kind == "stem":
            conv(ids, tmp[1], 0, 3, side, act[0], 0, c0, c0, "stem", w_layout["stem_b"][0], 3, 9)
            continue
        if kind in ("avgpool", "fc", "fc_bias", "softmax"):
            h = side >> stages
            src = act[stages % 2]
            if kind == "avgpool":
                b.launch(K_AVGPOOL, ids, {**_desc("x", src, 0, N, c_last, h, h, c_last * h * h),
                                          "out": pooled.ptr()},
                         grid=(N, -(-c_last // 256)), block=(256,), flops=N * c_last * h * h,
                         touches=[Range(src, 0, 4 * N * c_last * h * h), Range(pooled, 0, 4 * N * c_last, WRITE)])
            elif kind == "fc":
                gemm(b, K_SGEMM_NN, ids, N, n_classes, c_last, pooled, 0, weights, w_layout["fc"][0], logits, 0)
            elif kind == "fc_bias":
                bo = w_layout["fc_b"][0]
                b.launch(K_BIAS_ADD, ids, {"y": logits.ptr(), "bias": weights.ptr(bo), "rows": N, "cols": n_classes},
                         grid=(-(-N * n_classes // 256),), flops=N * n_classes,
                         touches=[Range(logits, 0, 4 * N * n_classes, READWRITE), Range(weights, bo, 4 * n_classes)])
            else:
                b.launch(K_SOFTMAX, ids, {"x": logits.ptr(), "rows": N, "cols": n_classes}, grid=N, block=(256,),
                         flops=3 * N * n_classes, touches=[Range(logits, 0, 4 * N * n_classes, READWRITE)])
            continue
        st = op[1]
        cin, (b1, b2, b3), cout = chans[st]
        h = side >> st
        hw = h * h
        src, dst = act[st % 2], act[(st + 1) % 2]
        bias0 = w_layout[f"s{st}bias"][0]
        if kind == "b1":     # branch 1: 1x1 conv into channels [0, b1) of the concat output (tmp[0])
            conv(ids, src, 0, cin, h, tmp[0], 0, b1, cout, f"s{st}b1", bias0, 1, 1)
        elif kind == "b2r":  # branch 2: 1x1 reduce into tmp[1] (contiguous)
            conv(ids, src, 0, cin, h, tmp[1], 0, b2 // 2, b2 // 2, f"s{st}b2r", bias0 + 4 * cout, 1, 1)
        elif kind == "b2":   # then 3x3 into channels [b1, b1 + b2)
            conv(ids, tmp[1], 0, b2 // 2, h, tmp[0], 4 * b1 * hw, b2, cout, f"s{st}b2", bias0 + 4 * b1, 3, 9)
        elif kind == "b3pool":  # branch 3: 3x3 max pool (stride 1) into tmp[1]
            b.launch(K_MAXPOOL, ids, {**_desc("x", src, 0, N, cin, h, h, cin * hw),
                                      **_desc("y", tmp[1], 0, N, cin, h, h, cin * hw), "k": 3, "stride": 1},
                     grid=(-(-N * cin * hw // 256),), flops=9 * N * cin * hw,
                     touches=[Range(src, 0, 4 * N * cin * hw), Range(tmp[1], 0, 4 * N * cin * hw, WRITE)])
        elif kind == "b3":   # then a 1x1 projection into channels [b1 + b2, cout)
            conv(ids, tmp[1], 0, cin, h, tmp[0], 4 * (b1 + b2) * hw, b3, cout, f"s{st}b3", bias0 + 4 * (b1 + b2), 1, 1)
        elif kind == "pool":  # 2x2 max pool, stride 2: the concat output -> next stage's input
            ho = h // 2
            b.launch(K_MAXPOOL, ids, {**_desc("x", tmp[0], 0, N, cout, h, h, cout * hw),
                                      **_desc("y", dst, 0, N, cout, ho, ho, cout * ho * ho), "k": 2, "stride": 2},
                     grid=(-(-N * cout * ho * ho // 256),), flops=4 * N * cout * ho * ho,
                     touches=[Range(tmp[0], 0, 4 * N * cout * hw), Range(dst, 0, 4 * N * cout * ho * ho, WRITE)])


WORKLOADS = [
    workload("mlp-train", "deep-learning",
             "Training a 4-layer MLP (fp32): per step forward GEMMs (M*K, K*N, M*N regions, weights at offsets "
             "inside one flat parameter buffer), bias add, in-place ReLU whose footprint is grid_x*block_x*4 "
             "(no size argument), softmax cross-entropy (4-byte loss: fixed), backward GEMMs (nt, tn), ReLU "
             "and bias gradients, and SGD with momentum over two parameter groups (weights with weight decay, "
             "biases without), each a flat parameter, gradient and momentum buffer whose element count lives "
             "only in device memory (allocation: one kernel, two region sizes). Batch size changes at "
             "each epoch's short last batch. Templates: linear, fixed, allocation.",
             build_mlp_train, MLP_KERNELS,
             summary="MLP training: GEMMs, bias, ReLU, loss, SGD over a flat parameter buffer"),
    workload("cnn-infer", "deep-learning",
             "Batched inference of an Inception-style CNN: convolutions as implicit GEMM taking 40-byte "
             "TensorDesc structs {u64 data; i32 n,c,h,w; i64 nstride; i32 dtype,layout} and a 32-byte "
             "ConvParams struct by value; branch convolutions write channel slices of the concat output "
             "(strided: n chunks of c*h*w*4 bytes every nstride*4), max pooling, global average pooling, a "
             "classifier GEMM and softmax; requests of 1-32 images; channel widths seeded (multiples of 8). Templates: linear, strided "
             "(struct fields).",
             build_cnn_infer, CNN_KERNELS,
             summary="Inception-style CNN inference: implicit-GEMM convs on NCHW descriptors"),
]
