"""Gathering a launch's parameter bytes from its `void** kernelParams` in compiled code.

At every launch the CUPTI callback turns `kernelParams` (one pointer per parameter) into the
parameter buffer the trace stores: parameter i's `sizes[i]` bytes, read where
`kernelParams[i]` points, copied to `offsets[i]`. With ctypes that is a pointer read and a
`memmove` per parameter, 5.5-6.5 us a launch on the workload models' kernels
(docs/performance.md), more than the rest of the runner's callback. Here one numba call reads the
pointer table and copies every parameter (the raw addresses become pointers through a small LLVM
intrinsic, `_u8_ptr` / `_u64_ptr`), and the layout's arrays are made once per layout.
`gather_into` writes into a slot of a preallocated buffer instead of a new one (the collector's
natural-mode launch buffer, collect/launch_ring.py).

The caller guarantees what the ctypes version relied on too: `kernelParams` holds a valid pointer
per parameter, each to at least its parameter's size of readable memory (the driver's contract
for a launch). A null entry is reported, not read.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit, types
from numba.extending import intrinsic

from pagecast.jit import entry_point

MAX_LAYOUTS = 4096   # layouts kept (one per kernel signature; a program has tens to a few thousand)


@intrinsic
def _u8_ptr(typingctx, addr):
    """An integer address as a `uint8*`."""
    if not isinstance(addr, types.Integer):
        return None
    ptr = types.CPointer(types.uint8)

    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], context.get_value_type(ptr))
    return ptr(addr), codegen


@intrinsic
def _u64_ptr(typingctx, addr):
    """An integer address as a `uint64*` (a table of pointers)."""
    if not isinstance(addr, types.Integer):
        return None
    ptr = types.CPointer(types.uint64)

    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], context.get_value_type(ptr))
    return ptr(addr), codegen


@njit(cache=True)
def _gather(kernel_params, offsets, sizes, out):
    """Copy parameter i (sizes[i] bytes at kernelParams[i]) to out[offsets[i]:]. Returns -1, or
    the index of the first null entry (nothing after it is read)."""
    n = len(offsets)
    table = carray(_u64_ptr(kernel_params), (n,))
    for i in range(n):
        p = table[i]
        if p == 0:
            return i
        s = sizes[i]
        if s > 0:
            src = carray(_u8_ptr(p), (s,))
            o = offsets[i]
            for j in range(s):
                out[o + j] = src[j]
    return -1


@njit(cache=True)
def _gather_into(kernel_params, offsets, sizes, out, base, total):
    """`_gather` into out[base:base + total] (a slot of a preallocated buffer), whose bytes are
    zeroed first: alignment gaps read as zeros, as in a fresh buffer, whatever the slot held."""
    slot = out[base:base + total]
    slot[:] = 0
    return _gather(kernel_params, offsets, sizes, slot)


_EXAMPLE = (np.int64(0), np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.uint8))
_EXAMPLE_INTO = (*_EXAMPLE, np.int64(0), np.int64(0))
_call = None
_call_into = None
_layouts: dict = {}


def _entry():
    global _call
    if _call is None:
        _call = entry_point(_gather, *_EXAMPLE)   # compiles (or loads from numba's cache) once
    return _call


def _entry_into():
    global _call_into
    if _call_into is None:
        _call_into = entry_point(_gather_into, *_EXAMPLE_INTO)
    return _call_into


def warm() -> None:
    """Compile (or load) the gathers now, not in the first launch's callback."""
    _entry()
    _entry_into()


def layout_arrays(offsets: tuple, sizes: tuple, max_bytes: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(offsets, sizes, total bytes) as the compiled gathers take them, made once per layout.
    ValueError on an implausible layout."""
    key = (offsets, sizes)
    lay = _layouts.get(key)
    if lay is None:
        if len(offsets) != len(sizes):
            raise ValueError("offsets and sizes differ in length")
        o = np.asarray(offsets, np.int64)
        s = np.asarray(sizes, np.int64)
        total = int((o + s).max()) if len(o) else 0
        if total > max_bytes or (len(o) and (o.min() < 0 or s.min() < 0)):
            raise ValueError(f"implausible parameter layout (total {total} bytes)")
        if len(_layouts) >= MAX_LAYOUTS:
            _layouts.clear()
        lay = _layouts[key] = (o, s, total)
    return lay


def gather_params(kernel_params: int, offsets: tuple, sizes: tuple, max_bytes: int) -> bytes:
    """The parameter buffer behind `kernel_params` for this layout (see `launch_hook.decode_kernel_params`,
    which checks its arguments first). ValueError on a null entry or an implausible layout."""
    o, s, total = layout_arrays(offsets, sizes, max_bytes)
    out = np.zeros(total, np.uint8)
    bad = _entry()(np.int64(kernel_params), o, s, out)
    if bad >= 0:
        raise ValueError(f"kernelParams[{bad}] is null")
    return out.tobytes()


def gather_into(kernel_params: int, layout: tuple, out: np.ndarray, base: int) -> int:
    """Gather the parameters behind `kernel_params` (`layout` from `layout_arrays`) into
    out[base:base + total], zeroing the slot's gaps; returns total. ValueError on a null entry."""
    o, s, total = layout
    bad = _entry_into()(kernel_params, o, s, out, base, total)
    if bad >= 0:
        raise ValueError(f"kernelParams[{bad}] is null")
    return total
