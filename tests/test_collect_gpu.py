"""`pagecast collect` on a real GPU (marker `gpu`; skipped without a GPU, a CUDA
driver, cupti-python or CuPy: CI has none of them).

Each GPU workload is collected in full mode at two scales; a model fitted on
one predicts the other with recall >= 99% against the observed footprints. A
plain PyTorch MLP is collected with `--managed torch`; a collection killed
with SIGTERM halfway leaves a readable partial trace; a managed allocation past
the (lowered) limit is refused. With PAGECAST_DEVICE_REPORT set, each test
appends its measurements (JSON lines) there for scripts/device-check.sh.
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


def test_sigterm_halfway_leaves_a_readable_partial_trace(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    out = tmp_path / "term.pctrace"
    p = subprocess.Popen([sys.executable, "-m", "pagecast.cli", "collect", "-o", str(out), "--", "python", str(script)],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PAGECAST_PART_SECONDS": "1"})
    assert p.stdout.readline().strip() == "ready"
    time.sleep(3)  # let some parts close
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 128 + signal.SIGTERM, err[-2000:]
    t = _read(out)
    assert not t.complete and t.n_launches >= 50
    params = t.launches.column("param_data").to_pylist()
    assert all(len(d) >= 12 for d in params)
    _report(test="collect-sigterm", exit_code=p.returncode, launches=t.n_launches, faults=t.faults.num_rows,
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
    assert "past the GPU's free memory" in r.stderr and "not stopped" not in r.stdout
