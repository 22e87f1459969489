"""The compiled online predictor (pagecast.predict.compiled) against its peers: the batch predictor on
every launch of every workload model, `OnlinePredictor` (the Python path it replaces) on those and on
random models and launches (hypothesis), the history fallback fed the same pages, model changes,
parameter layouts the model did not see, lazily resolved allocations and short buffers."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagecast import footprints as FP
from pagecast import trace as T
from pagecast.jit import entry_point
from pagecast.predict import compiled_kernels as CK
from pagecast.predict.compiled import CompiledPredictor
from pagecast.predict.formula import Formula
from pagecast.predict.model_io import KernelModel, Model, Region
from pagecast.predict.predictor import OnlinePredictor, predict_footprints

PS = 4096


def _fitted(names, d):
    """(name, model fitted on one trace, another trace) for each of these workload models."""
    from pagecast.datasets.registry import make_trace
    from pagecast.predict.fit import fit_model
    out = []
    for name in names:
        fit = T.read_trace(make_trace(name, d / f"{name}-fit.pctrace", scale=0.05, seed=1))
        run = T.read_trace(make_trace(name, d / f"{name}-run.pctrace", scale=0.1, seed=3))
        out.append((name, fit_model([fit]), run))
    return out


@pytest.fixture(scope="module")
def workloads(tmp_path_factory):
    """Every workload model (fitting them all takes about half a minute: the tests are slow)."""
    from pagecast.datasets.registry import WORKLOADS
    return _fitted(WORKLOADS, tmp_path_factory.mktemp("workloads"))


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """stream and jacobi2d (whose formulas read the grid), fitted in a second."""
    return _fitted(["stream", "jacobi2d"], tmp_path_factory.mktemp("two"))


def args_of(row):
    return (row[T.KERNEL], row[T.PARAM_DATA], tuple(row[T.PARAM_OFFSETS]), tuple(row[T.PARAM_SIZES]),
            tuple(row[c] for c in T.GRID_COLUMNS[:3]), tuple(row[c] for c in T.GRID_COLUMNS[3:]))


def replay(trace, predictors, observe: bool = False):
    """Each launch predicted by every predictor, allocations added at their first launch and freed
    after their last, as a run sees them; with `observe`, each launch's true pages are observed
    afterwards (the history fallback's feedback). Each launch's indexed regions get the values the
    trace recorded for it, as a runtime hands them once their writer has ended (the batch
    predictor reads the same rows). Yields (launch, [prediction per predictor])."""
    from pagecast import values as V
    im = V.image(trace) if trace.values is not None else None
    born: dict[int, list] = {}
    dead: dict[int, list] = {}
    for a in trace.allocations.to_pylist():
        born.setdefault(a[T.FIRST_LAUNCH], []).append(a)
        if a[T.LAST_LAUNCH] is not None:
            dead.setdefault(a[T.LAST_LAUNCH] + 1, []).append(a)
    truth = FP.truth_footprints(trace) if observe else None
    for t, row in enumerate(trace.launches.to_pylist()):
        for a in dead.get(t, []):
            for p in predictors:
                p.free_allocation(a[T.ADDRESS])
        for a in born.get(t, []):
            for p in predictors:
                p.add_allocation(a[T.ADDRESS], a[T.BYTES])
        def values(addr, nb, t=t):
            r = int(im.find(np.array([t]), np.array([addr], np.uint64))[0])
            return None if r < 0 else im.data(r)[:nb]
        yield t, [p.predict(*args_of(row), values=values if im is not None else None) for p in predictors]
        if observe:
            s, e = truth.of(t)
            for p in predictors:
                p.observe(row[T.KERNEL], list(zip(s.tolist(), e.tolist())))


@pytest.mark.slow
@pytest.mark.parametrize("fallback", ["none", "allocation"])
def test_identical_to_the_batch_predictor_on_every_launch_of_every_workload_model(workloads, fallback):
    for name, model, run in workloads:
        batch = predict_footprints(model, run, fallback)
        ref, comp = OnlinePredictor(model, fallback), CompiledPredictor(model, fallback).warm()
        n = 0
        for t, (a, b) in replay(run, [ref, comp]):
            s, e = batch.of(t)
            assert [x for x in b if x[1] > x[0]] == list(zip(s.tolist(), e.tolist())), (name, t)
            assert a == b, (name, t)
            n += len(b)
        assert n > 0, name


@pytest.mark.slow
def test_the_history_fallback_fed_the_same_pages_predicts_the_same(workloads):
    """Observed pages (what feedback hands the predictor) rebuild the compiled program's history."""
    for name, model, run in workloads:
        ref, comp = OnlinePredictor(model, "history"), CompiledPredictor(model, "history").warm()
        for t, (a, b) in replay(run, [ref, comp], observe=True):
            assert a == b, (name, t)
        assert comp._history == ref._history


def test_the_runner_seam_gives_byte_ranges_of_the_same_pages(two):
    from pagecast.collect.launch_hook import LaunchArgs
    name, model, run = next(w for w in two if w[0] == "jacobi2d")   # its formulas read the grid
    assert any(e[3] for e in CompiledPredictor(model, "none")._entries.values())
    ref, comp = OnlinePredictor(model, "none"), CompiledPredictor(model, "none").warm()
    for a in run.allocations.to_pylist():
        ref.add_allocation(a[T.ADDRESS], a[T.BYTES])
        comp.add_allocation(a[T.ADDRESS], a[T.BYTES])
    for row in run.launches.to_pylist():
        la = LaunchArgs.from_row(row)
        n = comp.predict_args(la, la.param_data)
        want = [(s * PS, (e - s) * PS) for s, e in ref.predict(*args_of(row)) if e > s]
        assert comp.ranges(n) == want
        assert comp.predict_into(*args_of(row)) == n and comp.ranges(n) == want
        assert comp.predict_args(la, bytearray(la.param_data)) == n and comp.ranges(n) == want


def test_a_model_changed_by_feedback_is_compiled_again(two):
    from pagecast.predict.feedback import apply_feedback
    name, model, run = next(w for w in two if w[0] == "jacobi2d")
    import copy
    model = copy.deepcopy(model)
    ref, comp = OnlinePredictor(model, "none"), CompiledPredictor(model, "none").warm()
    rows = run.launches.to_pylist()
    for a in run.allocations.to_pylist():
        ref.add_allocation(a[T.ADDRESS], a[T.BYTES])
        comp.add_allocation(a[T.ADDRESS], a[T.BYTES])
    truth = FP.truth_footprints(run)
    changed = 0
    for t, row in enumerate(rows[:300]):
        assert ref.predict(*args_of(row)) == comp.predict(*args_of(row)), t
        s, e = truth.of(t)
        if t % 7 == 0 and len(s):   # pretend the last page was missed: feedback edits the model
            changed += apply_feedback(model, run, t, e[-1:] - 1 + 0 * s[-1:], e[-1:] + 3)
    assert changed and comp._compiled_version == model.version_counter


def test_a_layout_the_model_did_not_see():
    """Other offsets, same sizes: a program row of its own; other sizes: the fallback, as before."""
    base = 1 << 40
    km = KernelModel("k", (8, 4), (0, 8), regions=[Region("p0", "linear", start=Formula(0, ()),
                                                          end=Formula(0, ((4, ("p1",)),)))])
    model = Model(kernels={"k": km})
    for fb in ("none", "allocation"):
        ref, comp = OnlinePredictor(model, fb), CompiledPredictor(model, fb).warm()
        for p in (ref, comp):
            p.add_allocation(base, 1 << 24)
        cases = [(struct.pack("<Qi", base, 5000) + b"\0" * 4, (0, 8), (8, 4)),
                 (struct.pack("<Q4xi", base, 9000), (0, 12), (8, 4)),          # the int moved
                 (struct.pack("<Qq", base, 9000), (0, 8), (8, 8)),             # another size
                 (struct.pack("<Qi", base, 5000) + b"\0" * 4, None, None)]
        for data, offs, sizes in cases:
            assert ref.predict("k", data, offs, sizes) == comp.predict("k", data, offs, sizes), (fb, offs, sizes)
        with pytest.raises(struct.error):
            ref.predict("k", b"\0" * 9, (0, 8), (8, 4))
        with pytest.raises(struct.error):
            comp.predict("k", b"\0" * 9, (0, 8), (8, 4))


def test_pointers_are_resolved_once_and_misses_remembered_until_invalidated():
    base = 1 << 40
    km = KernelModel("k", (8, 8), (0, 8), regions=[Region("p0", "allocation"), Region("p1", "allocation")])
    model = Model(kernels={"k": km})
    live = {base: 1 << 22}
    asked: list[int] = []

    def resolve(v):
        asked.append(v)
        for a, n in live.items():
            if a <= v < a + n:
                return a, n
        return None

    comp, ref = CompiledPredictor(model, "none").warm(), OnlinePredictor(model, "none")
    comp.resolve = ref.resolve = resolve
    data = struct.pack("<QQ", base + 100, base + (1 << 30))
    assert comp.predict("k", data) == ref.predict("k", data) == [(base // PS, (base + (1 << 22)) // PS)]
    asked.clear()
    for _ in range(5):
        comp.predict("k", data)
    assert asked == []                                  # the hit is in the table, the miss remembered
    live[base + (1 << 30)] = 1 << 21                    # an allocation appears where the miss was
    assert comp.predict("k", data) == [(base // PS, (base + (1 << 22)) // PS)]
    comp.invalidate_misses()                            # the runner's allocation cache changed
    assert comp.predict("k", data) == ref.predict("k", data) and len(comp.predict("k", data)) == 2


def test_a_resolver_answering_against_the_table_falls_back_to_the_python_path():
    """Two overlapping allocations known (a stale one not freed): the table finds another allocation
    than the resolver's; that launch is predicted as before, by OnlinePredictor."""
    base = 1 << 40
    km = KernelModel("k", (8,), (0,), regions=[Region("p0", "allocation")])
    model = Model(kernels={"k": km})
    comp, ref = CompiledPredictor(model, "none").warm(), OnlinePredictor(model, "none")
    for p in (comp, ref):
        p.add_allocation(base + (1 << 20), 4096)        # stale, inside the real one
        p.resolve = lambda v: (base, 1 << 24)
    data = struct.pack("<Q", base + (3 << 20))
    assert comp.predict("k", data) == ref.predict("k", data) == [(base // PS, (base + (1 << 24)) // PS)]


def test_entry_points_answer_as_the_dispatcher_does(two):
    name, model, run = two[0]
    comp = CompiledPredictor(model, "allocation").warm()
    assert comp._call is not CK.predict_launch        # the direct entry, not the dispatcher
    for a in run.allocations.to_pylist():
        comp.add_allocation(a[T.ADDRESS], a[T.BYTES])
    for row in run.launches.slice(0, 50).to_pylist():
        e = comp._entries[row[T.KERNEL]]
        st1, st2 = comp.st.copy(), comp.st.copy()
        assert CK.predict_launch(st1, row[T.PARAM_DATA], e[0]) == comp._call(st2, row[T.PARAM_DATA], e[0])
        assert np.array_equal(st1, st2)
    f = entry_point(CK.find_alloc, comp.st, 5)
    assert f(comp.st, int(comp.st[comp.st[CK.M_TABLE] + 1])) == 0


# ---- random models and launches ---------------------------------------------------------------

WORDS = ["p1", "p2", "p3", "p4.w0", "p4.w1", "p4.w1:u", "grid_x", "block_x"]


@st.composite
def formula(draw, small: bool = False):
    """const + up to three terms; a term multiplies one feature, or two of the 1-2 byte ones (no
    int64 overflow: the Python path's ints would not wrap)."""
    terms = []
    for _ in range(draw(st.integers(0, 3))):
        if draw(st.booleans()):
            names = (draw(st.sampled_from(WORDS)),)
        else:
            names = (draw(st.sampled_from(["p2", "p3"])), draw(st.sampled_from(["p2", "p3"])))
        terms.append((draw(st.integers(-(1 << 12), 1 << 12) if not small else st.integers(-64, 64)), names))
    return Formula(draw(st.integers(-(1 << 20), 1 << 20)), tuple(terms))


@st.composite
def region(draw):
    cls = draw(st.sampled_from(["fixed", "linear", "strided", "allocation", "irregular"]))
    base = draw(st.sampled_from(["p0", "p5"]))
    if cls == "fixed":
        return Region(base, cls, start=Formula(draw(st.integers(-8192, 1 << 20))),
                      end=Formula(draw(st.integers(-8192, 1 << 21))))
    if cls == "linear":
        return Region(base, cls, start=draw(formula()), end=draw(formula()))
    if cls == "strided":
        return Region(base, cls, start=draw(formula()), count=draw(formula(small=True)),
                      chunk=draw(formula()), stride=draw(formula()))
    if cls == "irregular":
        hist = sorted({(s, s + draw(st.integers(1, 40))) for s in draw(st.lists(st.integers(0, 600), max_size=4))})
        return Region(base, cls, history=[list(h) for h in hist])
    return Region(base, cls)


# layout: p0 pointer, p1 int32, p2 int8, p3 int16, p4 a 8-byte struct, p5 pointer
SIZES, OFFSETS = (8, 4, 1, 2, 8, 8), (0, 8, 12, 14, 16, 24)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(regions=st.lists(region(), min_size=0, max_size=4), note=st.booleans(),
       fallback=st.sampled_from(["none", "allocation", "history"]),
       launches=st.lists(st.tuples(st.integers(-3, 3), st.binary(min_size=16, max_size=16), st.integers(0, 2),
                                   st.integers(1, 4096), st.integers(1, 1024)), min_size=1, max_size=6))
def test_random_models_and_launches_predict_as_the_python_path(regions, note, fallback, launches):
    base = 1 << 40
    km = KernelModel("k", SIZES, OFFSETS, regions=regions, note="irregular" if note and not regions else "")
    model = Model(kernels={"k": km})
    ref, comp = OnlinePredictor(model, fallback), CompiledPredictor(model, fallback).warm()
    allocs = [(base, 1 << 22), (base + (8 << 20), 12345), (base + (16 << 20), 0)]
    for p in (ref, comp):
        for a, n in allocs:
            p.add_allocation(a, n)
        p.observe("k", [(base // PS + 3, base // PS + 9)])
    for k, (shift, mid, which, gx, bx) in enumerate(launches):
        p0 = allocs[which][0] + shift * 4096 + (0 if shift >= 0 else allocs[which][1])
        data = struct.pack("<Q", p0) + mid + struct.pack("<Q", allocs[(which + 1) % 3][0] + 64)
        kernel = "k" if k % 3 else "unseen"
        got = [p.predict(kernel, data, OFFSETS, SIZES, (gx, 1, 1), (bx, 1, 1)) for p in (ref, comp)]
        assert got[0] == got[1]


# one program of each kind: Triton's tutorials in preallocated buffers (prefixes of one allocation),
# the data-dependent gathers, Liger's ops in fresh tensors (each recording starts the interpreter:
# seconds each)
CORPUS_PROGRAMS = ("tutorials-prealloc", "data-dependent", "liger")


@pytest.fixture(scope="module")
def corpus_traces(tmp_path_factory):
    """(name, model fitted on one recording, another) for the real-kernel corpus (datasets/corpus),
    recorded under Triton's interpreter; skipped where the corpus or what it runs on is missing."""
    import importlib.util
    import warnings
    corpus = pytest.importorskip("pagecast.datasets.corpus", reason="the real-kernel corpus is not in this tree")
    from pagecast.datasets.registry import make_trace
    from pagecast.predict.fit import fit_model
    d = tmp_path_factory.mktemp("corpus")
    out = []
    for name in CORPUS_PROGRAMS:
        if any(importlib.util.find_spec(m) is None for m in corpus.get(name).needs):
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", T.TraceWarning)
            fit = T.read_trace(make_trace(name, d / f"{name}-1", scale=0.2, seed=1))
            run = T.read_trace(make_trace(name, d / f"{name}-3", scale=0.15, seed=3))
        out.append((name, fit_model([fit]), run))
    if not out:
        pytest.skip("the corpus needs torch and triton (pagecast[interpret])")
    return out


@pytest.mark.slow
def test_identical_to_the_batch_predictor_on_the_real_kernel_corpus(corpus_traces):
    for name, model, run in corpus_traces:
        for fallback in ("none", "allocation"):
            batch = predict_footprints(model, run, fallback)
            ref, comp = OnlinePredictor(model, fallback), CompiledPredictor(model, fallback).warm()
            for t, (a, b) in replay(run, [ref, comp]):
                s, e = batch.of(t)
                assert [x for x in b if x[1] > x[0]] == list(zip(s.tolist(), e.tolist())), (name, fallback, t)
                assert a == b, (name, fallback, t)
        ref, comp = OnlinePredictor(model, "history"), CompiledPredictor(model, "history").warm()
        for t, (a, b) in replay(run, [ref, comp], observe=True):
            assert a == b, (name, "history", t)
