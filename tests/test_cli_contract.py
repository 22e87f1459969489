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


def test_console_script_runs():
    r = subprocess.run([sys.executable, "-m", "pagecast.cli", "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("pagecast ")


def test_cli_reference_is_current():
    script = Path(__file__).resolve().parents[1] / "scripts" / "gen_cli_reference.py"
    r = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
