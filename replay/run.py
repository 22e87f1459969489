"""Sweeps: policies x capacities on one or more traces, in the simulator.

`replay_sim(...)` is what `pagecast replay --backend sim` and the demo call:
it builds the workload once, runs every (policy, capacity) pair, and returns
the run rows (cli.md's `replay --json` fields and more) and the per-launch
timeline table. `make_plan(...)` is `pagecast plan`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from pagecast import footprints as F
from pagecast import trace as T
from pagecast.errors import UsageError

from . import plan_io
from . import simulator as S
from .costs import CostProfile, load_profile, replace
from .results_io import timeline_table
from .workload import I64, Workload, build_workload


@dataclass
class SimConfig:
    costs: str | Path | CostProfile = "msched-rtx5080"
    granularity: int | None = None
    eviction_unit: int | None = None
    eviction: str = "fifo"
    driver_prefetch: bool = True
    timeslice_ms: float = 10.0
    feedback: bool = False
    fallback: str = "adaptive"   # replay/adaptive.py: history only where it proved precise
    span: str = "auto"           # what template and oracle plan on (simulator.PLAN_SPANS), or "auto": the fastest

    def spans(self) -> tuple[str, ...]:
        return S.PLAN_SPANS if self.span == "auto" else (self.span,)

    def profile(self) -> CostProfile:
        p = load_profile(self.costs)
        ch = {}
        if self.granularity is not None:
            ch["granularity"] = int(self.granularity)
        if self.eviction_unit is not None:
            ch["eviction_unit"] = int(self.eviction_unit)
        elif self.granularity is not None and self.granularity > p.eviction_unit:
            ch["eviction_unit"] = int(self.granularity)
        if ch:
            for k, v in ch.items():
                if v <= 0 or v & (v - 1) or v < 512:
                    raise UsageError(f"--{k.replace('_', '-')} must be a power of two of at least 512 bytes, not {v}")
            if ch.get("eviction_unit", p.eviction_unit) < ch.get("granularity", p.granularity):
                raise UsageError("--eviction-unit must not be smaller than --granularity")
            p = replace(p, **ch)
        if self.eviction not in ("fifo", "lru"):
            raise UsageError(f"--eviction must be fifo or lru, not {self.eviction!r}")
        if self.span != "auto" and self.span not in S.PLAN_SPANS:
            raise UsageError(f"--span must be auto or one of {', '.join(S.PLAN_SPANS)}, not {self.span!r}")
        if not (self.timeslice_ms >= 0):
            raise UsageError(f"--timeslice must be >= 0 ms, not {self.timeslice_ms}")
        return p


MAX_CAPACITY = 1 << 60  # 1 EiB: capacities stay far inside int64 arithmetic


def capacities_for(footprint_bytes: int, capacity: list[int] | None, oversub: list[float] | None
                   ) -> list[tuple[int, float]]:
    """(capacity_bytes, oversubscription) pairs from --capacity or --oversub."""
    if (capacity is None) == (oversub is None):
        raise UsageError("give exactly one of --capacity SIZE,... and --oversub R,...")
    out = []
    if capacity is not None:
        for c in capacity:
            if c <= 0:
                raise UsageError(f"--capacity must be > 0, not {c}")
            if c > MAX_CAPACITY:
                raise UsageError(f"--capacity {c} bytes is more than the simulator handles (1 EiB)")
            out.append((int(c), footprint_bytes / c))
    else:
        for r in oversub:
            if not (r > 0) or not np.isfinite(r):
                raise UsageError(f"--oversub must be a positive number, not {r}")
            c = int(footprint_bytes / r)
            if c <= 0:
                raise UsageError(f"--oversub {r} leaves no capacity (footprint {footprint_bytes} bytes)")
            if c > MAX_CAPACITY:
                raise UsageError(f"--oversub {r} gives a capacity of {c} bytes, more than the simulator handles (1 EiB)")
            out.append((c, float(r)))
    return out


def _plan_groups_from_file(plan: plan_io.Plan, w: Workload, needs=None) -> S.Groups:
    """A plan's rows -> Groups over the (single-task) workload's steps.

    `needs`: the predicted needs the plan was made on (its model's), when they
    can be read. The file does not say which groups evict units the launch
    before uses (they start once it ends) nor, for a merged row of early
    prefetches, every launch that waits for it (its `needed_by` is the first):
    both are derived from `needs` as the planner derived them, so the plan
    replays as template planned on the fly does. Without them: the launch
    before's true footprint, and each row's `needed_by`."""
    cols = plan.columns()
    n = w.n_steps
    gran = w.gran
    lid = cols[plan_io.LAUNCH_ID]
    addr = cols[plan_io.ADDRESS].astype(np.uint64)
    nb = cols[plan_io.BYTES].astype(np.uint64)
    s = (addr // np.uint64(gran)).astype(I64)
    e = ((addr + nb + np.uint64(gran - 1)) // np.uint64(gran)).astype(I64)
    is_ev = cols[plan_io.ACTION]
    need = cols[plan_io.NEEDED_BY] == lid
    out = {}
    for name, sel in (("ev", is_ev), ("pf", ~is_ev)):
        # keep row order inside a launch: a row index as the secondary key
        rows = np.flatnonzero(sel)
        counts = e[rows] - s[rows]
        units = F.expand_intervals(s[rows], e[rows])
        row_of = np.repeat(rows, counts)
        us, ue, off = w.universe.iv[0]
        k = np.searchsorted(us, units, side="right") - 1
        kk = np.maximum(k, 0)
        ok = (k >= 0) & (units < ue[kk]) if len(us) else np.zeros(len(units), bool)
        d = (off[kk] + units - us[kk])[ok]
        row_of = row_of[ok]
        step = w.step_of(0, lid[row_of])
        order = np.lexsort((row_of, step))
        d, row_of, step = d[order], row_of[order], step[order]
        ptr = np.zeros(n + 1, I64)
        np.cumsum(np.bincount(step, minlength=n), out=ptr[1:])
        out[name] = (ptr, d, np.bincount(step[need[row_of]], minlength=n) if name == "pf" else None)
    g = S.Groups.empty(n)
    g.ev_ptr, g.ev_unit = out["ev"][0], out["ev"][1]
    g.pf_ptr, g.pf_unit = out["pf"][0], out["pf"][1]
    g.need_now = out["pf"][2].astype(I64)
    # per step, the latest earlier group holding a prefetch it needs
    need_group = np.full(n, -1, I64)
    if needs is not None:
        pf_step = np.repeat(np.arange(n, dtype=I64), np.diff(g.pf_ptr))
        first = _first_need(pf_step, g.pf_unit, needs, n)
        early = first > pf_step
        np.maximum.at(need_group, first[early], pf_step[early])
    else:
        pf = ~is_ev & (cols[plan_io.NEEDED_BY] > lid)
        if pf.any():
            np.maximum.at(need_group, w.step_of(0, cols[plan_io.NEEDED_BY][pf]), w.step_of(0, lid[pf]))
    g.need_group = need_group
    # a group that evicts units the launch before uses starts once it ends (as the planner marks it)
    used = needs if needs is not None else w.truth
    ev_step = np.repeat(np.arange(n, dtype=I64), np.diff(g.ev_ptr))
    m = ev_step > 0
    if m.any():
        prev_step = ev_step[m] - 1
        occ_step = np.repeat(np.arange(n, dtype=I64), np.diff(used.ptr))
        occ = np.sort(used.unit.astype(I64) * (n + 1) + occ_step)
        q = g.ev_unit[m].astype(I64) * (n + 1) + prev_step
        pos = np.minimum(np.searchsorted(occ, q), max(len(occ) - 1, 0))
        hit = occ[pos] == q if len(occ) else np.zeros(len(q), bool)
        g.wait_prev = np.zeros(n, np.uint8)
        g.wait_prev[ev_step[m][hit]] = 1
    return g


def _plan_model_predictions(plan: plan_io.Plan, trace: T.Trace, fallback: str) -> F.Footprints | None:
    """The predictions the plan was made on, when its model (manifest) can be read:
    a launch larger than memory then runs as planned (Belady within the launch on
    the predicted next uses); without it, such launches give up their first units."""
    path = plan.manifest.get("model")
    if not path:
        return None
    try:
        from pagecast.predict.model_io import load_model

        from .adaptive import predicted_footprints
        return predicted_footprints(load_model(path), trace, plan.manifest.get("fallback") or fallback)
    except Exception:  # noqa: BLE001 -- a moved or unreadable model: replay without it
        return None


def _plan_footprints(plan: plan_io.Plan, trace: T.Trace) -> F.Footprints:
    cols = plan.columns()
    s, e = F.page_span(cols[plan_io.ADDRESS], cols[plan_io.BYTES], trace.page_size)
    return F.Footprints.from_intervals(cols[plan_io.LAUNCH_ID], s, e, trace.n_launches, trace.page_size, "predicted")


def replay_sim(traces: list[T.Trace], policies: list[str], *, capacity: list[int] | None = None,
               oversub: list[float] | None = None, config: SimConfig | None = None, model=None,
               model_path: str | None = None, plan_path: str | None = None, progress=None,
               workload_name: str | None = None, timeline: bool = True) -> tuple[list[dict], pa.Table | None]:
    """Run every (policy, capacity) pair; return run rows and the per-launch timeline
    (None with timeline=False: it holds a row per launch per run)."""
    cfg = config or SimConfig()
    S.check_policies(policies)
    if not traces:
        raise UsageError("the simulator needs at least one TRACE")
    prof = cfg.profile()
    plan = None
    if plan_path is not None:
        if len(traces) != 1:
            raise UsageError("--plan is for one trace; with several traces give --model and plans are made on the fly")
        plan = plan_io.read_plan(plan_path, traces[0])
        if capacity is not None and any(c != plan.capacity_bytes for c in capacity):
            from pagecast.console import warn
            warn(f"{plan_path} was planned for a capacity of {plan.capacity_bytes} bytes; replaying it at"
                 " another capacity follows the same transfers (memory the plan overfills is evicted by faults)")
    if "template" in policies and model is None and plan is None:
        raise UsageError("policy template needs --model MODEL or --plan PLAN")
    if "runner" in policies and model is None:
        raise UsageError("policy runner needs --model MODEL (it predicts as the GPU runner does)")
    extra = []
    predicted = None
    if "template" in policies and model is not None and plan is None:
        from .adaptive import predicted_footprints
        predicted = [predicted_footprints(model, t, cfg.fallback) for t in traces]
        extra.append(predicted)
    plan_pred = None
    if plan is not None:
        extra.append([_plan_footprints(plan, traces[0])])
        plan_pred = _plan_model_predictions(plan, traces[0], cfg.fallback)
        if plan_pred is not None:
            # the universe template planned on the fly has (its chunks' sizes set the planner's evictions)
            extra.append([plan_pred])
    # allocations are always part of the universe (the alloc and swap policies move them)
    w = build_workload(traces, gran=prof.granularity, eviction_unit=prof.eviction_unit, profile=prof,
                       timeslice_s=cfg.timeslice_ms / 1e3, need_alloc=True, extra_fps=extra)
    caps = capacities_for(w.footprint_bytes, capacity, oversub)
    opts = S.Options(eviction=cfg.eviction, driver_prefetch=cfg.driver_prefetch, feedback=cfg.feedback)
    tmpl = None
    if "template" in policies:
        if plan is not None:
            span = plan.manifest.get("span", "unit")
            pneeds = None if plan_pred is None else S.span_needs(w.needs_from([plan_pred]), span, w)
            tmpl = S.Template(plan_groups_fixed=_plan_groups_from_file(plan, w, pneeds), fallback=cfg.fallback)
            tmpl.fixed_needs, tmpl.fixed_span = pneeds, span
            if cfg.feedback:
                raise UsageError("--feedback needs --model (a fixed --plan cannot be refined)")
        else:
            tmpl = S.Template(model=model, fallback=cfg.fallback)
            w.extra[("predicted", id(model), cfg.fallback)] = predicted
    results: dict[tuple[str, int], S.RunResult] = {}
    one_pass = (cfg.eviction == "lru" and prof.eviction_unit == prof.granularity and not cfg.driver_prefetch)
    for p in policies:
        cap_units = [c // w.gran for c, _ in caps]
        for c, cu in zip(caps, cap_units):
            if cu < 1:
                raise UsageError(f"capacity {c[0]} bytes is smaller than one migration unit ({w.gran} bytes)")
        if p == "demand" and one_pass and len(caps) > 1:
            for (c, _), r in zip(caps, S.demand_lru_all(w, cap_units, prof)):
                results[(p, c)] = r
                if progress:
                    progress.advance()
            continue
        if p == "runner":
            from .runner_policy import Runner
            pol = Runner(model)
        else:
            pol = tmpl if p == "template" else S.POLICIES[p]()
        if p in ("template", "oracle"):
            pol.spans = cfg.spans()
        for (c, _), cu in zip(caps, cap_units):
            results[(p, c)] = S.run_policy(w, pol, cu, prof, opts)
            if progress:
                progress.advance()
    names = [t.name for t in w.tasks]
    wname = workload_name or "+".join(names)
    runs: list[dict] = []
    tl_parts = []
    kernels = _step_kernels(w) if timeline else None
    task_names = pa.array([t.name for t in w.tasks])
    for i, p in enumerate(policies):
        for c, r_over in caps:
            r = results[(p, c)]
            s = S.summarize(r, w, prof.faults_per_batch)
            run = {"policy": p, "backend": "sim", "capacity_bytes": int(c), "oversub": float(r_over), **s}
            run.update({
                "footprint_bytes": int(w.footprint_bytes), "workload": wname, "tasks": names,
                "traces": [str(t.path) for t in traces], "costs": prof.name, "granularity": int(prof.granularity),
                "eviction_unit": int(prof.eviction_unit), "eviction": cfg.eviction,
                "driver_prefetch": bool(cfg.driver_prefetch), "timeslice_ms": float(cfg.timeslice_ms),
                "model": model_path, "plan": None if plan_path is None else str(plan_path),
                "feedback": bool(cfg.feedback and p == "template"), "run": len(runs),
            })
            if "feedback_changes" in r.extra:
                run["feedback_changes"] = int(r.extra["feedback_changes"])
            if "plan_span" in r.extra:
                run["plan_span"] = r.extra["plan_span"]
            runs.append(run)
            if timeline:
                tl_parts.append(_timeline(run["run"], p, c, r, w, kernels, task_names))
    _relative(runs)
    if not timeline:
        return runs, None
    return runs, (pa.concat_tables(tl_parts) if tl_parts else timeline_table({}))


def _relative(runs: list[dict]) -> None:
    """speedup_vs_demand and fraction_of_oracle per capacity (None where the reference is absent)."""
    by = {}
    for r in runs:
        by[(r["policy"], r["capacity_bytes"])] = r
    for r in runs:
        d = by.get(("demand", r["capacity_bytes"]))
        o = by.get(("oracle", r["capacity_bytes"]))
        r["speedup_vs_demand"] = (d["time_s"] / r["time_s"]) if d and r["time_s"] > 0 else None
        r["fraction_of_oracle"] = (o["time_s"] / r["time_s"]) if o and r["time_s"] > 0 else None


def _step_kernels(w: Workload) -> pa.Array:
    parts = []
    for t, task in enumerate(w.tasks):
        parts.append(task.trace.launches.column(T.KERNEL).combine_chunks())
    allk = pa.concat_arrays([p.cast(pa.string()) for p in parts]) if parts else pa.array([], pa.string())
    base = np.concatenate([[0], np.cumsum([t.trace.n_launches for t in w.tasks])]).astype(I64)
    idx = base[w.step_task] + w.step_launch
    return allk.take(pa.array(idx))


def _timeline(run: int, policy: str, cap: int, r: S.RunResult, w: Workload, kernels: pa.Array,
              task_names: pa.Array) -> pa.Table:
    from . import sim_core as C
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


# ---- pagecast plan ----------------------------------------------------------------


def make_plan(model, trace: T.Trace, *, capacity: int | None = None, oversub: float | None = None,
              config: SimConfig | None = None, model_path: str | None = None) -> tuple[pa.Table, dict]:
    """Belady plan on the model's predicted footprints -> (plan table, manifest)."""
    from .adaptive import predicted_footprints
    cfg = config or SimConfig()
    prof = cfg.profile()
    predicted = predicted_footprints(model, trace, cfg.fallback)
    w = build_workload([trace], gran=prof.granularity, eviction_unit=prof.eviction_unit, profile=prof,
                       need_alloc=True, extra_fps=[[predicted]])
    (cap, r), = capacities_for(w.footprint_bytes, None if capacity is None else [capacity],
                               None if oversub is None else [oversub])
    cu = cap // w.gran
    if cu < 1:
        raise UsageError(f"capacity {cap} bytes is smaller than one migration unit ({w.gran} bytes)")
    opts = S.Options(eviction=cfg.eviction, driver_prefetch=cfg.driver_prefetch)
    span, needs, g = S.choose_span(w, w.needs_from([predicted]), cu, prof, opts, cfg.spans())
    table = groups_to_table(g, needs, w)
    manifest = plan_io.new_manifest(trace=trace, capacity_bytes=cap, granularity=w.gran, model=model_path,
                                    oversub=r, costs=prof.name, fallback=cfg.fallback, span=span,
                                    thrashing_launches=int(g.thrash.sum()),
                                    prefetch_bytes=int(len(g.pf_unit) * w.gran),
                                    evict_bytes=int(len(g.ev_unit) * w.gran))
    return table, manifest


def groups_to_table(g: S.Groups, needs, w: Workload) -> pa.Table:
    """Groups (single task) -> plan rows, merging runs of consecutive units into one transfer."""
    n = w.n_steps
    parts = []
    for is_ev, ptr, units in ((True, g.ev_ptr, g.ev_unit), (False, g.pf_ptr, g.pf_unit)):
        if len(units) == 0:
            continue
        step = np.repeat(np.arange(n, dtype=I64), np.diff(ptr))
        if is_ev:
            need_by = np.full(len(units), -1, I64)
        else:
            # the step that first needs each prefetched unit at or after its group
            need_by = _first_need(step, units, needs, n)
        addr, key = w.universe.address_ranges(0, units)
        # merge consecutive entries of the same step with consecutive addresses and the same need
        new = np.ones(len(units), bool)
        # (a group's own needs and its early prefetches stay apart: a runner waits for the first)
        own = need_by == step
        new[1:] = (step[1:] != step[:-1]) | (key[1:] != key[:-1] + 1) | (own[1:] != own[:-1])
        idx = np.flatnonzero(new)
        cnt = np.diff(np.concatenate([idx, [len(units)]]))
        first_need = np.minimum.reduceat(np.where(need_by < 0, np.iinfo(I64).max, need_by), idx)
        first_need = np.where(first_need == np.iinfo(I64).max, -1, first_need)
        parts.append((step[idx], np.full(len(idx), is_ev), addr[idx].astype(np.uint64), cnt * w.gran,
                      first_need, idx))
    if not parts:
        return pa.Table.from_pylist([], schema=plan_io.SCHEMA)
    lid = np.concatenate([p[0] for p in parts])
    ev = np.concatenate([p[1] for p in parts])
    addr = np.concatenate([p[2] for p in parts])
    nb = np.concatenate([p[3] for p in parts]).astype(I64)
    nbv = np.concatenate([p[4] for p in parts])
    pos = np.concatenate([p[5] for p in parts])
    order = np.lexsort((pos, ~ev, lid))  # per launch: evictions first, then prefetches in need order
    lid, ev, addr, nb, nbv = lid[order], ev[order], addr[order], nb[order], nbv[order]
    first = np.searchsorted(lid, lid, side="left")
    ordn = np.arange(len(lid), dtype=I64) - first
    launch = w.step_launch[lid]
    return pa.table({plan_io.LAUNCH_ID: launch, plan_io.ACTION: np.where(ev, plan_io.EVICT, plan_io.PREFETCH),
                     plan_io.ADDRESS: addr, plan_io.BYTES: nb, plan_io.ORDER: ordn,
                     plan_io.NEEDED_BY: np.where(nbv >= 0, w.step_launch[np.maximum(nbv, 0)], -1)},
                    schema=plan_io.SCHEMA)


def _first_need(step: np.ndarray, units: np.ndarray, needs, n: int) -> np.ndarray:
    """For each (group step, unit), the first step >= group step whose needs contain the unit."""
    occ_step = np.repeat(np.arange(n, dtype=I64), np.diff(needs.ptr))
    occ_unit = needs.unit
    key_occ = occ_unit * (n + 1) + occ_step
    order = np.argsort(key_occ, kind="stable")
    sk = key_occ[order]
    q = units * (n + 1) + step
    pos = np.searchsorted(sk, q, side="left")
    ok = pos < len(sk)
    res = np.full(len(units), -1, I64)
    hit = sk[np.minimum(pos, len(sk) - 1)]
    good = ok & (hit // (n + 1) == units)
    res[good] = hit[good] % (n + 1)
    return res
