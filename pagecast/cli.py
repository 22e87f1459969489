"""The `pagecast` console script: one list of subcommands, `main(argv) -> int`.

Exit codes (cli.md): 0 success, 2 bad input (one line on stderr, never a
traceback; also what the file system refuses: permissions, a full or
read-only disk), 1 internal error. Set PAGECAST_DEBUG=1 to see tracebacks.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import textwrap
import threading
import traceback
import warnings

from . import __version__
from .command import Command
from .errors import PagecastError, UsageError


def _commands() -> list[Command]:
    # Imported here so that `import pagecast` stays light; each module imports
    # its heavy dependencies inside `run`.
    from pagecast.collect.commands import COMMANDS as collect
    from pagecast.datasets.commands import COMMANDS as datasets
    from pagecast.predict.commands import COMMANDS as predict
    from pagecast.replay.commands import COMMANDS as replay
    from pagecast.replay.gpu.commands import COMMANDS as replay_gpu
    from pagecast.report.commands import COMMANDS as report

    from .core_commands import DemoCommand, QueryCommand, SummaryCommand

    found = {c.name: c for c in [SummaryCommand(), QueryCommand(), DemoCommand(), *collect, *datasets, *predict,
                                 *replay, *replay_gpu, *report]}
    order = ["demo", "datasets", "summary", "query", "collect", "import", "fit", "predict", "evaluate",
             "plan", "replay", "calibrate", "report", "export"]
    return [found[n] for n in order if n in found] + [c for n, c in found.items() if n not in order]


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """A description's own line breaks kept (paragraphs, indented examples), and each line longer
    than the terminal folded at its width, an example's continuation indented under it."""

    def _fill_text(self, text, width, indent):
        width = max(width, 20)
        out: list[str] = []
        para: list[str] = []   # a run of unindented lines: refilled as one where one is too long

        def flush():
            if any(len(indent) + len(x) > width for x in para):
                out.extend(textwrap.wrap(" ".join(para), width, initial_indent=indent, subsequent_indent=indent,
                                         break_on_hyphens=False))
            else:
                out.extend(indent + x for x in para)
            para.clear()

        for line in text.splitlines():
            if line and not line[0].isspace():
                para.append(line)
                continue
            flush()
            if len(indent) + len(line) <= width:
                out.append(indent + line)
            else:   # an indented example or list item: its continuation indented under it
                lead = line[:len(line) - len(line.lstrip())]
                out.extend(textwrap.wrap(line, width, initial_indent=indent, subsequent_indent=indent + lead + "    ",
                                         break_on_hyphens=False))
        flush()
        return "\n".join(out)


class _Parser(argparse.ArgumentParser):
    """argparse that raises UsageError (one line, exit 2) instead of printing usage and exiting."""

    def __init__(self, *a, **kw):
        if kw.get("formatter_class") in (None, argparse.HelpFormatter, argparse.RawDescriptionHelpFormatter):
            kw["formatter_class"] = _HelpFormatter
        super().__init__(*a, **kw)

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(f"{message} (see '{self.prog} -h')")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pagecast",
                     description="Learn which pages GPU kernels touch from their launch arguments, "
                                 "plan unified-memory prefetches, and measure the speedup.",
                     epilog="Start with 'pagecast demo'. Each command has -h.")
    parser.add_argument("--version", action="version", version=f"pagecast {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for cmd in _commands():
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.description or cmd.help,
                           formatter_class=_HelpFormatter)
        cmd.add_arguments(p)
        p.set_defaults(_cmd=cmd)
    return parser


def _showwarning(message, category, filename, lineno, file=None, line=None):
    from .console import warn
    warn(str(message))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    name = "pagecast"
    for stream in (sys.stdout, sys.stderr):
        # a kernel name the terminal's encoding cannot show (PYTHONIOENCODING=ascii) is escaped,
        # not an internal error
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, OSError):   # not a text stream that can (captured, closed)
            pass
    old_showwarning = warnings.showwarning
    warnings.showwarning = _showwarning
    old_term = None
    if threading.current_thread() is threading.main_thread():
        old_term = signal.signal(signal.SIGTERM, _terminate)
    try:
        parser = build_parser()
        try:
            args, extra = parser.parse_known_args(argv)
        except SystemExit as e:  # -h and --version
            return int(e.code or 0)
        cmd = getattr(args, "_cmd", None)
        if cmd is not None:
            name = _NAME[0] = f"pagecast {cmd.name}"
        if extra:  # point at the subcommand's -h, not the top level's
            raise UsageError(f"unrecognized arguments: {' '.join(extra)} (see '{name} -h')")
        if cmd is None:
            parser.print_help(sys.stderr)
            return 2
        if isinstance(getattr(args, "output", None), str):  # every -o/--output: writable, before any work
            from .outputs import check_output_path, check_output_suffix
            check_output_path(args.output)
            check_output_suffix(args.output, cmd.name, cmd.writes)   # a suffix naming another format
        return int(cmd.run(args) or 0)
    except PagecastError as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as e:  # the file system said no (permissions, a full or read-only disk, /sys as root)
        if os.environ.get("PAGECAST_DEBUG"):
            traceback.print_exc()
        where = f": {e.filename}" if getattr(e, "filename", None) else ""
        print(f"{name}: error: {e.strerror or type(e).__name__}{where}", file=sys.stderr)
        return 2
    except MemoryError as e:  # almost always an input naming absurd sizes (a corrupted bytes column)
        if os.environ.get("PAGECAST_DEBUG"):
            traceback.print_exc()
        first = str(e).splitlines()[0] if str(e) else "out of memory"
        print(f"{name}: error: ran out of memory ({first}); an input names more memory than this machine "
              "holds: check its bytes and address columns", file=sys.stderr)
        return 2
    except Exception as e:  # an internal error: one line unless debugging
        if os.environ.get("PAGECAST_DEBUG"):
            traceback.print_exc()
        first = str(e).splitlines()[0] if str(e) else ""
        print(f"{name}: internal error: {type(e).__name__}: {first} (set PAGECAST_DEBUG=1 for a traceback)",
              file=sys.stderr)
        return 1
    finally:
        warnings.showwarning = old_showwarning
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)


_NAME = ["pagecast"]


def _terminate(signum, frame):
    """SIGTERM: remove the outputs being written (their temporary siblings; an output a --force
    replacement moved aside is put back), say so in one line, exit 128 + 15. No exception is
    raised into the running code: inside an extension module (torch's import, a pybind11
    callback) that aborts the process instead of unwinding it."""
    signal.signal(signum, signal.SIG_IGN)   # a second one does not cut the clean-up short
    from .outputs import abandon_all
    gone = abandon_all()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    try:
        dropped = f"; {', '.join(map(str, gone))} not written" if gone else ""
        os.write(2, f"{_NAME[0]}: terminated by {signal.Signals(signum).name}{dropped}\n".encode())
    except OSError:
        pass
    os._exit(128 + signum)


def entry() -> None:  # pragma: no cover
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
