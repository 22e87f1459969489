"""The CUDA sources the GPU code ships, compiled for the H200 (sm_90) without a GPU.

CuPy compiles the workloads' `extern "C"` kernels with NVRTC when they first
run, and calibration loads its PTX with cuModuleLoadData: a typo in either
would only show on a GPU, where device time is scarce. NVRTC and nvJitLink run
on the CPU, so these tests compile every workload's source (and check that each
kernel the workload asks for is an entry point of the module) and assemble the
calibration PTX into an sm_90 cubin."""

from __future__ import annotations

import importlib
import re

import pytest

ARCH = "sm_90"   # NVIDIA H200 (Hopper), the device the GPU checks run on


def _nvrtc():
    nvrtc = pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings is not installed (pip install .[test])")
    try:
        nvrtc.nvrtcVersion()
    except Exception as e:  # noqa: BLE001 - the library is a separate wheel
        pytest.skip(f"libnvrtc is not loadable (pip install .[test] installs nvidia-cuda-nvrtc): {e}")
    return nvrtc


def _nvjitlink():
    nvjitlink = pytest.importorskip("cuda.bindings.nvjitlink",
                                    reason="cuda-bindings is not installed (pip install .[test])")
    try:
        nvjitlink.version()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"libnvJitLink is not loadable (pip install .[test] installs nvidia-nvjitlink): {e}")
    return nvjitlink


def compile_cuda(code: str, arch: str) -> tuple[bool, str, str]:
    """(ok, log, ptx) of NVRTC compiling `code` for `arch` (compute_XX: PTX only, sm_XX: through ptxas)."""
    nvrtc = _nvrtc()
    err, prog = nvrtc.nvrtcCreateProgram(code.encode(), b"pagecast_kernels.cu", 0, [], [])
    assert int(err) == 0
    try:
        opts = [f"-arch={arch}".encode()]
        (res,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        # NVRTC writes into the buffer: a bytearray, never bytes (cuda-python's samples pass
        # b" " * n, and for n == 1 that is Python's shared b" " object, which NVRTC's NUL
        # then corrupts for the whole process: matplotlib's SVGs came out with NUL bytes)
        _, n = nvrtc.nvrtcGetProgramLogSize(prog)
        log = bytearray(n)
        nvrtc.nvrtcGetProgramLog(prog, log)
        ptx = ""
        if int(res) == 0 and arch.startswith("compute_"):
            _, m = nvrtc.nvrtcGetPTXSize(prog)
            buf = bytearray(m)
            nvrtc.nvrtcGetPTX(prog, buf)
            ptx = bytes(buf).rstrip(b"\0 ").decode()
        return int(res) == 0, bytes(log).rstrip(b"\0 ").decode(errors="replace"), ptx
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


WORKLOADS = ["jacobi2d", "spmv_cg", "mlp_train", "llm_decode", "moe_decode"]


@pytest.mark.parametrize("name", WORKLOADS)
def test_workload_kernels_compile_for_the_h200(name):
    mod = importlib.import_module(f"pagecast.datasets.gpu.{name}")
    ok, log, _ = compile_cuda(mod.CODE, ARCH)
    assert ok, f"{name}: NVRTC failed for {ARCH}:\n{log}"


@pytest.mark.parametrize("name", WORKLOADS)
def test_every_kernel_a_workload_launches_is_an_entry_of_its_module(name):
    mod = importlib.import_module(f"pagecast.datasets.gpu.{name}")
    ok, log, ptx = compile_cuda(mod.CODE, "compute_90")
    assert ok, log
    entries = set(re.findall(r"\.entry\s+(\w+)\s*\(", ptx))
    missing = [k for k in mod.KERNELS if k not in entries]
    assert not missing, f"{name}: kernels not in the module (mangled or misspelt?): {missing}; entries: {sorted(entries)}"


def test_compiling_leaves_pythons_shared_bytes_alone():
    compile_cuda('extern "C" __global__ void k() {}', ARCH)   # a one-byte log (its NUL)
    assert bytes([32]) == b" " and b"a b".split(b" ") == [b"a", b"b"]


def test_a_broken_source_is_caught():
    ok, log, _ = compile_cuda('extern "C" __global__ void k(float* x) { x[0] = undefined_name; }', ARCH)
    assert not ok and "undefined_name" in log


def link_ptx(ptx: str, arch: str) -> tuple[bool, str]:
    """(ok, error log) of nvJitLink assembling a PTX module into a cubin for `arch`."""
    nvjitlink = _nvjitlink()
    h = nvjitlink.create(1, [f"-arch={arch}"])
    try:
        data = ptx.encode() + b"\0"
        try:
            nvjitlink.add_data(h, nvjitlink.InputType.PTX, data, len(data), "pagecast_calibrate.ptx")
            nvjitlink.complete(h)
        except nvjitlink.nvJitLinkError:
            n = nvjitlink.get_error_log_size(h)
            buf = bytearray(n)
            nvjitlink.get_error_log(h, buf)
            return False, buf.rstrip(b"\0").decode(errors="replace")
        return nvjitlink.get_linked_cubin_size(h) > 0, ""
    finally:
        nvjitlink.destroy(h)


def test_calibration_ptx_assembles_for_the_h200():
    from pagecast.replay.gpu.driver import COPY_KERNEL, KERNELS_PTX, TOUCH_KERNEL
    ok, log = link_ptx(KERNELS_PTX, ARCH)
    assert ok, f"calibration PTX does not assemble for {ARCH}:\n{log}"
    entries = set(re.findall(r"\.entry\s+(\w+)\s*\(", KERNELS_PTX))
    assert {TOUCH_KERNEL, COPY_KERNEL} <= entries


def test_broken_ptx_is_caught():
    from pagecast.replay.gpu.driver import KERNELS_PTX
    ok, log = link_ptx(KERNELS_PTX.replace("ld.global.u32", "ld.global.nonsense"), ARCH)
    assert not ok
