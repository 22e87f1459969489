"""What oracle's family of plans and the lower bound cost: the planner's time before and after issue 20.

    python benchmarks/bench_oracle.py [--scale 0.2] [--work DIR] [--out docs/simulator-performance.md]

On the demo's suite (every workload model and MSched's three mixes, fit on
seeds 1 and 2, replayed on seed 3 at 150/200/300%: pagecast.demo's cases),
times in one process, case by case and side by side:

- template and oracle planned as before issue 20 (spans unit, block and
  allocation; nothing left to faults; oracle without the other policies' runs),
- template and oracle as now (the fitted span too; oracle also trying to leave
  transfers to faults, and taking the other policies' runs: those runs are
  the sweep's anyway, so comparing them costs nothing but a lookup),
- the lower bound (replay/sim/bound.py, Belady's misses on the touches),

and writes the totals and the ratios into the "Oracle's family" section of
--out (after bench_sim.py, which rewrites that file). Wall times on a shared
machine vary from run to run; the ratios, measured in the same run, are what
the figures mean.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SECTION = "## Oracle's family and the lower bound (benchmarks/bench_oracle.py)"
OLD_SPANS = ("unit", "block", "allocation")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=0.2)
    ap.add_argument("--costs", default="msched-rtx5080")
    ap.add_argument("--work", help="the demo's traces and model (made here if missing; default: a temporary directory)")
    ap.add_argument("--out", help="markdown file whose section to replace")
    args = ap.parse_args(argv)

    from pagecast.datasets.registry import DEMO_WORKLOADS, MIXES, reuse_or_make
    from pagecast.demo import FIT_SEEDS, OVERSUB, REPLAY_SEED, demo_timeslice_ms
    from pagecast.predict.fit import fit_model
    from pagecast.replay import policies as P
    from pagecast.replay.plan.adaptive import predicted_gated
    from pagecast.replay.sim import run as R
    from pagecast.replay.sim.bound import lower_bound
    from pagecast.replay.sim.sweep import SimConfig, capacities_for
    from pagecast.replay.unit_space import build_workload
    from pagecast.trace import read_trace

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        (work / "traces").mkdir(parents=True, exist_ok=True)
        cases = [[n] for n in DEMO_WORKLOADS] + [v for v in MIXES.values() if v]
        used = sorted({n for c in cases for n in c})

        def path(n, s):
            return reuse_or_make(n, work / "traces" / f"{n}-s{s}.pctrace", scale=args.scale, seed=s)
        model = fit_model([read_trace(path(n, s)) for n in used for s in FIT_SEEDS])
        tot = {k: 0.0 for k in ("template before", "template now", "oracle before", "oracle now", "bound")}
        slow = []
        for wl in cases:
            traces = [read_trace(path(n, REPLAY_SEED + 10 * wl[:k].count(n))) for k, n in enumerate(wl)]
            cfg = SimConfig(costs=args.costs, timeslice_ms=demo_timeslice_ms(traces, args.costs))
            prof = cfg.profile()
            pg = [predicted_gated(model, t, cfg.fallback) for t in traces]
            pred = [fp for fp, _ in pg]
            w = build_workload(traces, gran=prof.granularity, eviction_unit=prof.eviction_unit, profile=prof,
                               timeslice_s=cfg.timeslice_ms / 1e3, need_alloc=True, extra_fps=[pred])
            w.extra[("predicted", id(model), cfg.fallback)] = pg
            comp = R.step_compute(w)
            case = {k: 0.0 for k in tot}
            for o in OVERSUB:
                (cap, _), = capacities_for(w.oversub_basis("managed"), None, [o])
                cu = cap // w.gran
                rivals = []
                for label, make, old in (("template before", lambda: P.Template(model=model), True),
                                         ("template now", lambda: P.Template(model=model), False),
                                         ("oracle before", P.Oracle, True), ("oracle now", P.Oracle, False)):
                    pol = make()
                    if old:
                        pol.spans, pol.faults = OLD_SPANS, False
                    t0 = time.perf_counter()
                    r = R.run_policy(w, pol, cu, prof, P.Options())
                    if label == "oracle now":   # judged with the other policies' runs, as a replay does
                        r = P.Oracle.with_rivals(r, rivals)
                    case[label] += time.perf_counter() - t0
                    if label == "template now":
                        rivals.append(("template", r))
                t0 = time.perf_counter()
                lower_bound(w, cu, prof, comp)
                case["bound"] += time.perf_counter() - t0
            for k in tot:
                tot[k] += case[k]
            slow.append((case["oracle now"] / max(case["oracle before"], 1e-9), "+".join(wl)))
    slow.sort(reverse=True)
    lines = [SECTION, "",
             f"Written by `python benchmarks/bench_oracle.py --scale {args.scale}`: the demo's {len(cases)} cases "
             f"at {len(OVERSUB)} oversubscriptions, each policy's runs timed side by side in one process (wall "
             "seconds, all cases; 2 CPUs, one thread). \"Before\": the spans unit, block and allocation, "
             "nothing left to faults, oracle without other policies' runs; \"now\": the fitted span too, "
             "oracle also leaving transfers to faults where its trial run has time and taking template's run "
             "where faster.", "",
             "| | seconds | now / before |", "|---|---:|---:|"]
    for p in ("template", "oracle"):
        b, n = tot[f"{p} before"], tot[f"{p} now"]
        lines.append(f"| {p}, before | {b:.1f} | |")
        lines.append(f"| {p}, now | {n:.1f} | {n / b:.2f} |")
    lines.append(f"| lower bound (every case and capacity) | {tot['bound']:.1f} | |")
    lines += ["", "Oracle's largest ratios, by case: " +
              ", ".join(f"{name} {x:.2f}" for x, name in slow[:3]) + ". Each span tried is a plan and a "
              "trial run; the fitted span adds one of each where the block span was tried, the transfers "
              "left to faults one more trial; the lower bound is one pass of Belady over the touches.", ""]
    text = "\n".join(lines)
    print(text)
    if args.out:
        p = Path(args.out)
        old = p.read_text() if p.exists() else ""
        if SECTION in old:
            head, rest = old.split(SECTION, 1)
            nxt = rest.find("\n## ")
            tail = rest[nxt:] if nxt >= 0 else ""
        else:
            head, tail = old, ""
        p.write_text(head.rstrip("\n") + "\n\n" + text + tail)
    return 0


if __name__ == "__main__":
    sys.exit(main())
