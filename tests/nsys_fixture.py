"""Small Nsight Systems exports built to NVIDIA's documented schema (docs/import-nsys.md).

`make_export(path, kind="sqlite"|"parquetdir", ...)` writes one export of a made-up
unified-memory workload and returns what the importer must find in it: the rows it
reads from each table. The SQLite file declares its tables as `nsys export --type
sqlite` does (columns the importer does not read included, all NOT NULL); the Parquet
directory holds one `<TABLE>.parquet` per table with the same columns.

    python tests/nsys_fixture.py out.sqlite [--kind parquetdir] [--kernels N]
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import numpy as np

MIB = 1 << 20
PAGE = 4096
BIG = 64 * 1024

# (column, SQL type) per table, in nsys's declaration order; columns pagecast does not read included
SCHEMA = {
    "StringIds": [("id", "INTEGER PRIMARY KEY"), ("value", "TEXT NOT NULL")],
    "META_DATA_EXPORT": [("name", "TEXT NOT NULL"), ("value", "TEXT")],
    "ENUM_CUDA_MEM_KIND": [("id", "INTEGER PRIMARY KEY"), ("name", "TEXT NOT NULL"), ("label", "TEXT NOT NULL")],
    "TARGET_INFO_GPU": [("id", "INTEGER NOT NULL"), ("name", "TEXT"), ("totalMemory", "INTEGER")],
    "CUPTI_ACTIVITY_KIND_KERNEL": [
        ("start", "INTEGER NOT NULL"), ("end", "INTEGER NOT NULL"), ("deviceId", "INTEGER NOT NULL"),
        ("contextId", "INTEGER NOT NULL"), ("streamId", "INTEGER NOT NULL"), ("correlationId", "INTEGER"),
        ("globalPid", "INTEGER"), ("demangledName", "INTEGER NOT NULL"), ("shortName", "INTEGER NOT NULL"),
        ("mangledName", "INTEGER"), ("launchType", "INTEGER"), ("cacheConfig", "INTEGER"),
        ("registersPerThread", "INTEGER NOT NULL"), ("gridX", "INTEGER NOT NULL"), ("gridY", "INTEGER NOT NULL"),
        ("gridZ", "INTEGER NOT NULL"), ("blockX", "INTEGER NOT NULL"), ("blockY", "INTEGER NOT NULL"),
        ("blockZ", "INTEGER NOT NULL"), ("staticSharedMemory", "INTEGER NOT NULL"),
        ("dynamicSharedMemory", "INTEGER NOT NULL"), ("localMemoryPerThread", "INTEGER NOT NULL"),
        ("localMemoryTotal", "INTEGER NOT NULL"), ("gridId", "INTEGER NOT NULL"),
        ("sharedMemoryExecuted", "INTEGER"), ("graphNodeId", "INTEGER"), ("sharedMemoryLimitConfig", "INTEGER")],
    "CUPTI_ACTIVITY_KIND_RUNTIME": [
        ("start", "INTEGER NOT NULL"), ("end", "INTEGER NOT NULL"), ("eventClass", "INTEGER NOT NULL"),
        ("globalTid", "INTEGER"), ("correlationId", "INTEGER"), ("nameId", "INTEGER NOT NULL"),
        ("returnValue", "INTEGER NOT NULL"), ("callchainId", "INTEGER")],
    "CUPTI_ACTIVITY_KIND_MEMCPY": [
        ("start", "INTEGER NOT NULL"), ("end", "INTEGER NOT NULL"), ("deviceId", "INTEGER NOT NULL"),
        ("contextId", "INTEGER NOT NULL"), ("streamId", "INTEGER NOT NULL"), ("correlationId", "INTEGER"),
        ("globalPid", "INTEGER"), ("bytes", "INTEGER NOT NULL"), ("copyKind", "INTEGER NOT NULL"),
        ("deprecatedSrcId", "INTEGER"), ("srcKind", "INTEGER"), ("dstKind", "INTEGER"), ("srcDeviceId", "INTEGER"),
        ("srcContextId", "INTEGER"), ("dstDeviceId", "INTEGER"), ("dstContextId", "INTEGER"),
        ("migrationCause", "INTEGER"), ("graphNodeId", "INTEGER"), ("virtualAddress", "INTEGER")],
    "CUDA_UM_GPU_PAGE_FAULT_EVENTS": [
        ("start", "INTEGER NOT NULL"), ("end", "INTEGER NOT NULL"), ("globalPid", "INTEGER NOT NULL"),
        ("deviceId", "INTEGER NOT NULL"), ("address", "INTEGER NOT NULL"), ("numberOfPageFaults", "INTEGER NOT NULL"),
        ("faultAccessType", "INTEGER NOT NULL")],
    "CUDA_GPU_MEMORY_USAGE_EVENTS": [
        ("start", "INTEGER NOT NULL"), ("globalPid", "INTEGER NOT NULL"), ("deviceId", "INTEGER NOT NULL"),
        ("contextId", "INTEGER NOT NULL"), ("address", "INTEGER NOT NULL"), ("pc", "INTEGER NOT NULL"),
        ("bytes", "INTEGER NOT NULL"), ("memKind", "INTEGER NOT NULL"), ("memoryOperationType", "INTEGER NOT NULL"),
        ("name", "TEXT"), ("correlationId", "INTEGER"), ("streamId", "INTEGER")],
}

MEM_KINDS = ["PAGEABLE", "PINNED", "DEVICE", "ARRAY", "MANAGED", "DEVICE_STATIC", "MANAGED_STATIC", "UNKNOWN"]
KERNELS = [("_Z6vecaddPfS_S_i", "vecadd(float *, float *, float *, int)", "vecadd"),
           ("_Z7stencilPKfPfi", "stencil(const float *, float *, int)", "stencil")]
A_ADDR, A_SIZE = 0x7F0000000000, 8 * MIB     # managed
B_ADDR, B_SIZE = 0x7F0000A00000, 4 * MIB     # managed, 2 MiB after A's end: its own inferred allocation
C_ADDR, C_SIZE = 0x7E0000000000, 1 * MIB     # device
D_ADDR, D_SIZE = 0x7D0000000000, 64 * 1024   # pinned host
E_ADDR, E_SIZE = 0x7C0000000000, 4096        # pageable: not an allocation the trace records
PID = 0x100000000 * 4242


def workload(n_kernels: int = 12, seed: int = 0) -> tuple[dict[str, dict[str, list]], dict]:
    """The tables (name -> column -> values) and the counts the importer must produce."""
    rng = np.random.default_rng(seed)
    t: dict[str, dict[str, list]] = {name: {c: [] for c, _ in cols} for name, cols in SCHEMA.items()}

    def row(table, **vals):
        for c, typ in SCHEMA[table]:
            t[table][c].append(vals.get(c, "" if typ.startswith("TEXT") else 0))

    strings = []
    for mangled, demangled, short in KERNELS:
        strings += [mangled, demangled, short]
    strings.append("cudaLaunchKernel_v7000")
    for i, s in enumerate(strings):
        row("StringIds", id=i, value=s)
    row("META_DATA_EXPORT", name="EXPORT_SCHEMA_VERSION", value="3.24.14")
    row("META_DATA_EXPORT", name="EXPORT_PRODUCT_VERSION", value="2026.1.1.204")
    row("META_DATA_EXPORT", name="EXPORT_TIME_UTC", value="2026-11-29T14:00:00Z")
    for i, k in enumerate(MEM_KINDS):
        row("ENUM_CUDA_MEM_KIND", id=i, name=f"CUDA_MEMOPR_MEMORY_KIND_{k}", label=k.title())
    row("TARGET_INFO_GPU", id=0, name="NVIDIA H200", totalMemory=150754820096)
    # allocations (host time), all before the first kernel; B freed after the last
    for addr, size, kind in ((A_ADDR, A_SIZE, 4), (B_ADDR, B_SIZE, 4), (C_ADDR, C_SIZE, 2), (D_ADDR, D_SIZE, 1),
                             (E_ADDR, E_SIZE, 0)):
        row("CUDA_GPU_MEMORY_USAGE_EVENTS", start=1000 + len(t["CUDA_GPU_MEMORY_USAGE_EVENTS"]["start"]),
            globalPid=PID, address=addr, bytes=size, memKind=kind, memoryOperationType=0)
    counts = {"launches": n_kernels, "fault_records": 0, "faults": 0, "migrations": 0, "allocations": 4}
    by_cause: dict[str, int] = {}
    now = 10_000
    corr = 100
    fault_pages: list[int] = []
    for i in range(n_kernels):
        ki = i % len(KERNELS)
        api = now
        row("CUPTI_ACTIVITY_KIND_RUNTIME", start=api, end=api + 500, eventClass=1, correlationId=corr,
            nameId=len(strings) - 1, globalTid=PID + 1)
        start, end = now + 2_000, now + 2_000 + 100_000
        row("CUPTI_ACTIVITY_KIND_KERNEL", start=start, end=end, deviceId=0, contextId=1,
            streamId=7 if i % 2 == 0 else 13, correlationId=corr, globalPid=PID, demangledName=3 * ki + 1,
            shortName=3 * ki + 2, mangledName=3 * ki, registersPerThread=32, gridX=64 + i, gridY=1, gridZ=1,
            blockX=256, blockY=1, blockZ=1, dynamicSharedMemory=1024 * ki, gridId=i)
        base, size = (A_ADDR, A_SIZE) if ki == 0 else (B_ADDR, B_SIZE)
        pages = rng.choice(size // PAGE, size=int(rng.integers(2, 6)), replace=False)
        for j, pg in enumerate(sorted(pages)):
            addr = base + int(pg) * PAGE + int(rng.integers(0, PAGE))   # not page-aligned, as recorded
            ft = start + 1_000 + j * 3_000
            n = int(rng.integers(1, 9))
            row("CUDA_UM_GPU_PAGE_FAULT_EVENTS", start=ft, end=ft + 900, globalPid=PID, deviceId=0, address=addr,
                numberOfPageFaults=n, faultAccessType=1 + j % 3)
            counts["fault_records"] += 1
            counts["faults"] += n
            fault_pages.append(addr // PAGE)
            big = addr // BIG * BIG
            row("CUPTI_ACTIVITY_KIND_MEMCPY", start=ft + 100, end=ft + 800, deviceId=0, streamId=0, bytes=BIG,
                copyKind=11, migrationCause=2, virtualAddress=big, globalPid=PID)
            by_cause["coherence"] = by_cause.get("coherence", 0) + BIG
            counts["migrations"] += 1
        # the driver's speculative prefetch, and every third kernel an eviction of A's first 2 MiB
        row("CUPTI_ACTIVITY_KIND_MEMCPY", start=start + 50_000, end=start + 60_000, bytes=2 * BIG, copyKind=11,
            migrationCause=3, virtualAddress=base + size - 2 * BIG, globalPid=PID)
        by_cause["prefetch"] = by_cause.get("prefetch", 0) + 2 * BIG
        counts["migrations"] += 1
        if i % 3 == 2:
            row("CUPTI_ACTIVITY_KIND_MEMCPY", start=end + 100, end=end + 900, bytes=2 * MIB, copyKind=12,
                migrationCause=4, virtualAddress=A_ADDR, globalPid=PID)
            by_cause["eviction"] = by_cause.get("eviction", 0) + 2 * MIB
            counts["migrations"] += 1
        now = end + 5_000
        corr += 3
    # an explicit cudaMemPrefetchAsync, and an ordinary cudaMemcpy that is no migration
    row("CUPTI_ACTIVITY_KIND_MEMCPY", start=5_000, end=8_000, bytes=MIB, copyKind=11, migrationCause=1,
        virtualAddress=A_ADDR, globalPid=PID)
    by_cause["user"] = MIB
    counts["migrations"] += 1
    row("CUPTI_ACTIVITY_KIND_MEMCPY", start=6_000, end=7_000, bytes=MIB, copyKind=1, migrationCause=0,
        virtualAddress=0, globalPid=PID)
    # a fault while no kernel ran (attributed to none)
    row("CUDA_UM_GPU_PAGE_FAULT_EVENTS", start=now + 1_000, end=now + 1_500, globalPid=PID, deviceId=0,
        address=A_ADDR + 5 * PAGE, numberOfPageFaults=1, faultAccessType=2)
    counts["fault_records"] += 1
    counts["faults"] += 1
    row("CUDA_GPU_MEMORY_USAGE_EVENTS", start=now + 10_000, globalPid=PID, address=B_ADDR, bytes=B_SIZE, memKind=4,
        memoryOperationType=1)
    counts["migrated_bytes_by_cause"] = by_cause
    counts["kernel_names"] = sorted({KERNELS[i % len(KERNELS)][0] for i in range(n_kernels)})
    return t, counts


def write_sqlite(path: Path, tables: dict[str, dict[str, list]], omit: tuple[str, ...] = ()) -> None:
    con = sqlite3.connect(path)
    for name, cols in SCHEMA.items():
        if name in omit:
            continue
        decl = ", ".join(f'"{c}" {typ}' for c, typ in cols)
        con.execute(f'CREATE TABLE "{name}" ({decl})')
        rows = list(zip(*[tables[name][c] for c, _ in cols]))
        if rows:
            con.executemany(f'INSERT INTO "{name}" VALUES ({", ".join("?" * len(cols))})', rows)
    con.commit()
    con.close()


def write_parquetdir(path: Path, tables: dict[str, dict[str, list]], omit: tuple[str, ...] = ()) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    path.mkdir(parents=True)
    for name, cols in SCHEMA.items():
        if name in omit:
            continue
        arrays = {}
        for c, typ in cols:
            vals = tables[name][c]
            arrays[c] = pa.array(vals, pa.string() if typ.startswith("TEXT") else pa.int64())
        pq.write_table(pa.table(arrays), path / f"{name}.parquet")


def make_export(path: str | Path, *, kind: str = "sqlite", n_kernels: int = 12, seed: int = 0,
                omit: tuple[str, ...] = (), schema_version: str | None = None) -> dict:
    """Write an export; returns the counts the importer must find. `omit` leaves tables out
    (as nsys does for data it did not record)."""
    tables, counts = workload(n_kernels, seed)
    if schema_version is not None:
        tables["META_DATA_EXPORT"]["value"][0] = schema_version
    p = Path(path)
    (write_sqlite if kind == "sqlite" else write_parquetdir)(p, tables, omit)
    if "CUDA_GPU_MEMORY_USAGE_EVENTS" in omit:
        counts["allocations"] = None   # inferred
    return counts


if __name__ == "__main__":  # pragma: no cover
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("output")
    ap.add_argument("--kind", choices=("sqlite", "parquetdir"), default="sqlite")
    ap.add_argument("--kernels", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    print(make_export(a.output, kind=a.kind, n_kernels=a.kernels, seed=a.seed))
    sys.exit(0)
