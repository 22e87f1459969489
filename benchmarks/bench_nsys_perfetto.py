"""`pagecast import nsys` and `pagecast export perfetto`, each beside a reference in the same run.

- import: a fixture export (tests/nsys_fixture.py) of N kernels, imported to a trace,
  beside the floor any importer pays: reading the same columns of the same tables
  with sqlite3 (fetchall, nothing converted or written).
- export: the imported trace exported to Perfetto protobuf, beside writing the same
  events (kernel slices, fault instants, migration slices) as Chrome JSON trace
  events with the json module (what nsys2json-style converters write).

    python benchmarks/bench_nsys_perfetto.py [--kernels 20000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))


def best(fn, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def raw_read(path: Path) -> int:
    con = sqlite3.connect(path)
    n = 0
    for sql in ("SELECT start, end, deviceId, streamId, correlationId, gridX, gridY, gridZ, blockX, blockY, blockZ,"
                " dynamicSharedMemory, mangledName FROM CUPTI_ACTIVITY_KIND_KERNEL",
                "SELECT start, address, numberOfPageFaults, faultAccessType, deviceId FROM CUDA_UM_GPU_PAGE_FAULT_EVENTS",
                "SELECT start, end, bytes, copyKind, virtualAddress, migrationCause FROM CUPTI_ACTIVITY_KIND_MEMCPY"
                " WHERE copyKind IN (11, 12, 13)",
                "SELECT id, value FROM StringIds"):
        n += len(con.execute(sql).fetchall())
    con.close()
    return n


def chrome_json(trace, out: Path) -> int:
    from pagecast import trace as T
    L, F, M = trace.launches, trace.faults, trace.migrations
    ev = []
    for k, s, e, st in zip(L.column(T.KERNEL).to_pylist(), L.column(T.START_NS).to_pylist(),
                           L.column(T.END_NS).to_pylist(), L.column(T.STREAM).to_pylist()):
        ev.append({"name": k, "ph": "X", "ts": s / 1e3, "dur": (e - s) / 1e3, "pid": 0, "tid": st})
    for t, a, c in zip(F.column(T.TIME_NS).to_pylist(), F.column(T.ACCESS).to_pylist(), F.column(T.COUNT).to_pylist()):
        ev.append({"name": f"{a} fault", "ph": "i", "ts": t / 1e3, "pid": 1, "tid": 0, "s": "t", "args": {"count": c}})
    for s, e, d, c, b in zip(M.column(T.START_NS).to_pylist(), M.column(T.END_NS).to_pylist(),
                             M.column(T.DIRECTION).to_pylist(), M.column(T.CAUSE).to_pylist(),
                             M.column(T.BYTES).to_pylist()):
        ev.append({"name": f"{d} {c}", "ph": "X", "ts": s / 1e3, "dur": (e - s) / 1e3, "pid": 2, "tid": 0,
                   "args": {"bytes": b}})
    out.write_text(json.dumps({"traceEvents": ev}))
    return len(ev)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    from nsys_fixture import make_export

    from pagecast import trace as T
    from pagecast.collect.nsys_import import NsysImportConfig, import_nsys
    from pagecast.report.perfetto_export import PerfettoExportConfig, export_perfetto

    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        src = d / "run.sqlite"
        counts = make_export(src, n_kernels=a.kernels)
        rows = raw_read(src)
        out = d / "run.pctrace"
        imp = best(lambda: import_nsys(NsysImportConfig(report=src, output=out, force=True)), a.repeat)
        ref = best(lambda: raw_read(src), a.repeat)
        trace = T.read_trace(out)
        pf = d / "run.pftrace"
        res = []
        exp = best(lambda: res.append(export_perfetto(PerfettoExportConfig(input=out, output=pf))), a.repeat)
        js = d / "run.json"
        jn = []
        jref = best(lambda: jn.append(chrome_json(trace, js)), a.repeat)
        doc = {"kernels": counts["launches"], "fault_records": counts["fault_records"],
               "migrations": counts["migrations"], "sqlite_rows_read": rows,
               "import_s": imp[0], "raw_sqlite_read_s": ref[0], "import_over_raw_read": imp[0] / ref[0],
               "perfetto_events": res[-1].events, "perfetto_s": exp[0], "perfetto_bytes": pf.stat().st_size,
               "chrome_json_events": jn[-1], "chrome_json_s": jref[0], "chrome_json_bytes": js.stat().st_size,
               # per event: the JSON reference writes the kernels, faults and migrations only (no counters,
               # allocations or lanes), so compare the cost of one event
               "perfetto_over_chrome_json_time_per_event": (exp[0] / res[-1].events) / (jref[0] / jn[-1]),
               "perfetto_over_chrome_json_bytes_per_event":
                   (pf.stat().st_size / res[-1].events) / (js.stat().st_size / jn[-1])}
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
