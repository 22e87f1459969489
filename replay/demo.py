"""`pagecast demo`: the whole pipeline on the built-in workloads, no GPU needed.

Generates every workload model at a small scale (seeds 1 and 2 to fit, 3 to
replay), fits one model on the fitting traces, then replays each workload
alone and MSched's three multitask mixes at 150%, 200% and 300%
oversubscription with demand, alloc, template and oracle, and prints the
comparison. Everything lands in DIR: traces/, model.json, results.parquet
(+ timeline), and report.html when the report stage is installed.
"""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from pagecast import console
from pagecast.errors import OutputExistsError

DEMO_FORMAT = "pagecast-demo"
SCALE = 0.2
FIT_SEEDS = (1, 2)
REPLAY_SEED = 3
OVERSUB = (1.5, 2.0, 3.0)
POLICIES = ["demand", "alloc", "template", "oracle"]


def prepare_dir(out: Path, force: bool) -> None:
    from pagecast.trace import MANIFEST, prepare_output_dir, write_json_atomic
    if out.exists():
        if out.is_file() or any(out.iterdir()):
            if not force:
                raise OutputExistsError(out)
            if not (out / MANIFEST).exists():
                raise OutputExistsError(f"{out} is a non-empty directory that is not a pagecast demo;"
                                        " refusing to delete it even with --force")
            prepare_output_dir(out, True)
        else:
            out.rmdir()
    out.mkdir(parents=True)
    write_json_atomic(out / MANIFEST, {"format": DEMO_FORMAT, "version": 1})


def run_demo(args) -> int:
    from pagecast.datasets.registry import MIXES, WORKLOADS, make_trace
    from pagecast.predict.fit import fit_model
    from pagecast.predict.model_io import save_model
    from pagecast.trace import read_trace

    from .commands import results_table
    from .results_io import write_results
    from .run import SimConfig, replay_sim

    out = Path(args.output)
    prepare_dir(out, args.force)
    scale = SCALE if args.scale is None else float(args.scale)
    tdir = out / "traces"
    tdir.mkdir()
    names = sorted(WORKLOADS)
    mixes = {k: v for k, v in MIXES.items() if v}
    # replay instances: seed 3 for the first instance of a workload, 13, 23, ... for more
    instances: dict[tuple[str, int], Path] = {}
    for wl in [[n] for n in names] + list(mixes.values()):
        for k, n in enumerate(wl):
            seed = REPLAY_SEED + 10 * wl[:k].count(n)
            instances[(n, seed)] = tdir / f"{n}-s{seed}.pctrace"
    jobs = [(n, s, tdir / f"{n}-s{s}.pctrace") for n in names for s in FIT_SEEDS]
    jobs += [(n, s, p) for (n, s), p in instances.items()]
    n_replays = len(names) + len(mixes)
    t0 = time.perf_counter()
    all_runs: list[dict] = []
    timelines = []
    with console.progress("demo", len(jobs) + 1 + n_replays) as bar:
        for n, s, p in jobs:
            bar.update(description=f"making {p.name}")
            make_trace(n, p, scale=scale, seed=s, mode="full")
            bar.advance()
        bar.update(description="fitting templates")
        fit_traces = [read_trace(tdir / f"{n}-s{s}.pctrace") for n in names for s in FIT_SEEDS]
        model = fit_model(fit_traces)
        save_model(model, out / "model.json")
        bar.advance()
        cache: dict[Path, object] = {}

        def tr(p):
            if p not in cache:
                cache[p] = read_trace(p)
            return cache[p]

        cases = [(n, [n], False) for n in names] + [(f"mix:{k}", v, True) for k, v in mixes.items()]
        for label, wl, is_mix in cases:
            bar.update(description=f"replaying {label}")
            paths = []
            for k, n in enumerate(wl):
                paths.append(instances[(n, REPLAY_SEED + 10 * wl[:k].count(n))])
            traces = [tr(p) for p in paths]
            cfg = SimConfig(costs=args.costs, timeslice_ms=demo_timeslice_ms(traces, args.costs))
            runs, tl = replay_sim(traces, POLICIES, oversub=list(OVERSUB), config=cfg,
                                  model=model, model_path=str(out / "model.json"), workload_name=label)
            base = len(all_runs)
            for r in runs:
                r["run"] += base
                r["mix"] = is_mix
            all_runs.extend(runs)
            timelines.append(tl.set_column(0, "run", pc.add(tl.column("run"), base)))
            bar.advance()
    elapsed = time.perf_counter() - t0
    res_path = out / "results.parquet"
    write_results(res_path, all_runs, pa.concat_tables(timelines), force=True)
    if args.json:
        console.emit_json(all_runs)
    else:
        out = console.stdout()
        out.width = max(out.width, 132)
        out.print(results_table(all_runs, title=f"pagecast demo: {len(names)} workloads and "
                                                f"{len(mixes)} mixes, costs {args.costs}"))
        out.print(headline(all_runs))
    console.info(f"demo took {elapsed:.1f} s")
    console.wrote(res_path, "replay results", f"pagecast report {res_path} -o {out / 'report.html'}")
    try:
        from pagecast.report.render import write_report
    except ImportError:
        write_report = None
    if write_report is not None:
        html = write_report(res_path, out / "report.html", force=True)
        console.wrote(html, "report", f"open {html}")
    return 0


def headline(runs: list[dict]) -> str:
    """One line per oversubscription: mean speedups, template's share of oracle."""
    import statistics
    lines = []
    for r_over in OVERSUB:
        sel = [r for r in runs if abs((r.get("oversub") or 0) - r_over) < 1e-9]
        parts = []
        for p in ("alloc", "template", "oracle"):
            sp = [r["speedup_vs_demand"] for r in sel if r["policy"] == p and r["speedup_vs_demand"]]
            if sp:
                parts.append(f"{p} {statistics.geometric_mean(sp):.2f}x")
        fo = [r["fraction_of_oracle"] for r in sel if r["policy"] == "template" and r["fraction_of_oracle"]]
        if fo:
            parts.append(f"template at {min(fo):.1%} of oracle or better")
        lines.append(f"{r_over:.0%} oversubscription, geometric mean over demand: " + ", ".join(parts))
    return "\n".join(lines)


SLICES_PER_TASK = 20


def demo_timeslice_ms(traces, costs) -> float:
    """The demo's traces hold milliseconds of kernel time per task, not MSched's
    seconds: shrink the 10 ms slice so each task still switches about
    SLICES_PER_TASK times (a mix's point is the switching)."""
    if len(traces) < 2:
        return 10.0
    from pagecast.footprints import footprints

    from .costs import load_profile
    from .workload import compute_times
    prof = load_profile(costs)
    shortest = min(float(compute_times(t, footprints(t), prof).sum()) for t in traces)
    return min(10.0, max(shortest * 1e3 / SLICES_PER_TASK, 0.01))
