"""Subcommands of this stage, registered in pagecast.cli."""

from __future__ import annotations

import argparse

from pagecast.command import Command


class ReportCommand(Command):
    name = "report"
    help = "a self-contained HTML report with plots, for a trace, a model evaluation or replay results"
    description = (
        "Write one HTML file (plots embedded, no network needed to view it) for:\n"
        "  a trace                      pagecast report run.pctrace -o report.html\n"
        "  a trace and a fitted model   pagecast report run.pctrace --model model.json -o report.html\n"
        "  replay results               pagecast report RESULTS.parquet -o report.html")

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("input", metavar="INPUT", help="a trace directory or a replay RESULTS.parquet")
        p.add_argument("-o", "--output", metavar="REPORT.html", required=True, help="the HTML file to write")
        p.add_argument("--model", metavar="MODEL", default=None,
                       help="a model (pagecast fit): report its precision and recall on the trace")
        p.add_argument("--force", action="store_true", help="overwrite an existing output")

    def run(self, args: argparse.Namespace) -> int:
        from pagecast import console
        from pagecast.errors import OutputExistsError

        from .render import write_report
        from pathlib import Path

        out = Path(args.output)
        if out.exists() and not args.force:  # before any slow work
            raise OutputExistsError(out)
        path = write_report(args.input, out, model=args.model, force=args.force)
        console.wrote(path, "report", f"open {path} in a browser")
        return 0


COMMANDS: list[Command] = [ReportCommand()]
