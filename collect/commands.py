"""Subcommands of this stage, registered in pagecast.cli."""

from __future__ import annotations

import argparse

from pagecast.command import Command


class CollectCommand(Command):
    name = "collect"
    writes = ("a trace directory", (".pctrace",))
    help = "run a Python GPU workload under CUPTI and write a trace"
    description = (
        "Run a Python GPU workload in this process with CUPTI enabled and write a trace\n"
        "(kernel launches with their argument bytes, allocations, UVM faults and migrations).\n\n"
        "  pagecast collect -o run.pctrace -- python train.py --epochs 1\n"
        "  pagecast collect --managed cupy -- python -m pagecast.datasets.gpu.jacobi2d --scale 1\n\n"
        "--mode full (default) evicts the workload's managed memory to the host before every\n"
        "launch and serializes kernels, so each launch's faults show its whole footprint;\n"
        "--mode natural adds nothing. Managed allocations may not pass the GPU's free memory\n"
        "unless --allow-oversubscription. The workload's exit code passes through.\n"
        "Needs an NVIDIA GPU, a CUDA 13 driver, cupti-python and cuda-bindings (pip install 'pagecast[gpu]').\n\n"
        "--interpret runs the program's Triton kernels under Triton's interpreter on the CPU instead\n"
        "(no GPU needed) and records exactly what each launch touches (truth), with faults and\n"
        "migrations from the workload models' full-mode driver emulation:\n\n"
        "  pagecast collect --interpret -o run.pctrace -- python train.py\n"
        "  pagecast collect --interpret --allocator caching --drop 0.01 -- python -m mypkg.bench"
    )

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("-o", "--output", metavar="DIR", help="trace directory to write (default: NAME.pctrace)")
        p.add_argument("--interpret", action="store_true",
                       help="run Triton kernels under Triton's interpreter on the CPU and record exact footprints "
                            "(pip install 'pagecast[interpret]')")
        p.add_argument("--allocator", choices=("direct", "caching"), default=None,
                       help="--interpret: place each tensor storage in its own 2 MiB-aligned allocation (direct, "
                            "default) or as blocks of segments by PyTorch's caching allocator's rules (caching)")
        p.add_argument("--drop", metavar="RATE", default=None,
                       help="--interpret: lose this share of fault and migration records, as CUPTI does when its "
                            "buffers overflow (default 0)")
        p.add_argument("--seed", metavar="N", default=None,
                       help="--interpret: seed of the driver emulation's random choices (default 0)")
        p.add_argument("--no-driver-prefetch", action="store_true",
                       help="--interpret: emulate the driver with its tree prefetcher off")
        p.add_argument("--json", action="store_true",
                       help="--interpret: print a JSON summary on stdout (the workload's own stdout goes to stderr)")
        p.add_argument("--mode", choices=("full", "natural"), default="full",
                       help="full: evict managed memory before and serialize each launch (default); natural: as is")
        p.add_argument("--managed", metavar="LIST",
                       help="switch these allocators to managed memory before the workload starts: cupy,torch")
        p.add_argument("--allow-oversubscription", action="store_true",
                       help="let managed allocations pass the GPU's free memory (your own machine only)")
        p.add_argument("--force", action="store_true", help="overwrite an existing output")
        p.add_argument("--device", type=int, default=0, help="CUDA device ordinal (default 0)")
        p.add_argument("workload", nargs=argparse.REMAINDER,
                       help="-- python SCRIPT [ARGS] | -- python -m MODULE [ARGS]")

    def run(self, args: argparse.Namespace) -> int:
        import os
        from pathlib import Path

        from pagecast import trace as T
        from pagecast.console import info, wrote
        from pagecast.errors import OutputExistsError, UsageError

        from . import gpuinfo
        from .managed import ManagedBudget, install, managed_limit, parse_managed
        from .target import make_target, parse_workload

        if args.interpret:
            from pagecast.datasets.emulate import FullModeEmulation

            from .interpret_cli import run_interpret
            return run_interpret(args, FullModeEmulation)
        for flag, v in (("--allocator", args.allocator), ("--drop", args.drop), ("--seed", args.seed),
                        ("--no-driver-prefetch", args.no_driver_prefetch or None), ("--json", args.json or None)):
            if v is not None:
                raise UsageError(f"{flag} applies to --interpret only")
        work = parse_workload(args.workload or [])
        managed = parse_managed(args.managed)
        out = Path(args.output or f"{work.name}.pctrace")
        if out.exists() and not args.force:
            raise OutputExistsError(out)
        if args.device < 0:
            raise UsageError(f"--device must be >= 0, not {args.device}")

        gpuinfo.require_cupti()
        env = gpuinfo.probe(args.device, context=False)  # NoGPUError (exit 2, one line) without a GPU or driver

        from .activity import CuptiActivitySource
        from .collector import Collector, CudaDevice, default_part_seconds

        budget = ManagedBudget(None)  # its limit is set once CUPTI is running (after_start)
        allocator = install(managed, budget) if managed else ["workload's own"]
        manifest = T.new_manifest(
            mode=args.mode, source="cupti",
            workload={"name": work.name, "argv": list(work.argv)},
            device=env.manifest_device(), driver_prefetch=env.driver_prefetch,
            environment=env.manifest_environment(), allocator=allocator,
            allow_oversubscription=bool(args.allow_oversubscription))
        collector = Collector(out, mode=args.mode, source=CuptiActivitySource(device=args.device),
                              device=CudaDevice(args.device), budget=budget, force=args.force,
                              part_seconds=default_part_seconds(), manifest=manifest)

        def after_start() -> None:
            free = gpuinfo.free_memory(args.device)  # creates the context: after CUPTI is configured
            override = os.environ.get("PAGECAST_MANAGED_LIMIT")  # tests: a smaller limit, never a larger one
            if override:
                from pagecast.units import parse_size
                override = parse_size(override)
            # free memory less a reserve for the device allocations the workload makes later
            limit = managed_limit(free, allow_oversubscription=args.allow_oversubscription,
                                  override=override or None)
            budget.limit = limit
            env.free_bytes = free
            if managed and "torch" in managed:
                from .managed import set_torch_limit
                set_torch_limit(limit)
            collector.writer.update_manifest(managed_limit_bytes=limit,
                                             environment=env.manifest_environment())

        info(f"collecting {work.name} on {env.device_name} ({args.mode} mode) into {out}")
        code = collector.run(make_target(work), after_start=after_start)
        info(collector.overhead_line())
        src = collector.source.info
        if src.get("uvm_counters") is False:
            from pagecast.console import warn
            warn(f"no faults or migrations recorded: {src.get('uvm_counters_error')}")
        if collector.failure:
            import sys
            print(f"pagecast collect: error: {collector.failure}", file=sys.stderr)
        what = "trace" if code == 0 else f"partial trace (workload exit code {code})"
        wrote(out, what, f"pagecast summary {out}   |   pagecast fit {out} -o model.json")
        return code


class ImportCommand(Command):
    name = "import"
    writes = ("a trace directory", (".pctrace",))
    help = "a trace from another profiler's export: Nsight Systems (nsys)"
    description = (
        "Convert an Nsight Systems export into a trace: kernels, GPU page faults, unified-memory\n"
        "migrations and allocations (docs/import-nsys.md).\n\n"
        "  nsys profile --trace=cuda --cuda-um-gpu-page-faults=true --cuda-memory-usage=true -o run python train.py\n"
        "  nsys export --type sqlite run.nsys-rep        (or --type parquetdir)\n"
        "  pagecast import nsys run.sqlite -o run.pctrace\n\n"
        "Nsight records no kernel arguments: summary, query, report and replay (demand, oracle, swap)\n"
        "work on the trace; fitting templates needs a trace from pagecast collect.")

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("source", choices=("nsys",), metavar="SOURCE", help="the profiler that wrote REPORT: nsys")
        p.add_argument("report", metavar="REPORT",
                       help="an 'nsys export --type sqlite' file or a '--type parquetdir' directory")
        p.add_argument("-o", "--output", required=True, metavar="DIR", help="trace directory to write")
        p.add_argument("--force", action="store_true", help="overwrite an existing output")
        p.add_argument("--json", action="store_true", help="print what was imported as one JSON document")

    def run(self, args: argparse.Namespace) -> int:
        from pathlib import Path

        from pagecast.console import emit_json, info, progress, warn, wrote
        from pagecast.errors import OutputExistsError

        from .nsys_import import NsysImportConfig, import_nsys

        out = Path(args.output)
        if out.exists() and not args.force:
            raise OutputExistsError(out)
        cfg = NsysImportConfig(report=Path(args.report), output=out, force=args.force)
        with progress("importing", None) as bar:
            res = import_nsys(cfg, progress=bar)
        for n in res.notes:
            warn(n)
        c = res.counts
        if args.json:
            emit_json({"trace": str(res.path), "source": args.source, "schema_version": res.schema_version,
                       "allocations_inferred": res.allocations_inferred, **c, "notes": res.notes})
        else:
            info(f"{c['launches']:,} launches, {c['faults']:,} faults in {c['fault_records']:,} records, "
                 f"{c['migrations']:,} migrations, {c['allocations']:,} allocations"
                 + (" (inferred)" if res.allocations_inferred else "")
                 + f"; nsys schema {res.schema_version}")
        wrote(res.path, "trace", f"pagecast summary {res.path}   |   pagecast replay {res.path} "
                                 "--policy demand,oracle,swap --oversub 2")
        return 0


COMMANDS: list[Command] = [CollectCommand(), ImportCommand()]
