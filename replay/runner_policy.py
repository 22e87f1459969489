"""Policy `runner`: the GPU runner's own decisions, replayed in the simulator.

`template` in the simulator plans the whole timeline ahead (Belady with
lookahead on the predicted footprints). The GPU runner (`replay --backend gpu`,
`pagecast.prefetching`) cannot: at each launch it sees that launch only. It
predicts its footprint, prefetches what its residency estimate says is
missing and, to emulate a capacity, evicts 2 MiB units chosen by predicted
next use (`gpu_residency`). This policy drives that very engine
(`gpu_engine.Engine`, the template policy, the runner's default fallback) with
the trace's launches and a CUDA stand-in that records
the transfers instead of making them, and hands them to the simulator launch
by launch (the `on_launch` hook). The difference between `template` and
`runner` is what planning ahead is worth; `runner` against a GPU measurement
is the cost model alone (scripts/gpu_validation.py).

Not replayed: the runner's fault feedback (`--feedback` on the GPU; the
simulator's `--feedback` refines the offline template only) and its
host-side time per launch.
"""

from __future__ import annotations

import numpy as np

from pagecast.errors import UsageError

from . import simulator as S
from .cuda_iface import Allocation, InertCuda
from .workload import I64


class _TraceCuda(InertCuda):
    """The engine's CUDA interface, answered from a trace: the allocations live at the
    current launch (looked up as the oracle's relocator does); transfers are recorded,
    not made."""

    def __init__(self, relocator) -> None:
        super().__init__()
        self.rel = relocator
        self.t = 0
        self.to_gpu: list[tuple[int, int]] = []
        self.to_host: list[tuple[int, int]] = []
        self._freed: dict[int, list[int]] = {}   # launch -> allocations freed just before it
        for a, last in zip(relocator.a_addr.tolist(), relocator.a_last.tolist()):
            self._freed.setdefault(last + 1, []).append(a)

    def allocation_of(self, addr: int):
        j = self.rel.find_alloc(int(addr), self.t)
        return None if j is None else Allocation(int(self.rel.a_addr[j]), int(self.rel.a_bytes[j]), True)

    def freed_before(self, t: int) -> list[int]:
        """Addresses of the allocations whose last launch is t - 1."""
        return self._freed.get(t, [])

    def prefetch_to_gpu(self, addr, nbytes, stream=0) -> None:
        self.to_gpu.append((int(addr), int(nbytes)))

    def prefetch_to_host(self, addr, nbytes, stream=0) -> None:
        self.to_host.append((int(addr), int(nbytes)))


class Runner(S.Policy):
    name = "runner"
    description = ("the GPU runner's own decisions, one launch at a time (template, no lookahead), "
                   "replayed in the simulator")
    wants_launches = True

    def __init__(self, model=None, fallback: str | None = None) -> None:
        from .gpu_predict import default_fallback
        self.model = model
        self.fallback = default_fallback(False) if fallback is None else fallback   # the runner's, without feedback

    def prefetch(self, ctx: S.Context) -> None:
        from pagecast.collect.launch_hook import LaunchArgs

        from .gpu_engine import Engine
        from .gpu_oracle import Relocator
        from .gpu_predict import make_online_predict, model_kernel_names
        if self.model is None:
            raise UsageError("policy runner needs --model MODEL")
        w = ctx.w
        if len(w.tasks) != 1:
            raise UsageError("policy runner replays one trace (the GPU runner runs one workload)")
        trace = w.tasks[0].trace
        rel = Relocator(trace, w.tasks[0].truth)   # the workload's footprints of the trace, not computed again
        self.cuda = _TraceCuda(rel)   # its allocation tables only (the engine's observe() moves no address here)
        # the runner is given the workload's trace for --oversub: its residency estimate uses it
        self.engine = Engine(self.cuda, "template", capacity=ctx.cap_units * w.gran,
                             predict=make_online_predict(self.model, self.fallback), relocator=rel,
                             model_kernels=model_kernel_names(self.model))
        rows = trace.launches.to_pylist()
        self.launches = [LaunchArgs.from_row(r, stream=7) for r in rows]
        return None

    def on_launch(self, ctx: S.Context, step: int):
        w = ctx.w
        t = int(w.step_launch[step])
        cuda, eng = self.cuda, self.engine
        for a in cuda.freed_before(t):
            eng.on_free(a)
        cuda.t = t
        cuda.to_gpu, cuda.to_host = [], []
        eng.on_launch(self.launches[t])
        if eng.stats.errors:
            raise RuntimeError(f"the runner's engine failed: {eng.stats.last_error}")
        # the runner's evictions wait for the work queued before the launch (gpu_engine)
        return _units(w, cuda.to_host), _units(w, cuda.to_gpu), bool(cuda.to_host)


def _units(w, ranges: list[tuple[int, int]]) -> np.ndarray:
    """Byte ranges of task 0 -> its dense unit ids (in range order; units outside the universe dropped)."""
    if not ranges:
        return np.zeros(0, I64)
    a = np.array([r[0] for r in ranges], dtype=np.int64)
    n = np.array([r[1] for r in ranges], dtype=np.int64)
    g = w.gran
    s, e = a // g, -((-(a + n)) // g)
    _, units = w.universe.dense(0, np.zeros(len(s), I64), s, e, 1)
    return units
