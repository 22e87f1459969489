"""The GPU stage's subcommand, calibrate, registered in pagecast.cli."""

from __future__ import annotations

import argparse

from pagecast.command import Command


class CalibrateCommand(Command):
    name = "calibrate"
    writes = ("a JSON cost profile", (".json",))
    help = "measure fault cost and bulk bandwidth on the GPU, write a cost profile for the simulator"
    description = (
        "Measure, on this machine's GPU, the cost of one GPU page fault (a kernel touching N pages,\n"
        "one per 64 KiB, under demand paging, for several N) split into its per-fault, per-2 MiB-block\n"
        "and per-batch parts (N pages of one block; one page of each of N blocks; a lone fault),\n"
        "the bulk prefetch bandwidth each way,\n"
        "whether eviction and population overlap (two streams), the launch overhead, the device\n"
        "bandwidth and the host time of the planned runner's launch callback by kind (nothing due,\n"
        "a stream wait only, a base plus a cost per call: the simulator's oracle plan of a small\n"
        "trace carried out on this driver), and write a cost profile that 'pagecast replay --backend sim --costs PROFILE.json'\n"
        "loads. Takes well under a minute; never allocates more than a quarter of the free GPU memory.\n"
        "Needs an NVIDIA GPU with a CUDA 13 driver (exit 2 without one).")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("-o", "--output", required=True, metavar="PROFILE.json", help="cost profile to write")
        parser.add_argument("--force", action="store_true", help="overwrite an existing profile")
        parser.add_argument("--name", default=None, help="profile name (default: the output's file name)")
        parser.add_argument("--device", type=int, default=0, help="CUDA device ordinal (default 0)")
        parser.add_argument("--repeats", type=int, default=3, help="repetitions of each measurement (default 3)")
        parser.add_argument("--json", action="store_true", help="print the fitted numbers as one JSON document")

    def run(self, args: argparse.Namespace) -> int:
        from pagecast import console
        from pagecast.errors import UsageError
        from pagecast.outputs import check_output_file

        out = check_output_file(args.output, args.force, "profile.json")
        if args.repeats < 1:
            raise UsageError(f"--repeats must be >= 1, found {args.repeats}")
        name = args.name or out.stem

        from pagecast.errors import NoGPUError
        from pagecast.replay.costs import save_profile
        from pagecast.replay.gpu import calibrate as C
        from pagecast.replay.gpu.cupti_monitor import CuptiMonitor
        from pagecast.replay.gpu.driver import open_cuda

        # CUPTI's unified-memory counters are set up before the CUDA context exists
        monitor, why = None, None
        try:
            monitor = CuptiMonitor(args.device)
            monitor.start()
        except NoGPUError as e:
            monitor, why = None, e
        cuda = open_cuda(args.device)  # NoGPUError: one line, exit 2
        if monitor is None:
            console.warn(f"{why}; fitting the fault cost against pages touched instead of faults counted")
        with console.progress("calibrating", C.steps(args.repeats)) as bar:
            m = C.measure(cuda, monitor, repeats=args.repeats, progress=bar, start_monitor=False,
                          plan_for=oracle_planner)
        profile = C.fit_profile(m, name=name)
        save_profile(profile, out, force=args.force)
        s = C.summary(profile)
        s["elapsed_s"] = m.elapsed_s
        s["device"] = m.device
        s["output"] = str(out)
        if args.json:
            console.emit_json(s)
        else:
            t = console.table(f"cost profile {name}: {profile.description}",
                              "Measured on this GPU: what each event costs the simulator (replay --costs FILE). "
                              "us: the time a fault, or one more fault, block or batch of faults, adds; GB/s: "
                              "transfer rates (higher is faster; docs/cost-model.md).")
            t.add_column("quantity")
            t.add_column("value", justify="right", no_wrap=True)
            t.add_row("GPU page fault (lone)", f"{s['lone_fault_us']:.2f} us")
            t.add_row("  one more fault in a block", f"{s['fault_time_us']:.2f} us")
            t.add_row("  one more 2 MiB block in a batch", f"{s['block_service_us']:.2f} us")
            t.add_row("  one more batch", f"{s['batch_overhead_us']:.2f} us")
            t.add_row("prefetch host -> device", f"{s['htod_GBps']:.1f} GB/s")
            t.add_row("prefetch device -> host", f"{s['dtoh_GBps']:.1f} GB/s")
            t.add_row("eviction and population overlap", "yes" if s["duplex"] else "no")
            t.add_row("both directions together", f"{s['pipelined_GBps']:.1f} GB/s")
            t.add_row("transfer latency", f"{s['transfer_latency_us']:.1f} us")
            t.add_row("kernel launch", f"{s['launch_overhead_us']:.1f} us")
            t.add_row("launch callback (host), deciding online", f"{s['host_launch_us']:.2f} us")
            t.add_row("  planned, nothing due", f"{s['host_quiet_us']:.2f} us")
            t.add_row("  a stream wait only", f"{s['host_wait_us']:.2f} us")
            t.add_row("  with calls", f"{s['host_base_us']:.2f} us + {s['host_call_us']:.2f} us a call")
            t.add_row("device memory", f"{s['device_GBps']:.0f} GB/s")
            console.stdout().print(t)
        console.wrote(out, "cost profile",
                      f"pagecast replay TRACE --backend sim --costs {out} --policy demand,template --oversub 2"
                      " --model MODEL")
        return 0


COMMANDS: list[Command] = [CalibrateCommand()]


def oracle_planner(trace, capacity: int):
    """The simulator's oracle plan of `trace` at `capacity` bytes (sim/sweep.make_truth_plan, as a GPU
    replay makes it at start): what calibrate's planned-callback probe carries out. Here, where the
    CLI layer may import both the simulator and the GPU runner (tests/layering.py)."""
    from pagecast.replay.policies import POLICIES
    from pagecast.replay.sim.sweep import make_truth_plan

    return make_truth_plan(POLICIES["oracle"], trace, capacity=capacity)
