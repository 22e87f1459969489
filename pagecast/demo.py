"""`pagecast demo`: the whole pipeline on the built-in workloads, no GPU needed.

Generates every workload model at a small scale (seeds 1 and 2 to fit, 3 to
replay), fits one model on the fitting traces, then replays each workload
alone and MSched's three multitask mixes at 150%, 200% and 300%
oversubscription with demand, alloc, template and oracle, and prints the
comparison. Everything lands in DIR: traces/, model.json, results.parquet
(+ timeline), and report.html.

The pipeline's orchestration: it calls each stage through its library entry
point (datasets, fit, the simulator, results files, the report), which is
why it sits above all of them (docs/architecture.md, "Layers").
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from pagecast import console, procs
from pagecast.datasets.registry import DEMO_WORKLOADS, MIXES, check_scale, reuse_or_make
from pagecast.errors import OutputExistsError, UsageError
from pagecast.footprints import footprints
from pagecast.jsonfile import write_json_atomic
from pagecast.predict.fit import fit_model
from pagecast.predict.model_io import load_model, save_model
from pagecast.replay.costs import load_profile
from pagecast.replay.results_io import write_results
from pagecast.replay.results_table import results_table
from pagecast.replay.sim.sweep import SimConfig, replay_sim
from pagecast.replay.unit_space import compute_times
from pagecast.report.pivot import make_pivot, means_line, pivot_table
from pagecast.report.render import write_report
from pagecast.trace import KERNEL, LAZY_TABLES, MANIFEST, prepare_output_dir, read_trace

DEMO_FORMAT = "pagecast-demo"
SCALE = 0.2
FIT_SEEDS = (1, 2)
REPLAY_SEED = 3
OVERSUB = (1.5, 2.0, 3.0)
POLICIES = ["demand", "alloc", "template", "oracle"]


@dataclass
class DemoConfig:
    """What `pagecast demo` runs (the command translates its flags into one)."""

    output: str | Path = "pagecast-demo"   # where traces, model, results and report go
    force: bool = False                     # reuse a non-empty demo directory
    scale: float | None = None              # workload scale (None: SCALE)
    costs: str = "msched-rtx5080"           # cost profile
    jobs: int | None = None                 # replay processes (None: default_jobs())
    json: bool = False                      # print the runs as one JSON list
    all: bool = False                       # print every run, not the one-screen pivot


def check_config(cfg: DemoConfig) -> float:
    """Every option checked before anything is written (a bad one leaves no directory behind):
    the scale, the processes, the cost profile. Returns the scale."""
    scale = SCALE if cfg.scale is None else check_scale(cfg.scale)
    if cfg.jobs is not None and cfg.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, not {cfg.jobs}")
    load_profile(cfg.costs)   # an unknown name or a bad file: one line, exit 2
    return scale


def prepare_dir(out: Path, force: bool) -> bool:
    """Make `out` ready for a demo; True where it resumes an unfinished one.

    A demo directory whose run did not finish (failed, interrupted, killed: its manifest says
    `complete: false`) is resumed without --force: its traces are kept where they match and the
    rest is redone. A finished one is replaced only with --force; anything else (a file, another
    directory with files in it) is never replaced."""
    if out.is_symlink() or out.exists() and not out.is_dir():
        raise OutputExistsError(out, f"{out} is a file, not a demo directory; refusing to replace it even with"
                                     " --force (give -o a directory name)")
    if out.is_dir() and any(out.iterdir()):
        man = read_demo_manifest(out)
        if man is None:
            raise OutputExistsError(out, f"{out} is a non-empty directory that is not a pagecast demo;"
                                         " refusing to delete it even with --force")
        if not man.get("complete", True) and not force:
            return True   # resumed: traces kept where they match, the rest remade
        if not force:
            raise OutputExistsError(out, f"{out} exists and holds a finished demo; pass --force to run it again there")
        prepare_output_dir(out, True, owned=lambda p: True)   # a demo directory: checked just above
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / MANIFEST, {"format": DEMO_FORMAT, "version": 1, "complete": False}, force=True)
    return False


def read_demo_manifest(out: Path) -> dict | None:
    """The demo manifest in `out`, or None where there is none (or another kind of manifest)."""
    try:
        man = json.loads((out / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return man if isinstance(man, dict) and man.get("format") == DEMO_FORMAT else None


def run_demo(cfg: DemoConfig) -> int:
    out = Path(cfg.output)
    scale = check_config(cfg)
    if prepare_dir(out, cfg.force):
        console.info(f"resuming the unfinished demo in {out}: its traces are kept where they match")
    jobs = cfg.jobs
    t0 = time.perf_counter()
    with console.progress("demo", None) as bar:
        all_runs, timeline, info = run_suite(out, scale=scale, costs=cfg.costs, policies=POLICIES, bar=bar,
                                             jobs=jobs)
    elapsed = time.perf_counter() - t0
    res_path = out / "results.parquet"
    write_results(res_path, all_runs, timeline, force=True)
    if cfg.json:
        console.emit_json(all_runs)
    else:
        out_c = console.stdout()   # the pivot fits a screen (<= 40 lines with what stderr says); --all: every run
        if cfg.all:
            out_c.print(results_table(all_runs, title=f"pagecast demo: {info['workloads']} workloads and "
                                                      f"{info['mixes']} mixes, costs {cfg.costs}"))
            out_c.print(headline(all_runs))
        else:
            # a row per workload and oversubscription, the geometric means folded into one line
            pv = make_pivot(all_runs)
            means = means_line(pv)
            pv.means = []
            out_c.print(pivot_table(pv, note=means or None))
            fits = fits_note(all_runs)
            if fits:
                out_c.print(fits, highlight=False)
    try:
        html = write_report(res_path, out / "report.html", force=True)
    except Exception as e:  # the results stand without the report
        console.warn(f"could not write {out / 'report.html'}: {type(e).__name__}: {e}")
        html = None
    write_json_atomic(out / MANIFEST, {"format": DEMO_FORMAT, "version": 1, "complete": True}, force=True)
    console.wrote(f"{res_path}" + (f", {html}" if html else ""), f"results{' and report' if html else ''} "
                  f"({info['workloads']} workloads, {info['mixes']} mixes, costs {cfg.costs}, {elapsed:.1f} s)",
                  (f"open {html}; " if html else "") + f"pagecast export perfetto {res_path} -o demo.pftrace")
    return 0


def run_suite(out: Path, *, scale: float, costs: str, policies: list[str], bar=None,
              oversub=OVERSUB, workloads: list[str] | None = None, mixes: dict | None = None,
              jobs: int | None = None, fit_drop: float = 0.0):
    """Make traces (fit seeds and replay seeds) in out/traces, fit out/model.json, replay
    every workload alone and every mix at each oversubscription, in `jobs` processes
    (default: default_jobs()). `fit_drop`: the fitting traces lose fault and migration records
    at this rate (`pagecast datasets make --drop`). Returns (runs, timeline, info)."""
    tdir = out / "traces"
    tdir.mkdir(exist_ok=True)
    names = list(DEMO_WORKLOADS) if workloads is None else list(workloads)
    mixes = {k: v for k, v in (MIXES if mixes is None else mixes).items() if v}
    used = sorted(set(names) | {n for v in mixes.values() for n in v})
    instances: dict[tuple[str, int], Path] = {}
    for wl in [[n] for n in names] + list(mixes.values()):
        for k, n in enumerate(wl):
            seed = REPLAY_SEED + 10 * wl[:k].count(n)
            instances[(n, seed)] = tdir / f"{n}-s{seed}.pctrace"
    fit_name = (lambda n, s: f"{n}-s{s}-drop{fit_drop:g}.pctrace") if fit_drop else (lambda n, s: f"{n}-s{s}.pctrace")
    to_make = [(n, s, tdir / fit_name(n, s), fit_drop) for n in used for s in FIT_SEEDS]
    to_make += [(n, s, p, 0.0) for (n, s), p in instances.items()]
    cases = [(n, [n], False) for n in names] + [(f"mix:{k}", v, True) for k, v in mixes.items()]
    if bar is not None:
        bar.update(total=len(to_make) + 1 + len(cases))
    # every step runs in `n_jobs` spawned processes where there are cores for them (spawned, not
    # forked: pyarrow's thread pools make a fork unsafe): the traces, the fit (a kernel at a time:
    # each kernel's templates come from its own launches), the replays (a case at a time, the
    # largest first). The model is read back from model.json in every case, so the runs are the
    # same in one process or several.
    n_jobs = max(1, min(jobs if jobs is not None else default_jobs(), len(to_make)))
    with Workers(n_jobs) as pool:
        if bar is not None:
            bar.update(description=f"making {len(to_make)} traces" + (f" in {n_jobs} processes" if n_jobs > 1 else ""))
        for _ in pool.map(_make_trace, [(n, str(p), scale, s, d) for n, s, p, d in to_make]):
            if bar is not None:
                bar.advance()
        if bar is not None:
            bar.update(description="fitting templates")
        model = fit_in(pool, [tdir / fit_name(n, s) for n in used for s in FIT_SEEDS])
        save_model(model, out / "model.json", force=True)
        if bar is not None:
            bar.advance()
        specs = [(label, [str(instances[(n, REPLAY_SEED + 10 * wl[:k].count(n))]) for k, n in enumerate(wl)],
                  list(policies), list(oversub), costs, str(out / "model.json")) for label, wl, _ in cases]
        results: list = [None] * len(cases)
        todo = sorted(range(len(cases)), key=lambda i: -len(specs[i][1]))
        if bar is not None:
            bar.update(description=f"replaying {len(cases)} cases" + (f" in {n_jobs} processes" if n_jobs > 1 else ""))
        for i, res in pool.map(_replay_indexed, [(i, specs[i]) for i in todo]):
            results[i] = res
            if bar is not None:
                bar.advance()
    all_runs: list[dict] = []
    timelines = []
    for (label, wl, is_mix), (runs, tl) in zip(cases, results):
        base = len(all_runs)
        for r in runs:
            r["run"] += base
            r["mix"] = is_mix
        all_runs.extend(runs)
        timelines.append(tl.set_column(0, "run", pc.add(tl.column("run"), base)))
    info = {"workloads": len(names), "mixes": len(mixes), "scale": scale, "costs": costs}
    return all_runs, pa.concat_tables(timelines), info


def default_jobs() -> int:
    """Processes for the replays: the CPUs this process may use, at most 4."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        n = os.cpu_count() or 1
    return max(1, min(n, 4))


class Workers:
    """`map(fn, jobs)`: the results in the order they finish, from `n` spawned processes (n > 1)
    or this one. Leaving the block by an exception (Ctrl-C, a failed job) stops the workers at
    once, not after their job."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.pool = None

    def __enter__(self) -> "Workers":
        if self.n > 1:
            self.pool = multiprocessing.get_context("spawn").Pool(self.n, initializer=_worker_init)
        return self

    def map(self, fn, jobs: list):
        if self.pool is None:
            return map(fn, jobs)
        return self.pool.imap_unordered(fn, jobs)

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.pool is None:
            return
        if exc_type is None:
            self.pool.close()
        else:
            self.pool.terminate()
        self.pool.join()


def _worker_init() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops the pool
    # a parent stopped by SIGTERM (cli._terminate: os._exit) or killed outright cannot stop the pool:
    # the workers go with it instead of running their jobs on (SIGTERM at the parent's exit)
    os.environ.pop(procs.PARENT_ENV, None)   # not a GPU runner's child: no parent to check at start
    procs.exit_with_parent()


def _make_trace(job) -> str:
    name, path, scale, seed, drop = job
    return str(reuse_or_make(name, path, scale=scale, seed=seed, drop=drop))


def fit_in(pool: Workers, paths: list[Path]):
    """The model of every kernel in `paths`, as `fit_model(traces)` fits it, a kernel per job: each
    job reads the traces that run its kernel (`fit_model(..., kernels=)`); the kernels and the
    traces' records merge into one model."""
    runs: dict[str, list[str]] = {}   # kernel -> the traces that launch it, in `paths`' order
    launches: dict[str, int] = {}
    for p in paths:
        kc = read_trace(p, lazy=LAZY_TABLES).launches.column(KERNEL).value_counts()
        for k, c in zip(kc.field("values").to_pylist(), kc.field("counts").to_pylist()):
            runs.setdefault(k, []).append(str(p))
            launches[k] = launches.get(k, 0) + int(c)
    jobs = [([k], runs[k]) for k in sorted(runs, key=lambda k: (-launches[k], k))]   # the longest first
    parts = list(pool.map(_fit_kernels, jobs))
    if not parts:
        return fit_model([read_trace(p) for p in paths])   # no launches: fit_model's own error
    model = parts[0]
    meta = {t["path"]: t for m in parts for t in m.traces}
    model.traces = [meta[str(p)] for p in paths if str(p) in meta]
    model.kernels = dict(sorted((k, v) for m in parts for k, v in m.kernels.items()))
    _READ.clear()   # where the jobs ran in this process
    return model


_READ: dict[str, object] = {}   # a worker's traces, read once for all its fit jobs


def _fit_kernels(job):
    kernels, paths = job
    traces = [_READ[p] if p in _READ else _READ.setdefault(p, read_trace(p)) for p in paths]
    return fit_model(traces, kernels=set(kernels))


def _replay_indexed(job):
    i, spec = job
    return i, replay_case(*spec)


def replay_case(label: str, paths: list[str], policies: list[str], oversub: list[float], costs: str,
                model_path: str):
    """One demo case (a workload alone or a mix) at every oversubscription: (runs, timeline).
    Module-level so that a spawned process can run it."""
    traces = [read_trace(p, lazy=LAZY_TABLES) for p in paths]   # records read a row group at a time
    cfg = SimConfig(costs=costs, timeslice_ms=demo_timeslice_ms(traces, costs))
    return replay_sim(traces, policies, oversub=list(oversub), config=cfg, model=load_model(model_path),
                      model_path=model_path, workload_name=label)


def fits_note(runs: list[dict]) -> str | None:
    """The rows where demand paging evicted nothing: oversubscription counts the managed memory
    allocated (docs/cli.md), and a workload that allocates more than it touches (buffers sized for
    the largest input) can find all it touches fitting the capacity. There demand faults each page
    in once (two such levels give the same row), template and oracle save only the faults'
    latency, and alloc, which moves whole allocations, moves what is never touched. None where
    demand evicted something in every row."""
    by: dict[str, list[str]] = {}
    for r in runs:
        if r.get("policy") == "demand" and r.get("oversub") and r.get("dtoh_bytes") == 0:
            by.setdefault(r["workload"], []).append(f"{r['oversub']:.0%}")
    if not by:
        return None
    where = "; ".join(f"{w} at {', '.join(levels)}" for w, levels in by.items())
    return (f"Demand evicts nothing ({where}): the workload allocates more than it touches, and what it "
            "touches fits, so template and oracle save only the faults' latency and alloc moves "
            "allocations it never touches.")


def headline(runs: list[dict]) -> str:
    """One line per oversubscription: mean speedups, template's share of oracle."""
    lines = []
    for r_over in OVERSUB:
        sel = [r for r in runs if abs((r.get("oversub") or 0) - r_over) < 1e-9]
        parts = []
        for p in ("alloc", "template", "oracle"):
            sp = [r["speedup_vs_demand"] for r in sel if r["policy"] == p and r["speedup_vs_demand"]]
            if sp:
                parts.append(f"{p} {statistics.geometric_mean(sp):.2f}x")
        fo = [(r["fraction_of_oracle"], r.get("workload")) for r in sel
              if r["policy"] == "template" and r["fraction_of_oracle"]]
        if fo:
            near = sum(f >= 0.95 for f, _ in fo)
            worst = min(fo, key=lambda x: x[0])
            parts.append(f"template within 5% of oracle on {near} of {len(fo)}"
                         + (f" (lowest: {worst[1]}, {worst[0]:.0%})" if near < len(fo) else ""))
        lines.append(f"{r_over:.0%} oversubscription, geometric mean over demand: " + ", ".join(parts))
    return "\n".join(lines)


SLICES_PER_TASK = 20


def demo_timeslice_ms(traces, costs) -> float:
    """The demo's traces hold milliseconds of kernel time per task, not MSched's
    seconds: shrink the 10 ms slice so each task still switches about
    SLICES_PER_TASK times (a mix's point is the switching)."""
    if len(traces) < 2:
        return 10.0
    prof = load_profile(costs)
    shortest = min(float(compute_times(t, footprints(t), prof).sum()) for t in traces)
    return min(10.0, max(shortest * 1e3 / SLICES_PER_TASK, 0.01))
