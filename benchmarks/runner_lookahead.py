"""The simulator's `runner` deciding one launch at a time (with the lookahead) and carrying out
template's plan, beside the planned template, in the same run: the share of template's speedup over
demand each keeps, per workload and level.

    python benchmarks/runner_lookahead.py --work DIR [--costs msched-rtx5080] [--callback-us US]
                                          [--call-us US] [--quiet-us US] [--wait-us US] [--host-ahead N[,N...]]
                                          [--no-online] [--workloads a,b] [--markdown FILE]

DIR holds what `benchmarks/results.py --work DIR` (pagecast.demo.run_suite) leaves: `model.json`
and `traces/NAME-s3.pctrace` (the replayed seed). Missing, they are made with run_suite at
`--scale` (demand only). Both runners are the same policy (replay/policies/runner.py): *online* with
`PLANNED` off (one launch at a time, the lookahead of online/lookahead.py), *planned* with it on
(template's plan laid out per launch by online/plan_schedule.py: its ranges cut at allocations, a
call per range). `--callback-us`: host time of the planned runner's launch callback, its base per
launch (the lookup, event record, stream wait), charged to it alone (`runner.CALLBACK_S`; the
profile's `host_launch_s`, 0 in the built-in ones, applies to all); `--call-us`: what each call the
callback issues adds (`runner.CALL_S`; else the profile's `host_call_s`, 0 in the built-in ones).
`--quiet-us`: a quiet callback's (nothing issued or waited on: online/callbacks.py; `runner.QUIET_S`,
else the profile's `host_quiet_s`, else the base); `--wait-us`: a light one's (nothing issued, the
stream's wait alone: `runner.WAIT_S`, else `host_wait_s`, else the base). The host runs the callbacks asynchronously to the
GPU (sim/timing.py): `--host-ahead` N, at most N launches ahead of it (0: no bound; `runner.HOST_AHEAD`),
one planned column per N given. `--no-online`: the planned runner(s) alone beside template.
benchmarks/bench_child_callback.py measures these costs on the GPU child's own path (docs/performance.md).
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
    ap.add_argument("--quiet-us", type=float, default=None,
                    help="host microseconds of a quiet callback (default: the profile's host_quiet_s, else the base)")
    ap.add_argument("--wait-us", type=float, default=None,
                    help="host microseconds of a callback that only waits (default: the profile's host_wait_s, else the base)")
    ap.add_argument("--host-ahead", default="0",
                    help="launches the host may run ahead of the GPU, comma-separated: one planned column each (0: no bound)")
    ap.add_argument("--no-online", action="store_true", help="leave out the runner deciding one launch at a time")
    ap.add_argument("--workloads", default=None, help="comma-separated (default: every DEMO workload)")
    ap.add_argument("--markdown", default=None, help="write the table here too")
    args = ap.parse_args(argv)
    try:
        aheads = [int(x) for x in args.host_ahead.split(",")]
    except ValueError:
        aheads = [-1]
    if args.callback_us < 0 or args.call_us < 0 or (args.quiet_us or 0) < 0 or (args.wait_us or 0) < 0 \
            or min(aheads) < 0:
        print("runner_lookahead: --callback-us, --call-us, --quiet-us, --wait-us and --host-ahead must be >= 0",
              file=sys.stderr)
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
    # None: online (PLANNED off); an int: the plan carried out, the host at most that far ahead
    modes = ([] if args.no_online else [None]) + aheads
    rows, shares = [], {m: {round(o, 6): [] for o in OVERSUB} for m in modes}
    t_all = time.perf_counter()
    R.CALLBACK_S = args.callback_us * 1e-6 or None
    R.CALL_S = args.call_us * 1e-6 or None
    R.QUIET_S = None if args.quiet_us is None else args.quiet_us * 1e-6
    R.WAIT_S = None if args.wait_us is None else args.wait_us * 1e-6
    try:
        for n in names:
            tr = read_trace(work / "traces" / f"{n}-s{REPLAY_SEED}.pctrace")
            sp: dict = {}
            secs = {}
            for i, mode in enumerate(modes):
                R.PLANNED = mode is not None
                R.HOST_AHEAD = mode or 0
                t0 = time.perf_counter()
                runs, _ = replay_sim([tr], ["demand", "runner"] + (["template"] if i == 0 else []),
                                     oversub=list(OVERSUB), config=SimConfig(costs=args.costs), model=model,
                                     timeline=False)
                secs[mode] = time.perf_counter() - t0
                for r in runs:
                    sp[(round(r["oversub"], 6), r["policy"], mode if r["policy"] == "runner" else None)] = \
                        r["speedup_vs_demand"]
            cells = []
            for o in OVERSUB:
                o = round(o, 6)
                t = sp[(o, "template", None)]
                cell = [f"{t:.2f}x"]
                for m in modes:
                    v = sp[(o, "runner", m)]
                    shares[m][o].append(v / t)
                    cell.append(f"{v:.2f}x ({v / t:.0%})")
                cells.append(" / ".join(cell))
            rows.append(f"| {n} | " + " | ".join(cells) + " |")
            print(rows[-1], "(" + ", ".join(f"{secs[m]:.1f} s" for m in modes) + ")", flush=True)
    finally:
        R.PLANNED, R.CALLBACK_S, R.CALL_S, R.QUIET_S, R.WAIT_S, R.HOST_AHEAD = True, None, None, None, None, 0
    geo = {m: {o: math.exp(sum(map(math.log, v)) / len(v)) for o, v in shares[m].items()} for m in shares}

    def label(m):
        return "runner online" if m is None else ("runner planned" + (f", host <= {m} ahead" if m else ""))
    head = ("| workload | " + " | ".join(f"template / {' / '.join(label(m) for m in modes)} at {o:.0%}"
                                        for o in OVERSUB)
            + " |\n|---|" + "---:|" * len(OVERSUB))
    foot = ("| geometric mean of runner / template | "
            + " | ".join(" / ".join(f"{geo[m][round(o, 6)]:.0%}" for m in modes) for o in OVERSUB) + " |")
    n_pass = {m: sum(v >= 0.9 for o in OVERSUB for v in shares[m][round(o, 6)]) for m in modes}
    lowest = {m: min(v for o in OVERSUB for v in shares[m][round(o, 6)]) for m in modes}
    quiet = "the base" if args.quiet_us is None else f"{args.quiet_us:g} us"
    quiet += ", a light one " + ("the base" if args.wait_us is None else f"{args.wait_us:g} us")
    text = (head + "\n" + "\n".join(rows) + "\n" + foot + "\n\n"
            "runner >= 90% of template's speedup: "
            + "; ".join(f"{label(m)} {n_pass[m]} of {len(names) * len(OVERSUB)} cells (lowest {lowest[m]:.1%})"
                        for m in modes)
            + f"; callback {args.callback_us:g} us a launch + {args.call_us:g} us a call, a quiet one {quiet}; "
            f"{time.perf_counter() - t_all:.0f} s in all.\n")
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
