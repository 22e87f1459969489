"""What `pagecast collect --interpret` adds to the Triton interpreter's own run time of a script.

    python benchmarks/bench_interpret.py [--repeat 3] [--out docs/collect.md]

For every script, side by side in the same run and alternating: `python SCRIPT` with
TRITON_INTERPRET=1 (the interpreter alone, with the same compatibility fixes), and `pagecast
collect --interpret -o T -- python SCRIPT` (the same run recorded). Each is a fresh process,
measured whole (`os.wait4`): the fastest wall time and the median CPU time of --repeat runs
each, and the peak resident memory; the ratios are collected / interpreter alone. The scripts: the corpus programs, and two
that stress the collector more than real kernels do (a vector add whose programs do almost
nothing but load and store 8192-element tiles, and a strided column read of a matrix, one
page per element). The bar (issue 14): at most +30%. Replaces the "Overhead" section of --out.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SECTION = "### Overhead (`benchmarks/bench_interpret.py`)"

STRESS = {
    "vector add, 8192-element tiles": textwrap.dedent("""
        import torch, triton, triton.language as tl
        @triton.jit
        def add(x, y, o, n, B: tl.constexpr):
            offs = tl.program_id(0) * B + tl.arange(0, B)
            m = offs < n
            tl.store(o + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)
        for n in (1 << 22, 3 << 21, 1 << 23):
            x, y = torch.randn(n), torch.randn(n)
            add[(triton.cdiv(n, 8192),)](x, y, torch.empty(n), n, B=8192)
    """),
    "column reads, one page per element": textwrap.dedent("""
        import torch, triton, triton.language as tl
        @triton.jit
        def colsum(x, o, rows, stride, B: tl.constexpr):
            c = tl.program_id(0)
            r = tl.arange(0, B)
            acc = tl.zeros([B], dtype=tl.float32)
            for r0 in range(0, rows, B):
                acc += tl.load(x + (r0 + r) * stride + c, mask=r0 + r < rows, other=0.0)
            tl.store(o + c, tl.sum(acc, 0))
        for rows, cols in ((4096, 1024), (8192, 1024)):
            x = torch.randn(rows, cols)
            colsum[(cols,)](x, torch.empty(cols), rows, x.stride(0), B=1024)
    """),
}

CORPUS = {
    "corpus: tutorials (scale 1)": ["-m", "pagecast.datasets.corpus.tutorials", "--scale", "1"],
    "corpus: liger (scale 1)": ["-m", "pagecast.datasets.corpus.liger", "--scale", "1"],
    "corpus: data-dependent (scale 1)": ["-m", "pagecast.datasets.corpus.data_dependent", "--scale", "1"],
}


# the interpreter alone, with the same compatibility fixes collect --interpret applies (without
# them Liger's and the autotuned matmul's kernels do not run on the CPU at all)
PLAIN = textwrap.dedent("""
    import runpy, sys
    from pagecast.collect import interpret_compat
    interpret_compat.apply_all()
    args = sys.argv[1:]
    sys.argv = args[1:] if args[0] == "-m" else args
    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(args[0], run_name="__main__")
""")


def _run(cmd: list[str], env: dict, cwd: Path) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds, peak RSS in MiB) of one process."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    err = p.stderr.read().decode(errors="replace")
    p.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{err[-2000:]}")
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", help="run only the scripts whose name contains this")
    ap.add_argument("--out", help="markdown file whose section to replace")
    args = ap.parse_args(argv)
    env = dict(os.environ, TRITON_INTERPRET="1")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        scripts = {}
        for i, (name, body) in enumerate(STRESS.items()):
            (d / f"stress{i}.py").write_text(body)
            scripts[name] = [f"stress{i}.py"]
        scripts.update(CORPUS)
        (d / "plain.py").write_text(PLAIN)
        for name, script in scripts.items():
            if args.only and args.only not in name:
                continue
            plain = [sys.executable, "plain.py", *script]
            coll = [sys.executable, "-m", "pagecast.cli", "collect", "--interpret", "-o", str(d / "t.pctrace"),
                    "--force", "--", "python", *script]
            _run(coll, env, d)                       # warm caches (numba, the OS's file cache)
            a, b = [], []
            for _ in range(args.repeat):
                a.append(_run(plain, env, d))
                b.append(_run(coll, env, d))
            from pagecast import trace as T
            import warnings
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                st = T.read_manifest(d / "t.pctrace")["collection"]
            ta, tb = min(x[0] for x in a), min(x[0] for x in b)
            ca, cb = statistics.median(x[1] for x in a), statistics.median(x[1] for x in b)
            ma, mb = max(x[2] for x in a), max(x[2] for x in b)
            rows.append((name, st["launches"], st["memory_accesses"], st["lanes"], ta, tb, ca, cb,
                         st["hook_seconds"], ma, mb))
            print(f"{name:42s} wall {ta:7.2f} -> {tb:7.2f} s  x{tb / ta:.3f}   CPU {ca:7.2f} -> {cb:7.2f} s  "
                  f"x{cb / ca:.3f}  hooks {st['hook_seconds']:.2f} s  RSS {ma:.0f} -> {mb:.0f} MiB", flush=True)
    md = [SECTION, "",
          f"`python benchmarks/bench_interpret.py --repeat {args.repeat}`: each script run alone under the "
          "interpreter (`TRITON_INTERPRET=1 python SCRIPT`, with collect's compatibility fixes applied) and under `pagecast collect --interpret`, "
          "alternating, each a fresh process, measured whole (imports, the run, writing the trace): the "
          "fastest wall time of each, the median CPU time (user + system, `os.wait4`) of each, and the "
          "peak resident memory. On this project's development machine: 2 CPU cores shared with other "
          "jobs, where one script's wall time varied by up to 25% between runs, so CPU time is the steadier "
          "figure.", "",
          "| script | launches | memory operations | lanes | wall: alone → collected | ratio "
          "| CPU: alone → collected | ratio | in pagecast's hooks | peak RSS: alone → collected |",
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, n, ops, lanes, ta, tb, ca, cb, hk, ma, mb in rows:
        md.append(f"| {name} | {n:,} | {ops:,} | {lanes:,} | {ta:.2f} → {tb:.2f} s | {tb / ta:.2f}x "
                  f"| {ca:.2f} → {cb:.2f} s | {cb / ca:.2f}x | {hk:.2f} s | {ma:.0f} → {mb:.0f} MiB |")
    text = "\n".join(md) + "\n"
    print(text)
    if args.out:
        _replace_section(Path(args.out), text)
    return 0


def _replace_section(path: Path, text: str) -> None:
    doc = path.read_text()
    start = doc.find(SECTION)
    if start < 0:
        doc = doc.rstrip("\n") + "\n\n" + text
    else:
        nxt = [i for i in (doc.find("\n## ", start + 1), doc.find("\n### ", start + 1)) if i >= 0]
        end = min(nxt) + 1 if nxt else len(doc)
        doc = doc[:start] + text + ("\n" if end < len(doc) else "") + doc[end:]
    path.write_text(doc)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
