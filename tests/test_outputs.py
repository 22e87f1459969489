"""Nothing lost, nothing mixed: every output is written whole or not at all (pagecast.outputs).

- two writers to one path: the second loses cleanly (one line, exit 2) or, under --force, wins whole;
- a full disk (an injected ENOSPC at the write layer, and a real tmpfs where this runs as root):
  exit 2, one line, no traceback, nothing left, and the re-run needs no clean-up;
- SIGTERM while a trace is made: nothing half-written at the path, and --force re-runs cleanly;
- --force replaces only what pagecast wrote, its own debris included.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"   # before any @triton.jit (the corpus kernels in the collect test)

import numpy as np  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import pytest  # noqa: E402

from pagecast import trace as T  # noqa: E402
from pagecast.cli import main  # noqa: E402
from pagecast.errors import OutputExistsError, UsageError  # noqa: E402
from pagecast.outputs import Output, OutputWriteError, debris_of, write_file  # noqa: E402

SCALE = "0.05"


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _one_line_error(err: str) -> str:
    lines = [x for x in err.strip().splitlines() if "error" in x]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _quiet_read(path):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        tr = T.read_trace(path)
    return tr, [str(x.message) for x in w]


def _names(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


# ---- Output: the one way to write ---------------------------------------------------------------

def test_a_second_file_writer_loses_cleanly(tmp_path):
    p = tmp_path / "r.json"
    a = Output(p)
    b = Output(p)
    a.tmp.write_text("a")
    b.tmp.write_text("b")
    a.commit()
    with pytest.raises(OutputExistsError, match="written by another run"):
        b.commit()
    assert p.read_text() == "a" and _names(tmp_path) == ["r.json"]


def test_a_second_directory_writer_loses_cleanly_or_wins_whole(tmp_path):
    p = tmp_path / "t.pctrace"
    rows = {T.TIME_NS: [1], T.ADDRESS: [1 << 40], T.COUNT: [1], T.ACCESS: ["read"], T.DEVICE: [0]}
    wa = T.TraceWriter(p, T.new_manifest(source="a"))
    wb = T.TraceWriter(p, T.new_manifest(source="b"))
    wa.append(T.FAULTS, rows)
    wa.close()
    with pytest.raises(OutputExistsError, match="written by another run"):
        wb.close()
    tr, _ = _quiet_read(p)
    assert tr.manifest["source"] == "a" and tr.faults.num_rows == 1 and _names(tmp_path) == ["t.pctrace"]
    # under --force both win in turn, each whole: the last one's output is there, nothing of the first
    wc = T.TraceWriter(p, T.new_manifest(source="c"), force=True)
    wd = T.TraceWriter(p, T.new_manifest(source="d"), force=True)
    wc.append(T.FAULTS, rows)
    wc.close()
    wd.close()
    tr, warned = _quiet_read(p)
    assert tr.manifest["source"] == "d" and tr.faults.num_rows == 0 and tr.complete and not warned
    assert _names(tmp_path) == ["t.pctrace"]


def test_force_replaces_only_pagecast_outputs(tmp_path):
    mine = tmp_path / "notmine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("x")
    with pytest.raises(OutputExistsError, match="not a pagecast output"):
        T.write_trace(mine, T.new_manifest(), {}, force=True)
    assert (mine / "thesis.tex").exists()
    # what an interrupted writer of an earlier pagecast left in place (no manifest) is pagecast's
    old = tmp_path / "old.pctrace"
    (old / T.LAUNCHES).mkdir(parents=True)
    (old / T.LAUNCHES / ".part-00000.parquet.tmp").write_bytes(b"half")
    T.write_trace(old, T.new_manifest(), {}, force=True)
    assert T.read_trace(old).complete
    # an empty .plan directory left by a failed plan is replaced too
    assert T.owned_trace_dir(tmp_path / "old.pctrace")
    with pytest.raises(UsageError, match="is a directory"):
        write_file(mine, lambda t: t.write_text("x"), force=True, example="r.html")


def test_force_removes_debris_of_dead_writers_only(tmp_path):
    p = tmp_path / "r.parquet"
    dead = tmp_path / f".r.parquet.pagecast-tmp-{2**22 + 12345}-deadbeef"
    dead.write_text("half")
    live = tmp_path / f".r.parquet.pagecast-tmp-{os.getppid()}-cafe0123"   # a running process's
    live.write_text("being written")
    assert {d.name for d, _ in debris_of(p)} == {dead.name, live.name}
    write_file(p, lambda t: t.write_text("new"))   # without --force debris is left alone
    assert dead.exists()
    write_file(p, lambda t: t.write_text("newer"), force=True)
    assert not dead.exists() and live.exists() and p.read_text() == "newer"


def test_a_failed_write_leaves_nothing_and_names_path_and_cause(tmp_path):
    p = tmp_path / "sub" / "r.html"

    def full(tmp):
        tmp.write_text("par")
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp))

    with pytest.raises(OutputWriteError) as e:
        write_file(p, full)
    assert str(e.value) == f"cannot write {p}: No space left on device; nothing was written"
    assert _names(tmp_path / "sub") == []


# ---- a full disk, injected at the write layer ---------------------------------------------------

class _Fill:
    """os.replace / pq.write_table fail with ENOSPC after `after` successful calls."""

    def __init__(self, monkeypatch, after: int):
        self.calls = 0
        self.after = after
        real_write = pq.write_table

        def write_table(table, where, *a, **k):
            self.calls += 1
            if self.calls > self.after:
                Path(where).write_bytes(b"PAR1")   # the part a full disk leaves
                raise OSError(f"Error writing bytes to file. Detail: [errno {errno.ENOSPC}] No space left on device")
            return real_write(table, where, *a, **k)

        monkeypatch.setattr(pq, "write_table", write_table)


@pytest.mark.parametrize("after", [0, 3])
def test_datasets_make_on_a_full_disk(tmp_path, capsys, monkeypatch, after):
    out = tmp_path / "d.pctrace"
    fill = _Fill(monkeypatch, after)
    code, _, err = run_cli(capsys, "datasets", "make", "llm-decode", "-o", out, "--scale", SCALE)
    assert code == 2
    assert _one_line_error(err) == f"pagecast datasets: error: cannot write {out}: No space left on device;" \
                                   " nothing was kept"
    assert _names(tmp_path) == []
    fill.after = 10 ** 9   # room again: the same command, no clean-up, no --force
    code, _, err = run_cli(capsys, "datasets", "make", "llm-decode", "-o", out, "--scale", SCALE)
    assert code == 0, err
    assert _quiet_read(out)[0].complete and _names(tmp_path) == ["d.pctrace"]


def test_replay_and_report_on_a_full_disk(tmp_path, capsys, monkeypatch):
    tr = tmp_path / "t.pctrace"
    assert run_cli(capsys, "datasets", "make", "llm-decode", "-o", tr, "--scale", SCALE)[0] == 0
    res = tmp_path / "out" / "r.parquet"
    argv = ("replay", tr, "--policy", "demand,alloc", "--oversub", "1.5", "-o", res)
    fill = _Fill(monkeypatch, 0)
    for after in (0, 1):   # the timeline fails, or the results after the timeline was written
        fill.calls, fill.after = 0, after
        code, _, err = run_cli(capsys, *argv)
        assert code == 2 and "No space left on device" in _one_line_error(err)
        assert _names(res.parent) == []
    fill.after = 10 ** 9
    assert run_cli(capsys, *argv)[0] == 0
    assert _names(res.parent) == ["r.parquet", "r.timeline.parquet"]
    html = tmp_path / "out" / "r.html"
    monkeypatch.setattr(Path, "write_text", _enospc)
    code, _, err = run_cli(capsys, "report", res, "-o", html)
    assert code == 2 and _one_line_error(err) == f"pagecast report: error: cannot write {html}:" \
                                                 " No space left on device; nothing was written"
    assert _names(res.parent) == ["r.parquet", "r.timeline.parquet"]


def _enospc(self, *a, **k):
    raise OSError(errno.ENOSPC, "No space left on device", str(self))


# ---- a real full file system (tmpfs; needs root) ------------------------------------------------

@pytest.fixture
def tiny_fs(tmp_path):
    d = tmp_path / "fs"
    d.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(d)], capture_output=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.decode().strip()})")
    try:
        yield d
    finally:
        subprocess.run(["umount", str(d)], check=False)


def _cli(*argv, cwd=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "pagecast.cli", *map(str, argv)], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout)


@pytest.mark.slow
def test_full_tmpfs(tmp_path, tiny_fs):
    """datasets make, replay -o, report and collect --interpret on a full file system: exit 2, one
    line, no traceback, nothing left; the same command succeeds once there is room."""
    big = tmp_path / "t.pctrace"
    assert _cli("datasets", "make", "llm-decode", "-o", big, "--scale", SCALE).returncode == 0
    res = tmp_path / "r.parquet"
    assert _cli("replay", big, "--policy", "demand,alloc,oracle", "--oversub", "1.5,2", "-o", res).returncode == 0
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    runs = [("datasets", "make", "llm-decode", "-o", tiny_fs / "d.pctrace", "--scale", SCALE),
            ("replay", big, "--policy", "demand,alloc,oracle", "--oversub", "1.5,2", "-o", tiny_fs / "r.parquet"),
            ("report", res, "-o", tiny_fs / "r.html"),
            ("collect", "--interpret", "-o", tiny_fs / "c.pctrace", "--", "python", script, "6")]
    for argv in runs:
        p = _cli(*argv, cwd=tmp_path)
        assert p.returncode == 2, (argv, p.stderr)
        line = _one_line_error(p.stderr)
        assert "No space left on device" in line and str(tiny_fs) in line, line
        assert "caught" not in p.stdout and "ran " not in p.stdout   # the workload did not run on
        assert _names(tiny_fs) == [], (argv, _names(tiny_fs))
    subprocess.run(["mount", "-o", "remount,size=64m", str(tiny_fs)], check=True)
    for argv in runs:   # no clean-up, no --force
        p = _cli(*argv[:-1], "1", cwd=tmp_path) if argv[0] == "collect" else _cli(*argv, cwd=tmp_path)
        assert p.returncode == 0, (argv, p.stderr)


# a workload that catches Exception around its launches, and runs for S seconds
LOOP = """
import sys, time, torch, triton, triton.language as tl

@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m), mask=m)

t0 = time.time()
done = 0
while time.time() - t0 < float(sys.argv[1]):
    ts = [torch.randn(4096) for _ in range(3)]
    try:
        add_kernel[(8,)](ts[0], ts[1], ts[2], 4096, BLOCK=512)
        done += 1
    except Exception as e:
        print("caught", type(e).__name__, flush=True)
print("ran", done, "launches", flush=True)
"""


# ---- collect --interpret: a write error inside the launch hook ----------------------------------

def test_collect_interpret_write_error_stops_the_workload(tmp_path, monkeypatch):
    """An I/O error inside the hook: the workload (which catches Exception) does not run on; nothing
    is kept; one OutputWriteError naming the path and the cause."""
    pytest.importorskip("triton")
    import torch

    from pagecast.collect.interpret import InterpretConfig, collect_interpreted
    from pagecast.collect.target import Workload
    from pagecast.datasets.corpus import tutorial_kernels as K
    from pagecast.datasets.emulate import FullModeEmulation

    real = T.TraceWriter._write_part
    parts = []

    def write_part(self, name, table):
        parts.append(name)
        if len(parts) > 6:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, name, table)

    monkeypatch.setattr(T.TraceWriter, "_write_part", write_part)
    caught, ran = [], []

    def workload():
        for _ in range(40):
            try:
                K.add(torch.ones(10), torch.ones(10), torch.empty(10))
                ran.append(1)
            except Exception as e:   # noqa: BLE001 - the point: a program that catches Exception
                caught.append(e)

    out = tmp_path / "c.pctrace"
    cfg = InterpretConfig(out, Workload("script", "w", [], ["w"]), part_seconds=0.0, flush_launches=1)
    with pytest.raises(OutputWriteError) as e:
        collect_interpreted(cfg, workload, emulation=FullModeEmulation)
    assert str(e.value).startswith(f"cannot write {out}: No space left on device; collection stopped at launch")
    assert not caught and len(ran) < 40
    assert _names(tmp_path) == []


# ---- SIGTERM --------------------------------------------------------------------------------------

def test_sigterm_while_making_leaves_the_old_trace_whole(tmp_path, capsys, monkeypatch):
    """SIGTERM at each point of `datasets make` (between its chunks, inside the --force swap): the
    handler (pagecast.cli._terminate: abandon_all, then exit) leaves the previous output whole, no
    debris; --force re-runs cleanly."""
    from pagecast import outputs

    out = tmp_path / "d.pctrace"
    assert run_cli(capsys, "datasets", "make", "llm-decode", "-o", out, "--scale", SCALE, "--seed", "1")[0] == 0
    real_append = T.TraceWriter.append
    real_place = Output._place

    class Exit(BaseException):
        pass

    def sigterm():      # what the handler does, but raising instead of os._exit
        outputs.abandon_all()
        raise Exit

    for point in range(7):
        calls = []

        def append(self, name, data, _point=point):
            calls.append(name)
            if len(calls) == _point + 1:
                sigterm()
            return real_append(self, name, data)

        def place(self, _point=point):
            if _point == 6 and self.directory and self._aside is not None:   # old moved aside, new not in
                sigterm()
            return real_place(self)

        monkeypatch.setattr(T.TraceWriter, "append", append if point < 6 else real_append)
        monkeypatch.setattr(Output, "_place", place)
        with pytest.raises(Exit):
            main(["datasets", "make", "llm-decode", "-o", str(out), "--scale", SCALE, "--seed", "2", "--force"])
        tr, warned = _quiet_read(out)
        assert tr.complete and not warned and tr.manifest["workload"]["seed"] == 1, point
        assert _names(tmp_path) == ["d.pctrace"], point
        assert not outputs._ACTIVE
    monkeypatch.setattr(T.TraceWriter, "append", real_append)
    monkeypatch.setattr(Output, "_place", real_place)
    assert run_cli(capsys, "datasets", "make", "llm-decode", "-o", out, "--scale", SCALE, "--seed", "2",
                   "--force")[0] == 0
    tr, warned = _quiet_read(out)
    assert tr.complete and not warned and tr.manifest["workload"]["seed"] == 2


def test_sigterm_datasets_make_subprocess(tmp_path):
    """A real SIGTERM at several moments: every manifest at the path tells the truth, no debris."""
    out = tmp_path / "d.pctrace"
    for delay in (0.5, 2.5, 4.0):
        p = subprocess.Popen([sys.executable, "-m", "pagecast.cli", "datasets", "make", "llm-decode", "-o", str(out),
                              "--scale", "0.3", "--force"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True)
        time.sleep(delay)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=120)
        assert "Traceback" not in err and "Aborted" not in err and p.returncode in (0, 128 + signal.SIGTERM, -15)
        assert [x for x in tmp_path.iterdir() if x.name != "d.pctrace"] == []
        if out.exists():
            tr, warned = _quiet_read(out)
            assert tr.complete and not warned
    assert _cli("datasets", "make", "llm-decode", "-o", out, "--scale", "0.3", "--force").returncode == 0


def test_a_manifest_never_promises_a_table_that_is_not_there(tmp_path):
    p = tmp_path / "t.pctrace"
    rows = {T.LAUNCH_ID: [0], T.ADDRESS: [1 << 40], T.BYTES: [10], T.ACCESS: ["read"]}
    with T.TraceWriter(p, T.new_manifest(), tables=(*T.REQUIRED_TABLES, T.TRUTH)) as w:
        w.append(T.TRUTH, rows)
    m = json.loads((p / T.MANIFEST).read_text())
    assert m[T.TABLE_ROWS_KEY] == {"launches": 0, "allocations": 0, "faults": 0, "migrations": 0, "truth": 1}
    for part in (p / T.TRUTH).glob("*.parquet"):   # parts lost (or mixed in from another run)
        part.unlink()
    with pytest.warns(T.TraceWarning, match="truth holds 0 rows, the manifest says 1"):
        tr = T.read_trace(p)
    assert not tr.complete
    shutil.rmtree(p / T.TRUTH)
    with pytest.warns(T.TraceWarning, match="truth is missing"):
        assert not T.read_trace(p).complete


def test_partial_launches_are_left_out_of_fit_and_evaluate(tmp_path, capsys):
    """A launch marked partial (manifest partial_launches) counts in neither fit nor evaluate."""
    from pagecast.datasets.registry import make_trace
    from pagecast.predict.evaluate import evaluate
    from pagecast.predict.fit import fit_model

    p = make_trace("llm-decode", tmp_path / "t.pctrace", scale=0.05, seed=1)
    full = T.read_trace(p)
    m = json.loads((p / T.MANIFEST).read_text())
    last = full.n_launches - 1
    m[T.PARTIAL_KEY] = [last]
    (p / T.MANIFEST).write_text(json.dumps(m))
    tr = T.read_trace(p)
    assert tr.partial_launches.tolist() == [last] and not tr.whole_launches()[last]
    model = fit_model([tr])
    k = tr.launches.column(T.KERNEL)[last].as_py()
    n_k = int(np.sum(np.array(tr.launches.column(T.KERNEL).to_pylist()) == k))
    assert model.kernels[k].launches == n_k - 1
    ev = evaluate(model, tr)
    assert ev["overall"]["launches"] == full.n_launches - 1 and ev["overall"]["partial_launches_left_out"] == 1
    bad = dict(m, **{T.PARTIAL_KEY: "all"})
    (p / T.MANIFEST).write_text(json.dumps(bad))
    code, _, err = run_cli(capsys, "summary", p)
    assert code == 2 and "partial_launches must be a list of launch ids" in err


def test_a_failed_plan_leaves_nothing(tmp_path, monkeypatch, hand_trace):
    from pagecast.replay.plan import plan_io

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pq, "write_table", full)
    out = tmp_path / "plans" / "p.plan"
    with pytest.raises(OutputWriteError, match=f"cannot write {out}: No space left on device"):
        plan_io.write_plan(out, {"launch_id": [0]}, plan_io.new_manifest(trace=T.read_trace(hand_trace), model="m",
                                                                           capacity_bytes=1 << 20, granularity=1 << 16))
    assert _names(out.parent) == []


def test_collectors_claim_the_path_at_once(tmp_path):
    """A collector writes in place (a crash leaves its closed parts readable at the path) after
    claiming it with mkdir: a second collector loses at once, never shares the directory."""
    p = tmp_path / "c.pctrace"
    a = T.TraceWriter(p, T.new_manifest(source="a"), in_place=True, part_rows=1)
    assert json.loads((p / T.MANIFEST).read_text())["complete"] is False
    with pytest.raises(OutputExistsError):
        T.TraceWriter(p, T.new_manifest(source="b"), in_place=True)
    a.append(T.FAULTS, {T.TIME_NS: [1], T.ADDRESS: [1 << 40], T.COUNT: [1], T.ACCESS: ["read"], T.DEVICE: [0]})
    assert list((p / T.FAULTS).glob("part-*.parquet"))   # closed parts at the path while collecting
    b = T.TraceWriter(p, T.new_manifest(source="b"), in_place=True, force=True)   # --force: replaces
    a.abort()                       # a's clean-up does not touch b's directory
    b.close(complete=False)
    tr, _ = _quiet_read(p)
    assert tr.manifest["source"] == "b" and not tr.complete and _names(tmp_path) == ["c.pctrace"]
