"""The simulator's `runner` deciding one launch at a time (with the lookahead) and carrying out
template's plan, beside the planned template, in the same run: the share of template's speedup over
demand each keeps, per workload and level.

    python benchmarks/runner_lookahead.py --work DIR [--costs msched-rtx5080] [--callback-us US]
                                          [--call-us US] [--workloads a,b] [--markdown FILE]

DIR holds what `benchmarks/results.py --work DIR` (pagecast.demo.run_suite) leaves: `model.json`
and `traces/NAME-s3.pctrace` (the replayed seed). Missing, they are made with run_suite at
`--scale` (demand only). Both runners are the same policy (replay/policies/runner.py): *online* with
`PLANNED` off (one launch at a time, the lookahead of online/lookahead.py), *planned* with it on
(template's plan laid out per launch by online/plan_schedule.py: its ranges cut at allocations, a
call per range). `--callback-us`: host time of the planned runner's launch callback, its base per
launch (the lookup, event record, stream wait), charged to it alone (`runner.CALLBACK_S`; the
profile's `host_launch_s`, 0 in the built-in ones, applies to all); `--call-us`: what each call the
callback issues adds (`runner.CALL_S`; else the profile's `host_call_s`, 0 in the built-in ones).
benchmarks/bench_child_callback.py fits both on the GPU child's own path (docs/performance.md).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", required=True)
    ap.add_argument("--scale", type=float, default=0.2)
    ap.add_argument("--costs", default="msched-rtx5080")
    ap.add_argument("--callback-us", type=float, default=0.0,
                    help="host microseconds of the planned runner's launch callback, its base per launch (default 0)")
    ap.add_argument("--call-us", type=float, default=0.0,
                    help="host microseconds each call of the planned runner's callback adds (default 0)")
    ap.add_argument("--workloads", default=None, help="comma-separated (default: every DEMO workload)")
    ap.add_argument("--markdown", default=None, help="write the table here too")
    args = ap.parse_args(argv)
    if args.callback_us < 0 or args.call_us < 0:
        print("runner_lookahead: --callback-us and --call-us must be >= 0", file=sys.stderr)
        return 2

    from pagecast.demo import DEMO_WORKLOADS, OVERSUB, REPLAY_SEED, run_suite
    from pagecast.predict.model_io import load_model
    from pagecast.replay.policies import runner as R
    from pagecast.replay.sim.sweep import SimConfig, replay_sim
    from pagecast.trace import read_trace

    work = Path(args.work)
    names = args.workloads.split(",") if args.workloads else list(DEMO_WORKLOADS)
    if not (work / "model.json").exists() or any(not (work / "traces" / f"{n}-s{REPLAY_SEED}.pctrace").exists()
                                                  for n in names):
        work.mkdir(parents=True, exist_ok=True)
        run_suite(work, scale=args.scale, costs=args.costs, policies=["demand"], workloads=names, mixes={},
                  jobs=1)
    model = load_model(work / "model.json")
    modes = (False, True)   # PLANNED off (online), on (the plan carried out)
    rows, shares = [], {m: {o: [] for o in OVERSUB} for m in modes}
    t_all = time.perf_counter()
    R.CALLBACK_S = args.callback_us * 1e-6 or None
    R.CALL_S = args.call_us * 1e-6 or None
    try:
        for n in names:
            tr = read_trace(work / "traces" / f"{n}-s{REPLAY_SEED}.pctrace")
            sp: dict = {}
            secs = {}
            for planned in modes:
                R.PLANNED = planned
                t0 = time.perf_counter()
                runs, _ = replay_sim([tr], ["demand", "template", "runner"] if not planned else ["demand", "runner"],
                                     oversub=list(OVERSUB), config=SimConfig(costs=args.costs), model=model,
                                     timeline=False)
                secs[planned] = time.perf_counter() - t0
                for r in runs:
                    sp[(round(r["oversub"], 6), r["policy"], planned if r["policy"] == "runner" else None)] = \
                        r["speedup_vs_demand"]
            cells = []
            for o in OVERSUB:
                o = round(o, 6)
                t = sp[(o, "template", None)]
                old, new = sp[(o, "runner", False)], sp[(o, "runner", True)]
                shares[False][o].append(old / t)
                shares[True][o].append(new / t)
                cells.append(f"{t:.2f}x / {old:.2f}x ({old / t:.0%}) / {new:.2f}x ({new / t:.0%})")
            rows.append(f"| {n} | " + " | ".join(cells) + " |")
            print(rows[-1], f"({secs[False]:.1f} s, {secs[True]:.1f} s)", flush=True)
    finally:
        R.PLANNED, R.CALLBACK_S, R.CALL_S = True, None, None
    geo = {m: {o: math.exp(sum(map(math.log, v)) / len(v)) for o, v in shares[m].items()} for m in shares}
    head = ("| workload | " + " | ".join(f"template / runner online / runner planned at {o:.0%}" for o in OVERSUB)
            + " |\n|---|" + "---:|" * len(OVERSUB))
    foot = ("| geometric mean of runner / template | "
            + " | ".join(f"{geo[False][round(o, 6)]:.0%} / {geo[True][round(o, 6)]:.0%}" for o in OVERSUB) + " |")
    n_pass = {m: sum(v >= 0.9 for o in OVERSUB for v in shares[m][round(o, 6)]) for m in modes}
    lowest = min(v for o in OVERSUB for v in shares[True][round(o, 6)])
    text = (head + "\n" + "\n".join(rows) + "\n" + foot + "\n\n"
            f"runner >= 90% of template's speedup: {n_pass[True]} of {len(names) * len(OVERSUB)} cells planned "
            f"(lowest {lowest:.1%}), {n_pass[False]} online; callback {args.callback_us:g} us a launch + "
            f"{args.call_us:g} us a call; "
            f"{time.perf_counter() - t_all:.0f} s in all.\n")
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
