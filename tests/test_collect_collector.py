"""The collector end to end on the CPU: stand-in CUPTI source, device and launch
callbacks driving the real Collector (hook, tracker, row builder, writer,
signals), the crash paths in a killed subprocess, the command without a GPU,
the workload command line, and the PyTorch allocator shim."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from pagecast import trace as T
from pagecast.cli import main as cli_main
from pagecast.collect import managed as M
from pagecast.collect.target import Workload, make_target, parse_workload
from pagecast.errors import InputError, UsageError
from pagecast.footprints import observed_footprints

import collect_standin as S

HERE = Path(__file__).resolve().parent
PAGE = S.PAGE
pytest.importorskip("cupti.cupti", reason="cupti-python is not installed (pip install .[test])")


_read = S.read_quiet


def _params(t):
    out = []
    for data in t.launches.column(T.PARAM_DATA).to_pylist():
        out.append(struct.unpack("<QQi", data[:20]))
    return out


def test_full_mode_collection_end_to_end(tmp_path):
    c, gpu = S.make_collector(tmp_path / "t.pctrace", mode="full")
    ns = [1024, 4096, 2048, 8192, 1024]

    def workload():
        x = gpu.malloc_managed(64 * PAGE)
        y = gpu.malloc_managed(64 * PAGE)
        for n in ns:
            gpu.saxpy(x, y, n)
        gpu.free(x)
        z = gpu.malloc_managed(4 * PAGE)
        gpu.saxpy(z, y, 256)

    assert c.run(workload) == 0
    t = _read(tmp_path / "t.pctrace")
    assert t.complete and t.mode == "full" and t.n_launches == 6
    assert t.launches.column(T.LAUNCH_ID).to_pylist() == list(range(6))
    assert t.launches.column(T.KERNEL).to_pylist() == ["_Z5saxpyPfS_i"] * 6
    p = _params(t)
    x, y = p[0][0], p[0][1]
    assert [q[2] for q in p] == ns + [256]
    assert t.launches.column(T.GRID_X).to_pylist() == [(n + 255) // 256 for n in ns] + [1]
    assert None not in t.launches.column(T.START_NS).to_pylist()
    # every fault and coherence migration is attributed to the launch that caused it
    assert t.faults.column(T.LAUNCH_ID).null_count == 0
    fp = observed_footprints(t)
    for i, n in enumerate(ns):
        pages = set(fp.pages(i).tolist())
        want = {(x + o) // PAGE for o in range(0, 4 * n, PAGE)} | {(y + o) // PAGE for o in range(0, 4 * n, PAGE)}
        assert pages == want
    # full mode: live managed memory evicted before every launch, kernels serialized
    dev = c.device
    assert len(dev.evicted) == 6
    assert dev.evicted[0] == sorted([(x, 64 * PAGE), (y, 64 * PAGE)])
    assert (x, 64 * PAGE) not in dev.evicted[5] and len(dev.evicted[5]) == 2  # x freed, z allocated
    assert dev.syncs >= 3 * 6
    # allocations with their live launch ranges
    a = t.allocations.sort_by(T.ALLOC_ID)
    assert a.column(T.ADDRESS).to_pylist()[:2] == [x, y]
    assert a.column(T.FIRST_LAUNCH).to_pylist() == [0, 0, 5]
    assert a.column(T.LAST_LAUNCH).to_pylist() == [4, None, None]
    m = t.manifest
    assert m["workload_exit_code"] == 0 and m["dropped_records"] == 0
    assert m["collection"]["launches_hooked"] == 6 and m["collection"]["hook_errors"] == 0
    assert m["collection"]["rows_kernel_name_mismatches"] == 0
    assert "uvm_events" in [p.name for p in (tmp_path / "t.pctrace").iterdir()]
    assert "collection overhead: 6 launches" in c.overhead_line()


def test_natural_mode_adds_nothing_and_leaves_attribution_to_readers(tmp_path):
    c, gpu = S.make_collector(tmp_path / "n.pctrace", mode="natural")

    def workload():
        x = gpu.malloc_managed(16 * PAGE)
        y = gpu.malloc_managed(16 * PAGE)
        for n in (1024, 2048):
            gpu.saxpy(x, y, n)

    assert c.run(workload) == 0
    t = _read(tmp_path / "n.pctrace")
    assert t.mode == "natural" and t.n_launches == 2
    assert c.device.evicted == [] and c.device.syncs == 1  # only the final synchronize
    assert t.faults.column(T.LAUNCH_ID).null_count == t.faults.num_rows > 0
    fp = observed_footprints(t)  # readers attribute by the kernels' [start, end]
    assert fp.pages_per_launch().tolist() == [2, 4]


def test_workload_failures_pass_their_exit_codes_and_mark_the_trace_incomplete(tmp_path, capsys):
    for i, (exc, code) in enumerate(((ValueError("boom"), 1), (SystemExit(3), 3), (SystemExit(0), 0))):
        c, gpu = S.make_collector(tmp_path / f"e{i}.pctrace")

        def workload(exc=exc):
            x = gpu.malloc_managed(4 * PAGE)
            gpu.saxpy(x, x, 256)
            raise exc

        assert c.run(workload) == code
        t = _read(tmp_path / f"e{i}.pctrace")
        assert t.complete is (code == 0) and t.n_launches == 1 and t.manifest["workload_exit_code"] == code
    assert "ValueError: boom" in capsys.readouterr().err  # the workload's own traceback


def test_managed_allocation_past_the_budget_stops_the_workload(tmp_path):
    c, gpu = S.make_collector(tmp_path / "b.pctrace", limit=100 * PAGE)
    reached = []

    def workload():
        x = gpu.malloc_managed(64 * PAGE)
        gpu.saxpy(x, x, 256)
        gpu.malloc_managed(64 * PAGE)  # 128 pages live > 100: refused
        for _ in range(500):  # the refusal reaches the workload once the callback has returned
            time.sleep(0.01)
            reached.append(1)

    assert c.run(workload) == 2
    assert len(reached) < 100
    assert "past the managed limit" in c.failure and "--allow-oversubscription" in c.failure
    t = _read(tmp_path / "b.pctrace")
    assert not t.complete and t.n_launches == 1
    with pytest.raises(M.OversubscriptionError):
        M.ManagedBudget(10).check(11)
    M.ManagedBudget(None).check(1 << 60)  # --allow-oversubscription


def test_dropped_records_are_counted_and_warned(tmp_path, capsys):
    c, gpu = S.make_collector(tmp_path / "d.pctrace", dropped=17)
    assert c.run(lambda: gpu.saxpy(gpu.malloc_managed(PAGE), 0x10, 1)) == 0
    assert _read(tmp_path / "d.pctrace").manifest["dropped_records"] == 17
    assert "dropped 17 activity records" in capsys.readouterr().err


def test_evictions_the_device_refused_are_counted_and_warned(tmp_path, capsys):
    # a launch after a refused eviction can find its pages resident and show less than it touched
    # (on an H200, launches re-reading data showed no records at all): the trace says how many failed
    c, gpu = S.make_collector(tmp_path / "e.pctrace")

    def refuse(ranges):
        c.device.evicted.append(list(ranges))
        c.device.errors = getattr(c.device, "errors", 0) + len(ranges)
        c.device.last_error = "cuMemPrefetchAsync to host: CUDA_ERROR_INVALID_VALUE"
        return len(ranges)

    c.device.evict = refuse
    assert c.run(lambda: gpu.saxpy(gpu.malloc_managed(PAGE), 0x10, 1)) == 0
    info = _read(tmp_path / "e.pctrace").manifest["collection"]
    assert info["device_errors"] >= 1 and "INVALID_VALUE" in info["device_last_error"]
    assert "device calls failed" in capsys.readouterr().err


def _start_collecting(out: Path, mode: str = "full", *extra: str):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), str(HERE)]))
    p = subprocess.Popen([sys.executable, str(HERE / "collect_standin.py"), str(out), "--mode", mode, *extra],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert p.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # wait until some launch parts were closed
        parts = list((out / T.LAUNCHES).glob("part-*.parquet")) if (out / T.LAUNCHES).exists() else []
        fparts = list((out / T.FAULTS).glob("part-*.parquet")) if (out / T.FAULTS).exists() else []
        if len(parts) >= 2 and fparts:
            return p
        time.sleep(0.05)
    p.kill()
    raise AssertionError("the collecting subprocess closed no parts")


def _check_partial(out: Path) -> T.Trace:
    m = json.loads((out / T.MANIFEST).read_text())
    assert m["complete"] is False
    t = _read(out)  # validates: dense launch ids, schemas, allocations
    assert t.n_launches > 0 and not t.complete
    p = _params(t)
    assert all(q[2] in [1024 * k for k in range(1, 9)] for q in p)
    lids = t.faults.column(T.LAUNCH_ID).to_numpy(zero_copy_only=False)
    assert t.faults.num_rows > 0 and not np.isnan(lids.astype(float)).all()
    return t


def test_sigterm_flushes_and_writes_an_incomplete_trace(tmp_path):
    out = tmp_path / "term.pctrace"
    p = _start_collecting(out)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 128 + signal.SIGTERM, err
    assert "interrupted by SIGTERM" in err
    t = _check_partial(out)
    m = t.manifest
    assert m["workload_exit_code"] == 143 and m["collection"]["running"] is False
    # the flush path released everything: every hooked launch is in the trace,
    # allocations are there (never freed: last_launch null)
    assert t.n_launches == m["collection"]["launches_hooked"]
    assert t.allocations.num_rows == 2 and t.allocations.column(T.LAST_LAUNCH).null_count == 2
    # the kernel records arrived (the final flush delivered them); only a launch the
    # signal cut short between its callback and its kernel record may lack times
    assert t.launches.column(T.START_NS).null_count <= 1


def test_sigterm_stops_a_workload_that_spends_its_time_inside_launch_callbacks(tmp_path):
    # Full mode: the launching thread waits (synchronizes) inside the CUPTI callback almost all
    # the time, where the signal's exception may not be raised; it must still stop promptly.
    out = tmp_path / "busy.pctrace"
    p = _start_collecting(out, "full", "--sync-ms", "20")
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 128 + signal.SIGTERM, err
    assert time.monotonic() - t0 < 5
    t = _check_partial(out)
    assert t.manifest["workload_exit_code"] == 143 and "interrupted by SIGTERM" in err


def test_sigkill_after_parts_leaves_a_readable_partial_trace(tmp_path):
    out = tmp_path / "kill.pctrace"
    p = _start_collecting(out)
    p.kill()
    p.communicate(timeout=30)
    assert p.returncode == -signal.SIGKILL
    t = _check_partial(out)
    assert t.manifest["collection"]["running"] is True  # a snapshot from the last closed part


# ---- the command ----------------------------------------------------------------

def _driver_present() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


@pytest.mark.skipif(_driver_present(), reason="a CUDA driver is present here: this tests the machine without one")
def test_collect_without_a_gpu_is_one_line_exit_2(tmp_path, capsys):
    script = tmp_path / "w.py"
    script.write_text("print('never runs')\n")
    code = cli_main(["collect", "-o", str(tmp_path / "o.pctrace"), "--", "python", str(script)])
    err = capsys.readouterr()
    assert code == 2
    assert len(err.err.strip().splitlines()) == 1 and "GPU" in err.err
    assert "never runs" not in err.out and not (tmp_path / "o.pctrace").exists()


def test_collect_bad_input_is_one_line_exit_2(tmp_path, capsys):
    script = tmp_path / "w.py"
    script.write_text("pass\n")
    (tmp_path / "exists.pctrace").mkdir()
    cases = [["collect"], ["collect", "--", "python", str(tmp_path / "missing.py")],
             ["collect", "--managed", "jax", "--", "python", str(script)],
             ["collect", "--mode", "fast", "--", "python", str(script)],
             ["collect", "-o", str(tmp_path / "exists.pctrace"), "--", "python", str(script)]]
    for argv in cases:
        assert cli_main(argv) == 2, argv
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, (argv, err)


def test_workload_command_lines(tmp_path, monkeypatch):
    s = tmp_path / "train.py"
    s.write_text("import sys\nRESULT.append(list(sys.argv))\n")
    assert parse_workload(["--", "python", str(s), "--epochs", "2"]) == \
        Workload("script", str(s), ["--epochs", "2"], ["python", str(s), "--epochs", "2"])
    assert parse_workload(["python3.12", "-u", "-m", "pkg.mod", "a"]).target == "pkg.mod"
    assert parse_workload(["-m", "pkg.mod"]).kind == "module"
    assert parse_workload([str(s)]).name == "train"
    for bad in ([], ["python"], ["python", "-m"], ["python", "-c", "print(1)"]):
        with pytest.raises(UsageError):
            parse_workload(bad)
    with pytest.raises(InputError):
        parse_workload(["python", str(tmp_path / "nope.py")])
    # it runs in this process as __main__, with its own argv
    import builtins
    monkeypatch.setattr(builtins, "RESULT", [], raising=False)
    make_target(parse_workload(["python", str(s), "x"]))()
    assert builtins.RESULT == [[str(s), "x"]]
    (tmp_path / "wlpkg").mkdir()
    (tmp_path / "wlpkg" / "__init__.py").write_text("")
    (tmp_path / "wlpkg" / "job.py").write_text("import sys\nRESULT.append(['mod', __name__] + sys.argv[1:])\n")
    monkeypatch.chdir(tmp_path)
    make_target(parse_workload(["python", "-m", "wlpkg.job", "y"]))()
    assert builtins.RESULT[-1] == ["mod", "__main__", "y"]


# ---- the PyTorch allocator shim, against a stand-in driver library ----------------

_FAKE_DRIVER = r"""
#include <stdlib.h>
int cuMemAllocManaged(unsigned long long *p, size_t n, unsigned int flags) {
    if (flags != 1) return 1; void *q = malloc(n); if (!q) return 2; *p = (unsigned long long)q; return 0; }
int cuMemFree_v2(unsigned long long p) { free((void *)p); return 0; }
"""


@pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler on this machine")
def test_torch_allocator_shim_allocates_managed_and_refuses_past_the_limit(tmp_path, monkeypatch):
    so = M.build_shim(tmp_path / "cache")
    assert M.build_shim(tmp_path / "cache") == so  # cached
    src = tmp_path / "fakecuda.c"
    src.write_text(_FAKE_DRIVER)
    fake = tmp_path / "libfakecuda.so"
    subprocess.run([shutil.which("cc") or "gcc", "-shared", "-fPIC", "-o", str(fake), str(src)], check=True)
    monkeypatch.setenv("PAGECAST_SHIM_DRIVER", str(fake))
    lib = ctypes.CDLL(str(so))
    lib.pagecast_malloc.restype = ctypes.c_void_p
    lib.pagecast_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.pagecast_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.pagecast_set_limit.argtypes = [ctypes.c_longlong]
    lib.pagecast_live_bytes.restype = ctypes.c_longlong
    lib.pagecast_refused.restype = ctypes.c_longlong
    lib.pagecast_set_limit(1 << 20)
    a = lib.pagecast_malloc(600_000, 0, None)
    assert a and lib.pagecast_live_bytes() == 600_000
    ctypes.memset(a, 7, 600_000)  # really memory
    assert lib.pagecast_malloc(600_000, 0, None) is None  # would pass 1 MiB: refused
    assert lib.pagecast_refused() == 1
    lib.pagecast_free(a, 600_000, 0, None)
    assert lib.pagecast_live_bytes() == 0
    b = lib.pagecast_malloc(600_000, 0, None)
    assert b
    lib.pagecast_free(b, 600_000, 0, None)


@pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler on this machine")
def test_torch_shim_refusal_reaches_the_collector(tmp_path, monkeypatch):
    # PyTorch's CUDAPluggableAllocator::allocate wraps whatever alloc_fn returns in a
    # DataPtr without checking it, so returning NULL does not raise anything in the
    # workload: the shim must report the refusal itself (budget.refuse -> on_violation).
    so = M.build_shim(tmp_path / "cache")
    src = tmp_path / "fakecuda.c"
    src.write_text(_FAKE_DRIVER)
    fake = tmp_path / "libfakecuda.so"
    subprocess.run([shutil.which("cc") or "gcc", "-shared", "-fPIC", "-o", str(fake), str(src)], check=True)
    monkeypatch.setenv("PAGECAST_SHIM_DRIVER", str(fake))
    budget = M.ManagedBudget(1 << 20)
    reported: list[str] = []
    M.ManagedTracker(budget, on_violation=reported.append)  # what the Collector builds
    lib = M.load_shim(so, budget)
    lib.pagecast_malloc.restype = ctypes.c_void_p
    lib.pagecast_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.pagecast_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    a = lib.pagecast_malloc(600_000, 0, None)
    assert a and not reported and budget.violation is None
    assert lib.pagecast_malloc(600_000, 0, None) is None
    assert len(reported) == 1 and budget.violation == reported[0]
    assert "past the managed limit" in reported[0] and "1.1 MiB" in reported[0]  # the shim's live bytes
    lib.pagecast_free(a, 600_000, 0, None)


def test_parse_managed():
    assert M.parse_managed("cupy, torch,cupy") == ["cupy", "torch"]
    assert M.parse_managed(None) == []
    with pytest.raises(UsageError):
        M.parse_managed("jax")


def test_signals_landing_inside_a_cupti_callback_are_deferred(tmp_path):
    from types import SimpleNamespace

    from pagecast.collect.collector import Terminated

    c, gpu = S.make_collector(tmp_path / "s.pctrace")
    seen = {}

    def probe(site, cbdata):  # runs inside LaunchHook._callback, as CUPTI would call it from C
        try:
            c._signal(signal.SIGTERM, sys._getframe())
            seen["raised"] = False
        except Terminated:
            seen["raised"] = True

    c.hook.api_callbacks[(1, 9999)] = probe
    c.hook._callback(None, 1, 9999, SimpleNamespace(callback_site=0, correlation_id=1))
    assert seen == {"raised": False} and c._deferred == signal.SIGTERM
    with pytest.raises(Terminated):  # in the workload's own code it is raised at once
        c._signal(signal.SIGTERM, sys._getframe())


def test_driver_prefetch_setting_is_read_where_readable(tmp_path):
    from pagecast.collect import gpuinfo

    p = tmp_path / "uvm_perf_prefetch_enable"
    for text, want in (("1\n", True), ("0\n", False), ("Y", True), ("N", False), ("maybe", None)):
        p.write_text(text)
        assert gpuinfo.driver_prefetch(p) is want
    assert gpuinfo.driver_prefetch(tmp_path / "missing") is None


def test_collected_traces_feed_the_predictor(tmp_path):
    """A model fitted on one collected run predicts another run's footprints (the seam to fit)."""
    from pagecast.predict.evaluate import evaluate
    from pagecast.predict.fit import fit_model

    def run(name, ns):
        c, gpu = S.make_collector(tmp_path / name)

        def workload():
            x, y = gpu.malloc_managed(256 * PAGE), gpu.malloc_managed(256 * PAGE)
            for n in ns:
                gpu.saxpy(x, y, n)

        assert c.run(workload) == 0
        return _read(tmp_path / name)

    a = run("a.pctrace", [1024 * k for k in (1, 3, 5, 7, 2, 9)])
    b = run("b.pctrace", [1024 * k for k in (4, 11, 6, 13, 8)])
    ev = evaluate(fit_model([a]), b)
    assert ev["overall"]["recall"] == 1.0 and ev["overall"]["precision"] == 1.0
    assert ev["kernels"][0]["templates"] == ["linear"]


def test_a_forked_child_of_the_workload_keeps_default_signal_behaviour(tmp_path):
    c, gpu = S.make_collector(tmp_path / "f.pctrace")

    def workload():
        pid = os.fork()
        if pid == 0:  # a data-loader-like worker: SIGTERM must simply end it
            time.sleep(30)
            os._exit(0)
        time.sleep(0.2)
        os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM

    assert c.run(workload) == 0
    assert _read(tmp_path / "f.pctrace").complete


# ---- the managed limit `pagecast collect` sets --------------------------------------------------

def test_the_managed_limit_leaves_room_for_device_allocations():
    G = 1 << 30
    assert M.managed_limit(80 * G) == 72 * G            # a tenth kept back
    assert M.managed_limit(4 * G) == 3 * G              # at least 1 GiB kept back
    assert M.managed_limit(G // 2) == 0
    assert M.managed_limit(80 * G, override=32 << 20) == 32 << 20
    assert M.managed_limit(80 * G, override=100 * G) == 72 * G   # an override never raises it
    assert M.managed_limit(80 * G, allow_oversubscription=True) is None


def test_collect_sets_the_limit_below_the_free_memory(tmp_path, monkeypatch):
    """The command, with CUPTI, the hook and the device stood in: the limit it records and enforces
    is the free memory less the reserve, not all of it."""
    from pagecast.collect import activity as A
    from pagecast.collect import collector as CO
    from pagecast.collect import gpuinfo
    from pagecast.collect import launch_hook as LH

    free = 40 << 30
    env = gpuinfo.Environment(device_index=0, device_name="stand-in", memory_bytes=80 << 30, free_bytes=0,
                              driver_version="13.0", runtime_version=None, cupti_version=None, driver_prefetch=None)
    monkeypatch.setattr(gpuinfo, "require_cupti", lambda: None)
    monkeypatch.setattr(gpuinfo, "probe", lambda device, context=True: env)
    monkeypatch.setattr(gpuinfo, "free_memory", lambda device: free)
    monkeypatch.setattr(A, "CuptiActivitySource", lambda device=0: S.StandInSource(interval_s=0))
    monkeypatch.setattr(CO, "CudaDevice", lambda device=0: S.StandInDevice())
    monkeypatch.setattr(LH.LaunchHook, "start", lambda self: self)
    monkeypatch.setattr(LH.LaunchHook, "stop", lambda self: None)
    monkeypatch.delenv("PAGECAST_MANAGED_LIMIT", raising=False)
    script = tmp_path / "w.py"
    script.write_text("x = 1\n")
    out = tmp_path / "t.pctrace"
    assert cli_main(["collect", "-o", str(out), "--", "python", str(script)]) == 0
    limit = S.read_quiet(out).manifest["managed_limit_bytes"]
    assert limit == M.managed_limit(free) == free - (4 << 30)
