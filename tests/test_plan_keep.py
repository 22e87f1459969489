"""keep_prefetches' compiled pass against the numpy arrays it replaced (the step of every prefetch
entry, bincounts and np.maximum.at over the kept ones), on drawn plans."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pagecast.replay.plan import groups as PG


def reference(g, keep, need):
    n = g.n_steps
    step = np.repeat(np.arange(n), np.diff(g.pf_ptr))
    ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(step[keep], minlength=n), out=ptr[1:])
    need_now = np.bincount(step[keep & (need == step)], minlength=n).astype(np.int64)
    need_group = np.full(n, -1, np.int64)
    early = keep & (need > step)
    np.maximum.at(need_group, need[early], step[early])
    return ptr, need_now, need_group, g.pf_unit[keep]


@st.composite
def plans(draw):
    n = draw(st.integers(1, 12))
    sizes = draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
    ptr = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    m = int(ptr[-1])
    units = np.array(draw(st.lists(st.integers(0, 40), min_size=m, max_size=m)), np.int16)
    step = np.repeat(np.arange(n), sizes)
    # the step each entry is for: none (-1), its own group's, or a later one
    need = np.array([draw(st.sampled_from([-1, int(s), draw(st.integers(int(s), n - 1))])) for s in step],
                    np.int32).reshape(-1)
    keep = np.array(draw(st.lists(st.booleans(), min_size=m, max_size=m)), bool)
    pf_after = np.array(draw(st.lists(st.integers(-1, n - 1), min_size=m, max_size=m)), np.int64)
    e = PG.Groups.empty(n)
    g = PG.Groups(e.ev_ptr, e.ev_unit, ptr, units, np.zeros(n, np.int64), e.wait_prev, e.blocking, e.thrash,
                  pf_after=pf_after, gate_bytes=np.arange(n, dtype=np.int64) + 1)
    return g, keep, need


@settings(max_examples=200, deadline=None)
@given(plans())
def test_kept_plan_matches_the_numpy_reference(case):
    g, keep, need = case
    ptr, need_now, need_group, units = reference(g, keep, need)
    k = PG.keep_prefetches(g, keep, need)
    assert k.pf_ptr.tolist() == ptr.tolist()
    assert k.need_now.tolist() == need_now.tolist()
    assert k.need_group.tolist() == need_group.tolist()
    assert k.pf_unit.tolist() == units.tolist() and k.pf_unit.dtype == g.pf_unit.dtype
    assert k.faulted == g.faulted + int((~keep).sum())
    pa = g.prefetch_after()[keep]
    assert k.prefetch_after().tolist() == pa.tolist()
    assert k.gate.tolist() == PG.gate_of(ptr, pa if (pa >= 0).any() else np.zeros(0, np.int64)).tolist()
