"""Subcommands of the plan and replay stages, registered in pagecast.cli: plan, replay.

`plan` translates its flags into the simulator's SimConfig; `replay` parses its flags into one
ReplayRequest (replay/request.py, validated once), which the simulator and the GPU runner take
alike. Heavy imports wait inside `run` so that the CLI starts fast."""

from __future__ import annotations

import argparse
from pathlib import Path

from pagecast.command import Command
from pagecast.errors import UsageError



def _size_list(text: str) -> list[int]:
    from pagecast.units import parse_size_list
    return parse_size_list(text)


def _split_at_double_dash(p: argparse.ArgumentParser) -> None:
    """Everything after the first `--` is the GPU workload's command (argparse alone
    would hand it to the TRACE positional)."""
    orig = p.parse_known_args

    def parse_known_args(args=None, namespace=None):
        import sys
        args = list(sys.argv[1:] if args is None else args)
        tail: list[str] = []
        if "--" in args:
            i = args.index("--")
            args, tail = args[:i], args[i + 1:]
        ns, extra = orig(args, namespace)
        ns.workload = tail
        return ns, extra

    p.parse_known_args = parse_known_args  # type: ignore[method-assign]
    p.epilog = "A GPU workload goes last, after --: pagecast replay --backend gpu ... -- python train.py"


def _add_sim_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("simulator (--backend sim)")
    g.add_argument("--costs", default="msched-rtx5080", metavar="NAME|FILE",
                   help="cost profile: msched-rtx5080 (default), pcie4, pcie3, none, or a JSON file")
    g.add_argument("--granularity", metavar="SIZE", help="migration unit of a fault (default: the profile's, 64KiB)")
    g.add_argument("--eviction-unit", metavar="SIZE", help="eviction unit (default: the profile's, 2MiB)")
    g.add_argument("--eviction", default="driver", choices=("driver", "fifo", "lru"),
                   help="victim order of fault-path evictions: driver = a chunk goes to the list's tail on every"
                        " migration into it, the driver's (default); fifo = first residency; lru = every touch")
    g.add_argument("--no-driver-prefetch", action="store_true",
                   help="switch the driver's prefetcher off (a fault then moves its 4 KiB page)")
    _add_oversub_of(g)
    g.add_argument("--timeslice", type=float, default=10.0, metavar="MS",
                   help="round-robin time slice between tasks, ms of kernel time (default 10)")
    _add_span_flag(g)
    g.add_argument("-j", "--jobs", type=int, default=None, metavar="N",
                   help="runs (a policy at a capacity) going at once, in threads (default: one per core, as "
                        "many as the memory available holds, a policy's own runs one at a time; given, a "
                        "policy's capacities go at once too, for more memory; 1: one at a time, the least "
                        "memory). Plans judged on the whole timeline on needs over 64 MiB (long profiles) go "
                        "one at a time whatever N is. The runs are the same either way")
    _add_placement_flag(g, "device (default): every policy leaves placement to the driver; auto: template and oracle "
                           "also try leaving sparsely touched allocations in host memory, read over the link "
                           "(preferred location CPU, accessed by the GPU), and keep it where their own trial "
                           "says it is faster (simulator only; docs/cost-model.md, 'Host placement')")


def _add_placement_flag(g, help: str) -> None:
    g.add_argument("--placement", default="device", choices=("device", "auto"), help=help)


SPAN_CHOICES = ("auto", "unit", "block", "fitted", "allocation")   # "auto" and plan_io.SPANS (not imported: CLI start-up)


def _add_span_flag(g) -> None:
    g.add_argument("--span", default="auto", choices=SPAN_CHOICES,
                   help="what template and oracle plan on: their units, whole 2 MiB blocks, blocks where "
                        "widening pays (fitted), or with whole allocations added; auto (default) tries each in "
                        "the simulator and keeps the fastest (oracle also tries leaving some transfers to "
                        "faults); a fixed span is Belady's plan at it")
    g.add_argument("--choose-on", type=int, default=32768, metavar="LAUNCHES",
                   help="with more launches than this, template and oracle first compare their candidate plans "
                        "(needs, spans, fronts) on a sample of this many launches, four stretches spread over the "
                        "timeline, then judge the sample's needs and span (with its kin: block and fitted) on "
                        "the whole timeline (default 32768; 0: compare every candidate on the whole timeline, "
                        "slower on long profiles; docs/cost-model.md, 'Choices on a sample')")


# The one definition of oversubscription (docs/cli.md, the runs' `oversub` and `oversub_of`, the
# report's axis): R = the managed memory allocated / the GPU capacity.
OVERSUB_HELP = ("oversubscription R: the capacity is the managed memory allocated / R, so 2 = 200%%, twice as"
                " much allocated as the GPU holds (--oversub-of touched: the touched footprint instead)")


def _add_oversub_of(g) -> None:
    g.add_argument("--oversub-of", default="managed", choices=("managed", "touched"),
                   help="what oversubscription is a ratio of: managed (default) = the managed memory the"
                        " traces allocate, the most live at once, summed over tasks, as the literature counts it;"
                        " touched = the union of the launches' footprints")


class PlanCommand(Command):
    name = "plan"
    writes = ("a plan directory", (".plan",))
    help = "a prefetch/evict plan for a trace's launch sequence, made from a model"
    description = ("Predict every launch's footprint with MODEL, then plan before each launch what to prefetch\n"
                   "and what to evict (Belady on the predictions), never exceeding the capacity. The plan is\n"
                   "made on the predicted units, on whole 2 MiB blocks, or with whole allocations added:\n"
                   "whichever runs fastest when the simulator tries each on the predictions.\n\n"
                   "  pagecast plan model.json run.pctrace --oversub 2 -o run.plan")

    def add_arguments(self, p):
        p.add_argument("model", metavar="MODEL")
        p.add_argument("trace", metavar="TRACE")
        g = p.add_mutually_exclusive_group(required=True)
        g.add_argument("--capacity", metavar="SIZE", help="GPU memory for the workload, e.g. 8GiB")
        g.add_argument("--oversub", type=float, metavar="R",
                       help=OVERSUB_HELP)
        p.add_argument("-o", "--output", required=True, metavar="PLAN", help="plan directory to write")
        p.add_argument("--force", action="store_true", help="overwrite an existing plan")
        p.add_argument("--costs", default="msched-rtx5080", metavar="NAME|FILE",
                       help="cost profile: the migration granularity, and the costs the span is chosen by"
                            " (default msched-rtx5080)")
        p.add_argument("--granularity", metavar="SIZE", help="plan in units of SIZE (default: the profile's)")
        _add_span_flag(p)
        _add_oversub_of(p)
        _add_placement_flag(p, "device (default): the plan leaves placement to the driver; auto: it may leave "
                               "sparsely touched allocations in host memory (the manifest's host_ranges) where "
                               "its trial run says that is faster (docs/cost-model.md, 'Host placement')")
        p.add_argument("--json", action="store_true", help="print the plan's manifest as JSON")

    def run(self, args):
        from pagecast import console
        from pagecast.errors import OutputExistsError
        from pagecast.predict.model_io import load_model
        from pagecast.trace import read_trace
        from pagecast.units import format_size, parse_size

        from .plan import plan_io
        from .sim.sweep import SimConfig, make_plan

        out = Path(args.output)
        if out.exists() and not args.force:
            raise OutputExistsError(out)
        cap = None if args.capacity is None else parse_size(args.capacity)
        if cap is not None and cap <= 0:
            raise UsageError(f"--capacity must be > 0, not {args.capacity}")
        model = load_model(args.model)
        from pagecast.trace import LAZY_TABLES
        trace = read_trace(args.trace, lazy=LAZY_TABLES).require_launches("plan").require_argument_bytes("plan")
        from pagecast.memory import return_freed_arrays
        return_freed_arrays()   # the planner's trial runs free per-use arrays of many sizes (pagecast/memory.py)
        cfg = SimConfig(costs=args.costs, granularity=None if args.granularity is None else parse_size(args.granularity),
                        span=args.span, oversub_of=args.oversub_of, placement=args.placement,
                        choose_on=args.choose_on)
        with console.progress("planning", None):
            plan = make_plan(model, trace, capacity=cap, oversub=args.oversub, config=cfg, model_path=str(args.model))
        plan.save(out, force=args.force)
        table, manifest = plan.table, plan.manifest
        if args.json:
            console.emit_json(manifest)
        else:
            console.info(f"{table.num_rows:,} transfers: {format_size(manifest['prefetch_bytes'])} in, "
                         f"{format_size(manifest['evict_bytes'])} out at capacity "
                         f"{format_size(manifest['capacity_bytes'])}, planned on {SPAN_WORDS[manifest['span']]}"
                         + (f"; {manifest['thrashing_launches']} launches larger than it" if manifest['thrashing_launches'] else "")
                         + (f"; {format_size(sum(b - a for a, b in manifest[plan_io.HOST_RANGES]))} left on the host"
                            f" ({len(manifest[plan_io.HOST_RANGES])} allocations)" if manifest.get(plan_io.HOST_RANGES) else ""))
        console.wrote(out, "plan", f"pagecast replay {args.trace} --policy demand,template,oracle "
                                   f"--plan {out} --capacity {manifest['capacity_bytes']}")
        return 0


class ReplayCommand(Command):
    name = "replay"
    writes = ("Parquet results", (".parquet", ".pq"))
    help = "replay traces under policies (simulator or GPU) and compare them"
    description = ("Replay launch sequences on a GPU of the given capacity under each policy and compare\n"
                   "time, stall, faults and bytes moved, under the registered policies (pagecast.replay.policies;\n"
                   "an unknown name lists them).\n"
                   "Several traces are several tasks sharing one GPU (round-robin time slices).\n\n"
                   "  pagecast replay a.pctrace b.pctrace --policy demand,template,oracle --oversub 1.5,2,3 --model m.json\n"
                   "  pagecast replay --backend gpu --model m.json --policy demand,template -- python train.py")

    def add_arguments(self, p):
        p.add_argument("traces", nargs="*", metavar="TRACE", help="trace directories (simulator); none for a GPU workload")
        p.add_argument("--policy", required=True, metavar="P,...",
                       help="comma-separated registered policy names (an unknown one lists them)")
        g = p.add_mutually_exclusive_group()
        g.add_argument("--capacity", metavar="SIZE,...", help="GPU memory sizes, e.g. 1GiB,2GiB")
        g.add_argument("--oversub", metavar="R,...",
                       help=OVERSUB_HELP)
        p.add_argument("--model", metavar="MODEL", help="model for the template and runner policies (planned on the fly)")
        p.add_argument("--plan", metavar="PLAN",
                       help="a plan from 'pagecast plan', carried out by every policy that carries out a plan"
                            " (template; runner, the GPU runner in the simulator), replayed at the capacity it was"
                            " made for; a plan for another capacity or trace is refused (GPU: give its TRACE, and"
                            " --model too: the runner predicts from it where a run leaves the plan)")
        p.add_argument("--feedback", action="store_true", help="refine the model online after each missed page")
        p.add_argument("--backend", default="sim", choices=("sim", "gpu"), help="sim (default) or gpu")
        p.add_argument("--json", action="store_true", help="print one JSON list of runs on stdout")
        p.add_argument("--all", action="store_true",
                       help="print every run (time, stall, faults, bytes), not the summary of speedups")
        p.add_argument("-o", "--output", metavar="RESULTS.parquet", help="write the runs (and a timeline beside them)")
        p.add_argument("--force", action="store_true", help="overwrite existing results")
        _add_sim_flags(p)
        g2 = p.add_argument_group("GPU backend (--backend gpu)")
        g2.add_argument("--repeat", type=int, default=1, metavar="N", help="runs per policy (median reported)")
        g2.add_argument("--allow-oversubscription", action="store_true",
                        help="let the workload allocate more than the GPU's free memory (may hang the GPU)")
        g2.add_argument("--no-lookahead", action="store_true",
                        help="template and oracle decide one launch at a time (default, with a TRACE: their"
                             " plans are made at start, template's from --model, as the simulator makes them,"
                             " unless --plan gives it, and carried out ahead on a copy stream; a TRACE whose"
                             " launches carry no argument bytes cannot be matched to the workload's: no plan"
                             " then, with a warning)")
        g2.add_argument("--discard-unfreed", action="store_true",
                        help="with the lookahead: discard data the program never frees after its last use in"
                             " the trace, not only freed temporaries (off: the host may still read it)")
        p.set_defaults(workload=[])
        _split_at_double_dash(p)

    def run(self, args):
        from pagecast import console
        from pagecast.outputs import check_output_file

        req = replay_request(args)   # every flag checked here, once
        if args.output:
            from .results_io import timeline_path
            for pth in (Path(args.output), timeline_path(args.output)):
                check_output_file(pth, args.force, "results.parquet")
        if req.backend == "gpu":
            from .gpu.backend import run_gpu_replay
            runs, timeline = run_gpu_replay(req, planner=gpu_planner(req))
        else:
            from .sim.sweep import simulate
            with console.progress("replaying", len(req.policies) * len(req.levels)) as bar:
                runs, timeline = simulate(req, progress=bar, timeline=bool(args.output))
        return _report(args, runs, timeline)


def gpu_planner(req):
    """The plans of a GPU replay's planned policies, made at its start as the simulator makes them,
    so that the child carries out their schedule (online/planned.py) rather than deciding online:
    template's from the model's predictions of the trace (make_plan, as `pagecast plan` makes it),
    oracle's from the trace's true footprints (make_truth_plan). A callable (policy, capacity in
    bytes, plan directory) -> that directory, or None where that policy gets none (template: a
    --plan given, which its runs carry out instead, no model, or --feedback, which a fixed plan
    cannot follow); None for the whole replay where no run could use one (no trace; --no-lookahead:
    one launch at a time). Made here, where the replay stage may import both the simulator and the
    GPU runner (tests/layering.py)."""
    from .policies import POLICIES

    if req.backend != "gpu" or len(req.traces) != 1 or not req.lookahead:
        return None
    template_ok = req.plan is None and bool(req.model) and not req.feedback
    if not any(POLICIES[p].chooses_span and (POLICIES[p].requires != "model-or-plan" or template_ok)
               for p in req.policies):
        return None
    loaded: dict = {}

    def plan_at(policy: str, capacity: int, directory: Path) -> Path | None:
        from pagecast import console
        from pagecast.memory import return_freed_arrays
        from pagecast.predict.model_io import load_model
        from pagecast.trace import LAZY_TABLES, read_trace
        from pagecast.units import format_size

        from .sim.sweep import SimConfig, make_plan, make_truth_plan

        pol = POLICIES[policy]
        if not pol.chooses_span or (pol.requires == "model-or-plan" and not template_ok):
            return None
        if "trace" not in loaded:
            loaded["trace"] = read_trace(req.traces[0], lazy=LAZY_TABLES).require_launches("replay")
        trace, cfg = loaded["trace"], SimConfig(costs=req.costs, choose_on=req.choose_on)
        return_freed_arrays()   # the planner's trial runs free per-use arrays of many sizes (pagecast/memory.py)
        with console.progress(f"planning {policy} at {format_size(capacity)}", None):
            if pol.places == "truth":
                plan = make_truth_plan(pol, trace, capacity=capacity, config=cfg)
            else:
                if trace.manifest.get("argument_bytes") is False:   # nothing to predict from (as pagecast plan)
                    return None
                if "model" not in loaded:
                    loaded["model"] = load_model(req.model)
                plan = make_plan(loaded["model"], trace, capacity=capacity, config=cfg, model_path=str(req.model))
        return plan.save(directory)

    return plan_at


JSON_FIELDS = ("policy", "backend", "capacity_bytes", "oversub", "time_s", "stall_s", "faults", "htod_bytes",
               "dtoh_bytes", "speedup_vs_demand")


def _report(args, runs, timeline) -> int:
    from pagecast import console
    from pagecast.units import format_size

    for cap in sorted({r["capacity_bytes"] for r in runs if r.get("thrashing_launches")}):
        r = next(x for x in runs if x["capacity_bytes"] == cap and x.get("thrashing_launches"))
        console.warn(f"{r['thrashing_launches']:,} of {r['launches']:,} launches touch more than the capacity"
                     f" {format_size(cap)}; they are simulated as thrashing")

    if args.output:
        from .results_io import write_results
        write_results(args.output, runs, timeline, force=args.force)
    if args.json:
        console.emit_json(runs)
    else:
        from .results_table import results_table
        from pagecast.report.pivot import applies, make_pivot, pivot_table
        show_all = getattr(args, "all", False) or not applies(runs)   # the pivot needs demand and another policy
        console.stdout().print(results_table(runs) if show_all else pivot_table(make_pivot(runs)))
        for line in host_lines(runs):
            console.stdout().print(line)
    if args.output:
        console.wrote(args.output, "replay results", f"pagecast report {args.output} -o report.html   |   "
                                                     f"pagecast export perfetto {args.output} -o timeline.pftrace")
    return 0


def host_lines(runs) -> list[str]:
    """Per policy that left memory on the host (--placement auto), one line: how much, and where."""
    from pagecast.units import format_size
    out = []
    for p in dict.fromkeys(r["policy"] for r in runs):
        placed = [r for r in runs if r["policy"] == p and r.get("host_bytes")]
        if placed:
            levels = ", ".join(f"{r['oversub']:.0%}" if r.get("oversub") else format_size(r["capacity_bytes"])
                               for r in placed)
            out.append(f"{p} left {format_size(placed[0]['host_bytes'])} on the host (read over the link) at {levels};"
                       " docs/cost-model.md, 'Host placement'")
    return out


SPAN_WORDS = {"unit": "the predicted units", "block": "whole 2 MiB blocks (faster here than units)",
              "fitted": "whole 2 MiB blocks where widening pays (faster here than units or all blocks)",
              "allocation": "whole allocations (faster here than units or blocks)"}


def _followers() -> list[str]:
    """The registered policies that carry out a --plan given (`Policy.follows_plan`)."""
    from .policies import POLICIES
    return [n for n, c in POLICIES.items() if c.follows_plan]


def replay_request(args):
    """The replay command's flags -> one ReplayRequest (validated as it is made), warning about the
    flags the chosen backend or policies do not use (and leaving those out)."""
    from pagecast import console
    from pagecast.units import parse_float_list, parse_list, parse_size

    from .policies import POLICIES
    from .request import ReplayRequest

    policies = parse_list(args.policy, "--policy")   # names checked by the request, against the registry
    capacity = None if args.capacity is None else _size_list(args.capacity)
    oversub = None if args.oversub is None else parse_float_list(args.oversub, "--oversub")
    backend = args.backend
    model, plan, feedback = args.model, args.plan, args.feedback
    span = args.span
    warns: list[str] = []   # said once the request stands (a bad flag is one line, no warnings before it)
    known = [p for p in policies if p in POLICIES]
    followers = [p for p in known if POLICIES[p].follows_plan]   # the policies that carry out a --plan
    if backend == "gpu":
        if plan and not followers:
            warns.append("--plan is for the template policy, which is not among --policy; ignored")
            plan = None
        elif plan and getattr(args, "no_lookahead", False):
            warns.append("--plan is carried out ahead of the launches; with --no-lookahead template decides one"
                         " launch at a time and the plan is not used")
            plan = None
        if span != "auto":
            warns.append("the GPU backend prefetches the predicted ranges themselves; --span is for the simulator")
        if getattr(args, "jobs", None) is not None:
            warns.append("--jobs is for the simulator (the GPU runs one capacity at a time); ignored")
        span = "auto"
    else:
        needs = {POLICIES[p].requires for p in known}
        if plan and not followers:
            warns.append(f"--plan is for the policies that carry out a plan ({', '.join(_followers())}), none of"
                         " which is among --policy; ignored")
            plan = None
        if model and not needs & {"model", "model-or-plan"}:
            warns.append("--model is for the template policy, which is not among --policy; ignored")
            model = None
        if feedback and "model-or-plan" not in needs:
            warns.append("--feedback is for the template policy, which is not among --policy; ignored")
            feedback = False
        if plan and model and all(POLICIES[p].follows_plan for p in known if POLICIES[p].requires):
            warns.append(f"--plan and --model both given: {' and '.join(followers)}"
                         f" follow{'s' if len(followers) == 1 else ''} the plan (its manifest names its"
                         " model); --model is not used")
        if args.repeat != 1:
            warns.append("--repeat is for --backend gpu; the simulator is deterministic and runs once")
        if getattr(args, "no_lookahead", False):
            warns.append("--no-lookahead is for --backend gpu (the simulator's runner models the lookahead)")
        if getattr(args, "discard_unfreed", False):
            warns.append("--discard-unfreed is for --backend gpu")
        if plan and "model-or-plan" in needs and span != "auto":
            warns.append(f"--span {span} applies to oracle only: template follows the plan, made at the"
                         " span its manifest names")
    sim = {}
    if backend == "gpu":   # the lookahead's depth comes from the profile's per-call cost and bandwidth
        # the plans made at start compare their candidates on a sample as the simulator's do
        sim = dict(discard_unfreed=bool(getattr(args, "discard_unfreed", False)), choose_on=args.choose_on)
        if getattr(args, "costs", None):
            sim["costs"] = args.costs
    if backend == "sim":
        sim = dict(costs=args.costs, eviction=args.eviction, driver_prefetch=not args.no_driver_prefetch,
                   timeslice_ms=args.timeslice, choose_on=args.choose_on, jobs=args.jobs,
                   granularity=None if args.granularity is None else parse_size(args.granularity),
                   eviction_unit=None if args.eviction_unit is None else parse_size(args.eviction_unit))
    req = ReplayRequest(
        backend=backend, policies=tuple(policies), traces=tuple(str(t) for t in (args.traces or ())),
        capacity=None if capacity is None else tuple(capacity), oversub=None if oversub is None else tuple(oversub),
        oversub_of=args.oversub_of, model=model, plan=plan, feedback=feedback, repeat=args.repeat, span=span,
        workload=tuple(args.workload), allow_oversubscription=args.allow_oversubscription,
        placement=args.placement, lookahead=not getattr(args, "no_lookahead", False), **sim)
    for w in warns:
        console.warn(w)
    return req


COMMANDS: list[Command] = [PlanCommand(), ReplayCommand()]
