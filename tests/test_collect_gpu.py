"""`pagecast collect` on a real GPU (marker `gpu`; skipped without a GPU, a CUDA
driver, cupti-python or CuPy: CI has none of them).

Each GPU workload is collected in full mode at two scales; a model fitted on
one predicts the other with recall >= 99% against the observed footprints. A
plain PyTorch MLP is collected with `--managed torch`; a collection killed
with SIGTERM halfway leaves a readable partial trace; a managed allocation past
the (lowered) limit is refused. With PAGECAST_DEVICE_REPORT set, each test
appends its measurements (JSON lines) there for scripts/device-check.sh; with
PAGECAST_DEVICE_TRACES set, a copy of each trace it collects goes into that folder.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from pagecast import procs

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ["jacobi2d", "spmv_cg", "mlp_train", "llm_decode"]
SCALES = (0.5, 1.0)


def _reason() -> str | None:
    try:
        from cupti import cupti  # noqa: F401
    except ImportError:
        return "needs cupti-python (pip install cupti-python)"
    try:
        from pagecast.collect import gpuinfo
        gpuinfo.probe(0)
    except Exception as e:  # noqa: BLE001 - NoGPUError or a driver failure
        return f"needs an NVIDIA GPU with a CUDA 13 driver ({str(e).splitlines()[0]})"
    try:
        import cupy  # noqa: F401
    except ImportError:
        return "needs CuPy (cupy-cuda13x)"
    return None


REASON = _reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=REASON or "")]


def _report(**row) -> None:
    path = os.environ.get("PAGECAST_DEVICE_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row, default=str) + "\n")


def _collect(out: Path, workload: list[str], *extra: str, timeout: float = 240, env=None):
    cmd = [sys.executable, "-m", "pagecast.cli", "collect", "-o", str(out), "--force", *extra, "--", *workload]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                       env={**os.environ, **(env or {})})
    keep = os.environ.get("PAGECAST_DEVICE_TRACES")
    if keep and out.is_dir():   # scripts/device-check.sh brings the traces back (tests/data/h200 came so)
        import shutil
        shutil.copytree(out, Path(keep) / out.name, dirs_exist_ok=True)
    return r, time.perf_counter() - t0


def _read(path):
    from pagecast import trace as T
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", T.TraceWarning)
        return T.read_trace(path)


def _check_trace(t, name: str) -> dict:
    from pagecast import trace as T
    L = t.launches
    n = t.n_launches
    assert n > 0, f"{name}: no launches"
    no_params = sum(1 for d in L.column(T.PARAM_DATA).to_pylist() if not d)
    assert no_params == 0, f"{name}: {no_params} launches without argument bytes"
    assert L.column(T.START_NS).null_count == 0, f"{name}: launches without a kernel record"
    assert t.faults.num_rows > 0, f"{name}: no GPU page faults recorded"
    managed = [k for k in t.allocations.column(T.KIND).to_pylist() if k == "managed"]
    assert managed, f"{name}: no managed allocations recorded"
    attributed = 1 - t.faults.column(T.LAUNCH_ID).null_count / t.faults.num_rows
    coll = t.manifest.get("collection", {})
    return {"launches": n, "faults": t.faults.num_rows, "migrations": t.migrations.num_rows,
            "allocations": t.allocations.num_rows, "faults_attributed": round(attributed, 4),
            "dropped": t.manifest.get("dropped_records"), "callback_us": coll.get("callback_us_per_launch"),
            "evict_sync_us": coll.get("evict_and_sync_us_per_launch"),
            "launches_without_args": coll.get("rows_launches_without_args"),
            "launches_without_kernel_record": coll.get("rows_launches_without_kernel_record"),
            "kernel_name_mismatches": coll.get("rows_kernel_name_mismatches"),
            "unattributed_faults": coll.get("rows_unattributed_faults"),
            "runtime_reaches_driver": coll.get("runtime_reaches_driver"),
            "hook_errors": coll.get("hook_errors"), "hook_last_error": coll.get("hook_last_error"),
            "kernel_names": sorted(set(L.column(T.KERNEL).to_pylist()))[:12]}


# ---- the CUPTI / driver facts the collector relies on, observed directly --------------
# Written without a GPU; each fact below was read from cupti-python 13.4 / cuda-bindings 13
# (see the collector docs) and is checked here first, in one short process, so the answers
# reach the device report even if a longer test below runs out of time.

PROBE = r'''
import ctypes, json, sys, time
obs = {"errors": {}}
def fatal(msg):                               # the observations so far still reach the report
    obs["fatal"] = msg
    print("PROBE " + json.dumps(obs, default=str))
    sys.exit(1)
def note(key, fn):
    try:
        obs[key] = fn()
    except Exception as e:  # noqa: BLE001
        obs["errors"][key] = f"{type(e).__name__}: {e}"
from cupti import cupti
from cuda.bindings import driver as drv
from pagecast.collect import convert as C
from pagecast.collect import launch_hook as lh
from pagecast.collect.activity import CuptiActivitySource

recs = []
src = CuptiActivitySource(device=0)
src.start(recs.extend)                      # before any context, as `pagecast collect` does
obs["uvm_counters"] = src.info.get("uvm_counters")
obs["uvm_counters_enabled"] = src.info.get("uvm_counters_enabled")
obs["uvm_counters_refused"] = src.info.get("uvm_counters_refused")
calls, got = [], []
hook = lh.LaunchHook(got.append)
real = hook._callback
def spy(userdata, domain, cbid, cbdata):
    calls.append([int(domain), int(cbid), int(cbdata.callback_site), type(cbdata).__name__,
                  int(cbdata.correlation_id), type(domain).__name__])
    real(userdata, domain, cbid, cbdata)
hook._callback = spy                         # start() subscribes self._callback
hook.start()
drv.cuInit(0)
err, dev = drv.cuDeviceGet(0)
err, ctx = drv.cuDevicePrimaryCtxRetain(dev)
drv.cuCtxSetCurrent(ctx)

sys.path.insert(0, "tests")
import probe_kernel                          # an sm_90 cubin: a 13.0 driver's JIT refuses NVRTC 13.5's PTX 9.5
from cuda.bindings import nvrtc
image = probe_kernel.cubin(nvrtc)
obs["nvrtc"] = [int(x) for x in nvrtc.nvrtcVersion()[1:]]

N = 1 << 18
err, buf = drv.cuMemAllocManaged(N * 4, 1)   # CU_MEM_ATTACH_GLOBAL; fresh pages: the GPU's first touch faults
obs["managed"] = [int(buf), N * 4]

def launch(f, label):
    a, nn, s = ctypes.c_uint64(int(buf)), ctypes.c_int(N), ctypes.c_double(0.5)
    arr = (ctypes.c_void_p * 3)(ctypes.addressof(a), ctypes.addressof(nn), ctypes.addressof(s))
    t0 = int(cupti.get_timestamp())
    err, = drv.cuLaunchKernel(f, N // 256, 1, 1, 256, 1, 1, 0, 0, ctypes.addressof(arr), 0)
    drv.cuCtxSynchronize()
    t1 = int(cupti.get_timestamp())
    obs[label] = {"launch_err": int(err), "t0": t0, "t1": t1,
                  "expect_params": (bytes(a) + bytes(nn) + b"\0" * 4 + bytes(s)).hex()}

err, mod = drv.cuModuleLoadData(image)
obs["cuModuleLoadData"] = int(err)
if int(err) != 0:
    fatal(f"cuModuleLoadData refused the probe's cubin: {err}")
err, fn = drv.cuModuleGetFunction(mod, b"k")
note("cuFuncGetParamCount(CUfunction)", lambda: [int(x) for x in drv.cuFuncGetParamCount(fn)])   # CUDA 13.2+
note("layout(CUfunction)", lambda: [list(x) for x in lh._driver_layout(int(fn))])
note("cuFuncIsLoaded before launch", lambda: [int(x) for x in drv.cuFuncIsLoaded(fn)])
launch(fn, "function")
err, lib = drv.cuLibraryLoadData(image, None, None, 0, None, None, 0)
obs["cuLibraryLoadData"] = int(err)
if int(err) != 0:
    fatal(f"cuLibraryLoadData refused the probe's cubin: {err}")
err, kern = drv.cuLibraryGetKernel(lib, b"k")
obs["kernel_handle"] = int(kern)
as_fn = drv.CUfunction(int(kern))            # a CUkernel passed where a CUfunction goes
note("cuFuncGetParamCount(CUkernel cast)", lambda: [int(x) for x in drv.cuFuncGetParamCount(as_fn)])
note("cuFuncGetParamInfo(CUkernel cast, 1)", lambda: [int(x) for x in drv.cuFuncGetParamInfo(as_fn, 1)])
note("cuKernelGetParamCount(CUkernel)", lambda: [int(x) for x in drv.cuKernelGetParamCount(kern)])   # CUDA 13.2+
note("layout(CUkernel)", lambda: [list(x) for x in lh._driver_layout(int(kern))])
note("cuFuncGetName(CUkernel cast)", lambda: [str(x) for x in drv.cuFuncGetName(as_fn)])
# full mode's order before a launch: evict to the host, synchronize, read index values (on the
# host); the kernel must still fault on the pages read (collect/cuda_device.py)
from pagecast.collect.cuda_device import CudaDevice
cdev = CudaDevice(0)
obs["evict_failed"] = cdev.evict([(int(buf), N * 4)])
cdev.synchronize()
obs["host_read"] = cdev.read(int(buf), 16).hex()
launch(as_fn, "cukernel")

try:
    import torch                              # PyTorch launches through the runtime API
    x = torch.ones(1 << 16, device="cuda")
    n0 = len(calls)
    y = x * 2
    torch.cuda.synchronize()
    obs["torch_calls"] = calls[n0:n0 + 8]
except Exception as e:  # noqa: BLE001
    obs["errors"]["torch"] = f"{type(e).__name__}: {e}"

hook.stop()
src.flush(True)
obs["dropped"] = src.dropped()
src.stop()
obs["hook"] = {"launches": hook.launches, "errors": hook.errors, "last_error": hook.last_error,
               "runtime_reaches_driver": hook.runtime_reaches_driver}
obs["calls"] = calls[:6]
obs["decoded"] = [{"kernel": a.kernel, "function": a.function, "params": a.param_data.hex(),
                   "offsets": list(a.param_offsets), "sizes": list(a.param_sizes), "corr": a.correlation_ids,
                   "host_ns": a.host_ns, "cbid": a.cbid, "domain": a.domain, "stream_id": a.stream_id} for a in got]
obs["kernels"] = [[r.name, r.start, r.end, r.correlation_id, r.stream_id] for r in recs if isinstance(r, C.KernelRec)]
um = [r for r in recs if isinstance(r, C.UMRec)]
obs["um_kinds"] = sorted({r.counter_kind for r in um})
faults = [r for r in um if r.counter_kind == C.UM_GPU_PAGE_FAULT]
lo_k, hi_k = obs["cukernel"]["t0"], obs["cukernel"]["t1"]
obs["faults_after_host_read"] = sum(1 for r in faults if lo_k <= r.start <= hi_k
                                    and int(buf) <= r.address < int(buf) + N * 4)
obs["faults"] = {"n": len(faults), "value_sum": sum(r.value for r in faults),
                 "flags": sorted({r.flags for r in faults}), "src_ids": sorted({r.src_id for r in faults}),
                 "dst_ids": sorted({r.dst_id for r in faults}),
                 "in_buffer": sum(1 for r in faults if int(buf) <= r.address < int(buf) + N * 4),
                 "starts": [r.start for r in faults[:3]], "ends": [r.end for r in faults[:3]]}
mems = [r for r in recs if isinstance(r, C.MemRec)]
obs["memory2"] = [[r.address, r.bytes, r.memory_kind, r.op, r.correlation_id] for r in mems[:4]]
print("PROBE " + json.dumps(obs, default=str))
'''


def test_cupti_facts_the_collector_relies_on(tmp_path):
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=150, cwd=ROOT)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("PROBE ")]
    obs = json.loads(line[-1][6:]) if line else {}
    _report(test="collect-cupti-facts", exit_code=r.returncode, obs=obs, stderr=r.stderr[-1500:])
    print(json.dumps(obs, indent=1)[:6000])
    assert r.returncode == 0 and obs, (obs.get("fatal"), r.stderr[-3000:])
    # the parameter layout from the driver, with or without the count functions (CUDA 13.2+)
    assert obs.get("layout(CUfunction)") == [[0, 8, 16], [8, 4, 8]], obs["errors"]
    assert obs.get("layout(CUkernel)") == [[0, 8, 16], [8, 4, 8]], obs["errors"]
    # the callback: (userdata, domain, cbid, CallbackData), API enter 0 then exit 1
    assert obs["calls"] and all(c[3] == "CallbackData" for c in obs["calls"]), obs["calls"]
    assert {c[2] for c in obs["calls"]} == {0, 1}, obs["calls"]
    assert obs["hook"]["errors"] == 0, obs["hook"]
    dec = {d["function"]: d for d in obs["decoded"]}
    # a CUfunction launch and a CUkernel-as-CUfunction launch both decode to the bytes passed
    for label in ("function", "cukernel"):
        assert obs[label]["launch_err"] == 0, obs[label]
    by_params = [d for d in obs["decoded"] if d["params"] == obs["function"]["expect_params"]]
    assert len(by_params) >= 2, (obs["decoded"], obs["errors"])
    assert all(d["offsets"] == [0, 8, 16] and d["sizes"] == [8, 4, 8] for d in by_params), by_params
    assert obs["kernel_handle"] in dec, "the CUkernel launch was not decoded"
    # one clock: host timestamps bracket the kernel records and the faults
    lo, hi = obs["function"]["t0"], obs["cukernel"]["t1"]
    ours = [k for k in obs["kernels"] if k[0] == "k"]
    assert len(ours) == 2 and all(lo <= k[1] <= k[2] <= hi for k in ours), (lo, hi, obs["kernels"])
    if obs["uvm_counters"]:
        assert obs["evict_failed"] == 0 and obs["faults_after_host_read"] > 0, obs   # item: values read on the host
        f = obs["faults"]
        assert f["n"] > 0 and f["in_buffer"] > 0, f
        assert all(lo <= s <= hi for s in f["starts"]), (lo, hi, f)
        assert set(f["flags"]) <= {0, 1, 2, 3, 4} and f["src_ids"] == [0], f
    # correlation: each decoded launch's id is its kernel record's
    kcorr = {k[3] for k in obs["kernels"]}
    assert all(set(d["corr"]) & kcorr for d in obs["decoded"] if d["domain"] == 1), (obs["decoded"], kcorr)


@pytest.mark.parametrize("name", WORKLOADS)
def test_collect_fit_on_one_scale_predicts_the_other(tmp_path, name):
    from pagecast.predict.evaluate import evaluate
    from pagecast.predict.fit import fit_model

    traces, info = [], {}
    for s in SCALES:
        out = tmp_path / f"{name}-{s}.pctrace"
        r, wall = _collect(out, ["python", "-m", f"pagecast.datasets.gpu.{name}", "--scale", str(s)])
        assert r.returncode == 0, f"{name} --scale {s}: exit {r.returncode}\n{r.stderr[-3000:]}"
        t = _read(out)
        assert t.complete and t.mode == "full"
        info[s] = {**_check_trace(t, name), "wall_s": round(wall, 2)}
        assert info[s]["faults_attributed"] > 0.9, info[s]
        traces.append(t)
    model = fit_model([traces[0]])
    ev = evaluate(model, traces[1])
    o = ev["overall"]
    _report(test="collect-fit-evaluate", workload=name, fit_scale=SCALES[0], eval_scale=SCALES[1],
            recall=o["recall"], precision=o["precision"], footprint_bytes=o["footprint_bytes"],
            traces={str(k): v for k, v in info.items()},
            worst_kernels=[(k["kernel"], round(k["recall"], 4)) for k in sorted(ev["kernels"],
                                                                                 key=lambda k: k["recall"])[:3]])
    assert o["recall"] >= 0.99, f"{name}: recall {o['recall']:.4f} < 0.99; kernels: {ev['kernels'][:5]}"


def test_collect_pytorch_mlp_with_managed_torch(tmp_path):
    pytest.importorskip("torch", reason="needs PyTorch")
    out = tmp_path / "torch.pctrace"
    r, wall = _collect(out, ["python", "-m", "pagecast.datasets.gpu.torch_mlp", "--scale", "1"], "--managed", "torch")
    assert r.returncode == 0, r.stderr[-3000:]
    t = _read(out)
    row = {**_check_trace(t, "torch_mlp"), "wall_s": round(wall, 2), "allocator": t.manifest.get("allocator")}
    _report(test="collect-managed-torch", **row)
    assert "CUDAPluggableAllocator" in " ".join(t.manifest["allocator"])


def test_collect_natural_mode_and_overhead(tmp_path):
    name = "jacobi2d"
    cmd = [sys.executable, "-m", f"pagecast.datasets.gpu.{name}", "--scale", "1"]
    subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT, check=True)  # warm the kernel cache
    t0 = time.perf_counter()
    subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT, check=True)
    plain = time.perf_counter() - t0
    out = tmp_path / "natural.pctrace"
    r, wall = _collect(out, ["python", "-m", f"pagecast.datasets.gpu.{name}", "--scale", "1"], "--mode", "natural")
    assert r.returncode == 0, r.stderr[-3000:]
    t = _read(out)
    assert t.mode == "natural" and t.n_launches > 0 and t.faults.num_rows > 0
    line = [ln for ln in r.stderr.splitlines() if "collection overhead" in ln]
    _report(test="collect-overhead", workload=name, plain_wall_s=round(plain, 3), natural_wall_s=round(wall, 3),
            launches=t.n_launches, per_launch_wall_us=round(1e6 * (wall - plain) / t.n_launches, 1),
            tool_line=line[0] if line else None)
    assert line, r.stderr[-2000:]


LOOP = r"""
import sys, time, numpy as np, cupy as cp
cp.cuda.set_allocator(cp.cuda.malloc_managed)
k = cp.RawKernel(r'''extern "C" __global__ void touch(float* a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) a[i] += 1.0f; }''', "touch")
a = cp.empty(1 << 22, dtype=cp.float32)
i = 0
while True:
    n = (1 << 18) * (1 + i % 8)
    k(((n + 255) // 256,), (256,), (a, np.int32(n)))
    i += 1
    if i == 50:
        print("ready", flush=True)
    if i > 200000:
        break
"""


def sigterm_halfway(cmd: list[str], err_path: Path, env=None, ready_s: float = 120, settle_s: float = 3,
                    exit_s: float = 120) -> tuple[int | None, str]:
    """Start `cmd` (a collection whose workload prints "ready"), SIGTERM it `settle_s` after that
    line, wait for it; (exit code, stderr). Whatever happens (no "ready" within `ready_s`, a hang
    after the signal), the command's whole process group is stopped before this returns or raises:
    a collector left running would hold the GPU."""
    with open(err_path, "w") as errf:      # stderr to a file: a full pipe cannot stall the collector
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=errf, text=True, env=env,
                             **procs.OWN_GROUP)
        try:
            line = procs.read_line(p.stdout, ready_s)
            assert line is not None, f"no 'ready' line within {ready_s:g} s"
            assert line.strip() == "ready", line
            time.sleep(settle_s)  # let some parts close
            p.send_signal(signal.SIGTERM)
            p.communicate(timeout=exit_s)
        finally:
            procs.stop_group(p, grace_s=2)
    return p.returncode, err_path.read_text()


def test_sigterm_halfway_leaves_a_readable_partial_trace(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    out = tmp_path / "term.pctrace"
    code, err = sigterm_halfway([sys.executable, "-m", "pagecast.cli", "collect", "-o", str(out), "--",
                                 "python", str(script)], tmp_path / "collect.err",
                                env={**os.environ, "PAGECAST_PART_SECONDS": "1"})
    assert code == 128 + signal.SIGTERM, err[-2000:]
    t = _read(out)
    assert not t.complete and t.n_launches >= 50
    params = t.launches.column("param_data").to_pylist()
    assert all(len(d) >= 12 for d in params)
    _report(test="collect-sigterm", exit_code=code, launches=t.n_launches, faults=t.faults.num_rows,
            complete=t.complete)


def test_managed_allocation_past_the_limit_is_refused(tmp_path):
    script = tmp_path / "big.py"
    script.write_text("import cupy as cp, time\n"
                      "x = cp.cuda.malloc_managed(64 << 20)\n"      # past the 32 MiB limit below; never touched
                      "for _ in range(300):\n    time.sleep(0.01)\n"
                      "print('not stopped')\n")
    r, _ = _collect(tmp_path / "big.pctrace", ["python", str(script)], env={"PAGECAST_MANAGED_LIMIT": "32MiB"})
    _report(test="collect-refuse-oversubscription", exit_code=r.returncode,
            message=[ln for ln in r.stderr.splitlines() if "error" in ln][:1])
    assert r.returncode == 2, r.stderr[-2000:]
    assert "past the managed limit" in r.stderr and "not stopped" not in r.stdout


def test_full_mode_records_index_values_and_their_cost(tmp_path):
    """The values table from a real full-mode collection (collect/values_copy.py): rows inside
    managed allocations live at their launch, no failed copy, and the copies' cost reported."""
    from pagecast import values as V

    out = tmp_path / "spmv-values.pctrace"
    r, wall = _collect(out, ["python", "-m", "pagecast.datasets.gpu.spmv_cg", "--scale", "0.5"])
    assert r.returncode == 0, r.stderr[-3000:]
    t = _read(out)
    coll = t.manifest.get("collection", {})
    v = t.values
    im = V.image(t)
    _report(test="collect-values", workload="spmv_cg", rows=v.num_rows if v is not None else 0,
            copies=coll.get("values_copies"), bytes=coll.get("values_bytes"),
            copy_us_per_launch=coll.get("values_copy_us_per_launch"),
            evict_sync_us=coll.get("evict_and_sync_us_per_launch"), late=coll.get("values_late"),
            errors=coll.get("values_errors"), last_error=coll.get("values_last_error"),
            manifest_values=t.manifest.get("values"), image_report=im.report, wall_s=round(wall, 2))
    assert v is not None and v.num_rows > 0
    assert coll["values_errors"] == 0, coll.get("values_last_error")
    assert im.report == {"clipped_to_allocation": 0, "outside_allocation": 0}
