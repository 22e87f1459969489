"""The source tree's structure: layers without back-edges or cycles, function-level imports only where
needed, one name per kind of file, long modules that say why, every package installed."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

import layering as L

ROOT = Path(__file__).resolve().parents[1]


def test_the_tree_keeps_its_layers():
    assert L.check(ROOT) == []


@pytest.fixture(scope="module")
def clean_tree(tmp_path_factory):
    """A copy of the source folders that passes the check (copied and checked once a module)."""
    root = tmp_path_factory.mktemp("clean_tree")
    for folder in L.FOLDERS:
        shutil.copytree(ROOT / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    assert L.check(root) == []
    return root


@pytest.fixture
def tree(clean_tree, tmp_path):
    """A copy of that clean copy, to break on purpose."""
    for folder in L.FOLDERS:
        shutil.copytree(clean_tree / folder, tmp_path / folder)
    return tmp_path


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + "\n" + text + "\n")


def test_a_back_edge_fails(tree):
    """The planner importing the simulator (what choose_span's trial runs did before they were passed in)."""
    _append(tree / "replay" / "plan" / "spans.py", "from ..sim.run import run_policy  # noqa: E402")
    problems = L.check(tree)
    assert any("pagecast.replay.plan.spans (plan/online) imports pagecast.replay.sim.run (sim/gpu): a higher layer"
               in p for p in problems), problems


def test_a_core_module_reaching_up_fails(tree):
    _append(tree / "pagecast" / "trace.py", "from pagecast.report import render  # noqa: E402")
    assert any("pagecast.trace (core) imports pagecast.report.render (report)" in p for p in L.check(tree))


def test_the_simulator_and_the_gpu_runner_stay_independent(tree):
    _append(tree / "replay" / "sim" / "run.py", "from ..gpu import cuda_engine  # noqa: E402")
    assert any("two components of one layer stay independent" in p for p in L.check(tree))


def test_an_import_cycle_fails(tree):
    _append(tree / "replay" / "unit_space.py", "from . import costs  # noqa: E402")
    _append(tree / "replay" / "costs.py", "from . import unit_space  # noqa: E402")
    problems = L.check(tree)
    assert any(p.startswith("import cycle:") and "pagecast.replay.costs" in p and "pagecast.replay.unit_space" in p
               for p in problems), problems


def test_a_function_level_import_needs_a_reason(tree):
    _append(tree / "replay" / "sim" / "run.py", "def late():\n    from ..plan import groups\n    return groups")
    assert any("pagecast.replay.sim.run imports pagecast.replay.plan.groups inside a function" in p
               for p in L.check(tree))
    # ... but the CLI layer may wait (start-up time), and an optional extra may always
    _append(tree / "replay" / "commands.py", "def late():\n    from .plan import groups\n    return groups")
    _append(tree / "replay" / "gpu" / "driver.py", "def late2():\n    import cupy\n    return cupy")
    problems = L.check(tree)
    assert not any("replay/commands.py" in p or "replay/gpu/driver.py" in p for p in problems), problems


def test_relative_imports_resolve_as_python_does():
    got = {(i.imported, i.local) for i in L.imports_of(ROOT, ROOT / "replay" / "sim" / "run.py")}
    assert ("pagecast.replay.sim.kernels", False) in got and ("pagecast.replay.plan.groups", False) in got
    got = {i.imported for i in L.imports_of(ROOT, ROOT / "replay" / "policies" / "__init__.py")}
    assert "pagecast.replay.policies.demand" in got and "pagecast.errors" in got


def _modules():
    return L.source_files(ROOT)


def test_no_two_files_share_a_name():
    """Names say what a file is: a name means one thing (each stage's `commands.py` is its CLI)."""
    seen: dict[str, list[str]] = {}
    for p in _modules():
        if p.name not in ("__init__.py", "commands.py"):
            seen.setdefault(p.name, []).append(str(p.relative_to(ROOT)))
    assert {n: ps for n, ps in seen.items() if len(ps) > 1} == {}


LONG = 500   # lines; a module past it says at its top why it is one module ("Long because ...")


def test_long_modules_say_why():
    long = []
    for p in _modules():
        text = p.read_text()
        if text.count("\n") > LONG:
            doc = ast.get_docstring(ast.parse(text)) or ""
            if "Long because" not in doc:
                long.append(f"{p.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    assert long == []


def test_every_package_folder_is_installed():
    """pyproject's packages list names every folder with an __init__.py (a wheel holds only those)."""
    tomllib = pytest.importorskip("tomllib")   # Python 3.11+
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    found = set()
    for p in _modules():
        if p.name == "__init__.py":
            found.add(L.module_name(ROOT, p))
    assert found == listed
    for pkg, folder in cfg["package-dir"].items():
        assert L.module_name(ROOT, ROOT / folder / "__init__.py") == pkg, (pkg, folder)


MAX_KERNEL_ARGS = 10   # numba kernels take bundles of arrays (sim/kernels.py's Space, Mem, Rules, ...)


def test_numba_kernels_take_at_most_ten_arguments():
    wide = []
    for p in _modules():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef) and any("njit" in ast.unparse(d) for d in node.decorator_list):
                n = len(node.args.args) + len(node.args.kwonlyargs)
                if n > MAX_KERNEL_ARGS:
                    wide.append(f"{p.relative_to(ROOT)}:{node.lineno} {node.name} ({n} arguments)")
    assert wide == []
