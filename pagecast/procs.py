"""Child processes that leave nothing behind.

- `run_group(cmd, timeout)`: run a command in a process group of its own; at its time limit
  (or if the caller is interrupted) the whole group is stopped, SIGTERM then SIGKILL, so that
  the processes it started (a GPU replay's measured child, a workload's helpers) stop with it.
- `stop_group(proc)`: that stop, for a `subprocess.Popen` started with `**OWN_GROUP` (its own process group).
- `exit_with_parent()`: ask Linux to signal this process when its parent exits
  (prctl PR_SET_PDEATHSIG, man 2 prctl), for a child whose parent may be killed outright.
- `read_line(stream, timeout)`: one line from a child's pipe, or None after `timeout` seconds.
"""

from __future__ import annotations

import ctypes
import os
import selectors
import signal
import subprocess
import sys
import time

GRACE_S = 5.0          # between SIGTERM and SIGKILL
PARENT_ENV = "PAGECAST_PARENT_PID"   # set by a parent for exit_with_parent's check
# Popen arguments that start a child in a process group of its own (pgid = its pid): Python 3.11's
# process_group; before it, setpgid(0, 0) between fork and exec.
OWN_GROUP: dict = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}


def _members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group (Linux: /proc; elsewhere: whether any)."""
    if not os.path.isdir("/proc/self"):
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses, so split after the last ')'
        rest = stat[stat.rfind(b")") + 2:].split()
        if len(rest) >= 3 and int(rest[2]) == pgid and rest[0] != b"Z":
            out.append(int(d))
    return out


def stop_group(proc: subprocess.Popen, grace_s: float = GRACE_S) -> None:
    """Stop the process group `proc` leads (started with **OWN_GROUP): SIGTERM, then
    SIGKILL to whatever is left after `grace_s`; returns once the leader is reaped and no member
    of the group is alive (or after a second `grace_s`)."""
    pgid = proc.pid
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        except PermissionError:   # macOS: a group of zombies
            break
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            proc.poll()
            if proc.returncode is not None and not _members(pgid):
                return
            time.sleep(0.02)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass


def run_group(cmd: list[str], timeout: float | None, *, grace_s: float = GRACE_S,
              **popen) -> subprocess.CompletedProcess:
    """subprocess.run in a process group of its own; at `timeout` (subprocess.TimeoutExpired is
    raised, as subprocess.run does) or on any exception in the caller (KeyboardInterrupt, a
    signal handler's), the whole group is stopped first, grandchildren included."""
    proc = subprocess.Popen(cmd, **OWN_GROUP, **popen)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_group(proc, grace_s)
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout, output=out, stderr=err) from None
    except BaseException:
        stop_group(proc, min(grace_s, 2.0))
        raise
    finally:
        if proc.returncode is None:   # pragma: no cover - communicate returned without a status
            stop_group(proc, grace_s)
    if _members(proc.pid):   # the leader exited and left members behind: they go too
        stop_group(proc, grace_s)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def exit_with_parent(sig: int = signal.SIGTERM) -> bool:
    """Have this process receive `sig` when its parent exits (Linux; False elsewhere).

    Where the parent named in $PAGECAST_PARENT_PID has already exited before this call (the
    signal would never come), this process exits at once with status 128 + sig.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, int(sig), 0, 0, 0) != 0:   # PR_SET_PDEATHSIG = 1
            return False
    except (OSError, AttributeError):
        return False
    want = os.environ.get(PARENT_ENV)
    if want and want.isdigit() and int(want) != os.getppid():
        os._exit(128 + int(sig))
    return True


def read_line(stream, timeout: float) -> str | None:
    """One line from a child's pipe (text or binary), or None if none came within `timeout` s
    (the pipe closed early gives what was read, possibly '')."""
    sel = selectors.DefaultSelector()
    sel.register(stream, selectors.EVENT_READ)
    try:
        if not sel.select(timeout):
            return None
        return stream.readline()
    finally:
        sel.close()
