"""Loading real serving engines' Triton kernels from their installed packages, and the small
fixes they need under Triton's interpreter on the CPU (docs/workloads-triton.md, "Serving
kernels").

The engines' Python modules import much of the engine at their top (configuration,
environment flags, CUDA extension loaders), which does not import on a CPU-only machine with
the packages installed `--no-deps`. Their `@triton.jit` functions need none of it. So a kernel
is loaded from the installed file itself, at run time: the file is parsed, and only its
`triton`/`triton.language`/`math` imports, its module-level constants and its `@triton.jit`
functions are compiled, under the file's own name and line numbers, into a fresh namespace.
Triton reads each kernel's source back from that file (`inspect.getsource`), so what runs is
exactly the installed code; nothing of it is copied into this repository.

Pinned versions (installed with `pip install --no-deps`; their own requirements would pull CUDA
builds): sglang 0.5.23 and flashinfer-python 0.7.2.post1.

Fixes (each changes how a kernel is launched on the CPU, never what it reads or writes):

1. `tl.extra.cuda` launch-dependency intrinsics (`gdc_wait`, `gdc_launch_dependents`) exist
   only for compiled code; kernels branch around them on a constexpr (`USE_GDC`) that the
   programs leave False, as the engines do on GPUs without programmatic dependent launch.
2. Kernels that take an optional tensor as `None` (a constexpr in the compiled kernel) get
   `None`, as the engines' host code passes it.
3. `@triton.jit(repr=...)` names a module-level helper that builds the kernel's name for
   profilers from its constexprs (sglang's unified attention); the helper comes from a library
   the engine imports and this loader leaves out, so the `repr` keyword is dropped (the kernel
   keeps its function's name). A `@triton.jit` function whose definition still names something
   left out (a parameter's default taken from such a library: an fp8 type's range) is not
   loaded; the file's other kernels are.
"""

from __future__ import annotations

import ast
import importlib.util
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _dist_version
from pathlib import Path
from types import SimpleNamespace

PINNED = {"sglang": "0.5.23", "flashinfer": "0.7.2.post1"}
PIP_NAMES = {"sglang": "sglang", "flashinfer": "flashinfer-python"}
_ALLOWED_IMPORTS = {"triton", "triton.language", "math"}
_CACHE: dict[tuple[str, str], SimpleNamespace] = {}


class EngineMissing(RuntimeError):
    pass


def package_dir(package: str) -> Path:
    """The installed package's folder, found without importing it (its __init__ is heavy)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise EngineMissing(f"{package} is not installed (pip install --no-deps "
                            f"{PIP_NAMES.get(package, package)}=={PINNED.get(package, '?')})")
    return Path(list(spec.submodule_search_locations)[0])


def version(package: str) -> str:
    try:
        return _dist_version(PIP_NAMES.get(package, package))
    except PackageNotFoundError:
        return "?"


def _is_jit(node: ast.AST) -> bool:
    if not isinstance(node, ast.FunctionDef):
        return False
    for d in node.decorator_list:
        f = d.func if isinstance(d, ast.Call) else d
        if ast.unparse(f) in ("triton.jit", "jit"):
            return True
    return False


def _drop_repr(node: ast.FunctionDef) -> None:
    """Fix 3 (module doc): a `@triton.jit(repr=...)` decorator loses its `repr` keyword."""
    for d in node.decorator_list:
        if isinstance(d, ast.Call):
            d.keywords = [k for k in d.keywords if k.arg != "repr"]


def _constant(node: ast.AST) -> bool:
    """A module-level assignment of a literal, or of tl.constexpr(literal / another such name)."""
    if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
        return False
    try:
        for sub in ast.walk(node.value):
            if isinstance(sub, ast.Call) and ast.unparse(sub.func) not in ("tl.constexpr", "int", "float"):
                return False
            if isinstance(sub, (ast.Lambda, ast.ListComp, ast.DictComp, ast.GeneratorExp, ast.Await)):
                return False
    except Exception:
        return False
    return True


def load(package: str, relpath: str) -> SimpleNamespace:
    """The `@triton.jit` functions (and literal constants) of `package/relpath`, as installed."""
    key = (package, relpath)
    if key in _CACHE:
        return _CACHE[key]
    path = package_dir(package) / relpath
    if not path.is_file():
        raise EngineMissing(f"{path} not found: {package} {version(package)} installed, "
                            f"{PINNED.get(package, '?')} expected")
    tree = ast.parse(path.read_text(), filename=str(path))
    ns: dict = {"__name__": f"pagecast_engine.{package}.{relpath[:-3].replace('/', '.')}", "__file__": str(path)}
    for node in tree.body:
        imp = (isinstance(node, ast.Import) and all(a.name in _ALLOWED_IMPORTS for a in node.names)) or \
            (isinstance(node, ast.ImportFrom) and node.module in _ALLOWED_IMPORTS)
        jit = _is_jit(node)
        if not (imp or jit or _constant(node)):
            continue
        if jit:
            _drop_repr(node)
        code = compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec")
        try:
            exec(code, ns)  # noqa: S102 - the installed engine's own code, line for line
        except NameError:
            # a constant built from a value this loader left out, or a kernel whose defaults
            # name one (fix 3): left out; the other kernels load
            if not (_constant(node) or jit):
                raise
    out = SimpleNamespace(**{k: v for k, v in ns.items() if not k.startswith("__")})
    _CACHE[key] = out
    return out
