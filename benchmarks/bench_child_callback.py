"""Host time of the GPU runner's launch callback, through the child's own path, on the CPU.

    python benchmarks/bench_child_callback.py [--llm-launches 100000] [--markdown FILE] [--quick]

`python -m pagecast.replay.gpu.child JOB.json` is what `pagecast replay --backend gpu` runs per
measured run. Here `child_main` runs in this process with stand-ins for what needs a GPU: CUDA
(`BenchCuda`: the trace's allocations moved to other addresses, so that the oracle relocates
them; calls do nothing), the CUPTI monitor (no records) and the launch hook (`BenchHook`, whose
"workload" hands the child's callback the trace's launches, as `LaunchArgs`, and times each call:
the child's `hooked` -> `Engine.on_launch` -> `LaunchDecider.decide` -> the calls). The job is a
real `ChildJob`: the trace, the model, the policy and the capacity (200% of the trace's managed
memory), as `pagecast replay --backend gpu` writes it.

Cases: tests/data/h200/jacobi2d-1 (a real H200 trace, 108 launches, repeated 20 times by default
for stable medians) with a model fitted on jacobi2d-0.25 and -0.5; and a model llm-decode trace
of about `--llm-launches` launches (pagecast datasets, scale launches / 10^4) with a model fitted
on its scale 0.25. Policies demand, template, oracle; each on three paths, run in turn (one child
run of each before the next repeat, so that a loaded machine's drift falls on all three):

- `off`: the lookahead off (`ReplayRequest(lookahead=False)`, `--no-lookahead`);
- `before`: the lookahead with its Python step (`decide.LOOKAHEAD_STEP = "python"`: one launch
  ahead, units counted and split in Python sets, the plan's Belady scores one Python call per
  candidate), the code before the lookahead's step was compiled;
- `now`: the lookahead as it runs by default (`LOOKAHEAD_STEP = "compiled"`: the window looked up,
  fitted, relocated and split in compiled calls; the depth from the cost profile, msched-rtx5080
  here; dead data discarded where the driver has the call, which this stand-in has not);
- `planned` (template and oracle): a plan file (made here at the same capacity with the simulator's
  planners as the GPU replay makes them at start: template's `sim.sweep.make_plan`, `pagecast plan`'s;
  oracle's `make_truth_plan`, on the true footprints) given to the child (`--plan`): the engine carries out
  its `PlanSchedule` (online/planned.py), a lookup per callback and the calls, no decision; its quiet
  launches (nothing due: counted and returned) and the stream waits already covered left out;
- `planned-before`: the same with `cuda_engine.QUIET = False`: every launch through the full path and
  every wait issued, the engine before quiet launches.

Figures: median, mean and p99 us per launch. On the planned paths, also the calls each launch
issued (the prefetches to the GPU and to the host) and its events (records and stream waits), counted
and timed by replay/gpu/callback_timing.py (`CountingCuda`, `time_callbacks`, `fit_callbacks`), the
code `pagecast calibrate` times the planned callback with on the real driver: the launches with neither (nothing due) apart, their median what the
simulator's runner charges a quiet callback (`runner.QUIET_S`, the profile's `host_quiet_s`); those
with no call but an event (a wait) apart, their median what it charges a light one (`runner.WAIT_S`,
`host_wait_s`); and the others' host time fitted as base + per call x calls, by least squares and by a
line through the medians per call count (weighted by their launches): what it charges the others
(`runner.CALLBACK_S` / `CALL_S`, the profile's `host_launch_s` / `host_call_s`).
"""

from __future__ import annotations

import argparse
import bisect
import json
import platform
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))   # the CUDA stand-ins

from cuda_standin import InertCuda  # noqa: E402  (after the path)

from pagecast import trace as T  # noqa: E402
from pagecast.collect.launch_hook import LaunchArgs  # noqa: E402
from pagecast.replay.gpu import child as C  # noqa: E402
from pagecast.replay.gpu import cuda_engine as E  # noqa: E402
from pagecast.replay.gpu.callback_timing import (CallbackTimes, CountingCuda, fit_callbacks,  # noqa: E402
                                                 time_callbacks, trace_launches)
from pagecast.replay.gpu.cupti_monitor import UvmCounts  # noqa: E402
from pagecast.replay.online import decide as D  # noqa: E402
from pagecast.replay.online.ranges import Allocation  # noqa: E402
from pagecast.replay.request import ReplayRequest  # noqa: E402
from pagecast.replay.unit_space import managed_bytes  # noqa: E402

SHIFT = 1 << 36   # this run's allocations sit this far from the trace's (the oracle relocates)
POLICIES = ("demand", "template", "oracle")


class BenchCuda(InertCuda):
    """The trace's allocations at shifted addresses; calls that move memory do nothing (counted by
    the `CountingCuda` wrapped around it, replay/gpu/callback_timing.py)."""

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
    def synchronize(self): pass
    def mem_info(self): return 80 << 30, 80 << 30
    def device_info(self): return {"name": "BenchCuda (no GPU)", "index": 0, "memory_bytes": 80 << 30}


class NullMonitor:
    def start(self, keep_records=False, live=False, flush_every_s=None): pass
    def take(self): return [], []
    def take_migrations(self): return []
    def poll(self, force=False): return UvmCounts()
    def stop(self): return UvmCounts()


class BenchHook:
    """The launch hook's stand-in: the workload module calls `current.on_launch(la)`."""

    current = None

    def __init__(self, on_launch, api_callbacks=None):
        self.on_launch = on_launch
        self.errors = 0

    def start(self):
        BenchHook.current = self
        return self

    def stop(self):
        BenchHook.current = None


def shifted_launches(tr, repeat: int = 1) -> list[LaunchArgs]:
    """The trace's launches as the hook hands them over, pointer words moved by SHIFT."""
    al = tr.allocations
    moved = {int(a): int(a) + SHIFT for a in al.column(T.ADDRESS).to_pylist()}
    return trace_launches(tr, moved, stream=7) * repeat


PATHS = {"off": (False, "compiled"), "before": (True, "python"), "now": (True, "compiled"),
         "planned-before": (True, "compiled"), "planned": (True, "compiled")}
PLAN_PATHS = ("planned-before", "planned")   # a plan given to the child (planned-before: QUIET off)
PLANNED = ("template", "oracle")   # the policies a plan is made for at the start of a GPU replay


def run_child(trace_path: Path, model_path: Path, policy: str, capacity: int, las: list, allocs, tmp: Path,
              path: str, plan: Path | None = None, calls: list[int] | None = None,
              events: list[int] | None = None) -> tuple[list[float], dict]:
    """One child run (child_main, in this process) over `las` on `path` (PATHS): each launch's
    callback time (us) and the run's result; `calls`, where given, gets each launch's number of
    calls that move memory, `events` its event records and stream waits."""
    mod = types.ModuleType("pagecast_bench_workload")
    cuda = CountingCuda(BenchCuda(allocs))
    got = CallbackTimes()

    def run():   # the shared timing loop (replay/gpu/callback_timing.py), as calibrate runs it
        time_callbacks(BenchHook.current.on_launch, las, cuda, got)

    mod.run = run
    sys.modules[mod.__name__] = mod
    script = tmp / "work.py"
    script.write_text("import pagecast_bench_workload as W\nW.run()\n")
    lookahead, step = PATHS[path]
    req = ReplayRequest(backend="gpu", policies=(policy,), capacity=(capacity,), traces=(str(trace_path),),
                        model=str(model_path), workload=("python", str(script)), lookahead=lookahead,
                        plan=str(plan) if path in PLAN_PATHS else None)
    res = tmp / f"r-{policy}.json"
    job = tmp / "job.json"
    job.write_text(C.ChildJob(request=req, result=str(res)).to_json())
    old = D.LOOKAHEAD_STEP
    D.LOOKAHEAD_STEP = step
    E.QUIET = path != "planned-before"
    try:
        code = C.child_main([str(job)], cuda=cuda, monitor=NullMonitor(), hook_factory=BenchHook)
    finally:
        D.LOOKAHEAD_STEP = old
        E.QUIET = True
    out = json.loads(res.read_text())
    assert code == 0, out
    if calls is not None:
        calls += got.calls
    if events is not None:
        events += got.events
    return [1e6 * x for x in got.seconds], out


def summary(times: list[float], out: dict) -> dict:
    xs = sorted(times)
    return {"median_us": statistics.median(xs), "mean_us": statistics.fmean(xs), "p99_us": xs[int(0.99 * (len(xs) - 1))],
            "launches": len(xs), "prefetch_bytes": out["prefetch_bytes"], "evict_bytes": out["evict_bytes"],
            "ahead_launches": out.get("ahead_launches"), "lookahead": out.get("lookahead"),
            "planned": out.get("planned"), "plan_fallbacks": out.get("plan_fallbacks"),
            "plan_unmapped_bytes": out.get("plan_unmapped_bytes"), "quiet_launches": out.get("quiet_launches"),
            "warnings": [w for w in out.get("warnings", []) if "failed" in w or "no longer matches" in w]}


def fit_calls(times: list[float], calls: list[int], events: list[int]) -> dict:
    """Host time per launch (us) by kind, fitted by `callback_timing.fit_callbacks` (as calibrate
    fits it): nothing due, a wait only, and the others' base + per call x the calls they issued."""
    f = fit_callbacks(CallbackTimes([1e-6 * x for x in times], list(calls), list(events)))

    def us(x):
        return None if x is None else 1e6 * x

    out = {"nothing_due": {"launches": f.quiet_n, "median_us": us(f.quiet_s)},
           "waits_only": {"launches": f.wait_n, "median_us": us(f.wait_s)}}
    if not f.calls_n:
        return out
    return {**out, "lsq_base_us": us(f.lsq_base_s), "lsq_per_call_us": us(f.lsq_per_call_s),
            "median_base_us": us(f.median_base_s), "median_per_call_us": us(f.median_per_call_s),
            "calls_mean": f.calls_mean, "by_calls": {k: {"launches": n, "median_us": us(m)}
                                                     for k, (n, m) in f.by_calls.items()}}


def case(name: str, trace_path: Path, fit_paths: list[Path], runs: int, tmp: Path) -> dict:
    from pagecast.predict.fit.model import fit_model
    from pagecast.predict.model_io import save_model

    tr = T.read_trace(trace_path)
    model_path = tmp / f"{name}.model.json"
    save_model(fit_model([T.read_trace(p) for p in fit_paths]), model_path, force=True)
    capacity = max(1, managed_bytes(tr) // 2)
    al = tr.allocations
    allocs = [(a + SHIFT, n) for a, n in zip(al.column(T.ADDRESS).to_pylist(), al.column(T.BYTES).to_pylist())]
    las = shifted_launches(tr)
    out = {"trace": trace_path.name, "launches": tr.n_launches, "child_runs": runs, "capacity_bytes": capacity,
           "policies": {}}
    from pagecast.predict.model_io import load_model
    from pagecast.replay.policies import POLICIES as REGISTRY
    from pagecast.replay.sim.sweep import make_plan, make_truth_plan

    plans = {}
    for policy in PLANNED:   # each made as `pagecast replay --backend gpu` makes it at start (commands.gpu_planner)
        t0 = time.perf_counter()
        if REGISTRY[policy].places == "truth":
            plan = make_truth_plan(REGISTRY[policy], tr, capacity=capacity)
        else:
            plan = make_plan(load_model(model_path), tr, capacity=capacity, model_path=str(model_path))
        plans[policy] = plan.save(tmp / f"{name}.{policy}.plan", force=True)
        out[f"{policy}_plan_s"] = time.perf_counter() - t0
        out[f"{policy}_plan_rows"] = plan.table.num_rows
    for policy in POLICIES:
        paths = [p for p in PATHS if p not in PLAN_PATHS or policy in PLANNED]
        times: dict[str, list[float]] = {p: [] for p in paths}
        ncalls: dict[str, list[int]] = {p: [] for p in PLAN_PATHS}   # the planned paths' calls per launch
        nevents: dict[str, list[int]] = {p: [] for p in PLAN_PATHS}  # ... and events
        last: dict[str, dict] = {}
        for _ in range(runs):     # each a fresh child run over the trace's launches, the paths in turn
            for path in paths:
                t, last[path] = run_child(trace_path, model_path, policy, capacity, las, allocs, tmp, path,
                                          plans.get(policy), ncalls.get(path), nevents.get(path))
                times[path] += t
        row = {p: summary(times[p], last[p]) for p in paths}
        for p in PLAN_PATHS:
            if p not in row:
                continue
            f = row[p]["calls_fit"] = fit_calls(times[p], ncalls[p], nevents[p])
            nd, wo = f["nothing_due"], f["waits_only"]
            print(f"{name} {policy} {p}: nothing due {nd['median_us']:.2f} us ({nd['launches']} launches);"
                  f" a wait only {wo['median_us']:.2f} us ({wo['launches']}); the launches with calls base {f['lsq_base_us']:.2f} us + {f['lsq_per_call_us']:.2f} us a call"
                  f" (least squares), {f['median_base_us']:.2f} + {f['median_per_call_us']:.2f} (medians by call"
                  f" count); {f['calls_mean']:.2f} calls a launch; medians by calls "
                  + ", ".join(f"{k}: {v['median_us']:.1f} us ({v['launches']})" for k, v in f["by_calls"].items()),
                  file=sys.stderr, flush=True)
        row["ratio_before_now"] = row["before"]["median_us"] / row["now"]["median_us"]
        if "planned" in row:
            assert row["planned"]["planned"] and row["planned-before"]["planned"], row["planned"]
            row["ratio_now_planned"] = row["now"]["median_us"] / row["planned"]["median_us"]
            row["ratio_planned_before_now"] = row["planned-before"]["median_us"] / row["planned"]["median_us"]
        out["policies"][policy] = row
        print(f"{name} {policy}: off {row['off']['median_us']:.1f} us, before {row['before']['median_us']:.1f} us,"
              f" now {row['now']['median_us']:.1f} us (x{row['ratio_before_now']:.2f})"
              + (f", planned before {row['planned-before']['median_us']:.1f} us, planned"
                 f" {row['planned']['median_us']:.1f} us (x{row['ratio_now_planned']:.2f} vs now,"
                 f" x{row['ratio_planned_before_now']:.2f} vs before)" if "planned" in row else "")
              + f"; evicted {row['before']['evict_bytes']} / {row['now']['evict_bytes']} B", file=sys.stderr, flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llm-launches", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=20, help="child runs over jacobi2d-1 per policy and path")
    ap.add_argument("--json", default=None)
    ap.add_argument("--skip-llm", action="store_true")
    ap.add_argument("--llm-repeat", type=int, default=1, help="child runs over the llm-decode trace per policy and path")
    a = ap.parse_args(argv)
    from pagecast.datasets.registry import make_trace

    data = ROOT / "tests" / "data" / "h200"
    res = {"machine": f"{platform.node()} ({platform.processor() or platform.machine()}), Python "
                      f"{platform.python_version()}", "cases": {}}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        res["cases"]["jacobi2d-1"] = case("jacobi2d-1", data / "jacobi2d-1.pctrace",
                                          [data / "jacobi2d-0.25.pctrace", data / "jacobi2d-0.5.pctrace"],
                                          a.repeat, tmp)
        if not a.skip_llm:
            big = tmp / "llm.pctrace"
            make_trace("llm-decode", big, scale=a.llm_launches / 10_000, seed=2)
            small = tmp / "llm-fit.pctrace"
            make_trace("llm-decode", small, scale=0.25, seed=1)
            res["cases"]["llm-decode"] = case("llm-decode", big, [small], a.llm_repeat, tmp)
    text = json.dumps(res, indent=1)
    print(text)
    if a.json:
        Path(a.json).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
