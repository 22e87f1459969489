"""Every CUDA driver/runtime and CUPTI call the GPU code makes, checked against the
installed cuda-bindings and cupti-python without a GPU: the function exists and
takes the number of arguments we pass, and every enum member or class we name
exists.

The GPU paths (collector, runner, calibration) run on CPU CI only against
stand-ins; this catches a renamed function, a changed signature (CUDA 13 gave
cuMemPrefetchAsync a CUmemLocation) or a misspelt enum before device time is
spent finding it."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

driver = pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is not installed (pip install .[test])")
runtime = pytest.importorskip("cuda.bindings.runtime", reason="cuda-bindings is not installed (pip install .[test])")
cupti = pytest.importorskip("cupti.cupti", reason="cupti-python is not installed (pip install .[test])")

ROOT = Path(__file__).resolve().parents[1]
# (file, the expressions that name the driver / runtime module there)
FILES = {
    "collect/activity.py": {"cupti": cupti},
    "collect/cuda_device.py": {"drv": driver, "self.drv": driver, "cupti": cupti},
    "collect/gpuinfo.py": {"drv": driver, "rt": runtime, "cupti": cupti},
    "collect/launch_hook.py": {"drv": driver, "cupti": cupti},
    "collect/managed.py": {"cupti": cupti},
    "replay/gpu/driver.py": {"d": driver, "self._d": driver},
    "replay/gpu/cupti_monitor.py": {"cupti": cupti},
}
# names we reach for on purpose only where they exist (older/newer bindings)
OPTIONAL = {"cuMemPrefetchAsync_v2", "subscribe"}


def _chain(node: ast.AST) -> list[str] | None:
    """`self._d.CUmemLocationType.X` -> ["self", "_d", "CUmemLocationType", "X"]."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


def _uses(path: str, roots: dict):
    """(line, module, attribute path, positional arg count or None) for every use."""
    tree = ast.parse((ROOT / path).read_text())
    calls = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            calls[id(node.func)] = node
    seen = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or id(node) in seen:
            continue
        parts = _chain(node)
        if not parts:
            continue
        for root, mod in roots.items():
            rp = root.split(".")
            if parts[:len(rp)] == rp and len(parts) > len(rp):
                # mark the sub-chains of this (outermost) attribute as seen
                inner = node.value
                while isinstance(inner, ast.Attribute):
                    seen.add(id(inner))
                    inner = inner.value
                call = calls.get(id(node))
                nargs = None
                if call is not None and not any(isinstance(a, ast.Starred) for a in call.args) and not call.keywords:
                    nargs = len(call.args)
                yield node.lineno, mod, parts[len(rp):], nargs
                break


CASES = [(p, *u) for p, roots in FILES.items() for u in _uses(p, roots)]


def test_the_scan_finds_the_calls_we_depend_on():
    names = {(p, ".".join(attr)) for p, _, _, attr, _ in CASES}
    for want in [("replay/gpu/driver.py", "cuMemPrefetchAsync"), ("replay/gpu/driver.py", "cuLaunchKernel"),
                 ("collect/launch_hook.py", "cuFuncGetParamInfo"), ("collect/launch_hook.py", "cuKernelGetParamInfo"),
                 ("collect/cuda_device.py", "cuMemPrefetchAsync"),
                 ("replay/gpu/driver.py", "cuMemcpyDtoHAsync"),
                 ("replay/gpu/driver.py", "cuEventSynchronize"), ("replay/gpu/driver.py", "cuStreamSynchronize"),
                 ("collect/gpuinfo.py", "cudaRuntimeGetVersion"),
                 ("collect/launch_hook.py", "enable_callback"),
                 ("collect/activity.py", "activity_configure_unified_memory_counter")]:
        assert want in names, want


@pytest.mark.parametrize("path,line,mod,attr,nargs", CASES,
                         ids=[f"{p}:{ln}:{'.'.join(a)}" for p, ln, _, a, _ in CASES])
def test_cuda_bindings_have_what_we_call(path, line, mod, attr, nargs):
    obj = mod
    for i, name in enumerate(attr):
        if not hasattr(obj, name):
            if i == 0 and name in OPTIONAL:
                return  # a fallback the code reaches for only where the bindings have it
            pytest.fail(f"{path}:{line}: {mod.__name__}.{'.'.join(attr[:i + 1])} does not exist "
                        f"in the installed cuda-bindings")
        obj = getattr(obj, name)
    if nargs is None or not callable(obj) or inspect.isclass(obj):
        return
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return
    params = list(sig.parameters.values())
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return
    required = sum(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    assert required <= nargs <= len(params), \
        f"{path}:{line}: {'.'.join(attr)}{sig} called with {nargs} arguments"


def test_the_runners_stream_constants_are_the_drivers():
    """cuda_engine names the default streams by value (it imports no CUDA module on the CPU path)."""
    from pagecast.replay.gpu import cuda_engine as E

    assert E.LEGACY_STREAM == int(driver.CU_STREAM_LEGACY)
    assert E.PER_THREAD_STREAM == int(driver.CU_STREAM_PER_THREAD)
