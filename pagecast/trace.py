"""Trace format v1 (docs/trace-format.md): the one module that owns it.

Everything that reads or writes a trace goes through here: the table and
column names, the pyarrow schemas, the manifest, a crash-safe writer that
closes Parquet parts as it goes, and a validating reader. Other modules refer
to columns through the constants below, never by spelling the names.

Long because the format has one owner: splitting the schemas, the writer and the reader
would spread the column names this module exists to keep in one place.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import PRODUCER
from .errors import OutputExistsError, TraceError, shown
from .jsonfile import read_json, write_json_atomic
from .outputs import Output, OutputWriteError, refuse_special, remove_path
from .uvm import PAGE

FORMAT = "pagecast-trace"
VERSION = 1
MANIFEST = "manifest.json"
PART_GLOB = "*.parquet"

# ---- table names -----------------------------------------------------------
LAUNCHES = "launches"
ALLOCATIONS = "allocations"
FAULTS = "faults"
MIGRATIONS = "migrations"
TRUTH = "truth"
UVM_EVENTS = "uvm_events"  # optional, collector-specific (thrashing, throttling, remote map)
VALUES = "values"          # optional: index buffers' contents at launch (expert ids, token ids, block tables)

REQUIRED_TABLES = (LAUNCHES, ALLOCATIONS, FAULTS, MIGRATIONS)
OPTIONAL_TABLES = (TRUTH, UVM_EVENTS, VALUES)

# ---- column names ----------------------------------------------------------
LAUNCH_ID = "launch_id"
KERNEL = "kernel"
DEVICE = "device"
STREAM = "stream"
GRID_X, GRID_Y, GRID_Z = "grid_x", "grid_y", "grid_z"
BLOCK_X, BLOCK_Y, BLOCK_Z = "block_x", "block_y", "block_z"
GRID_COLUMNS = (GRID_X, GRID_Y, GRID_Z, BLOCK_X, BLOCK_Y, BLOCK_Z)
SHARED_MEM_BYTES = "shared_mem_bytes"
START_NS, END_NS = "start_ns", "end_ns"
PARAM_OFFSETS, PARAM_SIZES, PARAM_DATA = "param_offsets", "param_sizes", "param_data"
ALLOC_ID = "alloc_id"
ADDRESS = "address"
BYTES = "bytes"
KIND = "kind"
FIRST_LAUNCH, LAST_LAUNCH = "first_launch", "last_launch"
ALLOC_NS, FREE_NS = "alloc_ns", "free_ns"
TIME_NS = "time_ns"
COUNT = "count"
ACCESS = "access"
DIRECTION = "direction"
CAUSE = "cause"
# uvm_events (optional)
EVENT = "event"
VALUE = "value"
# values (optional)
PARAM_OFFSET = "param_offset"
DATA = "data"

# ---- enumerations ----------------------------------------------------------
ALLOC_KINDS = ("managed", "device", "host")
FAULT_ACCESS = ("read", "write", "atomic", "prefetch", "unknown")
DIRECTIONS = ("htod", "dtoh", "dtod")
CAUSES = ("user", "coherence", "prefetch", "eviction", "access_counters", "unknown")
TRUTH_ACCESS = ("read", "write", "readwrite")
MODES = ("full", "natural")

_i32, _i64, _u64 = pa.int32(), pa.int64(), pa.uint64()

SCHEMAS: dict[str, pa.Schema] = {
    LAUNCHES: pa.schema([
        (LAUNCH_ID, _i64), (KERNEL, pa.string()), (DEVICE, _i32), (STREAM, _i64),
        (GRID_X, _i32), (GRID_Y, _i32), (GRID_Z, _i32),
        (BLOCK_X, _i32), (BLOCK_Y, _i32), (BLOCK_Z, _i32),
        (SHARED_MEM_BYTES, _i32), (START_NS, _i64), (END_NS, _i64),
        (PARAM_OFFSETS, pa.list_(_i32)), (PARAM_SIZES, pa.list_(_i32)),
        (PARAM_DATA, pa.binary()),
    ]),
    ALLOCATIONS: pa.schema([
        (ALLOC_ID, _i64), (ADDRESS, _u64), (BYTES, _i64), (KIND, pa.string()),
        (DEVICE, _i32), (FIRST_LAUNCH, _i64), (LAST_LAUNCH, _i64),
        (ALLOC_NS, _i64), (FREE_NS, _i64),
    ]),
    FAULTS: pa.schema([
        (TIME_NS, _i64), (ADDRESS, _u64), (COUNT, _i32), (ACCESS, pa.string()),
        (DEVICE, _i32), (LAUNCH_ID, _i64),
    ]),
    MIGRATIONS: pa.schema([
        (START_NS, _i64), (END_NS, _i64), (ADDRESS, _u64), (BYTES, _i64),
        (DIRECTION, pa.string()), (CAUSE, pa.string()), (LAUNCH_ID, _i64),
    ]),
    TRUTH: pa.schema([
        (LAUNCH_ID, _i64), (ADDRESS, _u64), (BYTES, _i64), (ACCESS, pa.string()),
    ]),
    UVM_EVENTS: pa.schema([
        (TIME_NS, _i64), (EVENT, pa.string()), (ADDRESS, _u64), (VALUE, _i64),
        (DEVICE, _i32), (LAUNCH_ID, _i64),
    ]),
    VALUES: pa.schema([
        (LAUNCH_ID, _i64), (PARAM_OFFSET, _i32), (ADDRESS, _u64), (BYTES, _i64), (DATA, pa.binary()),
    ]),
}

NULLABLE: dict[str, frozenset[str]] = {
    LAUNCHES: frozenset({START_NS, END_NS}),
    ALLOCATIONS: frozenset({LAST_LAUNCH, ALLOC_NS, FREE_NS}),
    FAULTS: frozenset({LAUNCH_ID}),
    MIGRATIONS: frozenset({LAUNCH_ID}),
    TRUTH: frozenset(),
    UVM_EVENTS: frozenset({ADDRESS, LAUNCH_ID, DEVICE}),
    VALUES: frozenset(),
}

ENUMS: dict[tuple[str, str], tuple[str, ...]] = {
    (ALLOCATIONS, KIND): ALLOC_KINDS,
    (FAULTS, ACCESS): FAULT_ACCESS,
    (MIGRATIONS, DIRECTION): DIRECTIONS,
    (MIGRATIONS, CAUSE): CAUSES,
    (TRUTH, ACCESS): TRUTH_ACCESS,
}

# Columns that must hold strictly positive values.
POSITIVE = {(ALLOCATIONS, BYTES), (MIGRATIONS, BYTES), (TRUTH, BYTES), (FAULTS, COUNT), (VALUES, BYTES)}

# ---- the values table's manifest key (docs/trace-format.md, "values") --------------
# "values": {"limit_bytes": L, "clipped_bytes": C, "clipped_launches": K, "repeats": "omitted" | "kept"}
VALUES_KEY = "values"
# Bytes of index values recorded per launch unless the writer says otherwise: the copy of B bytes
# of an index buffer costs less than a fifth of the full-mode faults the launch takes on those
# B bytes at any B (docs/trace-format.md, "The values limit"), so the limit bounds the trace's
# size, not the collection's time; 16 MiB holds a CSR block's column indices of a few million
# nonzeros, and a reader never keeps more than this per launch for a trace that names no limit.
VALUES_LIMIT = 16 << 20
REPEATS = ("omitted", "kept")

# ---- what the writer promises (docs/trace-format.md, "What pagecast adds") -----------------
# "table_rows": {"launches": n, ...}: the rows each table's parts hold, written at close. A reader
# refuses a trace whose parts hold other counts (parts lost, or mixed with another run's).
TABLE_ROWS_KEY = "table_rows"
# "partial_launches": [launch ids]: launches cut off (by a signal, an error) while they ran, whose
# recorded footprint is only part of what they touch; fitting and evaluation leave them out.
PARTIAL_KEY = "partial_launches"


class TraceWarning(UserWarning):
    """Something about a trace the user should know (e.g. it is incomplete)."""


# ---- manifest --------------------------------------------------------------

def new_manifest(*, page_size: int = PAGE, mode: str = "full", source: str = "synthetic",
                 workload: Mapping[str, Any] | None = None,
                 device: Mapping[str, Any] | None = None,
                 driver_prefetch: bool | None = None, **extra: Any) -> dict:
    """A v1 manifest with `complete: false`; the writer sets it true on close."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    m = {
        "format": FORMAT,
        "version": VERSION,
        "complete": False,
        "page_size": int(page_size),
        "mode": mode,
        "source": source,
        "workload": dict(workload or {"name": None, "argv": None}),
        "device": dict(device or {"name": None, "index": None, "memory_bytes": None}),
        "driver_prefetch": driver_prefetch,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "producer": PRODUCER,
    }
    m.update(extra)
    return m


# ---- tables from Python data -----------------------------------------------

def to_table(name: str, data: pa.Table | Mapping[str, Any] | Any) -> pa.Table:
    """Coerce a pyarrow Table, a pandas DataFrame or a dict of columns to a table's schema.

    Missing nullable columns become nulls; column order follows the schema.
    """
    schema = SCHEMAS[name]
    if isinstance(data, pa.Table):
        cols = {n: data.column(n) for n in data.column_names}
        nrows = data.num_rows
    elif hasattr(data, "to_dict") and hasattr(data, "columns"):  # pandas
        cols = {c: data[c].to_numpy() for c in data.columns}
        nrows = len(data)
    else:
        cols = dict(data)
        nrows = len(next(iter(cols.values()))) if cols else 0
    arrays = []
    for f in schema:
        if f.name in cols:
            arrays.append(pa.array(cols[f.name], type=f.type) if not isinstance(cols[f.name], (pa.Array, pa.ChunkedArray))
                          else cols[f.name].cast(f.type))
        elif f.name in NULLABLE[name]:
            arrays.append(pa.nulls(nrows, type=f.type))
        else:
            raise ValueError(f"{name}: column {f.name!r} is required")
    return pa.Table.from_arrays(arrays, schema=schema)


# ---- writer ----------------------------------------------------------------

def owned_trace_dir(path: Path) -> bool:
    """Whether `--force` may replace directory `path`: a trace (its manifest names this format),
    or what an interrupted writer of an earlier pagecast left of one (table directories holding
    Parquet parts and temporary dot-files, and at most a manifest)."""
    path = Path(path)
    if is_trace(path):
        return True
    try:
        for e in path.iterdir():
            if e.name == MANIFEST and e.is_file():
                continue
            if not (e.is_dir() and e.name in SCHEMAS):
                return False
            if not all(f.is_file() and (f.suffix == ".parquet" or f.name.startswith(".")) for f in e.iterdir()):
                return False
    except OSError:
        return False
    return True


def check_output_dir(path: str | os.PathLike, force: bool, owned=owned_trace_dir) -> Path:
    """Refuse an existing output unless --force, and with it anything pagecast did not write
    (checked before any work; the write itself goes through `pagecast.outputs.Output`)."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        if not force:
            raise OutputExistsError(path)
        refuse_special(path)
        if path.is_dir() and not path.is_symlink() and any(path.iterdir()) and not owned(path):
            raise OutputExistsError(path, f"{path} is a non-empty directory that is not a pagecast output;"
                                          " refusing to delete it even with --force")
    return path


def prepare_output_dir(path: Path, force: bool, owned=owned_trace_dir) -> None:
    """Refuse an existing output unless --force; with it, delete it now (a previous pagecast output
    only). For outputs that are filled in place (the demo's work directory); everything else
    writes through `pagecast.outputs.Output`, which replaces the old output only once the new one
    is whole."""
    path = check_output_dir(path, force, owned)
    if path.exists() or path.is_symlink():
        remove_path(path)


class TraceWriter:
    """Writes a trace directory part by part, into a temporary sibling renamed into place.

    Rows are buffered per table and written as a new Parquet part once
    `part_rows` rows are buffered or `part_seconds` have passed since that
    table's last part, so a crash loses at most the open buffers. Each part is
    written under a temporary name and renamed, so every visible part is whole.
    Everything goes to a temporary sibling of `path` (`pagecast.outputs.Output`):
    `close(complete)` writes the manifest (with `complete` and each table's row count,
    `table_rows`) and renames the trace into place; `abort()` (and leaving a `with` block
    by an exception) removes it, so a failed write leaves nothing at `path`. A collector passes
    `keep_partial=True` (or calls `close(complete=False)` itself): an exception then keeps the
    closed parts as an incomplete trace at `path`. `in_place=True` (the collectors) claims `path`
    itself at the start (mkdir: a second writer loses at once) and writes there, so a process
    killed outright leaves its closed parts readable at `path`, as trace-format.md promises. A second writer
    to the same path loses cleanly at close (or replaces the first whole under --force).
    An OSError while writing becomes OutputWriteError naming `path` and the cause.
    """

    def __init__(self, path: str | os.PathLike, manifest: Mapping[str, Any], *, force: bool = False,
                 part_rows: int = 1_000_000, part_seconds: float = 5.0,
                 tables: Iterable[str] = REQUIRED_TABLES, keep_partial: bool = False,
                 in_place: bool = False) -> None:
        self.path = Path(path)
        self.keep_partial = keep_partial
        self._out = Output(self.path, force=force, directory=True, owned=owned_trace_dir, in_place=in_place)
        self.tmp = self._out.tmp
        self.manifest = dict(manifest)
        self.manifest["complete"] = False
        self.manifest.pop(TABLE_ROWS_KEY, None)
        self.part_rows = part_rows
        self.part_seconds = part_seconds
        self._buffers: dict[str, list[pa.Table]] = {}
        self._buffered_rows: dict[str, int] = {}
        self._parts: dict[str, int] = {}
        self._last_flush: dict[str, float] = {}
        self.rows: dict[str, int] = {}
        self._written: dict[str, int] = {}   # rows in closed parts
        self.closed = False
        with self._io():
            for t in tables:
                self._open_table(t)
            write_json_atomic(self.tmp / MANIFEST, self.manifest)

    @contextmanager
    def _io(self):
        """An OSError (a full disk) while writing: OutputWriteError naming the output and the cause
        (the caller decides whether to abort or keep what was closed)."""
        try:
            yield
        except OutputWriteError as e:
            raise OutputWriteError(self.path, e.cause, "nothing was kept") from None
        except OSError as e:
            raise OutputWriteError(self.path, e, "nothing was kept") from None

    def _open_table(self, name: str) -> None:
        if name not in SCHEMAS:
            raise ValueError(f"unknown table {name!r}")
        if name not in self._parts:
            (self.tmp / name).mkdir(exist_ok=True)
            self._parts[name] = 0
            self._buffers[name] = []
            self._buffered_rows[name] = 0
            self._last_flush[name] = time.monotonic()
            self.rows[name] = 0
            self._written[name] = 0

    def append(self, name: str, data: Any) -> None:
        """Buffer rows for table `name`; writes a part when the buffer is due."""
        if self.closed:
            raise RuntimeError("trace writer is closed")
        with self._io():
            self._open_table(name)
        table = to_table(name, data)
        if table.num_rows == 0:
            return
        self._buffers[name].append(table)
        self._buffered_rows[name] += table.num_rows
        self.rows[name] += table.num_rows
        if (self._buffered_rows[name] >= self.part_rows
                or time.monotonic() - self._last_flush[name] >= self.part_seconds):
            self.flush(name)

    def flush(self, name: str | None = None) -> None:
        """Close the open part of one table (or all tables) now."""
        for t in ([name] if name else list(self._buffers)):
            bufs = self._buffers[t]
            self._last_flush[t] = time.monotonic()
            if not bufs:
                continue
            table = pa.concat_tables(bufs)
            self._write_part(t, table)
            self._buffers[t] = []
            self._buffered_rows[t] = 0

    def _write_part(self, name: str, table: pa.Table) -> None:
        part = self.tmp / name / f"part-{self._parts[name]:05d}.parquet"
        tmp = part.with_name(f".{part.name}.tmp")
        with self._io():
            try:
                pq.write_table(table, tmp, compression="zstd")
                os.replace(tmp, part)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
        self._parts[name] += 1
        self._written[name] += table.num_rows

    def update_manifest(self, **changes: Any) -> None:
        """Change manifest keys and rewrite it atomically."""
        if self.closed:
            raise RuntimeError("trace writer is closed")
        self.manifest.update(changes)
        with self._io():
            write_json_atomic(self.tmp / MANIFEST, self.manifest)

    def close(self, complete: bool = True) -> Path:
        """Flush every table; give each empty table one zero-row part; write the manifest with
        `complete` and `table_rows`; rename the trace into place. A failure removes it
        (OutputWriteError, or OutputExistsError when another run wrote the path meanwhile)."""
        if self.closed:
            return self.path
        try:
            self.flush()
            for t, n in self._parts.items():
                if n == 0:
                    self._write_part(t, SCHEMAS[t].empty_table())
            self.manifest["complete"] = bool(complete)
            self.manifest[TABLE_ROWS_KEY] = {t: int(self._written[t]) for t in self._parts}
            with self._io():
                write_json_atomic(self.tmp / MANIFEST, self.manifest)
            self._out.commit()
        except BaseException:
            self.abort()
            raise
        self.closed = True
        return self.path

    def abort(self) -> None:
        """Drop the trace: nothing is left at the path (nor in its temporary sibling)."""
        self.closed = True
        self._out.abort()

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close(complete=True)
        elif self.keep_partial and not isinstance(exc, OutputWriteError):
            self.close(complete=False)
        else:
            self.abort()


def write_trace(path: str | os.PathLike, manifest: Mapping[str, Any], tables: Mapping[str, Any],
                *, force: bool = False) -> Path:
    """Write a whole trace at once (tables: name -> data) and mark it complete."""
    with TraceWriter(path, manifest, force=force) as w:
        for name, data in tables.items():
            if data is not None:
                with w._io():
                    w._open_table(name)
                w.append(name, data)
    return Path(path)


# ---- reader ----------------------------------------------------------------

@dataclass
class Trace:
    """A trace in memory: its manifest and one pyarrow Table per table."""

    path: Path
    manifest: dict
    launches: pa.Table
    allocations: pa.Table
    faults: pa.Table
    migrations: pa.Table
    truth: pa.Table | None = None
    extra: dict[str, pa.Table] = field(default_factory=dict)
    # what the reader did to the values table (rows dropped, bytes clipped: _validate_values)
    values_report: dict = field(default_factory=dict)

    @property
    def lazy(self) -> dict[str, list[Path]]:
        """Tables left on disk by read_trace(lazy=...): name -> their part files. `batches(name)`
        reads them row group by row group; the attribute (trace.faults, ...) reads the whole table
        the first time it is asked for, so code that wants all of it still gets all of it. Not a
        field: a copy (dataclasses.replace) holds what it was given."""
        return self.__dict__.setdefault("_lazy", {})

    def batches(self, name: str, columns: Iterable[str] | None = None,
                rows: int | None = None) -> Iterable[pa.Table]:
        """Table `name` piece by piece, in stored order, each piece conformed to the schema and
        checked as read_trace checks the whole table: from disk up to `rows` (LAZY_ROWS) rows of a
        Parquet row group at a time when the table was read lazily (memory: one piece), else slices
        of `rows` (BATCH_ROWS) rows of the loaded table.
        `columns` narrows what is read (the schema's order)."""
        cols = None if columns is None else [f.name for f in SCHEMAS[name] if f.name in set(columns)]
        if name in self.lazy:
            yield from _iter_parts(self.path, name, self.lazy[name], cols, rows or LAZY_ROWS)
            return
        t = getattr(self, name) if name in REQUIRED_TABLES or name == TRUTH else self.extra.get(name)
        if t is None:
            return
        if cols is not None:
            t = t.select(cols)
        rows = rows or BATCH_ROWS
        for off in range(0, t.num_rows, rows):
            yield t.slice(off, rows)

    @property
    def page_size(self) -> int:
        return int(self.manifest["page_size"])

    @property
    def complete(self) -> bool:
        return bool(self.manifest.get("complete"))

    @property
    def mode(self) -> str:
        return str(self.manifest.get("mode"))

    @property
    def n_launches(self) -> int:
        return self.launches.num_rows

    @property
    def partial_launches(self) -> np.ndarray:
        """Ids of the launches cut off while they ran (manifest `partial_launches`): their recorded
        footprint is part of what they touch, so fitting and evaluation leave them out."""
        ids = self.manifest.get(PARTIAL_KEY) or []
        a = np.asarray(ids, np.int64).reshape(-1)
        return a[(a >= 0) & (a < self.n_launches)]

    def whole_launches(self) -> np.ndarray:
        """Per launch: True unless it is one of `partial_launches`."""
        keep = np.ones(self.n_launches, bool)
        keep[self.partial_launches] = False
        return keep

    def require_launches(self, what: str) -> "Trace":
        """This trace, or TraceError (one line, exit 2) when it has no launches: an empty trace is bad input."""
        if self.n_launches == 0:
            n = self.allocations.num_rows
            held = f" ({n} allocation{'s' if n != 1 else ''}, no kernel ran)" if n else ""
            raise TraceError(f"{self.path}: the trace has no launches{held}; nothing to {what}")
        return self

    def has_argument_bytes(self) -> bool:
        """Whether its launches carry the kernels' argument bytes: not where the manifest says
        `argument_bytes: false` (`pagecast import nsys`), nor where no launch has any (collected
        without them); a runner matches the trace's launches to a live run's through them."""
        if self.manifest.get("argument_bytes") is False:
            return False
        if self.n_launches == 0:
            return True
        return bool(pc.sum(pc.binary_length(self.launches.column(PARAM_DATA))).as_py() or 0)

    def require_argument_bytes(self, what: str) -> "Trace":
        """This trace, or TraceError (one line, exit 2) when its launches carry no argument bytes
        (`has_argument_bytes`: manifest `argument_bytes: false`, as `pagecast import nsys` writes,
        Nsight recording none; or no launch with any, as a trace collected without them)."""
        if not self.has_argument_bytes():
            raise TraceError(f"{self.path}: {what} needs the kernels' argument bytes, which this trace (source"
                             f" {self.manifest.get('source')!r}) does not have; record the workload with pagecast collect")
        return self

    @property
    def values(self) -> pa.Table | None:
        """The optional values table (index buffers' contents at launch), sorted by launch_id."""
        return self.extra.get(VALUES)

    @property
    def values_limit(self) -> int:
        """Bytes of values kept per launch: the manifest's `values.limit_bytes`, else VALUES_LIMIT."""
        m = self.manifest.get(VALUES_KEY)
        return int(m.get("limit_bytes", VALUES_LIMIT)) if isinstance(m, dict) else VALUES_LIMIT

    @property
    def values_repeats_omitted(self) -> bool:
        """Whether the writer left out a launch's values row where it repeats the latest row read from
        the same address (then that row holds for the launch: pagecast.values)."""
        m = self.manifest.get(VALUES_KEY)
        return isinstance(m, dict) and m.get("repeats") == "omitted"

    @property
    def name(self) -> str:
        wl = self.manifest.get("workload") or {}
        return str(wl.get("name") or self.path.name)

    def table(self, name: str) -> pa.Table | None:
        if name in REQUIRED_TABLES or name == TRUTH:
            return getattr(self, name)
        return self.extra.get(name)

    def tables(self) -> dict[str, pa.Table]:
        out = {t: getattr(self, t) for t in REQUIRED_TABLES}
        if self.truth is not None:
            out[TRUTH] = self.truth
        out.update(self.extra)
        return out

    def column(self, table: str, col: str) -> np.ndarray:
        """A column as a numpy array (nulls become -1 for integer columns)."""
        arr = self.table(table).column(col)
        if arr.null_count:
            arr = pc.fill_null(arr, -1)
        return arr.to_numpy()

    def launch_fingerprint(self) -> str:
        """A hash of the launch sequence (kernel names and parameter bytes), for plans."""
        h = hashlib.sha256()
        for col in (KERNEL, PARAM_DATA):
            for chunk in self.launches.column(col).chunks:
                for buf in chunk.buffers():
                    if buf is not None:
                        h.update(memoryview(buf))
        h.update(str(self.n_launches).encode())
        return h.hexdigest()[:32]


BATCH_ROWS = 1 << 20   # rows per piece of Trace.batches for a table already in memory
LAZY_TABLES = (FAULTS, MIGRATIONS)   # the tables read_trace may leave on disk (the records: most of a trace's bytes)
DERIVED = "_derived_"   # prefix of what readers keep in a Trace's __dict__, made from its records


def _lazy_table(name: str) -> property:
    """Trace.<name> for a table that may have been left on disk: read whole, once, when asked for."""
    slot = "_" + name

    def get(self: "Trace") -> pa.Table:
        if name in self.lazy:   # (a damaged part raises TraceError here, and again if asked again)
            self.__dict__[slot] = _concat(list(_iter_parts(self.path, name, self.lazy[name], None)), name)
            del self.lazy[name]
        return self.__dict__[slot]

    def put(self: "Trace", value: pa.Table) -> None:
        self.__dict__[slot] = value
        self.lazy.pop(name, None)
        for k in [k for k in self.__dict__ if k.startswith(DERIVED)]:
            del self.__dict__[k]   # made from the records: made again from the new ones

    return property(get, put)


for _name in LAZY_TABLES:
    setattr(Trace, _name, _lazy_table(_name))


def _concat(tables: list[pa.Table], name: str) -> pa.Table:
    if not tables:
        return SCHEMAS[name].empty_table()
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


LAZY_ROWS = 1 << 18   # rows per piece of a lazily read table (Trace.batches)


def _iter_parts(path: Path, name: str, parts: list[Path], columns: list[str] | None,
                rows: int = LAZY_ROWS) -> Iterable[pa.Table]:
    """A lazily read table's row groups in pieces of at most `rows` rows, each conformed to the
    schema and checked (_check_table). A row group (up to 2^20 rows) decoded whole, with the copies
    conforming and checking make, was ~75 MB of pyarrow's memory for a fault table's three columns:
    the high of the pass over it (footprints.observed_footprints, docs/performance.md)."""
    schema = SCHEMAS[name]
    if columns is not None:
        schema = pa.schema([schema.field(c) for c in columns])
    for part in parts:
        try:
            pf = pq.ParquetFile(part)
            have = set(pf.schema_arrow.names)
            want = None if columns is None else [c for c in columns if c in have]
            groups = range(pf.num_row_groups)
        except Exception as e:  # pyarrow raises several kinds for a damaged file
            raise TraceError(f"{part}: unreadable Parquet part ({_first_line(e)})") from None
        for g in groups:
            batches = pf.iter_batches(batch_size=rows, row_groups=[g], columns=want)
            while True:
                try:
                    b = next(batches, None)
                except Exception as e:
                    raise TraceError(f"{part}: unreadable Parquet part ({_first_line(e)})") from None
                if b is None:
                    break
                t = _conform(pa.Table.from_batches([b]), schema, NULLABLE[name], part)
                del b
                _check_table(path, name, t)
                yield t


PAGE_SIZE_MIN, PAGE_SIZE_MAX = 512, 1 << 21   # bytes; x86-64 UVM pages are 4096


def read_manifest(path: str | os.PathLike) -> dict:
    """Read and check a trace's manifest: format, version and page size."""
    path = Path(path)
    if not path.exists():
        raise TraceError(f"{path}: no such trace directory")
    if not path.is_dir():
        raise TraceError(f"{path}: not a trace (a trace is a directory with a {MANIFEST})")
    mpath = path / MANIFEST
    if not mpath.exists():
        raise TraceError(f"{mpath}: missing; {path} is not a pagecast trace")
    manifest = read_json(mpath, TraceError)
    if not isinstance(manifest, dict):
        raise TraceError(f"{mpath}: expected a JSON object")
    fmt = manifest.get("format")
    if fmt != FORMAT:
        raise TraceError(f"{mpath}: format is {shown(fmt)}; this reader reads {FORMAT!r}")
    ver = manifest.get("version")
    if type(ver) is not int or ver != VERSION:  # true and 1.0 are not the version 1
        raise TraceError(f"{mpath}: version is {shown(ver)}; this reader reads version {VERSION}")
    ps = manifest.get("page_size")
    if not isinstance(ps, int) or isinstance(ps, bool) or ps <= 0 or ps & (ps - 1) \
            or not PAGE_SIZE_MIN <= ps <= PAGE_SIZE_MAX:
        raise TraceError(f"{mpath}: page_size must be a power of two from {PAGE_SIZE_MIN} to {PAGE_SIZE_MAX}, "
                         f"found {shown(ps)}")
    mode = manifest.get("mode")
    if mode not in MODES:
        raise TraceError(f"{mpath}: mode must be one of {', '.join(MODES)}, found {shown(mode)}")
    if not isinstance(manifest.get("complete"), bool):
        raise TraceError(f"{mpath}: complete must be true or false, found {shown(manifest.get('complete'))}")
    part = manifest.get(PARTIAL_KEY)
    if part is not None and not (isinstance(part, list) and all(type(x) is int and x >= 0 for x in part)):
        raise TraceError(f"{mpath}: {PARTIAL_KEY} must be a list of launch ids, found {shown(part)}")
    for key in ("workload", "device"):
        if not isinstance(manifest.get(key), (dict, type(None))):
            raise TraceError(f"{mpath}: {key} must be an object or null, found {shown(manifest.get(key))}")
    _check_values_key(manifest.get(VALUES_KEY), mpath)
    return manifest


def _check_values_key(v: Any, mpath: Path) -> None:
    """The manifest's `values` object, when there: a positive integer limit, counts >= 0, a known `repeats`."""
    if v is None:
        return
    if not isinstance(v, dict):
        raise TraceError(f"{mpath}: values must be an object, found {shown(v)}")
    for k in ("limit_bytes", "clipped_bytes", "clipped_launches"):
        x = v.get(k, 1)
        if not isinstance(x, int) or isinstance(x, bool) or x < (1 if k == "limit_bytes" else 0):
            raise TraceError(f"{mpath}: values.{k} must be an integer >= {1 if k == 'limit_bytes' else 0},"
                             f" found {shown(x)}")
    if v.get("repeats", "kept") not in REPEATS:
        raise TraceError(f"{mpath}: values.repeats must be one of {', '.join(REPEATS)}, found {shown(v.get('repeats'))}")


def is_trace(path: str | os.PathLike) -> bool:
    """True when `path` is a directory whose manifest names this format."""
    try:
        m = json.loads((Path(path) / MANIFEST).read_text())
        return isinstance(m, dict) and m.get("format") == FORMAT
    except (OSError, ValueError):
        return False


def read_trace(path: str | os.PathLike, *, tables: Iterable[str] | None = None,
               validate: bool = True, lazy: Iterable[str] = ()) -> Trace:
    """Read and validate a trace directory.

    `tables` limits which tables are loaded (the rest are empty); the
    manifest is always checked. Raises TraceError naming the file and problem.
    An incomplete trace reads, with a TraceWarning. `lazy` (some of LAZY_TABLES)
    leaves those tables on disk: `Trace.batches` streams them one row group at a
    time, checked as they are read (a damaged part raises TraceError then), and
    the attribute reads the whole table when first asked for.
    """
    path = Path(path)
    manifest = read_manifest(path)
    wanted = set(tables) if tables is not None else None
    lazy = set(lazy)
    if lazy - set(LAZY_TABLES):
        raise ValueError(f"only {', '.join(LAZY_TABLES)} can be read lazily")
    loaded: dict[str, pa.Table] = {}
    later: dict[str, list[Path]] = {}
    for name in REQUIRED_TABLES:
        tdir = path / name
        if not tdir.is_dir():
            raise TraceError(f"{tdir}: required table {name!r} is missing")
        if name in lazy and (wanted is None or name in wanted):
            later[name] = _part_files(tdir)
            loaded[name] = SCHEMAS[name].empty_table()
            continue
        loaded[name] = (_read_table(tdir, name) if wanted is None or name in wanted
                        else SCHEMAS[name].empty_table())
    truth = None
    extra: dict[str, pa.Table] = {}
    for name in OPTIONAL_TABLES:
        tdir = path / name
        if tdir.is_dir() and (wanted is None or name in wanted):
            t = _read_table(tdir, name)
            if name == TRUTH:
                truth = t
            else:
                extra[name] = t
    trace = Trace(path=path, manifest=manifest, truth=truth, extra=extra, **loaded)
    trace.lazy.update(later)
    said_complete = trace.complete
    _check_table_rows(trace, wanted)   # a table lost since: warns itself, naming it
    if validate:
        _validate(trace)
    if not said_complete:
        warnings.warn(f"{path}: trace is incomplete (the collector did not finish or the workload failed);"
                      " reading the parts that were closed", TraceWarning, stacklevel=2)
    return trace


def _part_files(tdir: Path) -> list[Path]:
    return sorted(p for p in tdir.glob(PART_GLOB) if not p.name.startswith("."))


def _footer_rows(parts: list[Path]) -> int | None:
    """The rows a lazily read table's parts hold, from their footers; None where a footer is
    damaged (that part is refused, in one line, when the table is read)."""
    try:
        return sum(pq.ParquetFile(p).metadata.num_rows for p in parts)
    except Exception:  # noqa: BLE001 - pyarrow raises several kinds for a damaged footer
        return None


def _check_table_rows(trace: "Trace", wanted: set[str] | None) -> None:
    """The manifest's `table_rows` (written at close) against the parts. A table it names that is
    missing, or whose parts hold another number of rows (parts lost, mixed with another run's,
    or edited), makes the trace incomplete: read, with a warning that says so."""
    rows = trace.manifest.get(TABLE_ROWS_KEY)
    if rows is None:
        return
    mpath = trace.path / MANIFEST
    if not isinstance(rows, dict) or not all(isinstance(k, str) and type(v) is int and v >= 0 for k, v in rows.items()):
        raise TraceError(f"{mpath}: {TABLE_ROWS_KEY} must map table names to row counts, found {shown(rows)}")
    wrong = []
    for name, n in rows.items():
        if name not in SCHEMAS:
            continue   # a table this reader does not know: kept and ignored
        if not (trace.path / name).is_dir():
            wrong.append(f"{name} is missing (the manifest says {n} rows)")
            continue
        if wanted is not None and name not in wanted:
            continue
        if name in trace.lazy:   # left on disk: the parts' footers count its rows
            have = _footer_rows(trace.lazy[name])
            if have is None:
                continue
        else:
            t = trace.table(name)
            have = 0 if t is None else t.num_rows
        if have != n:
            wrong.append(f"{name} holds {have} rows, the manifest says {n}")
    if wrong:
        if trace.complete:
            trace.manifest["complete"] = False
        warnings.warn(f"{trace.path}: " + "; ".join(wrong) + " (parts lost, edited or mixed with another run's);"
                      " reading it as incomplete", TraceWarning, stacklevel=3)


def _read_table(tdir: Path, name: str) -> pa.Table:
    parts = _part_files(tdir)
    schema = SCHEMAS[name]
    tables = []
    for part in parts:
        try:
            t = pq.read_table(part)
        except Exception as e:  # pyarrow raises several kinds for a damaged file
            raise TraceError(f"{part}: unreadable Parquet part ({_first_line(e)})") from None
        tables.append(_conform(t, schema, NULLABLE[name], part))
    if not tables:
        return schema.empty_table()
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


def _first_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return s[0] if s else type(e).__name__


def _compatible(have: pa.DataType, want: pa.DataType) -> bool:
    """Whether a stored type is an acceptable spelling of the spec's type."""
    if have == want:
        return True
    if pa.types.is_integer(want):
        return pa.types.is_integer(have)
    if pa.types.is_string(want):
        return pa.types.is_string(have) or pa.types.is_large_string(have) or pa.types.is_dictionary(have) \
            and (pa.types.is_string(have.value_type) or pa.types.is_large_string(have.value_type))
    if pa.types.is_binary(want):
        return pa.types.is_binary(have) or pa.types.is_large_binary(have) or pa.types.is_fixed_size_binary(have)
    if pa.types.is_list(want):
        return (pa.types.is_list(have) or pa.types.is_large_list(have)) and pa.types.is_integer(have.value_type)
    return False


def _conform(t: pa.Table, schema: pa.Schema, nullable: frozenset[str], where: Path) -> pa.Table:
    """Check a part's columns against the schema; cast to it; order as the spec does."""
    arrays = []
    for f in schema:
        if f.name not in t.column_names:
            if f.name in nullable:
                arrays.append(pa.nulls(t.num_rows, type=f.type))
                continue
            raise TraceError(f"{where}: column {f.name!r} is missing")
        col = t.column(f.name)
        if not _compatible(col.type, f.type):
            raise TraceError(f"{where}: column {f.name!r} has type {col.type}, expected {f.type}")
        if col.null_count and f.name not in nullable:
            raise TraceError(f"{where}: column {f.name!r} has {col.null_count} null values; it may not be null")
        if col.type != f.type:
            try:
                col = col.cast(f.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise TraceError(f"{where}: column {f.name!r} does not fit {f.type} ({_first_line(e)})") from None
        arrays.append(col)
    return pa.Table.from_arrays(arrays, schema=schema)


def ranges_wrap(address, nbytes) -> bool:
    """Whether any range (address, nbytes >= 0) runs past the end of the 64-bit address space."""
    b = np.asarray(nbytes).astype(np.uint64)
    return bool((np.asarray(address).astype(np.uint64) > np.uint64(2**64 - 1) - b).any())


def _check_table(p: Path, name: str, table: pa.Table) -> None:
    """The checks of one table (or one piece of it) that need no other table: enumerations,
    positive columns, ranges inside the address space (columns it does not hold are skipped)."""
    if not table.num_rows:
        return
    have = set(table.column_names)
    for (tname, col), allowed in ENUMS.items():
        if tname == name and col in have:
            values = pc.unique(table.column(col)).to_pylist()
            bad = sorted(set(values) - set(allowed))
            if bad:
                raise TraceError(f"{p / name}: column {col!r} has unknown values {bad[:3]};"
                                 f" expected one of {', '.join(allowed)}")
    for (tname, col) in POSITIVE:
        if tname == name and col in have:
            mn = pc.min(table.column(col)).as_py()
            if mn is not None and mn <= 0:
                raise TraceError(f"{p / name}: column {col!r} must be > 0, found {mn}")
    if ADDRESS in have and BYTES in have:
        if ranges_wrap(table.column(ADDRESS).to_numpy(zero_copy_only=False),
                       table.column(BYTES).to_numpy(zero_copy_only=False)):
            raise TraceError(f"{p / name}: a range (address + bytes) runs past the end of the address space")


def _validate(trace: Trace) -> None:
    for name in [*REQUIRED_TABLES, TRUTH, *trace.extra]:
        if name in SCHEMAS and name not in trace.lazy:   # a lazy table is checked as it is read
            table = trace.table(name)
            if table is not None:
                _check_table(trace.path, name, table)
    _validate_launches(trace)
    _validate_allocations(trace)
    _validate_truth(trace)
    _validate_values(trace)


def _validate_launches(trace: Trace) -> None:
    t = trace.launches
    where = trace.path / LAUNCHES
    ids = t.column(LAUNCH_ID).to_numpy()
    n = len(ids)
    if n and not np.array_equal(ids, np.arange(n)):
        order = np.argsort(ids, kind="stable")
        if not np.array_equal(ids[order], np.arange(n)):
            raise TraceError(f"{where}: launch_id must be dense 0..{n - 1};"
                             f" found {n} rows with ids from {ids.min()} to {ids.max()}"
                             + (" with duplicates" if len(np.unique(ids)) != n else ""))
        trace.launches = t.take(pa.array(order))
        t = trace.launches
    for c in GRID_COLUMNS:
        if n and pc.min(t.column(c)).as_py() < 1:
            raise TraceError(f"{where}: column {c!r} must be >= 1")
    if not n:
        return
    offs, sizes, data = t.column(PARAM_OFFSETS), t.column(PARAM_SIZES), t.column(PARAM_DATA)
    lo = pc.list_value_length(offs).to_numpy(zero_copy_only=False)
    ls = pc.list_value_length(sizes).to_numpy(zero_copy_only=False)
    if not np.array_equal(lo, ls):
        i = int(np.nonzero(lo != ls)[0][0])
        raise TraceError(f"{where}: launch {i}: param_offsets and param_sizes differ in length")
    flat_o = pc.list_flatten(offs).to_numpy(zero_copy_only=False).astype(np.int64)
    flat_s = pc.list_flatten(sizes).to_numpy(zero_copy_only=False).astype(np.int64)
    if len(flat_o):
        dlen = pc.binary_length(data).to_numpy(zero_copy_only=False).astype(np.int64)
        owner = np.repeat(np.arange(n), lo)
        bad = (flat_o < 0) | (flat_s < 0) | (flat_o + flat_s > dlen[owner])
        if bad.any():
            i = int(owner[np.argmax(bad)])
            raise TraceError(f"{where}: launch {i}: a parameter lies outside param_data")


def _validate_truth(trace: Trace) -> None:
    """In a complete trace truth rows describe its launches: a launch_id outside 0..n-1 names none.

    (An incomplete trace may hold truth for launches whose part was never closed.)
    """
    t = trace.truth
    if t is None or not t.num_rows or not trace.complete:
        return
    n = trace.n_launches
    mn, mx = pc.min_max(t.column(LAUNCH_ID)).values()
    if mn.as_py() < 0 or mx.as_py() >= n:
        bad = mn.as_py() if mn.as_py() < 0 else mx.as_py()
        raise TraceError(f"{trace.path / TRUTH}: launch_id {bad} names no launch"
                         f" (the trace has {n} launches{f', ids 0..{n - 1}' if n else ''})")


def _validate_values(trace: Trace) -> None:
    """The values table: refused where a row contradicts itself (data of another length than
    `bytes`); otherwise rows for launches that do not exist and rows whose pointer word lies
    outside their launch's parameters are dropped, and each launch's bytes beyond the limit are
    clipped; what was dropped or clipped is counted in `trace.values_report`, with one warning
    line. (Values outside their allocation are clipped where the allocations are looked up:
    pagecast.values.) Rows come out sorted by launch_id, in their stored order within a launch."""
    t = trace.extra.get(VALUES)
    if t is None:
        return
    where = trace.path / VALUES
    rep = {"rows": t.num_rows, "dropped_no_launch": 0, "dropped_no_pointer": 0, "clipped_bytes": 0,
           "clipped_launches": 0}
    trace.values_report = rep
    if t.num_rows == 0:
        return
    nb = t.column(BYTES).to_numpy().astype(np.int64)
    dl = pc.binary_length(t.column(DATA)).to_numpy(zero_copy_only=False).astype(np.int64)
    if not np.array_equal(nb, dl):
        k = int(np.argmax(nb != dl))
        raise TraceError(f"{where}: row {k} (launch {t.column(LAUNCH_ID)[k].as_py()}) says {nb[k]} bytes"
                         f" but its data holds {dl[k]}")
    lid = t.column(LAUNCH_ID).to_numpy()
    order = np.argsort(lid, kind="stable")
    lid, nb = lid[order], nb[order]
    n = trace.n_launches
    keep = (lid >= 0) & (lid < n)
    rep["dropped_no_launch"] = int((~keep).sum())
    if n:
        plen = pc.binary_length(trace.launches.column(PARAM_DATA)).to_numpy(zero_copy_only=False).astype(np.int64)
        off = t.column(PARAM_OFFSET).to_numpy().astype(np.int64)[order]
        inside = (off >= 0) & (off + 8 <= plen[np.clip(lid, 0, n - 1)])
        rep["dropped_no_pointer"] = int((keep & ~inside).sum())
        keep &= inside
    # each launch's bytes past the limit: rows in their stored order keep what fits
    limit = trace.values_limit
    cum = np.cumsum(np.where(keep, nb, 0))
    first = np.searchsorted(lid, lid, side="left")
    before = np.where(first > 0, cum[np.maximum(first - 1, 0)], 0)
    upto = cum - before                     # the launch's kept bytes up to and including this row
    new_nb = np.where(keep, np.clip(limit - (upto - nb), 0, nb), 0)
    over = keep & (new_nb < nb)
    rep["clipped_bytes"] = int((nb - new_nb)[over].sum())
    rep["clipped_launches"] = int(len(np.unique(lid[over])))
    keep &= new_nb > 0
    t = t.take(pa.array(order))
    if over.any():
        data = t.column(DATA).combine_chunks()
        vals = data.to_pylist() if over.sum() * 4 > len(data) else None
        idx = np.flatnonzero(over)
        if vals is None:   # a few rows: slice just those
            cut = pa.array([data[int(i)].as_py()[:int(new_nb[i])] for i in idx], pa.binary())
            data = pa.concat_arrays([data, cut])
            take = np.arange(len(order))
            take[idx] = len(order) + np.arange(len(idx))
            data = data.take(pa.array(take))
        else:
            for i in idx:
                vals[i] = vals[i][:int(new_nb[i])]
            data = pa.array(vals, pa.binary())
        t = t.set_column(t.schema.get_field_index(DATA), DATA, data)
        t = t.set_column(t.schema.get_field_index(BYTES), BYTES, pa.array(new_nb, _i64))
    if not keep.all():
        t = t.filter(pa.array(keep))
    trace.extra[VALUES] = t
    said = [f"{rep['dropped_no_launch']} rows for launches the trace does not have" if rep["dropped_no_launch"] else "",
            f"{rep['dropped_no_pointer']} rows whose pointer word lies outside the launch's parameters"
            if rep["dropped_no_pointer"] else "",
            f"{rep['clipped_bytes']} bytes past the limit of {limit} per launch (in {rep['clipped_launches']}"
            " launches)" if rep["clipped_bytes"] else ""]
    said = [x for x in said if x]
    if said and (trace.complete or rep["dropped_no_pointer"] or rep["clipped_bytes"]):
        warnings.warn(f"{where}: dropped or clipped " + "; ".join(said), TraceWarning, stacklevel=3)


def _validate_allocations(trace: Trace) -> None:
    t = trace.allocations
    where = trace.path / ALLOCATIONS
    n = t.num_rows
    if n and t.column(LAST_LAUNCH).null_count < n:
        # live for first_launch ..= last_launch: last = first - 1 when no kernel ran in between
        gap = pc.subtract(t.column(FIRST_LAUNCH), pc.fill_null(t.column(LAST_LAUNCH), np.iinfo(np.int64).max // 2))
        if pc.max(gap).as_py() > 1:
            k = int(np.argmax(gap.to_numpy(zero_copy_only=False)))
            raise TraceError(f"{where}: allocation {t.column(ALLOC_ID)[k].as_py()} has last_launch"
                             f" {t.column(LAST_LAUNCH)[k].as_py()} before its first_launch"
                             f" {t.column(FIRST_LAUNCH)[k].as_py()} - 1")
    if n < 2:
        return
    ids = t.column(ALLOC_ID).to_numpy()
    if len(np.unique(ids)) != n:
        raise TraceError(f"{where}: alloc_id values are not unique")
    addr = t.column(ADDRESS).to_numpy().astype(np.uint64)
    size = t.column(BYTES).to_numpy().astype(np.uint64)
    first = t.column(FIRST_LAUNCH).to_numpy()
    last = pc.fill_null(t.column(LAST_LAUNCH), np.iinfo(np.int64).max).to_numpy()
    order = np.argsort(addr, kind="stable")
    a, e, f, l = addr[order], addr[order] + size[order], first[order], last[order]
    # Pairs (i, j), i < j in address order, whose address ranges overlap: j's start < i's end.
    upto = np.searchsorted(a, e, side="left")  # allocations starting before i's end
    counts = np.maximum(upto - np.arange(n) - 1, 0)
    if counts.sum() == 0:
        return
    if counts.sum() > 50_000_000:
        raise TraceError(f"{where}: too many overlapping address ranges to check")
    i = np.repeat(np.arange(n), counts)
    j = i + 1 + (np.arange(len(i)) - np.repeat(np.cumsum(counts) - counts, counts))
    live_overlap = (f[i] <= l[j]) & (f[j] <= l[i])
    if live_overlap.any():
        k = int(np.argmax(live_overlap))
        ai, aj = int(ids[order][i[k]]), int(ids[order][j[k]])
        raise TraceError(f"{where}: allocations {ai} and {aj} overlap in address while both are live")
