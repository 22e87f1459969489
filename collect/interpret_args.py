"""A Triton launch's arguments as the compiled kernel's CUDA parameter buffer would hold them.

Under `TRITON_INTERPRET=1` nothing is compiled, so this module applies the rules a
compiled Triton 3.9 kernel's launcher follows (docs/collect.md, "Argument bytes under
--interpret", which cites the Triton sources they were read from):

- the specialization of every argument comes from Triton's own binder
  (`triton.runtime.jit.create_function_from_signature` over `KernelParam`s, which calls
  `native_specialize_impl`): an integer is `i32` when it fits in 32 bits, else `i64`
  (`u64` past 2^63); an integer equal to 1, and `None`, become constexprs unless the
  kernel lists them in `do_not_specialize`; a Python float is `fp32`, a bool `u1`; an
  annotation (`x: tl.int64`) fixes the type; `tl.constexpr` parameters are constexprs;
- the kernel's parameters are the non-constexpr arguments in order, tuples flattened,
  each naturally aligned (pointers 8 bytes; i8/u8/u1 1, i16/u16/fp16/bf16 2,
  i32/u32/fp32 4, i64/u64/fp64 8), then two trailing pointers, `global_scratch` and
  `profile_scratch` (0 when the kernel needs no scratch memory, which the interpreter
  cannot tell; counted as such);
- floats are converted as the launcher converts them (fp32: a C `float` cast; bf16: the
  top 16 bits of the fp32; fp16: IEEE half).

Pointer values are the managed addresses the collector placed each tensor's storage at
(`address_of`), so the buffer reads as a GPU collection's would.
"""

from __future__ import annotations

import inspect
import struct
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from pagecast.errors import InputError

# Triton releases (major.minor) whose parameter-buffer rules and interpreter hooks were
# read and tested (triton 3.9.0's runtime/jit.py, runtime/interpreter.py and
# backends/nvidia/driver.py/.c). Another version may lay the buffer out differently.
SUPPORTED_TRITON = ("3.9",)

_SIZES = {"i1": 1, "u1": 1, "i8": 1, "u8": 1, "i16": 2, "u16": 2, "fp16": 2, "bf16": 2,
          "i32": 4, "u32": 4, "fp32": 4, "f32": 4, "i64": 8, "u64": 8, "fp64": 8}
_INT_FMT = {"i1": "<b", "u1": "<B", "i8": "<b", "u8": "<B", "i16": "<h", "u16": "<H", "i32": "<i", "u32": "<I",
            "i64": "<q", "u64": "<Q"}
# pointer types whose buffers may hold index values (the trace's values table): 2-, 4- and 8-byte
# integers (8-bit and 1-bit ones are masks and bytes, not indices)
INDEX_POINTER_TYPES = frozenset({"*i16", "*u16", "*i32", "*u32", "*i64", "*u64"})


class UnsupportedLaunch(InputError):
    """A launch whose parameter buffer this module cannot reproduce (one line, exit 2)."""


def check_triton_version(version: str) -> None:
    """InputError (exit 2) unless `version` is one whose rules this module implements."""
    parts = str(version).split(".")
    if ".".join(parts[:2]) not in SUPPORTED_TRITON:
        raise InputError(f"collect --interpret implements the parameter rules of Triton "
                         f"{', '.join(SUPPORTED_TRITON)}, found triton {version}; "
                         f"install a supported version (pip install 'triton=={SUPPORTED_TRITON[-1]}.*')")


@dataclass(frozen=True)
class Packed:
    """One launch's parameter buffer."""

    offsets: list[int]
    sizes: list[int]
    data: bytes
    pointers: list[tuple[int, int]]   # (byte offset, managed address) of every pointer parameter given a tensor
    names: list[str]                  # parameter names (tuple members as name[i])
    # (byte offset, managed address, tensor) of the pointer parameters to integer tensors: the
    # buffers whose values may choose a kernel's pages (ids, indices, block tables)
    int_pointers: list = field(default_factory=list)


class ArgPacker:
    """Packs the arguments of one @triton.jit function (one per kernel, cached by the collector)."""

    def __init__(self, fn: Callable, do_not_specialize=(), do_not_specialize_on_alignment=()) -> None:
        from triton.backends.compiler import BaseBackend
        from triton.runtime.jit import KernelParam, create_function_from_signature
        self.name = fn.__name__
        sig = inspect.signature(fn)
        dns = set(do_not_specialize or ())
        dnsa = set(do_not_specialize_on_alignment or ())
        params = []
        for i, p in enumerate(sig.parameters.values()):
            params.append(KernelParam(i, p, i in dns or p.name in dns, i in dnsa or p.name in dnsa))
        self.param_names = [p.name for p in sig.parameters.values()]
        self._binder = create_function_from_signature(sig, params, BaseBackend)

    def pack(self, args: tuple, kwargs: dict, address_of: Callable[[Any], int]) -> Packed:
        try:
            bound, spec, _options = self._binder(*args, **kwargs)
        except TypeError as e:
            raise UnsupportedLaunch(f"kernel {self.name}: {e}") from None
        slots: list[tuple[str, str, Any]] = []
        for name, (ty, _attr) in zip(self.param_names, spec):
            _flatten(name, ty, bound[name], slots)
        offsets, sizes, pointers, names, int_pointers = [], [], [], [], []
        buf = bytearray()
        for name, ty, value in [*slots, *((s, "*scratch", None) for s in ("global_scratch", "profile_scratch"))]:
            size = 8 if ty.startswith("*") else _SIZES.get(ty)
            if size is None:
                raise UnsupportedLaunch(f"kernel {self.name}: argument {name} has type {ty!r}, whose parameter "
                                        "layout depends on the compiled kernel (tensor descriptors are not supported)")
            off = -(-len(buf) // size) * size
            buf.extend(b"\0" * (off - len(buf)))
            if ty.startswith("*"):
                if value is None:
                    raw = 0
                elif isinstance(value, (int, np.integer)):
                    raw = int(value)
                else:
                    raw = address_of(value)
                    pointers.append((off, raw))
                    if ty in INDEX_POINTER_TYPES:
                        int_pointers.append((off, raw, value))
                buf += struct.pack("<Q", raw & 0xFFFF_FFFF_FFFF_FFFF)
            else:
                buf += _scalar_bytes(self.name, name, ty, value)
            offsets.append(off)
            sizes.append(size)
            names.append(name)
        return Packed(offsets, sizes, bytes(buf), pointers, names, int_pointers)


def _flatten(name: str, ty, value, out: list) -> None:
    """Non-constexpr (name, type, value) slots, tuples flattened in order."""
    if isinstance(ty, tuple):
        for i, (t, v) in enumerate(zip(ty, value)):
            _flatten(f"{name}[{i}]", t, v, out)
        return
    if ty == "constexpr":
        return
    out.append((name, ty, value))


def _scalar_bytes(kernel: str, name: str, ty: str, value) -> bytes:
    try:
        if ty in _INT_FMT:
            v = int(value)
            bits = 8 * _SIZES[ty]
            return struct.pack(_INT_FMT[ty], v if ty[0] == "i" else v & ((1 << bits) - 1))
        v = float(value)
        if ty in ("fp32", "f32"):
            return np.float32(v).tobytes()
        if ty == "fp64":
            return struct.pack("<d", v)
        if ty == "fp16":
            return np.float16(v).tobytes()
        if ty == "bf16":
            return (np.array([v], np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
    except (TypeError, ValueError, OverflowError, struct.error) as e:
        raise UnsupportedLaunch(f"kernel {kernel}: argument {name} ({ty}) = {value!r} does not fit: {e}") from None
    raise UnsupportedLaunch(f"kernel {kernel}: argument {name} has unsupported type {ty!r}")
