"""Fit time with the solver's vectorized bound and without it, side by side in one run.

    python benchmarks/bench_solver.py [--workload serving] [--scale 0.5] [--seed 1] [--drop 0,0.01]
                                      [--markdown FILE]

`predict/formula.py`'s `_may_hold` spares the least-squares proposals that no constant can
hold their exact `check`; without it (the reference: every proposal checked one by one, as the
fitter did before it) `solve` returns the same formulas. Each trace (made once, `--drop` records
lost) is fitted in a fresh process twice, in turn, with the bound and with it switched off, so
the ratio holds on a loaded machine; the two model files must be identical (the benchmark fails
otherwise). Prints one JSON document; --markdown writes the table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import hashlib, json, sys, time, warnings
import numpy as np
from pagecast import trace as T
from pagecast.predict import formula as FM
from pagecast.predict.fit import fit_model
from pagecast.predict.model_io import save_model
if sys.argv[2] == "off":
    FM._may_hold = lambda G, cols, coefs, *a: np.ones(coefs.shape[:2], bool)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    tr = T.read_trace(sys.argv[1])
t0 = time.perf_counter()
m = fit_model([tr])
fit_s = time.perf_counter() - t0
m.created = ""
save_model(m, sys.argv[3], force=True)
doc = json.loads(open(sys.argv[3]).read())
doc.pop("created", None)
print(json.dumps({"fit_s": fit_s, "launches": tr.n_launches, "classes": m.summary()["kernels_by_class"],
                  "model_sha": hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="serving")
    ap.add_argument("--scale", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--drop", default="0,0.01")
    ap.add_argument("--markdown", default=None)
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "pagecast-bench-solver"))
    args = ap.parse_args()
    from pagecast.datasets.registry import reuse_or_make
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    rows = []
    for d in (float(x) for x in args.drop.split(",")):
        p = cache / f"{args.workload}-{args.scale:g}-{args.seed}-drop{d:g}.pctrace"
        reuse_or_make(args.workload, p, scale=args.scale, seed=args.seed, drop=d)
        got = {}
        for mode in ("on", "off"):
            out = subprocess.run([sys.executable, "-c", CHILD, str(p), mode, str(cache / f"model-{mode}.json")],
                                 capture_output=True, text=True, check=True)
            got[mode] = json.loads(out.stdout.strip().splitlines()[-1])
        same = got["on"]["model_sha"] == got["off"]["model_sha"]
        rows.append({"drop": d, "launches": got["on"]["launches"], "fit_s": got["on"]["fit_s"],
                     "reference_fit_s": got["off"]["fit_s"], "ratio": got["on"]["fit_s"] / got["off"]["fit_s"],
                     "same_model": same, "classes": got["on"]["classes"]})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        if not same:
            print(f"the models differ at drop {d:g}: the bound changed what the solver finds", file=sys.stderr)
            return 1
    print(json.dumps({"workload": args.workload, "scale": args.scale, "seed": args.seed, "rows": rows}, indent=1))
    if args.markdown:
        lines = [f"{args.workload} at scale {args.scale:g}, seed {args.seed}:", "",
                 "| record loss | launches | fit (bound) | fit (every proposal checked) | ratio | same model |",
                 "|---|---|---|---|---|---|"]
        lines += [f"| {r['drop']:.0%} | {r['launches']:,} | {r['fit_s']:.1f} s | {r['reference_fit_s']:.1f} s | "
                  f"{r['ratio']:.2f} | {'yes' if r['same_model'] else 'no'} |" for r in rows]
        Path(args.markdown).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
