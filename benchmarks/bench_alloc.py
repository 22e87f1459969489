"""The `alloc` policy on long traces whose kernels all point into one large allocation.

    python benchmarks/bench_alloc.py [--scale 2.0] [--out docs/simulator-performance.md]

Three llm-decode instances (seeds 3, 13, 23; about 20k launches each at scale 2)
as one mix at 150/200/300% oversubscription. Every launch's whole-allocation
footprint holds the weight allocation, so planning on 64 KiB units touches
every unit of it at every launch (over 10^8 unit touches). Times `alloc` planned
on units (the threshold raised past the needs) and on 2 MiB chunks (the
default past simulator.CHUNK_PLAN_OCCURRENCES), with their speedups over demand,
and what choosing the plan's span costs `oracle` there; replaces the "alloc on long
traces" section of --out (run it after bench_sim.py, which rewrites that file).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SECTION = "## alloc on long traces (benchmarks/bench_alloc.py)"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=2.0)
    ap.add_argument("--out", help="markdown file whose section to replace")
    args = ap.parse_args(argv)

    from pagecast.datasets.registry import make_trace
    from pagecast.replay.policies import alloc as PA
    from pagecast.replay.sim.sweep import SimConfig, replay_sim
    from pagecast.trace import read_trace

    oversub = [1.5, 2.0, 3.0]
    with tempfile.TemporaryDirectory() as tmp:
        trs = [read_trace(make_trace("llm-decode", Path(tmp) / f"l{s}.pctrace", scale=args.scale, seed=s))
               for s in (3, 13, 23)]
        cfg = SimConfig(timeslice_ms=0.5)
        replay_sim(trs[:1], ["alloc"], oversub=[2.0], config=cfg, timeline=False)  # compile
        t0 = time.perf_counter()
        dem, _ = replay_sim(trs, ["demand"], oversub=oversub, config=cfg, timeline=False)
        t_dem = time.perf_counter() - t0
        rows = {}
        saved = PA.CHUNK_PLAN_OCCURRENCES
        for name, limit in (("units", 1 << 62), ("chunks", saved)):
            PA.CHUNK_PLAN_OCCURRENCES = limit
            t0 = time.perf_counter()
            runs, _ = replay_sim(trs, ["alloc"], oversub=oversub, config=cfg, timeline=False)
            rows[name] = (time.perf_counter() - t0, {r["oversub"]: r["time_s"] for r in runs})
        PA.CHUNK_PLAN_OCCURRENCES = saved
        # what choosing the plan's span costs a planned policy on the same long mix
        spans = {}
        for name, sp in (("units only", "unit"), ("span chosen (default)", "auto")):
            t0 = time.perf_counter()
            runs, _ = replay_sim(trs, ["oracle"], oversub=oversub, config=replace(cfg, span=sp), timeline=False)
            spans[name] = (time.perf_counter() - t0, {r["oversub"]: (r["time_s"], r["plan_span"]) for r in runs})
    n = sum(t.n_launches for t in trs)
    d = {r["oversub"]: r["time_s"] for r in dem}
    lines = [SECTION, "",
             f"Written by `python benchmarks/bench_alloc.py --scale {args.scale}`: three llm-decode instances "
             f"({n:,} launches) as one mix; wall time of the three `alloc` runs (150/200/300%), and alloc's "
             f"speedup over demand (demand's three runs took {t_dem:.1f} s).", "",
             "| alloc planned on | seconds (3 runs) | " + " | ".join(f"{o:.0%}" for o in oversub) + " |",
             "|---|---:|" + "---:|" * len(oversub)]
    for name, (t, sp) in rows.items():
        unit = "64 KiB units" if name == "units" else "2 MiB chunks (default here)"
        lines.append(f"| {unit} | {t:.1f} | " + " | ".join(f"{d[o] / sp[o]:.2f}x" for o in oversub) + " |")
    lines += ["", "Demand's simulated times: " + ", ".join(f"{d[o] * 1e3:.0f} ms" for o in oversub) + ". "
              "The chunk plan is the same whole-allocation plan on a coarser grid (a chunk counts as the "
              "largest chunk's units of capacity), so the two columns of speedups differ a little; the "
              "unit plan's time is Belady's work on every unit touch (about 1.4 x 10^8 here).", "",
              "What choosing the plan's span (docs/cost-model.md) costs `oracle` on the same mix: wall "
              "time of its three runs planned on units only and with the span chosen (each tried span is "
              "a plan and a trial run; the allocation span is not tried here, its needs being far more "
              "than 8 times the footprints'), its speedup over demand and the span chosen.", "",
              "| oracle planned on | seconds (3 runs) | " + " | ".join(f"{o:.0%}" for o in oversub) + " |",
              "|---|---:|" + "---:|" * len(oversub)]
    for name, (t, sp) in spans.items():
        lines.append(f"| {name} | {t:.1f} | " + " | ".join(f"{d[o] / sp[o][0]:.2f}x ({sp[o][1]})" for o in oversub)
                     + " |")
    lines += [""]
    text = "\n".join(lines)
    print(text)
    if args.out:
        p = Path(args.out)
        old = p.read_text() if p.exists() else ""
        head, _, rest = old.partition(SECTION)
        nxt = rest.find("\n## ")   # sections other scripts write after this one stay
        tail = rest[nxt:] if nxt >= 0 else ""
        head = head.rstrip("\n")
        p.write_text((head + "\n\n" if head else "") + text.rstrip("\n") + "\n" + tail)
    return 0


if __name__ == "__main__":
    sys.exit(main())
