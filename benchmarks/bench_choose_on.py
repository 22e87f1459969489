"""The planner's choices on a sample of the timeline (`--choose-on`) against choices on the whole.

    python benchmarks/bench_choose_on.py --work /tmp/choose-on

For each workload model (default: the LLM, MoE, sparse-solver, stencil and DNN models of
`pagecast datasets list`, whose planned runs choose among spans and alternatives): makes a fit trace (scale `--fit-scale`,
seed 2) and fits a model on it, makes the replayed trace (scale `--scale`, seed 1), then runs
`pagecast replay TRACE --policy demand,template,oracle --oversub 1.5,2,3 --model MODEL --json`
with `--choose-on 0` (every candidate plan compared on the whole timeline) and with each of
`--choose-on`'s values, one after the other in their own processes, this tree's code. Reports per
workload each run's wall and CPU time, and per policy and capacity the simulated time of the run
with sampled choices over the run with choices on the whole (1.0000: the same plan), the span and
what was left to faults each chose, and whether the whole JSON is the same byte for byte.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_replay_speed import run, tree_shim  # noqa: E402

WORKLOADS = ("llm-decode", "llm-prefill-decode", "moe-decode", "llm-paged-decode", "spmv-cg", "jacobi2d",
             "mlp-train", "cnn-infer")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=None, help="where traces and models go (default: a temporary dir)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--scale", type=float, default=10.0,
                    help="the replayed traces' scale (10: about 100,000 launches)")
    ap.add_argument("--fit-scale", type=float, default=1.0)
    ap.add_argument("--choose-on", default="32768", help="sample sizes to compare with 0, comma-separated")
    ap.add_argument("--policies", default="demand,template,oracle")
    ap.add_argument("--oversub", default="1.5,2,3")
    ap.add_argument("--markdown", default=None, help="write the tables here")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="pagecast-bench-choose-on-"))
    work.mkdir(parents=True, exist_ok=True)
    pp = tree_shim(work)
    sizes = [int(x) for x in args.choose_on.split(",")]
    times = ["| workload | launches | --choose-on | wall s | CPU s | JSON as with 0 |", "|---|---:|---:|---:|---:|---|"]
    runs = ["| workload | policy | oversub | --choose-on | time / time with 0 | span, faulted (0) | span, faulted |",
            "|---|---|---:|---:|---:|---|---|"]
    for wl in args.workloads.split(","):
        fit, model = work / f"{wl}-fit.pctrace", work / f"{wl}-model.json"
        tr = work / f"{wl}-s{args.scale:g}.pctrace"
        if not model.exists():
            if not fit.exists():
                run(["datasets", "make", wl, "--scale", f"{args.fit_scale:g}", "--seed", "2", "-o", str(fit)], pp)
            run(["fit", str(fit), "-o", str(model)], pp)
        if not tr.exists():
            run(["datasets", "make", wl, "--scale", f"{args.scale:g}", "--seed", "1", "-o", str(tr)], pp)
        base = ["replay", str(tr), "--policy", args.policies, "--oversub", args.oversub, "--model", str(model), "--json"]
        outs = {}
        for c in [0, *sizes]:
            wall, cpu, _, out = run(base + ["--choose-on", str(c)], pp)
            outs[c] = out
            rows = json.loads(out)
            n = rows[0]["launches"] if rows else 0
            same = "" if c == 0 else ("same" if out == outs[0] else "differs")
            times.append(f"| {wl} | {n:,} | {c} | {wall:.1f} | {cpu:.1f} | {same} |")
            print(times[-1], file=sys.stderr, flush=True)
        exact = json.loads(outs[0])
        for c in sizes:
            for x, y in zip(exact, json.loads(outs[c])):
                if x["policy"] == "demand":
                    continue
                ratio = y["time_s"] / x["time_s"] if x["time_s"] else 1.0
                runs.append(f"| {wl} | {x['policy']} | {x['oversub']:g} | {c} | {ratio:.4f} | "
                            f"{x.get('plan_span')}, {x.get('plan_faulted')} | {y.get('plan_span')}, {y.get('plan_faulted')} |")
                print(runs[-1], file=sys.stderr, flush=True)
    text = "\n".join(times) + "\n\n" + "\n".join(runs) + "\n"
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
