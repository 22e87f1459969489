"""Inputs that would give a misleading result or message are refused in one line (exit 2):
a model of another program evaluated, an output named for another format, `fit --from truth`
on a trace without truth, `demo -o` on a file; and a failed or interrupted demo does not block
the next one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pagecast.cli import main


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code, err, *needles):
    assert code == 2, err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    from pagecast.datasets.registry import make_trace
    from pagecast.predict.fit import fit_model
    from pagecast.predict.model_io import save_model
    from pagecast.trace import read_trace
    d = tmp_path_factory.mktemp("small")
    llm = make_trace("llm-decode", d / "llm.pctrace", scale=0.03, seed=1)
    stream = make_trace("stream", d / "stream.pctrace", scale=0.03, seed=1)
    model = save_model(fit_model([read_trace(llm)]), d / "llm.json")
    return {"llm": llm, "stream": stream, "model": model, "dir": d}


def test_evaluate_refuses_a_model_of_another_program(small, capsys):
    """Every launch of stream is of a kernel llm-decode's model never saw: the scores were the
    fallback's ("precision 100.00%"), under the model's name. Now one line, exit 2, text and JSON."""
    for extra in ([], ["--json"]):
        code, out, err = run_cli(capsys, "evaluate", small["model"], small["stream"], *extra)
        one_line_error(code, err, "100% of", "kernels", "was not fitted on", "fallback")
        assert out == ""
    code, out, err = run_cli(capsys, "evaluate", small["model"], small["llm"], "--json")
    assert code == 0, err
    assert json.loads(out)["unseen"]["launches"] == 0 and "not fitted on" not in err


def test_evaluate_warns_where_a_minority_of_launches_is_unseen(capsys):
    from pagecast.predict.commands import check_unseen
    doc = {"overall": {"launches": 100}, "unseen": {"launches": 30, "kernels": ["k"], "fallback": "history"},
           "kernels": [{}, {}, {}]}
    check_unseen(doc, "m", "t")
    assert "warning: 30% of t's launches (1 of 3 kernels)" in capsys.readouterr().err
    doc["unseen"]["launches"] = 5
    check_unseen(doc, "m", "t")
    assert capsys.readouterr().err == ""   # a few: the table's 'unseen kernels' line says it
    doc["unseen"]["launches"] = 51
    from pagecast.errors import UsageError
    with pytest.raises(UsageError, match="51% of t's launches .1 of 3 kernels."):
        check_unseen(doc, "m", "t")


@pytest.mark.parametrize("argv,written,asked", [
    (["predict", "{model}", "{llm}", "-o", "{d}/pred.csv"], "Parquet", "CSV"),
    (["fit", "{llm}", "-o", "{d}/m.parquet"], "a JSON model", "Parquet"),
    (["replay", "{llm}", "--policy", "demand", "--oversub", "2", "-o", "{d}/r.json"], "Parquet results", "JSON"),
    (["plan", "{model}", "{llm}", "--oversub", "2", "-o", "{d}/p.json"], "a plan directory", "JSON"),
    (["report", "{llm}", "-o", "{d}/r.pdf"], "HTML", "PDF"),
    (["export", "perfetto", "{llm}", "-o", "{d}/t.json"], "a Perfetto trace", "JSON"),
    (["datasets", "make", "stream", "-o", "{d}/s.parquet"], "a trace directory", "Parquet"),
    (["demo", "-o", "{d}/demo.csv"], "a directory of traces, model, results and report", "CSV"),
])
def test_an_output_named_for_another_format_is_refused(small, tmp_path, capsys, argv, written, asked):
    """`predict -o pred.csv` wrote Parquet into pred.csv. Every command with -o now refuses a suffix
    that names another format than the one it writes, before any work, and writes nothing."""
    argv = [a.format(model=small["model"], llm=small["llm"], d=tmp_path) for a in argv]
    code, _, err = run_cli(capsys, *argv)
    line = one_line_error(code, err, f"writes {written}, not {asked}")
    assert list(tmp_path.iterdir()) == [], line


def test_output_suffixes_the_commands_write_are_accepted():
    from pagecast.cli import _commands
    from pagecast.outputs import FORMAT_SUFFIXES, check_output_suffix
    for cmd in _commands():
        if cmd.writes is None:
            continue
        for suf in cmd.writes[1]:
            check_output_suffix(f"out{suf}", cmd.name, cmd.writes)      # no error
        check_output_suffix("out", cmd.name, cmd.writes)                 # no suffix: no claim
        check_output_suffix("out.v2", cmd.name, cmd.writes)              # a suffix naming no format
        assert all(s in FORMAT_SUFFIXES or s in (".pctrace", ".plan") for s in cmd.writes[1])


def test_fit_from_truth_without_truth_is_one_correct_line(small, tmp_path, capsys):
    t = tmp_path / "no-truth.pctrace"
    shutil.copytree(small["stream"], t)
    shutil.rmtree(t / "truth")
    code, _, err = run_cli(capsys, "fit", t, "-o", tmp_path / "m.json", "--from", "truth")
    line = one_line_error(code, err, "has no truth table", "--from truth")
    assert "collector" not in line and not (tmp_path / "m.json").exists()


def test_demo_on_a_file_says_it_is_a_file(tmp_path, capsys):
    f = tmp_path / "plain"
    f.write_text("x")
    for extra in ([], ["--force"]):
        code, _, err = run_cli(capsys, "demo", "-o", f, *extra)
        one_line_error(code, err, "is a file, not a demo directory")
    assert f.read_text() == "x"


@pytest.mark.parametrize("bad,expect", [(["--scale", "0"], "--scale"), (["-j", "0"], "--jobs"),
                                        (["--costs", "nosuch"], "nosuch")])
def test_demo_refuses_bad_options_before_writing_anything(tmp_path, capsys, bad, expect):
    out = tmp_path / "demo"
    code, _, err = run_cli(capsys, "demo", "-o", out, *bad)
    one_line_error(code, err, expect)
    assert not out.exists()


def _small_demo(monkeypatch):
    """The demo's pipeline on two workloads and one mix (the full one takes a minute or more)."""
    from pagecast import demo
    monkeypatch.setattr(demo, "DEMO_WORKLOADS", ["stream", "jacobi2d"])
    monkeypatch.setattr(demo, "MIXES", {"scientific": ["jacobi2d", "stream"]})
    return demo


def test_an_interrupted_demo_is_resumed_by_the_next(tmp_path, capsys, monkeypatch):
    """Ctrl-C part-way (here: while making the third trace) left a demo directory that the next
    `pagecast demo` refused ('exists; pass --force'). Now the next run resumes it, keeping the
    traces already made, and finishes (exit 0); a finished demo still needs --force."""
    demo = _small_demo(monkeypatch)
    made = []
    real = demo.reuse_or_make

    def interrupted(name, out, **kw):
        if len(made) == 2:
            raise KeyboardInterrupt
        made.append(Path(out))
        return real(name, out, **kw)

    monkeypatch.setattr(demo, "reuse_or_make", interrupted)
    out = tmp_path / "demo"
    argv = ["demo", "-o", out, "--scale", "0.02", "-j", "1", "--costs", "none"]
    code, _, err = run_cli(capsys, *argv)
    assert code == 130 and "interrupted" in err
    assert len(made) == 2 and not (out / "results.parquet").exists()
    kept = {p: (p / "manifest.json").stat().st_mtime_ns for p in made}
    monkeypatch.setattr(demo, "reuse_or_make", real)
    code, stdout, err = run_cli(capsys, *argv)
    assert code == 0, err
    assert "resuming the unfinished demo" in err and (out / "results.parquet").exists()
    assert {p: (p / "manifest.json").stat().st_mtime_ns for p in made} == kept   # reused, not remade
    code, _, err = run_cli(capsys, *argv)
    one_line_error(code, err, "finished demo", "--force")


def test_demo_note_names_the_rows_where_demand_evicts_nothing():
    """cnn-infer allocates 109 MiB and touches 52 MiB: at 150% and 200% (73 and 54 MiB) all it touches
    fits, demand evicts nothing, the two rows are the same and alloc (whole allocations) thrashes.
    The demo says so under its table, for the rows where demand evicted nothing."""
    from pagecast.demo import fits_note
    runs = [{"policy": p, "workload": "cnn-infer", "oversub": r, "dtoh_bytes": 0 if r < 3 or p == "alloc" else 5}
            for r in (1.5, 2.0, 3.0) for p in ("demand", "alloc")]
    runs += [{"policy": "demand", "workload": "jacobi2d", "oversub": 1.5, "dtoh_bytes": 4 << 30}]
    note = fits_note(runs)
    assert "(cnn-infer at 150%, 200%)" in note and "Demand evicts nothing" in note and "jacobi2d" not in note
    assert fits_note(runs[-1:]) is None


def test_demo_workers_go_with_their_parent(monkeypatch):
    """A demo stopped by SIGTERM (os._exit, no pool shutdown) left its two workers running their
    jobs on, orphaned. Each worker now asks for SIGTERM at its parent's exit (and ignores Ctrl-C,
    which the parent handles)."""
    import signal

    from pagecast import demo, procs
    asked = []
    monkeypatch.setattr(procs, "exit_with_parent", lambda *a: asked.append(True) or True)
    monkeypatch.setenv(procs.PARENT_ENV, "1")
    old = signal.getsignal(signal.SIGINT)
    try:
        demo._worker_init()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, old)
    import os
    assert asked == [True] and procs.PARENT_ENV not in os.environ
