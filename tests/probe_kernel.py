"""The kernel the collector's GPU probe (tests/test_collect_gpu.py) loads, compiled with NVRTC.

It is compiled to an sm_90 cubin (SASS for the H200), not to PTX: NVRTC 13.5 writes PTX ISA
`.version 9.5`, and a CUDA 13.0 driver's JIT accepts PTX up to ISA 9.0 (one PTX ISA minor per
CUDA minor), so it would refuse the module (CUDA_ERROR_UNSUPPORTED_PTX_VERSION). A cubin needs
no JIT; CUDA's minor-version compatibility lets a 13.0 driver load a cubin built by a 13.x
compiler. The CPU test (tests/test_cuda13_0_surface.py) compiles it here and checks both facts.
"""

from __future__ import annotations

SOURCE = (b'extern "C" __global__ void k(float* a, int n, double s) {'
          b' int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) a[i] = a[i] * (float)s + 1.0f; }')
ARCH = "sm_90"   # NVIDIA H200 (Hopper)


def _compile(nvrtc, arch: str):
    err, prog = nvrtc.nvrtcCreateProgram(SOURCE, b"k.cu", 0, [], [])
    if int(err) != 0:
        raise RuntimeError(f"nvrtcCreateProgram: {err}")
    opts = [f"--gpu-architecture={arch}".encode()]
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    if int(err) != 0:
        _, n = nvrtc.nvrtcGetProgramLogSize(prog)
        log = bytearray(n)   # NVRTC writes into it: never a bytes object
        nvrtc.nvrtcGetProgramLog(prog, log)
        nvrtc.nvrtcDestroyProgram(prog)
        raise RuntimeError(f"NVRTC failed for {arch}: {bytes(log).rstrip(bytes(1)).decode(errors='replace')}")
    return prog


def cubin(nvrtc) -> bytes:
    """The kernel as an sm_90 cubin (an ELF image cuModuleLoadData / cuLibraryLoadData take as is)."""
    prog = _compile(nvrtc, ARCH)
    try:
        _, n = nvrtc.nvrtcGetCUBINSize(prog)
        buf = bytearray(n)
        nvrtc.nvrtcGetCUBIN(prog, buf)
        return bytes(buf)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def ptx(nvrtc) -> str:
    """The kernel as PTX for compute_90 (what the probe loaded before; kept for the CPU test)."""
    prog = _compile(nvrtc, "compute_90")
    try:
        _, n = nvrtc.nvrtcGetPTXSize(prog)
        buf = bytearray(n)
        nvrtc.nvrtcGetPTX(prog, buf)
        return bytes(buf).rstrip(bytes(1)).decode()
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
