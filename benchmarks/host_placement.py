"""Host placement on the serving corpus: the figures docs/cost-model.md ("Host placement") quotes.

    python benchmarks/host_placement.py [--work DIR] [--costs NAME] [--workloads serving,serving-vllm-rocm]

Each workload is recorded with `collect --interpret` at scale 0.5 (seeds 1, 2 and 3, made in
DIR/traces or reused), fitted on seeds 1 and 2 and replayed on seed 3 at 150%, 200% and 300%,
twice in the same run: with the driver's default placement (`--placement device`) and with
`--placement auto`. It prints, per level, demand's time and each policy's speedup over it, with
the bytes left on the host; then template's speedup over alloc with host accesses charged at
1/2 (the built-in profiles' assumption), 1/8 and 1/32 of the profile's host-to-device copy
rate (`host_bandwidth`), since that rate is assumed, not measured. Needs the engines the corpus
loads (docs/workloads-triton.md).
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

from pagecast.datasets.registry import reuse_or_make
from pagecast.predict.fit import fit_model
from pagecast.replay.costs import load_profile, replace
from pagecast.replay.sim.sweep import SimConfig, replay_sim
from pagecast.trace import read_trace

OVERSUB = (1.5, 2.0, 3.0)
DIVISORS = (2, 8, 32)   # host accesses at htod_bandwidth / these
POLICIES = ("demand", "alloc", "template", "oracle")


def traces(work: Path, name: str) -> list:
    out = []
    for seed in (1, 2, 3):
        p = work / "traces" / f"{name}-0.5-{seed}.pctrace"
        reuse_or_make(name, p, scale=0.5, seed=seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out.append(read_trace(p))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("host-placement-work"))
    ap.add_argument("--costs", default="msched-rtx5080")
    ap.add_argument("--workloads", default="serving,serving-vllm-rocm")
    a = ap.parse_args()
    (a.work / "traces").mkdir(parents=True, exist_ok=True)
    for name in a.workloads.split(","):
        t1, t2, t3 = traces(a.work, name)
        t0 = time.perf_counter()
        model = fit_model([t1, t2])
        fit_s = time.perf_counter() - t0
        by = {}
        for placement in ("device", "auto"):
            t0 = time.perf_counter()
            runs, _ = replay_sim([t3], list(POLICIES), oversub=list(OVERSUB),
                                 config=SimConfig(costs=a.costs, placement=placement), model=model, timeline=False)
            print(f"{name}: replay with --placement {placement}: {time.perf_counter() - t0:.1f} s (fit {fit_s:.0f} s)")
            by.update({(placement, r["oversub"], r["policy"]): r for r in runs})
        print(f"\n{name} ({a.costs}; speedup over demand; host: MiB left on the host)\n")
        print("| oversub | demand | alloc | template (device) | oracle (device) | template (auto) | host | "
              "oracle (auto) | template (auto) / alloc |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for o in OVERSUB:
            d = by[("device", o, "demand")]
            sp = {(pl, p): by[(pl, o, p)]["speedup_vs_demand"] for pl in ("device", "auto") for p in POLICIES}
            host = by[("auto", o, "template")].get("host_bytes", 0) / (1 << 20)
            print(f"| {o:.0%} | {d['time_s'] * 1e3:.1f} ms | {sp[('device', 'alloc')]:.2f}x | "
                  f"{sp[('device', 'template')]:.2f}x | {sp[('device', 'oracle')]:.2f}x | "
                  f"{sp[('auto', 'template')]:.2f}x | {host:.0f} | {sp[('auto', 'oracle')]:.2f}x | "
                  f"{sp[('auto', 'template')] / sp[('device', 'alloc')]:.2f}x |")
        base = load_profile(a.costs)
        print(f"\n{name}: template (--placement auto) over alloc, host accesses at htod_bandwidth / k "
              f"({base.htod_bandwidth / 1e9:.1f} GB/s / k)\n")
        print("| k | host rate | " + " | ".join(f"{o:.0%}" for o in OVERSUB) + " |")
        print("|---:|---:|" + "---:|" * len(OVERSUB))
        for k in DIVISORS:
            prof = replace(base, host_bandwidth=base.htod_bandwidth / k)
            runs, _ = replay_sim([t3], ["demand", "alloc", "template"], oversub=list(OVERSUB),
                                 config=SimConfig(costs=prof, placement="auto"), model=model, timeline=False)
            r = {(x["oversub"], x["policy"]): x for x in runs}
            cells = [f"{r[(o, 'template')]['speedup_vs_demand'] / r[(o, 'alloc')]['speedup_vs_demand']:.2f}x"
                     f"{'' if r[(o, 'template')]['host_bytes'] else ' (device)'}" for o in OVERSUB]
            print(f"| {k} | {prof.host_access_bandwidth / 1e9:.2f} GB/s | " + " | ".join(cells) + " |")
        print()


if __name__ == "__main__":
    main()
