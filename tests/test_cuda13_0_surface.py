"""The GPU code against what a CUDA 13.0 machine offers, checked on a CPU.

CI installs the newest cuda-bindings and cupti-python; a GPU machine may have a CUDA 13.0
driver and cupti-python 13.0.1. tests/data/cuda13.0-surface.json (made from the released
wheels by scripts/cuda_surface_data.py) records that machine's driver functions and
cupti-python's names; these tests hold the code to it:

- every driver function the code calls exists in CUDA 13.0, and the parameter layout comes
  out right from a stand-in libcuda.so.1 that hands out only CUDA 13.0's functions
  (tests/standin_libcuda.c, compiled here with the system C compiler);
- every cupti-python name the code uses exists in 13.0.1, and the callbacks' parameter structs
  (collect/cupti_params.py) have cupti-python 13.4's layouts;
- every kernel-launch callback id CUPTI has is enabled, CUDA 13's __cudaLaunchKernel included;
- the collector's GPU probe loads an sm_90 cubin, not PTX a 13.0 driver's JIT would refuse.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from pagecast.collect import cupti_params as P
from pagecast.collect import launch_hook as lh

ROOT = Path(__file__).resolve().parents[1]
SURFACE = json.loads((Path(__file__).parent / "data" / "cuda13.0-surface.json").read_text())
DRIVER_13_0 = set(SURFACE["driver_functions"])


def _scanner():
    pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is not installed (pip install .[test])")
    pytest.importorskip("cupti.cupti", reason="cupti-python is not installed (pip install .[test])")
    import test_cuda_api_surface as S
    return S


# ---- item: driver functions a CUDA 13.0 driver lacks ---------------------------------------

def test_the_surface_file_knows_cuda_13_0():
    # what the fixes rely on, as the 13.0.0 bindings declare it
    assert {"cuFuncGetParamInfo", "cuKernelGetParamInfo", "cuFuncGetName", "cuKernelGetName",
            "cuMemPrefetchAsync", "cuModuleLoadData", "cuLibraryLoadData"} <= DRIVER_13_0
    assert not {"cuFuncGetParamCount", "cuKernelGetParamCount"} & DRIVER_13_0   # CUDA 13.2


def test_every_driver_function_the_code_calls_is_in_cuda_13_0():
    S = _scanner()
    driver = sys.modules["cuda.bindings.driver"]
    missing = []
    for path, roots in S.FILES.items():
        for line, mod, attr, _n in S._uses(path, roots):
            name = attr[0]
            if mod is driver and re.match(r"cu[A-Z]", name) and callable(getattr(driver, name, None)):
                if name not in DRIVER_13_0:
                    missing.append(f"{path}:{line}: {name}")
    assert not missing, "not in a CUDA 13.0 driver: " + ", ".join(missing)
    # the 13.2 count functions are reached for by name only where the driver has them
    src = (ROOT / "collect/launch_hook.py").read_text()
    assert "drv.cuFuncGetParamCount" not in src and "drv.cuKernelGetParamCount" not in src


@pytest.fixture(scope="module")
def standin_driver(tmp_path_factory):
    """A directory holding the stand-in libcuda.so.1 and the symbol list it hands out."""
    pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is not installed (pip install .[test])")
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler to build the stand-in libcuda.so.1")
    d = tmp_path_factory.mktemp("libcuda")
    r = subprocess.run([cc, "-O1", "-shared", "-fPIC", "-o", str(d / "libcuda.so.1"),
                        str(Path(__file__).parent / "standin_libcuda.c")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    (d / "symbols.txt").write_text("\n".join(sorted(DRIVER_13_0)) + "\n")
    return d


PROBE_LAYOUT = r'''
import ctypes, json, struct
from types import SimpleNamespace
from cuda.bindings import driver as drv
from pagecast.collect import cupti_params as P
from pagecast.collect import launch_hook as lh

out = {"init": int(drv.cuInit(0)[0]), "version": int(drv.cuDriverGetVersion()[1])}
try:
    drv.cuFuncGetParamCount(drv.CUfunction(0x1000))
    out["count"] = "present"
except RuntimeError as e:
    out["count"] = type(e).__name__
for h in (0x1000, 0x2000, 0x3000):
    out[hex(h)] = [list(x) for x in lh._driver_layout(h)] + [lh._driver_name(h)]
# a launch through the hook, with the default (driver) parameter info
got = []
hook = lh.LaunchHook(got.append, clock=lambda: 0)
vals = [ctypes.c_uint64(0x7000), ctypes.c_uint64(0x8000), ctypes.c_int(1024)]
arr = (ctypes.c_void_p * 3)(*[ctypes.addressof(v) for v in vals])
p = P.CuLaunchKernelParams(f=0x1000, grid_dim_x=4, grid_dim_y=1, grid_dim_z=1, block_dim_x=256, block_dim_y=1,
                           block_dim_z=1, kernel_params=ctypes.addressof(arr))
for site in (lh.API_ENTER, lh.API_EXIT):
    hook._callback(None, lh.DOMAIN_DRIVER, lh.CB_cuLaunchKernel,
                   SimpleNamespace(callback_site=site, correlation_id=9, function_params=ctypes.addressof(p),
                                   symbol_name="saxpy", context=0))
out["hook"] = {"errors": hook.errors, "last_error": hook.last_error,
               "launches": [[a.kernel, list(a.param_offsets), list(a.param_sizes), a.param_data.hex()] for a in got]}
print("OUT " + json.dumps(out))
'''


def test_a_cuda_13_0_driver_gives_the_parameter_layout(standin_driver):
    """cuda-bindings 13.5 over a driver without the 13.2 count functions: the layout comes from
    walking cuFuncGetParamInfo / cuKernelGetParamInfo, and launches carry their arguments."""
    env = {**os.environ, "LD_LIBRARY_PATH": f"{standin_driver}:{os.environ.get('LD_LIBRARY_PATH', '')}",
           "PAGECAST_STANDIN_CUDA_SYMBOLS": str(standin_driver / "symbols.txt")}
    r = subprocess.run([sys.executable, "-c", PROBE_LAYOUT], capture_output=True, text=True, env=env, cwd=ROOT,
                       timeout=120)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("OUT ")]
    assert r.returncode == 0 and line, r.stderr[-2000:]
    out = json.loads(line[-1][4:])
    assert out["init"] == 0 and out["version"] == 13000
    assert out["count"] == "FunctionNotFoundError"   # what a 13.0 driver does to cuda-bindings 13.5
    assert out["0x1000"] == [[0, 8, 16], [8, 8, 4], "_Z5saxpyPfS_i"]   # a CUfunction
    assert out["0x2000"] == [[0, 8], [8, 4], "scale"]                  # a CUkernel
    assert out["0x3000"] == [[], [], "noargs"]                         # no parameters
    want = (struct.pack("<QQi", 0x7000, 0x8000, 1024)).hex()
    assert out["hook"]["errors"] == 0, out["hook"]["last_error"]
    assert out["hook"]["launches"] == [["_Z5saxpyPfS_i", [0, 8, 16], [8, 8, 4], want]]


def test_the_stand_in_driver_refuses_what_13_0_lacks(standin_driver):
    """The fixture is what it claims: with the count functions listed, the driver hands them out."""
    (standin_driver / "all.txt").write_text("\n".join(sorted(DRIVER_13_0 | {"cuFuncGetParamCount"})) + "\n")
    env = {**os.environ, "LD_LIBRARY_PATH": str(standin_driver),
           "PAGECAST_STANDIN_CUDA_SYMBOLS": str(standin_driver / "all.txt")}
    code = ("from cuda.bindings import driver as drv; drv.cuInit(0); "
            "print(int(drv.cuFuncGetParamCount(drv.CUfunction(0x1000))[1]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "3", r.stderr[-2000:]


# ---- item: cupti-python 13.0.1, the fallback set ------------------------------------------

def _cupti_uses(S, path, roots):
    """(line, None, attribute path, root) of every use of each root."""
    for root in roots:
        for line, mod, attr, _n in S._uses(path, {root: None}):
            yield line, mod, attr, root


CUPTI_ROOTS = {"collect/activity.py": ("cupti",), "collect/launch_hook.py": ("cupti",),
               "collect/managed.py": ("cupti",), "collect/cuda_device.py": ("cupti",),
               "collect/gpuinfo.py": ("cupti",), "replay/gpu/cupti_monitor.py": ("c", "self._c", "cupti")}


def _alias_lines(path: str, alias: str = "c", target: str = "self._c") -> set[int]:
    """The lines of the functions that bind `alias = target` (cupti_monitor's `c = self._c`;
    elsewhere there `c` is a UvmCounts)."""
    import ast
    out = set()
    for node in ast.walk(ast.parse((ROOT / path).read_text())):
        if isinstance(node, ast.FunctionDef) and any(
                isinstance(a, ast.Assign) and [ast.unparse(t) for t in a.targets] == [alias]
                and ast.unparse(a.value) == target for a in ast.walk(node)):
            out |= set(range(node.lineno, node.end_lineno + 1))
    return out


def test_every_cupti_name_the_code_uses_is_in_cupti_python_13_0_1():
    S = _scanner()
    names, members = set(SURFACE["cupti_names"]), SURFACE["cupti_members"]
    bad = []
    for path, roots in CUPTI_ROOTS.items():
        aliased = _alias_lines(path)
        for line, _mod, attr, root in _cupti_uses(S, path, roots):
            if root == "c" and line not in aliased:
                continue
            if attr[0] not in names:
                bad.append(f"{path}:{line}: cupti.{attr[0]}")
            elif len(attr) > 1 and attr[0] in members and not attr[1].startswith("_") \
                    and attr[1] not in members[attr[0]] and attr[1] not in ("ptr", "value"):
                bad.append(f"{path}:{line}: cupti.{'.'.join(attr[:2])}")
    assert not bad, "missing from cupti-python 13.0.1: " + ", ".join(bad)


def test_the_parameter_classes_are_not_in_13_0_1_so_the_code_has_its_own():
    names = set(SURFACE["cupti_names"])
    assert not {"CuLaunchKernelParams", "CuMemAllocManagedParams", "CudaLaunchKernelV7000Params"} & names
    for path in ("collect/launch_hook.py", "collect/managed.py"):
        src = (ROOT / path).read_text()
        assert "Params.from_ptr" not in src and "cupti.Cu" not in src, path


@pytest.mark.parametrize("cls", P.ALL, ids=lambda c: c.__name__)
def test_parameter_structs_have_cuptis_layout(cls):
    cupti = pytest.importorskip("cupti.cupti", reason="cupti-python is not installed (pip install .[test])")
    assert cls.CUPTI_DTYPES
    for name in cls.CUPTI_DTYPES:
        dt = getattr(cupti, name)
        ours = {f: (getattr(cls, f).offset, getattr(cls, f).size) for f, _ in cls._fields_}
        theirs = {f: (off, sub.itemsize) for f, (sub, off, *_) in dt.fields.items()}
        assert ours == theirs, name
        assert ctypes.sizeof(cls) == dt.itemsize, name


def test_parameter_structs_read_what_cupti_dtypes_write():
    np = pytest.importorskip("numpy")
    cupti = pytest.importorskip("cupti.cupti", reason="cupti-python is not installed (pip install .[test])")
    rec = np.zeros(1, dtype=cupti.cuda_launch_kernel_v7000params_dtype)
    rec["func"] = 0xABC
    rec["grid_dim"] = np.frombuffer(struct.pack("<3I", 7, 8, 9), dtype="V12")
    rec["args"], rec["shared_mem"], rec["stream"] = 0x1234, 48, 0x55
    p = P.CudaLaunchKernelParams.at(rec.ctypes.data)
    assert (p.func, p.grid_dim.x, p.grid_dim.y, p.grid_dim.z, p.args, p.shared_mem, p.stream) == \
        (0xABC, 7, 8, 9, 0x1234, 48, 0x55)
    with pytest.raises(ValueError):
        P.CuLaunchKernelParams.at(0)


# ---- item: callback-id coverage ------------------------------------------------------------

# Launch callbacks that are not one kernel launch the hook can decode, and why.
NOT_KERNEL_LAUNCHES = {
    "cuLaunch", "cuLaunchGrid", "cuLaunchGridAsync",          # pre-CUDA-4 launches; not in CUDA 13's driver API
    "cudaLaunch_v3020", "cudaLaunch_ptsz_v7000",               # the pre-7.0 runtime launch; gone from CUDA 13
    "cuLaunchCooperativeKernelMultiDevice",                    # removed in CUDA 12
    "cudaLaunchCooperativeKernelMultiDevice_v9000",
    "cuGraphLaunch", "cuGraphLaunch_ptsz",                     # a whole graph: its kernels are not seen one by one
    "cudaGraphLaunch_v10000", "cudaGraphLaunch_ptsz_v10000",
    "cuLaunchHostFunc", "cuLaunchHostFunc_ptsz", "cuLaunchHostFunc_v2", "cuLaunchHostFunc_v2_ptsz",  # host code
    "cudaLaunchHostFunc_v10000", "cudaLaunchHostFunc_ptsz_v10000",
    "cudaLaunchHostFunc_v2_v13020", "cudaLaunchHostFunc_v2_ptsz_v13020",
}


def _launch_cbids(cupti, cls_name: str) -> dict[str, int]:
    """name -> cbid of every launch callback in cupti-python's enum, the private ones included
    (`__cudaLaunchKernel_v13000` is name-mangled into `_RuntimeApiTraceCbid__cudaLaunchKernel_v13000`)."""
    pyi = (Path(cupti.__file__).parent / "cupti.pyi").read_text()
    body = pyi[pyi.index(f"class {cls_name}("):]
    body = body[:body.index("\nclass ", 10)]
    enum = getattr(cupti, cls_name)
    out = {}
    for n in re.findall(r"^    (\w+): ClassVar", body, re.M):
        if "Launch" in n:
            out[n.removeprefix(f"_{cls_name}")] = int(getattr(enum, n))
    return out


def test_every_kernel_launch_callback_is_enabled():
    cupti = pytest.importorskip("cupti.cupti", reason="cupti-python is not installed (pip install .[test])")
    drv = _launch_cbids(cupti, "DriverApiTraceCbid")
    rt = _launch_cbids(cupti, "RuntimeApiTraceCbid")
    assert rt["__cudaLaunchKernel_v13000"] == 505 and rt["__cudaLaunchKernel_ptsz_v13000"] == 506
    unhooked = [n for n, v in drv.items() if v not in lh.DRIVER_LAUNCH_CBIDS and n not in NOT_KERNEL_LAUNCHES]
    unhooked += [n for n, v in rt.items() if v not in lh.RUNTIME_LAUNCH_CBIDS and n not in NOT_KERNEL_LAUNCHES]
    assert not unhooked, f"kernel launch callbacks not enabled: {unhooked}"
    # and every enabled one has a parameter struct
    assert set(lh.LAUNCH_PARAMS) == {(lh.DOMAIN_DRIVER, c) for c in lh.DRIVER_LAUNCH_CBIDS} | \
        {(lh.DOMAIN_RUNTIME, c) for c in lh.RUNTIME_LAUNCH_CBIDS}
    # cupti-python 13.0.1 names no launch callback that 13.4 lacks
    members = SURFACE["cupti_members"]
    old = {n.removeprefix(f"_{c}") for c in ("driver_api_trace_cbid", "runtime_api_trace_cbid")
           for n in members[c] if "Launch" in n}
    assert old <= set(drv) | set(rt), old - set(drv) - set(rt)


def test_a_cuda_13_runtime_launch_decodes_its_kernel_handle():
    """nvcc 13's <<<...>>> calls __cudaLaunchKernel(cudaKernel_t, ...): `func` is the CUkernel
    itself, not a host stub to resolve with cudaGetFuncBySymbol."""
    def no_symbol(h):
        raise AssertionError("a kernel handle is not a host stub")

    info = lh.ParamInfo(layout_fn=lambda h: {0xABC: ((0, 8), (8, 4))}[h], name_fn=lambda h: "scale",
                        symbol_fn=no_symbol)
    got = []
    hook = lh.LaunchHook(got.append, param_info=info, clock=lambda: 0)
    vals = [ctypes.c_uint64(0x7000), ctypes.c_int(5)]
    arr = (ctypes.c_void_p * 2)(*[ctypes.addressof(v) for v in vals])
    p = P.CudaLaunchKernelParams(func=0xABC, grid_dim=P.Dim3(3, 1, 1), block_dim=P.Dim3(128, 1, 1),
                                 args=ctypes.addressof(arr), shared_mem=0, stream=0)
    for cbid in (lh.CB___cudaLaunchKernel, lh.CB___cudaLaunchKernel_ptsz):
        for site in (lh.API_ENTER, lh.API_EXIT):
            hook._callback(None, lh.DOMAIN_RUNTIME, cbid, SimpleNamespace(
                callback_site=site, correlation_id=3, function_params=ctypes.addressof(p), symbol_name="s",
                context=0))
    assert hook.errors == 0, hook.last_error
    assert [(a.function, a.grid, a.block, a.param_data, a.cbid) for a in got] == [
        (0xABC, (3, 1, 1), (128, 1, 1), struct.pack("<Qi", 0x7000, 5), cbid)
        for cbid in (lh.CB___cudaLaunchKernel, lh.CB___cudaLaunchKernel_ptsz)]


# ---- item: the probe's module image ----------------------------------------------------------

def _nvrtc():
    nvrtc = pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings is not installed (pip install .[test])")
    try:
        nvrtc.nvrtcVersion()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"libnvrtc is not loadable (pip install .[test] installs nvidia-cuda-nvrtc): {e}")
    return nvrtc


# CUDA 13.0's driver JIT takes PTX ISA up to 9.0 (PTX ISA 9.0 came with CUDA 13.0; docs/collect.md)
PTX_ISA_OF_CUDA_13_0 = (9, 0)


def loadable_by_cuda_13_0_on_sm_90(image: bytes) -> str | None:
    """Why a CUDA 13.0 driver on an H200 would refuse this module image, or None."""
    if image[:4] == b"\x7fELF":
        machine = struct.unpack_from("<H", image, 18)[0]
        arch = (struct.unpack_from("<I", image, 48)[0] >> 8) & 0xFF
        if machine != 190:   # EM_CUDA
            return f"an ELF for machine {machine}, not a CUDA cubin"
        return None if arch == 90 else f"a cubin for sm_{arch}, not sm_90"
    m = re.search(rb"\.version\s+(\d+)\.(\d+)", image)
    if not m:
        return "neither a cubin nor PTX"
    v = (int(m.group(1)), int(m.group(2)))
    return None if v <= PTX_ISA_OF_CUDA_13_0 else f"PTX ISA {v[0]}.{v[1]}, newer than a 13.0 driver's JIT takes"


def test_the_probe_loads_a_module_a_cuda_13_0_driver_takes():
    nvrtc = _nvrtc()
    import probe_kernel
    assert loadable_by_cuda_13_0_on_sm_90(probe_kernel.cubin(nvrtc)) is None
    # PTX from this NVRTC would be refused where NVRTC is newer than 13.0 (why the probe loads a cubin)
    ver = tuple(int(x) for x in nvrtc.nvrtcVersion()[1:])
    why = loadable_by_cuda_13_0_on_sm_90(probe_kernel.ptx(nvrtc).encode())
    assert (why is not None) == (ver > (13, 0)), (ver, why)
    # the probe loads that cubin and stops on a refused load instead of going on without a module
    import test_collect_gpu as G
    assert "probe_kernel.cubin(nvrtc)" in G.PROBE and "compute_90" not in G.PROBE
    for call in ("cuModuleLoadData", "cuLibraryLoadData"):
        assert f'obs["{call}"] = int(err)' in G.PROBE and f"fatal(f\"{call} refused" in G.PROBE


# ---- cupti-python 13.0.1's callback data -----------------------------------------------------

def _cbdata_attributes(path: str) -> dict[str, int]:
    """attribute -> first line, of every `cbdata.X` in a file."""
    import ast
    out: dict[str, int] = {}
    for node in ast.walk(ast.parse((ROOT / path).read_text())):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "cbdata":
            out.setdefault(node.attr, node.lineno)
    return out


def test_the_callback_data_the_code_reads_is_in_cupti_python_13_0_1():
    """13.0.1's CallbackData has no `function_params` (13.4's has): every callback would fail
    reading it. The code reads it through cupti_params.function_params, which falls back to the
    C struct; every other attribute it reads is one 13.0.1 has."""
    have = set(SURFACE["cupti_members"]["CallbackData"])
    assert "function_params" not in have and {"callback_site", "correlation_id", "ptr"} <= have
    bad = [f"{p}:{ln}: cbdata.{a}" for p in ("collect/launch_hook.py", "collect/managed.py", "replay/gpu/child.py",
                                             "replay/gpu/cuda_engine.py")
           for a, ln in _cbdata_attributes(p).items() if a not in have]
    assert not bad, "not in cupti-python 13.0.1's CallbackData: " + ", ".join(bad)


def test_function_params_falls_back_to_the_c_struct():
    np = pytest.importorskip("numpy")
    cupti = pytest.importorskip("cupti.cupti", reason="cupti-python is not installed (pip install .[test])")
    rec = np.zeros(1, dtype=cupti.callback_data_dtype)
    rec["function_params"] = 0x1234
    assert P.function_params(SimpleNamespace(ptr=rec.ctypes.data)) == 0x1234      # as 13.0.1's
    assert P.function_params(SimpleNamespace(function_params=0x99, ptr=0)) == 0x99  # as 13.4's
    real = cupti.CallbackData.from_ptr(rec.ctypes.data, readonly=True)
    assert P.function_params(real) == 0x1234


def test_the_record_fields_read_are_in_cupti_python_13_0_1s_record_classes():
    """The activity records 13.0.1 hands out (kernel 10, memory 4, unified-memory counter 3) have
    every field the collector's snapshots and the replay monitor read."""
    from pagecast.collect import convert as CV

    members = SURFACE["cupti_members"]
    for fields, classes in ((CV.KERNEL_FIELDS, CV.KERNEL_CLASSES), (CV.MEMORY_FIELDS, CV.MEMORY_CLASSES),
                            (CV.UM_FIELDS, CV.UM_CLASSES)):
        old = [c for c in classes if c in members]
        assert old, classes
        for c in old:
            assert set(fields) <= set(members[c]), (c, set(fields) - set(members[c]))
