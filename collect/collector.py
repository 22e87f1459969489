"""The collector: launch hook + activity source + row builder + trace writer.

Data flow. The launch hook (CUPTI callback, in the workload's launching thread)
numbers each launch and, in `full` mode, evicts live managed memory before it
and synchronizes after it, closing that launch's attribution window. In `natural`
mode it only records each launch into a preallocated buffer (`launch_ring.py`), which
the ticker, CUPTI's buffer thread and the final flush turn into launches, off the
callback (`_take_launches`). Activity
records arrive from the source (CUPTI's buffer thread, or a flush), are turned
into rows by `RowBuilder`, and go to a `TraceWriter` as they become final; a
ticker thread flushes the source and closes Parquet parts every
`part_seconds`, so a crash loses at most the last few seconds.

Index values (full mode, with a device that can copy): at each launch's API enter, after the
previous kernel ended and before this one is queued, `values_copy.ValuesCopier` copies what its
pointer parameters point to into the `values` table (docs/collect.md, "Index values").

Ending. `finish(complete)` is the one flush path for every way a run ends
(normal exit, an exception in the workload, SIGINT, SIGTERM, a refused
oversubscription): unsubscribe the hook, synchronize, force-flush the source,
count dropped records, release every pending row, write the manifest
(`complete: false` unless the workload exited 0). Tests drive this same class
with a stand-in source and device.
"""

from __future__ import annotations

import _thread
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any, Callable

from pagecast import trace as T
from pagecast.console import warn
from pagecast.uvm import PAGE

from . import convert as C
from .activity import CuptiActivitySource
from .cuda_device import CudaDevice, Device, ValuesDevice  # noqa: F401  (re-exported: the command's device)
from .launch_hook import LaunchArgs, LaunchHook
from .launch_ring import LaunchRing
from .managed import ManagedBudget, ManagedTracker, OversubscriptionError
from .values_copy import LIMIT as VALUES_LIMIT
from .values_copy import ValuesCopier


# Python functions CUPTI calls from C: no exception may be raised inside them.
def _callback_codes() -> frozenset:
    return frozenset({LaunchHook._callback.__code__, CuptiActivitySource._buffer_completed.__code__})


_CALLBACK_CODES = _callback_codes()


class Terminated(BaseException):
    """SIGTERM (or SIGINT) arrived while the workload ran."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class BudgetExceeded(BaseException):
    """The workload tried to allocate more managed memory than the GPU has free."""


class Collector:
    def __init__(self, out, *, mode: str = "full", source, device: Device | None,
                 budget: ManagedBudget | None = None, hook_cls: type = LaunchHook,
                 hook_kwargs: dict | None = None, force: bool = False, part_seconds: float = 2.0,
                 tick_s: float = 0.2, launch_timeout_s: float = 10.0, manifest: dict | None = None,
                 install_signals: bool = True, values_limit: int | None = VALUES_LIMIT,
                 ring: "bool | LaunchRing | None" = None) -> None:
        if mode not in T.MODES:
            raise ValueError(f"mode must be one of {T.MODES}")
        self.out = out
        self.mode = mode
        self.source = source
        self.device = device
        self.budget = budget or ManagedBudget(None)
        self.force = force
        self.part_seconds = part_seconds
        self.tick_s = tick_s
        self.builder = C.RowBuilder(mode, page_size=(manifest or {}).get("page_size", PAGE),
                                    launch_timeout_s=launch_timeout_s)
        self.manifest = dict(manifest or T.new_manifest(mode=mode, source="cupti"))
        self.manifest["mode"] = mode
        # full mode, with a device that can copy: index values (collect/values_copy.py)
        self.values: ValuesCopier | None = None
        if mode == "full" and values_limit and device is not None and hasattr(device, "read"):
            self.values = ValuesCopier(device.read, self.budget.ranges, limit=int(values_limit))
            self.manifest[T.VALUES_KEY] = self.values.manifest()
        self.tracker = ManagedTracker(self.budget, on_violation=self._on_violation)
        # natural mode: the callback records into a buffer, decoded off the callback (`_take_launches`);
        # `ring=False` keeps the decode in the callback (`on_launch`), as full mode does; a LaunchRing: that one
        self.ring: LaunchRing | None = None
        if mode == "natural" and ring is not False:
            self.ring = ring if isinstance(ring, LaunchRing) else LaunchRing()
        kw = dict(hook_kwargs or {})
        if self.ring is not None:
            kw["ring"] = self.ring
        self.hook = hook_cls(self.on_launch, before_launch=self.before_launch if mode == "full" else None,
                             after_launch=self.after_launch if mode == "full" else None,
                             api_callbacks=self.tracker.callbacks(), **kw)
        self.install_signals = install_signals
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self.writer: T.TraceWriter | None = None
        self._finished = False
        self._old_handlers: dict[int, Any] = {}
        self.violation: str | None = None
        self.evict_ns = 0
        self.sync_ns = 0
        self.evictions = 0
        self.wall_s = 0.0
        self._t0 = 0.0
        self.exit_code: int | None = None
        self.failure: str | None = None
        self.sink_errors = 0
        self.last_sink_error: str | None = None
        self._source_started = False
        self._deferred: int | None = None
        self._deferred_since = 0.0
        self._stopping = False
        self.abandon_after_s = 1.0
        self._pid = os.getpid()

    # -- launch-hook side (the workload's launching thread) --
    def before_launch(self) -> None:
        t0 = time.perf_counter_ns()
        self.device.synchronize()  # the previous kernel (and anything else queued) is done
        ranges = self.budget.ranges()
        if ranges:
            self.device.evict(ranges)
            self.device.synchronize()
            self.evictions += 1
        self.evict_ns += time.perf_counter_ns() - t0

    def on_launch(self, args: LaunchArgs) -> None:
        with self._lock:
            lid = self.builder.add_launch(args, time.monotonic())
        if self.values is not None:
            # before the kernel is queued, after the previous one ended (before_launch synchronized):
            # what the launch will read when it starts (outside the lock: records keep flowing)
            self.values.record(lid, args.param_offsets, args.param_sizes, args.param_data, late=args.at_exit)

    def after_launch(self, args: LaunchArgs | None) -> None:
        t0 = time.perf_counter_ns()
        self.device.synchronize()  # serialize: this launch's faults all happen before the next one
        hi = self.device.now()
        self.sync_ns += time.perf_counter_ns() - t0
        if args is not None and args.launch_id is not None:
            with self._lock:
                self.builder.close_window(args.launch_id, args.host_ns, hi)

    def _on_violation(self, message: str) -> None:
        self.violation = message
        # CUPTI cannot cancel the allocation; stop the workload at its next bytecode.
        try:
            _thread.interrupt_main(signal.SIGUSR2)
        except Exception:
            pass

    # -- record side (CUPTI's buffer thread, the ticker, or a flush) --
    def _take_launches(self, wait_s: float = 0.0) -> None:
        """Natural mode: the launches the callback recorded, into the row builder (under the lock).
        Before kernel records are added, so that each finds its launch."""
        if self.ring is None:
            return
        try:
            launches = self.ring.take(wait_s)
        except Exception as e:  # a broken slot must not take the collection down
            self.hook.errors += 1
            self.hook.last_error = f"launch buffer: {type(e).__name__}: {e}"
            return
        now = time.monotonic()
        for a in launches:
            self.builder.add_launch(a, now)

    def _on_records(self, recs: list) -> None:
        with self._lock:
            self._take_launches(0.01)
            self.builder.add_records(recs, time.monotonic())
            self._sink()

    def _sink(self, final: bool = False) -> None:
        if self.writer is None or self.writer.closed:
            return
        rows = self.builder.drain(time.monotonic(), final=final)
        if self.values is not None:
            rows = {**rows, T.VALUES: self.values.take()}
        for table, cols in rows.items():
            if cols and len(next(iter(cols.values()))):
                try:
                    self.writer.append(table, cols)
                except Exception as e:  # a bad row must not take the collection down
                    self.sink_errors += 1
                    self.last_sink_error = f"{table}: {type(e).__name__}: {e}"

    def _tick(self) -> None:
        last_part = time.monotonic()
        while not self._stop.wait(self.tick_s):
            self._redeliver()
            try:
                self.source.flush(False)
            except Exception:
                pass
            with self._lock:
                if self._finished:
                    return
                self._take_launches()
                self._sink()
                if time.monotonic() - last_part >= self.part_seconds:
                    self.writer.flush()
                    self.writer.update_manifest(collection=self._collection_info(running=True),
                                                **self._values_manifest())
                    last_part = time.monotonic()

    # -- lifecycle --
    def start(self) -> None:
        self._t0 = time.perf_counter()
        self._pid = os.getpid()
        self.writer = T.TraceWriter(self.out, self.manifest, force=self.force, part_seconds=self.part_seconds,
                                    in_place=True,
                                    tables=(*T.REQUIRED_TABLES, T.UVM_EVENTS)
                                    + ((T.VALUES,) if self.values is not None else ()))
        if self.install_signals and threading.current_thread() is threading.main_thread():
            for sig, handler in ((signal.SIGTERM, self._signal), (signal.SIGINT, self._signal),
                                 (signal.SIGUSR2, self._budget_signal)):
                self._old_handlers[sig] = signal.signal(sig, handler)
        self.source.start(self._on_records)
        self._source_started = True
        self.hook.start()
        self._ticker = threading.Thread(target=self._tick, name="pagecast-collect", daemon=True)
        self._ticker.start()

    @staticmethod
    def _in_callback(frame) -> bool:
        # Python runs signal handlers in the main thread between bytecodes, which can be
        # inside a CUPTI callback (called from C); an exception raised there would be lost.
        # Defer it: the ticker sends the signal again, and it lands in the workload's code.
        codes = _CALLBACK_CODES
        while frame is not None:
            if frame.f_code in codes:
                return True
            frame = frame.f_back
        return False

    def _defer(self, signum: int) -> None:
        if self._deferred is None:
            self._deferred_since = time.monotonic()
        self._deferred = signum

    def _not_ours(self, signum) -> bool:
        """In a child the workload forked (a data-loader worker), act as if we were not there."""
        if os.getpid() == self._pid:
            return False
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return True

    def _signal(self, signum, frame) -> None:
        if self._not_ours(signum):
            return
        if self._finished or self._stopping:
            return
        if self._in_callback(frame):
            self._defer(signum)
            return
        self._stopping = True
        raise Terminated(signum)

    def _budget_signal(self, signum, frame) -> None:
        if self._not_ours(signum):
            return
        if self.violation and not self._finished and not self._stopping:
            if self._in_callback(frame):
                self._defer(signum)
                return
            self._stopping = True
            raise BudgetExceeded(self.violation)

    def _redeliver(self) -> None:
        """Ticker: send a deferred signal again; if it keeps landing inside callbacks, abandon."""
        signum = self._deferred
        if signum is None or self._finished or self._stopping:
            return
        if time.monotonic() - self._deferred_since > self.abandon_after_s:
            self._abandon(signum)  # does not return
        try:
            signal.pthread_kill(threading.main_thread().ident, signum)
        except (OSError, ValueError):
            pass

    def _abandon(self, signum: int) -> None:
        """The workload spends its time inside launch callbacks (full mode waits there), where
        no exception may be raised: write the trace from this thread and end the process, as
        the signal's default action would have, but with the trace kept."""
        budget = signum == signal.SIGUSR2 and self.violation
        code = 2 if budget else 128 + signum
        self.hook.disabled = True  # the launching thread's callbacks do nothing from now on
        with self._lock:           # the kernels it launches from now on are not the trace's
            self.builder.seal(self.hook.clock())
        self.exit_code = code
        if budget:
            self.failure = self.violation
        else:
            warn(f"workload interrupted by {signal.Signals(signum).name}; writing the partial trace")
        try:
            self.finish(False, abandoning=True)
        finally:
            if budget:
                print(f"pagecast collect: error: {self.violation}", file=sys.stderr, flush=True)
            sys.stderr.flush()
            sys.stdout.flush()
            os._exit(code)

    def run(self, target: Callable[[], Any], after_start: Callable[[], None] | None = None) -> int:
        """Run the workload under collection; returns its exit code (the trace is written either way).

        `after_start` runs once CUPTI is set up, before the workload (the command sets
        the managed-memory limit there: it needs a CUDA context, which should come after
        CUPTI's unified-memory counters are configured).
        """
        code, complete = 0, True
        try:
            self.start()
            if after_start is not None:
                after_start()
        except BaseException:
            self.finish(False)
            raise
        try:
            target()
            if self.violation:  # refused, but the workload ended before the refusal reached it
                code, complete = 2, False
                self.failure = self.violation
        except SystemExit as e:
            c = e.code
            code = c if isinstance(c, int) else (0 if c is None else 1)
            if not isinstance(c, (int, type(None))):
                print(c, file=sys.stderr)
            complete = code == 0
        except Terminated as e:
            code, complete = 128 + e.signum, False
            warn(f"workload interrupted by {signal.Signals(e.signum).name}; writing the partial trace")
        except KeyboardInterrupt:
            code, complete = 130, False
            warn("workload interrupted; writing the partial trace")
        except (BudgetExceeded, OversubscriptionError) as e:
            code, complete = 2, False
            self.failure = self.violation or str(e)
        except BaseException:
            if self.violation:  # the workload saw the refusal as its own error (e.g. out of memory)
                code, complete = 2, False
                self.failure = self.violation
            else:
                traceback.print_exc()  # the workload's own traceback, as Python would show it
                code, complete = 1, False
        finally:
            self.exit_code = code
            self.finish(complete and code == 0)
        return code

    def finish(self, complete: bool, *, abandoning: bool = False) -> None:
        """The one flush path. `abandoning`: called from the ticker thread while the
        workload's thread is stuck inside a callback (leave the hook, the device and the
        signal handlers alone; the process ends right after)."""
        if self._finished:
            return
        self._finished = True
        try:
            if not abandoning:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    if sig in self._old_handlers:
                        signal.signal(sig, signal.SIG_IGN)  # let the flush finish
            self._stop.set()
            if self._ticker is not None and threading.current_thread() is not self._ticker:
                self._ticker.join(timeout=5)
            if not abandoning:
                try:
                    self.hook.stop()
                except Exception as e:
                    warn(f"stopping the launch hook failed: {e}")
            if self.device is not None and not abandoning:
                try:
                    self.device.synchronize()
                except Exception:
                    pass
            dropped = 0
            if self._source_started:
                try:
                    self.source.flush(True)
                except Exception as e:
                    warn(f"flushing activity records failed: {e}")
                try:
                    dropped = int(self.source.dropped())
                except Exception:
                    pass
                try:
                    self.source.stop()
                except Exception:
                    pass
            self.wall_s = time.perf_counter() - self._t0
            with self._lock:
                if self.writer is None:
                    return
                self._take_launches(1.0)
                self._sink(final=True)
                info = self._collection_info(running=False)
                info["dropped_records"] = dropped
                self.writer.update_manifest(dropped_records=dropped, collection=info,
                                            workload_exit_code=self.exit_code, **self._values_manifest())
                self.writer.close(complete=complete)
            if dropped:
                warn(f"CUPTI dropped {dropped} activity records (buffers full); the trace misses them")
            if self.hook.errors:
                warn(f"{self.hook.errors} launch callback errors; last: {self.hook.last_error}")
            if getattr(self.device, "errors", 0):
                warn(f"{self.device.errors} device calls failed (evicting before a launch, synchronizing): the"
                     f" launches after them may show less than they touched; last: {self.device.last_error}")
            if self.sink_errors:
                warn(f"{self.sink_errors} rows could not be written; last: {self.last_sink_error}")
        finally:
            if not abandoning:
                for sig, old in self._old_handlers.items():
                    try:
                        signal.signal(sig, old)
                    except (TypeError, ValueError):
                        pass
                self._old_handlers = {}

    def _values_manifest(self) -> dict:
        return {T.VALUES_KEY: self.values.manifest()} if self.values is not None else {}

    def _collection_info(self, running: bool) -> dict:
        st = self.builder.stats.as_dict()
        n = max(1, self.hook.launches)
        hook_ns = self.hook.callback_ns - (self.evict_ns + self.sync_ns)
        return {
            "running": running,
            "launches_hooked": self.hook.launches,
            "hook_errors": self.hook.errors,
            "hook_last_error": self.hook.last_error,
            "runtime_reaches_driver": getattr(self.hook, "runtime_reaches_driver", None),
            "cupti_subscriber": getattr(self.hook, "subscribe_mode", ""),
            "callback_us_per_launch": round(max(0, hook_ns) / n / 1e3, 3),
            "evict_and_sync_us_per_launch": round((self.evict_ns + self.sync_ns) / n / 1e3, 3),
            "evictions": self.evictions,
            # calls the device refused (an eviction's cuMemPrefetchAsync, a synchronize): a launch after a
            # refused eviction may find its pages resident and show less than it touched
            "device_errors": int(getattr(self.device, "errors", 0) or 0),
            "device_last_error": getattr(self.device, "last_error", None),
            "wall_s": round(self.wall_s if not running else time.perf_counter() - self._t0, 3),
            "managed_peak_bytes": self.budget.peak,
            "managed_limit_bytes": self.budget.limit,
            "refused": self.violation,
            **({f"launch_buffer_{k}": v for k, v in self.ring.info().items()} if self.ring is not None else {}),
            **{f"rows_{k}": v for k, v in st.items()},
            **({f"values_{k}": v for k, v in self.values.stats.as_dict().items()} if self.values is not None else {}),
            **{f"source_{k}": v for k, v in getattr(self.source, "info", {}).items()},
        }

    def overhead_line(self) -> str:
        info = self._collection_info(running=False)
        n = self.hook.launches
        cb_s = info["callback_us_per_launch"] * n / 1e6
        pct = 100.0 * cb_s / self.wall_s if self.wall_s > 0 else 0.0
        line = (f"collection overhead: {n} launches, {info['callback_us_per_launch']:.1f} us per launch in the "
                f"launch callback ({pct:.2f}% of {self.wall_s:.2f} s)")
        if self.mode == "full":
            line += f"; full mode added {info['evict_and_sync_us_per_launch']:.1f} us per launch evicting and synchronizing"
        elif self.ring is not None:
            line += f"; {info['launch_buffer_decode_us_per_launch']:.1f} us per launch decoded off the callback"
        return line


def default_part_seconds() -> float:
    try:
        return float(os.environ.get("PAGECAST_PART_SECONDS", "2"))
    except ValueError:
        return 2.0
