"""The small fixes real Triton programs (Liger-Kernel among them) need to run under Triton's
interpreter on the CPU. `collect --interpret` applies them all before the workload starts
(docs/collect.md, "Compatibility fixes"); each is a few lines, and none changes what a
kernel reads or writes.

1. `float_args_as_fp32`: a compiled kernel receives a non-constexpr Python float as an fp32
   scalar, but the interpreter (triton 3.9 `runtime/interpreter.py`, `_implicit_cvt`) hands
   the kernel the Python float itself, so kernels that call `eps.to(tl.float32)` fail with
   "'float' object has no attribute 'to'" (Liger's RMSNorm, LayerNorm, SwiGLU, GroupNorm,
   KL divergence). Floats are wrapped as fp32 scalar tensors, as compiled code sees them.
2. `libdevice_numpy`: the functions of `triton.language.extra.libdevice` (and its `cuda`
   twin) are compile-time stubs whose bodies are `...`: under the interpreter `tanh(x)`
   returns None (Liger's GeGLU, cross-entropy with softcapping; `rsqrt` in the norms).
   They are replaced by numpy versions before the workload imports them.
3. `autotune_first_config`: `@triton.autotune` benchmarks its configs with the GPU driver
   (`Autotuner._bench` -> `do_bench`), which fails on the CPU with "0 active drivers".
   The first config (after the kernel's own pruning) is used and nothing is benchmarked;
   a GPU's autotuner may pick another config, and so another grid (docs/collect.md).
   (Liger's DyT needs it; the tiled matmul of the corpus is autotuned as Triton's tutorial is.)
4. `comparisons_as_int1`: the interpreter types a comparison's result with its operands'
   type (`InterpreterBuilder.binary_op` keeps `lhs.dtype`) while its data is numpy bool. A
   scalar comparison broadcast against a block is then splat as an integer array, and a mask
   built from it, as `(cols < n) & (token >= lo)` in sglang's vocab-parallel embedding,
   reaches `create_masked_load` as int32 and fails ("mask has unsupported dtype"); compiled
   code has i1 there. Every `create_icmp*`/`create_fcmp*` result is typed `int1`.
Liger's host code also asks for the SM count where a tensor is on CUDA and uses 1 on the
CPU (RMSNorm and LayerNorm backward: one program over all rows); that needs no fix, but it
shapes those kernels' grids. DyT has no CPU value and fails in its host code; it is not
in the corpus (docs/workloads-triton.md).
"""

from __future__ import annotations

import importlib
import math
from typing import Callable

import numpy as np

FIXES = ("float_args_as_fp32", "libdevice_numpy", "autotune_first_config", "comparisons_as_int1")


def apply_all() -> list[str]:
    """Apply every fix (idempotent); returns their names, for the manifest."""
    for name in FIXES:
        globals()["_" + name]()
    return list(FIXES)


# ---- 1 ---------------------------------------------------------------------------------

def _float_args_as_fp32() -> None:
    import triton.language as tl
    from triton.runtime import interpreter as I
    if getattr(I._implicit_cvt, "_pagecast", False):
        return
    orig = I._implicit_cvt

    def implicit_cvt(arg):
        if isinstance(arg, float):
            return tl.tensor(I.TensorHandle(np.array([arg], dtype=np.float32), tl.float32), tl.float32)
        return orig(arg)

    implicit_cvt._pagecast = True
    I._implicit_cvt = implicit_cvt


# ---- 2 ---------------------------------------------------------------------------------

def _np_unary(fn: Callable) -> Callable:
    def standin(arg0, _semantic=None):
        return _wrap(fn(_data(arg0)), arg0)
    return standin


def _np_binary(fn: Callable) -> Callable:
    def standin(arg0, arg1, _semantic=None):
        return _wrap(fn(_data(arg0), _data(arg1)), arg0, arg1)
    return standin


def _data(x):
    return x.handle.data if hasattr(x, "handle") else np.asarray(x)


def _wrap(values: np.ndarray, *like):
    """A tl.tensor of `values`, typed as the first floating tensor argument (else fp32)."""
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle
    src = next((x for x in like if hasattr(x, "handle")), None)
    if src is not None and src.dtype.is_floating():
        if src.handle.data.dtype.kind != "f":  # bf16 and fp8 are kept as raw bits
            raise TypeError(f"libdevice stand-in: {src.dtype} is stored as raw bits in the interpreter;"
                            " cast to tl.float32 first")
        ty, np_ty = src.type, src.handle.data.dtype
    elif src is not None and src.type.is_block():
        ty, np_ty = tl.block_type(tl.float32, src.type.get_block_shapes()), np.float32
    else:
        ty, np_ty = tl.float32, np.float32
    return tl.tensor(TensorHandle(np.asarray(values).astype(np_ty), ty.scalar), ty)


def _erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x)


_UNARY = {
    "tanh": np.tanh, "rsqrt": lambda x: 1.0 / np.sqrt(x), "sqrt": np.sqrt, "exp": np.exp, "exp2": np.exp2,
    "expm1": np.expm1, "log": np.log, "log2": np.log2, "log10": np.log10, "log1p": np.log1p,
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
    "sinh": np.sinh, "cosh": np.cosh, "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh,
    "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc, "rint": np.rint, "fabs": np.abs, "erf": _erf,
}
_BINARY = {"pow": np.power, "atan2": np.arctan2, "fmod": np.fmod, "fmax": np.fmax, "fmin": np.fmin,
           "hypot": np.hypot}


def _libdevice_numpy() -> None:
    for modname in ("triton.language.extra.libdevice", "triton.language.extra.cuda.libdevice"):
        try:
            mod = importlib.import_module(modname)
        except ImportError:
            continue
        for name, fn in _UNARY.items():
            if hasattr(mod, name) and not getattr(getattr(mod, name), "_pagecast", False):
                f = _np_unary(fn)
                f._pagecast = True
                setattr(mod, name, f)
        for name, fn in _BINARY.items():
            if hasattr(mod, name) and not getattr(getattr(mod, name), "_pagecast", False):
                f = _np_binary(fn)
                f._pagecast = True
                setattr(mod, name, f)


# ---- 3 ---------------------------------------------------------------------------------

def _autotune_first_config() -> None:
    from triton.runtime.autotuner import Autotuner
    if getattr(Autotuner.prune_configs, "_pagecast", False):
        return
    orig = Autotuner.prune_configs

    def prune_configs(self, kwargs):
        return orig(self, kwargs)[:1]

    prune_configs._pagecast = True
    Autotuner.prune_configs = prune_configs



# ---- 4 ---------------------------------------------------------------------------------

def _comparisons_as_int1() -> None:
    import triton.language as tl
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle
    for name in dir(InterpreterBuilder):
        if not name.startswith(("create_icmp", "create_fcmp")):
            continue
        orig = getattr(InterpreterBuilder, name)
        if getattr(orig, "_pagecast", False):
            continue

        def cmp(self, lhs, rhs, _orig=orig):
            out = _orig(self, lhs, rhs)
            return TensorHandle(np.asarray(out.data, dtype=np.bool_), tl.int1)

        cmp._pagecast = True
        setattr(InterpreterBuilder, name, cmp)
