"""cli.md's rules checked across every registered command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pagecast.cli import _commands, main

NAMES = [c.name for c in _commands()]


def test_every_command_of_the_contract_is_registered():
    assert set(NAMES) >= {"demo", "datasets", "summary", "query", "collect", "fit", "predict", "evaluate",
                          "plan", "replay", "calibrate", "report"}


@pytest.mark.parametrize("name", NAMES)
def test_help_exits_0(name, capsys):
    assert main([name, "-h"]) == 0
    assert f"pagecast {name}" in capsys.readouterr().out


@pytest.mark.parametrize("name", NAMES)
def test_unknown_flag_is_one_line_exit_2(name, capsys):
    assert main([name, "--no-such-flag"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"see 'pagecast {name} -h'" in err, err   # the subcommand's help, not the top level's


def test_console_script_runs():
    r = subprocess.run([sys.executable, "-m", "pagecast.cli", "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("pagecast ")


def test_cli_reference_is_current():
    script = Path(__file__).resolve().parents[1] / "scripts" / "gen_cli_reference.py"
    r = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


# Every -o/--output is checked before any work (the inputs here need not exist).
OUTPUT_ARGV = {
    "datasets": ["datasets", "make", "stream", "-o"],
    "fit": ["fit", "in.pctrace", "-o"],
    "predict": ["predict", "m.json", "in.pctrace", "-o"],
    "plan": ["plan", "m.json", "in.pctrace", "--oversub", "2", "-o"],
    "replay": ["replay", "in.pctrace", "--policy", "demand", "--oversub", "2", "-o"],
    "report": ["report", "in.pctrace", "-o"],
    "demo": ["demo", "-o"],
    "collect": ["collect", "-o"],
    "calibrate": ["calibrate", "-o"],
}


def _one_line_exit_2(argv, capsys, *needles):
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, err


@pytest.mark.parametrize("cmd", sorted(OUTPUT_ARGV))
def test_output_under_a_file_is_one_line_exit_2(cmd, tmp_path, capsys):
    # was an internal error (NotADirectoryError / FileExistsError), exit 1, often after all the work
    (tmp_path / "afile").write_text("x")
    _one_line_exit_2(OUTPUT_ARGV[cmd] + [tmp_path / "afile" / "out"], capsys, "is not a directory")


@pytest.mark.parametrize("cmd", sorted(OUTPUT_ARGV))
def test_empty_output_path_is_one_line_exit_2(cmd, capsys):
    # was "'.' exists; pass --force" (and with --force, the current directory was the output)
    _one_line_exit_2(OUTPUT_ARGV[cmd] + [""], capsys, "output path is empty")


def test_unwritable_output_directory_via_access(tmp_path, capsys, monkeypatch):
    # a read-only directory, as os.access reports it (a chmod 555 directory would not do: CI runs as
    # root, which may write there; the check itself is os.access)
    import os
    monkeypatch.setattr(os, "access", lambda p, mode: False)
    _one_line_exit_2(OUTPUT_ARGV["fit"] + [tmp_path / "m.json"], capsys, "is not writable")


def test_what_the_file_system_refuses_while_writing_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    # a full disk, or /sys as root (os.access says yes, the write says no): found only when writing
    import errno

    from pagecast.datasets.registry import make_trace
    from pagecast.predict import model_io

    def full(model, path, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(model_io, "save_model", full)
    make_trace("stream", tmp_path / "in.pctrace", scale=0.02, seed=1)
    _one_line_exit_2(["fit", tmp_path / "in.pctrace", "-o", tmp_path / "m.json"], capsys,
                     "No space left on device", "m.json")


@pytest.mark.parametrize("cmd", ["predict", "replay"])
def test_output_file_that_is_a_directory_is_one_line_exit_2(cmd, tmp_path, capsys):
    # with --force these ran the whole command, then failed with IsADirectoryError, exit 1
    from pagecast.datasets.registry import make_trace
    from pagecast.predict.fit import fit_model
    from pagecast.predict.model_io import save_model
    from pagecast.trace import read_trace
    tr = make_trace("stream", tmp_path / "s.pctrace", scale=0.01, seed=1)
    save_model(fit_model([read_trace(tr)]), tmp_path / "m.json")
    (tmp_path / "d").mkdir()
    argv = (["predict", tmp_path / "m.json", tr] if cmd == "predict"
            else ["replay", tr, "--policy", "demand", "--oversub", "2"])
    _one_line_exit_2(argv + ["-o", tmp_path / "d", "--force"], capsys, "is a directory")


def test_force_never_deletes_a_foreign_directory_and_says_so_once(tmp_path, capsys):
    # the message was "... refusing to delete it even with --force exists; pass --force to overwrite it"
    d = tmp_path / "mine"
    d.mkdir()
    (d / "keep.txt").write_text("x")
    assert main(["datasets", "make", "stream", "--scale", "0.01", "-o", str(d), "--force"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "refusing to delete" in err and "pass --force" not in err
    assert (d / "keep.txt").exists()
