"""scripts/device-check.sh and scripts/device_check.py on the CPU: the plan, the steps' bookkeeping,
which libcupti a carried set really loads, the linked-tree fallback, and the whole dry run."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "device_check.py"


@pytest.fixture(scope="module")
def D():
    spec = importlib.util.spec_from_file_location("device_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["device_check"] = mod      # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


# ---- the plan --------------------------------------------------------------------------------

def test_each_command_fits_its_time_and_the_first_holds_the_validation(D):
    steps = D.plan()
    for cmd in D.COMMANDS:
        assert 0 < D.budget(steps, cmd) <= D.LIMIT_S == 540
    first = [s for s in steps if s.command == 1]
    assert [s.kind for s in first] == ["install", "validation", "report"]
    v = first[1].args
    assert v[v.index("--workloads") + 1] == "llm-decode,spmv-cg,jacobi2d,moe-decode" and v[v.index("--oversub") + 1] == "2"
    assert v[v.index("--policies") + 1] == "demand,template,oracle" and v[v.index("--repeat") + 1] == "5"
    assert "--allow-oversubscription" not in v
    # the collection tests that passed on the H200 lead the second command
    second = [s.name for s in steps if s.command == 2]
    assert second[1].startswith("collect: the CUPTI facts") and "SIGTERM" in second[3]
    assert re.search(r"^budget: (\d+) s$", D.format_plan(steps), re.M)


def test_the_card_is_read_from_nvidia_smi(D):
    assert D.card(["NVIDIA H100 80GB HBM3, 81559 MiB, 80000 MiB, 580.159.04"]).startswith("H100 (80 GB)")
    assert D.card(["NVIDIA H200, 143771 MiB, 143000 MiB, 580.159.04"]).startswith("H200 (141 GB)")
    assert D.card(["nvidia-smi: not found"]).startswith("unknown")


def test_a_failed_or_timed_out_step_never_stops_the_rest(D, tmp_path):
    with open(tmp_path / "log", "w") as log:
        run = D.Runner(tmp_path, 120.0, log, dict(os.environ))

        def sh(argv):
            return lambda t: ((lambda c: (c[0] == 0, f"exit {c[0]}"))(run.sh(argv, t)))

        def boom(t):
            raise RuntimeError("the step itself broke")

        py = sys.executable
        run.run(D.Step("fails", "pytest", 5, 1), sh([py, "-c", "raise SystemExit(3)"]))
        run.run(D.Step("breaks", "pytest", 5, 1), boom)
        run.run(D.Step("hangs", "pytest", 2, 1), sh([py, "-c", "import time; time.sleep(60)"]))
        run.run(D.Step("works", "pytest", 5, 1), sh([py, "-c", "pass"]))
        run.deadline = time.monotonic() + 1          # the command's time all but spent
        run.run(D.Step("too late", "pytest", 5, 1), sh([py, "-c", "pass"]))
    got = {r.name: (r.status, r.detail) for r in run.results}
    assert got["fails"] == ("missed", "exit 3")
    assert got["breaks"][0] == "missed" and "the step itself broke" in got["breaks"][1]
    assert got["hangs"] == ("missed", "exit None")
    assert got["works"] == ("met", "exit 0")
    assert got["too late"][0] == "not reached"
    md_ = D.render(run.results, [], 0, "env", None)
    assert "| fails | 1 | 5 s | missed |" in md_ and "| too late | 1 | 5 s | not reached |" in md_
    assert "budget: 22 s (command 1); 1 met, 3 missed, 1 not reached" in md_


def test_the_report_reads_a_metrics_file_cut_mid_line(D, tmp_path):
    D.synthetic_metrics(tmp_path / "m.jsonl")
    rows, bad = D.read_metrics(tmp_path / "m.jsonl")
    assert bad == 1 and [r["test"] for r in rows][:2] == ["collect-cupti-facts", "collect-fit-evaluate"]
    md_ = D.render([], rows, bad, "env", "## GPU replay\n\ntext\n")
    assert "| jacobi2d | 1.0000 | 0.9800 | 40/40 |" in md_ and "| spmv_cg | – | – |" in md_
    assert "1 line(s) of collect-metrics.jsonl could not be read" in md_ and "\n### GPU replay" in md_


# ---- which libcupti a carried set loads (cupti-python finds it through cuda.pathfinder) ----------

def _wheel_of_installed(dist: str, dest: Path, only=None) -> Path:
    """The installed distribution packed back into a wheel (its own files and RECORD)."""
    d = md.distribution(dist)
    name = d.metadata["Name"].replace("-", "_")
    whl = dest / f"{name}-{d.version}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_STORED) as z:
        for f in d.files:
            s = str(f)
            if "__pycache__" in s or (only and ".dist-info/" not in s and not any(o in s for o in only)):
                continue
            p = Path(d.locate_file(f))
            if p.is_file():
                z.write(p, s)
    return whl


def _require(*dists):
    for x in dists:
        try:
            md.distribution(x)
        except md.PackageNotFoundError:
            pytest.fail(f"{x} is not installed: the test extra (cupti-python) brings it")


def test_a_carried_set_installed_into_a_venv_is_the_libcupti_that_loads(D, tmp_path):
    _require("cuda-pathfinder", "nvidia-cuda-cupti")
    wheels = [_wheel_of_installed("cuda-pathfinder", tmp_path),
              _wheel_of_installed("nvidia-cuda-cupti", tmp_path, only=["libcupti.so"])]
    venv = tmp_path / "venv"
    py = D.make_venv(venv)
    r = D.install_wheels(py, wheels)
    assert r.returncode == 0, r.stderr
    info = D.probe(py, gpu=False)
    assert info["ok"] and info["pathfinder_knows_cupti"], info
    assert len(info["libcupti"]) == 1 and info["libcupti"][0].startswith(str(venv.resolve())), info
    assert "(carried, from the venv)" in D.describe(info, venv)


def test_a_venv_made_from_a_venvs_python_sees_that_venvs_packages_after_its_own(D, tmp_path):
    """Where the machine's python3 is a venv's (PyTorch and CuPy installed in it, not in the base),
    `--system-site-packages` alone would hide them; the parent's site directory follows the new
    venv's own, so a carried wheel still comes first."""
    parent = tmp_path / "parent"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(parent)], check=True, timeout=120)
    ppy = parent / "bin" / "python"
    psite = Path(subprocess.run([str(ppy), "-c", "import site; print(site.getsitepackages()[0])"],
                                check=True, capture_output=True, text=True).stdout.strip())
    (psite / "only_in_parent.py").write_text("WHERE = 'parent'\n")
    (psite / "in_both.py").write_text("WHERE = 'parent'\n")
    py = D.make_venv(tmp_path / "child", str(ppy))
    csite = Path(subprocess.run([str(py), "-c", "import site; print(site.getsitepackages()[0])"],
                                check=True, capture_output=True, text=True).stdout.strip())
    (csite / "in_both.py").write_text("WHERE = 'child'\n")
    r = subprocess.run([str(py), "-c", "import only_in_parent as a, in_both as b; print(a.WHERE, b.WHERE)"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.stdout.split() == ["parent", "child"], r.stderr


def test_the_collected_traces_come_back_packed_in_the_report_folder(D, tmp_path):
    import tarfile
    traces, out = tmp_path / "traces", tmp_path / "out"
    out.mkdir()
    assert D.pack_traces(traces, out) == "" and D.pack_traces(None, out) == ""   # none collected
    for name in ("jacobi2d-0.5.pctrace", "spmv_cg-1.pctrace"):
        (traces / name / "launches").mkdir(parents=True)
        (traces / name / "manifest.json").write_text("{}")
        (traces / name / "launches" / "part-00000.parquet").write_bytes(b"x")
    said = D.pack_traces(traces, out)
    assert "2 collected traces" in said
    with tarfile.open(out / "collected-traces.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"jacobi2d-0.5.pctrace/manifest.json", "spmv_cg-1.pctrace/launches/part-00000.parquet"} <= names


STAND_IN_LIBCUDA = r"""
int cuDriverGetVersion(int *v) { *v = 13000; return 0; }
int cuInit(unsigned flags) { return 0; }
int cuGetProcAddress_v2(const char *s, void **p, int v, unsigned long long f, int *st) {
    *p = 0; if (st) *st = 1; return 500; }
"""


def test_cupti_python_itself_loads_the_carried_libcupti(D, tmp_path):
    """Through cupti-python's own loader: a stand-in libcuda.so.1 (a CUDA 13.0 driver's version, nothing
    else) gets cupti-python past its driver check to load libcupti, which then cannot start: the probe
    reports CUPTI's failure and the file cupti-python mapped, the venv's."""
    _require("cupti-python", "cuda-pathfinder", "nvidia-cuda-cupti")
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler builds the stand-in libcuda.so.1"
    (tmp_path / "cuda.c").write_text(STAND_IN_LIBCUDA)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(tmp_path / "libcuda.so.1"), str(tmp_path / "cuda.c")],
                   check=True, capture_output=True, timeout=120)
    wheels = [_wheel_of_installed("cuda-pathfinder", tmp_path),
              _wheel_of_installed("nvidia-cuda-cupti", tmp_path, only=["libcupti.so"])]
    venv = tmp_path / "venv"
    py = D.make_venv(venv)
    assert D.install_wheels(py, wheels).returncode == 0
    env = {**os.environ, "LD_LIBRARY_PATH": str(tmp_path) + os.pathsep + os.environ.get("LD_LIBRARY_PATH", "")}
    info = D.probe(py, gpu=True, env=env)
    assert not info["ok"] and "cupti" in info["error"].lower(), info
    assert info["libcupti"] and info["libcupti"][0].startswith(str(venv.resolve())), info


def test_the_old_way_a_target_dir_on_pythonpath_loads_the_machines_libcupti(D, tmp_path):
    """Why the venv: pip --target plus PYTHONPATH, as the check used to install, is not searched
    by cuda.pathfinder; the probe reports the machine's libcupti, and says that it is not carried."""
    _require("cuda-pathfinder", "nvidia-cuda-cupti")
    whl = _wheel_of_installed("nvidia-cuda-cupti", tmp_path, only=["libcupti.so"])
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(target),
                    str(whl)], check=True, capture_output=True, timeout=300)
    assert list(target.rglob("libcupti.so*"))
    info = D.probe(sys.executable, gpu=False, env={**os.environ, "PYTHONPATH": str(target)})
    assert info["ok"] and not any(x.startswith(str(target)) for x in info["libcupti"]), info
    assert "not a carried one" in D.describe(info, target)


def test_a_set_without_a_pathfinder_that_knows_cupti_is_skipped(D, tmp_path):
    def s(*names):
        return D.CuptiSet("x", [tmp_path / n for n in names])

    assert D.wheel_problems(s("cupti_python-13.4.0-cp312-x.whl", "cuda_pathfinder-1.9.1-py3-none-any.whl")) == []
    assert "no cuda-pathfinder wheel" in D.wheel_problems(s("cupti_python-13.4.0-cp312-x.whl"))[0]
    assert "needs >= 1.4.1" in D.wheel_problems(s("cupti_python-13.4.0-cp312-x.whl",
                                                  "cuda_pathfinder-1.4.0-py3-none-any.whl"))[0]
    (tmp_path / "w" / "fallback").mkdir(parents=True)
    for n in ("cupti_python-13.4.0-cp312-x.whl", "cuda_pathfinder-1.9.1-py3-none-any.whl",
              "pyelftools-0.32-py3-none-any.whl", "nvidia_cuda_cupti-13.5.25-py3-none-x.whl",
              "fallback/cupti_python-13.0.1-cp312-x.whl", "fallback/nvidia_cuda_cupti-13.0.85-py3-none-x.whl"):
        (tmp_path / "w" / n).write_text("")
    sets = D.cupti_sets(tmp_path / "w")
    assert [len(x.wheels) for x in sets] == [4, 4, 3, 0]          # the fallback takes pathfinder and pyelftools
    assert sets[1].carries("cuda-pathfinder") and not sets[2].carries("nvidia-cuda-cupti")


# ---- the linked-tree fallback: the working directory must not shadow the package ----------------

def test_the_linked_tree_imports_only_with_pythonsafepath(D, tmp_path):
    src = D.link_tree(tmp_path / "src")
    # as on a machine where pip could not install pagecast: no editable finder (-S: no .pth files)
    dirs = [*site.getsitepackages(), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    base = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    base["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(dirs))
    plain = dict(base, PYTHONPATH=str(src) + os.pathsep + base["PYTHONPATH"])
    ok, why = D.import_check([sys.executable, "-S"], plain)
    assert not ok and "pagecast." in why, why          # ./pagecast (the core alone) shadows the tree
    ok, why = D.import_check([sys.executable, "-S"], D.linked_env(base, src))
    assert ok, why


# ---- the whole dry run, as a user runs it ----------------------------------------------------------

def test_device_check_dry_run_walks_every_step_on_a_cpu_machine(tmp_path):
    env = {**os.environ, "DEVICE_CHECK_OUT": str(tmp_path / "out"), "DEVICE_CHECK_WORK": str(tmp_path / "work"),
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    r = subprocess.run(["bash", str(ROOT / "scripts" / "device-check.sh"), "--dry-run"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=540)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    n = int(re.search(r"^budget: (\d+) s$", r.stdout, re.M).group(1))
    assert n <= 540
    md_ = (tmp_path / "out" / "device-check.md").read_text()
    steps = [ln for ln in md_.splitlines() if re.match(r"\| .* \| [123] \| \d+ s \|", ln)]
    assert len(steps) == 18 and all("| met |" in ln for ln in steps), "\n".join(steps)
    # the validation's table, from a synthetic run: GPU, simulated, their ratio, repeats, the excess
    assert "| GPU / sim |" in md_ and "excess over capacity (MiB)" in md_ and "| repeats |" in md_
    assert "libcupti loaded: /" in md_ and "PYTHONSAFEPATH=1" in md_
    assert "1 line(s) of collect-metrics.jsonl could not be read" in md_
