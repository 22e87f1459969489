"""Replay results on disk: RESULTS.parquet (one row per run) + RESULTS.timeline.parquet.

`RESULTS.parquet` holds one row per (policy, capacity) run with the fields of
cli.md's `replay --json` (policy, backend, capacity_bytes, oversub, time_s,
stall_s, faults, htod_bytes, dtoh_bytes, speedup_vs_demand) and more
(fraction_of_oracle, lower_bound_s, workload, tasks, costs, ...). The file's schema metadata
marks it (`pagecast.format = pagecast-results`), which is how `is_results`
tells it from other Parquet files. The timeline beside it holds one row per
simulated launch (TIMELINE_SCHEMA), for plots. `read_results` checks both
files' format version, required columns, column types and that the times the
report plots are finite, and refuses others with an InputError (exit 2).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pagecast.errors import InputError, OutputExistsError, shown
from pagecast.outputs import Output, OutputWriteError, remove_path

FORMAT = "pagecast-results"
VERSION = 1
_META_KEY = b"pagecast.format"
_META_VERSION = b"pagecast.version"

# The run table: cli.md's JSON fields first, then extras. Types fixed so that
# readers (reports) can rely on them; unknown extra keys in a run dict are kept.
RUN_SCHEMA = pa.schema([
    ("policy", pa.string()),
    ("backend", pa.string()),
    ("capacity_bytes", pa.int64()),
    ("oversub", pa.float64()),
    ("time_s", pa.float64()),
    ("stall_s", pa.float64()),
    ("faults", pa.int64()),
    ("htod_bytes", pa.int64()),
    ("dtoh_bytes", pa.int64()),
    ("speedup_vs_demand", pa.float64()),
    ("fraction_of_oracle", pa.float64()),
    ("lower_bound_s", pa.float64()),
    ("compute_s", pa.float64()),
    ("prefetch_bytes", pa.int64()),
    ("fault_batches", pa.int64()),
    ("thrashing_launches", pa.int64()),
    ("launches", pa.int64()),
    ("footprint_bytes", pa.int64()),
    ("workload", pa.string()),
    ("tasks", pa.list_(pa.string())),
    ("traces", pa.list_(pa.string())),
    ("costs", pa.string()),
    ("granularity", pa.int64()),
    ("eviction_unit", pa.int64()),
    ("eviction", pa.string()),
    ("driver_prefetch", pa.bool_()),
    ("timeslice_ms", pa.float64()),
    ("model", pa.string()),
    ("plan", pa.string()),
    ("feedback", pa.bool_()),
    ("run", pa.int64()),
])

TIMELINE_SCHEMA = pa.schema([
    ("run", pa.int64()),
    ("policy", pa.string()),
    ("capacity_bytes", pa.int64()),
    ("task", pa.int64()),
    ("task_name", pa.string()),
    ("launch_id", pa.int64()),
    ("kernel", pa.string()),
    ("start_s", pa.float64()),
    ("end_s", pa.float64()),
    ("stall_s", pa.float64()),
    ("faults", pa.int64()),
    ("htod_bytes", pa.int64()),
    ("dtoh_bytes", pa.int64()),
])

RUN_COLUMNS = tuple(RUN_SCHEMA.names)
TIMELINE_COLUMNS = tuple(TIMELINE_SCHEMA.names)


def timeline_path(path: str | Path) -> Path:
    """RESULTS.parquet -> RESULTS.timeline.parquet (beside it)."""
    p = Path(path)
    stem = p.name[:-len(".parquet")] if p.name.endswith(".parquet") else p.name
    return p.with_name(f"{stem}.timeline.parquet")


def runs_table(runs: Iterable[Mapping[str, Any]]) -> pa.Table:
    """Run dicts -> a table with RUN_SCHEMA's columns (missing ones null) plus any extra keys."""
    runs = [dict(r) for r in runs]
    cols: dict[str, list] = {n: [r.get(n) for r in runs] for n in RUN_COLUMNS}
    arrays = [pa.array(cols[f.name], type=f.type) for f in RUN_SCHEMA]
    fields = list(RUN_SCHEMA)
    extra = []
    for r in runs:
        for k in r:
            if k not in cols and k not in extra:
                extra.append(k)
    for k in extra:
        vals = [r.get(k) for r in runs]
        if any(isinstance(v, (dict, list)) for v in vals):
            vals = [None if v is None else json.dumps(v) for v in vals]
        a = pa.array(vals)
        arrays.append(a)
        fields.append(pa.field(k, a.type))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def timeline_table(timeline: pa.Table | Mapping[str, Any] | None) -> pa.Table | None:
    if timeline is None:
        return None
    if isinstance(timeline, pa.Table):
        cols = {n: timeline.column(n) for n in timeline.column_names}
        n = timeline.num_rows
    else:
        cols = dict(timeline)
        n = len(next(iter(cols.values()))) if cols else 0
    arrays = []
    for f in TIMELINE_SCHEMA:
        v = cols.get(f.name)
        if v is None:
            arrays.append(pa.nulls(n, f.type))
        elif isinstance(v, (pa.Array, pa.ChunkedArray)):
            arrays.append(v.cast(f.type))
        else:
            arrays.append(pa.array(v, type=f.type))
    return pa.Table.from_arrays(arrays, schema=TIMELINE_SCHEMA)


def write_results(path: str | Path, runs: Iterable[Mapping[str, Any]] | pa.Table,
                  timeline: pa.Table | Mapping[str, Any] | None = None, force: bool = False) -> Path:
    """Write RESULTS.parquet (and RESULTS.timeline.parquet when a timeline is given)."""
    path = Path(path)
    tl_path = timeline_path(path)
    for p in (path, tl_path):
        if p.exists() and not force:
            raise OutputExistsError(p)
    t = runs if isinstance(runs, pa.Table) else runs_table(runs)
    meta = dict(t.schema.metadata or {})
    meta[_META_KEY] = FORMAT.encode()
    meta[_META_VERSION] = str(VERSION).encode()
    t = t.replace_schema_metadata(meta)
    tl = timeline_table(timeline)
    # both files whole or neither: the timeline first, the results (what readers open) last
    res = Output(path, force=force, example="results.parquet")
    try:
        if tl is not None:
            tl = tl.replace_schema_metadata({_META_KEY: b"pagecast-results-timeline",
                                             _META_VERSION: str(VERSION).encode()})
            with Output(tl_path, force=force, example="results.parquet") as o:
                pq.write_table(tl, o.tmp, compression="zstd")
        pq.write_table(t, res.tmp)
        res.commit()
    except BaseException as e:
        res.abort()
        if tl is not None and not res.committed:
            remove_path(tl_path)   # never a timeline without its results
        if isinstance(e, OSError):
            raise OutputWriteError(path, e) from None
        raise
    if tl is None and tl_path.exists():
        tl_path.unlink()  # never leave a stale timeline beside new results
    return path


def is_results(path: str | Path) -> bool:
    """True when `path` is a RESULTS.parquet written by write_results (of any version)."""
    p = Path(path)
    if not p.is_file():
        return False
    try:
        meta = pq.read_schema(p).metadata or {}
    except Exception:
        return False
    return meta.get(_META_KEY) == FORMAT.encode()


# Columns a reader needs, and those whose values the report plots or prints as numbers (finite where not null).
REQUIRED_RUN_COLUMNS = ("policy", "backend", "capacity_bytes", "oversub", "time_s")
FINITE_RUN_COLUMNS = ("oversub", "time_s", "stall_s", "speedup_vs_demand", "fraction_of_oracle", "lower_bound_s")
FINITE_TIMELINE_COLUMNS = ("start_s", "end_s", "stall_s")
MAX_SECONDS = 1e12   # about 31,700 years: times beyond are not a replay's, and overflow the plots' arithmetic
_TIMELINE_FORMAT = b"pagecast-results-timeline"


def _shown(v: bytes | None) -> str:
    """A metadata value (bytes) for an error line."""
    return "missing" if v is None else shown(v.decode("utf-8", "replace"), 40)


def _type_name(t: pa.DataType) -> str:
    if pa.types.is_integer(t):
        return "integers"
    if pa.types.is_floating(t):
        return "numbers"
    if pa.types.is_string(t):
        return "strings"
    if pa.types.is_boolean(t):
        return "true/false values"
    if pa.types.is_list(t):
        return f"lists of {_type_name(t.value_type)}"
    return str(t)


def _fits(have: pa.DataType, want: pa.DataType) -> bool:
    """Whether a column of type `have` holds what a column of `want` does (so that it casts without surprise)."""
    if pa.types.is_null(have):
        return True
    if pa.types.is_dictionary(have):
        have = have.value_type
    if pa.types.is_integer(want):
        return pa.types.is_integer(have)
    if pa.types.is_floating(want):
        return pa.types.is_integer(have) or pa.types.is_floating(have)
    if pa.types.is_string(want):
        return pa.types.is_string(have) or pa.types.is_large_string(have) or pa.types.is_string_view(have)
    if pa.types.is_boolean(want):
        return pa.types.is_boolean(have)
    if pa.types.is_list(want):
        return ((pa.types.is_list(have) or pa.types.is_large_list(have) or pa.types.is_list_view(have))
                and _fits(have.value_type, want.value_type))
    return have == want


def _checked(where: str, what: str, t: pa.Table, schema: pa.Schema, required, finite) -> pa.Table:
    """`t` with the columns of `schema` it has cast to their types; InputError naming `where` when one
    is missing (of `required`), repeated, of another kind, or not finite (of `finite`)."""
    for name in required:
        if name not in t.column_names:
            raise InputError(f"{where}: {what} without the column {name!r}")
    for f in schema:
        idx = t.schema.get_all_field_indices(f.name)
        if not idx:
            continue
        if len(idx) > 1:
            raise InputError(f"{where}: {what} with {len(idx)} columns named {f.name!r}")
        have = t.schema.field(idx[0]).type
        if not _fits(have, f.type):
            raise InputError(f"{where}: {what} whose column {f.name!r} holds {have}, not {_type_name(f.type)}")
        if have != f.type:
            try:
                t = t.set_column(idx[0], f.name, t.column(idx[0]).cast(f.type))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:   # e.g. a uint64 beyond int64
                msg = str(e).splitlines()[0] if str(e) else type(e).__name__
                raise InputError(f"{where}: {what} whose column {f.name!r} does not fit {f.type} "
                                 f"({msg[:80]})") from None
    for name in finite:
        if name not in t.column_names:
            continue
        v = t.column(name).drop_null().to_numpy()
        bad = ~np.isfinite(v) | (np.abs(v) > MAX_SECONDS if name.endswith("_s") else False)
        if bad.any():
            raise InputError(f"{where}: {what} whose column {name!r} holds {float(v[bad][0])!r}; "
                             + (f"it must be finite, within ±{MAX_SECONDS:g} s" if name.endswith("_s")
                                else "it must be finite"))
    return t


def _read_parquet(p: Path) -> pa.Table:
    try:
        return pq.read_table(p)
    except Exception as e:  # pyarrow raises several kinds for a damaged file
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputError(f"{p}: unreadable Parquet ({msg})") from None


def _check_version(p: Path, meta: Mapping[bytes, bytes], what: str) -> None:
    ver = meta.get(_META_VERSION)
    if ver != str(VERSION).encode():
        raise InputError(f"{p}: {what} version is {_shown(ver)}; this pagecast reads version {VERSION}")


def read_results(path: str | Path) -> tuple[pa.Table, pa.Table | None]:
    """(runs, timeline or None); InputError when `path` is not replay results, or it or its timeline is
    malformed. Known columns come back with RUN_SCHEMA's / TIMELINE_SCHEMA's types."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such results file")
    if not is_results(p):
        raise InputError(f"{p}: not pagecast replay results (write them with 'pagecast replay ... -o FILE.parquet')")
    runs = _read_parquet(p)
    _check_version(p, runs.schema.metadata or {}, "results")
    runs = _checked(str(p), "replay results", runs, RUN_SCHEMA, REQUIRED_RUN_COLUMNS, FINITE_RUN_COLUMNS)
    if runs.column("policy").null_count:
        raise InputError(f"{p}: replay results with runs that name no policy")
    tl_path = timeline_path(p)
    if not tl_path.exists():
        return runs, None
    if not tl_path.is_file():
        raise InputError(f"{tl_path}: the timeline beside {p.name} is not a file")
    timeline = _read_parquet(tl_path)
    meta = timeline.schema.metadata or {}
    if meta.get(_META_KEY) != _TIMELINE_FORMAT:
        raise InputError(f"{tl_path}: not the timeline of replay results (its format is {_shown(meta.get(_META_KEY))}, "
                         f"not {_TIMELINE_FORMAT.decode()!r}); remove it or write the results again")
    _check_version(tl_path, meta, "timeline")
    timeline = _checked(str(tl_path), "timeline", timeline, TIMELINE_SCHEMA, TIMELINE_COLUMNS,
                        FINITE_TIMELINE_COLUMNS)
    return runs, timeline
