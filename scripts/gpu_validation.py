#!/usr/bin/env python
"""GPU validation of the replay: measured speedups per policy, and the simulator against them.

For each GPU workload (default jacobi2d, mlp-train, llm-decode; run as
`python -m pagecast.datasets.gpu.NAME --scale S`):

1. collect full-mode traces at the fit scales (default 0.25 and 0.5) and fit a
   model on them;
2. collect a full-mode trace at the replay scale (the oracle's footprints, the
   footprint that --oversub divides, and the simulator's input);
3. replay on the GPU at the replay scale, at emulated 150/200/300%
   oversubscription, with demand, alloc, template and oracle;
4. calibrate the GPU once (`pagecast calibrate`);
5. simulate the same runs with the calibrated profile (`--backend sim --costs`);

then write a markdown section (date, device, measured times and speedups per
policy, simulated vs measured, and the bars: template >= 3x faster than demand
and >= 80% of oracle's speed at every level; the simulator within 30% of the
GPU) to the path given. A step that fails is reported in the section and the
rest goes on. `--dry-run` prints the commands without running them.

    python scripts/gpu_validation.py docs/gpu-validation-run.md --workdir /tmp/pcval
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from pagecast.procs import run_group

WORKLOADS = ("jacobi2d", "mlp-train", "llm-decode")
POLICIES = ("demand", "alloc", "template", "oracle")
OVERSUB = (1.5, 2.0, 3.0)
BAR_SPEEDUP = 3.0        # template >= 3x faster than demand
BAR_ORACLE = 0.8         # template's speed >= 80% of oracle's
BAR_SIM = 0.30           # simulated time within 30% of measured
BUDGET_PREDICT_US = 20.0 # online prediction per launch


def pagecast(*args: str) -> list[str]:
    return [sys.executable, "-m", "pagecast.cli", *args]


def workload_cmd(name: str, scale: float) -> list[str]:
    return ["python", "-m", f"pagecast.datasets.gpu.{name.replace('-', '_')}", "--scale", str(scale)]


def plan(name: str, work: Path, *, fit_scales, replay_scale: float, oversub, policies, repeat: int,
         profile: Path, managed: str | None = None) -> list[tuple[str, list[str]]]:
    """The (step, command) pairs for one workload (pure).

    The model is fitted on traces at the fit scales (two or more let the fit
    tell a fixed size from one that grows with the arguments) and replayed at
    another scale.
    """
    d = work / name
    fit_scales = [fit_scales] if isinstance(fit_scales, (int, float)) else list(fit_scales)
    smalls = [d / f"{name}-fit-{s:g}.pctrace" for s in fit_scales]
    big = d / f"{name}-replay.pctrace"
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
    return steps + [
        ("fit", pagecast("fit", *map(str, smalls), "-o", str(model), "--force")),
        ("collect (replay scale)", pagecast("collect", "-o", str(big), "--mode", "full", "--force", *extra, "--",
                                            *workload_cmd(name, replay_scale))),
    ] + [
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
                                "--policy", sim_pol, "--oversub", ov, "--span", "unit", "--json", "--force",
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


class Stopped(Exception):
    """SIGTERM or SIGINT: the running step's process group is stopped, the report written."""


def _stop_on_signal(signum, frame):
    raise Stopped(signal.Signals(signum).name)


# ---- the report (pure) --------------------------------------------------------------------

def _fmt(x, spec: str = ".3g", none: str = "–") -> str:
    return none if x is None else format(x, spec)


def _key(r: dict) -> tuple:
    return (round(float(r.get("oversub") or 0), 3), r["policy"])


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
        row = {"oversub": g.get("oversub"), "policy": g["policy"], "gpu_time_s": g.get("time_s"),
               "gpu_spread": g.get("time_s_spread"), "gpu_speedup": g.get("speedup_vs_demand"),
               "gpu_of_oracle": g.get("fraction_of_oracle"), "gpu_faults": g.get("faults"),
               "gpu_htod": g.get("htod_bytes"), "predict_us": g.get("predict_us_mean"),
               "sim_time_s": m.get("time_s") if m else None,
               "sim_speedup": m.get("speedup_vs_demand") if m else None,
               "sim_policy": m.get("policy") if m else None,
               "sim_planned_speedup": planned.get("speedup_vs_demand") if planned else None}
        if row["sim_time_s"] is not None and row["gpu_time_s"]:
            row["sim_error"] = (row["sim_time_s"] - row["gpu_time_s"]) / row["gpu_time_s"]
        else:
            row["sim_error"] = None
        out.append(row)
    return out


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
        L += ["| oversub | policy | GPU time (s) | spread | speedup vs demand | of oracle | faults |"
              " simulated time (s) | simulated speedup | sim vs GPU |",
              "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            err = r["sim_error"]
            flag = "" if err is None or abs(err) <= BAR_SIM else " ⚠"
            L.append(f"| {_fmt(r['oversub'] and 100 * r['oversub'], '.0f')}% | {r['policy']} | "
                     f"{_fmt(r['gpu_time_s'], '.3f')} | {_fmt(r['gpu_spread'] and 100 * r['gpu_spread'], '.0f')}% | "
                     f"{_fmt(r['gpu_speedup'], '.2f')}x | {_fmt(r['gpu_of_oracle'], '.2f')} | {_fmt(r['gpu_faults'], 'd')} | "
                     f"{_fmt(r['sim_time_s'], '.3f')} | {_fmt(r['sim_speedup'], '.2f')}x | "
                     f"{_fmt(err and 100 * err, '+.0f')}%{flag} |")
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
        gaps = [r for r in rows if r["sim_error"] is not None and abs(r["sim_error"]) > BAR_SIM]
        if gaps:
            L.append(f"- the simulator is more than {100 * BAR_SIM:.0f}% off the GPU on {len(gaps)} of"
                     f" {len(rows)} points (⚠): explain before trusting simulated numbers for this workload")
        L.append("")
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
    ap.add_argument("--fit-scale", default="0.25,0.5", help="comma-separated scales to fit on (default 0.25,0.5)")
    ap.add_argument("--replay-scale", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=1)
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
    fit_scales = [float(x) for x in a.fit_scale.split(",") if x]
    plans = {n: plan(n, work, fit_scales=fit_scales, replay_scale=a.replay_scale, oversub=oversub,
                     policies=policies, repeat=a.repeat, profile=profile_path, managed=a.managed) for n in names}
    calibrate = pagecast("calibrate", "-o", str(profile_path), "--force", "--json")
    if a.dry_run:
        print(shlex.join(calibrate))
        for steps in plans.values():
            for _, cmd in steps:
                print(shlex.join(cmd))
        return 0

    log_path = work / "gpu_validation.log"
    deadline = time.time() + a.budget_s
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    settings = {"fit_scale": ", ".join(f"{x:g}" for x in fit_scales), "replay_scale": a.replay_scale,
                "repeat": a.repeat}
    results: dict = {n: {"errors": [], "rows": []} for n in names}
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
                for step, cmd in steps:
                    if step == "replay sim" and state["profile"] is None:
                        res["errors"].append((step, "skipped: no calibrated profile"))
                        continue
                    if timeout_left() < 10:
                        res["errors"].append((step, "skipped: out of time (--budget-s)"))
                        continue
                    print(f"[{n}] {step} ...", file=sys.stderr, flush=True)
                    ok, out, why = run_step(cmd, timeout_left(), log)
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
