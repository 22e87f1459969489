"""Time the workload models at a few scales and print a table (Markdown).

    python benchmarks/bench_datasets.py                       # scales 0.1, 1, 10; every workload
    python benchmarks/bench_datasets.py --scales 1,100 --workloads mlp-train,llm-decode

Each trace is generated in a fresh subprocess (full mode unless --mode natural, driver
prefetch on, seed 0),
so the peak memory column is that generation's own. Columns: wall time of make_trace,
peak resident memory, launches, touched pages (sum over launches of each launch's
footprint, from the truth), distinct pages (union), fault records and migrations.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

_CHILD = r"""
import json, resource, sys, time
from pagecast.datasets.registry import make_trace
from pagecast import trace as T
from pagecast.footprints import truth_footprints
name, scale, out, mode = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
t = time.perf_counter()
make_trace(name, out, scale=scale, seed=0, mode=mode, force=True)
dt = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
tr = T.read_trace(out)
fp = truth_footprints(tr)
print(json.dumps({"workload": name, "scale": scale, "mode": mode, "seconds": dt, "peak_bytes": peak,
                  "launches": tr.n_launches, "touched_pages": fp.total_pages(),
                  "distinct_pages": fp.union_pages(), "fault_records": tr.faults.num_rows,
                  "migrations": tr.migrations.num_rows}))
"""


def run_one(name: str, scale: float, tmp: Path, mode: str = "full") -> dict:
    out = tmp / f"{name}-{scale:g}.pctrace"
    r = subprocess.run([sys.executable, "-c", _CHILD, name, str(scale), str(out), mode],
                       capture_output=True, text=True, check=True)
    subprocess.run(["rm", "-rf", str(out)], check=False)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    from pagecast.datasets.registry import DEMO_WORKLOADS
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scales", default="0.1,1,10")
    p.add_argument("--workloads", default=",".join(DEMO_WORKLOADS))
    p.add_argument("--mode", default="full", choices=("full", "natural"))
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    args = p.parse_args(argv)
    scales = [float(s) for s in args.scales.split(",")]
    names = [n for n in args.workloads.split(",") if n]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-datasets-") as tmp:
        for name in names:
            for scale in scales:
                r = run_one(name, scale, Path(tmp), args.mode)
                rows.append(r)
                print(f"{name} scale {scale:g}: {r['seconds']:.2f} s", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print("| workload | scale | time (s) | peak memory | launches | touched pages | distinct pages "
          "| fault records | migrations |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['workload']} | {r['scale']:g} | {r['seconds']:.2f} | {r['peak_bytes'] / 2**30:.2f} GiB "
              f"| {r['launches']:,} | {r['touched_pages']:,} | {r['distinct_pages']:,} "
              f"| {r['fault_records']:,} | {r['migrations']:,} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
