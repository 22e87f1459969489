"""Write tests/data/cuda13.0-surface.json: what a CUDA 13.0 machine offers the GPU code.

The GPU code is tested on CPUs against the newest cuda-bindings and cupti-python (what
`pip install .[test]` brings), but the machine it runs on may have a CUDA 13.0 driver and the
older cupti-python. This file records, from the released wheels themselves, the two surfaces
the CPU tests check the code against (tests/test_cuda13_0_surface.py):

- `driver_functions`: every driver function cuda-bindings 13.0.0 declares
  (`cuda/bindings/cydriver.pxd`, the `cdef CUresult cuX(...)` lines): the CUDA 13.0 driver
  API. A function missing here is missing from a 13.0 driver (libcuda.so.1's
  cuGetProcAddress does not know it; cuda-bindings then raises FunctionNotFoundError).
- `cupti_names` / `cupti_members`: cupti-python 13.0.1's module names and the members of its
  classes and enums (`cupti/cupti.pyi`, parsed with `ast`), the fallback set for a 13.0 driver.

How it was made (the wheels are fetched, not installed; no GPU needed):

    pip download --no-deps --python-version 3.12 --only-binary=:all: \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d /tmp/wheels \
        cuda-bindings==13.0.0 cupti-python==13.0.1
    python scripts/cuda_surface_data.py /tmp/wheels/cuda_bindings-13.0.0-*.whl \
        /tmp/wheels/cupti_python-13.0.1-*.whl
"""

from __future__ import annotations

import ast
import json
import re
import sys
import zipfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "cuda13.0-surface.json"


def _read(wheel: str, member: str) -> str:
    with zipfile.ZipFile(wheel) as z:
        return z.read(member).decode()


def driver_functions(cydriver_pxd: str) -> list[str]:
    return sorted(set(re.findall(r"^cdef CUresult (cu\w+)\(", cydriver_pxd, re.M)))


def cupti_surface(pyi: str) -> tuple[list[str], dict[str, list[str]]]:
    tree = ast.parse(pyi)
    names, members = set(), {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        if isinstance(node, ast.ClassDef):
            got = set()
            for b in node.body:
                if isinstance(b, ast.FunctionDef):
                    got.add(b.name)
                elif isinstance(b, ast.AnnAssign) and isinstance(b.target, ast.Name):
                    got.add(b.target.id)
            members[node.name] = sorted(m for m in got if not m.startswith("__"))
    return sorted(names), dict(sorted(members.items()))


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    bindings, cupti = argv
    fns = driver_functions(_read(bindings, "cuda/bindings/cydriver.pxd"))
    names, members = cupti_surface(_read(cupti, "cupti/cupti.pyi"))
    data = {"sources": {"driver_functions": f"{Path(bindings).name}: cuda/bindings/cydriver.pxd",
                        "cupti": f"{Path(cupti).name}: cupti/cupti.pyi"},
            "driver_functions": fns, "cupti_names": names, "cupti_members": members}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(data, indent=0, sort_keys=False) + "\n")
    print(f"{OUT}: {len(fns)} driver functions, {len(names)} cupti names, "
          f"{sum(map(len, members.values()))} members")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
