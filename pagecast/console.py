"""Output conventions of cli.md: results on stdout, everything else on stderr.

- `--json` prints exactly one JSON document on stdout (`emit_json`).
- progress bars (rich) go to stderr, and only when stderr is a terminal.
- after writing an output, `wrote()` names it and suggests the next command.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # `pagecast summary T | head -1`: rich's own handling exits 1 with nothing said; a reader
        # that stopped reading is not an error (the CLI answers BrokenPipeError with exit 0)
        devnull = os.open(os.devnull, os.O_WRONLY)   # as rich does: no error at exit's flush
        os.dup2(devnull, sys.stdout.fileno())
        raise BrokenPipeError


def stderr() -> Console:
    # Built per call so tests that swap sys.stderr (capsys) see the output.
    return _Console(file=sys.stderr, highlight=False, soft_wrap=True)


def stdout() -> Console:
    # Piped output has no terminal width; rich would squeeze tables into 80
    # columns and fold kernel names. Give tables room; a terminal keeps its own width.
    width = None if sys.stdout.isatty() else 160
    return _Console(file=sys.stdout, highlight=False, soft_wrap=True, width=width)


def info(msg: str) -> None:
    stderr().print(msg)


def warn(msg: str) -> None:
    print(f"pagecast: warning: {msg}", file=sys.stderr)


def wrote(path: str | Path, what: str, next_cmd: str | None = None) -> None:
    """Name the output just written and suggest the next command (on stderr)."""
    msg = f"wrote {what}: [bold]{path}[/bold]"
    if next_cmd:
        msg += f"\n[dim]next:[/dim] {next_cmd}"
    stderr().print(msg)


def _clean(o: Any) -> Any:
    """JSON has no NaN or infinity: write them as null."""
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    if hasattr(o, "item") and callable(o.item):  # numpy scalar
        return _clean(o.item())
    return o


def emit_json(obj: Any) -> None:
    """Print one JSON document on stdout."""
    sys.stdout.write(json.dumps(_clean(obj), indent=2) + "\n")
    sys.stdout.flush()


def show_progress() -> bool:
    return sys.stderr.isatty()


@contextlib.contextmanager
def progress(description: str, total: float | None) -> Iterator["Bar"]:
    """A rich progress bar on stderr (silent when stderr is not a terminal)."""
    p = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                 TimeElapsedColumn(), TimeRemainingColumn(),
                 console=stderr(), transient=True, disable=not show_progress())
    with p:
        task = p.add_task(description, total=total)
        yield Bar(p, task)


class Bar:
    def __init__(self, p: Progress, task) -> None:
        self._p, self._task = p, task

    def advance(self, n: float = 1) -> None:
        self._p.advance(self._task, n)

    def update(self, *, completed: float | None = None, total: float | None = None,
               description: str | None = None) -> None:
        kw = {k: v for k, v in (("completed", completed), ("total", total), ("description", description))
              if v is not None}
        self._p.update(self._task, **kw)
