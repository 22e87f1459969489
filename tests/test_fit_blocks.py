"""Slot mappings divided into block and offset, and strided chunks under a big page: the fitter
recovers both from the records (predict/fit/index_split.py, predict/fit/within_runs.py), and the
predictors evaluate a block split alike (batch and online, and read back from the model file).

Drawn with the layout generator (tests/layout_gen.py): a head-major paged cache written through a
-1-padded slot mapping (a slot's block is slot // block_size, its bytes in every head's part of
the block, at (slot mod block_size) rows into it) and a pitch-strided column slice whose pitch is
under a big page. The seed is printed on failure."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagecast import trace as T
from pagecast.predict import formula as FM
from pagecast.predict import indexed as IX
from pagecast.predict.evaluate import evaluate
from pagecast.predict.fit import fit_model
from pagecast.predict.model_io import BlockSplit, Region, load_model, save_model

import layout_gen as LG
from test_fit_indexed import assert_online_is_batch

SETTINGS = dict(deadline=None, derandomize=True, print_blob=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _fit(lay, tmp, seed: int, drop: float = 0.0):
    paths = [LG.write_trace([lay], s, tmp / f"s{s}.pctrace", drop=drop if s < 3 else 0.0, seed=seed)
             for s in (1, 2, 3)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traces = [T.read_trace(p) for p in paths]
        model = fit_model(traces[:2])
        doc = evaluate(model, traces[2], "none")
    (d,) = [k for k in doc["kernels"] if lay.name in k["kernel"]]
    return model, model.kernels[d["kernel"]], d, traces[2]


def _head_major(seed: int, heads: int, block: int, head_bytes: int):
    rng = np.random.default_rng(seed)
    return dataclasses.replace(LG.draw(rng, "slot_div", 0), heads=heads, block=block, row=heads * head_bytes,
                               count="grid", rows=int(rng.integers(1500, 4000)))


def _check_head_major(lay, tmp, seed: int, drop: float = 0.0) -> None:
    """The cache's region is the block's stride over floor(slot / block), split into `heads` parts of
    `block` slots of the head's bytes (the drawn layout's own numbers), and the kernel is recovered
    at the unseen size (the count an argument, so that no other region stands in the way); both
    predictors agree launch by launch."""
    model, km, d, test_tr = _fit(lay, tmp, seed, drop)
    hb = lay.row // lay.heads
    r = next(x for x in km.regions if x.base == "p1")
    assert r.cls == "indexed" and r.value_div == lay.block and r.stride.const == lay.heads * lay.block * hb, \
        (seed, drop, lay, r.text())
    assert r.block_split == BlockSplit(hb, lay.heads, lay.block * hb), (seed, drop, lay, r.text())
    assert d["precision"] >= 0.999 and d["recall"] >= 0.9975, (seed, drop, lay, d["precision"], d["recall"], r.text())
    assert_online_is_batch(model, test_tr)


def test_a_head_major_slot_write_is_split_into_its_heads_parts(tmp_path):
    """One drawn head-major cache whose blocks are wider than a big page (a slot touches a part of
    each of its block's big pages: no whole block verifies, and the block's stride is solved from
    where the launches begin): recovered exactly."""
    _check_head_major(_head_major(11, 2, 32, 1536), tmp_path, 11)


@pytest.mark.slow
@settings(max_examples=4, **SETTINGS)
@given(seed=st.integers(0, 2**31 - 1), heads=st.sampled_from([2, 4, 8]), block=st.sampled_from([16, 32]),
       head_bytes=st.sampled_from([512, 768, 1024, 1536]), drop=st.sampled_from([0.0, 0.01]))
def test_drawn_head_major_slot_writes_are_split_into_their_heads_parts(tmp_path_factory, seed, heads, block,
                                                                       head_bytes, drop):
    """Drawn head-major caches (a part two pages or more, so that a slot's bytes leave pages of its
    block out; blocks under a big page and over it), clean and with 1% of the records lost."""
    _check_head_major(_head_major(seed, heads, block, head_bytes), tmp_path_factory.mktemp("slots"), seed, drop)


def test_a_padded_mappings_split_counts_its_live_slots(tmp_path):
    """A mapping padded with -1 to the graph's batch verifies at its whole row as well as at its
    live slots: the split counts the live slots (the argument), so the key rows the kernel copies
    into the cache take its size, 768 bytes in each of 2 heads a slot (`1536*p3`), not a formula
    bent through one big page's bounds."""
    lay = _head_major(0, 2, 16, 768)
    _check_head_major(lay, tmp_path, 0)
    _, km, _, _ = _fit(lay, tmp_path, 0)
    r = next(x for x in km.regions if x.base == "p1")
    assert r.count == FM.Formula(0, ((1, ("p3",)),)), r.text()
    key = next(x for x in km.regions if x.base == "p0" and "union_of" not in x.fit)
    assert key.end == FM.Formula(0, ((1536, ("p3",)),)), key.text()


def test_a_block_split_is_written_read_back_and_checked(tmp_path):
    """The split goes to the model file and back unchanged; a split on values not divided, or with
    a part count out of range, is refused in one line (ValueError from the loader)."""
    lay = dataclasses.replace(LG.draw(np.random.default_rng(3), "slot_div", 0), heads=4, block=16, row=4 * 512,
                              count="grid", rows=2000)
    model, km, _, _ = _fit(lay, tmp_path, 3)
    r = next(x for x in km.regions if x.base == "p1")
    assert r.block_split is not None, r.text()
    save_model(model, tmp_path / "m.json")
    back = load_model(tmp_path / "m.json")
    assert [x.text() for x in back.kernels[km.name].regions] == [x.text() for x in km.regions]
    assert "512*(v64(p2)[i] mod 16) + 8192*h" in r.text() and "h < 4" in r.text(), r.text()
    import json
    doc = json.loads((tmp_path / "m.json").read_text())
    for bad in ({"slot_bytes": 0, "parts": 4, "part_stride": 8}, {"slot_bytes": 8, "parts": 1 << 20},
                {"slot_bytes": 8, "heads": 2}, [8, 2, 16]):
        rd = next(x for x in doc["kernels"][km.name]["regions"] if x["base"] == "p1")
        rd["block_split"] = bad
        (tmp_path / "bad.json").write_text(json.dumps(doc))
        with pytest.raises(Exception, match="block_split"):
            load_model(tmp_path / "bad.json")


@settings(max_examples=20, **SETTINGS)
@given(vals=st.lists(st.integers(-1, 4000), min_size=1, max_size=80), d=st.sampled_from([2, 8, 16, 32]),
       parts=st.integers(1, 8), slot=st.sampled_from([16, 160, 384, 4096]), start=st.integers(0, 9000))
def test_a_block_split_predicts_each_slot_in_each_part_by_both_paths(vals, d, parts, slot, start):
    """Batch and online pieces of a split region agree with the chunks written out one by one:
    value v's chunk h at start + stride*floor(v/d) + slot*(v mod d) + part*h, `slot` bytes."""
    part = d * slot
    stride = parts * part
    r = Region("p1", "indexed", start=FM.Formula(start, ()), stride=FM.Formula(stride, ()),
               chunk=FM.Formula(slot, ()), count=FM.Formula(len(vals), ()), index="p2", elem=8, value_div=d,
               block_split=BlockSplit(slot, parts, part))
    ps, base = 4096, 1 << 40
    a_s, a_e = base // ps, base // ps + (start + stride * (4000 // d + 2)) // ps + 1
    want = set()
    for v in vals:
        if v < 0:
            continue
        for h in range(parts):
            b = base + start + stride * (v // d) + slot * (v % d) + part * h
            want.update(range(b // ps, -(-(b + slot) // ps)))
    data = np.array(vals, "<i8").tobytes()
    out: list = []
    fns = [lambda a, f=f: int(f.evaluate(a)) for f in (r.start, r.stride, r.chunk, r.count)]
    IX.one_pieces(r, fns, {}, base, data, ps, a_s, a_e, out)
    online = {p for s, e in out for p in range(s, e)}

    class _Image:   # one launch's values row, as pagecast.values.ValueImage gives it
        _raw = np.frombuffer(data, np.uint8)
        start = np.array([0], np.int64)
        nbytes = np.array([len(data)], np.int64)

        def find(self, launch, ptr):
            return np.zeros(len(launch), np.int64)
    res = IX.batch_pieces(r, {}, np.array([base]), np.array([7]), np.array([0]), _Image(), ps,
                          np.array([a_s]), np.array([a_e]))
    batch = {p for s, e in zip(res["s"].tolist(), res["e"].tolist()) for p in range(s, e)}
    assert online == batch == want
    assert res["sentinel"] == sum(v < 0 for v in vals)


def _check_slice(lay, tmp, seed: int) -> None:
    model, km, d, _ = _fit(lay, tmp, seed)
    (r,) = km.regions
    assert r.cls == "strided" and r.stride.evaluate({}) == lay.row * lay.layers * 2, (seed, lay, r.text())
    assert d["precision"] >= 0.999 and d["recall"] >= 0.9975, (seed, lay, d["precision"], d["recall"], r.text())


def test_strided_chunks_under_a_big_page_are_read_from_where_their_faults_land(tmp_path):
    """A column slice: chunks of `row` bytes a pitch of several rows apart (under a big page: the
    records show one run a launch), from column c (an argument): fitted as the chunks, not their
    hull (which the faults modulo the pitch leave out), and recovered at the unseen size."""
    _check_slice(dataclasses.replace(LG.draw(np.random.default_rng(5), "strided", 0), row=2304, layers=4),
                 tmp_path, 5)


def test_columns_at_a_pitch_no_multiple_of_the_page_are_read_as_columns(tmp_path):
    """1536-byte columns every 6144 bytes: pages start at 3 positions modulo the pitch, columns 1
    and 2 touch all three (their faults bound no start), and the simplest starts within columns 0
    and 3's bounds (`512*c*c`, `1024*c + 1024`) put columns 1 and 2 elsewhere: the start is the
    column times its width, the likeliest of the starts tried."""
    lay = dataclasses.replace(LG.draw(np.random.default_rng(7), "strided", 0), row=1536, layers=2)
    _check_slice(lay, tmp_path, 7)
    _, km, _, _ = _fit(lay, tmp_path, 7)
    assert km.regions[0].start == FM.Formula(0, ((1536, ("p1",)),)), km.regions[0].text()


@pytest.mark.slow
@settings(max_examples=4, **SETTINGS)
@given(seed=st.integers(0, 2**31 - 1), row=st.sampled_from([1536, 2304, 3072, 6144]), spread=st.integers(2, 5))
def test_drawn_column_slices_under_a_big_page_are_read_as_chunks(tmp_path_factory, seed, row, spread):
    """Drawn column slices, the pitch `2*spread` rows (under a big page)."""
    _check_slice(dataclasses.replace(LG.draw(np.random.default_rng(seed), "strided", 0), row=row, layers=spread),
                 tmp_path_factory.mktemp("slice"), seed)


def test_rows_up_to_the_live_slots_of_a_padded_mapping(tmp_path):
    """The count an argument carries is the padded batch (the same at every launch), and the rows
    of keys a launch reads are as many as its slot mapping's entries that are not -1, which no
    argument and no single value holds: the key buffer's region counts them
    (`valid(v64(p2)[:p3])`, the values not negative among the first p3), both predictors alike,
    and the kernel is recovered at the unseen size."""
    lay = dataclasses.replace(_head_major(11, 2, 32, 1536), count="arg")
    model, km, d, test_tr = _fit(lay, tmp_path, 11)
    r = next(x for x in km.regions if x.base == "p0")
    assert r.count_valid and r.count_index == "p2" and "valid(v64(p2)[:p3])" in r.text(), r.text()
    assert d["precision"] >= 0.999 and d["recall"] >= 0.9975, (d["precision"], d["recall"], r.text())
    assert_online_is_batch(model, test_tr)
