"""What the collector records about the machine, and the no-GPU check.

`probe(device=0)` initializes the CUDA driver through cuda-bindings and returns
an `Environment` (device name and memory, free memory, driver and runtime
versions, cupti-python version, the UVM driver's prefetcher setting). Without a
driver or a GPU it raises `NoGPUError` with one line saying so.
"""

from __future__ import annotations

import importlib.metadata
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pagecast.errors import NoGPUError

PREFETCH_PARAM = Path("/sys/module/nvidia_uvm/parameters/uvm_perf_prefetch_enable")


def driver_prefetch(path: Path = PREFETCH_PARAM) -> bool | None:
    """Whether nvidia-uvm's speculative prefetcher is on (None when unreadable)."""
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    if text in ("1", "Y", "y"):
        return True
    if text in ("0", "N", "n"):
        return False
    return None


def kernel_driver_version() -> str | None:
    """The NVIDIA kernel driver's version (e.g. 580.159.03) where the system shows it."""

    for path in ("/sys/module/nvidia/version", "/proc/driver/nvidia/version"):
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        m = re.search(r"\b(\d{3,}\.\d+(?:\.\d+)?)\b", text)
        if m:
            return m.group(1)
    return None


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _fmt_cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


@dataclass
class Environment:
    device_index: int
    device_name: str
    memory_bytes: int
    free_bytes: int
    driver_version: str
    runtime_version: str | None
    cupti_version: str | None
    driver_prefetch: bool | None
    extra: dict[str, Any] = field(default_factory=dict)

    def manifest_device(self) -> dict:
        return {"name": self.device_name, "index": self.device_index, "memory_bytes": self.memory_bytes}

    def manifest_environment(self) -> dict:
        return {"driver_version": kernel_driver_version(),
                "driver_cuda_version": self.driver_version, "cuda_runtime_version": self.runtime_version,
                "cupti_python_version": self.cupti_version,
                "cuda_bindings_version": _version("cuda-bindings") or _version("cuda-python"),
                "free_bytes_at_start": self.free_bytes,
                "driver_prefetch_param": str(PREFETCH_PARAM), **self.extra}


def _check(result, what: str):
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise NoGPUError(f"no usable NVIDIA GPU: {what} failed ({getattr(err, 'name', err)})")
    return rest[0] if len(rest) == 1 else rest


def free_memory(device: int = 0) -> int:
    """Free device memory now (makes the device's primary context current in this thread)."""
    from cuda.bindings import driver as drv

    dev = _check(drv.cuDeviceGet(device), "cuDeviceGet")
    ctx = _check(drv.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    _check(drv.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    free, _total = _check(drv.cuMemGetInfo(), "cuMemGetInfo")
    return int(free)


def probe(device: int = 0, *, context: bool = True) -> Environment:
    """The device and driver; with context=False no CUDA context is created (free_bytes is then 0).

    CUPTI's unified-memory counters are configured before any context exists (as
    CUPTI's unified-memory sample does), so the collector probes without one,
    starts CUPTI, then asks `free_memory`.
    """
    try:
        from cuda.bindings import driver as drv
    except ImportError:
        raise NoGPUError("no usable NVIDIA GPU: cuda-bindings is not installed (pip install 'pagecast[gpu]')") from None
    try:
        _check(drv.cuInit(0), "cuInit")
    except NoGPUError:
        raise
    except Exception as e:  # the driver library itself is missing
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise NoGPUError(f"no NVIDIA GPU driver found ({first})") from None
    n = _check(drv.cuDeviceGetCount(), "cuDeviceGetCount")
    if int(n) <= device:
        raise NoGPUError(f"no NVIDIA GPU: the driver reports {int(n)} device(s)")
    dev = _check(drv.cuDeviceGet(device), "cuDeviceGet")
    name = _check(drv.cuDeviceGetName(256, dev), "cuDeviceGetName")
    name = name.split(b"\0", 1)[0].decode() if isinstance(name, bytes) else str(name)
    total = int(_check(drv.cuDeviceTotalMem(dev), "cuDeviceTotalMem"))
    free = free_memory(device) if context else 0
    dver = int(_check(drv.cuDriverGetVersion(), "cuDriverGetVersion"))
    rver = None
    try:
        from cuda.bindings import runtime as rt
        err, v = rt.cudaRuntimeGetVersion()
        if int(err) == 0:
            rver = _fmt_cuda_version(int(v))
    except Exception:
        rver = None
    return Environment(device_index=device, device_name=name, memory_bytes=total, free_bytes=int(free),
                       driver_version=_fmt_cuda_version(dver), runtime_version=rver,
                       cupti_version=_version("cupti-python"), driver_prefetch=driver_prefetch())


def require_cupti() -> None:
    """cupti-python must import; without a driver its calls fail, which probe() reports first."""
    try:
        from cupti import cupti  # noqa: F401
    except ImportError:
        raise NoGPUError("CUPTI for Python is not installed (pip install 'pagecast[gpu]', cupti-python 13.x "
                         "for a CUDA 13 driver)") from None
