"""How the results move with the per-transfer charge: docs/transfer-latency.md.

    python benchmarks/latency_sensitivity.py [--scale 0.2] [--costs msched-rtx5080] [--latency-us 0,5,10]
                                             [--out docs/transfer-latency.md] [--work DIR]

The built-in profiles charge every planned transfer (one contiguous range) a
fixed `transfer_latency_s` of 5 us, an assumption no measurement among
docs/uvm-facts.md's sources gives (docs/cost-model.md, "Built-in profiles and
sources"). This script runs the demo's suite (pagecast.demo.run_suite: every
workload model and MSched's mixes, fit on seeds 1 and 2, replayed on seed 3, at
150/200/300%) with demand, alloc, template and oracle under the profile with
that one field set to each of --latency-us, and writes the speedups side by
side: the geometric means, then every row. `pagecast calibrate` measures the
charge on a GPU (the intercept of prefetch time against bytes); until a GPU run
exists, this is how much the unsourced figure matters.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

POLICIES = ["demand", "alloc", "template", "oracle"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=0.2)
    ap.add_argument("--costs", default="msched-rtx5080")
    ap.add_argument("--latency-us", default="0,5,10", help="per-transfer charges to run, microseconds")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "docs" / "transfer-latency.md"))
    ap.add_argument("--work", help="keep traces and results here (default: a temporary directory)")
    args = ap.parse_args(argv)

    from pagecast.demo import OVERSUB, run_suite
    from pagecast.replay.costs import load_profile, replace, save_profile

    lats = [float(x) for x in args.latency_us.split(",")]
    t0 = time.perf_counter()
    by: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        base = load_profile(args.costs)
        for lat in lats:
            prof = replace(base, name=f"{base.name}, {lat:g} us per transfer", transfer_latency_s=lat * 1e-6)
            path = save_profile(prof, work / f"latency-{lat:g}us.json", force=True)
            runs, _, _ = run_suite(work, scale=args.scale, costs=str(path), policies=POLICIES)
            for r in runs:
                by[(lat, r["workload"], r["oversub"], r["policy"])] = r
    elapsed = time.perf_counter() - t0
    labels = list(dict.fromkeys(k[1] for k in by))

    def sp(lat, lab, o, p):
        r = by.get((lat, lab, o, p))
        return None if r is None else r["speedup_vs_demand"]

    def cells(vals, spec=".2f", suffix="x"):
        return " / ".join("-" if v is None else f"{v:{spec}}{suffix}" for v in vals)

    lat_head = " / ".join(f"{x:g}" for x in lats)
    geo = [f"| oversub | alloc ({lat_head} us) | template | oracle | template / oracle |", "|---:|---:|---:|---:|---:|"]
    for o in OVERSUB:
        g = {p: [] for p in ("alloc", "template", "oracle", "share")}
        for lat in lats:
            vals = {p: [sp(lat, lab, o, p) for lab in labels] for p in ("alloc", "template", "oracle")}
            for p, v in vals.items():
                g[p].append(statistics.geometric_mean([x for x in v if x]))
            g["share"].append(statistics.geometric_mean([t / orc for t, orc in zip(vals["template"], vals["oracle"])
                                                         if t and orc]))
        geo.append(f"| {o:.0%} | {cells(g['alloc'])} | {cells(g['template'])} | {cells(g['oracle'])} | "
                   f"{cells([x * 100 for x in g['share']], '.1f', '%')} |")
    rows = [f"| workload | oversub | alloc ({lat_head} us) | template | oracle | template / oracle | oracle's span |",
            "|---|---:|---:|---:|---:|---:|---|"]
    moved = []
    for lab in labels:
        for o in OVERSUB:
            t = [sp(lat, lab, o, "template") for lat in lats]
            orc = [sp(lat, lab, o, "oracle") for lat in lats]
            share = [a / b * 100 if a and b else None for a, b in zip(t, orc)]
            spans = " / ".join((by.get((lat, lab, o, "oracle")) or {}).get("plan_span") or "unit" for lat in lats)
            rows.append(f"| {lab} | {o:.0%} | {cells([sp(lat, lab, o, 'alloc') for lat in lats])} | {cells(t)} | "
                        f"{cells(orc)} | {cells(share, '.1f', '%')} | {spans} |")
            if orc[0] and orc[-1]:
                moved.append((orc[0] / orc[-1] - 1, lab, o))
    moved.sort(reverse=True)
    top = ", ".join(f"{lab} at {o:.0%} ({m:+.0%})" for m, lab, o in moved[:4])
    text = f"""# Results against the per-transfer charge

Written by `python benchmarks/latency_sensitivity.py --scale {args.scale} --costs {args.costs} --latency-us
{args.latency_us}` in {elapsed:.0f} s (do not edit by hand: rerun it).

The built-in cost profiles charge every planned transfer (one contiguous range on the copy
engines) a fixed `transfer_latency_s` of 5 us on top of its bytes. No measurement among
docs/uvm-facts.md's sources gives that figure (docs/cost-model.md, "Built-in profiles and
sources"): it is an assumption. `pagecast calibrate` measures it on a GPU, as the intercept of
prefetch time against bytes (replay/gpu/calibrate.py); no GPU run exists yet, so the figure
is unchecked, and this page shows how much the results depend on it instead. Each row below
is the demo's suite (docs/results.md: the same traces, model and capacities) under
`{args.costs}` with only `transfer_latency_s` changed, to {lat_head} us; cells read
"{lat_head} us". Speedups are over demand paging, which has no planned transfers, so its time
does not move.

Geometric means over the {len(labels)} workloads and mixes:

{chr(10).join(geo)}

Every row:

{chr(10).join(rows)}

Oracle moves most on {top or "no row"} (its speedup at {lats[0]:g} us over that at {lats[-1]:g} us):
rows whose plans are many short transfers (Belady's exchanges of scattered units) gain most
when a transfer costs nothing, and the span the planner chooses (last column) moves toward
units as the charge falls and toward whole blocks or allocations as it rises. What the
charge decides is how template, oracle and alloc compare with one another where their plans'
transfer counts differ, and how far all three are ahead of demand paging.
"""
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
