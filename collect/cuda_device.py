"""The collector's device on a GPU: synchronize, evict managed memory to the host, read index
values (on the host, from the evicted pages), read CUPTI's clock (cuda-bindings); and the
protocols the collector needs of a device (tests/collect_standin.py has the CPU stand-ins)."""

from __future__ import annotations

import ctypes
from typing import Protocol


class Device(Protocol):
    def synchronize(self) -> None: ...

    def evict(self, ranges: list[tuple[int, int]]) -> int: ...

    def now(self) -> int: ...


class ValuesDevice(Device, Protocol):
    """A device that can also read managed memory (full mode's index values)."""

    def read(self, address: int, nbytes: int) -> bytes: ...


class CudaDevice:
    """Synchronize, evict managed ranges to the host, read CUPTI's clock (cuda-bindings)."""

    def __init__(self, device: int = 0) -> None:
        from cuda.bindings import driver as drv

        self.drv = drv
        self.device = device
        loc = drv.CUmemLocation()
        loc.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST
        loc.id = 0
        self._host = loc
        self.errors = 0
        self.last_error: str | None = None

    def synchronize(self) -> None:
        err, = self.drv.cuCtxSynchronize()
        if int(err) != 0:
            self.errors += 1
            self.last_error = f"cuCtxSynchronize: {err}"

    def _prefetch_to_host(self, addr: int, nbytes: int):
        drv = self.drv
        ptr = drv.CUdeviceptr(addr)
        try:  # CUDA 13: cuMemPrefetchAsync(devPtr, count, CUmemLocation, flags, hStream)
            return drv.cuMemPrefetchAsync(ptr, nbytes, self._host, 0, 0)[0]
        except TypeError:  # CUDA 12 bindings: the location form is _v2
            return drv.cuMemPrefetchAsync_v2(ptr, nbytes, self._host, 0, 0)[0]

    def evict(self, ranges: list[tuple[int, int]]) -> int:
        failed = 0
        for addr, nbytes in ranges:
            err = self._prefetch_to_host(addr, nbytes)
            if int(err) != 0:
                failed += 1
                self.last_error = f"cuMemPrefetchAsync to host: {err}"
        self.errors += failed
        return failed

    def read(self, address: int, nbytes: int) -> bytes:
        """The `nbytes` of managed memory at `address`, read by the CPU.

        The collector calls it between kernels, after `evict` moved every live managed range to
        the host and synchronized: the pages are resident on the CPU, so a CPU read leaves them
        there, and the launch about to run still faults on them. A copy through the GPU
        (cuMemcpyDtoH) may instead have the driver bring the pages to the GPU first, hiding the
        launch's faults (docs/collect.md, "Index values"). Managed memory has the same address on
        the host (unified addressing); the collector reads only inside live managed allocations."""
        if nbytes <= 0:
            return b""
        return ctypes.string_at(int(address), int(nbytes))

    def now(self) -> int:
        from cupti import cupti

        return int(cupti.get_timestamp())
