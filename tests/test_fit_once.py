"""Fitting from what one user collects (docs/template-model.md, "Lost records" and "What the fit
does not know"): the loss rate a trace's own records show where its manifest does not count it."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagecast import trace as T
from pagecast.predict.fit import FitParams, fit_model, record_loss
from pagecast.predict.synth import SynthTrace

SETTINGS = dict(deadline=None, derandomize=True, max_examples=15,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _gather_program(n_launches: int, rng) -> SynthTrace:
    """One kernel reading scattered big pages of a large buffer: many records per launch."""
    stt = SynthTrace()
    buf = stt.malloc(1 << 26)
    for _ in range(n_launches):
        pages = np.unique(rng.integers(0, 1 << 10, size=40))
        stt.launch("g", [("Q", buf), ("i", 40)], [(buf + int(p) * 65536, 4096) for p in pages])
    return stt


@settings(**SETTINGS)
@given(drop=st.sampled_from([0.0, 0.005, 0.01, 0.03, 0.05]), seed=st.integers(0, 1000))
def test_uncounted_loss_is_estimated_from_lone_records(tmp_path_factory, drop, seed):
    """Faults without their migration and migrations without their fault: each share estimates the
    loss rate; the estimate (an upper confidence bound) covers the true rate and stays near it."""
    d = tmp_path_factory.mktemp("loss")
    prog = _gather_program(120, np.random.default_rng(seed))
    counted = T.read_trace(prog.write(d / "c.pctrace", drop=drop, seed=seed))
    uncounted = T.read_trace(prog.write(d / "u.pctrace", drop=drop, seed=seed, count_dropped=False))
    p = FitParams()
    c, u = record_loss(counted, p), record_loss(uncounted, p)
    assert c.source == "manifest" and abs(c.rate - drop) < 0.01
    assert u.source == "estimated"
    assert drop * 0.6 <= u.rate <= drop * 1.6 + 0.006, (drop, u)


def test_no_migrations_to_compare_assumes_the_default(tmp_path):
    """A recorder that keeps no coherence migrations gives nothing to estimate from: the fit
    assumes FitParams.assumed_loss, and the model says so per trace."""
    prog = _gather_program(20, np.random.default_rng(1))
    tr = T.read_trace(prog.write(tmp_path / "t.pctrace", count_dropped=False))
    tables = tr.tables()
    tables[T.MIGRATIONS] = tables[T.MIGRATIONS].slice(0, 0)
    man = {k: v for k, v in tr.manifest.items() if k != "dropped_records"}
    bare = T.read_trace(T.write_trace(tmp_path / "bare.pctrace", man, tables, force=True))
    lo = record_loss(bare, FitParams())
    assert lo.source == "assumed" and lo.rate == FitParams().assumed_loss
    m = fit_model([bare, tr])
    assert [t["loss_source"] for t in m.traces] == ["assumed", "estimated"]


def _rows_program(sizes: list[int], reps: int, elem: int, rng) -> SynthTrace:
    """`k(a, b, n)` reads [a, a + elem*n) and writes [b, b + elem*n), buffers allocated at the largest size."""
    stt = SynthTrace()
    top = max(sizes) * elem
    a, b = stt.malloc(top), stt.malloc(top)
    order = [n for n in sizes for _ in range(reps)]
    for i in rng.permutation(len(order)):
        n = int(order[i])
        stt.launch("k", [("Q", a), ("Q", b), ("i", n)], [(a, elem * n), (b, elem * n)])
    return stt


@settings(**SETTINGS)
@given(elem=st.sampled_from([1, 2, 4, 8]), n_sizes=st.integers(8, 14), seed=st.integers(0, 1000))
def test_sizes_that_vary_are_cross_validated_and_pinned(tmp_path_factory, elem, n_sizes, seed):
    """Regions of many sizes: each half of the launch groups alone gives the full fit's templates
    (split-half cross-validation agrees), and the model says they are pinned down."""
    rng = np.random.default_rng(seed)
    pages = np.unique(rng.integers(40, 400, size=n_sizes))
    sizes = [int(p) * 4096 // elem + int(rng.integers(0, 64)) for p in pages]
    d = tmp_path_factory.mktemp("cv")
    tr = T.read_trace(_rows_program(sizes, 3, elem, rng).write(d / "t.pctrace", seed=seed))
    km = fit_model([tr]).kernels["k"]
    assert km.pinned is not None and km.pinned.groups == len(set(sizes))
    assert km.pinned.cv == "agree" and km.pinned.pinned, km.pinned.text()


def test_one_size_gives_constants_and_few_sizes_are_not_cross_validated(tmp_path):
    """Nothing varied: constant templates, pinned for runs with the same arguments; two sizes:
    too few launch groups to cross-validate, and the model says so (and keeps saying so on load)."""
    from pagecast.predict.model_io import load_model, save_model
    rng = np.random.default_rng(3)
    one = T.read_trace(_rows_program([50_000], 8, 4, rng).write(tmp_path / "one.pctrace"))
    km = fit_model([one]).kernels["k"]
    assert km.pinned.groups == 1 and all(not f.terms for r in km.regions for f in r.formulas().values())
    assert km.pinned.pinned and km.pinned.unvaried == []
    two = T.read_trace(_rows_program([50_000, 90_000], 8, 4, rng).write(tmp_path / "two.pctrace"))
    m = fit_model([two])
    assert m.kernels["k"].pinned.cv == "too few groups" and not m.kernels["k"].pinned.pinned
    back = load_model(save_model(m, tmp_path / "m.json"))
    assert back.kernels["k"].pinned == m.kernels["k"].pinned


def _kv_program(pos0: int, steps: int, heads: int, head_dim: int, max_seq: int, layers: int) -> SynthTrace:
    """`append(cache, pos, max_seq, heads, head_dim)` writes one row of `2*head_dim` bytes per head
    at `pos` of a [heads, max_seq, head_dim] bf16 cache: a decode loop's KV append."""
    stt = SynthTrace()
    row = 2 * head_dim
    caches = [stt.malloc(heads * max_seq * row) for _ in range(layers)]
    for pos in range(pos0, pos0 + steps):
        for c in caches:
            stt.launch("append", [("Q", c), ("i", pos), ("i", max_seq), ("i", heads), ("i", head_dim)],
                       [(c + h * max_seq * row + pos * row, row) for h in range(heads)])
    return stt


@settings(**{**SETTINGS, "max_examples": 6})
@given(heads=st.sampled_from([2, 4, 8]), head_dim=st.sampled_from([128, 256]),
       max_seq=st.sampled_from([1024, 2048]), pos0=st.integers(64, 600), seed=st.integers(0, 100))
def test_a_row_per_head_follows_the_position_from_one_profile(tmp_path_factory, heads, head_dim, max_seq, pos0, seed):
    """One profile of a decode loop (40 steps, its rows crossing at least two page boundaries:
    where they all lie in one page, nothing tells a constant start from pos) whose rows lie under
    a page: the fault pages show where each row is; the strided template that puts its chunks on them (start following pos)
    is far likelier than one spreading each chunk over its big page, and predicts another run's
    positions exactly."""
    d = tmp_path_factory.mktemp("kv")
    fit_tr = T.read_trace(_kv_program(pos0, 40, heads, head_dim, max_seq, 4).write(d / "fit.pctrace", seed=seed))
    test_tr = T.read_trace(_kv_program(pos0 + 300, 20, heads, head_dim, max_seq, 4).write(d / "test.pctrace",
                                                                                           seed=seed + 1))
    from pagecast import footprints as FP
    from pagecast.predict.predictor import predict_footprints
    m = fit_model([fit_tr])
    pred, truth = predict_footprints(m, test_tr, "none"), FP.truth_footprints(test_tr)
    inter = int(FP.intersection_pages(pred, truth).sum())
    assert inter == int(truth.pages_per_launch().sum()) == int(pred.pages_per_launch().sum()), \
        [r.text() for r in m.kernels["append"].regions]
