"""The numbers `pagecast summary` prints (and reports reuse).

Two sizes are kept apart by name: a *footprint* is the distinct pages touched (the union over
launches: what `--oversub` divides), *touched* bytes are summed over launches (a page that n
launches touch counts n times: the traffic a launch-by-launch demand pager would see at worst).
"""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc

from . import trace as T
from .footprints import footprints, merge_intervals


def _span(*cols) -> tuple[int | None, int | None]:
    lo, hi = None, None
    for c in cols:
        if len(c) and c.null_count < len(c):
            mm = pc.min_max(c).as_py()
            lo = mm["min"] if lo is None else min(lo, mm["min"])
            hi = mm["max"] if hi is None else max(hi, mm["max"])
    return lo, hi


def trace_summary(trace: T.Trace, top: int = 10) -> dict:
    L, A, F, M = trace.launches, trace.allocations, trace.faults, trace.migrations
    fp = footprints(trace)
    ps = trace.page_size
    by_dir = {d: 0 for d in T.DIRECTIONS}
    by_cause = {c: 0 for c in T.CAUSES}
    if M.num_rows:
        for row in M.group_by(T.DIRECTION).aggregate([(T.BYTES, "sum")]).to_pylist():
            by_dir[row[T.DIRECTION]] = int(row[f"{T.BYTES}_sum"])
        for row in M.group_by(T.CAUSE).aggregate([(T.BYTES, "sum")]).to_pylist():
            by_cause[row[T.CAUSE]] = int(row[f"{T.BYTES}_sum"])
    lo, hi = _span(L.column(T.START_NS), L.column(T.END_NS), F.column(T.TIME_NS),
                   M.column(T.START_NS), M.column(T.END_NS))
    kernels = []
    if L.num_rows:
        pages = fp.pages_per_launch()
        names = L.column(T.KERNEL).to_numpy(zero_copy_only=False)
        uniq, inv = np.unique(names, return_inverse=True)
        counts = np.bincount(inv)
        touched = np.bincount(inv, weights=pages) * ps
        # each kernel's footprint: the distinct pages its launches touch (the union, as the trace's)
        k_of = inv[fp.launch_of_interval()].astype(np.int64)
        _, us, ue = merge_intervals(k_of, fp.start, fp.end, len(uniq))
        distinct = np.bincount(_, weights=ue - us, minlength=len(uniq)) * ps
        order = np.argsort(-touched, kind="stable")[:top]
        kernels = [{"kernel": str(uniq[i]), "launches": int(counts[i]), "touched_bytes": int(touched[i]),
                    "footprint_bytes": int(distinct[i])} for i in order]
    alloc_kinds = {}
    if A.num_rows:
        for row in A.group_by(T.KIND).aggregate([(T.BYTES, "sum"), (T.BYTES, "count")]).to_pylist():
            alloc_kinds[row[T.KIND]] = {"count": int(row[f"{T.BYTES}_count"]), "bytes": int(row[f"{T.BYTES}_sum"])}
    return {
        "trace": str(trace.path),
        "workload": (trace.manifest.get("workload") or {}).get("name"),
        "source": trace.manifest.get("source"),
        "mode": trace.mode,
        "complete": trace.complete,
        "page_size": ps,
        "driver_prefetch": trace.manifest.get("driver_prefetch"),
        "launches": L.num_rows,
        "kernels": int(len(pc.unique(L.column(T.KERNEL)))) if L.num_rows else 0,
        "allocations": A.num_rows,
        "allocated_bytes": int(pc.sum(A.column(T.BYTES)).as_py() or 0),
        "allocation_kinds": alloc_kinds,
        "faults": int(pc.sum(F.column(T.COUNT)).as_py() or 0),
        "fault_records": F.num_rows,
        "migrations": M.num_rows,
        "migrated_bytes": by_dir,
        "migrated_bytes_by_cause": by_cause,
        "footprint_source": fp.source,
        "footprint_bytes": fp.union_pages() * ps,
        "touched_bytes": fp.total_pages() * ps,   # summed over launches: a page n launches touch counts n times
        "has_truth": trace.truth is not None,
        "time_span_ns": (hi - lo) if lo is not None else None,
        "top_kernels": kernels,
        "values": _values_summary(trace),
    }


def _values_summary(trace: T.Trace) -> dict | None:
    """The values table, when the trace has one: rows, launches, bytes, the writer's limit and what
    was clipped (by the writer, in the manifest; by the reader, in its report)."""
    v = trace.values
    if v is None:
        return None
    m = trace.manifest.get(T.VALUES_KEY) if isinstance(trace.manifest.get(T.VALUES_KEY), dict) else {}
    return {"rows": v.num_rows, "launches": int(len(pc.unique(v.column(T.LAUNCH_ID)))) if v.num_rows else 0,
            "bytes": int(pc.sum(v.column(T.BYTES)).as_py() or 0), "limit_bytes": trace.values_limit,
            "repeats": m.get("repeats", "kept"), "clipped_bytes_by_writer": int(m.get("clipped_bytes", 0)),
            "read": dict(trace.values_report)}
