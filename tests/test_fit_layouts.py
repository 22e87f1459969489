"""The fitter against layouts it did not choose (tests/layout_gen.py): kernels drawn at random
from the classes serving engines build (indices per token and per block, slot mappings divided
into blocks, several layers in one allocation, persistent block tables with stale entries,
indptr -> indices, tables of addresses; strides and diagonals of the arguments), fitted from two
traces (sizes 1 and 2, 0-5% of records lost) and scored at size 3, which the fit never saw.

Each kernel must come out one of:
- recovered: precision >= 99.9% and recall >= 99.75% at the unseen size;
- declined: the fit says it cannot (its region falls back: `irregular`, or the whole allocation),
  counted;
- anything else (a template that verifies on the profile and misses at the unseen size) fails.

The (class, lossy) pairs the fitter does not handle yet are listed in KNOWN_GAPS: their outcomes
are counted and printed, not asserted. The draw's seed and loss are printed on failure (and
hypothesis prints the falsifying example).
"""

from __future__ import annotations

import warnings
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagecast import trace as T
from pagecast.predict.evaluate import evaluate
from pagecast.predict.fit import fit_model

import layout_gen as LG

P_BAR, R_BAR = 0.999, 0.9975
SETTINGS = dict(deadline=None, derandomize=True, print_blob=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def outcomes(layouts, drop: float, tmp, seed: int) -> dict:
    """{kernel name: (outcome, precision, recall, class fitted)} for `layouts` fitted at sizes 1
    and 2 (`drop` of their records lost) and scored at size 3 against the truth."""
    paths = [LG.write_trace(layouts, s, tmp / f"s{s}.pctrace", drop=drop if s < 3 else 0.0, seed=seed)
             for s in (1, 2, 3)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traces = [T.read_trace(p) for p in paths]
        model = fit_model(traces[:2])
        doc = evaluate(model, traces[2], "none")
    out = {}
    for d in doc["kernels"]:
        lay = next((x for x in layouts if x.name in d["kernel"]), None)
        if lay is None:
            continue
        km = model.kernels.get(d["kernel"])
        cls = km.cls if km is not None else "unseen"
        ok = d["precision"] >= P_BAR and d["recall"] >= R_BAR
        declined = cls in ("irregular", "allocation")
        out[lay.name] = ("recovered" if ok else "declined" if declined else "wrong", d["precision"], d["recall"], cls,
                         {r.base: r for r in km.regions} if km is not None else {})
    return out


def _layouts(draw_classes, seed: int, per_class: int) -> list:
    rng = np.random.default_rng(seed)
    return [LG.draw(rng, c, k) for k, c in enumerate(c for c in draw_classes for _ in range(per_class))]


# (class, lossy) pairs whose kernels the fitter does not yet recover or decline: their outcomes
# are drawn, counted and printed, not asserted (docs/template-model.md, "Layouts it did not
# choose", says what each does instead). Everything else must be recovered or declined.
KNOWN_GAPS = {
    ("addr_table", False), ("addr_table", True),   # rows in allocations no pointer argument names: `linear`
    ("strided", False), ("strided", True),         # a pitch-strided column slice fits as its hull (`linear`)
    ("diagonal", False), ("diagonal", True),       # anti-diagonals: `irregular`, or a strided guess
    ("slot_div", False), ("slot_div", True),       # a head-major block write: some draws miss 3% of pages
    ("indptr", False), ("indptr", True),           # indptr -> indices: precision 99.8% in some draws
    ("gather", True), ("layers", True), ("block_table", True),   # with records lost: some draws fit `linear`
}
QUICK = ("gather", "layers", "block_table")   # recovered clean in every draw tried


def _check(res: dict, tally: Counter, lossy: bool) -> list:
    bad = []
    for name, (oc, p, r, cls, _) in res.items():
        c = name.rsplit("_", 1)[0]
        tally[(c, "lossy" if lossy else "clean", oc)] += 1
        if oc == "wrong" and (c, lossy) not in KNOWN_GAPS:
            bad.append(f"{name}: fitted {cls}, precision {p:.4f} recall {r:.4f} at the unseen size")
    return bad


TALLY: Counter = Counter()


@settings(max_examples=1, **SETTINGS)
@given(seed=st.integers(0, 2**31 - 1))
def test_drawn_tables_have_their_address_maps_recovered(tmp_path_factory, seed):
    """The quick loop: one kernel of each of the classes whose address map the fitter solves, clean:
    the table's region is `indexed` through the ids (or the block table) with the drawn row (or
    block) as its stride and chunk, at whatever offset, width and padding were drawn. (Their
    kernels' other buffers are held to the bar in the slow test, where some still miss it.)"""
    layouts = _layouts(QUICK, seed, 1)
    res = outcomes(layouts, 0.0, tmp_path_factory.mktemp("layouts"), seed)
    for lay in layouts:
        r = res[lay.name][4].get("p1")
        assert r is not None and r.cls == "indexed", f"seed={seed} {lay}: {r and r.text()}"
        step = lay.block * lay.row if lay.cls == "block_table" else lay.row
        assert r.index == "p2" and r.stride.terms == () and r.stride.const == step, f"seed={seed} {lay}: {r.text()}"
        assert r.chunk == r.stride, f"seed={seed} {lay}: {r.text()}"


@pytest.mark.slow
@settings(max_examples=10, **SETTINGS)
@given(seed=st.integers(0, 2**31 - 1), drop=st.sampled_from([0.0, 0.01, 0.05]))
def test_two_hundred_drawn_layouts(tmp_path_factory, seed, drop):
    """10 examples x 8 classes x 3 kernels: 240 drawn kernels a run, their outcomes tallied by
    class (printed with -s); a kernel outside KNOWN_GAPS fitted to a template that misses the bar
    at the unseen size fails, with the example's seed and loss."""
    layouts = _layouts(LG.CLASSES, seed, 3)
    res = outcomes(layouts, drop, tmp_path_factory.mktemp("layouts"), seed)
    bad = _check(res, TALLY, drop > 0)
    print(f"seed={seed} drop={drop}", sorted(TALLY.items()))
    assert not bad, f"seed={seed} drop={drop}: " + "; ".join(bad)
