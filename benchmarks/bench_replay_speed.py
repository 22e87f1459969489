"""Wall and CPU time of `pagecast replay`, this tree against an earlier commit, side by side.

    python benchmarks/bench_replay_speed.py --scale 10 --base a7ae3a1 --work /tmp/speed

For each scale: makes llm-decode at that scale (seed 1), fits a model on llm-decode at scale 1
(seed 2), then runs `pagecast replay TRACE --policy demand,template,oracle --oversub 1.5,2,3
--model MODEL --json` with this tree's code (or `--this` commit's) and with `--base`'s, `--repeat` times, alternating
(base first), each in its own process, after an untimed replay at scale 1 with each code (it
compiles that tree's numba caches). Each code is imported through PYTHONPATH from a directory
that maps `pagecast.<folder>` as the installed package does (this tree's folders, or `--base`
extracted with `git archive`), so the installed package is not used. Reports each run's wall
time, its CPU time (user + system, from `os.wait4`: what it cost the machine, which a loaded
machine changes less than the wall time) and peak RSS, and exits 1 where the two codes' JSON
differ (the whole output, byte for byte).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_replay_memory import base_tree  # noqa: E402  (the base commit's tree, as that benchmark makes it)

POLICIES = "demand,template,oracle"
OVERSUB = "1.5,2,3"


def tree_shim(work: Path) -> Path:
    """A directory to put first on PYTHONPATH so that `import pagecast` is this tree's code."""
    shim = work / "shim-this-tree"
    (shim / "pagecast").mkdir(parents=True, exist_ok=True)
    init = REPO / "pagecast" / "__init__.py"
    (shim / "pagecast" / "__init__.py").write_text(
        f"__path__ = [{str(REPO / 'pagecast')!r}, {str(REPO)!r}]   # pagecast.<folder> is the tree's <folder>\n"
        f"__file__ = {str(init)!r}\n"
        "exec(compile(open(__file__).read(), __file__, 'exec'))\n")
    return shim


def run(argv: list[str], pythonpath: Path) -> tuple[float, float, int, str]:
    """(wall s, CPU s, peak RSS bytes, stdout) of `pagecast ARGV` with `pythonpath` first."""
    env = dict(os.environ, PYTHONPATH=str(pythonpath))
    code = "import sys; from pagecast.cli import main; sys.exit(main(sys.argv[1:]))"
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen([sys.executable, "-c", code, *argv], stdout=out, stderr=err, env=env, cwd="/")
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        o, e = out.read().decode(), err.read().decode()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"pagecast {' '.join(argv)} failed: {e.strip()[-500:]}")
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss * 1024, o


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, nargs="+", default=[10.0])
    ap.add_argument("--base", required=True, help="the earlier commit to compare with")
    ap.add_argument("--this", default=None, metavar="COMMIT",
                    help="compare this commit instead of the working tree (both then from `git archive`)")
    ap.add_argument("--work", default=None, help="where traces and the two trees go (default: a temporary dir)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--policies", default=POLICIES)
    ap.add_argument("--oversub", default=OVERSUB)
    ap.add_argument("--markdown", default=None, help="write the table here")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="pagecast-bench-speed-"))
    work.mkdir(parents=True, exist_ok=True)
    codes = {f"base {args.base}": base_tree(args.base, work),
             "this tree" if args.this is None else args.this: tree_shim(work) if args.this is None
             else base_tree(args.this, work)}
    here = list(codes.values())[1]
    fit, model = work / "fit-s1-seed2.pctrace", work / "model.json"
    if not model.exists():
        if not fit.exists():
            run(["datasets", "make", "llm-decode", "--scale", "1", "--seed", "2", "-o", str(fit)], here)
        run(["fit", str(fit), "-o", str(model)], here)
    # each tree compiles its numba caches once (a fresh `git archive` has none): a replay at scale 1,
    # untimed, before the timed runs
    for pp in codes.values():
        run(["replay", str(fit), "--policy", args.policies, "--oversub", "2", "--model", str(model), "--json"], pp)
    lines = ["| scale | launches | code | run | wall s | CPU s | peak RSS |", "|---:|---:|---|---:|---:|---:|---:|"]
    same = True
    for scale in args.scale:
        tr = work / f"llm-decode-s{scale:g}.pctrace"
        if not tr.exists():
            run(["datasets", "make", "llm-decode", "--scale", f"{scale:g}", "--seed", "1", "-o", str(tr)], here)
        argv = ["replay", str(tr), "--policy", args.policies, "--oversub", args.oversub, "--model", str(model), "--json"]
        outs: dict[str, str] = {}
        sums: dict[str, list[float]] = {name: [0.0, 0.0] for name in codes}
        for k in range(args.repeat):
            for name, pp in codes.items():
                wall, cpu, peak, out = run(argv, pp)
                if name in outs and outs[name] != out:
                    print(f"scale {scale:g} {name}: two runs of one code differ", file=sys.stderr)
                outs[name] = out
                sums[name][0] += wall
                sums[name][1] += cpu
                n = out.count('"policy"')
                lines.append(f"| {scale:g} | {launches(out)} | {name} | {k + 1} | {wall:.0f} | {cpu:.0f} | "
                             f"{peak / 2**30:.2f} GiB |")
                print(f"scale {scale:g} {name} run {k + 1}: {wall:.1f} s wall, {cpu:.1f} s CPU, "
                      f"peak {peak / 2**30:.2f} GiB ({n} runs)", file=sys.stderr, flush=True)
        a, b = outs.values()
        if a != b:
            print(f"scale {scale:g}: the two codes' JSON differ", file=sys.stderr)
            same = False
        (bw, bc), (tw, tc) = sums.values()
        lines.append(f"| {scale:g} | | base / {list(codes)[1]} | | {bw / tw:.2f}x | {bc / tc:.2f}x | |")
    table = "\n".join(lines)
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    return 0 if same else 1


def launches(out: str) -> str:
    import json

    rows = json.loads(out)
    return f"{rows[0]['launches']:,}" if rows else ""


if __name__ == "__main__":
    sys.exit(main())
