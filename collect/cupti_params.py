"""The parameter structs of the CUDA calls the collector watches, as CUPTI's callbacks hand them
over, and CUPTI's callback data itself (`CallbackData`, `function_params`).

CUPTI's callback data points (`function_params`) at a struct holding the call's arguments in
order, with C's layout (CUPTI's `generated_cuda_api_meta.h` / `generated_cuda_runtime_api_meta.h`:
`cuLaunchKernel_params`, `cudaLaunchKernel_v7000_params`, ...). cupti-python 13.4 wraps them
(`cupti.CuLaunchKernelParams`, ...), but cupti-python 13.0.1, the set for a CUDA 13.0 driver,
has none of these classes (its `cupti/cupti.pyi`; tests/data/cuda13.0-surface.json lists what it
has). So the collector reads them with these ctypes structs, whichever cupti-python is installed.
Field names are cupti-python 13.4's; tests/test_cuda13_0_surface.py checks every struct's
offsets and sizes against cupti-python's numpy dtypes (`CUPTI_DTYPES`) where it is installed.

Pointers and handles are read as unsigned 64-bit integers (Linux x86-64 and aarch64).
"""

from __future__ import annotations

import ctypes
import struct
from typing import Callable

_ptr = ctypes.c_uint64      # CUfunction, CUstream, void**, CUdeviceptr* ...
_uint = ctypes.c_uint
_size = ctypes.c_size_t


class Dim3(ctypes.Structure):
    _fields_ = [("x", _uint), ("y", _uint), ("z", _uint)]


class _Params(ctypes.Structure):
    CUPTI_DTYPES: tuple[str, ...] = ()   # cupti-python 13.4's dtypes of the same layout (tests compare)

    @classmethod
    def at(cls, address: int):
        """A view of the struct at `address` (read when a field is read)."""
        if not address:
            raise ValueError(f"{cls.__name__}: null parameter pointer")
        return cls.from_address(int(address))

    @classmethod
    def values(cls, address: int) -> tuple[int, ...]:
        """Every field of the struct at `address` in one read, in `_fields_` order, a `Dim3` as its
        x, y, z (`flat_fields()` names them): what reading each field of `at(address)` gives, in
        one `struct.unpack_from` instead of a ctypes read per field (`reader` without the lookup)."""
        if not address:
            raise ValueError(f"{cls.__name__}: null parameter pointer")
        return reader(cls)(address)

    @classmethod
    def flat_fields(cls) -> tuple[str, ...]:
        return tuple(n for n, _ in _flat(cls))


def _code(t) -> str:
    if t in (ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p):
        return "Q" if ctypes.sizeof(t) == 8 else "I"
    if t in (ctypes.c_uint, ctypes.c_uint32):
        return "I"
    if t in (ctypes.c_int, ctypes.c_int32):
        return "i"
    raise TypeError(f"no struct code for {t}")


def _flat(cls, base: int = 0, prefix: str = "") -> list[tuple[str, tuple[int, str, int]]]:
    """(name, (offset, struct code, size)) of every scalar field, nested structs flattened."""
    out = []
    for name, t in cls._fields_:
        off = base + getattr(cls, name).offset
        if isinstance(t, type) and issubclass(t, ctypes.Structure):
            out += _flat(t, off, f"{prefix}{name}.")
        else:
            out.append((prefix + name, (off, _code(t), ctypes.sizeof(t))))
    return out


_READERS: dict[type, Callable[[int], tuple[int, ...]]] = {}


def reader(cls) -> Callable[[int], tuple[int, ...]]:
    """`cls.values` as one function of a non-null address, made once per class: a little-endian
    struct format with the C layout (padding as pad bytes) read through a ctypes byte array."""
    got = _READERS.get(cls)
    if got is None:
        fmt, at = "<", 0
        for _, (off, code, size) in _flat(cls):   # (C lays fields out in declaration order)
            fmt += "x" * (off - at) + code
            at = off + size
        fmt += "x" * (ctypes.sizeof(cls) - at)
        unpack_from = struct.Struct(fmt).unpack_from
        from_address = (ctypes.c_char * ctypes.sizeof(cls)).from_address
        got = _READERS[cls] = lambda address: unpack_from(from_address(address))
    return got


class CuLaunchKernelParams(_Params):
    """cuLaunchKernel(f, gridDimX..Z, blockDimX..Z, sharedMemBytes, hStream, kernelParams, extra),
    and cuLaunchKernel_ptsz (the same arguments)."""
    CUPTI_DTYPES = ("cu_launch_kernel_params_dtype", "cu_launch_kernel_ptsz_params_dtype")
    _fields_ = [("f", _ptr), ("grid_dim_x", _uint), ("grid_dim_y", _uint), ("grid_dim_z", _uint),
                ("block_dim_x", _uint), ("block_dim_y", _uint), ("block_dim_z", _uint),
                ("shared_mem_bytes", _uint), ("h_stream", _ptr), ("kernel_params", _ptr), ("extra", _ptr)]


class CuLaunchCooperativeKernelParams(_Params):
    """cuLaunchCooperativeKernel(_ptsz): cuLaunchKernel's arguments without `extra`."""
    CUPTI_DTYPES = ("cu_launch_cooperative_kernel_params_dtype", "cu_launch_cooperative_kernel_ptsz_params_dtype")
    _fields_ = CuLaunchKernelParams._fields_[:-1]


class CuLaunchKernelExParams(_Params):
    """cuLaunchKernelEx(config, f, kernelParams, extra), and its _ptsz."""
    CUPTI_DTYPES = ("cu_launch_kernel_ex_params_dtype", "cu_launch_kernel_ex_ptsz_params_dtype")
    _fields_ = [("config", _ptr), ("f", _ptr), ("kernel_params", _ptr), ("extra", _ptr)]


class CudaLaunchKernelParams(_Params):
    """cudaLaunchKernel(func, gridDim, blockDim, args, sharedMem, stream) (_v7000 and _ptsz_v7000),
    cudaLaunchCooperativeKernel (_v9000, _ptsz_v9000: the same arguments), and CUDA 13's __cudaLaunchKernel(kernel, gridDim, blockDim, args, sharedMem, stream)
    (_v13000, _ptsz_v13000: the same layout; `func` is then a cudaKernel_t, which is a CUkernel)."""
    CUPTI_DTYPES = ("cuda_launch_kernel_v7000params_dtype", "cuda_launch_kernel_ptsz_v7000params_dtype",
                    "cuda_launch_cooperative_kernel_v9000params_dtype",
                    "cuda_launch_cooperative_kernel_ptsz_v9000params_dtype")
    _fields_ = [("func", _ptr), ("grid_dim", Dim3), ("block_dim", Dim3), ("args", _ptr),
                ("shared_mem", _size), ("stream", _ptr)]


class CudaLaunchKernelExCParams(_Params):
    """cudaLaunchKernelExC(config, func, args) (_v11060, _ptsz_v11060)."""
    CUPTI_DTYPES = ("cuda_launch_kernel_ex_c_v11060params_dtype", "cuda_launch_kernel_ex_c_ptsz_v11060params_dtype")
    _fields_ = [("config", _ptr), ("func", _ptr), ("args", _ptr)]


class CuMemAllocManagedParams(_Params):
    """cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags)."""
    CUPTI_DTYPES = ("cu_mem_alloc_managed_params_dtype",)
    _fields_ = [("dptr", _ptr), ("bytesize", _size), ("flags_", _uint)]


class CudaMallocManagedParams(_Params):
    """cudaMallocManaged(void** devPtr, size_t size, unsigned int flags) (_v6000)."""
    CUPTI_DTYPES = ("cuda_malloc_managed_v6000params_dtype",)
    _fields_ = [("dev_ptr", _ptr), ("size_", _size), ("flags_", _uint)]


class CuMemFreeParams(_Params):
    """cuMemFree_v2(CUdeviceptr dptr)."""
    CUPTI_DTYPES = ("cu_mem_free_v2params_dtype",)
    _fields_ = [("dptr", _ptr)]


class CudaFreeParams(_Params):
    """cudaFree(void* devPtr) (_v3020)."""
    CUPTI_DTYPES = ("cuda_free_v3020params_dtype",)
    _fields_ = [("dev_ptr", _ptr)]


class CallbackData(_Params):
    """CUPTI's CUpti_CallbackData, the struct behind the callback's data object."""
    CUPTI_DTYPES = ("callback_data_dtype",)
    _fields_ = [("callback_site", ctypes.c_int), ("function_name", _ptr), ("function_params", _ptr),
                ("function_return_value", _ptr), ("symbol_name", _ptr), ("context", _ptr),
                ("context_uid", ctypes.c_uint32), ("correlation_data", _ptr), ("correlation_id", ctypes.c_uint32)]


def function_params(cbdata) -> int:
    """The address of the call's parameter struct. cupti-python 13.4's CallbackData has it as
    `function_params`; 13.0.1's has no such attribute (its `cupti/cupti.pyi`), so it is read
    from the C struct at `cbdata.ptr`."""
    try:
        return int(cbdata.function_params)
    except AttributeError:
        return int(CallbackData.at(int(cbdata.ptr)).function_params)


ALL = (CallbackData, CuLaunchKernelParams, CuLaunchCooperativeKernelParams, CuLaunchKernelExParams, CudaLaunchKernelParams,
       CudaLaunchKernelExCParams, CuMemAllocManagedParams, CudaMallocManagedParams, CuMemFreeParams,
       CudaFreeParams)
