"""`pagecast import nsys`: an Nsight Systems export -> a trace (docs/import-nsys.md).

What each trace table is made of:

- launches <- CUPTI_ACTIVITY_KIND_KERNEL: start, end, device, stream, grid,
  block, dynamic shared memory and the name through StringIds (mangled where
  the export has it). Nsight records no kernel arguments: the launches carry no
  parameter bytes, and the manifest says `argument_bytes: false`, so `fit`,
  `predict`, `evaluate`, `plan` and the policies that read arguments refuse the
  trace in one line. Launch order is the correlation id's (assigned in host API
  call order), or the start time where that does not order them.
- faults <- CUDA_UM_GPU_PAGE_FAULT_EVENTS, launch_id null: readers attribute
  them by time, as the trace format allows.
- migrations <- the unified-memory rows of CUPTI_ACTIVITY_KIND_MEMCPY (copy
  kinds 11/12/13), migrationCause mapped to the trace format's causes.
- allocations <- CUDA_GPU_MEMORY_USAGE_EVENTS where the export has managed
  allocations in it; otherwise inferred from the ranges faults and migrations
  touch (same or adjacent 2 MiB VA blocks form one allocation), marked
  `allocations_inferred: true` in the manifest.

Everything is columnar (pyarrow / numpy): no Python loop per record.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pagecast import trace as T
from pagecast.errors import InputError, TraceError
from pagecast.uvm import VA_BLOCK  # the unit inferred allocations grow by (docs/uvm-facts.md)

from . import nsys_export as X
from .convert import ACCESS_OF_FLAGS, CAUSE_OF_FLAGS

I64 = np.int64

# CUPTI_ACTIVITY_KIND_MEMCPY copyKind values of unified-memory migrations (docs/import-nsys.md)
UM_COPY_KINDS = {11: "htod", 12: "dtoh", 13: "dtod"}
# ENUM_CUDA_MEM_KIND ids when the export lacks the enum table (docs/import-nsys.md)
MEM_KIND_DEFAULT = {1: "host", 2: "device", 4: "managed", 5: "device", 6: "managed"}
MEM_KIND_SUFFIX = (("MANAGED_STATIC", "managed"), ("DEVICE_STATIC", "device"), ("MANAGED", "managed"),
                   ("DEVICE", "device"), ("PINNED", "host"))
MEM_OP_ALLOC, MEM_OP_FREE = 0, 1   # memoryOperationType (ENUM_CUDA_DEV_MEM_EVENT_OPER)

KERNEL_COLUMNS = ["start", "end", "deviceId", "streamId", "correlationId", "globalPid", "gridX", "gridY", "gridZ",
                  "blockX", "blockY", "blockZ", "dynamicSharedMemory", "mangledName", "demangledName", "shortName"]
FAULT_COLUMNS = ["start", "address", "numberOfPageFaults", "faultAccessType", "deviceId"]
MEMCPY_COLUMNS = ["start", "end", "bytes", "copyKind", "virtualAddress", "migrationCause"]
MEMORY_COLUMNS = ["start", "address", "bytes", "memKind", "memoryOperationType", "deviceId"]


@dataclass
class NsysImportConfig:
    report: Path
    output: Path
    force: bool = False
    page_size: int = 4096      # x86-64 UVM pages (trace-format.md)


@dataclass
class NsysImportResult:
    path: Path
    counts: dict[str, int]
    allocations_inferred: bool
    schema_version: str
    notes: list[str] = field(default_factory=list)


def import_nsys(cfg: NsysImportConfig, progress=None) -> NsysImportResult:
    """Convert the export at cfg.report into a trace at cfg.output (InputError on bad input).

    The trace is read back (validated) before returning: an export whose allocations
    could not make a valid trace (live ranges overlapping in address) is refused and
    the output removed."""
    exp = X.open_export(cfg.report)
    try:
        res = _convert(exp, cfg, progress)
    except (ValueError, TypeError, OverflowError, pa.ArrowException) as e:
        # values no nsys export holds (text in an integer column, a damaged page read as data)
        raise InputError(f"{cfg.report}: unexpected values in the export ({X._first_line(e)})") from None
    finally:
        exp.close()
    try:
        T.read_trace(res.path, tables=[T.LAUNCHES, T.ALLOCATIONS])
    except TraceError as e:
        shutil.rmtree(res.path, ignore_errors=True)
        raise InputError(f"{cfg.report}: the export does not make a valid trace ({e})") from None
    return res


def _convert(exp: X.NsysExport, cfg: NsysImportConfig, progress) -> NsysImportResult:
    p = exp.path
    if not exp.has(X.KERNEL):
        raise InputError(f"{p}: no {X.KERNEL} table: no kernel ran, or CUDA was not traced"
                         " (nsys profile --trace=cuda)")
    if not exp.has(X.GPU_FAULTS):
        raise InputError(f"{p}: no {X.GPU_FAULTS} table: the report holds no unified-memory page faults;"
                         f" profile with 'nsys profile {X.FAULT_FLAG}' (and {X.MEMORY_FLAG} for allocations)")
    for tbl in (X.KERNEL, X.GPU_FAULTS):
        missing = [c for c in ("start", "address" if tbl == X.GPU_FAULTS else "end") if c not in exp.columns(tbl)]
        if missing:
            raise InputError(f"{p}: table {tbl} has no column {missing[0]}; not the documented nsys schema")
    if progress is not None:
        total = sum(exp.count(t) for t in (X.KERNEL, X.GPU_FAULTS, X.MEMCPY, X.MEMORY_USAGE, X.STRINGS))
        progress.update(total=total, description="reading the export")
    notes: list[str] = []
    strings = exp.read(X.STRINGS, ["id", "value"], progress)
    launches, issue_ns = _launches(exp, strings, progress, notes)
    if launches.num_rows == 0:
        raise InputError(f"{p}: {X.KERNEL} holds no kernels; nothing to import")
    ps = cfg.page_size
    faults = _faults(exp, ps, progress)
    migrations = _migrations(exp, progress, notes)
    allocations, inferred = _allocations(exp, faults, migrations, issue_ns, ps, progress, notes)
    manifest = T.new_manifest(
        page_size=ps, mode="natural", source="nsys",
        workload={"name": _workload_name(p), "argv": None},
        device=_device(exp, launches),
        driver_prefetch=None, argument_bytes=False, allocations_inferred=inferred,
        nsys={"report": str(p), "export": exp.kind, "schema_version": exp.schema_version,
              "product_version": exp.product_version,
              "allocations": "inferred from faults and migrations (2 MiB VA blocks)" if inferred
              else "CUDA_GPU_MEMORY_USAGE_EVENTS"})
    if progress is not None:
        progress.update(description=f"writing {cfg.output}")
    T.write_trace(cfg.output, manifest, {T.LAUNCHES: launches, T.ALLOCATIONS: allocations, T.FAULTS: faults,
                                         T.MIGRATIONS: migrations}, force=cfg.force)
    counts = {"launches": launches.num_rows, "fault_records": faults.num_rows,
              "faults": int(pc.sum(faults.column(T.COUNT)).as_py() or 0), "migrations": migrations.num_rows,
              "allocations": allocations.num_rows}
    return NsysImportResult(Path(cfg.output), counts, inferred, exp.schema_version, notes)


# ---- columns ----------------------------------------------------------------------

def _int(t: pa.Table, name: str, default: int = 0) -> np.ndarray:
    """An integer column as int64 (nulls and a missing column -> default)."""
    if name not in t.column_names:
        return np.full(t.num_rows, default, I64)
    c = t.column(name)
    if c.null_count:
        c = pc.fill_null(c, default)
    a = c.to_numpy()
    return a.view(I64) if a.dtype == np.uint64 else a.astype(I64, copy=False)


def _u64(t: pa.Table, name: str) -> np.ndarray:
    """An address column as uint64 (SQLite stores uint64 addresses as signed integers)."""
    return _int(t, name).view(np.uint64)


def _lookup(codes: np.ndarray, table: dict[int, str], default: str) -> pa.Array:
    """Enumeration codes -> strings, vectorized."""
    hi = max(table) + 1
    labels = pa.array([table.get(i, default) for i in range(hi)] + [default])
    idx = np.where((codes >= 0) & (codes < hi), codes, hi)
    return labels.take(pa.array(idx))


# ---- launches ---------------------------------------------------------------------

def _names(k: pa.Table, strings: pa.Table) -> pa.Array:
    """Kernel names through StringIds: mangled where present, else demangled, else short."""
    n = k.num_rows
    if strings.num_rows == 0 or "id" not in strings.column_names:
        return pa.array(np.full(n, "unknown", object), pa.string())
    ids, values = strings.column("id"), strings.column("value").cast(pa.string())
    out = pa.nulls(n, pa.string())
    for col in ("shortName", "demangledName", "mangledName"):   # later columns take precedence
        if col not in k.column_names:
            continue
        idx = pc.index_in(k.column(col), value_set=ids)
        name = pc.take(values, idx)
        good = pc.and_kleene(pc.is_valid(name), pc.greater(pc.utf8_length(pc.fill_null(name, "")), 0))
        out = pc.if_else(good, name, out)
    return pc.fill_null(out, "unknown").combine_chunks() if isinstance(out, pa.ChunkedArray) else \
        pc.fill_null(out, "unknown")


def _launches(exp: X.NsysExport, strings: pa.Table, progress, notes: list[str]) -> tuple[pa.Table, np.ndarray]:
    k = exp.read(X.KERNEL, KERNEL_COLUMNS, progress)
    n = k.num_rows
    start, end = _int(k, "start"), _int(k, "end")
    corr = _int(k, "correlationId", -1)
    pids = np.unique(_int(k, "globalPid")) if "globalPid" in k.column_names else np.zeros(1, I64)
    by_corr = ("correlationId" in k.column_names and len(pids) == 1 and (corr > 0).all()
               and len(np.unique(corr)) == n)
    order = np.lexsort((start, corr)) if by_corr else np.argsort(start, kind="stable")
    if len(pids) > 1:
        notes.append(f"{len(pids)} processes' kernels, ordered by start time (correlation ids are per process)")
    names = _names(k, strings)
    cols = {T.LAUNCH_ID: np.arange(n, dtype=I64), T.KERNEL: names.take(pa.array(order)),
            T.DEVICE: _int(k, "deviceId")[order].astype(np.int32), T.STREAM: _int(k, "streamId")[order],
            T.SHARED_MEM_BYTES: np.clip(_int(k, "dynamicSharedMemory")[order], 0, 2**31 - 1).astype(np.int32),
            T.START_NS: start[order], T.END_NS: np.maximum(end, start)[order]}
    for c, src in zip(T.GRID_COLUMNS, ("gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ")):
        # a zero dimension means "not reported"; the format wants >= 1
        cols[c] = np.clip(_int(k, src, 1)[order], 1, 2**31 - 1).astype(np.int32)
    zeros = pa.array(np.zeros(n, I64))
    cols[T.PARAM_OFFSETS] = pa.array([[]], pa.list_(pa.int32())).take(zeros)
    cols[T.PARAM_SIZES] = pa.array([[]], pa.list_(pa.int32())).take(zeros)
    cols[T.PARAM_DATA] = pa.array([b""], pa.binary()).take(zeros)
    issue = _issue_times(exp, k, start)[order]
    return T.to_table(T.LAUNCHES, cols), issue


def _issue_times(exp: X.NsysExport, k: pa.Table, start: np.ndarray) -> np.ndarray:
    """When each kernel was launched on the host: its runtime API call's start (joined on the
    correlation id, and the process where both tables name it), else the kernel's own start."""
    if not exp.has(X.RUNTIME) or "correlationId" not in k.column_names:
        return start
    rcols = exp.columns(X.RUNTIME)
    if "correlationId" not in rcols or "start" not in rcols:
        return start
    keys = ["correlationId"] + (["globalPid"] if "globalPid" in rcols and "globalPid" in k.column_names else [])
    r = exp.read(X.RUNTIME, keys + ["start"])
    r = r.rename_columns(keys + ["api_start"]).group_by(keys).aggregate([("api_start", "min")])
    left = pa.table({**{c: k.column(c) for c in keys}, "row": pa.array(np.arange(k.num_rows, dtype=I64))})
    j = left.join(r, keys=keys, join_type="left outer")
    rows = j.column("row").to_numpy()
    api = pc.fill_null(j.column("api_start_min"), -1).to_numpy().astype(I64)
    out = start.copy()
    ok = (api >= 0) & (api <= start[rows])
    out[rows[ok]] = api[ok]
    return out


# ---- faults and migrations ---------------------------------------------------------

def _faults(exp: X.NsysExport, ps: int, progress) -> pa.Table:
    f = exp.read(X.GPU_FAULTS, FAULT_COLUMNS, progress)
    addr = _u64(f, "address")
    order = np.argsort(_int(f, "start"), kind="stable")
    return T.to_table(T.FAULTS, {
        T.TIME_NS: _int(f, "start")[order],
        T.ADDRESS: (addr - addr % np.uint64(ps))[order],
        T.COUNT: np.clip(_int(f, "numberOfPageFaults", 1), 1, 2**31 - 1).astype(np.int32)[order],
        T.ACCESS: _lookup(_int(f, "faultAccessType")[order], ACCESS_OF_FLAGS, "unknown"),
        T.DEVICE: _int(f, "deviceId")[order].astype(np.int32),
    })


def _migrations(exp: X.NsysExport, progress, notes: list[str]) -> pa.Table:
    if not exp.has(X.MEMCPY):
        return T.SCHEMAS[T.MIGRATIONS].empty_table()
    cols = exp.columns(X.MEMCPY)
    for c in ("copyKind", "virtualAddress", "bytes", "start"):
        if c not in cols:
            notes.append(f"{X.MEMCPY} has no {c} column: no migrations imported")
            return T.SCHEMAS[T.MIGRATIONS].empty_table()
    m = exp.read(X.MEMCPY, MEMCPY_COLUMNS, progress, where=("copyKind", tuple(UM_COPY_KINDS)))
    nb = _int(m, "bytes")
    keep = np.flatnonzero(nb > 0)
    keep = keep[np.argsort(_int(m, "start")[keep], kind="stable")]
    start = _int(m, "start")[keep]
    if "migrationCause" not in m.column_names:
        notes.append(f"{X.MEMCPY} has no migrationCause column: migration causes are unknown")
    return T.to_table(T.MIGRATIONS, {
        T.START_NS: start, T.END_NS: np.maximum(_int(m, "end")[keep], start),
        T.ADDRESS: _u64(m, "virtualAddress")[keep], T.BYTES: nb[keep],
        T.DIRECTION: _lookup(_int(m, "copyKind")[keep], UM_COPY_KINDS, "dtod"),
        T.CAUSE: _lookup(_int(m, "migrationCause")[keep], CAUSE_OF_FLAGS, "unknown"),
    })


# ---- allocations ------------------------------------------------------------------

def _mem_kinds(exp: X.NsysExport) -> dict[int, str]:
    """memKind id -> trace kind, from ENUM_CUDA_MEM_KIND's names where the export has it."""
    if not exp.has(X.MEM_KIND_ENUM):
        return dict(MEM_KIND_DEFAULT)
    e = exp.read(X.MEM_KIND_ENUM, ["id", "name", "label"])
    col = "name" if "name" in e.column_names else "label" if "label" in e.column_names else None
    if col is None or "id" not in e.column_names:
        return dict(MEM_KIND_DEFAULT)
    out = {}
    for i, name in zip(e.column("id").to_pylist(), e.column(col).to_pylist()):
        key = str(name).upper().replace(" ", "_")
        for suffix, kind in MEM_KIND_SUFFIX:
            if key.endswith(suffix):
                out[int(i)] = kind
                break
    return out


def _allocations(exp, faults: pa.Table, migrations: pa.Table, issue_ns: np.ndarray, ps: int, progress,
                 notes: list[str]) -> tuple[pa.Table, bool]:
    recorded = _recorded_allocations(exp, issue_ns, progress) if exp.has(X.MEMORY_USAGE) else None
    if recorded is not None and pc.any(pc.equal(recorded.column(T.KIND), "managed")).as_py():
        return recorded, False
    inferred = _inferred_allocations(faults, migrations, ps, recorded)
    if recorded is None:
        notes.append(f"no {X.MEMORY_USAGE} (profile with {X.MEMORY_FLAG}): managed allocations inferred from"
                     " the ranges faults and migrations touch")
    else:
        notes.append(f"{X.MEMORY_USAGE} records no managed allocation: managed allocations inferred from the"
                     " ranges faults and migrations touch")
    return inferred, True


def _recorded_allocations(exp: X.NsysExport, issue_ns: np.ndarray, progress) -> pa.Table:
    e = exp.read(X.MEMORY_USAGE, MEMORY_COLUMNS, progress)
    for c in ("address", "bytes", "memoryOperationType", "start"):
        if c not in e.column_names:
            raise InputError(f"{exp.path}: table {X.MEMORY_USAGE} has no column {c}; not the documented nsys schema")
    kinds = _mem_kinds(exp)
    kind_code = _int(e, "memKind", -1)
    known = np.isin(kind_code, np.array(sorted(kinds), I64))
    addr, t, op = _u64(e, "address"), _int(e, "start"), _int(e, "memoryOperationType")
    nbytes, dev = _int(e, "bytes"), _int(e, "deviceId")
    sel = np.flatnonzero(known & np.isin(op, (MEM_OP_ALLOC, MEM_OP_FREE)))
    # events of one address in time order, an allocation before a free at the same instant
    sel = sel[np.lexsort((op[sel], t[sel], addr[sel]))]
    a, tt, oo = addr[sel], t[sel], op[sel]
    is_alloc = (oo == MEM_OP_ALLOC) & (nbytes[sel] > 0)
    nxt_same = np.zeros(len(sel), bool)
    nxt_same[:-1] = a[1:] == a[:-1]
    ai = np.flatnonzero(is_alloc)
    has_next = nxt_same[ai]
    free_ns = np.where(has_next, tt[np.minimum(ai + 1, len(sel) - 1)], -1)   # its free, or the next allocation
    rows = sel[ai]
    order = np.lexsort((addr[rows], t[rows]))
    rows, free_ns = rows[order], free_ns[order]
    srt = np.sort(issue_ns)
    first = np.searchsorted(srt, t[rows], side="right").astype(I64)
    last = np.searchsorted(srt, free_ns, side="left").astype(I64) - 1
    n = len(rows)
    kind_of = _lookup(kind_code[rows], kinds, "device")
    return T.to_table(T.ALLOCATIONS, {
        T.ALLOC_ID: np.arange(n, dtype=I64), T.ADDRESS: addr[rows], T.BYTES: nbytes[rows], T.KIND: kind_of,
        T.DEVICE: dev[rows].astype(np.int32), T.FIRST_LAUNCH: first,
        T.LAST_LAUNCH: pa.array(last, mask=free_ns < 0), T.ALLOC_NS: t[rows],
        T.FREE_NS: pa.array(free_ns, mask=free_ns < 0)})


def _inferred_allocations(faults: pa.Table, migrations: pa.Table, ps: int, recorded: pa.Table | None) -> pa.Table:
    """Managed allocations covering what faults and migrations touch: pieces in the same or
    adjacent 2 MiB VA blocks form one allocation, from its first touched page to its last."""
    fa = faults.column(T.ADDRESS).to_numpy().astype(np.uint64)
    ma = migrations.column(T.ADDRESS).to_numpy().astype(np.uint64)
    mb = migrations.column(T.BYTES).to_numpy().astype(np.uint64)
    lo = np.concatenate([fa, ma])
    hi = np.concatenate([fa + np.uint64(ps), ma + mb])
    keep = [] if recorded is None else [recorded]
    if len(lo):
        pg = np.uint64(ps)
        lo, hi = lo // pg * pg, (hi + pg - np.uint64(1)) // pg * pg
        order = np.argsort(lo, kind="stable")
        lo, hi = lo[order], hi[order]
        vb = np.uint64(VA_BLOCK)
        blo, bhi = lo // vb, (hi - np.uint64(1)) // vb
        reach = np.maximum.accumulate(bhi)
        new = np.ones(len(lo), bool)
        new[1:] = blo[1:] > reach[:-1] + np.uint64(1)
        idx = np.flatnonzero(new)
        starts = lo[idx]
        ends = np.maximum.reduceat(hi, idx)
        dev = int(np.bincount(faults.column(T.DEVICE).to_numpy()).argmax()) if faults.num_rows else 0
        base = 0 if recorded is None else recorded.num_rows
        n = len(idx)
        keep.append(T.to_table(T.ALLOCATIONS, {
            T.ALLOC_ID: np.arange(base, base + n, dtype=I64), T.ADDRESS: starts,
            T.BYTES: (ends - starts).astype(I64), T.KIND: pa.array(["managed"] * n, pa.string()),
            T.DEVICE: np.full(n, dev, np.int32), T.FIRST_LAUNCH: np.zeros(n, I64)}))
    if not keep:
        return T.SCHEMAS[T.ALLOCATIONS].empty_table()
    return pa.concat_tables(keep) if len(keep) > 1 else keep[0]


# ---- manifest ---------------------------------------------------------------------

def _workload_name(p: Path) -> str:
    name = p.name
    for suffix in (".sqlite", ".nsys-rep", "_pqtdir", ".parquetdir"):
        if name.endswith(suffix):
            name = name[:-len(suffix)]
    return name or p.name


def _device(exp: X.NsysExport, launches: pa.Table) -> dict:
    dev = int(np.bincount(launches.column(T.DEVICE).to_numpy()).argmax()) if launches.num_rows else 0
    out = {"name": None, "index": dev, "memory_bytes": None}
    if not exp.has(X.TARGET_GPU):
        return out
    g = exp.read(X.TARGET_GPU, ["id", "name", "totalMemory"])
    if "id" not in g.column_names:
        return out
    for i, row in enumerate(g.column("id").to_pylist()):
        if row == dev:
            if "name" in g.column_names:
                out["name"] = g.column("name")[i].as_py()
            if "totalMemory" in g.column_names:
                out["memory_bytes"] = g.column("totalMemory")[i].as_py()
            break
    return out
