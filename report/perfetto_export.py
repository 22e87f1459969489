"""`pagecast export perfetto INPUT -o FILE`: a timeline ui.perfetto.dev and trace_processor open.

- A trace: one track per (device, stream) with its kernels as slices; GPU page
  faults as instants (access type, address, count) with a cumulative-faults
  counter; migrations as slices per direction and cause (overlapping transfers
  on lanes "#2", "#3", ...) with a cumulative-bytes counter for each; allocations
  as slices over their lifetime per kind, and a live-bytes counter per kind.
- Replay results: per capacity a group, in it one group per policy in run order
  (so the policies line up one above the other), each with the launches'
  kernels as slices (per task where several share the GPU), their stalls as
  slices (from the previous launch's end: waiting, then faults), and counters
  of the bytes moved in and out and the faults per launch. Simulated seconds
  become nanoseconds from 0, so every run starts at the same place.

docs/reports.md ("Perfetto timelines") describes the tracks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pagecast import trace as T
from pagecast.errors import InputError
from pagecast.replay.results_io import is_results, read_results
from pagecast.units import format_size

from .perfetto_writer import PerfettoWriter, lanes

I64 = np.int64


@dataclass
class PerfettoExportConfig:
    input: Path
    output: Path
    force: bool = False
    policies: list[str] | None = None     # results: only these policies
    workloads: list[str] | None = None    # results: only these workloads


@dataclass
class PerfettoExportResult:
    path: Path
    kind: str                              # "trace" or "results"
    tracks: int
    events: int
    counts: dict[str, int] = field(default_factory=dict)


def export_perfetto(cfg: PerfettoExportConfig, progress=None) -> PerfettoExportResult:
    p = Path(cfg.input)
    if not p.exists():
        raise InputError(f"{p}: no such file or directory")
    if T.is_trace(p):
        trace = T.read_trace(p).require_launches("export")
        with PerfettoWriter(cfg.output, force=cfg.force) as w:
            counts = trace_timeline(w, trace, progress)
        return PerfettoExportResult(Path(cfg.output), "trace", w.tracks, w.events, counts)
    if is_results(p):
        runs, tl = read_results(p)
        if tl is None:
            raise InputError(f"{p}: the results have no timeline beside them (RESULTS.timeline.parquet);"
                             " replay with -o to write one")
        with PerfettoWriter(cfg.output, force=cfg.force) as w:
            counts = results_timeline(w, runs, tl, cfg.policies, cfg.workloads, progress)
        return PerfettoExportResult(Path(cfg.output), "results", w.tracks, w.events, counts)
    raise InputError(f"{p}: not a pagecast trace directory or replay results file; "
                     "export reads a trace (*.pctrace) or RESULTS.parquet")


# ---- a trace ----------------------------------------------------------------------

def _np(col, fill=-1) -> np.ndarray:
    if isinstance(col, (pa.Array, pa.ChunkedArray)):
        if col.null_count:
            col = pc.fill_null(col, fill)
        return col.to_numpy(zero_copy_only=False)
    return np.asarray(col)


def _hex(a: np.ndarray) -> list[str]:
    return [f"0x{int(x):x}" for x in a.tolist()]


def trace_timeline(w: PerfettoWriter, trace: T.Trace, progress=None) -> dict[str, int]:
    L, F, M, A = trace.launches, trace.faults, trace.migrations, trace.allocations
    if progress is not None:
        progress.update(total=L.num_rows + F.num_rows + M.num_rows + A.num_rows, description="writing the timeline")
    root = w.track(f"pagecast trace: {trace.name}")
    counts: dict[str, int] = {}
    st, en = _np(L.column(T.START_NS)), _np(L.column(T.END_NS))
    timed = (st >= 0) & (en >= st)
    counts["launches"] = int(timed.sum())
    counts["launches_without_times"] = int((~timed).sum())
    dev, stream = _np(L.column(T.DEVICE)), _np(L.column(T.STREAM))
    names = L.column(T.KERNEL).to_numpy(zero_copy_only=False)
    lid = _np(L.column(T.LAUNCH_ID))
    grid = [_np(L.column(c)) for c in T.GRID_COLUMNS]
    kgroup = w.track("kernels", root)
    pairs = sorted({(int(d), int(s)) for d, s in zip(dev[timed], stream[timed])})
    for d, s in pairs:
        sel = np.flatnonzero(timed & (dev == d) & (stream == s))
        lane = lanes(st[sel], en[sel])   # one stream runs one kernel at a time; a clock quirk goes on a lane
        for k in range(int(lane.max()) + 1 if len(lane) else 0):
            ss = sel[lane == k]
            tr = w.track(f"GPU {d} stream {s}" + (f" #{k + 1}" if k else ""), kgroup)
            w.slices(tr, st[ss], en[ss], names[ss], {
                "launch_id": lid[ss], "grid": [f"{a},{b},{c}" for a, b, c in zip(*(g[ss] for g in grid[:3]))],
                "block": [f"{a},{b},{c}" for a, b, c in zip(*(g[ss] for g in grid[3:]))]})
        if progress is not None:
            progress.advance(len(sel))
    if progress is not None:
        progress.advance(int((~timed).sum()))
    # faults: instants per record, and the cumulative count
    counts["fault_records"] = F.num_rows
    if F.num_rows:
        ft = _np(F.column(T.TIME_NS))
        fc = _np(F.column(T.COUNT)).astype(I64)
        order = np.argsort(ft, kind="stable")
        ft, fc = ft[order], fc[order]
        acc = F.column(T.ACCESS).to_numpy(zero_copy_only=False)[order]
        faults = w.track("GPU page faults", root)
        w.instants(faults, ft, [f"{a} fault" for a in acc],
                   {"address": _hex(F.column(T.ADDRESS).to_numpy()[order]), "count": fc,
                    "launch_id": _np(F.column(T.LAUNCH_ID))[order]})
        w.counter(w.track("faults (cumulative)", root, counter_unit="count"), ft, np.cumsum(fc))
        counts["faults"] = int(fc.sum())
        if progress is not None:
            progress.advance(F.num_rows)
    # migrations by direction and cause
    counts["migrations"] = M.num_rows
    if M.num_rows:
        mg = w.track("migrations", root)
        ms, me, mb = _np(M.column(T.START_NS)), _np(M.column(T.END_NS)), _np(M.column(T.BYTES)).astype(I64)
        md = M.column(T.DIRECTION).to_numpy(zero_copy_only=False)
        mc = M.column(T.CAUSE).to_numpy(zero_copy_only=False)
        ma = M.column(T.ADDRESS).to_numpy()
        for d in T.DIRECTIONS:
            for c in T.CAUSES:
                sel = np.flatnonzero((md == d) & (mc == c))
                if not len(sel):
                    continue
                _lane_slices(w, mg, f"{d} {c}", ms[sel], me[sel], f"{d} {c}",
                             {"bytes": mb[sel], "address": _hex(ma[sel])})
                order = np.argsort(me[sel], kind="stable")
                w.counter(w.track(f"{d} {c} bytes (cumulative)", mg, counter_unit="bytes"), me[sel][order],
                          np.cumsum(mb[sel][order]))
        if progress is not None:
            progress.advance(M.num_rows)
    # allocations: lifetime slices per kind, live bytes per kind
    counts["allocations"] = A.num_rows
    if A.num_rows:
        _allocations(w, root, trace, st, en, timed)
        if progress is not None:
            progress.advance(A.num_rows)
    return counts


def _lane_slices(w, parent, name, s, e, label, args) -> None:
    lane = lanes(s, e)
    for k in range(int(lane.max()) + 1):
        sel = np.flatnonzero(lane == k)
        tr = w.track(name + (f" #{k + 1}" if k else ""), parent)
        w.slices(tr, s[sel], e[sel], label, {key: _take(v, sel) for key, v in args.items()})


def _take(v, sel):
    return [v[i] for i in sel.tolist()] if isinstance(v, list) else np.asarray(v)[sel]


def _allocations(w, root, trace: T.Trace, st, en, timed) -> None:
    A = trace.allocations
    n_l = trace.n_launches
    t_lo = int(st[timed].min()) if timed.any() else 0
    t_hi = int(en[timed].max()) if timed.any() else 0
    first = np.clip(_np(A.column(T.FIRST_LAUNCH)), 0, max(n_l - 1, 0))
    last = _np(A.column(T.LAST_LAUNCH), n_l - 1)
    last = np.clip(last, -1, n_l - 1)
    # lifetime: the host timestamps where known, else the kernels it was live for
    a_ns, f_ns = _np(A.column(T.ALLOC_NS)), _np(A.column(T.FREE_NS))
    st_f = np.where(timed, st, t_lo)
    en_f = np.where(timed, en, t_hi)
    start = np.where(a_ns >= 0, a_ns, st_f[first] if n_l else t_lo)
    end = np.where(f_ns >= 0, f_ns, np.where(last >= 0, en_f[np.maximum(last, 0)], start) if n_l else t_hi)
    end = np.maximum(end, start)
    kinds = A.column(T.KIND).to_numpy(zero_copy_only=False)
    nbytes = _np(A.column(T.BYTES)).astype(I64)
    g = w.track("allocations" + (" (inferred)" if trace.manifest.get("allocations_inferred") else ""), root)
    for kind in T.ALLOC_KINDS:
        sel = np.flatnonzero(kinds == kind)
        if not len(sel):
            continue
        _lane_slices(w, g, kind, start[sel], end[sel], kind,
                     {"bytes": nbytes[sel], "size": [format_size(int(b)) for b in nbytes[sel]],
                      "address": _hex(A.column(T.ADDRESS).to_numpy()[sel]),
                      "alloc_id": _np(A.column(T.ALLOC_ID))[sel]})
        ts = np.concatenate([start[sel], end[sel]])
        delta = np.concatenate([nbytes[sel], -nbytes[sel]])
        never_freed = np.concatenate([np.zeros(len(sel), bool), (f_ns[sel] < 0) & (last[sel] >= n_l - 1)])
        ts, delta = ts[~never_freed], delta[~never_freed]
        order = np.lexsort((-delta, ts))   # at one instant, allocations before frees
        w.counter(w.track(f"{kind} bytes live", g, counter_unit="bytes"), ts[order], np.cumsum(delta[order]))


# ---- replay results ---------------------------------------------------------------

def results_timeline(w: PerfettoWriter, runs: pa.Table, tl: pa.Table, policies=None, workloads=None,
                     progress=None) -> dict[str, int]:

    rows = runs.to_pylist()
    if policies:
        unknown = sorted(set(policies) - {r["policy"] for r in rows})
        if unknown:
            raise InputError(f"--policy {','.join(unknown)}: not in the results (they hold"
                             f" {', '.join(sorted({r['policy'] for r in rows}))})")
        rows = [r for r in rows if r["policy"] in policies]
    if workloads:
        have = {str(r.get("workload")) for r in rows}
        unknown = sorted(set(workloads) - have)
        if unknown:
            raise InputError(f"--workload {','.join(unknown)}: not in the results (they hold {', '.join(sorted(have))})")
        rows = [r for r in rows if str(r.get("workload")) in workloads]
    run_col = _np(tl.column("run"))
    order = np.argsort(run_col, kind="stable")
    run_sorted = run_col[order]
    if progress is not None:
        total = int(np.isin(run_col, [r["run"] for r in rows]).sum()) if rows else 0
        progress.update(total=total, description="writing the timeline")
    cols = {c: tl.column(c) for c in ("start_s", "end_s", "stall_s", "faults", "htod_bytes", "dtoh_bytes",
                                      "kernel", "task_name", "launch_id")}
    groups: dict[tuple, int] = {}
    counts = {"runs": 0, "launches": 0, "stalls": 0}
    for r in rows:
        wl = str(r.get("workload") or "")
        cap = r.get("capacity_bytes")
        key = (wl, cap)
        if key not in groups:
            over = r.get("oversub")
            label = f"{wl}: " if wl else ""
            label += (f"{over:.0%} oversubscription ({format_size(cap)})" if over else format_size(cap or 0))
            groups[key] = w.track(label)
        pol = w.track(r["policy"] + (f" ({r['plan_span']} span)" if r.get("plan_span") not in (None, "unit") else ""),
                      groups[key])
        lo, hi = np.searchsorted(run_sorted, [r["run"], r["run"] + 1])
        idx = order[lo:hi]
        if not len(idx):
            continue
        take = pa.array(idx)
        s = _np(cols["start_s"].take(take), 0.0)
        e = _np(cols["end_s"].take(take), 0.0)
        stall = _np(cols["stall_s"].take(take), 0.0)
        k = cols["kernel"].take(take).to_numpy(zero_copy_only=False)
        task = cols["task_name"].take(take).to_numpy(zero_copy_only=False)
        launch = _np(cols["launch_id"].take(take))
        seq = np.argsort(s, kind="stable")
        s, e, stall, k, task, launch = s[seq], e[seq], stall[seq], k[seq], task[seq], launch[seq]
        s_ns, e_ns = _ns(s), _ns(e)
        tasks = list(dict.fromkeys(task.tolist()))
        for tname in tasks:
            sel = np.flatnonzero(task == tname)
            tr = w.track("kernels" + (f": {tname}" if len(tasks) > 1 else ""), pol)
            w.slices(tr, s_ns[sel], e_ns[sel], k[sel], {"launch_id": launch[sel]})
        # a launch's stall runs from the previous launch's end: the wait before it, then its faults
        prev_end = np.concatenate([[0.0], e[:-1]])
        st_sel = np.flatnonzero(stall > 0)
        tr = w.track("stalls", pol)
        w.slices(tr, _ns(prev_end[st_sel]), _ns(prev_end[st_sel] + stall[st_sel]), "stall",
                 {"stall_us": np.round(stall[st_sel] * 1e6, 3)})
        for name, c, unit in (("htod bytes per launch", "htod_bytes", "bytes"),
                              ("dtoh bytes per launch", "dtoh_bytes", "bytes"), ("faults per launch", "faults", "count")):
            v = _np(cols[c].take(take), 0).astype(I64)[seq]
            w.counter(w.track(name, pol, counter_unit=unit), s_ns, v)
        counts["runs"] += 1
        counts["launches"] += len(idx)
        counts["stalls"] += len(st_sel)
        if progress is not None:
            progress.advance(len(idx))
    return counts


def _ns(seconds: np.ndarray) -> np.ndarray:
    return np.round(np.asarray(seconds, np.float64) * 1e9).astype(I64)
