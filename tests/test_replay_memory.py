"""What a replay keeps smaller to bound its memory, against the full-size computation it replaces:
`attach_after` made a few steps at a time, a finished run kept as its summary (`run.compact`), the
value alternatives made one at a time, the glibc threshold that returns freed arrays."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagecast.memory import return_freed_arrays
from pagecast.replay import unit_space as U
from pagecast.replay.costs import load_profile
from pagecast.replay.sim import sweep as SW
from pagecast.replay.sim.kernels import N_COUNTERS
from pagecast.replay.sim.run import compact, summarize
from pagecast.replay.unit_space import I64, Needs

import index_workload as IW


def _needs(rng, n_steps, n_units, dense):
    ptr, units = [0], []
    for _ in range(n_steps):
        u = np.flatnonzero(rng.random(n_units) < dense)
        units.append(u)
        ptr.append(ptr[-1] + len(u))
    return np.asarray(ptr, I64), np.concatenate(units).astype(I64) if units else np.zeros(0, I64)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), steps=st.integers(1, 30), units=st.integers(1, 40), piece=st.integers(1, 12))
def test_attach_after_in_pieces_equals_all_at_once(seed, steps, units, piece):
    rng = np.random.default_rng(seed)
    block_lo = (np.arange(units, dtype=I64) // 4) * 4
    bptr, bunit = _needs(rng, steps, units, 0.3)
    after = np.where(rng.random(len(bunit)) < 0.5, -1, rng.integers(0, steps, len(bunit))).astype(I64)
    base = Needs(bptr, bunit, after, np.arange(steps, dtype=I64))
    dptr, dunit = _needs(rng, steps, units, 0.5)
    derived = Needs(dptr, dunit)
    old = U.ATTACH_USES
    try:
        U.ATTACH_USES = 1 << 40
        whole = U.attach_after(derived, base, block_lo)
        U.ATTACH_USES = piece
        parts = U.attach_after(derived, base, block_lo)
    finally:
        U.ATTACH_USES = old
    assert parts.after.dtype == whole.after.dtype == I64
    np.testing.assert_array_equal(parts.after, whole.after)
    assert parts.value_bytes is base.value_bytes and parts.unit is derived.unit
    # and the rule itself, use by use: an exact use keeps its own, else the earliest in its block
    for s in range(steps):
        bu, ba = bunit[bptr[s]:bptr[s + 1]], after[bptr[s]:bptr[s + 1]]
        for k in range(dptr[s], dptr[s + 1]):
            x = dunit[k]
            if (bu == x).any():
                want = ba[np.flatnonzero(bu == x)[0]]
            else:
                same = block_lo[bu] == block_lo[x]
                want = ba[same].min() if same.any() else -1
            assert parts.after[k] == want


@pytest.fixture(scope="module")
def gathered(tmp_path_factory):
    from pagecast import trace as T
    from pagecast.predict.fit import fit_model
    d = tmp_path_factory.mktemp("mem")
    paths = [IW.build(seed=s).write(d / f"g{s}.pctrace") for s in (1, 2, 3)]
    model = IW.with_indexed(fit_model([T.read_trace(p) for p in paths[:2]]))
    return T.read_trace(paths[2]), model


def test_a_replay_without_timeline_reports_what_the_full_runs_report(gathered, monkeypatch):
    """The runs kept compact (no timeline) give the rows the full runs give, number for number, and
    oracle still sees its rivals' runs."""
    tr, model = gathered
    pols = ["demand", "template", "oracle"]
    full, tl = SW.replay_sim([tr], pols, oversub=[1.5, 3], model=model, timeline=True)
    kept = []
    real = SW.compact
    monkeypatch.setattr(SW, "compact", lambda r: kept.append(real(r)) or kept[-1])
    small, none = SW.replay_sim([tr], pols, oversub=[1.5, 3], model=model, timeline=False)
    assert none is None and tl is not None and tl.num_rows == len(full) * tr.n_launches
    assert len(kept) == len(full) and all(len(r.counters) == 1 for r in kept)
    assert small == full


def test_compact_keeps_the_summary():
    rng = np.random.default_rng(3)
    n = 50
    r = SW.RunResult("x", 7, rng.integers(0, 9, (n, N_COUNTERS)).astype(I64), np.cumsum(rng.random(n)),
                     np.cumsum(rng.random(n)) + 1, rng.random(n), rng.random(n), {"plan_span": "unit"})

    class W:
        gran = 65536
        n_steps = n
        truth = Needs(np.arange(0, 2 * n + 1, 2, dtype=I64), np.zeros(2 * n, I64))
    c = compact(r)
    assert summarize(c, W) == summarize(r, W) and c.extra is r.extra and c.end[-1] == r.end[-1]
    assert compact(c) is c


def test_the_alternatives_are_made_when_read(gathered):
    from pagecast.replay.plan.adaptive import predicted_gated
    from pagecast.replay.plan.alternatives import value_alternatives
    tr, model = gathered
    prof = load_profile("msched-rtx5080")
    w = U.build_workload([tr], gran=prof.granularity, eviction_unit=prof.eviction_unit, profile=prof)
    alts = value_alternatives(w, model, [tr], "adaptive", [predicted_gated(model, tr, "adaptive")])
    assert len(alts) == 3 and alts
    a, b = alts[2], alts[2]
    assert a is not b   # made again, not kept
    np.testing.assert_array_equal(a.ptr, b.ptr)
    np.testing.assert_array_equal(a.unit, b.unit)


def test_the_threshold_is_set_on_glibc():
    import platform
    got = return_freed_arrays()
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert got
    else:
        assert got is False
