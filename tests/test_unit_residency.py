"""The residency estimate in arrays (replay/online/unit_residency.py) and the compiled period
detector (replay/online/period.py) against the Python objects they replace (residency.py): the same
decisions on random launch sequences, for every victim rule, with sections that must grow."""

from __future__ import annotations

import random

import pytest

from pagecast.replay.online import residency as RS
from pagecast.replay.online import residency_kernels as RK
from pagecast.replay.online.period import PeriodTracker
from pagecast.replay.online.ranges import UNIT, front_units, merge_ranges, units_of
from pagecast.replay.online.unit_residency import UnitResidency

TINY = {RK.R_SLOTS: 2, RK.R_HASH: 4, RK.R_POOL: 2, RK.R_LOG: 4, RK.R_IO: 1, RK.R_SCR: 8}


def U(i, n=1):
    return (i * UNIT, n * UNIT)


def random_ranges(rng, units=12):
    out = []
    for _ in range(rng.randrange(0, 5)):
        a = rng.randrange(units) * UNIT + rng.choice([0, 4096, 8192, UNIT // 2, rng.randrange(UNIT)])
        out.append((a, rng.choice([4096, 8192, UNIT, 2 * UNIT, rng.randrange(1, 3 * UNIT), 0])))
    return out


class Belady:
    """A scorer object (the oracle's FutureNextUse, on made-up future uses)."""

    def __init__(self, rng):
        self.fut = RS.FutureNextUse({u: sorted(rng.sample(range(600), 40)) for u in range(12)}, lambda u: {u})

    def score(self, u, t):
        return self.fut.score(u, t)


def reference_step(ref, seq, want, est, t, known, streams_front):
    """LaunchDecider's capacity branch on the reference objects."""
    if known and streams_front and len(units_of(est, UNIT)) > ref.capacity_units:   # memory in whole units
        pf = ref.missing(front_units(want, ref.capacity_units, UNIT))
    else:
        pf = ref.missing(want)
    admitted = merge_ranges(list(est) + list(want))
    if seq is not None:
        seq.record(t, units_of(admitted, UNIT))
    before = ref.overflows
    ev = ref.admit(admitted, t, streams=known)
    return pf, ev, ref.overflows > before


@pytest.mark.parametrize("victim", ["fifo", "lru", "next-use", "belady"])
@pytest.mark.parametrize("seed", range(8))
def test_the_same_decisions_as_the_reference_on_random_launches(victim, seed):
    rng = random.Random(seed)
    cap = rng.choice([UNIT, 3 * UNIT, 5 * UNIT + 12345, 8 * UNIT])
    det = RS.PeriodDetector(min_match=4, search_every=1, max_period=64)
    seq = RS.SequenceNextUse(det) if victim == "next-use" else None
    scorer = Belady(rng) if victim == "belady" else None
    ref = RS.Residency(cap, UNIT, victim, seq or scorer)
    new = UnitResidency(cap, UNIT, victim, scorer, max_period=64, sections=TINY if seed % 2 else None).warm()
    pattern = [random_ranges(rng) for _ in range(rng.randrange(1, 8))]
    periods = evictions = 0
    for t in range(300):
        want = pattern[t % len(pattern)] if rng.random() < 0.7 else random_ranges(rng)
        est = want if rng.random() < 0.6 else random_ranges(rng)
        known, streams_front = rng.random() < 0.7, rng.random() < 0.5
        det.observe(f"k{t % len(pattern)}" if rng.random() < 0.95 else f"x{rng.randrange(9)}")
        periods += det.period is not None
        op = rng.random()
        if op < 0.08:
            freed = random_ranges(rng)
            assert ref.release(freed) == new.release(freed), t
            continue
        if op < 0.15:
            probe = random_ranges(rng)
            assert ref.missing(probe) == new.missing(probe), t
        got = new.step(want, est, t, known=known, front=streams_front, record=seq is not None, period=det.period)
        assert got == reference_step(ref, seq, want, est, t, known, streams_front), (t, victim)
        assert (new.resident_bytes, new.resident_units, new.evicted_bytes, new.evictions, new.overflows) == \
            (ref.resident_bytes, ref.resident_units, ref.evicted_bytes, ref.evictions, ref.overflows), t
        assert dict(new.resident) == dict(ref.resident), t
        if victim in ("fifo", "lru"):
            assert list(new.resident) == list(ref.resident), t    # the victim order itself
        evictions = ref.evictions
    assert evictions > 0
    if victim == "next-use":
        assert periods > 0


def test_the_sequence_scores_are_sequence_next_use_s():
    det = RS.PeriodDetector(min_match=4, search_every=1)
    ref = RS.SequenceNextUse(det)
    new = UnitResidency(100 * UNIT, UNIT, "next-use").warm()
    rng = random.Random(4)
    for t in range(400):
        units = {rng.randrange(20) for _ in range(rng.randrange(1, 4))}
        ref.record(t, units)
        new.step([U(u) for u in sorted(units)], [], t, record=True, period=None)
        for period in (None, 1, 7, 50):
            for u in range(22):
                det.period = period
                assert new.score(u, t + 1, period) == ref.score(u, t + 1), (t, u, period)


def test_residency_s_own_examples():
    """A few of tests/test_gpu_runner.py's residency cases, on the arrays."""
    r = UnitResidency(3 * UNIT, UNIT, "fifo")
    assert r.admit([U(0), U(1), U(2)], 0) == []
    assert r.admit([U(1)], 1) == []
    assert r.admit([U(0), U(3)], 2) == [U(1)]
    assert set(r.resident) == {0, 2, 3}
    r = UnitResidency(8192, UNIT, "fifo")
    r.admit([(100, 4096), (UNIT - 4096, 4096)], 0)
    assert r.admit([(5 * UNIT, 10)], 1) == [(100, 4096), (UNIT - 4096, 4096)]
    assert r.evicted_bytes == 8192 and r.resident_bytes == 10
    r = UnitResidency(2 * UNIT, UNIT, "fifo")
    r.admit([U(9)], 0)
    assert r.admit([U(0, 3)], 1) == [U(9)] and r.overflows == 1
    assert set(r.resident) == {1, 2} and r.missing([U(0, 3)]) == [U(0)]
    r = UnitResidency(4 * UNIT, UNIT, "fifo")
    r.admit([U(0, 3)], 0)
    assert r.release([(UNIT + 4096, UNIT)]) == UNIT and r.resident_bytes == 2 * UNIT
    assert r.release([U(0, 3)]) == 2 * UNIT and r.resident_bytes == 0 and not r.resident
    scores = {0: 5.0, 1: float("inf"), 2: 1.0}

    class S:
        def score(self, u, t):
            return scores.get(u, 0.0)

    r = UnitResidency(3 * UNIT, UNIT, "next-use", S())
    r.admit([U(0), U(1), U(2)], 0)
    assert r.admit([U(3), U(4)], 1) == merge_ranges([U(1), U(0)])
    assert set(r.resident) == {2, 3, 4}


def test_sections_grow_and_keep_what_they_hold():
    r = UnitResidency(1 << 40, UNIT, "next-use", sections=TINY).warm()
    for t in range(200):
        r.step([(u * UNIT + 4096 * (t % 7), 4096) for u in range(t % 40)], [], t, record=True, period=None)
    assert r.resident_units == 39 and r._caps[RK.R_SLOTS] >= 40 and r._caps[RK.R_LOG] > 4
    assert all(len(v) >= 1 for v in r.resident.values())


@pytest.mark.parametrize("seed", range(20))
def test_the_period_tracker_is_the_period_detector(seed):
    rng = random.Random(seed)
    kw = dict(max_period=rng.choice([16, 64, 1024]), min_match=rng.choice([4, 16]),
              search_every=rng.choice([1, 8]))
    a, b = RS.PeriodDetector(**kw), PeriodTracker(**kw).warm()
    step = [f"k{rng.randrange(rng.randrange(1, 30))}" for _ in range(rng.randrange(1, min(200, kw["max_period"])))]
    breaks = 0.005 if seed % 2 else 0.0   # odd seeds: the sequence breaks now and then
    found = 0
    for t in range(2000):
        k = step[t % len(step)] if rng.random() >= breaks else f"x{rng.randrange(5)}"
        assert a.observe(k) == b.observe(k), (t, kw)
        found += a.period is not None
    assert b.period == a.period
    FOUND.append(found)


FOUND: list[int] = []


def test_the_period_tracker_finds_periods():
    """The comparisons above saw periods (the sequences are periodic, with rare breaks)."""
    t = PeriodTracker(min_match=8, search_every=1).warm()
    got = [t.observe(k) for k in ["embed", "attn", "mlp", "attn", "mlp", "head"] * 6]
    assert got[-1] == 6 and got[5] is None
    assert not FOUND or sum(f > 0 for f in FOUND) >= len(FOUND) // 3


@pytest.mark.parametrize("victim", ["belady", "next-use", "fifo"])
def test_many_resident_units_few_outputs(victim):
    """More candidates than io has rows (the scores go through io): hundreds of small resident units,
    one unit admitted per launch."""
    rng = random.Random(7)

    class Far:
        def score(self, u, t):
            return float((u * 7919 + t) % 1000)

    scorer = Far() if victim == "belady" else None
    det = RS.PeriodDetector(min_match=4, search_every=1)
    seq = RS.SequenceNextUse(det) if victim == "next-use" else None
    # a page in each unit, each unit taking its whole 2 MiB of the capacity (memory in chunks)
    ref = RS.Residency(300 * UNIT, UNIT, victim, seq or scorer)
    new = UnitResidency(300 * UNIT, UNIT, victim, scorer).warm()
    for t in range(1500):
        u = rng.randrange(400) if t % 3 else t % 350
        want = [(u * UNIT, 4096)]
        det.observe(f"k{t % 50}")
        got = new.step(want, want, t, record=seq is not None, period=det.period)
        assert got == reference_step(ref, seq, want, want, t, True, False), t
    assert ref.evictions > 200 and new.resident_units > 200
