"""`pagecast collect --interpret`: the command's flags into an InterpretConfig, and its output."""

from __future__ import annotations

import argparse
import contextlib
import math
import shutil
import sys
from pathlib import Path

from pagecast import console
from pagecast.errors import InputError, OutputExistsError, UsageError
from pagecast.outputs import check_output_path

from .interpret import InterpretConfig, InterpretResult, collect_interpreted
from .target import make_target, parse_workload

MAX_DROP = 0.5      # losing more than half of the records is not a collection any more


def config_from_args(args: argparse.Namespace) -> InterpretConfig:
    if args.managed:
        raise UsageError("--managed does not apply to --interpret (tensors stay on the CPU; see --allocator)")
    if args.mode != "full":
        raise UsageError("--interpret records full-mode traces only (--mode natural needs a GPU)")
    if args.allow_oversubscription:
        raise UsageError("--allow-oversubscription does not apply to --interpret (nothing is allocated on a GPU)")
    if args.device:
        raise UsageError("--device does not apply to --interpret (no GPU is used)")
    work = parse_workload(args.workload or [])
    try:
        drop = float(args.drop) if args.drop is not None else 0.0
    except ValueError:
        raise UsageError(f"--drop must be a number from 0 to {MAX_DROP:g}, not {args.drop!r}") from None
    if not math.isfinite(drop) or not 0.0 <= drop <= MAX_DROP:
        raise UsageError(f"--drop must be a number from 0 to {MAX_DROP:g}, not {args.drop!r}")
    try:
        seed = int(args.seed) if args.seed is not None else 0
    except ValueError:
        seed = -1
    if seed < 0:
        raise UsageError(f"--seed must be a non-negative integer, not {args.seed!r}")
    out = Path(args.output or f"{work.name}.pctrace")
    if out.exists() and not args.force:
        raise OutputExistsError(out)
    return InterpretConfig(output=out, workload=work, force=bool(args.force), allocator=args.allocator or "direct",
                           drop=drop, seed=seed, driver_prefetch=not args.no_driver_prefetch)


def run_interpret(args: argparse.Namespace, emulation) -> int:
    """The command; `emulation`: the driver emulation's factory (collect_interpreted's)."""
    cfg = config_from_args(args)
    check_output_path(cfg.output)
    console.info(f"collecting {cfg.workload.name} under Triton's interpreter into {cfg.output}")
    quiet = contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()
    with console.progress("launches", None) as bar, quiet:
        res = collect_interpreted(cfg, make_target(cfg.workload), emulation=emulation, progress=bar.advance)
    return report(res, args.json)


def report(res: InterpretResult, as_json: bool) -> int:
    if res.launches == 0:
        shutil.rmtree(res.trace, ignore_errors=True)
        if res.refusal:
            raise InputError(res.refusal)
        raise InputError(f"the workload launched no Triton kernel (exit code {res.code}); no trace written")
    s = res.stats
    if res.refusal:
        print(f"pagecast collect: error: {res.refusal}", file=sys.stderr)
    if s.get("unmapped_addresses"):
        console.warn(f"{s['unmapped_addresses']:,} accessed addresses lay in no tensor argument's storage and are "
                     "not in the truth (a kernel that follows pointers stored in memory?)")
    wall = s.get("wall_seconds") or 0.0
    console.info(f"{res.launches:,} launches of {s['kernels']} kernels; {s['memory_accesses']:,} memory operations, "
                 f"{s['lanes']:,} lanes; {s['hook_seconds']:.2f} s in pagecast's hooks of {wall:.2f} s")
    if as_json:
        console.emit_json({"trace": str(res.trace), "workload_exit_code": res.code, "refusal": res.refusal, **s})
    what = "trace" if res.code == 0 else f"partial trace (workload exit code {res.code})"
    console.wrote(res.trace, what, f"pagecast summary {res.trace}   |   pagecast fit {res.trace} -o model.json")
    return res.code
