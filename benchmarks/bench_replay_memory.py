"""Peak memory and wall time of `pagecast replay`, this tree against an earlier commit, side by side.

    python benchmarks/bench_replay_memory.py --scale 3 10 --base 3c7c282 --markdown /tmp/mem.md
    python benchmarks/bench_replay_memory.py --scale 10 --each demand,alloc,template,oracle,swap,runner

For each scale: makes llm-decode at that scale (seed 1; scale 100 is 10^6 launches), fits a model
on llm-decode at scale 1 (seed 2), then runs `pagecast replay TRACE --policy POLICIES
--oversub 1.5,2,3 --model MODEL --json` (POLICIES: `--policies`, by default
demand,alloc,template,oracle: the policies a user runs together) twice, each in its own process:
with this tree's code and with the code of `--base` (extracted with `git archive` into the work
directory and imported ahead of the installed package through PYTHONPATH). Peak RSS is the
child's own high-water mark (`os.wait4`'s ru_maxrss), so each figure is that one command's,
interpreter and libraries included. The two runs' JSON must agree run for run (the script exits 1
where they do not).

`--each P,...` also replays each of those policies alone at every scale (both codes, unless
`--old-max-scale` says otherwise) and reports each one's peak beside demand's (the `ratio` column:
its peak over demand's peak, same code, same scale): what a policy's own state costs over the
workload every policy shares. `swap` moves whole tasks; `runner` replays the GPU runner's
decisions launch by launch (it needs the model).

`--sample S` logs each replay's RSS and high-water mark every S seconds (Linux /proc). Scale 100
was measured under `prlimit --as=14000000000` (address space runs ahead of RSS) with
`--sample 10`. `--old-max-scale S` skips the earlier code above scale S (it needed 16 GB at scale 100); the new
code still runs there. Every replay runs alone, one after the other, never two at once, so they do
not compete for memory.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
POLICIES = "demand,alloc,template,oracle"
OVERSUB = "1.5,2,3"
FOLDERS = ("collect", "datasets", "predict", "replay", "report")   # pyproject's package-dir: pagecast.<folder>


def base_tree(commit: str, work: Path) -> Path:
    """A directory to put first on PYTHONPATH so that `import pagecast` is `commit`'s code."""
    root = work / f"base-{commit}"
    shim = root / "shim"
    if (shim / "pagecast").exists():
        return shim
    src = root / "src"
    src.mkdir(parents=True, exist_ok=True)
    tar = subprocess.run(["git", "-C", str(REPO), "archive", commit], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=tar, check=True)
    shim.mkdir(exist_ok=True)
    (shim / "pagecast").symlink_to(src / "pagecast")
    for d in FOLDERS:   # pagecast.replay = replay/, ... as the installed package maps them
        link = src / "pagecast" / d
        if not link.exists():
            link.symlink_to(src / d)
    return shim


def proc_status(pid: int) -> str:
    """The child's VmRSS and VmHWM from /proc (Linux), or "" where it cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return " ".join(" ".join(line.split()) for line in f if line.startswith(("VmRSS", "VmHWM")))
    except OSError:
        return ""


def run_cli(argv: list[str], pythonpath: Path | None, sample_s: float = 0.0,
            log=None) -> tuple[float, int, str, str]:
    """(wall s, peak RSS bytes, stdout, stderr) of `pagecast ARGV` in a child process. With
    `sample_s`, the child's RSS and high-water mark are written to `log` every `sample_s` seconds
    (a long run's progress; a run stopped by a memory cap still says how far it got)."""
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    else:
        env.pop("PYTHONPATH", None)
    code = "import sys; from pagecast.cli import main; sys.exit(main(sys.argv[1:]))"
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen([sys.executable, "-c", code, *argv], stdout=out, stderr=err, env=env, cwd="/")
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG if sample_s > 0 else 0)
            if pid:
                break
            print(f"{time.perf_counter() - t0:8.0f} s  {proc_status(p.pid)}", file=log or sys.stderr, flush=True)
            time.sleep(sample_s)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        o, e = out.read().decode(), err.read().decode()
    if p.returncode != 0:
        raise SystemExit(f"pagecast {' '.join(argv)} exited {p.returncode}: {e.strip()[-500:]}")
    return wall, ru.ru_maxrss * 1024, o, e


def which_code(pythonpath: Path | None) -> str:
    env = dict(os.environ, PYTHONPATH=str(pythonpath)) if pythonpath else {k: v for k, v in os.environ.items()
                                                                         if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", "import pagecast.replay.sim.sweep as s; print(s.__file__)"],
                          env=env, capture_output=True, text=True, check=True, cwd="/").stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, nargs="+", default=[3.0, 10.0])
    ap.add_argument("--base", default="3c7c282", help="the earlier commit to compare with")
    ap.add_argument("--work", default=None, help="where traces and the base tree go (default: a temporary dir)")
    ap.add_argument("--old-max-scale", type=float, default=25.0, help="run the base code only up to this scale")
    ap.add_argument("--markdown", default=None, help="write the table here")
    ap.add_argument("--policies", default=POLICIES,
                    help=f"the policies replayed together (default {POLICIES}; '' for none)")
    ap.add_argument("--each", default="", metavar="P,...",
                    help="also replay each of these policies alone (e.g. demand,alloc,template,oracle,swap,runner)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--sample", type=float, default=0.0, metavar="S",
                    help="log each replay's RSS and high-water mark every S seconds (to stderr)")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="pagecast-bench-mem-"))
    work.mkdir(parents=True, exist_ok=True)
    shim = base_tree(args.base, work)
    print(f"this tree: {which_code(None)}\nbase {args.base}: {which_code(shim)}", file=sys.stderr)
    fit = work / "fit-s1-seed2.pctrace"
    model = work / "model.json"
    if not model.exists():
        if not fit.exists():
            run_cli(["datasets", "make", "llm-decode", "--scale", "1", "--seed", "2", "-o", str(fit)], None)
        run_cli(["fit", str(fit), "-o", str(model)], None)
    rows = []
    each = [p for p in (args.each or "").split(",") if p]
    for scale in args.scale:
        tr = work / f"llm-decode-s{scale:g}.pctrace"
        if not tr.exists():
            run_cli(["datasets", "make", "llm-decode", "--scale", f"{scale:g}", "--seed", "1", "-o", str(tr)], None)
        size = sum(f.stat().st_size for f in tr.rglob("*") if f.is_file())
        manifest = json.loads((tr / "manifest.json").read_text())
        for policies in ([args.policies] if args.policies else []) + each:
            argv = ["replay", str(tr), "--policy", policies, "--oversub", OVERSUB, "--json"]
            if any(p in ("template", "runner") for p in policies.split(",")):
                argv += ["--model", str(model)]
            res = {}
            for name, pp in (("this tree", None), (f"base {args.base}", shim)):
                if pp is not None and scale > args.old_max_scale:
                    continue
                wall, peak, out, _ = run_cli(argv, pp, args.sample)
                res[name] = json.loads(out)
                rows.append({"scale": scale, "policies": policies, "code": name, "launches": res[name][0]["launches"],
                             "trace_bytes": size, "wall_s": round(wall, 1), "peak_rss_bytes": peak,
                             "workload": manifest["workload"]["name"]})
                print(f"scale {scale:g} {policies} {name}: {wall:.1f} s, peak {peak / 2**30:.2f} GiB", file=sys.stderr)
            if len(res) == 2:
                a, b = res.values()
                keys = ("policy", "oversub", "time_s", "stall_s", "faults", "htod_bytes", "dtoh_bytes")
                if [[r.get(k) for k in keys] for r in a] != [[r.get(k) for k in keys] for r in b]:
                    print(f"scale {scale:g} {policies}: the two codes' runs differ", file=sys.stderr)
                    return 1
    demand = {(r["scale"], r["code"]): r["peak_rss_bytes"] for r in rows if r["policies"] == "demand"}
    for r in rows:
        d = demand.get((r["scale"], r["code"]))
        r["ratio_to_demand"] = round(r["peak_rss_bytes"] / d, 2) if d else None
    lines = ["| scale | launches | policies | code | wall s | peak RSS | ratio to demand |",
             "|---:|---:|---|---|---:|---:|---:|"]
    for r in rows:
        ratio = "" if r["ratio_to_demand"] is None else f"{r['ratio_to_demand']:.2f}"
        lines.append(f"| {r['scale']:g} | {r['launches']:,} | {r['policies']} | {r['code']} | "
                     f"{r['wall_s']:.0f} | {r['peak_rss_bytes'] / 2**30:.2f} GiB | {ratio} |")
    table = "\n".join(lines)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(table)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
