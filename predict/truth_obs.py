"""`fit --from truth`: learn from exact footprints instead of fault and migration records.

MSched learned its templates from NVBit instruction traces, which say exactly which pages
each launch touched. A trace with a truth table (`collect --interpret`, the workload
models) says the same. `truth_observations` gives the fitter that knowledge in the form
it reads: the trace with its faults and migrations replaced by page-exact records made
from the truth, so that no fitting code changes:

- one `coherence` htod migration over every merged interval of pages a launch touched
  (the observed footprint is then exactly the truth's pages);
- a fault record at the first and at the last page of every interval (the fitter takes
  fault pages as certainly touched, so each interval's ends are known to the page, not
  just to the 64 KiB big page a driver migrates);
- no prefetch migrations, and `driver_prefetch: false` (nothing was touched unseen);
- the manifest's `observations` is `truth`: `fit_model` then takes the records as exact to the
  page (its `big_page` the page size), where a driver's are exact to its 64 KiB big page.

The fitter still never reads the truth table itself.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa

from pagecast import footprints as FP
from pagecast import trace as T
from pagecast.errors import TraceError

TRUTH_OBSERVATIONS = "truth"   # the manifest's "observations" of a trace made here


def truth_observations(trace: T.Trace) -> T.Trace:
    """`trace` with faults and migrations rebuilt from its truth (TraceError when it has none)."""
    if trace.truth is None:
        raise TraceError(f"{trace.path}: no truth table; fit --from truth needs traces with truth "
                         "(pagecast collect --interpret, pagecast datasets make)")
    ps = trace.page_size
    fp = FP.truth_footprints(trace)
    lid = fp.launch_of_interval()
    s, e = fp.start.astype(np.int64), fp.end.astype(np.int64)
    start = trace.column(T.LAUNCHES, T.START_NS) if trace.n_launches else np.zeros(0, np.int64)
    end = trace.column(T.LAUNCHES, T.END_NS) if trace.n_launches else np.zeros(0, np.int64)
    t0 = np.maximum(start[lid], 0) if len(lid) else np.zeros(0, np.int64)
    t1 = np.maximum(end[lid], t0) if len(lid) else np.zeros(0, np.int64)
    two = e - 1 > s
    f_lid = np.concatenate([lid, lid[two]])
    f_page = np.concatenate([s, e[two] - 1])
    f_t = np.concatenate([t0, t0[two]])
    order = np.lexsort((f_page, f_lid))
    n_f, n_m = len(order), len(lid)
    faults = T.to_table(T.FAULTS, {
        T.TIME_NS: f_t[order], T.ADDRESS: (f_page[order] * ps).astype(np.uint64), T.COUNT: np.ones(n_f, np.int32),
        T.ACCESS: pa.array(["unknown"] * n_f, pa.string()), T.DEVICE: np.zeros(n_f, np.int32),
        T.LAUNCH_ID: f_lid[order]})
    migrations = T.to_table(T.MIGRATIONS, {
        T.START_NS: t0, T.END_NS: t1, T.ADDRESS: (s * ps).astype(np.uint64), T.BYTES: (e - s) * ps,
        T.DIRECTION: pa.array(["htod"] * n_m, pa.string()), T.CAUSE: pa.array(["coherence"] * n_m, pa.string()),
        T.LAUNCH_ID: lid})
    manifest = {**trace.manifest, "mode": "full", "driver_prefetch": False, "observations": TRUTH_OBSERVATIONS}
    return dataclasses.replace(trace, manifest=manifest, faults=faults, migrations=migrations, truth=None)
