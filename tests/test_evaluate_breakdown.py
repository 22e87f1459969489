"""evaluate --kernel: one kernel's predicted and touched pages split by the buffer they lie in."""

from __future__ import annotations

import json

import pytest

from pagecast import trace as T
from pagecast.cli import main
from pagecast.errors import UsageError
from pagecast.predict.breakdown import ELSEWHERE
from pagecast.predict.evaluate import evaluate
from pagecast.predict.formula import Formula
from pagecast.predict.model_io import KernelModel, Model, Region, save_model
from pagecast.predict.synth import PS, SynthTrace

SIZES = [5, 20, 60, 130]   # pages of a and b the kernel reads, per launch
C_PAGES, D_PAGES, P3_AT = 256, 16, 200


def _case(tmp_path):
    """A kernel `k(a, b, c, c + 200 pages, n)` that reads n pages of a, of b and of c, one page at
    p3, and (through no parameter of its own) all of d; a model exact on a and at p3, twice too
    long on b, the whole allocation on c, and blind to d."""
    st = SynthTrace()
    a, b = st.malloc(4 << 20), st.malloc(4 << 20)
    c, d = st.malloc(C_PAGES * PS), st.malloc(D_PAGES * PS)
    for n in SIZES:
        st.launch("k", [("Q", a), ("Q", b), ("Q", c), ("Q", c + P3_AT * PS), ("q", n)],
                  [(a, n * PS), (b, n * PS), (c, n * PS), (c + P3_AT * PS, PS), (d, D_PAGES * PS)])
    path = st.write(tmp_path / "t.pctrace", seed=1)
    regions = [Region("p0", "linear", start=Formula(0), end=Formula(0, ((PS, ("p4",)),))),
               Region("p1", "linear", start=Formula(0), end=Formula(0, ((2 * PS, ("p4",)),))),
               Region("p2", "allocation"),
               Region("p3", "fixed", start=Formula(0), end=Formula(PS))]
    tr = T.read_trace(path)
    km = KernelModel("k", tuple(tr.launches.column(T.PARAM_SIZES)[0].as_py()),
                     tuple(tr.launches.column(T.PARAM_OFFSETS)[0].as_py()), regions=regions, launches=4)
    return tr, Model(page_size=PS, kernels={"k": km})


def test_each_buffers_false_and_missed_pages_are_its_own(tmp_path):
    tr, model = _case(tmp_path)
    doc = evaluate(model, tr, kernel="k")
    rows = {r["words"]: r for r in doc["buffers"]["rows"]}
    assert set(rows) == {"p0", "p1", "p2,p3", ELSEWHERE}   # two words into one allocation share a row
    n = sum(SIZES)
    assert rows["p0"]["false_bytes"] == rows["p0"]["missed_bytes"] == 0
    assert rows["p1"]["predicted_bytes"] == 2 * n * PS and rows["p1"]["false_bytes"] == n * PS
    assert rows["p2,p3"]["false_bytes"] == (len(SIZES) * (C_PAGES - 1) - n) * PS
    assert rows["p2,p3"]["missed_bytes"] == 0 and rows["p2,p3"]["launches"] == len(SIZES)
    assert rows[ELSEWHERE]["predicted_bytes"] == 0
    assert rows[ELSEWHERE]["missed_bytes"] == len(SIZES) * D_PAGES * PS
    # the rows add up to the kernel's own figures, the most over-predicted first, elsewhere last
    k = next(x for x in doc["kernels"] if x["kernel"] == "k")
    assert sum(r["predicted_bytes"] for r in rows.values()) == k["predicted_bytes"]
    assert sum(r["footprint_bytes"] for r in rows.values()) == k["footprint_bytes"]
    assert [r["words"] for r in doc["buffers"]["rows"]] == ["p2,p3", "p1", "p0", ELSEWHERE]
    assert "buffers" not in evaluate(model, tr)


def test_evaluate_kernel_prints_the_templates_as_written_and_refuses_unknown_kernels(tmp_path, capsys):
    tr, model = _case(tmp_path)
    save_model(model, tmp_path / "m.json")
    args = ["evaluate", str(tmp_path / "m.json"), str(tr.path)]
    assert main([*args, "--kernel", "k"]) == 0
    out = capsys.readouterr().out
    assert "[p1, p1 + 8192*p4)" in out and "p2,p3" in out and "pages by buffer" in out
    assert main([*args, "--kernel", "k", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["buffers"]["kernel"] == "k"
    assert main([*args, "--kernel", "nosuch"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no kernel 'nosuch' in the model" in err and len(err.splitlines()) == 1
    with pytest.raises(UsageError, match="never runs in this trace"):
        evaluate(Model(page_size=PS, kernels={"other": model.kernels["k"]}), tr, kernel="other")
