"""Policy `runner`: the GPU runner's own decisions, replayed in the simulator.

`template` in the simulator plans the whole timeline ahead (Belady with
lookahead on the predicted footprints). The GPU runner (`replay --backend gpu`,
`pagecast.prefetching`) cannot: at each launch it sees that launch only. It
predicts its footprint, prefetches what its residency estimate says is
missing and, to emulate a capacity, evicts 2 MiB units chosen by predicted
next use. This policy makes those very decisions (`online.decide.LaunchDecider`
with the template policy and the runner's default fallback: the code the GPU
engine runs) from the trace's launches, with allocations looked up in the
trace instead of the driver, and hands the simulator the units of the ranges
the engine would move, launch by launch (the `on_launch` hook). A launch with indexed regions
is predicted from its index values, as the engine reads them after the work before it (here
from the trace's values table, `pagecast.values`). The difference
between `template` and `runner` is what planning ahead is worth; `runner`
against a GPU measurement is the cost model alone (scripts/gpu_validation.py).

Index values: a launch whose indexed regions read index values (the trace's `values` table)
is predicted with them, as the runner does once the launch that wrote them has ended (it
copies them from the GPU after that launch's completion event); the simulator starts the
launch's group no earlier than the end of that writer (`pagecast.values.producers`, the launch
that last wrote the buffer as observed) plus the copy (replay/sim/timing.py).

Lookahead (the default, `LOOKAHEAD`): the decider reads the same schedule as the GPU runner's
child builds (online/lookahead.py: template's predictions of the trace's launches, indexed
launches skipped), so each launch's group holds the launch's own units first and then the next
launch's, issued while the kernel before it runs; the launch waits for its own only (the hook's
`own`), and a group that evicts waits for the launch before, as the engine's copy stream waits
for its evictions. Per-call and per-launch host costs are the clock's: the profile's
`transfer_latency_s` per transfer and `host_launch_s` per launch (replay/sim/timing.py).

Not replayed: the runner's fault feedback (`--feedback` on the GPU; the
simulator's `--feedback` refines the offline template only) and its
host-side time per launch, including the wait for an indexed launch's values (the GPU runner
drains the launch's stream before reading them).
"""

from __future__ import annotations

import numpy as np

from pagecast import values as V
from pagecast.collect.launch_hook import LaunchArgs
from pagecast.errors import UsageError

from ..online.decide import LaunchDecider
from ..online.lookahead import lookahead_for
from ..online.prediction import default_fallback, make_online_predict
from ..online.ranges import Allocation, AllocationMap
from ..online.relocate import Relocator
from ..unit_space import I64
from .base import Context, Policy
from .template import Template


# the runner's lookahead for planned runs (online/lookahead.py), as the GPU runner's child switches it
# on by default; False: one launch at a time, as before (benchmarks/runner_lookahead.py runs both)
LOOKAHEAD = True


class TraceAllocations:
    """Allocation lookups answered from a trace: the allocation live at the current launch `t`
    (looked up as the oracle's relocator does), and the allocations freed before each launch."""

    def __init__(self, relocator: Relocator) -> None:
        self.rel = relocator
        self.t = 0
        self._freed: dict[int, list[int]] = {}   # launch -> allocations freed just before it
        for a, last in zip(relocator.a_addr.tolist(), relocator.a_last.tolist()):
            self._freed.setdefault(last + 1, []).append(a)

    def allocation_of(self, addr: int):
        j = self.rel.find_alloc(int(addr), self.t)
        return None if j is None else Allocation(int(self.rel.a_addr[j]), int(self.rel.a_bytes[j]), True)

    def freed_before(self, t: int) -> list[int]:
        """Addresses of the allocations whose last launch is t - 1."""
        return self._freed.get(t, [])


class LaunchRows:
    """The trace's launches as the hook hands them over (`LaunchArgs`, by row), made
    `LAUNCH_CHUNK` rows at a time as they are read and let go when the next chunk is: the runner
    reads them in launch order, and one per launch held for the run grew with the launches."""

    def __init__(self, table) -> None:
        self.table = table
        self._at = -1
        self._chunk: list[LaunchArgs] = []

    def __len__(self) -> int:
        return self.table.num_rows

    def __getitem__(self, t: int) -> LaunchArgs:
        if not 0 <= t < self.table.num_rows:
            raise IndexError(t)
        c = t // LAUNCH_CHUNK
        if c != self._at:
            self._chunk = []   # the last chunk goes before the next is made
            rows = self.table.slice(c * LAUNCH_CHUNK, LAUNCH_CHUNK).to_pylist()
            self._chunk, self._at = [LaunchArgs.from_row(r, stream=7) for r in rows], c
        return self._chunk[t - c * LAUNCH_CHUNK]


LAUNCH_CHUNK = 4096   # launches made into LaunchArgs at a time (LaunchRows)


class Runner(Policy):
    name = "runner"
    description = ("the GPU runner's own decisions, one launch at a time (template, prefetching the next "
                   "launch one launch early), replayed in the simulator")
    wants_launches = True

    requires = "model"
    reads_arguments = True

    @classmethod
    def for_replay(cls, setup):
        return cls(setup.model)

    def __init__(self, model=None, fallback: str | None = None, policy: Policy | None = None,
                 values: bool = True, lookahead: bool | None = None) -> None:
        """`policy`: whose per-launch decisions to replay (default: template, the runner's);
        `values`: predict indexed regions with the trace's index values (False: their fallback,
        as a runner that reads none); `lookahead`: the runner's lookahead for planned runs
        (online/lookahead.py, as the GPU runner's child switches it on; False: one launch at a
        time, as the GPU runner with --no-lookahead; None: `LOOKAHEAD`)."""
        self.lookahead = LOOKAHEAD if lookahead is None else lookahead
        self.use_values = values
        self.model = model
        self.fallback = default_fallback(False) if fallback is None else fallback   # the runner's, without feedback
        self.policy = Template() if policy is None else policy
        self.to_gpu: list[tuple[int, int]] = []    # the ranges of the last launch, as the engine would move them
        self.to_host: list[tuple[int, int]] = []
        self.ahead: list[tuple[int, int]] = []     # ... and the next launch's, brought in early (lookahead)
        self.prefetch_bytes = 0

    def prefetch(self, ctx: Context) -> None:
        if self.policy.predicts and self.model is None:
            raise UsageError("policy runner needs --model MODEL")
        w = ctx.w
        if len(w.tasks) != 1:
            raise UsageError("policy runner replays one trace (the GPU runner runs one workload)")
        trace = w.tasks[0].trace
        rel = Relocator(trace, w.tasks[0].truth)   # the workload's footprints of the trace, not computed again
        self.lookup = TraceAllocations(rel)
        # the runner is given the workload's trace for --oversub: its residency estimate uses it
        sched = lookahead_for(self.policy, trace, model=self.model, fallback=self.fallback,
                              relocator=rel) if self.lookahead else None
        self.decider = LaunchDecider(self.policy, AllocationMap(self.lookup.allocation_of),
                                     capacity=ctx.cap_units * w.gran, relocator=rel, ahead=sched,
                                     predict=None if self.model is None else make_online_predict(self.model,
                                                                                                 self.fallback))
        self.launches = LaunchRows(trace.launches)
        self.values_launches = 0   # launches predicted with values they read
        self.prefetch_bytes = 0
        self.values = V.image(trace) if trace.values is not None and self.use_values else None
        self.trace = trace
        self.w = w   # launch -> step: the workload's own index (w.step_of), not a dict per launch
        return None

    def _values_for(self, t: int):
        """(values(address, nbytes) for launch t's predictor, the rows it read): the trace's rows
        of launch t, as the runner would copy them once their writer has ended."""
        im = self.values
        read: list[int] = []

        def values(addr: int, nb: int):
            r = int(im.find(np.array([t]), np.array([addr], np.uint64))[0])
            if r < 0:
                return None
            if not read:
                self.values_launches += 1
            read.append(r)
            return im.data(r)[:nb]
        return values, read

    def _gate(self, t: int, step: int, rows: list[int]):
        """(the step whose end the values wait for, bytes copied), or None."""
        if not rows:
            return None
        after = V.producers(self.trace, np.full(len(rows), t), np.array(rows))
        gate = max(self._step_of(int(a)) for a in after.tolist())
        nbytes = int(self.values.nbytes[np.array(rows)].sum())
        return (gate, nbytes) if 0 <= gate < step else (-1, 0)

    def _step_of(self, launch: int) -> int:
        """The step of `launch`, -1 where no step runs it."""
        return int(self.w.step_of(0, launch)) if 0 <= launch < self.trace.n_launches else -1

    def on_launch(self, ctx: Context, step: int):
        w = ctx.w
        t = int(w.step_launch[step])
        dec = self.decider
        try:
            for a in self.lookup.freed_before(t):
                dec.on_free(a)
            self.lookup.t = t
            values, rows = self._values_for(t) if self.values is not None else (None, [])
            d = dec.decide(t, self.launches[t], values)
            # what the engine would hand the driver: ranges cut at allocation boundaries
            self.to_host = dec.allocs.pieces(d.evict) if d.evict else []
            self.to_gpu = dec.allocs.pieces(d.prefetch)
            # lookahead: the next launch's ranges, issued after this launch's on the same copy
            # stream (the engine's `_carry_out_ahead`); this launch waits for its own only
            ahead = dec.allocs.pieces(d.ahead) if d.ahead else []
            self.ahead = ahead
        except Exception as e:  # noqa: BLE001 -- the run cannot go on without the runner's decisions
            raise RuntimeError(f"the runner's decisions failed at launch {t}: {type(e).__name__}: {e}") from e
        self.prefetch_bytes += sum(n for _, n in self.to_gpu) + sum(n for _, n in ahead)
        own = _units(w, self.to_gpu)
        if not ahead:
            # the runner's evictions wait for the work queued before the launch (gpu/cuda_engine.py)
            mv = (_units(w, self.to_host), own, bool(self.to_host))
            gate = self._gate(t, step, rows)
            return mv if gate is None else mv + (gate,)
        # with lookahead the copy stream waits for the evictions (after the work queued before the
        # launch), the launch's stream for its own units only: the first len(own) of the group
        gate = self._gate(t, step, rows)
        return (_units(w, self.to_host), np.concatenate([own, _units(w, ahead)]), bool(self.to_host), gate, len(own))


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
