"""The shape every subcommand has: a small object that adds its arguments and runs.

Commands live next to the stage they drive (`pagecast.predict.commands`, ...)
and are registered in one list in `pagecast.cli`. `run` returns an exit code or
raises a PagecastError, which carries its own.
"""

from __future__ import annotations

import argparse
from typing import ClassVar


class Command:
    name: ClassVar[str] = ""
    help: ClassVar[str] = ""
    description: ClassVar[str | None] = None  # longer text for `pagecast NAME -h`
    # what -o/--output receives: (its format in words, the suffixes that name it); the CLI refuses
    # an output whose suffix names another format (outputs.check_output_suffix). None: no -o.
    writes: ClassVar[tuple[str, tuple[str, ...]] | None] = None

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:  # pragma: no cover - overridden
        pass

    def run(self, args: argparse.Namespace) -> int:  # pragma: no cover - overridden
        raise NotImplementedError
