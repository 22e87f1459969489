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
builds): sglang 0.5.23, flashinfer-python 0.7.2.post1 and vllm 0.34.0.

Fixes (each changes how a kernel is launched on the CPU, never what it reads or writes):

1. `tl.extra.cuda` launch-dependency intrinsics (`gdc_wait`, `gdc_launch_dependents`) exist
   only for compiled code; kernels branch around them on a constexpr (`USE_GDC`) that the
   programs leave False, as the engines do on GPUs without programmatic dependent launch.
2. Kernels that take an optional tensor as `None` (a constexpr in the compiled kernel) get
   `None`, as the engines' host code passes it.
3. `@triton.jit(repr=...)` names a module-level helper that builds the kernel's name for
   profilers from its constexprs (sglang's unified attention); the helper comes from a library
   the engine imports and this loader leaves out, so the `repr` keyword is dropped (the kernel
   keeps its function's name). A `@triton.jit` function whose decorator still names something
   left out is not loaded; the file's other kernels are.
4. A file's imports of the engine's own modules: `from vllm.triton_utils import tl, triton` (an
   engine's re-export of Triton) binds Triton's own; an import from another of the package's
   files (`from vllm.v1.attention.ops.triton_attention_helpers import find_seq_idx`, or a
   relative one) loads that file the same way and binds the `@triton.jit` functions and
   constants it names (the others it names are left out).
5. A kernel's parameter default that names a value from a library the loader leaves out
   (`FP8_MIN: tl.constexpr = float8_info.min`, an fp8 type's range from vLLM's platform layer)
   names a `LeftOut` stand-in instead, so the kernel loads; the programs pass such parameters,
   as the engines' host code does.
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _dist_version
from pathlib import Path
from types import SimpleNamespace

PINNED = {"sglang": "0.5.23", "flashinfer": "0.7.2.post1", "vllm": "0.34.0"}
PIP_NAMES = {"sglang": "sglang", "flashinfer": "flashinfer-python", "vllm": "vllm"}
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


def _package_file(package: str, relpath: str, node: ast.ImportFrom) -> str | None:
    """The package file (relative to its folder) an import inside `package/relpath` names, when
    it names one of the package's own modules: `from package.a.b import f` or `from .b import f`."""
    if node.level:
        base = Path(relpath).parts[:-node.level] if node.level <= len(Path(relpath).parts) else None
        if base is None:
            return None
        parts = [*base, *(node.module.split(".") if node.module else [])]
    elif node.module and node.module.split(".")[0] == package:
        parts = node.module.split(".")[1:]
    else:
        return None
    rel = "/".join(parts) + ".py"
    return rel if parts and (package_dir(package) / rel).is_file() else None


def _import_kernels(package: str, relpath: str, node: ast.stmt, ns: dict) -> bool:
    """Fix 4 (module doc): binds what an import of the engine's own code gives the kernels.
    `from <engine module> import tl, triton` (an engine's re-export of Triton) binds Triton's;
    an import from another of the package's files binds the `@triton.jit` functions and
    constants that file defines (loaded the same way). False for any other statement."""
    if not isinstance(node, ast.ImportFrom):
        return False
    names = {a.name: a.asname or a.name for a in node.names}
    own = node.level > 0 or (node.module or "").split(".")[0] == package
    if not own:
        return False
    if set(names) <= {"tl", "triton"}:
        import triton
        import triton.language as tl
        ns.update({names[n]: {"tl": tl, "triton": triton}[n] for n in names})
        return True
    rel = _package_file(package, relpath, node)
    if rel is None:
        return True
    other = load(package, rel)
    ns.update({alias: getattr(other, n) for n, alias in names.items() if hasattr(other, n)})
    return True


class LeftOut:
    """Fix 5 (module doc): what a kernel's parameter default names from a library this loader
    leaves out (`float8_info.min`, an fp8 type's range from the engine's platform layer). The
    default is never used: the programs pass those parameters, as the engines' host code does."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __getattr__(self, attr: str) -> "LeftOut":
        if attr.startswith("__"):
            raise AttributeError(attr)
        return LeftOut(f"{self.name}.{attr}")

    def __repr__(self) -> str:
        return f"<left out: {self.name}>"


def _bind_left_out(node: ast.FunctionDef, ns: dict) -> None:
    """Binds each name a kernel's parameter defaults use and nothing loaded defines to a LeftOut
    (in the namespace, as the interpreter re-reads the kernel's source and defines it again there)."""
    args = node.args
    for d in [*args.defaults, *(d for d in args.kw_defaults if d is not None)]:
        for n in ast.walk(d):
            if isinstance(n, ast.Name) and n.id not in ns and not hasattr(builtins, n.id):
                ns[n.id] = LeftOut(n.id)


def load(package: str, relpath: str) -> SimpleNamespace:
    """The `@triton.jit` functions (and literal constants) of `package/relpath`, as installed,
    with the ones it imports from the package's other files."""
    key = (package, relpath)
    if key in _CACHE:
        return _CACHE[key]
    path = package_dir(package) / relpath
    if not path.is_file():
        raise EngineMissing(f"{path} not found: {package} {version(package)} installed, "
                            f"{PINNED.get(package, '?')} expected")
    tree = ast.parse(path.read_text(), filename=str(path))
    ns: dict = {"__name__": f"pagecast_engine.{package}.{relpath[:-3].replace('/', '.')}", "__file__": str(path)}
    _CACHE[key] = SimpleNamespace()   # an import cycle between the package's files ends here
    try:
        _load_into(package, relpath, path, tree, ns)
    except BaseException:
        del _CACHE[key]
        raise
    out = SimpleNamespace(**{k: v for k, v in ns.items() if not k.startswith("__")})
    _CACHE[key] = out
    return out


def _load_into(package: str, relpath: str, path: Path, tree: ast.Module, ns: dict) -> None:
    """Runs the statements of the parsed file `tree` that `load` keeps, in order, into `ns`."""
    for node in tree.body:
        if _import_kernels(package, relpath, node, ns):
            continue
        imp = (isinstance(node, ast.Import) and all(a.name in _ALLOWED_IMPORTS for a in node.names)) or \
            (isinstance(node, ast.ImportFrom) and node.module in _ALLOWED_IMPORTS)
        jit = _is_jit(node)
        if not (imp or jit or _constant(node)):
            continue
        if jit:
            _drop_repr(node)
            _bind_left_out(node, ns)
        code = compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec")
        try:
            exec(code, ns)  # noqa: S102 - the installed engine's own code, line for line
        except NameError:
            # a constant built from a value this loader left out, or a kernel whose decorator
            # names one: left out; the other kernels load
            if not (_constant(node) or jit):
                raise
