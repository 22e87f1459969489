"""A Perfetto trace file, written with the `perfetto` package's TrackEvent protobuf builder.

`PerfettoWriter` declares tracks (slices, instants or counters, in a tree whose
children keep the order they were declared in) and appends events column-wise;
`close()` writes the file (packets serialized in batches of `BATCH` through
`perfetto.trace_builder.proto_builder.TraceProtoBuilder`; concatenated `Trace`
messages are one trace, which is how the package's own streaming builder writes).
Event names are interned (kernel names repeat thousands of times). Timestamps are
nanoseconds. Format: docs/reports.md ("Perfetto timelines") and its sources.
"""

from __future__ import annotations

import heapq
import os
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
from perfetto.trace_builder.proto_builder import TraceProtoBuilder

from pagecast.outputs import Output, OutputWriteError

BATCH = 20_000          # packets per serialized Trace message (bounds memory, not a format limit)
SEQUENCE_ID = 1         # one writer: one trusted packet sequence (needed for interning)


def _pb():
    return pb


class PerfettoWriter:
    def __init__(self, path: str | os.PathLike, *, force: bool = True) -> None:
        self._builder_cls = TraceProtoBuilder
        self.path = Path(path)
        self._out = Output(self.path, force=force, example="timeline.pftrace")
        self._file = open(self._out.tmp, "wb")
        self._builder = TraceProtoBuilder()
        self._pending = 0
        self._next_uuid = 1
        self._ranks: dict[int, int] = {}
        self._names: dict[str, int] = {}
        self._first = True
        self.events = 0

    @property
    def tracks(self) -> int:
        """Tracks declared so far."""
        return self._next_uuid - 1

    # ---- tracks ------------------------------------------------------------------
    def track(self, name: str, parent: int | None = None, *, counter_unit: str | None = None,
              ordered_children: bool = True) -> int:
        """Declare a track (a counter track when `counter_unit` is "bytes" or "count"); returns its uuid.
        Children of a track are shown in the order they are declared."""
        pb = _pb()
        uuid = self._next_uuid
        self._next_uuid += 1
        pkt = self._packet()
        d = pkt.track_descriptor
        d.uuid = uuid
        d.name = name
        if parent is not None:
            d.parent_uuid = parent
            rank = self._ranks.get(parent, 0)
            d.sibling_order_rank = rank
            self._ranks[parent] = rank + 1
        if ordered_children:
            d.child_ordering = pb.TrackDescriptor.EXPLICIT
        if counter_unit is not None:
            unit = {"bytes": pb.CounterDescriptor.UNIT_SIZE_BYTES, "count": pb.CounterDescriptor.UNIT_COUNT}
            d.counter.unit = unit[counter_unit]
        return uuid

    # ---- events ------------------------------------------------------------------
    def slices(self, track: int, start_ns: np.ndarray, end_ns: np.ndarray, names: Sequence[str] | str,
               args: dict[str, Sequence] | None = None) -> int:
        """Complete slices [start, end) on one track; they must not partly overlap (use `lanes`)."""
        start_ns = np.asarray(start_ns, np.int64)
        return self._events(track, start_ns, np.maximum(np.asarray(end_ns, np.int64), start_ns), names, args)

    def instants(self, track: int, ts_ns: np.ndarray, names: Sequence[str] | str,
                 args: dict[str, Sequence] | None = None) -> int:
        return self._events(track, np.asarray(ts_ns, np.int64), None, names, args)

    def _events(self, track, ts, end, names, args) -> int:
        """Named events at `ts` (instants, or slice begins with their ends at `end`), in time order."""
        pb = _pb()
        one = names if isinstance(names, str) else None
        cols = list((args or {}).items())
        kind = pb.TrackEvent.TYPE_INSTANT if end is None else pb.TrackEvent.TYPE_SLICE_BEGIN
        order = np.argsort(ts, kind="stable")
        for i in order.tolist():
            pkt = self._packet(int(ts[i]))
            ev = pkt.track_event
            ev.type = kind
            ev.track_uuid = track
            self._name(pkt, one if one is not None else str(names[i]))
            for k, col in cols:
                _annotate(ev.debug_annotations.add(), k, col[i])
            if end is not None:
                stop = self._packet(int(end[i]))
                stop.track_event.type = pb.TrackEvent.TYPE_SLICE_END
                stop.track_event.track_uuid = track
        self.events += len(order)
        return len(order)

    def counter(self, track: int, ts_ns: np.ndarray, values: np.ndarray) -> int:
        """Counter samples (integers) on a counter track, in time order."""
        pb = _pb()
        ts_ns = np.asarray(ts_ns, np.int64)
        values = np.asarray(values)
        order = np.argsort(ts_ns, kind="stable")
        is_int = np.issubdtype(values.dtype, np.integer)
        for i in order.tolist():
            pkt = self._packet(int(ts_ns[i]))
            ev = pkt.track_event
            ev.type = pb.TrackEvent.TYPE_COUNTER
            ev.track_uuid = track
            if is_int:
                ev.counter_value = int(values[i])
            else:
                ev.double_counter_value = float(values[i])
        self.events += len(order)
        return len(order)

    # ---- file --------------------------------------------------------------------
    def _packet(self, ts: int | None = None):
        pb = _pb()
        if self._pending >= BATCH:   # before adding: the caller fills the packet this returns
            self._flush()
        pkt = self._builder.add_packet()
        pkt.trusted_packet_sequence_id = SEQUENCE_ID
        if self._first:
            pkt.sequence_flags = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
            self._first = False
        if ts is not None:
            pkt.timestamp = ts
            pkt.sequence_flags |= pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
        self._pending += 1
        return pkt

    def _name(self, pkt, name: str) -> None:
        iid = self._names.get(name)
        if iid is None:
            iid = self._names[name] = len(self._names) + 1
            e = pkt.interned_data.event_names.add()
            e.iid = iid
            e.name = name
        pkt.track_event.name_iid = iid

    def _flush(self) -> None:
        if self._pending:
            self._file.write(self._builder.serialize())
            self._builder = self._builder_cls()
            self._pending = 0

    def close(self) -> Path:
        """Write what is pending and rename the file into place (`pagecast.outputs.Output`)."""
        try:
            self._flush()
            self._file.close()
        except BaseException:
            self.abort()
            raise
        return self._out.commit()

    def abort(self) -> None:
        self._file.close()
        self._out.abort()

    def __enter__(self) -> "PerfettoWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
            if isinstance(exc, OSError):
                raise OutputWriteError(self.path, exc) from None


def _annotate(a, key: str, v) -> None:
    a.name = key
    if isinstance(v, (bool, np.bool_)):
        a.bool_value = bool(v)
    elif isinstance(v, (int, np.integer)):
        a.int_value = int(v)
    elif isinstance(v, (float, np.floating)):
        a.double_value = float(v)
    else:
        a.string_value = str(v)


def lanes(start: Iterable[int], end: Iterable[int]) -> np.ndarray:
    """The lowest lane each interval fits in so that no two on one lane overlap (greedy by start:
    as few lanes as the deepest overlap needs). Slices on a Perfetto track must nest, so
    overlapping transfers and allocations go on lanes "name", "name #2", ..."""
    s = np.asarray(list(start) if not isinstance(start, np.ndarray) else start, np.int64)
    e = np.asarray(list(end) if not isinstance(end, np.ndarray) else end, np.int64)
    out = np.zeros(len(s), np.int64)
    if len(s) == 0:
        return out
    order = np.argsort(s, kind="stable")
    if (s[order][1:] >= np.maximum.accumulate(e[order])[:-1]).all():
        return out   # nothing overlaps: one lane
    busy: list[tuple[int, int]] = []   # (end, lane)
    free: list[int] = []
    n_lanes = 0
    for i in order.tolist():
        while busy and busy[0][0] <= s[i]:
            heapq.heappush(free, heapq.heappop(busy)[1])
        lane = heapq.heappop(free) if free else n_lanes
        if lane == n_lanes:
            n_lanes += 1
        out[i] = lane
        heapq.heappush(busy, (int(e[i]), lane))
    return out
