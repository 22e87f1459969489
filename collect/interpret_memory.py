"""Where the CPU tensors of an interpreted Triton program live in the trace's managed memory.

Every torch storage a kernel argument points into is placed, at its first use, at a
managed address, and the allocations table says which ranges are live when:

- `direct` (default): one allocation per storage, at a 2 MiB-aligned address (the
  granularity of cudaMallocManaged's VA blocks), first fit among freed ranges as the
  workload models place theirs (datasets/engine.py); freed when the storage is freed, so
  live allocations never overlap even where the CPU allocator hands an address out again.
- `caching`: tensors are blocks inside larger segments, placed by the rules of PyTorch's
  CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp): sizes rounded up to 512 B;
  requests up to 1 MiB from 2 MiB segments, up to 10 MiB from 20 MiB segments, larger
  ones from segments rounded up to 2 MiB; the smallest free block that fits (lowest
  address among equals) is taken and split when what remains is >= 512 B (small pool) or
  > 1 MiB (large pool); a freed block merges with free neighbours; segments are kept
  until the end. The allocations table holds the segments, as a GPU collection of such a
  program sees cudaMalloc'd (here managed) segments, not tensors.

`StorageMap` tracks storages with `weakref.finalize`, so a storage freed between two
launches is released at the launch count of its release, and translates the CPU
addresses the interpreter computes into managed ones.
"""

from __future__ import annotations

import bisect
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

MANAGED_BASE = 0x7F40_0000_0000     # where managed ranges start (as in the workload models)
VA_BLOCK = 2 << 20                  # cudaMallocManaged reserves 2 MiB-aligned VA blocks

# PyTorch's CUDACachingAllocator constants (c10/cuda/CUDACachingAllocator.cpp)
K_MIN_BLOCK = 512
K_SMALL_SIZE = 1 << 20
K_SMALL_BUFFER = 2 << 20
K_LARGE_BUFFER = 20 << 20
K_MIN_LARGE_ALLOC = 10 << 20
K_ROUND_LARGE = 2 << 20

ALLOCATORS = ("direct", "caching")


class AllocationLog:
    """Allocations in the trace's terms: opened at a first launch, closed after a last one."""

    def __init__(self) -> None:
        self.next_id = 0
        self.info: dict[int, tuple[int, int]] = {}          # alloc id -> (address, bytes), until written
        self._first: dict[int, int] = {}
        self._closed: list[tuple[int, int]] = []           # (alloc id, last launch), not yet written
        self.peak_live_bytes = 0
        self._live_bytes = 0

    def open(self, address: int, nbytes: int, first_launch: int) -> int:
        aid = self.next_id
        self.next_id += 1
        self.info[aid] = (int(address), int(nbytes))
        self._first[aid] = int(first_launch)
        self._live_bytes += int(nbytes)
        self.peak_live_bytes = max(self.peak_live_bytes, self._live_bytes)
        return aid

    def close(self, aid: int, last_launch: int) -> None:
        self._closed.append((aid, int(last_launch)))
        self._live_bytes -= self.info[aid][1]

    def rows(self, *, live_too: bool = False) -> dict:
        """Columns of the allocations closed since the last call (and, at the end, the live ones)."""
        out = [(aid, last) for aid, last in self._closed]
        self._closed = []
        if live_too:
            closed = {a for a, _ in out}
            out += [(aid, None) for aid in self._first if aid not in closed]
        cols = {"alloc_id": [], "address": [], "bytes": [], "first": [], "last": []}
        for aid, last in out:
            addr, nb = self.info.pop(aid)
            cols["alloc_id"].append(aid)
            cols["address"].append(addr)
            cols["bytes"].append(nb)
            cols["first"].append(self._first.pop(aid))
            cols["last"].append(last)
        return cols


class DirectPlacement:
    """One 2 MiB-aligned allocation per storage, first fit among freed ranges."""

    kind = "direct"

    def __init__(self, log: AllocationLog) -> None:
        self.log = log
        self._free: list[tuple[int, int]] = []   # (address, bytes), sorted, merged
        self._top = MANAGED_BASE
        self._live: dict[int, tuple[int, int]] = {}   # alloc id -> (address, span)
        self.version = 0                               # bumped whenever segments() changes

    def place(self, nbytes: int, launch: int) -> tuple[Any, int]:
        span = -(-int(nbytes) // VA_BLOCK) * VA_BLOCK
        addr = None
        for i, (a, sz) in enumerate(self._free):
            if sz >= span:
                addr = a
                self._free[i:i + 1] = [] if sz == span else [(a + span, sz - span)]
                break
        if addr is None:
            addr, self._top = self._top, self._top + span
        aid = self.log.open(addr, nbytes, launch)
        self._live[aid] = (addr, span)
        self.version += 1
        return aid, addr

    def release(self, handle: Any, last_launch: int) -> None:
        addr, span = self._live.pop(handle)
        self.log.close(handle, last_launch)
        self.version += 1
        bisect.insort(self._free, (addr, span))
        merged: list[tuple[int, int]] = []
        for a, sz in self._free:
            if merged and merged[-1][0] + merged[-1][1] == a:
                merged[-1] = (merged[-1][0], merged[-1][1] + sz)
            else:
                merged.append((a, sz))
        if merged and merged[-1][0] + merged[-1][1] == self._top:
            self._top = merged.pop()[0]
        self._free = merged

    def segments(self) -> list[tuple[int, int, int]]:
        """(address, end, alloc id) of the live allocations."""
        return [(a, a + self.log.info[aid][1], aid) for aid, (a, _) in self._live.items()]


@dataclass(eq=False)
class _Block:
    addr: int
    size: int
    seg: int
    small: bool
    free: bool = True
    prev: "_Block | None" = None
    next: "_Block | None" = None


class CachingPlacement:
    """Blocks in segments, by PyTorch's CUDA caching allocator's rules (module docstring)."""

    kind = "caching"

    def __init__(self, log: AllocationLog) -> None:
        self.log = log
        self._top = MANAGED_BASE
        self._pools: dict[bool, list[tuple[int, int]]] = {True: [], False: []}   # small? -> [(size, addr)]
        self._blocks: dict[int, _Block] = {}      # free blocks by address
        self._segs: list[tuple[int, int, int]] = []
        self.version = 0

    @staticmethod
    def round_size(n: int) -> int:
        return K_MIN_BLOCK if n < K_MIN_BLOCK else K_MIN_BLOCK * -(-n // K_MIN_BLOCK)

    @staticmethod
    def segment_size(size: int) -> int:
        if size <= K_SMALL_SIZE:
            return K_SMALL_BUFFER
        if size < K_MIN_LARGE_ALLOC:
            return K_LARGE_BUFFER
        return K_ROUND_LARGE * -(-size // K_ROUND_LARGE)

    def place(self, nbytes: int, launch: int) -> tuple[Any, int]:
        size = self.round_size(int(nbytes))
        small = size <= K_SMALL_SIZE
        pool = self._pools[small]
        i = bisect.bisect_left(pool, (size, -1))
        if i < len(pool):
            _, addr = pool.pop(i)
            b = self._blocks.pop(addr)
        else:
            seg_size = self.segment_size(size)
            addr, self._top = self._top, self._top + -(-seg_size // VA_BLOCK) * VA_BLOCK
            seg = self.log.open(addr, seg_size, launch)
            self._segs.append((addr, addr + seg_size, seg))
            self.version += 1
            b = _Block(addr, seg_size, seg, small)
        rest = b.size - size
        if (rest >= K_MIN_BLOCK) if b.small else (rest > K_SMALL_SIZE):
            r = _Block(b.addr + size, rest, b.seg, b.small, True, b, b.next)
            if b.next is not None:
                b.next.prev = r
            b.next, b.size = r, size
            self._put(r)
        b.free = False
        return b, b.addr

    def release(self, handle: Any, last_launch: int) -> None:
        b: _Block = handle
        b.free = True
        for nb in (b.prev, b.next):
            if nb is not None and nb.free:
                self._take(nb)
                if nb is b.prev:
                    nb.size += b.size
                    nb.next = b.next
                    if b.next is not None:
                        b.next.prev = nb
                    b = nb
                else:
                    b.size += nb.size
                    b.next = nb.next
                    if nb.next is not None:
                        nb.next.prev = b
        self._put(b)

    def _put(self, b: _Block) -> None:
        bisect.insort(self._pools[b.small], (b.size, b.addr))
        self._blocks[b.addr] = b

    def _take(self, b: _Block) -> None:
        pool = self._pools[b.small]
        del pool[bisect.bisect_left(pool, (b.size, b.addr))]
        del self._blocks[b.addr]

    def segments(self) -> list[tuple[int, int, int]]:
        return list(self._segs)


def make_placement(kind: str, log: AllocationLog):
    if kind == "direct":
        return DirectPlacement(log)
    if kind == "caching":
        return CachingPlacement(log)
    raise ValueError(f"allocator must be one of {', '.join(ALLOCATORS)}, not {kind!r}")


class NotOnCPU(Exception):
    """A tensor argument that does not live in CPU memory (the interpreter would copy it)."""


class SharedMemory(Exception):
    """Two live storages that share part (not all) of their memory."""


@dataclass(eq=False)
class _Entry:
    cpu: int
    nbytes: int
    managed: int
    handle: Any
    ref: Any                      # weakref to the storage
    primary: bool = True          # False: memory of another live storage (same managed range)


class StorageMap:
    """CPU storages -> managed ranges, with lifetimes; address translation for the hooks."""

    def __init__(self, placement, issued: Callable[[], int]) -> None:
        self.placement = placement
        self._issued = issued                 # launches issued so far (the current one included)
        self._by_id: dict[int, _Entry] = {}   # id(storage) -> entry (checked against the weakref)
        self._primary: dict[int, _Entry] = {} # CPU base -> entry that owns the range
        self._pending: list[tuple[_Entry, int, int]] = []   # (entry, storage id, launches issued)
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._deltas: list[int] = []
        self._arrays = None
        self.storages = 0

    # -- registration
    def address_of(self, obj: Any) -> int:
        """Managed address of tensor `obj`'s first element (its storage placed on first sight)."""
        dev = getattr(obj, "device", None)
        if dev is not None and getattr(dev, "type", "cpu") != "cpu":
            raise NotOnCPU(str(dev))
        st = obj.untyped_storage()
        base, n = int(st.data_ptr()), int(st.nbytes())
        if n == 0 or base == 0:
            return 0
        e = self._by_id.get(id(st))
        if e is None or e.ref() is not st:
            e = self._register(st, base, n)
        return e.managed + (int(obj.data_ptr()) - base)

    def _register(self, st, base: int, n: int) -> _Entry:
        self.release_freed()          # a dead storage's range may be what this one reuses
        i = bisect.bisect_right(self._starts, base) - 1
        if i >= 0 and base < self._ends[i]:
            host = self._primary[self._starts[i]]
            if base + n > self._ends[i]:
                raise SharedMemory(f"two live storages share part of their memory"
                                   f" ({n} bytes at 0x{base:x} and {host.nbytes} bytes at 0x{host.cpu:x})")
            # memory of a live storage (torch.from_numpy twice, set_()): the same managed range
            e = _Entry(base, n, host.managed + (base - host.cpu), None, weakref.ref(st), primary=False)
        else:
            j = bisect.bisect_left(self._starts, base)
            if j < len(self._starts) and self._starts[j] < base + n:
                raise SharedMemory(f"two live storages share part of their memory"
                                   f" ({n} bytes at 0x{base:x} and more at 0x{self._starts[j]:x})")
            handle, managed = self.placement.place(n, self._issued() - 1)
            e = _Entry(base, n, managed, handle, weakref.ref(st))
            self._primary[base] = e
            self.storages += 1
            self._index_dirty()
        self._by_id[id(st)] = e
        f = weakref.finalize(st, self._freed, e, id(st))
        f.atexit = False
        return e

    def _freed(self, e: _Entry, key: int) -> None:
        # called by the garbage collector at any time: only note it
        self._pending.append((e, key, self._issued()))

    def release_freed(self) -> None:
        """Release the storages freed since the last call (their last launch: the one before the free)."""
        while self._pending:
            e, key, issued = self._pending.pop()
            if self._by_id.get(key) is e:
                del self._by_id[key]
            if e.primary and self._primary.get(e.cpu) is e:
                del self._primary[e.cpu]
                self.placement.release(e.handle, issued - 1)
                self._index_dirty()

    # -- translation
    def _index_dirty(self) -> None:
        ents = sorted(self._primary.values(), key=lambda e: e.cpu)
        self._starts = [e.cpu for e in ents]
        self._ends = [e.cpu + e.nbytes for e in ents]
        self._deltas = [e.managed - e.cpu for e in ents]
        self._arrays = None

    def index(self) -> tuple:
        """(CPU starts, CPU ends, managed - CPU) of the live storages, sorted, as int64 arrays
        and as the same three lists (for bisect on one address)."""
        if self._arrays is None:
            self._arrays = (np.array(self._starts, np.int64), np.array(self._ends, np.int64),
                            np.array(self._deltas, np.int64), self._starts, self._ends, self._deltas)
        return self._arrays
