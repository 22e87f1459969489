"""Every command's human output fits an 80-column terminal (COLUMNS=80): no line of stdout or
stderr over 80 characters, tables shrunk to the width (kernel names cut with an ellipsis),
every table with its caption, kernel names demangled. Run on small traces, in-process.

Not run here: `collect` on a GPU and `calibrate` (a GPU; their messages and table are the
console's, as these are) and `demo` (minutes; its table is the pivot's, checked at 80 columns
below from 12 workloads' runs). `collect --interpret` runs (slow: torch and Triton)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from pagecast.cli import build_parser, main

sys.path.insert(0, str(Path(__file__).parent))
from nsys_fixture import make_export  # noqa: E402

WIDTH = 80


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """Three small traces of a workload with C++ kernel names, a model fitted on two."""
    from pagecast.datasets.registry import make_trace
    d = tmp_path_factory.mktemp("width")
    for s in (1, 2, 3):
        make_trace("cnn-infer", d / f"c{s}.pctrace", scale=0.02, seed=s)
    mp = pytest.MonkeyPatch()
    mp.setenv("COLUMNS", str(WIDTH))
    try:
        assert main(["fit", str(d / "c1.pctrace"), str(d / "c2.pctrace"), "-o", str(d / "m.json")]) == 0
        assert main(["replay", str(d / "c3.pctrace"), "--policy", "demand,alloc,template,oracle", "--oversub",
                     "1.5,2", "--model", str(d / "m.json"), "-o", str(d / "r.parquet")]) == 0
    finally:
        mp.undo()
    return d


def _fits(out: str, err: str, what) -> None:
    long = [ln for ln in (out + err).splitlines() if len(ln) > WIDTH]
    assert not long, f"{what}: {len(long)} lines over {WIDTH} characters, e.g. {long[0]!r}"


def _run(capsys, monkeypatch, argv) -> str:
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, (argv, err)
    _fits(out, err, " ".join(map(str, argv)))
    return out + err


def _all_parsers():
    """Every (sub)command's argv prefix: -h of each must fit too."""
    import argparse

    def walk(p, prefix):
        yield prefix
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    yield from walk(sub, [*prefix, name])
    return list(walk(build_parser(), []))


def test_every_help_fits(capsys, monkeypatch):
    prefixes = _all_parsers()
    assert len(prefixes) > 14
    for prefix in prefixes:
        _run(capsys, monkeypatch, [*prefix, "-h"])


@pytest.mark.slow   # the traces, a fit and a replay: about 20 s
def test_trace_commands_fit(work, capsys, monkeypatch):
    t = work / "c3.pctrace"
    text = _run(capsys, monkeypatch, ["summary", t])
    assert "conv2d_implicit_gemm" in text and "_Z20conv2d" not in text   # demangled
    assert "touched:" in text   # the caption
    _run(capsys, monkeypatch, ["query", t, "SELECT kernel, count(*) AS n FROM launches GROUP BY 1"])
    _run(capsys, monkeypatch, ["datasets", "list"])
    _run(capsys, monkeypatch, ["datasets", "make", "stream", "-o", work / "s.pctrace", "--scale", "0.02",
                               "--force"])


@pytest.mark.slow   # the traces, a fit and a replay: about 20 s
def test_model_commands_fit(work, capsys, monkeypatch):
    m, t = work / "m.json", work / "c3.pctrace"
    text = _run(capsys, monkeypatch, ["fit", work / "c1.pctrace", work / "c2.pctrace", "-o", work / "m2.json",
                                      "--force"])
    if "not pinned down" in text:   # the warning says what to do
        assert "To pin it down" in " ".join(text.split())
    text = _run(capsys, monkeypatch, ["evaluate", m, t])
    flat = " ".join(text.split())
    assert "sgemm_nn" in text and "_Z8sgemm" not in text
    for term in ("precision, the share", "recall, the share", "alloc. prec.:", "fallback history:"):
        assert term in flat, term
    # --kernel takes the name the table shows
    text = _run(capsys, monkeypatch, ["evaluate", m, t, "--kernel", "sgemm_nn"])
    assert "pages by buffer" in text and "over-predicted:" in " ".join(text.split())
    _run(capsys, monkeypatch, ["predict", m, t, "-o", work / "p.parquet", "--force"])
    _run(capsys, monkeypatch, ["plan", m, t, "--oversub", "2", "-o", work / "p.plan", "--force"])


@pytest.mark.slow   # the traces, a fit and a replay: about 20 s
def test_replay_commands_fit(work, capsys, monkeypatch):
    m, t = work / "m.json", work / "c3.pctrace"
    base = ["replay", t, "--policy", "demand,alloc,template,oracle", "--oversub", "1.5,2", "--model", m]
    text = " ".join(_run(capsys, monkeypatch, base).split())
    assert "demand time" in text and "higher is better" in text
    text = " ".join(_run(capsys, monkeypatch, [*base, "--all", "--span", "fitted"]).split())
    assert "vs demand:" in text and "(fitted blocks)" in text
    _run(capsys, monkeypatch, ["report", work / "r.parquet", "-o", work / "r.html", "--force"])
    _run(capsys, monkeypatch, ["export", "perfetto", work / "r.parquet", "-o", work / "r.pftrace", "--force"])


def test_import_fits(tmp_path, capsys, monkeypatch):
    src = tmp_path / "run.sqlite"
    make_export(src)
    _run(capsys, monkeypatch, ["import", "nsys", src, "-o", tmp_path / "run.pctrace"])
    _run(capsys, monkeypatch, ["summary", tmp_path / "run.pctrace"])


VADD = textwrap.dedent("""
    import torch, triton, triton.language as tl

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m), mask=m)

    for n in (1000, 5000):
        x, y, out = torch.randn(n), torch.randn(n), torch.empty(n)
        add_kernel[(triton.cdiv(n, 512),)](x, y, out, n, BLOCK=512)
""")


@pytest.mark.slow   # torch and Triton's interpreter in a child process
def test_collect_interpret_fits(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    (tmp_path / "vadd.py").write_text(VADD)
    r = subprocess.run([sys.executable, "-m", "pagecast.cli", "collect", "--interpret", "-o", "v.pctrace", "--",
                        sys.executable, "vadd.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "COLUMNS": str(WIDTH)})
    assert r.returncode == 0, r.stderr
    assert "v.pctrace" in r.stderr
    _fits(r.stdout, r.stderr, "collect --interpret")


def test_demo_table_fits():
    """The demo's pivot: 12 workloads at three levels, the means line and caption, at 80 columns."""
    from pagecast.report.pivot import make_pivot, means_line, pivot_table
    runs = []
    names = ["llm-prefill-decode", "mix:multi-llm", "mix:scientific", *[f"w{i}" for i in range(9)]]
    for w in names:
        for o in (1.5, 2.0, 3.0):
            for p, t in (("demand", 1.2345), ("alloc", 100.0), ("template", 0.1), ("oracle", 0.099)):
                runs.append({"workload": w, "oversub": o, "capacity_bytes": int(1e8 / o), "policy": p, "time_s": t,
                             "speedup_vs_demand": 1.2345 / t, "fraction_of_oracle": 0.099 / t})
    pv = make_pivot(runs)
    means = means_line(pv)
    pv.means = []
    buf = io.StringIO()
    Console(file=buf, width=WIDTH, highlight=False).print(pivot_table(pv, note=means))
    text = buf.getvalue()
    _fits(text, "", "demo pivot")
    assert "geometric mean (12)" in text and "slower than demand" in text


def test_demangle_keeps_what_it_cannot_read():
    from pagecast.demangle import base_name, demangle, resolve
    assert demangle("_Z8bias_addPfPKfii") == "bias_add(float*, float const*, int, int)"
    assert base_name("_Z8bias_addPfPKfii") == "bias_add"
    for name in ("rms_norm_kernel", "_Znot a symbol", ""):
        assert demangle(name) == name == base_name(name)
    names = ["_Z8bias_addPfPKfii", "_Z3fooi", "_Z3foof"]
    assert resolve("bias_add", names) == "_Z8bias_addPfPKfii"
    assert resolve("foo(float)", names) == "_Z3foof"
    assert resolve("foo", names) is None   # overloaded: the full name is needed
    assert resolve("_Z3fooi", names) == "_Z3fooi"


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=40), st.text(max_size=40).map(lambda t: "_Z" + t)))
def test_demangle_takes_any_name(name):
    from pagecast.demangle import base_name, demangle, resolve
    d, b = demangle(name), base_name(name)
    assert isinstance(d, str) and isinstance(b, str) and (d == name) == (b == name)
    assert resolve(name, [name, "_Z3fooi"]) == name


def test_pinning_advice():
    from pagecast.predict.model_io import Pinning
    assert Pinning(groups=8, cv="agree").advice() == ""
    a = Pinning(groups=8, unvaried=["p1"], cv="agree").advice()
    assert "p1 (parameter 2) takes other values" in a
    assert "other sizes" in Pinning(groups=8, cv="differ", differ={"p0": ["a", "b"]}).advice()
