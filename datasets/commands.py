"""Subcommands of this stage, registered in pagecast.cli: `pagecast datasets list|make`."""

from __future__ import annotations

import argparse

from pagecast.command import Command
from pagecast.errors import UsageError


class DatasetsCommand(Command):
    name = "datasets"
    writes = ("a trace directory", (".pctrace",))
    help = "the workload models: list them, or make a trace (with truth) from one"
    description = ("Workload models: deterministic generators of traces (format v1, with truth)\n"
                   "modelled on real kernels, with an emulated UVM driver.\n\n"
                   "  pagecast datasets list\n"
                   "  pagecast datasets make jacobi2d -o jacobi.pctrace --scale 0.5 --seed 1\n"
                   "  pagecast datasets make jacobi2d -o lossy.pctrace --drop 0.01   # 1% of records lost\n\n"
                   "The real-kernel corpus (liger, tutorials, data-dependent, ...) runs real Triton kernels\n"
                   "under Triton's interpreter (collect --interpret; needs pagecast[interpret]).")

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        sub = p.add_subparsers(dest="action", metavar="ACTION", parser_class=type(p))
        ls = sub.add_parser("list", help="the workload models, one line each")
        ls.add_argument("--json", action="store_true",
                        help="print a JSON list of {name, category, description, templates, kernels}")
        mk = sub.add_parser("make", help="write a trace (with truth) from a workload model")
        mk.add_argument("workload", metavar="NAME", help="a workload model (see 'pagecast datasets list')")
        mk.add_argument("-o", "--output", required=True, metavar="DIR", help="the trace directory to write")
        mk.add_argument("--scale", default="1.0", metavar="S",
                        help="problem size and length (default 1: about 10^4 launches; at most 100)")
        mk.add_argument("--seed", default="0", metavar="N", help="argument values and data-dependent choices")
        mk.add_argument("--mode", default="full", metavar="full|natural",
                        help="full: every launch starts with nothing resident; natural: only first touches fault")
        mk.add_argument("--drop", default="0", metavar="RATE",
                        help="lose fault and migration records independently at this rate, as CUPTI does when"
                             " its buffers overflow (counted in the manifest's dropped_records; 0.01 = 1%%)")
        mk.add_argument("--no-driver-prefetch", action="store_true",
                        help="emulate the driver with its tree prefetcher off")
        mk.add_argument("--force", action="store_true", help="overwrite an existing output")
        mk.add_argument("--json", action="store_true", help="print the written trace's summary as JSON")

    def run(self, args: argparse.Namespace) -> int:
        if args.action == "list":
            return self._list(args)
        if args.action == "make":
            return self._make(args)
        raise UsageError("say 'list' or 'make' (see 'pagecast datasets -h')")

    def _list(self, args: argparse.Namespace) -> int:
        from pagecast import console

        from .corpus import CORPUS
        from .registry import WORKLOADS
        docs = [w.as_dict() for w in WORKLOADS.values()]
        corpus = [w.as_dict() for w in CORPUS.values()]
        if args.json:
            console.emit_json(docs + corpus)
            return 0
        out = console.stdout()
        t = console.table("workload models (pagecast datasets make NAME)",
                          "In brackets: the template classes the workload's kernels need (docs/template-model.md), "
                          "or, for real Triton kernels, how collect --interpret records them (fresh or "
                          "preallocated tensors; docs/workloads-triton.md). --json: every field.")
        t.add_column("name", no_wrap=True)
        t.add_column("category", no_wrap=True)
        t.add_column("what it models")
        for d in docs:
            t.add_row(f"[bold]{d['name']}[/bold]", d["category"], f"{d['summary']}  [dim]({', '.join(d['templates'])})[/dim]")
        for d in corpus:
            t.add_row(f"[bold]{d['name']}[/bold]", d["category"],
                      f"{d['summary']}  [dim](real kernels, collect --interpret; {d['buffers']} tensors)[/dim]")
        out.print(t)
        return 0

    def _make(self, args: argparse.Namespace) -> int:
        from pagecast import console
        from pagecast import trace as T

        from .corpus import CORPUS
        from .registry import check_drop, get_workload, make_trace
        if args.workload not in CORPUS:
            get_workload(args.workload)
        drop = check_drop(args.drop)
        try:
            scale = float(args.scale)
        except ValueError:
            raise UsageError(f"--scale must be a number, not {args.scale!r}") from None
        try:
            seed = int(args.seed)
        except ValueError:
            raise UsageError(f"--seed must be a non-negative integer, not {args.seed!r}") from None
        if args.mode not in T.MODES:
            raise UsageError(f"--mode must be one of {', '.join(T.MODES)}, not {args.mode!r}")
        with console.progress(f"making {args.workload}", None) as bar:
            out = make_trace(args.workload, args.output, scale=scale, seed=seed, mode=args.mode,
                             driver_prefetch=not args.no_driver_prefetch, force=args.force,
                             progress=bar.advance, drop=drop)
        if args.json:
            from pagecast.summary import trace_summary
            console.emit_json(trace_summary(T.read_trace(out)))
        console.wrote(out, f"{args.workload} trace", f"pagecast summary {out}  |  pagecast fit {out} -o model.json")
        return 0


COMMANDS: list[Command] = [DatasetsCommand()]
