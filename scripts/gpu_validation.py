#!/usr/bin/env python
"""GPU validation of the replay: measured times per policy, two baselines, and the simulator beside each run.

For each GPU workload (default llm-decode, spmv-cg, jacobi2d; run as
`python -m pagecast.datasets.gpu.NAME --scale S`), at a replay scale whose managed
footprint is at least 1 GiB (`--replay-scale auto`: the smallest scale whose plan reaches
`--min-footprint`; every workload refuses to start past 80% of the GPU's free memory, and
nothing here passes --allow-oversubscription: the capacity is emulated):

1. collect full-mode traces at the fit scales (default: an eighth and a quarter of the replay
   scale) and fit a model on them;
2. collect a full-mode trace at the replay scale (the oracle's footprints, the footprint that
   --oversub divides, and the simulator's input);
3. the two baselines: the workload with no runner at all (its own `PAGECAST_WORKLOAD` line:
   first launch to the end of GPU work), and `demand` with the runner at 100%: the runner's own
   overhead;
4. replay on the GPU at each emulated level (default 200%) with demand, template and oracle,
   `--repeat` interleaved repeats (default 5);
5. calibrate the GPU once (`pagecast calibrate`), and simulate the same runs with that profile,
   the runner's host time per launch included (`host_launch_s`);

then write a markdown section: per run the repeats, the GPU's median with min and max, the
simulated time and GPU/simulated, calls, bytes in and out, faults, host us per launch and the
largest excess over the emulated capacity (a run over it by more than one 2 MiB chunk is not
valid), and whether a difference from demand is real (the repeat ranges do not overlap).
A step that fails is reported in the section and the rest goes on. `--dry-run` prints the
commands and renders the section from a synthetic run.

    python scripts/gpu_validation.py docs/gpu-validation-run.md --workdir /tmp/pcval
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from pagecast.procs import run_group

# the three the bars are on, then the data-dependent one (run when time is left)
WORKLOADS = ("llm-decode", "spmv-cg", "jacobi2d", "moe-decode")
POLICIES = ("demand", "template", "oracle")
OVERSUB = (2.0,)
REPEAT = 5
MIN_FOOTPRINT = 2**30    # managed bytes a validation workload has at its replay scale, at least
CHUNK = 2 * 2**20        # the driver's chunk: a run over its capacity by more is not valid
BAR_SPEEDUP = 3.0        # template >= 3x faster than demand
BAR_ORACLE = 0.8         # template's speed >= 80% of oracle's
BAR_SIM = 0.30           # simulated time within 30% of measured
BUDGET_PREDICT_US = 20.0 # online prediction per launch
MIN_REPEATS = 5          # repeats per policy that make a median and a range mean something


def pagecast(*args: str) -> list[str]:
    return [sys.executable, "-m", "pagecast.cli", *args]


def workload_cmd(name: str, scale: float) -> list[str]:
    return ["python", "-m", f"pagecast.datasets.gpu.{name.replace('-', '_')}", "--scale", str(scale)]


def planned_bytes(name: str, scale: float) -> int:
    """The managed bytes the workload plans at `scale` (its module's `plan`, pure: no GPU)."""
    import importlib
    import inspect

    mod = importlib.import_module(f"pagecast.datasets.gpu.{name.replace('-', '_')}")
    kw = {"seed": 0} if "seed" in inspect.signature(mod.plan).parameters else {}
    r = mod.plan(scale, **kw)
    return int(r[-1] if isinstance(r, tuple) else r)


def replay_scale_for(name: str, min_bytes: int = MIN_FOOTPRINT) -> float:
    """The smallest scale (3 significant digits) at which the workload plans `min_bytes` or more."""
    lo, hi = 0.01, 1.0
    while planned_bytes(name, hi) < min_bytes:
        lo, hi = hi, hi * 2
        if hi > 1e6:
            raise ValueError(f"{name} never reaches {min_bytes} bytes")
    for _ in range(40):
        mid = (lo + hi) / 2
        if planned_bytes(name, mid) >= min_bytes:
            hi = mid
        else:
            lo = mid
    s = float(f"{hi:.3g}")
    while planned_bytes(name, s) < min_bytes:
        s = float(f"{s * 1.01:.3g}")
    return s


def plan(name: str, work: Path, *, fit_scales, replay_scale: float, oversub, policies, repeat: int,
         profile: Path, managed: str | None = None, baselines: bool = True) -> list[tuple[str, list[str]]]:
    """The (step, command) pairs for one workload (pure).

    The model is fitted on traces at the fit scales (two or more let the fit
    tell a fixed size from one that grows with the arguments) and replayed at
    another scale.
    """
    d = work / name
    fit_scales = [fit_scales] if isinstance(fit_scales, (int, float)) else list(fit_scales)
    smalls = [d / f"{name}-fit-{s:g}.pctrace" for s in fit_scales]
    raw = d / f"{name}-replay.pctrace"
    big = d / f"{name}-replay-truth.pctrace"
    fp = d / f"{name}-footprints.json"
    model = d / f"{name}.model.json"
    ov = ",".join(f"{r:g}" for r in oversub)
    pol = ",".join(policies)
    # the simulator also replays the runner's own decisions (policy runner): the GPU's template
    # is compared with it, so that the difference is the cost model, not the planning
    sim_pol = pol + (",runner" if "template" in policies else "")
    extra = ["--managed", managed] if managed else []
    steps = [(f"collect (fit scale {s:g})", pagecast("collect", "-o", str(p), "--mode", "full", "--force", *extra,
                                                     "--", *workload_cmd(name, s)))
             for s, p in zip(fit_scales, smalls)]
    base = [
        # the program alone (run `repeat` times), then the runner doing nothing but demand at 100%
        ("no runner", [sys.executable, *workload_cmd(name, replay_scale)[1:]]),
        ("replay gpu 100%",
         pagecast("replay", str(big), "--backend", "gpu", "--policy", "demand", "--oversub", "1",
                  "--repeat", str(repeat), "--json", "--force", "-o", str(d / f"{name}.gpu-1.parquet"),
                  "--", *workload_cmd(name, replay_scale))),
    ] if baselines else []
    return steps + [
        ("fit", pagecast("fit", *map(str, smalls), "-o", str(model), "--force")),
        # the workload records its own launches' footprints in the same run (datasets/gpu/extents.py) ...
        ("collect (replay scale)", ["env", f"PAGECAST_FOOTPRINTS={fp}",
                                    *pagecast("collect", "-o", str(raw), "--mode", "full", "--force", *extra, "--",
                                              *workload_cmd(name, replay_scale))]),
        # ... which become the trace's truth: the oracle's footprints and the simulator's, where the
        # faults of a run with the driver's prefetcher on show about a quarter of them
        ("truth", [sys.executable, "-m", "pagecast.datasets.gpu.truth", str(raw), str(fp), "-o", str(big), "--force"]),
    ] + base + [
        # one GPU replay per level, so that a time-out loses one level, not all of them
        (f"replay gpu {100 * r:.0f}%",
         pagecast("replay", str(big), "--backend", "gpu", "--model", str(model), "--policy", pol,
                  "--oversub", f"{r:g}", "--repeat", str(repeat), "--json", "--force",
                  "-o", str(d / f"{name}.gpu-{r:g}.parquet"), "--", *workload_cmd(name, replay_scale)))
        for r in oversub
    ] + [
        # --span unit: the GPU runner prefetches the predicted (or, for oracle, true) ranges
        # themselves, so the simulator's planned policies plan on them too, not on wider spans
        ("replay sim", pagecast("replay", str(big), "--backend", "sim", "--costs", str(profile), "--model", str(model),
                                "--policy", sim_pol, "--oversub", ("1," if baselines else "") + ov, "--span", "unit",
                                "--json", "--force",
                                "-o", str(d / f"{name}.sim.parquet"))),
    ]


def run_step(cmd: list[str], timeout: float, log) -> tuple[bool, str, str]:
    """Run one command in a process group of its own; (ok, stdout, one-line reason).

    At the time limit the whole group is stopped (SIGTERM, then SIGKILL): `pagecast replay
    --backend gpu` runs each measurement in a child process, which must not go on holding the
    GPU after its parent is stopped.
    """
    log.write(f"$ {shlex.join(cmd)}\n")
    log.flush()
    t0 = time.time()
    try:
        p = run_group(cmd, timeout, stdout=subprocess.PIPE, stderr=log, text=True)
    except subprocess.TimeoutExpired:
        log.write(f"# timed out after {timeout:.0f} s: its process group was stopped\n")
        return False, "", f"timed out after {timeout:.0f} s"
    log.write(f"# exit {p.returncode} after {time.time() - t0:.1f} s\n")
    if p.returncode != 0:
        return False, p.stdout, f"exit status {p.returncode} (see the log)"
    return True, p.stdout, ""


def workload_time(stdout: str) -> float | None:
    """The time a GPU workload reports of itself (datasets/gpu/common.py's PAGECAST_WORKLOAD line:
    first launch to the end of GPU work), or None."""
    for line in reversed((stdout or "").splitlines()):
        if line.startswith("PAGECAST_WORKLOAD "):
            try:
                return float(json.loads(line.split(" ", 1)[1])["time_s"])
            except (ValueError, KeyError, TypeError):
                return None
    return None


SYNTHETIC_PROFILE = {"fault_time_us": 20.0, "htod_GBps": 50.0, "dtoh_GBps": 12.7, "duplex": False,
                     "pipelined_GBps": 12.7, "transfer_latency_us": 10.0, "host_launch_us": 15.0}


def synthetic_results() -> dict:
    """What one workload's measurements look like (the dry run renders its report from them)."""
    gpu, sim = [], []
    for ov, pol, times, st in ((1.0, "demand", [0.50, 0.52, 0.49, 0.51, 0.50], 0.48),
                               (2.0, "demand", [2.10, 2.30, 2.20, 2.25, 2.15], 1.90),
                               (2.0, "template", [0.90, 0.95, 0.92, 0.97, 0.93], 1.05),
                               (2.0, "oracle", [0.80, 0.84, 0.83, 0.81, 0.82], 0.78)):
        med = statistics.median(times)
        gpu.append({"policy": pol, "oversub": ov, "time_s": med, "time_s_min": min(times), "time_s_max": max(times),
                    "repeats": len(times), "faults": 12000 if pol == "demand" else 900, "htod_bytes": 3 * 2**30,
                    "dtoh_bytes": 2**30 if ov > 1 else 0, "prefetches": 0 if pol == "demand" else 4000,
                    "evictions": 1500 if ov > 1 else 0, "callback_us_mean": 9.0,
                    "max_excess_bytes": 0 if pol != "oracle" else 2 * 2**20, "valid": True,
                    "speedup_vs_demand": None, "fraction_of_oracle": None})
        sim.append({"policy": "runner" if pol == "template" else pol, "oversub": ov, "time_s": st,
                    "compute_s": 0.4, "stall_s": st - 0.4, "faults": 5000 if pol == "demand" else 700,
                    "htod_bytes": 3 * 2**30, "dtoh_bytes": 2**30 if ov > 1 else 0})
    for r in gpu:
        d = next(x for x in gpu if x["oversub"] == r["oversub"] and x["policy"] == "demand")
        o = next((x for x in gpu if x["oversub"] == r["oversub"] and x["policy"] == "oracle"), None)
        r["speedup_vs_demand"] = d["time_s"] / r["time_s"]
        r["fraction_of_oracle"] = o["time_s"] / r["time_s"] if o else None
    rows = compare(gpu, sim)
    return {"synthetic": {"rows": rows, "errors": [], "baseline": {"no_runner": [0.47, 0.46, 0.48, 0.47, 0.47]}}}


class Stopped(Exception):
    """SIGTERM or SIGINT: the running step's process group is stopped, the report written."""


def _stop_on_signal(signum, frame):
    raise Stopped(signal.Signals(signum).name)


# ---- the report (pure) --------------------------------------------------------------------

def _fmt(x, spec: str = ".3g", none: str = "–") -> str:
    return none if x is None else format(x, spec)


def _key(r: dict) -> tuple:
    return (round(float(r.get("oversub") or 0), 3), r["policy"])


def _ranges_apart(a: dict, b: dict) -> bool | None:
    """Whether two runs' repeat ranges [min, max] do not overlap (a real difference); None when a
    range is unknown or either ran fewer than two repeats."""
    if min(a.get("repeats") or 0, b.get("repeats") or 0) < 2:
        return None
    lo_a, hi_a, lo_b, hi_b = (x.get(k) for x in (a, b) for k in ("gpu_min", "gpu_max"))
    if None in (lo_a, hi_a, lo_b, hi_b):
        return None
    return hi_a < lo_b or hi_b < lo_a


def compare(gpu: list[dict], sim: list[dict]) -> list[dict]:
    """Join measured and simulated rows on (oversub, policy); the GPU's template with the
    simulator's `runner` (the same online decisions) where it was simulated, with the
    simulator's planned template beside it (`sim_planned_speedup`)."""
    s = {_key(r): r for r in sim}
    out = []
    for g in sorted(gpu, key=lambda r: (_key(r)[0], POLICIES.index(r["policy"]) if r["policy"] in POLICIES else 9)):
        m = s.get(_key(g))
        planned = None
        if g["policy"] == "template" and (_key(g)[0], "runner") in s:
            planned = m
            m = s[(_key(g)[0], "runner")]
        calls = None
        if g.get("prefetches") is not None or g.get("evictions") is not None:
            calls = int(g.get("prefetches") or 0) + int(g.get("evictions") or 0)
        row = {"oversub": g.get("oversub"), "policy": g["policy"], "gpu_time_s": g.get("time_s"),
               "gpu_min": g.get("time_s_min"), "gpu_max": g.get("time_s_max"), "repeats": g.get("repeats"),
               "gpu_spread": g.get("time_s_spread"), "gpu_speedup": g.get("speedup_vs_demand"),
               "gpu_of_oracle": g.get("fraction_of_oracle"), "gpu_faults": g.get("faults"),
               "gpu_htod": g.get("htod_bytes"), "gpu_dtoh": g.get("dtoh_bytes"), "calls": calls,
               "host_us": g.get("callback_us_mean"), "excess": g.get("max_excess_bytes"),
               "valid": g.get("valid"), "predict_us": g.get("predict_us_mean"),
               "sim_time_s": m.get("time_s") if m else None,
               "sim_compute_s": m.get("compute_s") if m else None, "sim_stall_s": m.get("stall_s") if m else None,
               "sim_faults": m.get("faults") if m else None, "sim_htod": m.get("htod_bytes") if m else None,
               "sim_dtoh": m.get("dtoh_bytes") if m else None,
               "sim_speedup": m.get("speedup_vs_demand") if m else None,
               "sim_policy": m.get("policy") if m else None,
               "sim_planned_speedup": planned.get("speedup_vs_demand") if planned else None}
        if row["sim_time_s"] is not None and row["gpu_time_s"]:
            row["sim_error"] = (row["sim_time_s"] - row["gpu_time_s"]) / row["gpu_time_s"]
            row["ratio"] = row["gpu_time_s"] / row["sim_time_s"] if row["sim_time_s"] > 0 else None
        else:
            row["sim_error"] = row["ratio"] = None
        out.append(row)
    for r in out:   # a difference from demand at the same level is real only when the ranges do not overlap
        d = next((x for x in out if x["oversub"] == r["oversub"] and x["policy"] == "demand"), None)
        r["real"] = None if d is None or d is r else _ranges_apart(r, d)
    return out


def dominant(r: dict) -> str | None:
    """Where a run's simulated time and the GPU's differ, which term says most: the simulated
    time's split (kernels' compute against stalls: faults, transfers, waits) and the counted term
    whose simulated and measured values are furthest apart (faults, bytes in, bytes out)."""
    if r.get("sim_error") is None or r.get("sim_compute_s") is None:
        return None
    tot = (r.get("sim_compute_s") or 0) + (r.get("sim_stall_s") or 0)
    share = f"simulated {100 * (r['sim_stall_s'] or 0) / tot:.0f}% stall" if tot > 0 else "no simulated time"
    far, worst = None, 1.0
    for what, g, m in (("faults", r.get("gpu_faults"), r.get("sim_faults")),
                       ("bytes in", r.get("gpu_htod"), r.get("sim_htod")),
                       ("bytes out", r.get("gpu_dtoh"), r.get("sim_dtoh"))):
        if g is None or m is None or (g == 0 and m == 0):
            continue
        ratio = (max(g, m) + 1) / (min(g, m) + 1)
        if ratio > worst:
            far, worst = f"{what} {g:,} on the GPU, {m:,} simulated", ratio
    return share + (f"; furthest apart: {far}" if far else "")


def bars(rows: list[dict]) -> list[dict]:
    """Per oversubscription level: does template meet the bars?"""
    out = []
    for ov in sorted({r["oversub"] for r in rows if r["oversub"] is not None}):
        t = next((r for r in rows if r["oversub"] == ov and r["policy"] == "template"), None)
        if t is None:
            continue
        sp, fo = t["gpu_speedup"], t["gpu_of_oracle"]
        out.append({"oversub": ov, "speedup": sp, "of_oracle": fo,
                    "speedup_ok": sp is not None and sp >= BAR_SPEEDUP,
                    "oracle_ok": fo is not None and fo >= BAR_ORACLE})
    return out


def render(results: dict, *, device: str, date: str, profile: dict | None, settings: dict) -> str:
    """The markdown section. results: workload -> {"rows": compare(...), "errors": [(step, reason)]}."""
    L = ["## GPU replay: measured speedups, and the simulator against them", "",
         f"Run {date} on {device}. Fitted at scale(s) {settings['fit_scale']}, replayed at scale {settings['replay_scale']},"
         f" {settings['repeat']} run(s) per point (median); capacity emulated by evicting to the host"
         " (`pagecast replay --backend gpu`, see 'The GPU replay runner' above).", ""]
    if profile:
        L += ["Calibrated profile: "
              f"{_fmt(profile.get('fault_time_us'), '.1f')} us per fault, "
              f"{_fmt(profile.get('htod_GBps'), '.1f')} GB/s host to device, "
              f"{_fmt(profile.get('dtoh_GBps'), '.1f')} GB/s device to host, "
              f"eviction/population overlap: {'yes' if profile.get('duplex') else 'no'}"
              f" ({_fmt(profile.get('pipelined_GBps'), '.1f')} GB/s together).", ""]
    else:
        L += ["Calibration failed: the simulated columns are missing.", ""]
    all_ok = True
    for name, res in results.items():
        L += [f"### {name}", ""]
        for step, why in res.get("errors", []):
            L.append(f"- **{step} failed**: {why}")
            all_ok = False
        rows = res.get("rows") or []
        if res.get("errors"):
            L.append("")
        if not rows:
            L += ["No GPU measurements.", ""]
            all_ok = False
            continue
        L += ["| oversub | policy | repeats | GPU time (s), median (min–max) | simulated (s) | GPU / sim |"
              " speedup vs demand | real? | of oracle | calls | in (MiB) | out (MiB) | faults | host us/launch |"
              " excess over capacity (MiB) |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            err = r["sim_error"]
            flag = "" if err is None or abs(err) <= BAR_SIM else " ⚠"
            real = {True: "yes", False: "no (ranges overlap)", None: "–"}[r.get("real")]
            ex = r.get("excess")
            exs = _fmt(ex / 2**20 if ex is not None else None, ".1f") + ("" if r.get("valid", True) is not False
                                                                         else " **not valid**")
            L.append(f"| {_fmt(r['oversub'] and 100 * r['oversub'], '.0f')}% | {r['policy']} | {_fmt(r.get('repeats'), 'd')} | "
                     f"{_fmt(r['gpu_time_s'], '.3f')} ({_fmt(r.get('gpu_min'), '.3f')}–{_fmt(r.get('gpu_max'), '.3f')}) | "
                     f"{_fmt(r['sim_time_s'], '.3f')} | {_fmt(r.get('ratio'), '.2f')}{flag} | "
                     f"{_fmt(r['gpu_speedup'], '.2f')}x | {real} | {_fmt(r['gpu_of_oracle'], '.2f')} | "
                     f"{_fmt(r.get('calls'), 'd')} | {_fmt(r.get('gpu_htod') and r['gpu_htod'] / 2**20, '.1f')} | "
                     f"{_fmt(r.get('gpu_dtoh') and r['gpu_dtoh'] / 2**20, '.1f')} | {_fmt(r['gpu_faults'], 'd')} | "
                     f"{_fmt(r.get('host_us'), '.1f')} | {exs} |")
        base = res.get("baseline") or {}
        if base.get("no_runner"):
            nr = base["no_runner"]
            L += ["", f"- no runner at all, full capacity: {_fmt(statistics.median(nr), '.3f')} s"
                      f" ({_fmt(min(nr), '.3f')}–{_fmt(max(nr), '.3f')}, {len(nr)} runs)"]
            d100 = next((r for r in rows if r["policy"] == "demand" and r["oversub"] == 1.0), None)
            if d100 is not None and d100.get("gpu_time_s"):
                over = d100["gpu_time_s"] / statistics.median(nr) - 1
                L.append(f"- the runner's own overhead (demand with the runner at 100% against no runner):"
                         f" {100 * over:+.1f}%, {_fmt(d100.get('host_us'), '.1f')} us of host time per launch")
        if res.get("truth") is False:
            L.append("- oracle's footprints are the replay-scale trace's faults, collected with the driver's"
                     " prefetcher as the machine has it: with it on, a fault shows about a quarter of what a kernel"
                     " touches, so oracle is a lower estimate of a perfect plan")
        else:
            L.append("- oracle's footprints (and the simulator's) are the workload's own: what its kernels' code"
                     " reads and writes per launch (datasets/gpu/extents.py), attached to the trace as its truth")
        L.append("")
        b = bars(rows)
        for x in b:
            ok = x["speedup_ok"] and x["oracle_ok"]
            all_ok &= ok
            L.append(f"- {100 * x['oversub']:.0f}%: template {_fmt(x['speedup'], '.2f')}x faster than demand"
                     f" (bar {BAR_SPEEDUP:g}x: {'met' if x['speedup_ok'] else 'NOT met'}), "
                     f"{_fmt(x['of_oracle'], '.2f')} of oracle's speed"
                     f" (bar {BAR_ORACLE:g}: {'met' if x['oracle_ok'] else 'NOT met'})")
        if not b:
            L.append("- no template measurements: the bars cannot be checked")
            all_ok = False
        pus = [r["predict_us"] for r in rows if r["policy"] == "template" and r.get("predict_us") is not None]
        if pus:
            mean = sum(pus) / len(pus)
            L.append(f"- online prediction: {mean:.1f} us per launch on average"
                     f" (budget {BUDGET_PREDICT_US:g} us: {'met' if mean <= BUDGET_PREDICT_US else 'NOT met'})")
        runner = [r for r in rows if r["policy"] == "template" and r.get("sim_policy") == "runner"]
        if runner:
            L.append("- template's simulated columns replay the runner's own decisions (policy `runner`);"
                     " the simulator's planned template (looking ahead) reaches "
                     + ", ".join(f"{_fmt(r['sim_planned_speedup'], '.2f')}x at {100 * r['oversub']:.0f}%"
                                 for r in runner))
        # the measurements' own bars: every run within a chunk of its capacity, enough repeats
        over = [r for r in rows if r.get("excess") is not None and r["excess"] > CHUNK]
        few = [r for r in rows if (r.get("repeats") or 0) < MIN_REPEATS]
        L.append("- excess over the emulated capacity at most one 2 MiB chunk in every run: "
                 + ("met" if not over else f"NOT met ({', '.join(r['policy'] + ' at ' + _fmt(100 * (r['oversub'] or 0), '.0f') + '%' for r in over)})"))
        L.append(f"- at least {MIN_REPEATS} repeats per policy: " + ("met" if not few else f"NOT met ({len(few)} runs)"))
        all_ok &= not over and not few
        at200 = [r for r in rows if r["oversub"] == 2.0 and r.get("sim_error") is not None]
        if at200:
            within = all(abs(r["sim_error"]) <= BAR_SIM for r in at200)
            res["sim_within_200"] = within
            L.append(f"- simulator within {100 * BAR_SIM:.0f}% of the GPU on every run at 200%: "
                     f"{'yes' if within else 'no'}")
        gaps = [r for r in rows if r["sim_error"] is not None and abs(r["sim_error"]) > BAR_SIM]
        if gaps:
            L.append(f"- the simulator is more than {100 * BAR_SIM:.0f}% off the GPU on {len(gaps)} of"
                     f" {len(rows)} points (⚠): explain before trusting simulated numbers for this workload")
            for r in gaps:
                why = dominant(r)
                if why:
                    L.append(f"  - {r['policy']} at {_fmt(100 * (r['oversub'] or 0), '.0f')}%: {why}")
        L.append("")
    sims = [r.get("sim_within_200") for r in results.values() if r.get("sim_within_200") is not None]
    if sims:
        n_ok = sum(bool(x) for x in sims)
        L += [f"Simulator within {100 * BAR_SIM:.0f}% of the GPU at 200% on {n_ok} of {len(sims)} workloads"
              f" (bar: at least two of three: {'met' if n_ok >= 2 else 'NOT met'}).", ""]
        all_ok &= n_ok >= 2
    L += [f"**Overall: {'all bars met' if all_ok else 'some bars not met or steps failed (see above)'}.**", ""]
    return "\n".join(L)


# ---- main ---------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("output", help="markdown file to write the section to (overwritten)")
    ap.add_argument("--workdir", default=None, help="where traces, models and results go (default: a temp dir)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--oversub", default=",".join(f"{r:g}" for r in OVERSUB))
    ap.add_argument("--fit-scale", default="auto",
                    help="comma-separated scales to fit on (default auto: an eighth and a quarter of the replay scale)")
    ap.add_argument("--replay-scale", default="auto",
                    help="the scale replayed (default auto: the smallest whose managed footprint is --min-footprint)")
    ap.add_argument("--min-footprint", type=float, default=MIN_FOOTPRINT / 2**30,
                    help="GiB of managed memory the auto replay scale reaches (default 1)")
    ap.add_argument("--repeat", type=int, default=REPEAT, help=f"interleaved repeats per policy (default {REPEAT})")
    ap.add_argument("--no-baselines", action="store_true", help="skip the no-runner and 100%% runs")
    ap.add_argument("--managed", default=None, help="passed to pagecast collect --managed (e.g. cupy,torch)")
    ap.add_argument("--step-timeout", type=float, default=300.0, help="seconds per command (default 300)")
    env_budget = os.environ.get("GPU_VALIDATION_TIMEOUT")
    ap.add_argument("--budget-s", type=float,
                    default=(float(env_budget) - 20) if env_budget else 3600.0,
                    help="total seconds for all steps; later steps are skipped and reported when it runs out"
                         " (default: $GPU_VALIDATION_TIMEOUT - 20, else 3600)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    a = ap.parse_args(argv)

    import tempfile

    work = Path(a.workdir or tempfile.mkdtemp(prefix="pagecast-gpuval-"))
    work.mkdir(parents=True, exist_ok=True)
    names = [w for w in a.workloads.split(",") if w]
    policies = [p for p in a.policies.split(",") if p]
    oversub = [float(x) for x in a.oversub.split(",") if x]
    profile_path = work / "calibrated.json"
    scales: dict = {}
    for n in names:
        try:
            rs = replay_scale_for(n, int(a.min_footprint * 2**30)) if a.replay_scale == "auto" else float(a.replay_scale)
            fs = ([float(f"{rs / 8:.3g}"), float(f"{rs / 4:.3g}")] if a.fit_scale == "auto"
                  else [float(x) for x in a.fit_scale.split(",") if x])
        except (ValueError, ImportError) as e:
            print(f"error: {n}: {e}", file=sys.stderr)
            return 2
        scales[n] = (rs, fs)
    plans = {n: plan(n, work, fit_scales=scales[n][1], replay_scale=scales[n][0], oversub=oversub,
                     policies=policies, repeat=a.repeat, profile=profile_path, managed=a.managed,
                     baselines=not a.no_baselines) for n in names}
    calibrate = pagecast("calibrate", "-o", str(profile_path), "--force", "--json")
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    settings = {"fit_scale": "; ".join(f"{n} {', '.join(f'{x:g}' for x in scales[n][1])}" for n in names),
                "replay_scale": "; ".join(f"{n} {scales[n][0]:g} ({planned_bytes(n, scales[n][0]) / 2**30:.2f} GiB"
                                          " managed)" for n in names),
                "repeat": a.repeat}
    if a.dry_run:
        print(shlex.join(calibrate))
        for steps in plans.values():
            for _, cmd in steps:
                print(shlex.join(cmd))
        # the report as a run would write it, from synthetic measurements (no GPU)
        md = render(synthetic_results(), device="a synthetic run (no GPU; --dry-run)", date=date,
                    profile=SYNTHETIC_PROFILE, settings=settings)
        Path(a.output).parent.mkdir(parents=True, exist_ok=True)
        Path(a.output).write_text(md)
        print(md, file=sys.stderr)
        return 0

    log_path = work / "gpu_validation.log"
    deadline = time.time() + a.budget_s
    results: dict = {n: {"errors": [], "rows": [], "baseline": {}} for n in names}
    state = {"profile": None, "device": "an unknown device (calibrate failed or did not run)"}

    def write_report(final: bool) -> None:
        # rewritten after every step: a run cut short by its caller still leaves a report
        md = render(results, device=state["device"], date=date, profile=state["profile"], settings=settings)
        if not final:
            md += "\n*Partial: the validation was still running (or was stopped) when this was written.*\n"
        md += f"\nCommands and their stderr: `{log_path}`.\n"
        Path(a.output).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(a.output).with_name(f".{Path(a.output).name}.tmp")
        tmp.write_text(md)
        tmp.replace(a.output)

    def timeout_left() -> float:
        return min(a.step_timeout, deadline - time.time())

    stopped = None
    done: set = set()
    old_handlers = {sig: signal.signal(sig, _stop_on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    with open(log_path, "w") as log:
        try:
            write_report(False)
            ok, out = False, ""
            if timeout_left() >= 10:
                ok, out, why = run_step(calibrate, timeout_left(), log)
            if ok:
                state["profile"] = json.loads(out)
                state["device"] = (state["profile"].get("device") or {}).get("name") or state["device"]
            write_report(False)
            for n, steps in plans.items():
                res = results[n]
                gpu_rows: list = []
                sim_rows: list = []
                fallback = None          # (the truth trace's path, the collected trace's) when truth failed
                for step, cmd in steps:
                    if step == "replay sim" and state["profile"] is None:
                        res["errors"].append((step, "skipped: no calibrated profile"))
                        continue
                    if timeout_left() < 10:
                        res["errors"].append((step, "skipped: out of time (--budget-s)"))
                        continue
                    print(f"[{n}] {step} ...", file=sys.stderr, flush=True)
                    if step == "no runner":
                        times = []
                        for _ in range(a.repeat):
                            if timeout_left() < 10:
                                break
                            ok, out, why = run_step(cmd, timeout_left(), log)
                            t = workload_time(out) if ok else None
                            if t is not None:
                                times.append(t)
                        if times:
                            res["baseline"]["no_runner"] = times
                        else:
                            res["errors"].append((step, why if not ok else "no PAGECAST_WORKLOAD line"))
                        write_report(False)
                        continue
                    if fallback is not None:
                        cmd = [fallback[1] if c == fallback[0] else c for c in cmd]
                    ok, out, why = run_step(cmd, timeout_left(), log)
                    if not ok and step == "truth":
                        # the collected trace as it is: its observed footprints (a lower estimate)
                        res["errors"].append((step, why + "; oracle and the simulator use the observed footprints"))
                        fallback = (cmd[cmd.index("-o") + 1], cmd[3])
                        res["truth"] = False
                        continue
                    if ok and step == "truth":
                        res["truth"] = True
                    if not ok:
                        res["errors"].append((step, why))
                        if step.startswith("collect") or step == "fit":
                            break  # later steps need this one
                        continue
                    if step.startswith("replay gpu"):
                        gpu_rows += json.loads(out)
                    elif step == "replay sim":
                        sim_rows = json.loads(out)
                    if gpu_rows:
                        res["rows"] = compare(gpu_rows, sim_rows)
                    write_report(False)
                done.add(n)
        except Stopped as e:
            stopped = str(e)
            log.write(f"# stopped by {stopped}\n")
        finally:
            for sig, h in old_handlers.items():
                signal.signal(sig, h)
    if stopped:
        for n in names:
            if n not in done:
                results[n]["errors"].append(("the rest", f"not reached: stopped by {stopped}"
                                                          " (the step running then was stopped with its processes)"))
        write_report(False)
        print(f"stopped by {stopped}; wrote {a.output}", file=sys.stderr)
        return 128 + int(getattr(signal, stopped, signal.SIGTERM))
    write_report(True)
    print(f"wrote {a.output}", file=sys.stderr)
    return 0 if all(not r["errors"] for r in results.values()) and state["profile"] is not None else 1

if __name__ == "__main__":
    sys.exit(main())
