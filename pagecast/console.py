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
import textwrap
from pathlib import Path
from typing import Any, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # `pagecast summary T | head -1`: rich's own handling exits 1 with nothing said; a reader
        # that stopped reading is not an error (the CLI answers BrokenPipeError with exit 0)
        devnull = os.open(os.devnull, os.O_WRONLY)   # as rich does: no error at exit's flush
        os.dup2(devnull, sys.stdout.fileno())
        raise BrokenPipeError


def terminal_width(stream=None) -> int | None:
    """The width human output must fit: $COLUMNS where set (as rich and argparse read it), else
    the terminal's width where `stream` (default stdout) is one, else None (a pipe or a file)."""
    cols = os.environ.get("COLUMNS", "")
    if cols.isdigit() and int(cols) > 0:
        return int(cols)
    stream = sys.stdout if stream is None else stream
    try:
        if stream.isatty():
            return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        pass
    return None


def stderr() -> Console:
    # Built per call so tests that swap sys.stderr (capsys) see the output. Folded at the
    # terminal's width (or $COLUMNS); into a pipe or a file, one line a message.
    width = terminal_width(sys.stderr)
    return _Console(file=sys.stderr, highlight=False, soft_wrap=width is None, width=width)


def stdout() -> Console:
    # Tables shrink to the terminal's width (or $COLUMNS; kernel names end in an ellipsis) and
    # text folds there; piped to a pager or head at a terminal, to the width of the terminal
    # stderr still shows. With no terminal at all (a script, a file) tables get room (160
    # columns) and text stays one line a message, as a script reading it expects.
    width = terminal_width(sys.stdout) or terminal_width(sys.stderr)
    return _Console(file=sys.stdout, highlight=False, soft_wrap=width is None, width=width or 160)


def info(msg: str) -> None:
    stderr().print(msg)


def warn(msg: str) -> None:
    line = f"pagecast: warning: {msg}"
    width = terminal_width(sys.stderr)
    if width:   # folded at the terminal's width, continuation lines indented
        line = "\n".join(textwrap.wrap(line, width, subsequent_indent="  ", break_on_hyphens=False,
                                        break_long_words=True)) or line
    print(line, file=sys.stderr)


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


def table(title: str | None = None, caption: str | None = None, **kw):
    """A rich Table for human output: an underlined header, no rules (a vertical rule costs three
    columns), one space between columns, the title above and the caption (what the numbers are, relative to what, which way is
    better; what its terms mean) below, both left-aligned and folded at the table's width."""
    for k, v in (("box", None), ("pad_edge", False), ("padding", (0, 1)), ("collapse_padding", True),
                 ("header_style", "bold underline")):
        kw.setdefault(k, v)
    return Table(title=title, caption=caption, title_justify="left", caption_justify="left", **kw)


def add_name_column(t, header: str = "kernel", min_width: int = 12) -> None:
    """A column of names (kernels, workloads) that gives way first when the table is too wide.
    Fill it with `name_cell`: one line a row, cut with an ellipsis."""
    # wrapable as a column (rich narrows those first), unwrapped as a cell (name_cell)
    t.add_column(header, justify="left", overflow="ellipsis", min_width=min_width)


def cell(text: str, overflow: str = "ellipsis"):
    """A cell on one line (its column may still fold its header)."""
    return Text(text, no_wrap=True, overflow=overflow)


def name_cell(name: str):
    """A name as one line that ends in an ellipsis where its column is too narrow."""
    return Text(name, no_wrap=True, overflow="ellipsis")
