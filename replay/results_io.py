"""Replay results on disk: RESULTS.parquet (one row per run) + RESULTS.timeline.parquet.

`RESULTS.parquet` holds one row per (policy, capacity) run with the fields of
cli.md's `replay --json` (policy, backend, capacity_bytes, oversub, time_s,
stall_s, faults, htod_bytes, dtoh_bytes, speedup_vs_demand) and more
(fraction_of_oracle, workload, tasks, costs, ...). The file's schema metadata
marks it (`pagecast.format = pagecast-results`), which is how `is_results`
tells it from other Parquet files. The timeline beside it holds one row per
simulated launch (TIMELINE_SCHEMA), for plots.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Mapping

import pyarrow as pa
import pyarrow.parquet as pq

from pagecast.errors import InputError, OutputExistsError

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
    if path.parent and not path.parent.exists():
        path.parent.mkdir(parents=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(t, tmp)
    tmp.replace(path)
    tl = timeline_table(timeline)
    if tl is not None:
        tl = tl.replace_schema_metadata({_META_KEY: b"pagecast-results-timeline", _META_VERSION: str(VERSION).encode()})
        tmp = tl_path.with_name(f".{tl_path.name}.tmp")
        pq.write_table(tl, tmp, compression="zstd")
        tmp.replace(tl_path)
    elif tl_path.exists():
        tl_path.unlink()  # never leave a stale timeline beside new results
    return path


def is_results(path: str | Path) -> bool:
    """True when `path` is a RESULTS.parquet written by write_results."""
    p = Path(path)
    if not p.is_file():
        return False
    try:
        meta = pq.read_schema(p).metadata or {}
    except Exception:
        return False
    return meta.get(_META_KEY) == FORMAT.encode()


def read_results(path: str | Path) -> tuple[pa.Table, pa.Table | None]:
    """(runs, timeline or None); InputError when `path` is not replay results."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such results file")
    if not is_results(p):
        raise InputError(f"{p}: not pagecast replay results (write them with 'pagecast replay ... -o FILE.parquet')")
    try:
        runs = pq.read_table(p)
    except Exception as e:  # pyarrow raises several kinds for a damaged file
        raise InputError(f"{p}: unreadable Parquet ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    for name in ("policy", "backend", "capacity_bytes", "oversub", "time_s"):
        if name not in runs.column_names:
            raise InputError(f"{p}: replay results without the column {name!r}")
    if runs.column("policy").null_count:
        raise InputError(f"{p}: replay results with runs that name no policy")
    tl_path = timeline_path(p)
    timeline = pq.read_table(tl_path) if tl_path.exists() else None
    return runs, timeline
