"""Subcommands of this stage, registered in pagecast.cli."""

from __future__ import annotations

import argparse
from pathlib import Path

from pagecast.command import Command


class ReportCommand(Command):
    name = "report"
    writes = ("HTML", (".html", ".htm"))
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
        p.add_argument("--json", action="store_true", help="print what was written as one JSON document")

    def run(self, args: argparse.Namespace) -> int:
        from pagecast import console
        from pagecast.errors import OutputExistsError

        from .render import detect_kind, write_report

        out = Path(args.output)
        if out.exists() and not args.force:  # before any slow work
            raise OutputExistsError(out)
        path = write_report(args.input, out, model=args.model, force=args.force)
        if args.json:
            console.emit_json({"output": str(path), "input": str(args.input), "model": args.model,
                               "kind": detect_kind(args.input, args.model), "bytes": path.stat().st_size})
        console.wrote(path, "report", f"open {path} in a browser")
        return 0


class ExportCommand(Command):
    name = "export"
    writes = ("a Perfetto trace", (".pftrace",))
    help = "a timeline of a trace or of replay results for Perfetto (ui.perfetto.dev)"
    description = (
        "Write a Perfetto trace file (TrackEvent protobuf) that ui.perfetto.dev and trace_processor open:\n"
        "  a trace            kernels per stream, page faults, migrations by cause, allocations\n"
        "  replay results     per capacity, each policy's kernels, stalls and bytes moved, one above the other\n\n"
        "  pagecast export perfetto run.pctrace -o run.pftrace\n"
        "  pagecast export perfetto results.parquet -o results.pftrace --policy demand,template")

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("format", choices=("perfetto",), metavar="FORMAT", help="perfetto")
        p.add_argument("input", metavar="INPUT", help="a trace directory or a replay RESULTS.parquet")
        p.add_argument("-o", "--output", required=True, metavar="FILE", help="the Perfetto trace file to write")
        p.add_argument("--policy", metavar="P,...", help="results: only these policies")
        p.add_argument("--workload", metavar="NAME,...", help="results: only these workloads (or mixes)")
        p.add_argument("--force", action="store_true", help="overwrite an existing output")
        p.add_argument("--json", action="store_true", help="print what was written as one JSON document")

    def run(self, args: argparse.Namespace) -> int:
        from pagecast import console
        from pagecast.outputs import check_output_file
        from pagecast.units import parse_list

        from .perfetto_export import PerfettoExportConfig, export_perfetto

        out = check_output_file(args.output, args.force, "timeline.pftrace")
        cfg = PerfettoExportConfig(input=Path(args.input), output=out, force=args.force,
                                   policies=parse_list(args.policy, "--policy") if args.policy else None,
                                   workloads=parse_list(args.workload, "--workload") if args.workload else None)
        with console.progress("exporting", None) as bar:
            res = export_perfetto(cfg, progress=bar)
        if args.json:
            console.emit_json({"output": str(res.path), "input": str(args.input), "kind": res.kind,
                               "tracks": res.tracks, "events": res.events, **res.counts})
        else:
            console.info(f"{res.events:,} events on {res.tracks:,} tracks ("
                         + ", ".join(f"{v:,} {k.replace('_', ' ')}" for k, v in res.counts.items()) + ")")
        console.wrote(res.path, "Perfetto timeline", f"open {res.path} at ui.perfetto.dev (Open trace file)")
        return 0


COMMANDS: list[Command] = [ReportCommand(), ExportCommand()]
