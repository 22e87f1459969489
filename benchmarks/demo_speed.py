"""`pagecast demo` cold and warm: wall and CPU time, this tree beside an earlier commit.

    python benchmarks/demo_speed.py --base 3d2f1a0 --markdown /tmp/demo.md
    python benchmarks/demo_speed.py --no-base --warm 2

Cold is the first demo after a fresh install: numba's cache empty (a new NUMBA_CACHE_DIR), so
every compiled kernel is compiled on the way, as on a new machine (`pip install` itself not
counted). Warm is the next run with that cache, into a new output directory (the traces are made
again: nothing but numba's cache is kept). Each run is `python -m pagecast.cli demo -o DIR` in its
own process; its CPU time is that process's and its workers' (user + system, `os.wait4`'s
rusage: the spawned workers are waited for inside it), which a loaded machine changes far less
than the wall time. The load average before and after each run is printed beside it.

The earlier commit's code runs from a `git archive` of it put first on PYTHONPATH
(bench_replay_memory.base_tree), with its own cold cache. The runs' tables must agree where the
two codes run the same demo; this script only times them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_replay_memory import base_tree  # noqa: E402  (a sibling script)


def run_demo(out: Path, cache: Path, shim: Path | None, extra: list[str]) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache))
    if shim is not None:
        env["PYTHONPATH"] = str(shim) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "pagecast.cli", "demo", "-o", str(out), *extra], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"demo failed (exit {code}): {err.strip().splitlines()[-1] if err.strip() else ''}")
    return {"wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime, "load": (load0, os.getloadavg()[0])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="fcffaf6", help="the earlier commit to compare with (default: the demo "
                                                      "before it ran its steps in parallel)")
    ap.add_argument("--no-base", action="store_true", help="time this tree only")
    ap.add_argument("--warm", type=int, default=1, help="warm runs after the cold one (default 1)")
    ap.add_argument("--work", default=None, help="where the runs go (default: a temporary directory)")
    ap.add_argument("--markdown", default=None, help="also write the table here")
    ap.add_argument("demo_args", nargs="*", help="more `pagecast demo` flags, after --")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="pagecast-demo-speed-"))
    codes: list[tuple[str, Path | None]] = [("this tree", None)]
    if not args.no_base:
        codes.append((f"base {args.base}", base_tree(args.base, work)))
    print(f"{os.cpu_count()} CPUs; work in {work}", file=sys.stderr)
    rows = []
    for k, (name, shim) in enumerate(codes):
        cache = work / f"numba-cache-{k}"
        for i in range(1 + args.warm):
            kind = "cold" if i == 0 else "warm"
            r = run_demo(work / f"demo-{k}-{i}", cache, shim, args.demo_args)
            rows.append((name, kind, r))
            print(f"{name:>16} {kind}: {r['wall_s']:6.1f} s wall, {r['cpu_s']:6.1f} s CPU "
                  f"(load {r['load'][0]:.1f} -> {r['load'][1]:.1f})", file=sys.stderr, flush=True)
    lines = ["| code | run | wall (s) | CPU (s) | load average before -> after |", "|---|---|---|---|---|"]
    for name, kind, r in rows:
        lines.append(f"| {name} | {kind} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | "
                     f"{r['load'][0]:.1f} -> {r['load'][1]:.1f} |")
    if len(codes) > 1:
        for kind in ("cold", "warm"):
            a = [r for n, k, r in rows if k == kind and n == codes[0][0]]
            b = [r for n, k, r in rows if k == kind and n == codes[1][0]]
            if a and b:
                lines.append(f"| base / this tree | {kind} | {b[0]['wall_s'] / a[0]['wall_s']:.2f}x | "
                             f"{b[0]['cpu_s'] / a[0]['cpu_s']:.2f}x | |")
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
