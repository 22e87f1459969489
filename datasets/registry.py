"""The workload models by name, MSched's multitask mixes, and `make_trace`.

    from pagecast.datasets.registry import WORKLOADS, MIXES, make_trace
    make_trace("jacobi2d", "j.pctrace", scale=0.1, seed=1)

Each `Workload` knows its kernels and the template class each kernel is meant
to exercise (`kernel_classes()`), so accuracy benchmarks can check a fitted
model's classification against the ground truth.
"""

from __future__ import annotations

import math
from pathlib import Path

from pagecast import trace as T
from pagecast.errors import PagecastError, UsageError

from . import corpus, dnn, llm, paged, polybench, scientific
from .engine import Builder
from .workload import Workload

__all__ = ["WORKLOADS", "MIXES", "SUITES", "DEMO_WORKLOADS", "Workload", "make_trace", "reuse_or_make", "build", "get_workload", "MAX_SCALE",
           "check_drop"]

# Bumped whenever a workload model changes what it generates (sizes, kernels, layouts), and
# written into each trace's manifest ("workload": {"revision": ...}): a trace kept in a work or
# cache directory is reused only if it was made by the same revision (2: scientific problem
# sizes grown to tens of MiB, so that capacities hold several 2 MiB eviction units).
REVISION = 2

MIN_SCALE = 0.01
MAX_SCALE = 100.0   # ~10^6 launches; see docs/workloads.md for measured sizes and times


def _load() -> dict[str, Workload]:
    out: dict[str, Workload] = {}
    for mod in (scientific, dnn, llm, paged, polybench):
        for w in mod.WORKLOADS:
            out[w.name] = w
    return out


WORKLOADS: dict[str, Workload] = _load()

# MSched's multitask mixes (arXiv 2512.24637): lists of workload names. A name may
# repeat (several instances of one model); each instance should get its own seed.
MIXES: dict[str, list[str]] = {
    "scientific": ["jacobi2d", "spmv-cg", "stream"],
    "multi-dnn": ["mlp-train", "cnn-infer", "mlp-train", "cnn-infer"],
    "multi-llm": ["llm-decode", "llm-decode", "llm-decode", "llm-paged-decode"],
}

# Benchmark sets of published oversubscription studies, modelled to check the simulator against
# their measurements (benchmarks/driver_validation.py, docs/driver-validation.md): study -> workload names.
SUITES: dict[str, list[str]] = {
    "ariadne": list(polybench.ARIADNE.values()),
}

# The workloads the demo suite and docs/results.md run: every model but the validation suites'.
DEMO_WORKLOADS: list[str] = sorted(n for n in WORKLOADS if not any(n in s for s in SUITES.values()))


def get_workload(name: str) -> Workload:
    w = WORKLOADS.get(name)
    if w is None:
        raise UsageError(f"unknown workload {name!r}; known workloads: {', '.join(sorted(WORKLOADS))}"
                         f"; real-kernel corpus: {', '.join(sorted(corpus.CORPUS))}")
    return w


def check_scale(scale: float) -> float:
    try:
        s = float(scale)
    except (TypeError, ValueError):
        raise UsageError(f"--scale must be a number, not {scale!r}") from None
    if not math.isfinite(s) or not (MIN_SCALE <= s <= MAX_SCALE):
        raise UsageError(f"--scale must be between {MIN_SCALE:g} and {MAX_SCALE:g}, not {scale!r}")
    return s


def _seed(seed) -> int:
    if isinstance(seed, bool) or int(seed) != seed or seed < 0:
        raise UsageError(f"--seed must be a non-negative integer, not {seed!r}")
    return int(seed)


MAX_DROP = 0.5     # a collection that lost more than half its records is no profile to fit on


def check_drop(drop) -> float:
    """A record-loss rate: a number in [0, MAX_DROP]."""
    try:
        d = float(drop)
    except (TypeError, ValueError):
        raise UsageError(f"--drop must be a number, not {drop!r}") from None
    if not math.isfinite(d) or not (0.0 <= d <= MAX_DROP):
        raise UsageError(f"--drop must be a share of records from 0 to {MAX_DROP:g} (0.01 = 1%), not {drop!r}")
    return d


def build(name: str, *, scale: float = 1.0, seed: int = 0) -> Builder:
    """Run a workload model into a Builder (no files written)."""
    w = get_workload(name)
    scale = check_scale(scale)
    b = Builder(w.name, seed=_seed(seed), scale=scale)
    w.build(b)
    return b


def make_trace(name: str, out: str | Path, *, scale: float = 1.0, seed: int = 0, mode: str = "full",
               driver_prefetch: bool = True, force: bool = False, progress=None, drop: float = 0.0) -> Path:
    """Write the trace (format v1, with truth) of workload `name` to directory `out`.

    A name of the real-kernel corpus (datasets/corpus) is recorded with collect --interpret.
    `drop`: fault and migration records lost independently at this rate (CUPTI's buffer
    overflows), counted in the manifest's `dropped_records`."""
    if name in corpus.CORPUS:
        return corpus.make_trace(name, out, scale=check_scale(scale), seed=_seed(seed), mode=mode,
                                 driver_prefetch=driver_prefetch, force=force, progress=progress,
                                 drop=check_drop(drop))
    if mode not in T.MODES:
        raise UsageError(f"--mode must be one of {', '.join(T.MODES)}, not {mode!r}")
    get_workload(name)
    scale = check_scale(scale)
    drop = check_drop(drop)
    out = Path(out)
    T.check_output_dir(out, force)  # refuse before doing the work; the writer checks again at its end
    b = build(name, scale=scale, seed=seed)
    argv = ["pagecast", "datasets", "make", name, "-o", str(out), "--scale", f"{scale:g}",
            "--seed", str(seed), "--mode", mode]
    if not driver_prefetch:
        argv.append("--no-driver-prefetch")
    if drop:
        argv += ["--drop", f"{drop:g}"]
    b.write(out, mode=mode, driver_prefetch=driver_prefetch, force=force,
            workload={"name": name, "argv": argv, "scale": scale, "seed": int(seed),
                      "category": WORKLOADS[name].category, "revision": REVISION, "drop": drop},
            progress=progress, drop=drop)
    return out


def reuse_or_make(name: str, out: str | Path, *, scale: float = 1.0, seed: int = 0, mode: str = "full",
                  drop: float = 0.0) -> Path:
    """`out` if it already holds a whole trace of this workload model, scale, seed, mode and record
    loss made by this REVISION of the models (a kept work or cache directory); otherwise it is
    (re)made there."""
    out = Path(out)
    revision = corpus.REVISION if name in corpus.CORPUS else REVISION
    if out.exists():
        try:
            tr = T.read_trace(out)
            wl = tr.manifest.get("workload") or {}
            if (wl.get("name"), wl.get("scale"), wl.get("seed"), wl.get("revision"), tr.mode,
                    wl.get("drop", 0.0)) == (name, check_scale(scale), int(seed), revision, mode,
                                             check_drop(drop)) and tr.complete:
                return out
        except PagecastError:
            pass
    return make_trace(name, out, scale=scale, seed=seed, mode=mode, force=out.exists(), drop=drop)
