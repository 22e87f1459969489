"""The GPU backend of `pagecast replay`: run a workload under each policy and capacity on the GPU.

How a GPU replay runs
---------------------
`run_gpu_replay(request)` (called by the replay command with `--backend gpu`,
which parses its flags into a `ReplayRequest`, replay/request.py) runs the
workload once per (capacity, policy, repeat), each time in a fresh subprocess:
`python -m pagecast.replay.gpu.child JOB.json` (child.py: one measured run,
its launch hook and CUPTI counters), where JOB.json is a `ChildJob`: the
request narrowed to that policy and capacity, and where to write the result
(docs/replay-request.md). The parent takes the median and the spread over repeats and
returns rows shaped as the simulator's (cli.md `replay --json`,
`backend: "gpu"`).

What happens at each launch under each policy is the policy's own
(pagecast.replay.policies), decided by pagecast.replay.online.decide and
carried out by cuda_engine.py; capacity emulation (`--capacity` /
`--oversub`) and its victim rules are online/decide.py's and
online/residency.py's; the oracle's relocated footprints online/relocate.py's. Real oversubscription (a workload larger than the GPU's free
memory) is refused unless `--allow-oversubscription` is given.

The first repeat of each run also reports a per-kernel timeline (kernel times
from CUPTI, faults and migrated bytes attributed to kernels by time), which the
replay command writes beside the results (RESULTS.timeline.parquet).

Timing: `time_s` is the GPU part of the workload, host wall time from the first
kernel launch to the completion of all GPU work (a synchronize after the
script returns); `wall_s` is the whole script including Python start-up and
imports; `gpu_kernel_s` is the sum of kernel durations (CUPTI). Stall time is
not measurable from outside the kernels (`stall_s` is null).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from pagecast import console, procs
from pagecast import trace as T
from pagecast.errors import NoGPUError, PagecastError, UsageError
from pagecast.footprints import footprints

from ..online.prediction import load_model_file
from ..online.ranges import UNIT
from ..plan import plan_io
from ..policies import POLICIES, add_relative, sizing_policy
from ..request import ReplayRequest
from ..results_io import timeline_table
from ..unit_space import managed_bytes
from . import driver
from .child import ChildJob, parse_workload


# a planned policy's plan at the start of a replay: (policy, capacity in bytes, plan directory to
# write) -> that directory, or None where that policy gets none (run_gpu_replay's `planner`)
Planner = Callable[[str, int, Path], "Path | None"]


class GpuRunError(PagecastError):
    """The workload failed under the runner (exit 1: not the user's flags)."""

    exit_code = 1



# ---------------------------------------------------------------------------
# Aggregation over repeats (pure)
# ---------------------------------------------------------------------------

_SUM_FIELDS = ("faults", "htod_bytes", "dtoh_bytes", "prefetch_bytes", "evict_bytes", "unplanned_htod_bytes",
               "prefetches", "evictions")
_MEDIAN_FIELDS = ("wall_s", "gpu_kernel_s", "gpu_span_s", "callback_us_mean")
_RANGE_FIELDS = ("faults", "htod_bytes", "dtoh_bytes", "callback_us_mean")


def aggregate(runs: list[dict]) -> dict:
    """Median and spread of repeated measurements of one (policy, capacity)."""
    times = [r["time_s"] for r in runs]
    med = statistics.median(times)
    out = dict(runs[0])
    out["time_s"] = med
    out["time_s_min"] = min(times)
    out["time_s_max"] = max(times)
    out["time_s_spread"] = (max(times) - min(times)) / med if med > 0 else None
    out["repeats"] = len(runs)
    out["times_s"] = times                          # every repeat, in the order run
    for k in _SUM_FIELDS + _MEDIAN_FIELDS:
        vals = [r[k] for r in runs if r.get(k) is not None]
        if vals:
            m = statistics.median(vals)
            out[k] = int(round(m)) if k in _SUM_FIELDS else m
            if k in _RANGE_FIELDS:
                out[f"{k}_min"], out[f"{k}_max"] = min(vals), max(vals)
    # the capacity ledger: the worst repeat counts; one repeat over by more than a chunk spoils the point
    ex = [r.get("max_excess_bytes") for r in runs if r.get("max_excess_bytes") is not None]
    if ex:
        out["max_excess_bytes"] = max(ex)
    out["valid"] = all(r.get("valid", True) for r in runs)
    return out


# ---------------------------------------------------------------------------
# The parent: run_gpu_replay
# ---------------------------------------------------------------------------

def _footprint_bytes(trace) -> int:
    fp = footprints(trace)
    return fp.union_pages() * fp.page_size


CHILD = "pagecast.replay.gpu.child"   # the module each measured run starts (python -m)


def _child_cmd(job: ChildJob, job_path: Path) -> list[str]:
    """The command of one measured run: the child reads its job (a JSON file), not flags."""
    job_path.write_text(job.to_json())
    return [sys.executable, "-m", CHILD, str(job_path)]


def run_gpu_replay(req: ReplayRequest, planner: Planner | None = None) -> tuple[list[dict], Any]:
    """Run the workload under each policy and capacity on the GPU; rows as the simulator's.

    The request was validated when it was made; what is checked here needs its files (the workload
    command's form, the model, the trace). `planner` (policy, capacity in bytes, directory) -> a
    plan directory or None makes the planned policies' plans (template, oracle) at the start of the
    replay, once per capacity (the whole GPU's memory where none is emulated), which their runs'
    children carry out: the replay command passes the simulator's planner (replay/commands.py,
    gpu_planner), which this layer may not import; the plans go in the replay's temporary folder,
    removed with it. A plan given with --plan (`pagecast plan`) is carried out by template's runs
    alone, at the capacity it was made for (that capacity where neither --capacity nor --oversub is
    given): one made for another trace, or another capacity, is refused before any run."""
    if req.backend != "gpu":
        raise UsageError("run_gpu_replay runs a request for --backend gpu")
    policies = list(req.policies)
    workload = list(req.workload)
    parse_workload(workload)  # raises UsageError on a bad command
    model = req.model
    if model:
        load_model_file(model)  # a bad model fails here, before any run
    traces = list(req.traces)
    trace = T.read_trace(traces[0]).require_launches("replay") if traces else None
    for p in policies:
        if POLICIES[p].needs_relocator and trace.mode != "full":
            console.warn(f"{traces[0]} is a {trace.mode}-mode trace: the {p} policy's footprints may be incomplete")
    # a plan file: made for this trace (its launch fingerprint; PlanError, exit 2), checked before any run
    given = plan_io.read_plan(req.plan, trace) if req.plan is not None and trace is not None else None
    footprint = _footprint_bytes(trace) if trace is not None else None
    managed = managed_bytes(trace) if trace is not None else 0
    repeat = req.repeat

    # Needs a GPU from here on (NoGPUError: one line, exit 2).
    cuda = driver.open_cuda()
    free, total = cuda.mem_info()
    device = cuda.device_info()
    if footprint is not None and footprint > free and not req.allow_oversubscription:
        raise UsageError(f"the workload's footprint ({footprint} bytes) exceeds the GPU's free memory ({free} bytes);"
                         " that would oversubscribe the real GPU: pass --allow-oversubscription to do it anyway,"
                         " or run a smaller scale (capacity is emulated)")
    if req.oversub and trace is None:
        # no trace to size it from: the managed memory the workload allocates, measured in a first run
        # of it at the whole GPU (request.py refuses --oversub-of touched without a trace)
        managed = _measure_managed(req)
    # what --oversub R divides, as the simulator sizes it (Workload.oversub_basis): the managed bytes
    # live at once, or the touched footprint (--oversub-of touched, or no managed allocation recorded)
    of = "touched" if req.oversub_of == "touched" or managed <= 0 else "managed"
    basis = footprint if of == "touched" else managed

    if req.oversub:
        caps: list[int | None] = [max(1, int(basis / r)) for r in req.oversub]
        levels = {c: float(r) for c, r in zip(caps, req.oversub)}
    elif req.capacity:
        caps = [int(c) for c in req.capacity]
        levels = {c: (basis / c if basis else None) for c in caps}
    elif given is not None:   # the plan's own capacity, emulated for every policy alike
        caps = [int(given.capacity_bytes)]
        levels = {caps[0]: basis / caps[0] if basis else None}
    else:
        caps = [None]
        levels = {None: None}
    if given is not None and any(POLICIES[p].follows_plan for p in policies):
        plan_io.check_plan_capacity(given, req.plan, [(c, levels[c]) for c in caps], by_oversub=bool(req.oversub))
    for c in caps:
        if c is not None and c > free:
            console.warn(f"capacity {c} bytes is more than the GPU's free memory ({free} bytes): not emulated exactly")

    unmatched = _without_argument_bytes(req, traces[0], trace) if trace is not None else None
    if unmatched is not None:
        # the runner matches a plan's launches to the run's through the trace's argument bytes: with none,
        # no plan is made at start or carried out, and the planned policies decide one launch at a time
        console.warn(unmatched)
        planner, req = None, replace(req, plan=None)

    rows: list[dict] = []
    timelines: list[dict] = []
    total_runs = len(caps) * len(policies) * repeat
    with tempfile.TemporaryDirectory(prefix="pagecast-gpu-") as tmp:
        plans: dict = {}   # (capacity, policy) -> its plan made at start (None: none made)
        if planner is not None:
            for i, cap in enumerate(caps):
                for policy in policies:
                    if POLICIES[policy].chooses_span:
                        plans[cap, policy] = planner(policy, cap if cap is not None else total,
                                                     Path(tmp) / f"{policy}-{i}.plan")
        with console.progress("GPU replay", total_runs) as bar:
            k = 0
            for cap in caps:
                # repeats interleaved (demand, template, ..., demand, template, ...): a drift in the
                # machine (clocks, another tenant) falls on every policy alike, not on one
                measured: dict[str, list] = {p: [] for p in policies}
                for r in range(repeat):
                    for policy in policies:
                        k += 1
                        res = Path(tmp) / f"run-{k}.json"
                        one = req.one_run(policy, cap)
                        if plans.get((cap, policy)) is not None:
                            one = replace(one, plan=str(plans[cap, policy]))
                        job = ChildJob(request=one, result=str(res), timeline=r == 0)
                        cmd = _child_cmd(job, Path(tmp) / f"job-{k}.json")
                        bar.update(description=f"{policy} @ {cap if cap is not None else 'full GPU'} ({r + 1}/{repeat})")
                        # the workload's stdout goes to our stderr: stdout is kept for --json
                        proc = _run_child(cmd)
                        out = json.loads(res.read_text()) if res.exists() else None
                        if proc.returncode != 0 or out is None or out.get("error"):
                            why = (out or {}).get("error") or f"exit status {proc.returncode}"
                            if (out or {}).get("exit_code") == 2:
                                raise NoGPUError(why) if (out or {}).get("no_gpu") else UsageError(why)
                            raise GpuRunError(f"the workload failed under policy {policy}: {why}")
                        for w in out.get("warnings", []):
                            if r == 0 and cap == caps[0]:
                                console.warn(w)
                        measured[policy].append(out)
                        bar.advance()
                for policy in policies:
                    runs = measured[policy]
                    tl = runs[0].pop("timeline", None)
                    for m_ in runs[1:]:
                        m_.pop("timeline", None)
                    if tl:
                        k_run = len(rows)
                        nrow = len(tl["kernel"])
                        tl.update(run=[k_run] * nrow, policy=[policy] * nrow,
                                  capacity_bytes=[cap if cap is not None else total] * nrow,
                                  task=[0] * nrow, task_name=[_workload_name(workload)] * nrow)
                        timelines.append(tl)
                    row = aggregate(runs)
                    row.update({
                        "policy": policy, "backend": "gpu",
                        "capacity_bytes": cap if cap is not None else total,
                        "oversub": levels[cap],
                        "stall_s": None, "footprint_bytes": footprint, "oversub_of": of,
                        "managed_bytes": managed or None,
                        "workload": " ".join(workload), "traces": traces, "model": str(model) if model else None,
                        "feedback": bool(req.feedback), "costs": None,
                        "device": device.get("name"), "eviction_unit": UNIT,
                        "eviction": POLICIES[policy].victims if cap is not None else None,
                    })
                    rows.append(row)
    add_relative(rows)
    for i, r in enumerate(rows):
        r["run"] = i
    timeline = None
    if timelines:
        cols = {k: [v for tl in timelines for v in tl[k]] for k in timelines[0]}
        timeline = timeline_table(cols)
    return rows, timeline



def _without_argument_bytes(req: ReplayRequest, path: str, trace) -> str | None:
    """One warning line where `trace`'s launches carry no argument bytes (`Trace.has_argument_bytes`)
    and a policy of `req` needs them: the runner matches the trace's launches to the workload's
    through their pointer arguments, so the policies that carry out a plan ahead (`chooses_span`,
    with the lookahead) decide one launch at a time instead (25-30 us a launch on the GPU's host
    side against about 5 with a plan: docs/performance.md), and those that relocate the trace's
    footprints (`needs_relocator`) cannot place them; None where the trace has them or no policy
    needs them."""
    if trace.has_argument_bytes():
        return None
    online = [p for p in req.policies
              if POLICIES[p].chooses_span and req.lookahead and not POLICIES[p].needs_relocator]
    unplaced = [p for p in req.policies if POLICIES[p].needs_relocator]
    if not online and not unplaced:
        return None
    said = []
    if online:
        said.append(f"{' and '.join(online)} decide{'s' if len(online) == 1 else ''} one launch at a time"
                    " (25-30 us a launch) instead of carrying out a plan made at start")
    if unplaced:
        said.append(f"{' and '.join(unplaced)} cannot place the trace's footprints in the run")
    return (f"{path}: its launches carry no kernel argument bytes (source {trace.manifest.get('source')!r}), through"
            f" which the runner matches them to the workload's: {'; '.join(said)}; recollect the trace with"
            " them (pagecast collect --mode full -- CMD) to have the plans made at start")


def _measure_managed(req: ReplayRequest) -> int:
    """The most managed memory the workload holds live at once, for --oversub without a trace: one
    run of it under demand paging at the whole GPU (`ChildJob.managed`)."""
    console.info("sizing --oversub: a first run of the workload measures the managed memory it allocates")
    with tempfile.TemporaryDirectory(prefix="pagecast-gpu-") as tmp:
        res = Path(tmp) / "size.json"
        job = ChildJob(request=req.one_run(sizing_policy(), None), result=str(res), managed=True)
        proc = _run_child(_child_cmd(job, Path(tmp) / "size-job.json"))
        out = json.loads(res.read_text()) if res.exists() else None
    if proc.returncode != 0 or out is None or out.get("error"):
        why = (out or {}).get("error") or f"exit status {proc.returncode}"
        if (out or {}).get("exit_code") == 2:
            raise NoGPUError(why) if (out or {}).get("no_gpu") else UsageError(why)
        raise GpuRunError(f"the workload failed in the run that sizes --oversub: {why}")
    peak = int(out.get("managed_peak_bytes") or 0)
    if peak <= 0:
        raise UsageError("the workload allocated no managed memory that the runner saw: --oversub has nothing to"
                         " divide; give --capacity SIZE, or a trace of the workload")
    return peak

def _workload_name(workload: list[str]) -> str:
    try:
        kind, target, _ = parse_workload(workload)
    except UsageError:
        return " ".join(workload)
    return target.rsplit(".", 1)[-1] if kind == "module" else Path(target).stem


def _run_child(cmd: list[str]) -> subprocess.CompletedProcess:
    """Run one measured child; the workload's stdout goes to our stderr (stdout is kept for --json).

    The child stays in our process group (a caller that stops the group stops it too), exits
    with us if we are killed outright (it asks for SIGTERM at its parent's exit, procs.exit_with_parent,
    and checks $PAGECAST_PARENT_PID), and is stopped if we are interrupted while it runs.
    """
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # stderr replaced by a non-file (tests)
        fd = None
    if fd is not None:
        proc = subprocess.Popen(cmd, stdout=fd, stderr=fd, env=_child_env())
    else:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_child_env(), text=True)
    try:
        out, _ = proc.communicate()
    except BaseException:
        proc.terminate()
        try:
            proc.wait(timeout=procs.GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise
    if fd is None:
        sys.stderr.write(out or "")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, None)


def _child_env() -> dict:
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env[procs.PARENT_ENV] = str(os.getpid())
    return env
