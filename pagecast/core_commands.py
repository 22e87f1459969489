"""`pagecast summary` and `pagecast query` (look inside a trace) and `pagecast demo` (the whole pipeline)."""

from __future__ import annotations

import argparse
import csv
import json
import sys

from .command import Command
from .errors import UsageError
from .units import count_arg


class SummaryCommand(Command):
    name = "summary"
    help = "launches, kernels, allocations, faults, migrations, footprint and time span of a trace"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("trace", metavar="TRACE", help="a trace directory (*.pctrace)")
        p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
        p.add_argument("--top", type=count_arg, default=10, help="how many kernels to list (default 10)")

    def run(self, args: argparse.Namespace) -> int:
        from . import console
        from .summary import trace_summary
        from .trace import read_trace
        from .units import format_size

        s = trace_summary(read_trace(args.trace).require_launches("summarize"), top=args.top)
        if args.json:
            console.emit_json(s)
            return 0
        t = console.table(f"{s['trace']}  ({s['workload'] or 'unnamed workload'})",
                          "footprint: the distinct pages the launches touched; touched: each launch's pages, "
                          "summed over the launches (a page touched by n launches counts n times)",
                          show_header=False)
        t.add_column(style="bold")
        t.add_column()
        span = s["time_span_ns"]
        rows = [
            ("source / mode", f"{s['source']} / {s['mode']}" + ("" if s["complete"] else "  [red](incomplete)[/red]")),
            ("launches", f"{s['launches']:,} of {s['kernels']:,} kernels"),
            ("allocations", f"{s['allocations']:,} ({format_size(s['allocated_bytes'])})"),
            ("faults", f"{s['faults']:,} in {s['fault_records']:,} records"),
            ("migrations", f"{s['migrations']:,}: " + ", ".join(
                f"{k} {format_size(v)}" for k, v in s["migrated_bytes"].items())),
            ("footprint", f"{format_size(s['footprint_bytes'])} distinct ({s['footprint_source']};"
                          f" page {s['page_size']} B)"),
            ("touched", f"{format_size(s['touched_bytes'])} summed over launches"),
            ("time span", "n/a" if span is None else f"{span / 1e6:,.3f} ms"),
        ]
        v = s.get("values")
        if v is not None:
            clipped = v["clipped_bytes_by_writer"] + v["read"].get("clipped_bytes", 0)
            rows.append(("index values", f"{v['rows']:,} rows for {v['launches']:,} launches, {format_size(v['bytes'])}"
                                         f" (limit {format_size(v['limit_bytes'])} a launch, repeats {v['repeats']}"
                                         + (f", {format_size(clipped)} clipped" if clipped else "") + ")"))
        for k, v in rows:
            t.add_row(k, v)
        out = console.stdout()
        out.print(t)
        if s["top_kernels"]:
            from .demangle import base_name
            k = console.table("kernels by bytes touched",
                              f"the {len(s['top_kernels'])} kernels that touch the most bytes (--top); touched: "
                              "bytes summed over the kernel's launches; footprint: distinct bytes; "
                              "kernels by their demangled names, without parameters (--json keeps the symbols)")
            console.add_name_column(k)
            for c in ("launches", "touched", "footprint"):
                k.add_column(c, justify="right", no_wrap=True)
            for r in s["top_kernels"]:
                k.add_row(console.name_cell(base_name(r["kernel"])), f"{r['launches']:,}", format_size(r["touched_bytes"]),
                          format_size(r["footprint_bytes"]))
            out.print(k)
        return 0


class QueryCommand(Command):
    name = "query"
    help = "run SQL (DuckDB) over a trace; each table is a view of the same name"
    description = ("Run SQL over a trace with DuckDB, in-process. Views: launches, allocations, faults,\n"
                   "migrations, and truth / uvm_events / values where the trace has them (docs/trace-format.md).\n\n"
                   "  pagecast query run.pctrace \"SELECT kernel, count(*) FROM launches GROUP BY 1\"")

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("trace", metavar="TRACE")
        p.add_argument("sql", metavar="SQL")
        g = p.add_mutually_exclusive_group()
        g.add_argument("--csv", action="store_true", help="write CSV on stdout")
        g.add_argument("--json", action="store_true",
                       help="write a JSON list of row objects on stdout: dates, times and timestamps as ISO 8601 "
                            "strings, intervals as seconds, decimals and UUIDs as strings, BLOBs as hex, NaN as null")
        p.add_argument("--limit", type=int, default=50,
                       help="rows shown in the table view (default 50); only these are fetched. --csv and --json "
                            "write every row")

    def run(self, args: argparse.Namespace) -> int:
        from . import console
        from .query import execute, json_value

        if args.limit < 0:
            raise UsageError(f"--limit must be >= 0, got {args.limit}")
        res = execute(args.trace, args.sql)
        names = res.names
        if args.json:
            # streamed, as console.emit_json would print the whole list (indent 2)
            out, first = sys.stdout, True
            for batch in res.batches():
                for r in batch:
                    doc = json.dumps({n: json_value(v) for n, v in zip(names, r)}, indent=2)
                    out.write(("[\n  " if first else ",\n  ") + doc.replace("\n", "\n  "))
                    first = False
            out.write("[]\n" if first else "\n]\n")
            out.flush()
        elif args.csv:
            w = csv.writer(sys.stdout)
            w.writerow(names)
            for batch in res.batches():
                w.writerows(batch)
        else:
            from rich.table import Table
            rows, more = res.head(args.limit)
            caption = (f"first {len(rows):,} rows shown; the query returns more (--csv or --json write them all)"
                       if more else f"{len(rows):,} rows")
            t = Table(caption=caption, caption_justify="left")   # boxed: SQL values may hold spaces
            for n in names:
                t.add_column(n, overflow="fold")
            for r in rows:
                t.add_row(*("NULL" if v is None else str(v) for v in r))
            console.stdout().print(t)
        return 0


__all__ = ["SummaryCommand", "QueryCommand", "UsageError"]


class DemoCommand(Command):
    name = "demo"
    writes = ("a directory of traces, model, results and report", ())
    help = "the whole pipeline on a built-in workload mix, no GPU needed"
    description = ("Generate workloads at a small scale, fit templates on two seeds, plan and replay a third seed\n"
                   "at 150/200/300% oversubscription with demand, alloc, template and oracle, alone and as\n"
                   "MSched's multitask mixes, and print the comparison table.")

    def add_arguments(self, p):
        p.add_argument("-o", "--output", default="pagecast-demo", metavar="DIR",
                       help="where to write traces, model, results (default ./pagecast-demo)")
        p.add_argument("--force", action="store_true",
                       help="run again where DIR holds a finished demo (it is deleted first); an unfinished one"
                            " (failed or interrupted) is resumed without it")
        p.add_argument("--scale", type=float, default=None, help="workload scale (default: the demo's small scale)")
        p.add_argument("--costs", default="msched-rtx5080", metavar="NAME|FILE", help="cost profile")
        p.add_argument("-j", "--jobs", type=int, default=None, metavar="N",
                       help="replay the workloads and mixes in N processes (default: the CPUs, at most 4)")
        p.add_argument("--json", action="store_true", help="print the runs as one JSON list")
        p.add_argument("--all", action="store_true", help="print every run, not the one-screen summary")

    def run(self, args):
        from .demo import DemoConfig, run_demo
        return run_demo(DemoConfig(output=args.output, force=args.force, scale=args.scale, costs=args.costs,
                                   jobs=args.jobs, json=args.json, all=args.all))
