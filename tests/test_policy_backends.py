"""One policy system for both backends: the same launches, replayed through the simulator (policy
`runner` carrying a policy's per-launch decisions) and through the GPU engine (on a CUDA stand-in),
ask for the same prefetches and evictions, launch by launch."""

from __future__ import annotations

import pytest

from cuda_standin import FakeCuda
from pagecast import trace as T
from pagecast.collect.launch_hook import LaunchArgs
from pagecast.replay import policies as P
from pagecast.replay.gpu.cuda_engine import Engine
from pagecast.replay.online.lookahead import lookahead_for
from pagecast.replay.online.prediction import default_fallback, make_online_predict
from pagecast.replay.online.relocate import Relocator
from pagecast.replay.policies.runner import Runner
from pagecast.replay.sim import kernels as K
from pagecast.replay.sim import run as R
from pagecast.replay.sim.sweep import SimConfig
from pagecast.replay.unit_space import build_workload


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    from pagecast.datasets.registry import make_trace
    from pagecast.predict.fit import fit_model
    d = tmp_path_factory.mktemp("backends")
    name = "llm-prefill-decode"   # frees its prompt temporaries and reuses their addresses
    fit = [T.read_trace(make_trace(name, d / f"f{s}.pctrace", scale=0.05, seed=s)) for s in (1, 2)]
    return fit_model(fit), T.read_trace(make_trace(name, d / "r.pctrace", scale=0.05, seed=3))


class Recording(Runner):
    """The runner policy, keeping what each launch asked the simulator to move."""

    def prefetch(self, ctx):
        self.asked: list[tuple[list, list]] = []
        self.looked_ahead = 0
        return super().prefetch(ctx)

    def on_launch(self, ctx, step):
        out = super().on_launch(ctx, step)
        self.asked.append((list(self.to_gpu) + list(self.ahead), list(self.to_host)))
        self.looked_ahead += bool(self.ahead)
        return out


def simulated(policy: str, model, tr, cap_units: int):
    prof = SimConfig().profile()
    w = build_workload([tr], gran=prof.granularity, eviction_unit=prof.eviction_unit, profile=prof)
    # the simulator's runner reads the trace's index values; the engine below reads the same bytes
    # from the stand-in's memory, written there as each launch begins
    # one launch at a time (no plan given): the decisions the engine below makes
    pol = Recording(model, policy=P.POLICIES[policy](), values=True, planned=False)
    r = R.run_policy(w, pol, cap_units, prof, P.Options())
    # the planned policies look ahead (the launch's ranges, then the next one's), the others do not
    assert (pol.looked_ahead > 0) == (policy in ("template", "oracle")), (policy, pol.looked_ahead)
    return w, r, pol.asked


def on_the_gpu(policy: str, model, tr, capacity: int):
    """The engine driven with the trace's launches; allocations live from their first launch to their last."""
    fake = FakeCuda()
    rel = Relocator(tr)
    # the same lookahead schedule as the simulator's runner (online/lookahead.py), as the child builds it
    ahead = lookahead_for(P.online_policy(policy), tr, model=model, fallback=default_fallback(False), relocator=rel)
    eng = Engine(fake, policy, capacity=capacity, predict=make_online_predict(model, default_fallback(False)),
                 relocator=rel, ahead=ahead)
    allocs = tr.allocations.to_pylist()
    born: dict[int, list] = {}
    dead: dict[int, list] = {}
    for a in allocs:
        born.setdefault(a[T.FIRST_LAUNCH], []).append(a)
        if a[T.LAST_LAUNCH] is not None:
            dead.setdefault(a[T.LAST_LAUNCH] + 1, []).append(a)
    values: dict[int, list] = {}   # launch -> its index values, as the buffers held them when it began
    if tr.values is not None:
        for v in tr.values.to_pylist():
            values.setdefault(v[T.LAUNCH_ID], []).append((v[T.ADDRESS], v[T.DATA]))
    asked = []
    for t, row in enumerate(tr.launches.to_pylist()):
        for a in dead.get(t, []):
            fake.free(a[T.ADDRESS])
            eng.on_free(a[T.ADDRESS])
        for a in born.get(t, []):
            fake.add_allocation(a[T.ADDRESS], a[T.BYTES])
        for addr, data in values.get(row[T.LAUNCH_ID], []):
            fake.write(addr, data)
        fake.log.clear()
        eng.on_launch(LaunchArgs.from_row(row, stream=7))
        asked.append(([(x[1], x[2]) for x in fake.log if x[0] == "gpu"],
                      [(x[1], x[2]) for x in fake.log if x[0] == "host"]))
    assert eng.stats.errors == 0 and eng.stats.failed_calls == 0, eng.stats.last_error
    return asked


@pytest.mark.parametrize("policy", ["demand", "alloc", "template", "oracle"])
def test_simulator_and_gpu_engine_make_the_same_decisions(fitted, policy):
    model, tr = fitted
    prof = SimConfig().profile()
    w = build_workload([tr], gran=prof.granularity, eviction_unit=prof.eviction_unit, profile=prof)
    cap_units = max(w.universe.n_units // 3, 1)      # a third of the footprint: evictions on both sides
    w, r, sim = simulated(policy, model, tr, cap_units)
    gpu = on_the_gpu(policy, model, tr, cap_units * w.gran)
    assert len(sim) == len(gpu) == tr.n_launches
    for t, (s, g) in enumerate(zip(sim, gpu)):
        assert s == g, (policy, t)
    moved_in = sum(n for pf, _ in gpu for _, n in pf)
    moved_out = sum(n for _, ev in gpu for _, n in ev)
    # demand prefetches nothing, yet evicts to keep its estimate within the emulated capacity
    assert (moved_in == 0) == (policy == "demand") and moved_out > 0
    # and the simulator carried the decisions out as planned transfers of those units
    assert (int(r.counters[:, K.C_PREFETCH_IN].sum()) == 0) == (policy == "demand")
    assert int(r.counters[:, K.C_GROUP_DTOH].sum()) > 0


def test_the_gpu_backend_runs_the_registered_online_policies():
    """The GPU engine takes its policies from the one registry: names and victim rules."""
    online = P.online_names()
    assert online == ["demand", "alloc", "template", "oracle"]
    assert {n: P.POLICIES[n].victims for n in online} == \
        {"demand": "fifo", "alloc": "fifo", "template": "next-use", "oracle": "belady"}
    fake = FakeCuda()
    for name in ("swap", "runner", "no-such"):
        with pytest.raises(Exception, match="GPU backend"):
            Engine(fake, name)
    for n in ("demand", "alloc", "template"):
        assert Engine(fake, n, predict=lambda la, a: []).policy is not P.POLICIES[n]   # an instance of it
        assert type(Engine(fake, n, predict=lambda la, a: []).policy) is P.POLICIES[n]
