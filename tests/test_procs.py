"""No process outlives its step: pagecast.procs, the validation script's steps and the GPU runner's child.

A GPU run's step that times out must stop the GPU work it started: `pagecast replay --backend gpu`
runs each measurement in a child process (replay/gpu/child.py), and a killed parent must not leave
it holding the GPU. Checked on the CPU with stand-in commands that start a sleeping grandchild.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pagecast import procs

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups and /proc: Linux")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] != b"Z"    # a zombie has exited


def _wait_gone(pid: int, within: float = 5.0) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if not _alive(pid):
            return True
        time.sleep(0.02)
    return False


def _wait_file(path: Path, within: float = 20.0) -> int:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if path.exists() and path.read_text().strip():
            return int(path.read_text())
        time.sleep(0.02)
    raise AssertionError(f"{path} was never written")


def _parent_of_a_sleeper(pidfile: Path, ignore_term: bool = False) -> list[str]:
    """A command that starts a grandchild (which writes its pid, then sleeps) and waits for it."""
    grand = ("import os, signal, time\n"
             + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_term else "")
             + f"open({str(pidfile)!r}, 'w').write(str(os.getpid()))\ntime.sleep(120)\n")
    parent = f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {grand!r}]).wait()\n"
    return [sys.executable, "-c", parent]


@pytest.fixture
def reap():
    """Kill whatever pid a test names, should the test fail before it is gone."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


@pytest.mark.parametrize("ignore_term", [False, True])
def test_run_group_stops_the_grandchildren_at_the_timeout(tmp_path, reap, ignore_term):
    pidfile = tmp_path / "grand.pid"
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        procs.run_group(_parent_of_a_sleeper(pidfile, ignore_term), timeout=2.0, grace_s=0.5)
    pid = _wait_file(pidfile, 1)
    reap.append(pid)
    assert _wait_gone(pid, 1.0), "the grandchild outlived its step"
    assert time.monotonic() - t0 < 10


def test_validation_step_timeout_stops_the_gpu_child(tmp_path, reap):
    """scripts/gpu_validation.py's run_step at its time limit: the step and its children stop."""
    spec = importlib.util.spec_from_file_location("gpu_validation", ROOT / "scripts" / "gpu_validation.py")
    V = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(V)
    pidfile = tmp_path / "grand.pid"
    with open(tmp_path / "log", "w") as log:
        ok, out, why = V.run_step(_parent_of_a_sleeper(pidfile), 2.0, log)
    pid = _wait_file(pidfile, 1)
    reap.append(pid)
    assert not ok and why.startswith("timed out")
    assert _wait_gone(pid), "the step's child outlived the step's timeout"
    assert "process group was stopped" in (tmp_path / "log").read_text()


def test_validation_stopped_by_sigterm_stops_its_step_and_writes_the_report(tmp_path, reap):
    pidfile = tmp_path / "grand.pid"
    cmd = _parent_of_a_sleeper(pidfile)
    driver = textwrap.dedent(f"""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("v", {str(ROOT / "scripts" / "gpu_validation.py")!r})
        V = importlib.util.module_from_spec(spec); spec.loader.exec_module(V)
        V.pagecast = lambda *a: {cmd!r}          # every step: a stand-in that starts a sleeping child
        sys.exit(V.main([{str(tmp_path / "val.md")!r}, "--workdir", {str(tmp_path / "w")!r},
                         "--workloads", "jacobi2d", "--step-timeout", "100"]))
    """)
    p = subprocess.Popen([sys.executable, "-c", driver], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    reap.append(p.pid)
    try:
        pid = _wait_file(pidfile)
        reap.append(pid)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert _wait_gone(pid), "the running step's child outlived the stopped validation"
    md = (tmp_path / "val.md").read_text()
    assert "not reached: stopped by SIGTERM" in md and "Partial" in md


def test_the_gpu_child_exits_when_the_replay_parent_is_killed(tmp_path, reap):
    """`pagecast replay --backend gpu` killed outright (SIGKILL, as a time limit does): its
    measured child (replay/gpu/child.py's main, started by backend._run_child) exits too."""
    pidfile = tmp_path / "child.pid"
    child = textwrap.dedent(f"""
        import os, time
        import pagecast.replay.gpu.child as C
        def stand_in(argv=None):                  # the measured run, holding on (a long GPU run)
            open({str(pidfile)!r}, "w").write(str(os.getpid()))
            time.sleep(120)
        C.child_main = stand_in
        C.main([])
    """)
    parent = textwrap.dedent(f"""
        import sys
        from pagecast.replay.gpu import backend
        backend._run_child([sys.executable, "-c", {child!r}])
    """)
    p = subprocess.Popen([sys.executable, "-c", parent])
    reap.append(p.pid)
    pid = _wait_file(pidfile)
    reap.append(pid)
    p.kill()
    p.wait()
    assert _wait_gone(pid), "the GPU child outlived its parent"


def test_a_child_whose_parent_is_already_gone_exits_at_once(tmp_path):
    code = "from pagecast import procs; procs.exit_with_parent(); print('ran on')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, procs.PARENT_ENV: "1"})   # not our parent: it is gone
    assert r.returncode == 128 + signal.SIGTERM and "ran on" not in r.stdout


def test_read_line_gives_up_on_a_silent_child():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], stdout=subprocess.PIPE, text=True)
    try:
        t0 = time.monotonic()
        assert procs.read_line(p.stdout, 0.5) is None
        assert time.monotonic() - t0 < 5
    finally:
        p.kill()
        p.wait()
    p = subprocess.Popen([sys.executable, "-c", "print('ready', flush=True)"], stdout=subprocess.PIPE, text=True)
    assert procs.read_line(p.stdout, 30) == "ready\n"
    p.wait()


# ---- the GPU SIGTERM test's own harness (tests/test_collect_gpu.py), on stand-in commands --------

def test_sigterm_test_gives_up_on_a_silent_collection_and_leaves_nothing(tmp_path, reap):
    from test_collect_gpu import sigterm_halfway

    pidfile = tmp_path / "grand.pid"
    t0 = time.monotonic()
    with pytest.raises(AssertionError, match="no 'ready' line"):
        sigterm_halfway(_parent_of_a_sleeper(pidfile), tmp_path / "err", ready_s=2)
    pid = _wait_file(pidfile, 1)
    reap.append(pid)
    assert _wait_gone(pid) and time.monotonic() - t0 < 20


def test_sigterm_test_stops_a_collection_that_ignores_the_signal(tmp_path, reap):
    from test_collect_gpu import sigterm_halfway

    pidfile = tmp_path / "pid"
    code = ("import os, signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            f"open({str(pidfile)!r}, 'w').write(str(os.getpid()))\nprint('ready', flush=True)\ntime.sleep(120)\n")
    with pytest.raises(subprocess.TimeoutExpired):
        sigterm_halfway([sys.executable, "-c", code], tmp_path / "err", ready_s=30, settle_s=0, exit_s=1)
    pid = _wait_file(pidfile, 1)
    reap.append(pid)
    assert _wait_gone(pid)
