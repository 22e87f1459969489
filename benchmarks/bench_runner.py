"""The GPU runner's cost per launch, on the CPU: what its launch callback adds besides the CUDA calls,
the compiled path (the default) side by side with the Python path it replaced, in one run.

    python benchmarks/bench_runner.py [--workloads jacobi2d,llm-decode] [--launches 3000] [--markdown FILE]
                                      [--no-startup]

For each workload model: a model fitted on one trace (scale 0.25, seed 1), and
the first --launches launches of another (scale 0.5, seed 2) fed to the
runner's engine as the launch hook hands them over (`LaunchArgs`), with the
trace's allocations registered in a CUDA stand-in whose calls do nothing
(`NullCuda`: the engine's own work is what is timed, not CUDA's). Each figure is
per launch, timed launch by launch; `*_us` keys are medians (the bars of issue 18
are medians), `*_us_mean` means. Reported, for the compiled path at the top level
of each row and for the Python path under `reference` (the same keys):

- `predictor_us`: the predictor alone (compiled: `CompiledPredictor.predict_args`, the
  ranges left in its array; reference: `OnlinePredictor.predict`, a list of pages);
- `no_capacity` / `half_capacity`: the whole callback (`Engine.on_launch`) without a capacity
  and with an emulated capacity of half the footprint (template, victims by predicted next
  use), `callback_us`, and the runner's predict step (`predict_us_*`: what a GPU run
  reports as `predict_us_mean`: the prediction, allocation lookups, ranges in bytes);
- `half_capacity.parts`: the callback's parts, timed separately in another pass: the
  prediction (`predict_us`), the residency estimate (`residency_us`), issuing the calls
  (`calls_us`: the ranges cut per allocation, the stand-in's calls), and the launch hook's
  decode of the parameter bytes (`decode_us`: `decode_kernel_params` on a `void**` made
  from the trace's bytes, which runs in the callback on a GPU before the engine; the same
  code on both paths). What CUPTI's own Python callback costs is not measured: it needs a GPU;
- `startup`: seconds to make the predictor and the engine (numba compiles or loads its
  kernels there, not in the first launch), in fresh processes with an empty numba cache and
  with the cache filled (`--no-startup` skips it).

Issue 18's bars: prediction <= 1 us, whole callback with the emulated capacity <= 10 us
(medians); MSched's C predictor takes under 1 us.
"""

from __future__ import annotations

import argparse
import bisect
import ctypes
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))   # the CUDA stand-ins

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


def stats(us: list[float], key: str) -> dict:
    return {key: statistics.median(us), f"{key}_mean": statistics.fmean(us), f"{key}_p99": pct(us, 0.99)}


def timed_each(fn, items) -> list[float]:
    """fn(item) for every item, each timed (us); the garbage collector off, as a callback's
    few allocations rarely wake it (its passes are counted in neither path)."""
    out = []
    clock = time.perf_counter
    gc.collect()
    gc.disable()
    try:
        for x in items:
            t0 = clock()
            fn(x)
            out.append(1e6 * (clock() - t0))
    finally:
        gc.enable()
    return out


def kernel_params(la):
    """A `void**` kernelParams for the launch, as CUPTI hands the hook one (buffers kept alive)."""
    bufs = [ctypes.create_string_buffer(la.param(i), max(s, 1)) for i, s in enumerate(la.param_sizes)]
    arr = (ctypes.c_void_p * max(len(bufs), 1))(*[ctypes.addressof(b) for b in bufs])
    return arr, bufs


def engine(model, allocs, capacity, compiled: bool):
    from pagecast.replay.gpu import cuda_engine as E
    from pagecast.replay.online import prediction as GP
    return E.Engine(NullCuda(allocs), "template", capacity=capacity, compiled=compiled,
                    predict=GP.make_online_predict(model, compiled=compiled))


def callback(model, allocs, las, capacity, compiled: bool) -> dict:
    """The whole callback per launch, and the predict step as the engine records it."""
    eng = engine(model, allocs, capacity, compiled)
    steps: list[float] = []
    real = eng.predict

    def step(la, am, real=real):
        t0 = time.perf_counter()
        r = real(la, am)
        steps.append(1e6 * (time.perf_counter() - t0))
        return r

    for attr in ("clipped", "forget", "online", "last"):
        if hasattr(real, attr):
            setattr(step, attr, getattr(real, attr))
    us = timed_each(eng.on_launch, las)
    assert eng.stats.errors == 0, eng.stats.last_error
    eng = engine(model, allocs, capacity, compiled)   # the predict step, in a pass of its own
    eng.predict = step
    timed_each(eng.on_launch, las)
    out = stats(us, "callback_us")
    out.update({"predict_us_mean": statistics.fmean(steps), "predict_us_p50": pct(steps, 0.5),
                "predict_us_p99": pct(steps, 0.99), "predict_us_max": max(steps)})
    return out


def parts(model, allocs, las, capacity, compiled: bool) -> dict:
    """The callback's parts, each timed where the engine calls it, summed per launch."""
    eng = engine(model, allocs, capacity, compiled)
    keys = ("predict_us", "residency_us", "calls_us")
    cur = dict.fromkeys(keys, 0.0)
    got: dict[str, list[float]] = {k: [] for k in keys}
    clock = time.perf_counter

    def timing(fn, key):
        def inner(*a, **k):
            t0 = clock()
            r = fn(*a, **k)
            cur[key] += 1e6 * (clock() - t0)
            return r
        return inner

    pred = eng.predict
    timed_pred = timing(pred, "predict_us")
    for attr in ("clipped", "forget", "online", "last"):
        if hasattr(pred, attr):
            setattr(timed_pred, attr, getattr(pred, attr))
    eng.predict = timed_pred
    res = eng.residency
    if compiled:
        res.step_arrays = timing(res.step_arrays, "residency_us")
    else:   # Residency's part of a launch: missing, admit, and the next-use record between them
        res.missing = timing(res.missing, "residency_us")
        res.admit = timing(res.admit, "residency_us")
        rec = eng.decider._seq_next
        rec.record = timing(rec.record, "residency_us")
    eng._calls = timing(eng._calls, "calls_us")   # evictions and prefetches

    def launch(la):
        for k in keys:
            cur[k] = 0.0
        eng.on_launch(la)
        for k in keys:
            got[k].append(cur[k])

    timed_each(launch, las)
    assert eng.stats.errors == 0, eng.stats.last_error
    out = {}
    for k, v in got.items():
        out[k] = statistics.median(v)
        out[k + "_mean"] = statistics.fmean(v)
    issuing = [x for x in got["calls_us"] if x > 0]   # most launches find their prediction resident
    out["calls_us_issuing"] = statistics.median(issuing) if issuing else 0.0
    out["launches_issuing"] = len(issuing)
    return out


def decode(las, compiled: bool) -> dict:
    """The launch hook's decode of the parameter bytes: compiled (param_gather) or ctypes."""
    from pagecast.collect.launch_hook import decode_kernel_params, decode_kernel_params_ctypes
    fn = decode_kernel_params if compiled else decode_kernel_params_ctypes
    made = [kernel_params(la) for la in las]
    # the layout as the hook holds it: tuples cached per function
    ptrs = [(ctypes.addressof(arr), tuple(la.param_offsets), tuple(la.param_sizes)) for (arr, _), la in zip(made, las)]
    for (p, o, s), la in zip(ptrs, las):
        assert fn(p, o, s) == la.param_data[:len(fn(p, o, s))]
    us = timed_each(lambda x: fn(*x), ptrs)
    return {"decode_us": statistics.median(us), "decode_us_mean": statistics.fmean(us)}


def predictor(model, allocs, las, compiled: bool) -> dict:
    from pagecast.predict.compiled import CompiledPredictor
    from pagecast.predict.predictor import OnlinePredictor
    op = (CompiledPredictor if compiled else OnlinePredictor)(model, "history").warm()
    for a, s in allocs:
        op.add_allocation(a, s)
    if compiled:
        us = timed_each(lambda la: op.predict_args(la, la.param_data), las)
    else:
        us = timed_each(lambda la: op.predict(la.kernel, la.param_data, la.param_offsets, la.param_sizes,
                                              la.grid, la.block), las)
    return stats(us, "predictor_us")


STARTUP = """
import sys, time, json
sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
t0 = time.perf_counter()
from pagecast.predict.model_io import load_model
from pagecast.replay.gpu import cuda_engine as E
from pagecast.replay.online import prediction as GP
from cuda_standin import InertCuda
class NoAllocations(InertCuda):
    def allocation_of(self, addr):
        return None
t1 = time.perf_counter()
model = load_model({model!r})
t2 = time.perf_counter()
pred = GP.make_online_predict(model, compiled={compiled})
eng = E.Engine(NoAllocations(), "template", capacity=1 << 30, predict=pred, compiled={compiled})
t3 = time.perf_counter()
print(json.dumps({{"import_s": t1 - t0, "load_s": t2 - t1, "start_s": t3 - t2}}))
"""


def startup(model, work: Path, name: str) -> dict:
    """Seconds to import, load the model and start the predictor and engine, in fresh processes:
    compiled with an empty numba cache, compiled with it filled, and the reference."""
    from pagecast.predict.model_io import save_model
    path = save_model(model, work / f"{name}.model.json", force=True)
    cache = work / f"numba-cache-{name}"   # empty: the first run compiles, the second loads
    out = {}
    for label, compiled in (("compiled_cold", True), ("compiled_cached", True), ("reference", False)):
        code = STARTUP.format(root=str(ROOT), tests=str(ROOT / "tests"), model=str(path), compiled=compiled)
        env = dict(os.environ, NUMBA_CACHE_DIR=str(cache))
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        out[label] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def measure(workload: str, n: int, work: Path, with_startup: bool) -> dict:
    from pagecast import trace as T
    from pagecast.collect.launch_hook import LaunchArgs
    from pagecast.datasets.registry import make_trace
    from pagecast.predict.fit import fit_model

    small = T.read_trace(make_trace(workload, work / f"{workload}-fit.pctrace", scale=0.25, seed=1))
    big = T.read_trace(make_trace(workload, work / f"{workload}-run.pctrace", scale=0.5, seed=2))
    model = fit_model([small])
    allocs = [(int(a[T.ADDRESS]), int(a[T.BYTES])) for a in big.allocations.to_pylist()]
    las = [LaunchArgs.from_row(r, stream=7) for r in big.launches.slice(0, n).to_pylist()]
    half = sum(s for _, s in allocs) // 2
    row: dict = {"workload": workload, "launches": len(las), "kernels": len(model.kernels)}
    ref: dict = {}
    for compiled, out in ((True, row), (False, ref)):
        out.update(predictor(model, allocs, las, compiled))
        out["no_capacity"] = callback(model, allocs, las, None, compiled)
        out["half_capacity"] = callback(model, allocs, las, half, compiled)
        out["half_capacity"]["parts"] = parts(model, allocs, las, half, compiled)
    row["half_capacity"]["parts"].update(decode(las, True))
    ref["half_capacity"]["parts"].update(decode(las, False))
    row["reference"] = ref
    row["speedup"] = {"predictor": ref["predictor_us"] / row["predictor_us"],
                      "callback_no_capacity": ref["no_capacity"]["callback_us"] / row["no_capacity"]["callback_us"],
                      "callback_half_capacity": ref["half_capacity"]["callback_us"] / row["half_capacity"]["callback_us"]}
    if with_startup:
        row["startup"] = startup(model, work, workload)
    return row


def markdown(rows: list[dict]) -> str:
    lines = ["| workload | path | predictor alone | whole callback, no capacity | whole callback, half capacity"
             " (mean, p99) | half capacity: prediction / residency / calls (launches that call) |",
             "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        for label, x in (("compiled", r), ("Python (before)", r["reference"])):
            p, h = x["half_capacity"]["parts"], x["half_capacity"]
            lines.append(f"| {r['workload']} ({r['launches']:,} launches) | {label} | {x['predictor_us']:.2f} us | "
                         f"{x['no_capacity']['callback_us']:.1f} us | {h['callback_us']:.1f} us "
                         f"({h['callback_us_mean']:.1f}, {h['callback_us_p99']:.0f}) | "
                         f"{p['predict_us']:.2f} / {p['residency_us']:.2f} / {p['calls_us_issuing']:.2f} us "
                         f"({p['launches_issuing']:,}) |")
    lines += ["", "| workload | speedup: predictor | callback, no capacity | callback, half capacity |"
              " decode of the parameter bytes (launch hook): compiled / ctypes |", "|---|---:|---:|---:|---:|"]
    for r in rows:
        s = r["speedup"]
        lines.append(f"| {r['workload']} | {s['predictor']:.1f}x | {s['callback_no_capacity']:.1f}x | "
                     f"{s['callback_half_capacity']:.1f}x | {r['half_capacity']['parts']['decode_us']:.2f} / "
                     f"{r['reference']['half_capacity']['parts']['decode_us']:.2f} us |")
    if all("startup" in r for r in rows):
        lines += ["", "| workload | start-up: compiled, empty numba cache | compiled, cache filled | Python |",
                  "|---|---:|---:|---:|"]
        for r in rows:
            s = r["startup"]
            lines.append(f"| {r['workload']} | {s['compiled_cold']['start_s']:.2f} s | "
                         f"{s['compiled_cached']['start_s']:.2f} s | {s['reference']['start_s']:.3f} s |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="jacobi2d,llm-decode")
    ap.add_argument("--launches", type=int, default=3000)
    ap.add_argument("--markdown", help="also write the markdown tables here")
    ap.add_argument("--no-startup", action="store_true", help="skip the start-up measurement")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        rows = [measure(w, args.launches, Path(d), not args.no_startup) for w in args.workloads.split(",")]
    doc = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
           "python": platform.python_version(), "rows": rows}
    print(json.dumps(doc, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
