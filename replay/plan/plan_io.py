"""Prefetch plans on disk: a directory with `plan.parquet` and `manifest.json`.

plan.parquet, one row per transfer, in the order a runner issues them:

| column | type | meaning |
|---|---|---|
| launch_id | int64 | issue this transfer before that launch (it may overlap the launch before) |
| action | string | `prefetch` (host to device) or `evict` (device to host) |
| address | uint64 | first byte of the range |
| bytes | int64 | length of the range (> 0) |
| order | int64 | position among the transfers of the same launch_id (evictions first) |
| needed_by | int64 | for a prefetch, the launch that first needs it (>= launch_id); for an evict, -1 |
| after_launch | int64 | for a prefetch of pages that index values chose, the launch that writes those values: the transfer starts only once that launch has ended and the values are read (< launch_id); else -1 (a plan without the column: -1) |

launches.parquet (optional), the plan's lookahead per launch, as its planner derived it: one row per
launch that has any of these set (a launch not listed has none of them), sorted by launch_id:

| column | type | meaning |
|---|---|---|
| launch_id | int64 | the launch |
| wait_prev | bool | its evictions take data the launch before uses: they start once that launch has ended |
| waits_for | int64 | the latest earlier launch whose transfers hold data this one needs (-1: none; < launch_id) |
| gate_bytes | int64 | bytes of index values copied to the host before its value-chosen prefetches start (>= 0) |

A runner reads both files through one function (online/planned.schedule_from_plan). A plan written
before launches.parquet existed lacks it: that function derives the lookahead from the rows and
the trace (docs/plan-format.md).

manifest.json: format `pagecast-plan`, version, the model (path), the trace
(path, `Trace.launch_fingerprint()`, launches), capacity_bytes, page_size,
granularity, the span the planner chose (`unit`: the predicted units; `block`: widened
to whole 2 MiB VA blocks; `fitted`: widened to whole blocks where its block plan says
widening pays, plan/fitted.py; `allocation`: with the whole allocations the launch points
into added; absent means `unit`), and the planner's counts (`faulted`: prefetches the
plan's predictions name that it leaves to faults, plan/faults.py), and `host_ranges` where the
plan leaves memory on the host (`pagecast plan --placement auto`: [[start, end], ...], byte
addresses of the trace's allocations, sorted and disjoint; absent: none; replay/placement.py).
`read_plan(path, trace)` refuses a plan whose fingerprint does not match the trace (PlanError, one line).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pagecast import PRODUCER
from pagecast.errors import PlanError, UsageError
from pagecast.jsonfile import read_json, write_json_atomic
from pagecast.outputs import Output
from pagecast.units import format_size
from pagecast.trace import PAGE_SIZE_MAX, PAGE_SIZE_MIN, ranges_wrap

from ..placement import HostRanges

FORMAT = "pagecast-plan"
VERSION = 1
MANIFEST = "manifest.json"
TABLE = "plan.parquet"
LAUNCHES = "launches.parquet"   # optional: the lookahead per launch (the module doc)
PREFETCH, EVICT = "prefetch", "evict"
ACTIONS = (PREFETCH, EVICT)
SPANS = ("unit", "block", "fitted", "allocation")   # what the planner widened the predictions to (plan/spans.py)

LAUNCH_ID, ACTION, ADDRESS, BYTES, ORDER, NEEDED_BY = "launch_id", "action", "address", "bytes", "order", "needed_by"
AFTER_LAUNCH = "after_launch"
HOST_RANGES = "host_ranges"   # manifest: byte ranges the plan leaves on the host (placement.py)
SCHEMA = pa.schema([
    (LAUNCH_ID, pa.int64()), (ACTION, pa.string()), (ADDRESS, pa.uint64()), (BYTES, pa.int64()),
    (ORDER, pa.int64()), (NEEDED_BY, pa.int64()), (AFTER_LAUNCH, pa.int64()),
])
OPTIONAL = {AFTER_LAUNCH: -1}   # columns a plan written before them lacks, and what they then hold
WAIT_PREV, WAITS_FOR, GATE_BYTES = "wait_prev", "waits_for", "gate_bytes"
LAUNCH_SCHEMA = pa.schema([(LAUNCH_ID, pa.int64()), (WAIT_PREV, pa.bool_()), (WAITS_FOR, pa.int64()),
                           (GATE_BYTES, pa.int64())])


@dataclass
class Plan:
    table: pa.Table     # SCHEMA, sorted by (launch_id, order)
    manifest: dict
    path: Path | None = None
    launches: pa.Table | None = None   # LAUNCH_SCHEMA (launches.parquet); None: a plan written without it

    def save(self, path: str | Path, force: bool = False) -> Path:
        """Write this plan (its rows, lookahead and manifest) as a plan directory (write_plan)."""
        return write_plan(path, self.table, self.manifest, force=force, launches=self.launches)

    @property
    def capacity_bytes(self) -> int:
        return int(self.manifest["capacity_bytes"])

    @property
    def granularity(self) -> int:
        return int(self.manifest.get("granularity") or self.manifest["page_size"])

    def columns(self) -> dict[str, np.ndarray]:
        t = self.table
        return {LAUNCH_ID: t.column(LAUNCH_ID).to_numpy(), ADDRESS: t.column(ADDRESS).to_numpy(),
                BYTES: t.column(BYTES).to_numpy(), ORDER: t.column(ORDER).to_numpy(),
                NEEDED_BY: t.column(NEEDED_BY).to_numpy(), AFTER_LAUNCH: t.column(AFTER_LAUNCH).to_numpy(),
                ACTION: (t.column(ACTION).to_numpy(zero_copy_only=False) == EVICT)}


def new_manifest(*, trace, capacity_bytes: int, granularity: int, model: str | None,
                 **extra: Any) -> dict:
    m = {
        "format": FORMAT, "version": VERSION,
        "model": None if model is None else str(model),
        "trace": {"path": str(trace.path), "fingerprint": trace.launch_fingerprint(),
                  "launches": int(trace.n_launches), "workload": trace.name},
        "capacity_bytes": int(capacity_bytes),
        "page_size": int(trace.page_size),
        "granularity": int(granularity),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "producer": PRODUCER,
    }
    m.update(extra)
    return m


def write_plan(path: str | Path, table: pa.Table | dict, manifest: dict, force: bool = False,
               launches: pa.Table | None = None) -> Path:
    """Write a plan directory (refuses an existing output without force); `launches`: the plan's
    lookahead per launch (LAUNCH_SCHEMA: launches.parquet; None: not written)."""
    path = Path(path)
    t = table if isinstance(table, pa.Table) else pa.table(table)
    arrays = []
    for f in SCHEMA:
        if f.name in t.column_names:
            col = t.column(f.name)
        elif f.name in OPTIONAL:
            col = pa.array(np.full(t.num_rows, OPTIONAL[f.name], np.int64))
        else:
            col = pa.nulls(t.num_rows, f.type)
        arrays.append(col.cast(f.type))
    t = pa.Table.from_arrays(arrays, schema=SCHEMA)
    if manifest.get("format") != FORMAT:
        raise ValueError("plan manifest must come from plan_io.new_manifest")
    manifest = dict(manifest)
    manifest["rows"] = int(t.num_rows)
    with Output(path, force=force, directory=True, owned=_owned_plan_dir) as o:
        pq.write_table(t, o.tmp / TABLE, compression="zstd")
        if launches is not None:
            pq.write_table(launches.select(LAUNCH_SCHEMA.names).cast(LAUNCH_SCHEMA), o.tmp / LAUNCHES,
                           compression="zstd")
        write_json_atomic(o.tmp / MANIFEST, manifest)
    return path


def _owned_plan_dir(path: Path) -> bool:
    """Whether --force may replace directory `path`: a plan, or what an interrupted `plan` of an
    earlier pagecast left (its table and manifest file names only)."""
    try:
        return is_plan(path) or {e.name for e in path.iterdir()} <= {TABLE, LAUNCHES, MANIFEST, f".{MANIFEST}.tmp"}
    except OSError:
        return False


def is_plan(path: str | Path) -> bool:
    try:
        m = json.loads((Path(path) / MANIFEST).read_text())
        return isinstance(m, dict) and m.get("format") == FORMAT
    except (OSError, ValueError):
        return False


def read_plan(path: str | Path, trace=None) -> Plan:
    """Read and check a plan; with `trace`, refuse a plan made for another launch sequence."""
    path = Path(path)
    if not path.exists():
        raise PlanError(f"{path}: no such plan")
    mpath = path / MANIFEST
    if not path.is_dir() or not mpath.exists():
        raise PlanError(f"{path}: not a plan (a plan is a directory with {MANIFEST} and {TABLE};"
                        " make one with 'pagecast plan')")
    m = read_json(mpath, PlanError)
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise PlanError(f"{mpath}: format is {m.get('format') if isinstance(m, dict) else None!r};"
                        f" expected {FORMAT!r}")
    if type(m.get("version")) is not int or m.get("version") != VERSION:  # true and 1.0 are not 1
        raise PlanError(f"{mpath}: version is {m.get('version')!r}; this pagecast reads plan version {VERSION}")
    for k in ("trace", "capacity_bytes", "page_size", "granularity"):
        if k not in m:
            raise PlanError(f"{mpath}: missing field {k!r}")
    if not isinstance(m["trace"], dict) or "fingerprint" not in m["trace"]:
        raise PlanError(f"{mpath}: field 'trace' must name the trace's fingerprint")

    def positive_int(k: str) -> int:
        v = m[k]
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise PlanError(f"{mpath}: field {k!r} must be an integer > 0, found {v!r}")
        return v
    ps = positive_int("page_size")
    if ps & (ps - 1):
        raise PlanError(f"{mpath}: field 'page_size' must be a power of two, found {ps}")
    if not PAGE_SIZE_MIN <= ps <= PAGE_SIZE_MAX:
        raise PlanError(f"{mpath}: field 'page_size' must be from {PAGE_SIZE_MIN} to {PAGE_SIZE_MAX}, found {ps}")
    cap = positive_int("capacity_bytes")
    if m["granularity"] is not None and positive_int("granularity") % ps:
        raise PlanError(f"{mpath}: field 'granularity' must be a multiple of the page size {ps},"
                        f" found {m['granularity']}")
    if m["granularity"] is not None and m["granularity"] > 1 << 30:
        raise PlanError(f"{mpath}: field 'granularity' must be at most 1 GiB, found {m['granularity']}")
    n = m["trace"].get("launches")
    if type(n) is not int or n < 0:
        raise PlanError(f"{mpath}: field 'trace' must give the trace's number of launches, found {n!r}")
    if m.get("span", "unit") not in SPANS:
        raise PlanError(f"{mpath}: field 'span' must be one of {', '.join(SPANS)}, found {m.get('span')!r}")
    _check_host_ranges(m.get(HOST_RANGES, []), mpath)
    if trace is not None:
        fp = trace.launch_fingerprint()
        if m["trace"]["fingerprint"] != fp:
            raise PlanError(f"{path}: plan was made for another trace ({m['trace'].get('path')},"
                            f" {m['trace'].get('launches')} launches), not {trace.path}"
                            f" ({trace.n_launches} launches); make one with"
                            f" 'pagecast plan MODEL {trace.path} ...'")
        if ps != trace.page_size:
            raise PlanError(f"{mpath}: page_size {ps} is not the trace's ({trace.page_size})")
    tpath = path / TABLE
    if not tpath.is_file():
        raise PlanError(f"{tpath}: missing; {path} is not a whole plan (make one with 'pagecast plan')")
    try:
        t = pq.read_table(tpath)
    except Exception as e:
        raise PlanError(f"{tpath}: unreadable ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    for f in SCHEMA:
        if f.name not in t.column_names and f.name in OPTIONAL:
            t = t.append_column(f.name, pa.array(np.full(t.num_rows, OPTIONAL[f.name], np.int64)))
        if f.name not in t.column_names:
            raise PlanError(f"{tpath}: column {f.name!r} is missing")
        if t.column(f.name).null_count:
            raise PlanError(f"{tpath}: column {f.name!r} has {t.column(f.name).null_count} null values;"
                            " it may not be null")
    try:
        t = pa.Table.from_arrays([t.column(f.name).cast(f.type) for f in SCHEMA], schema=SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise PlanError(f"{tpath}: {str(e).splitlines()[0]}") from None
    if t.num_rows:
        acts = set(t.column(ACTION).unique().to_pylist())
        if not acts <= set(ACTIONS):
            raise PlanError(f"{tpath}: column 'action' has unknown values {sorted(map(str, acts - set(ACTIONS)))};"
                            f" expected prefetch or evict")
        b = t.column(BYTES).to_numpy()
        if (b <= 0).any():
            raise PlanError(f"{tpath}: column 'bytes' must be > 0")
        if (b > cap).any():   # a plan never moves more than the capacity at once
            raise PlanError(f"{tpath}: column 'bytes' holds a transfer larger than the capacity ({cap} bytes)")
        if ranges_wrap(t.column(ADDRESS).to_numpy(), b):
            raise PlanError(f"{tpath}: a range runs past the end of the address space")
        lid = t.column(LAUNCH_ID).to_numpy()
        if lid.min() < 0 or lid.max() >= n or (trace is not None and lid.max() >= trace.n_launches):
            raise PlanError(f"{tpath}: launch_id outside 0..{n - 1}")
        aft = t.column(AFTER_LAUNCH).to_numpy()
        if ((aft < -1) | (aft >= lid)).any():
            k = int(np.argmax((aft < -1) | (aft >= lid)))
            raise PlanError(f"{tpath}: row {k}: after_launch {aft[k]} is not an earlier launch than its launch_id"
                            f" {lid[k]} (nor -1)")
        order = np.lexsort((t.column(ORDER).to_numpy(), lid))
        if not np.array_equal(order, np.arange(len(order))):
            t = t.take(pa.array(order))
    return Plan(t, m, path, _read_launches(path / LAUNCHES, n))


def _read_launches(lpath: Path, n: int) -> pa.Table | None:
    """launches.parquet, checked (PlanError, one line); None where the plan has none."""
    if not lpath.exists():
        return None
    try:
        t = pq.read_table(lpath)
    except Exception as e:
        raise PlanError(f"{lpath}: unreadable ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    for f in LAUNCH_SCHEMA:
        if f.name not in t.column_names:
            raise PlanError(f"{lpath}: column {f.name!r} is missing")
        if t.column(f.name).null_count:
            raise PlanError(f"{lpath}: column {f.name!r} has {t.column(f.name).null_count} null values;"
                            " it may not be null")
    try:
        t = pa.Table.from_arrays([t.column(f.name).cast(f.type) for f in LAUNCH_SCHEMA], schema=LAUNCH_SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise PlanError(f"{lpath}: {str(e).splitlines()[0]}") from None
    lid = t.column(LAUNCH_ID).to_numpy()
    if len(lid) and (lid.min() < 0 or lid.max() >= n):
        raise PlanError(f"{lpath}: launch_id outside 0..{n - 1}")
    if (np.diff(lid) <= 0).any():
        raise PlanError(f"{lpath}: launch_id must be sorted, each launch once")
    wf = t.column(WAITS_FOR).to_numpy()
    if ((wf < -1) | (wf >= lid)).any():
        k = int(np.argmax((wf < -1) | (wf >= lid)))
        raise PlanError(f"{lpath}: row {k}: waits_for {wf[k]} is not an earlier launch than its launch_id"
                        f" {lid[k]} (nor -1)")
    if (t.column(GATE_BYTES).to_numpy() < 0).any():
        raise PlanError(f"{lpath}: column 'gate_bytes' must be >= 0")
    return t


def check_plan_capacity(plan: Plan, plan_path, caps: list[tuple[int, float | None]], by_oversub: bool) -> None:
    """A plan holds the transfers for one capacity: replayed at another, template would follow a
    schedule made for memory it does not have (or leave idle memory it has), and its speedup
    would mean nothing. Refused in one line naming both (`caps`: the run's capacities in bytes, each
    with the --oversub ratio that gave it; by_oversub: they came from --oversub). Both backends ask it."""
    own = int(plan.capacity_bytes)
    r_own = plan.manifest.get("oversub")
    for c, r in caps:
        if c != own:
            asked = f"--oversub {r:g} gives {format_size(c)}" if by_oversub else f"--capacity {format_size(c)}"
            made = f"{format_size(own)}" + (f" (--oversub {r_own:g})" if isinstance(r_own, (int, float)) else "")
            raise UsageError(f"{plan_path} was planned for a capacity of {made}, but {asked}: replay it at"
                             f" --capacity {own}, or make a plan at this capacity with 'pagecast plan'")


def _check_host_ranges(v, mpath: Path) -> None:
    """The manifest's host_ranges: a list of [start, end] integer pairs, 0 <= start < end < 2^63,
    sorted and disjoint (PlanError naming the first that is not)."""
    if not isinstance(v, list):
        raise PlanError(f"{mpath}: field {HOST_RANGES!r} must be a list of [start, end] byte ranges")
    prev = -1
    for k, r in enumerate(v):
        ok = (isinstance(r, list) and len(r) == 2 and all(type(x) is int for x in r)
              and 0 <= r[0] < r[1] <= (1 << 63) - 1)
        if not ok:
            raise PlanError(f"{mpath}: field {HOST_RANGES!r}: entry {k} must be [start, end] with"
                            f" 0 <= start < end < 2^63, found {r!r}"[:300])
        if r[0] < prev:
            raise PlanError(f"{mpath}: field {HOST_RANGES!r}: entry {k} overlaps or precedes the one before")
        prev = r[1]


def host_ranges(plan: Plan):
    """The byte ranges `plan` leaves on the host (placement.HostRanges; none where its manifest names none)."""
    v = plan.manifest.get(HOST_RANGES) or []
    return HostRanges(np.array([a for a, _ in v], np.int64), np.array([b for _, b in v], np.int64))
