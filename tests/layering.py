"""The import rules of pagecast's source tree, checked from the files themselves (ast, no imports run).

Layers, lowest first (docs/architecture.md, "Layers"): a module may import
modules of lower layers and of its own component, never a higher layer nor
another component of its own layer.

Function-level imports are allowed only where they are needed: in the CLI
layer (start-up time: `pagecast -h` must not load numba, pyarrow's compute or
the report's matplotlib), for optional extras (the GPU stack, torch, CuPy,
matplotlib, libCacheSim), and for the few cases in ALLOWED_LOCAL, each with
its reason. `check(root)` returns every violation as one line.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

# (module prefix, layer, component). The longest matching prefix wins; a component is one prefix.
LAYERS: list[tuple[str, int, str]] = [
    ("pagecast", 0, "core"),
    ("pagecast.datasets", 1, "datasets"),
    ("pagecast.collect", 1, "collect"),
    ("pagecast.predict", 2, "predict"),
    ("pagecast.replay", 3, "replay"),               # its shared files: costs, unit_space, results_io, results_table
    ("pagecast.replay.plan", 4, "plan"),
    ("pagecast.replay.online", 4, "online"),
    ("pagecast.replay.policies", 5, "policies"),
    ("pagecast.replay.request", 6, "request"),      # the replay request, validated against the policy registry
    ("pagecast.replay.sim", 7, "sim"),
    ("pagecast.replay.gpu", 7, "gpu"),
    ("pagecast.report", 8, "report"),
    ("pagecast.demo", 9, "pipeline"),
    ("pagecast.cli", 10, "cli"),
    ("pagecast.core_commands", 10, "cli"),
]
CLI_LAYER = 10
LAYER_NAMES = {0: "core", 1: "datasets/collect", 2: "predict", 3: "replay files", 4: "plan/online", 5: "policies",
               6: "replay request", 7: "sim/gpu", 8: "report", 9: "pipeline", 10: "CLI"}

# The source folders and the package each is installed as (pyproject's package-dir).
FOLDERS = {"pagecast": "pagecast", "collect": "pagecast.collect", "datasets": "pagecast.datasets",
           "predict": "pagecast.predict", "replay": "pagecast.replay", "report": "pagecast.report"}

# Third-party modules that may be imported inside functions: optional extras and heavy imports that
# only some paths need.
OPTIONAL = {"cuda", "cupti", "cupy", "torch", "triton", "libcachesim", "matplotlib", "nvidia", "PIL",
            "pandas",   # pandas: see below
            "cxxfilt"}  # cxxfilt looks for libc and the C++ runtime at import (ldconfig); only names shown need it
# pandas: only the fitter's row hashing needs it, and it takes a third of a second to import

# (importer, imported): why this function-level import of pagecast code is there.
ALLOWED_LOCAL = {
    ("pagecast", "pagecast.replay.gpu.prefetching"):
        "pagecast.prefetching, the public entry point, loads the GPU engine on first use",
}
# Modules whose function-level imports of pagecast code are left for now, and why.
LEFT_ALONE: dict[str, str] = {}

# (importer, imported): an import across the layers that is allowed, and why.
ALLOWED_EDGES = dict(ALLOWED_LOCAL)


def layer_of(module: str) -> tuple[int, str] | None:
    best = None
    for prefix, layer, comp in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, layer, comp)
    if best is None:
        return None
    if module.rsplit(".", 1)[-1] == "commands":   # every stage's subcommands are the CLI's
        return CLI_LAYER, "cli"
    return best[1], best[2]


@dataclass
class Import:
    importer: str
    imported: str
    line: int
    local: bool        # inside a function
    typing_only: bool  # under `if TYPE_CHECKING:`


def module_name(root: Path, path: Path) -> str | None:
    rel = path.relative_to(root)
    folder = rel.parts[0]
    if folder not in FOLDERS:
        return None
    parts = [FOLDERS[folder]] + list(rel.parts[1:])
    parts[-1] = parts[-1][:-3]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(root: Path, path: Path) -> list[Import]:
    """Every import in one file, resolved to absolute module names."""
    me = module_name(root, path)
    is_pkg = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), str(path))
    out: list[Import] = []

    def visit(node, local: bool, typing_only: bool):
        for child in ast.iter_child_nodes(node):
            loc = local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            tc = typing_only
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                tc = True
            if isinstance(child, ast.Import):
                for a in child.names:
                    out.append(Import(me, a.name, child.lineno, local, typing_only))
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = me.split(".") if is_pkg else me.split(".")[:-1]
                    base = base[:len(base) - (child.level - 1)]
                    mod = ".".join(base + ([child.module] if child.module else []))
                else:
                    mod = child.module or ""
                for a in child.names:
                    sub = f"{mod}.{a.name}"
                    # `from pkg import module` imports the module; `from module import name`, the module
                    target = sub if _resolves(root, sub) else mod
                    out.append(Import(me, target, child.lineno, local, typing_only))
            visit(child, loc, tc)

    visit(tree, False, False)
    return out


def _resolves(root: Path, module: str) -> bool:
    """Whether `module` is one of pagecast's modules or packages (a file or folder in the tree)."""
    for folder, pkg in sorted(FOLDERS.items(), key=lambda kv: -len(kv[1])):   # the longest package first
        if module == pkg:
            return True
        if module.startswith(pkg + "."):
            rest = module[len(pkg) + 1:].split(".")
            base = root / folder / Path(*rest)
            return base.with_suffix(".py").exists() or (base / "__init__.py").exists()
    return False


def source_files(root: Path) -> list[Path]:
    return sorted(p for f in FOLDERS if (root / f).is_dir() for p in (root / f).rglob("*.py")
                  if "__pycache__" not in p.parts)


def check(root: Path) -> list[str]:
    """Every violation of the import rules under `root` (a checkout), one line each."""
    root = Path(root)
    problems: list[str] = []
    graph: dict[str, set[str]] = {}
    for path in source_files(root):
        for imp in imports_of(root, path):
            if not imp.imported.startswith("pagecast"):
                top = imp.imported.split(".")[0]
                if imp.local and top not in OPTIONAL and layer_of(imp.importer)[0] != CLI_LAYER \
                        and imp.importer not in LEFT_ALONE:
                    problems.append(f"{path.relative_to(root)}:{imp.line}: {imp.importer} imports {imp.imported}"
                                    " inside a function (only optional extras may be; move it to the top)")
                continue
            if imp.typing_only or imp.imported == imp.importer:
                continue
            src, dst = layer_of(imp.importer), layer_of(imp.imported)
            if src is None or dst is None:
                continue
            edge = (imp.importer, imp.imported)
            if edge not in ALLOWED_EDGES:   # an allowed lazy import is not an import-time dependency
                graph.setdefault(imp.importer, set()).add(imp.imported)
            where = f"{path.relative_to(root)}:{imp.line}"
            if imp.local and src[0] != CLI_LAYER and edge not in ALLOWED_LOCAL and imp.importer not in LEFT_ALONE:
                problems.append(f"{where}: {imp.importer} imports {imp.imported} inside a function"
                                " (move it to the top, or say in tests/layering.py why it must wait)")
            if edge in ALLOWED_EDGES:
                continue
            if dst[0] > src[0]:
                problems.append(f"{where}: {imp.importer} ({LAYER_NAMES[src[0]]}) imports {imp.imported}"
                                f" ({LAYER_NAMES[dst[0]]}): a higher layer")
            elif dst[0] == src[0] and dst[1] != src[1]:
                problems.append(f"{where}: {imp.importer} ({src[1]}) imports {imp.imported} ({dst[1]}):"
                                " two components of one layer stay independent")
    problems += [f"import cycle: {' -> '.join(c)}" for c in cycles(graph)]
    return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as a closed path."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp) + [sorted(comp)[0]])

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out
