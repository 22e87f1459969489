"""Sweeps: policies x capacities on one or more traces, in the simulator, and `pagecast plan`.

`simulate(request)` is what `pagecast replay --backend sim` runs: it reads the
request's traces and model (request.ReplayRequest, validated when it was made)
and hands them to `replay_sim(...)`, the library's form that the demo and the
benchmarks call with traces and a model already loaded. It builds the workload
once, runs every (policy, capacity) pair, and returns the run rows (cli.md's
`replay --json` fields and more) and the per-launch timeline table. `make_plan(...)` is `pagecast plan`: the template policy's
plan for one trace, its span chosen by trial runs of this simulator; `make_truth_plan(...)` the
oracle's own plan on the trace's true footprints (both made at the start of a GPU replay too).

Long because the planners share the sweep's workload building, capacities and trial runs, and a
plan made outside the sweep must be made as the sweep makes it.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, as_completed
from dataclasses import dataclass
from dataclasses import replace as dataclass_replace
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa

from pagecast import trace as T
from pagecast.errors import UsageError
from pagecast.memory import return_freed_arrays
from pagecast.predict.model_io import load_model

from ..cells import Cells
from ..costs import CostProfile, load_profile, replace
from ..placement import HostRanges, host_candidates, host_split
from ..plan import plan_io
from ..plan.adaptive import predicted_gated
from ..plan.alternatives import blind_ahead, value_alternatives
from ..plan.plan_rows import groups_from_plan, groups_to_table, launches_table, plan_footprints, plan_model_predictions
from ..plan.sample import CHOOSE_ON, best_plan_on, choose_span_on
from ..plan.spans import PLAN_SPANS, span_needs
from ..policies import POLICIES, Template, add_relative, check_policies
from ..policies.base import Options, ReplaySetup, plan_trial
from ..request import OVERSUB_OF, SPANS, ReplayRequest, check_capacity, check_oversub, check_unit
from ..results_io import timeline_table
from ..unit_space import I64, Workload, build_workload
from . import kernels as C
from .bound import lower_bound
from .uvm_driver import DriverRules, service_granularity
from .run import RUN_ONLY, RunResult, compact, run_policy, step_compute, summarize
from .stack import demand_lru_all

@dataclass
class SimConfig:
    costs: str | Path | CostProfile = "msched-rtx5080"
    granularity: int | None = None
    eviction_unit: int | None = None
    eviction: str = "driver"     # the fault path's victim order (uvm_driver.VICTIM_ORDERS)
    driver_prefetch: bool = True
    timeslice_ms: float = 10.0
    feedback: bool = False
    fallback: str = "adaptive"   # plan/adaptive.py: history only where it proved precise
    span: str = "auto"           # what template and oracle plan on (plan/spans.py), or "auto": the fastest
    oversub_of: str = "managed"  # what --oversub R divides: managed bytes allocated, or "touched" footprint
    placement: str = "device"    # "auto": planned policies also try host placement (placement.py)
    # a sweep's (policy, capacity) runs go at once in this many threads (replay/cells.py; None: sweep_jobs).
    # One where a SimConfig is made in code (the demo runs its replays in processes already); the
    # replay command's default is None (--jobs; docs/performance.md, "Two rounds, runs at once")
    jobs: int | None = 1
    # with more launches than this, planned policies narrow their candidate plans on a sample of this
    # many launches and judge the survivors on the whole timeline (plan/sample.py); 0: every candidate
    # on the whole timeline
    choose_on: int = CHOOSE_ON

    @classmethod
    def of(cls, req: ReplayRequest) -> SimConfig:
        """The simulator's settings in a replay request."""
        return cls(costs=req.costs, granularity=req.granularity, eviction_unit=req.eviction_unit,
                   eviction=req.eviction, driver_prefetch=req.driver_prefetch, timeslice_ms=req.timeslice_ms,
                   feedback=req.feedback, fallback=req.fallback or cls.fallback, span=req.span,
                   oversub_of=req.oversub_of, placement=req.placement, choose_on=req.choose_on, jobs=req.jobs)

    def spans(self) -> tuple[str, ...]:
        return PLAN_SPANS if self.span == "auto" else (self.span,)

    def profile(self) -> CostProfile:
        p = load_profile(self.costs)
        ch = {}
        if self.granularity is not None:
            ch["granularity"] = int(self.granularity)
        elif not self.driver_prefetch:
            # with the prefetcher off a fault moves its own 4 KiB page (driver.service_granularity)
            ch["granularity"] = service_granularity(p.granularity, False)
        if self.eviction_unit is not None:
            ch["eviction_unit"] = int(self.eviction_unit)
        elif self.granularity is not None and self.granularity > p.eviction_unit:
            ch["eviction_unit"] = int(self.granularity)
        if ch:
            for k, v in ch.items():
                check_unit(f"--{k.replace('_', '-')}", v)
            if ch.get("eviction_unit", p.eviction_unit) < ch.get("granularity", p.granularity):
                raise UsageError("--eviction-unit must not be smaller than --granularity")
            p = replace(p, **ch)
        DriverRules(self.eviction)   # checks the victim order
        if self.span not in SPANS:
            raise UsageError(f"--span must be one of {', '.join(SPANS)}, not {self.span!r}")
        if self.oversub_of not in OVERSUB_OF:
            raise UsageError(f"--oversub-of must be one of {', '.join(OVERSUB_OF)}, not {self.oversub_of!r}")
        if self.choose_on < 0:
            raise UsageError(f"--choose-on must be a number of launches >= 0 (0: the whole timeline), not {self.choose_on}")
        if not (self.timeslice_ms >= 0):
            raise UsageError(f"--timeslice must be >= 0 ms, not {self.timeslice_ms}")
        return p


def capacities_for(footprint_bytes: int, capacity: list[int] | None, oversub: list[float] | None
                   ) -> list[tuple[int, float]]:
    """(capacity_bytes, oversubscription) pairs from --capacity or --oversub."""
    if (capacity is None) == (oversub is None):
        raise UsageError("give exactly one of --capacity SIZE,... and --oversub R,...")
    out = []
    if capacity is not None:
        for c in capacity:
            out.append((int(check_capacity(c)), footprint_bytes / c))
    else:
        for r in oversub:
            c = int(footprint_bytes / check_oversub(r))
            if c <= 0:
                raise UsageError(f"--oversub {r} leaves no capacity (footprint {footprint_bytes} bytes)")
            try:
                check_capacity(c)
            except UsageError:
                raise UsageError(f"--oversub {r} gives a capacity of {c} bytes, more than the simulator handles"
                                 " (1 EiB)") from None
            out.append((c, float(r)))
    return out


def simulate(req: ReplayRequest, *, progress=None, timeline: bool = True) -> tuple[list[dict], pa.Table | None]:
    """`pagecast replay --backend sim`: the request's traces and model read, then replay_sim."""
    # the records (faults, migrations: most of a trace) stay on disk, read a row group at a time
    traces = [T.read_trace(t, lazy=T.LAZY_TABLES).require_launches("replay") for t in req.traces]
    # the runs make and free per-use arrays of many sizes: each freed one goes back (pagecast/memory.py)
    return_freed_arrays()
    for p in sorted(q for q in set(req.policies) if POLICIES[q].reads_arguments):   # they read pointer arguments
        for t in traces:
            t.require_argument_bytes(f"policy {p}")
    model = load_model(req.model) if req.model else None
    return replay_sim(traces, list(req.policies), capacity=None if req.capacity is None else list(req.capacity),
                      oversub=None if req.oversub is None else list(req.oversub), config=SimConfig.of(req),
                      model=model, model_path=req.model, plan_path=req.plan, progress=progress, timeline=timeline)


def replay_sim(traces: list[T.Trace], policies: list[str], *, capacity: list[int] | None = None,
               oversub: list[float] | None = None, config: SimConfig | None = None, model=None,
               model_path: str | None = None, plan_path: str | None = None, progress=None,
               workload_name: str | None = None, timeline: bool = True) -> tuple[list[dict], pa.Table | None]:
    """Run every (policy, capacity) pair; return run rows and the per-launch timeline
    (None with timeline=False: it holds a row per launch per run)."""
    cfg = config or SimConfig()
    check_policies(policies)
    if not traces:
        raise UsageError("the simulator needs at least one TRACE")
    prof = cfg.profile()
    plan = None
    if plan_path is not None:
        if len(traces) != 1:
            raise UsageError("--plan is for one trace; with several traces give --model and plans are made on the fly")
        plan = plan_io.read_plan(plan_path, traces[0])
    # the policy that plans on the model's predictions (or follows a fixed plan): template
    plans_on_model = any(POLICIES[p].requires == "model-or-plan" for p in policies)
    # the policies that carry out a --plan given (template; the runner, without template too)
    follows = plan is not None and any(POLICIES[p].follows_plan for p in policies)
    for p in policies:
        need = POLICIES[p].requires
        if model is not None or (plan is not None and POLICIES[p].follows_plan):
            continue
        if need == "model-or-plan" or (need == "model" and POLICIES[p].follows_plan):
            raise UsageError(f"policy {p} needs --model MODEL or --plan PLAN")
        if need == "model":
            raise UsageError(f"policy {p} needs --model MODEL (it predicts as the GPU runner does)")
    extra = []
    predicted = None
    made_ahead = {}   # the template alternatives' blind predictions, made meanwhile where runs go at once
    if plans_on_model and model is not None and plan is None:
        if cfg.jobs != 1 and _cores() > 1 and not cfg.feedback:
            made_ahead = blind_ahead(model, traces, cfg.fallback)
        predicted = [predicted_gated(model, t, cfg.fallback) for t in traces]
        extra.append([fp for fp, _ in predicted])
    plan_pred = None
    if plan is not None:
        extra.append([plan_footprints(plan, traces[0])])
        plan_pred = plan_model_predictions(plan, traces[0], cfg.fallback)
        if plan_pred is not None:
            # the universe template planned on the fly has (its chunks' sizes set the planner's evictions)
            extra.append([plan_pred[0]])
    # allocations are always part of the universe (the alloc and swap policies move them)
    w = build_workload(traces, gran=prof.granularity, eviction_unit=prof.eviction_unit, profile=prof,
                       timeslice_s=cfg.timeslice_ms / 1e3, need_alloc=True, extra_fps=extra)
    w.extra.update(made_ahead)   # read (and waited for) where template first plans its alternatives
    basis = w.oversub_basis(cfg.oversub_of)
    caps = capacities_for(basis, capacity, oversub)
    if follows:
        plan_io.check_plan_capacity(plan, plan_path, caps, capacity is None)
    opts = Options(eviction=cfg.eviction, driver_prefetch=cfg.driver_prefetch, feedback=cfg.feedback,
                   choose_on=cfg.choose_on)
    tmpl = None
    fixed = None   # the plan's host placement (HostPlaced), where its manifest names one
    if plans_on_model or follows:
        if follows:
            span = plan.manifest.get("span", "unit")
            wt = w
            host = plan_io.host_ranges(plan)
            if len(host):
                fixed = HostPlaced(build_workload(traces, gran=prof.granularity, eviction_unit=prof.eviction_unit,
                                                  profile=prof, timeslice_s=cfg.timeslice_ms / 1e3, need_alloc=True,
                                                  extra_fps=extra, host=[host], steps=(w.step_task, w.step_launch)),
                                   host.nbytes)
                wt = fixed.w
            pneeds = None if plan_pred is None else span_needs(wt.gated_needs_from([plan_pred[0]], [plan_pred[1]]),
                                                               span, wt, max(plan.capacity_bytes // w.gran, 1), prof)
            tmpl = Template(plan_groups_fixed=groups_from_plan(plan, wt, pneeds), fallback=cfg.fallback)
            tmpl.fixed_needs, tmpl.fixed_span, tmpl.fixed_plan = pneeds, span, plan
            if cfg.feedback and plans_on_model:
                raise UsageError("--feedback needs --model (a fixed --plan cannot be refined)")
        else:
            tmpl = Template(model=model, fallback=cfg.fallback)
            w.extra[("predicted", id(model), cfg.fallback)] = predicted
    results: dict[tuple[str, int], RunResult] = {}
    placed_w: dict[str, Workload] = {}   # a policy's workload with its host placement (--placement auto)
    one_pass = (cfg.eviction == "lru" and prof.eviction_unit == prof.granularity and not cfg.driver_prefetch)
    setup = ReplaySetup(model=model, template=tmpl)
    cap_units = [c // w.gran for c, _ in caps]
    for c, cu in zip(caps, cap_units):
        if cu < 1:
            raise UsageError(f"capacity {c[0]} bytes is smaller than one migration unit ({w.gran} bytes)")
    jobs = cfg.jobs if cfg.jobs is not None else sweep_jobs(len(caps) * len(policies))
    # by default a policy's runs go one at a time (each policy holds one run's planner at most: its
    # peak alone is the one-by-one replay's), the policies' runs side by side; a --jobs given lets a
    # policy's capacities go at once too, where its runs keep nothing on the policy object
    # (docs/performance.md, "Two rounds, runs at once": template's peak alone then over 1.5x demand's)
    capacities_at_once = cfg.jobs is not None
    # without a timeline a finished run is kept as its summary reads it (run.compact)
    keep = (lambda r: r) if timeline else compact
    # per capacity, the runs of the policies that do not run last: (policy, future of its run)
    at_cap: dict[int, list[tuple[str, Future]]] = {cu: [] for cu in cap_units}
    groups = []   # per group (the policies that do not run last, those that do): its runs, its workloads
    comp = step_compute(w)
    with Cells(jobs) as cells:
        for last in (False, True):
            running: list[tuple[str, int, Future]] = []
            made_before: dict[int, tuple[Workload, set]] = {}   # the workloads the runs read, and their keys
            groups.append((running, made_before))
            for p in (q for q in policies if POLICIES[q].runs_last == last):
                cls = POLICIES[p]
                if cls.lru_one_pass and one_pass and len(caps) > 1:
                    for (c, _), cu, r in zip(caps, cap_units, demand_lru_all(w, cap_units, prof)):
                        results[(p, c)] = keep(r)
                        at_cap[cu].append((p, _done(results[(p, c)])))
                        if progress:
                            progress.advance()
                    continue
                pol = cls.for_replay(setup)
                if cls.chooses_span:
                    pol.spans = cfg.spans()
                # a plan that placed memory: template, and a policy carrying its plan out (the runner)
                follows_plan = fixed is not None and (cls.requires == "model-or-plan" or pol.carries_out_plan)
                placed = host_workload(w, traces, cls.places, predicted, extra, prof, cfg, model) \
                    if cfg.placement == "auto" and not follows_plan else None
                if placed is not None or follows_plan:
                    placed_w[p] = fixed.w if follows_plan else placed.w
                ws = [x for x in (w, None if placed is None else placed.w, fixed.w if follows_plan else None)
                      if x is not None]
                for x in ws:
                    made_before.setdefault(id(x), (x, set(x.extra)))

                def own_at(cu, pol=pol, placed=placed, follows_plan=follows_plan, ws=ws):
                    """The policy's runs at `cu`: with the driver's placement, and with its own (or None)."""
                    dev = keep(run_policy(fixed.w if follows_plan else w, pol, cu, prof, opts))
                    host = None if placed is None else keep(run_policy(placed.w, pol, cu, prof, opts))
                    for x in ws:
                        x.extra.pop(RUN_ONLY, None)   # the run's plan's next uses: the next run plans anew
                    return dev, host

                def judged(runs, rivals, placed=placed, follows_plan=follows_plan, cls=cls):
                    """Its run: each placement's judged with the rivals' (with_rivals), then the faster."""
                    dev, host = (cls.with_rivals(r, rivals) if r is not None else None for r in runs)
                    if follows_plan:
                        dev.extra["host_bytes"] = fixed.host_bytes
                    return dev if placed is None else placed.better(dev, host, cls.places)

                futures: list[Future] = []   # its run at each capacity
                owns: list[Future] = []      # its own runs (a policy that runs last: before the judging)
                at_once = capacities_at_once and cls.concurrent_capacities
                for cu in cap_units:
                    # each run after the policy's run before it, or (capacities at once) after its
                    # first, which makes what the others share (replay/cells.py)
                    after = () if not owns else (owns[0],) if at_once else (owns[-1],)
                    if not cls.runs_last:
                        owns.append(cells.submit(partial(_own_judged, own_at, judged, cu), after))
                        futures.append(owns[-1])
                        continue
                    # a policy that runs last (oracle) plans and runs beside the others; its run is
                    # judged with theirs at the same capacity once they are done
                    owns.append(cells.submit(partial(own_at, cu), after))
                    rival = tuple(at_cap[cu])
                    futures.append(cells.submit(partial(_judged_with, judged, owns[-1], rival),
                                                (owns[-1], *(f for _, f in rival))))
                for (c, _), cu, f in zip(caps, cap_units, futures):
                    running.append((p, c, f))
                    if not last:
                        at_cap[cu].append((p, f))
                del pol, placed, ws, own_at, judged, futures, owns   # these hold the policy and its placed workload
                if cells.inline:   # one at a time: a policy's keys go before the next policy is made
                    _collect(running, results, progress)
                    _forget(made_before)
        # the bounds read the truth alone: submitted last, they take a core the runs leave idle
        bounds = {c: cells.submit(partial(lower_bound, w, c // w.gran, prof, comp, tree=cfg.driver_prefetch))
                  for c, _ in caps}
        for running, made_before in groups:
            # what the runs made and kept on the workloads (a policy's needs, its predictions' needs)
            # is theirs: a later policy that reads it makes it again. The policies that run last may
            # be going already (Workload.kept: what they read is made again where it went)
            _collect(running, results, progress)
            _forget(made_before)
        bounds = {c: f.result() for c, f in bounds.items()}
    names = [t.name for t in w.tasks]
    wname = workload_name or "+".join(names)
    runs: list[dict] = []
    tl_parts = []
    kernels = _step_kernels(w) if timeline else None
    task_names = pa.array([t.name for t in w.tasks])
    for i, p in enumerate(policies):
        for c, r_over in caps:
            r = results[(p, c)]
            s = summarize(r, placed_w.get(p, w) if r.extra.get("host_bytes") else w, prof.faults_per_batch)
            run = {"policy": p, "backend": "sim", "capacity_bytes": int(c), "oversub": float(r_over), **s,
                   "lower_bound_s": bounds[c],
                   "oversub_of": "touched" if cfg.oversub_of == "touched" or w.managed_bytes <= 0 else "managed",
                   "managed_bytes": int(w.managed_bytes)}
            run.update({
                "footprint_bytes": int(w.footprint_bytes), "workload": wname, "tasks": names,
                "traces": [str(t.path) for t in traces], "costs": prof.name, "granularity": int(prof.granularity),
                "eviction_unit": int(prof.eviction_unit), "eviction": cfg.eviction,
                "driver_prefetch": bool(cfg.driver_prefetch), "timeslice_ms": float(cfg.timeslice_ms),
                "model": model_path, "plan": None if plan_path is None else str(plan_path),
                "feedback": bool(cfg.feedback and POLICIES[p].requires == "model-or-plan"), "run": len(runs),
            })
            if "feedback_changes" in r.extra:
                run["feedback_changes"] = int(r.extra["feedback_changes"])
            for k in ("plan_span", "plan_faulted", "oracle_plan", "oracle_own_s"):
                if k in r.extra:
                    run[k] = r.extra[k]
            if cfg.placement == "auto" or fixed is not None:
                run["host_bytes"] = int(r.extra.get("host_bytes", 0))   # 0: the driver's default placement
            runs.append(run)
            if timeline:
                tl_parts.append(_timeline(run["run"], p, c, r, w, kernels, task_names))
    add_relative(runs)
    if not timeline:
        return runs, None
    return runs, (pa.concat_tables(tl_parts) if tl_parts else timeline_table({}))


def sweep_jobs(n_cells: int) -> int:
    """How many of a sweep's (policy, capacity) runs go at once (cells.py): one per core this process
    may use, one per cell, and as many as the memory available holds, each taken to need what the
    process holds now (its workload; a run's planner makes per-use arrays of the needs' size:
    docs/performance.md, "Replay memory"). At least one."""
    held, avail = _memory_now()
    by_memory = max(int(avail // held), 1) if held and avail else 1
    return max(1, min(_cores(), n_cells, by_memory))


def _cores() -> int:
    """The cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _collect(running: list, results: dict, progress) -> None:
    """Each (policy, capacity, future) of `running` into `results` as it finishes (the first failure is
    raised), and `running` emptied."""
    by_future = {f: (p, c) for p, c, f in running}
    running.clear()
    for f in as_completed(by_future):
        results[by_future[f]] = f.result()
        if progress:
            progress.advance()


def _own_judged(own_at, judged, cu):
    return judged(own_at(cu), [])


def _judged_with(judged, own: Future, rivals: tuple) -> RunResult:
    """`own`'s runs judged with the rivals' runs at the same capacity, [(policy, future)], all done."""
    return judged(own.result(), [(q, f.result()) for q, f in rivals])


def _done(value) -> Future:
    f: Future = Future()
    f.set_result(value)
    return f


def _forget(made_before: dict) -> None:
    """Drop what was made on each workload's `extra` since its keys were taken; empty `made_before`."""
    for x, before in made_before.values():
        for k in set(x.extra) - before:
            x.extra.pop(k, None)   # a run going on may have let it go already (RUN_ONLY)
    made_before.clear()


def _memory_now() -> tuple[int, int]:
    """(this process's resident bytes, the system's available bytes), 0 where Linux's /proc does not say."""
    held = avail = 0
    try:
        with open("/proc/self/statm") as f:
            held = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return 0, 0
    return held, avail


@dataclass
class HostPlaced:
    """The workload with a policy's host candidates left on the host (placement.py), and how the
    policy chooses between its run there and its run with the driver's default placement."""

    w: Workload
    host_bytes: int

    def better(self, dev: RunResult, host: RunResult, places: str) -> RunResult:
        """`host` where the policy's own view says it is faster: its plan's trial run on its
        predictions ("predicted"), or the run itself ("truth"); else `dev`."""
        if places == "truth":
            a, b = float(dev.end[-1]) if len(dev.end) else 0.0, float(host.end[-1]) if len(host.end) else 0.0
        else:
            a, b = dev.extra.get("plan_trial_s"), host.extra.get("plan_trial_s")
            if a is None or b is None:   # no trial ran (no cost profile): nothing to judge on
                return dev
        if b < a:
            host.extra.setdefault("host_bytes", self.host_bytes)   # oracle may have taken a rival's run
            return host
        return dev


def host_workload(w: Workload, traces: list[T.Trace], places: str | None, predicted, extra, prof: CostProfile,
                  cfg: SimConfig, model) -> HostPlaced | None:
    """`w` rebuilt with the host candidates of a policy that `places` on its predictions or the
    truth (placement.host_candidates), or None where it places nothing or finds no candidate."""
    if places is None or (places == "predicted" and predicted is None):
        return None
    fps = [fp for fp, _ in predicted] if places == "predicted" else [t.truth for t in w.tasks]
    host = [host_candidates(t, fp, prof.eviction_unit) for t, fp in zip(traces, fps)]
    if not any(len(h) for h in host):
        return None
    wh = build_workload(traces, gran=prof.granularity, eviction_unit=prof.eviction_unit, profile=prof,
                        timeslice_s=cfg.timeslice_ms / 1e3, need_alloc=True, extra_fps=extra, host=host,
                        steps=(w.step_task, w.step_launch))   # the same launch order: runs and timelines line up
    if predicted is not None:
        wh.extra[("predicted", id(model), cfg.fallback)] = predicted
    if places == "predicted":
        predicted_link_time(wh, fps, prof)
    return HostPlaced(wh, sum(h.nbytes for h in host))


def predicted_link_time(wh: Workload, fps: list, prof: CostProfile) -> None:
    """Have the planner's trial runs on `wh` (base.plan_trial) charge the launches' host accesses as
    footprints `fps` (a policy's predictions) name them, not as the truth does: the run charges the
    truth's, the trial judging the placement knows only the predictions (`wh.extra["trial_tasks"]`)."""
    tasks = []
    for t, (task, fp) in enumerate(zip(wh.tasks, fps)):
        pred_s = prof.host_time(*host_split(fp, wh.host[t])[1:])
        tasks.append(dataclass_replace(task, compute_s=task.compute_s - task.host_s + pred_s, host_s=pred_s))
    wh.extra["trial_tasks"] = tasks


def _step_kernels(w: Workload) -> pa.Array:
    parts = []
    for t, task in enumerate(w.tasks):
        parts.append(task.trace.launches.column(T.KERNEL).combine_chunks())
    allk = pa.concat_arrays([p.cast(pa.string()) for p in parts]) if parts else pa.array([], pa.string())
    base = np.concatenate([[0], np.cumsum([t.trace.n_launches for t in w.tasks])]).astype(I64)
    idx = base[w.step_task] + w.step_launch
    return allk.take(pa.array(idx))


def _timeline(run: int, policy: str, cap: int, r: RunResult, w: Workload, kernels: pa.Array,
              task_names: pa.Array) -> pa.Table:
    n = w.n_steps
    c = r.counters
    gran = w.gran
    return timeline_table({
        "run": np.full(n, run, I64), "policy": pa.array([policy] * n, pa.string()) if n else pa.array([], pa.string()),
        "capacity_bytes": np.full(n, cap, I64), "task": w.step_task, "task_name": task_names.take(pa.array(w.step_task)),
        "launch_id": w.step_launch, "kernel": kernels, "start_s": r.start, "end_s": r.end, "stall_s": r.stall,
        "faults": c[:, C.C_FAULTS], "htod_bytes": (c[:, C.C_FAULT_IN] + c[:, C.C_TREE_IN] + c[:, C.C_PREFETCH_IN]) * gran,
        "dtoh_bytes": (c[:, C.C_FAULT_DTOH] + c[:, C.C_GROUP_DTOH]) * gran,
    })


def make_plan(model, trace: T.Trace, *, capacity: int | None = None, oversub: float | None = None,
              config: SimConfig | None = None, model_path: str | None = None) -> plan_io.Plan:
    """Belady plan on the model's predicted footprints -> the plan (its rows, lookahead per launch
    and manifest; `Plan.save` writes it)."""
    cfg = config or SimConfig()
    prof = cfg.profile()
    predicted, gates = predicted_gated(model, trace, cfg.fallback)
    w = build_workload([trace], gran=prof.granularity, eviction_unit=prof.eviction_unit, profile=prof,
                       need_alloc=True, extra_fps=[[predicted]])
    (cap, r), = capacities_for(w.oversub_basis(cfg.oversub_of), None if capacity is None else [capacity],
                               None if oversub is None else [oversub])
    cu = cap // w.gran
    if cu < 1:
        raise UsageError(f"capacity {cap} bytes is smaller than one migration unit ({w.gran} bytes)")
    opts = Options(eviction=cfg.eviction, driver_prefetch=cfg.driver_prefetch, choose_on=cfg.choose_on)
    span, needs, g, trial_s = _template_plan(w, model, trace, predicted, gates, cu, prof, opts, cfg)
    host = HostRanges.none()
    if cfg.placement == "auto":
        # as the sweep places template's memory (host_workload): kept where its trial is faster
        cand = host_candidates(trace, predicted, prof.eviction_unit)
        if len(cand):
            wh = build_workload([trace], gran=prof.granularity, eviction_unit=prof.eviction_unit, profile=prof,
                                need_alloc=True, extra_fps=[[predicted]], host=[cand],
                                steps=(w.step_task, w.step_launch))
            predicted_link_time(wh, [predicted], prof)
            hplan = _template_plan(wh, model, trace, predicted, gates, cu, prof, opts, cfg)
            if trial_s is not None and hplan[3] is not None and hplan[3] < trial_s:
                (span, needs, g, trial_s), w, host = hplan, wh, cand
    table = groups_to_table(g, needs, w)
    launches = launches_table(g, w)
    manifest = plan_io.new_manifest(trace=trace, capacity_bytes=cap, granularity=w.gran, model=model_path,
                                    oversub=r, costs=prof.name, fallback=cfg.fallback, span=span,
                                    thrashing_launches=int(g.thrash.sum()), faulted=int(g.faulted),
                                    prefetch_bytes=int(len(g.pf_unit) * w.gran),
                                    evict_bytes=int(len(g.ev_unit) * w.gran))
    if len(host):
        manifest[plan_io.HOST_RANGES] = [[int(a), int(b)] for a, b in zip(host.start, host.end)]
    return plan_io.Plan(table, manifest, None, launches)


def make_truth_plan(policy, trace: T.Trace, *, capacity: int, config: SimConfig | None = None
                    ) -> plan_io.Plan:
    """The own plan of a planned policy that plans on the truth (`places == "truth"`: oracle,
    policies/oracle.py): Belady on the trace's true footprints, at the span (and with what is left
    to faults) its trial runs find fastest, as the simulator's Planned.prefetch makes it -> the plan
    (rows, lookahead per launch, manifest). Oracle's rivals' runs, the other half of the simulator's
    oracle, exist only in a replay; this is the plan a runner that knows the footprints ahead can
    carry out."""
    if not (policy.chooses_span and policy.places == "truth"):
        raise ValueError(f"policy {policy.name} does not plan on the true footprints")
    cfg = config or SimConfig()
    prof = cfg.profile()
    w = build_workload([trace], gran=prof.granularity, eviction_unit=prof.eviction_unit, profile=prof,
                       need_alloc=True)
    (cap, r), = capacities_for(w.oversub_basis(cfg.oversub_of), [capacity], None)
    cu = cap // w.gran
    if cu < 1:
        raise UsageError(f"capacity {cap} bytes is smaller than one migration unit ({w.gran} bytes)")
    opts = Options(eviction=cfg.eviction, driver_prefetch=cfg.driver_prefetch, choose_on=cfg.choose_on)
    spans = cfg.spans()
    span, needs, g, _ = choose_span_on(cfg.choose_on, w, w.truth, cu, spans, policy.fronts,
                                       _trials_of(cu, prof, opts), prof, faults=policy.faults and len(spans) > 1,
                                       whole_run=False)
    manifest = plan_io.new_manifest(trace=trace, capacity_bytes=cap, granularity=w.gran, model=None,
                                    oversub=r, costs=prof.name, span=span, policy=policy.name,
                                    thrashing_launches=int(g.thrash.sum()), faulted=int(g.faulted),
                                    prefetch_bytes=int(len(g.pf_unit) * w.gran),
                                    evict_bytes=int(len(g.ev_unit) * w.gran))
    return plan_io.Plan(groups_to_table(g, needs, w), manifest, None, launches_table(g, w))


def _template_plan(w: Workload, model, trace: T.Trace, predicted, gates, cu: int, prof: CostProfile, opts: Options,
                   cfg: SimConfig) -> tuple:
    """Template's plan for `trace` on workload `w` (its placement): (span, needs, plan, its trial's time)."""
    pneeds = w.gated_needs_from([predicted], [gates])
    spans = cfg.spans()
    faults = Template.faults and len(spans) > 1
    # as template plans (policies/template.py): or a plan leaving the indexed pieces out
    alts = value_alternatives(w, model, [trace], cfg.fallback, [(predicted, gates)])
    return best_plan_on(cfg.choose_on, w, pneeds, alts, cu, spans, Template.fronts, _trials_of(cu, prof, opts),
                        prof, faults)


def _trials_of(cu: int, prof: CostProfile, opts: Options):
    """(workload, needs) -> the planner's trial run at `cu` units (policies/base.py's trials_of)."""
    return lambda w, needs: plan_trial(w, needs, cu, prof, opts, run_policy)
