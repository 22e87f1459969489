"""Fit time on a 10^6-launch trace, clean and with lost records, beside a reference fitter.

    python benchmarks/bench_fit.py [--workload llm-decode] [--scale 100] [--drop 0,0.01]
                                   [--reference-python PATH] [--markdown FILE]

Target (issue 3, kept by issue 14): fitting a 10^6-launch trace takes under a minute on a
2-core machine. Each trace (made once from the workload model, `--drop` records lost) is read
and fitted in a fresh process of this checkout and, with --reference-python, of another
interpreter whose `pagecast` is the reference (e.g. a venv with main's checkout installed):
the two run side by side on the same traces, in turn, so the ratio holds on a loaded machine.
Prints one JSON document; --markdown writes the table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, sys, time
from pagecast import trace as T
from pagecast.predict.fit import fit_model
t0 = time.perf_counter()
tr = T.read_trace(sys.argv[1])
t1 = time.perf_counter()
m = fit_model([tr])
t2 = time.perf_counter()
s = m.summary()
print(json.dumps({"read_s": t1 - t0, "fit_s": t2 - t1, "launches": tr.n_launches,
                  "records": tr.faults.num_rows + tr.migrations.num_rows,
                  "classes": s["kernels_by_class"], "unexplained": s.get("unexplained_launches")}))
"""


def fit_in(python: str, trace: Path) -> dict:
    out = subprocess.run([python, "-c", CHILD, str(trace)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="llm-decode")
    ap.add_argument("--scale", type=float, default=100.0, help="100 gives ~10^6 launches")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--drop", default="0,0.01")
    ap.add_argument("--reference-python", default=None, help="an interpreter whose pagecast is the reference")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--markdown", default=None)
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "pagecast-bench-fit"))
    args = ap.parse_args()

    from pagecast.datasets.registry import reuse_or_make
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    rows = []
    for d in [float(x) for x in args.drop.split(",")]:
        p = cache / f"{args.workload}-{args.scale:g}-{args.seed}-drop{d:g}.pctrace"
        t = time.perf_counter()
        reuse_or_make(args.workload, p, scale=args.scale, seed=args.seed, drop=d)
        print(f"trace {p.name} ready ({time.perf_counter() - t:.0f} s)", file=sys.stderr, flush=True)
        from pagecast import trace as T
        T.read_trace(p)          # once untimed: both fitters then read it from the page cache
        for _ in range(args.repeat):
            row = {"drop": d, "this": fit_in(sys.executable, p)}
            if args.reference_python:
                row["reference"] = fit_in(args.reference_python, p)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    doc = {"workload": args.workload, "scale": args.scale, "cpus": os.cpu_count(),
           "load": os.getloadavg(), "rows": rows}
    print(json.dumps(doc, indent=1))
    if args.markdown:
        lines = ["| record loss | launches | fault + migration records | fit (this) | fit (reference) | ratio "
                 "| read | kernels by class (this) | kernels by class (reference) |",
                 "|---|---|---|---|---|---|---|---|---|"]
        def cls(c):
            return ", ".join(f"{v} {k}" for k, v in c.items() if v)
        for r in rows:
            a, b = r["this"], r.get("reference")
            lines.append(f"| {r['drop']:.0%} | {a['launches']:,} | {a['records']:,} | {a['fit_s']:.1f} s "
                         f"| {b['fit_s']:.1f} s | {a['fit_s'] / b['fit_s']:.2f} | {a['read_s']:.1f} s "
                         f"| {cls(a['classes'])} | {cls(b['classes'])} |" if b else
                         f"| {r['drop']:.0%} | {a['launches']:,} | {a['records']:,} | {a['fit_s']:.1f} s | - | - "
                         f"| {a['read_s']:.1f} s | {cls(a['classes'])} | - |")
        Path(args.markdown).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
