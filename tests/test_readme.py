"""The README as a newcomer reads it: one read long, and every command in its sh blocks works as
written. pagecast commands parse with the CLI's own parser and their -h runs; the ones that
need nothing outside this machine run for real, in order, in an empty folder (slow); pip
commands name extras pyproject declares; pytest commands name markers it declares."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from pagecast.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_WORDS = 1000

# Commands the README shows that cannot run here, and why (their -h runs and their arguments parse)
NOT_RUN = {
    "collect": "runs the user's program (on a GPU, or under Triton's interpreter)",
    "import": "reads the user's Nsight Systems export",
    "demo": "runs for minutes; its own tests run it",
}


def sh_commands(text: str) -> list[list[str]]:
    """Each command of the text's ```sh blocks as its argv: continuation lines joined,
    comments dropped."""
    out = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            if argv:
                out.append(argv)
    return out


def _commands(program: str) -> list[list[str]]:
    return [a for a in sh_commands(README.read_text()) if a[0] == program]


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")   # Python 3.11+
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _runs_here(argv: list[str]) -> bool:
    return argv[1] not in NOT_RUN and "--" not in argv and "gpu" not in argv


def test_readme_fits_one_read():
    text = README.read_text()
    assert len(text.split()) <= MAX_WORDS
    # what it does, for whom, set-up, workflow, results and what ran on a GPU
    for heading in ("## Set up", "## What the results say", "## The workflow", "## What has run on a GPU"):
        assert heading in text
    # the detail it left out is one link away
    for link in re.findall(r"docs/[\w.-]+\.md", text):
        assert (ROOT / link).exists(), link


def test_sh_blocks_are_parsed_as_a_shell_would():
    cmds = sh_commands('```sh\npagecast a "b c" # d\npagecast e \\\n    f  # g\n```\n```py\nx\n```')
    assert cmds == [["pagecast", "a", "b c"], ["pagecast", "e", "f"]]


def test_every_pagecast_command_parses_and_has_help(capsys):
    cmds = _commands("pagecast")
    assert len(cmds) >= 10
    parser = build_parser()
    for argv in cmds:
        args, extra = parser.parse_known_args(argv[1:])
        assert not extra, f"{shlex.join(argv)}: unrecognized {extra}"
        assert main([argv[1], "-h"]) == 0, argv
    capsys.readouterr()
    # the commands left out of the run below are the ones that need more than this machine has
    assert {a[1] for a in cmds if not _runs_here(a)} <= set(NOT_RUN) | {"replay"}


def test_pip_commands_name_declared_extras():
    project = _pyproject()["project"]
    extras = set(project["optional-dependencies"])
    cmds = _commands("pip")
    assert cmds and all(a[1] == "install" for a in cmds)
    for argv in cmds:
        for arg in argv[2:]:
            m = re.fullmatch(r"\.(?:\[([\w,-]+)\])?", arg)
            if m and m.group(1):
                assert set(m.group(1).split(",")) <= extras, arg


def test_pytest_commands_name_declared_markers():
    markers = {m.split(":")[0].strip() for m in _pyproject()["tool"]["pytest"]["ini_options"]["markers"]}
    cmds = _commands("pytest")
    assert cmds
    for argv in cmds:
        for i, arg in enumerate(argv):
            if arg == "-m":
                words = set(re.findall(r"[A-Za-z_]\w*", argv[i + 1])) - {"and", "or", "not"}
                assert words <= markers, argv


@pytest.mark.slow
def test_the_workflow_runs_as_written(tmp_path, monkeypatch, capsys):
    """The README's CPU workflow, command by command, in an empty folder (about 30 s)."""
    monkeypatch.chdir(tmp_path)
    ran = []
    for argv in _commands("pagecast"):
        if not _runs_here(argv):
            continue
        code = main(argv[1:])
        _, err = capsys.readouterr()
        assert code == 0, f"{shlex.join(argv)}: exit {code}: {err}"
        ran.append(argv[1])
    assert {"datasets", "fit", "evaluate", "plan", "replay", "report", "export"} <= set(ran)
    assert (tmp_path / "results.html").exists() and (tmp_path / "results.pftrace").exists()
