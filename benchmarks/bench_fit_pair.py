"""Fit time of `pagecast fit` on two small traces, clean and lossy, beside a reference fitter.

    python benchmarks/bench_fit_pair.py [--workload serving] [--scales 0.25,0.25] [--seeds 1,2]
                                        [--drop 0,0.01] [--reference-python PATH] [--timeout 900]
                                        [--markdown FILE]

Target (issue 52): `pagecast fit` of any two traces under 1 MB, lossy (1% of records lost) or
not, within 60 s on a 2-core machine. The traces are made once per drop rate from the workload
model (`datasets make`, a serving loop under Triton's interpreter where the workload is one),
then fitted together in a fresh process of this checkout and, with --reference-python, of another
interpreter whose `pagecast` is the reference (a script that runs python with another checkout
first on its path will do): the two run in turn on the same traces, so the ratio holds on a
loaded machine. A reference fit still running at --timeout is stopped and reported as at least
that long. Prints one JSON document; --markdown writes the table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, sys, time, warnings
warnings.simplefilter("ignore")
from pagecast import trace as T
from pagecast.predict.fit import fit_model
t0 = time.perf_counter()
c0 = time.process_time()
trs = [T.read_trace(p) for p in sys.argv[1:]]
t1 = time.perf_counter()
m = fit_model(trs)
t2 = time.perf_counter()
s = m.summary()
import pagecast.predict.formula as _f
print(json.dumps({"code": _f.__file__, "read_s": t1 - t0, "fit_s": t2 - t1, "cpu_s": time.process_time() - c0, "launches": sum(t.n_launches for t in trs),
                  "classes": s["kernels_by_class"]}))
"""


def fit_in(python: str, traces: list[Path], timeout: float) -> dict:
    t = time.perf_counter()
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        # from a neutral folder: a checkout's own `pagecast` folder must not shadow the interpreter's
        out = subprocess.run([python, "-c", CHILD, *map(str, traces)], capture_output=True, text=True,
                             check=True, timeout=timeout, cwd=tempfile.gettempdir())
    except subprocess.TimeoutExpired:   # run() killed and reaped the child: its CPU time is counted
        c2 = resource.getrusage(resource.RUSAGE_CHILDREN)
        return {"fit_s": None, "stopped_after_s": round(time.perf_counter() - t, 1),
                "cpu_s": round(c2.ru_utime + c2.ru_stime - c.ru_utime - c.ru_stime, 1)}
    return json.loads(out.stdout.strip().splitlines()[-1])


def size_of(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="serving")
    ap.add_argument("--scales", default="0.25,0.25")
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--drop", default="0,0.01")
    ap.add_argument("--reference-python", default=None, help="an interpreter whose pagecast is the reference")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds a fit may run before it is stopped")
    ap.add_argument("--markdown", default=None)
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "pagecast-bench-fit-pair"))
    args = ap.parse_args()

    from pagecast.datasets.registry import reuse_or_make
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    scales = [float(x) for x in args.scales.split(",")]
    seeds = [int(x) for x in args.seeds.split(",")]
    rows = []
    for d in [float(x) for x in args.drop.split(",")]:
        paths = []
        for sc, sd in zip(scales, seeds):
            p = cache / f"{args.workload}-{sc:g}-{sd}-drop{d:g}.pctrace"
            t = time.perf_counter()
            reuse_or_make(args.workload, p, scale=sc, seed=sd, drop=d)
            print(f"trace {p.name} ready ({time.perf_counter() - t:.0f} s, {size_of(p) / 1e6:.2f} MB)",
                  file=sys.stderr, flush=True)
            paths.append(p)
        row = {"drop": d, "bytes": [size_of(p) for p in paths], "this": fit_in(sys.executable, paths, args.timeout)}
        print(json.dumps(row), file=sys.stderr, flush=True)
        if args.reference_python:
            row["reference"] = fit_in(args.reference_python, paths, args.timeout)
            print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
    doc = {"workload": args.workload, "scales": scales, "seeds": seeds, "cpus": os.cpu_count(),
           "load": os.getloadavg(), "rows": rows}
    print(json.dumps(doc, indent=1))
    if args.markdown:
        def secs(r):
            if r is None:
                return "-"
            return (f"{r['fit_s']:.1f} s ({r['cpu_s']:.1f} s CPU)" if r.get("fit_s") is not None
                    else f"> {r['stopped_after_s']:.0f} s (stopped; {r['cpu_s']:.0f} s CPU)")
        lines = ["| record loss | trace sizes | fit (this) | fit (reference) | CPU ratio | kernels by class (this) |",
                 "|---|---|---:|---:|---:|---|"]
        for r in rows:
            this, ref = r["this"], r.get("reference")
            ratio = "-"
            if ref and this.get("cpu_s"):   # CPU time: a loaded machine stretches wall time unevenly
                ratio = (">" if ref.get("fit_s") is None else "") + f"{ref['cpu_s'] / this['cpu_s']:.1f}x"
            sizes = " + ".join(f"{b / 1e6:.2f} MB" for b in r["bytes"])
            lines.append(f"| {r['drop']:g} | {sizes} | {secs(this)} | {secs(ref)} | {ratio} "
                         f"| {this.get('classes', '-')} |")
        Path(args.markdown).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
