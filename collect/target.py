"""The workload command line after `--`, and running it in this process.

Accepted forms: `python SCRIPT [ARGS]`, `python -m MODULE [ARGS]`,
`SCRIPT.py [ARGS]` and `-m MODULE [ARGS]`. The workload runs in the
collector's own process (runpy), with `sys.argv` and `sys.path[0]` set as if
Python had started it, so an unmodified script sees what it normally sees.
"""

from __future__ import annotations

import os
import re
import runpy
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pagecast.errors import InputError, UsageError

_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
_USAGE = "expected a workload after '--': 'python SCRIPT [ARGS]' or 'python -m MODULE [ARGS]'"


@dataclass
class Workload:
    kind: str  # "script" or "module"
    target: str
    args: list[str]
    argv: list[str]  # as the user wrote it

    @property
    def name(self) -> str:
        if self.kind == "module":
            return self.target.rsplit(".", 1)[-1]
        return Path(self.target).stem


def parse_workload(argv: list[str]) -> Workload:
    words = list(argv)
    if words and words[0] == "--":
        words = words[1:]
    original = list(words)
    if not words:
        raise UsageError(_USAGE)
    if _PYTHON.match(os.path.basename(words[0])):
        words = words[1:]
        while words and words[0] in ("-u", "-B", "-O", "-OO"):  # harmless interpreter flags
            words = words[1:]
    if not words:
        raise UsageError(_USAGE)
    if words[0] == "-m":
        if len(words) < 2 or not words[1] or words[1].startswith("-"):
            raise UsageError("'-m' needs a module name (python -m MODULE [ARGS])")
        return Workload("module", words[1], words[2:], original)
    if words[0].startswith("-m") and len(words[0]) > 2:
        return Workload("module", words[0][2:], words[1:], original)
    if words[0].startswith("-"):
        raise UsageError(f"unsupported Python option {words[0]!r} before the script; {_USAGE}")
    script = words[0]
    p = Path(script)
    if not p.exists():
        raise InputError(f"{script}: no such script")
    if p.is_dir() and not (p / "__main__.py").exists():
        raise InputError(f"{script}: a directory without __main__.py is not a runnable workload")
    return Workload("script", script, words[1:], original)


def make_target(w: Workload) -> Callable[[], None]:
    """A function that runs the workload as `__main__` in this process."""

    def run() -> None:
        old_argv, old_path0 = sys.argv, (sys.path[0] if sys.path else None)
        try:
            if w.kind == "module":
                sys.argv = [w.target, *w.args]
                if sys.path and sys.path[0] != os.getcwd():
                    sys.path.insert(0, os.getcwd())
                runpy.run_module(w.target, run_name="__main__", alter_sys=True)
            else:
                sys.argv = [w.target, *w.args]
                here = str(Path(w.target).resolve().parent)
                sys.path.insert(0, here)
                runpy.run_path(w.target, run_name="__main__")
        finally:
            sys.argv = old_argv
            if old_path0 is not None and sys.path and sys.path[0] != old_path0:
                try:
                    sys.path.remove(sys.path[0])
                except ValueError:
                    pass

    return run
