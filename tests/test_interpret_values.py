"""`collect --interpret` records the index values (the `values` table): the integer tensors a
launch's pointers point to, as the launch began, within the per-launch limit; the corpus's
data-dependent gather and scatter are then fitted as `indexed` templates from those traces (faults
only) and predict a larger unseen run exactly."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"   # before any @triton.jit (the corpus kernels below)

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from pagecast import trace as T  # noqa: E402
from pagecast.collect.interpret import InterpretConfig, collect_interpreted  # noqa: E402
from pagecast.collect.target import Workload  # noqa: E402
from pagecast.datasets.emulate import FullModeEmulation  # noqa: E402
from pagecast.predict.evaluate import evaluate  # noqa: E402
from pagecast.predict.fit import fit_model  # noqa: E402


def _collect(path, target, **kw):
    cfg = InterpretConfig(path, Workload("script", "w", [], ["w"]), **kw)
    res = collect_interpreted(cfg, target, emulation=FullModeEmulation)
    assert res.code == 0
    return T.read_trace(path)


def _corpus(scale: float, seed: int):
    from pagecast.datasets.corpus import data_dependent
    return lambda: data_dependent.main(["--scale", str(scale), "--seed", str(seed)])


def test_values_are_the_integer_buffers_as_the_launch_began(tmp_path):
    from pagecast.datasets.corpus import gather_kernels as G
    from pagecast import values as V
    idx = torch.tensor([5, 1, 7], dtype=torch.int64)
    table, out = torch.randn(8, 16), torch.empty(3, 16)

    def work():
        G.embedding_gather(idx, table, out)
        idx[0] = 2                              # the host changes the ids between launches
        G.embedding_gather(idx, table, out)
        G.embedding_gather(idx, table, out)     # the same again: the row is left out, found all the same
    tr = _collect(tmp_path / "v.pctrace", work)
    assert tr.values is not None and tr.manifest["values"]["repeats"] == "omitted"
    im = V.image(tr)
    assert im.n_rows == 2
    lp = tr.launches.to_pylist()
    ptr = [int.from_bytes(r[T.PARAM_DATA][:8], "little") for r in lp]   # idx is the first parameter
    rows = im.find(np.arange(3), np.array(ptr, np.uint64))
    assert (rows >= 0).all()
    assert im.ints(int(rows[0]), 3, 8).tolist() == [5, 1, 7]
    assert im.ints(int(rows[1]), 3, 8).tolist() == [2, 1, 7] == im.ints(int(rows[2]), 3, 8).tolist()


def test_float_only_kernels_leave_no_values_table(tmp_path):
    from pagecast.datasets.corpus import tutorial_kernels as K
    tr = _collect(tmp_path / "f.pctrace", lambda: K.add(torch.ones(10), torch.ones(10), torch.empty(10)))
    assert tr.values is None and "values" not in tr.manifest


def test_the_limit_clips_and_counts(tmp_path):
    from pagecast.datasets.corpus import gather_kernels as G
    idx = torch.arange(100, dtype=torch.int64)
    tr = _collect(tmp_path / "c.pctrace", lambda: G.embedding_gather(idx, torch.randn(100, 16), torch.empty(100, 16)),
                  values_limit=64)
    v = tr.manifest["values"]
    assert v["limit_bytes"] == 64 and v["clipped_bytes"] == 800 - 64 and v["clipped_launches"] == 1
    assert tr.values.column(T.BYTES).to_pylist() == [64]


def test_the_corpus_gather_and_scatter_are_indexed_templates(tmp_path):
    fit = [_collect(tmp_path / f"d{s}.pctrace", _corpus(sc, s)) for s, sc in ((1, 0.5), (2, 1.0))]
    test = _collect(tmp_path / "d3.pctrace", _corpus(1.5, 3))
    model = fit_model(fit)
    for name in ("embedding_gather_kernel", "scatter_add_kernel"):
        km = model.kernels[name]
        assert "indexed" in [r.cls for r in km.regions], [r.text() for r in km.regions]
    ev = evaluate(model, test, "none")
    assert ev["indexed"]["launches"] == test.n_launches
    for k in ev["kernels"]:
        assert k["precision"] == 1.0 and k["recall"] == 1.0, k
