"""The GPU runner's cost per launch, on the CPU: what its launch callback adds besides the CUDA calls.

    python benchmarks/bench_runner.py [--workloads jacobi2d,llm-decode] [--launches 5000] [--markdown FILE]

For each workload model: a model fitted on one trace (scale 0.25, seed 1), and
the first --launches launches of another (scale 0.5, seed 2) fed to the
runner's engine as the launch hook hands them over (`LaunchArgs`), with the
trace's allocations registered in a CUDA stand-in whose calls do nothing
(`NullCuda`: the engine's own work is what is timed, not CUDA's). Reported:

- the predictor alone (`OnlinePredictor.predict`);
- the runner's predict step (what `predict_us_mean` measures on a GPU: the
  prediction, allocation lookups, ranges in bytes), mean / p50 / p99 / max;
- the whole callback without a capacity (template) and with an emulated
  capacity of half the footprint (template, victims by predicted next use).

Issue 6's budget is 20 us for the online prediction per launch.
"""

from __future__ import annotations

import argparse
import bisect
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))   # the CUDA stand-ins

from cuda_standin import InertCuda  # noqa: E402  (after the path)

from pagecast.replay.online.ranges import Allocation  # noqa: E402


class NullCuda(InertCuda):
    """Allocations answered from a sorted table; every call that would move memory does nothing."""

    def __init__(self, allocs: list[tuple[int, int]]) -> None:
        super().__init__()
        allocs = sorted(allocs)
        self._bases = [a for a, _ in allocs]
        self._allocs = [Allocation(a, n, True) for a, n in allocs]

    def allocation_of(self, addr: int):
        i = bisect.bisect_right(self._bases, addr) - 1
        if i >= 0 and addr < self._allocs[i].base + self._allocs[i].size:
            return self._allocs[i]
        return None

    def prefetch_to_gpu(self, addr, nbytes, stream=0): pass
    def prefetch_to_host(self, addr, nbytes, stream=0): pass


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def measure(workload: str, n: int, work: Path) -> dict:
    from pagecast import trace as T
    from pagecast.collect.launch_hook import LaunchArgs
    from pagecast.datasets.registry import make_trace
    from pagecast.predict.fit import fit_model
    from pagecast.replay.gpu import cuda_engine as E
    from pagecast.replay.online import prediction as GP

    small = T.read_trace(make_trace(workload, work / f"{workload}-fit.pctrace", scale=0.25, seed=1))
    big = T.read_trace(make_trace(workload, work / f"{workload}-run.pctrace", scale=0.5, seed=2))
    model = fit_model([small])
    allocs = [(int(a[T.ADDRESS]), int(a[T.BYTES])) for a in big.allocations.to_pylist()]
    las = [LaunchArgs.from_row(r, stream=7) for r in big.launches.slice(0, n).to_pylist()]
    out = {"workload": workload, "launches": len(las), "kernels": len(model.kernels)}

    # the predictor alone (allocations known up front)
    pred = GP.make_online_predict(model)
    op = pred.online
    for a, s in allocs:
        op.add_allocation(a, s)
    t = time.perf_counter()
    for la in las:
        op.predict(la.kernel, la.param_data, la.param_offsets, la.param_sizes, la.grid, la.block)
    out["predictor_us"] = 1e6 * (time.perf_counter() - t) / len(las)

    for label, capacity in (("no_capacity", None), ("half_capacity", sum(s for _, s in allocs) // 2)):
        eng = E.Engine(NullCuda(allocs), "template", capacity=capacity, predict=GP.make_online_predict(model))
        steps = []
        real = eng.predict

        def timed(la, am, real=real, steps=steps):
            t0 = time.perf_counter()
            r = real(la, am)
            steps.append(time.perf_counter() - t0)
            return r

        for attr in ("clipped", "forget", "online"):
            if hasattr(real, attr):
                setattr(timed, attr, getattr(real, attr))
        eng.predict = timed
        t = time.perf_counter()
        for la in las:
            eng.on_launch(la)
        wall = time.perf_counter() - t
        assert eng.stats.errors == 0, eng.stats.last_error
        us = [1e6 * s for s in steps]
        out[label] = {"callback_us": 1e6 * wall / len(las), "predict_us_mean": sum(us) / len(us),
                      "predict_us_p50": pct(us, 0.5), "predict_us_p99": pct(us, 0.99), "predict_us_max": max(us)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="jacobi2d,llm-decode")
    ap.add_argument("--launches", type=int, default=5000)
    ap.add_argument("--markdown", help="also write a small markdown table here")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        rows = [measure(w, args.launches, Path(d)) for w in args.workloads.split(",")]
    doc = {"machine": platform.processor() or platform.machine(), "python": platform.python_version(), "rows": rows}
    print(json.dumps(doc, indent=1))
    if args.markdown:
        lines = ["| workload | predictor alone | runner predict step: mean / p50 / p99 / max | whole callback, "
                 "no capacity | whole callback, half capacity |", "|---|---:|---:|---:|---:|"]
        for r in rows:
            a, b = r["no_capacity"], r["half_capacity"]
            lines.append(f"| {r['workload']} ({r['launches']:,} launches) | {r['predictor_us']:.1f} us | "
                         f"{a['predict_us_mean']:.1f} / {a['predict_us_p50']:.1f} / {a['predict_us_p99']:.1f} / "
                         f"{a['predict_us_max']:.0f} us | {a['callback_us']:.1f} us | {b['callback_us']:.1f} us |")
        Path(args.markdown).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
