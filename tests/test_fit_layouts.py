"""The fitter against layouts it did not choose (tests/layout_gen.py): kernels drawn at random
from the classes serving engines build (indices per token and per block, slot mappings divided
into blocks, several layers in one allocation, persistent block tables with stale entries,
indptr -> indices, tables of addresses; strides and diagonals of the arguments), fitted from two
traces (sizes 1 and 2, 0-5% of records lost) and scored at size 3, which the fit never saw.

Each kernel comes out one of:
- recovered: precision >= 99.9% and recall >= 99.75% at the unseen size;
- declined: the fit falls back (`irregular`, or the whole allocation);
- wrong: a template that verifies on the profile and misses the bar at the unseen size.

The slow test tallies them over 240 drawn kernels (issue 52 asks for recovered or a declared
"cannot", never wrong; the tally says how far the fitter is from that). Both tests assert what the
fitter does solve: the address map of a per-token gather and of layers in one allocation. The draw's seed and loss are printed on failure.
"""

from __future__ import annotations

import warnings
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
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


FEW_BIG_PAGES = 16 << 16   # a table smaller than 16 big pages
QUICK = ("gather", "layers")   # the classes whose address map the fitter solves in every draw tried


def _tally(res: dict, tally: Counter, lossy: bool) -> None:
    for name, (oc, _, _, _, _) in res.items():
        tally[(name.rsplit("_", 1)[0], "lossy" if lossy else "clean", oc)] += 1


def _address_map_errors(layouts, res: dict, seed: int) -> list:
    """For the QUICK classes: is the table's region `indexed` through the ids with the drawn row as
    its stride and chunk, or the kernel recovered at the unseen size by another template (a table
    of a few big pages whose rows a batch reaches almost all of, which a range explains as well)?"""
    bad = []
    for lay in layouts:
        if lay.cls not in QUICK:
            continue
        oc, _, _, _, regions = res[lay.name]
        r = regions.get("p1")
        step = lay.row
        if oc == "recovered" or lay.rows * lay.row < FEW_BIG_PAGES:
            # a table of a few big pages whose every big page a batch reaches: the records cannot
            # tell its rows from a range over it (issue 52's third item: not pinned)
            continue
        if r is None or r.cls != "indexed" or r.index != "p2" or r.stride.terms or r.stride.const != step \
                or r.chunk != r.stride:
            bad.append(f"seed={seed} {lay}: {r.text() if r is not None else None}")
    return bad


TALLY: Counter = Counter()
SEEN: set = set()


@settings(max_examples=1, **SETTINGS)
@given(seed=st.integers(0, 2**31 - 1))
def test_drawn_tables_have_their_address_maps_recovered(tmp_path_factory, seed):
    """The quick loop: one kernel of each of the classes whose address map the fitter solves, clean:
    the table's region is `indexed` through the ids with the drawn row as its stride and chunk, at
    whatever layer offset, id width and padding were drawn. (The slow test scores whole kernels,
    where some still miss the bar; a persistent block table's map is recovered in most draws, not
    all, and is tallied there.)"""
    layouts = _layouts(QUICK, seed, 1)
    res = outcomes(layouts, 0.0, tmp_path_factory.mktemp("layouts"), seed)
    bad = _address_map_errors(layouts, res, seed)
    assert not bad, "; ".join(bad)


@pytest.mark.slow
@settings(max_examples=10, phases=[Phase.explicit, Phase.reuse, Phase.generate], **SETTINGS)
@given(seed=st.integers(0, 2**31 - 1), drop=st.sampled_from([0.0, 0.01, 0.05]))
def test_two_hundred_drawn_layouts(tmp_path_factory, seed, drop):
    """10 examples x 8 classes x 3 kernels: 240 drawn kernels a run, each scored at the unseen
    size and tallied by class as recovered, declined (`irregular`, `allocation`) or wrong (a
    template that misses the bar there), printed with -s (docs/template-model.md, "Layouts it did
    not choose", has a run's tally). Asserted: the address maps of the classes the fitter solves,
    clean (the quick test's check)."""
    if (seed, drop) in SEEN:   # hypothesis may draw an example twice: count each kernel once
        return
    SEEN.add((seed, drop))
    layouts = _layouts(LG.CLASSES, seed, 3)
    res = outcomes(layouts, drop, tmp_path_factory.mktemp("layouts"), seed)
    _tally(res, TALLY, drop > 0)
    print(f"seed={seed} drop={drop}", sorted(TALLY.items()), flush=True)
    if drop == 0:
        bad = _address_map_errors(layouts, res, seed)
        assert not bad, "; ".join(bad)
