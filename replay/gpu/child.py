"""One measured GPU run: `python -m pagecast.replay.gpu.child JOB.json`.

`backend.run_gpu_replay` starts this once per (capacity, policy, repeat). Its
one argument is a JSON file holding a `ChildJob`: the replay request
(replay/request.py) narrowed to one policy and at most one capacity, the file
to write the result to and whether to report the timeline; `-` reads it from
stdin (docs/replay-request.md).
The child subscribes to kernel launches with the collector's
`pagecast.collect.launch_hook.LaunchHook`, starts CUPTI's unified-memory
counters (`cupti_monitor.CuptiMonitor`), runs the script in-process (runpy),
waits for the GPU and writes its measurements as JSON to the file the parent
names (`result`); with `timeline`, per-kernel rows too (`build_timeline`).
"""

from __future__ import annotations

import bisect
import json
import os
import runpy
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from pagecast import procs
from pagecast import trace as T
from pagecast.collect.launch_hook import LaunchHook
from pagecast.collect.managed import ManagedBudget, ManagedTracker, free_callbacks
from pagecast.errors import NoGPUError, PagecastError, UsageError, shown

from ..online.prediction import default_fallback, load_model_file, make_online_predict, model_kernel_names
from ..online.ranges import UNIT
from ..online.lookahead import dead_of, lookahead_for
from ..online.planned import PlannedCalls, schedule_from_plan
from ..online.relocate import Relocator
from ..costs import load_profile
from ..plan.plan_io import read_plan
from ..policies import POLICIES, online_policy
from ..request import NO_WORKLOAD, ReplayRequest
from . import cupti_monitor, driver
from .cuda_engine import TIMELINE_MAX, Engine
from .feedback_loop import FeedbackLoop


LEDGER_FLUSH_S = 0.002   # how often CUPTI's buffers are flushed during a capacity run (the ledger's lag)


# ---------------------------------------------------------------------------
# Workload command (pure)
# ---------------------------------------------------------------------------

def parse_workload(argv: Sequence[str]) -> tuple[str, str, list[str]]:
    """`python SCRIPT ARGS` / `python -m MODULE ARGS` / `SCRIPT.py ARGS` / `-m MODULE ARGS` -> (kind, target, args).

    The runner runs the workload in its own process (CUPTI sees only its own
    process's launches), so it must be Python.
    """
    argv = list(argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise UsageError(NO_WORKLOAD)
    if argv[0] == "-m":
        argv = ["python"] + argv
    first = os.path.basename(argv[0])
    if first.endswith(".py"):
        return "path", argv[0], argv[1:]
    if not (first.startswith("python") or Path(argv[0]).resolve() == Path(sys.executable).resolve()):
        raise UsageError(f"the GPU backend runs Python workloads in-process; {argv[0]!r} is not python "
                         "(write '-- python SCRIPT [ARGS]' or '-- python -m MODULE [ARGS]')")
    rest = argv[1:]
    while rest and rest[0] in ("-u", "-B", "-O", "-X") or (rest and rest[0].startswith("-W")):
        if rest[0] == "-X" and len(rest) > 1:
            rest = rest[2:]
        else:
            rest = rest[1:]
    if not rest:
        raise UsageError("the workload command names no script: write '-- python SCRIPT [ARGS]'")
    if rest[0] == "-m":
        if len(rest) < 2:
            raise UsageError("'-m' needs a module name")
        return "module", rest[1], rest[2:]
    if rest[0].startswith("-"):
        raise UsageError(f"unsupported python option {rest[0]!r} in the workload command")
    return "path", rest[0], rest[1:]


def run_workload(kind: str, target: str, args: list[str]) -> int:
    """Run a Python script or module in this process as `python` would; its exit code."""
    old_argv = sys.argv
    sys.argv = [target if kind == "path" else target] + list(args)
    code = 0
    try:
        if kind == "path":
            if not Path(target).exists():
                raise UsageError(f"{target}: no such workload script")
            sys.path.insert(0, str(Path(target).resolve().parent))
            runpy.run_path(target, run_name="__main__")
        else:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        c = e.code
        code = 0 if c is None else (c if isinstance(c, int) else 1)
    finally:
        sys.argv = old_argv
    return code


# ---------------------------------------------------------------------------
# The per-kernel timeline of a run (pure)
# ---------------------------------------------------------------------------

def build_timeline(counts, corr_launch: dict[int, int], limit: int = TIMELINE_MAX) -> dict | None:
    """Per-kernel rows (results_io's timeline columns) from CUPTI's kernel, fault and transfer records.

    A fault counts for the kernel running when it was recorded; a transfer for
    the kernel running when it started, else the next kernel to start (a
    prefetch prepares the launch after it). Times are seconds from the first
    kernel's start. `stall_s` is null: it is not measurable from outside.
    """
    ks = sorted(counts.kernel_records)[:limit]
    if not ks:
        return None
    starts = [k[0] for k in ks]
    n = len(ks)
    faults, htod, dtoh = [0] * n, [0] * n, [0] * n

    def running(time_ns: int) -> int | None:
        i = bisect.bisect_right(starts, time_ns) - 1
        return i if i >= 0 and time_ns <= ks[i][1] else None

    for tm, _addr, cnt in counts.fault_records:
        i = running(tm)
        if i is not None:
            faults[i] += int(cnt)
    for recs, acc in ((counts.htod_records, htod), (counts.dtoh_records, dtoh)):
        for st, _e, _a, nbytes, _cause in recs:
            i = running(st)
            if i is None:
                i = bisect.bisect_right(starts, st)
                if i >= n:
                    continue
            acc[i] += int(nbytes)
    t0 = ks[0][0]
    return {
        "launch_id": [corr_launch.get(k[2]) for k in ks],
        "kernel": [k[3] for k in ks],
        "start_s": [(k[0] - t0) * 1e-9 for k in ks],
        "end_s": [(k[1] - t0) * 1e-9 for k in ks],
        "stall_s": [None] * n,
        "faults": faults, "htod_bytes": htod, "dtoh_bytes": dtoh,
    }


# ---------------------------------------------------------------------------
# The child: one measured run
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class ChildJob:
    """One measured run, as the GPU runner hands it to the child (a JSON file, not flags)."""

    request: ReplayRequest      # narrowed to one policy and at most one capacity (none: the whole GPU)
    result: str                 # the JSON file the child writes its measurements to
    timeline: bool = False      # report per-kernel rows too
    feedback_every: int = 256   # launches between feedback rounds
    managed: bool = False       # also measure the managed memory the workload allocates (the most live at once)

    def __post_init__(self) -> None:
        r = self.request
        if r.backend != "gpu" or len(r.policies) != 1 or r.oversub is not None or len(r.capacity or ()) > 1:
            raise UsageError("child job: the request must be for --backend gpu, one policy and at most one capacity")
        if not self.result:
            raise UsageError("child job: result names no file")
        if isinstance(self.feedback_every, bool) or not isinstance(self.feedback_every, int) \
                or self.feedback_every < 1:
            raise UsageError(f"child job: feedback_every must be an integer >= 1, not {shown(self.feedback_every)}")

    @property
    def policy(self) -> str:
        return self.request.policies[0]

    @property
    def capacity(self) -> int | None:
        return self.request.capacity[0] if self.request.capacity else None

    def to_json(self) -> str:
        return json.dumps({"request": self.request.to_dict(), "result": self.result, "timeline": self.timeline,
                           "feedback_every": self.feedback_every, "managed": self.managed}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes, where: str = "child job") -> ChildJob:
        try:
            d = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise UsageError(f"{where}: not JSON ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
        if not isinstance(d, dict) or set(d) - {"request", "result", "timeline", "feedback_every", "managed"} \
                or "request" not in d or not isinstance(d.get("result"), str) \
                or not isinstance(d.get("timeline", False), bool) or not isinstance(d.get("managed", False), bool):
            raise UsageError(f"{where}: not a child job (request, result, timeline, feedback_every, managed)")
        return cls(request=ReplayRequest.from_dict(d["request"], f"{where}: request"), result=d["result"],
                   timeline=d.get("timeline", False), feedback_every=d.get("feedback_every", 256),
                   managed=d.get("managed", False))


def read_job(argv: list[str]) -> ChildJob:
    """The child's one argument: its job's JSON file, or `-` for stdin."""
    if len(argv) != 1:
        raise UsageError("usage: python -m pagecast.replay.gpu.child JOB.json (a child job, see"
                         " docs/replay-request.md; '-' reads it from stdin)")
    where = argv[0]
    try:
        text = sys.stdin.read() if where == "-" else Path(where).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{where}: cannot read the child job: {e}") from None
    return ChildJob.from_json(text, where)


class _Warnings:
    def __init__(self) -> None:
        self.items: list[str] = []

    def __call__(self, msg: str) -> None:
        if len(self.items) < 50:
            self.items.append(msg)


def child_main(argv: list[str] | None = None, *, cuda=None, monitor=None, hook_factory=None) -> int:
    """One run: set up the policy, run the workload in-process, write the measurements as JSON.

    `argv` is the job's file (`[JOB.json]`, or `["-"]`: stdin). A job that cannot be read is one
    line on stderr and exit 2 (there is no result file to write it to). `cuda`, `monitor` and
    `hook_factory` default to the real ones; tests pass stand-ins.
    """
    try:
        job = read_job(sys.argv[1:] if argv is None else list(argv))
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    req = job.request
    policy, capacity, fallback = job.policy, job.capacity, req.fallback
    result = Path(job.result)
    warns = _Warnings()
    out: dict[str, Any] = {"policy": policy, "capacity_bytes": capacity}

    def finish(code: int) -> int:
        out["warnings"] = warns.items
        result.write_text(json.dumps(out, default=str))
        return code

    predicts = POLICIES[policy].predicts   # the model predicts every launch (template)
    # records during the run: for feedback, and for the capacity ledger (cuda_engine.py: what moved
    # drives the emulated capacity), flushed often enough that each boundary sees recent ones
    live = bool(req.feedback and predicts) or capacity is not None
    try:
        kind, target, wargs = parse_workload(req.workload)
        if monitor is None:
            monitor = cupti_monitor.CuptiMonitor(0)
        # unified-memory counters are configured and enabled before the CUDA context exists
        if capacity is not None:
            monitor.start(keep_records=True, live=live, flush_every_s=LEDGER_FLUSH_S)
        else:
            monitor.start(keep_records=True, live=live)
        if cuda is None:
            cuda = driver.open_cuda()
        model = load_model_file(req.model) if req.model else None
        if fallback is None:
            fallback = default_fallback(req.feedback)
        predict = make_online_predict(model, fallback) if model is not None else None
        relocator, ahead, planned = None, None, None
        if req.traces:
            trace = T.read_trace(req.traces[0])
            relocator = Relocator(trace)
            if req.plan is not None and req.lookahead and POLICIES[policy].chooses_span:
                # a plan file of a policy that plans Belady at a span (template: `pagecast plan`, or
                # made at the replay's start; oracle: made there from the trace): its schedule carried
                # out, as the simulator's runner does (online/planned.py); the residency estimate
                # stays the ledger's safety net
                plan = read_plan(req.plan, trace)
                if capacity is not None and plan.capacity_bytes != capacity:
                    warns(f"the plan was made for a capacity of {plan.capacity_bytes} bytes, this run has {capacity}")
                planned = PlannedCalls(schedule_from_plan(plan.table, plan.launches, trace, relocator), relocator,
                                       dead=dead_of(relocator, trace, req.discard_unfreed))
            elif req.lookahead:   # planned policies see the trace's launches ahead (online/lookahead.py),
                # as far as the cost profile's per-call cost and bandwidth say (--costs: a calibrated one)
                ahead = lookahead_for(online_policy(policy), trace, model=model, fallback=fallback,
                                      relocator=relocator, costs=load_profile(req.costs),
                                      discard_unfreed=req.discard_unfreed)
        out["lookahead"] = ahead.depth if ahead is not None else 0
        out["planned"] = planned is not None
        engine = Engine(cuda, policy, capacity=capacity, ahead=ahead, planned=planned,
                        predict=predict if (predicts or capacity is not None) else None,
                        relocator=relocator, model_kernels=model_kernel_names(model) if model is not None else None,
                        warn=warns, moved=getattr(monitor, "take_migrations", None) if capacity is not None else None)
    except PagecastError as e:
        if monitor is not None:
            monitor.stop()
        out.update(error=str(e), exit_code=e.exit_code, no_gpu=isinstance(e, NoGPUError))
        return finish(e.exit_code)

    feedback = None
    if req.feedback and predicts:
        feedback = FeedbackLoop(engine, monitor, model, fallback, predict, every=job.feedback_every)

    on_launch = engine.on_launch if feedback is None else feedback.on_launch
    first_launch: list[float] = []

    def hooked(la) -> None:
        if not first_launch:
            first_launch.append(time.perf_counter())
        on_launch(la)

    if hook_factory is None:
        hook_factory = LaunchHook
    callbacks = free_callbacks(engine.on_free)
    budget = None
    if job.managed:   # the managed allocations' live map (collect's tracker, with no limit): its peak
        budget = ManagedBudget(None)
        tracker = ManagedTracker(budget)
        callbacks = _chain(tracker.callbacks(), free_callbacks(engine.on_free, tracker.views))
    hook = hook_factory(hooked, api_callbacks=callbacks)
    hook.start()
    t0 = time.perf_counter()
    try:
        code = run_workload(kind, target, wargs)
    except PagecastError as e:
        hook.stop()
        monitor.stop()
        out.update(error=str(e), exit_code=e.exit_code)
        return finish(e.exit_code)
    except BaseException as e:  # noqa: BLE001 - report the workload's crash to the parent
        hook.stop()
        monitor.stop()
        out.update(error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", exit_code=1)
        return finish(1)
    cuda.synchronize()
    t1 = time.perf_counter()
    hook.stop()
    counts = monitor.stop()
    if feedback is not None:
        feedback.round()
    if code != 0:
        out.update(error=f"the workload exited with status {code}", exit_code=1)
        return finish(1)
    st = engine.stats.to_dict()
    if getattr(hook, "errors", 0):
        warns(f"the launch hook failed on {hook.errors} launch(es): {getattr(hook, 'last_error', '')}")
    if st["errors"]:
        warns(f"the policy failed on {st['errors']} launch(es): {st['last_error']}")
    elif st["failed_calls"]:
        warns(f"the driver refused {st['failed_calls']} prefetch/eviction call(s): {st['last_error']}")
    if counts.dropped:
        warns(f"{counts.dropped} activity records were lost ({counts.cupti_dropped} dropped by CUPTI, "
              f"{counts.decode_errors} unreadable): fault and transfer counts are low by as much")
    if engine.stats.launches == 0:
        warns("the workload launched no kernels that the runner saw")
    if getattr(hook, "runtime_reaches_driver", None) is False:
        # the hook delivers the first runtime launch at the runtime call's exit, after its kernel is
        # queued; once it knows no driver callback follows, later ones at their enter
        warns("CUDA runtime launches did not reach the driver's launch callbacks: the first one was seen "
              "only after its kernel was queued (its prefetch came too late); later ones in time")
    if capacity is not None and st["max_excess_bytes"] > UNIT:
        warns(f"the emulated capacity was exceeded by {st['max_excess_bytes'] / 2**20:.1f} MiB after a launch's"
              f" evictions ({st['boundaries_over']} launch boundaries over it): more than one 2 MiB chunk, so this"
              " run is not valid")
    if relocator is not None and relocator.matching and engine.stats.launches != relocator.n:
        warns(f"the run launched {engine.stats.launches} kernels, the trace has {relocator.n}")
    out.update({
        "time_s": (t1 - first_launch[0]) if first_launch else (t1 - t0),
        "wall_s": t1 - t0,
        "gpu_kernel_s": counts.kernel_busy_s,
        "gpu_span_s": counts.gpu_span_s,
        "faults": counts.faults,
        "htod_bytes": counts.htod_bytes,
        "dtoh_bytes": counts.dtoh_bytes,
        "htod_by_cause": counts.htod_by_cause,
        "dtoh_by_cause": counts.dtoh_by_cause,
        "thrashing": counts.thrashing,
        "launches": engine.stats.launches,
        "prefetch_bytes": st["prefetch_bytes"],
        "evict_bytes": st["evict_bytes"],
        "prefetches": st["prefetches"],               # calls the runner made
        "ahead_launches": st["ahead_launches"],       # launches prefetched one launch early (lookahead)
        "quiet_launches": st["quiet_launches"],       # planned: launches with nothing due, counted and returned
        "waits_covered": st["waits_covered"],         # planned: stream waits left out (a later event waited on)
        "plan_fallbacks": st["plan_fallbacks"],       # planned: launches whose room the ledger made
        # planned: bytes of the plan's ranges whose allocation no launch had pointed into by their
        # launch's callback (left to faults)
        "plan_unmapped_bytes": planned.unmapped_bytes if planned is not None else None,
        "evictions": st["evictions"],
        "overflow_launches": st["overflow_launches"],
        "failed_calls": st["failed_calls"],
        "predict_us_mean": st["predict_us_mean"],
        "predict_us_max": st["predict_us_max"],
        "callback_us_mean": 1e6 * st["callback_s"] / st["launches"] if st["launches"] else None,
        # the capacity ledger (cuda_engine.py): what moved, and how far over the capacity it went
        "moved_htod_bytes": st["moved_htod_bytes"],
        "moved_dtoh_bytes": st["moved_dtoh_bytes"],
        "unplanned_htod_bytes": st["unplanned_htod_bytes"],
        "peak_before_evict_bytes": st["peak_before_evict_bytes"],
        "max_excess_bytes": st["max_excess_bytes"],
        "boundaries_over": st["boundaries_over"],
        "valid": capacity is None or st["max_excess_bytes"] <= UNIT,
        "unseen_kernels": st["unseen_kernels"],
        "period": st["period"],
        "feedback_updates": st["feedback_updates"],
        "oracle_unmapped_bytes": relocator.unmapped_bytes if relocator is not None else None,
        "dropped_records": counts.dropped,            # CUPTI's dropped records + unreadable ones
        "dropped_by_cupti": counts.cupti_dropped,
        "record_decode_errors": counts.decode_errors,
        "records_not_kept": counts.not_kept,          # counted, but past the raw-record lists' cap
        "incomplete_records": counts.incomplete,
        "runtime_reaches_driver": getattr(hook, "runtime_reaches_driver", None),
        "timeline": build_timeline(counts, engine.corr_launch) if job.timeline else None,
        "managed_peak_bytes": budget.peak if budget is not None else None,
    })
    return finish(0)


def _chain(a: dict, b: dict) -> dict:
    """Two `api_callbacks` mappings as one: where both watch a call, each runs (a's first)."""
    out = dict(a)
    for key, g in b.items():
        f = out.get(key)
        out[key] = g if f is None else (lambda f, g: lambda site, cb: (f(site, cb), g(site, cb)))(f, g)
    return out


def main(argv: list[str] | None = None) -> int:
    # the parent (`pagecast replay --backend gpu`) may be killed outright at a time limit: this
    # run, and the GPU work it holds, must not outlive it
    procs.exit_with_parent()
    return child_main(argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
