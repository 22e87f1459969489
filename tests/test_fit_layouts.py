"""The fitter against layouts it did not choose (tests/layout_gen.py): kernels drawn at random
from the classes serving engines build (indices per token and per block, slot mappings divided
into blocks, several layers in one allocation, persistent block tables with stale entries,
indptr -> indices, tables of addresses; strides and diagonals of the arguments), fitted from two
traces (sizes 1 and 2, 0-5% of records lost) and scored at size 3, which the fit never saw.

Each kernel comes out one of:
- recovered: precision >= 99.9% and recall >= 99.75% at the unseen size;
- unresolved: the fit says it cannot (a region of class `unresolved`, predicted as its
  allocation; docs/template-model.md, "Recovered or said so");
- not pinned: the fit says its profile leaves the templates open (`Pinning.pinned` false, with
  the argument to vary or the halves that differ);
- wrong: anything else (a template that misses the bar at the unseen size, or a silent
  `irregular` or `allocation` fallback).

Asserted: no kernel is wrong (issue 52: recover it or say so), but in the classes `OPEN` lists,
whose wrong kernels are tallied and printed (docs/template-model.md, "Layouts it did not
choose", has a run's tally). The default run draws one kernel of each class but the open ones;
the slow test 240 of all classes. The draw's seed and loss are printed on failure.
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
        out[lay.name] = (outcome(d, km), d["precision"], d["recall"], cls,
                         {r.base: r for r in km.regions} if km is not None else {})
    return out


def outcome(d: dict, km) -> str:
    """recovered, unresolved, not pinned or wrong (module doc) for kernel `km`'s evaluation `d`."""
    if d["precision"] >= P_BAR and d["recall"] >= R_BAR:
        return "recovered"
    if km is not None and km.cls == "unresolved":
        return "unresolved"
    if km is not None and km.pinned is not None and not km.pinned.pinned:
        return "not pinned"
    return "wrong"


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


# classes whose drawn kernels are not yet all recovered or declared: their wrong kernels are
# tallied, not asserted (docs/template-model.md, "Layouts it did not choose", says what each misses)
OPEN: tuple = ()


def _wrong(layouts, res: dict, seed: int, drop: float) -> list:
    """The kernels outside OPEN neither recovered nor declared, each with its draw and its fit."""
    bad = []
    for lay in layouts:
        oc, p, r, cls, regions = res[lay.name]
        if oc == "wrong" and lay.cls not in OPEN:
            bad.append(f"seed={seed} drop={drop} {lay}: P={p:.4f} R={r:.4f} {cls}: "
                       + "; ".join(x.text() for x in regions.values()))
    return bad


TALLY: Counter = Counter()
SEEN: dict = {}


@settings(max_examples=1, **SETTINGS)
@given(seed=st.integers(0, 2**31 - 1))
def test_drawn_layouts_are_recovered_or_declared(tmp_path_factory, seed):
    """The quick loop: one kernel of each class outside OPEN, clean: each recovered at the unseen
    size, or declared unresolved or not pinned; and the tables' address maps solved (a gather's,
    layers in one allocation: `indexed` through the ids with the drawn row as stride and chunk)."""
    layouts = _layouts(tuple(c for c in LG.CLASSES if c not in OPEN), seed, 1)
    res = outcomes(layouts, 0.0, tmp_path_factory.mktemp("layouts"), seed)
    bad = _wrong(layouts, res, seed, 0.0) + _address_map_errors(layouts, res, seed)
    assert not bad, "; ".join(bad)


@pytest.mark.slow
@settings(max_examples=10, phases=[Phase.explicit, Phase.reuse, Phase.generate], **SETTINGS)
@given(seed=st.integers(0, 2**31 - 1), drop=st.sampled_from([0.0, 0.01, 0.05]))
def test_two_hundred_drawn_layouts(tmp_path_factory, seed, drop):
    """10 examples x 8 classes x 3 kernels: 240 drawn kernels a run, each scored at the unseen
    size and tallied by class as recovered, unresolved, not pinned or wrong, printed with -s.
    Asserted: no kernel outside OPEN is wrong, clean or lossy; the address maps of the quick
    test's classes, clean."""
    layouts = _layouts(LG.CLASSES, seed, 3)
    if (seed, drop) not in SEEN:   # hypothesis may draw (or replay) an example twice: fit and count it once
        SEEN[seed, drop] = outcomes(layouts, drop, tmp_path_factory.mktemp("layouts"), seed)
        _tally(SEEN[seed, drop], TALLY, drop > 0)
    res = SEEN[seed, drop]
    print(f"seed={seed} drop={drop}", sorted(TALLY.items()), flush=True)
    bad = _wrong(layouts, res, seed, drop)
    if drop == 0:
        bad += _address_map_errors(layouts, res, seed)
    assert not bad, "; ".join(bad)


def test_a_table_of_addresses_is_declared_and_predicted_as_the_allocations_it_names(tmp_path):
    """A kernel whose rows come from allocations no parameter points to, chosen through a buffer
    of 64-bit addresses: an `unresolved` region on that buffer's word (its 8-byte values, as many
    as a launch's row held), predicted as the allocations they point into (recall at the unseen
    size), written to the model file and read back the same."""
    from pagecast.predict.model_io import load_model, save_model

    lay = _layouts(("addr_table",), 5, 1)[0]
    res = outcomes([lay], 0.0, tmp_path, 5)
    oc, p, r, cls, regions = res[lay.name]
    reg = regions["p1"]
    assert oc == "unresolved" and cls == "unresolved" and reg.cls == "unresolved", (oc, cls, reg.text())
    assert reg.index == "p1" and reg.count.const == lay.layers, reg.text()
    paths = [LG.write_trace([lay], s, tmp_path / f"r{s}.pctrace", seed=5) for s in (1, 2, 3)]
    model = fit_model([T.read_trace(x) for x in paths[:2]])
    # the rows' allocations (pointed to by no parameter: the breakdown's `elsewhere`) all predicted
    name = next(iter(model.kernels))
    doc = evaluate(model, T.read_trace(paths[2]), "none", kernel=name)
    rows = [b for b in doc["buffers"]["rows"] if b["words"] == "elsewhere"]
    assert rows and rows[0]["recall"] == 1.0 and rows[0]["missed_bytes"] == 0, rows
    save_model(model, tmp_path / "m.json")
    back = load_model(tmp_path / "m.json")
    assert [x.text() for k in back.kernels.values() for x in k.regions] == \
        [x.text() for k in model.kernels.values() for x in k.regions]
    assert back.summary()["kernels_by_class"]["unresolved"] == 1
