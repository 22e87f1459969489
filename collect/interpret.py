"""`pagecast collect --interpret`: a program's Triton kernels under Triton's interpreter on the
CPU, recorded exactly (docs/collect.md, "--interpret").

The workload runs in this process with `TRITON_INTERPRET=1`. For every launch the hooks
(interpret_hooks.py) give the kernel, its arguments, its grid and every memory access; this
module turns them into a trace:

- launches: kernel name, grid, block (32 x num_warps), the parameter buffer the compiled
  kernel would receive (interpret_args.py), GPU times from the workload models' roofline clock;
- allocations: the torch storages the arguments point into, placed in managed memory
  (interpret_memory.py);
- truth: the pages each launch read or wrote, as intervals (interpret_pages.py);
- values: what the integer tensors a launch's pointer parameters point to held when it began
  (index values: ids, indices, block tables), from each pointer to the end of its storage, within
  the trace's per-launch limit (`pagecast.values.ValuesRecorder`: clipped bytes counted in the
  manifest, a row repeating the latest from its address left out);
- faults and migrations: the workload models' full-mode driver emulation over the truth
  (datasets/emulate.py's `FullModeEmulation`, passed in by the command: collect/ does not
  import datasets/, docs/architecture.md "Layers"), optionally losing records at a rate.

Rows are handed to `TraceWriter` every `flush_launches` launches, `FLUSH_ROWS` truth rows or
`part_seconds`, which
closes Parquet parts as it goes: a crash in the workload still leaves a readable trace
(`complete: false`), and memory stays bounded.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa

from pagecast import trace as T
from pagecast.errors import InputError, PagecastError
from pagecast.outputs import OutputWriteError, describe_os_error
from pagecast.values import ValuesRecorder

from . import interpret_compat, interpret_hooks
from .interpret_args import ArgPacker, check_triton_version
from .interpret_memory import (AllocationLog, NotOnCPU, SharedMemory, StorageMap, make_placement)
from .interpret_pages import LaunchPages, page_intervals
from .interpret_stop import Interrupted, WriteFailed, hook as _hook
from .target import Workload

SOURCE = "triton-interpreter"
# the device a trace says it ran on: the workload models' emulated H200 (datasets/engine.py)
DEVICE = {"name": "NVIDIA H200 (emulated; Triton interpreter on the CPU)", "index": 0, "memory_bytes": 150754820096}
DEFAULT_NUM_WARPS = 4      # Triton's default for CUDA (triton/backends/nvidia/compiler.py, CUDAOptions)
WARP = 32
FLUSH_ROWS = 1_000_000     # pending truth rows (intervals) that force a flush: memory stays bounded


@dataclass
class InterpretConfig:
    output: Path
    workload: Workload
    force: bool = False
    allocator: str = "direct"          # interpret_memory.ALLOCATORS
    drop: float = 0.0                  # share of fault and migration records lost
    seed: int = 0                      # the driver emulation's and the clock's random choices
    driver_prefetch: bool = True
    part_seconds: float = 2.0
    flush_launches: int = 4096
    values_limit: int = T.VALUES_LIMIT   # bytes of index values kept per launch (docs/trace-format.md)


class Refusal(BaseException):
    """Bad input met while the workload runs (a CUDA tensor, an unsupported argument).

    A BaseException, so that the workload's own `except Exception` does not swallow it."""


@dataclass
class InterpretResult:
    code: int                          # the workload's exit code (2 after a refusal)
    launches: int
    refusal: str | None
    trace: Path
    stats: dict = field(default_factory=dict)


@dataclass
class _Launch:
    lid: int
    name: str
    packed: object
    block: int
    grid: tuple = (1, 1, 1)
    pages: LaunchPages = field(default_factory=LaunchPages)
    reads: list = field(default_factory=list)   # (param offset, address, bytes) of its integer buffers


def _frameworks():
    os.environ["TRITON_INTERPRET"] = "1"      # before any @triton.jit is defined
    try:
        import torch  # noqa: F401
        import triton
    except ImportError as e:
        raise InputError(f"collect --interpret needs torch and triton ({e}); "
                         "install a CPU torch first (pip install torch --index-url "
                         "https://download.pytorch.org/whl/cpu), then pip install 'pagecast[interpret]'") from None
    check_triton_version(triton.__version__)
    return triton


class InterpretRecorder:
    """Receives the hooks' calls and writes the trace."""

    def __init__(self, cfg: InterpretConfig, writer: T.TraceWriter, emulation) -> None:
        self.cfg, self.writer = cfg, writer
        self.emu = emulation                 # times(moved) -> (start, end); records(...); dropped
        self.log = AllocationLog()
        self.placement = make_placement(cfg.allocator, self.log)
        self.storages = StorageMap(self.placement, lambda: self.issued)
        self.issued = 0                      # launches begun (ids are dense in this order)
        self.written = 0                     # launches handed to the writer
        self.cur: _Launch | None = None
        self._packers: dict[object, ArgPacker] = {}
        self._pending: list[_Launch] = []
        self._truth: list[tuple] = []
        self._truth_rows = 0
        self._last_flush = time.monotonic()
        self._segs = None
        self._segs_key = None
        self.kernels: set[str] = set()
        self.accesses = 0
        self.lanes = 0
        self.unmapped = 0                    # addresses in no known storage (left out of the truth)
        self.outside = 0                     # truth pages in no live allocation (none expected; counted)
        self.hook_s = 0.0
        self.on_launch: Callable[[], None] | None = None
        self.values = ValuesRecorder(limit=cfg.values_limit, omit_repeats=True)
        self.has_values = False
        self.partial: list[int] = []          # launches cut off while they ran (manifest partial_launches)
        self.failed: BaseException | None = None   # the write error that stopped collection
        self.stopping = False                 # a signal stopped collection: no new launch is recorded
        self.busy = 0                         # depth inside a hook (a signal waits for it to return)
        self.pending_signal: int | None = None

    # ---- hooks
    def on_signal(self, signum: int) -> None:
        """SIGTERM/SIGINT: stop recording; raise where the workload runs (module docstring)."""
        self.stopping = True
        if self.busy:
            self.pending_signal = signum
            return
        raise Interrupted(signum)

    @_hook
    def begin(self, fn, args: tuple, kwargs: dict) -> None:
        if self.stopping:
            return
        t0 = time.perf_counter()
        self.storages.release_freed()
        packer = self._packers.get(fn)
        if packer is None:
            kw = getattr(fn, "kwargs", {}) or {}
            packer = self._packers[fn] = ArgPacker(fn.fn, kw.get("do_not_specialize"),
                                                   kw.get("do_not_specialize_on_alignment"))
        lid = self.issued
        self.issued += 1
        try:
            packed = packer.pack(args, kwargs, self.storages.address_of)
        except NotOnCPU as e:
            self.issued -= 1
            raise Refusal(f"kernel {packer.name} was passed a tensor on {e}: under --interpret every tensor must be "
                          "on the CPU (the interpreter would run the kernel on a host copy); create them on the CPU"
                          ) from None
        except (PagecastError, SharedMemory) as e:
            self.issued -= 1
            raise Refusal(str(e)) from None
        nw = kwargs.get("num_warps")
        self.cur = _Launch(lid, packer.name, packed, WARP * int(nw if nw else DEFAULT_NUM_WARPS),
                           reads=self._index_reads(packed))
        self.hook_s += time.perf_counter() - t0

    def _index_reads(self, packed) -> list:
        """The bytes of the launch's integer buffers as it begins, from each pointer to the end of
        its storage, at most the limit's worth in all (the recorder counts what the limit cuts)."""
        out = []
        if not packed.int_pointers:
            return out
        import torch   # the workload's own (collect_interpreted imported it)
        budget = self.values.limit
        for off, addr, t in packed.int_pointers:
            try:
                st = t.untyped_storage()
                s0 = int(t.storage_offset()) * int(t.element_size())
                n = max(0, int(st.nbytes()) - s0)
                if n == 0:
                    continue
                take = min(n, budget + 1)   # one byte past the budget: the recorder counts the clip
                raw = torch.empty(0, dtype=torch.uint8).set_(st)[s0:s0 + take].numpy().tobytes()
            except (AttributeError, RuntimeError, TypeError):
                continue   # not a torch tensor with a storage: nothing to read
            if take < n:
                self.values.clipped_bytes += n - take
            out.append((off, addr, raw))
            budget = max(0, budget - len(raw))
        return out

    @_hook
    def grid(self, nx: int, ny: int, nz: int) -> None:
        if self.cur is not None:
            self.cur.grid = (int(nx), int(ny), int(nz))

    @_hook
    def access(self, ptrs, mask, kind: int) -> None:
        cur = self.cur
        if cur is None:
            return
        t0 = time.perf_counter()
        a = ptrs.data
        ety = ptrs.dtype
        while hasattr(ety, "element_ty"):
            ety = ety.element_ty
        self.accesses += 1
        self.lanes += a.size
        self.unmapped += cur.pages.add_tile(a, None if mask is None else mask.data, kind, self.storages.index(),
                                            max(1, (ety.primitive_bitwidth + 7) // 8))
        self.hook_s += time.perf_counter() - t0

    @_hook
    def end(self, partial: bool = False) -> None:
        """The launch ended; `partial`: it was cut off (an exception or a signal inside it), so its
        footprint is only what it touched so far (marked in the manifest's partial_launches)."""
        t0 = time.perf_counter()
        cur, self.cur = self.cur, None
        if cur is None:
            return
        if min(cur.grid) <= 0:          # an empty grid launches nothing (the launcher skips it)
            self.issued -= 1
            return
        if partial:
            self.partial.append(cur.lid)
        pages, code = cur.pages.finish()
        cur.pages = None
        s, e, ids = self._segments()
        aid, addr, nb, c, outside = page_intervals(pages, code, s, e, ids)
        self.outside += outside
        self._truth.append((np.full(len(aid), cur.lid, np.int64), aid, addr, nb, c))
        self._truth_rows += len(aid)
        self._pending.append(cur)
        self.kernels.add(cur.name)
        if cur.reads:
            self.values.launch(cur.lid, cur.reads)
            self.has_values = True
            cur.reads = []
        if len(self._pending) >= self.cfg.flush_launches or self._truth_rows >= FLUSH_ROWS or \
                time.monotonic() - self._last_flush >= self.cfg.part_seconds:
            try:
                self.flush()
            except (OSError, PagecastError) as e:   # OutputWriteError: the path and the cause
                self.failed = e
                raise WriteFailed(str(e)) from None
        self.hook_s += time.perf_counter() - t0
        if self.on_launch is not None:
            self.on_launch()

    def _segments(self):
        if self._segs is None or self._segs_key != self.placement.version:
            segs = sorted(self.placement.segments())
            self._segs = (np.array([x[0] for x in segs], np.int64), np.array([x[1] for x in segs], np.int64),
                          np.array([x[2] for x in segs], np.int64))
            self._segs_key = self.placement.version
        return self._segs

    # ---- writing
    def flush(self) -> None:
        """Emulate the driver over the pending launches and hand everything to the writer."""
        self._last_flush = time.monotonic()
        if self._pending:
            first = self._pending[0].lid
            n = len(self._pending)
            lid = np.concatenate([t[0] for t in self._truth])
            aid = np.concatenate([t[1] for t in self._truth])
            addr = np.concatenate([t[2] for t in self._truth])
            nb = np.concatenate([t[3] for t in self._truth])
            code = np.concatenate([t[4] for t in self._truth])
            moved = np.bincount(lid - first, weights=nb, minlength=n)
            start, end = self.emu.times(moved)
            self.writer.append(T.LAUNCHES, self._launch_table(start, end))
            self.writer.append(T.TRUTH, {T.LAUNCH_ID: lid, T.ADDRESS: addr.astype(np.uint64), T.BYTES: nb,
                                         T.ACCESS: pa.array(np.array(T.TRUTH_ACCESS, object)[code - 1], pa.string())})
            uniq, local = np.unique(aid, return_inverse=True)
            info = [self.log.info[int(a)] for a in uniq]
            faults, migs = self.emu.records(first, lid, local.reshape(-1), addr, nb, (code - 1).astype(np.int8),
                                            start, end, [x[0] for x in info], [x[1] for x in info])
            self.writer.append(T.FAULTS, faults)
            self.writer.append(T.MIGRATIONS, migs)
            vals = self.values.take()
            if vals[T.LAUNCH_ID]:
                self.writer.append(T.VALUES, vals)
            self.written += n
            self._pending, self._truth, self._truth_rows = [], [], 0
        self._write_allocations(live_too=False)

    def _write_allocations(self, live_too: bool) -> None:
        rows = self.log.rows(live_too=live_too)
        if not rows["alloc_id"]:
            return
        n = len(rows["alloc_id"])
        last = np.array([-1 if x is None else x for x in rows["last"]], np.int64)
        self.writer.append(T.ALLOCATIONS, {
            T.ALLOC_ID: np.array(rows["alloc_id"], np.int64), T.ADDRESS: np.array(rows["address"], np.uint64),
            T.BYTES: np.array(rows["bytes"], np.int64), T.KIND: pa.array(["managed"] * n, pa.string()),
            T.DEVICE: np.zeros(n, np.int32), T.FIRST_LAUNCH: np.array(rows["first"], np.int64),
            T.LAST_LAUNCH: pa.array(last, pa.int64(), mask=last < 0)})

    def _launch_table(self, start: np.ndarray, end: np.ndarray) -> dict:
        ls = self._pending
        n = len(ls)
        offs = pa.array([x.packed.offsets for x in ls], pa.list_(pa.int32()))
        sizes = pa.array([x.packed.sizes for x in ls], pa.list_(pa.int32()))
        g = np.array([x.grid for x in ls], np.int32).reshape(n, 3)
        return {T.LAUNCH_ID: np.array([x.lid for x in ls], np.int64),
                T.KERNEL: pa.array([x.name for x in ls], pa.string()),
                T.DEVICE: np.zeros(n, np.int32), T.STREAM: np.zeros(n, np.int64),
                T.GRID_X: g[:, 0], T.GRID_Y: g[:, 1], T.GRID_Z: g[:, 2],
                T.BLOCK_X: np.array([x.block for x in ls], np.int32), T.BLOCK_Y: np.ones(n, np.int32),
                T.BLOCK_Z: np.ones(n, np.int32), T.SHARED_MEM_BYTES: np.zeros(n, np.int32),
                T.START_NS: start, T.END_NS: end, T.PARAM_OFFSETS: offs, T.PARAM_SIZES: sizes,
                T.PARAM_DATA: pa.array([x.packed.data for x in ls], pa.binary())}

    def finish(self, complete: bool, wall_seconds: float | None = None, **manifest) -> dict:
        """Flush, write the manifest (with `manifest`'s keys) and rename the trace into place;
        returns the collection's statistics (as the manifest's `collection`)."""
        self.stopping = True
        if self.cur is not None:        # the workload died inside a launch: keep what it touched, marked
            self.end(partial=True)
        self.storages.release_freed()
        self.flush()
        self._write_allocations(live_too=True)
        extra = {T.VALUES_KEY: self.values.manifest()} if self.has_values else {}
        if self.partial:
            extra[T.PARTIAL_KEY] = sorted(self.partial)
        stats = self.stats()
        if wall_seconds is not None:
            stats["wall_seconds"] = round(wall_seconds, 3)
        self.writer.update_manifest(**{"collection": stats, "dropped_records": sum(self.emu.dropped.values()),
                                       **extra, **manifest})
        self.writer.close(complete=complete and not self.partial)
        return stats

    def stats(self) -> dict:
        return {"launches": self.written + len(self._pending), "kernels": len(self.kernels),
                "storages": self.storages.storages, "allocations": self.log.next_id,
                "peak_live_allocated_bytes": self.log.peak_live_bytes, "memory_accesses": self.accesses,
                "lanes": self.lanes, "unmapped_addresses": self.unmapped,
                "pages_outside_allocations": self.outside,
                "hook_seconds": round(self.hook_s, 3), "records_dropped": dict(self.emu.dropped)}


def collect_interpreted(cfg: InterpretConfig, target: Callable[[], None], *, emulation,
                        progress=None) -> InterpretResult:
    """Run `target` (the workload) under the interpreter with the hooks in; write cfg.output.

    `emulation(prefetch=, seed=, drop=)` makes the driver emulation and clock (the workload
    models' `pagecast.datasets.emulate.FullModeEmulation`)."""
    triton = _frameworks()
    import torch

    fixes = interpret_compat.apply_all()
    manifest = T.new_manifest(
        mode="full", source=SOURCE, workload={"name": cfg.workload.name, "argv": list(cfg.workload.argv)},
        device=dict(DEVICE), driver_prefetch=bool(cfg.driver_prefetch),
        environment={"triton": triton.__version__, "torch": torch.__version__, "numpy": np.__version__,
                     "python": sys.version.split()[0]},
        interpreter={"allocator": cfg.allocator, "drop_rate": cfg.drop, "seed": int(cfg.seed),
                     "compat_fixes": fixes})
    rec: InterpretRecorder | None = None
    handlers: dict = {}

    def on_signal(signum, frame):
        if rec is None:           # before the hooks are in: nothing recorded yet
            raise Interrupted(signum)
        rec.on_signal(signum)

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            handlers[sig] = signal.signal(sig, on_signal)
    writer = uninstall = None
    code, refusal = 0, None
    t0 = time.perf_counter()
    try:
        writer = T.TraceWriter(cfg.output, manifest, force=cfg.force, tables=(*T.REQUIRED_TABLES, T.TRUTH),
                               part_rows=1_000_000, part_seconds=cfg.part_seconds, in_place=True)
        rec = InterpretRecorder(cfg, writer, emulation(prefetch=cfg.driver_prefetch, seed=cfg.seed, drop=cfg.drop))
        rec.on_launch = progress
        uninstall = interpret_hooks.install(rec)
        target()
    except Refusal as e:
        code, refusal = 2, str(e)
    except WriteFailed:
        code = 2
    except Interrupted as e:
        code = 128 + e.signum
        if rec is not None:
            print(f"pagecast collect: workload interrupted by {signal.Signals(e.signum).name}; writing the"
                  " partial trace", file=sys.stderr)
    except SystemExit as e:
        code = _exit_code(e)
    except KeyboardInterrupt:
        code = 130
    except BaseException:   # the workload's own error: shown as Python would, the trace kept
        if rec is None:
            if writer is not None:
                writer.abort()
            _restore(handlers)
            raise
        traceback.print_exc()
        code = 1
    finally:
        if uninstall is not None:
            uninstall()
        for sig in handlers:      # let the flush finish: a second signal is ignored from here
            signal.signal(sig, signal.SIG_IGN)
    try:
        wall = time.perf_counter() - t0
        if rec is None:          # interrupted before anything was recorded
            if writer is not None:
                writer.abort()
            raise InputError(f"interrupted before the workload started; nothing written to {cfg.output}")
        if rec.failed is not None:   # the disk refused a part: nothing is kept, the re-run needs no clean-up
            writer.abort()
            e = rec.failed
            cause = describe_os_error(e.cause if isinstance(e, OutputWriteError) else e)
            raise OutputWriteError(cfg.output, cause, f"collection stopped at launch {rec.issued:,};"
                                   " nothing was kept")
        stats = rec.finish(complete=code == 0, wall_seconds=wall, workload_exit_code=code)
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    finally:
        _restore(handlers)
    return InterpretResult(code, stats["launches"], refusal, Path(cfg.output), stats)


def _restore(handlers: dict) -> None:
    for sig, old in handlers.items():
        try:
            signal.signal(sig, old)
        except (TypeError, ValueError):
            pass
    handlers.clear()


def _exit_code(e: SystemExit) -> int:
    c = e.code
    if c is None:
        return 0
    if isinstance(c, int):
        return c
    print(c, file=sys.stderr)
    return 1
