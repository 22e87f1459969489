"""The predictor: fitting, batch/online prediction, evaluation, feedback, model file, commands."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from pagecast import footprints as FP
from pagecast import trace as T
from pagecast.cli import main
from pagecast.errors import ModelError, TraceError
from pagecast.predict.evaluate import evaluate
from pagecast.predict.feedback import apply_feedback, feedback_from_trace
from pagecast.predict.fit import fit_model
from pagecast.predict.formula import Formula
from pagecast.predict.model_io import load_model, save_model
from pagecast.predict.predictor import OnlinePredictor, predict_footprints, predict_ranges
from pagecast.predict.synth import PS, SynthTrace, vector_workload


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    d = tmp_path_factory.mktemp("synth")
    paths = []
    for scale, seed in [(1, 1), (3, 2), (2, 3)]:
        p = d / f"s{scale}.pctrace"
        vector_workload(scale, seed).write(p, drop=0.001, seed=seed)
        paths.append(p)
    return [T.read_trace(p) for p in paths]


@pytest.fixture(scope="module")
def model(synth):
    return fit_model(synth[:2])


def test_classes_and_formulas(model):
    k = model.kernels
    assert [r.text() for r in k["vadd"].regions] == ["[p0, p0 + 4*p3)", "[p1, p1 + 4*p3)", "[p2, p2 + 4*p3)"]
    assert k["reduce"].regions[0].cls == "linear" and k["reduce"].regions[1].cls == "fixed"
    sl = k["slice"].regions[0]
    assert sl.cls == "strided"
    # C (p3) is constant in these traces: 4*p2*p3 and 64*p2 are the same stride
    assert sl.count.text() == "4" and sl.chunk.text() == "4*p2" and sl.stride.text() in ("4*p2*p3", "64*p2")
    assert sl.start.text() == "4*p1*p2"
    assert k["gather"].cls == "irregular"
    st = {r.base: r for r in k["stencil"].regions}
    assert st["p1"].text() == "[p1, p1 + 4*p2*p3)"
    assert st["p0"].cls in ("linear", "allocation")


def test_generalizes_to_unseen_scale(model, synth):
    e = evaluate(model, synth[2])
    d = e["determined"]
    assert d["recall"] >= 0.9975 and d["precision"] >= 0.999
    ks = {x["kernel"]: x for x in e["kernels"]}
    for name in ("vadd", "reduce", "slice", "stencil"):
        assert ks[name]["recall"] == 1.0 and ks[name]["precision"] == 1.0, ks[name]
    assert e["baseline"]["precision"] < e["determined"]["precision"]
    assert set(e["by_class"]) >= {"linear", "strided", "irregular"}
    assert e["unseen"]["launches"] == 0


def test_online_matches_batch(model, synth):
    tr = synth[2]
    batch = predict_footprints(model, tr, "none")
    op = OnlinePredictor(model, "none")
    for a in tr.allocations.to_pylist():
        op.add_allocation(a[T.ADDRESS], a[T.BYTES], a[T.ALLOC_ID])
    for i, l in enumerate(tr.launches.to_pylist()):
        got = op.predict(l[T.KERNEL], l[T.PARAM_DATA], l[T.PARAM_OFFSETS], l[T.PARAM_SIZES],
                         tuple(l[c] for c in T.GRID_COLUMNS[:3]), tuple(l[c] for c in T.GRID_COLUMNS[3:]))
        s, e = batch.of(i)
        assert got == list(zip(s.tolist(), e.tolist())), l[T.KERNEL]


def test_predict_ranges_table(model, synth):
    t = predict_ranges(model, synth[2], "history")
    assert t.column_names == [T.LAUNCH_ID, T.ADDRESS, T.BYTES, "template"]
    assert str(t.schema.field(T.ADDRESS).type) == "uint64"
    assert set(t.column("template").to_pylist()) >= {"linear", "fixed", "strided"}
    assert all(b % PS == 0 for b in t.column(T.BYTES).to_pylist())


def test_fallbacks(model, synth):
    tr = synth[2]
    none = predict_footprints(model, tr, "none").pages_per_launch()
    alloc = predict_footprints(model, tr, "allocation").pages_per_launch()
    hist = predict_footprints(model, tr, "history").pages_per_launch()
    kern = np.array(tr.launches.column(T.KERNEL).to_pylist())
    g = kern == "gather"
    assert (none[g] == 0).all()
    assert (alloc[g] == (64 << 20) // PS).all()
    assert (hist[g] > 0).all() and (hist[g] < alloc[g]).all()


def test_model_roundtrip_and_bad_files(model, tmp_path):
    p = tmp_path / "m.json"
    save_model(model, p)
    with pytest.raises(Exception):
        save_model(model, p)  # exists, no force
    m2 = load_model(p)
    assert {k: [r.text() for r in v.regions] for k, v in m2.kernels.items()} == \
        {k: [r.text() for r in v.regions] for k, v in model.kernels.items()}
    doc = json.loads(p.read_text())
    assert doc["format"] == "pagecast-model" and doc["version"] == 1
    bad = dict(doc, version=99)
    (tmp_path / "v.json").write_text(json.dumps(bad))
    with pytest.raises(ModelError, match="version"):
        load_model(tmp_path / "v.json")
    nonsense = json.loads(p.read_text())
    nonsense["kernels"]["vadd"]["regions"][0]["end"]["terms"] = [[4, ["p99"]]]
    (tmp_path / "n.json").write_text(json.dumps(nonsense))
    with pytest.raises(ModelError, match="p99"):
        load_model(tmp_path / "n.json")
    nonsense["kernels"]["vadd"]["regions"][0]["class"] = "wobbly"
    (tmp_path / "n2.json").write_text(json.dumps(nonsense))
    with pytest.raises(ModelError, match="class"):
        load_model(tmp_path / "n2.json")
    (tmp_path / "t.json").write_text("{not json")
    with pytest.raises(ModelError, match="JSON"):
        load_model(tmp_path / "t.json")
    with pytest.raises(ModelError, match="no such"):
        load_model(tmp_path / "missing.json")


def _all_regions(doc):
    return [r for k in doc["kernels"].values() for r in k["regions"]]


BAD_MODELS = {
    # valid JSON, wrong shape: each was read (exit 0) or crashed (exit 1) before
    "version-true": (lambda d: d.update(version=True), "version is True"),
    "big-page-zero": (lambda d: d.update(big_page=0), "big_page must be an integer >= 4096"),
    "big-page-string": (lambda d: d.update(big_page="x"), "big_page must be an integer"),
    "big-page-not-power-of-two": (lambda d: d.update(big_page=5000), "big_page must be a power of two"),
    "const-beyond-int64": (lambda d: [r["end"].update(const=2**70) for r in _all_regions(d) if "end" in r],
                           "within"),
    "history-negative-pages": (lambda d: _all_regions(d)[0].update({"class": "irregular", "history": [[-5, -1]]}),
                               "0 <= start < end"),
    "coefficient-beyond-int64": (lambda d: [r["end"].update(terms=[[2**70, ["p2"]]])
                                            for r in _all_regions(d) if r["class"] == "linear"], "within"),
    # within int64 but overflowing it once multiplied by an argument: predictions changed silently
    "coefficient-beyond-address-space": (lambda d: [r["end"].update(terms=[[2**62, ["p2"]]])
                                                    for r in _all_regions(d) if r["class"] == "linear"],
                                         "within"),
    # found by fuzzing the CLI: compiling a 5000-term formula recursed too deep (exit 1)
    "thousands-of-terms": (lambda d: [r["end"].update(terms=[[1, ["p2"]]] * 5000)
                                      for r in _all_regions(d) if r["class"] == "linear"], "at most 64"),
}


@pytest.mark.parametrize("case", sorted(BAD_MODELS))
def test_model_of_wrong_shape_is_one_line_exit_2(model, synth, tmp_path, capsys, case):
    p = tmp_path / "m.json"
    save_model(model, p)
    doc = json.loads(p.read_text())
    damage, expect = BAD_MODELS[case]
    damage(doc)
    p.write_text(json.dumps(doc))
    with pytest.raises(ModelError, match=expect):
        load_model(p)
    assert main(["evaluate", str(p), str(synth[0].path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and expect in err


def test_feedback_replaces_and_demotes(synth, tmp_path):
    m = fit_model(synth[:2])
    r = m.kernels["vadd"].regions[0]
    r.end = Formula(0, ((2, ("p3",)),))            # break it: half the vector
    tr = synth[2]
    truth = FP.truth_footprints(tr)
    s, e = truth.of(0)
    assert apply_feedback(m, tr, 0, s[:1], e[:1])
    assert r.text() == "[p0, p0 + 4*p3)"            # the simplest formula explaining all evidence
    assert not apply_feedback(m, tr, 0, s[:1], e[:1])  # nothing missed any more
    # without evidence: a near miss widens, one far away demotes to irregular
    r2 = m.kernels["vadd"].regions[1]
    r2.fit.pop("evidence")
    r2.end = Formula(0, ((4, ("p3",)),))
    e1 = e[1]
    r2.end = Formula(-8 * PS, ((4, ("p3",)),))
    v = m.version_counter
    assert apply_feedback(m, tr, 0, np.array([e1 - 8]), np.array([e1]))
    assert r2.cls == "linear" and r2.fit["widened_by_feedback"] == 1 and m.version_counter > v
    r2.end = Formula(0, ((1, ("p3",)),))           # now a quarter: the miss is far
    assert apply_feedback(m, tr, 0, np.array([e1 - 8]), np.array([e1]))
    assert r2.cls == "irregular" and r2.history
    # an unseen kernel gets an irregular entry
    m3 = fit_model(synth[:2])
    del m3.kernels["gather"]
    gl = [i for i, k in enumerate(tr.launches.column(T.KERNEL).to_pylist()) if k == "gather"][0]
    s, e = FP.observed_footprints(tr).of(gl)
    assert apply_feedback(m3, tr, gl, s, e)
    assert m3.kernels["gather"].regions[0].cls == "irregular"


def test_feedback_from_trace_counts(synth):
    m = fit_model(synth[:2])
    assert feedback_from_trace(m, synth[2]) >= 0


# ---- bad input --------------------------------------------------------------------

def _small(st: SynthTrace, path, **kw):
    return T.read_trace(st.write(path, **kw))


def test_trace_without_faults(tmp_path):
    st = SynthTrace()
    a = st.malloc(1 << 20)
    st.launch("k", [("Q", a), ("i", 10)], [(a, 40)])
    tr = _small(st, tmp_path / "nf.pctrace", faults=False)
    with pytest.raises(TraceError, match="no faults"):
        fit_model([tr])
    assert main(["fit", str(tmp_path / "nf.pctrace"), "-o", str(tmp_path / "m.json")]) == 2


def test_empty_trace(tmp_path):
    st = SynthTrace()
    tr = _small(st, tmp_path / "e.pctrace")
    with pytest.raises(TraceError, match="no launches"):
        fit_model([tr])


@pytest.mark.parametrize("cmd", ["predict", "evaluate", "plan", "replay", "summary"])
def test_empty_trace_is_refused_by_every_consumer(model, tmp_path, capsys, cmd):
    # were exit 0: 'wrote 0 predicted ranges', 'precision 100% recall 100%' of nothing, an empty plan,
    # a table of zero-time runs, a summary of nothing
    st = SynthTrace()
    st.malloc(1 << 20)  # allocated, then crashed before any kernel
    _small(st, tmp_path / "e.pctrace")
    save_model(model, tmp_path / "m.json")
    m, tr, out = str(tmp_path / "m.json"), str(tmp_path / "e.pctrace"), str(tmp_path / "out")
    argv = {"predict": ["predict", m, tr, "-o", out], "evaluate": ["evaluate", m, tr],
            "plan": ["plan", m, tr, "--capacity", "1MiB", "-o", out],
            "replay": ["replay", tr, "--policy", "demand,template", "--model", m, "--capacity", "1MiB",
                       "-o", out],
            "summary": ["summary", tr]}[cmd]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "no launches (1 allocation, no kernel ran)" in err
    assert not (tmp_path / "out").exists()


def _rewrite_table(trace_dir, table, fn):
    import glob

    import pyarrow.parquet as pq
    for f in glob.glob(str(trace_dir / table / "*.parquet")):
        pq.write_table(fn(pq.read_table(f)), f)


def _nulls(t, *cols):
    import pyarrow as pa
    for c in cols:
        t = t.set_column(t.schema.get_field_index(c), c, pa.nulls(t.num_rows, t.schema.field(c).type))
    return t


@pytest.mark.parametrize("damage", ["no-allocations", "no-attribution"])
def test_fit_without_allocations_or_fault_attribution_learns_nothing_and_says_so(tmp_path, capsys, damage):
    """Found by fuzzing the CLI: an allocations table with no rows (the spec allows it), and faults
    and migrations that no launch_id or kernel time attributes, were internal errors (exit 1)."""
    st = SynthTrace()
    a = st.malloc(1 << 20)
    for n in (10, 20, 30):
        st.launch("k", [("Q", a), ("i", n)], [(a, 4096 * n)])
    p = st.write(tmp_path / "t.pctrace")
    if damage == "no-allocations":
        _rewrite_table(p, "allocations", lambda t: t.slice(0, 0))
    else:
        import shutil
        shutil.rmtree(p / "truth", ignore_errors=True)
        _rewrite_table(p, "faults", lambda t: _nulls(t, "launch_id"))
        _rewrite_table(p, "migrations", lambda t: _nulls(t, "launch_id"))
        _rewrite_table(p, "launches", lambda t: _nulls(t, "start_ns", "end_ns"))
    assert main(["fit", str(p), "-o", str(tmp_path / "m.json")]) == 0
    assert "1 kernels: 1 irregular" in capsys.readouterr().err


def test_fit_writes_no_temporary_file_and_makes_missing_directories(tmp_path):
    st = SynthTrace()
    a = st.malloc(1 << 20)
    for n in (10, 20, 30):
        st.launch("k", [("Q", a), ("i", n)], [(a, 4096 * n)])
    p = st.write(tmp_path / "t.pctrace")
    out = tmp_path / "new" / "dir" / "m.json"
    assert main(["fit", str(p), "-o", str(out)]) == 0
    assert out.exists() and [x.name for x in out.parent.iterdir()] == ["m.json"]
    assert main(["predict", str(out), str(p), "-o", str(tmp_path / "other" / "p.parquet")]) == 0


def test_force_never_replaces_a_device_or_fifo(tmp_path, capsys):
    import os
    st = SynthTrace()
    a = st.malloc(1 << 20)
    for n in (10, 20, 30):
        st.launch("k", [("Q", a), ("i", n)], [(a, 4096 * n)])
    p = st.write(tmp_path / "t.pctrace")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for argv in (["fit", str(p)], ["datasets", "make", "stream", "--scale", "0.01"]):
        assert main([*argv, "-o", str(fifo), "--force"]) == 2
        assert "not a regular file or directory" in capsys.readouterr().err
    assert fifo.exists() and not fifo.is_file()


def test_kernel_seen_once_and_no_pointer(tmp_path):
    st = SynthTrace()
    a = st.malloc(1 << 20)
    st.launch("once", [("Q", a), ("i", 1000)], [(a, 4000)])
    st.launch("noptr", [("i", 7), ("Q", 12345)], [(a, 4096)])
    st.launch("once2", [("Q", a)], [(a, 4096)])
    tr = _small(st, tmp_path / "o.pctrace")
    m = fit_model([tr])
    assert m.kernels["once"].regions[0].cls == "fixed"
    assert m.kernels["noptr"].cls == "irregular" and "points into" in m.kernels["noptr"].note
    e = evaluate(m, tr)
    assert e["overall"]["launches"] == 3


def test_unseen_kernels_use_fallback(model, tmp_path):
    st = SynthTrace()
    a = st.malloc(1 << 20)
    st.launch("brand_new", [("Q", a), ("i", 5)], [(a, 8192)])
    st.launch("brand_new", [("Q", a), ("i", 5)], [(a, 8192)])
    tr = _small(st, tmp_path / "u.pctrace")
    e = evaluate(model, tr, "history")
    assert e["unseen"]["launches"] == 2 and e["unseen"]["kernels"] == ["brand_new"]
    assert e["kernels"][0]["templates"] == ["unseen"]
    # history: the second launch is predicted from what the first touched
    pf = predict_footprints(model, tr, "history")
    assert pf.pages_per_launch()[0] == 0 and pf.pages_per_launch()[1] > 0
    ea = evaluate(model, tr, "allocation")
    assert ea["unseen"]["recall"] == 1.0


def test_commands(synth, tmp_path, capsys):
    p1, p2, p3 = (str(t.path) for t in synth)
    mp = tmp_path / "m.json"
    assert main(["fit", p1, p2, "-o", str(mp)]) == 0
    assert main(["fit", p1, p2, "-o", str(mp)]) == 2                  # exists
    assert main(["fit", p1, "-o", str(mp), "--force", "--feedback", p3]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(mp), p3, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["overall"]) >= {"precision", "recall", "predicted_bytes", "footprint_bytes", "launches"}
    assert set(doc["kernels"][0]) >= {"kernel", "templates", "launches", "precision", "recall",
                                      "predicted_bytes", "footprint_bytes"}
    assert main(["evaluate", str(mp), p3]) == 0
    out = tmp_path / "pred.parquet"
    assert main(["predict", str(mp), p3, "-o", str(out), "--fallback", "none"]) == 0
    assert main(["predict", str(mp), p3, "-o", str(out)]) == 2
    assert main(["evaluate", str(tmp_path / "nope.json"), p3]) == 2
    (tmp_path / "bad.json").write_text('{"format": "pagecast-model", "version": 7}')
    assert main(["evaluate", str(tmp_path / "bad.json"), p3]) == 2
    err = capsys.readouterr().err
    assert "version" in err and "Traceback" not in err


def test_struct_parameters_and_floats(tmp_path):
    """A struct {float* data; int n; float scale; int m} : base p0.d0, size 4*n*m from p0.w2 and p0.w4."""
    import struct as st_
    st = SynthTrace()
    bufs = [st.malloc(4 * 4096 * 64) for _ in range(2)]
    rng = np.random.default_rng(0)
    for i in range(24):
        n, m = int(rng.integers(64, 4096)), int(rng.integers(1, 64))
        b = bufs[i % 2]
        blob = st_.pack("<Qifi", b, n, 0.5 + i, m)
        st.launch("desc_kernel", [("24s", blob), ("f", 1.5)], [(b, 4 * n * m)])
    tr = _small(st, tmp_path / "s.pctrace")
    m = fit_model([tr])
    (r,) = m.kernels["desc_kernel"].regions
    assert r.base == "p0.d0"
    assert r.end.text() in ("4*p0.w2*p0.w4", "4*p0.w4*p0.w2"), r.text()
    assert "p0.w3" not in r.feature_names()  # the float word is not a size
    e = evaluate(m, tr)
    assert e["overall"]["precision"] == 1.0 and e["overall"]["recall"] == 1.0


def test_natural_mode_and_time_attribution(tmp_path):
    """Natural-mode traces have no launch ids on faults (attributed by time) and few faults: no crash."""
    tr = T.read_trace(vector_workload(1, 5).write(tmp_path / "n.pctrace", mode="natural", seed=5))
    assert tr.faults.column(T.LAUNCH_ID).null_count == tr.faults.num_rows
    m = fit_model([tr])
    assert "vadd" in m.kernels
    e = evaluate(m, tr)
    assert 0.0 <= e["overall"]["recall"] <= 1.0


def test_fit_never_reads_truth(tmp_path, synth):
    """The same traces without their truth table give the same model."""
    paths = []
    for scale, seed in [(1, 1), (3, 2)]:
        p = tmp_path / f"nt{scale}.pctrace"
        vector_workload(scale, seed).write(p, drop=0.001, seed=seed, with_truth=False)
        paths.append(p)
    a = fit_model(synth[:2])
    b = fit_model([T.read_trace(p) for p in paths])
    assert {k: [r.text() for r in v.regions] for k, v in a.kernels.items()} == \
        {k: [r.text() for r in v.regions] for k, v in b.kernels.items()}


def test_online_history_keeps_every_observed_page(model):
    """The history fallback's online record is coarsened like the batch one (to at most
    HISTORY_MAX_INTERVALS intervals when merged, twice that between merges), never cut:
    every page observed stays predicted."""
    from pagecast.predict.predictor import HISTORY_MAX_INTERVALS
    op = OnlinePredictor(model, "history")
    base = 1 << 40
    op.add_allocation(base, 8192 * PS, 7)
    rng = np.random.default_rng(5)
    pages = rng.permutation(np.arange(0, 8192, 7))[:1000]   # 1000 pages, no two adjacent
    for p in pages:
        op.observe("unseen_kernel", [(base // PS + int(p), base // PS + int(p) + 1)])
    got = op.predict("unseen_kernel", struct.pack("<Q", base), [0], [8])
    assert len(got) <= 2 * HISTORY_MAX_INTERVALS
    s = np.array([a for a, _ in got]) - base // PS
    e = np.array([b for _, b in got]) - base // PS
    k = np.searchsorted(s, pages, side="right") - 1
    assert ((k >= 0) & (pages < e[np.maximum(k, 0)])).all()
    assert sum(b - a for a, b in got) < 8192   # coarsened, not the whole allocation


def test_evaluate_counts_unexplained_launches(tmp_path, capsys):
    """evaluate reports, per kernel and overall, the launches the template left unexplained in the
    fit (lost records) and those of the evaluated trace with a fault outside the prediction."""
    from pagecast.predict.synth import SynthTrace
    st = SynthTrace()
    buf = st.malloc(64 << 20)
    for n in [40, 100, 260, 700, 1500] * 8:
        st.launch("k", [("Q", buf), ("i", n)], [(buf, 4096 * n)])
    tr = T.read_trace(st.write(tmp_path / "a.pctrace", seed=[3, 1], drop=0.05))
    m = fit_model([tr])
    r = m.kernels["k"].regions[0]
    assert r.text() == "[p0, p0 + 4096*p1)"
    ev = evaluate(m, tr)
    k = ev["kernels"][0]
    assert k["unexplained_in_fit"] == r.fit["unexplained"] == ev["overall"]["unexplained_in_fit"]
    assert k["fit_launches"] == 40 and k["launches_with_misses"] == 0
    # a model that under-predicts: the launches whose fault records it misses are counted
    r.end = type(r.end)(0, ((2048, ("p1",)),))
    ev = evaluate(m, tr)
    assert ev["kernels"][0]["launches_with_misses"] == ev["overall"]["launches_with_misses"] > 30
    save_model(m, tmp_path / "m.json")
    assert main(["evaluate", str(tmp_path / "m.json"), str(tmp_path / "a.pctrace")]) == 0
    assert "here with a fault outside the prediction" in capsys.readouterr().out
