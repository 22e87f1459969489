"""The GPU runner's engine driven by a real workload model's launches (CPU, stand-in GPU).

A jacobi2d trace is made at one scale, a model fitted on it, and the launches
of a trace at another scale are fed to the engine as the launch hook would
(`LaunchArgs`), with the allocations registered in the stand-in at the same
(template) or shifted (oracle) addresses. What the engine prefetches is
compared with the trace's truth.
"""

from __future__ import annotations

import numpy as np
import pytest

from pagecast import trace as T
from pagecast.collect.launch_hook import LaunchArgs
from pagecast.footprints import footprints
from pagecast.replay.gpu import cuda_engine as E
from pagecast.replay.online import relocate as O
from pagecast.replay.gpu import feedback_loop as FB
from pagecast.replay.online import prediction as GP
from pagecast.replay.online import ranges as R
from pagecast.predict import compiled_kernels as CK
from cuda_standin import FakeCuda

N_LAUNCHES = 400
SHIFT = 1 << 44


@pytest.fixture(scope="module")
def jacobi(tmp_path_factory):
    from pagecast.datasets.registry import make_trace
    from pagecast.predict.fit import fit_model

    d = tmp_path_factory.mktemp("jacobi")
    small = T.read_trace(make_trace("jacobi2d", d / "small.pctrace", scale=0.25))
    big = T.read_trace(make_trace("jacobi2d", d / "big.pctrace", scale=0.5))
    return fit_model([small]), big


def launch_args(row: dict, shift: int = 0) -> LaunchArgs:
    data = bytes(row[T.PARAM_DATA])
    if shift:  # move every pointer word (the allocations live elsewhere in this "run")
        words = np.frombuffer(data[: len(data) // 8 * 8], dtype="<u8").copy()
        ptr = (words >= R.MIN_PTR) & (words < R.MAX_PTR)
        words[ptr] += np.uint64(shift)
        data = words.tobytes() + data[len(data) // 8 * 8:]
    return LaunchArgs.from_row(row, param_data=data)


def drive(engine: E.Engine, fake: FakeCuda, trace, shift: int = 0) -> list[list[tuple[int, int]]]:
    """Feed the first N_LAUNCHES launches; return what was prefetched to the GPU at each."""
    out = []
    for row in trace.launches.slice(0, N_LAUNCHES).to_pylist():
        mark = len(fake.log)
        engine.on_launch(launch_args(row, shift))
        out.append([(a, n) for op, a, n, *_ in (e for e in fake.log[mark:] if e[0] == "gpu")])
    return out


def fake_for(trace, shift: int = 0) -> FakeCuda:
    f = FakeCuda()
    for a in trace.allocations.to_pylist():
        f.add_allocation(a[T.ADDRESS] + shift, a[T.BYTES])
    return f


def overlap_pages(ranges, starts, ends, ps, shift=0) -> tuple[int, int]:
    """(pages of the truth covered by ranges, truth pages)."""
    got = set()
    for a, n in ranges:
        got.update(range((a - shift) // ps, (a - shift + n + ps - 1) // ps))
    truth = set()
    for s, e in zip(starts, ends):
        truth.update(range(int(s), int(e)))
    return len(truth & got), len(truth)


def test_template_policy_prefetches_the_truth_of_an_unseen_scale(jacobi):
    model, big = jacobi
    fake = fake_for(big)
    eng = E.Engine(fake, "template", predict=GP.make_online_predict(model), model_kernels=GP.model_kernel_names(model))
    pre = drive(eng, fake, big)
    assert eng.stats.errors == 0, eng.stats.last_error
    assert eng.stats.unseen_kernels == []
    fp = footprints(big)
    hit = tot = 0
    for t, ranges in enumerate(pre):
        s, e = fp.of(t)
        h, n = overlap_pages(ranges, s, e, fp.page_size)
        hit, tot = hit + h, tot + n
    assert tot > 0 and hit / tot >= 0.95
    assert eng.stats.predicted_launches == N_LAUNCHES


def test_oracle_policy_prefetches_exactly_the_relocated_truth(jacobi):
    _, big = jacobi
    fake = fake_for(big, SHIFT)
    eng = E.Engine(fake, "oracle", relocator=O.Relocator(big))
    pre = drive(eng, fake, big, SHIFT)
    assert eng.stats.errors == 0, eng.stats.last_error
    fp = footprints(big)
    for t, ranges in enumerate(pre):
        s, e = fp.of(t)
        h, n = overlap_pages(ranges, s, e, fp.page_size, SHIFT)
        assert h == n
        # nothing beyond the truth (the last page of an allocation may be partly outside it: clipped)
        got = sum(n_ for _, n_ in ranges)
        assert (n - len(s)) * fp.page_size < got <= n * fp.page_size


def test_emulated_capacity_holds_on_a_real_launch_sequence(jacobi):
    """At 200% oversubscription the residency estimate never exceeds the capacity (unless one launch does)."""
    model, big = jacobi
    fp = footprints(big)
    cap = fp.union_pages() * fp.page_size // 2
    for policy in ("demand", "template"):
        fake = fake_for(big)
        eng = E.Engine(fake, policy, capacity=cap, predict=GP.make_online_predict(model))
        for row in big.launches.slice(0, N_LAUNCHES).to_pylist():
            eng.on_launch(launch_args(row))
            assert eng.residency.resident_bytes <= cap or eng.stats.overflow_launches
        assert eng.stats.errors == 0, eng.stats.last_error


def test_feedback_round_refines_the_model_through_apply_feedback(jacobi):
    """Faults outside the prediction reach pagecast.predict.feedback.apply_feedback (and the history fallback)."""
    import copy

    model, big = jacobi
    model = copy.deepcopy(model)
    fake = fake_for(big)
    predict = GP.make_online_predict(model)
    eng = E.Engine(fake, "template", predict=predict)
    rows = big.launches.slice(0, 60).to_pylist()
    for row in rows:
        eng.on_launch(launch_args(row))
    ps = model.page_size
    found = None
    for t, corr, la, pred in eng.history:   # a launch, and a page of one of its allocations it was not predicted to touch
        covered = {p for a, n in (pred or []) for p in range(a // ps, (a + n + ps - 1) // ps)}
        for w in R.pointer_words(bytes(la.param_data)):
            alloc = eng.allocs.find(w)
            if alloc is None:
                continue
            free = [p for p in range(alloc.base // ps, (alloc.base + alloc.size) // ps) if p not in covered]
            if free:
                found = (corr, la, free[0])
                break
        if found:
            break
    if found is None:
        pytest.skip("every prediction covers its whole allocations: nothing can be missed")
    corr, la, missed = found
    class Records:   # a monitor that has seen the kernel and its fault
        def take(self):
            return [(150, missed * ps, 1)], [(100, 200, corr, la.kernel)]

    before = model.version_counter
    loop = FB.FeedbackLoop(eng, Records(), model, "history", predict)
    loop.round()
    assert eng.stats.errors == 0, eng.stats.last_error
    km = model.kernels[la.kernel]
    assert km.feedback["events"] >= 1 and km.feedback["missed_pages"] >= 1
    assert eng.stats.feedback_updates == (1 if model.version_counter != before else 0)


def test_allocations_are_looked_up_only_when_a_prediction_needs_one(jacobi):
    """The online predictor asks the runner's AllocationMap for a pointer's allocation the first time a
    region needs it (no scan of every parameter word per launch), compiles every kernel before the
    first launch, and forgets an allocation the workload frees."""
    model, big = jacobi
    fake = fake_for(big)
    pred = GP.make_online_predict(model)
    op = pred.online
    assert set(op._entries) == set(model.kernels)            # every kernel in the program, and the
    assert CK.predict_launch.signatures                       # kernel compiled: nothing compiles in a launch
    eng = E.Engine(fake, "template", predict=pred)
    lookups = []
    real = eng.allocs._lookup                                  # what asks the driver (cuMemGetAddressRange)
    eng.allocs._lookup = lambda addr: (lookups.append(addr), real(addr))[1]
    rows = big.launches.slice(0, N_LAUNCHES).to_pylist()
    for row in rows:
        eng.on_launch(launch_args(row))
    assert eng.stats.errors == 0, eng.stats.last_error
    n_allocs = len({a.base for a in map(real, lookups) if a is not None})
    assert 0 < len(lookups) <= 2 * n_allocs + 8               # once per allocation, not per launch
    before = len(lookups)
    for row in rows[:50]:
        eng.on_launch(launch_args(row))
    assert len(lookups) == before
    # a freed allocation is forgotten by the predictor too, and looked up again when next needed
    base = op._addrs[0]
    eng.on_free(base)
    assert base not in op._ends
    for row in rows[:50]:
        eng.on_launch(launch_args(row))
    assert base in op._ends and len(lookups) > before
