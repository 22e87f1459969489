"""The runner's compiled decisions (the default: compiled predictor, period and residency in arrays)
are the Python path's, launch by launch, on every workload model and every policy the GPU backend
runs: what each launch prefetches, evicts, predicts, whether it overflows, the period. So the
simulator's `runner` rows (docs/results.md) and a GPU run's transfers are what they were."""

from __future__ import annotations

import pytest

from pagecast import trace as T
from pagecast.collect.launch_hook import LaunchArgs
from pagecast.footprints import truth_footprints
from pagecast.replay import policies as P
from pagecast.replay.online.decide import LaunchDecider
from pagecast.replay.online.prediction import make_online_predict
from pagecast.replay.online.ranges import UNIT, AllocationMap
from pagecast.replay.online.relocate import Relocator
from pagecast.replay.policies.runner import TraceAllocations

# Every workload model, fitted, replayed twice per policy and capacity: minutes, not seconds
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def workloads(tmp_path_factory):
    from pagecast.datasets.registry import WORKLOADS, make_trace
    from pagecast.predict.fit import fit_model
    d = tmp_path_factory.mktemp("runner")
    out = []
    for name in WORKLOADS:
        fit = [T.read_trace(make_trace(name, d / f"{name}-{s}.pctrace", scale=0.05, seed=s)) for s in (1, 2)]
        out.append((name, fit_model(fit), T.read_trace(make_trace(name, d / f"{name}-r.pctrace", scale=0.05, seed=3))))
    return out


def decisions(policy: str, model, trace, capacity: int, compiled: bool, fallback: str):
    rel = Relocator(trace, truth_footprints(trace))
    look = TraceAllocations(rel)
    dec = LaunchDecider(P.POLICIES[policy](), AllocationMap(look.allocation_of), capacity=capacity,
                        relocator=rel, compiled=compiled,
                        predict=make_online_predict(model, fallback, compiled=compiled))
    out = []
    for t, row in enumerate(trace.launches.to_pylist()):
        for a in look.freed_before(t):
            dec.on_free(a)
        look.t = t
        d = dec.decide(t, LaunchArgs.from_row(row, stream=7))
        out.append((d.prefetch, d.evict, d.predicted, d.overflow, d.period))
    return out, dec


@pytest.mark.parametrize("policy", ["template", "alloc", "demand", "oracle"])
def test_compiled_decisions_are_the_python_paths(workloads, policy):
    evicted = 0
    for name, model, trace in workloads:
        total = int(trace.allocations.column(T.BYTES).to_numpy().sum())
        for frac, fallback in ((3, "none"), (2, "history")):
            cap = max(total // frac, UNIT)
            new, dn = decisions(policy, model, trace, cap, True, fallback)
            ref, dr = decisions(policy, model, trace, cap, False, fallback)
            assert len(new) == len(ref) == trace.n_launches
            for t, (a, b) in enumerate(zip(new, ref)):
                assert a == b, (name, policy, fallback, t)
            assert (dn.residency.resident_bytes, dn.residency.evictions) == \
                (dr.residency.resident_bytes, dr.residency.evictions), name
            evicted += dr.residency.evictions
    assert evicted > 0
