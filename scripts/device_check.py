#!/usr/bin/env python3
"""pagecast's device check: the plan, its steps, and the report (`scripts/device-check.sh` runs this).

Run on any machine with an NVIDIA GPU (a CUDA 13 driver, Python >= 3.10 with pip, CuPy,
PyTorch and cuda-bindings; no network needed), from the repository root:

    bash scripts/device-check.sh                 # the first command: fits in 540 s
    bash scripts/device-check.sh --second        # then what the first could not reach
    bash scripts/device-check.sh --dry-run       # on any machine, GPU or not: the plan, walked

Each step runs in a process group of its own under its own time limit (its budget, or what is
left of the command's 540 s), and records `met`, `missed` (with why) or `not reached`; a failed
step never stops the ones after it. Everything goes in one folder (--out, or $DEVICE_CHECK_OUT;
default ./device-check-out/):
device-check.md (the report, also printed), device-check.log, steps.json, env.txt,
collect-metrics.jsonl, gpu-validation.md and collected-traces.tar.gz (the traces the collection tests
made, to read back on any machine).

The install step puts the wheels carried in .whl/ into a virtual environment that sees the
machine's packages (`python -m venv --system-site-packages`): cupti-python finds libcupti through
cuda.pathfinder, which searches site.getsitepackages() (not PYTHONPATH), so only a wheel installed
into a site directory is found, and a venv's comes first. cuda-pathfinder is carried too: before
1.4.1 it knows no "cupti". The step reports the libcupti file the process actually mapped.

Long because it runs before pagecast is installed (it installs it), so the plan, the install's
fallbacks, the steps and the report are one self-contained script.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT_S = 540            # one command's device time, at most
MIN_STEP_S = 20          # a step is not started with less than min(this, its budget) left
COLLECT = "tests/test_collect_gpu.py"


def _load_procs():
    """pagecast.procs, loaded from its file: this script runs before pagecast is installed."""
    spec = importlib.util.spec_from_file_location("pagecast_procs", ROOT / "pagecast" / "procs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


procs = _load_procs()


# ---- the plan ---------------------------------------------------------------------------------

@dataclass
class Step:
    """One step of the device check: what runs, its device-time budget, which command runs it."""

    name: str
    kind: str                      # install | pytest | validation | report
    budget_s: int
    command: int                   # 1: the first command; 2: the second
    args: list[str] = field(default_factory=list)   # pytest node ids / gpu_validation.py arguments


# the validation the first command runs: calibrate; three workloads at >= 1 GiB of managed memory,
# 200% with demand, template and oracle, five interleaved repeats and both baselines, each run
# simulated beside; scripts/gpu_validation.py skips (and reports) what its time does not cover
VALIDATION = ["--workloads", "llm-decode,spmv-cg,jacobi2d,moe-decode", "--oversub", "2", "--policies", "demand,template,oracle",
              "--repeat", "5"]
COMMANDS = (1, 2, 3)
_FLAG = {1: "", 2: " --second", 3: " --third"}


def plan() -> list[Step]:
    """Every command's steps, in order. The first holds what answers the most now: the install,
    the replay validation (calibrate, three workloads, repeats, the simulator beside) and the report.
    The collection tests that already passed on an H200 (2026-12-04: the CUPTI facts, jacobi2d
    end to end, SIGTERM halfway, the managed limit) and the other three workloads collected and
    fitted are the second; the rest of the collection tests and the other stages' GPU tests the third."""
    c = COLLECT
    return [
        Step("install: cupti-python and libcupti in a venv, pagecast", "install", 60, 1),
        Step("validation: calibrate; llm_decode, spmv_cg, jacobi2d (then moe_decode) at >= 1 GiB, 200%,"
             " demand/template/oracle, 5 repeats, baselines; simulated beside", "validation", 465, 1, VALIDATION),
        Step("report", "report", 10, 1),
        Step("install: cupti-python and libcupti in a venv, pagecast", "install", 60, 2),
        Step("collect: the CUPTI facts the collector relies on", "pytest", 60, 2,
             [f"{c}::test_cupti_facts_the_collector_relies_on"]),
        Step("collect: jacobi2d, fit at 0.5, evaluate at 1", "pytest", 75, 2,
             [f"{c}::test_collect_fit_on_one_scale_predicts_the_other[jacobi2d]"]),
        Step("collect: SIGTERM halfway, partial trace read back", "pytest", 45, 2,
             [f"{c}::test_sigterm_halfway_leaves_a_readable_partial_trace"]),
        Step("collect: a managed allocation past the limit is refused", "pytest", 25, 2,
             [f"{c}::test_managed_allocation_past_the_limit_is_refused"]),
        Step("collect: spmv_cg, fit at 0.5, evaluate at 1", "pytest", 70, 2,
             [f"{c}::test_collect_fit_on_one_scale_predicts_the_other[spmv_cg]"]),
        Step("collect: mlp_train, fit at 0.5, evaluate at 1", "pytest", 70, 2,
             [f"{c}::test_collect_fit_on_one_scale_predicts_the_other[mlp_train]"]),
        Step("collect: llm_decode, fit at 0.5, evaluate at 1", "pytest", 70, 2,
             [f"{c}::test_collect_fit_on_one_scale_predicts_the_other[llm_decode]"]),
        Step("report", "report", 10, 2),
        Step("install: cupti-python and libcupti in a venv, pagecast", "install", 60, 3),
        Step("collect: PyTorch MLP with --managed torch", "pytest", 45, 3,
             [f"{c}::test_collect_pytorch_mlp_with_managed_torch"]),
        Step("collect: natural-mode overhead", "pytest", 45, 3, [f"{c}::test_collect_natural_mode_and_overhead"]),
        Step("collect: index values in full mode", "pytest", 45, 3,
             [f"{c}::test_full_mode_records_index_values_and_their_cost"]),
        Step("the other stages' GPU tests (pytest -m gpu)", "pytest", 120, 3,
             ["-m", "gpu", "tests", f"--ignore={c}"]),
        Step("report", "report", 10, 3),
    ]


def budget(steps: list[Step], command: int) -> int:
    return sum(s.budget_s for s in steps if s.command == command)


def format_plan(steps: list[Step]) -> str:
    lines = []
    for cmd in COMMANDS:
        lines.append(f"command {cmd} (bash scripts/device-check.sh{_FLAG[cmd]}"
                     + ("" if cmd == 1 else f": what command {cmd - 1} could not reach, then these") + ")")
        for s in steps:
            if s.command == cmd:
                lines.append(f"  {s.budget_s:4d} s  {s.name}")
        lines.append(("budget: " if cmd == 1 else f"budget (command {cmd}): ") + f"{budget(steps, cmd)} s")
    return "\n".join(lines)


# ---- results ----------------------------------------------------------------------------------

@dataclass
class Result:
    name: str
    command: int
    budget_s: int
    status: str                    # met | missed | not reached
    seconds: float = 0.0
    detail: str = ""


class Runner:
    """Runs steps one after the other within one command's time, each in its own process group."""

    def __init__(self, out: Path, limit_s: float, log, env: dict, dry: bool = False) -> None:
        self.out, self.log, self.env, self.dry = out, log, env, dry
        self.t0 = time.monotonic()
        self.deadline = self.t0 + limit_s
        self.results: list[Result] = []
        self.py = sys.executable   # the interpreter the steps run (the venv's, once installed)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def note(self, msg: str) -> None:
        line = f"[{time.monotonic() - self.t0:6.1f}s] {msg}"
        print(line, file=sys.stderr, flush=True)
        self.log.write(line + "\n")
        self.log.flush()

    def timeout_for(self, step: Step) -> float | None:
        t = min(float(step.budget_s), self.left())
        return t if t >= min(MIN_STEP_S, step.budget_s) else None

    def run(self, step: Step, fn) -> Result:
        """fn(timeout) -> (ok, detail); any exception in it is a miss, never the end of the check."""
        t = self.timeout_for(step)
        if t is None:
            r = Result(step.name, step.command, step.budget_s, "not reached",
                       detail=f"{max(0.0, self.left()):.0f} s were left of the command's time")
        else:
            self.note(f"step: {step.name} (at most {t:.0f} s)")
            t1 = time.monotonic()
            try:
                ok, detail = fn(t)
            except Exception as e:  # noqa: BLE001 - a failure never stops the rest
                ok, detail = False, f"{type(e).__name__}: {e}"
            r = Result(step.name, step.command, step.budget_s, "met" if ok else "missed",
                       round(time.monotonic() - t1, 1), detail)
        self.note(f"  -> {r.status}{': ' + r.detail if r.detail else ''}")
        self.results.append(r)
        return r

    def sh(self, argv: list[str], timeout: float, env: dict | None = None) -> tuple[int | None, str]:
        """Run a command (its output to the log); (exit status or None on a time-out, its last lines)."""
        self.log.write(f"$ {shlex.join(argv)}\n")
        self.log.flush()
        with tempfile.TemporaryFile("w+") as f:
            try:
                p = procs.run_group(argv, timeout, stdout=f, stderr=subprocess.STDOUT, text=True,
                                    env=env or self.env, cwd=ROOT, grace_s=3)
                code = p.returncode
            except subprocess.TimeoutExpired:
                code = None
            f.seek(0)
            text = f.read()
        self.log.write(text)
        self.log.write(f"# {'timed out' if code is None else f'exit {code}'}\n")
        self.log.flush()
        return code, text


# ---- install: cupti-python and libcupti in a venv ----------------------------------------------

PROBE = r'''
import json, sys, importlib.metadata as md
info = {"python": sys.version.split()[0], "prefix": sys.prefix, "versions": {}}
for d in ("cupti-python", "cuda-pathfinder", "nvidia-cuda-cupti", "cuda-bindings"):
    try:
        info["versions"][d] = md.version(d)
    except md.PackageNotFoundError:
        info["versions"][d] = None
try:
    if GPU:
        from cupti import cupti           # cupti-python loads libcupti through cuda.pathfinder
        s = cupti.subscribe(lambda *a: None, None)
        cupti.unsubscribe(s)
        info["timestamp"] = int(cupti.get_timestamp())
    else:                                 # no driver: load it as cupti-python would, through pathfinder
        import cuda.pathfinder as pf
        info["pathfinder_knows_cupti"] = "cupti" in pf.SUPPORTED_NVIDIA_LIBNAMES
        info["found_via"] = pf.load_nvidia_dynamic_lib("cupti").found_via
    info["ok"] = True
except Exception as e:  # noqa: BLE001
    info["ok"], info["error"] = False, f"{type(e).__name__}: {e}"
import importlib.util as iu
info["missing"] = [m for m in ("pytest", "hypothesis", "numpy", "pyarrow", "numba", "cupy", "torch", "cuda.bindings")
                   if iu.find_spec(m.split(".")[0]) is None or (m == "cuda.bindings" and iu.find_spec(m) is None)]
info["libcupti"] = sorted({l.split()[-1] for l in open("/proc/self/maps")
                           if "/libcupti.so" in l.split()[-1]})
print("PROBE " + json.dumps(info))
'''


@dataclass
class CuptiSet:
    """One candidate set of wheels for CUPTI, installed into a venv of its own."""

    label: str
    wheels: list[Path]

    def carries(self, dist: str) -> bool:
        key = dist.replace("-", "_").lower() + "-"
        return any(w.name.lower().startswith(key) for w in self.wheels)


def cupti_sets(whl: Path) -> list[CuptiSet]:
    """The sets to try, in order: the carried main set; the fallback set (cupti-python for CUDA 13.0);
    cupti-python over the machine's own nvidia-cuda-cupti; the machine's packages alone."""
    main = sorted(whl.glob("*.whl"))
    extra = [w for w in main if w.name.lower().startswith(("pyelftools-", "cuda_pathfinder-"))]
    fb = sorted((whl / "fallback").glob("*.whl"))
    fb += [w for w in extra if not any(f.name.split("-")[0] == w.name.split("-")[0] for f in fb)]
    own = [w for w in main if not w.name.lower().startswith("nvidia_cuda_cupti-")]
    return [s for s in (CuptiSet("carried set (.whl/)", main), CuptiSet("fallback set (.whl/fallback/)", fb),
                        CuptiSet("carried cupti-python over the machine's nvidia-cuda-cupti", own))
            if s.wheels] + [CuptiSet("the machine's own packages", [])]


def wheel_problems(s: CuptiSet) -> list[str]:
    """What a set lacks for libcupti to be found (pure)."""
    out = []
    if not s.wheels:
        return out
    if not s.carries("cupti-python"):
        out.append("no cupti-python wheel")
    pf = [w for w in s.wheels if w.name.lower().startswith("cuda_pathfinder-")]
    if not pf:
        out.append("no cuda-pathfinder wheel (the machine's may predate 1.4.1, which has no 'cupti')")
    else:
        v = tuple(int(x) for x in re.findall(r"\d+", pf[0].name.split("-")[1])[:3])
        if v < (1, 4, 1):
            out.append(f"cuda-pathfinder {pf[0].name.split('-')[1]} has no 'cupti' entry (needs >= 1.4.1)")
    return out


PARENT_SITE = r"""
import json, site
print(json.dumps(site.getsitepackages() + [site.getusersitepackages()]))
"""


def make_venv(path: Path, python: str = sys.executable) -> Path:
    """A venv that sees the machine's packages (CuPy, PyTorch, pip), the carried ones first.

    `--system-site-packages` shows the *base* interpreter's packages only. Where the machine's
    python3 is itself a venv's (PyTorch and CuPy installed there, not in the base), a venv made
    from it would see none of them; so the parent's site directories are added by a .pth file,
    which puts them after the new venv's own (the carried wheels still come first)."""
    if path.exists():
        shutil.rmtree(path)
    subprocess.run([python, "-m", "venv", "--without-pip", "--system-site-packages", str(path)],
                   check=True, capture_output=True, text=True, timeout=120)
    py = path / "bin" / "python"
    parent = json.loads(subprocess.run([python, "-c", PARENT_SITE], check=True, capture_output=True, text=True,
                                       timeout=60).stdout)
    ours = json.loads(subprocess.run([str(py), "-c", PARENT_SITE], check=True, capture_output=True, text=True,
                                     timeout=60).stdout)
    (Path(ours[0]) / "_pagecast_parent_site.pth").write_text(
        "".join(f"{d}\n" for d in parent if d not in ours and Path(d).is_dir()))
    return py


def install_wheels(py: Path, wheels: list[Path], timeout: float = 120) -> subprocess.CompletedProcess:
    """Into the venv of `py`, offline, with the machine's pip (seen through its site packages).
    --ignore-installed: a version the machine already has would otherwise count as installed,
    and nothing would land in the venv."""
    return subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                           "--ignore-installed",
                           "--no-cache-dir", "--disable-pip-version-check", *map(str, wheels)],
                          capture_output=True, text=True, timeout=timeout)


def probe(py: str | Path, gpu: bool, env: dict | None = None, timeout: float = 60) -> dict:
    """Which libcupti the interpreter `py` actually loads (and, with gpu, that CUPTI answers)."""
    r = subprocess.run([str(py), "-c", f"GPU = {bool(gpu)}\n" + PROBE], capture_output=True, text=True,
                       timeout=timeout, env=env)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("PROBE ")]
    if not line:
        return {"ok": False, "error": (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1],
                "libcupti": []}
    return json.loads(line[-1][6:])


def describe(info: dict, venv: Path | None) -> str:
    """One line: versions, the libcupti file loaded, and whether it is the venv's (carried)."""
    v = info.get("versions", {})
    libs = info.get("libcupti") or []
    where = "none loaded"
    if libs:
        mine = venv is not None and any(str(Path(x).resolve()).startswith(str(venv.resolve())) for x in libs)
        where = f"{libs[0]} ({'carried, from the venv' if mine else 'the machine’s, not a carried one'})"
    missing = info.get("missing") or []
    return (f"cupti-python {v.get('cupti-python')}, cuda-pathfinder {v.get('cuda-pathfinder')}, "
            f"nvidia-cuda-cupti {v.get('nvidia-cuda-cupti')}; libcupti loaded: {where}"
            + (f"; NOT importable here: {', '.join(missing)} (carry their wheels in .whl/extra/)" if missing else ""))


def link_tree(dest: Path) -> Path:
    """The package laid out with links as setuptools' package-dir maps it (when pip cannot build)."""
    if dest.exists():
        shutil.rmtree(dest)
    (dest / "pagecast").mkdir(parents=True)
    for f in (ROOT / "pagecast").iterdir():
        (dest / "pagecast" / f.name).symlink_to(f)
    for d in ("collect", "datasets", "predict", "replay", "report"):
        (dest / "pagecast" / d).symlink_to(ROOT / d)
    return dest


IMPORTS = "import pagecast.cli, pagecast.collect.collector, pagecast.datasets.gpu.jacobi2d, pagecast.replay.gpu.backend"


def import_check(py: list[str], env: dict, timeout: float = 120) -> tuple[bool, str]:
    """Whether pagecast imports, run from the repository root as every step is."""
    r = subprocess.run([*py, "-c", IMPORTS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return r.returncode == 0, (r.stderr.strip().splitlines() or [""])[-1]


def linked_env(env: dict, src: Path) -> dict:
    """The environment for a linked tree: on PYTHONPATH, and PYTHONSAFEPATH=1 so that the working
    directory (the repository root, whose pagecast/ folder holds only the core) does not shadow it."""
    e = dict(env)
    e["PYTHONPATH"] = str(src) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e["PYTHONSAFEPATH"] = "1"
    return e


def step_install(run: Runner, timeout: float, whl: Path, venv_root: Path) -> tuple[bool, str]:
    """Install the first CUPTI set that answers into a venv; pagecast into it. Sets run.env/run.py."""
    end = time.monotonic() + timeout
    gpu = not run.dry
    chosen, notes = None, []
    for i, s in enumerate(cupti_sets(whl)):
        if time.monotonic() > end - 5:
            notes.append(f"{s.label}: not tried (out of time)")
            continue
        problems = wheel_problems(s)
        if problems:
            notes.append(f"{s.label}: skipped ({'; '.join(problems)})")
            continue
        venv = venv_root / f"venv{i}"
        try:
            py = make_venv(venv)
            wheels = s.wheels + sorted((whl / "extra").glob("*.whl"))   # what else the machine lacks (pytest, ...)
            if wheels:
                r = install_wheels(py, wheels, timeout=max(5.0, end - time.monotonic()))
                run.log.write(r.stdout + r.stderr)
                if r.returncode != 0:
                    notes.append(f"{s.label}: pip failed ({(r.stderr.strip().splitlines() or [''])[-1]})")
                    continue
            info = probe(py, gpu, env=run.env, timeout=max(5.0, min(60.0, end - time.monotonic())))
        except (subprocess.SubprocessError, OSError) as e:
            notes.append(f"{s.label}: {type(e).__name__}: {e}")
            continue
        run.log.write(json.dumps(info) + "\n")
        line = describe(info, venv if s.carries("nvidia-cuda-cupti") else None)
        if info.get("ok"):
            chosen = (s, py, line)
            break
        notes.append(f"{s.label}: {info.get('error')} ({line})")
    if chosen is None:
        return False, "no set of CUPTI wheels answered: " + " | ".join(notes)
    s, py, line = chosen
    run.py = str(py)
    # pagecast itself: editable and offline, else a linked tree on PYTHONPATH (PYTHONSAFEPATH=1)
    how, installed = "editable install", False
    if not run.dry:   # the dry run walks the fallback below, which is the part that can break
        r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-build-isolation",
                            "--disable-pip-version-check", "-e", str(ROOT)],
                           capture_output=True, text=True, timeout=max(5.0, end - time.monotonic()), cwd=ROOT)
        run.log.write(r.stdout + r.stderr)
        installed = r.returncode == 0
        if installed:
            ok, why = import_check([str(py)], run.env)
            if not ok:
                return False, f"{s.label}: {line}; pagecast installed but does not import ({why})"
    if not installed:
        env = linked_env(run.env, link_tree(venv_root / "pagecast-src"))
        ok, why = import_check([str(py)], env)
        if not ok:
            return False, f"{s.label}: {line}; pagecast: neither installs nor imports from a linked tree ({why})"
        run.env = env
        how = "a linked source tree on PYTHONPATH with PYTHONSAFEPATH=1 (pip could not install it offline)"
        if run.dry:
            how = "a linked source tree on PYTHONPATH with PYTHONSAFEPATH=1 (walked in the dry run)"
    tried = f" (before it: {' | '.join(notes)})" if notes else ""
    return True, f"{s.label}: {line}; pagecast: {how}{tried}"


# ---- the other steps ------------------------------------------------------------------------------

def _pytest_line(text: str) -> str:
    lines = [ln.strip("= ").strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _dry_args(args: list[str]) -> list[str]:
    """A step's pytest arguments for the dry run: a folder becomes its files that mark GPU tests
    (collecting every test module of the suite would take longer than the whole dry run)."""
    ignore = {a.split("=", 1)[1] for a in args if a.startswith("--ignore=")}
    out = []
    for a in args:
        if a.startswith("--ignore=") or a == "-m" or a == "gpu":
            continue
        if (ROOT / a).is_dir():
            out += sorted(str(f.relative_to(ROOT)) for f in (ROOT / a).glob("test_*.py")
                          if str(f.relative_to(ROOT)) not in ignore and "mark.gpu" in f.read_text(errors="replace"))
        else:
            out.append(a)
    return out


_COLLECTED: dict[str, set] = {}


def dry_collect(run: Runner, steps: list[Step], timeout: float) -> set:
    """The GPU tests' node ids every pytest step names, collected once (`pytest --collect-only`)."""
    if "ids" not in _COLLECTED:
        args = sorted({a for s in steps if s.kind == "pytest" for a in _dry_args(s.args)})
        code, text = run.sh([run.py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", "-m", "gpu",
                             *args], timeout)
        _COLLECTED["ids"] = {ln.strip() for ln in text.splitlines() if "::" in ln} if code == 0 else set()
        _COLLECTED["line"] = _pytest_line(text) if code is not None else f"timed out after {timeout:.0f} s"
    return _COLLECTED["ids"]


def step_pytest(run: Runner, step: Step, timeout: float) -> tuple[bool, str]:
    if run.dry:   # the GPU part stubbed: the tests are collected (they exist, they import), not run
        ids = dry_collect(run, plan(), timeout)
        want = _dry_args(step.args)
        found = [i for i in ids if any(i == w or i.startswith(w + "::") for w in want)]
        missing = [w for w in want if not any(i == w or i.startswith(w + "::") for i in ids)]
        if missing or not found:
            return False, f"not collected: {missing or want} ({_COLLECTED.get('line')})"
        return True, f"{len(found)} GPU test(s) collected"
    argv = [run.py, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *step.args]
    code, text = run.sh(argv, timeout)
    last = _pytest_line(text)
    if code is None:
        return False, f"timed out after {timeout:.0f} s ({last})"
    if code == 0 and "passed" not in last:
        return False, f"nothing passed: {last}"
    return code == 0, f"exit {code}: {last}"


def step_validation(run: Runner, step: Step, timeout: float) -> tuple[bool, str]:
    out_md = run.out / "gpu-validation.md"
    argv = [run.py, str(ROOT / "scripts" / "gpu_validation.py"), str(out_md), "--workdir",
            str(Path(tempfile.gettempdir()) / "pagecast-validation"), *step.args,
            "--budget-s", str(max(10, int(timeout) - 10))]
    if run.dry:
        argv.append("--dry-run")
    code, text = run.sh(argv, timeout)
    if code is None:
        return False, f"timed out after {timeout:.0f} s (its partial report: gpu-validation.md)"
    if run.dry:
        n = sum(1 for ln in text.splitlines() if "pagecast.cli" in ln)
        md = out_md.read_text() if out_md.exists() else ""
        table = "| GPU / sim |" in md and "excess over capacity" in md
        return code == 0 and n > 0 and table, (f"{n} commands planned; the report rendered from a synthetic run"
                                               + ("" if table else ": its table is MISSING"))
    overall = re.findall(r"\*\*Overall: (.*?)\*\*", out_md.read_text()) if out_md.exists() else []
    return code == 0, f"exit {code}: {overall[-1] if overall else 'no report'} (gpu-validation.md)"


# ---- the report (pure but for reading files) ------------------------------------------------

def read_metrics(path: Path) -> tuple[list[dict], int]:
    """The metrics rows, and how many lines could not be read (a step stopped mid-write)."""
    rows, bad = [], 0
    if not path.exists():
        return rows, bad
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(r, dict):
            rows.append(r)
        else:
            bad += 1
    return rows, bad


def _g(d, *keys, fmt: str = "", none: str = "–"):
    for k in keys:
        d = d.get(k) if isinstance(d, dict) else None
    if d is None:
        return none
    try:
        return format(d, fmt)
    except (TypeError, ValueError):
        return str(d)


def render(results: list[Result], rows: list[dict], unreadable: int, env_text: str,
           validation_md: str | None) -> str:
    L = ["# pagecast device check", "", "```", env_text.strip(), "```", "", "## Steps", "",
         "| step | command | budget | result | seconds | detail |", "|---|---|---|---|---|---|"]
    for r in results:
        detail = r.detail.replace("|", "\\|").replace("\n", " ")
        L.append(f"| {r.name} | {r.command} | {r.budget_s} s | {r.status} | {r.seconds:g} | {detail} |")
    for cmd in sorted({r.command for r in results}):
        L.append("")
        L.append(f"budget: {sum(r.budget_s for r in results if r.command == cmd)} s (command {cmd}); "
                 + ", ".join(f"{sum(1 for r in results if r.command == cmd and r.status == s)} {s}"
                             for s in ("met", "missed", "not reached")))
    fit = [r for r in rows if r.get("test") == "collect-fit-evaluate"]
    if fit:
        L += ["", "## Collect, fit at one scale, evaluate at another (full mode)", "",
              "| workload | recall | precision | launches (fit/eval) | faults (fit/eval) | attributed | dropped |"
              " callback us/launch | evict+sync us/launch | wall s | worst kernels |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in fit:
            t = r.get("traces") or {}
            a, b = t.get(str(r.get("fit_scale")), {}), t.get(str(r.get("eval_scale")), {})
            L.append(f"| {_g(r, 'workload')} | {_g(r, 'recall', fmt='.4f')} | {_g(r, 'precision', fmt='.4f')} | "
                     f"{_g(a, 'launches')}/{_g(b, 'launches')} | {_g(a, 'faults')}/{_g(b, 'faults')} | "
                     f"{_g(b, 'faults_attributed', fmt='.3f')} | {_g(a, 'dropped')}/{_g(b, 'dropped')} | "
                     f"{_g(b, 'callback_us')} | {_g(b, 'evict_sync_us')} | {_g(a, 'wall_s')}/{_g(b, 'wall_s')} | "
                     f"{_g(r, 'worst_kernels')} |")
    for r in rows:
        t = r.get("test")
        if t == "collect-overhead":
            L += ["", "## Collection overhead (natural mode vs no collection)", "",
                  f"- {_g(r, 'workload')} --scale 1: {_g(r, 'plain_wall_s')} s plain, {_g(r, 'natural_wall_s')} s"
                  f" collected (natural), {_g(r, 'launches')} launches: {_g(r, 'per_launch_wall_us')} us per launch"
                  " of wall time (includes CUPTI start-up and the trace write)",
                  f"- the tool's own line: `{_g(r, 'tool_line')}`"]
        elif t == "collect-managed-torch":
            L += ["", "## PyTorch MLP with --managed torch", "",
                  f"- {_g(r, 'launches')} launches, {_g(r, 'faults')} faults, {_g(r, 'allocations')} allocations,"
                  f" allocator {_g(r, 'allocator')}, {_g(r, 'launches_without_args')} launches without arguments"]
        elif t == "collect-sigterm":
            L += ["", "## SIGTERM halfway", "",
                  f"- exit code {_g(r, 'exit_code')}, partial trace read back: {_g(r, 'launches')} launches, "
                  f"{_g(r, 'faults')} faults, complete={_g(r, 'complete')}"]
        elif t == "collect-cupti-facts":
            o = r.get("obs") if isinstance(r.get("obs"), dict) else {}
            keys = ("hook", "layout(CUfunction)", "layout(CUkernel)", "cuModuleLoadData", "cuLibraryLoadData",
                    "fatal", "cuFuncIsLoaded before launch", "uvm_counters", "uvm_counters_enabled",
                    "uvm_counters_refused", "um_kinds", "faults", "faults_after_host_read", "dropped",
                    "torch_calls", "errors")
            L += ["", "## CUPTI facts the collector relies on (tests/test_collect_gpu.py probe)", "",
                  f"- probe exit code {_g(r, 'exit_code')}"] + [f"- {k}: `{o.get(k)}`" for k in keys]
        elif t == "collect-refuse-oversubscription":
            L += ["", "## Managed allocation past the limit", "",
                  f"- exit code {_g(r, 'exit_code')}: {_g(r, 'message')}"]
        elif t == "collect-values":
            L += ["", "## Index values in full mode", "",
                  f"- {_g(r, 'workload')}: {_g(r, 'rows')} rows, {_g(r, 'copies')} copies, {_g(r, 'bytes')} bytes,"
                  f" {_g(r, 'copy_us_per_launch')} us per launch, errors {_g(r, 'errors')}"]
    seen = [r for r in rows if r.get("test") == "runner-observed"]
    if seen:
        L += ["", "## Driver behaviour the GPU runner relies on (observed)", ""]
        L += [f"- {_g(r, 'what')}: {_g(r, 'value')}" for r in seen]
    if unreadable:
        L += ["", f"{unreadable} line(s) of collect-metrics.jsonl could not be read (a step stopped while"
                  " writing): the rows above are the rest."]
    if not rows:
        L += ["", "No measurements were recorded (see device-check.log)."]
    if validation_md:   # its headings one level down, under this report's
        L += [""] + [("#" + ln) if ln.startswith("#") else ln for ln in validation_md.strip().splitlines()]
    return "\n".join(L) + "\n"


def synthetic_metrics(path: Path) -> None:
    """A metrics file as a real run leaves it, its last line cut off mid-write (for the dry run)."""
    rows = [
        {"test": "collect-cupti-facts", "exit_code": 0, "obs": {"hook": {"launches": 2, "errors": 0},
                                                                 "uvm_counters": True, "um_kinds": [1, 4]}},
        {"test": "collect-fit-evaluate", "workload": "jacobi2d", "fit_scale": 0.5, "eval_scale": 1.0,
         "recall": 1.0, "precision": 0.98,
         "traces": {"0.5": {"launches": 40, "faults": 900, "dropped": 0, "wall_s": 4.1},
                    "1.0": {"launches": 40, "faults": 1800, "faults_attributed": 0.97, "dropped": 0,
                            "callback_us": 12.0, "evict_sync_us": 140.0, "wall_s": 6.0}},
         "worst_kernels": [["jacobi_step", 1.0]]},
        {"test": "collect-fit-evaluate", "workload": "spmv_cg", "fit_scale": 0.5, "eval_scale": 1.0},  # cut short
        {"test": "collect-sigterm", "exit_code": 143, "launches": 812, "faults": 77, "complete": False},
    ]
    text = "\n".join(json.dumps(r) for r in rows) + "\n"
    text += json.dumps({"test": "collect-refuse-oversubscription", "exit_code": 2, "message": ["error: x"]})[:23]
    path.write_text(text)


def pack_traces(traces: Path | None, out: Path) -> str:
    """The traces the collection tests made, as `collected-traces.tar.gz` in the report folder
    (real GPU traces to read back on any machine); what it says of them."""
    found = sorted(traces.glob("*.pctrace")) if traces is not None and traces.is_dir() else []
    if not found:
        return ""
    import tarfile
    with tarfile.open(out / "collected-traces.tar.gz", "w:gz") as tar:
        for p in found:
            tar.add(p, arcname=p.name)
    return f"; {len(found)} collected traces in collected-traces.tar.gz"


def write_report(out: Path, metrics: Path, results: list[Result], step: Step, etext: str,
                 dry: bool, traces: Path | None = None) -> tuple[bool, str]:
    if dry:
        synthetic_metrics(metrics)
    rows, bad = read_metrics(metrics)
    vmd = out / "gpu-validation.md"
    me = Result(step.name, step.command, step.budget_s, "met")
    # in a dry run, gpu-validation.md is the validation's report rendered from a synthetic run
    md = render(results + [me], rows, bad, etext, vmd.read_text() if vmd.exists() else None)
    (out / "device-check.md").write_text(md)
    if dry:   # what the report must show of a partly cut metrics file
        need = ("| jacobi2d | 1.0000 |", "| spmv_cg | – |", "exit code 143", "1 line(s) of collect-metrics.jsonl",
                "| GPU / sim |", "excess over capacity")
        lost = [n for n in need if n not in md]
        return not lost, (f"rendered from a synthetic metrics file: {len(rows)} rows, {bad} cut line(s)"
                          + (f"; MISSING {lost}" if lost else ""))
    return True, f"{len(rows)} metric rows, {bad} unreadable line(s)" + pack_traces(traces, out)


def card(smi_lines: list[str]) -> str:
    """Which of the cards the check is planned for nvidia-smi's `name, memory.total [MiB], ...` names:
    an H100 (80 GB) or an H200 (141 GB); the validation sizes nothing from this (every workload checks
    its plan against the free memory), the report says which card gave the numbers."""
    for ln in smi_lines:
        m = re.match(r"\s*([^,]+),\s*(\d+)\s*MiB", ln)
        if not m:
            continue
        name, mib = m.group(1).strip(), int(m.group(2))
        kind = "H200 (141 GB)" if "H200" in name or mib > 120_000 else "H100 (80 GB)" if "H100" in name else "other"
        return f"{kind}: {name}, {mib} MiB"
    return "unknown (nvidia-smi gave no name and memory)"


def env_text(dry: bool) -> str:
    if dry:
        return "dry run: no GPU used; the steps below were walked with their GPU parts stubbed"
    lines = [f"date: {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"]
    for argv in (["nvidia-smi", "--query-gpu=name,memory.total,memory.free,driver_version", "--format=csv,noheader"],
                 [sys.executable, "-c", "import sys, cupy, torch; print('python', sys.version.split()[0],"
                                        " 'cupy', cupy.__version__, 'torch', torch.__version__)"]):
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
            lines += (r.stdout + r.stderr).strip().splitlines()[:2]
        except (OSError, subprocess.SubprocessError) as e:
            lines.append(f"{argv[0]}: {e}")
    lines.append(f"card: {card(lines)}")
    p = Path("/sys/module/nvidia_uvm/parameters/uvm_perf_prefetch_enable")
    try:
        lines.append(f"uvm_perf_prefetch_enable: {p.read_text().strip()}")
    except OSError:
        lines.append("uvm_perf_prefetch_enable: unreadable")
    return "\n".join(lines)


# ---- main ----------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="walk every step with its GPU parts stubbed (no GPU)")
    ap.add_argument("--second", action="store_true",
                    help="the second command: command 1's steps it did not reach, then command 2's")
    ap.add_argument("--third", action="store_true",
                    help="the third command: command 2's steps it did not reach, then command 3's")
    ap.add_argument("--plan", action="store_true", help="print the plan and exit")
    ap.add_argument("--out", default=os.environ.get("DEVICE_CHECK_OUT") or str(ROOT / "device-check-out"),
                    help="where the report, log and metrics go (default $DEVICE_CHECK_OUT, else ./device-check-out)")
    a = ap.parse_args(argv)
    steps = plan()
    if a.plan:
        print(format_plan(steps))
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("DEVICE_CHECK_WORK") or Path(tempfile.gettempdir()) / "pagecast-device-check")
    work.mkdir(parents=True, exist_ok=True)
    limit = float(os.environ.get("DEVICE_CHECK_LIMIT_S", LIMIT_S))
    metrics = out / "collect-metrics.jsonl"
    state = work / "steps.json"      # what command 1 left unreached, for --second

    print(format_plan(steps))
    later = 3 if a.third else 2 if a.second else 1
    if a.dry_run:     # every step of every command, each command within its own time
        commands = [[s for s in steps if s.command == c] for c in COMMANDS]
    elif later > 1:
        prev = json.loads(state.read_text()) if state.exists() else []
        unreached = {r["name"] for r in prev if r.get("status") == "not reached" and r.get("command") == later - 1}
        again = [replace(s, command=later) for s in steps
                 if s.command == later - 1 and s.name in unreached and s.kind in ("pytest", "validation")]
        mine = [s for s in steps if s.command == later]
        commands = [mine[:1] + again + mine[1:]]
    else:
        commands = [[s for s in steps if s.command == 1]]
    traces = work / "traces"          # the tests' collected traces, packed into the report folder
    if later == 1 and traces.exists():
        shutil.rmtree(traces)
    traces.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", PAGECAST_DEVICE_REPORT=str(metrics),
               PAGECAST_DEVICE_TRACES=str(traces))
    if later == 1:
        metrics.write_text("")
    etext = env_text(a.dry_run)
    (out / "env.txt").write_text(etext + "\n")
    results: list[Result] = []
    t_start = time.monotonic()
    with open(out / "device-check.log", "w") as log:
        for todo in commands:
            run = Runner(out, limit, log, env, dry=a.dry_run)
            for s in todo:
                if s.kind == "install":
                    run.run(s, lambda t: step_install(run, t, ROOT / ".whl", work))
                elif s.kind == "pytest":
                    run.run(s, lambda t, s=s: step_pytest(run, s, t))
                elif s.kind == "validation":
                    run.run(s, lambda t, s=s: step_validation(run, s, t))
                elif s.kind == "report":
                    # written even with no time left: the report is the point of the run
                    run.deadline = max(run.deadline, time.monotonic() + s.budget_s)
                    run.run(s, lambda t, s=s: write_report(out, metrics, results + run.results, s, etext,
                                                           a.dry_run, traces))
            env = run.env
            results += run.results
        if not a.dry_run:   # what this command did not reach, for the next one
            state.write_text(json.dumps([asdict(r) for r in results], indent=1))
    print((out / "device-check.md").read_text())
    missed = [r for r in results if r.status != "met"]
    print(f"done in {time.monotonic() - t_start:.0f} s; {len(results) - len(missed)} met,"
          f" {len(missed)} missed or not reached;"
          f" report: {out / 'device-check.md'}", file=sys.stderr)
    return 0 if not missed else 1


if __name__ == "__main__":
    sys.exit(main())
