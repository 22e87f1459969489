"""The oracle's truth for a collected trace: the workload's own footprints, attached as its truth table.

    PAGECAST_FOOTPRINTS=fp.json pagecast collect -o w.pctrace --mode full -- python -m pagecast.datasets.gpu.NAME
    python -m pagecast.datasets.gpu.truth w.pctrace fp.json -o w-truth.pctrace

A GPU workload run with PAGECAST_FOOTPRINTS writes, per launch, the byte ranges its kernel's code
reads and writes (extents.py), in that run's addresses; collected in the same run, they are the
trace's addresses too. With the driver's prefetcher on, a trace's faults show about a quarter of
what a kernel touches (docs/gpu-validation.md): its observed footprint is a lower estimate, the
code's own is the truth. The output is the trace with a `truth` table (trace-format.md), which
every footprint reader prefers (`pagecast.footprints.footprints`): the GPU oracle's relocated
footprints and the simulator both. The launches must be the same kernels in the same order;
otherwise nothing is written (one line, exit 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from pagecast import trace as T
from pagecast.errors import PagecastError, UsageError


def attach_truth(trace_path: str | Path, footprints_path: str | Path, out: str | Path, force: bool = False) -> dict:
    """Write `out`: the trace at `trace_path` with the footprints file's ranges as its truth table.
    Returns a summary (launches, rows, bytes)."""
    try:
        fp = json.loads(Path(footprints_path).read_text())
        kernels, rows = list(fp["kernels"]), [tuple(int(x) for x in r) for r in fp["truth"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"{footprints_path}: not a footprints file ({e})") from None
    tr = T.read_trace(trace_path)
    names = tr.launches.column(T.KERNEL).to_pylist()
    if len(names) != len(kernels):
        raise UsageError(f"{trace_path} has {len(names)} launches, the footprints {len(kernels)}: not the same run")
    bad = next((i for i, (a, b) in enumerate(zip(names, kernels)) if a != b), None)
    if bad is not None:
        raise UsageError(f"launch {bad} is {names[bad]!r} in the trace and {kernels[bad]!r} in the footprints")
    ids = tr.launches.column(T.LAUNCH_ID).to_numpy()
    arr = np.array(rows, dtype=np.int64).reshape(-1, 3)
    arr = arr[arr[:, 2] > 0]
    truth = T.to_table(T.TRUTH, {T.LAUNCH_ID: ids[arr[:, 0]], T.ADDRESS: arr[:, 1].astype(np.uint64),
                                 T.BYTES: arr[:, 2], T.ACCESS: ["readwrite"] * len(arr)})
    manifest = dict(tr.manifest)
    manifest["truth_source"] = "the workload's own footprints (pagecast.datasets.gpu.extents)"
    tables = tr.tables()
    tables[T.TRUTH] = truth
    T.write_trace(out, manifest, tables, force=force)
    return {"launches": len(names), "rows": int(len(arr)), "bytes": int(arr[:, 2].sum())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pagecast.datasets.gpu.truth", description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("footprints")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--force", action="store_true")
    a = ap.parse_args(argv)
    try:
        s = attach_truth(a.trace, a.footprints, a.output, a.force)
    except PagecastError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print(f"{a.output}: truth for {s['launches']} launches, {s['rows']} ranges, {s['bytes'] / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
