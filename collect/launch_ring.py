"""The natural-mode launch buffer: what the launch callback records, decoded off the callback.

In natural mode the collector's launch callback (`LaunchHook` with `ring=`) does only what
recording needs while the launch call's memory is valid: it reads the launch's fields, gathers
the parameter bytes straight into a slot of this preallocated buffer (one compiled call,
`param_gather.gather_into`), takes CUPTI's stream id, device and timestamp, and packs a
fixed-size header next to them. Turning slots into `LaunchArgs` (the kernel's name and layout,
the `extra` rule, the correlation ids) and numbering them into the trace's rows happens in
`take`, on whichever thread the collector drains from (its ticker, CUPTI's buffer thread before
it adds kernel records, the final flush), under the collector's lock, which the callback never
takes (the writer holds it while it writes Parquet parts).

Layout: `slots` slots of `HEADER.size` header bytes (`header`, a bytearray) and `slot_bytes`
parameter bytes (`params`, a uint8 array), a `ready` byte per slot, and sequence numbers
(`seq`, the order the hook delivered launches in, which is the trace's launch order). A launch
whose parameters exceed `slot_bytes` keeps them beside the slot (`_side`); a launch that finds
the buffer full (the consumer fell `slots` launches behind) is kept whole beside it (`_spill`,
counted): nothing is dropped, and `take` returns everything in sequence order.

Threads: any number of launching threads put (a lock hands out sequence numbers, the only
shared step); one consumer at a time takes (the collector's lock). A slot is taken only once
its `ready` byte is set, which the producer does last; a sequence number handed out whose
launch failed to record is marked void and skipped.

Correlation ids are those the launch had when the hook delivered it (the decoding path's
`LaunchArgs` gets a driver call nested in an already delivered runtime launch added later; the
row builder has taken the ids at delivery on either path).

A kernel's layout and name are asked of the driver once, at its first launch (`first_sight`,
in the callback: the gather needs the layout, and the function handle is surely valid then);
later launches find them in `layouts` / `names`.
"""

from __future__ import annotations

import struct
import threading
import time

import numpy as np

from .launch_hook import _MAX_PARAM_BYTES, LaunchArgs, extra_layout
from .param_gather import gather_into, layout_arrays

# seq, host_ns, function, stream, stream_id (-1: none), device (-1: none), shared_mem_bytes,
# grid x/y/z, block x/y/z, parameter bytes, correlation ids 0-3, correlation id count, cbid,
# domain, flags
HEADER = struct.Struct("<qqQQqiQIIIIIIIIIIIHHBB")
_pack, _HSIZE = HEADER.pack_into, HEADER.size
F_AT_EXIT = 1    # delivered at its API's exit
F_SIDE = 2       # parameter bytes (or correlation ids past 4) kept beside the slot
F_EXTRA = 4      # bytes from the `extra` buffer: the layout follows `extra_layout`
_NCORR = 4

SLOTS = 16384        # launches buffered between drains (the collector drains every tick, 0.2 s)
SLOT_BYTES = 256     # parameter bytes a slot holds (kernels with up to 32 pointers); more go beside


class LaunchRing:
    def __init__(self, slots: int = SLOTS, slot_bytes: int = SLOT_BYTES) -> None:
        if slots < 1 or slot_bytes < 0:
            raise ValueError("slots must be >= 1 and slot_bytes >= 0")
        self.slots = int(slots)
        self.slot_bytes = int(slot_bytes)
        self.header = bytearray(HEADER.size * self.slots)
        self.params = np.zeros(self.slots * self.slot_bytes, np.uint8)
        self.ready = bytearray(self.slots)
        self.layouts: dict[int, tuple] = {}   # function -> (offsets, sizes, gather arrays)
        self.names: dict[int, str] = {}
        self._lock = threading.Lock()
        self._head = 0      # next sequence number to hand out
        self._tail = 0      # next sequence number to take
        self._side: dict[int, tuple[bytes | None, list[int] | None]] = {}
        self._spill: dict[int, tuple | None] = {}   # seq -> (header values, data, corrs), or None: void
        self.spilled = 0    # launches that found the buffer full
        self.taken = 0
        self.take_ns = 0    # CPU time the taking threads spent turning slots into LaunchArgs (off the callback)

    # -- the callback's side --
    def first_sight(self, func: int, layout: tuple[tuple, tuple], name: str) -> tuple:
        offsets, sizes = tuple(layout[0]), tuple(layout[1])
        lay = (offsets, sizes, layout_arrays(offsets, sizes, _MAX_PARAM_BYTES))
        self.names[func] = name
        self.layouts[func] = lay
        return lay

    def put(self, cap: tuple, corrs: list[int], at_exit: bool) -> None:
        """Record one capture (`LaunchHook._capture`) with its correlation ids."""
        func, grid, block, smem, stream, stream_id, device, src, lay, host_ns, cbid, domain = cap
        with self._lock:
            seq = self._head
            self._head = seq + 1
        try:
            flags = F_AT_EXIT if at_exit else 0
            ncorr = len(corrs)
            if ncorr == 1:
                c0, c1, c2, c3 = corrs[0], 0, 0, 0
            else:
                c0, c1, c2, c3 = (corrs + [0, 0, 0])[:_NCORR]
            side_corrs = list(corrs) if ncorr > _NCORR else None
            extra = src.__class__ is bytes   # the `extra` buffer, copied already
            if extra:
                flags |= F_EXTRA
            if seq - self._tail >= self.slots:   # full: keep it whole beside the buffer
                data = src if extra else self._bytes(src, lay)
                vals = (seq, host_ns, func, stream, -1 if stream_id is None else stream_id,
                        -1 if device is None else device, smem, *grid, *block, len(data), c0, c1, c2, c3, ncorr,
                        cbid, domain, flags)
                self._spill[seq] = (vals, data, side_corrs)
                self.spilled += 1
                return
            slot = seq % self.slots
            base = slot * self.slot_bytes
            side_data = None
            if extra:
                n = len(src)
                if n <= self.slot_bytes:
                    self.params[base:base + n] = np.frombuffer(src, np.uint8)
                else:
                    side_data = src
            else:
                n = lay[2][2]
                if n <= self.slot_bytes:
                    gather_into(src, lay[2], self.params, base)
                else:
                    side_data = self._bytes(src, lay)
            if side_data is not None or side_corrs is not None:
                flags |= F_SIDE
                self._side[seq] = (side_data, side_corrs)
            _pack(self.header, slot * _HSIZE, seq, host_ns, func, stream, -1 if stream_id is None else stream_id,
                  -1 if device is None else device, smem, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                  n, c0, c1, c2, c3, ncorr, cbid, domain, flags)
            self.ready[slot] = 1
        except BaseException:
            self._side.pop(seq, None)
            self._spill[seq] = None   # void: take skips it
            raise

    def _bytes(self, src, lay) -> bytes:
        if isinstance(src, bytes):
            return src
        o, s, total = lay[2]
        out = np.zeros(total, np.uint8)
        gather_into(src, lay[2], out, 0)
        return out.tobytes()

    # -- the consumer's side (one at a time) --
    def pending(self) -> int:
        return self._head - self._tail

    def take(self, wait_s: float = 0.0) -> list[LaunchArgs]:
        """Every launch recorded so far, in sequence order, as the hook would have delivered it.
        A launch still being recorded (another thread's callback is inside `put`) stops the take
        there, after waiting up to `wait_s` for it."""
        t0 = time.thread_time_ns()   # CPU time: the GIL's waits while other threads run are not this work's
        out: list[LaunchArgs] = []
        head = self._head
        deadline = None
        P = self.slot_bytes
        while self._tail < head:
            seq = self._tail
            if seq in self._spill:
                got = self._spill.pop(seq)
                if got is not None:
                    vals, data, corrs = got
                    out.append(self._args(vals, data, corrs))
                self._tail = seq + 1
                continue
            slot = seq % self.slots
            if not self.ready[slot]:
                if deadline is None:
                    deadline = time.monotonic() + wait_s
                if time.monotonic() >= deadline:
                    break
                time.sleep(0)   # let the recording thread finish
                continue
            vals = HEADER.unpack_from(self.header, slot * HEADER.size)
            if vals[0] != seq:
                raise RuntimeError(f"launch buffer slot {slot} holds launch {vals[0]}, expected {seq}")
            data, corrs = (None, None)
            if vals[-1] & F_SIDE:
                data, corrs = self._side.pop(seq)
            if data is None:
                data = self.params[slot * P:slot * P + vals[13]].tobytes()
            out.append(self._args(vals, data, corrs))
            self.ready[slot] = 0
            self._tail = seq + 1
        self.taken += len(out)
        self.take_ns += time.thread_time_ns() - t0
        return out

    def _args(self, vals: tuple, data: bytes, corrs: list[int] | None) -> LaunchArgs:
        (_, host_ns, func, stream, stream_id, device, smem, gx, gy, gz, bx, by, bz, _n,
         c0, c1, c2, c3, ncorr, cbid, domain, flags) = vals
        offsets, sizes, _ = self.layouts[func]
        if flags & F_EXTRA:
            offsets, sizes = extra_layout(offsets, sizes, len(data))
        if corrs is None:
            corrs = [c0, c1, c2, c3][:ncorr]
        return LaunchArgs(kernel=self.names[func], function=func, grid_x=gx, grid_y=gy, grid_z=gz, block_x=bx,
                          block_y=by, block_z=bz, shared_mem_bytes=smem, stream=stream, correlation_id=corrs[0],
                          param_offsets=tuple(offsets), param_sizes=tuple(sizes), param_data=data,
                          stream_id=None if stream_id < 0 else stream_id, device=None if device < 0 else device,
                          host_ns=host_ns, cbid=cbid, domain=domain, correlation_ids=list(corrs),
                          at_exit=bool(flags & F_AT_EXIT))

    def info(self) -> dict:
        n = max(1, self.taken)
        return {"slots": self.slots, "slot_bytes": self.slot_bytes, "spilled": self.spilled,
                "decode_us_per_launch": round(self.take_ns / n / 1e3, 3)}
