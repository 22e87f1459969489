"""The `indexed` fit (predict/fit/index_values.py): random gathers whose chunks the index values choose
(rows of `dim` elements, a column offset into each row, int32 or int64 ids, a count that is an
argument), their faults emulated by the workload engine with up to 5% of records lost; fitted from
two traces, the template must predict a third, larger one (more rows, more ids per launch, wider
rows) exactly. Without recorded values the region stays irregular; feedback demotes an indexed
template whose values keep choosing other pages."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

import index_workload as IW
from pagecast import trace as T
from pagecast.datasets.engine import WRITE, Builder, Kernel, Range, Ranges
from pagecast.predict.evaluate import evaluate
from pagecast.predict.feedback import DEMOTE_AFTER, apply_feedback
from pagecast.predict.fit import fit_model
from pagecast.predict.model_io import Region, load_model, save_model

SETTINGS = dict(deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])



def assert_online_is_batch(model, tr):
    """The online predictor, fed each launch's arguments and recorded values, and each allocation
    as it is made and freed (a freed range is handed out again), predicts what the batch path
    predicts, launch by launch."""
    from pagecast import values as V
    from pagecast.predict.predictor import OnlinePredictor, predict_footprints
    im = V.image(tr)
    batch = predict_footprints(model, tr, "none")
    op = OnlinePredictor(model, "none")
    allocs = tr.allocations.to_pylist()
    for i, row in enumerate(tr.launches.to_pylist()):
        for a in allocs:
            if a[T.LAST_LAUNCH] is not None and a[T.LAST_LAUNCH] == i - 1:
                op.free_allocation(a[T.ADDRESS])
        for a in allocs:
            if (a[T.FIRST_LAUNCH] == i or (i == 0 and a[T.FIRST_LAUNCH] < 0)) and \
                    (a[T.LAST_LAUNCH] is None or a[T.LAST_LAUNCH] >= i):
                op.add_allocation(a[T.ADDRESS], a[T.BYTES], a[T.ALLOC_ID])
        gb = [row[c] for c in T.GRID_COLUMNS]
        args = (row[T.KERNEL], row[T.PARAM_DATA], row[T.PARAM_OFFSETS], row[T.PARAM_SIZES], tuple(gb[:3]),
                tuple(gb[3:]))

        def values(addr, nb, i=i):
            j = im.find([i], np.array([addr], np.uint64))[0]
            return None if j < 0 else im.data(j)[:nb]
        s, e = batch.of(i)
        assert op.predict(*args, values=values) == list(zip(s.tolist(), e.tolist())), i

def _kernel(id_type: str) -> Kernel:
    return Kernel("gather_cols", [("out", "float*"), ("table", "const float*"), ("ids", f"const {id_type}*"),
                                  ("n", "int"), ("dim", "int"), ("col", "int"), ("width", "int")],
                  {"out": "linear", "table": "indexed", "ids": "linear"})


def _gather(seed: int, rows: int, dims: list[int], counts: list[int], col_frac: float, width: int | None,
            elem: int, steps: int = 20) -> Builder:
    """`steps` gathers: launch j reads `width` floats (None: the whole row) at column `col` of rows
    ids[0:n] of a table of `rows` rows of `dim` floats (dim, n drawn per launch from `dims`,
    `counts`; col = (dim - width) * col_frac)."""
    b = Builder("gather-cols", seed=seed)
    rng = b.rng
    k = _kernel("int" if elem == 4 else "long")
    top = max(dims)
    table = b.malloc(4 * rows * top, "table")
    ids = b.malloc(8 * max(counts), "ids")
    out = b.malloc(4 * max(counts) * top, "out")
    for _ in range(steps):
        dim = int(rng.choice(dims))
        n = int(rng.choice(counts))
        wd = dim if width is None else width
        col = int((dim - wd) * col_frac)
        v = rng.choice(rows, n, replace=False).astype(np.int64)
        i0 = b.reserve(1)
        b.launch(k, [i0], {"out": out.ptr(), "table": table.ptr(), "ids": ids.ptr(), "n": n, "dim": dim,
                           "col": col, "width": wd},
                 grid=(n,), touches=[Range(ids, 0, elem * n), Range(out, 0, 4 * n * wd, WRITE),
                                     Ranges(table, np.zeros(n, np.int64), (v * dim + col) * 4, 4 * wd)])
        b.values(k, "ids", [i0], ids.ptr(), v.astype("<i4" if elem == 4 else "<i8")[None])
    return b


def _table_region(model):
    km = next(km for n, km in model.kernels.items() if "gather_cols" in n)
    return next(r for r in km.regions if r.base == "p1")


@pytest.mark.slow
@settings(max_examples=10, phases=[Phase.explicit, Phase.reuse, Phase.generate], **SETTINGS)
@given(elem=st.sampled_from([4, 8]),
       drop=st.sampled_from([0.0, 0.01, 0.05]),
       width_pages=st.sampled_from([0.25, 1, 3, 17]),
       seed=st.integers(0, 10_000))
def test_fitted_indexed_templates_predict_a_larger_unseen_run_exactly(tmp_path_factory, elem, drop, width_pages,
                                                                      seed):
    """Whole rows (embedding rows, experts, KV blocks: chunk = stride), rows a quarter page to 17
    pages wide, two widths per run and a third in the unseen one. Not covered (and not found by
    the fit today): a column range at an offset inside wider rows."""
    d = tmp_path_factory.mktemp("fitix")
    w = int(width_pages * 1024)                  # floats
    dims, dims_test, width, col_frac = [w, 2 * w], [w, 3 * w], None, 0.0
    # two fitting runs with few ids and rows (tables of tens of big pages at least: a table of a
    # few big pages leaves the faults of any gather the same), an unseen one with more of each
    train = [_gather(seed, 512, dims, [2, 3, 5], col_frac, width, elem),
             _gather(seed + 1, 768, dims, [1, 4, 6], col_frac, width, elem)]
    test = _gather(seed + 2, 3000, dims_test, [3, 9, 14], col_frac, width, elem)
    paths = [b.write(d / f"t{i}.pctrace", drop=drop) for i, b in enumerate(train)]
    tpath = test.write(d / "test.pctrace")
    model = fit_model([T.read_trace(p) for p in paths])
    r = _table_region(model)
    assert r.cls == "indexed", r.text()
    assert (r.index, r.elem) == ("p2", elem)
    assert r.count.text() == "p3"
    ev = evaluate(model, T.read_trace(tpath), "none")
    k = next(x for x in ev["kernels"] if "gather_cols" in x["kernel"])
    assert k["precision"] == 1.0 and k["recall"] == 1.0, (r.text(), k)
    # written readably, and read back the same
    save_model(model, d / "m.json")
    text = json.loads((d / "m.json").read_text())["kernels"]
    txt = [rd["text"] for km in text.values() for rd in km["regions"] if rd["class"] == "indexed"]
    assert txt == [r.text()] and f"v{'' if elem == 4 else '64'}(p2)[i]" in txt[0] and "for i < p3" in txt[0]
    assert _table_region(load_model(d / "m.json")).text() == r.text()


@pytest.fixture(scope="module")
def gather(tmp_path_factory):
    d = tmp_path_factory.mktemp("gather_fit")
    return d, [IW.build(seed=s).write(d / f"g{s}.pctrace") for s in (1, 2, 3)]


def test_the_hand_made_gather_fits_its_written_form(gather):
    """tests/index_workload.py's table: `[p1 + 4*p4*v(p2)[i], +4*p4) for i < p3` (or the same with
    the constant arguments folded in), fitted from faults alone."""
    d, paths = gather
    model = fit_model([T.read_trace(p) for p in paths[:2]])
    km = next(km for n, km in model.kernels.items() if "gather_rows" in n)
    r = next(x for x in km.regions if x.base == "p1")
    assert r.cls == "indexed" and r.index == "p2", r.text()
    ev = evaluate(model, T.read_trace(paths[2]), "none")
    k = next(x for x in ev["kernels"] if "gather_rows" in x["kernel"])
    assert k["precision"] == 1.0 and k["recall"] == 1.0


def test_without_values_the_region_is_irregular(tmp_path):
    paths = [IW.build(seed=s, record=False).write(tmp_path / f"g{s}.pctrace") for s in (1, 2)]
    model = fit_model([T.read_trace(p) for p in paths])
    km = next(km for n, km in model.kernels.items() if "gather_rows" in n)
    assert next(x for x in km.regions if x.base == "p1").cls == "irregular"


def test_feedback_demotes_an_indexed_template_that_keeps_missing(gather):
    """Misses of an indexed region cannot be widened into a formula: counted, and after
    DEMOTE_AFTER of them the region is irregular, its misses its history."""
    d, paths = gather
    model = fit_model([T.read_trace(p) for p in paths[:2]])
    tr = T.read_trace(paths[2])
    km_name = next(n for n in model.kernels if "gather_rows" in n)
    r = next(x for x in model.kernels[km_name].regions if x.base == "p1")
    assert r.cls == "indexed"
    lids = np.flatnonzero(np.array(tr.launches.column(T.KERNEL).to_pylist()) == km_name)
    table = max(tr.allocations.to_pylist(), key=lambda a: a["bytes"])   # the table: 32 MiB, the largest
    p0 = int(table["address"]) // tr.page_size
    changed = [apply_feedback(model, tr, int(lid), [p0 + 100 + i], [p0 + 101 + i])
               for i, lid in enumerate(lids[:DEMOTE_AFTER])]
    assert changed == [False] * (DEMOTE_AFTER - 1) + [True]
    assert r.cls == "irregular" and r.index is None and r.fit["demoted_by_feedback"]
    assert r.history


def test_values_that_point_outside_are_counted_not_an_error(gather, tmp_path, capsys):
    """A run whose recorded ids name rows far past the table (and launches with none recorded):
    evaluate names them in one line each, exit 0, and the JSON counts them."""
    from pagecast.cli import main
    d, paths = gather
    model = fit_model([T.read_trace(p) for p in paths[:2]])
    save_model(model, tmp_path / "m.json")
    b = IW.build(seed=5, record=False)
    K = IW.K_GATHER
    gl = [int(x) for blk in b.blocks if blk.kernel is K for x in np.atleast_1d(blk.ids)]
    ptr = next(a for a in b.buffers if a.label == "ids").ptr()
    # the first 4 gathers with no values, the rest reading rows 10^6: past the table's 4096
    b.values(K, "ids", gl[4:], ptr, np.full((len(gl) - 4, 3), 10**6, "<i4"))
    bad = b.write(tmp_path / "bad.pctrace")
    assert main(["evaluate", str(tmp_path / "m.json"), str(bad), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    v = doc["indexed"]["values"]
    assert v["outside_values"] == 3 * (len(gl) - 4) and v["no_values"] == 4
    assert main(["evaluate", str(tmp_path / "m.json"), str(bad)]) == 0
    out = capsys.readouterr().out
    assert "values outside the allocation" in out and "without values" in out


def test_negative_values_are_sentinels_that_select_nothing(gather, tmp_path, capsys):
    """-1 entries (a padded slot mapping, a filtered expert) select no chunk, in the batch
    predictor and the online one alike; evaluate counts them in one line, exit 0."""
    from pagecast import values as V
    from pagecast.cli import main
    from pagecast.predict import indexed as IX
    d, paths = gather
    model = fit_model([T.read_trace(p) for p in paths[:2]])
    save_model(model, tmp_path / "m.json")
    b = IW.build(seed=5, record=False)
    K = IW.K_GATHER
    blocks = [blk for blk in b.blocks if blk.kernel is K]
    gl = [int(x) for blk in blocks for x in np.atleast_1d(blk.ids)]
    ptr = next(a for a in b.buffers if a.label == "ids").ptr()
    rows = np.array([[7, -1, 9]] * len(gl), "<i4")
    b.values(K, "ids", gl, ptr, rows)
    tr = T.read_trace(b.write(tmp_path / "neg.pctrace"))
    assert main(["evaluate", str(tmp_path / "m.json"), str(tmp_path / "neg.pctrace"), "--json"]) == 0
    v = json.loads(capsys.readouterr().out)["indexed"]["values"]
    assert v["sentinel_values"] == len(gl) and v["outside_values"] == 0      # 3 values a gather, one -1
    assert main(["evaluate", str(tmp_path / "m.json"), str(tmp_path / "neg.pctrace")]) == 0
    assert "negative values (select nothing)" in capsys.readouterr().out
    # one launch, by both paths: the chunks of 7 and 9 only
    from pagecast.predict import formula as FM
    r = Region("p1", "indexed", start=FM.Formula(0, ()), stride=FM.Formula(256, ()), chunk=FM.Formula(256, ()),
               count=FM.Formula(3, ()), index="p2", elem=4)
    im, ps, base = V.image(tr), 4096, 1 << 40
    a_s, a_e = base // ps, base // ps + 64
    res = IX.batch_pieces(r, {}, np.array([base]), np.array([ptr]), np.array([gl[0]]), im, ps,
                          np.array([a_s]), np.array([a_e]))
    out: list = []
    fns = [lambda a, f=f: int(f.evaluate(a)) for f in (r.start, r.stride, r.chunk, r.count)]
    IX.one_pieces(r, fns, {}, base, rows[0].tobytes(), ps, a_s, a_e, out)
    assert sorted(zip(res["s"].tolist(), res["e"].tolist())) == sorted(set(out)) == [(a_s, a_s + 1)]


@pytest.mark.slow
def test_an_odd_formula_bent_through_lost_records_gives_way_to_the_indexed_template(tmp_path):
    """llm-paged-decode's attention reads the K and V blocks its block table names. With 1% of the
    fitting traces' records lost, the V cache's pages once fitted a range whose end was
    `-1912304 - 17*p10*p10*p13 + 129*p10*p11*p11`: coefficients no element size times dimensions
    gives (FitParams.simple_odd). Such a formula now asks the indexed fit first (predict/fit/region.py),
    and both caches come out indexed, as from clean records."""
    from pagecast.datasets.registry import make_trace
    fit = [T.read_trace(make_trace("llm-paged-decode", tmp_path / f"f{s}.pctrace", scale=0.2, seed=s, drop=0.01))
           for s in (1, 2)]
    model = fit_model(fit)
    km = next(km for n, km in model.kernels.items() if "paged_attention" in n)
    assert [r.cls for r in km.regions if r.base in ("p2", "p3")] == ["indexed", "indexed"]


def _runs(seed: int, row_floats: int, table_bytes: int, top: tuple[float, float], steps: int = 24,
          elem: int = 4) -> Builder:
    """`steps` gathers of rows of `row_floats` floats from a table of `table_bytes` (a few big
    pages), as a rotary cos/sin cache is read at a batch's positions: a prompt's first rows from
    0, a few sequences' positions below the longest, and the longest one's, drawn in `top` (a
    share of the rows: in a short profile, a narrow band)."""
    b = Builder("gather-runs", seed=seed)
    rng = b.rng
    k = _kernel("int" if elem == 4 else "long")
    rows = table_bytes // (4 * row_floats)
    table = b.malloc(table_bytes, "table")
    ids = b.malloc(4096, "ids")
    out = b.malloc(4 * 64 * row_floats, "out")
    for _ in range(steps):
        longest = int(rng.integers(int(top[0] * rows), int(top[1] * rows)))
        v = np.unique(np.concatenate([np.arange(int(rng.integers(1, 8))), rng.integers(0, longest, 6), [longest]]))
        n = len(v)
        i0 = b.reserve(1)
        b.launch(k, [i0], {"out": out.ptr(), "table": table.ptr(), "ids": ids.ptr(), "n": n, "dim": row_floats,
                           "col": 0, "width": row_floats},
                 grid=(n,), touches=[Range(ids, 0, elem * n), Range(out, 0, 4 * n * row_floats, WRITE),
                                     Ranges(table, np.zeros(n, np.int64), v * 4 * row_floats, 4 * row_floats)])
        b.values(k, "ids", [i0], ids.ptr(), v.astype("<i4" if elem == 4 else "<i8")[None])
    return b


@pytest.mark.slow
@settings(max_examples=8, phases=[Phase.explicit, Phase.reuse, Phase.generate], **SETTINGS)
@given(row_floats=st.sampled_from([16, 64, 256]), drop=st.sampled_from([0.0, 0.01]), seed=st.integers(0, 10_000))
def test_rows_under_a_page_in_a_table_of_a_few_big_pages(tmp_path_factory, row_floats, drop, seed):
    """A rotary cos/sin cache read at a batch's positions: rows of 64 B to 1 KiB in a table of 8
    big pages, the smallest value near 0 at every launch, the largest in a narrow band in the
    fitting runs: the region is whole rows one row apart (the kernel's other regions are under a
    big page at every launch, not this test's subject)."""
    d = tmp_path_factory.mktemp("fitruns")
    table = 8 << 16
    train = [_runs(seed, row_floats, table, (0.30, 0.40)), _runs(seed + 1, row_floats, table, (0.35, 0.45))]
    paths = [b.write(d / f"t{i}.pctrace", drop=drop) for i, b in enumerate(train)]
    tpath = _runs(seed + 2, row_floats, table, (0.2, 1.0)).write(d / "test.pctrace")
    model = fit_model([T.read_trace(p) for p in paths])
    r = _table_region(model)
    assert r.cls == "indexed", r.text()
    args = {f"p{i}": np.array([x]) for i, x in enumerate([0, 0, 0, 13, row_floats, 0, row_floats])}
    # whole rows, one row apart (the other regions are under a big page: not this test's subject)
    assert int(np.ravel(r.stride.evaluate(args))[0]) == int(np.ravel(r.chunk.evaluate(args))[0]) == 4 * row_floats, \
        r.text()
    # the unseen run reads rows up to the table's end: predicted from that region, every one
    ev = evaluate(model, T.read_trace(tpath), "none")
    k = next(x for x in ev["kernels"] if "gather_cols" in x["kernel"])
    assert k["launches"] == 24


@pytest.mark.slow
def test_the_rotary_rows_of_the_paged_decoder_are_whole_rows_one_row_apart(tmp_path):
    """llm-paged-decode's rotary cos/sin cache (8 big pages, a row of 256 B per position): fitted
    on scales 0.5 and 1.0, scored at 0.75 (docs/accuracy.md's main split). The free solve took
    stride 1 and a 184 KiB chunk, which verification accepts (72% precision); the solve for whole
    chunks (the last row ends one stride past the largest value) pins the row."""
    from pagecast.datasets.registry import make_trace
    fit = [T.read_trace(make_trace("llm-paged-decode", tmp_path / f"f{s}.pctrace", scale=sc, seed=s))
           for sc, s in ((0.5, 1), (1.0, 2))]
    model = fit_model(fit)
    ev = evaluate(model, T.read_trace(make_trace("llm-paged-decode", tmp_path / "t.pctrace", scale=0.75, seed=3)))
    k = next(x for x in ev["kernels"] if "rotary_embedding_pos" in x["kernel"])
    assert k["templates"][-1] == "indexed" and k["precision"] >= 0.99 and k["recall"] >= 0.9975, k


K_PAGED = Kernel("paged_rows", [("out", "float*"), ("table", "const float*"), ("indptr", "const int*"),
                                ("indices", "const int*"), ("dim", "int")],
                 {"out": "linear", "table": "indexed", "indptr": "linear", "indices": "linear"})


def _paged(seed: int, batch_hi: int, record_indptr: bool = True) -> Builder:
    """An index chain as serving engines launch it: one program per request (grid = batch), the
    requests' index ranges from an indptr, the table's rows from the indices in those ranges;
    indptr and indices are persistent buffers passed whole, holding stale ids past the batch's."""
    rows, dim = 2048, 1024
    b = Builder("paged-chain", seed=seed)
    rng = b.rng
    table = b.malloc(4 * rows * dim, "table")
    indptr = b.malloc(4 * 65, "indptr")
    indices = b.malloc(4 * 4096, "indices")
    out = b.malloc(4 * 64 * dim, "out")
    stale = rng.choice(rows, 4096).astype("<i4")
    for _ in range(20):
        batch = int(rng.integers(1, batch_hi + 1))
        lens = rng.integers(1, 6, batch)
        ip = np.r_[0, np.cumsum(lens)].astype("<i4")
        n = int(ip[-1])
        v = rng.choice(rows, n, replace=False).astype("<i4")
        stale[:n] = v
        ipbuf = np.r_[ip, np.full(65 - len(ip), 10**6)].astype("<i4")   # stale past the batch
        i0 = b.reserve(1)
        b.launch(K_PAGED, [i0], {"out": out.ptr(), "table": table.ptr(), "indptr": indptr.ptr(),
                                 "indices": indices.ptr(), "dim": dim}, grid=(batch,),
                 touches=[Range(indptr, 0, 4 * (batch + 1)), Range(indices, 0, 4 * n),
                          Range(out, 0, 4 * batch * dim, WRITE),
                          Ranges(table, np.zeros(n, np.int64), v.astype(np.int64) * 4 * dim, 4 * dim)])
        if record_indptr:
            b.values(K_PAGED, "indptr", [i0], indptr.ptr(), ipbuf[None])
        b.values(K_PAGED, "indices", [i0], indices.ptr(), stale.copy()[None])
    return b


@pytest.fixture(scope="module")
def paged_chain(tmp_path_factory):
    """Three index-chain traces, batches up to 8, 12 and 24 requests, and the model fitted on the
    first two (made once for this module's tests, which only read them)."""
    d = tmp_path_factory.mktemp("paged_chain")
    paths = [_paged(s, hi).write(d / f"p{s}.pctrace") for s, hi in ((1, 8), (2, 12), (3, 24))]
    return paths, fit_model([T.read_trace(p) for p in paths[:2]])


def test_an_index_chain_counts_from_the_indptr_entry_at_the_batch_size(paged_chain, tmp_path, capsys):
    """indptr -> indices -> rows, from persistent buffers: the count of indices read is the
    indptr's entry at grid_x (not an argument, not the row's length), fitted from faults; a
    larger batch is predicted exactly; without the indptr's values the launch gets the fallback,
    counted in one line."""
    from pagecast.cli import main
    paths, model = paged_chain
    km = next(km for n, km in model.kernels.items() if "paged_rows" in n)
    r = next(x for x in km.regions if x.base == "p1")
    assert r.cls == "indexed" and r.index == "p3" and r.count_index == "p2", r.text()
    assert "v(p2)[grid_x]" in r.text()
    save_model(model, tmp_path / "m.json")
    assert load_model(tmp_path / "m.json").kernels[km.name].regions[[x.base for x in km.regions].index("p1")].text() \
        == r.text()
    ev = evaluate(model, T.read_trace(paths[2]), "none")
    k = next(x for x in ev["kernels"] if "paged_rows" in x["kernel"])
    assert k["precision"] == 1.0 and k["recall"] == 1.0
    _paged(4, 8, record_indptr=False).write(tmp_path / "nv.pctrace")
    assert main(["evaluate", str(tmp_path / "m.json"), str(tmp_path / "nv.pctrace")]) == 0
    assert "without values (fallback)" in capsys.readouterr().out


def test_the_online_predictor_reads_the_chain_count_as_the_batch_one(paged_chain):
    from pagecast import values as V
    from pagecast.predict.predictor import OnlinePredictor, predict_footprints
    paths, model = paged_chain
    tr = T.read_trace(paths[2])
    im = V.image(tr)
    batch = predict_footprints(model, tr, "none")
    op = OnlinePredictor(model, "none")
    for r in tr.allocations.to_pylist():
        op.add_allocation(r[T.ADDRESS], r[T.BYTES], r[T.ALLOC_ID])
    grid_cols = T.GRID_COLUMNS
    for i, r in enumerate(tr.launches.to_pylist()):
        gb = [r[c] for c in grid_cols]
        args = (r[T.KERNEL], r[T.PARAM_DATA], r[T.PARAM_OFFSETS], r[T.PARAM_SIZES], tuple(gb[:3]), tuple(gb[3:]))
        reads = op.value_reads(*args)
        assert len(reads) == 1 and reads[0][1] == 4 * (gb[0] + 1)     # indptr[0 : grid_x + 1]

        def values(addr, nb, i=i):
            row = im.find([i], np.array([addr], np.uint64))[0]
            return None if row < 0 else im.data(row)[:nb]
        s, e = batch.of(i)
        assert op.predict(*args, values=values) == list(zip(s.tolist(), e.tolist())), i


K_BLOCKS = Kernel("expert_blocks", [("out", "float*"), ("weights", "const float*"), ("block_expert", "const int*"),
                                    ("padded", "const int*"), ("dim", "int"), ("tokens", "int")],
                  {"out": "linear", "weights": "indexed", "block_expert": "linear", "padded": "linear"})
BLOCK = 16


def _blocks(seed: int, tokens_hi: int, record_padded: bool = True) -> Builder:
    """Experts chosen per block of BLOCK sorted tokens, as a fused MoE runs them: a fixed grid
    (the largest block count); a block past the padded token count returns, so a launch reads
    ceil(padded / BLOCK) expert ids, one per block, from a persistent buffer whose later entries
    are stale ids from earlier launches. The padded count (every expert's tokens rounded up to
    BLOCK) is a value in another buffer, never an argument."""
    experts, dim, max_blocks = 32, 2048, 64
    b = Builder("expert-blocks", seed=seed)
    rng = b.rng
    weights = b.malloc(4 * experts * dim, "weights")
    block_expert = b.malloc(4 * max_blocks, "block_expert")
    padded = b.malloc(4, "padded")
    out = b.malloc(4 * 256 * dim, "out")
    stale = rng.integers(0, experts, max_blocks).astype("<i4")
    for _ in range(20):
        ids = rng.integers(0, experts, int(rng.integers(1, tokens_hi + 1)))
        used, counts = np.unique(ids, return_counts=True)
        nblk = -(-counts // BLOCK)
        blocks = np.repeat(used, nblk).astype("<i4")
        stale[:len(blocks)] = blocks
        pv = np.array([int(nblk.sum()) * BLOCK], "<i4")
        i0 = b.reserve(1)
        b.launch(K_BLOCKS, [i0], {"out": out.ptr(), "weights": weights.ptr(), "block_expert": block_expert.ptr(),
                                  "padded": padded.ptr(), "dim": dim, "tokens": len(ids)}, grid=(max_blocks,),
                 touches=[Range(padded, 0, 4), Range(block_expert, 0, 4 * len(blocks)),
                          Range(out, 0, 4 * len(ids) * dim, WRITE),
                          Ranges(weights, np.zeros(len(used), np.int64), used.astype(np.int64) * 4 * dim, 4 * dim)])
        if record_padded:
            b.values(K_BLOCKS, "padded", [i0], padded.ptr(), pv[None])
        b.values(K_BLOCKS, "block_expert", [i0], block_expert.ptr(), stale.copy()[None])
    return b


def test_a_count_of_blocks_is_a_buffer_value_over_the_block_size(tmp_path, capsys):
    """The expert ids read are one per block of a padded token count held in another buffer:
    the count `ceil(v(p3)[0] / 16)` is fitted from faults (not 1, not the whole stale row),
    written readably and kept through the model file; a run with more tokens is predicted exactly
    by the batch and the online predictor alike; without the count's values the launch gets the
    fallback, counted in one line; a model file with a bad divisor is refused in one line."""
    from pagecast.cli import main
    paths = [_blocks(s, hi).write(tmp_path / f"b{s}.pctrace") for s, hi in ((1, 40), (2, 80), (3, 160))]
    model = fit_model([T.read_trace(p) for p in paths[:2]])
    km = next(km for n, km in model.kernels.items() if "expert_blocks" in n)
    r = next(x for x in km.regions if x.base == "p1")
    assert r.cls == "indexed" and r.index == "p2" and r.count_index == "p3" and r.count_div == BLOCK, r.text()
    assert r.text().endswith("for i < ceil(v(p3)[0] / 16)"), r.text()
    save_model(model, tmp_path / "m.json")
    again = load_model(tmp_path / "m.json").kernels[km.name].regions[[x.base for x in km.regions].index("p1")]
    assert again.count_div == BLOCK and again.text() == r.text()
    tr = T.read_trace(paths[2])
    ev = evaluate(model, tr, "none")
    k = next(x for x in ev["kernels"] if "expert_blocks" in x["kernel"])
    assert k["precision"] == 1.0 and k["recall"] == 1.0, k
    assert_online_is_batch(model, tr)
    _blocks(4, 40, record_padded=False).write(tmp_path / "nv.pctrace")
    assert main(["evaluate", str(tmp_path / "m.json"), str(tmp_path / "nv.pctrace")]) == 0
    assert "without values (fallback)" in capsys.readouterr().out
    d = json.loads((tmp_path / "m.json").read_text())
    reg = next(x for x in d["kernels"][km.name]["regions"] if x["base"] == "p1")
    assert reg["count_div"] == BLOCK
    reg["count_div"] = 0
    (tmp_path / "bad.json").write_text(json.dumps(d))
    assert main(["evaluate", str(tmp_path / "bad.json"), str(paths[2])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "count_div" in err[0], err


K_TABLE = Kernel("paged_table", [("out", "float*"), ("kv", "const float*"), ("table", "const int*"),
                                 ("seq_lens", "const int*"), ("num_seqs", "int"), ("table_stride", "int")],
                 {"out": "linear", "kv": "indexed", "table": "linear", "seq_lens": "linear"})
KV_TOKENS, KV_BLOCK = 16, 16384   # tokens per KV block, bytes per block


def _table(seed: int, max_seqs: int, len_hi: int, steps: int = 30, record_lens: bool = True,
           pool: int = 512, stride: int = 32, bad: bool = False, partial: bool = False) -> Builder:
    """A paged KV cache read through a block table, as a paged attention kernel reads it: row r of
    the table (`stride` entries, persistent) holds the blocks of the batch's r-th sequence, read up
    to ceil(seq_lens[r] / 16) entries; entries past it are stale ids of the row's earlier
    sequences. Sequences arrive, grow by a token per step, finish and hand their blocks back; the
    batch is kept dense, so a finished sequence's rows move up. `num_seqs` rows are read; the
    sequence lengths are a persistent buffer too (entries past the batch stale). `bad`: the
    values recorded say row 0 runs past its row (a length of 10^6 tokens), and the entry past
    row 1's blocks names a block far outside the cache, and is read (row 1 one token longer
    than its blocks): values a damaged or foreign profile may hold. `partial`: a sequence's last
    block is read up to its length (1 KiB a token, token-major), not whole."""
    b = Builder("paged-table", seed=seed)
    rng = b.rng
    kv = b.malloc(KV_BLOCK * pool, "kv")
    table = b.malloc(4 * 32 * stride, "table")
    lens = b.malloc(4 * 32, "seq_lens")
    out = b.malloc(65536 * 32, "out")   # a big page per sequence: the faults pin its size
    tab = rng.integers(0, pool, (32, stride)).astype("<i4")
    lens_v = np.zeros(32, "<i4")
    free = [int(x) for x in rng.permutation(pool)]
    running: list[list] = []   # [tokens, outputs left, blocks]
    for _ in range(steps):
        while len(running) < max_seqs and (not running or rng.random() < 0.4):
            running.append([int(rng.integers(1, len_hi)), int(rng.integers(1, 12)), []])
        for q in running:
            q[0] += 1
            while len(q[2]) < -(-q[0] // KV_TOKENS):
                q[2].append(free.pop())
        for i, q in enumerate(running):
            tab[i, :len(q[2])] = q[2]
            lens_v[i] = q[0]
        n = len(running)
        blocks = np.concatenate([q[2] for q in running]).astype(np.int64)
        nbytes = np.full(len(blocks), KV_BLOCK, np.int64)
        if partial:
            ends = np.cumsum([len(q[2]) for q in running]) - 1
            nbytes[ends] = [(q[0] - KV_TOKENS * (len(q[2]) - 1)) * (KV_BLOCK // KV_TOKENS) for q in running]
        i0 = b.reserve(1)
        b.launch(K_TABLE, [i0], {"out": out.ptr(), "kv": kv.ptr(), "table": table.ptr(), "seq_lens": lens.ptr(),
                                 "num_seqs": n, "table_stride": stride}, grid=(n, 2),
                 touches=[Range(lens, 0, 4 * n), Range(out, 0, 65536 * n, WRITE),
                          Ranges(table, np.zeros(n, np.int64), [4 * i * stride for i in range(n)],
                                 [4 * len(q[2]) for q in running]),
                          Ranges(kv, np.zeros(len(blocks), np.int64), blocks * KV_BLOCK, nbytes)])
        tv, lv = tab.copy(), lens_v.copy()
        if bad and n > 1:
            lv[0] = 10 ** 6
            tv[1, len(running[1][2])] = 1 << 24
            lv[1] = len(running[1][2]) * KV_TOKENS + 1
        b.values(K_TABLE, "table", [i0], table.ptr(), tv.reshape(-1)[None])
        if record_lens:
            b.values(K_TABLE, "seq_lens", [i0], lens.ptr(), lv[None])
        for q in running:
            q[1] -= 1
        for q in [q for q in running if q[1] <= 0]:
            free.extend(q[2])
        running = [q for q in running if q[1] > 0]
    return b


def test_a_block_table_is_read_row_by_row_up_to_each_sequences_length(tmp_path, capsys):
    """A two-dimensional block table with per-row counts from another buffer: fitted from faults
    as `num_seqs` rows of `table_stride` entries, row r read to ceil(seq_lens[r] / 16), no
    argument or single value counting the concatenated form; written readably and kept through
    the model file; a run with twice the sequences, longer ones and a wider table is predicted
    exactly by the batch and the online predictor alike; without the lengths' values the launch
    gets the fallback; a model file whose row stride names no parameter is refused in one line."""
    from pagecast.cli import main
    paths = [_table(1, 6, 40).write(tmp_path / "t1.pctrace"), _table(2, 8, 80).write(tmp_path / "t2.pctrace"),
             _table(3, 16, 200, stride=64).write(tmp_path / "t3.pctrace")]
    model = fit_model([T.read_trace(p) for p in paths[:2]])
    km = next(km for n, km in model.kernels.items() if "paged_table" in n)
    r = next(x for x in km.regions if x.base == "p1")
    assert r.text() == f"[p1 + {KV_BLOCK}*v(p2)[r*p5 + j], +{KV_BLOCK}) for r < p4, j < ceil(v(p3)[r] / 16)", \
        r.text()
    save_model(model, tmp_path / "m.json")
    again = load_model(tmp_path / "m.json").kernels[km.name].regions[[x.base for x in km.regions].index("p1")]
    assert again.text() == r.text() and again.row_stride == r.row_stride
    tr = T.read_trace(paths[2])
    ev = evaluate(model, tr, "none")
    k = next(x for x in ev["kernels"] if "paged_table" in x["kernel"])
    assert k["precision"] == 1.0 and k["recall"] == 1.0, k
    assert_online_is_batch(model, tr)
    _table(4, 8, 60, record_lens=False).write(tmp_path / "nv.pctrace")
    assert main(["evaluate", str(tmp_path / "m.json"), str(tmp_path / "nv.pctrace")]) == 0
    assert "without values (fallback)" in capsys.readouterr().out
    bad = T.read_trace(_table(5, 8, 60, bad=True).write(tmp_path / "bad.pctrace"))
    assert_online_is_batch(model, bad)
    assert main(["evaluate", str(tmp_path / "m.json"), str(tmp_path / "bad.pctrace")]) == 0
    out = capsys.readouterr().out
    assert "values past their row" in out and "values outside the allocation" in out, out
    d = json.loads((tmp_path / "m.json").read_text())
    reg = next(x for x in d["kernels"][km.name]["regions"] if x["base"] == "p1")
    reg["row_stride"] = {"const": 0, "terms": [[1, ["p9"]]]}
    (tmp_path / "bad.json").write_text(json.dumps(d))
    assert main(["evaluate", str(tmp_path / "bad.json"), str(paths[2])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "row_stride" in err[0], err


def test_a_sequences_last_block_is_read_up_to_its_length(tmp_path):
    """A paged cache whose last block per sequence is read only up to the sequence's length (a
    token-major block): the table template reads that block in part, in proportion to the
    length's remainder over the block size, written readably and kept through the model file;
    a larger run is predicted exactly, batch == online. Whole blocks stay whole (the test above)."""
    paths = [_table(s, m, h, partial=True).write(tmp_path / f"p{s}.pctrace") for s, m, h in ((1, 6, 40), (2, 8, 80))]
    model = fit_model([T.read_trace(p) for p in paths])
    km = next(km for n, km in model.kernels.items() if "paged_table" in n)
    r = next(x for x in km.regions if x.base == "p1")
    assert r.part_last and r.text().endswith("the last in part: v(p3)[r] - 16*j of 16"), r.text()
    save_model(model, tmp_path / "m.json")
    again = load_model(tmp_path / "m.json").kernels[km.name].regions[[x.base for x in km.regions].index("p1")]
    assert again.part_last and again.text() == r.text()
    tr = T.read_trace(_table(3, 16, 200, stride=64, partial=True).write(tmp_path / "p3.pctrace"))
    ev = evaluate(model, tr, "none")
    k = next(x for x in ev["kernels"] if "paged_table" in x["kernel"])
    assert k["precision"] == 1.0 and k["recall"] == 1.0, k
    assert_online_is_batch(model, tr)


@pytest.mark.slow
@settings(max_examples=2, phases=[Phase.explicit, Phase.reuse, Phase.generate], **SETTINGS)
@given(drop=st.sampled_from([0.0, 0.01]), seed=st.integers(0, 10_000), stride=st.sampled_from([16, 32]))
@example(drop=0.01, seed=169, stride=16)
def test_one_profile_of_a_block_table_predicts_a_larger_run(tmp_path_factory, drop, seed, stride):
    """One profile of a block-table kernel, 1% of its records lost or none: the table template
    predicts a run with more and longer sequences, and a wider table, exactly."""
    d = tmp_path_factory.mktemp("table")
    fit = _table(seed, 6, 12 * stride // 4, stride=stride).write(d / "fit.pctrace", drop=drop)
    test = _table(seed + 1, 12, 24 * stride // 4, stride=2 * stride).write(d / "test.pctrace")
    model = fit_model([T.read_trace(fit)])
    km = next(km for n, km in model.kernels.items() if "paged_table" in n)
    r = next(x for x in km.regions if x.base == "p1")
    assert r.row_stride is not None and r.count_div == KV_TOKENS, r.text()
    ev = evaluate(model, T.read_trace(test), "none")
    k = next(x for x in ev["kernels"] if "paged_table" in x["kernel"])
    assert k["precision"] == 1.0 and k["recall"] == 1.0, (k, r.text())


def test_a_block_table_far_wider_than_its_sequences_is_read_up_to_their_blocks(tmp_path):
    """A block table allocated for the longest context (256 entries a row) while the sequences
    hold a few blocks: every power of two from 1 keeps the rows' counts within their rows, so the
    block size (16) is not among the first few divisors that fit; the fit still finds it, and a
    run with more and longer sequences is predicted exactly (the table's width stays: no fitting
    run varies it, so the table's own read is fitted for this width)."""
    paths = [_table(s, m, h, stride=256).write(tmp_path / f"w{s}.pctrace") for s, m, h in ((1, 6, 40), (2, 8, 80))]
    model = fit_model([T.read_trace(p) for p in paths])
    km = next(km for n, km in model.kernels.items() if "paged_table" in n)
    r = next(x for x in km.regions if x.base == "p1")
    assert r.row_stride is not None and r.count_div == KV_TOKENS, r.text()
    tr = T.read_trace(_table(3, 16, 200, stride=256).write(tmp_path / "w3.pctrace"))
    ev = evaluate(model, tr, "none")
    k = next(x for x in ev["kernels"] if "paged_table" in x["kernel"])
    assert k["precision"] == 1.0 and k["recall"] == 1.0, (k, r.text())


K_FILTERED = Kernel("paged_decode_filtered", [("out", "float*"), ("kv", "const float*"), ("table", "const int*"),
                                               ("seq_lens", "const int*"), ("query_start", "const int*"),
                                               ("table_stride", "int")],
                    {"out": "linear", "kv": "indexed", "table": "linear", "seq_lens": "linear",
                     "query_start": "linear"})


K_PREFILL = Kernel("prefix_prefill_filtered", K_FILTERED.params, K_FILTERED.classes)
K_PREFILL_Q = Kernel("prefix_prefill_query", [*K_FILTERED.params, ("q", "const float*"), ("k", "const float*"),
                                              ("v", "const float*")],
                     {**K_FILTERED.classes, "q": "indexed", "k": "indexed", "v": "indexed"})
QKV_ROW, K_AT, V_AT, KV_WIDTH = 1024, 512, 768, 256   # a fused QKV projection's row: Q, then K, then V (one big page)


def _filtered_table(seed: int, max_seqs: int, len_hi: int, steps: int = 30, stride: int = 32,
                    record_starts: bool = True, limit: int = 1, diff: bool = True, prefill: bool = False,
                    query: bool = False) -> Builder:
    """A paged decode kernel launched over a batch that mixes decoding sequences with prefill
    chunks, as vLLM's chunked-prefill path launches its paged decode: a program per sequence (grid
    = the batch), each reading its row of the block table up to ceil(seq_lens[r] / 16) blocks, but
    a program whose query (query_start[r+1] - query_start[r] tokens; with `diff` False, a buffer of
    query lengths, query_start[r]) is longer than `limit` returns before it reads (a decoding
    sequence's query is `limit` tokens: 1, or a speculative step's drafts and one). Sequences join
    with a prefill chunk of limit+1 to limit+8 tokens, in any batch position.

    `prefill`: the prefill kernel beside it instead, as vLLM's prefix prefill skips decode
    queries: sequences join with a prompt of limit+1 to 63 tokens, prefilled in chunks of limit+1
    to limit+8 tokens over several steps; a program whose query is `limit` tokens returns, the
    others read their context, the tokens before their chunk, ceil((seq_lens[r] - query) / 16)
    blocks (a first chunk reads none: the blocks its own tokens fill are not read from the cache).
    The kernel is launched where the batch holds a chunk. `query` (with `prefill`): it also reads
    its chunks' query rows, SMALL_ROW bytes a token from each chunk's start offset, in a buffer of
    one big page (SMALL_ROWS tokens), and none for a decode's, and their new tokens' K and V from
    the K and V views of the step's fused QKV projection (`k`, `v`: KV_WIDTH bytes at K_AT and V_AT
    of each QKV_ROW-byte row, two pointers into one page of an allocation of the batch's tokens)."""
    b = Builder("paged-filtered", seed=seed)
    rng = b.rng
    pool = 1024
    kv = b.malloc(KV_BLOCK * pool, "kv")
    table = b.malloc(4 * 32 * stride, "table")
    lens = b.malloc(4 * 32, "seq_lens")
    starts = b.malloc(4 * 33, "query_start")
    out = b.malloc(65536 * 32, "out")
    tab = rng.integers(0, pool, (32, stride)).astype("<i4")
    free = [int(x) for x in rng.permutation(pool)]
    kern = K_PREFILL_Q if query else K_PREFILL if prefill else K_FILTERED
    qbuf = b.malloc(SMALL_ROW * SMALL_ROWS, "q") if query else None
    # a sequence: [tokens, steps left, its blocks, this step's query, prompt tokens not yet prefilled]
    running: list[list] = [[int(rng.integers(1, len_hi)), int(rng.integers(4, 12)), [], limit, 0] for _ in range(2)]
    for _ in range(steps):
        for q in running:
            q[3] = limit
            if q[4]:   # the next chunk, none left shorter than a chunk
                q[3] = min(q[4], int(rng.integers(limit + 1, limit + 9)))
                q[3] = q[4] if q[4] - q[3] <= limit else q[3]
                q[4] -= q[3]
        while len(running) < max_seqs and rng.random() < 0.5:
            first = int(rng.integers(limit + 1, limit + 9))
            rest = max(0, int(rng.integers(limit + 1, 64)) - first) if prefill else 0
            running.insert(int(rng.integers(0, len(running) + 1)),
                           [0, int(rng.integers(1, 12)), [], first, rest if rest > limit else 0])
        for q in running:
            q[0] += q[3]
            while len(q[2]) < -(-q[0] // KV_TOKENS):
                q[2].append(free.pop())
        lens_v = np.zeros(32, "<i4")
        for i, q in enumerate(running):
            tab[i, :len(q[2])] = q[2]
            lens_v[i] = q[0]
        n = len(running)
        qs = np.zeros(33, "<i4")
        if diff:
            qs[1:n + 1] = np.cumsum([q[3] for q in running])
        else:
            qs[:n] = [q[3] for q in running]
        if prefill:   # each chunk's context: the blocks of the tokens before it
            reads = [(i, -(-(q[0] - q[3]) // KV_TOKENS)) for i, q in enumerate(running) if q[3] > limit]
        else:
            reads = [(i, len(q[2])) for i, q in enumerate(running) if q[3] == limit]
        if prefill and not reads:
            continue
        rows = [(i, m) for i, m in reads if m > 0]
        blocks = np.concatenate([running[i][2][:m] for i, m in rows] + [[]]).astype(np.int64)
        if query:   # the step's fused projection, as many rows as tokens
            qkv = b.malloc(QKV_ROW * int(qs[n]), "qkv")
        i0 = b.reserve(1)
        args = {"out": out.ptr(), "kv": kv.ptr(), "table": table.ptr(), "seq_lens": lens.ptr(),
                "query_start": starts.ptr(), "table_stride": stride}
        touches = [Range(starts, 0, 4 * (n + diff)), Range(lens, 0, 4 * n), Range(out, 0, 65536 * n, WRITE),
                   Ranges(table, np.zeros(len(rows), np.int64), [4 * i * stride for i, _ in rows],
                          [4 * m for _, m in rows]),
                   Ranges(kv, np.zeros(len(blocks), np.int64), blocks * KV_BLOCK, KV_BLOCK)]
        if query:
            assert diff and qs[n] <= SMALL_ROWS
            chunks = [i for i, _ in reads]
            args.update(q=qbuf.ptr(), k=qkv.ptr(K_AT), v=qkv.ptr(V_AT))
            touches.append(Ranges(qbuf, np.zeros(len(chunks), np.int64), [SMALL_ROW * int(qs[i]) for i in chunks],
                                  [SMALL_ROW * int(qs[i + 1] - qs[i]) for i in chunks]))
            toks = np.concatenate([np.arange(qs[i], qs[i + 1]) for i in chunks] + [[]]).astype(np.int64)
            for at in (K_AT, V_AT):
                touches.append(Ranges(qkv, np.zeros(len(toks), np.int64), QKV_ROW * toks + at, KV_WIDTH))
        b.launch(kern, [i0], args, grid=(n, 2), touches=touches)
        if query:
            b.free(qkv)
        b.values(kern, "table", [i0], table.ptr(), tab.reshape(-1)[None])
        b.values(kern, "seq_lens", [i0], lens.ptr(), lens_v[None])
        if record_starts:
            b.values(kern, "query_start", [i0], starts.ptr(), qs[None])
        for q in running:
            q[1] -= 1
        for q in [q for q in running if q[1] <= 0]:
            free.extend(q[2])
        running = [q for q in running if q[1] > 0] or \
            [[int(rng.integers(1, len_hi)), int(rng.integers(4, 12)), [free.pop()], limit, 0]]
    return b


def _over_predicts_without_values(model, b: Builder, kernel: str, tmp_path) -> None:
    """A run whose row filter's (and count_sub's) values were not recorded: every row is read, to
    its whole count, so nothing is missed and more is predicted; batch == online."""
    nv = T.read_trace(b.write(tmp_path / "nv.pctrace"))
    ev = evaluate(model, nv, "none")
    k = next(x for x in ev["kernels"] if kernel in x["kernel"])
    assert k["recall"] == 1.0 and k["precision"] < 1.0, k
    assert_online_is_batch(model, nv)


@pytest.mark.slow
def test_a_tables_rows_are_read_only_where_another_buffer_allows(tmp_path, capsys):
    """A paged decode kernel whose programs for prefill chunks return before reading: fitted from
    faults as the block table read row by row, filtered by the query lengths, the differences of
    the query start offsets (`rows where v(p4)[r+1] - v(p4)[r] <= 1`); without the filter no table
    verifies (the unread rows' blocks widen the values' extremes). Written readably and kept
    through the model file; a run with more and longer sequences is predicted exactly, batch ==
    online; without the start offsets' values every row is read (nothing missed); a model file
    whose filter has an unknown comparison is refused in one line."""
    from pagecast.cli import main
    paths = [_filtered_table(1, 6, 40).write(tmp_path / "f1.pctrace"),
             _filtered_table(2, 8, 80).write(tmp_path / "f2.pctrace")]
    model = fit_model([T.read_trace(p) for p in paths])
    km = next(km for n, km in model.kernels.items() if "paged_decode_filtered" in n)
    r = next(x for x in km.regions if x.base == "p1")
    assert r.text() == (f"[p1 + {KV_BLOCK}*v(p2)[r*p5 + j], +{KV_BLOCK}) for r < grid_x, j < ceil(v(p3)[r] / 16), "
                        "rows where v(p4)[r+1] - v(p4)[r] <= 1"), r.text()
    save_model(model, tmp_path / "m.json")
    again = load_model(tmp_path / "m.json").kernels[km.name].regions[[x.base for x in km.regions].index("p1")]
    assert again.row_filter == r.row_filter and again.text() == r.text()
    tr = T.read_trace(_filtered_table(3, 16, 200).write(tmp_path / "f3.pctrace"))
    ev = evaluate(model, tr, "none")
    k = next(x for x in ev["kernels"] if "paged_decode_filtered" in x["kernel"])
    assert k["precision"] == 1.0 and k["recall"] == 1.0, k
    assert_online_is_batch(model, tr)
    _over_predicts_without_values(model, _filtered_table(4, 8, 60, record_starts=False), "paged_decode_filtered",
                                  tmp_path)
    d = json.loads((tmp_path / "m.json").read_text())
    reg = next(x for x in d["kernels"][km.name]["regions"] if x["base"] == "p1")
    assert reg["row_filter"] == {"index": "p4", "elem": 4, "diff": True, "op": "le", "value": 1}
    reg["row_filter"]["op"] = "lt"
    (tmp_path / "bad.json").write_text(json.dumps(d))
    assert main(["evaluate", str(tmp_path / "bad.json"), str(paths[1])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "row_filter" in err[0] and "op" in err[0], err


@pytest.mark.slow
def test_a_block_tables_own_rows_are_read_where_its_filter_allows(tmp_path):
    """The paged decode's block table with rows of 2048 entries (8 KiB: eight rows a big page):
    its own rows fit by position, read to the sequence's blocks, and take the filter its table
    region was fitted with (a prefill chunk's program returns before it reads its row), so a
    run with more and longer sequences is predicted exactly, batch == online."""
    paths = [_filtered_table(s, m, h, stride=2048).write(tmp_path / f"f{s}.pctrace") for s, m, h in ((1, 6, 40),
                                                                                                    (2, 8, 80))]
    model = fit_model([T.read_trace(p) for p in paths])
    km = next(km for n, km in model.kernels.items() if "paged_decode_filtered" in n)
    r = next(x for x in km.regions if x.base == "p2")
    assert r.text() == ("[p2 + 4*p5*i, +4*ceil(v(p3)[i] / 16)) for i < grid_x, "
                        "rows where v(p4)[i+1] - v(p4)[i] <= 1"), r.text()
    tr = T.read_trace(_filtered_table(3, 16, 200, stride=2048).write(tmp_path / "f3.pctrace"))
    ev = evaluate(model, tr, "none")
    k = next(x for x in ev["kernels"] if "paged_decode_filtered" in x["kernel"])
    assert k["precision"] == 1.0 and k["recall"] == 1.0, k
    assert_online_is_batch(model, tr)


@pytest.mark.slow
def test_a_prefill_block_tables_own_rows_are_read_to_each_chunks_context(tmp_path):
    """The prefix prefill's block table with rows of 2047 entries, so that rows start anywhere in a
    page (row r at 8188*r bytes): its own rows fit by position and take both the filter and the
    count_sub of the table region that reads them (a chunk reads ceil((seq_len - query) / 16)
    entries of its row; a first chunk, or a decode query's row, none), and a row that reads none
    names no page, wherever it starts. A run with more and longer sequences is predicted
    exactly, batch == online."""
    paths = [_filtered_table(s, m, h, stride=2047, prefill=True).write(tmp_path / f"f{s}.pctrace")
             for s, m, h in ((1, 6, 40), (2, 8, 80))]
    model = fit_model([T.read_trace(p) for p in paths])
    km = next(km for n, km in model.kernels.items() if "prefix_prefill_filtered" in n)
    r = next(x for x in km.regions if x.base == "p2")
    q = "v(p4)[i+1] - v(p4)[i]"
    assert r.text() == f"[p2 + 4*p5*i, +4*ceil((v(p3)[i] - ({q})) / 16)) for i < grid_x, rows where {q} >= 2", \
        r.text()
    save_model(model, tmp_path / "m.json")
    again = load_model(tmp_path / "m.json").kernels[km.name].regions[[x.base for x in km.regions].index("p2")]
    assert again.count_sub == r.count_sub and again.text() == r.text()
    tr = T.read_trace(_filtered_table(3, 16, 200, stride=2047, prefill=True).write(tmp_path / "f3.pctrace"))
    ev = evaluate(model, tr, "none")
    k = next(x for x in ev["kernels"] if "prefix_prefill_filtered" in x["kernel"])
    assert k["precision"] == 1.0 and k["recall"] == 1.0, k
    assert_online_is_batch(model, tr)


@pytest.mark.slow
@settings(max_examples=2, phases=[Phase.explicit, Phase.reuse, Phase.generate], **SETTINGS)
@given(drop=st.sampled_from([0.0, 0.01]), seed=st.integers(0, 10_000), limit=st.integers(1, 4), diff=st.booleans())
@example(drop=0.01, seed=13, limit=3, diff=False)
def test_one_profile_of_a_filtered_table_predicts_a_larger_run(tmp_path_factory, drop, seed, limit, diff):
    """One profile of a paged decode over mixed batches, 1% of its records lost or none, its
    decoding queries `limit` tokens long, the query lengths recorded as start offsets or as
    lengths: the filter is the tightest bound the profile shows (`<= limit`, on the offsets'
    difference or the value), and a run with twice the sequences, four times longer, is predicted
    exactly."""
    d = tmp_path_factory.mktemp("filtered")
    fit = _filtered_table(seed, 8, 80, limit=limit, diff=diff).write(d / "fit.pctrace", drop=drop)
    test = _filtered_table(seed + 1, 16, 320, limit=limit, diff=diff).write(d / "test.pctrace")
    model = fit_model([T.read_trace(fit)])
    km = next(km for n, km in model.kernels.items() if "paged_decode_filtered" in n)
    r = next(x for x in km.regions if x.base == "p1")
    assert r.row_filter is not None and r.row_filter.index == "p4", r.text()
    assert (r.row_filter.diff, r.row_filter.op, r.row_filter.value) == (diff, "le", limit), r.text()
    ev = evaluate(model, T.read_trace(test), "none")
    k = next(x for x in ev["kernels"] if "paged_decode_filtered" in x["kernel"])
    assert k["precision"] == 1.0 and k["recall"] == 1.0, (k, r.text())


@pytest.mark.slow
@pytest.mark.parametrize("drop,diff", [(0.0, True), (0.01, False)])
def test_a_prefill_kernel_reads_its_context_rows_where_another_buffer_allows(tmp_path, capsys, drop, diff):
    """A prefill kernel that skips decode queries and reads each chunk's context, as vLLM's prefix
    prefill does: row r of the block table read only where the query is longer than one token,
    up to the sequence's length less the query's (`count_sub`), over the block size, the query's
    length the difference of its start offsets (`diff`) or a buffer of lengths. One profile, 1%
    of its records lost or none, fits it (the blocks the chunk's own tokens fill are not read, so
    no count without the subtraction verifies), written readably and kept through the model
    file; a run with twice the sequences, four times longer, is predicted exactly, batch ==
    online; a model file whose count_sub names no pointer word is refused in one line, exit 2."""
    from pagecast.cli import main
    path = _filtered_table(5, 8, 80, steps=40, prefill=True, diff=diff).write(tmp_path / "p.pctrace", drop=drop)
    model = fit_model([T.read_trace(path)])
    km = next(km for n, km in model.kernels.items() if "prefix_prefill_filtered" in n)
    r = next(x for x in km.regions if x.base == "p1")
    q = "v(p4)[r+1] - v(p4)[r]" if diff else "v(p4)[r]"
    assert r.text() == (f"[p1 + {KV_BLOCK}*v(p2)[r*p5 + j], +{KV_BLOCK}) for r < grid_x, "
                        f"j < ceil((v(p3)[r] - {f'({q})' if diff else q}) / 16), rows where {q} >= 2"), r.text()
    save_model(model, tmp_path / "m.json")
    again = load_model(tmp_path / "m.json").kernels[km.name].regions[[x.base for x in km.regions].index("p1")]
    assert again.count_sub == r.count_sub and again.text() == r.text()
    tr = T.read_trace(_filtered_table(6, 16, 320, steps=40, prefill=True, diff=diff).write(tmp_path / "t.pctrace"))
    # the cache's pages (the block table's one page is read only where some chunk has a context,
    # which its linear region does not say)
    from pagecast import footprints as FP
    from pagecast.predict.predictor import predict_footprints
    a = tr.allocations.to_pylist()
    kv = max(a, key=lambda x: x[T.BYTES])
    lo, hi = kv[T.ADDRESS] // tr.page_size, (kv[T.ADDRESS] + kv[T.BYTES]) // tr.page_size
    pred, truth = predict_footprints(model, tr, "none"), FP.footprints(tr)
    names = tr.launches.column(T.KERNEL).to_pylist()
    got = [[(p := fp.pages(i))[(p >= lo) & (p < hi)].tolist() for fp in (pred, truth)]
           for i in range(tr.n_launches) if "prefix_prefill_filtered" in names[i]]
    assert len(got) > 20 and all(p == t for p, t in got), r.text()
    assert sum(len(t) for _, t in got) > 100
    assert_online_is_batch(model, tr)
    # without the query lengths' values every row is read to its whole length: nothing missed
    _over_predicts_without_values(model, _filtered_table(7, 8, 60, steps=20, prefill=True, diff=diff,
                                                         record_starts=False), "prefix_prefill_filtered", tmp_path)
    d = json.loads((tmp_path / "m.json").read_text())
    reg = next(x for x in d["kernels"][km.name]["regions"] if x["base"] == "p1")
    assert reg["count_sub"] == {"index": "p4", "elem": 4, "diff": diff}
    reg["count_sub"]["index"] = "p9"
    (tmp_path / "bad.json").write_text(json.dumps(d))
    assert main(["evaluate", str(tmp_path / "bad.json"), str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "count_sub" in err[0] and "p9" in err[0], err


K_VARLEN = Kernel("prefill_query_rows", [("out", "float*"), ("q", "const float*"), ("query_start", "const int*"),
                                         ("n", "int")],
                  {"out": "indexed", "q": "indexed", "query_start": "linear"})
Q_ROW = 16384   # bytes of a token's query (and output) row: 32 heads of 128 floats


def _varlen(seed: int, max_seqs: int, chunk_hi: int, skip: bool, steps: int = 30) -> Builder:
    """A prefill kernel over a varlen batch, as vLLM's prefix prefill and FlashAttention's varlen
    kernels take it: every request's query tokens back to back in one buffer, request i's rows
    from query_start[i] to query_start[i+1]; a program per request reads its query rows and
    writes its output rows at the same positions. `skip`: a request whose query is one token (a
    decode) returns before it reads (SKIP_DECODE); most requests are decodes, the others prefill
    chunks of 2 to `chunk_hi` - 1 tokens, in any batch position."""
    b = Builder("varlen", seed=seed)
    rng = b.rng
    q, out = b.malloc(Q_ROW * 4096, "q"), b.malloc(Q_ROW * 4096, "out")
    starts = b.malloc(4 * 257, "query_start")
    for _ in range(steps):
        n = int(rng.integers(2, max_seqs + 1))
        ql = np.where(rng.random(n) < 0.7, 1, rng.integers(2, chunk_hi, n))
        if (ql == 1).all():
            ql[int(rng.integers(0, n))] = int(rng.integers(2, chunk_hi))
        qs = np.zeros(257, "<i4")
        qs[1:n + 1] = np.cumsum(ql)
        read = [i for i in range(n) if ql[i] > 1 or not skip]
        at, nb = np.array([qs[i] * Q_ROW for i in read], np.int64), np.array([ql[i] * Q_ROW for i in read], np.int64)
        i0 = b.reserve(1)
        b.launch(K_VARLEN, [i0], {"out": out.ptr(), "q": q.ptr(), "query_start": starts.ptr(), "n": n}, grid=(n, 4),
                 touches=[Range(starts, 0, 4 * (n + 1)), Ranges(q, np.zeros(len(at), np.int64), at, nb),
                          Ranges(out, np.zeros(len(at), np.int64), at, nb, WRITE)])
        b.values(K_VARLEN, "query_start", [i0], starts.ptr(), qs[None])
    return b


@pytest.mark.parametrize("drop,skip", [(0.0, True), (0.01, True), (0.0, False)])
def test_a_varlen_batchs_rows_are_read_back_to_back_where_their_lengths_allow(tmp_path, drop, skip):
    """A prefill kernel's query and output rows in a varlen batch: request i's rows run from its
    start offset to the next request's (chunks of their own lengths, the lengths the offsets'
    differences, in units of the row), and where the kernel skips decodes, only the requests
    whose query is longer than one token (a one-dimensional row filter on the same offsets: the
    unfiltered rows, tried first, reach the decodes' rows, never touched). One profile, 1% of
    its records lost or none, fits it, written readably and kept through the model file; a run
    with three times the requests and longer chunks is predicted exactly, batch == online."""
    path = _varlen(1, 12, 24, skip).write(tmp_path / "fit.pctrace", drop=drop)
    model = fit_model([T.read_trace(path)])
    km = next(km for n, km in model.kernels.items() if "prefill_query_rows" in n)
    rows = f"[p1 + {Q_ROW}*v(p2)[i], +{Q_ROW}*(v(p2)[i+1] - v(p2)[i])) for i < p3"
    r = next(x for x in km.regions if x.base == "p1")
    if skip:
        assert r.text() == f"{rows}, rows where v(p2)[i+1] - v(p2)[i] >= 2", r.text()
        assert next(x for x in km.regions if x.base == "p0").text() == r.text().replace("p1 +", "p0 +")
    else:
        assert r.cls == "indexed", r.text()
    save_model(model, tmp_path / "m.json")
    again = load_model(tmp_path / "m.json").kernels[km.name].regions[[x.base for x in km.regions].index("p1")]
    assert again.row_filter == r.row_filter and again.text() == r.text()
    tr = T.read_trace(_varlen(2, 40, 64, skip).write(tmp_path / "test.pctrace"))
    ev = evaluate(model, tr, "none")
    k = next(x for x in ev["kernels"] if "prefill_query_rows" in x["kernel"])
    assert k["precision"] == 1.0 and k["recall"] == 1.0, (k, r.text())
    assert_online_is_batch(model, tr)


@pytest.mark.slow
def test_a_prefill_kernels_query_rows_take_the_filter_its_table_holds(tmp_path):
    """A prefill kernel that skips decode queries reads neither their KV blocks nor their query
    rows. Its query buffer is one big page, so its records (a fault per big page) verify the whole
    buffer as well as the chunks' rows, and no filter is tried there; the block table's region
    holds the filter (`rows where v(p4)[r+1] - v(p4)[r] >= 2`, proven on its blocks), and the
    query rows take it (fit.program_filters): the faults are likelier under the rows, and so do its
    new tokens' K and V, views of a fused QKV projection's rows, as whole rows of it (this case
    passes with the fence rule of before too; the rule for pointers in one page,
    fit.model._fences, was measured on vLLM's prefix prefill, docs/workloads-triton.md). Its output,
    written for every request, holds faults the filtered rows leave out, and stays a range. A run
    with more requests is predicted exactly in the query and QKV buffers, batch == online; clean
    records. Not covered (they fail here, and are not fixed): with 1% of this profile's records
    lost, one launch's records of the query buffer are all lost, the rows name pages there and
    are refused, and the query stays its first rows up to the batch's tokens (recall kept,
    precision lost); from records exact to the page (`fit --from truth`) the K view is
    `irregular`."""
    path = _filtered_table(5, 6, 80, steps=40, prefill=True, query=True).write(tmp_path / "p.pctrace")
    model = fit_model([T.read_trace(path)])
    km = next(km for n, km in model.kernels.items() if "prefix_prefill_query" in n)
    q = "v(p4)[i+1] - v(p4)[i]"
    r = next(x for x in km.regions if x.base == "p6")
    assert r.text() == f"[p6 + {SMALL_ROW}*v(p4)[i], +{SMALL_ROW}*({q})) for i < grid_x, rows where {q} >= 2", \
        r.text()
    assert next(x for x in km.regions if x.base == "p0").row_filter is None
    # the K and V views, two pointers into one page: whole rows of the fused projection (the runs
    # from the views' own pointers end past the allocation where a batch's last row is a chunk's)
    for base, at in (("p7", K_AT), ("p8", V_AT)):
        r = next(x for x in km.regions if x.base == base)
        assert r.text() == (f"[{base} - {at} + {QKV_ROW}*v(p4)[i], +{QKV_ROW}*({q})) for i < grid_x, "
                            f"rows where {q} >= 2"), r.text()
    tr = T.read_trace(_filtered_table(6, 7, 120, steps=40, prefill=True, query=True).write(tmp_path / "t.pctrace"))
    ev = evaluate(model, tr, "none", kernel=km.name)
    k = next(x for x in ev["kernels"] if x["kernel"] == km.name)
    assert k["recall"] == 1.0, (k, [x.text() for x in km.regions])
    rows = {r["words"]: r for r in ev["buffers"]["rows"]}
    assert rows["p6"]["false_bytes"] == rows["p6"]["missed_bytes"] == 0, rows["p6"]
    assert rows["p6"]["predicted_bytes"] < rows["p6"]["launches"] * SMALL_ROW * SMALL_ROWS // 2   # decodes left out
    assert rows["p7,p8"]["false_bytes"] == rows["p7,p8"]["missed_bytes"] == 0, rows["p7,p8"]
    # what is over-predicted: the block table's page at launches whose chunks are all first chunks
    # (no context to read: the table's region is a range)
    assert {w for w, r in rows.items() if r["false_bytes"]} <= {"p2"}, rows
    assert_online_is_batch(model, tr)


K_DECODE = Kernel("decode_query_rows", [("out", "float*"), ("q", "const float*"), ("query_start", "const int*"),
                                         ("n", "int")],
                  {"out": "indexed", "q": "indexed", "query_start": "linear"})
SMALL_ROW = 1024   # bytes of a token's query row: 8 heads of 64 halves
SMALL_ROWS = 64    # rows the buffers hold: 64 KiB, one big page


def _decodes(seed: int, max_seqs: int, chunk_hi: int, steps: int = 36) -> Builder:
    """A decode kernel over a mixed batch, as a serving engine's paged decode kernel is launched
    beside a prefill kernel: a program per request, one that returns at once where the request's
    query is longer than one token, the others reading their query row and writing their output
    row at the request's start offset. The buffers are a big page each, so the faults cannot
    tell rows from the buffer's first pages; a batch of prefills only touches neither."""
    b = Builder("decodes", seed=seed)
    rng = b.rng
    q, out = b.malloc(SMALL_ROW * SMALL_ROWS, "q"), b.malloc(SMALL_ROW * SMALL_ROWS, "out")
    starts = b.malloc(4 * 257, "query_start")
    for step in range(steps):
        n = int(rng.integers(1, max_seqs + 1))
        ql = np.where(rng.random(n) < 0.6, 1, rng.integers(2, chunk_hi, n))
        if step % 5 == 0:   # prefills only
            ql = rng.integers(2, chunk_hi, n)
        qs = np.zeros(257, "<i4")
        qs[1:n + 1] = np.cumsum(ql)
        assert qs[n] <= SMALL_ROWS
        at = np.array([qs[i] * SMALL_ROW for i in range(n) if ql[i] == 1], np.int64)
        nb = np.full(len(at), SMALL_ROW, np.int64)
        i0 = b.reserve(1)
        touches = [Range(starts, 0, 4 * (n + 1))]
        if len(at):
            touches += [Ranges(q, np.zeros(len(at), np.int64), at, nb), Ranges(out, np.zeros(len(at), np.int64), at, nb,
                                                                               WRITE)]
        b.launch(K_DECODE, [i0], {"out": out.ptr(), "q": q.ptr(), "query_start": starts.ptr(), "n": n}, grid=(n, 4),
                 touches=touches)
        b.values(K_DECODE, "query_start", [i0], starts.ptr(), qs[None])
    return b


@pytest.mark.parametrize("drop", [0.0, 0.01])
def test_launches_that_touch_nothing_choose_a_decode_kernels_rows(tmp_path, drop):
    """In buffers of one big page, a decode kernel's query and output rows (at its decodes' start
    offsets) verify no better than the buffer's first pages: the launches whose batch holds
    prefills only, whose records show nothing in those buffers, refute any range, and of the
    index words' regions that predict nothing there, the faults choose the rows the kernel reads
    (a one-dimensional row filter on the offsets' differences). One profile, 1% of its records
    lost or none; a run with more requests is predicted exactly, batch == online."""
    path = _decodes(1, 5, 8).write(tmp_path / "fit.pctrace", drop=drop)
    model = fit_model([T.read_trace(path)])
    km = next(km for n, km in model.kernels.items() if "decode_query_rows" in n)
    for base in ("p0", "p1"):
        r = next(x for x in km.regions if x.base == base)
        assert r.text() == (f"[{base} + {SMALL_ROW}*v(p2)[i], +{SMALL_ROW}*(v(p2)[i+1] - v(p2)[i])) for i < p3, "
                            "rows where v(p2)[i+1] - v(p2)[i] <= 1"), r.text()
    tr = T.read_trace(_decodes(2, 8, 8).write(tmp_path / "test.pctrace"))
    ev = evaluate(model, tr, "none")
    k = next(x for x in ev["kernels"] if "decode_query_rows" in x["kernel"])
    assert k["precision"] == 1.0 and k["recall"] == 1.0, k
    assert_online_is_batch(model, tr)


@pytest.mark.slow
def test_a_row_filter_without_a_table_is_refused(tmp_path, capsys):
    """A model file whose indexed region has a row_filter but no row_stride (a filter picks a
    table's rows, or the values of chunks of their own lengths; a one-dimensional region of
    whole chunks has none) is refused in one line, exit 2."""
    from pagecast.cli import main
    paths = [_filtered_table(1, 6, 40, steps=12).write(tmp_path / "f1.pctrace")]
    save_model(fit_model([T.read_trace(p) for p in paths]), tmp_path / "m.json")
    d = json.loads((tmp_path / "m.json").read_text())
    km = next(k for n, k in d["kernels"].items() if "paged_decode_filtered" in n)
    reg = next(x for x in km["regions"] if x["base"] == "p1")
    assert reg.get("row_filter") is not None and reg.get("row_stride") is not None, reg
    reg.pop("row_stride")
    (tmp_path / "bad.json").write_text(json.dumps(d))
    assert main(["evaluate", str(tmp_path / "bad.json"), str(paths[0])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "row_filter needs a row_stride" in err[0], err


K_ROWS = Kernel("kv_indices_from_rows", [("out", "int*"), ("req_to_token", "const int*"), ("req_idx", "const int*"),
                                         ("seq_lens", "const int*"), ("row_stride", "int")],
                {"out": "linear", "req_to_token": "indexed", "req_idx": "linear", "seq_lens": "linear"})
ROW_ENTRIES, SLOTS = 1 << 16, 16   # a request slot's row: an entry per block of the longest context (256 KiB)


def _slot_rows(seed: int, max_batch: int, len_hi: int, steps: int = 20, bad: bool = False) -> Builder:
    """A request-to-block table of a row per request slot (65536 int32 entries, 256 KiB), read as a
    serving engine builds its attention's block indices: program i reads the row of slot
    req_idx[i] up to ceil(seq_lens[i] / 16) entries (up to the whole row at 2^20 tokens). The
    table's own values are recorded (an integer buffer). `bad`: one length of 10^8 tokens (past
    its row and the table), one negative."""
    b = Builder("slot-rows", seed=seed)
    rng = b.rng
    table = b.malloc(4 * SLOTS * ROW_ENTRIES, "req_to_token")
    idx = b.malloc(4 * max_batch, "req_idx")
    lens = b.malloc(4 * max_batch, "seq_lens")
    out = b.malloc(4 * max_batch, "out")   # a value per request (what it writes is not this test's)
    tab = rng.integers(0, 1 << 20, (SLOTS, ROW_ENTRIES)).astype("<i4")
    for _ in range(steps):
        n = int(rng.integers(1, max_batch + 1))
        slots = rng.choice(SLOTS, n, replace=False).astype("<i4")
        lv = rng.integers(1, len_hi, n).astype("<i4")
        k = -(-lv.astype(np.int64) // KV_TOKENS)
        i0 = b.reserve(1)
        b.launch(K_ROWS, [i0], {"out": out.ptr(), "req_to_token": table.ptr(), "req_idx": idx.ptr(),
                                "seq_lens": lens.ptr(), "row_stride": ROW_ENTRIES}, grid=(n,),
                 touches=[Range(idx, 0, 4 * n), Range(lens, 0, 4 * n), Range(out, 0, 4 * n, WRITE),
                          Ranges(table, np.zeros(n, np.int64), slots.astype(np.int64) * 4 * ROW_ENTRIES, 4 * k)])
        if bad and n > 1:
            lv = lv.copy()
            lv[0], lv[1] = 10 ** 8, -5
        b.values(K_ROWS, "req_idx", [i0], idx.ptr(), slots[None])
        b.values(K_ROWS, "seq_lens", [i0], lens.ptr(), lv[None])
        b.values(K_ROWS, "req_to_token", [i0], table.ptr(), tab.reshape(-1)[None, :1024])
    return b


def test_rows_chosen_through_an_index_are_read_up_to_their_lengths(tmp_path, capsys):
    """Rows of a request-to-block table chosen through the requests' slot indices, each read up to
    its request's length over the block size: fitted from faults as whole rows selected by the
    index values, each chunk as long as the length buffer says (`lengths`), written readably and
    kept through the model file; a run with larger batches and longer requests is predicted
    exactly, batch == online; bad lengths are clipped to the allocation or read nothing; a model
    file whose `lengths` is not a boolean is refused in one line. The rows span several big pages,
    so the pages a length reaches show in the faults and pin the divisor (docs/template-model.md:
    within one big page they cannot, and the fit takes the loosest the faults allow)."""
    from pagecast.cli import main
    paths = [_slot_rows(s, m, h).write(tmp_path / f"r{s}.pctrace") for s, m, h in ((1, 4, 400_000), (2, 6, 700_000))]
    model = fit_model([T.read_trace(p) for p in paths])
    km = next(km for n, km in model.kernels.items() if "kv_indices_from_rows" in n)
    r = next(x for x in km.regions if x.base == "p1")
    assert r.text() == f"[p1 + {4 * ROW_ENTRIES}*v(p2)[i], +4*ceil(v(p3)[i] / 16)) for i < grid_x", r.text()
    save_model(model, tmp_path / "m.json")
    again = load_model(tmp_path / "m.json").kernels[km.name].regions[[x.base for x in km.regions].index("p1")]
    assert again.lengths and again.text() == r.text()
    tr = T.read_trace(_slot_rows(3, 12, 1 << 20).write(tmp_path / "r3.pctrace"))
    ev = evaluate(model, tr, "none")
    k = next(x for x in ev["kernels"] if "kv_indices_from_rows" in x["kernel"])
    assert k["precision"] == 1.0 and k["recall"] == 1.0, k
    assert_online_is_batch(model, tr)
    bad = T.read_trace(_slot_rows(4, 6, 700_000, bad=True).write(tmp_path / "bad.pctrace"))
    assert_online_is_batch(model, bad)
    assert main(["evaluate", str(tmp_path / "m.json"), str(tmp_path / "bad.pctrace")]) == 0
    capsys.readouterr()
    d = json.loads((tmp_path / "m.json").read_text())
    reg = next(x for x in d["kernels"][km.name]["regions"] if x["base"] == "p1")
    assert reg["lengths"] is True
    reg["lengths"] = "yes"
    (tmp_path / "bad.json").write_text(json.dumps(d))
    assert main(["evaluate", str(tmp_path / "bad.json"), str(paths[1])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "lengths" in err[0], err


@pytest.mark.slow
@settings(max_examples=3, phases=[Phase.explicit, Phase.reuse, Phase.generate], **SETTINGS)
@given(drop=st.sampled_from([0.0, 0.01]), seed=st.integers(0, 10_000))
def test_one_profile_of_rows_read_to_their_lengths_predicts_a_larger_run(tmp_path_factory, drop, seed):
    """One profile of rows chosen through slot indices and read to their lengths, 1% of its
    records lost or none: the lengths template predicts a run with larger batches and longer
    requests exactly."""
    d = tmp_path_factory.mktemp("rows")
    fit = _slot_rows(seed, 6, 700_000, steps=30).write(d / "fit.pctrace", drop=drop)
    test = _slot_rows(seed + 1, 12, 1 << 20).write(d / "test.pctrace")
    model = fit_model([T.read_trace(fit)])
    km = next(km for n, km in model.kernels.items() if "kv_indices_from_rows" in n)
    r = next(x for x in km.regions if x.base == "p1")
    assert r.lengths and r.count_div == KV_TOKENS, r.text()
    ev = evaluate(model, T.read_trace(test), "none")
    k = next(x for x in ev["kernels"] if "kv_indices_from_rows" in x["kernel"])
    assert k["precision"] == 1.0 and k["recall"] == 1.0, (k, r.text())


K_POOL = Kernel("pool_blocks", [("out", "float*"), ("pool", "const float*"), ("block_ids", "const int*"),
                                ("n_blocks", "int"), ("n_seqs", "int")],
                {"out": "linear", "pool": "indexed", "block_ids": "linear"})
POOL_BLOCK = 8192


def _pool(seed: int, n_pool: int, blocks: tuple[int, int], steps: int) -> Builder:
    """A paged KV cache read as an attention kernel reads it: a pool of `n_pool` blocks of 8 KiB
    (a few big pages), blocks handed out and freed as sequences come and go, each launch reading
    its batch's block tables concatenated (`n_blocks` ids, drawn in `blocks`, some -1: padding
    slots that select nothing) from a persistent id buffer holding stale ids past them. Most of
    the pool's big pages are touched at every launch, so the hull of what a launch reads (a range)
    explains every launch too, with the pages between the blocks."""
    b = Builder("pool-blocks", seed=seed)
    rng = b.rng
    pool = b.malloc(POOL_BLOCK * n_pool, "pool")
    ids = b.malloc(4 * n_pool, "block_ids")
    out = b.malloc(4 * 1024 * 64, "out")
    stale = rng.permutation(n_pool).astype("<i4")
    for _ in range(steps):
        n = int(rng.integers(*blocks))
        seqs = int(rng.integers(1, 64))
        v = rng.choice(n_pool, n, replace=False).astype("<i4")
        v[rng.random(n) < 0.1] = -1
        stale[:n] = v
        used = v[v >= 0].astype(np.int64)
        i0 = b.reserve(1)
        b.launch(K_POOL, [i0], {"out": out.ptr(), "pool": pool.ptr(), "block_ids": ids.ptr(), "n_blocks": n,
                                "n_seqs": seqs},
                 grid=(seqs,), touches=[Range(ids, 0, 4 * n), Range(out, 0, 4096 * seqs, WRITE),
                                        Ranges(pool, np.zeros(len(used), np.int64), used * POOL_BLOCK, POOL_BLOCK)])
        b.values(K_POOL, "block_ids", [i0], ids.ptr(), stale.copy()[None])
    return b


@pytest.mark.slow
@settings(max_examples=6, phases=[Phase.explicit, Phase.reuse, Phase.generate], **SETTINGS)
@given(n_pool=st.sampled_from([64, 128]), drop=st.sampled_from([0.0, 0.01]), seed=st.integers(0, 10_000))
def test_blocks_of_a_small_pool_are_indexed_though_their_hull_explains_every_launch(tmp_path_factory, n_pool, drop,
                                                                                     seed):
    """One profile of a paged pool whose blocks cover most big pages at every launch: the range
    (their hull) explains the launches, but the faults are far likelier under the blocks the ids
    name, so the region is indexed; the output, whose pages the arguments determine, stays a range.
    A longer unseen run with more blocks per launch is predicted exactly, the online predictor
    agrees with the batch one at every launch, and the model file keeps the region."""
    d = tmp_path_factory.mktemp("pool")
    fit_path = _pool(seed, n_pool, (n_pool // 3, n_pool // 2), 60).write(d / "fit.pctrace", drop=drop)
    test_path = _pool(seed + 1, n_pool, (n_pool // 4, n_pool - 1), 40).write(d / "test.pctrace")
    model = fit_model([T.read_trace(fit_path)])
    km = next(km for n, km in model.kernels.items() if "pool_blocks" in n)
    r = next(x for x in km.regions if x.base == "p1")
    assert r.cls == "indexed" and r.index == "p2", r.text()
    assert r.text() == f"[p1 + {POOL_BLOCK}*v(p2)[i], +{POOL_BLOCK}) for i < p3", r.text()
    assert next(x for x in km.regions if x.base == "p0").cls in ("fixed", "linear")
    save_model(model, d / "m.json")
    back = load_model(d / "m.json").kernels[km.name]
    assert [x.text() for x in back.regions] == [x.text() for x in km.regions]
    tr = T.read_trace(test_path)
    ev = evaluate(model, tr, "none")
    k = next(x for x in ev["kernels"] if "pool_blocks" in x["kernel"])
    assert k["precision"] == 1.0 and k["recall"] == 1.0, k
    assert_online_is_batch(model, tr)


def test_a_gathers_output_takes_the_rows_it_reads_as_its_size(tmp_path):
    """One profile of a row gather whose output (inside one big page) is written one 2 KiB row per
    index read: the faults there cannot pin the end (one fault per launch), and a constant holds
    at every launch; the gather's rows x chunk (`2048*n`) is the kernel's own size, so a run
    with fewer and more rows is predicted exactly."""
    fit = _gather(5, 4096, [512], list(range(8, 16)), 0.0, None, 4, steps=30).write(tmp_path / "f.pctrace")
    test = _gather(6, 4096, [512], list(range(1, 17)), 0.0, None, 4, steps=30).write(tmp_path / "t.pctrace")
    model = fit_model([T.read_trace(fit)])
    km = next(km for n, km in model.kernels.items() if "gather_cols" in n)
    out = next(x for x in km.regions if x.base == "p0")
    assert out.text() == "[p0, p0 + 2048*p3)", out.text()
    ev = evaluate(model, T.read_trace(test), "none")
    k = next(x for x in ev["kernels"] if "gather_cols" in x["kernel"])
    assert k["precision"] == 1.0 and k["recall"] == 1.0, k



K_CSR = Kernel("csr_gather", [("nrows", "int"), ("nnz", "int"), ("colind", "const int*"), ("x", "const float*")],
               {"colind": "linear", "x": "indexed"})
CSR_X = 1 << 16   # floats of x: 16 big pages


def _csr(seed: int, steps: int = 40) -> Builder:
    """A CSR SpMV's gather of x, one row block per launch (`steps` launches), as a row-partitioned
    SpMV runs: the matrix has a row per float of x; row r's 10 entries lie in a band around column
    r, and one in eight instead joins one of the clusters placed in every big page of x (long-range
    couplings). The column indices of the block's `nnz` entries are recorded; `nrows`, a tenth of
    them, is another argument never above the row."""
    b = Builder("csr-gather", seed=seed)
    rng = b.rng
    colind = b.malloc(4 * 10 * CSR_X, "colind")
    x = b.malloc(4 * CSR_X, "x")
    centers = np.arange(16) * (CSR_X // 16) + int(rng.integers(0, CSR_X // 16 - 256))
    for _ in range(steps):
        nrows = int(rng.integers(4096, 16384))
        r0 = int(rng.integers(0, CSR_X - nrows))
        row = np.repeat(np.arange(r0, r0 + nrows), 10)
        band = np.clip(row + rng.integers(-48, 49, len(row)), 0, CSR_X - 1)
        far = centers[rng.integers(0, 16, len(row))] + rng.integers(0, 256, len(row))
        col = np.where(rng.random(len(row)) < 0.125, far, band).astype(np.int64)
        pages = np.unique(col * 4 // 4096)
        i0 = b.reserve(1)
        b.launch(K_CSR, [i0], {"nrows": nrows, "nnz": len(col), "colind": colind.ptr(), "x": x.ptr()},
                 grid=(-(-nrows // 8),), touches=[Range(colind, 0, 4 * len(col)),
                                                  Ranges(x, np.zeros(len(pages), np.int64), pages * 4096, 4096)])
        b.values(K_CSR, "colind", [i0], colind.ptr(), col.astype("<i4")[None])
    return b


@pytest.mark.slow
@settings(max_examples=4, phases=[Phase.explicit, Phase.reuse, Phase.generate], **SETTINGS)
@given(drop=st.sampled_from([0.0, 0.01]), seed=st.integers(0, 10_000))
def test_a_count_reading_a_prefix_must_hold_the_fault_pages_not_only_the_big_pages(tmp_path_factory, drop, seed):
    """The clusters put a gathered page in every big page of x from the first `nrows` entries on,
    so `nrows` values cover, rounded out to big pages, what the `nnz` values do, and verification
    alone keeps the tighter count. The band's pages beyond the first tenth of the rows hold most
    faults: a fault page the tighter count leaves out is a touched page no lost record explains,
    so the count stays `nnz`, and another run is predicted exactly. (The old fitter kept `nrows`;
    that indexed template then lost to the range over all of x, which holds every fault page.)"""
    d = tmp_path_factory.mktemp("csr")
    model = fit_model([T.read_trace(_csr(seed).write(d / "fit.pctrace", drop=drop))])
    km = next(km for n, km in model.kernels.items() if "csr_gather" in n)
    r = next(x for x in km.regions if x.base == "p3")
    assert r.cls == "indexed" and r.text() == "[p3 + 4*v(p2)[i], +4) for i < p1", r.text()
    ev = evaluate(model, T.read_trace(_csr(seed + 1).write(d / "test.pctrace")), "none")
    k = next(x for x in ev["kernels"] if "csr_gather" in x["kernel"])
    assert k["precision"] == 1.0 and k["recall"] == 1.0, k


K_POS = Kernel("rows_by_position", [("table", "int*"), ("lens", "const int*"), ("row_stride", "int")],
               {"table": "indexed", "lens": "linear"})


def _pos_rows(seed: int, max_batch: int, len_hi: int, steps: int = 20, diff: bool = False,
              bad: bool = False, record_table: bool = True, clip: int = 0) -> Builder:
    """A table of a row per batch position (65536 int32 entries, 256 KiB a row), program i writing
    row i up to its request's blocks, ceil(len_i / 16) entries, as a serving engine builds the
    page table its attention reads: len_i another buffer's i-th value (a sequence length) or,
    `diff`, the difference of its consecutive values (an indptr: request i's entries run from
    v[i] to v[i+1]). The table's own values are recorded (an integer buffer) unless not
    `record_table`. `bad`: one length of 10^8 tokens (past its row), one negative. `clip`: the
    lengths recorded without their last `clip` values (a writer's clipped row)."""
    b = Builder("pos-rows", seed=seed)
    rng = b.rng
    table = b.malloc(4 * SLOTS * ROW_ENTRIES, "table")
    lens = b.malloc(4 * (max_batch + 1), "lens")
    tab = rng.integers(0, 1 << 20, (SLOTS, ROW_ENTRIES)).astype("<i4")
    for _ in range(steps):
        n = int(rng.integers(1, max_batch + 1))
        lv = rng.integers(1, len_hi, n).astype(np.int64)
        k = -(-lv // KV_TOKENS)
        i0 = b.reserve(1)
        rec = np.r_[0, np.cumsum(lv)] if diff else lv
        b.launch(K_POS, [i0], {"table": table.ptr(), "lens": lens.ptr(), "row_stride": ROW_ENTRIES}, grid=(n,),
                 touches=[Range(lens, 0, 4 * len(rec)),
                          Ranges(table, np.zeros(n, np.int64), np.arange(n) * 4 * ROW_ENTRIES, 4 * k, WRITE)])
        if bad and n > 1:
            rec = rec.copy()
            if diff:
                rec[1:] += 10 ** 8
                rec[2:] -= 10 ** 8 + 5 + lv[1]
            else:
                rec[0], rec[1] = 10 ** 8, -5
        if clip and len(rec) > clip:
            rec = rec[:-clip]
        b.values(K_POS, "lens", [i0], lens.ptr(), rec.astype("<i4")[None])
        if record_table:
            b.values(K_POS, "table", [i0], table.ptr(), tab.reshape(-1)[None, :1024])
    return b


@pytest.mark.parametrize("diff,record_table", [(False, True), (True, True), (False, False)])
def test_rows_chosen_by_position_are_read_up_to_their_lengths(tmp_path, capsys, diff, record_table):
    """A table's own row i, written up to the i-th request's blocks (a length, or an indptr's
    difference): fitted from faults as rows by position (no index word), each as long as the
    length buffer says (in entries of the table's recorded width, or where the table's values
    were not recorded, of the width its rows' stride pins), written readably and kept through
    the model file; a run with larger batches and longer requests is predicted exactly, batch ==
    online; bad lengths stop at the row's end or read nothing; lengths recorded in part give the
    rows they reach, online as in batch; a model file whose `length_diff` is not a boolean, or
    whose indexed region names no index with neither lengths nor a count buffer, is refused in
    one line."""
    from pagecast.cli import main
    paths = [_pos_rows(s, m, h, diff=diff, record_table=record_table).write(tmp_path / f"r{s}.pctrace")
             for s, m, h in ((1, 4, 400_000), (2, 6, 700_000))]
    model = fit_model([T.read_trace(p) for p in paths])
    km = next(km for n, km in model.kernels.items() if "rows_by_position" in n)
    r = next(x for x in km.regions if x.base == "p0")
    ln = "(v(p1)[i+1] - v(p1)[i])" if diff else "v(p1)[i]"
    assert r.text() == f"[p0 + 4*p2*i, +4*ceil({ln} / 16)) for i < grid_x", r.text()
    save_model(model, tmp_path / "m.json")
    again = load_model(tmp_path / "m.json").kernels[km.name].regions[[x.base for x in km.regions].index("p0")]
    assert again.index is None and again.length_diff == diff and again.text() == r.text()
    tr = T.read_trace(_pos_rows(3, 12, 1 << 20, diff=diff).write(tmp_path / "r3.pctrace"))
    ev = evaluate(model, tr, "none")
    k = next(x for x in ev["kernels"] if "rows_by_position" in x["kernel"])
    assert k["precision"] == 1.0 and k["recall"] == 1.0, k
    assert_online_is_batch(model, tr)
    bad = T.read_trace(_pos_rows(4, 6, 700_000, diff=diff, bad=True).write(tmp_path / "bad.pctrace"))
    assert_online_is_batch(model, bad)
    clipped = T.read_trace(_pos_rows(5, 6, 700_000, diff=diff, clip=2).write(tmp_path / "clip.pctrace"))
    assert_online_is_batch(model, clipped)   # the rows whose lengths were recorded, online as in batch
    assert main(["evaluate", str(tmp_path / "m.json"), str(tmp_path / "bad.pctrace")]) == 0
    capsys.readouterr()
    d = json.loads((tmp_path / "m.json").read_text())
    reg = next(x for x in d["kernels"][km.name]["regions"] if x["base"] == "p0")
    assert "index" not in reg or reg["index"] is None
    for key, val in (("length_diff", "yes"), ("lengths", False)):
        d2 = json.loads(json.dumps(d))
        reg2 = next(x for x in d2["kernels"][km.name]["regions"] if x["base"] == "p0")
        reg2[key] = val
        if key == "lengths":   # rows by position without lengths need a count buffer
            reg2.pop("count_index")
        (tmp_path / "bad.json").write_text(json.dumps(d2))
        assert main(["evaluate", str(tmp_path / "bad.json"), str(paths[1])]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and ("length_diff" in err[0] or "index" in err[0]), err


@pytest.mark.slow
@settings(max_examples=3, phases=[Phase.explicit, Phase.reuse, Phase.generate], **SETTINGS)
@given(drop=st.sampled_from([0.0, 0.01]), seed=st.integers(0, 10_000), diff=st.booleans())
def test_one_profile_of_rows_by_position_predicts_a_larger_run(tmp_path_factory, drop, seed, diff):
    """One profile of a table's rows chosen by position and written to their requests' lengths (or
    an indptr's differences), 1% of its records lost or none: rows by position predict a run with
    larger batches and longer requests exactly."""
    d = tmp_path_factory.mktemp("posrows")
    fit = _pos_rows(seed, 6, 700_000, steps=30, diff=diff).write(d / "fit.pctrace", drop=drop)
    test = _pos_rows(seed + 1, 12, 1 << 20, diff=diff).write(d / "test.pctrace")
    model = fit_model([T.read_trace(fit)])
    km = next(km for n, km in model.kernels.items() if "rows_by_position" in n)
    r = next(x for x in km.regions if x.base == "p0")
    assert r.index is None and r.lengths and r.length_diff == diff and r.count_div == KV_TOKENS, r.text()
    ev = evaluate(model, T.read_trace(test), "none")
    k = next(x for x in ev["kernels"] if "rows_by_position" in x["kernel"])
    assert k["precision"] == 1.0 and k["recall"] == 1.0, (k, r.text())


def test_a_block_tables_own_rows_are_read_as_far_as_its_table_region_reads_them(tmp_path):
    """A block table of 8 KiB rows, read by a paged attention up to ceil(seq_len / 16) entries a
    row: its own faults, inside the first page of each row, cannot tell the divisor, but the K/V
    region's table template (pinned by the KV blocks' faults) says how far each row is read, and
    the table's rows by position take its count buffer and divisor; a run with sequences of up to
    30,000 tokens (rows read past their first page) is predicted exactly."""
    paths = [_table(s, m, h, stride=2048, pool=8192).write(tmp_path / f"w{s}.pctrace")
             for s, m, h in ((1, 4, 100), (2, 8, 150))]
    model = fit_model([T.read_trace(p) for p in paths])
    km = next(km for n, km in model.kernels.items() if "paged_table" in n)
    own = next(x for x in km.regions if x.base == "p2")
    assert own.text() == "[p2 + 4*p5*i, +4*ceil(v(p3)[i] / 16)) for i < p4", own.text()
    assert own.fit.get("lengths_from") == "p1"
    tr = T.read_trace(_table(3, 16, 30000, stride=2048, pool=8192).write(tmp_path / "w3.pctrace"))
    ev = evaluate(model, tr, "none")
    k = next(x for x in ev["kernels"] if "paged_table" in x["kernel"])
    assert k["precision"] == 1.0 and k["recall"] == 1.0, k
    assert_online_is_batch(model, tr)


def test_fit_from_truth_reads_block_tables_and_last_blocks_to_the_page(tmp_path):
    """`fit --from truth`: records exact to the page, where a driver's are exact to its 64 KiB big
    page. A paged cache whose sequences' last blocks are read in part, through a block table of
    8 KiB rows: the K/V region is the table template, its last block in part (no whole-block
    template holds pages the truth shows untouched, and the stride is solved from where the
    first blocks begin), and the table's own rows, one page each at the fitting runs, are read
    as far as the K/V region reads them; a run with sequences of up to 30,000 tokens is
    predicted exactly, batch == online."""
    from pagecast.predict.truth_obs import truth_observations
    paths = [_table(s, m, h, stride=2048, pool=8192, partial=True).write(tmp_path / f"w{s}.pctrace")
             for s, m, h in ((1, 4, 100), (2, 8, 150))]
    truth = [truth_observations(T.read_trace(p)) for p in paths]
    model = fit_model(truth)
    assert model.big_page == 4096
    km = next(km for n, km in model.kernels.items() if "paged_table" in n)
    kv = next(x for x in km.regions if x.base == "p1")
    assert kv.part_last and kv.text() == (f"[p1 + {KV_BLOCK}*v(p2)[r*p5 + j], +{KV_BLOCK}) for r < p4, "
                                          "j < ceil(v(p3)[r] / 16), the last in part: v(p3)[r] - 16*j of 16"), kv.text()
    own = next(x for x in km.regions if x.base == "p2")
    assert own.text() == "[p2 + 4*p5*i, +4*ceil(v(p3)[i] / 16)) for i < p4", own.text()
    assert own.fit.get("lengths_from") == "p1"
    tr = T.read_trace(_table(3, 16, 30000, stride=2048, pool=8192, partial=True).write(tmp_path / "w3.pctrace"))
    ev = evaluate(model, tr, "none")
    k = next(x for x in ev["kernels"] if "paged_table" in x["kernel"])
    assert k["precision"] == 1.0 and k["recall"] == 1.0, k
    assert_online_is_batch(model, tr)


K_QROWS = Kernel("query_rows", [("out", "float*"), ("q", "const float*"), ("qsl", "const int*"), ("num_seqs", "int"),
                                ("row_floats", "int")],
                 {"out": "indexed", "q": "indexed", "qsl": "linear"})
QROW_FLOATS, QROWS_MAX = 4096, 2048   # 16 KiB rows; persistent buffers of 2048 rows (32 MiB)


def _query_rows(seed: int, max_seqs: int, q_hi: int, steps: int = 30) -> Builder:
    """A unified attention's query and output buffers: persistent, 2048 rows of 16 KiB, of which
    a launch reads and writes the batch's tokens, the last of `num_seqs + 1` query start offsets
    (recorded), which no argument gives (the grid is over sequences and blocks of queries)."""
    b = Builder("query-rows", seed=seed)
    rng = b.rng
    out = b.malloc(4 * QROW_FLOATS * QROWS_MAX, "out")
    q = b.malloc(4 * QROW_FLOATS * QROWS_MAX, "q")
    qsl = b.malloc(4 * 64, "qsl")
    for _ in range(steps):
        n = int(rng.integers(1, max_seqs + 1))
        ql = rng.integers(1, q_hi, n)
        offs = np.r_[0, np.cumsum(ql)].astype("<i4")
        ntok = int(offs[-1])
        i0 = b.reserve(1)
        b.launch(K_QROWS, [i0], {"out": out.ptr(), "q": q.ptr(), "qsl": qsl.ptr(), "num_seqs": n,
                                 "row_floats": QROW_FLOATS}, grid=(n + ntok // 8, 2),
                 touches=[Range(qsl, 0, 4 * (n + 1)), Range(q, 0, 4 * QROW_FLOATS * ntok),
                          Range(out, 0, 4 * QROW_FLOATS * ntok, WRITE)])
        b.values(K_QROWS, "qsl", [i0], qsl.ptr(), offs[None])
    return b


@pytest.mark.parametrize("from_truth", [False, True])
def test_rows_up_to_a_count_another_buffer_holds(tmp_path, capsys, from_truth):
    """Persistent query and output buffers read and written up to the batch's token count, the
    query start offsets' entry at the number of sequences: no argument gives it, so no range fits,
    and the buffers are never whole. Fitted from faults and from truth as the buffers' first rows
    up to that value, written readably and kept through the model file; a run with more and
    longer sequences is predicted exactly, batch == online; a region with no index, no lengths and
    no count buffer is refused in one line."""
    from pagecast.cli import main
    from pagecast.predict.truth_obs import truth_observations
    paths = [_query_rows(s, m, h).write(tmp_path / f"q{s}.pctrace") for s, m, h in ((1, 4, 40), (2, 6, 60))]
    traces = [T.read_trace(p) for p in paths]
    model = fit_model([truth_observations(t) for t in traces] if from_truth else traces)
    km = next(km for n, km in model.kernels.items() if "query_rows" in n)
    texts = {x.base: x.text() for x in km.regions}
    assert texts["p0"] == "[p0, p0 + 16384*v(p2)[p3])", texts
    assert texts["p1"] == "[p1, p1 + 16384*v(p2)[p3])", texts
    save_model(model, tmp_path / "m.json")
    again = load_model(tmp_path / "m.json").kernels[km.name]
    assert {x.base: x.text() for x in again.regions} == texts
    tr = T.read_trace(_query_rows(3, 12, 150).write(tmp_path / "q3.pctrace"))
    ev = evaluate(model, tr, "none")
    k = next(x for x in ev["kernels"] if "query_rows" in x["kernel"])
    assert k["precision"] == 1.0 and k["recall"] == 1.0, k
    assert_online_is_batch(model, tr)
    d = json.loads((tmp_path / "m.json").read_text())
    reg = next(x for x in d["kernels"][km.name]["regions"] if x["base"] == "p0")
    reg.pop("count_index")
    (tmp_path / "bad.json").write_text(json.dumps(d))
    assert main(["evaluate", str(tmp_path / "bad.json"), str(paths[1])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "index" in err[0], err


@pytest.mark.slow
@settings(max_examples=3, phases=[Phase.explicit, Phase.reuse, Phase.generate], **SETTINGS)
@given(drop=st.sampled_from([0.0, 0.01]), seed=st.integers(0, 10_000))
def test_one_profile_of_rows_up_to_a_count_predicts_a_larger_run(tmp_path_factory, drop, seed):
    """One profile of the persistent query and output buffers, 1% of its records lost or none:
    rows up to the query start offsets' last entry predict a run of more and longer sequences."""
    d = tmp_path_factory.mktemp("qrows")
    fit = _query_rows(seed, 6, 60, steps=40).write(d / "fit.pctrace", drop=drop)
    test = _query_rows(seed + 1, 12, 150).write(d / "test.pctrace")
    model = fit_model([T.read_trace(fit)])
    km = next(km for n, km in model.kernels.items() if "query_rows" in n)
    r = next(x for x in km.regions if x.base == "p0")
    assert r.index is None and not r.lengths and r.count_index == "p2", r.text()
    ev = evaluate(model, T.read_trace(test), "none")
    k = next(x for x in ev["kernels"] if "query_rows" in x["kernel"])
    assert k["precision"] == 1.0 and k["recall"] == 1.0, (k, r.text())


K_HEAD_MAJOR = Kernel("cache_write_head_major", [("key", "const float*"), ("key_cache", "float*"),
                                                 ("slot_mapping", "const long*"), ("block_stride", "long")],
                      {"key": "linear", "key_cache": "indexed", "slot_mapping": "linear"})
HM_HEADS, HM_DIM, HM_X = 2, 64, 4   # a head-major K cache: [block, kv head, dim / x, slot, x] float32


def _head_major(seed: int, tok_hi: int, block_tokens: int, steps: int = 24, max_tok: int = 256) -> Builder:
    """A KV-cache write through a slot mapping into a head-major cache (vLLM's ROCm layout): a
    program per padded token (the grid a power of two, the slot mapping -1 past the batch's
    tokens; each loads its key row), token t writing x floats at `block*block_bytes + h*head_bytes + g*block_tokens*16 +
    (slot % block_tokens)*16` for every head h and group g, so a slot's bytes lie all over its
    block (slot // block_tokens) and never in one run. Blocks from a pool in no order."""
    b = Builder("head-major", seed=seed)
    rng = b.rng
    pool = 512
    block_bytes = block_tokens * HM_HEADS * HM_DIM * 4
    cache = b.malloc(block_bytes * pool, "key_cache")
    key = b.malloc(4 * HM_HEADS * HM_DIM * max_tok, "key")
    slots_buf = b.malloc(8 * max_tok, "slot_mapping")
    blocks = rng.permutation(pool)
    groups = np.arange(HM_HEADS * HM_DIM // HM_X, dtype=np.int64)
    within = (groups // (HM_DIM // HM_X)) * (block_bytes // HM_HEADS) + (groups % (HM_DIM // HM_X)) * block_tokens * 16
    for step in range(steps):
        n = int(rng.integers(1, tok_hi + 1))
        padded = min(max_tok, 1 << max(1, (n - 1).bit_length()))
        blk = blocks[(step * 7 + np.arange(n) // block_tokens) % pool]
        slot = (blk * block_tokens + rng.integers(0, block_tokens, n)).astype(np.int64)
        sm = np.full(padded, -1, "<i8")
        sm[:n] = slot
        starts = ((slot // block_tokens) * block_bytes)[:, None] + within[None, :] + (slot % block_tokens)[:, None] * 16
        i0 = b.reserve(1)
        b.launch(K_HEAD_MAJOR, [i0], {"key": key.ptr(), "key_cache": cache.ptr(), "slot_mapping": slots_buf.ptr(),
                                      "block_stride": block_bytes // 4}, grid=(padded,),
                 touches=[Range(slots_buf, 0, 8 * padded), Range(key, 0, 4 * HM_HEADS * HM_DIM * padded),
                          Ranges(cache, np.zeros(starts.size, np.int64), starts.reshape(-1), 16, WRITE)])
        b.values(K_HEAD_MAJOR, "slot_mapping", [i0], slots_buf.ptr(), sm[None])
    return b


@pytest.mark.slow
@settings(max_examples=2, phases=[Phase.explicit, Phase.reuse, Phase.generate], **SETTINGS)
@given(drop=st.sampled_from([0.0, 0.01]), seed=st.integers(0, 10_000))
@example(drop=0.01, seed=353)
def test_a_slot_mappings_values_over_the_block_size_select_a_head_major_caches_blocks(tmp_path_factory, drop, seed):
    """One profile of a head-major cache write (16-token blocks of 8 KiB, two pages), 1% of its
    records lost or none: no stride of the slot itself puts a slot's bytes in one chunk that
    holds its fault pages, so the slot is divided by the block size before the block's stride
    multiplies it (`value_div`), written readably and kept through the model file; a run with
    batches twice as large is predicted exactly, batch == online. (With 32-token blocks, four
    pages, a profile this short can leave the divisor at half a block: its faults, one per big
    page, need not show the other half; docs/template-model.md.)"""
    block_tokens = 16
    d = tmp_path_factory.mktemp("headmajor")
    fit = _head_major(seed, 64, block_tokens, steps=40).write(d / "fit.pctrace", drop=drop)
    model = fit_model([T.read_trace(fit)])
    km = next(km for n, km in model.kernels.items() if "cache_write_head_major" in n)
    r = next(x for x in km.regions if x.base == "p1")
    bb = block_tokens * HM_HEADS * HM_DIM * 4
    assert r.text() == f"[p1 + {bb}*floor(v64(p2)[i] / {block_tokens}), +{bb}) for i < grid_x", r.text()
    save_model(model, d / "m.json")
    again = load_model(d / "m.json").kernels[km.name].regions[[x.base for x in km.regions].index("p1")]
    assert again.value_div == block_tokens and again.text() == r.text()
    tr = T.read_trace(_head_major(seed + 1, 128, block_tokens).write(d / "test.pctrace"))
    ev = evaluate(model, tr, "none")
    k = next(x for x in ev["kernels"] if "cache_write_head_major" in x["kernel"])
    assert k["precision"] == 1.0 and k["recall"] == 1.0, (k, r.text())
    assert_online_is_batch(model, tr)


def test_a_bad_value_divisor_is_refused(tmp_path, capsys):
    from pagecast.cli import main
    p = _head_major(1, 24, 16, steps=10).write(tmp_path / "h.pctrace")
    save_model(fit_model([T.read_trace(p)]), tmp_path / "m.json")
    d = json.loads((tmp_path / "m.json").read_text())
    km = next(k for n, k in d["kernels"].items() if "cache_write_head_major" in n)
    reg = next(x for x in km["regions"] if x["base"] == "p1")
    assert reg["value_div"] == 16, reg
    reg["value_div"] = 0
    (tmp_path / "bad.json").write_text(json.dumps(d))
    assert main(["evaluate", str(tmp_path / "bad.json"), str(p)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "value_div" in err[0], err


def test_online_row_counts_take_count_sub_as_the_batch_path_does():
    """A count value below 0 counts as 0 before the count_sub's value is taken (as `less_sub` in
    the batch path), and a filter's rows read nothing."""
    import dataclasses

    from pagecast.predict.indexed import row_counts
    from pagecast.predict.model_io import RowFilter, RowValue
    r = Region("p2", "indexed", count_sub=RowValue("p4", 4))
    sub = np.array([2, 1, 7, -3], "<i4").tobytes()
    got = row_counts(r, np.array([-1, 5, 3, -2]), None, sub)
    assert got.tolist() == [-2, 4, -4, 3]
    rf = dataclasses.replace(r, row_filter=RowFilter("p5", 4, op="le", value=1))
    got = row_counts(rf, np.array([4, 5, 3, 9]), np.array([1, 2, 0, 1], "<i4").tobytes(), sub)
    assert got.tolist() == [2, 0, -4, 12]
